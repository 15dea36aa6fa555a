#!/usr/bin/env python3
"""Capture the real GPU evidence the CPU tests of traces, replay, candidates, first-call and explain use.

    PYTHONPATH=. python3 scripts/capture_evidence.py --out OUTDIR [--parts traces,explain,candidates,replay]

- traces: torch.profiler Chrome traces (record_shapes=True) of (1) a small transformer block forward+backward in
  bf16 and (2) a stack of fp8 `_scaled_mm` linears: traces/transformer_bf16.json.gz, traces/fp8_linear.json.gz.
- explain: `gpu.explain.gather` with the first-call anatomy for bf16 4096³ and 16×4096×4096 (torch, NT):
  explain_*.json (each holds the probe record, 32 candidates and the first-call runs).
- candidates: `lt_candidates` for bf16 NT 256×4096×4096 and fp8 NT 2048×4096×4096: candidates_*.json.
- replay: every trace line of the committed level-2 logs and of the probe fixture replayed with the logged algo
  pinned: replay_*.json.
"""
import argparse
import gzip
import json
import os
import shutil
import sys
import time
import traceback

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def part_traces(out):
    import torch
    from torch.profiler import ProfilerActivity, profile
    os.makedirs(os.path.join(out, "traces"), exist_ok=True)
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(d_model=1024, nhead=16, dim_feedforward=4096, batch_first=True,
                                             device="cuda", dtype=torch.bfloat16)
    x = torch.randn(4, 512, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    for _ in range(3):
        layer(x).float().sum().backward()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
        for _ in range(2):
            layer(x).float().sum().backward()
        torch.cuda.synchronize()
    p = os.path.join(out, "traces", "transformer_bf16.json")
    prof.export_chrome_trace(p)

    class Fp8Linear(torch.nn.Module):
        def __init__(self, k, n):
            super().__init__()
            self.w = (torch.randn(n, k, device="cuda") / k ** 0.5).to(torch.float8_e4m3fn)
            self.s = torch.ones((), device="cuda")

        def forward(self, x):
            return torch._scaled_mm(x.to(torch.float8_e4m3fn), self.w.t(), scale_a=self.s, scale_b=self.s,
                                    out_dtype=torch.bfloat16)
    model = torch.nn.Sequential(Fp8Linear(4096, 14336), torch.nn.ReLU(), Fp8Linear(14336, 4096), torch.nn.ReLU(),
                                Fp8Linear(4096, 4096))
    xs = [torch.randn(t, 4096, device="cuda", dtype=torch.bfloat16) for t in (16, 256, 2048)]
    for x in xs:
        model(x)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
        for x in xs:
            model(x)
        torch.cuda.synchronize()
    p2 = os.path.join(out, "traces", "fp8_linear.json")
    prof.export_chrome_trace(p2)
    for q in (p, p2):
        with open(q, "rb") as f, gzip.open(q + ".gz", "wb") as g:
            shutil.copyfileobj(f, g)
        print("trace", q, os.path.getsize(q), "->", os.path.getsize(q + ".gz"), flush=True)
        os.remove(q)


def part_explain(out, probe):
    from cublaslt_probe.analysis import explain
    from cublaslt_probe.cases import Case
    from cublaslt_probe.gpu.explain import gather
    for (m, n, k) in [(4096, 4096, 4096), (16, 4096, 4096)]:
        c = Case("torch", "mm", "bf16", "NT", m, n, k)
        t0 = time.time()
        ev = gather(c, first_call=True, probe=probe)
        with open(os.path.join(out, f"explain_bf16_NT_{m}x{n}x{k}.json"), "w") as f:
            json.dump(ev, f, indent=1, default=str)
        print(f"explain {c.key}: {time.time() - t0:.1f}s", flush=True)
        print(explain.render(ev), flush=True)


def part_candidates(out, probe):
    from cublaslt_probe.cases import Case
    from cublaslt_probe.gpu.alternatives import lt_candidates
    for c in [Case("lt", "mm", "bf16", "NT", 256, 4096, 4096), Case("lt", "scaled_mm", "fp8", "NT", 2048, 4096, 4096)]:
        t0 = time.time()
        rows = lt_candidates(probe, c, top=32, reps=10)
        dt = time.time() - t0
        saved = {"case": c.as_dict(), "env": probe.env, "workspace_bytes": 32 << 20, "alignment": 16,
                 "timing": "CUDA events, median of 10 reps, L2 warm (GPU spin)", "wall_s": dt, "candidates": rows}
        with open(os.path.join(out, f"candidates_{c.dtype}_{c.m}x{c.n}x{c.k}.json"), "w") as f:
            json.dump(saved, f, indent=1, default=str)
        print(f"candidates {c.key}: {len(rows)} in {dt:.2f}s", flush=True)


def part_replay(out, probe):
    from cublaslt_probe.gpu import replay
    from cublaslt_probe.logs import load_log, parse_line
    fx = os.path.join(ROOT, "tests", "fixtures")
    for name in ("level2_torch", "level2_torchlt", "level2_mixed"):
        recs, _ = load_log(os.path.join(fx, "logs", f"{name}.log"))
        t0 = time.time()
        res = replay.replay([r for r in recs if r.kind == "trace"], probe=probe, reps=5)
        with open(os.path.join(out, f"replay_{name}.json"), "w") as f:
            json.dump(res, f, indent=1, default=str)
        ok = sum(1 for r in res if not r.get("error"))
        match = sum(1 for r in res if r.get("consistent_with_log"))
        print(f"replay {name}: {len(res)} lines, {ok} ran, {match} consistent, {time.time() - t0:.1f}s", flush=True)
    # the probe fixture: each record has its log line AND the kernels that ran: compare names exactly
    with open(os.path.join(fx, "probe", "probe_raw.jsonl")) as f:
        raws = [json.loads(x) for x in f]
    recs, keys, kernels = [], [], []
    for r in raws[::3]:  # every third GEMM of the probe fixture: ~390 lines, one profiler session each
        if r.get("error") or not r.get("log_lines"):
            continue
        rec = parse_line(r["log_lines"][0], 1)
        if rec is None or rec.kind != "trace":
            continue
        recs.append(rec)
        keys.append(r["key"])
        kernels.append(r["kernels"])
    res = replay.replay(recs, probe=probe, reps=3)
    for key, ks, r in zip(keys, kernels, res):
        r["key"] = key
        r["captured_kernels"] = ks
    with open(os.path.join(out, "replay_probe_raw.json"), "w") as f:
        json.dump(res, f, default=str)
    from cublaslt_probe.analysis.evidence import main_kernel
    same = sum(1 for r in res if r.get("kernel") and r["kernel"] == main_kernel(r["captured_kernels"]))
    print(f"replay probe_raw: {len(res)} lines, {sum(1 for r in res if not r.get('error'))} ran, "
          f"{same} launched exactly the captured kernel", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--parts", default="traces,explain,candidates,replay")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    probe = None
    for part in a.parts.split(","):
        t0 = time.time()
        try:
            if part == "traces":
                part_traces(a.out)
                continue
            if probe is None:
                from cublaslt_probe.gpu.probe import Probe
                probe = Probe()
                with open(os.path.join(a.out, "env.json"), "w") as f:
                    json.dump({**probe.env, "date": time.strftime("%Y-%m-%d"),
                               "command": "PYTHONPATH=. python3 scripts/capture_evidence.py " + " ".join(sys.argv[1:])},
                              f, indent=1)
            {"explain": part_explain, "candidates": part_candidates, "replay": part_replay}[part](a.out, probe)
        except Exception:  # noqa: BLE001
            traceback.print_exc()
        finally:
            print(f"part {part}: {time.time() - t0:.1f}s", flush=True)


if __name__ == "__main__":
    main()
