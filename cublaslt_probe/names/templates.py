"""Templated kernels: CUTLASS 3 ``cutlass::device_kernel<...>``, templated CUTLASS 2 ``Kernel2<...>``,
FlashAttention 2/3 signatures, and the mangled forms of all of them.

A CUTLASS 3 GEMM's name is its kernel type written out::

    cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<
        <problem shape>,                        GroupProblemShape<...> -> grouped
        CollectiveMma<<mainloop policy<stages, cluster, kernel schedule>>, <tile MxNxK>,
                      <A type>, <A stride>, <B type>, <B stride>, TiledMMA<MMA_Atom<<atom>>...>, ...>,
        CollectiveEpilogue<<epilogue policy>, <cta tile>, <epi tile>, <C type>, ..., <D type>, ...,
                           FusionCallbacks<..., <fusion op>, ...>, ...>>>

Fields are read from that structure (`cutlass3_fields`); token tables in `tokens` say what each piece
means. A name the demanglers refused (cut short by a profiler) is read from its mangled words
(`mangled_cutlass_fields`): problem shape, schedule, policy, atom and types; the tile and cluster need
the structure and stay missing (listed in ``unparsed``).
"""
from __future__ import annotations

import re

from cublaslt_probe.names import classes as C
from cublaslt_probe.names import tokens as T
from cublaslt_probe.names.tree import Node, Tree, int_value, mangled_words, static_ints

_ARCH = re.compile(r"Sm(\d+)")
_ATOM_SHAPE = re.compile(r"(\d+)x(\d+)x(\d+)")
_ATOM_TYPES = re.compile(r"_(F32|F16|S32|F64)(BF16|F16|TF32|E4M3|E5M2|S8|U8|F8F6F4|F32)"
                         r"(BF16|F16|TF32|E4M3|E5M2|S8|U8|F32)?")
_ATOM_ACC = {"F32": "fp32", "F16": "fp16", "S32": "int32", "F64": "fp64"}
_ATOM_IN = {"BF16": "bf16", "F16": "fp16", "TF32": "tf32", "E4M3": "fp8_e4m3", "E5M2": "fp8_e5m2",
            "S8": "int8", "U8": "uint8", "F32": "fp32"}


def cxx_dtype(n: Node | str | None) -> str | None:
    """Canonical dtype of a C++ element type (``cutlass::bfloat16_t`` -> ``bf16``), else None."""
    if n is None:
        return None
    if isinstance(n, Node):
        if n.short == "tuple" and n.args:     # mixed-input: tuple<Element, Scale...>
            return cxx_dtype(n.args[0])
        text = n.name
    else:
        text = n
    text = text.replace("const", "").replace("*", "").strip()
    v = T.CXX_DTYPES.get(text)
    if v is None:
        v = T.CXX_DTYPES.get(text.rsplit("::", 1)[-1])
    return v


def _arch_of(name: str) -> str | None:
    m = _ARCH.search(name)
    return f"sm{m.group(1)}" if m else None


def _atom_fields(atom: str, f: dict) -> None:
    f["mma_atom"] = atom
    m = _ATOM_SHAPE.search(atom)
    if m:
        f["instruction_shape"] = tuple(int(x) for x in m.groups())
    m = _ATOM_TYPES.search(atom)
    if m:
        f.setdefault("compute_type", _ATOM_ACC.get(m.group(1)))
        if m.group(2) in _ATOM_IN:
            f.setdefault("_atom_a", _ATOM_IN[m.group(2)])


def _problem_shape(problem: str, texts: list[str]) -> str:
    if "GroupProblemShape" in problem:
        return C.GROUPED
    if any("PtrArray" in t or "ArrayTma" in t or "ArrayUmma" in t for t in texts):
        return C.PTR_ARRAY
    return C.SINGLE


def _schedule_short(name: str) -> str:
    return name.rsplit("::", 1)[-1]


def cutlass3_fields(tree: Tree) -> tuple[dict, list[str]]:
    """(fields, flags) of a ``cutlass::device_kernel<...>`` / ``Kernel2<...>`` templated GEMM."""
    f: dict = {"op": "gemm"}
    flags: list[str] = []
    root = tree.root
    inner = root.args[0] if root.args else root
    gu = root.find(lambda n: n.short in ("GemmUniversal", "Gemm", "GemmArray", "GemmGrouped"))
    cm = root.find(lambda n: n.short == "CollectiveMma" or n.short.startswith("CollectiveMma"))
    if gu is not None and cm is not None:
        _universal_fields(root, gu, cm, f, flags)
    else:
        _wrapper_fields(inner, f)
    a = f.pop("_atom_a", None)
    if f.get("a_type") is None and a is not None:
        f["a_type"] = f["b_type"] = a
    if tree.truncated:
        flags.append("truncated")
    return {k: v for k, v in f.items() if v is not None}, flags


def _universal_fields(root: Node, gu: Node, cm: Node, f: dict, flags: list[str]) -> None:
    """Fields of a ``GemmUniversal`` kernel into `f`: its collective MMA's policy (variant, arch, stages,
    cluster, schedule), tile, operand and accumulator types, its epilogue and fusion, the problem shape."""
    problem = gu.args[0].text() if gu.args else ""
    policy = cm.args[0] if cm.args else Node("")
    f["variant"] = policy.short or None
    f["arch"] = _arch_of(policy.short)
    ints = [v for v in (int_value(a) for a in policy.args) if v is not None]
    if ints:
        f["stages"] = ints[0]
    for a in policy.args:
        sv = static_ints(a)
        if sv is not None and len(sv) == 3:
            f["cluster_m"], f["cluster_n"], f["cluster_k"] = sv
        elif a.short.startswith("Kernel"):
            f["schedule"] = _schedule_short(a.name)
    if "stages" not in f:
        sc = cm.find(lambda n: n.short.startswith("StageCount"))
        if sc is not None:
            v = int_value(sc.args[0]) if sc.args and sc.short == "StageCount" else None
            if v is not None:
                f["stages"] = v
    if len(cm.args) > 1:
        tile = static_ints(cm.args[1])
        if tile is not None and len(tile) >= 2:
            f["tile_m"], f["tile_n"] = tile[0], tile[1]
            if len(tile) > 2:
                f["tile_k"] = tile[2]
    if len(cm.args) > 4:
        f["a_type"] = cxx_dtype(cm.args[2])
        f["b_type"] = cxx_dtype(cm.args[4])
    atom = cm.find(lambda n: n.short in ("MMA_Atom", "MMA_Traits"))
    if atom is not None and atom.args:
        a0 = atom.args[0]
        if a0.short == "MMA_Traits" and a0.args:
            if len(a0.args) > 3 and cxx_dtype(a0.args[3]) is not None:
                f["compute_type"] = cxx_dtype(a0.args[3])     # MMA_Traits<atom, A, B, accumulator, ...>
            a0 = a0.args[0]
        _atom_fields(a0.name.replace("cute::", ""), f)
    ep = root.find(lambda n: n.short == "CollectiveEpilogue" or n.short == "DefaultEpilogue"
                   or n.short.startswith("Epilogue"))
    texts = [policy.name, f.get("schedule") or ""]
    if ep is not None and ep.args:
        epol = ep.args[0]
        f["epilogue"] = epol.short if epol.short else None
        texts.append(epol.name)
        if len(ep.args) > 5:
            f["c_type"] = cxx_dtype(ep.args[3])
            f["d_type"] = cxx_dtype(ep.args[5])
        fusion = ep.find(lambda n: n.name.startswith("cutlass::epilogue::fusion::") and
                         n.short not in ("FusionCallbacks",))
        if fusion is not None:
            flags.append(fusion.short)
    f["problem_shape"] = _problem_shape(problem, texts)
    if f.get("schedule") is None:
        f["schedule"] = policy.short or None


def _wrapper_fields(inner: Node, f: dict) -> None:
    """Fields of a template that is not ``GemmUniversal`` into `f`."""
    # vLLM-style wrappers (cutlass_3x_gemm<A, D, Epilogue, Tile, Cluster, KernelSchedule, EpiSchedule>)
    # and other non-GemmUniversal templates: static 3-tuples in order are the tile then the cluster.
    tuples = [sv for sv in (static_ints(n) for n in inner.walk()) if sv is not None and len(sv) == 3]
    if tuples:
        f["tile_m"], f["tile_n"], f["tile_k"] = tuples[0]
    if len(tuples) > 1:
        f["cluster_m"], f["cluster_n"], f["cluster_k"] = tuples[1]
    dts = [d for d in (cxx_dtype(n) for n in inner.args) if d is not None]
    if dts:
        f["a_type"] = f["b_type"] = dts[0]
        if len(dts) > 1:
            f["d_type"] = dts[1]
    for n in inner.walk():
        if n.short.startswith("Kernel") and "schedule" not in f:
            f["schedule"] = n.short
        elif n.name.startswith("cutlass::epilogue::") and "epilogue" not in f:
            f["epilogue"] = n.short
    texts = [f.get("schedule") or "", f.get("epilogue") or ""]
    f["problem_shape"] = _problem_shape(inner.text() if "GroupProblemShape" in inner.text() else "", texts)
    if f.get("schedule"):
        f["arch"] = "sm90" if "TmaWarpSpecialized" in f["schedule"] else None


def cutlass2_fields(tree: Tree) -> tuple[dict, list[str]]:
    """(fields, flags) of a templated CUTLASS 2 kernel: GemmShape<tile>, <warp>, <instruction>, stages."""
    f: dict = {"op": "gemm"}
    shapes = [sv for sv in (static_ints(n) for n in tree.root.walk() if n.short == "GemmShape")
              if sv is not None]
    if shapes:
        f["tile_m"], f["tile_n"], f["tile_k"] = shapes[0][:3]
    if len(shapes) > 1:
        f["warp_tile"] = shapes[1]
    if len(shapes) > 2:
        f["instruction_shape"] = shapes[2]
    mma = tree.root.find(lambda n: n.short in ("MmaMultistage", "MmaPipelined"))
    if mma is not None:
        ints = [v for v in (int_value(a) for a in mma.args) if v is not None]
        if ints:
            f["stages"] = ints[-1]
        f["variant"] = mma.short
    arch = tree.root.find(lambda n: n.name.startswith("cutlass::arch::Sm"))
    if arch is not None:
        f["arch"] = _arch_of(arch.short)
    dts = [d for d in (cxx_dtype(n) for n in tree.root.walk() if not n.args) if d is not None]
    if dts:
        f["a_type"] = f["b_type"] = dts[0]
    return f, ["truncated"] if tree.truncated else []


# ------------------------------------------------------------------------------------------ mangled
def mangled_cutlass_fields(words: list) -> tuple[dict, list[str], list[str]]:
    """(fields, flags, unparsed) of a CUTLASS 3 GEMM read from its mangled words only."""
    f: dict = {"op": "gemm"}
    names = [w for w in words if isinstance(w, str)]
    policy = next((w for w in names if w.startswith("Mainloop")), None)
    sched = next((w for w in names if w.startswith("Kernel") and w != "Kernel"), None)
    atom = next((w for w in names if w.startswith(("SM90_", "SM100_", "SM120_", "SM80_", "MMA_"))
                 and w not in ("MMA_Atom", "MMA_Traits") and "TMA" not in w and "TMEM" not in w), None)
    epol = next((w for w in names if re.match(r"Sm\d+.*(?:TmaWarpSpecialized|Epilogue|NoSmem)", w)), None)
    if policy is not None:
        f["variant"] = policy
        f["arch"] = _arch_of(policy)
        i = words.index(policy)
        if i + 1 < len(words) and isinstance(words[i + 1], int):
            f["stages"] = words[i + 1]
    f["schedule"] = sched or policy
    if atom is not None:
        _atom_fields(atom, f)
        a = f.pop("_atom_a", None)
        if a is not None:
            f["a_type"] = f["b_type"] = a
    if epol is not None:
        f["epilogue"] = epol
    dts = [T.CXX_DTYPES.get("cutlass::" + w) for w in names]
    dts = [d for d in dts if d is not None]
    if dts and "a_type" not in f:
        f["a_type"] = f["b_type"] = dts[0]
    texts = [policy or "", sched or "", epol or ""]
    f["problem_shape"] = _problem_shape("GroupProblemShape" if "GroupProblemShape" in names else "", texts)
    missing = ["<tile not in the mangled words>"]
    return {k: v for k, v in f.items() if v is not None}, [], missing


def mangled_words_of(s: str) -> list:
    return mangled_words(s)


# --------------------------------------------------------------------------------- FlashAttention
def flash2_fields(fname: str, tree: Tree) -> dict:
    """FlashAttention 2 (``flash_fwd_kernel<Flash_fwd_kernel_traits<hdim, BlockM, BlockN, warps, ...>>``)."""
    f: dict = {}
    traits = tree.root.find(lambda n: n.short.startswith(("Flash_fwd_kernel_traits", "Flash_bwd_kernel_traits",
                                                          "Flash_kernel_traits")))
    if traits is not None:
        ints = [int_value(a) for a in traits.args]
        if len(ints) >= 3 and all(v is not None for v in ints[:3]):
            f["head_dim"], f["tile_m"], f["tile_n"] = ints[0], ints[1], ints[2]
        if len(ints) >= 4 and ints[3] is not None:
            f["warp_shape"] = (ints[3],)
        dt = next((d for d in (cxx_dtype(a) for a in traits.walk() if not a.args) if d is not None), None)
        if dt is not None:
            f["a_type"] = f["b_type"] = dt
    return f


def flash3_fields(tree: Tree) -> dict:
    """FlashAttention 3 (``flash::FlashAttnFwdSm90<CollectiveMainloopFwdSm90<stages, cluster, tile, hdimV,
    element, accum, arch, ...>, ...>``)."""
    f: dict = {}
    ml = tree.root.find(lambda n: n.short.startswith(("CollectiveMainloopFwd", "CollectiveMainloopBwd")))
    if ml is not None and ml.args:
        v = int_value(ml.args[0])
        if v is not None:
            f["stages"] = v
        tuples = [static_ints(a) for a in ml.args]
        tuples = [t for t in tuples if t is not None and len(t) == 3]
        if tuples:
            f["cluster_m"], f["cluster_n"], f["cluster_k"] = tuples[0]
        if len(tuples) > 1:
            f["tile_m"], f["tile_n"], f["head_dim"] = tuples[1]
        dts = [d for d in (cxx_dtype(a) for a in ml.args) if d is not None]
        if dts:
            f["a_type"] = f["b_type"] = dts[0]
        if len(dts) > 1:
            f["compute_type"] = dts[1]
        arch = next((a for a in ml.args if a.name.startswith("cutlass::arch::Sm")), None)
        if arch is not None:
            f["arch"] = _arch_of(arch.short)
        f["variant"] = ml.short
    sched = tree.root.find(lambda n: n.short.endswith("TileScheduler"))
    if sched is not None:
        f["schedule"] = sched.short
    return f
