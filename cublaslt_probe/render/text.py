"""Text tables: the one table renderer every command and page writes its tables with (`Table`,
`render_table`), cells fitted to one line of at most `MAX_CELL` characters (`fit`)."""
from __future__ import annotations

import itertools
from typing import Iterable, Iterator

MAX_CELL = 80  # no table cell is wider: longer values are cut with an ellipsis
SAMPLE_ROWS = 1000  # column widths come from the first rows (the rest stream through)
_CONTROL = {c: f"\\x{c:02x}" for c in range(32)} | {9: "\\t", 10: "\\n", 13: "\\r", 127: "\\x7f"}


def fit(s: str, width: int = MAX_CELL) -> str:
    """`s` on one line, at most `width` characters (cut with ``…``); control characters written as
    escapes so that no value can break the table's lines."""
    if not s.isprintable():
        s = s.translate(_CONTROL)
    return s if len(s) <= width else s[:width - 1] + "…"


class Table:
    """The one table renderer: aligned columns under a dashed rule, streamed in flat memory.

    Column widths come from the header and the first `SAMPLE_ROWS` rows (at least `min_widths`, for
    columns known to grow, such as line numbers), at most `max_width` (or the column's own cap in
    `caps`); a later cell that is wider but within the cap is written whole (its row stands out), and any
    cell beyond its cap is cut with an ellipsis. Columns named in `right` are right-aligned. No rows, no
    table (not even its header).

    `lines(rows)` does it all; a caller with its own fast loop (parse-log) calls `layout` on its first
    rows, then `head` and `row` itself.
    """

    def __init__(self, header: list[str], right: Iterable[str] = (), *, caps: dict[str, int] | None = None,
                 max_width: int = MAX_CELL, rule: bool = True, indent: str = "", show_header: bool = True,
                 min_widths: dict[str, int] | None = None):
        self.header = list(header)
        self.right = [h in set(right) for h in self.header]
        caps = caps or {}
        self.caps = [caps.get(h, max_width) for h in self.header]
        self.rule, self.indent, self.show_header = rule, indent, show_header
        self.min_widths = [(min_widths or {}).get(h, 0) for h in self.header]
        self.widths: list[int] = []

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

    def head(self) -> str:
        """The header line and the rule under it (empty without a header)."""
        if not (self.header and self.show_header):
            return ""
        out = self.row(self.header)
        if self.rule:
            out += (self.indent + "  ".join("-" * w for w in self.widths)).rstrip() + "\n"
        return out

    def row(self, cells: Iterable[str]) -> str:
        """One row's line (with ``"\\n"``), once `layout` has fixed the widths."""
        out = []
        for c, w, cap, rj in zip(cells, self.widths, self.caps, self.right):
            c = fit(c, cap)
            out.append(c.rjust(w) if rj else c.ljust(w))
        return (self.indent + "  ".join(out)).rstrip() + "\n"

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
