#!/usr/bin/env python3
"""Can the probe's first call of a GEMM find cuBLASLt's heuristic cache warm? (run it on the GPU machine)

    PYTHONPATH=. python3 benchmarks/bench_prewarm.py [--shapes 12]

A GEMM's first call in a process asks cuBLASLt's heuristic (a miss: 150-260 µs of host time on the H200
hosts); the calls after it find the answer in the library's cache (2-4 µs). The cache is the library
instance's, shared by torch's cuBLAS and cuBLASLt paths and by a direct `cublasLtMatmulAlgoGetHeuristic`.
This measures, for fresh shapes of the decode preset on each backend, the host µs of the first call after
asking the same question directly in several forms (alignment 16 or 256, with or without the SM count
target the cuBLAS path's log line shows), against no question asked: the form whose first call costs what
a hit costs is the question the backend asks. Then whether a question asked on another thread, pinned to
another core, slows the thread that launches, and whether the question writes log lines at level 2.
"""
import argparse
import os
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", type=int, default=12)
    a = ap.parse_args()
    from cublaslt_probe import lt
    from cublaslt_probe.cases import Case
    from cublaslt_probe.probe import Probe, ProbeOptions, heuristic_workspace, lt_problem
    probe = Probe(ProbeOptions(cpu_slot=0))
    torch = probe.torch
    enums = lt.header_enums(lt.find_header(probe.lib.path))
    sm_attr = enums.get("CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"SM_COUNT_TARGET attribute: {sm_attr}, SMs {sms}, cache capacity {probe.lib.cache_capacity()}")
    fresh = iter([(m, n) for n in (4096, 6144, 14336, 5120, 8192, 3584, 12288, 11008, 2048, 7168)
                  for m in range(1, 257)])

    def question(c, alignment, sm):
        p = lt_problem(c, heuristic_workspace(c.backend, c.op, c.n, c.k), alignment)
        mm = lt.LtMatmul(probe.lib, p)
        if sm:
            mm._set(probe.lib.lib.cublasLtMatmulDescSetAttribute, mm.op, sm_attr, lt.ctypes.c_int32(sms))
        return mm

    def first_call(c):
        """(host µs of the build, of the first call, of the second call) of a fresh Case."""
        probe.builder.set_flags(c)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        b = probe.builder.build(c)
        t1 = time.perf_counter()
        b.fn()
        t2 = time.perf_counter()
        b.fn()
        t3 = time.perf_counter()
        torch.cuda.synchronize()
        b.close()
        return (t1 - t0) * 1e6, (t2 - t1) * 1e6, (t3 - t2) * 1e6

    forms = [("none", None, False), ("a16", 16, False), ("a256", 256, False), ("a16+sm", 16, True),
             ("a256+sm", 256, True)]
    for backend in ("torch", "torch-lt", "lt"):
        for dtype in ("bf16", "fp16"):
            res = {f: [] for f, _, _ in forms}
            for _ in range(a.shapes):
                for name, al, sm in forms:
                    m, n = next(fresh)
                    c = Case(backend, "mm", dtype, "NT", m, n, 4096)
                    if al is not None:
                        mm = question(c, al, sm)
                        mm.heuristic(1)
                        mm.close()
                    res[name].append(first_call(c))
            print(f"{backend} {dtype}: median host µs (build, first call, second call) after the question")
            for name, v in res.items():
                print(f"   {name:8s} build {statistics.median(x[0] for x in v):7.1f}  first "
                      f"{statistics.median(x[1] for x in v):7.1f}  second {statistics.median(x[2] for x in v):6.1f}"
                      f"   first calls: {[round(x[1]) for x in v]}")
    # fp8 scaled_mm on torch
    fp8 = iter([(16 * i, n) for n in (4096, 14336, 6144, 8192, 5120) for i in range(1, 17)])
    res = {f: [] for f, _, _ in forms}
    for _ in range(a.shapes):
        for name, al, sm in forms:
            m, n = next(fp8)
            c = Case("torch", "scaled_mm", "fp8", "NT", m, n, 4096)
            if al is not None:
                mm = question(c, al, sm)
                mm.heuristic(1)
                mm.close()
            res[name].append(first_call(c))
    print("torch scaled_mm fp8")
    for name, v in res.items():
        print(f"   {name:8s} first {statistics.median(x[1] for x in v):7.1f}  second "
              f"{statistics.median(x[2] for x in v):6.1f}   first calls: {[round(x[1]) for x in v]}")

    # log lines of a question at level 2
    m, n = next(fresh)
    mm = question(Case("lt", "mm", "bf16", "NT", m, n, 4096), 16, False)
    probe.logger.take()
    probe.logger.set_level(2)
    mm.heuristic(1)
    probe.logger.set_level(0)
    recs = probe.logger.take()
    mm.close()
    print(f"log records at level 2 from one heuristic question: {len(recs)} {[r[2] for r in recs][:5]}")

    # a question on another thread, pinned to another core, while this thread launches
    cpus = sorted(probe.host_cpus - set(probe.cpus or ()))
    other = cpus[len(cpus) // 2]
    c = Case("torch", "mm", "bf16", "NT", 64, 4096, 4096)
    probe.builder.set_flags(c)
    b = probe.builder.build(c)
    b.fn()
    torch.cuda.synchronize()
    todo = [Case("lt", "mm", "bf16", "NT", *next(fresh), 4096) for _ in range(400)]
    stop = threading.Event()
    asked = [0, 0.0]

    def ask():
        os.sched_setaffinity(0, {other})
        t = time.perf_counter()
        for x in todo:
            if stop.is_set():
                break
            mm = question(x, 16, False)
            mm.heuristic(1)
            mm.close()
            asked[0] += 1
        asked[1] = time.perf_counter() - t

    def launches(n=200):
        out = []
        for _ in range(5):
            probe.spin(n * 60 + 500)
            t = time.perf_counter()
            for _ in range(n):
                b.fn()
            out.append((time.perf_counter() - t) * 1e6 / n)
            torch.cuda.synchronize()
        return statistics.median(out)
    alone = launches()
    th = threading.Thread(target=ask)
    th.start()
    busy = launches()
    stop.set()
    th.join()
    alone2 = launches()
    print(f"torch.mm host µs per launch: alone {alone:.2f}, while another thread (CPU {other}) asks questions "
          f"{busy:.2f}, alone again {alone2:.2f}; the thread asked {asked[0]} in {asked[1]:.2f} s")
    b.close()
    probe.close()


if __name__ == "__main__":
    main()
