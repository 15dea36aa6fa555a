"""Where a profiled program's GPU time went (every kernel by kind and provenance), and which GEMM kernels it
ran, for how long, called by which op with which shapes.

Two readers, one result (`TraceSummary`, whose `.kernels` is a tidy DataFrame; columns in `TRACE_SCHEMA`):

- `read_chrome_trace(path)`: a torch.profiler / Kineto Chrome trace (`.json` or gzip `.json.gz`; gzip is
  recognised by its magic bytes). The file is one JSON object whose ``traceEvents`` array holds every
  event; it is streamed: read in chunks, one event object decoded at a time with the json module's C
  scanner, and only compact numbers kept (``array`` columns: ~60 bytes per GEMM-kind launch, 16 per CPU
  op, 28 per launch call), so memory grows by a few MB per 100 MB of trace, not with its text (docs/trace.md
  gives the measured figures). A malformed event is skipped and counted, a truncated file ends the stream
  with a warning; neither raises.
- `read_nsys_sqlite(path)`: an Nsight Systems SQLite export (``nsys export --type sqlite``), through the
  stdlib sqlite3: table ``CUPTI_ACTIVITY_KIND_KERNEL`` (``start``, ``end`` in ns, ``demangledName`` /
  ``shortName`` ids into ``StringIds``). UNTESTED on a real export: nsys cannot write reports on the
  machine the project's captures come from, so it is tested only on a file built with the documented schema.

`read_trace(path)` picks the reader from the file's first bytes.

What is linked to what (Chrome trace, as torch.profiler writes it):
- a kernel event (``cat: "kernel"``) carries ``args["External id"]``: the ``External id`` of the innermost
  CPU op (``cat: "cpu_op"``) or ``user_annotation`` that launched it. Where a kernel lacks it, its
  ``args["correlation"]`` finds the runtime call (``cat: "cuda_runtime"``/``"cuda_driver"``, same
  correlation) and that call's ``External id``. The ``ac2g`` flow events join the same runtime call and
  kernel (their ``id`` is the correlation), so they add nothing and are only counted.
- with ``record_shapes=True`` the CPU op has ``args["Input Dims"]``, ``"Input type"`` and
  ``"Input Strides"``; for the GEMM ops in `GEMM_OPS` the torch-view problem (m, n, k, batch, dtype,
  layout — the same words as the dataset's, see docs/dataset.md) is derived from them.
- a split-K reduce kernel (family ``splitk_reduce``) is counted with the GEMM launched just before it on the
  same device and stream (by the same op when both are linked): its time is added to that GEMM's
  ``total_us`` and shown in ``reduce_us``. A reduce with no such GEMM keeps its own row.
- correlation and External ids are counted per process: in a file of several processes (merged rank
  traces) they are joined only within their process (`_link`), and the rows are per process (``pid``).
"""
from __future__ import annotations

import codecs
import json
import logging
import os
import re
import sqlite3
import time
import zlib
from array import array
from dataclasses import dataclass, field
from typing import IO, Any, Iterator

import numpy as np
import pandas as pd

from cublaslt_probe import runfiles
from cublaslt_probe.errors import ProbeError
from cublaslt_probe.kinds import TILE_CLUSTER, decoded_columns

log = logging.getLogger(__name__)

REDUCE_FAMILY = "splitk_reduce"

# column -> (pandas dtype, meaning). One row per (kernel, calling op with its input shapes).
TRACE_SCHEMA: dict[str, tuple[str, str]] = {
    "share": ("float64", "fraction of the trace's GPU time (sum of every kernel's duration) in this row"),
    "count": ("Int64", "launches of the GEMM kernel"),
    "total_us": ("float64", "summed duration of those launches, with their split-K reduce kernels, µs"),
    "mean_us": ("float64", "total_us / count"),
    "min_us": ("float64", "shortest launch (with its reduce), µs"),
    "max_us": ("float64", "longest launch (with its reduce), µs"),
    "reduce_us": ("float64", "part of total_us spent in split-K reduce kernels counted with this GEMM"),
    "kernel": ("string", "kernel name as the trace writes it"),
    "family": ("category", "decoded family (nvjet, xmma, cutlass, ...; splitk_reduce for an orphan reduce)"),
    "provenance": ("category", "how the kernel came to exist: library-selected (a cuBLAS/cuBLASLt heuristic "
                               "picked it), ahead-of-time (compiled into a binary, launched directly), "
                               "runtime-compiled, unknown (decoded from the name: docs/provenance.md)"),
    "kernel_short": ("string", "compact decoded form, e.g. 256x128 · 64x4 · 1x2 · coopA"),
    "arch": ("category", "decoded architecture (sm90, ...)"),
    "types": ("string", "decoded dtype code as the name writes it (nvjet: tst), else a/c/compute types"),
    **decoded_columns(*TILE_CLUSTER, "split_k"),
    "kernel_layout": ("string", "layout letters in the name (nvjet TNT, cutlass tn, ...)"),
    "kernel_flags": ("string", "decoded flags, space separated (coopA, splitK, bias, ...)"),
    "op": ("string", "calling CPU op (aten::mm, aten::addmm, aten::_scaled_mm, ...); null when not linked"),
    "input_dims": ("string", "the op's args['Input Dims'] as JSON (record_shapes=True), null without"),
    "input_types": ("string", "the op's args['Input type'] as JSON"),
    "input_strides": ("string", "the op's args['Input Strides'] as JSON"),
    "dtype": ("category", "torch-view dtype of the GEMM op (bf16, fp16, fp32, fp8, fp8_e5m2, ...); fp32 "
                          "may have run as tf32: the trace does not say"),
    "layout": ("category", "torch-view layout from the strides: N = operand contiguous, T = transposed "
                           "(NT = F.linear); null when the strides are absent or ambiguous"),
    "m": ("Int64", "torch view: rows of A and C"),
    "n": ("Int64", "torch view: columns of B and C"),
    "k": ("Int64", "torch view: reduction dimension"),
    "batch": ("Int64", "batch count (bmm, baddbmm; a 3-D x 3-D grouped GEMM: its groups), 1 otherwise"),
    "groups": ("Int64", "grouped GEMM (aten::_grouped_mm, _scaled_grouped_mm): number of problems; null otherwise"),
    "group_dim": ("category", "grouped GEMM: the dimension the offsets split into groups (m, n or k; m, n, k "
                              "give the total over the groups); null for a batched or ungrouped GEMM"),
    "problem_shape": ("category", "CUTLASS 3 kernels: the problem shape the name declares (single, grouped, "
                                  "ptr_array); null when the name says nothing"),
    "pid": ("Int64", "OS pid of the process that launched the kernels; a file of merged rank traces holds "
                     "several (TraceSummary.pids); null when it cannot be told, or not recorded (Nsight export)"),
}
TRACE_COLUMNS = list(TRACE_SCHEMA)

# Innermost torch ops that launch a GEMM, and where their operands sit in "Input Dims".
GEMM_OPS: dict[str, tuple[int, int]] = {
    "aten::mm": (0, 1), "aten::addmm": (1, 2), "aten::_addmm_activation": (1, 2),
    "aten::bmm": (0, 1), "aten::baddbmm": (1, 2), "aten::_scaled_mm": (0, 1),
    "aten::mv": (0, 1), "aten::addmv": (1, 2),
    "aten::_grouped_mm": (0, 1), "aten::_scaled_grouped_mm": (0, 1),
}
# Grouped GEMM ops (mat_a, mat_b, ..., offs): where the offsets sit. torch's convention: 2-D x 3-D = A [ΣM, K],
# B [G, K, N], offsets split M; 3-D x 2-D = A [G, M, K], B [K, ΣN], offsets split N; 2-D x 2-D = A [M, ΣK],
# B [ΣK, N], offsets split K (out [G, M, N]); 3-D x 3-D = a batch of G equal GEMMs, no offsets.
GROUPED_OPS: dict[str, int] = {"aten::_grouped_mm": 2, "aten::_scaled_grouped_mm": 4}
_TORCH_DTYPES = {
    "c10::BFloat16": "bf16", "BFloat16": "bf16", "c10::Half": "fp16", "Half": "fp16", "float": "fp32",
    "Float": "fp32", "double": "fp64", "Double": "fp64", "c10::Float8_e4m3fn": "fp8_e4m3",
    "c10::Float8_e5m2": "fp8_e5m2", "c10::Float8_e4m3fnuz": "fp8_e4m3fnuz", "c10::Float8_e5m2fnuz":
    "fp8_e5m2fnuz", "c10::complex<float>": "complex64", "c10::complex<double>": "complex128",
    "signed char": "int8", "int": "int32",
}


@dataclass
class TraceStats:
    """What a reader saw: counts for the `info` log line, the CLI's header and the benchmark."""

    path: str = ""
    format: str = ""                  # chrome | nsys
    file_bytes: int = 0               # size on disk (compressed when gzip)
    bytes_read: int = 0               # uncompressed bytes parsed
    seconds: float = 0.0
    events: int = 0                   # trace events decoded
    bad_events: int = 0               # malformed events skipped
    truncated: bool = False           # the file ended inside the event array
    gzip_damaged_after_events: bool = False   # the gzip stream breaks only after the last event: all were read
    gzip_error: str = ""              # zlib's message where the gzip stream breaks (damaged, not just cut off)
    bad_durations: int = 0            # kernel / copy events whose dur is missing, not a number, NaN, negative or
                                      # infinite (kept, counted as 0 µs)
    zero_durations: int = 0           # kernel / copy events whose dur is 0 (valid: kept as 0 µs, counted)
    bad_ids: int = 0                  # correlation / External ids outside 0 .. 2^63-1 (read as missing: unlinked)
    kernels: int = 0                  # kernel launches (all families)
    copies: int = 0                   # memcpy / memset rows on the GPU
    gpu_time_us: float = 0.0          # summed duration of the kernels, memcpys and memsets
    gemm_launches: int = 0
    reduce_launches: int = 0
    reduce_attached: int = 0
    linked: int = 0                   # GEMM launches linked to a CPU op
    with_shapes: int = 0              # ... whose op recorded its input shapes
    cpu_ops: int = 0
    flows: int = 0
    processes: int = 0                # OS processes with ops or runtime calls (several: merged rank traces)
    no_process: int = 0               # launches whose process cannot be told (several processes only)

    def line(self) -> str:
        mb = self.bytes_read / 1e6
        return (f"read {self.path} ({self.format}, {mb:,.1f} MB) in {self.seconds:.2f} s: "
                f"{self.events:,} events, {self.kernels:,} kernel launches, "
                f"{self.gemm_launches:,} GEMM ({self.linked:,} linked to an op, {self.with_shapes:,} with "
                f"shapes), {self.bad_events:,} bad events, {self.bad_durations:,} without a numeric dur")


@dataclass
class TraceSummary:
    """The GEMM-kind kernels of one trace (`kernels`, columns `TRACE_COLUMNS`), its GPU time by class
    (`timeline`), and the trace's totals."""

    kernels: pd.DataFrame
    gpu_time_us: float
    stats: TraceStats
    meta: dict[str, Any] = field(default_factory=dict)          # top-level keys other than traceEvents
    families: pd.DataFrame | None = None                          # GPU time per decoded family, all kernels
    timeline: pd.DataFrame | None = None      # GPU time by (kind, provenance, family), columns TIMELINE_SCHEMA
    detail: "TraceDetail | None" = None       # read_chrome_trace(detail=True): launches, ops, ranges (audit)
    pids: list = field(default_factory=list)  # OS pids of the processes the file holds, in order of appearance

    @property
    def gemm_time_us(self) -> float:
        return float(self.kernels["total_us"].sum()) if len(self.kernels) else 0.0

    @property
    def device(self) -> str | None:
        """GPU name(s) the trace records (Kineto's ``deviceProperties``), else None."""
        props = self.meta.get("deviceProperties")
        if isinstance(props, dict):
            props = [props]
        if isinstance(props, list):
            names = sorted({p.get("name") for p in props if isinstance(p, dict) and p.get("name")})
            return ", ".join(names) or None
        return None


# --------------------------------------------------------------------------- streaming JSON
_WS = re.compile(r"[ \t\n\r]*")
_SEP = re.compile(r"[ \t\n\r]*,[ \t\n\r]*")
_RESYNC = re.compile(r"\}[ \t\n\r]*(?:,[ \t\n\r]*\{|\])")
_INCOMPLETE_MARGIN = 16      # an error this close to the buffer's end may just be a cut-off value


class _JsonStream:
    """Incremental reader over one JSON document: decodes values one at a time from a growing buffer.

    The buffer holds at least `low` characters ahead of the cursor. A value longer than that (one huge
    event) is read by doubling: the text ahead is grown to twice its length in one step (the new chunks
    joined once) and the value scanned again, so reading a value of n characters costs O(n) scanning and
    copying, not O(n^2 / chunk); once it is decoded the buffer goes back to its usual size. A UTF-8 byte
    order mark at the start is dropped."""

    def __init__(self, fh: IO[bytes], chunk_bytes: int, stats: TraceStats):
        self.fh = fh
        self.chunk = chunk_bytes
        self.low = max(chunk_bytes // 4, 1 << 16)   # keep at least this much text ahead of the cursor
        self.dec = codecs.getincrementaldecoder("utf-8-sig")("replace")
        self.buf = ""
        self.pos = 0
        self.eof = False
        self.stats = stats
        self.scan = json.JSONDecoder().scan_once

    def _read(self) -> str | None:
        """The text of one more chunk ('' when it decodes to nothing yet); None at end of file."""
        if self.eof:
            return None
        data = self.fh.read(self.chunk)
        if not data:
            self.eof = True
            return self.dec.decode(b"", final=True)
        self.stats.bytes_read += len(data)
        return self.dec.decode(data)

    def fill(self, ahead: int = 0, boundary: bool = False) -> bool:
        """Read at least one more chunk, and more until `ahead` characters lie ahead of the cursor and, with
        `boundary`, the new text holds a place where an event may end (`_RESYNC`); the chunks are joined to
        the buffer once. False when nothing more could be read."""
        parts = [self.buf[self.pos:]]
        have = len(parts[0])
        got = False
        while True:
            text = self._read()
            if text is None:
                break
            if text:
                parts.append(text)
                have += len(text)
                got = True
            if self.eof:
                break
            if got and have >= ahead and (not boundary or _RESYNC.search(parts[-2][-64:] + text) is not None):
                break
        if got:
            self.buf = "".join(parts)
            self.pos = 0
        return got

    def peek(self) -> str:
        """The next non-blank character ('' at end of file), cursor moved onto it."""
        while True:
            self.pos = _WS.match(self.buf, self.pos).end()
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if not self.fill():
                return ""

    def value(self) -> Any:
        """Decode the value at the cursor (reading more when it is cut off); ValueError(message, position,
        cut) when malformed, `cut` telling a value the buffer's end cut off."""
        if self.peek() == "":
            raise ValueError("Expecting value at end of file", self.pos, True)
        if len(self.buf) - self.pos < self.low:
            self.fill(self.low)
        while True:
            try:
                obj, end = self.scan(self.buf, self.pos)
            except StopIteration as e:
                err_pos, msg = e.value, "Expecting value"
            except json.JSONDecodeError as e:
                err_pos, msg = e.pos, e.msg
            except RecursionError:
                raise ValueError("nested too deeply to decode", self.pos, False) from None
            else:
                if end >= len(self.buf) and not self.eof:   # a number may go on in the next chunk
                    self.fill(2 * (len(self.buf) - self.pos))
                    continue
                self.pos = end
                return obj
            cut = err_pos >= len(self.buf) - _INCOMPLETE_MARGIN or msg.startswith("Unterminated string")
            if cut and not self.eof:
                # a large value: read on to where it may end, and at least twice the text, then scan again
                self.fill(2 * (len(self.buf) - self.pos), boundary=True)
                continue
            raise ValueError(f"{msg} at character {err_pos - self.pos} of the value", err_pos, cut)

    def expect(self, ch: str) -> None:
        got = self.peek()
        if got != ch:
            raise ProbeError(f"{self.stats.path}: not a Chrome trace: expected {ch!r}, found "
                             f"{self.buf[self.pos:self.pos + 40]!r}")
        self.pos += 1

    def resync(self, from_pos: int) -> bool:
        """Skip a malformed event: move the cursor to the start of the next event, or onto the array's
        closing ']' when it was the last; False at end of file."""
        start = max(from_pos, self.pos + 1)
        while True:
            m = _RESYNC.search(self.buf, start)
            if m:
                self.pos = m.end() - 1
                return True
            start = max(self.pos, len(self.buf) - 64)
            keep = start - self.pos
            if not self.fill():
                return False
            start = keep

    def array_items(self) -> Iterator[Any]:
        """The items of the JSON array whose '[' was just consumed."""
        stats = self.stats
        if self.peek() == "]":
            self.pos += 1
            return
        scan, sep = self.scan, _SEP.match
        count = 0
        try:
            while True:
                # fast path: an item that sits whole in the buffer, then ",\n  " before the next one
                buf, pos = self.buf, self.pos
                if len(buf) - pos < self.low and not self.eof:
                    self.fill()
                    buf, pos = self.buf, self.pos
                try:
                    item, end = scan(buf, pos)
                    if end >= len(buf):
                        raise StopIteration(end)
                    self.pos = end
                except (StopIteration, json.JSONDecodeError, RecursionError):
                    try:
                        item = self.value()   # slow path: leading blanks, a value cut by the buffer's end
                    except ValueError as e:
                        _, err_pos, cut = e.args
                        if cut and self.eof:
                            stats.truncated = True
                            return
                        stats.bad_events += 1
                        if stats.bad_events <= 3:
                            log.warning("%s: malformed event skipped (%s)", stats.path, e.args[0])
                        if not self.resync(err_pos):
                            stats.truncated = True
                            return
                        if self.buf[self.pos] == "]":
                            self.pos += 1
                            return
                        continue
                count += 1
                yield item
                buf = self.buf
                m = sep(buf, self.pos)
                if m is not None and m.end() < len(buf):
                    self.pos = m.end()
                    if buf[self.pos] == "]":          # trailing comma: tolerated
                        self.pos += 1
                        return
                    continue
                c = self.peek()
                if c == ",":
                    self.pos += 1
                    if self.peek() == "]":
                        self.pos += 1
                        return
                elif c == "]":
                    self.pos += 1
                    return
                elif c == "":
                    stats.truncated = True
                    return
                else:
                    stats.bad_events += 1
                    if not self.resync(self.pos):
                        stats.truncated = True
                        return
                    if self.buf[self.pos] == "]":
                        self.pos += 1
                        return
        finally:
            stats.events += count


class _Gunzip:
    """Incremental gzip reader that, unlike `gzip.GzipFile`, hands back everything before a cut or corrupt
    stream (the parser then reports the trace as cut off) and reads concatenated members.

    At a damaged spot the bytes before it are still returned: the compressed data of the failing read is
    fed again, 1 KB at a time, to a copy of the decompressor taken before it (zlib raises without handing
    back what it decoded before the damage). `cut` says the stream ended or broke inside a member;
    `error` holds zlib's message when it broke."""

    _SALVAGE_STEP = 1024

    def __init__(self, raw: IO[bytes]):
        self.raw = raw
        self.d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        self.fed = False            # the current member has received data
        self.pending = b""
        self.done = False
        self.cut = False
        self.error = ""

    def read(self, n: int) -> bytes:
        """Up to `n` decompressed bytes (b"" at the end; at a damaged spot, what precedes it)."""
        out, got = [], 0
        while got < n and not self.done:
            comp = self.d.unconsumed_tail
            if not comp:
                comp, self.pending = self.pending or self.raw.read(1 << 18), b""
            if not comp:
                self.done = True
                self.cut = self.fed and not self.d.eof
                break
            before = self.d.copy()
            try:
                data = self.d.decompress(comp, n - got)
            except zlib.error as e:
                data = self._salvage(before, comp)
                self.done = True
                self.error = str(e)
                # garbage after a complete member is not a cut
                self.cut = self.fed or got == 0 or bool(data)
                out.append(data)
                break
            self.fed = True
            out.append(data)
            got += len(data)
            if self.d.eof:
                self.pending = self.d.unused_data
                self.d = zlib.decompressobj(16 + zlib.MAX_WBITS)
                self.fed = False
        return b"".join(out)

    def _salvage(self, d, comp: bytes) -> bytes:
        """What `d` decodes of `comp` before the first damaged byte."""
        out = []
        step = self._SALVAGE_STEP
        for i in range(0, len(comp), step):
            keep = d.copy()
            try:
                out.append(d.decompress(comp[i:i + step]))
            except zlib.error:
                for j in range(i, min(i + step, len(comp))):    # the failing step again, byte by byte
                    try:
                        out.append(keep.decompress(comp[j:j + 1]))
                    except zlib.error:
                        break
                break
            if d.eof:        # the member ended inside this read: what follows it is the damage
                break
        return b"".join(out)

    def close(self) -> None:
        self.raw.close()


def _open_binary(path: str | os.PathLike):
    try:
        fh = open(path, "rb")
    except OSError as e:
        raise ProbeError(f"cannot read trace {path}: {e.strerror or e}") from e
    head = fh.read(2)
    fh.seek(0)
    if head == b"\x1f\x8b":
        return _Gunzip(fh)
    return fh


def iter_chrome_events(path: str | os.PathLike, meta: dict | None = None, stats: TraceStats | None = None,
                       chunk_bytes: int = 1 << 22) -> Iterator[dict]:
    """Yield the events of a Chrome trace one at a time (object format ``{"traceEvents": [...]}`` or a bare
    array). Top-level keys other than ``traceEvents`` go into `meta`. Memory stays at a few chunks."""
    meta = {} if meta is None else meta
    stats = stats or TraceStats(path=str(path), format="chrome")
    fh = _open_binary(path)
    gz = isinstance(fh, _Gunzip)
    complete = False
    try:
        s = _JsonStream(fh, chunk_bytes, stats)
        c = s.peek()
        if c == "" and gz and fh.cut:
            raise ProbeError(f"{path}: the gzip stream is damaged at its start ({fh.error or 'cut off'}): no "
                             "event can be read; copy the file again from where it was written")
        if c == "[":
            s.pos += 1
            yield from s.array_items()
            complete = not stats.truncated
            return
        if c != "{":
            raise ProbeError(f"{path}: not a Chrome trace (JSON object with traceEvents, or an event array): "
                             f"it starts with {s.buf[s.pos:s.pos + 40]!r}; give the file torch.profiler's "
                             "export_chrome_trace writes")
        s.pos += 1
        seen_events = False
        while True:
            c = s.peek()
            if c == "}" or c == "":
                complete = c == "}" and seen_events and not stats.truncated
                break
            if c == ",":
                s.pos += 1
                continue
            try:
                key = s.value()
            except ValueError as e:
                raise ProbeError(f"{path}: malformed trace header ({e.args[0]})") from None
            s.expect(":")
            if key == "traceEvents":
                seen_events = True
                s.expect("[")
                yield from s.array_items()
                if stats.truncated:
                    break
            else:
                try:
                    meta[key] = s.value()
                except ValueError as e:
                    if e.args[2] and s.eof:
                        stats.truncated = True
                        break
                    raise ProbeError(f"{path}: malformed value of top-level key {key!r} ({e.args[0]})") from None
        if not seen_events:
            if gz and fh.cut:
                raise ProbeError(f"{path}: the gzip stream is damaged before the event array "
                                 f"({fh.error or 'cut off'}): no event can be read; copy the file again")
            raise ProbeError(f"{path}: no traceEvents array: is this a torch.profiler Chrome trace "
                             "(prof.export_chrome_trace(...))?")
    except OSError as e:
        raise ProbeError(f"cannot read trace {path}: {e.strerror or e}") from e
    finally:
        fh.close()
        if gz and fh.cut:
            stats.gzip_error = fh.error
            if complete:           # every event was read: only what follows them (the trailer) is bad
                stats.gzip_damaged_after_events = True
                log.warning("%s: the gzip stream is damaged after the last event (%s): every event was read",
                            path, fh.error or "its end is missing")
            else:
                stats.truncated = True
                log.warning("%s: the gzip stream is cut off or damaged (%s)", path, fh.error or "cut off")
        if stats.truncated:
            log.warning("%s: the file ends inside the event array (cut off?): the events before the cut are "
                        "used", path)


# --------------------------------------------------------------------------- Chrome trace reader
_KERNEL_CATS = {"kernel", "Kernel"}
_COPY_CATS = {"gpu_memcpy", "gpu_memset", "Memcpy", "Memset"}
_OP_CATS = {"cpu_op", "Operator", "user_annotation"}
_RUNTIME_CATS = {"cuda_runtime", "cuda_driver", "Runtime"}
_PYTHON_CATS = {"python_function"}
# profiler ranges kept (detail mode) for attribution: the capture's module and step ranges, torch.profiler's
# own steps, and the ``nn.Module: Class_N`` python_function events of ``with_modules=True``
RANGE_PREFIXES = (runfiles.MODULE_PREFIX, runfiles.STEP_PREFIX, "ProfilerStep#")
PY_MODULE_PREFIX = "nn.Module: "


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


def classify(kn) -> tuple[str, str]:
    """(kind, provenance) of a decoded kernel name: the decoder's classes (`cublaslt_probe.names.classes`)."""
    return kn.kind, kn.provenance


def _kind(name: str, cache: dict) -> int:
    """0: not GEMM related, 1: a GEMM-kind kernel (whichever library), 2: split-K reduce helper."""
    k = cache.get(name)
    if k is None:
        from cublaslt_probe.names import decode
        kn = decode(name)
        k = cache[name] = 2 if kn.family == REDUCE_FAMILY else 1 if classify(kn)[0] == "gemm" else 0
    return k


_I64 = 1 << 63
_INF = float("inf")


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


def _duration(v) -> float | None:
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


def _js(v) -> str | None:
    return None if v is None else json.dumps(v, separators=(", ", ": "))


def op_key_json(key: tuple) -> tuple:
    """(name, repr(dims), repr(types), repr(strides)) -> the same with JSON text (reprs of JSON values)."""
    import ast
    name, *rest = key
    out = []
    for r in rest:
        if r is None or r == "None":
            out.append(None)
            continue
        try:
            out.append(_js(ast.literal_eval(r)))
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            out.append(None)          # not a JSON value (nan, inf): not a record this reader can show
    return (name, *out)


@dataclass
class TraceDetail:
    """What `audit` needs beyond the summary (``read_chrome_trace(path, detail=True)``): every launch, every
    op's time and thread, the attribution ranges. Arrays, not per-event objects.

    - ``launches``: one row per kernel launch (split-K reduces counted with their GEMM and dropped):
      ``name`` (index into `names`), ``kind`` (1 GEMM, 2 orphan reduce, 0 other), ``dur`` (with the
      reduce), ``reduce_us``, ``ts`` (GPU start), ``t_launch`` (CPU time of its launch call, else of its
      op, else ``ts``), ``op_row`` (row in `ops`, -1 when unlinked), ``pid`` (the OS pid of the process that
      launched it, -1 when it cannot be told: `read_chrome_trace` says how it is found), ``device``;
    - ``ops``: one row per CPU op / annotation with an External id: ``key`` (index into `op_keys`), ``ts``,
      ``end``, ``tid``, ``seq`` (autograd ``Sequence number``, -1 without), ``pid``;
    - ``ranges``: the attribution ranges (`RANGE_PREFIXES` annotations and ``nn.Module:`` python functions,
      written as complete events or as B/E pairs): ``name``, ``ts``, ``end``, ``tid``, ``pid``, ``gpu``,
      ``device``. ``gpu`` is True for the GPU-timeline copies of the annotations (``gpu_user_annotation``:
      their ``tid`` is the stream, ``device`` the GPU, ``pid`` the GPU's only launching process, else the one
      process whose kernels start inside the range on its stream, else -1); CPU ranges have ``gpu`` False
      and ``device`` -1.

    A file may hold several processes (merged rank traces): `processes` lists them, `for_process` keeps one.
    """

    names: list
    op_keys: list
    launches: pd.DataFrame
    ops: pd.DataFrame
    ranges: pd.DataFrame

    def processes(self) -> pd.DataFrame:
        """One row per process that launched kernels or ran ops, by pid: ``pid``, ``devices`` (the GPUs of
        its launches, "0, 1"), ``gemm_launches``, ``gpu_time_us`` (its launches' summed time); a last row
        with pid -1 holds the launches whose process cannot be told, when there are any."""
        L = self.launches
        pids = sorted((set(self.ops["pid"].tolist()) | set(L["pid"].tolist())) - {-1})
        rows = []
        for p in pids + ([-1] if (L["pid"] == -1).any() else []):
            mine = L[L["pid"] == p]
            rows.append((p, ", ".join(str(d) for d in sorted(set(mine["device"].tolist()))),
                         int((mine["kind"] == 1).sum()), float(mine["dur"].sum())))
        return pd.DataFrame(rows, columns=["pid", "devices", "gemm_launches", "gpu_time_us"]).astype(
            {"pid": "int64", "devices": "string", "gemm_launches": "int64", "gpu_time_us": "float64"})

    def for_process(self, pid: int) -> "TraceDetail":
        """The part of the trace that belongs to process `pid`: its ops and CPU ranges, its launches, and the
        launches and GPU ranges of its GPUs whose process cannot be told. ``op_row`` is renumbered into the
        kept ops."""
        L, ops, rng = self.launches, self.ops, self.ranges
        if pid not in set(ops["pid"].tolist()) | set(L["pid"].tolist()):
            known = sorted((set(ops["pid"].tolist()) | set(L["pid"].tolist())) - {-1})
            raise ProbeError(f"no process {pid} in this trace: it holds {', '.join(map(str, known)) or 'none'}")
        devices = set(L.loc[L["pid"] == pid, "device"].tolist())
        keep_ops = (ops["pid"] == pid).to_numpy()
        new_row = np.cumsum(keep_ops) - 1
        L = L[(L["pid"] == pid) | ((L["pid"] == -1) & L["device"].isin(devices))].copy()
        r = L["op_row"].to_numpy().copy()
        ok = r >= 0
        r[ok] = np.where(keep_ops[r[ok]], new_row[r[ok]], -1)
        L["op_row"] = r
        rng = rng[(rng["pid"] == pid) | (rng["gpu"] & (rng["pid"] == -1) & rng["device"].isin(devices))]
        return TraceDetail(names=self.names, op_keys=self.op_keys, launches=L.reset_index(drop=True),
                           ops=ops[keep_ops].reset_index(drop=True), ranges=rng.reset_index(drop=True))


RANGE_COLUMNS = ["name", "ts", "end", "tid", "pid", "gpu", "device"]


def read_chrome_trace(path: str | os.PathLike, chunk_bytes: int = 1 << 22, detail: bool = False) -> TraceSummary:
    """Read a torch.profiler Chrome trace (streamed): every kernel's time by kind, provenance and family, and
    the GEMM-kind kernels with their ops and shapes. ``detail=True`` also keeps `TraceDetail` (for `audit`).

    Events that cannot be read are skipped and counted in ``stats.bad_events`` (an item that is not an
    object, a ``name`` that is not a string, ``args`` that are not an object, nesting too deep to decode).
    A file may hold several processes (rank traces merged into one): ids are joined only within their
    process (`_link`), and the rows are per process (column ``pid``)."""
    t0 = time.perf_counter()
    stats = TraceStats(path=str(path), format="chrome")
    try:
        stats.file_bytes = os.path.getsize(path)
    except OSError as e:
        raise ProbeError(f"cannot read trace {path}: {e.strerror or e}") from e
    meta: dict = {}
    names = _Interner()                       # kernel names of the launches kept
    ops = _Interner()                         # (op name, dims, types, strides) as JSON strings
    pids = _Interner()                        # OS pids of the processes (ops, runtime calls, CPU ranges)
    pid_index = pids.index
    kind_cache: dict[str, int] = {}
    per_name: dict[str, list] = {}            # every kernel name -> [count, total_us]
    # one entry per GEMM-kind or reduce launch (detail: per launch of any kernel)
    l_name, l_kind = array("i"), array("b")
    l_ts, l_dur = array("d"), array("d")
    l_dev, l_stream, l_ext, l_corr = array("q"), array("q"), array("q"), array("q")
    # one entry per CPU op / annotation (External id -> interned op, process); annotations kept apart
    o_ext, o_idx, o_pid = array("q"), array("i"), array("i")
    a_ext, a_idx, a_pid = array("q"), array("i"), array("i")
    # detail: the ops' and annotations' times, threads and autograd sequence numbers
    o_ts, o_dur, o_tid, o_seq = array("d"), array("d"), array("q"), array("q")
    a_ts, a_dur, a_tid = array("d"), array("d"), array("q")
    ranges: list[list] = []                   # RANGE_COLUMNS, pid as an index into `pids` (gpu: -1)
    # runtime calls: correlation -> External id, process and CPU time
    r_corr, r_ext, r_ts, r_pid = array("q"), array("q"), array("d"), array("i")
    open_b: dict[tuple, list] = {}            # detail: (pid, tid) -> stack of B events awaiting their E

    def bad(ev, why: str) -> None:
        stats.bad_events += 1
        if stats.bad_events <= 3:
            log.warning("%s: malformed event skipped (%s): %.120r", path, why, ev)

    n_kernels, n_copies, gpu_us, n_ops, n_flows = 0, 0, 0.0, 0, 0
    for ev in iter_chrome_events(path, meta, stats, chunk_bytes):
        if type(ev) is not dict:
            bad(ev, "not an object")
            continue
        name, args, cat = ev.get("name"), ev.get("args"), ev.get("cat")
        if name is not None and type(name) is not str:
            bad(ev, "name is not a string")
            continue
        if cat is not None and type(cat) is not str:
            bad(ev, "cat is not a string")
            continue
        if args is not None and type(args) is not dict:
            bad(ev, "args is not an object")
            continue
        ph = ev.get("ph")
        pend = None                           # detail, a B event: where its E writes the end
        if ph == "E" or ph == "B":
            if not detail:
                if ph == "E":
                    continue
            else:
                key = (str(ev.get("pid")), str(ev.get("tid")))
                if ph == "E":
                    st = open_b.get(key)
                    if st:
                        _close(st.pop(), _as_float(ev.get("ts")), ranges, o_ts, o_dur, a_ts, a_dur)
                    continue
                pend = []
                open_b.setdefault(key, []).append(pend)
        if cat in _KERNEL_CATS or cat in _COPY_CATS:
            name = name or ""
            dur = ev.get("dur")
            if type(dur) is not float or not 0.0 < dur < _INF:
                d = _duration(dur)
                if d is None:
                    stats.bad_durations += 1
                    if stats.bad_durations <= 3:
                        log.warning("%s: %s %r has no valid dur (%r): counted, with 0 µs", path, cat, name[:80],
                                    dur)
                    d = 0.0
                elif d == 0.0:
                    stats.zero_durations += 1
                dur = d
            if cat in _KERNEL_CATS:
                n_kernels += 1
            else:
                n_copies += 1
            gpu_us += dur
            acc = per_name.get(name)
            if acc is None:
                per_name[name] = [1, dur]
            else:
                acc[0] += 1
                acc[1] += dur
            k = kind_cache.get(name)
            if k is None:
                k = _kind(name, kind_cache)
            if k or detail:
                args = args or {}
                l_name.append(names(name))
                l_kind.append(k)
                l_ts.append(_as_float(ev.get("ts")))
                l_dur.append(dur)
                l_dev.append(_as_int(args.get("device"), _as_int(ev.get("pid"), 0)))
                l_stream.append(_as_int(args.get("stream"), _as_int(ev.get("tid"), 0)))
                l_ext.append(_as_id(args.get("External id"), stats))
                l_corr.append(_as_id(args.get("correlation"), stats))
        elif cat in _OP_CATS:
            name = name or ""
            if detail and cat == "user_annotation" and name.startswith(RANGE_PREFIXES):
                ts = _as_float(ev.get("ts"))
                if pend is not None:
                    pend.append(("r", len(ranges), ts))
                ranges.append([name, ts, ts + _as_float(ev.get("dur")), _as_int(ev.get("tid"), 0),
                               pids(_as_int(ev.get("pid"))), False, -1])
            if not args:
                continue
            ext = args.get("External id")
            if type(ext) is not int or not 0 <= ext < _I64:
                ext = _as_id(ext, stats)
            if ext < 0:
                continue
            dims = args.get("Input Dims")
            if dims is None:
                key = (name, None, None, None)
            else:
                key = (name, repr(dims), repr(args.get("Input type")), repr(args.get("Input Strides")))
            pid = ev.get("pid")
            pid = pid_index.get(pid) if type(pid) is int else None
            if pid is None:
                pid = pids(_as_int(ev.get("pid")))
            if cat == "user_annotation":
                a_ext.append(ext)
                a_idx.append(ops(key))
                a_pid.append(pid)
                if detail:
                    ts, du, tid = ev.get("ts"), ev.get("dur"), ev.get("tid")
                    if pend is not None:
                        pend.append(("a", len(a_ts), 0.0))
                    a_ts.append(ts if type(ts) is float else _as_float(ts))
                    a_dur.append(du if type(du) is float else _as_float(du))
                    a_tid.append(_as_int(tid, 0))
            else:
                n_ops += 1
                o_ext.append(ext)
                o_idx.append(ops(key))
                o_pid.append(pid)
                if detail:
                    ts, du, tid = ev.get("ts"), ev.get("dur"), ev.get("tid")
                    if pend is not None:
                        pend.append(("o", len(o_ts), 0.0))
                    o_ts.append(ts if type(ts) is float else _as_float(ts))
                    o_dur.append(du if type(du) is float else _as_float(du))
                    o_tid.append(_as_int(tid, 0))
                    o_seq.append(_as_int(args.get("Sequence number", -1)))
        elif cat in _RUNTIME_CATS:
            if args:
                corr, ext = args.get("correlation"), args.get("External id")
                if type(corr) is not int or not 0 <= corr < _I64:
                    corr = _as_id(corr, stats)
                if corr >= 0:
                    if type(ext) is not int or not 0 <= ext < _I64:
                        ext = _as_id(ext, stats)
                    pid = ev.get("pid")
                    pid = pid_index.get(pid) if type(pid) is int else None
                    ts = ev.get("ts")
                    r_corr.append(corr)
                    r_ext.append(ext)
                    r_ts.append(ts if type(ts) is float else _as_float(ts))
                    r_pid.append(pids(_as_int(ev.get("pid"))) if pid is None else pid)
        elif cat == "ac2g":
            n_flows += 1
        elif detail and cat in _PYTHON_CATS and (name or "").startswith(PY_MODULE_PREFIX):
            ts = _as_float(ev.get("ts"))
            if pend is not None:
                pend.append(("r", len(ranges), ts))
            ranges.append([name, ts, ts + _as_float(ev.get("dur")), _as_int(ev.get("tid"), 0),
                           pids(_as_int(ev.get("pid"))), False, -1])
        elif detail and cat == "gpu_user_annotation" and (name or "").startswith(RANGE_PREFIXES):
            args = args or {}
            ts = _as_float(ev.get("ts"))
            ranges.append([name, ts, ts + _as_float(ev.get("dur")),
                           _as_int(args.get("stream"), _as_int(ev.get("tid"), 0)), -1, True,
                           _as_int(args.get("device"), _as_int(ev.get("pid"), 0))])
    stats.kernels, stats.copies, stats.gpu_time_us = n_kernels, n_copies, gpu_us
    stats.cpu_ops, stats.flows = n_ops, n_flows
    _device_properties(meta)
    # events whose pid cannot be read (pid -1) are a group of their own beside several processes, and the
    # one process's when there is one
    items = pids.items
    o_pid_n, a_pid_n, r_pid_n = _np(o_pid, np.int32), _np(a_pid, np.int32), _np(r_pid, np.int32)
    real = [p for p in items if p != -1]
    if len(real) == 1 and len(items) == 2:
        o_pid_n, a_pid_n, r_pid_n = (np.zeros(len(x), np.int32) for x in (o_pid_n, a_pid_n, r_pid_n))
        for r in ranges:
            if not r[5]:
                r[4] = 0
        items = real
    stats.processes = len(real)

    dev = _np(l_dev, np.int64)
    corr = _np(l_corr, np.int64)
    ext = _np(l_ext, np.int64).copy()
    del l_ext
    l_pid, r_row = _link(corr, ext, dev, _np(l_ts, np.float64), _np(r_corr, np.int64), _np(r_ext, np.int64),
                         _np(r_ts, np.float64), r_pid_n, len(items), stats)
    del l_corr
    # op row of each launch: the innermost cpu_op with its External id in its process, else an annotation
    # (rows after the ops)
    n_o = len(o_ext)
    op_row = _lookup_in(l_pid, ext, o_pid_n, _np(o_ext, np.int64), np.arange(n_o))
    missing = op_row < 0
    if missing.any() and len(a_ext):
        got = _lookup_in(l_pid[missing], ext[missing], a_pid_n, _np(a_ext, np.int64),
                         np.arange(len(a_ext)))
        op_row[missing] = np.where(got >= 0, got + n_o, -1)
    key_of_row = np.concatenate([_np(o_idx, np.int32), _np(a_idx, np.int32)]).astype(np.int64)
    op_idx = np.where(op_row >= 0, key_of_row[np.maximum(op_row, 0)] if len(key_of_row) else -1, -1)
    stats.linked = int(((_np(l_kind, np.int8) == 1) & (op_row >= 0)).sum())
    t_launch = None
    if detail:
        t_launch = _np(l_ts, np.float64).copy()
        row_ts = np.concatenate([_np(o_ts, np.float64), _np(a_ts, np.float64)])
        linked = op_row >= 0
        t_launch[linked] = row_ts[op_row[linked]]
        hit = r_row >= 0
        t_launch[hit] = _np(r_ts, np.float64)[r_row[hit]]
    del r_corr, r_ext, o_ext, a_ext
    att = _attach(_np(l_kind, np.int8), _np(l_ts, np.float64), _np(l_dur, np.float64), dev,
                  _np(l_stream, np.int64), ext, l_pid, stats)
    pid_of = np.array(items + [-1], dtype=np.int64)            # pid index -> OS pid; -1 -> -1
    groups = _group(_np(l_name, np.int32), _np(l_kind, np.int8), op_idx, att, l_pid)
    name_of = names.items
    out = _finish(groups.assign(kernel=[name_of[i] for i in groups["name"]],
                                pid=[int(pid_of[i]) if pid_of[i] >= 0 else None for i in groups["pid"]]),
                  [op_key_json(ops.items[i]) if i >= 0 else None for i in groups["op"]], stats)
    det = None
    if detail:
        order, keep, total, red = att
        rng = pd.DataFrame(ranges, columns=RANGE_COLUMNS).astype(
            {"name": object, "ts": "float64", "end": "float64", "tid": "int64", "pid": "int64", "gpu": "bool",
             "device": "int64"})
        if len(rng):
            gpu = rng["gpu"].to_numpy()
            rp = rng["pid"].to_numpy().copy()
            rp[gpu] = _gpu_range_owner(rng[gpu], dev, _np(l_stream, np.int64), _np(l_ts, np.float64), l_pid)
            rng["pid"] = np.where(rp >= 0, pid_of[np.maximum(rp, 0)], -1)
        det = TraceDetail(
            names=name_of, op_keys=ops.items,
            launches=pd.DataFrame({
                "name": _np(l_name, np.int32)[order][keep], "kind": _np(l_kind, np.int8)[order][keep],
                "dur": total, "reduce_us": red, "ts": _np(l_ts, np.float64)[order][keep],
                "t_launch": t_launch[order][keep], "op_row": op_row[order][keep],
                "pid": pid_of[l_pid[order][keep]], "device": dev[order][keep]}),
            ops=pd.DataFrame({"key": key_of_row, "ts": row_ts,
                              "end": row_ts + np.concatenate([_np(o_dur, np.float64), _np(a_dur, np.float64)]),
                              "tid": np.concatenate([_np(o_tid, np.int64), _np(a_tid, np.int64)]),
                              "seq": np.concatenate([_np(o_seq, np.int64), np.full(len(a_ts), -1, np.int64)]),
                              "pid": pid_of[np.concatenate([o_pid_n, a_pid_n])]}),
            ranges=rng)
    stats.seconds = time.perf_counter() - t0
    log.info("%s", stats.line())
    timeline = timeline_frame(per_name, stats.gpu_time_us)
    return TraceSummary(out, stats.gpu_time_us, stats, meta, _families(timeline), timeline, det,
                        pids=real)


def _close(pend: list, end: float, ranges: list, o_ts, o_dur, a_ts, a_dur) -> None:
    """An E event: the end of what its B event opened (a range, an op's or an annotation's duration)."""
    for what, i, start in pend:
        if what == "r":
            ranges[i][2] = max(end, start)
        elif what == "o":
            o_dur[i] = max(end - o_ts[i], 0.0)
        else:
            a_dur[i] = max(end - a_ts[i], 0.0)


def _device_properties(meta: dict) -> None:
    """``deviceProperties`` as a list of objects, however the file wrote it (one object is wrapped in a
    list; entries that are not objects are dropped), so every reader of it may index it."""
    props = meta.get("deviceProperties")
    if props is None or (type(props) is list and all(type(p) is dict for p in props)):
        return
    meta["deviceProperties"] = [props] if isinstance(props, dict) else \
        [p for p in props if isinstance(p, dict)] if isinstance(props, list) else []


def _np(arr: array, dtype) -> np.ndarray:
    return np.frombuffer(arr, dtype=dtype) if len(arr) else np.zeros(0, dtype)


def _lookup(keys: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Vectorised dict lookup: for each key, the value stored with it in (k, v), else -1 (also for a key < 0).

    The (few) keys are sorted and the (many) table entries searched among them, so the only temporaries
    of the table's length are one index and one mask array."""
    out = np.full(len(keys), -1, dtype=np.int64)
    if not len(k) or not len(keys):
        return out
    uk, inv = np.unique(keys, return_inverse=True)
    pos = np.searchsorted(uk, k)
    np.minimum(pos, len(uk) - 1, out=pos)
    hit = uk[pos] == k
    found = np.full(len(uk), -1, dtype=np.int64)
    found[pos[hit]] = v[hit]
    del pos, hit
    out = found[inv]
    out[keys < 0] = -1
    return out


def _lookup_in(key_pid: np.ndarray, keys: np.ndarray, t_pid: np.ndarray, k: np.ndarray,
               v: np.ndarray) -> np.ndarray:
    """`_lookup` within processes: each key is looked up among the table entries of its own process
    (`key_pid`, `t_pid`: process indices); a key of process -1 finds nothing. One process: one plain lookup."""
    procs = np.unique(t_pid) if len(t_pid) else t_pid
    if len(procs) <= 1:
        out = _lookup(keys, k, v)
        if len(procs) == 1:
            out[key_pid != procs[0]] = -1
        return out
    out = np.full(len(keys), -1, dtype=np.int64)
    for p in procs.tolist():
        mk, mt = key_pid == p, t_pid == p
        if mk.any():
            out[mk] = _lookup(keys[mk], k[mt], v[mt])
    return out


def _device_owner(devices: np.ndarray, l_dev: np.ndarray, l_pid: np.ndarray) -> np.ndarray:
    """For each device: the process index whose launches are the only ones on it, else -1 (several or
    none)."""
    out = np.full(len(devices), -1, dtype=np.int64)
    known = l_pid >= 0
    if not len(devices) or not known.any():
        return out
    pairs = np.unique(np.stack([l_dev[known], l_pid[known].astype(np.int64)]), axis=1)
    d, first, n = np.unique(pairs[0], return_index=True, return_counts=True)
    owner = dict(zip(d[n == 1].tolist(), pairs[1][first[n == 1]].tolist()))
    return np.array([owner.get(x, -1) for x in devices.tolist()], dtype=np.int64)


def _gpu_range_owner(rng: pd.DataFrame, l_dev: np.ndarray, l_stream: np.ndarray, l_ts: np.ndarray,
                     l_pid: np.ndarray) -> np.ndarray:
    """The process index of each GPU-timeline range: its device's only launching process; on a device that
    several share, the one process whose kernels start inside the range on its stream; else -1."""
    out = _device_owner(rng["device"].to_numpy(), l_dev, l_pid)
    todo = np.flatnonzero(out < 0)
    if not len(todo):
        return out
    r_dev, r_stream = rng["device"].to_numpy()[todo], rng["tid"].to_numpy()[todo]
    r_ts, r_end = rng["ts"].to_numpy()[todo], rng["end"].to_numpy()[todo]
    known = l_pid >= 0
    for d, st in set(zip(r_dev.tolist(), r_stream.tolist())):
        mine = np.flatnonzero(known & (l_dev == d) & (l_stream == st))
        if not len(mine):
            continue
        mine = mine[np.argsort(l_ts[mine], kind="stable")]
        t, p = l_ts[mine], l_pid[mine]
        sel = np.flatnonzero((r_dev == d) & (r_stream == st))
        lo = np.searchsorted(t, r_ts[sel], "left")
        hi = np.searchsorted(t, r_end[sel], "right")
        for i, a, b in zip(sel.tolist(), lo.tolist(), hi.tolist()):
            if b > a and p[a:b].min() == p[a:b].max():
                out[todo[i]] = p[a]
    return out


def _link(corr: np.ndarray, ext: np.ndarray, dev: np.ndarray, ts: np.ndarray, r_corr: np.ndarray,
          r_ext: np.ndarray, r_ts: np.ndarray, r_pid: np.ndarray, n_procs: int,
          stats: TraceStats) -> tuple[np.ndarray, np.ndarray]:
    """Each launch's process (index into the reader's pids, -1 when it cannot be told) and launch call (row
    in the runtime arrays, -1 when none); fills a missing External id (`ext`, in place) from the call's.

    Kernel events carry the device as their pid; the runtime calls carry the OS pid, and correlation and
    External ids are counted per process, so with several processes in the file (merged rank traces) an id
    may stand for one call in each. A kernel's candidates are the calls with its correlation; when the
    kernel has an External id, those with the same External id, if any. Then:
    1. candidates of one process only: the kernel is that process's (each such match also tells which
       processes launch on the kernel's device);
    2. else the candidates of the processes known to launch on the kernel's device (all when none is);
    3. the kernels that share a correlation and as many candidate calls (the same program on several
       ranks) are paired with them in time order, one call each;
    4. else the latest candidate at or before the kernel's start;
    5. else none: the kernel is unlinked and counted in ``stats.no_process``.
    A kernel without a call belongs to the only process known to launch on its device, if there is one.
    With one process, every kernel is that process's."""
    n = len(corr)
    r_row = np.full(n, -1, dtype=np.int64)
    if n_procs <= 1:
        l_pid = np.full(n, 0 if n_procs == 1 else -1, dtype=np.int64)
        if len(r_corr):
            r_row = _lookup(corr, r_corr, np.arange(len(r_corr)))
    else:
        l_pid = np.full(n, -1, dtype=np.int64)
        order = np.lexsort((r_ts, r_corr))
        sc = r_corr[order]
        lo = np.searchsorted(sc, corr, "left")
        hi = np.searchsorted(sc, corr, "right")
        cnt = np.where(corr >= 0, hi - lo, 0)
        # one candidate: linked; several: one row per (kernel, call)
        one = np.flatnonzero(cnt == 1)
        r_row[one] = order[lo[one]]
        amb = np.flatnonzero(cnt > 1)
        k_of = np.repeat(amb, cnt[amb])
        within = np.arange(len(k_of)) - np.repeat(np.cumsum(cnt[amb]) - cnt[amb], cnt[amb])
        c_row = order[np.repeat(lo[amb], cnt[amb]) + within]
        c = pd.DataFrame({"k": k_of, "row": c_row, "pid": r_pid[c_row].astype(np.int64), "t": r_ts[c_row]})
        same_ext = (ext[k_of] >= 0) & (r_ext[c_row] == ext[k_of])
        c = c[same_ext | ~pd.Series(same_ext, index=c.index).groupby(c["k"]).transform("any")]
        one_proc = c.groupby("k")["pid"].transform("nunique") == 1
        sure = c[one_proc].drop_duplicates("k")
        r_row[sure["k"].to_numpy()] = sure["row"].to_numpy()
        c = c[~one_proc]
        linked = r_row >= 0
        l_pid[linked] = r_pid[r_row[linked]]
        # which processes launch on which device, from the sure matches
        devs, dev_i = np.unique(dev, return_inverse=True)
        owns = np.zeros((n_procs, len(devs)), dtype=bool)
        owns[l_pid[linked], dev_i[linked]] = True
        if len(c):
            k = c["k"].to_numpy()
            c = c.assign(own=owns[c["pid"].to_numpy(), dev_i[k]], corr=corr[k], kts=ts[k])
            c = c[c["own"] | ~c.groupby("k")["own"].transform("any")]          # 2: the device's processes
            _pick(c, r_row, l_pid)
        # no call: the device's only launching process
        none = (l_pid < 0) & (cnt == 0)
        if none.any():
            only = owns.sum(axis=0) == 1
            owner = np.where(only, owns.argmax(axis=0), -1)
            l_pid[none] = owner[dev_i[none]]
        stats.no_process = int((l_pid < 0).sum())
    need = ext < 0
    hit = need & (r_row >= 0)
    ext[hit] = r_ext[r_row[hit]]
    return l_pid, r_row


def _pick(c: pd.DataFrame, r_row: np.ndarray, l_pid: np.ndarray) -> None:
    """Steps 1-4 of `_link` for the kernels whose candidate calls (`c`: k, row, pid, t, corr, kts) lie in
    several processes; writes the chosen call and process into `r_row` and `l_pid`."""
    single = c.groupby("k")["k"].transform("size") == 1
    done = c[single]
    r_row[done["k"].to_numpy()] = done["row"].to_numpy()
    l_pid[done["k"].to_numpy()] = done["pid"].to_numpy()
    c = c[~single]
    if not len(c):
        return
    # 3: as many kernels as calls under one correlation: paired in time order, if every pair is a candidate
    kern = c.drop_duplicates("k").sort_values(["kts", "k"], kind="stable")
    calls = c.drop_duplicates("row").sort_values(["t", "pid", "row"], kind="stable")
    kern = kern.assign(nth=kern.groupby("corr").cumcount())
    calls = calls.assign(nth=calls.groupby("corr").cumcount())
    n_k, n_c = kern.groupby("corr").size(), calls.groupby("corr").size()
    even = n_k.index[n_k.reindex(n_c.index).eq(n_c).reindex(n_k.index, fill_value=False).to_numpy()]
    pairs = kern[kern["corr"].isin(even)][["k", "corr", "nth"]].merge(
        calls[calls["corr"].isin(even)][["row", "pid", "corr", "nth"]], on=["corr", "nth"])
    valid = pairs.merge(c[["k", "row"]], on=["k", "row"], how="left", indicator=True)["_merge"].eq("both")
    bad_corr = set(pairs.loc[~valid.to_numpy(), "corr"].tolist())
    pairs = pairs[~pairs["corr"].isin(bad_corr)]
    r_row[pairs["k"].to_numpy()] = pairs["row"].to_numpy()
    l_pid[pairs["k"].to_numpy()] = pairs["pid"].to_numpy()
    # 4: the latest call at or before the kernel's start
    c = c[~c["k"].isin(pairs["k"]) & (c["t"] <= c["kts"])]
    c = c.sort_values(["k", "t", "pid"], ascending=[True, False, True], kind="stable").drop_duplicates("k")
    r_row[c["k"].to_numpy()] = c["row"].to_numpy()
    l_pid[c["k"].to_numpy()] = c["pid"].to_numpy()


def _attach(kind: np.ndarray, ts: np.ndarray, dur: np.ndarray, dev: np.ndarray, stream: np.ndarray,
            ext: np.ndarray, pid: np.ndarray, stats: TraceStats) -> tuple:
    """Count each split-K reduce with the GEMM launched before it on its stream (by the same op, or either
    unlinked). One row per launch (kind 1 GEMM, 2 reduce, 0 other); returns (order, keep, total, reduce):
    the launches sorted by (device, process, stream, time), which of them stay (all but the attached
    reduces), and the kept launches' time with their reduces and the reduce part. Two processes' streams
    on one device are different streams. Numpy only."""
    n = len(kind)
    order = np.lexsort((ts, stream, pid, dev))
    k_s = kind[order]
    is_gemm = k_s == 1
    stats.gemm_launches = int(is_gemm.sum())
    stats.reduce_launches = int((k_s == 2).sum())
    ext_s = ext[order]
    idx = np.arange(n)
    # for each row: the latest GEMM row at or before it, and the first row of its (device, process, stream) run
    last = np.maximum.accumulate(np.where(is_gemm, idx, -1)) if n else idx
    d_s, s_s, p_s = dev[order], stream[order], pid[order]
    new_run = np.ones(n, dtype=bool)
    new_run[1:] = (d_s[1:] != d_s[:-1]) | (s_s[1:] != s_s[:-1]) | (p_s[1:] != p_s[:-1])
    run_start = np.maximum.accumulate(np.where(new_run, idx, 0)) if n else idx
    del d_s, s_s, p_s, new_run
    cand = (k_s == 2) & (last >= run_start)       # other kernels (detail mode) neither attach nor interrupt
    c_rows = np.flatnonzero(cand)
    owners = last[c_rows]
    same_op = (ext_s[c_rows] < 0) | (ext_s[owners] < 0) | (ext_s[c_rows] == ext_s[owners])
    att_rows, att_owner = c_rows[same_op], owners[same_op]
    stats.reduce_attached = len(att_rows)
    dur_s = dur[order]
    reduce_us = np.zeros(n)
    np.add.at(reduce_us, att_owner, dur_s[att_rows])
    keep = np.ones(n, dtype=bool)
    keep[att_rows] = False
    return order, keep, (dur_s + reduce_us)[keep], reduce_us[keep]


def _group(name: np.ndarray, kind: np.ndarray, op: np.ndarray, att: tuple, pid: np.ndarray) -> pd.DataFrame:
    """The GEMM and orphan-reduce launches kept by `_attach`, grouped by (kernel, op, process): count,
    total_us, min_us, max_us, reduce_us."""
    cols = ["name", "op", "pid", "count", "total_us", "min_us", "max_us", "reduce_us"]
    order, keep, t, r = att
    sel = kind[order][keep] > 0
    t, r = t[sel], r[sel]
    nm, o, p = name[order][keep][sel], op[order][keep][sel], pid[order][keep][sel]
    if not len(nm):
        return pd.DataFrame({c: pd.Series([], dtype=np.float64 if c.endswith("_us") else np.int64) for c in cols})
    keys = np.stack([nm.astype(np.int64), o.astype(np.int64), p.astype(np.int64)], axis=1)
    uniq, first, inv = np.unique(keys, axis=0, return_index=True, return_inverse=True)
    inv = inv.reshape(-1)
    g = len(uniq)
    count = np.bincount(inv, minlength=g)
    total = np.bincount(inv, weights=t, minlength=g)
    red = np.bincount(inv, weights=r, minlength=g)
    mn = np.full(g, np.inf)
    mx = np.full(g, -np.inf)
    np.minimum.at(mn, inv, t)
    np.maximum.at(mx, inv, t)
    return pd.DataFrame({"name": nm[first].astype(np.int64), "op": o[first], "pid": p[first].astype(np.int64),
                         "count": count, "total_us": total, "min_us": mn, "max_us": mx, "reduce_us": red})[cols]


# --------------------------------------------------------------------------- GPU time by class
# How the timeline's sentence writes the decoder's `library` (others as they are; no library: the family).
LIBRARY_NAMES = {"cublas": "cuBLAS", "cudnn": "cuDNN", "triton": "Triton", "cutlass": "CUTLASS", "nccl": "NCCL",
                 "flashinfer": "FlashInfer", "tensorrt_llm": "TensorRT-LLM", "deepgemm": "DeepGEMM"}
_KIND_WORDS = {"gemm": "GEMMs", "attention": "attention", "elementwise": "elementwise", "reduction": "reductions",
               "copy": "copies", "communication": "communication", "other": "other kernels"}

TIMELINE_SCHEMA: dict[str, tuple[str, str]] = {
    "kind": ("string", "what the kernel does: gemm, attention, elementwise, reduction, copy, communication, "
                       "other (cublaslt_probe.names.classes)"),
    "provenance": ("string", "how the kernel came to exist: library-selected, ahead-of-time, runtime-compiled, "
                             "unknown"),
    "library": ("string", "who ships or launches the kernel (decoded: cublas, cudnn, torch, triton, ...); "
                          "null when the name does not say"),
    "family": ("string", "decoded family"),
    "kernels": ("Int64", "distinct kernel names"),
    "launches": ("Int64", "launches (kernels, memcpy and memset rows)"),
    "total_us": ("float64", "summed duration, µs"),
    "share": ("float64", "fraction of the trace's GPU time"),
}


def timeline_frame(per_name: dict[str, list], gpu_time_us: float) -> pd.DataFrame:
    """GPU time of every kernel name, by (kind, provenance, family)."""
    from cublaslt_probe.names import decode
    acc: dict[tuple, list] = {}
    for name, (n, t) in per_name.items():
        kn = decode(name)
        kind, prov = classify(kn)
        a = acc.setdefault((kind, prov, kn.library, kn.family), [0, 0, 0.0])
        a[0] += 1
        a[1] += n
        a[2] += t
    df = pd.DataFrame([(*k, *v) for k, v in acc.items()], columns=list(TIMELINE_SCHEMA)[:-1])
    df["share"] = df["total_us"] / gpu_time_us if gpu_time_us else np.nan
    df = df.astype({c: dt for c, (dt, _) in TIMELINE_SCHEMA.items()})
    return df.sort_values(["total_us", "family"], ascending=[False, True], kind="stable").reset_index(drop=True)


def _families(timeline: pd.DataFrame) -> pd.DataFrame:
    """GPU time per decoded family (the timeline summed over kind and provenance)."""
    df = timeline.groupby("family", sort=False, observed=True)[["kernels", "launches", "total_us", "share"]].sum()
    return df.reset_index().sort_values("total_us", ascending=False, kind="stable").reset_index(drop=True)


def timeline_groups(timeline: pd.DataFrame) -> pd.DataFrame:
    """The timeline in the words of its summary sentence: one row per (provenance, library, kind) with its
    ``label`` ("library-selected cuBLAS GEMMs"), ``total_us`` and ``share``, largest first. A kernel whose
    library the name does not say is counted under its family."""
    if not len(timeline):
        return pd.DataFrame(columns=["provenance", "library", "kind", "label", "total_us", "share"])
    lib = [LIBRARY_NAMES.get(lb, lb) if isinstance(lb, str) else f
           for lb, f in zip(timeline["library"].astype(object), timeline["family"])]
    g = (timeline.assign(library=lib).groupby(["provenance", "library", "kind"], sort=False, observed=True)
         [["total_us", "share"]].sum().reset_index())
    g["label"] = [f"{p} {lb} {_KIND_WORDS.get(k, k)}" for p, lb, k in
                  zip(g["provenance"], g["library"], g["kind"])]
    return g.sort_values(["total_us", "label"], ascending=[False, True], kind="stable").reset_index(drop=True)


def timeline_sentence(timeline: pd.DataFrame, top: int = 6) -> str:
    """"62.0 % library-selected cuBLAS GEMMs, 21.0 % runtime-compiled Triton elementwise, …"."""
    g = timeline_groups(timeline)
    if not len(g):
        return "no GPU time"
    parts = [f"{100 * s:.1f} % {lb}" for lb, s in zip(g["label"].head(top), g["share"].head(top))]
    rest = g["share"].iloc[top:].sum()
    if len(g) > top:
        parts.append(f"{100 * rest:.1f} % in {len(g) - top} more groups")
    return ", ".join(parts)


# --------------------------------------------------------------------------- op -> torch-view problem
def _letter(dims, strides) -> str | None:
    """N when the last two dims are row-major contiguous, T when stored transposed, None if unclear."""
    if not dims or not strides or len(dims) < 2 or len(strides) != len(dims):
        return None
    (r, c), (s0, s1) = dims[-2:], strides[-2:]
    if c == 1 and r == 1:
        return "N"
    if s1 == 1 and (s0 >= c or r == 1):
        return "N"
    if s0 == 1 and (s1 >= r or c == 1):
        return "T"
    return None


def problem_of(op: str | None, dims_json: str | None, types_json: str | None,
               strides_json: str | None) -> dict[str, Any]:
    """The torch-view GEMM (m, n, k, batch, dtype, layout; grouped ops also groups, group_dim) a GEMM op's
    recorded inputs describe.

    Only for `GEMM_OPS`; other ops and missing shapes give ``{}``; a field the record cannot give is None.
    A grouped GEMM's m, n, k are the totals over its groups (`GROUPED_OPS`): the offsets' values, hence the
    size of each group, are a tensor the trace does not record.
    """
    where = GEMM_OPS.get(op or "")
    if where is None or not dims_json:
        return {}
    try:
        dims = json.loads(dims_json)
        types = json.loads(types_json) if types_json else []
        strides = json.loads(strides_json) if strides_json else []
        a, b = dims[where[0]], dims[where[1]]
    except (ValueError, IndexError, TypeError, KeyError):
        return {}
    types = types if isinstance(types, list) else []
    strides = strides if isinstance(strides, list) else []
    if not (isinstance(a, list) and isinstance(b, list)):
        return {}
    out: dict[str, Any] = {}
    try:
        if op in GROUPED_OPS:
            g = _groups(dims, GROUPED_OPS[op], a, b)
            if g is None:
                return {}
            out.update(g)
        elif op in ("aten::mv", "aten::addmv"):
            out.update(m=a[0], k=a[1], n=1, batch=1)
        elif len(a) == 3 and len(b) == 3:
            out.update(batch=a[0], m=a[1], k=a[2], n=b[2])
        elif len(a) == 2 and len(b) == 2:
            out.update(batch=1, m=a[0], k=a[1], n=b[1])
        else:
            return {}
    except (IndexError, TypeError):
        return {}
    if any(type(out.get(c)) is not int for c in ("m", "n", "k", "batch")) or \
            ("groups" in out and out["groups"] is not None and type(out["groups"]) is not int):
        return {}                 # dims that are not integers: not a shape this reader can use
    ta = _TORCH_DTYPES.get(types[where[0]]) if len(types) > where[0] and type(types[where[0]]) is str else None
    tb = _TORCH_DTYPES.get(types[where[1]]) if len(types) > where[1] and type(types[where[1]]) is str else None
    if ta and ta.startswith("fp8"):
        out["dtype"] = "fp8" if (ta, tb) == ("fp8_e4m3", "fp8_e4m3") else \
            "fp8_e5m2" if (ta, tb) == ("fp8_e5m2", "fp8_e4m3") else f"{ta}x{tb}"
    else:
        out["dtype"] = ta
    if op in ("aten::mv", "aten::addmv"):
        out["layout"] = None
    else:
        try:
            la = _letter(a, strides[where[0]] if len(strides) > where[0] else None)
            lb = _letter(b, strides[where[1]] if len(strides) > where[1] else None)
        except TypeError:             # strides that are not integers
            la = lb = None
        out["layout"] = la + lb if la and lb else None
    return out


def _groups(dims: list, offs_at: int, a: list, b: list) -> dict | None:
    """m, n, k, batch, groups, group_dim of a grouped GEMM from its operands' dims (`GROUPED_OPS`)."""
    offs = dims[offs_at] if len(dims) > offs_at and dims[offs_at] else None
    g = offs[0] if offs else None
    if len(a) == 2 and len(b) == 3:
        return dict(m=a[0], k=a[1], n=b[2], batch=1, groups=b[0], group_dim="m")
    if len(a) == 3 and len(b) == 2:
        return dict(m=a[1], k=a[2], n=b[1], batch=1, groups=a[0], group_dim="n")
    if len(a) == 2 and len(b) == 2 and g:
        return dict(m=a[0], k=a[1], n=b[1], batch=1, groups=g, group_dim="k")
    if len(a) == 3 and len(b) == 3:
        return dict(m=a[1], k=a[2], n=b[2], batch=a[0], groups=a[0], group_dim=None)
    return None


def _finish(groups: pd.DataFrame, op_keys: list, stats: TraceStats) -> pd.DataFrame:
    """Group rows (kernel, op key, count, times) -> the TRACE_SCHEMA frame, largest total first."""
    from cublaslt_probe.names import decode
    rows = []
    pids = groups["pid"] if "pid" in groups else [None] * len(groups)
    for (kernel, count, total, mn, mx, red), key, pid in zip(
            groups[["kernel", "count", "total_us", "min_us", "max_us", "reduce_us"]].itertuples(index=False),
            op_keys, pids):
        kn = decode(kernel)
        op, dims, types, strides = key if key else (None, None, None, None)
        kind, prov = classify(kn)
        if dims is not None:
            stats.with_shapes += int(count) if kind == "gemm" and kn.family != REDUCE_FAMILY else 0
        types_code = kn.type_code or "/".join(x for x in (kn.a_type, kn.c_type, kn.compute_type) if x) or None
        row = {
            "share": total / stats.gpu_time_us if stats.gpu_time_us else None,
            "count": count, "total_us": total, "mean_us": total / count if count else None,
            "min_us": mn, "max_us": mx, "reduce_us": red,
            "kernel": kernel, "family": kn.family, "provenance": prov, "kernel_short": kn.short, "arch": kn.arch,
            "types": types_code, "tile_m": kn.tile_m, "tile_n": kn.tile_n, "tile_k": kn.tile_k,
            "stages": kn.stages, "cluster_m": kn.cluster_m, "cluster_n": kn.cluster_n,
            "split_k": kn.split_k, "kernel_layout": kn.layout, "kernel_flags": " ".join(kn.flags) or None,
            "op": op, "input_dims": dims, "input_types": types, "input_strides": strides,
            "problem_shape": kn.problem_shape, "pid": pid,
        }
        p = problem_of(op, dims, types, strides)
        row.update({c: p.get(c) for c in ("dtype", "layout", "m", "n", "k", "batch", "groups", "group_dim")})
        rows.append(row)
    df = pd.DataFrame(rows, columns=TRACE_COLUMNS)
    df = _coerce(df)
    return df.sort_values(["total_us", "kernel"], ascending=[False, True], kind="stable").reset_index(drop=True)


def _coerce(df: pd.DataFrame) -> pd.DataFrame:
    for col, (dt, _) in TRACE_SCHEMA.items():
        if dt == "category":
            df[col] = df[col].astype("string").astype("category")
        elif dt in ("Int64", "boolean"):
            df[col] = pd.array(df[col].tolist(), dtype=dt)
        else:
            df[col] = df[col].astype(dt)
    return df


# --------------------------------------------------------------------------- Nsight Systems SQLite
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
        if _kind(name, kind_cache) and sid is not None:
            gemm_ids.append(sid)
    stats.events = stats.kernels
    # stream the GEMM and reduce launches in (device, stream, start) order; attach each reduce to the GEMM
    # launched before it on its stream
    agg: dict[str, list] = {}       # name -> [count, total, min, max, reduce]
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

    if gemm_ids:
        con.execute("CREATE TEMP TABLE _gemm_ids(id INTEGER PRIMARY KEY)")
        con.executemany("INSERT INTO _gemm_ids VALUES (?)", [(i,) for i in gemm_ids])
        q = (f"SELECT {dev}, {stream}, k.start, k.end, s.value FROM {_NSYS_KERNEL} k "
             f"JOIN StringIds s ON s.id = {name_expr} WHERE {name_expr} IN (SELECT id FROM _gemm_ids) "
             f"ORDER BY {dev}, {stream}, k.start")
        for d, st, start, end, name in con.execute(q):
            dur = (end - start) / 1e3
            kind = _kind(name, kind_cache)
            key = (d, st)
            if kind == 1:
                stats.gemm_launches += 1
                prev = last.get(key)
                if prev is not None:
                    close(prev)
                last[key] = [name, dur, 0.0]
            else:
                stats.reduce_launches += 1
                prev = last.get(key)
                if prev is not None:
                    prev[2] += dur
                    stats.reduce_attached += 1
                else:
                    close([name, dur, 0.0])
        for entry in last.values():
            close(entry)
    groups = pd.DataFrame([(name, -1, *a) for name, a in agg.items()],
                          columns=["kernel", "op", "count", "total_us", "min_us", "max_us", "reduce_us"])
    out = _finish(groups, [None] * len(groups), stats)
    stats.seconds = time.perf_counter() - t0
    log.info("%s", stats.line())
    timeline = timeline_frame(per_name, stats.gpu_time_us)
    return TraceSummary(out, stats.gpu_time_us, stats, {}, _families(timeline), timeline)


# --------------------------------------------------------------------------- entry point
_BOM = codecs.BOM_UTF8


def read_trace(path: str | os.PathLike, chunk_bytes: int = 1 << 22) -> TraceSummary:
    """Read a torch.profiler Chrome trace (.json / .json.gz: an object with ``traceEvents`` or a bare array of
    events, with or without a UTF-8 byte order mark) or an Nsight Systems SQLite export."""
    try:
        with open(path, "rb") as f:
            head = f.read(16)
    except OSError as e:
        raise ProbeError(f"cannot read trace {path}: {e.strerror or e}") from e
    if head.startswith(b"SQLite format 3"):
        return read_nsys_sqlite(path)
    if head.startswith(b"\x1f\x8b") or head.removeprefix(_BOM).lstrip()[:1] in (b"{", b"["):
        return read_chrome_trace(path, chunk_bytes)
    if str(path).endswith(".nsys-rep") or str(path).endswith(".qdrep"):
        raise ProbeError(f"{path} is an Nsight Systems report: export it first with "
                         "`nsys export --type sqlite FILE` and pass the .sqlite file")
    raise ProbeError(f"{path}: not a Chrome trace (.json/.json.gz) nor an Nsight Systems SQLite export "
                     f"(it starts with {head!r})")


def by_kernel(df: pd.DataFrame) -> pd.DataFrame:
    """One row per kernel (per kernel and process in a file of several processes): the (kernel, op, shapes)
    rows of `read_trace` summed; ``ops`` lists the calling ops and ``shapes`` how many distinct op/shape
    records called it."""
    if not len(df):
        return df.assign(ops=pd.Series([], dtype="string"), shapes=pd.Series([], dtype="Int64"))
    fixed = [c for c in TRACE_COLUMNS if c not in (
        "share", "count", "total_us", "mean_us", "min_us", "max_us", "reduce_us", "op", "input_dims",
        "input_types", "input_strides", "dtype", "layout", "m", "n", "k", "batch", "groups", "group_dim")]
    g = df.groupby(["kernel", "pid"], sort=False, observed=True, dropna=False)
    out = g.agg(share=("share", "sum"), count=("count", "sum"), total_us=("total_us", "sum"),
                min_us=("min_us", "min"), max_us=("max_us", "max"), reduce_us=("reduce_us", "sum"))
    out["mean_us"] = out["total_us"] / out["count"]
    out["ops"] = g["op"].agg(lambda s: ", ".join(sorted({str(x) for x in s.dropna()}))).replace("", pd.NA)
    out["shapes"] = g["input_dims"].agg(lambda s: s.dropna().nunique()).astype("Int64")
    first = g[[c for c in fixed if c not in ("kernel", "pid")]].first()
    out = out.join(first).reset_index()
    cols = ["share", "count", "total_us", "mean_us", "min_us", "max_us", "reduce_us", *fixed, "ops", "shapes"]
    out = out[cols]
    out["count"] = out["count"].astype("Int64")
    out["ops"] = out["ops"].astype("string")
    return out.sort_values(["total_us", "kernel"], ascending=[False, True], kind="stable").reset_index(drop=True)
