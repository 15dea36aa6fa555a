"""Kernels replayed from CUDA graphs, joined to the launches that built them (CPU only).

A replayed graph profiles as kernels linked only to ``cudaGraphLaunch``: no op, no shapes, no module, and no
cuBLASLt log line (the library is not called at replay). While `cublaslt_probe.capture` is open, its
`recorder.GraphRecorder` puts a range ``runfiles.GRAPH_CAPTURE_PREFIX + N`` around each graph's capture and
``runfiles.GRAPH_REPLAY_PREFIX + N`` around each replay. During a capture no kernel runs, but the profiler still
records every op and every runtime launch call made inside it, in the order the graph's nodes were added.

`join(trace_path, det, L)` gives each replayed kernel the op of the launch call it repeats: the i-th node of a
replay (kernels, memsets and memcpys by GPU start, split-K reduces included) is the i-th call that adds a node
(`NODE_CALLS`) between ``cudaStreamBeginCapture`` and ``cudaStreamEndCapture`` inside its graph's capture range
(calls before the begin, such as the RNG state torch fills for the graph, run eagerly). A graph launched inside
an op (Inductor's cudagraph trees launch it inside Dynamo's ``Torch-Compiled Region``) has kernels whose External
id names that op: it did not build them, so the link is dropped before the join. A replay whose node count
differs from the capture's launch calls has its GEMM kernels joined to the capture's GEMM ops in order when
their counts agree; otherwise, or when its GEMM kernels would land on calls made outside any op, it is not
joined (a note says so). A graph launch whose capture the trace does not hold is named with the fix: open the
capture before the warm-up and the graph capture.

`compiled_module_ranges(det, records)` names the modules of GEMMs that compiled code ran (no module hook runs
inside a compiled graph) from the graph nodes `recorder.CompiledGemms` recorded while Inductor compiled them.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from cublaslt_probe import runfiles
from cublaslt_probe.analysis.trace.ranges import innermost, range_parents

GRAPH_LAUNCH = "cudaGraphLaunch"
# the runtime and driver calls that add one node (kernel, memset, memcpy) while a stream is captured
NODE_CALLS = frozenset({"cudaLaunchKernel", "cudaLaunchKernelExC", "cudaLaunchKernelEx", "cuLaunchKernel",
                        "cuLaunchKernelEx", "cudaLaunchCooperativeKernel", "cuLaunchCooperativeKernel",
                        "cudaMemsetAsync", "cudaMemset2DAsync", "cudaMemset3DAsync", "cuMemsetD8Async",
                        "cuMemsetD16Async", "cuMemsetD32Async", "cuMemsetD2D8Async", "cuMemsetD2D16Async",
                        "cuMemsetD2D32Async", "cudaMemcpyAsync", "cudaMemcpy2DAsync", "cudaMemcpy3DAsync",
                        "cudaMemcpyPeerAsync", "cuMemcpyAsync", "cuMemcpyDtoDAsync", "cuMemcpyHtoDAsync",
                        "cuMemcpyDtoHAsync", "cuMemcpy2DAsync", "cuMemcpy3DAsync", "cuMemcpyPeerAsync"})
COMPILED_REGION = "Torch-Compiled Region"     # Dynamo's profiler range around each call of compiled code
# ops a graph is launched inside (its kernels' External id then names them): the recorder's replay range, a region
GRAPH_OPS = (runfiles.GRAPH_REPLAY_PREFIX, COMPILED_REGION)
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
    from cublaslt_probe.analysis.trace import iter_chrome_events
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


def _gemm_order(seq: pd.DataFrame, gemm_op: np.ndarray, mine: np.ndarray, ts_l: np.ndarray,
                kind: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """A replay that does not match its capture node for node: its GEMM kernels (`mine` rows of kind 1, by GPU
    start) joined to the GEMM ops of the capture's launch calls, in order (a GEMM op's several launches, a
    split-K GEMM and its reduce, count once); None when the counts differ. Returns (launch rows, op rows)."""
    rows = seq["op_row"].to_numpy()
    ops_in_order = pd.unique(rows[(rows >= 0) & gemm_op[np.maximum(rows, 0)]]) if len(gemm_op) else rows[:0]
    g = mine[kind[mine] == 1]
    g = g[np.argsort(ts_l[g], kind="stable")]
    if not len(g) or len(g) != len(ops_in_order):
        return None
    return g, np.asarray(ops_in_order, dtype=np.int64)


def join(trace_path, det, L: pd.DataFrame, ev: GraphEvents | None = None) -> tuple[pd.DataFrame, list[str]]:
    """`L` (launches, `trace.TraceDetail.launches` rows) with ``op_row`` set for the kernels replayed from a
    graph whose capture the trace holds, and a ``graph`` column (the graph's number, -1: not from a captured
    graph; -2: replayed from a graph whose capture the trace does not hold); and the notes that say what was
    joined and what was not, with the fix."""
    L = L.assign(graph=np.full(len(L), -1, dtype=np.int64))
    ev = ev or read_graph_events(trace_path)
    if not len(ev.graph_launches) or not len(ev.kernels):
        return L, []
    op_row, graph, counts = _join_replays(det, L, ev, _capture_sequences(det.ops, ev))
    return L.assign(op_row=op_row, graph=graph), _join_notes(**counts)


def _capture_sequences(ops: pd.DataFrame, ev: GraphEvents) -> dict[int, pd.DataFrame]:
    """Each captured graph's node-adding calls (`GraphEvents.launch_calls` inside its capture range, on its
    thread, by time), with ``op_row``: the row of `ops` (the trace's CPU ops) innermost around the call, -1
    for a call outside any op. The i-th node of a replay repeats the i-th of these calls."""
    sequences: dict[int, pd.DataFrame] = {}
    for c in ev.captures.itertuples(index=False):
        s = ev.launch_calls[(ev.launch_calls["ts"] >= c.ts) & (ev.launch_calls["ts"] <= c.end)
                            & (ev.launch_calls["pid"] == c.pid) & (ev.launch_calls["tid"] == c.tid)]
        s = s.sort_values("ts", kind="stable")
        mine = ops[ops["pid"] == c.pid] if "pid" in ops.columns else ops
        at = innermost(mine["ts"].to_numpy(), mine["end"].to_numpy(), mine["tid"].to_numpy(),
                       s["ts"].to_numpy(), s["tid"].to_numpy())
        sequences[int(c.graph)] = s.assign(op_row=np.where(at >= 0, mine.index.to_numpy()[np.maximum(at, 0)], -1))
    return sequences


def _join_replays(det, L: pd.DataFrame, ev: GraphEvents, sequences: dict[int, pd.DataFrame]
                  ) -> tuple[np.ndarray, np.ndarray, dict]:
    """`join`'s work on the arrays: (``op_row``, ``graph``) of `L` with each graph launch's kernels unlinked
    from the op around the launch and joined to the capture's calls (`sequences`) node for node, else by GEMM
    order (`_gemm_order`); and the counts `_join_notes` reports."""
    from cublaslt_probe.analysis.trace import GEMM_OPS
    ops = det.ops
    ts_l = L["ts"].to_numpy(dtype=np.float64)
    tl_l = L["t_launch"].to_numpy(dtype=np.float64)
    op_row = L["op_row"].to_numpy().copy()
    graph = L["graph"].to_numpy().copy()
    counts = {"joined": 0, "unseen": 0, "mismatch": 0, "by_gemm": 0, "unseen_gemm_us": 0.0}
    gemm_key = np.array([str(k[0]) in GEMM_OPS for k in det.op_keys], dtype=bool)
    gemm_op = gemm_key[ops["key"].to_numpy()] if len(ops) else np.zeros(0, dtype=bool)
    kind = L["kind"].to_numpy()
    dur = L["dur"].to_numpy(dtype=np.float64)
    by_corr = ev.kernels.groupby("corr")
    for gl in ev.graph_launches.itertuples(index=False):
        if gl.corr not in by_corr.groups:
            continue
        ks = by_corr.get_group(gl.corr).sort_values("ts", kind="stable")
        # its kernels, by their launch call's time: linked to no op, or (by External id) to the op around the
        # graph launch (a compiled region, a replay range), which is not the op that built them: unlinked here
        mine = np.flatnonzero(np.isclose(tl_l, gl.ts, rtol=0, atol=1e-3))
        op_row[mine] = -1
        n = _graph_of(ev, gl, len(ks), sequences)
        if n is None or n not in sequences:
            graph[mine] = -2
            counts["unseen"] += len(mine)
            counts["unseen_gemm_us"] += float(dur[mine][kind[mine] > 0].sum())
            continue
        seq = sequences[n]
        graph[mine] = n
        if len(seq) != len(ks):
            got = _gemm_order(seq, gemm_op, mine, ts_l, kind)
            if got is None:
                counts["mismatch"] += 1
            else:
                op_row[got[0]] = got[1]
                counts["joined"] += len(got[0])
                counts["by_gemm"] += 1
            continue
        got = _node_order(seq, ks, mine, ts_l, kind)
        if got is None:
            counts["mismatch"] += 1
            continue
        op_row[got[0]] = got[1]
        counts["joined"] += len(got[0])
    return op_row, graph, counts


def _node_order(seq: pd.DataFrame, ks: pd.DataFrame, mine: np.ndarray, ts_l: np.ndarray, kind: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray] | None:
    """A replay that matches its capture node for node: each of its launches (`mine` rows of `L`, whose GPU
    starts `ts_l` find them among the replay's kernels `ks`) joined to the op of the capture call at its
    position (`seq`); None when a GEMM kernel (kind 1) lands on a call outside any op. Returns (launch rows,
    op rows)."""
    at = pd.Series(seq["op_row"].to_numpy(), index=ks["ts"].to_numpy())
    at = at[~at.index.duplicated()]
    got = at.reindex(ts_l[mine]).to_numpy()
    ok = ~pd.isna(got)
    if (kind[mine][ok] == 1).any() and (got[ok][kind[mine][ok] == 1] < 0).any():
        return None
    return mine[ok], got[ok].astype(np.int64)


def _join_notes(joined: int, by_gemm: int, mismatch: int, unseen: int, unseen_gemm_us: float) -> list[str]:
    """The notes of `join`: how many launches were joined node for node or by GEMM order, how many replays
    did not match their capture, and how many launches came from a graph captured before the capture opened,
    with the fix."""
    notes = []
    if joined:
        notes.append(f"{joined:,} launches were replayed from CUDA graphs captured inside the capture: each is "
                     "joined to the call it repeats (the i-th node of a replay to the i-th launch, memset or "
                     "memcpy call of the graph's capture), so it has the op, shapes and module recorded at "
                     "capture; the rows say `graph`")
    if by_gemm:
        notes.append(f"{by_gemm:,} graph replays ran another number of nodes than their capture recorded launch "
                     "calls (launches the profiler does not record as such): their GEMM kernels are joined to "
                     "the capture's GEMM ops in order, the other kernels are not")
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
    return notes


# --------------------------------------------------------------------------- modules of compiled code
_ROOT = re.compile(r"^(?:[LG]\[['\"][^'\"]*['\"]\]|self)")
_STEP = re.compile(r"\._modules\[['\"]([^'\"]+)['\"]\]|\[['\"]([^'\"]+)['\"]\]|\[(\d+)\]|\.(\w+)")


def module_path(path, cls: str | None = None) -> str | None:
    """The qualified module name (``layers.0.mlp.down_proj``) of a Dynamo ``nn_module_stack`` path, with the
    root object dropped: ``L['self'].layers[0].mlp``, ``L['self']._modules['layers']._modules['0']`` and
    ``self.layers.0`` read alike; a path this cannot split is kept as written (a flattened name's ``L__self___``
    dropped).
    The root module itself (an empty path) is named by its class `cls`; None without either (pure)."""
    if not isinstance(path, str) or not path:
        return cls or None
    rest = _ROOT.sub("", path, count=1)
    if rest == path and path.lower().startswith("l__self___"):
        return path[len("l__self___"):] or cls or None
    parts, at = [], 0
    for m in _STEP.finditer(rest):
        if m.start() != at:
            return path
        parts.append(next(g for g in m.groups() if g is not None))
        at = m.end()
    if at != len(rest):
        return path
    return ".".join(parts) or cls or None


def _compiled_problem(r: dict) -> str | None:
    """Why a compiled GEMM record is not usable (None: usable): a module name, and graph, m, n, k, batch as
    integers (m, n, k, batch >= 1)."""
    if not isinstance(r.get("module"), str) or not r.get("module"):
        return "no module name"
    odd = [c for c in ("graph", "m", "n", "k", "batch") if type(r.get(c)) is not int
           or (c != "graph" and r[c] < 1)]
    return f"{odd[0]} is not a positive integer" if odd else None


def read_compiled_gemms(run_dir, notes: list[str] | None = None) -> list[dict] | None:
    """The compiled GEMM records of a run folder (`recorder.CompiledGemms`), each with its line
    (`runfiles.LINE_KEY`), None when it has none; a line that is not a record is skipped and named on `notes`
    (the others still name their modules)."""
    from pathlib import Path
    p = Path(run_dir) / runfiles.COMPILED_GEMMS_FILE
    if not Path(run_dir).is_dir() or not p.is_file():
        return None
    return runfiles.read_records(p, _compiled_problem, "a compiled GEMM record", notes) or None


def compiled_module_ranges(det, records: list[dict], path=None) -> tuple[pd.DataFrame, str | None]:
    """`det.ranges` with module ranges added for the GEMM ops that compiled code ran (`recorder.CompiledGemms`'
    `records`, read from `path`), so that attribution names their modules as it names eager ones; and a note
    saying how many, and naming (file:line) the records that match no GEMM op of the trace. The trace's own
    ranges (steps, modules) are kept whatever the records hold.

    The ops: the outermost GEMM ops (`trace.GEMM_OPS`) that no module range opened inside their compiled
    region encloses. Each call of compiled code (a ``Torch-Compiled Region`` range; without any, each thread's
    whole span) is matched to the recorded graph that holds the most of its ops' problems (m, n, k, batch; the
    compile id the region names first), and the i-th op of a problem to the graph's i-th node of that problem
    (repeating from its first when the region ran the graph more than once); without regions, ops under no
    module range or under an outermost one (the compiled model's own) count. Two independent GEMMs of one
    problem that Inductor's scheduler swapped are named in each other's place."""
    from cublaslt_probe.analysis.trace import GEMM_OPS
    rng = det.ranges
    ops = det.ops
    if not records:
        return rng, None
    names = [str(k[0]) for k in det.op_keys]
    key = ops["key"].to_numpy()
    name_of = np.array([names[k] if k >= 0 else "" for k in key], dtype=object)
    gemm = np.flatnonzero(np.isin(name_of, list(GEMM_OPS))) if len(ops) else np.zeros(0, dtype=np.int64)
    where = path if path is not None else runfiles.COMPILED_GEMMS_FILE
    if not len(gemm):
        return rng, _unmatched_note(where, records, set(), "the trace has no GEMM op")
    mods = rng[rng["name"].str.startswith(runfiles.MODULE_PREFIX) & ~rng["gpu"].fillna(False).astype(bool)] \
        if len(rng) else rng
    both = _thread_codes(pd.concat([mods[["pid", "tid"]], ops[["pid", "tid"]]], ignore_index=True))
    m_tid, tid = both[:len(mods)], both[len(mods):]     # one code per (process, thread) for ranges and ops
    o_ts, o_end = ops["ts"].to_numpy(dtype=np.float64), ops["end"].to_numpy(dtype=np.float64)
    gemm = gemm[range_parents(o_ts[gemm], o_end[gemm], tid[gemm]) < 0]      # outermost GEMM ops
    regions = np.flatnonzero(np.char.startswith(name_of.astype(str), COMPILED_REGION))
    if len(regions):
        segs = [(o_ts[i], o_end[i], tid[i], name_of[i][len(COMPILED_REGION):].strip(" :")) for i in regions]
    else:
        segs = [(-np.inf, np.inf, t, None) for t in np.unique(tid[gemm])]
    named, regions_named = _segment_modules(segs, _recorded_graphs(records), _gemm_problems(det, key[gemm]),
                                            o_ts[gemm], tid[gemm], mods, m_tid)
    out = []
    for i, rec in named:
        o = gemm[i]
        out.append((runfiles.MODULE_PREFIX + rec["module"], o_ts[o], o_end[o], int(ops["tid"].iloc[o]),
                    int(ops["pid"].iloc[o]) if "pid" in ops.columns else -1))
    used = {id(rec) for _, rec in named}
    if not out:
        return rng, _unmatched_note(where, records, used, "records of another program, or of a compile "
                                                            "the capture did not see")
    add = pd.DataFrame(out, columns=["name", "ts", "end", "tid", "pid"]).assign(gpu=False, device=-1)
    add = add.astype({c: rng[c].dtype for c in add.columns if c in rng.columns})
    note = (f"{len(out):,} GEMM ops of compiled code ({regions_named:,} compiled call"
            f"{'s' if regions_named != 1 else ''}) are named by the module their graph node came from "
            f"(recorded while torch.compile compiled it: {runfiles.COMPILED_GEMMS_FILE}); two GEMMs of one "
            "problem that the compiler reordered may be named in each other's place")
    rest = _unmatched_note(where, records, used, "no GEMM op of the trace matches them")
    return pd.concat([rng, add], ignore_index=True), note + ("; " + rest if rest else "")


def _unmatched_note(path, records: list[dict], used: set, why: str) -> str | None:
    """The records of `records` not in `used` (ids), named by file and line with `why`; None when all were."""
    left = [r.get(runfiles.LINE_KEY, 0) for r in records if id(r) not in used]
    if not left:
        return None
    return (f"{runfiles.where(path, left)}: {len(left):,} of the {len(records):,} compiled GEMM records name no "
            f"GEMM op of this trace ({why}): they name no module; the trace's own steps and module ranges are "
            "kept")


def _gemm_problems(det, keys: np.ndarray) -> list[tuple | None]:
    """The problem (m, n, k, batch) of each op key in `keys` (`trace.problem_of` of `det.op_keys`), None for
    a key whose shapes give none; each distinct key is read once."""
    from cublaslt_probe.analysis.trace import op_key_json, problem_of
    problems: dict[int, tuple | None] = {}
    for k in np.unique(keys).tolist():
        p = problem_of(*op_key_json(det.op_keys[k])[:4])
        problems[k] = (p["m"], p["n"], p["k"], p["batch"]) if p else None
    return [problems[k] for k in keys]


def _recorded_graphs(records: list[dict]) -> dict[int, dict]:
    """The compiled graphs of `records`: graph number -> ``id`` (its compile id) and ``by`` (problem (m, n, k,
    batch) -> the records of its nodes of that problem, in node order)."""
    graphs: dict[int, dict] = {}
    for r in sorted(records, key=lambda r: (r["graph"], r.get("node") if type(r.get("node")) is int else 0)):
        g = graphs.setdefault(r["graph"], {"id": r.get("compile_id"), "by": {}})
        g["by"].setdefault((r["m"], r["n"], r["k"], r["batch"]), []).append(r)
    return graphs


def _segment_modules(segs: list[tuple], graphs: dict[int, dict], prob: list, g_ts: np.ndarray,
                     g_tid: np.ndarray, mods: pd.DataFrame, m_tid: np.ndarray) -> tuple[list[tuple], int]:
    """The modules of the outermost GEMM ops (starts `g_ts`, thread codes `g_tid`, problems `prob`) that the
    calls of compiled code `segs` (start, end, thread code, compile id or None) ran, as `compiled_module_ranges`
    says: (op position, the record naming its module) in naming order, and how many calls named any. An op is named
    once, by the
    first call that holds it; one inside a module range `mods` of its own is left to that range."""
    m_ts = mods["ts"].to_numpy(dtype=np.float64)
    m_end = mods["end"].to_numpy(dtype=np.float64)
    inner = innermost(m_ts, m_end, m_tid, g_ts, g_tid)
    m_parent = range_parents(m_ts, m_end, m_tid)
    named, regions_named = [], 0
    taken = np.zeros(len(g_ts), dtype=bool)
    for s_ts, s_end, s_tid, s_id in segs:
        inside = np.flatnonzero((g_ts >= s_ts) & (g_ts <= s_end) & (g_tid == s_tid) & ~taken)
        if len(mods):   # not inside a module range of its own: the compiled wrapper's, or (no regions) a root's
            j = np.maximum(inner[inside], 0)
            inside = inside[(inner[inside] < 0) | (m_ts[j] < s_ts) | ((m_parent[j] < 0) & (s_id is None))]
        inside = inside[[prob[i] is not None for i in inside]] if len(inside) else inside
        if not len(inside):
            continue
        inside = inside[np.argsort(g_ts[inside], kind="stable")]
        best = max(graphs.items(), key=lambda kv: (sum(prob[i] in kv[1]["by"] for i in inside),
                                                    kv[1]["id"] == s_id, -kv[0]))[1]
        seen: dict[tuple, int] = {}
        named_here = 0
        for i in inside:
            mods_p = best["by"].get(prob[i])
            if not mods_p:
                continue
            n = seen.get(prob[i], 0)
            seen[prob[i]] = n + 1
            named.append((i, mods_p[n % len(mods_p)]))
            taken[i] = True
            named_here += 1
        regions_named += bool(named_here)
    return named, regions_named


def _thread_codes(frame: pd.DataFrame) -> np.ndarray:
    """One integer per (process, thread) of `frame`'s rows."""
    if not len(frame):
        return np.zeros(0, dtype=np.int64)
    return pd.factorize(pd.MultiIndex.from_frame(frame[["pid", "tid"]]))[0].astype(np.int64)
