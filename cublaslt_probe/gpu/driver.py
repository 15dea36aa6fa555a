"""The small ctypes layer over the CUDA driver (libcuda) torch has already loaded: timing events on raw handles.

The probe records a few dozen timing events per GEMM and reads most of them back. Through torch's
`torch.cuda.Event` each record and read goes through torch's Python wrapper, its device guard and the runtime,
several times the host time of the driver's own call (docs/decisions.md, "Timing events through the driver").
Here they are the driver's own calls on handles made once, their arguments typed once.

A driver event is what a runtime event is (`cudaEvent_t` is a `CUevent`) and torch's streams are driver
streams, so the events are recorded on torch's streams directly. There is one libcuda in a process (the
runtime torch uses loaded it), so the handles live in the same context as torch's work: the primary context,
current on any thread where torch has run CUDA work. Like `lt.py`, this opens the mapped library, never one
of its own choosing. Nothing here is imported by the CPU side of the package.
"""
from __future__ import annotations

import ctypes
import os
import time

from cublaslt_probe.errors import CaptureError

CUDA_SUCCESS = 0
CUDA_ERROR_NOT_READY = 600
CU_EVENT_DEFAULT = 0   # timing on, as torch's Event(enable_timing=True)


class Clock:
    """CUDA events of the driver torch loaded: `event()` makes one, `record(ev, stream)` queues it (returns the
    driver's status: 0 is success), `done(ev)`, `wait(ev)`, `elapsed_us(a, b)`, and the host's clock `host_us()`
    (the clock of `timing.Timer`). `stream(handle)` is a raw
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

    @staticmethod
    def host_us() -> float:
        """The host's clock, µs (`time.perf_counter`): what the timing method measures the host's enqueueing by."""
        return time.perf_counter() * 1e6

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
        """A stream's raw handle (`operands.current_stream`; a torch Stream's `cuda_stream`) as `record` takes it."""
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


CU_STREAM_CAPTURE_MODE_RELAXED = 2   # other threads' calls (the prewarm thread's, the profiler's) are not checked
NODE_KERNEL, NODE_MEMSET = 0, 2       # CUgraphNodeType
EDGE_PROGRAMMATIC = 1                 # CUgraphDependencyType
PROGRAMMATIC_STREAM_SERIALIZATION = 6  # CUlaunchAttributeID
# the launch attributes a graph keeps for a kernel node, copied onto its replay (CUlaunchAttributeID): access policy
# window, cooperative, cluster dimension, cluster scheduling policy, priority, memory sync domain map and domain,
# preferred cluster dimension, preferred shared memory carveout
NODE_ATTRS = (1, 2, 4, 5, 8, 9, 10, 11, 14)


class KernelParams(ctypes.Structure):   # CUDA_KERNEL_NODE_PARAMS_v2
    _fields_ = [("func", ctypes.c_void_p), ("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint),
                ("gridDimZ", ctypes.c_uint), ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint),
                ("blockDimZ", ctypes.c_uint), ("sharedMemBytes", ctypes.c_uint), ("kernelParams", ctypes.c_void_p),
                ("extra", ctypes.c_void_p), ("kern", ctypes.c_void_p), ("ctx", ctypes.c_void_p)]


class MemsetParams(ctypes.Structure):   # CUDA_MEMSET_NODE_PARAMS
    _fields_ = [("dst", ctypes.c_uint64), ("pitch", ctypes.c_size_t), ("value", ctypes.c_uint),
                ("elementSize", ctypes.c_uint), ("width", ctypes.c_size_t), ("height", ctypes.c_size_t)]


class EdgeData(ctypes.Structure):       # CUgraphEdgeData
    _fields_ = [("from_port", ctypes.c_ubyte), ("to_port", ctypes.c_ubyte), ("type", ctypes.c_ubyte),
                ("reserved", ctypes.c_ubyte * 5)]


class LaunchAttr(ctypes.Structure):     # CUlaunchAttribute: the id, padding to 8 bytes, a 64-byte value
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_ubyte * 4), ("value", ctypes.c_ubyte * 64)]


class LaunchConfig(ctypes.Structure):   # CUlaunchConfig
    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
                ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(LaunchAttr)), ("numAttrs", ctypes.c_uint)]


class Replay:
    """One library call captured into a CUDA graph and launched again node by node by the driver's own calls
    (`Graphs.replay`): `launch()` queues, on the stream it was captured on, each kernel by `cuLaunchKernelEx` with
    the node's grid, block, shared memory, parameters (an array of pointers, or the packed buffer the library
    passed) and launch attributes, with programmatic stream serialization where a programmatic edge leads to it
    (the library's programmatic dependent launch), and each memset by `cuMemsetD*Async`: the launches the library
    made, for a few µs of host time each where its launch path takes 17-35; each launch's status is checked. The
    graph is kept (its nodes own the parameters), and what the captured call returned (torch's output tensor), so
    that no other tensor is given the memory the launches write. `close()` destroys the graph."""

    def __init__(self, graphs: "Graphs", graph, steps: list, keep: list, out, kinds: tuple):
        self._graphs, self._graph, self._keep, self.out = graphs, graph, keep, out
        self.kinds = kinds   # what each launch is: "memset", "kernel", or "programmatic kernel" (behind a
                             # programmatic edge: launched with programmatic stream serialization)
        steps = tuple(steps)

        def launch():
            for fn, args in steps:
                st = fn(*args)
                if st:   # a launch the driver refused: raised, never timed as a GEMM
                    raise graphs._clock.error(st, fn.__name__)
        self.launch = launch

    @property
    def nbytes(self) -> int:
        """Bytes of the captured call's output, which the replay keeps alive (a window's memory budget counts
        them)."""
        o = self.out
        return o.element_size() * o.numel() if hasattr(o, "element_size") else 0

    def close(self) -> None:
        if self._graph is not None:
            self._graphs.lib.cuGraphDestroy(self._graph)
            self._graph = self._keep = self.out = None


class Graphs:
    """Stream capture of one call on the driver torch loaded, and its replay (`replay`). The stream must not be
    the legacy default stream (it cannot be captured): the probe runs such windows on a stream of its own."""

    def __init__(self, clock: Clock):
        L, vp, P = clock.lib, ctypes.c_void_p, ctypes.POINTER
        L.cuStreamBeginCapture_v2.argtypes = [vp, ctypes.c_int]
        L.cuStreamEndCapture.argtypes = [vp, P(vp)]
        L.cuGraphDestroy.argtypes = [vp]
        L.cuGraphGetNodes.argtypes = [vp, P(vp), P(ctypes.c_size_t)]
        L.cuGraphNodeGetType.argtypes = [vp, P(ctypes.c_int)]
        L.cuGraphKernelNodeGetParams_v2.argtypes = [vp, P(KernelParams)]
        L.cuGraphKernelNodeGetAttribute.argtypes = [vp, ctypes.c_int, vp]
        L.cuGraphMemsetNodeGetParams.argtypes = [vp, P(MemsetParams)]
        L.cuGraphGetEdges_v2.argtypes = [vp, P(vp), P(vp), P(EdgeData), P(ctypes.c_size_t)]
        L.cuLaunchKernelEx.argtypes = [P(LaunchConfig), vp, vp, vp]
        self._memset = {}
        for size, name, t in ((1, "cuMemsetD8Async", ctypes.c_ubyte), (2, "cuMemsetD16Async", ctypes.c_ushort),
                              (4, "cuMemsetD32Async", ctypes.c_uint)):
            f = getattr(L, name)
            f.argtypes = [ctypes.c_uint64, t, ctypes.c_size_t, vp]
            self._memset[size] = f
        self.lib, self._clock = L, clock

    def capture(self, stream, fn):
        """The graph of one call of `fn` on `stream` (relaxed mode), and what the call returned. A call that
        refuses to be captured raises `CaptureError`."""
        L = self.lib
        st = L.cuStreamBeginCapture_v2(stream, CU_STREAM_CAPTURE_MODE_RELAXED)
        if st:
            raise self._clock.error(st, "cuStreamBeginCapture")
        g = ctypes.c_void_p()
        try:
            out = fn()
        except Exception as e:
            L.cuStreamEndCapture(stream, ctypes.byref(g))
            if g.value:
                L.cuGraphDestroy(g)
            raise CaptureError(f"the call cannot be captured: {type(e).__name__}: {e}") from e
        st = L.cuStreamEndCapture(stream, ctypes.byref(g))
        if st:
            raise self._clock.error(st, "cuStreamEndCapture")
        return g, out

    def nodes(self, g) -> list:
        """The nodes of graph `g`, in the order the driver lists them (the order they were captured in)."""
        n = ctypes.c_size_t(0)
        self.lib.cuGraphGetNodes(g, None, ctypes.byref(n))
        arr = (ctypes.c_void_p * n.value)()
        self.lib.cuGraphGetNodes(g, arr, ctypes.byref(n))
        return [arr[i] for i in range(n.value)]

    def _programmatic(self, g, index: dict) -> set:
        """The nodes a programmatic edge leads to."""
        L, n = self.lib, ctypes.c_size_t(0)
        L.cuGraphGetEdges_v2(g, None, None, None, ctypes.byref(n))
        if not n.value:
            return set()
        a, b, d = (ctypes.c_void_p * n.value)(), (ctypes.c_void_p * n.value)(), (EdgeData * n.value)()
        L.cuGraphGetEdges_v2(g, a, b, d, ctypes.byref(n))
        return {index[b[i]] for i in range(n.value) if d[i].type == EDGE_PROGRAMMATIC}

    def replay(self, stream, fn) -> Replay:
        """Capture one call of `fn` on `stream` and make its replay (`Replay`). A node neither a kernel nor a
        one-row memset raises `CaptureError`."""
        L = self.lib
        g, out = self.capture(stream, fn)
        try:
            sv = stream.value if isinstance(stream, ctypes.c_void_p) else stream
            nodes = self.nodes(g)
            programmatic = self._programmatic(g, {n: i for i, n in enumerate(nodes)})
            steps, keep, kinds = [], [], []
            val = (ctypes.c_ubyte * 64)()
            for i, node in enumerate(nodes):
                t = ctypes.c_int(-1)
                L.cuGraphNodeGetType(node, ctypes.byref(t))
                if t.value == NODE_KERNEL:
                    p = KernelParams()
                    st = L.cuGraphKernelNodeGetParams_v2(node, ctypes.byref(p))
                    if st:
                        raise self._clock.error(st, "cuGraphKernelNodeGetParams")
                    attrs = []
                    for aid in NODE_ATTRS:
                        ctypes.memset(val, 0, 64)
                        if L.cuGraphKernelNodeGetAttribute(node, aid, ctypes.byref(val)) == 0 and any(val):
                            a = LaunchAttr(id=aid)
                            ctypes.memmove(a.value, val, 64)
                            attrs.append(a)
                    if i in programmatic:
                        a = LaunchAttr(id=PROGRAMMATIC_STREAM_SERIALIZATION)
                        a.value[0] = 1
                        attrs.append(a)
                    arr = (LaunchAttr * max(1, len(attrs)))(*attrs)
                    cfg = LaunchConfig(p.gridDimX, p.gridDimY, p.gridDimZ, p.blockDimX, p.blockDimY, p.blockDimZ,
                                       p.sharedMemBytes, sv, arr, len(attrs))
                    keep += [arr, cfg]
                    steps.append((L.cuLaunchKernelEx, (ctypes.byref(cfg), p.func or p.kern, p.kernelParams, p.extra)))
                    kinds.append("programmatic kernel" if i in programmatic else "kernel")
                elif t.value == NODE_MEMSET:
                    m = MemsetParams()
                    st = L.cuGraphMemsetNodeGetParams(node, ctypes.byref(m))
                    if st:
                        raise self._clock.error(st, "cuGraphMemsetNodeGetParams")
                    if m.height != 1 or m.elementSize not in self._memset:
                        raise CaptureError(f"a memset of {m.height} rows of {m.elementSize}-byte elements "
                                           "is not replayed")
                    steps.append((self._memset[m.elementSize], (m.dst, m.value, m.width, sv)))
                    kinds.append("memset")
                else:
                    raise CaptureError(f"a graph node of type {t.value} is not replayed")
        except Exception:
            L.cuGraphDestroy(g)
            raise
        return Replay(self, g, steps, keep, out, tuple(kinds))
