"""Heuristic candidates and regret (CPU side): was cuBLASLt's pick the fastest of its own candidates?

The GPU side (`alternatives.lt_candidates`) asks `cublasLtMatmulAlgoGetHeuristic` for up to N candidates, runs each
and times it. Here: the table, the regret arithmetic and the headline over a dataset.

- regret of one problem = time(#0) / time(best) − 1, over the candidates that ran and produced a result
  within the dtype's tolerance of #0's (a wrong answer is not "faster").
- noise band: #0 is timed twice (before and after the others); |t₁/t₂ − 1| over all problems measures how
  far two medians of the *same* kernel drift. The band is the 95th percentile of that spread (at least
  0.5 %): a regret inside the band is not evidence that another candidate is faster.
"""
from __future__ import annotations

import json
import math

from cublaslt_probe.analysis.evidence import main_kernel
from cublaslt_probe.errors import SchemaError

# max |y - y0| / max |y0| two correct algorithms may differ by (accumulation order, split-K).
TOLERANCE = {"fp32": 1e-4, "tf32": 5e-3, "fp16": 2e-2, "bf16": 2e-2, "fp8": 5e-2, "fp8_e5m2": 5e-2}
NOISE_FLOOR_PCT = 0.5


def max_rel_diff(y, ref) -> float:
    """max |y - ref| / max |ref| of two outputs of one shape (torch tensors, or numpy arrays), the measure
    `TOLERANCE` bounds; a zero `ref` counts as 1e-30, so that any difference shows. Computed with the
    arrays' own operations (on the GPU for CUDA tensors): one number comes back."""
    return float((abs(y - ref).max() / abs(ref).max().clip(min=1e-30)).item())


def tolerance(dtype: str) -> float:
    return TOLERANCE.get(dtype, 2e-2)


def usable(c: dict, dtype: str) -> bool:
    d = c.get("max_rel_diff_vs_0")
    return (not c.get("error") and c.get("time_us") is not None and c["time_us"] > 0
            and (d is None or d <= tolerance(dtype)))


def regret(cands: list[dict], dtype: str) -> dict:
    """Regret fields of one problem from its candidate rows (rank order)."""
    out = {"n_candidates": len(cands), "regret_pct": None, "best_rank": None, "best_kernel": None,
           "best_time_us": None, "pick_time_us": None, "noise_pct": None}
    ok = [c for c in cands if usable(c, dtype)]
    if not ok or ok[0]["rank"] != 0:
        return out
    best = min(ok, key=lambda c: c["time_us"])
    t0 = ok[0]["time_us"]
    out.update({"regret_pct": (t0 / best["time_us"] - 1) * 100, "best_rank": best["rank"],
                "best_kernel": main_kernel(best.get("kernels")), "best_time_us": best["time_us"],
                "pick_time_us": t0})
    rep = ok[0].get("time_us_repeat")
    if rep:
        out["noise_pct"] = abs(t0 / rep - 1) * 100
    return out


def noise_band(noise_pcts) -> float:
    vals = sorted(x for x in noise_pcts if x is not None and not math.isnan(x))
    if not vals:
        return NOISE_FLOOR_PCT
    q = vals[min(len(vals) - 1, int(math.ceil(0.95 * len(vals))) - 1)]
    return max(NOISE_FLOOR_PCT, q)


def summary(df) -> dict:
    """Headline over a dataset with regret columns: share where #0 is fastest within noise, median/worst."""
    if "regret_pct" not in df:
        raise SchemaError("this dataset has no regret columns: sweep with `--candidates 32` (e.g. --preset regret)")
    d = df[df["regret_pct"].notna()]
    if d.empty:
        raise SchemaError("no row of this dataset has candidates with times")
    band = noise_band(d["noise_pct"].tolist())
    r = d["regret_pct"].astype(float)
    out = {"problems": int(len(d)), "noise_band_pct": band,
           "pick_fastest_within_noise": float((r <= band).mean()),
           "pick_strictly_fastest": float((d["best_rank"] == 0).mean()),
           "median_regret_pct": float(r.median()), "mean_regret_pct": float(r.mean()),
           "worst_regret_pct": float(r.max())}
    w = d.loc[r.idxmax()]
    out["worst"] = {"key": w["key"], "pick": w.get("kernel"), "best": w["best_kernel"],
                    "best_rank": int(w["best_rank"])}
    by = {}
    for dt, g in d.groupby("dtype", observed=True):
        rr = g["regret_pct"].astype(float)
        by[str(dt)] = {"problems": int(len(g)), "pick_fastest_within_noise": float((rr <= band).mean()),
                       "median_regret_pct": float(rr.median()), "worst_regret_pct": float(rr.max())}
    out["by_dtype"] = by
    return out


# The fields of a candidate row a raw record keeps (`compact`): its config, waves, workspace, times, numerics
# against #0, kernels and error.
CANDIDATE_KEYS = ("rank", "algo_id", "tile", "stages", "cluster", "split_k", "reduction_scheme", "custom_option",
                  "cta_swizzling", "inner_shape", "waves", "workspace_bytes", "time_us", "time_us_min",
                  "time_us_repeat", "max_rel_diff_vs_0", "kernels", "error")


def compact(row: dict) -> dict:
    """The `CANDIDATE_KEYS` of a candidate row as `alternatives.lt_candidates` returns it (None where absent)."""
    return {k: row.get(k) for k in CANDIDATE_KEYS}


def to_json(cands: list[dict]) -> str:
    slim = []
    for c in cands:
        c = dict(c)
        c["kernel"] = main_kernel(c.pop("kernels", None))
        slim.append(c)
    return json.dumps(slim, separators=(",", ":"))


# --- the table of one problem ---------------------------------------------------------------------------------
COLUMNS = ["rank", "algo_id", "tile", "stages", "cluster", "split_k", "reduction_scheme", "custom_option",
           "cta_swizzling", "inner_shape", "waves", "workspace_bytes", "kernel", "time_us", "tflops",
           "max_rel_diff_vs_0", "matches_0", "mark"]


def table(cands: list[dict], *, m: int, n: int, k: int, batch: int = 1, dtype: str = "bf16"):
    """Rows for display: decoded kernel, TFLOP/s, correctness vs #0, the pick (#0) and the fastest marked."""
    import pandas as pd
    flops = 2 * m * n * k * batch
    rows = []
    ok = [c for c in cands if usable(c, dtype)]
    best = min(ok, key=lambda c: c["time_us"])["rank"] if ok else None
    for c in cands:
        t = c.get("time_us")
        d = c.get("max_rel_diff_vs_0")
        mark = []
        if c["rank"] == 0:
            mark.append("heuristic pick")
        if c["rank"] == best:
            mark.append("fastest")
        rows.append({"rank": c["rank"], "algo_id": c.get("algo_id"), "tile": c.get("tile"), "stages": c.get("stages"),
                     "cluster": c.get("cluster"), "split_k": c.get("split_k"),
                     "reduction_scheme": c.get("reduction_scheme"), "custom_option": c.get("custom_option"),
                     "cta_swizzling": c.get("cta_swizzling"), "inner_shape": c.get("inner_shape"),
                     "waves": c.get("waves"), "workspace_bytes": c.get("workspace_bytes"),
                     "kernel": c.get("kernel") or main_kernel(c.get("kernels")),
                     "time_us": t, "tflops": flops / t / 1e6 if t else None, "max_rel_diff_vs_0": d,
                     "matches_0": None if d is None else d <= tolerance(dtype),
                     "mark": ", ".join(mark) or (c.get("error") or "")})
    return pd.DataFrame(rows, columns=COLUMNS)
