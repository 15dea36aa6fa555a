"""Benchmark: `parse_log` over a large cuBLASLt log against a bare ``for line in f: pass`` loop.

The log is built from the real trace lines in tests/fixtures/logs (captured on an H200, see PROVENANCE.md
there), written to a temporary file of the requested size. Each measurement runs in a child process that
times the bare loop and the parser over the same (page-cached) file, interleaved, best of ``--reps``,
and reports its own peak RSS, so memory can be compared across file sizes.

Variants (``--variant``, default all):
  repeat     the real lines repeated verbatim (what the issue asks for; the parser's caches hit)
  realistic  the same lines with the clock advancing (a new second every 1,000 lines) and pointers
             drawn from a small pool per line, like a training loop under torch's caching allocator
  distinct   every line a different problem (Adesc's ld changed): no cache can help, the worst case
  level5     the lines of the level-5 log repeated (Api/Info lines skipped without ``api=True``)

Usage: python benchmarks/bench_parse_log.py [--mb 200] [--small-mb 50] [--variant repeat] [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOGS = ROOT / "tests" / "fixtures" / "logs"
VARIANTS = ("repeat", "realistic", "distinct", "level5")
_TRACE = re.compile(r"\]\[Trace\]\[cublasLt[A-Z]*Matmul\] ")
_PTR = re.compile(r"=0[Xx][0-9A-Fa-f]+")


def real_trace_lines() -> list[str]:
    lines = []
    for p in sorted(LOGS.glob("level2_*.log")):
        lines += [x for x in p.read_text().splitlines() if _TRACE.search(x)]
    if not lines:
        sys.exit(f"no real trace lines under {LOGS}: the benchmark builds its log from them")
    return lines


def build(path: Path, variant: str, mb: float, seed: int = 0) -> int:
    """Write a log of about `mb` MB; return the number of lines."""
    rng = random.Random(seed)
    target = int(mb * 1e6)
    base = (LOGS / "level5_torch.log").read_text().splitlines() if variant == "level5" else real_trace_lines()
    size = n = 0
    clock = 0
    with open(path, "w") as f:
        while size < target:
            for line in base:
                if variant == "realistic":
                    if n % 1000 == 0:
                        clock += 1
                    line = f"[2026-11-30 {clock // 3600 % 24:02d}:{clock // 60 % 60:02d}:{clock % 60:02d}]" + \
                        line[21:]
                    pool = rng.randrange(4)  # one of four allocations per operand
                    line = _PTR.sub(lambda m, p=pool: m.group(0)[:-1] + "0123456789ABCDEF"[p], line)
                elif variant == "distinct":
                    line = line.replace(" ld=", f" ld={n}", 1)  # Adesc's ld: a new problem every line
                f.write(line + "\n")
                size += len(line) + 1
                n += 1
                if size >= target:
                    break
    return n


def child(path: str, reps: int) -> dict:
    """Runs in a fresh interpreter: times both loops on `path` and reports this process's peak RSS."""
    import collections

    sys.path.insert(0, str(ROOT))
    from cublaslt_probe.logs import ParseStats, parse_log

    rss_start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with open(path) as f:  # warm the page cache
        for _ in f:
            pass
    bare, parse = [], []
    stats = None
    for _ in range(reps):
        t = time.perf_counter()
        with open(path) as f:
            for _line in f:
                pass
        bare.append(time.perf_counter() - t)
        stats = ParseStats()
        t = time.perf_counter()
        collections.deque(parse_log(path, stats=stats), maxlen=0)  # consume, keep nothing
        parse.append(time.perf_counter() - t)
    return {"bare_s": min(bare), "parse_s": min(parse), "records": stats.records, "lines": stats.lines,
            "bad": stats.bad, "rss_start_mb": rss_start / 1024,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def measure(path: Path, reps: int) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", str(path), "--reps", str(reps)],
                         capture_output=True, text=True, check=True)
    res = json.loads(out.stdout)
    res["children_peak_rss_mb"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=float, default=200, help="size of the large log (MB)")
    ap.add_argument("--small-mb", type=float, default=50, help="size of the small log, for the memory check")
    ap.add_argument("--variant", choices=VARIANTS, action="append", help="(repeatable; default: all)")
    ap.add_argument("--reps", type=int, default=3, help="timed passes of each loop (best is kept)")
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.reps)))
        return
    results = []
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs; best of {args.reps}; "
          f"log built from {len(real_trace_lines())} real trace lines")
    print(f"{'variant':10} {'MB':>6} {'lines':>10} {'bare s':>7} {'parse s':>8} {'ratio':>6} "
          f"{'MB/s':>6} {'Mlines/s':>8} {'peak RSS MB':>11}")
    with tempfile.TemporaryDirectory(prefix="bench_parse_log_") as tmp:
        for variant in args.variant or VARIANTS:
            for mb in (args.small_mb, args.mb):
                path = Path(tmp) / f"{variant}_{mb:g}MB.log"
                n = build(path, variant, mb)
                size_mb = path.stat().st_size / 1e6
                r = measure(path, args.reps)
                path.unlink()
                r.update(variant=variant, mb=size_mb, n_lines=n, ratio=r["parse_s"] / r["bare_s"],
                         mb_per_s=size_mb / r["parse_s"], mlines_per_s=n / r["parse_s"] / 1e6)
                results.append(r)
                print(f"{variant:10} {size_mb:6.0f} {n:10,} {r['bare_s']:7.3f} {r['parse_s']:8.3f} "
                      f"{r['ratio']:5.2f}x {r['mb_per_s']:6.0f} {r['mlines_per_s']:8.2f} "
                      f"{r['peak_rss_mb']:11.1f}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
