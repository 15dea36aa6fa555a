#!/usr/bin/env python3
"""What a process's first kernel capture costs, by method (run it on the GPU machine).

    PYTHONPATH=. python3 benchmarks/bench_kernel_capture.py [--rounds 2] [--out kernel_capture.json]

A one-shot command (`explain`, `audit --measure`, `replay`) captures the kernels of a few GEMMs once; its first
capture pays the capture method's start. Each method runs in fresh processes (the methods alternating, `--rounds`
times), after `import torch`, the CUDA context and one warm bf16 GEMM (16 x 4096 x 4096), so only the capture is
timed; each child captures that GEMM twice (first and second capture) and reports the kernels seen:

- `torch_profiler`: torch.profiler with CUDA activities, as the probe uses it (import, enter, exit, reading
  kineto's events: each timed);
- `cupti_callback`: a CUPTI callback subscriber (ctypes) on the driver's and the runtime's launch calls, the
  kernel's name from the callback's `symbolName` (no durations);
- `cupti_activity`: CUPTI's activity API (ctypes) for concurrent kernels, records read from CUPTI's buffers
  (name and start/end).
"""
import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import time

METHODS = ("torch_profiler", "cupti_callback", "cupti_activity")


def _gemm():
    import torch
    torch.cuda.init()
    a = torch.randn(16, 4096, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    fn = lambda: torch.matmul(a, b.t())
    fn()
    torch.cuda.synchronize()
    return torch, fn


def _calls(torch, fn, t: dict) -> None:
    """The GEMM once, the GPU waited for; its time in t["calls_s"]."""
    s = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    t["calls_s"] = time.perf_counter() - s


def torch_profiler(torch, fn, first: bool) -> dict:
    t = {}
    s = time.perf_counter()
    from torch.profiler import ProfilerActivity, profile
    t["import_s"] = time.perf_counter() - s
    s = time.perf_counter()
    prof = profile(activities=[ProfilerActivity.CUDA])
    prof.__enter__()
    t["enter_s"] = time.perf_counter() - s
    _calls(torch, fn, t)
    s = time.perf_counter()
    prof.__exit__(None, None, None)
    t["exit_s"] = time.perf_counter() - s
    s = time.perf_counter()
    from torch.autograd import DeviceType
    evs = [(e.name(), e.duration_ns() / 1e3) for e in prof.profiler.kineto_results.events()
           if e.device_type() == DeviceType.CUDA]
    t["read_s"] = time.perf_counter() - s
    t["kernels"] = evs
    return t


def _cupti(state: dict, t: dict):
    """The process's libcupti (loaded once, kept in `state`); its load time in t["load_s"]."""
    from cublaslt_probe.gpu.cupti import find_library
    s = time.perf_counter()
    state["lib"] = state.get("lib") or ctypes.CDLL(find_library())
    t["load_s"] = time.perf_counter() - s
    return state["lib"]


CB = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p)


def cupti_callback(torch, fn, first: bool, state: dict) -> dict:
    from cublaslt_probe.gpu.cupti import CallbackData
    t = {}
    L = _cupti(state, t)
    s = time.perf_counter()
    L.cuptiSubscribe.argtypes = [ctypes.POINTER(ctypes.c_void_p), CB, ctypes.c_void_p]
    L.cuptiEnableCallback.argtypes = [ctypes.c_uint32, ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32]
    L.cuptiGetCallbackName.argtypes = [ctypes.c_int, ctypes.c_uint32, ctypes.POINTER(ctypes.c_char_p)]
    L.cuptiUnsubscribe.argtypes = [ctypes.c_void_p]
    names = []

    def on(userdata, domain, cbid, data):
        d = CallbackData.from_address(data)
        if d.callbackSite == 0 and d.symbolName:
            names.append((domain, d.symbolName.decode(errors="replace")))
    cb = CB(on)
    state["cb"] = cb
    sub = ctypes.c_void_p()
    rc = L.cuptiSubscribe(ctypes.byref(sub), cb, None)
    enabled = 0
    for domain in (1, 2):   # driver API, runtime API
        name = ctypes.c_char_p()
        for cbid in range(1, 1200):
            if L.cuptiGetCallbackName(domain, cbid, ctypes.byref(name)) == 0 and name.value and \
                    b"Launch" in name.value and b"Host" not in name.value:
                enabled += L.cuptiEnableCallback(1, sub, domain, cbid) == 0
    t["subscribe_rc"], t["enabled"] = rc, enabled
    t["enter_s"] = time.perf_counter() - s
    _calls(torch, fn, t)
    s = time.perf_counter()
    L.cuptiUnsubscribe(sub)
    t["exit_s"] = time.perf_counter() - s
    t["kernels"] = names
    return t


REQ = ctypes.CFUNCTYPE(None, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t),
                       ctypes.POINTER(ctypes.c_size_t))
DONE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t)
KIND_CONCURRENT_KERNEL = 10


def cupti_activity(torch, fn, first: bool, state: dict) -> dict:
    t = {}
    L = _cupti(state, t)
    s = time.perf_counter()
    recs = []
    if first:
        bufs = state["bufs"] = {}

        def req(buf, size, maxrec):
            b = ctypes.create_string_buffer(1 << 20)
            addr = ctypes.addressof(b)
            bufs[addr] = b
            buf[0] = addr
            size[0] = 1 << 20
            maxrec[0] = 0

        def done(ctx, stream, buf, size, valid):
            rec = ctypes.c_void_p()
            while L.cuptiActivityGetNextRecord(ctypes.c_void_p(buf), ctypes.c_size_t(valid),
                                               ctypes.byref(rec)) == 0:
                p = rec.value
                kind = ctypes.c_uint32.from_address(p).value
                if kind == KIND_CONCURRENT_KERNEL:
                    start = ctypes.c_uint64.from_address(p + 16).value
                    end = ctypes.c_uint64.from_address(p + 24).value
                    name = ctypes.c_char_p.from_address(p + 104).value
                    state["out"].append(((name or b"?").decode(errors="replace"), (end - start) / 1e3))
            bufs.pop(buf, None)
        state["cbs"] = (REQ(req), DONE(done))
        L.cuptiActivityGetNextRecord.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p)]
        t["register_rc"] = L.cuptiActivityRegisterCallbacks(*state["cbs"])
    state["out"] = recs
    t["enable_rc"] = L.cuptiActivityEnable(KIND_CONCURRENT_KERNEL)
    t["enter_s"] = time.perf_counter() - s
    _calls(torch, fn, t)
    s = time.perf_counter()
    t["disable_rc"] = L.cuptiActivityDisable(KIND_CONCURRENT_KERNEL)
    t["flush_rc"] = L.cuptiActivityFlushAll(1)
    t["exit_s"] = time.perf_counter() - s
    t["kernels"] = list(recs)
    return t


def child(method: str, out: str) -> None:
    t0 = time.perf_counter()
    torch, fn = _gemm()
    res = {"ready_s": time.perf_counter() - t0}
    state: dict = {}
    for which in ("first", "second"):
        s = time.perf_counter()
        if method == "torch_profiler":
            r = torch_profiler(torch, fn, which == "first")
        elif method == "cupti_callback":
            r = cupti_callback(torch, fn, which == "first", state)
        else:
            r = cupti_activity(torch, fn, which == "first", state)
        r["total_s"] = time.perf_counter() - s
        res[which] = r
    with open(out, "w") as f:
        json.dump(res, f)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default="kernel_capture.json")
    ap.add_argument("--child")
    ap.add_argument("--child-out")
    a = ap.parse_args()
    if a.child:
        return child(a.child, a.child_out)
    res = {m: [] for m in METHODS}
    for r in range(a.rounds):
        for m in (METHODS if r % 2 == 0 else METHODS[::-1]):
            out = f"{a.out}.{m}.{r}.json"
            s = time.perf_counter()
            p = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", m, "--child-out", out],
                               capture_output=True, text=True, timeout=300)
            wall = time.perf_counter() - s
            if p.returncode:
                res[m].append({"error": p.stderr[-1500:], "wall_s": wall})
            else:
                with open(out) as f:
                    got = json.load(f)
                os.remove(out)
                got["wall_s"] = wall
                res[m].append(got)
            x = res[m][-1]
            print(m, r, "ERROR " + x["error"][-400:] if "error" in x else
                  f"first {x['first']['total_s']:.3f} s, second {x['second']['total_s']:.4f} s, "
                  f"kernels {x['first']['kernels']}", flush=True)
    res["summary"] = {m: {w: round(statistics.median(x[w]["total_s"] for x in xs if w in x), 4)
                          for w in ("first", "second")} for m, xs in res.items() if any("first" in x for x in xs)}
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps(res["summary"], indent=1))


if __name__ == "__main__":
    main()
