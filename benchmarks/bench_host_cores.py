#!/usr/bin/env python3
"""Whether the host's logical CPUs share physical cores the guest cannot see, or a clock budget (run it on the
GPU machine; docs/sweep.md, "Several GPUs").

    python3 benchmarks/bench_host_cores.py [--cpus 31,28] [--seconds 0.3]

Two `--devices` workers each ran their host phases 10-20 % slower than one worker alone, on a virtual machine
whose sysfs says one thread per core. For each CPU of --cpus (default: the probe cores `host.cpu_cores` gives
slots 0 and 1), a busy Python loop pinned to it counts iterations for --seconds:
  alone        with every other CPU idle (three times, spread over the run);
  beside CPU d with a second loop on d, for every other CPU d: a rate well under the one alone says d shares
               the CPU's physical core (or its cache) on the host;
  with k busy  with loops on the k CPUs farthest from it: a rate falling with k says the cores share a clock
               (turbo) budget.
"""
import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def _loop(cpu: int, start: float, seconds: float, conn) -> None:
    os.sched_setaffinity(0, {cpu})
    while time.time() < start:
        time.sleep(0.0005)
    end, n = start + seconds, 0
    while time.time() < end:
        for _ in range(2000):
            pass
        n += 1
    conn.send(n)
    conn.close()


def rates(cpus: list[int], seconds: float) -> list[float]:
    """Iterations per second of a busy loop on each of `cpus`, all started together."""
    ctx = mp.get_context("fork")
    start = time.time() + 0.05
    pipes, procs = [], []
    for c in cpus:
        a, b = ctx.Pipe(False)
        p = ctx.Process(target=_loop, args=(c, start, seconds, b))
        p.start()
        pipes.append(a)
        procs.append(p)
    out = [a.recv() / seconds for a in pipes]
    for p in procs:
        p.join()
    return out


def main():
    from cublaslt_probe.gpu.host import cpu_cores
    ap = argparse.ArgumentParser()
    ap.add_argument("--cpus", default=None, help="CPUs to test (default: the probe cores of slots 0 and 1)")
    ap.add_argument("--seconds", type=float, default=0.3)
    a = ap.parse_args()
    allowed = sorted(os.sched_getaffinity(0))
    cpus = [int(x) for x in a.cpus.split(",")] if a.cpus else [cpu_cores(s)[0] for s in (0, 1) if cpu_cores(s)]
    print(f"{len(allowed)} CPUs; slots' cores: " + "; ".join(f"slot {s} {cpu_cores(s)}" for s in (0, 1, 2)))
    for c in cpus:
        alone = []
        beside = {}
        others = [d for d in allowed if d != c]
        for i, d in enumerate(others):
            if i % (len(others) // 2 or 1) == 0:
                alone.append(rates([c], a.seconds)[0])
            beside[d] = rates([c, d], a.seconds)[0]
        alone.append(rates([c], a.seconds)[0])
        base = statistics.median(alone)
        ratios = {d: r / base for d, r in beside.items()}
        print(f"CPU {c}: alone {base / 1e3:.1f} k loops/s ({', '.join(f'{x / 1e3:.1f}' for x in alone)}); beside "
              f"each other CPU, median {statistics.median(ratios.values()):.3f} of alone, lowest "
              + ", ".join(f"{d}: {r:.3f}" for d, r in sorted(ratios.items(), key=lambda x: x[1])[:6]))
        far = sorted(others, key=lambda d: -abs(d - c))
        line = []
        for k in (0, 1, 3, 7, 15, len(far)):
            k = min(k, len(far))
            line.append(f"{k}: {rates([c] + far[:k], a.seconds)[0] / base:.3f}")
        print(f"CPU {c} with k other CPUs busy (rate over alone): " + ", ".join(line))


if __name__ == "__main__":
    main()
