"""`cold-start`: why was the first step of a program slow? (runs GPU children; `--from` renders on any machine)."""
from __future__ import annotations

import json

import click

from cublaslt_probe.analysis.coldstart.envs import ENV_SETS, REPEAT_DEFAULT
from cublaslt_probe.cli._common import TEXT_JSON, out_format, output_option, wrap, write_result


@click.command("cold-start", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--steps", default=6, show_default=True, help="steps per run; the steady state is the median of 3…N")
@click.option("--env-set", default="default", show_default=True,
              type=click.Choice(list(ENV_SETS)),
              help=f"default: {', '.join(ENV_SETS['default'])}; full adds "
                   f"{', '.join(e for e in ENV_SETS['full'] if e not in ENV_SETS['default'])}; "
                   "noautotune is added when the cold run compiled with XLA, cold_again when its step 1 read files "
                   "from storage")
@click.option("--envs", default=None, help="an explicit comma list of runs instead (e.g. cold,warm,forcejit)")
@click.option("--repeat", default=REPEAT_DEFAULT, show_default=True, type=click.IntRange(min=1),
              help="rounds of the runs: each figure the median over them, with its spread; causes no larger than "
                   "their spread are said to be within noise (1: one run per environment)")
@click.option("--no-cupti", is_flag=True, help="no CUPTI subscriber in the children (no module/driver-call evidence)")
@click.option("--timeout", default=600.0, show_default=True, help="seconds per child process")
@click.option("--label", default=None, help="a name for the program in the output")
@click.option("--format", "fmt", default=None, type=click.Choice(TEXT_JSON),
              help="text: the breakdown with its evidence; json: the analysis as one JSON object  "
                   "[default: text, or the suffix of -o]")
@output_option(TEXT_JSON)
@click.option("--save", type=click.Path(dir_okay=False), help="also write the raw runs (JSON)")
@click.option("--from", "from_path", type=click.Path(dir_okay=False), help="analyse a saved file (no GPU)")
@click.argument("script", nargs=-1, type=click.UNPROCESSED)
def cold_start_cmd(steps, env_set, envs, repeat, no_cupti, timeout, label, fmt, output, save, from_path, script):
    """Run `python SCRIPT [ARGS]` (after `--`) in fresh processes under controlled environments (fresh and
    warm ComputeCache and compile caches of torch, Triton, CuPy, Numba and JAX, LAZY/EAGER module loading,
    heuristics cache off, PTX JIT off or forced, XLA autotuning off) and split the first step's excess over the
    steady state by cause, each with its evidence.

    SCRIPT either marks its steps (`with cublaslt_probe.cold_start_step():`) or defines
    `make_step()` (returns the step) or `step()` at module level. Needs a GPU unless --from."""
    from cublaslt_probe.analysis.coldstart.breakdown import analyse
    from cublaslt_probe.analysis.coldstart.saved import load
    from cublaslt_probe.render.coldstart import render
    fmt = out_format(fmt, output, TEXT_JSON)
    if save:
        from cublaslt_probe.cli.gpu import check_save
        check_save(save)
    if from_path:
        if script:
            raise click.UsageError("give either --from FILE.json or a script after `--`, not both")
        raw = load(from_path)
    else:
        if not script:
            raise click.UsageError("no program: use `cublaslt-probe cold-start -- python SCRIPT.py [ARGS]` "
                             "(or --from FILE.json)")
        from cublaslt_probe.gpu.coldstart import run
        raw = run(list(script), steps=steps, env_set=env_set, envs=envs, cupti=not no_cupti,
                  repeat=repeat, timeout=timeout, label=label, log=lambda m: click.echo(m, err=True))
        if save:
            with open(save, "w") as f:
                json.dump(raw, f, indent=1, default=str)
            click.echo(f"saved {save}", err=True)
    a = analyse(raw)
    write_result(output, json.dumps(a, indent=1, default=str) if fmt == "json" else wrap(render(a)))
    if a.get("baseline") is None:   # no run got through its steps: the report says where each failed
        from cublaslt_probe.cli._common import EXIT_PARTIAL
        click.get_current_context().exit(EXIT_PARTIAL)


COMMANDS = [cold_start_cmd]
