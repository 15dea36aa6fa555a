"""The whole algo space of a GEMM (CPU side): the search's rules, its trust model and its dataset columns.

The GPU side (`gpu.space.search`, `candidates --space`, `sweep --space`) enumerates every config cuBLASLt
accepts for a problem, times them under a budget and keeps a `space` record. Here, with no GPU:

- the order the distinct kernels are screened in (`screen_order`) and the pruning rule (`prunes`);
- the trust model of a regret (`trust`): the finalists (the heuristic's pick, the best of its top-N, the
  space's best few) timed in interleaved rounds, the pick twice per round (its noise floor against itself),
  the winner's flip rate across rounds; a regret within the noise floor is labelled so and never a loss;
- the dataset columns of a `space` record (`columns`), the headline over a dataset (`summary`) and its
  figures by dtype and token class (`by_tokens`, `nvmmh_by_tokens`) and by shape class (`by_class`).

docs/space.md says how the space is enumerated, sampled and pruned, and what the H200 atlas showed.
"""
from __future__ import annotations

import math
import re
import statistics

PRUNE_RATIO = 1.25      # a config whose first sample exceeds the best first sample so far by this factor ...
PRUNE_SLACK_US = 1.0    # ... plus this (an estimate of one call carries its events' fixed cost) is pruned
NOISE_FLOOR_PCT = 0.5   # the least noise floor: two medians of one kernel never count as closer than this
FLIP_LIMIT = 0.2        # a regret is a loss only when the winner changes in at most this share of the rounds

LABELS = ("loss", "within noise", "pick is best")

_PAIR = re.compile(r"^(\d+)x(\d+)")


def _pair(name) -> tuple[int, int] | None:
    m = _PAIR.match(name) if isinstance(name, str) else None
    return (int(m.group(1)), int(m.group(2))) if m else None


def wave_efficiency(tile: str | None, cluster: str | None, m: int, n: int, sms: int = 132) -> float:
    """The share of the SMs' last wave the tile's CTAs fill for a cuBLAS-view m×n output (1.0: whole waves);
    0.5 when the tile is unnamed (no prior). A cluster groups CTAs: its CTA count rounds the grid up."""
    t = _pair(tile)
    if t is None or t[0] == 0 or t[1] == 0:
        return 0.5
    c = _pair(cluster) or (1, 1)
    gm = math.ceil(math.ceil(m / t[0]) / c[0]) * c[0]
    gn = math.ceil(math.ceil(n / t[1]) / c[1]) * c[1]
    ctas = gm * gn
    return ctas / (math.ceil(ctas / sms) * sms)


def screen_order(kernels: list[dict], m: int, n: int, sms: int = 132) -> list[int]:
    """Indices of `kernels` (dicts with algo_id, tile, cluster names) in the order they are screened: the algo
    ids interleaved (each algo's next kernel in turn, so a budget cut leaves every algo sampled), each algo's
    kernels by wave efficiency of their tile on this output (`wave_efficiency`, best first), then by the
    useful work per CTA (larger tiles first among equals: fewer CTAs, less operand re-reading). Pure."""
    by_algo: dict = {}
    for i, kc in enumerate(kernels):
        by_algo.setdefault(kc.get("algo_id"), []).append(i)

    def score(i):
        kc = kernels[i]
        t = _pair(kc.get("tile")) or (0, 0)
        return (-round(wave_efficiency(kc.get("tile"), kc.get("cluster"), m, n, sms), 3), -t[0] * t[1], i)
    queues = [sorted(ix, key=score) for _, ix in sorted(by_algo.items(), key=lambda kv: (kv[0] != 66, kv[0] or 0))]
    out: list[int] = []
    depth = 0
    while any(depth < len(q) for q in queues):
        out += [q[depth] for q in queues if depth < len(q)]
        depth += 1
    return out


def prunes(first_us: float, best_first_us: float | None, ratio: float = PRUNE_RATIO,
           slack_us: float = PRUNE_SLACK_US) -> bool:
    """Is a config whose first sample took `first_us` far enough behind the best first sample so far to stop
    timing it? Never before a best exists. Pure."""
    return best_first_us is not None and first_us > ratio * best_first_us + slack_us


def trust(rounds: list[dict], pick: str, contenders: list[str], pick_ok: bool = True) -> dict:
    """The trust model of the regret of `pick` against `contenders` (finalist names; the pick may be one) from
    interleaved rounds: each round a dict name -> µs (its median that round), the pick's twice as `pick` and
    `pick + "#2"` (first and last of the round). Returns:

    - `medians`: each finalist's median over the rounds (the pick's over both of its timings);
    - `winner`: the finalist with the least median: the pick included unless `pick_ok` is False (its output
      failed the numerics check: a wrong config never wins);
    - `noise_pct`: the noise floor, the largest |pick/pick#2 − 1| over the rounds, at least NOISE_FLOOR_PCT;
    - `regret_pct`: median over the rounds of pick / winner − 1, the pick's time a round the mean of its two
      (0 when the pick wins);
    - `flip_rate`: the winner's flip rate: the share of rounds in which the winner did not beat the pick (the
      pick's mean of two at most the winner's time) — the comparison the regret claims, flipped;
    - `leader_changes`: the share of rounds whose fastest finalist is not the `winner` (finalists near each
      other trade places without making the pick any faster);
    - `label`: "pick is best" (the pick wins), "within noise" (regret ≤ noise floor, or the winner flips in
      more than FLIP_LIMIT of the rounds), else "loss". Pure."""
    rounds = [r for r in rounds if r.get(pick) and r.get(pick + "#2")]
    out = {"rounds": len(rounds), "medians": {}, "winner": None, "noise_pct": None, "regret_pct": None,
           "flip_rate": None, "leader_changes": None, "label": None}
    if not rounds:
        return out
    names = list(dict.fromkeys([pick, *contenders]))
    med = {}
    for nm in names:
        vals = [r[nm] for r in rounds if r.get(nm)] + ([r[pick + "#2"] for r in rounds] if nm == pick else [])
        if vals:
            med[nm] = statistics.median(vals)
    eligible = [nm for nm in med if pick_ok or nm != pick]
    if not eligible:
        return {**out, "rounds": len(rounds), "medians": med}
    winner = min(eligible, key=lambda nm: (med[nm], nm != pick))
    noise = max(abs(r[pick] / r[pick + "#2"] - 1) * 100 for r in rounds)
    per_round = [(r[pick] + r[pick + "#2"]) / 2 / r[winner] - 1 for r in rounds if r.get(winner)]
    regret = 0.0 if winner == pick else statistics.median(per_round) * 100
    changes = sum(1 for r in rounds if min((nm for nm in eligible if r.get(nm)), key=lambda nm: r[nm]) != winner)
    held = [r for r in rounds if r.get(winner)]
    flips = 0 if winner == pick else sum(1 for r in held if (r[pick] + r[pick + "#2"]) / 2 <= r[winner])
    out.update(medians=med, winner=winner, noise_pct=max(noise, NOISE_FLOOR_PCT), regret_pct=regret,
               flip_rate=flips / max(1, len(held)), leader_changes=changes / len(rounds))
    if winner == pick:
        out["label"] = "pick is best"
    elif regret <= out["noise_pct"] or out["flip_rate"] > FLIP_LIMIT:
        out["label"] = "within noise"
    else:
        out["label"] = "loss"
    return out


# --- dataset columns ---------------------------------------------------------------------------------------
SCHEMA = {
    "space_best_us": ("float64", "the space's best correct config: its median over the interleaved rounds, µs"),
    "space_pick_us": ("float64", "the heuristic's pick in the same rounds, µs (median of its two timings a round)"),
    "space_regret": ("float64", "pick / space best - 1 (a fraction; 0 when the pick is the best)"),
    "space_regret_label": ("string", "loss, within noise (regret within the pick-vs-itself noise floor or the "
                                     "winner flips across rounds) or pick is best"),
    "space_noise_pct": ("float64", "largest |pick/pick - 1| of the pick timed twice a round, % (at least 0.5)"),
    "space_flip_rate": ("float64", "the winner's flip rate: share of rounds in which the space's best did not "
                                   "beat the pick"),
    "space_best_config": ("string", "algo id, tile, stages, cluster, custom option, swizzle, split-K, reduction "
                                    "of the space's best"),
    "space_best_kernel": ("string", "kernel the space's best launched (CUPTI)"),
    "space_best_in_topn": ("boolean", "the space's best is one of the heuristic's top-N candidates"),
    "topn_best_us": ("float64", "the best correct config of the heuristic's top-N, µs (interleaved rounds)"),
    "space_configs": ("Int64", "valid configs of the problem: split-K-1 configs AlgoCheck accepts, times one plus "
                               "the split-K numbers accepted per config (sampled)"),
    "space_kernels": ("Int64", "distinct kernels among them (one config per kernel name, screened first)"),
    "space_timed": ("Int64", "configs run and timed (first sample at least)"),
    "space_pruned": ("Int64", "timed configs pruned after their first sample (far behind the best so far)"),
    "space_wrong": ("Int64", "timed configs whose output failed the numerics check"),
    "numerics_ok": ("boolean", "the heuristic's pick's output is within the tolerance of a float64 reference"),
    "pick_in_space": ("boolean", "the heuristic's pick is among the enumerated valid configs"),
    "space_budget_s": ("float64", "the search's time budget for the GEMM, s (`--space SECONDS`)"),
    "space_elapsed_s": ("float64", "the search's own time for the GEMM, s (the types' enumeration, once per "
                                   "process, not counted)"),
}


def config_text(c: dict | None) -> str | None:
    """`66 64x16 64xAUTO 2x1x1 c1 s0 k2 COMPUTE_TYPE`: a config in one short string (None for None)."""
    if not c:
        return None
    parts = [str(c.get("algo_id")), str(c.get("tile")), str(c.get("stages")), str(c.get("cluster")),
             f"c{c.get('custom_option')}", f"s{c.get('cta_swizzling')}", f"k{c.get('split_k') or 1}"]
    if (c.get("split_k") or 1) > 1:
        parts.append(str(c.get("reduction_scheme")))
    return " ".join(parts)


def record_trust(sp: dict) -> dict:
    """The trust model of a `space` record, computed from its recorded rounds (`trust`: the one rule, whatever
    rule the capture applied); the recorded `trust` when it holds no rounds."""
    tr = sp.get("trust") or {}
    fin = sp.get("finalists") or {}
    if not tr.get("times") or "pick" not in fin:
        return tr
    return trust(tr["times"], "pick", [nm for nm in fin if nm != "pick"],
                 pick_ok=(sp.get("pick") or {}).get("numerics_ok") is not False)


def columns(sp: dict | None) -> dict:
    """The `SCHEMA` columns of one raw record's `space` field (all null when it has none or it failed); the
    regret, its label and the space's best from `record_trust`."""
    out = dict.fromkeys(SCHEMA)
    if not sp or sp.get("error"):
        return out
    tr = record_trust(sp)
    med = tr.get("medians") or {}
    fin = sp.get("finalists") or {}
    best = fin.get(tr.get("winner")) or sp.get("space_best") or {}
    topn = sp.get("topn_best") or {}
    pick = sp.get("pick") or {}
    cnt = sp.get("counts") or {}
    out.update({
        "space_best_us": med.get(tr.get("winner")),
        "space_pick_us": med.get("pick"),
        "space_regret": None if tr.get("regret_pct") is None else tr["regret_pct"] / 100,
        "space_regret_label": tr.get("label"), "space_noise_pct": tr.get("noise_pct"),
        "space_flip_rate": tr.get("flip_rate"),
        "space_best_config": config_text(best), "space_best_kernel": best.get("kernel"),
        "space_best_in_topn": best.get("rank") is not None if best else None,
        "topn_best_us": med.get(topn.get("name") or "topn_best"),
        "space_configs": cnt.get("valid"), "space_kernels": cnt.get("kernels"), "space_timed": cnt.get("timed"),
        "space_pruned": cnt.get("pruned"), "space_wrong": cnt.get("wrong"),
        "numerics_ok": pick.get("numerics_ok"), "pick_in_space": sp.get("pick_in_space"),
        "space_budget_s": sp.get("budget_s"), "space_elapsed_s": sp.get("elapsed_s"),
    })
    return out


def summary(df) -> dict:
    """The headline of a dataset with space columns: GEMMs (and per dtype), the regret distribution (quantiles
    over all, over the losses), labels, how often the space's best is outside the heuristic's top-N, configs
    timed and pruned, wrong configs and wrong picks. A dataset without them is a SchemaError naming the sweep
    that makes them."""
    from cublaslt_probe.errors import SchemaError
    if "space_regret" not in df.columns:
        raise SchemaError("this dataset has no space columns: sweep with `--space SECONDS` (docs/space.md)")
    d = df[df["space_regret"].notna()]
    if d.empty:
        raise SchemaError("no row of this dataset has a searched space: sweep lt-backend GEMMs with "
                          "`--space SECONDS` (docs/space.md)")
    r = d["space_regret"].astype(float) * 100
    lab = d["space_regret_label"].astype("string")
    loss = r[lab == "loss"]
    q = {f"p{int(x * 100)}": float(r.quantile(x)) for x in (0.5, 0.9, 0.99)}
    out = {"gemms": int(len(d)), "dtypes": {str(k): int(v) for k, v in d["dtype"].value_counts(sort=False)
                                            .sort_index().items()},
           "regret_pct": {**q, "max": float(r.max()), "mean": float(r.mean())},
           "labels": {k: int((lab == k).sum()) for k in LABELS},
           "loss_regret_pct": {"median": float(loss.median()), "max": float(loss.max())} if len(loss) else None,
           "best_outside_topn": int((d["space_best_in_topn"] == False).sum()),  # noqa: E712 (nullable)
           "configs_valid_median": float(d["space_configs"].astype(float).median()),
           "timed": int(d["space_timed"].sum()), "pruned": int(d["space_pruned"].sum()),
           "wrong_configs": int(d["space_wrong"].fillna(0).sum()),
           "wrong_picks": int((d["numerics_ok"] == False).sum())}  # noqa: E712
    return out


# Token classes: (class, the largest m it holds; None: no bound). An LLM layer's m is its token count; the
# classes part decode, small batches, prefill chunks and long prefills.
TOKEN_CLASSES = (("decode", 16), ("small", 256), ("mid", 2048), ("large", None))


def token_class(m: int) -> str:
    """The `TOKEN_CLASSES` class of a torch-view GEMM's m: decode (m ≤ 16), small (≤ 256), mid (≤ 2048), large."""
    for name, top in TOKEN_CLASSES:
        if top is None or m <= top:
            return name
    raise AssertionError("TOKEN_CLASSES ends with an unbounded class")


def token_range(name: str) -> str:
    """`m ≤ 16`, `17–256`, `> 2048`: the m a token class holds, as the tables write it."""
    lo = 1
    for cls, top in TOKEN_CLASSES:
        if cls == name:
            return f"m ≤ {top}" if lo == 1 else f"m > {lo - 1}" if top is None else f"{lo}–{top}"
        lo = (top or 0) + 1
    raise ValueError(f"unknown token class {name!r}: one of {[c for c, _ in TOKEN_CLASSES]}")


def shape_class(m: int, n: int, k: int) -> str:
    """A coarse class of a torch-view GEMM for the report: its `token_class` and the weight's aspect (n > k: up,
    n < k: down, square)."""
    tok = token_class(m)
    asp = "up" if n > k else "down" if n < k else "square"
    return f"{tok} {asp}"


def _searched(df):
    """The rows with a searched space, with their `token_class` (column `tokens`)."""
    d = df[df["space_regret"].notna()].copy()
    d["tokens"] = [token_class(int(m)) for m in d["m"]]
    return d


def by_class(df):
    """Regret by dtype and `shape_class`: GEMMs, losses, median and worst regret (%), best outside the top-N,
    median valid configs; sorted by the worst first."""
    import pandas as pd
    d = _searched(df)
    d["shape_class"] = [shape_class(int(a), int(b), int(c)) for a, b, c in zip(d["m"], d["n"], d["k"])]
    rows = []
    for (dt, cls), g in d.groupby(["dtype", "shape_class"], sort=True, observed=True):
        r = g["space_regret"].astype(float) * 100
        rows.append({"dtype": dt, "shape_class": cls, "gemms": len(g),
                     "losses": int((g["space_regret_label"] == "loss").sum()),
                     "median_regret_pct": float(r.median()), "worst_regret_pct": float(r.max()),
                     "best_outside_topn": int((g["space_best_in_topn"] == False).sum()),  # noqa: E712
                     "configs_valid": int(g["space_configs"].astype(float).median())
                     if g["space_configs"].notna().any() else None})
    return pd.DataFrame(rows).sort_values("worst_regret_pct", ascending=False, ignore_index=True) \
        if rows else pd.DataFrame(rows)


def _token_groups(d):
    """(dtype, token class or "all", its rows) in dtype order, the classes in `TOKEN_CLASSES` order, each dtype's
    rows together last ("all")."""
    order = [c for c, _ in TOKEN_CLASSES]
    for dt, g in d.groupby("dtype", sort=True, observed=True):
        for cls in order:
            part = g[g["tokens"] == cls]
            if len(part):
                yield dt, cls, part
        yield dt, "all", g


def _token_cols(dt, cls, g) -> dict:
    return {"dtype": dt, "tokens": cls if cls == "all" else f"{cls} ({token_range(cls)})",
            "m": ", ".join(str(v) for v in sorted(set(int(x) for x in g["m"]))), "gemms": len(g)}


def by_tokens(df):
    """The space's figures by dtype and `token_class` (and over each dtype, tokens "all"): GEMMs and their
    token counts (m), the regret's median, p90 and worst (%), the labels, the space's best outside the
    heuristic's top-N (count and %), the pick's noise floor (median %), the median of valid configs, distinct
    kernels, configs timed and pruned per GEMM. A dataset without space columns is `summary`'s SchemaError."""
    import pandas as pd
    summary(df)
    rows = []
    for dt, cls, g in _token_groups(_searched(df)):
        r = g["space_regret"].astype(float) * 100
        lab = g["space_regret_label"].astype("string")
        out = int((g["space_best_in_topn"] == False).sum())  # noqa: E712 (nullable)
        med = {c: g[c].dropna().astype(float).median() for c in ("space_configs", "space_kernels", "space_timed",
                                                                  "space_pruned")}
        med = {c: None if math.isnan(v) else int(v) for c, v in med.items()}
        rows.append({**_token_cols(dt, cls, g),
                     "regret_median_pct": float(r.median()), "regret_p90_pct": float(r.quantile(0.9)),
                     "regret_worst_pct": float(r.max()), **{k: int((lab == k).sum()) for k in LABELS},
                     "best_outside_topn": out, "best_outside_topn_pct": 100.0 * out / len(g),
                     "noise_median_pct": float(g["space_noise_pct"].astype(float).median()),
                     "configs_valid": med["space_configs"], "kernels": med["space_kernels"],
                     "timed": med["space_timed"], "pruned": med["space_pruned"]})
    return pd.DataFrame(rows)


def nvmmh_by_tokens(df):
    """nvMatmulHeuristics against the pick and the space's best by dtype and `token_class` (and "all" per
    dtype), over the rows it scored: its top-1 CTA tile = the pick's (`nvmmh_agrees`) and = the space best's
    (`nvmmh_space_agrees`), %; the median |ln(predicted / measured µs)| against the pick's time
    (`nvmmh_log_err`) and the space best's (`nvmmh_space_log_err`); the median predicted / pick's µs. None when
    the dataset has no `nvmmh_us` (scripts/capture_space_atlas.py `finish` adds the columns)."""
    import pandas as pd
    if "nvmmh_us" not in df.columns or df["nvmmh_us"].isna().all():
        return None
    d = _searched(df)
    d = d[d["nvmmh_us"].notna()]

    def pct(s):
        s = s.dropna()
        return 100.0 * float(s.astype(bool).mean()) if len(s) else None

    def med_abs(s):
        s = s.dropna().astype(float).abs()
        return float(s.median()) if len(s) else None

    def col(g, c):
        return g[c] if c in g.columns else pd.Series(dtype=float)
    rows = []
    for dt, cls, g in _token_groups(d):
        le = col(g, "nvmmh_log_err").dropna().astype(float)
        rows.append({**_token_cols(dt, cls, g),
                     "tile_is_pick_s_pct": pct(col(g, "nvmmh_agrees")),
                     "tile_is_space_best_s_pct": pct(col(g, "nvmmh_space_agrees")),
                     "median_abs_log_err_pick": med_abs(le),
                     "median_abs_log_err_space_best": med_abs(col(g, "nvmmh_space_log_err")),
                     "median_pred_over_pick": math.exp(float(le.median())) if len(le) else None})
    return pd.DataFrame(rows)
