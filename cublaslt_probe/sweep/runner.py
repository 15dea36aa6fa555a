"""Running a slice: GEMMs through an executor window by window, each window's raw records appended to the
slice's raw file (resumable: `--resume` skips the keys it holds), then the Parquet dataset built from it."""
from __future__ import annotations

import json
import logging
import os
import sys
import time

from cublaslt_probe.cases import Case
from cublaslt_probe.errors import ProbeError
from cublaslt_probe.sweep.parts import KeyIndex, Part, RowBuilders, raw_env, write_dataset
from cublaslt_probe.sweep.slices import Slice
from cublaslt_probe.sweep.spec import Cases, Plan
from cublaslt_probe.vocab import ENV_MATCH, WINDOW

log = logging.getLogger("cublaslt_probe.sweep")


def run_meta(plan_: Plan, sl: Slice | None = None, **extra) -> dict:
    """What a raw file's environment line records besides the environment: the sweep, its slice and the plan
    identity that `merge` checks the parts against."""
    return {"sweep": plan_.name, "shard": sl.spec if sl else None, "shard_source": sl.source if sl else None,
            "plan": plan_.identity(), **extra}


def out_base(out: str) -> str:
    """The dataset path `out` without its .parquet suffix: what the files beside it are named from."""
    return out[:-len(".parquet")] if out.endswith(".parquet") else out


def part_path(out: str, sl: Slice) -> str:
    """The dataset file of slice `sl` of the sweep writing `out`: OUT.part-0003-of-0016.parquet (raw records
    in OUT.part-0003-of-0016.raw.jsonl); a block of it (`sweep --devices`) OUT.part-0003-of-0016.block-0005-of-0064."""
    w = max(4, len(str(sl.count)))
    name = f"{out_base(out)}.part-{sl.index:0{w}d}-of-{sl.count:0{w}d}"
    if sl.block:
        w = max(4, len(str(sl.block[1])))
        name += f".block-{sl.block[0]:0{w}d}-of-{sl.block[1]:0{w}d}"
    return name + ".parquet"


# --- running ------------------------------------------------------------------------------------------------
def raw_path(out: str) -> str:
    return out_base(out) + ".raw.jsonl"


class Progress:
    """One stderr line: done/total, rate, ETA, errors. Quiet when stderr is not a terminal unless forced."""

    def __init__(self, total: int, stream=None, every_s: float = 0.5):
        self.total, self.done, self.errors = total, 0, 0
        self.t0 = time.time()
        self.stream = stream or sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.every, self.last = every_s, 0.0

    def update(self, n: int, errors: int = 0) -> None:
        self.done += n
        self.errors += errors
        now = time.time()
        if now - self.last >= self.every or self.done >= self.total:
            self.last = now
            self.stream.write(("\r" if self.tty else "") + self.line() + ("" if self.tty else "\n"))
            self.stream.flush()

    def line(self) -> str:
        el = time.time() - self.t0
        rate = self.done / el if el > 0 else 0.0
        eta = (self.total - self.done) / rate if rate > 0 else float("nan")
        pct = 100.0 * self.done / self.total if self.total else 100.0
        eta_s = "?" if eta != eta else f"{int(eta // 60)}m{int(eta % 60):02d}s"
        return (f"[{self.done:>6}/{self.total}] {pct:5.1f}%  {rate:6.1f} GEMM/s  ETA {eta_s}  "
                f"errors {self.errors}")

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")


def _read_done(path: str, keep_errors: bool = True) -> tuple[dict, set[str]]:
    """Env and done keys of an existing raw file; cuts a truncated last line (a kill mid-write)."""
    from cublaslt_probe.analysis.dataset import read_raw
    with open(path, "rb") as f:
        data = f.read()
    if data and not data.endswith(b"\n"):
        cut = data.rfind(b"\n") + 1
        log.warning("%s ends in a partial record (%d bytes): dropping it", path, len(data) - cut)
        with open(path, "r+b") as f:
            f.truncate(cut)
    env, recs = read_raw(path)
    return env, {r["key"] for r in recs if keep_errors or not r.get("error")}


FSYNC_S = 5.0


def run(cases: list[Case], out: str, executor, *, resume: bool = False, window: int = WINDOW,
        progress: bool = True, meta: dict | None = None, retry_errors: bool = False,
        builders: RowBuilders | None = None):
    """Run `cases` through `executor` (has `.env` and `.run_window(cases) -> list[dict]`), appending raw
    records to `raw_path(out)` after each window (`run_raw`), then build and write the Parquet dataset `out`
    (by `builders` when given: processes started before the executor).

    Killed part-way, the raw file holds every finished window; `resume=True` skips the keys it holds.
    Returns the DataFrame.
    """
    from cublaslt_probe.analysis import dataset
    raw = raw_path(out)
    gemms, ran_s = run_raw(cases, raw, executor, resume=resume, window=window, progress=progress, meta=meta,
                           retry_errors=retry_errors)
    t1 = time.time()
    build_dataset(raw, cases, out, builders, getattr(executor, "host_cpus", None))
    df = dataset.read_parquet(out)
    df.attrs["ran"] = {"gemms": gemms, "seconds": round(ran_s, 3), "dataset_seconds": round(time.time() - t1, 3)}
    return df


def build_dataset(raw: str, cases, out: str, builders: RowBuilders | None = None, cpus: set[int] | None = None) -> None:
    """The dataset `out` of the sweep of `cases` whose raw records are in `raw`: built by `builders` when
    given, else in this process, or for a large raw file by processes started fresh (a sweep's process holds
    a CUDA context) on `cpus` (the CPUs the probe's process had before it pinned its thread)."""
    part = Part(raw, True, raw_env(raw))
    part.scan(KeyIndex(cases.key_chunks() if isinstance(cases, Cases) else [c.key for c in cases]))
    if builders is not None:
        from concurrent.futures.process import BrokenProcessPool
        try:
            write_dataset([part], out, part.env, builders=builders)
            return
        except BrokenProcessPool as e:   # one was killed (out of memory, say): this process builds the rows
            log.warning("the processes started to build the dataset stopped (%s): building it here", e)
    write_dataset([part], out, part.env, jobs=os.cpu_count() or 1, spawn=True, cpus=cpus)


def run_raw(cases: list[Case], raw: str, executor, *, resume: bool = False, window: int = WINDOW,
            progress: bool = True, meta: dict | None = None, retry_errors: bool = False) -> tuple[int, float]:
    """Run `cases` through `executor`, appending their raw records to the file `raw` after each window (see
    `run`); (GEMMs run, seconds they took)."""
    return run_raw_parts([(cases, raw, meta)], executor, resume=resume, window=window, progress=progress,
                         retry_errors=retry_errors)


def _open_part(cases: list[Case], raw: str, executor, resume: bool, meta: dict | None, retry_errors: bool):
    """(the GEMMs of `cases` still to run, the raw file `raw` opened to append their records): a new file starts
    with the environment line; an existing one is resumed (`--resume`) when its environment and slice match."""
    todo = cases
    if os.path.exists(raw):
        if not resume:
            raise ProbeError(f"{raw} already holds a sweep's raw records: pass --resume to finish it, or "
                             "remove it to start over")
        env_old, done = _read_done(raw, keep_errors=not retry_errors)
        diff = {k: (env_old.get(k), executor.env.get(k)) for k in ENV_MATCH
                if env_old and env_old.get(k) != executor.env.get(k)}
        if diff:
            raise ProbeError(f"cannot resume {raw} in another environment: " +
                             ", ".join(f"{k} was {a!r}, now {b!r}" for k, (a, b) in diff.items()))
        was, now = (env_old.get("plan") or {}).get("digest"), ((meta or {}).get("plan") or {}).get("digest")
        if was and now and (was, env_old.get("shard")) != (now, meta.get("shard")):
            raise ProbeError(f"cannot resume {raw}: it holds slice {env_old.get('shard') or 'all'} of a plan of "
                             f"{env_old['plan']['cases']} GEMMs, this run is slice {meta.get('shard') or 'all'} of "
                             f"{meta['plan']['cases']} (the spec, --backends or the slicing changed); run it "
                             "as it was started, or write another -o")
        todo = [c for c in cases if c.key not in done]
        log.info("resume: %d of %d GEMMs already done", len(cases) - len(todo), len(cases))
        return todo, open(raw, "a", encoding="utf-8")
    os.makedirs(os.path.dirname(os.path.abspath(raw)), exist_ok=True)
    f = open(raw, "w", encoding="utf-8")
    f.write(json.dumps({"type": "env", **executor.env, **(meta or {})}) + "\n")
    f.flush()
    return todo, f


def run_raw_parts(parts, executor, *, resume: bool = False, window: int = WINDOW, progress: bool = True,
                  retry_errors: bool = False) -> tuple[int, float]:
    """Run the GEMMs of `parts` ((cases, raw file, meta) each, in turn) through `executor` in windows of
    `window` that may hold GEMMs of several parts, each record appended to its part's raw file after its
    window (see `run`); (GEMMs run, seconds they took). A `--devices` worker runs the blocks it claimed
    together so, in whole windows: a window's kernel capture has a fixed cost, whatever it holds."""
    files, todo, where = [], [], {}
    try:
        for cases, raw, meta in parts:
            left, f = _open_part(cases, raw, executor, resume, meta, retry_errors)
            files.append(f)
            todo += left
            where.update((c.key, f) for c in left)
        prog = Progress(len(todo)) if progress else None
        t0 = synced = time.time()
        for i in range(0, len(todo), max(1, window)):
            recs = executor.run_window(todo[i:i + window])
            for r in recs:
                where[r["key"]].write(json.dumps({"type": "gemm", **r}) + "\n")
            for f in files:
                f.flush()  # a killed process loses nothing written; fsync (for a crashed host) every few s
            if time.time() - synced > FSYNC_S:
                for f in files:
                    os.fsync(f.fileno())
                synced = time.time()
            if prog:
                prog.update(len(recs), sum(1 for r in recs if r.get("error")))
        if prog:
            prog.close()
    finally:
        for f in files:
            f.close()
    ran_s = time.time() - t0
    log.info("ran %d GEMMs in %.1f s", len(todo), ran_s)
    return len(todo), ran_s
