"""The dtype vocabulary: every spelling of an element or GEMM type the package reads or writes, and its size.

Three spellings meet here, each mapped to the project's short names (``bf16``, ``fp8_e4m3``, ...):
the type strings torch's profiler records (``c10::BFloat16``), the torch attribute that builds a tensor of
a sweep dtype (``bfloat16``, kept as a string so that this module needs no torch), and the cuBLAS log's
``cudaDataType`` / ``cublasComputeType_t`` spellings (``R_16BF``, ``COMPUTE_32F_FAST_TF32``).

A GEMM's dtype names its inputs: ``fp8`` is A e4m3 x B e4m3 and ``fp8_e5m2`` is A e5m2 x B e4m3 (the two
pairs torch's ``_scaled_mm`` and the sweep build); any other pair of fp8 inputs is written
``<A>x<B>`` (``fp8_e4m3xfp8_e5m2``), so that a name never hides one operand's type. fp8 GEMMs write bf16.
CPU only, no imports of the package.
"""
from __future__ import annotations

from types import MappingProxyType

# The type strings torch's profiler writes in an op's `Input type` -> short name.
TORCH_TYPES = MappingProxyType({
    "c10::BFloat16": "bf16", "BFloat16": "bf16", "c10::Half": "fp16", "Half": "fp16", "float": "fp32",
    "Float": "fp32", "double": "fp64", "Double": "fp64", "c10::Float8_e4m3fn": "fp8_e4m3",
    "c10::Float8_e5m2": "fp8_e5m2", "c10::Float8_e4m3fnuz": "fp8_e4m3fnuz", "c10::Float8_e5m2fnuz":
    "fp8_e5m2fnuz", "c10::complex<float>": "complex64", "c10::complex<double>": "complex128",
    "signed char": "int8", "int": "int32",
})

# A sweep dtype -> the `torch` attribute of its A operand's element type (a B of another type: `lt_types`).
TORCH_NAMES = MappingProxyType({"fp32": "float32", "tf32": "float32", "fp16": "float16", "bf16": "bfloat16",
                                "fp8": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2"})

# cuBLAS spells types `R_16BF` (cudaDataType without its `CUDA_` prefix) and compute types `COMPUTE_32F`
# (cublasComputeType_t without `CUBLAS_`) -> short name.
LOG_TYPES = MappingProxyType({
    "R_16BF": "bf16", "R_16F": "fp16", "R_32F": "fp32", "R_64F": "fp64",
    "R_8F_E4M3": "fp8_e4m3", "R_8F_E5M2": "fp8_e5m2", "R_8F_UE8M0": "fp8_ue8m0",
    "R_8F_UE4M3": "fp8_ue4m3", "R_4F_E2M1": "fp4_e2m1", "R_6F_E2M3": "fp6_e2m3", "R_6F_E3M2": "fp6_e3m2",
    "R_8I": "int8", "R_8U": "uint8", "R_16I": "int16", "R_16U": "uint16", "R_32I": "int32",
    "R_32U": "uint32", "R_64I": "int64", "R_64U": "uint64", "R_4I": "int4", "R_4U": "uint4",
    "C_16BF": "cbf16", "C_16F": "cfp16", "C_32F": "cfp32", "C_64F": "cfp64", "C_8I": "cint8",
    "C_32I": "cint32",
    "COMPUTE_16F": "fp16", "COMPUTE_16F_PEDANTIC": "fp16", "COMPUTE_32F": "fp32",
    "COMPUTE_32F_PEDANTIC": "fp32", "COMPUTE_32F_FAST_TF32": "tf32", "COMPUTE_32F_FAST_16BF": "fp32_fast_bf16",
    "COMPUTE_32F_FAST_16F": "fp32_fast_fp16", "COMPUTE_32F_EMULATED_16BFX9": "fp32_emulated_bf16x9",
    "COMPUTE_64F": "fp64", "COMPUTE_64F_PEDANTIC": "fp64", "COMPUTE_32I": "int32",
    "COMPUTE_32I_PEDANTIC": "int32",
})

# The fp8 input pairs (A, B) with a name of their own; any other fp8 pair is "<A>x<B>".
FP8_PAIRS = MappingProxyType({("fp8_e4m3", "fp8_e4m3"): "fp8", ("fp8_e5m2", "fp8_e4m3"): "fp8_e5m2"})

# Bytes per element of a GEMM's inputs A, B and of its output C, by GEMM dtype (fp8 GEMMs write bf16).
INPUT_BYTES = MappingProxyType({"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "fp8_e5m2": 1,
                                "fp8_e4m3xfp8_e5m2": 1, "fp8_e5m2xfp8_e5m2": 1, "fp64": 8})
OUTPUT_BYTES = MappingProxyType({**INPUT_BYTES, **{d: 2 for d, b in INPUT_BYTES.items() if b == 1}})


def short_dtype(name: str | None) -> str | None:
    """``R_16BF`` → ``bf16``, ``COMPUTE_32F_FAST_TF32`` → ``tf32``, ``CUDA_R_8F_E4M3`` → ``fp8_e4m3``.

    Unknown names come back unchanged (lower-cased is not attempted: an unknown name stays visible).
    """
    if name is None:
        return None
    key = name
    if key.startswith("CUDA_"):
        key = key[5:]
    elif key.startswith("CUBLAS_"):
        key = key[7:]
    return LOG_TYPES.get(key, name)


def gemm_dtype(a: str | None, b: str | None) -> str | None:
    """The GEMM dtype of inputs of short types `a`, `b`: fp8 pairs are named by `FP8_PAIRS`, else
    ``<A>x<B>``; any other GEMM is named by A's type."""
    if a and a.startswith("fp8"):
        return FP8_PAIRS.get((a, b)) or f"{a}x{b}"
    return a


def torch_dtype(type_a, type_b) -> str | None:
    """The GEMM dtype of operands whose profiler type strings are `type_a`, `type_b` (None when A's type
    is not a string or not known)."""
    ta = TORCH_TYPES.get(type_a) if type(type_a) is str else None
    tb = TORCH_TYPES.get(type_b) if type(type_b) is str else None
    return gemm_dtype(ta, tb)


def log_dtype(a_type: str | None, b_type: str | None, compute_type: str | None) -> str | None:
    """The GEMM dtype of a cuBLAS log line's A, B and compute types (``R_16BF``, ``COMPUTE_32F``, ...):
    fp32 inputs computed in a TF32 compute type are ``tf32``."""
    a = short_dtype(a_type)
    if a == "fp32":
        return "tf32" if compute_type and "TF32" in compute_type else "fp32"
    return gemm_dtype(a, short_dtype(b_type))


def element_bytes(dtype: str | None) -> tuple[int, int] | None:
    """(input, output) bytes per element of a GEMM of `dtype`; None when the dtype has no size here."""
    nb = INPUT_BYTES.get(dtype or "")
    return (nb, OUTPUT_BYTES[dtype]) if nb else None


def output_type(dtype: str) -> str:
    """The short element type a GEMM of `dtype` writes: bf16 for fp8 inputs, fp32 for tf32."""
    if dtype.startswith("fp8"):
        return "bf16"
    return "fp32" if dtype == "tf32" else dtype


def log_type(short: str) -> str | None:
    """The cuBLAS log spelling (``R_16BF``) of short element type `short`, None when it has none."""
    return _LOG_SPELLING.get(short)


_LOG_SPELLING = MappingProxyType({v: k for k, v in LOG_TYPES.items() if k.startswith("R_")})
# An fp8 element type -> the sweep dtype whose A operand has it (`TORCH_NAMES`, the lt backend's dtypes).
FP8_ELEMENTS = MappingProxyType({"fp8_e4m3": "fp8", "fp8_e5m2": "fp8_e5m2"})
# A GEMM dtype as the audit writes it -> the sweep dtype that rebuilds it (itself, or by its fp8 element type);
# a dtype the sweep does not build is absent.
SWEEP_DTYPES = MappingProxyType({**{d: d for d in TORCH_NAMES}, **FP8_ELEMENTS})


def lt_types(dtype: str) -> tuple[str, str | None]:
    """The cuBLASLt problem of GEMM `dtype`: (the sweep dtype that sets A's type, C's and the compute type;
    B's short element type where it differs from A's, else None). ``fp8_e5m2`` is A e5m2 x B e4m3;
    ``<A>x<B>`` names both."""
    if dtype == "fp8_e5m2":
        return "fp8_e5m2", "fp8_e4m3"
    if dtype.startswith("fp8") and "x" in dtype:
        a, b = dtype.split("x", 1)
        return FP8_ELEMENTS.get(a, a), b
    return dtype, None
