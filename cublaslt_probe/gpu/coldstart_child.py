"""The GPU side of `cold-start`: one fresh process, one environment, the program's steps, the evidence.

    python -m cublaslt_probe.gpu.coldstart_child --steps N [--preinit] [--no-cupti] --func FILE_OR_MODULE:NAME
    python -m cublaslt_probe.gpu.coldstart_child --steps N [--preinit] [--no-cupti] --script SCRIPT [ARGS...]

The parent (`cublaslt_probe.gpu.coldstart.run`) sets the environment (module loading, JIT and cache variables)
and reads the one JSON line this prints last. What is measured:

- each step's wall time (the step, then `torch.cuda.synchronize()`) and host time (until the step returned);
- around each step: torch's allocator counters (`torch.cuda.memory_stats`), torch.compile's compile-time
  counters (`torch._dynamo.utils.compilation_time_metrics`, when torch.compile was used), the files in the
  controlled cache folders (ComputeCache, Inductor, Triton, torch's kernel cache), the shared libraries the
  process has mapped (libnvrtc, libnvJitLink, cuDNN's runtime-compiled engines, ...), the process's CPU time
  (its own and its compiler subprocesses'), page faults and bytes read from storage (`process_counters`);
- the cuBLASLt level-2 log of each step (the in-process logger of `lt.Logger`), as lines;
- with CUPTI (`cupti.Recorder`): each module the driver loaded and the load, link and allocation calls, with
  their host timestamps;
- the compile entry points of the runtime compilers a program may use (`coldstart_hooks.JIT_HOOKS`), wrapped when
  their module is imported: CuPy's cached compile and its NVRTC call, Triton's `JITFunction.run`, `compile`,
  launcher build and module load, Numba's CUDA compile (NVVM, link), JAX's own compile events
  (`jax.monitoring`: tracing, lowering, XLA backend compile, persistent-cache hits); seconds and calls per window,
  and the spans of the calls over 1 ms; with XLA, the autotuning results and logs XLA wrote
  (`CUBLASLT_PROBE_XLA_DUMP`) per window;
- with ``--preinit``: before the first step, the libraries are initialised one by one (CUDA context, cuBLAS
  handle and first GEMM, cuBLASLt first GEMM with a bias, fp8 `_scaled_mm`, cuDNN; CuPy's own cuBLAS handle,
  first GEMM and first reduction, JAX's backend and first transfer, Numba's context and first transfer, each when
  the program imported it), each timed, the driver's load calls in the preinit window tagged with the item they
  fell in.

XLA_FLAGS is set to the run's flags (`CUBLASLT_PROBE_XLA_FLAGS`, from the parent) only where the installed jaxlib
is known to accept them (`apply_xla_flags`).

A step is either a callable (``--func``: called once; if it returns a callable, that was the setup and the
returned callable is the step) or a script: one that marks its steps with ``with cublaslt_probe.cold_start_step():``
runs as ``__main__`` and its marked steps are measured (`coldstart_step`: the session is active while the script
runs); one that marks none but defines ``make_step()`` or ``step()`` at module level has that run ``--steps``
times. `Session` holds each stage of the program's life (`run_target`, `run_func`, `run_script`, `run_steps`).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import resource
import runpy
import statistics
import sys
import time
import traceback

from cublaslt_probe.analysis.coldstart.envs import CACHE_VARS
from cublaslt_probe.errors import error_text
from cublaslt_probe.gpu import coldstart_step
from cublaslt_probe.gpu.coldstart_hooks import (
    HOOKED,
    TIMERS,
    XLA_DUMP_FILES,
    XLA_TEXT_KEPT,
    hook_loaded,
    install_hooks,
    xla_autotune_summary,
)

# Shared libraries reported when they appear: compilers, JIT, CUDA libraries (other new libraries are not kept)
WATCHED_LIBS = ("libnvrtc", "libnvJitLink", "libnvptxcompiler", "libnvidia-ptxjitcompiler", "libcudnn",
                "libcublas", "libcupti", "libtriton", "libcuda", "libnvvm", "libcufft", "libcusparse",
                "libcusolver", "libcurand", "libnccl")
MAX_LOG_LINES = 4000
T0 = time.perf_counter_ns()


def _rel_ns(t: int) -> int:
    return t - T0


def mapped_libraries() -> list[str]:
    out: list[str] = []
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split(None, 5)
                if len(parts) == 6 and ".so" in parts[5]:
                    b = os.path.basename(parts[5].strip())
                    if b not in out:
                        out.append(b)
    except OSError:
        pass
    return out


def process_counters() -> dict[str, float]:
    """The process's own accounting, read at a window's edges: CPU seconds of this process and of its waited-for
    children (compilers run as subprocesses: ptxas, the C compiler), page faults that had to read from storage
    (major), blocks read from storage, and what /proc/self/io and /proc/self/stat add where readable (bytes the
    process had read from storage, read and written through system calls — Python writing bytecode caches shows
    there; the time it waited for block I/O, kept only where the kernel's delay accounting is on). A window's
    difference tells CPU work from waiting, and a first read of files from storage (the operating system's file
    cache cold) from a read the cache served."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    out = {"cpu_s": me.ru_utime + me.ru_stime, "children_cpu_s": kids.ru_utime + kids.ru_stime,
           "majflt": me.ru_majflt, "children_majflt": kids.ru_majflt,
           "inblock_bytes": 512 * (me.ru_inblock + kids.ru_inblock), "voluntary_switches": me.ru_nvcsw}
    try:
        with open("/proc/self/io") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in ("rchar", "read_bytes", "wchar"):
                    out[k] = int(v)
    except (OSError, ValueError):
        pass
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        ticks = int(fields[39])  # field 42, delayacct_blkio_ticks (fields from the state, field 3, on)
        if ticks:
            out["blkio_s"] = ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        pass
    return out


def counters_delta(before: dict, after: dict) -> dict:
    """`after` − `before`, key by key (a key only one side has is left out); seconds rounded to the microsecond."""
    return {k: (round(after[k] - before[k], 6) if isinstance(after[k], float) else after[k] - before[k])
            for k in after if k in before}


def cache_files(root: str | None) -> dict[str, int]:
    """Relative path -> size of every file under `root`."""
    out: dict[str, int] = {}
    if not root or not os.path.isdir(root):
        return out
    for d, _, files in os.walk(root):
        for f in files:
            p = os.path.join(d, f)
            try:
                out[os.path.relpath(p, root)] = os.path.getsize(p)
            except OSError:
                pass
    return out


class Session:
    """Per-step bookkeeping of one child process."""

    def __init__(self, torch, steps: int, recorder=None, logger=None, preinit: bool = False):
        self.torch = torch
        self.steps_wanted = steps
        self.rec = recorder
        self.logger = logger
        self.steps: list[dict] = []
        self.windows: list[dict] = []  # setup, preinit, step windows: name, t0_ns, t1_ns, evidence deltas
        self.lt_lines: dict[str, list[str]] = {}
        self.lt_counts: dict[str, int] = {}
        self._files = {v: cache_files(os.environ.get(v)) for v in CACHE_VARS}
        self._libs = mapped_libraries()
        self._mem = self._mem_stats()
        self._dyn = self._dynamo()
        self._jit = TIMERS.snapshot()
        self._proc = process_counters()
        self._spans = len(TIMERS.spans)
        self._xla_dump = os.environ.get("CUBLASLT_PROBE_XLA_DUMP")
        self._xla_seen: dict[str, tuple] = {}
        self._xla_autotune()  # what the dumps held before the program ran is not the program's
        self._open: tuple[str, int] | None = None
        self._t_host = 0
        self.preinit_wanted = preinit
        self.preinit_result: dict | None = None
        self.func_was_factory: bool | None = None  # --func: whether the function returned the step (a factory)

    # --- snapshots -------------------------------------------------------------------------------------
    def _mem_stats(self) -> dict:
        if not self.torch.cuda.is_initialized():  # never create the context just to read counters
            return {}
        try:
            s = self.torch.cuda.memory_stats()
        except Exception:  # noqa: BLE001  the counters are evidence, not needed
            return {}
        keys = ("reserved_bytes.all.current", "segment.all.current", "num_device_alloc", "num_device_free",
                "num_alloc_retries", "allocated_bytes.all.current")
        return {k: int(s.get(k, 0)) for k in keys if k in s}

    @staticmethod
    def _dynamo() -> dict:
        mod = sys.modules.get("torch._dynamo.utils")
        metrics = getattr(mod, "compilation_time_metrics", None) if mod else None
        out: dict = {}
        if isinstance(metrics, dict):
            for k, v in metrics.items():
                try:
                    out[str(k)] = float(sum(v)) if isinstance(v, (list, tuple)) else float(v)
                except (TypeError, ValueError):
                    pass
        return out

    def _delta(self) -> dict:
        files = {v: cache_files(os.environ.get(v)) for v in CACHE_VARS}
        new_files = {}
        for v in CACHE_VARS:
            new = {p: s for p, s in files[v].items() if p not in self._files[v]}
            if new:
                new_files[v] = {"count": len(new), "bytes": sum(new.values()),
                                "by_ext": _by_ext(new), "sample": sorted(new)[:40]}
        libs = mapped_libraries()
        new_libs = [b for b in libs if b not in self._libs and b.startswith(WATCHED_LIBS)]
        mem = self._mem_stats()
        dyn = self._dynamo()
        d = {"new_files": new_files, "new_libraries": new_libs,
             "mem_before": self._mem, "mem_after": mem,
             "compile_s": {k: round(v - self._dyn.get(k, 0.0), 6) for k, v in dyn.items()
                           if v - self._dyn.get(k, 0.0) > 1e-9}}
        triton = sorted({os.path.splitext(os.path.basename(p))[0] for p in files["TRITON_CACHE_DIR"]
                         if p.endswith(".cubin") and p not in self._files["TRITON_CACHE_DIR"]})
        if triton:
            d["triton_kernels"] = triton[:200]
        self._files, self._libs, self._mem, self._dyn = files, libs, mem, dyn
        jit = TIMERS.snapshot()
        dj = {}
        for k, (ns, n) in jit.items():
            ns0, n0 = self._jit.get(k, (0, 0))
            if n > n0 or ns > ns0:
                dj[k] = {"s": round((ns - ns0) / 1e9, 6), "n": n - n0}
        if dj:
            d["jit_s"] = dj
        self._jit = jit
        xla = self._xla_autotune()
        if xla:
            d["xla_autotune"] = xla
        return d

    def _xla_autotune(self) -> dict:
        """What XLA wrote to its autotuning dumps since the last window (it rewrites them at each compilation)."""
        out = {}
        if not self._xla_dump:
            return out
        for f in XLA_DUMP_FILES:
            p = os.path.join(self._xla_dump, f)
            try:
                st = os.stat(p)
            except OSError:
                continue
            sig = (st.st_mtime_ns, st.st_size)
            if self._xla_seen.get(f) == sig:
                continue
            self._xla_seen[f] = sig
            try:
                with open(p, errors="replace") as fh:
                    text = fh.read()
            except OSError:
                continue
            out[f.split(".")[0]] = {**xla_autotune_summary(text), "text": text[:XLA_TEXT_KEPT]}
        return out

    def _take_spans(self, t0: int, t1: int) -> list[dict]:
        spans = TIMERS.spans[self._spans:]
        self._spans = len(TIMERS.spans)
        return [{"key": k, "t0_ms": round((a - t0) / 1e6, 3), "t1_ms": round((b - t0) / 1e6, 3)}
                for k, a, b in spans if b >= t0 and a <= t1][:500]

    # --- windows -----------------------------------------------------------------------------------------
    def begin(self, name: str) -> None:
        self.torch.cuda.synchronize()
        self._take_log(None)
        hook_loaded()
        self._spans = len(TIMERS.spans)
        self._proc = process_counters()
        self._open = (name, time.perf_counter_ns())

    def end(self, ok: bool = True, error: str | None = None) -> dict:
        name, t0 = self._open
        t_host = self._t_host or time.perf_counter_ns()
        try:
            self.torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001
            error = error or error_text(e)
            ok = False
        t1 = time.perf_counter_ns()
        proc = process_counters()
        self._t_host = 0
        w = {"name": name, "t0_ns": _rel_ns(t0), "t1_ns": _rel_ns(t1), "wall_s": (t1 - t0) / 1e9,
             "host_s": (t_host - t0) / 1e9, "ok": ok, "process": counters_delta(self._proc, proc)}
        if error:
            w["error"] = error
        w.update(self._delta())
        spans = self._take_spans(t0, t1)
        if spans:
            w["jit_spans"] = spans
        self._take_log(name)
        self.windows.append(w)
        self._open = None
        if name.startswith("step"):
            self.steps.append(w)
        return w

    def host_done(self) -> None:
        self._t_host = time.perf_counter_ns()

    def _take_log(self, name: str | None) -> None:
        if self.logger is None:
            return
        from cublaslt_probe.gpu import lt
        lines = lt.Logger.render([r for r in self.logger.take() if r[1] == 2])
        if name is None:
            if lines:
                self.lt_counts["between"] = self.lt_counts.get("between", 0) + len(lines)
            return
        self.lt_counts[name] = len(lines)
        if name in ("setup", "preinit", "step1", "step2"):
            self.lt_lines[name] = lines[:MAX_LOG_LINES]

    # --- steps -------------------------------------------------------------------------------------------
    def open_setup(self) -> None:
        """Open the setup window: what the program does before its first step (imports, building the model).
        Nothing is synchronised: the program has not touched the GPU yet, and the window must not make the
        CUDA context itself."""
        self._open = ("setup", time.perf_counter_ns())

    def close_setup(self) -> None:
        """Close the setup window if it is still open (a script that marked no step, a factory's first call)."""
        if self._open is not None and self._open[0] == "setup":
            self.end()

    def start_step(self) -> None:
        """Close the setup window, initialise the libraries apart if asked (once), open the next step."""
        self.close_setup()
        if self.preinit_wanted and self.preinit_result is None:
            self.begin("preinit")
            self.preinit_result = preinit(self.torch)
            self.end()
        self.begin(f"step{len(self.steps) + 1}")

    def end_marked(self, error: str | None = None) -> None:
        """Close the step a script marked (`coldstart_step.cold_start_step`), failed where `error` is given."""
        if self._open is not None:
            self.host_done()
            self.end(ok=error is None, error=error)

    def abort(self, error: str) -> None:
        """Close the open window as failed with `error` (the program raised); a second error is not reported."""
        if self._open is not None:
            try:
                self.end(ok=False, error=error)
            except Exception:  # noqa: BLE001  the first error is the one reported
                pass

    def run_steps(self, step) -> None:
        for _ in range(self.steps_wanted):
            self.start_step()
            try:
                step()
                self.host_done()
                self.end()
            except Exception as e:  # reported, the steps stop
                self.end(ok=False, error=error_text(e))
                raise

    def run_func(self, fn) -> None:
        """``--func``: the first call is step 1, unless it returns a callable: then that call was the setup (its
        window, its log lines and counts renamed ``factory``) and the callable is the step, run `steps_wanted`
        times; else the function is the step, run `steps_wanted` − 1 times more."""
        self.start_step()
        try:
            ret = fn()
            self.host_done()
            self.end()
        except Exception as e:
            self.end(ok=False, error=error_text(e))
            raise
        self.func_was_factory = callable(ret)
        if callable(ret):
            w = self.steps.pop()
            w["name"] = "factory"
            if "step1" in self.lt_lines:
                self.lt_lines["factory"] = self.lt_lines.pop("step1")
            self.lt_counts["factory"] = self.lt_counts.pop("step1", 0)
            self.run_steps(ret)
        else:
            self.steps_wanted -= 1
            self.run_steps(fn)

    def run_script(self, script: str, args: list[str]) -> None:
        """``--script``: the script runs as ``__main__`` with `args`; the steps it marked
        (`cublaslt_probe.cold_start_step`) are measured as it runs them. One that marked none but defines
        ``make_step()`` (called once, in the setup window: it returns the step) or ``step()`` has that run
        `steps_wanted` times."""
        old = sys.argv
        sys.argv = [script, *args]
        sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
        try:
            ns = runpy.run_path(script, run_name="__main__")
        finally:
            sys.argv = old
        if self.steps:
            self.close_setup()
            return
        maker, plain = ns.get("make_step"), ns.get("step")
        if callable(maker):
            step = maker()
        elif callable(plain):
            step = plain
        else:
            raise SystemExit(f"{script}: it marked no step (`with cublaslt_probe.cold_start_step():`) "
                             "and defines neither make_step() nor step()")
        self.run_steps(step)

    def run_target(self, func: str | None, script: list[str] | None) -> None:
        """The program of the child's arguments, from its setup window on (`run_func` or `run_script`)."""
        self.open_setup()
        if func:
            self.run_func(load_callable(func))
        elif script:
            self.run_script(script[0], script[1:])
        else:
            raise SystemExit("give --func or --script")

    def ok(self) -> bool:
        """Whether the program ran steps and every one completed."""
        return bool(self.steps) and all(w["ok"] for w in self.steps)

    def record(self) -> dict:
        """What the session measured, for the child's record: the preinit items (when asked), the windows, the
        cuBLASLt log lines and counts per window."""
        out: dict = {}
        if self.preinit_result is not None:
            out["preinit"] = self.preinit_result
        out.update({"windows": self.windows, "lt_lines": self.lt_lines, "lt_counts": self.lt_counts})
        return out


def _by_ext(files: dict[str, int]) -> dict[str, int]:
    out: dict[str, int] = {}
    for p in files:
        ext = os.path.splitext(p)[1].lstrip(".") or "(none)"
        out[ext] = out.get(ext, 0) + 1
    return out


# --- preinit ---------------------------------------------------------------------------------------------------
PREINIT_SPANS: dict[str, tuple[int, int]] = {}  # item -> (t0_ns, t1_ns): which item the driver's calls fall in


def preinit(torch) -> dict:
    """Initialise the libraries a step may touch, each timed apart (s); failures are kept as text. torch's (CUDA
    context, cuBLAS handle and first GEMMs, cuBLASLt, cuDNN) always; CuPy's (its own cuBLAS handle, first GEMM
    and first reduction), JAX's (its backend, a first transfer) and Numba's (its context, a first transfer) when
    the program imported them."""
    out: dict = {}

    def timed(name, fn):
        t = time.perf_counter_ns()
        try:
            fn()
            torch.cuda.synchronize()
            out[name] = (time.perf_counter_ns() - t) / 1e9
            PREINIT_SPANS[name] = (t, time.perf_counter_ns())
        except Exception as e:  # noqa: BLE001
            out[name] = error_text(e)

    dev = "cuda"
    timed("cuda_context", lambda: torch.zeros(1, device=dev))
    timed("cublas_handle", lambda: torch.cuda.current_blas_handle())
    timed("cublas_first_gemm_fp32", lambda: torch.ones(8, 8, device=dev) @ torch.ones(8, 8, device=dev))
    timed("cublas_first_gemm_bf16", lambda: torch.ones(8, 8, device=dev, dtype=torch.bfloat16)
          @ torch.ones(8, 8, device=dev, dtype=torch.bfloat16))
    timed("cublaslt_first_gemm_bias", lambda: torch.nn.functional.linear(
        torch.ones(8, 16, device=dev, dtype=torch.bfloat16), torch.ones(24, 16, device=dev, dtype=torch.bfloat16),
        torch.ones(24, device=dev, dtype=torch.bfloat16)))

    def fp8():
        a = torch.ones(16, 32, device=dev).to(torch.float8_e4m3fn)
        b = torch.ones(16, 32, device=dev).to(torch.float8_e4m3fn).t()
        one = torch.ones((), device=dev)
        torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    timed("cublaslt_first_fp8", fp8)
    if torch.backends.cudnn.is_available():
        timed("cudnn_handle_first_conv", lambda: torch.nn.functional.conv2d(
            torch.ones(1, 1, 8, 8, device=dev), torch.ones(1, 1, 3, 3, device=dev)))
    cp = sys.modules.get("cupy")
    if cp is not None and hasattr(cp, "cuda"):
        # CuPy keeps its own cuBLAS handle, made at its first matmul, and its own reductions (CUB's device-wide
        # kernels, or kernels it compiles): a CuPy program pays these in its first step, apart from torch's
        timed("cupy_cublas_handle", lambda: cp.cuda.device.get_cublas_handle())
        timed("cupy_first_gemm_fp32", lambda: (cp.ones((8, 8), cp.float32) @ cp.ones((8, 8), cp.float32),
                                               cp.cuda.Device().synchronize()))
        timed("cupy_first_reduction", lambda: (cp.ones(8, cp.float32).sum(), cp.cuda.Device().synchronize()))
    jax = sys.modules.get("jax")
    if jax is not None and hasattr(jax, "devices"):
        # JAX starts its backend (the PjRt client on the GPU) at its first use, and its first transfer
        timed("jax_backend", lambda: jax.devices())
        timed("jax_first_transfer", lambda: jax.device_put(1.0).block_until_ready())
    nbc = sys.modules.get("numba.cuda")
    if nbc is not None and hasattr(nbc, "current_context"):
        # Numba's CUDA driver layer and its context (on the primary context torch made), and its first transfer
        import numpy as np
        timed("numba_context", lambda: nbc.current_context())
        timed("numba_first_transfer", lambda: (nbc.to_device(np.ones(8, np.float32)), nbc.synchronize()))
    return out


# --- loading the program -----------------------------------------------------------------------------------------
def load_callable(spec: str):
    """`path/to/file.py:NAME` or `package.module:NAME` (NAME may be dotted)."""
    where, _, qual = spec.rpartition(":")
    if not where or not qual:
        raise SystemExit(f"--func {spec}: give FILE.py:NAME or MODULE:NAME")
    if where.endswith(".py") or os.path.sep in where:
        d = os.path.dirname(os.path.abspath(where))
        if d not in sys.path:
            sys.path.insert(0, d)
        ns = runpy.run_path(where, run_name="__cublaslt_probe_coldstart__")
        obj = ns[qual.split(".")[0]]
        for part in qual.split(".")[1:]:
            obj = getattr(obj, part)
        return obj
    import importlib
    obj = importlib.import_module(where)
    for part in qual.split("."):
        obj = getattr(obj, part)
    return obj


# The oldest jaxlib whose XLA is known to accept every flag a run may set (the autotuning dumps
# --xla_gpu_dump_autotune_results_to / --xla_gpu_dump_autotune_logs_to, --xla_gpu_autotune_level, the autotuning
# cache folders): XLA aborts the process at its first use on a flag it does not know, so an older jaxlib gets none.
XLA_MIN_JAXLIB = (0, 4, 30)


def _version(text: str) -> tuple[int, ...]:
    """The leading numbers of a version string ("0.4.30.dev20240601" -> (0, 4, 30))."""
    out = []
    for part in text.split("."):
        m = re.match(r"\d+", part)
        if not m:
            break
        out.append(int(m.group()))
    return tuple(out)


def xla_flags_accepted(jaxlib: str | None) -> str | None:
    """None when the run's XLA flags can be set with this jaxlib version (None: not installed), else why not."""
    if jaxlib is None:
        return "jaxlib is not installed: no XLA flags set"
    if _version(jaxlib) < XLA_MIN_JAXLIB:
        return (f"jaxlib {jaxlib} is older than {'.'.join(map(str, XLA_MIN_JAXLIB))}, whose XLA is known to accept "
                "the autotuning dump and cache flags: no XLA flags set (no autotuning evidence)")
    return None


def apply_xla_flags() -> dict:
    """Set XLA_FLAGS to the run's flags (`CUBLASLT_PROBE_XLA_FLAGS`, from the parent) where the installed jaxlib
    accepts them; elsewhere leave the user's XLA_FLAGS as they are. Returns what was done, for the record."""
    flags = os.environ.pop("CUBLASLT_PROBE_XLA_FLAGS", None)
    if flags is None:
        return {"set": False, "why": "the parent asked for no XLA flags"}
    import importlib.metadata
    try:
        jaxlib = importlib.metadata.version("jaxlib")
    except importlib.metadata.PackageNotFoundError:
        jaxlib = None
    why = xla_flags_accepted(jaxlib)
    if why:
        return {"set": False, "jaxlib": jaxlib, "why": why}
    os.environ["XLA_FLAGS"] = flags
    return {"set": True, "jaxlib": jaxlib}


def _no_paths(var: str, value: str) -> str:
    """An environment value as reported: the folders this run made are named by their last part only."""
    if var in CACHE_VARS or var == "CUBLASLT_PROBE_XLA_DUMP":
        return os.path.basename(value)
    return re.sub(r"=/\S*/([^/\s]+)", r"=\1", value) if var == "XLA_FLAGS" else value


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m cublaslt_probe.gpu.coldstart_child")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--preinit", action="store_true")
    ap.add_argument("--no-cupti", action="store_true")
    ap.add_argument("--func")
    ap.add_argument("--script", nargs=argparse.REMAINDER)
    return ap.parse_args(argv)


def process_record() -> dict:
    """The record's start: not ok yet, the process id, the XLA flags set (`apply_xla_flags`), the environment the
    process sees of the variables a run controls (folders by their last part only), and how Python writes
    bytecode and whether the kernel's delay accounting is on (what the process counters can show)."""
    xla = apply_xla_flags()
    res: dict = {"ok": False, "pid": os.getpid(), "xla_flags": xla,
                 "env_seen": {k: _no_paths(k, v) for k, v in sorted(os.environ.items())
                              if k.startswith(("CUDA_", "CUBLASLT_", "TORCHINDUCTOR_", "TRITON_", "PYTORCH_KERNEL",
                                               "CUPY_", "NUMBA_", "JAX_", "TORCH_EXTENSIONS", "XLA_"))}}
    res["process_info"] = {"dont_write_bytecode": sys.dont_write_bytecode,
                           "pycache_prefix": sys.pycache_prefix is not None}
    try:
        with open("/proc/sys/kernel/task_delayacct") as f:
            res["process_info"]["task_delayacct"] = f.read().strip()
    except OSError:
        pass
    return res


def start_cupti(off: bool) -> tuple[object | None, dict]:
    """The CUPTI recorder of module loads and driver calls, started (None where off or where it failed: the run
    goes on without it, and its record says so), and what the record says of it."""
    if off:
        return None, {"off": True}
    try:
        from cublaslt_probe.gpu import cupti
        rec = cupti.Recorder(kernel_names=os.environ.get("CUDA_MODULE_LOADING") != "EAGER")
        t = time.perf_counter()
        rec.start()
        return rec, {"path": os.path.basename(rec.path), "start_s": time.perf_counter() - t,
                     "watched": sorted(n for n, _ in rec.cbids.values())}
    except Exception as e:  # noqa: BLE001  (the run goes on without CUPTI, and says so)
        return None, {"error": error_text(e)}


def start_lt_log() -> tuple[object | None, dict]:
    """cuBLASLt's level-2 log, taken in this process (`lt.Logger`) from the library torch's import mapped (no GEMM
    is run for it), and what the record says of it; None where the library is not mapped yet or failed."""
    try:
        from cublaslt_probe.gpu import lt
        found = lt.loaded_libraries()
        if not found:
            return None, {"error": "libcublasLt not mapped before the first step; no log"}
        lib = lt.LtLibrary(found[0])
        logger = lt.Logger(lib)
        logger.set_level(2)
        return logger, {"library": os.path.basename(found[0]), "version": lib.version_str}
    except Exception as e:  # noqa: BLE001
        return None, {"error": error_text(e)}


def device_record(torch) -> dict:
    """The GPU and the versions (torch, CUDA, cuDNN) and whether cuDNN's benchmark mode was on; empty where torch
    cannot say (the device facts are optional)."""
    try:
        p = torch.cuda.get_device_properties(0)
        return {"device": {"gpu": p.name, "cc": f"{p.major}.{p.minor}", "torch": torch.__version__,
                           "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version()},
                "cudnn_benchmark": bool(torch.backends.cudnn.benchmark)}
    except Exception:  # noqa: BLE001  the device facts are optional
        return {}


def main(argv: list[str] | None = None) -> dict:
    """Run the target (`--func FILE_OR_MODULE:NAME` or `--script FILE ARGS`) for `--steps` steps, observed, and
    return the record the parent reads (see the module docstring). The stages in the order the child lives them:
    the record's start, the compile hooks, torch's import, CUPTI, the cuBLASLt log, the program in its `Session`
    (active for the steps a script marks), then what each stage measured."""
    a = _arguments(argv)
    res = process_record()
    install_hooks()
    t = time.perf_counter()
    import torch
    res["import_torch_s"] = time.perf_counter() - t
    res["libraries_at_import"] = [b for b in mapped_libraries() if b.startswith(WATCHED_LIBS)]
    rec, res["cupti"] = start_cupti(a.no_cupti)
    logger, res["lt_log"] = start_lt_log()
    s = Session(torch, a.steps, rec, logger, preinit=a.preinit)
    failed = None
    try:
        with coldstart_step.active(s):
            s.run_target(a.func, a.script)
    except BaseException as e:  # noqa: BLE001  (everything measured so far is still reported)
        s.abort(error_text(e))
        failed = {"error": error_text(e), "traceback": traceback.format_exc()[-2000:]}
    finally:
        if rec is not None:
            rec.stop()
    if s.func_was_factory is not None:
        res["func_was_factory"] = s.func_was_factory
    if failed:
        res.update(failed)
    else:
        res["ok"] = s.ok()
    res.update(s.record())
    res["jit_hooks"] = sorted(HOOKED)
    if TIMERS.errors:
        res["jit_hook_errors"] = TIMERS.errors[:20]
    if rec is not None:
        res["modules"], res["driver_calls"] = _events(rec, s.windows)
        if rec.errors:
            res["cupti"]["callback_errors"] = rec.errors
    res.update(device_record(torch))
    if s.steps:
        walls = [w["wall_s"] for w in s.steps]
        res["steady_s"] = statistics.median(walls[2:]) if len(walls) > 2 else min(walls)
    return res


def _events(rec, windows: list[dict]) -> tuple[dict, dict]:
    """Module loads and driver calls by window: a summary for every window, the records for the steps."""
    def window_of(t_rel: int) -> str:
        for w in windows:
            if w["t0_ns"] <= t_rel <= w["t1_ns"]:
                return w["name"]
        return "between"
    mods: dict = {}
    for m in rec.modules:
        name = window_of(_rel_ns(m["t_ns"]))
        g = mods.setdefault(name, {"count": 0, "bytes": 0, "by_kind": {}, "records": []})
        g["count"] += 1
        g["bytes"] += m["size"]
        g["by_kind"][m["kind"]] = g["by_kind"].get(m["kind"], 0) + 1
        if name.startswith("step") and len(g["records"]) < 2000:
            g["records"].append({**{k: v for k, v in m.items() if k not in ("t_ns", "thread")},
                                 "t_ms": round((_rel_ns(m["t_ns"]) - _start(windows, name)) / 1e6, 3)})
    calls: dict = {}
    for c in rec.calls:
        name = window_of(_rel_ns(c["t_ns"]))
        g = calls.setdefault(name, {"by_what": {}, "records": []})
        dur = (c["end_ns"] - c["t_ns"]) / 1e9
        w = g["by_what"].setdefault(c["what"], {"count": 0, "seconds": 0.0})
        w["count"] += 1
        w["seconds"] += dur
        if c["what"] != "alloc" or name.startswith("step"):
            if len(g["records"]) < 2000:
                r = {**{k: v for k, v in c.items() if k not in ("t_ns", "end_ns", "thread")},
                     "t_ms": round((_rel_ns(c["t_ns"]) - _start(windows, name)) / 1e6, 3), "seconds": round(dur, 6)}
                item = next((k for k, (a, b) in PREINIT_SPANS.items() if a <= c["t_ns"] <= b), None)
                if name == "preinit" and item:
                    r["preinit_item"] = item  # the library initialisation the call was made in
                g["records"].append(r)
    # which module each load call produced: a module loaded on the same thread inside the call, or, for a
    # library loaded lazily (`cuLibraryLoadData`: its module is made at its first use, after the call), the
    # first later module on that thread of the cubin's size; kernel names are kept for those (what a program
    # loaded itself: Triton, PTX, NVRTC, Numba output), counts for the rest. `load_t_ms` is the call's time.
    loads = [c for c in rec.calls if c["what"] == "load"]
    produced = {id(c): [m for m in rec.modules if c["t_ns"] <= m["t_ns"] <= c["end_ns"]
                        and m["thread"] == c["thread"]] for c in loads}
    made = {m["id"] for ms in produced.values() for m in ms}
    for c in loads:
        inside, how = produced[id(c)], c["name"]
        if not inside and c["name"].startswith("cuLibraryLoad") and c.get("image_bytes"):
            later = [m for m in rec.modules if m["t_ns"] > c["end_ns"] and m["thread"] == c["thread"]
                     and m["size"] == c["image_bytes"] and m["id"] not in made]
            inside, how = later[:1], f"{c['name']} (made at its first use)"
            made.update(m["id"] for m in inside)
        for m in inside:
            m_name = window_of(_rel_ns(m["t_ns"]))
            for r in mods.get(m_name, {}).get("records", []):
                if r["id"] == m["id"]:
                    r["loaded_by"] = how
                    r["load_t_ms"] = round((_rel_ns(c["t_ns"]) - _start(windows, m_name)) / 1e6, 3)
                    for k in ("image", "caller"):
                        if k in c:
                            r[k] = c[k]
    for g in mods.values():
        for r in g["records"]:
            if "loaded_by" not in r:
                r.pop("kernels", None)
    return mods, calls


def _start(windows: list[dict], name: str) -> int:
    for w in windows:
        if w["name"] == name:
            return w["t0_ns"]
    return 0


if __name__ == "__main__":
    out = main()
    sys.stdout.flush()
    print("\n" + json.dumps(out, default=str), flush=True)
    os._exit(0)  # no CUDA/CUPTI teardown: the parent has what it needs
