"""Benchmark: plans and merges at a million GEMMs, on the CPU.

plan   builds the plan of SPEC (1,048,576 GEMMs at the default --rows), best of --reps, with its keys and its
       digest (what every part records); in the same process, the expansion one Case at a time that the array
       expansion replaced (the A/B).
merge  writes the parts of that plan, --parts slices, then times `cublaslt-probe merge FOLDER` in a child
       process and samples the peak RSS of its process tree (psutil, every 200 ms):
         datasets  the parts' own datasets, as `sweep --shard` leaves them (each worker builds its part's rows);
         raw       the raw parts only (merge rebuilds every row from its record, --jobs processes).
       Each is run at --rows and at a quarter of it: memory that does not grow with the rows is flat.
       The records are real H200 records (data/h200_grid.raw.jsonl.gz: measurements, kernels and log line
       kept), each given the case fields of one GEMM of the plan; the datasets' rows are those records' rows
       (`dataset.build`), given the case columns of the plan's GEMMs.

phases where the time of a raw record's row goes (in one process, over the real records).

Usage: python benchmarks/bench_plan_merge.py [--rows 1048576] [--parts 16] [--what plan,phases,datasets,raw]
       [--dir DIR] [--json OUT]
"""
from __future__ import annotations

import argparse
import gzip
import itertools
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cublaslt_probe import sweep
from cublaslt_probe.analysis import dataset
from cublaslt_probe.cases import Case, invalid_reason

RECORDS = ROOT / "data" / "h200_grid.raw.jsonl.gz"
CASE_FIELDS = ("type", "key", "backend", "op", "dtype", "layout", "m", "n", "k", "batch", "blas_m", "blas_n", "blas_k",
               "blas_trans_a", "blas_trans_b")


def spec(rows: int) -> dict:
    """64 GEMMs per M (2 backends x 2 dtypes x 2 layouts x 4 N x 2 K), M = 1 .. rows/64."""
    return {"name": f"bench-{rows}", "group": [
        {"backends": ["torch", "torch-lt"], "ops": ["mm"], "dtypes": ["bf16", "fp16"], "layouts": ["NN", "NT"],
         "m": {"range": [1, rows // 64]}, "n": [4096, 6144, 8192, 14336], "k": [4096, 8192]}]}


def one_by_one(s: dict):
    """The expansion the array one replaced: a Case per combination, its validity and key asked each time."""
    seen, cases, skipped = set(), [], Counter()
    for g in s["group"]:
        shapes = list(itertools.product(*(sweep.expand_axis(g[a], a) for a in "mnk"), [1]))
        for (m, n, k, b), op, dt, lay, be in itertools.product(shapes, g["ops"], g["dtypes"], g["layouts"],
                                                               g["backends"]):
            c = Case(be, op, dt, lay, m, n, k, b)
            why = invalid_reason(c)
            if why:
                skipped[why] += 1
            elif c.key not in seen:
                seen.add(c.key)
                cases.append(c)
    return cases


def best(fn, reps: int) -> tuple[float, object]:
    """Least CPU time of this process (seconds) over `reps` calls, and the last result: CPU time, not wall
    time, since the 2-core machine this runs on is shared and its wall times swing with the load."""
    t, out = float("inf"), None
    for _ in range(reps):
        t0 = time.process_time()
        out = fn()
        t = min(t, time.process_time() - t0)
    return t, out


def bench_plan(rows: int, reps: int) -> dict:
    s = spec(rows)
    t_plan, plan = best(lambda: sweep.plan_from_spec(s), reps)
    t_keys, _ = best(lambda: plan.cases.keys(), reps)
    t_digest, _ = best(plan.digest, reps)
    t_old, old = best(lambda: one_by_one(s), 1)
    assert [c.key for c in old] == plan.cases.keys()
    return {"gemms": len(plan.cases), "plan_s": t_plan, "keys_s": t_keys, "digest_s": t_digest,
            "one_by_one_s": t_old}


def bench_phases(env: dict, recs: list[dict], reps: int) -> dict:
    """Where a raw record's row goes, CPU per record, in one process over the real records (best of `reps`):
    reading its JSON; `dataset.build_rows` (the row), and within it the parse of its log line
    (`evidence.trace_record`); the typed table from the rows (`dataset.build`'s frame, the Arrow table)."""
    import pandas as pd
    import pyarrow as pa

    from cublaslt_probe.analysis import evidence
    lines = [json.dumps({"type": "gemm", **r}) for r in recs]
    n = len(lines)
    t_json, _ = best(lambda: [json.loads(x) for x in lines], reps)
    t_rows, rows = best(lambda: list(dataset.build_rows(recs, env)), reps)
    t_log, _ = best(lambda: [evidence.trace_record(r.get("log_lines")) for r in recs], reps)
    schema = dataset.arrow_schema()
    t_table, _ = best(lambda: pa.Table.from_pandas(dataset.validate(dataset.coerce(pd.DataFrame(
        rows, columns=dataset.COLUMNS))), schema=schema, preserve_index=False), reps)
    per = {"json_us": t_json, "row_us": t_rows, "table_us": t_table}
    return {k: v / n * 1e6 for k, v in per.items()} | {"log_line_us": t_log / n * 1e6, "records": n}


def _templates():
    with gzip.open(RECORDS, "rt") as f:
        lines = f.read().splitlines()
    env = json.loads(lines[0])
    recs = [json.loads(x) for x in lines[1:]]
    return env, recs


def write_raw_parts(folder: Path, rows: int, parts: int, env: dict, recs: list[dict]) -> None:
    plan = sweep.plan_from_spec(spec(rows))
    tails = [json.dumps({k: v for k, v in r.items() if k not in CASE_FIELDS})[1:] for r in recs]
    for i in range(1, parts + 1):
        sl = sweep.Slice(i, parts)
        path = sweep.raw_path(sweep.part_path(str(folder / "x.parquet"), sl))
        with open(path, "w") as f:
            f.write(json.dumps({"type": "env", **env, **sweep.run_meta(plan, sl)}) + "\n")
            for j, c in enumerate(sl.take(plan.cases)):
                f.write(f'{{"type": "gemm", "key": "{c.key}", "backend": "{c.backend}", "op": "{c.op}", '
                        f'"dtype": "{c.dtype}", "layout": "{c.layout}", "m": {c.m}, "n": {c.n}, "k": {c.k}, '
                        f'"batch": {c.batch}, "blas_m": {c.n}, "blas_n": {c.m}, "blas_k": {c.k}, '
                        f'"blas_trans_a": "{c.layout[1]}", "blas_trans_b": "{c.layout[0]}", '
                        + tails[(j * parts + i) % len(tails)] + "\n")


def write_dataset_parts(folder: Path, rows: int, parts: int, env: dict, recs: list[dict]) -> None:
    import numpy as np
    plan = sweep.plan_from_spec(spec(rows))
    base = dataset.build(recs, env)
    for i in range(1, parts + 1):
        sl = sweep.Slice(i, parts)
        cases = sl.take(plan.cases)
        df = base.iloc[np.arange(len(cases)) % len(base)].reset_index(drop=True)
        cols = cases.cols
        df["key"] = cases.keys()
        for f in sweep.NAMES:
            df[f] = np.array(sweep.NAMES[f], dtype=object)[cols[f]]
        for f in sweep.SIZES:
            df[f] = cols[f]
        df["blas_m"], df["blas_n"], df["blas_k"] = cols["n"], cols["m"], cols["k"]
        lay = df["layout"].astype(str)
        df["blas_trans_a"], df["blas_trans_b"] = lay.str[1], lay.str[0]
        df = dataset.coerce(df)
        dataset.write_parquet(df, sweep.part_path(str(folder / "x.parquet"), sl),
                              dict(env, **sweep.run_meta(plan, sl)))


def timed_merge(folder: Path, out: Path, jobs: int | None) -> dict:
    """`cublaslt-probe merge folder -o out` in a child process: wall time, CPU time (user + system, its worker
    processes included: what the merge costs whatever else the machine runs) and peak RSS of its process tree."""
    import resource

    import psutil
    cmd = [sys.executable, "-m", "cublaslt_probe", "merge", str(folder), "-o", str(out)]
    if jobs:
        cmd += ["--jobs", str(jobs)]
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = psutil.Popen(cmd, stderr=subprocess.PIPE, text=True)
    peak = [0, 0]   # tree, main process
    done = threading.Event()

    def sample():
        while not done.is_set():
            try:
                main = proc.memory_info().rss
                tree = main + sum(c.memory_info().rss for c in proc.children(recursive=True))
                peak[0], peak[1] = max(peak[0], tree), max(peak[1], main)
            except psutil.Error:
                pass
            time.sleep(0.2)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    _, err = proc.communicate()
    wall = time.perf_counter() - t0
    done.set()
    th.join()
    if proc.returncode:
        sys.exit(f"merge failed: {err}")
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    return {"wall_s": wall, "cpu_s": cpu, "peak_rss_mb": peak[0] / 2 ** 20, "peak_rss_main_mb": peak[1] / 2 ** 20,
            "message": err.strip().splitlines()[-1]}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1 << 20, help="GEMMs of the plan (a multiple of 64)")
    ap.add_argument("--parts", type=int, default=16)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=None, help="merge --jobs for raw parts (default: one per core)")
    ap.add_argument("--what", default="plan,phases,datasets,raw")
    ap.add_argument("--dir", default=None, help="where to write the parts (default: a temporary folder)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    what = a.what.split(",")
    res = {"cpu_count": os.cpu_count(), "rows": a.rows, "parts": a.parts}
    print(f"{os.cpu_count()} cores; load average {os.getloadavg()[0]:.1f}")
    if "plan" in what:
        res["plan"] = p = bench_plan(a.rows, a.reps)
        print(f"plan: {p['gemms']:,} GEMMs in {p['plan_s']:.2f} s CPU (best of {a.reps}); keys {p['keys_s']:.2f} s, "
              f"digest {p['digest_s']:.2f} s; one Case at a time: {p['one_by_one_s']:.2f} s "
              f"({p['one_by_one_s'] / p['plan_s']:.0f}x)")
    env, recs = _templates()
    if "phases" in what:
        res["phases"] = ph = bench_phases(env, recs, a.reps)
        total = ph["json_us"] + ph["row_us"] + ph["table_us"]
        print(f"raw record -> row, CPU per record over {ph['records']:,} real records (best of {a.reps}): "
              f"JSON {ph['json_us']:.0f} µs, row {ph['row_us']:.0f} µs (its log line {ph['log_line_us']:.0f} µs), "
              f"table {ph['table_us']:.0f} µs; {total:.0f} µs in all, the log line {ph['log_line_us'] / total:.0%}")
    top = Path(a.dir or tempfile.mkdtemp(prefix="bench-merge-"))
    for kind in ("datasets", "raw"):
        if kind not in what:
            continue
        for rows in (a.rows // 4 // 64 * 64, a.rows):
            folder = top / f"{kind}-{rows}"
            folder.mkdir(parents=True, exist_ok=True)
            t0 = time.perf_counter()
            (write_dataset_parts if kind == "datasets" else write_raw_parts)(folder, rows, a.parts, env, recs)
            size = sum(f.stat().st_size for f in folder.iterdir())
            print(f"{kind} {rows:,} rows: {a.parts} parts written in {time.perf_counter() - t0:.0f} s "
                  f"({size / 1e6:,.0f} MB)", flush=True)
            load0 = os.getloadavg()[0]
            r = timed_merge(folder, top / f"merged-{kind}-{rows}.parquet", a.jobs if kind == "raw" else None)
            r.update(rows=rows, input_mb=size / 1e6, load_before=load0, load_after=os.getloadavg()[0])
            res.setdefault("merge", []).append(dict(r, kind=kind))
            print(f"  merge: {r['wall_s']:.1f} s ({r['wall_s'] / rows * 1e6:.1f} µs/row), CPU {r['cpu_s']:.1f} s "
                  f"({r['cpu_s'] / rows * 1e6:.1f} µs/row), peak RSS "
                  f"{r['peak_rss_mb']:.0f} MB (main process {r['peak_rss_main_mb']:.0f} MB); load average "
                  f"{r['load_before']:.1f} -> {r['load_after']:.1f} — {r['message']}",
                  flush=True)
            for f in folder.iterdir():
                f.unlink()
            folder.rmdir()
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
