#!/usr/bin/env python3
"""What a kernel new to the process costs its GEMM's first call (lazy loading), whether a capture of the call
into a CUDA graph that never runs loads it ahead, and whether that load can overlap the GPU's work (run it on
the GPU machine; docs/sweep.md, the pipeline's "Tried and left out").

    PYTHONPATH=. python3 benchmarks/bench_preload.py [--preset llm] [--gemms 150] [--overlap 20]

With lazy loading (CUDA_MODULE_LOADING=LAZY, the default) a kernel's module is loaded at its first launch.
The GEMMs are the preset's with distinct heuristic questions, spread over its plan, in plan order; every other
one is in each group:
  ask      its heuristic question is asked (`prewarm_problem`, as the prewarm thread does), nothing more;
  capture  the question is asked, then the answer's algo is called on the question's problem into a graph
           (stream capture, thread-local, on a non-blocking stream of its own; all pointers one scratch
           buffer's: a captured call reads and writes nothing), and the graph is destroyed unlaunched.
Then the GEMM's own callable (the probe's builder: torch, cupy or the lt backend) is called twice, each call's
host time measured up to its return and the GPU synchronized after it. A first call that loads a module costs
milliseconds more than the second.

--overlap N: N more GEMMs of distinct questions (halfway between those of the groups), each captured while the
GPU runs a long GEMM (fp32 8192^3, about 20 ms) queued just before: how long the capture took, and whether the
long GEMM had finished by the time it returned. A load that overlaps the GPU's work takes as long as on an
idle GPU and returns before the long GEMM ends; one that waits for the GPU returns after it.

--parallel T: 2N more GEMMs of distinct questions (N = --gemms, none of the GEMMs above), on an idle GPU: N
captured by T threads at once (each its own non-blocking stream), then the other N one after another (the GEMMs
interleaved between the two sets; the second set meets the kernels the first loaded, which favours it), first
thing in the process; each set's wall time, and each GEMM's first call afterwards, which is short where the
capture loaded its kernel. Do several threads' loads overlap, or does the driver take them one at a time?
"""
import argparse
import ctypes
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="llm")
    ap.add_argument("--gemms", type=int, default=150)
    ap.add_argument("--overlap", type=int, default=20)
    ap.add_argument("--parallel", type=int, default=0, metavar="T")
    a = ap.parse_args()
    from cublaslt_probe import lt, sweep
    from cublaslt_probe.probe import Probe, ProbeOptions, prewarm_problem
    probe = Probe(ProbeOptions(pipeline=False))
    torch = probe.torch
    sms = torch.cuda.get_device_properties(probe.device).multi_processor_count
    cu = probe.clock.lib   # the CUDA driver torch loaded, as the probe's events opened it
    vp = ctypes.c_void_p
    cu.cuStreamCreate.argtypes = [ctypes.POINTER(vp), ctypes.c_uint]
    cu.cuStreamBeginCapture_v2.argtypes = [vp, ctypes.c_int]
    cu.cuStreamEndCapture.argtypes = [vp, ctypes.POINTER(vp)]
    cu.cuGraphDestroy.argtypes = [vp]
    side = vp()
    assert cu.cuStreamCreate(ctypes.byref(side), 1) == 0   # CU_STREAM_NON_BLOCKING
    at = torch.empty(4096, dtype=torch.uint8, device="cuda").data_ptr()

    def capture(c, side=side):
        """Ask `c`'s question and capture a call of the answer's algo; raises on failure."""
        p = prewarm_problem(c, sms)
        with lt.LtMatmul(probe.lib, p) as mm:
            res = mm.heuristic(1)
            if p.bias:
                mm.set_pointers(bias=at)
            st = cu.cuStreamBeginCapture_v2(side, 1)   # CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
            assert st == 0, st
            graph = vp()
            try:
                mm.run(res[0].algo, at, at, at, at, int(res[0].workspaceSize), side.value)
            finally:
                st = cu.cuStreamEndCapture(side, ctypes.byref(graph))
                if graph.value:
                    cu.cuGraphDestroy(graph)
            assert st == 0, st

    seen, cases = set(), []
    plan = sweep.plan(a.preset).cases
    for c in plan:
        try:
            key = prewarm_problem(c, sms).key()
        except Exception:  # noqa: BLE001
            continue
        if key not in seen:
            seen.add(key)
            cases.append(c)
    step = max(1, len(cases) // a.gemms)
    others = cases[step // 2::step][:a.overlap]   # between the GEMMs taken below: other questions
    third = max(1, step // 4)   # --parallel: a quarter and three quarters of the way between them
    spread = [x for pair in zip(cases[third::step], cases[step - third::step]) for x in pair] if a.parallel else []
    cases = cases[::step][:a.gemms]
    print(f"{a.preset}: {len(seen)} distinct heuristic questions; {len(cases)} GEMMs taken (every {step}-th)")

    failed = []
    if spread:
        parallel_loads(probe, capture, cu, spread[:2 * a.gemms], a.parallel, failed)
    groups = ("ask", "capture")
    out = {g: {"pre": [], "first": [], "second": [], "extra": []} for g in groups}
    for i, c in enumerate(cases):
        g = groups[i % 2]
        b = ready(probe, c, failed)
        if b is None:
            continue
        t = time.perf_counter()
        try:
            if g == "capture":
                capture(c)
            else:
                with lt.LtMatmul(probe.lib, prewarm_problem(c, sms)) as mm:
                    mm.heuristic(1)
        except Exception as e:  # noqa: BLE001
            failed.append(f"{g} {c.key}: {e}")
        out[g]["pre"].append((time.perf_counter() - t) * 1e3)
        calls = []
        for _ in range(2):
            t = time.perf_counter()
            b.fn()
            calls.append((time.perf_counter() - t) * 1e3)
            torch.cuda.synchronize()
        out[g]["first"].append(calls[0])
        out[g]["second"].append(calls[1])
        out[g]["extra"].append(calls[0] - calls[1])
        b.close()
    print(f"failed: {len(failed)}" + "".join(f"\n  {f}" for f in failed[:10]))
    for g in groups:
        o = out[g]
        if not o["extra"]:
            continue
        slow = sum(x > 1.0 for x in o["extra"])
        print(f"{g:8s} {len(o['extra'])} GEMMs: first call {statistics.median(o['first']):.3f} ms median, "
              f"{statistics.mean(o['first']):.3f} mean; second {statistics.median(o['second']):.3f} median; "
              f"first - second: mean {statistics.mean(o['extra']):.3f} ms, sum {sum(o['extra']):.1f} ms, "
              f"over 1 ms on {slow}; question (and capture) {statistics.median(o['pre']):.3f} ms median, "
              f"{statistics.mean(o['pre']):.3f} mean, sum {sum(o['pre']):.1f} ms")
    if others:
        x = torch.randn(8192, 8192, device="cuda")
        torch.backends.cuda.matmul.allow_tf32 = False
        x @ x
        torch.cuda.synchronize()
        took, ends = [], probe.clock.event()
        for c in others:
            t = time.perf_counter()
            x @ x
            probe.clock.record(ends, probe._stream())
            queued = time.perf_counter()
            try:
                capture(c)
            except Exception as e:  # noqa: BLE001
                failed.append(f"overlap {c.key}: {e}")
                continue
            done = probe.clock.done(ends)
            took.append(((time.perf_counter() - queued) * 1e3, done))
            torch.cuda.synchronize()
            gemm = (time.perf_counter() - t) * 1e3
        print(f"overlap: {len(took)} captures behind a long GEMM ({gemm:.1f} ms from its launch to the GPU's end, "
              f"the last); ms each, + where the long GEMM had finished when it returned: " +
              " ".join(f"{t:.2f}{'+' if d else ''}" for t, d in took))
        slow = [t for t, _ in took if t > 1.0]
        print(f"  over 1 ms (a module loaded): {len(slow)}, median {statistics.median(slow) if slow else 0:.2f} ms, "
              f"of them returning after the long GEMM had finished: {sum(d for t, d in took if t > 1.0)}")
        print(f"failed: {len(failed)}" + "".join(f"\n  {f}" for f in failed[:10]))
    probe.close()


def ready(probe, c, failed):
    """`c` built under its flags on an idle GPU, or None (the failure added to `failed`)."""
    try:
        b = probe.builder.build(c)
    except Exception as e:  # noqa: BLE001
        failed.append(f"build {c.key}: {e}")
        return None
    probe.builder.set_flags(c)
    probe.torch.cuda.synchronize()
    return b


def parallel_loads(probe, capture, cu, gemms, threads, failed):
    """--parallel: `gemms` (two interleaved sets) captured by `threads` threads at once, then the other set one
    after another; the wall time of each, and the first calls of each set's GEMMs afterwards."""
    import ctypes
    from concurrent.futures import ThreadPoolExecutor
    torch = probe.torch
    together, serial = gemms[0::2], gemms[1::2]
    sides = []
    for _ in range(threads):
        s = ctypes.c_void_p()
        assert cu.cuStreamCreate(ctypes.byref(s), 1) == 0
        sides.append(s)
    local = __import__("threading").local()
    slots = iter(range(threads))

    def one(c, main=False):
        if not main and not hasattr(local, "side"):
            local.side = sides[next(slots)]
        try:
            capture(c) if main else capture(c, local.side)
        except Exception as e:  # noqa: BLE001
            failed.append(f"parallel {c.key}: {e}")
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda _: time.sleep(0.01), range(threads)))   # the threads started before the clock
        torch.cuda.synchronize()
        t = time.perf_counter()
        list(pool.map(one, together))
        par = (time.perf_counter() - t) * 1e3
        torch.cuda.synchronize()
        each = []
        t = time.perf_counter()
        for c in serial:
            one(c, main=True)
            each.append(time.perf_counter())
        ser = (each[-1] - t) * 1e3 if each else 0.0
        loads = sum(b - a > 1e-3 for a, b in zip([t] + each, each))
    firsts = {}
    for name, group in (("serial", serial), ("parallel", together)):
        firsts[name] = []
        for c in group:
            b = ready(probe, c, failed)
            if b is None:
                continue
            t = time.perf_counter()
            b.fn()
            firsts[name].append((time.perf_counter() - t) * 1e3)
            torch.cuda.synchronize()
            b.close()
    print(f"parallel loads: {len(together)} GEMMs captured by {threads} threads at once in {par:.1f} ms "
          f"({par / max(1, len(together)):.2f} ms each); {len(serial)} others one after another in {ser:.1f} ms "
          f"({ser / max(1, len(serial)):.2f} ms each; {loads} of them over 1 ms)")
    for name, xs in firsts.items():
        if xs:
            print(f"  then the first call of each: {name} set median {statistics.median(xs):.3f} ms, over 1 ms on "
                  f"{sum(x > 1.0 for x in xs)} of {len(xs)}")


if __name__ == "__main__":
    main()
