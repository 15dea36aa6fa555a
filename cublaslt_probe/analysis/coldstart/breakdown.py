"""The breakdown of a cold start's first step (CPU): `analyse(result)` splits the excess of the baseline run's
step 1 over its steady state by cause (`causes`), each with its evidence, for one round or for the median runs of
several (`rounds`); the run table, the caches each run found and wrote, the what-ifs of PTX JIT, and the verdict
where no run completed its steps. The method: the package docstring and docs/coldstart.md."""
from __future__ import annotations

import re

from cublaslt_probe.analysis.coldstart.causes import (
    allocator_components,
    cold_cache_components,
    file_cache_component,
    heuristics_components,
    initialisation_component,
    module_loading_component,
    step1_components,
    unseparated_reads,
)
from cublaslt_probe.analysis.coldstart.envs import STORAGE_READ_MIN
from cublaslt_probe.analysis.coldstart.observed import observed_provenance, runtime_compilation
from cublaslt_probe.analysis.coldstart.rounds import combine_rounds, median_runs, rounds_of
from cublaslt_probe.analysis.coldstart.routes import MECH_LABEL, span_owner
from cublaslt_probe.analysis.coldstart.runs import (
    Runs,
    compute_cache_written,
    first_line,
    fmt_ms,
    new_files,
    ptx_loads,
    steady,
    step_walls,
    storage_read,
    usable,
    window_error,
    windows,
)
from cublaslt_probe.errors import ProbeError


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


def analyse_round(result: dict, brief: bool = False) -> dict:
    """The breakdown of one round: the cold run's first step of `result`'s runs. `brief`: the figures only (no
    provenance, caches, what-ifs).

    Each term of the module doc's sum has its own function, called here in the sum's order (cold caches,
    initialisation, module loading, then what step 1 of the eager run shows); each returns its components, and
    what one measured but counts nowhere goes to the analysis' evidence, so the components and the notes keep
    that order."""
    runs = Runs(result.get("runs") or {})
    if not runs:
        raise ProbeError("cold-start result has no runs: was it saved by `cold-start --save`?")
    table = _run_table(runs)
    base_name = runs.baseline_name
    out = {"label": result.get("label"), "device": runs.device, "steps": result.get("steps"), "table": table,
           "baseline": base_name, "components": [], "evidence": [],
           "compilation": None if brief else runtime_compilation(runs)}
    if base_name is None:
        out["verdict"] = failure_verdict(runs)
        return out
    base = runs[base_name]
    walls = step_walls(base)
    step1, st = walls[0], steady(walls)
    excess = step1 - st
    out.update({"step1_s": step1, "step2_s": walls[1], "steady_s": st, "excess_s": excess})
    notes = out["evidence"]
    comps: list[dict] = []
    if base_name == "cold" and runs.ok("warm"):
        if runs.compile_name == "cold_again":
            comps.append(file_cache_component(base, runs["cold_again"]))
        elif storage_read(windows(base).get("step1")) >= STORAGE_READ_MIN:
            notes.append(unseparated_reads(base))
        comps += cold_cache_components(runs, notes)
    if runs.ok("warm") and runs.ok("preinit"):
        comps.append(initialisation_component(runs["warm"], runs["preinit"]))
    if runs.ok("preinit") and runs.ok("eager"):
        comps.append(module_loading_component(base, base_name, runs["preinit"], runs["eager"]))
    # inside the explained run's step 1 (the eager run's, or the baseline's when there is none); the timed compile
    # routes with warm caches: measured in the warm run, whose step 1 the differences after cold − warm start from
    # with those routes' seconds taken out (`routes_seconds`)
    comps += step1_components(runs, notes)
    comps += heuristics_components(runs, notes)
    comps += allocator_components(runs.explained, runs.explained_name)
    explained_s = sum(c["seconds"] for c in comps)
    if excess > 0 and explained_s > DISAGREE * excess:
        notes.insert(0, f"the causes, each measured in its own runs, add up to {explained_s / excess:.1f}× the excess: "
                        "the runs disagree by more than run-to-run noise (step 1: " + ", ".join(
                            f"{t['run']} {fmt_ms(t['step1_s'])}" for t in table if t["step1_s"] is not None)
                        + "); a damaged or edited file, or a machine busy with other work while it ran")
    out["unexplained_s"] = excess - explained_s
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


def failure_verdict(runs: Runs) -> str:
    """The verdict when no run completed its steps: where the program failed and with what error, and whether a
    timed compile route was the last thing the failed step ran (the error came out of that compile)."""
    errs, where, inside = [], [], []
    for r in runs.values():
        errs.append(first_line(r.get("error") or window_error(r)))
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
            + (f", inside {MECH_LABEL.get(mech, mech)}'s compile" if mech else "")
            + f" ({errs[0]}); that is the program's own error, not a cold-start cost: run the script alone to see "
            "its traceback, fix it, then run cold-start again")


def _run_table(runs: Runs) -> list[dict]:
    """One row per run: its environment, whether it completed, its step 1, step 2 and steady-state walls, and the
    first line of its error; the table shows every run, the failed ones too."""
    table = []
    for name, r in runs.items():
        walls = step_walls(r)
        table.append({"run": name, "env": (r.get("env") or {}).get("what", ""), "ok": bool(r.get("ok")),
                      "step1_s": walls[0] if walls else None, "step2_s": walls[1] if len(walls) > 1 else None,
                      "steady_s": steady(walls), "wall_s": r.get("wall_s"),
                      "error": None if r.get("ok") else first_line(r.get("error") or window_error(r))})
    return table


def cache_states(runs: Runs) -> list[dict]:
    """Per run: which isolated caches held files before it (warm) and which it wrote to, as one line each.
    Runs saved before the per-cache counts were kept say only whether the ComputeCache and the framework
    caches were warm."""
    out = []
    for name, r in runs.items():
        env = r.get("env") or {}
        before = env.get("caches_before")
        written = {v: int((c or {}).get("count", 0)) for v, c in (r.get("cache_written") or {}).items()}
        wrote = ", ".join(f"{CACHE_NAME.get(v, v)} {n}" for v, n in written.items() if n) or "nothing"
        if before is None:
            warm = [lbl for lbl, key in (("ComputeCache", "compute_cache_warm"),
                                         ("framework caches", "framework_cache_warm")) if env.get(key)]
            line = (f"{' and '.join(warm)} warm" if warm else "all empty") + f" → wrote {wrote}"
        else:
            warm = [f"{CACHE_NAME.get(v, v)} {n}" for v, n in before.items() if n]
            line = (f"held {', '.join(warm)}" if warm else "all empty") + f" → wrote {wrote}"
        out.append({"run": name, "before": before, "written": written, "line": line})
    return out


CACHE_NAME = {"CUDA_CACHE_PATH": "ComputeCache", "TORCHINDUCTOR_CACHE_DIR": "Inductor", "TRITON_CACHE_DIR": "Triton",
               "PYTORCH_KERNEL_CACHE_PATH": "torch kernels", "CUPY_CACHE_DIR": "CuPy",
               "TORCH_EXTENSIONS_DIR": "torch extensions", "NUMBA_CACHE_DIR": "Numba",
               "JAX_COMPILATION_CACHE_DIR": "JAX"}


def overhead(runs: Runs) -> tuple[float, float]:
    """(wall time of all runs, the part outside the program's own windows: setup, factory, steps)."""
    total = sum(float(r.get("wall_s") or 0.0) for r in runs.values())
    own = sum(w["wall_s"] for r in runs.values() for w in r.get("windows", []) if w["name"] != "preinit")
    return total, total - own


def _what_if(runs: Runs) -> list[str]:
    """What the what-if runs showed: whether the program runs without PTX JIT (nojit), what forcing it costs."""
    out = []
    nojit = runs.get("nojit")
    if nojit:
        if usable(nojit) and (nojit.get("env") or {}).get("compute_cache_warm"):
            out.append(f"with CUDA_DISABLE_PTX_JIT=1 the program ran (step 1 {fmt_ms(step_walls(nojit)[0])}), but "
                       "with a warm ComputeCache, which serves JIT output compiled earlier: not a test of the need "
                       "for JIT")
        elif usable(nojit):
            out.append(f"with CUDA_DISABLE_PTX_JIT=1 and an empty ComputeCache the program ran (step 1 "
                       f"{fmt_ms(step_walls(nojit)[0])}): it needs no PTX JIT")
        else:
            out.append(f"with CUDA_DISABLE_PTX_JIT=1 and an empty ComputeCache the program failed: it needs PTX "
                       f"JIT ({first_line(nojit.get('error') or '')})")
    fj = forced_jit({"runs": runs})
    if fj and fj["ran"]:
        forced = runs["forcejit"]
        line = f"with CUDA_FORCE_PTX_JIT=1 and an empty ComputeCache: step 1 {fmt_ms(step_walls(forced)[0])}"
        if fj["seconds"] is not None:
            line += f", {fmt_ms(fj['seconds'])} more than the warm run's: what PTX JIT of every kernel would cost"
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
    forced, warm = runs.get("forcejit"), runs.get("warm")
    if usable(forced) and usable(warm):
        return step_walls(forced)[0] - step_walls(warm)[0]
    return None


def forced_jit(result: dict) -> dict | None:
    """The forced runs: was PTX JIT seen, what did it cost (None without a forcejit run)."""
    runs = result.get("runs") or {}
    forced = runs.get("forcejit")
    if not forced:
        return None
    if not usable(forced):
        return {"ran": False, "detected": False, "seconds": None, "error": first_line(forced.get("error") or
                                                                                     window_error(forced))}
    w1 = windows(forced).get("step1", {})
    cc = new_files(w1, "CUDA_CACHE_PATH")
    loads = [c for c in ptx_loads(forced) if c["window"] == "step1" and not c.get("rc")]
    jitc = [lib for lib in w1.get("new_libraries") or [] if lib.startswith("libnvidia-ptxjitcompiler")]
    ev = []
    if cc.get("bytes"):
        ev.append(f"the forced run's step 1 wrote {cc['count']} ComputeCache files ({cc['bytes'] / 1024:.0f} KiB)")
    if loads:
        ev.append(f"{len(loads)} loader calls were handed PTX in step 1: {sum(c['seconds'] for c in loads) * 1e3:.1f} "
                  "ms in those calls")
    if jitc:
        ev.append(f"{jitc[0]} was loaded during step 1")
    forced_warm = runs.get("forcejit_warm")
    if usable(forced_warm):
        ev.append(f"with its ComputeCache warm the forced run's step 1 took {fmt_ms(step_walls(forced_warm)[0])} "
                  f"and wrote {compute_cache_written(forced_warm)} files: the cache did not spare the JIT")
    return {"ran": True, "detected": bool(cc.get("bytes") or loads or jitc), "seconds": forced_jit_seconds(result),
            "evidence": ev}
