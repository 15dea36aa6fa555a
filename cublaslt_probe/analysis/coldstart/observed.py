"""What the cold-start runs saw the process compile (CPU): the mechanisms with their evidence
(`runtime_compilation`), each kernel seen made at run time or chosen by timing (`observed_provenance`), and those
applied to a kernel table of the same program (`apply_observed`, for `audit --coldstart` and `trace --coldstart`)."""
from __future__ import annotations

from collections.abc import Mapping

from cublaslt_probe.analysis.coldstart.routes import (
    JAX_BACKEND,
    JAX_TRACE,
    JAX_WRITES,
    MECH_LABEL,
    autotuned_instructions,
    chosen_backends,
    jit_calls,
    jit_mechanisms,
    jit_seconds,
    span_owner,
    triton_route,
    xla_candidates_timed,
    xla_compiled,
    xla_hits,
)
from cublaslt_probe.analysis.coldstart.runs import (
    compute_cache_written,
    libraries_loaded_in_steps,
    new_files,
    ptx_loads,
    step_windows,
    windows,
)
from cublaslt_probe.errors import ProbeError
from cublaslt_probe.names.classes import AUTOTUNED


def runtime_compilation(runs: Mapping[str, dict]) -> dict:
    """What the process was seen compiling (not forced runs): mechanisms with their evidence."""
    mech: dict[str, list[str]] = {}
    hints: list[str] = []
    for name, r in runs.items():
        if not r or str(r.get("env", {}).get("CUDA_FORCE_PTX_JIT")) == "1":
            continue
        route = triton_route(r)
        for w in step_windows(r):
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
                line += f", inside {MECH_LABEL.get(owner, owner)}'s compile"
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
    seen = [m for m in MECH_LABEL if m in mech] + sorted(m for m in mech if m not in MECH_LABEL)
    if seen:
        verdict = "runtime compilation observed: " + ", ".join(MECH_LABEL.get(m, m) for m in seen)
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
            f"fusions ({kinds or 'kinds not listed'}); backends chosen: {chosen_backends(xa) or 'not listed'}")
    elif xa and jit_seconds(w, JAX_BACKEND) and xla_compiled(w):
        hints.append(f"{where}: XLA compiled and timed no candidate: its autotuning results came from its own "
                     "autotuning cache (in JAX's cache folder)")


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
        for w in step_windows(r):
            for k in w.get("triton_kernels") or []:
                out.setdefault(k, {"provenance": "runtime-compiled", "mechanism": route, "evidence": "observed",
                                   "how": f"Triton wrote {k}.cubin to its cache during {w['name']} of the {name} run "
                                          f"({MECH_LABEL[route]})"})
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
                    how = (f"module {m['id']} was loaded by {m['loaded_by']} inside {MECH_LABEL.get(owner, owner)}'s "
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
