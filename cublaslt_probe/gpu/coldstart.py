"""The parent side of `cold-start`: the program's steps run once per environment, each in a fresh child process
(`coldstart_child`), `repeat` rounds; what they measured is returned as the raw result that
`analysis.coldstart` reads (on any machine) and `cold-start --save` writes.

This module imports no torch: the children do the GPU work, and it reads their output. Each child gets the
environment of its run (`analysis.coldstart.envs.ENVS`: module loading, JIT and cache variables), its own folder
for every compile cache a process may use, and this package first on PYTHONPATH; the parent lists the cache
folders before and after each child, the evidence the analysis splits cold − warm by.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from cublaslt_probe.analysis.coldstart.binding import binding_of
from cublaslt_probe.analysis.coldstart.envs import (
    AUTO_ENVS,
    CACHE_DIRS,
    ENVS,
    FRAMEWORK_VARS,
    REPEAT_DEFAULT,
    EnvSpec,
    auto_envs,
    env_names,
    repeat_envs,
)
from cublaslt_probe.analysis.coldstart.saved import SCHEMA
from cublaslt_probe.errors import NoCudaDevice, OptionError, ProbeError
from cublaslt_probe.gpu.coldstart_child import cache_files

CONTROLLED = ("CUDA_MODULE_LOADING", "CUDA_CACHE_PATH", "CUDA_CACHE_DISABLE", "CUDA_CACHE_MAXSIZE",
              "CUDA_DISABLE_PTX_JIT", "CUDA_FORCE_PTX_JIT", "CUBLASLT_HEURISTICS_CACHE_CAPACITY",
              "CUBLASLT_LOG_LEVEL", "CUBLASLT_LOG_MASK", "CUBLASLT_LOG_FILE", "TORCHINDUCTOR_CACHE_DIR",
              "TRITON_CACHE_DIR", "PYTORCH_KERNEL_CACHE_PATH", "CUPY_CACHE_DIR", "TORCH_EXTENSIONS_DIR",
              "NUMBA_CACHE_DIR", "JAX_COMPILATION_CACHE_DIR", "CUBLASLT_PROBE_XLA_DUMP", "CUBLASLT_PROBE_XLA_FLAGS")


# XLA flags a run sets: its autotuning dumps (evidence of what XLA timed); the user's own values are replaced
XLA_DUMP_FLAGS = {"xla_gpu_dump_autotune_results_to": "autotune_results.txt",
                  "xla_gpu_dump_autotune_logs_to": "autotune_logs.txt"}


# XLA's own autotuning caches: isolated per run when the user's XLA_FLAGS turn one on
XLA_CACHE_FLAGS = ("xla_gpu_per_fusion_autotune_cache_dir", "xla_gpu_experimental_autotuner_cache_dir",
                   "xla_gpu_kernel_cache_file")


def target_args(target) -> tuple[list[str], dict]:
    """Child arguments and a description for a target: a callable (module-level, importable or in a file),
    a "FILE.py:NAME" / "module:NAME" string, or a list [SCRIPT, ARGS...]."""
    if callable(target):
        mod = getattr(target, "__module__", None)
        qual = getattr(target, "__qualname__", getattr(target, "__name__", None))
        if not mod or not qual or "<locals>" in qual or "<lambda>" in qual:
            raise ProbeError("cold_start: the step function must be defined at module level (the child "
                             "process imports it by name)")
        m = sys.modules.get(mod)
        where = mod
        if mod == "__main__" or not (m and getattr(m, "__spec__", None)):
            where = os.path.abspath(getattr(m, "__file__", "") or "")
            if not where or not os.path.isfile(where):
                raise ProbeError(f"cold_start: cannot locate the file of {qual}; pass 'FILE.py:{qual}'")
        spec = f"{where}:{qual}"
        return ["--func", spec], {"kind": "func", "spec": spec}
    if isinstance(target, str):
        where, _, name = target.rpartition(":")
        if not where or not name:
            raise ProbeError(f"cold_start: {target!r}: give FILE.py:NAME, module:NAME, or [SCRIPT, ARGS...]")
        if where.endswith(".py") and not os.path.isfile(where):
            raise ProbeError(f"cold_start: {where}: no such file")
        spec = f"{os.path.abspath(where)}:{name}" if where.endswith(".py") else target
        return ["--func", spec], {"kind": "func", "spec": spec}
    argv = list(target)
    if not argv:
        raise ProbeError("cold-start: no script given; use `cublaslt-probe cold-start -- python SCRIPT.py [ARGS]`")
    if os.path.basename(argv[0]).startswith("python"):
        argv = argv[1:]
    if argv and argv[0] == "-m":
        raise ProbeError("cold-start: `python -m MODULE` is not supported; give the script's path")
    if not argv or not os.path.isfile(argv[0]):
        raise ProbeError(f"cold-start: {argv[0] if argv else '(nothing)'}: no such script; give the path of a "
                         "Python script that marks its steps or defines make_step()/step()")
    argv[0] = os.path.abspath(argv[0])
    return ["--script", *argv], {"kind": "script", "argv": [os.path.basename(argv[0]), *argv[1:]]}


def run(target, *, steps: int = 6, env_set: str = "default", envs: str | None = None, cupti: bool = True,
        timeout: float = 600.0, label: str | None = None, python: str | None = None, log=None,
        repeat: int = REPEAT_DEFAULT) -> dict:
    """Run the target's steps once per environment, each in a fresh child process, `repeat` rounds; the raw result.

    Round 1 goes to ``runs``, rounds 2…N to ``repeats`` (a list of runs by name). Each run is one `_run_env` call;
    this loop owns the order: it stops at the first child that could not use a GPU (`NoCudaDevice`) and, after the
    cold run of a named set, appends the runs `auto_envs` asks for. Each round has cache folders of its own (its
    cold run starts empty); the later rounds make only the runs `repeat_envs` keeps. ``binding`` says what was
    measured (`analysis.coldstart.binding.binding_of`)."""
    if steps < 3:
        raise OptionError(f"--steps {steps}: give at least 3 (step 1, step 2 and a steady state)")
    if repeat < 1:
        raise OptionError(f"--repeat {repeat}: give 1 or more rounds (3 shows the noise between runs)")
    args, desc = target_args(target)
    names = env_names(env_set, envs)
    import cublaslt_probe
    pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(cublaslt_probe.__file__)))
    out = {"schema": SCHEMA, "label": label or desc.get("spec") or desc.get("argv", [""])[0], "target": desc,
           "steps": steps, "envs": names, "cupti": cupti, "repeat": repeat,
           "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "runs": {}, "repeats": []}
    root = tempfile.mkdtemp(prefix="coldstart_")

    def one(name: str, rroot: str) -> dict:
        cmd = [python or sys.executable, "-m", "cublaslt_probe.gpu.coldstart_child", "--steps", str(steps)]
        cmd += ["--preinit"] if ENVS[name].preinit else []
        cmd += [] if cupti else ["--no-cupti"]
        cmd += args
        rec = _run_env(ENVS[name], cmd, rroot, pkg_root, timeout)
        why = _no_gpu(rec)
        if why:
            raise NoCudaDevice("cold-start", why)
        return rec

    try:
        for k in range(1, repeat + 1):
            rroot = os.path.join(root, f"round{k}")
            os.makedirs(rroot)
            got = out["runs"] if k == 1 else {}
            todo = list(names) if k == 1 else repeat_envs(out["runs"])
            if k > 1:
                out["repeats"].append(got)
            while todo:
                name = todo.pop(0)
                got[name] = rec = one(name, rroot)
                if log:
                    log(f"{name}{f' (round {k})' if repeat > 1 else ''}: {'ok' if rec.get('ok') else 'FAILED'} in "
                        f"{rec['wall_s']:.1f} s")
                if k == 1 and name == "cold" and not envs:
                    for extra in auto_envs(rec):
                        if extra not in names and extra not in todo:
                            todo.append(extra)
                            names.append(extra)
                            if log:
                                log(f"{extra}: added ({AUTO_ENVS[extra]})")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    out["binding"] = binding_of(args, desc, out["runs"], python)
    return out


def _run_env(spec: EnvSpec, cmd: list[str], root: str, pkg_root: str, timeout: float) -> dict:
    """One run: `cmd` in a fresh child under `spec`'s environment, its caches in folders under `root`; the run's
    record (its environment, the child's JSON or its error, what it wrote to each cache).

    The cache folders are listed before and after the child, so the record says which caches were warm and what
    the run added to each: the evidence `analyse` splits cold − warm by."""
    dirs = {"CUDA_CACHE_PATH": os.path.join(root, f"computecache_{spec.compute_cache}")}
    dirs.update({var: os.path.join(root, f"{prefix}_{spec.framework_cache}")
                 for var, prefix in CACHE_DIRS.items()})
    before = {}
    for var, d in dirs.items():
        os.makedirs(d, exist_ok=True)
        before[var] = cache_files(d)
    env = child_env(spec, dirs, root, pkg_root)
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        rc, stdout, stderr = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        rc, stdout, stderr = None, _text(e.stdout), _text(e.stderr) + f"\n(timed out after {timeout:.0f} s)"
    rec: dict = {"env": {"what": spec.what, "CUDA_MODULE_LOADING": spec.loading, **spec.extra,
                         **{f"XLA {k}": v for k, v in spec.xla_flags.items()},
                         "preinit": spec.preinit, "compute_cache": spec.compute_cache,
                         "compute_cache_warm": bool(before["CUDA_CACHE_PATH"]),
                         "framework_cache_warm": any(before[v] for v in FRAMEWORK_VARS),
                         "caches_before": {v: len(before[v]) for v in dirs}},
                 "returncode": rc, "wall_s": time.perf_counter() - t0}
    child = _last_json(stdout)
    if child is None:
        rec.update({"ok": False, "error": (stderr or stdout or "no output")[-1500:]})
    else:
        rec.update(child)
        if not child.get("ok") and stderr:
            rec["stderr_tail"] = stderr[-1500:]
    written = {}
    for var, d in dirs.items():
        new = {p: s for p, s in cache_files(d).items() if p not in before[var]}
        written[var] = {"count": len(new), "bytes": sum(new.values())}
    rec["cache_written"] = written
    return rec


def child_env(spec: EnvSpec, dirs: dict[str, str], root: str, pkg_root: str) -> dict[str, str]:
    """The child's environment: this process's, less every variable a run controls (`CONTROLLED`), plus the
    run's cache folders (`dirs`), `spec`'s settings, the XLA dump and cache flags, and this package first on
    PYTHONPATH (the child imports the same cublaslt_probe). Empties the shared XLA dump folder under `root`.
    The XLA flags go to the child as `CUBLASLT_PROBE_XLA_FLAGS`: the child sets XLA_FLAGS to them only where its
    jaxlib accepts them (`coldstart_child.apply_xla_flags`), so a program without JAX, or with a jaxlib too old for
    a flag, runs with the user's XLA_FLAGS untouched."""
    # one dump folder for every run, emptied before each: the XLA flags are then the same in every run
    # (JAX's persistent cache keys its entries on them, so a per-run folder would make every run miss)
    dump = os.path.join(root, "xla_dump")
    shutil.rmtree(dump, ignore_errors=True)
    os.makedirs(dump, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in CONTROLLED}
    env.update(dirs)
    env.update({"CUDA_MODULE_LOADING": spec.loading, "CUDA_CACHE_DISABLE": "0", "PYTHONUNBUFFERED": "1",
                "CUBLASLT_PROBE_XLA_DUMP": dump,
                "CUBLASLT_PROBE_XLA_FLAGS": xla_flags(os.environ.get("XLA_FLAGS", ""), dump,
                                       os.path.join(root, f"xlacache_{spec.framework_cache}"),
                                       spec.xla_flags)})
    env.update(spec.extra)
    env["PYTHONPATH"] = pkg_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def xla_flags(user: str, dump: str, cache_root: str, extra: dict) -> str:
    """XLA_FLAGS for a run: the user's flags, less those the run sets; the autotuning dumps into `dump`; XLA's own
    autotuning caches, where the user turned one on, moved into a folder of the run (`cache_root`); `extra`."""
    ours = {k: os.path.join(dump, f) for k, f in XLA_DUMP_FLAGS.items()}
    ours.update(extra)
    kept = []
    for flag in user.split():
        name, _, value = flag.lstrip("-").partition("=")
        if name in ours:
            continue
        if name in XLA_CACHE_FLAGS and value:
            ours[name] = os.path.join(cache_root, name)
            os.makedirs(ours[name] if name.endswith("_dir") else cache_root, exist_ok=True)
            continue
        kept.append(flag)
    return " ".join(kept + [f"--{k}={v}" for k, v in ours.items()])


def _no_gpu(rec: dict) -> str | None:
    """Why a child could not use a GPU at all (torch missing, no device), or None."""
    text = f"{rec.get('error') or ''} {rec.get('traceback') or ''}"
    if "No module named 'torch'" in text:
        return ("the child process cannot import torch; run on a machine with torch and a GPU, or render a saved "
                "run with --from")
    if "Found no NVIDIA driver" in text or "no CUDA-capable device" in text:
        return "torch in the child process sees no GPU; render a saved run with --from"
    return None


def _text(b) -> str:
    if b is None:
        return ""
    return b.decode(errors="replace") if isinstance(b, bytes) else b


def _last_json(stdout: str) -> dict | None:
    for line in reversed((stdout or "").strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                return None
    return None
