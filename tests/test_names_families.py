"""The families that share traces with cuBLAS: every real name gets a family, a kind and a provenance.

Names come from:
  traces    tests/fixtures/traces/*.json.gz: torch.profiler traces captured on the H200 (PROVENANCE.md there);
  programs  tests/fixtures/programs/: run folders of real programs captured on the H200 (Llama, Mixtral MoE,
            GPT-2 training, torch.compile, SDPA backends, fp8; PROVENANCE.md there): names.txt and each
            folder's trace.json.gz;
  public    tests/fixtures/names/public_names.jsonl: names copied from public traces and issue threads, each
            with a note of where it was seen (PROVENANCE.md in that folder).
"""
from __future__ import annotations

import dataclasses
import gzip
import json
import pathlib
import string

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cublaslt_probe.names import (
    EVIDENCE,
    FAMILIES,
    KINDS,
    PROBLEM_SHAPES,
    PROVENANCES,
    KernelName,
    decode,
    encode,
    signatures,
)
from cublaslt_probe.names import classes as C
from cublaslt_probe.names.classify import FAMILY_CLASSES

FIXTURES = pathlib.Path(__file__).parent / "fixtures"
TRACES = sorted((FIXTURES / "traces").glob("*.json.gz")) + sorted((FIXTURES / "programs").glob("*/trace.json.gz"))
PROGRAMS = sorted((FIXTURES / "programs").glob("names.txt"))
PUBLIC = [json.loads(line) for line in (FIXTURES / "names" / "public_names.jsonl").open(encoding="utf-8")
          if line.strip()]
GEMM_OPS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_scaled_mm", "aten::_grouped_mm",
            "aten::_scaled_grouped_mm", "aten::addmv", "aten::mv", "aten::dot"}


def _trace_events(path):
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return json.load(f)["traceEvents"]


def _trace_names(path):
    return sorted({e["name"] for e in _trace_events(path) if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")})


def _program_names(path):
    return [ln.rstrip("\n") for ln in path.open(encoding="utf-8") if ln.strip()]


def _public(start):
    hits = [r["name"] for r in PUBLIC if r["name"].startswith(start)]
    assert hits, f"no public name starts with {start!r}"
    return hits[0]


def _trace_name(start):
    for p in TRACES:
        for n in _trace_names(p):
            if n.startswith(start):
                return n
    raise AssertionError(f"no trace kernel starts with {start!r}")


ALL_NAMES = sorted({r["name"] for r in PUBLIC} | {n for p in TRACES for n in _trace_names(p)}
                   | {n for p in PROGRAMS for n in _program_names(p)})


# ------------------------------------------------------------------------------------------ coverage
def test_public_names_each_say_where_they_were_seen():
    assert len(PUBLIC) >= 60
    for r in PUBLIC:
        assert set(r) == {"name", "seen"}
        assert r["seen"].startswith(("public search index file id ", "public issue thread ")), r


def test_at_least_95_percent_of_fixture_names_get_a_family():
    fams = {n: decode(n).family for n in ALL_NAMES}
    unknown = sorted(n for n, f in fams.items() if f == "unknown")
    assert len(ALL_NAMES) >= 100
    assert len(unknown) <= 0.05 * len(ALL_NAMES), unknown
    assert set(fams.values()) <= set(FAMILIES)


def test_every_family_decodes_from_real_names():
    fams = {decode(n).family for n in ALL_NAMES}
    assert {"nvjet", "cutlass3x", "splitk_reduce", "helper", "framework", "cutlass_template", "cudnn", "triton",
            "flash_attn", "fmha_cutlass", "flashinfer", "trtllm_gen", "deepgemm", "marlin", "nccl"} <= fams


@pytest.mark.parametrize("path", TRACES, ids=[f"{p.parent.name}/{p.name}" for p in TRACES])
def test_kernels_launched_by_gemm_ops_are_gemm_kind(path):
    """Each kernel of a real trace whose launching ATen op is a GEMM is a GEMM, whichever library ran it
    (cuBLAS, torch's CUTLASS grouped GEMM and the kernel that prepares its pointer arrays, Triton templates)."""
    ev = _trace_events(path)
    op_of = {e["args"]["External id"]: e["name"] for e in ev
             if e.get("cat") == "cpu_op" and "External id" in e.get("args", {})}
    checked = 0
    for e in ev:
        if e.get("cat") != "kernel":
            continue
        op = op_of.get(e.get("args", {}).get("External id"))
        kn = decode(e["name"])
        if op in GEMM_OPS:
            assert kn.kind == C.GEMM, (op, e["name"][:120])
            checked += 1
        elif kn.kind == C.GEMM:     # and the other way: a GEMM-kind kernel ran under a GEMM op, or is
            assert op == e["name"], (op, e["name"][:120])   # a compiled kernel (its own record: Inductor)
            checked += 1
    if not path.parent.name.startswith(("sdpa_", "llama_decode_with")):
        assert checked >= 1


def test_every_decoded_name_has_allowed_classes():
    for n in ALL_NAMES:
        kn = decode(n)
        assert kn.kind in KINDS and kn.provenance in PROVENANCES and kn.evidence == C.BY_NAME, n
        assert kn.problem_shape in PROBLEM_SHAPES + (None,)
        if kn.family == "unknown":
            assert (kn.kind, kn.provenance) == (C.OTHER, C.UNKNOWN)
        else:
            assert kn.provenance != C.UNKNOWN, n


def test_classes_live_in_one_place():
    assert KINDS == ("gemm", "attention", "elementwise", "reduction", "copy", "communication", "other")
    assert PROVENANCES == ("library-selected", "ahead-of-time", "runtime-compiled", "unknown")
    assert EVIDENCE == ("name", "observed")
    assert set(FAMILY_CLASSES) == set(FAMILIES)
    for tok in FAMILY_CLASSES.values():
        kind, prov, _lib = tok.value
        C.check(kind, prov)
    with pytest.raises(ValueError, match="kind"):
        C.check("matmul", C.AHEAD_OF_TIME)


def test_classes_are_in_jsonl():
    d = decode(_trace_name("cudnn_generated_fort_native_sdpa_sm90_flash_fprop")).to_dict()
    assert (d["kind"], d["provenance"], d["evidence"], d["library"]) == \
        ("attention", "runtime-compiled", "name", "cudnn")
    assert json.loads(json.dumps(d)) == d


# ---------------------------------------------------------------------------------------- provenance
PROVENANCE_CASES = [
    # library-selected: cuBLAS picked a precompiled kernel (H200 traces)
    ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_bias_TNT", "nvjet", "gemm", "library-selected", "cublas"),
    ("void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16,", "splitk_reduce", "gemm",
     "library-selected", "cublas"),
    ("cutlass3x_sm100_simt_sgemm_f32_f32_f32_f32_f32_128x64x16", "cutlass3x", "gemm", "library-selected", "cublas"),
    # ahead-of-time: compiled into a binary, launched directly
    ("void at::native::reduce_kernel<512, 1,", "framework", "reduction", "ahead-of-time", "torch"),
    ("void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<at::native::direct_copy",
     "framework", "copy", "ahead-of-time", "torch"),
    ("void at::native::vectorized_elementwise_kernel<8, at::native::CUDAFunctor_add<c10::BFloat16>",
     "framework", "elementwise", "ahead-of-time", "torch"),
    ("void cudnn::fusion::compute_dot_do_o_specialized<true, 64>", "cudnn", "attention", "ahead-of-time", "cudnn"),
    ("Memset (Device)", "helper", "copy", "ahead-of-time", "driver"),
    ("fmha_cutlassF_bf16_aligned_64x128_rf_sm80", "fmha_cutlass", "attention", "ahead-of-time", "torch"),
    ("void pytorch_flash::flash_fwd_kernel<", "flash_attn", "attention", "ahead-of-time", "torch"),
    ("void cutlass::device_kernel<flash::enable_sm90_or_later<", "flash_attn", "attention", "ahead-of-time",
     "flash-attn"),
    ("void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<cutlass::gemm::GroupProblemShape<cute",
     "cutlass_template", "gemm", "ahead-of-time", None),
    ("bmm_E4m3_E4m3E4m3_Fp32_t128x32x128u2", "trtllm_gen", "gemm", "ahead-of-time", "trtllm-gen"),
    ("fmhaSm100fKernel_QkvBfloat16OBfloat16H64", "trtllm_gen", "attention", "ahead-of-time", "trtllm-gen"),
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "nccl", "communication", "ahead-of-time", "nccl"),
    ("void marlin_moe_wna16::Marlin<", "marlin", "gemm", "ahead-of-time", "vllm"),
    # runtime-compiled: generated while the program ran
    ("cudnn_generated_fort_native_sdpa_sm90_flash_bprop", "cudnn", "attention", "runtime-compiled", "cudnn"),
    ("triton_tem_fused_mm_relu_0", "triton", "gemm", "runtime-compiled", "triton"),
    ("triton_red_fused_argmax_1", "triton", "reduction", "runtime-compiled", "triton"),
    # Inductor computed a skinny mm (1 x 201088 x 2880) as a reduction: still the GEMM
    ("triton_red_fused_mm_0", "triton", "gemm", "runtime-compiled", "triton"),
    # ...but a quantisation feeding vLLM's cutlass_scaled_mm is not one
    ("triton_red_fused__to_copy_abs_clamp_cutlass_scaled_mm", "triton", "reduction", "runtime-compiled", "triton"),
    ("triton_poi_fused__scaled_dot_product_cudnn_attention_add_7", "triton", "elementwise", "runtime-compiled",
     "triton"),
    ("void deep_gemm::fp8_gemm_kernel<", "deepgemm", "gemm", "runtime-compiled", "deepgemm"),
    ("kernel_cutlass_kernel_flash_attncuteflash_fwd_sm100", "flash_attn", "attention", "runtime-compiled",
     "flash-attn"),
    ("void flashinfer::BatchPrefillWithPagedKVCacheKernel<", "flashinfer", "attention", "runtime-compiled",
     "flashinfer"),
    ("void flashinfer::norm::FusedAddRMSNormKernel<", "flashinfer", "reduction", "runtime-compiled", "flashinfer"),
]


def _real(start):
    hits = [n for n in ALL_NAMES if n.startswith(start)]
    assert hits, f"no fixture name starts with {start!r}"
    return hits[0]


@pytest.mark.parametrize("start,family,kind,prov,lib", PROVENANCE_CASES, ids=[c[0][:50] for c in PROVENANCE_CASES])
def test_kind_and_provenance_of_real_names(start, family, kind, prov, lib):
    kn = decode(_real(start))
    assert (kn.family, kn.kind, kn.provenance, kn.library) == (family, kind, prov, lib)


# torch's own kernels from the H200 programs: the kind read from the function name and its functor
TORCH_KINDS = [
    ("void at::native::(anonymous namespace)::distribution_elementwise_grid_stride_kernel<", "elementwise"),
    ("void at::native::sbtopk::gatherTopK<", "other"),
    ("void at::native::(anonymous namespace)::embedding_backward_feature_kernel<", "reduction"),
    ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float", "reduction"),
    ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<", "reduction"),
    ("void (anonymous namespace)::softmax_warp_forward<", "reduction"),
    ("void at::native::(anonymous namespace)::CatArrayBatchedCopy<", "copy"),
    ("void at::native::index_elementwise_kernel<128, 4, at::native::gpu_index_kernel<at::native::index_put", "copy"),
    ("void at::native::vectorized_elementwise_kernel<8, at::native::bfloat16_copy_kernel_cuda", "copy"),
    ("void at::native::vectorized_elementwise_kernel<8, at::native::GeluCUDAKernelImpl", "elementwise"),
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<", "elementwise"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps", "reduction"),
    ("void at_cuda_detail::cub::detail::radix_sort::DeviceRadixSortHistogramKernel<", "other"),
    ("void at_cuda_detail::cub::detail::scan::DeviceScanKernel<", "reduction"),
    ("void at::cuda::detail::prepare_grouped_gemm_data<", "gemm"),
]


@pytest.mark.parametrize("start,kind", TORCH_KINDS, ids=[k[0][:60] for k in TORCH_KINDS])
def test_torch_kernel_kinds(start, kind):
    kn = decode(_real(start))
    assert (kn.family, kn.kind, kn.provenance, kn.library) == ("framework", kind, "ahead-of-time", "torch")


# cuDNN's precompiled engine kernels carry xmma / CUTLASS prefixes but a cuDNN build: not cuBLAS, not GEMMs
CUDNN_ENGINES = [
    ("sm80_xmma_fprop_implicit_gemm_f16f16_f16f32_f32_nhwckrsc_nhwc_tilesize256x64x32", "fprop", "other"),
    ("void cutlass__5x_cudnn::Kernel<cutlass_tensorop_f16_s16816fprop_optimized", "fprop", "other"),
    ("void implicit_convolve_sgemm<", "fprop", "other"),
    ("void cudnn::engines_precompiled::nchwToNhwcKernel<", "nchwToNhwcKernel", "copy"),
    ("void cudnn::cnn::dgrad2d_grouped_direct_kernel<", "dgrad2d_grouped_direct", "other"),
]


@pytest.mark.parametrize("start,op,kind", CUDNN_ENGINES, ids=[c[0][:50] for c in CUDNN_ENGINES])
def test_cudnn_engine_kernels_are_cudnn_library_selected(start, op, kind):
    kn = decode(_public(start))
    assert (kn.family, kn.library, kn.op, kn.kind, kn.provenance) == ("cudnn", "cudnn", op, kind,
                                                                      "library-selected")


def test_serving_framework_kernels():
    kn = decode(_public("void vllm::rms_norm_kernel<"))
    assert (kn.family, kn.kind, kn.provenance, kn.library) == ("vllm", "reduction", "ahead-of-time", "vllm")


def test_every_provenance_class_is_covered_by_real_names():
    provs = {decode(_real(c[0])).provenance for c in PROVENANCE_CASES}
    assert provs == {C.LIBRARY_SELECTED, C.AHEAD_OF_TIME, C.RUNTIME_COMPILED}
    # unknown: TensorRT's own kernels are not a family the decoder knows ([pub] 57637412532)
    kn = decode("trt_ampere_h16816gemm_128x64_ldg8_nn_v1")
    assert (kn.family, kn.kind, kn.provenance) == ("unknown", C.OTHER, C.UNKNOWN)


def test_ambiguous_families_say_why():
    kn = decode(_real("cutlass3x_sm100_simt_sgemm"))
    assert kn.provenance == C.LIBRARY_SELECTED and "Inductor" in kn.ambiguity
    # the same procedural naming from Inductor's CUTLASS backend: the name cannot tell, the note says so
    kn = decode(_public("cutlass3x_sm90_tensorop_s64x256x16gemm_bf16_bf16_f32_void_bf16_128x256x64_1x2x1_0_tnn"))
    assert kn.known and kn.schedule == "stream_k_warpspecialized_cooperative_epi_tma" and "Inductor" in kn.ambiguity
    kn = decode(_real("void flashinfer::BatchPrefill"))
    assert kn.provenance == C.RUNTIME_COMPILED and "prebuilt" in kn.ambiguity
    assert decode(_real("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_bias_TNT")).ambiguity is None


# -------------------------------------------------------------------------------------------- fields
def test_cutlass3_grouped_gemm_fields():
    kn = decode(_public("void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<cutlass::gemm::"
                        "GroupProblemShape<cute::tuple<long"))
    assert (kn.family, kn.kind, kn.problem_shape, kn.arch, kn.stages, kn.variant) == (
        "cutlass_template", "gemm", "grouped", "sm90", 12, "MainloopSm90ArrayTmaGmmaWarpSpecialized")
    assert "truncated" in kn.flags          # nsys cut the name: tile and cluster are not in it
    assert kn.tile_m is None


def test_cutlass3_mangled_name_the_gnu_demangler_refuses():
    n = _public("_ZN7cutlass13device_kernelINS_4gemm6kernel13GemmUniversalIN4cute5tupleIJiiiiEEENS1_10collective")
    kn = decode(n)
    assert kn.source == "mangled" and kn.family == "cutlass_template" and kn.kind == "gemm"
    assert (kn.problem_shape, kn.arch, kn.stages) == ("single", "sm100", 13)
    assert (kn.tile_m, kn.tile_n, kn.tile_k) == (64, 64, 128)
    assert (kn.cluster_m, kn.cluster_n, kn.cluster_k) == (1, 4, 1)
    assert (kn.a_type, kn.b_type, kn.compute_type, kn.d_type) == ("fp8_e4m3", "fp8_e4m3", "fp32", "fp16")
    assert kn.mma_atom == "SM100_MMA_F8F6F4_SS"
    assert (kn.schedule, kn.epilogue) == ("MainloopSm100TmaUmmaWarpSpecialized", "Sm100TmaWarpSpecialized")


def test_torch_grouped_gemm_of_a_real_mixtral_layer():
    """aten::_grouped_mm's CUTLASS 3 kernel (programs/mixtral_moe): mangled, refused by the GNU demangler."""
    n = _real("_ZN7cutlass13device_kernelIN2at4cuda6detail25enable_3x_kernel_for_sm9x")
    kn = decode(n)
    assert (kn.family, kn.kind, kn.provenance, kn.library, kn.source) == (
        "cutlass_template", "gemm", "ahead-of-time", "torch", "mangled")
    assert (kn.problem_shape, kn.arch, kn.stages) == ("grouped", "sm90", 4)
    assert (kn.tile_m, kn.tile_n, kn.tile_k, kn.cluster_m, kn.cluster_n, kn.cluster_k) == (128, 256, 64, 2, 1, 1)
    assert (kn.schedule, kn.epilogue) == ("KernelPtrArrayTmaWarpSpecializedCooperative",
                                          "Sm90PtrArrayTmaWarpSpecialized")
    assert kn.mma_atom == "SM90::GMMA::MMA_64x256x16_F32BF16BF16_SS"
    assert (kn.a_type, kn.b_type, kn.d_type, kn.compute_type) == ("bf16", "bf16", "bf16", "fp32")
    assert kn.unparsed == ()
    # without any demangler, its mangled words still give the family, grouped-ness, schedule and atom
    f = signatures.mangled_fields(n)
    assert (f["family"], f["problem_shape"], f["schedule"], f["stages"], f["library"]) == (
        "cutlass_template", "grouped", "KernelPtrArrayTmaWarpSpecializedCooperative", 4, "torch")
    assert f["mma_atom"].endswith("MMA_64x256x16_F32BF16BF16_SS") and f["a_type"] == "bf16"


def test_cutlass3_mangled_name_cut_short_reads_its_words():
    kn = decode(_public("_ZN7cutlass13device_kernelINS_4gemm6kernel13GemmUniversalINS1_17GroupProblemShape"))
    assert (kn.family, kn.kind, kn.problem_shape, kn.source) == ("cutlass_template", "gemm", "grouped", "mangled")
    assert kn.unparsed == ("<tile not in the mangled words>",) and "truncated" in kn.flags
    kn = decode(_public("_ZN7cutlass13device_kernelINS_4gemm6kernel13GemmUniversalIN4cute5tupleIJiiiiEEENS1_10colle"))
    assert (kn.family, kn.problem_shape) == ("cutlass_template", "single")


def test_cutlass3_vllm_scaled_mm():
    kn = decode(_public("_ZN7cutlass13device_kernelIN49_GLOBAL__N__8bf0e19b_16_scaled_mm_c3x"))
    assert (kn.family, kn.library, kn.provenance) == ("cutlass_template", "vllm", "ahead-of-time")
    assert (kn.tile_m, kn.tile_n, kn.tile_k, kn.cluster_m, kn.cluster_n, kn.cluster_k) == (64, 128, 128, 2, 1, 1)
    assert (kn.a_type, kn.d_type, kn.schedule, kn.epilogue) == (
        "int8", "fp16", "KernelTmaWarpSpecializedPingpong", "TmaWarpSpecialized")


# The grouped GEMM's full kernel type as written in a public CUTLASS study note ([pub] 55656280098), wrapped
# in the device_kernel<> that launches it: the decoder reads the structure of the whole template.
GROUPED_TYPE = (
    "cutlass::gemm::kernel::GemmUniversal<cutlass::gemm::GroupProblemShape<cute::tuple<int32_t, int32_t, int32_t>>, "
    "cutlass::gemm::collective::CollectiveMma<cutlass::gemm::MainloopSm90ArrayTmaGmmaWarpSpecialized<3, "
    "cute::tuple<cute::_2, cute::_1, cute::_1>, cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpong>, "
    "cute::tuple<cute::_128, cute::_128, cute::_128>, cutlass::bfloat16_t, cute::tuple<int64_t, cute::C<1>, "
    "cute::C<0>> *, cutlass::bfloat16_t, cute::tuple<int64_t, cute::C<1>, cute::C<0>> *, cute::TiledMMA<"
    "cute::MMA_Atom<cute::SM90::GMMA::MMA_64x128x16_F32BF16BF16_SS<cute::SM90::GMMA::Major::K, "
    "cute::SM90::GMMA::Major::K, cute::SM90::GMMA::ScaleIn::One, cute::SM90::GMMA::ScaleIn::One>>, "
    "cute::Layout<cute::tuple<cute::_1, cute::_1, cute::_1>, cute::tuple<cute::C<0>, cute::C<0>, cute::C<0>>>, "
    "cute::tuple<cute::Underscore, cute::Underscore, cute::Underscore>>, cute::SM90_TMA_LOAD, void, "
    "cute::identity, cute::SM90_TMA_LOAD_MULTICAST, void, cute::identity>, "
    "cutlass::epilogue::collective::CollectiveEpilogue<cutlass::epilogue::Sm90PtrArrayTmaWarpSpecialized<4, 2, "
    "16, true, false, 2>, cute::tuple<cute::_128, cute::_128, cute::_128>, cute::tuple<cute::C<64>, cute::C<32>>, "
    "cutlass::bfloat16_t, cute::tuple<int64_t, cute::C<1>, cute::C<0>> *, cutlass::bfloat16_t, "
    "cute::tuple<int64_t, cute::C<1>, cute::C<0>> *, cutlass::epilogue::fusion::FusionCallbacks<"
    "cutlass::epilogue::Sm90PtrArrayTmaWarpSpecialized<4, 2, 16, true, false, 2>, "
    "cutlass::epilogue::fusion::LinearCombination<cutlass::bfloat16_t, float, cutlass::bfloat16_t, float, "
    "cutlass::FloatRoundStyle::round_to_nearest>, cute::tuple<cute::_128, cute::_128, cute::_128>, "
    "cute::tuple<cute::C<64>, cute::C<32>>>, cute::SM90_TMA_LOAD, void, void>, void, void>")


def test_cutlass3_full_grouped_template_fields():
    kn = decode(f"void cutlass::device_kernel<{GROUPED_TYPE}>({GROUPED_TYPE}::Params)")
    assert (kn.family, kn.kind, kn.problem_shape, kn.arch) == ("cutlass_template", "gemm", "grouped", "sm90")
    assert (kn.tile_m, kn.tile_n, kn.tile_k, kn.stages) == (128, 128, 128, 3)
    assert (kn.cluster_m, kn.cluster_n, kn.cluster_k) == (2, 1, 1)
    assert kn.schedule == "KernelPtrArrayTmaWarpSpecializedPingpong"
    assert kn.mma_atom == "SM90::GMMA::MMA_64x128x16_F32BF16BF16_SS" and kn.instruction_shape == (64, 128, 16)
    assert (kn.a_type, kn.b_type, kn.c_type, kn.d_type, kn.compute_type) == ("bf16", "bf16", "bf16", "bf16", "fp32")
    assert (kn.epilogue, kn.flags) == ("Sm90PtrArrayTmaWarpSpecialized", ("LinearCombination",))
    # the same kernel launched as a ptr-array batch (no GroupProblemShape) is told apart
    batch = GROUPED_TYPE.replace("cutlass::gemm::GroupProblemShape<cute::tuple<int32_t, int32_t, int32_t>>",
                                 "cute::tuple<int, int, int, int>")
    assert decode(f"void cutlass::device_kernel<{batch}>(Params)").problem_shape == "ptr_array"


def test_cutlass2_templated_kernel_fields():
    kn = decode(_public("void cutlass::Kernel2<cutlass::gemm::kernel::GemmWithFusedEpilogue<MmaPipelined<"))
    assert (kn.family, kn.kind, kn.variant, kn.a_type) == ("cutlass_template", "gemm", "MmaPipelined", "fp16")
    assert (kn.tile_m, kn.tile_n, kn.tile_k, kn.warp_tile, kn.instruction_shape) == (
        128, 64, 32, (64, 32, 32), (16, 8, 8))


def test_flash_attention_fields():
    kn = decode(_public("void cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<flash::"
                        "CollectiveMainloopFwdSm90<2,"))
    assert (kn.family, kn.variant, kn.op, kn.arch) == ("flash_attn", "CollectiveMainloopFwdSm90", "flash_fwd", "sm90")
    assert (kn.stages, kn.tile_m, kn.tile_n, kn.head_dim, kn.cluster_m) == (2, 64, 128, 128, 1)
    assert (kn.a_type, kn.compute_type, kn.schedule) == ("bf16", "fp32", "VarlenDynamicPersistentTileScheduler")
    kn = decode(_public("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4"))
    assert (kn.variant, kn.head_dim, kn.tile_m, kn.tile_n, kn.warp_shape, kn.a_type) == (
        "fa2", 64, 128, 128, (4,), "bf16")
    kn = decode(_public("kernel_cutlass_kernel_flash_attncuteflash_fwd_sm120"))
    assert (kn.variant, kn.arch, kn.op) == ("fa4", "sm120", "flash_fwd")


def test_cudnn_runtime_fusion_fields():
    kn = decode(_trace_name("cudnn_generated_fort_native_sdpa_sm90_flash_fprop"))
    assert (kn.op, kn.variant, kn.arch, kn.instruction, kn.a_type) == ("sdpa_fprop", "flash", "sm90", "wgmma", "fp16")
    assert (kn.tile_m, kn.tile_n, kn.tile_k, kn.warp_shape) == (64, 128, 64, (4, 1, 1))
    assert (kn.cluster_m, kn.cluster_n, kn.cluster_k, kn.flags, kn.index) == (1, 1, 1, ("knob_7", "kernel0_0"), 0)


def test_triton_fields():
    kn = decode(_public("triton_poi_fused__scaled_dot_product_cudnn_attention_add_7"))
    assert (kn.variant, kn.op, kn.fused_ops, kn.index) == (
        "poi", "pointwise", ("_scaled_dot_product_cudnn_attention", "add"), 7)
    kn = decode(_public("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0"))     # Inductor's RMSNorm
    assert kn.fused_ops == ("_to_copy", "add", "mean", "mul", "pow", "rsqrt") and kn.kind == "reduction"
    kn = decode(_public("triton_per_fused__to_copy_add_embedding_dense_backward_native_dropout_backward"))
    assert (kn.variant, kn.op, kn.index) == ("per", "persistent_reduction", 30)
    assert kn.fused_ops == ("_to_copy", "add", "embedding_dense_backward", "native_dropout_backward",
                            "native_layer_norm_backward", "nll_loss_forward")


def test_trtllm_and_fmha_fields():
    kn = decode(_public("bmm_E4m3_E4m3E4m3_Fp32_t128x32x128u2_s6"))
    assert (kn.a_type, kn.b_type, kn.d_type, kn.compute_type) == ("fp8_e4m3", "fp8_e4m3", "fp8_e4m3", "fp32")
    assert (kn.tile_m, kn.tile_n, kn.tile_k, kn.stages, kn.cluster_m, kn.arch) == (128, 32, 128, 6, 1, "sm100f")
    assert (kn.instruction_shape, kn.layout, kn.raster) == ((64, 32, 32), "TN", "M")
    kn = decode(_public("fmhaSm100fKernel_QkvBfloat16OBfloat16HQk576HV512"))
    assert (kn.head_dim, kn.tile_m, kn.tile_n, kn.a_type, kn.d_type) == (576, 16, 128, "bf16", "bf16")
    kn = decode(_public("fmha_cutlassB_bf16_aligned_128x128_k128_sm80"))
    assert (kn.op, kn.a_type, kn.tile_m, kn.tile_n, kn.head_dim, kn.arch) == ("bwd", "bf16", 128, 128, 128, "sm80")


def test_nccl_fields():
    kn = decode(_public("ncclDevKernel_AllReduce_Sum_bf16_RING_LL"))
    assert (kn.op, kn.epilogue, kn.a_type, kn.schedule, kn.instruction) == ("AllReduce", "Sum", "bf16", "RING", "LL")
    kn = decode("ncclKernel_AllReduce_RING_LL_Sum_float")
    assert (kn.family, kn.op, kn.a_type, kn.known) == ("nccl", "AllReduce", "fp32", True)


# ---------------------------------------------------------------------------------------- round trips
def test_regular_new_families_round_trip():
    seen = set()
    for n in ALL_NAMES:
        kn = decode(n)
        if kn.family in ("cudnn", "triton", "fmha_cutlass", "trtllm_gen", "nccl") and kn.known and \
                not kn.template_args and kn.base == n.split("(")[0]:
            assert encode(kn) == kn.base, n
            seen.add(kn.family)
    assert seen >= {"cudnn", "triton", "fmha_cutlass", "trtllm_gen", "nccl"}


def test_name_families_encode_to_their_function_name():
    kn = decode(_public("void deep_gemm::fp8_gemm_kernel<"))
    assert encode(kn) == "deep_gemm::fp8_gemm_kernel"
    n = _public("fmhaSm100fKernel_QkvE4m3")
    assert encode(decode(n)) == n == "fmhaSm100fKernel_QkvE4m3OBfloat16H512PagedKvDenseDynamicTokenSparse"


def test_encode_writes_changed_triton_fields():
    kn = decode("triton_tem_fused_mm_relu_0")
    assert encode(dataclasses.replace(kn, fused_ops=("addmm", "gelu"), index=3)) == "triton_tem_fused_addmm_gelu_3"


# ------------------------------------------------------------------------------------------ bad input
_REAL_SAMPLE = [n for n in ALL_NAMES if len(n) < 400]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(
    st.text(max_size=300),
    st.text(alphabet=string.ascii_letters + string.digits + "_:<>(), *&~.#{}[]-", max_size=300),
    st.tuples(st.sampled_from(_REAL_SAMPLE), st.integers(0, 400), st.text(max_size=20)).map(
        lambda t: t[0][:t[1]] + t[2]),
    st.sampled_from(["_Z", "_ZN7cutlass13device_kernelI", "void cutlass::device_kernel<", "triton_", "cudnn_",
                     "bmm_", "fmhaSm100", "ncclDevKernel_", "flash::", "kernel_cutlass_kernel_"]).flatmap(
        lambda p: st.text(max_size=120).map(lambda t: p + t)),
))
def test_any_text_decodes_without_raising_and_keeps_the_raw_text(text):
    kn = decode(text)
    assert isinstance(kn, KernelName)
    assert kn.name == text                                    # the raw input is always kept
    assert kn.family in FAMILIES and kn.kind in KINDS and kn.provenance in PROVENANCES
    assert json.loads(json.dumps(kn.to_dict()))["name"] == text
    if kn.family == "unknown":
        assert (kn.kind, kn.provenance) == (C.OTHER, C.UNKNOWN)
        if text.strip():
            assert kn.base and kn.unparsed[:len(kn.tokens)] == kn.tokens   # what was not understood stays visible
    else:
        assert kn.provenance != C.UNKNOWN


@pytest.mark.parametrize("name", _REAL_SAMPLE[::7])
def test_real_names_are_not_unknown_and_keep_their_text(name):
    """The counterpart of the property above: a decoder that calls everything unknown fails here."""
    kn = decode(name)
    assert kn.name == name
    assert kn.family != "unknown" or name in KNOWN_UNKNOWN


# Real names no family claims (listed so that a new one shows up in review): kernels their authors named
# by hand (a user Triton kernel, a custom fused kernel), whose names carry no library's mark.
KNOWN_UNKNOWN = {"_indexed_scale_shift_kernel", "fused_add_reciprocal_mul_sin_pow_mul_add"}


def test_the_unknown_real_names_are_the_listed_ones():
    assert {n for n in ALL_NAMES if decode(n).family == "unknown"} == KNOWN_UNKNOWN
