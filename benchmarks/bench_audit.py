"""Benchmark: `audit` of a large trace against `trace` of the same file (target: audit within 2x trace).

The large trace is built from a real run folder's trace in tests/fixtures/programs (captured on an H200 with
the capture API: step and module ranges, record_shapes; see PROVENANCE there) by `bench_trace.build`: its
events repeated until the file reaches ``--mb``, each copy shifted in time and with its ids rewritten, so every
copy is more steps of the same program with their own module ranges and backward nodes. Both commands run on
the same page-cached file, each in a child process that reports its time and peak RSS; best of ``--reps``.

Usage: python benchmarks/bench_audit.py [--source tests/fixtures/programs/gpt2_train/trace.json.gz] [--mb 200]
                                        [--reps 3] [--json OUT] [--keep DIR]
"""
from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SOURCE = ROOT / "tests" / "fixtures" / "programs" / "gpt2_train" / "trace.json.gz"

CHILD = r"""
import json, resource, sys, time
mode, path = sys.argv[1], sys.argv[2]
import pandas, numpy
from cublaslt_probe import names
from cublaslt_probe.analysis import audit, trace
t0 = time.perf_counter()
if mode == "trace":
    s = trace.read_trace(path)
    out = {"gemm_launches": s.stats.gemm_launches, "rows": len(s.kernels), "events": s.stats.events}
elif mode == "audit":
    a = audit.audit(path)
    out = {"rows": len(a.rows), "steps": a.steps, "gemm_us": a.gemm_gpu_us, "rows_us": float(a.rows.gpu_us.sum()),
           "attributed": a.attributed_share}
else:
    out = {}
out["seconds"] = time.perf_counter() - t0
out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps(out))
"""


def _bench_trace():
    spec = importlib.util.spec_from_file_location("bench_trace", Path(__file__).parent / "bench_trace.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def child(mode: str, path: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", CHILD, mode, str(path)], capture_output=True, text=True, env=env)
    if r.returncode:
        sys.exit(f"child {mode} {path} failed:\n{r.stderr}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def best(mode: str, path: Path, reps: int) -> dict:
    child(mode, path)                                   # warm the page cache and the imports
    runs = [child(mode, path) for _ in range(reps)]
    r = min(runs, key=lambda x: x["seconds"])
    r["peak_rss_mb"] = max(x["peak_rss_mb"] for x in runs)
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--source", default=str(DEFAULT_SOURCE), help="real trace to repeat")
    ap.add_argument("--mb", type=float, default=200)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--keep", help="build the trace in this directory and keep it")
    args = ap.parse_args()
    src = Path(args.source)
    tmp = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench_audit_"))
    tmp.mkdir(parents=True, exist_ok=True)
    p = tmp / f"audit_{int(args.mb)}mb.json"
    info = _bench_trace().build(src, p, args.mb)
    gz = p.with_suffix(".json.gz")
    with open(p, "rb") as fi, gzip.open(gz, "wb", compresslevel=6) as fo:
        while chunk := fi.read(1 << 24):
            fo.write(chunk)
    base = child("import", p)
    rel = src.relative_to(ROOT) if src.resolve().is_relative_to(ROOT) else src
    results = {"source": str(rel), "json_mb": info["bytes"] / 1e6,
               "copies": info["copies"], "events": info["events"], "baseline_rss_mb": base["peak_rss_mb"], "runs": []}
    print(f"source {results['source']} x {info['copies']} = {info['bytes'] / 1e6:.0f} MB JSON, {info['events']:,} "
          f"events; baseline {base['peak_rss_mb']:.0f} MB RSS")
    try:
        for f in (p, gz):
            t = best("trace", f, args.reps)
            a = best("audit", f, args.reps)
            row = {"file": f.name, "trace_s": t["seconds"], "audit_s": a["seconds"],
                   "ratio": a["seconds"] / t["seconds"], "trace_rss_mb": t["peak_rss_mb"],
                   "audit_rss_mb": a["peak_rss_mb"], "steps": a["steps"], "rows": a["rows"],
                   "coverage": a["rows_us"] / a["gemm_us"] if a["gemm_us"] else None,
                   "attributed": a["attributed"]}
            results["runs"].append(row)
            print(f"{f.name:>22}: trace {t['seconds']:.2f} s ({t['peak_rss_mb']:.0f} MB), audit {a['seconds']:.2f} s "
                  f"({a['peak_rss_mb']:.0f} MB) = {row['ratio']:.2f}x; {a['steps']:,} steps, {a['rows']} rows, "
                  f"rows/GEMM time {row['coverage']:.4f}, attributed {100 * a['attributed']:.1f} %")
    finally:
        if not args.keep:
            p.unlink(missing_ok=True)
            gz.unlink(missing_ok=True)
            try:
                tmp.rmdir()
            except OSError:
                pass
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
