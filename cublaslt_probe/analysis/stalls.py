"""Host stalls: ops whose CPU time dwarfs the GPU time of the kernels they launched.

A step can be slow with every kernel fast: the host spends milliseconds inside one op while the GPU waits.
In a trace this shows as an op (``cat: cpu_op``) whose duration is far longer than its own kernels' (those the
op launched directly: `trace.TraceDetail` links each launch to its innermost op). The usual causes are work the
library does once per new shape (cuDNN building an execution plan and compiling its runtime-fusion kernel,
Triton compiling, a cuBLASLt heuristic miss), a host synchronisation, or allocation.

`host_stalls(detail, steps)` finds them, one row per (op, module) with its calls, host and GPU time per step, the
kernels it launched and their decoded provenance; `cause(row)` says what the evidence in the trace supports,
marked *inferred* (a trace shows times, not what the library did: `cold-start` observes it). CPU only.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from cublaslt_probe import runfiles
from cublaslt_probe.analysis.trace.ranges import innermost

MIN_HOST_US = 1000.0   # one call must hold the host this long ...
MIN_RATIO = 10.0       # ... and this many times its kernels' GPU time

STALL_COLUMNS = ("op", "module", "calls", "host_us", "gpu_us", "worst_us", "kernels", "families", "provenance")


def _modules(detail, op_rows: np.ndarray) -> list[str | None]:
    """The innermost capture module range (``runfiles.MODULE_PREFIX``) of each op's thread around its start,
    without the prefix; None where no module range holds it. One sweep over the ranges (`trace.ranges.innermost`)."""
    rng = detail.ranges
    out: list[str | None] = [None] * len(op_rows)
    if rng is None or not len(rng) or not len(op_rows):
        return out
    mods = rng[rng["name"].str.startswith(runfiles.MODULE_PREFIX, na=False)]
    if not len(mods):
        return out
    ops = detail.ops.loc[op_rows]
    at = innermost(mods["ts"].to_numpy(), mods["end"].to_numpy(), mods["tid"].to_numpy(),
                    ops["ts"].to_numpy(), ops["tid"].to_numpy())
    names = mods["name"].tolist()
    cut = len(runfiles.MODULE_PREFIX)
    return [names[i][cut:] if i >= 0 else None for i in at.tolist()]


def host_stalls(detail, steps: int = 1, *, min_host_us: float = MIN_HOST_US,
                min_ratio: float = MIN_RATIO) -> pd.DataFrame:
    """One row per (op, module) with at least one call that held the host `min_host_us` and `min_ratio` times
    its own kernels' GPU time; times per step (`steps` captured). Columns `STALL_COLUMNS`; ``module`` is None
    (never NaN) for an op outside every module range. Linear in the trace: the stalled calls are found,
    placed in their modules and joined to their kernels as whole columns."""
    from cublaslt_probe.names import decode
    if detail is None or not len(detail.launches) or not len(detail.ops):
        return pd.DataFrame(columns=list(STALL_COLUMNS))
    lz = detail.launches[detail.launches.op_row >= 0]
    gpu = lz.groupby("op_row")["dur"].sum()
    ops = detail.ops.loc[gpu.index]
    host = (ops.end - ops.ts).to_numpy(dtype=float)
    g = gpu.to_numpy(dtype=float)
    hit = (host >= min_host_us) & (host >= min_ratio * np.maximum(g, 1e-9))
    if not hit.any():
        return pd.DataFrame(columns=list(STALL_COLUMNS))
    op_rows = gpu.index.to_numpy()[hit]
    keys = detail.ops.loc[op_rows, "key"].to_numpy()
    calls = pd.DataFrame({"op_row": op_rows, "op": [detail.op_keys[int(k)][0] for k in keys],
                          "module": _modules(detail, op_rows),
                          "host_us": host[hit], "gpu_us": g[hit]})
    # (op, module) as one code, in order of first call, so that a missing module groups as itself
    group = calls.groupby(["op", "module"], sort=False, dropna=False).ngroup().to_numpy()
    calls["group"] = group
    first = np.unique(group, return_index=True)[1]
    worst = np.zeros(len(first))
    np.maximum.at(worst, group, calls["host_us"].to_numpy())
    per = pd.DataFrame({"op": calls["op"].to_numpy()[first], "module": calls["module"].to_numpy()[first],
                        "calls": np.bincount(group), "worst_us": worst,
                        "host_us": np.bincount(group, weights=calls["host_us"].to_numpy()),
                        "gpu_us": np.bincount(group, weights=calls["gpu_us"].to_numpy())})
    kern = lz.loc[lz.op_row.isin(op_rows), ["op_row", "name"]].drop_duplicates()
    kern = kern.merge(calls[["op_row", "group"]], on="op_row")[["group", "name"]].drop_duplicates()
    names = {int(i): detail.names[int(i)] for i in kern["name"].unique()}
    decoded = {i: decode(n) for i, n in names.items()}
    by_group = kern.groupby("group")["name"].agg(lambda s: sorted(int(i) for i in s))
    out = []
    for grp, r in zip(per.index.tolist(), per.itertuples(index=False)):
        ids = by_group.get(grp, [])
        kns = [decoded[i] for i in ids]
        out.append({"op": r.op, "module": None if pd.isna(r.module) else r.module, "calls": r.calls / steps,
                    "host_us": r.host_us / steps, "gpu_us": r.gpu_us / steps, "worst_us": float(r.worst_us),
                    "kernels": sorted(names[i] for i in ids),
                    "families": sorted({k.family for k in kns}),
                    "provenance": sorted({getattr(k, "provenance", "unknown") for k in kns})})
    df = pd.DataFrame(out, columns=list(STALL_COLUMNS))
    df["module"] = pd.Series([r["module"] for r in out], index=df.index, dtype=object)   # None stays None
    return df.sort_values("host_us", ascending=False, kind="stable", ignore_index=True)


def cause(row: dict) -> dict:
    """What the trace supports about one stall: ``cause``, ``evidence`` and ``change`` (text), all inferred."""
    per_call = row["host_us"] / max(row["calls"], 1e-9)
    gpu_call = row["gpu_us"] / max(row["calls"], 1e-9)
    ev = (f"{row['op']}: {per_call / 1e3:,.1f} ms of host time per call for {gpu_call:,.1f} µs of its own "
          f"kernels' GPU time ({', '.join(row['families']) or 'no kernel'}; {', '.join(row['provenance'])})")
    fams = set(row["families"])
    if any(f.startswith("cudnn") for f in fams) and "runtime-compiled" in row["provenance"]:
        return {"cause": "cuDNN built an execution plan for a shape it had not seen (its runtime-fusion engine "
                         "compiles the plan's kernel) — inferred",
                "evidence": ev,
                "change": "keep shapes the plan cache has seen (pad the sequence/KV length to buckets), or pin "
                          "another SDPA backend for this phase (torch.nn.attention.sdpa_kernel(FLASH_ATTENTION)); "
                          "`cublaslt-probe cold-start` observes the compilation"}
    if "runtime-compiled" in row["provenance"]:
        return {"cause": "runtime compilation of the op's kernel for a new shape — inferred", "evidence": ev,
                "change": "warm the shapes up before timing, or keep shapes static; cold-start observes it"}
    return {"cause": "host work inside the op with the GPU idle (synchronisation, allocation, a library's "
                     "per-shape setup) — inferred", "evidence": ev,
            "change": "run cublaslt-probe cold-start to split the causes"}
