#!/usr/bin/env python3
"""Where does a vocabulary padding's saving go when its logits are sliced back? (run on the GPU machine)

    PYTHONPATH=. python3 benchmarks/bench_pad_slice.py [--out pad_slice.json]

The GPT-2-shaped training step of scripts/prove_programs.py (fp32/tf32, 8 x 512 tokens, vocabulary 50257, AdamW)
three ways in one process, rounds alternating: `original`; `applier`, the proof's padded linear on lm_head
(50264 rows, the logits sliced back to 50257 for the loss, their gradient padded again:
`cublaslt_probe.gpu.prove.PadLinear`); `model_50264`, the same model built with a vocabulary of 50264 (the
change a user makes: the logits stay padded). Per variant: the step's median GPU time (CUDA events, µs) and,
from one profiled step each, the kernels' GPU time summed by kernel name — the difference between `applier` and
`model_50264` is what the slicing adds.
"""
import argparse
import collections
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--steps", type=int, default=3)
    a = ap.parse_args()
    import capture_programs as cp
    import torch
    from torch.profiler import ProfilerActivity, profile

    from cublaslt_probe.gpu.prove import PadLinear
    from cublaslt_probe.gpu.timing import per_call_us
    m0, step0 = cp._gpt2_train(50257)
    m1, step1 = cp._gpt2_train(50264)
    pad = PadLinear(torch, [("lm_head", m0.lm_head)], "out", 50257, 50264)

    variants = {"original": (step0, None), "applier": (step0, pad), "model_50264": (step1, None)}
    times = collections.defaultdict(list)
    for step, ap_ in variants.values():
        if ap_:
            ap_.apply()
        for _ in range(3):
            step()
        if ap_:
            ap_.restore()
    for _ in range(a.rounds):
        for name, (step, ap_) in variants.items():
            if ap_:
                ap_.apply()
            times[name].append(per_call_us(torch, step, a.steps))
            if ap_:
                ap_.restore()
    res = {"step_us": {k: statistics.median(v) for k, v in times.items()}, "all_us": dict(times), "kernels": {}}
    for name, (step, ap_) in variants.items():
        if ap_:
            ap_.apply()
        step()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            step()
            torch.cuda.synchronize()
        if ap_:
            ap_.restore()
        by = collections.Counter()
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                by[e.name] += e.device_time if hasattr(e, "device_time") else e.cuda_time
        res["kernels"][name] = {"total_us": sum(by.values()), "top": by.most_common(25)}
    text = json.dumps(res, indent=1)
    print(json.dumps(res["step_us"], indent=1))
    for name in variants:
        print(name, round(res["kernels"][name]["total_us"], 1))
        for k, v in res["kernels"][name]["top"][:12]:
            print(f"   {v:10.1f}  {k[:110]}")
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
