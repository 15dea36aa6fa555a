"""`decode` and `encode`: the entry points. Total on any input; cached by name."""
from __future__ import annotations

import logging
import re

from cublaslt_probe.errors import UnknownKernelName

# The grammars register on import, and grammar_for tries them in that order.
# isort: off
from cublaslt_probe.names import nvjet as _nvjet
from cublaslt_probe.names import xmma as _xmma
from cublaslt_probe.names import cutlass as _cutlass
from cublaslt_probe.names import helpers as _helpers
from cublaslt_probe.names import families as _fam
from cublaslt_probe.names import signatures as _sig
from cublaslt_probe.names.classify import classify as _classify
from cublaslt_probe.names import tokens as T
from cublaslt_probe.names.grammar import Grammar, grammar_for
from cublaslt_probe.names.model import KernelName, make
# isort: on

log = logging.getLogger(__name__)

_CACHE: dict[str, KernelName] = {}
_CACHE_MAX = 1 << 17
_cache_get = _CACHE.get
_SM = re.compile(r"sm\d+[a-z]?")


def decode(name: str, strict: bool = False) -> KernelName:
    """Decode a kernel name (bare, demangled signature or mangled ``_Z...``) into a `KernelName`.

    Never raises by default: a name no grammar understands gets ``family="unknown"`` and keeps its tokens
    in ``unparsed``. ``strict=True`` raises `UnknownKernelName` when the family is unknown or any token
    is left unparsed.
    """
    kn = _cache_get(name) if type(name) is str else None
    if kn is None:
        kn = _decode_uncached(name)
        if type(name) is str:
            if len(_CACHE) >= _CACHE_MAX:
                _CACHE.clear()
            _CACHE[name] = kn
    if strict and (kn.family == "unknown" or kn.unparsed):
        raise UnknownKernelName(_strict_message(kn))
    return kn


def clear_cache() -> None:
    _CACHE.clear()


def encode(kn: KernelName) -> str:
    """The bare kernel name written from `kn`'s fields: ``encode(decode(n)) == decode(n).base``.

    Helpers give their bare function name; an unknown name gives its base unchanged. Raises ValueError
    when a field the family's grammar requires is not set.
    """
    if kn.family == "unknown" or kn.family in _helpers.HELPER_FAMILIES or (
            kn.template_args or kn.source == "activity" or _helpers.lookup(kn.base)[1] is not None):
        return kn.base
    g = grammar_for(kn)
    if g is None and kn.family in _sig.NAME_FAMILIES:
        return kn.base
    if g is None:
        raise ValueError(f"no grammar encodes family {kn.family!r}")
    return g.encode(kn)


# ------------------------------------------------------------------------------------------ internals
def _as_text(raw) -> str:
    if raw is None:
        return ""
    if isinstance(raw, str):
        return raw
    if isinstance(raw, (bytes, bytearray)):
        return bytes(raw).decode("utf-8", "replace")
    try:
        return str(raw)
    except Exception:  # noqa: BLE001 - a decoder that never raises
        return ""


def _demangle(s: str) -> str | None:
    try:
        import cxxfilt
        out = cxxfilt.demangle(s)
    except Exception:  # noqa: BLE001 - invalid or unsupported mangling: try the second demangler
        out = None
    if out and out != s:
        return out
    return _demangle_itanium(s)


def _demangle_itanium(s: str) -> str | None:
    """The pure-Python Itanium demangler reads names the GNU one refuses (CUTLASS 3 enum literals)."""
    try:
        import itanium_demangler
        ast = itanium_demangler.parse(s)
    except Exception:  # noqa: BLE001 - not installed, or a name it cannot read either
        return None
    if ast is None:
        return None
    try:
        out = str(ast)
    except Exception:  # noqa: BLE001  a tree it parsed but cannot print
        return None
    return out if out and out != s else None


def _select(base: str) -> Grammar | None:
    head, _, rest = base.partition("_")
    if head == "nvjet":
        toks = rest.split("_", 3)
        return _nvjet.NVJET_SM120 if "mma" in toks[1:3] else _nvjet.NVJET
    if head == "cutlass":
        return _cutlass.CUTLASS
    if head == "cutlass3x":
        return _cutlass.CUTLASS3X
    if head in T.LEGACY_ARCHS:
        return _cutlass.LEGACY
    if rest.startswith("xmma_") and _SM.fullmatch(head):
        return _xmma.XMMA
    g = _HEADS.get(head)
    if g is not None:
        return g
    if head == "fmha" and rest.startswith("cutlass"):
        return _fam.FMHA
    return None


_HEADS = {"triton": _fam.TRITON, "cudnn": _fam.CUDNN, "bmm": _fam.TRTLLM_BMM, "Bmm": _fam.TRTLLM_BMM,
          "ncclDevKernel": _fam.NCCL, "ncclKernel": _fam.NCCL_LEGACY}


def _unknown(base: str, source: str, extra: tuple[str, ...] = (), **kw) -> dict:
    toks = tuple(t for t in base.split("_") if t) if base else ()
    return dict(base=base, family="unknown", source=source, tokens=toks, unparsed=toks + extra, **kw)


def _decode_grammar(base: str, source: str, g: Grammar, extra_unparsed=()) -> dict:
    toks = g.split(base)
    fields, flags, unparsed = g.parse(toks)
    if g.finish is not None:
        g.finish(fields, flags)
    for k in [k for k in fields if k[0] == "_"]:
        del fields[k]
    return dict(base=base, family=g.family, source=source, flags=tuple(flags), tokens=tuple(toks),
                unparsed=tuple(unparsed) + tuple(extra_unparsed), **fields)


def _decode_uncached(raw) -> KernelName:
    text = _as_text(raw)
    try:
        f = _decode_fields(text)
        if f is None:
            return make(text)
        if "cudnn" in text or "prop_" in text or "grad_" in text or "convolve" in text:
            _sig.cudnn_engine(f, text)
        _classify(f)
        return make(text, **f)
    except Exception:  # the contract: never raise; a bug here must not lose the name
        log.debug("decoder error on %r", text[:200], exc_info=True)
        f = _unknown(text.strip(), "bare", ("<decoder error>",))
        _classify(f)
        return make(text, **f)


def _decode_fields(text: str) -> dict | None:
    s = text.strip()
    if "<unnamed>" in s:      # nsys spells the anonymous namespace <unnamed>
        s = s.replace("<unnamed>", "(anonymous namespace)")
    if not s:
        return None
    source = "bare"
    if s.startswith("_Z"):
        d = _demangle(s)
        if d is None:
            f = _sig.mangled_fields(s)
            if f is not None:
                f["source"] = "mangled"
                return f
            return _unknown(s, "mangled")
        s, source = d, "mangled"
    if s.startswith(("Memset", "Memcpy")):
        f = _helpers.helper_fields(s, (), False)
        if f is not None:
            return f
    if "<" in s or "(" in s:
        if source == "bare":
            source = "demangled"
        fname, args, truncated = _helpers.split_signature(s)
        if fname in _helpers.CUTLASS_WRAPPERS and args and _helpers._IDENT.fullmatch(args[0]):
            inner = args[0]
            g = _select(inner)
            extra = ("<truncated>",) if truncated and len(args) == 1 else ()
            if g is not None:
                return _decode_grammar(inner, source, g, extra)
            return _unknown(inner, source, extra, template_args=args)
        if fname in _helpers.CUTLASS_WRAPPERS and args:
            f = _sig.device_kernel_fields(s, truncated)
            f["source"] = source
            return f
        f = _helpers.helper_fields(fname, args, truncated)
        if f is not None:
            f.setdefault("source", source)
            return f
        f = _sig.signature_fields(fname, args, s, truncated)
        if f is not None:
            f.setdefault("source", source)
            return f
        if fname and _helpers._IDENT.fullmatch(fname):
            g = _select(fname)
            if g is not None:
                return _decode_grammar(fname, source, g, ("<truncated>",) if truncated else ())
        return _unknown(fname or s, source, template_args=args)
    g = _select(s)
    if g is not None:
        return _decode_grammar(s, source, g)
    f = _helpers.helper_fields(s, (), False)
    if f is not None:
        f["source"] = source
        return f
    f = _sig.signature_fields(s, (), s, False)
    if f is not None:
        f["source"] = source
        return f
    return _unknown(s, source)


def _strict_message(kn: KernelName) -> str:
    shown = kn.name if len(kn.name) <= 120 else kn.name[:117] + "..."
    if kn.family == "unknown":
        return (f"unknown kernel name {shown!r}: no grammar matches it; `cublaslt-probe grammars` lists "
                f"the known families (decode without --strict keeps it as family 'unknown')")
    left = ", ".join(kn.unparsed[:8]) + (", ..." if len(kn.unparsed) > 8 else "")
    return (f"kernel name {shown!r} is a {kn.family} name with tokens no rule understands: {left}; "
            f"`cublaslt-probe grammars {kn.family}` lists the known tokens")
