"""`merge`: the slices' datasets (or raw files) of one sweep joined into one dataset, checked to be of the same
plan, with what is missing said by slice."""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field

from cublaslt_probe.errors import ProbeError
from cublaslt_probe.sweep.parts import KeyIndex, Part, find_parts, write_dataset
from cublaslt_probe.sweep.slices import Slice
from cublaslt_probe.sweep.spec import plan_from_spec
from cublaslt_probe.vocab import ENV_MATCH

log = logging.getLogger("cublaslt_probe.sweep")


@dataclass
class Merged:
    out: str
    rows: int
    parts: int
    plan: str | None
    cuts: list = field(default_factory=list)   # (part, why): gzip parts cut off or damaged after their records


def merge(inputs: list[str], out: str, allow_env_mismatch: bool = False, jobs: int | None = None) -> Merged:
    """Join the parts of a sweep (raw files or datasets; folders and globs of them) into one dataset.

    Checks, before writing anything, that the parts come from one environment (`ENV_MATCH`) and one plan, and
    that together they hold every GEMM of the plan exactly once: says which slices are missing or incomplete,
    which GEMMs two parts both hold, and which records belong to no slice of theirs. Parts written before plans
    were recorded can only be checked for GEMMs held twice.
    """
    if not inputs:
        raise ProbeError("merge needs at least one part")
    parts = [Part.open(p) for p in find_parts(list(inputs))]
    base = parts[0]
    for p in parts[1:]:
        diff = [k for k in ENV_MATCH if p.env.get(k) != base.env.get(k)]
        if diff and not allow_env_mismatch:
            raise ProbeError(f"{p.path} was measured in another environment than {base.path} ("
                             + ", ".join(f"{k} {p.env.get(k)!r} vs {base.env.get(k)!r}" for k in diff)
                             + "): these are not parts of one sweep; pass --allow-env-mismatch to merge anyway")
    idents = [p.env.get("plan") for p in parts]
    plan_ = None
    if all(idents):
        digests = {i["digest"] for i in idents}
        if len(digests) > 1:
            other = next(p for p, i in zip(parts, idents) if i["digest"] != idents[0]["digest"])
            raise ProbeError(f"{other.path} ran another plan than {base.path} (sweep {other.env.get('sweep')!r} "
                             f"vs {base.env.get('sweep')!r}, {other.env['plan']['cases']} vs "
                             f"{base.env['plan']['cases']} GEMMs): merge the parts of one sweep")
        plan_ = plan_from_spec(idents[0]["spec"], idents[0]["backends"])
        if plan_.digest() != idents[0]["digest"]:
            raise ProbeError(f"the plan of {base.path} ({idents[0]['cases']} GEMMs) is not what its spec expands "
                             f"to now ({len(plan_.cases)} GEMMs, another order or another version of the tool): "
                             "merge with the version that ran the sweep")
        index = KeyIndex(plan_.cases.key_chunks())

        def key_of(q):
            return plan_.cases[int(q)].key
    else:
        old = [p.path for p, i in zip(parts, idents) if not i]
        log.warning("%s record no plan (written by an earlier version): checking only that no GEMM is held twice",
                    ", ".join(old[:3]) + (" ..." if len(old) > 3 else ""))
        keys = sorted({k for p in parts for ks in p.keys() for k in ks if k is not None})
        index = KeyIndex(keys)

        def key_of(q):
            return keys[int(q)]
    t0 = time.time()
    for p in parts:
        p.scan(index)
    log.info("merge: %d parts, %d records scanned against %d GEMMs in %.1f s", len(parts),
             sum(len(p.positions) for p in parts), len(index), time.time() - t0)
    problems = _coverage(parts, index, plan_, key_of)
    if problems:
        raise ProbeError(f"the parts do not hold {'plan ' + repr(plan_.name) if plan_ else 'their GEMMs'} "
                         f"({len(index)} GEMMs) exactly once: " + "; ".join(problems))
    env = dict(base.env, shard=None, shard_source=None, parts=len(parts))
    n_jobs = jobs or os.cpu_count() or 1
    t0 = time.time()
    rows = write_dataset(parts, out, env, jobs=n_jobs)
    log.info("merge: wrote %d rows to %s in %.1f s (up to %d processes for raw parts)", rows, out, time.time() - t0,
             n_jobs)
    return Merged(out, rows, len(parts), plan_.name if plan_ else None, [c for p in parts for c in p.cuts])


def _coverage(parts: list[Part], index: KeyIndex, plan_, key_of) -> list[str]:
    """What keeps the parts from holding each GEMM exactly once (empty when they do)."""
    import numpy as np
    problems = []
    n = len(index)
    owner = np.full(n, -1, dtype=np.int32)
    twice, twice_eg = 0, []
    for pi, p in enumerate(parts):
        if p.strangers:
            k = int((p.positions == -2).sum())
            problems.append(f"{p.path} holds {k} GEMMs that are not in the plan (e.g. {p.strangers[0]}): a part "
                            "of another sweep")
        g = p.gemms()
        prev = owner[g]
        clash = prev >= 0
        if clash.any():
            twice += int(clash.sum())
            for q, o in zip(g[clash][:3 - len(twice_eg)], prev[clash]):
                twice_eg.append(f"{key_of(q)} in {parts[o].path} and {p.path}")
        owner[g] = pi
        if plan_ is not None and p.slice.family != (1, 1):
            wrong = p.slice.members(g, n) != p.slice.member
            if wrong.any():
                problems.append(f"{p.path} ({p.slice.describe()}) holds {int(wrong.sum())} GEMMs of other slices "
                                f"(e.g. {key_of(g[wrong][0])})")
    if twice:
        fix = ("a part given twice, or two runs of one slice: give each part once" if plan_ is not None else
               "these are datasets of separate sweeps, not parts of one: give each to map, plot, report or audit on "
               "its own, or compare two with `cublaslt-probe diff A B`")
        problems.append(f"{twice} GEMMs are in two parts (" + "; ".join(twice_eg) + f"): {fix}")
    if plan_ is None:
        return problems
    missing = np.nonzero(owner < 0)[0]
    if len(missing):
        problems += _missing_slices(parts, missing, n, key_of)
    return problems


def _missing_slices(parts: list[Part], missing, n: int, key_of) -> list[str]:
    """What the plan positions `missing` (held by no part) say is missing: whole slices with no part, blocks of a
    slice (`sweep --devices`) with no part, and parts that stopped short. Needs the parts to cut the plan one
    way (one count); otherwise only how many GEMMs are missing."""
    import numpy as np
    counts = {p.slice.count for p in parts}
    c = counts.pop() if len(counts) == 1 else 0
    if not c or (c == 1 and not any(p.slice.block for p in parts)):
        return [f"{len(missing)} GEMMs of the plan are in no part (e.g. {key_of(missing[0])})"]
    of: dict[int, list[Slice]] = {}
    for p in parts:
        of.setdefault(p.slice.index, []).append(p.slice)
    i0 = missing % c
    absent, short, blocks = [], [], {}   # blocks: slice index -> (P, absent blocks)
    for i in np.unique(i0) + 1:
        here = missing[i0 == i - 1]
        cuts = {sl.block[1] if sl.block else 1 for sl in of.get(int(i), [])}
        if not cuts:
            absent.append(int(i))
            continue
        if len(cuts) > 1 or 1 in cuts:   # one part for the whole slice, or blocks cut two ways
            short.append((Slice(int(i), c).describe(), len(here), len(range(i - 1, n, c)), here[0]))
            continue
        nb = cuts.pop()
        first = Slice(int(i), c).cut(1, nb)
        member = first.members(here, n) - first.member
        have = {sl.block[0] - 1 for sl in of[int(i)]}
        per = np.bincount(member, minlength=nb)
        sizes = np.bincount(first.members(np.arange(i - 1, n, c), n) - first.member, minlength=nb)
        gone = [b + 1 for b in range(nb) if per[b] and b not in have]
        if gone:
            blocks[int(i)] = (nb, gone)
        short += [(Slice(int(i), c).cut(b + 1, nb).describe(), int(per[b]), int(sizes[b]), here[member == b][0])
                  for b in range(nb) if per[b] and b in have]
    problems = [f"slices {_ranges(absent)} of {c} are missing (no part)"] if absent else []
    problems += [f"blocks {_ranges(gone)} of {nb} of slice {i}/{c} are missing (no part)"
                 for i, (nb, gone) in blocks.items()]
    problems += [f"{what} lacks {k} of {total} GEMMs (e.g. {key_of(g)}; finish it with --resume)"
                 for what, k, total, g in short[:3]]
    if len(short) > 3:
        problems.append(f"and {len(short) - 3} more incomplete parts")
    return problems


def _ranges(xs: list[int]) -> str:
    """[1, 2, 3, 7] -> '1-3, 7'."""
    out, start = [], None
    for i, x in enumerate(xs):
        if start is None:
            start = x
        if i + 1 == len(xs) or xs[i + 1] != x + 1:
            out.append(str(start) if start == x else f"{start}-{x}")
            start = None
    return ", ".join(out)
