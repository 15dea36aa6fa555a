"""A Chrome trace's events, streamed: one JSON value decoded at a time from a buffer of a few chunks, so
memory stays at a few MB whatever the file's size (gzip recognised by its magic bytes, `streams.open_binary`).
A malformed event is skipped and counted, a cut-off file ends the stream with a warning; neither raises."""
from __future__ import annotations

import codecs
import json
import logging
import os
import re
from typing import IO, Any, Iterator

from cublaslt_probe.analysis.trace.schema import TraceStats
from cublaslt_probe.errors import ProbeError
from cublaslt_probe.streams import Gunzip, open_binary

log = logging.getLogger("cublaslt_probe.analysis.trace")

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


def iter_chrome_events(path: str | os.PathLike, meta: dict | None = None, stats: TraceStats | None = None,
                       chunk_bytes: int = 1 << 22) -> Iterator[dict]:
    """Yield the events of a Chrome trace one at a time (object format ``{"traceEvents": [...]}`` or a bare
    array). Top-level keys other than ``traceEvents`` go into `meta`. Memory stays at a few chunks."""
    meta = {} if meta is None else meta
    stats = stats or TraceStats(path=str(path), format="chrome")
    try:
        fh = open_binary(path)
    except OSError as e:
        raise ProbeError(f"cannot read trace {path}: {e.strerror or e}") from e
    gz = isinstance(fh, Gunzip)
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
