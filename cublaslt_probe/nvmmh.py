"""nvMatmulHeuristics beside cuBLASLt: NVIDIA's analytic GEMM model asked for its ranked configs and predicted
times, and scored against what cuBLASLt picked and what that pick measured (docs/nvmmh.md).

nvMatmulHeuristics (the `nvidia-matmul-heuristics` wheel: `libnvMatmulHeuristics.so.0`, its header and the
Python module `nvMatmulHeuristics`) is a model, not a kernel library: given a problem and a GPU named by its
predefined enum (H200 SXM, H100 SXM, ...) it returns CTA/warp/instruction tiles, cluster, load stages,
split-K and swizzle with a predicted runtime, on a CPU, without a driver or a device. Only when no GPU is
named does it look for the current device through libcuda, and without one it answers for some other GPU
(pre-Hopper configs, no clusters): this module always names one. The package's own
binding is used (its `NvMatmulHeuristicsInterfaceEx`), so this module needs no ctypes of its own; the wheel
is optional: without it every entry point raises `NvmmhUnavailable`, one line saying how to install it.

The problem is asked in cuBLAS's column-major view (`cases.Case.blas`: m = torch n, n = torch m, A = torch's
B, cuBLAS op(A) = the torch layout's second letter, op(B) its first), with nvMatmulHeuristics' `<opA><opB>_COL_MAJOR`
layout: torch `NT` (F.linear) is cuBLAS `TN` and `TN_COL_MAJOR` here. That is the frame in which an nvjet
name's `<M>x<N>` and the logged `tile`/`clusterShape` are written (docs/dataset.md, "How the evidence is
joined"), so a config's CTA tile M×N and cluster compare with cuBLASLt's pick as they stand.
The default target is CUTLASS 3 with the model-ranked candidate set (`PERF_MODEL_BASED_AUTO_TUNING`), as
CUTLASS's and torch inductor's integrations ask it: Hopper's warp-specialised TMA kernels are the nearest kin
of nvjet; `target` asks for another of `TARGETS`.
"""
from __future__ import annotations

import atexit
import math
import re
from dataclasses import asdict, dataclass
from functools import lru_cache

from cublaslt_probe.cases import Case
from cublaslt_probe.errors import OptionError, ProbeError

INSTALL = "pip install nvidia-matmul-heuristics"

# A sweep dtype -> nvMatmulHeuristics' precision string (cuBLAS's letters: A/B type, compute type, C/D type;
# five letters for fp8: A, B, C, compute, D). fp8 GEMMs write bf16, tf32 is fp32 data on TF32 tensor cores.
PRECISIONS = {"bf16": "TST", "fp16": "HSH", "fp32": "SSS", "tf32": "SFS", "fp8": "QQTST", "fp8_e5m2": "RQTST"}

# GPU names as drivers report them ("NVIDIA H200", "NVIDIA H100 80GB HBM3") or as a person writes them ->
# the library's predefined GPU; the first pattern that matches wins (PCIe and NVL before the SXM default).
_GPUS = ((r"h200", "H200_SXM"), (r"h100.*pcie", "H100_PCIE"), (r"h100.*nvl", "H100_NVL"), (r"h100", "H100_SXM"),
         (r"h20\b", "H20_SXM"), (r"gb300", "GB300_NVL"), (r"gb200", "GB200_NVL"), (r"b200", "B200"),
         (r"a100.*pcie", "A100_PCIE_80GB"), (r"a100", "A100_SXM_80GB"), (r"l40s", "L40S"), (r"l40\b", "L40"),
         (r"\bl4\b", "L4"), (r"a10\b", "A10_PCIE"), (r"a30\b", "A30_PCIE"), (r"a40\b", "A40_PCIE"))
TOP = 8  # configs asked per problem: as many as cuBLASLt's heuristic usually proposes
# The library's targets worth asking for cuBLAS's kernels (docs/nvmmh.md compares them on the H200 data).
TARGETS = ("CUTLASS3", "GENERIC", "CUTLASS")
TARGET = "CUTLASS3"


class NvmmhUnavailable(ProbeError):
    """The nvidia-matmul-heuristics wheel is not installed (or its library cannot load)."""


@dataclass(frozen=True)
class Config:
    """One ranked configuration (rank 1 = the model's best), in cuBLAS's column-major frame."""
    rank: int
    tile_m: int
    tile_n: int
    tile_k: int
    warp_m: int
    warp_n: int
    warp_k: int
    instr_m: int
    instr_n: int
    instr_k: int
    cluster_m: int
    cluster_n: int
    stages: int
    split_k: int
    swizzle: int
    cta_order: int
    pred_us: float

    @property
    def tile(self) -> str:
        return f"{self.tile_m}x{self.tile_n}"

    @property
    def cluster(self) -> str:
        return f"{self.cluster_m}x{self.cluster_n}"

    def as_dict(self) -> dict:
        return {**asdict(self), "tile": self.tile, "cluster": self.cluster}


def gpu_name(gpu: str) -> str:
    """The library's predefined GPU for a driver's or a person's name ("NVIDIA H200" -> "H200_SXM"); an enum
    name itself passes. An unknown GPU is an OptionError listing the known ones."""
    g = (gpu or "").strip()
    if g.upper() in _enum_names():
        return g.upper()
    low = g.lower()
    for pat, name in _GPUS:
        if re.search(pat, low):
            return name
    raise OptionError(f"GPU {gpu!r}: nvMatmulHeuristics models only its predefined GPUs; give one of "
                      f"{', '.join(_enum_names())} (or a driver name such as 'NVIDIA H200')")


def _enum_names() -> tuple[str, ...]:
    try:
        return tuple(g.name for g in _module().NvMatmulHeuristicsNvidiaGpu if g.name != "END")
    except NvmmhUnavailable:
        return tuple(dict.fromkeys(n for _, n in _GPUS))


def blas_problem(m: int, n: int, k: int, layout: str = "NT", batch: int = 1) -> tuple[int, int, int, int, str]:
    """The column-major problem cuBLAS receives for a torch-view GEMM: (M, N, K, batch, layout name), the
    layout as `<opA><opB>_COL_MAJOR` (`Case.blas` is the one home of the swap)."""
    b = Case("torch", "mm", "bf16", layout, m, n, k, batch).blas
    return b["blas_m"], b["blas_n"], b["blas_k"], batch, f"{b['blas_trans_a']}{b['blas_trans_b']}_COL_MAJOR"


def _module():
    try:
        import nvMatmulHeuristics
    except (ImportError, OSError) as e:
        raise NvmmhUnavailable(f"nvMatmulHeuristics is not available ({type(e).__name__}: {e}): "
                               f"{INSTALL}") from e
    return nvMatmulHeuristics


@lru_cache(maxsize=8)
def _interface(gpu: str, target: str):
    """One library handle per predefined GPU and target (creating one loads the library and its tables)."""
    m = _module()
    try:
        return m.NvMatmulHeuristicsInterfaceEx(backend=m.NvMatmulHeuristicsTarget[target],
                                               flags=m.NvMatmulHeuristicsFlags.PERF_MODEL_BASED_AUTO_TUNING,
                                               gpu=m.NvMatmulHeuristicsNvidiaGpu[gpu])
    except (OSError, AssertionError, RuntimeError) as e:  # a library it cannot load, or of another version
        raise NvmmhUnavailable(f"nvMatmulHeuristics failed to start ({type(e).__name__}: {e}): "
                               f"reinstall it with {INSTALL}") from e


# The binding's handles free their descriptors in __del__, which fails once the interpreter has begun to tear
# its modules down: drop them while everything is still there.
atexit.register(_interface.cache_clear)


@lru_cache(maxsize=65536)
def _ask(gpu: str, target: str, precision: str, M: int, N: int, K: int, batch: int, layout: str,
         top: int) -> tuple:
    m = _module()
    lh = _interface(gpu, target)
    problem = lh.makeNvMatmulHeuristicsProblem(M, N, K, m.NvMatmulHeuristicsMatmulLayout[layout], batch)
    out = []
    for i, r in enumerate(lh.get(problem, top, precision=precision), 1):
        c = r["kernel"]
        out.append(Config(i, c.cta_tile_m, c.cta_tile_n, c.cta_tile_k, c.warp_tile_m, c.warp_tile_n, c.warp_tile_k,
                          c.instr_tile_m, c.instr_tile_n, c.instr_tile_k, c.cluster_m, c.cluster_n, c.stages,
                          c.split_k, c.swizzle_factor, c.cta_order, r["runtime"] * 1e6))
    return tuple(out)


def configs(m: int, n: int, k: int, dtype: str = "bf16", layout: str = "NT", batch: int = 1, gpu: str = "H200",
            top: int = TOP, target: str = TARGET) -> list[Config]:
    """The model's top `top` configs for a torch-view GEMM (m, n, k, layout as in `cases.Case`) on `gpu`,
    best first, with predicted µs; [] when the model has none for the problem. A dtype it cannot model or
    an unknown GPU is an OptionError; a missing library `NvmmhUnavailable`."""
    if dtype not in PRECISIONS:
        raise OptionError(f"dtype {dtype!r}: nvMatmulHeuristics is asked for {', '.join(PRECISIONS)}")
    if target not in TARGETS:
        raise OptionError(f"target {target!r}: choose from {', '.join(TARGETS)}")
    if min(m, n, k, batch) < 1 or top < 1:
        raise OptionError(f"m={m} n={n} k={k} batch={batch} top={top}: give positive sizes")
    M, N, K, B, lay = blas_problem(m, n, k, layout, batch)
    return list(_ask(gpu_name(gpu), target, PRECISIONS[dtype], M, N, K, B, lay, top))


# ------------------------------------------------------------------------------- against cuBLASLt's pick
_PAIR = re.compile(r"^(\d+)x(\d+)")


def _pair(s) -> tuple[int, int] | None:
    m = _PAIR.match(s) if isinstance(s, str) else None
    return (int(m.group(1)), int(m.group(2))) if m else None


def _int(v) -> int | None:
    """An int, or None for a missing value (None, NaN, pandas' NA) or one that is not a number."""
    try:
        return None if v is None or (isinstance(v, float) and math.isnan(v)) else int(v)
    except (TypeError, ValueError):   # pandas' NA refuses int()
        return None


def pick_of(row: dict) -> dict:
    """cuBLASLt's pick of a dataset row in cuBLAS's column-major frame: tile and cluster (M, N) from the
    logged algo (`algo_tile`, `algo_cluster`), else from the decoded kernel name (nvjet and cutlass names
    write the logged tile; an xmma name writes it swapped: docs/dataset.md), split-K from the logged
    numSplitsK (else the name's flag), stages from the name. None where neither side says."""
    fam = row.get("family")
    named_tile = (_int(row.get("tile_m")), _int(row.get("tile_n")))
    named_cl = (_int(row.get("cluster_m")), _int(row.get("cluster_n")))
    if fam == "xmma":
        named_tile, named_cl = named_tile[::-1], named_cl[::-1]
    tile = _pair(row.get("algo_tile")) or (named_tile if None not in named_tile else None)
    cluster = _pair(row.get("algo_cluster")) or (named_cl if None not in named_cl else None)
    split = _int(row.get("algo_split_k"))
    named_split = row.get("split_k")
    if split is None and _int(named_split) is not None:
        split = 2 if named_split else 1   # the name says split-K but not how many ways
    return {"tile": tile, "cluster": cluster, "split_k": split, "stages": _int(row.get("stages"))}


def score_row(row: dict, cfgs: list[Config]) -> dict:
    """The nvmmh_* columns of one dataset row against the model's configs for its problem:
    `nvmmh_tile`/`nvmmh_cluster`/`nvmmh_stages`/`nvmmh_split_k` (its top-1), `nvmmh_us` (top-1 predicted µs),
    `nvmmh_agrees` (top-1 CTA tile = the pick's tile), `nvmmh_agrees_cluster` (tile and cluster),
    `nvmmh_tile_rank` (rank of the first config with the pick's tile; null when none of the top-k has it),
    `nvmmh_log_err` (ln(top-1 predicted / measured time_us)), `nvmmh_pick_us` (the predicted µs of that
    first config with the pick's tile: the model's time for the nearest config to the kernel that ran).
    Agreement is null where the pick has no tile."""
    pick = pick_of(row)
    out = dict.fromkeys(COLUMNS)
    if not cfgs:
        return out
    c = cfgs[0]
    out.update(nvmmh_tile=c.tile, nvmmh_cluster=c.cluster, nvmmh_stages=c.stages, nvmmh_split_k=c.split_k,
               nvmmh_us=c.pred_us)
    t = row.get("time_us")
    if isinstance(t, (int, float)) and t == t and t > 0 and c.pred_us > 0:
        out["nvmmh_log_err"] = math.log(c.pred_us / t)
    if pick["tile"] is not None:
        out["nvmmh_agrees"] = (c.tile_m, c.tile_n) == pick["tile"]
        if pick["cluster"] is not None:
            out["nvmmh_agrees_cluster"] = out["nvmmh_agrees"] and (c.cluster_m, c.cluster_n) == pick["cluster"]
        same = next((x for x in cfgs if (x.tile_m, x.tile_n) == pick["tile"]), None)
        if same is not None:
            out["nvmmh_tile_rank"], out["nvmmh_pick_us"] = same.rank, same.pred_us
    return out


COLUMNS = ("nvmmh_tile", "nvmmh_cluster", "nvmmh_stages", "nvmmh_split_k", "nvmmh_us", "nvmmh_agrees",
           "nvmmh_agrees_cluster", "nvmmh_tile_rank", "nvmmh_log_err", "nvmmh_pick_us")


def gpu_of(df) -> str:
    """The GPU a dataset ran on (its `gpu` column, else its env metadata); an OptionError when it has none."""
    if "gpu" in df.columns:
        names = [str(g) for g in df["gpu"].dropna().unique()]
        if len(names) == 1:
            return names[0]
        if len(names) > 1:
            raise OptionError(f"the dataset holds GPUs {', '.join(names)}: give --gpu to choose the one to model")
    g = (df.attrs.get("env") or {}).get("gpu")
    if g:
        return str(g)
    raise OptionError("the dataset names no GPU: give --gpu (e.g. H200)")


def scored(df, gpu: str | None = None, top: int = TOP, target: str = TARGET):
    """`df` (a dataset) with the nvmmh_* columns (`score_row`) on every row the model can be asked about:
    a measured GEMM (time_us, no error) of a dtype in PRECISIONS; other rows keep nulls. `gpu` defaults to
    the dataset's own (`gpu_of`)."""
    import pandas as pd
    gpu = gpu_name(gpu or gpu_of(df))
    rows = []
    for r in df.to_dict("records"):
        ok = r.get("dtype") in PRECISIONS and not _has(r.get("error")) and _pos(r.get("time_us")) \
            and all(_int(r.get(c)) for c in ("m", "n", "k"))
        cf = configs(int(r["m"]), int(r["n"]), int(r["k"]), r["dtype"], str(r["layout"]), _int(r.get("batch")) or 1,
                     gpu, top, target) if ok else []
        rows.append(score_row(r, cf) if ok else dict.fromkeys(COLUMNS))
    add = pd.DataFrame(rows, index=df.index, columns=list(COLUMNS))
    types = {"nvmmh_tile": "string", "nvmmh_cluster": "string", "nvmmh_stages": "Int64", "nvmmh_split_k": "Int64",
             "nvmmh_us": "float64", "nvmmh_agrees": "boolean", "nvmmh_agrees_cluster": "boolean",
             "nvmmh_tile_rank": "Int64", "nvmmh_log_err": "float64", "nvmmh_pick_us": "float64"}
    add = add.astype(types)
    out = df.drop(columns=[c for c in COLUMNS if c in df.columns]).join(add)
    out.attrs = dict(df.attrs)
    out.attrs["nvmmh"] = {"gpu": gpu, "top": top, "target": target}
    return out


def _has(v) -> bool:
    return v is not None and isinstance(v, str) and v != ""


def _pos(v) -> bool:
    return isinstance(v, (int, float)) and v == v and v > 0


def summary(sc, by: str = "dtype"):
    """Agreement and error of scored rows (`scored`), one row per value of `by` and one for all: rows
    compared, top-1 tile agreement (over the rows whose pick has a tile), tile+cluster agreement (over the
    rows whose pick has a cluster: `with_cluster`), the pick's tile anywhere in the top-k, the
    median and 90th percentile of |ln(predicted / measured)| of the model's top-1, the same median over the
    rows whose top-1 tile agrees, over the model's time for the pick's tile (`nvmmh_pick_us`), and the
    median ratio predicted / measured."""
    import numpy as np
    import pandas as pd
    s = sc[sc["nvmmh_us"].notna()]
    groups = [(str(v), g) for v, g in s.groupby(by, observed=True, sort=True)] if by in s.columns else []
    if len(groups) != 1:
        groups.append(("all", s))
    out = []
    for name, g in groups:
        has = g["nvmmh_agrees"].notna()
        err = g["nvmmh_log_err"].dropna().abs()
        agree = g.loc[g["nvmmh_agrees"].fillna(False).astype(bool), "nvmmh_log_err"].dropna().abs()
        pick_err = (g["nvmmh_pick_us"] / g["time_us"]).dropna().map(math.log).abs()
        out.append({
            by: name, "rows": len(g), "with_tile": int(has.sum()),
            "tile_agree_pct": _pct(g.loc[has, "nvmmh_agrees"]),
            "with_cluster": int(g["nvmmh_agrees_cluster"].notna().sum()),
            "tile_cluster_agree_pct": _pct(g.loc[g["nvmmh_agrees_cluster"].notna(), "nvmmh_agrees_cluster"]),
            "tile_in_topk_pct": _pct(g.loc[has, "nvmmh_tile_rank"].notna()),
            "median_abs_log_err": float(err.median()) if len(err) else None,
            "p90_abs_log_err": float(err.quantile(0.9)) if len(err) else None,
            "median_abs_log_err_agreeing": float(agree.median()) if len(agree) else None,
            "median_abs_log_err_pick": float(pick_err.median()) if len(pick_err) else None,
            "median_pred_over_measured": float(np.exp(g["nvmmh_log_err"].dropna().median()))
            if g["nvmmh_log_err"].notna().any() else None,
        })
    return pd.DataFrame(out)


def _pct(s) -> float | None:
    s = s.dropna()
    return round(100.0 * float(s.astype(bool).mean()), 1) if len(s) else None
