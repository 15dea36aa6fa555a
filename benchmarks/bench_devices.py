#!/usr/bin/env python3
"""`sweep --devices` scaling on a machine with several GPUs (run it on the GPU machine).

    PYTHONPATH=. python3 benchmarks/bench_devices.py [--preset decode] [--devices 0,1] [--base-tree DIR [--pairs 2]]

Runs the preset with `--devices 0` (one worker), with every device of --devices, and with one worker again,
each a `cublaslt-probe sweep` process as a user would start it. Every worker prints how long its GEMMs took
once its probe was up ("ran N GEMMs in X s"); the rate of a run is its GEMMs over its slowest worker's time
(process start-up, probe start-up and the merge left out, and printed apart). Scaling: the several-device
rate over the mean of the two one-worker rates.

With --base-tree (a checkout of another version of the tool), the several-device run alternates between that
version and this one, --pairs times each (base, this, base, this, ...), between the two one-worker runs of this
one; for each, how long after the first worker the last one ended.
With --shard I/N as well, the runs are `sweep --shard I/N` on one GPU, no --devices, the two versions
alternating twice: what a cluster's process runs.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
from bench_sweep import meets_new_kernel  # one rule for a kernel new to the process

RAN = re.compile(r"ran (\d+) GEMMs in ([\d.]+) s")
THREAD = re.compile(r"worker (\S+): .*its thread ran ([\d.]+) s on the CPU and was preempted (\d+) times")


def run(preset: str, devices: str | None, out: str, tree: str | None = None, shard: str | None = None) -> dict:
    """One `sweep --devices` command (`sweep --shard` with no devices), of the tool in `tree` (the working
    directory, which `-m` imports from)."""
    t = time.time()
    p = subprocess.run([sys.executable, "-m", "cublaslt_probe", "sweep", "--preset", preset, "-o", out,
                        "--no-progress"] + (["--devices", devices] if devices else []) +
                       (["--shard", shard] if shard else []), capture_output=True, text=True, cwd=tree)
    wall = time.time() - t
    if p.returncode:
        sys.exit(f"sweep --devices {devices} --shard {shard} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    workers = [(int(n), float(s)) for n, s in RAN.findall(p.stderr)]
    gemms = sum(n for n, _ in workers)
    slowest = max(s for _, s in workers)
    return {"devices": devices, "workers": workers, "gemms": gemms, "slowest_s": slowest, "rate": gemms / slowest,
            "wall_s": wall, "phases": phases(out),
            "threads": {w: (float(c), int(n)) for w, c, n in THREAD.findall(p.stderr)}}


def phases(out: str) -> dict:
    """{worker: (records, {phase: median ms}, retaken, median host µs to enqueue the timed calls, (distinct
    kernels met, the build and warm-up phase of the GEMMs that met one first: their first calls loaded it, s))}
    from the raw parts beside `out` (a worker's parts in slice order: the order it claimed them)."""
    import glob
    base = out[:-len(".parquet")]
    by = {}
    for path in sorted(glob.glob(base + ".part-*.raw.jsonl")):
        with open(path) as f:
            env = json.loads(f.readline())
            recs = [json.loads(line) for line in f if line.strip()]
        by.setdefault(env.get("worker", "?"), []).extend(recs)
    out_ = {}
    for w, recs in sorted(by.items()):
        ph = {}
        for r in recs:
            for k, v in (r.get("probe_ms") or {}).items():
                ph.setdefault(k, []).append(v)
        tim = [r["timing"] for r in recs if r.get("timing")]
        flags, met = meets_new_kernel(recs)
        first_s = sum((r.get("probe_ms") or {}).get("build_warm", 0.0) for r, new in zip(recs, flags) if new) / 1e3
        out_[w] = (len(recs), {k: statistics.median(v) for k, v in ph.items()},
                   sum(t.get("attempts", 1) > 1 for t in tim), statistics.median(t["enqueue_us"] for t in tim),
                   (len(met), first_s))
    return out_


def print_phases(r: dict) -> None:
    for w, (cpu_s, preempted) in sorted(r.get("threads", {}).items()):
        print(f"  worker {w}'s probe thread: {cpu_s:.2f} s on the CPU, preempted {preempted} times", flush=True)
    for w, (n, ph, retaken, enq, (kernels, first_s)) in r["phases"].items():
        print(f"  worker {w}: {n} GEMMs, retaken {retaken}, timed calls enqueued in {enq:.0f} µs (median); "
              f"{kernels} distinct kernels, the first GEMM of each built and warmed up in {first_s:.2f} s "
              "(its first call loaded it); median ms: " + ", ".join(f"{k} {v:.3f}" for k, v in ph.items()),
              flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="decode")
    ap.add_argument("--devices", default="0,1")
    ap.add_argument("--base-tree", default=None, help="another version's checkout: its several-device runs "
                                                          "alternate with this one's")
    ap.add_argument("--pairs", type=int, default=2, help="with --base-tree: how many times the two alternate")
    ap.add_argument("--shard", default=None, help="with --base-tree: `sweep --shard I/N` on one GPU instead")
    ap.add_argument("--keep", default=None, metavar="DIR", help="copy each run's raw parts into DIR (runN.*)")
    a = ap.parse_args()
    for cmd in (["nvidia-smi", "topo", "-m"], ["lscpu"]):
        try:
            print(subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip(), flush=True)
        except (OSError, subprocess.SubprocessError) as e:
            print(f"{cmd[0]}: {e}")
    here = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
    if a.shard:
        return shards(a, here)
    steps = [("0", here, "this")]
    if a.base_tree:
        steps += [(a.devices, os.path.abspath(a.base_tree), "base"), (a.devices, here, "this")] * a.pairs
    else:
        steps += [(a.devices, here, "this")]
    steps += [("0", here, "this")]
    with tempfile.TemporaryDirectory() as d:
        runs = []
        for i, (devs, tree, label) in enumerate(steps):
            r = run(a.preset, devs, os.path.join(d, f"run{i}.parquet"), tree)
            r["label"] = label
            if a.keep:
                import glob
                import shutil
                os.makedirs(a.keep, exist_ok=True)
                for path in glob.glob(os.path.join(d, f"run{i}.*raw.jsonl")):
                    shutil.copy(path, a.keep)
            runs.append(r)
            print(f"[{label}] --devices {devs}: {r['gemms']} GEMMs; workers " +
                  ", ".join(f"{n} in {s:.2f} s" for n, s in r["workers"]) +
                  f"; {r['rate']:.1f} GEMMs/s over the slowest worker; the whole command {r['wall_s']:.1f} s "
                  "(with process and probe start-up, dataset build and merge)", flush=True)
            print_phases(r)
    one = (runs[0]["rate"] + runs[-1]["rate"]) / 2
    n = len([x for x in a.devices.split(",") if x.strip()])
    for label in dict.fromkeys(r["label"] for r in runs[1:-1]):
        rates = [r["rate"] for r in runs[1:-1] if r["label"] == label]
        print(f"[{label}] scaling on {n} devices: " + ", ".join(f"{x / one:.2f}x" for x in rates) +
              f" the one-worker rate ({one:.1f} GEMMs/s, mean of the runs before and after; several-device "
              f"rates {', '.join(f'{x:.1f}' for x in rates)} GEMMs/s)")
        gaps = [max(s for _, s in r["workers"]) - min(s for _, s in r["workers"]) for r in runs[1:-1]
                if r["label"] == label]
        print(f"[{label}] the last worker ended after the first by " + ", ".join(f"{g:.2f}" for g in gaps) +
              f" s (median {statistics.median(gaps):.3f} s); mean rate {statistics.mean(rates):.1f} GEMMs/s")
    print(f"the whole command {runs[0]['wall_s'] / runs[-2]['wall_s']:.2f}x faster on {n} devices than the first "
          "one-worker run")


def shards(a, here: str) -> None:
    """`sweep --shard` on one GPU, the base version and this one alternating twice."""
    if not a.base_tree:
        sys.exit("--shard goes with --base-tree")
    rates = {"base": [], "this": []}
    with tempfile.TemporaryDirectory() as d:
        for i, (tree, label) in enumerate([(os.path.abspath(a.base_tree), "base"), (here, "this")] * 2):
            r = run(a.preset, None, os.path.join(d, f"run{i}.parquet"), tree, a.shard)
            rates[label].append(r["rate"])
            print(f"[{label}] --shard {a.shard}: {r['gemms']} GEMMs in {r['slowest_s']:.2f} s, "
                  f"{r['rate']:.1f} GEMMs/s; "
                  f"the whole command {r['wall_s']:.1f} s", flush=True)
            print_phases(r)
    for label, xs in rates.items():
        print(f"[{label}] GEMMs/s: " + ", ".join(f"{x:.1f}" for x in xs))


if __name__ == "__main__":
    main()
