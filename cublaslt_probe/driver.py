"""The small ctypes layer over the CUDA driver (libcuda) torch has already loaded: timing events on raw handles.

The probe records about 26 timing events per GEMM and reads about 17 elapsed times (decode preset). Through
torch's `torch.cuda.Event` a record cost 3.8 µs of host time and a read 4.5 (cProfile on the H200 host,
benchmarks/results/bench12_decode_cprofile.txt): each goes through torch's Python wrapper, its device guard
and the runtime. Here they are the driver's own calls on handles made once, their arguments typed once.

A driver event is what a runtime event is (`cudaEvent_t` is a `CUevent`) and torch's streams are driver
streams, so the events are recorded on torch's streams directly. There is one libcuda in a process (the
runtime torch uses loaded it), so the handles live in the same context as torch's work: the primary context,
current on any thread where torch has run CUDA work. Like `lt.py`, this opens the mapped library, never one
of its own choosing. Nothing here is imported by the CPU side of the package.
"""
from __future__ import annotations

import ctypes
import os

from cublaslt_probe.errors import CaptureError

CUDA_SUCCESS = 0
CUDA_ERROR_NOT_READY = 600
CU_EVENT_DEFAULT = 0   # timing on, as torch's Event(enable_timing=True)


class Clock:
    """CUDA events of the driver torch loaded: `event()` makes one, `record(ev, stream)` queues it (returns the
    driver's status: 0 is success), `done(ev)`, `wait(ev)`, `elapsed_us(a, b)`. `stream(handle)` is a raw
    stream handle as `record` takes it. One thread: the elapsed-time read reuses one output float."""

    def __init__(self, path: str = "libcuda.so.1"):
        try:
            L = ctypes.CDLL(path, mode=getattr(os, "RTLD_NOLOAD", 0))
        except OSError as e:
            raise CaptureError(f"the CUDA driver ({path}) is not loaded in this process: run CUDA work with "
                               f"torch first ({e})") from None
        vp = ctypes.c_void_p
        L.cuEventCreate.argtypes = [ctypes.POINTER(vp), ctypes.c_uint]
        L.cuEventDestroy_v2.argtypes = [vp]
        L.cuEventRecord.argtypes = [vp, vp]
        L.cuEventQuery.argtypes = [vp]
        L.cuEventSynchronize.argtypes = [vp]
        # the driver of CUDA 12.8 on has both; the header of 13 names the second cuEventElapsedTime
        self._elapsed = getattr(L, "cuEventElapsedTime_v2", None) or L.cuEventElapsedTime
        self._elapsed.argtypes = [ctypes.POINTER(ctypes.c_float), vp, vp]
        L.cuGetErrorName.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        self.lib = L
        self.record = L.cuEventRecord     # (event, stream) -> status, on the hot path unwrapped
        self._query, self._sync = L.cuEventQuery, L.cuEventSynchronize
        self._ms = ctypes.c_float()
        self._ms_ref = ctypes.byref(self._ms)

    def error(self, status: int, what: str) -> CaptureError:
        name = ctypes.c_char_p()
        self.lib.cuGetErrorName(status, ctypes.byref(name))
        return CaptureError(f"{what} failed: {(name.value or b'').decode() or status}")

    def event(self) -> ctypes.c_void_p:
        ev = ctypes.c_void_p()
        st = self.lib.cuEventCreate(ctypes.byref(ev), CU_EVENT_DEFAULT)
        if st:
            raise self.error(st, "cuEventCreate")
        return ev

    def destroy(self, ev: ctypes.c_void_p) -> None:
        self.lib.cuEventDestroy_v2(ev)

    @staticmethod
    def stream(handle: int) -> ctypes.c_void_p:
        """A stream's raw handle (`probe.current_stream`; a torch Stream's `cuda_stream`) as `record` takes it."""
        return ctypes.c_void_p(handle)

    def done(self, ev) -> bool:
        """Whether the GPU has passed `ev`."""
        st = self._query(ev)
        if st == CUDA_SUCCESS:
            return True
        if st == CUDA_ERROR_NOT_READY:
            return False
        raise self.error(st, "cuEventQuery")

    def wait(self, ev) -> None:
        st = self._sync(ev)
        if st:
            raise self.error(st, "cuEventSynchronize")

    def elapsed_us(self, a, b) -> float:
        """µs from event `a` to event `b` (both passed)."""
        st = self._elapsed(self._ms_ref, a, b)
        if st:
            raise self.error(st, "cuEventElapsedTime")
        return self._ms.value * 1e3
