"""The compile routes the cold-start child timed, read from a window (CPU): torch.compile's timers, CuPy/NVRTC,
Triton used directly, Numba, JAX/XLA and XLA's GEMM autotuning (seconds and calls inside each entry point, the
spans of the long calls, XLA's autotuning dumps), and the names of the mechanisms (`MECH_LABEL`)."""
from __future__ import annotations

import re
import statistics

from cublaslt_probe.analysis.coldstart.runs import Runs, compile_seconds, new_files, step_windows, usable, windows

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


def xla_autotune_seconds(runs: Runs) -> float | None:
    """What XLA's GEMM autotuning costs per full compile of the program: the cold run's backend compile in step 1
    − the noautotune run's (the same compile with ``--xla_gpu_autotune_level=0``, caches empty too); None without
    both runs compiling."""
    compiled, noautotune = runs.compile_run, runs.get("noautotune")
    if not (usable(compiled) and usable(noautotune)):
        return None
    a1, n1 = windows(compiled).get("step1"), windows(noautotune).get("step1")
    if not (xla_compiled(a1) and xla_compiled(n1) and xla_candidates_timed(a1)):
        return None
    return jit_seconds(a1, JAX_BACKEND) - jit_seconds(n1, JAX_BACKEND)


def xla_autotuned(run: dict) -> dict:
    """What XLA's autotuning dumps of a run's steps hold: GEMMs autotuned (results), candidates timed (logs)."""
    out = {"results": 0, "timed": 0, "kinds": {}, "windows": []}
    for w in step_windows(run):
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


def chosen_backends(xa: dict) -> str:
    """The backends XLA's autotuning chose (its results file: ``optimal_config { backend: ... }``), counted."""
    text = ((xa.get("autotune_results") or {}).get("text") or "")
    got: dict[str, int] = {}
    for m in re.finditer(r"optimal_config\s*\{\s*backend:\s*(\w+)", text):
        got[m.group(1)] = got.get(m.group(1), 0) + 1
    return ", ".join(f"{k} {v}" for k, v in sorted(got.items()))


def triton_direct_warm(run: dict, w: dict | None) -> tuple[float, float]:
    """(Triton's own host time in `w` beyond its steady launches, the steady time per launch): the seconds inside
    `JITFunction.run` in the window − its calls × the median per-call time of steps 3…N."""
    per = [jit_seconds(x, "triton.run") / jit_calls(x, "triton.run") for x in step_windows(run)[2:]
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


MECH_LABEL = {"triton": "Triton via torch.compile", "inductor": "Inductor code generation",
               "triton-direct": "Triton JIT (direct)", "triton-jit": "Triton (caller not observed)",
               "nvrtc-cupy": "NVRTC (CuPy)", "numba": "Numba", "xla": "XLA compile",
               "xla-autotune": "XLA GEMM autotuning", "ptx-jit": "PTX JIT by the driver", "nvrtc": "NVRTC",
               "nvjitlink": "nvJitLink"}


def routes_seconds(run: dict, w: dict | None) -> float:
    """Seconds a step window spent inside the timed compile routes (torch.compile's outermost timer, CuPy's
    compile, Triton's launch path beyond its steady launches, Numba's compile, JAX's compile events): the part of
    the step that `step1_components` measures directly. A route that compiles in every run (Numba without a disk
    cache, torch.compile's tracing and cache loads) varies from run to run by more than the differences between
    runs measure, so those differences are taken with it out."""
    tri = triton_direct_warm(run, w)[0] if jit_calls(w, "triton.run") else 0.0
    return compile_seconds(w) + jit_seconds(w, "cupy.compile", "numba.compile") + tri + xla_seconds(w)
