"""An Nsight Systems SQLite export (``nsys export --type sqlite``) read into the same `TraceSummary` as a
Chrome trace, through the stdlib sqlite3: table ``CUPTI_ACTIVITY_KIND_KERNEL`` (``start``, ``end`` in ns,
``demangledName`` / ``shortName`` ids into ``StringIds``). UNTESTED on a real export: nsys cannot write
reports on the machine the project's captures come from, so it is tested only on a file built with the
documented schema. The export has no torch op shapes: ``op`` and the problem columns are null."""
from __future__ import annotations

import logging
import os
import sqlite3
import time

import pandas as pd

from cublaslt_probe.analysis.trace.rows import finish
from cublaslt_probe.analysis.trace.schema import TraceStats, TraceSummary, kernel_kind
from cublaslt_probe.analysis.trace.timeline import families, timeline_frame
from cublaslt_probe.errors import ProbeError

log = logging.getLogger("cublaslt_probe.analysis.trace")

_NSYS_KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"


def read_nsys_sqlite(path: str | os.PathLike) -> TraceSummary:
    """Summarise the GEMM-kind kernels of an Nsight Systems SQLite export.

    UNTESTED on a real export (see the module docstring). Reads ``CUPTI_ACTIVITY_KIND_KERNEL``
    (``start``/``end`` ns, ``demangledName`` else ``shortName`` ids into ``StringIds``, ``deviceId``,
    ``streamId`` when present). The export has no torch op shapes: ``op`` and the problem columns are null.
    """
    t0 = time.perf_counter()
    stats = TraceStats(path=str(path), format="nsys")
    try:
        stats.file_bytes = stats.bytes_read = os.path.getsize(path)
        con = sqlite3.connect(f"file:{os.fspath(path)}?mode=ro", uri=True)
    except (OSError, sqlite3.Error) as e:
        raise ProbeError(f"cannot read Nsight Systems export {path}: {e}") from e
    try:
        return _read_nsys(con, path, stats, t0)
    except sqlite3.DatabaseError as e:
        raise ProbeError(f"{path}: not a readable Nsight Systems SQLite export ({e})") from e
    finally:
        con.close()


def _read_nsys(con: sqlite3.Connection, path, stats: TraceStats, t0: float) -> TraceSummary:
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")}
    for t in (_NSYS_KERNEL, "StringIds"):
        if t not in tables:
            raise ProbeError(f"{path}: no table {t} in this SQLite file; export the report with "
                             "`nsys export --type sqlite REPORT.nsys-rep` from a capture that traced CUDA "
                             "(`nsys profile --trace cuda ...`)")
    cols = {r[1] for r in con.execute(f"PRAGMA table_info({_NSYS_KERNEL})")}
    name_cols = [c for c in ("demangledName", "shortName", "mangledName") if c in cols]
    missing = [c for c in ("start", "end") if c not in cols]
    if missing or not name_cols:
        raise ProbeError(f"{path}: {_NSYS_KERNEL} lacks columns "
                         f"{missing + ([] if name_cols else ['demangledName or shortName'])}")
    name_expr = "COALESCE(" + ", ".join(f"k.{c}" for c in name_cols) + ")" if len(name_cols) > 1 \
        else f"k.{name_cols[0]}"
    dev = "k.deviceId" if "deviceId" in cols else "0"
    stream = "k.streamId" if "streamId" in cols else "0"
    per_name: dict[str, list] = {}
    kind_cache: dict[str, int] = {}
    gemm_ids: list[int] = []
    for sid, value, n, total in con.execute(
            f"SELECT {name_expr} AS sid, s.value, COUNT(*), SUM(k.end - k.start) FROM {_NSYS_KERNEL} k "
            "LEFT JOIN StringIds s ON s.id = " + name_expr + " GROUP BY sid"):
        name = value if value is not None else f"<string id {sid}>"
        per_name[name] = [n, (total or 0) / 1e3]
        stats.kernels += n
        stats.gpu_time_us += (total or 0) / 1e3
        if kernel_kind(name, kind_cache) and sid is not None:
            gemm_ids.append(sid)
    stats.events = stats.kernels
    agg: dict[str, list] = {}
    if gemm_ids:
        con.execute("CREATE TEMP TABLE _gemm_ids(id INTEGER PRIMARY KEY)")
        con.executemany("INSERT INTO _gemm_ids VALUES (?)", [(i,) for i in gemm_ids])
        q = (f"SELECT {dev}, {stream}, k.start, k.end, s.value FROM {_NSYS_KERNEL} k "
             f"JOIN StringIds s ON s.id = {name_expr} WHERE {name_expr} IN (SELECT id FROM _gemm_ids) "
             f"ORDER BY {dev}, {stream}, k.start")
        agg = _gemm_groups(con.execute(q), stats, kind_cache)
    groups = pd.DataFrame([(name, -1, *a) for name, a in agg.items()],
                          columns=["kernel", "op", "count", "total_us", "min_us", "max_us", "reduce_us"])
    out = finish(groups, [None] * len(groups), stats)
    stats.seconds = time.perf_counter() - t0
    log.info("%s", stats.line())
    timeline = timeline_frame(per_name, stats.gpu_time_us)
    return TraceSummary(out, stats.gpu_time_us, stats, {}, families(timeline), timeline)


def _gemm_groups(launches, stats: TraceStats, kind_cache: dict) -> dict[str, list]:
    """The GEMM and reduce launches (device, stream, start, end, name), in (device, stream, start) order,
    grouped by kernel name: [count, total µs, min, max, reduce µs]; each reduce is counted with the GEMM
    launched before it on its stream (an orphan reduce is a row of its own)."""
    agg: dict[str, list] = {}
    last: dict[tuple, list] = {}    # (dev, stream) -> the latest GEMM launch [name, dur, reduce]

    def close(entry):
        name, d, r = entry
        t = d + r
        a = agg.get(name)
        if a is None:
            agg[name] = [1, t, t, t, r]
        else:
            a[0] += 1
            a[1] += t
            a[2] = min(a[2], t)
            a[3] = max(a[3], t)
            a[4] += r

    for d, st, start, end, name in launches:
        dur = (end - start) / 1e3
        key = (d, st)
        prev = last.get(key)
        if kernel_kind(name, kind_cache) == 1:
            stats.gemm_launches += 1
            if prev is not None:
                close(prev)
            last[key] = [name, dur, 0.0]
        else:
            stats.reduce_launches += 1
            if prev is not None:
                prev[2] += dur
                stats.reduce_attached += 1
            else:
                close([name, dur, 0.0])
    for entry in last.values():
        close(entry)
    return agg
