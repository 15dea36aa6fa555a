"""The kernel-name decoder: tables of real names with expected fields, round trips, odd input.

Where each name comes from:
  [cap]  captured on the H200 (tests/fixtures/names/, PROVENANCE.md there); long signatures are looked up
         in names.jsonl by their start (`_cap`), so the table holds only real captured text;
  [ref]  the project's reference notes (REFERENCE.md §5, H200, cuBLAS 13.1);
  [iss]  issue 2 and its brief;
  [pub]  public traces/issues found through code search; the number is the search index's file id
         (find_string), so the source can be looked up again.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cublaslt_probe.errors import UnknownKernelName
from cublaslt_probe.names import FAMILIES, GRAMMARS, JSONL_KEYS, KernelName, decode, encode
from cublaslt_probe.names import docs as names_docs

ROOT = pathlib.Path(__file__).resolve().parents[1]
_CAPTURED = sorted(json.loads(line)["kernel"] for line in
                   (ROOT / "tests" / "fixtures" / "names" / "names.jsonl").open(encoding="utf-8") if line.strip())


def _cap(start: str) -> str:
    """The first captured kernel name that starts with `start`."""
    hits = [n for n in _CAPTURED if n.startswith(start)]
    assert hits, f"no captured kernel name starts with {start!r}"
    return hits[0]


def case(name, origin, **expected):
    return pytest.param(name, expected, id=f"{origin}:{name[:70]}")


NAMES = [
    # ---------------------------------------------------------------------------------------- nvjet
    case("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT", "iss", family="nvjet", arch="sm90",
         a_type="bf16", b_type="bf16", c_type="bf16", d_type="bf16", compute_type="fp32", tile_m=256,
         tile_n=128, tile_k=64, stages=4, cluster_m=1, cluster_n=2, raster="h", beta="bz", flags=("coopA",),
         split_k=False, layout="TNT", trans_a=True, trans_b=False, swap_ab=True),
    case("nvjet_sm90_hsh_128x8_64x12_4x1_v_bz_splitK_NNT", "ref", family="nvjet", a_type="fp16",
         c_type="fp16", tile_m=128, tile_n=8, tile_k=64, stages=12, cluster_m=4, cluster_n=1, raster="v",
         split_k=True, flags=("splitK",), trans_a=False, trans_b=False, swap_ab=True),
    case("nvjet_sm90_qqtst_128x128_128x6_2x1_v_bz_coopA_algo2_TNT", "ref", a_type="fp8_e4m3",
         b_type="fp8_e4m3", c_type="bf16", d_type="bf16", compute_type="fp32", tile_k=128, stages=6,
         flags=("coopA", "algo2"), type_code="qqtst"),
    case("nvjet_sm90_tst_64x16_64x16_2x1_v_bz_splitK_NNT", "cap", tile_m=64, tile_n=16, tile_k=64, stages=16,
         cluster_m=2, cluster_n=1, split_k=True),
    case("nvjet_sm90_qrtst_144x128_128x6_1x2_h_bz_coopA_algo2_TNN", "cap", a_type="fp8_e4m3",
         b_type="fp8_e5m2", c_type="bf16", tile_m=144, swap_ab=False, layout="TNN"),
    case("nvjet_sm90_rqtst_512x32_128x3_2x1_v_bz_coopA_algo2_TNT", "cap", a_type="fp8_e5m2",
         b_type="fp8_e4m3", tile_m=512, tile_n=32, stages=3),
    # [pub] 66892184994 (torch trace table)
    case("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_bias_TNT", "pub", flags=("coopA", "bias")),
    # [pub] 56710343561 (gate GEMM write-up)
    case("nvjet_sm90_tst_192x192_64x3_2x1_v_bz_coopB_NTN", "pub", layout="NTN", trans_a=False, trans_b=True,
         swap_ab=False, flags=("coopB",)),
    # [pub] 68318385892 (sglang fp8 trace)
    case("nvjet_sm90_qqtst_128x128_128x6_1x2_h_bz_ovscale_TNT", "pub", flags=("ovscale",)),
    # [pub] 59488037838 (cuBLASLt split-K repro: one kernel per library/arch)
    case("nvjet_sm100_hsh_64x8_64x16_1x1_h_bz_splitK_NNT", "pub", arch="sm100", split_k=True),
    case("nvjet_sm103_hsh_64x8_64x16_1x1_h_bz_splitK_NNT", "pub", arch="sm103"),
    case("nvjet_sm90_hss_64x8_64x16_1x1_h_bz_splitK_NNT", "pub", a_type="fp16", c_type="fp32",
         compute_type="fp32"),
    case("nvjet_hss_64x8_64x16_1x1_v_bz_splitK_NNT", "pub", arch=None, a_type="fp16", raster="v"),
    # [pub] 62457333053 (B200 fc2 kernel comment)
    case("nvjet_sm100_qqtst_128x256_128x6_2x1_2cta_v_bz_bias_TNT", "pub", arch="sm100",
         flags=("2cta", "bias"), tile_m=128, tile_n=256),
    # [pub] 56957812144 (nsys summary), 54246479208 (badd)
    case("nvjet_tst_64x32_64x16_2x2_2cta_h_bz_splitK_TNT", "pub", arch=None, flags=("2cta", "splitK")),
    case("nvjet_tst_256x96_64x5_2x1_2cta_v_badd_NNT", "pub", beta="badd", tile_n=96),
    # consumer Blackwell: [ref], [pub] 71558708450
    case("nvjet_sm120_tst_mma_64x64x128_3_32x32x128_tmaAB_alignCD4_bz_TNNN", "ref", family="nvjet",
         arch="sm120", variant="mma", tile_m=64, tile_n=64, tile_k=128, stages=3, warp_tile=(32, 32, 128),
         align_c=4, flags=("tmaAB",), layout="TNNN", trans_a=True, trans_b=False, split_k=False),
    case("nvjet_sm120_hss_mma_128x176x64_2_32x88x64_tmaAB_alignCD4_bz_NNNN", "pub", tile_n=176, stages=2,
         c_type="fp32"),
    # ----------------------------------------------------------------------------------------- xmma
    case("sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x256x32_warpgroupsize2x1x1_execute_segment_k_off"
         "_kernel__5x_cublas", "iss", family="xmma", arch="sm90", op="gemm", a_type="fp32", c_type="fp32",
         math_type="tf32", compute_type="fp32", scale_type="fp32", layout="tn", layout_c="n", trans_a=True,
         trans_b=False, tile_m=128, tile_n=256, tile_k=32, stages=None, warpgroup_shape=(2, 1, 1),
         segment_k=False, split_k=None, suffix="kernel__5x_cublas"),
    case("sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize32x32x8_stage3_warpsize2x2x1_ffma_aligna4_alignc4"
         "_execute_kernel__5x_cublas", "iss", arch="sm80", math_type="fp32", tile_k=8, stages=3,
         warp_shape=(2, 2, 1), instruction="ffma", instruction_shape=None, align_a=4, align_c=4),
    case("sm90_xmma_gemm_f32f32_tf32f32_f32_nt_n_tilesize128x256x32_warpgroupsize2x1x1_execute_segment_k_on"
         "_kernel__5x_cublas", "cap", segment_k=True, trans_a=False, trans_b=True),
    # [pub] 70076282749
    case("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off"
         "_kernel__5x_cublas", "pub", a_type="bf16", c_type="bf16", math_type="bf16", compute_type="fp32"),
    # [pub] 10948161393
    case("sm80_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize32x32x64_stage6_warpsize2x2x1_tensor16x8x16_execute"
         "_kernel__5x_cublas", "pub", instruction="tensor", instruction_shape=(16, 8, 16), stages=6),
    # [pub] 68443124007 (TensorRT build tag)
    case("sm80_xmma_gemm_f16f16_f16f32_f32_nn_n_tilesize64x128x32_stage5_warpsize2x2x1_tensor16x8x16_aligna2"
         "_alignc2_execute_kernel_trt", "pub", suffix="kernel_trt", align_a=2),
    # [pub] 21570930817 (kernel list without the _kernel suffix; cluster, gmma stages, sparse)
    case("sm90_xmma_gemm_f16f16_f16f32_f32_nt_n_tilesize256x128x64_cgasize1x2x1_stage4_gmmastage2"
         "_warpgroupsize2x1x1_hgmma64x128x16", "pub", cluster_m=1, cluster_n=2, cluster_k=1, stages=4,
         flags=("gmmastage2",), instruction="hgmma", instruction_shape=(64, 128, 16), suffix=None),
    case("sm90_xmma_sparse_gemm_f16f16_f16f32_f32_nt_t_tilesize128x128x64_cgasize2x1x1_stage4_gmmastage2"
         "_warpgroupsize1x1x1_sptensor_hgmma64x128x32", "pub", op="sparse_gemm", layout_c="t",
         flags=("gmmastage2", "sptensor")),
    # 21570930817
    case("sm80_xmma_gemm_i8i8_i8i32_f32_tn_n_tilesize256x128x64_stage4_warpsize4x2x1_tensor16x8x32", "pub",
         a_type="int8", c_type="int8", math_type="int8", compute_type="int32"),
    # -------------------------------------------------------------------------------------- cutlass
    case("void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_64x128_32x3_tn_align4>(cutlass_80_tensorop_"
         "s1688gemm_64x128_32x3_tn_align4::Params)", "iss", family="cutlass", base="cutlass_80_tensorop_s1688"
         "gemm_64x128_32x3_tn_align4", source="demangled", arch="sm80", variant="tensorop", a_type="fp32",
         c_type="fp32", compute_type="fp32", instruction_shape=(16, 8, 8), tile_m=64, tile_n=128, tile_k=32,
         stages=3, layout="tn", trans_a=True, trans_b=False, align_a=4, align_b=4, split_k=None),
    case("void cutlass::Kernel2<cutlass_75_tensorop_f16_s1688gemm_f16_256x128_nn_align1>(cutlass_75_tensorop_"
         "f16_s1688gemm_f16_256x128_nn_align1::Params)", "cap", arch="sm75", a_type="fp16", c_type="fp16",
         compute_type="fp32", tile_k=None, stages=None),
    case("void cutlass::Kernel2<cutlass_75_tensorop_s1688gemm_bf16_256x128_nn_align1>(cutlass_75_tensorop_"
         "s1688gemm_bf16_256x128_nn_align1::Params)", "cap", a_type="bf16", c_type="fp32"),
    case("void cutlass::Kernel2<cutlass_80_simt_sgemm_64x64_8x5_nn_align1>(cutlass_80_simt_sgemm_64x64_8x5_"
         "nn_align1::Params)", "cap", variant="simt", instruction_shape=None, tile_k=8, stages=5),
    case("void cutlass::Kernel2<cutlass_75_wmma_tensorop_f16_s161616gemm_f16_32x32_64x1_tn_align1>(cutlass_75_"
         "wmma_tensorop_f16_s161616gemm_f16_32x32_64x1_tn_align1::Params)", "cap", variant="wmma_tensorop",
         instruction_shape=(16, 16, 16)),
    # [pub] 71097703440, 61177824909, 56722161300, 69882191021
    case("cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_256x128_32x3_nn_align8", "pub", epilogue="relu",
         a_type="bf16", c_type="bf16", instruction_shape=(16, 8, 16)),
    case("cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16_128x2_tn_align8", "pub", tile_k=128, stages=2),
    case("void cutlass::Kernel2<cutlass_80_tensorop_z884gemm_32x16_16x3_tt_align1>(cutlass_80_tensorop_z884"
         "gemm_32x16_16x3_tt_align1::Params)", "pub", compute_type="complex128", a_type="complex128",
         trans_a=True, trans_b=True),
    case("cutlass_75_tensorop_i8816gemm_s8_128x128_tn_align16", "pub", a_type="int8", compute_type="int32",
         c_type="int32", align_a=16),
    # cutlass3x: [pub] 12556940530, 54558345081
    case("cutlass3x_sm90_tensorop_s64x128x16gemm_bf16_bf16_f32_void_bf16_128x128x64_1x1x1_0_tnn_align8"
         "_warpspecialized_pingpong_epi_tma", "pub", family="cutlass3x", arch="sm90", a_type="bf16",
         b_type="bf16", compute_type="fp32", c_type=None, d_type="bf16", instruction_shape=(64, 128, 16),
         tile_m=128, tile_n=128, tile_k=64, cluster_m=1, cluster_n=1, cluster_k=1, stages=0, layout="tnn",
         layout_c="n", schedule="warpspecialized_pingpong_epi_tma"),
    case("cutlass3x_sm100_simt_sgemm_f32_f32_f32_f32_f32_128x128x16_1x1x1_3_tnn_align1_bias_f32_relu", "pub",
         variant="simt", epilogue="bias_f32_relu", stages=3),
    # --------------------------------------------------------------------------------------- legacy
    # [pub] 55595926415, 55069596019, 8120377271, 70506869217, 58637141407, 55301627135
    case("ampere_bf16_s16816gemm_bf16_128x256_ldg8_f2f_stages_64x3_nn", "pub", family="legacy", arch="sm80",
         a_type="bf16", c_type="bf16", compute_type="fp32", tile_m=128, tile_n=256, tile_k=64, stages=3,
         flags=("ldg8", "f2f"), layout="nn"),
    case("ampere_bf16_s16816gemm_bf16_64x64_sliced1x2_ldg8_f2f_stages_64x6_nn", "pub",
         flags=("sliced1x2", "ldg8", "f2f")),
    case("ampere_s16816gemm_bf16_128x64_ldg8_stages_32x6_nn", "pub", a_type="bf16", c_type="fp32"),
    case("ampere_sgemm_128x64_tn", "pub", a_type="fp32", tile_k=None, trans_a=True, trans_b=False),
    case("volta_fp16_s884gemm_fp16_256x128_ldg8_f2f_nn", "pub", arch="sm70", instruction_shape=(8, 8, 4)),
    case("turing_fp16_s1688gemm_fp16_128x64_sliced1x2_ldg8_f2f_tn", "pub", arch="sm75"),
    case("ampere_bf16_s16816gemm_bf16_128x128_ldg8_relu_f2f_stages_64x3_nn", "pub", epilogue="relu"),
    case("void sgemm_largek_lds64<true, false, 6, 3, 4, 5, 2, 66>(float*, float const*, float const*, int, int,"
         " int, int, int, int, float const*, float const*, float, float, int, int, int*, int*)", "cap",
         family="legacy", base="sgemm_largek_lds64", a_type="fp32", flags=("largek", "lds64"),
         template_args=("true", "false", "6", "3", "4", "5", "2", "66")),
    case(_cap("void magma_sgemmEx_kernel<float, __nv_bfloat16, __nv_bfloat16, false, true"), "cap", family="legacy",
         compute_type="fp32", a_type="bf16", trans_a=False, trans_b=True),
    # -------------------------------------------------------------------------------------- helpers
    case(_cap("void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16,"), "cap",
         family="splitk_reduce", op="reduce", base="cublasLt::splitKreduce_kernel"),
    # [pub] 41795105459 (older library, no namespace, truncated by nsys)
    case("void splitKreduce_kernel<float, float, float, float, (bool)1, (bool)0>(cublasSplitKParams<T3>, cons…",
         "pub", family="splitk_reduce", template_args=("float", "float", "float", "float", "true", "false")),
    case("void gemv2T_kernel_val<int, int, float, float, float, float, 128, 16, 4, 4, false, false, cublasGemv"
         "ParamsEx<int, cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float "
         "const>, cublasGemvTensorStridedBatched<float>, float> >(cublasGemvParamsEx<int, cublasGemvTensor"
         "StridedBatched<float const>, cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStrided"
         "Batched<float>, float>, float, float)", "cap", family="gemv", a_type="fp32", compute_type="fp32",
         trans_a=True),
    # [pub] 24805007406 (old template style int=128)
    case("void gemv2T_kernel_val<float, float, float, int=128, int=16, int=2, int=4, bool=0>(int, int, float, "
         "float const *, int, float const *, int, float, float*, int)", "pub", family="gemv",
         template_args=("float", "float", "float", "128", "16", "2", "4", "false")),
    case("std::enable_if<!(false), void>::type internal::gemvx::kernel<int, int, float, float, float, float, "
         "false, true, false, false, 9, false, cublasGemvParamsEx<int, cublasGemvTensorStridedBatched<float "
         "const>, cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float>, float> >"
         "(cublasGemvParamsEx<int, cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched"
         "<float const>, cublasGemvTensorStridedBatched<float>, float>)", "cap", family="gemv",
         base="internal::gemvx::kernel"),
    # [pub] 71274317567 (nsys casts; the parameter tail after cublasGemvParamsEx is shortened here)
    case("std::enable_if<!T7, void>::type internal::gemvx::kernel<int, int, __nv_bfloat16, __nv_bfloat16, "
         "__nv_bfloat16, float, (bool)0, (bool)1, (bool)1, (bool)0, (int)6, (bool)0, cublasGemvParamsEx<int>>"
         "(int)", "pub", family="gemv", a_type="bf16", c_type="bf16", compute_type="fp32"),
    case(_cap("void gemmSN_NN_kernel<float, 256, 4, 2, 8, 4, 4, false, cublasGemvTensorStridedBatched<float"),
         "cap", family="gemmSN", layout="NN",
         trans_a=False, a_type="fp32"),
    # [pub] 41900580001 (truncated by the profiler)
    case("void gemmSN_TN_kernel<float, (int)128, (int)16, (int)2, (int)4, (int)8, (int)9, (bool)0, cublasGemv…",
         "pub", family="gemmSN", layout="TN", trans_a=True, trans_b=False, flags=("truncated",)),
    case(_cap("void dot_kernel<float, 128, 0, cublasDotParams<cublasGemvTensorStridedBatched<__half const>"),
         "cap", family="helper", op="dot", a_type="fp32"),
    case(_cap("void reduce_1Block_kernel<float, 128, 7,"), "cap",
         family="helper", op="reduce"),
    case("void scal_kernel<float, float, 1, true, 6, 5, 5, 3>(cublasTransposeParams<float>, float const*, "
         "float*, float const*)", "cap", family="helper", op="scal"),
    case(_cap("void cublasLt::epilogue::impl::globalKernel<"), "cap", family="helper", op="epilogue"),
    case("Memset (Device)", "cap", family="helper", op="memset", source="activity"),
    case("Memcpy DtoD (Device -> Device)", "cap", family="helper", op="memcpy", source="activity"),
    case("splitKreduce_kernel", "iss", family="splitk_reduce"),
    case("gemvx", "iss", family="gemv"),
    # ------------------------------------------------------------------------------------ framework
    case("cupy_copy__float16_float32", "cap", family="framework", variant="cupy", op="copy"),
    case(_cap("void at::native::elementwise_kernel<128, 4,"), "cap", family="framework",
         variant="torch", op="elementwise"),
    case(_cap("void cub::"), "cap", family="framework", variant="cub"),
]

# Names no grammar understands fully: family and what stays unparsed.
NOT_UNDERSTOOD = [
    # [pub] 57637412532: TensorRT's own kernels, not cuBLAS's
    ("trt_ampere_h16816gemm_128x64_ldg8_nn_v1", "unknown", ("trt", "ampere", "h16816gemm", "128x64", "ldg8",
                                                            "nn", "v1")),
    # [pub] 68528715702: a shortened name written by hand in a test
    ("nvjet_sm90_tst_128x8_TNT", "nvjet", ("<missing ktile>", "<missing cluster>", "<missing raster>",
                                           "<missing beta>")),
    # [pub] 61437177292: a lower-cased slug of a real name
    ("nvjet_sm100_tst_256x128_64x5_2x2_2cta_h_bz_tnt", "nvjet", ("tnt", "<missing layout>")),
    # a type letter nobody has seen, a flag nobody has seen
    ("nvjet_sm90_txt_256x128_64x4_1x2_h_bz_TNT", "nvjet", ("txt",)),
    ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_gelu_TNT", "nvjet", ("gelu",)),
    ("void cutlass::Kernel2<cutlass_80_tensorop_f16_s16816g...", "cutlass",
     ("s16816g", "<missing core>", "<missing tile>", "<missing layout>", "<truncated>")),
    ("sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32_warpgroupsize1x1x1_execute_segment", "xmma",
     ("segment",)),
]

ODD = ["", " ", "\n", "\t\t", "_" * 10_000, "é" * 50, "日本語のカーネル", "\x00\x01", "nvjet", "nvjet_", "_nvjet",
       "cutlass_", "cutlass3x", "sm90_xmma_", "ampere_", "void", "void foo<", "<<<<", ">>>>", "((((", "))))",
       "void (", "a<b(c>d)", "_Z", "_Zgarbage", "_ZN", "Memset", "Memcpy", "::", "std::enable_if<!(false)",
       "void cutlass::Kernel2<>()", "void cutlass::Kernel2<(int)3>()", "nvjet_sm90_tst_" + "1x1_" * 2000,
       "x" * 100_000, "…", "...", "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT\n"]


# ------------------------------------------------------------------------------------------ tables
@pytest.mark.parametrize("name,expected", NAMES)
def test_decode_real_names(name, expected):
    kn = decode(name)
    got = {k: getattr(kn, k) for k in expected}
    assert got == expected
    assert kn.family in FAMILIES
    assert kn.unparsed == (), kn.unparsed
    assert kn.known
    assert decode(name, strict=True) is kn


GRAMMAR_FAMILIES = {g.family for g in GRAMMARS.values() if g.name != "helpers"}


@pytest.mark.parametrize("name,expected", NAMES)
def test_round_trip_real_names(name, expected):
    kn = decode(name)
    assert encode(kn) == kn.base
    if kn.source == "bare":
        assert encode(kn) == name
    if kn.family in GRAMMAR_FAMILIES and kn.tile_m is not None:
        # every field survives; helpers encode to their function name (template arguments are lost)
        again = decode(encode(kn)).to_dict()
        assert again | {"name": kn.name, "source": kn.source} == kn.to_dict()


@pytest.mark.parametrize("name,family,unparsed", NOT_UNDERSTOOD)
def test_not_understood_names(name, family, unparsed):
    kn = decode(name)
    assert kn.family == family
    assert kn.unparsed == unparsed
    assert not kn.known
    with pytest.raises(UnknownKernelName) as e:
        decode(name, strict=True)
    assert name[:40] in str(e.value)
    assert "cublaslt-probe grammars" in str(e.value)


@pytest.mark.parametrize("text", ODD, ids=[repr(t)[:30] for t in ODD])
def test_odd_input_never_raises(text):
    kn = decode(text)
    assert isinstance(kn, KernelName)
    assert kn.name == text
    json.dumps(kn.to_dict())
    _ = kn.short
    if not kn.known:
        with pytest.raises(UnknownKernelName):
            decode(text, strict=True)


@pytest.mark.parametrize("value", [None, 123, 1.5, b"nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT",
                                   ["nvjet"], {"a": 1}, object()])
def test_non_string_input_never_raises(value):
    kn = decode(value)
    assert isinstance(kn, KernelName)
    assert isinstance(kn.name, str)


def test_bytes_decode_like_text():
    assert decode(b"nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT").tile_m == 256


def test_empty_and_whitespace_are_unknown():
    for text in ("", "   ", "\n"):
        kn = decode(text)
        assert (kn.family, kn.base, kn.tokens, kn.unparsed) == ("unknown", "", (), ())


def test_truncated_prefixes_of_real_names_never_raise():
    for name, _ in [p.values for p in NAMES]:
        for i in range(0, len(name), 3):
            decode(name[:i])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=200))
def test_fuzz_text_never_raises(text):
    kn = decode(text)
    assert isinstance(kn, KernelName)


_TOKENS = ["nvjet", "sm90", "sm100", "tst", "hsh", "qqtst", "256x128", "64x4", "1x2", "h", "v", "bz", "badd",
           "coopA", "splitK", "bias", "TNT", "NNT", "xmma", "gemm", "f32f32", "tf32f32", "f32", "tn", "n",
           "tilesize128x128x32", "stage3", "execute", "segment", "k", "off", "kernel", "", "5x", "cublas",
           "cutlass", "80", "tensorop", "s1688gemm", "bf16", "32x3", "align4", "cutlass3x", "void", "ampere",
           "sgemm", "stages", "mma", "64x64x128", "3", "tmaAB", "alignCD4", "TNNN"]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(_TOKENS), max_size=16))
def test_fuzz_tokens_never_raise_and_known_names_round_trip(toks):
    name = "_".join(toks)
    kn = decode(name)
    if kn.known and kn.family not in ("gemv", "gemmSN", "splitk_reduce", "helper", "framework"):
        assert encode(kn) == name


# ------------------------------------------------------------------------------- forms and fields
CUTLASS = "cutlass_80_tensorop_s1688gemm_64x128_32x3_tn_align4"
FORMS = [CUTLASS,
         f"void cutlass::Kernel2<{CUTLASS}>({CUTLASS}::Params)",
         f"cutlass::Kernel2<{CUTLASS}>",
         f"void Kernel2<{CUTLASS}>(Params)",        # ncu's short form
         f"void cutlass::Kernel<{CUTLASS}>({CUTLASS}::Params)",
         f"_ZN7cutlass7Kernel2I{len(CUTLASS)}{CUTLASS}EEvNT_6ParamsE"]


def _fields(kn):
    d = kn.to_dict()
    for k in ("name", "source"):
        d.pop(k)
    return d


def test_demangled_and_mangled_forms_decode_to_the_bare_fields():
    bare = _fields(decode(FORMS[0]))
    for form in FORMS[1:]:
        assert _fields(decode(form)) == bare, form
    assert decode(FORMS[-1]).source == "mangled"
    assert decode(FORMS[1]).source == "demangled"


def test_mangled_helper():
    kn = decode("_Z17gemv2T_kernel_valIiiffffLi128ELi16ELi4ELi4ELb0ELb0EEvv")
    assert (kn.family, kn.base, kn.source) == ("gemv", "gemv2T_kernel_val", "mangled")
    assert kn.template_args[:3] == ("int", "int", "float")


def test_invalid_mangled_name_is_unknown():
    kn = decode("_ZN7cutlass7Kernel2I99broken")
    assert kn.family == "unknown" and kn.source == "mangled"


def test_surrounding_whitespace_is_ignored_but_kept_in_name():
    kn = decode("  nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT \n")
    assert kn.known and kn.tile_m == 256 and kn.name.startswith("  ")


def test_to_dict_has_the_jsonl_keys_first_and_is_json_ready():
    d = decode("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT").to_dict()
    assert tuple(d)[:len(JSONL_KEYS)] == JSONL_KEYS
    assert d["flags"] == ["coopA"] and d["unparsed"] == []
    assert json.loads(json.dumps(d)) == d
    assert set(d) >= {f.name for f in dataclasses.fields(KernelName)} | {"short"}


@pytest.mark.parametrize("name,short", [
    ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT", "256x128 · 64x4 · 1x2 · coopA"),
    ("nvjet_sm90_hsh_128x8_64x12_4x1_v_bz_splitK_NNT", "128x8 · 64x12 · 4x1 · splitK"),
    ("sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x256x32_warpgroupsize2x1x1_execute_segment_k_off_kernel"
     "__5x_cublas", "128x256 · k32"),
    ("cutlass_80_tensorop_s1688gemm_64x128_32x3_tn_align4", "64x128 · 32x3"),
    ("void cublasLt::splitKreduce_kernel<32, 16, int, float>", "splitKreduce_kernel"),
    ("", "unknown"),
])
def test_short(name, short):
    assert decode(name).short == short


def test_kernel_name_is_frozen_and_hashable():
    kn = decode("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT")
    with pytest.raises(dataclasses.FrozenInstanceError):
        kn.tile_m = 1
    assert len({kn, decode("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT")}) == 1
    built = KernelName(**{f.name: getattr(kn, f.name) for f in dataclasses.fields(kn)})
    assert built == kn and hash(built) == hash(kn)


def test_decode_is_cached():
    n = "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT"
    assert decode(n) is decode(n)


# ------------------------------------------------------------------------------------------ encode
def test_encode_writes_changed_fields():
    kn = decode("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT")
    new = dataclasses.replace(kn, tile_m=128, stages=5, flags=("coopB", "splitK"), raster="v")
    assert encode(new) == "nvjet_sm90_tst_128x128_64x5_1x2_v_bz_coopB_splitK_TNT"


def test_encode_builds_the_type_code_from_dtypes():
    kn = decode("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT")
    assert encode(dataclasses.replace(kn, type_code=None, a_type="fp16", b_type="fp16", c_type="fp16",
                                      d_type="fp16")) == "nvjet_sm90_hsh_256x128_64x4_1x2_h_bz_coopA_TNT"
    assert encode(dataclasses.replace(kn, type_code=None, a_type="fp8_e4m3", b_type="fp8_e5m2")) == \
        "nvjet_sm90_qrtst_256x128_64x4_1x2_h_bz_coopA_TNT"


def test_encode_without_a_required_field_says_which():
    kn = decode("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT")
    with pytest.raises(ValueError, match="raster"):
        encode(dataclasses.replace(kn, raster=None))


def test_encode_unknown_and_helpers_give_the_base():
    assert encode(decode("flash_fwd_kernel")) == "flash_fwd_kernel"
    assert encode(decode("void cublasLt::splitKreduce_kernel<32, 16, int, float>")) == \
        "cublasLt::splitKreduce_kernel"


# --------------------------------------------------------------------------------------- grammars
@pytest.mark.parametrize("g", list(GRAMMARS.values()), ids=list(GRAMMARS))
def test_grammar_examples_decode_fully_and_round_trip(g):
    for ex in g.examples:
        kn = decode(ex)
        assert kn.known, (ex, kn.unparsed)
        if g.name != "helpers":
            assert kn.family == g.family
            assert encode(kn) == ex


@pytest.mark.parametrize("g", list(GRAMMARS.values()), ids=list(GRAMMARS))
def test_every_meaning_is_marked_and_measured_ones_cite_a_source(g):
    rows = g.meanings()
    assert rows
    for r in rows:
        assert r.evidence in ("measured", "inferred"), r
        assert r.meaning
        if r.evidence == "measured":
            assert r.source, r


def test_docs_tables_are_generated_from_the_grammars():
    text = (ROOT / "docs" / "decoder.md").read_text(encoding="utf-8")
    section = names_docs.generated_section(text)
    assert section is not None, "docs/decoder.md lost its generated-section markers"
    assert section == names_docs.markdown_tables(), \
        "docs/decoder.md is stale: run `python -m cublaslt_probe.names.docs docs/decoder.md`"


def test_package_level_lazy_exports():
    import cublaslt_probe
    assert cublaslt_probe.decode is decode and cublaslt_probe.encode is encode


def test_the_generated_section_of_a_document_is_rewritten_only_when_stale(tmp_path):
    doc = tmp_path / "decoder.md"
    text = (ROOT / "docs" / "decoder.md").read_text(encoding="utf-8")
    stale = text.replace(names_docs.generated_section(text), "| an old table |")
    doc.write_text(stale, encoding="utf-8")
    assert names_docs.update(doc) is True
    assert names_docs.generated_section(doc.read_text(encoding="utf-8")) == names_docs.markdown_tables()
    assert doc.read_text(encoding="utf-8").replace(names_docs.markdown_tables(), "") == \
        stale.replace("| an old table |", "")                     # nothing outside the markers moved
    assert names_docs.update(doc) is False
    assert names_docs.generated_section("no markers here") is None
