"""Opening files that may be gzip: one sniff (the magic bytes, never the suffix) and one reader that keeps
everything before a cut or damaged gzip stream.

`open_binary(path)` gives a `Gunzip` for gzip data, else the plain file; `open_text(path)` the same as text;
`complete_lines(f)` its lines less the piece a cut stream ends in; `cut_note(f)` says, after reading, whether
and why the gzip stream under `f` broke. The trace reader, the
raw-record readers of `dataset` and `sweep`, the cold-start loader and the CLI's file sniffing open files here,
so a file is gzip or not by the same rule in every command, and a cut file keeps its readable part in each.
CPU only, no imports of the package.
"""
from __future__ import annotations

import io
import os
import zlib
from typing import IO, Iterator

GZIP_MAGIC = b"\x1f\x8b"
# What a gzip stream that ends inside a member is called (the words of `gzip.GzipFile`'s EOFError).
CUT_OFF = "Compressed file ended before the end-of-stream marker was reached"


def is_gzip(head: bytes) -> bool:
    """Whether a file's first bytes are gzip's."""
    return head[:2] == GZIP_MAGIC


class Gunzip(io.RawIOBase):
    """Incremental gzip reader that, unlike `gzip.GzipFile`, hands back everything before a cut or corrupt
    stream (the reader then reports the file as cut off) and reads concatenated members.

    At a damaged spot the bytes before it are still returned: the compressed data of the failing read is
    fed again, 1 KB at a time, to a copy of the decompressor taken before it (zlib raises without handing
    back what it decoded before the damage). `cut` says the stream ended or broke inside a member;
    `error` holds zlib's message when it broke."""

    _SALVAGE_STEP = 1024

    def __init__(self, raw: IO[bytes]):
        super().__init__()
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

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        """`read` into the buffer `b` (what `io.BufferedReader`, hence a text wrapper, calls)."""
        data = self.read(len(b))
        b[:len(data)] = data
        return len(data)

    def close(self) -> None:
        self.raw.close()
        super().close()


def open_binary(path: str | os.PathLike) -> IO[bytes]:
    """`path` opened for reading bytes: a `Gunzip` when it starts with gzip's magic bytes, else the file.
    Raises OSError when it cannot be opened."""
    fh = open(path, "rb")
    try:
        head = fh.read(2)
        fh.seek(0)
    except OSError:
        fh.close()
        raise
    return Gunzip(fh) if is_gzip(head) else fh


def open_text(path: str | os.PathLike, newline: str | None = None) -> io.TextIOWrapper:
    """`path` (gzip or not, by `open_binary`) as UTF-8 text; undecodable bytes become U+FFFD. Lines end as
    `newline` says (`open`'s rule)."""
    fh = open_binary(path)
    binary = io.BufferedReader(fh) if isinstance(fh, Gunzip) else fh
    return io.TextIOWrapper(binary, encoding="utf-8", errors="replace", newline=newline)


def complete_lines(f) -> Iterator[str]:
    """The lines of text file `f` (from `open_text`), less the piece a cut gzip stream ends in: that piece
    is where the stream broke, not a line the writer finished. `cut_note(f)` says afterwards why it ended."""
    for line in f:
        if not line.endswith("\n") and cut_note(f):
            return
        yield line


def cut_note(f) -> str | None:
    """Why the gzip stream under `f` (from `open_text` or `open_binary`) ended early, once it was read to its
    end: zlib's message where it is damaged, `CUT_OFF` where it stops; None when it is whole or not gzip."""
    raw = getattr(getattr(f, "buffer", None), "raw", f)
    if isinstance(raw, Gunzip) and raw.cut:
        return raw.error or CUT_OFF
    return None
