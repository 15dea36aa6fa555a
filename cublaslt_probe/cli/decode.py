"""`cublaslt-probe decode` and `cublaslt-probe grammars`: thin commands over `cublaslt_probe.names`."""
from __future__ import annotations

import csv
import io
import json
import sys

import click

from cublaslt_probe.errors import UnknownKernelName
from cublaslt_probe.names import GRAMMARS, JSONL_KEYS, KernelName, decode
from cublaslt_probe.names.core import _strict_message

FORMATS = ("table", "json", "jsonl", "csv")
_TABLE_COLUMNS = ("name", "family", "arch", "types", "tile", "k x stages", "cluster", "layout", "flags",
                  "unparsed")


def _read_stdin() -> list[str]:
    text = sys.stdin.read()
    if not text:
        return []
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return [ln[:-1] if ln.endswith("\r") else ln for ln in lines]


def _names(args: tuple[str, ...]) -> list[str]:
    if not args:
        if sys.stdin is None or sys.stdin.isatty():
            raise click.UsageError("give kernel names as arguments, or pipe them one per line on stdin "
                                   "(`-` reads stdin too)")
        return _read_stdin()
    out: list[str] = []
    for a in args:
        if a == "-":
            out.extend(_read_stdin())
        else:
            out.append(a)
    return out


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


def _table(rows: list[list[str]], header: tuple[str, ...] | None = None) -> str:
    allrows = ([list(header)] if header else []) + rows
    ncol = max(len(r) for r in allrows)
    widths = [max(len(r[i]) for r in allrows if i < len(r)) for i in range(ncol)]
    lines = []
    for r in allrows:
        cells = [c.ljust(widths[i]) for i, c in enumerate(r)]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def render(kns: list[KernelName], fmt: str) -> str:
    """The text `decode` prints for these names in this format (no trailing newline)."""
    if fmt == "json":
        return json.dumps([kn.to_dict() for kn in kns], indent=2, ensure_ascii=False)
    if fmt == "jsonl":
        return "\n".join(json.dumps(kn.to_dict(), ensure_ascii=False) for kn in kns)
    if fmt == "csv":
        buf = io.StringIO()
        keys = list(kns[0].to_dict()) if kns else list(JSONL_KEYS)
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(keys)
        for kn in kns:
            d = kn.to_dict()
            w.writerow([_fmt(d[k]) for k in keys])
        return buf.getvalue().rstrip("\n")
    if len(kns) == 1:
        d = kns[0].to_dict()
        first = ("name", "family", "short")
        rows = [[k, _fmt(d[k])] for k in first]
        rows += [[k, _fmt(v)] for k, v in d.items()
                 if k not in first and v not in (None, [], "") and k != "tokens"]
        return _table(rows)
    return _table([_row(kn) for kn in kns], _TABLE_COLUMNS)


@click.command("decode")
@click.argument("names", nargs=-1)
@click.option("-f", "--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True,
              help="table: field/value view for one name, one row per name for many; json: one array; "
                   "jsonl: one object per input line, in order; csv: one row per name.")
@click.option("--strict", is_flag=True,
              help="Fail (exit 1) when a name has an unknown family or tokens no rule understands.")
def decode_cmd(names: tuple[str, ...], fmt: str, strict: bool) -> None:
    """Explain cuBLAS kernel names: family, dtypes, tile, stages, cluster, layout, flags.

    NAMES are kernel names as a trace shows them (bare, demangled `void cutlass::Kernel2<...>(...)`, or
    mangled `_Z...`). With no NAMES, or `-`, names are read one per line from stdin.

    \b
    Example:
      cublaslt-probe decode nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT
    """
    items = _names(names)
    kns = [decode(n) for n in items]
    if strict:
        bad = [kn for kn in kns if not kn.known]
        if bad:
            more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
            raise UnknownKernelName(_strict_message(bad[0]) + more)
    if not kns:
        if fmt in ("json",):
            click.echo("[]")
        elif fmt == "csv":
            click.echo(render([], "csv"))
        return
    click.echo(render(kns, fmt))


_HELPER_FAMILIES = ("gemv", "gemmSN", "splitk_reduce", "helper", "framework")
_GRAMMAR_CHOICES = sorted({g.name for g in GRAMMARS.values()} | {g.family for g in GRAMMARS.values()}
                          | set(_HELPER_FAMILIES))


@click.command("grammars")
@click.argument("family", required=False, metavar="[FAMILY]", type=click.Choice(_GRAMMAR_CHOICES))
@click.option("-f", "--format", "fmt", type=click.Choice(("text", "json")), default="text",
              show_default=True)
def grammars_cmd(family: str | None, fmt: str) -> None:
    """List the kernel-name grammars and every token's meaning, marked measured or inferred.

    FAMILY limits the listing to one family or grammar (nvjet, xmma, cutlass, cutlass3x, legacy, gemv,
    gemmSN, splitk_reduce, helper, framework, nvjet_sm120, helpers).

    `measured`: backed by the project's captures (a kernel name paired with the cuBLASLt algo config
    that launched it, or with the GEMM that ran); `inferred`: read from the name's shape and public
    sources, not yet backed by such a pair.
    """
    if family in _HELPER_FAMILIES:
        family = "helpers"
    gs = [g for g in GRAMMARS.values() if family is None or family in (g.name, g.family)]
    if fmt == "json":
        click.echo(json.dumps([g.to_dict() for g in gs], indent=2, ensure_ascii=False))
        return
    click.echo(render_grammars(gs))


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
        table = _table([[r.token, r.field, r.evidence, r.meaning] for r in rows],
                       ("token", "field", "evidence", "meaning"))
        out.extend("    " + ln for ln in table.split("\n"))
        out.append("")
    return "\n".join(out).rstrip("\n")


COMMANDS = [decode_cmd, grammars_cmd]
