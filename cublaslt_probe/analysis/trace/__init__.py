"""Where a profiled program's GPU time went (every kernel by kind and provenance), and which GEMM kernels it
ran, for how long, called by which op with which shapes.

Two readers, one result (`TraceSummary`, whose `.kernels` is a tidy DataFrame; columns in `TRACE_SCHEMA`):

- `read_chrome_trace(path)`: a torch.profiler / Kineto Chrome trace (`.json` or gzip `.json.gz`), streamed
  (`events`) into small collectors of compact columns (`collect`), so memory grows by a few MB per 100 MB of
  trace (docs/trace.md gives the measured figures). A malformed event is skipped and counted, a truncated
  file ends the stream with a warning; neither raises.
- `read_nsys_sqlite(path)`: an Nsight Systems SQLite export (`nsys`).

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
  traces) they are joined only within their process (`link`), and the rows are per process (``pid``).

The package's modules: `schema` (the result's columns and types), `events` (the JSON streamer), `collect`
(the Chrome reader's collectors and joins' driver), `link` (the vectorised joins), `rows` (GEMM rows and
their torch-view problem), `timeline` (GPU time by class), `nsys` (the Nsight reader).
"""
from __future__ import annotations

import codecs
import os

from cublaslt_probe.analysis.trace.collect import read_chrome_trace
from cublaslt_probe.analysis.trace.events import iter_chrome_events
from cublaslt_probe.analysis.trace.nsys import read_nsys_sqlite
from cublaslt_probe.analysis.trace.rows import by_kernel, op_key_json, problem_of
from cublaslt_probe.analysis.trace.schema import (
    GEMM_OPS,
    GROUPED_OPS,
    PY_MODULE_PREFIX,
    RANGE_COLUMNS,
    RANGE_PREFIXES,
    REDUCE_FAMILY,
    TRACE_COLUMNS,
    TRACE_SCHEMA,
    TraceDetail,
    TraceStats,
    TraceSummary,
    classify,
)
from cublaslt_probe.analysis.trace.timeline import (
    LIBRARY_NAMES,
    TIMELINE_SCHEMA,
    timeline_frame,
    timeline_groups,
    timeline_sentence,
)
from cublaslt_probe.errors import ProbeError
from cublaslt_probe.streams import is_gzip

__all__ = ["GEMM_OPS", "GROUPED_OPS", "LIBRARY_NAMES", "PY_MODULE_PREFIX", "RANGE_COLUMNS", "RANGE_PREFIXES",
           "REDUCE_FAMILY", "TIMELINE_SCHEMA", "TRACE_COLUMNS", "TRACE_SCHEMA", "TraceDetail", "TraceStats",
           "TraceSummary", "by_kernel", "classify", "iter_chrome_events", "op_key_json", "problem_of",
           "read_chrome_trace", "read_nsys_sqlite", "read_trace", "timeline_frame", "timeline_groups",
           "timeline_sentence"]

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
    if is_gzip(head) or head.removeprefix(_BOM).lstrip()[:1] in (b"{", b"["):
        return read_chrome_trace(path, chunk_bytes)
    if str(path).endswith(".nsys-rep") or str(path).endswith(".qdrep"):
        raise ProbeError(f"{path} is an Nsight Systems report: export it first with "
                         "`nsys export --type sqlite FILE` and pass the .sqlite file")
    raise ProbeError(f"{path}: not a Chrome trace (.json/.json.gz) nor an Nsight Systems SQLite export "
                     f"(it starts with {head!r})")
