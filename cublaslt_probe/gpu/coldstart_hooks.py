"""The compile entry points of the runtime compilers a program may use, timed inside a cold-start child
(`coldstart_child`): CuPy's cached compile and its NVRTC call, Triton's `JITFunction.run`, `compile`, launcher
build and module load, Numba's CUDA compile (NVVM, link), JAX's own compile events (`jax.monitoring`: tracing,
lowering, XLA backend compile, persistent-cache hits) — `JIT_HOOKS`. Each is wrapped when its module is imported
(`install_hooks`: a finder that wraps a watched module as soon as it has executed), or at once where it already
is (`hook_loaded`); `TIMERS` keeps the seconds and calls inside each, process-wide, and the spans of the calls
over `SPAN_NS`. `xla_autotune_summary` counts what XLA's autotuning dumps hold.
"""
from __future__ import annotations

import functools
import importlib.abc
import re
import sys
import threading
import time

from cublaslt_probe.errors import error_text

SPAN_NS = 1_000_000   # calls longer than this keep their span (module loads inside them are attributed to them)
MAX_SPANS = 5000
XLA_DUMP_FILES = ("autotune_results.txt", "autotune_logs.txt")
XLA_TEXT_KEPT = 24_000


class Timers:
    """Seconds and calls inside each watched entry point (outermost call of a key per thread), process-wide,
    and the spans of the calls longer than `SPAN_NS`."""

    def __init__(self):
        self.acc: dict[str, list] = {}     # key -> [ns, calls]
        self.spans: list[tuple] = []       # (key, t0_ns, t1_ns)
        self.local = threading.local()
        self.errors: list[str] = []

    def add(self, key: str, t0: int, t1: int) -> None:
        g = self.acc.setdefault(key, [0, 0])
        g[0] += t1 - t0
        g[1] += 1
        if t1 - t0 >= SPAN_NS and len(self.spans) < MAX_SPANS:
            self.spans.append((key, t0, t1))

    def count(self, key: str) -> None:
        self.acc.setdefault(key, [0, 0])[1] += 1

    def inside(self, key: str) -> bool:
        return bool(getattr(self.local, key.replace(".", "_"), 0))

    def wrap(self, key, fn):
        """`fn` timed under `key` (a string, or a function of nothing that names the key at call time)."""
        timers = self

        @functools.wraps(fn)
        def timed(*args, **kwargs):
            k = key() if callable(key) else key
            slot = k.replace(".", "_")
            if getattr(timers.local, slot, 0):
                return fn(*args, **kwargs)
            setattr(timers.local, slot, 1)
            t0 = time.perf_counter_ns()
            try:
                return fn(*args, **kwargs)
            finally:
                t1 = time.perf_counter_ns()
                setattr(timers.local, slot, 0)
                timers.add(k, t0, t1)
        timed.__cublaslt_probe_timer__ = key
        return timed

    def snapshot(self) -> dict[str, tuple[int, int]]:
        return {k: (v[0], v[1]) for k, v in self.acc.items()}


TIMERS = Timers()


def _triton_compile_key() -> str:
    # a compile inside JITFunction.run is Triton used directly; any other caller (Inductor) is not
    return "triton.compile.direct" if TIMERS.inside("triton.run") else "triton.compile.other"


def _triton_load_key() -> str:
    return "triton.load.direct" if TIMERS.inside("triton.run") else "triton.load.other"


def _jax_listeners(mod) -> None:
    """Register on JAX's monitoring events (durations, counts, time spans) under ``jax:EVENT``."""
    offset = time.perf_counter_ns() - time.time_ns()

    def duration(event, secs, **_):
        g = TIMERS.acc.setdefault("jax:" + event, [0, 0])
        g[0] += int(secs * 1e9)
        g[1] += 1

    def span(event, start, end, **_):
        if int((end - start) * 1e9) >= SPAN_NS and len(TIMERS.spans) < MAX_SPANS:
            TIMERS.spans.append(("jax:" + event, int(start * 1e9) + offset, int(end * 1e9) + offset))

    mod.register_event_duration_secs_listener(duration)
    mod.register_event_listener(lambda event, **_: TIMERS.count("jax:" + event))
    if hasattr(mod, "register_event_time_span_listener"):
        mod.register_event_time_span_listener(span)


# module -> [(attribute, possibly Class.method, timer key)]; a missing attribute is skipped (other versions)
JIT_HOOKS: dict[str, list] = {
    "cupy.cuda.compiler": [("_compile_with_cache_cuda", "cupy.compile"),
                           ("_compile_using_nvrtc_no_warning", "cupy.nvrtc"), ("compile_using_nvrtc", "cupy.nvrtc"),
                           ("compile_using_nvcc", "cupy.nvcc")],
    "triton.runtime.jit": [("JITFunction.run", "triton.run")],
    "triton.compiler.compiler": [("compile", _triton_compile_key), ("CompiledKernel._init_handles", _triton_load_key)],
    "triton.compiler": [("compile", _triton_compile_key)],
    "triton.runtime.build": [("compile_module_from_src", "triton.launcher"), ("_build", "triton.build")],
    "triton.backends.nvidia.driver": [("compile_module_from_src", "triton.launcher")],
    "triton.runtime.autotuner": [("Autotuner._bench", "triton.autotune")],
    "numba.cuda.dispatcher": [("CUDADispatcher.compile", "numba.compile")],
    "numba.cuda.cudadrv.nvvm": [("compile_ir", "numba.nvvm")],
    "numba.cuda.codegen": [("CUDACodeLibrary.get_cubin", "numba.link")],
    "jax._src.monitoring": _jax_listeners,
}
HOOKED: set[str] = set()


def hook_module(name: str, mod) -> None:
    """Wrap the watched entry points of module `name` (once); a failure is kept as text, the program runs on."""
    if name in HOOKED or name not in JIT_HOOKS:
        return
    HOOKED.add(name)
    spec = JIT_HOOKS[name]
    try:
        if callable(spec):
            spec(mod)
            return
        for attr, key in spec:
            owner, _, meth = attr.rpartition(".")
            obj = getattr(mod, owner, None) if owner else mod
            fn = getattr(obj, meth, None) if obj is not None else None
            if fn is None or getattr(fn, "__cublaslt_probe_timer__", None) is not None:
                continue
            setattr(obj, meth, TIMERS.wrap(key, fn))
    except Exception as e:  # noqa: BLE001
        TIMERS.errors.append(f"{name}: {error_text(e)}")


def hook_loaded() -> None:
    """Wrap the entry points of every watched module already imported."""
    for name in JIT_HOOKS:
        mod = sys.modules.get(name)
        if mod is not None:
            hook_module(name, mod)


class _PostImportHook(importlib.abc.MetaPathFinder):
    """Wraps a watched module's entry points as soon as the module has executed (before its importer uses it)."""

    _busy = threading.local()

    def find_spec(self, fullname, path, target=None):
        # not re-entered: another finder (numba-cuda's redirector) may ask every finder again for the same name
        if fullname not in JIT_HOOKS or fullname in HOOKED or getattr(self._busy, "on", False):
            return None
        self._busy.on = True
        try:
            spec = None
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
        finally:
            self._busy.on = False
        if spec is None or spec.loader is None:
            return None
        loader = spec.loader
        run = getattr(loader, "exec_module", None)
        if run is None:
            return None

        def exec_module(module):
            run(module)
            hook_module(fullname, module)
        try:
            loader.exec_module = exec_module
        except (AttributeError, TypeError):
            return None
        return spec


def install_hooks() -> None:
    if not any(isinstance(f, _PostImportHook) for f in sys.meta_path):
        sys.meta_path.insert(0, _PostImportHook())
    hook_loaded()


def xla_autotune_summary(text: str) -> dict:
    """Counts in an XLA autotuning results/logs text proto: entries timed (``run_time``), by candidate kind."""
    kinds: dict[str, int] = {}
    for m in re.finditer(r"^\s*(gemm|triton|cuda_conv|custom_kernel_fusion|algorithm|cudnn|other)\s*\{", text, re.M):
        kinds[m.group(1)] = kinds.get(m.group(1), 0) + 1
    return {"timed": len(re.findall(r"\brun_time\s*\{", text)), "results": len(re.findall(r"^results\s*\{", text,
                                                                                               re.M)),
            "logs": len(re.findall(r"^logs\s*\{", text, re.M)), "kinds": kinds, "bytes": len(text)}
