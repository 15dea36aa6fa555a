"""`sweep --devices`: the plan cut into fine blocks that workers claim one at a time (an exclusive file
create per claim), so a fast GPU takes more blocks and no block is run twice."""
from __future__ import annotations

import os
import time

from cublaslt_probe.sweep.runner import part_path, raw_path, run_meta, run_raw_parts
from cublaslt_probe.sweep.slices import Slice
from cublaslt_probe.sweep.spec import Plan
from cublaslt_probe.vocab import WINDOW

# --- several workers on one host: fine slices handed out as they finish ----------------------------------------
BLOCK_WINDOWS = 4          # `sweep --devices` cuts a plan into blocks of a quarter window (`fine_slices`) ...
CLAIMS_PER_WORKER = 256    # ... 256 per worker at most (whole windows each when larger): a worker runs the blocks


def fine_slices(gemms: int, workers: int, window: int) -> int:
    """How many blocks `sweep --devices` cuts a plan of `gemms` into for `workers` workers: blocks of a quarter
    window (`BLOCK_WINDOWS`), CLAIMS_PER_WORKER per worker at most, else each a whole number of windows, and one
    block per worker at least. A worker claims a window's worth of blocks at a time and runs them in one
    window (`claimed_groups`, `run_raw_parts`), and near the end claims fewer, down to one: the worker that
    finishes last then ends at most a block after the others, not a window."""
    window = max(1, window)
    per = -(-window // BLOCK_WINDOWS)
    if -(-gemms // per) > CLAIMS_PER_WORKER * workers:
        per = window * max(1, -(-gemms // (window * CLAIMS_PER_WORKER * workers)))   # GEMMs a block holds at most
    return max(workers, -(-gemms // per), 1)


def claim_order(count: int, workers: int, me: int) -> list[int]:
    """The order in which worker `me` (0-based, of `workers`) asks for the `count` fine slices: first its own
    run of them (the me-th of `workers` contiguous runs, in plan order), then the others' from their ends
    backwards, so that what it takes from another is what that worker would reach last. Neighbouring GEMMs
    share kernels: a worker that keeps to one part of the plan loads fewer of them."""
    def run(w):
        return range(w * count // workers + 1, (w + 1) * count // workers + 1)
    return list(run(me)) + [j for w in range(me + 1, me + workers) for j in reversed(run(w % workers))]


def claim(folder: str, order):
    """Yield the numbers (of `order`, the slices 1..N) of the slices this worker takes, each claimed by
    creating folder/NNNNNN (an exclusive create: of several workers sharing the folder, exactly one gets each
    slice). A worker asks for the next one when it has finished the last, so a slower worker takes fewer."""
    for j in order:
        try:
            fd = os.open(os.path.join(folder, f"{j:06d}"), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            continue
        os.close(fd)
        yield j


def unclaimed(folder: str, count: int) -> int:
    """How many of the `count` blocks no worker has claimed yet (the claim files in `folder`)."""
    return count - sum(1 for name in os.listdir(folder) if name.isdigit())


def claimed_groups(folder: str, order, sizes, window: int, workers: int):
    """Yield the groups of blocks (numbers of `order`, the blocks 1..N) this worker runs together: each claimed
    in `order` (`claim`) until the group holds `window` GEMMs (`sizes[j]` in block j), and at most a share of
    what is left unclaimed — a (2 x `workers`)-th, one block at least (guided self-scheduling): the groups
    shrink as the plan runs out, so the workers end within about a block of each other. A lone worker's
    groups fill their windows to the end."""
    blocks = claim(folder, order)
    for j in blocks:
        group, held = [j], sizes[j]
        most = max(1, -(-unclaimed(folder, len(order)) // (2 * workers))) if workers > 1 else len(order)
        while held < window and len(group) < most:
            nxt = next(blocks, None)
            if nxt is None:
                break
            group.append(nxt)
            held += sizes[nxt]
        yield group


def wait_for_workers(folder: str, workers: int, me: str, timeout_s: float = 300.0) -> float:
    """Say that worker `me` is ready (folder/ready-ME) and wait until `workers` are, or `timeout_s`: the
    workers start taking slices together, so no GPU works alone while the others are still starting.
    Returns the seconds waited."""
    import glob
    t = time.time()
    open(os.path.join(folder, f"ready-{me}"), "w").close()
    while len(glob.glob(os.path.join(glob.escape(folder), "ready-*"))) < workers and time.time() - t < timeout_s:
        time.sleep(0.01)
    return time.time() - t


def run_claimed(plan_: Plan, base: Slice, count: int, folder: str, out: str, executor, *, resume: bool = False,
                window: int = WINDOW, workers: int = 1, me: int = 0, **meta) -> tuple[int, float, int]:
    """A `sweep --devices` worker (`me` of `workers`, 0-based): take blocks of `base` (`base.cut(j, count)`)
    from the claims in `folder`, in `claim_order`, a window's worth at a time (`claimed_groups`), until none
    is left, capturing each group in windows of `window` (`run_raw_parts`) into the blocks' raw part files
    beside `out` (no dataset: the parent merges the parts). (GEMMs run, seconds from the first claim to the
    last record, blocks taken.)"""
    subs = {j: base.cut(j, count) for j in range(1, count + 1)}
    cases = {j: sub.take(plan_.cases) for j, sub in subs.items()}
    gemms, slices, t0 = 0, 0, time.time()
    for group in claimed_groups(folder, claim_order(count, workers, me), {j: len(c) for j, c in cases.items()},
                                window, workers):
        n, _ = run_raw_parts([(cases[j], raw_path(part_path(out, subs[j])), run_meta(plan_, subs[j], **meta))
                              for j in group], executor, resume=resume, window=window, progress=False)
        gemms += n
        slices += len(group)
    return gemms, time.time() - t0, slices
