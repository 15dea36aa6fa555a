"""`audit(path)`: read a run folder or a bare trace, attribute its GEMM launches (`attribute`), build and judge
the rows (`judge`), and say in ``notes`` what could not be shown (`_missing_notes`). CPU only.

A GEMM counts whatever launched it: every GEMM-kind kernel of the step is in exactly one row, so the rows'
``gpu_us`` add up to the step's GEMM time.
"""
from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from cublaslt_probe.analysis.audit.attribute import (
    _attribute,
    _gpu_facts,
    _in_steps,
    _log_groups,
    _read_env,
    _split_ranges,
    _trace_pids,
    _trace_span,
    _with_facts,
    resolve,
)
from cublaslt_probe.analysis.audit.judge import _fold_helpers, _judges, _rows
from cublaslt_probe.analysis.audit.schema import Audit
from cublaslt_probe.analysis.graphs import GRAPH_OPS, compiled_module_ranges, read_compiled_gemms
from cublaslt_probe.errors import ProbeError
from cublaslt_probe.runfiles import COMPILED_GEMMS_FILE


# --------------------------------------------------------------------------- the audit
def audit(path: str | os.PathLike, log_path: str | os.PathLike | None = None, coldstart: dict | None = None,
          pid: int | None = None, warmup: int | None = None, whole_trace: bool = False) -> Audit:
    """Audit a run folder or a bare trace: one row per distinct GEMM of a step (see the module doc). With
    `coldstart` (a saved `cold-start` result), kernels the process was seen compiling get that provenance with
    ``evidence: observed`` (`coldstart.observed.apply_observed`). `pid`: of a file of several processes (merged rank
    traces), audit only that one (`trace.TraceDetail.for_process`). `warmup`: of a trace without step marks, the
    steps found (`steps.found_steps`) left out first as warm-up (None: the capture's ``warmup``, else 1).
    `whole_trace`: the whole trace is one step, whatever its step marks. When the steps hold under half of the
    trace's GEMM time, ``warning`` says how much is left out and how to count it."""
    from cublaslt_probe.analysis.grouped import join_sizes
    from cublaslt_probe.analysis.stalls import host_stalls
    from cublaslt_probe.analysis.trace import timeline_frame
    files = resolve(path, log_path)
    notes: list[str] = []
    env = _read_env(files["env"], notes)
    s, partial = _read_trace(files["trace"], notes)
    det = s.detail
    pids = [p for p in s.pids if p >= 0]
    if pid is not None:
        det = det.for_process(pid)
    elif len(pids) > 1:
        notes.append(f"the trace holds {len(pids)} processes ({', '.join(map(str, pids[:8]))}"
                     f"{', …' if len(pids) > 8 else ''}): the rows add up all of them, a step is every process's "
                     "step of that number (per-step figures are all processes' together); --pid PID audits one")
    used = set(det.launches["device"].tolist()) if "device" in det.launches.columns else None
    facts, devices = _gpu_facts(env, s.meta, notes, used)
    env = _with_facts(env, facts)
    det.ranges, gpu_ranges = _split_ranges(det)   # attribution and stalls read the CPU ranges
    compiled = read_compiled_gemms(path, notes)
    if compiled:                                  # compiled code runs no module hook: its graphs' records name them
        det.ranges, note = compiled_module_ranges(det, compiled, Path(path) / COMPILED_GEMMS_FILE)
        notes += [note] if note else []
    L, steps, warning = _in_steps(det, env, notes, gpu_ranges, warmup, whole_trace)
    L = _with_graphs(files["trace"], det, L, notes)
    per_name: dict[str, list] = {}
    for i, c, t in L.groupby("name")["dur"].agg(["count", "sum"]).itertuples():
        per_name[det.names[i]] = [int(c), float(t)]
    total_us = float(L["dur"].sum())
    timeline = timeline_frame(per_name, total_us)
    timeline["total_us"] = timeline["total_us"] / steps
    step_gpu = total_us / steps
    naming = (env.get("capture") or {}).get("module_naming")
    G, attribution = _attribute(L[L["kind"] > 0].copy(), det, naming)   # GEMM-kind launches (and orphan reduces)
    G = _fold_helpers(G)
    log_groups = _log_groups(files["log"], notes, _trace_pids(det, env), _trace_span(det, s.meta)) \
        if files["log"] else {}
    G, judges = _judges(G, facts, devices, notes)
    df, no_shape, no_shape_us = _rows(G, det, steps, step_gpu, log_groups, judges, env.get("cublaslt_version"))
    notes += _known_issue_notes(df)
    # grouped rows: recorded or assumed sizes and their roofline, judged by the GPU each row ran on
    df = join_sizes(df, path, env, {f.name: (rates, f.sms) for f, rates in judges}, notes)
    gemm_us = float(G["dur"].sum()) / steps
    notes += _missing_notes(G, det, s.meta, attribution, no_shape, no_shape_us / steps, gemm_us)
    observed = None
    if coldstart is not None:
        from cublaslt_probe.analysis.coldstart.observed import apply_observed
        df, observed = apply_observed(df, coldstart, per_name, steps)
    else:
        df = df.assign(evidence=pd.array(["name"] * len(df), dtype="string"))
    return Audit(rows=df, timeline=timeline, steps=steps, step_gpu_us=step_gpu, gemm_gpu_us=gemm_us, env=env,
                 gpu=facts.name, attribution=attribution, notes=notes,
                 sources={k: str(v) for k, v in files.items() if v is not None},
                 stalls=host_stalls(replace(det, launches=L), steps), observed=observed, partial=partial,
                 warning=warning)


def _known_issue_notes(df: pd.DataFrame) -> list[str]:
    """One note per known issue the audited GEMMs' logged configs meet or can meet, with their GPU time."""
    if "known_issue" not in df.columns:
        return []
    out = []
    for label, g in df[df["known_issue"].notna()].groupby("known_issue", sort=False):
        out.append(f"known issue: {len(g)} GEMM{'s' if len(g) != 1 else ''} ({g['gpu_us'].sum():.1f} µs a step): "
                   f"{label}")
    return out


def _read_trace(trace, notes: list[str]):
    """The detailed read of the Chrome trace `trace` (`trace.read_chrome_trace`) and whether it is partial
    (cut off, or events skipped or read as missing); a note on `notes` names the damage, since the rows
    then count only what was read. A trace with no profiler event raises `ProbeError` naming what to give."""
    from cublaslt_probe.analysis.trace import read_chrome_trace
    s = read_chrome_trace(trace, detail=True)
    if s.stats.events == 0 or (s.stats.bad_events and not s.stats.kernels and not s.stats.cpu_ops):
        raise ProbeError(f"{trace}: no profiler events in it: give a torch.profiler Chrome trace "
                         "(prof.export_chrome_trace, record_shapes=True) or a run folder written by "
                         "cublaslt_probe.capture")
    st = s.stats
    partial = bool(st.truncated or st.bad_events or st.bad_durations or st.bad_ids)
    damage = ((["cut off inside the event array (the events before the cut are audited)"] if st.truncated else [])
              + ([f"{st.bad_events:,} malformed events skipped"] if st.bad_events else [])
              + ([f"{st.bad_durations:,} kernel or copy events without a valid dur (missing, not a number, "
                  "negative, infinite" + (f", or longer than the trace: {st.long_durations:,}" if st.long_durations
                                          else "") + "; counted as 0 µs)"] if st.bad_durations else [])
              + ([f"{st.duplicate_events:,} kernel or copy events repeat another exactly (same name, start, "
                  f"duration, device, stream and ids: written twice) and are counted once "
                  f"({st.duplicate_us:,.1f} µs not counted twice)"] if st.duplicate_events else [])
              + ([f"{st.bad_ids:,} correlation or External ids out of range (read as missing: their kernels are "
                  "not linked)"] if st.bad_ids else [])
              + (["the gzip stream is damaged after the last event (every event was read)"]
                 if st.gzip_damaged_after_events and not st.truncated else []))
    if damage:
        notes.append(f"{trace}: " + "; ".join(damage))
    return s, partial


def _with_graphs(trace, det, L: pd.DataFrame, notes: list[str]) -> pd.DataFrame:
    """The launches `L` with the ``graph`` column: joined to the CUDA graph captures of `trace`
    (`graphs.join`, its notes added to `notes`) where some launch has a launch call but no op (a graph replay)
    or a graph is launched inside an op; else -1 for every launch, with no second read of the trace."""
    if ((L["op_row"].to_numpy() < 0) & (L["t_launch"].to_numpy() != L["ts"].to_numpy())).any() or \
            any(str(k[0]).startswith(GRAPH_OPS) for k in det.op_keys):   # a graph launched inside an op
        from cublaslt_probe.analysis.graphs import join as join_graphs  # unlinked launches with a launch call
        L, graph_notes = join_graphs(trace, det, L)
        notes += graph_notes
        return L
    return L.assign(graph=np.full(len(L), -1, dtype=np.int64))


def _missing_notes(G: pd.DataFrame, det, meta: dict, attribution: str, no_shape: int, no_shape_us: float,
                   gemm_us: float) -> list[str]:
    """What cannot be shown and why, each with the fix that the trace calls for: kernels not linked to their
    ops (no External id, no launch record) are not the same as ops recorded without shapes."""
    if not len(G):
        return []
    out = []
    unseen = G["graph"].to_numpy() == -2     # replayed from a graph captured out of sight: `graphs.join` says so
    if unseen.all():
        return out
    G = G[~unseen]
    linked = G["op_row"].to_numpy() >= 0
    keys = G["key"].to_numpy()
    if not linked.any():
        bare = int(((G["t_launch"] == G["ts"]).to_numpy()).sum())
        why = ("they carry no External id and no launch call's correlation id: the trace has no cuda_runtime "
               "launch events for them" if bare == len(G) else
               "neither their External ids nor their launch calls match a recorded op")
        out.append(f"the GEMM kernels are not linked to the ops that launched them ({why}): module, op and "
                   "shapes cannot be shown; profile with activities=[CPU, CUDA] and export the trace whole "
                   "(cuda_runtime events and External ids kept)")
    elif not any(det.op_keys[k][1] is not None for k in np.unique(keys[keys >= 0])):
        said = meta.get("record_shapes")
        out.append("the ops that launched the GEMMs have no input shapes ("
                   + ("the trace says record_shapes was on, but no op carries Input Dims" if said else
                      "profile with record_shapes=True") + "): m, n, k, dtype, floor and % of peak cannot be shown")
    elif no_shape:
        share = f" ({100 * no_shape_us / gemm_us:.1f} % of GEMM time)" if gemm_us > 0 else ""
        out.append(f"{no_shape} GEMM rows{share} have no shape: their op is not linked or not a GEMM op whose "
                   "inputs give m, n, k")
    if attribution == "none":
        out.append("no module ranges in the trace (capture with cublaslt_probe.capture, or profile with "
                   "with_modules=True): rows are by op and shape")
    return out
