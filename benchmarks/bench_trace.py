"""Benchmark: `cublaslt-probe trace` import speed (MB/s) and peak memory on large torch.profiler traces.

The large traces are built from the events of a real trace in tests/fixtures/traces (captured on an H200,
see PROVENANCE there): its ``traceEvents`` repeated until the file reaches the requested size, each copy
shifted in time (``ts`` + the trace's span) and with its ids rewritten (``External id``, ``correlation``,
flow ``id``, ``Ev Idx`` + a per-copy offset) so that links stay inside their copy, one event per line
(Kineto spreads an event over a few indented lines; the parser depends on neither), and gzipped too
(torch.profiler writes ``.json.gz``).

Each measurement runs in a child process that reports its own peak RSS (``ru_maxrss``): best time of
``--reps`` runs on the page-cached file; a child that only imports the modules gives the baseline. Two
sizes (``--mb`` and ``--small-mb``) show whether memory grows with the file. ``--json-load`` also measures
a plain ``json.load`` of the small file for comparison.

Usage: python benchmarks/bench_trace.py [--source tests/fixtures/traces/X.json.gz] [--mb 400] [--small-mb 200]
                                        [--reps 3] [--json-load] [--json OUT] [--keep DIR]
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRACES = ROOT / "tests" / "fixtures" / "traces"
_ID_KEYS = ("External id", "correlation", "Ev Idx", "Python id", "Python parent id")


def source_trace(path: str | None) -> Path:
    if path:
        return Path(path)
    found = sorted(TRACES.glob("*.json.gz")) + sorted(TRACES.glob("*.json"))
    if not found:
        sys.exit(f"no real trace under {TRACES}: the benchmark builds its traces from one (--source PATH)")
    return max(found, key=lambda p: p.stat().st_size)


def _load(p: Path) -> dict:
    with (gzip.open(p, "rt", encoding="utf-8") if p.suffix == ".gz" else open(p, encoding="utf-8")) as f:
        return json.load(f)


def build(src: Path, out: Path, mb: float) -> dict:
    """Write a trace of about `mb` MB (uncompressed) from `src`'s events; returns what it wrote."""
    doc = _load(src)
    events = doc["traceEvents"]
    head = {k: v for k, v in doc.items() if k != "traceEvents"}
    ts = [e["ts"] for e in events if isinstance(e.get("ts"), (int, float))]
    span = (max(ts) - min(ts) + 1000.0) if ts else 1000.0
    ids = [e.get("args", {}).get(k) for e in events for k in _ID_KEYS] + [e.get("id") for e in events]
    id_step = max([i for i in ids if isinstance(i, int)] + [0]) + 1
    target = int(mb * 1e6)
    size = copies = n = 0
    with open(out, "w", encoding="utf-8") as f:
        f.write("{\n" + "".join(f"  {json.dumps(k)}: {json.dumps(v)},\n" for k, v in head.items()
                                if k not in ("traceName", "displayTimeUnit", "baseTimeNanoseconds")))
        f.write('  "traceEvents": [\n')
        first = True
        while size < target:
            for e in events:
                e = dict(e)
                if isinstance(e.get("ts"), (int, float)):
                    e["ts"] = round(e["ts"] + copies * span, 3)
                if isinstance(e.get("id"), int):
                    e["id"] += copies * id_step
                if isinstance(e.get("args"), dict):
                    a = dict(e["args"])
                    for k in _ID_KEYS:
                        if isinstance(a.get(k), int) and a[k] > 0:
                            a[k] += copies * id_step
                    e["args"] = a
                text = ("  " if first else ",\n  ") + json.dumps(e)
                first = False
                f.write(text)
                size += len(text)
                n += 1
            copies += 1
        f.write('\n  ],\n  "traceName": "bench"\n}\n')
    return {"events": n, "copies": copies, "bytes": out.stat().st_size}


CHILD = r"""
import json, resource, sys, time
mode, path = sys.argv[1], sys.argv[2]
import pandas, numpy
from cublaslt_probe import names
from cublaslt_probe.analysis import dataset, trace
t0 = time.perf_counter()
out = {}
if mode == "trace":
    s = trace.read_trace(path)
    out = {"events": s.stats.events, "gemm_launches": s.stats.gemm_launches, "rows": len(s.kernels),
           "bytes_read": s.stats.bytes_read, "bad": s.stats.bad_events}
elif mode == "json.load":
    import gzip
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
        doc = json.load(f)
    out = {"events": len(doc["traceEvents"])}
out["seconds"] = time.perf_counter() - t0
out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps(out))
"""


def child(mode: str, path: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", CHILD, mode, str(path)], capture_output=True, text=True, env=env)
    if r.returncode:
        sys.exit(f"child {mode} {path} failed:\n{r.stderr}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--source", help="real trace to repeat (default: the largest in tests/fixtures/traces)")
    ap.add_argument("--mb", type=float, default=400)
    ap.add_argument("--small-mb", type=float, default=200)
    ap.add_argument("--reps", type=int, default=3, help="runs per file (best time, largest peak RSS)")
    ap.add_argument("--json-load", action="store_true", help="also time a plain json.load of the small file")
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--keep", help="build the traces in this directory and keep them")
    args = ap.parse_args()
    src = source_trace(args.source)
    tmp = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench_trace_"))
    tmp.mkdir(parents=True, exist_ok=True)
    base = child("import", src)
    print(f"source: {src.relative_to(ROOT) if src.is_relative_to(ROOT) else src}; "
          f"baseline (python + pandas + the package imported): {base['peak_rss_mb']:.0f} MB peak RSS")
    results = {"source": str(src), "baseline_rss_mb": base["peak_rss_mb"], "runs": []}
    try:
        for mb in (args.small_mb, args.mb):
            p = tmp / f"trace_{int(mb)}mb.json"
            info = build(src, p, mb)
            gz = p.with_suffix(".json.gz")
            with open(p, "rb") as fi, gzip.open(gz, "wb", compresslevel=6) as fo:
                while chunk := fi.read(1 << 24):
                    fo.write(chunk)
            for f in (p, gz):
                child("trace", f)            # warm the page cache
                runs = [child("trace", f) for _ in range(args.reps)]
                r = min(runs, key=lambda x: x["seconds"])     # best time; memory: the largest peak
                r["peak_rss_mb"] = max(x["peak_rss_mb"] for x in runs)
                mbytes = info["bytes"] / 1e6
                row = {"file": f.name, "file_mb": f.stat().st_size / 1e6, "json_mb": mbytes,
                       "events": r["events"], "gemm_launches": r["gemm_launches"], "seconds": r["seconds"],
                       "mb_per_s": mbytes / r["seconds"], "peak_rss_mb": r["peak_rss_mb"],
                       "above_baseline_mb": r["peak_rss_mb"] - base["peak_rss_mb"], "bad_events": r["bad"]}
                results["runs"].append(row)
                print(f"{f.name:>24}: {row['file_mb']:7.1f} MB on disk, {mbytes:7.1f} MB JSON, {r['events']:,} "
                      f"events ({r['gemm_launches']:,} GEMM launches) in {r['seconds']:.2f} s = "
                      f"{row['mb_per_s']:.1f} MB/s of JSON; peak RSS {r['peak_rss_mb']:.0f} MB "
                      f"(+{row['above_baseline_mb']:.0f} MB over the baseline)")
            if args.json_load and mb == args.small_mb:
                r = child("json.load", p)
                results["json_load"] = {"file": p.name, "seconds": r["seconds"], "peak_rss_mb": r["peak_rss_mb"]}
                print(f"{'json.load ' + p.name:>24}: {r['seconds']:.2f} s, peak RSS {r['peak_rss_mb']:.0f} MB "
                      f"(the whole document in memory)")
            if not args.keep:
                p.unlink()
                gz.unlink()
    finally:
        if not args.keep:
            try:
                tmp.rmdir()
            except OSError:
                pass
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
