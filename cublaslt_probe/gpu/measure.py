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
original on the same operands (`_grouped_numerics`); ``implementations`` maps transformers'
`config._experts_implementation` values to the variants that run as they do (`EXPERTS_IMPLEMENTATIONS`).
Each experts module whose two forward grouped GEMMs are measured is also rebuilt and timed as one whole call of
the program (`measure_experts`, under ``experts``): a GEMM's alternative is not the change a program makes, and
the advice's saving rests on the whole call.

A GEMM its program replays from a CUDA graph (the audit row's ``graph``) is timed replayed from a graph too
(`use_graph_times`: ``timing`` = graph, each time's eager value kept as ``eager_us``): a graph pays no launch per
call, which changes what a small GEMM's alternatives cost.

GEMMs the probe cannot rebuild (a 3-D x 3-D grouped GEMM's equal groups, Triton templates, ops it does not
know) are listed with the reason, not dropped. Imports torch only inside functions (GPU side).
"""
from __future__ import annotations

import json
import logging
import math
import statistics
import time

from cublaslt_probe.analysis.candidates import max_rel_diff
from cublaslt_probe.analysis.evidence import GROUPED_TORCH_OPS, TIMED_BACKENDS, TORCH_OPS, path_of
from cublaslt_probe.cases import (
    SPLIT_K,
    Case,
    group_sizes,
    grouped_alternatives,
    invalid_reason,
    sizes_code,
    sizes_summary,
)
from cublaslt_probe.dtypes import SWEEP_DTYPES, TORCH_NAMES
from cublaslt_probe.errors import CaptureError, error_text

log = logging.getLogger(__name__)

PAD_MULTIPLES = (8, 16, 64, 128)
# transformers 5.x `config._experts_implementation` -> the variant that runs its expert GEMMs as it does
# ("deepgemm" runs DeepGEMM's kernels, which the probe does not build)
EXPERTS_IMPLEMENTATIONS = {"grouped_mm": "original", "eager": "mm_per_group", "batched_mm": "batched_mm"}
BATCHED_MM_CAP = 8 << 30   # bytes of per-row gathered weights up to which transformers' batched_mm is timed


def case_of(g: dict, *, allow_tf32: bool = False) -> tuple[Case | None, str | None]:
    """The probe Case of one audited GEMM (a dict with op, dtype, layout, m, n, k, batch and, optionally,
    ``backend`` — ``torch`` for the cuBLAS path, ``torch-lt`` for the cuBLASLt one — or the joined log line's
    ``log_function``), or why there is none."""
    op = TORCH_OPS.get(g.get("op") or "")
    if op is None:
        return None, f"op {g.get('op')!r} is not one the probe rebuilds (mm, addmm, bmm, _scaled_mm)"
    if g.get("groups"):
        return None, "a grouped GEMM: the probe times single GEMMs"
    dtype = SWEEP_DTYPES.get(g.get("dtype") or "")
    if dtype is None:
        return None, f"dtype {g.get('dtype')!r} is not one the probe runs"
    if dtype == "fp32" and allow_tf32:
        dtype = "tf32"
    if None in (g.get("m"), g.get("n"), g.get("k")) or not g.get("layout"):
        return None, "the trace gives no shapes or strides for it (record_shapes=True rebuilds them)"
    batch = int(g.get("batch") or 1)
    if op == "mm" and batch > 1:
        op = "bmm"
    backend = g.get("backend")
    if backend not in ("torch", "torch-lt"):
        # the joined log line says which path ran; without a log line, torch's default (cuBLAS)
        backend = path_of(g.get("log_function")) or "torch"
    c = Case(backend, op, dtype, g["layout"], int(g["m"]), int(g["n"]), int(g["k"]), batch)
    why = invalid_reason(c)
    return (None, why) if why else (c, None)


def pad_values(v: int) -> list[tuple[int, int]]:
    """(multiple, padded value) for each multiple in PAD_MULTIPLES that changes `v`; one entry per value."""
    out, seen = [], set()
    for mult in PAD_MULTIPLES:
        p = int(math.ceil(v / mult) * mult)
        if p != v and p not in seen:
            seen.add(p)
            out.append((mult, p))
    return out


def whatif_cases(c: Case) -> list[tuple[str, int, Case]]:
    """(dimension, multiple, Case) for every padded variant of `c` (on its own path)."""
    out = []
    for dim in ("m", "n", "k"):
        for mult, p in pad_values(getattr(c, dim)):
            kw = {**c.as_dict(), dim: p}
            alt = Case(**kw)
            if invalid_reason(alt) is None:
                out.append((dim, mult, alt))
    return out


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


def grouped_case_of(g: dict) -> tuple[Case | None, str | None]:
    """The probe Case of one audited grouped GEMM (a dict with op, dtype, layout, m, n, k, batch, groups,
    group_dim and the audit's ``group_sizes``, a JSON list; equal sizes without it), or why there is none.
    Offsets along m give the 2-D x 3-D form, offsets along k the weight gradient's (`Case.split_k`)."""
    op = GROUPED_TORCH_OPS.get(g.get("op") or "")
    if op is None:
        return None, f"op {g.get('op')!r} is not a grouped GEMM"
    if int(g.get("batch") or 1) > 1:
        return None, "a 3-D x 3-D grouped GEMM: its groups are equal, there are no sizes to change"
    dim = g.get("group_dim")
    if dim not in ("m", "k"):
        return None, (f"its offsets split {dim or 'an unknown dimension'}: the probe rebuilds grouped GEMMs whose "
                      "offsets split the rows (m) or, the weight gradient's, k")
    dtype = SWEEP_DTYPES.get(g.get("dtype") or "")
    if None in (g.get("m"), g.get("n"), g.get("k"), g.get("groups")) or not g.get("layout") or dtype is None:
        return None, "the trace gives no shapes, strides or dtype for it (record_shapes=True rebuilds them)"
    m, groups = int(g["m"]), int(g["groups"])
    total = int(g["k"]) if dim == "k" else m
    try:
        sizes = json.loads(g["group_sizes"]) if g.get("group_sizes") else group_sizes("uniform", total, groups)
        c = Case("torch", op, dtype, g["layout"], m, int(g["n"]), int(g["k"]), 1, groups,
                 (SPLIT_K if dim == "k" else "") + sizes_code(sizes))
    except (TypeError, ValueError) as e:
        return None, f"its group sizes cannot be used: {e}"
    why = invalid_reason(c)
    return (None, why) if why else (c, None)


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


def _padded_rows(torch, sizes: list[int], padded: list[int]):
    """(the rows of the padded problem that hold the original groups' rows, in order; the padded problem's
    offsets as torch's grouped GEMM takes them): group g's rows start where the padded groups before it end."""
    ends = [0]
    for x in padded:
        ends.append(ends[-1] + x)
    idx = torch.cat([torch.arange(ends[g], ends[g] + c, device="cuda") for g, c in enumerate(sizes)])
    return idx, torch.tensor(ends[1:], dtype=torch.int32, device="cuda")


def _grouped_numerics(probe, alts: dict, a, w, offs, ref, extra: dict) -> dict:
    """Max |y - y0| / max |y0| against the grouped GEMM's output `ref` on its own operands: every group
    padded with zero rows (the real rows read back), all groups padded to the largest in one `torch.bmm`, fp8
    (row-wise scales from each row's and each expert column's max), and the outputs already made
    (`extra`: name -> output in group order). Balanced sizes are another routing: not compared."""
    torch = probe.torch
    sizes = alts["original"].group_sizes()
    starts = [0]
    for x in sizes:
        starts.append(starts[-1] + x)
    out: dict[str, float | None] = {}
    if alts["original"].split_k:
        return _split_k_numerics(torch, alts, a, w, ref, sizes, starts, extra)

    def rel(y) -> float:
        return max_rel_diff(y.float(), ref)

    def put(name, make):
        try:
            out[name] = rel(make())
        except Exception as e:  # noqa: BLE001
            out[name] = None
            log.info("numerics of %s failed: %s", name, e)
    for name, alt in alts.items():
        if name.startswith("pad"):
            def padded(alt=alt):
                idx, po = _padded_rows(torch, sizes, alt.group_sizes())
                ap = torch.zeros(alt.m, a.shape[1], device="cuda", dtype=a.dtype)
                ap[idx] = a
                return torch._grouped_mm(ap, w, offs=po)[idx]
            put(name, padded)
        elif name == "bmm_padded":
            def bmm():
                big = max(sizes)
                ab = torch.zeros(len(sizes), big, a.shape[1], device="cuda", dtype=a.dtype)
                for g, n in enumerate(sizes):
                    ab[g, :n] = a[starts[g]:starts[g] + n]
                y = torch.bmm(ab, w)
                return torch.cat([y[g, :n] for g, n in enumerate(sizes)])
            put(name, bmm)
        elif name == "fp8":
            def fp8():
                f8 = torch.float8_e4m3fn
                top = torch.finfo(f8).max
                sa = (a.float().abs().amax(dim=1) / top).clamp_min(1e-12)
                sb = (w.float().abs().amax(dim=1) / top).clamp_min(1e-12)          # [groups, n]
                a8 = (a.float() / sa[:, None]).to(f8)
                w8 = (w.float() / sb[:, None, :]).to(f8).transpose(-1, -2).contiguous().transpose(-1, -2)
                return torch._scaled_grouped_mm(a8, w8, sa, sb, offs=offs, out_dtype=torch.bfloat16)
            put(name, fp8)
    for name, y in extra.items():
        put(name, lambda y=y: y)
    return out


def _split_k_numerics(torch, alts: dict, a, w, ref, sizes: list[int], starts: list[int], extra: dict) -> dict:
    """`_grouped_numerics` of a split-k grouped GEMM (A [m, K] column-major, B [K, n], output [groups, m, n]):
    every group padded along k with zero rows of A's columns and B's rows, and every group padded to the largest
    as one `torch.bmm`, each against the original's output, the empty groups' outputs left out."""
    live = [g for g, n in enumerate(sizes) if n]
    out: dict[str, float | None] = {}

    def put(name, make):
        try:
            out[name] = max_rel_diff(make().float()[live], ref[live])
        except Exception as e:  # noqa: BLE001
            out[name] = None
            log.info("numerics of %s failed: %s", name, e)
    m, n = a.shape[0], w.shape[1]
    for name, alt in alts.items():
        if name.startswith("pad"):
            def padded(alt=alt):
                idx, po = _padded_rows(torch, sizes, alt.group_sizes())
                ap = torch.zeros(alt.k, m, device="cuda", dtype=a.dtype)
                ap[idx] = a.t()
                bp = torch.zeros(alt.k, n, device="cuda", dtype=w.dtype)
                bp[idx] = w
                return torch._grouped_mm(ap.t(), bp, offs=po)
            put(name, padded)
        elif name == "bmm_padded":
            def bmm():
                big = max(sizes)
                ab = torch.zeros(len(sizes), m, big, device="cuda", dtype=a.dtype)
                bb = torch.zeros(len(sizes), big, n, device="cuda", dtype=w.dtype)
                for g, c in enumerate(sizes):
                    ab[g, :, :c] = a[:, starts[g]:starts[g] + c]
                    bb[g, :c] = w[starts[g]:starts[g] + c]
                return torch.bmm(ab, bb)
            put(name, bmm)
    for name, y in extra.items():
        put(name, lambda y=y: y)
    return out


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
        num = _grouped_numerics(probe, alts, a, w, offs, ref, extra)
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


GRAPH_CALLS = 16     # calls of one GEMM captured into the CUDA graph that `graph_times` replays
GRAPH_REPS = 10      # replays timed (the median is kept)
GRAPH_PATHS = ("torch", "torch-lt")   # paths `graph_times` captures (the raw cuBLASLt path's call: its candidates')
GRAPH_TIMING = (f"graph-replayed: {GRAPH_CALLS} calls of the GEMM (and of each alternative and heuristic "
                f"candidate) captured in one CUDA graph, the median of {GRAPH_REPS} replays per call, as the "
                "program's graph runs them")


def _replayed_us(torch, fn, stream, calls: int, reps: int) -> float:
    """The median µs per call of `fn` (a zero-argument launch on `stream`, warmed up) replayed from a CUDA graph
    that holds `calls` calls of it: the CUDA-event span of each of `reps` replays divided by `calls`."""
    import statistics
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=stream):
        for _ in range(calls):
            fn()
    try:
        g.replay()
        per = []
        for _ in range(reps):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            g.replay()
            e1.record()
            e1.synchronize()
            per.append(e0.elapsed_time(e1) * 1e3 / calls)
        return round(statistics.median(per), 3)
    finally:
        del g


def graph_times(probe, cases: list[Case], calls: int = GRAPH_CALLS, reps: int = GRAPH_REPS) -> list[dict]:
    """Each case's time per call replayed from a CUDA graph (`_replayed_us`: torch's recipe, warmed up on a side
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
            out.append({"graph_us": _replayed_us(torch, b.fn, side, calls, reps), "graph_error": None})
        except Exception as e:  # noqa: BLE001  the eager time stands for this one
            torch.cuda.synchronize()
            out.append({"graph_us": None, "graph_error": error_text(e)})
        finally:
            if b is not None:
                b.close()
    return out


def graph_candidate_times(probe, c: Case, top: int, calls: int = GRAPH_CALLS, reps: int = GRAPH_REPS) -> dict:
    """The heuristic's first `top` cuBLASLt candidates of `c` (as `alternatives.lt_candidates` asks for them: same
    problem, workspace and alignment, so the same ranks), each replayed from a CUDA graph (`_replayed_us`) on a
    stream of its own (the call is bound to the stream it was built on). Returns {rank: µs or None}."""
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
                out[rank] = _replayed_us(torch, fn, side, calls, reps)
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


def graph_note(measure: dict | None) -> str | None:
    """The line that says which measured GEMMs were timed replayed from a CUDA graph; None when none was."""
    n = sum(1 for g in (measure or {}).get("gemms") or [] if g.get("timing") == "graph")
    if not n:
        return None
    return f"{n} GEMM{'s' if n != 1 else ''} from CUDA graphs: times {GRAPH_TIMING}"


# --- the experts' whole forward ------------------------------------------------------------------------------
EXPERTS_VARIANTS = ("original", "pad8", "pad16", "pad128", "balanced", "bmm_padded", "fp8", "mm_per_group",
                    "batched_mm")
F8_MAX = 448.0        # torch.finfo(torch.float8_e4m3fn).max
EXPERTS_BUDGET_S = 1.0   # timed rounds of a module's variants are sized to about this long (5 to 15 rounds)


def experts_problem(rows: list[dict]) -> tuple[dict | None, str | None]:
    """The experts module that a module's audited grouped rows (dicts as `measure_gemms` takes them) run, or
    why it cannot be rebuilt (pure): its forward pair, gate+up ([rows, hidden] -> 2 x intermediate) and down
    (intermediate -> hidden), offsets along m, the same groups and rows: ``experts`` (E), ``hidden``,
    ``inter``, ``rows`` (S = tokens x top-k), ``top_k`` and ``tokens`` (`grouped.top_k`; 1 and S where no
    router was found: ``top_k_source`` says which), ``sizes`` (gate+up's, in expert order), ``sizes_source``,
    ``calls`` per step, ``train`` (the module has backward rows: a call is timed forward and backward),
    ``dtype``."""
    fwd = [r for r in rows if r.get("group_dim") == "m" and r.get("pass") == "fwd"]
    if not fwd:
        return None, "no forward grouped GEMM with offsets along the rows among the measured"
    up = down = None
    for a in fwd:
        for b in fwd:
            if (a is not b and int(b["n"]) == int(a["k"]) and int(a["n"]) == 2 * int(b["k"])
                    and int(a["m"]) == int(b["m"]) and int(a["groups"]) == int(b["groups"])):
                up, down = a, b
    if up is None:
        return None, ("its forward gate+up (n = 2 x intermediate) and down (k = intermediate) grouped GEMMs are not "
                      "both among the measured (the rebuild covers gated experts: raise --top-measure)")
    S, E = int(up["m"]), int(up["groups"])
    try:
        sizes = [int(x) for x in json.loads(up["group_sizes"])] if up.get("group_sizes") else None
    except (TypeError, ValueError):
        sizes = None
    if not sizes or len(sizes) != E or sum(sizes) != S:
        sizes = group_sizes("uniform", S, E)
    k = up.get("group_top_k")
    k = int(k) if isinstance(k, (int, float)) and not (isinstance(k, float) and math.isnan(k)) and k else None
    if not k or S % k or max(sizes) > S // k or k > E:
        k, src = 1, "assumed 1 (no router GEMM of n = experts found beside the module)"
    else:
        src = "router"
    dtype = SWEEP_DTYPES.get(up.get("dtype") or "")
    if dtype not in ("bf16", "fp16"):
        return None, f"dtype {up.get('dtype')!r}: the rebuild runs bf16 and fp16 experts"
    train = any(r.get("pass") == "bwd" for r in rows)
    return {"experts": E, "hidden": int(up["k"]), "inter": int(down["k"]), "rows": S, "top_k": k,
            "tokens": S // k, "top_k_source": src, "sizes": sizes,
            "sizes_source": up.get("sizes_source") or ("recorded" if up.get("group_sizes") else "assumed"),
            "calls": float(up.get("calls") or 1), "train": train, "dtype": dtype}, None


def silu_gate(h):
    """transformers' `_apply_gate` of gated experts (Mixtral, Qwen3-MoE, ...): act(gate) * up, gate first."""
    import torch
    g, u = h.chunk(2, dim=-1)
    return torch.nn.functional.silu(g) * u


def quant_rows(t):
    """e4m3 copy of 2-D `t` and its row-wise scales (max |row| / F8_MAX)."""
    import torch
    s = (t.abs().amax(dim=-1).float() / F8_MAX).clamp_min(1e-12)
    return (t.float() / s.unsqueeze(-1)).to(torch.float8_e4m3fn), s


def quant_weight(w):
    """e4m3 copy of expert weights `w` [E, n, k] and their scales [E, n] (one per expert column of the GEMM)."""
    import torch
    s = (w.abs().amax(dim=2).float() / F8_MAX).clamp_min(1e-12)
    return (w.float() / s[..., None]).to(torch.float8_e4m3fn), s


_FP8: list = []


def _fp8_grouped():
    """A grouped linear x @ W^T (W [E, n, k], offsets along x's rows) with an fp8 forward (the activations
    quantized by `quant`, the weights given quantized) and the bf16 backward products autograd forms for
    `_grouped_mm` (data gradient: offsets along m; weight gradient: offsets along k)."""
    if _FP8:
        return _FP8[0]
    import torch

    class Fp8Grouped(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, offs, w8, sw, quant):
            x8, sx = quant(x)
            ctx.save_for_backward(x, w, offs)
            return torch._scaled_grouped_mm(x8, w8.transpose(-2, -1), sx, sw, offs=offs, out_dtype=x.dtype)

        @staticmethod
        def backward(ctx, g):
            x, w, offs = ctx.saved_tensors
            gx = torch._grouped_mm(g, w, offs=offs) if ctx.needs_input_grad[0] else None
            gw = torch._grouped_mm(g.transpose(-2, -1), x, offs=offs) if ctx.needs_input_grad[1] else None
            return gx, gw, None, None, None, None
    _FP8.append(Fp8Grouped.apply)
    return _FP8[0]


def experts_forward(w1, w2, hidden, top_k_index, top_k_weights, *, variant: str = "original", gate=None,
                    fp8_weights=None):
    """An MoE layer's experts, gated, weights as transformers 5.x stores them (`w1` gate+up [E, 2I, H], `w2`
    down [E, H, I], no bias), run the way `variant` would really be built, gathers, padding and host
    synchronisations included:

    - ``original``: transformers' `grouped_mm` experts forward written out (token gather, argsort by expert,
      `histc` sizes, two `torch._grouped_mm`, the gate, the routing weights, the inverse permutation, the sum
      over top-k);
    - ``pad<M>``: the same with each expert's rows placed at a multiple of M (zero rows between the groups,
      offsets of the padded sizes, a host-side bound on the rows: no synchronisation), the real rows gathered
      back; under autograd the rows past the last group are zeroed after the first GEMM (its backward reads
      them);
    - ``bmm_padded``: every expert padded to the largest group, one `torch.bmm` per projection (the largest
      group read on the host: one synchronisation per call);
    - ``fp8``: ``original`` with both projections through `torch._scaled_grouped_mm` (e4m3, row-wise scales;
      `fp8_weights(w)` gives a projection's e4m3 weights and scales, the activations quantized each call in eager
      torch; the backward stays in the weights' dtype);
    - ``mm_per_group``: transformers' ``eager`` experts (a loop over the experts hit: `torch.where`, gather,
      two `linear`, `index_add_`; a host synchronisation per expert);
    - ``batched_mm``: transformers' ``batched_mm`` experts (each routed row's expert weights gathered, one
      `torch.bmm` of one-row products per projection).
    `gate` is the module's gate (`silu_gate` when None). Returns [tokens, H] in `hidden`'s dtype."""
    import torch
    gate = gate or silu_gate
    dev, E = hidden.device, w1.shape[0]
    T, k = top_k_index.shape
    S = T * k
    token_idx = torch.arange(T, device=dev).unsqueeze(1).expand(-1, k).reshape(-1)
    if variant == "mm_per_group":
        final = torch.zeros_like(hidden)
        with torch.no_grad():
            mask = torch.nn.functional.one_hot(top_k_index, num_classes=E).permute(2, 1, 0)
            hit = torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero()
        for e in hit:
            e = e[0]
            if e == E:
                continue
            pos, tok = torch.where(mask[e])
            h = gate(torch.nn.functional.linear(hidden[tok], w1[e]))
            h = torch.nn.functional.linear(h, w2[e]) * top_k_weights[tok, pos, None]
            final.index_add_(0, tok, h.to(final.dtype))
        return final
    if variant == "batched_mm":
        ids = top_k_index.reshape(-1)
        h = gate(torch.bmm(w1[ids], hidden[token_idx].unsqueeze(-1)).squeeze(-1))
        y = torch.bmm(w2[ids], h.unsqueeze(-1)).squeeze(-1) * top_k_weights.reshape(-1).unsqueeze(-1)
        return y.view(T, k, -1).sum(dim=1).to(hidden.dtype)
    expert_ids = top_k_index.reshape(-1)
    selected = hidden[token_idx]
    perm = torch.argsort(expert_ids)
    inv_perm = torch.argsort(perm)
    ids_g = expert_ids[perm]
    w_g = top_k_weights.reshape(-1)[perm]
    x = selected[perm]
    counts = torch.histc(ids_g.int(), bins=E, min=0, max=E - 1)
    offs = torch.cumsum(counts, 0, dtype=torch.int32)

    def proj(inp, w, o):
        if variant == "fp8":
            return _fp8_grouped()(inp, w, o, *fp8_weights(w), quant_rows)
        return torch._grouped_mm(inp, w.transpose(-2, -1), offs=o)
    if variant.startswith("pad"):
        mult = int(variant[3:])
        padded = (counts + (mult - 1)) // mult * mult
        poffs = torch.cumsum(padded, 0, dtype=torch.int32)
        dst = torch.arange(S, device=dev) + ((poffs - padded) - (offs - counts))[ids_g]
        rows = S + E * (mult - 1)
        h = proj(x.new_zeros(rows, x.shape[1]).index_put((dst,), x), w1, poffs)
        if torch.is_grad_enabled():
            h = h.masked_fill((torch.arange(rows, device=dev) >= poffs[-1]).unsqueeze(-1), 0)
        y = proj(gate(h), w2, poffs)[dst]
    elif variant == "bmm_padded":
        G = max(1, int(counts.max()))
        dst = torch.arange(S, device=dev) + (torch.arange(E, device=dev) * G - (offs - counts))[ids_g]
        xb = x.new_zeros(E * G, x.shape[1]).index_put((dst,), x)
        h = gate(torch.bmm(xb.view(E, G, -1), w1.transpose(1, 2)).view(E * G, -1))
        y = torch.bmm(h.view(E, G, -1), w2.transpose(1, 2)).view(E * G, -1)[dst]
    elif variant in ("original", "fp8"):
        y = proj(gate(proj(x, w1, offs)), w2, offs)
    else:
        raise ValueError(f"unknown experts variant {variant!r}: choose from {', '.join(EXPERTS_VARIANTS)}")
    y = (y * w_g.unsqueeze(-1))[inv_perm]
    return y.view(T, k, -1).sum(dim=1).to(hidden.dtype)


def route(torch, sizes: list[int], tokens: int, top_k: int, seed: int = 0):
    """top_k_index [tokens, top_k] on the GPU whose experts get `sizes` rows (each at most `tokens`), each token
    routed to top_k distinct experts, tokens in a seeded random order."""
    ids = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))
    idx = ids.view(top_k, tokens).t()
    gen = torch.Generator().manual_seed(seed)
    return idx[torch.randperm(tokens, generator=gen)].contiguous().cuda()


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
    samples: dict[str, list[float]] = {n: [] for n in timed}
    s_ev, e_ev = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def one(n) -> float:
        fn = call(n)
        torch.cuda.synchronize()
        s_ev.record()
        fn()
        e_ev.record()
        e_ev.synchronize()
        return s_ev.elapsed_time(e_ev) * 1e3
    warm = {}
    for n in list(timed):
        try:
            one(n)
            warm[n] = one(n)
        except Exception as e:  # noqa: BLE001
            errors[n] = error_text(e)
            timed.remove(n)
            torch.cuda.synchronize()
    rounds = max(5, min(15, int(EXPERTS_BUDGET_S * 1e6 / max(1.0, sum(warm.values())))))
    for r in range(rounds):
        for n in (timed if r % 2 == 0 else timed[::-1]):
            samples[n].append(one(n))
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
    by: dict[tuple, list[dict]] = {}
    for g in gemms:
        if g.get("op") in GROUPED_TORCH_OPS and g.get("module"):
            by.setdefault((g["module"], g.get("groups")), []).append(g)
    out = []
    for (module, groups), rows in by.items():
        try:
            e = measure_experts(probe, rows)
        except Exception as ex:  # noqa: BLE001  one module that cannot run is reported, the others go on
            e = {"error": f"{type(ex).__name__}: {ex}"[:300]}
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
        entry = {"key": {k: g.get(k) for k in ("op", "dtype", "layout", "m", "n", "k", "batch", "groups")},
                 **{k: g[k] for k in ("module", "pass", "calls", "kernel", "gpu_us", "backend", "log_function",
                                       "group_dim", "sizes_source", "graph") if k in g}}
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


def require(gemms) -> None:
    if not gemms:
        raise CaptureError("audit --measure: no GEMM to measure (the trace has no GEMM-kind kernel)")
