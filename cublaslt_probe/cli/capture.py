"""`capture`: run a user's Python script with a capture around it (trace, cuBLASLt log, environment)."""
from __future__ import annotations

import click


@click.command("capture", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("-o", "--output", "--out", "output", required=True, type=click.Path(file_okay=False),
              help="run folder to write (trace.json.gz, cublaslt.log, env.json); `audit` reads it")
@click.option("--label", default=None, help="a name for the run, kept in env.json (default: the script's name)")
@click.option("--warmup", type=click.IntRange(min=0), default=1, show_default=True,
              help="steps left out first as warm-up (first calls: plans, heuristics, allocator growth)")
@click.option("--whole-script", is_flag=True,
              help="the whole run is one step (model loading and first calls included) instead of finding steps")
@click.argument("script", nargs=-1, type=click.UNPROCESSED, required=True)
def capture_cmd(output, label, warmup, whole_script, script):
    """Run SCRIPT [ARGS] (after `--`) in this process with a profiler trace (shapes recorded), the cuBLASLt
    level-2 log and the environment captured into a run folder. The script is not edited: each optimizer
    step, else each call of its outermost module's forward, is a step; the first --warmup N are left out, and
    `audit` says where the rest of the GPU time went (loading, weight copies, first calls). Modules are named
    by class and first-seen order; for qualified layer names, use the Python API
    `cublaslt_probe.capture(dir, model=model)`. Needs a GPU."""
    from cublaslt_probe.gpu.recorder import run_script
    run_script(output, list(script), label=label, warmup=warmup, whole_script=whole_script)
    click.echo(f"wrote {output}/: audit it with `cublaslt-probe audit {output}`", err=True)


COMMANDS = [capture_cmd]
