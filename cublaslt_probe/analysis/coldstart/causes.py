"""The causes of the cold-start breakdown, one function per term of its sum (docs/coldstart.md), each returning
its components (cause, label, seconds, how, evidence) from the runs that separate it (CPU): the cold caches
(`cold_cache_components`, and the first reads of files, `file_cache_component`), library initialisation, lazy
module loading, and what the explained run's step 1 shows (the compile routes with warm caches, cuBLASLt's
heuristic misses, allocator growth)."""
from __future__ import annotations

import statistics

from cublaslt_probe.analysis.coldstart.envs import FRAMEWORK_VARS
from cublaslt_probe.analysis.coldstart.routes import (
    JAX_BACKEND,
    JAX_TRACE,
    jit_calls,
    jit_mechanisms,
    jit_seconds,
    routes_seconds,
    triton_direct_warm,
    xla_autotune_seconds,
    xla_autotuned,
    xla_candidates_timed,
    xla_compiled,
    xla_hits,
    xla_seconds,
)
from cublaslt_probe.analysis.coldstart.runs import (
    Runs,
    autotune_seconds,
    compile_seconds,
    compute_cache_written,
    driver_seconds,
    fmt_ms,
    lt_calls_per_step,
    modules_in,
    new_files,
    new_problems,
    steady,
    step_hosts,
    step_walls,
    storage_read,
    usable,
    windows,
)


def _diff(a: dict | None, b: dict | None) -> float | None:
    if not (usable(a) and usable(b)):
        return None
    return step_walls(a)[0] - step_walls(b)[0]


def _component(cause: str, label: str, seconds: float | None, how: str, evidence: list[str]) -> dict:
    """One cause of the breakdown. It counts `seconds` clamped at 0 (a difference below zero is run-to-run
    noise) and keeps what was measured in `measured_s`, so the evidence can show it."""
    return {"cause": cause, "label": label, "seconds": max(0.0, seconds or 0.0), "how": how,
            "measured_s": seconds, "evidence": evidence}


def cold_cache_components(runs: Runs, notes: list[str]) -> list[dict]:
    """compile run − warm (step 1 of `runs.compile_run`, empty caches: cold, or cold_again where it ran, over the
    warm run's): the compilation whose output the caches keep. Autotuning and the timed compile routes take their
    own timers' share; the rest goes to the framework and to PTX JIT by which caches the compile run wrote. A rest
    that no component takes goes to `notes`."""
    cname, compiled, warm = runs.compile_name, runs.compile_run, runs["warm"]
    d = _diff(compiled, warm)
    s1 = windows(compiled).get("step1", {})
    tri = s1.get("triton_kernels") or []
    fw_files = sum(new_files(s1, v).get("count", 0) for v in FRAMEWORK_VARS)
    cc_files = new_files(s1, "CUDA_CACHE_PATH").get("count", 0) or compute_cache_written(compiled)
    ev = [f"step 1 {cname} {fmt_ms(step_walls(compiled)[0])} vs warm caches {fmt_ms(step_walls(warm)[0])}: "
          f"{d * 1e3:+.1f} ms",
          f"{cname} run step 1 wrote {fw_files} framework cache files ({len(tri)} Triton kernels) and "
          f"{cc_files} ComputeCache files; the warm run's step 1 wrote "
          f"{sum(new_files(windows(warm).get('step1'), v).get('count', 0) for v in FRAMEWORK_VARS)} and "
          f"{new_files(windows(warm).get('step1'), 'CUDA_CACHE_PATH').get('count', 0)}"]
    c_cold, c_warm = compile_seconds(s1), compile_seconds(windows(warm).get("step1"))
    if c_cold or c_warm:
        ev.append(f"torch.compile's timers in step 1: {c_cold:.3f} s cold, {c_warm:.3f} s warm")
    comps = []
    # benchmark-based autotuning that a warm cache skips (Inductor timing Triton configs) is kept apart
    tune = max(0.0, autotune_seconds(s1) - autotune_seconds(windows(warm).get("step1")))
    tune = min(tune, max(d, 0.0)) if fw_files else 0.0
    if tune:
        comps.append(_component(
            "autotuning", "benchmark-based autotuning (cold cache)", tune, "torch.compile timers (cold − warm)",
            [f"autotuning timers in step 1: {autotune_seconds(s1):.3f} s cold, "
             f"{autotune_seconds(windows(warm).get('step1')):.3f} s warm"]))
    # the routes whose entry points were timed: each gets its own cold − warm timer difference
    timed = _cold_timed(runs, s1, windows(warm).get("step1") or {})
    scaled, used = _scaled_timed(timed, max(d - tune, 0.0))
    comps += scaled
    rest = d - tune - used
    torch_fw = bool(c_cold or c_warm) or bool(new_files(s1, "TORCHINDUCTOR_CACHE_DIR").get("count"))
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
        fw = min(max(rest, 0.0), max(0.0, c_cold - c_warm - tune)) if (c_cold or c_warm) else max(rest, 0.0)
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


def file_cache_component(cold: dict, again: dict) -> dict:
    """cold − cold_again (step 1 of each, the same empty caches): the first reads of the files the program and
    its compilers use, which the operating system's file cache held by the time of the cold_again run. What
    each step read from storage and its CPU time are the evidence (the reads cost CPU as well as waiting)."""
    a, k = step_walls(cold)[0], step_walls(again)[0]
    wa, wk = windows(cold).get("step1"), windows(again).get("step1")
    ev = [f"step 1 with empty caches: {fmt_ms(a)} in the cold run, {fmt_ms(k)} in the cold_again run (after the other "
          f"runs had read the same files): {(a - k) * 1e3:+.1f} ms",
          f"step 1 of the cold run: {_reads(wa)}; of the cold_again run: {_reads(wk)}",
          "a second cold-start on this machine finds those files in the file cache: this cause is then absent, the "
          "others are the same" if a > k else "the first reads took no time the runs can tell from their noise"]
    return _component("file_cache", "first reads of files from storage (the OS file cache was cold)", a - k,
                      "cold − cold_again", ev)


def unseparated_reads(cold: dict) -> str:
    """The note for a cold run whose step 1 read from storage with no cold_again run to time those reads."""
    return (f"the cold run's step 1 read {storage_read(windows(cold).get('step1')) / 2**20:.1f} MiB from storage (the "
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


def _walls_less_routes(run: dict) -> tuple[float, float]:
    """(step 1 of `run`, the timed routes' seconds in it)."""
    return step_walls(run)[0], routes_seconds(run, windows(run).get("step1"))


# what the preinit items of each library initialise, for the label
_PREINIT_LIBS = (("cupy_", "CuPy's own cuBLAS handle, first GEMM and first reduction"),
                 ("jax_", "JAX's backend and first transfer"), ("numba_", "Numba's context and first transfer"))


def initialisation_component(warm: dict, preinit_run: dict) -> dict:
    """warm − preinit, each step 1 less its timed compile routes (`routes_seconds`): library initialisation
    (torch's handles, first GEMMs, cuDNN; CuPy's own cuBLAS handle, GEMM and reduction when the program uses
    CuPy), with what initialising apart took in the preinit run and the driver's load calls in each item."""
    (b1, tb), (c1, tc) = _walls_less_routes(warm), _walls_less_routes(preinit_run)
    d = (b1 - tb) - (c1 - tc)
    pre = preinit_run.get("preinit") or {}
    items = ", ".join(f"{k} {v * 1e3:.1f} ms" if isinstance(v, float) else f"{k} failed" for k, v in pre.items())
    ev = [f"step 1 warm {fmt_ms(b1)} vs libraries initialised first {fmt_ms(c1)}: {(b1 - c1) * 1e3:+.1f} ms",
          f"initialising apart took: {items}"]
    if tb or tc:
        ev[0] += (f"; less the timed compile routes in each ({fmt_ms(tb)} warm, {fmt_ms(tc)} preinit): "
                  f"{d * 1e3:+.1f} ms")
    loads: dict[str, list[float]] = {}
    for c in ((preinit_run.get("driver_calls") or {}).get("preinit") or {}).get("records", []):
        if c.get("what") == "load" and c.get("preinit_item"):
            loads.setdefault(c["preinit_item"], []).append(float(c.get("seconds") or 0.0))
    if loads:
        ev.append("CUPTI: load calls (cuModuleLoad*/cuLibraryLoad*) inside the items: " + ", ".join(
            f"{k} {len(v)} ({sum(v) * 1e3:.1f} ms)" for k, v in loads.items()))
    libs = [what for prefix, what in _PREINIT_LIBS if any(k.startswith(prefix) for k in pre)]
    label = "library initialisation (handles, first GEMM of a handle, cuDNN" + "".join(f"; {x}" for x in libs) + ")"
    return _component("initialisation", label, d, "warm − preinit", ev)


def module_loading_component(base: dict, base_name: str, preinit: dict, eager: dict) -> dict:
    """preinit − eager, each step 1 less its timed compile routes (`routes_seconds`): lazy module loading, with
    the modules CUPTI saw loaded in step 1 of the baseline (`base_name`) and of the eager run (when the runs had
    CUPTI)."""
    (c1, tc), (d1, td) = _walls_less_routes(preinit), _walls_less_routes(eager)
    d = (c1 - tc) - (d1 - td)
    m_base, m_eager = modules_in(base, "step1"), modules_in(eager, "step1")
    ev = [f"step 1 LAZY {fmt_ms(c1)} vs EAGER {fmt_ms(d1)}: {(c1 - d1) * 1e3:+.1f} ms"]
    if tc or td:
        ev[0] += f"; less the timed compile routes in each ({fmt_ms(tc)} LAZY, {fmt_ms(td)} EAGER): {d * 1e3:+.1f} ms"
    if base.get("modules") is not None:
        kinds = ", ".join(f"{k} {v}" for k, v in (m_base.get("by_kind") or {}).items())
        ev.append(f"CUPTI: {m_base.get('count', 0)} modules ({m_base.get('bytes', 0) / 2**20:.1f} MiB; "
                  f"{kinds or 'none'}) "
                  f"loaded during the {base_name} run's step 1; {m_eager.get('count', 0)} during the eager run's "
                  f"step 1; the eager run loaded {modules_in(eager, 'setup').get('count', 0)} modules at start "
                  f"(setup {fmt_ms(windows(eager).get('setup', {}).get('wall_s'))})")
        ls, ln = driver_seconds(base, "step1", "load")
        if ln:
            ev.append(f"{ln} explicit load calls (cuModuleLoad*/cuLibraryLoad*) in step 1: {ls * 1e3:.1f} ms")
    return _component("module_loading", "lazy module loading", d, "preinit − eager", ev)


def step1_components(runs: Runs, notes: list[str]) -> list[dict]:
    """The compilers' own work with warm caches, inside step 1 of `runs.warm_step_name` (the warm run, whose step
    1 the differences after cold − warm start from): torch.compile's and its autotuning's timers, then each timed
    compile route (`_warm_timed`), each route at most what step 1 of the baseline spent in it where that run
    compiled there too. cuDNN's benchmark mode (seen in the explained run) is not timed apart: it goes to
    `notes`."""
    wname, bname = runs.warm_step_name, runs.baseline_name
    warm, base, explained = runs[wname], runs[bname], runs.explained
    comps = []
    w1 = windows(warm).get("step1", {})
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
    own = {t[0]: t[2] for t in _warm_timed(runs, base, bname, windows(base).get("step1", {}))} if bname != wname else {}
    for cause, label, sec, how, tev in _warm_timed(runs, warm, wname, windows(warm).get("step1", {})):
        if cause in own and 0 <= own[cause] < sec:
            tev = tev + [f"the {bname} run's step 1 spent {own[cause] * 1e3:.1f} ms in it (it compiled there as "
                         f"well): counted at that, the {wname} run's {sec * 1e3:.1f} ms being the compile's "
                         "variation between runs"]
            sec = own[cause]
        comps.append(_component(cause, label, sec, how, tev))
    if explained.get("cudnn_benchmark"):
        notes.append("torch.backends.cudnn.benchmark was on: cuDNN times candidate engines at each new "
                     "shape (benchmark-based autotuning, not timed apart here)")
    return comps


def heuristics_components(runs: Runs, notes: list[str]) -> list[dict]:
    """cuBLASLt heuristic misses in step 1 of the explained run: its new problems × the miss time, which the host
    time per steady step of the nocache run over the preinit run measures (`miss_time`). Without that time the
    misses are not counted and their evidence goes to `notes`; a miss time the two runs' steady steps cannot tell
    from their own variation counts 0 and says so (never a negative time per call)."""
    ename, explained = runs.explained_name, runs.explained
    preinit, nocache = runs.get("preinit"), runs.get("nocache")
    newp, lines1 = new_problems(explained, "step1")
    if not (lines1 or newp):
        return []
    ev = [f"{ename} step 1: {lines1} cuBLASLt matmul calls in the level-2 log, {newp} distinct problems not "
          "seen earlier in the process (each a heuristics-cache miss)"]
    m = miss_time(preinit, nocache)
    if m is None:
        ev.append("no miss time measured (needs the preinit and nocache runs): not counted")
        notes.extend(ev)
        return []
    how = (f"host time per steady step with the cache off {fmt_ms(m['off_s'])} vs on {fmt_ms(m['on_s'])}, "
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


def miss_time(preinit: dict | None, nocache: dict | None) -> dict | None:
    """The host time of one heuristics-cache miss: (steady host time per step of the nocache run − that of the
    preinit run) / matmul calls per step; None without both runs or a logged call. ``noise_s`` is the larger
    spread (max − min) of the two runs' steady host times per step: a difference no larger (or below zero) is
    ``within_noise``, as it is where a step makes one or two cheap calls (CuPy's fp32 GEMM: a miss of ~15 µs in a
    step whose host time varies by more between processes). The spread is the interquartile range, so one slow
    step (a collection, a page fault) does not widen it: the medians compared ignore it too."""
    if not (usable(preinit) and usable(nocache)):
        return None
    calls = lt_calls_per_step(preinit)
    hc, he = steady(step_hosts(preinit)), steady(step_hosts(nocache))
    if not calls or hc is None or he is None:
        return None
    noise = max(iqr(step_hosts(run)[2:]) for run in (preinit, nocache))
    return {"measured_s": (he - hc) / calls, "off_s": he, "on_s": hc, "calls": calls, "noise_s": noise,
            "within_noise": he - hc <= noise}


def allocator_components(run: dict, name: str) -> list[dict]:
    """Allocator growth in step 1 of `run` (named `name`): the time CUPTI saw in the driver's allocation calls, with
    how much torch's reserved memory grew; none when step 1 neither allocated nor grew."""
    r1 = windows(run).get("step1", {})
    asec, acount = driver_seconds(run, "step1", "alloc")
    mb, ma = (r1.get("mem_before") or {}), (r1.get("mem_after") or {})
    grow = ma.get("reserved_bytes.all.current", 0) - mb.get("reserved_bytes.all.current", 0)
    if not (acount or grow):
        return []
    return [_component(
        "allocator", "allocator growth", asec, f"CUPTI driver allocation calls ({name})",
        [f"{name} step 1: {acount} allocation calls in the driver taking {asec * 1e3:.1f} ms; torch's reserved "
         f"memory grew by {grow / 2**20:.1f} MiB "
         f"({ma.get('num_device_alloc', 0) - mb.get('num_device_alloc', 0)} cudaMalloc)"])]


def _cold_timed(runs: Runs, a1: dict, b1: dict) -> list[tuple]:
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


def _xla_tune_evidence(runs: Runs, tune: float) -> list[str]:
    noautotune = runs.get("noautotune") or {}
    compiled = runs.compile_run or {}
    got = xla_autotuned(compiled)
    return [f"XLA backend compile in step 1: {jit_seconds(windows(compiled).get('step1'), JAX_BACKEND) * 1e3:.1f} "
            "ms with "
            f"autotuning, {jit_seconds(windows(noautotune).get('step1'), JAX_BACKEND) * 1e3:.1f} ms with "
            f"--xla_gpu_autotune_level=0 (noautotune run): {tune * 1e3:+.1f} ms",
            f"the cold run's autotuning dumps: {got['results']} autotuned instructions, {got['timed']} candidates "
            f"timed ({', '.join(f'{k} {v}' for k, v in sorted(got['kinds'].items())) or 'kinds not listed'})"]


def _warm_timed(runs: Runs, run: dict, name: str, r1: dict) -> list[tuple]:
    """(cause, label, seconds, how, evidence) for the compile routes' own work in step 1 of `run` (warm caches):
    cache lookups and loads, or compiles no cache serves (Numba, XLA under its cache threshold)."""
    out = []
    ms = lambda x: f"{x * 1e3:.1f} ms"
    if jit_calls(r1, "cupy.compile"):
        nv = jit_calls(r1, "cupy.nvrtc")
        out.append(("nvrtc_cupy_warm", "NVRTC (CuPy), " + ("compiled again (not cached)" if nv else
                                                            "warm cache: lookup and module load"),
                    jit_seconds(r1, "cupy.compile"), f"CuPy compile timer ({name})",
                    [f"{name} step 1: {jit_calls(r1, 'cupy.compile')} cached-compile calls, {nv} NVRTC compiles, "
                     f"{ms(jit_seconds(r1, 'cupy.compile'))}"]))
    if jit_calls(r1, "triton.run"):
        extra, each = triton_direct_warm(run, r1)
        out.append(("triton_direct_warm", "Triton JIT (direct), warm cache: specialisation, cache lookup, "
                    "launcher and module load", extra, f"JITFunction.run timer ({name})",
                    [f"{name} step 1: {ms(jit_seconds(r1, 'triton.run'))} inside JITFunction.run for "
                     f"{jit_calls(r1, 'triton.run')} launches, {each * 1e6:.0f} µs per launch in steps 3…N; "
                     f"compile from cache {ms(jit_seconds(r1, 'triton.compile.direct'))}, module and launcher load "
                     f"{ms(jit_seconds(r1, 'triton.load.direct'))}"]))
    if jit_calls(r1, "numba.compile"):
        nvvm = jit_calls(r1, "numba.nvvm")
        out.append(("numba_warm", "Numba, " + ("compiled again (no disk cache)" if nvvm else "cache load"),
                    jit_seconds(r1, "numba.compile"), f"Numba compile timer ({name})",
                    [f"{name} step 1: {jit_calls(r1, 'numba.compile')} compile calls, "
                     f"{ms(jit_seconds(r1, 'numba.compile'))}"
                     f" (NVVM {nvvm} calls, {ms(jit_seconds(r1, 'numba.nvvm'))}; link "
                     f"{ms(jit_seconds(r1, 'numba.link'))})"]))
    if jit_seconds(r1, JAX_BACKEND) or jit_seconds(r1, *JAX_TRACE):
        x = xla_seconds(r1)
        ev = [f"{name} step 1: tracing and lowering {ms(jit_seconds(r1, *JAX_TRACE))}, backend compile "
              f"{ms(jit_seconds(r1, JAX_BACKEND))} ({xla_hits(r1)} executables from JAX's persistent cache, "
              f"{xla_candidates_timed(r1)} autotuning candidates timed)"]
        if xla_compiled(r1):
            tune = xla_autotune_seconds(runs) if xla_candidates_timed(r1) else None
            t = min(max(tune or 0.0, 0.0), x)
            if tune is not None:
                out.append(("xla_autotuning_warm", "XLA GEMM autotuning (compiled again, not cached)", t,
                            "backend compile: cold − noautotune", _xla_tune_evidence(runs, tune)))
            out.append(("xla_compile_warm", "XLA compile (compiled again: the executable was not cached)", x - t,
                        f"JAX compile events ({name})",
                        ev + ["JAX's persistent cache did not serve the executable (a compile under "
                              "jax_persistent_cache_min_compile_time_secs is not written; XLA flags that differ "
                              "change its key)"]))
        else:
            out.append(("xla_warm", "XLA, warm cache: tracing, lowering, cache load", x,
                        f"JAX compile events ({name})", ev))
    return out
