"""Records → output, one record at a time, in flat memory: JSON lines, CSV rows, table cells, Parquet
batches (typed as `frame.records_to_frame` types its frame).

A real log repeats the same lines: records of one line text (`line` and `time` aside) are equal in every
other field, since `build_record` derives them from that text alone. The encoders here keep the encoded
form of the rest of such a record in a small bounded memo keyed by that text, so a repeated GEMM costs a
dictionary lookup and a string join rather than a full encoding; `extra` is compared on every hit, so a
record that differs anywhere is encoded afresh. tests/test_logs_write.py checks each encoder against the
plain encoding on every fixture line.
"""
from __future__ import annotations

import json
from operator import attrgetter
from typing import Callable, Iterable, Iterator

from cublaslt_probe.dtypes import short_dtype
from cublaslt_probe.logs.record import CATEGORY_COLUMNS, FIELD_NAMES, INT_COLUMNS, LogRecord

_MEMO_MAX = 4096
_REST = FIELD_NAMES[2:]  # everything but line and time
assert FIELD_NAMES[:2] == ("line", "time")


def _utf8(s: str) -> bytes:
    return s.encode("utf-8", "backslashreplace")  # a lone surrogate (from a caller's str) stays visible


def _chunks(records: Iterable[LogRecord], rest: Callable[[LogRecord], tuple[str, str]], head: bytes,
            time: Callable[[str | None], str], chunk: int) -> Iterator[bytes]:
    """The encoded lines of `records` as UTF-8 bytes, `chunk` records a piece: each line is
    ``pre + head % (line, time(t)) + post`` with ``(pre, post) = rest(record)`` and `time` memoized
    (already encoded). The hot loop of every text encoder, inlined; the memoized parts of a line are
    never copied but by the final join (the output is larger than the log: copies are what a record
    costs)."""
    memo: dict = {}
    times: dict = {}
    buf: list = []
    add = buf.append
    for r in records:
        key = (r.message, r.function, r.kind, r.level, r.pid, r.file)
        hit = memo.get(key)
        if hit is None or hit[0] != r.extra:
            pre, post = rest(r)
            hit = (dict(r.extra), _utf8(pre), _utf8(post))
            if len(memo) >= _MEMO_MAX:
                memo.clear()
            memo[key] = hit
        t = times.get(r.time)
        if t is None:
            t = _utf8(time(r.time))
            if len(times) >= _MEMO_MAX:
                times.clear()
            times[r.time] = t
        if hit[1]:
            add(hit[1])
        add(head % (r.line, t))
        add(hit[2])
        if len(buf) >= chunk:
            yield b"".join(buf)
            buf.clear()
    if buf:
        yield b"".join(buf)


# --- JSON lines -----------------------------------------------------------------------------------------

def record_json(r: LogRecord) -> str:
    """The plain encoding: one JSON object (ASCII, so always valid UTF-8) without a line ending."""
    return json.dumps(r.to_dict())


def _json_rest(r: LogRecord) -> tuple[str, str]:
    d = {name: getattr(r, name) for name in _REST}
    d["extra"] = dict(r.extra)
    return "", json.dumps(d)[1:] + "\n"  # '"pid": 479, ...}\n'


def jsonl_chunks(records: Iterable[LogRecord], chunk: int = 64) -> Iterator[bytes]:
    """The JSON lines of `records` (``record_json(r) + "\\n"`` each, as bytes), `chunk` lines a piece."""
    return _chunks(records, _json_rest, b'{"line": %d, "time": %s, ', json.dumps, chunk)


# --- CSV ------------------------------------------------------------------------------------------------

def csv_cell(v) -> str:
    """One CSV field (RFC 4180): quoted when it holds a comma, a quote, a CR or a LF (a lone CR too)."""
    if v is None:
        return ""
    s = v if isinstance(v, str) else str(v)
    if "," in s or '"' in s or "\n" in s or "\r" in s:
        return '"' + s.replace('"', '""') + '"'
    return s


def csv_row(values: Iterable) -> str:
    """A CSV line of `values` (with ``"\\n"``)."""
    return ",".join(map(csv_cell, values)) + "\n"


CSV_HEADER = csv_row(FIELD_NAMES)


def _csv_rest(r: LogRecord) -> tuple[str, str]:
    return "", ",".join(csv_cell(json.dumps(r.extra, separators=(",", ":")) if n == "extra" else getattr(r, n))
                        for n in _REST) + "\n"


def csv_chunks(records: Iterable[LogRecord], chunk: int = 64) -> Iterator[bytes]:
    """The CSV lines of `records` as UTF-8 bytes (no header: `CSV_HEADER`): the columns of `FIELD_NAMES`,
    ``extra`` as a JSON object, missing values empty, as ``records_to_frame(...).to_csv()`` writes them
    but for ``time`` (kept as logged) and the quoting of a lone CR."""
    return _chunks(records, _csv_rest, b"%d,%s,", csv_cell, chunk)


# --- table cells ----------------------------------------------------------------------------------------

def _txt(v) -> str:
    return "" if v is None else str(v)


def types_cell(get) -> str:
    """``bf16,bf16->bf16 fp32``: A, B → D, then the compute type (C shown when it differs from D)."""
    a, b, c, d, comp = (short_dtype(get(x) or None) for x in ("a_type", "b_type", "c_type", "d_type",
                                                             "compute_type"))
    if not any((a, b, c, d, comp)):
        return ""
    out = f"{a or '?'},{b or '?'}->{d or '?'}"
    if c and c != d:
        out += f" C={c}"
    return out + (f" {comp}" if comp else "")


def algo_cell(get) -> str:
    """``66 64x16 64xAUTO 2x1x1 sk2 co1``: algo id, tile, stages, cluster, split-K, custom option."""
    if _txt(get("algo_id")) == "":
        return ""
    parts = [_txt(get("algo_id"))]
    for col in ("tile", "algo_stages", "cluster"):
        v = _txt(get(col))
        parts.append("-" if v in ("", "UNDEFINED", "AUTO") else v)  # the enum's zero: not set
    sk, co = _txt(get("num_splits_k")), _txt(get("custom_option"))
    parts.append(f"sk{sk}" if sk else "-")
    parts.append(f"co{co}" if co else "-")
    return " ".join(parts)


def epilogue_cell(get) -> str:
    e = _txt(get("epilogue"))
    return e[len("EPILOGUE_"):] if e.startswith("EPILOGUE_") else e


def gemm_cells(get) -> list[str]:
    """function, types, op, m, n, k, batch, epilogue, algo: the cells every GEMM table shows."""
    return [_txt(get("function")), types_cell(get), f"{_txt(get('op_a'))}{_txt(get('op_b'))}",
            _txt(get("m")), _txt(get("n")), _txt(get("k")), _txt(get("batch_count")), epilogue_cell(get),
            algo_cell(get)]


GEMM_HEADER = ["function", "types", "op", "m", "n", "k", "batch", "epilogue",
               "algo tile stages cluster splitK customOpt"]
RECORD_RIGHT = {"line", "pid", "m", "n", "k", "batch", "workspace"}


def record_header(multi: bool, api: bool) -> list[str]:
    """The columns of the records table: ``file`` with several files, ``kind`` with Api lines."""
    return (["file"] if multi else []) + ["line", "pid"] + (["kind"] if api else []) + GEMM_HEADER + \
        ["workspace"]


def record_cells(r: LogRecord, multi: bool, api: bool) -> list[str]:
    """The record's row of the records table (`record_header`)."""
    import os
    return ([os.path.basename(r.file) if r.file else ""] if multi else []) + [str(r.line), _txt(r.pid)] + \
        ([r.kind] if api else []) + gemm_cells(r.__getattribute__) + [_txt(r.workspace_bytes)]


# Stands in for the line number while a row is padded: a private-use character, which no log text holds in
# a run of seven (and which the table renderer leaves as it is).
_LINE_MARK = "\ue000"


def table_chunks(records: Iterable[LogRecord], multi: bool, api: bool, row: Callable[[list[str]], str],
                 line_width: int, chunk: int = 64) -> Iterator[bytes]:
    """The records table's rows as UTF-8 bytes, padded by `row` (a table renderer's row, its widths fixed),
    `chunk` rows a piece. Every cell but the line number is a function of the memo key, so each distinct
    GEMM is padded once: around a placeholder that its line number replaces, right-aligned in
    `line_width` characters."""
    at = 1 if multi else 0

    def rest(r: LogRecord) -> tuple[str, str]:
        cells = record_cells(r, multi, api)
        cells[at] = _LINE_MARK * line_width
        pre, _, post = row(cells).partition(_LINE_MARK * line_width)
        return pre, post

    return _chunks(records, rest, b"%" + str(line_width).encode() + b"d%s", lambda t: "", chunk)


_fields = attrgetter(*FIELD_NAMES)


# --- Parquet --------------------------------------------------------------------------------------------

def arrow_schema():
    """The Arrow schema of `records_to_frame`'s frame, fixed so that every batch of a stream shares it."""
    import pyarrow as pa

    fields = []
    for name in FIELD_NAMES:
        if name in INT_COLUMNS:
            t = pa.int64()
        elif name in CATEGORY_COLUMNS:
            t = pa.dictionary(pa.int32(), pa.string())
        elif name == "time":
            t = pa.timestamp("ns")
        elif name == "beta_value":
            t = pa.float64()
        elif name == "out_of_place":
            t = pa.bool_()
        else:
            t = pa.string()
        fields.append(pa.field(name, t))
    return pa.schema(fields)


class ParquetStream:
    """Write records to a Parquet file in row groups of `batch` records: memory holds one batch."""

    def __init__(self, path: str, batch: int = 16384):
        self.path, self.batch = path, batch
        self._buf: list[LogRecord] = []
        self._writer = None
        self._schema = arrow_schema()
        self._meta = None
        self.rows = 0

    def write(self, r: LogRecord) -> None:
        self._buf.append(r)
        if len(self._buf) >= self.batch:
            self._flush()

    def _flush(self) -> None:
        import pyarrow.parquet as pq
        table = self._table(self._buf)
        if self._writer is None:
            self._writer = pq.ParquetWriter(self.path, table.schema)
        self._writer.write_table(table)
        self.rows += len(self._buf)
        self._buf = []

    def _table(self, recs: list[LogRecord]):
        """The Arrow table of `recs`, column by column (no pandas frame on the way); typed as
        `records_to_frame` types the frame, whose pandas metadata it carries (so pandas reads the
        integers back as Int64 and the repeated strings as categories)."""
        import pyarrow as pa
        import pyarrow.compute as pc
        if self._meta is None:
            from cublaslt_probe.logs.frame import records_to_frame
            self._meta = pa.Table.from_pandas(records_to_frame(recs[:1]), schema=self._schema,
                                              preserve_index=False).schema.metadata
        cols = list(zip(*(_fields(r) for r in recs))) if recs else [()] * len(FIELD_NAMES)
        arrays = []
        for name, col, field in zip(FIELD_NAMES, cols, self._schema):
            if name == "extra":
                arrays.append(pa.array([json.dumps(e, separators=(",", ":")) for e in col], pa.string()))
            elif name == "time":
                t = pa.array(col, pa.string())
                try:  # ISO 8601, fractional seconds too (the parser only keeps times of that form)
                    arrays.append(t.cast(pa.timestamp("ns")))
                except pa.ArrowInvalid:
                    arrays.append(pc.strptime(t, format="%Y-%m-%d %H:%M:%S", unit="ns", error_is_null=True))
            elif pa.types.is_dictionary(field.type):
                arrays.append(pa.array(col, pa.string()).dictionary_encode())
            else:
                arrays.append(pa.array(col, field.type))
        return pa.Table.from_arrays(arrays, schema=self._schema.with_metadata(self._meta))

    def close(self) -> None:
        if self._buf or self._writer is None:
            self._flush()
        self._writer.close()
