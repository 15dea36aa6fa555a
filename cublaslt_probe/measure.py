"""`audit --measure` on the GPU: for each GEMM of a program, what the alternatives would have cost.

For one GEMM (torch view: op, dtype, layout, m, n, k, batch, and the library path it took), measured with the
probe (`Probe.run_window`, the same timing and kernel capture as a sweep; `probe.lt_candidates` for the
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

A grouped GEMM (`aten::_grouped_mm`, `_scaled_grouped_mm`; 2-D x 3-D, its offsets splitting the rows) is measured
with the group sizes the audit joined to it (``sizes_source``: recorded, or assumed equal) through
`probe.time_grouped_alternatives` (``grouped``: the original, every group padded to 8, 16, 64, 128 rows,
balanced sizes, one `torch.mm` per group, all groups padded to the largest as one `torch.bmm`, fp8) plus
transformers' `batched_mm` experts forward (`batched_mm_variant`), with each variant's numerics against the
original on the same operands (`_grouped_numerics`); ``implementations`` maps transformers'
`config._experts_implementation` values to the variants that run as they do (`EXPERTS_IMPLEMENTATIONS`).

A GEMM its program replays from a CUDA graph (the audit row's ``graph``) is timed replayed from a graph too
(`use_graph_times`: ``timing`` = graph, each time's eager value kept as ``eager_us``): a graph pays no launch per
call, which changes what a small GEMM's alternatives cost.

GEMMs the probe cannot rebuild (a weight gradient's grouped GEMM, whose offsets split k; Triton templates, ops it
does not know) are listed with the reason, not dropped. Imports torch only inside functions (GPU side).
"""
from __future__ import annotations

import json
import logging
import math
import time

from cublaslt_probe.candidates import max_rel_diff
from cublaslt_probe.cases import Case, invalid_reason
from cublaslt_probe.dtypes import TORCH_NAMES
from cublaslt_probe.errors import CaptureError

log = logging.getLogger(__name__)

PAD_MULTIPLES = (8, 16, 64, 128)
PATHS = ("torch", "torch-lt", "lt")   # cuBLAS 32 MiB, torch's cuBLASLt 1 MiB, cuBLASLt 32 MiB
TORCH_OPS = {"aten::mm": "mm", "aten::matmul": "mm", "aten::addmm": "addmm", "aten::_addmm_activation": "addmm",
             "aten::linear": "addmm", "aten::bmm": "bmm", "aten::baddbmm": "bmm", "aten::_scaled_mm": "scaled_mm"}
GROUPED_TORCH_OPS = {"aten::_grouped_mm": "grouped_mm", "aten::_scaled_grouped_mm": "scaled_grouped_mm"}
# transformers 5.x `config._experts_implementation` -> the variant that runs its expert GEMMs as it does
# ("deepgemm" runs DeepGEMM's kernels, which the probe does not build)
EXPERTS_IMPLEMENTATIONS = {"grouped_mm": "original", "eager": "mm_per_group", "batched_mm": "batched_mm"}
BATCHED_MM_CAP = 8 << 30   # bytes of per-row gathered weights up to which transformers' batched_mm is timed
_DTYPES = {"bf16": "bf16", "fp16": "fp16", "fp32": "fp32", "tf32": "tf32", "fp8": "fp8", "fp8_e4m3": "fp8",
           "fp8_e5m2": "fp8_e5m2"}


def case_of(g: dict, *, allow_tf32: bool = False) -> tuple[Case | None, str | None]:
    """The probe Case of one audited GEMM (a dict with op, dtype, layout, m, n, k, batch and, optionally,
    ``backend`` — ``torch`` for the cuBLAS path, ``torch-lt`` for the cuBLASLt one — or the joined log line's
    ``log_function``), or why there is none."""
    op = TORCH_OPS.get(g.get("op") or "")
    if op is None:
        return None, f"op {g.get('op')!r} is not one the probe rebuilds (mm, addmm, bmm, _scaled_mm)"
    if g.get("groups"):
        return None, "a grouped GEMM: the probe times single GEMMs"
    dtype = _DTYPES.get(g.get("dtype") or "")
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


def path_of(log_function) -> str | None:
    """The torch path a logged GEMM took: ``torch-lt`` for cublasLtMatmul (torch's cuBLASLt path), ``torch``
    for a typed wrapper (cublasLtTSTMatmul, ...: its cuBLAS path); None without a logged function."""
    if not isinstance(log_function, str) or not log_function:
        return None
    return "torch-lt" if log_function == "cublasLtMatmul" else "torch"


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
    from cublaslt_probe.evidence import main_kernel
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
    group_dim and the audit's ``group_sizes``, a JSON list; equal sizes without it), or why there is none."""
    from cublaslt_probe.cases import group_sizes, sizes_code
    op = GROUPED_TORCH_OPS.get(g.get("op") or "")
    if op is None:
        return None, f"op {g.get('op')!r} is not a grouped GEMM"
    if int(g.get("batch") or 1) > 1:
        return None, "a 3-D x 3-D grouped GEMM: its groups are equal, there are no sizes to change"
    if g.get("group_dim") != "m":
        return None, (f"its offsets split {g.get('group_dim') or 'an unknown dimension'} (a weight gradient's "
                      "grouped GEMM): the probe rebuilds grouped GEMMs whose offsets split the rows (m)")
    dtype = _DTYPES.get(g.get("dtype") or "")
    if None in (g.get("m"), g.get("n"), g.get("k"), g.get("groups")) or not g.get("layout") or dtype is None:
        return None, "the trace gives no shapes, strides or dtype for it (record_shapes=True rebuilds them)"
    m, groups = int(g["m"]), int(g["groups"])
    try:
        sizes = json.loads(g["group_sizes"]) if g.get("group_sizes") else group_sizes("uniform", m, groups)
        c = Case("torch", op, dtype, g["layout"], m, int(g["n"]), int(g["k"]), 1, groups, sizes_code(sizes))
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
        row.update(time_us=None, error=f"{type(e).__name__}: {e}"[:300])
        torch.cuda.synchronize()
    return row


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
                ps = alt.group_sizes()
                pst = [0]
                for x in ps:
                    pst.append(pst[-1] + x)
                idx = torch.cat([torch.arange(pst[g], pst[g] + n, device="cuda") for g, n in enumerate(sizes)])
                ap = torch.zeros(alt.m, a.shape[1], device="cuda", dtype=a.dtype)
                ap[idx] = a
                po = torch.tensor(pst[1:], dtype=torch.int32, device="cuda")
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


def measure_grouped(probe, g: dict) -> dict:
    """One grouped GEMM's alternatives (the module doc): ``original`` and ``original_us``, ``grouped`` (the
    variants, `probe.time_grouped_alternatives` and `batched_mm_variant`), ``sizes_source`` and
    ``group_summary`` (the sizes measured), ``implementations``, ``numerics`` and ``tolerance`` (the original
    dtype's; fp8's for the fp8 variant, ``tolerance_fp8``); or ``skipped`` with the reason."""
    from cublaslt_probe import candidates as cand
    from cublaslt_probe.cases import grouped_alternatives, sizes_summary
    from cublaslt_probe.probe import time_grouped_alternatives
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
        bm = batched_mm_variant(probe, c, a, w) if c.op == "grouped_mm" else None
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
            out.append({"graph_us": None, "graph_error": f"{type(e).__name__}: {e}"[:200]})
        finally:
            if b is not None:
                b.close()
    return out


def graph_candidate_times(probe, c: Case, top: int, calls: int = GRAPH_CALLS, reps: int = GRAPH_REPS) -> dict:
    """The heuristic's first `top` cuBLASLt candidates of `c` (as `probe.lt_candidates` asks for them: same
    problem, workspace and alignment, so the same ranks), each replayed from a CUDA graph (`_replayed_us`) on a
    stream of its own (the call is bound to the stream it was built on). Returns {rank: µs or None}."""
    from cublaslt_probe.probe import CUBLAS_WORKSPACE, lt_problem
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
        times, why = {}, f"{type(e).__name__}: {e}"[:200]
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


def measure_gemms(gemms: list[dict], *, top: int = 8, reps: int = 10, allow_tf32: bool = False,
                  probe=None, whatifs: bool = True) -> dict:
    """Measure the alternatives of each GEMM in `gemms` (dicts as `case_of` takes them, with any extra keys —
    `module`, `calls`, `kernel` — carried into the result). Returns {"env", "gemms": [...], "seconds"}."""
    from cublaslt_probe import candidates as cand
    from cublaslt_probe.probe import Probe, lt_candidates
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
                entry["error"] = f"{type(e).__name__}: {e}"[:300]
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
        paths = [Case(**{**c.as_dict(), "backend": p}) for p in PATHS if p != c.backend]
        wi = whatif_cases(c) if whatifs else []
        todo = [c] + paths + [alt for _, _, alt in wi]
        try:
            recs = probe.run_window(todo)
        except Exception as e:  # noqa: BLE001  one GEMM that cannot run is reported, the others go on
            entry["error"] = f"{type(e).__name__}: {e}"[:300]
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
            entry["candidates_error"] = f"{type(e).__name__}: {e}"[:300]
        labels = [(f"path:{p.backend}", p) for p in paths] + [(f"{d}={getattr(alt, d)}", alt) for d, _, alt in wi]
        entry["numerics"] = _numerics(probe, c, labels)
        entry["tolerance"] = cand.tolerance(c.dtype)
        entry["seconds"] = round(time.perf_counter() - t0, 3)
        results.append(entry)
        log.info("measured %s in %.2f s", c.key, entry["seconds"])
    return {"env": probe.env, "gemms": results, "seconds": round(time.perf_counter() - t_all, 3)}


def require(gemms) -> None:
    if not gemms:
        raise CaptureError("audit --measure: no GEMM to measure (the trace has no GEMM-kind kernel)")
