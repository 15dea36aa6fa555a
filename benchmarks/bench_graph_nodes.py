#!/usr/bin/env python3
"""What one library call of a GEMM launches, read from a CUDA graph of it (GPU; nothing is timed).

    PYTHONPATH=. python3 benchmarks/bench_graph_nodes.py [--preset quick] [--also decode:256] [--rounds 2]

The probe's timed calls cost the host 17-35 µs each in the library's launch path; a launch of the same kernels
by the driver's own call (`cuLaunchKernelEx`) costs a few. Whether such a launch would be the library's own
depends on what the library launches: this captures one call of each GEMM (as `bench_graph_timing.py` does)
and prints its nodes in order — kernels with their grid, block, dynamic shared memory and the launch attributes
a graph keeps for them (cluster dimension, cooperative, priority, memory sync domain), memsets — and the edges
between them with their type (a programmatic edge is a launch with programmatic stream serialization, which a
replay would have to ask for too: `driver.Graphs.replay` does). Then how many GEMMs hold each shape of graph.
--rounds is accepted for the shared command line and ignored.
"""
import collections
import ctypes
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from bench_graph_timing import arguments, gemms  # noqa: E402  (the same GEMMs)

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from cublaslt_probe.gpu.driver import EdgeData, KernelParams  # noqa: E402  (the driver's structures: one home)

NODE_TYPES = {0: "kernel", 1: "memcpy", 2: "memset", 3: "host", 4: "graph", 5: "empty", 6: "wait_event",
              7: "event_record", 10: "mem_alloc", 11: "mem_free", 12: "batch_mem_op", 13: "conditional"}
ATTRS = {1: "access_policy", 2: "cooperative", 4: "cluster", 5: "cluster_policy", 8: "priority", 9: "mem_sync_map",
         10: "mem_sync_domain", 11: "preferred_cluster", 14: "smem_carveout"}   # driver.NODE_ATTRS, named
EDGE_TYPES = {0: "default", 1: "programmatic"}


class Reader:
    """The driver's graph-inspection calls (those this CUDA has; a missing one leaves its field unread)."""

    def __init__(self, L):
        vp, P = ctypes.c_void_p, ctypes.POINTER
        self.L = L
        L.cuGraphNodeGetType.argtypes = [vp, P(ctypes.c_int)]
        self.params = getattr(L, "cuGraphKernelNodeGetParams_v2", None)
        if self.params is not None:
            self.params.argtypes = [vp, P(KernelParams)]
        self.attr = getattr(L, "cuGraphKernelNodeGetAttribute", None)
        if self.attr is not None:
            self.attr.argtypes = [vp, ctypes.c_int, ctypes.c_void_p]
        self.fname = getattr(L, "cuFuncGetName", None)
        self.kname = getattr(L, "cuKernelGetName", None)
        for f in (self.fname, self.kname):
            if f is not None:
                f.argtypes = [P(ctypes.c_char_p), vp]
        self.edges = getattr(L, "cuGraphGetEdges_v2", None)
        self.edge_data = self.edges is not None
        if self.edges is None:   # the header of 13 names the second cuGraphGetEdges
            self.edges = L.cuGraphGetEdges
        self.edges.argtypes = [vp, P(vp), P(vp), P(EdgeData), P(ctypes.c_size_t)] if self.edge_data else None

    def describe(self, node) -> str:
        t = ctypes.c_int(-1)
        self.L.cuGraphNodeGetType(node, ctypes.byref(t))
        kind = NODE_TYPES.get(t.value, str(t.value))
        if kind != "kernel" or self.params is None:
            return kind
        p = KernelParams()
        st = self.params(node, ctypes.byref(p))
        if st:
            return f"kernel (params: error {st})"
        name = ctypes.c_char_p()
        if p.func and self.fname is not None and not self.fname(ctypes.byref(name), p.func):
            pass
        elif p.kern and self.kname is not None:
            self.kname(ctypes.byref(name), p.kern)
        out = [f"kernel {(name.value or b'?').decode()[:70]} grid {p.gridDimX}x{p.gridDimY}x{p.gridDimZ} "
               f"block {p.blockDimX}x{p.blockDimY}x{p.blockDimZ} smem {p.sharedMemBytes}"]
        if self.attr is not None:
            val = (ctypes.c_ubyte * 64)()
            for aid, aname in ATTRS.items():
                ctypes.memset(val, 0, 64)
                if self.attr(node, aid, ctypes.byref(val)):
                    continue
                words = [int.from_bytes(bytes(val[i:i + 4]), "little") for i in (0, 4, 8)]
                if aid in (4, 11) and any(words):
                    out.append(f"{'cluster' if aid == 4 else aname} {words[0]}x{words[1]}x{words[2]}")
                elif aid not in (4, 11) and any(val):
                    out.append(f"{aname} {words[0]}")
        return " ".join(out)

    def edge_list(self, g, index) -> list:
        if not self.edge_data:
            return ["(edges: this driver has no cuGraphGetEdges_v2)"]
        n = ctypes.c_size_t(0)
        self.edges(g, None, None, None, ctypes.byref(n))
        if not n.value:
            return []
        a, b = (ctypes.c_void_p * n.value)(), (ctypes.c_void_p * n.value)()
        d = (EdgeData * n.value)()
        self.edges(g, a, b, d, ctypes.byref(n))
        return [f"{index[a[i]]}->{index[b[i]]} {EDGE_TYPES.get(d[i].type, d[i].type)}" for i in range(n.value)]


def main():
    a = arguments(__doc__, "(ignored)")
    import torch
    from cublaslt_probe.gpu.probe import Probe
    stream = torch.cuda.Stream()
    torch.cuda.set_stream(stream)
    probe = Probe(pipeline=False)
    R = Reader(probe.graphs.lib)
    shapes = collections.Counter()
    for c, b, _ in gemms(probe, a.preset, a.also):
        try:
            g, out = probe.graphs.capture(probe._stream(), b.fn)
            nodes = probe.graphs.nodes(g)
            index = {n: i for i, n in enumerate(nodes)}
            desc = [R.describe(n) for n in nodes]
            edges = R.edge_list(g, index)
            probe.graphs.lib.cuGraphDestroy(g)
            del out
        except Exception as e:  # noqa: BLE001
            desc, edges = [f"ERROR {type(e).__name__}: {e}"[:200]], []
            torch.cuda.synchronize()
        b.close()
        print(f"{c.key:44s} " + " | ".join(f"{i}: {d}" for i, d in enumerate(desc)) + (f"  edges {edges}" if edges else ""))
        kinds = tuple(d.split(" ")[0] + (" cluster" if " cluster " in d else "") for d in desc)
        shapes[(kinds, tuple(e.split(" ")[1] for e in edges if " " in e))] += 1
    print("graphs by their nodes (in order) and edge types:")
    for (kinds, etypes), n in shapes.most_common():
        print(f"  {n:4d}  nodes {list(kinds)}  edges {list(etypes)}")


if __name__ == "__main__":
    main()
