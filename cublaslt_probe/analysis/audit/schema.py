"""The audit's row and result: `AUDIT_SCHEMA` (one row per distinct GEMM: column -> pandas dtype, meaning),
the jsonl key order (`FIXED_KEYS`, `jsonl_frame`), the `Audit` dataclass `core.audit` returns, and the row helpers
every other part of the audit uses (`_na`: a missing value; `row_label`: the module or op a row names). CPU only.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from cublaslt_probe.analysis.grouped import GROUPED_COLUMNS
from cublaslt_probe.analysis.trace import TRACE_SCHEMA
from cublaslt_probe.vocab import TILE_CLUSTER, decoded_columns

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
    "known_issue": ("string", "the cuBLAS release-note bugs the logged algo config (with the kernel) meets or can "
                              "meet on the run's cuBLAS (env.json) and the GPU's compute capability, and the "
                              "fixing version (null: none, or no log line)"),
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
    **GROUPED_COLUMNS,   # group sizes and the grouped roofline's waves (`grouped.join_sizes`)
    "graph": ("Int64", "the CUDA graph its launches were replayed from (the number the capture gave the graph "
                       "it saw captured: `graphs.join`); null for launches run eagerly"),
    "gpu": ("string", "the GPU its launches ran on, whose peaks and SM count judge it (a trace of several kinds "
                      "of GPU has a row per kind)"),
}
AUDIT_COLUMNS = list(AUDIT_SCHEMA)
# The keys every jsonl row carries in this order (the rest follow).
FIXED_KEYS = ("module", "op", "dtype", "layout", "m", "n", "k", "batch", "groups", "calls", "gpu_us", "share",
              "kernel", "family", "provenance", "algo", "tflops", "pct_peak", "floor_us", "waves",
              "align_fallback", "split_k")


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
    observed: dict | None = None          # cold-start evidence applied (`coldstart.observed.apply_observed`)
    partial: bool = False                 # the trace was damaged (cut off, malformed events, durations lost)
    warning: str | None = None            # the steps hold under half of the trace's GEMM time: how much is left
                                          # out and how to count it (the audit's first line)

    @property
    def attributed_share(self) -> float:
        """Fraction of the step's GEMM time in rows that have a module."""
        if not self.gemm_gpu_us:
            return 0.0
        return float(self.rows.loc[self.rows["module"].notna(), "gpu_us"].sum() / self.gemm_gpu_us)


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


def row_label(r: dict) -> str:
    """``model.layers.*.mlp.down_proj ×32`` (the module and how many it collapses; else the op)."""
    mod, inst, op = r.get("module"), r.get("instances"), r.get("op")
    if _na(mod):
        return "(no module)" if not _na(op) else "(no op)"
    return str(mod) + (f" ×{int(inst)}" if not _na(inst) and int(inst) > 1 else "")
