"""Turning a log source (path, ``.gz``, open file, iterable of lines) into a stream of text lines."""
from __future__ import annotations

import gzip
import io
import os
import zlib
from contextlib import contextmanager
from typing import IO, Iterable, Iterator, Union

from cublaslt_probe.errors import ProbeError
from cublaslt_probe.streams import Gunzip, complete_lines, cut_note, is_gzip

Source = Union[str, "os.PathLike[str]", IO[str], IO[bytes], Iterable[str]]

# Exceptions that mean "this file cannot be read (any further)" rather than "this line is bad".
READ_ERRORS = (OSError, EOFError, zlib.error, UnicodeDecodeError, ValueError)



class LogReadError(ProbeError):
    """A log file could not be opened or read (missing, a directory, no permission, broken gzip)."""


def source_name(source) -> str | None:
    if isinstance(source, (str, os.PathLike)):
        return os.fspath(source)
    name = getattr(source, "name", None)
    return name if isinstance(name, str) else None


def _describe(e: BaseException) -> str:
    if isinstance(e, IsADirectoryError):
        return "is a directory (give the log files inside it)"
    if isinstance(e, FileNotFoundError):
        return "no such file"
    if isinstance(e, PermissionError):
        return "permission denied"
    if isinstance(e, (EOFError, zlib.error, gzip.BadGzipFile)):
        return f"broken gzip data ({e})"
    return getattr(e, "strerror", None) or str(e) or type(e).__name__


def describe_read_error(e: BaseException) -> str:
    return _describe(e)


def _text(binary: IO[bytes]) -> io.TextIOWrapper:
    # errors="replace": binary garbage becomes U+FFFD and is reported as a bad line, never raises.
    # newline="\n": a line ends at "\n" only (as for wc -l, grep -n and sed), so line numbers agree with
    # those tools; a CRLF ending is kept and stripped by the parser, a lone CR stays inside its line.
    return io.TextIOWrapper(binary, encoding="utf-8", errors="replace", newline="\n")


def _is_binary_file(f) -> bool:
    if isinstance(f, io.TextIOBase):
        return False
    if isinstance(f, (io.RawIOBase, io.BufferedIOBase, gzip.GzipFile)):
        return True
    mode = getattr(f, "mode", "")
    return isinstance(mode, str) and "b" in mode


def _peek(f) -> bytes:
    """The first two bytes of a binary file without consuming them (b"" when that is not possible)."""
    try:
        if hasattr(f, "peek"):
            return f.peek(2)[:2]
        if f.seekable():
            pos = f.tell()
            head = f.read(2)
            f.seek(pos)
            return head
    except (OSError, ValueError):
        pass
    return b""


@contextmanager
def open_lines(source: Source) -> Iterator[Iterable[str]]:
    """Yield an iterable of text lines for `source`; raise `LogReadError` if it cannot be opened.

    Paths are opened here (gzip detected by its magic bytes, so a ``.gz`` suffix is not required) and
    closed on exit; open files and iterables belong to the caller and are not closed.
    """
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        try:
            raw = open(path, "rb")
        except OSError as e:
            raise LogReadError(f"cannot read {path}: {_describe(e)}") from e
        try:
            try:
                magic = raw.peek(2)[:2]
            except OSError as e:  # e.g. EISDIR on some platforms only when reading
                raise LogReadError(f"cannot read {path}: {_describe(e)}") from e
            if is_gzip(magic):
                with _text(io.BufferedReader(Gunzip(raw))) as f:
                    yield _until_cut(f)
            else:
                yield _text(raw)
        finally:
            raw.close()
        return
    if hasattr(source, "read"):
        if _is_binary_file(source):
            binary = gzip.GzipFile(fileobj=source, mode="rb") if is_gzip(_peek(source)) else source
            wrapper = _text(binary)
            try:
                yield wrapper
            finally:
                try:
                    wrapper.detach()  # leave the caller's file open
                except ValueError:
                    pass
        else:
            yield source
        return
    if isinstance(source, (bytes, bytearray)):
        raise LogReadError("parse_log got bytes: pass a path, an open file or an iterable of lines")
    try:
        it = iter(source)
    except TypeError as e:
        raise LogReadError(f"cannot read {type(source).__name__!s}: pass a path, an open file or an "
                           f"iterable of lines") from e
    yield _decode_items(it)


def _until_cut(f) -> Iterator[str]:
    """The complete lines of a gzip log (`streams.complete_lines`), then the cut as the read error it is
    (EOFError: the records before it stand, the file counts as broken)."""
    yield from complete_lines(f)
    why = cut_note(f)
    if why:
        raise EOFError(why)


def _decode_items(it: Iterator) -> Iterator[str]:
    for item in it:
        if isinstance(item, str):
            yield item
        elif isinstance(item, (bytes, bytearray)):
            yield bytes(item).decode("utf-8", "replace")
        else:
            yield str(item)
