"""Kernels built from CUTLASS and shipped precompiled in cuBLAS, and the older hand-named (legacy) kernels.

CUTLASS 2.x (names as NVIDIA's cutlass_library generator writes them, with cuBLAS's ``<cc>`` prefix)::

    cutlass_<cc>_<opclass>[_<C type>]_<acc><inst>gemm[_<epilogue>][_<A type>]_<M>x<N>[_<Ktile>x<stages>]
        _<ab layout>[_align<n>]
    cutlass_80_tensorop_s1688gemm_64x128_32x3_tn_align4
    cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_256x128_32x3_nn_align8

CUTLASS 3.x::

    cutlass3x_<arch>_<opclass>_[<acc><MxNxK>]gemm_<A>_<B>_<acc>_<C|void>_<D>_<M>x<N>x<K>_<Cm>x<Cn>x<Ck>
        _<stages>_<abc layout>_align<n>[_<schedule>...][_<epilogue>...]
    cutlass3x_sm90_tensorop_s64x128x16gemm_bf16_bf16_f32_void_bf16_128x128x64_1x1x1_0_tnn_align8_warpspecialized_pingpong_epi_tma

Legacy (ampere_, volta_, turing_ ...)::

    <generation>[_<C type>]_<acc>[<inst>]gemm[_<A type>]_<M>x<N>[_sliced<a>x<b>][_ldg<n>][_relu][_f2f]
        [_stages_<Ktile>x<stages>]_<ab layout>[_v1]
    ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_64x3_nn

Types follow CUTLASS's rule: the accumulator letter of the core name always; the C type before the core
only when it differs from the accumulator; the A (= B) type after it only when it differs.
"""
from __future__ import annotations

from cublaslt_probe.names import tokens as T
from cublaslt_probe.names.grammar import Grammar, flag_set, literal, pair, regex, register, table, triple
from cublaslt_probe.names.tokens import Meaning

_ACC_FOR = {t.value: k for k, t in T.CUTLASS_ACC_LETTERS.items()}
_INST_RX = "|".join(sorted(T.CUTLASS_INSTRUCTION_SHAPES, key=len, reverse=True))
_ACC_RX = "".join(T.CUTLASS_ACC_LETTERS)


def _rev(mapping):
    out = {}
    for k, t in mapping.items():
        out.setdefault(t.value, k)
    return out


def _dtype_slot(key, template, mapping, scratch, meaning, render):
    """An optional dtype token kept in a scratch field (`finish` turns scratch into typed fields)."""
    rx = "|".join(sorted(mapping, key=len, reverse=True))
    return regex(key, template, rf"(?:{rx})", lambda m: {scratch: mapping[m.group(0)].value}, render,
                 (Meaning(template, scratch.strip("_") + "_type", meaning, T.INFERRED),))


def _core(m):
    out = {"compute_type": T.CUTLASS_ACC_LETTERS[m.group(1)].value, "op": m.group(3)}
    if m.group(2):
        out["instruction_shape"] = T.CUTLASS_INSTRUCTION_SHAPES[m.group(2)]
    return out


def _render_core(kn):
    acc = _ACC_FOR.get(kn.compute_type)
    if acc is None or kn.op is None:
        return None
    inst = "".join(str(x) for x in kn.instruction_shape) if kn.instruction_shape else ""
    return f"{acc}{inst}{kn.op}"


def _types_from_scratch(f):
    acc = f.get("compute_type")
    a = f.pop("_a", None) or acc
    c = f.pop("_c", None) or acc
    f["a_type"] = f["b_type"] = a
    f["c_type"] = f["d_type"] = c


def _trans(f):
    lay = f.get("layout")
    if lay:
        f["trans_a"] = lay[0] == "t"
        f["trans_b"] = lay[1] == "t"


def _c_prefix(rev):
    def render(kn):
        if kn.c_type is not None and kn.c_type != kn.compute_type:
            return rev.get(kn.c_type)
        return None
    return render


def _a_suffix(rev):
    def render(kn):
        if kn.a_type is not None and kn.a_type != kn.compute_type:
            return rev.get(kn.a_type)
        return None
    return render


_CUT_REV = _rev(T.CUTLASS_DTYPES)
_core_rows = (
    Meaning("<acc><inst><op>", "compute_type, instruction_shape, op",
            "accumulator letter (s fp32, h fp16, d fp64, i int32, c/z complex), MMA instruction shape "
            "digits (1688 = 16x8x8, 16816 = 16x8x16, 884, 8816, 16832, 161616), operation (gemm)",
            T.INFERRED, "NVIDIA cutlass_library generator naming"),
) + tuple(Meaning(k, "compute_type", t.meaning, t.evidence) for k, t in T.CUTLASS_ACC_LETTERS.items())


def _finish2(f, flags):
    _types_from_scratch(f)
    _trans(f)
    if f.get("align_a") is not None:
        f["align_b"] = f["align_a"]


CUTLASS = register(Grammar(
    name="cutlass", family="cutlass",
    summary="CUTLASS 2.x kernels compiled into cuBLAS (run through cutlass::Kernel / Kernel2)",
    template="cutlass_<cc>_<opclass>[_<C type>]_<acc><inst>gemm[_<epilogue>][_<A type>]_<M>x<N>"
             "[_<Ktile>x<stages>]_<ab layout>[_align<n>]",
    examples=("cutlass_80_tensorop_s1688gemm_64x128_32x3_tn_align4",
              "cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_256x128_32x3_nn_align8",
              "cutlass_80_simt_sgemm_64x64_8x5_tn_align1",
              "cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16_128x2_tn_align8",
              "cutlass_75_tensorop_s1688gemm_bf16_64x64_tn_align1"),
    phrases=(("wmma", "tensorop"),),
    slots=(
        literal("prefix", "cutlass", "family prefix", evidence=T.MEASURED, source=T.CAPTURE_RUN),
        regex("arch", "<cc>", r"(\d+)", lambda m: {"arch": "sm" + m.group(1)},
              lambda kn: kn.arch[2:] if kn.arch and kn.arch.startswith("sm") else None,
              (Meaning("<cc>", "arch", "compute capability the kernel was built for (80 -> sm80; cutlass_75 "
                       "and cutlass_80 kernels both run on the H200)", T.MEASURED, T.CAPTURE_RUN),),
              required=True),
        table("opclass", "<opclass>", T.CUTLASS_OPCLASSES, "variant", required=True),
        _dtype_slot("ctype", "<C type>", T.CUTLASS_DTYPES, "_c",
                    "C/D element type, written only when it differs from the accumulator", _c_prefix(_CUT_REV)),
        regex("core", "<acc><inst>gemm", rf"([{_ACC_RX}])({_INST_RX})?(gemm|andgemm|xorgemm)", _core,
              _render_core, _core_rows, required=True),
        table("epilogue", "<epilogue>", T.CUTLASS_EPILOGUES, "epilogue"),
        _dtype_slot("atype", "<A type>", T.CUTLASS_DTYPES, "_a",
                    "A/B element type, written only when it differs from the accumulator", _a_suffix(_CUT_REV)),
        regex("tile", "<M>x<N>", r"(\d+)x(\d+)",
              lambda m: {"tile_m": int(m.group(1)), "tile_n": int(m.group(2))}, pair("tile_m", "tile_n"),
              (Meaning("<M>x<N>", "tile_m, tile_n", "threadblock tile: the algo's TILE_ID (MATMUL_TILE_<M>x<N>)",
                       T.MEASURED, T.CAPTURE + " (187/187)"),), required=True),
        regex("ktile", "<Ktile>x<stages>", r"(\d+)x(\d+)",
              lambda m: {"tile_k": int(m.group(1)), "stages": int(m.group(2))}, pair("tile_k", "stages"),
              (Meaning("<Ktile>x<stages>", "tile_k, stages",
                       "the algo's STAGES_ID (MATMUL_STAGES_<K>x<S>); absent in cutlass_75 names, whose "
                       "STAGES_ID is UNDEFINED", T.MEASURED, T.CAPTURE + " (187/187)"),)),
        regex("layout", "<ab layout>", r"[nt]{2}", lambda m: {"layout": m.group(0)}, lambda kn: kn.layout,
              (Meaning("<ab layout>", "layout, trans_a, trans_b",
                       "t/n: transa then transb of the cuBLAS (column-major) problem", T.MEASURED,
                       T.CAPTURE + " (187/187) and " + T.CAPTURE_RUN),), required=True),
        regex("align", "align<n>", r"align(\d+)", lambda m: {"align_a": int(m.group(1))},
              lambda kn: None if kn.align_a is None else f"align{kn.align_a}",
              (Meaning("align<n>", "align_a, align_b", "alignment of A and B in elements", T.INFERRED),)),
    ),
    finish=_finish2,
    notes=("c_type is the kernel's output: s..gemm kernels without a C type write fp32 even in fp16/bf16 "
           "GEMMs, and a splitKreduce converts (measured in the captures).",
           "The name says nothing about split-K: cuBLASLt runs these kernels with SPLITK_NUM 1..42 "
           "(split_k stays None).",
           "tensorop s1688gemm on fp32 data is what tf32 GEMMs ran; fp32 GEMMs ran simt sgemm (measured)."),
))


# ------------------------------------------------------------------------------------- cutlass3x
def _core3(m):
    out = {"op": "gemm"}
    if m.group(1):
        out["_acc_letter"] = m.group(1)
    if m.group(2):
        out["instruction_shape"] = tuple(int(x) for x in m.group(2, 3, 4))
    return out


def _render_core3(kn):
    acc = _ACC_FOR.get(kn.compute_type, "")
    if kn.instruction_shape:
        return acc + "x".join(str(x) for x in kn.instruction_shape) + "gemm"
    if kn.variant == "simt":
        return acc + "gemm"
    return "gemm"


def _dt3(key, template, fld, meaning, required=True):
    rx = "|".join(sorted(T.CUTLASS_DTYPES, key=len, reverse=True))

    def render(kn):
        v = getattr(kn, fld)
        if v is None:
            return "void" if fld == "c_type" else None
        return _CUT_REV.get(v)

    return regex(key, template, rf"(?:{rx})", lambda m: {fld: T.CUTLASS_DTYPES[m.group(0)].value}, render,
                 (Meaning(template, fld, meaning, T.INFERRED),), required=required)


def _finish3(f, flags):
    f.pop("_acc_letter", None)
    _trans(f)
    lay = f.get("layout")
    if lay and len(lay) == 3:
        f["layout_c"] = lay[2]
    if f.get("align_a") is not None:
        f["align_b"] = f["align_a"]
    sched = [x for x in flags if x in T.CUTLASS3X_SCHEDULES]
    epi = [x for x in flags if x in T.CUTLASS3X_EPILOGUES]
    if sched:
        f["schedule"] = "_".join(sched)
    if epi:
        f["epilogue"] = "_".join(epi)


CUTLASS3X = register(Grammar(
    name="cutlass3x", family="cutlass3x",
    summary="CUTLASS 3.x kernels (Hopper/Blackwell collective builders) compiled into cuBLAS",
    template="cutlass3x_<arch>_<opclass>_[<acc><MxNxK>]gemm_<A>_<B>_<acc>_<C|void>_<D>_<M>x<N>x<K>"
             "_<Cm>x<Cn>x<Ck>_<stages>_<abc layout>_align<n>[_<schedule>...][_<epilogue>...]",
    examples=("cutlass3x_sm90_tensorop_s64x128x16gemm_bf16_bf16_f32_void_bf16_128x128x64_1x1x1_0_tnn_align8"
              "_warpspecialized_pingpong_epi_tma",
              "cutlass3x_sm100_simt_sgemm_f32_f32_f32_f32_f32_128x128x16_1x1x1_3_tnn_align1_bias_f32_relu"),
    phrases=(("wmma", "tensorop"), ("warpspecialized", "cooperative"), ("warpspecialized", "pingpong"),
             ("stream", "k"), ("epi", "tma"), ("epi", "nosmem"), ("bias", "f32"), ("bias", "bf16"),
             ("bias", "f16")),
    slots=(
        literal("prefix", "cutlass3x", "family prefix"),
        regex("arch", "sm<NN>", r"sm(\d+[a-z]?)", lambda m: {"arch": m.group(0)}, lambda kn: kn.arch,
              (Meaning("sm<NN>", "arch", "SM architecture", T.INFERRED),), required=True),
        table("opclass", "<opclass>", T.CUTLASS_OPCLASSES, "variant", required=True),
        regex("core", "[<acc><MxNxK>]gemm", rf"(?:([{_ACC_RX}])(?:(\d+)x(\d+)x(\d+))?)?gemm", _core3,
              _render_core3,
              (Meaning("[<acc><MxNxK>]gemm", "instruction_shape",
                       "optional accumulator letter and MMA instruction shape (s64x128x16gemm); sgemm for "
                       "SIMT", T.INFERRED),), required=True),
        _dt3("a", "<A>", "a_type", "A element type"),
        _dt3("b", "<B>", "b_type", "B element type"),
        _dt3("acc", "<acc>", "compute_type", "accumulator type"),
        _dt3("c", "<C|void>", "c_type", "C element type (void: no C operand)"),
        _dt3("d", "<D>", "d_type", "D element type"),
        regex("tile", "<M>x<N>x<K>", r"(\d+)x(\d+)x(\d+)",
              lambda m: {"tile_m": int(m.group(1)), "tile_n": int(m.group(2)), "tile_k": int(m.group(3))},
              triple("tile_m", "tile_n", "tile_k"),
              (Meaning("<M>x<N>x<K>", "tile_m, tile_n, tile_k", "CTA tile", T.INFERRED),), required=True),
        regex("cluster", "<Cm>x<Cn>x<Ck>", r"(\d+)x(\d+)x(\d+)",
              lambda m: {"cluster_m": int(m.group(1)), "cluster_n": int(m.group(2)),
                         "cluster_k": int(m.group(3))},
              triple("cluster_m", "cluster_n", "cluster_k"),
              (Meaning("<Cm>x<Cn>x<Ck>", "cluster_m, cluster_n, cluster_k", "cluster shape", T.INFERRED),),
              required=True),
        regex("stages", "<stages>", r"(\d+)", lambda m: {"stages": int(m.group(1))},
              lambda kn: None if kn.stages is None else str(kn.stages),
              (Meaning("<stages>", "stages", "pipeline stages, 0 = chosen automatically", T.INFERRED),),
              required=True),
        regex("layout", "<abc layout>", r"[nt]{3}", lambda m: {"layout": m.group(0)}, lambda kn: kn.layout,
              (Meaning("<abc layout>", "layout, trans_a, trans_b, layout_c",
                       "n: column-major, t: row-major; A, B, C", T.INFERRED),), required=True),
        regex("align", "align<n>", r"align(\d+)", lambda m: {"align_a": int(m.group(1))},
              lambda kn: None if kn.align_a is None else f"align{kn.align_a}",
              (Meaning("align<n>", "align_a, align_b", "alignment of A and B in elements", T.INFERRED),),
              required=True),
        flag_set("schedule", "[_<schedule>...]", T.CUTLASS3X_SCHEDULES),
        flag_set("epilogue", "[_<epilogue>...]", T.CUTLASS3X_EPILOGUES),
    ),
    finish=_finish3,
))


# ---------------------------------------------------------------------------------------- legacy
_LEG_REV = _rev(T.LEGACY_DTYPES)
_LEG_ACC = "shdciz"


def _finish_legacy(f, flags):
    _types_from_scratch(f)
    _trans(f)
    f.setdefault("op", "gemm")
    epi = [x for x in flags if x in T.CUTLASS_EPILOGUES]
    if epi:
        f["epilogue"] = "_".join(epi)


LEGACY = register(Grammar(
    name="legacy", family="legacy",
    summary="cuBLAS's older hand-named GEMM kernels (ampere_, volta_, turing_ ...)",
    template="<generation>[_<C type>]_<acc>[<inst>]gemm[_<A type>]_<M>x<N>[_sliced<a>x<b>][_ldg<n>][_relu]"
             "[_f2f][_stages_<Ktile>x<stages>]_<ab layout>[_v1]",
    examples=("ampere_sgemm_128x64_tn",
              "ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_64x3_nn",
              "ampere_sgemm_32x32_sliced1x4_nn",
              "volta_fp16_s884gemm_fp16_256x128_ldg8_f2f_nn",
              "turing_fp16_s1688gemm_fp16_128x64_sliced1x2_ldg8_f2f_tn"),
    slots=(
        table("arch", "<generation>", T.LEGACY_ARCHS, "arch", required=True),
        _dtype_slot("ctype", "<C type>", T.LEGACY_DTYPES, "_c",
                    "C/D element type, written only when it differs from the accumulator", _c_prefix(_LEG_REV)),
        regex("core", "<acc>[<inst>]gemm", rf"([{_LEG_ACC}])({_INST_RX})?(gemm)",
              _core, _render_core,
              _core_rows[:1], required=True),
        _dtype_slot("atype", "<A type>", T.LEGACY_DTYPES, "_a",
                    "A/B element type, written only when it differs from the accumulator", _a_suffix(_LEG_REV)),
        regex("tile", "<M>x<N>", r"(\d+)x(\d+)",
              lambda m: {"tile_m": int(m.group(1)), "tile_n": int(m.group(2))}, pair("tile_m", "tile_n"),
              (Meaning("<M>x<N>", "tile_m, tile_n", "threadblock tile", T.INFERRED),), required=True),
        flag_set("flags", "[_sliced<a>x<b>][_ldg<n>][_relu][_f2f]", T.LEGACY_FLAGS, patterns=(
            (r"sliced\d+x\d+", Meaning("sliced<a>x<b>", "flags", "K sliced across warps inside a CTA (a x b)",
                                       T.INFERRED)),)),
        literal("stages_word", "stages", "introduces <Ktile>x<stages>", required=False,
                when=lambda kn: kn.tile_k is not None),
        regex("ktile", "<Ktile>x<stages>", r"(\d+)x(\d+)",
              lambda m: {"tile_k": int(m.group(1)), "stages": int(m.group(2))}, pair("tile_k", "stages"),
              (Meaning("<Ktile>x<stages>", "tile_k, stages", "K tile x pipeline stages", T.INFERRED),)),
        regex("layout", "<ab layout>", r"[nt]{2}", lambda m: {"layout": m.group(0)}, lambda kn: kn.layout,
              (Meaning("<ab layout>", "layout, trans_a, trans_b", "n: not transposed, t: transposed; A, B",
                       T.INFERRED),), required=True),
        flag_set("tail", "[_v1]", T.LEGACY_TAIL),
    ),
    finish=_finish_legacy,
    owns=lambda kn: kn.tile_m is not None,
))
