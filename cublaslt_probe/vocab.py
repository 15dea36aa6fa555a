"""One definition per kind of value: backends, ops, dtypes, layouts, presets, environment keys, peak rates.

Frozen tables (tuples, read-only mappings, frozen dataclasses), as `cutlass_library` keeps one table per
kind. The CLI's choices, the sweep spec's checks, the report's and the plots' order, the environment match
of resume, merge and diff, and explain's peaks read them here. CPU only, no imports of the package.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping

# --- what one GEMM of a sweep is (cases.Case) ------------------------------------------------------------
BACKENDS = ("torch", "torch-lt", "cupy", "lt")     # GPU backends: torch's cuBLAS path, its cuBLASLt path, cupy, lt.py
TEST_BACKENDS = ("numpy",)                         # the CPU executor that tests the sweep machinery
OPS = ("mm", "bmm", "addmm", "scaled_mm", "grouped_mm", "scaled_grouped_mm")
GROUPED_OPS = ("grouped_mm", "scaled_grouped_mm")   # torch._grouped_mm, torch._scaled_grouped_mm (cases.Case.groups)
SCALED_OPS = ("scaled_mm", "scaled_grouped_mm")    # the fp8 ops
DTYPES = ("fp32", "tf32", "fp16", "bf16", "fp8", "fp8_e5m2")
FP8_DTYPES = ("fp8", "fp8_e5m2")                   # fp8 is e4m3 x e4m3, fp8_e5m2 is e5m2 x e4m3; both write bf16
LAYOUTS = ("NN", "NT", "TN", "TT")                 # torch view: a T = that operand stored transposed
PRESETS = ("quick", "llm", "square", "decode", "grid", "regret", "moe")
WINDOW = 128   # GEMMs per sweep window by default: a window's profiler session has a fixed cost whatever it
               # holds, which a larger window spreads over more GEMMs (docs/decisions.md, "Windows of 128")

# Their spellings elsewhere (torch, cuBLAS logs) and bytes per element: dtypes.py.

# Display order of categorical columns (report tables, plot legends and panels, selection), where it reads
# better than the definition order; `numpy` last.
ORDER = MappingProxyType({
    "backend": ("torch", "torch-lt", "lt", "cupy") + TEST_BACKENDS,
    "dtype": DTYPES,
    "layout": LAYOUTS,
    "op": ("mm", "addmm", "bmm", "scaled_mm", "grouped_mm", "scaled_grouped_mm"),
})

# --- decoded fields as table columns ----------------------------------------------------------------------
# The fields of a decoded kernel name (names.KernelName) that tables carry, with one column type and one
# meaning each: dataset.SCHEMA reads them here (`kernel_short` is KernelName.short).
DECODED_COLUMNS = MappingProxyType({
    "family": ("category", "decoded family of `kernel` (nvjet, xmma, cutlass, gemv, ...; unknown if not understood)"),
    "tile_m": ("Int64", "decoded tile M of `kernel` (as the name writes it)"),
    "tile_n": ("Int64", "decoded tile N"),
    "tile_k": ("Int64", "decoded K tile"),
    "stages": ("Int64", "decoded pipeline stages"),
    "cluster_m": ("Int64", "decoded cluster M"),
    "cluster_n": ("Int64", "decoded cluster N"),
    "split_k": ("boolean", "decoded: the name says split-K (null when the family says nothing)"),
    "kernel_short": ("string", "compact decoded form for legends, e.g. 256x128 · 64x4 · 1x2 · coopA"),
})

TILE_CLUSTER = ("tile_m", "tile_n", "tile_k", "stages", "cluster_m", "cluster_n")   # the decoded shape fields


def decoded_columns(*names: str) -> dict:
    """The `DECODED_COLUMNS` entries (type, meaning) of `names`, in that order: a table's schema takes them here."""
    return {n: DECODED_COLUMNS[n] for n in names}


# --- the environment a measurement was made in ------------------------------------------------------------
ENV_KEYS = ("gpu", "sm_count", "driver", "cuda_runtime", "cublaslt_version", "torch_version", "cupy_version")
# Kernel choice depends on these: the GPU, the cuBLASLt build, the torch build (its workspace and heuristic
# settings) and the driver. Resume, merge and diff refuse to join measurements that differ in one of them.
ENV_MATCH = ("gpu", "cublaslt_version", "torch_version", "driver")
# `diff`: a time change within ±this many percent counts as "within" (neither faster nor slower).
DIFF_TOLERANCE_PCT = 5.0

# --- the paths a GEMM can take ----------------------------------------------------------------------------
# Workspace limit each path's heuristic query uses: torch's cuBLAS handle allows 32 MiB (its Api log line),
# torch's Lt path asks for 1 MiB (measured with torch 2.11), the lt backend passes 32 MiB (`lt.Problem`'s
# default and `candidates --workspace`'s).
WORKSPACE_BYTES = MappingProxyType({"cublas": 32 << 20, "torch-lt": 1 << 20, "lt": 32 << 20})


# --- peak rates -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Peaks:
    """Datasheet dense (no sparsity) peak TFLOP/s by dtype and HBM bandwidth of one GPU product."""

    product: str
    tflops: Mapping[str, float]
    hbm_tbps: float
    source: str

    def describe(self) -> str:
        t = self.tflops
        return (f"{self.source}, dense: bf16/fp16 {t['bf16']:g}, tf32 {t['tf32']:g}, fp8 {t['fp8']:g}, "
                f"fp32 {t['fp32']:g} TFLOP/s, HBM {self.hbm_tbps:g} TB/s")


def _rates(fp32: float, tf32: float, half: float, fp8: float) -> Mapping[str, float]:
    return MappingProxyType({"fp32": fp32, "tf32": tf32, "fp16": half, "bf16": half, "fp8": fp8, "fp8_e5m2": fp8})


# NVIDIA's H100 and H200 datasheets: the tensor-core figures are given with sparsity, halved here; fp32 is
# the plain (non-tensor-core) rate. The H200 has the H100 SXM's arithmetic with faster memory.
_H100_SXM = _rates(66.9, 494.7, 989.5, 1978.9)
_NVL = _rates(60.0, 417.5, 835.5, 1670.5)
PEAKS = MappingProxyType({p.product: p for p in (
    Peaks("H100 SXM", _H100_SXM, 3.35, "NVIDIA H100 SXM datasheet"),
    Peaks("H100 PCIe", _rates(51.2, 378.0, 756.5, 1513.0), 2.0, "NVIDIA H100 PCIe datasheet"),
    Peaks("H100 NVL", _NVL, 3.9, "NVIDIA H100 NVL datasheet"),
    Peaks("H200 SXM", _H100_SXM, 4.8, "NVIDIA H200 SXM datasheet"),
    Peaks("H200 NVL", _NVL, 4.8, "NVIDIA H200 NVL datasheet"),
)})
# The device name the driver reports (torch.cuda.get_device_properties().name, without "NVIDIA ") -> product.
GPU_PRODUCTS = MappingProxyType({
    "H100 80GB HBM3": "H100 SXM",
    "H100 PCIe": "H100 PCIe",
    "H100 NVL": "H100 NVL",
    "H200": "H200 SXM",
    "H200 NVL": "H200 NVL",
})
# What a plain torch bf16 matmul reached on the H200 this project measured on (8192^3, random data).
MEASURED_TFLOPS = MappingProxyType({"bf16": 788.0})


def gpu_peaks(gpu: str | None) -> Peaks | None:
    """The peaks of the GPU named `gpu` (as the driver reports it), or None when its product is not in
    `GPU_PRODUCTS`: an unknown GPU has an unknown peak, never another product's."""
    if not gpu:
        return None
    name = str(gpu).strip()
    name = name[len("NVIDIA "):] if name.startswith("NVIDIA ") else name
    product = GPU_PRODUCTS.get(name)
    return PEAKS[product] if product else None


def peak_tflops(dtype: str, gpu: str | None) -> float | None:
    """Datasheet dense peak TFLOP/s of `dtype` on `gpu`; None when either is unknown."""
    p = gpu_peaks(gpu)
    return p.tflops.get(str(dtype)) if p else None


# The file formats a picture is written in (`render.plots.save`, `map`, `plot`, `diff --map`).
IMAGE_FORMATS = ("png", "svg", "pdf")


# --- how each figure is rounded, for every table, sentence and page that prints it -------------------------
FIGURE_FORMATS = MappingProxyType({
    "floor_ratio": ".2f", "waves": ".2f", "pct_peak": ".1f", "tflops": ".1f", "gpu_us": ",.1f", "mean_us": ",.2f",
    "floor_us": ",.2f", "calls": "g", "group_imbalance": ".2f", "group_mean": ".1f",
})


def figure(name: str, v) -> str:
    """The figure `name` (a column of `FIGURE_FORMATS`) as text: rounded once, the same everywhere it is
    printed; an empty string when it is missing (None or NaN)."""
    if v is None or (isinstance(v, float) and v != v) or type(v).__name__ in ("NAType", "NaTType"):
        return ""
    try:
        return format(v, FIGURE_FORMATS[name])
    except (TypeError, ValueError):
        return str(v)
