"""A saved measurement (`audit --measure --save`) read back for `audit --from`: the reader (`read_measure`, gzip
or not), the check of every value the advice and the page read (`check_measure`, which returns the typed
`measurement.Measurement`), and the binding to the run audited (`bind_measure`, by `cublaslt_probe.binding`'s
rule, on the typed measurement). CPU only.

The check keeps what `measure.measure_gemms` writes and skips, with a note naming the file and the record
(``gemms[3]``, ``gemms[3].paths[1]``, ``experts[0]``), any record whose values are of another type or make no
physical sense: a time that is not a finite number > 0 or that is longer than the trace (`limit_us`: an original
GEMM's time against the trace's GPU time; the alternatives' and the experts' whole call against
`SLOWER_LIMIT` times it, since a slower variant may outlast the trace), a count or size that is not a whole
number. A record saved twice (the same GEMM problem, module and pass; the same experts module and groups) is
counted once. Calls per step are never read from the file: the advice takes them from the run's rows.
"""
from __future__ import annotations

import json
import math

from cublaslt_probe.analysis.audit.measurement import (
    SCHEMA_VERSION,
    ExpertsMeasurement,
    GemmMeasurement,
    Measurement,
    schema_version,
)
from cublaslt_probe.analysis.audit.schema import _na
from cublaslt_probe.binding import (
    GEMM_KEY,
    bind,
    fingerprint,
    gemm_key,
    key_name,
    run_identity,
    whole,
)
from cublaslt_probe.errors import ProbeError

SLOWER_LIMIT = 100      # an alternative's or a whole call's time may reach this many times the trace's GPU time
NOTES_SHOWN = 6         # skipped records named one a line; the rest counted in one more line
FIX = "measure this run: `cublaslt-probe audit RUN --measure --save FILE` on its GPU"


class MeasureRefused(ProbeError):
    """A saved measurement that is not this run's (another run, GPU or library): a usage error (exit 2)."""


def read_measure(path: str) -> dict:
    """A saved measurement (gzip or not, by `streams.open_text`, as `cold-start --from` reads its file): a
    ProbeError naming the file and what to give when it cannot be read or has no ``gemms`` list."""
    from cublaslt_probe.streams import open_text
    what = "a file written by `audit --measure --save FILE`"
    try:
        with open_text(path) as f:
            doc = json.load(f)
    except OSError as e:
        raise ProbeError(f"cannot read measurements {path}: {e.strerror or e}; give {what}") from e
    except (ValueError, RecursionError) as e:
        raise ProbeError(f"{path}: not a JSON measurement file ({str(e)[:120]}); give {what}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("gemms"), list):
        raise ProbeError(f"{path}: no 'gemms' list: not a measurement; give {what}")
    try:
        schema_version(doc)
    except ProbeError as e:
        raise ProbeError(f"{path}: {e}") from None
    return doc


def row_keys(rows) -> list[tuple | None]:
    """The `binding.gemm_key` of each audit row, in order (pandas' missing values as None)."""
    if not len(rows):
        return []
    cols = [rows[c].tolist() for c in GEMM_KEY]       # column by column: no copy of the rows
    return [gemm_key({c: (None if _na(v) else v) for c, v in zip(GEMM_KEY, r)}) for r in zip(*cols)]


def run_fingerprint(a, source: str | None = None) -> dict:
    """The fingerprint (`binding.fingerprint`) of audit `a`: its rows' GEMM problems, its environment (the
    audit's GPU), its identity."""
    keys = row_keys(a.rows)
    return fingerprint(keys, {**(a.env or {}), "gpu": a.gpu or (a.env or {}).get("gpu")},
                       run_identity(a.env, source or (a.sources or {}).get("trace")))


def stamp(measure: dict, a, source: str | None = None) -> dict:
    """`measure` (`measure.measure_gemms`' result) with the schema version (`measurement.SCHEMA_VERSION`) and the
    fingerprint of the run it measured, audit `a` of `source`: what `audit --measure` keeps and `--save`
    writes."""
    return {"schema_version": SCHEMA_VERSION, "fingerprint": run_fingerprint(a, source), **measure}


# --------------------------------------------------------------------------- value checks
def _time(v, limit: float | None) -> str | None:
    """Why `v` is not a time in µs (a finite number > 0, at most `limit`), or None."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return f"{_shown(v)} is not a number"
    if not math.isfinite(v) or v <= 0:
        return f"{_shown(v)} is not a time > 0"
    if limit is not None and v > limit:
        return f"{v:,.1f} µs is longer than the trace allows ({limit:,.1f} µs)"
    return None


def _shown(v) -> str:
    s = json.dumps(v) if isinstance(v, (str, list, dict)) or v is None else repr(v)
    return s if len(s) <= 40 else s[:37] + "..."


def _whole(v, lo: int = 0) -> int | None:
    w = whole(v)
    return w if w is not None and w >= lo else None


def _ratio(v) -> float | None:
    """A relative error or tolerance: a finite number ≥ 0, else None."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        return None
    return float(v)


def _str(v) -> str | None:
    return v if isinstance(v, str) else None


def _check_alt(x, where: str, limit: float | None, notes: list[str], fields: dict) -> dict | None:
    """One alternative (a path, a what-if, a candidate, a grouped variant): None with a note when it is not an
    object or its ``time_us`` is bad (None: not timed, kept); `fields` name -> checker, a field that fails
    its checker is dropped with a note (whole numbers, names)."""
    if not isinstance(x, dict):
        notes.append(f"{where} skipped: {_shown(x)} is not an object")
        return None
    out = dict(x)
    if "kernels" in out:      # kernel names: a list of strings (the page picks the GEMM's among them)
        ks = out["kernels"]
        out["kernels"] = [k for k in ks if isinstance(k, str)] if isinstance(ks, list) else None
    t = x.get("time_us")
    if t is not None:
        why = _time(t, limit)
        if why:
            notes.append(f"{where} skipped: time_us {why}")
            return None
    for k, check in fields.items():
        if k in x and x[k] is not None and check(x[k]) is None:
            notes.append(f"{where} skipped: {k} {_shown(x[k])} is not {check.__doc__}")
            return None
    need = [k for k in TIMED_NEEDS.get(where.rsplit(".", 1)[-1].split("[")[0], ()) if x.get(k) is None]
    if t is not None and need:      # a timed alternative the advice cannot place without these
        notes.append(f"{where} skipped: timed, but no {' or '.join(need)}")
        return None
    return out


def _int0(v):
    """a whole number ≥ 0"""
    return _whole(v, 0)


def _int1(v):
    """a whole number ≥ 1"""
    return _whole(v, 1)


def _integer(v):
    """a whole number"""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return int(v) if isinstance(v, int) or (math.isfinite(v) and v == int(v)) else None


def _name(v):
    """a name (a string)"""
    return _str(v)


def _flag(v):
    """true or false"""
    return v if isinstance(v, bool) else None


ALTERNATIVES = {
    "paths": {"path": _name, "workspace": _int0},
    "whatifs": {"dim": _name, "value": _int1, "multiple": _int1},
    "candidates": {"rank": _int0, "algo_id": _int0, "split_k": _integer, "workspace_bytes": _int0,
                   "ok_numerics": _flag, "custom_option": _int0, "cta_swizzling": _int0},
    "grouped": {"variant": _name, "rows": _int0},
}


# what a timed alternative must name for the advice to use it (`_check_alt`)
TIMED_NEEDS = {"paths": ("path",), "whatifs": ("dim", "value"), "candidates": ("rank",),
               "grouped": ("variant", "rows"), "variants": ("variant",)}


def _check_gemm(g, where: str, limit: float | None, notes: list[str]) -> dict | None:
    """One ``gemms`` record checked (`check_measure`), or None with a note."""
    if not isinstance(g, dict):
        notes.append(f"{where} skipped: {_shown(g)} is not an object")
        return None
    key = g.get("key")
    if gemm_key(key) is None:
        notes.append(f"{where} skipped: its key {_shown(key)} is not a GEMM problem (op, m, n, k)")
        return None
    g = dict(g)
    g["key"] = dict(key)
    if key.get("groups") is not None and _int1(key["groups"]) is None:
        notes.append(f"{where} skipped: groups {_shown(key['groups'])} is not a whole number ≥ 1")
        return None
    for k in ("module", "pass", "log_function", "case", "sizes_source", "group_dim", "timing"):
        if g.get(k) is not None and not isinstance(g[k], str):
            notes.append(f"{where} skipped: {k} {_shown(g[k])} is not a name")
            return None
    for k in ("skipped", "error"):
        if g.get(k) is not None and not isinstance(g[k], str):
            g[k] = _shown(g[k])
    if g.get("original_us") is not None:
        why = _time(g["original_us"], limit)
        if why:
            notes.append(f"{where} skipped: original_us {why}")
            return None
    slow = limit * SLOWER_LIMIT if limit else None
    for name, fields in ALTERNATIVES.items():
        xs = g.get(name)
        if xs is None:
            continue
        if not isinstance(xs, list):
            notes.append(f"{where}.{name} skipped: not a list")
            g[name] = []
            continue
        kept = [y for j, x in enumerate(xs) for y in [_check_alt(x, f"{where}.{name}[{j}]", slow, notes, fields)]
                if y is not None]
        if name == "whatifs":
            kept = [w for w in kept if w.get("dim") in ("m", "n", "k") and _whole(w.get("value"), 1) is not None]
        g[name] = kept
    if g.get("grouped"):
        vs = list({v["variant"]: v for v in reversed(g["grouped"]) if isinstance(v.get("variant"), str)}.values())[::-1]
        orig = [v for v in vs if v["variant"] == "original"]
        if not orig or orig[0].get("rows") is None:
            notes.append(f"{where} skipped: its grouped variants have no 'original' with its rows")
            return None
        g["grouped"] = orig + [v for v in vs if v["variant"] != "original"]
    if isinstance(g.get("original"), dict):
        g["original"] = {k: v for k, v in g["original"].items() if k != "log_line" or isinstance(v, str)}
    elif g.get("original") is not None:
        g["original"] = None
    g["numerics"] = ({k: r for k, v in g["numerics"].items() for r in [_ratio(v)] if r is not None}
                     if isinstance(g.get("numerics"), dict) else {})
    for k in ("tolerance", "tolerance_fp8"):
        if k in g:
            g[k] = _ratio(g[k])
    if g.get("regret") is not None:
        reg = g["regret"] if isinstance(g["regret"], dict) else {}
        g["regret"] = {"regret_pct": _ratio(reg.get("regret_pct")), "best_rank": _int0(reg.get("best_rank"))}
    if g.get("group_summary") is not None:
        s = g["group_summary"] if isinstance(g["group_summary"], dict) else {}
        g["group_summary"] = {k: v for k, v in s.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
                              and math.isfinite(v) and v >= 0}
    if g.get("implementations") is not None:
        impl = g["implementations"] if isinstance(g["implementations"], dict) else {}
        g["implementations"] = {k: v for k, v in impl.items() if isinstance(v, str)}
    return g


def _check_experts(e, where: str, limit: float | None, notes: list[str]) -> dict | None:
    """One ``experts`` entry (`measure.measure_experts`) checked, or None with a note."""
    if not isinstance(e, dict):
        notes.append(f"{where} skipped: {_shown(e)} is not an object")
        return None
    if e.get("skipped") is not None:
        return {"skipped": _shown(e["skipped"]) if not isinstance(e["skipped"], str) else e["skipped"]}
    if not isinstance(e.get("module"), str) or _int1(e.get("groups")) is None:
        notes.append(f"{where} skipped: module {_shown(e.get('module'))} and groups {_shown(e.get('groups'))} "
                     "are not a module name and a whole number ≥ 1")
        return None
    e = dict(e)
    slow = limit * SLOWER_LIMIT if limit else None
    vs = [y for j, x in enumerate(e.get("variants") if isinstance(e.get("variants"), list) else [])
          for y in [_check_alt(x, f"{where}.variants[{j}]", slow, notes, {"variant": _name})] if y is not None]
    e["variants"] = list({v["variant"]: v for v in reversed(vs) if isinstance(v.get("variant"), str)}.values())[::-1]
    e["problem"] = {k: v for k, v in (e.get("problem") if isinstance(e.get("problem"), dict) else {}).items()
                    if isinstance(v, str) or _int0(v) is not None}
    for k in ("scope", "sizes_source"):
        e[k] = _str(e.get(k))
    e["numerics"] = ({k: r for k, v in e["numerics"].items() for r in [_ratio(v)] if r is not None}
                     if isinstance(e.get("numerics"), dict) else {})
    for k in ("tolerance", "tolerance_fp8"):
        e[k] = _ratio(e.get(k))
    return e


def _summary(notes: list[str], source: str) -> list[str]:
    if len(notes) <= NOTES_SHOWN:
        return [f"{source}: {n}" for n in notes]
    return [f"{source}: {n}" for n in notes[:NOTES_SHOWN - 1]] + [
        f"{source}: {len(notes) - NOTES_SHOWN + 1} more records skipped ({'; '.join(notes[NOTES_SHOWN - 1:][:3])}"
        + ("; …" if len(notes) > NOTES_SHOWN + 2 else "") + ")"]


def _checked_once(records, name: str, dup: list[str], check, ident) -> list[dict]:
    """The records of list `name` that `check(record, where)` keeps, each identity (`ident(checked, index)`)
    once; a record saved again is named in `dup` (``gemms[4] = gemms[1]``)."""
    kept, seen = [], {}
    for i, r in enumerate(records if isinstance(records, list) else []):
        c = check(r, f"{name}[{i}]")
        if c is None:
            continue
        key = ident(c, i)
        if key in seen:
            dup.append(f"{name}[{i}] = {name}[{seen[key]}]")
            continue
        seen[key] = i
        kept.append(c)
    return kept


def check_measure(doc: dict, source: str = "the measurement", limit_us: float | None = None
                  ) -> tuple[Measurement, list[str]]:
    """`doc` with every record the advice and the page read checked (module docstring), as a `Measurement`, and
    the notes naming `source` and each record skipped or counted once. `limit_us`: the trace's GPU time (None:
    no bound). A `Measurement` given is one already checked: returned as it is."""
    if isinstance(doc, Measurement):
        return doc, []
    notes: list[str] = []
    limit_us = limit_us or None
    out = {k: v for k, v in doc.items() if k not in ("gemms", "experts")} if isinstance(doc, dict) else {}
    dup: list[str] = []
    out["gemms"] = _checked_once(doc.get("gemms") if isinstance(doc, dict) else None, "gemms", dup,
                                 lambda g, w: _check_gemm(g, w, limit_us, notes),
                                 lambda c, i: (gemm_key(c["key"]), c.get("module"), c.get("pass")))
    if isinstance(doc, dict) and doc.get("experts") is not None:
        out["experts"] = _checked_once(doc["experts"], "experts", dup,
                                       lambda e, w: _check_experts(e, w, limit_us, notes),
                                       lambda c, j: ((c.get("module"), c.get("groups"), c.get("scope"))
                                                     if "module" in c else ("skipped", j)))
    if not isinstance(out.get("env"), dict):
        out["env"] = {}
    notes = _summary(notes, source)
    if dup:
        notes.append(f"{source}: {len(dup)} records repeat earlier ones ({', '.join(dup[:4])}"
                     + (", …" if len(dup) > 4 else "") + "): each counted once")
    return Measurement.from_checked(out), notes


def checked(doc: dict | Measurement | None) -> Measurement | None:
    """`check_measure`'s measurement alone (the page and the advice read only checked values)."""
    return None if doc is None else check_measure(doc)[0]


def bind_measure(doc: Measurement, a, source: str, run: str | None = None) -> tuple[Measurement, list[str]]:
    """A checked measurement (`check_measure`) bound to audit `a` (`binding.bind`): the GEMM records of
    problems the run has, and the notes; MeasureRefused (one line) when it is another run's, GPU's or
    library's."""
    fix = FIX.replace("RUN", run or "RUN")
    measured = [gemm_key(g.key) for g in doc.gemms]
    run_keys = set(row_keys(a.rows))
    b = bind(source, measured, doc.env, doc.fingerprint, run_keys,
             {**(a.env or {}), "gpu": a.gpu or (a.env or {}).get("gpu")}, run_identity(a.env), fix)
    if b.refused:
        raise MeasureRefused(b.refused)
    gemms = []
    for i, (g, k) in enumerate(zip(doc.gemms, measured)):
        if k not in b.common:
            continue
        other = _other_sizes(g, a.rows)
        if other:
            b.notes.append(f"{source}: gemms[{i}] ({key_name(k)}) {other}: left out")
            continue
        gemms.append(g)
    experts = None
    if doc.experts is not None:
        experts, why = [], []
        for j, e in enumerate(doc.experts):
            miss = e.skipped is None and _experts_mismatch(e, a.rows)
            if miss:
                why.append(f"experts[{j}] ({e.module}, {e.scope}): {miss}")
            else:
                experts.append(e)
        if why:
            b.notes.append(f"{source}: {'; '.join(why)}: not this run's experts call, left out")
    return doc.with_records(gemms, experts), b.notes


def load_bound(a, measure, run: str | None = None) -> tuple[Measurement, list[str]]:
    """A saved measurement (a path, read by `read_measure`, or the dict itself) checked (`check_measure`, times
    bounded by audit `a`'s GPU time) and bound to `a` (`bind_measure`): (the measurement, the notes).
    MeasureRefused when it is another run's. The one route from a saved measurement to advice (`audit --from`,
    `gpu.prove.prove_run`)."""
    source = str(measure) if not isinstance(measure, dict) else "the measurement"
    doc = measure if isinstance(measure, dict) else read_measure(source)
    doc, notes = check_measure(doc, source, a.step_gpu_us * a.steps)
    doc, bound = bind_measure(doc, a, source, run)
    return doc, notes + bound


def match_rows(rows, g: GemmMeasurement, keys: list | None = None):
    """The audit rows a measured GEMM stands for: the same problem (`binding.gemm_key`: the key a saved
    measurement is bound to its run by), and the same module and pass when the measurement names them.
    `keys`: the rows' `row_keys`, when the caller matches many GEMMs against the same rows."""
    if rows.empty:
        return rows
    want = gemm_key(g.key if isinstance(g.key, dict) else {})
    if want is None:
        return rows.iloc[:0]
    at = [i for i, k in enumerate(row_keys(rows) if keys is None else keys) if k == want]
    for col, v in (("module", g.module), ("pass", g.pass_)):
        if v is not None and at:
            vals = rows[col].to_numpy()
            at = [i for i in at if _equal(vals[i], v)] or at
    return rows.iloc[at]


def _equal(x, v) -> bool:
    """``x == v`` for a cell and a value read from a file; a missing cell or an incomparable value is unequal."""
    try:
        return bool(x == v)
    except (TypeError, ValueError):
        return False


def measured_rows(rows, measure: Measurement | None) -> dict[int, GemmMeasurement]:
    """Audit row index -> the measured GEMM that stands for it (`match_rows`; the first where two do): what a page
    shows beside each row."""
    out: dict[int, GemmMeasurement] = {}
    keys = row_keys(rows) if measure is not None else []
    for g in measure.gemms if measure is not None else []:
        for i in match_rows(rows, g, keys).index:
            out.setdefault(int(i), g)
    return out


def _other_sizes(g: GemmMeasurement, rows) -> str | None:
    """Why a measured grouped GEMM's group sizes are not those of the run's rows it matches, or None: the same
    problem routed otherwise (another run, recorded against assumed sizes) times otherwise."""
    s = g.group_summary
    if not isinstance(s, dict) or "min" not in s or "max" not in s:
        return None
    for r in match_rows(rows, g).to_dict("records"):
        lo, hi, src = r.get("group_min"), r.get("group_max"), r.get("sizes_source")
        if _na(lo) or _na(hi):
            continue
        if (int(lo), int(hi)) != (s["min"], s["max"]) or (not _na(src) and g.sizes_source
                                                          and src != g.sizes_source):
            return (f"was measured with groups of {s['min']}–{s['max']} rows ({g.sizes_source}), this "
                    f"run's are {int(lo)}–{int(hi)} ({src})")
    return None


def _experts_mismatch(e: ExpertsMeasurement, rows) -> str | None:
    """Why a measured experts call (`measure.measure_experts`) is not the call the run makes, or None: the run
    must have the module's forward grouped GEMM with those groups, rows and hidden size, and backward rows
    exactly when the call was timed forward and backward (an inference run is not a training step)."""
    prob = e.problem
    mod = rows[(rows["module"] == e.module).fillna(False)] if len(rows) else rows
    if not len(mod):
        return "the run has no such module"
    fwd = [r for r in mod.to_dict("records") if r.get("pass") == "fwd" and not _na(r.get("groups"))
           and int(r["groups"]) == e.groups
           and (prob.get("rows") is None or (not _na(r.get("m")) and int(r["m"]) == prob["rows"]))
           and (prob.get("hidden") is None or (not _na(r.get("k")) and int(r["k"]) == prob["hidden"]))]
    if not fwd:
        return (f"the run's module has no forward grouped GEMM of {e.groups} groups, {prob.get('rows')} rows "
                f"and hidden size {prob.get('hidden')}")
    train = bool((mod["pass"] == "bwd").fillna(False).any())
    if (e.scope == "forward and backward") != train:
        return f"timed {e.scope}, and the run's module {'has' if train else 'has no'} backward rows"
    return None
