#!/usr/bin/env python3
"""What the first GEMMs of a process cost once the probe is up (run it on the GPU machine, a fresh process).

    PYTHONPATH=. python3 benchmarks/bench_first_gemm.py [--cases KEY,KEY,...]

A sweep's first GEMM took 80-125 ms in its build and warm-up phase, against 0.1-0.2 ms for later ones and 2-3
ms for a GEMM whose kernel is new to the process (bench22_devices.txt: each `--devices` worker pays it). For
each of the given GEMMs in turn (default: a decode GEMM on each backend, bf16 and cupy's fp16, then one in
fp32), in a sweep's probe just started (`Probe._library_setup` asks the library's first question of each type
while it starts, bench23_first_gemm.txt): the builder's build (its operands), the first call (host time to its
return, then the GPU's), and a second call. Give the same GEMM of another shape after it to tell a new
kernel's load from a first use of the library or of the path.
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

DEFAULT = ("torch|mm|bf16|NT|1|4096|4096|1,torch|mm|bf16|NT|2|4096|14336|1,lt|mm|bf16|NT|1|4096|4096|1,"
           "lt|mm|bf16|NT|2|4096|14336|1,cupy|mm|fp16|NT|1|4096|4096|1,cupy|mm|fp16|NT|2|4096|14336|1,"
           "torch-lt|mm|bf16|NT|1|4096|4096|1,torch|mm|fp32|NT|1|4096|4096|1,torch|mm|fp32|NT|2|4096|14336|1")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default=DEFAULT, help="comma-separated case keys, in the order to run them")
    a = ap.parse_args()
    from cublaslt_probe.cases import Case
    from cublaslt_probe.gpu.probe import Probe
    t = time.perf_counter()
    probe = Probe()
    print(f"probe start-up {time.perf_counter() - t:.2f} s")
    torch = probe.torch
    for key in a.cases.split(","):
        b_, op, dtype, layout, m, n, k, batch = key.split("|")
        c = Case(b_, op, dtype, layout, int(m), int(n), int(k), int(batch))
        probe.builder.set_flags(c)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        b = probe.builder.build(c)
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        b.fn()
        t2 = time.perf_counter()
        torch.cuda.synchronize()
        t3 = time.perf_counter()
        b.fn()
        torch.cuda.synchronize()
        t4 = time.perf_counter()
        b.close()
        print(f"{key}: build {(t1 - t0) * 1e3:.2f} ms, first call {(t2 - t1) * 1e3:.2f} ms to its return + "
              f"{(t3 - t2) * 1e3:.2f} ms on the GPU after, second call {(t4 - t3) * 1e3:.3f} ms", flush=True)
    probe.close()


if __name__ == "__main__":
    main()
