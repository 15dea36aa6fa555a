"""What else a GEMM could have run, each run through a probe: cuBLASLt's heuristic candidates for a Case
(`lt_candidates`), and a grouped GEMM's alternatives (`time_grouped_alternatives`).

`probe` is the `gpu.probe.Probe` that calls them (its torch, library, timing and profiling); the probe
imports this module, so this module names the class in words only, as `gpu.space.search` does."""
from __future__ import annotations

import time

from cublaslt_probe.analysis.candidates import max_rel_diff
from cublaslt_probe.cases import Case, grouped_alternatives, invalid_reason
from cublaslt_probe.errors import CaptureError, error_text
from cublaslt_probe.gpu.operands import CUBLAS_WORKSPACE, lt_problem


# --- heuristic candidates -------------------------------------------------------------------------------------
def lt_candidates(probe, c: Case, top: int = 32, workspace_bytes: int = CUBLAS_WORKSPACE,
                  alignment: int = 16, reps: int = 10, trust_rounds: int = 5) -> list[dict]:
    """Every candidate cuBLASLt's heuristic returns for Case `c` (its cuBLAS view), each run: config,
    waves, workspace, the kernels it launched (CUPTI), median time (events, same method as the probe),
    its max relative difference to candidate 0's output and its numerics against a float64 reference
    (`gpu.numerics`: numerics_ok, error_ratio). Candidate 0's row holds the regret's trust model
    (`gpu.space.trust_candidates`: the pick and the fastest correct candidates in `trust_rounds` interleaved
    rounds) under `trust`."""
    from cublaslt_probe.gpu import numerics, space
    torch = probe.torch
    why = invalid_reason(Case("lt", c.op, c.dtype, c.layout, c.m, c.n, c.k, c.batch))
    if why:
        raise CaptureError(why)
    out: list[dict] = []
    with probe.lt_gemm(lt_problem(c, workspace_bytes, alignment)) as g:
        t0 = time.perf_counter()
        res = g.heuristic(top)
        heur_us = (time.perf_counter() - t0) * 1e6
        ref = None
        ref64, absprod = numerics.reference(torch, g.p, g.A, g.B)
        ran = []
        for rank, r in enumerate(res):
            row = {"rank": rank, **probe.lib.algo_config(r.algo), "waves": float(r.wavesCount),
                   "workspace_bytes": int(r.workspaceSize), "state": int(r.state), "heuristic_us": heur_us,
                   "error": None}
            fn = g.call(r.algo)
            try:
                g.C.fill_(float("nan"))
                fn()
                torch.cuda.synchronize()
                y = g.C.float()
                if ref is None:
                    ref = y.clone()
                row["max_rel_diff_vs_0"] = max_rel_diff(y, ref)
                row["nan"] = bool(torch.isnan(y).any().item())
                num = numerics.check(torch, g.p, g.C, ref64, absprod, split_k=row.get("split_k") or 1,
                                     reduction_in_output_type=row.get("reduction_scheme") == "OUTPUT_TYPE")
                row["numerics_ok"], row["error_ratio"] = num["numerics_ok"], num["error_ratio"]
                t = probe.time_gpu(fn, reps)
                row["time_us"], row["time_us_min"] = t.median_us, t.min_us
                ran.append((row, fn))
            except Exception as e:  # noqa: BLE001
                row["error"] = error_text(e)
                torch.cuda.synchronize()
            out.append(row)
        if ran and ran[0][0]["rank"] == 0:
            # time #0 again after the others: the spread between its two medians is the noise band's evidence
            ran[0][0]["time_us_repeat"] = probe.time_gpu(ran[0][1], reps).median_us
            if trust_rounds:
                ran[0][0]["trust"] = space.trust_candidates(probe, ran, c.dtype, trust_rounds)
        if ran:
            for (row, _), kernels in zip(ran, probe.profile([fn for _, fn in ran])):
                row["kernels"] = [n for n, _ in kernels]
                row["kernel_us"] = [d for _, d in kernels]
    return out


# --- grouped GEMM alternatives --------------------------------------------------------------------------------
def time_grouped_alternatives(probe, c: Case) -> list[dict]:
    """Grouped GEMM `c` and its alternatives (`cases.grouped_alternatives`: padded groups, balanced groups, one
    batched GEMM padded to the largest group, fp8), each run through `probe.run_window` as any GEMM is, and one
    `torch.mm` per non-empty group (the eager experts' loop), timed with `probe.time_gpu` and checked against
    the grouped GEMM's own output on the same operands (`max_rel_diff`; of a split-k GEMM, the non-empty
    groups' outputs). One row per variant: its name, key, rows computed (along k for split-k), median µs,
    µs saved against the original (positive: faster), kernels, error."""
    torch = probe.torch
    alts = grouped_alternatives(c)
    recs = probe.run_window(list(alts.values()))
    rows = []
    for name, alt, r in zip(alts, alts.values(), recs):
        n_rows = (alt.k * alt.batch if c.split_k else alt.m * alt.batch)
        rows.append({"variant": name, "key": r["key"], "rows": n_rows, "time_us": r["time_us"],
                     "kernels": r["kernels"], "group_summary": r.get("group_summary"), "error": r["error"]})
    b = probe.builder.build(alts["original"])
    try:
        a, w = b.keep[0], b.keep[1]
        parts, live, at = [], [], 0
        for g, n in enumerate(alts["original"].group_sizes()):
            if n:
                parts.append((a[:, at:at + n], w[at:at + n]) if c.split_k else (a[at:at + n], w[g]))
                live.append(g)
            at += n
        loop = {"variant": "mm_per_group", "key": None, "rows": c.k if c.split_k else c.m, "group_summary": None,
                "error": None}
        try:
            fn = (lambda: [torch.mm(x, y) for x, y in parts])
            ref = b.fn().float()
            if c.split_k:
                ref = ref[live]
            got = (torch.stack if c.split_k else torch.cat)([o.float() for o in fn()])
            loop["max_rel_diff"] = max_rel_diff(got, ref)
            loop["time_us"] = probe.time_gpu(fn, key="torch|mm_per_group").median_us
            loop["kernels"] = [k for k, _ in probe.profile([fn])[0]]
        except Exception as e:  # noqa: BLE001  the other variants' rows stand
            loop.update(time_us=None, kernels=[], error=error_text(e))
            torch.cuda.synchronize()
        rows.append(loop)
    finally:
        b.close()
    base = rows[0]["time_us"]
    for r in rows:
        r["saved_us"] = round(base - r["time_us"], 1) if base and r["time_us"] else None
    return rows
