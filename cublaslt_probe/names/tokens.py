"""Token tables: what each piece of a cuBLAS kernel name means, and how we know.

These tables drive decoding, encoding, `cublaslt-probe grammars` and docs/decoder.md. Every meaning
carries an ``evidence`` mark:

* ``measured``: backed by the project's own captures (tests/fixtures/names/, PROVENANCE there): a
  kernel name paired with the cuBLASLt algo config that launched it, or the GEMM that ran;
* ``inferred``: read from the name's shape, public traces or NVIDIA's CUTLASS naming code, not yet
  backed by such a pair.

Only tokens seen in real names are listed. A token no table knows stays in ``KernelName.unparsed``.
"""
from __future__ import annotations

from dataclasses import dataclass

MEASURED = "measured"
INFERRED = "inferred"

# What backs a `measured` mark.
CAPTURE = ("tests/fixtures/names/nvjet_configs.jsonl (H200, cuBLAS 13.1): cuBLASLt algo config <-> the "
           "kernel it launched")
CAPTURE_RUN = ("tests/fixtures/names/names.jsonl + probe/probe_raw.jsonl (H200, cuBLAS 13.1): kernels of the "
               "GEMMs that ran, with their cuBLASLt log lines")
REFERENCE = "REFERENCE.md §5 (H200, cuBLAS 13.1)"


@dataclass(frozen=True)
class Meaning:
    """One row of a grammar's token table."""

    token: str            # the token as written, or its shape (``<M>x<N>``)
    field: str            # the KernelName field(s) it sets
    meaning: str
    evidence: str = INFERRED
    source: str = ""      # what backs it (for measured) or where the reading comes from

    def to_dict(self) -> dict:
        return {"token": self.token, "field": self.field, "meaning": self.meaning,
                "evidence": self.evidence, "source": self.source}


@dataclass(frozen=True)
class Tok:
    """A literal token: the value it stands for, what it means, the evidence."""

    value: object
    meaning: str
    evidence: str = INFERRED
    source: str = ""


# ---------------------------------------------------------------------------------------------- nvjet
# Type-code letters. A 3-letter code is <A=B><compute><C=D>; a 5-letter code is <A><B><C><compute><D>,
# A and B being the cuBLAS (column-major) operands. Measured: every captured nvjet name's letters match
# the dtypes of the GEMM that launched it (bf16 -> tst, fp16 -> hsh, fp8 e4m3 x e4m3 -> qqtst; torch
# _scaled_mm(e5m2, e4m3) -> qrtst: torch's second operand is cuBLAS's A; the lt backend's A = e5m2 -> rqtst).
NVJET_TYPE_LETTERS: dict[str, Tok] = {
    "t": Tok("bf16", "bfloat16", MEASURED, CAPTURE_RUN + ": bf16 GEMMs -> tst, C/D bf16 in fp8 GEMMs"),
    "h": Tok("fp16", "float16", MEASURED, CAPTURE_RUN + ": fp16 GEMMs -> hsh"),
    "s": Tok("fp32", "float32 (the compute letter of every captured name; COMPUTE_32F in their logs)",
             MEASURED, CAPTURE_RUN),
    "q": Tok("fp8_e4m3", "float8 e4m3", MEASURED, CAPTURE_RUN + ": fp8 e4m3 x e4m3 -> qqtst"),
    "r": Tok("fp8_e5m2", "float8 e5m2", MEASURED,
             CAPTURE_RUN + ": cuBLAS A e4m3, B e5m2 -> qrtst; A e5m2, B e4m3 -> rqtst"),
}

NVJET_RASTER: dict[str, Tok] = {
    "h": Tok("h", "customOption bit 1 (value 2) is set; read as a horizontal CTA raster order (inferred)",
             MEASURED, CAPTURE + " (502/502)"),
    "v": Tok("v", "customOption bit 1 (value 2) is clear; read as a vertical CTA raster order (inferred)",
             MEASURED, CAPTURE + " (502/502)"),
}

NVJET_BETA: dict[str, Tok] = {
    "bz": Tok("bz", "beta is zero: C is not read", MEASURED, CAPTURE_RUN + ": beta=0 in the log of all 540 "
              "nvjet GEMMs"),
    "badd": Tok("badd", "beta is not zero: C is read and added (never captured)", INFERRED),
}

# Flags written between the cluster and the raster letter.
NVJET_PRE_FLAGS: dict[str, Tok] = {
    "2cta": Tok("2cta", "a pair of CTAs shares one MMA (Blackwell 2-SM UMMA)", INFERRED,
                "seen only on sm100/sm103 and arch-less Blackwell names in public traces"),
}

# Flags written after the beta token, in this order when several appear.
NVJET_FLAGS: dict[str, Tok] = {
    "coopA": Tok("coopA", "cooperative schedule, variant A (customOption bit 2 is set: see coopA|coopB)",
                 INFERRED),
    "coopB": Tok("coopB", "cooperative schedule, variant B (customOption bit 2 is set: see coopA|coopB)",
                 INFERRED),
    "splitK": Tok("splitK", "K is split over CTAs: written exactly when SPLITK_NUM > 1 (a splitKreduce kernel "
                  "follows when the reduction scheme is not NONE)", MEASURED, CAPTURE + " (502/502)"),
    "ovscale": Tok("ovscale", "fp8 scaling mode seen on torch._scaled_mm kernels in public traces (meaning "
                   "not documented; not produced by unit scales)", INFERRED),
    "bias": Tok("bias", "bias epilogue fused: written exactly when the GEMM's epilogue is EPILOGUE_BIAS "
                "(torch addmm with a 1-D bias, F.linear)", MEASURED, CAPTURE_RUN + " (92 with, 444 without)"),
    "algo2": Tok("algo2", "second algorithm variant (meaning not documented; every captured fp8 kernel "
                 "carries it, no other does)", INFERRED),
}
NVJET_COOP = Tok("coopA|coopB", "one of them is written exactly when customOption bit 2 (value 4) is set; "
                 "which one is not tied to any config field", MEASURED, CAPTURE + " (502/502)")
# Block-scaling flags: <A|B>vec<N><scale type>: one scale of that type per N elements of A or B.
NVJET_VEC_SCALE_TYPES: dict[str, Tok] = {
    "UE8M0": Tok("ue8m0", "unsigned 8-bit exponent scale (MX formats)", INFERRED),
    "UE4M3": Tok("ue4m3", "unsigned e4m3 scale (NVFP4)", INFERRED),
}

NVJET_LAYOUT = {
    "L1": Tok("trans_a", "T/N: transa of the cuBLAS (column-major) problem", MEASURED, CAPTURE + " (502/502)"),
    "L2": Tok("trans_b", "T/N: transb of the cuBLAS problem; N whenever the cuBLAS n is 1 (cuBLAS then "
              "ignores op(B))", MEASURED, CAPTURE + " (470 follow transb; the 32 others all have n = 1)"),
    "L3": Tok("swap_ab", "T: customOption bit 0 (value 1) is set; the kernel exchanges A and B internally "
              "(inferred)", MEASURED, CAPTURE + " (502/502)"),
}

NVJET_NUMBERS = {
    "tile": Tok(("tile_m", "tile_n"), "CTA tile M x N: the algo's TILE_ID (MATMUL_TILE_<M>x<N>), in the "
                "cuBLAS problem's m, n", MEASURED, CAPTURE + " (502/502)"),
    "ktile": Tok(("tile_k",), "K tile: the K of the algo's STAGES_ID (MATMUL_STAGES_64xAUTO -> 64)", MEASURED,
                 CAPTURE + " (502/502)"),
    "stages": Tok(("stages",), "pipeline stages the library resolved for STAGES_ID ..xAUTO (the config "
                  "only says AUTO)", INFERRED),
    "cluster": Tok(("cluster_m", "cluster_n"), "thread-block cluster M x N: CLUSTER_SHAPE_ID "
                   "(CLUSTER_SHAPE_<M>x<N>x1)", MEASURED, CAPTURE + " (502/502)"),
}

NVJET_ARCH = Tok("arch", "SM architecture the kernel was generated for (sm90 on the H200); absent in names "
                 "from older libraries (cuBLAS 12.x)", MEASURED, CAPTURE_RUN)

# Consumer Blackwell (sm120) grammar.
NVJET_SM120_FLAGS: dict[str, Tok] = {
    "tmaAB": Tok("tmaAB", "A and B are loaded with TMA", INFERRED),
    "splitK": Tok("splitK", "K is split over CTAs", INFERRED),
}

# ----------------------------------------------------------------------------------------------- xmma
XMMA_DTYPES: dict[str, Tok] = {
    "f16": Tok("fp16", "float16"),
    "bf16": Tok("bf16", "bfloat16"),
    "tf32": Tok("tf32", "tensor-float32 (fp32 data, tf32 multiply)", MEASURED,
                CAPTURE_RUN + ": tf32 GEMMs -> f32f32_tf32f32_f32, fp32 GEMMs -> f32f32_f32f32_f32"),
    "f32": Tok("fp32", "float32", MEASURED, CAPTURE_RUN + ": fp32 and tf32 GEMMs"),
    "f64": Tok("fp64", "float64"),
    "i8": Tok("int8", "int8"),
    "i32": Tok("int32", "int32"),
}

XMMA_OPS: dict[str, Tok] = {
    "gemm": Tok("gemm", "dense GEMM"),
    "sparse_gemm": Tok("sparse_gemm", "2:4 structured-sparse GEMM"),
}

XMMA_INSTRUCTIONS: dict[str, Tok] = {
    "tensor": Tok("tensor", "warp-level mma.sync tensor-core instruction MxNxK (HMMA/IMMA/DMMA)"),
    "sptensor": Tok("sptensor", "sparse mma.sp tensor-core instruction MxNxK"),
    "hgmma": Tok("hgmma", "Hopper warpgroup MMA (wgmma) on fp16/bf16/tf32, MxNxK"),
    "igmma": Tok("igmma", "Hopper warpgroup MMA on int8, MxNxK"),
    "qgmma": Tok("qgmma", "Hopper warpgroup MMA on fp8, MxNxK"),
    "ffma": Tok("ffma", "no tensor cores: fp32 FFMA (SIMT)"),
    "dfma": Tok("dfma", "no tensor cores: fp64 DFMA (SIMT)"),
}

XMMA_SUFFIXES: dict[str, Tok] = {
    "_5x_cublas": Tok("_5x_cublas", "build tag of kernels shipped in cuBLAS (written as `kernel__5x_cublas`)"),
    "trt": Tok("trt", "build tag of kernels shipped in TensorRT"),
}

# -------------------------------------------------------------------------- cutlass 2.x / cutlass3x
# Element short names, as CUTLASS's generator writes them (cutlass_library DataTypeNames).
CUTLASS_DTYPES: dict[str, Tok] = {
    "f16": Tok("fp16", "float16"),
    "bf16": Tok("bf16", "bfloat16"),
    "tf32": Tok("tf32", "tensor-float32"),
    "f32": Tok("fp32", "float32"),
    "f64": Tok("fp64", "float64"),
    "s8": Tok("int8", "int8"),
    "u8": Tok("uint8", "uint8"),
    "s4": Tok("int4", "int4"),
    "s32": Tok("int32", "int32"),
    "e4m3": Tok("fp8_e4m3", "float8 e4m3"),
    "e5m2": Tok("fp8_e5m2", "float8 e5m2"),
    "cf32": Tok("complex64", "complex float32"),
    "cf64": Tok("complex128", "complex float64"),
    "void": Tok(None, "no C operand (cutlass3x: the C slot is `void`)"),
}

# First letter of the core name: the accumulator type (cutlass_library ShortDataTypeNames).
CUTLASS_ACC_LETTERS: dict[str, Tok] = {
    "s": Tok("fp32", "fp32 accumulation"),
    "h": Tok("fp16", "fp16 accumulation"),
    "d": Tok("fp64", "fp64 accumulation"),
    "i": Tok("int32", "int32 accumulation"),
    "c": Tok("complex64", "complex fp32 accumulation"),
    "z": Tok("complex128", "complex fp64 accumulation"),
}

CUTLASS_OPCLASSES: dict[str, Tok] = {
    "tensorop": Tok("tensorop", "tensor-core MMA (mma.sync)"),
    "wmma_tensorop": Tok("wmma_tensorop", "tensor cores through the WMMA API"),
    "simt": Tok("simt", "no tensor cores: FFMA/DFMA on CUDA cores"),
    "sptensorop": Tok("sptensorop", "sparse tensor-core MMA"),
}

# Instruction shapes as written inside the core name (digits concatenated).
CUTLASS_INSTRUCTION_SHAPES: dict[str, tuple[int, int, int]] = {
    "1688": (16, 8, 8), "16816": (16, 8, 16), "16832": (16, 8, 32), "16864": (16, 8, 64),
    "884": (8, 8, 4), "8816": (8, 8, 16), "8832": (8, 8, 32), "1684": (16, 8, 4),
    "161616": (16, 16, 16), "168256": (16, 8, 256),
}

CUTLASS_CORE_OPS: dict[str, Tok] = {
    "gemm": Tok("gemm", "GEMM"),
    "andgemm": Tok("andgemm", "binary GEMM with AND-popc"),
    "xorgemm": Tok("xorgemm", "binary GEMM with XOR-popc"),
}

CUTLASS_EPILOGUES: dict[str, Tok] = {
    "relu": Tok("relu", "ReLU fused in the epilogue (cuBLASLt CUBLASLT_EPILOGUE_RELU*)"),
}

CUTLASS3X_SCHEDULES: dict[str, Tok] = {
    "warpspecialized": Tok("warpspecialized", "warp-specialised kernel schedule"),
    "warpspecialized_cooperative": Tok("warpspecialized_cooperative",
                                       "warp-specialised cooperative schedule (consumers share a tile)"),
    "warpspecialized_pingpong": Tok("warpspecialized_pingpong",
                                    "warp-specialised ping-pong schedule (consumers alternate tiles)"),
    "stream_k": Tok("stream_k", "stream-K tile scheduler"),
    "epi_tma": Tok("epi_tma", "TMA epilogue"),
    "epi_nosmem": Tok("epi_nosmem", "epilogue without shared memory"),
    "1sm": Tok("1sm", "one-SM UMMA (Blackwell)"),
    "2sm": Tok("2sm", "two-SM UMMA (Blackwell)"),
}

CUTLASS3X_EPILOGUES: dict[str, Tok] = {
    "bias_f32": Tok("bias_f32", "bias epilogue, fp32 bias"),
    "bias_bf16": Tok("bias_bf16", "bias epilogue, bf16 bias"),
    "bias_f16": Tok("bias_f16", "bias epilogue, fp16 bias"),
    "relu": Tok("relu", "ReLU epilogue"),
}

# ----------------------------------------------------------------------------- legacy (ampere_, ...)
LEGACY_ARCHS: dict[str, Tok] = {
    "kepler": Tok("sm30", "Kepler-generation kernel"),
    "maxwell": Tok("sm50", "Maxwell-generation kernel"),
    "pascal": Tok("sm60", "Pascal-generation kernel"),
    "volta": Tok("sm70", "Volta-generation kernel"),
    "turing": Tok("sm75", "Turing-generation kernel"),
    "ampere": Tok("sm80", "Ampere-generation kernel"),
    "hopper": Tok("sm90", "Hopper-generation kernel"),
}

LEGACY_DTYPES: dict[str, Tok] = {
    "fp16": Tok("fp16", "float16"),
    "bf16": Tok("bf16", "bfloat16"),
    "tf32": Tok("tf32", "tensor-float32"),
    "fp32": Tok("fp32", "float32"),
    "int8": Tok("int8", "int8"),
}

LEGACY_FLAGS: dict[str, Tok] = {
    "ldg8": Tok("ldg8", "128-bit (8-element) global loads"),
    "ldg4": Tok("ldg4", "64-bit (4-element) global loads"),
    "relu": Tok("relu", "ReLU fused in the epilogue"),
    "f2f": Tok("f2f", "float-to-float conversion epilogue (output converted from the accumulator)"),
}

LEGACY_TAIL: dict[str, Tok] = {
    "v1": Tok("v1", "kernel variant 1"),
}

# ------------------------------------------------------------------------------------------ helpers
# Function names (namespace-qualified as they appear demangled; the bare last part works too).
# value = (family, op). `measured`: captured from the GEMMs named in the meaning (torch view m x n x k).
_RUN = CAPTURE_RUN
HELPERS: dict[str, Tok] = {
    "cublasLt::splitKreduce_kernel": Tok(("splitk_reduce", "reduce"),
                                         "sums split-K partial results into D (converting fp32 partials "
                                         "to fp16/bf16): runs after nvjet, cutlass and gemv kernels with "
                                         "SPLITK_NUM > 1 and reduction scheme COMPUTE_TYPE or OUTPUT_TYPE; "
                                         "INPLACE and xmma split-K candidates ran without it", MEASURED,
                                         CAPTURE + " (294 of 294 such candidates)"),
    "splitKreduce_kernel": Tok(("splitk_reduce", "reduce"), "as cublasLt::splitKreduce_kernel (older "
                               "libraries, no namespace)", INFERRED),
    "gemv2T_kernel_val": Tok(("gemv", "gemv"), "GEMV with op(A) = A^T: GEMMs with m = 1 or n = 1 (captured "
                             "for 1 x 4096 x 4096)", MEASURED, _RUN),
    "gemv2N_kernel": Tok(("gemv", "gemv"), "GEMV with op(A) = A", INFERRED),
    "internal::gemvx::kernel": Tok(("gemv", "gemv"), "generic GEMV: GEMMs with m = 1 or n = 1 (captured for "
                                   "1 x 4096 x 4096)", MEASURED, _RUN),
    "gemvx::kernel": Tok(("gemv", "gemv"), "generic GEMV (gemvx)", INFERRED),
    "gemvx": Tok(("gemv", "gemv"), "generic GEMV (gemvx), short form", INFERRED),
    "gemmSN_TN_kernel": Tok(("gemmSN", "gemm"), "small-N GEMM, A transposed (captured for 3 x 5 x 7 fp32)",
                            MEASURED, _RUN),
    "gemmSN_NN_kernel": Tok(("gemmSN", "gemm"), "small-N GEMM, neither transposed (captured for 3 x 5 x 7 "
                            "and 16 x 4096 x 4096)", MEASURED, _RUN),
    "gemmSN_NT_kernel": Tok(("gemmSN", "gemm"), "small-N GEMM, B transposed", INFERRED),
    "gemmSN_TT_kernel": Tok(("gemmSN", "gemm"), "small-N GEMM, both transposed", INFERRED),
    "gemmk1_kernel": Tok(("legacy", "gemm"), "GEMM with K = 1 (outer product)", INFERRED),
    "sgemm_largek_lds64": Tok(("legacy", "gemm"), "fp32 GEMM for small M, N and large K (captured for "
                              "16 x 4096 x 4096 and 64 x 64 x 64 fp32, NT)", MEASURED, _RUN),
    "magma_sgemmEx_kernel": Tok(("legacy", "gemm"), "MAGMA-derived GEMM inside cuBLAS (captured for "
                                "3 x 5 x 7 bf16, TN and TT)", MEASURED, _RUN),
    "scal_kernel": Tok(("helper", "scal"), "x = alpha * x (captured next to sgemm_largek_lds64)", MEASURED,
                       _RUN),
    "scal_kernel_val": Tok(("helper", "scal"), "x = alpha * x", INFERRED),
    "dot_kernel": Tok(("helper", "dot"), "dot product, first pass: GEMMs with m = n = 1 (captured for "
                      "1 x 1 x 1024 fp16/bf16)", MEASURED, _RUN),
    "reduce_1Block_kernel": Tok(("helper", "reduce"), "one-block reduction finishing a dot_kernel",
                                MEASURED, _RUN),
    "axpy_kernel_val": Tok(("helper", "axpy"), "y = alpha * x + y", INFERRED),
    "cublasLt::epilogue::impl::globalKernel": Tok(("helper", "epilogue"),
                                                  "cuBLASLt's stand-alone epilogue (bias) after a kernel "
                                                  "without a fused one (captured for fp32 addmm)", MEASURED,
                                                  _RUN),
    "Memset": Tok(("helper", "memset"), "`Memset (Device)` activity row, not a kernel: clears the workspace "
                  "(split-K counters) or the output", MEASURED, _RUN),
    "Memcpy": Tok(("helper", "memcpy"), "`Memcpy DtoD ...` activity row, not a kernel (torch addmm copies "
                  "the bias into the output before a 1 x 1 GEMM)", MEASURED, _RUN),
}

# Kernels the framework launches around or instead of cuBLAS (copies, casts, reductions). Family
# `framework`; value = the framework.
FRAMEWORK_PREFIXES: dict[str, Tok] = {
    "at::": Tok("torch", "PyTorch ATen kernel (captured: the copy torch runs for addmm with K = 1)",
                MEASURED, _RUN),
    "cupy_": Tok("cupy", "CuPy elementwise kernel (captured: casts around fp16 bmm, 1 x 1 results)",
                 MEASURED, _RUN),
    "cub::": Tok("cub", "CUB device-wide primitive (captured: cupy's reduction for a 1 x 1 x 1024 matmul)",
                 MEASURED, _RUN),
}

# C++ type names in template arguments -> canonical dtype.
CXX_DTYPES: dict[str, str] = {
    "float": "fp32", "double": "fp64", "__half": "fp16", "half": "fp16", "c10::Half": "fp16",
    "__nv_bfloat16": "bf16", "c10::BFloat16": "bf16", "cutlass::bfloat16_t": "bf16",
    "cutlass::half_t": "fp16", "float2": "complex64", "double2": "complex128", "cuComplex": "complex64",
    "cuDoubleComplex": "complex128", "__nv_fp8_e4m3": "fp8_e4m3", "__nv_fp8_e5m2": "fp8_e5m2",
    "signed char": "int8", "char": "int8", "int8_t": "int8",
}
