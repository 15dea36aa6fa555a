"""A saved cold start (`cold-start --save`) read back and checked before anything reads it (CPU): `load` checks
its shape and each run's values by type and physical sense (`check_run`); a damaged run is skipped with a note
naming the file, the run and the field, a file whose every run is damaged is refused. `SCHEMA` is the version of
the format the runner writes."""
from __future__ import annotations

import json
import math

from cublaslt_probe.analysis.coldstart.breakdown import analyse
from cublaslt_probe.analysis.coldstart.observed import observed_provenance
from cublaslt_probe.errors import ProbeError
from cublaslt_probe.streams import open_text

SCHEMA = 1


class _Bad(Exception):
    """A value of a saved cold start that `cold-start --save` cannot have written: its field and why."""

    def __init__(self, field: str, why: str):
        super().__init__(f"{field} {why}")
        self.field, self.why = field, why


def _num(v, field: str, *, integer: bool = False, within: tuple[float, str] | None = None) -> None:
    """`v` is a finite number ≥ 0 (whole where `integer`), and at most `within` (seconds, what they are) plus a
    millisecond: a timer inside a window cannot run longer than the window."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise _Bad(field, f"is {v!r}, not a number")
    if not math.isfinite(v):
        raise _Bad(field, f"is {v}, not a finite number")
    if v < 0:
        raise _Bad(field, f"is {v}, below zero")
    if integer and v != int(v):
        raise _Bad(field, f"is {v}, not a whole number")
    if within is not None and v > within[0] + 1e-3:
        raise _Bad(field, f"is {v} s, longer than {within[1]} ({within[0]:.6f} s)")


def _counters(obj, field: str, keys: tuple[str, ...] | None = None) -> None:
    """A counter record (absent, or an object): its values (or only `keys` of it, where present) numbers, finite
    and ≥ 0 (`_num`)."""
    if obj is None:
        return
    if not isinstance(obj, dict):
        raise _Bad(field, f"is {obj!r}, not a record of counters")
    for k, v in obj.items():
        if keys is None or k in keys:
            _num(v, f"{field}[{k}]")


def check_run(r: dict) -> None:
    """A saved run's values by type and physical sense (raises `_Bad` on the first that fails): the run's wall
    time; each window's name, wall and host time (host ≤ wall); the timers inside a window (torch.compile's, the
    compile routes', the driver's calls) no longer than it; calls and counts whole numbers; the preinit items'
    seconds (or their failure text); the counters the analysis reads (process accounting, allocator counters,
    files and modules counted). Every number finite and ≥ 0."""
    if r.get("wall_s") is not None:
        _num(r["wall_s"], "wall_s")
    ws = r.get("windows", [])
    if not isinstance(ws, list):
        raise _Bad("windows", "is not a list of windows")
    walls = {}
    for i, w in enumerate(ws):
        if not isinstance(w, dict) or not isinstance(w.get("name"), str):
            raise _Bad(f"windows[{i}]", "is not a window with a name")
        f = f"windows[{i}] ({w['name']})"
        _num(w.get("wall_s"), f"{f}.wall_s")
        wall = (w["wall_s"], f"the {w['name']} window")
        walls[w["name"]] = wall
        if w.get("host_s") is not None:
            _num(w["host_s"], f"{f}.host_s", within=wall)
        for k, v in (w.get("compile_s") or {}).items():
            _num(v, f"{f}.compile_s[{k}]", within=wall)
        for k, v in (w.get("jit_s") or {}).items():
            if not isinstance(v, dict):
                raise _Bad(f"{f}.jit_s[{k}]", f"is {v!r}, not a timer record")
            # JAX reports the compile time its cache saved (not spent in the window): no bound
            _num(v.get("s", 0.0), f"{f}.jit_s[{k}].s", within=None if "saved" in k else wall)
            _num(v.get("n", 0), f"{f}.jit_s[{k}].n", integer=True)
        for part in ("process", "mem_before", "mem_after"):
            _counters(w.get(part), f"{f}.{part}")
        for var, c in (w.get("new_files") or {}).items():
            _counters(c, f"{f}.new_files[{var}]", ("count", "bytes"))
    for var, c in (r.get("cache_written") or {}).items():
        _counters(c, f"cache_written[{var}]", ("count", "bytes"))
    for wn, g in (r.get("modules") or {}).items():
        for k in ("count", "bytes"):
            if k in (g or {}):
                _num(g[k], f"modules[{wn}].{k}", integer=True)
    for k, v in (r.get("lt_counts") or {}).items():
        _num(v, f"lt_counts[{k}]", integer=True)
    for wn, g in (r.get("driver_calls") or {}).items():
        for what, x in ((g or {}).get("by_what") or {}).items():
            _num((x or {}).get("seconds", 0.0), f"driver_calls[{wn}].by_what[{what}].seconds", within=walls.get(wn))
            _num((x or {}).get("count", 0), f"driver_calls[{wn}].by_what[{what}].count", integer=True)
    for k, v in (r.get("preinit") or {}).items():
        if not isinstance(v, str):
            _num(v, f"preinit[{k}]", within=walls.get("preinit"))


def _checked_runs(path: str, runs: dict, where: str, notes: list[str]) -> dict:
    """`runs` less those with a damaged value (`check_run`), each skipped with a note naming the file, the run
    and the field."""
    kept = {}
    for name, r in runs.items():
        try:
            check_run(r)
            kept[name] = r
        except _Bad as e:
            notes.append(f"{path}: run {name}{where} skipped: {e.field} {e.why} (a value `cold-start --save` "
                         "does not write); the breakdown uses the other runs")
        except (TypeError, AttributeError, ValueError) as e:
            notes.append(f"{path}: run {name}{where} skipped: a value of another type than `cold-start --save` "
                         f"writes ({type(e).__name__}: {str(e)[:80]}); the breakdown uses the other runs")
    return kept


def load(path: str) -> dict:
    """A saved cold-start result (`--save`), checked before anything reads it: its shape; ``steps``, ``repeat``
    whole numbers in range (else one line naming the file, the field and what to give); each run's values by type
    and physical sense (`check_run`): a damaged run is skipped and ``load_notes`` says which and why, a file whose
    every run of round 1 is damaged is refused; then an analysis of what is left, whose errors on a value of the
    wrong type are the file's."""
    give = "give an unedited file written by `cold-start --save`"
    try:
        with open_text(path) as f:
            obj = json.load(f)
    except (OSError, ValueError) as e:
        raise ProbeError(f"cannot read {path}: {e}; give a file written by `cold-start --save`") from e
    except RecursionError:
        raise ProbeError(f"cannot read {path}: values nested too deeply to be a cold-start result; give a file "
                         "written by `cold-start --save`") from None
    if not isinstance(obj, dict) or "runs" not in obj:
        raise ProbeError(f"{path}: not a cold-start result (no 'runs'); give a file written by `cold-start --save`")
    runs = obj["runs"]
    if not isinstance(runs, dict) or not all(isinstance(r, dict) for r in runs.values()):
        raise ProbeError(f"{path}: not a cold-start result ('runs' is not an object of runs by name); give a file "
                         "written by `cold-start --save`")
    for key, low in (("steps", 3), ("repeat", 1)):
        v = obj.get(key)
        if v is None and key == "repeat":
            continue
        try:
            _num(v, key, integer=True)
            if v < low:
                raise _Bad(key, f"is {v}, fewer than {low}")
        except _Bad as e:
            raise ProbeError(f"{path}: {e.field} {e.why} ({'steps per run' if key == 'steps' else 'rounds'}: "
                             f"{low} or more); {give}") from None
    reps = obj.get("repeats")
    if reps is not None and not (isinstance(reps, list) and all(isinstance(x, dict) for x in reps)
                                 and all(isinstance(r, dict) for x in reps for r in x.values())):
        raise ProbeError(f"{path}: 'repeats' is not a list of rounds (runs by name); {give}")
    notes: list[str] = []
    obj["runs"] = _checked_runs(path, runs, "", notes)
    if runs and not obj["runs"]:
        raise ProbeError(f"{path}: every run has a damaged value ({notes[0].split(' skipped: ', 1)[1]}); {give}")
    if reps:
        obj["repeats"] = [_checked_runs(path, x, f" (round {k})", notes) for k, x in enumerate(reps, 2)]
    obj["load_notes"] = notes
    # what the analysis reads, read once here: a value of another type than `cold-start --save` writes (an edited
    # or damaged file) is this file's error, not the analysis'
    try:
        if obj["runs"]:
            analyse(obj)
        observed_provenance(obj)
    except (TypeError, AttributeError, KeyError, ValueError, IndexError, ZeroDivisionError) as e:
        raise ProbeError(f"{path}: a value in it is not one `cold-start --save` writes ({type(e).__name__}: "
                         f"{str(e)[:120]}); {give}") from None
    return obj
