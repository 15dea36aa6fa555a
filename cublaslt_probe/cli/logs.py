"""`parse-log`: cuBLASLt (or cuBLAS) log files → a table of GEMMs, or "which GEMMs, how often"."""
from __future__ import annotations

import json
import os
import sys

import click

from cublaslt_probe.cli._common import check_writable, write_frame
from cublaslt_probe.cli._common import json_default as _json_default
from cublaslt_probe.cli._common import write_text as _write_text
from cublaslt_probe.errors import ProbeError

FORMATS = ["table", "jsonl", "csv", "parquet"]



@click.command("parse-log")
@click.argument("files", nargs=-1, required=True, metavar="FILE...")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True,
              help="Output format (parquet needs -o).")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None,
              help="Write here instead of stdout.")
@click.option("--summary", is_flag=True,
              help="One row per distinct GEMM (same problem and algo) with its count, most frequent first.")
@click.option("--api", is_flag=True,
              help="Also the Api (heuristic queries, with their preference), Info, Error and Hints lines.")
@click.option("--cublas", is_flag=True,
              help="The files are cuBLAS API logs (CUBLAS_LOGINFO_DBG=1): list the calls and arguments.")
def parse_log_cmd(files, fmt, output, summary, api, cublas):
    """Read cuBLASLt logs (CUBLASLT_LOG_LEVEL=2..5 or CUBLASLT_LOG_MASK) and list the GEMMs in them.

    FILE may be gzipped; `-` reads stdin. Several files (app_%i.log of many processes) are merged; the
    pid column tells the processes apart. Lines that are not cuBLASLt log lines are counted and the first
    few reported on stderr; the exit status is 0 when at least one file could be read.

    \b
    Capture a log from any program:
      CUBLASLT_LOG_LEVEL=2 CUBLASLT_LOG_FILE=gemms_%i.log python train.py
      cublaslt-probe parse-log gemms_*.log --summary
    """
    if fmt == "parquet" and not output:
        raise click.UsageError("--format parquet writes a binary file: give it a path with -o OUT.parquet")
    if cublas and summary:
        raise click.UsageError("--summary groups cuBLASLt records; it does not apply to --cublas logs")
    from cublaslt_probe.logs import ParseStats
    check_writable(output)
    sources = [sys.stdin.buffer if f == "-" else f for f in files]
    stats = ParseStats()
    try:
        if cublas:
            _emit_cublas(sources, stats, fmt, output)
        else:
            _emit_lt(sources, stats, fmt, output, summary, api)
    except BrokenPipeError:  # `parse-log ... | head`: stop quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        sys.exit(1)
    finally:
        _report(stats, cublas)




def _name(src) -> str | None:
    return "<stdin>" if src is sys.stdin.buffer else None


def _report(stats, cublas: bool) -> None:
    if not stats.files_read:  # nothing could be read: the `Error: ...` line says why
        return
    if stats.bad or stats.files_failed:
        for line in stats.report():
            click.echo(line, err=True)
    if stats.files_read and stats.records == 0:
        what = "cuBLAS calls" if cublas else "GEMM records"
        hint = ("" if cublas else
                " (was CUBLASLT_LOG_LEVEL >= 2 set before the program started? --api shows the other lines)")
        click.echo(f"no {what} in {', '.join(stats.files_read)}{hint}", err=True)


def _open_out(output):
    if not output or output == "-":
        return None
    try:
        return open(output, "w", encoding="utf-8", newline="")
    except OSError as e:
        raise ProbeError(f"cannot write {output}: {e.strerror or e}") from e


def _emit_lt(sources, stats, fmt, output, summary, api):
    from cublaslt_probe.logs import parse_log
    from cublaslt_probe.logs.parser import each_source
    records = each_source(sources, stats,
                          lambda src: parse_log(src, api=api, stats=stats, name=_name(src)))
    if fmt == "jsonl" and not summary:  # streams: memory stays flat for any log size
        f = _open_out(output)
        write = f.write if f is not None else sys.stdout.write
        try:
            for r in records:
                write(json.dumps(r.to_dict(), default=_json_default) + "\n")
        finally:
            if f is not None:
                f.close()
        return
    from cublaslt_probe.logs.frame import format_records, format_summary, records_to_frame, summarize
    df = records_to_frame(records)
    if summary:
        df = summarize(df)
    write_frame(df, fmt, output, lambda: format_summary(df) if summary else format_records(df))


def _emit_cublas(sources, stats, fmt, output):
    from cublaslt_probe.logs import parse_cublas_log
    from cublaslt_probe.logs.parser import each_source
    calls = list(each_source(sources, stats,
                             lambda src: parse_cublas_log(src, stats=stats, name=_name(src))))
    if fmt == "jsonl":
        _write_text(output, "".join(json.dumps(c.to_dict()) + "\n" for c in calls))
        return
    import pandas as pd
    df = pd.DataFrame([{"line": c.line, "time": c.time, "pid": c.pid, "function": c.function,
                        "trans": f"{c.trans_a or ''}{c.trans_b or ''}", "m": c.m, "n": c.n, "k": c.k,
                        "batch": c.batch_count, "a_type": c.a_type, "b_type": c.b_type,
                        "c_type": c.c_type, "compute_type": c.compute_type,
                        "args": "; ".join(f"{n}={v}" for n, _, v in c.args), "source": c.source}
                       for c in calls],
                      columns=["line", "time", "pid", "function", "trans", "m", "n", "k", "batch",
                               "a_type", "b_type", "c_type", "compute_type", "args", "source"])
    for col in ("m", "n", "k", "batch", "pid"):
        df[col] = pd.array(df[col].tolist(), dtype="Int64")
    if fmt == "csv":
        _write_text(output, df.to_csv(index=False))
    elif fmt == "parquet":
        try:
            df.to_parquet(output, index=False)
        except OSError as e:
            raise ProbeError(f"cannot write {output}: {e.strerror or e}") from e
    else:
        from cublaslt_probe.logs.frame import _render, _s
        cols = ["line", "pid", "function", "trans", "m", "n", "k", "batch", "a_type", "compute_type"]
        rows = [[_s(v) for v in r] for r in df[cols].itertuples(index=False)]
        _write_text(output, _render(cols, rows, {"line", "pid", "m", "n", "k", "batch"}))


COMMANDS = [parse_log_cmd]
