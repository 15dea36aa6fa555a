"""What a sweep runs: a spec (TOML/JSON groups of shapes x dtypes x layouts x ops x backends) expanded into
the plan's GEMMs (`Plan`, `Cases`), the combinations that cannot run left out and counted by reason."""
from __future__ import annotations

import functools
import itertools
import json
import logging
import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from cublaslt_probe.cases import BACKENDS, DTYPES, GROUPED_OPS, LAYOUTS, OPS, Case, invalid_reason, sizes_code
from cublaslt_probe.errors import SpecError
from cublaslt_probe.vocab import TEST_BACKENDS

log = logging.getLogger("cublaslt_probe.sweep")


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
        shapes, listed_twice = _group_shapes(gi, g)
        repeats = repeats or listed_twice
        if not len(shapes):
            continue
        if any(op in GROUPED_OPS for op in ops) or "groups" in g or "group_sizes" in g:
            block = _grouped_block(gi, g, shapes, ops, dts, lays, bes, skipped)
            repeats = repeats or block is not None
        else:
            block = _dense_block(gi, shapes, ops, dts, lays, bes, skipped)
            # batch 1 runs bmm as 8 and mm drops the batch: such a block may repeat a GEMM
            repeats = repeats or (block is not None and bool((shapes[:, 3] != 1).any()))
        if block is not None:
            blocks.append(block)
    return Plan(spec.get("name", "spec"), Cases(_joined(blocks, repeats)), skipped, spec=spec, backends=backends)


def _group_shapes(gi: int, g: dict):
    """(the group's shapes as an int64 array of rows m, n, k, batch; whether a listed shape repeats): from
    `shapes`, else the product of the m, n, k (and batch) axes, which never repeats."""
    import numpy as np
    if "shapes" not in g:
        for ax in ("m", "n", "k"):
            if ax not in g:
                raise SpecError(f"group {gi}: give `shapes` or all of m, n, k")
        axes = [expand_axis(g[a], a) for a in ("m", "n", "k")] + [expand_axis(g.get("batch", 1), "batch")]
        grid = np.meshgrid(*(np.array(a, dtype=np.int64) for a in axes), indexing="ij")
        return np.stack([x.ravel() for x in grid], axis=1), False
    shapes = []
    for s in g["shapes"]:
        if not (isinstance(s, list) and len(s) in (3, 4) and
                all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in s)):
            raise SpecError(f"group {gi}: shape {s!r} must be [m, n, k] or [m, n, k, batch] of positive ints")
        shapes.append(tuple(s) if len(s) == 4 else (*s, 1))
    return np.array(shapes, dtype=np.int64).reshape(-1, 4), len(set(shapes)) < len(shapes)


def _dense_block(gi: int, shapes, ops, dts, lays, bes, skipped: Counter) -> dict | None:
    """The columns of a group of dense GEMMs: shapes x op x dtype x layout x backend, the valid combinations in
    product order (the others counted in `skipped` by reason); None when none is valid."""
    import numpy as np
    combos = []
    for op, dt, lay, be in itertools.product(ops, dts, lays, bes):
        m, n, k, b = (int(x) for x in shapes[0])
        c = Case(be, op, dt, lay, m, n, k, (8 if b == 1 else b) if op == "bmm" else 1)
        why = invalid_reason(c) if be != "numpy" else numpy_invalid(c)
        if why:
            skipped[why.split(": ", 1)[-1]] += len(shapes)
        else:
            combos.append((NAMES["backend"].index(be), OPS.index(op), DTYPES.index(dt), LAYOUTS.index(lay)))
    if not combos:
        return None
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
    return cols


def _joined(blocks: list[dict], repeats: bool) -> dict:
    """The groups' columns as one plan's: concatenated, each GEMM once (the first kept) when any may repeat."""
    import numpy as np
    if not blocks:
        return {f: np.zeros(0, dtype=np.int8 if f in NAMES else np.int32) for f in (*NAMES, *SIZES)}
    if len(blocks) == 1 and not repeats:   # one product of distinct shapes: nothing repeats
        return blocks[0]
    if any("groups" in b for b in blocks):   # dense blocks get no groups, grouped ones keep theirs
        for b in blocks:
            b.setdefault("groups", np.zeros(len(b["m"]), dtype=np.int32))
            b.setdefault("sizes", np.full(len(b["m"]), "", dtype=object))
    cols = {f: np.concatenate([b.pop(f) for b in blocks]) for f in (*NAMES, *SIZES, *GROUPED) if f in blocks[0]}
    return _first_of_each(cols)


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
