#!/usr/bin/env python3
"""Does a larger window speed the sweep up? A/B in one process (run it on the GPU machine).

    PYTHONPATH=. python3 benchmarks/bench_window.py [--preset decode] [--small 32] [--large 128]

A window pays some costs once, whatever it holds: the profiler session that captures its kernels (CUPTI on
and off, kineto's results read back), the heuristic questions handed to the companion and the prewarm thread,
the companion's answers collected. The plan is cut into chunks of `--large` GEMMs; the chunks alternate (A,
B, B, A, ...) between one window of `--large` and windows of `--small`, on one probe, so both modes see the
same host state. Per mode: GEMMs/s, the profile pass per GEMM, and the timing retakes. First, the profile
pass alone: `Probe.profile` over 8, 32 and 128 built GEMMs, its fixed and per-GEMM cost.
"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="decode")
    ap.add_argument("--small", type=int, default=32)
    ap.add_argument("--large", type=int, default=128)
    ap.add_argument("--warm", type=int, default=64, help="GEMMs run first and not counted (start-up, caches)")
    a = ap.parse_args()
    from cublaslt_probe import sweep
    from cublaslt_probe.gpu.probe import Probe
    probe = Probe(cpu_slot=0)
    cases = list(sweep.plan(a.preset).cases)
    probe.run_window(cases[-a.warm:])

    # the profile pass alone, over GEMMs built once
    built = []
    for c in cases[:128]:
        probe.builder.set_flags(c)
        built.append((c, probe.builder.build(c)))
    for _ in range(2):
        for n in (8, 32, 128):
            calls = [(lambda c=c: probe.builder.set_flags(c), b.fn) for c, b in built[:n]]
            ts = []
            for _ in range(5):
                t = time.perf_counter()
                probe.profile(calls)
                ts.append((time.perf_counter() - t) * 1e3)
            print(f"profile pass over {n:3d} GEMMs: median {statistics.median(ts):.2f} ms = "
                  f"{statistics.median(ts) / n:.3f} ms per GEMM")
    for _, b in built:
        b.close()

    modes = {a.small: [0.0, []], a.large: [0.0, []]}
    for i in range(0, len(cases), a.large):
        chunk = cases[i:i + a.large]
        size = a.large if (i // a.large) % 4 in (0, 3) else a.small
        t = time.perf_counter()
        for j in range(0, len(chunk), size):
            modes[size][1] += probe.run_window(chunk[j:j + size])
        modes[size][0] += time.perf_counter() - t
    for size, (wall, recs) in modes.items():
        ph = [r["probe_ms"] for r in recs if r.get("probe_ms")]
        tim = [r["timing"] for r in recs if r.get("timing")]
        print(f"windows of {size:3d}: {len(recs)} GEMMs in {wall:.2f} s = {len(recs) / wall:.1f} GEMMs/s; profile "
              f"share median {statistics.median(p.get('profile_share', 0.0) for p in ph):.3f} ms; retaken "
              f"{sum(t['attempts'] > 1 for t in tim)}; errors {sum(bool(r.get('error')) for r in recs)}")
    probe.close()


if __name__ == "__main__":
    main()
