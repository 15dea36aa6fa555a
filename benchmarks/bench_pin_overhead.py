#!/usr/bin/env python3
"""Host time a pinned forward (`cublaslt_probe.gpu.pin.pin_linear`) adds per call (run on the GPU machine).

    PYTHONPATH=. python3 benchmarks/bench_pin_overhead.py [--out pin_overhead.json]

A small host-bound linear (8 tokens x 1024 x 1024, bf16, no bias) called back to back, torch's own forward
against the same linear with the heuristic's first candidate pinned (torch's own kernel, so only the host path
differs), rounds alternating in one process; per round, µs of wall time per call over `--calls` calls after a
warm-up. Prints and writes the medians and their ratio; the target (docs/prove.md) is the pinned call within
60 µs of torch's on the lent machine, whose host speed varies between processes — hence the A/B in one process.
"""
import argparse
import json
import statistics
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=300)
    a = ap.parse_args()
    import torch

    from cublaslt_probe.gpu import lt
    from cublaslt_probe.gpu.pin import pin_linear
    small = torch.nn.Linear(1024, 1024, bias=False).cuda().to(torch.bfloat16)
    xs = torch.randn(8, 1024, device="cuda", dtype=torch.bfloat16)
    lib = lt.LtLibrary()
    p = lt.Problem(m=1024, n=8, k=1024, dtype="bf16", trans_a="T", trans_b="N", bias=False)
    with lt.LtMatmul(lib, p) as mm:
        first = [{**lib.read_algo_config(r.algo), "workspace_bytes": int(r.workspaceSize)} for r in mm.heuristic(1)][0]

    def per_call_us() -> float:
        with torch.no_grad():
            for _ in range(20):
                small(xs)
            torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(a.calls):
                small(xs)
            torch.cuda.synchronize()
        return (time.perf_counter() - t) / a.calls * 1e6

    pin = pin_linear(small, first, tokens=8)
    pin.detach()
    own, pinned = [], []
    for _ in range(a.rounds):
        own.append(per_call_us())
        pin.attach()
        try:
            pinned.append(per_call_us())
        finally:
            pin.detach()
    pin.remove()
    out = {"torch_us": statistics.median(own), "pinned_us": statistics.median(pinned),
           "added_us": statistics.median(pinned) - statistics.median(own), "rounds": {"torch": own, "pinned": pinned},
           "calls": a.calls, "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__}
    print(f"pinned forward {out['pinned_us']:.1f} µs per call against torch's {out['torch_us']:.1f} µs: "
          f"{out['added_us']:+.1f} µs ({a.rounds} rounds alternating)")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
