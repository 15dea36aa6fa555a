"""One self-contained HTML page about a dataset: environment, coverage, maps, top kernels, cliffs, heuristic
cost, and whether the logged algo agrees with the kernel that ran.

`build_report(df, outdir)` writes ``outdir/index.html``; its PNG images are embedded as base64 ``data:`` URIs,
so the page is one file that can be mailed or attached to an issue. The tables come from small functions
here (`coverage`, `top_kernels`, `find_cliffs`, `heuristic_summary`, `consistency_summary`,
`path_summary`) that return DataFrames, so a notebook can use them too. CPU only.
"""
from __future__ import annotations

import base64
import html
import io
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from cublaslt_probe.errors import ProbeError
from cublaslt_probe.kinds import ORDER

log = logging.getLogger(__name__)

SECTIONS = [("environment", "Environment"), ("coverage", "Coverage"), ("maps", "Shape → kernel maps"),
            ("paths", "Path differences"), ("top-kernels", "Top kernels by share"), ("cliffs", "Cliffs"),
            ("heuristic", "Heuristic overhead"), ("consistency", "Consistency between log and kernel")]
GROUP_KEYS = ["backend", "op", "dtype", "layout"]


def _ok(df: pd.DataFrame) -> pd.DataFrame:
    """Rows that ran (no error) and have a time."""
    d = df
    if "error" in d:
        d = d[d["error"].isna()]
    return d[d["tflops"].notna()] if "tflops" in d else d


def _sorted_groups(df: pd.DataFrame, keys) -> list[tuple]:
    from cublaslt_probe.plots.select import ordered
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
    from cublaslt_probe.plots.select import require_columns
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
    from cublaslt_probe.plots.select import ordered, require_columns
    from cublaslt_probe.plots.style import config_labels
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
    from cublaslt_probe.plots.select import require_columns
    from cublaslt_probe.plots.style import config_labels
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
    from cublaslt_probe.plots.select import ordered, require_columns
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
    from cublaslt_probe.plots.select import ordered
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
    from cublaslt_probe.plots.select import require_columns
    require_columns(df, ["consistent", "backend", "family"], "the consistency summary")
    d = df[df["error"].isna()] if "error" in df else df
    state = d["consistent"].astype("boolean").map({True: "agree", False: "disagree"}).astype(object)
    state = state.where(d["consistent"].notna(), "not comparable")
    t = pd.crosstab([d["backend"].astype(str), d["family"].astype(str).replace("<NA>", "none")], state)
    for c in ("agree", "disagree", "not comparable"):
        if c not in t:
            t[c] = 0
    t = t[["agree", "disagree", "not comparable"]].reset_index()
    cols = [c for c in ("key", "kernel_short", "algo_tile", "algo_stages", "algo_cluster", "algo_split_k",
                        "log_function") if c in d]
    bad = d[d["consistent"].astype("boolean").fillna(True) == False][cols]  # noqa: E712
    return t, bad.reset_index(drop=True)


def path_summary(df: pd.DataFrame, a: str = "torch", b: str = "torch-lt") -> pd.DataFrame:
    """Per op × dtype × layout: GEMMs both backends ran, how many chose different kernels, and the median
    TFLOP/s change of `b` against `a` where they did."""
    from cublaslt_probe.plots.maps import pathdiff_table
    from cublaslt_probe.plots.select import require_columns
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
th { background: #f4f4f4; } td.num, th.num { text-align: right; }
img { max-width: 100%; height: auto; border: 1px solid #eee; margin: 0.4em 0; }
.figs { display: flex; flex-wrap: wrap; gap: 1em; align-items: flex-start; }
.figs figure { margin: 0; } .note { color: #555; font-size: 0.9em; } .error { color: #a00; }
nav ul { columns: 2; } code { background: #f6f6f6; padding: 0 3px; }
"""


def _table(df: pd.DataFrame, max_rows: int | None = None) -> str:
    if df is None or df.empty:
        return '<p class="note">(none)</p>'
    shown = df if max_rows is None else df.head(max_rows)
    out = shown.to_html(index=False, escape=True, border=0, na_rep="", float_format=lambda v: f"{v:g}")
    if max_rows is not None and len(df) > max_rows:
        out += f'<p class="note">showing {max_rows} of {len(df)} rows</p>'
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


class _Steps:
    def __init__(self, total: int, progress: Callable[[str], None] | None):
        self.i, self.total, self.progress, self.t0 = 0, total, progress, time.perf_counter()

    def __call__(self, msg: str) -> None:
        self.i += 1
        line = f"[{self.i}/{self.total}] {msg}"
        log.info(line)
        if self.progress:
            self.progress(line)


def _figure(steps: _Steps, msg: str, make, alt: str, dpi: int) -> str:
    steps(msg)
    try:
        fig = make()
    except ProbeError as e:
        return f'<p class="error">{html.escape(msg)}: {html.escape(str(e))}</p>'
    return _img(fig, alt, dpi)


def map_groups(df: pd.DataFrame) -> list[tuple[str, str, str]]:
    """(dtype, layout, op) combinations to map, in display order."""
    return [tuple(g) for g in _sorted_groups(df, ["dtype", "layout", "op"])]


def build_report(df: pd.DataFrame, outdir: str | os.PathLike, progress: Callable[[str], None] | None = None, *,
                 backend: str | None = None, dpi: int = 90, max_cliffs: int = 40) -> Path:
    """Write ``outdir/index.html`` (images embedded as base64 PNG) and return its path.

    `progress` gets one line per step (``[3/29] kernel map bf16 NT mm``). Maps use `backend` (default:
    torch when present) and the dataset's natural axes (`plots.auto_axes`); a map that cannot be drawn
    shows its error in place instead of stopping the report.
    """
    from cublaslt_probe import plots
    from cublaslt_probe.plots.select import env_of, require_columns
    from cublaslt_probe.plots.style import title_head

    require_columns(df, GROUP_KEYS + ["m", "n", "k", "kernel", "tflops"], "the report")
    if df.empty:
        raise ProbeError("the dataset is empty: nothing to report")
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    env = env_of(df)
    x, y = plots.auto_axes(df)
    backends = [b for b in ORDER["backend"] if b in set(df["backend"].astype(str))] or \
        sorted(set(df["backend"].astype(str)))
    square = y == "backend"
    groups = map_groups(df)
    bk_names = set(df["backend"].astype(str))
    has_paths = "torch" in bk_names and "torch-lt" in bk_names
    ps, ps_err = None, None
    if has_paths:
        ps, ps_err = _safe(lambda: path_summary(df), "path differences")
    ps = ps if ps is not None else pd.DataFrame()
    has_paths = has_paths and not ps.empty
    path_groups: list[tuple] = []
    if not ps.empty:
        differ = ps[ps["different kernels"] > 0]
        # square sweeps: one figure per dtype × op with the layouts as rows; else one per dtype × layout × op
        cols = ["dtype", "op"] if square else ["dtype", "layout", "op"]
        path_groups = list(dict.fromkeys(tuple(r) for r in differ[cols].itertuples(index=False)))
    has_heur = "heuristic_miss_us" in df and df["heuristic_miss_us"].notna().any()
    rs = regret_summary(df)
    regret_groups = map_groups(df[df["regret_pct"].notna()]) if not rs.empty else []
    total = 1 + 2 * len(groups) + len(path_groups) + 4 + int(has_heur) + len(regret_groups)
    steps = _Steps(total, progress)
    t0 = time.perf_counter()
    parts: list[str] = []

    steps("environment and coverage")
    head = title_head(env)
    source = df.attrs.get("source", "")
    parts.append(f"<h1>cublaslt-probe report — {html.escape(head)}</h1>")
    parts.append(f'<p class="note">dataset {html.escape(str(source))}: {len(df):,} rows; generated '
                 f'{time.strftime("%Y-%m-%d %H:%M")} by <code>cublaslt-probe report</code>. Images are embedded '
                 f'PNGs.</p>')
    parts.append("<nav><ul>" + "".join(f'<li><a href="#{a}">{html.escape(t)}</a></li>' for a, t in SECTIONS)
                 + "</ul></nav>")
    env_rows = pd.DataFrame([{"field": k, "value": "" if v is None else str(v)} for k, v in env.items()])
    parts.append(_section("environment", _table(env_rows)))

    cov = coverage(df)
    n_err = int(df["error"].notna().sum()) if "error" in df else 0
    shapes = df[["m", "n", "k"]].drop_duplicates()
    cov_html = (f"<p>{len(df):,} GEMMs over {len(shapes):,} distinct shapes (m {_range(df['m'])}, n "
                f"{_range(df['n'])}, k {_range(df['k'])}); {n_err} rows did not run (error). Backends: "
                f"{', '.join(backends)}.</p>" + _table(cov))
    if n_err:
        errs = df[df["error"].notna()]
        e = errs.assign(error=errs["error"].astype(str).str.slice(0, 160))
        grouped = (e.groupby("error", sort=False)
                   .agg(rows=("key", "size"), backends=("backend", lambda s: ", ".join(sorted(set(map(str, s))))),
                        example=("key", "first"))
                   .reset_index().sort_values("rows", ascending=False)[["rows", "backends", "example", "error"]])
        cov_html += "<h3>Rows that did not run</h3>" + _table(grouped, 20)
    parts.append(_section("coverage", cov_html))

    # maps
    map_bk = backend or ("torch" if "torch" in bk_names else backends[0])
    maps_html = [f'<p class="note">Axes: x = {html.escape(x)}, y = {html.escape(y)} '
                 + ("(square sweep: every backend in one map)" if square else f"(backend {html.escape(map_bk)})")
                 + ". Each colour is one kernel, numbered in the legend in the order it first appears from left "
                 "to right; black lines mark where the choice changes; hatched cells did not run. The TFLOP/s "
                 "map beside it draws the same boundaries as white lines with a black edge. "
                 f"Peaks: {html.escape(plots.peak_source(env.get('gpu')))}.</p>"]
    for dt, lay, op in groups:
        kw = dict(dtype=dt, layout=lay, op=op)
        if not square:
            sub = df[(df["dtype"].astype(str) == dt) & (df["layout"].astype(str) == lay) & (df["op"].astype(str) == op)]
            bks = set(sub["backend"].astype(str))
            kw["backend"] = map_bk if map_bk in bks else next(b for b in backends if b in bks)
        label = f"{dt} {lay} {op}" + ("" if square else f" · {kw['backend']}")
        a = _figure(steps, f"kernel map {label}", lambda: plots.kernel_map(df, x, y, **kw), f"kernel map {label}", dpi)
        b = _figure(steps, f"TFLOP/s map {label}", lambda: plots.tflops_map(df, x, y, **kw), f"TFLOP/s {label}", dpi)
        maps_html.append(f'<h3 id="map-{dt}-{lay}-{op}">{html.escape(label)}</h3><div class="figs"><figure>{a}'
                         f'</figure><figure>{b}</figure></div>')
    parts.append(_section("maps", "".join(maps_html)))

    # path differences
    if has_paths:
        ph = ["<p>Where torch's cuBLAS path (<code>torch</code>) and its cuBLASLt path (<code>torch-lt</code>) ran "
              "the same GEMM with different kernels (they ask the heuristic with different workspace limits). "
              "Change: TFLOP/s of torch-lt against torch where the kernels differ.</p>", _table(ps)]
        for g in path_groups:
            kw = dict(zip(["dtype", "op"] if square else ["dtype", "layout", "op"], g))
            py = "layout" if square else y
            label = " ".join(g)
            ph.append(f"<h3>{html.escape(label)}</h3>")
            ph.append(_figure(steps, f"path difference {label}",
                              lambda: plots.pathdiff_map(df, None, x, py, a="torch", b="torch-lt", **kw),
                              f"path difference {label}", dpi))
        parts.append(_section("paths", "".join(ph)))
    else:
        parts.append(_section("paths", ps_err or '<p class="note">The dataset does not have both torch and '
                              'torch-lt rows.</p>'))

    steps("top kernels")
    tk, err = _safe(lambda: top_kernels(df, n=8), "top kernels")
    tk_html = err or ("<p>The kernel configurations chosen most often per dtype, over every backend, op, layout "
                      "and shape of the dataset (share of that dtype's rows that ran). A configuration is family + "
                      "decoded tile · K-tile×stages · cluster · flags; <i>names</i> counts the kernel names it "
                      "covers (layout letters, type codes).</p>" + _table(tk))
    parts.append(_section("top-kernels", tk_html))

    steps("cliffs")
    cl = find_cliffs(df)
    n_pairs = len(find_cliffs(df, all_pairs=True))
    if cl.empty:
        cl_html = (f"<p>No cliffs: of {n_pairs} neighbouring pairs whose TFLOP/s differ by more than 20 %, none has "
                   "the larger shape running at fewer TFLOP/s or in less time.</p>")
    else:
        n_changed = int(cl["kernel changed"].sum())
        by = cl.groupby(["dtype", "kind"]).size().rename("cliffs").reset_index()
        cl_html = (f"<p>Neighbouring shapes (same backend, op, dtype, layout; one dimension steps to the next "
                   f"measured value) whose TFLOP/s differ by more than 20 % of the larger: {n_pairs:,} pairs. Most "
                   f"are <i>scaling</i> -- a larger latency- or memory-bound GEMM does more work in the same time. "
                   f"The {len(cl):,} cliffs below are the pairs that scaling does not explain: "
                   f"<b>TFLOP/s falls</b> (the larger shape runs at more than 20 % fewer TFLOP/s) or <b>time "
                   f"falls</b> (the larger shape finishes in more than 20 % less time, so the smaller one is the "
                   f"anomaly). The kernel changes across {n_changed:,} of them ({100 * n_changed / len(cl):.0f} %); "
                   f"sorted by the size of the change (log scale). <code>change %</code> is TFLOP/s of "
                   f"<i>to</i> against <i>from</i>.</p>" + _table(by)
                   + f"<h3>The {min(max_cliffs, len(cl))} largest</h3>" + _table(cl, max_cliffs))
    parts.append(_section("cliffs", cl_html))

    steps("heuristic overhead")
    hs, h_err = _safe(lambda: heuristic_summary(df), "heuristic summary") if has_heur else (pd.DataFrame(), None)
    h_img = _figure(steps, "heuristic plot", lambda: plots.heuristic_plot(df, x="m"), "heuristic cost", dpi) \
        if has_heur else '<p class="note">The dataset has no heuristic times.</p>'
    parts.append(_section("heuristic", "<p>Host time of <code>cublasLtMatmulAlgoGetHeuristic</code> with the "
                          "heuristics cache off (miss) and warm (hit), against the GEMM's own time. A miss is paid "
                          "once per new problem per process; torch's Lt path asks again on each call and relies on "
                          "cuBLASLt's cache.</p>" + (h_err or _table(hs)) + h_img))

    if not rs.empty:
        r_html = ["<h3>Regret: the chosen kernel against the fastest heuristic candidate</h3><p>For GEMMs swept "
                  "with candidates: how much longer the heuristic's first choice ran than the fastest candidate "
                  "that ran correctly.</p>", _table(rs)]
        for dt, lay, op in regret_groups:
            kw = dict(dtype=dt, layout=lay, op=op)
            r_html.append(_figure(steps, f"regret map {dt} {lay} {op}", lambda: plots.regret_map(df, x, y, **kw),
                                  f"regret {dt} {lay} {op}", dpi))
        parts[-1] = parts[-1].replace("\n</section>", "".join(r_html) + "\n</section>")

    steps("consistency")
    res, err = _safe(lambda: consistency_summary(df), "consistency")
    ct, bad = res if res else (pd.DataFrame(columns=["agree", "disagree", "not comparable"]), pd.DataFrame())
    n_ag, n_dis, n_nc = (int(ct[c].sum()) for c in ("agree", "disagree", "not comparable"))
    c_html = err or (f"<p>Does the kernel that ran (decoded from its name) agree with the algo cuBLASLt logged "
                     f"for the call, on tile, cluster and split-K? {n_ag:,} agree, {n_dis:,} disagree, {n_nc:,} not "
                     "comparable (no trace line -- e.g. gemv kernels -- or nothing both sides state).</p>"
                     + _table(ct))
    if n_dis:
        c_html += "<h3>Disagreements</h3>" + _table(bad, 30)
    parts.append(_section("consistency", c_html))

    page = ("<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>cublaslt-probe report — "
            f"{html.escape(head)}</title><style>{_CSS}</style></head><body>" + "\n".join(parts)
            + f'<p class="note">built in {time.perf_counter() - t0:.1f} s</p></body></html>\n')
    path = out / "index.html"
    path.write_text(page, encoding="utf-8")
    log.info("report: wrote %s (%.1f MB) in %.1f s", path, path.stat().st_size / 1e6, time.perf_counter() - t0)
    return path


def _safe(make, what: str):
    """(result, None) or (None, an error paragraph) -- one missing column must not stop the whole report."""
    try:
        return make(), None
    except ProbeError as e:
        return None, f'<p class="error">{html.escape(what)}: {html.escape(str(e))}</p>'


def _section(anchor: str, body: str) -> str:
    title = dict(SECTIONS)[anchor]
    return f'<section id="{anchor}"><h2>{html.escape(title)}</h2>\n{body}\n</section>'
