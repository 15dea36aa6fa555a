#!/usr/bin/env python3
"""How many distinct kernels each `sweep --devices` worker meets, with the fine slices cut as now (contiguous
blocks of the plan, each worker taking its own run of them first, `sweep.claim_order`), as blocks dealt out in
turn, and as before (each every count-th GEMM of the plan), on the CPU, from a raw file's kernels.

    python benchmarks/bench_slice_kernels.py [--raw data/h200_llm.raw.jsonl.gz] [--preset llm] [--workers 2]

A process loads each kernel's module at its first launch (lazy loading), and the load waits for the GPU to go
idle (benchmarks/results/bench15_preload_first_call.txt): 2-3 ms of GPU time lost per kernel new to the
process. A kernel
that two workers meet is loaded twice, once per process. The workers are of one speed: the one with the fewest
GEMMs run takes the next slice left in its order. The kernels of each GEMM are its raw record's, the GEMMs placed
by their keys in the preset's plan.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--raw", default=os.path.join(os.path.dirname(__file__), "..", "data", "h200_llm.raw.jsonl.gz"))
    ap.add_argument("--preset", default="llm")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--window", type=int, default=128)
    ap.add_argument("--load-ms", type=float, default=2.5, help="GPU time a kernel's load costs (ms)")
    a = ap.parse_args()
    from cublaslt_probe import sweep
    from cublaslt_probe.analysis.dataset import read_raw
    _, recs = read_raw(a.raw)
    kernels = {r["key"]: tuple(r.get("kernels") or ()) for r in recs if r.get("type") == "gemm"}
    cases = sweep.plan(a.preset).cases
    at = [kernels.get(c.key, ()) for c in cases]
    n, count = len(cases), sweep.fine_slices(len(cases), a.workers, a.window)
    print(f"{a.preset}: {n} GEMMs, {sum(1 for k in at if k)} with kernels in {os.path.basename(a.raw)}, "
          f"{len({k for ks in at for k in ks})} distinct kernels; {count} fine slices for {a.workers} workers")
    in_turn = [list(range(1, count + 1))] * a.workers
    schemes = {
        "blocks, each worker's own run first (now)": (sweep.WHOLE.cut, [sweep.claim_order(count, a.workers, w)
                                                                       for w in range(a.workers)]),
        "blocks dealt in turn": (sweep.WHOLE.cut, in_turn),
        "every count-th GEMM (before)": (sweep.WHOLE.split, in_turn),
    }
    for name, (slice_of, orders) in schemes.items():
        met = [set() for _ in range(a.workers)]
        done, taken, todo = [0] * a.workers, set(), [iter(o) for o in orders]
        while len(taken) < count:
            w = min(range(a.workers), key=done.__getitem__)
            j = next(j for j in todo[w] if j not in taken)
            taken.add(j)
            positions = slice_of(j, count).take(range(n))
            for g in positions:
                met[w].update(at[g])
            done[w] += len(positions)
        loads = sum(len(m) for m in met)
        total = len(set().union(*met))
        print(f"  {name}: distinct kernels per worker {[len(m) for m in met]}; loads {loads} against {total} for "
              f"one worker: {loads - total} more, about {(loads - total) * a.load_ms / 1e3:.2f} s of GPU time over "
              f"the workers, {max(len(m) for m in met) * a.load_ms / 1e3:.2f} s for the busiest")


if __name__ == "__main__":
    main()
