"""Why was the first step slow? A cold-start breakdown of a whole program, each cause measured.

`run(target, steps=…)` (needs a GPU: it starts the children) runs the program's steps in fresh child
processes (`cublaslt_probe.gpu.coldstart_child`), one controlled environment each, and returns what they measured;
`analyse(result)` (CPU only, no torch) splits the excess of step 1 over the steady state by cause, each with
its evidence; `render(analysis)` prints it; `observed_provenance(result)` lists the kernels the process was seen
compiling or loading from PTX.

The environments are `ENVS` (what each separates: docs/coldstart.md); `--env-set default` runs cold, warm,
preinit, eager and nocache, `full` adds nojit, forcejit and forcejit_warm (`ENV_SETS`); noautotune is added when
the cold run compiled with XLA, cold_again when its step 1 read files from storage (`AUTO_ENVS`). Each run has
its own folder for every compile cache a process may use (`CACHE_DIRS`: ComputeCache, Inductor, Triton, torch's
kernels and extensions, CuPy, Numba, JAX).

The breakdown of the cold run's step 1: excess = step 1 − steady state (median of steps 3…N) =
(cold − warm) + (warm − preinit) + (preinit − eager) + (eager step 1 − steady); the first three are the
cold-cache compilation (split between the framework and PTX JIT by what was written where), initialisation and
module loading; where the cold run's step 1 read files from storage, a cold_again run (empty caches, the
operating system's file cache warm) splits cold − warm into those first reads (cold − cold_again) and the
compilation (cold_again − warm). The last term is split into what was observed inside the eager run's step 1:
cuBLASLt heuristic misses (new problems in the step's level-2 log × the miss time measured by `nocache`) and
allocator growth (time in the driver's allocation calls, seen by CUPTI). The compile routes the child timed
(torch.compile's own timers, CuPy/NVRTC, Triton used directly, Numba, JAX/XLA and XLA's GEMM autotuning) take
their own share of cold − warm (their timers' difference) and their warm-cache cost from the warm run's step 1
(their timers there: framework compilation with warm caches, benchmark-based autotuning, cache lookups and
loads); the differences after cold − warm are taken with each run's timed-route seconds out of its step 1, since
a route that compiles in every run varies between runs by more than those differences measure. What none of these
explains is reported as "unexplained", never dropped: causes + unexplained = step 1 − steady state, exactly. A
difference between two runs below zero is run-to-run noise: the cause counts 0 and the evidence says what was
measured.

`--repeat N` (`run(repeat=)`, default `REPEAT_DEFAULT`) makes the runs in N rounds; the breakdown is that of each
environment's median run (`median_runs`), every figure with its spread over the rounds and causes no larger than
their spread said to be within noise (`combine_rounds`). `load` checks a saved run's values (`check_run`: a damaged
run is skipped with a note) and `check_bound` refuses a save of another program or GPU (docs/coldstart.md).
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

from cublaslt_probe.errors import NoCudaDevice, OptionError, ProbeError, error_text
from cublaslt_probe.names.classes import AUTOTUNED
from cublaslt_probe.streams import open_text

SCHEMA = 1
CONTROLLED = ("CUDA_MODULE_LOADING", "CUDA_CACHE_PATH", "CUDA_CACHE_DISABLE", "CUDA_CACHE_MAXSIZE",
              "CUDA_DISABLE_PTX_JIT", "CUDA_FORCE_PTX_JIT", "CUBLASLT_HEURISTICS_CACHE_CAPACITY",
              "CUBLASLT_LOG_LEVEL", "CUBLASLT_LOG_MASK", "CUBLASLT_LOG_FILE", "TORCHINDUCTOR_CACHE_DIR",
              "TRITON_CACHE_DIR", "PYTORCH_KERNEL_CACHE_PATH", "CUPY_CACHE_DIR", "TORCH_EXTENSIONS_DIR",
              "NUMBA_CACHE_DIR", "JAX_COMPILATION_CACHE_DIR", "CUBLASLT_PROBE_XLA_DUMP", "CUBLASLT_PROBE_XLA_FLAGS")
# every compile cache a run isolates (the folder each variable names): env var -> folder prefix
CACHE_DIRS = {"TORCHINDUCTOR_CACHE_DIR": "inductor", "TRITON_CACHE_DIR": "triton",
              "PYTORCH_KERNEL_CACHE_PATH": "torchkernels", "CUPY_CACHE_DIR": "cupy",
              "TORCH_EXTENSIONS_DIR": "torchextensions", "NUMBA_CACHE_DIR": "numba",
              "JAX_COMPILATION_CACHE_DIR": "jax"}
FRAMEWORK_VARS = tuple(CACHE_DIRS)
# XLA flags a run sets: its autotuning dumps (evidence of what XLA timed); the user's own values are replaced
XLA_DUMP_FLAGS = {"xla_gpu_dump_autotune_results_to": "autotune_results.txt",
                  "xla_gpu_dump_autotune_logs_to": "autotune_logs.txt"}
# XLA's own autotuning caches: isolated per run when the user's XLA_FLAGS turn one on
XLA_CACHE_FLAGS = ("xla_gpu_per_fusion_autotune_cache_dir", "xla_gpu_experimental_autotuner_cache_dir",
                   "xla_gpu_kernel_cache_file")


@dataclass(frozen=True)
class EnvSpec:
    name: str
    what: str
    loading: str = "LAZY"
    compute_cache: str = "main"       # which ComputeCache folder (shared folders are warm after the first run)
    framework_cache: str = "main"
    preinit: bool = False
    extra: dict = field(default_factory=dict)
    xla_flags: dict = field(default_factory=dict)


ENVS = {e.name: e for e in (
    EnvSpec("cold", "LAZY, empty caches"),
    EnvSpec("warm", "LAZY, caches warm"),
    EnvSpec("preinit", "LAZY, warm, libraries initialised first", preinit=True),
    EnvSpec("eager", "EAGER module loading, warm, initialised first", loading="EAGER", preinit=True),
    EnvSpec("nocache", "warm, initialised, heuristics cache off", preinit=True,
            extra={"CUBLASLT_HEURISTICS_CACHE_CAPACITY": "0"}),
    EnvSpec("nojit", "CUDA_DISABLE_PTX_JIT=1, empty ComputeCache", compute_cache="nojit",
            extra={"CUDA_DISABLE_PTX_JIT": "1"}),
    EnvSpec("forcejit", "CUDA_FORCE_PTX_JIT=1, empty ComputeCache", compute_cache="forced",
            extra={"CUDA_FORCE_PTX_JIT": "1"}),
    EnvSpec("forcejit_warm", "CUDA_FORCE_PTX_JIT=1, its ComputeCache warm", compute_cache="forced",
            extra={"CUDA_FORCE_PTX_JIT": "1"}),
    EnvSpec("noautotune", "LAZY, empty caches, XLA autotuning off", compute_cache="noautotune",
            framework_cache="noautotune", xla_flags={"xla_gpu_autotune_level": "0"}),
    EnvSpec("cold_again", "LAZY, empty caches again, the OS file cache warm", compute_cache="again",
            framework_cache="again"),
)}
# runs added after the listed ones when the cold run observed what they separate (not with an explicit --envs)
AUTO_ENVS = {"noautotune": "XLA compiled in the cold run's steps: the same program with XLA's autotuning off "
                           "times the autotuning",
             "cold_again": "the cold run's step 1 read files from storage (the operating system's file cache did "
                           "not hold them): the cold run again, its caches empty, after the others have read those "
                           "files, times the first reads apart from the compilation"}
# bytes a step must read from storage for the first reads of files to be a cause (below: the odd page)
STORAGE_READ_MIN = 1 << 20
# rounds `cold-start` makes of each run unless told (`--repeat`): the medians and the spread need three
REPEAT_DEFAULT = 3
ENV_SETS = {
    "default": ("cold", "warm", "preinit", "eager", "nocache"),
    "full": ("cold", "warm", "preinit", "eager", "nocache", "nojit", "forcejit", "forcejit_warm"),
    "compile": ("cold", "warm"),
    "jit": ("cold", "warm", "nojit", "forcejit", "forcejit_warm"),
}


# --- running (starts GPU children; imports no torch itself) ---------------------------------------------------------
def _files(root: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for d, _, fs in os.walk(root):
        for f in fs:
            p = os.path.join(d, f)
            with contextlib.suppress(OSError):
                out[os.path.relpath(p, root)] = os.path.getsize(p)
    return out


def env_names(env_set: str | None = None, envs: str | None = None) -> list[str]:
    """The runs to make, in order: an explicit comma list, or a named set."""
    if envs:
        names = [e.strip() for e in envs.split(",") if e.strip()]
        bad = [e for e in names if e not in ENVS]
        if bad:
            raise OptionError(f"--envs: unknown environment(s) {', '.join(bad)}; choose from {', '.join(ENVS)}")
        return names
    if (env_set or "default") not in ENV_SETS:
        raise OptionError(f"--env-set {env_set}: choose one of {', '.join(ENV_SETS)}")
    return list(ENV_SETS[env_set or "default"])


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
    measured (`binding`)."""
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


# packages whose versions a save records (the parent's, which starts the children with the same Python)
BOUND_PACKAGES = ("torch", "triton", "cupy-cuda13x", "cupy-cuda12x", "numba", "numba-cuda", "jax", "jaxlib")


def program_file(args: list[str]) -> str | None:
    """The file that holds the program of the child's arguments (`target_args`), or None (a module not found)."""
    if args[0] == "--script":
        return args[1]
    where = args[1].rpartition(":")[0]
    if where.endswith(".py"):
        return where
    with contextlib.suppress(ImportError, ValueError, AttributeError):
        import importlib.util
        spec = importlib.util.find_spec(where)
        return spec.origin if spec and spec.origin and spec.origin.endswith(".py") else None
    return None


def file_sha256(path: str | None) -> str | None:
    import hashlib
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except (OSError, TypeError):
        return None


def binding_of(args: list[str], desc: dict, runs: dict, python: str | None = None) -> dict:
    """What a save measured: the program (its name, its file's name and content hash — not its folder, a machine
    path), the GPU and the versions (the runs' device record: torch, CUDA, cuDNN; the frameworks installed, where
    the children run this Python)."""
    import importlib.metadata
    path = program_file(args)
    versions = {}
    for pkg in BOUND_PACKAGES if not python or python == sys.executable else ():
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions[pkg] = importlib.metadata.version(pkg)
    dev = _device(runs)
    return {"program": program_name({"target": desc}), "file": os.path.basename(path) if path else None,
            "sha256": file_sha256(path), "gpu": dev.get("gpu"),
            "versions": {**{k: dev[k] for k in ("torch", "cuda", "cudnn") if k in dev}, **versions}}


def program_name(result: dict) -> str | None:
    """The program a save measured, by name: its script's or function's file name without ``.py`` (and the
    function's name), else its label."""
    t = result.get("target") if isinstance(result.get("target"), dict) else {}
    if t.get("kind") == "script" and t.get("argv"):
        return os.path.splitext(os.path.basename(str(t["argv"][0])))[0]
    if t.get("kind") == "func" and t.get("spec"):
        where, _, name = str(t["spec"]).rpartition(":")
        return f"{os.path.splitext(os.path.basename(where))[0]}:{name}"
    return str(result["label"]) if result.get("label") else None


# the runs whose differences make the breakdown: the later rounds repeat these (the what-ifs run once)
REPEATED = ("cold", "warm", "preinit", "eager", "nocache", "noautotune")


def repeat_envs(first: dict) -> list[str]:
    """The runs of a later round, in round 1's order: those of `REPEATED` that completed in round 1. cold_again is
    not repeated (a later round's cold run finds the files in the operating system's file cache, as cold_again
    did), nor nocache where no run of round 1 logged a cuBLASLt matmul (no miss to time), nor the what-ifs (nojit,
    forcejit, forcejit_warm: whether the program runs, not a term of the sum). The preinit window's own GEMMs do not
    count as logged: only the steps'."""
    logged = any(n for r in first.values() for w, n in (r.get("lt_counts") or {}).items() if w.startswith("step"))
    return [n for n, r in first.items() if n in REPEATED and usable(r) and (n != "nocache" or logged)]


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
        before[var] = _files(d)
    env = _child_env(spec, dirs, root, pkg_root)
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
        new = {p: s for p, s in _files(d).items() if p not in before[var]}
        written[var] = {"count": len(new), "bytes": sum(new.values())}
    rec["cache_written"] = written
    return rec


def _child_env(spec: EnvSpec, dirs: dict[str, str], root: str, pkg_root: str) -> dict[str, str]:
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


def auto_envs(cold: dict) -> list[str]:
    """The runs `AUTO_ENVS` adds after this cold run: noautotune when XLA compiled during its steps; cold_again
    when its step 1 read at least `STORAGE_READ_MIN` bytes from storage."""
    seen = any(k.startswith("jax:") and k.endswith("backend_compile_duration")
               for w in _step_windows(cold) for k in (w.get("jit_s") or {}))
    out = ["noautotune"] if seen else []
    if storage_read(windows(cold).get("step1")) >= STORAGE_READ_MIN:
        out.append("cold_again")
    return out


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


@contextlib.contextmanager
def cold_start_step():
    """Mark one step of a script run under `cublaslt-probe cold-start` (a no-op otherwise)."""
    child = sys.modules.get("cublaslt_probe.gpu.coldstart_child")
    if child is None or getattr(child, "_ACTIVE", None) is None:
        yield
        return
    child.marked_step_begin()
    try:
        yield
    except BaseException as e:
        child.marked_step_end(error=error_text(e))
        raise
    child.marked_step_end()


# --- reading a run (CPU) ----------------------------------------------------------------------------------------
def windows(run: dict) -> dict[str, dict]:
    return {w["name"]: w for w in run.get("windows", [])}


def step_walls(run: dict) -> list[float]:
    ws = [w for w in run.get("windows", []) if re.fullmatch(r"step\d+", w["name"])]
    ws.sort(key=lambda w: int(w["name"][4:]))
    return [w["wall_s"] for w in ws]


def step_hosts(run: dict) -> list[float]:
    ws = [w for w in run.get("windows", []) if re.fullmatch(r"step\d+", w["name"])]
    ws.sort(key=lambda w: int(w["name"][4:]))
    return [w["host_s"] for w in ws]


def storage_read(w: dict | None) -> int:
    """Bytes a window read from storage, the process and its waited-for children (the child's `process_counters`;
    0 for runs saved before they were kept): what the operating system's file cache did not hold."""
    p = (w or {}).get("process") or {}
    return int(max(p.get("read_bytes", 0), p.get("inblock_bytes", 0)))


def compile_run(runs: dict) -> dict | None:
    """The run whose step 1 the cold-cache causes are measured in: cold_again (empty caches, the files the
    compilers read already in the operating system's file cache) where it completed, else cold."""
    again = runs.get("cold_again")
    return again if usable(again) else runs.get("cold")


def steady(values: list[float]) -> float | None:
    """Steady state: the median of steps 3…N."""
    return statistics.median(values[2:]) if len(values) >= 3 else None


def usable(run: dict | None) -> bool:
    return bool(run) and bool(run.get("ok")) and len(step_walls(run)) >= 3


def compile_seconds(w: dict | None) -> float:
    """torch.compile's compile time inside a window: its outermost timer (the timers nest)."""
    vals = (w or {}).get("compile_s") or {}
    return max(vals.values()) if vals else 0.0


def autotune_seconds(w: dict | None) -> float:
    """Benchmark-based autotuning inside a window: torch.compile's timers whose name says so."""
    vals = (w or {}).get("compile_s") or {}
    picked = [v for k, v in vals.items() if re.search(r"autotun|benchmark", k, re.I)]
    return min(max(picked), compile_seconds(w)) if picked else 0.0


def new_files(w: dict | None, var: str) -> dict:
    return ((w or {}).get("new_files") or {}).get(var) or {}


def _step_windows(run: dict) -> list[dict]:
    ws = [w for w in run.get("windows", []) if re.fullmatch(r"step\d+", w["name"])]
    return sorted(ws, key=lambda w: int(w["name"][4:]))


_KEY_FIELDS = ("function", "a_type", "b_type", "c_type", "d_type", "compute_type", "scale_type", "op_a",
               "op_b", "m", "n", "k", "lda", "ldb", "ldc", "ldd", "batch_count", "epilogue", "workspace_bytes")


def problem_keys(lines: list[str]) -> list[tuple]:
    """One key per logged matmul (the log parser's trace records): the function, types, transposes, sizes,
    leading dimensions, batch, epilogue and workspace, the problem part of a call that cuBLASLt's heuristics
    cache is keyed on. Other lines are skipped."""
    from cublaslt_probe.logs import parse_line
    out = []
    for i, line in enumerate(lines):
        rec = parse_line(line, i + 1)
        if rec is not None and rec.kind == "trace" and rec.m is not None:
            out.append(tuple(getattr(rec, f) for f in _KEY_FIELDS))
    return out


def new_problems(run: dict, window: str = "step1") -> tuple[int, int]:
    """(distinct problems of `window` never seen earlier in the process, GEMM lines in the window)."""
    lines = run.get("lt_lines") or {}
    order = [w["name"] for w in run.get("windows", [])]
    seen: set[tuple] = set()
    for name in order:
        if name == window:
            break
        seen.update(problem_keys(lines.get(name, [])))
    keys = problem_keys(lines.get(window, []))
    return len(set(keys) - seen), len(keys)


def lt_calls_per_step(run: dict) -> float | None:
    counts = run.get("lt_counts") or {}
    vals = [counts[w] for w in (x["name"] for x in _step_windows(run)[2:]) if w in counts]
    return statistics.median(vals) if vals else None


def driver_seconds(run: dict, window: str, what: str) -> tuple[float, int]:
    g = ((run.get("driver_calls") or {}).get(window) or {}).get("by_what", {}).get(what) or {}
    return float(g.get("seconds", 0.0)), int(g.get("count", 0))


def modules_in(run: dict, window: str) -> dict:
    return (run.get("modules") or {}).get(window) or {}


def compute_cache_written(run: dict) -> int:
    return int(((run.get("cache_written") or {}).get("CUDA_CACHE_PATH") or {}).get("count", 0))


def ptx_loads(run: dict) -> list[dict]:
    """Driver calls of the steps that were handed PTX (a loader with PTX text, the linker with PTX/LTO-IR)."""
    out = []
    for name, g in (run.get("driver_calls") or {}).items():
        if not name.startswith("step"):
            continue
        for c in g.get("records", []):
            if c.get("image") == "ptx" or c.get("input") in ("ptx", "lto-ir"):
                out.append({**c, "window": name})
    return out


def libraries_loaded_in_steps(run: dict) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for w in _step_windows(run):
        for lib in w.get("new_libraries") or []:
            out.setdefault(lib, []).append(w["name"])
    return out


# --- the compile entry points the child timed (CPU) -----------------------------------------------------------------
JAX_TRACE = ("jax:/jax/core/compile/jaxpr_trace_duration", "jax:/jax/core/compile/jaxpr_to_mlir_module_duration")
JAX_BACKEND = "jax:/jax/core/compile/backend_compile_duration"
JAX_HITS = "jax:/jax/compilation_cache/cache_hits"                  # an executable read from the cache
JAX_RETRIEVAL = "jax:/jax/compilation_cache/cache_retrieval_time_sec"  # recorded with each hit
JAX_WRITES = "jax:/jax/compilation_cache/cache_misses"               # JAX records it when it writes an entry


def jit_seconds(w: dict | None, *keys: str) -> float:
    """Seconds inside the timed entry points `keys` during a window (0 where none was called)."""
    vals = (w or {}).get("jit_s") or {}
    return float(sum((vals.get(k) or {}).get("s", 0.0) for k in keys))


def jit_calls(w: dict | None, key: str) -> int:
    return int((((w or {}).get("jit_s") or {}).get(key) or {}).get("n", 0))


def xla_seconds(w: dict | None) -> float:
    """JAX's compile path in a window: tracing, lowering to MLIR, and the backend compile (or cache load)."""
    return jit_seconds(w, *JAX_TRACE, JAX_BACKEND)


def xla_hits(w: dict | None) -> int:
    """Executables JAX's persistent cache served in a window."""
    return max(jit_calls(w, JAX_HITS), jit_calls(w, JAX_RETRIEVAL))


def xla_compiled(w: dict | None) -> bool:
    """XLA compiled in the window: backend compiles beyond those JAX's persistent cache served."""
    return jit_calls(w, JAX_BACKEND) > xla_hits(w)


def xla_candidates_timed(w: dict | None) -> int:
    """Candidates XLA timed in a window (its autotuning log: one ``run_time`` per candidate); 0 where XLA found
    every result in its autotuning cache, or wrote no log."""
    return int((((w or {}).get("xla_autotune") or {}).get("autotune_logs") or {}).get("timed", 0))


def xla_autotune_seconds(runs: dict) -> float | None:
    """What XLA's GEMM autotuning costs per full compile of the program: the cold run's backend compile in step 1
    − the noautotune run's (the same compile with ``--xla_gpu_autotune_level=0``, caches empty too); None without
    both runs compiling."""
    A, N = compile_run(runs), runs.get("noautotune")
    if not (usable(A) and usable(N)):
        return None
    a1, n1 = windows(A).get("step1"), windows(N).get("step1")
    if not (xla_compiled(a1) and xla_compiled(n1) and xla_candidates_timed(a1)):
        return None
    return jit_seconds(a1, JAX_BACKEND) - jit_seconds(n1, JAX_BACKEND)


def xla_autotuned(run: dict) -> dict:
    """What XLA's autotuning dumps of a run's steps hold: GEMMs autotuned (results), candidates timed (logs)."""
    out = {"results": 0, "timed": 0, "kinds": {}, "windows": []}
    for w in _step_windows(run):
        xa = w.get("xla_autotune") or {}
        if not xa:
            continue
        out["windows"].append(w["name"])
        out["results"] += autotuned_instructions(xa)
        lg = xa.get("autotune_logs") or {}
        out["timed"] += int(lg.get("timed", 0))
        for k, v in (lg.get("kinds") or {}).items():
            out["kinds"][k] = out["kinds"].get(k, 0) + int(v)
    return out


def autotuned_instructions(xa: dict) -> int:
    """GEMM fusions XLA autotuned, from its dumps: one ``instruction_profiles`` (or, in older XLA, ``logs``) entry
    of the log per fusion, else the result file's ``entries``/``results``."""
    lg, res = xa.get("autotune_logs") or {}, xa.get("autotune_results") or {}
    for d in (lg, res):
        text = d.get("text") or ""
        n = len(re.findall(r"^(?:instruction_profiles|logs|entries|results)\s*\{", text, re.M))
        if n:
            return n
        if d.get("logs") or d.get("results"):
            return int(d.get("logs") or d.get("results"))
    return 0


def _chosen(xa: dict) -> str:
    """The backends XLA's autotuning chose (its results file: ``optimal_config { backend: ... }``), counted."""
    text = ((xa.get("autotune_results") or {}).get("text") or "")
    got: dict[str, int] = {}
    for m in re.finditer(r"optimal_config\s*\{\s*backend:\s*(\w+)", text):
        got[m.group(1)] = got.get(m.group(1), 0) + 1
    return ", ".join(f"{k} {v}" for k, v in sorted(got.items()))


def triton_direct_warm(run: dict, w: dict | None) -> tuple[float, float]:
    """(Triton's own host time in `w` beyond its steady launches, the steady time per launch): the seconds inside
    `JITFunction.run` in the window − its calls × the median per-call time of steps 3…N."""
    per = [jit_seconds(x, "triton.run") / jit_calls(x, "triton.run") for x in _step_windows(run)[2:]
           if jit_calls(x, "triton.run")]
    each = statistics.median(per) if per else 0.0
    return jit_seconds(w, "triton.run") - jit_calls(w, "triton.run") * each, each


def jit_mechanisms(w: dict | None) -> set[str]:
    """The compile routes a window was seen in (their entry points were called and compiled or loaded)."""
    out = set()
    if jit_calls(w, "cupy.compile"):
        out.add("nvrtc-cupy")
    if jit_calls(w, "triton.compile.direct"):
        out.add("triton-direct")
    if jit_calls(w, "numba.compile") and (jit_calls(w, "numba.nvvm") or jit_calls(w, "numba.link")):
        out.add("numba")
    if jit_seconds(w, JAX_BACKEND):
        out.add("xla")
    return out


def span_owner(w: dict | None, t_ms: float) -> str | None:
    """The mechanism whose timed entry point was running at `t_ms` (ms from the window's start), or None."""
    inside = [sp for sp in (w or {}).get("jit_spans") or [] if sp["t0_ms"] <= t_ms <= sp["t1_ms"]]
    if not inside:
        return None
    key = max(inside, key=lambda sp: sp["t1_ms"] - sp["t0_ms"])["key"]  # the outermost call names the route
    return _SPAN_MECH.get(key) or next((m for p, m in _SPAN_PREFIX if key.startswith(p)), None)


_SPAN_MECH = {"cupy.compile": "nvrtc-cupy", "cupy.nvrtc": "nvrtc-cupy", "cupy.nvcc": "nvrtc-cupy",
              "triton.run": "triton-direct", "triton.compile.direct": "triton-direct",
              "triton.load.direct": "triton-direct", "triton.compile.other": "triton-jit",
              "triton.load.other": "triton-jit", "triton.launcher": "triton-jit", "triton.build": "triton-jit",
              "numba.compile": "numba", "numba.nvvm": "numba", "numba.link": "numba"}
_SPAN_PREFIX = (("jax:", "xla"),)


# --- analysis (CPU) -----------------------------------------------------------------------------------------------
def _ms(s: float | None) -> str:
    return "n/a" if s is None else f"{s * 1e3:.1f} ms"


def _diff(a: dict | None, b: dict | None) -> float | None:
    if not (usable(a) and usable(b)):
        return None
    return step_walls(a)[0] - step_walls(b)[0]


def triton_route(run: dict) -> str:
    """Who made the Triton kernels of a run: ``triton`` (torch.compile: its timers ran or Inductor wrote its
    cache), ``triton-direct``
    (`JITFunction.run` compiled or loaded them), else ``triton-jit`` (no caller observed: a run saved without the
    child's entry-point timers)."""
    ws = run.get("windows") or []
    if any(w.get("compile_s") or new_files(w, "TORCHINDUCTOR_CACHE_DIR").get("count") for w in ws):
        return "triton"
    if any("triton-direct" in jit_mechanisms(w) for w in ws):
        return "triton-direct"
    return "triton-jit"


def runtime_compilation(runs: dict) -> dict:
    """What the process was seen compiling (not forced runs): mechanisms with their evidence."""
    mech: dict[str, list[str]] = {}
    hints: list[str] = []
    for name, r in runs.items():
        if not r or str(r.get("env", {}).get("CUDA_FORCE_PTX_JIT")) == "1":
            continue
        route = triton_route(r)
        for w in _step_windows(r):
            tri = w.get("triton_kernels") or []
            ind = new_files(w, "TORCHINDUCTOR_CACHE_DIR")
            if tri:
                mech.setdefault(route, []).append(
                    f"{name} {w['name']}: Triton wrote {len(tri)} new kernel binaries (.cubin), e.g. {tri[0]}")
            if ind.get("count"):
                mech.setdefault("inductor", []).append(
                    f"{name} {w['name']}: Inductor wrote {ind['count']} files ({ind['bytes'] / 1024:.0f} KiB) "
                    "to its cache")
            cc = new_files(w, "CUDA_CACHE_PATH")
            if cc.get("count") and cc.get("bytes"):  # an empty index file alone is no JIT output
                mech.setdefault("ptx-jit", []).append(
                    f"{name} {w['name']}: the driver wrote {cc['count']} ComputeCache files (PTX JIT output)")
            kc = new_files(w, "PYTORCH_KERNEL_CACHE_PATH")
            if kc.get("count"):
                mech.setdefault("nvrtc", []).append(
                    f"{name} {w['name']}: torch's NVRTC kernel cache got {kc['count']} new files")
            _jit_evidence(name, w, mech, hints)
        warm_cc = bool((r.get("env") or {}).get("compute_cache_warm")) and not compute_cache_written(r)
        wins = windows(r)
        for c in ptx_loads(r):
            what = c.get("image") if c.get("image") == "ptx" else c.get("input")
            owner = span_owner(wins.get(c["window"]), c.get("t_ms", -1.0))
            line = (f"{name} {c['window']}: {c['name']} was handed {what} "
                    f"({c.get('image_bytes', 0) / 1024:.0f} KiB), {c['seconds'] * 1e3:.1f} ms in the call")
            if owner:
                line += f", inside {_MECH_LABEL.get(owner, owner)}'s compile"
            if c.get("rc"):
                hints.append(line + f", and failed (CUDA error {c['rc']})")
            elif warm_cc:
                hints.append(line + " (its JIT output came from the warm ComputeCache)")
            else:
                mech.setdefault("ptx-jit", []).append(line)
        for lib, ws in libraries_loaded_in_steps(r).items():
            where = f"{name}: {lib} was loaded during {', '.join(ws)}"
            owners = set().union(*(jit_mechanisms(wins.get(x)) for x in ws))
            if lib.startswith("libnvidia-ptxjitcompiler"):
                mech.setdefault("ptx-jit", []).append(where + " (the driver's PTX JIT compiler)")
            elif lib.startswith(("libnvrtc", "libnvJitLink", "libnvptxcompiler", "libnvvm")) and owners:
                for o in sorted(owners):  # the compiler library of a route seen compiling in the same step
                    mech.setdefault(o, []).append(where)
            elif lib.startswith(("libnvrtc", "libnvJitLink", "libnvptxcompiler")):
                mech.setdefault("nvjitlink" if "nvJitLink" in lib else "nvrtc", []).append(where)
            elif "runtime_compiled" in lib:
                hints.append(where + " (cuDNN's runtime-compiled engines: they compile with NVRTC when chosen)")
    seen = [m for m in _MECH_LABEL if m in mech] + sorted(m for m in mech if m not in _MECH_LABEL)
    if seen:
        verdict = "runtime compilation observed: " + ", ".join(_MECH_LABEL.get(m, m) for m in seen)
    else:
        verdict = ("no runtime compilation observed: no ComputeCache, Triton, Inductor, CuPy, Numba, XLA or "
                   "kernel-cache work was seen during the steps, no PTX was handed to the driver, and no "
                   "NVRTC/nvJitLink was loaded")
    return {"observed": bool(seen), "mechanisms": {m: mech[m][:6] for m in seen}, "hints": hints[:8],
            "verdict": verdict}


def _jit_evidence(name: str, w: dict, mech: dict, hints: list) -> None:
    """The compile entry points a step window called, as evidence of their mechanism (or hints: cache hits)."""
    where = f"{name} {w['name']}"
    n, nv = jit_calls(w, "cupy.compile"), jit_calls(w, "cupy.nvrtc") + jit_calls(w, "cupy.nvcc")
    cupy_files = new_files(w, "CUPY_CACHE_DIR")
    if nv:
        mech.setdefault("nvrtc-cupy", []).append(
            f"{where}: CuPy compiled {nv} kernels with NVRTC ({jit_seconds(w, 'cupy.nvrtc', 'cupy.nvcc') * 1e3:.1f} ms "
            f"in the compiler; {n} cached-compile calls, {jit_seconds(w, 'cupy.compile') * 1e3:.1f} ms in all), "
            f"{cupy_files.get('count', 0)} files written to CUPY_CACHE_DIR")
    elif n:
        hints.append(f"{where}: CuPy took {n} kernels from its cache (CUPY_CACHE_DIR), no NVRTC call: "
                     f"{jit_seconds(w, 'cupy.compile') * 1e3:.1f} ms to look up and load them")
    nd = jit_calls(w, "triton.compile.direct")
    if nd:
        built = jit_calls(w, "triton.build")
        line = (f"{where}: JITFunction.run called triton.compile {nd} times "
                f"({jit_seconds(w, 'triton.compile.direct') * 1e3:.1f} ms), loaded "
                f"{jit_calls(w, 'triton.load.direct')} kernels with their launchers "
                f"({jit_seconds(w, 'triton.load.direct') * 1e3:.1f} ms)")
        if built:
            line += f"; {built} C modules built with the host compiler ({jit_seconds(w, 'triton.build') * 1e3:.1f} ms)"
        if w.get("triton_kernels") or built:
            mech.setdefault("triton-direct", []).append(line)
        else:  # no binary written: compile found the kernel in Triton's cache
            hints.append(line + "; served from Triton's cache (no new binary)")
    if "numba" in jit_mechanisms(w):
        mech.setdefault("numba", []).append(
            f"{where}: Numba compiled {jit_calls(w, 'numba.compile')} kernel signatures "
            f"({jit_seconds(w, 'numba.compile') * 1e3:.1f} ms: NVVM {jit_seconds(w, 'numba.nvvm') * 1e3:.1f} ms, "
            f"link {jit_seconds(w, 'numba.link') * 1e3:.1f} ms)")
    if jit_seconds(w, JAX_BACKEND):
        line = (f"{where}: XLA backend compile {jit_seconds(w, JAX_BACKEND) * 1e3:.1f} ms in "
                f"{jit_calls(w, JAX_BACKEND)} calls (tracing and lowering {jit_seconds(w, *JAX_TRACE) * 1e3:.1f} ms); "
                f"JAX's persistent cache served {xla_hits(w)}, got {jit_calls(w, JAX_WRITES)} new entries")
        (mech.setdefault("xla", []).append if xla_compiled(w) else hints.append)(
            line if xla_compiled(w) else line + " (served from JAX's persistent cache)")
    xa = w.get("xla_autotune") or {}
    timed = xla_candidates_timed(w)
    if timed:
        lg = xa.get("autotune_logs") or {}
        kinds = ", ".join(f"{k} {v}" for k, v in sorted((lg.get("kinds") or {}).items()))
        mech.setdefault("xla-autotune", []).append(
            f"{where}: XLA's autotuning log: {timed} candidates timed for {autotuned_instructions(xa)} GEMM "
            f"fusions ({kinds or 'kinds not listed'}); backends chosen: {_chosen(xa) or 'not listed'}")
    elif xa and jit_seconds(w, JAX_BACKEND) and xla_compiled(w):
        hints.append(f"{where}: XLA compiled and timed no candidate: its autotuning results came from its own "
                     "autotuning cache (in JAX's cache folder)")


_MECH_LABEL = {"triton": "Triton via torch.compile", "inductor": "Inductor code generation",
               "triton-direct": "Triton JIT (direct)", "triton-jit": "Triton (caller not observed)",
               "nvrtc-cupy": "NVRTC (CuPy)", "numba": "Numba", "xla": "XLA compile",
               "xla-autotune": "XLA GEMM autotuning", "ptx-jit": "PTX JIT by the driver", "nvrtc": "NVRTC",
               "nvjitlink": "nvJitLink"}


def analyse(result: dict) -> dict:
    """The breakdown of the cold run's first step (see the module doc); for a save made with `--repeat`, the
    breakdown of the median runs (`median_runs`) with each figure's spread over the rounds (`combine_rounds`).
    CPU only."""
    rounds = rounds_of(result)
    if len(rounds) < 2:
        out = analyse_round(result)
    else:
        runs, chosen, left = median_runs(rounds)
        out = analyse_round({**result, "runs": runs})
        if out.get("baseline") is not None:
            per = [analyse_round({**result, "runs": r}, brief=True) for r in rounds]
            out = combine_rounds(out, per, rounds, chosen, left)
    out["repeat"] = len(rounds)
    out["notes"] = list(result.get("load_notes") or [])
    out["binding"] = result.get("binding") if isinstance(result.get("binding"), dict) else None
    return out


def rounds_of(result: dict) -> list[dict]:
    """The rounds of a save: its runs (round 1), then each later round's runs (`--repeat`; none in older saves)."""
    return [result.get("runs") or {}] + [r for r in (result.get("repeats") or []) if isinstance(r, dict) and r]


def analyse_round(result: dict, brief: bool = False) -> dict:
    """The breakdown of one round: the cold run's first step of `result`'s runs. `brief`: the figures only (no
    provenance, caches, what-ifs).

    Each term of the module doc's sum has its own function, called here in the sum's order (cold caches,
    initialisation, module loading, then what step 1 of the eager run shows); each returns its components, and
    what one measured but counts nowhere goes to the analysis' evidence, so the components and the notes keep
    that order."""
    runs = result.get("runs") or {}
    if not runs:
        raise ProbeError("cold-start result has no runs: was it saved by `cold-start --save`?")
    table = _run_table(runs)
    base_name = "cold" if usable(runs.get("cold")) else next((n for n, r in runs.items() if usable(r)
                                                              and n not in ("forcejit", "forcejit_warm")), None)
    out = {"label": result.get("label"), "device": _device(runs), "steps": result.get("steps"), "table": table,
           "baseline": base_name, "components": [], "evidence": [],
           "compilation": None if brief else runtime_compilation(runs)}
    if base_name is None:
        out["verdict"] = failure_verdict(runs)
        return out
    A = runs[base_name]
    B, C, D, E = (runs.get(n) for n in ("warm", "preinit", "eager", "nocache"))
    walls = step_walls(A)
    step1, st = walls[0], steady(walls)
    excess = step1 - st
    out.update({"step1_s": step1, "step2_s": walls[1], "steady_s": st, "excess_s": excess})
    notes = out["evidence"]
    comps: list[dict] = []
    if base_name == "cold" and usable(B):
        K = compile_run(runs)
        if K is not A:
            comps.append(_file_cache_component(A, K))
        elif storage_read(windows(A).get("step1")) >= STORAGE_READ_MIN:
            notes.append(_unseparated_reads(A))
        comps += _cold_cache_components(runs, K, "cold" if K is A else "cold_again", B, notes)
    if usable(B) and usable(C):
        comps.append(_initialisation_component(B, C))
    if usable(C) and usable(D):
        comps.append(_module_loading_component(A, C, D, base_name))
    # inside the eager run's step 1 (or the baseline's when there is none)
    R = D if usable(D) else (C if usable(C) else A)
    rname = [n for n, r in runs.items() if r is R][0]
    # the timed compile routes with warm caches: measured in the warm run, whose step 1 the differences after
    # cold − warm start from with those routes' seconds taken out (`routes_seconds`)
    W, wname = (B, "warm") if usable(B) else (R, rname)
    comps += _step1_components(runs, R, rname, notes, W, wname, A, base_name)
    comps += _heuristics_components(R, rname, C, E, notes)
    comps += _allocator_components(R, rname)
    explained = sum(c["seconds"] for c in comps)
    if excess > 0 and explained > DISAGREE * excess:
        notes.insert(0, f"the causes, each measured in its own runs, add up to {explained / excess:.1f}× the excess: "
                        "the runs disagree by more than run-to-run noise (step 1: " + ", ".join(
                            f"{t['run']} {_ms(t['step1_s'])}" for t in table if t["step1_s"] is not None)
                        + "); a damaged or edited file, or a machine busy with other work while it ran")
    out["unexplained_s"] = excess - explained
    out["unexplained_pct"] = 100.0 * out["unexplained_s"] / excess if excess > 0 else None
    out["components"] = comps
    if brief:
        return out
    out["what_if"] = _what_if(runs)
    out["caches"] = cache_states(runs)
    out["kernels"] = observed_provenance(result)
    out["forced_jit"] = forced_jit(result)
    out["runs_wall_s"], out["overhead_s"] = overhead(runs)
    out["import_s"] = sum(float(r.get("import_torch_s") or 0.0) for r in runs.values())
    out["step2_excess_s"] = walls[1] - st
    return out


# the causes may exceed the excess by noise; beyond this factor the runs contradict each other
DISAGREE = 1.5
# causes a later round cannot show: the first reads of files from storage happen once per machine (round 1)
ONCE_PER_MACHINE = ("file_cache",)


def spread(values: list[float]) -> dict:
    """A figure over the rounds: its median and its spread (min, max)."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def within_noise(size: float, measured: list[float]) -> bool:
    """Whether a figure of that size is within the noise of what the rounds measured: no larger than their spread
    (max − min), so the rounds cannot tell it from zero. One round, or rounds that all measured the same, have no
    spread: never within noise."""
    return len(measured) >= 2 and 0 < max(measured) - min(measured) and abs(size) <= max(measured) - min(measured)


def median_runs(rounds: list[dict]) -> tuple[dict, dict, list[str]]:
    """One run per environment, each the median of that environment's completed runs over the rounds by step 1
    (the lower median of an even count), in round 1's order (a run that round 1 lacks, skipped on load, after);
    the environments that ran once as the first round to have them made them.
    The breakdown of these runs adds up as one round's does, and each of its differences is taken between
    typical runs. The cold run is the median of the cold runs whose step 1 read less than `STORAGE_READ_MIN` from
    storage and of cold_again (each: empty compile caches, the operating system's file cache warm): a cold run that
    read its files from storage happens once per machine, and is reported apart. Returns (runs by name, the round
    each came from by name, notes on what was left out)."""
    first, out, chosen, left = rounds[0], {}, {}, []
    names = list(first) + [n for r in rounds[1:] for n in r if n not in first]
    for name in dict.fromkeys(names):
        if name == "cold_again":
            continue
        pool = [(k, r[name]) for k, r in enumerate(rounds, 1) if usable(r.get(name))]
        if name == "cold":
            read = [(k, x) for k, x in pool if storage_read(windows(x).get("step1")) >= STORAGE_READ_MIN]
            again = [(1, first["cold_again"])] if usable(first.get("cold_again")) else []
            if read and len(pool) - len(read) + len(again):
                pool = [p for p in pool if p not in read] + again
                left += [f"the cold run of round {k} read {storage_read(windows(x).get('step1')) / 2**20:.1f} MiB "
                         f"from storage in step 1 ({_ms(step_walls(x)[0])}): the first reads of a fresh machine, "
                         "left out of the median cold run (the others found those files in the file cache)"
                         for k, x in read]
        if not pool:
            k = next(k for k, r in enumerate(rounds, 1) if name in r)
            out[name], chosen[name] = rounds[k - 1][name], {"round": k, "step1_s": []}
            continue
        k, run = sorted(pool, key=lambda p: step_walls(p[1])[0])[(len(pool) - 1) // 2]
        out[name], chosen[name] = run, {"round": k, "step1_s": [step_walls(x)[0] for _, x in pool]}
    return out, chosen, left


def combine_rounds(med: dict, per: list[dict], rounds: list[dict], chosen: dict, left: list[str]) -> dict:
    """The breakdown of the median runs (`med`, `median_runs`) with each figure's spread over the rounds `per`
    (each round's own breakdown: step 1, excess, unexplained, each cause as measured, 0 in a round without it;
    `spread`) and whether a cause is within noise (its size no larger than its spread: `within_noise`).
    The unexplained rest is within noise when no larger than the spread of the excess or of the rounds' own
    unexplained. Causes of `ONCE_PER_MACHINE` are left out of the spreads (a later round cannot show them)."""
    ok = [a for a in per if a.get("baseline") == med["baseline"] and a.get("excess_s") is not None]
    out = dict(med)
    out["evidence"] = list(med["evidence"]) + left
    fig = {k: spread([a[k] for a in ok]) for k in ("step1_s", "excess_s", "unexplained_s")}
    comps = []
    for c in med["components"]:
        byr = [next((x for x in a["components"] if x["cause"] == c["cause"]), None) for a in ok]
        measured = [(x["measured_s"] or 0.0) if x else 0.0 for x in byr]
        extra = {} if c["cause"] in ONCE_PER_MACHINE else {
            "spread": spread(measured), "rounds_s": measured, "within_noise": within_noise(c["seconds"], measured)}
        comps.append({**c, **extra})
    out["components"] = comps
    out["noise_s"] = max(fig["excess_s"]["max"] - fig["excess_s"]["min"],
                         fig["unexplained_s"]["max"] - fig["unexplained_s"]["min"])
    out["unexplained_within_noise"] = len(ok) >= 2 and abs(out["unexplained_s"]) <= out["noise_s"]
    out["rounds"] = {"n": len(ok), "made": len(per), "figures": fig,
                     "chosen": {k: v["round"] for k, v in chosen.items()}}
    out["table"] = _rounds_table(med["table"], chosen)
    return out


def _rounds_table(table: list[dict], chosen: dict) -> list[dict]:
    """The median runs' table with, per run, the round it came from, how many runs it is the median of and the
    spread of their step 1."""
    out = []
    for t in table:
        c = chosen.get(t["run"]) or {"round": 1, "step1_s": []}
        row = {**t, "rounds": len(c["step1_s"]), "round": c["round"]}
        if len(c["step1_s"]) >= 2:
            row["spread"] = {"step1_s": spread(c["step1_s"])}
        out.append(row)
    return out


def failure_verdict(runs: dict) -> str:
    """The verdict when no run completed its steps: where the program failed and with what error, and whether a
    timed compile route was the last thing the failed step ran (the error came out of that compile)."""
    errs, where, inside = [], [], []
    for r in runs.values():
        errs.append(first_line(r.get("error") or _window_error(r)))
        bad = next((w for w in r.get("windows", []) if not w.get("ok", True)), None)
        if bad is None:
            continue
        where.append(bad["name"])
        spans = bad.get("jit_spans") or []
        if spans:  # the step's last timed call ended as the step ended: the error came out of it
            last = max(spans, key=lambda sp: sp["t1_ms"])
            if bad["wall_s"] * 1e3 - last["t1_ms"] < 1.0:
                inside.append(span_owner(bad, last["t1_ms"]))
    if not errs or len(set(errs)) > 1 or not errs[0]:
        return "no run completed its steps: see the errors in the table"
    place = re.sub(r"^step(\d+)$", r"step \1", where[0]) if len(set(where)) == 1 and len(where) == len(errs) \
        else "its steps"
    mech = inside[0] if len(inside) == len(errs) and len(set(inside)) == 1 and inside[0] else None
    return (f"no run completed its steps: the program failed in {place} of every run"
            + (f", inside {_MECH_LABEL.get(mech, mech)}'s compile" if mech else "")
            + f" ({errs[0]}); that is the program's own error, not a cold-start cost: run the script alone to see "
            "its traceback, fix it, then run cold-start again")


def _run_table(runs: dict) -> list[dict]:
    """One row per run: its environment, whether it completed, its step 1, step 2 and steady-state walls, and the
    first line of its error; the table shows every run, the failed ones too."""
    table = []
    for name, r in runs.items():
        walls = step_walls(r)
        table.append({"run": name, "env": (r.get("env") or {}).get("what", ""), "ok": bool(r.get("ok")),
                      "step1_s": walls[0] if walls else None, "step2_s": walls[1] if len(walls) > 1 else None,
                      "steady_s": steady(walls), "wall_s": r.get("wall_s"),
                      "error": None if r.get("ok") else first_line(r.get("error") or _window_error(r))})
    return table


def _component(cause: str, label: str, seconds: float | None, how: str, evidence: list[str]) -> dict:
    """One cause of the breakdown. It counts `seconds` clamped at 0 (a difference below zero is run-to-run
    noise) and keeps what was measured in `measured_s`, so the evidence can show it."""
    return {"cause": cause, "label": label, "seconds": max(0.0, seconds or 0.0), "how": how,
            "measured_s": seconds, "evidence": evidence}


def _cold_cache_components(runs: dict, A: dict, aname: str, B: dict, notes: list[str]) -> list[dict]:
    """`aname` − warm (step 1 of run `A`, empty caches: cold, or cold_again where it ran, over the warm run `B`):
    the compilation whose output the caches keep. Autotuning and the timed compile routes take their own timers'
    share; the rest goes to the framework and to PTX JIT by which caches run `A` wrote. A rest that no component
    takes goes to `notes`."""
    d = _diff(A, B)
    s1 = windows(A).get("step1", {})
    tri = s1.get("triton_kernels") or []
    fw_files = sum(new_files(s1, v).get("count", 0) for v in FRAMEWORK_VARS)
    cc_files = new_files(s1, "CUDA_CACHE_PATH").get("count", 0) or compute_cache_written(A)
    ev = [f"step 1 {aname} {_ms(step_walls(A)[0])} vs warm caches {_ms(step_walls(B)[0])}: {d * 1e3:+.1f} ms",
          f"{aname} run step 1 wrote {fw_files} framework cache files ({len(tri)} Triton kernels) and "
          f"{cc_files} ComputeCache files; the warm run's step 1 wrote "
          f"{sum(new_files(windows(B).get('step1'), v).get('count', 0) for v in FRAMEWORK_VARS)} and "
          f"{new_files(windows(B).get('step1'), 'CUDA_CACHE_PATH').get('count', 0)}"]
    cA, cB = compile_seconds(s1), compile_seconds(windows(B).get("step1"))
    if cA or cB:
        ev.append(f"torch.compile's timers in step 1: {cA:.3f} s cold, {cB:.3f} s warm")
    comps = []
    # benchmark-based autotuning that a warm cache skips (Inductor timing Triton configs) is kept apart
    tune = max(0.0, autotune_seconds(s1) - autotune_seconds(windows(B).get("step1")))
    tune = min(tune, max(d, 0.0)) if fw_files else 0.0
    if tune:
        comps.append(_component(
            "autotuning", "benchmark-based autotuning (cold cache)", tune, "torch.compile timers (cold − warm)",
            [f"autotuning timers in step 1: {autotune_seconds(s1):.3f} s cold, "
             f"{autotune_seconds(windows(B).get('step1')):.3f} s warm"]))
    # the routes whose entry points were timed: each gets its own cold − warm timer difference
    timed = _cold_timed(runs, s1, windows(B).get("step1") or {})
    scaled, used = _scaled_timed(timed, max(d - tune, 0.0))
    comps += scaled
    rest = d - tune - used
    torch_fw = bool(cA or cB) or bool(new_files(s1, "TORCHINDUCTOR_CACHE_DIR").get("count"))
    fw_label = ("runtime compilation, Triton via torch.compile (cold cache)" if torch_fw else
                "runtime compilation, framework (cold cache)")
    jit_label = "runtime compilation, PTX JIT (cold ComputeCache)"
    if timed and not torch_fw:
        if cc_files:
            comps.append(_component("ptx_jit", jit_label, rest, "cold − warm − timed routes",
                                    [f"{cc_files} ComputeCache files written by the cold run"]))
        else:
            notes.append(f"cold − warm less the timed compile routes: {rest * 1e3:+.1f} ms, not "
                         "attributed (no other cache was written)")
    elif fw_files and cc_files:
        fw = min(max(rest, 0.0), max(0.0, cA - cB - tune)) if (cA or cB) else max(rest, 0.0)
        comps.append(_component("runtime_compilation", fw_label, fw, "cold − warm", ev))
        comps.append(_component("ptx_jit", jit_label, rest - fw, "cold − warm",
                                [f"{cc_files} ComputeCache files written by the cold run"]))
    elif fw_files:
        comps.append(_component("runtime_compilation", fw_label, rest, "cold − warm", ev))
    elif cc_files:
        comps.append(_component("ptx_jit", jit_label, rest, "cold − warm", ev))
    else:
        ev.append("no cache file was written: no compilation is cached, the difference is run-to-run noise")
        comps.append(_component("cold_caches", "cold caches (nothing was compiled)", 0.0, "cold − warm", ev))
        comps[-1]["measured_s"] = d
    return comps


def _reads(w: dict | None) -> str:
    """What a window read from storage and its CPU time, for the evidence."""
    p = (w or {}).get("process") or {}
    return (f"{storage_read(w) / 2**20:.1f} MiB read from storage ({p.get('majflt', 0)} major page faults, "
            f"{p.get('children_majflt', 0)} in its subprocesses), CPU {p.get('cpu_s', 0.0) * 1e3:.1f} ms "
            f"+ {p.get('children_cpu_s', 0.0) * 1e3:.1f} ms in subprocesses")


def _file_cache_component(A: dict, K: dict) -> dict:
    """cold − cold_again (step 1 of each, the same empty caches): the first reads of the files the program and
    its compilers use, which the operating system's file cache held by the time of the cold_again run. What
    each step read from storage and its CPU time are the evidence (the reads cost CPU as well as waiting)."""
    a, k = step_walls(A)[0], step_walls(K)[0]
    wa, wk = windows(A).get("step1"), windows(K).get("step1")
    ev = [f"step 1 with empty caches: {_ms(a)} in the cold run, {_ms(k)} in the cold_again run (after the other "
          f"runs had read the same files): {(a - k) * 1e3:+.1f} ms",
          f"step 1 of the cold run: {_reads(wa)}; of the cold_again run: {_reads(wk)}",
          "a second cold-start on this machine finds those files in the file cache: this cause is then absent, the "
          "others are the same" if a > k else "the first reads took no time the runs can tell from their noise"]
    return _component("file_cache", "first reads of files from storage (the OS file cache was cold)", a - k,
                      "cold − cold_again", ev)


def _unseparated_reads(A: dict) -> str:
    """The note for a cold run whose step 1 read from storage with no cold_again run to time those reads."""
    return (f"the cold run's step 1 read {storage_read(windows(A).get('step1')) / 2**20:.1f} MiB from storage (the "
            "operating system's file cache did not hold the files): cold − warm includes those first reads, not "
            "separated here (no cold_again run: it is added when a named run set is used, or name it in --envs)")


def _scaled_timed(timed: list[tuple], room: float) -> tuple[list[dict], float]:
    """The timed compile routes of `_cold_timed` as components, and the seconds they take. Their timers overlap
    what else cold − warm holds, so when they add up to more than `room` (cold − warm less autotuning) each is
    scaled down to fit and its evidence says by how much."""
    total = sum(max(t[2], 0.0) for t in timed)
    scale = min(1.0, room / total) if total > 0 else 0.0
    comps = []
    for cause, label, sec, how, tev in timed:
        if scale < 1.0 and sec > 0:
            tev = tev + [f"the timed routes add up to {total * 1e3:.1f} ms, more than cold − warm "
                         f"({room * 1e3:.1f} ms): each is scaled by {scale:.3f}"]
        comps.append(_component(cause, label, sec * scale if sec > 0 else sec, how, tev))
    return comps, total * scale


def routes_seconds(run: dict, w: dict | None) -> float:
    """Seconds a step window spent inside the timed compile routes (torch.compile's outermost timer, CuPy's
    compile, Triton's launch path beyond its steady launches, Numba's compile, JAX's compile events): the part of
    the step that `_step1_components` measures directly. A route that compiles in every run (Numba without a disk
    cache, torch.compile's tracing and cache loads) varies from run to run by more than the differences between
    runs measure, so those differences are taken with it out."""
    tri = triton_direct_warm(run, w)[0] if jit_calls(w, "triton.run") else 0.0
    return compile_seconds(w) + jit_seconds(w, "cupy.compile", "numba.compile") + tri + xla_seconds(w)


def _walls_less_routes(X: dict) -> tuple[float, float]:
    """(step 1 of run X, the timed routes' seconds in it)."""
    return step_walls(X)[0], routes_seconds(X, windows(X).get("step1"))


# what the preinit items of each library initialise, for the label
_PREINIT_LIBS = (("cupy_", "CuPy's own cuBLAS handle, first GEMM and first reduction"),
                 ("jax_", "JAX's backend and first transfer"), ("numba_", "Numba's context and first transfer"))


def _initialisation_component(B: dict, C: dict) -> dict:
    """warm − preinit, each step 1 less its timed compile routes (`routes_seconds`): library initialisation
    (torch's handles, first GEMMs, cuDNN; CuPy's own cuBLAS handle, GEMM and reduction when the program uses
    CuPy), with what initialising apart took in the preinit run `C` and the driver's load calls in each item."""
    (b1, tb), (c1, tc) = _walls_less_routes(B), _walls_less_routes(C)
    d = (b1 - tb) - (c1 - tc)
    pre = C.get("preinit") or {}
    items = ", ".join(f"{k} {v * 1e3:.1f} ms" if isinstance(v, float) else f"{k} failed" for k, v in pre.items())
    ev = [f"step 1 warm {_ms(b1)} vs libraries initialised first {_ms(c1)}: {(b1 - c1) * 1e3:+.1f} ms",
          f"initialising apart took: {items}"]
    if tb or tc:
        ev[0] += (f"; less the timed compile routes in each ({_ms(tb)} warm, {_ms(tc)} preinit): "
                  f"{d * 1e3:+.1f} ms")
    loads: dict[str, list[float]] = {}
    for c in ((C.get("driver_calls") or {}).get("preinit") or {}).get("records", []):
        if c.get("what") == "load" and c.get("preinit_item"):
            loads.setdefault(c["preinit_item"], []).append(float(c.get("seconds") or 0.0))
    if loads:
        ev.append("CUPTI: load calls (cuModuleLoad*/cuLibraryLoad*) inside the items: " + ", ".join(
            f"{k} {len(v)} ({sum(v) * 1e3:.1f} ms)" for k, v in loads.items()))
    libs = [what for prefix, what in _PREINIT_LIBS if any(k.startswith(prefix) for k in pre)]
    label = "library initialisation (handles, first GEMM of a handle, cuDNN" + "".join(f"; {x}" for x in libs) + ")"
    return _component("initialisation", label, d, "warm − preinit", ev)


def _module_loading_component(A: dict, C: dict, D: dict, base_name: str) -> dict:
    """preinit − eager, each step 1 less its timed compile routes (`routes_seconds`): lazy module loading, with
    the modules CUPTI saw loaded in step 1 of the baseline `A` and of the eager run `D` (when the runs had CUPTI)."""
    (c1, tc), (d1, td) = _walls_less_routes(C), _walls_less_routes(D)
    d = (c1 - tc) - (d1 - td)
    mA, mD = modules_in(A, "step1"), modules_in(D, "step1")
    ev = [f"step 1 LAZY {_ms(c1)} vs EAGER {_ms(d1)}: {(c1 - d1) * 1e3:+.1f} ms"]
    if tc or td:
        ev[0] += f"; less the timed compile routes in each ({_ms(tc)} LAZY, {_ms(td)} EAGER): {d * 1e3:+.1f} ms"
    if A.get("modules") is not None:
        kinds = ", ".join(f"{k} {v}" for k, v in (mA.get("by_kind") or {}).items())
        ev.append(f"CUPTI: {mA.get('count', 0)} modules ({mA.get('bytes', 0) / 2**20:.1f} MiB; {kinds or 'none'}) "
                  f"loaded during the {base_name} run's step 1; {mD.get('count', 0)} during the eager run's "
                  f"step 1; the eager run loaded {modules_in(D, 'setup').get('count', 0)} modules at start "
                  f"(setup {_ms(windows(D).get('setup', {}).get('wall_s'))})")
        ls, ln = driver_seconds(A, "step1", "load")
        if ln:
            ev.append(f"{ln} explicit load calls (cuModuleLoad*/cuLibraryLoad*) in step 1: {ls * 1e3:.1f} ms")
    return _component("module_loading", "lazy module loading", d, "preinit − eager", ev)


def _step1_components(runs: dict, R: dict, rname: str, notes: list[str], W: dict, wname: str, A: dict,
                      aname: str) -> list[dict]:
    """The compilers' own work with warm caches, inside step 1 of run `W` (named `wname`: the warm run, whose step
    1 the differences after cold − warm start from): torch.compile's and its autotuning's timers, then each timed
    compile route (`_warm_timed`), each route at most what step 1 of the explained run `A` (named `aname`) spent
    in it where that run compiled there too. cuDNN's benchmark mode (run `R`, named `rname`) is not timed apart:
    it goes to `notes`."""
    comps = []
    w1 = windows(W).get("step1", {})
    cw = compile_seconds(w1)
    at = autotune_seconds(w1)
    if cw:
        comps.append(_component(
            "runtime_compilation_warm", "framework compilation with warm caches (tracing, guards, cache loads)",
            cw - at, f"torch.compile timers ({wname})",
            [f"torch.compile's outermost timer in {wname} step 1: {cw:.3f} s (keys: "
             f"{', '.join(sorted(w1.get('compile_s', {}))[:6])})"]))
    if at:
        comps.append(_component("autotuning_warm", "benchmark-based autotuning (warm caches)", at,
                                f"torch.compile timers ({wname})",
                                [f"autotuning timers in {wname} step 1: {at:.3f} s"]))
    # a route that compiles in every run (Numba without a disk cache) counts no more than the explained step
    # spent in it: its compile varies between runs by more than the differences between runs measure
    own = {t[0]: t[2] for t in _warm_timed(runs, A, aname, windows(A).get("step1", {}))} if A is not W else {}
    for cause, label, sec, how, tev in _warm_timed(runs, W, wname, windows(W).get("step1", {})):
        if cause in own and 0 <= own[cause] < sec:
            tev = tev + [f"the {aname} run's step 1 spent {own[cause] * 1e3:.1f} ms in it (it compiled there as "
                         f"well): counted at that, the {wname} run's {sec * 1e3:.1f} ms being the compile's "
                         "variation between runs"]
            sec = own[cause]
        comps.append(_component(cause, label, sec, how, tev))
    if R.get("cudnn_benchmark"):
        notes.append("torch.backends.cudnn.benchmark was on: cuDNN times candidate engines at each new "
                     "shape (benchmark-based autotuning, not timed apart here)")
    return comps


def _heuristics_components(R: dict, rname: str, C: dict | None, E: dict | None, notes: list[str]) -> list[dict]:
    """cuBLASLt heuristic misses in step 1 of run `R`: its new problems × the miss time, which the host time per
    steady step of the nocache run `E` over the preinit run `C` measures (`miss_time`). Without that time the
    misses are not counted and their evidence goes to `notes`; a miss time the two runs' steady steps cannot tell
    from their own variation counts 0 and says so (never a negative time per call)."""
    newp, lines1 = new_problems(R, "step1")
    if not (lines1 or newp):
        return []
    ev = [f"{rname} step 1: {lines1} cuBLASLt matmul calls in the level-2 log, {newp} distinct problems not "
          "seen earlier in the process (each a heuristics-cache miss)"]
    m = miss_time(C, E)
    if m is None:
        ev.append("no miss time measured (needs the preinit and nocache runs): not counted")
        notes.extend(ev)
        return []
    how = (f"host time per steady step with the cache off {_ms(m['off_s'])} vs on {_ms(m['on_s'])}, "
           f"{m['calls']:g} calls per step; the steady steps of those runs vary by {m['noise_s'] * 1e6:.0f} µs")
    if m["within_noise"]:
        ev.append(f"miss time not resolved: {how}, and the difference ({m['measured_s'] * 1e6:+.0f} µs per call) is "
                  "within that: counted 0 (a miss costs less than the runs' noise per step)")
        return [_component("heuristics", "cuBLASLt heuristic selection (cache misses)", 0.0, "misses × miss time",
                           ev)]
    ev.append(f"miss time {m['measured_s'] * 1e6:.0f} µs per call: {how}")
    return [_component("heuristics", "cuBLASLt heuristic selection (cache misses)", newp * m["measured_s"],
                       "misses × miss time", ev)]


def iqr(values: list[float]) -> float:
    """The interquartile range of a few values (0 for fewer than two)."""
    if len(values) < 2:
        return 0.0
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[2] - q[0]


def miss_time(C: dict | None, E: dict | None) -> dict | None:
    """The host time of one heuristics-cache miss: (steady host time per step of the nocache run `E` − that of the
    preinit run `C`) / matmul calls per step; None without both runs or a logged call. ``noise_s`` is the larger
    spread (max − min) of the two runs' steady host times per step: a difference no larger (or below zero) is
    ``within_noise``, as it is where a step makes one or two cheap calls (CuPy's fp32 GEMM: a miss of ~15 µs in a
    step whose host time varies by more between processes). The spread is the interquartile range, so one slow
    step (a collection, a page fault) does not widen it: the medians compared ignore it too."""
    if not (usable(C) and usable(E)):
        return None
    calls = lt_calls_per_step(C)
    hc, he = steady(step_hosts(C)), steady(step_hosts(E))
    if not calls or hc is None or he is None:
        return None
    noise = max(iqr(step_hosts(X)[2:]) for X in (C, E))
    return {"measured_s": (he - hc) / calls, "off_s": he, "on_s": hc, "calls": calls, "noise_s": noise,
            "within_noise": he - hc <= noise}


def _allocator_components(R: dict, rname: str) -> list[dict]:
    """Allocator growth in step 1 of run `R`: the time CUPTI saw in the driver's allocation calls, with how much
    torch's reserved memory grew; none when step 1 neither allocated nor grew."""
    r1 = windows(R).get("step1", {})
    asec, acount = driver_seconds(R, "step1", "alloc")
    mb, ma = (r1.get("mem_before") or {}), (r1.get("mem_after") or {})
    grow = ma.get("reserved_bytes.all.current", 0) - mb.get("reserved_bytes.all.current", 0)
    if not (acount or grow):
        return []
    return [_component(
        "allocator", "allocator growth", asec, f"CUPTI driver allocation calls ({rname})",
        [f"{rname} step 1: {acount} allocation calls in the driver taking {asec * 1e3:.1f} ms; torch's reserved "
         f"memory grew by {grow / 2**20:.1f} MiB "
         f"({ma.get('num_device_alloc', 0) - mb.get('num_device_alloc', 0)} cudaMalloc)"])]


def _cold_timed(runs: dict, a1: dict, b1: dict) -> list[tuple]:
    """(cause, label, seconds, how, evidence) for each timed compile route of the cold run's step 1: its timer
    cold − warm (what the warm caches spared it)."""
    out = []
    ms = lambda x: f"{x * 1e3:.1f} ms"
    if jit_calls(a1, "cupy.compile"):
        c, w = jit_seconds(a1, "cupy.compile"), jit_seconds(b1, "cupy.compile")
        out.append(("nvrtc_cupy", "NVRTC (CuPy), cold cache", c - w, "CuPy compile timer (cold − warm)",
                    [f"CuPy's cached compile in step 1: {ms(c)} cold ({jit_calls(a1, 'cupy.nvrtc')} NVRTC compiles, "
                     f"{ms(jit_seconds(a1, 'cupy.nvrtc'))}), {ms(w)} warm ({jit_calls(b1, 'cupy.nvrtc')} NVRTC "
                     f"compiles); CUPY_CACHE_DIR got {new_files(a1, 'CUPY_CACHE_DIR').get('count', 0)} files"]))
    if jit_calls(a1, "triton.run") and "triton-direct" in jit_mechanisms(a1):
        c, w = jit_seconds(a1, "triton.run"), jit_seconds(b1, "triton.run")
        out.append(("triton_direct", "Triton JIT (direct), cold cache", c - w, "JITFunction.run timer (cold − warm)",
                    [f"inside JITFunction.run in step 1: {ms(c)} cold ({jit_calls(a1, 'triton.run')} launches; "
                     f"compile {ms(jit_seconds(a1, 'triton.compile.direct'))}, C modules built "
                     f"{jit_calls(a1, 'triton.build')} in {ms(jit_seconds(a1, 'triton.build'))}), {ms(w)} warm "
                     f"(compile {ms(jit_seconds(b1, 'triton.compile.direct'))}, "
                     f"built {jit_calls(b1, 'triton.build')})"]))
    if "numba" in jit_mechanisms(a1):
        c, w = jit_seconds(a1, "numba.compile"), jit_seconds(b1, "numba.compile")
        out.append(("numba", "Numba, cold caches", c - w, "Numba compile timer (cold − warm)",
                    [f"Numba's compile in step 1: {ms(c)} cold, {ms(w)} warm (NVVM {ms(jit_seconds(a1, 'numba.nvvm'))}"
                     f" / {ms(jit_seconds(b1, 'numba.nvvm'))}, link {ms(jit_seconds(a1, 'numba.link'))} / "
                     f"{ms(jit_seconds(b1, 'numba.link'))})"]))
    if jit_seconds(a1, JAX_BACKEND):
        c, w = xla_seconds(a1), xla_seconds(b1)
        d = c - w
        tune = xla_autotune_seconds(runs) if not xla_candidates_timed(b1) else None
        ev = [f"JAX's compile events in step 1: {ms(c)} cold (backend {ms(jit_seconds(a1, JAX_BACKEND))}, "
              f"{xla_candidates_timed(a1)} autotuning candidates timed), {ms(w)} warm (backend "
              f"{ms(jit_seconds(b1, JAX_BACKEND))}, {xla_hits(b1)} executables from JAX's persistent cache, "
              f"{xla_candidates_timed(b1)} candidates timed)"]
        if tune is not None:
            t = min(max(tune, 0.0), max(d, 0.0))
            out.append(("xla_autotuning", "XLA GEMM autotuning, cold cache", t,
                        "backend compile: cold − noautotune", _xla_tune_evidence(runs, tune)))
            d -= t
        out.append(("xla_compile", "XLA compile, cold cache", d, "JAX compile events (cold − warm)", ev))
    return out


def _xla_tune_evidence(runs: dict, tune: float) -> list[str]:
    N = runs.get("noautotune") or {}
    A = compile_run(runs) or {}
    got = xla_autotuned(A)
    return [f"XLA backend compile in step 1: {jit_seconds(windows(A).get('step1'), JAX_BACKEND) * 1e3:.1f} ms with "
            f"autotuning, {jit_seconds(windows(N).get('step1'), JAX_BACKEND) * 1e3:.1f} ms with "
            f"--xla_gpu_autotune_level=0 (noautotune run): {tune * 1e3:+.1f} ms",
            f"the cold run's autotuning dumps: {got['results']} autotuned instructions, {got['timed']} candidates "
            f"timed ({', '.join(f'{k} {v}' for k, v in sorted(got['kinds'].items())) or 'kinds not listed'})"]


def _warm_timed(runs: dict, R: dict, rname: str, r1: dict) -> list[tuple]:
    """(cause, label, seconds, how, evidence) for the compile routes' own work in step 1 of run R (warm caches):
    cache lookups and loads, or compiles no cache serves (Numba, XLA under its cache threshold)."""
    out = []
    ms = lambda x: f"{x * 1e3:.1f} ms"
    if jit_calls(r1, "cupy.compile"):
        nv = jit_calls(r1, "cupy.nvrtc")
        out.append(("nvrtc_cupy_warm", "NVRTC (CuPy), " + ("compiled again (not cached)" if nv else
                                                            "warm cache: lookup and module load"),
                    jit_seconds(r1, "cupy.compile"), f"CuPy compile timer ({rname})",
                    [f"{rname} step 1: {jit_calls(r1, 'cupy.compile')} cached-compile calls, {nv} NVRTC compiles, "
                     f"{ms(jit_seconds(r1, 'cupy.compile'))}"]))
    if jit_calls(r1, "triton.run"):
        extra, each = triton_direct_warm(R, r1)
        out.append(("triton_direct_warm", "Triton JIT (direct), warm cache: specialisation, cache lookup, "
                    "launcher and module load", extra, f"JITFunction.run timer ({rname})",
                    [f"{rname} step 1: {ms(jit_seconds(r1, 'triton.run'))} inside JITFunction.run for "
                     f"{jit_calls(r1, 'triton.run')} launches, {each * 1e6:.0f} µs per launch in steps 3…N; "
                     f"compile from cache {ms(jit_seconds(r1, 'triton.compile.direct'))}, module and launcher load "
                     f"{ms(jit_seconds(r1, 'triton.load.direct'))}"]))
    if jit_calls(r1, "numba.compile"):
        nvvm = jit_calls(r1, "numba.nvvm")
        out.append(("numba_warm", "Numba, " + ("compiled again (no disk cache)" if nvvm else "cache load"),
                    jit_seconds(r1, "numba.compile"), f"Numba compile timer ({rname})",
                    [f"{rname} step 1: {jit_calls(r1, 'numba.compile')} compile calls, "
                     f"{ms(jit_seconds(r1, 'numba.compile'))}"
                     f" (NVVM {nvvm} calls, {ms(jit_seconds(r1, 'numba.nvvm'))}; link "
                     f"{ms(jit_seconds(r1, 'numba.link'))})"]))
    if jit_seconds(r1, JAX_BACKEND) or jit_seconds(r1, *JAX_TRACE):
        x = xla_seconds(r1)
        ev = [f"{rname} step 1: tracing and lowering {ms(jit_seconds(r1, *JAX_TRACE))}, backend compile "
              f"{ms(jit_seconds(r1, JAX_BACKEND))} ({xla_hits(r1)} executables from JAX's persistent cache, "
              f"{xla_candidates_timed(r1)} autotuning candidates timed)"]
        if xla_compiled(r1):
            tune = xla_autotune_seconds(runs) if xla_candidates_timed(r1) else None
            t = min(max(tune or 0.0, 0.0), x)
            if tune is not None:
                out.append(("xla_autotuning_warm", "XLA GEMM autotuning (compiled again, not cached)", t,
                            "backend compile: cold − noautotune", _xla_tune_evidence(runs, tune)))
            out.append(("xla_compile_warm", "XLA compile (compiled again: the executable was not cached)", x - t,
                        f"JAX compile events ({rname})",
                        ev + ["JAX's persistent cache did not serve the executable (a compile under "
                              "jax_persistent_cache_min_compile_time_secs is not written; XLA flags that differ "
                              "change its key)"]))
        else:
            out.append(("xla_warm", "XLA, warm cache: tracing, lowering, cache load", x,
                        f"JAX compile events ({rname})", ev))
    return out


def cache_states(runs: dict) -> list[dict]:
    """Per run: which isolated caches held files before it (warm) and which it wrote to, as one line each.
    Runs saved before the per-cache counts were kept say only whether the ComputeCache and the framework
    caches were warm."""
    out = []
    for name, r in runs.items():
        env = r.get("env") or {}
        before = env.get("caches_before")
        written = {v: int((c or {}).get("count", 0)) for v, c in (r.get("cache_written") or {}).items()}
        wrote = ", ".join(f"{_CACHE_NAME.get(v, v)} {n}" for v, n in written.items() if n) or "nothing"
        if before is None:
            warm = [lbl for lbl, key in (("ComputeCache", "compute_cache_warm"),
                                         ("framework caches", "framework_cache_warm")) if env.get(key)]
            line = (f"{' and '.join(warm)} warm" if warm else "all empty") + f" → wrote {wrote}"
        else:
            warm = [f"{_CACHE_NAME.get(v, v)} {n}" for v, n in before.items() if n]
            line = (f"held {', '.join(warm)}" if warm else "all empty") + f" → wrote {wrote}"
        out.append({"run": name, "before": before, "written": written, "line": line})
    return out


_CACHE_NAME = {"CUDA_CACHE_PATH": "ComputeCache", "TORCHINDUCTOR_CACHE_DIR": "Inductor", "TRITON_CACHE_DIR": "Triton",
               "PYTORCH_KERNEL_CACHE_PATH": "torch kernels", "CUPY_CACHE_DIR": "CuPy",
               "TORCH_EXTENSIONS_DIR": "torch extensions", "NUMBA_CACHE_DIR": "Numba",
               "JAX_COMPILATION_CACHE_DIR": "JAX"}


def overhead(runs: dict) -> tuple[float, float]:
    """(wall time of all runs, the part outside the program's own windows: setup, factory, steps)."""
    total = sum(float(r.get("wall_s") or 0.0) for r in runs.values())
    own = sum(w["wall_s"] for r in runs.values() for w in r.get("windows", []) if w["name"] != "preinit")
    return total, total - own


def first_line(text: str) -> str:
    """The first non-blank line of an error (a CUDA error's own sentence, not torch's advice after it)."""
    for line in (text or "").splitlines():
        if line.strip() and not line.startswith("Traceback"):
            return line.strip()[:300]
    return ""


def _window_error(run: dict) -> str:
    return next((w["error"] for w in run.get("windows", []) if w.get("error")), "")


def _what_if(runs: dict) -> list[str]:
    out = []
    nj = runs.get("nojit")
    if nj:
        if usable(nj) and (nj.get("env") or {}).get("compute_cache_warm"):
            out.append(f"with CUDA_DISABLE_PTX_JIT=1 the program ran (step 1 {_ms(step_walls(nj)[0])}), but with a "
                       "warm ComputeCache, which serves JIT output compiled earlier: not a test of the need for JIT")
        elif usable(nj):
            out.append(f"with CUDA_DISABLE_PTX_JIT=1 and an empty ComputeCache the program ran (step 1 "
                       f"{_ms(step_walls(nj)[0])}): it needs no PTX JIT")
        else:
            out.append(f"with CUDA_DISABLE_PTX_JIT=1 and an empty ComputeCache the program failed: it needs PTX "
                       f"JIT ({first_line(nj.get('error') or '')})")
    fj = forced_jit({"runs": runs})
    if fj and fj["ran"]:
        F = runs["forcejit"]
        line = f"with CUDA_FORCE_PTX_JIT=1 and an empty ComputeCache: step 1 {_ms(step_walls(F)[0])}"
        if fj["seconds"] is not None:
            line += f", {_ms(fj['seconds'])} more than the warm run's: what PTX JIT of every kernel would cost"
        line += "; PTX JIT " + ("seen: " + "; ".join(fj["evidence"]) if fj["detected"] else "not seen")
        out.append(line)
    elif fj:
        out.append(f"with CUDA_FORCE_PTX_JIT=1 the program failed: some of its kernels carry no PTX this GPU "
                   f"can JIT-compile, or the JIT failed ({fj['error']})")
    return out


def forced_jit_seconds(result: dict) -> float | None:
    """What PTX JIT costs when forced: step 1 with CUDA_FORCE_PTX_JIT=1 (empty ComputeCache) − step 1 of the
    warm run (None without both). Not forcejit − forcejit_warm: measured on the H200, a warm ComputeCache does
    not serve forced JIT (the forced warm run JIT-compiled again and wrote nothing)."""
    runs = result.get("runs") or {}
    F, W = runs.get("forcejit"), runs.get("warm")
    if usable(F) and usable(W):
        return step_walls(F)[0] - step_walls(W)[0]
    return None


def forced_jit(result: dict) -> dict | None:
    """The forced runs: was PTX JIT seen, what did it cost (None without a forcejit run)."""
    runs = result.get("runs") or {}
    F = runs.get("forcejit")
    if not F:
        return None
    if not usable(F):
        return {"ran": False, "detected": False, "seconds": None, "error": first_line(F.get("error") or
                                                                                     _window_error(F))}
    w1 = windows(F).get("step1", {})
    cc = new_files(w1, "CUDA_CACHE_PATH")
    loads = [c for c in ptx_loads(F) if c["window"] == "step1" and not c.get("rc")]
    jitc = [lib for lib in w1.get("new_libraries") or [] if lib.startswith("libnvidia-ptxjitcompiler")]
    ev = []
    if cc.get("bytes"):
        ev.append(f"the forced run's step 1 wrote {cc['count']} ComputeCache files ({cc['bytes'] / 1024:.0f} KiB)")
    if loads:
        ev.append(f"{len(loads)} loader calls were handed PTX in step 1: {sum(c['seconds'] for c in loads) * 1e3:.1f} "
                  "ms in those calls")
    if jitc:
        ev.append(f"{jitc[0]} was loaded during step 1")
    Fw = runs.get("forcejit_warm")
    if usable(Fw):
        ev.append(f"with its ComputeCache warm the forced run's step 1 took {_ms(step_walls(Fw)[0])} and wrote "
                  f"{compute_cache_written(Fw)} files: the cache did not spare the JIT")
    return {"ran": True, "detected": bool(cc.get("bytes") or loads or jitc), "seconds": forced_jit_seconds(result),
            "evidence": ev}


def _device(runs: dict) -> dict:
    for r in runs.values():
        if r.get("device"):
            return r["device"]
    return {}


def _share(sec: float, ex: float) -> str:
    """A cause's share of the excess; beyond 100 % (a cause measured in other runs larger than the excess: the runs
    disagree, `analyse_round` says so) it is shown as such, not as a number of thousands of percent."""
    if ex <= 0:
        return "    n/a"
    return "  >100%" if sec > ex else f"{100 * sec / ex:6.1f}%"


def _range(sp: dict | None) -> str:
    """A figure's spread over the rounds, in ms ("" without rounds)."""
    return f"{sp['min'] * 1e3:.1f}–{sp['max'] * 1e3:.1f}" if sp else ""


def _unexplained_line(a: dict, rounds: bool = False) -> str:
    """The table's last line: what no cause explains, or, where the measured causes add up to more than the
    excess (each is measured in its own runs, and the runs vary), by how much they over-explain it; with rounds,
    the noise it is compared with (`combine_rounds`)."""
    u, pct = a["unexplained_s"], a.get("unexplained_pct")
    label = "unexplained" if u >= 0 else "causes beyond the excess (noise between the runs)"
    share = ("  >100%" if abs(pct) > 100 else f"{abs(pct):6.1f}%") if pct is not None else "    n/a"
    if not rounds:
        return f"  {label:<72} {abs(u) * 1e3:10.1f} {share}"
    noise = (f"within noise (the excess and the rounds' unexplained vary by {a['noise_s'] * 1e3:.1f} ms)"
             if a.get("unexplained_within_noise") else f"beyond the noise ({a['noise_s'] * 1e3:.1f} ms)")
    return f"  {label:<72} {abs(u) * 1e3:10.1f} {'':>15} {share}  {noise}"


def render(a: dict) -> str:
    dev = a.get("device") or {}
    rounds = (a.get("rounds") or {}).get("n", 1) >= 2
    per = (f", {a['rounds']['n']} rounds: each run the median of its environment's runs by step 1, each figure's "
           "spread min–max over the rounds" if rounds else "")
    lines = [f"cold start of {a.get('label')} on {dev.get('gpu', '?')} (torch {dev.get('torch', '?')}, CUDA "
             f"{dev.get('cuda', '?')}), {a.get('steps')} steps per run{per}"]
    b = a.get("binding") or {}
    if b.get("sha256"):
        lines.append(f"program {b.get('file')} (sha256 {str(b['sha256'])[:12]}…); "
                     + ", ".join(f"{k} {v}" for k, v in (b.get("versions") or {}).items()))
    lines += [f"note: {n}" for n in a.get("notes") or []] + [""]
    lines.append(f"  {'run':<14} {'environment':<48} {'step 1':>11} {'step 2':>10} {'steady':>10} {'run wall':>9}"
                 + (f" {'step 1 spread ms':>17} {'runs':>4} round" if rounds else ""))
    for t in a["table"]:
        lines.append(f"  {t['run']:<14} {t['env'][:48]:<48} {_ms(t['step1_s']):>11} {_ms(t['step2_s']):>10} "
                     f"{_ms(t['steady_s']):>10} {t['wall_s'] or 0:8.1f}s"
                     + (f" {_range((t.get('spread') or {}).get('step1_s')):>17} {t.get('rounds', 1):>4} "
                        f"{t.get('round', 1):>5}" if rounds else "") + ("" if t["ok"] else "  FAILED"))
        if t.get("error"):
            lines.append(f"      {' '.join(t['error'].split())[-160:]}")
    lines.append("")
    if a.get("baseline") is None:
        lines.append(a.get("verdict", ""))
        return "\n".join(lines)
    ex = a["excess_s"]
    fig = (a.get("rounds") or {}).get("figures") or {}
    lines.append(f"step 1 of the {a['baseline']} run: {_ms(a['step1_s'])} = steady {_ms(a['steady_s'])} + excess "
                 f"{_ms(ex)} (step 2: {_ms(a['step2_s'])})"
                 + (f"; over the rounds step 1 {_range(fig['step1_s'])} ms, excess {_range(fig['excess_s'])} ms"
                    if rounds else ""))
    lines.append(f"  {'cause':<72} {'ms':>10} " + (f"{'spread ms':>15} " if rounds else "") + f"{'share':>7}  how")
    for c in sorted(a["components"], key=lambda c: -c["seconds"]):
        share = _share(c["seconds"], ex)
        mid = f"{_range(c.get('spread')):>15} " if rounds else ""
        flag = "within noise; " if c.get("within_noise") else ""
        lines.append(f"  {c['label']:<72} {c['seconds'] * 1e3:10.1f} {mid}{share}  {flag}{c['how']}")
    lines.append(_unexplained_line(a, rounds))
    lines += ["", "evidence:"]
    for c in a["components"]:
        for e in c["evidence"]:
            lines.append(f"  - [{c['cause']}] {e}")
    for e in a.get("evidence", []):
        lines.append(f"  - {e}")
    comp = a["compilation"]
    for m, evs in comp["mechanisms"].items():
        for e in evs:
            lines.append(f"  - [{m}] {e}")
    for e in comp.get("hints", []):
        lines.append(f"  - [hint] {e}")
    if a.get("overhead_s") is not None:
        lines.append(f"  - the runs took {a['runs_wall_s']:.1f} s in all, of which {a['overhead_s']:.1f} s outside "
                     f"the program's own setup and steps ({a['import_s']:.1f} s importing torch, the rest process "
                     "start, CUPTI and evidence)")
    if a.get("caches"):
        lines += ["", "caches (files before the run → files the run wrote):"]
        for c in a["caches"]:
            lines.append(f"  - {c['run']}: {c['line']}")
    if a.get("kernels"):
        k = a["kernels"]
        lines += ["", f"kernels seen made at run time ({len(k)}):"]
        for name, v in sorted(k.items(), key=lambda kv: (kv[1]["provenance"], kv[0]))[:12]:
            lines.append(f"  - {name}: {v['provenance']} ({_MECH_LABEL.get(v['mechanism'], v['mechanism'])}, "
                         f"evidence {v['evidence']}) — {v['how']}")
        if len(k) > 12:
            lines.append(f"  - … and {len(k) - 12} more (`--format json`: kernels)")
    if a.get("what_if"):
        lines += ["", "what-ifs:"] + [f"  - {w}" for w in a["what_if"]]
    lines += ["", f"verdict: {comp['verdict']}"]
    return "\n".join(lines)


# --- provenance (CPU) ------------------------------------------------------------------------------------------------


# libraries that ship their kernels compiled: a module whose load call one of them made holds its own kernel
# (cuDNN's runtime-compiled engines, which load what NVRTC made for them, are not among them)
SHIPPING_LIBRARIES = ("libcublas", "libcudnn_engines_precompiled", "libcudnn_ops", "libcudnn_cnn", "libcudnn_adv",
                      "libcufft", "libcusparse", "libcusolver", "libcurand", "libnccl", "libcudart", "libnvjpeg",
                      "libnpp", "libtorch_cuda", "libc10_cuda")


def shipped_by(m: dict) -> str | None:
    """The library whose own kernel a module holds (the shared object that made its load call is one of
    `SHIPPING_LIBRARIES`), or None: a module made by whoever else called the driver (a compiler loading what it
    made), or recorded before the caller was kept."""
    caller = m.get("caller") or ""
    return caller if caller.startswith(SHIPPING_LIBRARIES) else None


def observed_provenance(result: dict) -> dict[str, dict]:
    """Kernel name (or ``module:<id>`` where the module's kernels are not known) -> what the process was seen
    doing to produce it: ``{"provenance": "runtime-compiled" | "autotuned", "mechanism": ..., "evidence":
    "observed", "how": ...}``. Mechanisms: ``triton`` (Triton via torch.compile), ``triton-direct``,
    ``triton-jit`` (Triton, caller not observed) from the cubins Triton wrote; ``ptx-jit`` from modules loaded from
    PTX text; ``nvrtc-cupy``, ``numba``, ``xla`` from modules loaded inside those routes' timed compile calls.
    A kernel XLA loaded in several candidate modules during one compile, in a window whose autotuning log timed
    candidates, is ``autotuned``. A module whose load call a library that ships its kernels made (`shipped_by`:
    cuBLASLt unpacking its own kernels while XLA's autotuner runs them) was loaded, not compiled: it is
    ``autotuned`` when XLA timed candidates in that window, else left out. Runs with CUDA_FORCE_PTX_JIT=1 are
    what-ifs and are left out."""
    out: dict[str, dict] = {}
    for name, r in (result.get("runs") or {}).items():
        if str((r.get("env") or {}).get("CUDA_FORCE_PTX_JIT")) == "1":
            continue
        route = triton_route(r)
        for w in _step_windows(r):
            for k in w.get("triton_kernels") or []:
                out.setdefault(k, {"provenance": "runtime-compiled", "mechanism": route, "evidence": "observed",
                                   "how": f"Triton wrote {k}.cubin to its cache during {w['name']} of the {name} run "
                                          f"({_MECH_LABEL[route]})"})
        wins = windows(r)
        for wname, g in (r.get("modules") or {}).items():
            recs = g.get("records", [])
            owners = {id(m): span_owner(wins.get(wname), m.get("load_t_ms", m.get("t_ms", -1.0)))
                      if m.get("loaded_by") else None for m in recs}
            copies: dict[str, int] = {}
            for m in recs:
                if owners[id(m)] == "xla":
                    for k in m.get("kernels") or []:
                        copies[k] = copies.get(k, 0) + 1
            timed = xla_candidates_timed(wins.get(wname))
            for m in recs:
                if m.get("image") == "ptx":
                    how = (f"module {m['id']} was loaded from PTX text by {m.get('loaded_by', 'a loader')} during "
                           f"{wname} of the {name} run (the driver JIT-compiled it)")
                    for k in m.get("kernels") or [f"module:{m['id']}"]:
                        out.setdefault(k, {"provenance": "runtime-compiled", "mechanism": "ptx-jit",
                                           "evidence": "observed", "how": how})
                    continue
                owner = owners[id(m)]
                if owner is None:  # (a module without kernel names, as EAGER runs record them, names nothing)
                    continue
                if shipped_by(m):  # a library's own kernel, loaded (lazily) while the compiler ran
                    if owner == "xla" and timed:
                        for k in m.get("kernels") or []:
                            if k in out and out[k]["provenance"] == AUTOTUNED:
                                continue
                            out[k] = {"provenance": AUTOTUNED, "mechanism": owner, "evidence": "observed",
                                      "how": f"a kernel {m['caller']} ships, which it loaded (not compiled) during "
                                             f"XLA's compile in {wname} of the {name} run while XLA timed {timed} "
                                             "candidates (its autotuning log): chosen by timing"}
                    continue
                for k in m.get("kernels") or []:
                    how = (f"module {m['id']} was loaded by {m['loaded_by']} inside {_MECH_LABEL.get(owner, owner)}'s "
                           f"compile during {wname} of the {name} run")
                    prov = "runtime-compiled"
                    if owner == "xla" and copies.get(k, 0) > 1 and timed:
                        prov = AUTOTUNED
                        how = (f"XLA compiled and loaded {copies[k]} candidate modules of {k} during {wname} of the "
                               f"{name} run and timed {timed} candidates (its autotuning log): chosen by timing")
                    prev = out.get(k)
                    if prev is None or (prov == AUTOTUNED and prev["provenance"] != AUTOTUNED):
                        out[k] = {"provenance": prov, "mechanism": owner, "evidence": "observed", "how": how}
    return out


class NotThisRun(ProbeError):
    """A saved cold start of another program or GPU than the run it was given with."""


class _Bad(Exception):
    """A value of a saved cold start that `cold-start --save` cannot have written: its field and why."""

    def __init__(self, field: str, why: str):
        super().__init__(f"{field} {why}")
        self.field, self.why = field, why


def _num(v, field: str, *, integer: bool = False, within: tuple[float, str] | None = None) -> None:
    """`v` is a finite number ≥ 0 (whole where `integer`), and at most `within` (seconds, what they are) plus a
    millisecond: a timer inside a window cannot run longer than the window."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise _Bad(field, f"is {v!r}, not a number")
    if not math.isfinite(v):
        raise _Bad(field, f"is {v}, not a finite number")
    if v < 0:
        raise _Bad(field, f"is {v}, below zero")
    if integer and v != int(v):
        raise _Bad(field, f"is {v}, not a whole number")
    if within is not None and v > within[0] + 1e-3:
        raise _Bad(field, f"is {v} s, longer than {within[1]} ({within[0]:.6f} s)")


def _counters(obj, field: str, keys: tuple[str, ...] | None = None) -> None:
    """A counter record (absent, or an object): its values (or only `keys` of it, where present) numbers, finite
    and ≥ 0 (`_num`)."""
    if obj is None:
        return
    if not isinstance(obj, dict):
        raise _Bad(field, f"is {obj!r}, not a record of counters")
    for k, v in obj.items():
        if keys is None or k in keys:
            _num(v, f"{field}[{k}]")


def check_run(r: dict) -> None:
    """A saved run's values by type and physical sense (raises `_Bad` on the first that fails): the run's wall
    time; each window's name, wall and host time (host ≤ wall); the timers inside a window (torch.compile's, the
    compile routes', the driver's calls) no longer than it; calls and counts whole numbers; the preinit items'
    seconds (or their failure text); the counters the analysis reads (process accounting, allocator counters,
    files and modules counted). Every number finite and ≥ 0."""
    if r.get("wall_s") is not None:
        _num(r["wall_s"], "wall_s")
    ws = r.get("windows", [])
    if not isinstance(ws, list):
        raise _Bad("windows", "is not a list of windows")
    walls = {}
    for i, w in enumerate(ws):
        if not isinstance(w, dict) or not isinstance(w.get("name"), str):
            raise _Bad(f"windows[{i}]", "is not a window with a name")
        f = f"windows[{i}] ({w['name']})"
        _num(w.get("wall_s"), f"{f}.wall_s")
        wall = (w["wall_s"], f"the {w['name']} window")
        walls[w["name"]] = wall
        if w.get("host_s") is not None:
            _num(w["host_s"], f"{f}.host_s", within=wall)
        for k, v in (w.get("compile_s") or {}).items():
            _num(v, f"{f}.compile_s[{k}]", within=wall)
        for k, v in (w.get("jit_s") or {}).items():
            if not isinstance(v, dict):
                raise _Bad(f"{f}.jit_s[{k}]", f"is {v!r}, not a timer record")
            # JAX reports the compile time its cache saved (not spent in the window): no bound
            _num(v.get("s", 0.0), f"{f}.jit_s[{k}].s", within=None if "saved" in k else wall)
            _num(v.get("n", 0), f"{f}.jit_s[{k}].n", integer=True)
        for part in ("process", "mem_before", "mem_after"):
            _counters(w.get(part), f"{f}.{part}")
        for var, c in (w.get("new_files") or {}).items():
            _counters(c, f"{f}.new_files[{var}]", ("count", "bytes"))
    for var, c in (r.get("cache_written") or {}).items():
        _counters(c, f"cache_written[{var}]", ("count", "bytes"))
    for wn, g in (r.get("modules") or {}).items():
        for k in ("count", "bytes"):
            if k in (g or {}):
                _num(g[k], f"modules[{wn}].{k}", integer=True)
    for k, v in (r.get("lt_counts") or {}).items():
        _num(v, f"lt_counts[{k}]", integer=True)
    for wn, g in (r.get("driver_calls") or {}).items():
        for what, x in ((g or {}).get("by_what") or {}).items():
            _num((x or {}).get("seconds", 0.0), f"driver_calls[{wn}].by_what[{what}].seconds", within=walls.get(wn))
            _num((x or {}).get("count", 0), f"driver_calls[{wn}].by_what[{what}].count", integer=True)
    for k, v in (r.get("preinit") or {}).items():
        if not isinstance(v, str):
            _num(v, f"preinit[{k}]", within=walls.get("preinit"))


def _checked_runs(path: str, runs: dict, where: str, notes: list[str]) -> dict:
    """`runs` less those with a damaged value (`check_run`), each skipped with a note naming the file, the run
    and the field."""
    kept = {}
    for name, r in runs.items():
        try:
            check_run(r)
            kept[name] = r
        except _Bad as e:
            notes.append(f"{path}: run {name}{where} skipped: {e.field} {e.why} (a value `cold-start --save` "
                         "does not write); the breakdown uses the other runs")
        except (TypeError, AttributeError, ValueError) as e:
            notes.append(f"{path}: run {name}{where} skipped: a value of another type than `cold-start --save` "
                         f"writes ({type(e).__name__}: {str(e)[:80]}); the breakdown uses the other runs")
    return kept


def load(path: str) -> dict:
    """A saved cold-start result (`--save`), checked before anything reads it: its shape; ``steps``, ``repeat``
    whole numbers in range (else one line naming the file, the field and what to give); each run's values by type
    and physical sense (`check_run`): a damaged run is skipped and ``load_notes`` says which and why, a file whose
    every run of round 1 is damaged is refused; then an analysis of what is left, whose errors on a value of the
    wrong type are the file's."""
    give = "give an unedited file written by `cold-start --save`"
    try:
        with open_text(path) as f:
            obj = json.load(f)
    except (OSError, ValueError) as e:
        raise ProbeError(f"cannot read {path}: {e}; give a file written by `cold-start --save`") from e
    except RecursionError:
        raise ProbeError(f"cannot read {path}: values nested too deeply to be a cold-start result; give a file "
                         "written by `cold-start --save`") from None
    if not isinstance(obj, dict) or "runs" not in obj:
        raise ProbeError(f"{path}: not a cold-start result (no 'runs'); give a file written by `cold-start --save`")
    runs = obj["runs"]
    if not isinstance(runs, dict) or not all(isinstance(r, dict) for r in runs.values()):
        raise ProbeError(f"{path}: not a cold-start result ('runs' is not an object of runs by name); give a file "
                         "written by `cold-start --save`")
    for key, low in (("steps", 3), ("repeat", 1)):
        v = obj.get(key)
        if v is None and key == "repeat":
            continue
        try:
            _num(v, key, integer=True)
            if v < low:
                raise _Bad(key, f"is {v}, fewer than {low}")
        except _Bad as e:
            raise ProbeError(f"{path}: {e.field} {e.why} ({'steps per run' if key == 'steps' else 'rounds'}: "
                             f"{low} or more); {give}") from None
    reps = obj.get("repeats")
    if reps is not None and not (isinstance(reps, list) and all(isinstance(x, dict) for x in reps)
                                 and all(isinstance(r, dict) for x in reps for r in x.values())):
        raise ProbeError(f"{path}: 'repeats' is not a list of rounds (runs by name); {give}")
    notes: list[str] = []
    obj["runs"] = _checked_runs(path, runs, "", notes)
    if runs and not obj["runs"]:
        raise ProbeError(f"{path}: every run has a damaged value ({notes[0].split(' skipped: ', 1)[1]}); {give}")
    if reps:
        obj["repeats"] = [_checked_runs(path, x, f" (round {k})", notes) for k, x in enumerate(reps, 2)]
    obj["load_notes"] = notes
    # what the analysis reads, read once here: a value of another type than `cold-start --save` writes (an edited
    # or damaged file) is this file's error, not the analysis'
    try:
        if obj["runs"]:
            analyse(obj)
        observed_provenance(obj)
    except (TypeError, AttributeError, KeyError, ValueError, IndexError, ZeroDivisionError) as e:
        raise ProbeError(f"{path}: a value in it is not one `cold-start --save` writes ({type(e).__name__}: "
                         f"{str(e)[:120]}); {give}") from None
    return obj


def _stem(name: str | None) -> str:
    """A program's name compared across files: its file name without folder and ``.py``, lower case."""
    base = os.path.basename(str(name or "").split(":")[0])
    return base.removesuffix(".py").lower()


def check_bound(result: dict, path: str, *, gpu: str | None = None, program: str | None = None,
                names=None) -> list[str]:
    """Refuse (`NotThisRun`, one line naming the program the save is from) a saved cold start of another run:
    another GPU than `gpu`; none of the kernels it observed made at run time among `names` (the kernel names of
    the run's trace) where it observed any (then it has nothing to add to this trace, whatever program it is of);
    else, where it observed none, another program than `program` (the run's label) by name — its program's or its
    label's. The notes returned say what the binding rests on: a save
    made before ``binding`` was recorded is bound by what it holds (its program's name, the GPU)."""
    b = result.get("binding") if isinstance(result.get("binding"), dict) else {}
    prog = b.get("program") or program_name(result) or "an unnamed program"
    what = f"{path} is the cold start of {prog}"
    if b.get("sha256"):
        what += f" ({b.get('file')}, sha256 {str(b['sha256'])[:12]}…)"
    sgpu = b.get("gpu") or _device(result.get("runs") or {}).get("gpu")
    fix = "give the cold-start save of this run's program (`cold-start --save`), or leave --coldstart out"
    if gpu and sgpu and sgpu not in str(gpu):
        raise NotThisRun(f"{what}, measured on {sgpu}; this run is on {gpu}: {fix}")
    obs = observed_provenance(result)
    if names is not None and obs:
        if not any(k in names for k in obs):
            first = min(obs, key=len)
            raise NotThisRun(f"{what}: none of the {len(obs)} kernels it saw made at run time (e.g. {first[:80]}) "
                             f"runs in this trace, so it has nothing to add to it: {fix}")
    elif program and not obs and _stem(program) not in {_stem(prog), _stem(result.get("label"))}:
        raise NotThisRun(f"{what}; this run is of {program}: {fix}")
    if b.get("sha256"):
        return []
    how = ("the kernels it saw made at run time, found in this trace" if names is not None and obs else
           f"its program's name ({prog})" if program else "nothing this run records")
    return [f"{path} was saved before cold-start recorded the program's content hash: bound by {how}"
            + (f" and the GPU ({sgpu})" if gpu and sgpu else "")]


def bound_or_usage(result: dict, path: str, *, echo, **run) -> None:
    """For the commands that take ``--coldstart``: `check_bound`, its refusal a usage error (exit 2, one line),
    its notes and the file's load notes through `echo`."""
    import click
    try:
        notes = check_bound(result, path, **run)
    except NotThisRun as e:
        raise click.UsageError(str(e)) from None
    for n in list(result.get("load_notes") or []) + notes:
        echo(f"note: {n}")


def trace_kernel_names(path: str, rows=None) -> set[str]:
    """Every kernel name a Chrome trace launches (its detail), or, where it cannot be read so, those of `rows`
    (a kernel table's ``kernel`` column)."""
    try:
        from cublaslt_probe.analysis.trace import read_chrome_trace
        det = read_chrome_trace(path, detail=True).detail
        return set(det.names)
    except (ProbeError, OSError, ValueError):  # an Nsight export or an odd trace: the rows' names are what is known
        return set(rows["kernel"]) if rows is not None and len(rows) else set()


def apply_observed(rows, result: dict, per_name: dict | None = None, steps: int = 1):
    """Rows of a kernel table (`trace` GEMM rows, `audit` rows: a ``kernel`` and a ``provenance`` column) with the
    provenance a cold-start run *observed* (`observed_provenance`) and an ``evidence`` column (``observed`` for
    those, ``name`` for the rest); and a summary: how many of the trace's kernel names (`per_name`: name ->
    [launches, µs]) were observed made at run time or chosen by timing, their GPU µs per step, by mechanism and
    by provenance, and the rows upgraded (by provenance)."""
    import pandas as pd
    obs = observed_provenance(result)
    rows = rows.copy()
    hit = rows["kernel"].isin(list(obs)) if len(rows) else pd.Series([], dtype=bool)
    prov = rows["provenance"].astype(object) if len(rows) else rows.get("provenance")
    if len(rows):
        prov[hit] = [obs[k]["provenance"] for k in rows.loc[hit, "kernel"]]
        rows["provenance"] = prov.astype(rows["provenance"].dtype if str(rows["provenance"].dtype) != "category"
                                         else "category")
    rows["evidence"] = pd.array(["observed" if h else "name" for h in hit], dtype="string")
    seen = {k: v for k, v in obs.items() if per_name and k in per_name}
    by_mech: dict[str, int] = {}
    by_prov: dict[str, int] = {}
    for v in seen.values():
        by_mech[v["mechanism"]] = by_mech.get(v["mechanism"], 0) + 1
        by_prov[v["provenance"]] = by_prov.get(v["provenance"], 0) + 1
    row_prov: dict[str, int] = {}
    for k in (rows.loc[hit, "kernel"] if len(rows) else []):
        row_prov[obs[k]["provenance"]] = row_prov.get(obs[k]["provenance"], 0) + 1
    summary = {"source": result.get("label") or result.get("target") or "cold-start", "kernels": len(seen),
               "gpu_us": sum(per_name[k][1] for k in seen) / max(steps, 1) if per_name else 0.0,
               "by_mechanism": by_mech, "by_provenance": by_prov, "gemm_rows": int(hit.sum()) if len(rows) else 0,
               "gemm_rows_by_provenance": row_prov, "how": {k: v["how"] for k, v in seen.items()}}
    return rows, summary
