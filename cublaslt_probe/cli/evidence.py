"""Bring your own evidence: `trace` (a profiler trace's GEMM kernels) and `diff` (two datasets' kernel choices).

Both are CPU only and take the shared output options (cli/_common.py): ``-f/--format
table|csv|jsonl|json|parquet``, ``-o/--output FILE`` (its suffix picks the format) and ``--top N``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import click

if TYPE_CHECKING:
    import pandas as pd

from cublaslt_probe.cli._common import (
    EXIT_PARTIAL,
    FORMATS,
    bound_or_usage,
    check_dataset_file,
    check_trace,
    check_writable,
    out_format,
    render_table,
    suffix_format,
    write_frame,
)
from cublaslt_probe.cli._common import cell as _s
from cublaslt_probe.cli._common import clean as _clean
from cublaslt_probe.cli._common import output_options as _output_options
from cublaslt_probe.vocab import DIFF_TOLERANCE_PCT, IMAGE_FORMATS

output_options = _output_options(FORMATS, top=25)


def emit(df: pd.DataFrame, fmt: str, output: str | None, table: Callable[[], str]) -> None:
    """Write `df` in the chosen format (`table` renders the people's view)."""
    write_frame(df, fmt, output, table)
    if output and output != "-":
        click.echo(f"wrote {len(df):,} rows to {output}", err=True)


def _more(total: int, shown: int) -> str:
    return f"… {total - shown:,} more rows (--top 0 shows all)\n" if total > shown else ""


def _short(s, width: int) -> str:
    s = _s(s)
    return s if len(s) <= width else s[:width - 1] + "…"


# ------------------------------------------------------------------------------------------------ trace
_TRACE_FORMAT_NAMES = {"chrome": "Chrome trace", "nsys": "Nsight Systems SQLite export"}


def trace_header(summary) -> str:
    from cublaslt_probe.analysis.trace import timeline_sentence
    st = summary.stats
    gpu = f", {summary.device}" if summary.device else ""
    copies = f" and {st.copies:,} memcpy/memset" if st.copies else ""
    lines = [f"{st.path}: {_TRACE_FORMAT_NAMES.get(st.format, st.format)}{gpu}; {st.events:,} events, "
             f"{st.kernels:,} kernel launches{copies}, GPU time {st.gpu_time_us / 1e3:,.3f} ms"]
    if summary.timeline is not None and len(summary.timeline):
        lines.append(f"GPU time: {timeline_sentence(summary.timeline)}")
    df = summary.kernels
    gemm = summary.gemm_time_us
    share = f"{100 * gemm / summary.gpu_time_us:.1f}%" if summary.gpu_time_us else "-"
    nk = df["kernel"].nunique() if len(df) else 0
    line = (f"GEMM kernels: {st.gemm_launches:,} launches of {nk:,} kernels, {gemm / 1e3:,.3f} ms = "
            f"{share} of GPU time")
    if st.format == "chrome":
        line += f"; {st.linked:,} linked to an op, {st.with_shapes:,} with input shapes"
    if st.reduce_launches:
        line += f"; {st.reduce_attached:,} of {st.reduce_launches:,} split-K reduces counted with their GEMM"
    lines.append(line)
    pids = getattr(summary, "pids", [])
    if len(pids) > 1:
        lines.append(f"this file holds {len(pids):,} processes (pids {', '.join(map(str, pids[:8]))}"
                     f"{', …' if len(pids) > 8 else ''}: merged rank traces?): ids are joined within each process "
                     "and the rows are per process (column pid)")
    problems = trace_problems(st)
    if problems:
        lines.append("warning: " + "; ".join(problems))
    notes = trace_notes(st)
    if notes:
        lines.append("note: " + "; ".join(notes))
    if st.format == "nsys":
        lines.append("note: the Nsight Systems reader is untested on a real export (docs/trace.md); "
                     "an export has no op shapes")
    return "\n".join(lines) + "\n"


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}{'s' if n != 1 else ''}"


def trace_problems(st) -> list[str]:
    """What the reader could not use (the output is partial: exit 3), one phrase each."""
    cut = "the file is cut off inside the event array (the events before the cut are counted)"
    if st.truncated and st.gzip_error:
        cut = (f"the gzip stream is damaged inside the event array ({st.gzip_error}): the events before the "
               "damage are counted")
    return (([f"{_plural(st.bad_events, 'malformed event')} skipped"] if st.bad_events else [])
            + ([cut] if st.truncated else [])
            + ([f"{_plural(st.bad_durations, 'kernel or copy event')} without a numeric dur (or with a NaN, "
                "negative or infinite one" + (f", or one longer than the trace: {st.long_durations:,}"
                                              if getattr(st, "long_durations", 0) else "")
                + "; counted with 0 µs: their time is missing from the totals)"]
               if st.bad_durations else [])
            + ([f"{_plural(st.bad_ids, 'correlation or External id')} beyond 2^63-1 read as missing (their "
                "kernels are not linked to an op)"] if getattr(st, "bad_ids", 0) else []))


def trace_notes(st) -> list[str]:
    """What the reader saw that loses nothing, one phrase each."""
    return (["the gzip stream is damaged only after the last event (its end or checksum): every event was read"]
            if getattr(st, "gzip_damaged_after_events", False) else []) + (
            [f"{_plural(st.no_process, 'launch')} could not be told to a process (pid null)"]
            if getattr(st, "no_process", 0) else []) + (
            [f"{_plural(st.duplicate_events, 'kernel or copy event')} repeating another exactly (written twice) "
             f"counted once ({st.duplicate_us:,.1f} µs not counted twice)"]
            if getattr(st, "duplicate_events", 0) else [])


def _kernel_base(name) -> str:
    from cublaslt_probe.names import decode
    return decode(str(name)).base or str(name)


def trace_table(summary, df: pd.DataFrame, total: int, by: str) -> str:
    from cublaslt_probe.analysis.diff import kernel_label
    head = trace_header(summary)
    if by == "class":
        header = ["share", "launches", "kernels", "total_us", "kind", "provenance", "library", "family"]
        rows = [[_share(r.share), _s(r.launches), _s(r.kernels), f"{r.total_us:,.1f}", _s(r.kind),
                 _s(r.provenance), _s(r.library), _s(r.family)] for r in df.itertuples(index=False)]
        return head + "\n" + render_table(header, rows, {"share", "launches", "kernels", "total_us"}) + \
            _more(total, len(df))
    if not len(df):
        return head + "no GEMM kernels in this trace\n"
    several = len(getattr(summary, "pids", [])) > 1

    def lead(r) -> list[str]:
        return ([_s(r.pid)] if several else []) + [
            _share(r.share), _s(r.count), f"{r.total_us:,.1f}", f"{r.mean_us:,.2f}", _s(r.family),
            _s(r.provenance), _short(kernel_label(r.kernel), 44)]

    if by == "kernel":
        header = ["share", "count", "total_us", "mean_us", "family", "provenance", "decoded", "ops", "shapes",
                  "kernel"]
        rows = [lead(r) + [_short(r.ops, 40), _s(r.shapes), _short(_kernel_base(r.kernel), 72)]
                for r in df.itertuples(index=False)]
    else:
        header = ["share", "count", "total_us", "mean_us", "family", "provenance", "decoded", "op", "dtype",
                  "layout", "m", "n", "k", "batch", "groups", "kernel"]
        rows = [lead(r) + [_s(r.op), _s(r.dtype), _s(r.layout), _s(r.m), _s(r.n), _s(r.k), _s(r.batch),
                           _s(r.groups), _short(_kernel_base(r.kernel), 72)]
                for r in df.itertuples(index=False)]
    if several:
        header = ["pid"] + header
    right = {"pid", "share", "count", "total_us", "mean_us", "m", "n", "k", "batch", "groups", "shapes"}
    return head + "\n" + render_table(header, rows, right) + _more(total, len(df))


@click.command("trace")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--by", type=click.Choice(["shape", "kernel", "class"]), default="shape", show_default=True,
              help="shape: one row per GEMM kernel and calling op with its input shapes; kernel: one row per GEMM "
                   "kernel; class: every kernel, memcpy and memset summed by kind, provenance, library and family.")
@click.option("--coldstart", "coldstart_path", type=click.Path(dir_okay=False), default=None,
              help="A saved `cold-start --save` result of the same program: GEMM kernels it saw compiled at run "
                   "time get that provenance with evidence 'observed' (an evidence column is added).")
@output_options
def trace_cmd(file, by, fmt, output, top, coldstart_path):
    """Where a profiler trace's GPU time went, and its GEMM kernels: time, share, decoded fields, op, shapes.

    The header sums every kernel (and memcpy/memset) by provenance and kind ("62 % library-selected cuBLAS
    GEMMs, 21 % runtime-compiled Triton elementwise, ..."); the rows list every GEMM kernel, whichever
    library it comes from, with its provenance; grouped GEMMs (aten::_grouped_mm) with their group count.

    FILE is a torch.profiler Chrome trace (`.json` or `.json.gz`, read as a stream: a 1 GB trace needs
    little memory) or an Nsight Systems SQLite export (`nsys export --type sqlite`; that reader is
    untested on a real export). Split-K reduce kernels are counted with their GEMM. The calling op
    (aten::mm, aten::addmm, aten::_scaled_mm, ...) and its input shapes appear when the trace recorded
    them (torch.profiler with record_shapes=True); for GEMM ops the torch-view m, n, k, dtype and layout
    follow from them. A file that holds several processes (rank traces merged into one) is joined within
    each process, and its rows carry the process's pid.

    \b
    Capture a trace:
      with torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                                  record_shapes=True) as prof:
          step()
      prof.export_chrome_trace("trace.json.gz")
      cublaslt-probe trace trace.json.gz
    """
    from cublaslt_probe.analysis.trace import by_kernel, read_trace
    fmt = out_format(fmt, output, FORMATS)
    check_trace(file)
    summary = read_trace(file)
    if coldstart_path:
        from cublaslt_probe.analysis.coldstart.observed import apply_observed, trace_kernel_names
        from cublaslt_probe.analysis.coldstart.saved import load
        cold = load(coldstart_path)
        bound_or_usage(cold, coldstart_path, gpu=summary.device, names=trace_kernel_names(file, summary.kernels),
                       echo=lambda m: click.echo(m, err=True))
        summary.kernels, seen = apply_observed(summary.kernels, cold)
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(seen["gemm_rows_by_provenance"].items()))
        click.echo(f"cold-start evidence: {seen['gemm_rows']} GEMM row(s) of this trace observed made or chosen at run "
                   f"time ({kinds + ', ' if kinds else ''}evidence observed); the others keep the provenance their "
                   "name gives (evidence name)", err=True)
    df = {"shape": lambda: summary.kernels, "kernel": lambda: by_kernel(summary.kernels),
          "class": lambda: summary.timeline}[by]()
    total = len(df)
    n = top if top is not None else (25 if fmt == "table" else 0)
    shown = df.head(n) if n else df
    emit(shown, fmt, output, lambda: trace_table(summary, shown, total, by))
    st = summary.stats
    if fmt != "table":                 # the table says it in its header
        for ln in trace_header(summary).splitlines():
            if ln.startswith(("warning:", "note:", "this file holds")):
                click.echo(ln, err=True)
    if trace_problems(st):
        click.get_current_context().exit(EXIT_PARTIAL)


# ------------------------------------------------------------------------------------------------- diff
def _env_line(r) -> str:
    from cublaslt_probe.analysis.diff import ENV_CHECKED
    if not r.env_diff:
        vals = " · ".join(f"{k} {r.env_a.get(k)}" for k in ENV_CHECKED if r.env_a.get(k) not in (None, ""))
        return f"environment: {vals or 'not recorded'} (the same on both sides)\n"
    parts = "; ".join(f"{k} {a} → {b}" for k, a, b in r.env_diff)
    return f"environment differs (--allow-env-mismatch): {parts}\n"


def diff_header(r) -> str:
    s = r.summary
    tol = f"{r.tolerance_pct:g}"
    return (f"A: {r.label_a}  ({s['rows_a']:,} GEMMs)\n"
            f"B: {r.label_b}  ({s['rows_b']:,} GEMMs)\n"
            + _env_line(r)
            + f"in both: {s['both']:,}: same kernel {s['same']:,}, changed {s['changed']:,}, unmeasured "
              f"{s['unmeasured']:,}; only in A: {s['only_a']:,}; only in B: {s['only_b']:,}\n"
            + f"B against A (time, ±{tol}%): {s['faster']:,} faster, {s['slower']:,} slower, {s['within']:,} "
              f"within; where the kernel changed: {s['changed_faster']:,} faster, {s['changed_slower']:,} slower, "
              f"{s['changed_within']:,} within\n")


def _share(v) -> str:
    """A fraction of the trace's GPU time as a percentage; blank when there is none (no valid duration)."""
    v = _clean(v)
    return "" if v is None else f"{100 * v:.1f}%"


def _pct(v) -> str:
    v = _clean(v)
    return "" if v is None else f"{v:+.1f}%"


def diff_table(r, df: pd.DataFrame, total: int, show_all: bool) -> str:
    from cublaslt_probe.analysis.diff import kernel_label
    head = diff_header(r)
    if not len(df):
        return head + ("no GEMMs to list\n" if show_all else "no GEMM changed kernel\n")
    header = (["status"] if show_all else []) + [
        "op", "dtype", "layout", "m", "n", "k", "batch", "kernel A", "kernel B", "change", "A us", "B us",
        "time", "TFLOP/s A", "TFLOP/s B"]
    rows = []
    for x in df.itertuples(index=False):
        rows.append(([_s(x.status)] if show_all else []) + [
            _s(x.op), _s(x.dtype), _s(x.layout), _s(x.m), _s(x.n), _s(x.k), _s(x.batch),
            _short(kernel_label(x.kernel_a), 44), _short(kernel_label(x.kernel_b), 44), _short(x.change, 60),
            _s(x.time_us_a, ",.1f"), _s(x.time_us_b, ",.1f"), _pct(x.time_change_pct),
            _s(x.tflops_a, ",.1f"), _s(x.tflops_b, ",.1f")])
    right = {"m", "n", "k", "batch", "A us", "B us", "time", "TFLOP/s A", "TFLOP/s B"}
    return head + "\n" + render_table(header, rows, right) + _more(total, len(df))


def _backends(value: str | None):
    if value is None:
        return None
    parts = [p.strip() for p in value.split(",")]
    if len(parts) == 1:
        parts = parts * 2
    if len(parts) != 2 or not all(parts):
        raise click.BadParameter("give BACKEND_A,BACKEND_B (e.g. torch,torch-lt) or one backend for both",
                                 param_hint="--backends")
    return parts[0], parts[1]


@click.command("diff")
@click.argument("a", type=click.Path(dir_okay=False), metavar="A.parquet")
@click.argument("b", type=click.Path(dir_okay=False), metavar="B.parquet")
@click.option("--backends", metavar="A[,B]", default=None,
              help="Compare backend A of the first dataset with backend B of the second (e.g. torch,torch-lt; "
                   "the two files may be the same); one name compares that backend on both sides. Default: "
                   "join on the backend too.")
@click.option("--allow-env-mismatch", is_flag=True,
              help="Compare datasets whose GPU, cuBLASLt, torch or driver differ (by default that is refused).")
@click.option("--tolerance", type=click.FloatRange(min=0), default=DIFF_TOLERANCE_PCT, show_default=True,
              help="Time changes within ± this many % count as neither faster nor slower.")
@click.option("--all", "show_all", is_flag=True,
              help="List every GEMM (same, changed, only in one, unmeasured), not only the changed ones.")
@click.option("--op", multiple=True, help="Only this op (repeatable): mm, bmm, addmm, scaled_mm.")
@click.option("--dtype", multiple=True, help="Only this dtype (repeatable): fp32, tf32, fp16, bf16, fp8, ...")
@click.option("--layout", multiple=True, help="Only this layout (repeatable): NN, NT, TN, TT.")
@click.option("--k", "ks", multiple=True, type=int, help="Only this K (repeatable).")
@click.option("--map", "map_path", type=click.Path(dir_okay=False), default=None,
              help="Also draw where the kernels differ (.png, .svg or .pdf); one GEMM per cell: a single "
                   "--op/--dtype/--layout/--k pins the map, other columns take the map defaults.")
@click.option("--x", "map_x", default="m", show_default=True, help="Map x axis (m, n, k, batch, nk).")
@click.option("--y", "map_y", default="auto", show_default=True,
              help="Map y axis (m, n, k, batch, nk; auto: the natural one of the data, nk for weight shapes).")
@output_options
def diff_cmd(a, b, backends, allow_env_mismatch, tolerance, show_all, op, dtype, layout, ks, map_path, map_x,
             map_y, fmt, output, top):
    """Compare the kernel choices of two datasets: which GEMMs changed kernel, how, and at what cost.

    Joins A and B on (op, dtype, layout, m, n, k, batch, backend) and lists the GEMMs whose kernel changed
    with both kernels' decoded fields and the change in time and TFLOP/s (B against A), largest first;
    the summary counts same / changed / only in A / only in B and faster / slower. Works across GPUs,
    library versions, backends and workspace settings, but refuses datasets from different environments
    (GPU, cuBLASLt, torch, driver) unless --allow-env-mismatch is given.

    \b
    Two paths of one GPU (torch's cuBLAS path vs its cuBLASLt path, 32 MiB vs 1 MiB workspace):
      cublaslt-probe diff data/h200_llm.parquet data/h200_llm.parquet --backends torch,torch-lt
    """
    from cublaslt_probe.analysis.diff import diff_files, sort_rows
    from cublaslt_probe.render.plots import diff_map
    fmt = out_format(fmt, output, FORMATS)
    check_dataset_file(a)
    check_dataset_file(b)
    if map_path:
        if suffix_format(map_path, IMAGE_FORMATS, "--map") is None:
            raise click.UsageError(f"--map {map_path}: give an image file ending in .png, .svg or .pdf")
        check_writable(map_path)
    filters = {"op": list(op), "dtype": list(dtype), "layout": list(layout), "k": list(ks)}
    r = diff_files(a, b, _backends(backends), allow_env_mismatch=allow_env_mismatch, tolerance_pct=tolerance,
                   filters=filters)
    rows = sort_rows(r.joined) if show_all else r.changed()
    total = len(rows)
    n = top if top is not None else (25 if fmt == "table" else 0)
    shown = rows.head(n) if n else rows
    emit(shown, fmt, output, lambda: diff_table(r, shown, total, show_all))
    if map_path:
        pins = {c: v[0] for c, v in (("op", op), ("dtype", dtype), ("layout", layout), ("k", ks))
                if len(v) == 1 and c not in (map_x, map_y)}
        from cublaslt_probe.render.plots import save
        fig = diff_map(r.joined, x=map_x, y=map_y, **pins)
        save(fig, map_path)
        click.echo(f"wrote map {map_path}", err=True)


COMMANDS = [trace_cmd, diff_cmd]
