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

NVJET_ARCH = Tok("arch", "SM architecture the kernel was compiled for (sm90 on the H200); absent in names "
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
    "scal_64addr_kernel": Tok(("helper", "scal"), "x = alpha * x, the variant with 64-bit addressing "
                              "(captured: before sgemm_largek_lds64 in CuPy's "
                              "fp32 4 x 128256 x 8192 GEMM)", MEASURED,
                              "tests/fixtures/probe/long_spin_raw.jsonl (H200, cuBLAS 13.1)"),
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
    "at_cuda_detail::cub::": Tok("cub", "torch's private copy of CUB (sorts, scans, unique for embedding "
                                 "backward and MoE routing)", MEASURED, "tests/fixtures/programs (H200 programs)"),
    "thrust::": Tok("thrust", "Thrust algorithm kernel"),
    "(anonymous namespace)::softmax_warp_": Tok("torch", "torch's persistent softmax (PersistentSoftmax.cuh), "
                                                 "outside namespace at", MEASURED,
                                                 "tests/fixtures/programs (H200 programs)"),
    "(anonymous namespace)::indexing_backward_kernel": Tok("torch", "torch's backward of advanced indexing "
                                                           "and index_put_(accumulate=True) (Indexing.cu): sums "
                                                           "gradient rows at repeated indices, outside namespace "
                                                           "at", MEASURED,
                                                           "tests/fixtures/moe (H200 MoE training step)"),
    "(anonymous namespace)::elementwise_kernel_with_index": Tok("torch", "torch's arange / linspace kernel, "
                                                                "outside namespace at", MEASURED,
                                                                "tests/fixtures/programs (H200 programs)"),
}

# C++ type names in template arguments -> canonical dtype.
CXX_DTYPES: dict[str, str] = {
    "float": "fp32", "double": "fp64", "__half": "fp16", "half": "fp16", "c10::Half": "fp16",
    "__nv_bfloat16": "bf16", "c10::BFloat16": "bf16", "cutlass::bfloat16_t": "bf16",
    "cutlass::half_t": "fp16", "float2": "complex64", "double2": "complex128", "cuComplex": "complex64",
    "cuDoubleComplex": "complex128", "__nv_fp8_e4m3": "fp8_e4m3", "__nv_fp8_e5m2": "fp8_e5m2",
    "signed char": "int8", "char": "int8", "int8_t": "int8",
    "cutlass::float_e4m3_t": "fp8_e4m3", "cutlass::float_e5m2_t": "fp8_e5m2", "cutlass::tfloat32_t": "tf32",
    "cutlass::float_e2m1_t": "fp4_e2m1", "cutlass::int4b_t": "int4", "cutlass::uint4b_t": "uint4",
    "cutlass::float_ue8m0_t": "ue8m0", "cutlass::float_ue4m3_t": "ue4m3", "c10::Float8_e4m3fn": "fp8_e4m3",
    "c10::Float8_e5m2": "fp8_e5m2", "__nv_fp8_e4m3fn": "fp8_e4m3", "cutlass::int8_t": "int8",
    "__nv_bfloat162": "bf16", "__half2": "fp16",
}

# ================================================================ families that share traces with cuBLAS
CAPTURE_TRACE = ("tests/fixtures/traces (H200, torch 2.11, cuDNN SDPA in nn.TransformerEncoderLayer): kernel "
                 "names of real torch.profiler traces")
CAPTURE_PROGRAMS = ("tests/fixtures/programs (H200, torch 2.11, cuDNN 9.19): kernel names of real programs "
                    "(Llama, Mixtral MoE, GPT-2 training, torch.compile, SDPA backends, fp8)")
PUBLIC = "tests/fixtures/names/public_names.jsonl: public traces and issue threads (where each was seen)"

# ------------------------------------------------------------------------------------------ cuDNN
CUDNN_GRAPHS: dict[str, Tok] = {
    "sdpa": Tok("sdpa", "scaled-dot-product attention graph", MEASURED, CAPTURE_TRACE),
    "matmul": Tok("matmul", "matmul graph (runtime-fused GEMM with its pointwise ops)"),
    "conv": Tok("conv", "convolution graph"),
}
CUDNN_ENGINES: dict[str, Tok] = {
    "flash": Tok("flash", "flash-attention-style fused kernel (one pass over K/V with online softmax)",
                 MEASURED, CAPTURE_TRACE),
}
CUDNN_DIRECTIONS: dict[str, Tok] = {
    "fprop": Tok("fprop", "forward", MEASURED, CAPTURE_TRACE),
    "bprop": Tok("bprop", "backward", MEASURED, CAPTURE_TRACE),
}
CUDNN_INSTRUCTIONS: dict[str, Tok] = {
    "wgmma": Tok("wgmma", "Hopper warp-group MMA instructions", MEASURED, CAPTURE_TRACE),
    "wmma": Tok("wmma", "warp-level MMA instructions (the sm80 kernels cuDNN also runs on Hopper)", MEASURED,
                CAPTURE_PROGRAMS),
}
CUDNN_DTYPES: dict[str, Tok] = {
    "f16": Tok("fp16", "16-bit inputs (fp16 or bf16: the captured bf16 SDPA ran f16 kernels)", MEASURED,
               CAPTURE_TRACE),
    "bf16": Tok("bf16", "bfloat16 inputs"),
    "fp8": Tok("fp8", "fp8 inputs"),
    "mxfp8": Tok("mxfp8", "block-scaled fp8 (MXFP8) inputs"),
}

# ----------------------------------------------------------------------------------------- Triton
# <category> prefix -> the op word Inductor's category stands for.
TRITON_CATEGORIES: dict[str, Tok] = {
    "poi": Tok("pointwise", "pointwise kernel (elementwise ops)"),
    "red": Tok("reduction", "reduction kernel (looped reduction)"),
    "per": Tok("persistent_reduction", "persistent reduction (the whole reduced dim in one block)"),
    "tem": Tok("template", "template kernel (Inductor's matmul / attention templates with fused epilogue)"),
    "for": Tok("foreach", "foreach kernel (one launch over a list of tensors: optimizer steps)"),
    "spl": Tok("split_scan", "split scan kernel (cumsum-like)"),
    "mix": Tok("mix_order_reduction", "mixed-order reduction kernel"),
}
TRITON_CATEGORIES_VARIANT: dict[str, Tok] = {k: Tok(k, t.meaning, t.evidence, t.source)
                                              for k, t in TRITON_CATEGORIES.items()}
# ATen op names that contain underscores, as Inductor writes them inside kernel names. Only the longest
# match at a position is glued; anything else stays one word per token.
TRITON_OP_PHRASES: tuple[tuple[str, ...], ...] = tuple(tuple(p.split("_")) for p in (
    "_to_copy", "_unsafe_view", "_softmax", "_log_softmax", "_softmax_backward_data", "_scaled_mm",
    "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention", "_int_mm", "_adaptive_avg_pool2d",
    "native_layer_norm", "native_layer_norm_backward", "native_dropout", "native_batch_norm",
    "native_group_norm", "layer_norm", "group_norm", "batch_norm", "rms_norm", "_fused_rms_norm",
    "embedding_dense_backward", "nll_loss_forward", "nll_loss_backward", "nll_loss2d_forward",
    "flex_attention", "flex_attention_backward", "index_put", "index_select", "scatter_add", "slice_scatter",
    "select_scatter", "constant_pad_nd", "avg_pool2d", "max_pool2d_with_indices", "new_zeros", "new_ones",
    "full_like", "zeros_like", "ones_like", "empty_like", "rand_like", "randn_like", "masked_fill",
    "where_self", "gelu_backward", "silu_backward", "threshold_backward", "sigmoid_backward",
    "tanh_backward", "mm_t", "cutlass_scaled_mm", "clamp_min", "clamp_max", "var_mean", "arange",
    "_weight_norm_interface",
))
# ...and their backward ops (native_dropout_backward, native_group_norm_backward, ...)
TRITON_OP_PHRASES += tuple(p + ("backward",) for p in TRITON_OP_PHRASES if p[-1] != "backward")
TRITON_OP_PHRASES_BY_HEAD: dict[str, tuple[tuple[str, ...], ...]] = {}
for _p in sorted(TRITON_OP_PHRASES, key=len, reverse=True):
    TRITON_OP_PHRASES_BY_HEAD[_p[0]] = TRITON_OP_PHRASES_BY_HEAD.get(_p[0], ()) + (_p,)
# ATen ops that make an Inductor template kernel a GEMM or an attention.
TRITON_GEMM_OPS = frozenset({"mm", "addmm", "bmm", "baddbmm", "_scaled_mm", "_int_mm", "mm_t", "matmul",
                             "linear", "addmv", "_grouped_mm"})
# Matmuls Inductor decomposes into its own reductions / pointwise kernels (extern ops such as _scaled_mm or a
# custom cutlass_scaled_mm named in a kernel are its prologue's consumers, not the kernel's work).
TRITON_DECOMPOSED_GEMM_OPS = frozenset({"mm", "addmm", "bmm", "baddbmm", "mm_t", "matmul", "addmv"})
TRITON_ATTENTION_OPS = frozenset({"flex_attention", "flex_attention_backward", "flex_decoding"})

# --------------------------------------------------------------------------------- memory-efficient
FMHA_DIRECTIONS: dict[str, Tok] = {
    "cutlassF": Tok("fwd", "forward (AttentionKernel)"),
    "cutlassB": Tok("bwd", "backward (AttentionBackwardKernel)"),
}
FMHA_DTYPES: dict[str, Tok] = {
    "f16": Tok("fp16", "float16"), "bf16": Tok("bf16", "bfloat16"), "f32": Tok("fp32", "float32"),
}
FMHA_ALIGN: dict[str, Tok] = {
    "aligned": Tok("aligned", "inputs aligned for 128-bit loads"),
    "notaligned": Tok("notaligned", "inputs not aligned"),
}
FMHA_FLAGS: dict[str, Tok] = {
    "rf": Tok("rf", "output accumulated in registers"),
    "gmem": Tok("gmem", "output accumulated in global memory (long head dims)"),
    "dropout": Tok("dropout", "dropout fused"),
    "seqaligned": Tok("seqaligned", "sequence length a multiple of the tile"),
}

# ---------------------------------------------------------------------------------- trtllm-gen bmm
TRTLLM_PREFIXES: dict[str, Tok] = {
    "bmm": Tok("bmm", "batched GEMM kernel"),
    "Bmm": Tok("Bmm", "batched GEMM kernel (cubin file spelling)"),
}
TRTLLM_DTYPES: dict[str, Tok] = {
    "E4m3": Tok("fp8_e4m3", "float8 e4m3"), "E5m2": Tok("fp8_e5m2", "float8 e5m2"),
    "E2m1": Tok("fp4_e2m1", "float4 e2m1 (NVFP4/MXFP4)"), "MxE4m3": Tok("mxfp8_e4m3", "MX float8 e4m3"),
    "MxE2m1": Tok("mxfp4_e2m1", "MX float4 e2m1"), "Bfloat16": Tok("bf16", "bfloat16"),
    "Fp16": Tok("fp16", "float16"), "Fp32": Tok("fp32", "float32"), "Fp8": Tok("fp8", "float8 (block-scale type)"),
}
TRTLLM_FLAGS: dict[str, Tok] = {
    "transOut": Tok("transOut", "output written transposed"),
    "noShfl": Tok("noShfl", "no shuffle of the B matrix"),
    "schedS": Tok("schedS", "static tile scheduler"),
    "schedP": Tok("schedP", "persistent tile scheduler"),
    "bN": Tok("bN", "batch along N"),
    "bM": Tok("bM", "batch along M"),
    "tma": Tok("tma", "TMA loads"),
    "tmaSf": Tok("tmaSf", "TMA loads of the scale factors"),
    "rgTma": Tok("rgTma", "routed gather through TMA (MoE token routing)"),
    "clmp": Tok("clmp", "clamped activation"),
    "dynB": Tok("dynB", "dynamic batch"),
    "swiGlu": Tok("swiGlu", "SwiGLU activation fused"),
    "geGlu": Tok("geGlu", "GeGLU activation fused"),
    "relu2": Tok("relu2", "squared-ReLU activation fused"),
    "gated": Tok("gated", "gated activation fused"),
}

# ------------------------------------------------------------------------------------------- NCCL
NCCL_PREFIXES: dict[str, Tok] = {"ncclDevKernel": Tok("ncclDevKernel", "NCCL device kernel (NCCL >= 2.19)")}
NCCL_LEGACY_PREFIXES: dict[str, Tok] = {"ncclKernel": Tok("ncclKernel", "NCCL kernel (older naming)")}
NCCL_COLLECTIVES: dict[str, Tok] = {k: Tok(k, f"{k} collective") for k in (
    "AllReduce", "AllGather", "ReduceScatter", "Reduce", "Broadcast", "SendRecv", "AllToAll", "Generic")}
NCCL_REDOPS: dict[str, Tok] = {k: Tok(k, f"reduction operator {k}") for k in (
    "Sum", "Prod", "Min", "Max", "PreMulSum", "SumPostDiv", "Avg")}
NCCL_DTYPES: dict[str, Tok] = {
    "bf16": Tok("bf16", "bfloat16"), "f16": Tok("fp16", "float16"), "f32": Tok("fp32", "float32"),
    "f64": Tok("fp64", "float64"), "i8": Tok("int8", "int8"), "u8": Tok("uint8", "uint8"),
    "i32": Tok("int32", "int32"), "u32": Tok("uint32", "uint32"), "i64": Tok("int64", "int64"),
    "u64": Tok("uint64", "uint64"), "f8e4m3": Tok("fp8_e4m3", "float8 e4m3"), "f8e5m2": Tok("fp8_e5m2", "float8 e5m2"),
}
NCCL_LEGACY_DTYPES: dict[str, Tok] = {
    "half": Tok("fp16", "float16"), "float": Tok("fp32", "float32"), "double": Tok("fp64", "float64"),
    "bf16": Tok("bf16", "bfloat16"), "bfloat16": Tok("bf16", "bfloat16"), "__nv_bfloat16": Tok("bf16", "bfloat16"),
    "int8_t": Tok("int8", "int8"),
    "uint8_t": Tok("uint8", "uint8"), "int32_t": Tok("int32", "int32"), "uint32_t": Tok("uint32", "uint32"),
    "int64_t": Tok("int64", "int64"), "uint64_t": Tok("uint64", "uint64"),
}
NCCL_ALGOS: dict[str, Tok] = {k: Tok(k, f"{k} algorithm") for k in (
    "RING", "TREE", "NVLS", "NVLS_TREE", "COLLNET_DIRECT", "COLLNET_CHAIN", "PAT")}
NCCL_PROTOCOLS: dict[str, Tok] = {
    "LL": Tok("LL", "low-latency protocol (8-byte stores with flags)"),
    "LL128": Tok("LL128", "low-latency protocol, 128-byte lines"),
    "SIMPLE": Tok("SIMPLE", "simple protocol (bulk copies with fences)"),
}

# ------------------------------------------------------------------------ namespace-recognised families
# Namespace (or name start) -> (family, library). Longest key wins.
SIGNATURE_FAMILIES: dict[str, Tok] = {
    "pytorch_flash::": Tok(("flash_attn", "torch"), "FlashAttention 2 compiled into libtorch (SDPA's FLASH_ATTENTION "
                           "backend)", INFERRED, PUBLIC),
    "flash::": Tok(("flash_attn", "flash-attn"), "FlashAttention 2/3 (the flash-attn package, vLLM's / sglang's "
                   "builds)", INFERRED, PUBLIC),
    "flashinfer::": Tok(("flashinfer", "flashinfer"), "FlashInfer kernels (attention, sampling, norms, "
                        "all-reduce fusion, GEMMs)", INFERRED, PUBLIC),
    "deep_gemm::": Tok(("deepgemm", "deepgemm"), "DeepGEMM fp8 / bf16 GEMMs (JIT-compiled at run time)", INFERRED,
                       PUBLIC),
    "marlin::": Tok(("marlin", "vllm"), "Marlin mixed-precision (int4/fp4 weight) GEMM", INFERRED, PUBLIC),
    "marlin_moe_wna16::": Tok(("marlin", "vllm"), "Marlin MoE GEMM (weight-only quantised experts)", INFERRED, PUBLIC),
    "infer_marlin_moe::": Tok(("marlin", "vllm"), "Marlin MoE GEMM (another build's namespace)", INFERRED, PUBLIC),
    "gptq_marlin::": Tok(("marlin", "vllm"), "GPTQ Marlin GEMM", INFERRED, PUBLIC),
    "machete::": Tok(("marlin", "vllm"), "Machete mixed-input GEMM (CUTLASS 3, Hopper)", INFERRED),
    "cudnn::": Tok(("cudnn", "cudnn"), "cuDNN's precompiled helper kernels (SDPA backward: dO.O, dQ "
                   "conversion)", MEASURED, CAPTURE_TRACE),
    "tensorrt_llm::": Tok(("trtllm_gen", "trtllm"), "TensorRT-LLM kernels", INFERRED, PUBLIC),
    "vllm::": Tok(("vllm", "vllm"), "vLLM's own CUDA kernels (norms, activations, KV-cache writes, custom "
                  "all-reduce), compiled into its extension", INFERRED, PUBLIC),
    "sglang::": Tok(("sglang", "sglang"), "sglang's own CUDA kernels (sgl-kernel), compiled into its extension",
                    INFERRED, PUBLIC),
}
# cuDNN's precompiled engine kernels (convolutions): regex on the name -> op. They carry other families'
# prefixes (xmma, cutlass) but a `cudnn` build tag or a convolution word: cuDNN, not cuBLAS, launched them.
CUDNN_ENGINE_PATTERNS: dict[str, Tok] = {
    r"^sm\d+_xmma_(fprop|dgrad|wgrad)_": Tok("<1>", "xmma convolution kernel of cuDNN (fprop / dgrad / wgrad "
                                             "implicit GEMM, build tag _cudnn)", INFERRED, PUBLIC),
    r"^cutlass__5x_cudnn::": Tok("conv", "cuDNN's CUTLASS convolution kernels (namespace cutlass__5x_cudnn)",
                                 INFERRED, PUBLIC),
    r"^cutlass_tensorop_\w*?(fprop|dgrad|wgrad)": Tok("<1>", "cuDNN's CUTLASS convolution kernel named "
                                                      "without its namespace", INFERRED, PUBLIC),
    r"^implicit_convolve_sgemm": Tok("fprop", "cuDNN's SIMT implicit-GEMM convolution", INFERRED, PUBLIC),
    r"scudnn": Tok("conv", "cuDNN's hand-written convolution kernels (scudnn, winograd)", INFERRED),
    r"^cutlass_cudnn_infer::": Tok("conv", "cuDNN's CUTLASS inference kernels", INFERRED),
}
# Namespaces of the code that instantiated a CUTLASS template (device_kernel<ns::...>) -> library.
TEMPLATE_LIBRARIES: dict[str, Tok] = {
    "at::": Tok("torch", "instantiated in libtorch (torch's grouped / scaled GEMMs: enable_3x_kernel_for_sm9x)",
                MEASURED, CAPTURE_PROGRAMS),
    "flashinfer::": Tok("flashinfer", "instantiated by FlashInfer (JIT by default)", INFERRED, PUBLIC),
    "tensorrt_llm::": Tok("trtllm", "instantiated in TensorRT-LLM", INFERRED),
    "vllm::": Tok("vllm", "instantiated in vLLM's extension", INFERRED),
    "sglang::": Tok("sglang", "instantiated in sglang's kernel library", INFERRED),
    "machete::": Tok("vllm", "vLLM's Machete", INFERRED),
}
SIGNATURE_FAMILIES_SORTED = tuple(sorted(SIGNATURE_FAMILIES.items(), key=lambda kv: -len(kv[0])))
# Words of trtllm-gen attention kernel names (CamelCase, no separators), kept as flags in order.
TRTLLM_FMHA_WORDS = (r"PagedKv", r"ContiguousKv", r"SeparateQkv", r"Causal", r"Dense", r"SlidingOrChunkedCausal",
                     r"SlidingWindow", r"Custom", r"VarSeq", r"MultiCtasKv", r"Persistent", r"Static", r"SwapsAb",
                     r"ForGen", r"Context", r"DynamicTokenSparse", r"HVPerCta\d+", r"P\d+(?=[A-Z])",
                     r"Q\d+Kv\d+", r"KeepsMmaAbForGen", r"Sparse")

# ------------------------------------------------------------------------------------- kind keywords
# Substring of a function name (or of its template arguments, for torch's functor-carrying kernels) ->
# kind. The first match wins; rows are ordered so that the specific beats the generic.
KIND_KEYWORDS: tuple[tuple[str, str], ...] = (
    # sorts and top-k first: a radix sort's histogram and scan passes are part of the sort
    ("RadixSort", "other"), ("radix_sort", "other"), ("radixSort", "other"), ("TopK", "other"),
    ("topk", "other"),
    # random numbers are elementwise (normal_and_transform is not a norm)
    ("distribution_", "elementwise"),
    # embedding backward sums rows into the weight gradient
    ("embedding_backward", "reduction"), ("sum_and_scatter", "reduction"), ("indexing_backward", "reduction"),
    # communication
    ("allreduce", "communication"), ("all_reduce", "communication"), ("AllReduce", "communication"),
    ("all_gather", "communication"), ("AllGather", "communication"), ("reduce_scatter", "communication"),
    ("cross_device_reduce", "communication"), ("lamport", "communication"), ("alltoall", "communication"),
    # attention
    ("Attention", "attention"), ("attention", "attention"), ("Prefill", "attention"), ("Decode", "attention"),
    ("MLA", "attention"), ("fmha", "attention"), ("flash", "attention"), ("dot_do_o", "attention"),
    ("convert_dq", "attention"), ("sdpa", "attention"), ("merge_state", "attention"),
    # GEMMs
    ("Gemm", "gemm"), ("gemm", "gemm"), ("GEMM", "gemm"), ("Marlin", "gemm"), ("matmul", "gemm"),
    ("_mm_", "gemm"),
    # copies and data movement
    ("CatArrayBatchedCopy", "copy"), ("copy_kernel", "copy"), ("direct_copy", "copy"), ("_copy", "copy"),
    ("Copy", "copy"), ("index_select", "copy"), ("indexSelect", "copy"), ("index_elementwise", "copy"),
    ("indexFunc", "copy"), ("index_put", "copy"), ("gather", "copy"), ("scatter", "copy"),
    ("embedding", "copy"), ("Embedding", "copy"), ("take_", "copy"), ("transpose", "copy"), ("permute", "copy"),
    ("reshape_and_cache", "copy"), ("fill_", "elementwise"), ("ToNhwc", "copy"), ("ToNchw", "copy"),
    ("im2col", "copy"), ("upsample", "copy"), ("pad_", "copy"),
    # reductions (normalisations and softmax reduce over a row)
    ("reduce_kernel", "reduction"), ("Reduce", "reduction"), ("reduce", "reduction"), ("SoftMax", "reduction"),
    ("softmax", "reduction"), ("Softmax", "reduction"), ("layer_norm", "reduction"), ("LayerNorm", "reduction"),
    ("RowwiseMoments", "reduction"), ("GammaBeta", "reduction"), ("batch_norm", "reduction"),
    ("RMSNorm", "reduction"), ("rms_norm", "reduction"), ("_norm", "reduction"), ("norm_", "reduction"),
    ("Norm", "reduction"),
    ("Scan", "reduction"), ("scan", "reduction"), ("cumsum", "reduction"), ("Histogram", "reduction"),
    ("argmax", "reduction"), ("nll_loss", "reduction"), ("cross_entropy", "reduction"),
    ("reduction", "reduction"), ("grad_weight", "reduction"), ("bn_fw", "reduction"), ("bn_bw", "reduction"),
    # sorts, selection and other bookkeeping
    ("Sort", "other"), ("sort", "other"), ("radix", "other"), ("Radix", "other"), ("topk", "other"),
    ("TopK", "other"), ("philox", "other"), ("unique", "other"), ("Unique", "other"), ("nonzero", "other"),
    ("Select", "other"),
    ("routing", "other"), ("sampling", "other"), ("Sampling", "other"),
    # elementwise
    ("elementwise", "elementwise"), ("Elementwise", "elementwise"), ("Functor", "elementwise"),
    ("multi_tensor_apply", "elementwise"), ("dropout", "elementwise"), ("activation", "elementwise"),
    ("act_and_mul", "elementwise"), ("silu", "elementwise"), ("gelu", "elementwise"), ("rotary", "elementwise"),
    ("rope", "elementwise"), ("Rope", "elementwise"), ("quant", "elementwise"), ("Quant", "elementwise"),
    ("fill", "elementwise"), ("Fill", "elementwise"), ("triu", "elementwise"), ("tril", "elementwise"),
    ("Transform", "elementwise"), ("transform", "elementwise"), ("for_each", "elementwise"),
)
