"""Records → pandas: one row per record (`records_to_frame`), one row per distinct GEMM (`summarize`, and
`Summary`, which counts them as records stream by)."""
from __future__ import annotations

import json
from operator import attrgetter
from typing import Iterable

import pandas as pd

from cublaslt_probe.logs.record import CATEGORY_COLUMNS, FIELD_NAMES, INT_COLUMNS, SUMMARY_KEYS, LogRecord


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
    df["beta_value"] = pd.array(df["beta_value"].tolist(), dtype="Float64")
    df["out_of_place"] = pd.array(df["out_of_place"].tolist(), dtype="boolean")
    df["message"] = df["message"].astype(object)
    df["extra"] = [json.dumps(e, separators=(",", ":")) for e in df["extra"]]
    return df


def summarize(df: pd.DataFrame | Iterable[LogRecord]) -> pd.DataFrame:
    """Identical GEMMs (same function, types, transposes, m n k, batch, epilogue and algo) with counts.

    Columns: ``count``, ``share`` (fraction of all rows), the key columns, the torch view
    (``torch_m``, ``torch_n``, ``torch_k``), ``known_issue`` (the config's, `logs.issues`), ``pids`` (distinct
    processes), ``first_file`` and
    ``first_line`` (where it first appears). Sorted by count, descending; ties in order of appearance.
    """
    if not isinstance(df, pd.DataFrame):  # records: counted as they stream by (flat memory)
        acc = Summary()
        for r in df:
            acc.add(r)
        return acc.frame()
    keys = list(SUMMARY_KEYS)
    out_cols = ["count", "share", *keys, "torch_m", "torch_n", "torch_k", "known_issue", "pids", "first_file",
                "first_line"]
    if df.empty:
        return pd.DataFrame({c: pd.Series([], dtype=df[c].dtype if c in df else object)
                             for c in out_cols})
    work = df.reset_index(drop=True)
    work["_order"] = range(len(work))
    g = work.groupby(keys, dropna=False, observed=True, sort=False)
    agg = g.agg(count=("_order", "size"), _first=("_order", "min"),
                pids=("pid", "nunique")).reset_index()
    firsts = work.loc[agg["_first"].to_numpy(), ["torch_m", "torch_n", "torch_k", "known_issue", "file", "line"]]
    firsts = firsts.reset_index(drop=True)
    agg["torch_m"] = firsts["torch_m"]
    agg["torch_n"] = firsts["torch_n"]
    agg["torch_k"] = firsts["torch_k"]
    agg["known_issue"] = firsts["known_issue"].astype(object)
    agg["first_file"] = firsts["file"].astype(object)
    agg["first_line"] = firsts["line"]
    agg["share"] = agg["count"] / len(work)
    agg = agg.sort_values(["count", "_first"], ascending=[False, True], kind="stable")
    agg["pids"] = agg["pids"].astype("Int64")
    return agg[out_cols].reset_index(drop=True)


# --- the running summary --------------------------------------------------------------------------------

class Summary:
    """Identical GEMMs (`SUMMARY_KEYS`: function, types, transposes, m n k, batch, epilogue, algo) counted
    as records stream by: memory grows with the distinct GEMMs, not with the records."""

    def __init__(self):
        self._key = attrgetter(*SUMMARY_KEYS)
        self._groups: dict = {}  # key -> [count, order, first record, pids]
        self.total = 0

    def add(self, r: LogRecord) -> None:
        k = self._key(r)
        g = self._groups.get(k)
        if g is None:
            self._groups[k] = [1, self.total, r, {r.pid}]
        else:
            g[0] += 1
            if len(g[3]) < 65536:
                g[3].add(r.pid)
        self.total += 1

    def frame(self):
        """The summary as `summarize` returns it: count, share, the key columns, the torch view, known_issue, pids,
        first_file, first_line; most frequent first, ties in order of appearance."""
        groups = sorted(self._groups.values(), key=lambda g: (-g[0], g[1]))
        df = records_to_frame([g[2] for g in groups])
        out = pd.DataFrame({"count": pd.array([g[0] for g in groups], dtype="int64"),
                            "share": [g[0] / self.total for g in groups] if groups else []})
        for c in SUMMARY_KEYS + ("torch_m", "torch_n", "torch_k"):
            out[c] = df[c].reset_index(drop=True)
        out["known_issue"] = df["known_issue"].astype(object).reset_index(drop=True)
        out["pids"] = pd.array([len(g[3] - {None}) for g in groups], dtype="Int64")
        out["first_file"] = df["file"].astype(object).reset_index(drop=True)
        out["first_line"] = df["line"].reset_index(drop=True)
        return out
