"""An Nsight Systems SQLite export (``nsys export --type sqlite``) read into the same `TraceSummary` as a
Chrome trace, through the stdlib sqlite3: table ``CUPTI_ACTIVITY_KIND_KERNEL`` (``start``, ``end`` in ns,
``demangledName`` / ``shortName`` ids into ``StringIds``), with the Chrome reader's rules for its values
(`collect`): a row that repeats another exactly is counted once, a duration that is missing, not a number or
negative counts 0 µs, and so does one longer than the trace. UNTESTED on a real export: nsys cannot write
reports on the machine the project's captures come from, so it is tested only on files the tests build with
the documented schema. The export has no torch op shapes: ``op`` and the problem columns are null; it is read
for `trace` only (no step or module ranges)."""
from __future__ import annotations

import logging
import os
import sqlite3
import time
from array import array

import numpy as np
import pandas as pd

from cublaslt_probe.analysis.trace.collect import repeats, too_long, valid_duration
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
    cols = [r[1] for r in con.execute(f"PRAGMA table_info({_NSYS_KERNEL})")]
    name_cols = [c for c in ("demangledName", "shortName", "mangledName") if c in cols]
    missing = [c for c in ("start", "end") if c not in cols]
    if missing or not name_cols:
        raise ProbeError(f"{path}: {_NSYS_KERNEL} lacks columns "
                         f"{missing + ([] if name_cols else ['demangledName or shortName'])}")
    strings = dict(con.execute("SELECT id, value FROM StringIds"))
    ev = _kernel_rows(con, cols, name_cols, strings, stats)
    kind_cache: dict[str, int] = {}
    names = ev["names"]
    kind = np.array([kernel_kind(n, kind_cache) for n in names], dtype=np.int8)
    dup = repeats(ev["hash"], np.zeros(len(ev["hash"]), np.int64), None) if len(ev["hash"]) else \
        np.zeros(0, dtype=bool)
    ts, dur = ev["ts"], ev["dur"]
    starts = ts[~np.isnan(ts)]
    long, span = (too_long(ts, dur, dup, float(starts.min()), float(starts.max())) if len(starts)
                  else (np.zeros(len(dur), dtype=bool), 0.0))
    for i in np.flatnonzero(long).tolist()[:3]:
        log.warning("%s: %r lasts %g µs, longer than the trace (%g µs): counted, with 0 µs", path,
                    names[ev["name"][i]][:80], dur[i], span)
    stats.duplicate_events, stats.duplicate_us = int(dup.sum()), float(dur[dup].sum())
    stats.bad_durations += int(long.sum())
    stats.long_durations = int(long.sum())
    dur[long] = 0.0
    kept = ~dup
    name = ev["name"]
    count = np.bincount(name[kept], minlength=len(names))
    total = np.bincount(name[kept], weights=dur[kept], minlength=len(names))
    per_name = {n: [int(count[i]), float(total[i])] for i, n in enumerate(names) if count[i]}
    stats.kernels = int(kept.sum())
    stats.gpu_time_us = float(dur[kept].sum())
    g = np.flatnonzero(kept & (kind[name] > 0))
    g = g[np.lexsort((np.nan_to_num(ts[g], nan=np.inf), ev["stream"][g], ev["dev"][g]))]
    agg = _gemm_groups(((ev["dev"][i], ev["stream"][i], dur[i], names[name[i]]) for i in g.tolist()), stats,
                       kind_cache)
    groups = pd.DataFrame([(n, -1, *a) for n, a in agg.items()],
                          columns=["kernel", "op", "count", "total_us", "min_us", "max_us", "reduce_us"])
    out = finish(groups, [None] * len(groups), stats)
    stats.seconds = time.perf_counter() - t0
    log.info("%s", stats.line())
    timeline = timeline_frame(per_name, stats.gpu_time_us)
    return TraceSummary(out, stats.gpu_time_us, stats, {}, families(timeline), timeline)


def _number(v) -> float:
    """A start or end as stored (an integer, a real, a number written as text), else NaN."""
    if type(v) is int or type(v) is float:
        return float(v)
    try:
        return float(v)
    except (TypeError, ValueError, OverflowError):
        return float("nan")


def _kernel_rows(con: sqlite3.Connection, cols: list, name_cols: list, strings: dict, stats: TraceStats) -> dict:
    """Every row of the kernel table as arrays: ``hash`` (of the whole row: two rows alike are one launch
    exported twice), ``name`` (index into ``names``: the first of `name_cols` set, looked up in `strings`),
    ``ts`` (start, µs; NaN when not a number), ``dur`` (µs: `valid_duration`, else 0 and counted in
    ``stats.bad_durations``), ``dev``, ``stream``."""
    at = {c: i for i, c in enumerate(cols)}
    i_start, i_end = at["start"], at["end"]
    i_names = [at[c] for c in name_cols]
    i_dev, i_stream = at.get("deviceId"), at.get("streamId")
    index: dict = {}
    names: list[str] = []
    h, nm, ts, dur, dev, stream = array("q"), array("i"), array("d"), array("d"), array("q"), array("q")
    for row in con.execute(f"SELECT * FROM {_NSYS_KERNEL}"):
        stats.events += 1
        h.append(hash(row))
        sid = next((row[i] for i in i_names if row[i] is not None), None)
        n = strings.get(sid) if type(sid) is int else None
        n = n if type(n) is str else f"<string id {sid}>"
        k = index.get(n)
        if k is None:
            k = index[n] = len(names)
            names.append(n)
        nm.append(k)
        start, end = _number(row[i_start]), _number(row[i_end])
        ts.append(start / 1e3)
        d = valid_duration((end - start) / 1e3)
        if d is None:
            stats.bad_durations += 1
            if stats.bad_durations <= 3:
                log.warning("%s: kernel %r has no valid duration (start %r, end %r): counted, with 0 µs",
                            stats.path, n[:80], row[i_start], row[i_end])
            d = 0.0
        elif d == 0.0:
            stats.zero_durations += 1
        dur.append(d)
        dev.append(_int(row[i_dev]) if i_dev is not None else 0)
        stream.append(_int(row[i_stream]) if i_stream is not None else 0)
    return {"hash": np.array(h, dtype=np.int64), "name": np.array(nm, dtype=np.int64), "names": names,
            "ts": np.array(ts, dtype=np.float64), "dur": np.array(dur, dtype=np.float64),
            "dev": np.array(dev, dtype=np.int64), "stream": np.array(stream, dtype=np.int64)}


def _int(v) -> int:
    """A device or stream id as stored, else -1."""
    return v if type(v) is int and -(1 << 63) <= v < 1 << 63 else -1


def _gemm_groups(launches, stats: TraceStats, kind_cache: dict) -> dict[str, list]:
    """The GEMM and reduce launches (device, stream, duration µs, name), in (device, stream, start) order,
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

    for d, st, dur, name in launches:
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
