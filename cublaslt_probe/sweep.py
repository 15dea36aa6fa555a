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

Combinations a product makes that cannot run (fp8 outside scaled_mm, bf16 on cupy, ...) are left out of the
plan and counted by reason, so the plan says what it skipped and why; nothing fails mid-sweep for that.
"""
from __future__ import annotations

import itertools
import json
import logging
import os
import sys
import time
from collections import Counter
from dataclasses import dataclass, field

from cublaslt_probe.cases import BACKENDS, DTYPES, LAYOUTS, OPS, Case, invalid_reason
from cublaslt_probe.errors import SpecError

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


@dataclass
class Plan:
    name: str
    cases: list[Case]
    skipped: Counter = field(default_factory=Counter)

    def summary(self) -> str:
        by = Counter((c.backend, c.dtype) for c in self.cases)
        s = [f"sweep {self.name!r}: {len(self.cases)} GEMMs"]
        s.append("  " + ", ".join(f"{b}/{d}: {n}" for (b, d), n in sorted(by.items())))
        if self.skipped:
            s.append(f"  left out {sum(self.skipped.values())} combinations that cannot run:")
            s += [f"    {n} × {why}" for why, n in self.skipped.most_common()]
        return "\n".join(s)


def plan_from_spec(spec: dict, backends: list[str] | None = None) -> Plan:
    """Expand a spec dict into Cases (deterministic order, duplicates removed)."""
    if not isinstance(spec, dict) or "group" not in spec:
        raise SpecError("a sweep spec needs at least one [[group]] table (see docs/sweep.md)")
    groups = spec["group"]
    if isinstance(groups, dict):
        groups = [groups]
    seen, cases, skipped = set(), [], Counter()
    for gi, g in enumerate(groups):
        unknown = set(g) - {"backends", "ops", "dtypes", "layouts", "m", "n", "k", "batch", "shapes"}
        if unknown:
            raise SpecError(f"group {gi}: unknown keys {sorted(unknown)}")
        bes = _choice(g, "backends", BACKENDS + ("numpy",), ["torch"])
        if backends:
            bes = [b for b in bes if b in backends]
        ops = _choice(g, "ops", OPS, ["mm"])
        dts = _choice(g, "dtypes", DTYPES, ["bf16"])
        lays = _choice(g, "layouts", LAYOUTS, ["NN"])
        if "shapes" in g:
            shapes = []
            for s in g["shapes"]:
                if not (isinstance(s, list) and len(s) in (3, 4) and all(isinstance(x, int) and x > 0 for x in s)):
                    raise SpecError(f"group {gi}: shape {s!r} must be [m, n, k] or [m, n, k, batch] of positive ints")
                shapes.append(tuple(s) if len(s) == 4 else (*s, 1))
        else:
            for ax in ("m", "n", "k"):
                if ax not in g:
                    raise SpecError(f"group {gi}: give `shapes` or all of m, n, k")
            bs = expand_axis(g.get("batch", 1), "batch")
            shapes = list(itertools.product(expand_axis(g["m"], "m"), expand_axis(g["n"], "n"),
                                            expand_axis(g["k"], "k"), bs))
        for (m, n, k, b), op, dt, lay, be in itertools.product(shapes, ops, dts, lays, bes):
            if op == "bmm" and b == 1:
                b = 8
            if op != "bmm":
                b = 1
            c = Case(be, op, dt, lay, m, n, k, b)
            why = invalid_reason(c) if be != "numpy" else numpy_invalid(c)
            if why:
                skipped[why.split(": ", 1)[-1]] += 1
                continue
            if c.key not in seen:
                seen.add(c.key)
                cases.append(c)
    return Plan(spec.get("name", "spec"), cases, skipped)


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
    raise SpecError(f"unknown preset {name!r}: choose from {', '.join(PRESETS)}")


PRESETS = ("quick", "llm", "square", "decode", "grid", "regret")


def plan(preset_name: str | None = None, spec_path: str | None = None, backends: list[str] | None = None) -> Plan:
    if bool(preset_name) == bool(spec_path):
        raise SpecError("give exactly one of --preset NAME or --spec FILE")
    spec = preset(preset_name) if preset_name else load_spec(spec_path)
    return plan_from_spec(spec, backends)


def shard(cases: list[Case], spec: str | None) -> list[Case]:
    """`I/N` (1-based): every N-th case starting at the I-th, deterministic for a given plan."""
    if not spec:
        return cases
    try:
        i, n = (int(x) for x in spec.split("/"))
    except ValueError as e:
        raise SpecError(f"--shard {spec!r}: expected I/N with 1 <= I <= N, e.g. 1/4") from e
    if not 1 <= i <= n:
        raise SpecError(f"--shard {spec!r}: expected I/N with 1 <= I <= N, e.g. 1/4")
    return cases[i - 1::n]


# --- running ------------------------------------------------------------------------------------------------
def raw_path(out: str) -> str:
    base = out[:-len(".parquet")] if out.endswith(".parquet") else out
    return base + ".raw.jsonl"


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


ENV_MATCH = ("gpu", "cublaslt_version", "torch_version")


FSYNC_S = 5.0


def run(cases: list[Case], out: str, executor, *, resume: bool = False, window: int = 32,
        progress: bool = True, meta: dict | None = None, retry_errors: bool = False):
    """Run `cases` through `executor` (has `.env` and `.run_window(cases) -> list[dict]`), appending raw
    records to `raw_path(out)` after each window, then build and write the Parquet dataset `out`.

    Killed part-way, the raw file holds every finished window; `resume=True` skips the keys it holds.
    Returns the DataFrame.
    """
    from cublaslt_probe import dataset
    from cublaslt_probe.errors import ProbeError
    raw = raw_path(out)
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
        todo = [c for c in cases if c.key not in done]
        log.info("resume: %d of %d GEMMs already done", len(cases) - len(todo), len(cases))
        mode = "a"
    else:
        mode = "w"
    os.makedirs(os.path.dirname(os.path.abspath(raw)), exist_ok=True)
    prog = Progress(len(todo)) if progress else None
    t0 = time.time()
    with open(raw, mode, encoding="utf-8") as f:
        if mode == "w":
            f.write(json.dumps({"type": "env", **executor.env, **(meta or {})}) + "\n")
            f.flush()
        synced = time.time()
        for i in range(0, len(todo), max(1, window)):
            recs = executor.run_window(todo[i:i + window])
            for r in recs:
                f.write(json.dumps({"type": "gemm", **r}) + "\n")
            f.flush()  # a killed process loses nothing written; fsync (for a crashed host) every few s
            if time.time() - synced > FSYNC_S:
                os.fsync(f.fileno())
                synced = time.time()
            if prog:
                prog.update(len(recs), sum(1 for r in recs if r.get("error")))
    if prog:
        prog.close()
    log.info("ran %d GEMMs in %.1f s", len(todo), time.time() - t0)
    env, recs = dataset.read_raw(raw)
    keys = {c.key for c in cases}
    df = dataset.build([r for r in recs if r["key"] in keys], env)
    dataset.write_parquet(df, out, env)
    return df


def merge(paths: list[str], out: str, allow_env_mismatch: bool = False):
    """Join the Parquet parts of a sharded sweep (same environment) into one dataset."""
    import pandas as pd

    from cublaslt_probe import dataset
    from cublaslt_probe.errors import ProbeError
    if not paths:
        raise ProbeError("merge needs at least one dataset")
    frames, envs = [], []
    for p in paths:
        df = dataset.read_parquet(p)
        frames.append(df)
        envs.append(df.attrs.get("env", {}))
    base = envs[0]
    for p, e in zip(paths[1:], envs[1:]):
        diff = [k for k in ENV_MATCH if e.get(k) != base.get(k)]
        if diff and not allow_env_mismatch:
            raise ProbeError(f"{p} was measured in another environment than {paths[0]} ({', '.join(diff)} "
                             "differ): these are not shards of one sweep; pass --allow-env-mismatch to merge anyway")
    df = pd.concat([dataset.coerce(f) for f in frames], ignore_index=True)
    df = df.drop_duplicates("key", keep="last").reset_index(drop=True)
    df = dataset.coerce(df)
    dataset.write_parquet(df, out, base)
    return df


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
