#!/usr/bin/env python3
"""Sweep throughput and timing fidelity on the GPU (run on a machine with an NVIDIA GPU).

    PYTHONPATH=. python3 benchmarks/bench_sweep.py [--preset quick] [--check 40]

Prints, for the preset: GEMMs/s with full capture (log line, kernels, timing, heuristic miss/hit), the
per-GEMM overhead beyond the GEMM's own GPU time (wall time minus the time the GEMM kernels themselves ran
in all its timed and warm-up calls), a breakdown by probe phase, and, for --check GEMMs, how far the probe's
`time_us` is from an independent median of the same GEMM: with --flush-l2, triton.testing.do_bench (which
flushes L2 between reps, as the probe then does); without, batches of about 1 ms of back-to-back stream
launches between two events, each behind its own spin (the probe's definition, another harness), and, for
the launch mode, the same calls captured in a CUDA graph and replayed (no events or launches between the
GEMMs; the lt backend is left out there: its callable is bound to the default stream), and CUPTI's duration
of the one profiled call.
"""
import argparse
import math
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from bench_pipeline import gpu_us  # the GEMMs' own GPU time: one rule for both benchmarks


def meets_new_kernel(recs) -> tuple[list[bool], set]:
    """For each record in run order, whether it launched a kernel no record before it had (its first call
    loaded that kernel's module); and the kernels met."""
    seen, new = set(), []
    for r in recs:
        ks = r.get("kernels") or []
        new.append(any(k not in seen for k in ks))
        seen.update(ks)
    return new, seen


def first_kernels(recs, mode_of):
    """The GEMMs that met a kernel new to the process (`meets_new_kernel`) against the others, light ones (under
    100 µs) only: their build-and-warm-up phase (medians, sums), by the window's mode (`mode_of`, an A/B) or all
    together."""
    flags, seen = meets_new_kernel(recs)
    groups = {}
    for r, new in zip(recs, flags):
        if not r.get("probe_ms") or r.get("time_us") is None or r["time_us"] >= 100:
            continue
        groups.setdefault((mode_of.get(r.get("key"), "all"), new), []).append(r["probe_ms"].get("build_warm", 0.0))
    print(f"  kernels: {len(seen)} distinct; light GEMMs' build and warm-up phase, ms (those meeting a kernel new "
          f"to the process / the others):")
    for mode in sorted({m for m, _ in groups}):
        n, o = groups.get((mode, True), []), groups.get((mode, False), [])
        print(f"    {mode}: new {len(n)}, median {statistics.median(n) if n else 0:.3f}, sum {sum(n) / 1e3:.2f} s; "
              f"others {len(o)}, median {statistics.median(o) if o else 0:.3f}, sum {sum(o) / 1e3:.2f} s")


def spin_us(r) -> float:
    """The GPU spins before a raw record's timed samples, every attempt's (`timing.spin_us` and the retaken
    ones'), µs."""
    t = r.get("timing") or {}
    failed = t.get("retaken") or {}
    return sum(x.get("spin_us") or 0.0 for x in (t, failed, failed.get("second") or {}))


def first_uses_s(warm) -> float:
    """The first uses of kernels, s, from (build and warm-up ms, met a kernel new to the process) pairs: what
    those that met one spent beyond the median of the others (the module load, which waits for the GPU to go
    idle)."""
    others = [w for w, new in warm if not new]
    base = statistics.median(others) if others else 0.0
    return sum(max(0.0, w - base) for w, new in warm if new) / 1e3


def overhead_parts(recs) -> tuple[float, float, int]:
    """Two parts of a sweep's overhead beyond its GEMMs' own GPU time, from the raw records (s): the GPU spins
    before the timed samples (`spin_us`), and the first uses of kernels (`meets_new_kernel`, `first_uses_s`);
    and how many GEMMs met a new kernel."""
    flags, _ = meets_new_kernel(recs)
    warm = [(r["probe_ms"].get("build_warm", 0.0), new) for r, new in zip(recs, flags) if r.get("probe_ms")]
    return sum(spin_us(r) for r in recs) / 1e6, first_uses_s(warm), sum(new for _, new in warm)


def idle_by_class(recs, first_flags):
    """By kind of GEMM (light, pipelined; heavy under 1 ms; heavy of 1 ms or more, `probe.is_heavy`): how many,
    the wall time of their steps (build and warm-up, logged call, estimate, timing, wait: `probe_ms` less the
    kernel capture), their GPU time in those steps (`gpu_us` less the profiled call), the difference, and of it
    the timing spins (`spin_us`) and the first uses of kernels (`first_uses_s` within the kind; `first_flags`).
    Light GEMMs' steps overlap the GEMM in flight: theirs is an upper bound."""
    from cublaslt_probe.cases import Case
    from cublaslt_probe.gpu.probe import is_heavy
    kinds = {}
    for r, new in zip(recs, first_flags):
        ph = r.get("probe_ms")
        if not ph or r.get("error") or r.get("time_us") is None:
            continue
        c = Case(r["backend"], r["op"], r["dtype"], r["layout"], r["m"], r["n"], r["k"], r["batch"])
        kind = ("heavy, 1 ms or more" if r["time_us"] >= 1000 else "heavy, under 1 ms") if is_heavy(c) else "light"
        kinds.setdefault(kind, []).append((
            sum(v for k, v in ph.items() if k not in ("profile_share", "heuristic_share", "candidates")) / 1e3,
            (gpu_us(r) - r["time_us"]) / 1e6, spin_us(r) / 1e6, ph.get("build_warm", 0.0), new))
    for kind, rows in kinds.items():
        first = first_uses_s([(w, new) for *_, w, new in rows])
        wall, gpu, spins = (sum(x[i] for x in rows) for i in range(3))
        print(f"      {kind}: {len(rows)} GEMMs, their steps {wall:.2f} s for {gpu:.2f} s of GPU time: "
              f"{wall - gpu:.2f} s "
              f"beyond, of which timing spins {spins:.2f} s, first uses of kernels {first:.2f} s "
              f"({sum(x[-1] for x in rows)} GEMMs), the rest {wall - gpu - spins - first:.2f} s")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="quick")
    ap.add_argument("--limit", type=int, default=0, help="run only the first N GEMMs of the plan")
    ap.add_argument("--check", type=int, default=40)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--heuristic-reps", type=int, default=5)
    ap.add_argument("--flush-l2", action="store_true",
                    help="probe flushes L2 before each rep; the reference is then do_bench (which flushes too). "
                         "Without it the reference is an independent warm-L2 median: 25 calls "
                         "captured in a CUDA graph, replayed 20 times between two events")
    ap.add_argument("--cprofile", type=int, default=0, metavar="N",
                    help="run the sweep under cProfile and print its N most expensive functions (cumulative, "
                         "then by their own time)")
    ap.add_argument("--verbose", action="store_true", help="print the probe's timing evidence for each checked GEMM")
    ap.add_argument("--out", help="keep the dataset (and its raw records beside it) at this path")
    ap.add_argument("--every", type=int, default=1, metavar="K", help="run every K-th GEMM of the plan")
    ap.add_argument("--no-builders", action="store_true",
                    help="build the dataset at the end in the sweep's process, not in processes started ahead")
    a = ap.parse_args()
    from cublaslt_probe import sweep
    from cublaslt_probe.analysis import dataset  # noqa: F401  (pandas imported at start-up, not in the timed sweep)
    from cublaslt_probe.gpu.operands import Builder
    from cublaslt_probe.gpu.probe import Probe, ProbeOptions
    t_init = time.time()
    builders = None if a.no_builders else sweep.RowBuilders()   # started before the probe, as `sweep` does
    probe = Probe(ProbeOptions(flush_l2=a.flush_l2, reps=a.reps, heuristic_reps=a.heuristic_reps, cpu_slot=0))
    print(f"probe start-up: {time.time() - t_init:.2f} s; its phases:\n{probe.startup.table()}")
    cases = sweep.plan(a.preset).cases
    if a.limit:
        cases = cases[:a.limit]
    cases = cases[::a.every]
    with tempfile.TemporaryDirectory() as d:
        windows = []
        run_window = probe.run_window

        def timed_window(cs):
            t = time.perf_counter()
            out = run_window(cs)
            windows.append(time.perf_counter() - t)
            return out
        probe.run_window = timed_window
        sessions = []   # the kernel capture's profiler sessions: (GEMMs, wall s)
        profile = probe.profile

        def timed_profile(calls):
            t = time.perf_counter()
            try:
                return profile(calls)
            finally:
                sessions.append((len(calls), time.perf_counter() - t))
        probe.profile = timed_profile
        prof = None
        if a.cprofile:
            import cProfile
            prof = cProfile.Profile()
            prof.enable()
        t0 = time.time()
        out = a.out or os.path.join(d, "b.parquet")
        argv = [os.path.basename(x) if os.sep in x else x for x in sys.argv[1:]]  # no machine paths
        df = sweep.run(cases, out, probe, progress=False,
                       meta={"command": "benchmarks/bench_sweep.py " + " ".join(argv)},
                       builders=builders)
        wall = time.time() - t0
        if prof:
            prof.disable()
        from cublaslt_probe.analysis.dataset import read_raw
        _, recs = read_raw(sweep.raw_path(out))
        built_s = df.attrs["ran"]["dataset_seconds"]
        if builders is not None:
            # the same raw file built again in this process alone (A/B in one process, after the sweep)
            t = time.time()
            sweep.build_dataset(sweep.raw_path(out), cases, os.path.join(d, "one.parquet"), cpus=probe.host_cpus)
            print(f"dataset build: {built_s:.2f} s by {builders.jobs} processes started ahead, "
                  f"{time.time() - t:.2f} s in the sweep's process alone (the same raw file, after the sweep)")
            builders.close()
    ok = df[df.error.isna()]
    gpu_s = sum(gpu_us(r) for r in recs) / 1e6
    first_kernels(recs, {})
    print("  host µs per call at the sweep's end, by what the spins learn it for (`Timer.host_us`): " +
          ", ".join(f"{k} {v:.0f}" for k, v in sorted(probe.timer.host_us.items())))
    if a.every > 1:
        print(f"every {a.every}-th GEMM of the plan")
    print(f"preset {a.preset} (reps ≤ {a.reps}, heuristic reps {a.heuristic_reps}): {len(df)} GEMMs in {wall:.1f} s "
          f"= {len(df) / wall:.1f} GEMMs/s (full capture)")
    print(f"  GPU time in the GEMMs themselves ≈ {gpu_s:.1f} s; overhead beyond it ≈ "
          f"{(wall - gpu_s) / len(df) * 1e3:.2f} ms per GEMM")
    spins_s, first_s, met = overhead_parts(recs)
    print(f"    of the overhead's {wall - gpu_s:.2f} s: the spins before the timed samples {spins_s:.2f} s; the first "
          f"uses of kernels ≈ {first_s:.2f} s ({met} GEMMs met a kernel new to the process: their build and warm-up "
          f"beyond the others' median); the rest {wall - gpu_s - spins_s - first_s:.2f} s (the estimates' spins, "
          "the host's gaps between steps, the windows' ends, the raw file and the dataset)")
    idle_by_class(recs, meets_new_kernel(recs)[0])
    cap_s = sum(w for _, w in sessions)
    cap_gpu = sum(sum(r.get("kernel_us") or ()) for r in recs) / 1e6
    print(f"    the kernel capture (one profiler session a window, `Probe.profile`): {len(sessions)} sessions over "
          f"{sum(n for n, _ in sessions)} GEMMs, {cap_s:.2f} s, of which the profiled calls' kernels {cap_gpu:.2f} s "
          f"(counted in the GEMMs' GPU time): {cap_s - cap_gpu:.2f} s beyond, "
          f"{(cap_s - cap_gpu) / max(1, len(sessions)) * 1e3:.1f} ms a session")
    small = ok[(ok.time_us < 100)]
    small_keys = set(small.key)
    small_ph = [r["probe_ms"] for r in recs if r.get("key") in small_keys and r.get("probe_ms")]
    small_s = sum(sum(p.values()) for p in small_ph) / 1e3
    print(f"  small/medium GEMMs (< 100 µs): {len(small)}" +
          (f", {len(small_ph) / small_s:.1f} GEMMs/s from the probe phases recorded for each (timing phase "
           f"median {statistics.median(p.get('time', 0.0) for p in small_ph):.2f} ms)" if small_s else ""))
    phases = {}
    for r in recs:
        for k, v in (r.get("probe_ms") or {}).items():
            phases.setdefault(k, []).append(v)
    print("  probe phases, median ms per GEMM: "
          + ", ".join(f"{k} {statistics.median(v):.2f}" for k, v in phases.items()))
    print("  probe phases, total s: " + ", ".join(f"{k} {sum(v) / 1e3:.2f}" for k, v in phases.items()) +
          f"; inside run_window {sum(windows):.2f} s, outside (raw file, dataset build) {wall - sum(windows):.2f} s")
    gaps = [r["time_gap_us"] / max(1, r.get("time_us_reps") or 1) for r in recs if r.get("time_gap_us") is not None]
    if gaps:
        q = statistics.quantiles(gaps, n=20)
        print(f"  GPU idle between timed reps, µs per rep: median {statistics.median(gaps):.2f}, p95 {q[-1]:.2f}, "
              f"max {max(gaps):.2f} ({len(gaps)} GEMMs)")
    tim = [r["timing"] for r in recs if r.get("timing") and r["timing"].get("spin_us")]
    if tim:
        print(f"  timing: spin median {statistics.median(t['spin_us'] for t in tim):.0f} µs, host enqueue median "
              f"{statistics.median(t['enqueue_us'] for t in tim):.0f} µs, retaken with a longer spin: "
              f"{sum(t['attempts'] > 1 for t in tim)} of {len(tim)} (first attempt: a batch behind "
              f"{sum(bool((t.get('retaken') or {}).get('behind')) for t in tim)}, GPU idle over the limit "
              f"{sum((t.get('retaken') or {}).get('behind') == 0 for t in tim)}), "
              f"behind after the last attempt: {sum(bool(t.get('behind')) for t in tim)}")
    shared = [r.get("heuristic_shared") for r in recs if r.get("heuristic_shared")]
    if shared:
        print(f"  heuristic measurements: {sum(1 / x for x in shared):.0f} for {len(shared)} GEMMs (shared by "
              "backends asking the same question)")
    if prof:
        import pstats
        pstats.Stats(prof).sort_stats("cumulative").print_stats(a.cprofile)
        pstats.Stats(prof).sort_stats("tottime").print_stats(a.cprofile)
    if a.check:
        import torch
        import triton.testing
        b = Builder(probe.lib)
        devs, gdevs, rdevs, drift = [], [], [], []
        for c in [c for c in cases if c.backend != "cupy"][:: max(1, len(cases) // a.check)][:a.check]:
            row = df[df.key == c.key].iloc[0]
            if isinstance(row.error, str):
                continue
            b.set_flags(c)
            fn = b.build(c).fn
            # the probe's method run again right beside the references, so that all see the same GPU state
            # (clocks drift with temperature and power between the sweep and this check; reported apart)
            for _ in range(2):  # warm, as the sweep does before timing (its warm-up and logged calls)
                fn()
            torch.cuda.synchronize()
            timing = probe.time_gpu(fn, key=f"{c.backend}|{c.op}")
            now = timing.median_us
            if a.verbose:
                print(f"      {now:.2f} µs {timing.evidence()}; samples "
                      + " ".join(f"{x:.2f}" for x in timing.samples_us))
            drift.append((row.time_us / now - 1) * 100)
            if a.flush_l2:
                ref = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3
                gtxt = ""
            else:
                ref = _stream_reference(fn, probe, now)
                rdevs.append((_stream_reference(fn, probe, now) / ref - 1) * 100)
                gtxt = "   graph      -    "
                if c.backend != "lt":  # the lt callable is bound to the default stream: no graph capture
                    g = _graph_reference(fn, probe, now)
                    gdevs.append((now / g - 1) * 100)  # the launch mode: graph vs stream
                    gtxt = f"   graph {g:9.2f} µs ({gdevs[-1]:+5.1f} %)"
            devs.append((now / ref - 1) * 100)
            print(f"    {c.key:42s} probe {row.time_us:8.2f} µs in the sweep, {now:8.2f} µs now "
                  f"({row.time_calls_per_rep}/sample)  reference {ref:8.2f} µs {devs[-1]:+5.1f} %{gtxt}   "
                  f"first call {row.time_us_first:8.2f} µs   CUPTI one call {row.kernel_time_us:8.2f} µs")
        ref_name = "do_bench (L2 flushed)" if a.flush_l2 else "stream back-to-back median (1 ms batches)"
        for label, dv in ((f"probe (run beside it) vs independent {ref_name}", devs),
                          ("probe (run beside it) vs CUDA-graph replay median (launch mode)", gdevs),
                          ("the stream reference run again vs its first run (its own repeatability)", rdevs),
                          ("probe time_us in the sweep vs the probe run again at check time (GPU drift)", drift)):
            if dv:
                ad = [abs(x) for x in dv]
                print(f"  {label} over {len(ad)} GEMMs: median |dev| {statistics.median(ad):.1f} %, max "
                      f"{max(ad):.1f} %, within 3 %: {sum(x <= 3 for x in ad)}/{len(ad)}, median signed "
                      f"{statistics.median(dv):+.1f} %")


def _stream_reference(fn, probe, expect_us, batches=15):
    """Independent warm-L2 GPU time of `fn` as the probe defines it (stream launches, back to back): batches
    of n calls (about 1 ms, at most 50) between two events, each batch behind its own GPU spin longer than
    twice the host's time to enqueue it; median of the per-call means."""
    import torch
    per = max(1, min(50, math.ceil(1000 / max(expect_us, 1.0))))
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    h = time.perf_counter()
    for _ in range(per):
        fn()
    host_us = (time.perf_counter() - h) * 1e6
    torch.cuda.synchronize()
    out = []
    for _ in range(batches):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        probe.spin(50 + 2 * host_us)
        s.record()
        for _ in range(per):
            fn()
        e.record()
        e.synchronize()
        out.append(s.elapsed_time(e) * 1e3 / per)
    return statistics.median(out)


def _graph_reference(fn, probe, expect_us, batches=20):
    """Independent warm-L2 GPU time of `fn`: n calls captured in one CUDA graph (no host launch gaps, no
    events between the GEMMs; n sized for a replay of about 1 ms, at most 25), replayed `batches` times,
    each behind a GPU spin; median of the per-call means."""
    import torch
    per = max(1, min(25, math.ceil(1000 / max(expect_us, 1.0))))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(per):
            fn()
    g.replay()
    torch.cuda.synchronize()
    out = []
    for _ in range(batches):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        probe.spin(100)
        s.record()
        g.replay()
        e.record()
        e.synchronize()
        out.append(s.elapsed_time(e) * 1e3 / per)
    return statistics.median(out)


if __name__ == "__main__":
    main()
