#!/usr/bin/env python3
"""Where the probe's host time goes, per GEMM, on the GPU machine (run it there).

    PYTHONPATH=. python3 benchmarks/bench_host_costs.py [--preset decode] [--limit 800] [--top 45]

Three parts, in one process:
1. host µs of each step the probe repeats per GEMM (a torch launch with and without `out=`, an event record,
   query and read, a spin launch, the logger's switch, a build), each queued behind a GPU spin so that the
   GPU never makes the host wait;
2. kernel capture with torch.profiler's collection switched on around one call only
   (`toggle_collection_dynamic`) against the probe's replay pass: the host cost of a switch, whether every
   GEMM's kernels are found with the GPU still busy with earlier work when the switch goes off, and whether a
   GEMM's timing moves while a session is open with its collection off;
3. cProfile of `run_window` over the preset's first --limit GEMMs, by own time.
(An A/B of host trims against the code before them, windows alternating in one process, is
`bench_sweep.py --host-ab`; the earlier one here, whose old code used torch's events, went with them.)
"""
import argparse
import cProfile
import io
import os
import pstats
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def host_us(probe, fn, n=200):
    """Median host µs of `fn` over 5 runs of n calls queued behind a spin long enough for all of them."""
    torch = probe.torch
    out = []
    for _ in range(5):
        probe.spin(n * 60 + 500)
        t = time.perf_counter()
        for _ in range(n):
            fn()
        out.append((time.perf_counter() - t) * 1e6 / n)
        torch.cuda.synchronize()
    return statistics.median(out)


def part_costs(probe, cases):
    torch = probe.torch
    b = probe.builder
    c = next(c for c in cases if c.backend == "torch" and c.op == "mm" and c.dtype == "bf16")
    b.set_flags(c)
    built = b.build(c)
    ta, tb = c.layout[0] == "T", c.layout[1] == "T"
    a, bb = built.keep[0], built.keep[1]
    out = torch.empty(c.m, c.n, device="cuda", dtype=torch.bfloat16)
    built.fn()
    torch.cuda.synchronize()
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
    ev[0].record(); ev[1].record(); ev[1].synchronize()  # noqa: E702
    st = torch.cuda.current_stream()
    clock = probe.clock
    dv, dst = [clock.event() for _ in range(2)], clock.stream(st.cuda_stream)
    clock.record(dv[0], dst); clock.record(dv[1], dst); clock.wait(dv[1])  # noqa: E702
    lc = next((x for x in cases if x.backend == "lt" and x.op == "mm"), None)
    lt_rows = {}
    if lc is not None:
        b.set_flags(lc)
        lb = b.build(lc)
        g = lb.keep[0]
        algo = g.heuristic(1)[0].algo
        ptrs = [x.data_ptr() for x in (g.A, g.B, g.C, g.ws)]
        lt_rows = {f"lt launch, bound once {lc.key}": lb.fn,
                   "lt launch, converted per call (lt.run)":
                       lambda: g.mm.run(algo, ptrs[0], ptrs[1], ptrs[2], ptrs[3], g.p.workspace_bytes, g.stream)}
        b.set_flags(c)
    logger = probe.logger

    def logged(fn):   # a call made as the probe makes its logged call (`Probe.logged_call`, no wait)
        def call():
            logger.set_level(2)
            fn()
            logger.set_level(0)
        return call
    logged_rows = {f"{name}, logged (logger at level 2 around it)": logged(fn)
                   for name, fn in [(f"torch.mm {c.key}", built.fn), *list(lt_rows.items())[:1]]}
    rows = {
        f"torch.mm {c.key}": built.fn,
        **lt_rows,
        **logged_rows,
        "event.record(stream)": lambda: ev[0].record(st),
        "driver event record(stream) (probe.clock)": lambda: clock.record(dv[0], dst),
        "driver event done (probe.clock)": lambda: clock.done(dv[1]),
        "torch.mm(out=)": lambda: torch.mm(a, bb, out=out),
        "event.record": lambda: ev[0].record(),
        "event.query": lambda: ev[1].query(),
        "marker.fill_": lambda: probe.marker.fill_(1),
        "spin launch": lambda: probe.spin(1),
        "empty python call": lambda: None,
    }
    print(f"1. host µs per step ({c.key}, layout {'T' if ta else 'N'}{'T' if tb else 'N'}):")
    logger.take()
    for name, fn in rows.items():
        print(f"   {name:<40} {host_us(probe, fn):8.2f}")
        if name in logged_rows:
            print(f"   {'   log lines per call':<40} {len(logger.take()) / 1000:8.2f}")   # host_us: 5 x 200 calls
    import contextlib
    contexts = {"plain": contextlib.nullcontext, "under torch.inference_mode": torch.inference_mode,
                "under torch.no_grad": torch.no_grad}
    got = {k: [] for k in contexts}
    for _ in range(8):   # the three interleaved, 8 rounds: the host's speed drifts within a process
        for k, ctx in contexts.items():
            with ctx():
                got[k].append(host_us(probe, built.fn))
    for k, v in got.items():
        print(f"   {'torch.mm ' + k:<40} {statistics.median(v):8.2f}  (8 rounds interleaved: {min(v):.2f}-{max(v):.2f})")
    if lc is not None:
        t = time.perf_counter()
        for _ in range(50):
            b.set_flags(lc)
            b.build(lc).close()
        print(f"   {'lt build (set_flags, LtGemm, heuristic hit)':<40} {(time.perf_counter() - t) * 1e6 / 50:8.2f}")
        b.set_flags(c)
    t = time.perf_counter()
    for _ in range(200):
        ev[0].elapsed_time(ev[1])
    print(f"   {'event.elapsed_time':<40} {(time.perf_counter() - t) * 1e6 / 200:8.2f}")
    t = time.perf_counter()
    for _ in range(200):
        clock.elapsed_us(dv[0], dv[1])
    print(f"   {'driver elapsed_us (probe.clock)':<40} {(time.perf_counter() - t) * 1e6 / 200:8.2f}")
    t = time.perf_counter()
    for _ in range(200):
        probe.logger.set_level(2); probe.logger.set_level(0)  # noqa: E702
    print(f"   {'logger on+off':<40} {(time.perf_counter() - t) * 1e6 / 200:8.2f}")
    t = time.perf_counter()
    for _ in range(200):
        b.set_flags(c)
    print(f"   {'set_flags':<40} {(time.perf_counter() - t) * 1e6 / 200:8.2f}")
    t = time.perf_counter()
    for cc in cases[:200]:
        b.set_flags(cc)
        if cc.backend != "lt":
            b.build(cc)
    print(f"   {'build (views; torch backends)':<40} {(time.perf_counter() - t) * 1e6 / 200:8.2f}")
    return built


def part_toggle(probe, cases, n=96):
    import torch
    from torch.profiler import ProfilerActivity, profile

    from cublaslt_probe.probe import _device_events, profile_kernels
    CUDA = [ProfilerActivity.CUDA]
    b = probe.builder
    gemms = []
    for c in cases[:n]:
        b.set_flags(c)
        g = b.build(c)
        g.fn(); g.fn()  # noqa: E702
        gemms.append((c, g))
    torch.cuda.synchronize()
    t = time.perf_counter()
    ref = profile_kernels(torch, [((lambda c=c: b.set_flags(c)), g.fn) for c, g in gemms], probe.marker)
    replay_ms = (time.perf_counter() - t) * 1e3
    print(f"2. kernel capture of {n} GEMMs: replay pass (today) {replay_ms:.1f} ms = {replay_ms / n:.3f} ms per GEMM")
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        prof.toggle_collection_dynamic(False, CUDA)
        # a switch pair on an idle GPU
        t = time.perf_counter()
        for _ in range(20):
            prof.toggle_collection_dynamic(True, CUDA)
            prof.toggle_collection_dynamic(False, CUDA)
        print(f"   switch on+off, idle GPU: {(time.perf_counter() - t) * 1e6 / 20:.1f} µs")
        # the pipeline's place: each call queued behind 300 µs of other GPU work
        on_us, off_us, t0 = [], [], time.perf_counter()
        for c, g in gemms:
            b.set_flags(c)
            probe.spin(300)
            h = time.perf_counter()
            prof.toggle_collection_dynamic(True, CUDA)
            h2 = time.perf_counter()
            probe.marker.fill_(1)
            g.fn()
            prof.toggle_collection_dynamic(False, CUDA)
            on_us.append((h2 - h) * 1e6)
            off_us.append((time.perf_counter() - h2) * 1e6)
        prof.toggle_collection_dynamic(True, CUDA)
        probe.marker.fill_(1)
        torch.cuda.synchronize()
        toggled_ms = (time.perf_counter() - t0) * 1e3
        prof.toggle_collection_dynamic(False, CUDA)
        # timing inside the open session, collection off, against outside it
        inside = [probe.time_gpu(g.fn, key=f"{c.backend}|{c.op}").median_us for c, g in gemms[:24]]
        per_call_in = host_us(probe, gemms[0][1].fn)
    print(f"   behind 300 µs of GPU work: switch on median {statistics.median(on_us):.1f} µs, marker+call+switch off "
          f"median {statistics.median(off_us):.1f} µs; {toggled_ms / n:.3f} ms per GEMM in all (with the spins' wait)")
    evs = _device_events(prof)
    name = evs[0][1] if evs else None
    groups = []
    for _, k, d in evs:
        if k == name:
            groups.append([])
        elif groups:
            groups[-1].append(k)
    groups = groups[:-1]
    same = sum(1 for g1, g2 in zip(groups, ref) if g1 == [k for k, _ in g2])
    spins = sum(1 for _, k, _ in evs if "sleep" in k.lower() or "spin" in k.lower())
    print(f"   groups found: {len(groups)} for {n} GEMMs; same kernels as the replay pass: {same}; spin kernels "
          f"recorded (should be 0): {spins}; device events {len(evs)}")
    outside = [probe.time_gpu(g.fn, key=f"{c.backend}|{c.op}").median_us for c, g in gemms[:24]]
    inside2 = [probe.time_gpu(g.fn, key=f"{c.backend}|{c.op}").median_us for c, g in gemms[:24]]
    d_in = [abs(i / o - 1) * 100 for i, o in zip(inside, outside)]
    d_oo = [abs(i / o - 1) * 100 for i, o in zip(inside2, outside)]
    print(f"   time_us, session open (collection off) vs closed: median |Δ| {statistics.median(d_in):.2f} % "
          f"(closed vs closed {statistics.median(d_oo):.2f} %); host µs per call in the open session "
          f"{per_call_in:.2f}, closed {host_us(probe, gemms[0][1].fn):.2f}")


def part_waits(probe, cases, window=128):
    """The host's waits in the pipeline over `cases`: for the estimating call (`_read_estimate`, queued behind
    the GEMM in flight and its spin) and for the GEMM in flight (`clock.wait` in `_drain`)."""
    est, spins = [], [0, 0]
    read, cov = probe._read_estimate, probe._covered

    def timed_read(q):
        t = time.perf_counter()
        probe.clock.wait(q[1])
        est.append((time.perf_counter() - t) * 1e6)
        return read(q)

    def counted(need):
        r = cov(need)
        spins[r] += 1
        return r
    probe._read_estimate, probe._covered = timed_read, counted
    t = time.perf_counter()
    recs = []
    try:
        for i in range(0, len(cases), window):
            recs += probe.run_window(cases[i:i + window])
    finally:
        del probe._read_estimate, probe._covered
    wall = time.perf_counter() - t
    waits = [r["probe_ms"].get("wait", 0.0) * 1e3 for r in recs if r.get("probe_ms")]
    print(f"4. waits over {len(recs)} GEMMs ({len(recs) / wall:.1f} GEMMs/s, estimate_behind="
          f"{probe.options.estimate_behind}): estimating call read after a wait of median "
          f"{statistics.median(est):.1f} µs, mean {statistics.mean(est):.1f} (sum {sum(est) / 1e6:.2f} s); "
          f"the GEMM in flight waited for median {statistics.median(waits):.1f} µs, mean {statistics.mean(waits):.1f}; "
          f"estimates queued behind a spin {spins[0]}, behind the batches in flight {spins[1]}")


def part_profile(probe, cases, top):
    probe.run_window(cases[:32])   # warm
    prof = cProfile.Profile()
    t = time.perf_counter()
    prof.enable()
    n = 0
    for i in range(32, len(cases), 32):
        n += len(probe.run_window(cases[i:i + 32]))
    prof.disable()
    wall = time.perf_counter() - t
    print(f"3. cProfile: {n} GEMMs in {wall:.2f} s under the profiler ({n / wall:.0f} GEMMs/s)")
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(top)
    print(s.getvalue())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="decode")
    ap.add_argument("--limit", type=int, default=800)
    ap.add_argument("--top", type=int, default=45)
    ap.add_argument("--waits", type=int, default=0, help="GEMMs of the preset whose host waits part 4 measures")
    ap.add_argument("--no-profile", action="store_true", help="leave out part 3 (cProfile)")
    a = ap.parse_args()
    from cublaslt_probe import sweep
    from cublaslt_probe.probe import Probe, ProbeOptions
    probe = Probe(ProbeOptions(cpu_slot=0))
    cases = list(sweep.plan(a.preset).cases[:a.limit])
    try:
        part_costs(probe, cases)
        part_toggle(probe, [c for c in cases if c.backend != "lt"])
        if not a.no_profile:
            part_profile(probe, cases, a.top)
        if a.waits:
            import dataclasses
            waits = list(sweep.plan(a.preset).cases[:a.waits])
            for behind in (False, True, False, True):
                probe.options = dataclasses.replace(probe.options, estimate_behind=behind)
                part_waits(probe, waits)
    finally:
        probe.close()


if __name__ == "__main__":
    main()
