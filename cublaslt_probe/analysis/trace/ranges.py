"""Where points and ranges of a trace's timeline sit among its ranges: the innermost range of a thread holding a
point (`innermost`), a range holding a point when ranges may overlap (`contained`), and each range's directly
enclosing range (`range_parents`). `audit` attributes launches to modules and steps with them; host stalls,
graph joins and step finding use the same rules."""
from __future__ import annotations

import numpy as np


def innermost(r_ts, r_end, r_tid, p_ts, p_tid) -> np.ndarray:
    """For each point (ts, tid): the index of the innermost range of its thread that contains it, else -1.

    Ranges on one thread nest (profiler ranges are scopes). A sweep per thread with a stack."""
    out = np.full(len(p_ts), -1, dtype=np.int64)
    if not len(r_ts) or not len(p_ts):
        return out
    r_ts, r_end, r_tid = np.asarray(r_ts), np.asarray(r_end), np.asarray(r_tid)
    p_ts, p_tid = np.asarray(p_ts), np.asarray(p_tid)
    for tid in np.intersect1d(np.unique(r_tid), np.unique(p_tid)):
        ri = np.flatnonzero(r_tid == tid)
        ri = ri[np.lexsort((-r_end[ri], r_ts[ri]))]          # by start, the outer (longer) one first
        pi = np.flatnonzero(p_tid == tid)
        pi = pi[np.argsort(p_ts[pi], kind="stable")]
        starts, ends = r_ts[ri].tolist(), r_end[ri].tolist()
        stack: list[int] = []
        j, nr = 0, len(ri)
        for p, t in zip(pi.tolist(), p_ts[pi].tolist()):
            while j < nr and starts[j] <= t:
                while stack and ends[stack[-1]] < starts[j]:
                    stack.pop()
                stack.append(j)
                j += 1
            while stack and ends[stack[-1]] < t:
                stack.pop()
            if stack:
                out[p] = ri[stack[-1]]
    return out


def contained(r_ts, r_end, pts) -> np.ndarray:
    """For each point, the index of a range that contains it, else -1. Ranges may overlap (steps of two
    threads or processes): of those started at or before the point, the one that ends last is taken, so a
    point inside several ranges gets exactly one."""
    out = np.full(len(pts), -1, dtype=np.int64)
    if not len(r_ts) or not len(pts):
        return out
    r_ts, r_end, pts = np.asarray(r_ts, dtype=np.float64), np.asarray(r_end, dtype=np.float64), np.asarray(pts)
    order = np.argsort(r_ts, kind="stable")
    s, e = r_ts[order], r_end[order]
    reach = np.maximum.accumulate(e)                                   # the latest end among ranges so far
    who = np.maximum.accumulate(np.where(e >= reach, np.arange(len(e)), 0))   # ... and the range ending there
    i = np.searchsorted(s, pts, side="right") - 1
    ok = (i >= 0) & (pts <= reach[np.maximum(i, 0)])
    out[ok] = order[who[i[ok]]]
    return out


def range_parents(r_ts, r_end, r_tid) -> np.ndarray:
    """For each range, the index of the range that directly encloses it on its thread, else -1."""
    r_ts, r_end, r_tid = np.asarray(r_ts), np.asarray(r_end), np.asarray(r_tid)
    out = np.full(len(r_ts), -1, dtype=np.int64)
    for tid in np.unique(r_tid):
        ri = np.flatnonzero(r_tid == tid)
        ri = ri[np.lexsort((-r_end[ri], r_ts[ri]))]
        stack: list[int] = []
        for j in ri.tolist():
            while stack and r_end[stack[-1]] < r_ts[j]:
                stack.pop()
            if stack:
                out[j] = stack[-1]
            stack.append(j)
    return out
