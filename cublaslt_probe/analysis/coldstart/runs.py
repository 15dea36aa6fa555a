"""One cold-start run's record read back (CPU): its windows and what each holds, and `Runs`, the runs of one round
by name with the part each plays in the breakdown.

A run is the dict `gpu.coldstart.run` made of one child's record (docs/coldstart.md): ``windows`` (setup,
preinit, step1…stepN, each with its wall and host time and the evidence deltas), the cuBLASLt log lines and counts
per window, the modules and driver calls CUPTI saw, what the run wrote to each cache. A run is ``usable`` when it
completed at least three steps (step 1, step 2, a steady state).
"""
from __future__ import annotations

import re
import statistics
from collections.abc import Iterator, Mapping


def windows(run: dict) -> dict[str, dict]:
    return {w["name"]: w for w in run.get("windows", [])}


def step_walls(run: dict) -> list[float]:
    ws = [w for w in run.get("windows", []) if re.fullmatch(r"step\d+", w["name"])]
    ws.sort(key=lambda w: int(w["name"][4:]))
    return [w["wall_s"] for w in ws]


def step_hosts(run: dict) -> list[float]:
    ws = [w for w in run.get("windows", []) if re.fullmatch(r"step\d+", w["name"])]
    ws.sort(key=lambda w: int(w["name"][4:]))
    return [w["host_s"] for w in ws]


def storage_read(w: dict | None) -> int:
    """Bytes a window read from storage, the process and its waited-for children (the child's `process_counters`;
    0 for runs saved before they were kept): what the operating system's file cache did not hold."""
    p = (w or {}).get("process") or {}
    return int(max(p.get("read_bytes", 0), p.get("inblock_bytes", 0)))


def steady(values: list[float]) -> float | None:
    """Steady state: the median of steps 3…N."""
    return statistics.median(values[2:]) if len(values) >= 3 else None


def usable(run: dict | None) -> bool:
    return bool(run) and bool(run.get("ok")) and len(step_walls(run)) >= 3


def compile_seconds(w: dict | None) -> float:
    """torch.compile's compile time inside a window: its outermost timer (the timers nest)."""
    vals = (w or {}).get("compile_s") or {}
    return max(vals.values()) if vals else 0.0


def autotune_seconds(w: dict | None) -> float:
    """Benchmark-based autotuning inside a window: torch.compile's timers whose name says so."""
    vals = (w or {}).get("compile_s") or {}
    picked = [v for k, v in vals.items() if re.search(r"autotun|benchmark", k, re.I)]
    return min(max(picked), compile_seconds(w)) if picked else 0.0


def new_files(w: dict | None, var: str) -> dict:
    return ((w or {}).get("new_files") or {}).get(var) or {}


def step_windows(run: dict) -> list[dict]:
    ws = [w for w in run.get("windows", []) if re.fullmatch(r"step\d+", w["name"])]
    return sorted(ws, key=lambda w: int(w["name"][4:]))


_KEY_FIELDS = ("function", "a_type", "b_type", "c_type", "d_type", "compute_type", "scale_type", "op_a",
               "op_b", "m", "n", "k", "lda", "ldb", "ldc", "ldd", "batch_count", "epilogue", "workspace_bytes")


def problem_keys(lines: list[str]) -> list[tuple]:
    """One key per logged matmul (the log parser's trace records): the function, types, transposes, sizes,
    leading dimensions, batch, epilogue and workspace, the problem part of a call that cuBLASLt's heuristics
    cache is keyed on. Other lines are skipped."""
    from cublaslt_probe.logs import parse_line
    out = []
    for i, line in enumerate(lines):
        rec = parse_line(line, i + 1)
        if rec is not None and rec.kind == "trace" and rec.m is not None:
            out.append(tuple(getattr(rec, f) for f in _KEY_FIELDS))
    return out


def new_problems(run: dict, window: str = "step1") -> tuple[int, int]:
    """(distinct problems of `window` never seen earlier in the process, GEMM lines in the window)."""
    lines = run.get("lt_lines") or {}
    order = [w["name"] for w in run.get("windows", [])]
    seen: set[tuple] = set()
    for name in order:
        if name == window:
            break
        seen.update(problem_keys(lines.get(name, [])))
    keys = problem_keys(lines.get(window, []))
    return len(set(keys) - seen), len(keys)


def lt_calls_per_step(run: dict) -> float | None:
    counts = run.get("lt_counts") or {}
    vals = [counts[w] for w in (x["name"] for x in step_windows(run)[2:]) if w in counts]
    return statistics.median(vals) if vals else None


def driver_seconds(run: dict, window: str, what: str) -> tuple[float, int]:
    g = ((run.get("driver_calls") or {}).get(window) or {}).get("by_what", {}).get(what) or {}
    return float(g.get("seconds", 0.0)), int(g.get("count", 0))


def modules_in(run: dict, window: str) -> dict:
    return (run.get("modules") or {}).get(window) or {}


def compute_cache_written(run: dict) -> int:
    return int(((run.get("cache_written") or {}).get("CUDA_CACHE_PATH") or {}).get("count", 0))


def ptx_loads(run: dict) -> list[dict]:
    """Driver calls of the steps that were handed PTX (a loader with PTX text, the linker with PTX/LTO-IR)."""
    out = []
    for name, g in (run.get("driver_calls") or {}).items():
        if not name.startswith("step"):
            continue
        for c in g.get("records", []):
            if c.get("image") == "ptx" or c.get("input") in ("ptx", "lto-ir"):
                out.append({**c, "window": name})
    return out


def libraries_loaded_in_steps(run: dict) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for w in step_windows(run):
        for lib in w.get("new_libraries") or []:
            out.setdefault(lib, []).append(w["name"])
    return out


def fmt_ms(s: float | None) -> str:
    """Seconds as milliseconds for the evidence and the table ("n/a" for a figure not measured)."""
    return "n/a" if s is None else f"{s * 1e3:.1f} ms"


def first_line(text: str) -> str:
    """The first non-blank line of an error (a CUDA error's own sentence, not torch's advice after it)."""
    for line in (text or "").splitlines():
        if line.strip() and not line.startswith("Traceback"):
            return line.strip()[:300]
    return ""


def window_error(run: dict) -> str:
    return next((w["error"] for w in run.get("windows", []) if w.get("error")), "")


def device_of(runs: Mapping[str, dict]) -> dict:
    for r in runs.values():
        if r.get("device"):
            return r["device"]
    return {}


# the what-if runs: a baseline only where nothing else completed (their PTX JIT is forced)
FORCED = ("forcejit", "forcejit_warm")


class Runs(Mapping):
    """The runs of one round by name (a save's ``runs``, or one round of its ``repeats``), read as a mapping, and
    the part each plays in the breakdown (docs/coldstart.md), by name:

    - `baseline_name`: the run whose step 1 is explained: cold where it completed, else the first completed run
      that is not a what-if of forced JIT (`FORCED`); None where no run completed its steps;
    - `compile_name`: the run the cold-cache causes are measured in: cold_again (empty caches, the files the
      compilers read already in the operating system's file cache) where it completed, else cold;
    - `explained_name`: the run whose step 1 shows what the sum's last term holds (heuristic misses, allocator
      growth, cuDNN's benchmark mode): eager, else preinit, else the baseline;
    - `warm_step_name`: the run whose step 1 times the compile routes with warm caches: warm, else the explained
      run.

    `ok(name)` is the run where it completed its steps (`usable`), else None."""

    def __init__(self, by_name: Mapping[str, dict]):
        self.by_name = by_name.by_name if isinstance(by_name, Runs) else by_name

    def __getitem__(self, name: str) -> dict:
        return self.by_name[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.by_name)

    def __len__(self) -> int:
        return len(self.by_name)

    def ok(self, name: str) -> dict | None:
        run = self.by_name.get(name)
        return run if usable(run) else None

    @property
    def baseline_name(self) -> str | None:
        if self.ok("cold"):
            return "cold"
        return next((n for n, r in self.by_name.items() if usable(r) and n not in FORCED), None)

    @property
    def baseline(self) -> dict | None:
        name = self.baseline_name
        return None if name is None else self.by_name[name]

    @property
    def compile_name(self) -> str:
        return "cold_again" if self.ok("cold_again") else "cold"

    @property
    def compile_run(self) -> dict | None:
        return self.by_name.get(self.compile_name)

    @property
    def explained_name(self) -> str | None:
        return "eager" if self.ok("eager") else "preinit" if self.ok("preinit") else self.baseline_name

    @property
    def explained(self) -> dict | None:
        name = self.explained_name
        return None if name is None else self.by_name[name]

    @property
    def warm_step_name(self) -> str | None:
        return "warm" if self.ok("warm") else self.explained_name

    @property
    def device(self) -> dict:
        return device_of(self.by_name)
