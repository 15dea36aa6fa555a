"""First-call anatomy: where did the first GEMM's time go, and was anything compiled at run time?

`run(case)` (GPU) starts fresh child processes (`python -m cublaslt_probe.gpu.firstcall --child ...`), each
with one environment, and collects what each measured. `analyse(result)` (CPU) turns that into components
and a verdict; the CLI prints `render(analysis)`.

The runs and what each separates:
- `lazy`   default (CUDA_MODULE_LOADING=LAZY): first call, second call, steady state, a new shape whose kernel
           is already loaded (a variant of the shape checked with the kernel capture to launch the same kernel).
- `lazy_pre` like `lazy`, but before the first GEMM the library is initialised apart: the cuBLAS handle
           is created and cuBLASLt answers one heuristic query for an unrelated problem (its per-context
           init, `cublasLtCtxInit` in a level-5 log); each is timed on its own.
- `eager`  CUDA_MODULE_LOADING=EAGER with the same pre-initialisation: every module of the library loads
           during handle creation, so the first GEMM no longer pays for loading its kernel;
           lazy_pre first − eager first ≈ loading the kernel's module.
- `nocache` CUBLASLT_HEURISTICS_CACHE_CAPACITY=0: every call runs the heuristic; its steady host time minus
           `lazy`'s ≈ one heuristic cache miss.
- `nojit`  CUDA_DISABLE_PTX_JIT=1: the driver may not JIT-compile PTX; if the GEMM still runs, its kernels are
           machine code shipped in the library (selected, not compiled).
Every child uses a fresh, empty CUDA_CACHE_PATH: files appearing there would be PTX JIT output (ComputeCache).
Host times are wall-clock µs around the call plus `torch.cuda.synchronize()`.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from cublaslt_probe.cases import Case
from cublaslt_probe.errors import error_text

RUNS = {
    "lazy": {"CUDA_MODULE_LOADING": "LAZY"},
    "lazy_pre": {"CUDA_MODULE_LOADING": "LAZY", "CUBLASLT_PROBE_PREINIT": "1"},
    "eager": {"CUDA_MODULE_LOADING": "EAGER", "CUBLASLT_PROBE_PREINIT": "1"},
    "nocache": {"CUDA_MODULE_LOADING": "LAZY", "CUBLASLT_HEURISTICS_CACHE_CAPACITY": "0"},
    "nojit": {"CUDA_MODULE_LOADING": "LAZY", "CUDA_DISABLE_PTX_JIT": "1"},
}


def run(key: str, timeout: float = 240.0) -> dict:
    """Run every child for the case `key` (see cases.Case.key); returns the raw result (JSON-ready)."""
    from cublaslt_probe.gpu.host import require_gpu
    require_gpu("first-call")
    out = {"key": key, "runs": {}}
    for name, extra in RUNS.items():
        with tempfile.TemporaryDirectory() as cache:
            env = {k: v for k, v in os.environ.items()
                   if k not in ("CUDA_MODULE_LOADING", "CUBLASLT_HEURISTICS_CACHE_CAPACITY", "CUDA_DISABLE_PTX_JIT")}
            env.update(extra)
            env["CUDA_CACHE_PATH"] = cache
            env["CUDA_CACHE_DISABLE"] = "0"
            t0 = time.time()
            p = subprocess.run([sys.executable, "-m", "cublaslt_probe.gpu.firstcall", "--child", key],
                               env=env, capture_output=True, text=True, timeout=timeout)
            files = sum(len(f) for _, _, f in os.walk(cache))
            rec = {"env": extra, "returncode": p.returncode, "wall_s": time.time() - t0, "cache_files": files}
            try:
                rec.update(json.loads(p.stdout.strip().splitlines()[-1]))
            except (IndexError, json.JSONDecodeError):
                rec["error"] = (p.stderr or p.stdout)[-800:]
            out["runs"][name] = rec
    return out


def _child(key: str) -> dict:
    """The measurements of one fresh process (run as `python -m cublaslt_probe.gpu.firstcall --child KEY`)."""
    t_start = time.perf_counter()
    import torch

    from cublaslt_probe.gpu.operands import Builder
    c = Case.from_key(key)
    res = _library_init(torch, t_start)
    b = Builder()   # an lt-backend Case binds it to the libcublasLt torch loaded
    b.set_flags(c)
    built = b.build(c)
    torch.cuda.synchronize()
    res.update(_call_times(torch, built.fn))
    res.update(_new_shape(torch, b, c, built.fn))
    res["ok"] = True
    return res


def _timed(torch, fn) -> float:
    """Host µs of one call of `fn` and a synchronize."""
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e6


def _library_init(torch, t_start: float) -> dict:
    """Import, CUDA context and cuBLAS handle times; with CUBLASLT_PROBE_PREINIT=1 also cuBLASLt's per-context
    init (its first heuristic query, for an unrelated shape), each timed on its own."""
    res: dict = {}
    t = time.perf_counter()
    torch.cuda.init()
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    res["import_s"] = t - t_start
    res["context_us"] = (time.perf_counter() - t) * 1e6
    # cuBLAS handle creation (library init; with CUDA_MODULE_LOADING=EAGER it loads every module of the
    # library here), kept out of the first GEMM so that the two can be told apart
    t = time.perf_counter()
    torch.cuda.current_blas_handle()
    torch.cuda.synchronize()
    res["blas_handle_us"] = (time.perf_counter() - t) * 1e6
    if os.environ.get("CUBLASLT_PROBE_PREINIT") == "1":
        from cublaslt_probe.gpu import lt
        t = time.perf_counter()
        lib = lt.LtLibrary()
        with lt.LtMatmul(lib, lt.Problem(72, 40, 24, dtype="fp32")) as mm:  # unrelated shape
            mm.heuristic(1)
        res["lt_init_us"] = (time.perf_counter() - t) * 1e6
    return res


def _call_times(torch, fn) -> dict:
    """First, second and steady call (host µs with a synchronize), the allocator's growth on the first, and
    the host cost of the call alone."""
    res = {"mem_reserved_before": torch.cuda.memory_reserved(), "first_us": _timed(torch, fn),
           "mem_reserved_after": torch.cuda.memory_reserved(), "second_us": _timed(torch, fn)}
    res["steady_us"] = statistics.median([_timed(torch, fn) for _ in range(50)])
    # host-side cost of the call alone (no sync): where the heuristic's CPU time shows
    launch = []
    for _ in range(50):
        t0 = time.perf_counter()
        fn()
        launch.append((time.perf_counter() - t0) * 1e6)
        torch.cuda.synchronize()
    res["launch_us"] = statistics.median(launch)
    return res


def _new_shape(torch, b, c, fn) -> dict:
    """The kernels `fn` (the GEMM of Case `c`) launches (the probe's kernel capture), and a new shape whose
    kernel is already loaded: variants built by `b` are tried, the first that launches the same kernels is
    kept."""
    from cublaslt_probe.gpu.kernel_capture import profile_kernels
    marker = torch.zeros(1, dtype=torch.int8, device="cuda")

    def kernels(f):
        [ks] = profile_kernels(torch, [f], marker)
        return [name for name, _ in ks]
    res = {"kernels": kernels(fn), "new_shape": None}
    variants = [(c.m, c.n, c.k + 64), (c.m, c.n, c.k - 64), (c.m, c.n, c.k * 2), (c.m + 8, c.n, c.k),
                (c.m, c.n + 64, c.k)]
    for (m, n, k) in variants:
        if min(m, n, k) < 1:
            continue
        v = Case(c.backend, c.op, c.dtype, c.layout, m, n, k, c.batch)
        vb = b.build(v)
        torch.cuda.synchronize()
        first = _timed(torch, vb.fn)
        second = _timed(torch, vb.fn)
        ks = kernels(vb.fn)
        if ks == res["kernels"]:
            res["new_shape"] = {"key": v.key, "first_us": first, "second_us": second, "kernels": ks}
            break
    return res


def analyse(result: dict) -> dict:
    """Components (µs) with their evidence, and the verdict. CPU only."""
    runs = result["runs"]
    lazy, pre, eager, nocache, nojit = (runs.get(k, {}) for k in ("lazy", "lazy_pre", "eager", "nocache", "nojit"))
    comp: dict = {}
    ev: list[str] = []
    if lazy.get("ok"):
        steady = lazy["steady_us"]
        comp["first_call_us"] = lazy["first_us"]
        comp["second_call_us"] = lazy["second_us"]
        comp["steady_us"] = steady
        ev.append(f"fresh process (LAZY): cuBLAS handle {lazy.get('blas_handle_us', 0) / 1e3:.1f} ms, then first GEMM "
                  f"{lazy['first_us'] / 1e3:.1f} ms, second {lazy['second_us']:.0f} µs, steady {steady:.0f} µs "
                  "(call + synchronize, median of 50)")
        comp["handle_init_us"] = lazy.get("blas_handle_us")
        base = lazy
        if pre.get("ok"):
            base = pre
            comp["lt_context_init_us"] = pre.get("lt_init_us")
            comp["first_call_after_init_us"] = pre["first_us"]
            ev.append(f"with the library initialised first: cuBLASLt's per-context init (first heuristic query of "
                      f"the process) took {pre.get('lt_init_us', 0) / 1e3:.1f} ms, and the first GEMM then took "
                      f"{pre['first_us']:.0f} µs")
        if eager.get("ok"):
            comp["module_loading_us"] = max(0.0, base["first_us"] - eager["first_us"])
            ev.append(f"EAGER module loading: handle creation {eager.get('blas_handle_us', 0) / 1e3:.0f} ms "
                      f"(every module of the library loads there), first GEMM {eager['first_us']:.0f} µs -> "
                      f"loading this kernel's module lazily ≈ {comp['module_loading_us']:.0f} µs")
        if nocache.get("ok"):
            comp["heuristic_miss_us"] = max(0.0, nocache["launch_us"] - lazy["launch_us"])
            ev.append(f"heuristics cache off: host time per call {nocache['launch_us']:.0f} µs vs "
                      f"{lazy['launch_us']:.0f} µs with the cache -> one miss ≈ {comp['heuristic_miss_us']:.0f} µs")
        ns = lazy.get("new_shape")
        if ns:
            comp["new_shape_first_us"] = ns["first_us"]
            ev.append(f"new shape {ns['key']} launching the same kernel (CUPTI): first call {ns['first_us']:.0f} µs, "
                      f"second {ns['second_us']:.0f} µs -> no module load; the extra "
                      f"{max(0.0, ns['first_us'] - ns['second_us']):.0f} µs is the heuristic miss and cold caches")
        grow = lazy.get("mem_reserved_after", 0) - lazy.get("mem_reserved_before", 0)
        comp["allocator_growth_bytes"] = grow
        if grow:
            ev.append(f"the first call grew torch's reserved memory by {grow / 2**20:.1f} MiB (workspace/allocator)")
        known = comp.get("module_loading_us", 0) + comp.get("heuristic_miss_us", 0) + steady
        comp["other_first_call_us"] = max(0.0, base["first_us"] - known)
        if comp["other_first_call_us"] > 10_000 and pre.get("lt_init_us"):
            ev.append(f"{comp['other_first_call_us'] / 1e3:.0f} ms of the first GEMM is none of the above: the cuBLAS "
                      f"handle initialises its own cuBLASLt context at its first GEMM (a level-5 log shows "
                      f"`cublasLtCtxInit` there), which on a separate handle took {pre['lt_init_us'] / 1e3:.0f} ms; "
                      "the remainder is first-use setup on the host (not a compilation: see below)")
    jit_files = [(k, r.get("cache_files", 0)) for k, r in runs.items()]
    jit_seen = any(n for _, n in jit_files)
    ev.append("ComputeCache (fresh CUDA_CACHE_PATH per run) after each run: " +
              ", ".join(f"{k} {n} files" for k, n in jit_files))
    nojit_ok = bool(nojit.get("ok"))
    ev.append(f"with CUDA_DISABLE_PTX_JIT=1 the GEMM {'ran' if nojit_ok else 'FAILED'}"
              + (" and launched the same kernels" if nojit_ok and nojit.get("kernels") == lazy.get("kernels") else ""))
    if not jit_seen and nojit_ok:
        verdict = "selected by heuristics; no runtime compilation observed"
    elif jit_seen:
        verdict = "runtime compilation observed: the driver wrote PTX JIT output to the ComputeCache"
    else:
        verdict = "inconclusive: the run with PTX JIT disabled did not complete (see its error)"
    return {"key": result["key"], "components_us": comp, "evidence": ev, "verdict": verdict,
            "kernels": lazy.get("kernels")}


def render(a: dict) -> str:
    lines = [f"first-call anatomy for {a['key']}", ""]
    names = {"handle_init_us": "cuBLAS handle creation (before the GEMM)",
             "first_call_us": "first GEMM (fresh process)",
             "lt_context_init_us": "cuBLASLt per-context init (first heuristic query)",
             "first_call_after_init_us": "first GEMM after that init", "second_call_us": "second call, same shape",
             "steady_us": "steady state", "module_loading_us": "lazy module loading",
             "heuristic_miss_us": "heuristic cache miss", "new_shape_first_us": "first call, new shape, kernel loaded",
             "other_first_call_us": "rest of the first GEMM (see evidence)"}
    for k, label in names.items():
        v = a["components_us"].get(k)
        if v is not None:
            lines.append(f"  {label:<45} {v:12.0f} µs")
    g = a["components_us"].get("allocator_growth_bytes")
    if g is not None:
        lines.append(f"  {'allocator growth on first call':<45} {g / 2**20:12.1f} MiB")
    lines += ["", "evidence:"] + [f"  - {e}" for e in a["evidence"]] + ["", f"verdict: {a['verdict']}"]
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        try:
            print(json.dumps(_child(sys.argv[2])))
        except Exception as e:  # noqa: BLE001  the parent reports it
            print(json.dumps({"ok": False, "error": error_text(e)}))
    else:
        sys.exit("usage: python -m cublaslt_probe.gpu.firstcall --child KEY "
                 "(internal; use `cublaslt-probe first-call`)")
