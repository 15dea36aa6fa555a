"""Kernels replayed from CUDA graphs, joined to the launches that built them (CPU only).

A replayed graph profiles as kernels linked only to ``cudaGraphLaunch``: no op, no shapes, no module, and no
cuBLASLt log line (the library is not called at replay). While `cublaslt_probe.capture` is open, its
`recorder.GraphRecorder` puts a range ``runfiles.GRAPH_CAPTURE_PREFIX + N`` around each graph's capture and
``runfiles.GRAPH_REPLAY_PREFIX + N`` around each replay. During a capture no kernel runs, but the profiler still
records every op and every runtime launch call made inside it, in the order the graph's nodes were added.

`join(trace_path, det, L)` gives each replayed kernel the op of the launch call it repeats: the i-th node of a
replay (kernels, memsets and memcpys by GPU start, split-K reduces included) is the i-th call that adds a node
(`NODE_CALLS`) between ``cudaStreamBeginCapture`` and ``cudaStreamEndCapture`` inside its graph's capture range
(calls before the begin, such as the RNG state torch fills for the graph, run eagerly). A replay whose node
count differs from the capture's, or whose GEMM kernels would land on calls made outside any op, is not joined
(a note says so). A graph launch whose capture the trace does not
hold is named with the fix: open the capture before the warm-up and the graph capture.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from cublaslt_probe import runfiles
from cublaslt_probe.trace.ranges import innermost

GRAPH_LAUNCH = "cudaGraphLaunch"
# the runtime and driver calls that add one node (kernel, memset, memcpy) while a stream is captured
NODE_CALLS = frozenset({"cudaLaunchKernel", "cudaLaunchKernelExC", "cudaLaunchKernelEx", "cuLaunchKernel",
                        "cuLaunchKernelEx", "cudaLaunchCooperativeKernel", "cuLaunchCooperativeKernel",
                        "cudaMemsetAsync", "cudaMemset2DAsync", "cudaMemset3DAsync", "cuMemsetD8Async",
                        "cuMemsetD16Async", "cuMemsetD32Async", "cuMemsetD2D8Async", "cuMemsetD2D16Async",
                        "cuMemsetD2D32Async", "cudaMemcpyAsync", "cudaMemcpy2DAsync", "cudaMemcpy3DAsync",
                        "cudaMemcpyPeerAsync", "cuMemcpyAsync", "cuMemcpyDtoDAsync", "cuMemcpyHtoDAsync",
                        "cuMemcpyDtoHAsync", "cuMemcpy2DAsync", "cuMemcpy3DAsync", "cuMemcpyPeerAsync"})
CAPTURE_CALLS = ("cudaStreamBeginCapture", "cudaStreamEndCapture")   # the graph's own bounds inside the range
_RUNTIME = {"cuda_runtime", "cuda_driver", "Runtime"}
_GPU = {"kernel", "gpu_memcpy", "gpu_memset"}


@dataclass
class GraphEvents:
    """What a trace holds about CUDA graphs: the capture and replay ranges of `recorder.GraphRecorder`
    (``graph``, ``ts``, ``end``, ``pid``, ``tid``), the kernel launch calls (``ts``, ``pid``, ``tid``), the graph
    launches (``ts``, ``corr``, ``pid``, ``tid``) and the kernels they ran (``ts``, ``corr``, ``name``)."""

    captures: pd.DataFrame
    replays: pd.DataFrame
    launch_calls: pd.DataFrame
    graph_launches: pd.DataFrame
    kernels: pd.DataFrame
    notes: list[str] = field(default_factory=list)


def read_graph_events(path) -> GraphEvents:
    """One pass over the trace (`trace.iter_chrome_events`) keeping the events `GraphEvents` holds."""
    from cublaslt_probe.trace import iter_chrome_events
    caps, reps, calls, launches, kernels, bounds = [], [], [], [], [], []
    for e in iter_chrome_events(path):
        if not isinstance(e, dict):
            continue
        cat, name = e.get("cat"), e.get("name")
        if not isinstance(name, str):
            continue
        args = e.get("args") if isinstance(e.get("args"), dict) else {}
        try:
            ts = float(e.get("ts"))
        except (TypeError, ValueError):
            continue
        if cat in _RUNTIME:
            if name in NODE_CALLS:
                calls.append((ts, e.get("pid"), e.get("tid")))
            elif name in CAPTURE_CALLS:
                bounds.append((name, ts, e.get("pid"), e.get("tid")))
            elif name == GRAPH_LAUNCH:
                launches.append((ts, args.get("correlation"), e.get("pid"), e.get("tid")))
        elif cat in _GPU:
            kernels.append((ts, args.get("correlation"), name))
        elif cat == "user_annotation" and name.startswith((runfiles.GRAPH_CAPTURE_PREFIX,
                                                            runfiles.GRAPH_REPLAY_PREFIX)):
            try:
                end = ts + float(e.get("dur"))
                n = int(name.rsplit(":", 1)[1])
            except (TypeError, ValueError):
                continue
            (caps if name.startswith(runfiles.GRAPH_CAPTURE_PREFIX) else reps).append(
                (n, ts, end, e.get("pid"), e.get("tid")))
    rng = ["graph", "ts", "end", "pid", "tid"]
    k = pd.DataFrame(kernels, columns=["ts", "corr", "name"])
    g = pd.DataFrame(launches, columns=["ts", "corr", "pid", "tid"])
    k = k[k["corr"].isin(set(g["corr"].dropna().tolist()))] if len(g) else k.iloc[:0]
    caps = pd.DataFrame(caps, columns=rng)
    b = pd.DataFrame(bounds, columns=["name", "ts", "pid", "tid"])
    for i, c in enumerate(caps.itertuples(index=False)):      # narrow each capture to its begin .. end calls
        mine = b[(b["ts"] >= c.ts) & (b["ts"] <= c.end) & (b["pid"] == c.pid) & (b["tid"] == c.tid)]
        first = mine[mine["name"] == CAPTURE_CALLS[0]]
        last = mine[mine["name"] == CAPTURE_CALLS[1]]
        if len(first):
            caps.loc[caps.index[i], "ts"] = float(first["ts"].min())
        if len(last):
            caps.loc[caps.index[i], "end"] = float(last["ts"].max())
    return GraphEvents(caps, pd.DataFrame(reps, columns=rng),
                       pd.DataFrame(calls, columns=["ts", "pid", "tid"]), g, k.reset_index(drop=True))


def _inside(rng: pd.DataFrame, ts: float, pid, tid) -> pd.DataFrame:
    return rng[(rng["ts"] <= ts) & (rng["end"] >= ts) & (rng["pid"] == pid) & (rng["tid"] == tid)]


def _graph_of(ev: GraphEvents, launch, n_kernels: int, sequences: dict[int, pd.DataFrame]) -> int | None:
    """The captured graph a graph launch replays: the replay range around it, else the one captured graph whose
    launch count equals the replay's kernel count."""
    r = _inside(ev.replays, launch.ts, launch.pid, launch.tid)
    if len(r):
        return int(r["graph"].iloc[-1])
    fits = [n for n, s in sequences.items() if len(s) == n_kernels]
    return fits[0] if len(fits) == 1 else None


def join(trace_path, det, L: pd.DataFrame, ev: GraphEvents | None = None) -> tuple[pd.DataFrame, list[str]]:
    """`L` (launches, `trace.TraceDetail.launches` rows) with ``op_row`` set for the kernels replayed from a
    graph whose capture the trace holds, and a ``graph`` column (the graph's number, -1: not from a captured
    graph; -2: replayed from a graph whose capture the trace does not hold); and the notes that say what was
    joined and what was not, with the fix."""
    L = L.assign(graph=np.full(len(L), -1, dtype=np.int64))
    ev = ev or read_graph_events(trace_path)
    if not len(ev.graph_launches) or not len(ev.kernels):
        return L, []
    ops = det.ops
    sequences: dict[int, pd.DataFrame] = {}
    for c in ev.captures.itertuples(index=False):
        s = ev.launch_calls[(ev.launch_calls["ts"] >= c.ts) & (ev.launch_calls["ts"] <= c.end)
                            & (ev.launch_calls["pid"] == c.pid) & (ev.launch_calls["tid"] == c.tid)]
        s = s.sort_values("ts", kind="stable")
        mine = ops[ops["pid"] == c.pid] if "pid" in ops.columns else ops
        at = innermost(mine["ts"].to_numpy(), mine["end"].to_numpy(), mine["tid"].to_numpy(),
                        s["ts"].to_numpy(), s["tid"].to_numpy())
        sequences[int(c.graph)] = s.assign(op_row=np.where(at >= 0, mine.index.to_numpy()[np.maximum(at, 0)], -1))
    ts_l = L["ts"].to_numpy(dtype=np.float64)
    tl_l = L["t_launch"].to_numpy(dtype=np.float64)
    op_row = L["op_row"].to_numpy().copy()
    graph = L["graph"].to_numpy().copy()
    joined, unseen, mismatch = 0, 0, 0
    unseen_gemm_us = 0.0
    kind = L["kind"].to_numpy()
    dur = L["dur"].to_numpy(dtype=np.float64)
    by_corr = ev.kernels.groupby("corr")
    for gl in ev.graph_launches.itertuples(index=False):
        if gl.corr not in by_corr.groups:
            continue
        ks = by_corr.get_group(gl.corr).sort_values("ts", kind="stable")
        mine = np.flatnonzero(np.isclose(tl_l, gl.ts, rtol=0, atol=1e-3) & (op_row < 0))
        n = _graph_of(ev, gl, len(ks), sequences)
        if n is None or n not in sequences:
            graph[mine] = -2
            unseen += len(mine)
            unseen_gemm_us += float(dur[mine][kind[mine] > 0].sum())
            continue
        seq = sequences[n]
        if len(seq) != len(ks):
            mismatch += 1
            graph[mine] = n
            continue
        at = pd.Series(seq["op_row"].to_numpy(), index=ks["ts"].to_numpy())
        at = at[~at.index.duplicated()]
        got = at.reindex(ts_l[mine]).to_numpy()
        ok = ~pd.isna(got)
        if (kind[mine][ok] == 1).any() and (got[ok][kind[mine][ok] == 1] < 0).any():
            mismatch += 1
            graph[mine] = n
            continue
        op_row[mine[ok]] = got[ok].astype(np.int64)
        graph[mine] = n
        joined += int(ok.sum())
    notes = []
    if joined:
        notes.append(f"{joined:,} launches were replayed from CUDA graphs captured inside the capture: each is "
                     "joined to the call it repeats (the i-th node of a replay to the i-th launch, memset or "
                     "memcpy call of the graph's capture), so it has the op, shapes and module recorded at "
                     "capture; the rows say `graph`")
    if mismatch:
        notes.append(f"{mismatch:,} graph replays did not match their capture (another kernel count, or a GEMM "
                     "kernel on a launch outside any op): their kernels are not joined")
    if unseen:
        notes.append(f"{unseen:,} launches{f' ({unseen_gemm_us:,.1f} µs of GEMM time)' if unseen_gemm_us else ''} "
                     "were replayed from a CUDA graph whose capture this trace does not hold (they are linked only "
                     "to cudaGraphLaunch): the op, shapes and module that built them, and the cuBLASLt log lines, "
                     "were recorded only while the graph was captured, before this capture opened. Open "
                     "cublaslt_probe.capture before the warm-up and the graph capture (torch.cuda.graph, "
                     "CUDAGraph.capture_begin, or torch.compile(mode=\"reduce-overhead\")'s first calls) and "
                     "replay inside it; profiler options (record_shapes, with_modules) do not change this")
    return L.assign(op_row=op_row, graph=graph), notes
