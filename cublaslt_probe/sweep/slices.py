"""Which part of the plan this process runs (`Slice`): from `--shard I/N`, or from the scheduler's
variables (Slurm, torchrun, Kubernetes indexed jobs), and which GPU and CPUs a launcher gave it."""
from __future__ import annotations

import os
from dataclasses import dataclass

from cublaslt_probe.errors import SpecError


# --- slices: which part of the plan this process runs -------------------------------------------------------
@dataclass(frozen=True)
class Slice:
    """Slice `index` of `count` (1-based): every count-th GEMM of the plan from the index-th. `source` says
    where it came from; `local_rank` is the GPU a launcher gave this process (torchrun's LOCAL_RANK).

    With `block` = (j, parts), only the j-th of `parts` contiguous runs of those GEMMs: how `sweep --devices`
    cuts its slice, so that each worker meets neighbouring GEMMs, which share kernels (each process loads the
    module of every kernel it meets)."""

    index: int
    count: int
    source: str = "--shard"
    local_rank: int | None = None
    block: tuple[int, int] | None = None

    @property
    def spec(self) -> str:
        """`I/N`, or `I/N:J/P` for block J of P of slice I/N (what a raw file's environment line records)."""
        s = f"{self.index}/{self.count}"
        return f"{s}:{self.block[0]}/{self.block[1]}" if self.block else s

    def take(self, cases):
        sel = cases[self.index - 1::self.count]
        if self.block:
            j, parts = self.block
            sel = sel[(j - 1) * len(sel) // parts:j * len(sel) // parts]
        return sel

    def split(self, j: int, parts: int) -> "Slice":
        """Part j (1-based) of this slice cut `parts` ways, as a slice of the whole plan: the j-th of every
        `parts` GEMMs of slice i/n is GEMM i + (j-1)·n of every n·parts."""
        return Slice(self.index + (j - 1) * self.count, self.count * parts, f"{self.source}, part {j}/{parts}",
                     self.local_rank)

    def cut(self, j: int, parts: int) -> "Slice":
        """Block j (1-based) of this slice cut into `parts` contiguous runs of its GEMMs."""
        return Slice(self.index, self.count, f"{self.source}, block {j}/{parts}", self.local_rank, (j, parts))

    @property
    def family(self) -> tuple[int, int]:
        """(count, blocks per slice): the slices of one family cover a plan exactly once between them."""
        return self.count, self.block[1] if self.block else 1

    @property
    def member(self) -> int:
        """0-based number of this slice within its family (`members` numbers the GEMMs alike)."""
        return (self.index - 1) * self.family[1] + (self.block[0] - 1 if self.block else 0)

    def members(self, g, n: int):
        """The family member (0-based, as `member`) that holds each plan position of `g` (numpy), in a plan of
        `n` GEMMs."""
        import numpy as np
        g = np.asarray(g, dtype=np.int64)
        count, parts = self.family
        i0 = g % count
        if parts == 1:
            return i0
        k, length = g // count, (n - 1 - i0) // count + 1       # position within slice i0+1, its length
        # block j (0-based) starts at j·L // P: the last start at or before k
        return i0 * parts + np.minimum(((k + 1) * parts + length - 1) // length - 1, parts - 1)

    def describe(self) -> str:
        return f"block {self.block[0]}/{self.block[1]} of slice {self.index}/{self.count}" if self.block \
            else f"slice {self.spec}"


WHOLE = Slice(1, 1, "whole plan")


def parse_shard(spec: str, source: str = "--shard", blocks: bool = False) -> Slice:
    """`I/N` (1-based); with `blocks`, also `I/N:J/P` (block J of P of slice I/N, as a raw file records it)."""
    head, _, tail = spec.partition(":") if blocks else (spec, "", "")
    why = (f"{source} {spec!r}: expected I/N or I/N:J/P with 1 <= I <= N and 1 <= J <= P (a sweep writes one of "
           "these; the file was edited: run its slice again)" if blocks else
           f"{source} {spec!r}: expected I/N with 1 <= I <= N, e.g. 1/4, or auto")
    try:
        i, n = (int(x) for x in head.split("/"))
        j, p = (int(x) for x in tail.split("/")) if tail else (1, 1)
    except ValueError as e:
        raise SpecError(why) from e
    if not 1 <= i <= n or not 1 <= j <= p:
        raise SpecError(why)
    return Slice(i, n, source, block=(j, p) if tail else None)


def shard(cases, spec: str | None):
    """`I/N` (1-based): every N-th case starting at the I-th, deterministic for a given plan."""
    return parse_shard(spec).take(cases) if spec else cases


SCHEDULER_VARS = "SLURM_ARRAY_TASK_ID (Slurm job array), RANK and WORLD_SIZE (torchrun), JOB_COMPLETION_INDEX " \
                 "(Kubernetes Indexed Job)"


def _env_int(environ, name: str, who: str) -> int:
    v = environ.get(name)
    if v is None or not v.strip().lstrip("-").isdigit():
        raise SpecError(f"--shard auto: {who} but {name}={v!r} is not an integer")
    return int(v)


def shard_from_env(environ=None, shard_count: int | None = None) -> Slice:
    """The slice a scheduler gave this process, read from its environment (`--shard auto`).

    - Slurm job array: SLURM_ARRAY_TASK_ID within SLURM_ARRAY_TASK_MIN..MAX, a contiguous array (step 1,
      SLURM_ARRAY_TASK_COUNT = MAX - MIN + 1): slice ID - MIN + 1 of COUNT.
    - Kubernetes Indexed Job: JOB_COMPLETION_INDEX (0-based) of `shard_count` (the Job's completions, which the
      pod's environment does not hold).
    - torchrun / torch.distributed: RANK of WORLD_SIZE; LOCAL_RANK is the GPU of this process on its host.
    A launcher inside an array task (torchrun in each Slurm task or Indexed Job pod) slices the task's slice.
    """
    environ = os.environ if environ is None else environ
    outer = None
    if "SLURM_ARRAY_TASK_ID" in environ:
        who = "a Slurm job array (SLURM_ARRAY_TASK_ID is set)"
        tid = _env_int(environ, "SLURM_ARRAY_TASK_ID", who)
        lo = _env_int(environ, "SLURM_ARRAY_TASK_MIN", who)
        hi = _env_int(environ, "SLURM_ARRAY_TASK_MAX", who)
        if not lo <= tid <= hi:
            raise SpecError(f"--shard auto: SLURM_ARRAY_TASK_ID={tid} is outside SLURM_ARRAY_TASK_MIN..MAX = "
                            f"{lo}..{hi}")
        step = environ.get("SLURM_ARRAY_TASK_STEP")
        if step is not None and _env_int(environ, "SLURM_ARRAY_TASK_STEP", who) != 1:
            raise SpecError(f"--shard auto: the Slurm array steps by {step} (SLURM_ARRAY_TASK_STEP): every task "
                            f"id from {lo} to {hi} must run; submit a contiguous array, e.g. --array={lo}-{hi}")
        if "SLURM_ARRAY_TASK_COUNT" in environ:
            count = _env_int(environ, "SLURM_ARRAY_TASK_COUNT", who)
            if count != hi - lo + 1:
                raise SpecError(f"--shard auto: the Slurm array is not contiguous (SLURM_ARRAY_TASK_COUNT={count} "
                                f"tasks, ids {lo}..{hi}): submit a contiguous array, e.g. --array=0-{count - 1}")
        outer = Slice(tid - lo + 1, hi - lo + 1, f"SLURM_ARRAY_TASK_ID={tid} of array {lo}-{hi}")
    if "JOB_COMPLETION_INDEX" in environ:
        if outer is not None:
            raise SpecError("--shard auto: both a Slurm array (SLURM_ARRAY_TASK_ID) and a Kubernetes Indexed Job "
                            "(JOB_COMPLETION_INDEX) are in the environment; give --shard I/N")
        idx = _env_int(environ, "JOB_COMPLETION_INDEX", "a Kubernetes Indexed Job (JOB_COMPLETION_INDEX is set)")
        if not shard_count:
            raise SpecError(f"--shard auto: JOB_COMPLETION_INDEX={idx} (a Kubernetes Indexed Job) needs the Job's "
                            "completion count: pass --shard-count N (N = spec.completions)")
        if not 0 <= idx < shard_count:
            raise SpecError(f"--shard auto: JOB_COMPLETION_INDEX={idx} is outside 0..{shard_count - 1} "
                            f"(--shard-count {shard_count}); pass the Job's spec.completions as --shard-count")
        outer = Slice(idx + 1, shard_count, f"JOB_COMPLETION_INDEX={idx} of {shard_count}")
    elif shard_count:
        raise SpecError(f"--shard-count {shard_count} is for Kubernetes Indexed Jobs, but JOB_COMPLETION_INDEX "
                        "is not set")
    inner = None
    if "RANK" in environ or "WORLD_SIZE" in environ:
        who = "a torch.distributed launcher (RANK/WORLD_SIZE is set)"
        rank, world = _env_int(environ, "RANK", who), _env_int(environ, "WORLD_SIZE", who)
        if not 0 <= rank < world:
            raise SpecError(f"--shard auto: RANK={rank} is outside 0..WORLD_SIZE-1 = 0..{world - 1}")
        local = None
        if "LOCAL_RANK" in environ:
            local = _env_int(environ, "LOCAL_RANK", who)
            lws = environ.get("LOCAL_WORLD_SIZE")
            if local < 0 or (lws is not None and local >= _env_int(environ, "LOCAL_WORLD_SIZE", who)):
                raise SpecError(f"--shard auto: LOCAL_RANK={local} is outside 0..LOCAL_WORLD_SIZE-1 "
                                f"(LOCAL_WORLD_SIZE={lws})")
        inner = Slice(rank + 1, world, f"RANK={rank} of WORLD_SIZE={world}", local)
    if outer is None and inner is None:
        raise SpecError(f"--shard auto: no scheduler slice in the environment (looked for {SCHEDULER_VARS}); "
                        "give --shard I/N")
    if outer is None:
        return inner
    if inner is None:
        return outer
    s = outer.split(inner.index, inner.count)
    return Slice(s.index, s.count, f"{outer.source}, {inner.source}", inner.local_rank)


def local_rank_device(local_rank: int, environ=None) -> str:
    """The CUDA_VISIBLE_DEVICES entry of a launcher's LOCAL_RANK: one GPU per local rank (a process that already
    sees one GPU alone, bound to it by the scheduler, keeps it)."""
    environ = os.environ if environ is None else environ
    visible = [d.strip() for d in environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    if not visible:
        return str(local_rank)
    if len(visible) == 1:
        return visible[0]
    if local_rank >= len(visible):
        raise SpecError(f"--shard auto: LOCAL_RANK={local_rank} but CUDA_VISIBLE_DEVICES={','.join(visible)} "
                        f"lists {len(visible)} GPUs: start at most {len(visible)} processes per host")
    return visible[local_rank]


SLOT_VARS = ("CUBLASLT_PROBE_SLOT", "LOCAL_RANK", "SLURM_LOCALID")


def _first_count(names, environ=None, least: int = 0) -> int | None:
    """The value of the first of the environment variables `names` that holds a whole number of at least
    `least` (others, and unset ones, are passed over), or None."""
    environ = os.environ if environ is None else environ
    for name in names:
        v = environ.get(name, "").strip()
        if v.isdigit() and int(v) >= least:
            return int(v)
    return None


def cpu_slot(environ=None) -> int:
    """Which three CPU cores this host's probe process takes (`ProbeOptions.cpu_slot`): the slot `sweep
    --devices` gives each worker, else the launcher's local rank (torchrun, Slurm), else 0."""
    slot = _first_count(SLOT_VARS, environ)
    return 0 if slot is None else slot
