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

MIN_HOST_US = 1000.0   # one call must hold the host this long ...
MIN_RATIO = 10.0       # ... and this many times its kernels' GPU time

STALL_COLUMNS = ("op", "module", "calls", "host_us", "gpu_us", "worst_us", "kernels", "families", "provenance")


def _module_at(ranges: pd.DataFrame, ts: float, tid) -> str | None:
    """The innermost module range of thread `tid` around time `ts` (capture ranges only)."""
    if ranges is None or not len(ranges):
        return None
    m = ranges[(ranges.tid == tid) & (ranges.ts <= ts) & (ranges.end >= ts)
               & ranges.name.str.startswith(runfiles.MODULE_PREFIX)]
    if not len(m):
        return None
    inner = m.loc[m.ts.idxmax()]
    return inner["name"][len(runfiles.MODULE_PREFIX):]


def host_stalls(detail, steps: int = 1, *, min_host_us: float = MIN_HOST_US,
                min_ratio: float = MIN_RATIO) -> pd.DataFrame:
    """One row per (op, module) with at least one call that held the host `min_host_us` and `min_ratio` times
    its own kernels' GPU time; times per step (`steps` captured). Columns `STALL_COLUMNS`."""
    from cublaslt_probe.names import decode
    if detail is None or not len(detail.launches) or not len(detail.ops):
        return pd.DataFrame(columns=list(STALL_COLUMNS))
    lz = detail.launches[detail.launches.op_row >= 0]
    gpu = lz.groupby("op_row")["dur"].sum()
    ops = detail.ops.loc[gpu.index]
    host = (ops.end - ops.ts).to_numpy(dtype=float)
    g = gpu.to_numpy(dtype=float)
    hit = (host >= min_host_us) & (host >= min_ratio * np.maximum(g, 1e-9))
    rows: dict[tuple, dict] = {}
    for op_row, h, gu in zip(gpu.index[hit], host[hit], g[hit]):
        op = detail.ops.loc[op_row]
        name = detail.op_keys[int(op.key)][0]
        module = _module_at(detail.ranges, float(op.ts), op.tid)
        r = rows.setdefault((name, module), {"op": name, "module": module, "calls": 0, "host_us": 0.0,
                                             "gpu_us": 0.0, "worst_us": 0.0, "kernels": set()})
        r["calls"] += 1
        r["host_us"] += h
        r["gpu_us"] += gu
        r["worst_us"] = max(r["worst_us"], h)
        r["kernels"].update(detail.names[int(i)] for i in lz.loc[lz.op_row == op_row, "name"])
    out = []
    for r in rows.values():
        kns = [decode(k) for k in sorted(r["kernels"])]
        out.append({**r, "calls": r["calls"] / steps, "host_us": r["host_us"] / steps,
                    "gpu_us": r["gpu_us"] / steps, "kernels": sorted(r["kernels"]),
                    "families": sorted({k.family for k in kns}),
                    "provenance": sorted({getattr(k, "provenance", "unknown") for k in kns})})
    df = pd.DataFrame(out, columns=list(STALL_COLUMNS))
    return df.sort_values("host_us", ascending=False, ignore_index=True)


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
