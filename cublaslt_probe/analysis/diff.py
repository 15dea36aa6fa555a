"""Which kernel choices differ between two datasets (or two backends of one), and what the change cost.

    >>> from cublaslt_probe.analysis.diff import diff_files
    >>> r = diff_files("data/h200_llm.parquet", "data/h200_llm.parquet", backends=("torch", "torch-lt"))
    >>> r.summary["changed"], r.summary["same"]          # doctest: +SKIP
    >>> r.changed()                                        # one row per shape whose kernel changed

Rows of A and B are joined on ``(op, dtype, layout, m, n, k, batch)`` plus ``backend`` — or, with
``backends=("torch", "torch-lt")``, backend torch of A against backend torch-lt of B (A and B may be the same
dataset). Each joined row gets a `status` (`STATUSES`), both kernels with their decoded fields (columns
suffixed ``_a`` / ``_b``), what changed in the name (`change`), and the time / TFLOP/s change of B against A.

Environments are compared first: kernel choices depend on the GPU, the cuBLASLt build, the torch build (its
workspace and heuristics settings) and the driver, so a difference in any of `ENV_CHECKED` raises
`EnvMismatch` naming it, unless ``allow_env_mismatch=True`` (then `DiffResult.env_diff` lists it). CPU only.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from cublaslt_probe.errors import ProbeError
from cublaslt_probe.vocab import DIFF_TOLERANCE_PCT, ENV_KEYS, ENV_MATCH

log = logging.getLogger(__name__)

KEY = ["op", "dtype", "layout", "m", "n", "k", "batch"]
ENV_CHECKED = ENV_MATCH
ENV_REPORTED = ENV_MATCH + tuple(k for k in ENV_KEYS if k not in ENV_MATCH)
# per side: the kernel, its decoded fields (dataset columns) and the measurement
SIDE = ["backend", "key", "kernel", "family", "kernel_short", "tile_m", "tile_n", "tile_k", "stages",
        "cluster_m", "cluster_n", "split_k", "n_kernels", "time_us", "tflops", "error"]
STATUSES = ("changed", "same", "only_a", "only_b", "unmeasured")
SPEEDS = ("faster", "slower", "within")
# How two decoded names are compared for `change`: (label, fields).
_CHANGE_FIELDS = (("family", ("family",)), ("arch", ("arch",)),
                  ("types a/c/compute", ("a_type", "c_type", "compute_type")),
                  ("tile", ("tile_m", "tile_n")), ("k×stages", ("tile_k", "stages")),
                  ("cluster", ("cluster_m", "cluster_n")), ("splitK", ("split_k",)),
                  ("segment-K", ("segment_k",)), ("raster", ("raster",)), ("beta", ("beta",)),
                  ("layout", ("layout",)), ("swapAB", ("swap_ab",)), ("instruction", ("instruction_shape",)),
                  ("warpgroup", ("warpgroup_shape",)), ("warps", ("warp_shape",)), ("epilogue", ("epilogue",)))
_FLAGS_WITH_A_FIELD = {"splitK"}


class EnvMismatch(ProbeError):
    """The two datasets were captured in environments that differ where kernel choice depends on them."""


@dataclass
class DiffResult:
    """The joined rows (`joined`, one per GEMM in A or B), counts (`summary`) and both environments."""

    joined: pd.DataFrame
    summary: dict[str, int]
    env_a: dict
    env_b: dict
    env_diff: list[tuple[str, Any, Any]] = field(default_factory=list)
    label_a: str = "A"
    label_b: str = "B"
    backends: tuple[str | None, str | None] = (None, None)
    tolerance_pct: float = DIFF_TOLERANCE_PCT

    def changed(self) -> pd.DataFrame:
        """Rows whose kernel changed, the largest time change (either way) first."""
        return sort_rows(self.joined[self.joined["status"] == "changed"])


def dataset_env(df: pd.DataFrame) -> dict:
    """The environment of a dataset: ``df.attrs['env']``, completed from its rows' env columns."""
    env = dict(df.attrs.get("env") or {})
    for col in ENV_REPORTED:
        if env.get(col) in (None, "") and col in df and df[col].notna().any():
            vals = sorted(df[col].dropna().astype(str).unique())
            env[col] = vals[0] if len(vals) == 1 else ", ".join(vals)
    return env


def env_differences(env_a: dict, env_b: dict, keys=ENV_CHECKED) -> list[tuple[str, Any, Any]]:
    """[(key, value in A, value in B)] for the keys whose values differ (compared as text; absent = None)."""
    out = []
    for k in keys:
        a, b = env_a.get(k), env_b.get(k)
        if (None if a in (None, "") else str(a)) != (None if b in (None, "") else str(b)):
            out.append((k, a, b))
    return out


def _env_message(diffs, label_a: str, label_b: str) -> str:
    parts = [f"{k} {a if a not in (None, '') else '(unknown)'!s} in A vs {b if b not in (None, '') else '(unknown)'!s} "
             f"in B" for k, a, b in diffs]
    return (f"the datasets come from different environments: {'; '.join(parts)} (A = {label_a}, B = {label_b}). "
            "Kernel choice depends on these; pass --allow-env-mismatch to compare them anyway")


def _side(df: pd.DataFrame, backend: str | None) -> pd.DataFrame:
    d = df
    if backend is not None:
        have = sorted(df["backend"].dropna().astype(str).unique())
        if backend not in have:
            raise ProbeError(f"no rows with backend {backend!r}; backends there: {', '.join(have) or 'none'}")
        d = df[df["backend"].astype(str) == backend]
    cols = KEY + [c for c in SIDE if c in d.columns]
    out = d[cols].copy()
    for c in SIDE:
        if c not in out:
            out[c] = pd.NA
    for c in ("op", "dtype", "layout", "backend", "family"):
        out[c] = out[c].astype("string")
    for c in ("m", "n", "k", "batch"):
        out[c] = out[c].astype("Int64")
    return out


def diff(a: pd.DataFrame, b: pd.DataFrame, backends: tuple[str | None, str | None] | None = None, *,
         allow_env_mismatch: bool = False, tolerance_pct: float = DIFF_TOLERANCE_PCT, label_a: str = "A",
         label_b: str = "B") -> DiffResult:
    """Join datasets `a` and `b` and classify every GEMM (see the module docstring).

    `backends` = (backend of A, backend of B) compares those two backends (the join then ignores the
    backend); None joins on the backend too. `tolerance_pct`: a time change within ±tolerance counts as
    ``within`` (neither faster nor slower).
    """
    for name, d in (("A", a), ("B", b)):
        missing = [c for c in KEY + ["backend", "kernel", "time_us"] if c not in d.columns]
        if missing:
            raise ProbeError(f"dataset {name} lacks columns {missing}: is it a cublaslt-probe dataset "
                             "(`cublaslt-probe dataset ... -o X.parquet`)?")
    if tolerance_pct < 0:
        raise ProbeError(f"tolerance must be >= 0 %, got {tolerance_pct}")
    env_a, env_b = dataset_env(a), dataset_env(b)
    diffs = env_differences(env_a, env_b)
    if diffs and not allow_env_mismatch:
        raise EnvMismatch(_env_message(diffs, label_a, label_b))
    if diffs:
        log.warning("comparing across environments: %s",
                    "; ".join(f"{k} {x} vs {y}" for k, x, y in diffs))
    ba, bb = backends if backends is not None else (None, None)
    sa, sb = _side(a, ba), _side(b, bb)
    on = KEY if backends is not None else KEY + ["backend"]
    for name, s in (("A", sa), ("B", sb)):
        dup = s.duplicated(on)
        if dup.any():
            row = s[dup].iloc[0]
            raise ProbeError(f"dataset {name} has several rows for {', '.join(f'{c}={row[c]}' for c in on)}: "
                             "pass --backends to pick one backend per side")
    j = sa.merge(sb, on=on, how="outer", suffixes=("_a", "_b"), indicator=True)
    if backends is None:
        j["backend_a"] = j["backend"].where(j["_merge"] != "right_only")
        j["backend_b"] = j["backend"].where(j["_merge"] != "left_only")
        j = j.drop(columns=["backend"])
    j = _classify(j, tolerance_pct)
    j.attrs.update({"env_a": env_a, "env_b": env_b, "label_a": label_a, "label_b": label_b,
                    "backends": (ba, bb), "tolerance_pct": tolerance_pct})
    summary = summarize(j)
    log.info("diff %s vs %s: %d in both, %d changed kernels, %d only in A, %d only in B", label_a, label_b,
             summary["both"], summary["changed"], summary["only_a"], summary["only_b"])
    return DiffResult(j, summary, env_a, env_b, diffs, label_a, label_b, (ba, bb), tolerance_pct)


def _classify(j: pd.DataFrame, tol: float) -> pd.DataFrame:
    where = j.pop("_merge").astype(str)
    ka, kb = j["kernel_a"].astype("string"), j["kernel_b"].astype("string")
    measured = ka.notna() & kb.notna()
    status = np.select(
        [where.eq("left_only").to_numpy(), where.eq("right_only").to_numpy(), ~measured.to_numpy(),
         (ka != kb).fillna(False).to_numpy(dtype=bool)],
        ["only_a", "only_b", "unmeasured", "changed"], default="same")
    j.insert(0, "status", pd.Categorical(status, categories=list(STATUSES)))
    ta = j["time_us_a"].astype("Float64")
    tb = j["time_us_b"].astype("Float64")
    j["time_change_pct"] = (100 * (tb / ta - 1)).astype("Float64")
    fa = j["tflops_a"].astype("Float64")
    fb = j["tflops_b"].astype("Float64")
    j["tflops_change_pct"] = (100 * (fb / fa - 1)).astype("Float64")
    ch = j["time_change_pct"]
    speed = np.select([(ch < -tol).fillna(False).to_numpy(dtype=bool), (ch > tol).fillna(False).to_numpy(dtype=bool),
                       ch.notna().to_numpy()], ["faster", "slower", "within"], default="")
    j["speed"] = pd.Categorical(np.where(speed == "", None, speed), categories=list(SPEEDS))
    j["change"] = pd.array([kernel_change(a, b) if s == "changed" else None
                            for a, b, s in zip(ka, kb, status)], dtype="string")
    order = (["status", "change", "speed", "time_change_pct", "tflops_change_pct"] + KEY
             + ["backend_a", "backend_b"]
             + [f"{c}_{s}" for c in SIDE if c != "backend" for s in ("a", "b")])
    return j[order].reset_index(drop=True)


def kernel_change(a: str | None, b: str | None) -> str | None:
    """What differs between two kernel names, as decoded: ``tile 128x128→256x128; k×stages 64x4→64x6``.

    Flags show as ``flags +coopA -coopB``; when no decoded field differs, the function or template
    arguments that do (``gemv2T_kernel_val→gemvx::kernel``, ``template arg 11: 9→7``), else ``name``."""
    if a is None or b is None or pd.isna(a) or pd.isna(b) or a == b:
        return None
    from cublaslt_probe.names import decode
    ka, kb = decode(str(a)), decode(str(b))
    parts = []
    for label, fields in _CHANGE_FIELDS:
        va = tuple(getattr(ka, f) for f in fields)
        vb = tuple(getattr(kb, f) for f in fields)
        if label.startswith("types"):   # a type one name does not write is no difference
            if all(x is None or y is None or x == y for x, y in zip(va, vb)):
                continue
            va, vb = ("/".join(str(x or "?") for x in va),), ("/".join(str(x or "?") for x in vb),)
        if va != vb:
            parts.append(f"{label} {_show(va)}→{_show(vb)}")
    fa, fb = set(ka.flags) - _FLAGS_WITH_A_FIELD, set(kb.flags) - _FLAGS_WITH_A_FIELD
    if fa != fb:
        parts.append("flags " + " ".join([f"+{f}" for f in sorted(fb - fa)] + [f"-{f}" for f in sorted(fa - fb)]))
    if parts:
        return "; ".join(parts)
    la, lb = kernel_label(str(a)), kernel_label(str(b))
    if la != lb:
        return f"{la}→{lb}"
    ta, tb = ka.template_args, kb.template_args
    if ta != tb and len(ta) == len(tb):
        return "; ".join(f"template arg {i}: {x}→{y}" for i, (x, y) in enumerate(zip(ta, tb)) if x != y)
    return "name"


def kernel_label(name: str | None) -> str | None:
    """A short label for tables: the decoded compact form (``256x128 · 64x4 · 1x2 · coopA``) when the name
    writes a tile, else the function (``gemv2T_kernel_val``, ``gemvx::kernel``)."""
    if name is None or pd.isna(name):
        return None
    from cublaslt_probe.names import decode
    kn = decode(str(name))
    if kn.tile_m is not None or kn.tile_k is not None or kn.stages is not None:
        return kn.short
    parts = (kn.base or kn.name).split("::")
    return "::".join(parts[-2:]) if parts[-1] == "kernel" and len(parts) > 1 else parts[-1]


def _show(v: tuple) -> str:
    if all(x is None for x in v):
        return "-"
    if len(v) == 1:
        x = v[0]
        if isinstance(x, bool):
            return "yes" if x else "no"
        if isinstance(x, tuple):
            return "x".join(map(str, x)) or "-"
        return str(x)
    return "x".join("?" if x is None else str(x) for x in v)


def summarize(j: pd.DataFrame) -> dict[str, int]:
    """Counts: rows per status, B faster / slower / within tolerance (all measured, and among the changed)."""
    st = j["status"].astype(str)
    sp = j["speed"].astype(str)
    out = {s: int((st == s).sum()) for s in STATUSES}
    out["rows_a"] = int(len(j) - out["only_b"])
    out["rows_b"] = int(len(j) - out["only_a"])
    out["both"] = int(out["changed"] + out["same"] + out["unmeasured"])
    for s in SPEEDS:
        out[s] = int((sp == s).sum())
        out[f"changed_{s}"] = int(((sp == s) & (st == "changed")).sum())
    return out


def sort_rows(j: pd.DataFrame) -> pd.DataFrame:
    """Largest |time change| first; rows without a time change last, in key order."""
    mag = j["time_change_pct"].astype("Float64").abs().fillna(-1)
    return j.assign(_mag=mag).sort_values(["_mag"] + KEY, ascending=[False] + [True] * len(KEY),
                                          kind="stable").drop(columns="_mag").reset_index(drop=True)


def diff_files(path_a: str | os.PathLike, path_b: str | os.PathLike,
               backends: tuple[str | None, str | None] | None = None, *, allow_env_mismatch: bool = False,
               tolerance_pct: float = DIFF_TOLERANCE_PCT, filters: dict[str, list] | None = None) -> DiffResult:
    """`diff` of two Parquet datasets (`cublaslt_probe.analysis.dataset.read_parquet`); the same path twice is read
    once.

    `filters` (column -> allowed values, e.g. ``{"dtype": ["bf16"]}``) keeps only matching rows of both."""
    from cublaslt_probe.analysis.dataset import read_parquet
    a = read_parquet(path_a)
    b = a if os.path.abspath(path_a) == os.path.abspath(path_b) else read_parquet(path_b)
    if filters:
        a, b = _filter(a, filters, "A"), (_filter(b, filters, "B") if b is not a else None)
        b = a if b is None else b
    la, lb = str(path_a), str(path_b)
    if backends is not None:
        la, lb = f"{la} [{backends[0]}]", f"{lb} [{backends[1]}]"
    return diff(a, b, backends, allow_env_mismatch=allow_env_mismatch, tolerance_pct=tolerance_pct,
                label_a=la, label_b=lb)


def _filter(df: pd.DataFrame, filters: dict[str, list], name: str) -> pd.DataFrame:
    out = df
    for col, vals in filters.items():
        if not vals:
            continue
        if col not in df:
            raise ProbeError(f"dataset {name} has no column {col!r} to filter on")
        want = {str(v) for v in vals}
        out = out[out[col].astype(str).isin(want)]
        if out.empty:
            have = sorted(df[col].dropna().astype(str).unique())
            raise ProbeError(f"no rows in dataset {name} with {col} in {sorted(want)}; {col} values there: "
                             f"{', '.join(have)}")
    out = out.copy()
    out.attrs = dict(df.attrs)
    return out


def map_sides(joined_df: pd.DataFrame, backend: str | None = None) -> tuple[pd.DataFrame, pd.DataFrame, str, str]:
    """The two sides of a diff as datasets a path-difference map compares (`render.plots.diff_map` draws it):
    (side A, side B, A's backend, B's backend), each side one row per GEMM with the dataset's columns and its
    environment and label in ``attrs``. Without backends in the diff, `backend` picks the one to map (default
    torch, else the most common)."""
    j = joined_df
    backends = j.attrs.get("backends") or (None, None)
    if backends[0] is not None:
        ba, bb = backends
        if backend is not None:
            raise ProbeError("this diff compares two backends already (--backends): drop --backend")
    else:
        have = pd.concat([j["backend_a"], j["backend_b"]]).dropna().astype(str)
        if have.empty:
            raise ProbeError("nothing to map: no rows")
        ba = bb = backend or ("torch" if "torch" in set(have) else have.value_counts().index[0])
    side_a = _side_frame(j, "a", ba)
    side_b = _side_frame(j, "b", bb)
    side_a.attrs = {"env": j.attrs.get("env_a", {}), "source": j.attrs.get("label_a", "A")}
    side_b.attrs = {"env": j.attrs.get("env_b", {}), "source": j.attrs.get("label_b", "B")}
    return side_a, side_b, ba, bb


def _side_frame(j: pd.DataFrame, s: str, backend: str) -> pd.DataFrame:
    present = j[f"backend_{s}"].astype("string") == backend if f"backend_{s}" in j else None
    rows = j[present.fillna(False).to_numpy(dtype=bool)] if present is not None else j
    rows = rows[rows["status"].astype(str) != ("only_b" if s == "a" else "only_a")]
    out = rows[KEY].copy()
    out["backend"] = backend
    for c in SIDE:
        if c != "backend":
            out[c] = rows[f"{c}_{s}"].to_numpy()
    return out.reset_index(drop=True)
