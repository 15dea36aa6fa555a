"""Benchmark: peak memory and time of the CLI end to end, every output format, on large inputs.

- parse-log on a ~1 GB cuBLASLt log (the real trace lines of tests/fixtures/logs repeated, see
  bench_parse_log.py ``repeat``) in every format: table, csv, jsonl, parquet and ``--summary``; the text
  formats both to a file and to /dev/null (the file system's own write speed is shown apart: a log's
  JSONL is ~2.4x its size);
- trace on a ~1 GB torch.profiler trace (built by bench_trace.py's `build` from the real fixture trace),
  table and jsonl;
- decode of 100,000 names (the real names of tests/fixtures/names, repeated) with pathological ones mixed
  in: a 5,000-digit size field, 1 MB names, undecodable bytes, control characters, empty lines;
- dataset of a raw file of 100,000 probe records (the shipped data/h200_square.raw.jsonl.gz's records
  repeated under new keys).

Each run is a fresh `python -m cublaslt_probe` process; its peak RSS comes from ``os.wait4`` and its time
from the wall clock. Targets (docs/cli.md): every format under 300 MB peak RSS; the table within 1.5x of
jsonl's time; parse-log end to end (read, parse, write jsonl) at 100 MB/s or more. The inputs are built in
a temporary folder and deleted; nothing large is kept.

Usage: python benchmarks/bench_cli.py [--log-mb 1000] [--trace-mb 1000] [--names 100000] [--records 100000]
                                      [--only parse-log] [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))


def run(argv: list[str], stdout: str | None = None, stdin: str | None = None) -> dict:
    """Run the CLI once; wall time, CPU time (user + system: what a busy machine does not inflate), peak
    RSS (MB) and exit status of that process alone."""
    cmd = [sys.executable, "-m", "cublaslt_probe", *argv]
    out = open(stdout or os.devnull, "wb")
    inp = open(stdin, "rb") if stdin else subprocess.DEVNULL
    t = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=out, stdin=inp, stderr=subprocess.PIPE, cwd=ROOT)
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t
    err = p.stderr.read().decode(errors="replace")
    out.close()
    if stdin:
        inp.close()
    code = os.waitstatus_to_exitcode(status)
    if code not in (0, 3):
        raise SystemExit(f"{' '.join(argv)} exited {code}: {err[-2000:]}")
    return {"argv": " ".join(argv), "wall_s": wall, "cpu_s": ru.ru_utime + ru.ru_stime,
            "peak_rss_mb": ru.ru_maxrss / 1024, "exit": code}


def write_speed(tmp: Path, mb: int = 500) -> float:
    """MB/s of writing `mb` MB to a file in `tmp` (this machine's file system, for reference)."""
    block = b"x" * (1 << 20)
    p = tmp / "speed.bin"
    t = time.perf_counter()
    with open(p, "wb") as f:
        for _ in range(mb):
            f.write(block)
    s = time.perf_counter() - t
    p.unlink()
    return mb / s


def bench_parse_log(tmp: Path, mb: float) -> list[dict]:
    from bench_parse_log import build
    log = tmp / "big.log"
    lines = build(log, "repeat", mb)
    size = log.stat().st_size / 1e6
    with open(log, "rb") as f:  # page cache
        while f.read(1 << 24):
            pass
    rows = []
    for fmt, to_file in (("jsonl", False), ("jsonl", True), ("table", False), ("table", True), ("csv", False),
                         ("csv", True), ("parquet", True), ("summary", False)):
        out = tmp / f"out.{'txt' if fmt == 'table' else fmt}"   # the suffix decides the format
        argv = ["parse-log", str(log)] + (["--summary"] if fmt == "summary" else ["-f", fmt])
        if to_file:
            argv += ["-o", str(out)]
        r = run(argv)
        r.update(bench="parse-log", format=fmt, to=("file" if to_file else "/dev/null"), input_mb=size,
                 lines=lines, mb_per_s=size / r["wall_s"],
                 output_mb=out.stat().st_size / 1e6 if to_file else None)
        if out.exists():
            out.unlink()
        rows.append(r)
        _print(r)
    log.unlink()
    return rows


def bench_trace(tmp: Path, mb: float) -> list[dict]:
    from bench_trace import build, source_trace
    trace = tmp / "big_trace.json"
    build(source_trace(None), trace, mb)
    size = trace.stat().st_size / 1e6
    rows = []
    for fmt in ("table", "jsonl"):
        r = run(["trace", str(trace), "-f", fmt])
        r.update(bench="trace", format=fmt, to="/dev/null", input_mb=size, mb_per_s=size / r["wall_s"])
        rows.append(r)
        _print(r)
    trace.unlink()
    return rows


def names_file(tmp: Path, n: int) -> Path:
    """`n` names: the real fixture names repeated, with pathological ones every 1,000 names."""
    real = [json.loads(x)["kernel"] for x in (ROOT / "tests" / "fixtures" / "names" / "names.jsonl")
            .read_text().splitlines()]
    bad = [b"nvjet_sm90_tst_" + b"9" * 5000 + b"x128_64x4_1x2_h_bz_coopA_TNT",  # int() digit limit
           b"x" * 1_000_000,                                                  # a 1 MB name
           b"nvjet_\xff\xfe_sm90",                                             # not UTF-8
           b"cutlass\x00\x1b[31m_80_tensorop\r_tn",                            # control characters
           b"",                                                                # empty line
           ("void cutlass::Kernel2<" * 200 + ">" * 200).encode()]              # deep template nesting
    rng = random.Random(0)
    p = tmp / "names.txt"
    with open(p, "wb") as f:
        for i in range(n):
            f.write((bad[(i // 1000) % len(bad)] if i % 1000 == 999 else rng.choice(real).encode()) + b"\n")
    return p


def bench_decode(tmp: Path, n: int) -> list[dict]:
    p = names_file(tmp, n)
    rows = []
    for fmt in ("table", "jsonl", "csv", "json"):
        r = run(["decode", "-f", fmt, "-"], stdin=str(p))
        r.update(bench="decode", format=fmt, to="/dev/null", names=n, input_mb=p.stat().st_size / 1e6,
                 names_per_s=n / r["wall_s"])
        rows.append(r)
        _print(r)
    return rows


def bench_dataset(tmp: Path, n: int) -> list[dict]:
    import gzip
    with gzip.open(ROOT / "data" / "h200_square.raw.jsonl.gz", "rt") as f:
        env, *recs = [json.loads(x) for x in f]
    p = tmp / "big.raw.jsonl"
    with open(p, "w") as f:
        f.write(json.dumps(env) + "\n")
        for i in range(n):
            r = dict(recs[i % len(recs)])
            r["key"] = f"{r['key']}#{i // len(recs)}"
            f.write(json.dumps(r) + "\n")
    size = p.stat().st_size / 1e6
    r = run(["dataset", str(p), "-o", str(tmp / "big.parquet")])
    r.update(bench="dataset", format="parquet", to="file", input_mb=size, records=n, mb_per_s=size / r["wall_s"])
    _print(r)
    p.unlink()
    return [r]


def _print(r: dict) -> None:
    if "mb_per_s" in r:
        speed = f"{r['mb_per_s']:6.1f} MB/s ({r['input_mb'] / r['cpu_s']:6.1f} per CPU s)"
    else:
        speed = f"{r['names_per_s']:9,.0f} names/s"
    print(f"{r['bench']:9} {r['format']:8} -> {r['to']:9} {r['wall_s']:8.2f} s (CPU {r['cpu_s']:7.2f} s)  {speed}  "
          f"peak RSS "
          f"{r['peak_rss_mb']:7.1f} MB  exit {r['exit']}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--log-mb", type=float, default=1000)
    ap.add_argument("--trace-mb", type=float, default=1000)
    ap.add_argument("--names", type=int, default=100_000)
    ap.add_argument("--records", type=int, default=100_000, help="raw records for the dataset run")
    ap.add_argument("--only", choices=("parse-log", "trace", "decode", "dataset"), action="append")
    ap.add_argument("--tmp", type=Path, default=None, help="folder for the inputs (default: a temporary one)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    only = args.only or ("parse-log", "trace", "decode", "dataset")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_cli_", dir=args.tmp) as t:
        tmp = Path(t)
        fs = write_speed(tmp)
        print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs; writing a file here: {fs:.0f} MB/s",
              flush=True)
        if "decode" in only:
            rows += bench_decode(tmp, args.names)
        if "dataset" in only:
            rows += bench_dataset(tmp, args.records)
        if "parse-log" in only:
            rows += bench_parse_log(tmp, args.log_mb)
        if "trace" in only:
            rows += bench_trace(tmp, args.trace_mb)
    pl = {(r["format"], r["to"]): r for r in rows if r["bench"] == "parse-log"}
    if pl:
        j, tb = pl.get(("jsonl", "/dev/null")), pl.get(("table", "/dev/null"))
        if j and tb:
            print(f"table / jsonl time: {tb['wall_s'] / j['wall_s']:.2f}x wall, {tb['cpu_s'] / j['cpu_s']:.2f}x CPU "
                  "(target <= 1.5x)")
        print(f"peak RSS, largest: {max(r['peak_rss_mb'] for r in rows):.0f} MB (target < 300 MB)")
    if args.json:
        args.json.write_text(json.dumps({"file_write_mb_per_s": fs, "runs": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
