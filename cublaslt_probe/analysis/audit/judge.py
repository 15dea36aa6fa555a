"""The audit's rows: the attributed GEMM launches grouped into one row per (module, pass, op record, kernel,
kind of GPU) (`_rows`), each judged against its GPU's roofline (`_judge`: % of peak, floor, waves, alignment
fallback, split-K). CPU only.
"""
from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd

from cublaslt_probe.analysis.audit.attribute import GpuFacts, _join_log, gpu_rates
from cublaslt_probe.analysis.audit.schema import AUDIT_COLUMNS, _coerce, _na
from cublaslt_probe.analysis.explain import gemm_bytes, roofline_floor
from cublaslt_probe.dtypes import element_bytes

NEAR_FLOOR = 1.10                              # within 10 % of the floor: nothing left to win


# --------------------------------------------------------------------------- per-row judgement
def _leading_dims(dims_json, strides_json, op) -> list[tuple[str, int]]:
    """(operand, leading dimension in elements) of A and B from the op's recorded dims and strides."""
    from cublaslt_probe.analysis.trace import GEMM_OPS
    where = GEMM_OPS.get(op or "")
    if where is None or not dims_json or not strides_json:
        return []
    try:
        dims, strides = json.loads(dims_json), json.loads(strides_json)
        out = []
        for label, i in (("A", where[0]), ("B", where[1])):
            d, s = dims[i], strides[i]
            if len(d) < 2 or len(s) != len(d):
                continue
            (r, c), (s0, s1) = d[-2:], s[-2:]
            if s1 == 1 and r > 1:
                out.append((label, s0))
            elif s0 == 1 and c > 1:
                out.append((label, s1))
        return out
    except (ValueError, IndexError, TypeError):
        return []


def _arch_num(arch: str | None) -> int | None:
    m = re.match(r"sm_?(\d+)", arch or "")
    return int(m.group(1)) if m else None


def _judge(row: dict, kn, rates: tuple, sms: int | None, gpu_arch: int | None) -> None:
    """flops, tflops, % of peak, roofline floor, waves, alignment fallback of one row (in place), with the
    rates (`gpu_rates`), SM count and architecture of the GPU it ran on."""
    from cublaslt_probe.analysis.evidence import logged_tile
    m, n, k, b = row.get("m"), row.get("n"), row.get("k"), row.get("batch") or 1
    dt = row.get("dtype")
    mean = row["mean_us"]
    if any(_na(x) for x in (m, n, k)):
        return
    flops = 2.0 * m * n * k * b
    row["flops"] = flops
    row["tflops"] = flops / mean / 1e6 if mean else None
    peaks, bw, _ = rates
    nb, ob = element_bytes(dt) or (None, None)
    peak = peaks.get(dt) if peaks and dt else None
    if peak:
        row["peak_tflops"] = peak
        row["pct_peak"] = 100 * row["tflops"] / peak if not _na(row["tflops"]) else None
    if peak and bw and nb:
        r = roofline_floor(flops, gemm_bytes(m, n, k, b, dt), peak, bw)
        row["floor_us"], row["bound"] = r["floor_us"], r["bound"]
        row["floor_ratio"] = mean / row["floor_us"] if row["floor_us"] else None
    # waves: the tile in cuBLAS's column-major order against blas_m = torch n, blas_n = torch m
    tile = logged_tile(kn)
    split = row.get("algo_split_k")
    if _na(split):
        split = 1 if kn.split_k is False or (kn.split_k is None and not row.get("split_k")) else None
    if tile and sms and split and _na(row.get("groups")):
        from cublaslt_probe.analysis.explain import waves
        row["waves"] = waves(n, m, tile[0], tile[1], split, b, sms)["waves"]
    # alignment: leading dimensions in bytes
    lds = _leading_dims(row.get("input_dims"), row.get("input_strides"), row.get("op"))
    if nb:
        bad = [f"{lab} ld={ld}" for lab, ld in lds if (ld * nb) % 16]
        if (n * ob) % 16:
            bad.append(f"C ld={n}")
        row["misaligned"] = ", ".join(bad) or None
        aligns = [a for a in (kn.align_a, kn.align_b, kn.align_c) if a]
        small = any(a * nb < 16 for a in aligns)
        karch = _arch_num(kn.arch)
        older = karch is not None and gpu_arch is not None and karch < gpu_arch
        row["align_fallback"] = bool(bad) and (small or older)


def _judges(G: pd.DataFrame, facts: GpuFacts, devices: dict[int, GpuFacts], notes: list[str]
            ) -> tuple[pd.DataFrame, list[tuple[GpuFacts, tuple]]]:
    """Each launch's kind of GPU (column ``judge``) and, per kind, its facts and rates (`gpu_rates`) that its
    rows are judged with: the run's facts, or with several kinds of GPU in the trace its launch's device's."""
    kinds = list(dict.fromkeys(devices.values())) if len(set(devices.values())) > 1 else [facts]
    judge = np.zeros(len(G), dtype=np.int64)
    if len(kinds) > 1:
        dev = G["device"].to_numpy() if "device" in G.columns else np.full(len(G), -1)
        judge = np.array([kinds.index(devices[d]) if d in devices else len(kinds) for d in dev.tolist()],
                         dtype=np.int64)
        kinds.append(GpuFacts())                  # a device the trace does not describe
    out = []
    for k in kinds:
        rates = gpu_rates(k.name)
        if rates[0] is None and (judge == len(out)).any():
            notes.append(f"no peak rates for GPU {k.name or '(not recorded)'}: floor_us and pct_peak cannot be "
                         "shown" + (" for its GEMMs" if len(kinds) > 1 else ""))
        out.append((k, rates))
    return G.assign(judge=judge), out


def _rows(G: pd.DataFrame, det, steps: int, step_gpu: float, log_groups: dict, judges: list[tuple[GpuFacts, tuple]],
          cublas: str | None = None) -> tuple[pd.DataFrame, int, float]:
    """One row per (module, pass, op record, kernel, kind of GPU): the `AUDIT_SCHEMA` frame, largest first;
    and how many rows (and how much time) have no shape. ``judges[G.judge]``: the facts and rates of the GPU a
    launch ran on (`_judges`); `cublas`: the run's cuBLASLt version, for the joined log config's known issues."""
    from cublaslt_probe.analysis.trace import classify, op_key_json, problem_of
    from cublaslt_probe.logs.issues import record_label
    from cublaslt_probe.names import decode
    agg = G.groupby(["module", "pass", "key", "name", "judge"], dropna=False, sort=False).agg(
        count=("dur", "size"), total=("dur", "sum"), reduce=("reduce_us", "sum"), helper=("helper_us", "sum"),
        instances=("module_full", "nunique"), graph=("graph", "max"))
    rows, no_shape, no_shape_us = [], 0, 0.0
    for (mod, pas, key, name, judge), a in zip(agg.index, agg.itertuples(index=False)):
        kernel = det.names[name]
        kn = decode(kernel)
        op, dims, types, strides = op_key_json(det.op_keys[int(key)]) if key >= 0 else (None,) * 4
        p = problem_of(op, dims, types, strides)
        shape_from = "op" if p else None
        if not p and op and op.startswith("triton_tem") and "mm" in op:
            p = _template_problem(dims, types, strides)
            shape_from = "kernel arguments" if p else None
        if not p:
            no_shape += 1
            no_shape_us += a.total
        row = {
            "module": None if _na(mod) else mod, "instances": None if _na(mod) else int(a.instances),
            "pass": None if _na(pas) else pas, "op": op,
            **{c: p.get(c) for c in ("dtype", "layout", "m", "n", "k", "batch", "groups", "group_dim")},
            "calls": a.count / steps, "gpu_us": a.total / steps, "mean_us": a.total / a.count,
            "share": (a.total / steps) / step_gpu if step_gpu else None,
            "kernel": kernel, "family": kn.family, "provenance": classify(kn)[1], "kernel_short": kn.short,
            "arch": kn.arch, "tile_m": kn.tile_m, "tile_n": kn.tile_n, "tile_k": kn.tile_k, "stages": kn.stages,
            "cluster_m": kn.cluster_m, "cluster_n": kn.cluster_n, "problem_shape": kn.problem_shape,
            "split_k": (bool(kn.split_k) or a.reduce > 0) if kn.split_k is not None or a.reduce > 0 else None,
            "shape_from": shape_from, "reduce_us": a.reduce / steps, "helper_us": a.helper / steps,
            "input_dims": dims, "input_strides": strides,
            "graph": int(a.graph) if a.graph >= 0 else None,
        }
        logged = _join_log(row, kn, log_groups, steps)
        if row.get("algo_split_k") and row["algo_split_k"] > 1:
            row["split_k"] = True
        gpu, rates = judges[judge]
        row["known_issue"] = record_label(logged, kernel=kernel, cublas=cublas, cc=gpu.cc)
        row["gpu"] = gpu.name
        _judge(row, kn, rates, gpu.sms, gpu.arch)
        rows.append(row)
    df = _coerce(pd.DataFrame(rows, columns=AUDIT_COLUMNS))
    df = df.sort_values(["gpu_us", "kernel"], ascending=[False, True], kind="stable").reset_index(drop=True)
    return df, no_shape, no_shape_us


def _template_problem(dims, types, strides) -> dict:
    """An Inductor Triton GEMM template's problem from its launch record's first two inputs (A [m, k],
    B [k, n], as torch.compile passes them to ``triton_tem_fused_mm*``); {} when they do not chain."""
    from cublaslt_probe.analysis.trace import problem_of
    try:
        d = json.loads(dims)
        if len(d) < 2 or len(d[0]) != 2 or len(d[1]) != 2 or d[0][1] != d[1][0]:
            return {}
    except (TypeError, ValueError):
        return {}
    return problem_of("aten::mm", dims, types, strides)


def _fold_helpers(G: pd.DataFrame) -> pd.DataFrame:
    """One op call = one GEMM: where an op call launched several GEMM-kind kernels, the longest is the GEMM
    and the others' time is added to it (``helper_us``), as a split-K reduce is."""
    G = G.assign(helper_us=0.0)
    # each replay of a CUDA graph repeats the op call it was captured from: one op call per graph launch
    replay = np.where(G["graph"].to_numpy() >= 0, G["t_launch"].to_numpy(), 0.0) if "graph" in G.columns else 0.0
    G = G.assign(_call=replay)
    linked = G[G["op_row"] >= 0].sort_values(["op_row", "_call", "dur"], ascending=[True, True, False],
                                             kind="stable")
    extra = linked.duplicated(["op_row", "_call"])
    if not extra.any():
        return G
    helpers = linked[extra].groupby(["op_row", "_call"])["dur"].sum()
    main = linked[~extra]
    add = pd.Series(pd.MultiIndex.from_frame(main[["op_row", "_call"]]).map(helpers), index=main.index)
    add = add[~pd.isna(add)].astype(np.float64)
    G.loc[add.index, "dur"] += add
    G.loc[add.index, "helper_us"] = add
    return G.drop(index=linked[extra].index)
