"""The H200 space atlas: the llm preset's F.linear GEMMs (bf16 `mm` or fp8 `scaled_mm`) at the token counts given,
each with its whole algo space searched (`sweep --space`), then nvMatmulHeuristics' columns beside them.

    # on the GPU machine (repo root, PYTHONPATH=.): the sweep, under a hard deadline
    python3 scripts/capture_space_atlas.py capture OUTDIR [--budget-s 1.2] [--tokens 16,128,1] [--dtype bf16|fp8]
        [--deadline-s 200]
    # anywhere (CPU; the nvidia-matmul-heuristics wheel): the atlas from the raw records (one capture or several)
    python3 scripts/capture_space_atlas.py finish OUTDIR/h200_space.raw.jsonl[.gz] [MORE_RAW ...] \
        -o data/h200_space.parquet

`capture` writes OUTDIR/space_spec.json (the subset: every (N, K) of `sweep.presets.llm_weights()` at the token
counts given, lt backend, NT, bf16 `mm` or fp8 `scaled_mm`), runs `cublaslt-probe sweep --spec ... --space BUDGET` into
OUTDIR/h200_space.parquet (raw records beside it, written window by window: a deadline that stops the sweep
keeps every finished window), and OUTDIR/env.txt (nvidia-smi, versions). `finish` builds the dataset from the
raw records (`cublaslt-probe dataset`), adds `nvmmh.scored`'s columns and the model against the space's best
(`nvmmh_space_agrees`: its top-1 CTA tile is the space best's; `nvmmh_space_log_err`: ln(predicted / space best
µs)), and writes the Parquet. The raw files of data/h200_space.parquet and their commands: data/PROVENANCE.md.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def capture(args) -> int:
    from cublaslt_probe.sweep.presets import llm_weights
    os.makedirs(args.outdir, exist_ok=True)
    tokens = [int(t) for t in args.tokens.split(",")]
    op = {"bf16": "mm", "fp8": "scaled_mm"}[args.dtype]
    spec = {"name": "llm-space", "group": [{"backends": ["lt"], "ops": [op], "dtypes": [args.dtype], "layouts": ["NT"],
                                            "shapes": [[t, n, k] for t in tokens for n, k in llm_weights()]}]}
    spec_path = os.path.join(args.outdir, "space_spec.json")
    with open(spec_path, "w") as f:
        json.dump(spec, f, indent=1)
    out = os.path.join(args.outdir, "h200_space.parquet")
    cmd = [sys.executable, "-m", "cublaslt_probe", "sweep", "--spec", spec_path, "--space", str(args.budget_s),
           "-o", out, "--window", str(args.window), "--no-progress"]
    print(" ".join(cmd), flush=True)
    try:
        rc = subprocess.run(cmd, timeout=args.deadline_s).returncode
    except subprocess.TimeoutExpired:
        rc = 124
        print(f"deadline {args.deadline_s} s: the sweep was stopped; its raw records hold the finished windows",
              flush=True)
    with open(os.path.join(args.outdir, "env.txt"), "w") as f:
        versions = "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
        for c in (["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv"],
                  [sys.executable, "-c", versions]):
            try:
                f.write(subprocess.run(c, capture_output=True, text=True, timeout=60).stdout)
            except (OSError, subprocess.TimeoutExpired) as e:
                f.write(f"{c[0]}: {e}\n")
        f.write(" ".join(cmd) + f"\nexit {rc}\n")
    return 0 if rc in (0, 124) else rc


def finish(args) -> int:
    import pandas as pd

    from cublaslt_probe import nvmmh
    from cublaslt_probe.analysis import dataset
    tmp = args.output + ".base.parquet"
    subprocess.run([sys.executable, "-m", "cublaslt_probe", "dataset", *args.raw, "-o", tmp], check=True)
    df = dataset.read_parquet(tmp)
    os.remove(tmp)
    env = df.attrs.get("env") or {}
    sc = nvmmh.scored(df)
    rows = []
    for r in sc.to_dict("records"):
        cfg = str(r.get("space_best_config") or "").split()
        best_tile = cfg[1] if len(cfg) > 1 else None
        pred, best = r.get("nvmmh_us"), r.get("space_best_us")
        ok = isinstance(pred, float) and pred == pred and isinstance(best, float) and best == best and best > 0
        rows.append({"nvmmh_space_agrees": None if not (r.get("nvmmh_tile") and best_tile) or pd.isna(
                         r.get("nvmmh_tile")) else r["nvmmh_tile"] == best_tile,
                     "nvmmh_space_log_err": math.log(pred / best) if ok else None})
    extra = pd.DataFrame(rows, index=sc.index).astype({"nvmmh_space_agrees": "boolean",
                                                       "nvmmh_space_log_err": "float64"})
    out = sc.join(extra)
    out.attrs = sc.attrs
    dataset.write_parquet(out, args.output, env)
    print(f"wrote {args.output}: {len(out)} rows, {int(out['space_regret'].notna().sum())} with a searched space")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("capture")
    c.add_argument("outdir")
    c.add_argument("--budget-s", type=float, default=1.2)
    c.add_argument("--tokens", default="16,128,1")
    c.add_argument("--dtype", choices=("bf16", "fp8"), default="bf16")
    c.add_argument("--window", type=int, default=4)
    c.add_argument("--deadline-s", type=float, default=200.0)
    f = sub.add_parser("finish")
    f.add_argument("raw", nargs="+")
    f.add_argument("-o", "--output", required=True)
    args = ap.parse_args(argv)
    return capture(args) if args.cmd == "capture" else finish(args)


if __name__ == "__main__":
    sys.exit(main())
