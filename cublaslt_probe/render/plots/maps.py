"""Shape maps: which kernel runs where, how fast, what the choice cost, and where two paths differ.

Every function takes a DataFrame (+ options) and returns a `matplotlib.figure.Figure`; none shows or saves
(the CLI and the report do). Figures are built without pyplot, so no GUI backend is involved.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
from matplotlib.collections import LineCollection
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from cublaslt_probe.errors import OptionError, ProbeError
from cublaslt_probe.render.plots.select import (
    AXIS_LABELS,
    Selection,
    axis_title,
    fmt_value,
    ordered,
    require_columns,
    select,
)
from cublaslt_probe.render.plots.style import COLOR_FIELDS, color_values, palette, peak_source, text_color, title_head
from cublaslt_probe.vocab import peak_tflops

MISSING_COLOR = "#f2f2f2"
ERROR_COLOR = "#bdbdbd"
REGRET_COLUMNS = ("regret_pct", "best_rank", "best_kernel", "n_candidates")


# ----------------------------------------------------------------------------------------------- layout
def _square(sel: Selection) -> bool:
    d = sel.df
    return bool(len(d)) and bool(((d["m"] == d["n"]) & (d["n"] == d["k"])).all())


def _axis_label(sel: Selection, which: str) -> str:
    ax, vals = (sel.x, sel.xs) if which == "x" else (sel.y, sel.ys)
    lab = axis_title(ax, vals)
    if ax in ("m", "n", "k") and _square(sel):
        lab = "M = N = K" + lab[1:]
    return lab


def _grid_size(nx: int, ny: int) -> tuple[float, float, float]:
    """(width, height) in inches of the grid area, and the cell size in points."""
    cell = 0.42 if max(nx, ny) <= 20 else 0.3 if max(nx, ny) <= 40 else 0.2
    w = max(4.0, nx * cell + 1.2)
    h = max(2.4, ny * cell + 1.0)
    return w, h, cell * 72


def _setup_axes(ax, sel: Selection, cell_pt: float) -> None:
    nx, ny = len(sel.xs), len(sel.ys)
    xt = [fmt_value(v) for v in sel.xs]
    yt = [fmt_value(v) for v in sel.ys]
    fs = max(5.5, min(9.0, cell_pt * 0.5))
    ax.set_xticks(range(nx))
    rot = 90 if (max(map(len, xt)) * fs * 0.6 > cell_pt * 0.95) else 0
    ax.set_xticklabels(xt, rotation=rot, fontsize=fs)
    ax.set_yticks(range(ny))
    ax.set_yticklabels(yt, fontsize=fs)
    ax.set_xlim(-0.5, nx - 0.5)
    ax.set_ylim(-0.5, ny - 0.5)
    ax.set_xlabel(_axis_label(sel, "x"), fontsize=9)
    ax.set_ylabel(_axis_label(sel, "y"), fontsize=9)
    ax.tick_params(length=2)
    for s in ax.spines.values():
        s.set_linewidth(0.6)


def _boundaries(codes: np.ndarray, halo: bool = False) -> LineCollection:
    """Segments between neighbouring measured cells whose codes differ (white with a black halo when drawn
    over a continuous colour map, so they show on dark and light cells alike)."""
    ny, nx = codes.shape
    segs = []
    for j in range(ny):
        for i in range(nx - 1):
            a, b = codes[j, i], codes[j, i + 1]
            if a >= 0 and b >= 0 and a != b:
                segs.append([(i + 0.5, j - 0.5), (i + 0.5, j + 0.5)])
    for j in range(ny - 1):
        for i in range(nx):
            a, b = codes[j, i], codes[j + 1, i]
            if a >= 0 and b >= 0 and a != b:
                segs.append([(i - 0.5, j + 0.5), (i + 0.5, j + 0.5)])
    if not halo:
        return LineCollection(segs, colors="black", linewidths=1.6, capstyle="projecting", zorder=3)
    from matplotlib import patheffects
    return LineCollection(segs, colors="white", linewidths=1.2, capstyle="projecting", zorder=3,
                          path_effects=[patheffects.Stroke(linewidth=2.6, foreground="black"), patheffects.Normal()])


def _status(sel: Selection) -> np.ndarray:
    """Per cell: 0 measured, 1 error row (did not run), 2 not in the dataset."""
    present = sel.cell("key" if "key" in sel.df else sel.x).notna().to_numpy()
    if "error" in sel.df:
        err = sel.cell("error").notna().to_numpy() & present
    else:
        err = np.zeros_like(present)
    return np.where(~present, 2, np.where(err, 1, 0))


def _mark_errors(ax, status: np.ndarray) -> bool:
    ys, xs = np.nonzero(status == 1)
    for j, i in zip(ys, xs):
        ax.add_patch(Rectangle((i - 0.5, j - 0.5), 1, 1, facecolor=ERROR_COLOR, edgecolor="#636363", hatch="xx",
                               linewidth=0, zorder=2))
    return len(xs) > 0


def _codes(sel: Selection, values: pd.Series, order: list) -> np.ndarray:
    pos = {v: i for i, v in enumerate(order)}
    grid = sel.df.assign(_v=values).set_index([sel.y, sel.x])["_v"]
    out = np.full((len(sel.ys), len(sel.xs)), -1, dtype=int)
    yi = {v: j for j, v in enumerate(sel.ys)}
    xi = {v: i for i, v in enumerate(sel.xs)}
    for (yv, xv), v in grid.items():
        if not pd.isna(v):
            out[yi[yv], xi[xv]] = pos[v]
    return out


def _scan_order(sel: Selection, values: pd.Series) -> list:
    """Distinct values by their first cell, scanning x (outer) then y: the legend reads left to right."""
    xi = {v: i for i, v in enumerate(sel.xs)}
    yi = {v: j for j, v in enumerate(sel.ys)}
    d = pd.DataFrame({"v": values, "xi": sel.df[sel.x].map(xi), "yi": sel.df[sel.y].map(yi)}).dropna()
    d = d.sort_values(["xi", "yi"], kind="stable")
    return list(dict.fromkeys(d["v"]))


def _annotate(ax, grid: np.ndarray, texts, colors, cell_pt: float, min_cell_pt: float = 13) -> None:
    if cell_pt < min_cell_pt:
        return
    ny, nx = grid.shape
    longest = max((len(t) for row in texts for t in row if t), default=1)
    fs = max(4.5, min(8.0, cell_pt * 0.9 / max(longest, 2) * 1.6))
    for j in range(ny):
        for i in range(nx):
            t = texts[j][i]
            if t:
                ax.text(i, j, t, ha="center", va="center", fontsize=fs, color=colors[j][i], zorder=4)


def _finish_title(fig, sel: Selection, what: str, extra: str = "", skip=()) -> None:
    head = title_head(sel.env)
    line1 = f"{what} — {head}"
    line2 = sel.describe(skip=skip)
    if _square(sel) and {sel.x, sel.y} & {"m", "n", "k"}:
        line2 += " · square: M = N = K"
    elif sel.x != "k" and sel.y != "k" and "k" not in sel.pins and "nk" not in (sel.x, sel.y):
        ks = sel.df["k"].dropna().unique()
        line2 += f" · K = {fmt_value(int(ks[0]))}" if len(ks) == 1 else " · K varies"
    if "nk" in (sel.x, sel.y):
        line2 += " · K per row"
    if extra:
        line2 += f"\n{extra}"
    fig.suptitle(f"{line1}\n{line2}", fontsize=10, x=0.01, ha="left")


# ------------------------------------------------------------------------------------------ kernel map
def kernel_map(df: pd.DataFrame, x: str = "m", y: str | None = None, *, color: str = "kernel",
               annotate: bool = True, boundaries: bool = True, **filters) -> Figure:
    """Categorical heatmap: which kernel (or tile, cluster, family, split-K, any column) each shape got.

    `filters` are `select`'s (backend, op, dtype, layout, m, n, k, batch). Each colour is one distinct
    value, numbered in the legend (and in the cells when they are big enough) in the order it first
    appears scanning left to right; black lines mark where the choice changes; grey hatched cells did not
    run (``error``), light grey cells are not in the dataset.
    """
    if color == "kernel":
        require_columns(df, ["kernel"], "map")
    sel = select(df, x, y, what="map", **filters)
    vals, labels = color_values(sel.df, color)
    order = _scan_order(sel, vals)
    if not order:
        raise ProbeError(f"no measured rows to colour for {sel.describe()} (every row has an error)")
    colors = palette(len(order))
    codes = _codes(sel, vals, order)
    status = _status(sel)

    nx, ny = len(sel.xs), len(sel.ys)
    gw, gh, cell_pt = _grid_size(nx, ny)
    entries = [f"{i + 1:>2}  {labels[v]}" for i, v in enumerate(order)]
    rows_per_col = max(14, int((gh + 0.8) / 0.2))
    ncol = max(1, math.ceil(len(entries) / rows_per_col))
    if ncol > 3:   # very many values: grow the figure rather than the number of columns
        ncol = 3
        rows_per_col = math.ceil(len(entries) / ncol)
        gh = max(gh, rows_per_col * 0.2 - 0.8)
    longest = max(len(e) for e in entries)
    lw = ncol * (0.25 + longest * 0.068) + 0.4
    fig = Figure(figsize=(gw + lw, gh + 1.0), layout="constrained", dpi=100)
    ax = fig.add_subplot()
    grid = np.ma.masked_less(codes, 0)
    cmap = ListedColormap(colors).with_extremes(bad=MISSING_COLOR)
    ax.imshow(grid, cmap=cmap, vmin=-0.5, vmax=len(order) - 0.5, origin="lower", aspect="auto",
              interpolation="nearest")
    has_err = _mark_errors(ax, status)
    if boundaries:
        ax.add_collection(_boundaries(codes))
    if annotate:
        texts = [[str(codes[j, i] + 1) if codes[j, i] >= 0 else "" for i in range(nx)] for j in range(ny)]
        tcol = [[text_color(colors[codes[j, i]]) if codes[j, i] >= 0 else "black" for i in range(nx)]
                for j in range(ny)]
        _annotate(ax, codes, texts, tcol, cell_pt)
    _setup_axes(ax, sel, cell_pt)
    handles = [Patch(facecolor=c, edgecolor="none", label=e) for c, e in zip(colors, entries)]
    if has_err:
        handles.append(Patch(facecolor=ERROR_COLOR, edgecolor="#636363", hatch="xx", label="    did not run (error)"))
    if (status == 2).any():
        handles.append(Patch(facecolor=MISSING_COLOR, edgecolor="#999999", label="    not measured"))
    what = {"kernel": "kernel"}.get(color, color.replace("_", "-"))
    fig.legend(handles=handles, loc="outside right upper", ncol=ncol, fontsize=7.5, frameon=False,
               title=f"{what} ({len(order)} distinct)", title_fontsize=8.5, handlelength=1.2,
               handleheight=1.1, borderaxespad=0.2, labelspacing=0.25, columnspacing=1.0,
               prop={"family": "monospace", "size": 7.5})
    _finish_title(fig, sel, f"{'Kernel' if color == 'kernel' else what.capitalize()} per shape")
    fig._cublaslt_probe = {"cells": int((codes >= 0).sum()), "values": len(order),   # for the CLI and tests
                           "axes": f"{AXIS_LABELS.get(sel.x, sel.x)} × {AXIS_LABELS.get(sel.y, sel.y)}"}
    return fig


# ------------------------------------------------------------------------------------------ value maps
def _value_map(sel: Selection, values: np.ndarray, *, cmap: str, label: str, texts, vmin=None, vmax=None,
               kernel_lines: bool = True, norm=None, what: str, extra: str = "", skip=(),
               extend: str = "neither") -> tuple[Figure, object]:
    nx, ny = len(sel.xs), len(sel.ys)
    gw, gh, cell_pt = _grid_size(nx, ny)
    fig = Figure(figsize=(gw + 1.6, gh + 1.0), layout="constrained", dpi=100)
    ax = fig.add_subplot()
    from matplotlib import colormaps
    cm = colormaps[cmap].with_extremes(bad=MISSING_COLOR)
    im = ax.imshow(np.ma.masked_invalid(values), cmap=cm, vmin=vmin, vmax=vmax, norm=norm, origin="lower",
                   aspect="auto", interpolation="nearest")
    status = _status(sel)
    if _mark_errors(ax, status):
        extra += ("; " if extra else "") + "hatched: did not run (error)"
    if kernel_lines and "kernel" in sel.df:
        extra += ("; " if extra else "") + "outlined lines: the kernel changes"
        kv = sel.df["kernel"].astype("string")
        ax.add_collection(_boundaries(_codes(sel, kv, list(dict.fromkeys(kv.dropna()))), halo=True))
    if texts is not None:
        rgba = im.to_rgba(np.ma.masked_invalid(values))
        tcol = [[text_color(rgba[j, i]) for i in range(nx)] for j in range(ny)]
        _annotate(ax, values, texts, tcol, cell_pt)
    _setup_axes(ax, sel, cell_pt)
    cb = fig.colorbar(im, ax=ax, shrink=0.9, pad=0.02, extend=extend)
    cb.set_label(label, fontsize=8.5)
    cb.ax.tick_params(labelsize=7.5)
    _finish_title(fig, sel, what, extra, skip)
    return fig, cb


def _num_texts(values: np.ndarray, fmt) -> list:
    return [[fmt(v) if np.isfinite(v) else "" for v in row] for row in values]


def tflops_map(df: pd.DataFrame, x: str = "m", y: str | None = None, *, peak: float | None = None,
               annotate: str | None = "tflops", kernel_lines: bool = True, **filters) -> Figure:
    """Achieved TFLOP/s per shape, with % of peak on the colour bar's other side.

    `peak` defaults to the datasheet dense peak of the GPU product and dtype (`vocab.PEAKS`); unknown
    GPUs get no % scale. `annotate` writes ``"tflops"``, ``"pct"`` (of peak) or nothing in the cells.
    Black lines mark kernel changes, so cliffs can be matched to the choice.
    """
    sel = select(df, x, y, what="TFLOP/s map", **filters)
    require_columns(sel.df, ["tflops"], "the TFLOP/s map")
    vals = sel.cell("tflops").astype("Float64").to_numpy(dtype=float, na_value=np.nan)
    if not np.isfinite(vals).any():
        raise ProbeError(f"no TFLOP/s measured for {sel.describe()}")
    pk = peak if peak is not None else peak_tflops(sel.pins.get("dtype", ""), sel.env.get("gpu"))
    if annotate == "pct" and not pk:
        raise OptionError("no peak known for this GPU/dtype: give --peak TFLOPS to show % of peak")
    if annotate == "tflops":
        texts = _num_texts(vals, lambda v: f"{v:.0f}" if v >= 10 else f"{v:.1f}" if v >= 1 else f"{v:.2f}")
    elif annotate == "pct":
        texts = _num_texts(vals, lambda v: f"{100 * v / pk:.0f}")
    else:
        texts = None
    vmax = max(np.nanmax(vals), pk * 0.0) if pk else np.nanmax(vals)
    best = np.nanmax(vals)
    extra = f"best {best:.0f} TFLOP/s"
    if pk:
        src = "given" if peak is not None else "datasheet dense"
        extra += f" = {100 * best / pk:.0f} % of the {src} peak {pk:g} TFLOP/s"
    if annotate == "pct":
        extra += " · cells: % of peak"
    fig, cb = _value_map(sel, vals, cmap="viridis", label="TFLOP/s", texts=texts, vmin=0, vmax=vmax,
                         kernel_lines=kernel_lines, what="Achieved TFLOP/s", extra=extra)
    if pk:
        sec = cb.ax.secondary_yaxis("left", functions=(lambda t: 100 * t / pk, lambda p: p * pk / 100))
        sec.set_ylabel(f"% of peak ({pk:g})", fontsize=8.5)
        sec.tick_params(labelsize=7.5)
    fig._cublaslt_probe = {"peak": pk, "peak_source": peak_source(sel.env.get("gpu")) if peak is None else "given"}
    return fig


def regret_map(df: pd.DataFrame, x: str = "m", y: str | None = None, *, annotate: bool = True,
               **filters) -> Figure:
    """How much slower the chosen kernel is than the best candidate timed for the same GEMM (``regret_pct``).

    Needs the candidate columns (`REGRET_COLUMNS`), present only in datasets swept with candidates.
    """
    if "regret_pct" not in df.columns or df["regret_pct"].isna().all():
        why = ("lacks the candidate columns (regret_pct, best_rank, best_kernel, n_candidates)"
               if "regret_pct" not in df.columns else "has the candidate columns but no GEMM with candidates")
        raise ProbeError(f"the regret map needs heuristic candidates timed per GEMM; this dataset {why}. Sweep "
                         "with candidates (`cublaslt-probe sweep --candidates N`, lt backend), or plot tflops, "
                         "heuristic or pathdiff instead")
    if filters.get("backend") is None:   # default to the rows that have candidates (the lt backend)
        df = df[df["regret_pct"].notna()]
    sel = select(df, x, y, what="regret map", **filters)
    vals = sel.cell("regret_pct").astype("Float64").to_numpy(dtype=float, na_value=np.nan)
    if not np.isfinite(vals).any():
        raise ProbeError(f"no regret measured for {sel.describe()} (regret_pct is empty there)")
    texts = (_num_texts(vals, lambda v: f"{v:.0f}" if v >= 0.95 else ("0" if v < 0.05 else f"{v:.1f}"))
             if annotate else None)
    worst = float(np.nanmax(vals))
    vmax = min(worst, max(5.0, 2 * float(np.nanpercentile(vals, 95))))   # one outlier must not wash out the rest
    extra = (f"median {np.nanmedian(vals):.1f} %, worst {np.nanmax(vals):.0f} %; "
             f"{int((vals > 5).sum())} of {int(np.isfinite(vals).sum())} shapes > 5 % from the best candidate")
    fig, _ = _value_map(sel, vals, cmap="magma_r", label="regret: time over the best candidate (%)", texts=texts,
                        vmin=0, vmax=max(vmax, 5.0), what="Regret of the chosen kernel", extra=extra,
                        extend="max" if worst > max(vmax, 5.0) else "neither")
    return fig


# ------------------------------------------------------------------------------------------ path diff
def pathdiff_map(df: pd.DataFrame, other: pd.DataFrame | None = None, x: str = "m", y: str | None = None, *,
                 a: str | None = None, b: str | None = None, annotate: bool = True, **filters) -> Figure:
    """Where two paths choose different kernels for the same GEMM.

    With one dataset, the paths are backends `a` and `b` (default torch vs torch-lt). With `other`, the
    same backend in two datasets (two GPUs, two library versions): `a`/`b` then pick each side's backend
    (default: the same). Cells where the kernels differ are coloured by how much faster (blue) or slower
    (red) side B runs, in %; cells with the same kernel are grey.
    """
    if "backend" in filters and filters["backend"] is not None:
        raise ProbeError("pathdiff compares backends: use --a/--b instead of --backend")
    filters.pop("backend", None)
    if other is None:
        a = a or "torch"
        b = b or "torch-lt"
        if a == b:
            raise ProbeError(f"pathdiff needs two different backends (got {a} twice), or a second dataset")
        df_b = df
    else:
        df_b = other
        a = a or ("torch" if "torch" in set(df["backend"].astype(str)) else None)
        b = b or a
    sa = select(df, x, y, backend=a, what="path difference (A)", **filters)
    pins = {c: v for c, v in sa.pins.items() if c != "backend"}
    sb = select(df_b, x, y, backend=b, what="path difference (B)",
                **{c: v for c, v in pins.items() if c not in (x, y)})
    xs = ordered(list(sa.xs) + list(sb.xs), sa.x)
    ys = ordered(list(sa.ys) + list(sb.ys), sa.y)
    sa.xs = sb.xs = xs
    sa.ys = sb.ys = ys
    ka, kb = sa.cell("kernel"), sb.cell("kernel")
    ta = sa.cell("tflops").astype("Float64").to_numpy(dtype=float, na_value=np.nan)
    tb = sb.cell("tflops").astype("Float64").to_numpy(dtype=float, na_value=np.nan)
    both = (ka.notna() & kb.notna()).to_numpy()
    differ = both & (ka.astype("string") != kb.astype("string")).fillna(False).to_numpy(dtype=bool)
    change = np.where(differ, 100 * (tb / ta - 1), np.nan)
    n_both, n_diff = int(both.sum()), int(differ.sum())
    lim = max(10.0, float(np.nanmax(np.abs(change)))) if n_diff else 10.0
    lim = min(lim, 100.0)
    texts = _num_texts(change, lambda v: f"{v:+.0f}") if annotate else None
    only = ka.notna().to_numpy() ^ kb.notna().to_numpy()
    if other is None:
        name_a, name_b = a, b
    else:
        name_a = f"A ({_env_tag(sa.env, df)}, {a})"
        name_b = f"B ({_env_tag(sb.env, other)}, {b})"
    extra = (f"{name_a} vs {name_b}: different kernels in {n_diff} of {n_both} shapes"
             + (f"; there {name_b if other is None else 'B'} is faster in {int((change > 0).sum())}, slower in "
               f"{int((change < 0).sum())}"
                if n_diff else "")
             + "\ngrey: same kernel; black outline: the kernels differ"
             + ("; hatched: only one side ran" if only.any() else ""))
    # grey background for same-kernel cells: draw the comparable cells first, then the coloured ones on top
    fig, cb = _value_map(sa, change, cmap="RdBu", label=f"TFLOP/s of {b if other is None else 'B'} vs "
                         f"{a if other is None else 'A'} where kernels differ (%)", texts=texts, vmin=-lim,
                         vmax=lim, kernel_lines=False, what="Path difference", extra=extra, skip=("backend",))
    ax = fig.axes[0]
    same = both & ~differ
    ys_i, xs_i = np.nonzero(same)
    for j, i in zip(ys_i, xs_i):
        ax.add_patch(Rectangle((i - 0.5, j - 0.5), 1, 1, facecolor="#d9d9d9", edgecolor="white", linewidth=0.5,
                               zorder=1.5))
    ax.add_collection(_boundaries(np.where(both, differ.astype(int), -1)))
    for j, i in zip(*np.nonzero(only)):
        ax.add_patch(Rectangle((i - 0.5, j - 0.5), 1, 1, facecolor="white", edgecolor="#999999", hatch="//",
                               linewidth=0, zorder=2))
    fig._cublaslt_probe = {"shapes": n_both, "different": n_diff}
    return fig


def _env_tag(env: dict, df: pd.DataFrame) -> str:
    tag = title_head(env)
    return tag if tag != "unknown GPU" else str(df.attrs.get("source", "dataset"))


def pathdiff_table(df: pd.DataFrame, a: str = "torch", b: str = "torch-lt") -> pd.DataFrame:
    """Rows where backends `a` and `b` ran the same GEMM (op, dtype, layout, shape) with different kernels:
    ``kernel_<a>``, ``kernel_short_<a>`` (family-prefixed short form), ``tflops_<a>``, and the same for `b`."""
    from cublaslt_probe.render.plots.style import config_labels
    keys = ["op", "dtype", "layout", "m", "n", "k", "batch"]
    require_columns(df, keys + ["backend", "kernel", "tflops"], "the path difference table")
    df = df.assign(kernel_short=config_labels(df))   # family-prefixed: "cutlass 64x64", "gemv kernel"
    cols = keys + ["kernel", "kernel_short", "tflops"]
    da = df[df["backend"].astype(str) == a][cols]
    db = df[df["backend"].astype(str) == b][cols]
    j = da.merge(db, on=keys, suffixes=(f"_{a}", f"_{b}"))
    j = j[j[f"kernel_{a}"].notna() & j[f"kernel_{b}"].notna()]
    return j[j[f"kernel_{a}"].astype(str) != j[f"kernel_{b}"].astype(str)].reset_index(drop=True)


def diff_map(joined_df: pd.DataFrame, x: str = "m", y: str = "n", *, backend: str | None = None, **filters) -> Figure:
    """Map of where the two sides of a diff (`analysis.diff.diff`) choose different kernels -> matplotlib Figure
    (never shown or saved): `pathdiff_map` of the diff's two sides (`analysis.diff.map_sides`), one GEMM per
    cell, the other columns pinned as `plots.select` explains (bf16, NT, mm, K = 4096 when present, else the
    most common value; pass ``dtype=``, ``layout=``, ``op=``, ``k=`` ... in `filters` to choose). Without
    backends in the diff, `backend` picks the one to map (default torch, else the most common)."""
    from cublaslt_probe.analysis.diff import map_sides
    side_a, side_b, ba, bb = map_sides(joined_df, backend)
    return pathdiff_map(side_a, side_b, x=x, y=y, a=ba, b=bb, **filters)


__all__ = ["kernel_map", "tflops_map", "regret_map", "pathdiff_map", "diff_map", "pathdiff_table", "COLOR_FIELDS",
           "REGRET_COLUMNS"]
