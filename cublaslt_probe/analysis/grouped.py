"""Grouped GEMM rows of an audit: their group sizes (recorded or assumed) and the grouped roofline.

CPU only (no torch). A grouped GEMM (`aten::_grouped_mm`, `aten::_scaled_grouped_mm`) is `groups` GEMMs in one
launch; the trace gives its total rows and the groups, not how the rows split. A run folder written by
`cublaslt_probe.capture` holds the split in ``group_sizes.jsonl`` (`runfiles.read_group_sizes`); `join_sizes`
puts it on the audit's grouped rows:

- a forward call's record joins the row of the same op whose first three operands' dims (A, B, offsets) are
  the record's (``a``, ``b``, ``offs``);
- a backward grouped call (made by autograd, not recorded) splits the rows its forward call split: a backward
  row takes the sizes of the forward rows of its module with the same groups whose rows (m) are the backward
  row's total along its group dimension;
- each record is checked against the row it joins: its sizes (integers >= 0, `runfiles.read_group_sizes`) must
  be the row's groups and add up to its total; one that does not is skipped and named (file:line), the row
  keeping the sizes of the records that fit;
- a row no record reaches (a bare trace, a run captured without recording, a call the recording does not see)
  gets equal sizes, ``sizes_source`` = ``assumed``, and every figure resting on them says so.

`group_top_k` is the routing's top-k: a grouped row's total rows over the rows (tokens) of its router, the
dense GEMM of the same parent module (`model.layers.*.mlp.gate` for `model.layers.*.mlp.experts`) whose n is the
number of groups; `measure.measure_experts` rebuilds the experts' whole forward with it.

Where a row's calls split their rows several ways (layers, steps), the row keeps the routing of median
imbalance (``group_routings`` says how many there were): the one `audit --measure` times.

The grouped roofline counts what a grouped GEMM moves: the real rows of A and C once, and each expert's
weights once per expert that gets rows (a dense floor of the total m reads B once, as if all experts shared
one weight). Waves count each group's own tiles (⌈rows/tile⌉ per group: a group's last tile is partly empty),
over all groups and for the largest group alone.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from cublaslt_probe.analysis.explain import roofline_floor
from cublaslt_probe.cases import group_sizes as even_sizes
from cublaslt_probe.cases import sizes_summary
from cublaslt_probe.dtypes import element_bytes
from cublaslt_probe.runfiles import GROUP_SIZES_FILE, LINE_KEY, read_group_sizes, where

GROUPED_COLUMNS: dict[str, tuple[str, str]] = {
    "sizes_source": ("category", "grouped GEMM: where its group sizes come from: recorded (the run folder's "
                                 "group_sizes.jsonl) or assumed (equal sizes: none recorded)"),
    "group_sizes": ("string", "grouped GEMM: the rows of each group along group_dim, a JSON list (the routing "
                              "of median imbalance when its calls split differently)"),
    "group_routings": ("Int64", "grouped GEMM: distinct splits among the calls joined to the row"),
    "group_min": ("Int64", "grouped GEMM: rows of the smallest group"),
    "group_max": ("Int64", "grouped GEMM: rows of the largest group"),
    "group_mean": ("float64", "grouped GEMM: mean rows per group"),
    "group_empty": ("Int64", "grouped GEMM: groups without rows"),
    "group_unaligned": ("Int64", "grouped GEMM: groups whose rows are not a multiple of 8"),
    "group_imbalance": ("float64", "grouped GEMM: largest group / mean group (1 = balanced)"),
    "group_top_k": ("Int64", "grouped GEMM: routed rows per token (its total rows over the tokens of the router: the "
                             "GEMM of the same parent module whose n is the groups); null where none is found"),
    "group_waves": ("float64", "grouped GEMM: all groups' tiles (⌈rows/tile⌉ each) over the SM count"),
    "largest_group_waves": ("float64", "grouped GEMM: the largest group's tiles over the SM count"),
}

ASSUMED_NOTE = ("{n} grouped GEMM row(s) without recorded group sizes ({why}): equal sizes assumed; their "
                "floor, waves and measurements rest on that and say 'assumed'")


def _dims(input_dims) -> list | None:
    try:
        d = json.loads(input_dims) if isinstance(input_dims, str) else None
    except ValueError:
        return None
    return d if isinstance(d, list) else None


def _total(r: dict) -> int | None:
    """A grouped row's total rows along its group dimension."""
    d = r.get("group_dim")
    v = r.get(d) if isinstance(d, str) else None
    return None if _missing(v) else int(v)


def _missing(v) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v)) or str(v) in ("<NA>", "nan")


def pick_routing(sizes_lists: list[list[int]]) -> tuple[list[int], int]:
    """The routing of median imbalance (max / mean) of `sizes_lists` (one per call), and how many distinct
    routings there are."""
    distinct = sorted({tuple(s) for s in sizes_lists},
                      key=lambda s: (sizes_summary(list(s)).get("imbalance") or 0, s))
    return list(distinct[(len(distinct) - 1) // 2]), len(distinct)


def roofline(sizes: list[int], group_dim: str, m: int, n: int, k: int, dtype: str | None, rates: tuple
             ) -> dict:
    """floor_us and bound of one grouped call with these group sizes (`join_sizes`' rule: real rows, each
    non-empty group's weights once); {} without the GPU's rates or the dtype's width."""
    peaks, bw, _ = rates
    nb, ob = element_bytes(dtype) or (None, None)
    peak = peaks.get(dtype) if peaks and dtype else None
    if not (peak and bw and nb):
        return {}
    live = sum(1 for s in sizes if s)
    if group_dim == "m":        # A [rows, k] split by rows, B [groups, k, n]: each live expert's weights once
        nbytes = m * k * nb + live * k * n * nb + m * n * ob
    elif group_dim == "k":      # weight gradient: A [m, K], B [K, n] split along K, C [groups, m, n]
        nbytes = m * k * nb + k * n * nb + len(sizes) * m * n * ob
    else:                       # split along n: A [m, k] read by every live group, B [k, N], C [m, N]
        nbytes = live * m * k * nb + k * n * nb + m * n * ob
    r = roofline_floor(2.0 * m * n * k, nbytes, peak, bw)
    return {"floor_us": r["floor_us"], "bound": r["bound"], "bytes": nbytes}


def waves(sizes: list[int], group_dim: str, m: int, n: int, tile_m, tile_n, sms) -> tuple[float | None,
                                                                                          float | None]:
    """(all groups' tiles, the largest group's tiles) over `sms`, each group tiled on its own (rows along the
    tile's first dimension, as torch's CUTLASS grouped kernel takes its problems); Nones without a tile or SMs."""
    if _missing(tile_m) or _missing(tile_n) or not sms or not sizes:
        return None, None
    tm, tn = int(tile_m), int(tile_n)

    def tiles(s: int) -> int:
        if group_dim == "m":
            return math.ceil(s / tm) * math.ceil(n / tn)
        if group_dim == "n":
            return math.ceil(m / tm) * math.ceil(s / tn)
        return math.ceil(m / tm) * math.ceil(n / tn) if s else 0
    return sum(tiles(s) for s in sizes) / sms, tiles(max(sizes)) / sms


def top_k(rows: dict, i, total: int | None) -> int | None:
    """The routed rows per token of grouped row `i` (module doc): its total over the m of the dense forward
    GEMM of the same parent module whose n is its groups; None where there is none or it does not divide."""
    r = rows[i]
    mod = r.get("module")
    if _missing(mod) or not total or "." not in str(mod):
        return None
    parent = str(mod).rsplit(".", 1)[0]
    for j, x in rows.items():
        xm = x.get("module")
        if (j != i and _missing(x.get("groups")) and not _missing(xm) and "." in str(xm)
                and str(xm).rsplit(".", 1)[0] == parent and x.get("pass") == "fwd"
                and not _missing(x.get("n")) and int(x["n"]) == int(r["groups"])
                and not _missing(x.get("m")) and int(x["m"]) and total % int(x["m"]) == 0):
            return total // int(x["m"])
    return None


def join_sizes(df, path, env: dict, gpus: dict, notes: list[str]):
    """The audit rows `df` with `GROUPED_COLUMNS` filled for its grouped rows and their floor_us, bound and
    floor_ratio counted by the grouped roofline (`roofline`); the run folder `path`'s group_sizes.jsonl
    joined as the module doc says. `gpus`: GPU name -> (peak rates as `audit.gpu_rates` gives them, SM count),
    the GPU a row's ``gpu`` names judges it (the first one for a row that names none). A note names the rows
    whose sizes are assumed, and why."""
    grouped = [i for i, g in zip(df.index, df["groups"].tolist()) if not _missing(g)]
    if not grouped:
        return df
    records, why = _recorded_sizes(path, env, notes)
    rows = df.to_dict("index")
    found, unfit = _found_sizes(rows, grouped, records)
    if unfit:
        line, got, n, total, groups = unfit[0]
        notes.append(f"{where(Path(path) / GROUP_SIZES_FILE, [u[0] for u in unfit])}: {len(unfit):,} group sizes "
                     f"record(s) skipped: their sizes do not split the rows of the GEMM they name (line {line}: "
                     f"{n} sizes adding up to {got:,}; the GEMM has {total:,} rows in {groups} groups)")
    cols, upd, assumed = _size_columns(rows, grouped, found, gpus)
    df = _with_columns(df, cols, upd)
    if assumed:
        notes.append(ASSUMED_NOTE.format(n=assumed, why=why))
    return df


def _recorded_sizes(path, env: dict, notes: list[str]) -> tuple[list[dict] | None, str]:
    """The group size records of the run folder `path` (`runfiles.read_group_sizes`, its skipped lines named on
    `notes`; None for a bare trace or none recorded), and why a grouped row has no recorded sizes: the words
    `ASSUMED_NOTE` gives for it (a bare
    trace, a run captured without recording them as the capture's `env` says, no file, or no matching call)."""
    p = Path(path)
    records = read_group_sizes(p, notes) if p.is_dir() else None
    if not p.is_dir():
        why = "a bare trace"
    elif records is None:
        cap = env.get("capture") or {}
        why = ("the run was captured without recording them" if "group_sizes_calls" in cap
               and cap["group_sizes_calls"] is None else "no group_sizes.jsonl in the run folder")
    else:
        why = "no recorded call matches them"
    return records, why


def _found_sizes(rows: dict, grouped: list, records: list[dict] | None
                 ) -> tuple[dict[int, list[list[int]]], list[tuple]]:
    """The recorded group sizes of each grouped row (`rows`: index -> row; `grouped`: the grouped indexes)
    that a record reaches, every recorded call's sizes in a list: a forward row by its op and first three
    operands' dims, a backward row by the forward rows of its module that it differentiates (module doc).
    Each record is checked against the row it names: its sizes must be the row's groups and add up to the row's
    total; the records that do not are left out and returned as (line, their sum, their count, the row's total,
    its groups), by line."""
    by_dims: dict[tuple, list[dict]] = {}
    for r in records or []:
        by_dims.setdefault((r.get("op"), json.dumps([r.get("a"), r.get("b"), r.get("offs")])), []).append(r)
    found: dict[int, list[list[int]]] = {}
    unfit: dict[int, tuple] = {}
    for i in grouped:
        r = rows[i]
        d = _dims(r.get("input_dims"))
        total, groups = _total(r), int(r["groups"])
        if not d or len(d) < 3 or total is None:
            continue
        good = []
        for rec in by_dims.get((r.get("op"), json.dumps(d[:3])), []):
            sizes = rec["sizes"]
            if sum(sizes) == total and len(sizes) == groups:
                good.append(list(sizes))
            else:
                unfit.setdefault(rec.get(LINE_KEY, 0), (rec.get(LINE_KEY, 0), sum(sizes), len(sizes), total, groups))
        if good:
            found[i] = good
    for i in grouped:                 # backward rows: the sizes of the forward rows they differentiate
        r = rows[i]
        if i in found or r.get("pass") != "bwd" or _missing(r.get("module")):
            continue
        same = [s for j in found if rows[j].get("pass") == "fwd" and rows[j].get("module") == r["module"]
                and int(rows[j]["groups"]) == int(r["groups"]) and _total(rows[j]) == _total(r)
                for s in found[j]]
        if same:
            found[i] = same
    return found, [unfit[k] for k in sorted(unfit)]


def _size_columns(rows: dict, grouped: list, found: dict[int, list[list[int]]], gpus: dict
                  ) -> tuple[dict[str, dict], dict[str, dict], int]:
    """For each grouped row with a total: its `GROUPED_COLUMNS` values (index -> value per column), from the
    sizes `found` gives it (the routing `pick_routing` keeps) or equal sizes; its roofline's floor_us, bound
    and floor_ratio by the GPU that judges it (`gpus`, as `join_sizes` takes it); and how many rows had their
    sizes assumed."""
    cols: dict[str, dict[int, object]] = {c: {} for c in GROUPED_COLUMNS}
    upd: dict[str, dict[int, object]] = {"floor_us": {}, "bound": {}, "floor_ratio": {}}
    assumed = 0
    for i in grouped:
        r = rows[i]
        total, groups = _total(r), int(r["groups"])
        if total is None:
            continue
        if i in found:
            sizes, routings = pick_routing(found[i])
            src = "recorded"
        else:
            sizes, routings, src = even_sizes("uniform", total, groups), 1, "assumed"
            assumed += 1
        rates, sms = gpus.get(r.get("gpu"), next(iter(gpus.values()), ((None, None, None), None)))
        s = sizes_summary(sizes)
        w_all, w_big = waves(sizes, r["group_dim"], int(r["m"]), int(r["n"]), r.get("tile_m"), r.get("tile_n"), sms)
        for c, v in (("sizes_source", src), ("group_sizes", json.dumps(sizes, separators=(",", ":"))),
                     ("group_routings", routings), ("group_min", s["min"]), ("group_max", s["max"]),
                     ("group_mean", s["mean"]), ("group_empty", s["empty"]), ("group_unaligned", s["unaligned"]),
                     ("group_imbalance", s["imbalance"]), ("group_top_k", top_k(rows, i, sum(sizes))),
                     ("group_waves", w_all), ("largest_group_waves", w_big)):
            cols[c][i] = v
        f = roofline(sizes, r["group_dim"], int(r["m"]), int(r["n"]), int(r["k"]), r.get("dtype"), rates)
        if f:
            upd["floor_us"][i] = f["floor_us"]
            upd["bound"][i] = f["bound"]
            upd["floor_ratio"][i] = r["mean_us"] / f["floor_us"] if f["floor_us"] else None
    return cols, upd, assumed


def _with_columns(df, cols: dict[str, dict], upd: dict[str, dict]):
    """A copy of `df` with every `GROUPED_COLUMNS` column set from `cols` (index -> value; missing elsewhere)
    in its dtype, and the values of `upd` written over its existing columns (``bound`` stays categorical)."""
    import pandas as pd
    df = df.copy()
    for c, (dt, _) in GROUPED_COLUMNS.items():
        vals = [cols[c].get(i) for i in df.index]
        df[c] = pd.array(vals, dtype="string").astype("category") if dt == "category" else pd.array(vals, dtype=dt)
    for c, vals in upd.items():
        if vals:
            col = df[c].astype("string") if c == "bound" else df[c].copy()
            for i, v in vals.items():
                col.at[i] = v
            df[c] = col.astype("category") if c == "bound" else col
    return df
