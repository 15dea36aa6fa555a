"""What a sweep runs (specs, presets, shards) and how it runs (windows, incremental raw file, resume).

A sweep is a list of *groups*; each group is a product shapes × dtypes × layouts × ops × backends. A spec
file is TOML (`.toml`) or JSON (`.json`) with the same structure (see docs/sweep.md):

    name = "my-sweep"
    [[group]]
    backends = ["torch", "torch-lt"]
    ops = ["mm"]
    dtypes = ["bf16", "fp16"]
    layouts = ["NT"]
    m = {pow2 = [1, 16384]}          # or a list, or {pow2 = [64, 8192], neighbours = [1, 8, 16]}
    n = [4096, 14336]
    k = [4096]
    # or: shapes = [[16, 4096, 4096], [128, 4096, 4096, 8]]   (m, n, k[, batch])

A group of grouped GEMMs (ops grouped_mm, scaled_grouped_mm) adds `groups` (an int or a list) and `group_sizes`
("uniform", "batched", {zipf = S}, {seed = N, top_k = K}, a list of row counts, or a list of these); its
shapes' m is the rows of all groups together (see `cases`):

    [[group]]
    ops = ["grouped_mm"]
    dtypes = ["bf16"]
    layouts = ["NT"]
    shapes = [[16384, 1536, 2048]]
    groups = 128
    group_sizes = ["uniform", {seed = 0, top_k = 8}, {zipf = 1.0}]

Combinations a product makes that cannot run (fp8 outside scaled_mm, bf16 on cupy, ...) are left out of the
plan and counted by reason, so the plan says what it skipped and why; nothing fails mid-sweep for that.
"""
from __future__ import annotations

import functools
import itertools
import json
import logging
import os
import shutil
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from cublaslt_probe.cases import BACKENDS, DTYPES, GROUPED_OPS, LAYOUTS, OPS, Case, invalid_reason, sizes_code
from cublaslt_probe.errors import SpecError
from cublaslt_probe.kinds import ENV_MATCH, PRESETS, TEST_BACKENDS, WINDOW
from cublaslt_probe.streams import open_text

log = logging.getLogger(__name__)


# --- axes -------------------------------------------------------------------------------------------------
def expand_axis(v, name: str) -> list[int]:
    """An axis value: int, list of ints, or {pow2 = [lo, hi], neighbours = [d, ...]}."""
    if isinstance(v, bool):
        raise SpecError(f"axis {name}: expected integers, got {v!r}")
    if isinstance(v, int):
        vals = [v]
    elif isinstance(v, list):
        vals = []
        for x in v:
            vals += expand_axis(x, name)
    elif isinstance(v, dict):
        unknown = set(v) - {"pow2", "neighbours", "range"}
        if unknown:
            raise SpecError(f"axis {name}: unknown keys {sorted(unknown)}; use pow2, neighbours or range")
        vals = []
        if "pow2" in v:
            lo, hi = _pair(v["pow2"], name)
            p = 1
            while p <= hi:
                if p >= lo:
                    vals.append(p)
                p *= 2
        if "range" in v:
            r = v["range"]
            if not (isinstance(r, list) and len(r) in (2, 3) and all(isinstance(x, int) for x in r)):
                raise SpecError(f"axis {name}: range = [start, stop] or [start, stop, step] (stop inclusive)")
            vals += list(range(r[0], r[1] + 1, r[2] if len(r) == 3 else 1))
        base = list(vals)
        for d in v.get("neighbours", []):
            vals += [x + s * d for x in base for s in (-1, 1)]
    else:
        raise SpecError(f"axis {name}: expected an int, a list or a table, got {type(v).__name__}")
    out = sorted({x for x in vals if x >= 1})
    if not out:
        raise SpecError(f"axis {name}: no positive values in {v!r}")
    return out


def _pair(v, name):
    if isinstance(v, list) and len(v) == 2 and all(isinstance(x, int) for x in v) and 1 <= v[0] <= v[1]:
        return v
    raise SpecError(f"axis {name}: pow2 = [lo, hi] with 1 <= lo <= hi, got {v!r}")


def _choice(g: dict, key: str, allowed, default):
    vals = g.get(key, default)
    if isinstance(vals, str):
        vals = [vals]
    bad = [v for v in vals if v not in allowed]
    if bad:
        raise SpecError(f"group {key}: unknown {bad}; choose from {', '.join(allowed)}")
    return list(vals)


# --- the plan: columns, a Case made when one is read ---------------------------------------------------------
NAMES = {"backend": BACKENDS + TEST_BACKENDS, "op": OPS, "dtype": DTYPES, "layout": LAYOUTS}
SIZES = ("m", "n", "k", "batch")
GROUPED = ("groups", "sizes")   # columns a plan with grouped GEMMs has: int32 groups, sizes codes (str objects)


class Cases(Sequence):
    """A plan's GEMMs as columns (numpy: int8 codes into `NAMES` for the four names, int32 sizes, and for a plan
    holding grouped GEMMs the `GROUPED` columns); reading one makes its `Case`. Slicing gives another `Cases`
    over views (a shard costs nothing)."""

    __slots__ = ("cols",)

    def __init__(self, cols: dict):
        self.cols = cols

    def __len__(self) -> int:
        return len(self.cols["m"])

    def __getitem__(self, i):
        if isinstance(i, slice):
            return Cases({f: a[i] for f, a in self.cols.items()})
        c = self.cols
        grouped = (int(c["groups"][i]), c["sizes"][i]) if "groups" in c else ()
        return Case(*(NAMES[f][c[f][i]] for f in NAMES), *(int(c[f][i]) for f in SIZES), *grouped)

    def __iter__(self):
        names = [[NAMES[f][x] for x in self.cols[f].tolist()] for f in NAMES]
        grouped = [self.cols[f].tolist() for f in GROUPED if f in self.cols]
        for row in zip(*names, *(self.cols[f].tolist() for f in SIZES), *grouped):
            yield Case(*row)

    def keys(self) -> list[str]:
        """`Case.key` of every GEMM, in order (built from the columns, without making the Cases)."""
        return [k for ks in self.key_chunks() for k in ks]

    def key_chunks(self, rows: int = 1 << 16):
        """`keys()`, a list of `rows` at a time (a million keys are never held at once)."""
        c = self.cols
        prefixes = _combo_prefixes()
        for i in range(0, len(self), rows):
            s = slice(i, i + rows)
            prefix = prefixes[_combo_code(c["backend"][s], c["op"][s], c["dtype"][s], c["layout"][s])].tolist()
            keys = [f"{p}{m}|{n}|{k}|{b}" for p, m, n, k, b in zip(prefix, *(c[f][s].tolist() for f in SIZES))]
            if "groups" in c:   # a grouped GEMM's key ends with its groups and sizes (`Case.key`)
                keys = [f"{x}|{g}|{z}" if g else x for x, g, z in zip(keys, c["groups"][s].tolist(), c["sizes"][s])]
            yield keys


def _combo_code(backend, op, dtype, layout):
    import numpy as np
    b, o, d, lay = (np.asarray(x, dtype=np.int64) for x in (backend, op, dtype, layout))
    return ((b * len(OPS) + o) * len(DTYPES) + d) * len(LAYOUTS) + lay


@functools.cache
def _combo_prefixes():
    import numpy as np
    return np.array([f"{b}|{o}|{d}|{lay}|" for b, o, d, lay in
                     itertools.product(*NAMES.values())], dtype=object)


@dataclass
class Plan:
    name: str
    cases: Cases
    skipped: Counter = field(default_factory=Counter)
    spec: dict | None = None              # what it was built from (travels in the raw file: merge rebuilds it)
    backends: list[str] | None = None

    def summary(self) -> str:
        import numpy as np
        c = self.cases.cols
        codes, counts = np.unique(c["backend"].astype(np.int64) * len(DTYPES) + c["dtype"], return_counts=True)
        by = {(NAMES["backend"][x // len(DTYPES)], NAMES["dtype"][x % len(DTYPES)]): int(n)
              for x, n in zip(codes.tolist(), counts)}
        s = [f"sweep {self.name!r}: {len(self.cases)} GEMMs"]
        s.append("  " + ", ".join(f"{b}/{d}: {n}" for (b, d), n in sorted(by.items())))
        if self.skipped:
            s.append(f"  left out {sum(self.skipped.values())} combinations that cannot run:")
            s += [f"    {n} × {why}" for why, n in self.skipped.most_common()]
        return "\n".join(s)

    def digest(self) -> str:
        """sha256 of the ordered keys: the identity a part records and merge checks. Computed once (0.8 s for
        a million GEMMs; a `--devices` worker records it in every fine slice it takes)."""
        import hashlib
        if self.__dict__.get("_digest") is None:
            h = hashlib.sha256()
            for i, ks in enumerate(self.cases.key_chunks()):
                h.update((("\n" if i else "") + "\n".join(ks)).encode())
            self.__dict__["_digest"] = "sha256:" + h.hexdigest()
        return self.__dict__["_digest"]

    def identity(self) -> dict:
        """What a raw file records so that `merge` can rebuild this plan and check it is the same."""
        return {"spec": self.spec, "backends": self.backends, "cases": len(self.cases), "digest": self.digest()}


def plan_from_spec(spec: dict, backends: list[str] | None = None) -> Plan:
    """Expand a spec dict into the plan (deterministic order: shape by shape, then op, dtype, layout, backend;
    duplicates removed, the first kept).

    A combination's validity (`invalid_reason`) depends on its backend, op, dtype, layout and batch, not on
    its sizes (positive by construction), so it is asked once per combination of a group; the shapes are
    expanded as arrays.
    """
    import numpy as np
    if not isinstance(spec, dict) or "group" not in spec:
        raise SpecError("a sweep spec needs at least one [[group]] table (see docs/sweep.md)")
    groups = spec["group"]
    if isinstance(groups, dict):
        groups = [groups]
    blocks, skipped, repeats = [], Counter(), False
    for gi, g in enumerate(groups):
        unknown = set(g) - {"backends", "ops", "dtypes", "layouts", "m", "n", "k", "batch", "shapes", "groups",
                            "group_sizes"}
        if unknown:
            raise SpecError(f"group {gi}: unknown keys {sorted(unknown)}")
        bes = _choice(g, "backends", NAMES["backend"], ["torch"])
        if backends:
            bes = [b for b in bes if b in backends]
        ops = _choice(g, "ops", OPS, ["mm"])
        dts = _choice(g, "dtypes", DTYPES, ["bf16"])
        lays = _choice(g, "layouts", LAYOUTS, ["NN"])
        if "shapes" in g:
            shapes = []
            for s in g["shapes"]:
                if not (isinstance(s, list) and len(s) in (3, 4) and
                        all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in s)):
                    raise SpecError(f"group {gi}: shape {s!r} must be [m, n, k] or [m, n, k, batch] of positive ints")
                shapes.append(tuple(s) if len(s) == 4 else (*s, 1))
            repeats = repeats or len(set(shapes)) < len(shapes)     # (a product of axes never repeats)
            shapes = np.array(shapes, dtype=np.int64).reshape(-1, 4)
        else:
            for ax in ("m", "n", "k"):
                if ax not in g:
                    raise SpecError(f"group {gi}: give `shapes` or all of m, n, k")
            axes = [expand_axis(g[a], a) for a in ("m", "n", "k")] + [expand_axis(g.get("batch", 1), "batch")]
            grid = np.meshgrid(*(np.array(a, dtype=np.int64) for a in axes), indexing="ij")
            shapes = np.stack([x.ravel() for x in grid], axis=1)
        if not len(shapes):
            continue
        if any(op in GROUPED_OPS for op in ops) or "groups" in g or "group_sizes" in g:
            block = _grouped_block(gi, g, shapes, ops, dts, lays, bes, skipped)
            if block is not None:
                blocks.append(block)
                repeats = True
            continue
        combos = []   # the valid combinations, in product order
        for op, dt, lay, be in itertools.product(ops, dts, lays, bes):
            m, n, k, b = (int(x) for x in shapes[0])
            c = Case(be, op, dt, lay, m, n, k, (8 if b == 1 else b) if op == "bmm" else 1)
            why = invalid_reason(c) if be != "numpy" else numpy_invalid(c)
            if why:
                skipped[why.split(": ", 1)[-1]] += len(shapes)
            else:
                combos.append((NAMES["backend"].index(be), OPS.index(op), DTYPES.index(dt), LAYOUTS.index(lay)))
        if not combos:
            continue
        repeats = repeats or bool((shapes[:, 3] != 1).any())    # batch 1 runs bmm as 8; mm drops the batch
        if shapes.max() > np.iinfo(np.int32).max:
            raise SpecError(f"group {gi}: sizes above {np.iinfo(np.int32).max} cannot run")
        combos = np.array(combos, dtype=np.int8)
        shapes = shapes.astype(np.int32)
        si = np.repeat(np.arange(len(shapes)), len(combos))
        ci = np.tile(np.arange(len(combos)), len(shapes))
        cols = {f: combos[ci, j] for j, f in enumerate(NAMES)}     # int8 codes and int32 sizes: 20 bytes a GEMM
        cols.update({f: shapes[si, j] for j, f in enumerate(SIZES)})
        del si, ci
        bmm = cols["op"] == OPS.index("bmm")
        cols["batch"] = np.where(bmm, np.where(cols["batch"] == 1, 8, cols["batch"]), 1).astype(np.int32)
        blocks.append(cols)
    if not blocks:
        cols = {f: np.zeros(0, dtype=np.int8 if f in NAMES else np.int32) for f in (*NAMES, *SIZES)}
    elif len(blocks) == 1 and not repeats:   # one product of distinct shapes: nothing repeats
        cols = blocks[0]
    else:
        if any("groups" in b for b in blocks):   # dense blocks get no groups, grouped ones keep theirs
            for b in blocks:
                b.setdefault("groups", np.zeros(len(b["m"]), dtype=np.int32))
                b.setdefault("sizes", np.full(len(b["m"]), "", dtype=object))
        cols = {f: np.concatenate([b.pop(f) for b in blocks]) for f in (*NAMES, *SIZES, *GROUPED) if f in blocks[0]}
        cols = _first_of_each(cols)
    return Plan(spec.get("name", "spec"), Cases(cols), skipped, spec=spec, backends=backends)


def _grouped_block(gi: int, g: dict, shapes, ops, dts, lays, bes, skipped: Counter) -> dict | None:
    """The columns of a group of grouped GEMMs: shapes x groups x group_sizes x op x dtype x layout x backend,
    each shape's m the rows of all groups together; in the batched (3-D x 3-D) form the Case's m is the rows
    of one group and its batch the groups (`cases`). Combinations that cannot run are counted in `skipped`."""
    import numpy as np
    dense = [op for op in ops if op not in GROUPED_OPS]
    if dense:
        raise SpecError(f"group {gi}: ops {dense} are not grouped: put grouped ops ({', '.join(GROUPED_OPS)}) "
                        "in a [[group]] of their own")
    if "batch" in g or (shapes[:, 3] != 1).any():
        raise SpecError(f"group {gi}: grouped GEMMs take `groups` and `group_sizes`, not a batch")
    raw = g.get("group_sizes", "uniform")
    if isinstance(raw, list) and not raw:
        raise SpecError(f"group {gi}: group_sizes is empty; give \"uniform\" or the sizes to plan")
    if isinstance(raw, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in raw):
        raw = [raw]   # one explicit list of row counts
    try:
        codes = list(dict.fromkeys(sizes_code(x) for x in (raw if isinstance(raw, list) else [raw])))
    except ValueError as e:
        raise SpecError(f"group {gi}: {e}") from e
    explicit = [c for c in codes if c.startswith("sizes=")]
    if "groups" in g:
        groups = expand_axis(g["groups"], "groups")
    elif explicit and len(codes) == 1:
        groups = [len(explicit[0].split(","))]
    else:
        raise SpecError(f"group {gi}: grouped GEMMs need `groups` (an int or a list): the number of experts")
    for c in explicit:
        n = len(c.split(","))
        rows = sum(int(x) for x in c[len("sizes="):].split(","))
        if groups != [n] or any(int(m) != rows for m in shapes[:, 0]):
            raise SpecError(f"group {gi}: group_sizes {c[6:46]}...: {n} groups of {rows} rows in all, so the "
                            f"group needs groups = {n} and every shape's m = {rows}")
    rows = []
    for (m, n, k, _), ng, code, op, dt, lay, be in itertools.product(
            shapes.tolist(), groups, codes, ops, dts, lays, bes):
        batched = code == "batched"
        if batched and m % ng:
            skipped[f"batched group_sizes need m a multiple of groups (m {m}, groups {ng})"] += 1
            continue
        c = Case(be, op, dt, lay, m // ng if batched else m, n, k, ng if batched else 1, ng, code)
        why = invalid_reason(c) if be != "numpy" else numpy_invalid(c)
        if why:
            skipped[why.split(": ", 1)[-1]] += 1
            continue
        rows.append(c)
    if not rows:
        return None
    if max(max(c.m, c.n, c.k, c.groups) for c in rows) > np.iinfo(np.int32).max:
        raise SpecError(f"group {gi}: sizes above {np.iinfo(np.int32).max} cannot run")
    cols = {f: np.array([NAMES[f].index(getattr(c, f)) for c in rows], dtype=np.int8) for f in NAMES}
    cols.update({f: np.array([getattr(c, f) for c in rows], dtype=np.int32) for f in (*SIZES, "groups")})
    cols["sizes"] = np.array([c.sizes for c in rows], dtype=object)
    return cols


def _first_of_each(cols: dict) -> dict:
    """Drop repeated GEMMs, keeping each one's first place."""
    import numpy as np
    code = _combo_code(cols["backend"], cols["op"], cols["dtype"], cols["layout"])
    extra = ()
    if "groups" in cols:   # grouped GEMMs differ in groups and sizes too (the codes as integers)
        extra = (cols["groups"], np.unique(cols["sizes"].astype(str), return_inverse=True)[1])
    order = np.lexsort((*extra, cols["batch"], cols["k"], cols["n"], cols["m"], code))   # stable: first place first
    same = np.ones(len(order) - 1, dtype=bool) if len(order) else np.zeros(0, dtype=bool)
    for a in (code, cols["m"], cols["n"], cols["k"], cols["batch"], *extra):
        s = a[order]
        same &= s[1:] == s[:-1]
    if not same.any():
        return cols
    keep = np.ones(len(order), dtype=bool)
    keep[order[1:][same]] = False
    return {f: a[keep] for f, a in cols.items()}


def numpy_invalid(c: Case) -> str | None:
    if c.dtype not in ("fp32", "fp16") or c.op not in ("mm", "bmm", "addmm"):
        return f"{c.backend}/{c.op}/{c.dtype}: the numpy test backend runs fp32/fp16 mm, bmm, addmm"
    if c.op == "bmm" and c.batch < 2:
        return f"{c.backend}/bmm: needs batch >= 2"
    return None


def load_spec(path: str) -> dict:
    if not os.path.exists(path):
        raise SpecError(f"spec file {path} does not exist")
    try:
        if path.endswith(".toml"):
            import tomllib
            with open(path, "rb") as f:
                return tomllib.load(f)
        if path.endswith(".json"):
            with open(path) as f:
                return json.load(f)
    except (ValueError, OSError) as e:
        raise SpecError(f"spec file {path} could not be read: {e}") from e
    raise SpecError(f"spec file {path}: use a .toml or .json file (see docs/sweep.md)")


# --- presets ----------------------------------------------------------------------------------------------
# (name, hidden, intermediate, q+k+v out, vocab): projection shapes of open models, F.linear weights (N, K).
LLM_MODELS = [
    ("llama3-8b", 4096, 14336, 4096 + 2 * 1024, 128256),
    ("llama3-70b", 8192, 28672, 8192 + 2 * 1024, 128256),
    ("mixtral-8x7b", 4096, 14336, 4096 + 2 * 1024, 32000),
    ("qwen2.5-7b", 3584, 18944, 3584 + 2 * 512, 152064),
]
TOKENS = [1, 4, 16, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]


def llm_weights() -> list[tuple[int, int]]:
    """Distinct (N, K) = (out_features, in_features) of the projections: qkv, o, gate+up, down, lm_head."""
    w = []
    for _, h, inter, qkv, vocab in LLM_MODELS:
        w += [(qkv, h), (h, h), (2 * inter, h), (h, inter), (vocab, h)]
    return sorted(set(w))


# (name, hidden, expert intermediate, experts on one GPU, top-k routed rows per token on one GPU): the expert
# GEMMs of open MoE models as one GPU runs them. DeepSeek-V3's 256 routed experts (top-8) are served with
# expert parallelism: one of 8 ranks holds 32 of them and gets, on average, one routed row per token.
MOE_MODELS = [
    ("mixtral-8x7b", 4096, 14336, 8, 2),
    ("qwen3-moe-30b-a3b", 2048, 768, 128, 8),
    ("deepseek-v3-ep8", 7168, 2048, 32, 1),
    ("gpt-oss-120b", 2880, 2880, 128, 4),
]
MOE_TOKENS = [16, 128, 2048, 8192]


def moe_groups() -> list[dict]:
    """The moe preset's groups: for each model, its two expert GEMMs (gate+up: n = 2 x intermediate, k = hidden;
    down: n = hidden, k = intermediate) at MOE_TOKENS tokens (m = tokens x top-k rows), in bf16 with uniform,
    random top-k and skewed group sizes, the 3-D x 3-D form, and fp8 with random routing."""
    out = []
    for _, h, inter, experts, top in MOE_MODELS:
        shapes = [[t * top, n, k] for t in MOE_TOKENS for n, k in ((2 * inter, h), (h, inter))]
        base = {"backends": ["torch"], "layouts": ["NT"], "shapes": shapes, "groups": experts}
        out.append({**base, "ops": ["grouped_mm"], "dtypes": ["bf16"],
                    "group_sizes": ["uniform", {"seed": 0, "top_k": top}, {"zipf": 1.0}, "batched"]})
        out.append({**base, "ops": ["scaled_grouped_mm"], "dtypes": ["fp8"], "group_sizes": [{"seed": 0, "top_k": top}]})
    return out


def preset(name: str) -> dict:
    all_be = ["torch", "torch-lt", "cupy", "lt"]
    if name == "quick":
        shapes = [[1, 4096, 4096], [16, 4096, 4096], [128, 4096, 4096], [1024, 4096, 4096],
                  [4096, 4096, 4096], [127, 4095, 8191]]
        return {"name": "quick", "group": [
            {"backends": ["torch", "torch-lt", "lt"], "ops": ["mm"], "dtypes": ["fp32", "tf32", "fp16", "bf16"],
             "layouts": ["NN", "NT"], "shapes": shapes},
            {"backends": ["torch", "torch-lt"], "ops": ["addmm"], "dtypes": ["bf16"], "layouts": ["NT"],
             "shapes": shapes},
            {"backends": ["torch", "lt"], "ops": ["scaled_mm"], "dtypes": ["fp8"], "layouts": ["NT"],
             "shapes": shapes[:5]},
            {"backends": ["cupy"], "ops": ["mm"], "dtypes": ["fp32", "fp16"], "layouts": ["NN", "NT"],
             "shapes": shapes},
            {"backends": ["torch", "cupy"], "ops": ["bmm"], "dtypes": ["fp16"], "layouts": ["NN", "TN"],
             "shapes": [[128, 128, 64, 8], [512, 512, 512, 8]]},
        ]}
    if name == "llm":
        shapes = [[t, n, k] for (n, k) in llm_weights() for t in TOKENS]
        big = [s for s in shapes if s[0] * s[1] * s[2] > 2 ** 36]   # > 68.7 GFLOP/2: fp32 would dominate
        small = [s for s in shapes if s not in big]
        return {"name": "llm", "group": [
            {"backends": all_be, "ops": ["mm"], "dtypes": ["bf16", "fp16"], "layouts": ["NN", "NT", "TN", "TT"],
             "shapes": shapes},
            {"backends": all_be, "ops": ["mm"], "dtypes": ["fp32", "tf32"], "layouts": ["NT"], "shapes": small},
            {"backends": ["torch", "torch-lt"], "ops": ["addmm"], "dtypes": ["bf16"], "layouts": ["NT"],
             "shapes": shapes},
            {"backends": ["torch", "lt"], "ops": ["scaled_mm"], "dtypes": ["fp8"], "layouts": ["NT"],
             "shapes": shapes},
        ]}
    if name == "square":
        cubes = [[x, x, x] for x in expand_axis({"pow2": [64, 8192], "neighbours": [1, 8, 16]}, "m")]
        return {"name": "square", "group": [
            {"backends": all_be, "ops": ["mm"], "dtypes": ["fp32", "tf32", "fp16", "bf16"],
             "layouts": ["NN", "NT", "TN", "TT"], "shapes": cubes},
            {"backends": ["torch", "lt"], "ops": ["scaled_mm"], "dtypes": ["fp8"], "layouts": ["NT"],
             "shapes": [s for s in cubes if s[0] % 16 == 0]},
        ]}
    if name == "grid":  # the natural input of `map`: m x n at a fixed k
        ax = sorted({x for p in range(4, 15) for x in (2 ** p, 3 * 2 ** (p - 1))} - {24576})
        g = {"m": ax, "n": ax, "k": [4096]}
        return {"name": "grid", "group": [
            {"backends": ["torch", "torch-lt", "lt"], "ops": ["mm"], "dtypes": ["bf16"], "layouts": ["NN", "NT"], **g},
            {"backends": ["torch", "torch-lt", "lt"], "ops": ["mm"], "dtypes": ["fp16", "tf32"], "layouts": ["NT"], **g},
            {"backends": ["torch", "lt"], "ops": ["scaled_mm"], "dtypes": ["fp8"], "layouts": ["NT"], **g},
        ]}
    if name == "regret":  # heuristic candidates for the llm shapes: run with --candidates 32
        shapes = [[t, n, k] for (n, k) in llm_weights() for t in TOKENS]
        return {"name": "regret", "group": [
            {"backends": ["lt"], "ops": ["mm"], "dtypes": ["bf16"], "layouts": ["NT"], "shapes": shapes},
            {"backends": ["lt"], "ops": ["scaled_mm"], "dtypes": ["fp8"], "layouts": ["NT"], "shapes": shapes},
        ]}
    if name == "decode":
        return {"name": "decode", "group": [
            {"backends": ["torch", "torch-lt", "lt"], "ops": ["mm"], "dtypes": ["bf16", "fp16"], "layouts": ["NT"],
             "m": {"range": [1, 256]}, "n": [4096, 6144, 14336], "k": [4096]},
            {"backends": ["torch", "lt"], "ops": ["scaled_mm"], "dtypes": ["fp8"], "layouts": ["NT"],
             "m": {"range": [16, 256, 16]}, "n": [4096, 14336], "k": [4096]},
        ]}
    if name == "moe":   # mixture-of-experts expert GEMMs (grouped): see MOE_MODELS
        return {"name": "moe", "group": moe_groups()}
    raise SpecError(f"unknown preset {name!r}: choose from {', '.join(PRESETS)}")



def plan(preset_name: str | None = None, spec_path: str | None = None, backends: list[str] | None = None) -> Plan:
    if bool(preset_name) == bool(spec_path):
        raise SpecError("give exactly one of --preset NAME or --spec FILE")
    spec = preset(preset_name) if preset_name else load_spec(spec_path)
    return plan_from_spec(spec, backends)


# --- slices: which part of the plan this process runs -------------------------------------------------------
@dataclass(frozen=True)
class Slice:
    """Slice `index` of `count` (1-based): every count-th GEMM of the plan from the index-th. `source` says
    where it came from; `local_rank` is the GPU a launcher gave this process (torchrun's LOCAL_RANK).

    With `block` = (j, parts), only the j-th of `parts` contiguous runs of those GEMMs: how `sweep --devices`
    cuts its slice, so that each worker meets neighbouring GEMMs, which share kernels (each process loads the
    module of every kernel it meets)."""

    index: int
    count: int
    source: str = "--shard"
    local_rank: int | None = None
    block: tuple[int, int] | None = None

    @property
    def spec(self) -> str:
        """`I/N`, or `I/N:J/P` for block J of P of slice I/N (what a raw file's environment line records)."""
        s = f"{self.index}/{self.count}"
        return f"{s}:{self.block[0]}/{self.block[1]}" if self.block else s

    def take(self, cases):
        sel = cases[self.index - 1::self.count]
        if self.block:
            j, parts = self.block
            sel = sel[(j - 1) * len(sel) // parts:j * len(sel) // parts]
        return sel

    def split(self, j: int, parts: int) -> "Slice":
        """Part j (1-based) of this slice cut `parts` ways, as a slice of the whole plan: the j-th of every
        `parts` GEMMs of slice i/n is GEMM i + (j-1)·n of every n·parts."""
        return Slice(self.index + (j - 1) * self.count, self.count * parts, f"{self.source}, part {j}/{parts}",
                     self.local_rank)

    def cut(self, j: int, parts: int) -> "Slice":
        """Block j (1-based) of this slice cut into `parts` contiguous runs of its GEMMs."""
        return Slice(self.index, self.count, f"{self.source}, block {j}/{parts}", self.local_rank, (j, parts))

    @property
    def family(self) -> tuple[int, int]:
        """(count, blocks per slice): the slices of one family cover a plan exactly once between them."""
        return self.count, self.block[1] if self.block else 1

    @property
    def member(self) -> int:
        """0-based number of this slice within its family (`members` numbers the GEMMs alike)."""
        return (self.index - 1) * self.family[1] + (self.block[0] - 1 if self.block else 0)

    def members(self, g, n: int):
        """The family member (0-based, as `member`) that holds each plan position of `g` (numpy), in a plan of
        `n` GEMMs."""
        import numpy as np
        g = np.asarray(g, dtype=np.int64)
        count, parts = self.family
        i0 = g % count
        if parts == 1:
            return i0
        k, length = g // count, (n - 1 - i0) // count + 1       # position within slice i0+1, its length
        # block j (0-based) starts at j·L // P: the last start at or before k
        return i0 * parts + np.minimum(((k + 1) * parts + length - 1) // length - 1, parts - 1)

    def describe(self) -> str:
        return f"block {self.block[0]}/{self.block[1]} of slice {self.index}/{self.count}" if self.block \
            else f"slice {self.spec}"


WHOLE = Slice(1, 1, "whole plan")


def parse_shard(spec: str, source: str = "--shard", blocks: bool = False) -> Slice:
    """`I/N` (1-based); with `blocks`, also `I/N:J/P` (block J of P of slice I/N, as a raw file records it)."""
    head, _, tail = spec.partition(":") if blocks else (spec, "", "")
    why = (f"{source} {spec!r}: expected I/N or I/N:J/P with 1 <= I <= N and 1 <= J <= P (a sweep writes one of "
           "these; the file was edited: run its slice again)" if blocks else
           f"{source} {spec!r}: expected I/N with 1 <= I <= N, e.g. 1/4, or auto")
    try:
        i, n = (int(x) for x in head.split("/"))
        j, p = (int(x) for x in tail.split("/")) if tail else (1, 1)
    except ValueError as e:
        raise SpecError(why) from e
    if not 1 <= i <= n or not 1 <= j <= p:
        raise SpecError(why)
    return Slice(i, n, source, block=(j, p) if tail else None)


def shard(cases, spec: str | None):
    """`I/N` (1-based): every N-th case starting at the I-th, deterministic for a given plan."""
    return parse_shard(spec).take(cases) if spec else cases


SCHEDULER_VARS = "SLURM_ARRAY_TASK_ID (Slurm job array), RANK and WORLD_SIZE (torchrun), JOB_COMPLETION_INDEX " \
                 "(Kubernetes Indexed Job)"


def _env_int(environ, name: str, who: str) -> int:
    v = environ.get(name)
    if v is None or not v.strip().lstrip("-").isdigit():
        raise SpecError(f"--shard auto: {who} but {name}={v!r} is not an integer")
    return int(v)


def shard_from_env(environ=None, shard_count: int | None = None) -> Slice:
    """The slice a scheduler gave this process, read from its environment (`--shard auto`).

    - Slurm job array: SLURM_ARRAY_TASK_ID within SLURM_ARRAY_TASK_MIN..MAX, a contiguous array (step 1,
      SLURM_ARRAY_TASK_COUNT = MAX - MIN + 1): slice ID - MIN + 1 of COUNT.
    - Kubernetes Indexed Job: JOB_COMPLETION_INDEX (0-based) of `shard_count` (the Job's completions, which the
      pod's environment does not hold).
    - torchrun / torch.distributed: RANK of WORLD_SIZE; LOCAL_RANK is the GPU of this process on its host.
    A launcher inside an array task (torchrun in each Slurm task or Indexed Job pod) slices the task's slice.
    """
    environ = os.environ if environ is None else environ
    outer = None
    if "SLURM_ARRAY_TASK_ID" in environ:
        who = "a Slurm job array (SLURM_ARRAY_TASK_ID is set)"
        tid = _env_int(environ, "SLURM_ARRAY_TASK_ID", who)
        lo = _env_int(environ, "SLURM_ARRAY_TASK_MIN", who)
        hi = _env_int(environ, "SLURM_ARRAY_TASK_MAX", who)
        if not lo <= tid <= hi:
            raise SpecError(f"--shard auto: SLURM_ARRAY_TASK_ID={tid} is outside SLURM_ARRAY_TASK_MIN..MAX = "
                            f"{lo}..{hi}")
        step = environ.get("SLURM_ARRAY_TASK_STEP")
        if step is not None and _env_int(environ, "SLURM_ARRAY_TASK_STEP", who) != 1:
            raise SpecError(f"--shard auto: the Slurm array steps by {step} (SLURM_ARRAY_TASK_STEP): every task "
                            f"id from {lo} to {hi} must run; submit a contiguous array, e.g. --array={lo}-{hi}")
        if "SLURM_ARRAY_TASK_COUNT" in environ:
            count = _env_int(environ, "SLURM_ARRAY_TASK_COUNT", who)
            if count != hi - lo + 1:
                raise SpecError(f"--shard auto: the Slurm array is not contiguous (SLURM_ARRAY_TASK_COUNT={count} "
                                f"tasks, ids {lo}..{hi}): submit a contiguous array, e.g. --array=0-{count - 1}")
        outer = Slice(tid - lo + 1, hi - lo + 1, f"SLURM_ARRAY_TASK_ID={tid} of array {lo}-{hi}")
    if "JOB_COMPLETION_INDEX" in environ:
        if outer is not None:
            raise SpecError("--shard auto: both a Slurm array (SLURM_ARRAY_TASK_ID) and a Kubernetes Indexed Job "
                            "(JOB_COMPLETION_INDEX) are in the environment; give --shard I/N")
        idx = _env_int(environ, "JOB_COMPLETION_INDEX", "a Kubernetes Indexed Job (JOB_COMPLETION_INDEX is set)")
        if not shard_count:
            raise SpecError(f"--shard auto: JOB_COMPLETION_INDEX={idx} (a Kubernetes Indexed Job) needs the Job's "
                            "completion count: pass --shard-count N (N = spec.completions)")
        if not 0 <= idx < shard_count:
            raise SpecError(f"--shard auto: JOB_COMPLETION_INDEX={idx} is outside 0..{shard_count - 1} "
                            f"(--shard-count {shard_count}); pass the Job's spec.completions as --shard-count")
        outer = Slice(idx + 1, shard_count, f"JOB_COMPLETION_INDEX={idx} of {shard_count}")
    elif shard_count:
        raise SpecError(f"--shard-count {shard_count} is for Kubernetes Indexed Jobs, but JOB_COMPLETION_INDEX "
                        "is not set")
    inner = None
    if "RANK" in environ or "WORLD_SIZE" in environ:
        who = "a torch.distributed launcher (RANK/WORLD_SIZE is set)"
        rank, world = _env_int(environ, "RANK", who), _env_int(environ, "WORLD_SIZE", who)
        if not 0 <= rank < world:
            raise SpecError(f"--shard auto: RANK={rank} is outside 0..WORLD_SIZE-1 = 0..{world - 1}")
        local = None
        if "LOCAL_RANK" in environ:
            local = _env_int(environ, "LOCAL_RANK", who)
            lws = environ.get("LOCAL_WORLD_SIZE")
            if local < 0 or (lws is not None and local >= _env_int(environ, "LOCAL_WORLD_SIZE", who)):
                raise SpecError(f"--shard auto: LOCAL_RANK={local} is outside 0..LOCAL_WORLD_SIZE-1 "
                                f"(LOCAL_WORLD_SIZE={lws})")
        inner = Slice(rank + 1, world, f"RANK={rank} of WORLD_SIZE={world}", local)
    if outer is None and inner is None:
        raise SpecError(f"--shard auto: no scheduler slice in the environment (looked for {SCHEDULER_VARS}); "
                        "give --shard I/N")
    if outer is None:
        return inner
    if inner is None:
        return outer
    s = outer.split(inner.index, inner.count)
    return Slice(s.index, s.count, f"{outer.source}, {inner.source}", inner.local_rank)


def local_rank_device(local_rank: int, environ=None) -> str:
    """The CUDA_VISIBLE_DEVICES entry of a launcher's LOCAL_RANK: one GPU per local rank (a process that already
    sees one GPU alone, bound to it by the scheduler, keeps it)."""
    environ = os.environ if environ is None else environ
    visible = [d.strip() for d in environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    if not visible:
        return str(local_rank)
    if len(visible) == 1:
        return visible[0]
    if local_rank >= len(visible):
        raise SpecError(f"--shard auto: LOCAL_RANK={local_rank} but CUDA_VISIBLE_DEVICES={','.join(visible)} "
                        f"lists {len(visible)} GPUs: start at most {len(visible)} processes per host")
    return visible[local_rank]


SLOT_VARS = ("CUBLASLT_PROBE_SLOT", "LOCAL_RANK", "SLURM_LOCALID")


def _first_count(names, environ=None, least: int = 0) -> int | None:
    """The value of the first of the environment variables `names` that holds a whole number of at least
    `least` (others, and unset ones, are passed over), or None."""
    environ = os.environ if environ is None else environ
    for name in names:
        v = environ.get(name, "").strip()
        if v.isdigit() and int(v) >= least:
            return int(v)
    return None


def cpu_slot(environ=None) -> int:
    """Which three CPU cores this host's probe process takes (`ProbeOptions.cpu_slot`): the slot `sweep
    --devices` gives each worker, else the launcher's local rank (torchrun, Slurm), else 0."""
    slot = _first_count(SLOT_VARS, environ)
    return 0 if slot is None else slot


def run_meta(plan_: Plan, sl: Slice | None = None, **extra) -> dict:
    """What a raw file's environment line records besides the environment: the sweep, its slice and the plan
    identity that `merge` checks the parts against."""
    return {"sweep": plan_.name, "shard": sl.spec if sl else None, "shard_source": sl.source if sl else None,
            "plan": plan_.identity(), **extra}


def out_base(out: str) -> str:
    """The dataset path `out` without its .parquet suffix: what the files beside it are named from."""
    return out[:-len(".parquet")] if out.endswith(".parquet") else out


def part_path(out: str, sl: Slice) -> str:
    """The dataset file of slice `sl` of the sweep writing `out`: OUT.part-0003-of-0016.parquet (raw records
    in OUT.part-0003-of-0016.raw.jsonl); a block of it (`sweep --devices`) OUT.part-0003-of-0016.block-0005-of-0064."""
    w = max(4, len(str(sl.count)))
    name = f"{out_base(out)}.part-{sl.index:0{w}d}-of-{sl.count:0{w}d}"
    if sl.block:
        w = max(4, len(str(sl.block[1])))
        name += f".block-{sl.block[0]:0{w}d}-of-{sl.block[1]:0{w}d}"
    return name + ".parquet"


# --- running ------------------------------------------------------------------------------------------------
def raw_path(out: str) -> str:
    return out_base(out) + ".raw.jsonl"


class Progress:
    """One stderr line: done/total, rate, ETA, errors. Quiet when stderr is not a terminal unless forced."""

    def __init__(self, total: int, stream=None, every_s: float = 0.5):
        self.total, self.done, self.errors = total, 0, 0
        self.t0 = time.time()
        self.stream = stream or sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.every, self.last = every_s, 0.0

    def update(self, n: int, errors: int = 0) -> None:
        self.done += n
        self.errors += errors
        now = time.time()
        if now - self.last >= self.every or self.done >= self.total:
            self.last = now
            self.stream.write(("\r" if self.tty else "") + self.line() + ("" if self.tty else "\n"))
            self.stream.flush()

    def line(self) -> str:
        el = time.time() - self.t0
        rate = self.done / el if el > 0 else 0.0
        eta = (self.total - self.done) / rate if rate > 0 else float("nan")
        pct = 100.0 * self.done / self.total if self.total else 100.0
        eta_s = "?" if eta != eta else f"{int(eta // 60)}m{int(eta % 60):02d}s"
        return (f"[{self.done:>6}/{self.total}] {pct:5.1f}%  {rate:6.1f} GEMM/s  ETA {eta_s}  "
                f"errors {self.errors}")

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")


def _read_done(path: str, keep_errors: bool = True) -> tuple[dict, set[str]]:
    """Env and done keys of an existing raw file; cuts a truncated last line (a kill mid-write)."""
    from cublaslt_probe.dataset import read_raw
    with open(path, "rb") as f:
        data = f.read()
    if data and not data.endswith(b"\n"):
        cut = data.rfind(b"\n") + 1
        log.warning("%s ends in a partial record (%d bytes): dropping it", path, len(data) - cut)
        with open(path, "r+b") as f:
            f.truncate(cut)
    env, recs = read_raw(path)
    return env, {r["key"] for r in recs if keep_errors or not r.get("error")}


FSYNC_S = 5.0


def run(cases: list[Case], out: str, executor, *, resume: bool = False, window: int = WINDOW,
        progress: bool = True, meta: dict | None = None, retry_errors: bool = False,
        builders: RowBuilders | None = None):
    """Run `cases` through `executor` (has `.env` and `.run_window(cases) -> list[dict]`), appending raw
    records to `raw_path(out)` after each window (`capture`), then build and write the Parquet dataset `out`
    (by `builders` when given: processes started before the executor).

    Killed part-way, the raw file holds every finished window; `resume=True` skips the keys it holds.
    Returns the DataFrame.
    """
    from cublaslt_probe import dataset
    raw = raw_path(out)
    gemms, ran_s = capture(cases, raw, executor, resume=resume, window=window, progress=progress, meta=meta,
                           retry_errors=retry_errors)
    t1 = time.time()
    build_dataset(raw, cases, out, builders, getattr(executor, "host_cpus", None))
    df = dataset.read_parquet(out)
    df.attrs["ran"] = {"gemms": gemms, "seconds": round(ran_s, 3), "dataset_seconds": round(time.time() - t1, 3)}
    return df


def build_dataset(raw: str, cases, out: str, builders: RowBuilders | None = None, cpus: set[int] | None = None) -> None:
    """The dataset `out` of the sweep of `cases` whose raw records are in `raw`: built by `builders` when
    given, else in this process, or for a large raw file by processes started fresh (a sweep's process holds
    a CUDA context) on `cpus` (the CPUs the probe's process had before it pinned its thread)."""
    part = Part(raw, True, raw_env(raw))
    part.scan(KeyIndex(cases.key_chunks() if isinstance(cases, Cases) else [c.key for c in cases]))
    if builders is not None:
        from concurrent.futures.process import BrokenProcessPool
        try:
            write_dataset([part], out, part.env, builders=builders)
            return
        except BrokenProcessPool as e:   # one was killed (out of memory, say): this process builds the rows
            log.warning("the processes started to build the dataset stopped (%s): building it here", e)
    write_dataset([part], out, part.env, jobs=os.cpu_count() or 1, spawn=True, cpus=cpus)


def capture(cases: list[Case], raw: str, executor, *, resume: bool = False, window: int = WINDOW,
            progress: bool = True, meta: dict | None = None, retry_errors: bool = False) -> tuple[int, float]:
    """Run `cases` through `executor`, appending their raw records to the file `raw` after each window (see
    `run`); (GEMMs run, seconds they took)."""
    return capture_parts([(cases, raw, meta)], executor, resume=resume, window=window, progress=progress,
                         retry_errors=retry_errors)


def _open_part(cases: list[Case], raw: str, executor, resume: bool, meta: dict | None, retry_errors: bool):
    """(the GEMMs of `cases` still to run, the raw file `raw` opened to append their records): a new file starts
    with the environment line; an existing one is resumed (`--resume`) when its environment and slice match."""
    from cublaslt_probe.errors import ProbeError
    todo = cases
    if os.path.exists(raw):
        if not resume:
            raise ProbeError(f"{raw} already holds a sweep's raw records: pass --resume to finish it, or "
                             "remove it to start over")
        env_old, done = _read_done(raw, keep_errors=not retry_errors)
        diff = {k: (env_old.get(k), executor.env.get(k)) for k in ENV_MATCH
                if env_old and env_old.get(k) != executor.env.get(k)}
        if diff:
            raise ProbeError(f"cannot resume {raw} in another environment: " +
                             ", ".join(f"{k} was {a!r}, now {b!r}" for k, (a, b) in diff.items()))
        was, now = (env_old.get("plan") or {}).get("digest"), ((meta or {}).get("plan") or {}).get("digest")
        if was and now and (was, env_old.get("shard")) != (now, meta.get("shard")):
            raise ProbeError(f"cannot resume {raw}: it holds slice {env_old.get('shard') or 'all'} of a plan of "
                             f"{env_old['plan']['cases']} GEMMs, this run is slice {meta.get('shard') or 'all'} of "
                             f"{meta['plan']['cases']} (the spec, --backends or the slicing changed); run it "
                             "as it was started, or write another -o")
        todo = [c for c in cases if c.key not in done]
        log.info("resume: %d of %d GEMMs already done", len(cases) - len(todo), len(cases))
        return todo, open(raw, "a", encoding="utf-8")
    os.makedirs(os.path.dirname(os.path.abspath(raw)), exist_ok=True)
    f = open(raw, "w", encoding="utf-8")
    f.write(json.dumps({"type": "env", **executor.env, **(meta or {})}) + "\n")
    f.flush()
    return todo, f


def capture_parts(parts, executor, *, resume: bool = False, window: int = WINDOW, progress: bool = True,
                  retry_errors: bool = False) -> tuple[int, float]:
    """Run the GEMMs of `parts` ((cases, raw file, meta) each, in turn) through `executor` in windows of
    `window` that may hold GEMMs of several parts, each record appended to its part's raw file after its
    window (see `run`); (GEMMs run, seconds they took). A `--devices` worker runs the blocks it claimed
    together so, in whole windows: a window's profiler session costs about 3.5 ms whatever it holds."""
    files, todo, where = [], [], {}
    try:
        for cases, raw, meta in parts:
            left, f = _open_part(cases, raw, executor, resume, meta, retry_errors)
            files.append(f)
            todo += left
            where.update((c.key, f) for c in left)
        prog = Progress(len(todo)) if progress else None
        t0 = synced = time.time()
        for i in range(0, len(todo), max(1, window)):
            recs = executor.run_window(todo[i:i + window])
            for r in recs:
                where[r["key"]].write(json.dumps({"type": "gemm", **r}) + "\n")
            for f in files:
                f.flush()  # a killed process loses nothing written; fsync (for a crashed host) every few s
            if time.time() - synced > FSYNC_S:
                for f in files:
                    os.fsync(f.fileno())
                synced = time.time()
            if prog:
                prog.update(len(recs), sum(1 for r in recs if r.get("error")))
        if prog:
            prog.close()
    finally:
        for f in files:
            f.close()
    ran_s = time.time() - t0
    log.info("ran %d GEMMs in %.1f s", len(todo), ran_s)
    return len(todo), ran_s


# --- several workers on one host: fine slices handed out as they finish ----------------------------------------
BLOCK_WINDOWS = 4          # `sweep --devices` cuts a plan into blocks of a quarter window (`fine_slices`) ...
CLAIMS_PER_WORKER = 256    # ... 256 per worker at most (whole windows each when larger): a worker runs the blocks
                           # it claims together, in whole windows, and claims fewer at once near the end


def fine_slices(gemms: int, workers: int, window: int) -> int:
    """How many blocks `sweep --devices` cuts a plan of `gemms` into for `workers` workers: blocks of a quarter
    window (`BLOCK_WINDOWS`), CLAIMS_PER_WORKER per worker at most, else each a whole number of windows, and one
    block per worker at least. A worker claims a window's worth of blocks at a time and runs them in one
    window (`claimed_groups`, `capture_parts`), and near the end claims fewer, down to one: the worker that
    finishes last then ends at most a block after the others, not a window."""
    window = max(1, window)
    per = -(-window // BLOCK_WINDOWS)
    if -(-gemms // per) > CLAIMS_PER_WORKER * workers:
        per = window * max(1, -(-gemms // (window * CLAIMS_PER_WORKER * workers)))   # GEMMs a block holds at most
    return max(workers, -(-gemms // per), 1)


def claim_order(count: int, workers: int, me: int) -> list[int]:
    """The order in which worker `me` (0-based, of `workers`) asks for the `count` fine slices: first its own
    run of them (the me-th of `workers` contiguous runs, in plan order), then the others' from their ends
    backwards, so that what it takes from another is what that worker would reach last. Neighbouring GEMMs
    share kernels: a worker that keeps to one part of the plan loads fewer of them."""
    def run(w):
        return range(w * count // workers + 1, (w + 1) * count // workers + 1)
    return list(run(me)) + [j for w in range(me + 1, me + workers) for j in reversed(run(w % workers))]


def claim(folder: str, order):
    """Yield the numbers (of `order`, the slices 1..N) of the slices this worker takes, each claimed by
    creating folder/NNNNNN (an exclusive create: of several workers sharing the folder, exactly one gets each
    slice). A worker asks for the next one when it has finished the last, so a slower worker takes fewer."""
    for j in order:
        try:
            fd = os.open(os.path.join(folder, f"{j:06d}"), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            continue
        os.close(fd)
        yield j


def unclaimed(folder: str, count: int) -> int:
    """How many of the `count` blocks no worker has claimed yet (the claim files in `folder`)."""
    return count - sum(1 for name in os.listdir(folder) if name.isdigit())


def claimed_groups(folder: str, order, sizes, window: int, workers: int):
    """Yield the groups of blocks (numbers of `order`, the blocks 1..N) this worker runs together: each claimed
    in `order` (`claim`) until the group holds `window` GEMMs (`sizes[j]` in block j), and at most a share of
    what is left unclaimed — a (2 x `workers`)-th, one block at least (guided self-scheduling): the groups
    shrink as the plan runs out, so the workers end within about a block of each other. A lone worker's
    groups fill their windows to the end."""
    blocks = claim(folder, order)
    for j in blocks:
        group, held = [j], sizes[j]
        most = max(1, -(-unclaimed(folder, len(order)) // (2 * workers))) if workers > 1 else len(order)
        while held < window and len(group) < most:
            nxt = next(blocks, None)
            if nxt is None:
                break
            group.append(nxt)
            held += sizes[nxt]
        yield group


def wait_for_workers(folder: str, workers: int, me: str, timeout_s: float = 300.0) -> float:
    """Say that worker `me` is ready (folder/ready-ME) and wait until `workers` are, or `timeout_s`: the
    workers start taking slices together, so no GPU works alone while the others are still starting.
    Returns the seconds waited."""
    import glob
    t = time.time()
    open(os.path.join(folder, f"ready-{me}"), "w").close()
    while len(glob.glob(os.path.join(glob.escape(folder), "ready-*"))) < workers and time.time() - t < timeout_s:
        time.sleep(0.01)
    return time.time() - t


def run_claimed(plan_: Plan, base: Slice, count: int, folder: str, out: str, executor, *, resume: bool = False,
                window: int = WINDOW, workers: int = 1, me: int = 0, **meta) -> tuple[int, float, int]:
    """A `sweep --devices` worker (`me` of `workers`, 0-based): take blocks of `base` (`base.cut(j, count)`)
    from the claims in `folder`, in `claim_order`, a window's worth at a time (`claimed_groups`), until none
    is left, capturing each group in windows of `window` (`capture_parts`) into the blocks' raw part files
    beside `out` (no dataset: the parent merges the parts). (GEMMs run, seconds from the first claim to the
    last record, blocks taken.)"""
    subs = {j: base.cut(j, count) for j in range(1, count + 1)}
    cases = {j: sub.take(plan_.cases) for j, sub in subs.items()}
    gemms, slices, t0 = 0, 0, time.time()
    for group in claimed_groups(folder, claim_order(count, workers, me), {j: len(c) for j, c in cases.items()},
                                window, workers):
        n, _ = capture_parts([(cases[j], raw_path(part_path(out, subs[j])), run_meta(plan_, subs[j], **meta))
                              for j in group], executor, resume=resume, window=window, progress=False)
        gemms += n
        slices += len(group)
    return gemms, time.time() - t0, slices


# --- datasets from raw files, and merging the parts of a sweep ----------------------------------------------
# Both stream: the records of a part are read twice (its keys, then its rows, a batch at a time), so memory
# stays flat in the number of rows; what grows with the plan is about 40 bytes a GEMM (the plan's columns,
# the key index, the part that holds each GEMM).
_GEMM_PREFIX = '{"type": "gemm", "key": "'
BATCH_ROWS = 8192
PART_PATTERNS = ("*.part-*-of-*.raw.jsonl", "*.part-*-of-*.raw.jsonl.gz", "*.part-*-of-*.parquet")


def _raw_lines(path: str):
    """(line, fast_key) for each record line of a raw file: every non-empty line but the env line. fast_key is
    the key of a line `run` wrote (its key comes first; read without parsing the JSON), else None."""
    n = len(_GEMM_PREFIX)
    with open_text(path) as f:
        for line in f:
            if line.startswith(_GEMM_PREFIX) and line.endswith("\n"):
                end = line.find('"', n)
                if end > n and "\\" not in line[n:end]:
                    yield line, line[n:end]
                    continue
            if line.strip() and not line.startswith('{"type": "env"'):
                yield line, None


def raw_keys(path: str):
    """The key of each record of a raw file, in order; None for a line that cannot be read (a record cut off
    mid-write) or holds no key."""
    for line, key in _raw_lines(path):
        if key is None:
            try:
                obj = json.loads(line)
            except ValueError:
                log.warning("%s: unreadable record skipped (a sweep cut off mid-write?)", path)
                obj = {}
            key = obj.get("key") if isinstance(obj, dict) and isinstance(obj.get("key"), str) else None
        yield key


def raw_env(path: str) -> dict:
    """The environment line of a raw file ({} without one)."""
    with open_text(path) as f:
        first = f.readline()
    try:
        obj = json.loads(first)
    except ValueError:
        return {}
    if not (isinstance(obj, dict) and obj.get("type") == "env"):
        return {}
    return {k: v for k, v in obj.items() if k != "type"}


class KeyIndex:
    """Keys -> their position in a list, through the sorted hashes of the keys (12 bytes a key, no strings
    kept). A hash is seeded per process; two keys of one list sharing one is told, not guessed around."""

    def __init__(self, keys):
        """`keys`: the keys in order, or lists of them in order (`Cases.key_chunks`)."""
        import numpy as np
        h = np.fromiter((hash(k) for ks in _chunked(keys) for k in ks), dtype=np.int64)
        order = np.argsort(h, kind="stable")
        self.sorted = h[order]
        self.order = order.astype(np.int32)
        if len(h) > 1 and (self.sorted[1:] == self.sorted[:-1]).any():
            from cublaslt_probe.errors import ProbeError
            raise ProbeError("two keys of the plan share a hash in this process: run the command again")

    def __len__(self) -> int:
        return len(self.sorted)

    def positions(self, keys: list) -> "np.ndarray":  # noqa: F821
        """Position of each key; -1 for None, -2 for a key not in the list."""
        import numpy as np
        h = np.fromiter((0 if k is None else hash(k) for k in keys), dtype=np.int64, count=len(keys))
        if not len(self.sorted):
            pos = np.full(len(keys), -2, dtype=np.int32)
        else:
            i = np.minimum(np.searchsorted(self.sorted, h), len(self.sorted) - 1)
            pos = np.where(self.sorted[i] == h, self.order[i], -2)
        pos[np.fromiter((k is None for k in keys), dtype=bool, count=len(keys))] = -1
        return pos


def _chunked(keys):
    """A list of keys as one chunk; an iterator of lists as it is."""
    return [keys] if isinstance(keys, list) else keys


@dataclass
class Part:
    """One input of `merge` (or the raw file of `run`): a raw JSONL file or a Parquet dataset, the
    environment and slice it records, and after `scan` the plan position of each of its records."""

    path: str
    raw: bool
    env: dict
    slice: Slice = WHOLE
    positions: object = None     # numpy int32: plan position of each record (-1 unreadable, -2 not in the plan)
    keep: object = None          # numpy bool: the record that stands for its GEMM (a raw file's last one)
    strangers: list = field(default_factory=list)   # a few keys not in the plan

    @classmethod
    def open(cls, path: str) -> "Part":
        from cublaslt_probe.errors import ProbeError
        if not os.path.exists(path):
            raise ProbeError(f"no part at {path}: name raw files (.raw.jsonl), datasets (.parquet), a folder "
                             "of parts or a glob")
        raw = path.endswith((".jsonl", ".jsonl.gz"))
        if raw:
            env = raw_env(path)
        else:
            import pyarrow.parquet as pq
            try:
                schema = pq.read_schema(path)
            except Exception as e:  # noqa: BLE001  (pyarrow raises several kinds)
                raise ProbeError(f"{path} is not a raw file (.raw.jsonl) or a readable Parquet dataset: {e}") from e
            if "key" not in schema.names:
                raise ProbeError(f"{path} is a Parquet file but not a sweep's dataset (no `key` column)")
            meta = schema.metadata or {}
            env = json.loads(meta.get(b"cublaslt_probe.env", b"{}"))
        shard = env.get("shard")
        return cls(path, raw, env, parse_shard(shard, f"{path}: shard", blocks=True) if shard else WHOLE)

    def keys(self):
        """Each record's key, in order, a batch at a time."""
        if self.raw:
            batch = []
            for k in raw_keys(self.path):
                batch.append(k)
                if len(batch) == 1 << 16:
                    yield batch
                    batch = []
            if batch:
                yield batch
        else:
            import pyarrow.parquet as pq
            for b in pq.ParquetFile(self.path).iter_batches(batch_size=1 << 16, columns=["key"]):
                yield b.column(0).to_pylist()

    def scan(self, index: KeyIndex) -> None:
        """Plan position of every record; `keep` marks the last record of each GEMM (a resumed raw file may
        hold a GEMM twice: the later record replaced the earlier)."""
        import numpy as np
        chunks = []
        for keys in self.keys():
            pos = index.positions(keys)
            if len(self.strangers) < 3 and (pos == -2).any():
                self.strangers += [keys[i] for i in np.nonzero(pos == -2)[0][:3 - len(self.strangers)]]
            chunks.append(pos)
        self.positions = np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.int32)
        self.keep = np.zeros(len(self.positions), dtype=bool)
        rows = np.nonzero(self.positions >= 0)[0]
        _, last = np.unique(self.positions[rows][::-1], return_index=True)
        self.keep[rows[len(rows) - 1 - last]] = True

    def gemms(self) -> "np.ndarray":  # noqa: F821
        """Plan positions of the GEMMs this part holds (each once)."""
        return self.positions[self.keep]


def find_parts(inputs: list[str]) -> list[str]:
    """Files, folders (their NAME.part-IIII-of-NNNN files) and globs -> part files, each once. Where a part has
    both its raw file and its dataset, the dataset is read if it is not older than the raw file (`run` writes it
    last, from the whole raw file), else the raw file."""
    import glob
    from cublaslt_probe.errors import ProbeError
    found = []
    for p in inputs:
        if os.path.isdir(p):
            hits = sorted(h for pat in PART_PATTERNS for h in glob.glob(os.path.join(glob.escape(p), pat)))
            if not hits:
                raise ProbeError(f"no part files in folder {p} (NAME.part-IIII-of-NNNN.raw.jsonl or .parquet, "
                                 "as `sweep --shard` writes them)")
            found += hits
        elif not os.path.exists(p) and glob.has_magic(p):
            hits = sorted(glob.glob(p))
            if not hits:
                raise ProbeError(f"no file matches {p}")
            found += hits
        else:
            found.append(p)
    by_base: dict[str, list[str]] = {}
    for p in dict.fromkeys(found):
        base = p
        for suffix in (".raw.jsonl.gz", ".raw.jsonl", ".parquet"):
            if p.endswith(suffix):
                base = p[:-len(suffix)]
                break
        by_base.setdefault(base, []).append(p)
    out = []
    for base, ps in by_base.items():
        pq_, raws = [p for p in ps if p.endswith(".parquet")], [p for p in ps if not p.endswith(".parquet")]
        if pq_ and raws:
            fresh = os.path.getmtime(pq_[0]) >= max(os.path.getmtime(r) for r in raws)
            ps = pq_ if fresh else raws
        out += ps
    return out


def _kept_records(path: str, keep, start: int = 0, stop: int | None = None):
    """The kept records of a raw file (those from record `start` to `stop` when given), parsed."""
    from cublaslt_probe.errors import ProbeError
    for i, (line, _) in enumerate(_raw_lines(path)):
        if i < start:
            continue
        if stop is not None and i >= stop:
            break
        if keep[i]:
            try:
                yield json.loads(line)
            except ValueError as e:
                raise ProbeError(f"{path}: record {i + 1} became unreadable while merging: {e}") from e


def _raw_tables(path: str, keep, env: dict, schema, start: int = 0, stop: int | None = None):
    """The kept records of a raw file (those from record `start` to `stop` when given) as Arrow tables of the
    dataset, BATCH_ROWS rows at a time."""
    from cublaslt_probe import dataset
    for table, _ in dataset.record_tables(_kept_records(path, keep, start, stop), env, schema, BATCH_ROWS):
        yield table


def _parquet_tables(path: str, keep, schema):
    import pyarrow as pa
    import pyarrow.parquet as pq
    start = 0
    for b in pq.ParquetFile(path).iter_batches(batch_size=BATCH_ROWS):
        t = pa.Table.from_batches([b])
        k = keep[start:start + len(t)]
        start += len(t)
        if not k.all():
            t = t.filter(pa.array(k))
        have = set(t.column_names)   # (a new list at each read of the property)
        for f in schema:   # a column the dataset's version did not have yet: null
            if f.name not in have:
                t = t.append_column(f.name, pa.nulls(len(t), f.type))
        yield t.select(schema.names).cast(schema)


def _raw_to_parquet(items, dest: str) -> int:
    """Raw parts (`items`: (path, keep, env, start, stop) each; records `start` to `stop` of each) as one Parquet
    file of the dataset schema, in row groups of BATCH_ROWS (run in a worker process by `write_dataset`).
    Consecutive parts whose environments agree on every column a row takes from one (`dataset.ENV_COLUMNS`)
    are built as one run of records: a batch's rows cost about 20 ms however few they are."""
    from itertools import groupby

    from cublaslt_probe.dataset import ENV_COLUMNS, arrow_schema, rebatch, record_tables, write_tables
    schema = arrow_schema()

    def tables():
        for _, same in groupby(items, key=lambda it: json.dumps([it[2].get(c) for c in ENV_COLUMNS], default=str)):
            same = list(same)
            records = (r for path, keep, _, a, b in same for r in _kept_records(path, keep, a, b))
            for t, _ in record_tables(records, same[0][2], schema, BATCH_ROWS):
                yield t
    return write_tables(rebatch(tables(), BATCH_ROWS), dest, schema)


CHUNK_ROWS = 32768   # a raw part of at least twice this many records is turned into rows by several processes


def _chunks(n: int, jobs: int, least: int = CHUNK_ROWS) -> list[tuple[int, int | None]]:
    """Record ranges [start, stop) of a raw part of `n` records for up to `jobs` processes, each of `least`
    records at least: the whole part as one range when it is smaller than two."""
    pieces = max(1, min(jobs, n // max(1, least)))
    if pieces == 1:
        return [(0, None)]
    step = -(-n // pieces)
    return [(a, min(n, a + step)) for a in range(0, n, step)]


def _tasks(ranges: list[tuple[int, int, int | None]], sizes: list[int], least: int) -> list[list[tuple]]:
    """Consecutive record ranges ((part, start, stop), `sizes[i]` records in range i) of neighbouring parts
    packed into tasks of `least` records at least (the last, or one before a part not in the list, may hold
    fewer): the many small parts of a `--devices` sweep become a few tasks for the row-building processes,
    not one each (a task costs its process and the merging process about 10-20 ms whatever it holds).
    `write_dataset` asks for four tasks per process at least, so that the merging process writes the first
    tasks' rows while the processes build the later ones."""
    tasks, cur, held = [], [], 0
    for r, n in zip(ranges, sizes):
        if cur and r[0] > cur[-1][0] + 1:   # a part between them is not in the list (a dataset): keep the order
            tasks.append(cur)
            cur, held = [], 0
        cur.append(r)
        held += n
        if held >= least:
            tasks.append(cur)
            cur, held = [], 0
    if cur:
        tasks.append(cur)
    return tasks


def _use_cpus(cpus) -> None:
    if cpus:
        os.sched_setaffinity(0, cpus)


BUILDER_ROWS = 512   # with `RowBuilders` started ahead, a raw part is cut into ranges of this many records at least
BUILDERS_MAX = 16    # `RowBuilders` one sweep process starts at most (each holds pandas and pyarrow: 100-200 MB)
HOST_PROCS_VARS = ("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE")   # sweep processes a launcher starts per host


def builder_jobs(cpus: int | None = None, environ=None) -> int:
    """How many `RowBuilders` this sweep process starts: the CPUs it may use (`cpus`, else its affinity)
    shared with the other sweep processes a launcher started on this host (torchrun's LOCAL_WORLD_SIZE,
    Slurm's SLURM_NTASKS_PER_NODE), BUILDERS_MAX at most, one at least."""
    cpus = len(os.sched_getaffinity(0)) if cpus is None else cpus
    procs = _first_count(HOST_PROCS_VARS, environ, least=1) or 1
    return max(1, min(BUILDERS_MAX, cpus // procs))


def _pool_init(cpus, parent: int) -> None:
    """A worker of the pools that turn raw records into rows, as it starts: on its CPUs, and ended when
    the process that started it is gone. A pool's idle worker waits on a queue whose writing end it holds
    itself, so a sweep or merge killed outright (SIGKILL, the out-of-memory killer, a scheduler's preemption)
    would leave it waiting for ever; a thread looks for the parent every second instead."""
    import threading
    _use_cpus(cpus)

    def watch():
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(0)
    threading.Thread(target=watch, name="cublaslt-probe-parent-watch", daemon=True).start()


def _builder_init(cpus, parent: int) -> None:
    """A `RowBuilders` process as it starts (`_pool_init`), with what turns records into rows imported."""
    _pool_init(cpus, parent)
    _builder_imports()


def _builder_imports() -> None:
    """Import what turns records into rows and writes them (pandas, pyarrow) and build the dataset schema once."""
    import pyarrow.parquet  # noqa: F401
    from cublaslt_probe import dataset
    dataset.arrow_schema()


def _builder_pid() -> int:
    return os.getpid()


class RowBuilders:
    """Processes that turn a sweep's raw records into dataset rows at its end, started before the probe.

    A row costs 0.15-0.3 ms of host time (its log line parsed, its kernels decoded), which on the decode preset
    was 1.2 s after 7.3 s of capture, in the sweep's one process. Processes started fresh at the end would
    spend longer importing pandas and pyarrow than they save; started before the probe (while it loads torch
    and cuBLASLt, and on every CPU, before it pins its thread) they wait, idle, for the sweep's end and then
    each take a range of `BUILDER_ROWS` records or more; `builder_jobs` says how many. Fresh processes
    (spawn): the sweep's process will hold a CUDA context, which must not be forked."""

    def __init__(self, jobs: int | None = None):
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor
        self.jobs = max(1, jobs or builder_jobs())
        self.pool = ProcessPoolExecutor(self.jobs, mp_context=multiprocessing.get_context("spawn"),
                                        initializer=_builder_init, initargs=(os.sched_getaffinity(0), os.getpid()))
        self._ready = [self.pool.submit(_builder_pid) for _ in range(self.jobs)]   # every process started now
        _builder_imports()   # and this process ready to write their rows: 0.4-0.6 s, before the probe starts

    def close(self) -> None:
        self.pool.shutdown(cancel_futures=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def write_dataset(parts: list[Part], out: str, env: dict, jobs: int = 1, spawn: bool = False,
                  cpus: set[int] | None = None, chunk_rows: int | None = None,
                  builders: RowBuilders | None = None) -> int:
    """Stream the kept records of scanned `parts` into the Parquet dataset `out` (written whole or not at
    all, `dataset.write_tables`). Raw parts are turned into rows by up to `jobs` processes: one per part, and
    a part of many records (`_chunks`) by several. `spawn` starts them fresh (from a process holding a CUDA
    context, which must not be forked); `cpus`: the CPUs they run on (a process started by a pinned thread
    inherits its one core). With `builders` (started ahead), its processes do that work instead, in ranges
    of `BUILDER_ROWS` records at least. Returns the rows written."""
    import multiprocessing
    import tempfile
    from concurrent.futures import ProcessPoolExecutor

    import pyarrow.parquet as pq

    from cublaslt_probe.dataset import arrow_schema, rebatch, write_tables
    schema = arrow_schema(env)
    tmp_dir = tempfile.mkdtemp(prefix=".merge-", dir=os.path.dirname(os.path.abspath(out)))
    if builders is not None:
        jobs, chunk_rows = builders.jobs, chunk_rows or BUILDER_ROWS
    ranges = [(pi, a, b) for pi, p in enumerate(parts) if p.raw
              for a, b in (_chunks(len(p.positions), jobs, chunk_rows or CHUNK_ROWS) if jobs > 1 else [(0, None)])]
    sizes = [(len(parts[pi].positions) if b is None else b) - a for pi, a, b in ranges]
    tasks = _tasks(ranges, sizes, min(chunk_rows or CHUNK_ROWS, -(-sum(sizes) // (4 * max(1, jobs)))))
    pool = None
    if builders is not None:
        pool = builders.pool
    elif jobs > 1 and len(tasks) > 1:
        ctx = multiprocessing.get_context("spawn") if spawn else None
        pool = ProcessPoolExecutor(min(jobs, len(tasks)), mp_context=ctx, initializer=_pool_init,
                                   initargs=(cpus, os.getpid()))
    try:
        futures: dict[int, list] = {}   # the first part of each task: (its future, its file)
        if pool:
            for ti, task in enumerate(tasks):
                dest = os.path.join(tmp_dir, f"{ti}.parquet")
                items = [(parts[pi].path, parts[pi].keep, parts[pi].env, a, b) for pi, a, b in task]
                futures.setdefault(task[0][0], []).append((pool.submit(_raw_to_parquet, items, dest), dest))
            in_task = {pi for task in tasks for pi, _, _ in task}

        def tables():
            for pi, p in enumerate(parts):
                if pi in futures:
                    for fut, dest in futures.pop(pi):
                        fut.result()
                        yield from _parquet_tables(dest, _all(pq.ParquetFile(dest).metadata.num_rows), schema)
                elif pool and pi in in_task:
                    continue   # in a task that began with an earlier part
                elif p.raw:
                    yield from _raw_tables(p.path, p.keep, p.env, schema)
                else:
                    yield from _parquet_tables(p.path, p.keep, schema)
        return write_tables(rebatch(tables(), BATCH_ROWS), out, schema)
    finally:
        if pool and builders is None:
            pool.shutdown(cancel_futures=True)
        shutil.rmtree(tmp_dir, ignore_errors=True)


def _all(n: int):
    import numpy as np
    return np.ones(n, dtype=bool)


@dataclass
class Merged:
    out: str
    rows: int
    parts: int
    plan: str | None


def merge(inputs: list[str], out: str, allow_env_mismatch: bool = False, jobs: int | None = None) -> Merged:
    """Join the parts of a sweep (raw files or datasets; folders and globs of them) into one dataset.

    Checks, before writing anything, that the parts come from one environment (`ENV_MATCH`) and one plan, and
    that together they hold every GEMM of the plan exactly once: says which slices are missing or incomplete,
    which GEMMs two parts both hold, and which records belong to no slice of theirs. Parts written before plans
    were recorded can only be checked for GEMMs held twice.
    """
    from cublaslt_probe.errors import ProbeError
    if not inputs:
        raise ProbeError("merge needs at least one part")
    parts = [Part.open(p) for p in find_parts(list(inputs))]
    base = parts[0]
    for p in parts[1:]:
        diff = [k for k in ENV_MATCH if p.env.get(k) != base.env.get(k)]
        if diff and not allow_env_mismatch:
            raise ProbeError(f"{p.path} was measured in another environment than {base.path} ("
                             + ", ".join(f"{k} {p.env.get(k)!r} vs {base.env.get(k)!r}" for k in diff)
                             + "): these are not parts of one sweep; pass --allow-env-mismatch to merge anyway")
    idents = [p.env.get("plan") for p in parts]
    plan_ = None
    if all(idents):
        digests = {i["digest"] for i in idents}
        if len(digests) > 1:
            other = next(p for p, i in zip(parts, idents) if i["digest"] != idents[0]["digest"])
            raise ProbeError(f"{other.path} ran another plan than {base.path} (sweep {other.env.get('sweep')!r} "
                             f"vs {base.env.get('sweep')!r}, {other.env['plan']['cases']} vs "
                             f"{base.env['plan']['cases']} GEMMs): merge the parts of one sweep")
        plan_ = plan_from_spec(idents[0]["spec"], idents[0]["backends"])
        if plan_.digest() != idents[0]["digest"]:
            raise ProbeError(f"the plan of {base.path} ({idents[0]['cases']} GEMMs) is not what its spec expands "
                             f"to now ({len(plan_.cases)} GEMMs, another order or another version of the tool): "
                             "merge with the version that ran the sweep")
        index = KeyIndex(plan_.cases.key_chunks())

        def key_of(q):
            return plan_.cases[int(q)].key
    else:
        old = [p.path for p, i in zip(parts, idents) if not i]
        log.warning("%s record no plan (written by an earlier version): checking only that no GEMM is held twice",
                    ", ".join(old[:3]) + (" ..." if len(old) > 3 else ""))
        keys = sorted({k for p in parts for ks in p.keys() for k in ks if k is not None})
        index = KeyIndex(keys)

        def key_of(q):
            return keys[int(q)]
    t0 = time.time()
    for p in parts:
        p.scan(index)
    log.info("merge: %d parts, %d records scanned against %d GEMMs in %.1f s", len(parts),
             sum(len(p.positions) for p in parts), len(index), time.time() - t0)
    problems = _coverage(parts, index, plan_, key_of)
    if problems:
        raise ProbeError(f"the parts do not hold {'plan ' + repr(plan_.name) if plan_ else 'their GEMMs'} "
                         f"({len(index)} GEMMs) exactly once: " + "; ".join(problems))
    env = dict(base.env, shard=None, shard_source=None, parts=len(parts))
    n_jobs = jobs or os.cpu_count() or 1
    t0 = time.time()
    rows = write_dataset(parts, out, env, jobs=n_jobs)
    log.info("merge: wrote %d rows to %s in %.1f s (up to %d processes for raw parts)", rows, out, time.time() - t0,
             n_jobs)
    return Merged(out, rows, len(parts), plan_.name if plan_ else None)


def _coverage(parts: list[Part], index: KeyIndex, plan_, key_of) -> list[str]:
    """What keeps the parts from holding each GEMM exactly once (empty when they do)."""
    import numpy as np
    problems = []
    n = len(index)
    owner = np.full(n, -1, dtype=np.int32)
    twice, twice_eg = 0, []
    for pi, p in enumerate(parts):
        if p.strangers:
            k = int((p.positions == -2).sum())
            problems.append(f"{p.path} holds {k} GEMMs that are not in the plan (e.g. {p.strangers[0]}): a part "
                            "of another sweep")
        g = p.gemms()
        prev = owner[g]
        clash = prev >= 0
        if clash.any():
            twice += int(clash.sum())
            for q, o in zip(g[clash][:3 - len(twice_eg)], prev[clash]):
                twice_eg.append(f"{key_of(q)} in {parts[o].path} and {p.path}")
        owner[g] = pi
        if plan_ is not None and p.slice.family != (1, 1):
            wrong = p.slice.members(g, n) != p.slice.member
            if wrong.any():
                problems.append(f"{p.path} ({p.slice.describe()}) holds {int(wrong.sum())} GEMMs of other slices "
                                f"(e.g. {key_of(g[wrong][0])})")
    if twice:
        problems.append(f"{twice} GEMMs are in two parts (" + "; ".join(twice_eg) + ")")
    if plan_ is None:
        return problems
    missing = np.nonzero(owner < 0)[0]
    if len(missing):
        problems += _missing_slices(parts, missing, n, key_of)
    return problems


def _missing_slices(parts: list[Part], missing, n: int, key_of) -> list[str]:
    """What the plan positions `missing` (held by no part) say is missing: whole slices with no part, blocks of a
    slice (`sweep --devices`) with no part, and parts that stopped short. Needs the parts to cut the plan one
    way (one count); otherwise only how many GEMMs are missing."""
    import numpy as np
    counts = {p.slice.count for p in parts}
    c = counts.pop() if len(counts) == 1 else 0
    if not c or (c == 1 and not any(p.slice.block for p in parts)):
        return [f"{len(missing)} GEMMs of the plan are in no part (e.g. {key_of(missing[0])})"]
    of: dict[int, list[Slice]] = {}
    for p in parts:
        of.setdefault(p.slice.index, []).append(p.slice)
    i0 = missing % c
    absent, short, blocks = [], [], {}   # blocks: slice index -> (P, absent blocks)
    for i in np.unique(i0) + 1:
        here = missing[i0 == i - 1]
        cuts = {sl.block[1] if sl.block else 1 for sl in of.get(int(i), [])}
        if not cuts:
            absent.append(int(i))
            continue
        if len(cuts) > 1 or 1 in cuts:   # one part for the whole slice, or blocks cut two ways
            short.append((Slice(int(i), c).describe(), len(here), len(range(i - 1, n, c)), here[0]))
            continue
        nb = cuts.pop()
        first = Slice(int(i), c).cut(1, nb)
        member = first.members(here, n) - first.member
        have = {sl.block[0] - 1 for sl in of[int(i)]}
        per = np.bincount(member, minlength=nb)
        sizes = np.bincount(first.members(np.arange(i - 1, n, c), n) - first.member, minlength=nb)
        gone = [b + 1 for b in range(nb) if per[b] and b not in have]
        if gone:
            blocks[int(i)] = (nb, gone)
        short += [(Slice(int(i), c).cut(b + 1, nb).describe(), int(per[b]), int(sizes[b]), here[member == b][0])
                  for b in range(nb) if per[b] and b in have]
    problems = [f"slices {_ranges(absent)} of {c} are missing (no part)"] if absent else []
    problems += [f"blocks {_ranges(gone)} of {nb} of slice {i}/{c} are missing (no part)"
                 for i, (nb, gone) in blocks.items()]
    problems += [f"{what} lacks {k} of {total} GEMMs (e.g. {key_of(g)}; finish it with --resume)"
                 for what, k, total, g in short[:3]]
    if len(short) > 3:
        problems.append(f"and {len(short) - 3} more incomplete parts")
    return problems


def _ranges(xs: list[int]) -> str:
    """[1, 2, 3, 7] -> '1-3, 7'."""
    out, start = [], None
    for i, x in enumerate(xs):
        if start is None:
            start = x
        if i + 1 == len(xs) or xs[i + 1] != x + 1:
            out.append(str(start) if start == x else f"{start}-{x}")
            start = None
    return ", ".join(out)


# --- a CPU executor that really runs (numpy): tests the machinery without a GPU --------------------------------
class NumpyExecutor:
    """Runs Cases with backend `numpy` on the CPU: real matmuls, host timing, no kernels or logs."""

    def __init__(self, reps: int = 3, fail_keys: set[str] | None = None, stop_after: int | None = None):
        import numpy as np
        self.np = np
        self.reps = reps
        self.env = {"gpu": "cpu (numpy)", "sm_count": None, "driver": None, "cuda_runtime": None,
                    "cublaslt_version": None, "torch_version": None, "cupy_version": None,
                    "numpy_version": np.__version__}
        self.fail_keys = fail_keys or set()
        self.stop_after = stop_after   # simulate a kill: raise KeyboardInterrupt after this many windows
        self.windows = 0

    def run_window(self, cases: list[Case]) -> list[dict]:
        if self.stop_after is not None and self.windows >= self.stop_after:
            raise KeyboardInterrupt("simulated kill")
        self.windows += 1
        np = self.np
        out = []
        for c in cases:
            rec = {"key": c.key, **c.as_dict(), **c.blas, "kernels": [], "kernel_us": [], "log_lines": [],
                   "time_us": None, "heuristic_miss_us": None, "heuristic_hit_us": None, "error": None}
            why = numpy_invalid(c)
            if why or c.key in self.fail_keys:
                rec["error"] = why or "simulated failure"
                out.append(rec)
                continue
            dt = np.float32 if c.dtype == "fp32" else np.float16
            rng = np.random.default_rng(0)
            shape_a = (c.batch, c.m, c.k) if c.op == "bmm" else (c.m, c.k)
            shape_b = (c.batch, c.k, c.n) if c.op == "bmm" else (c.k, c.n)
            a = rng.standard_normal(shape_a).astype(dt)
            b = rng.standard_normal(shape_b).astype(dt)
            if c.layout[0] == "T":
                a = np.ascontiguousarray(np.swapaxes(a, -1, -2)).swapaxes(-1, -2)
            if c.layout[1] == "T":
                b = np.ascontiguousarray(np.swapaxes(b, -1, -2)).swapaxes(-1, -2)
            bias = rng.standard_normal(c.n).astype(dt)
            times = []
            for _ in range(self.reps):
                t0 = time.perf_counter_ns()
                y = a @ b
                if c.op == "addmm":
                    y = y + bias
                times.append((time.perf_counter_ns() - t0) / 1e3)
            times.sort()
            rec["time_us"] = times[len(times) // 2]
            rec["time_us_min"] = times[0]
            rec["time_us_reps"] = len(times)
            out.append(rec)
        return out
