"""`read_chrome_trace`: one pass over a Chrome trace's events (`events.iter_chrome_events`), each event handed
to the collector of its category, then the collectors' arrays joined (`link`) into the GEMM rows (`rows`) and,
for `audit`, the `TraceDetail`.

Collectors keep compact columns (``array``: ~60 bytes per GEMM-kind launch, 16 per CPU op, 28 per launch
call), not event objects, so memory grows by a few MB per 100 MB of trace:

- `Launches`: kernel, memcpy and memset events: every kernel name's count and time, and one row per
  GEMM-kind or split-K reduce launch (with ``detail``: per launch of any kernel);
- `Ops`: CPU ops, and apart from them ``user_annotation`` events, that carry an External id;
- `Calls`: runtime and driver calls (correlation -> External id, process, CPU time);
- `Ranges`: the attribution ranges (``detail`` only), and the B/E pairs whose E closes what its B opened.
"""
from __future__ import annotations

import logging
import os
import time
from array import array

import numpy as np
import pandas as pd

from cublaslt_probe.analysis.trace.events import iter_chrome_events
from cublaslt_probe.analysis.trace.link import attach, gpu_range_owner, group, link, lookup_in
from cublaslt_probe.analysis.trace.rows import finish, op_key_json
from cublaslt_probe.analysis.trace.schema import (
    PY_MODULE_PREFIX,
    RANGE_COLUMNS,
    RANGE_PREFIXES,
    TraceDetail,
    TraceStats,
    TraceSummary,
    kernel_kind,
)
from cublaslt_probe.analysis.trace.timeline import families, timeline_frame
from cublaslt_probe.errors import ProbeError

log = logging.getLogger("cublaslt_probe.analysis.trace")

_KERNEL_CATS = {"kernel", "Kernel"}
_COPY_CATS = {"gpu_memcpy", "gpu_memset", "Memcpy", "Memset"}
_OP_CATS = {"cpu_op", "Operator", "user_annotation"}
_RUNTIME_CATS = {"cuda_runtime", "cuda_driver", "Runtime"}
_PYTHON_CATS = {"python_function"}
_I64 = 1 << 63
_INF = float("inf")


# --------------------------------------------------------------------------- values as the file writes them
def _as_int(v, default: int = -1) -> int:
    """`v` as an int64 (an int, a float or a number written as a string), else `default` (also when it does
    not fit in 64 bits)."""
    if type(v) is not int:
        try:
            v = int(v)
        except (TypeError, ValueError, OverflowError):
            return default
    return v if -_I64 <= v < _I64 else default


def _as_float(v) -> float:
    if type(v) is float or type(v) is int:
        return float(v)
    try:
        return float(v)
    except (TypeError, ValueError, OverflowError):
        return 0.0


def _as_id(v, stats: TraceStats) -> int:
    """A correlation or External id: an int in 0 .. 2^63-1 (the int64 columns' range), else -1 (missing).
    An id beyond that range is counted in ``stats.bad_ids``: it cannot be stored, so it links nothing (mapping
    it onto the range could join it to another event's id)."""
    if type(v) is not int:
        if v is None:
            return -1
        try:
            v = int(v)
        except (TypeError, ValueError, OverflowError):
            return -1
    if v < 0:
        return -1
    if v >= _I64:
        stats.bad_ids += 1
        return -1
    return v


def _id(v, stats: TraceStats) -> int:
    """`_as_id` with the common case (a plain int in range) decided inline."""
    return v if type(v) is int and 0 <= v < _I64 else _as_id(v, stats)


def valid_duration(v) -> float | None:
    """A kernel or copy event's ``dur`` in µs: a finite number >= 0 (an int, float or numeric string), else
    None (missing, not a number, NaN, negative or infinite)."""
    if type(v) is not float:
        if type(v) is bool or v is None:
            return None
        try:
            v = float(v)
        except (TypeError, ValueError, OverflowError):
            return None
    return v if 0.0 <= v < _INF else None


def _np(arr: array, dtype) -> np.ndarray:
    return np.frombuffer(arr, dtype=dtype) if len(arr) else np.zeros(0, dtype)


class _Interner:
    def __init__(self):
        self.index: dict = {}
        self.items: list = []

    def __call__(self, key) -> int:
        i = self.index.get(key)
        if i is None:
            i = self.index[key] = len(self.items)
            self.items.append(key)
        return i


class _Processes(_Interner):
    """The OS pids of the processes whose ops, runtime calls and CPU ranges the file holds, interned."""

    def of(self, ev: dict) -> int:
        pid = ev.get("pid")
        i = self.index.get(pid) if type(pid) is int else None
        return self(_as_int(pid)) if i is None else i


# --------------------------------------------------------------------------- collectors
class Launches:
    """Kernel and copy events: every kernel name's [count, total µs] (`per_name`), the totals, and one row per
    GEMM-kind or split-K reduce launch (every launch with `detail`): name, kind (`kernel_kind`), GPU start,
    duration, device, stream, External id, correlation. A ``dur`` that is missing, not a number, negative or
    infinite counts 0 µs and is counted in ``stats.bad_durations``.

    Per event it also keeps what `finish` needs after the stream (41 bytes): a hash of the event's identity
    (category, name, start, duration, process, thread, device, stream, correlation, External id), its name,
    start, duration, correlation, row and kind."""

    def __init__(self, detail: bool, stats: TraceStats):
        self.detail, self.stats = detail, stats
        self.names = _Interner()
        self.kind_cache: dict[str, int] = {}
        self.per_name: dict[str, list] = {}
        self.kernels = self.copies = 0
        self.gpu_us = 0.0
        self.name, self.kind = array("i"), array("b")
        self.ts, self.dur = array("d"), array("d")
        self.dev, self.stream, self.ext, self.corr = array("q"), array("q"), array("q"), array("q")
        self.e_hash, self.e_name, self.e_dur, self.e_row = array("q"), array("i"), array("d"), array("i")
        self.e_ts, self.e_corr = array("d"), array("q")
        self.e_kernel = array("b")
        self.lo, self.hi = _INF, -_INF          # first and last GPU start

    def add(self, ev: dict, cat: str, name: str, args) -> None:
        dur = ev.get("dur")
        if type(dur) is not float or not 0.0 < dur < _INF:
            dur = self._bad_duration(cat, name, dur)
        kernel = cat in _KERNEL_CATS
        if kernel:
            self.kernels += 1
        else:
            self.copies += 1
        self.gpu_us += dur
        acc = self.per_name.get(name)
        if acc is None:
            self.per_name[name] = [1, dur]
        else:
            acc[0] += 1
            acc[1] += dur
        k = self.kind_cache.get(name)
        if k is None:
            k = kernel_kind(name, self.kind_cache)
        ts = ev.get("ts")
        ts = ts if type(ts) is float else _as_float(ts)
        if ts < self.lo:
            self.lo = ts
        if ts > self.hi:
            self.hi = ts
        self.e_hash.append(_identity(ev, cat, name, ts, dur, args))
        self.e_name.append(self.names(name))
        self.e_ts.append(ts)
        self.e_corr.append(_as_int(args.get("correlation"), -1) if type(args) is dict else -1)
        self.e_dur.append(dur)
        self.e_kernel.append(kernel)
        if k or self.detail:
            args = args or {}
            self.e_row.append(len(self.name))
            self.name.append(self.names(name))
            self.kind.append(k)
            self.ts.append(ts)
            self.dur.append(dur)
            self.dev.append(_as_int(args.get("device"), _as_int(ev.get("pid"), 0)))
            self.stream.append(_as_int(args.get("stream"), _as_int(ev.get("tid"), 0)))
            self.ext.append(_as_id(args.get("External id"), self.stats))
            self.corr.append(_as_id(args.get("correlation"), self.stats))
        else:
            self.e_row.append(-1)

    def _bad_duration(self, cat: str, name: str, dur) -> float:
        d = valid_duration(dur)
        if d is None:
            self.stats.bad_durations += 1
            if self.stats.bad_durations <= 3:
                log.warning("%s: %s %r has no valid dur (%r): counted, with 0 µs", self.stats.path, cat, name[:80],
                            dur)
            return 0.0
        if d == 0.0:
            self.stats.zero_durations += 1
        return d

    def finish(self, lo: float, hi: float, calls: "Calls | None" = None) -> None:
        """After the stream: an event that repeats an earlier one exactly (`_identity`: a file merged or
        exported twice) is taken out, counted once (``stats.duplicate_events``, ``stats.duplicate_us``), unless
        as many distinct launch calls (process, time) of `calls` carry its correlation: the same program on
        several ranks of one device launches alike events from calls of its own. An event longer than the
        trace cannot be a duration: it counts 0 µs, in ``stats.bad_durations`` and ``stats.long_durations``.
        The trace runs from `lo` to `hi` (the CPU events' first start and last end, `Span`), widened to the
        GPU events' starts and to the ends of those no longer than that."""
        h = _np(self.e_hash, np.int64)
        if not len(h):
            return
        names, dur = self.names.items, _np(self.e_dur, np.float64).copy()
        ts, rows = _np(self.e_ts, np.float64), _np(self.e_row, np.int32)
        dup = repeats(h, _np(self.e_corr, np.int64), calls)
        long, span = too_long(ts, dur, dup, min(lo, self.lo), max(hi, self.hi))
        if not dup.any() and not long.any():
            return
        e_name, kernel = _np(self.e_name, np.int32), _np(self.e_kernel, np.int8).astype(bool)
        for i in np.flatnonzero(long).tolist()[:3]:
            log.warning("%s: %r lasts %g µs, longer than the trace (%g µs): counted, with 0 µs", self.stats.path,
                        names[e_name[i]][:80], dur[i], span)
        self.stats.duplicate_events += int(dup.sum())
        self.stats.duplicate_us += float(dur[dup].sum())
        self.stats.bad_durations += int(long.sum())
        self.stats.long_durations += int(long.sum())
        dur[long] = 0.0
        for r in rows[long & (rows >= 0)].tolist():
            self.dur[r] = 0.0
        # the totals summed again from the events kept (a subtraction would lose them beside 1e300 µs)
        kept = ~dup
        count = np.bincount(e_name[kept], minlength=len(names))
        total = np.bincount(e_name[kept], weights=dur[kept], minlength=len(names))
        index = self.names.index
        self.per_name = {n: [int(count[index[n]]), float(total[index[n]])] for n in self.per_name
                         if count[index[n]]}
        self.gpu_us = float(dur[kept].sum())
        self.kernels, self.copies = int((kept & kernel).sum()), int((kept & ~kernel).sum())
        drop = rows[dup & (rows >= 0)]
        if len(drop):
            keep = np.ones(len(self.name), dtype=bool)
            keep[drop] = False
            for attr in ("name", "kind", "ts", "dur", "dev", "stream", "ext", "corr"):
                a = getattr(self, attr)
                setattr(self, attr, array(a.typecode, np.frombuffer(a, dtype=a.typecode)[keep].tobytes()))


def too_long(ts: np.ndarray, dur: np.ndarray, dup: np.ndarray, lo: float, hi: float) -> tuple[np.ndarray, float]:
    """Which GPU events (start `ts`, duration `dur`, µs; the repeats `dup` left aside) last longer than the
    trace, and how long the trace is: from `lo` to `hi` (at least the events' first and last start), widened to
    the ends of the events no longer than that. Such a duration cannot be one (a damaged value): the readers
    count it 0 µs. With one start only (``hi == lo``) nothing is too long."""
    ends = ts[dur <= hi - lo] + dur[dur <= hi - lo]
    ends = ends[~np.isnan(ends)]                 # a start that is not a number widens nothing
    if len(ends):
        hi = max(hi, float(ends.max()))
    long = ~dup & (dur > hi - lo) if hi > lo else np.zeros(len(dur), dtype=bool)
    return long, hi - lo


def repeats(h: np.ndarray, corr: np.ndarray, calls: "Calls | None") -> np.ndarray:
    """Which events repeat an earlier one of the same identity hash `h` beyond the distinct launch calls
    (process, time) of `calls` that carry their correlation `corr` (at least one: a first occurrence is never
    a repeat)."""
    _, inv = np.unique(h, return_inverse=True)
    o = np.argsort(inv, kind="stable")
    g = inv[o]
    start = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
    rank = np.empty(len(h), dtype=np.int64)
    rank[o] = np.arange(len(o)) - np.repeat(start, np.diff(np.r_[start, len(o)]))
    dup = rank >= 1
    if dup.any() and calls is not None and len(calls.corr):
        c = pd.DataFrame({"corr": _np(calls.corr, np.int64), "pid": _np(calls.pid, np.int32),
                          "ts": _np(calls.ts, np.float64)}).drop_duplicates()
        n = c.groupby("corr").size()
        allowed = pd.Series(corr[dup]).map(n).fillna(1).to_numpy()
        dup[np.flatnonzero(dup)[rank[dup] < allowed]] = False
    return dup


def _identity(ev: dict, cat: str, name: str, ts: float, dur: float, args) -> int:
    """A hash of what makes a GPU event itself (category, name, start, duration, process, thread, device,
    stream, correlation, External id): two events with the same are one event written twice."""
    a = args if type(args) is dict else {}
    key = (cat, name, ts, dur, ev.get("pid"), ev.get("tid"), a.get("device"), a.get("stream"),
           a.get("correlation"), a.get("External id"))
    try:
        return hash(key)
    except TypeError:                  # a list or object where a number belongs
        return hash(repr(key))


class Ops:
    """CPU ops (or, a second instance, ``user_annotation`` events) that carry an External id: the id, the
    interned op key (name, repr of Input Dims / Input type / Input Strides; shapes None without
    ``record_shapes``), the process; with `detail` also start, duration, thread and (ops) the autograd
    ``Sequence number``."""

    def __init__(self, keys: _Interner, pids: _Processes, detail: bool, stats: TraceStats, seq: bool):
        self.keys, self.pids, self.detail, self.stats, self.with_seq = keys, pids, detail, stats, seq
        self.ext, self.key, self.pid = array("q"), array("i"), array("i")
        self.ts, self.dur, self.tid, self.seq = array("d"), array("d"), array("q"), array("q")

    def add(self, ev: dict, name: str, args: dict, pend: list | None) -> None:
        ext = _id(args.get("External id"), self.stats)
        if ext < 0:
            return
        dims = args.get("Input Dims")
        key = (name, None, None, None) if dims is None else \
            (name, repr(dims), repr(args.get("Input type")), repr(args.get("Input Strides")))
        self.ext.append(ext)
        self.key.append(self.keys(key))
        self.pid.append(self.pids.of(ev))
        if self.detail:
            ts, du = ev.get("ts"), ev.get("dur")
            if pend is not None:
                pend.append((self, len(self.ts), 0.0))
            self.ts.append(ts if type(ts) is float else _as_float(ts))
            self.dur.append(du if type(du) is float else _as_float(du))
            self.tid.append(_as_int(ev.get("tid"), 0))
            if self.with_seq:
                self.seq.append(_as_int(args.get("Sequence number", -1)))

    def close(self, i: int, end: float, start: float) -> None:
        """The E event of a B-written op: its duration."""
        self.dur[i] = max(end - self.ts[i], 0.0)


class Calls:
    """Runtime and driver calls with a correlation id: correlation, External id, CPU time, process."""

    def __init__(self, pids: _Processes, stats: TraceStats):
        self.pids, self.stats = pids, stats
        self.corr, self.ext, self.ts, self.pid = array("q"), array("q"), array("d"), array("i")

    def add(self, ev: dict, args: dict) -> None:
        corr = _id(args.get("correlation"), self.stats)
        if corr < 0:
            return
        ts = ev.get("ts")
        self.corr.append(corr)
        self.ext.append(_id(args.get("External id"), self.stats))
        self.ts.append(ts if type(ts) is float else _as_float(ts))
        self.pid.append(self.pids.of(ev))


class Span:
    """The first start and the last end of the CPU events (ops, annotations, runtime and driver calls) with a
    finite start and duration: with the GPU events' starts, how long the trace is (`Launches.finish`)."""

    def __init__(self):
        self.lo, self.hi = _INF, -_INF

    def add(self, ev: dict) -> None:
        ts, du = ev.get("ts"), ev.get("dur")
        ts = ts if type(ts) is float else _as_float(ts)
        end = ts + (du if type(du) is float else _as_float(du) if du is not None else 0.0)
        if ts < self.lo and ts > -_INF:
            self.lo = ts
        if end > self.hi and end < _INF:
            self.hi = end


class Ranges:
    """The attribution ranges (`RANGE_COLUMNS`; pid as an index into the reader's processes, GPU ranges -1
    until `read_chrome_trace` finds their process), and the B events awaiting their E per (pid, tid): what
    a B opened (a range, an op, an annotation) takes its end from the E."""

    def __init__(self):
        self.rows: list[list] = []
        self.open_b: dict[tuple, list] = {}

    def begin(self, ev: dict) -> list:
        pend: list = []
        self.open_b.setdefault((str(ev.get("pid")), str(ev.get("tid"))), []).append(pend)
        return pend

    def end(self, ev: dict) -> None:
        st = self.open_b.get((str(ev.get("pid")), str(ev.get("tid"))))
        if st:
            end = _as_float(ev.get("ts"))
            for owner, i, start in st.pop():
                owner.close(i, end, start)

    def cpu(self, ev: dict, name: str, pid: int, pend: list | None) -> None:
        ts = _as_float(ev.get("ts"))
        if pend is not None:
            pend.append((self, len(self.rows), ts))
        self.rows.append([name, ts, ts + _as_float(ev.get("dur")), _as_int(ev.get("tid"), 0), pid, False, -1])

    def gpu(self, ev: dict, name: str, args) -> None:
        args = args or {}
        ts = _as_float(ev.get("ts"))
        self.rows.append([name, ts, ts + _as_float(ev.get("dur")),
                          _as_int(args.get("stream"), _as_int(ev.get("tid"), 0)), -1, True,
                          _as_int(args.get("device"), _as_int(ev.get("pid"), 0))])

    def close(self, i: int, end: float, start: float) -> None:
        self.rows[i][2] = max(end, start)


# --------------------------------------------------------------------------- the reader
def read_chrome_trace(path: str | os.PathLike, chunk_bytes: int = 1 << 22, detail: bool = False) -> TraceSummary:
    """Read a torch.profiler Chrome trace (streamed): every kernel's time by kind, provenance and family, and
    the GEMM-kind kernels with their ops and shapes. ``detail=True`` also keeps `TraceDetail` (for `audit`).

    Events that cannot be read are skipped and counted in ``stats.bad_events`` (an item that is not an
    object, a ``name`` that is not a string, ``args`` that are not an object, nesting too deep to decode).
    A file may hold several processes (rank traces merged into one): ids are joined only within their
    process (`link.link`), and the rows are per process (column ``pid``)."""
    t0 = time.perf_counter()
    stats = TraceStats(path=str(path), format="chrome")
    try:
        stats.file_bytes = os.path.getsize(path)
    except OSError as e:
        raise ProbeError(f"cannot read trace {path}: {e.strerror or e}") from e
    meta: dict = {}
    pids, keys = _Processes(), _Interner()
    launches, calls, ranges = Launches(detail, stats), Calls(pids, stats), Ranges()
    ops, annots = Ops(keys, pids, detail, stats, seq=True), Ops(keys, pids, detail, stats, seq=False)
    flows = 0
    span = Span()
    for ev in iter_chrome_events(path, meta, stats, chunk_bytes):
        if type(ev) is not dict:
            _bad(ev, stats)
            continue
        name, args, cat = ev.get("name"), ev.get("args"), ev.get("cat")
        if (name is not None and type(name) is not str) or (cat is not None and type(cat) is not str) or \
                (args is not None and type(args) is not dict):
            _bad(ev, stats)
            continue
        ph = ev.get("ph")
        pend = None                           # detail, a B event: where its E writes the end
        if ph == "E" or ph == "B":
            if ph == "E":
                if detail:
                    ranges.end(ev)
                continue
            if detail:
                pend = ranges.begin(ev)
        if cat in _KERNEL_CATS or cat in _COPY_CATS:
            launches.add(ev, cat, name or "", args)
        elif cat in _OP_CATS:
            span.add(ev)
            name = name or ""
            if detail and cat == "user_annotation" and name.startswith(RANGE_PREFIXES):
                ranges.cpu(ev, name, pids.of(ev), pend)
            if args:
                (annots if cat == "user_annotation" else ops).add(ev, name, args, pend)
        elif cat in _RUNTIME_CATS:
            span.add(ev)
            if args:
                calls.add(ev, args)
        elif cat == "ac2g":
            flows += 1
        elif detail and cat in _PYTHON_CATS and (name or "").startswith(PY_MODULE_PREFIX):
            ranges.cpu(ev, name, pids.of(ev), pend)
        elif detail and cat == "gpu_user_annotation" and (name or "").startswith(RANGE_PREFIXES):
            ranges.gpu(ev, name, args)
    launches.finish(span.lo, span.hi, calls)
    stats.kernels, stats.copies, stats.gpu_time_us = launches.kernels, launches.copies, launches.gpu_us
    stats.cpu_ops, stats.flows = len(ops.ext), flows
    _device_properties(meta)
    out, det, real = _join(launches, ops, annots, calls, ranges, pids, keys, stats, detail)
    stats.seconds = time.perf_counter() - t0
    log.info("%s", stats.line())
    timeline = timeline_frame(launches.per_name, stats.gpu_time_us)
    return TraceSummary(out, stats.gpu_time_us, stats, meta, families(timeline), timeline, det, pids=real)


def _bad(ev, stats: TraceStats) -> None:
    """Count an event that cannot be read, and say why for the first three (not an object; a name, cat or
    args of the wrong type)."""
    stats.bad_events += 1
    if stats.bad_events > 3:
        return
    why = "not an object" if type(ev) is not dict else \
        "name is not a string" if ev.get("name") is not None and type(ev.get("name")) is not str else \
        "cat is not a string" if ev.get("cat") is not None and type(ev.get("cat")) is not str else \
        "args is not an object"
    log.warning("%s: malformed event skipped (%s): %.120r", stats.path, why, ev)


def _device_properties(meta: dict) -> None:
    """``deviceProperties`` as a list of objects, however the file wrote it (one object is wrapped in a
    list; entries that are not objects are dropped), so every reader of it may index it."""
    props = meta.get("deviceProperties")
    if props is None or (type(props) is list and all(type(p) is dict for p in props)):
        return
    meta["deviceProperties"] = [props] if isinstance(props, dict) else \
        [p for p in props if isinstance(p, dict)] if isinstance(props, list) else []


def _join(launches: Launches, ops: Ops, annots: Ops, calls: Calls, ranges: Ranges, pids: _Processes,
          keys: _Interner, stats: TraceStats, detail: bool) -> tuple[pd.DataFrame, TraceDetail | None, list]:
    """The collectors joined: the GEMM rows (`TRACE_SCHEMA`), the `TraceDetail` (with `detail`) and the OS
    pids of the file's processes.

    Events whose pid cannot be read (pid -1) are a group of their own beside several processes, and the one
    process's when there is one."""
    items = pids.items
    o_pid, a_pid, r_pid = _np(ops.pid, np.int32), _np(annots.pid, np.int32), _np(calls.pid, np.int32)
    real = [p for p in items if p != -1]
    if len(real) == 1 and len(items) == 2:
        o_pid, a_pid, r_pid = (np.zeros(len(x), np.int32) for x in (o_pid, a_pid, r_pid))
        for r in ranges.rows:
            if not r[5]:
                r[4] = 0
        items = real
    stats.processes = len(real)

    L = launches
    dev, ts = _np(L.dev, np.int64), _np(L.ts, np.float64)
    ext = _np(L.ext, np.int64).copy()
    l_pid, r_row = link(_np(L.corr, np.int64), ext, dev, ts, _np(calls.corr, np.int64), _np(calls.ext, np.int64),
                        _np(calls.ts, np.float64), r_pid, len(items), stats)
    # op row of each launch: the innermost cpu_op with its External id in its process, else an annotation
    # (rows after the ops)
    n_o = len(ops.ext)
    op_row = lookup_in(l_pid, ext, o_pid, _np(ops.ext, np.int64), np.arange(n_o))
    missing = op_row < 0
    if missing.any() and len(annots.ext):
        got = lookup_in(l_pid[missing], ext[missing], a_pid, _np(annots.ext, np.int64), np.arange(len(annots.ext)))
        op_row[missing] = np.where(got >= 0, got + n_o, -1)
    key_of_row = np.concatenate([_np(ops.key, np.int32), _np(annots.key, np.int32)]).astype(np.int64)
    op_idx = np.where(op_row >= 0, key_of_row[np.maximum(op_row, 0)] if len(key_of_row) else -1, -1)
    kind = _np(L.kind, np.int8)
    stats.linked = int(((kind == 1) & (op_row >= 0)).sum())
    att = attach(kind, ts, _np(L.dur, np.float64), dev, _np(L.stream, np.int64), ext, l_pid, stats)
    pid_of = np.array(items + [-1], dtype=np.int64)            # pid index -> OS pid; -1 -> -1
    groups = group(_np(L.name, np.int32), kind, op_idx, att, l_pid)
    name_of = L.names.items
    out = finish(groups.assign(kernel=[name_of[i] for i in groups["name"]],
                               pid=[int(pid_of[i]) if pid_of[i] >= 0 else None for i in groups["pid"]]),
                 [op_key_json(keys.items[i]) if i >= 0 else None for i in groups["op"]], stats)
    if not detail:
        return out, None, real
    # a launch's CPU time: its launch call's, else its op's, else its GPU start
    t_launch = ts.copy()
    row_ts = np.concatenate([_np(ops.ts, np.float64), _np(annots.ts, np.float64)])
    linked = op_row >= 0
    t_launch[linked] = row_ts[op_row[linked]]
    hit = r_row >= 0
    t_launch[hit] = _np(calls.ts, np.float64)[r_row[hit]]
    order, keep, total, red = att
    rng = pd.DataFrame(ranges.rows, columns=RANGE_COLUMNS).astype(
        {"name": object, "ts": "float64", "end": "float64", "tid": "int64", "pid": "int64", "gpu": "bool",
         "device": "int64"})
    if len(rng):
        gpu = rng["gpu"].to_numpy()
        rp = rng["pid"].to_numpy().copy()
        rp[gpu] = gpu_range_owner(rng[gpu], dev, _np(L.stream, np.int64), ts, l_pid)
        rng["pid"] = np.where(rp >= 0, pid_of[np.maximum(rp, 0)], -1)
    det = TraceDetail(
        names=name_of, op_keys=keys.items,
        launches=pd.DataFrame({
            "name": _np(L.name, np.int32)[order][keep], "kind": kind[order][keep], "dur": total, "reduce_us": red,
            "ts": ts[order][keep], "t_launch": t_launch[order][keep], "op_row": op_row[order][keep],
            "pid": pid_of[l_pid[order][keep]], "device": dev[order][keep]}),
        ops=pd.DataFrame({"key": key_of_row, "ts": row_ts,
                          "end": row_ts + np.concatenate([_np(ops.dur, np.float64), _np(annots.dur, np.float64)]),
                          "tid": np.concatenate([_np(ops.tid, np.int64), _np(annots.tid, np.int64)]),
                          "seq": np.concatenate([_np(ops.seq, np.int64), np.full(len(annots.ts), -1, np.int64)]),
                          "pid": pid_of[np.concatenate([o_pid, a_pid])]}),
        ranges=rng)
    return out, det, real
