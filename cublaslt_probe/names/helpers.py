"""Demangled C++ signatures, and the helper kernels cuBLAS launches around (or instead of) a GEMM.

A profiler shows many kernels as signatures::

    void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_64x128_32x3_tn_align4>(cutlass_80_..._align4::Params)
    std::enable_if<!(false), void>::type internal::gemvx::kernel<int, int, __nv_bfloat16, ...>(...)
    void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16, ...>
    void gemmSN_TN_kernel<float, (int)128, (int)16, ..., cublasGemv…          (truncated by the tool)

`split_signature` finds the function name and its template arguments (return types, parameter lists,
nsys's ``(int)128`` casts and a tool's truncation are all tolerated). ``cutlass::Kernel<X>`` /
``Kernel2<X>`` unwrap to the bare CUTLASS name ``X``; helper functions are looked up in
`tokens.HELPERS`.
"""
from __future__ import annotations

import re

from cublaslt_probe.names import tokens as T
from cublaslt_probe.names.grammar import Grammar, Slot, register
from cublaslt_probe.names.tokens import Meaning
from cublaslt_probe.names.tree import CAST

CUTLASS_WRAPPERS = frozenset({"cutlass::Kernel", "cutlass::Kernel2", "Kernel", "Kernel2", "cutlass::device_kernel",
                              "device_kernel"})
HELPER_FAMILIES = frozenset({"gemv", "gemmSN", "splitk_reduce", "helper", "framework"})
_ELLIPSIS = ("…", "...")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_EQ = re.compile(r"^(?:int|bool|unsigned int|unsigned|long|char|short)\s*=\s*")
_ACTIVITY = re.compile(r"^(Memset|Memcpy)\b")


def _strip_ellipsis(s: str) -> tuple[str, bool]:
    for e in _ELLIPSIS:
        if s.endswith(e):
            return s[: -len(e)].rstrip(), True
    return s, False


def split_signature(s: str) -> tuple[str, tuple[str, ...], bool]:
    """(qualified function name, template arguments, truncated) of a demangled signature."""
    stack: list[str] = []
    word_start = 0
    t_open = t_close = -1
    end = len(s)
    for i, ch in enumerate(s):
        if ch in "<([{":
            if not stack:
                if ch == "(" and i > word_start and s[i - 1] != ":":
                    end = i
                    break
                if ch == "<" and t_open < 0:
                    t_open = i
            stack.append(ch)
        elif ch in ">)]}":
            if stack:
                stack.pop()
                if not stack and ch == ">" and t_open >= 0 and t_close < 0:
                    t_close = i
        elif ch == " " and not stack:
            word_start = i + 1
            t_open = t_close = -1
    truncated = bool(stack) and end == len(s)
    if t_open >= 0:
        name = s[word_start:t_open]
        inner = s[t_open + 1:t_close] if t_close >= 0 else s[t_open + 1:end]
        args = _split_args(inner)
    else:
        name = s[word_start:end]
        args = ()
    name, cut = _strip_ellipsis(name.strip())
    if args:
        last, cut2 = _strip_ellipsis(args[-1])
        args = args[:-1] + ((last,) if last else ())
        cut = cut or cut2
    return name, args, truncated or cut


def _split_args(inner: str) -> tuple[str, ...]:
    out, depth, start = [], 0, 0
    for i, ch in enumerate(inner):
        if ch in "<([{":
            depth += 1
        elif ch in ">)]}":
            depth = max(0, depth - 1)
        elif ch == "," and depth == 0:
            out.append(inner[start:i])
            start = i + 1
    out.append(inner[start:])
    return tuple(_norm_arg(a) for a in out if a.strip())


def _norm_arg(a: str) -> str:
    a = a.strip()
    m = CAST.match(a) or _EQ.match(a)
    if m:
        kind = m.group(0)
        a = a[m.end():].strip()
        if "bool" in kind:
            a = {"0": "false", "1": "true"}.get(a, a)
    return a


def _cxx_dtype(arg: str):
    a = arg.replace("const", "").replace("*", "").strip()
    return T.CXX_DTYPES.get(a)


def lookup(name: str):
    """The HELPERS entry for a (possibly namespace-qualified) function name, trying shorter suffixes."""
    parts = name.split("::")
    for i in range(len(parts)):
        t = T.HELPERS.get("::".join(parts[i:]))
        if t is not None:
            return "::".join(parts[i:]), t
    return None, None


def framework_fields(name: str) -> dict | None:
    """Fields for a kernel torch / CuPy / CUB launched around or instead of cuBLAS, or None."""
    for prefix, tok in T.FRAMEWORK_PREFIXES.items():
        if name.startswith(prefix):
            short = name.rsplit("::", 1)[-1]
            if prefix == "cupy_":
                short = name[len(prefix):].split("__", 1)[0]
            op = short[:-len("_kernel")] if short.endswith("_kernel") else short
            return {"family": "framework", "variant": tok.value, "op": op or None, "base": name,
                    "tokens": (name,)}
    return None


def helper_fields(name: str, args: tuple[str, ...], truncated: bool) -> dict | None:
    """KernelName fields for a helper kernel, or None when the name is not a known helper."""
    m = _ACTIVITY.match(name)
    if m:
        family, op = T.HELPERS[m.group(1)].value
        return {"family": family, "op": op, "base": name, "source": "activity", "tokens": (name,)}
    fw = framework_fields(name)
    if fw is not None:
        fw["template_args"] = args
        if truncated:
            fw["flags"] = ("truncated",)
        return fw
    key, tok = lookup(name)
    if tok is None:
        return None
    family, op = tok.value
    f = {"family": family, "op": op, "base": name, "tokens": (name,), "template_args": args}
    flags = []
    dts = [d for d in (_cxx_dtype(a) for a in args) if d is not None]
    short = key.split("::")[-1]
    if family == "gemv":
        if dts:
            f["a_type"] = dts[0]
            f["b_type"] = dts[1] if len(dts) > 1 else dts[0]
            f["c_type"] = f["d_type"] = dts[2] if len(dts) > 2 else dts[-1]
            if len(dts) > 3:
                f["compute_type"] = dts[3]
        if short.startswith("gemv2T"):
            f["trans_a"] = True
        elif short.startswith("gemv2N"):
            f["trans_a"] = False
    elif family == "gemmSN":
        lay = short.split("_")[1]
        f.update(layout=lay, trans_a=lay[0] == "T", trans_b=lay[1] == "T")
        if dts:
            f["a_type"] = f["b_type"] = f["c_type"] = f["d_type"] = dts[0]
    elif short == "sgemm_largek_lds64":
        f.update(a_type="fp32", b_type="fp32", c_type="fp32", d_type="fp32", compute_type="fp32")
        flags += ["largek", "lds64"]
    elif short == "magma_sgemmEx_kernel" and len(dts) >= 3:
        # <compute, A/B, C, transa, transb, ...>: transa/transb matched the captured GEMMs (TN, TT)
        f.update(compute_type=dts[0], a_type=dts[1], b_type=dts[1], c_type=dts[2], d_type=dts[2])
        if len(args) >= 5 and args[3] in ("true", "false") and args[4] in ("true", "false"):
            f.update(trans_a=args[3] == "true", trans_b=args[4] == "true")
    elif op in ("dot", "scal", "axpy") and dts:
        f["a_type"] = dts[0]
    if truncated:
        flags.append("truncated")
    f["flags"] = tuple(flags)
    return f


def _helper_rows():
    rows = []
    for k, t in T.HELPERS.items():
        fam, op = t.value
        rows.append(Meaning(k, f"family={fam}, op={op}", t.meaning, t.evidence, t.source))
    for k, t in T.FRAMEWORK_PREFIXES.items():
        rows.append(Meaning(k + "...", f"family=framework, variant={t.value}", t.meaning, t.evidence, t.source))
    rows.append(Meaning("<template args>", "template_args, a_type..",
                        "C++ template arguments kept as written (nsys casts (int)128 / (bool)0 normalised); "
                        "gemv: first four C++ dtypes read as A, x, y, compute", T.INFERRED))
    return tuple(rows)


HELPERS_GRAMMAR = register(Grammar(
    name="helpers", family="helper",
    summary="helper kernels cuBLAS launches around or instead of a GEMM (families gemv, gemmSN, "
            "splitk_reduce, helper, legacy), and the framework's own kernels (family framework), usually "
            "seen as demangled signatures",
    template="[<return type> ][<namespace>::]<function>[<<template args>>][(<params>)]",
    examples=("void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16, float, __nv_bfloat16, "
              "false, float, __nv_bfloat16, __nv_bfloat16, true, false, false, false>",
              "void gemv2T_kernel_val<int, int, float, float, float, float, 128, 16, 4, 4, false, false, "
              "cublasGemvParamsEx<int, cublasGemvTensorStridedBatched<float const>, "
              "cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float>, float> >"
              "(...)",
              "Memset (Device)"),
    slots=(Slot("function", "<function>", lambda tok: None, lambda kn: [], meanings=_helper_rows()),),
    owns=lambda kn: False,
    notes=("encode() of a helper gives its bare function name (template arguments are not encoded).",
           "cutlass::Kernel<X> and Kernel2<X> unwrap to X, decoded by the cutlass grammars.",
           "Mangled _Z... names are demangled with cxxfilt first."),
))
