"""What the trace readers return, and the names both readers share: the GEMM rows' columns (`TRACE_SCHEMA`),
the ops that launch GEMMs and where their operands sit (`GEMM_OPS`, `GROUPED_OPS`), the attribution ranges
kept for `audit` (`RANGE_PREFIXES`), and the kind of a kernel name (`kernel_kind`)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from cublaslt_probe import runfiles
from cublaslt_probe.errors import OptionError
from cublaslt_probe.vocab import TILE_CLUSTER, decoded_columns

REDUCE_FAMILY = "splitk_reduce"

# column -> (pandas dtype, meaning). One row per (kernel, calling op with its input shapes).
TRACE_SCHEMA: dict[str, tuple[str, str]] = {
    "share": ("float64", "fraction of the trace's GPU time (sum of every kernel's duration) in this row"),
    "count": ("Int64", "launches of the GEMM kernel"),
    "total_us": ("float64", "summed duration of those launches, with their split-K reduce kernels, µs"),
    "mean_us": ("float64", "total_us / count"),
    "min_us": ("float64", "shortest launch (with its reduce), µs"),
    "max_us": ("float64", "longest launch (with its reduce), µs"),
    "reduce_us": ("float64", "part of total_us spent in split-K reduce kernels counted with this GEMM"),
    "kernel": ("string", "kernel name as the trace writes it"),
    "family": ("category", "decoded family (nvjet, xmma, cutlass, ...; splitk_reduce for an orphan reduce)"),
    "provenance": ("category", "how the kernel came to exist: library-selected (a cuBLAS/cuBLASLt heuristic "
                               "picked it), ahead-of-time (compiled into a binary, launched directly), "
                               "runtime-compiled, unknown (decoded from the name: docs/provenance.md); "
                               "observed by a cold-start run: runtime-compiled by a named route, or autotuned "
                               "(chosen by timing candidates)"),
    "kernel_short": ("string", "compact decoded form, e.g. 256x128 · 64x4 · 1x2 · coopA"),
    "arch": ("category", "decoded architecture (sm90, ...)"),
    "types": ("string", "decoded dtype code as the name writes it (nvjet: tst), else a/c/compute types"),
    **decoded_columns(*TILE_CLUSTER, "split_k"),
    "kernel_layout": ("string", "layout letters in the name (nvjet TNT, cutlass tn, ...)"),
    "kernel_flags": ("string", "decoded flags, space separated (coopA, splitK, bias, ...)"),
    "op": ("string", "calling CPU op (aten::mm, aten::addmm, aten::_scaled_mm, ...); null when not linked"),
    "input_dims": ("string", "the op's args['Input Dims'] as JSON (record_shapes=True), null without"),
    "input_types": ("string", "the op's args['Input type'] as JSON"),
    "input_strides": ("string", "the op's args['Input Strides'] as JSON"),
    "dtype": ("category", "torch-view dtype of the GEMM op (bf16, fp16, fp32, fp8, fp8_e5m2, ...); fp32 "
                          "may have run as tf32: the trace does not say"),
    "layout": ("category", "torch-view layout from the strides: N = operand contiguous, T = transposed "
                           "(NT = F.linear); null when the strides are absent or ambiguous"),
    "m": ("Int64", "torch view: rows of A and C"),
    "n": ("Int64", "torch view: columns of B and C"),
    "k": ("Int64", "torch view: reduction dimension"),
    "batch": ("Int64", "batch count (bmm, baddbmm; a 3-D x 3-D grouped GEMM: its groups), 1 otherwise"),
    "groups": ("Int64", "grouped GEMM (aten::_grouped_mm, _scaled_grouped_mm): number of problems; null otherwise"),
    "group_dim": ("category", "grouped GEMM: the dimension the offsets split into groups (m, n or k; m, n, k "
                              "give the total over the groups); null for a batched or ungrouped GEMM"),
    "problem_shape": ("category", "CUTLASS 3 kernels: the problem shape the name declares (single, grouped, "
                                  "ptr_array); null when the name says nothing"),
    "pid": ("Int64", "OS pid of the process that launched the kernels; a file of merged rank traces holds "
                     "several (TraceSummary.pids); null when it cannot be told, or not recorded (Nsight export)"),
}

TRACE_COLUMNS = list(TRACE_SCHEMA)

# Innermost torch ops that launch a GEMM, and where their operands sit in "Input Dims".
GEMM_OPS: dict[str, tuple[int, int]] = {
    "aten::mm": (0, 1), "aten::addmm": (1, 2), "aten::_addmm_activation": (1, 2),
    "aten::bmm": (0, 1), "aten::baddbmm": (1, 2), "aten::_scaled_mm": (0, 1),
    "aten::mv": (0, 1), "aten::addmv": (1, 2),
    "aten::_grouped_mm": (0, 1), "aten::_scaled_grouped_mm": (0, 1),
}
# Grouped GEMM ops (mat_a, mat_b, ..., offs): where the offsets sit. torch's convention: 2-D x 3-D = A [ΣM, K],
# B [G, K, N], offsets split M; 3-D x 2-D = A [G, M, K], B [K, ΣN], offsets split N; 2-D x 2-D = A [M, ΣK],
# B [ΣK, N], offsets split K (out [G, M, N]); 3-D x 3-D = a batch of G equal GEMMs, no offsets.
GROUPED_OPS: dict[str, int] = {"aten::_grouped_mm": 2, "aten::_scaled_grouped_mm": 4}

# profiler ranges kept (detail mode) for attribution: the capture's module and step ranges, torch.profiler's
# own steps, and the ``nn.Module: Class_N`` python_function events of ``with_modules=True``
RANGE_PREFIXES = (runfiles.MODULE_PREFIX, runfiles.STEP_PREFIX, "ProfilerStep#")

PY_MODULE_PREFIX = "nn.Module: "


@dataclass
class TraceStats:
    """What a reader saw: counts for the `info` log line, the CLI's header and the benchmark."""

    path: str = ""
    format: str = ""                  # chrome | nsys
    file_bytes: int = 0               # size on disk (compressed when gzip)
    bytes_read: int = 0               # uncompressed bytes parsed
    seconds: float = 0.0
    events: int = 0                   # trace events decoded
    bad_events: int = 0               # malformed events skipped
    truncated: bool = False           # the file ended inside the event array
    gzip_damaged_after_events: bool = False   # the gzip stream breaks only after the last event: all were read
    gzip_error: str = ""              # zlib's message where the gzip stream breaks (damaged, not just cut off)
    bad_durations: int = 0            # kernel / copy events whose dur is missing, not a number, NaN, negative,
                                      # infinite or longer than the trace (kept, counted as 0 µs)
    long_durations: int = 0           # ... of them, longer than the trace (its first start to its last end)
    duplicate_events: int = 0         # kernel / copy events that repeat an earlier one exactly: counted once
    duplicate_us: float = 0.0         # ... their durations, not counted
    zero_durations: int = 0           # kernel / copy events whose dur is 0 (valid: kept as 0 µs, counted)
    bad_ids: int = 0                  # correlation / External ids outside 0 .. 2^63-1 (read as missing: unlinked)
    kernels: int = 0                  # kernel launches (all families)
    copies: int = 0                   # memcpy / memset rows on the GPU
    gpu_time_us: float = 0.0          # summed duration of the kernels, memcpys and memsets
    gemm_launches: int = 0
    reduce_launches: int = 0
    reduce_attached: int = 0
    linked: int = 0                   # GEMM launches linked to a CPU op
    with_shapes: int = 0              # ... whose op recorded its input shapes
    cpu_ops: int = 0
    flows: int = 0
    processes: int = 0                # OS processes with ops or runtime calls (several: merged rank traces)
    no_process: int = 0               # launches whose process cannot be told (several processes only)

    def line(self) -> str:
        mb = self.bytes_read / 1e6
        return (f"read {self.path} ({self.format}, {mb:,.1f} MB) in {self.seconds:.2f} s: "
                f"{self.events:,} events, {self.kernels:,} kernel launches, "
                f"{self.gemm_launches:,} GEMM ({self.linked:,} linked to an op, {self.with_shapes:,} with "
                f"shapes), {self.bad_events:,} bad events, {self.bad_durations:,} without a numeric dur")


@dataclass
class TraceSummary:
    """The GEMM-kind kernels of one trace (`kernels`, columns `TRACE_COLUMNS`), its GPU time by class
    (`timeline`), and the trace's totals."""

    kernels: pd.DataFrame
    gpu_time_us: float
    stats: TraceStats
    meta: dict[str, Any] = field(default_factory=dict)          # top-level keys other than traceEvents
    families: pd.DataFrame | None = None                          # GPU time per decoded family, all kernels
    timeline: pd.DataFrame | None = None      # GPU time by (kind, provenance, family), columns TIMELINE_SCHEMA
    detail: "TraceDetail | None" = None       # read_chrome_trace(detail=True): launches, ops, ranges (audit)
    pids: list = field(default_factory=list)  # OS pids of the processes the file holds, in order of appearance

    @property
    def gemm_time_us(self) -> float:
        return float(self.kernels["total_us"].sum()) if len(self.kernels) else 0.0

    @property
    def device(self) -> str | None:
        """GPU name(s) the trace records (Kineto's ``deviceProperties``), else None."""
        props = self.meta.get("deviceProperties")
        if isinstance(props, dict):
            props = [props]
        if isinstance(props, list):
            names = sorted({p.get("name") for p in props if isinstance(p, dict) and p.get("name")})
            return ", ".join(names) or None
        return None


@dataclass
class TraceDetail:
    """What `audit` needs beyond the summary (``read_chrome_trace(path, detail=True)``): every launch, every
    op's time and thread, the attribution ranges. Arrays, not per-event objects.

    - ``launches``: one row per kernel launch (split-K reduces counted with their GEMM and dropped):
      ``name`` (index into `names`), ``kind`` (1 GEMM, 2 orphan reduce, 0 other), ``dur`` (with the
      reduce), ``reduce_us``, ``ts`` (GPU start), ``t_launch`` (CPU time of its launch call, else of its
      op, else ``ts``), ``op_row`` (row in `ops`, -1 when unlinked), ``pid`` (the OS pid of the process that
      launched it, -1 when it cannot be told: `read_chrome_trace` says how it is found), ``device``;
    - ``ops``: one row per CPU op / annotation with an External id: ``key`` (index into `op_keys`), ``ts``,
      ``end``, ``tid``, ``seq`` (autograd ``Sequence number``, -1 without), ``pid``;
    - ``ranges``: the attribution ranges (`RANGE_PREFIXES` annotations and ``nn.Module:`` python functions,
      written as complete events or as B/E pairs): ``name``, ``ts``, ``end``, ``tid``, ``pid``, ``gpu``,
      ``device``. ``gpu`` is True for the GPU-timeline copies of the annotations (``gpu_user_annotation``:
      their ``tid`` is the stream, ``device`` the GPU, ``pid`` the GPU's only launching process, else the one
      process whose kernels start inside the range on its stream, else -1); CPU ranges have ``gpu`` False
      and ``device`` -1.

    A file may hold several processes (merged rank traces): `processes` lists them, `for_process` keeps one.
    """

    names: list
    op_keys: list
    launches: pd.DataFrame
    ops: pd.DataFrame
    ranges: pd.DataFrame

    def processes(self) -> pd.DataFrame:
        """One row per process that launched kernels or ran ops, by pid: ``pid``, ``devices`` (the GPUs of
        its launches, "0, 1"), ``gemm_launches``, ``gpu_time_us`` (its launches' summed time); a last row
        with pid -1 holds the launches whose process cannot be told, when there are any."""
        L = self.launches
        pids = sorted((set(self.ops["pid"].tolist()) | set(L["pid"].tolist())) - {-1})
        rows = []
        for p in pids + ([-1] if (L["pid"] == -1).any() else []):
            mine = L[L["pid"] == p]
            rows.append((p, ", ".join(str(d) for d in sorted(set(mine["device"].tolist()))),
                         int((mine["kind"] == 1).sum()), float(mine["dur"].sum())))
        return pd.DataFrame(rows, columns=["pid", "devices", "gemm_launches", "gpu_time_us"]).astype(
            {"pid": "int64", "devices": "string", "gemm_launches": "int64", "gpu_time_us": "float64"})

    def for_process(self, pid: int) -> "TraceDetail":
        """The part of the trace that belongs to process `pid`: its ops and CPU ranges, its launches, and the
        launches and GPU ranges of its GPUs whose process cannot be told. ``op_row`` is renumbered into the
        kept ops."""
        L, ops, rng = self.launches, self.ops, self.ranges
        if pid not in set(ops["pid"].tolist()) | set(L["pid"].tolist()):
            known = sorted((set(ops["pid"].tolist()) | set(L["pid"].tolist())) - {-1})
            raise OptionError(f"--pid {pid}: no such process in this trace: it holds "
                              f"{', '.join(map(str, known)) or 'none'}")
        devices = set(L.loc[L["pid"] == pid, "device"].tolist())
        keep_ops = (ops["pid"] == pid).to_numpy()
        new_row = np.cumsum(keep_ops) - 1
        L = L[(L["pid"] == pid) | ((L["pid"] == -1) & L["device"].isin(devices))].copy()
        r = L["op_row"].to_numpy().copy()
        ok = r >= 0
        r[ok] = np.where(keep_ops[r[ok]], new_row[r[ok]], -1)
        L["op_row"] = r
        rng = rng[(rng["pid"] == pid) | (rng["gpu"] & (rng["pid"] == -1) & rng["device"].isin(devices))]
        return TraceDetail(names=self.names, op_keys=self.op_keys, launches=L.reset_index(drop=True),
                           ops=ops[keep_ops].reset_index(drop=True), ranges=rng.reset_index(drop=True))


RANGE_COLUMNS = ["name", "ts", "end", "tid", "pid", "gpu", "device"]


def classify(kn) -> tuple[str, str]:
    """(kind, provenance) of a decoded kernel name: the decoder's classes (`cublaslt_probe.names.classes`)."""
    return kn.kind, kn.provenance


def kernel_kind(name: str, cache: dict) -> int:
    """0: not GEMM related, 1: a GEMM-kind kernel (whichever library), 2: split-K reduce helper."""
    k = cache.get(name)
    if k is None:
        from cublaslt_probe.names import decode
        kn = decode(name)
        k = cache[name] = 2 if kn.family == REDUCE_FAMILY else 1 if classify(kn)[0] == "gemm" else 0
    return k
