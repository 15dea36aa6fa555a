"""Kernel-name decoder: what a kernel name says (cuBLAS/cuBLASLt and the families that share its traces),
as a frozen `KernelName` with its kind and provenance (`classes`).

    >>> from cublaslt_probe.names import decode, encode
    >>> kn = decode("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT")
    >>> kn.family, kn.tile_m, kn.tile_n, kn.tile_k, kn.stages, kn.cluster_n, kn.short
    ('nvjet', 256, 128, 64, 4, 2, '256x128 · 64x4 · 1x2 · coopA')
    >>> encode(kn)
    'nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT'

Grammars are registered per family in `GRAMMARS` and driven by the token tables of `tokens`, which also
feed `cublaslt-probe grammars` and docs/decoder.md.
"""
from cublaslt_probe.names.classes import EVIDENCE, KINDS, PROBLEM_SHAPES, PROVENANCES
from cublaslt_probe.names.core import clear_cache, decode, encode
from cublaslt_probe.names.grammar import GRAMMARS, Grammar
from cublaslt_probe.names.model import FIELD_NAMES, JSONL_KEYS, KernelName
from cublaslt_probe.names.tokens import INFERRED, MEASURED, Meaning

FAMILIES = ("nvjet", "xmma", "cutlass", "cutlass3x", "legacy", "gemv", "gemmSN", "splitk_reduce", "helper",
            "framework", "cutlass_template", "cudnn", "triton", "flash_attn", "fmha_cutlass", "flashinfer",
            "trtllm_gen", "deepgemm", "marlin", "nccl", "vllm", "sglang", "cute_dsl", "unknown")

__all__ = ["decode", "encode", "clear_cache", "KernelName", "GRAMMARS", "Grammar", "FAMILIES", "FIELD_NAMES",
           "JSONL_KEYS", "Meaning", "MEASURED", "INFERRED", "KINDS", "PROVENANCES", "EVIDENCE", "PROBLEM_SHAPES"]
