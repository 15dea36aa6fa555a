"""What one GEMM of a sweep is (`Case`), its two views, and which combinations are valid.

Pure data, no GPU. The torch (row-major) view and the cuBLAS (column-major) view:
torch computes C[M,N] = A[M,K] @ B[K,N] as Cᵀ = Bᵀ·Aᵀ, so cuBLAS receives m = N, n = M, k = K with its
"A" operand being torch's B. `layout` is the torch view: `NN` means A is M×K and B is K×N, both
contiguous; a `T` means that operand is stored transposed (`NT` = B given as an N×K contiguous tensor, as
`F.linear` does), which makes cuBLAS's matching transpose `T`: torch `NT` is cuBLAS `TN`.

A grouped GEMM (op `grouped_mm`: `torch._grouped_mm`; `scaled_grouped_mm`: `torch._scaled_grouped_mm`, fp8)
is `groups` GEMMs of one n and k in one launch, as a mixture-of-experts layer runs its experts. Its `sizes`
says how the rows split into groups (`group_sizes`): in the 2-D x 3-D form MoE layers use, A is [m, k] with m
the rows of all groups together, B is [groups, k, n], and the offsets split A's rows (batch 1); in the 3-D x 3-D
form (`sizes` = "batched") A is [groups, m, k], every group m rows, batch = groups (the trace's convention,
`trace.problem_of`). The weight gradient's form (a sizes code starting "k:", `SPLIT_K`) is 2-D x 2-D with the
offsets along k: A [m, k] column-major (layout TN, as autograd passes an activation's gradient transposed),
B [k, n], the output one [m, n] per group, each group summing over its own slice of k (the tokens its expert
got), as an MoE layer's backward computes its experts' weight gradients.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, fields

from cublaslt_probe.vocab import BACKENDS, DTYPES, GROUPED_OPS, LAYOUTS, OPS, SCALED_OPS
from cublaslt_probe.vocab import FP8_DTYPES as FP8

__all__ = ["BACKENDS", "OPS", "DTYPES", "LAYOUTS", "FP8", "GROUPED_OPS", "Case", "invalid_reason", "group_sizes",
           "sizes_summary", "sizes_code", "ALIGN_ROWS", "PAD_ROWS", "SPLIT_K", "grouped_alternatives"]

SPLIT_K = "k:"   # a sizes code with this prefix splits k, not m (the weight gradient's grouped GEMM)
ALIGN_ROWS = 8   # a group whose row count is not a multiple of this is counted as unaligned (`sizes_summary`)


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
    groups: int = 0      # grouped ops: the number of groups (experts); 0 for every other op
    sizes: str = ""      # grouped ops: how the rows split into groups, a `sizes_code` ("uniform", "zipf=1.2", ...)

    @property
    def key(self) -> str:
        """Stable identity of the case (used for resume, sharding and joins); a grouped GEMM's ends with its
        groups and sizes code."""
        k = f"{self.backend}|{self.op}|{self.dtype}|{self.layout}|{self.m}|{self.n}|{self.k}|{self.batch}"
        return f"{k}|{self.groups}|{self.sizes}" if self.groups else k

    @classmethod
    def from_key(cls, key: str) -> "Case":
        b, op, dt, lay, m, n, k, batch, *grouped = key.split("|")
        groups, sizes = (int(grouped[0]), grouped[1]) if len(grouped) == 2 else (0, "")
        return cls(b, op, dt, lay, int(m), int(n), int(k), int(batch), groups, sizes)

    @property
    def grouped(self) -> bool:
        return self.op in GROUPED_OPS

    @property
    def split_k(self) -> bool:
        """A grouped GEMM whose offsets split k (the weight gradient's form)."""
        return self.grouped and self.sizes.startswith(SPLIT_K)

    @property
    def group_dim(self) -> str | None:
        """The dimension the groups split: m (2-D x 3-D), k (`split_k`); None for the batched form or no groups."""
        if not self.grouped or self.sizes == "batched":
            return None
        return "k" if self.split_k else "m"

    def group_sizes(self) -> list[int]:
        """The rows (along `group_dim`: k for `split_k`) of each group (`group_sizes` of this Case's sizes
        code); [] for an op that is not grouped."""
        if not self.grouped:
            return []
        return group_sizes(self.sizes, self.k if self.split_k else self.m, self.groups, self.batch)

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
    if (c.dtype in FP8) != (c.op in SCALED_OPS):
        return (f"{combo}: fp8 runs only as op scaled_mm (or scaled_grouped_mm), and those only in fp8 "
                "(cuBLASLt has no plain fp8 GEMM without scales in torch)")
    if c.op in SCALED_OPS and c.layout != "NT":
        return f"{combo}: fp8 {c.op} needs layout NT (A row-major, B column-major: cuBLAS TN)"
    if c.grouped:
        return _grouped_invalid(c, combo)
    if c.groups or c.sizes:
        return f"{combo}: groups and group_sizes are only meaningful for ops {' and '.join(GROUPED_OPS)}"
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


def _grouped_invalid(c: Case, combo: str) -> str | None:
    if c.backend != "torch":
        return f"{combo}: grouped GEMMs run through torch only (torch._grouped_mm): use backend torch"
    if c.op == "grouped_mm" and c.dtype not in ("bf16", "fp16"):
        return f"{combo}: torch._grouped_mm runs bf16 and fp16 (fp8: op scaled_grouped_mm)"
    if c.layout not in ("NN", "NT", "TN"):
        return (f"{combo}: a grouped GEMM reads A row-major (layout NN or NT); torch's CUTLASS kernel stops on a "
                "device-side assertion for a column-major A whose groups are not 16-byte multiples")
    if c.groups < 1:
        return f"{combo}: a grouped GEMM needs groups >= 1 (got {c.groups})"
    if c.split_k:
        if c.op != "grouped_mm" or c.layout != "TN" or c.batch != 1 or c.sizes == SPLIT_K + "batched":
            return (f"{combo}: the weight gradient's grouped form (group_sizes {{k = ...}}) is op grouped_mm, "
                    "layout TN (A column-major [m, k], B [k, n], as autograd passes them), batch 1")
        try:
            group_sizes(c.sizes, c.k, c.groups)
        except ValueError as e:
            return f"{combo}: {e}"
        return None
    if c.layout == "TN":
        return (f"{combo}: a grouped GEMM reads A row-major (layout NN or NT); torch's CUTLASS kernel stops on a "
                "device-side assertion for a column-major A whose groups are not 16-byte multiples (layout TN "
                "is the weight gradient's form: group_sizes {k = ...})")
    if c.sizes == "batched":
        if c.op == "scaled_grouped_mm":
            return f"{combo}: scaled_grouped_mm is planned in the 2-D x 3-D form only (group_sizes other than batched)"
        if c.batch != c.groups:
            return f"{combo}: the batched (3-D x 3-D) form has batch = groups (got batch {c.batch}, groups {c.groups})"
    elif c.batch != 1:
        return f"{combo}: batch={c.batch}: the 2-D x 3-D grouped form has batch 1 (group_sizes batched for 3-D x 3-D)"
    try:
        group_sizes(c.sizes, c.m, c.groups, c.batch)
    except ValueError as e:
        return f"{combo}: {e}"
    return None


# --- group sizes ------------------------------------------------------------------------------------------
def sizes_code(spec, m: int | None = None) -> str:
    """The canonical code of a `group_sizes` spec value: "uniform", "batched", {zipf = S} -> "zipf=S",
    {seed = N, top_k = K} -> "seed=N,top_k=K" (top_k 1 when not given), a list of ints -> "sizes=a,b,...";
    {k = X} -> "k:" + the code of X (the weight gradient's form: X splits k, not m; X not "batched").
    Raises ValueError naming what is wrong (pure)."""
    if spec in ("uniform", "batched"):
        return spec
    if isinstance(spec, dict) and set(spec) == {"k"}:
        inner = spec["k"]
        if inner == "batched" or (isinstance(inner, dict) and "k" in inner):
            raise ValueError(f"group_sizes {spec!r}: {{k = X}} takes X as m's sizes do, not batched or another k")
        return SPLIT_K + sizes_code(inner)
    if isinstance(spec, dict):
        if set(spec) == {"zipf"}:
            s = spec["zipf"]
            if isinstance(s, bool) or not isinstance(s, (int, float)) or not 0 <= s <= 8:
                raise ValueError(f"group_sizes {{zipf = {s!r}}}: the skew is a number from 0 to 8")
            return f"zipf={float(s):g}"
        if "seed" in spec and set(spec) <= {"seed", "top_k"}:
            seed, top = spec["seed"], spec.get("top_k", 1)
            if any(isinstance(x, bool) or not isinstance(x, int) for x in (seed, top)) or seed < 0 or top < 1:
                raise ValueError(f"group_sizes {spec!r}: seed is an integer >= 0, top_k an integer >= 1")
            return f"seed={seed},top_k={top}"
    if isinstance(spec, list) and spec and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in spec):
        return "sizes=" + ",".join(str(x) for x in spec)
    raise ValueError(f"group_sizes {spec!r}: use \"uniform\", \"batched\", {{zipf = S}}, {{seed = N, top_k = K}} "
                     "or a list of non-negative row counts (any of them but batched inside {k = ...} to split k)")


def group_sizes(code: str, m: int, groups: int, batch: int = 1) -> list[int]:
    """The rows of each of `groups` groups for the sizes `code` (`sizes_code`) of a grouped GEMM of `m` rows
    (pure, deterministic; ValueError when they cannot be made):
    - "uniform": m split as evenly as it goes (the first m mod groups groups one row more);
    - "batched": the 3-D x 3-D form, every group m rows (`batch` = groups of them);
    - "zipf=S": group i in proportion to 1/(i+1)^S (largest remainders), the skew a router with favourite
      experts gives;
    - "seed=N,top_k=K": m/K tokens, each routed to K distinct groups drawn at random (numpy's PCG64 seeded N),
      the rows a uniform top-K router gives;
    - "sizes=a,b,...": these, which must add up to m, one per group;
    - "k:X": X's sizes of `m` (the caller passes the GEMM's k: the groups split k).
    Made once per (code, m, groups, batch) in a process (`_sizes`: the plan checks every Case, the record and
    the builder ask again)."""
    return list(_sizes(code, m, groups, batch))


ROUTE_TOKENS = 1 << 15   # tokens routed at a time for "seed=" sizes (a tokens x groups block of random numbers)


@functools.lru_cache(maxsize=1024)
def _sizes(code: str, m: int, groups: int, batch: int) -> tuple[int, ...]:
    return tuple(_make_sizes(code, m, groups, batch))


def _make_sizes(code: str, m: int, groups: int, batch: int) -> list[int]:
    if code.startswith(SPLIT_K):
        code = code[len(SPLIT_K):]
    if code == "batched":
        return [m] * groups
    if code.startswith("sizes="):
        sizes = [int(x) for x in code[len("sizes="):].split(",")]
        if len(sizes) != groups or sum(sizes) != m:
            raise ValueError(f"group sizes {code[:60]}: {len(sizes)} groups adding up to {sum(sizes)}, but the "
                             f"GEMM has {groups} groups and m = {m} rows")
        return sizes
    if code == "uniform":
        q, r = divmod(m, groups)
        return [q + (i < r) for i in range(groups)]
    if code.startswith("zipf="):
        s = float(code[len("zipf="):])
        w = [(i + 1) ** -s for i in range(groups)]
        exact = [m * x / sum(w) for x in w]
        sizes = [int(x) for x in exact]
        for i in sorted(range(groups), key=lambda i: sizes[i] - exact[i])[:m - sum(sizes)]:
            sizes[i] += 1
        return sizes
    if code.startswith("seed="):
        import numpy as np
        f = dict(x.split("=") for x in code.split(","))
        seed, top = int(f["seed"]), int(f.get("top_k", 1))
        if m % top or top > groups:
            raise ValueError(f"group sizes {code}: m = {m} rows are not tokens x top_k {top} over {groups} groups")
        rng = np.random.Generator(np.random.PCG64(seed))
        counts = np.zeros(groups, dtype=np.int64)
        left = m // top
        while left:   # in blocks: the generator's stream, hence the sizes, are those of one tokens x groups draw
            n = min(left, ROUTE_TOKENS)
            chosen = np.argsort(rng.random((n, groups)), axis=1)[:, :top]
            counts += np.bincount(chosen.ravel(), minlength=groups)
            left -= n
        return counts.tolist()
    raise ValueError(f"unknown group sizes code {code!r}")


def sizes_summary(sizes: list[int]) -> dict:
    """min, max, mean rows of the groups, how many are empty and how many are not a multiple of ALIGN_ROWS
    (empty groups are multiples), and max / mean (1 = balanced) (pure)."""
    if not sizes:
        return {}
    mean = sum(sizes) / len(sizes)
    return {"groups": len(sizes), "rows": sum(sizes), "min": min(sizes), "max": max(sizes), "mean": round(mean, 3),
            "empty": sum(1 for s in sizes if s == 0), "unaligned": sum(1 for s in sizes if s % ALIGN_ROWS),
            "imbalance": round(max(sizes) / mean, 3) if mean else None}


PAD_ROWS = (8, 16, 64, 128)   # the multiples `grouped_alternatives` pads every group's rows up to


def grouped_alternatives(c: Case) -> dict[str, Case]:
    """The same expert work as grouped GEMM `c` (2-D x 3-D, or the weight gradient's 2-D x 2-D split along k)
    done other ways, by name (pure):
    - "original": `c` with its sizes written out (`sizes=...`);
    - "pad8" ... "pad128": every group's rows (along k for `split_k`: the tokens) padded up to a multiple of
      `PAD_ROWS` (empty groups stay empty; the padding rows are zero rows computed and thrown away);
    - "balanced": the same rows split evenly ("uniform"): what a router that balances its experts gives;
    - "bmm_padded": every group padded to the largest one, as one batched GEMM (`torch.bmm`, groups x max rows;
      for `split_k` groups x m x n products of the largest group's k);
    - "fp8": the same sizes through `scaled_grouped_mm` (for bf16 and fp16 2-D x 3-D GEMMs of layout NT).
    One GEMM per group (a loop of `torch.mm`) is not a Case: `alternatives.time_grouped_alternatives` times it."""
    if not c.grouped or c.sizes == "batched":
        raise ValueError(f"{c.key}: alternatives are for a 2-D x 3-D or a split-k grouped GEMM")
    sizes = c.group_sizes()
    pre = SPLIT_K if c.split_k else ""

    def explicit(rows: list[int], op: str = c.op, dtype: str = c.dtype) -> Case:
        m, k = (c.m, sum(rows)) if c.split_k else (sum(rows), c.k)
        return Case(c.backend, op, dtype, c.layout, m, c.n, k, 1, c.groups, pre + sizes_code(rows))
    out = {"original": explicit(sizes)}
    for p in PAD_ROWS:
        out[f"pad{p}"] = explicit([-(-s // p) * p for s in sizes])
    out["balanced"] = Case(c.backend, c.op, c.dtype, c.layout, c.m, c.n, c.k, 1, c.groups, pre + "uniform")
    if c.groups > 1:
        big = max(max(sizes), 1)
        out["bmm_padded"] = (Case(c.backend, "bmm", c.dtype, c.layout, c.m, c.n, big, c.groups) if c.split_k
                             else Case(c.backend, "bmm", c.dtype, c.layout, big, c.n, c.k, c.groups))
    if c.op == "grouped_mm" and c.layout == "NT":
        out["fp8"] = explicit(sizes, "scaled_grouped_mm", "fp8")
    return out
