"""`audit`: every GEMM of a profiled step, attributed to its layer and judged against its roofline.

CPU only. Input: a capture run folder (`runfiles`: ``trace.json.gz``, ``cublaslt.log``, ``env.json``) or a bare
torch.profiler trace (with an optional cuBLASLt log). `audit(path)` returns an `Audit` whose ``rows`` hold one row
per distinct GEMM (kernel + problem + module + pass; columns `AUDIT_SCHEMA`), with layers collapsed where they
repeat (``model.layers.*.mlp.down_proj`` ×32); `advice(rows, measure)` turns saved GPU measurements into ranked
advice; `render_text` and `render_html` draw them. docs/audit.md describes each column and rule.

How a GEMM launch is attributed (the trace's own links; `trace.read_chrome_trace(detail=True)` reads them):
- to a step: its launch call's CPU time lies inside a ``runfiles.STEP_PREFIX`` range (else a torch.profiler
  ``ProfilerStep#N`` range; without either the whole trace is one step), the ranges checked first
  (`_step_ranges`); a kernel without a launch record is placed by its GPU time (`_place_by_gpu_time`);
- to a module: its launching op (External id / correlation) lies inside the innermost ``runfiles.MODULE_PREFIX``
  range of its thread (else inside an ``nn.Module: Class_N`` python function of ``with_modules=True``);
- backward: an op inside ``autograd::engine::evaluate_function: XBackward0`` takes that node's ``Sequence
  number``, and the module of the forward op that recorded the same number in its process (``pass`` = bwd).
A GEMM counts whatever launched it: every GEMM-kind kernel of the step is in exactly one row, so the rows'
``gpu_us`` add up to the step's GEMM time.
"""
from __future__ import annotations

import json
import logging
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from cublaslt_probe import runfiles
from cublaslt_probe.errors import ProbeError
from cublaslt_probe.kinds import TILE_CLUSTER, decoded_columns
from cublaslt_probe.trace import TRACE_SCHEMA
from cublaslt_probe.trace import PY_MODULE_PREFIX

log = logging.getLogger(__name__)

# column -> (pandas dtype, meaning): one row per (module pattern, pass, op record, kernel).
AUDIT_SCHEMA: dict[str, tuple[str, str]] = {
    "module": ("string", "module qualified name, layer indices collapsed (model.layers.*.mlp.down_proj); null "
                         "when the trace has no module ranges around the launching op"),
    "instances": ("Int64", "distinct modules collapsed into the row (32 for a layer of a 32-layer model)"),
    "pass": ("category", "fwd, or bwd for a kernel launched by the autograd engine (attributed to the module "
                         "whose forward recorded the same sequence number); null without a module"),
    "op": ("string", "launching torch op (aten::mm, aten::addmm, aten::_grouped_mm, ...)"),
    "dtype": ("category", "torch-view dtype (bf16, fp16, fp32, tf32, fp8, ...): tf32 when the joined log line "
                          "computes in TF32"),
    "layout": TRACE_SCHEMA["layout"],
    "m": ("Int64", "torch view: rows of A and C (grouped: the total over the groups when group_dim is m)"),
    "n": TRACE_SCHEMA["n"],
    "k": TRACE_SCHEMA["k"],
    "batch": ("Int64", "batch count (bmm; 3-D x 3-D grouped GEMM), 1 otherwise"),
    "groups": ("Int64", "grouped GEMM: number of problems; null otherwise"),
    "group_dim": ("category", "grouped GEMM: the dimension its offsets split (m, n or k)"),
    "calls": ("float64", "launches per step"),
    "gpu_us": ("float64", "GPU time per step of all its launches (with their split-K reduces), µs"),
    "mean_us": ("float64", "gpu_us / calls: one launch, µs"),
    "share": ("float64", "fraction of the step's GPU time (every kernel, memcpy and memset)"),
    "kernel": ("string", "the GEMM kernel as the trace names it"),
    "family": ("category", "decoded family (nvjet, xmma, cutlass, ...)"),
    "provenance": ("category", "library-selected, ahead-of-time, runtime-compiled, unknown (decoded)"),
    "evidence": ("string", "what the provenance rests on: name (decoded from the kernel's name) or observed (a "
                           "cold-start run saw the process compile it: `audit --coldstart`)"),
    "kernel_short": TRACE_SCHEMA["kernel_short"],
    "arch": TRACE_SCHEMA["arch"],
    **decoded_columns(*TILE_CLUSTER),
    "problem_shape": TRACE_SCHEMA["problem_shape"],
    "algo": ("string", "the algo the joined cuBLASLt log line records (algoId, tile, stages, cluster, split-K); "
                       "null when no log line matches the GEMM"),
    "algo_id": ("Int64", "logged algoId"),
    "algo_split_k": ("Int64", "logged numSplitsK (1 without split-K)"),
    "log_function": ("category", "logged function: cublasLtMatmul (torch's Lt path) or a cuBLAS wrapper "
                                 "(cublasLtTSTMatmul, ...: the cuBLAS path)"),
    "workspace_bytes": ("Int64", "workspace the logged call passed"),
    "log_calls": ("float64", "matching log lines per step"),
    "log_consistent": ("boolean", "the kernel agrees with the logged algo on tile, cluster, split-K (null: "
                                  "nothing to compare)"),
    "flops": ("float64", "2·m·n·k·batch of one call"),
    "tflops": ("float64", "flops / mean_us / 1e6"),
    "peak_tflops": ("float64", "the GPU's dense peak for the dtype (null: GPU or dtype without a peak)"),
    "pct_peak": ("float64", "tflops / peak_tflops, in %"),
    "floor_us": ("float64", "roofline floor of one call: max(flops / peak, bytes / bandwidth), µs"),
    "bound": ("category", "which floor is higher: compute or memory"),
    "floor_ratio": ("float64", "mean_us / floor_us: 1.0 = at the floor"),
    "waves": ("float64", "CTAs / SMs: ⌈m/tile⌉·⌈n/tile⌉·split-K·batch over the SM count (null: no tile, "
                         "grouped, or split-K factor unknown)"),
    "align_fallback": ("boolean", "the kernel is an alignment fallback: it says align1/align2 (under 16 "
                                  "bytes) or is built for an older architecture than the GPU, and a leading "
                                  "dimension of the problem is not 16-byte aligned"),
    "misaligned": ("string", "the operands whose leading dimension is not a multiple of 16 bytes (A ld=50257)"),
    "split_k": ("boolean", "split-K: the name says so, the log's numSplitsK > 1, or a reduce kernel followed"),
    "reduce_us": ("float64", "part of gpu_us in split-K reduce kernels"),
    "helper_us": ("float64", "part of gpu_us in the other GEMM-kind kernels the same op call launched (torch's "
                             "prepare_grouped_gemm_data before a grouped GEMM): the row's kernel is the longest"),
    "shape_from": ("category", "where m, n, k come from: op (the torch op's inputs), kernel arguments (an "
                               "Inductor Triton template's first two inputs, A [m, k] and B [k, n]: inferred), "
                               "null when they could not be rebuilt"),
    "input_dims": TRACE_SCHEMA["input_dims"],
    "input_strides": TRACE_SCHEMA["input_strides"],
    "gpu": ("string", "the GPU its launches ran on, whose peaks and SM count judge it (a trace of several kinds "
                      "of GPU has a row per kind)"),
}
AUDIT_COLUMNS = list(AUDIT_SCHEMA)
# The keys every jsonl row carries in this order (the rest follow).
FIXED_KEYS = ("module", "op", "dtype", "layout", "m", "n", "k", "batch", "groups", "calls", "gpu_us", "share",
              "kernel", "family", "provenance", "algo", "tflops", "pct_peak", "floor_us", "waves",
              "align_fallback", "split_k")

BYTES = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "fp8_e5m2": 1, "fp64": 8}
OUT_BYTES = {"fp8": 2, "fp8_e5m2": 2}          # fp8 GEMMs write bf16
EVAL_PREFIX = "autograd::engine::evaluate_function: "
NEAR_FLOOR = 1.10                              # within 10 % of the floor: nothing left to win
_CLASS_ORDER = re.compile(r"(\w*[^\W\d]\w*?)_\d+")   # <class>_<order>: a class of any script, then digits


def _na(v) -> bool:
    return v is None or (not isinstance(v, str) and pd.isna(v))


@dataclass
class Audit:
    """The audit of one run: ``rows`` (`AUDIT_SCHEMA`), the step's GPU time by class, and what could not be
    shown (``notes``: one line each)."""

    rows: pd.DataFrame
    timeline: pd.DataFrame                # per step: kind, provenance, family, kernels, launches, total_us, share
    steps: int
    step_gpu_us: float                    # GPU time per step, every kernel
    gemm_gpu_us: float                    # per step, GEMM-kind kernels (with their reduces)
    env: dict                             # env.json's usable fields, GPU facts as used (`_read_env`, `_gpu_facts`)
    gpu: str | None
    attribution: str                      # capture ranges | nn.Module | none
    notes: list[str] = field(default_factory=list)
    sources: dict[str, str] = field(default_factory=dict)
    stalls: pd.DataFrame | None = None    # host stalls of the step (`stalls.host_stalls`)
    observed: dict | None = None          # cold-start evidence applied (`coldstart.apply_observed`)
    partial: bool = False                 # the trace was damaged (cut off, malformed events, durations lost)

    @property
    def attributed_share(self) -> float:
        """Fraction of the step's GEMM time in rows that have a module."""
        if not self.gemm_gpu_us:
            return 0.0
        return float(self.rows.loc[self.rows["module"].notna(), "gpu_us"].sum() / self.gemm_gpu_us)


# --------------------------------------------------------------------------- input
def resolve(path: str | os.PathLike, log_path: str | os.PathLike | None = None) -> dict[str, Path | None]:
    """The trace, log and env files of a run folder or a bare trace (`runfiles`)."""
    p = Path(path)
    if p.is_dir():
        trace = p / runfiles.TRACE_FILE
        if not trace.exists():
            raise ProbeError(f"{p}: no {runfiles.TRACE_FILE} in this folder: give a run folder written by "
                             "`cublaslt_probe.capture` or a torch.profiler trace file")
        lg = Path(log_path) if log_path else (p / runfiles.LOG_FILE if (p / runfiles.LOG_FILE).exists() else None)
        env = p / runfiles.ENV_FILE if (p / runfiles.ENV_FILE).exists() else None
        return {"trace": trace, "log": lg, "env": env}
    if not p.exists():
        raise ProbeError(f"cannot read {p}: no such file or folder")
    return {"trace": p, "log": Path(log_path) if log_path else None, "env": None}


def _count(v) -> int | None:
    """A positive count from an int, an integral float or a string of digits; None otherwise."""
    if isinstance(v, bool):
        return None
    if isinstance(v, str) and v.strip().isdigit():
        v = int(v.strip())
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    return v if isinstance(v, int) and v > 0 else None


def _cc(v) -> str | None:
    """A compute capability as ``"9.0"`` from ``"9.0"``, ``9.0`` or ``9``; None otherwise."""
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)) and math.isfinite(v) and v > 0:
        v = f"{float(v):.1f}"
    if isinstance(v, str) and re.fullmatch(r"\d{1,2}(\.\d)?", v.strip()):
        return v.strip() if "." in v else f"{v.strip()}.0"
    return None


def _text(v) -> str | None:
    return v.strip() if isinstance(v, str) and v.strip() else None


def _flag(v) -> bool | None:
    return v if isinstance(v, bool) else None


# The env.json fields audit reads: (the check that makes one usable (None: not usable), what it expects).
ENV_FIELDS = {"gpu": (_text, "a name"), "sm_count": (_count, "a count"), "cc": (_cc, 'like "9.0"'),
              "pid": (_count, "a process id")}
CAPTURE_FIELDS = {"steps": (_count, "a count"), "allow_tf32": (_flag, "true or false")}


def _read_env(path: Path | None, notes: list[str]) -> dict:
    """env.json as a dict whose fields audit reads (`ENV_FIELDS`, ``capture`` `CAPTURE_FIELDS`) are usable:
    each is checked on its own, a usable one is kept (``"sm_count": "132"`` as 132, ``"cc": 9.0`` as
    ``"9.0"``) and an unusable one is left out with a note, so one bad field costs only itself. A file that
    is not a JSON object is left out whole, with a note."""
    if path is None:
        return {}
    try:
        doc = json.loads(path.read_text(encoding="utf-8-sig"))
    except (OSError, ValueError) as e:
        notes.append(f"{path}: unreadable environment ({e}); GPU facts come from the trace")
        return {}
    if not isinstance(doc, dict):
        notes.append(f"{path}: not a JSON object (a {type(doc).__name__}): left out; GPU facts come from the trace")
        return {}
    env, bad = dict(doc), []
    _check_fields(env, ENV_FIELDS, "", bad)
    cap = env.get("capture")
    if isinstance(cap, dict):
        env["capture"] = cap = dict(cap)
        _check_fields(cap, CAPTURE_FIELDS, "capture.", bad)
    elif cap is not None:
        bad.append(f"capture={_short(env.pop('capture'))} (expected an object)")
    if bad:
        notes.append(f"{path}: unusable field(s) left out: {'; '.join(bad)}")
    return env


def _check_fields(d: dict, fields: dict, prefix: str, bad: list[str]) -> None:
    """Replace each of `fields` in `d` by its checked value; drop (and list in `bad`) the unusable ones."""
    for k, (check, expected) in fields.items():
        if d.get(k) is not None:
            v = check(d[k])
            if v is None:
                bad.append(f"{prefix}{k}={_short(d.pop(k))} (expected {expected})")
            else:
                d[k] = v


def _short(v, n: int = 40) -> str:
    """A field's value as a note quotes it: JSON, cut to `n` characters; a non-finite number by its kind."""
    if isinstance(v, float) and not math.isfinite(v):
        return "(not a finite number)"
    t = json.dumps(v, default=str)
    return t if len(t) <= n else t[:n - 1] + "…"


# --------------------------------------------------------------------------- rates
def gpu_rates(gpu: str | None) -> tuple[dict | None, float | None, str | None]:
    """(dense peak TFLOP/s by dtype, HBM TB/s, source) of a GPU (`kinds.gpu_peaks`); Nones when unknown."""
    from cublaslt_probe.kinds import gpu_peaks
    p = gpu_peaks(gpu)
    return (dict(p.tflops), p.hbm_tbps, p.describe()) if p else (None, None, None)


# --------------------------------------------------------------------------- attribution
def _innermost(r_ts, r_end, r_tid, p_ts, p_tid) -> np.ndarray:
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


def _contained(r_ts, r_end, pts) -> np.ndarray:
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


def _range_parents(r_ts, r_end, r_tid) -> np.ndarray:
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


def collapse(name: str, class_order: bool | None = None) -> str:
    """Repeated layers as one module name.

    - An attribute path (``module_naming`` qualified: ``model.layers.3.mlp``): a component that is all
      digits is a container's index and becomes ``*`` (``model.layers.*.mlp``); nothing else changes, since
      ``conv_1``, ``mlp_3`` or ``conv2d_1x1`` are attributes a model names on purpose.
    - Class-and-order names (``class_order``: global hooks, ``nn.Module:`` ranges, ``Model_0.LlamaMLP_3``):
      every component is ``<class>_<order>``, and the order becomes ``*`` whatever the class's name
      (``_LoRALinear_3``, ``mlp_3``, ``Modèle_0`` -> ``_LoRALinear_*``, ``mlp_*``, ``Modèle_*``).

    `class_order` None decides from the name: class-and-order when every component is ``<class>_<digits>``
    (`audit` decides once per trace, from all its module names, `_class_order`)."""
    parts = name.split(".")
    if class_order is None:
        class_order = all(_CLASS_ORDER.fullmatch(p) for p in parts)
    if class_order:
        return ".".join("*" if p.isdigit() else _CLASS_ORDER.sub(r"\1_*", p) if _CLASS_ORDER.fullmatch(p) else p
                        for p in parts)
    return ".".join("*" if p.isdigit() else p for p in parts)


def _class_order(names: list[str], naming: str | None) -> bool:
    """Whether a trace's module names are class-and-order names: as the capture recorded
    (``module_naming``), else when every component of every name is ``<class>_<digits>``."""
    if naming in ("class_order", "qualified"):
        return naming == "class_order"
    return bool(names) and all(_CLASS_ORDER.fullmatch(p) for n in names for p in n.split("."))


# --------------------------------------------------------------------------- log join
def _log_dtype(rec) -> str | None:
    from cublaslt_probe.logs import short_dtype
    a, b = short_dtype(rec.a_type), short_dtype(rec.b_type)
    if a == "fp32":
        return "tf32" if rec.compute_type and "TF32" in rec.compute_type else "fp32"
    if a and a.startswith("fp8"):
        return "fp8" if (a, b) == ("fp8_e4m3", "fp8_e4m3") else "fp8_e5m2" if (a, b) == ("fp8_e5m2", "fp8_e4m3") \
            else f"{a}x{b}"
    return a


def _algo_text(rec) -> str:
    parts = [f"algo {rec.algo_id}"]
    if rec.tile:
        parts.append(f"tile {rec.tile}")
    if rec.algo_stages:
        parts.append(f"stages {rec.algo_stages}")
    if rec.cluster:
        parts.append(f"cluster {rec.cluster}")
    if rec.num_splits_k and rec.num_splits_k > 1:
        parts.append(f"splitK {rec.num_splits_k}")
    if rec.custom_option:
        parts.append(f"custom {rec.custom_option}")
    return " ".join(parts)


TZ_STEP_S = 900          # time zones are whole quarter hours apart
TZ_MAX_S = 14 * 3600     # ... and at most 14 hours from UTC
CLOCK_SLACK_S = 2.0      # the log's times are whole seconds


def _log_groups(log_path: Path, notes: list[str], pids: set[int] | None = None,
                span: tuple[float, float] | None = None) -> dict[tuple, list]:
    """Matmul trace lines of a cuBLASLt log grouped by torch-view problem (m, n, k, batch, layout, dtype
    family): {key: [records]}.

    Only the lines of the trace's process(es) (`pids`, each line's ``[pid]``) are joined; a log whose lines'
    times do not meet the trace's `span` (seconds since the epoch, UTC; `_trace_span`) is of another run and
    is not joined. The log writes local time: its times are compared in every time zone (quarter hours
    within 14 hours of UTC)."""
    from cublaslt_probe.logs import LogReadError, ParseStats, parse_log
    st = ParseStats()
    recs: list = []
    try:
        for r in parse_log(str(log_path), stats=st):
            if r.kind == "trace" and r.torch_m is not None:
                recs.append(r)
    except LogReadError as e:
        notes.append(f"{log_path}: cannot be read ({e}): the logged algos cannot be shown")
        return {}
    if not recs:
        notes.append(f"{log_path}: no matmul trace lines (a cuBLASLt log at level 2 or more has one per call): "
                     "the logged algos cannot be shown")
        return {}
    if pids:
        others = sorted({r.pid for r in recs if r.pid is not None and r.pid not in pids})
        if others:
            mine = [r for r in recs if r.pid is None or r.pid in pids]
            what = f"process {', '.join(map(str, others[:5]))}{', …' if len(others) > 5 else ''}"
            if not mine:
                notes.append(f"{log_path}: its lines are of {what}, the trace of process "
                             f"{', '.join(map(str, sorted(pids)))}: another process's log is not joined (give "
                             "the log of the same run with --log)")
                return {}
            notes.append(f"{log_path}: {len(recs) - len(mine):,} lines of {what} (not in the trace) are left out")
            recs = mine
    if span is not None:
        got = _log_span(recs)
        if got is not None and not _meets(got, span):
            notes.append(f"{log_path}: its lines were written {_utc(got[0])}–{_utc(got[1])} (local time), the "
                         f"trace was taken {_utc(span[0])}–{_utc(span[1])} UTC: a log of another run is not joined "
                         "(give the log of the same run with --log)")
            return {}
    out: dict[tuple, list] = {}
    for r in recs:
        layout = (r.op_b or "N")[:1] + (r.op_a or "N")[:1]
        dt = _log_dtype(r)
        key = (r.torch_m, r.torch_n, r.torch_k, r.batch_count or 1, layout, "fp32" if dt == "tf32" else dt)
        out.setdefault(key, []).append(r)
    return out


def _log_span(recs: list) -> tuple[float, float] | None:
    """First and last time of the log lines, as seconds of their (local) clock; None without times."""
    from datetime import datetime, timezone
    times = [r.time for r in recs if isinstance(r.time, str)]
    if not times:
        return None
    try:
        lo, hi = (datetime.strptime(t.strip()[:19], "%Y-%m-%d %H:%M:%S").replace(tzinfo=timezone.utc).timestamp()
                  for t in (min(times), max(times)))
    except ValueError:
        return None
    return lo, hi + 1.0


def _meets(log_span: tuple[float, float], span: tuple[float, float]) -> bool:
    """Whether the log's span (local clock) overlaps the trace's (UTC) in some time zone."""
    lo, hi = span[0] - CLOCK_SLACK_S, span[1] + CLOCK_SLACK_S
    return any(log_span[0] - o <= hi and log_span[1] - o >= lo for o in range(-TZ_MAX_S, TZ_MAX_S + 1, TZ_STEP_S))


def _utc(t: float) -> str:
    from datetime import datetime, timezone
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def _trace_pids(det, env: dict) -> set[int] | None:
    """The processes whose ops the trace holds (env.json's ``pid`` when the trace does not tell)."""
    if "pid" in det.ops.columns and len(det.ops):
        return {int(p) for p in pd.unique(det.ops["pid"]) if not _na(p) and int(p) > 0} or None
    return {env["pid"]} if env.get("pid") else None


def _trace_span(det, meta: dict) -> tuple[float, float] | None:
    """The trace's first and last event time in seconds since the epoch (UTC): Kineto's timestamps are µs
    after ``baseTimeNanoseconds``; without it, timestamps that read as this century's epoch µs are taken as
    such. None when the trace's clock is not the wall clock."""
    t = np.concatenate([det.launches["ts"].to_numpy(), (det.launches["ts"] + det.launches["dur"]).to_numpy(),
                        det.ops["ts"].to_numpy(), det.ops["end"].to_numpy()]).astype(np.float64)
    t = t[np.isfinite(t)]
    if not len(t):
        return None
    base = meta.get("baseTimeNanoseconds")
    if type(base) is int and base > 0:
        lo, hi = base / 1e9 + t.min() / 1e6, base / 1e9 + t.max() / 1e6
    else:
        lo, hi = t.min() / 1e6, t.max() / 1e6
    return (lo, hi) if 946684800 <= lo <= hi <= 4102444800 else None     # 2000 .. 2100


def _join_log(row: dict, kn, groups: dict[tuple, list], steps: int) -> None:
    from cublaslt_probe.evidence import consistency
    if not groups or _na(row.get("m")) or _na(row.get("layout")):
        return
    dt = row.get("dtype")
    key = (row["m"], row["n"], row["k"], row.get("batch") or 1, row["layout"], "fp32" if dt == "tf32" else dt)
    recs = groups.get(key)
    if not recs:
        return
    by_algo: dict[str, list] = {}
    for r in recs:
        by_algo.setdefault(_algo_text(r), []).append(r)
    # the algo that agrees with the kernel that ran, else the most frequent
    ranked = sorted(by_algo.items(), key=lambda kv: -len(kv[1]))
    pick = next(((a, rs) for a, rs in ranked if consistency(kn, rs[0]) is not False), ranked[0])
    text, rs = pick
    r = rs[0]
    row.update(algo=text if len(by_algo) == 1 else f"{text} (+{len(by_algo) - 1} other algos logged)",
               algo_id=r.algo_id, algo_split_k=r.num_splits_k or 1, log_function=r.function,
               workspace_bytes=r.workspace_bytes, log_calls=len(recs) / steps,
               log_consistent=consistency(kn, r))
    ld = _log_dtype(r)
    if ld == "tf32" and dt == "fp32":
        row["dtype"] = "tf32"


# --------------------------------------------------------------------------- per-row judgement
def _leading_dims(dims_json, strides_json, op) -> list[tuple[str, int]]:
    """(operand, leading dimension in elements) of A and B from the op's recorded dims and strides."""
    from cublaslt_probe.trace import GEMM_OPS
    where = GEMM_OPS.get(op or "")
    if where is None or not dims_json or not strides_json:
        return []
    try:
        dims, strides = json.loads(dims_json), json.loads(strides_json)
        out = []
        for label, i in (("A", where[0]), ("B", where[1])):
            d, s = dims[i], strides[i]
            if len(d) < 2 or len(s) != len(d):
                continue
            (r, c), (s0, s1) = d[-2:], s[-2:]
            if s1 == 1 and r > 1:
                out.append((label, s0))
            elif s0 == 1 and c > 1:
                out.append((label, s1))
        return out
    except (ValueError, IndexError, TypeError):
        return []


def _arch_num(arch: str | None) -> int | None:
    m = re.match(r"sm_?(\d+)", arch or "")
    return int(m.group(1)) if m else None


def _judge(row: dict, kn, rates: tuple, sms: int | None, gpu_arch: int | None) -> None:
    """flops, tflops, % of peak, roofline floor, waves, alignment fallback of one row (in place), with the
    rates (`gpu_rates`), SM count and architecture of the GPU it ran on."""
    from cublaslt_probe.evidence import logged_tile
    m, n, k, b = row.get("m"), row.get("n"), row.get("k"), row.get("batch") or 1
    dt = row.get("dtype")
    mean = row["mean_us"]
    if any(_na(x) for x in (m, n, k)):
        return
    flops = 2.0 * m * n * k * b
    row["flops"] = flops
    row["tflops"] = flops / mean / 1e6 if mean else None
    peaks, bw, _ = rates
    nb = BYTES.get(dt or "")
    peak = peaks.get(dt) if peaks and dt else None
    if peak:
        row["peak_tflops"] = peak
        row["pct_peak"] = 100 * row["tflops"] / peak if not _na(row["tflops"]) else None
    if peak and bw and nb:
        nbytes = (m * k + k * n) * b * nb + m * n * b * OUT_BYTES.get(dt, nb)
        t_mem = nbytes / (bw * 1e12) * 1e6
        t_cmp = flops / (peak * 1e12) * 1e6
        row["floor_us"] = max(t_mem, t_cmp)
        row["bound"] = "memory" if t_mem > t_cmp else "compute"
        row["floor_ratio"] = mean / row["floor_us"] if row["floor_us"] else None
    # waves: the tile in cuBLAS's column-major order against blas_m = torch n, blas_n = torch m
    tile = logged_tile(kn)
    split = row.get("algo_split_k")
    if _na(split):
        split = 1 if kn.split_k is False or (kn.split_k is None and not row.get("split_k")) else None
    if tile and sms and split and _na(row.get("groups")):
        from cublaslt_probe.explain import waves
        row["waves"] = waves(n, m, tile[0], tile[1], split, b, sms)["waves"]
    # alignment: leading dimensions in bytes
    lds = _leading_dims(row.get("input_dims"), row.get("input_strides"), row.get("op"))
    if nb:
        bad = [f"{lab} ld={ld}" for lab, ld in lds if (ld * nb) % 16]
        if (n * OUT_BYTES.get(dt, nb)) % 16:
            bad.append(f"C ld={n}")
        row["misaligned"] = ", ".join(bad) or None
        aligns = [a for a in (kn.align_a, kn.align_b, kn.align_c) if a]
        small = any(a * nb < 16 for a in aligns)
        karch = _arch_num(kn.arch)
        older = karch is not None and gpu_arch is not None and karch < gpu_arch
        row["align_fallback"] = bool(bad) and (small or older)


# --------------------------------------------------------------------------- the audit
def audit(path: str | os.PathLike, log_path: str | os.PathLike | None = None, coldstart: dict | None = None,
          pid: int | None = None) -> Audit:
    """Audit a run folder or a bare trace: one row per distinct GEMM of a step (see the module doc). With
    `coldstart` (a saved `cold-start` result), kernels the process was seen compiling get that provenance with
    ``evidence: observed`` (`coldstart.apply_observed`). `pid`: of a file of several processes (merged rank
    traces), audit only that one (`trace.TraceDetail.for_process`)."""
    from cublaslt_probe.stalls import host_stalls
    from cublaslt_probe.trace import read_chrome_trace, timeline_frame
    files = resolve(path, log_path)
    notes: list[str] = []
    env = _read_env(files["env"], notes)
    s = read_chrome_trace(files["trace"], detail=True)
    if s.stats.events == 0 or (s.stats.bad_events and not s.stats.kernels and not s.stats.cpu_ops):
        raise ProbeError(f"{files['trace']}: no profiler events in it: give a torch.profiler Chrome trace "
                         "(prof.export_chrome_trace, record_shapes=True) or a run folder written by "
                         "cublaslt_probe.capture")
    det = s.detail
    st = s.stats
    partial = bool(st.truncated or st.bad_events or st.bad_durations or st.bad_ids)
    damage = ((["cut off inside the event array (the events before the cut are audited)"] if st.truncated else [])
              + ([f"{st.bad_events:,} malformed events skipped"] if st.bad_events else [])
              + ([f"{st.bad_durations:,} kernel or copy events without a valid dur (missing, not a number, "
                  "negative or infinite: counted as 0 µs)"] if st.bad_durations else [])
              + ([f"{st.bad_ids:,} correlation or External ids out of range (read as missing: their kernels are "
                  "not linked)"] if st.bad_ids else [])
              + (["the gzip stream is damaged after the last event (every event was read)"]
                 if st.gzip_damaged_after_events and not st.truncated else []))
    if damage:
        notes.append(f"{files['trace']}: " + "; ".join(damage))
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
    L, steps = _in_steps(det, env, notes, gpu_ranges)
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
    df, no_shape, no_shape_us = _rows(G, det, steps, step_gpu, log_groups, judges)
    gemm_us = float(G["dur"].sum()) / steps
    notes += _missing_notes(G, det, s.meta, attribution, no_shape, no_shape_us / steps, gemm_us)
    observed = None
    if coldstart is not None:
        from cublaslt_probe.coldstart import apply_observed
        df, observed = apply_observed(df, coldstart, per_name, steps)
    else:
        df = df.assign(evidence=pd.array(["name"] * len(df), dtype="string"))
    return Audit(rows=df, timeline=timeline, steps=steps, step_gpu_us=step_gpu, gemm_gpu_us=gemm_us, env=env,
                 gpu=facts.name, attribution=attribution, notes=notes,
                 sources={k: str(v) for k, v in files.items() if v is not None},
                 stalls=host_stalls(det, steps), observed=observed, partial=partial)


def _missing_notes(G: pd.DataFrame, det, meta: dict, attribution: str, no_shape: int, no_shape_us: float,
                   gemm_us: float) -> list[str]:
    """What cannot be shown and why, each with the fix that the trace calls for: kernels not linked to their
    ops (no External id, no launch record) are not the same as ops recorded without shapes."""
    if not len(G):
        return []
    out = []
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


@dataclass(frozen=True)
class GpuFacts:
    """What audit uses of one GPU: its name (peak rates), SM count (waves), compute capability like ``"9.0"``
    (an older-architecture kernel is an alignment fallback)."""

    name: str | None = None
    sms: int | None = None
    cc: str | None = None

    @property
    def arch(self) -> int | None:
        return int(self.cc.replace(".", "")) if self.cc else None

    def describe(self) -> str:
        extra = [f"{self.sms} SMs" if self.sms else "", f"cc {self.cc}" if self.cc else ""]
        return (self.name or "an unnamed GPU") + (f" ({', '.join(x for x in extra if x)})" if any(extra) else "")


def _same_gpu(a: str, b: str) -> bool:
    def norm(x):
        x = x.strip().casefold()
        return x[len("nvidia "):] if x.startswith("nvidia ") else x
    return norm(a) == norm(b)


def _trace_devices(meta: dict) -> dict[int, GpuFacts]:
    """The trace's GPUs by device id (Kineto's ``deviceProperties``: a list, or one object); fields of
    another type are left out."""
    props = meta.get("deviceProperties")
    props = [props] if isinstance(props, dict) else props if isinstance(props, list) else []
    out: dict[int, GpuFacts] = {}
    for i, p in enumerate(props):
        if not isinstance(p, dict):
            continue
        did = p.get("id")
        major, minor = _count(p.get("computeMajor")), p.get("computeMinor", 0)
        cc = _cc(f"{major}.{minor}") if major and type(minor) is int and 0 <= minor <= 9 else None
        out[did if type(did) is int else i] = GpuFacts(_text(p.get("name")), _count(p.get("numSms")), cc)
    return out


def _gpu_facts(env: dict, meta: dict, notes: list[str], used: set | None = None
               ) -> tuple[GpuFacts, dict[int, GpuFacts]]:
    """The run's GPU facts, and each trace device's (of the devices `used` by its kernels, when the trace
    describes them: a machine's other GPUs are listed too).

    The trace's ``deviceProperties`` describe the GPUs that ran the trace, so they win where env.json (written
    by the capture, or copied from another run) disagrees; env.json fills in what the trace does not record
    when it names the same GPU or the trace names none. A trace of several kinds of GPU has no single facts:
    each launch is judged with its own device's (the run's facts then hold the names only)."""
    devs = _trace_devices(meta)
    if used and used & set(devs):
        devs = {d: f for d, f in devs.items() if d in used}
    e = GpuFacts(env.get("gpu"), env.get("sm_count"), env.get("cc"))
    kinds = list(dict.fromkeys(devs.values()))
    if not kinds:
        return e, {}
    if len(kinds) > 1:
        notes.append(f"the trace holds {len(kinds)} kinds of GPU ("
                     + "; ".join(f"device {d}: {f.describe()}" for d, f in sorted(devs.items()))
                     + "): each GEMM is judged with the peaks and SM count of the device it ran on")
        return GpuFacts(", ".join(dict.fromkeys(f.name for f in kinds if f.name)) or None), devs
    t = kinds[0]
    same = not t.name or not e.name or _same_gpu(t.name, e.name)
    fields = (("name", "GPU"), ("sms", "SM count"), ("cc", "compute capability"))
    differ = [label for f, label in fields if getattr(e, f) is not None and getattr(t, f) is not None
              and getattr(e, f) != getattr(t, f) and not (f == "name" and same)]
    if not same:
        differ = [label for _, label in fields]
    filled = {f: getattr(e, f) for f, _ in fields if getattr(t, f) is None and getattr(e, f) is not None} \
        if same and not differ else {}
    facts = GpuFacts(**{f: getattr(t, f) if getattr(t, f) is not None else filled.get(f) for f, _ in fields})
    if differ:
        from_trace = [label for f, label in fields if getattr(t, f) is not None]
        notes.append(f"env.json says {e.describe()} but the trace's deviceProperties record {t.describe()}: "
                     f"peaks, waves and alignment use the trace's {', '.join(from_trace)}"
                     + ("" if same else " and nothing of env.json's (another GPU's)"))
    return facts, {d: facts for d in devs}


def _with_facts(env: dict, facts: GpuFacts) -> dict:
    """env.json's fields with the GPU facts the audit uses in place of its own (`_gpu_facts`)."""
    out = dict(env)
    for key, v in (("gpu", facts.name), ("sm_count", facts.sms), ("cc", facts.cc)):
        if v is None:
            out.pop(key, None)
        else:
            out[key] = v
    return out


def _judges(G: pd.DataFrame, facts: GpuFacts, devices: dict[int, GpuFacts], notes: list[str]
            ) -> tuple[pd.DataFrame, list[tuple[GpuFacts, tuple]]]:
    """Each launch's kind of GPU (column ``judge``) and, per kind, its facts and rates (`gpu_rates`) that its
    rows are judged with: the run's facts, or with several kinds of GPU in the trace its launch's device's."""
    kinds = list(dict.fromkeys(devices.values())) if len(set(devices.values())) > 1 else [facts]
    judge = np.zeros(len(G), dtype=np.int64)
    if len(kinds) > 1:
        dev = G["device"].to_numpy() if "device" in G.columns else np.full(len(G), -1)
        judge = np.array([kinds.index(devices[d]) if d in devices else len(kinds) for d in dev.tolist()],
                         dtype=np.int64)
        kinds.append(GpuFacts())                  # a device the trace does not describe
    out = []
    for k in kinds:
        rates = gpu_rates(k.name)
        if rates[0] is None and (judge == len(out)).any():
            notes.append(f"no peak rates for GPU {k.name or '(not recorded)'}: floor_us and pct_peak cannot be "
                         "shown" + (" for its GEMMs" if len(kinds) > 1 else ""))
        out.append((k, rates))
    return G.assign(judge=judge), out


GAP_US = 10.0     # a kernel that starts this soon after the GPU's previous work ended was queued behind it


def _split_ranges(det) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The trace's ranges on the CPU (where ops and launches are) and their copies on the GPU timeline
    (``gpu`` column; Kineto's ``gpu_user_annotation``: the GPU time of the kernels launched inside)."""
    rng = det.ranges
    if "gpu" not in rng.columns or not len(rng):
        return rng, rng.iloc[:0]
    gpu = rng["gpu"].fillna(False).to_numpy(dtype=bool)
    return rng[~gpu], rng[gpu]


def _step_ranges(cpu: pd.DataFrame, notes: list[str]) -> pd.DataFrame:
    """The step ranges (the capture's, else torch.profiler's ``ProfilerStep#N``) that are steps.

    - A range written more than once (same name, start, end, process and thread: a file merged or exported
      twice) is one step.
    - A range that encloses other step ranges of its thread (an outer ``step`` around the loop) is a stretch
      of steps, not a step.
    - Ranges of several threads or processes may overlap in time: `_contained` gives each launch one of them
      (its own process's first), and `_step_count` says how many steps they stand for."""
    if not len(cpu):
        return cpu
    steps = cpu[cpu["name"].str.startswith(runfiles.STEP_PREFIX)]
    if not len(steps):
        steps = cpu[cpu["name"].str.startswith("ProfilerStep#")]
    if not len(steps):
        return steps
    ok = np.isfinite(steps["ts"].to_numpy()) & np.isfinite(steps["end"].to_numpy()) & \
        (steps["end"].to_numpy() >= steps["ts"].to_numpy())
    if not ok.all():
        notes.append(f"{int((~ok).sum()):,} step ranges without a valid start and end are not steps")
        steps = steps[ok]
    dup = steps.duplicated(["name", "ts", "end", *(c for c in ("pid", "tid") if c in steps.columns)])
    if dup.any():
        notes.append(f"{int(dup.sum()):,} step ranges written more than once (same name, start, end and thread) "
                     "are counted once")
        steps = steps[~dup]
    group = pd.factorize(pd.MultiIndex.from_frame(steps[[c for c in ("pid", "tid") if c in steps.columns]]))[0] \
        if "tid" in steps.columns else np.zeros(len(steps), dtype=np.int64)
    encl = np.zeros(len(steps), dtype=bool)
    ts, end = steps["ts"].to_numpy(), steps["end"].to_numpy()
    for g in np.unique(group):
        gi = np.flatnonzero(group == g)
        iv = np.unique(np.stack([ts[gi], -end[gi]], axis=1), axis=0)      # distinct spans: start up, end down
        later_min = np.minimum.accumulate((-iv[:, 1])[::-1])[::-1]        # the least end from here on
        outer = np.zeros(len(iv), dtype=bool)
        outer[:-1] = later_min[1:] <= -iv[:-1, 1]                         # a later-starting span ends inside
        bad = {(a, -b) for a, b in iv[outer]}
        encl[gi] = [(t, e) in bad for t, e in zip(ts[gi].tolist(), end[gi].tolist())]
    if encl.any():
        names = sorted(set(steps["name"][encl]))
        notes.append(f"{int(encl.sum()):,} step range(s) enclose other step ranges ({', '.join(names[:3])}"
                     f"{', …' if len(names) > 3 else ''}): a stretch of steps, not a step")
        steps = steps[~encl]
    o = np.argsort(steps["ts"].to_numpy(), kind="stable")
    t_sorted, e_sorted = steps["ts"].to_numpy()[o], steps["end"].to_numpy()[o]
    if len(o) > 1 and (t_sorted[1:] < np.maximum.accumulate(e_sorted)[:-1]).any():
        who = "processes" if "pid" in steps.columns and steps["pid"].nunique() > 1 else "threads"
        notes.append(f"step ranges of several {who} overlap in time: each launch is counted in one of them")
    return steps


def _in_steps(det, env: dict, notes: list[str], gpu: pd.DataFrame | None = None) -> tuple[pd.DataFrame, int]:
    """The launches inside the steps (`_step_ranges`; without any the whole trace is one step) and the
    number of steps. A launch belongs to the step whose range holds its launch call's CPU time (of its own
    process first, where the trace tells processes apart); a launch without a launch record (no runtime
    event, no op: its CPU time is unknown) is placed by its GPU time (`_place_by_gpu_time`, with `gpu`: the
    GPU-timeline copies of the ranges, when they are not among ``det.ranges``)."""
    L = det.launches
    cpu, copies = _split_ranges(det)
    gpu = copies if gpu is None else gpu
    steps_r = _step_ranges(cpu, notes)
    if not len(steps_r):
        if not env.get("capture"):
            notes.append("no step ranges in the trace: the whole trace counts as one step")
        return L, int((env.get("capture") or {}).get("steps") or 1)
    t_launch = L["t_launch"].to_numpy()
    step = _contained_own(steps_r, t_launch, L)
    unknown = (L["op_row"].to_numpy() < 0) & (t_launch == L["ts"].to_numpy())
    if unknown.any():
        step[unknown] = -1
        step = _place_by_gpu_time(L, step, unknown, steps_r, cpu, gpu, notes)
    out = (step < 0) & ~unknown
    if out.any():
        notes.append(f"{int(out.sum()):,} launches outside the {len(steps_r)} step ranges are left out"
                     + _gemm_part(L, out))
    return L[step >= 0], _step_count(steps_r)


def _step_count(steps_r: pd.DataFrame) -> int:
    """How many steps the ranges stand for: one process's ranges are its steps; several processes (merged
    rank traces) run the same steps at once, so a step is every process's step of that number and the
    count is the largest any one process has."""
    if "pid" in steps_r.columns and steps_r["pid"].nunique() > 1:
        return int(steps_r.groupby("pid").size().max())
    return len(steps_r)


def _place_by_gpu_time(L: pd.DataFrame, step: np.ndarray, unknown: np.ndarray, steps_r: pd.DataFrame,
                       cpu: pd.DataFrame, gpu: pd.DataFrame, notes: list[str]) -> np.ndarray:
    """Steps of the launches whose launch call's CPU time is unknown (`unknown`), from their GPU start, each
    against the work of its own GPU:

    1. inside the GPU copy of one of the step's ranges (the step's own, or a module's inside it: a copy
       is paired with the latest CPU range of its name that started before it);
    2. inside the GPU time span of the kernels the step launched (placed by their launch calls);
    3. inside the step's CPU range (a kernel starts after its launch: a step that waits for its GPU work,
       as the capture's does, runs all of it inside or right after its range);
    4. queued behind a placed kernel: it starts within `GAP_US` of the end of the GPU's work before it, on
       a stretch of busy GPU that a placed launch leads (a CUDA graph's kernels run back to back).

    A note says how many were placed each way and how many stay outside every step."""
    ts = L["ts"].to_numpy()
    end = ts + L["dur"].to_numpy()
    dev = L["device"].to_numpy() if "device" in L.columns else np.zeros(len(L), dtype=np.int64)
    s_ts, s_end = steps_r["ts"].to_numpy(), steps_r["end"].to_numpy()
    todo = unknown.copy()
    how: dict[str, int] = {}

    def put(got: np.ndarray, why: str) -> None:
        hit = todo & (got >= 0)
        if hit.any():
            step[hit] = got[hit]
            todo[hit] = False
            how[why] = int(hit.sum())

    def per_device(place) -> np.ndarray:
        got = np.full(len(L), -1, dtype=np.int64)
        for d in np.unique(dev[todo]):
            on = dev == d
            got[on] = place(on)
        return got

    if todo.any() and len(gpu) and len(cpu):                        # 1. GPU copies of the step's ranges
        w_step = _gpu_copy_steps(gpu, cpu, steps_r)
        w_dev = gpu["device"].to_numpy() if "device" in gpu.columns else np.zeros(len(gpu), dtype=np.int64)
        w_ts, w_end = gpu["ts"].to_numpy(), gpu["end"].to_numpy()

        def copies(on):
            w = np.flatnonzero((w_step >= 0) & (w_dev == dev[on][0]))
            got = _contained(w_ts[w], w_end[w], ts[on])
            return np.where(got >= 0, w_step[w][np.maximum(got, 0)], -1)
        put(per_device(copies), "inside the GPU copy of one of its step's ranges")
    placed = (step >= 0) & ~unknown
    if todo.any() and placed.any():                                 # 2. the step's kernels' GPU span
        def span(on):
            mine = placed & on
            sp = pd.DataFrame({"step": step[mine], "ts": ts[mine], "end": end[mine]}).groupby("step").agg(
                ts=("ts", "min"), end=("end", "max"))
            got = _contained(sp["ts"].to_numpy(), sp["end"].to_numpy(), ts[on])
            return np.where(got >= 0, sp.index.to_numpy()[np.maximum(got, 0)] if len(sp) else -1, -1)
        put(per_device(span), "inside the GPU time span of its step's launched kernels")
    if todo.any():                                                  # 3. the step's CPU range
        put(_contained_own(steps_r, ts, L), "starting inside a step's CPU range")
    if todo.any() and (step >= 0).any():                            # 4. queued behind a placed kernel
        def queued(on):
            t, e, st = ts[on], end[on], step[on]
            o = np.argsort(t, kind="stable")
            reach = np.maximum.accumulate(e[o])
            new_run = np.ones(len(o), dtype=bool)
            new_run[1:] = t[o][1:] > reach[:-1] + GAP_US
            run_start = np.maximum.accumulate(np.where(new_run, np.arange(len(o)), 0))
            lead = np.maximum.accumulate(np.where(st[o] >= 0, np.arange(len(o)), -1))
            ok = lead >= run_start
            got = np.full(len(o), -1, dtype=np.int64)
            got[ok] = st[o][lead[ok]]
            back = np.empty_like(got)
            back[o] = got
            return back
        put(per_device(queued), f"queued on a busy GPU behind a placed kernel (gap ≤ {GAP_US:g} µs)")
    n = int(unknown.sum())
    left = int(todo.sum())
    notes.append(f"{n:,} launches have no launch record (no runtime event or op links them to a CPU time): "
                 "placed in steps by GPU time" + (f": {', '.join(f'{v:,} {k}' for k, v in how.items())}"
                                                  if how else "")
                 + (f"; {left:,} outside every step are left out{_gemm_part(L, todo)}" if left else ""))
    return step


def _gemm_part(L: pd.DataFrame, mask: np.ndarray) -> str:
    """`` (X µs of GEMM time)`` of the launches in `mask`, for a note on launches left out; empty without."""
    us = float(L["dur"].to_numpy()[mask & (L["kind"].to_numpy() > 0)].sum())
    return f" ({us:,.1f} µs of GEMM time in all)" if us > 0 else ""


def _contained_own(ranges: pd.DataFrame, pts: np.ndarray, owners: pd.DataFrame) -> np.ndarray:
    """`_contained` for points with an owning process (``owners.pid``, -1: unknown): a range of the point's own
    process first (where the ranges tell processes apart), else any."""
    r_ts, r_end = ranges["ts"].to_numpy(), ranges["end"].to_numpy()
    out = np.full(len(pts), -1, dtype=np.int64)
    if "pid" in owners.columns and "pid" in ranges.columns:
        pp, rp = owners["pid"].to_numpy(), ranges["pid"].to_numpy()
        for p in np.intersect1d(np.unique(pp[pp != -1]), np.unique(rp)):
            pi, ri = np.flatnonzero(pp == p), np.flatnonzero(rp == p)
            got = _contained(r_ts[ri], r_end[ri], pts[pi])
            out[pi[got >= 0]] = ri[got[got >= 0]]
    rest = out < 0
    out[rest] = _contained(r_ts, r_end, pts[rest])
    return out


def _gpu_copy_steps(gpu: pd.DataFrame, cpu: pd.DataFrame, steps_r: pd.DataFrame) -> np.ndarray:
    """For each GPU copy of a range, the step its CPU range lies in (-1: none): the CPU range is the latest
    one of the same name (and process, where the copy's is known) that started at or before the copy (a
    kernel runs after its launch)."""
    out = np.full(len(gpu), -1, dtype=np.int64)
    if not len(gpu) or not len(cpu):
        return out
    own = "pid" in gpu.columns and "pid" in cpu.columns
    c = pd.DataFrame({"name": cpu["name"].to_numpy(), "ts": cpu["ts"].to_numpy(dtype=np.float64),
                      "pid": cpu["pid"].to_numpy() if own else 0,
                      "step": _contained_own(steps_r, cpu["ts"].to_numpy(), cpu)})
    g = pd.DataFrame({"name": gpu["name"].to_numpy(), "ts": gpu["ts"].to_numpy(dtype=np.float64),
                      "pid": gpu["pid"].to_numpy() if own else -1, "row": np.arange(len(gpu))})
    c, g = c[np.isfinite(c["ts"])].sort_values("ts"), g[np.isfinite(g["ts"])].sort_values("ts")
    known = g["pid"].to_numpy() != -1
    for part, by in ((g[known], ["name", "pid"]), (g[~known], ["name"])):
        if len(part):
            m = pd.merge_asof(part, c[["ts", "step", *by]], on="ts", by=by, direction="backward")
            got = m["step"].to_numpy(dtype=np.float64)
            hit = np.isfinite(got)
            out[m["row"].to_numpy()[hit]] = got[hit].astype(np.int64)
    return out


def _attribute(G: pd.DataFrame, det, naming: str | None = None) -> tuple[pd.DataFrame, str]:
    """Module (``module_full``, collapsed ``module``: `collapse`), ``pass`` and op record (``key``) of each GEMM
    launch, and which ranges gave them: capture ranges | nn.Module | none. `naming`: the capture's
    ``module_naming`` (env.json), when known."""
    ops, (rng, _) = det.ops, _split_ranges(det)
    mods = rng[rng["name"].str.startswith(runfiles.MODULE_PREFIX)] if len(rng) else rng
    attribution, prefix = "capture ranges", runfiles.MODULE_PREFIX
    if not len(mods) and len(rng):
        mods = rng[rng["name"].str.startswith(PY_MODULE_PREFIX)]
        attribution, prefix = "nn.Module", PY_MODULE_PREFIX
    if not len(mods):
        attribution = "none"
    op_row = G["op_row"].to_numpy()
    module = np.full(len(G), -1, dtype=np.int64)
    bwd = np.zeros(len(G), dtype=bool)
    if len(mods) and len(G):
        (m_tid, o_tid), o_proc = _threads(mods, ops), _processes(ops)
        m_ts, m_end = mods["ts"].to_numpy(), mods["end"].to_numpy()
        o_ts = ops["ts"].to_numpy()
        o_seq = np.where(ops["seq"].to_numpy() >= 0, o_proc * SEQ_SPAN + ops["seq"].to_numpy(), -1)
        linked = op_row >= 0
        module[linked] = _innermost(m_ts, m_end, m_tid, o_ts[op_row[linked]], o_tid[op_row[linked]])
        # backward: the evaluate_function node around the op, its sequence number, the forward op's module
        need = linked & (module < 0)
        if need.any():
            keys = det.op_keys
            is_eval = np.fromiter((keys[k][0].startswith(EVAL_PREFIX) for k in ops["key"].to_numpy()),
                                  dtype=bool, count=len(ops))
            ev_rows = np.flatnonzero(is_eval)
            rn = op_row[need]
            seq = np.full(len(rn), -1, dtype=np.int64)
            if len(ev_rows):                  # a forward-only trace has no autograd nodes
                inner = _innermost(o_ts[ev_rows], ops["end"].to_numpy()[ev_rows], o_tid[ev_rows], o_ts[rn],
                                   o_tid[rn])
                seq = np.where(inner >= 0, o_seq[ev_rows[np.maximum(inner, 0)]], -1)
            wanted = np.unique(seq[seq >= 0])
            if len(wanted):
                fwd = np.flatnonzero(np.isin(o_seq, wanted) & ~is_eval)
                fmod = _innermost(m_ts, m_end, m_tid, o_ts[fwd], o_tid[fwd])
                ok = fmod >= 0
                f = pd.DataFrame({"seq": o_seq[fwd][ok], "ts": o_ts[fwd][ok], "mod": fmod[ok]})
                seq_mod = f.sort_values("ts").groupby("seq")["mod"].last()     # the op that made the node
                got = pd.Series(seq).map(seq_mod).to_numpy()
                hit = ~pd.isna(got)
                idx = np.flatnonzero(need)
                module[idx[hit]] = got[hit].astype(np.int64)
                bwd[idx[seq >= 0]] = True
    names = _module_names(mods, prefix, attribution)
    class_order = attribution == "nn.Module" or _class_order(names, naming)
    short = [collapse(x, class_order) for x in names]
    G["module_full"] = [names[i] if i >= 0 else None for i in module]
    G["pass"] = np.where(module >= 0, np.where(bwd, "bwd", "fwd"), None)
    G["key"] = np.where(op_row >= 0, ops["key"].to_numpy()[np.maximum(op_row, 0)] if len(ops) else -1, -1)
    G["module"] = [short[i] if i >= 0 else None for i in module]
    return G, attribution


SEQ_SPAN = 1 << 40       # sequence numbers count per process: (process, number) as one integer


def _threads(*frames: pd.DataFrame) -> list[np.ndarray]:
    """One integer per (process, thread) for each row of the frames, the same across them: thread ids repeat
    across the processes of a merged file."""
    cols = [(f["pid"].to_numpy() if "pid" in f.columns else np.zeros(len(f), dtype=np.int64), f["tid"].to_numpy())
            for f in frames]
    codes = pd.factorize(pd.MultiIndex.from_arrays([np.concatenate([c[0] for c in cols]),
                                                    np.concatenate([c[1] for c in cols])]))[0]
    return np.split(codes.astype(np.int64), np.cumsum([len(f) for f in frames])[:-1])


def _processes(ops: pd.DataFrame) -> np.ndarray:
    """A small integer per row's process (0 without a ``pid`` column)."""
    if "pid" not in ops.columns:
        return np.zeros(len(ops), dtype=np.int64)
    return pd.factorize(ops["pid"])[0].astype(np.int64)


def _module_names(mods: pd.DataFrame, prefix: str, attribution: str) -> list[str]:
    """Each module range's name; for ``nn.Module:`` ranges (class-and-order names) the path of the ranges
    that enclose it (``Model_0.Linear_1``)."""
    names = mods["name"].str.slice(len(prefix)).tolist() if len(mods) else []
    if attribution != "nn.Module":
        return names
    par = _range_parents(mods["ts"].to_numpy(), mods["end"].to_numpy(), _threads(mods)[0])
    out = []
    for i in range(len(names)):
        j, path = par[i], [names[i]]
        while j >= 0:
            path.append(names[j])
            j = par[j]
        out.append(".".join(reversed(path)))
    return out


def _rows(G: pd.DataFrame, det, steps: int, step_gpu: float, log_groups: dict, judges: list[tuple[GpuFacts, tuple]]
          ) -> tuple[pd.DataFrame, int, float]:
    """One row per (module, pass, op record, kernel, kind of GPU): the `AUDIT_SCHEMA` frame, largest first;
    and how many rows (and how much time) have no shape. ``judges[G.judge]``: the facts and rates of the GPU a
    launch ran on (`_judges`)."""
    from cublaslt_probe.names import decode
    from cublaslt_probe.trace import classify, op_key_json, problem_of
    agg = G.groupby(["module", "pass", "key", "name", "judge"], dropna=False, sort=False).agg(
        count=("dur", "size"), total=("dur", "sum"), reduce=("reduce_us", "sum"), helper=("helper_us", "sum"),
        instances=("module_full", "nunique"))
    rows, no_shape, no_shape_us = [], 0, 0.0
    for (mod, pas, key, name, judge), a in zip(agg.index, agg.itertuples(index=False)):
        kernel = det.names[name]
        kn = decode(kernel)
        op, dims, types, strides = op_key_json(det.op_keys[int(key)]) if key >= 0 else (None,) * 4
        p = problem_of(op, dims, types, strides)
        shape_from = "op" if p else None
        if not p and op and op.startswith("triton_tem") and "mm" in op:
            p = _template_problem(dims, types, strides)
            shape_from = "kernel arguments" if p else None
        if not p:
            no_shape += 1
            no_shape_us += a.total
        row = {
            "module": None if _na(mod) else mod, "instances": None if _na(mod) else int(a.instances),
            "pass": None if _na(pas) else pas, "op": op,
            **{c: p.get(c) for c in ("dtype", "layout", "m", "n", "k", "batch", "groups", "group_dim")},
            "calls": a.count / steps, "gpu_us": a.total / steps, "mean_us": a.total / a.count,
            "share": (a.total / steps) / step_gpu if step_gpu else None,
            "kernel": kernel, "family": kn.family, "provenance": classify(kn)[1], "kernel_short": kn.short,
            "arch": kn.arch, "tile_m": kn.tile_m, "tile_n": kn.tile_n, "tile_k": kn.tile_k, "stages": kn.stages,
            "cluster_m": kn.cluster_m, "cluster_n": kn.cluster_n, "problem_shape": kn.problem_shape,
            "split_k": (bool(kn.split_k) or a.reduce > 0) if kn.split_k is not None or a.reduce > 0 else None,
            "shape_from": shape_from, "reduce_us": a.reduce / steps, "helper_us": a.helper / steps,
            "input_dims": dims, "input_strides": strides,
        }
        _join_log(row, kn, log_groups, steps)
        if row.get("algo_split_k") and row["algo_split_k"] > 1:
            row["split_k"] = True
        gpu, rates = judges[judge]
        row["gpu"] = gpu.name
        _judge(row, kn, rates, gpu.sms, gpu.arch)
        rows.append(row)
    df = _coerce(pd.DataFrame(rows, columns=AUDIT_COLUMNS))
    df = df.sort_values(["gpu_us", "kernel"], ascending=[False, True], kind="stable").reset_index(drop=True)
    return df, no_shape, no_shape_us


def _template_problem(dims, types, strides) -> dict:
    """An Inductor Triton GEMM template's problem from its launch record's first two inputs (A [m, k],
    B [k, n], as torch.compile passes them to ``triton_tem_fused_mm*``); {} when they do not chain."""
    from cublaslt_probe.trace import problem_of
    try:
        d = json.loads(dims)
        if len(d) < 2 or len(d[0]) != 2 or len(d[1]) != 2 or d[0][1] != d[1][0]:
            return {}
    except (TypeError, ValueError):
        return {}
    return problem_of("aten::mm", dims, types, strides)


def _fold_helpers(G: pd.DataFrame) -> pd.DataFrame:
    """One op call = one GEMM: where an op call launched several GEMM-kind kernels, the longest is the GEMM
    and the others' time is added to it (``helper_us``), as a split-K reduce is."""
    G = G.assign(helper_us=0.0)
    linked = G[G["op_row"] >= 0].sort_values(["op_row", "dur"], ascending=[True, False], kind="stable")
    extra = linked.duplicated("op_row")
    if not extra.any():
        return G
    helpers = linked[extra].groupby("op_row")["dur"].sum()
    main = linked[~extra]
    main = main[main["op_row"].isin(helpers.index)]
    add = main["op_row"].map(helpers)
    G.loc[main.index, "dur"] += add
    G.loc[main.index, "helper_us"] = add
    return G.drop(index=linked[extra].index)


def _coerce(df: pd.DataFrame) -> pd.DataFrame:
    for col, (dt, _) in AUDIT_SCHEMA.items():
        if dt == "category":
            df[col] = df[col].astype("string").astype("category")
        elif dt in ("Int64", "boolean"):
            df[col] = pd.array([None if _na(v) else v
                                for v in df[col].tolist()], dtype=dt)
        else:
            df[col] = df[col].astype(dt)
    return df


def jsonl_frame(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows with `FIXED_KEYS` first (the jsonl/csv/parquet column order)."""
    rest = [c for c in rows.columns if c not in FIXED_KEYS]
    return rows[list(FIXED_KEYS) + rest]


# --------------------------------------------------------------------------- advice from measurements
MIN_GAIN = 0.03          # a measured alternative must beat the original by 3 % (above timing noise)
PATH_WORDS = {
    "torch": "the cuBLAS path (torch.backends.cuda.preferred_blas_library('cublas'), 32 MiB workspace)",
    "torch-lt": "torch's cuBLASLt path (torch.backends.cuda.preferred_blas_library('cublaslt'), 1 MiB workspace)",
    "lt": "cuBLASLt with a 32 MiB workspace (preferred_blas_library('cublaslt') and CUBLASLT_WORKSPACE_SIZE=32768)",
}
ADVICE_KEYS = ("what", "kind", "module", "saving_us", "saving_pct", "evidence", "risk", "gemms", "replay",
               "excludes")


_KEY = ("op", "dtype", "layout", "m", "n", "k", "batch")


def _norm_key(vals) -> tuple:
    """(op, dtype, layout, m, n, k, batch) as plain str/int (batch 1 when missing), for joining."""
    out = []
    for c, v in zip(_KEY, vals):
        if _na(v):
            v = 1 if c == "batch" else None
        out.append(int(v) if c in ("m", "n", "k", "batch") and v is not None else (None if v is None else str(v)))
    return tuple(out)


def _match_rows(rows: pd.DataFrame, g: dict) -> pd.DataFrame:
    """The audit rows a measured GEMM stands for: the same problem (and module and pass, when the measurement
    names them)."""
    if rows.empty:
        return rows
    want = _norm_key([(g.get("key") or {}).get(c) for c in _KEY])
    hit = [_norm_key(r) == want for r in rows[list(_KEY)].itertuples(index=False)]
    out = rows[hit]
    for col in ("module", "pass"):
        v = g.get(col)
        if v is not None and (out[col] == v).any():
            out = out[out[col] == v]
    return out


def _numerics_risk(g: dict, label: str) -> str:
    num = (g.get("numerics") or {}).get(label)
    tol = g.get("tolerance")
    if num is None:
        return "numerics not compared"
    if tol is not None and num > tol:
        return f"numerics differ: max rel. error {num:.2g} > tolerance {tol:.2g}"
    return f"numerics agree (max rel. error {num:.2g}" + (f" ≤ {tol:.2g})" if tol is not None else ")")


def pinned_line(g: dict, c: dict) -> str | None:
    """The measured GEMM's own cuBLASLt log line with candidate `c`'s algo in place of the logged one: a
    line `cublaslt-probe replay` rebuilds and runs with that algo pinned. None without a logged line."""
    line = (g.get("original") or {}).get("log_line")
    if not line or "algo=[" not in line or c.get("algo_id") is None:
        return None
    algo = [f"algoId={c['algo_id']}"]
    if c.get("tile"):
        algo.append(f"tile=MATMUL_TILE_{c['tile']}")
    if c.get("stages"):
        algo.append(f"stages=MATMUL_STAGES_{c['stages']}")
    if (c.get("split_k") or 1) > 1:
        algo += [f"reductionScheme=REDUCTION_SCHEME_{c.get('reduction_scheme') or 'NONE'}",
                 f"numSplitsK={c['split_k']}"]
    if c.get("custom_option"):
        algo.append(f"customOption={c['custom_option']}")
    if c.get("cta_swizzling"):
        algo.append(f"ctaSwizzling={c['cta_swizzling']}")
    if c.get("cluster"):
        algo.append(f"clusterShape=CLUSTER_SHAPE_{c['cluster']}")
    line = re.sub(r"algo=\[[^\]]*\]", "algo=[" + " ".join(algo) + "]", line, count=1)
    return re.sub(r"workSpaceSizeInBytes=\d+", f"workSpaceSizeInBytes={int(c.get('workspace_bytes') or 0)}", line,
                  count=1)


def _cand_text(c: dict) -> str:
    """A heuristic candidate as the log writes an algo: ``algo 66 tile 128x64 stages 64xAUTO cluster 1x2x1``."""
    parts = [f"algo {c['algo_id']}"] if c.get("algo_id") is not None else []
    for k in ("tile", "stages", "cluster"):
        if c.get(k):
            parts.append(f"{k} {c[k]}")
    if (c.get("split_k") or 1) > 1:
        parts.append(f"splitK {c['split_k']}")
    return " ".join(parts) or str(c.get("kernel") or "")


@dataclass
class _Measured:
    """One measured GEMM as the advice reads it: the audit rows it stands for, its calls per step, its time on
    the path it took (``path``: torch | torch-lt)."""

    i: int
    g: dict
    label: str
    module: str | None
    rows: list[int]
    calls: float
    orig: float
    path: str | None

    @property
    def where(self) -> str:
        return f" ({self.module})" if self.module else ""

    @property
    def ids(self) -> frozenset:
        """What an item that changes this GEMM touches: its audit rows (the measurement itself without rows)."""
        return frozenset(("row", r) for r in self.rows) or frozenset({("g", self.i)})

    def change(self, name: str, t: float, kernel: str | None, named: bool = True) -> tuple[float, str]:
        """(saving per step, evidence) of running it as alternative `name` in `t` µs: negative when slower.
        `named`: the evidence names its module."""
        d = (self.orig - t) * self.calls
        return d, (f"{self.label}{self.where if named else ''}: original {self.orig:.1f} µs, {name} {t:.1f} µs "
                   f"({kernel or ''}); × {self.calls:g} calls/step" + (f", {-d:,.1f} µs/step slower" if d < 0 else ""))


@dataclass
class AdviceItem:
    """One change and what the measurements say it does to the step. ``saving_us`` nets every measured GEMM
    the change moves, slower ones subtracting; ``touches`` holds every GEMM it changes, measured or not (audit
    rows), ``helped`` the measured ones it makes faster, ``setting`` the global switch it sets. Two items that
    touch one GEMM, or set one switch two ways, exclude each other: their savings do not add."""

    kind: str
    what: str
    module: str | None
    saving_us: float
    evidence: str
    risk: str
    gemms: list[str]
    touches: frozenset = frozenset()
    helped: frozenset = frozenset()
    setting: str | None = None
    replay: str | None = None
    excludes: list[int] = field(default_factory=list)

    def clashes(self, other: AdviceItem) -> bool:
        return bool(self.touches & other.touches) or (self.setting is not None and self.setting == other.setting)

    def as_dict(self, step_us: float | None) -> dict:
        d = {**self.__dict__, "saving_pct": (100 * self.saving_us / step_us if step_us else None)
             if self.saving_us > 0 else 0.0}
        return {k: d.get(k) for k in ADVICE_KEYS}


def _quiet(what: str, kind: str, module, evidence: str = "", gemms: list[str] | None = None) -> AdviceItem:
    return AdviceItem(kind, what, module, 0.0, evidence, "", gemms or [])


def _label(key: dict) -> str:
    return (f"{key.get('op')} {key.get('dtype')} {key.get('layout')} {key.get('m')}×{key.get('n')}×{key.get('k')}"
            + (f" ×{key['batch']}" if (key.get("batch") or 1) > 1 else ""))


def _row_gemm(r: dict) -> str:
    """An audit row as advice names it: ``transformer.h.*.mlp.c_fc ×12 fwd aten::addmm 4096×3072×768``."""
    def v(x):
        return "?" if _na(x) else str(x)
    return (f"{row_label(r)}" + ("" if _na(r.get("pass")) else f" {r['pass']}") + f" {v(r.get('op'))} "
            f"{v(r.get('m'))}×{v(r.get('n'))}×{v(r.get('k'))}")


def _not_measured(rows: pd.DataFrame, idx: list[int], what: str, limit: int = 8) -> tuple[str, str]:
    """(evidence, risk) naming the GEMMs a change moves that were not measured, with their time per step."""
    if not idx:
        return "", ""
    sub = rows.loc[idx]
    us = float(sub["gpu_us"].sum())
    names = [_row_gemm(r) + ("" if not _na(r.get("log_function")) else " (path unknown)")
             for r in sub.to_dict("records")]
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    n = f"{len(idx)} GEMM{'s' if len(idx) != 1 else ''}"
    return (f"{n} it {what} {'were' if len(idx) != 1 else 'was'} not measured ({us:,.1f} µs/step): "
            + ", ".join(names[:limit]) + more,
            f"{n} it {what} ({us:,.1f} µs/step) {'were' if len(idx) != 1 else 'was'} not measured: their time "
            "after the change is unknown")


def _measured_gemms(rows: pd.DataFrame, measure: dict) -> tuple[list[_Measured], list[AdviceItem]]:
    """The GEMMs measured with a time, and a quiet item for each that was not (grouped, an error)."""
    from cublaslt_probe.measure import path_of
    out, quiet = [], []
    for i, g in enumerate(measure.get("gemms") or []):
        key = g.get("key") or {}
        matched = _match_rows(rows, g)
        module = g.get("module") if g.get("module") is not None else (
            matched["module"].iloc[0] if len(matched) and not pd.isna(matched["module"].iloc[0]) else None)
        label = _label(key)
        if g.get("skipped") or g.get("error"):
            quiet.append(_quiet(f"{label}{f' ({module})' if module else ''}: not measured — "
                                f"{g.get('skipped') or g.get('error')}", "not_measured", module, gemms=[label]))
            continue
        if not g.get("original_us"):
            continue
        case = str(g.get("case") or "").split("|")[0]
        path = case if case in ("torch", "torch-lt") else path_of(g.get("log_function"))
        calls = float(matched["calls"].sum()) if len(matched) else float(g.get("calls") or 1)
        out.append(_Measured(i, g, label, module, [int(x) for x in matched.index], calls, float(g["original_us"]),
                             path))
    return out, quiet


def _pin_items(ms: list[_Measured]) -> list[AdviceItem]:
    """Pin the fastest correct heuristic candidate of one GEMM when it beats the original by `MIN_GAIN`."""
    out = []
    for m in ms:
        cands = [c for c in m.g.get("candidates") or [] if c.get("time_us") and c.get("ok_numerics") is not False]
        if not cands:
            continue
        c = min(cands, key=lambda c: c["time_us"])
        if not (c["time_us"] < m.orig * (1 - MIN_GAIN) and c.get("rank", 0) != 0):
            continue
        c0 = next((x for x in cands if x.get("rank") == 0), None)
        out.append(AdviceItem(
            "pin", f"pin candidate #{c['rank']} ({_cand_text(c)}) for {m.module or m.label}", m.module,
            (m.orig - c["time_us"]) * m.calls,
            f"{m.label}: original {m.orig:.1f} µs, candidate #{c['rank']} {c['time_us']:.1f} µs"
            + (f", #0 {c0['time_us']:.1f} µs" if c0 else "") + f"; × {m.calls:g} calls/step",
            "numerics checked against candidate #0" if c.get("ok_numerics") else
            "numerics not checked; needs the algo pinned through cuBLASLt (replay)",
            [m.label], m.ids, frozenset({m.i}), replay=pinned_line(m.g, c)))
    return out


def _moved_rows(rows: pd.DataFrame, target: str) -> list[int]:
    """The audit rows a switch to path `target` moves: those whose logged function puts them on another path,
    and, where no log line says, every GEMM of an op torch runs through its BLAS switch."""
    from cublaslt_probe.measure import TORCH_OPS, path_of
    out = []
    for i, lf, op in zip(rows.index, rows["log_function"].tolist(), rows["op"].tolist()):
        p = path_of(None if _na(lf) else lf)
        if (p is not None and p != target) or (p is None and not _na(op) and op in TORCH_OPS):
            out.append(int(i))
    return out


def _switch_items(rows: pd.DataFrame, ms: list[_Measured]) -> tuple[list[AdviceItem], list[AdviceItem]]:
    """A path or workspace switch moves every GEMM on the other paths, not only those that got faster: its
    saving nets the measured ones with their sign, and names those it moves that were not measured. Advice
    only when the net beats the moved GEMMs' own time by `MIN_GAIN`; else a quiet line, when some GEMM alone
    got faster."""
    from cublaslt_probe.measure import PATHS
    items, quiet = [], []
    for target in PATHS:
        done = []
        for m in ms:
            if m.path is None or m.path == target:
                continue
            p = next((p for p in m.g.get("paths") or [] if p.get("path") == target and p.get("time_us")), None)
            if p is not None:
                done.append((m, p))
        if not any(p["time_us"] < m.orig * (1 - MIN_GAIN) for m, p in done):
            continue
        changes = [m.change(target, p["time_us"], p.get("kernel")) for m, p in done]
        net = sum(d for d, _ in changes)
        base = sum(m.orig * m.calls for m, _ in done)
        seen = {r for m, _ in done for r in m.rows}
        moved = _moved_rows(rows, target)
        ev_un, risk_un = _not_measured(rows, [r for r in moved if r not in seen], "moves")
        faster = sum(d > 0 for d, _ in changes)
        words = PATH_WORDS.get(target, target)
        summary = (f"net over the {len(done)} measured GEMM{'s' if len(done) != 1 else ''} it moves "
                   f"({faster} faster, {len(done) - faster} slower): ")
        kind = "workspace" if target == "lt" else "path"
        if net <= MIN_GAIN * base:
            quiet.append(_quiet(f"run on {words}: no net saving — {summary}"
                                + (f"{net:,.1f} µs/step saved, under 3 % of their time" if net > 0 else
                                   f"{-net:,.1f} µs/step slower") + (f"; {ev_un}" if ev_un else "") + "; no advice",
                                "no_gain", None, gemms=[m.label for m, _ in done]))
            continue
        ws = max((p.get("workspace") or 0 for _, p in done), default=0)
        risk = list(dict.fromkeys(_numerics_risk(m.g, f"path:{target}") for m, _ in done))
        items.append(AdviceItem(
            kind, f"run on {words}", None, net,
            "; ".join(e for _, e in changes) + f"; {summary}{net:,.1f} µs/step" + (f"; {ev_un}" if ev_un else ""),
            "; ".join(risk) + (f"; workspace {ws / 2**20:g} MiB" if ws else "") + (f"; {risk_un}" if risk_un else ""),
            [m.label for m, _ in done],
            frozenset().union(*(m.ids for m, _ in done)) | frozenset(("row", r) for r in moved),
            frozenset(m.i for (m, _), (d, _) in zip(done, changes) if d > 0), setting="blas path"))
    return items, quiet


def _pad_items(rows: pd.DataFrame, ms: list[_Measured]) -> tuple[list[AdviceItem], list[AdviceItem]]:
    """Padding one value in one module changes every GEMM of the module with that value in m, n or k: each
    padded value nets its measured GEMMs with their sign (the slower what-if when the value is in two dims).
    Of the values whose net beats those GEMMs' time by `MIN_GAIN`, the smallest whose saving is within
    `MIN_GAIN` of the best is advised (the least extra work and memory); the other values measured are listed
    in its evidence. A GEMM without a module is padded on its own."""
    groups: dict[tuple, list[_Measured]] = {}
    for m in ms:
        key = m.g.get("key") or {}
        for w in m.g.get("whatifs") or []:
            old = key.get(w.get("dim"))
            if w.get("time_us") and old is not None:
                gk = (m.module, old) if m.module else (None, old, m.i)
                if m not in groups.setdefault(gk, []):
                    groups[gk].append(m)
    items, quiet = [], []
    for gk, whatif_ms in groups.items():
        module, old = gk[0], gk[1]

        def holds(key):
            return old in (key.get("m"), key.get("n"), key.get("k"))
        members = whatif_ms if module is None else [m for m in ms if m.module == module and holds(m.g.get("key") or {})]
        group_rows = [r for m in whatif_ms for r in m.rows] if module is None else [
            int(i) for i, r in zip(rows.index, rows.to_dict("records"))
            if not _na(r["module"]) and r["module"] == module
            and any(not _na(r[d]) and int(r[d]) == old for d in ("m", "n", "k"))]
        values = sorted({w["value"] for m in whatif_ms for w in m.g.get("whatifs") or []
                         if w.get("time_us") and (m.g.get("key") or {}).get(w.get("dim")) == old})
        res = {}
        for v in values:
            done, beat = [], False
            for m in members:
                key = m.g.get("key") or {}
                ws = [w for w in m.g.get("whatifs") or [] if w.get("value") == v and w.get("time_us")
                      and key.get(w.get("dim")) == old]
                if ws:
                    w = max(ws, key=lambda w: w["time_us"])
                    done.append((m, w, *m.change(f"{w['dim']}={v}", w["time_us"], w.get("kernel"),
                                                 named=module is None)))
                    beat |= any(x["time_us"] < m.orig * (1 - MIN_GAIN) for x in ws)
            net = sum(d for _, _, d, _ in done)
            res[v] = {"done": done, "net": net, "beat": beat,
                      "ok": net > MIN_GAIN * sum(m.orig * m.calls for m, *_ in done)}
        ok = [v for v in values if res[v]["ok"]]
        vocab = bool(module) and re.search(r"(lm_head|embed|wte|vocab)", str(module)) is not None
        in_mod = f" in {module}" if module else ""
        if not ok:
            beaten = [v for v in values if res[v]["beat"]]
            if beaten:
                v = beaten[0]
                net, n = res[v]["net"], len(res[v]["done"])
                quiet.append(_quiet(f"pad {old} → {v}{in_mod}: no net saving over the {n} measured GEMM"
                                    f"{'s' if n != 1 else ''} with {old} ("
                                    + (f"{-net:,.1f} µs/step slower" if net <= 0 else
                                       f"{net:,.1f} µs/step saved, under 3 % of their time") + "); no advice",
                                    "no_gain", module))
            continue
        best = max(res[v]["net"] for v in ok)
        pick = min(v for v in ok if res[v]["net"] >= best * (1 - MIN_GAIN))
        r = res[pick]
        seen = {x for m, *_ in r["done"] for x in m.rows}
        ev_un, risk_un = _not_measured(rows, [x for x in group_rows if x not in seen], f"pads at {pick}")
        also = [f"{v} saves {res[v]['net']:,.1f} µs/step" if res[v]["net"] > 0 else
                f"{v} is {-res[v]['net']:,.1f} µs/step slower" for v in values if v != pick]
        risk = list(dict.fromkeys(
            _numerics_risk(m.g, f"{w['dim']}={pick}") + f"; {w['dim']} grows by {pick - old} (more work and "
            "memory; slice the result back)" for m, w, _, _ in r["done"]))
        mult = r["done"][0][1].get("multiple") or 1
        items.append(AdviceItem(
            "pad", f"pad {'the vocabulary ' if vocab else ''}{old} → {pick} (a multiple of {mult}){in_mod}", module,
            r["net"], "; ".join(e for *_, e in r["done"]) + (f"; also measured: {', '.join(also)}" if also else "")
            + (f"; {ev_un}" if ev_un else ""),
            "; ".join(risk) + (f"; {risk_un}" if risk_un else ""), [m.label for m, *_ in r["done"]],
            frozenset().union(*(m.ids for m in members)) | frozenset(("row", x) for x in group_rows),
            frozenset(m.i for m, _, d, _ in r["done"] if d > 0)))
    return items, quiet


def advice(rows: pd.DataFrame, measure: dict, step_gpu_us: float | None = None) -> list[dict]:
    """Ranked advice from saved measurements (`measure.measure_gemms`' result) against the audit rows.

    Each item (keys `ADVICE_KEYS`): ``what`` to change, ``kind`` (pad | path | workspace | pin; quiet:
    at_floor | no_gain | not_measured), ``module``, ``saving_us`` per step (per-call change × calls per step,
    netted over every measured GEMM the change moves), ``saving_pct`` of the step's GPU time, ``evidence``
    (the numbers, and the GEMMs it changes that were not measured), ``risk`` (numerics, memory, what was not
    measured), the ``gemms`` measured, the pinned log line to ``replay``, and the numbers of the items it
    ``excludes`` (they change one of its GEMMs or set its switch the other way: their savings do not add).
    Items with a saving come first, largest first; then the GEMMs with no advice (near their floor, or
    faster alone with a change that does not pay over every GEMM it moves) and those not measured."""
    step = step_gpu_us or (float(rows["gpu_us"].sum() / rows["share"].sum()) if len(rows) and rows["share"].sum()
                           else None)
    ms, not_measured = _measured_gemms(rows, measure)
    switch, switch_quiet = _switch_items(rows, ms)
    pads, pad_quiet = _pad_items(rows, ms)
    items = sorted(_pin_items(ms) + switch + pads, key=lambda x: -x.saving_us)
    for a, x in enumerate(items):
        x.excludes = [b + 1 for b, y in enumerate(items) if b != a and x.clashes(y)]
    helped = {i for x in items for i in x.helped}
    quiet: list[AdviceItem] = []
    for m in ms:
        if m.i in helped:
            continue
        floor = pd.Series([rows.loc[r, "floor_us"] for r in m.rows], dtype="float64").dropna()
        ratio = m.orig / float(floor.iloc[0]) if len(floor) and float(floor.iloc[0]) > 0 else None
        key = m.g.get("key") or {}
        alone = [f"{p['path']} {p['time_us']:.1f} µs" for p in m.g.get("paths") or [] if p.get("time_us") and
                 p["time_us"] < m.orig * (1 - MIN_GAIN)] + [
            f"{w['dim']}={w['value']} {w['time_us']:.1f} µs" for w in m.g.get("whatifs") or [] if w.get("time_us")
            and w["time_us"] < m.orig * (1 - MIN_GAIN) and key.get(w.get("dim")) is not None]
        at = (f"at {ratio:.2f}× its floor ({100 / ratio:.0f} % of the roofline)" if ratio is not None
              else "floor unknown")
        if alone:
            why = (f"{at}; faster alone ({', '.join(alone)}), but that change does not pay over every GEMM it "
                   "moves")
        elif ratio is not None and ratio <= NEAR_FLOOR:
            why = f"within {100 * (ratio - 1):.0f} % of its floor"
        else:
            why = f"{at}; no measured alternative beats it by 3 %"
        quiet.append(_quiet(f"{m.label}{m.where}: {why}; no advice",
                            "at_floor" if ratio and ratio <= NEAR_FLOOR and not alone else "no_gain", m.module,
                            f"original {m.orig:.1f} µs" + (f", floor {float(floor.iloc[0]):.1f} µs" if len(floor)
                                                           else ""), [m.label]))
    quiet = not_measured + quiet
    return [x.as_dict(step) for x in items] + [q.as_dict(step) for q in quiet + switch_quiet + pad_quiet]


def advice_total(items: list[dict]) -> tuple[list[int], float, float | None]:
    """The items that add up: in rank order, each item that excludes none taken before it. Returns their
    numbers, their summed saving per step and its share of the step (%)."""
    take: list[int] = []
    us, pct = 0.0, 0.0
    for n, it in enumerate([x for x in items if x["saving_us"] > 0], 1):
        if not set(it.get("excludes") or []) & set(take):
            take.append(n)
            us += it["saving_us"]
            pct = None if pct is None or it.get("saving_pct") is None else pct + it["saving_pct"]
    return take, us, pct


# --------------------------------------------------------------------------- rendering
TABLE_COLUMNS = ("share", "calls", "gpu_us", "module", "pass", "op", "dtype", "layout", "m", "n", "k", "groups",
                 "family", "provenance", "kernel_short", "algo", "pct_peak", "floor_ratio", "waves", "flags")


def row_label(r: dict) -> str:
    """``model.layers.*.mlp.down_proj ×32`` (the module and how many it collapses; else the op)."""
    mod, inst, op = r.get("module"), r.get("instances"), r.get("op")
    if _na(mod):
        return "(no module)" if not _na(op) else "(no op)"
    return str(mod) + (f" ×{int(inst)}" if not _na(inst) and int(inst) > 1 else "")


def flags(r: dict) -> str:
    """align-fallback, split-K, kernel≠log: what a row's booleans say, for the table."""
    out = []
    if not _na(r["align_fallback"]) and r["align_fallback"]:
        out.append("align-fallback")
    if not _na(r["split_k"]) and r["split_k"]:
        out.append("split-K")
    if not _na(r["log_consistent"]) and not r["log_consistent"]:
        out.append("kernel≠log")
    return " ".join(out)


def summary_lines(a: Audit) -> list[str]:
    """The audit's header, one fact a line."""
    from cublaslt_probe.trace import timeline_sentence
    cap = (a.env.get("capture") or {})
    lines = [f"{a.sources.get('trace')}" + (f" + {a.sources['log']}" if a.sources.get("log") else "")
             + (f"; GPU {a.gpu}" if a.gpu else "") + (f" ({a.env.get('sm_count')} SMs)" if a.env.get("sm_count")
                                                      else ""),
             f"{a.steps} step{'s' if a.steps != 1 else ''}; per step: GPU time {a.step_gpu_us / 1e3:,.3f} ms, GEMMs "
             f"{a.gemm_gpu_us / 1e3:,.3f} ms ({100 * a.gemm_gpu_us / a.step_gpu_us if a.step_gpu_us else 0:.1f} %) "
             f"in {len(a.rows):,} distinct GEMMs",
             f"GPU time: {timeline_sentence(a.timeline)}"]
    if len(a.rows):
        lines.append(f"attribution: {a.attribution}; {100 * a.attributed_share:.1f} % of GEMM time has a module"
                     + (f"; torch allow_tf32={cap.get('allow_tf32')}" if "allow_tf32" in cap else ""))
    if a.observed is not None:
        o = a.observed
        lines.append(f"cold-start evidence ({o['source']}): {o['kernels']} kernel name(s) of this trace seen compiled "
                     f"at run time ({', '.join(f'{k} {v}' for k, v in sorted(o['by_mechanism'].items())) or 'none'}), "
                     f"{o['gpu_us']:,.1f} µs/step of GPU time; {o['gemm_rows']} GEMM row(s) upgraded to evidence "
                     "observed")
    lines += [f"note: {n}" for n in a.notes]
    lines += stall_lines(a)
    return lines


def stall_lines(a: Audit) -> list[str]:
    """One line per host stall (`stalls`): what held the host, and what the trace supports about why."""
    from cublaslt_probe.stalls import cause
    if a.stalls is None or not len(a.stalls):
        return []
    out = []
    for r in a.stalls.to_dict("records"):
        c = cause(r)
        out.append(f"host stall: {r['host_us'] / 1e3:,.1f} ms/step in {r['op']}"
                   + (f" ({r['module']})" if not _na(r.get("module")) else "")
                   + f" for {r['gpu_us']:,.1f} µs of its kernels"
                   f" — {c['cause']}; change: {c['change']}")
    return out


def table_rows(rows: pd.DataFrame) -> list[list[str]]:
    """The people's table of the rows: `TABLE_COLUMNS` as text."""
    def f(v, fmt):
        return "" if v is None or (not isinstance(v, str) and pd.isna(v)) else format(v, fmt)
    out = []
    for r in rows.to_dict("records"):
        out.append([f"{100 * r['share']:.1f}%" if r["share"] is not None and not pd.isna(r["share"]) else "",
                    f(r["calls"], "g"), f(r["gpu_us"], ",.1f"), row_label(r), f(r["pass"], ""), f(r["op"], ""),
                    f(r["dtype"], ""), f(r["layout"], ""), f(r["m"], "d"), f(r["n"], "d"), f(r["k"], "d"),
                    f(r["groups"], "d"), f(r["family"], ""), f(r["provenance"], ""), f(r["kernel_short"], ""),
                    f(r["algo"], ""), f(r["pct_peak"], ".1f"), f(r["floor_ratio"], ".2f"), f(r["waves"], ".2f"),
                    flags(r)])
    return out


def advice_entries(items: list[dict]) -> tuple[list[tuple[int, str, str, str]], str | None, list[str]]:
    """The advice as people read it, for the text and the page alike: (number, headline, evidence, risk) per
    item with a saving — the headline says which items it excludes ("alternative to item 1", "excludes item
    2") —, the line adding up the items that exclude no other (`advice_total`; None under two), and the
    quiet lines."""
    shown = [it for it in items if it["saving_us"] > 0]
    out = []
    for n, it in enumerate(shown, 1):
        ex = it.get("excludes") or []
        rel = "; ".join(x for x in (_numbers("alternative to", [e for e in ex if e < n]),
                                    _numbers("excludes", [e for e in ex if e > n])) if x)
        out.append((n, f"{it['what']}: saves {it['saving_us']:,.1f} µs/step"
                    + (f" ({it['saving_pct']:.1f} % of the step)" if it.get("saving_pct") is not None else "")
                    + (f" — {rel}" if rel else ""), it["evidence"], it["risk"]))
    take, us, pct = advice_total(items)
    total = None
    if len(take) > 1:
        total = (f"items {', '.join(map(str, take[:-1]))} and {take[-1]} exclude no other: together they save "
                 f"{us:,.1f} µs/step" + (f" ({pct:.1f} % of the step)" if pct is not None else ""))
    return out, total, [it["what"] for it in items if it["saving_us"] <= 0]


def _numbers(verb: str, ns: list[int]) -> str:
    """``excludes item 2`` / ``excludes items 2 and 3`` ('' for none)."""
    if not ns:
        return ""
    return f"{verb} item {ns[0]}" if len(ns) == 1 else (f"{verb} items {', '.join(map(str, ns[:-1]))} and "
                                                         f"{ns[-1]}")


def advice_lines(items: list[dict]) -> list[str]:
    """The advice as text lines (`advice_entries`)."""
    entries, total, quiet = advice_entries(items)
    out = []
    for n, head, ev, risk in entries:
        out += [f"{n}. {head}", f"   evidence: {ev}", f"   risk: {risk}"]
    if total:
        out.append(total)
    return out + [f"- {q}" for q in quiet]


def chain(r: dict, g: dict | None = None) -> list[str]:
    """The evidence for one row, in order (explain's chain, from the trace, the log and the measurement)."""
    def v(x, fmt=""):
        return "?" if _na(x) else format(x, fmt)
    out = [f"op {r['op']} in {row_label(r)} ({r['pass'] or 'no module'}): inputs {r['input_dims'] or 'not recorded'}, "
           f"strides {r['input_strides'] or 'not recorded'} -> {v(r['dtype'])} {v(r['layout'])} m={v(r['m'])} "
           f"n={v(r['n'])} k={v(r['k'])}" + (f", {v(r['groups'])} groups split along {r['group_dim']}"
                                               if not _na(r["groups"]) else "")
           + (f" (shape from the {r['shape_from']})" if r["shape_from"] == "kernel arguments" else "")]
    if _na(r["algo"]):
        out.append("cuBLASLt log: no matching line (not a cuBLASLt call, or no log)")
    else:
        agree = {True: "agrees", False: "DISAGREES"}.get(None if _na(r["log_consistent"]) else
                                                         bool(r["log_consistent"]), "has nothing to compare")
        out.append(f"cuBLASLt log: {r['log_function']} chose {r['algo']}, workspace {v(r['workspace_bytes'])} B; "
                   f"the kernel {agree}")
    out.append(f"kernel ({r['provenance']}, {r['family']}): {r['kernel']}; decoded {r['kernel_short']}"
               + (f", problem shape {r['problem_shape']}" if not _na(r["problem_shape"]) else ""))
    out.append(f"{v(r['calls'], 'g')} calls/step, {v(r['mean_us'], ',.2f')} µs each = {v(r['tflops'], '.1f')} "
               f"TFLOP/s = {v(r['pct_peak'], '.1f')} % of peak; floor {v(r['floor_us'], ',.2f')} µs "
               f"({v(r['bound'])}-bound), {v(r['floor_ratio'], '.2f')}× the floor; {v(r['waves'], '.2f')} waves")
    if not _na(r["align_fallback"]) and r["align_fallback"]:
        out.append(f"alignment fallback: {r['misaligned']} not a multiple of 16 bytes, kernel {r['arch']}")
    elif not _na(r["misaligned"]):
        out.append(f"misaligned leading dimension: {r['misaligned']} (the kernel is not a fallback)")
    if g is not None:
        if g.get("skipped") or g.get("error"):
            out.append(f"not measured: {g.get('skipped') or g.get('error')}")
        else:
            reg = g.get("regret") or {}
            out.append(f"measured: original {v(g.get('original_us'), ',.1f')} µs on its path; heuristic regret "
                       f"{v(reg.get('regret_pct'), '.1f')} % (best candidate #{v(reg.get('best_rank'))})")
    return out


def _svg(fig) -> str:
    """The figure as inline SVG (the page stays one self-contained file)."""
    import io
    import matplotlib.pyplot as plt
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg"):]


def figures(a: Audit, measure: dict | None = None, top: int = 20) -> dict[str, Any]:
    """matplotlib Figures of the audit: GPU time by class, share and % of peak per GEMM, what-if curves."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from cublaslt_probe.trace import timeline_groups
    figs: dict[str, Any] = {}
    g = timeline_groups(a.timeline)
    if len(g):
        fig, ax = plt.subplots(figsize=(7, 0.35 * len(g) + 0.8))
        ax.barh(g["label"][::-1], 100 * g["share"][::-1], color="#4c72b0")
        ax.set_xlabel("% of the step's GPU time")
        ax.set_title("GPU time by provenance, library and kind")
        figs["timeline"] = fig
    rows = a.rows.head(top)
    if len(rows):
        labels = [f"{row_label(r)}{' bwd' if r['pass'] == 'bwd' else ''} · {r['m']}×{r['n']}×{r['k']}"
                  for r in rows.to_dict("records")][::-1]
        fig, (ax1, ax2) = plt.subplots(1, 2, sharey=True, figsize=(11, 0.32 * len(rows) + 1.0))
        ax1.barh(labels, 100 * rows["share"].astype(float)[::-1], color="#55a868")
        ax1.set_xlabel("% of the step's GPU time")
        ax1.set_title("share per GEMM")
        pk = rows["pct_peak"].astype(float)[::-1]
        ax2.barh(labels, pk.fillna(0), color="#c44e52")
        ax2.set_xlabel("% of dense peak")
        ax2.set_xlim(0, 100)
        ax2.set_title("% of peak per GEMM")
        figs["gemms"] = fig
    curves = [g for g in (measure or {}).get("gemms") or [] if g.get("whatifs") and g.get("original_us")][:4]
    if curves:
        # against the elements added (0: the original), so that every dim shares an axis and its ticks stay
        # short integers however large the padded value is
        from matplotlib.ticker import MaxNLocator
        fig, axes = plt.subplots(1, len(curves), figsize=(4 * len(curves), 3), squeeze=False, layout="constrained")
        for ax, g in zip(axes[0], curves):
            k = g.get("key") or {}
            for dim in ("m", "n", "k"):
                pts = sorted((w["value"], w["time_us"]) for w in g["whatifs"]
                             if w.get("dim") == dim and w.get("time_us") and k.get(dim) is not None)
                if pts:
                    ax.plot([0] + [p[0] - k[dim] for p in pts], [g["original_us"]] + [p[1] for p in pts], "o-",
                            label=f"pad {dim} from {k[dim]}")
            ax.axhline(g["original_us"], color="grey", lw=0.8)
            ax.xaxis.set_major_locator(MaxNLocator(nbins=5, integer=True))
            ax.set_title(f"{k.get('m')}×{k.get('n')}×{k.get('k')} {k.get('dtype')}", fontsize=9)
            ax.set_xlabel("elements added")
            ax.set_ylabel("µs")
            ax.legend(fontsize=7)
        figs["whatifs"] = fig
    return figs


def render_html(a: Audit, items: list[dict] | None = None, measure: dict | None = None,
                detail_rows: int = 12) -> str:
    """A self-contained HTML page: summary, GPU time by class, the advice, the GEMM table, figures (inline
    SVG), and for the largest GEMMs the chain of evidence (`chain`) with their measurements when given."""
    import html as H
    e = H.escape
    figs = {k: _svg(f) for k, f in figures(a, measure).items()}
    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>cublaslt-probe audit</title><style>"
             "body{font-family:sans-serif;margin:2em;max-width:1400px}table{border-collapse:collapse;font-size:12px}"
             "td,th{padding:2px 6px;border-bottom:1px solid #ddd;text-align:left}td.n{text-align:right}"
             ".note{color:#a33}.bar{background:#55a868;height:10px;display:inline-block}</style></head><body>",
             "<h1>GEMM audit</h1>", "<ul>" + "".join(
                 f"<li class='{'note' if ln.startswith('note:') else ''}'>{e(ln)}</li>" for ln in summary_lines(a))
             + "</ul>"]
    parts.append("<h2>GPU time by kind and provenance</h2>" + figs.get("timeline", "<p>no GPU time</p>"))
    parts.append("<h2>Advice</h2>")
    if items:
        entries, total, quiet = advice_entries(items)
        parts.append("<ol>" + "".join(f"<li><b>{e(head)}</b><br>evidence: {e(ev)}<br>risk: {e(risk)}</li>"
                                      for _, head, ev, risk in entries) + "</ol>")
        if total:
            parts.append(f"<p>{e(total)}</p>")
        if quiet:
            parts.append("<ul>" + "".join(f"<li>{e(q)}</li>" for q in quiet) + "</ul>")
    else:
        parts.append("<p>no measurements: run <code>audit --measure</code> on the GPU (or render a saved one "
                     "with <code>--from</code>) for advice.</p>")
    parts.append("<h2>GEMMs</h2>")
    head = ["share", "calls", "µs/step", "module", "pass", "op", "dtype", "layout", "m", "n", "k", "groups",
            "family", "provenance", "decoded", "logged algo", "% peak", "× floor", "waves", "flags"]
    num = {0, 1, 2, 8, 9, 10, 11, 16, 17, 18}
    body = []
    for r, cells in zip(a.rows.to_dict("records"), table_rows(a.rows)):
        share = r["share"] if r["share"] is not None and not pd.isna(r["share"]) else 0
        cells[0] = f"<span class='bar' style='width:{max(1, int(200 * share))}px'></span> {e(cells[0])}"
        body.append("<tr>" + "".join(f"<td class='n'>{c}</td>" if i in num and i else
                                     f"<td>{c if i == 0 else e(c)}</td>" for i, c in enumerate(cells)) + "</tr>")
    parts.append("<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in head) + "</tr>" + "".join(body) + "</table>")
    if "gemms" in figs:
        parts.append("<h2>Share and % of peak per GEMM</h2>" + figs["gemms"])
    parts.append("<h2>Per GEMM</h2>")
    if "whatifs" in figs:
        parts.append(figs["whatifs"])
    by_row: dict[int, dict] = {}
    for g in (measure or {}).get("gemms") or []:
        for i in _match_rows(a.rows, g).index:
            by_row.setdefault(int(i), g)
    for i, r in enumerate(a.rows.head(detail_rows).to_dict("records")):
        g = by_row.get(i)
        parts.append(f"<details{' open' if i < 3 else ''}><summary><b>{e(row_label(r))}</b> {e(str(r['pass'] or ''))} "
                     f"{e(str(r['op']))} {r['m']}×{r['n']}×{r['k']}: {r['gpu_us']:,.1f} µs/step</summary><ol>"
                     + "".join(f"<li>{e(x)}</li>" for x in chain(r, g)) + "</ol>")
        if g and not (g.get("skipped") or g.get("error")):
            for name, cols in (("candidates", ("rank", "algo", "kernel", "time_us", "ok_numerics")),
                               ("paths", ("path", "workspace", "kernel", "time_us")),
                               ("whatifs", ("dim", "value", "multiple", "kernel", "time_us"))):
                recs = [{**x, "algo": _cand_text(x)} if name == "candidates" else x for x in g.get(name) or []]
                if recs:
                    parts.append(f"<h4>{name}</h4><table><tr>" + "".join(f"<th>{c}</th>" for c in cols) + "</tr>"
                                 + "".join("<tr>" + "".join(f"<td>{e(str(x.get(c, '')))}</td>" for c in cols)
                                           + "</tr>" for x in recs) + "</table>")
        parts.append("</details>")
    parts.append("</body></html>")
    return "\n".join(parts)
