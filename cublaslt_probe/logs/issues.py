"""Known issues of logged algo configs: `known_issues.match` applied to log records.

A record with a logged algo (a trace line: `algo_id` set) is one config: its algo id, numSplitsK (absent from
the line means no split-K: 1), stages id, cuBLAS K and function (a grouped matmul's name says so). Records
without an algo (heuristic queries, info lines) are left alone. The environment (`cublas` version, `cc`)
comes from the caller: a log line does not carry it.
"""
from __future__ import annotations

import os
from typing import Iterable, Iterator

from cublaslt_probe import known_issues
from cublaslt_probe.logs.record import LogRecord


def record_config(r: LogRecord) -> dict | None:
    """The config `known_issues.match` reads, from one record; None when the record logs no algo."""
    if r.algo_id is None:
        return None
    return {"algo_id": r.algo_id, "split_k": r.num_splits_k if r.num_splits_k is not None else 1,
            "stages": r.algo_stages, "k": r.k, "grouped": "grouped" in (r.function or "").lower(),
            "dtype": r.dtypes["a"]}


def record_label(r: LogRecord | None, *, kernel: str | None = None, cublas: str | None = None,
                 cc: str | None = None) -> str | None:
    """`known_issues.label` of one record's config (with the kernel that ran, when known: its name can carry the
    stage size); None for no record or a record without an algo."""
    cfg = record_config(r) if r is not None else None
    if cfg is None:
        return None
    return known_issues.label({**cfg, "kernel": kernel}, cublas=cublas, cc=cc)


def annotate(records: Iterable[LogRecord], *, cublas: str | None = None, cc: str | None = None) -> Iterator[LogRecord]:
    """Set `known_issue` on each record with an algo (`record_label`), passing every record on. The label of a
    config is computed once, keyed by what `record_config` reads (a log repeats its GEMMs; its pointers change)."""
    memo: dict = {}
    for r in records:
        if r.algo_id is not None:
            key = (r.algo_id, r.num_splits_k, r.algo_stages, r.k, r.function, r.a_type)
            got = memo.get(key, memo)
            if got is memo:
                got = memo[key] = record_label(r, cublas=cublas, cc=cc)
            r.known_issue = got
        yield r


class IssueCount:
    """Counts the records of each known-issue label as they stream by (`count`); `notes()` says them, one line
    each, with the first line numbers, for the person reading the output's stderr."""

    def __init__(self, max_lines: int = 5):
        self.by_label: dict[str, list] = {}   # label -> [count, first (file, line)s]
        self.max_lines = max_lines

    def count(self, records: Iterable[LogRecord]) -> Iterator[LogRecord]:
        for r in records:
            if r.known_issue:
                got = self.by_label.setdefault(r.known_issue, [0, []])
                got[0] += 1
                if len(got[1]) < self.max_lines:
                    got[1].append(f"{os.path.basename(r.file)}:{r.line}" if r.file else str(r.line))
            yield r

    def notes(self) -> list[str]:
        return [f"known issue: {n:,} record{'s' if n != 1 else ''} ({'at ' if n == 1 else ''}"
                f"{', '.join(where)}{', ...' if n > len(where) else ''}): {label}"
                for label, (n, where) in self.by_label.items()]
