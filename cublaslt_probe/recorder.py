"""Capture a stretch of a user's program into a run folder that `audit` reads (layout: `runfiles`).

    import cublaslt_probe
    with cublaslt_probe.capture("run1/", model=model) as cap:
        for _ in range(2):
            with cap.step():
                step()

records, in one go and in one process:
- a torch.profiler Chrome trace with input shapes (``record_shapes=True``);
- the cuBLASLt level-2 log of the same process (the in-process logger of `lt.Logger`, switched on only while
  the capture is open), in the library's own line format;
- a profiler range around each module's forward, named by its qualified name (``model.layers.3.mlp``), so that
  every kernel can be attributed to a layer; backward kernels are attributed later through the autograd
  sequence numbers the profiler records (see `runfiles`);
- the environment (GPU, driver, CUDA, cuBLAS, torch) and the capture's own facts, in ``env.json``.

With ``model=None`` every module that runs is ranged through torch's global module hooks and named by its class
and the order in which it was first seen (``LlamaMLP_0``), as ``with_modules`` traces name them.
A module compiled with ``torch.compile`` is ranged as a whole; its inside is one compiled graph.

torch is imported inside the functions: importing this module costs nothing on a CPU machine.
"""
from __future__ import annotations

import contextlib
import gzip
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from cublaslt_probe import runfiles
from cublaslt_probe.errors import CaptureError

LOG_LEVEL = 2  # one Trace line per cuBLASLt matmul, with its algo


class Capture:
    """An open capture; `step()` marks one step of the program (optional: without it the stretch is one step)."""

    def __init__(self, run_dir: str | os.PathLike, model=None, *, with_modules: bool = False,
                 log: bool = True, label: str | None = None):
        self.run_dir = Path(run_dir)
        self.model = model
        self.with_modules = with_modules
        self.log = log
        self.label = label
        self.steps = 0
        self.step_wall_s: list[float] = []
        self.modules: dict[str, str] = {}
        self._handles: list = []
        self._open: dict[int, list] = {}
        self._seen: dict[int, str] = {}
        self._counts: dict[str, int] = {}
        self._prof = None
        self._logger = None
        self._lib = None
        self._t0 = 0.0

    # --- module ranges -------------------------------------------------------------------------------------
    def _enter(self, name: str):
        rf = self._torch.autograd.profiler.record_function(runfiles.MODULE_PREFIX + name)
        rf.__enter__()
        return rf

    def _pre(self, name):
        def hook(module, args):
            self._open.setdefault(id(module), []).append(self._enter(name))
        return hook

    def _post(self, module, args, output):
        stack = self._open.get(id(module))
        if stack:
            stack.pop().__exit__(None, None, None)

    def _global_name(self, module) -> str:
        key = id(module)
        name = self._seen.get(key)
        if name is None:
            cls = type(module).__name__
            n = self._counts.get(cls, 0)
            self._counts[cls] = n + 1
            name = self._seen[key] = f"{cls}_{n}"
            self.modules[name] = cls
        return name

    def _global_pre(self, module, args):
        self._open.setdefault(id(module), []).append(self._enter(self._global_name(module)))

    def _hook_modules(self) -> None:
        torch = self._torch
        if self.model is None:
            mm = torch.nn.modules.module
            self._handles.append(mm.register_module_forward_pre_hook(self._global_pre))
            self._handles.append(mm.register_module_forward_hook(self._post))
            return
        compiled = getattr(getattr(torch, "_dynamo", None), "eval_frame", None)
        compiled_cls = getattr(compiled, "OptimizedModule", ())
        root = type(getattr(self.model, "_orig_mod", self.model)).__name__
        skip: list[str] = []
        for qual, mod in self.model.named_modules():
            if any(qual.startswith(s) for s in skip):
                continue
            name = qual.replace("_orig_mod.", "").replace("._orig_mod", "") or root
            if qual.endswith("_orig_mod"):
                continue
            if isinstance(mod, compiled_cls):  # its inside runs as one graph: range the wrapper only
                skip.append((qual + "." if qual else "") + "_orig_mod")
            self.modules[name] = type(getattr(mod, "_orig_mod", mod)).__name__
            self._handles.append(mod.register_forward_pre_hook(self._pre(name)))
            self._handles.append(mod.register_forward_hook(self._post))

    # --- steps ---------------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def step(self):
        """One step of the program: a profiler range, and its wall time (the GPU synchronised at the end)."""
        torch = self._torch
        t0 = time.perf_counter()
        with torch.autograd.profiler.record_function(runfiles.STEP_PREFIX + str(self.steps)):
            yield self.steps
        torch.cuda.synchronize()
        self.step_wall_s.append(time.perf_counter() - t0)
        self.steps += 1

    # --- open / close --------------------------------------------------------------------------------------
    def __enter__(self) -> "Capture":
        from cublaslt_probe import lt
        from cublaslt_probe.probe import require_gpu
        self._torch = torch = require_gpu("capture")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if self.log:
            lt.ensure_loaded()
            self._lib = lt.LtLibrary()
            self._logger = lt.Logger(self._lib)
        from torch.profiler import ProfilerActivity, profile
        self._prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True,
                             with_modules=self.with_modules)
        self._hook_modules()
        torch.cuda.synchronize()
        self._prof.__enter__()
        if self._logger is not None:
            self._logger.take()
            self._logger.set_level(LOG_LEVEL)
        self._t0 = time.time()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        torch = self._torch
        try:
            torch.cuda.synchronize()
        finally:
            if self._logger is not None:
                self._logger.set_level(0)
            self._prof.__exit__(exc_type, exc, tb)
            for h in self._handles:
                h.remove()
            self._handles.clear()
        if exc_type is not None:
            return
        self._write()

    def _write(self) -> None:
        from cublaslt_probe.probe import environment
        with tempfile.TemporaryDirectory() as tmp:
            raw = os.path.join(tmp, "trace.json")
            self._prof.export_chrome_trace(raw)
            with open(raw, "rb") as src, gzip.open(self.run_dir / runfiles.TRACE_FILE, "wb", 6) as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
        lines = 0
        if self._logger is not None:
            from cublaslt_probe import lt
            text = lt.Logger.render(self._logger.take())
            lines = len(text)
            (self.run_dir / runfiles.LOG_FILE).write_text("".join(t + "\n" for t in text))
        torch = self._torch
        env = environment(self._lib)
        env["capture"] = {
            "label": self.label,
            "steps": max(self.steps, 1),
            "steps_marked": self.steps,
            "step_wall_s": [round(s, 6) for s in self.step_wall_s],
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self._t0)),
            "log_level": LOG_LEVEL if self._logger is not None else 0,
            "log_lines": lines,
            "module_naming": "qualified" if self.model is not None else "class_order",
            "modules": self.modules,
            "allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
            "preferred_blas_library": str(torch.backends.cuda.preferred_blas_library()).split(".")[-1],
        }
        (self.run_dir / runfiles.ENV_FILE).write_text(json.dumps(env, indent=1, sort_keys=True) + "\n")


def capture(run_dir: str | os.PathLike, model=None, *, with_modules: bool = False, log: bool = True,
            label: str | None = None) -> Capture:
    """A context manager that records the program run inside it into `run_dir` (see the module doc)."""
    if model is not None and not hasattr(model, "named_modules"):
        raise CaptureError(f"capture: model={type(model).__name__} is not a torch.nn.Module; pass the module "
                           "whose layers should name the kernels, or model=None")
    return Capture(run_dir, model, with_modules=with_modules, log=log, label=label)


def run_script(run_dir: str | os.PathLike, argv: list[str], *, label: str | None = None) -> None:
    """Run a Python script (``argv[0]``, with ``argv[1:]`` as its arguments) inside one capture, its modules
    named by class (no model is known); the whole run is one step."""
    import runpy
    import sys
    if not argv:
        raise CaptureError("capture: no script given; use `cublaslt-probe capture -o RUN -- SCRIPT.py [ARGS]`")
    script = argv[0]
    if not os.path.isfile(script):
        raise CaptureError(f"capture: {script}: no such file; give the path of a Python script")
    old = sys.argv
    sys.argv = list(argv)
    try:
        with capture(run_dir, None, label=label or os.path.basename(script)):
            runpy.run_path(script, run_name="__main__")
    finally:
        sys.argv = old
