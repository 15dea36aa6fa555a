"""The records the log parser produces, the parse statistics, and the type-name tables.

Plain data only: no parsing here, no pandas.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable

from cublaslt_probe.dtypes import short_dtype

# The log levels as cuBLASLt numbers them (`CUBLASLT_LOG_LEVEL`), the tag printed in the line, the
# bit of `CUBLASLT_LOG_MASK`, and the record `kind`.
LEVELS = {"Error": 1, "Trace": 2, "Hints": 3, "Info": 4, "Api": 5}
LEVEL_TAGS = {v: k for k, v in LEVELS.items()}
MASK_BITS = {"Error": 1, "Trace": 2, "Hints": 4, "Info": 8, "Api": 16}
KINDS = ("trace", "api", "info", "error", "hints")
# A cublasOperation_t as the logs spell it (cuBLASLt ``OP_T``, cuBLAS ``CUBLAS_OP_T``, or the bare letter) -> the
# op letter the records keep: N, T, C (HERMITAN is cuBLAS's other name for C), or CONJG (conjugate, no transpose).
OP_LETTERS = {f"{prefix}{op}": letter for prefix in ("", "OP_", "CUBLAS_OP_")
              for op, letter in (("N", "N"), ("T", "T"), ("C", "C"), ("HERMITAN", "C"), ("CONJG", "CONJG"))}


def op_letter(v):
    """The op letter (`OP_LETTERS`) of a logged transpose value; any other value comes back unchanged."""
    return OP_LETTERS.get(v, v)


@dataclass(slots=True)
class LogRecord:
    """One cuBLASLt log line (a matmul trace, or with ``api=True`` an Api/Info/Error/Hints line).

    Fields are ``None`` where the line does not carry them; see docs/logs.md for every field.
    ``m``, ``n``, ``k`` are the column-major problem cuBLAS solves (D[m×n] = op(A)[m×k]·op(B)[k×n]);
    ``torch_m``, ``torch_n``, ``torch_k`` the same GEMM seen by a row-major caller (torch_m = n, torch_n = m).
    """

    line: int
    time: str | None
    pid: int | None
    level: int | None
    kind: str
    function: str
    a_type: str | None = None
    b_type: str | None = None
    c_type: str | None = None
    d_type: str | None = None
    compute_type: str | None = None
    scale_type: str | None = None
    op_a: str | None = None       # the log's transa: N, T or C (the decoder's trans_a is a bool)
    op_b: str | None = None
    m: int | None = None
    n: int | None = None
    k: int | None = None
    lda: int | None = None
    ldb: int | None = None
    ldc: int | None = None
    ldd: int | None = None
    batch_count: int | None = None
    epilogue: str | None = None
    algo_id: int | None = None
    tile: str | None = None
    algo_stages: str | None = None    # the logged stages enum (64xAUTO); the decoder's stages is a count
    cluster: str | None = None
    num_splits_k: int | None = None   # the logged numSplitsK; the decoder's split_k is a bool
    reduction_scheme: str | None = None
    custom_option: int | None = None
    cta_swizzling: int | None = None
    workspace_bytes: int | None = None
    beta_value: float | None = None   # the logged beta; the decoder's beta is a name token
    out_of_place: bool | None = None
    sm_count_target: int | None = None
    torch_m: int | None = None
    torch_n: int | None = None
    torch_k: int | None = None
    known_issue: str | None = None    # the release-note bugs this algo config meets or can meet (logs.issues)
    file: str | None = None           # the log file the line came from
    message: str = ""
    extra: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """All fields as a plain dict (``extra`` copied, still a dict)."""
        d = {name: getattr(self, name) for name in FIELD_NAMES}
        d["extra"] = dict(self.extra)
        return d

    @property
    def dtypes(self) -> dict[str, str | None]:
        """Short dtype names of A, B, C, D, compute and scale (``bf16``, ``tf32``, ``fp8_e4m3`` ...)."""
        return {"a": short_dtype(self.a_type), "b": short_dtype(self.b_type),
                "c": short_dtype(self.c_type), "d": short_dtype(self.d_type),
                "compute": short_dtype(self.compute_type), "scale": short_dtype(self.scale_type)}


FIELD_NAMES: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(LogRecord))

# Fields that identify "the same GEMM with the same algo" for `summarize`.
PROBLEM_FIELDS = ("function", "a_type", "b_type", "c_type", "d_type", "compute_type", "scale_type",
                  "op_a", "op_b", "m", "n", "k", "batch_count", "epilogue")
ALGO_FIELDS = ("algo_id", "tile", "algo_stages", "cluster", "num_splits_k", "reduction_scheme", "custom_option",
               "cta_swizzling")
SUMMARY_KEYS = PROBLEM_FIELDS + ALGO_FIELDS   # what makes two GEMMs of a log identical (`frame.Summary`)

# How a table of records types the fields (`frame.records_to_frame`, `write.arrow_schema`).
INT_COLUMNS = ("line", "pid", "level", "m", "n", "k", "lda", "ldb", "ldc", "ldd", "batch_count",
               "algo_id", "num_splits_k", "custom_option", "cta_swizzling", "workspace_bytes",
               "sm_count_target", "torch_m", "torch_n", "torch_k")
CATEGORY_COLUMNS = ("kind", "function", "a_type", "b_type", "c_type", "d_type", "compute_type",
                    "scale_type", "op_a", "op_b", "epilogue", "tile", "algo_stages", "cluster",
                    "reduction_scheme", "file")


@dataclass(slots=True)
class BadLine:
    """A line the parser could not use: where it was, why, and its first characters."""

    source: str | None
    line: int
    reason: str
    text: str

    def __str__(self) -> str:
        where = f"{self.source}:{self.line}" if self.source else f"line {self.line}"
        return f"{where}: {self.reason}: {self.text!r}"


# The reasons of lines that are not log lines at all (program output, binary data), as opposed to log
# lines that are damaged: a file of nothing else is not a log; a few of them among good lines lose nothing.
FOREIGN_REASONS = ("not a cuBLASLt log line", "not a cuBLAS log line")


@dataclass
class ParseStats:
    """Counts of one parse (several files add up); the first `max_examples` bad lines are kept.

    ``lines``: lines read; ``records``: records yielded; ``skipped``: well-formed lines not asked for
    (Api lines without ``api=True``, cuBLAS ``I!`` lines, blank lines); ``bad``: lines that are not
    log lines (``foreign``: program output, binary data) or are damaged log lines (``bad - foreign``);
    ``files_read`` / ``files_failed``: per-file outcome (a file cut off part way is in both: its lines
    before the cut were read). ``on_bad``, when set, is called with every bad line as it is met (the CLI
    lists them all with ``-vv``) beyond the `max_examples` kept.
    """

    lines: int = 0
    records: int = 0
    skipped: int = 0
    bad: int = 0
    foreign: int = 0
    max_examples: int = 5
    bad_lines: list[BadLine] = field(default_factory=list)
    files_read: list[str] = field(default_factory=list)
    files_failed: list[tuple[str, str]] = field(default_factory=list)
    on_bad: Callable[[BadLine], None] | None = None

    def add_bad(self, source: str | None, line: int, reason: str, text: str) -> None:
        self.bad += 1
        if reason in FOREIGN_REASONS:
            self.foreign += 1
        if len(self.bad_lines) < self.max_examples:
            self.bad_lines.append(BadLine(source, line, reason, _snippet(text)))
        elif self.on_bad is not None:
            self.on_bad(BadLine(source, line, reason, _snippet(text)))

    @property
    def damaged(self) -> int:
        """Log lines that could not be used (a GEMM may be lost in each), not counting foreign lines."""
        return self.bad - self.foreign

    @property
    def complete(self) -> bool:
        """True when no log line was damaged and every file was read to its end."""
        return self.damaged == 0 and not self.files_failed

    def summary(self) -> str:
        """One line: ``read 3 files, 12,034 lines: 4,000 records, 8,000 skipped, 34 bad``."""
        nf = len(self.files_read)
        files = f"{nf:,} file{'s' if nf != 1 else ''}, " if nf else ""
        return (f"read {files}{self.lines:,} lines: {self.records:,} records, "
                f"{self.skipped:,} skipped, {self.bad:,} bad")

    def report(self) -> list[str]:
        """Lines for stderr: the summary, failed files, and the first bad lines with their numbers."""
        out = [self.summary()]
        for path, why in self.files_failed:
            sep = " " if why.startswith("past line") else ": "  # "cannot read x.gz past line 43: ..."
            out.append(f"cannot read {path}{sep}{why}")
        for b in self.bad_lines:
            out.append(f"bad line {b}")
        if self.bad > len(self.bad_lines):
            out.append(f"... and {self.bad - len(self.bad_lines):,} more bad lines")
        return out


def _snippet(text: str, width: int = 80) -> str:
    text = text.rstrip("\r\n")
    return text if len(text) <= width else text[:width] + "..."


# --- type names -----------------------------------------------------------------------------------------
# The record keeps cuBLAS's spelling of types (`R_16BF`, `COMPUTE_32F`); `short_dtype` (dtypes.py) gives the
# canonical short name.
# The three letters of the internal legacy-API function names (`cublasLtTSTMatmul`): A/B type,
# compute/scale type, C/D type. Q (fp8) is inferred, not measured.
LEGACY_LETTERS = {"S": "fp32", "D": "fp64", "H": "fp16", "T": "bf16", "Q": "fp8_e4m3", "C": "cfp32",
                  "Z": "cfp64", "I": "int32", "B": "int8"}


