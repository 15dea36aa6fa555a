#!/usr/bin/env python3
"""Speed of the whole-space search (`sweep --space`): per-config overhead against the GEMMs' own GPU time, and
what the decode preset's whole space would take on one GPU.

    # on the GPU machine: a slice of the decode preset's lt GEMMs (the only backend --space searches)
    PYTHONPATH=. python3 benchmarks/bench_space.py run OUTDIR [--shard 1/64] [--space 0.3]
    # anywhere: the figures from any sweep --space raw file (the atlas's, a run's)
    PYTHONPATH=. python3 benchmarks/bench_space.py report RAW.jsonl[.gz] [--budget-s S]

`report` reads each record's `space` (`gpu.space.search`): configs checked and first-sampled, their host
seconds (`seconds`: AlgoCheck, first samples, numerics, full timings, interleaved rounds), and the GPU µs of one
call of the configs (`first_us` of the top-N and leaders); it prints the host µs per screened config, its ratio
to a config's GPU time, the share of the distinct kernels each GEMM screened within its budget, and the
projection for the decode preset's 1,568 lt GEMMs (4,672 GEMMs in all: torch and torch-lt rows get no space)
at the budget given — and the budget per GEMM that fits 15 minutes.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

DECODE_LT = 1568          # lt GEMMs of the decode preset (`sweep.plan("decode", backends=["lt"])`)
TARGET_S = 15 * 60


def records(path: str) -> list[dict]:
    op = gzip.open if path.endswith(".gz") else open
    with op(path, "rt") as f:
        recs = [json.loads(line) for line in f if line.strip()]
    return [r for r in recs if "key" in r and isinstance(r.get("space"), dict) and "counts" in r["space"]]


def report(path: str, budget_s: float | None = None) -> str:
    recs = records(path)
    if not recs:
        return f"{path}: no record with a searched space"
    per_cfg, ratio, cover, elapsed, sig = [], [], [], [], []
    for r in recs:
        sp = r["space"]
        c, s = sp["counts"], sp.get("seconds") or {}
        n = c["screened"] + c.get("variants", 0)
        if n and s:
            host_us = (s["check"] + s["first"]) / n * 1e6
            per_cfg.append(host_us)
            gpu = [x["first_us"] for x in [sp.get("pick") or {}] + (sp.get("leaders") or []) if x.get("first_us")]
            if gpu:
                ratio.append(host_us / statistics.median(gpu))
        cover.append(c["screened"] / max(1, c["kernels"]))
        elapsed.append(sp["elapsed_s"])
        sig.append(sp["stage_s"].get("signature", 0.0))
    budget = budget_s or recs[0]["space"]["budget_s"]
    per_gemm = statistics.mean(elapsed)
    lines = [f"{len(recs)} GEMMs searched (budget {budget} s each): {statistics.mean(elapsed):.2f} s per GEMM "
             f"(+ {max(sig):.1f} s once for the types' enumeration)",
             f"screening: {statistics.median(per_cfg):.0f} µs of host time per config (median; AlgoCheck, a warm "
             f"run, one sample in a batch), {statistics.median(ratio):.1f}x one call's GPU time" if per_cfg
             else "screening: no per-config seconds in these records (captured before `seconds`)",
             f"distinct kernels screened within the budget: median {100 * statistics.median(cover):.0f} %, "
             f"least {100 * min(cover):.0f} %",
             f"decode preset ({DECODE_LT} lt GEMMs) at this budget: {DECODE_LT * per_gemm / 60:.1f} min on one "
             f"GPU; 15 min allows {TARGET_S / DECODE_LT:.2f} s per GEMM"]
    return "\n".join(lines)


def run(args) -> int:
    os.makedirs(args.outdir, exist_ok=True)
    out = os.path.join(args.outdir, "decode_space.parquet")
    cmd = [sys.executable, "-m", "cublaslt_probe", "sweep", "--preset", "decode", "--backends", "lt", "--space",
           str(args.space), "--shard", args.shard, "-o", out, "--no-progress"]
    print(" ".join(cmd), flush=True)
    rc = subprocess.run(cmd).returncode
    raw = [os.path.join(args.outdir, f) for f in os.listdir(args.outdir) if ".raw.jsonl" in f]
    for r in raw:
        print(report(r))
    return rc


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("outdir")
    r.add_argument("--shard", default="1/64")
    r.add_argument("--space", type=float, default=0.3)
    p = sub.add_parser("report")
    p.add_argument("raw")
    p.add_argument("--budget-s", type=float, default=None)
    args = ap.parse_args(argv)
    if args.cmd == "run":
        return run(args)
    print(report(args.raw, args.budget_s))
    return 0


if __name__ == "__main__":
    sys.exit(main())
