"""What the heuristic query costs on the host: miss (cache off) and hit (cache warm) µs by dtype and shape."""
from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, LogLocator

from cublaslt_probe.errors import OptionError, ProbeError
from cublaslt_probe.render.plots.select import axis_title, env_of, fmt_value, ordered, require_columns
from cublaslt_probe.render.plots.style import palette, title_head

HEURISTIC_COLUMNS = ("heuristic_miss_us", "heuristic_hit_us")


def filter_rows(df: pd.DataFrame, what: str, **filters) -> pd.DataFrame:
    """Rows matching the non-None `filters` (column=value); ProbeError naming the values available."""
    cur = df
    done = []
    for c, v in filters.items():
        if v is None:
            continue
        require_columns(df, [c], what)
        if c in ("m", "n", "k", "batch"):
            mask = cur[c] == int(v)
        else:
            mask = cur[c].astype(str) == str(v)
        if not mask.any():
            avail = ", ".join(fmt_value(x) for x in ordered(cur[c].dropna().astype(object), c))
            where = f" with {', '.join(done)}" if done else ""
            raise OptionError(f"no rows for {c}={v}{where}; {c} values there: {avail}")
        cur = cur[mask]
        done.append(f"{c}={v}")
    return cur


def _fmt_us(v) -> str:
    if v is None or pd.isna(v):
        return "–"
    return f"{v:.0f} µs" if v >= 10 else f"{v:.1f} µs"


def heuristic_plot(df: pd.DataFrame, x: str = "m", *, backend=None, op=None, dtype=None, layout=None,
                   m=None, n=None, k=None) -> Figure:
    """Heuristic miss and hit µs: distribution per dtype (left) and median against a shape axis (right),
    with the median GEMM time on the right for scale (a miss can cost more than the GEMM it chooses for)."""
    if x not in ("m", "n", "k", "batch"):
        raise OptionError(f"unknown x axis {x!r} for the heuristic plot; choose m, n, k or batch")
    require_columns(df, list(HEURISTIC_COLUMNS) + ["dtype", x], "the heuristic plot")
    d = filter_rows(df, "the heuristic plot", backend=backend, op=op, dtype=dtype, layout=layout, m=m, n=n, k=k)
    d = d.dropna(subset=list(HEURISTIC_COLUMNS), how="all")
    if d.empty:
        raise ProbeError("no heuristic times in these rows (heuristic_miss_us / heuristic_hit_us are empty)")
    dtypes = ordered(d["dtype"].astype(str), "dtype")
    colors = dict(zip(dtypes, palette(len(dtypes))))
    fig = Figure(figsize=(12, 4.6), layout="constrained", dpi=100)
    a1, a2 = fig.subplots(1, 2, width_ratios=[1, 1.6])

    _boxes(a1, d, dtypes, colors)
    _medians(a2, d, x, dtypes, colors)

    env = env_of(df)
    pins = [f"{c} {v}" for c, v in (("backend", backend), ("op", op), ("dtype", dtype), ("layout", layout),
                                     ("M =", m), ("N =", n), ("K =", k)) if v is not None]
    n_rows = len(d)
    fig.suptitle(f"Heuristic query cost — {title_head(env)}\n"
                 f"{' · '.join(pins) if pins else 'all backends, ops and layouts'} · {n_rows} GEMMs · "
                 f"overall median miss {d['heuristic_miss_us'].median():.0f} µs, hit "
                 f"{d['heuristic_hit_us'].median():.1f} µs", fontsize=10, x=0.01, ha="left")
    return fig


def _boxes(ax, d: pd.DataFrame, dtypes: list, colors: dict) -> None:
    """The left panel: boxes per dtype, miss and hit side by side, medians under each dtype."""
    pos, data, cols, hatches = [], [], [], []
    for i, dt in enumerate(dtypes):
        s = d[d["dtype"].astype(str) == dt]
        for off, col, h in ((-0.18, "heuristic_miss_us", ""), (0.18, "heuristic_hit_us", "////")):
            v = s[col].dropna().to_numpy(dtype=float)
            if len(v):
                pos.append(i + off)
                data.append(v)
                cols.append(colors[dt])
                hatches.append(h)
    bp = ax.boxplot(data, positions=pos, widths=0.32, patch_artist=True, whis=(5, 95), showfliers=True,
                    flierprops={"markersize": 2, "alpha": 0.4}, medianprops={"color": "black"})
    for box, c, h in zip(bp["boxes"], cols, hatches):
        box.set_facecolor(c)
        box.set_alpha(0.85)
        box.set_hatch(h)
        box.set_edgecolor("#333333")
    ax.set_yscale("log")
    ticks = []
    for dt in dtypes:
        g = d[d["dtype"].astype(str) == dt]
        miss, hit = _fmt_us(g["heuristic_miss_us"].median()), _fmt_us(g["heuristic_hit_us"].median())
        ticks.append(f"{dt}\nmiss {miss}\nhit {hit}")
    ax.set_xticks(range(len(dtypes)))
    ax.set_xticklabels(ticks, fontsize=8)
    ax.set_ylabel("host time of cublasLtMatmulAlgoGetHeuristic (µs)")
    ax.set_title("per dtype: miss (plain) and hit (hatched) µs;\nwhiskers 5–95 %, medians under each dtype",
                 fontsize=9)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.grid(axis="y", which="both", alpha=0.25)


def _medians(ax, d: pd.DataFrame, x: str, dtypes: list, colors: dict) -> None:
    """The right panel: median miss and hit µs against the shape axis `x`, with the median GEMM time."""
    xs = ordered(d[x].dropna().astype(object), x)
    xi = {v: i for i, v in enumerate(xs)}
    for dt in dtypes:
        s = d[d["dtype"].astype(str) == dt]
        g = s.groupby(s[x].astype(object))[list(HEURISTIC_COLUMNS)].median()
        idx = [xi[v] for v in g.index]
        ax.plot(idx, g["heuristic_miss_us"], "-o", color=colors[dt], ms=3.5, lw=1.4, label=dt)
        ax.plot(idx, g["heuristic_hit_us"], "--", color=colors[dt], lw=1.0, alpha=0.8)
    if "time_us" in d:
        t = d.groupby(d[x].astype(object))["time_us"].median()
        ax.plot([xi[v] for v in t.index], t.to_numpy(dtype=float), ":", color="black", lw=1.4)
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1, 2, 5)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_xticks(range(len(xs)))
    labels = [fmt_value(v) for v in xs]
    ax.set_xticklabels(labels, rotation=90 if len(xs) > 14 else 0, fontsize=7.5)
    ax.set_xlabel(axis_title(x, xs))
    ax.set_ylabel("median µs")
    ax.set_title("median against shape: miss (solid), hit (dashed), GEMM time (dotted)", fontsize=9)
    ax.grid(axis="y", which="both", alpha=0.25)
    style = [Line2D([], [], color="grey", ls="-", marker="o", ms=3, label="miss (cache off)"),
             Line2D([], [], color="grey", ls="--", label="hit (cache warm)"),
             Line2D([], [], color="black", ls=":", label="GEMM time, all dtypes")]
    dt_handles = [Line2D([], [], color=colors[dt], lw=6, label=dt) for dt in dtypes]
    ax.legend(handles=dt_handles + style, loc="upper left",
              bbox_to_anchor=(1.01, 1), fontsize=7.5, frameon=False)
