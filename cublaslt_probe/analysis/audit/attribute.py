"""Where each GEMM launch of an audited trace belongs: the run's files and env facts, the GPU facts that judge
it, its step, its module and pass, and the cuBLASLt log lines that record it. CPU only.

How a GEMM launch is attributed (the trace's own links; `trace.read_chrome_trace(detail=True)` reads them):
- to a step: its launch call's CPU time lies inside a ``runfiles.STEP_PREFIX`` range (else a torch.profiler
  ``ProfilerStep#N`` range; without either the whole trace is one step), the ranges checked first
  (`_step_ranges`); a kernel without a launch record is placed by its GPU time (`_place_by_gpu_time`);
- to a module: its launching op (External id / correlation) lies inside the innermost ``runfiles.MODULE_PREFIX``
  range of its thread (else inside an ``nn.Module: Class_N`` python function of ``with_modules=True``);
- backward: an op inside ``autograd::engine::evaluate_function: XBackward0`` takes that node's ``Sequence
  number``, and the module of the forward op that recorded the same number in its process (``pass`` = bwd).
- to log lines: the cuBLASLt log's GEMMs of the traced process and time span, grouped by problem
  (`_log_groups`), joined to a row by its problem (`_join_log`).
"""
from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from cublaslt_probe import runfiles
from cublaslt_probe.analysis.audit.schema import _na
from cublaslt_probe.analysis.trace import PY_MODULE_PREFIX
from cublaslt_probe.analysis.trace.ranges import contained, innermost, range_parents
from cublaslt_probe.dtypes import log_dtype
from cublaslt_probe.errors import ProbeError
from cublaslt_probe.vocab import gpu_peaks

EVAL_PREFIX = "autograd::engine::evaluate_function: "


_CLASS_ORDER = re.compile(r"(\w*[^\W\d]\w*?)_\d+")   # <class>_<order>: a class of any script, then digits


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
    """(dense peak TFLOP/s by dtype, HBM TB/s, source) of a GPU (`vocab.gpu_peaks`); Nones when unknown."""
    p = gpu_peaks(gpu)
    return (dict(p.tflops), p.hbm_tbps, p.describe()) if p else (None, None, None)


# --------------------------------------------------------------------------- attribution
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
    return log_dtype(rec.a_type, rec.b_type, rec.compute_type)


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


def _join_log(row: dict, kn, groups: dict[tuple, list], steps: int):
    """Fill the row's log columns from the log records of its problem; the record joined (None: none)."""
    from cublaslt_probe.analysis.evidence import consistency
    if not groups or _na(row.get("m")) or _na(row.get("layout")):
        return None
    dt = row.get("dtype")
    key = (row["m"], row["n"], row["k"], row.get("batch") or 1, row["layout"], "fp32" if dt == "tf32" else dt)
    recs = groups.get(key)
    if not recs:
        return None
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
    return r


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
      of steps, not a step; a range inside one of its own name is that step's mark written again.
    - Ranges of several threads or processes may overlap in time: `contained` gives each launch one of them
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
    ts, end, names = steps["ts"].to_numpy(), steps["end"].to_numpy(), steps["name"].to_numpy()
    par = range_parents(ts, end, group)
    inside = par >= 0
    inside[inside] = end[inside] <= end[par[inside]]                     # enclosed, not merely overlapping
    again = inside & (names == names[np.maximum(par, 0)])                # a mark written again inside itself
    encl = np.zeros(len(steps), dtype=bool)
    encl[par[inside & ~again]] = True                                   # encloses another step: a stretch
    if again.any():
        notes.append(f"{int(again.sum()):,} step range(s) written again inside a range of the same name "
                     f"({', '.join(sorted(set(names[again]))[:3])}): the outer one is the step")
    if encl.any():
        enc = sorted(set(steps["name"][encl]))
        notes.append(f"{int(encl.sum()):,} step range(s) enclose other step ranges ({', '.join(enc[:3])}"
                     f"{', …' if len(enc) > 3 else ''}): a stretch of steps, not a step")
    steps = steps[~encl & ~again]
    o = np.argsort(steps["ts"].to_numpy(), kind="stable")
    t_sorted, e_sorted = steps["ts"].to_numpy()[o], steps["end"].to_numpy()[o]
    if len(o) > 1 and (t_sorted[1:] < np.maximum.accumulate(e_sorted)[:-1]).any():
        who = "processes" if "pid" in steps.columns and steps["pid"].nunique() > 1 else "threads"
        notes.append(f"step ranges of several {who} overlap in time: each launch is counted in one of them")
    return steps


COVERAGE = 0.5     # steps holding less of the trace's GEMM time than this say so on the audit's first line


def _in_steps(det, env: dict, notes: list[str], gpu: pd.DataFrame | None = None, warmup: int | None = None,
              whole_trace: bool = False) -> tuple[pd.DataFrame, int, str | None]:
    """The launches inside the steps (`_step_ranges`; without any, the steps `steps.found_steps` finds from
    the module ranges, the first `warmup` left out (None: the capture's, else `steps.WARMUP`); without those,
    with `whole_trace`, or when the capture asked for the whole stretch as one step, the whole trace is one
    step), the number of steps (`_step_count`), and a warning when the steps hold under `COVERAGE` of the
    trace's GEMM time (`_coverage`). A launch belongs to the step whose range holds its launch call's CPU time
    (of its own process first, where the trace tells processes apart); a launch without a launch record (no
    runtime event, no op: its CPU time is unknown) is placed by its GPU time (`_place_by_gpu_time`, with
    `gpu`: the GPU-timeline copies of the ranges, when they are not among ``det.ranges``)."""
    from cublaslt_probe.analysis.steps import WARMUP, found_steps, outside_note
    L = det.launches
    cap = env.get("capture") or {}
    if whole_trace:
        notes.append("the whole trace is one step (--whole-trace): model loading, warm-up and first calls are "
                     "in it, and every step mark is ignored")
        return L, 1, None
    cpu, copies = _split_ranges(det)
    gpu = copies if gpu is None else gpu
    steps_r = _step_ranges(cpu, notes)
    found, warmed = not len(steps_r), 0
    if found and cap.get("step_finding") == "whole":
        notes.append("the capture asked for the whole run as one step (--whole-script): model loading and first "
                     "calls are in it")
        return L, 1, None
    if found:
        if warmup is None:
            w = cap.get("warmup")
            warmup = w if isinstance(w, int) and not isinstance(w, bool) and w >= 0 else WARMUP
        steps_r, how, warmed = found_steps(det, cpu, warmup)
        notes.append(how)
        if not len(steps_r):
            return L, 1, None
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
    if found:
        where = outside_note(L, det.names, step >= 0, steps_r)
        if where:
            notes.append(where)
    return L[step >= 0], _step_count(steps_r, step, notes), _coverage(L, step >= 0, warmed)


def _coverage(L: pd.DataFrame, inside: np.ndarray, warmed: int) -> str | None:
    """The warning that the steps hold under `COVERAGE` of the trace's GEMM time (launches `L`, `inside` the
    steps; `warmed` steps found were left out as warm-up): how much is left out and how to count it; None
    otherwise."""
    dur = L["dur"].to_numpy(dtype=np.float64)
    gemm = L["kind"].to_numpy() > 0
    total, held = float(dur[gemm].sum()), float(dur[gemm & inside].sum())
    if total <= 0 or held >= COVERAGE * total:
        return None
    how = (f"--warmup 0 keeps the {warmed} step(s) left out as warm-up, " if warmed else "") + \
        "--whole-trace audits the whole trace as one step"
    return (f"the audited steps hold {100 * held / total:.1f} % of the trace's GEMM time: {(total - held) / 1e3:,.3f} "
            f"ms of GEMMs ran outside them and are left out ({how})")


def _step_count(steps_r: pd.DataFrame, step: np.ndarray, notes: list[str]) -> int:
    """How many steps the ranges `steps_r` stand for, given the range each launch fell in (`step`, -1: none).

    A step is a name over a stretch of time: ranges of one name that overlap (the same marks on a second
    thread, a mark written again) are one step, and one whose ranges hold no launch (an empty mark) is none;
    a note names both. Several processes (merged rank traces) run the same steps at once, so a step is every
    process's step of that name and the count is the largest any one process has. At least 1."""
    held = np.bincount(step[step >= 0], minlength=len(steps_r))[:len(steps_r)] > 0
    f = pd.DataFrame({"pid": steps_r["pid"].to_numpy() if "pid" in steps_r.columns else 0,
                      "tid": steps_r["tid"].to_numpy() if "tid" in steps_r.columns else 0,
                      "name": steps_r["name"].to_numpy(), "ts": steps_r["ts"].to_numpy(),
                      "end": steps_r["end"].to_numpy(), "held": held}).sort_values(["pid", "name", "ts"])
    reach = f.groupby(["pid", "name"], sort=False)["end"].cummax()
    prev = reach.groupby([f["pid"], f["name"]], sort=False).shift()
    f["stretch"] = (~(f["ts"] <= prev)).groupby([f["pid"], f["name"]], sort=False).cumsum()
    by = f.groupby(["pid", "name", "stretch"], sort=False).agg(held=("held", "any"), n=("held", "size"),
                                                               tids=("tid", "nunique"))
    empty = by[~by["held"]]
    if len(empty):
        names = sorted({str(k[1]) for k in empty.index})
        notes.append(f"{len(empty):,} step mark(s) hold no GPU work ({', '.join(names[:3])}"
                     f"{', …' if len(names) > 3 else ''}): not counted as steps")
    again = by[by["held"] & (by["n"] > 1)]
    if len(again):
        names = sorted({str(k[1]) for k in again.index})
        threads = int(again["tids"].max())
        notes.append(f"{len(again):,} step(s) marked more than once ({', '.join(names[:3])}"
                     f"{', …' if len(names) > 3 else ''}: {int(again['n'].sum()):,} overlapping ranges"
                     + (f" on up to {threads} threads" if threads > 1 else "") + "): each counted as one step")
    counted = by[by["held"]].groupby(level="pid").size()
    return max(int(counted.max()) if len(counted) else 0, 1)


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
            if not len(w):                      # no copy of a step's range on this GPU
                return np.full(int(on.sum()), -1, dtype=np.int64)
            got = contained(w_ts[w], w_end[w], ts[on])
            return np.where(got >= 0, w_step[w][np.maximum(got, 0)], -1)
        put(per_device(copies), "inside the GPU copy of one of its step's ranges")
    placed = (step >= 0) & ~unknown
    if todo.any() and placed.any():                                 # 2. the step's kernels' GPU span
        def span(on):
            mine = placed & on
            sp = pd.DataFrame({"step": step[mine], "ts": ts[mine], "end": end[mine]}).groupby("step").agg(
                ts=("ts", "min"), end=("end", "max"))
            got = contained(sp["ts"].to_numpy(), sp["end"].to_numpy(), ts[on])
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
    """`contained` for points with an owning process (``owners.pid``, -1: unknown): a range of the point's own
    process first (where the ranges tell processes apart), else any."""
    r_ts, r_end = ranges["ts"].to_numpy(), ranges["end"].to_numpy()
    out = np.full(len(pts), -1, dtype=np.int64)
    if "pid" in owners.columns and "pid" in ranges.columns:
        pp, rp = owners["pid"].to_numpy(), ranges["pid"].to_numpy()
        for p in np.intersect1d(np.unique(pp[pp != -1]), np.unique(rp)):
            pi, ri = np.flatnonzero(pp == p), np.flatnonzero(rp == p)
            got = contained(r_ts[ri], r_end[ri], pts[pi])
            out[pi[got >= 0]] = ri[got[got >= 0]]
    rest = out < 0
    out[rest] = contained(r_ts, r_end, pts[rest])
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
        module[linked] = innermost(m_ts, m_end, m_tid, o_ts[op_row[linked]], o_tid[op_row[linked]])
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
                inner = innermost(o_ts[ev_rows], ops["end"].to_numpy()[ev_rows], o_tid[ev_rows], o_ts[rn],
                                   o_tid[rn])
                seq = np.where(inner >= 0, o_seq[ev_rows[np.maximum(inner, 0)]], -1)
            wanted = np.unique(seq[seq >= 0])
            if len(wanted):
                fwd = np.flatnonzero(np.isin(o_seq, wanted) & ~is_eval)
                fmod = innermost(m_ts, m_end, m_tid, o_ts[fwd], o_tid[fwd])
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
    par = range_parents(mods["ts"].to_numpy(), mods["end"].to_numpy(), _threads(mods)[0])
    out = []
    for i in range(len(names)):
        j, path = par[i], [names[i]]
        while j >= 0:
            path.append(names[j])
            j = par[j]
        out.append(".".join(reversed(path)))
    return out
