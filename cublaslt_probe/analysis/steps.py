"""Steps of a trace that has no step marks, found from what the program ran (CPU only).

A trace of a whole script (`cublaslt-probe capture -- SCRIPT`, or a profiler opened around everything) holds
model loading, weight copies and first calls next to the steady state that a performance engineer audits.
`found_steps(det, cpu_ranges, warmup)` cuts it into steps the way the program runs them:

- an optimizer's ``step`` (torch.profiler records ``Optimizer.step#Class.step`` around it): each one ends a
  step, which starts where the previous one ended (the first starts at the first outermost module call before
  it): forward, backward and update together;
- else each call of the outermost module's forward (a module range that no other module range of its thread
  encloses: the capture's ``cublaslt_probe.module:`` ranges, or ``nn.Module:`` python functions): the module
  whose outermost calls took the most CPU time is the model, and each of its calls starts a step that runs to
  the next call's start (sampling, the loss and backward in between belong to it); the last ends at the end of
  its call, or of the backward or optimizer ops that follow it;
- the first `warmup` steps are left out (first calls: cuDNN plans, cuBLAS heuristics, allocator growth); with
  no more steps than that, none is left out.

The steps are returned as CPU ranges (the columns of `trace.TraceDetail.ranges`), one per step, so that audit
places launches in them as in marked steps. `outside_note` says where the GPU time outside the steps went.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from cublaslt_probe import runfiles
from cublaslt_probe.analysis.trace import PY_MODULE_PREFIX
from cublaslt_probe.analysis.trace.ranges import range_parents

WARMUP = 1                                  # steps left out as warm-up by default
OPTIMIZER_PREFIX = "Optimizer.step#"        # torch.profiler's range around an optimizer's step
BACKWARD_PREFIX = "autograd::engine::evaluate_function"
FOUND_PREFIX = "found step "                # the name of a found step range


def _module_name(name: str) -> str:
    for p in (runfiles.MODULE_PREFIX, PY_MODULE_PREFIX):
        if name.startswith(p):
            return name[len(p):]
    return name


def _outermost(mods: pd.DataFrame) -> pd.DataFrame:
    """The module ranges that no other module range of their thread (and process) encloses."""
    key = pd.factorize(pd.MultiIndex.from_frame(mods[["pid", "tid"]]))[0] if len(mods) else np.zeros(0)
    par = range_parents(mods["ts"].to_numpy(), mods["end"].to_numpy(), key)
    return mods[par < 0]


def _ops_named(det, prefix: str) -> pd.DataFrame:
    """The ops of `det` whose name starts with `prefix`."""
    keys = [i for i, k in enumerate(det.op_keys) if str(k[0]).startswith(prefix)]
    return det.ops[det.ops["key"].isin(keys)] if keys else det.ops.iloc[:0]


def _frame(ts, end, pid, tid) -> pd.DataFrame:
    n = len(ts)
    return pd.DataFrame({"name": [f"{FOUND_PREFIX}{i}" for i in range(n)], "ts": np.asarray(ts, dtype=np.float64),
                         "end": np.asarray(end, dtype=np.float64), "tid": np.asarray(tid, dtype=np.int64),
                         "pid": np.asarray(pid, dtype=np.int64), "gpu": np.zeros(n, dtype=bool),
                         "device": np.full(n, -1, dtype=np.int64)})


def found_steps(det, cpu: pd.DataFrame, warmup: int = WARMUP) -> tuple[pd.DataFrame, str, int]:
    """The steps of a trace without step marks (see the module doc) as ranges, a note saying how they were
    found and how many were left out as warm-up, and that number; an empty frame and the reason when none can
    be found. `warmup` < 0 is taken as 0."""
    warmup = max(int(warmup), 0)
    mods = cpu[cpu["name"].str.startswith(runfiles.MODULE_PREFIX) | cpu["name"].str.startswith(PY_MODULE_PREFIX)]
    mods = mods[np.isfinite(mods["ts"].to_numpy()) & (mods["end"].to_numpy() >= mods["ts"].to_numpy())]
    top = _outermost(mods) if len(mods) else mods
    opt = _ops_named(det, OPTIMIZER_PREFIX)
    if len(opt):
        opt = opt.sort_values("ts", kind="stable")
        p = int(opt["pid"].value_counts().index[0])
        opt = opt[opt["pid"] == p]
        ends = opt["end"].to_numpy(dtype=np.float64)
        mine = top[top["pid"] == p] if len(top) else top
        first = float(mine["ts"].min()) if len(mine) and mine["ts"].min() < ends[0] else float(opt["ts"].iloc[0])
        starts = np.concatenate([[first], ends[:-1]])
        how = (f"each optimizer step ({OPTIMIZER_PREFIX}…) ends a step that starts where the previous one "
               f"ended ({len(ends)} in the trace)")
        steps = _frame(starts, ends, np.full(len(ends), p), opt["tid"].to_numpy())
    elif len(top):
        cpu_time = (top["end"] - top["ts"]).groupby(top["name"], sort=False).sum()
        model = str(cpu_time.idxmax())
        calls = top[top["name"] == model].sort_values("ts", kind="stable")
        p = int(calls["pid"].value_counts().index[0])
        calls = calls[calls["pid"] == p]
        ts = calls["ts"].to_numpy(dtype=np.float64)
        ends = np.append(ts[1:], float(calls["end"].iloc[-1]))
        after = pd.concat([_ops_named(det, BACKWARD_PREFIX), _ops_named(det, OPTIMIZER_PREFIX)])
        after = after[(after["pid"] == p) & (after["ts"] >= ts[-1])]
        if len(after):
            ends[-1] = max(ends[-1], float(after["end"].max()))
        how = (f"each call of the outermost module {_module_name(model)}'s forward starts a step that runs to "
               f"the next call ({len(ts)} calls in the trace)")
        steps = _frame(ts, ends, np.full(len(ts), p), calls["tid"].to_numpy())
    else:
        return _frame([], [], [], []), ("no step ranges and no module ranges in the trace: the whole trace counts "
                                        "as one step (model loading and first calls included); capture with "
                                        "cublaslt_probe.capture, or mark steps (torch.profiler's schedule / "
                                        "prof.step()) to audit the steady state"), 0
    n, cut = len(steps), 0
    if n > warmup:
        cut = warmup
        steps = steps.iloc[warmup:].reset_index(drop=True)
        left = (f"the first {warmup} left out as warm-up (audit --warmup N)" if warmup else
                "none left out as warm-up (--warmup 0)")
    else:
        left = f"none left out as warm-up: no more than {warmup} step(s) found"
    return steps, f"no step marks in the trace: steps found from it: {how}; {left}; {len(steps)} audited", cut


def outside_note(L: pd.DataFrame, names: list, inside: np.ndarray, steps_r: pd.DataFrame) -> str | None:
    """Where the GPU time outside the found steps went: before the first step (model loading, weight copies,
    warm-up calls), after the last, and how much of it is memory copies; None when there is none."""
    dur = L["dur"].to_numpy(dtype=np.float64)
    total = float(dur.sum())
    out_us = float(dur[~inside].sum())
    if out_us <= 0 or total <= 0 or not len(steps_r):
        return None
    t_launch = L["t_launch"].to_numpy(dtype=np.float64)
    first = float(steps_r["ts"].min())
    before = ~inside & (t_launch < first)
    after = ~inside & ~before
    copy = np.array([str(names[int(i)]).startswith(("Memcpy", "Memset")) for i in L["name"].to_numpy()],
                    dtype=bool) if len(L) else np.zeros(0, dtype=bool)

    def ms(mask) -> str:
        return f"{float(dur[mask].sum()) / 1e3:,.3f} ms"
    parts = [f"{ms(before)} before the first audited step ({ms(before & copy)} of it memory copies: weights and "
             "inputs moved to the GPU; the rest model set-up and the warm-up calls)"]
    if after.any():
        parts.append(f"{ms(after)} after the last step or between steps outside them")
    return (f"outside the audited steps: {out_us / 1e3:,.3f} ms of the trace's {total / 1e3:,.3f} ms of GPU time "
            f"({100 * out_us / total:.1f} %): " + "; ".join(parts)
            + " — first-call and loading costs, not the steady state; `cublaslt-probe cold-start` explains them")
