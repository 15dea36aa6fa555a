#!/usr/bin/env python3
"""Sweep throughput and timing fidelity on the GPU (run on the device machine).

    PYTHONPATH=. python3 benchmarks/bench_sweep.py [--preset quick] [--check 40]

Prints, for the preset: GEMMs/s with full capture (log line, kernels, timing, heuristic miss/hit), the
per-GEMM overhead beyond the GEMM's own GPU time (wall time minus the time the GEMM kernels themselves ran
in all its timed and warm-up calls), a breakdown by probe phase, and, for --check GEMMs, how far the probe's
`time_us` is from an independent CUDA-event median of the same GEMM (triton.testing.do_bench, which
flushes L2 between reps; ours spins — so for cache-resident problems the two measure slightly different
things; the figure is reported, not hidden).
"""
import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="quick")
    ap.add_argument("--limit", type=int, default=0, help="run only the first N GEMMs of the plan")
    ap.add_argument("--check", type=int, default=40)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--heuristic-reps", type=int, default=5)
    ap.add_argument("--flush-l2", action="store_true",
                    help="probe flushes L2 before each rep; the reference is then do_bench (which flushes too). "
                         "Without it the reference is an independent warm-L2 event median: 20 batches of 25 "
                         "back-to-back calls between two events")
    a = ap.parse_args()
    from cublaslt_probe import sweep
    from cublaslt_probe.probe import Builder, Probe
    probe = Probe(flush_l2=a.flush_l2, reps=a.reps, heuristic_reps=a.heuristic_reps)
    cases = sweep.plan(a.preset).cases
    if a.limit:
        cases = cases[:a.limit]
    with tempfile.TemporaryDirectory() as d:
        t0 = time.time()
        df = sweep.run(cases, os.path.join(d, "b.parquet"), probe, progress=False)
        wall = time.time() - t0
        from cublaslt_probe.dataset import read_raw
        _, recs = read_raw(os.path.join(d, "b.raw.jsonl"))
    ok = df[df.error.isna()]
    gpu_s = float((ok.time_us * (ok.time_reps + 5)).sum()) / 1e6   # timed reps + 2 warm + log + estimate + profile
    print(f"preset {a.preset} (reps ≤ {a.reps}, heuristic reps {a.heuristic_reps}): {len(df)} GEMMs in {wall:.1f} s "
          f"= {len(df) / wall:.1f} GEMMs/s (full capture)")
    print(f"  GPU time in the GEMMs themselves ≈ {gpu_s:.1f} s; overhead beyond it ≈ "
          f"{(wall - gpu_s) / len(df) * 1e3:.2f} ms per GEMM")
    small = ok[(ok.time_us < 100)]
    print(f"  small/medium GEMMs (< 100 µs): {len(small)}")
    phases = {}
    for r in recs:
        for k, v in (r.get("probe_ms") or {}).items():
            phases.setdefault(k, []).append(v)
    print("  probe phases, median ms per GEMM: " + ", ".join(f"{k} {statistics.median(v):.2f}" for k, v in phases.items()))
    if a.check:
        import triton.testing
        b = Builder(probe.lib)
        devs = []
        for c in [c for c in cases if c.backend != "cupy"][:: max(1, len(cases) // a.check)][:a.check]:
            row = df[df.key == c.key].iloc[0]
            if isinstance(row.error, str):
                continue
            b.set_flags(c)
            fn = b.build(c).fn
            if a.flush_l2:
                ref = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3
            else:
                ref = _warm_reference(fn)
            devs.append((row.time_us / ref - 1) * 100)
            print(f"    {c.key:45s} probe {row.time_us:9.2f} µs  reference {ref:9.2f} µs  {devs[-1]:+6.1f} %")
        a_dev = [abs(x) for x in devs]
        ref_name = "do_bench (L2 flushed)" if a.flush_l2 else "warm back-to-back event median"
        print(f"  probe time_us vs independent {ref_name} over {len(devs)} GEMMs: median |dev| "
              f"{statistics.median(a_dev):.1f} %, max {max(a_dev):.1f} %, within 3 %: "
              f"{sum(x <= 3 for x in a_dev)}/{len(a_dev)}")


def _warm_reference(fn, batches=20, per=25):
    import torch
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(batches):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(per):
            fn()
        e.record()
        e.synchronize()
        out.append(s.elapsed_time(e) * 1e3 / per)
    return statistics.median(out)


if __name__ == "__main__":
    main()
