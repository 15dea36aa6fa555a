"""Numerics of one algo config: its output against a float64 reference on the same operands.

The reference is `op(A)·op(B)` computed by torch in float64 from the very operands the kernel read (no
input rounding separates them), with `|op(A)|·|op(B)|` beside it. An element is within tolerance when

    |y − ref| ≤ SAFETY · (u_out·|ref| + (K·u_acc + r)·(|A|·|B|))

u_out the output type's unit roundoff (its rounding of the result), u_acc the accumulation's (fp32: 2⁻²⁴; the
K·u term is the classical worst-case bound of a K-term dot product), r = split-K · u_out when the split-K partial
sums are reduced in the output type (each partial rounded once; absent when reduced in the compute type). The
bound is deterministic: a correct kernel never exceeds it, whatever its order of accumulation; a kernel that
drops or repeats a slice of K exceeds it on some element as soon as the slice's products outgrow the
accumulated-rounding term (tests/test_gpu_numerics.py shows eight dropped K elements are caught at K = 4096).

`bound_terms` is pure (no torch); `check` and `run_config` need torch and a GPU.
"""
from __future__ import annotations

# unit roundoff of the output type and of the accumulation, per problem dtype (`lt.DTYPE_SPEC` keys)
U_OUT = {"fp32": 2.0 ** -24, "tf32": 2.0 ** -24, "fp16": 2.0 ** -11, "bf16": 2.0 ** -8,
         "fp8": 2.0 ** -8, "fp8_e5m2": 2.0 ** -8}
# tf32 rounds the fp32 operands to 10-bit mantissas before the products: the reference does not, so each
# product carries that rounding (2⁻¹¹ relative), which the K·u_acc term covers with u_acc = 2⁻¹¹.
# fp8: Hopper's fp8 tensor-core accumulation is not taken to be fp32 (a wider, assumed 2⁻¹³ here): only bf16 and
# fp16 are measured (tests/test_gpu_numerics.py, scripts/hunt_splitk.py).
U_ACC = {"fp32": 2.0 ** -24, "tf32": 2.0 ** -11, "fp16": 2.0 ** -24, "bf16": 2.0 ** -24,
         "fp8": 2.0 ** -13, "fp8_e5m2": 2.0 ** -13}
SAFETY = 2.0


def bound_terms(dtype: str, k: int, split_k: int = 1, reduction_in_output_type: bool = False) -> tuple[float, float]:
    """(coefficient of |ref|, coefficient of |A|·|B|) of the per-element tolerance, SAFETY included."""
    if dtype not in U_OUT:
        raise ValueError(f"dtype {dtype!r}: the numerics check knows {sorted(U_OUT)}")
    r = max(1, split_k) * U_OUT[dtype] if reduction_in_output_type and split_k > 1 else 0.0
    return SAFETY * U_OUT[dtype], SAFETY * (k * U_ACC[dtype] + r)


def op_views(p, A, B):
    """op(A) (batch, m, k) and op(B) (batch, k, n) as views of the operands `probe.lt_operands` makes for
    Problem `p` (column-major storage held in row-major tensors of shape (batch, cols, ld))."""
    a = A[:, :p.m, :p.k] if p.trans_a == "T" else A[:, :p.k, :p.m].transpose(1, 2)
    b = B[:, :p.n, :p.k].transpose(1, 2) if p.trans_b == "N" else B[:, :p.k, :p.n]
    return a, b


def reference(torch, p, A, B) -> tuple:
    """(ref, absprod): op(A)·op(B) and |op(A)|·|op(B)| in float64, shaped as the stored D ((batch, n, m): D
    column-major). One float64 matmul each."""
    a, b = op_views(p, A, B)
    a64, b64 = a.double(), b.double()
    ref = torch.bmm(a64, b64).transpose(1, 2)
    absprod = torch.bmm(a64.abs(), b64.abs()).transpose(1, 2)
    return ref, absprod


def check(torch, p, y, ref, absprod, *, split_k: int = 1, reduction_in_output_type: bool = False) -> dict:
    """Compare output `y` (the stored D, any float dtype) with `reference`'s (ref, absprod): numerics_ok, the
    largest error against its bound (error_ratio, > 1 fails), max_abs_err, max_rel_err (`max_rel_diff`: max
    |y − ref| over max |ref|) and the number of elements out of tolerance. A NaN or inf in `y` fails."""
    from cublaslt_probe.analysis.candidates import max_rel_diff
    c_ref, c_abs = bound_terms(p.dtype, p.k, split_k, reduction_in_output_type)
    y = y[:, :p.n, :p.m].double()
    err = (y - ref).abs()
    bound = c_ref * ref.abs() + c_abs * absprod + 1e-300
    ratio = err / bound
    finite = bool(torch.isfinite(y).all().item())
    worst = float(ratio.max().item()) if finite else float("inf")
    return {"numerics_ok": finite and worst <= 1.0, "error_ratio": worst,
            "max_abs_err": float(err.max().item()) if finite else float("inf"),
            "max_rel_err": max_rel_diff(y, ref) if finite else float("inf"),
            "bad_elements": int((ratio > 1).sum().item()) if finite else int(y.numel()),
            "tol_ref_coef": c_ref, "tol_absprod_coef": c_abs}


def run_config(torch, g, algo, ref=None, absprod=None, *, split_k: int = 1,
               reduction_in_output_type: bool = False) -> dict:
    """Run `algo` once on `operands.LtGemm` g's operands (C filled with NaN first, so a kernel that skips an
    element shows) and `check` its output against the float64 reference of those operands (computed here
    when not given)."""
    if ref is None:
        ref, absprod = reference(torch, g.p, g.A, g.B)
    g.D.fill_(float("nan"))
    g.call(algo)()
    torch.cuda.synchronize()
    return check(torch, g.p, g.D, ref, absprod, split_k=split_k, reduction_in_output_type=reduction_in_output_type)
