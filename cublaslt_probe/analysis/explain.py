"""`explain`: the chain of evidence for one GEMM on one screen.

`gpu.explain.gather(case)` (GPU) collects an *evidence* dict — the probe record (log line, kernels, time, heuristic µs),
the heuristic's candidates for the same problem, optionally the first-call anatomy — which can be saved as
JSON. On any machine, `analyse(evidence)` turns it into one plain dict per section (what was logged, what
ran, what the name says, waves, time against the GPU's peaks, heuristic cost, rank among the candidates,
first call), and `render(evidence)` writes those sections as text; a saved evidence file explains itself.
"""
from __future__ import annotations

import math

from cublaslt_probe.dtypes import element_bytes
from cublaslt_probe.vocab import gpu_peaks


def gemm_bytes(m: int, n: int, k: int, batch: int, dtype: str | None) -> int | None:
    """The bytes a GEMM moves at least: A and B read once, C written once (`element_bytes`); None when the
    dtype has no size."""
    eb = element_bytes(dtype)
    if eb is None:
        return None
    nb, ob = eb
    return (m * k + k * n) * batch * nb + m * n * batch * ob


def roofline_floor(flops: float, nbytes: float, peak_tflops: float, hbm_tbps: float) -> dict:
    """The time floors of work of `flops` and `nbytes` on a GPU of these peaks, in µs: t_mem_us (the bytes
    at HBM bandwidth), t_compute_us (the flops at peak), floor_us (the higher) and bound (which one)."""
    t_mem = nbytes / (hbm_tbps * 1e12) * 1e6
    t_cmp = flops / (peak_tflops * 1e12) * 1e6
    return {"t_mem_us": t_mem, "t_compute_us": t_cmp, "floor_us": max(t_mem, t_cmp),
            "bound": "memory" if t_mem > t_cmp else "compute"}


def waves(blas_m: int, blas_n: int, tile_m: int, tile_n: int, split_k: int, batch: int, sms: int) -> dict:
    """CTAs = ⌈m/tile_m⌉·⌈n/tile_n⌉·split_k·batch over the SMs (one CTA per SM per wave)."""
    tm, tn = math.ceil(blas_m / tile_m), math.ceil(blas_n / tile_n)
    ctas = tm * tn * max(1, split_k) * batch
    full, last = divmod(ctas, sms)
    return {"tiles_m": tm, "tiles_n": tn, "ctas": ctas, "waves": ctas / sms, "full_waves": full,
            "last_wave_ctas": last or (sms if ctas else 0),
            "last_wave_util": (last / sms) if last else (1.0 if ctas else 0.0)}


# --- analysis: one function per section, each returning plain data --------------------------------------------
def analyse(ev: dict) -> dict:
    """The sections of the explanation as data (JSON-ready apart from the parsed log record under
    `algo.record` and the decoded name under `decoded.kernel_name`). `error` is set when the GEMM did not run;
    the other sections are then absent."""
    from cublaslt_probe.analysis.evidence import main_kernel, trace_record
    from cublaslt_probe.names import decode
    c, env, rec = ev["case"], ev.get("env") or {}, ev["record"]
    out = {"gemm": _gemm(c, rec), "env": _env(env), "error": rec.get("error")}
    if out["error"]:
        return out
    trace = trace_record(rec.get("log_lines"))
    kernels = list(rec.get("kernels") or [])
    mk = main_kernel(kernels)
    kn = decode(mk) if mk else None
    out.update({"log": _log(rec, trace), "algo": _algo(trace), "kernels": {"all": kernels, "main": mk},
                "decoded": _decoded(kn, trace), "waves": _waves(c, rec, kn, trace, env.get("sm_count")),
                "time": _time(c, rec, env.get("gpu")), "heuristic": _heuristic(rec),
                "candidates": _candidates(ev, c["dtype"], mk), "first_call": _first_call(ev.get("first_call")),
                "known_issues": _known_issues(trace, mk, rec, env, ev.get("candidates")),
                "nvmmh": _nvmmh(c, rec, env, kn, trace)})
    return out


def _gemm(c: dict, rec: dict) -> dict:
    return {**{k: c[k] for k in ("backend", "op", "dtype", "layout", "m", "n", "k")}, "batch": c.get("batch", 1),
            **{k: rec.get(k) for k in ("blas_m", "blas_n", "blas_k", "blas_trans_a", "blas_trans_b")}}


def _env(env: dict) -> dict:
    return {k: env.get(k) for k in ("gpu", "sm_count", "driver", "cublaslt_version", "torch_version")}


def _log(rec: dict, trace) -> dict:
    lines = rec.get("log_lines") or []
    return {"message": getattr(trace, "message", None) if trace is not None else None,
            "first_line": lines[0] if lines else None}


def _algo(trace) -> dict | None:
    if trace is None:
        return None
    return {"record": trace, "stages": trace.algo_stages, "split_k": trace.num_splits_k,
            **{k: getattr(trace, k) for k in ("function", "algo_id", "tile", "cluster", "reduction_scheme",
                                              "custom_option", "workspace_bytes")}}


def _decoded(kn, trace) -> dict | None:
    from cublaslt_probe.analysis.evidence import consistency
    if kn is None:
        return None
    return {"kernel_name": kn, "agrees_with_log": consistency(kn, trace)}


def _waves(c: dict, rec: dict, kn, trace, sm_count) -> dict:
    """CTAs and waves of the kernel's tile over the GPU's SMs; says why when they cannot be counted."""
    from cublaslt_probe.analysis.evidence import logged_tile
    tile = logged_tile(kn)
    if tile is None:
        return {"why_not": "the kernel name carries no tile"}
    if not sm_count:
        return {"why_not": "the SM count of the GPU is not recorded: waves not counted"}
    sk = trace.num_splits_k if trace is not None and trace.num_splits_k and trace.num_splits_k > 1 else 1
    batch = c.get("batch", 1)
    return {"blas_m": rec["blas_m"], "blas_n": rec["blas_n"], "tile": tile, "split_k": sk, "batch": batch,
            "sms": int(sm_count), **waves(rec["blas_m"], rec["blas_n"], tile[0], tile[1], sk, batch, int(sm_count))}


def _time(c: dict, rec: dict, gpu) -> dict | None:
    """Measured time and TFLOP/s; against the GPU product's datasheet peaks when they are known."""
    t = rec.get("time_us")
    if not t:
        return None
    batch = c.get("batch", 1)
    flops = 2 * c["m"] * c["n"] * c["k"] * batch
    out = {"time_us": t, "reps": rec.get("time_us_reps"), "tflops": flops / t / 1e6, "gpu": gpu, "peaks": None}
    p = gpu_peaks(gpu)
    peak = p.tflops.get(c["dtype"]) if p else None
    if peak is None:
        return out
    dt = c["dtype"]
    nbytes = gemm_bytes(c["m"], c["n"], c["k"], batch, dt)
    r = roofline_floor(flops, nbytes, peak, p.hbm_tbps)
    out["peaks"] = {"source": p.source, "tflops": peak, "hbm_tbps": p.hbm_tbps, "pct": out["tflops"] / peak,
                    "bytes": nbytes, "gflop": flops / 1e9, "t_mem_us": r["t_mem_us"],
                    "t_compute_us": r["t_compute_us"], "bound": r["bound"], "over_floor": t / r["floor_us"]}
    return out


def _heuristic(rec: dict) -> dict | None:
    if rec.get("heuristic_miss_us") is None:
        return None
    return {"miss_us": rec["heuristic_miss_us"], "hit_us": rec.get("heuristic_hit_us")}


def _candidates(ev: dict, dtype: str, mk: str | None) -> dict | None:
    from cublaslt_probe.analysis import candidates as cm
    from cublaslt_probe.analysis.evidence import main_kernel
    cands = ev.get("candidates")
    if not cands:
        return None
    rank = next((cd["rank"] for cd in cands if mk and main_kernel(cd.get("kernels")) == mk), None)
    return {"n": len(cands), "workspace": ev.get("candidates_workspace", "n/a"), "rank_of_kernel": rank,
            "regret": cm.regret(cands, dtype)}


def _known_issues(trace, mk: str | None, rec: dict, env: dict, cands) -> dict | None:
    """The release-note bugs the logged config (with the kernel that ran) meets or can meet on the run's cuBLAS
    and compute capability (`known_issues`), and the heuristic candidates that do; None without a logged algo."""
    from cublaslt_probe import known_issues
    from cublaslt_probe.analysis.evidence import main_kernel
    from cublaslt_probe.logs.issues import record_config
    cfg = record_config(trace) if trace is not None else None
    if cfg is None:
        return None
    env_kw = {"cublas": env.get("cublaslt_version"), "cc": env.get("cc")}
    out = {**env_kw, "pick": [m.text() for m in known_issues.match({**cfg, "kernel": mk}, **env_kw)],
           "candidates": []}
    for cd in cands or []:
        ccfg = {"algo_id": cd.get("algo_id"), "split_k": cd.get("split_k") or 1, "stages": cd.get("stages"),
                "k": rec.get("blas_k"), "grouped": False, "kernel": main_kernel(cd.get("kernels"))}
        texts = [m.text() for m in known_issues.match(ccfg, **env_kw)]
        if texts:
            out["candidates"].append({"rank": cd.get("rank"), "issues": texts})
    return out


def _nvmmh(c: dict, rec: dict, env: dict, kn, trace) -> dict:
    """nvMatmulHeuristics' second opinion (cublaslt_probe.nvmmh, docs/nvmmh.md): its top 3 configs for the GEMM
    on the run's GPU and how they stand to the pick; `why_not` when the model cannot be asked."""
    from cublaslt_probe import nvmmh
    from cublaslt_probe.errors import ProbeError
    row = {"family": getattr(kn, "family", None), "time_us": rec.get("time_us"),
           **{f: getattr(kn, f, None) for f in ("tile_m", "tile_n", "cluster_m", "cluster_n", "stages", "split_k")},
           **({"algo_tile": trace.tile, "algo_cluster": trace.cluster, "algo_split_k": trace.num_splits_k}
              if trace is not None else {})}
    try:
        cfgs = nvmmh.configs(c["m"], c["n"], c["k"], c["dtype"], c["layout"], c.get("batch", 1),
                             env.get("gpu") or "", nvmmh.TOP)
        gpu = nvmmh.gpu_name(env.get("gpu") or "")
    except ProbeError as e:
        return {"why_not": str(e)}
    return {"gpu": gpu, "asked": len(cfgs), "top": [x.as_dict() for x in cfgs[:3]], **nvmmh.score_row(row, cfgs)}


def _first_call(fc: dict | None) -> dict | None:
    if not fc:
        return None
    return {"components_us": {k: v for k, v in fc["components_us"].items() if k.endswith("_us") and v is not None},
            "verdict": fc["verdict"]}


# --- rendering: text from the analysis --------------------------------------------------------------------------
def render(ev: dict) -> str:
    """The explanation of saved or gathered evidence, as text."""
    return render_analysis(analyse(ev))


def render_analysis(a: dict) -> str:
    L = _render_head(a)
    if a["error"]:
        return "\n".join(L + ["", f"this GEMM did not run: {a['error']}"])
    L.append("")
    for title, part in _SECTIONS:
        L.append(title)
        L += ["   " + x for x in part(a)]
    return "\n".join(L)


def _render_head(a: dict) -> list[str]:
    g, env = a["gemm"], a["env"]
    return [f"GEMM  {g['backend']} {g['op']} {g['dtype']} {g['layout']}  M={g['m']} N={g['n']} K={g['k']}"
            + (f" batch={g['batch']}" if g["batch"] > 1 else "") + "  (torch view)",
            f"      cuBLAS sees m={g['blas_m']} n={g['blas_n']} k={g['blas_k']} "
            f"op(A)={g['blas_trans_a']} op(B)={g['blas_trans_b']} (column-major)",
            f"GPU   {env['gpu']} ({env['sm_count']} SMs), driver {env['driver']}, "
            f"cuBLASLt {env['cublaslt_version']}, torch {env['torch_version']}"]


def _render_log(a: dict) -> list[str]:
    lg = a["log"]
    return [lg["message"] or lg["first_line"] or "(no trace line: this call did not go through cuBLASLt)"]


def _render_algo(a: dict) -> list[str]:
    x = a["algo"]
    if x is None:
        return ["(no log line)"]
    return [f"{x['function']}: algoId={x['algo_id']} tile={x['tile']} stages={x['stages']} cluster={x['cluster']} "
            f"splitK={x['split_k']} reduction={x['reduction_scheme']} customOption={x['custom_option']} "
            f"workspace={x['workspace_bytes']} B"]


def _render_kernels(a: dict) -> list[str]:
    k = a["kernels"]
    return [f"{'*' if x == k['main'] else ' '} {x}" for x in k["all"]]


def _render_decoded(a: dict) -> list[str]:
    d = a["decoded"]
    if d is None:
        return []
    kn = d["kernel_name"]
    f = [f"family {kn.family}", f"arch {kn.arch}"]
    if kn.a_type:
        f.append(f"A/B {kn.a_type}/{kn.b_type} -> C {kn.c_type}, compute {kn.compute_type}")
    if kn.tile_m:
        f.append(f"tile {kn.tile_m}x{kn.tile_n}")
    if kn.tile_k:
        f.append(f"K tile {kn.tile_k}" + (f" × {kn.stages} stages" if kn.stages else ""))
    if kn.cluster_m:
        f.append(f"cluster {kn.cluster_m}x{kn.cluster_n}")
    if kn.split_k is not None:
        f.append(f"split-K {'yes' if kn.split_k else 'no'}")
    if kn.flags:
        f.append("flags " + ",".join(kn.flags))
    if kn.layout:
        f.append(f"layout {kn.layout}")
    cons = d["agrees_with_log"]
    return ["; ".join(f), "agrees with the logged algo (tile, cluster, split-K): "
            + ("yes" if cons else "NO" if cons is False else "nothing to compare")]


def _render_waves(a: dict) -> list[str]:
    w = a["waves"]
    if "why_not" in w:
        return [f"({w['why_not']})"]
    (tm, tn), sk, sms = w["tile"], w["split_k"], w["sms"]
    return [f"⌈{w['blas_m']}/{tm}⌉·⌈{w['blas_n']}/{tn}⌉" + (f"·{sk} (split-K)" if sk > 1 else "")
            + (f"·{w['batch']} (batch)" if w["batch"] > 1 else "")
            + f" = {w['ctas']} CTAs over {sms} SMs = {w['waves']:.2f} waves; last wave "
            f"{w['last_wave_ctas']}/{sms} SMs busy ({w['last_wave_util']:.0%})"]


def _render_time(a: dict) -> list[str]:
    t = a["time"]
    if t is None:
        return []
    line = f"{t['time_us']:.2f} µs median (CUDA events, {t['reps']} reps) = {t['tflops']:.1f} TFLOP/s"
    p = t["peaks"]
    if p is None:
        return [line + f"; peak unknown for {t['gpu'] or 'this GPU'} (no datasheet entry in vocab.PEAKS)"]
    dtype = a["gemm"]["dtype"]
    return [line + f" = {p['pct']:.1%} of {p['tflops']:.0f} TFLOP/s {dtype} dense peak ({p['source']}, dense)",
            f"floors: {p['bytes'] / 1e6:.1f} MB at {p['hbm_tbps']} TB/s = {p['t_mem_us']:.2f} µs; "
            f"{p['gflop']:.2f} GFLOP at peak = {p['t_compute_us']:.2f} µs -> {p['bound']}-bound; "
            f"measured is {p['over_floor']:.1f}× the floor"]


def _render_heuristic(a: dict) -> list[str]:
    h = a["heuristic"]
    if h is None:
        return ["(not measured)"]
    return [f"cache miss {h['miss_us']:.1f} µs (cache off), hit {h['hit_us']:.1f} µs "
            "(cache on: what every later call of this shape pays)"]


def _render_candidates(a: dict) -> list[str]:
    x = a["candidates"]
    if x is None:
        return ["(not gathered)"]
    rank, reg = x["rank_of_kernel"], x["regret"]
    out = [f"{x['n']} candidates (lt, workspace {x['workspace']} B); the kernel that ran is "
           f"{'#' + str(rank) if rank is not None else 'not among them (another path or workspace)'}"]
    if reg["regret_pct"] is not None:
        out.append(f"fastest correct candidate: #{reg['best_rank']} at {reg['best_time_us']:.2f} µs; "
                   f"#0 at {reg['pick_time_us']:.2f} µs: regret {reg['regret_pct']:+.1f} %"
                   + (f" (noise {reg['noise_pct']:.1f} %)" if reg.get("noise_pct") is not None else ""))
    return out


def _render_first_call(a: dict) -> list[str]:
    fc = a["first_call"]
    if fc is None:
        return ["(not gathered: add --first-call)"]
    return ["; ".join(f"{k.replace('_us', '').replace('_', ' ')} {v:.0f} µs" for k, v in fc["components_us"].items()),
            f"verdict: {fc['verdict']}"]


def _render_known_issues(a: dict) -> list[str]:
    x = a["known_issues"]
    if x is None:
        return ["(no logged algo config)"]
    env = f"cuBLAS {x['cublas'] or '(version unknown)'}, compute capability {x['cc'] or '(unknown)'}"
    out = x["pick"] or [f"none that this config can meet on {env}"]
    if x["candidates"]:
        ranks = ", ".join(f"#{c['rank']}" for c in x["candidates"])
        out.append(f"heuristic candidates meeting or able to meet one: {ranks}")
    return out


def _render_nvmmh(a: dict) -> list[str]:
    x = a["nvmmh"]
    if "why_not" in x:
        return [f"(not asked: {x['why_not']})"]
    out = [f"#{t['rank']} {t['tile']}x{t['tile_k']} · cluster {t['cluster']} · {t['stages']} stages · split-K "
           f"{t['split_k']}: {t['pred_us']:.1f} µs predicted" for t in x["top"]]
    if x["nvmmh_agrees"] is not None:
        rank = x["nvmmh_tile_rank"]
        t = a["time"]["time_us"] if a.get("time") else None
        where = (f"the pick's tile is its #{rank} ({x['nvmmh_pick_us']:.1f} µs predicted" if rank is not None
                 else f"the pick's tile is not in its top {x['asked']} (")
        out.append(where + (f"; measured {t:.1f} µs)" if t else ")"))
    return [f"on {x['gpu']}, predicted for its own configs (not cuBLAS's kernels):"] + out


_SECTIONS = (("1. cuBLASLt log (level 2, the call that ran):", _render_log),
             ("2. algo cuBLASLt chose (its heuristic's pick; nothing compiled):", _render_algo),
             ("3. kernel(s) that ran (profiler):", _render_kernels),
             ("4. decoded:", _render_decoded),
             ("5. tiles and waves:", _render_waves),
             ("6. time:", _render_time),
             ("7. heuristic CPU cost (cublasLtMatmulAlgoGetHeuristic, same problem):", _render_heuristic),
             ("8. among the heuristic's own candidates:", _render_candidates),
             ("9. first call:", _render_first_call),
             ("10. known issues (cuBLAS release notes):", _render_known_issues),
             ("11. second opinion (nvMatmulHeuristics, NVIDIA's analytic model; docs/nvmmh.md):", _render_nvmmh))
