"""Benchmark: host-stall analysis (`stalls.host_stalls`) on a host-bound trace against a GPU-bound one of the
same size (target: the ratio near 1, the cost linear in the trace, not in the stalled calls).

The host-bound trace is built in memory from a real capture (``--source``, default the Llama decode step of
tests/fixtures/programs, captured on an H200 with the capture API; PROVENANCE there): its `trace.TraceDetail`
(launches, ops, module ranges) repeated ``--copies`` times, each copy shifted past the last in time with its op
rows renumbered, so every copy is more steps of the same program. Its stalled calls are those the thresholds
pick (``--min-host-us``, ``--min-ratio``: by default lower than `stalls.MIN_HOST_US` / `MIN_RATIO`, so that the
decode step's many host-bound op calls count, not only its one cuDNN plan build). The GPU-bound twin is the
same repeated trace with each op's host time cut to its kernels' GPU time: the same rows, no stalled call.
Both are analysed in this process, alternately, best of ``--reps``.

Prints seconds per 100k stalled op calls and host-bound / GPU-bound seconds.

Usage: python benchmarks/bench_stalls.py [--source DIR_OR_TRACE] [--copies 2000] [--reps 3]
                                          [--min-host-us 20] [--min-ratio 2] [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from cublaslt_probe.analysis.stalls import host_stalls
from cublaslt_probe.analysis.trace import TraceDetail, read_chrome_trace

DEFAULT_SOURCE = ROOT / "tests" / "fixtures" / "programs" / "llama_decode" / "trace.json.gz"


def repeat(det: TraceDetail, copies: int) -> TraceDetail:
    """`det` repeated `copies` times: each copy shifted in time past the previous one, its op rows renumbered."""
    t0 = min(det.ops["ts"].min(), det.launches["ts"].min(), det.ranges["ts"].min() if len(det.ranges) else np.inf)
    t1 = max(det.ops["end"].max(), (det.launches["ts"] + det.launches["dur"]).max(),
             det.ranges["end"].max() if len(det.ranges) else -np.inf)
    span = float(t1 - t0) + 1.0
    shift = np.repeat(np.arange(copies, dtype=float) * span, len(det.launches))
    lz = pd.concat([det.launches] * copies, ignore_index=True)
    for c in ("ts", "t_launch"):
        lz[c] = lz[c].to_numpy() + shift
    bump = np.repeat(np.arange(copies, dtype=np.int64) * len(det.ops), len(det.launches))
    lz["op_row"] = np.where(lz["op_row"].to_numpy() >= 0, lz["op_row"].to_numpy() + bump, -1)
    ops = pd.concat([det.ops] * copies, ignore_index=True)
    oshift = np.repeat(np.arange(copies, dtype=float) * span, len(det.ops))
    ops["ts"] = ops["ts"].to_numpy() + oshift
    ops["end"] = ops["end"].to_numpy() + oshift
    rng = pd.concat([det.ranges] * copies, ignore_index=True)
    rshift = np.repeat(np.arange(copies, dtype=float) * span, len(det.ranges))
    rng["ts"] = rng["ts"].to_numpy() + rshift
    rng["end"] = rng["end"].to_numpy() + rshift
    return TraceDetail(names=det.names, op_keys=det.op_keys, launches=lz, ops=ops, ranges=rng)


def gpu_bound(det: TraceDetail) -> TraceDetail:
    """The same trace with each op that launched kernels ending as soon as its kernels' GPU time has passed."""
    lz = det.launches[det.launches["op_row"] >= 0]
    gpu = lz.groupby("op_row")["dur"].sum()
    ops = det.ops.copy()
    end = ops["end"].to_numpy().copy()
    rows = gpu.index.to_numpy()
    end[rows] = np.minimum(end[rows], ops["ts"].to_numpy()[rows] + gpu.to_numpy())
    ops["end"] = end
    return TraceDetail(names=det.names, op_keys=det.op_keys, launches=det.launches, ops=ops, ranges=det.ranges)


def timed(det: TraceDetail, kw: dict) -> tuple[float, pd.DataFrame]:
    t = time.perf_counter()
    df = host_stalls(det, 1, **kw)
    return time.perf_counter() - t, df


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", default=str(DEFAULT_SOURCE))
    ap.add_argument("--copies", type=int, default=2000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--min-host-us", type=float, default=20.0)
    ap.add_argument("--min-ratio", type=float, default=2.0)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    src = Path(a.source)
    if src.is_dir():
        src = src / "trace.json.gz"
    base = read_chrome_trace(src, detail=True).detail
    host = repeat(base, a.copies)
    gpu = gpu_bound(host)
    kw = {"min_host_us": a.min_host_us, "min_ratio": a.min_ratio}
    th, tg = [], []
    for _ in range(a.reps):
        s, dh = timed(host, kw)
        th.append(s)
        s, dg = timed(gpu, kw)
        tg.append(s)
    stalled = float(dh["calls"].sum()) if len(dh) else 0.0
    out = {"source": str(src.relative_to(ROOT)) if src.is_relative_to(ROOT) else src.name, "copies": a.copies,
           "launches": len(host.launches), "ops": len(host.ops), "ranges": len(host.ranges),
           "thresholds": kw, "stalled_calls": int(stalled), "stall_rows": len(dh),
           "gpu_bound_stalled_calls": int(dg["calls"].sum()) if len(dg) else 0,
           "host_bound_s": min(th), "gpu_bound_s": min(tg),
           "s_per_100k_stalled_calls": min(th) / stalled * 1e5 if stalled else None,
           "ratio_host_over_gpu_bound": min(th) / min(tg)}
    print(json.dumps(out, indent=1))
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
