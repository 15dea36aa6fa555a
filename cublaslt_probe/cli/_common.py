"""What every command shares: the output options and writers, the table renderer (`render.text`), input and
output checks, and the exit-code convention (docs/cli.md).

Exit codes: 0 = all good; 1 = nothing usable (an ``Error: ...`` line says why and what to do); 2 = a usage
error (click's); 3 = partial: the output holds every good record, but some input could not be used (a
damaged line, a file cut off or unreadable); stderr says which. A closed pipe downstream
(``... | head``) ends the command quietly with 0: the reader took what it wanted.
"""
from __future__ import annotations

import json
import math
import os
import sys
from contextlib import contextmanager
from typing import Callable, Iterable, Iterator

import click

from cublaslt_probe.errors import ProbeError

# The text-table names the commands import from here (re-exported).
from cublaslt_probe.render.text import (  # noqa: F401
    MAX_CELL,
    SAMPLE_ROWS,
    Table,
    fit,
    render_table,
    set_line_width,
    terminal_width,
    wrap,
)
from cublaslt_probe.streams import GZIP_MAGIC, cut_note, is_gzip, open_binary

EXIT_OK = 0
EXIT_NOTHING = 1
EXIT_USAGE = 2
EXIT_PARTIAL = 3

FORMATS = ("table", "csv", "jsonl", "json", "parquet")  # what the commands that write rows write
FEW_ROWS_FORMATS = FORMATS[:-1]   # the same without Parquet: commands whose few rows are not a dataset
TEXT_JSON = ("text", "json")      # what a command that writes one report writes

# ------------------------------------------------------------------------------------------ the suffix rule
# The one home of the suffix -> format rule: the suffix of `-o` decides what a command writes. "table" and
# "text" are the people's view (a command has one or the other), "markdown" a Markdown document.
SUFFIX_FORMATS = {".txt": "text", ".md": "markdown", ".csv": "csv", ".jsonl": "jsonl", ".json": "json",
                  ".parquet": "parquet", ".html": "html", ".png": "png", ".svg": "svg", ".pdf": "pdf"}
_FORMAT_HELP = {"table": "aligned columns for people", "csv": "every column", "jsonl": "one JSON object a line",
                "parquet": "typed columns (needs -o)", "json": "one JSON document", "text": "for people",
                "markdown": "a Markdown document", "html": "a self-contained page", "png": "an image",
                "svg": "an image", "pdf": "an image"}
_PEOPLE = ("table", "text")


def format_suffixes(formats: tuple[str, ...]) -> list[str]:
    """The suffixes of `-o` that write these formats, in the order of `formats`."""
    return [ext for f in formats for ext, g in SUFFIX_FORMATS.items()
            if g == f or (f in _PEOPLE and g in _PEOPLE)]


def suffix_format(output: str | None, formats: tuple[str, ...], option: str = "-o") -> str | None:
    """The format the suffix of `output` names, among the command's `formats`; None for stdout (None or
    ``-``) and for a name without a suffix. A suffix the command does not write is a usage error naming
    the suffixes it does write."""
    if not output or output == "-":
        return None
    base = os.path.basename(output)
    ext = os.path.splitext(base)[1].lower()
    if not ext:
        return None
    f = SUFFIX_FORMATS.get(ext)
    if f in _PEOPLE:
        f = next((g for g in formats if g in _PEOPLE), f)
    if f not in formats:
        ctx = click.get_current_context(silent=True)
        who = f"`{ctx.info_name}`" if ctx is not None and ctx.info_name else "this command"
        exts = format_suffixes(formats)
        listed = exts[0] if len(exts) == 1 else ", ".join(exts[:-1]) + " or " + exts[-1]
        raise click.UsageError(f"{option} {output}: {who} writes {listed}, not {ext or 'this file'}: give "
                               f"{option} a name ending in {'it' if len(exts) == 1 else 'one of them'}")
    return f


def output_option(formats: tuple[str, ...], help_text: str = "Write here instead of stdout (- is stdout)"):
    """``-o/--output`` (``--out`` an alias) alone, for commands whose ``--format`` is their own."""
    return click.option("-o", "--output", "--out", "output", type=click.Path(dir_okay=False, allow_dash=True),
                        default=None, help=f"{help_text}; the suffix picks the format: "
                                           f"{', '.join(format_suffixes(formats))}.")


# ----------------------------------------------------------------------------------------- output options
def output_options(formats: tuple[str, ...] = FORMATS, *, top: int | None = None, default: str | None = None):
    """``-f/--format``, ``-o/--output`` (``--out`` an alias) and, with `top` (the table's default number of
    rows), ``--top``: the output options of every command that writes rows. Resolve them with
    `out_format`."""
    default = default or formats[0]
    fmt_help = "; ".join(f"{f}: {_FORMAT_HELP[f]}" for f in formats)

    def deco(f):
        if top is not None:
            f = click.option("--top", type=click.IntRange(min=0), default=None,
                             help=f"Only the first N rows (table default {top}; 0 = all).")(f)
        f = output_option(formats)(f)
        f = click.option("-f", "--format", "fmt", type=click.Choice(formats), default=None,
                         help=f"Output format [default: {default}, or the suffix of -o]. {fmt_help}.")(f)
        return f
    return deco


def out_format(fmt: str | None, output: str | None, formats: tuple[str, ...] = FORMATS,
               default: str | None = None) -> str:
    """The format to write: the suffix of -o (`suffix_format`), else --format, else `default`; a suffix
    the command does not write, an explicit --format that the suffix contradicts, or a binary format to
    the terminal is a usage error. Checks that `output` can be written (before any input is read)."""
    default = default or formats[0]
    by_suffix = suffix_format(output, formats)
    if fmt is not None and by_suffix is not None and by_suffix != fmt:
        stem = os.path.splitext(output)[0]
        raise click.UsageError(f"-o {output} names a {by_suffix} file but --format {fmt} was asked: "
                               f"write {stem}{format_suffixes((fmt,))[0]} or drop --format")
    fmt = by_suffix or fmt or default
    if fmt in ("parquet", "png", "pdf") and (not output or output == "-"):
        raise click.UsageError(f"--format {fmt} writes a binary file: give it a path with -o "
                               f"OUT{format_suffixes((fmt,))[0]}")
    check_writable(output)
    set_line_width(terminal_width() if not output or output == "-" else None)
    return fmt


def write_result(output: str | None, text: str) -> None:
    """A command's text result (ending in one newline) to stdout or to the file `output`, saying so on
    stderr when it went to a file."""
    write_text(output, text.rstrip("\n") + "\n")
    if output and output != "-":
        click.echo(f"wrote {output}", err=True)


def check_writable(output: str | None) -> None:
    """Fail before reading a large input, not after, when the output cannot be written."""
    if not output or output == "-":
        return
    parent = os.path.dirname(os.path.abspath(output))
    if os.path.isdir(output):
        raise ProbeError(f"cannot write {output}: it is a directory (give a file name inside it)")
    if not os.path.isdir(parent):
        raise ProbeError(f"cannot write {output}: no such directory {parent}")
    if not os.access(parent, os.W_OK) or (os.path.exists(output) and not os.access(output, os.W_OK)):
        raise ProbeError(f"cannot write {output}: permission denied (choose a writable directory)")


def check_writable_dir(path: str) -> None:
    """Create the directory `path` (and its parents) now, so that a long job cannot fail at its end."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise ProbeError(f"cannot write into {path}: it is a file (give a directory)")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise ProbeError(f"cannot create the directory {path}: {e.strerror or e} (choose a writable place)") from e
    if not os.access(path, os.W_OK):
        raise ProbeError(f"cannot write into {path}: permission denied (choose a writable directory)")


# ------------------------------------------------------------------------------------------ text output
class _Out:
    """An output stream that takes text (written as UTF-8, whatever the locale) and bytes; write errors
    (disk full, ...) name the output, a closed pipe stays a BrokenPipeError (the command group ends
    quietly on it)."""

    def __init__(self, f, name: str):
        self._f, self.name = f, name

    def write(self, s: str) -> None:
        self.write_bytes(s.encode("utf-8", "replace"))

    def write_bytes(self, b: bytes) -> None:
        try:
            self._f.write(b)
        except BrokenPipeError:
            raise
        except OSError as e:
            raise ProbeError(f"cannot write {self.name}: {e.strerror or e}") from e

    def flush(self) -> None:
        try:
            self._f.flush()
        except BrokenPipeError:
            raise
        except OSError as e:
            raise ProbeError(f"cannot write {self.name}: {e.strerror or e}") from e


@contextmanager
def text_output(output: str | None) -> Iterator[_Out]:
    """A UTF-8 stream to the file `output`, or to stdout (None or ``-``), whatever the locale."""
    if output and output != "-":
        try:
            f = open(output, "wb", buffering=1 << 20)
        except OSError as e:
            raise ProbeError(f"cannot write {output}: {e.strerror or e}") from e
        out = _Out(f, output)
        try:
            yield out
            out.flush()
        finally:
            try:
                f.close()
            except OSError:
                pass
        return
    sys.stdout.flush()
    buf = getattr(sys.stdout, "buffer", None)
    if buf is None:  # a text-only stdout (an embedding application)
        yield _TextOnly(sys.stdout)
        return
    out = _Out(buf, "stdout")
    yield out
    out.flush()


class _TextOnly(_Out):
    def __init__(self, f):
        super().__init__(f, "stdout")

    def write_bytes(self, b: bytes) -> None:
        self._f.write(b.decode("utf-8", "replace"))


def write_text(output: str | None, text: str) -> None:
    """`text` to stdout (no output, or ``-``) or to the file `output`."""
    with text_output(output) as out:
        out.write(text)


class Lines:
    """Collect lines and write them in chunks (few large writes are much faster than many small ones)."""

    def __init__(self, out: _Out, chunk: int = 256):
        self.out, self.chunk, self.buf = out, chunk, []

    def add(self, line: str) -> None:
        self.buf.append(line)
        if len(self.buf) >= self.chunk:
            self.out.write("".join(self.buf))
            self.buf = []

    def close(self) -> None:
        if self.buf:
            self.out.write("".join(self.buf))
            self.buf = []


def json_array(pieces: Iterable[bytes]) -> Iterator[bytes]:
    """JSON lines (pieces of whole lines, as bytes) as one JSON array, streamed: a JSON value has no raw
    newline, so each line break between values becomes a comma."""
    first = True
    yield b"["
    for piece in pieces:
        body = piece.rstrip(b"\n")
        if body:
            yield (b"\n" if first else b",\n") + body.replace(b"\n", b",\n")
            first = False
    yield b"]\n" if first else b"\n]\n"


# ------------------------------------------------------------------------------------------ plain values
def json_default(v):
    """JSON for what json.dumps does not know: timestamps, numpy scalars, anything else as text."""
    if hasattr(v, "isoformat"):
        return v.isoformat()
    if hasattr(v, "item"):  # numpy scalars
        return v.item()
    return str(v)


def clean(v):
    """pandas missing values (NA, NaN, NaT) -> None, numpy scalars -> Python, for JSON."""
    import pandas as pd
    if v is None or v is pd.NA or v is pd.NaT:
        return None
    if isinstance(v, float) and math.isnan(v):
        return None
    if hasattr(v, "item") and not hasattr(v, "isoformat"):
        return v.item()
    return v


def cell(v, fmt: str = "") -> str:
    """A value as table text: missing values empty, booleans yes/no, numbers in `fmt` when given."""
    v = clean(v)
    if v is None:
        return ""
    if isinstance(v, bool):
        return "yes" if v else "no"
    if fmt and isinstance(v, (int, float)):
        return format(v, fmt)
    return str(v)


def clean_text(s: str) -> str:
    """Text as read from argv or a terminal (undecodable bytes kept as surrogates) → valid Unicode, each
    undecodable byte a U+FFFD."""
    try:
        s.encode("utf-8")
        return s
    except UnicodeEncodeError:
        return s.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


# ------------------------------------------------------------------------------------------- data frames
def write_frame(df, kind: str, output: str | None, table: Callable[[], str] | None = None) -> None:
    """`df` as table (`table()` renders the people's view; its prose lines wrapped to the terminal's width,
    `wrap`), csv, jsonl or parquet (needs `output`).

    For frames that are already small (summaries, one GEMM's candidates, a trace's kernels): the rows are
    written one at a time, never as one big string.
    """
    if kind == "parquet":
        try:
            df.to_parquet(output, index=False)
        except OSError as e:
            raise ProbeError(f"cannot write {output}: {e.strerror or e}") from e
        return
    from cublaslt_probe.logs.write import csv_row
    with text_output(output) as out:
        buf = Lines(out)
        if kind == "table":
            buf.add(wrap(table()) if table is not None else render_table(
                [str(c) for c in df.columns], ([cell(v) for v in r] for r in df.itertuples(index=False))))
        elif kind == "csv":
            buf.add(csv_row(df.columns))
            for row in df.itertuples(index=False, name=None):
                buf.add(csv_row(_csv_value(v) for v in row))
        elif kind in ("jsonl", "json"):
            cols = list(df.columns)
            if kind == "json":
                buf.add("[")
            for i, row in enumerate(df.itertuples(index=False, name=None)):
                text = json.dumps(dict(zip(cols, map(clean, row))), ensure_ascii=False, default=json_default)
                buf.add((("," if i else "") + "\n" + text) if kind == "json" else text + "\n")
            if kind == "json":
                buf.add("\n]\n")
        else:
            raise ValueError(kind)
        buf.close()


def _csv_value(v):
    v = clean(v)
    if isinstance(v, (list, tuple, dict)):
        return json.dumps(v, ensure_ascii=False, default=json_default)
    if hasattr(v, "isoformat"):
        return str(v)
    return v


# ------------------------------------------------------------------------------------------------ inputs
def read_json(path: str, what: str):
    """A small JSON file (an env.json, a saved evidence file); a ProbeError that names it and what it
    should have been when it is not JSON."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        why = getattr(e, "strerror", None) or (f"it is {sniff(path)}, not JSON" if isinstance(
            e, (UnicodeDecodeError, ValueError)) else str(e))
        raise ProbeError(f"cannot read {path}: {why}; give {what}") from e


_MAGIC = ((GZIP_MAGIC, "a gzip file"), (b"PAR1", "a Parquet file"), (b"\x89PNG", "a PNG image"),
          (b"SQLite format 3\x00", "an SQLite database"), (b"%PDF", "a PDF document"),
          (b"PK\x03\x04", "a zip archive"), (b"\x7fELF", "an ELF binary"), (b"<svg", "an SVG image"))


def sniff(path: str) -> str:
    """What the file at `path` looks like, for error messages: ``a Parquet file``, ``a cuBLASLt log``,
    ``a raw probe file (JSONL)``, ``a Chrome trace (JSON)``, ``a JSON document``, ``binary data``,
    ``empty``, ``text``."""
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError as e:
        return f"unreadable ({e.strerror or e})"
    if not head:
        return "empty"
    if is_gzip(head):
        try:
            with open_binary(path) as g:
                inner = g.read(4096)
                damaged = len(inner) < 4096 and cut_note(g)
        except OSError:
            return "a gzip file (damaged)"
        if damaged:
            return "a gzip file (damaged)"
        kind = _sniff_bytes(inner)
        return f"a gzip file holding {kind}" if kind not in ("empty",) else "an empty gzip file"
    return _sniff_bytes(head)


def check_dataset_file(path: str, raw_ok: bool = False) -> None:
    """Refuse, with what to give instead, a file where a dataset (or, with `raw_ok`, a sweep's raw file)
    is expected: a Parquet file must be readable and have the dataset's columns; anything else is named."""
    if not os.path.isfile(path):
        return  # a missing file, a folder or a glob: the reader says so
    kind = sniff(path)
    if kind == "a Parquet file":
        import pyarrow.parquet as pq
        try:
            names = pq.read_schema(path).names
        except Exception as e:  # pyarrow raises several kinds on a damaged file
            raise ProbeError(f"{path} is a damaged Parquet file ({_first_line(e)}): copy it again, or rebuild "
                             "it with `cublaslt-probe dataset RAW.jsonl -o X.parquet`") from e
        if "key" not in names or "backend" not in names:
            what = " (it looks like parse-log's output: GEMM records of a log)" if "message" in names else ""
            raise ProbeError(f"{path} is a Parquet file but not a dataset{what}: give a dataset written by "
                             "`sweep`, `dataset` or `merge`")
        return
    if raw_ok and "raw probe file" in kind:
        return
    want = "a dataset .parquet or a sweep's raw file (.raw.jsonl)" if raw_ok else "a dataset .parquet"
    raise ProbeError(f"{path} is {kind}, not a dataset: give {want} (`cublaslt-probe dataset RAW.jsonl -o "
                     "X.parquet` builds one from a sweep's raw records)")


def _first_line(e: BaseException) -> str:
    return (str(e).splitlines() or [type(e).__name__])[0]


def _sniff_bytes(head: bytes) -> str:
    if not head:
        return "empty"
    for magic, what in _MAGIC:
        if head.startswith(magic):
            return what
    if b"\x00" in head:
        return "binary data"
    text = head.decode("utf-8", "replace").removeprefix("\ufeff")
    s = text.lstrip()
    if s.startswith("[20") and "][cublasLt]" in s[:60] or "][Trace][" in s[:200]:
        return "a cuBLASLt log"
    if s.startswith(("I! cuBLAS", "i! ")):
        return "a cuBLAS API log"
    if s.startswith("{"):
        first = s.split("\n", 1)[0]
        if '"type": "env"' in first or '"type":"env"' in first or '"key":' in first:
            return "a raw probe file (JSONL)"
        if '"traceEvents"' in s or '"schemaVersion"' in s or '"deviceProperties"' in s:
            return "a Chrome trace (JSON)"
        return "a JSON document"
    if s.startswith("[") and s[1:].lstrip()[:1] in ("{", "]"):
        return "a Chrome trace (JSON)" if '"ph"' in s or '"cat"' in s else "a JSON document"
    if text.count("\ufffd") > len(text) // 20:
        return "binary data"
    return "text"


_NOT_A_TRACE = {"a cuBLASLt log": "cublaslt-probe parse-log reads it",
                "a cuBLAS API log": "cublaslt-probe parse-log --cublas reads it",
                "a raw probe file (JSONL)": "cublaslt-probe dataset builds a dataset from it",
                "a Parquet file": "give a dataset to map, plot, report or diff"}


def check_trace(file: str) -> None:
    """Refuse, with what to do instead, a file that is plainly not a profiler trace (`trace`, `audit`)."""
    kind = sniff(file)
    inner = kind.replace("a gzip file holding ", "")
    if inner.startswith(("a Chrome trace", "a JSON document", "an SQLite database", "unreadable")) or \
            kind.startswith("a gzip file (damaged)"):
        return  # the trace reader says what is wrong with it
    fix = _NOT_A_TRACE.get(inner, "give a torch.profiler Chrome trace (.json or .json.gz) or an Nsight "
                                  "Systems SQLite export")
    raise ProbeError(f"{file} is {kind}, not a profiler trace: {fix}")


def bound_or_usage(result: dict, path: str, *, echo, **run) -> None:
    """For the commands that take ``--coldstart``: `check_bound` (analysis.coldstart.binding), its refusal a usage
    error (exit 2, one line), its notes and the file's load notes through `echo`."""
    from cublaslt_probe.analysis.coldstart.binding import NotThisRun, check_bound
    try:
        notes = check_bound(result, path, **run)
    except NotThisRun as e:
        raise click.UsageError(str(e)) from None
    for n in list(result.get("load_notes") or []) + notes:
        echo(f"note: {n}")
