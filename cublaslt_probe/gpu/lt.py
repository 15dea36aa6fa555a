"""The small ctypes layer over the libcublasLt that torch or cupy has already loaded.

It must be the *same library instance* the framework uses: the heuristics cache, the logger and the
handles are per instance. So we never load a library of our own choosing: we look in /proc/self/maps
for the libcublasLt the process already mapped and dlopen that exact path, which returns the existing
handle. Call `ensure_loaded()` (one tiny torch matmul) first if nothing has touched cuBLAS yet.

Enum values: the ABI-stable ones (data types, compute types, attribute ids) are written here and
checked against `cublasLt.h` when the header can be found; the long, version-dependent tables (tiles,
stages, cluster shapes, inner shapes, epilogues, reduction schemes) come from the header only, so a new
cuBLAS never meets a stale table. Without a header, values are shown as numbers.

Nothing here is imported by the CPU side of the package.
"""
from __future__ import annotations

import ctypes
import glob
import logging
import os
import re
import statistics
import sys
import time
from dataclasses import dataclass, field
from functools import lru_cache

from cublaslt_probe.errors import CaptureError, error_text
from cublaslt_probe.vocab import WORKSPACE_BYTES

log = logging.getLogger(__name__)

# --- ABI-stable enum values (checked against the header when it is found) -----------------------------
CUDA_R = {"fp32": 0, "fp64": 1, "fp16": 2, "int8": 3, "int32": 10, "bf16": 14,
          "fp8_e4m3": 28, "fp8_e5m2": 29}
COMPUTE = {"CUBLAS_COMPUTE_16F": 64, "CUBLAS_COMPUTE_32F": 68, "CUBLAS_COMPUTE_32F_PEDANTIC": 69,
           "CUBLAS_COMPUTE_32F_FAST_16F": 74, "CUBLAS_COMPUTE_32F_FAST_16BF": 75,
           "CUBLAS_COMPUTE_32F_FAST_TF32": 77, "CUBLAS_COMPUTE_64F": 70, "CUBLAS_COMPUTE_32I": 72}
OP_N, OP_T = 0, 1
DESC = {"CUBLASLT_MATMUL_DESC_TRANSA": 3, "CUBLASLT_MATMUL_DESC_TRANSB": 4,
        "CUBLASLT_MATMUL_DESC_EPILOGUE": 7, "CUBLASLT_MATMUL_DESC_BIAS_POINTER": 8,
        "CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET": 15, "CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE": 26}
LAYOUT = {"CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT": 5, "CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET": 6}
PREF = {"CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES": 1, "CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES": 5,
        "CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES": 6, "CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES": 7,
        "CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES": 8}
# Algo config attributes: id, ctypes type (the size must match exactly).
CONFIG = {"id": (0, ctypes.c_int32), "tile": (1, ctypes.c_uint32), "split_k": (2, ctypes.c_int32),
          "reduction_scheme": (3, ctypes.c_uint32), "cta_swizzling": (4, ctypes.c_uint32),
          "custom_option": (5, ctypes.c_uint32), "stages": (6, ctypes.c_uint32),
          "inner_shape": (7, ctypes.c_uint16), "cluster": (8, ctypes.c_uint16)}
EPILOGUE_BIAS = 4

# Which header enum prefixes name the config values (id -> name tables come from the header).
_ENUM_PREFIX = {"tile": "CUBLASLT_MATMUL_TILE_", "stages": "CUBLASLT_MATMUL_STAGES_",
                "cluster": "CUBLASLT_CLUSTER_SHAPE_", "inner_shape": "CUBLASLT_MATMUL_INNER_SHAPE_",
                "reduction_scheme": "CUBLASLT_REDUCTION_SCHEME_", "epilogue": "CUBLASLT_EPILOGUE_"}


class cublasLtMatmulAlgo_t(ctypes.Structure):
    _fields_ = [("data", ctypes.c_uint64 * 8)]


class cublasLtMatmulHeuristicResult_t(ctypes.Structure):
    _fields_ = [("algo", cublasLtMatmulAlgo_t), ("workspaceSize", ctypes.c_size_t),
                ("state", ctypes.c_int), ("wavesCount", ctypes.c_float), ("reserved", ctypes.c_int * 4)]


LOGGER_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p)


# --- finding the library and its header --------------------------------------------------------------
def loaded_libraries(pattern: str = "libcublasLt.so") -> list[str]:
    """Paths of the shared objects matching `pattern` that this process has mapped, in map order."""
    paths: list[str] = []
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split(None, 5)
                if len(parts) == 6 and pattern in parts[5]:
                    p = parts[5].strip()
                    if p not in paths:
                        paths.append(p)
    except OSError:
        pass
    return paths


def ensure_loaded() -> None:
    """Make torch load cuBLAS/cuBLASLt (one tiny matmul) if nothing has yet."""
    if loaded_libraries():
        return
    import torch
    a = torch.ones(8, 8, device="cuda")
    (a @ a).sum().item()


def find_header(lib_path: str | None = None) -> str | None:
    """Locate cublasLt.h: $CUBLASLT_PROBE_HEADER, next to the loaded library, the pip wheel, CUDA_HOME."""
    cands = [os.environ.get("CUBLASLT_PROBE_HEADER", "")]
    if lib_path:
        d = os.path.dirname(os.path.realpath(lib_path))
        cands += [os.path.join(d, "..", "include", "cublasLt.h")]
    for p in sys.path:
        cands += glob.glob(os.path.join(p, "nvidia", "cu*", "include", "cublasLt.h"))
        cands += glob.glob(os.path.join(p, "nvidia", "cublas", "include", "cublasLt.h"))
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home:
            cands.append(os.path.join(home, "include", "cublasLt.h"))
    for c in cands:
        if c and os.path.isfile(c):
            return os.path.realpath(c)
    return None


_ENUM_RE = re.compile(r"^\s*(CUBLAS(?:LT)?_[A-Z0-9_x]+)\s*=\s*(-?(?:0x[0-9A-Fa-f]+|\d+))[uU]?\s*,?",
                      re.MULTILINE)


@lru_cache(maxsize=4)
def header_enums(path: str | None) -> dict[str, int]:
    """Every `NAME = number` enumerator of the header (names starting CUBLAS_ or CUBLASLT_)."""
    if not path:
        return {}
    with open(path, errors="replace") as f:
        text = f.read()
    return {m.group(1): int(m.group(2), 0) for m in _ENUM_RE.finditer(text)}


@dataclass
class Enums:
    """Enum tables: names by value for the config attributes, checked constants."""
    header: str | None
    values: dict[str, int]
    by_kind: dict[str, dict[int, str]] = field(default_factory=dict)

    @classmethod
    def load(cls, header: str | None) -> Enums:
        vals = header_enums(header)
        e = cls(header, vals)
        for kind, prefix in _ENUM_PREFIX.items():
            e.by_kind[kind] = {v: k[len(prefix):] for k, v in vals.items() if k.startswith(prefix)}
        for table in (COMPUTE, DESC, LAYOUT, PREF):
            for name, v in table.items():
                if name in vals and vals[name] != v:
                    raise CaptureError(f"cublasLt.h at {header} gives {name}={vals[name]}, this module "
                                       f"assumes {v}: update cublaslt_probe/gpu/lt.py for this cuBLAS version")
        return e

    def name(self, kind: str, value: int) -> str:
        """`tile`, 20 -> `128x128`; unknown values come back as the number in text."""
        return self.by_kind.get(kind, {}).get(int(value), str(int(value)))


# --- the library ----------------------------------------------------------------------------------------
def _check(status: int, what: str) -> None:
    if status != 0:
        raise CaptureError(f"{what} returned cublasStatus {status}")


class LtLibrary:
    """The libcublasLt instance already loaded in this process (see module doc)."""

    def __init__(self, path: str | None = None):
        if path is None:
            found = loaded_libraries()
            if not found:
                ensure_loaded()
                found = loaded_libraries()
            if not found:
                raise CaptureError("no libcublasLt is loaded in this process: run a torch or cupy GEMM "
                                   "first, or pass the library path")
            if len(found) > 1:
                log.warning("several libcublasLt instances are loaded (%s); using the first", found)
            path = found[0]
        self.path = path
        self.lib = ctypes.CDLL(path, mode=getattr(os, "RTLD_NOLOAD", 0) | ctypes.RTLD_GLOBAL)
        L = self.lib
        vp, sz = ctypes.c_void_p, ctypes.c_size_t
        L.cublasLtGetVersion.restype = sz
        L.cublasLtGetCudartVersion.restype = sz
        L.cublasLtCreate.argtypes = [ctypes.POINTER(vp)]
        L.cublasLtMatmulDescCreate.argtypes = [ctypes.POINTER(vp), ctypes.c_int, ctypes.c_int]
        L.cublasLtMatmulDescSetAttribute.argtypes = [vp, ctypes.c_int, vp, sz]
        L.cublasLtMatmulDescDestroy.argtypes = [vp]
        L.cublasLtMatrixLayoutCreate.argtypes = [ctypes.POINTER(vp), ctypes.c_int, ctypes.c_uint64,
                                                 ctypes.c_uint64, ctypes.c_int64]
        L.cublasLtMatrixLayoutSetAttribute.argtypes = [vp, ctypes.c_int, vp, sz]
        L.cublasLtMatrixLayoutDestroy.argtypes = [vp]
        L.cublasLtMatmulPreferenceCreate.argtypes = [ctypes.POINTER(vp)]
        L.cublasLtMatmulPreferenceSetAttribute.argtypes = [vp, ctypes.c_int, vp, sz]
        L.cublasLtMatmulPreferenceDestroy.argtypes = [vp]
        L.cublasLtMatmulAlgoGetHeuristic.argtypes = [vp, vp, vp, vp, vp, vp, vp, ctypes.c_int,
                                                     ctypes.POINTER(cublasLtMatmulHeuristicResult_t),
                                                     ctypes.POINTER(ctypes.c_int)]
        L.cublasLtMatmulAlgoConfigGetAttribute.argtypes = [ctypes.POINTER(cublasLtMatmulAlgo_t), ctypes.c_int,
                                                           vp, sz, ctypes.POINTER(sz)]
        L.cublasLtMatmulAlgoConfigSetAttribute.argtypes = [ctypes.POINTER(cublasLtMatmulAlgo_t), ctypes.c_int,
                                                           vp, sz]
        L.cublasLtMatmulAlgoInit.argtypes = [vp, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                             ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                             ctypes.POINTER(cublasLtMatmulAlgo_t)]
        L.cublasLtMatmul.argtypes = [vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp,
                                     ctypes.POINTER(cublasLtMatmulAlgo_t), vp, sz, vp]
        L.cublasLtMatmulAlgoCheck.argtypes = [vp, vp, vp, vp, vp, vp, ctypes.POINTER(cublasLtMatmulAlgo_t),
                                              ctypes.POINTER(cublasLtMatmulHeuristicResult_t)]
        L.cublasLtMatmulAlgoGetIds.argtypes = [vp, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                               ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                               ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int)]
        L.cublasLtMatmulAlgoCapGetAttribute.argtypes = [ctypes.POINTER(cublasLtMatmulAlgo_t), ctypes.c_int,
                                                        vp, sz, ctypes.POINTER(sz)]
        L.cublasLtHeuristicsCacheGetCapacity.argtypes = [ctypes.POINTER(sz)]
        L.cublasLtHeuristicsCacheSetCapacity.argtypes = [sz]
        L.cublasLtLoggerSetCallback.argtypes = [LOGGER_CALLBACK]
        L.cublasLtLoggerSetLevel.argtypes = [ctypes.c_int]
        L.cublasLtLoggerSetMask.argtypes = [ctypes.c_int]
        L.cublasLtLoggerOpenFile.argtypes = [ctypes.c_char_p]
        self.enums = Enums.load(find_header(path))
        self._handle = None
        self._configs: dict[bytes, dict] = {}   # algo_config: the algo's bytes -> its config

    # versions and handle
    @property
    def version(self) -> int:
        return int(self.lib.cublasLtGetVersion())

    @property
    def version_str(self) -> str:
        v = self.version  # e.g. 130100 -> 13.1.0 (major*10000 + minor*100 + patch)
        return f"{v // 10000}.{(v // 100) % 100}.{v % 100}"

    @property
    def handle(self):
        if self._handle is None:
            h = ctypes.c_void_p()
            _check(self.lib.cublasLtCreate(ctypes.byref(h)), "cublasLtCreate")
            self._handle = h
        return self._handle

    # heuristics cache
    def cache_capacity(self) -> int:
        c = ctypes.c_size_t()
        _check(self.lib.cublasLtHeuristicsCacheGetCapacity(ctypes.byref(c)), "cublasLtHeuristicsCacheGetCapacity")
        return int(c.value)

    def set_cache_capacity(self, n: int) -> None:
        _check(self.lib.cublasLtHeuristicsCacheSetCapacity(n), "cublasLtHeuristicsCacheSetCapacity")

    # algo config
    def algo_config(self, algo: cublasLtMatmulAlgo_t) -> dict:
        """The config attributes of an algo, with enum names from the header (a new dict each call). Read once
        per algo (`read_algo_config`: nine library calls, a large share of the lt backend's build) and kept
        by the algo's bytes, which are all the library reads them from; a sweep's lt GEMMs run far fewer
        algos than GEMMs."""
        key = bytes(algo)
        cfg = self._configs.get(key)
        if cfg is None:
            cfg = self._configs[key] = self.read_algo_config(algo)
        return dict(cfg)

    def read_algo_config(self, algo: cublasLtMatmulAlgo_t) -> dict:
        """`algo_config` read from the library, not kept."""
        out: dict = {}
        for key, (attr, ctype) in CONFIG.items():
            buf = ctype()
            written = ctypes.c_size_t()
            st = self.lib.cublasLtMatmulAlgoConfigGetAttribute(ctypes.byref(algo), attr, ctypes.byref(buf),
                                                               ctypes.sizeof(buf), ctypes.byref(written))
            out[key] = int(buf.value) if st == 0 else None
        cfg = {"algo_id": out["id"], "split_k": out["split_k"], "custom_option": out["custom_option"],
               "cta_swizzling": out["cta_swizzling"]}
        for kind in ("tile", "stages", "cluster", "inner_shape", "reduction_scheme"):
            v = out[kind]
            cfg[f"{kind}_enum"] = v
            cfg[kind] = None if v is None else self.enums.name(kind, v)
        return cfg


def pinned_algo(lib: LtLibrary, p: Problem, algo_id: int, config: dict) -> cublasLtMatmulAlgo_t:
    """`cublasLtMatmulAlgoInit` for the problem's types, then the config attributes by header enum name:
    config keys tile ("256x128"), stages ("64xAUTO"), cluster ("1x2x1"), split_k, reduction_scheme
    ("COMPUTE_TYPE"), custom_option, cta_swizzling. Missing keys keep the algo's defaults."""
    ab, cd, compute, scale = DTYPE_SPEC[p.dtype]
    algo = cublasLtMatmulAlgo_t()
    st = lib.lib.cublasLtMatmulAlgoInit(lib.handle, COMPUTE[compute], CUDA_R[scale], CUDA_R[ab],
                                        CUDA_R[p.b_type or ab], CUDA_R[cd], CUDA_R[cd], int(algo_id),
                                        ctypes.byref(algo))
    _check(st, f"cublasLtMatmulAlgoInit(algoId={algo_id})")
    for key, value in config.items():
        if value is None or key not in CONFIG:
            continue
        attr, ctype = CONFIG[key]
        if key in _ENUM_PREFIX:
            full = _ENUM_PREFIX[key] + str(value)
            if full not in lib.enums.values:
                raise CaptureError(f"{key}={value!r}: {full} is not in this library's cublasLt.h "
                                   f"({lib.enums.header or 'no header found'})")
            value = lib.enums.values[full]
        buf = ctype(int(value))
        st = lib.lib.cublasLtMatmulAlgoConfigSetAttribute(ctypes.byref(algo), attr, ctypes.byref(buf),
                                                          ctypes.sizeof(buf))
        _check(st, f"cublasLtMatmulAlgoConfigSetAttribute({key}={value})")
    return algo


def algo_ids(lib: LtLibrary, p: Problem, requested: int = 1024) -> list[int]:
    """`cublasLtMatmulAlgoGetIds` for the problem's types: every algo id the library offers for them."""
    ab, cd, compute, scale = DTYPE_SPEC[p.dtype]
    ids = (ctypes.c_int * requested)()
    n = ctypes.c_int()
    _check(lib.lib.cublasLtMatmulAlgoGetIds(lib.handle, COMPUTE[compute], CUDA_R[scale], CUDA_R[ab],
                                            CUDA_R[p.b_type or ab], CUDA_R[cd], CUDA_R[cd], requested, ids,
                                            ctypes.byref(n)), "cublasLtMatmulAlgoGetIds")
    return [int(ids[i]) for i in range(n.value)]


# The element type of each capability attribute (cublasLt.h's comments): arrays are read whole.
CAP_TYPES = {"SPLITK_SUPPORT": ctypes.c_int32, "REDUCTION_SCHEME_MASK": ctypes.c_uint32,
             "CTA_SWIZZLING_SUPPORT": ctypes.c_uint32, "STRIDED_BATCH_SUPPORT": ctypes.c_int32,
             "OUT_OF_PLACE_RESULT_SUPPORT": ctypes.c_int32, "TILE_IDS": ctypes.c_uint32,
             "CUSTOM_OPTION_MAX": ctypes.c_int32, "EPILOGUE_MASK": ctypes.c_uint32,
             "STAGES_IDS": ctypes.c_uint32, "CLUSTER_SHAPE_IDS": ctypes.c_uint16,
             "MIN_ALIGNMENT_A_BYTES": ctypes.c_uint32, "MIN_ALIGNMENT_B_BYTES": ctypes.c_uint32,
             "MIN_ALIGNMENT_C_BYTES": ctypes.c_uint32, "MIN_ALIGNMENT_D_BYTES": ctypes.c_uint32}


def algo_caps(lib: LtLibrary, algo: cublasLtMatmulAlgo_t) -> dict:
    """`cublasLtMatmulAlgoCapGetAttribute` of an initialised algo, by the header's CUBLASLT_ALGO_CAP_ names:
    scalars as int, id arrays (TILE_IDS, STAGES_IDS, CLUSTER_SHAPE_IDS) as lists; an attribute this library
    lacks or refuses is None."""
    out: dict = {}
    for name, ctype in CAP_TYPES.items():
        attr = lib.enums.values.get("CUBLASLT_ALGO_CAP_" + name)
        if attr is None:
            out[name] = None
            continue
        written = ctypes.c_size_t()
        if name.endswith("_IDS"):
            st = lib.lib.cublasLtMatmulAlgoCapGetAttribute(ctypes.byref(algo), attr, None, 0, ctypes.byref(written))
            count = int(written.value) // ctypes.sizeof(ctype)
            if st != 0 or count == 0:
                out[name] = [] if st == 0 else None
                continue
            buf = (ctype * count)()
            st = lib.lib.cublasLtMatmulAlgoCapGetAttribute(ctypes.byref(algo), attr, buf, ctypes.sizeof(buf),
                                                           ctypes.byref(written))
            out[name] = [int(x) for x in buf] if st == 0 else None
        else:
            buf = ctype()
            st = lib.lib.cublasLtMatmulAlgoCapGetAttribute(ctypes.byref(algo), attr, ctypes.byref(buf),
                                                           ctypes.sizeof(buf), ctypes.byref(written))
            out[name] = int(buf.value) if st == 0 else None
    return out


def init_algo(lib: LtLibrary, p: Problem, algo_id: int) -> cublasLtMatmulAlgo_t:
    """`cublasLtMatmulAlgoInit` of `algo_id` for the problem's types (the algo's default config)."""
    return pinned_algo(lib, p, algo_id, {})


def set_config_values(lib: LtLibrary, algo: cublasLtMatmulAlgo_t, values: dict) -> int:
    """Set config attributes by raw value (`CONFIG` keys: tile, stages, cluster as enum numbers); returns
    the first non-zero cublasStatus, else 0 (the caller decides whether a refused value is an error)."""
    for key, value in values.items():
        if value is None:
            continue
        attr, ctype = CONFIG[key]
        buf = ctype(int(value))
        st = lib.lib.cublasLtMatmulAlgoConfigSetAttribute(ctypes.byref(algo), attr, ctypes.byref(buf),
                                                          ctypes.sizeof(buf))
        if st:
            return int(st)
    return 0


def algo_check(mm: LtMatmul, algo: cublasLtMatmulAlgo_t) -> tuple[int, cublasLtMatmulHeuristicResult_t]:
    """`cublasLtMatmulAlgoCheck` of `algo` on the problem's descriptors: (cublasStatus, result); status 0
    means the library accepts the config for this problem (result.workspaceSize: what it needs)."""
    res = cublasLtMatmulHeuristicResult_t()
    st = mm.lib.lib.cublasLtMatmulAlgoCheck(mm.lib.handle, mm.op, mm.a, mm.b, mm.c, mm.c, ctypes.byref(algo),
                                            ctypes.byref(res))
    return int(st), res


class Logger:
    """In-process cuBLASLt logger through `cublasLtLoggerSetCallback` (takes effect after the library is initialised).

    The callback gets (level, function, message); we keep them with a host timestamp. `lines()` renders
    them in the library's own line format so the same parser reads both (the file/stdout form is
    `[time][cublasLt][pid][Level][function] message`).
    """

    LEVEL_NAMES = {1: "Error", 2: "Trace", 3: "Hints", 4: "Info", 5: "Api"}

    def __init__(self, lib: LtLibrary, sink_file: str = os.devnull):
        self.lib = lib
        self.records: list[tuple[float, int, str, str]] = []
        self._cb = LOGGER_CALLBACK(self._on_message)  # keep a reference: ctypes callbacks must outlive use
        _check(lib.lib.cublasLtLoggerSetCallback(self._cb), "cublasLtLoggerSetCallback")
        # Send the library's own printing to a file (else it goes to stdout); the callback still fires.
        _check(lib.lib.cublasLtLoggerOpenFile(sink_file.encode()), "cublasLtLoggerOpenFile")
        self.level = 0
        self.set_level(0)

    def _on_message(self, level, func, msg):
        self.records.append((time.time(), int(level), (func or b"").decode(errors="replace"),
                             (msg or b"").decode(errors="replace")))

    def set_level(self, level: int) -> None:
        _check(self.lib.lib.cublasLtLoggerSetLevel(level), "cublasLtLoggerSetLevel")
        self.level = level

    def take(self) -> list[tuple[float, int, str, str]]:
        out, self.records = self.records, []
        return out

    @staticmethod
    def render(recs) -> list[str]:
        pid = os.getpid()
        out = []
        for t, level, func, msg in recs:
            ts = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))
            out.append(f"[{ts}][cublasLt][{pid}][{Logger.LEVEL_NAMES.get(level, level)}][{func}] {msg}")
        return out


# --- one cuBLASLt problem ---------------------------------------------------------------------------------
DTYPE_SPEC = {
    # dtype: (A/B type, C/D type, compute type, scale type)
    "fp32": ("fp32", "fp32", "CUBLAS_COMPUTE_32F", "fp32"),
    "tf32": ("fp32", "fp32", "CUBLAS_COMPUTE_32F_FAST_TF32", "fp32"),
    "fp16": ("fp16", "fp16", "CUBLAS_COMPUTE_32F", "fp32"),
    "bf16": ("bf16", "bf16", "CUBLAS_COMPUTE_32F", "fp32"),
    "fp8": ("fp8_e4m3", "bf16", "CUBLAS_COMPUTE_32F", "fp32"),
    "fp8_e5m2": ("fp8_e5m2", "bf16", "CUBLAS_COMPUTE_32F", "fp32"),
}


@dataclass
class Problem:
    """A column-major cuBLASLt problem D = op(A)·op(B) (+ bias), as cuBLAS sees it."""
    m: int
    n: int
    k: int
    dtype: str = "bf16"
    trans_a: str = "N"
    trans_b: str = "N"
    batch: int = 1
    bias: bool = False
    workspace_bytes: int = WORKSPACE_BYTES["lt"]
    alignment: int = 16
    # for fp8 the B type may differ from A (e4m3 x e5m2); None = same as A
    b_type: str | None = None
    # leading dimensions (elements); None = the stored rows (packed)
    lda: int | None = None
    ldb: int | None = None
    ldc: int | None = None
    # the SM count the kernel is chosen for (the cuBLAS API sets it: `smCountTarget` in its log line); None: unset
    sm_count: int | None = None

    def key(self) -> tuple:
        """The problem as a tuple of its fields, in order (what `dataclasses.astuple` gives for these flat
        fields, at a tenth of its cost): the probe's key of a heuristic question."""
        return tuple(self.__dict__.values())

    def shapes(self):
        """Stored (rows, cols) of A, B, C in column-major order."""
        a = (self.m, self.k) if self.trans_a == "N" else (self.k, self.m)
        b = (self.k, self.n) if self.trans_b == "N" else (self.n, self.k)
        return a, b, (self.m, self.n)


def time_heuristics(lib: LtLibrary, mms: list, reps: int = 5, requested: int = 1) -> list[tuple[float, float]]:
    """For each LtMatmul: (miss_us, hit_us), the median host time of `cublasLtMatmulAlgoGetHeuristic` with the
    library's heuristics cache off (every call a miss), then on and warm (every call a hit).

    The cache capacity is process-wide for this library instance (torch's calls share it): it is switched
    off once for all the problems, then restored, so a window of GEMMs disturbs torch's cache once."""
    def median_us(mm):
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter_ns()
            mm.heuristic(requested)
            ts.append((time.perf_counter_ns() - t0) / 1e3)
        return statistics.median(ts)
    cap = lib.cache_capacity()
    try:
        lib.set_cache_capacity(0)
        miss = [median_us(mm) for mm in mms]
        lib.set_cache_capacity(cap or 8192)
        for mm in mms:
            mm.heuristic(requested)  # fill the cache
        hit = [median_us(mm) for mm in mms]
    finally:
        lib.set_cache_capacity(cap)
    return list(zip(miss, hit))


def measure_heuristics(lib: LtLibrary, problems: list, reps: int = 5) -> list[tuple]:
    """For each Problem: (miss_us, hit_us, error), `time_heuristics` over all of them at once; a problem whose
    descriptors cannot be made, or for which the heuristic finds no algo, gets (None, None, its error) and
    the others are still measured (one by one once the batch has failed)."""
    out: list = [None] * len(problems)
    mms, idx = [], []
    for i, p in enumerate(problems):
        try:
            mms.append(LtMatmul(lib, p))
            idx.append(i)
        except Exception as e:  # noqa: BLE001  (e.g. a type combination the direct call refuses)
            out[i] = (None, None, error_text(e))
    try:
        try:
            for i, (miss, hit) in zip(idx, time_heuristics(lib, mms, reps)):
                out[i] = (miss, hit, None)
        except Exception:  # noqa: BLE001  (no algo for one problem: time them one by one)
            for i, mm in zip(idx, mms):
                try:
                    out[i] = (*mm.time_heuristic(reps), None)
                except Exception as e:  # noqa: BLE001
                    out[i] = (None, None, error_text(e))
    finally:
        for mm in mms:
            mm.close()
    return out


def set_up(lib: LtLibrary, dtypes=None) -> list[str]:
    """Pay the library's one-time set-ups now: one small heuristic question per dtype (`DTYPE_SPEC`; those of
    `dtypes` when given). The first question of each type pays a set-up of its own whichever path asks it, tens of
    milliseconds, far more than a later GEMM's new kernel costs (docs/decisions.md, "The library's
    set-ups"). Nothing is launched and no kernel is loaded. Returns the dtypes whose question the library refused (their
    set-up is left to their
    first GEMM)."""
    refused = []
    for d in dtypes or DTYPE_SPEC:
        try:
            with LtMatmul(lib, Problem(16, 16, 16, dtype=d, trans_a="T")) as mm:
                mm.heuristic(1)
        except Exception:  # noqa: BLE001  (a type this library does not offer)
            refused.append(d)
    return refused


def serve_heuristics(conn, cpu: int | None = None, path: str | None = None) -> None:
    """The heuristic companion's loop (a process of its own, started by the probe): load cuBLASLt — the library
    file at `path` (the one the probe's process loaded, through ctypes: no torch to import), else as torch
    loads it — then answer requests until told to stop. A request is (ident, Problem, reps); the requests waiting
    when one arrives are measured together (`measure_heuristics`: one switch of this process's cache for
    all of them) and answered as [(ident, miss_us, hit_us, error, busy_s)], busy_s the measurement's share of
    this process's time. None stops it. The first message sent is ("ready", library path) or ("failed", why).
    `cpu`: the logical CPU to run on (the probe gives it a physical core of its own).

    Its own library instance and cache: switching the cache off to time misses leaves the probe's (and torch's)
    cache alone, and the measurement runs on another core while the probe times GEMMs."""
    try:
        if cpu is not None:
            os.sched_setaffinity(0, {cpu})
        lib = None
        if path:
            try:
                ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
                lib = LtLibrary(path)
            except OSError as e:   # its dependencies not found outside torch's process: load it as torch does
                log.warning("the heuristic companion could not load %s by itself (%s); loading it through torch",
                            path, e)
        if lib is None:
            ensure_loaded()
            lib = LtLibrary()
        set_up(lib)   # the library's set-ups before "ready": the probe's start-up waits for it, not its first window
        conn.send(("ready", lib.path))
    except Exception as e:  # noqa: BLE001
        conn.send(("failed", error_text(e)))
        return
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            return
        batch = [msg]
        while conn.poll():
            nxt = conn.recv()
            if nxt is None:
                return
            batch.append(nxt)
        t = time.perf_counter()
        by_reps: dict[int, list] = {}
        for ident, p, reps in batch:
            by_reps.setdefault(reps, []).append((ident, p))
        answers = []
        for reps, items in by_reps.items():
            res = measure_heuristics(lib, [p for _, p in items], reps)
            answers += [(ident, *r) for (ident, _), r in zip(items, res)]
        busy = (time.perf_counter() - t) / len(answers)
        conn.send([(*a, busy) for a in answers])


class LtMatmul:
    """Descriptors for one Problem on one library; query heuristics, run an algo. Call close() after."""

    def __init__(self, lib: LtLibrary, p: Problem):
        if p.dtype not in DTYPE_SPEC:
            raise CaptureError(f"dtype {p.dtype!r} is not one the lt backend knows: {sorted(DTYPE_SPEC)}")
        self.lib, self.p = lib, p
        L = lib.lib
        ab, cd, compute, scale = DTYPE_SPEC[p.dtype]
        self._objs: list[tuple] = []
        self.op = ctypes.c_void_p()
        _check(L.cublasLtMatmulDescCreate(ctypes.byref(self.op), COMPUTE[compute], CUDA_R[scale]),
               "cublasLtMatmulDescCreate")
        self._objs.append((L.cublasLtMatmulDescDestroy, self.op))
        self._set(L.cublasLtMatmulDescSetAttribute, self.op, DESC["CUBLASLT_MATMUL_DESC_TRANSA"],
                  ctypes.c_int32(OP_T if p.trans_a == "T" else OP_N))
        self._set(L.cublasLtMatmulDescSetAttribute, self.op, DESC["CUBLASLT_MATMUL_DESC_TRANSB"],
                  ctypes.c_int32(OP_T if p.trans_b == "T" else OP_N))
        if p.bias:
            self._set(L.cublasLtMatmulDescSetAttribute, self.op, DESC["CUBLASLT_MATMUL_DESC_EPILOGUE"],
                      ctypes.c_uint32(EPILOGUE_BIAS))
            if ab.startswith("fp8"):
                self._set(L.cublasLtMatmulDescSetAttribute, self.op, DESC["CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE"],
                          ctypes.c_int32(CUDA_R[cd]))
        if p.sm_count is not None:
            self._set(L.cublasLtMatmulDescSetAttribute, self.op, DESC["CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET"],
                      ctypes.c_int32(p.sm_count))
        (ar, ac), (br, bc), (cr, cc) = p.shapes()
        self.a = self._layout(CUDA_R[ab], ar, ac, p.batch, p.lda)
        self.b = self._layout(CUDA_R[p.b_type or ab], br, bc, p.batch, p.ldb)
        self.c = self._layout(CUDA_R[cd], cr, cc, p.batch, p.ldc)
        self.pref = ctypes.c_void_p()
        _check(L.cublasLtMatmulPreferenceCreate(ctypes.byref(self.pref)), "cublasLtMatmulPreferenceCreate")
        self._objs.append((L.cublasLtMatmulPreferenceDestroy, self.pref))
        self._set(L.cublasLtMatmulPreferenceSetAttribute, self.pref,
                  PREF["CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES"], ctypes.c_uint64(p.workspace_bytes))
        for x in "ABCD":
            self._set(L.cublasLtMatmulPreferenceSetAttribute, self.pref,
                      PREF[f"CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_{x}_BYTES"], ctypes.c_uint32(p.alignment))

    def _set(self, fn, obj, attr, value):
        st = fn(obj, attr, ctypes.byref(value), ctypes.sizeof(value))
        if st:   # the message only on failure: a descriptor takes a dozen of these, some on the prewarm thread
            _check(st, f"{fn.__name__}({attr})")

    def _layout(self, dtype, rows, cols, batch, ld=None):
        L = self.lib.lib
        h = ctypes.c_void_p()
        ld = ld or rows
        _check(L.cublasLtMatrixLayoutCreate(ctypes.byref(h), dtype, rows, cols, ld), "cublasLtMatrixLayoutCreate")
        self._objs.append((L.cublasLtMatrixLayoutDestroy, h))
        if batch > 1:
            self._set(L.cublasLtMatrixLayoutSetAttribute, h, LAYOUT["CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT"],
                      ctypes.c_int32(batch))
            self._set(L.cublasLtMatrixLayoutSetAttribute, h, LAYOUT["CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET"],
                      ctypes.c_int64(ld * cols))
        return h

    def set_pointers(self, bias=None):
        if bias is not None:
            self._set(self.lib.lib.cublasLtMatmulDescSetAttribute, self.op, DESC["CUBLASLT_MATMUL_DESC_BIAS_POINTER"],
                      ctypes.c_void_p(bias))

    def heuristic(self, requested: int = 1) -> list[cublasLtMatmulHeuristicResult_t]:
        res = (cublasLtMatmulHeuristicResult_t * requested)()
        n = ctypes.c_int()
        st = self.lib.lib.cublasLtMatmulAlgoGetHeuristic(self.lib.handle, self.op, self.a, self.b, self.c, self.c,
                                                         self.pref, requested, res, ctypes.byref(n))
        _check(st, "cublasLtMatmulAlgoGetHeuristic")
        return [res[i] for i in range(n.value)]

    def time_heuristic(self, reps: int = 20, requested: int = 1) -> tuple[float, float]:
        """(miss_us, hit_us): median host time of the heuristic call with the cache off, then on."""
        return time_heuristics(self.lib, [self], reps, requested)[0]

    def launcher(self, algo, a_ptr, b_ptr, c_ptr, workspace_ptr, workspace_bytes, stream,
                 alpha=1.0, beta=0.0, d_ptr=None):
        """A zero-argument launch of `cublasLtMatmul` with these arguments, converted to ctypes once here:
        converting them on every call cost the host more than the library's own launch did."""
        al, be = ctypes.c_float(alpha), ctypes.c_float(beta)
        args = (self.lib.handle, self.op, ctypes.byref(al), ctypes.c_void_p(a_ptr), self.a, ctypes.c_void_p(b_ptr),
                self.b, ctypes.byref(be), ctypes.c_void_p(c_ptr), self.c, ctypes.c_void_p(d_ptr or c_ptr), self.c,
                ctypes.byref(algo) if algo is not None else None, ctypes.c_void_p(workspace_ptr), workspace_bytes,
                ctypes.c_void_p(stream))
        fn = self.lib.lib.cublasLtMatmul

        def launch():
            st = fn(*args)
            if st:
                _check(st, "cublasLtMatmul")
        return launch

    def run(self, algo, a_ptr, b_ptr, c_ptr, workspace_ptr, workspace_bytes, stream,
            alpha=1.0, beta=0.0, d_ptr=None) -> None:
        self.launcher(algo, a_ptr, b_ptr, c_ptr, workspace_ptr, workspace_bytes, stream, alpha, beta, d_ptr)()

    def close(self):
        for destroy, h in reversed(self._objs):
            destroy(h)
        self._objs = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
