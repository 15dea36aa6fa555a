"""Kernel families recognised by their C++ namespace or name pattern rather than by regular tokens.

    cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<...>>     CUTLASS 3 GEMM (templates.py)
    cutlass::Kernel2<cutlass::gemm::kernel::GemmUniversal<...>>           CUTLASS 2 templated GEMM
    cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<...>>>   FlashAttention 3
    pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<...>>          FlashAttention 2 inside torch
    flash_fwd_splitkv_kernel, flash::flash_bwd_dot_do_o_kernel<...>       FlashAttention 2
    kernel_cutlass_kernel_flash_attncuteflash_fwd_sm100FlashAttentionForwardSm100_...   FlashAttention 4
    flashinfer::BatchPrefillWithPagedKVCacheKernel<...>                    FlashInfer
    fmhaSm100fKernel_QkvBfloat16OBfloat16H128PagedKv...                    TensorRT-LLM trtllm-gen FMHA
    deep_gemm::sm90_fp8_gemm_1d2d_impl<...>                                DeepGEMM
    marlin_moe_wna16::Marlin<...>, machete::...                            Marlin / Machete
    cudnn::fusion::compute_dot_do_o_specialized<...>                      cuDNN helpers
    at::native::..., cub::..., thrust::...                                 PyTorch / CUB / Thrust (helpers.py)

`signature_fields` returns the fields of a name in one of these families, or None. The tables that say
what each namespace means live in `tokens.SIGNATURE_FAMILIES`.
"""
from __future__ import annotations

import re

from cublaslt_probe.names import templates as TP
from cublaslt_probe.names import tokens as T
from cublaslt_probe.names.grammar import Grammar, Slot, register
from cublaslt_probe.names.tokens import Meaning
from cublaslt_probe.names.tree import parse

_FA4 = re.compile(r"kernel_cutlass_kernel_(?P<mod>\w*?)(?P<cls>FlashAttention(?P<dir>Forward|Backward)\w*?"
                  r"Sm(?P<sm>\d+))")
_TRT_FMHA = re.compile(r"^[Ff]mha(?:Sm(?P<sm>\d+)(?P<sfx>[af]?))?Kernel_(?P<rest>\w+)$")
_TRT_FMHA_TYPES = re.compile(r"^(?:Qkv(?P<qkv>[A-Z][a-z0-9]+?\d*)|Q(?P<q>[A-Z][a-z0-9]+?\d*)"
                             r"Kv(?P<kv>[A-Z][a-z0-9]+?\d*))O(?P<o>[A-Z][a-z0-9]+?\d*)(?=H)")
_TRT_FMHA_HEAD = re.compile(r"H(?:Qk)?(\d+)")
_TRT_FMHA_TILE = re.compile(r"Q(\d+)Kv(\d+)")
_TRT_TYPE_WORDS = {"E4m3": "fp8_e4m3", "E5m2": "fp8_e5m2", "E2m1": "fp4_e2m1", "Bfloat16": "bf16",
                   "Fp16": "fp16", "Fp32": "fp32", "Fp8": "fp8"}
_TRT_FMHA_WORDS = re.compile("|".join(sorted(T.TRTLLM_FMHA_WORDS, key=len, reverse=True)))
_FLASH_BARE = re.compile(r"^flash_(fwd|bwd)_\w*kernel\w*$")
_DG_ARCH = re.compile(r"sm(\d+)")


def _trt_type(word: str | None) -> str | None:
    if not word:
        return None
    for k, v in _TRT_TYPE_WORDS.items():
        if word.startswith(k):
            return v
    return None


def _family_entry(name: str):
    """The SIGNATURE_FAMILIES entry whose key starts the (namespace-qualified) name, longest first."""
    n = name.lstrip(":")
    for key, tok in T.SIGNATURE_FAMILIES_SORTED:
        if n.startswith(key):
            return key, tok
    return None, None


def flash_attention(fname: str, sig: str, tree=None) -> dict:
    f = {"family": "flash_attn", "base": fname, "tokens": (fname,)}
    short = fname.rsplit("::", 1)[-1]
    f["op"] = short[:-len("_kernel")] if short.endswith("_kernel") else short
    if fname.startswith("pytorch_flash::"):
        f["variant"], f["library"] = "fa2", "torch"
    else:
        f["variant"], f["library"] = "fa2", "flash-attn"
    if "<" in sig:
        f.update(TP.flash2_fields(fname, tree or parse(sig)))
    return f


def signature_fields(fname: str, args: tuple[str, ...], sig: str, truncated: bool) -> dict | None:
    """Fields of a kernel whose family shows in its namespace or name pattern, or None."""
    key, tok = _family_entry(fname)
    if tok is None:
        if _FLASH_BARE.match(fname):
            f = flash_attention(fname, sig)
        elif fname.startswith(("fmhaSm", "FmhaSm", "fmhaKernel", "fmhaReductionKernel")):
            f = trtllm_fmha(fname)
        elif fname.startswith("kernel_cutlass_kernel_"):
            f = cute_dsl(fname)
        elif fname.startswith("Marlin") or fname == "Marlin":
            f = {"family": "marlin", "variant": "marlin", "op": "gemm", "base": fname, "tokens": (fname,)}
        else:
            return None
    else:
        family, lib = tok.value
        short = fname.rsplit("::", 1)[-1]
        f = {"family": family, "library": lib, "base": fname, "tokens": (fname,),
             "op": short[:-len("_kernel")] if short.endswith("_kernel") else short}
        if family == "flash_attn":
            f = flash_attention(fname, sig)
        elif family == "deepgemm":
            m = _DG_ARCH.search(short)
            if m:
                f["arch"] = "sm" + m.group(1)
            for word, dt in (("fp8_fp4", "fp8_e4m3"), ("fp8", "fp8_e4m3"), ("bf16", "bf16"), ("tf32", "tf32")):
                if word in short:
                    f["a_type"] = f["b_type"] = dt
                    break
            if "gemm" in short:
                f["op"] = "gemm"
                f["variant"] = short
        elif family == "marlin":
            f["op"] = "gemm"
            f["variant"] = key.rstrip(":") if key else "marlin"
    f["template_args"] = args
    if truncated:
        f["flags"] = tuple(f.get("flags", ())) + ("truncated",)
    return f


def trtllm_fmha(fname: str) -> dict:
    f = {"family": "trtllm_gen", "library": "trtllm-gen", "base": fname, "tokens": (fname,), "op": "fmha",
         "variant": "fmha"}
    m = _TRT_FMHA.match(fname)
    if m is None:
        return f
    if m.group("sm"):
        f["arch"] = f"sm{m.group('sm')}{m.group('sfx') or ''}"
    rest = m.group("rest")
    t = _TRT_FMHA_TYPES.match(rest)
    if t:
        q = _trt_type(t.group("qkv") or t.group("q"))
        f["a_type"] = q
        f["b_type"] = _trt_type(t.group("qkv") or t.group("kv"))
        f["d_type"] = _trt_type(t.group("o"))
        rest2 = rest[t.end():]
    else:
        rest2 = rest
    h = _TRT_FMHA_HEAD.match(rest2)
    if h:
        f["head_dim"] = int(h.group(1))
    tile = _TRT_FMHA_TILE.search(rest2)
    if tile:
        f["tile_m"], f["tile_n"] = int(tile.group(1)), int(tile.group(2))
    f["flags"] = tuple(_TRT_FMHA_WORDS.findall(rest2))
    return f


def cute_dsl(fname: str) -> dict:
    m = _FA4.search(fname)
    if m:
        return {"family": "flash_attn", "variant": "fa4", "library": "flash-attn",
                "op": "flash_" + ("fwd" if m.group("dir") == "Forward" else "bwd"), "arch": f"sm{m.group('sm')}",
                "base": fname, "tokens": (fname,), "schedule": m.group("cls")}
    return {"family": "cute_dsl", "base": fname, "tokens": (fname,), "op": None}


def device_kernel_fields(sig: str, truncated: bool) -> dict:
    """Fields of a templated ``cutlass::device_kernel<...>`` / ``Kernel2<...>`` signature."""
    tree = parse(sig)
    root = tree.root
    inner = root.args[0] if root.args else root
    ns = inner.name.lstrip(":")
    wrapper = root.short
    if ns.startswith("flash::") or "FlashAttn" in inner.text()[:200]:
        f = {"family": "flash_attn", "variant": "fa3", "library": "flash-attn"}
        f.update(TP.flash3_fields(tree))
        m = re.search(r"FlashAttn(Fwd|Bwd)(?:Sm\d+|Combine)?", inner.text()[:300])
        f["op"] = "flash_" + m.group(1).lower() if m else "flash"
        if "Combine" in inner.text()[:200]:
            f["op"] = "flash_fwd_combine"
    elif wrapper in ("Kernel", "Kernel2") and "CollectiveMma" not in sig:
        f = {"family": "cutlass_template", "variant": "cutlass2"}
        fl, flags = TP.cutlass2_fields(tree)
        f.update(fl)
        f["flags"] = tuple(flags)
        f["problem_shape"] = "grouped" if "Grouped" in inner.text()[:300] else "single"
    else:
        fl, flags = TP.cutlass3_fields(tree)
        f = {"family": "cutlass_template"}
        f.update(fl)
        f["flags"] = tuple(flags)
    lib = next((t.value for k, t in T.TEMPLATE_LIBRARIES.items() if ns.startswith(k)), None)
    key, tok = _family_entry(ns)
    if lib is not None and f["family"] == "cutlass_template":
        f["library"] = lib
        if ns.startswith("machete::"):
            f["family"], f["variant"] = "marlin", "machete"
    elif tok is not None and f["family"] == "cutlass_template":
        f["library"] = tok.value[1]
        if tok.value[0] == "marlin":
            f["family"], f["variant"] = "marlin", "machete"
    elif f["family"] == "cutlass_template":
        f["library"] = _library_from_text(inner.text())
    f["base"] = root.name
    f["tokens"] = (root.name,)
    f["template_args"] = tuple(a.text() for a in root.args)
    if tree.truncated and "truncated" not in f.get("flags", ()):
        f["flags"] = tuple(f.get("flags", ())) + ("truncated",)
    return f


def _library_from_text(text: str) -> str | None:
    head = text[:400]
    for key, tok in T.SIGNATURE_FAMILIES_SORTED:
        if key.rstrip(":") and key in head:
            return tok.value[1]
    if "_scaled_mm_c3x" in head or "cutlass_3x_gemm" in head:
        return "vllm"
    return None


_CUDNN_ENGINES = tuple((re.compile(k), t) for k, t in T.CUDNN_ENGINE_PATTERNS.items())
_CONV_WORD = re.compile(r"(fprop|dgrad|wgrad)")


def cudnn_engine(f: dict, text: str) -> None:
    """Re-attribute a cuDNN convolution engine kernel (xmma / CUTLASS prefix, cuDNN build) to family cudnn."""
    name = f.get("base") or text
    for rx, tok in _CUDNN_ENGINES:
        m = rx.search(name)
        if m is None:
            continue
        op = m.group(1) if tok.value == "<1>" else tok.value
        if op == "conv":
            w = _CONV_WORD.search(text)
            op = w.group(1) if w else "conv"
        if f.get("family") == "unknown":      # the wrapper was not understood before; now it is
            f["unparsed"] = ()
        f.update(family="cudnn", library="cudnn", op=op, variant="engine")
        return


def mangled_fields(s: str) -> dict | None:
    """Fields of a mangled name neither demangler read, from its words; None when nothing is recognised."""
    words = TP.mangled_words_of(s)
    names = [w for w in words if isinstance(w, str)]
    if not names:
        return None
    if "flash" in names[:4] or any(w.startswith("FlashAttn") for w in names[:8]):
        return {"family": "flash_attn", "variant": "fa3", "library": "flash-attn", "op": "flash",
                "base": s, "tokens": tuple(names[:6]), "unparsed": ("<fields not in the mangled words>",)}
    if names[0] == "cutlass" and len(names) > 2 and names[1] in ("device_kernel", "Kernel", "Kernel2") and any(
            w.startswith(("Gemm", "Mainloop", "Collective", "cutlass_3x", "Kernel")) for w in names[2:]):
        f, flags, missing = TP.mangled_cutlass_fields(words)
        cut = s.rstrip().endswith(("...", "…"))
        f.update(family="cutlass_template", base="cutlass::" + names[1], tokens=tuple(names[:6]),
                 flags=tuple(flags) + (("truncated",) if cut else ()), unparsed=tuple(missing))
        lib = next((t.value for k, t in T.TEMPLATE_LIBRARIES.items() if names[2:3] == [k.rstrip(":")]), None)
        if lib is not None:
            f["library"] = lib
        return f
    key, tok = _family_entry("::".join(names[:3]))
    if tok is not None:
        return {"family": tok.value[0], "library": tok.value[1], "base": "::".join(names[:3]),
                "tokens": tuple(names[:6]), "flags": ("truncated",), "op": names[min(2, len(names) - 1)]}
    return None


# Families whose names are not written from fields: encode() gives their function name back.
NAME_FAMILIES = frozenset({"flash_attn", "flashinfer", "deepgemm", "marlin", "cutlass_template", "cute_dsl",
                           "trtllm_gen", "cudnn", "vllm", "sglang"})


def _rows():
    rows = [Meaning(k + "...", f"family={t.value[0]}, library={t.value[1]}", t.meaning, t.evidence, t.source)
            for k, t in T.SIGNATURE_FAMILIES.items()]
    rows += [
        Meaning("cutlass::device_kernel<GemmUniversal<...>>", "problem_shape, tile_*, cluster_*, stages, "
                "mma_atom, a_type.., schedule, epilogue", "CUTLASS 3 GEMM read from its template: problem shape "
                "(GroupProblemShape -> grouped, PtrArray schedules -> ptr_array, else single), mainloop policy "
                "<stages, cluster, kernel schedule>, tile shape, element types, MMA atom, epilogue policy and "
                "fusion", T.INFERRED, "NVIDIA CUTLASS 3 kernel templates"),
        Meaning("<mangled words>", "problem_shape, stages, schedule, mma_atom, a_type, epilogue",
                "a mangled name no demangler reads (cut short by a profiler): the fields its source names "
                "carry; tile and cluster need the structure and are listed in unparsed", T.INFERRED),
        Meaning("flash_<fwd|bwd>_*kernel", "family=flash_attn, head_dim, tile_m, tile_n",
                "FlashAttention 2: Flash_fwd_kernel_traits<head dim, block M, block N, warps, ..., element>",
                T.INFERRED, "Dao-AILab flash-attention kernel_traits.h"),
        Meaning("flash::FlashAttnFwdSm90<...>", "family=flash_attn, stages, cluster_*, tile_m, tile_n, head_dim",
                "FlashAttention 3: CollectiveMainloopFwdSm90<stages, cluster, tile <M, N, head dim>, ...>",
                T.INFERRED, "Dao-AILab flash-attention hopper/"),
        Meaning("kernel_cutlass_kernel_...FlashAttentionForwardSm100...", "family=flash_attn, arch",
                "FlashAttention 4 (CuTe DSL, JIT-compiled when first called)", T.INFERRED),
        Meaning("fmhaSm100<a|f>Kernel_<Q/KV/O types>H<d>...", "family=trtllm_gen, a_type, d_type, head_dim, "
                "tile_m, tile_n", "trtllm-gen attention cubin: types, head dim, paging, mask, tile "
                "(Q<m>Kv<n>)", T.INFERRED),
    ]
    return tuple(rows)


SIGNATURES_GRAMMAR = register(Grammar(
    name="signatures", family="(several)",
    summary="kernels recognised by namespace or name pattern: CUTLASS 3 / templated CUTLASS 2 GEMMs, "
            "FlashAttention 2/3/4, FlashInfer, trtllm-gen attention, DeepGEMM, Marlin/Machete, cuDNN helpers",
    template="[<return type> ][<namespace>::]<function>[<<template args>>][(<params>)]",
    examples=(),
    slots=(Slot("function", "<function>", lambda tok: None, lambda kn: [], meanings=_rows()),),
    owns=lambda kn: False,
    notes=("encode() of these names gives their function name: the template is not re-written.",),
))
