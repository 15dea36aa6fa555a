"""Kind and provenance of a decoded name, inferred from its family (evidence ``name``).

`FAMILY_CLASSES` gives each family its default (kind, provenance, library) and why; `classify` refines
the kind where one family holds several kinds of work (torch's kernels, Triton categories, cuDNN graphs,
FlashInfer) and fills ``ambiguity`` where the name alone cannot settle the provenance. docs/provenance.md
explains the classes and the evidence that would show each.
"""
from __future__ import annotations

from cublaslt_probe.names import classes as C
from cublaslt_probe.names import tokens as T
from cublaslt_probe.names.tokens import Tok

_CUBLAS = "cuBLAS / cuBLASLt kernel: precompiled in the library, picked by its heuristic for the GEMM"

FAMILY_CLASSES: dict[str, Tok] = {
    "nvjet": Tok((C.GEMM, C.LIBRARY_SELECTED, "cublas"), _CUBLAS),
    "xmma": Tok((C.GEMM, C.LIBRARY_SELECTED, "cublas"), _CUBLAS),
    "cutlass": Tok((C.GEMM, C.LIBRARY_SELECTED, "cublas"), _CUBLAS),
    "cutlass3x": Tok((C.GEMM, C.LIBRARY_SELECTED, "cublas"), _CUBLAS + "; Inductor's CUTLASS backend "
                     "writes the same procedural names for kernels it compiles at run time"),
    "legacy": Tok((C.GEMM, C.LIBRARY_SELECTED, "cublas"), _CUBLAS),
    "gemv": Tok((C.GEMM, C.LIBRARY_SELECTED, "cublas"), _CUBLAS + " (GEMMs with m or n = 1)"),
    "gemmSN": Tok((C.GEMM, C.LIBRARY_SELECTED, "cublas"), _CUBLAS + " (small-N GEMMs)"),
    "splitk_reduce": Tok((C.GEMM, C.LIBRARY_SELECTED, "cublas"), "finishes a split-K cuBLAS GEMM: part of the "
                         "GEMM's time"),
    "helper": Tok((C.GEMM, C.LIBRARY_SELECTED, "cublas"), "cuBLAS helper run as part of a GEMM (dot, scal, "
                  "stand-alone epilogue); Memcpy/Memset rows are copies by the driver (kind copy)"),
    "framework": Tok((C.OTHER, C.AHEAD_OF_TIME, None), "torch's own kernels (ATen), CUB and Thrust: compiled "
                     "into the framework's binary; CuPy's elementwise kernels are compiled at run time (NVRTC)"),
    "cutlass_template": Tok((C.GEMM, C.AHEAD_OF_TIME, None), "CUTLASS template instantiated in a framework or "
                            "library binary (torch's grouped GEMM, vLLM, sglang, TensorRT-LLM) and launched "
                            "directly: no heuristic chose it"),
    "cudnn": Tok((C.ATTENTION, C.RUNTIME_COMPILED, "cudnn"), "cudnn_generated_fort_native_*: generated and "
                 "compiled by a cuDNN runtime-fusion engine; cudnn::fusion:: helpers are precompiled in libcudnn "
                 "and launched with that engine's plan (ahead-of-time); cuDNN's precompiled engine kernels "
                 "(convolutions, layout and batch-norm kernels) are picked by cuDNN's heuristics "
                 "(library-selected)"),
    "triton": Tok((C.OTHER, C.RUNTIME_COMPILED, "triton"), "Triton kernel TorchInductor generated and compiled "
                  "while the program ran"),
    "flash_attn": Tok((C.ATTENTION, C.AHEAD_OF_TIME, "flash-attn"), "FlashAttention 2/3 compiled into libtorch "
                      "or the flash-attn wheel; FlashAttention 4 (CuTe DSL) is JIT-compiled"),
    "fmha_cutlass": Tok((C.ATTENTION, C.AHEAD_OF_TIME, "torch"), "PyTorch memory-efficient attention, compiled "
                        "into libtorch"),
    "flashinfer": Tok((C.OTHER, C.RUNTIME_COMPILED, "flashinfer"), "FlashInfer JIT-compiles its kernels on "
                      "first use (NVCC through its JIT, cached on disk)"),
    "trtllm_gen": Tok((C.GEMM, C.AHEAD_OF_TIME, "trtllm-gen"), "trtllm-gen kernels shipped as prebuilt cubins "
                      "(TensorRT-LLM, FlashInfer) and launched directly"),
    "deepgemm": Tok((C.GEMM, C.RUNTIME_COMPILED, "deepgemm"), "DeepGEMM JIT-compiles each GEMM shape at run "
                    "time (NVCC or NVRTC)"),
    "marlin": Tok((C.GEMM, C.AHEAD_OF_TIME, "vllm"), "Marlin / Machete kernels compiled into vLLM's or "
                  "sglang's extension"),
    "nccl": Tok((C.COMMUNICATION, C.AHEAD_OF_TIME, "nccl"), "NCCL collective kernel compiled into libnccl"),
    "vllm": Tok((C.OTHER, C.AHEAD_OF_TIME, "vllm"), "vLLM's own kernels, compiled into its extension"),
    "sglang": Tok((C.OTHER, C.AHEAD_OF_TIME, "sglang"), "sglang's own kernels (sgl-kernel), compiled into its "
                  "extension"),
    "cute_dsl": Tok((C.OTHER, C.RUNTIME_COMPILED, None), "CuTe DSL (CUTLASS Python) kernel: JIT-compiled "
                    "when first called"),
    "unknown": Tok((C.OTHER, C.UNKNOWN, None), "no grammar knows the name"),
}

AMBIGUOUS = {
    "cutlass3x": "cutlass3x names are written by cuBLAS (library-selected) and by Inductor's CUTLASS backend "
                 "(runtime-compiled); the name alone cannot tell them apart. Chosen: library-selected, the "
                 "source of every cutlass3x kernel captured so far",
    "flashinfer": "FlashInfer JIT-compiles by default (runtime-compiled) but can also load prebuilt kernels "
                  "(flashinfer-jit-cache / AOT wheels); the name is the same",
    "cutlass_template/flashinfer": "a CUTLASS template inside FlashInfer: JIT-compiled by default, prebuilt "
                                   "when FlashInfer's AOT package is installed",
}


def keyword_kind(text: str) -> str | None:
    """The kind named by the first `tokens.KIND_KEYWORDS` row found in `text`, else None."""
    for word, kind in T.KIND_KEYWORDS:
        if word in text:
            return kind
    return None


def classify(f: dict) -> None:
    """Fill kind, provenance, library, ambiguity (when not set yet) of a decoded name's fields `f`."""
    family = f.get("family", "unknown")
    tok = FAMILY_CLASSES.get(family) or FAMILY_CLASSES["unknown"]
    kind, prov, lib = tok.value
    op = f.get("op") or ""
    base = f.get("base") or ""
    if family == "helper" and op in ("memset", "memcpy"):
        kind, prov, lib = C.COPY, C.AHEAD_OF_TIME, "driver"
    elif family == "framework":
        variant = f.get("variant")
        lib = "torch" if base.startswith(("at_cuda_detail::", "(anonymous namespace)::")) else variant
        text = base + " " + " ".join(f.get("template_args", ())[:3])
        kind = keyword_kind(base.rsplit("::", 1)[-1] + " " + text) or C.OTHER
        if variant == "cupy":
            prov = C.RUNTIME_COMPILED
            kind = C.COPY if op.startswith("copy") else (keyword_kind(op) or C.ELEMENTWISE)
    elif family == "cudnn":
        if base.startswith("cudnn::fusion::"):
            prov = C.AHEAD_OF_TIME
            kind = keyword_kind(base) or C.OTHER
        elif base.startswith("cudnn::") or f.get("variant") == "engine":
            prov = C.LIBRARY_SELECTED
            kind = C.OTHER if op in ("fprop", "dgrad", "wgrad", "conv") else (keyword_kind(base) or C.OTHER)
        elif op.startswith("matmul"):
            kind = C.GEMM
        elif op.startswith("conv"):
            kind = C.OTHER
    elif family == "triton":
        variant = f.get("variant")
        ops = set(f.get("fused_ops", ()))
        if ops & (T.TRITON_GEMM_OPS if variant == "tem" else T.TRITON_DECOMPOSED_GEMM_OPS):
            kind = C.GEMM               # a matmul, as a template or decomposed (skinny mm -> reduction)
        elif ops & T.TRITON_ATTENTION_OPS:
            kind = C.ATTENTION
        elif variant == "tem":
            kind = C.OTHER
        elif variant in ("poi", "for"):
            kind = C.ELEMENTWISE
        elif variant in ("red", "per", "spl", "mix"):
            kind = C.REDUCTION
    elif family == "flash_attn":
        if f.get("variant") == "fa4":
            prov = C.RUNTIME_COMPILED
        lib = f.get("library") or lib
    elif family == "flashinfer":
        kind = keyword_kind(base.replace("flashinfer::", "")) or C.OTHER
        f.setdefault("ambiguity", AMBIGUOUS["flashinfer"])
    elif family == "trtllm_gen":
        if op == "fmha":
            kind = C.ATTENTION
        elif op != "gemm":
            kind = keyword_kind(base) or C.OTHER
    elif family == "deepgemm":
        kind = C.GEMM if "gemm" in base.lower() else (keyword_kind(base) or C.OTHER)
    elif family == "cutlass_template":
        lib = f.get("library")
        if lib == "flashinfer":
            prov = C.RUNTIME_COMPILED
            f.setdefault("ambiguity", AMBIGUOUS["cutlass_template/flashinfer"])
    elif family == "cutlass3x":
        f.setdefault("ambiguity", AMBIGUOUS["cutlass3x"])
    elif family in ("cute_dsl", "vllm", "sglang"):
        kind = keyword_kind(base.split("::", 1)[-1]) or C.OTHER
    f.setdefault("kind", kind)
    f.setdefault("provenance", prov)
    if f.get("library") is None and lib is not None:
        f["library"] = lib
