"""Records → pandas: one row per record (`records_to_frame`), one row per distinct GEMM (`summarize`)."""
from __future__ import annotations

import json
from operator import attrgetter
from typing import Iterable

import pandas as pd

from cublaslt_probe.logs.record import ALGO_FIELDS, FIELD_NAMES, PROBLEM_FIELDS, LogRecord

INT_COLUMNS = ("line", "pid", "level", "m", "n", "k", "lda", "ldb", "ldc", "ldd", "batch_count",
               "algo_id", "split_k", "custom_option", "cta_swizzling", "workspace_bytes",
               "sm_count_target", "torch_m", "torch_n", "torch_k")
CATEGORY_COLUMNS = ("kind", "function", "a_type", "b_type", "c_type", "d_type", "compute_type",
                    "scale_type", "trans_a", "trans_b", "epilogue", "tile", "stages", "cluster",
                    "reduction_scheme", "source")


def records_to_frame(records: Iterable[LogRecord]) -> pd.DataFrame:
    """One row per record, columns named as the record fields (see docs/logs.md).

    Integer columns are nullable ``Int64``, repeated strings ``category``, ``time`` is ``datetime64``,
    ``out_of_place`` ``boolean`` and ``extra`` a JSON object string (so the frame writes to CSV/Parquet).
    """
    get = attrgetter(*FIELD_NAMES)
    rows = [get(r) for r in records]
    df = pd.DataFrame.from_records(rows, columns=list(FIELD_NAMES)) if rows else \
        pd.DataFrame({name: pd.Series([], dtype=object) for name in FIELD_NAMES})
    for col in INT_COLUMNS:
        df[col] = pd.array(df[col].tolist(), dtype="Int64")
    for col in CATEGORY_COLUMNS:
        df[col] = df[col].astype("category")
    df["time"] = pd.to_datetime(df["time"], format="ISO8601", errors="coerce")
    df["beta"] = pd.array(df["beta"].tolist(), dtype="Float64")
    df["out_of_place"] = pd.array(df["out_of_place"].tolist(), dtype="boolean")
    df["message"] = df["message"].astype(object)
    df["extra"] = [json.dumps(e, separators=(",", ":")) for e in df["extra"]]
    return df


SUMMARY_KEYS = PROBLEM_FIELDS + ALGO_FIELDS


def summarize(df: pd.DataFrame | Iterable[LogRecord]) -> pd.DataFrame:
    """Identical GEMMs (same function, types, transposes, m n k, batch, epilogue and algo) with counts.

    Columns: ``count``, ``share`` (fraction of all rows), the key columns, the torch view
    (``torch_m``, ``torch_n``, ``torch_k``), ``pids`` (distinct processes), ``first_source`` and
    ``first_line`` (where it first appears). Sorted by count, descending; ties in order of appearance.
    """
    if not isinstance(df, pd.DataFrame):
        df = records_to_frame(df)
    keys = list(SUMMARY_KEYS)
    out_cols = ["count", "share", *keys, "torch_m", "torch_n", "torch_k", "pids", "first_source",
                "first_line"]
    if df.empty:
        return pd.DataFrame({c: pd.Series([], dtype=df[c].dtype if c in df else object)
                             for c in out_cols})
    work = df.reset_index(drop=True)
    work["_order"] = range(len(work))
    g = work.groupby(keys, dropna=False, observed=True, sort=False)
    agg = g.agg(count=("_order", "size"), _first=("_order", "min"),
                pids=("pid", "nunique")).reset_index()
    firsts = work.loc[agg["_first"].to_numpy(), ["torch_m", "torch_n", "torch_k", "source", "line"]]
    firsts = firsts.reset_index(drop=True)
    agg["torch_m"] = firsts["torch_m"]
    agg["torch_n"] = firsts["torch_n"]
    agg["torch_k"] = firsts["torch_k"]
    agg["first_source"] = firsts["source"].astype(object)
    agg["first_line"] = firsts["line"]
    agg["share"] = agg["count"] / len(work)
    agg = agg.sort_values(["count", "_first"], ascending=[False, True], kind="stable")
    agg["pids"] = agg["pids"].astype("Int64")
    return agg[out_cols].reset_index(drop=True)


# --- text tables for people ---------------------------------------------------------------------------

def _s(v) -> str:
    if v is None or v is pd.NA:
        return ""
    try:
        if pd.isna(v):
            return ""
    except (TypeError, ValueError):
        pass
    return str(v)


def _types(row) -> str:
    """``bf16 bf16→bf16 fp32`` style: A B → D, then compute type (C shown when it differs from D)."""
    from cublaslt_probe.logs.record import short_dtype
    a, b = short_dtype(_s(row["a_type"]) or None), short_dtype(_s(row["b_type"]) or None)
    c, d = short_dtype(_s(row["c_type"]) or None), short_dtype(_s(row["d_type"]) or None)
    comp = short_dtype(_s(row["compute_type"]) or None)
    if not any((a, b, c, d, comp)):
        return ""
    out = f"{a or '?'},{b or '?'}->{d or '?'}"
    if c and c != d:
        out += f" C={c}"
    return out + (f" {comp}" if comp else "")


def _algo(row) -> str:
    if _s(row["algo_id"]) == "":
        return ""
    parts = [f"{_s(row['algo_id'])}"]
    for col in ("tile", "stages", "cluster"):
        v = _s(row[col])
        parts.append("-" if v in ("", "UNDEFINED", "AUTO") else v)  # the enum's zero: not set
    sk = _s(row["split_k"])
    parts.append(f"sk{sk}" if sk else "-")
    co = _s(row["custom_option"])
    parts.append(f"co{co}" if co else "-")
    return " ".join(parts)


def _epilogue(row) -> str:
    e = _s(row["epilogue"])
    return e[len("EPILOGUE_"):] if e.startswith("EPILOGUE_") else e


def _render(headers: list[str], rows: list[list[str]], right: set[str]) -> str:
    widths = [len(h) for h in headers]
    for r in rows:
        for i, cell in enumerate(r):
            if len(cell) > widths[i]:
                widths[i] = len(cell)

    def fmt(cells):
        out = []
        for h, w, cell in zip(headers, widths, cells):
            out.append(cell.rjust(w) if h in right else cell.ljust(w))
        return "  ".join(out).rstrip()

    return "\n".join([fmt(headers), fmt(["-" * w for w in widths])] + [fmt(r) for r in rows]) + "\n"


def format_records(df: pd.DataFrame) -> str:
    """The records as a text table: where, what (types, transposes, m n k) and the algo chosen."""
    multi = df["source"].nunique(dropna=True) > 1 if len(df) else False
    api = len(df) and (df["kind"].astype(object) != "trace").any()
    headers = (["source"] if multi else []) + ["line", "pid"] + (["kind"] if api else []) + \
        ["function", "types", "op", "m", "n", "k", "batch", "epilogue",
         "algo tile stages cluster splitK customOpt", "workspace"]
    rows = []
    for _, r in df.iterrows():
        ta, tb = _s(r["trans_a"]), _s(r["trans_b"])
        row = ([_basename(_s(r["source"]))] if multi else []) + [_s(r["line"]), _s(r["pid"])] + \
            ([_s(r["kind"])] if api else []) + \
            [_s(r["function"]), _types(r), f"{ta}{tb}", _s(r["m"]), _s(r["n"]), _s(r["k"]),
             _s(r["batch_count"]), _epilogue(r), _algo(r), _s(r["workspace_bytes"])]
        rows.append(row)
    return _render(headers, rows, {"line", "pid", "m", "n", "k", "batch", "workspace"})


def format_summary(summary: pd.DataFrame) -> str:
    """`summarize`'s frame as a text table, most frequent GEMM first, with the torch (row-major) view."""
    headers = ["count", "share", "function", "types", "op", "m", "n", "k", "batch", "epilogue",
               "algo tile stages cluster splitK customOpt", "torch MxNxK"]
    rows = []
    for _, r in summary.iterrows():
        torch_view = ""
        if _s(r["torch_m"]):
            torch_view = f"{_s(r['torch_m'])}x{_s(r['torch_n'])}x{_s(r['torch_k'])}"
        rows.append([_s(r["count"]), f"{100 * r['share']:.1f}%", _s(r["function"]), _types(r),
                     f"{_s(r['trans_a'])}{_s(r['trans_b'])}", _s(r["m"]), _s(r["n"]), _s(r["k"]),
                     _s(r["batch_count"]), _epilogue(r), _algo(r), torch_view])
    return _render(headers, rows, {"count", "share", "m", "n", "k", "batch"})


def _basename(path: str) -> str:
    import os
    return os.path.basename(path) if path else path
