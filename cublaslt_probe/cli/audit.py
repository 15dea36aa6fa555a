"""`audit`: every GEMM of a profiled step with its layer, its roofline and, from measurements, what to change.

CPU for the rows (a run folder or a trace); ``--measure`` times the alternatives on the GPU (`measure`), and
``--from`` renders a saved measurement anywhere. docs/audit.md.
"""
from __future__ import annotations

import json
import os

import click

from cublaslt_probe.cli._common import (
    EXIT_PARTIAL,
    EXIT_USAGE,
    bound_or_usage,
    check_trace,
    clean,
    out_format,
    output_options,
    render_table,
    suffix_format,
    write_frame,
    write_text,
)
from cublaslt_probe.cli._common import FORMATS as _ROWS

FORMATS = _ROWS + ("html",)
_RIGHT = {"share", "calls", "gpu_us", "m", "n", "k", "groups", "pct_peak", "floor_ratio", "waves"}


def audit_table(a, rows, total: int, items: list | None, meas=None) -> str:
    from cublaslt_probe.render.audit import TABLE_COLUMNS, advice_lines, grouped_lines, summary_lines, table_rows
    head = "\n".join(summary_lines(a)) + "\n"
    if not len(a.rows):
        return head + "no GEMM kernels in the steps of this trace\n"
    header = [c if c != "kernel_short" else "decoded" for c in TABLE_COLUMNS]
    body = "\n" + render_table(header, table_rows(rows), _RIGHT, caps={"algo": 36, "module": 44, "decoded": 30},
                                tail={"module"})
    if total > len(rows):
        body += f"… {total - len(rows):,} more rows (--top 0 shows all)\n"
    if items is not None:
        body += "\nadvice (measured):\n" + ("\n".join(advice_lines(items)) or "none") + "\n"
        body += "".join(f"\n{x}" if i % 2 == 0 else f"\n{x}\n" for i, x in enumerate(grouped_lines(meas)))
    return head + body


class _Refused(click.ClickException):
    """A saved input that is not this run's: one line, exit 2 (a usage error)."""

    exit_code = EXIT_USAGE


def _from_measure(a, path: str, run: str):
    """The saved measurement `path` checked and bound to audit `a` (`measured.load_bound`): its notes go to the
    audit's; another run's refused in one line (exit 2)."""
    from cublaslt_probe.analysis.audit.measured import MeasureRefused, load_bound
    try:
        doc, notes = load_bound(a, path, run)
    except MeasureRefused as e:
        raise _Refused(str(e)) from None
    a.notes.extend(notes)
    return doc


def _with_proof(a, items: list[dict], path: str) -> list[dict]:
    """The advice with the proof `path` (`analysis.proof`): read and checked (bad items skipped with a note),
    bound to audit `a` (another run's refused in one line, exit 2), joined to the items."""
    from cublaslt_probe.analysis.proof import ProofRefused, apply, bind_proof, load
    proof, notes = load(path)
    try:
        notes += bind_proof(proof, a, path)
    except ProofRefused as e:
        raise _Refused(str(e)) from None
    a.notes.extend(notes + proof.notes)
    return apply(items, proof)


@click.command("audit")
@click.argument("run", type=click.Path(exists=False), metavar="RUN_DIR|TRACE")
@click.option("--log", "log_path", type=click.Path(dir_okay=False), default=None,
              help="The cuBLASLt log of the same run (a run folder's cublaslt.log is read by itself).")
@click.option("--measure", is_flag=True,
              help="On the GPU: time each GEMM's candidates, other paths and padded shapes (largest first).")
@click.option("--top-measure", type=click.IntRange(min=1), default=12, show_default=True,
              help="With --measure: how many GEMMs, largest share first (then the other GEMMs of their modules).")
@click.option("--save", "save_path", type=click.Path(dir_okay=False), default=None,
              help="With --measure: write the measurements here (JSON, with the run's fingerprint), to render "
                   "later with --from.")
@click.option("--from", "from_path", type=click.Path(dir_okay=False), default=None,
              help="Advice from saved measurements (audit --measure --save; gzip too) instead of measuring: "
                   "applied to the GEMMs this run has; another run's, GPU's or library's is refused.")
@click.option("--html", "html_path", type=click.Path(dir_okay=False), default=None,
              help="Also write a self-contained HTML report here.")
@click.option("--replay-out", "replay_path", type=click.Path(dir_okay=False), default=None,
              help="With advice: write each recommended algo as a cuBLASLt log line (the GEMM's own line, the "
                   "candidate's algo) for `cublaslt-probe replay FILE --all`.")
@click.option("--proof", "proof_path", type=click.Path(dir_okay=False), default=None,
              help="With --from/--measure: the run's proof (`prove`): each item's proven saving beside its "
                   "prediction, ranked by it.")
@click.option("--tunableop-out", "tunableop_path", type=click.Path(dir_okay=False), default=None,
              help="With advice: write TunableOp results rows (CSV) that pin each pinned candidate, for "
                   "PYTORCH_TUNABLEOP_FILENAME on torch >= 2.14 (docs/tunableop.md).")
@click.option("--coldstart", "coldstart_path", type=click.Path(dir_okay=False), default=None,
              help="A saved `cold-start --save` result of the same program: kernels it saw compiled at run time "
                   "get that provenance with evidence 'observed'.")
@click.option("--pid", type=int, default=None,
              help="Of a trace that holds several processes (merged rank traces): audit only this one.")
@click.option("--warmup", type=click.IntRange(min=0), default=None,
              help="Of a trace without step marks (steps found from its module or optimizer ranges): the first "
                   "N steps found are left out as warm-up (default: the capture's --warmup, else 1).")
@click.option("--whole-trace", is_flag=True,
              help="Count the whole trace as one step, whatever its step marks (model loading, warm-up and first "
                   "calls in it).")
@output_options(FORMATS, top=25)
def audit_cmd(run, log_path, measure, top_measure, save_path, from_path, html_path, replay_path, proof_path,
              tunableop_path, coldstart_path, pid, warmup, whole_trace, fmt, output, top):
    """Audit a program's GEMMs: one row per distinct GEMM of a step with its layer, time, roofline, waves.

    RUN_DIR is a folder written by `cublaslt_probe.capture` (trace.json.gz, cublaslt.log, env.json);
    TRACE is a torch.profiler trace (record_shapes=True) taken elsewhere, with --log for its cuBLASLt log.
    Every GEMM-kind kernel counts, whatever launched it; repeated layers are collapsed
    (model.layers.*.mlp.down_proj ×32). With --measure (GPU) or --from (saved), ranked advice follows: what
    to change, the saving in µs per step, its evidence and risk.

    \b
      cublaslt-probe audit run1/
      cublaslt-probe audit run1/ --measure --save run1/measure.json --html run1/audit.html
      cublaslt-probe audit run1/ --from run1/measure.json -o rows.jsonl
      cublaslt-probe audit run1/ --from run1/measure.json --replay-out pins.log   # then: replay pins.log --all
    """
    from cublaslt_probe.analysis.audit import advice, audit, jsonl_frame
    from cublaslt_probe.render.audit import render_html
    fmt = out_format(fmt, output, FORMATS)
    if html_path:
        suffix_format(html_path, ("html",), "--html")
    if measure and from_path:
        raise click.UsageError("give --measure (time on the GPU now) or --from (saved measurements), not both")
    if save_path and not measure:
        raise click.UsageError("--save writes what --measure measured: add --measure")
    if os.path.isfile(run):
        check_trace(run)
    cold = None
    if coldstart_path:
        from cublaslt_probe.analysis.coldstart.saved import load
        cold = load(coldstart_path)
    a = audit(run, log_path, coldstart=cold, pid=pid, warmup=warmup, whole_trace=whole_trace)
    if cold is not None:
        bound_or_usage(cold, coldstart_path, gpu=a.gpu, program=(a.env.get("capture") or {}).get("label"),
                       names=set((a.observed or {}).get("how") or {}), echo=lambda m: click.echo(m, err=True))
    meas = None
    if from_path:
        meas = _from_measure(a, from_path, run)
    elif measure:
        from cublaslt_probe.analysis.audit.measured import check_measure, stamp
        from cublaslt_probe.analysis.audit.plan import require, to_measure
        from cublaslt_probe.gpu import measure as M
        gemms, more = to_measure([{k: clean(v) for k, v in r.items()} for r in a.rows.to_dict("records")],
                                 top_measure)
        require(gemms)
        if more:
            click.echo(f"measuring {len(gemms)} GEMMs: the {len(gemms) - more} largest and {more} more of their "
                       "modules (a change to a module is predicted over all of its GEMMs)", err=True)
        tf32 = bool((a.env.get("capture") or {}).get("allow_tf32"))
        doc = stamp(M.measure_gemms(gemms, allow_tf32=tf32), a, run)   # bound to this run (--from checks it)
        if save_path:
            write_text(save_path, json.dumps(doc, indent=1, default=str) + "\n")
            click.echo(f"wrote measurements of {len(doc['gemms'])} GEMMs to {save_path}", err=True)
        meas, notes = check_measure(doc, "the measurement", a.step_gpu_us * a.steps)
        a.notes.extend(notes)
    items = None
    if meas is not None:
        if meas.graph_note():
            a.notes.append(meas.graph_note())
        from cublaslt_probe.binding import env_differences
        diffs = [] if from_path else env_differences(meas.env, {**a.env, "gpu": a.gpu or a.env.get("gpu")})
        if diffs:
            a.notes.append(f"measured with {'; '.join(diffs)}: a measurement of another GPU or library does not "
                           "hold for this run: advice is not shown")
        else:
            items = advice(a.rows, meas, a.step_gpu_us, a.step_gpu_us * a.steps)
    if proof_path:
        if items is None:
            raise click.UsageError("--proof shows a proof beside the advice: add --measure or --from")
        items = _with_proof(a, items, proof_path)
    if replay_path:
        if items is None:
            raise click.UsageError("--replay-out writes recommended algos: add --measure or --from")
        lines = [it["replay"] for it in items if it.get("replay")]
        write_text(replay_path, "".join(x + "\n" for x in lines))
        click.echo(f"wrote {len(lines)} recommended algo(s) to {replay_path}", err=True)
    if tunableop_path:
        if items is None:
            raise click.UsageError("--tunableop-out writes the pinned algos: add --measure or --from")
        from cublaslt_probe import tunableop
        t = tunableop.write(tunableop_path, items, meas.env, [g.raw for g in meas.gemms])
        tv = t.torch_version or "unknown"
        click.echo(f"wrote {len(t.rows)} TunableOp rows to {tunableop_path} (torch >= 2.14 reads them; this run's "
                   f"torch {tv} {'reads them too' if tunableop.reads_rows(tv) else 'cannot'})", err=True)
        for what, why in t.skipped:
            click.echo(f"  not written: {what}: {why}", err=True)
    if html_path:
        write_text(html_path, render_html(a, items, meas))
        click.echo(f"wrote {html_path}", err=True)
    rows = a.rows
    total = len(rows)
    n = top if top is not None else (25 if fmt == "table" else 0)
    shown = rows.head(n) if n else rows
    if fmt == "html":
        write_text(output, render_html(a, items, meas))
    elif fmt == "table":
        write_frame(shown, fmt, output, lambda: audit_table(a, shown, total, items, meas))
    else:
        write_frame(jsonl_frame(shown), fmt, output)
        if a.warning:
            click.echo(f"warning: {a.warning}", err=True)
        for line in a.notes:
            click.echo(f"note: {line}", err=True)
    if output and output != "-":
        click.echo(f"wrote {output}" if fmt == "html" else f"wrote {len(shown):,} rows to {output}", err=True)
    if a.partial:
        click.get_current_context().exit(EXIT_PARTIAL)


COMMANDS = [audit_cmd]
