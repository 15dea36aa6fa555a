"""What `audit --measure` measures, decided on the CPU: the probe Case of each audited GEMM (`case_of`,
`grouped_case_of`), the padded what-ifs (`pad_values`, `whatif_cases`), the experts module a module's grouped rows
run (`experts_problem`, `experts_modules`), the record a measured GEMM starts from (`entry_head`), and the
constants the GPU side (`gpu.measure`, `gpu.experts`) and the readers share: the multiples padded to, the experts'
variants and transformers' implementations, the graph-replay recipe. Pure: no torch, no GPU; the CPU tests reach
every rule here.
"""
from __future__ import annotations

import json
import math

from cublaslt_probe.analysis.evidence import GROUPED_TORCH_OPS, TORCH_OPS, path_of
from cublaslt_probe.cases import SPLIT_K, Case, group_sizes, invalid_reason, sizes_code
from cublaslt_probe.dtypes import SWEEP_DTYPES
from cublaslt_probe.errors import CaptureError

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


GRAPH_CALLS = 16     # calls of one GEMM captured into the CUDA graph that `graph_times` replays


GRAPH_REPS = 10      # replays timed (the median is kept)


GRAPH_PATHS = ("torch", "torch-lt")   # paths `graph_times` captures (the raw cuBLASLt path's call: its candidates')


GRAPH_TIMING = (f"graph-replayed: {GRAPH_CALLS} calls of the GEMM (and of each alternative and heuristic "
                f"candidate) captured in one CUDA graph, the median of {GRAPH_REPS} replays per call, as the "
                "program's graph runs them")


# --- the experts' whole forward ------------------------------------------------------------------------------
EXPERTS_VARIANTS = ("original", "pad8", "pad16", "pad128", "balanced", "bmm_padded", "fp8", "mm_per_group",
                    "batched_mm")


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


def to_measure(rows: list[dict], top: int) -> tuple[list[dict], int]:
    """The audited rows `audit --measure` times: the `top` largest (the rows come largest share first), then
    every other row of a module among them, in the same order, so that a change to a module (padding a width,
    balancing its experts, another BLAS path) is predicted over all of its GEMMs, forward and backward, not
    over those that happened to rank. Returns the rows and how many were added for their modules."""
    head = rows[:top]
    mods = {r.get("module") for r in head if r.get("module")}
    more = [r for r in rows[top:] if r.get("module") in mods]
    keep = {id(r) for r in head + more}
    return [r for r in rows if id(r) in keep], len(more)


def require(gemms) -> None:
    if not gemms:
        raise CaptureError("audit --measure: no GEMM to measure (the trace has no GEMM-kind kernel)")


# the audited row's fields a measured GEMM's record carries beside its key
CARRIED = ("module", "pass", "calls", "kernel", "gpu_us", "backend", "log_function", "group_dim", "sizes_source",
           "graph")


def entry_head(g: dict) -> dict:
    """The start of one measured GEMM's record: its ``key`` (the problem `binding.gemm_key` reads) and the audited
    row's fields it carries (`CARRIED`, where the row has them)."""
    return {"key": {k: g.get(k) for k in ("op", "dtype", "layout", "m", "n", "k", "batch", "groups")},
            **{k: g[k] for k in CARRIED if k in g}}


def experts_modules(gemms: list[dict]) -> dict[tuple, list[dict]]:
    """The audited grouped rows of `gemms` by (module, groups), in order: the rows one experts module runs (a
    row of no module is left out: nothing names its whole call)."""
    by: dict[tuple, list[dict]] = {}
    for g in gemms:
        if g.get("op") in GROUPED_TORCH_OPS and g.get("module"):
            by.setdefault((g["module"], g.get("groups")), []).append(g)
    return by

