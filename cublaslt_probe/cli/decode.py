"""`cublaslt-probe decode` and `cublaslt-probe grammars`: thin commands over `cublaslt_probe.names`."""
from __future__ import annotations

import itertools
import json
import sys
from typing import Iterable, Iterator

import click

from cublaslt_probe.cli._common import (
    EXIT_PARTIAL,
    FEW_ROWS_FORMATS,
    TEXT_JSON,
    Lines,
    Table,
    clean_text,
    out_format,
    output_option,
    output_options,
    text_output,
    wrap,
    write_result,
)
from cublaslt_probe.errors import UnknownKernelName
from cublaslt_probe.logs.write import csv_row
from cublaslt_probe.names import GRAMMARS, JSONL_KEYS, KernelName, decode
from cublaslt_probe.names.core import _strict_message

_TABLE_COLUMNS = ("name", "family", "arch", "types", "tile", "k x stages", "cluster", "layout", "flags",
                  "unparsed")


class _Names:
    """The names to decode, one at a time: arguments, and stdin (`-`, or no argument) one name per line.

    Lines end at "\\n" (a CRLF's CR is dropped, a lone CR stays in its name); undecodable bytes, in an
    argument or on stdin, become U+FFFD and are counted in `replaced`.
    """

    def __init__(self, args: tuple[str, ...]):
        if not args and (sys.stdin is None or sys.stdin.isatty()):
            raise click.UsageError("give kernel names as arguments, or pipe them one per line on stdin "
                                   "(`-` reads stdin too)")
        self.args = args or ("-",)
        self.replaced = 0

    def _clean(self, s: str) -> str:
        t = clean_text(s)
        if t is not s:
            self.replaced += 1
        return t

    def __iter__(self) -> Iterator[str]:
        for a in self.args:
            if a != "-":
                yield self._clean(a)
                continue
            stream = getattr(sys.stdin, "buffer", None)
            if stream is None:
                for line in sys.stdin:
                    yield self._clean(line[:-1] if line.endswith("\n") else line)
                continue
            for raw in stream:
                raw = raw[:-1] if raw.endswith(b"\n") else raw
                if raw.endswith(b"\r"):
                    raw = raw[:-1]
                try:
                    yield raw.decode("utf-8")
                except UnicodeDecodeError:
                    self.replaced += 1
                    yield raw.decode("utf-8", "replace")


def _fmt(v) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (tuple, list)):
        if v and all(isinstance(x, int) and not isinstance(x, bool) for x in v):
            return "x".join(str(x) for x in v)
        return " ".join(str(x) for x in v)
    return str(v)


def _pair(a, b) -> str:
    return "" if a is None or b is None else f"{a}x{b}"


def _types(kn: KernelName) -> str:
    if kn.type_code:
        return kn.type_code
    return "/".join(x for x in (kn.a_type, kn.c_type, kn.compute_type) if x) if kn.a_type else ""


def _row(kn: KernelName) -> list[str]:
    return [kn.name, kn.family, _fmt(kn.arch), _types(kn), _pair(kn.tile_m, kn.tile_n),
            _pair(kn.tile_k, kn.stages) or _fmt(kn.tile_k), _pair(kn.cluster_m, kn.cluster_n),
            _fmt(kn.layout), _fmt(kn.flags), _fmt(kn.unparsed)]


def _one(kn: KernelName) -> list[list[str]]:
    """The field/value view of one name."""
    d = kn.to_dict()
    first = ("name", "family", "short")
    rows = [[k, _fmt(d.get(k))] for k in first]
    rows += [[k, _fmt(v)] for k, v in d.items() if k not in first and v not in (None, [], "") and k != "tokens"]
    return rows


def chunks(kns: Iterable[KernelName], fmt: str) -> Iterator[str]:
    """The text `decode` prints for these names in this format, a piece at a time (flat memory)."""
    it = iter(kns)
    if fmt == "jsonl":
        for kn in it:
            yield json.dumps(kn.to_dict(), ensure_ascii=False) + "\n"
    elif fmt == "json":
        first = True
        for kn in it:
            text = json.dumps(kn.to_dict(), indent=2, ensure_ascii=False).replace("\n", "\n  ")
            yield ("[\n  " if first else ",\n  ") + text
            first = False
        yield "[]\n" if first else "\n]\n"
    elif fmt == "csv":
        keys = None
        for kn in it:
            d = kn.to_dict()
            if keys is None:
                keys = list(d)
                yield csv_row(keys)
            yield csv_row(_fmt(d.get(k)) for k in keys)
        if keys is None:
            yield csv_row(JSONL_KEYS)
    else:
        head = list(itertools.islice(it, 2))
        if len(head) == 1:
            yield from Table(["field", "value"], show_header=False, rule=False).lines(_one(head[0]))
        elif head:
            rows = map(_row, itertools.chain(head, it))
            yield from Table(list(_TABLE_COLUMNS), rule=False,
                             caps={"name": 100, "unparsed": 60, "flags": 60}).lines(rows)


def render(kns: list[KernelName], fmt: str) -> str:
    """The text `decode` prints for these names in this format (no trailing newline)."""
    return "".join(chunks(kns, fmt)).rstrip("\n")


@click.command("decode")
@click.argument("names", nargs=-1)
@output_options(FEW_ROWS_FORMATS)
@click.option("--strict", is_flag=True,
              help="Fail (exit 1) when a name has an unknown family or tokens no rule understands (the "
                   "names are then held in memory until all are checked).")
def decode_cmd(names: tuple[str, ...], fmt: str | None, output: str | None, strict: bool) -> None:
    """Explain cuBLAS kernel names: family, dtypes, tile, stages, cluster, layout, flags.

    NAMES are kernel names as a trace shows them (bare, demangled `void cutlass::Kernel2<...>(...)`, or
    mangled `_Z...`). With no NAMES, or `-`, names are read one per line from stdin. Names stream through
    in flat memory; the table cuts values longer than its column (…); csv/jsonl keep them whole.
    Formats: table (a field/value view for one name, a row per name for many), csv, jsonl (one object per
    input line, in order), json (one array). Exit status 3 when a name held undecodable bytes (shown
    as U+FFFD).

    \b
    Example:
      cublaslt-probe decode nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT
    """
    fmt = out_format(fmt, output, FEW_ROWS_FORMATS)
    items = _Names(names)
    kns: Iterable[KernelName] = map(decode, items)
    if strict:
        kns = list(kns)
        bad = [kn for kn in kns if not kn.known]
        if bad:
            more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
            raise UnknownKernelName(_strict_message(bad[0]) + more)
    with text_output(output) as out:
        buf = Lines(out)
        for text in chunks(kns, fmt):
            buf.add(text)
        buf.close()
    if output and output != "-":
        click.echo(f"wrote {output}", err=True)
    if items.replaced:
        click.echo(f"warning: {items.replaced:,} name{'s' if items.replaced > 1 else ''} held bytes that are not "
                   "UTF-8, shown as U+FFFD (exit status 3)", err=True)
        click.get_current_context().exit(EXIT_PARTIAL)


_HELPER_FAMILIES = ("gemv", "gemmSN", "splitk_reduce", "helper", "framework")
_GRAMMAR_CHOICES = sorted({g.name for g in GRAMMARS.values()} | {g.family for g in GRAMMARS.values()}
                          | set(_HELPER_FAMILIES))


@click.command("grammars")
@click.argument("family", required=False, metavar="[FAMILY]", type=click.Choice(_GRAMMAR_CHOICES))
@click.option("-f", "--format", "fmt", type=click.Choice(TEXT_JSON), default=None,
              help="text: for people; json: every grammar and token meaning as data  [default: text, or the "
                   "suffix of -o].")
@output_option(TEXT_JSON)
def grammars_cmd(family: str | None, fmt: str | None, output: str | None) -> None:
    """List the kernel-name grammars and every token's meaning, marked measured or inferred.

    FAMILY limits the listing to one family or grammar (nvjet, xmma, cutlass, cutlass3x, legacy, gemv,
    gemmSN, splitk_reduce, helper, framework, nvjet_sm120, helpers).

    `measured`: backed by the project's captures (a kernel name paired with the cuBLASLt algo config
    that launched it, or with the GEMM that ran); `inferred`: read from the name's shape and public
    sources, not yet backed by such a pair.
    """
    fmt = out_format(fmt, output, TEXT_JSON)
    if family in _HELPER_FAMILIES:
        family = "helpers"
    gs = [g for g in GRAMMARS.values() if family is None or family in (g.name, g.family)]
    write_result(output, json.dumps([g.to_dict() for g in gs], indent=2, ensure_ascii=False) if fmt == "json"
                 else wrap(render_grammars(gs)))


def render_grammars(gs) -> str:
    out = []
    for g in gs:
        rows = g.meanings()
        nm = sum(r.evidence == "measured" for r in rows)
        out.append(f"{g.name}  (family {g.family}): {g.summary}")
        out.append(f"  template: {g.template}")
        for ex in g.examples:
            out.append(f"  example:  {ex}")
        for note in g.notes:
            out.append(f"  note:     {note}")
        out.append(f"  tokens:   {len(rows)} ({nm} measured, {len(rows) - nm} inferred)")
        table = Table(["token", "field", "evidence", "meaning"], rule=False, indent="    ", max_width=400)
        out.extend(ln.rstrip("\n") for ln in table.lines([r.token, r.field, r.evidence, r.meaning] for r in rows))
        out.append("")
    return "\n".join(out).rstrip("\n")


COMMANDS = [decode_cmd, grammars_cmd]
