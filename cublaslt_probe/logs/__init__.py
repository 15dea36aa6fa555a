"""cuBLASLt and cuBLAS logs → records.

`parse_log` streams the GEMMs of a ``CUBLASLT_LOG_LEVEL`` log (one `LogRecord` per matmul trace line);
`parse_cublas_log` the calls of a ``CUBLAS_LOGINFO_DBG`` log; `records_to_frame` and `summarize` turn
records into a table and into "which GEMMs, how often". See docs/logs.md.
"""
from cublaslt_probe.logs._io import LogReadError
from cublaslt_probe.logs.cublas import CublasCall, parse_cublas_log
from cublaslt_probe.logs.parser import (
    build_record,
    flatten,
    load_log,
    load_logs,
    parse_line,
    parse_log,
    parse_logs,
    parse_message,
    scan,
    without_pointers,
)
from cublaslt_probe.logs.record import (
    FIELD_NAMES,
    KINDS,
    LEVELS,
    MASK_BITS,
    BadLine,
    LogRecord,
    ParseStats,
    short_dtype,
)

__all__ = ["parse_log", "parse_logs", "parse_line", "parse_message", "load_log", "load_logs",
           "parse_cublas_log", "records_to_frame", "summarize", "short_dtype", "scan", "flatten",
           "build_record", "without_pointers", "LogRecord", "CublasCall", "ParseStats", "BadLine", "LogReadError",
           "FIELD_NAMES",
           "KINDS", "LEVELS", "MASK_BITS"]


def __getattr__(name):  # pandas only when a frame is asked for: parsing stays light
    if name in ("records_to_frame", "summarize"):
        from cublaslt_probe.logs import frame
        return getattr(frame, name)
    raise AttributeError(f"module 'cublaslt_probe.logs' has no attribute {name!r}")
