"""GPU commands that look at one GEMM: `candidates`, `first-call`, `explain`, `replay`.

Each can save what it measured (`--save FILE.json`) and render a saved file on any machine (`--from FILE.json`).
"""
from __future__ import annotations

import json

import click

from cublaslt_probe.cli._common import (
    FEW_ROWS_FORMATS,
    TEXT_JSON,
    cell,
    check_writable,
    out_format,
    output_option,
    render_table,
    suffix_format,
    wrap,
    write_frame,
    write_result,
)
from cublaslt_probe.errors import ProbeError
from cublaslt_probe.vocab import BACKENDS, DTYPES, LAYOUTS, OPS, WORKSPACE_BYTES


def gemm_options(f):
    """--m --n --k --dtype --layout --op --batch: the GEMM of every one-GEMM command (applied to `f` itself,
    no wrapper)."""
    for opt in reversed([
        click.option("--m", type=int, help="torch view: rows of A and C (tokens)  [required without --from]"),
        click.option("--n", type=int, help="torch view: columns of B and C  [required without --from]"),
        click.option("--k", type=int, help="reduction dimension  [required without --from]"),
        click.option("--dtype", default="bf16", show_default=True, type=click.Choice(DTYPES),
                     help="operand type (fp8: e4m3 inputs, bf16 output)"),
        click.option("--layout", default="NT", show_default=True, type=click.Choice(LAYOUTS),
                     help="torch view; NT = F.linear (B stored transposed)"),
        click.option("--op", default=None, type=click.Choice(OPS), help="default: scaled_mm for fp8, else mm"),
        click.option("--batch", default=1, show_default=True, help="batch count (bmm when > 1)"),
    ]):
        f = opt(f)
    return f


def make_case(backend, m, n, k, dtype, layout, op, batch):
    from cublaslt_probe.cases import Case, invalid_reason
    if None in (m, n, k):
        raise click.UsageError("give --m, --n and --k (or --from FILE.json)")
    op = op or ("scaled_mm" if dtype.startswith("fp8") else ("bmm" if batch > 1 else "mm"))
    c = Case(backend, op, dtype, layout, m, n, k, batch)
    why = invalid_reason(c)
    if why:
        raise click.UsageError(why)
    return c


# What a saved file of each command holds: (top-level JSON type, keys every entry must have); the most
# specific first (an explain file also holds candidates).
_SAVED = {"explain": (dict, ("case", "env", "record")), "candidates": (dict, ("case", "candidates")),
          "first-call": (dict, ("key", "runs")), "replay": (list, ("line", "logged", "kernel"))}


def _load(path, kind: str):
    """A file saved with `kind --save`; a one-line error naming what it holds instead."""
    from cublaslt_probe.cli._common import read_json
    obj = read_json(path, f"a file saved by `{kind} --save`")
    typ, keys = _SAVED[kind]
    entries = obj if isinstance(obj, list) else [obj]
    if not isinstance(obj, typ) or not all(isinstance(e, dict) and all(k in e for k in keys) for e in entries):
        saved_by = [k for k, (t, ks) in _SAVED.items() if isinstance(obj, t) and all(
            isinstance(e, dict) and all(x in e for x in ks) for e in entries)]
        what = f"a file saved by `{saved_by[0]} --save`" if saved_by else "not a saved evidence file"
        raise ProbeError(f"{path} is {what}, not what `{kind} --save` writes: give `{kind} --from` a file "
                         f"saved by `{kind} --save`" + (f" (or run `{saved_by[0]} --from {path}`)" if saved_by
                                                        else ""))
    if not entries:
        raise ProbeError(f"{path} holds no {kind} results: give `{kind} --from` a file saved by `{kind} --save`")
    return obj


def check_save(path: str | None) -> None:
    """A --save file is JSON: a name with another suffix is a usage error; checked before any GPU work."""
    if path:
        suffix_format(path, ("json",), "--save")
        check_writable(path)


def _save(obj, path):
    if path:
        with open(path, "w") as f:
            json.dump(obj, f, indent=1, default=str)
        click.echo(f"saved {path}", err=True)




@click.command("candidates")
@gemm_options
@click.option("--top", default=32, show_default=True, help="candidates to ask the heuristic for")
@click.option("--workspace", default=WORKSPACE_BYTES["lt"], show_default=True,
              help="max workspace bytes (torch's cuBLAS handle: 32 MiB; torch's Lt path: 1 MiB)")
@click.option("--alignment", default=16, show_default=True, help="min alignment of A/B/C/D in bytes (torch: 16)")
@click.option("--reps", default=10, show_default=True, help="timed repetitions per candidate")
@click.option("--flush-l2", is_flag=True,
              help="flush L2 before each rep (default: L2 warm, back-to-back batches behind one GPU spin)")
@click.option("-f", "--format", "fmt", default=None, type=click.Choice(FEW_ROWS_FORMATS),
              help="table: for people; csv / jsonl: one row per candidate; json: case, regret and candidates  "
                   "[default: table, or the suffix of -o]")
@output_option(FEW_ROWS_FORMATS)
@click.option("--save", type=click.Path(dir_okay=False), help="also write the raw candidates (JSON)")
@click.option("--from", "from_path", type=click.Path(dir_okay=False), help="render a saved file (no GPU)")
@click.option("--space", "space_s", type=click.FloatRange(min=0, min_open=True), is_flag=False, flag_value=2.0,
              default=None, metavar="[SECONDS]",
              help="also search the whole algo space: every valid config of every algo id, timed within SECONDS "
                   "(2 when given alone) after the types' one-time enumeration (docs/space.md)")
def candidates_cmd(m, n, k, dtype, layout, op, batch, top, workspace, alignment, reps, flush_l2, fmt, output, save,
                   from_path, space_s):
    """The heuristic's candidates for one GEMM, each run and timed; the pick and the fastest marked. With --space,
    the whole space beside them: its best config, the pick's regret against it and whether that is noise."""
    from cublaslt_probe.analysis import candidates as cm
    fmt = out_format(fmt, output, FEW_ROWS_FORMATS)
    check_save(save)
    if from_path:
        saved = _load(from_path, "candidates")
    else:
        from cublaslt_probe.gpu.alternatives import lt_candidates
        from cublaslt_probe.gpu.probe import Probe
        c = make_case("lt", m, n, k, dtype, layout, op, batch)
        probe = Probe(flush_l2=flush_l2, pipeline=False)
        rows = lt_candidates(probe, c, top=top, workspace_bytes=workspace, alignment=alignment, reps=reps)
        saved = {"case": c.as_dict(), "env": probe.env, "workspace_bytes": workspace, "alignment": alignment,
                 "timing": f"CUDA events, median of {reps} samples, " +
                           ("L2 flushed" if flush_l2 else "L2 warm (back-to-back batches behind one GPU spin)"),
                 "candidates": rows}
        if space_s:
            from cublaslt_probe.gpu import space as gspace
            saved["space"] = gspace.search(probe, c, budget_s=space_s, top=top, workspace_bytes=workspace,
                                           alignment=alignment)
        _save(saved, save)
    c = saved["case"]
    df = cm.table(saved["candidates"], m=c["m"], n=c["n"], k=c["k"], batch=c.get("batch", 1), dtype=c["dtype"])
    reg = cm.regret(saved["candidates"], c["dtype"])
    sp = saved.get("space")
    if fmt in ("csv", "jsonl"):
        write_frame(df, fmt, output)
        if output and output != "-":
            click.echo(f"wrote {output}", err=True)
    elif fmt == "json":
        extra = {"space": sp, "space_columns": space_columns(sp)} if sp else {}
        write_result(output, json.dumps({"case": c, "regret": reg, "candidates": df.to_dict(orient="records"),
                                         **extra}, default=str))
    else:
        env = saved.get("env", {})
        header = (f"{c['dtype']} {c['layout']} M={c['m']} N={c['n']} K={c['k']} on {env.get('gpu')} "
                  f"(cuBLASLt {env.get('cublaslt_version')}); workspace {saved.get('workspace_bytes')} B, alignment "
                  f"{saved.get('alignment')} B; {saved.get('timing')}")
        write_result(output, wrap(_candidates_text(df, reg, header)) + (_space_text(sp) if sp else ""))


def _candidates_text(df, reg: dict, header: str) -> str:
    """What a person reads: the header, the candidates (the shared table renderer), the regret line."""
    from cublaslt_probe.names import decode
    rows = []
    for r in df.itertuples():
        kn = decode(r.kernel) if isinstance(r.kernel, str) else None
        ok = "-" if r.matches_0 is None else ("yes" if r.matches_0 else "NO")
        rows.append([cell(r.rank), cell(r.algo_id), cell(r.tile), cell(r.stages), cell(r.cluster), cell(r.split_k),
                     f"{kn.family} {kn.short}".strip() if kn else "", cell(r.time_us, ".2f") or "-",
                     cell(r.tflops, ".1f") or "-", ok, r.mark or ""])
    table = render_table(["#", "algo", "tile", "stages", "cluster", "splitK", "kernel", "µs", "TFLOP/s", "ok", "note"],
                         rows, {"µs", "TFLOP/s"}, caps={"kernel": 44}, rule=False)
    if reg.get("regret_pct") is not None:
        tail = (f"regret = time(#0) / time(best) - 1 = {reg['pick_time_us']:.2f} / {reg['best_time_us']:.2f} - 1 "
                f"= {reg['regret_pct']:+.1f} %  (best is #{reg['best_rank']})")
        if reg.get("regret_label"):
            tail += (f"\ntrust: {reg['regret_label']} (the pick and the fastest candidates in interleaved rounds: "
                     f"noise floor {reg['noise_pct']:.1f} % from the pick against itself, the winner flips in "
                     f"{reg['flip_rate']:.0%} of the rounds)")
        elif reg.get("noise_pct") is not None:
            tail += f"\n#0 timed twice: the two medians differ by {reg['noise_pct']:.1f} % (noise)"
    else:
        tail = "regret: not computable (candidate #0 did not run)"
    return f"{header}\n\n{table}\n{tail}"


def space_columns(sp: dict) -> dict:
    from cublaslt_probe.analysis import space as sm
    return sm.columns(sp)


def _space_text(sp: dict) -> str:
    """The space section of `candidates --space`: what was enumerated, timed and pruned, the best configs, the
    regret and its trust label."""
    from cublaslt_probe.analysis import space as sm
    col = sm.columns(sp)
    cnt, sig, tr = sp.get("counts") or {}, sp.get("signature") or {}, sp.get("trust") or {}
    lines = ["", f"whole space ({sp.get('strategy')}; budget {sp.get('budget_s')} s, took {sp.get('elapsed_s')} s):",
             f"  types enumerated once: {sig.get('valid')} valid split-K-1 configs of {sig.get('checked')} checked "
             f"({sig.get('combinations')} combinations, {len(sig.get('algo_ids') or [])} algo ids), "
             f"{sig.get('distinct_kernels')} distinct kernels",
             f"  this shape: ~{cnt.get('valid')} valid configs with split-K; {cnt.get('screened')} of "
             f"{cnt.get('kernels')} kernels screened, {cnt.get('variants')} variants of the leaders; "
             f"{cnt.get('timed')} timed, {cnt.get('pruned')} pruned after one sample, {cnt.get('wrong')} wrong "
             f"answers, {cnt.get('refused')} refused by AlgoCheck on this shape"]
    rows = []
    for nm, r in (sp.get("finalists") or {}).items():
        rows.append([nm, sm.config_text(r), r.get("kernel") or "", cell((tr.get("medians") or {}).get(nm), ".2f"),
                     "yes" if r.get("numerics_ok") else "NO"])
    if rows:
        lines.append(render_table(["finalist", "config", "kernel", "µs (rounds)", "ok"], rows, {"µs (rounds)"},
                                  caps={"kernel": 48}, rule=False))
    if col["space_regret"] is not None:
        lines.append(f"space regret = pick / space best - 1 = {col['space_regret'] * 100:+.1f} % "
                     f"({tr.get('label')}: noise floor {tr.get('noise_pct'):.1f} %, winner flips in "
                     f"{tr.get('flip_rate'):.0%} of {tr.get('rounds')} interleaved rounds)")
    else:
        lines.append("space regret: not computable (the pick did not run)")
    if not col["numerics_ok"] and col["numerics_ok"] is not None:
        lines.append("the heuristic's pick computed a WRONG answer (numerics check against a float64 reference)")
    return "\n".join(lines)


@click.command("first-call")
@gemm_options
@click.option("--backend", default="torch", show_default=True,
              type=click.Choice([b for b in BACKENDS if b != "cupy"]),
              help="torch: its cuBLAS path; torch-lt: its cuBLASLt path; lt: cuBLASLt directly")
@click.option("-f", "--format", "fmt", default=None, type=click.Choice(TEXT_JSON),
              help="text: for people; json: the analysis as data  [default: text, or the suffix of -o]")
@output_option(TEXT_JSON)
@click.option("--save", type=click.Path(dir_okay=False), help="also write the raw runs (JSON)")
@click.option("--from", "from_path", type=click.Path(dir_okay=False), help="analyse a saved file (no GPU)")
def first_call_cmd(m, n, k, dtype, layout, op, batch, backend, fmt, output, save, from_path):
    """Where the first call's time goes (module loading, heuristic miss, ...) and whether anything was JIT-compiled."""
    from cublaslt_probe.gpu import firstcall
    fmt = out_format(fmt, output, TEXT_JSON)
    check_save(save)
    if from_path:
        raw = _load(from_path, "first-call")
    else:
        raw = firstcall.run(make_case(backend, m, n, k, dtype, layout, op, batch).key)
        _save(raw, save)
    a = firstcall.analyse(raw)
    write_result(output, json.dumps(a, indent=1) if fmt == "json" else wrap(firstcall.render(a)))


@click.command("explain")
@gemm_options
@click.option("--backend", default="torch", show_default=True, type=click.Choice(BACKENDS),
              help="the path the GEMM takes: torch (cuBLAS), torch-lt (cuBLASLt), cupy, lt (cuBLASLt directly)")
@click.option("--top", default=32, show_default=True, help="candidates to ask the heuristic for")
@click.option("--first-call", "with_first_call", is_flag=True, help="also run the first-call anatomy (~20 s)")
@click.option("-f", "--format", "fmt", default=None, type=click.Choice(TEXT_JSON),
              help="text: for people; json: the evidence as data  [default: text, or the suffix of -o]")
@output_option(TEXT_JSON)
@click.option("--save", type=click.Path(dir_okay=False), help="also write the evidence (JSON)")
@click.option("--from", "from_path", type=click.Path(dir_okay=False), help="render saved evidence (no GPU)")
def explain_cmd(m, n, k, dtype, layout, op, batch, backend, top, with_first_call, fmt, output, save, from_path):
    """The chain of evidence for one GEMM: log line, algo, kernel, decoded fields, waves, time, heuristic, rank."""
    from cublaslt_probe.analysis import explain
    fmt = out_format(fmt, output, TEXT_JSON)
    check_save(save)
    if from_path:
        ev = _load(from_path, "explain")
    else:
        from cublaslt_probe.gpu.explain import gather
        ev = gather(make_case(backend, m, n, k, dtype, layout, op, batch), top=top, first_call=with_first_call)
        _save(ev, save)
    write_result(output, json.dumps(ev, indent=1, default=str) if fmt == "json" else wrap(explain.render(ev)))


@click.command("replay")
@click.argument("logfile", type=click.Path(dir_okay=False))
@click.option("--line", "line_no", type=int, help="replay the trace record on this line of the log")
@click.option("--all", "all_lines", is_flag=True, help="replay every trace line")
@click.option("-f", "--format", "fmt", default=None, type=click.Choice(TEXT_JSON),
              help="text: for people; json: the analysis as data  [default: text, or the suffix of -o]")
@output_option(TEXT_JSON)
@click.option("--save", type=click.Path(dir_okay=False), help="also write the replay results (JSON)")
@click.option("--from", "from_path", is_flag=True, help="LOGFILE is a saved replay (JSON): render it (no GPU)")
def replay_cmd(logfile, line_no, all_lines, fmt, output, save, from_path):
    """Rebuild logged GEMMs, pin the logged algo, run it: which kernel, how fast, what the heuristic picks today."""
    from cublaslt_probe.gpu import replay
    fmt = out_format(fmt, output, TEXT_JSON)
    check_save(save)
    if from_path:
        results = _load(logfile, "replay")
    else:
        from cublaslt_probe.logs import load_log
        recs, stats = load_log(logfile)
        trace = [r for r in recs if r.kind == "trace"]
        if line_no is not None:
            trace = [r for r in trace if r.line == line_no]
            if not trace:
                raise ProbeError(f"{logfile}: line {line_no} is not a matmul trace line "
                                 f"(trace lines: {', '.join(str(r.line) for r in recs if r.kind == 'trace')[:200]})")
        elif not all_lines:
            raise click.UsageError("give --line N or --all")
        if not trace:
            raise ProbeError(f"{logfile} holds no matmul trace line: capture the log with CUBLASLT_LOG_LEVEL=2 set "
                             "before the program starts")
        results = replay.replay(trace)
        _save(results, save)
    write_result(output, json.dumps(results, indent=1, default=str) if fmt == "json" else wrap(replay.render(results)))


COMMANDS = [candidates_cmd, first_call_cmd, explain_cmd, replay_cmd]
