"""`KernelName`: what a cuBLAS kernel name says, as typed fields.

Every field is ``None`` when the name's family does not write it. Numbers are exactly as the name writes
them (for nvjet: first ``AxB`` is ``tile_m``x``tile_n``, the second ``tile_k``x``stages``, the third
``cluster_m``x``cluster_n``); dtypes are canonical strings (``fp32``, ``tf32``, ``fp16``, ``bf16``,
``fp8_e4m3``, ``fp8_e5m2``, ``fp64``, ``int8``, ``int32``, ``complex64``, ...).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

# The keys `cublaslt-probe decode --format jsonl|csv` always writes, in this order (issue 2).
JSONL_KEYS = ("name", "family", "arch", "a_type", "b_type", "c_type", "compute_type", "tile_m", "tile_n",
              "tile_k", "stages", "cluster_m", "cluster_n", "split_k", "layout", "trans_a", "trans_b",
              "flags", "unparsed")


LABEL_WIDTH = 120   # a kernel name longer than this is shown as its decoded label (`KernelName.label`)


@dataclass(frozen=True)
class KernelName:
    """One decoded kernel name. Build it with `decode`; `encode` turns it back into the bare name."""

    name: str                                   # the raw input, as given
    base: str = ""                              # the bare identifier the grammar parsed
    family: str = "unknown"                     # nvjet, xmma, cutlass, cutlass3x, legacy, gemv, ...
    source: str = "bare"                        # bare | demangled | mangled | activity
    kind: str = "other"                         # classes.KINDS: gemm, attention, elementwise, ...
    provenance: str = "unknown"                 # classes.PROVENANCES: library-selected, ahead-of-time, ...
    evidence: str = "name"                      # classes.EVIDENCE: what kind/provenance rest on
    library: str | None = None                  # who ships/launches it: cublas, cudnn, torch, triton, ...
    ambiguity: str | None = None                # why the name alone cannot settle the provenance, if so
    arch: str | None = None                     # sm90, sm100, ... (legacy words mapped: ampere -> sm80)
    op: str | None = None                       # gemm, sparse_gemm, gemv, reduce, memset, ...
    variant: str | None = None                  # cutlass opcode class (tensorop/simt/wmma_tensorop), ...
    type_code: str | None = None                # the dtype token(s) exactly as written (nvjet: "tst")
    a_type: str | None = None
    b_type: str | None = None
    c_type: str | None = None
    d_type: str | None = None
    compute_type: str | None = None             # accumulator / compute type
    math_type: str | None = None                # MMA input type when the name says it (xmma "tf32f32")
    scale_type: str | None = None               # alpha/beta (epilogue) type (xmma third group)
    tile_m: int | None = None
    tile_n: int | None = None
    tile_k: int | None = None
    stages: int | None = None
    cluster_m: int | None = None
    cluster_n: int | None = None
    cluster_k: int | None = None
    split_k: bool | None = None
    segment_k: bool | None = None
    raster: str | None = None                   # nvjet: h | v
    beta: str | None = None                     # nvjet: bz | badd
    layout: str | None = None                   # layout letters as written (TNT, tn, tnn, TNNN)
    layout_c: str | None = None                 # xmma: the C layout letter written after the A/B pair
    trans_a: bool | None = None
    trans_b: bool | None = None
    swap_ab: bool | None = None                 # nvjet last layout letter T: the kernel exchanges A and B
    flags: tuple[str, ...] = ()
    align_a: int | None = None
    align_b: int | None = None
    align_c: int | None = None
    warp_shape: tuple[int, ...] | None = None
    warpgroup_shape: tuple[int, ...] | None = None
    warp_tile: tuple[int, ...] | None = None    # per-warp tile MxNxK (nvjet sm120)
    instruction: str | None = None              # MMA instruction kind (tensor, hgmma, ffma, ...)
    instruction_shape: tuple[int, ...] | None = None
    epilogue: str | None = None                 # fused epilogue ops written in the name (relu, bias_f32_relu)
    schedule: str | None = None                 # cutlass3x kernel/epilogue schedule tokens
    problem_shape: str | None = None            # CUTLASS 3: classes.PROBLEM_SHAPES (single, grouped, ptr_array)
    mma_atom: str | None = None                 # CUTLASS 3 / CuTe MMA atom (SM90_64x128x16_F32BF16BF16_SS)
    head_dim: int | None = None                 # attention kernels: head dimension
    fused_ops: tuple[str, ...] = ()             # Triton/Inductor: the ATen ops fused into the kernel
    index: int | None = None                    # Triton/Inductor: the kernel's number in its graph
    suffix: str | None = None                   # build tag after the kernel body (xmma "_5x_cublas")
    template_args: tuple[str, ...] = ()         # demangled C++ template arguments (helpers)
    tokens: tuple[str, ...] = ()                # the base split into grammar tokens
    unparsed: tuple[str, ...] = ()              # tokens no rule claimed (and <missing:...> slots)

    # ------------------------------------------------------------------ views
    @property
    def known(self) -> bool:
        """True when the family is known and every token was understood."""
        return self.family != "unknown" and not self.unparsed

    @property
    def short(self) -> str:
        """Compact human form for legends: ``256x128 · 64x4 · 1x2 · coopA``."""
        parts = []
        if self.tile_m is not None and self.tile_n is not None:
            parts.append(f"{self.tile_m}x{self.tile_n}")
        if self.tile_k is not None and self.stages is not None:
            parts.append(f"{self.tile_k}x{self.stages}")
        elif self.tile_k is not None:
            parts.append(f"k{self.tile_k}")
        elif self.stages is not None:
            parts.append(f"s{self.stages}")
        if self.cluster_m is not None and self.cluster_n is not None:
            parts.append(f"{self.cluster_m}x{self.cluster_n}")
        if not parts:   # no tile written (helpers, unknown): the function name, shortened
            base = (self.base or self.name).rsplit("::", 1)[-1]
            if not base:
                return self.family
            return base if len(base) <= 48 else base[:45] + "..."
        if self.flags:
            parts.append(" ".join(self.flags))
        return " · ".join(parts)

    def label(self, width: int = LABEL_WIDTH) -> str:
        """The name as people read it, in at most `width` characters: the raw name when it fits, else (a
        mangled or templated name thousands of characters long) its bare function, family and decoded
        fields, ``cutlass::device_kernel<…> (cutlass_template 128x256 · 64x4 · 2x1, grouped)``, cut with
        ``…`` if even that is longer."""
        if len(self.name) <= width:
            return self.name
        base = self.base or ""
        head = (base + "<…>") if base and base != self.name else self.name[:max(width // 2, 1)] + "…"
        what = " ".join(x for x in (self.family if self.family != "unknown" else "",
                                    self.short if self.short != self.family else "") if x)
        if self.problem_shape and self.problem_shape != "single":
            what += f", {self.problem_shape}"
        text = f"{head} ({what})" if what else head
        return text if len(text) <= width else text[:width - 1] + "…"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict: the `JSONL_KEYS` first, then every other field; tuples become lists."""
        out: dict[str, Any] = {}
        for key in JSONL_KEYS:
            out[key] = _jsonable(getattr(self, key))
        for f in _FIELD_NAMES:
            if f not in out:
                out[f] = _jsonable(getattr(self, f))
        out["short"] = self.short
        return out


_FIELD_NAMES = tuple(f.name for f in dataclasses.fields(KernelName))
FIELD_NAMES = _FIELD_NAMES
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(KernelName) if f.name != "name"}


def make(name: str, **fields) -> KernelName:
    """Build a KernelName without the frozen dataclass's per-field __init__ (the decoder's hot path).

    Same object as ``KernelName(name=..., **fields)``; unknown field names raise TypeError.
    """
    bad = fields.keys() - _DEFAULTS.keys()
    if bad:
        raise TypeError(f"KernelName has no field(s) {sorted(bad)}")
    kn = object.__new__(KernelName)
    d = kn.__dict__
    d.update(_DEFAULTS)
    d["name"] = name
    d.update(fields)
    return kn


def _jsonable(v):
    if isinstance(v, tuple):
        return list(v)
    return v
