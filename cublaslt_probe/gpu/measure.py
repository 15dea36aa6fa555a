"""`audit --measure` on the GPU: for each GEMM of a program, what the alternatives would have cost.

For one GEMM (torch view: op, dtype, layout, m, n, k, batch, and the library path it took), measured with the
probe (`Probe.run_window`, the same timing and kernel capture as a sweep; `alternatives.lt_candidates` for the
heuristic's candidates):

- ``original``: the GEMM on the path it took in the program;
- ``paths``: the other ways torch could run it: the cuBLAS path (``torch``, 32 MiB workspace), torch's
  cuBLASLt path (``torch-lt``, 1 MiB) and cuBLASLt with 32 MiB (``lt``);
- ``candidates``: up to `top` algos cuBLASLt's heuristic returns (32 MiB), each timed, with its numerics
  against candidate 0 (the candidates' tolerance rules: `candidates.tolerance`);
- ``whatifs``: m, n and k padded up to multiples of 8, 16, 64 and 128 where that changes the value, each timed
  on the original path — the padded GEMM does more work, so a what-if that is faster than the original is a
  cliff (alignment or tile quantization), not noise;
- ``numerics``: max relative difference of each path and each padded GEMM (sliced back) against the original's
  output on the same inputs.

A grouped GEMM (`aten::_grouped_mm`, `_scaled_grouped_mm`; 2-D x 3-D, its offsets splitting the rows, or the
weight gradient's 2-D x 2-D, its offsets splitting k) is measured
with the group sizes the audit joined to it (``sizes_source``: recorded, or assumed equal) through
`alternatives.time_grouped_alternatives` (``grouped``: the original, every group padded to 8, 16, 64, 128 rows,
balanced sizes, one `torch.mm` per group, all groups padded to the largest as one `torch.bmm`, fp8) plus
transformers' `batched_mm` experts forward (`batched_mm_variant`), with each variant's numerics against the
original on the same operands (`gpu.compare.grouped_numerics`); ``implementations`` maps transformers'
`config._experts_implementation` values to the variants that run as they do (`EXPERTS_IMPLEMENTATIONS`).
Each experts module whose two forward grouped GEMMs are measured is also rebuilt and timed as one whole call of
the program (`measure_experts`, under ``experts``): a GEMM's alternative is not the change a program makes, and
the advice's saving rests on the whole call.

A GEMM its program replays from a CUDA graph (the audit row's ``graph``) is timed replayed from a graph too
(`use_graph_times`: ``timing`` = graph, each time's eager value kept as ``eager_us``): a graph pays no launch per
call, which changes what a small GEMM's alternatives cost.

GEMMs the probe cannot rebuild (a 3-D x 3-D grouped GEMM's equal groups, Triton templates, ops it does not
know) are listed with the reason, not dropped. Imports torch only inside functions (GPU side).

This module runs the measurement; what to measure is decided on the CPU (`analysis.audit.plan`: the Cases, the
what-ifs, the experts problem), the experts model is `gpu.experts`, the grouped variants' numerics
`gpu.compare`, the loops that time a graph replay and a whole call `gpu.timing` (`replayed_us`, `CallSpan`). The
result is the saved measurement's dict, which `analysis.audit.measurement.Measurement` reads.
"""
from __future__ import annotations

import logging
import statistics
import time

from cublaslt_probe.analysis.audit.plan import (
    BATCHED_MM_CAP,
    EXPERTS_BUDGET_S,
    EXPERTS_IMPLEMENTATIONS,
    EXPERTS_VARIANTS,
    GRAPH_CALLS,
    GRAPH_PATHS,
    GRAPH_REPS,
    GRAPH_TIMING,
    case_of,
    entry_head,
    experts_modules,
    experts_problem,
    grouped_case_of,
    whatif_cases,
)
from cublaslt_probe.analysis.candidates import max_rel_diff
from cublaslt_probe.analysis.evidence import GROUPED_TORCH_OPS, TIMED_BACKENDS
from cublaslt_probe.cases import Case, group_sizes, grouped_alternatives, sizes_summary
from cublaslt_probe.dtypes import TORCH_NAMES
from cublaslt_probe.errors import error_text
from cublaslt_probe.gpu.compare import grouped_numerics
from cublaslt_probe.gpu.experts import experts_forward, quant_weight, route
from cublaslt_probe.gpu.timing import CallSpan, replayed_us

log = logging.getLogger(__name__)


def _row(rec: dict) -> dict:
    from cublaslt_probe.analysis.evidence import main_kernel
    return {"kernel": main_kernel(rec.get("kernels")), "kernels": rec.get("kernels") or [],
            "time_us": rec.get("time_us"), "error": rec.get("error"),
            "log_line": (rec.get("log_lines") or [None])[0]}


def _numerics(probe, c: Case, alts: list[tuple[str, Case]]) -> dict:
    """Max |y - y0| / max |y0| of each alternative against the original, on the same inputs (torch paths;
    a padded GEMM gets zero padding and is sliced back)."""
    torch = probe.torch
    dt = getattr(torch, TORCH_NAMES[c.dtype])
    gen = torch.Generator(device="cuda").manual_seed(0)

    def operands(cc: Case):
        A = torch.randn(cc.batch, cc.m, cc.k, device="cuda", generator=gen).mul_(0.5)
        B = torch.randn(cc.batch, cc.k, cc.n, device="cuda", generator=gen).mul_(0.5)
        return A, B

    A0, B0 = operands(c)

    def run(cc: Case, path: str):
        probe.builder.set_flags(Case(**{**cc.as_dict(), "backend": path}))
        A = torch.zeros(cc.batch, cc.m, cc.k, device="cuda")
        B = torch.zeros(cc.batch, cc.k, cc.n, device="cuda")
        A[:, :c.m, :c.k] = A0
        B[:, :c.k, :c.n] = B0
        a, b = A.to(dt), B.to(dt)
        if cc.layout[0] == "T":
            a = a.transpose(-1, -2).contiguous().transpose(-1, -2)
        if cc.layout[1] == "T":
            b = b.transpose(-1, -2).contiguous().transpose(-1, -2)
        if cc.op == "scaled_mm":
            one = torch.ones((), device="cuda")
            y = torch._scaled_mm(a[0], b[0], scale_a=one, scale_b=one, out_dtype=torch.bfloat16)[None]
        elif cc.op == "addmm":
            y = torch.addmm(torch.zeros(cc.n, device="cuda", dtype=dt), a[0], b[0])[None]
        elif cc.batch > 1:
            y = torch.bmm(a, b)
        else:
            y = torch.mm(a[0], b[0])[None]
        return y[:, :c.m, :c.n].float()

    out = {}
    try:
        y0 = run(c, c.backend)
        for label, alt in alts:
            if alt.backend == "lt":
                continue  # the raw cuBLASLt call has its own operands: its numerics are the candidates'
            try:
                y = run(alt, alt.backend)
                out[label] = max_rel_diff(y, y0)
            except Exception as e:  # noqa: BLE001
                out[label] = None
                log.info("numerics of %s failed: %s", label, e)
    finally:
        probe.builder.set_flags(c)
    return out


def batched_mm_variant(probe, c: Case, a, w) -> dict:
    """transformers' `batched_mm` experts forward for grouped GEMM `c` on the grouped GEMM's own operands (A
    [m, k] in group order, B [groups, k, n]): each row's expert weights gathered (``W[expert_ids]``) and one
    `torch.bmm` of m products of one row, timed with the gather as transformers runs it. Not run when the
    gathered weights exceed `BATCHED_MM_CAP` (``not_run`` says how much they would take)."""
    torch = probe.torch
    row = {"variant": "batched_mm", "key": None, "rows": c.m, "group_summary": None, "error": None,
           "time_us": None, "kernels": []}
    need = c.m * c.n * c.k * a.element_size()
    if need > BATCHED_MM_CAP:
        row["not_run"] = (f"it gathers each row's expert weights: {c.m:,} x {c.n:,} x {c.k:,} = {need / 2**30:,.1f} "
                          f"GiB (run up to {BATCHED_MM_CAP / 2**30:g} GiB)")
        return row
    ids = torch.repeat_interleave(torch.arange(c.groups, device="cuda"),
                                  torch.tensor(c.group_sizes(), device="cuda"))
    wt = w.transpose(-1, -2)            # [groups, n, k]: the weights as transformers stores them
    try:
        fn = (lambda: torch.bmm(wt[ids], a.unsqueeze(-1)))
        row["time_us"] = probe.time_gpu(fn, key="torch|batched_mm").median_us
        row["kernels"] = [k for k, _ in probe.profile([fn])[0]]
        row["output"] = fn().squeeze(-1)
    except Exception as e:  # noqa: BLE001  the other variants stand
        row.update(time_us=None, error=error_text(e))
        torch.cuda.synchronize()
    return row


def measure_grouped(probe, g: dict) -> dict:
    """One grouped GEMM's alternatives (the module doc): ``original`` and ``original_us``, ``grouped`` (the
    variants, `alternatives.time_grouped_alternatives` and `batched_mm_variant`), ``sizes_source`` and
    ``group_summary`` (the sizes measured), ``implementations``, ``numerics`` and ``tolerance`` (the original
    dtype's; fp8's for the fp8 variant, ``tolerance_fp8``); or ``skipped`` with the reason."""
    from cublaslt_probe.analysis import candidates as cand
    from cublaslt_probe.gpu.alternatives import time_grouped_alternatives
    c, why = grouped_case_of(g)
    if c is None:
        return {"skipped": why}
    src = g.get("sizes_source") or ("recorded" if g.get("group_sizes") else "assumed")
    out = {"case": c.key, "sizes_source": src, "group_summary": sizes_summary(c.group_sizes())}
    variants = time_grouped_alternatives(probe, c)
    alts = grouped_alternatives(c)
    b = probe.builder.build(alts["original"])
    try:
        a, w, offs = b.keep[0], b.keep[1], b.keep[2]
        ref = b.fn().float()
        bm = batched_mm_variant(probe, c, a, w) if c.op == "grouped_mm" and not c.split_k else None
        extra = {}
        if bm is not None:
            y = bm.pop("output", None)
            if y is not None:
                extra["batched_mm"] = y
            bm["saved_us"] = (round(variants[0]["time_us"] - bm["time_us"], 1)
                              if variants[0]["time_us"] and bm["time_us"] else None)
            variants.append(bm)
        num = grouped_numerics(probe, alts, a, w, offs, ref, extra)
    finally:
        b.close()
    for v in variants:
        if v["variant"] == "mm_per_group":
            num["mm_per_group"] = v.pop("max_rel_diff", None)
        v["kernel"] = _row(v)["kernel"]
    first = variants[0]
    out.update(original=_row(first), original_us=first["time_us"], grouped=variants,
               implementations={k: v for k, v in EXPERTS_IMPLEMENTATIONS.items()
                                if any(x["variant"] == v for x in variants)},
               numerics=num, tolerance=cand.tolerance(c.dtype), tolerance_fp8=cand.tolerance("fp8"))
    return out


def graph_times(probe, cases: list[Case], calls: int = GRAPH_CALLS, reps: int = GRAPH_REPS) -> list[dict]:
    """Each case's time per call replayed from a CUDA graph (`timing.replayed_us`: torch's recipe, warmed up on a side
    stream, captured with its flags set). A GEMM that a program's graph replays pays no launch per call, so its
    alternatives are timed the same way. One dict per case: ``graph_us`` (None when it cannot be captured) and
    ``graph_error`` (why)."""
    torch = probe.torch
    out = []
    for c in cases:
        if c.backend not in GRAPH_PATHS:
            out.append({"graph_us": None, "graph_error": f"the {c.backend} path is not captured into a graph"})
            continue
        b = None
        try:
            probe.builder.set_flags(c)
            b = probe.builder.build(c)
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):
                    b.fn()
            torch.cuda.current_stream().wait_stream(side)
            out.append({"graph_us": replayed_us(torch, b.fn, side, calls, reps), "graph_error": None})
        except Exception as e:  # noqa: BLE001  the eager time stands for this one
            torch.cuda.synchronize()
            out.append({"graph_us": None, "graph_error": error_text(e)})
        finally:
            if b is not None:
                b.close()
    return out


def graph_candidate_times(probe, c: Case, top: int, calls: int = GRAPH_CALLS, reps: int = GRAPH_REPS) -> dict:
    """The heuristic's first `top` cuBLASLt candidates of `c` (as `alternatives.lt_candidates` asks for them:
    same problem, workspace and alignment, so the same ranks), each replayed from a CUDA graph
    (`timing.replayed_us`) on a stream of its own (the call is bound to the stream it was built on). Returns
    {rank: µs or None}."""
    from cublaslt_probe.gpu.operands import CUBLAS_WORKSPACE, lt_problem
    torch = probe.torch
    out: dict[int, float | None] = {}
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), probe.lt_gemm(lt_problem(Case(**{**c.as_dict(), "backend": "lt"}),
                                                           CUBLAS_WORKSPACE)) as g:
        for rank, r in enumerate(g.heuristic(top)):
            try:
                fn = g.call(r.algo)
                for _ in range(3):
                    fn()
                out[rank] = replayed_us(torch, fn, side, calls, reps)
            except Exception as e:  # noqa: BLE001  its eager time stands
                torch.cuda.synchronize()
                out[rank] = None
                log.info("graph timing of candidate %d failed: %s", rank, e)
    torch.cuda.current_stream().wait_stream(side)
    return out


def use_graph_times(probe, entry: dict, todo: list[Case], recs: list[dict]) -> None:
    """For a GEMM that its program replays from a CUDA graph: each record of `recs` (the original, the paths,
    the what-ifs, timed eagerly by `Probe.run_window`) takes its graph-replayed time (`graph_times`) as
    ``time_us``, its eager time kept as ``eager_us``; one whose graph could not be captured keeps the eager
    time and says why. `entry` says ``timing``: graph-replayed (`GRAPH_TIMING`)."""
    for rec, t in zip(recs, graph_times(probe, todo)):
        rec["eager_us"] = rec.get("time_us")
        if t["graph_us"] is not None:
            rec["time_us"] = t["graph_us"]
        else:
            rec["graph_error"] = t["graph_error"]
    entry["timing"] = "graph"
    entry["timing_note"] = GRAPH_TIMING


def use_graph_candidate_times(probe, c: Case, entry: dict, top: int) -> None:
    """For a graph-timed GEMM: each of `entry`'s candidate rows takes its graph-replayed time
    (`graph_candidate_times`) as ``time_us``, its eager time kept as ``eager_us``; so does the raw cuBLASLt path
    (``lt``: the heuristic's candidate 0 with the same workspace). One that could not be replayed keeps the
    eager time and says so (``graph_error``)."""
    try:
        times = graph_candidate_times(probe, c, top)
    except Exception as e:  # noqa: BLE001  the eager times stand, with the reason
        times, why = {}, error_text(e)
    else:
        why = "not replayed from a graph"
    rows = [(row, row.get("rank")) for row in entry.get("candidates") or []]
    rows += [(p, 0) for p in entry.get("paths") or [] if p.get("path") == "lt"]
    for row, rank in rows:
        t = times.get(rank)
        row["eager_us"] = row.get("time_us")
        row.pop("graph_error", None)
        if t is not None:
            row["time_us"] = t
        else:
            row["graph_error"] = why


def _graph_fields(rows: list[dict], recs: list[dict]) -> None:
    """Carry each record's eager time and graph error into its output row (`use_graph_times`)."""
    for row, rec in zip(rows, recs):
        for k in ("eager_us", "graph_error"):
            if rec.get(k) is not None:
                row[k] = rec[k]


def measure_experts(probe, rows: list[dict]) -> dict:
    """A module's experts rebuilt from its audited grouped rows (`experts_problem`: the recorded sizes, the
    router's top-k) and each variant of `experts_forward` timed as the whole call the program makes (forward;
    forward and backward where the module has backward rows): the CUDA-event span of one call from a
    synchronised start, host launches and synchronisations inside it included, medians over rounds that run
    every variant once in turn (order reversed each round). ``balanced`` is ``original`` on a routing of
    the same rows split evenly (a router's change). ``variants``: name, time_us (per call), saved_us, error
    or not_run; ``numerics``: each variant's output against ``original``'s on the same inputs (forward).
    Returns ``problem``, ``scope`` and ``calls`` too, or ``skipped`` with the reason."""
    out = _measure_experts(probe, rows)
    if "skipped" not in out:
        probe.torch.cuda.empty_cache()   # the inputs and weights went with _measure_experts' frame
    return out


# Long: one module's experts measured in order (the problem, its inputs, every variant built, the rounds timed,
# the numerics), the variants sharing the inputs and the timing rounds; it runs only on a GPU
# (tests/test_gpu_grouped_audit.py).
def _measure_experts(probe, rows: list[dict]) -> dict:
    t0 = time.perf_counter()
    prob, why = experts_problem(rows)
    if prob is None:
        return {"skipped": why}
    torch = probe.torch
    E, H, II, T, k = prob["experts"], prob["hidden"], prob["inter"], prob["tokens"], prob["top_k"]
    dt = getattr(torch, TORCH_NAMES[prob["dtype"]])
    gen = torch.Generator(device="cuda").manual_seed(0)
    w1 = (torch.randn(E, 2 * II, H, device="cuda", generator=gen) * 0.02).to(dt)
    w2 = (torch.randn(E, H, II, device="cuda", generator=gen) * 0.02).to(dt)
    x = torch.randn(T, H, device="cuda", generator=gen).to(dt)
    wts = torch.softmax(torch.randn(T, k, device="cuda", generator=gen), dim=-1).to(dt)
    idx = route(torch, prob["sizes"], T, k)
    bal = route(torch, group_sizes("uniform", T * k, E), T, k)
    train = prob["train"]
    cache: dict = {}

    def fp8_weights(w):
        if train:                      # training: the weights change every step, quantized every call
            return quant_weight(w.detach())
        if id(w) not in cache:         # inference: quantized once
            cache[id(w)] = quant_weight(w.detach())
        return cache[id(w)]
    names = [v for v in EXPERTS_VARIANTS if v in ("original", "balanced", "mm_per_group", "bmm_padded")
             or v.startswith("pad") or (v == "fp8" and prob["dtype"] == "bf16")]
    out = {"module": (rows[0].get("module")), "groups": E, "calls": prob["calls"],
           "scope": "forward and backward" if train else "forward", "problem": {
               kk: v for kk, v in prob.items() if kk != "sizes"}, "sizes_source": prob["sizes_source"]}
    need = T * k * (w1[0].numel() + w2[0].numel()) * w1.element_size()
    not_run = {}
    if need > BATCHED_MM_CAP:
        not_run["batched_mm"] = (f"it gathers each routed row's expert weights: {need / 2**30:,.1f} GiB (run up "
                                 f"to {BATCHED_MM_CAP / 2**30:g} GiB)")
    else:
        names.append("batched_mm")
    if train:
        for w in (w1, w2, x):
            w.requires_grad_(True)
        gy = torch.randn(T, H, device="cuda", generator=gen).to(dt)

    def call(name):
        ti = bal if name == "balanced" else idx
        v = "original" if name == "balanced" else name
        if train:
            w1.grad = w2.grad = x.grad = None
            return lambda: experts_forward(w1, w2, x, ti, wts, variant=v, fp8_weights=fp8_weights).backward(gy)
        return lambda: experts_forward(w1, w2, x, ti, wts, variant=v, fp8_weights=fp8_weights)
    errors: dict[str, str] = {}
    numerics: dict[str, float | None] = {}
    with torch.no_grad():
        ref = None
        for n in names:
            try:
                y = experts_forward(w1, w2, x, bal if n == "balanced" else idx, wts,
                                    variant="original" if n == "balanced" else n, fp8_weights=fp8_weights)
                if n == "original":
                    ref = y.float()
                elif n != "balanced" and ref is not None:
                    numerics[n] = max_rel_diff(y.float(), ref)
            except Exception as e:  # noqa: BLE001  the variant is reported, the others go on
                errors[n] = error_text(e)
                torch.cuda.synchronize()
    timed = [n for n in names if n not in errors]
    span = CallSpan(torch)
    warm = {}
    for n in list(timed):
        try:
            span.span_us(call(n))
            warm[n] = span.span_us(call(n))
        except Exception as e:  # noqa: BLE001
            errors[n] = error_text(e)
            timed.remove(n)
            torch.cuda.synchronize()
    rounds = max(5, min(15, int(EXPERTS_BUDGET_S * 1e6 / max(1.0, sum(warm.values())))))
    samples = span.rounds(call, timed, rounds)
    if train:
        for w in (w1, w2, x):
            w.grad = None
    med = {n: statistics.median(v) for n, v in samples.items() if v}
    base = med.get("original")
    out["variants"] = [{"variant": n, "time_us": round(med[n], 1) if n in med else None,
                        "reps": len(samples.get(n, [])),
                        "saved_us": round(base - med[n], 1) if base and n in med else None,
                        "error": errors.get(n)} for n in names] + [
        {"variant": n, "time_us": None, "reps": 0, "saved_us": None, "error": None, "not_run": why}
        for n, why in not_run.items()]
    out["numerics"] = numerics
    out["tolerance_fp8"] = _tolerance("fp8")
    out["tolerance"] = _tolerance(prob["dtype"])
    out["rounds"] = rounds
    out["seconds"] = round(time.perf_counter() - t0, 3)
    return out


def _tolerance(dtype: str):
    from cublaslt_probe.analysis import candidates as cand
    return cand.tolerance(dtype)


def measure_experts_modules(probe, gemms: list[dict]) -> list[dict]:
    """`measure_experts` for every module with grouped GEMMs among `gemms` (one entry per module and
    groups; errors reported, not raised)."""
    out = []
    for (module, groups), rows in experts_modules(gemms).items():
        try:
            e = measure_experts(probe, rows)
        except Exception as ex:  # noqa: BLE001  one module that cannot run is reported, the others go on
            e = {"error": error_text(ex)}
            probe.torch.cuda.synchronize()
        e.setdefault("module", module)
        e.setdefault("groups", groups)
        out.append(e)
        log.info("measured the experts of %s in %s s", module, e.get("seconds"))
    return out


def measure_gemms(gemms: list[dict], *, top: int = 8, reps: int = 10, allow_tf32: bool = False,
                  probe=None, whatifs: bool = True) -> dict:
    """Measure the alternatives of each GEMM in `gemms` (dicts as `case_of` takes them, with any extra keys —
    `module`, `calls`, `kernel` — carried into the result). Returns {"env", "gemms": [...], "seconds"}."""
    from cublaslt_probe.analysis import candidates as cand
    from cublaslt_probe.gpu.alternatives import lt_candidates
    from cublaslt_probe.gpu.probe import Probe
    t_all = time.perf_counter()
    probe = probe or Probe(reps=reps, pipeline=False)  # GEMMs timed one at a time, no windows
    results = []
    for g in gemms:
        t0 = time.perf_counter()
        entry = entry_head(g)
        if g.get("op") in GROUPED_TORCH_OPS:
            try:
                entry.update(measure_grouped(probe, g))
            except Exception as e:  # noqa: BLE001  one GEMM that cannot run is reported, the others go on
                entry["error"] = error_text(e)
            entry["seconds"] = round(time.perf_counter() - t0, 3)
            results.append(entry)
            log.info("measured grouped %s in %.2f s", entry.get("case") or entry["key"], entry["seconds"])
            continue
        c, why = case_of(g, allow_tf32=allow_tf32)
        if c is None:
            entry["skipped"] = why
            results.append(entry)
            continue
        entry["case"] = c.key
        paths = [Case(**{**c.as_dict(), "backend": p}) for p in TIMED_BACKENDS if p != c.backend]
        wi = whatif_cases(c) if whatifs else []
        todo = [c] + paths + [alt for _, _, alt in wi]
        try:
            recs = probe.run_window(todo)
        except Exception as e:  # noqa: BLE001  one GEMM that cannot run is reported, the others go on
            entry["error"] = error_text(e)
            results.append(entry)
            continue
        if g.get("graph") is not None:      # replayed from a CUDA graph in the program: timed the same way
            use_graph_times(probe, entry, todo, recs)
        entry["original"] = _row(recs[0])
        entry["original_us"] = recs[0].get("time_us")
        entry["paths"] = [{"path": p.backend, "workspace": probe.heuristic_workspace(p), **_row(r)}
                          for p, r in zip(paths, recs[1:1 + len(paths)])]
        entry["whatifs"] = [{"dim": d, "multiple": mult, "value": getattr(alt, d), **_row(r)}
                            for (d, mult, alt), r in zip(wi, recs[1 + len(paths):])]
        if entry.get("timing") == "graph":
            _graph_fields([entry["original"], *entry["paths"], *entry["whatifs"]], recs)
        try:
            cands = lt_candidates(probe, Case(**{**c.as_dict(), "backend": "lt"}), top=top, reps=reps)
            entry["candidates"] = [{**{k: v for k, v in r.items() if k not in ("kernels", "kernel_us")},
                                    "kernel": _row(r)["kernel"], "ok_numerics": cand.usable(r, c.dtype)}
                                   for r in cands]
            entry["regret"] = cand.regret(cands, c.dtype)
            if entry.get("timing") == "graph":     # the original is graph-replayed: its candidates too
                use_graph_candidate_times(probe, c, entry, top)
        except Exception as e:  # noqa: BLE001
            entry["candidates_error"] = error_text(e)
        labels = [(f"path:{p.backend}", p) for p in paths] + [(f"{d}={getattr(alt, d)}", alt) for d, _, alt in wi]
        entry["numerics"] = _numerics(probe, c, labels)
        entry["tolerance"] = cand.tolerance(c.dtype)
        entry["seconds"] = round(time.perf_counter() - t0, 3)
        results.append(entry)
        log.info("measured %s in %.2f s", c.key, entry["seconds"])
    out = {"env": probe.env, "gemms": results}
    if any(g.get("op") in GROUPED_TORCH_OPS for g in gemms):
        out["experts"] = measure_experts_modules(probe, gemms)
    out["seconds"] = round(time.perf_counter() - t_all, 3)
    return out


