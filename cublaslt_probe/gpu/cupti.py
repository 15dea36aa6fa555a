"""A small ctypes layer over the libcupti that torch ships: what the CUDA driver was seen doing.

One CUPTI callback subscriber records, with host timestamps (`time.perf_counter_ns`):

- every module the driver loads (resource callback ``CUPTI_CBID_RESOURCE_MODULE_LOADED``): its id, the size
  of the loaded image, whether it is an ELF cubin, and the kernels it holds (the ``.text.<kernel>`` section
  names of the ELF, read from its section headers only);
- the driver calls that load, link or allocate (``cuModuleLoad*``, ``cuLibraryLoad*``, ``cuLink*``,
  ``cuMemAlloc*``, ``cuMemCreate``, ``cuMemMap``, ...): entry and exit time, the return code, and for the
  loaders the kind of image handed over (``cubin`` ELF, ``fatbin``, ``ptx`` text) and its size; for the
  linker the input type (PTX, cubin, fatbin, LTO-IR, ...).

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

Only one CUPTI subscriber may exist in a process: a torch.profiler session cannot run while this one is on.
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

from cublaslt_probe.errors import CaptureError

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


def find_library() -> str:
    """The libcupti this process should use: one already mapped, else the one next to torch's libraries or in
    the CUDA wheels on sys.path (``nvidia/*/lib``), else a system one."""
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
                       "install nvidia-cuda-cupti or run cold-start with --no-cupti")


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

    def _check(self, rc: int, what: str) -> None:
        if rc != 0:
            s = ctypes.c_char_p()
            self.lib.cuptiGetResultString(rc, ctypes.byref(s))
            raise CaptureError(f"{what} failed: CUPTI error {rc} ({(s.value or b'').decode()}); if a profiler "
                               "is attached, run without it or with --no-cupti")

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
                self.errors.append(f"{type(e).__name__}: {e}")

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
                if kind == "ptx":
                    rec["image_bytes"] = len(ctypes.string_at(img))
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
