"""What a cold-start save measured, and whether it belongs to the run it is given with (CPU): the program (its
name, its file's name and content hash, never its folder), the GPU and the versions (`binding_of`, written into
the save as ``binding``); `check_bound` refuses a save of another program or GPU (`NotThisRun`)."""
from __future__ import annotations

import contextlib
import os
import sys

from cublaslt_probe.analysis.coldstart.observed import observed_provenance
from cublaslt_probe.analysis.coldstart.runs import device_of
from cublaslt_probe.errors import ProbeError

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
    dev = device_of(runs)
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


class NotThisRun(ProbeError):
    """A saved cold start of another program or GPU than the run it was given with."""


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
    sgpu = b.get("gpu") or device_of(result.get("runs") or {}).get("gpu")
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
