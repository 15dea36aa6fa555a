"""Benchmark: `trace` and `audit` of a host-bound trace against a GPU-bound one of the same size (target: the
host-bound one within 2x of the GPU-bound one, for each command).

Both traces are built from the same real run folder's trace (default tests/fixtures/programs/llama_decode,
captured on an H200 with the capture API: step and module ranges, record_shapes; see PROVENANCE there): its
events repeated until the trace holds ``--events`` events, each copy more steps of the same program (shifted
in time, ids rewritten the way benchmarks/bench_trace.py rewrites them, step ranges renumbered). They differ
only in where the time is:

- host-bound: every CPU event (ops, annotations, runtime calls) ``--host-scale`` times longer, the kernels as
  captured (so most ops hold the host for milliseconds while their kernels take microseconds: every one of
  them is a host stall);
- GPU-bound: the CPU events as captured, every kernel ``--gpu-scale`` times longer and queued behind the
  one before it on its stream (the GPU never waits for the host: no host stall).

Both run in this one process (``trace.read_trace`` and ``audit.audit``, as the CLI calls them), alternating,
best of ``--reps``; the ratio host-bound / GPU-bound is printed per command.

Usage: python benchmarks/bench_trace_hostbound.py [--source RUN_OR_TRACE] [--events 1000000] [--reps 2]
                                                  [--host-scale 50] [--gpu-scale 50] [--json OUT] [--keep DIR]
"""
from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
DEFAULT_SOURCE = ROOT / "tests" / "fixtures" / "programs" / "llama_decode" / "trace.json.gz"
CPU_CATS = {"cpu_op", "user_annotation", "cuda_runtime", "cuda_driver", "python_function"}
GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}


def _bench_trace():
    spec = importlib.util.spec_from_file_location("bench_trace", Path(__file__).parent / "bench_trace.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _copy(events: list, origin: float, host_scale: float, gpu_scale: float) -> list:
    """One copy of `events` with its times changed: CPU events stretched by `host_scale` about `origin`, GPU
    events' durations by `gpu_scale`, each GPU event queued behind the one before it on its stream."""
    out, busy = [], {}
    for e in sorted((dict(e) for e in events), key=lambda e: e.get("ts") if isinstance(e.get("ts"), (int, float))
                    else 0.0):
        ts = e.get("ts")
        if isinstance(ts, (int, float)):
            e["ts"] = origin + (ts - origin) * host_scale
            if e.get("cat") in CPU_CATS and isinstance(e.get("dur"), (int, float)):
                e["dur"] = e["dur"] * host_scale
            elif e.get("cat") in GPU_CATS and isinstance(e.get("dur"), (int, float)):
                e["dur"] = e["dur"] * gpu_scale
                key = (e.get("pid"), e.get("tid"))
                e["ts"] = max(e["ts"], busy.get(key, e["ts"]))
                busy[key] = e["ts"] + e["dur"]
        out.append(e)
    return out


def build(src: Path, out: Path, n_events: int, host_scale: float, gpu_scale: float) -> dict:
    """Write a trace of `n_events` events from `src`'s, times changed by `_copy`; returns what it wrote."""
    bt = _bench_trace()
    with gzip.open(src, "rt", encoding="utf-8") if src.suffix == ".gz" else open(src, encoding="utf-8") as f:
        doc = json.load(f)
    events = doc["traceEvents"]
    head = {k: v for k, v in doc.items() if k not in ("traceEvents", "traceName", "baseTimeNanoseconds")}
    ts = [e["ts"] for e in events if isinstance(e.get("ts"), (int, float))]
    t0 = min(ts)
    ids = [e.get("args", {}).get(k) for e in events for k in bt._ID_KEYS] + [e.get("id") for e in events]
    id_step = max([i for i in ids if isinstance(i, int)] + [0]) + 1
    steps = sorted({e["name"] for e in events if str(e.get("name", "")).startswith("cublaslt_probe.step:")})
    n = copies = 0
    span = None
    with open(out, "w", encoding="utf-8") as f:
        f.write(json.dumps(head)[:-1] + ', "traceEvents": [\n')
        first = True
        while n < n_events:
            origin = t0 + copies * (span or 0.0)
            one = _copy([dict(e, ts=e["ts"] + (origin - t0)) if isinstance(e.get("ts"), (int, float)) else e
                         for e in events], origin, host_scale, gpu_scale)
            if span is None:    # the changed copy's own span: copies follow each other
                span = max(e["ts"] + (e.get("dur") if isinstance(e.get("dur"), (int, float)) else 0)
                           for e in one if isinstance(e.get("ts"), (int, float))) - t0 + 1000.0
            for e in one[: n_events - n]:
                if isinstance(e.get("id"), int):
                    e["id"] += copies * id_step
                if isinstance(e.get("args"), dict):
                    a = dict(e["args"])
                    for k in bt._ID_KEYS:
                        if isinstance(a.get(k), int) and a[k] > 0:
                            a[k] += copies * id_step
                    e["args"] = a
                if e.get("name") in steps:
                    e["name"] = f"cublaslt_probe.step:{copies * len(steps) + steps.index(e['name'])}"
                f.write(("" if first else ",\n") + json.dumps(e))
                first = False
                n += 1
            copies += 1
        f.write("\n]}\n")
    return {"events": n, "copies": copies, "bytes": out.stat().st_size}


def run(path: Path) -> dict:
    from cublaslt_probe.analysis import audit, trace
    t = time.perf_counter()
    s = trace.read_trace(path)
    t_trace = time.perf_counter() - t
    t = time.perf_counter()
    a = audit.audit(path)
    t_audit = time.perf_counter() - t
    return {"trace_s": t_trace, "audit_s": t_audit, "events": s.stats.events, "steps": a.steps, "rows": len(a.rows),
            "stalls": 0 if a.stalls is None else int(a.stalls["calls"].sum()) if len(a.stalls) else 0,
            "step_gpu_ms": a.step_gpu_us / 1e3}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--source", default=str(DEFAULT_SOURCE), help="real trace (or run folder) to repeat")
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--host-scale", type=float, default=50.0)
    ap.add_argument("--gpu-scale", type=float, default=50.0)
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--keep", help="build the traces in this directory and keep them")
    args = ap.parse_args()
    src = Path(args.source)
    src = src / "trace.json.gz" if src.is_dir() else src
    tmp = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench_hostbound_"))
    tmp.mkdir(parents=True, exist_ok=True)
    rel = src.resolve().relative_to(ROOT) if src.resolve().is_relative_to(ROOT) else src
    import numpy
    import pandas
    print(f"machine: {platform.node()}, {platform.machine()}, Python {platform.python_version()}, pandas "
          f"{pandas.__version__}, numpy {numpy.__version__}")
    paths = {"host-bound": tmp / "hostbound.json", "gpu-bound": tmp / "gpubound.json"}
    scale = {"host-bound": (args.host_scale, 1.0), "gpu-bound": (1.0, args.gpu_scale)}
    results = {"source": str(rel), "events": args.events, "host_scale": args.host_scale,
               "gpu_scale": args.gpu_scale, "runs": {}}
    try:
        for k, p in paths.items():
            info = build(src, p, args.events, *scale[k])
            print(f"{k}: {rel} x {info['copies']} = {info['events']:,} events, {info['bytes'] / 1e6:.0f} MB JSON")
        best: dict[str, dict] = {}
        for rep in range(args.reps):
            for k, p in paths.items():
                r = run(p)
                print(f"  rep {rep + 1} {k}: trace {r['trace_s']:.2f} s, audit {r['audit_s']:.2f} s; {r['steps']:,} "
                      f"steps, {r['rows']} rows, {r['stalls']:,} stalled calls per step, GPU "
                      f"{r['step_gpu_ms']:.2f} ms per step", flush=True)
                b = best.setdefault(k, dict(r))
                b["trace_s"], b["audit_s"] = min(b["trace_s"], r["trace_s"]), min(b["audit_s"], r["audit_s"])
        h, g = best["host-bound"], best["gpu-bound"]
        for cmd in ("trace", "audit"):
            ratio = h[f"{cmd}_s"] / g[f"{cmd}_s"]
            print(f"{cmd}: host-bound {h[cmd + '_s']:.2f} s, GPU-bound {g[cmd + '_s']:.2f} s = {ratio:.2f}x "
                  f"({'within' if ratio <= 2 else 'over'} the 2x target)")
            results[f"{cmd}_ratio"] = ratio
        results["runs"] = best
    finally:
        if not args.keep:
            for p in paths.values():
                p.unlink(missing_ok=True)
            try:
                tmp.rmdir()
            except OSError:
                pass
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
