#!/usr/bin/env python3
"""What a probe process pays once, in its first pass over a plan: the same plan twice in one process, one probe
(run it on the GPU machine).

    PYTHONPATH=. python3 benchmarks/bench_first_pass.py [--preset decode] [--passes 2] [--every 2]

Every pass runs the plan's windows as the sweep does (records not written). The first pass meets each kernel
for the first time (its module is loaded at its first launch: CUDA_MODULE_LOADING=LAZY, the default), and
asks each heuristic question for the first time (the prewarm thread's misses); later passes find both done.
The first pass's extra time is what every `sweep --devices` worker pays again for its share of the plan: a
fixed cost that does not shrink with more workers (docs/sweep.md, "Several GPUs").
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="decode")
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--window", type=int, default=128)
    ap.add_argument("--every", type=int, default=1, metavar="K",
                    help="every K-th GEMM of the plan (2: what one of two `--devices` workers runs, as its slices "
                         "interleave the plan)")
    a = ap.parse_args()
    from cublaslt_probe import sweep
    from cublaslt_probe.gpu.probe import Probe, ProbeOptions
    t = time.time()
    probe = Probe(ProbeOptions(cpu_slot=0))
    print(f"probe start-up {time.time() - t:.2f} s; CUDA_MODULE_LOADING={os.environ.get('CUDA_MODULE_LOADING')}")
    cases = sweep.plan(a.preset).cases[::a.every]
    walls = []
    for p in range(a.passes):
        t = time.time()
        for i in range(0, len(cases), a.window):
            probe.run_window(cases[i:i + a.window])
        walls.append(time.time() - t)
        print(f"pass {p + 1}: {len(cases)} GEMMs in {walls[-1]:.2f} s = {len(cases) / walls[-1]:.1f} GEMMs/s")
    if len(walls) > 1:
        print(f"the first pass's extra time: {walls[0] - min(walls[1:]):.2f} s "
              f"({(walls[0] - min(walls[1:])) / len(cases) * 1e3:.3f} ms per GEMM of the plan)")
    probe.close()


if __name__ == "__main__":
    main()
