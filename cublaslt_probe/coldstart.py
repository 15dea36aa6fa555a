"""Why was the first step slow? A cold-start breakdown of a whole program, each cause measured.

`run(target, steps=…)` (needs a GPU: it starts the children) runs the program's steps in fresh child
processes (`cublaslt_probe.coldstart_child`), one controlled environment each, and returns what they measured;
`analyse(result)` (CPU only, no torch) splits the excess of step 1 over the steady state by cause, each with
its evidence; `render(analysis)` prints it; `observed_provenance(result)` lists the kernels the process was seen
compiling or loading from PTX. `cold_start(...)` is run + analyse.

The environments are `ENVS` (what each separates: docs/coldstart.md); `--env-set default` runs cold, warm,
preinit, eager and nocache, `full` adds nojit, forcejit and forcejit_warm (`ENV_SETS`).

The breakdown of the cold run's step 1: excess = step 1 − steady state (median of steps 3…N) =
(cold − warm) + (warm − preinit) + (preinit − eager) + (eager step 1 − steady); the first three are the
cold-cache compilation (split between the framework and PTX JIT by what was written where), initialisation and
module loading; the last is split into what was observed inside the eager run's step 1: framework compilation
with warm caches (torch.compile's own timers), benchmark-based autotuning (its autotuning timers), cuBLASLt
heuristic misses (new problems in the step's level-2 log × the miss time measured by `nocache`) and allocator
growth (time in the driver's allocation calls, seen by CUPTI). What none of these explains is reported as
"unexplained", never dropped: causes + unexplained = step 1 − steady state, exactly. A difference between two
runs below zero is run-to-run noise: the cause counts 0 and the evidence says what was measured.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

from cublaslt_probe.errors import ProbeError
from cublaslt_probe.streams import open_text

SCHEMA = 1
CONTROLLED = ("CUDA_MODULE_LOADING", "CUDA_CACHE_PATH", "CUDA_CACHE_DISABLE", "CUDA_CACHE_MAXSIZE",
              "CUDA_DISABLE_PTX_JIT", "CUDA_FORCE_PTX_JIT", "CUBLASLT_HEURISTICS_CACHE_CAPACITY",
              "CUBLASLT_LOG_LEVEL", "CUBLASLT_LOG_MASK", "CUBLASLT_LOG_FILE", "TORCHINDUCTOR_CACHE_DIR",
              "TRITON_CACHE_DIR", "PYTORCH_KERNEL_CACHE_PATH")
FRAMEWORK_VARS = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "PYTORCH_KERNEL_CACHE_PATH")


@dataclass(frozen=True)
class EnvSpec:
    name: str
    what: str
    loading: str = "LAZY"
    compute_cache: str = "main"       # which ComputeCache folder (shared folders are warm after the first run)
    framework_cache: str = "main"
    preinit: bool = False
    extra: dict = field(default_factory=dict)


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
)}
ENV_SETS = {
    "default": ("cold", "warm", "preinit", "eager", "nocache"),
    "full": tuple(ENVS),
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
            raise ProbeError(f"--envs: unknown environment(s) {', '.join(bad)}; choose from {', '.join(ENVS)}")
        return names
    if (env_set or "default") not in ENV_SETS:
        raise ProbeError(f"--env-set {env_set}: choose one of {', '.join(ENV_SETS)}")
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
        timeout: float = 600.0, label: str | None = None, python: str | None = None, log=None) -> dict:
    """Run the target's steps once per environment, each in a fresh child process; the raw result."""
    if steps < 3:
        raise ProbeError(f"--steps {steps}: give at least 3 (step 1, step 2 and a steady state)")
    args, desc = target_args(target)
    names = env_names(env_set, envs)
    import cublaslt_probe
    pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(cublaslt_probe.__file__)))
    out = {"schema": SCHEMA, "label": label or desc.get("spec") or desc.get("argv", [""])[0], "target": desc,
           "steps": steps, "envs": names, "cupti": cupti,
           "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "runs": {}}
    root = tempfile.mkdtemp(prefix="coldstart_")
    try:
        for name in names:
            spec = ENVS[name]
            dirs = {"CUDA_CACHE_PATH": os.path.join(root, f"computecache_{spec.compute_cache}"),
                    "TORCHINDUCTOR_CACHE_DIR": os.path.join(root, f"inductor_{spec.framework_cache}"),
                    "TRITON_CACHE_DIR": os.path.join(root, f"triton_{spec.framework_cache}"),
                    "PYTORCH_KERNEL_CACHE_PATH": os.path.join(root, f"torchkernels_{spec.framework_cache}")}
            before = {}
            for var, d in dirs.items():
                os.makedirs(d, exist_ok=True)
                before[var] = _files(d)
            env = {k: v for k, v in os.environ.items() if k not in CONTROLLED}
            env.update(dirs)
            env.update({"CUDA_MODULE_LOADING": spec.loading, "CUDA_CACHE_DISABLE": "0", "PYTHONUNBUFFERED": "1"})
            env.update(spec.extra)
            env["PYTHONPATH"] = pkg_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
            cmd = [python or sys.executable, "-m", "cublaslt_probe.coldstart_child", "--steps", str(steps)]
            cmd += ["--preinit"] if spec.preinit else []
            cmd += [] if cupti else ["--no-cupti"]
            cmd += args
            t0 = time.perf_counter()
            try:
                p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
                rc, stdout, stderr = p.returncode, p.stdout, p.stderr
            except subprocess.TimeoutExpired as e:
                rc, stdout, stderr = None, _text(e.stdout), _text(e.stderr) + f"\n(timed out after {timeout:.0f} s)"
            rec: dict = {"env": {"what": spec.what, "CUDA_MODULE_LOADING": spec.loading, **spec.extra,
                                 "preinit": spec.preinit, "compute_cache": spec.compute_cache,
                                 "compute_cache_warm": bool(before["CUDA_CACHE_PATH"]),
                                 "framework_cache_warm": any(before[v] for v in FRAMEWORK_VARS)},
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
            out["runs"][name] = rec
            why = _no_gpu(rec)
            if why:
                from cublaslt_probe.errors import NoCudaDevice
                raise NoCudaDevice("cold-start", why)
            if log:
                log(f"{name}: {'ok' if rec.get('ok') else 'FAILED'} in {rec['wall_s']:.1f} s")
    finally:
        shutil.rmtree(root, ignore_errors=True)
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


def cold_start(target, steps: int = 6, env_set: str = "default", **kw) -> dict:
    """Run (GPU) and analyse: the breakdown of the first step of `target` (see `run` for targets)."""
    return analyse(run(target, steps=steps, env_set=env_set, **kw))


@contextlib.contextmanager
def cold_start_step():
    """Mark one step of a script run under `cublaslt-probe cold-start` (a no-op otherwise)."""
    child = sys.modules.get("cublaslt_probe.coldstart_child")
    if child is None or getattr(child, "_ACTIVE", None) is None:
        yield
        return
    child.marked_step_begin()
    try:
        yield
    except BaseException as e:
        child.marked_step_end(error=f"{type(e).__name__}: {e}")
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


def framework_files_written(run: dict) -> int:
    cw = run.get("cache_written") or {}
    return sum(int((cw.get(v) or {}).get("count", 0)) for v in FRAMEWORK_VARS)


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


# --- analysis (CPU) -----------------------------------------------------------------------------------------------
def _ms(s: float | None) -> str:
    return "n/a" if s is None else f"{s * 1e3:.1f} ms"


def _diff(a: dict | None, b: dict | None) -> float | None:
    if not (usable(a) and usable(b)):
        return None
    return step_walls(a)[0] - step_walls(b)[0]


def runtime_compilation(runs: dict) -> dict:
    """What the process was seen compiling (not forced runs): mechanisms with their evidence."""
    mech: dict[str, list[str]] = {}
    hints: list[str] = []
    for name, r in runs.items():
        if not r or str(r.get("env", {}).get("CUDA_FORCE_PTX_JIT")) == "1":
            continue
        for w in _step_windows(r):
            tri = w.get("triton_kernels") or []
            ind = new_files(w, "TORCHINDUCTOR_CACHE_DIR")
            if tri:
                mech.setdefault("triton", []).append(
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
        warm_cc = bool((r.get("env") or {}).get("compute_cache_warm")) and not compute_cache_written(r)
        for c in ptx_loads(r):
            what = c.get("image") if c.get("image") == "ptx" else c.get("input")
            line = (f"{name} {c['window']}: {c['name']} was handed {what} "
                    f"({c.get('image_bytes', 0) / 1024:.0f} KiB), {c['seconds'] * 1e3:.1f} ms in the call")
            if c.get("rc"):
                hints.append(line + f", and failed (CUDA error {c['rc']})")
            elif warm_cc:
                hints.append(line + " (its JIT output came from the warm ComputeCache)")
            else:
                mech.setdefault("ptx-jit", []).append(line)
        for lib, ws in libraries_loaded_in_steps(r).items():
            where = f"{name}: {lib} was loaded during {', '.join(ws)}"
            if lib.startswith("libnvidia-ptxjitcompiler"):
                mech.setdefault("ptx-jit", []).append(where + " (the driver's PTX JIT compiler)")
            elif lib.startswith(("libnvrtc", "libnvJitLink", "libnvptxcompiler")):
                mech.setdefault("nvjitlink" if "nvJitLink" in lib else "nvrtc", []).append(where)
            elif "runtime_compiled" in lib:
                hints.append(where + " (cuDNN's runtime-compiled engines: they compile with NVRTC when chosen)")
    seen = sorted(mech)
    if seen:
        verdict = "runtime compilation observed: " + ", ".join(_MECH_LABEL.get(m, m) for m in seen)
    else:
        verdict = ("no runtime compilation observed: no ComputeCache, Triton, Inductor or kernel-cache files were "
                   "written during the steps, no PTX was handed to the driver, and no NVRTC/nvJitLink was loaded")
    return {"observed": bool(seen), "mechanisms": {m: v[:6] for m, v in mech.items()}, "hints": hints[:6],
            "verdict": verdict}


_MECH_LABEL = {"triton": "Triton (torch.compile)", "inductor": "Inductor code generation",
               "ptx-jit": "PTX JIT by the driver", "nvrtc": "NVRTC", "nvjitlink": "nvJitLink"}


def analyse(result: dict) -> dict:
    """The breakdown of the cold run's first step (see the module doc). CPU only."""
    runs = result.get("runs") or {}
    if not runs:
        raise ProbeError("cold-start result has no runs: was it saved by `cold-start --save`?")
    table = []
    for name, r in runs.items():
        walls = step_walls(r)
        table.append({"run": name, "env": (r.get("env") or {}).get("what", ""), "ok": bool(r.get("ok")),
                      "step1_s": walls[0] if walls else None, "step2_s": walls[1] if len(walls) > 1 else None,
                      "steady_s": steady(walls), "wall_s": r.get("wall_s"),
                      "error": None if r.get("ok") else first_line(r.get("error") or _window_error(r))})
    base_name = "cold" if usable(runs.get("cold")) else next((n for n, r in runs.items() if usable(r)
                                                              and n not in ("forcejit", "forcejit_warm")), None)
    out = {"label": result.get("label"), "device": _device(runs), "steps": result.get("steps"), "table": table,
           "baseline": base_name, "components": [], "evidence": [], "compilation": runtime_compilation(runs)}
    if base_name is None:
        out["verdict"] = "no run completed its steps: see the errors in the table"
        return out
    A = runs[base_name]
    B, C, D, E = (runs.get(n) for n in ("warm", "preinit", "eager", "nocache"))
    walls = step_walls(A)
    step1, st = walls[0], steady(walls)
    excess = step1 - st
    out.update({"step1_s": step1, "step2_s": walls[1], "steady_s": st, "excess_s": excess})
    comps: list[dict] = []

    def add(cause, label, seconds, how, evidence):
        comps.append({"cause": cause, "label": label, "seconds": max(0.0, seconds or 0.0), "how": how,
                      "measured_s": seconds, "evidence": evidence})

    wA = windows(A)
    s1 = wA.get("step1", {})
    # 1. cold caches: compilation whose output was cached
    if base_name == "cold" and usable(B):
        d = _diff(A, B)
        tri = s1.get("triton_kernels") or []
        fw_files = sum(new_files(s1, v).get("count", 0) for v in FRAMEWORK_VARS)
        cc_files = new_files(s1, "CUDA_CACHE_PATH").get("count", 0) or compute_cache_written(A)
        ev = [f"step 1 cold {_ms(step1)} vs warm caches {_ms(step_walls(B)[0])}: {d * 1e3:+.1f} ms",
              f"cold run step 1 wrote {fw_files} framework cache files ({len(tri)} Triton kernels) and "
              f"{cc_files} ComputeCache files; the warm run's step 1 wrote "
              f"{sum(new_files(windows(B).get('step1'), v).get('count', 0) for v in FRAMEWORK_VARS)} and "
              f"{new_files(windows(B).get('step1'), 'CUDA_CACHE_PATH').get('count', 0)}"]
        cA, cB = compile_seconds(s1), compile_seconds(windows(B).get("step1"))
        if cA or cB:
            ev.append(f"torch.compile's timers in step 1: {cA:.3f} s cold, {cB:.3f} s warm")
        # benchmark-based autotuning that a warm cache skips (Inductor timing Triton configs) is kept apart
        tune = max(0.0, autotune_seconds(s1) - autotune_seconds(windows(B).get("step1")))
        tune = min(tune, max(d, 0.0)) if fw_files else 0.0
        if tune:
            add("autotuning", "benchmark-based autotuning (cold cache)", tune, "torch.compile timers (cold − warm)",
                [f"autotuning timers in step 1: {autotune_seconds(s1):.3f} s cold, "
                 f"{autotune_seconds(windows(B).get('step1')):.3f} s warm"])
        if fw_files and cc_files:
            fw = min(max(d - tune, 0.0), max(0.0, cA - cB - tune)) if (cA or cB) else max(d - tune, 0.0)
            add("runtime_compilation", "runtime compilation, framework (cold cache)", fw, "cold − warm", ev)
            add("ptx_jit", "runtime compilation, PTX JIT (cold ComputeCache)", d - tune - fw, "cold − warm",
                [f"{cc_files} ComputeCache files written by the cold run"])
        elif fw_files:
            add("runtime_compilation", "runtime compilation, framework (cold cache)", d - tune, "cold − warm", ev)
        elif cc_files:
            add("ptx_jit", "runtime compilation, PTX JIT (cold ComputeCache)", d, "cold − warm", ev)
        else:
            ev.append("no cache file was written: no compilation is cached, the difference is run-to-run noise")
            add("cold_caches", "cold caches (nothing was compiled)", 0.0, "cold − warm", ev)
            comps[-1]["measured_s"] = d
    # 2. library initialisation
    if usable(B) and usable(C):
        d = _diff(B, C)
        pre = C.get("preinit") or {}
        items = ", ".join(f"{k} {v * 1e3:.1f} ms" if isinstance(v, float) else f"{k} failed" for k, v in pre.items())
        add("initialisation", "library initialisation (handles, first GEMM of a handle, cuDNN)", d, "warm − preinit",
            [f"step 1 warm {_ms(step_walls(B)[0])} vs libraries initialised first {_ms(step_walls(C)[0])}: "
             f"{d * 1e3:+.1f} ms", f"initialising apart took: {items}"])
    # 3. lazy module loading
    if usable(C) and usable(D):
        d = _diff(C, D)
        mA, mD = modules_in(A, "step1"), modules_in(D, "step1")
        ev = [f"step 1 LAZY {_ms(step_walls(C)[0])} vs EAGER {_ms(step_walls(D)[0])}: {d * 1e3:+.1f} ms"]
        if A.get("modules") is not None:
            kinds = ", ".join(f"{k} {v}" for k, v in (mA.get("by_kind") or {}).items())
            ev.append(f"CUPTI: {mA.get('count', 0)} modules ({mA.get('bytes', 0) / 2**20:.1f} MiB; {kinds or 'none'}) "
                      f"loaded during the {base_name} run's step 1; {mD.get('count', 0)} during the eager run's "
                      f"step 1; the eager run loaded {modules_in(D, 'setup').get('count', 0)} modules at start "
                      f"(setup {_ms(windows(D).get('setup', {}).get('wall_s'))})")
            ls, ln = driver_seconds(A, "step1", "load")
            if ln:
                ev.append(f"{ln} explicit load calls (cuModuleLoad*/cuLibraryLoad*) in step 1: {ls * 1e3:.1f} ms")
        add("module_loading", "lazy module loading", d, "preinit − eager", ev)
    # 4. inside the eager run's step 1 (or the baseline's when there is none)
    R = D if usable(D) else (C if usable(C) else A)
    rname = [n for n, r in runs.items() if r is R][0]
    r1 = windows(R).get("step1", {})
    cw = compile_seconds(r1)
    at = autotune_seconds(r1)
    if cw:
        add("runtime_compilation_warm", "framework compilation with warm caches (tracing, guards, cache loads)",
            cw - at, f"torch.compile timers ({rname})",
            [f"torch.compile's outermost timer in {rname} step 1: {cw:.3f} s (keys: "
             f"{', '.join(sorted(r1.get('compile_s', {}))[:6])})"])
    if at:
        add("autotuning_warm", "benchmark-based autotuning (warm caches)", at, f"torch.compile timers ({rname})",
            [f"autotuning timers in {rname} step 1: {at:.3f} s"])
    if R.get("cudnn_benchmark"):
        out["evidence"].append("torch.backends.cudnn.benchmark was on: cuDNN times candidate engines at each new "
                               "shape (benchmark-based autotuning, not timed apart here)")
    # heuristic misses
    newp, lines1 = new_problems(R, "step1")
    miss = None
    if usable(C) and usable(E):
        calls = lt_calls_per_step(C)
        hc, he = steady(step_hosts(C)), steady(step_hosts(E))
        if calls and hc is not None and he is not None:
            miss = (he - hc) / calls
    if lines1 or newp:
        ev = [f"{rname} step 1: {lines1} cuBLASLt matmul calls in the level-2 log, {newp} distinct problems not "
              "seen earlier in the process (each a heuristics-cache miss)"]
        if miss is not None:
            ev.append(f"miss time {miss * 1e6:.0f} µs per call: host time per steady step with the cache off "
                      f"{_ms(steady(step_hosts(E)))} vs on {_ms(steady(step_hosts(C)))}, "
                      f"{lt_calls_per_step(C):.0f} calls per step")
            add("heuristics", "cuBLASLt heuristic selection (cache misses)", newp * miss, "misses × miss time", ev)
        else:
            ev.append("no miss time measured (needs the preinit and nocache runs): not counted")
            out["evidence"].extend(ev)
    # allocator growth
    asec, acount = driver_seconds(R, "step1", "alloc")
    mb, ma = (r1.get("mem_before") or {}), (r1.get("mem_after") or {})
    grow = ma.get("reserved_bytes.all.current", 0) - mb.get("reserved_bytes.all.current", 0)
    if acount or grow:
        add("allocator", "allocator growth", asec, f"CUPTI driver allocation calls ({rname})",
            [f"{rname} step 1: {acount} allocation calls in the driver taking {asec * 1e3:.1f} ms; torch's reserved "
             f"memory grew by {grow / 2**20:.1f} MiB "
             f"({ma.get('num_device_alloc', 0) - mb.get('num_device_alloc', 0)} cudaMalloc)"])
    explained = sum(c["seconds"] for c in comps)
    out["unexplained_s"] = excess - explained
    out["unexplained_pct"] = 100.0 * out["unexplained_s"] / excess if excess > 0 else None
    out["components"] = comps
    out["what_if"] = _what_if(runs)
    out["forced_jit"] = forced_jit(result)
    out["runs_wall_s"], out["overhead_s"] = overhead(runs)
    out["import_s"] = sum(float(r.get("import_torch_s") or 0.0) for r in runs.values())
    out["step2_excess_s"] = walls[1] - st
    return out


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


def render(a: dict) -> str:
    dev = a.get("device") or {}
    lines = [f"cold start of {a.get('label')} on {dev.get('gpu', '?')} (torch {dev.get('torch', '?')}, CUDA "
             f"{dev.get('cuda', '?')}), {a.get('steps')} steps per run", ""]
    lines.append(f"  {'run':<14} {'environment':<48} {'step 1':>11} {'step 2':>10} {'steady':>10} {'run wall':>9}")
    for t in a["table"]:
        lines.append(f"  {t['run']:<14} {t['env'][:48]:<48} {_ms(t['step1_s']):>11} {_ms(t['step2_s']):>10} "
                     f"{_ms(t['steady_s']):>10} {t['wall_s'] or 0:8.1f}s" + ("" if t["ok"] else "  FAILED"))
        if t.get("error"):
            lines.append(f"      {' '.join(t['error'].split())[-160:]}")
    lines.append("")
    if a.get("baseline") is None:
        lines.append(a.get("verdict", ""))
        return "\n".join(lines)
    ex = a["excess_s"]
    lines.append(f"step 1 of the {a['baseline']} run: {_ms(a['step1_s'])} = steady {_ms(a['steady_s'])} + excess "
                 f"{_ms(ex)} (step 2: {_ms(a['step2_s'])})")
    lines.append(f"  {'cause':<72} {'ms':>10} {'share':>7}  how")
    for c in sorted(a["components"], key=lambda c: -c["seconds"]):
        share = f"{100 * c['seconds'] / ex:6.1f}%" if ex > 0 else "    n/a"
        lines.append(f"  {c['label']:<72} {c['seconds'] * 1e3:10.1f} {share}  {c['how']}")
    share = f"{a['unexplained_pct']:6.1f}%" if a.get("unexplained_pct") is not None else "    n/a"
    lines.append(f"  {'unexplained':<72} {a['unexplained_s'] * 1e3:10.1f} {share}")
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
    if a.get("what_if"):
        lines += ["", "what-ifs:"] + [f"  - {w}" for w in a["what_if"]]
    lines += ["", f"verdict: {comp['verdict']}"]
    return "\n".join(lines)


# --- provenance (CPU) ------------------------------------------------------------------------------------------------
def observed_provenance(result: dict) -> dict[str, dict]:
    """Kernel name (or ``module:<id>`` where the module's kernels are not known) -> what the process was seen
    doing to produce it: ``{"provenance": "runtime-compiled", "mechanism": "triton" | "ptx-jit",
    "evidence": "observed", "how": ...}``. Runs with CUDA_FORCE_PTX_JIT=1 are what-ifs and are left out."""
    out: dict[str, dict] = {}
    for name, r in (result.get("runs") or {}).items():
        if str((r.get("env") or {}).get("CUDA_FORCE_PTX_JIT")) == "1":
            continue
        for w in _step_windows(r):
            for k in w.get("triton_kernels") or []:
                out.setdefault(k, {"provenance": "runtime-compiled", "mechanism": "triton", "evidence": "observed",
                                   "how": f"Triton wrote {k}.cubin to its cache during {w['name']} of the {name} run"})
        for wname, g in (r.get("modules") or {}).items():
            for m in g.get("records", []):
                if m.get("image") != "ptx":
                    continue
                how = (f"module {m['id']} was loaded from PTX text by {m.get('loaded_by', 'a loader')} during "
                       f"{wname} of the {name} run (the driver JIT-compiled it)")
                for k in m.get("kernels") or [f"module:{m['id']}"]:
                    out.setdefault(k, {"provenance": "runtime-compiled", "mechanism": "ptx-jit",
                                       "evidence": "observed", "how": how})
    return out


def load(path: str) -> dict:
    """A saved cold-start result (`--save`), checked enough to render."""
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
    return obj


def apply_observed(rows, result: dict, per_name: dict | None = None, steps: int = 1):
    """Rows of a kernel table (`trace` GEMM rows, `audit` rows: a ``kernel`` and a ``provenance`` column) with the
    provenance a cold-start run *observed* (`observed_provenance`) and an ``evidence`` column (``observed`` for
    those, ``name`` for the rest); and a summary: how many of the trace's kernel names (`per_name`: name ->
    [launches, µs]) were seen compiled, their GPU µs per step, by mechanism, and the rows upgraded."""
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
    for v in seen.values():
        by_mech[v["mechanism"]] = by_mech.get(v["mechanism"], 0) + 1
    summary = {"source": result.get("label") or result.get("target") or "cold-start", "kernels": len(seen),
               "gpu_us": sum(per_name[k][1] for k in seen) / max(steps, 1) if per_name else 0.0,
               "by_mechanism": by_mech, "gemm_rows": int(hit.sum()) if len(rows) else 0,
               "how": {k: v["how"] for k, v in seen.items()}}
    return rows, summary
