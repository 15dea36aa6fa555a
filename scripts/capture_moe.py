"""Capture the MoE fixtures and measure the group-size recording's cost (run on the GPU machine).

    PYTHONPATH=. python3 scripts/capture_moe.py --out OUT [--skip-sweep] [--only-alternatives]

Writes, under OUT:
- moe_sweep.raw.jsonl (and .parquet): `cublaslt-probe sweep --preset moe`, the grouped GEMMs of the moe preset;
- mixtral_train/, qwen3_moe/: run folders of `cublaslt_probe.capture` with group sizes (group_sizes.jsonl):
  a Mixtral-8x7B-shaped MoE layer stack (1 layer, 8 experts, top 2) training step (forward and backward) at
  1 x 2048 tokens, and a Qwen3-MoE-30B-A3B-shaped one (1 layer, 128 experts, top 8) forward at 1 x 2048 tokens,
  built from configs with random weights, experts through `torch._grouped_mm`;
- alternatives.json: `alternatives.time_grouped_alternatives` for the Qwen3-MoE gate+up GEMM (16,384 routed rows,
  2048 -> 1536, 128 experts) with random top-8 routing, skewed (zipf 1) and the sizes the captured Qwen3 step's
  router gave, and the Mixtral gate+up GEMM (4,096 rows, 4096 -> 28672, 8 experts) with its captured sizes;
- overhead.json: the recording's cost, A/B in one process: captures of the Mixtral step with and without
  group sizes, alternating, ROUNDS rounds of STEPS steps each; per round the grouped GEMM kernels' own GPU time
  per step (their CUPTI durations in the trace) and the steps' wall times, and the counts of grouped calls
  in the trace against the records.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from cublaslt_probe import runfiles
from cublaslt_probe.gpu.recorder import capture
from cublaslt_probe.runfiles import read_group_sizes

ROUNDS, STEPS = 6, 3
GROUPED_KERNEL = "GroupProblemShape"   # in the mangled name of CUTLASS's grouped GEMM kernel


def _build(cls, cfg):
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("cuda"):
            m = cls(cfg)
    finally:
        torch.set_default_dtype(old)
    for p in m.parameters():
        torch.nn.init.normal_(p, std=0.02)
    m.set_experts_implementation("grouped_mm")
    return m


def mixtral_train():
    from transformers import MixtralConfig, MixtralForCausalLM
    cfg = MixtralConfig(vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=1,
                        num_attention_heads=32, num_key_value_heads=8, num_local_experts=8,
                        num_experts_per_tok=2, max_position_embeddings=8192)
    model = _build(MixtralForCausalLM, cfg).train()
    ids = torch.randint(0, 32000, (1, 2048), device="cuda")

    def step():
        model(ids, labels=ids, use_cache=False).loss.backward()
        model.zero_grad(set_to_none=True)
    return model, step


def qwen3_moe():
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
    cfg = Qwen3MoeConfig(vocab_size=32000, hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
                         num_hidden_layers=1, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
                         num_experts=128, num_experts_per_tok=8, max_position_embeddings=8192)
    model = _build(Qwen3MoeForCausalLM, cfg).eval()
    ids = torch.randint(0, 32000, (1, 2048), device="cuda")

    def step():
        with torch.no_grad():
            model(ids, use_cache=False)
    return model, step


def grouped_us_per_step(run: str, steps: int) -> tuple[float, int, int]:
    """(µs of grouped GEMM kernels per step, grouped op calls in the trace, records) of a run folder."""
    with gzip.open(os.path.join(run, runfiles.TRACE_FILE), "rt") as f:
        ev = json.load(f)["traceEvents"]
    us = sum(e.get("dur", 0) for e in ev if e.get("cat") == "kernel" and GROUPED_KERNEL in e.get("name", ""))
    calls = sum(1 for e in ev if e.get("cat") == "cpu_op" and e.get("name") in ("aten::_grouped_mm",
                                                                               "aten::_scaled_grouped_mm"))
    recs = read_group_sizes(run)
    return us / steps, calls, -1 if recs is None else len(recs)


def overhead(out: str, model, step) -> dict:
    rounds = []
    for r in range(ROUNDS):
        for on in ((True, False) if r % 2 == 0 else (False, True)):
            run = os.path.join(out, "overhead_runs", f"r{r}_{'on' if on else 'off'}")
            with capture(run, model=model, group_sizes=on, label="overhead") as cap:
                for _ in range(STEPS):
                    with cap.step():
                        step()
            us, calls, recs = grouped_us_per_step(run, STEPS)
            rounds.append({"round": r, "group_sizes": on, "grouped_kernel_us_per_step": round(us, 1),
                           "step_wall_ms": [round(s * 1e3, 3) for s in cap.step_wall_s],
                           "grouped_calls_in_trace": calls, "records": recs})
            print(json.dumps(rounds[-1]), flush=True)

    def med(on, key):
        xs = [x[key] for x in rounds if x["group_sizes"] == on]
        return statistics.median(xs if key != "step_wall_ms" else [statistics.median(v) for v in xs])
    summary = {k: {"on": med(True, k), "off": med(False, k)} for k in ("grouped_kernel_us_per_step", "step_wall_ms")}
    summary["grouped_kernel_ratio_on_off"] = round(summary["grouped_kernel_us_per_step"]["on"] /
                                                   summary["grouped_kernel_us_per_step"]["off"], 4)
    spread = [x["grouped_kernel_us_per_step"] for x in rounds if not x["group_sizes"]]
    summary["off_spread_pct"] = round((max(spread) - min(spread)) / statistics.median(spread) * 100, 2)
    return {"rounds": rounds, "summary": summary}


def alternatives(out: str, info: dict) -> None:
    from cublaslt_probe.cases import Case, sizes_code
    from cublaslt_probe.gpu.alternatives import time_grouped_alternatives
    from cublaslt_probe.gpu.probe import Probe
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "moe")
    recorded = {}
    for name in ("qwen3_moe", "mixtral_train"):
        recs = read_group_sizes(os.path.join(out, name)) or read_group_sizes(os.path.join(here, name))
        recorded[name] = sizes_code(recs[0]["sizes"])
    cases = {
        "qwen3 gate_up, random top-8": Case("torch", "grouped_mm", "bf16", "NT", 16384, 1536, 2048, 1, 128,
                                            "seed=0,top_k=8"),
        "qwen3 gate_up, skewed (zipf 1)": Case("torch", "grouped_mm", "bf16", "NT", 16384, 1536, 2048, 1, 128,
                                               "zipf=1"),
        "qwen3 gate_up, captured router": Case("torch", "grouped_mm", "bf16", "NT", 16384, 1536, 2048, 1, 128,
                                               recorded["qwen3_moe"]),
        "mixtral gate_up, captured router": Case("torch", "grouped_mm", "bf16", "NT", 4096, 28672, 4096, 1, 8,
                                                 recorded["mixtral_train"]),
    }
    res = {}
    with Probe() as probe:
        for label, c in cases.items():
            rows = time_grouped_alternatives(probe, c)
            res[label] = [{k: v for k, v in r.items() if k != "kernels"}
                          | {"kernels": [k[:120] for k in r["kernels"][:3]], "n_kernels": len(r["kernels"])}
                          for r in rows]
            print(label, [(r["variant"], r["time_us"] and round(r["time_us"], 1)) for r in rows], flush=True)
    with open(os.path.join(out, "alternatives.json"), "w") as f:
        json.dump(res, f, indent=1)
    info["alternatives"] = {k: {r["variant"]: r["time_us"] and round(r["time_us"], 1) for r in v}
                            for k, v in res.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--skip-sweep", action="store_true")
    ap.add_argument("--only-alternatives", action="store_true")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    info = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(0)}
    if args.only_alternatives:
        alternatives(args.out, info)
        return
    if not args.skip_sweep:
        t = time.perf_counter()
        r = subprocess.run([sys.executable, "-m", "cublaslt_probe", "sweep", "--preset", "moe", "--no-progress",
                            "-o", os.path.join(args.out, "moe_sweep.parquet")])
        info["sweep_s"] = round(time.perf_counter() - t, 1)
        info["sweep_rc"] = r.returncode
    for name, build, steps in (("mixtral_train", mixtral_train, 2), ("qwen3_moe", qwen3_moe, 2)):
        model, step = build()
        for _ in range(2):
            step()
        torch.cuda.synchronize()
        with capture(os.path.join(args.out, name), model=model, label=name) as cap:
            for _ in range(steps):
                with cap.step():
                    step()
        info[name] = {"step_wall_s": cap.step_wall_s,
                      "grouped": grouped_us_per_step(os.path.join(args.out, name), steps)}
        if name == "mixtral_train":
            ov = overhead(args.out, model, step)
            with open(os.path.join(args.out, "overhead.json"), "w") as f:
                json.dump(ov, f, indent=1)
            info["overhead"] = ov["summary"]
        del model, step
        torch.cuda.empty_cache()
    alternatives(args.out, info)
    print(json.dumps(info, indent=1))
    with open(os.path.join(args.out, "capture_moe.json"), "w") as f:
        json.dump(info, f, indent=1)


if __name__ == "__main__":
    main()
