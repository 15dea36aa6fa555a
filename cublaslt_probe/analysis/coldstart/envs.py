"""The environments a cold start runs its program under, and which runs to make (CPU): `ENVS` (what each
separates: docs/coldstart.md), the named sets (`ENV_SETS`), the runs added when the cold run observed what they
separate (`AUTO_ENVS`, `auto_envs`), those a later round repeats (`repeat_envs`), and the compile caches each run
isolates (`CACHE_DIRS`)."""
from __future__ import annotations

from dataclasses import dataclass, field

from cublaslt_probe.analysis.coldstart.runs import step_windows, storage_read, usable, windows
from cublaslt_probe.errors import OptionError

# every compile cache a run isolates (the folder each variable names): env var -> folder prefix
CACHE_DIRS = {"TORCHINDUCTOR_CACHE_DIR": "inductor", "TRITON_CACHE_DIR": "triton",
              "PYTORCH_KERNEL_CACHE_PATH": "torchkernels", "CUPY_CACHE_DIR": "cupy",
              "TORCH_EXTENSIONS_DIR": "torchextensions", "NUMBA_CACHE_DIR": "numba",
              "JAX_COMPILATION_CACHE_DIR": "jax"}
FRAMEWORK_VARS = tuple(CACHE_DIRS)
# the cache folders a child lists at each window's edges: the ComputeCache and the framework caches
CACHE_VARS = ("CUDA_CACHE_PATH", *FRAMEWORK_VARS)


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


def auto_envs(cold: dict) -> list[str]:
    """The runs `AUTO_ENVS` adds after this cold run: noautotune when XLA compiled during its steps; cold_again
    when its step 1 read at least `STORAGE_READ_MIN` bytes from storage."""
    seen = any(k.startswith("jax:") and k.endswith("backend_compile_duration")
               for w in step_windows(cold) for k in (w.get("jit_s") or {}))
    out = ["noautotune"] if seen else []
    if storage_read(windows(cold).get("step1")) >= STORAGE_READ_MIN:
        out.append("cold_again")
    return out
