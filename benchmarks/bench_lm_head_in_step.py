#!/usr/bin/env python3
"""Why a pin's saving in a compiled decode step differs from its prediction (run on the GPU machine).

    PYTHONPATH=. python3 benchmarks/bench_lm_head_in_step.py OUT_DIR

The decode of scripts/prove_programs.py (`decode_reduce_overhead`: Llama-shaped layers, vocabulary 50257, 16 x 8
tokens, bf16) and its lm_head pin (candidate #1 of tests/fixtures/proofs/decode_reduce_overhead/measure.json,
algo 24 256x128 split-K 2, `pin_linear`). Two measurements in one process:
- the GEMM alone, torch's forward against the pinned one, 16 calls captured in a CUDA graph (as `audit --measure`
  times a graph-replayed GEMM), medians of 5 interleaved rounds, on three operand sets: the program's own (the
  lm_head's input from one eager forward, its weight), the measurement's (randn x 0.5 both), and randn input with
  the program's weight;
- the compiled step (`torch.compile(mode="reduce-overhead")`), 6 steps under CUPTI (`gpu.cupti`), kernel time
  per step by name, original, pinned, original again.
Writes OUT_DIR/lmhead.json (benchmarks/results/lm_head_in_step.json; docs/prove.md reads it).
"""
import collections
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
import capture_graphs as cg

from cublaslt_probe.gpu import cupti
from cublaslt_probe.gpu.pin import pin_linear

MEASURE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "proofs",
                       "decode_reduce_overhead", "measure.json")


def graph_us(fn, calls: int = 16, reps: int = 10) -> float:
    """Median µs per call of `fn` over `reps` replays of a CUDA graph of `calls` calls."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    gr = torch.cuda.CUDAGraph()
    with torch.cuda.graph(gr):
        for _ in range(calls):
            fn()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ts = []
    for _ in range(reps):
        e0.record()
        gr.replay()
        e1.record()
        torch.cuda.synchronize()
        ts.append(e0.elapsed_time(e1) * 1e3 / calls)
    return sorted(ts)[len(ts) // 2]


def main() -> None:
    out = sys.argv[1]
    g = next(g for g in json.load(open(MEASURE))["gemms"] if g["module"] == "lm_head")
    cand = g["candidates"][1]
    torch.manual_seed(0)
    model, c = cg.build_forward(vocab=50257)
    ids = torch.randint(0, c["vocab"], (c["batch"], c["seq"]), device="cuda")
    seen = {}
    h = model.lm_head.register_forward_hook(lambda m, i, o: seen.setdefault("x", i[0].detach().clone()))
    with torch.no_grad():
        model(ids)
    h.remove()
    x = seen["x"].reshape(-1, c["hidden"]).contiguous()
    w = model.lm_head.weight.detach()

    def linear(weight):
        m = torch.nn.Linear(c["hidden"], c["vocab"], bias=False, device="cuda", dtype=torch.bfloat16)
        with torch.no_grad():
            m.weight.copy_(weight)
        return m

    gen = torch.Generator(device="cuda")
    gen.manual_seed(1)
    sets = {"program": (x, w),
            "randn*0.5": (torch.randn(x.shape, device="cuda", generator=gen).mul_(0.5).bfloat16(),
                          torch.randn(w.shape, device="cuda", generator=gen).mul_(0.5).bfloat16()),
            "randn x, program W": (torch.randn(x.shape, device="cuda", generator=gen).bfloat16(), w)}
    alone = collections.defaultdict(list)
    with torch.no_grad():
        mods = {}
        for name, (xx, ww) in sets.items():
            mo, mp = linear(ww), linear(ww)
            pin_linear(mp, cand, tokens=xx.shape[0])
            mods[name] = (xx, mo, mp)
        for _ in range(5):
            for name, (xx, mo, mp) in mods.items():
                alone[name + "|orig"].append(graph_us(lambda m=mo, a=xx: m(a)))
                alone[name + "|pin"].append(graph_us(lambda m=mp, a=xx: m(a)))
    med = {k: sorted(v)[2] for k, v in alone.items()}
    for name in sets:
        print(f"alone {name:22s} orig {med[name + '|orig']:.1f} pin {med[name + '|pin']:.1f} "
              f"saving {med[name + '|orig'] - med[name + '|pin']:.1f}")
    res = {"isolated": med}

    compiled = torch.compile(model, mode="reduce-overhead")

    def step():
        with torch.no_grad():
            torch.compiler.cudagraph_mark_step_begin()
            compiled(ids)
    act = cupti.activity()

    def kernels(n: int = 6):
        for _ in range(5):
            step()
        torch.cuda.synchronize()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        act.start()
        e0.record()
        for _ in range(n):
            step()
        e1.record()
        torch.cuda.synchronize()
        ev = act.stop()
        per, cnt = collections.defaultdict(float), collections.Counter()
        for _, name, d in ev:
            per[name] += d / n
            cnt[name] += 1
        return per, cnt, e0.elapsed_time(e1) * 1e3 / n
    po, co, so = kernels()
    p = pin_linear(model.lm_head, cand, tokens=x.shape[0])
    pp, cp_, sp = kernels()
    p.detach()
    po2, _, so2 = kernels()
    print(f"step µs: orig {so:.1f} pinned {sp:.1f} orig again {so2:.1f}")
    rows = []
    for k in sorted(set(po) | set(pp), key=lambda k: -abs(pp.get(k, 0) - po.get(k, 0))):
        rows.append((round(po.get(k, 0), 2), round(pp.get(k, 0), 2), round(po2.get(k, 0), 2), co.get(k, 0),
                     cp_.get(k, 0), k[:110]))
    for r in rows[:15]:
        print(r)
    print("kernels per step: orig", round(sum(po.values()), 1), "pinned", round(sum(pp.values()), 1),
          "orig again", round(sum(po2.values()), 1))
    res.update(step_us=[so, sp, so2], kernels=rows)
    with open(os.path.join(out, "lmhead.json"), "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
