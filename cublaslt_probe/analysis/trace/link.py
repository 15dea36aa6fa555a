"""Joins between a Chrome trace's events, vectorised over the reader's arrays: kernel -> launch call ->
process (`link`), kernel -> op (`lookup_in`), split-K reduces counted with their GEMM (`attach`), launches
grouped by (kernel, op, process) (`group`), and the process a GPU-timeline range belongs to
(`gpu_range_owner`).

Correlation and External ids are counted per process: in a file of several processes (merged rank traces)
an id may stand for one call in each, so every join here is made within a process."""
from __future__ import annotations

import numpy as np
import pandas as pd

from cublaslt_probe.analysis.trace.schema import TraceStats


def lookup(keys: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Vectorised dict lookup: for each key, the value stored with it in (k, v), else -1 (also for a key < 0).

    The (few) keys are sorted and the (many) table entries searched among them, so the only temporaries
    of the table's length are one index and one mask array."""
    out = np.full(len(keys), -1, dtype=np.int64)
    if not len(k) or not len(keys):
        return out
    uk, inv = np.unique(keys, return_inverse=True)
    pos = np.searchsorted(uk, k)
    np.minimum(pos, len(uk) - 1, out=pos)
    hit = uk[pos] == k
    found = np.full(len(uk), -1, dtype=np.int64)
    found[pos[hit]] = v[hit]
    del pos, hit
    out = found[inv]
    out[keys < 0] = -1
    return out


def lookup_in(key_pid: np.ndarray, keys: np.ndarray, t_pid: np.ndarray, k: np.ndarray,
               v: np.ndarray) -> np.ndarray:
    """`lookup` within processes: each key is looked up among the table entries of its own process
    (`key_pid`, `t_pid`: process indices); a key of process -1 finds nothing. One process: one plain lookup."""
    procs = np.unique(t_pid) if len(t_pid) else t_pid
    if len(procs) <= 1:
        out = lookup(keys, k, v)
        if len(procs) == 1:
            out[key_pid != procs[0]] = -1
        return out
    out = np.full(len(keys), -1, dtype=np.int64)
    for p in procs.tolist():
        mk, mt = key_pid == p, t_pid == p
        if mk.any():
            out[mk] = lookup(keys[mk], k[mt], v[mt])
    return out


def _device_owner(devices: np.ndarray, l_dev: np.ndarray, l_pid: np.ndarray) -> np.ndarray:
    """For each device: the process index whose launches are the only ones on it, else -1 (several or
    none)."""
    out = np.full(len(devices), -1, dtype=np.int64)
    known = l_pid >= 0
    if not len(devices) or not known.any():
        return out
    pairs = np.unique(np.stack([l_dev[known], l_pid[known].astype(np.int64)]), axis=1)
    d, first, n = np.unique(pairs[0], return_index=True, return_counts=True)
    owner = dict(zip(d[n == 1].tolist(), pairs[1][first[n == 1]].tolist()))
    return np.array([owner.get(x, -1) for x in devices.tolist()], dtype=np.int64)


def gpu_range_owner(rng: pd.DataFrame, l_dev: np.ndarray, l_stream: np.ndarray, l_ts: np.ndarray,
                     l_pid: np.ndarray) -> np.ndarray:
    """The process index of each GPU-timeline range: its device's only launching process; on a device that
    several share, the one process whose kernels start inside the range on its stream; else -1."""
    out = _device_owner(rng["device"].to_numpy(), l_dev, l_pid)
    todo = np.flatnonzero(out < 0)
    if not len(todo):
        return out
    r_dev, r_stream = rng["device"].to_numpy()[todo], rng["tid"].to_numpy()[todo]
    r_ts, r_end = rng["ts"].to_numpy()[todo], rng["end"].to_numpy()[todo]
    known = l_pid >= 0
    for d, st in set(zip(r_dev.tolist(), r_stream.tolist())):
        mine = np.flatnonzero(known & (l_dev == d) & (l_stream == st))
        if not len(mine):
            continue
        mine = mine[np.argsort(l_ts[mine], kind="stable")]
        t, p = l_ts[mine], l_pid[mine]
        sel = np.flatnonzero((r_dev == d) & (r_stream == st))
        lo = np.searchsorted(t, r_ts[sel], "left")
        hi = np.searchsorted(t, r_end[sel], "right")
        for i, a, b in zip(sel.tolist(), lo.tolist(), hi.tolist()):
            if b > a and p[a:b].min() == p[a:b].max():
                out[todo[i]] = p[a]
    return out


def link(corr: np.ndarray, ext: np.ndarray, dev: np.ndarray, ts: np.ndarray, r_corr: np.ndarray,
          r_ext: np.ndarray, r_ts: np.ndarray, r_pid: np.ndarray, n_procs: int,
          stats: TraceStats) -> tuple[np.ndarray, np.ndarray]:
    """Each launch's process (index into the reader's pids, -1 when it cannot be told) and launch call (row
    in the runtime arrays, -1 when none); fills a missing External id (`ext`, in place) from the call's.

    Kernel events carry the device as their pid; the runtime calls carry the OS pid, and correlation and
    External ids are counted per process, so with several processes in the file (merged rank traces) an id
    may stand for one call in each. A kernel's candidates are the calls with its correlation; when the
    kernel has an External id, those with the same External id, if any. Then:
    1. candidates of one process only: the kernel is that process's (each such match also tells which
       processes launch on the kernel's device);
    2. else the candidates of the processes known to launch on the kernel's device (all when none is);
    3. the kernels that share a correlation and as many candidate calls (the same program on several
       ranks) are paired with them in time order, one call each;
    4. else the latest candidate at or before the kernel's start;
    5. else none: the kernel is unlinked and counted in ``stats.no_process``.
    A kernel without a call belongs to the only process known to launch on its device, if there is one.
    With one process, every kernel is that process's."""
    n = len(corr)
    r_row = np.full(n, -1, dtype=np.int64)
    if n_procs <= 1:
        l_pid = np.full(n, 0 if n_procs == 1 else -1, dtype=np.int64)
        if len(r_corr):
            r_row = lookup(corr, r_corr, np.arange(len(r_corr)))
    else:
        l_pid = np.full(n, -1, dtype=np.int64)
        order = np.lexsort((r_ts, r_corr))
        sc = r_corr[order]
        lo = np.searchsorted(sc, corr, "left")
        hi = np.searchsorted(sc, corr, "right")
        cnt = np.where(corr >= 0, hi - lo, 0)
        # one candidate: linked; several: one row per (kernel, call)
        one = np.flatnonzero(cnt == 1)
        r_row[one] = order[lo[one]]
        amb = np.flatnonzero(cnt > 1)
        k_of = np.repeat(amb, cnt[amb])
        within = np.arange(len(k_of)) - np.repeat(np.cumsum(cnt[amb]) - cnt[amb], cnt[amb])
        c_row = order[np.repeat(lo[amb], cnt[amb]) + within]
        c = pd.DataFrame({"k": k_of, "row": c_row, "pid": r_pid[c_row].astype(np.int64), "t": r_ts[c_row]})
        same_ext = (ext[k_of] >= 0) & (r_ext[c_row] == ext[k_of])
        c = c[same_ext | ~pd.Series(same_ext, index=c.index).groupby(c["k"]).transform("any")]
        one_proc = c.groupby("k")["pid"].transform("nunique") == 1
        sure = c[one_proc].drop_duplicates("k")
        r_row[sure["k"].to_numpy()] = sure["row"].to_numpy()
        c = c[~one_proc]
        linked = r_row >= 0
        l_pid[linked] = r_pid[r_row[linked]]
        # which processes launch on which device, from the sure matches
        devs, dev_i = np.unique(dev, return_inverse=True)
        owns = np.zeros((n_procs, len(devs)), dtype=bool)
        owns[l_pid[linked], dev_i[linked]] = True
        if len(c):
            k = c["k"].to_numpy()
            c = c.assign(own=owns[c["pid"].to_numpy(), dev_i[k]], corr=corr[k], kts=ts[k])
            c = c[c["own"] | ~c.groupby("k")["own"].transform("any")]          # 2: the device's processes
            _pick(c, r_row, l_pid)
        # no call: the device's only launching process
        none = (l_pid < 0) & (cnt == 0)
        if none.any():
            only = owns.sum(axis=0) == 1
            owner = np.where(only, owns.argmax(axis=0), -1)
            l_pid[none] = owner[dev_i[none]]
        stats.no_process = int((l_pid < 0).sum())
    need = ext < 0
    hit = need & (r_row >= 0)
    ext[hit] = r_ext[r_row[hit]]
    return l_pid, r_row


def _pick(c: pd.DataFrame, r_row: np.ndarray, l_pid: np.ndarray) -> None:
    """Steps 1-4 of `link` for the kernels whose candidate calls (`c`: k, row, pid, t, corr, kts) lie in
    several processes; writes the chosen call and process into `r_row` and `l_pid`."""
    single = c.groupby("k")["k"].transform("size") == 1
    done = c[single]
    r_row[done["k"].to_numpy()] = done["row"].to_numpy()
    l_pid[done["k"].to_numpy()] = done["pid"].to_numpy()
    c = c[~single]
    if not len(c):
        return
    # 3: as many kernels as calls under one correlation: paired in time order, if every pair is a candidate
    kern = c.drop_duplicates("k").sort_values(["kts", "k"], kind="stable")
    calls = c.drop_duplicates("row").sort_values(["t", "pid", "row"], kind="stable")
    kern = kern.assign(nth=kern.groupby("corr").cumcount())
    calls = calls.assign(nth=calls.groupby("corr").cumcount())
    n_k, n_c = kern.groupby("corr").size(), calls.groupby("corr").size()
    even = n_k.index[n_k.reindex(n_c.index).eq(n_c).reindex(n_k.index, fill_value=False).to_numpy()]
    pairs = kern[kern["corr"].isin(even)][["k", "corr", "nth"]].merge(
        calls[calls["corr"].isin(even)][["row", "pid", "corr", "nth"]], on=["corr", "nth"])
    valid = pairs.merge(c[["k", "row"]], on=["k", "row"], how="left", indicator=True)["_merge"].eq("both")
    bad_corr = set(pairs.loc[~valid.to_numpy(), "corr"].tolist())
    pairs = pairs[~pairs["corr"].isin(bad_corr)]
    r_row[pairs["k"].to_numpy()] = pairs["row"].to_numpy()
    l_pid[pairs["k"].to_numpy()] = pairs["pid"].to_numpy()
    # 4: the latest call at or before the kernel's start
    c = c[~c["k"].isin(pairs["k"]) & (c["t"] <= c["kts"])]
    c = c.sort_values(["k", "t", "pid"], ascending=[True, False, True], kind="stable").drop_duplicates("k")
    r_row[c["k"].to_numpy()] = c["row"].to_numpy()
    l_pid[c["k"].to_numpy()] = c["pid"].to_numpy()


def attach(kind: np.ndarray, ts: np.ndarray, dur: np.ndarray, dev: np.ndarray, stream: np.ndarray,
            ext: np.ndarray, pid: np.ndarray, stats: TraceStats) -> tuple:
    """Count each split-K reduce with the GEMM launched before it on its stream (by the same op, or either
    unlinked). One row per launch (kind 1 GEMM, 2 reduce, 0 other); returns (order, keep, total, reduce):
    the launches sorted by (device, process, stream, time), which of them stay (all but the attached
    reduces), and the kept launches' time with their reduces and the reduce part. Two processes' streams
    on one device are different streams. Numpy only."""
    n = len(kind)
    order = np.lexsort((ts, stream, pid, dev))
    k_s = kind[order]
    is_gemm = k_s == 1
    stats.gemm_launches = int(is_gemm.sum())
    stats.reduce_launches = int((k_s == 2).sum())
    ext_s = ext[order]
    idx = np.arange(n)
    # for each row: the latest GEMM row at or before it, and the first row of its (device, process, stream) run
    last = np.maximum.accumulate(np.where(is_gemm, idx, -1)) if n else idx
    d_s, s_s, p_s = dev[order], stream[order], pid[order]
    new_run = np.ones(n, dtype=bool)
    new_run[1:] = (d_s[1:] != d_s[:-1]) | (s_s[1:] != s_s[:-1]) | (p_s[1:] != p_s[:-1])
    run_start = np.maximum.accumulate(np.where(new_run, idx, 0)) if n else idx
    del d_s, s_s, p_s, new_run
    cand = (k_s == 2) & (last >= run_start)       # other kernels (detail mode) neither attach nor interrupt
    c_rows = np.flatnonzero(cand)
    owners = last[c_rows]
    same_op = (ext_s[c_rows] < 0) | (ext_s[owners] < 0) | (ext_s[c_rows] == ext_s[owners])
    att_rows, att_owner = c_rows[same_op], owners[same_op]
    stats.reduce_attached = len(att_rows)
    dur_s = dur[order]
    reduce_us = np.zeros(n)
    np.add.at(reduce_us, att_owner, dur_s[att_rows])
    keep = np.ones(n, dtype=bool)
    keep[att_rows] = False
    return order, keep, (dur_s + reduce_us)[keep], reduce_us[keep]


def group(name: np.ndarray, kind: np.ndarray, op: np.ndarray, att: tuple, pid: np.ndarray) -> pd.DataFrame:
    """The GEMM and orphan-reduce launches kept by `attach`, grouped by (kernel, op, process): count,
    total_us, min_us, max_us, reduce_us."""
    cols = ["name", "op", "pid", "count", "total_us", "min_us", "max_us", "reduce_us"]
    order, keep, t, r = att
    sel = kind[order][keep] > 0
    t, r = t[sel], r[sel]
    nm, o, p = name[order][keep][sel], op[order][keep][sel], pid[order][keep][sel]
    if not len(nm):
        return pd.DataFrame({c: pd.Series([], dtype=np.float64 if c.endswith("_us") else np.int64) for c in cols})
    keys = np.stack([nm.astype(np.int64), o.astype(np.int64), p.astype(np.int64)], axis=1)
    uniq, first, inv = np.unique(keys, axis=0, return_index=True, return_inverse=True)
    inv = inv.reshape(-1)
    g = len(uniq)
    count = np.bincount(inv, minlength=g)
    total = np.bincount(inv, weights=t, minlength=g)
    red = np.bincount(inv, weights=r, minlength=g)
    mn = np.full(g, np.inf)
    mx = np.full(g, -np.inf)
    np.minimum.at(mn, inv, t)
    np.maximum.at(mx, inv, t)
    return pd.DataFrame({"name": nm[first].astype(np.int64), "op": o[first], "pid": p[first].astype(np.int64),
                         "count": count, "total_us": total, "min_us": mn, "max_us": mx, "reduce_us": red})[cols]
