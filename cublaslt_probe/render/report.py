"""One self-contained HTML page about a dataset: environment, coverage, maps, top kernels, cliffs, heuristic
cost, and whether the logged algo agrees with the kernel that ran.

`build_report(df, outdir)` writes ``outdir/index.html``; its PNG images are embedded as base64 ``data:`` URIs,
so the page is one file that can be mailed or attached to an issue. It computes, then renders:
`analyse(df)` builds every section as data (one function per section: numbers, DataFrames, figures still to
be drawn), `render_page` writes the HTML. The tables come from small functions here (`coverage`,
`top_kernels`, `find_cliffs`, `heuristic_summary`, `regret_summary`, `consistency_summary`, `path_summary`)
that return DataFrames, so a notebook can use them too. CPU only.
"""
from __future__ import annotations

import base64
import html
import io
import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from cublaslt_probe.errors import ProbeError
from cublaslt_probe.vocab import ORDER

log = logging.getLogger(__name__)

SECTIONS = [("environment", "Environment"), ("coverage", "Coverage"), ("maps", "Shape → kernel maps"),
            ("paths", "Path differences"), ("top-kernels", "Top kernels by share"), ("cliffs", "Cliffs"),
            ("heuristic", "Heuristic overhead"), ("consistency", "Consistency between log and kernel"),
            ("space", "The whole algo space")]
GROUP_KEYS = ["backend", "op", "dtype", "layout"]


def _ok(df: pd.DataFrame) -> pd.DataFrame:
    """Rows that ran (no error) and have a time."""
    d = df
    if "error" in d:
        d = d[d["error"].isna()]
    return d[d["tflops"].notna()] if "tflops" in d else d


def _sorted_groups(df: pd.DataFrame, keys) -> list[tuple]:
    from cublaslt_probe.render.plots.select import ordered
    g = df[keys].astype(str).drop_duplicates()
    orders = {k: ordered(g[k], k) for k in keys}
    rows = [tuple(r) for r in g.itertuples(index=False)]
    return sorted(rows, key=lambda r: tuple(orders[k].index(v) for k, v in zip(keys, r)))


def _range(s: pd.Series) -> str:
    s = s.dropna()
    if s.empty:
        return ""
    lo, hi, n = int(s.min()), int(s.max()), s.nunique()
    return f"{lo}" if lo == hi else f"{lo}…{hi} ({n})"


# ------------------------------------------------------------------------------------------------ tables
def coverage(df: pd.DataFrame) -> pd.DataFrame:
    """Rows, errors and shape ranges per backend × op × dtype × layout."""
    from cublaslt_probe.render.plots.select import require_columns
    require_columns(df, GROUP_KEYS + ["m", "n", "k"], "coverage")
    out = []
    for key in _sorted_groups(df, GROUP_KEYS):
        g = df[(df[GROUP_KEYS].astype(str) == list(key)).all(axis=1)]
        err = int(g["error"].notna().sum()) if "error" in g else 0
        out.append(dict(zip(GROUP_KEYS, key), rows=len(g), errors=err, m=_range(g["m"]), n=_range(g["n"]),
                        k=_range(g["k"]), kernels=int(g["kernel"].nunique()) if "kernel" in g else None))
    return pd.DataFrame(out)


def top_kernels(df: pd.DataFrame, n: int = 10, by: str = "dtype") -> pd.DataFrame:
    """The `n` kernel configurations chosen most often per `by` group.

    A configuration is the family plus the decoded short form (``256x128 · 64x4 · 1x2 · coopA``), so the
    same tile/stages/cluster counts once across the layout letters and type codes its names carry;
    ``names`` says how many distinct kernel names that covers. Share is of the group's rows that ran.
    """
    from cublaslt_probe.render.plots.select import ordered, require_columns
    from cublaslt_probe.render.plots.style import config_labels
    require_columns(df, ["kernel", "kernel_short", "family", by], "top kernels")
    d = df[df["kernel"].notna()]
    if "error" in d:
        d = d[d["error"].isna()]
    config = config_labels(d)
    d = d.assign(_config=config)
    out = []
    for gv in ordered(d[by].astype(str), by):
        g = d[d[by].astype(str) == gv]
        for conf, c in g["_config"].value_counts().head(n).items():
            rows = g[g["_config"] == conf]
            out.append({by: gv, "kernel": conf, "family": str(rows["family"].iloc[0]), "rows": int(c),
                        "share %": round(100 * c / len(g), 1), "names": int(rows["kernel"].nunique()),
                        "layouts": ", ".join(ordered(rows["layout"].astype(str), "layout")),
                        "backends": ", ".join(ordered(rows["backend"].astype(str), "backend")),
                        "median TFLOP/s": round(float(rows["tflops"].median()), 1) if "tflops" in rows else None})
    return pd.DataFrame(out)


CLIFF_KINDS = ("TFLOP/s falls", "time falls", "scaling")


def find_cliffs(df: pd.DataFrame, threshold: float = 0.2, all_pairs: bool = False) -> pd.DataFrame:
    """Neighbouring shapes whose TFLOP/s differ by more than `threshold` (of the larger), with the kernels on
    each side, sorted by the size of the change.

    Neighbours are adjacent measured values along one of m, n, k with everything else equal (backend, op,
    dtype, layout, batch and the other two dimensions); in a square sweep (m = n = k everywhere), adjacent
    sizes. Going from the smaller shape to the larger, a pair is

    - ``TFLOP/s falls``: the larger shape runs at > `threshold` fewer TFLOP/s;
    - ``time falls``: the larger shape takes > `threshold` less *time* -- the smaller one is the anomaly;
    - ``scaling``: TFLOP/s rises by more than `threshold` but time does not fall: what more work per launch
      does to a latency- or memory-bound GEMM. Not a cliff; returned only with ``all_pairs=True``.
    """
    from cublaslt_probe.render.plots.select import require_columns
    from cublaslt_probe.render.plots.style import config_labels
    require_columns(df, GROUP_KEYS + ["m", "n", "k", "tflops", "kernel"], "cliffs")
    d = _ok(df).copy()
    if "batch" not in d:
        d["batch"] = 1
    for c in GROUP_KEYS:
        d[c] = d[c].astype(str)
    square = len(d) > 0 and bool(((d["m"] == d["n"]) & (d["n"] == d["k"])).all())
    dims = [("m=n=k", "m")] if square else [("m", "m"), ("n", "n"), ("k", "k")]
    d["_short"] = config_labels(d)
    d["_kernel"] = d["kernel"].astype(str)
    flops = 2.0 * d["m"].astype(float) * d["n"].astype(float) * d["k"].astype(float) * d["batch"].astype(float)
    d["_time"] = flops / d["tflops"].astype(float) / 1e6   # µs, consistent with tflops
    frames = []
    for name, dim in dims:
        others = [] if square else [c for c in ("m", "n", "k") if c != dim]
        keys = GROUP_KEYS + ["batch"] + others
        g = d.sort_values(keys + [dim], kind="stable").reset_index(drop=True)
        nxt = g.shift(-1)
        same = np.ones(len(g), dtype=bool)
        for c in keys:
            same &= g[c].astype(str).to_numpy() == g[c].astype(str).shift(-1).to_numpy()
        t1, t2 = g["tflops"].astype(float), nxt["tflops"].astype(float)
        differ = (t2 - t1).abs() / np.maximum(t1, t2) > threshold
        falls = t2 < t1
        time_falls = nxt["_time"].astype(float) < (1 - threshold) * g["_time"].astype(float)
        kind = np.where(falls, CLIFF_KINDS[0], np.where(time_falls, CLIFF_KINDS[1], CLIFF_KINDS[2]))
        hit = pd.Series(same, index=g.index) & differ
        if not all_pairs:
            hit &= kind != CLIFF_KINDS[2]
        if not hit.any():
            continue
        r, q = g[hit], nxt[hit]
        fixed = ([", ".join(f"{c}={int(x)}" for c, x in zip(others, vals))
                  for vals in r[others].itertuples(index=False)] if others else [""] * len(r))
        frames.append(pd.DataFrame({
            "backend": r["backend"], "op": r["op"], "dtype": r["dtype"], "layout": r["layout"], "axis": name,
            "fixed": fixed, "from": r[dim].astype(int), "to": q[dim].astype(int),
            "TFLOP/s from": t1[hit].round(1), "TFLOP/s to": t2[hit].round(1),
            "change %": (100 * (t2[hit] / t1[hit] - 1)).round(1), "kernel from": r["_short"],
            "kernel to": q["_short"], "kernel changed": r["_kernel"] != q["_kernel"], "kind": kind[hit.to_numpy()]}))
    cols = ["backend", "op", "dtype", "layout", "axis", "fixed", "from", "to", "TFLOP/s from", "TFLOP/s to",
            "change %", "kernel from", "kernel to", "kernel changed", "kind"]
    res = pd.concat(frames, ignore_index=True)[cols] if frames else pd.DataFrame(columns=cols)
    # sort by the size of the jump on a log scale, so a halving ranks with a doubling
    size = np.abs(np.log(1 + res["change %"].astype(float) / 100)) if len(res) else res["change %"]
    return res.reindex(size.sort_values(ascending=False, kind="stable").index).reset_index(drop=True)


def heuristic_summary(df: pd.DataFrame, by: str = "dtype") -> pd.DataFrame:
    """Heuristic miss/hit host µs per `by` group, against the GEMM time itself."""
    from cublaslt_probe.render.plots.select import ordered, require_columns
    require_columns(df, ["heuristic_miss_us", "heuristic_hit_us", "time_us", by], "the heuristic summary")
    d = df.dropna(subset=["heuristic_miss_us"])
    out = []
    groups = [(gv, d[d[by].astype(str) == gv]) for gv in ordered(d[by].astype(str), by)] + [("all", d)]
    for gv, g in groups:
        miss, hit, t = g["heuristic_miss_us"], g["heuristic_hit_us"], g["time_us"]
        ratio = (miss / t).replace([np.inf, -np.inf], np.nan).dropna()
        out.append({by: gv, "GEMMs": len(g), "miss median µs": round(float(miss.median()), 1),
                    "miss p10–p90 µs": f"{miss.quantile(.1):.0f}–{miss.quantile(.9):.0f}",
                    "hit median µs": round(float(hit.median()), 1),
                    "miss / hit": round(float(miss.median() / hit.median()), 1) if hit.median() else None,
                    "GEMM median µs": round(float(t.median()), 1),
                    "miss / GEMM (median)": round(float(ratio.median()), 2) if len(ratio) else None,
                    "miss > GEMM %": round(100 * float((miss > t)[t.notna()].mean()), 1) if t.notna().any() else None})
    return pd.DataFrame(out)


def regret_summary(df: pd.DataFrame, by: str = "dtype") -> pd.DataFrame:
    """Regret (time of the chosen kernel over the fastest heuristic candidate, %) per `by` group, for rows
    swept with candidates; empty when there are none."""
    if "regret_pct" not in df or df["regret_pct"].isna().all():
        return pd.DataFrame()
    from cublaslt_probe.render.plots.select import ordered
    d = df[df["regret_pct"].notna()]
    out = []
    for gv, g in [(gv, d[d[by].astype(str) == gv]) for gv in ordered(d[by].astype(str), by)] + [("all", d)]:
        r = g["regret_pct"].astype(float)
        row = {by: gv, "GEMMs": len(g), "median %": round(float(r.median()), 1),
               "p90 %": round(float(r.quantile(0.9)), 1), "worst %": round(float(r.max()), 1),
               "> 5 %": int((r > 5).sum())}
        if "best_rank" in g:
            row["chosen was best %"] = round(100 * float((g["best_rank"] == 0).mean()), 1)
        out.append(row)
    return pd.DataFrame(out)


def consistency_summary(df: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(counts of consistent true/false/not comparable per backend × family, the inconsistent rows)."""
    from cublaslt_probe.render.plots.select import require_columns
    require_columns(df, ["consistent", "backend", "family"], "the consistency summary")
    d = df[df["error"].isna()] if "error" in df else df
    state = d["consistent"].astype("boolean").map({True: "agree", False: "disagree"}).astype(object)
    state = state.where(d["consistent"].notna(), "not comparable")
    t = pd.crosstab([d["backend"].astype(str), d["family"].astype(str).replace("<NA>", "none")], state)
    for c in ("agree", "disagree", "not comparable"):
        if c not in t:
            t[c] = 0
    t = t[["agree", "disagree", "not comparable"]].reset_index()
    t.columns.name = None      # the crosstab's axis name would render as an empty header column
    cols = [c for c in ("key", "kernel_short", "algo_tile", "algo_stages", "algo_cluster", "algo_split_k",
                        "log_function") if c in d]
    bad = d[d["consistent"].astype("boolean").fillna(True) == False][cols]  # noqa: E712  elementwise (pandas)
    return t, bad.reset_index(drop=True)


def path_summary(df: pd.DataFrame, a: str = "torch", b: str = "torch-lt") -> pd.DataFrame:
    """Per op × dtype × layout: GEMMs both backends ran, how many chose different kernels, and the median
    TFLOP/s change of `b` against `a` where they did."""
    from cublaslt_probe.render.plots.maps import pathdiff_table
    from cublaslt_probe.render.plots.select import require_columns
    require_columns(df, ["backend", "op", "dtype", "layout", "m", "n", "k", "batch", "kernel", "tflops"],
                    "the path summary")
    bk = set(df["backend"].astype(str))
    if a not in bk or b not in bk:
        return pd.DataFrame()
    d = _ok(df)
    keys = ["op", "dtype", "layout", "m", "n", "k", "batch"]
    ja = d[d["backend"].astype(str) == a][keys + ["kernel"]]
    jb = d[d["backend"].astype(str) == b][keys + ["kernel"]]
    both = ja.merge(jb, on=keys)
    diff = pathdiff_table(d, a, b)
    out = []
    for key in _sorted_groups(both, ["op", "dtype", "layout"]):
        g = both[(both[["op", "dtype", "layout"]].astype(str) == list(key)).all(axis=1)]
        gd = diff[(diff[["op", "dtype", "layout"]].astype(str) == list(key)).all(axis=1)]
        ch = 100 * (gd[f"tflops_{b}"] / gd[f"tflops_{a}"] - 1)
        out.append({"op": key[0], "dtype": key[1], "layout": key[2], "GEMMs": len(g), "different kernels": len(gd),
                    "share %": round(100 * len(gd) / len(g), 1) if len(g) else 0.0,
                    f"{b} faster": int((ch > 0).sum()), f"{b} slower": int((ch < 0).sum()),
                    "median change %": round(float(ch.median()), 1) if len(ch) else None})
    return pd.DataFrame(out)


# ------------------------------------------------------------------------------------------------ the page
_CSS = """
body { font-family: system-ui, -apple-system, Segoe UI, sans-serif; margin: 2em auto; max-width: 1500px;
       padding: 0 1.5em; color: #222; line-height: 1.45; }
h1 { font-size: 1.6em; margin-bottom: 0.2em; } h2 { border-bottom: 1px solid #ddd; padding-bottom: 0.2em;
margin-top: 2em; } h3 { margin-top: 1.6em; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.6em 0; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: left; vertical-align: top; }
td, li, p { overflow-wrap: anywhere; }
th { background: #f4f4f4; } td.num, th.num { text-align: right; }
img { max-width: 100%; height: auto; border: 1px solid #eee; margin: 0.4em 0; }
.figs { display: flex; flex-wrap: wrap; gap: 1em; align-items: flex-start; }
.figs figure { margin: 0; } .note { color: #555; font-size: 0.9em; } .error { color: #a00; }
nav ul { columns: 2; } code { background: #f6f6f6; padding: 0 3px; }
"""


def _table(df: pd.DataFrame, max_rows: int | None = None) -> str:
    if df is None or df.empty:
        return '<p class="note">(none)</p>'
    shown = _yes_no(df if max_rows is None else df.head(max_rows))
    out = shown.to_html(index=False, escape=True, border=0, na_rep="", float_format=lambda v: f"{v:g}")
    if max_rows is not None and len(df) > max_rows:
        out += f'<p class="note">showing {max_rows} of {len(df)} rows</p>'
    return out


def _word(v):
    """A cell's value as the tool's tables write it: booleans as yes / no, a missing value as nothing (never
    Python's True, False or None)."""
    if isinstance(v, (bool, np.bool_)):
        return "yes" if v else "no"
    return "" if v is None else v


def _yes_no(df: pd.DataFrame) -> pd.DataFrame:
    """`df` with its boolean and object columns' cells as `_word` writes them."""
    cols = [c for c in df.columns if df[c].dtype == bool or df[c].dtype == object]
    if not cols:
        return df
    out = df.copy()
    for c in cols:
        out[c] = out[c].map(_word)
    return out


def _img(fig, alt: str, dpi: int) -> str:
    """The figure as an embedded PNG, quantised to 256 colours (a third of the size; the plots use few)."""
    from PIL import Image  # matplotlib depends on Pillow
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    im = Image.open(io.BytesIO(buf.getvalue())).convert("RGB").quantize(colors=256,
                                                                        method=Image.Quantize.MEDIANCUT)
    buf = io.BytesIO()
    im.save(buf, format="PNG", optimize=True)
    data = base64.b64encode(buf.getvalue()).decode("ascii")
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


# ------------------------------------------------------------------------------------------------ the analysis
# `analyse` computes every section as plain data: numbers, DataFrames, and `Figure`s still to be drawn (a
# figure is drawn while the page is rendered, one progress step each). `render_page` turns it into HTML.
@dataclass
class Figure:
    """A figure of the page: the progress step that draws it, how to draw it, its alt text."""

    step: str
    make: Callable[[], object]
    alt: str


@dataclass
class Analysis:
    """What the report says about a dataset, section by section (`SECTIONS`), before any HTML."""

    head: dict
    sections: dict[str, dict] = field(default_factory=dict)

    def figures(self) -> list[Figure]:
        out: list[Figure] = []
        for s in self.sections.values():
            out += [f for f in s.get("figures", []) if isinstance(f, Figure)]
        return out


def map_groups(df: pd.DataFrame) -> list[tuple[str, str, str]]:
    """(dtype, layout, op) combinations to map, in display order."""
    return [tuple(g) for g in _sorted_groups(df, ["dtype", "layout", "op"])]


def analyse(df: pd.DataFrame, *, backend: str | None = None, max_cliffs: int = 40) -> Analysis:
    """Every section of the report as data (see `Analysis`); raises when the dataset cannot be reported."""
    from cublaslt_probe.render import plots
    from cublaslt_probe.render.plots.select import env_of, require_columns
    from cublaslt_probe.render.plots.style import title_head

    require_columns(df, GROUP_KEYS + ["m", "n", "k", "kernel", "tflops"], "the report")
    if df.empty:
        raise ProbeError("the dataset is empty: nothing to report")
    env = env_of(df)
    x, y = plots.auto_axes(df)
    names = set(df["backend"].astype(str))
    backends = [b for b in ORDER["backend"] if b in names] or sorted(names)
    ctx = {"x": x, "y": y, "square": y == "backend", "backends": backends}
    a = Analysis({"title": title_head(env), "source": str(df.attrs.get("source", "")), "rows": len(df)})
    a.sections = {"environment": {"env": env}, "coverage": _coverage_section(df, backends),
                  "maps": _maps_section(df, ctx, backend, env), "paths": _paths_section(df, ctx),
                  "top-kernels": _top_kernels_section(df), "cliffs": _cliffs_section(df, max_cliffs),
                  "heuristic": _heuristic_section(df, ctx), "consistency": _consistency_section(df),
                  "space": space_section(df)}
    return a


def _coverage_section(df: pd.DataFrame, backends: list[str]) -> dict:
    n_err = int(df["error"].notna().sum()) if "error" in df else 0
    errors = None
    if n_err:
        errs = df[df["error"].notna()]
        e = errs.assign(error=errs["error"].astype(str).str.slice(0, 160))
        errors = (e.groupby("error", sort=False)
                  .agg(rows=("key", "size"), backends=("backend", lambda s: ", ".join(sorted(set(map(str, s))))),
                       example=("key", "first"))
                  .reset_index().sort_values("rows", ascending=False)[["rows", "backends", "example", "error"]])
    return {"rows": len(df), "shapes": len(df[["m", "n", "k"]].drop_duplicates()), "m": _range(df["m"]),
            "n": _range(df["n"]), "k": _range(df["k"]), "errors": n_err, "backends": backends,
            "table": coverage(df), "error_table": errors}


def _maps_section(df: pd.DataFrame, ctx: dict, backend: str | None, env: dict) -> dict:
    from cublaslt_probe.render import plots
    x, y, square, backends = ctx["x"], ctx["y"], ctx["square"], ctx["backends"]
    names = set(df["backend"].astype(str))
    map_bk = backend or ("torch" if "torch" in names else backends[0])
    groups = []
    for dt, lay, op in map_groups(df):
        kw = dict(dtype=dt, layout=lay, op=op)
        if not square:
            sub = df[(df["dtype"].astype(str) == dt) & (df["layout"].astype(str) == lay) & (df["op"].astype(str) == op)]
            bks = set(sub["backend"].astype(str))
            kw["backend"] = map_bk if map_bk in bks else next(b for b in backends if b in bks)
        label = f"{dt} {lay} {op}" + ("" if square else f" · {kw['backend']}")
        groups.append({"label": label, "anchor": f"map-{dt}-{lay}-{op}", "figures": [
            Figure(f"kernel map {label}", lambda kw=kw: plots.kernel_map(df, x, y, **kw), f"kernel map {label}"),
            Figure(f"TFLOP/s map {label}", lambda kw=kw: plots.tflops_map(df, x, y, **kw), f"TFLOP/s {label}")]})
    return {"x": x, "y": y, "square": square, "backend": map_bk, "peak_source": plots.peak_source(env.get("gpu")),
            "groups": groups, "figures": [f for g in groups for f in g["figures"]]}


def _paths_section(df: pd.DataFrame, ctx: dict) -> dict:
    from cublaslt_probe.render import plots
    names = set(df["backend"].astype(str))
    if not ("torch" in names and "torch-lt" in names):
        return {"table": None, "error": None, "figures": []}
    ps, err = _safe(lambda: path_summary(df), "path differences")
    if ps is None or ps.empty:
        return {"table": None, "error": err, "figures": []}
    x, y, square = ctx["x"], ctx["y"], ctx["square"]
    differ = ps[ps["different kernels"] > 0]
    # square sweeps: one figure per dtype × op with the layouts as rows; else one per dtype × layout × op
    cols = ["dtype", "op"] if square else ["dtype", "layout", "op"]
    groups = []
    for g in dict.fromkeys(tuple(r) for r in differ[cols].itertuples(index=False)):
        kw = dict(zip(cols, g))
        label = " ".join(g)
        groups.append({"label": label, "figure": Figure(f"path difference {label}", lambda kw=kw: plots.pathdiff_map(
            df, None, x, "layout" if square else y, a="torch", b="torch-lt", **kw), f"path difference {label}")})
    return {"table": ps, "error": None, "groups": groups, "figures": [g["figure"] for g in groups]}


def _top_kernels_section(df: pd.DataFrame) -> dict:
    tk, err = _safe(lambda: top_kernels(df, n=8), "top kernels")
    return {"table": tk, "error": err}


def _cliffs_section(df: pd.DataFrame, max_cliffs: int) -> dict:
    cl = find_cliffs(df)
    out = {"pairs": len(find_cliffs(df, all_pairs=True)), "cliffs": cl, "max": max_cliffs}
    if not cl.empty:
        out["changed"] = int(cl["kernel changed"].sum())
        out["by"] = cl.groupby(["dtype", "kind"]).size().rename("cliffs").reset_index()
    return out


def _heuristic_section(df: pd.DataFrame, ctx: dict) -> dict:
    """Heuristic miss/hit cost, and the regret of the heuristic's pick where the dataset has candidates."""
    from cublaslt_probe.render import plots
    has = "heuristic_miss_us" in df and df["heuristic_miss_us"].notna().any()
    out: dict = {"measured": bool(has), "table": None, "error": None, "figures": [], "regret": None}
    if has:
        out["table"], out["error"] = _safe(lambda: heuristic_summary(df), "heuristic summary")
        out["figures"].append(Figure("heuristic plot", lambda: plots.heuristic_plot(df, x="m"), "heuristic cost"))
    rs = regret_summary(df)
    if not rs.empty:
        x, y = ctx["x"], ctx["y"]
        regret_figs = [Figure(f"regret map {dt} {lay} {op}",
                              lambda kw=dict(dtype=dt, layout=lay, op=op): plots.regret_map(df, x, y, **kw),
                              f"regret {dt} {lay} {op}")
                       for dt, lay, op in map_groups(df[df["regret_pct"].notna()])]
        out["regret"] = {"table": rs, "figures": regret_figs}
        out["figures"] += regret_figs
    return out


REGRET_BINS = [0.0, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, math.inf]


def space_section(df: pd.DataFrame) -> dict:
    """The whole-space section (datasets swept with `--space`): the headline (`analysis.space.summary`), the
    figures by dtype and token class (`analysis.space.by_tokens`), the regret distribution by dtype and label
    (bins of %), the shape classes worst first (`analysis.space.by_class`), the largest losses, and
    nvMatmulHeuristics against the pick and the space's best by dtype and token class
    (`analysis.space.nvmmh_by_tokens`) where its columns are there (scripts/capture_space_atlas.py adds them).
    {"present": False} without space columns."""
    from cublaslt_probe.analysis import space as sm
    if "space_regret" not in df.columns or df["space_regret"].isna().all():
        return {"present": False}
    d = df[df["space_regret"].notna()].copy()
    d["regret %"] = d["space_regret"].astype(float) * 100
    cut = pd.cut(d["regret %"], REGRET_BINS, right=False,
                 labels=[f"[{a:g}, {b:g})" for a, b in zip(REGRET_BINS, REGRET_BINS[1:])])
    label = d["space_regret_label"].astype(str)
    if d["dtype"].nunique() > 1:
        label = d["dtype"].astype(str) + ": " + label
    dist = (d.assign(bin=cut, label=label)
            .pivot_table(index="bin", columns="label", values="key", aggfunc="size", fill_value=0, observed=False)
            .reset_index().rename(columns={"bin": "regret %"}))
    dist.columns.name = None
    worst = d.sort_values("regret %", ascending=False).head(15)
    worst = pd.DataFrame({"GEMM (m×n×k)": [f"{a}×{b}×{c}" for a, b, c in zip(worst["m"], worst["n"], worst["k"])],
                          "dtype": worst["dtype"].astype(str),
                          "pick": worst["kernel"].astype(str), "pick µs": worst["space_pick_us"].round(2),
                          "space best": worst["space_best_config"].astype(str),
                          "best kernel": worst["space_best_kernel"].astype(str),
                          "best µs": worst["space_best_us"].round(2), "regret %": worst["regret %"].round(1),
                          "label": worst["space_regret_label"].astype(str),
                          "noise %": worst["space_noise_pct"].round(1),
                          "in top-N": worst["space_best_in_topn"].astype(object)})
    tok = sm.by_tokens(df)
    tok = tok.round({c: 1 for c in tok.columns if c.endswith("_pct")})
    nv = sm.nvmmh_by_tokens(df)
    if nv is not None:
        nv = nv.round({c: (1 if c.endswith("_pct") else 3 if "log_err" in c else 2)
                       for c in nv.columns if nv[c].dtype == float})
    cls = sm.by_class(df)
    cls = cls.round({c: 1 for c in cls.columns if c.endswith("_pct")})
    return {"present": True, "summary": sm.summary(df), "tokens": tok, "dist": dist, "classes": cls,
            "worst": worst, "nvmmh": nv}


def _consistency_section(df: pd.DataFrame) -> dict:
    res, err = _safe(lambda: consistency_summary(df), "consistency")
    ct, bad = res if res else (pd.DataFrame(columns=["agree", "disagree", "not comparable"]), pd.DataFrame())
    return {"error": err, "table": ct, "disagreements": bad,
            **{k: int(ct[c].sum()) for k, c in (("agree", "agree"), ("disagree", "disagree"),
                                                  ("not_comparable", "not comparable"))}}


def _safe(make, what: str):
    """(result, None) or (None, "what: why") -- one missing column must not stop the whole report."""
    try:
        return make(), None
    except ProbeError as e:
        return None, f"{what}: {e}"


# ------------------------------------------------------------------------------------------------ the page
def build_report(df: pd.DataFrame, outdir: str | os.PathLike, progress: Callable[[str], None] | None = None, *,
                 backend: str | None = None, dpi: int = 90, max_cliffs: int = 40) -> Path:
    """Write the page (images embedded as base64 PNG) to `outdir` when it names an ``.html`` file, else to
    ``outdir/index.html``, and return its path.

    `progress` gets one line per step (``[3/29] kernel map bf16 NT mm``). Maps use `backend` (default:
    torch when present) and the dataset's natural axes (`plots.auto_axes`); a map that cannot be drawn
    shows its error in place instead of stopping the report.
    """
    t0 = time.perf_counter()
    a = analyse(df, backend=backend, max_cliffs=max_cliffs)
    out = Path(outdir)
    path = out if out.suffix.lower() == ".html" else out / "index.html"
    path.parent.mkdir(parents=True, exist_ok=True)
    page = render_page(a, _Steps(len(_STEP_SECTIONS) + len(a.figures()), progress), dpi, t0)
    path.write_text(page, encoding="utf-8")
    log.info("report: wrote %s (%.1f MB) in %.1f s", path, path.stat().st_size / 1e6, time.perf_counter() - t0)
    return path


class _Steps:
    def __init__(self, total: int, progress: Callable[[str], None] | None):
        self.i, self.total, self.progress = 0, total, progress

    def __call__(self, msg: str) -> None:
        self.i += 1
        line = f"[{self.i}/{self.total}] {msg}"
        log.info(line)
        if self.progress:
            self.progress(line)


def render_page(a: Analysis, steps: _Steps, dpi: int = 90, t0: float | None = None) -> str:
    """The HTML page of an analysis; draws its figures (one progress step each)."""
    t0 = time.perf_counter() if t0 is None else t0
    h = a.head
    parts = [f"<h1>cublaslt-probe report — {html.escape(h['title'])}</h1>",
             f'<p class="note">dataset {html.escape(h["source"])}: {h["rows"]:,} rows; generated '
             f'{time.strftime("%Y-%m-%d %H:%M")} by <code>cublaslt-probe report</code>. Images are embedded '
             f'PNGs.</p>',
             "<nav><ul>" + "".join(f'<li><a href="#{x}">{html.escape(t)}</a></li>' for x, t in SECTIONS)
             + "</ul></nav>"]
    for anchor, _ in SECTIONS:
        if anchor in _STEP_SECTIONS:
            steps(_STEP_SECTIONS[anchor])
        body = _RENDER[anchor](a.sections[anchor], lambda f: _draw(steps, f, dpi))
        parts.append(_section(anchor, body))
    return ("<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>cublaslt-probe report — "
            f"{html.escape(h['title'])}</title><style>{_CSS}</style></head><body>" + "\n".join(parts)
            + f'<p class="note">built in {time.perf_counter() - t0:.1f} s</p></body></html>\n')


def _draw(steps: _Steps, f: Figure, dpi: int) -> str:
    steps(f.step)
    try:
        fig = f.make()
    except ProbeError as e:
        return _error(f"{f.step}: {e}")
    return _img(fig, f.alt, dpi)


def _error(text: str | None) -> str:
    return f'<p class="error">{html.escape(text)}</p>' if text else ""


def _render_environment(s: dict, draw) -> str:
    return _table(pd.DataFrame([{"field": k, "value": str(_word(v))} for k, v in s["env"].items()]))


def _render_coverage(s: dict, draw) -> str:
    out = (f"<p>{s['rows']:,} GEMMs over {s['shapes']:,} distinct shapes (m {s['m']}, n {s['n']}, k {s['k']}); "
           f"{s['errors']} rows did not run (error). Backends: {', '.join(s['backends'])}.</p>" + _table(s["table"]))
    if s["error_table"] is not None:
        out += "<h3>Rows that did not run</h3>" + _table(s["error_table"], 20)
    return out


def _render_maps(s: dict, draw) -> str:
    out = [f'<p class="note">Axes: x = {html.escape(s["x"])}, y = {html.escape(s["y"])} '
           + ("(square sweep: every backend in one map)" if s["square"] else f"(backend {html.escape(s['backend'])})")
           + ". Each colour is one kernel, numbered in the legend in the order it first appears from left "
           "to right; black lines mark where the choice changes; hatched cells did not run. The TFLOP/s "
           "map that follows it draws the same boundaries as white lines with a black edge. "
           f"Peaks: {html.escape(s['peak_source'])}.</p>"]
    for g in s["groups"]:
        kernel, tflops = (draw(f) for f in g["figures"])
        out.append(f'<h3 id="{g["anchor"]}">{html.escape(g["label"])}</h3><div class="figs"><figure>{kernel}'
                   f'</figure><figure>{tflops}</figure></div>')
    return "".join(out)


def _render_paths(s: dict, draw) -> str:
    if s["table"] is None:
        return _error(s["error"]) or '<p class="note">The dataset does not have both torch and torch-lt rows.</p>'
    out = ["<p>Where torch's cuBLAS path (<code>torch</code>) and its cuBLASLt path (<code>torch-lt</code>) ran "
           "the same GEMM with different kernels (they ask the heuristic with different workspace limits). "
           "Change: TFLOP/s of torch-lt against torch where the kernels differ.</p>", _table(s["table"])]
    for g in s["groups"]:
        out.append(f"<h3>{html.escape(g['label'])}</h3>")
        out.append(draw(g["figure"]))
    return "".join(out)


def _render_top_kernels(s: dict, draw) -> str:
    return _error(s["error"]) or (
        "<p>The kernel configurations chosen most often per dtype, over every backend, op, layout "
        "and shape of the dataset (share of that dtype's rows that ran). A configuration is family + "
        "decoded tile · K-tile×stages · cluster · flags; <i>names</i> counts the kernel names it "
        "covers (layout letters, type codes).</p>" + _table(s["table"]))


def _render_cliffs(s: dict, draw) -> str:
    cl, n_pairs = s["cliffs"], s["pairs"]
    if cl.empty:
        return (f"<p>No cliffs: of {n_pairs} neighbouring pairs whose TFLOP/s differ by more than 20 %, none has "
                "the larger shape running at fewer TFLOP/s or in less time.</p>")
    n_changed = s["changed"]
    return (f"<p>Neighbouring shapes (same backend, op, dtype, layout; one dimension steps to the next "
            f"measured value) whose TFLOP/s differ by more than 20 % of the larger: {n_pairs:,} pairs. Most "
            f"are <i>scaling</i> -- a larger latency- or memory-bound GEMM does more work in the same time. "
            f"The {len(cl):,} cliffs below are the pairs that scaling does not explain: "
            f"<b>TFLOP/s falls</b> (the larger shape runs at more than 20 % fewer TFLOP/s) or <b>time "
            f"falls</b> (the larger shape finishes in more than 20 % less time, so the smaller one is the "
            f"anomaly). The kernel changes across {n_changed:,} of them ({100 * n_changed / len(cl):.0f} %); "
            f"sorted by the size of the change (log scale). <code>change %</code> is TFLOP/s of "
            f"<i>to</i> against <i>from</i>.</p>" + _table(s["by"])
            + f"<h3>The {min(s['max'], len(cl))} largest</h3>" + _table(cl, s["max"]))


def _render_heuristic(s: dict, draw) -> str:
    out = ("<p>Host time of <code>cublasLtMatmulAlgoGetHeuristic</code> with the heuristics cache off (miss) and "
           "warm (hit), against the GEMM's own time. A miss is paid once per new problem per process; torch's Lt "
           "path asks again on each call and relies on cuBLASLt's cache.</p>")
    if s["measured"]:
        out += (_error(s["error"]) or _table(s["table"])) + draw(s["figures"][0])
    else:
        out += _table(None) + '<p class="note">The dataset has no heuristic times.</p>'
    r = s["regret"]
    if r is not None:
        out += ("<h3>Regret: the chosen kernel against the fastest heuristic candidate</h3><p>For GEMMs swept "
                "with candidates: how much longer the heuristic's first choice ran than the fastest candidate "
                "that ran correctly.</p>" + _table(r["table"]) + "".join(draw(f) for f in r["figures"]))
    return out


def _render_space(s: dict, draw) -> str:
    if not s["present"]:
        return ('<p class="note">The dataset has no whole-space search: sweep with <code>--space SECONDS</code> '
                "(docs/space.md).</p>")
    sm = s["summary"]
    r, lab = sm["regret_pct"], sm["labels"]
    dts = ", ".join(f"{k} {v:,}" for k, v in sm["dtypes"].items())
    out = [f"<p>For {sm['gemms']} GEMMs ({dts}) the whole algo space was searched (every valid config of every algo "
           f"id; median {sm['configs_valid_median']:,.0f} valid configs per GEMM; {sm['timed']:,} configs timed, "
           f"{sm['pruned']:,} of them pruned after one sample). The heuristic's pick against the space's best "
           f"correct config, both timed in interleaved rounds: regret median {r['p50']:.1f} %, p90 {r['p90']:.1f} %, "
           f"worst {r['max']:.1f} %. <b>{lab['loss']}</b> losses beyond noise, {lab['within noise']} within noise, "
           f"{lab['pick is best']} where the pick is the best. The space's best is outside the heuristic's top-N "
           f"on {sm['best_outside_topn']} GEMMs. Wrong answers: {sm['wrong_configs']} configs timed, "
           f"{sm['wrong_picks']} heuristic picks.</p>",
           "<h3>By dtype and token count</h3><p>Regret (%) and labels, the space's best outside the heuristic's "
           "top-N, the pick's noise floor, and per GEMM (median) the valid configs, distinct kernels, configs "
           "timed and pruned; m is the GEMM's token count.</p>", _table(s["tokens"]),
           "<h3>Regret distribution</h3>", _table(s["dist"]),
           "<h3>Shape classes, worst first</h3>", _table(s["classes"]),
           "<h3>The largest regrets</h3>", _table(s["worst"])]
    if s["nvmmh"] is not None:
        out += ["<h3>nvMatmulHeuristics</h3><p>Its top-1 config (CUTLASS 3 target) against cuBLASLt's pick and "
                "the space's best, by dtype and token count: CTA-tile agreement and the error of its predicted time "
                "(|ln(predicted / measured µs)|).</p>", _table(s["nvmmh"])]
    return "".join(out)


def _render_consistency(s: dict, draw) -> str:
    if s["error"]:
        out = _error(s["error"])
    else:
        out = (f"<p>Does the kernel that ran (decoded from its name) agree with the algo cuBLASLt logged "
               f"for the call, on tile, cluster and split-K? {s['agree']:,} agree, {s['disagree']:,} disagree, "
               f"{s['not_comparable']:,} not comparable (no trace line -- e.g. gemv kernels -- or nothing both "
               "sides state).</p>" + _table(s["table"]))
    if s["disagree"]:
        out += "<h3>Disagreements</h3>" + _table(s["disagreements"], 30)
    return out


_RENDER = {"environment": _render_environment, "coverage": _render_coverage, "maps": _render_maps,
           "paths": _render_paths, "top-kernels": _render_top_kernels, "cliffs": _render_cliffs,
           "heuristic": _render_heuristic, "consistency": _render_consistency, "space": _render_space}
# The sections whose rendering is a progress step of its own (besides one step per figure).
_STEP_SECTIONS = {"environment": "environment and coverage", "top-kernels": "top kernels", "cliffs": "cliffs",
                  "heuristic": "heuristic overhead", "consistency": "consistency"}


def _section(anchor: str, body: str) -> str:
    title = dict(SECTIONS)[anchor]
    return f'<section id="{anchor}"><h2>{html.escape(title)}</h2>\n{body}\n</section>'
