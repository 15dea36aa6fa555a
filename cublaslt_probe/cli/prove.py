"""`prove`: a run's advice applied to the program that made it, each item timed in the program's own step."""
from __future__ import annotations

import os

import click

from cublaslt_probe.cli._common import suffix_format


@click.command("prove", context_settings={"ignore_unknown_options": True})
@click.argument("run", type=click.Path(exists=True, file_okay=False))
@click.option("--from", "from_path", required=True, type=click.Path(dir_okay=False),
              help="the run's saved measurement (audit RUN --measure --save FILE)")
@click.option("-o", "--output", default=None, type=click.Path(dir_okay=False),
              help="the proof to write (.json) [default: RUN/proof.json]")
@click.option("--rounds", type=click.IntRange(min=3), default=None, help="alternating rounds per item [default: 9]")
@click.argument("script", nargs=-1, type=click.UNPROCESSED, required=True)
def prove_cmd(run, from_path, output, rounds, script):
    """Prove RUN's advice in SCRIPT (after `--`, with its own arguments): the script is loaded (not run as __main__)
    and must define, at its top level, `model` (the nn.Module the run captured), `step()` (one step of the
    program) and, for a training step, `optimizer`. Each advice item is applied to the live model, the step
    timed in alternating rounds against the original (noise floor from original against original), and the
    program restored; the proof is written beside the run and `audit RUN --from M --proof FILE` shows predicted
    against proven. A cuBLASLt workspace, which torch reads before its first handle, is proven in fresh processes
    of SCRIPT instead: the script started again with and without the setting, in alternating rounds. Needs a GPU.
    docs/prove.md."""
    import runpy
    import sys
    suffix_format(output, ("json",))
    path = script[0]
    if not os.path.isfile(path):
        raise click.UsageError(f"{path}: no such script; give a Python file that defines model and step()")
    old = sys.argv
    sys.argv = list(script)
    try:
        ns = runpy.run_path(path, run_name="__cublaslt_probe_prove__")
    finally:
        sys.argv = old
    model, step = ns.get("model"), ns.get("step")
    if model is None or not callable(step):
        raise click.UsageError(f"{path}: defines no `model` and `step()` at its top level (prove needs both; "
                               "keep the training loop under `if __name__ == '__main__':`)")
    from cublaslt_probe.gpu.prove import ROUNDS, prove_run
    proof = prove_run(run, step, model, from_path, optimizer=ns.get("optimizer"), out=output,
                      rounds=rounds or ROUNDS, progress=lambda s: click.echo(s, err=True), script=list(script))
    for note in proof.get("notes") or []:
        click.echo(f"note: {note}", err=True)
    click.echo(f"wrote {proof['path']}: show it with `cublaslt-probe audit {run} --from {from_path} "
               f"--proof {proof['path']}`", err=True)


COMMANDS = [prove_cmd]
