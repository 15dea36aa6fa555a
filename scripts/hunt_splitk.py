"""Hunt cuBLAS bug 6580689 on this GPU: algo 66 with a forced SPLITK_NUM over ranges of K, every output checked.

For each dtype (bf16, fp16), tokens m in {16, 64, 128}, n = 4096 output features, two layouts (TN: torch's
Linear, K contiguous, lda = ldb = K rounded up to 8 so that any K keeps 16-byte strides; NT: K strided) and a
set of K values that make floor(K / s) a multiple of the stage size for s = 2..8 without s dividing K (and
controls: K a multiple of s; s not dividing K with floor(K / s) not a multiple), it takes the algo-66 configs the
heuristic proposes for the shape (up to 3 distinct tile/stages/cluster; when it proposes none, those of the
group's last shape that had some: source "group") plus algo 66's default, forces each SPLITK_NUM in 2..16
(reduction in the compute type), asks `cublasLtMatmulAlgoCheck` first (a refused config
is counted, not run), runs it and checks the output against float64 (`gpu.numerics`). The heuristic's own pick
for each shape is run and checked too. Kernel names (CUPTI) are captured for every config of the first K of each
group and of every shape where a config failed.

    python scripts/hunt_splitk.py OUT.json.gz [--budget-s 240]     (GPU)
    python scripts/hunt_splitk.py FIXTURE.json.gz --trim OUT.json.gz (CPU: the committed form, `trim`)

Writes all configs tried (JSON lines under "configs"), the failures, the shapes and the picks.
"""
from __future__ import annotations

import argparse
import gzip
import json
import random
import sys
import time

SPLITS = tuple(range(2, 17))
STAGE_SIZES = (32, 64, 128)
WORKSPACE = 32 << 20   # the cuBLAS API's workspace preference on Hopper (its Api log line)


def k_values() -> list[tuple[int, str]]:
    """(K, why): for each s in 2..8 and stage size S, K = s·j·S + r (0 < r < s: the bug's shape), K = s·j·S
    (control: s divides K) and K = s·(j·S + 8) + 1 (control: floor not a multiple); for s in 9..16,
    K = 64·s·j + 8 (the bug's shape with K a multiple of 8) and its control K = 64·s·j."""
    ks: dict[int, str] = {}
    for s in range(2, 9):
        for S in STAGE_SIZES:
            for j in (1, 2, 4, 8):
                base = s * j * S
                if base > 16384:
                    continue
                for r in sorted({1, s - 1}):
                    ks.setdefault(base + r, f"s={s} S={S} j={j} r={r}")
                ks.setdefault(base, f"control divides s={s} S={S} j={j}")
                ks.setdefault(s * (j * S + 8) + 1, f"control floor s={s} S={S} j={j}")
    for s in range(9, 17):   # K a multiple of 8 (torch's Linear with 16-byte strides) needs s > 8 to meet the rule
        for j in (1, 2, 4):
            ks.setdefault(s * j * 64 + 8, f"aligned s={s} S=64 j={j} r=8")
            ks.setdefault(s * j * 64, f"control divides s={s} S=64 j={j}")
    out = sorted(ks.items())
    random.Random(0).shuffle(out)   # a budget stop leaves a spread of K, not the smallest ones
    return out


ROW_FIELDS = ("dtype", "layout", "tokens", "k", "lda", "base", "tile", "stages", "cluster", "custom_option",
              "split_k", "numerics_ok", "error_ratio", "max_rel_err", "kernel")
PICK_FIELDS = ("dtype", "layout", "tokens", "k", "lda", "algo_id", "tile", "stages", "cluster", "split_k",
               "reduction_scheme", "numerics_ok", "error_ratio", "max_rel_err", "known_issue", "pick_failed_config")


def _columns(rows: list[dict], fields) -> dict:
    def cell(r, f):
        v = r.get(f)
        if f == "kernel":
            v = next((n for n in r.get("kernels") or [] if n.startswith("nvjet")), None)
        if isinstance(v, float):
            v = float(f"{v:.4g}")
        return v
    return {f: [cell(r, f) for r in rows] for f in fields}


def trim(raw: dict, passing_sample: int = 2000, seed: int = 0) -> dict:
    """The committed form of a hunt: its environment, counts and stop, every failing config, a seeded sample
    of the passing ones (those meeting a known issue's conditions, then those sharing a failing config's
    shape, then the rest), every heuristic pick (columns of
    lists: `ROW_FIELDS`, `PICK_FIELDS`) and the count of configs run per (dtype, layout, split-K, verdict)."""
    ran = [r for r in raw["configs"] if r.get("status") == "ran"]
    fail = [r for r in ran if not r["numerics_ok"]]
    ok = [r for r in ran if r["numerics_ok"]]
    fail_shapes = {(r["dtype"], r["layout"], r["tokens"], r["k"]) for r in fail}
    flagged = [r for r in ok if r.get("conditions")]   # configs meeting the conditions that passed the check
    near = flagged + [r for r in ok if not r.get("conditions")
                      and (r["dtype"], r["layout"], r["tokens"], r["k"]) in fail_shapes]
    rest = [r for r in ok if not r.get("conditions")
            and (r["dtype"], r["layout"], r["tokens"], r["k"]) not in fail_shapes]
    rng = random.Random(seed)
    sample = near[:passing_sample] + rng.sample(rest, max(0, min(len(rest), passing_sample - len(near))))
    table: dict = {}
    for r in ran:
        verdict = ",".join(v for _, v in r.get("conditions") or []) or "none"
        key = f"{r['dtype']}|{r['layout']}|{r['split_k']}|{verdict}"
        t = table.setdefault(key, [0, 0])
        t[0] += 1
        t[1] += not r["numerics_ok"]
    refused = [r for r in raw["configs"] if r.get("status", "").startswith("refused")]
    env = {k: v for k, v in raw["env"].items() if k != "header"}   # the header's path is the machine's
    return {"env": env, "counts": raw["counts"], "stopped": raw["stopped"], "elapsed_s": raw["elapsed_s"],
            "splits": raw["splits"], "stage_sizes": raw["stage_sizes"], "shapes": len(raw["shapes"]),
            "refused_by_base": dict(sorted({b: sum(r["base"] == b for r in refused)
                                            for b in {r["base"] for r in refused}}.items())),
            "ran_failed_by_dtype_layout_split_verdict": dict(sorted(table.items())),
            "failures": _columns(fail, ROW_FIELDS), "passing_sample": _columns(sample, ROW_FIELDS),
            "picks": _columns(raw["picks"], PICK_FIELDS)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--budget-s", type=float, default=240.0)
    ap.add_argument("--dtypes", default="bf16,fp16")
    ap.add_argument("--trim", metavar="RAW", help="write OUT as the trimmed form of the hunt result RAW (CPU only)")
    args = ap.parse_args(argv)
    if args.trim:
        opener = gzip.open if args.trim.endswith(".gz") else open
        with opener(args.trim, "rt") as f:
            raw = json.load(f)
        with (gzip.open if args.out.endswith(".gz") else open)(args.out, "wt") as f:
            json.dump(trim(raw), f, separators=(",", ":"))
        return 0
    import torch

    from cublaslt_probe import known_issues as KI
    from cublaslt_probe.gpu import lt, numerics
    from cublaslt_probe.gpu.kernel_capture import profile_kernels
    from cublaslt_probe.gpu.operands import LtGemm
    t_start = time.time()
    lib = lt.LtLibrary()
    marker = torch.zeros(1, dtype=torch.int8, device="cuda")
    props = torch.cuda.get_device_properties(0)
    cc = f"{props.major}.{props.minor}"
    env = {"gpu": props.name, "cc": cc, "cublaslt": lib.version_str, "cublaslt_version": lib.version,
           "torch": torch.__version__, "cuda": torch.version.cuda, "header": lib.enums.header}
    red_compute = lib.enums.values.get("CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE")
    ws = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    configs, shapes, picks = [], [], []
    counts = {"refused_by_check": 0, "workspace_too_large": 0, "ran": 0, "failed": 0, "run_errors": 0}
    stopped = None
    groups = [(d, m, lay) for d in args.dtypes.split(",") for lay in ("TN", "NT") for m in (16, 64, 128)]
    kv = {lay: k_values() for lay in ("TN", "NT")}
    # interleave: the i-th K of every group before the (i+1)-th, so a budget stop leaves every group covered
    order = [(gi, i) for i in range(max(len(v) for v in kv.values())) for gi in range(len(groups))
             if i < len(kv[groups[gi][2]])]
    first_of_group = set()
    donors: dict = {}
    for gi, i in order:
        if time.time() - t_start > args.budget_s:
            stopped = f"budget {args.budget_s:.0f} s reached after {len(shapes)} shapes"
            break
        dtype, tokens, lay = groups[gi]
        K, why = kv[lay][i]
        n_out = 4096
        if lay == "TN":
            ld = -(-K // 8) * 8
            p = lt.Problem(n_out, tokens, K, dtype=dtype, trans_a="T", trans_b="N", lda=ld, ldb=ld,
                           workspace_bytes=WORKSPACE)
        else:
            p = lt.Problem(n_out, tokens, K, dtype=dtype, trans_a="N", trans_b="T", workspace_bytes=WORKSPACE)
        shape = {"dtype": dtype, "layout": lay, "tokens": tokens, "m": p.m, "n": p.n, "k": K, "lda": p.lda,
                 "why": why}
        try:
            g = LtGemm(torch, lib, p, workspace=ws)
        except Exception as e:  # noqa: BLE001
            shape["error"] = f"{type(e).__name__}: {e}"[:200]
            shapes.append(shape)
            continue
        with g:
            ref, absprod = numerics.reference(torch, p, g.A, g.B)
            try:
                res = g.heuristic(8)
            except Exception as e:  # noqa: BLE001
                res = []
                shape["heuristic_error"] = str(e)[:200]
            bases, seen = [], set()
            pick = None
            for rank, r in enumerate(res):
                cfg = lib.read_algo_config(r.algo)
                if rank == 0:
                    num = numerics.run_config(torch, g, r.algo, ref, absprod, split_k=cfg["split_k"] or 1,
                                              reduction_in_output_type=cfg["reduction_scheme"] not in
                                              (None, "NONE", "COMPUTE_TYPE"))
                    pick = {**shape, **{k: cfg[k] for k in ("algo_id", "tile", "stages", "cluster", "split_k",
                                                            "reduction_scheme", "custom_option")}, **num}
                    pick["known_issue"] = KI.label({**cfg, "k": K}, cublas=lib.version_str, cc=cc)
                    picks.append(pick)
                if cfg["algo_id"] == 66:
                    key = (cfg["tile_enum"], cfg["stages_enum"], cfg["cluster_enum"])
                    if key not in seen and len(bases) < 3:
                        seen.add(key)
                        bases.append(("heuristic", rank, cfg))
            if bases:
                donors[gi] = [("group", None, c) for _, _, c in bases]
            else:   # the heuristic proposes no algo 66 here: force the group's last algo-66 configs
                bases = list(donors.get(gi, []))
            try:
                bases.append(("default", None, lib.read_algo_config(lt.init_algo(lib, p, 66))))
            except Exception as e:  # noqa: BLE001
                shape["init_error"] = str(e)[:200]
            calls, rows = [], []
            for src, rank, cfg in bases:
                for s in SPLITS:
                    algo = lt.init_algo(lib, p, 66)
                    vals = {"tile": cfg["tile_enum"], "stages": cfg["stages_enum"], "cluster": cfg["cluster_enum"],
                            "custom_option": cfg["custom_option"], "cta_swizzling": cfg["cta_swizzling"],
                            "split_k": s, "reduction_scheme": red_compute}
                    row = {**shape, "base": src, "base_rank": rank, "tile": cfg["tile"], "stages": cfg["stages"],
                           "cluster": cfg["cluster"], "custom_option": cfg["custom_option"], "split_k": s}
                    st = lt.set_config_values(lib, algo, vals)
                    if st == 0:
                        st, chk = lt.algo_check(g.mm, algo)
                    if st != 0:
                        row["status"] = f"refused ({st})"
                        counts["refused_by_check"] += 1
                        configs.append(row)
                        continue
                    if chk.workspaceSize > WORKSPACE:
                        row["status"] = f"workspace {chk.workspaceSize}"
                        counts["workspace_too_large"] += 1
                        configs.append(row)
                        continue
                    got = lib.read_algo_config(algo)
                    row["split_k_set"] = got["split_k"]
                    row["stage_size"] = KI.stage_size(cfg["stages"])
                    cond = {"algo_id": 66, "split_k": s, "stages": cfg["stages"], "k": K}
                    try:
                        num = numerics.run_config(torch, g, algo, ref, absprod, split_k=s)
                        row.update(num)
                        row["status"] = "ran"
                        counts["ran"] += 1
                        counts["failed"] += not num["numerics_ok"]
                        calls.append(g.call(algo))
                        rows.append(row)
                    except Exception as e:  # noqa: BLE001
                        row["status"] = f"error: {e}"[:200]
                        counts["run_errors"] += 1
                        torch.cuda.synchronize()
                    row["conditions"] = [(m.issue.bug_id, m.verdict) for m in
                                         KI.match(cond, cublas=lib.version_str, cc=cc)]
                    configs.append(row)
            if pick is not None:
                pick["pick_failed_config"] = any(
                    not r.get("numerics_ok", True) and r["split_k"] == pick["split_k"] and r["tile"] == pick["tile"]
                    and r["stages"] == pick["stages"] for r in rows)
            need = gi not in first_of_group or any(not r["numerics_ok"] for r in rows)
            first_of_group.add(gi)
            if need and calls:
                try:
                    for row, ks in zip(rows, profile_kernels(torch, calls, marker)):
                        row["kernels"] = [n for n, _ in ks]
                except Exception as e:  # noqa: BLE001
                    shape["profile_error"] = str(e)[:200]
            shape["configs_ran"] = len(rows)
            shape["configs_failed"] = sum(not r["numerics_ok"] for r in rows)
            shapes.append(shape)
    failures = [r for r in configs if r.get("status") == "ran" and not r["numerics_ok"]]
    out = {"env": env, "splits": SPLITS, "stage_sizes": STAGE_SIZES, "counts": counts, "stopped": stopped,
           "elapsed_s": round(time.time() - t_start, 1), "shapes": shapes, "picks": picks, "failures": failures,
           "configs": configs}
    opener = gzip.open if args.out.endswith(".gz") else open
    with opener(args.out, "wt") as f:
        json.dump(out, f)
    print(json.dumps({k: out[k] for k in ("env", "counts", "stopped", "elapsed_s")}, indent=1))
    print("shapes", len(shapes), "picks", len(picks), "picks failing", sum(not p["numerics_ok"] for p in picks),
          "picks with known_issue", sum(bool(p.get("known_issue")) for p in picks))
    for f_ in failures[:20]:
        print("FAIL", {k: f_.get(k) for k in ("dtype", "layout", "tokens", "k", "tile", "stages", "split_k",
                                              "error_ratio", "max_rel_err", "conditions")})
    return 0


if __name__ == "__main__":
    sys.exit(main())
