"""xmma: cuBLAS's precompiled tensor-core kernels (sm80, sm86, sm89, sm90 ...)::

    sm<NN>_xmma_<gemm|sparse_gemm>_<A=B><C>_<math><acc>_<scale>_<ab layout>_<c layout>_tilesize<M>x<N>x<K>
        [_cgasize<Cm>x<Cn>x<Ck>][_stage<S>][_gmmastage<G>][_warpsize<..>|_warpgroupsize<..>][_<instr>]
        [_aligna<n>][_alignc<n>][_execute[_segment_k_<on|off>][_split_k]][_kernel[__5x_cublas|_trt]]

    sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x256x32_warpgroupsize2x1x1_execute_segment_k_off_kernel__5x_cublas
    sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize32x32x8_stage3_warpsize2x2x1_ffma_aligna4_alignc4_execute_kernel__5x_cublas
"""
from __future__ import annotations

from cublaslt_probe.names import tokens as T
from cublaslt_probe.names.grammar import Grammar, flag_set, literal, regex, register, shape, table, triple
from cublaslt_probe.names.tokens import Meaning, Tok

_DT = "|".join(sorted(T.XMMA_DTYPES, key=len, reverse=True))
_TOKEN_FOR = {}
for _k, _t in T.XMMA_DTYPES.items():
    _TOKEN_FOR.setdefault(_t.value, _k)


def _dt(tok):
    return T.XMMA_DTYPES[tok].value


def _tk(v):
    return _TOKEN_FOR.get(v)


def _g1(m):
    return {"a_type": _dt(m.group(1)), "b_type": _dt(m.group(1)), "c_type": _dt(m.group(2)),
            "d_type": _dt(m.group(2)), "_t1": m.group(0)}


def _r1(kn):
    a, c = _tk(kn.a_type), _tk(kn.c_type)
    return None if a is None or c is None else a + c


def _g2(m):
    return {"math_type": _dt(m.group(1)), "compute_type": _dt(m.group(2)), "_t2": m.group(0)}


def _r2(kn):
    a, c = _tk(kn.math_type), _tk(kn.compute_type)
    return None if a is None or c is None else a + c


def _finish(f, flags):
    lay = f.get("layout")
    if lay:
        f["trans_a"] = lay[0] == "t"
        f["trans_b"] = lay[1] == "t"
    parts = [f.get(k) for k in ("_t1", "_t2", "_t3")]
    if all(parts):
        f["type_code"] = "_".join(parts)


def _instr(m):
    if m.group(1):
        return {"instruction": m.group(1), "instruction_shape": tuple(int(x) for x in m.group(2, 3, 4))}
    return {"instruction": m.group(5)}


def _render_instr(kn):
    if kn.instruction is None:
        return None
    if kn.instruction_shape:
        return kn.instruction + "x".join(str(x) for x in kn.instruction_shape)
    return kn.instruction


_SHAPED = "|".join(k for k in T.XMMA_INSTRUCTIONS if k not in ("ffma", "dfma"))
_SUFFIXES = {"kernel": Tok(None, "end of the kernel body")}
_SUFFIXES.update({("kernel_" + k if k != "_5x_cublas" else "kernel__5x_cublas"):
                  Tok(t.value, t.meaning, t.evidence) for k, t in T.XMMA_SUFFIXES.items()})


def _suffix(m):
    return {"suffix": m.group(0)}


_dtype_rows = tuple(Meaning(k, "dtype", f"{t.value}: {t.meaning}", t.evidence, t.source)
                    for k, t in T.XMMA_DTYPES.items())

XMMA = register(Grammar(
    name="xmma", family="xmma",
    summary="cuBLAS's precompiled xmma tensor-core / SIMT kernels",
    template="sm<NN>_xmma_<gemm|sparse_gemm>_<A=B><C>_<math><acc>_<scale>_<ab layout>_<c layout>"
             "_tilesize<M>x<N>x<K>[_cgasize<..>][_stage<S>][_gmmastage<G>][_warpsize<..>|_warpgroupsize<..>]"
             "[_<instr>][_aligna<n>][_alignc<n>][_execute[_segment_k_<on|off>][_split_k]][_kernel[<tag>]]",
    examples=(
        "sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x256x32_warpgroupsize2x1x1_execute_segment_k_off"
        "_kernel__5x_cublas",
        "sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize32x32x8_stage3_warpsize2x2x1_ffma_aligna4_alignc4"
        "_execute_kernel__5x_cublas",
    ),
    phrases=(("segment", "k", "on"), ("segment", "k", "off"), ("split", "k"), ("sparse", "gemm"),
             ("kernel", "", "5x", "cublas"), ("kernel", "trt")),
    slots=(
        regex("arch", "sm<NN>", r"sm(\d+[a-z]?)", lambda m: {"arch": m.group(0)}, lambda kn: kn.arch,
              (Meaning("sm<NN>", "arch", "SM architecture the kernel was built for (sm80 kernels run on the "
                       "H200 too)", T.MEASURED, T.CAPTURE_RUN),), required=True),
        literal("xmma", "xmma", "family word", evidence=T.MEASURED, source=T.CAPTURE_RUN),
        table("op", "<gemm|sparse_gemm>", T.XMMA_OPS, "op", required=True),
        regex("types1", "<A=B><C>", rf"({_DT})({_DT})", _g1, _r1,
              (Meaning("<A=B><C>", "a_type, b_type, c_type, d_type",
                       "storage type of A and B, then of C and D (f32f32, bf16bf16, i8i32)", T.INFERRED,
                       "i8i32_i8i32_f32 / f16f16_f16f16_f16 names in public kernel lists"),) + _dtype_rows,
              required=True),
        regex("types2", "<math><acc>", rf"({_DT})({_DT})", _g2, _r2,
              (Meaning("<math><acc>", "math_type, compute_type",
                       "MMA input type, then accumulator type (tf32f32: fp32 data multiplied as tf32)",
                       T.INFERRED),), required=True),
        regex("types3", "<scale>", rf"({_DT})", lambda m: {"scale_type": _dt(m.group(1)), "_t3": m.group(0)},
              lambda kn: _tk(kn.scale_type),
              (Meaning("<scale>", "scale_type", "alpha/beta (epilogue) type", T.INFERRED),), required=True),
        regex("layout", "<ab layout>", r"[nt]{2}", lambda m: {"layout": m.group(0)}, lambda kn: kn.layout,
              (Meaning("<ab layout>", "layout, trans_a, trans_b",
                       "t/n: transa then transb of the cuBLAS (column-major) problem", T.MEASURED,
                       T.CAPTURE + " (304/304) and " + T.CAPTURE_RUN + " (46/46)"),), required=True),
        regex("layout_c", "<c layout>", r"[nt]", lambda m: {"layout_c": m.group(0)}, lambda kn: kn.layout_c,
              (Meaning("<c layout>", "layout_c", "layout of C/D", T.INFERRED),), required=True),
        regex("tile", "tilesize<M>x<N>x<K>", r"tilesize(\d+)x(\d+)x(\d+)",
              lambda m: {"tile_m": int(m.group(1)), "tile_n": int(m.group(2)), "tile_k": int(m.group(3))},
              triple("tile_m", "tile_n", "tile_k", "tilesize"),
              (Meaning("tilesize<M>x<N>x<K>", "tile_m, tile_n, tile_k",
                       "CTA tile written in the kernel's own frame: the algo's TILE_ID is MATMUL_TILE_<N>x<M> "
                       "(M and N exchanged); K is the K of its STAGES_ID", T.MEASURED, T.CAPTURE + " (341/341)"),),
              required=True),
        regex("cga", "cgasize<Cm>x<Cn>x<Ck>", r"cgasize(\d+)x(\d+)x(\d+)",
              lambda m: {"cluster_m": int(m.group(1)), "cluster_n": int(m.group(2)),
                         "cluster_k": int(m.group(3))},
              triple("cluster_m", "cluster_n", "cluster_k", "cgasize"),
              (Meaning("cgasize<Cm>x<Cn>x<Ck>", "cluster_m, cluster_n, cluster_k",
                       "cooperative grid array (thread-block cluster) shape", T.INFERRED),)),
        regex("stage", "stage<S>", r"stage(\d+)", lambda m: {"stages": int(m.group(1))},
              lambda kn: None if kn.stages is None else f"stage{kn.stages}",
              (Meaning("stage<S>", "stages", "pipeline stages: the count of the algo's STAGES_ID "
                       "(MATMUL_STAGES_8x3 -> stage3); absent when STAGES_ID is ..xAUTO", T.MEASURED,
                       T.CAPTURE + " (341/341)"),)),
        flag_set("gmmastage", "gmmastage<G>", {}, patterns=(
            (r"gmmastage\d+", Meaning("gmmastage<G>", "flags", "wgmma pipeline depth", T.INFERRED)),)),
        regex("warps", "warpsize<..>", r"warpsize(\d+)x(\d+)x(\d+)",
              lambda m: {"warp_shape": tuple(int(x) for x in m.groups())}, shape("warp_shape", "warpsize"),
              (Meaning("warpsize<Wm>x<Wn>x<Wk>", "warp_shape", "warps per CTA along M, N, K", T.INFERRED),)),
        regex("warpgroups", "warpgroupsize<..>", r"warpgroupsize(\d+)x(\d+)x(\d+)",
              lambda m: {"warpgroup_shape": tuple(int(x) for x in m.groups())},
              shape("warpgroup_shape", "warpgroupsize"),
              (Meaning("warpgroupsize<Gm>x<Gn>x<Gk>", "warpgroup_shape",
                       "consumer warpgroups per CTA along M, N, K (Hopper)", T.INFERRED),)),
        flag_set("sparse", "[_sptensor]", {"sptensor": T.XMMA_INSTRUCTIONS["sptensor"]}),
        regex("instr", "<instr>", rf"(?:({_SHAPED})(\d+)x(\d+)x(\d+)|(ffma|dfma))", _instr, _render_instr,
              tuple(Meaning(k + ("" if k in ("ffma", "dfma") else "<M>x<N>x<K>"),
                            "instruction, instruction_shape", t.meaning, t.evidence)
                    for k, t in T.XMMA_INSTRUCTIONS.items())),
        regex("aligna", "aligna<n>", r"aligna(\d+)", lambda m: {"align_a": int(m.group(1))},
              lambda kn: None if kn.align_a is None else f"aligna{kn.align_a}",
              (Meaning("aligna<n>", "align_a", "alignment of A (and B) in elements", T.INFERRED),)),
        regex("alignb", "alignb<n>", r"alignb(\d+)", lambda m: {"align_b": int(m.group(1))},
              lambda kn: None if kn.align_b is None else f"alignb{kn.align_b}",
              (Meaning("alignb<n>", "align_b", "alignment of B in elements", T.INFERRED),)),
        regex("alignc", "alignc<n>", r"alignc(\d+)", lambda m: {"align_c": int(m.group(1))},
              lambda kn: None if kn.align_c is None else f"alignc{kn.align_c}",
              (Meaning("alignc<n>", "align_c", "alignment of C/D in elements", T.INFERRED),)),
        literal("execute", "execute", "start of the execution-mode words (schedule = execute)",
                required=False, when=lambda kn: kn.schedule == "execute", sets={"schedule": "execute"}),
        table("segment_k", "segment_k_<on|off>",
              {"segment_k_on": Tok(True, "segment-K variant (seen with SPLITK_NUM -1 only)"),
               "segment_k_off": Tok(False, "no segment-K (seen with SPLITK_NUM -1 and 1)")}, "segment_k"),
        literal("split_k", "split_k", "split-K variant of the kernel (never captured); without it the name says "
                "nothing about split-K: captured xmma kernels ran with SPLITK_NUM 2..16 under names without it",
                required=False, when=lambda kn: kn.split_k is True, sets={"split_k": True}),
        regex("suffix", "kernel[<tag>]", "|".join(sorted(_SUFFIXES, key=len, reverse=True)), _suffix,
              lambda kn: kn.suffix,
              tuple(Meaning(k, "suffix", t.meaning, t.evidence) for k, t in _SUFFIXES.items())),
    ),
    finish=_finish,
    notes=("tile_m x tile_n is the kernel's frame: cuBLASLt's MATMUL_TILE is tile_n x tile_m (measured).",
           "split_k is True only when split_k is written, None otherwise: cuBLASLt runs these kernels with "
           "SPLITK_NUM > 1 (plus a splitKreduce) under the same name (measured).",
           "Cluster: sm90 xmma names without cgasize still run with CLUSTER_SHAPE 1x2x1, 2x1x1, ... "
           "(the name does not say it)."),
))
