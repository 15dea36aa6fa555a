"""The GEMM rows of a trace: each (kernel, op with its recorded inputs) group decoded into `TRACE_SCHEMA`'s
columns, with the torch-view problem (m, n, k, batch, dtype, layout) the op's inputs describe (`problem_of`),
and the rows summed per kernel (`by_kernel`)."""
from __future__ import annotations

import json
from typing import Any

import pandas as pd

from cublaslt_probe.analysis.trace.schema import (
    GEMM_OPS,
    GROUPED_OPS,
    REDUCE_FAMILY,
    TRACE_COLUMNS,
    TRACE_SCHEMA,
    TraceStats,
    classify,
)
from cublaslt_probe.dtypes import torch_dtype


def _js(v) -> str | None:
    return None if v is None else json.dumps(v, separators=(", ", ": "))


def op_key_json(key: tuple) -> tuple:
    """(name, repr(dims), repr(types), repr(strides)) -> the same with JSON text (reprs of JSON values)."""
    import ast
    name, *rest = key
    out = []
    for r in rest:
        if r is None or r == "None":
            out.append(None)
            continue
        try:
            out.append(_js(ast.literal_eval(r)))
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            out.append(None)          # not a JSON value (nan, inf): not a record this reader can show
    return (name, *out)


def _letter(dims, strides) -> str | None:
    """N when the last two dims are row-major contiguous, T when stored transposed, None if unclear."""
    if not dims or not strides or len(dims) < 2 or len(strides) != len(dims):
        return None
    (r, c), (s0, s1) = dims[-2:], strides[-2:]
    if c == 1 and r == 1:
        return "N"
    if s1 == 1 and (s0 >= c or r == 1):
        return "N"
    if s0 == 1 and (s1 >= r or c == 1):
        return "T"
    return None


def problem_of(op: str | None, dims_json: str | None, types_json: str | None,
               strides_json: str | None) -> dict[str, Any]:
    """The torch-view GEMM (m, n, k, batch, dtype, layout; grouped ops also groups, group_dim) a GEMM op's
    recorded inputs describe.

    Only for `GEMM_OPS`; other ops and missing shapes give ``{}``; a field the record cannot give is None.
    A grouped GEMM's m, n, k are the totals over its groups (`GROUPED_OPS`): the offsets' values, hence the
    size of each group, are a tensor the trace does not record.
    """
    where = GEMM_OPS.get(op or "")
    if where is None or not dims_json:
        return {}
    try:
        dims = json.loads(dims_json)
        types = json.loads(types_json) if types_json else []
        strides = json.loads(strides_json) if strides_json else []
        a, b = dims[where[0]], dims[where[1]]
    except (ValueError, IndexError, TypeError, KeyError):
        return {}
    types = types if isinstance(types, list) else []
    strides = strides if isinstance(strides, list) else []
    if not (isinstance(a, list) and isinstance(b, list)):
        return {}
    out: dict[str, Any] = {}
    try:
        if op in GROUPED_OPS:
            g = _groups(dims, GROUPED_OPS[op], a, b)
            if g is None:
                return {}
            out.update(g)
        elif op in ("aten::mv", "aten::addmv"):
            out.update(m=a[0], k=a[1], n=1, batch=1)
        elif len(a) == 3 and len(b) == 3:
            out.update(batch=a[0], m=a[1], k=a[2], n=b[2])
        elif len(a) == 2 and len(b) == 2:
            out.update(batch=1, m=a[0], k=a[1], n=b[1])
        else:
            return {}
    except (IndexError, TypeError):
        return {}
    if any(type(out.get(c)) is not int for c in ("m", "n", "k", "batch")) or \
            ("groups" in out and out["groups"] is not None and type(out["groups"]) is not int):
        return {}                 # dims that are not integers: not a shape this reader can use
    out["dtype"] = torch_dtype(types[where[0]] if len(types) > where[0] else None,
                               types[where[1]] if len(types) > where[1] else None)
    if op in ("aten::mv", "aten::addmv"):
        out["layout"] = None
    else:
        try:
            la = _letter(a, strides[where[0]] if len(strides) > where[0] else None)
            lb = _letter(b, strides[where[1]] if len(strides) > where[1] else None)
        except TypeError:             # strides that are not integers
            la = lb = None
        out["layout"] = la + lb if la and lb else None
    return out


def _groups(dims: list, offs_at: int, a: list, b: list) -> dict | None:
    """m, n, k, batch, groups, group_dim of a grouped GEMM from its operands' dims (`GROUPED_OPS`)."""
    offs = dims[offs_at] if len(dims) > offs_at and dims[offs_at] else None
    g = offs[0] if offs else None
    if len(a) == 2 and len(b) == 3:
        return dict(m=a[0], k=a[1], n=b[2], batch=1, groups=b[0], group_dim="m")
    if len(a) == 3 and len(b) == 2:
        return dict(m=a[1], k=a[2], n=b[1], batch=1, groups=a[0], group_dim="n")
    if len(a) == 2 and len(b) == 2 and g:
        return dict(m=a[0], k=a[1], n=b[1], batch=1, groups=g, group_dim="k")
    if len(a) == 3 and len(b) == 3:
        return dict(m=a[1], k=a[2], n=b[2], batch=a[0], groups=a[0], group_dim=None)
    return None


def finish(groups: pd.DataFrame, op_keys: list, stats: TraceStats) -> pd.DataFrame:
    """Group rows (kernel, op key, count, times) -> the TRACE_SCHEMA frame, largest total first."""
    from cublaslt_probe.names import decode
    rows = []
    pids = groups["pid"] if "pid" in groups else [None] * len(groups)
    for (kernel, count, total, mn, mx, red), key, pid in zip(
            groups[["kernel", "count", "total_us", "min_us", "max_us", "reduce_us"]].itertuples(index=False),
            op_keys, pids):
        kn = decode(kernel)
        op, dims, types, strides = key if key else (None, None, None, None)
        kind, prov = classify(kn)
        if dims is not None:
            stats.with_shapes += int(count) if kind == "gemm" and kn.family != REDUCE_FAMILY else 0
        types_code = kn.type_code or "/".join(x for x in (kn.a_type, kn.c_type, kn.compute_type) if x) or None
        row = {
            "share": total / stats.gpu_time_us if stats.gpu_time_us else None,
            "count": count, "total_us": total, "mean_us": total / count if count else None,
            "min_us": mn, "max_us": mx, "reduce_us": red,
            "kernel": kernel, "family": kn.family, "provenance": prov, "kernel_short": kn.short, "arch": kn.arch,
            "types": types_code, "tile_m": kn.tile_m, "tile_n": kn.tile_n, "tile_k": kn.tile_k,
            "stages": kn.stages, "cluster_m": kn.cluster_m, "cluster_n": kn.cluster_n,
            "split_k": kn.split_k, "kernel_layout": kn.layout, "kernel_flags": " ".join(kn.flags) or None,
            "op": op, "input_dims": dims, "input_types": types, "input_strides": strides,
            "problem_shape": kn.problem_shape, "pid": pid,
        }
        p = problem_of(op, dims, types, strides)
        row.update({c: p.get(c) for c in ("dtype", "layout", "m", "n", "k", "batch", "groups", "group_dim")})
        rows.append(row)
    df = pd.DataFrame(rows, columns=TRACE_COLUMNS)
    df = _coerce(df)
    return df.sort_values(["total_us", "kernel"], ascending=[False, True], kind="stable").reset_index(drop=True)


def _coerce(df: pd.DataFrame) -> pd.DataFrame:
    for col, (dt, _) in TRACE_SCHEMA.items():
        if dt == "category":
            df[col] = df[col].astype("string").astype("category")
        elif dt in ("Int64", "boolean"):
            df[col] = pd.array(df[col].tolist(), dtype=dt)
        else:
            df[col] = df[col].astype(dt)
    return df


def by_kernel(df: pd.DataFrame) -> pd.DataFrame:
    """One row per kernel (per kernel and process in a file of several processes): the (kernel, op, shapes)
    rows of `read_trace` summed; ``ops`` lists the calling ops and ``shapes`` how many distinct op/shape
    records called it."""
    if not len(df):
        return df.assign(ops=pd.Series([], dtype="string"), shapes=pd.Series([], dtype="Int64"))
    fixed = [c for c in TRACE_COLUMNS if c not in (
        "share", "count", "total_us", "mean_us", "min_us", "max_us", "reduce_us", "op", "input_dims",
        "input_types", "input_strides", "dtype", "layout", "m", "n", "k", "batch", "groups", "group_dim")]
    g = df.groupby(["kernel", "pid"], sort=False, observed=True, dropna=False)
    out = g.agg(share=("share", "sum"), count=("count", "sum"), total_us=("total_us", "sum"),
                min_us=("min_us", "min"), max_us=("max_us", "max"), reduce_us=("reduce_us", "sum"))
    out["mean_us"] = out["total_us"] / out["count"]
    out["ops"] = g["op"].agg(lambda s: ", ".join(sorted({str(x) for x in s.dropna()}))).replace("", pd.NA)
    out["shapes"] = g["input_dims"].agg(lambda s: s.dropna().nunique()).astype("Int64")
    first = g[[c for c in fixed if c not in ("kernel", "pid")]].first()
    out = out.join(first).reset_index()
    cols = ["share", "count", "total_us", "mean_us", "min_us", "max_us", "reduce_us", *fixed, "ops", "shapes"]
    out = out[cols]
    out["count"] = out["count"].astype("Int64")
    out["ops"] = out["ops"].astype("string")
    return out.sort_values(["total_us", "kernel"], ascending=[False, True], kind="stable").reset_index(drop=True)
