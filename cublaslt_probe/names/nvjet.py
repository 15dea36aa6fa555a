"""nvjet: the kernels cuBLASLt assembles at run time (Hopper, Blackwell).

Hopper / datacenter Blackwell::

    nvjet[_<arch>]_<types>_<M>x<N>_<Ktile>x<stages>_<Cm>x<Cn>[_2cta]_<h|v>_<bz|badd>[_<flag>...]_<L1><L2><L3>
    nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT

Consumer Blackwell (sm120)::

    nvjet_<arch>_<types>_mma_<M>x<N>x<K>_<stages>_<Wm>x<Wn>x<Wk>[_tmaAB][_alignCD<n>]_<beta>[_<flag>...]_<L1..L4>
    nvjet_sm120_tst_mma_64x64x128_3_32x32x128_tmaAB_alignCD4_bz_TNNN
"""
from __future__ import annotations

from cublaslt_probe.names import tokens as T
from cublaslt_probe.names.grammar import Grammar, flag_set, literal, pair, regex, register, shape, table
from cublaslt_probe.names.tokens import Meaning, Tok

_LETTER_FOR = {}
for _k, _t in T.NVJET_TYPE_LETTERS.items():
    _LETTER_FOR.setdefault(_t.value, _k)


def _types(m):
    code = m.group(0)
    if len(code) == 3:
        a = b = code[0]
        comp = code[1]
        c = d = code[2]
    else:
        a, b, c, comp, d = code
    L = T.NVJET_TYPE_LETTERS

    def v(x):
        t = L.get(x)
        return None if t is None else t.value

    out = {"type_code": code, "a_type": v(a), "b_type": v(b), "c_type": v(c), "d_type": v(d),
           "compute_type": v(comp)}
    if any(x not in L for x in code):
        out["+unparsed"] = code   # the shape fits, a letter is unknown: keep it visible
    return out


def _render_types(kn):
    if kn.type_code:
        return kn.type_code
    vals = (kn.a_type, kn.b_type, kn.c_type, kn.compute_type, kn.d_type)
    if any(x is None or x not in _LETTER_FOR for x in vals):
        return None
    a, b, c, comp, d = (_LETTER_FOR[x] for x in vals)
    return f"{a}{comp}{c}" if a == b and c == d else f"{a}{b}{c}{comp}{d}"


def _type_meanings():
    rows = [Meaning("<types>", "type_code, a_type, b_type, c_type, d_type, compute_type",
                    "3 letters <A=B><compute><C=D> (tst) or 5 letters <A><B><C><compute><D> (qqtst), A and B "
                    "being the cuBLAS operands; a code with an unknown letter is kept whole in unparsed",
                    T.MEASURED, T.CAPTURE_RUN + " (qrtst / rqtst for e4m3 x e5m2 in both operand orders)")]
    for k, t in T.NVJET_TYPE_LETTERS.items():
        rows.append(Meaning(k, "dtype letter", f"{t.value}: {t.meaning}", t.evidence, t.source))
    return tuple(rows)


def _layout(m):
    return {"layout": m.group(0)}


def _finish(f, flags):
    f["split_k"] = "splitK" in flags
    lay = f.get("layout")
    if lay:
        f["trans_a"] = lay[0] == "T"
        f["trans_b"] = lay[1] == "T"
        if len(lay) == 3:
            f["swap_ab"] = lay[2] == "T"
    f["op"] = "gemm"


_N = T.NVJET_NUMBERS


def _with_extra(slot, *rows):
    from dataclasses import replace
    return replace(slot, meanings=slot.meanings + rows)

_VEC = r"[AB]vec\d+(?:" + "|".join(T.NVJET_VEC_SCALE_TYPES) + ")"

_arch = regex("arch", "sm<NN>", r"sm(\d+[a-z]?)", lambda m: {"arch": m.group(0)}, lambda kn: kn.arch,
              (Meaning("sm<NN>", "arch", T.NVJET_ARCH.meaning, T.NVJET_ARCH.evidence, T.NVJET_ARCH.source),))

NVJET = register(Grammar(
    name="nvjet", family="nvjet",
    summary="cuBLASLt's precompiled GEMM kernels, picked by its heuristic (library-selected; Hopper, "
            "datacenter Blackwell)",
    template="nvjet[_<arch>]_<types>_<M>x<N>_<Ktile>x<stages>_<Cm>x<Cn>[_2cta]_<h|v>_<bz|badd>"
             "[_<flag>...]_<L1><L2><L3>",
    examples=("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT",
              "nvjet_sm90_hsh_128x8_64x12_4x1_v_bz_splitK_NNT",
              "nvjet_sm90_qqtst_128x128_128x6_2x1_v_bz_coopA_algo2_TNT",
              "nvjet_sm100_tst_256x128_64x5_2x2_2cta_h_bz_TNT",
              "nvjet_tst_128x256_64x4_1x2_h_bz_coopA_TNT"),
    slots=(
        literal("prefix", "nvjet", "family prefix", evidence=T.MEASURED, source=T.CAPTURE_RUN),
        _arch,
        regex("types", "<types>", r"[a-z]{3}(?:[a-z]{2})?", _types, _render_types, _type_meanings(),
              required=True),
        regex("tile", "<M>x<N>", r"(\d+)x(\d+)",
              lambda m: {"tile_m": int(m.group(1)), "tile_n": int(m.group(2))}, pair("tile_m", "tile_n"),
              (Meaning("<M>x<N>", "tile_m, tile_n", _N["tile"].meaning, _N["tile"].evidence,
                       _N["tile"].source),), required=True),
        regex("ktile", "<Ktile>x<stages>", r"(\d+)x(\d+)",
              lambda m: {"tile_k": int(m.group(1)), "stages": int(m.group(2))}, pair("tile_k", "stages"),
              (Meaning("<Ktile>", "tile_k", _N["ktile"].meaning, _N["ktile"].evidence, _N["ktile"].source),
               Meaning("<stages>", "stages", _N["stages"].meaning, _N["stages"].evidence, _N["stages"].source)),
              required=True),
        regex("cluster", "<Cm>x<Cn>", r"(\d+)x(\d+)",
              lambda m: {"cluster_m": int(m.group(1)), "cluster_n": int(m.group(2))},
              pair("cluster_m", "cluster_n"),
              (Meaning("<Cm>x<Cn>", "cluster_m, cluster_n", _N["cluster"].meaning, _N["cluster"].evidence,
                       _N["cluster"].source),), required=True),
        flag_set("preflags", "[_2cta]", T.NVJET_PRE_FLAGS),
        table("raster", "<h|v>", T.NVJET_RASTER, "raster", required=True),
        table("beta", "<bz|badd>", T.NVJET_BETA, "beta", required=True),
        _with_extra(flag_set("flags", "[_<flag>...]", T.NVJET_FLAGS, patterns=(
            (_VEC, Meaning("<A|B>vec<N><UE8M0|UE4M3>", "flags",
                           "block scaling: one scale of that type per N elements of A or B (MXFP8/NVFP4)",
                           T.INFERRED)),)),
            Meaning(T.NVJET_COOP.value, "flags", T.NVJET_COOP.meaning, T.NVJET_COOP.evidence,
                    T.NVJET_COOP.source)),
        regex("layout", "<L1><L2><L3>", r"[TN]{3}", _layout, lambda kn: kn.layout,
              tuple(Meaning(k, t.value, t.meaning, t.evidence, t.source)
                    for k, t in T.NVJET_LAYOUT.items()), required=True),
    ),
    finish=_finish,
    owns=lambda kn: kn.variant != "mma",
    notes=("split_k is True exactly when the splitK flag is written (SPLITK_NUM > 1, measured).",
           "Tile and cluster are the config's TILE_ID and CLUSTER_SHAPE_ID, in the cuBLAS (column-major) "
           "problem's m, n, for ..T and ..N names alike (measured).",
           "customOption bits: 0 <-> last layout letter T, 1 <-> raster h, 2 <-> coopA|coopB (measured)."),
))


def _finish_sm120(f, flags):
    f["split_k"] = "splitK" in flags
    lay = f.get("layout")
    if lay:
        f["trans_a"] = lay[0] == "T"
        f["trans_b"] = lay[1] == "T"
    f["op"] = "gemm"


NVJET_SM120 = register(Grammar(
    name="nvjet_sm120", family="nvjet",
    summary="cuBLASLt's precompiled GEMM kernels for consumer Blackwell (sm120), picked by its heuristic "
            "(library-selected)",
    template="nvjet_<arch>_<types>_mma_<M>x<N>x<K>_<stages>_<Wm>x<Wn>x<Wk>[_tmaAB][_alignCD<n>]_<bz|badd>"
             "[_splitK]_<L1><L2><L3><L4>",
    examples=("nvjet_sm120_tst_mma_64x64x128_3_32x32x128_tmaAB_alignCD4_bz_TNNN",
              "nvjet_sm120_hss_mma_128x176x64_2_32x88x64_tmaAB_alignCD4_bz_NNNN"),
    slots=(
        literal("prefix", "nvjet", "family prefix"),
        regex("arch", "sm<NN>", r"sm(\d+[a-z]?)", lambda m: {"arch": m.group(0)}, lambda kn: kn.arch,
              (Meaning("sm<NN>", "arch", "SM architecture (sm120, sm121)", T.INFERRED),), required=True),
        regex("types", "<types>", r"[a-z]{3}(?:[a-z]{2})?", _types, _render_types,
              (Meaning("<types>", "a_type.., compute_type", "as in the Hopper grammar", T.INFERRED),),
              required=True),
        literal("mma", "mma", "marks the consumer-Blackwell grammar", sets={"variant": "mma"}),
        regex("tile", "<M>x<N>x<K>", r"(\d+)x(\d+)x(\d+)",
              lambda m: {"tile_m": int(m.group(1)), "tile_n": int(m.group(2)), "tile_k": int(m.group(3))},
              lambda kn: None if kn.tile_m is None else f"{kn.tile_m}x{kn.tile_n}x{kn.tile_k}",
              (Meaning("<M>x<N>x<K>", "tile_m, tile_n, tile_k", "CTA tile", T.INFERRED),), required=True),
        regex("stages", "<stages>", r"(\d+)", lambda m: {"stages": int(m.group(1))},
              lambda kn: None if kn.stages is None else str(kn.stages),
              (Meaning("<stages>", "stages", "pipeline stages", T.INFERRED),), required=True),
        regex("warp", "<Wm>x<Wn>x<Wk>", r"(\d+)x(\d+)x(\d+)",
              lambda m: {"warp_tile": tuple(int(x) for x in m.groups())}, shape("warp_tile"),
              (Meaning("<Wm>x<Wn>x<Wk>", "warp_tile", "per-warp tile", T.INFERRED),), required=True),
        flag_set("preflags", "[_tmaAB]", {"tmaAB": T.NVJET_SM120_FLAGS["tmaAB"]}),
        regex("align", "alignCD<n>", r"alignCD(\d+)", lambda m: {"align_c": int(m.group(1))},
              lambda kn: None if kn.align_c is None else f"alignCD{kn.align_c}",
              (Meaning("alignCD<n>", "align_c", "C and D alignment in elements", T.INFERRED),)),
        table("beta", "<bz|badd>", {k: Tok(t.value, t.meaning + " (as measured on sm90 names)", T.INFERRED)
                                    for k, t in T.NVJET_BETA.items()}, "beta", required=True),
        flag_set("flags", "[_splitK]", {"splitK": T.NVJET_SM120_FLAGS["splitK"]}),
        regex("layout", "<L1><L2><L3><L4>", r"[TN]{4}", _layout, lambda kn: kn.layout,
              (Meaning("<L1><L2><L3><L4>", "layout, trans_a, trans_b",
                       "L1 L2 as in the Hopper grammar; L3 L4 not understood yet", T.INFERRED),),
              required=True),
    ),
    finish=_finish_sm120,
    owns=lambda kn: kn.variant == "mma",
))
