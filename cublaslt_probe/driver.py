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


CU_MEMHOSTALLOC_DEVICEMAP = 0x02
CU_STREAM_WAIT_VALUE_GEQ = 0x0   # wait until (int32)(*addr - value) >= 0: a counter that may wrap


class Gate:
    """A counter in pinned host memory the GPU can read, and the driver's stream wait on it
    (`cuStreamWaitValue32`): `hold(stream)` queues a wait for the next value of the counter and returns the
    driver's status; `open()` writes that value, and the stream goes on past its wait. The host opens a gate
    once it has enqueued what follows it, so the GPU cannot begin that work before all of it is queued.

    Every held gate must be opened, or the stream waits for ever (and a host wait on it, with it): `open_all()`
    opens every gate held so far, for a caller that stops between a hold and its open."""

    def __init__(self, clock: Clock):
        L = clock.lib
        vp = ctypes.c_void_p
        self._wait = getattr(L, "cuStreamWaitValue32_v2", None) or L.cuStreamWaitValue32
        self._wait.argtypes = [vp, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint]
        L.cuMemHostAlloc.argtypes = [ctypes.POINTER(vp), ctypes.c_size_t, ctypes.c_uint]
        L.cuMemHostGetDevicePointer_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), vp, ctypes.c_uint]
        L.cuMemFreeHost.argtypes = [vp]
        self._clock, self._lib = clock, L
        self._host = vp()
        st = L.cuMemHostAlloc(ctypes.byref(self._host), 4, CU_MEMHOSTALLOC_DEVICEMAP)
        if st:
            raise clock.error(st, "cuMemHostAlloc")
        dev = ctypes.c_uint64()
        st = L.cuMemHostGetDevicePointer_v2(ctypes.byref(dev), self._host, 0)
        if st:
            L.cuMemFreeHost(self._host)
            raise clock.error(st, "cuMemHostGetDevicePointer")
        self._dev = dev.value
        self._cell = ctypes.c_uint32.from_address(self._host.value)
        self._cell.value = 0
        self.opened = 0   # the counter's value (the gates opened so far)
        self.held = 0     # the value the last held gate waits for

    def hold(self, stream) -> int:
        """Queue, on `stream`, a wait for the next gate (the driver's status: 0 is success)."""
        st = self._wait(stream, self._dev, (self.held + 1) & 0xFFFFFFFF, CU_STREAM_WAIT_VALUE_GEQ)
        if not st:
            self.held += 1
        return st

    def open(self) -> None:
        """Open the oldest gate still held (the GPU goes on past it)."""
        self.opened += 1
        self._cell.value = self.opened & 0xFFFFFFFF

    def open_all(self) -> None:
        self.opened = self.held
        self._cell.value = self.opened & 0xFFFFFFFF

    def close(self) -> None:
        """Free the counter, every gate opened first (call once the GPU has passed them)."""
        if self._host.value:
            self.open_all()
            self._lib.cuMemFreeHost(self._host)
            self._host = ctypes.c_void_p()
