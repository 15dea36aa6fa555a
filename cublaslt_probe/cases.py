"""What one GEMM of a sweep is (`Case`), its two views, and which combinations are valid.

Pure data, no GPU. The torch (row-major) view and the cuBLAS (column-major) view:
torch computes C[M,N] = A[M,K] @ B[K,N] as Cᵀ = Bᵀ·Aᵀ, so cuBLAS receives m = N, n = M, k = K with its
"A" operand being torch's B. `layout` is the torch view: `NN` means A is M×K and B is K×N, both
contiguous; a `T` means that operand is stored transposed (`NT` = B given as an N×K contiguous tensor, as
`F.linear` does), which makes cuBLAS's matching transpose `T`: torch `NT` is cuBLAS `TN`.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

from cublaslt_probe.kinds import BACKENDS, DTYPES, LAYOUTS, OPS
from cublaslt_probe.kinds import FP8_DTYPES as FP8

__all__ = ["BACKENDS", "OPS", "DTYPES", "LAYOUTS", "FP8", "Case", "invalid_reason"]


@dataclass(frozen=True)
class Case:
    backend: str
    op: str
    dtype: str
    layout: str
    m: int
    n: int
    k: int
    batch: int = 1

    @property
    def key(self) -> str:
        """Stable identity of the case (used for resume, sharding and joins)."""
        return f"{self.backend}|{self.op}|{self.dtype}|{self.layout}|{self.m}|{self.n}|{self.k}|{self.batch}"

    @classmethod
    def from_key(cls, key: str) -> "Case":
        b, op, dt, lay, m, n, k, batch = key.split("|")
        return cls(b, op, dt, lay, int(m), int(n), int(k), int(batch))

    @property
    def blas(self) -> dict:
        """The column-major problem cuBLAS receives."""
        return {"blas_m": self.n, "blas_n": self.m, "blas_k": self.k,
                "blas_trans_a": self.layout[1], "blas_trans_b": self.layout[0]}

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k * self.batch

    def as_dict(self) -> dict:
        """The fields by name (flat, so without `dataclasses.asdict`'s recursive copy: 25 µs a Case in the
        probe's process, where every GEMM's record starts from it)."""
        return {f: getattr(self, f) for f in _FIELDS}


_FIELDS = tuple(f.name for f in fields(Case))


def invalid_reason(c: Case) -> str | None:
    """Why this combination cannot run (None when it can). Named so the user can fix the spec."""
    combo = f"{c.backend}/{c.op}/{c.dtype}/{c.layout}"
    if c.backend not in BACKENDS:
        return f"unknown backend {c.backend!r} in {combo}: choose from {', '.join(BACKENDS)}"
    if c.op not in OPS:
        return f"unknown op {c.op!r} in {combo}: choose from {', '.join(OPS)}"
    if c.dtype not in DTYPES:
        return f"unknown dtype {c.dtype!r} in {combo}: choose from {', '.join(DTYPES)}"
    if c.layout not in LAYOUTS:
        return f"unknown layout {c.layout!r} in {combo}: choose from {', '.join(LAYOUTS)}"
    if min(c.m, c.n, c.k, c.batch) < 1:
        return f"non-positive size in {combo} m={c.m} n={c.n} k={c.k} batch={c.batch}"
    if (c.dtype in FP8) != (c.op == "scaled_mm"):
        return (f"{combo}: fp8 runs only as op scaled_mm, and scaled_mm only in fp8 "
                "(cuBLASLt has no plain fp8 GEMM without scales in torch)")
    if c.op == "scaled_mm" and c.layout != "NT":
        return f"{combo}: fp8 scaled_mm needs layout NT (A row-major, B column-major: cuBLAS TN)"
    if c.op == "bmm" and c.batch < 2:
        return f"{combo}: bmm needs batch >= 2 (got {c.batch})"
    if c.op != "bmm" and c.batch != 1:
        return f"{combo}: batch={c.batch} is only meaningful for op bmm"
    if c.backend == "cupy":
        if c.dtype not in ("fp32", "fp16"):
            return (f"{combo}: the cupy backend runs fp32 and fp16 only (no bf16/fp8 dtype in cupy; "
                    "tf32 needs CUPY_TF32=1 set before cupy is imported, which would change fp32 too)")
        if c.op not in ("mm", "bmm"):
            return f"{combo}: cupy has no fused {c.op}; use op mm or bmm"
    return None
