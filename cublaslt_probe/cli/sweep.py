"""`sweep`, `merge`, `dataset`: run a shape sweep on the GPU and turn its raw records into the dataset."""
from __future__ import annotations

import os
import subprocess
import sys

import click

from cublaslt_probe.errors import ProbeError


@click.command("sweep")
@click.option("--preset", type=click.Choice(["quick", "llm", "square", "decode", "grid", "regret"]),
              help="A built-in sweep.")
@click.option("--spec", "spec_path", type=click.Path(dir_okay=False), help="A sweep spec file (.toml or .json).")
@click.option("-o", "--out", required=True, type=click.Path(dir_okay=False),
              help="Dataset to write (Parquet); raw records go to OUT.raw.jsonl as the sweep runs.")
@click.option("--backends", default=None, help="Comma list to keep: torch,torch-lt,cupy,lt (default: the spec's).")
@click.option("--resume", is_flag=True, help="Finish a sweep whose raw file exists, skipping the GEMMs it holds.")
@click.option("--retry-errors", is_flag=True, help="With --resume: run again the GEMMs that ended as error rows.")
@click.option("--candidates", default=0, show_default=True,
              help="For lt-backend GEMMs: also run the heuristic's top N candidates (regret columns).")
@click.option("--shard", default=None, metavar="I/N", help="Run only the I-th of N deterministic slices (1-based).")
@click.option("--devices", default=None, metavar="0,1", help="One worker per GPU, each a shard; parts are merged.")
@click.option("--window", default=32, show_default=True,
              help="GEMMs per profiler window (records are written after each window).")
@click.option("--reps", default=20, show_default=True,
              help="Most timing samples per GEMM (at least 5; under 200 µs a sample is a batch of 3-5 back-to-back "
                   "calls, docs/dataset.md 'Timing method').")
@click.option("--heuristic-reps", default=5, show_default=True,
              help="Heuristic calls timed per GEMM with the cache off, and again with it on (medians).")
@click.option("--flush-l2", is_flag=True, help="Flush L2 (zero 256 MB) before each timed repetition.")
@click.option("--dry-run", is_flag=True, help="Print the plan and stop.")
@click.option("--no-progress", is_flag=True, help="No progress line on stderr.")
def sweep_cmd(preset, spec_path, out, backends, resume, retry_errors, candidates, shard, devices, window, reps,
              heuristic_reps, flush_l2, dry_run, no_progress):
    """Run GEMMs over shapes × dtypes × layouts × ops × backends; write one row per GEMM.

    Needs an NVIDIA GPU (torch; cupy for the cupy backend).
    """
    from cublaslt_probe import sweep
    bes = backends.split(",") if backends else None
    plan = sweep.plan(preset, spec_path, bes)
    cases = sweep.shard(plan.cases, shard)
    click.echo(plan.summary() + (f"\n  shard {shard}: {len(cases)} GEMMs" if shard else ""), err=True)
    if dry_run:
        return
    if not cases:
        raise ProbeError("the plan is empty: nothing to run (check --backends and the spec)")
    if devices:
        args = (["--preset", preset] if preset else ["--spec", spec_path]) + [
            "--window", str(window), "--reps", str(reps), "--heuristic-reps", str(heuristic_reps),
            "--candidates", str(candidates)]
        args += (["--backends", backends] if backends else []) + (["--resume"] if resume else []) + \
            (["--retry-errors"] if retry_errors else []) + (["--flush-l2"] if flush_l2 else [])
        return _multi_device(devices, out, args)
    if all(c.backend == "numpy" for c in cases):
        executor = sweep.NumpyExecutor()
    else:
        from cublaslt_probe.probe import Probe
        executor = Probe(reps=reps, flush_l2=flush_l2, candidates=candidates, heuristic_reps=heuristic_reps)
    df = sweep.run(cases, out, executor, resume=resume, window=window, progress=not no_progress,
                   meta={"sweep": plan.name, "shard": shard, "candidates": candidates, "flush_l2": flush_l2},
                   retry_errors=retry_errors)
    n_err = int(df["error"].notna().sum())
    click.echo(f"wrote {out}: {len(df)} rows ({n_err} error rows); raw records in {sweep.raw_path(out)}", err=True)


def _multi_device(devices: str, out: str, args: list[str]):
    """One worker process per device (CUDA_VISIBLE_DEVICES), each running shard i/N of the same plan."""
    from cublaslt_probe import sweep
    devs = [d.strip() for d in devices.split(",") if d.strip()]
    base = out[:-len(".parquet")] if out.endswith(".parquet") else out
    procs, parts = [], []
    for i, d in enumerate(devs, 1):
        part = f"{base}.part{i}of{len(devs)}.parquet"
        parts.append(part)
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=d)
        cmd = [sys.executable, "-m", "cublaslt_probe", "sweep"] + args + ["--shard", f"{i}/{len(devs)}", "-o", part,
                                                                          "--no-progress"]
        procs.append(subprocess.Popen(cmd, env=env))
    codes = [p.wait() for p in procs]
    if any(codes):
        raise ProbeError(f"device workers exited with {codes}; finish with --resume (parts: {', '.join(parts)})")
    df = sweep.merge(parts, out)
    click.echo(f"merged {len(parts)} device shards into {out}: {len(df)} rows", err=True)


@click.command("merge")
@click.argument("parts", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("-o", "--out", required=True, type=click.Path(dir_okay=False))
@click.option("--allow-env-mismatch", is_flag=True, help="Merge datasets from different GPUs or libraries.")
def merge_cmd(parts, out, allow_env_mismatch):
    """Join the datasets of a sharded sweep into one (duplicates: the later part wins)."""
    from cublaslt_probe import sweep
    df = sweep.merge(list(parts), out, allow_env_mismatch)
    click.echo(f"wrote {out}: {len(df)} rows from {len(parts)} parts", err=True)


@click.command("dataset")
@click.argument("raw", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("-o", "--out", required=True, type=click.Path(dir_okay=False))
@click.option("--env", "env_path", type=click.Path(dir_okay=False), help="env.json for raw files without an env line.")
def dataset_cmd(raw, out, env_path):
    """Build the tidy Parquet dataset from raw probe records (JSONL)."""
    import json

    from cublaslt_probe import dataset
    env, recs = {}, []
    for p in raw:
        if not os.path.exists(p):
            raise ProbeError(f"raw file {p} does not exist")
        e, r = dataset.read_raw(p)
        env = env or e
        recs += r
    if env_path:
        with open(env_path) as f:
            env = json.load(f)
    df = dataset.build(recs, env)
    dataset.write_parquet(df, out, env)
    click.echo(f"wrote {out}: {len(df)} rows, {int(df['error'].notna().sum())} error rows, "
               f"{int(df['consistent'].eq(True).sum())} consistent / {int(df['consistent'].notna().sum())} comparable",
               err=True)


@click.command("schema")
def schema_cmd():
    """Print the dataset schema (Markdown table)."""
    from cublaslt_probe import dataset
    click.echo(dataset.schema_markdown())


COMMANDS = [sweep_cmd, merge_cmd, dataset_cmd, schema_cmd]
