"""The rules that join a log line, a kernel and a case: one home for each.

CPU only, no pandas. `dataset`, `trace`, `explain`, `replay`, `candidates` and `probe` read them here:

- which launched kernel is the GEMM (`MAIN_FAMILIES`, `main_kernel`);
- which log line is the matmul's (`trace_record`);
- how a decoded name writes the tile the log writes (`TILE_SWAPPED`, `logged_tile`) and whether the two
  agree (`consistency`);
- which library path a backend's GEMM takes (`library_path`), hence the function its log line names
  (`expects_lt_function`), the workspace limit its heuristic query uses (`heuristic_workspace`), and
  whether a logged call is the one a case asked for (`log_matches_case`).
"""
from __future__ import annotations

from cublaslt_probe.vocab import WORKSPACE_BYTES

# Families whose kernels do the GEMM itself (split-K reduce, memsets, casts and other helpers do not; neither does
# torch's prepare_grouped_gemm_data ahead of its CUTLASS template grouped GEMM).
MAIN_FAMILIES = ("nvjet", "xmma", "cutlass", "cutlass3x", "cutlass_template", "legacy", "gemv", "gemmSN")

# How each family's name relates to the logged algo (measured on the H200 fixtures, 1,166 GEMMs, see
# docs/dataset.md): nvjet and cutlass write the log's tile as MxN; xmma's `tilesize` writes it as NxM.
# Only nvjet names encode split-K (`splitK` <=> numSplitsK > 1); other families reduce in a separate kernel,
# in place after a memset, or inside the kernel, so their split-K is not compared.
TILE_SWAPPED = frozenset({"xmma"})
SPLIT_IN_NAME = frozenset({"nvjet"})

# The function cuBLASLt logs for a call of its own API; calls through the cuBLAS API log a typed wrapper
# (cublasLtSSSMatmul, cublasLtHSHMatmul, cublasLtTSTMatmul, ...).
LT_FUNCTION = "cublasLtMatmul"

# Library paths: "cublas" (the cuBLAS API, which calls a cublasLt*Matmul wrapper), "torch-lt" (torch calls
# cublasLtMatmul itself), "lt" (this tool calls cublasLtMatmul through lt.py).
PATHS = ("cublas", "torch-lt", "lt")
# (backend, op) pairs on the torch-lt path whose logged function was not measured (the log is not checked).
_FUNCTION_UNMEASURED = frozenset({("torch-lt", "bmm"), ("torch-lt", "scaled_mm")})


def library_path(backend: str, op: str, n: int | None = None, k: int | None = None) -> str | None:
    """The path a backend's GEMM takes into the library (`PATHS`), as measured on the H200: torch mm/bmm
    and cupy call the cuBLAS API; torch addmm/scaled_mm and every torch-lt op go through torch's cuBLASLt
    path, except a torch addmm whose B (K×N, torch view) has a single row or column, which torch sends to
    the cuBLAS API (K = 1 or N = 1: tests/fixtures/logs/level2_mixed.log, tests/fixtures/probe/probe_raw.jsonl);
    the lt backend calls cublasLtMatmul directly. None for a backend that does not use cuBLAS."""
    if backend == "lt":
        return "lt"
    if backend == "cupy" or (backend == "torch" and (op in ("mm", "bmm") or (op == "addmm" and 1 in (n, k)))):
        return "cublas"
    if backend in ("torch", "torch-lt"):
        return "torch-lt"
    return None


def expects_lt_function(backend: str, op: str, n: int | None = None, k: int | None = None) -> bool | None:
    """Should the logged function be `LT_FUNCTION` (True) or a cuBLAS wrapper (False)? None where the
    function a path logs was not measured."""
    path = library_path(backend, op, n, k)
    if path is None or (backend, op) in _FUNCTION_UNMEASURED:
        return None
    return path != "cublas"


def heuristic_workspace(backend: str, op: str, n: int | None = None, k: int | None = None) -> int:
    """The workspace limit the backend's own heuristic query uses for this GEMM (bytes)."""
    return WORKSPACE_BYTES[library_path(backend, op, n, k) or "cublas"]


def main_kernel(kernels) -> str | None:
    """The GEMM kernel among those a call launched: the first of a `MAIN_FAMILIES` family, else the first."""
    from cublaslt_probe.names import decode
    kernels = list(kernels or [])
    for k in kernels:
        if decode(k).family in MAIN_FAMILIES:
            return k
    return kernels[0] if kernels else None


def trace_record(lines):
    """The first matmul trace record among log lines (`logs.LogRecord`), or None."""
    from cublaslt_probe.logs import parse_line
    for i, line in enumerate(lines or [], 1):
        r = parse_line(line, i)
        if r is not None and r.kind == "trace":
            return r
    return None


def logged_tile(kn) -> tuple[int, int] | None:
    """The decoded tile in the log's (and cuBLAS's column-major) order, MxN; None when the name has none."""
    if kn is None or kn.tile_m is None or kn.tile_n is None:
        return None
    return (kn.tile_n, kn.tile_m) if kn.family in TILE_SWAPPED else (kn.tile_m, kn.tile_n)


def _cluster2(s: str | None) -> tuple[int, int] | None:
    if not s:
        return None
    parts = s.split("x")
    try:
        return int(parts[0]), int(parts[1])
    except (ValueError, IndexError):
        return None


def consistency(kn, rec) -> bool | None:
    """Does the decoded kernel agree with the logged algo on tile, cluster and split-K?

    Compared only where both sides carry the field (a gemv algo logs no tile, a pre-Hopper name no
    cluster, only nvjet names say split-K); None when there is no log line or nothing to compare.
    """
    if rec is None or kn is None:
        return None
    checks = []
    tile = logged_tile(kn)
    if tile is not None and rec.tile and rec.tile[:1].isdigit():
        checks.append(f"{tile[0]}x{tile[1]}" == rec.tile)
    c = _cluster2(rec.cluster)
    if kn.cluster_m is not None and c is not None:
        a, b = (kn.cluster_n, kn.cluster_m) if kn.family in TILE_SWAPPED else (kn.cluster_m, kn.cluster_n)
        checks.append((a, b) == c)
    if kn.family in SPLIT_IN_NAME and kn.split_k is not None and rec.num_splits_k is not None and rec.num_splits_k >= 1:
        checks.append(bool(kn.split_k) == (rec.num_splits_k > 1))
    return all(checks) if checks else None


def log_matches_case(case: dict, rec) -> bool | None:
    """Is the logged call the one the case asked for? Its compute type must match fp32 (COMPUTE_32F) or
    tf32 (COMPUTE_32F_FAST_TF32), and its function the backend's path (`expects_lt_function`). `case` is
    a dict with backend, op, dtype, n and k (a raw record or `Case.as_dict()`). None when there is no log line."""
    if rec is None:
        return None
    checks = []
    ct = rec.compute_type
    if case["dtype"] in ("fp32", "tf32") and ct:
        checks.append(ct.endswith("FAST_TF32") == (case["dtype"] == "tf32"))
    want_lt = expects_lt_function(case["backend"], case["op"], case.get("n"), case.get("k"))
    if rec.function and want_lt is not None:
        checks.append((rec.function == LT_FUNCTION) == want_lt)
    return all(checks) if checks else None

# --- a program's GEMM as audit --measure rebuilds it ----------------------------------------------------------
# The backends each audited GEMM is timed on: torch's cuBLAS path (32 MiB workspace), its cuBLASLt path
# (1 MiB), cuBLASLt called directly (32 MiB).
TIMED_BACKENDS = ("torch", "torch-lt", "lt")
# The torch ops whose GEMM the probe rebuilds, and its op for each.
TORCH_OPS = {"aten::mm": "mm", "aten::matmul": "mm", "aten::addmm": "addmm", "aten::_addmm_activation": "addmm",
             "aten::linear": "addmm", "aten::bmm": "bmm", "aten::baddbmm": "bmm", "aten::_scaled_mm": "scaled_mm"}
GROUPED_TORCH_OPS = {"aten::_grouped_mm": "grouped_mm", "aten::_scaled_grouped_mm": "scaled_grouped_mm"}


def path_of(log_function) -> str | None:
    """The torch path a logged GEMM took: ``torch-lt`` for cublasLtMatmul (torch's cuBLASLt path), ``torch``
    for a typed wrapper (cublasLtTSTMatmul, ...: its cuBLAS path); None without a logged function."""
    if not isinstance(log_function, str) or not log_function:
        return None
    return "torch-lt" if log_function == "cublasLtMatmul" else "torch"
