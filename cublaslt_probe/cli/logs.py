"""`parse-log`: cuBLASLt (or cuBLAS) log files → a table of GEMMs, or "which GEMMs, how often".

Every format streams: records are written as they are parsed (Parquet in row groups), the table's column
widths come from its first rows, and `--summary` counts distinct GEMMs as they pass; memory stays flat
for any log size (benchmarks/bench_parse_log.py).
"""
from __future__ import annotations

import gc
import sys

import click

from cublaslt_probe.cli._common import (
    EXIT_PARTIAL,
    FORMATS,
    SAMPLE_ROWS,
    Lines,
    Table,
    cell,
    json_array,
    out_format,
    output_options,
    text_output,
    write_frame,
)
from cublaslt_probe.errors import ProbeError


@click.command("parse-log")
@click.argument("files", nargs=-1, required=True, metavar="FILE...")
@output_options(FORMATS)
@click.option("--summary", is_flag=True,
              help="One row per distinct GEMM (same problem and algo) with its count, most frequent first.")
@click.option("--api", is_flag=True,
              help="Also the Api (heuristic queries, with their preference), Info, Error and Hints lines.")
@click.option("--cublas", is_flag=True,
              help="The files are cuBLAS API logs (CUBLAS_LOGINFO_DBG=1): list the calls and arguments.")
@click.option("--cublas-version", "cublas_version", metavar="VERSION",
              help="The cuBLAS version the program ran (e.g. 13.1.0.3): known issues are matched against it "
                   "(the known_issue column; without it a matching config 'can meet' an issue).")
@click.option("--cc", metavar="X.Y", help="The GPU's compute capability (e.g. 9.0), for the known issues.")
@click.pass_context
def parse_log_cmd(ctx, files, fmt, output, summary, api, cublas, cublas_version, cc):
    """Read cuBLASLt logs (CUBLASLT_LOG_LEVEL=2..5 or CUBLASLT_LOG_MASK) and list the GEMMs in them.

    FILE may be gzipped; `-` reads stdin. Several files (app_%i.log of many processes) are merged; the
    pid column tells the processes apart. Lines that are not cuBLASLt log lines are counted and the first
    few reported on stderr (-vv lists them all). Exit status: 0 when every file was read whole, 3 when
    records were written but a file could not be read or was cut off, or log lines were damaged, 1 when
    nothing usable was found (docs/cli.md).

    \b
    Capture a log from any program:
      CUBLASLT_LOG_LEVEL=2 CUBLASLT_LOG_FILE=gemms_%i.log python train.py
      cublaslt-probe parse-log gemms_*.log --summary
    """
    fmt = out_format(fmt, output, FORMATS)
    from cublaslt_probe import known_issues
    for hint, value, check in (("--cublas-version", cublas_version, known_issues.version_tuple),
                               ("--cc", cc, lambda v: known_issues.cc_affected(v, ()))):
        try:
            if value is not None:
                check(value)
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint=hint) from None
    if cublas and (cublas_version or cc):
        raise click.UsageError("--cublas-version and --cc match cuBLASLt algo configs; a --cublas log has none")
    if cublas and summary:
        raise click.UsageError("--summary groups cuBLASLt records; it does not apply to --cublas logs")
    from cublaslt_probe.logs import ParseStats
    # Records stream through and form no reference cycles: collect cycles less often (a third of the
    # parse time goes to the collector at its default thresholds, with nothing to collect).
    gc.set_threshold(50_000, 20, 100)
    sources = [sys.stdin.buffer if f == "-" else f for f in files]
    stats = ParseStats()
    verbose = ctx.find_root().params.get("verbose", 0)
    if verbose >= 2:
        stats.on_bad = lambda b: click.echo(f"bad line {b}", err=True)
    elif verbose == 1:
        stats.max_examples = 50
    if cublas:
        _emit_cublas(sources, stats, fmt, output)
    else:
        issues = _emit_lt(sources, stats, fmt, output, summary, api, multi=len(files) > 1,
                          env={"cublas": cublas_version, "cc": cc})
        for line in issues:
            click.echo(line, err=True)
    code = _report(stats, cublas, files)
    if output and output != "-":
        click.echo(f"wrote {output}", err=True)
    ctx.exit(code)


def _name(src) -> str | None:
    return "<stdin>" if src is sys.stdin.buffer else None


def _report(stats, cublas: bool, files) -> int:
    """Say on stderr what was read and what was not; the exit status. Nothing usable is one error line."""
    if stats.records == 0:
        what = "cuBLAS calls" if cublas else "GEMM records"
        where = ", ".join(stats.files_read)
        failed = "".join(f"; cannot read {p}: {why}" for p, why in stats.files_failed)
        if stats.lines and stats.foreign == stats.lines - stats.skipped:
            kind = "cuBLAS API log (CUBLAS_LOGINFO_DBG=1)" if cublas else "cuBLASLt log (CUBLASLT_LOG_LEVEL)"
            raise ProbeError(f"{where}: not a {kind}: none of its {stats.lines:,} lines is a log line"
                             + ("; for a cuBLASLt log drop --cublas" if cublas else
                                "; for cuBLAS's own API log add --cublas") + failed)
        damaged = f"; {stats.damaged:,} damaged lines, the first {stats.bad_lines[0]}" if stats.damaged else ""
        hint = ("" if cublas else
                " (was CUBLASLT_LOG_LEVEL >= 2 set before the program started? --api shows the other lines)")
        raise ProbeError(f"no {what} in {where}{hint}{damaged}{failed}")
    if stats.bad or stats.files_failed:
        for line in stats.report():
            click.echo(line, err=True)
        if stats.bad > len(stats.bad_lines) and stats.on_bad is None:
            click.echo("(-v lists the first 50 bad lines, -vv all of them)", err=True)
    return 0 if stats.complete else EXIT_PARTIAL


def _emit_lt(sources, stats, fmt, output, summary, api, multi, env) -> list[str]:
    """Write the records in `fmt`; the known-issue notes for stderr (one line per issue, with its count)."""
    from cublaslt_probe.logs import parse_log
    from cublaslt_probe.logs.issues import IssueCount, annotate
    from cublaslt_probe.logs.parser import each_source
    counted = IssueCount()
    records = counted.count(annotate(each_source(sources, stats,
                                                 lambda src: parse_log(src, api=api, stats=stats, name=_name(src))),
                                     **env))
    _write_lt(records, fmt, output, summary, api, multi)
    return counted.notes()


def _write_lt(records, fmt, output, summary, api, multi) -> None:
    from cublaslt_probe.logs.frame import Summary
    from cublaslt_probe.logs.write import CSV_HEADER, ParquetStream, csv_chunks, jsonl_chunks
    if summary:
        acc = Summary()
        for r in records:
            acc.add(r)
        df = acc.frame()
        write_frame(df, fmt, output, lambda: _summary_table(df))
        return
    if fmt == "parquet":
        try:
            w = ParquetStream(output)
            for r in records:
                w.write(r)
            w.close()
        except OSError as e:
            raise ProbeError(f"cannot write {output}: {e.strerror or e}") from e
        return
    with text_output(output) as out:
        if fmt == "table":
            _records_table(records, multi, api, out)
            return
        if fmt == "csv":
            out.write(CSV_HEADER)
        pieces = (csv_chunks if fmt == "csv" else jsonl_chunks)(records)
        for piece in (json_array(pieces) if fmt == "json" else pieces):
            out.write_bytes(piece)


def _records_table(records, multi: bool, api: bool, out) -> None:
    """The records as a table: widths from the first rows, then every row through the memoized encoder."""
    import itertools

    from cublaslt_probe.logs.write import RECORD_RIGHT, record_cells, record_header, table_chunks
    records = iter(records)
    sample = list(itertools.islice(records, SAMPLE_ROWS))
    if not sample:
        return
    # line numbers grow past the first rows' width: room for 7 digits from the start
    table = Table(record_header(multi, api), RECORD_RIGHT, min_widths={"line": 7})
    table.layout([record_cells(r, multi, api) for r in sample])
    out.write(table.head())
    width = table.widths[1 if multi else 0]
    for piece in table_chunks(itertools.chain(sample, records), multi, api, table.row, width):
        out.write_bytes(piece)


def _summary_table(df) -> str:
    from cublaslt_probe.logs.write import GEMM_HEADER, gemm_cells
    rows = []
    for r in df.to_dict(orient="records"):
        get = lambda c, r=r: cell(r.get(c))
        torch_view = f"{get('torch_m')}x{get('torch_n')}x{get('torch_k')}" if get("torch_m") else ""
        rows.append([get("count"), f"{100 * r['share']:.1f}%"] + gemm_cells(get) + [torch_view])
    return Table(["count", "share"] + GEMM_HEADER + ["torch MxNxK"],
                 {"count", "share", "m", "n", "k", "batch"}).text(rows)


_CUBLAS_COLUMNS = ["line", "time", "pid", "function", "trans", "m", "n", "k", "batch", "a_type", "b_type",
                   "c_type", "compute_type", "args", "file"]


def _cublas_row(c) -> list:
    return [c.line, c.time, c.pid, c.function, f"{c.op_a or ''}{c.op_b or ''}", c.m, c.n, c.k,
            c.batch_count, c.a_type, c.b_type, c.c_type, c.compute_type,
            "; ".join(f"{n}={v}" for n, _, v in c.args), c.file]


def _emit_cublas(sources, stats, fmt, output):
    from cublaslt_probe.logs import parse_cublas_log
    from cublaslt_probe.logs.parser import each_source
    from cublaslt_probe.logs.write import csv_row
    calls = each_source(sources, stats, lambda src: parse_cublas_log(src, stats=stats, name=_name(src)))
    if fmt == "parquet":
        import pandas as pd
        df = pd.DataFrame([_cublas_row(c) for c in calls], columns=_CUBLAS_COLUMNS)
        for col in ("m", "n", "k", "batch", "pid"):
            df[col] = pd.array(df[col].tolist(), dtype="Int64")
        write_frame(df, "parquet", output)
        return
    import json
    with text_output(output) as out:
        if fmt == "table":
            cols = ["line", "pid", "function", "trans", "m", "n", "k", "batch", "a_type", "compute_type"]
            idx = [_CUBLAS_COLUMNS.index(c) for c in cols]
            rows = ([cell(row[i]) for i in idx] for row in map(_cublas_row, calls))
            Table(cols, {"line", "pid", "m", "n", "k", "batch"}).write(rows, out)
            return
        buf = Lines(out)
        if fmt == "csv":
            buf.add(csv_row(_CUBLAS_COLUMNS))
            for c in calls:
                buf.add(csv_row(_cublas_row(c)))
        else:
            lines = (json.dumps(c.to_dict()).encode() + b"\n" for c in calls)
            for piece in (json_array(lines) if fmt == "json" else lines):
                buf.add(piece.decode())
        buf.close()


COMMANDS = [parse_log_cmd]
