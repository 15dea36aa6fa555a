"""Text tables: the one table renderer every command and page writes its tables with (`Table`,
`render_table`), cells fitted to one line of at most `MAX_CELL` characters (`fit`), and tables and prose for
the terminal fitted to its width (`line_width`, `wrap`)."""
from __future__ import annotations

import contextvars
import itertools
import os
import re
import shutil
import sys
import textwrap
from typing import Iterable, Iterator

MAX_CELL = 80  # no table cell is wider: longer values are cut with an ellipsis
SAMPLE_ROWS = 1000  # column widths come from the first rows (the rest stream through)
_CONTROL = {c: f"\\x{c:02x}" for c in range(32)} | {9: "\\t", 10: "\\n", 13: "\\r", 127: "\\x7f"}
MIN_SHRUNK = 12  # a text column is not cut narrower than this (or its header) to fit the terminal
_LINE_WIDTH: contextvars.ContextVar[int | None] = contextvars.ContextVar("line_width", default=None)


def terminal_width() -> int | None:
    """The width tables for people are fitted to: ``COLUMNS`` when set (0: no limit), else the terminal's
    when stdout is one; None (no limit) when stdout is a pipe or a file."""
    cols = os.environ.get("COLUMNS", "").strip()
    if cols.isdigit():
        return int(cols) or None
    try:
        if sys.stdout is not None and sys.stdout.isatty():
            return shutil.get_terminal_size().columns
    except (AttributeError, ValueError, OSError):
        pass
    return None


def set_line_width(width: int | None) -> None:
    """The width the tables of this command are fitted to (None: no limit); the command sets it once it
    knows where its output goes (`cli._common.out_format`: the terminal's width for stdout, none for a file)."""
    _LINE_WIDTH.set(width)


def line_width() -> int | None:
    """The width set by `set_line_width` (None: no limit)."""
    return _LINE_WIDTH.get()


_NBSP = "\u00a0"   # textwrap breaks at ASCII whitespace only: a figure and its unit stay on one line
_UNIT = re.compile(r"(?<=\d) (?=(?:µs|ms|s|%|ns|GB|MB|B)\b|%)")
_GAP = re.compile(r"(?<=\S) {2,}(?=\S)")   # two of them make a table's row: columns apart by 2+ spaces
_MARKER = re.compile(r"( *)(\d+\. +|[-*] +|[a-z][a-z ()-]*: +)?")


def wrap(text: str, width: int | None | str = "terminal") -> str:
    """`text`'s lines (prose: sentences, advice, notes) each broken at spaces to at most `width` characters
    (default `line_width()`: the terminal's when the output goes there; None: unchanged). A continuation line
    is indented under the text after the line's own indent and marker (``1. ``, ``- ``, ``evidence: ``), or two
    spaces in from the indent when that leaves under half the width. A word longer than the width (a kernel
    name) stays whole on a line of its own, so it can still be copied. A line with two gaps of two spaces or
    more after its marker is a table's row: it is left whole (`Table` fits its own rows)."""
    width = line_width() if width == "terminal" else width
    if not width:
        return text
    out = []
    for line in text.split("\n"):
        m = _MARKER.match(line)
        if len(line) <= width or len(_GAP.findall(line, m.end())) >= 2:
            out.append(line)
            continue
        hang = len(m.group(0)) if m.group(2) and len(m.group(0)) <= width // 2 else len(m.group(1)) + 2
        out += [x.replace(_NBSP, " ") for x in textwrap.wrap(
            _UNIT.sub(_NBSP, line), width, subsequent_indent=" " * hang, break_long_words=False,
            break_on_hyphens=False)] or [line]
    return "\n".join(out)


def fit(s: str, width: int = MAX_CELL, tail: bool = False) -> str:
    """`s` on one line, at most `width` characters (cut with ``…``: its end, or with `tail` its start, for
    names whose last part tells them apart, such as module paths); control characters written as escapes
    so that no value can break the table's lines."""
    if not s.isprintable():
        s = s.translate(_CONTROL)
    if len(s) <= width:
        return s
    return "…" + s[len(s) - width + 1:] if tail else s[:width - 1] + "…"


def _broken(s: str, width: int) -> list[str]:
    """`s` on lines of at most `width` characters, broken at spaces (a figure kept with its unit, a word
    longer than the width split), control characters written as escapes (`fit`)."""
    s = fit(s, sys.maxsize)
    if len(s) <= width:
        return [s]
    return [x.replace(_NBSP, " ") for x in textwrap.wrap(_UNIT.sub(_NBSP, s), max(width, 1),
                                                         break_on_hyphens=False)] or [""]


class Table:
    """The one table renderer: aligned columns under a dashed rule, streamed in flat memory.

    Column widths come from the header and the first `SAMPLE_ROWS` rows (at least `min_widths`, for
    columns known to grow, such as line numbers), at most `max_width` (or the column's own cap in
    `caps`); a later cell that is wider but within the cap is written whole (its row stands out), and any
    cell beyond its cap is cut with an ellipsis (at its start for the columns named in `tail`). Columns
    named in `right` are right-aligned. A cell of a column named in `wrap` (prose: a label, how a figure was
    measured) is never cut: where it is wider than its column's cap it is broken at spaces onto continuation
    lines under itself (a figure stays on the line of its unit), the row's other cells on its first line. No
    rows, no table (not even its header).

    A line wider than `width` (default: `line_width()`, the terminal's when the output goes there) is fitted
    by one rule: the widest text columns are narrowed first (each to at least `MIN_SHRUNK` characters or its
    header, cells shortened with an ellipsis, or broken onto more lines in the `wrap` columns); numbers are
    never cut; if that is not enough, the last columns are left out and a closing line names them, with the
    output that holds them all (`whole`: a command's file at full width).

    `lines(rows)` does it all; a caller with its own fast loop (parse-log) calls `layout` on its first
    rows, then `head` and `row` itself.
    """

    def __init__(self, header: list[str], right: Iterable[str] = (), *, caps: dict[str, int] | None = None,
                 max_width: int = MAX_CELL, rule: bool = True, indent: str = "", show_header: bool = True,
                 min_widths: dict[str, int] | None = None, width: int | None | str = "terminal",
                 tail: Iterable[str] = (), wrap: Iterable[str] = (), whole: str = "-o FILE.csv"):
        self.header = list(header)
        self.right = [h in set(right) for h in self.header]
        caps = caps or {}
        self.caps = [caps.get(h, max_width) for h in self.header]
        self.rule, self.indent, self.show_header = rule, indent, show_header
        self.min_widths = [(min_widths or {}).get(h, 0) for h in self.header]
        self.widths: list[int] = []
        self.width = line_width() if width == "terminal" else width
        self.tail = [h in set(tail) for h in self.header]
        self.wrap = [h in set(wrap) for h in self.header]
        self.whole = whole   # the output that holds every column, for the closing line of a fitted table
        self.shown = len(self.header)   # columns written (the rest left out to fit `width`)

    def layout(self, sample: list[list[str]]) -> None:
        """Fix the column widths from these first rows."""
        caps = self.caps
        widths = [max(len(h) if self.show_header else 0, m) for h, m in zip(self.header, self.min_widths)]
        for r in sample:
            for i, c in enumerate(r):
                n = len(fit(c, caps[i]))
                if n > widths[i]:
                    widths[i] = n
        self.widths = [min(w, cap) for w, cap in zip(widths, caps)]
        if self.width:
            self._fit(self.width)

    def _fit(self, limit: int) -> None:
        """Cut the widest text columns, then leave out the last columns, until a line fits `limit`."""
        w = self.widths
        floor = [w[i] if self.right[i] else min(w[i], max(MIN_SHRUNK, len(h))) for i, h in enumerate(self.header)]

        def total(n: int) -> int:
            return len(self.indent) + sum(w[:n]) + 2 * max(n - 1, 0)
        excess = total(len(w)) - limit
        while excess > 0:
            i = max((j for j in range(len(w)) if w[j] > floor[j]), key=lambda j: w[j] - floor[j], default=None)
            if i is None:
                break
            cut = min(excess, max(1, (w[i] - floor[i]) // 2))
            w[i] -= cut
            excess -= cut
        self.caps = [min(c, x) for c, x in zip(self.caps, w)]
        n = len(w)
        while n > 1 and total(n) > limit:
            n -= 1
        self.shown = n

    def left_out(self) -> str:
        """The closing line that names the columns left out to fit the width ("" when none was)."""
        gone = self.header[self.shown:]
        if not gone:
            return ""
        return wrap(f"{self.indent}({len(gone)} more column{'s' if len(gone) > 1 else ''} not shown in {self.width} "
                    f"characters: {', '.join(gone)}; COLUMNS=0 or {self.whole} shows every column)", self.width) + "\n"

    def head(self) -> str:
        """The header line and the rule under it (empty without a header)."""
        if not (self.header and self.show_header):
            return ""
        out = self.row(self.header)
        if self.rule:
            out += (self.indent + "  ".join("-" * w for w in self.widths[:self.shown])).rstrip() + "\n"
        return out

    def row(self, cells: Iterable[str]) -> str:
        """One row's line (with ``"\\n"``), once `layout` has fixed the widths; with the continuation lines of
        its `wrap` cells wider than their column, several."""
        if any(self.wrap):
            return self._wrapped_row(cells)
        out = []
        for c, w, cap, rj, tl in itertools.islice(zip(cells, self.widths, self.caps, self.right, self.tail),
                                                  self.shown):
            c = fit(c, cap, tl)
            out.append(c.rjust(w) if rj else c.ljust(w))
        return (self.indent + "  ".join(out)).rstrip() + "\n"

    def _wrapped_row(self, cells: Iterable[str]) -> str:
        """`row` for a table with `wrap` columns: each of their cells wider than its cap broken over lines
        (`_broken`), the other cells on the first."""
        cols = list(itertools.islice(zip(cells, self.widths, self.caps, self.right, self.tail, self.wrap),
                                     self.shown))
        stacks = [_broken(c, cap) if wr else [fit(c, cap, tl)] for c, _, cap, _, tl, wr in cols]
        lines = []
        for k in range(max(map(len, stacks))):
            out = []
            for s, (_, w, _, rj, _, _) in zip(stacks, cols):
                c = s[k] if k < len(s) else ""
                out.append(c.rjust(w) if rj else c.ljust(w))
            lines.append((self.indent + "  ".join(out)).rstrip() + "\n")
        return "".join(lines)

    def lines(self, rows: Iterable[list[str]]) -> Iterator[str]:
        """The table's lines (each with ``"\\n"``) for `rows` (lists of strings)."""
        it = iter(rows)
        sample = list(itertools.islice(it, SAMPLE_ROWS))
        if not sample:  # no rows: no table (the command says why)
            return
        self.layout(sample)
        head = self.head()
        if head:
            yield head
        row = self.row
        for r in itertools.chain(sample, it):
            yield row(r)
        if self.shown < len(self.header):
            yield self.left_out()

    def write(self, rows: Iterable[list[str]], out, chunk: int = 64) -> None:
        """Write the table of `rows` to `out`."""
        buf: list = []
        for ln in self.lines(rows):
            buf.append(ln)
            if len(buf) >= chunk:
                out.write("".join(buf))
                buf.clear()
        if buf:
            out.write("".join(buf))

    def text(self, rows: Iterable[list[str]]) -> str:
        return "".join(self.lines(rows))


def render_table(header: list[str], rows: Iterable[list[str]], right: Iterable[str] = (), **kw) -> str:
    """A small table as text (see `Table`)."""
    return Table(header, right, **kw).text(rows)
