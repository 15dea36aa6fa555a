"""A small ctypes layer over the libcupti that torch ships: what the CUDA driver and the GPU were seen doing.

`Activity` (CUPTI's activity API) records what the GPU ran between its start and its stop: each kernel, memset
and memcpy with its name and GPU start/end, named as torch.profiler names them. It is the probe's kernel capture.

`Recorder` (one CUPTI callback subscriber) records, with host timestamps (`time.perf_counter_ns`):

- every module the driver loads (resource callback ``CUPTI_CBID_RESOURCE_MODULE_LOADED``): its id, the size
  of the loaded image, whether it is an ELF cubin, and the kernels it holds (the ``.text.<kernel>`` section
  names of the ELF, read from its section headers only);
- the driver calls that load, link or allocate (``cuModuleLoad*``, ``cuLibraryLoad*``, ``cuLink*``,
  ``cuMemAlloc*``, ``cuMemCreate``, ``cuMemMap``, ...): entry and exit time, the return code, and for the
  loaders the kind of image handed over (``cubin`` ELF, ``fatbin``, ``ptx`` text), its size and the shared
  object that made the call (`CallStack`); for the linker the input type (PTX, cubin, fatbin, LTO-IR, ...).

Layouts (CUPTI's ``cupti_callbacks.h``, the driver's ``generated_cuda_meta.h``):
``CUpti_CallbackData {int callbackSite; const char *functionName; const void *functionParams;
void *functionReturnValue; const char *symbolName; CUcontext context; uint32_t contextUid;
uint64_t *correlationData; uint32_t correlationId}``; ``CUpti_ResourceData {CUcontext context;
union {CUstream} resourceHandle; void *resourceDescriptor}``; ``CUpti_ModuleResourceData {uint32_t moduleId;
size_t cubinSize; const char *pCubin}``; ``cuModuleLoadData_params {CUmodule *module; const void *image}``
(``cuModuleLoadDataEx``, ``cuModuleLoadFatBinary`` and ``cuLibraryLoadData`` keep the image second too);
``cuModuleLoad_params {CUmodule *module; const char *fname}`` (``cuLibraryLoadFromFile`` alike);
``cuLinkAddData_v2_params {CUlinkState state; CUjitInputType type; void *data; size_t size; ...}``.
Callback ids of the driver domain are not written here: they are looked up by name in the installed CUPTI
(``cuptiGetCallbackName``), so a newer CUPTI never meets a stale table.

Activity records (``cupti_activity.h``; packed, 8-byte aligned; fields only ever appended between versions):
kernel (``CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL``, ``CUpti_ActivityKernel4`` onwards): ``kind`` at 0,
``start``/``end`` (ns, u64) at 16/24, ``name`` (const char *) at 104; memcpy (``CUpti_ActivityMemcpy5``): ``kind``,
then ``copyKind``, ``srcKind``, ``dstKind`` (u8) at 4/5/6, ``start``/``end`` at 16/24; memset
(``CUpti_ActivityMemset4``): ``start``/``end`` at 16/24, ``memoryKind`` (u16) at 50.

Only one CUPTI subscriber may exist in a process: a torch.profiler session cannot run while a `Recorder` is on.
The activity API's buffer callbacks are one pair per process too: `Activity` registers its own at every start
(torch.profiler registers its own at each of its sessions), so the two take turns but never overlap.
Nothing here is imported by the CPU side of the package.
"""
from __future__ import annotations

import ctypes
import glob
import logging
import os
import struct
import sys
import threading
import time

from cublaslt_probe.errors import CaptureError, error_text

log = logging.getLogger(__name__)

DOMAIN_DRIVER_API = 1
DOMAIN_RESOURCE = 3
CBID_RESOURCE_MODULE_LOADED = 6
API_ENTER, API_EXIT = 0, 1

# CUjitInputType (cuda.h)
JIT_INPUT = {0: "cubin", 1: "ptx", 2: "fatbin", 3: "object", 4: "library", 5: "lto-ir"}

# Driver calls watched, by what they do. Names without a version suffix match every versioned entry point
# (`cuLinkAddData` also matches `cuLinkAddData_v2`, `cuMemAlloc` also `cuMemAlloc_v2`).
WATCH = {
    "load": ("cuModuleLoad", "cuModuleLoadData", "cuModuleLoadDataEx", "cuModuleLoadFatBinary",
             "cuLibraryLoadData", "cuLibraryLoadFromFile"),
    "link": ("cuLinkCreate", "cuLinkAddData", "cuLinkAddFile", "cuLinkComplete"),
    "alloc": ("cuMemAlloc", "cuMemAllocManaged", "cuMemAllocAsync", "cuMemAllocFromPoolAsync", "cuMemCreate",
              "cuMemMap", "cuMemAddressReserve", "cuMemSetAccess", "cuMemFree", "cuMemUnmap", "cuMemRelease",
              "cuMemAddressFree"),
}
_IMAGE_SECOND = {"cuModuleLoadData", "cuModuleLoadDataEx", "cuModuleLoadFatBinary", "cuLibraryLoadData"}
_PATH_SECOND = {"cuModuleLoad", "cuLibraryLoadFromFile"}
MAX_KERNELS_PER_MODULE = 64

CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p)


class CallbackData(ctypes.Structure):
    _fields_ = [("callbackSite", ctypes.c_int), ("functionName", ctypes.c_char_p),
                ("functionParams", ctypes.c_void_p), ("functionReturnValue", ctypes.c_void_p),
                ("symbolName", ctypes.c_char_p), ("context", ctypes.c_void_p), ("contextUid", ctypes.c_uint32),
                ("correlationData", ctypes.c_void_p), ("correlationId", ctypes.c_uint32)]


class ResourceData(ctypes.Structure):
    _fields_ = [("context", ctypes.c_void_p), ("resourceHandle", ctypes.c_void_p),
                ("resourceDescriptor", ctypes.c_void_p)]


class ModuleResourceData(ctypes.Structure):
    _fields_ = [("moduleId", ctypes.c_uint32), ("cubinSize", ctypes.c_size_t), ("pCubin", ctypes.c_void_p)]


def base_name(name: str) -> str:
    """`cuLinkAddData_v2` -> `cuLinkAddData`; `cuMemAlloc_v2` -> `cuMemAlloc`; `_ptsz`/`_ptds` dropped too."""
    for suffix in ("_ptsz", "_ptds"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    head, _, tail = name.rpartition("_v")
    return head if head and tail.isdigit() else name


def image_kind(head: bytes) -> str:
    """What a loader was handed, from its first bytes: cubin (ELF), fatbin, ptx (text) or unknown."""
    if head[:4] == b"\x7fELF":
        return "cubin"
    if head[:4] in (b"\x50\xed\x55\xba", b"\xb1\x43\x62\x46"):  # fatbin data, __fatBinC_Wrapper_t
        return "fatbin"
    text = head.lstrip()
    if text[:2] == b"//" or text[:1] == b"." or b".version" in head:
        return "ptx"
    return "unknown"


def elf_size(head: bytes) -> int | None:
    """The size of a 64-bit ELF image from its first 64 bytes: where its last header table ends — the section
    headers (``e_shoff``, ``e_shnum`` x ``e_shentsize``) or the program headers after them, as a cubin lays them
    out (``e_phoff``, ``e_phnum`` x ``e_phentsize``); None for anything else."""
    if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2:
        return None
    phoff, shoff = struct.unpack_from("<QQ", head, 0x20)
    phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", head, 0x36)
    end = max(shoff + shnum * shentsize if shoff else 0, phoff + phnum * phentsize if phoff else 0)
    return end or None


def elf_kernels(read, limit: int = MAX_KERNELS_PER_MODULE) -> tuple[list[str], int]:
    """Kernel names of an ELF cubin from its section names (``.text.<name>``), reading only the headers.

    `read(offset, size)` returns bytes of the image. Returns (names, total count)."""
    hdr = read(0, 64)
    if len(hdr) < 64 or hdr[:4] != b"\x7fELF" or hdr[4] != 2:  # ELFCLASS64
        return [], 0
    shoff, = struct.unpack_from("<Q", hdr, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", hdr, 0x3A)
    if not shoff or shentsize < 64 or not 0 < shnum < 1 << 16 or shstrndx >= shnum:
        return [], 0
    table = read(shoff, shnum * shentsize)
    strtab_off, strtab_size = struct.unpack_from("<QQ", table, shstrndx * shentsize + 0x18)
    if strtab_size > 1 << 24:
        return [], 0
    strtab = read(strtab_off, strtab_size)
    names = []
    for i in range(shnum):
        name_off, = struct.unpack_from("<I", table, i * shentsize)
        end = strtab.find(b"\0", name_off)
        sec = strtab[name_off:end if end >= 0 else None].decode(errors="replace")
        if sec.startswith(".text."):
            names.append(sec[len(".text."):])
    return names[:limit], len(names)


class Dl_info(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p), ("dli_sname", ctypes.c_char_p),
                ("dli_saddr", ctypes.c_void_p)]


# the frames of a driver call seen from inside its callback: the driver's and CUPTI's, then whoever called it
_DRIVER_FRAMES = ("libcuda.so", "libcupti")


class CallStack:
    """Who made a driver call, seen from inside its callback: `caller()` is the shared object of the first frame
    past the driver's and CUPTI's on the C stack (glibc's backtrace and dladdr). A load call made by a library
    that ships its kernels (cuBLASLt unpacking one of its own) is told apart by it from one made by a compiler
    loading what it has just made (XLA, Numba, CuPy): both hand the driver an image in the process's memory."""

    def __init__(self):
        libc = ctypes.CDLL(None)
        self._backtrace, self._dladdr = libc.backtrace, libc.dladdr
        self._backtrace.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int]
        self._dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(Dl_info)]
        self._frames = (ctypes.c_void_p * 96)()
        self._backtrace(self._frames, 96)  # the unwinder loads on first use: not inside a driver callback

    def caller(self, past: tuple[str, ...] = _DRIVER_FRAMES) -> str | None:
        """The shared object of the first frame past the innermost run of frames in `past` (the driver's and
        CUPTI's: the driver's caller); None when no frame is in `past`."""
        n = self._backtrace(self._frames, 96)
        info = Dl_info()
        seen = False
        for i in range(n):
            if not self._frames[i] or not self._dladdr(self._frames[i], ctypes.byref(info)) or not info.dli_fname:
                continue
            lib = os.path.basename(info.dli_fname.decode(errors="replace"))
            if lib.startswith(past):
                seen = True
            elif seen:
                return lib
        return None


def find_library(fix: str = "run cold-start with --no-cupti") -> str:
    """The libcupti this process should use: one already mapped, else the one next to torch's libraries or in
    the CUDA wheels on sys.path (``nvidia/*/lib``), else a system one. Without one, a CaptureError ending in
    `fix` (what the caller can do instead)."""
    from cublaslt_probe.gpu.lt import loaded_libraries
    found = loaded_libraries("libcupti.so")
    if found:
        return found[0]
    cands: list[str] = []
    torch = sys.modules.get("torch")
    if torch is not None:
        cands += sorted(glob.glob(os.path.join(os.path.dirname(torch.__file__), "lib", "libcupti.so*")))
    for p in sys.path:
        cands += sorted(glob.glob(os.path.join(p, "nvidia", "*", "lib", "libcupti.so*")))
        cands += sorted(glob.glob(os.path.join(p, "nvidia", "*", "*", "lib", "libcupti.so*")))
    for home in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if home:
            cands += sorted(glob.glob(os.path.join(home, "extras", "CUPTI", "lib64", "libcupti.so*")))
    for c in cands:
        if os.path.isfile(c):
            return c
    raise CaptureError("no libcupti found (not mapped, not next to torch, not in nvidia/*/lib on sys.path): "
                       f"install nvidia-cuda-cupti or {fix}")


def check(lib, rc: int, what: str, fix: str) -> None:
    """Raise CaptureError naming CUPTI's error and `fix` (what the user can do) when `rc` is not success."""
    if rc != 0:
        s = ctypes.c_char_p()
        lib.cuptiGetResultString(rc, ctypes.byref(s))
        raise CaptureError(f"{what} failed: CUPTI error {rc} ({(s.value or b'').decode()}); {fix}")


class Recorder:
    """One CUPTI subscriber: `start()`, run the program, `stop()`; events in `modules` and `calls`."""

    def __init__(self, path: str | None = None, *, kernel_names: bool = True):
        self.path = path or find_library()
        self.lib = ctypes.CDLL(self.path)
        L = self.lib
        L.cuptiSubscribe.argtypes = [ctypes.POINTER(ctypes.c_void_p), CALLBACK, ctypes.c_void_p]
        L.cuptiUnsubscribe.argtypes = [ctypes.c_void_p]
        L.cuptiEnableCallback.argtypes = [ctypes.c_uint32, ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32]
        L.cuptiGetCallbackName.argtypes = [ctypes.c_int, ctypes.c_uint32, ctypes.POINTER(ctypes.c_char_p)]
        L.cuptiGetResultString.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        self.kernel_names = kernel_names
        self.modules: list[dict] = []
        self.calls: list[dict] = []
        self.errors: list[str] = []
        self.cbids: dict[int, tuple[str, str]] = {}  # cbid -> (name, what)
        self._cb = CALLBACK(self._on_callback)  # keep a reference: ctypes callbacks must outlive use
        self._sub = ctypes.c_void_p()
        self.on = False
        try:
            self._stack: CallStack | None = CallStack()
        except (OSError, AttributeError) as e:  # no glibc backtrace/dladdr: load calls keep no caller
            self._stack = None
            self.errors.append(f"load calls' callers not recorded: {error_text(e)}")

    def _check(self, rc: int, what: str) -> None:
        check(self.lib, rc, what, "if a profiler is attached, run without it or with --no-cupti")

    def driver_callbacks(self, max_cbid: int = 4096) -> dict[str, int]:
        """Every driver-API callback name of the installed CUPTI -> its id."""
        out: dict[str, int] = {}
        name = ctypes.c_char_p()
        misses = 0
        for cbid in range(1, max_cbid):
            if self.lib.cuptiGetCallbackName(DOMAIN_DRIVER_API, cbid, ctypes.byref(name)) == 0 and name.value:
                out[name.value.decode()] = cbid
                misses = 0
            else:
                misses += 1
                if misses > 256 and out:
                    break
        return out

    def start(self) -> None:
        names = self.driver_callbacks()
        want = {n: what for what, ns in WATCH.items() for n in ns}
        for name, cbid in names.items():
            what = want.get(base_name(name))
            if what:
                self.cbids[cbid] = (name, what)
        self._check(self.lib.cuptiSubscribe(ctypes.byref(self._sub), self._cb, None), "cuptiSubscribe")
        self._check(self.lib.cuptiEnableCallback(1, self._sub, DOMAIN_RESOURCE, CBID_RESOURCE_MODULE_LOADED),
                    "cuptiEnableCallback(MODULE_LOADED)")
        for cbid in self.cbids:
            self._check(self.lib.cuptiEnableCallback(1, self._sub, DOMAIN_DRIVER_API, cbid),
                        f"cuptiEnableCallback({self.cbids[cbid][0]})")
        self.on = True

    def stop(self) -> None:
        if self.on:
            self.lib.cuptiUnsubscribe(self._sub)
            self.on = False

    # --- the callback ------------------------------------------------------------------------------------
    def _on_callback(self, userdata, domain, cbid, cbdata) -> None:
        t = time.perf_counter_ns()
        try:
            if domain == DOMAIN_RESOURCE and cbid == CBID_RESOURCE_MODULE_LOADED:
                self._module(t, cbdata)
            elif domain == DOMAIN_DRIVER_API:
                self._driver(t, cbid, cbdata)
        except Exception as e:  # noqa: BLE001  (never raise into the driver; count and go on)
            if len(self.errors) < 20:
                self.errors.append(error_text(e))

    def _module(self, t: int, cbdata) -> None:
        rd = ResourceData.from_address(cbdata)
        if not rd.resourceDescriptor:
            return
        md = ModuleResourceData.from_address(rd.resourceDescriptor)
        rec = {"t_ns": t, "id": int(md.moduleId), "size": int(md.cubinSize), "kind": "unknown",
               "thread": threading.get_ident()}
        if md.pCubin and md.cubinSize >= 4:
            base, size = md.pCubin, md.cubinSize
            rec["kind"] = image_kind(ctypes.string_at(base, min(16, size)))
            if self.kernel_names and rec["kind"] == "cubin":
                def read(off, n):
                    if off < 0 or n < 0 or off + n > size:
                        return b""
                    return ctypes.string_at(base + off, n)
                names, count = elf_kernels(read)
                rec["kernels"], rec["kernel_count"] = names, count
        self.modules.append(rec)

    def _driver(self, t: int, cbid: int, cbdata) -> None:
        ent = self.cbids.get(cbid)
        if ent is None:
            return
        d = CallbackData.from_address(cbdata)
        slot = ctypes.c_uint64.from_address(d.correlationData) if d.correlationData else None
        if d.callbackSite == API_ENTER:
            if slot is not None:
                slot.value = t
            return
        name, what = ent
        rec = {"t_ns": slot.value if slot is not None else t, "end_ns": t, "name": name, "what": what,
               "thread": threading.get_ident()}
        if d.functionReturnValue:
            rec["rc"] = ctypes.c_int.from_address(d.functionReturnValue).value
        p = d.functionParams
        base = base_name(name)
        if p and base in _IMAGE_SECOND:
            img = ctypes.c_void_p.from_address(p + 8).value
            if img:
                kind = image_kind(ctypes.string_at(img, 16))
                rec["image"] = kind
                if self._stack is not None:
                    rec["caller"] = self._stack.caller()
                if kind == "ptx":
                    rec["image_bytes"] = len(ctypes.string_at(img))
                elif kind == "cubin":   # its size, which the module the driver makes of it has (`Module`)
                    size = elf_size(ctypes.string_at(img, 64))
                    if size:
                        rec["image_bytes"] = size
        elif p and base in _PATH_SECOND:
            fname = ctypes.c_char_p.from_address(p + 8).value
            if fname:
                rec["file"] = os.path.basename(fname.decode(errors="replace"))
                ext = os.path.splitext(rec["file"])[1].lstrip(".").lower()
                rec["image"] = {"ptx": "ptx", "cubin": "cubin", "fatbin": "fatbin"}.get(ext, "file")
        elif p and base in ("cuLinkAddData", "cuLinkAddFile"):
            rec["input"] = JIT_INPUT.get(ctypes.c_int.from_address(p + 8).value, "unknown")
            if base == "cuLinkAddData":
                rec["image_bytes"] = int(ctypes.c_size_t.from_address(p + 24).value)
        self.calls.append(rec)


# --- the activity API: what the GPU ran -------------------------------------------------------------------------
KIND_MEMCPY, KIND_MEMSET, KIND_CONCURRENT_KERNEL = 1, 2, 10
ACTIVITY_KINDS = (KIND_CONCURRENT_KERNEL, KIND_MEMSET, KIND_MEMCPY)
FLUSH_FORCED = 1                 # CUPTI_ACTIVITY_FLAG_FLUSH_FORCED: hand over every buffer, full or not
BUFFER_BYTES = 1 << 21           # one activity buffer (CUPTI asks for more as they fill)
# torch.profiler's (kineto's) words for a copy's kind and a memory's kind (CUpti_ActivityMemcpyKind,
# CUpti_ActivityMemoryKind), so a copy or a memset is named here as in a torch.profiler trace
MEMCPY_KINDS = {0: "<unknown>", 1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA", 6: "AtoD", 7: "DtoA",
                8: "DtoD", 9: "HtoH", 10: "PtoP"}
MEMORY_KINDS = {0: "Unknown", 1: "Pageable", 2: "Pinned", 3: "Device", 4: "Array", 5: "Managed",
                6: "Device Static", 7: "Managed Static"}

TIMESTAMP = ctypes.CFUNCTYPE(ctypes.c_uint64)   # CUpti_TimestampCallbackFunc: uint64_t (*)(void), ns
BUFFER_REQUESTED = ctypes.CFUNCTYPE(None, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t),
                                    ctypes.POINTER(ctypes.c_size_t))
BUFFER_COMPLETED = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t,
                                    ctypes.c_size_t)


def kernel_name(raw: bytes, cache: dict) -> str:
    """A kernel's name as torch.profiler gives it: demangled by the GNU demangler (as kineto's `demangle`), the
    name itself where that fails (an `extern "C"` name such as nvjet's, or one it cannot read)."""
    name = cache.get(raw)
    if name is None:
        text = raw.decode(errors="replace")
        try:
            import cxxfilt
            name = cxxfilt.demangle(text) or text
        except Exception:  # noqa: BLE001  (an invalid mangling keeps its name)
            name = text
        cache[raw] = name
    return name


def activity_event(p: int, names: dict) -> tuple[int, str, float] | None:
    """(start ns, name, duration µs) of the activity record at address `p`: a kernel, a memset or a memcpy, named
    as torch.profiler names them; None for another kind."""
    kind = ctypes.c_uint32.from_address(p).value
    if kind not in ACTIVITY_KINDS:
        return None
    start, end = struct.unpack("<QQ", ctypes.string_at(p + 16, 16))
    if kind == KIND_CONCURRENT_KERNEL:
        raw = ctypes.c_char_p.from_address(p + 104).value
        if not raw:
            raise CaptureError("a CUPTI kernel record holds no name where this tool reads it: the installed "
                               "CUPTI's record layout is not the one it knows")
        name = kernel_name(raw, names)
    elif kind == KIND_MEMSET:
        name = f"Memset ({MEMORY_KINDS.get(ctypes.c_uint16.from_address(p + 50).value, 'Unrecognized')})"
    else:
        copy, src, dst = ctypes.string_at(p + 4, 3)
        name = (f"Memcpy {MEMCPY_KINDS.get(copy, '<unknown>')} ({MEMORY_KINDS.get(src, 'Unrecognized')} -> "
                f"{MEMORY_KINDS.get(dst, 'Unrecognized')})")
    return start, name, (end - start) / 1e3 if end >= start else 0.0


class Activity:
    """What the GPU ran between `start()` and `stop()` (CUPTI's activity API): `stop()` returns every kernel,
    memset and memcpy as (start ns, name, duration µs), in start order, named as torch.profiler names them.

    One per process (`activity()`): CUPTI's buffer callbacks belong to the process. Its first start initialises
    CUPTI (tens of milliseconds, where a process's first torch.profiler session takes seconds); the callbacks are
    registered again at every start, as another user of the activity API (torch.profiler) may have replaced them
    since. So is the timestamp callback (`cuptiActivityRegisterTimestampCallback`, CLOCK_REALTIME in ns, CUPTI's
    own default): torch.profiler's kineto registers one that returns the CPU's TSC ticks and converts them back
    itself, and it stays in force after its session, so records taken after one read ticks as ns (2.1x the
    kernels' durations on the H200; benchmarks/bench_capture_durations.py)."""

    def __init__(self, path: str | None = None):
        self.path = path or find_library("run where torch's CUDA wheels are installed (the kernel capture needs CUPTI)")
        self.lib = L = ctypes.CDLL(self.path)
        L.cuptiActivityRegisterCallbacks.argtypes = [BUFFER_REQUESTED, BUFFER_COMPLETED]
        L.cuptiActivityEnable.argtypes = L.cuptiActivityDisable.argtypes = [ctypes.c_int]
        L.cuptiActivityFlushAll.argtypes = [ctypes.c_uint32]
        L.cuptiActivityGetNextRecord.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p)]
        L.cuptiGetResultString.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        L.cuptiActivityRegisterTimestampCallback.argtypes = [TIMESTAMP]
        self._clock = TIMESTAMP(time.time_ns)        # kept alive here: CUPTI holds the pointer
        self._buffers: dict[int, ctypes.Array] = {}   # address -> the buffer CUPTI holds (kept alive here)
        self._events: list[tuple[int, str, float]] = []
        self._errors: list[str] = []
        self._names: dict[bytes, str] = {}
        self._callbacks = (BUFFER_REQUESTED(self._requested), BUFFER_COMPLETED(self._completed))
        self.on = False

    def _check(self, rc: int, what: str) -> None:
        check(self.lib, rc, what, "is another profiler (Nsight Systems, Nsight Compute) attached? run without it")

    def start(self) -> None:
        self._events, self._errors = [], []
        self._check(self.lib.cuptiActivityRegisterCallbacks(*self._callbacks), "cuptiActivityRegisterCallbacks")
        self._check(self.lib.cuptiActivityRegisterTimestampCallback(self._clock),
                    "cuptiActivityRegisterTimestampCallback")
        enabled = []
        try:
            for kind in ACTIVITY_KINDS:
                self._check(self.lib.cuptiActivityEnable(kind), f"cuptiActivityEnable({kind})")
                enabled.append(kind)
        except CaptureError:
            for kind in enabled:
                self.lib.cuptiActivityDisable(kind)
            raise
        self.on = True

    def stop(self) -> list[tuple[int, str, float]]:
        """Stop recording (after the caller synchronised the GPU) and hand over what was recorded."""
        if self.on:
            for kind in ACTIVITY_KINDS:
                self.lib.cuptiActivityDisable(kind)
            self.on = False
            self._check(self.lib.cuptiActivityFlushAll(FLUSH_FORCED), "cuptiActivityFlushAll")
        if self._errors:
            raise CaptureError(self._errors[0])
        return sorted(self._events)

    def _requested(self, buf, size, max_records) -> None:
        b = ctypes.create_string_buffer(BUFFER_BYTES)   # malloc'd: aligned for CUPTI's 8-byte records
        self._buffers[ctypes.addressof(b)] = b
        buf[0] = ctypes.addressof(b)
        size[0] = BUFFER_BYTES
        max_records[0] = 0

    def _completed(self, ctx, stream, buf, size, valid) -> None:
        rec = ctypes.c_void_p()
        try:
            while self.lib.cuptiActivityGetNextRecord(buf, valid, ctypes.byref(rec)) == 0:
                ev = activity_event(rec.value, self._names)
                if ev is not None:
                    self._events.append(ev)
        except Exception as e:  # noqa: BLE001  (never raise into CUPTI's thread; said at stop)
            self._errors.append(str(e) if isinstance(e, CaptureError) else error_text(e))
        finally:
            self._buffers.pop(buf, None)


_ACTIVITY: list[Activity] = []


def activity() -> Activity:
    """The process's `Activity`, made on first use."""
    if not _ACTIVITY:
        _ACTIVITY.append(Activity())
    return _ACTIVITY[0]
