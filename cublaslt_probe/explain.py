"""`explain`: the chain of evidence for one GEMM on one screen.

`gather(case)` (GPU) collects an *evidence* dict — the probe record (log line, kernels, time, heuristic µs),
the heuristic's candidates for the same problem, optionally the first-call anatomy — which can be saved as
JSON; `render(evidence)` (CPU) writes the report from it, so a saved evidence file explains itself anywhere.
"""
from __future__ import annotations

import math

from cublaslt_probe.evidence import TILE_SWAPPED
# Dense peak TFLOP/s by dtype (NVIDIA H100/H200 SXM datasheet, dense, no sparsity); the measured bf16 ceiling
# on the device machine was 788 TFLOP/s (8192³ on random data). One table for the project: plots.style.
from cublaslt_probe.plots.style import DATASHEET_TFLOPS

PEAK_TFLOPS = {"H200": DATASHEET_TFLOPS, "H100": DATASHEET_TFLOPS}
PEAK_SOURCE = "NVIDIA H100/H200 SXM datasheet, dense"
HBM_TBPS = {"H200": 4.8, "H100": 3.35}   # datasheet; measured on the H200 device machine: 4.3 TB/s copy
BYTES = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "fp8_e5m2": 1}
OUT_BYTES = {"fp8": 2, "fp8_e5m2": 2}


def _gpu_key(gpu: str | None) -> str | None:
    for k in PEAK_TFLOPS:
        if gpu and k in gpu:
            return k
    return None


def waves(blas_m: int, blas_n: int, tile_m: int, tile_n: int, split_k: int, batch: int, sms: int) -> dict:
    """CTAs = ⌈m/tile_m⌉·⌈n/tile_n⌉·split_k·batch over the SMs (one CTA per SM per wave)."""
    tm, tn = math.ceil(blas_m / tile_m), math.ceil(blas_n / tile_n)
    ctas = tm * tn * max(1, split_k) * batch
    full, last = divmod(ctas, sms)
    return {"tiles_m": tm, "tiles_n": tn, "ctas": ctas, "waves": ctas / sms, "full_waves": full,
            "last_wave_ctas": last or (sms if ctas else 0),
            "last_wave_util": (last / sms) if last else (1.0 if ctas else 0.0)}


def render(ev: dict) -> str:
    from cublaslt_probe import candidates as cm
    from cublaslt_probe.evidence import consistency, main_kernel
    from cublaslt_probe.logs import parse_line
    from cublaslt_probe.names import decode
    c, env, rec = ev["case"], ev.get("env", {}), ev["record"]
    L = []
    L.append(f"GEMM  {c['backend']} {c['op']} {c['dtype']} {c['layout']}  M={c['m']} N={c['n']} K={c['k']}"
             + (f" batch={c['batch']}" if c.get("batch", 1) > 1 else "") + "  (torch view)")
    L.append(f"      cuBLAS sees m={rec['blas_m']} n={rec['blas_n']} k={rec['blas_k']} "
             f"op(A)={rec['blas_trans_a']} op(B)={rec['blas_trans_b']} (column-major)")
    L.append(f"GPU   {env.get('gpu')} ({env.get('sm_count')} SMs), driver {env.get('driver')}, "
             f"cuBLASLt {env.get('cublaslt_version')}, torch {env.get('torch_version')}")
    if rec.get("error"):
        L.append(f"\nthis GEMM did not run: {rec['error']}")
        return "\n".join(L)
    trace = None
    for i, line in enumerate(rec.get("log_lines") or [], 1):
        r = parse_line(line, i)
        if r is not None and r.kind == "trace":
            trace = r
            break
    L.append("")
    L.append("1. cuBLASLt log (level 2, the call that ran):")
    L.append("   " + (trace.message if trace is not None and getattr(trace, "message", None) else
                      (rec.get("log_lines") or ["(no trace line: this call did not go through cuBLASLt)"])[0]))
    L.append("2. algo cuBLASLt chose (its heuristic's pick; nothing compiled):")
    if trace is not None:
        L.append(f"   {trace.function}: algoId={trace.algo_id} tile={trace.tile} stages={trace.stages} "
                 f"cluster={trace.cluster} splitK={trace.split_k} reduction={trace.reduction_scheme} "
                 f"customOption={trace.custom_option} workspace={trace.workspace_bytes} B")
    else:
        L.append("   (no log line)")
    kernels = rec.get("kernels") or []
    mk = main_kernel(kernels)
    kn = decode(mk) if mk else None
    L.append("3. kernel(s) that ran (profiler):")
    for k in kernels:
        L.append(f"   {'*' if k == mk else ' '} {k}")
    L.append("4. decoded:")
    if kn:
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
        L.append("   " + "; ".join(f))
        cons = consistency(kn, trace)
        L.append(f"   agrees with the logged algo (tile, cluster, split-K): "
                 f"{'yes' if cons else 'NO' if cons is False else 'nothing to compare'}")
    sms = env.get("sm_count") or 132
    L.append("5. tiles and waves:")
    if kn and kn.tile_m and kn.tile_n:
        tm, tn = (kn.tile_n, kn.tile_m) if kn.family in TILE_SWAPPED else (kn.tile_m, kn.tile_n)
        sk = trace.split_k if trace is not None and trace.split_k and trace.split_k > 1 else 1
        w = waves(rec["blas_m"], rec["blas_n"], tm, tn, sk, c.get("batch", 1), sms)
        L.append(f"   ⌈{rec['blas_m']}/{tm}⌉·⌈{rec['blas_n']}/{tn}⌉" + (f"·{sk} (split-K)" if sk > 1 else "")
                 + (f"·{c['batch']} (batch)" if c.get("batch", 1) > 1 else "")
                 + f" = {w['ctas']} CTAs over {sms} SMs = {w['waves']:.2f} waves; last wave "
                 f"{w['last_wave_ctas']}/{sms} SMs busy ({w['last_wave_util']:.0%})")
    else:
        L.append("   (the kernel name carries no tile)")
    t = rec.get("time_us")
    flops = 2 * c["m"] * c["n"] * c["k"] * c.get("batch", 1)
    g = _gpu_key(env.get("gpu"))
    L.append("6. time:")
    if t:
        tf = flops / t / 1e6
        line = f"   {t:.2f} µs median (CUDA events, {rec.get('time_us_reps')} reps) = {tf:.1f} TFLOP/s"
        if g:
            peak = PEAK_TFLOPS[g][c["dtype"]]
            line += f" = {tf / peak:.1%} of {peak:.0f} TFLOP/s {c['dtype']} dense peak ({PEAK_SOURCE})"
        L.append(line)
        if g:
            nbytes = (c["m"] * c["k"] + c["k"] * c["n"]) * BYTES[c["dtype"]] * c.get("batch", 1) + \
                c["m"] * c["n"] * OUT_BYTES.get(c["dtype"], BYTES[c["dtype"]]) * c.get("batch", 1)
            t_mem = nbytes / (HBM_TBPS[g] * 1e12) * 1e6
            t_cmp = flops / (PEAK_TFLOPS[g][c["dtype"]] * 1e12) * 1e6
            bound = "memory" if t_mem > t_cmp else "compute"
            L.append(f"   floors: {nbytes / 1e6:.1f} MB at {HBM_TBPS[g]} TB/s = {t_mem:.2f} µs; {flops / 1e9:.2f} GFLOP at "
                     f"peak = {t_cmp:.2f} µs -> {bound}-bound; measured is {t / max(t_mem, t_cmp):.1f}× the floor")
    L.append("7. heuristic CPU cost (cublasLtMatmulAlgoGetHeuristic, same problem):")
    if rec.get("heuristic_miss_us") is not None:
        L.append(f"   cache miss {rec['heuristic_miss_us']:.1f} µs (cache off), hit {rec['heuristic_hit_us']:.1f} µs "
                 "(cache on: what every later call of this shape pays)")
    else:
        L.append("   (not measured)")
    cands = ev.get("candidates")
    L.append("8. among the heuristic's own candidates:")
    if cands:
        reg = cm.regret(cands, c["dtype"])
        rank = None
        for cd in cands:
            if mk and main_kernel(cd.get("kernels")) == mk:
                rank = cd["rank"]
                break
        L.append(f"   {len(cands)} candidates (lt, workspace {ev.get('candidates_workspace', 'n/a')} B); the kernel that "
                 f"ran is {'#' + str(rank) if rank is not None else 'not among them (another path or workspace)'}")
        if reg["regret_pct"] is not None:
            L.append(f"   fastest correct candidate: #{reg['best_rank']} at {reg['best_time_us']:.2f} µs; "
                     f"#0 at {reg['pick_time_us']:.2f} µs: regret {reg['regret_pct']:+.1f} %"
                     + (f" (noise {reg['noise_pct']:.1f} %)" if reg.get("noise_pct") is not None else ""))
    else:
        L.append("   (not gathered)")
    fc = ev.get("first_call")
    L.append("9. first call:")
    if fc:
        comp = fc["components_us"]
        parts = [f"{k.replace('_us', '').replace('_', ' ')} {v:.0f} µs" for k, v in comp.items()
                 if k.endswith("_us") and v is not None]
        L.append("   " + "; ".join(parts))
        L.append(f"   verdict: {fc['verdict']}")
    else:
        L.append("   (not gathered: add --first-call)")
    return "\n".join(L)


def gather(case, *, top: int = 32, first_call: bool = False, probe=None) -> dict:
    """Run the GEMM through the probe, its candidates, optionally the first-call anatomy (GPU)."""
    from cublaslt_probe.probe import CUBLAS_WORKSPACE, Probe, lt_candidates
    probe = probe or Probe()
    [rec] = probe.run_window([case])
    ev = {"case": case.as_dict(), "env": probe.env, "record": rec}
    ws = Probe.heuristic_workspace(case) if case.backend != "lt" else CUBLAS_WORKSPACE
    try:
        from cublaslt_probe.probe import _compact
        ev["candidates"] = [_compact(r) for r in lt_candidates(probe, case, top=top, workspace_bytes=ws)]
        ev["candidates_workspace"] = ws
    except Exception as e:  # noqa: BLE001
        ev["candidates_error"] = f"{type(e).__name__}: {e}"
    if first_call:
        from cublaslt_probe import firstcall
        ev["first_call"] = firstcall.analyse(firstcall.run(case.key))
    return ev
