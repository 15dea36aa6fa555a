"""Choosing the rows a map shows: filters, defaults, the two axes, and one row per cell.

A map is a grid over two axes (``x`` and ``y``); every other identifying column must be pinned to one value
so that each cell holds exactly one GEMM. `select` does that and explains what it did:

- categorical filters (``backend``, ``op``, ``dtype``, ``layout``) left as None take the preferred default
  (torch, mm, bf16, NT) when the slice has it, else the most common value; a column used as an axis is not
  filtered;
- shape columns (``m``, ``n``, ``k``, ``batch``) not used as axes are filtered when given; when they are not
  given and cells would hold several rows, ``k`` is pinned to 4096 (else its most common value) and
  ``batch`` to 1; if cells still hold several rows, `select` raises and says which column to pin.
  (Policy: never silently average or pick one of several GEMMs in a cell.)
- the synthetic axis ``nk`` is the (n, k) pair, labelled ``N×K`` -- the natural y axis of datasets whose
  shapes are weight matrices (the ``llm`` preset), where n and k do not form a grid.

Errors are `ProbeError`s that name what is available.
"""
from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from cublaslt_probe.errors import OptionError, ProbeError, SchemaError
from cublaslt_probe.vocab import ENV_KEYS, ORDER

log = logging.getLogger(__name__)

CATEGORICAL = ("dtype", "layout", "op", "backend")  # the order filters apply in
SHAPE = ("m", "n", "k", "batch")
AXES = SHAPE + ("nk",) + CATEGORICAL
PREFERRED = {"backend": "torch", "op": "mm", "dtype": "bf16", "layout": "NT", "k": 4096, "batch": 1}
AXIS_LABELS = {"m": "M", "n": "N", "k": "K", "batch": "batch", "nk": "N×K", "backend": "backend",
               "op": "op", "dtype": "dtype", "layout": "layout"}

DATASET_NAMES = ("h200_grid.parquet", "h200_llm.parquet")


def data_dirs() -> list[Path]:
    """Where the shipped datasets are looked for, in order: the folder ``CUBLASLT_PROBE_DATA`` names, the
    repository checkout's ``data/`` (an editable install), and the installed package's shared data
    (``<prefix>/share/cublaslt-probe/data``, which ``pip install .`` fills from ``data/``)."""
    import cublaslt_probe
    here = Path(cublaslt_probe.__file__).resolve().parent  # the package folder
    dirs = [Path(os.environ["CUBLASLT_PROBE_DATA"])] if os.environ.get("CUBLASLT_PROBE_DATA") else []
    dirs.append(here.parent / "data")
    # <prefix>/lib/pythonX.Y/site-packages/cublaslt_probe -> <prefix> (a venv, --prefix or --user install)
    prefixes = [here.parents[3]] if len(here.parents) > 3 else []
    prefixes += [Path(sys.prefix), Path(sys.base_prefix)]
    for p in prefixes:
        d = p / "share" / "cublaslt-probe" / "data"
        if d not in dirs:
            dirs.append(d)
    return dirs


def default_dataset() -> Path:
    """The shipped H200 dataset: ``h200_grid.parquet`` if it exists, else ``h200_llm.parquet``, in the
    first of `data_dirs` that holds it."""
    dirs = data_dirs()
    for name in DATASET_NAMES:
        for d in dirs:
            if (d / name).exists():
                return d / name
    raise ProbeError(f"no shipped dataset found (looked for {', '.join(DATASET_NAMES)} in "
                     f"{', '.join(str(d) for d in dirs)}): pass a DATASET path, or set CUBLASLT_PROBE_DATA "
                     "to a folder holding them")


def load(path: str | os.PathLike | None = None) -> pd.DataFrame:
    """Read a dataset (the shipped default when `path` is None); the environment is in ``df.attrs['env']``."""
    from cublaslt_probe.analysis.dataset import read_parquet
    p = Path(path) if path is not None else default_dataset()
    df = read_parquet(p)
    df.attrs["source"] = str(p)
    return df


def env_of(df: pd.DataFrame) -> dict:
    """The environment: ``df.attrs['env']`` completed from the env columns of the rows."""
    env = dict(df.attrs.get("env") or {})
    for col in ENV_KEYS:
        if not env.get(col) and col in df and df[col].notna().any():
            vals = df[col].dropna().astype(str).unique()
            env[col] = vals[0] if len(vals) == 1 else ", ".join(sorted(vals))
    return env


def require_columns(df: pd.DataFrame, cols, what: str) -> None:
    """Raise SchemaError naming the columns `what` needs that `df` lacks, and the ones it has."""
    missing = [c for c in cols if c not in df.columns]
    if missing:
        raise SchemaError(f"{what} needs column{'s' if len(missing) > 1 else ''} {', '.join(missing)}, which "
                          f"this dataset lacks; it has: {', '.join(map(str, df.columns))}")


def ordered(values, col: str) -> list:
    """Distinct values in display order: numeric ascending; known categories in their natural order."""
    vals = [v for v in pd.unique(pd.Series(list(values), dtype="object")) if not _isna(v)]
    if col in ORDER:
        pref = ORDER[col]
        return sorted(vals, key=lambda v: (pref.index(v) if v in pref else len(pref), str(v)))
    try:
        return sorted(vals)
    except TypeError:
        return sorted(vals, key=str)


def _isna(v) -> bool:
    try:
        return bool(pd.isna(v))
    except (TypeError, ValueError):
        return False


def fmt_value(v) -> str:
    """Axis tick text: integers plainly, (n, k) pairs as ``N×K``."""
    if isinstance(v, tuple):
        return "×".join(fmt_value(x) for x in v)
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


def _is_pow2(v) -> bool:
    return isinstance(v, (int, np.integer)) and v > 0 and (int(v) & (int(v) - 1)) == 0


def _spacing(vals) -> str:
    """``: powers of two`` / ``: ≈ log scale`` when even spacing of these values reads as a log axis."""
    if all(_is_pow2(v) for v in vals):
        return ": powers of two"
    v = np.asarray(sorted(vals), dtype=float)
    if (v > 0).all():
        gaps = np.diff(np.log2(v))
        if gaps.min() > 0 and gaps.max() / gaps.min() <= 2.5:
            return ": ≈ log scale"
    return ""


def axis_title(axis: str, values) -> str:
    """``M  (each measured value; powers of two, log-spaced)`` -- the axes are categorical."""
    lab = AXIS_LABELS.get(axis, axis)
    vals = list(values)
    if axis in SHAPE and len(vals) > 2:
        lab += f"  (each measured value, evenly spaced{_spacing(vals)})"
    return lab


def _listing(values, col: str, limit: int = 24) -> str:
    vals = [fmt_value(v) for v in ordered(values, col)]
    if len(vals) > limit:
        return ", ".join(vals[:limit]) + f", … ({len(vals)} in all)"
    return ", ".join(vals)


def auto_axes(df: pd.DataFrame) -> tuple[str, str]:
    """The natural (x, y) axes of a dataset.

    - square sweeps (m = n = k on every row): ``("m", "backend")``;
    - n and k form a full grid (e.g. one fixed K): ``("m", "n")``;
    - sparse (n, k) pairs (weight shapes, the ``llm`` preset): ``("m", "nk")``.
    """
    require_columns(df, ["m", "n", "k"], "choosing axes")
    d = df.dropna(subset=["m", "n", "k"])
    if len(d) and ((d["m"] == d["n"]) & (d["n"] == d["k"])).all():
        return "m", "backend"
    pairs = d[["n", "k"]].drop_duplicates()
    if len(pairs) == d["n"].nunique() * d["k"].nunique():
        return "m", "n"
    return "m", "nk"


@dataclass
class Selection:
    """Rows of a map: one per (x, y) cell, with the pins that made them unique."""

    df: pd.DataFrame
    x: str
    y: str
    xs: list
    ys: list
    pins: dict = field(default_factory=dict)   # column -> value it was pinned to
    auto: set = field(default_factory=set)     # which pins were chosen by default, not by the caller
    env: dict = field(default_factory=dict)

    def cell(self, col: str) -> pd.DataFrame:
        """`col` pivoted to a (len(ys), len(xs)) frame (rows y, columns x); missing cells are NA."""
        t = self.df.set_index([self.y, self.x])[col]
        idx = pd.MultiIndex.from_product([self.ys, self.xs], names=[self.y, self.x])
        return t.reindex(idx).unstack(self.x).reindex(index=self.ys, columns=self.xs)

    def describe(self, skip=()) -> str:
        """``bf16 NT · mm · backend torch · K = 4096`` (the pins, for titles)."""
        parts = []
        dt = [str(self.pins[c]) for c in ("dtype", "layout") if c in self.pins and c not in skip]
        if dt:
            parts.append(" ".join(dt))
        if "op" in self.pins and "op" not in skip:
            parts.append(f"op {self.pins['op']}")
        if "backend" in self.pins and "backend" not in skip:
            parts.append(f"backend {self.pins['backend']}")
        for c in ("m", "n", "k"):
            if c in self.pins and c not in skip:
                parts.append(f"{AXIS_LABELS[c]} = {fmt_value(self.pins[c])}")
        if self.pins.get("batch", 1) != 1 and "batch" not in skip:
            parts.append(f"batch {self.pins['batch']}")
        return " · ".join(parts)


def _axis_series(df: pd.DataFrame, axis: str) -> pd.Series:
    if axis == "nk":
        return pd.Series(list(zip(df["n"].astype("int64"), df["k"].astype("int64"))), index=df.index,
                         dtype="object")
    return df[axis].astype("object").where(df[axis].notna(), None)


def select(df: pd.DataFrame, x: str = "m", y: str | None = None, *, backend=None, op=None, dtype=None,
           layout=None, m=None, n=None, k=None, batch=None, what: str = "map") -> Selection:
    """Filter `df` to one row per (x, y) cell; see the module docstring for the defaults.

    `y` None or ``"auto"`` takes `auto_axes`'s choice. Raises ProbeError naming what is available when an
    axis is unknown, a filter matches nothing, or cells would hold several rows.
    """
    if y in (None, "auto"):
        y = auto_axes(df)[1]
    for name, ax in (("x", x), ("y", y)):
        if ax not in AXES:
            raise OptionError(f"unknown {name} axis {ax!r}; choose one of {', '.join(AXES)}")
    if x == y:
        raise OptionError(f"x and y are both {x!r}: choose two different axes")
    needed = {"m", "n", "k"} | {c for c in (x, y) if c != "nk"} | {"backend", "op", "dtype", "layout"}
    require_columns(df, sorted(needed), what)
    if len(df) == 0:
        raise ProbeError("the dataset is empty")
    axes = {x, y} | ({"n", "k"} if "nk" in (x, y) else set())
    given = {"backend": backend, "op": op, "dtype": dtype, "layout": layout, "m": m, "n": n, "k": k,
             "batch": batch}
    for c, v in given.items():
        if v is not None and c in axes:
            raise ProbeError(f"--{c} pins {c}, but {c} is an axis of the {what}: drop one of them")
    pins: dict = {}
    auto: set = set()
    cur = _pin_categories(df, given, axes, pins, auto)
    cur = _pin_shapes(df, cur, given, axes, pins)
    cur, xs_all, ys_all = _one_row_per_cell(cur, x, y, axes, pins, auto, what)
    if len(cur) == 0:
        raise ProbeError(f"no rows left for {_pins_text(pins)}")
    cur = cur.copy()
    cur[x] = xs_all
    cur[y] = ys_all
    sel = Selection(df=cur, x=x, y=y, xs=ordered(cur[x], x), ys=ordered(cur[y], y), pins=pins, auto=auto,
                    env=env_of(df))
    log.info("%s: %d cells (%d × %d) for %s", what, len(cur), len(sel.xs), len(sel.ys), _pins_text(pins))
    return sel


def _pins_text(pins: dict) -> str:
    return ", ".join(f"{c}={fmt_value(v)}" for c, v in pins.items())


def _pin_categories(df: pd.DataFrame, given: dict, axes: set, pins: dict, auto: set) -> pd.DataFrame:
    """`df` with each categorical column that is not an axis pinned: to the value given, else to its preferred
    value (`PREFERRED`) where present, else to its most frequent one (noted in `auto`)."""
    cur = df
    for c in CATEGORICAL:
        if c in axes:
            continue
        vals = ordered(cur[c].dropna().astype(str), c)
        v = given[c]
        if v is not None:
            v = str(v)
            if v not in vals:
                everywhere = ordered(df[c].dropna().astype(str), c)
                if v not in everywhere:
                    raise OptionError(f"no rows for {c}={v}; {c}s in this dataset: {_listing(everywhere, c)}")
                raise OptionError(f"no rows for {c}={v} with {_pins_text(pins)}; {c}s there: {_listing(vals, c)}")
        elif not vals:
            raise ProbeError(f"no rows with a {c} for {_pins_text(pins) or 'this dataset'}")
        else:
            v = PREFERRED[c] if PREFERRED[c] in vals else cur[c].astype(str).value_counts().index[0]
            auto.add(c)
        pins[c] = v
        cur = cur[cur[c].astype(str) == v]
    return cur


def _pin_shapes(df: pd.DataFrame, cur: pd.DataFrame, given: dict, axes: set, pins: dict) -> pd.DataFrame:
    """`cur` with the shape columns given (and not axes) pinned to their value."""
    for c in SHAPE:
        v = given[c]
        if c in axes or v is None:
            continue
        require_columns(df, [c], f"--{c}")
        vals = ordered(cur[c].dropna(), c)
        if int(v) not in vals:
            raise OptionError(f"no rows for {c}={v} with {_pins_text(pins)}; {c} values there: {_listing(vals, c)}")
        pins[c] = int(v)
        cur = cur[cur[c] == int(v)]
    return cur


def _one_row_per_cell(cur: pd.DataFrame, x: str, y: str, axes: set, pins: dict, auto: set, what: str):
    """(`cur` with one row per (x, y) cell, its x values, its y values): K (4096 by preference) and batch (1)
    pinned when they make cells ambiguous; ProbeError naming the columns to pin when cells still hold several
    rows."""
    xs_all, ys_all = _axis_series(cur, x), _axis_series(cur, y)
    key = pd.DataFrame({"x": xs_all.astype(str), "y": ys_all.astype(str)}, index=cur.index)
    if not key.duplicated().any():
        return cur, xs_all, ys_all
    for c in ("k", "batch"):
        if c in axes or c in pins or c not in cur or cur[c].nunique() <= 1:
            continue
        vals = ordered(cur[c].dropna(), c)
        v = PREFERRED[c] if PREFERRED[c] in vals else cur[c].value_counts().index[0]
        pins[c], cur = int(v), cur[cur[c] == v]
        auto.add(c)
        log.info("%s: several rows per cell; pinned %s=%s (values: %s)", what, c, v, _listing(vals, c))
    xs_all, ys_all = _axis_series(cur, x), _axis_series(cur, y)
    key = pd.DataFrame({"x": xs_all.astype(str), "y": ys_all.astype(str)}, index=cur.index)
    if key.duplicated().any():
        dup = cur[key.duplicated(keep=False)]
        varying = [c for c in CATEGORICAL + SHAPE if c not in axes and c in dup.columns
                   and dup.groupby([key["x"], key["y"]])[c].nunique().max() > 1]
        hints = "; ".join(f"pin {c} with --{c} (values: {_listing(cur[c].dropna(), c)})" for c in varying)
        raise ProbeError(f"several rows per cell of the {what} ({x} × {y}) with {_pins_text(pins)}: "
                         f"{hints or 'duplicate rows in the dataset'}"
                         + ("; or use --y nk" if "n" in varying or "k" in varying else ""))
    return cur, xs_all, ys_all
