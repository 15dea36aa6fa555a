"""Which run a saved input belongs to: the fingerprint a saved measurement carries, and the comparison that
binds it to the run it is applied to.

`audit --measure --save` writes, beside the measurements, a ``fingerprint`` of the run they were taken for
(`fingerprint`): the run's GEMM problems (`GEMM_KEY`: the key the audit matches a measurement on), the GPU and
library versions (`ENV_KEYS`), the run's identity where the capture wrote one (its label and start, the trace's
file name) and the schema version. `bind` compares what a saved input measured with the run being audited:

- another GPU or library version (the measurement's environment against the run's, each field known on both
  sides) or no GEMM problem in common: refused, in one line saying which run the input is from and what to do;
- some measured GEMMs not in the run: bound to the GEMMs the run has; the others are named (count and a few);
- an input without a fingerprint (written before they carried one) is bound by the GEMM problems it holds.

One rule for every saved input that claims to describe a run (a measurement today; a proof of advice later).
Pure Python: read on any machine.
"""
from __future__ import annotations

import hashlib
import json
import math
import numbers
import os
from dataclasses import dataclass, field

FINGERPRINT_SCHEMA = 1
GEMM_KEY = ("op", "dtype", "layout", "m", "n", "k", "batch")
ENV_KEYS = ("gpu", "cublaslt_version", "cuda_runtime", "torch_version")
ENV_WORDS = {"gpu": "GPU", "cublaslt_version": "cuBLASLt", "cuda_runtime": "CUDA runtime", "torch_version": "torch"}
NAMED = 3          # how many GEMMs a note or a refusal names before "and N more"


def whole(v) -> int | None:
    """`v` as a whole number ≥ 0 (an int, or a float without a fraction), else None."""
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        return None
    if not isinstance(v, numbers.Integral) and (not math.isfinite(v) or v != int(v)):
        return None
    return int(v) if v >= 0 else None


def _missing(v) -> bool:
    """A missing value as pandas gives one (NaN, NA), without importing pandas."""
    if isinstance(v, float):
        return math.isnan(v)
    return type(v).__name__ in ("NAType", "NaTType")


def gemm_key(d) -> tuple | None:
    """The `GEMM_KEY` of a mapping (an audit row, a measurement's ``key``) as plain str/int, batch 1 when
    missing; None when op is not a string or m, n, k, batch are not whole numbers ≥ 0 (nothing to match)."""
    if not hasattr(d, "get"):
        return None
    out = []
    for c in GEMM_KEY:
        v = d.get(c)
        if c in ("m", "n", "k", "batch"):
            if c == "batch" and (v is None or _missing(v)):
                v = 1
            v = whole(v)
            if v is None:
                return None
        elif c == "op":
            if not isinstance(v, str) or not v:
                return None
        else:
            v = str(v) if isinstance(v, str) else None
        out.append(v)
    return tuple(out)


def key_name(key: tuple) -> str:
    """``aten::mm bf16 NT 8×128256×4096`` (×batch when over 1)."""
    op, dtype, layout, m, n, k, batch = key
    return f"{op} {dtype} {layout} {m}×{n}×{k}" + (f" ×{batch}" if batch and batch > 1 else "")


def names(keys, limit: int = NAMED) -> str:
    """A few GEMMs by `key_name`, and how many more."""
    keys = list(keys)
    more = f" and {len(keys) - limit} more" if len(keys) > limit else ""
    return ", ".join(key_name(k) for k in keys[:limit]) + more


def run_identity(env: dict | None, source: str | None = None) -> dict:
    """What names a run where the capture wrote it: the capture's ``label`` and ``started`` (env.json), and the
    file name of its trace (`source`: the run folder or trace audited)."""
    cap = (env or {}).get("capture") or {}
    out = {"label": cap.get("label") if isinstance(cap.get("label"), str) else None,
           "started": cap.get("started") if isinstance(cap.get("started"), str) else None}
    if source:
        out["source"] = os.path.basename(os.path.normpath(str(source)))
    return out


def fingerprint(keys, env: dict | None, identity: dict | None = None) -> dict:
    """The fingerprint of a run: its GEMM problems (`gemm_key` tuples; sorted, each once), the `ENV_KEYS` of its
    environment, its identity (`run_identity`), a short ``id`` hashed from the problems, and the schema."""
    ks = sorted({tuple(k) for k in keys if k is not None}, key=lambda k: tuple(str(x) for x in k))
    digest = hashlib.sha256(json.dumps(ks).encode()).hexdigest()[:12]
    return {"schema": FINGERPRINT_SCHEMA, "id": digest, "gemms": [list(k) for k in ks],
            "env": {k: (env or {}).get(k) for k in ENV_KEYS}, "run": dict(identity or {})}


def describe(fp: dict | None) -> str:
    """A saved input's run in words: ``run 'llama_decode' captured 2026-11-30T08:49:05Z (9 GEMM problems,
    NVIDIA H200)``; for an input without a fingerprint, that it names none."""
    if not isinstance(fp, dict):
        return "no run named: the file has no fingerprint, written before saved inputs carried one"
    run = fp.get("run") if isinstance(fp.get("run"), dict) else {}
    env = fp.get("env") if isinstance(fp.get("env"), dict) else {}
    who = run.get("label") or run.get("source") or f"id {fp.get('id')}"
    gemms = fp.get("gemms") if isinstance(fp.get("gemms"), list) else []
    return (f"run '{who}'" + (f" captured {run['started']}" if run.get("started") else "")
            + f" ({len(gemms)} GEMM problems" + (f", {env['gpu']}" if env.get("gpu") else "") + ")")


@dataclass
class Binding:
    """What `bind` found: ``refused`` (one line: why the input is not this run's, and what to do; None when it
    binds), the measured GEMM problems the run has (``common``) and those it does not (``missing``, in the
    input's order), and ``notes`` to show with the result."""

    refused: str | None
    common: set = field(default_factory=set)
    missing: list = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def env_differences(saved_env: dict | None, run_env: dict | None) -> list[str]:
    """The `ENV_KEYS` known on both sides that differ: ``GPU NVIDIA A100 (this run: NVIDIA H200)``."""
    out = []
    for k in ENV_KEYS:
        a, b = (saved_env or {}).get(k), (run_env or {}).get(k)
        if isinstance(a, str) and isinstance(b, str) and a and b and a != b:
            out.append(f"{ENV_WORDS[k]} {a} (this run: {b})")
    return out


def bind(source: str, measured_keys: list, saved_env: dict | None, saved_fp: dict | None, run_keys,
         run_env: dict | None, run_id: dict | None, fix: str) -> Binding:
    """Bind the saved input `source` (what it measured: `measured_keys`, in its order; where: `saved_env`; the
    run it was made for: `saved_fp`, None for an input without a fingerprint) to the run audited (`run_keys`,
    its `run_env` and `run_id`). `fix` is what the person should do instead (a command), said on refusal."""
    mine = {k for k in run_keys if k is not None}
    measured = list(dict.fromkeys(k for k in measured_keys if k is not None))
    where = describe(saved_fp)
    diffs = env_differences(saved_env, run_env)
    if isinstance(saved_fp, dict) and isinstance(saved_fp.get("env"), dict):
        diffs += [d for d in env_differences(saved_fp["env"], run_env) if d not in diffs]
    if diffs:
        return Binding(f"{source} was measured with {'; '.join(diffs)}: a measurement of another GPU or library "
                       f"does not hold for this run (saved for {where}); {fix}")
    common = {k for k in measured if k in mine}
    missing = [k for k in measured if k not in mine]
    if not mine:
        return Binding(f"{source} cannot be bound to this run: it has no GEMM with a known problem (no GEMM "
                       "kernel, or a trace recorded without shapes: record_shapes=True); capture the run with "
                       "shapes, then measure it")
    if not common:
        return Binding(f"{source} is a measurement of another run (saved for {where}): none of its {len(measured)} "
                       f"measured GEMM problems ({names(measured) or 'none readable'}) is among this run's "
                       f"{len(mine)}; {fix}")
    notes = []
    if missing:
        notes.append(f"{source}: {len(missing)} of its {len(measured)} measured GEMMs are not in this run "
                     f"({names(missing)}): left out; the advice rests on the {len(common)} it shares"
                     + (f" (the measurement was made for {where})" if isinstance(saved_fp, dict) else ""))
    return Binding(None, common, missing, notes)
