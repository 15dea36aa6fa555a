"""`sweep`, `merge`, `dataset`: run a shape sweep on the GPU and turn its raw records into the dataset."""
from __future__ import annotations

import os
import resource
import subprocess
import sys

import click

from cublaslt_probe.cli._common import check_writable, out_format, output_option, suffix_format, write_result
from cublaslt_probe.errors import ProbeError
from cublaslt_probe.vocab import BACKENDS, PRESETS, TEST_BACKENDS, WINDOW


@click.command("sweep")
@click.option("--preset", type=click.Choice(PRESETS),
              help="A built-in sweep.")
@click.option("--spec", "spec_path", type=click.Path(dir_okay=False), help="A sweep spec file (.toml or .json).")
@click.option("-o", "--output", "--out", "out", required=True, type=click.Path(dir_okay=False),
              help="Dataset to write (Parquet); raw records go to OUT.raw.jsonl as the sweep runs.")
@click.option("--backends", default=None, help="Comma list to keep: torch,torch-lt,cupy,lt (default: the spec's).")
@click.option("--resume", is_flag=True, help="Finish a sweep whose raw file exists, skipping the GEMMs it holds.")
@click.option("--retry-errors", is_flag=True, help="With --resume: run again the GEMMs that ended as error rows.")
@click.option("--candidates", default=0, show_default=True,
              help="For lt-backend GEMMs: also run the heuristic's top N candidates (regret columns).")
@click.option("--shard", default=None, metavar="I/N|auto",
              help="Run only slice I of N (1-based: every N-th GEMM from the I-th), written to "
                   "OUT.part-IIII-of-NNNN.parquet; `auto` takes the slice from a Slurm job array, torchrun or a "
                   "Kubernetes Indexed Job (docs/cluster.md).")
@click.option("--shard-count", type=click.IntRange(min=1), default=None, metavar="N",
              help="With --shard auto in a Kubernetes Indexed Job: the Job's completions.")
@click.option("--devices", default=None, metavar="0,1",
              help="One worker per GPU; the workers take contiguous blocks of the plan as they finish the last, "
                   "each from its own run of them first (a slower GPU runs fewer), each a raw part, merged into OUT "
                   "(with --shard, left as parts of the whole plan).")
@click.option("--window", default=WINDOW, show_default=True,
              help="GEMMs per kernel-capture window (records are written after each window).")
@click.option("--reps", default=20, show_default=True,
              help="Most timing samples per GEMM (at least 5; under 200 µs a sample is a batch of 3-5 back-to-back "
                   "calls, docs/dataset.md 'Timing method').")
@click.option("--heuristic-reps", default=5, show_default=True,
              help="Heuristic calls timed per GEMM with the cache off, and again with it on (medians).")
@click.option("--flush-l2", is_flag=True, help="Flush L2 (zero 256 MB) before each timed repetition.")
@click.option("--dry-run", is_flag=True, help="Print the plan and stop.")
@click.option("--no-progress", is_flag=True, help="No progress line on stderr.")
@click.option("--claims", default=None, hidden=True, help="(--devices worker) the folder of slice claims.")
@click.option("--slices", type=click.IntRange(min=1), default=None, hidden=True,
              help="(--devices worker) the fine slices the plan is cut into.")
@click.option("--workers", type=click.IntRange(min=1), default=1, hidden=True,
              help="(--devices worker) how many workers share the claims.")
def sweep_cmd(preset, spec_path, out, backends, resume, retry_errors, candidates, shard, shard_count, devices,
              window, reps, heuristic_reps, flush_l2, dry_run, no_progress, claims, slices, workers):
    """Run GEMMs over shapes × dtypes × layouts × ops × backends; write one row per GEMM.

    Needs an NVIDIA GPU (torch; cupy for the cupy backend).
    """
    from cublaslt_probe import sweep
    suffix_format(out, ("parquet",))
    if bool(preset) == bool(spec_path):
        raise click.UsageError("give exactly one of --preset NAME or --spec FILE")
    bes = backends.split(",") if backends else None
    unknown = [b for b in bes or () if b not in BACKENDS + TEST_BACKENDS]
    if unknown:
        raise click.UsageError(f"--backends {backends}: unknown backend {', '.join(unknown)}; choose from "
                               f"{', '.join(BACKENDS + TEST_BACKENDS)}")
    plan = sweep.plan(preset, spec_path, bes)
    if shard == "auto":
        sl = sweep.shard_from_env(os.environ, shard_count)
    elif shard_count:
        raise click.UsageError("--shard-count goes with --shard auto (in a Kubernetes Indexed Job)")
    else:
        try:
            sl = sweep.parse_shard(shard) if shard else None
        except ProbeError as e:   # a --shard the syntax does not allow
            raise click.UsageError(str(e)) from e
    cases = sl.take(plan.cases) if sl else plan.cases
    click.echo(plan.summary() + (f"\n  slice {sl.spec} ({sl.source}): {len(cases)} GEMMs" if sl else ""), err=True)
    if dry_run:
        return
    if not cases:
        raise ProbeError("the plan is empty: nothing to run (check --backends and the spec)")
    if devices:
        if sl and sl.local_rank is not None:
            raise ProbeError("--devices with a launcher that starts one process per GPU (LOCAL_RANK is set): "
                             "drop --devices, each process takes the GPU of its local rank")
        args = (["--preset", preset] if preset else ["--spec", spec_path]) + [
            "--window", str(window), "--reps", str(reps), "--heuristic-reps", str(heuristic_reps),
            "--candidates", str(candidates)]
        args += (["--backends", backends] if backends else []) + (["--resume"] if resume else []) + \
            (["--retry-errors"] if retry_errors else []) + (["--flush-l2"] if flush_l2 else [])
        return _multi_device(devices, out, args, sl, len(cases), window)
    if sl and sl.local_rank is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = sweep.local_rank_device(sl.local_rank)
        click.echo(f"  LOCAL_RANK={sl.local_rank}: CUDA_VISIBLE_DEVICES={os.environ['CUDA_VISIBLE_DEVICES']}", err=True)
    target = sweep.part_path(out, sl) if sl else out
    builders = None
    if all(c.backend == "numpy" for c in cases):
        executor = sweep.NumpyExecutor()
    else:
        from cublaslt_probe.gpu.host import require_gpu
        from cublaslt_probe.gpu.probe import Probe
        require_gpu("sweep")
        if not claims:   # started first: they get ready while the probe starts, on every CPU
            builders = sweep.RowBuilders()
        try:
            executor = Probe(reps=reps, flush_l2=flush_l2, candidates=candidates, heuristic_reps=heuristic_reps,
                             cpu_slot=sweep.cpu_slot(), plan=len(cases))
        except BaseException:
            if builders is not None:
                builders.close()
            raise
    if claims:
        return _worker(plan, sl or sweep.WHOLE, slices or 1, claims, workers, out, executor, resume, window,
                       candidates=candidates, flush_l2=flush_l2)
    meta = sweep.run_meta(plan, sl, candidates=candidates, flush_l2=flush_l2)
    try:
        df = sweep.run(cases, target, executor, resume=resume, window=window, progress=not no_progress, meta=meta,
                       retry_errors=retry_errors, builders=builders)
    finally:
        if hasattr(executor, "close"):
            executor.close()
        if builders is not None:
            builders.close()
    n_err = int(df["error"].notna().sum())
    ran = df.attrs.get("ran") or {}
    if ran.get("seconds"):
        startup = getattr(executor, "startup", None)
        click.echo(ran_line(ran["gemms"], ran["seconds"], ran["dataset_seconds"],
                            startup.on_first_use() if startup is not None else {}), err=True)
    click.echo(f"wrote {target}: {len(df)} rows ({n_err} error rows); raw records in {sweep.raw_path(target)}",
               err=True)


def ran_line(gemms: int, seconds: float, dataset_seconds: float, first_use: dict[str, float]) -> str:
    """The sweep's closing line: GEMMs, seconds and rate; when the probe paid set-ups on first use inside the
    run (a plan too small for the helpers pays its CUPTI start, pools and calibrations there), how long they
    took, the largest named, and the rate without them, so that a small sweep's rate reads as the GEMMs' own."""
    line = f"ran {gemms} GEMMs in {seconds:.2f} s ({gemms / seconds:.1f} GEMMs/s)"
    paid = sum(first_use.values())
    if paid >= 0.05 * seconds and seconds - paid > 0:
        big = sorted(first_use.items(), key=lambda kv: -kv[1])[:2]
        named = ", ".join(f"{name.split(' (')[0]} {s:.2f} s" for name, s in big)
        line += (f", {paid:.2f} s of it set-ups paid on first use ({named}): "
                 f"{gemms / (seconds - paid):.1f} GEMMs/s without them")
    return line + f", then built the dataset in {dataset_seconds:.2f} s"


def _multi_device(devices: str, out: str, args: list[str], sl=None, gemms: int = 0, window: int = WINDOW):
    """One worker process per device (CUDA_VISIBLE_DEVICES). The plan (slice `sl` of it when given) is cut into
    contiguous blocks (`sweep.fine_slices`: a quarter window each), and each worker takes the next blocks
    left in its order when it finishes those it took (`sweep.claim_order`: its own run of blocks, then the
    others' from their ends), a window's worth at a time and fewer near the end (`sweep.claimed_groups`), so a
    slower GPU or host core runs fewer and the workers end within about a block of each other; they start
    together once every probe is up (`sweep.wait_for_workers`). Each block is a raw part file; they are merged
    into OUT (with --shard, left as parts of the whole plan for `merge`)."""
    import shutil

    from cublaslt_probe import sweep
    devs = [d.strip() for d in devices.split(",") if d.strip()]
    whole = sl or sweep.WHOLE
    count = sweep.fine_slices(gemms, len(devs), window)
    claims = sweep.out_base(out) + ".claims"
    parts = [sweep.raw_path(sweep.part_path(out, whole.cut(j, count))) for j in range(1, count + 1)]
    held = [p for p in parts if os.path.exists(p)]
    if held and "--resume" not in args:
        raise ProbeError(f"{held[0]} (and {len(held) - 1} more of the {count} parts) already holds raw records: "
                         "pass --resume to finish the sweep, or remove them to start over")
    shutil.rmtree(claims, ignore_errors=True)   # a killed run's claims: its parts resume with --resume
    os.makedirs(claims)
    procs = []
    for j, d in enumerate(devs, 1):
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=d, CUBLASLT_PROBE_SLOT=str(j - 1))
        cmd = [sys.executable, "-m", "cublaslt_probe", "sweep"] + args + ["-o", out, "--no-progress", "--claims",
                                                                          claims, "--slices", str(count),
                                                                          "--workers", str(len(devs))]
        cmd += ["--shard", whole.spec] if sl else []
        procs.append(subprocess.Popen(cmd, env=env))
    codes = [p.wait() for p in procs]
    if any(codes):
        raise ProbeError(f"device workers exited with {codes}; finish with --resume (the parts are {parts[0]} "
                         f"and the other {count - 1} of {count})")
    shutil.rmtree(claims, ignore_errors=True)
    if sl:
        click.echo(f"wrote {count} raw parts of slice {sl.spec} ({parts[0]} ...); `merge` joins them with the "
                   "other slices", err=True)
        return
    m = sweep.merge(parts, out)
    click.echo(f"merged {count} raw parts from {len(devs)} devices into {out}: {m.rows} rows", err=True)


def _worker(plan, base, count: int, claims: str, workers: int, out: str, executor, resume: bool, window: int,
            **meta):
    """A `--devices` worker: wait for the others, then take fine slices until none is left."""
    from cublaslt_probe import sweep
    me = os.environ.get("CUBLASLT_PROBE_SLOT", str(os.getpid()))
    try:
        waited = sweep.wait_for_workers(claims, workers, me)
        used = resource.getrusage(resource.RUSAGE_THREAD)
        gemms, seconds, taken = sweep.run_claimed(plan, base, count, claims, out, executor, resume=resume,
                                                  window=window, workers=workers, me=sweep.cpu_slot() % workers,
                                                  worker=me, **meta)
        now = resource.getrusage(resource.RUSAGE_THREAD)
    finally:
        if hasattr(executor, "close"):
            executor.close()
    rate = f" ({gemms / seconds:.1f} GEMMs/s)" if seconds else ""
    cpu_s = now.ru_utime + now.ru_stime - used.ru_utime - used.ru_stime
    click.echo(f"worker {me}: ran {gemms} GEMMs in {seconds:.2f} s{rate}, {taken} of {count} slices, after "
               f"waiting {waited:.2f} s for the other workers; its thread ran {cpu_s:.2f} s on the CPU and was "
               f"preempted {now.ru_nivcsw - used.ru_nivcsw} times", err=True)


@click.command("merge")
@click.argument("parts", nargs=-1, required=True)
@click.option("-o", "--output", "--out", "out", required=True, type=click.Path(dir_okay=False),
              help="Merged dataset to write (Parquet).")
@click.option("--allow-env-mismatch", is_flag=True, help="Merge datasets from different GPUs or libraries.")
@click.option("--jobs", type=click.IntRange(min=1), default=None,
              help="Processes turning raw parts into rows (default: one per core).")
def merge_cmd(parts, out, allow_env_mismatch, jobs):
    """Join the parts of a sweep into one dataset: raw files or datasets, a folder of them, or a glob.

    Checks first that they come from one environment and one plan and hold each of its GEMMs exactly once,
    naming the slices that are missing and the GEMMs held twice. Streams: memory does not grow with the rows.
    Exit status 3 when a gzip part is cut off or damaged after the records it holds (the dataset is written).
    """
    from cublaslt_probe import sweep
    from cublaslt_probe.cli._common import check_dataset_file
    suffix_format(out, ("parquet",))
    check_writable(out)
    for p in parts:
        check_dataset_file(p, raw_ok=True)
    m = sweep.merge(list(parts), out, allow_env_mismatch, jobs)
    for path, why in m.cuts:
        click.echo(f"warning: {path}: the gzip stream ends early ({why}) after the records merged; copy the "
                   "part again from where the sweep wrote it", err=True)
    click.echo(f"wrote {out}: {m.rows} rows from {m.parts} parts"
               + (f" (plan {m.plan!r}, each GEMM once)" if m.plan else ""), err=True)
    if m.cuts:
        from cublaslt_probe.cli._common import EXIT_PARTIAL
        click.get_current_context().exit(EXIT_PARTIAL)


@click.command("dataset")
@click.argument("raw", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("-o", "--output", "--out", "out", required=True, type=click.Path(dir_okay=False),
              help="Dataset to write (Parquet).")
@click.option("--env", "env_path", type=click.Path(dir_okay=False), help="env.json for raw files without an env line.")
@click.option("--allow-env-mismatch", is_flag=True,
              help="Build one dataset from raw files of different GPUs or libraries (refused by default); "
                   "every row keeps the environment of its own file.")
def dataset_cmd(raw, out, env_path, allow_env_mismatch):
    """Build the tidy Parquet dataset from raw probe records (JSONL, gzip or not).

    Every row carries the environment of the file it came from. Streams: memory holds the keys and a
    batch of rows, not the dataset. Exit status 3 when some lines were not
    probe records or a file was cut off (the records before are kept), 1 when no record was found.
    """
    from cublaslt_probe.analysis import dataset
    from cublaslt_probe.cli._common import EXIT_PARTIAL, read_json, sniff
    suffix_format(out, ("parquet",))
    check_writable(out)
    for p in raw:
        if not os.path.exists(p):
            raise ProbeError(f"raw file {p} does not exist")
    env_override = read_json(env_path, "an env.json (an object of gpu, driver, ...)") if env_path else None
    if env_override is not None and not isinstance(env_override, dict):
        raise ProbeError(f"{env_path} holds a JSON {type(env_override).__name__}: give an env.json (an object "
                         "of gpu, driver, ...)")
    st = dataset.RawStats()
    env, rows, counts = dataset.write_from_raw(list(raw), out, env_override, allow_env_mismatch, st)
    if not rows:
        kinds = "; ".join(f"{p} is {sniff(p)}" for p in raw)
        raise ProbeError(f"no raw probe records in {', '.join(raw)} ({kinds}): give the OUT.raw.jsonl(.gz) "
                         "files a sweep writes (a dataset .parquet is already built: use it directly)")
    for line in [f"{p}: {why}" for p, why in st.cut] + st.examples:
        click.echo(f"warning: {line}", err=True)
    if st.unreadable > len(st.examples):
        click.echo(f"warning: ... and {st.unreadable - len(st.examples):,} more lines that are not probe records",
                   err=True)
    if st.duplicates:
        click.echo(f"note: {st.duplicates:,} records repeated a key (a resumed or overlapping sweep): the later "
                   "record of each was kept", err=True)
    click.echo(f"wrote {out}: {rows} rows, {counts['error']} error rows, {counts['consistent']} consistent / "
               f"{counts['comparable']} comparable", err=True)
    if not st.complete:
        click.get_current_context().exit(EXIT_PARTIAL)


_SCHEMA_FORMATS = ("markdown", "json")


@click.command("schema")
@click.option("-f", "--format", "fmt", type=click.Choice(_SCHEMA_FORMATS), default=None,
              help="markdown: a table of column, type, meaning; json: the same as data  [default: markdown, or "
                   "the suffix of -o]")
@output_option(_SCHEMA_FORMATS)
def schema_cmd(fmt, output):
    """Print the dataset schema (Markdown table)."""
    import json

    from cublaslt_probe.analysis import dataset
    fmt = out_format(fmt, output, _SCHEMA_FORMATS)
    write_result(output, dataset.schema_markdown() if fmt == "markdown" else json.dumps(
        [{"column": c, "type": t, "meaning": m} for c, (t, m) in dataset.SCHEMA.items()], indent=1))


COMMANDS = [sweep_cmd, merge_cmd, dataset_cmd, schema_cmd]
