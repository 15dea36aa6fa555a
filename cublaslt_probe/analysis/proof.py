"""Proofs of advice: what applying an item did to the program's own step, as a file bound to its run.

A proof is made on the GPU (`gpu.prove.prove`): each item the tool can apply to the live program is switched on
and off in alternating rounds (original, variant, original, ...), each block after a warm-up, each step timed
with CUDA events; the same rounds with nothing switched (original against original) give the noise floor. This
module holds what needs no GPU: the statistics of the rounds (`summarize`), the verdict rule (`verdict`), the
file's schema (`PROOF_SCHEMA`, ``schema_version`` `PROOF_VERSION`; version 1 files wrote ``version``), its writer
and its validating reader (`write`; `load`, into the types `Proof` and `ProofItem`), its binding to the run it
proves (`bind_proof`, `binding`'s rule), and its join to the advice (`apply`), which re-ranks: proven items by
their proven saving; an item proven slower or within noise is not ranked.

Statistics: a round gives one saving, the original block's median step minus the variant block's (µs, positive
when the variant is faster); the proven saving is the median over rounds, its spread the rounds' interquartile
range; the noise floor is the median absolute difference of the original-against-original rounds. A proven
saving inside max(noise floor, spread half-width) of zero is *within noise*.
"""
from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from cublaslt_probe.errors import ProbeError

PROOF_SCHEMA = "cublaslt-probe proof"
PROOF_VERSION = 2       # 1: the version under ``version``; 2: ``schema_version``
STATUSES = ("proven", "unproven", "failed")


@dataclass(frozen=True)
class ProofItem:
    """One advice item's proof (`gpu.prove`): its ``what`` (the advice item's text it joins on), ``kind``,
    ``status`` (proven | unproven | failed), the prediction, and, proven, the saving per step with its spread
    (µs, [q25, q75]), the two blocks' step medians, the noise floor and the rounds; unproven, ``why`` (and
    ``what_if`` where a what-if stood in for a change). ``raw``: the record as saved."""

    what: str
    status: str
    kind: str | None = None
    predicted_us: float | None = None
    proven_us: float | None = None
    spread_us: tuple[float, float] | None = None
    noise_us: float | None = None
    rounds: int | None = None
    why: str | None = None
    applier_cost_us: float = 0.0    # the applier's own copies per step (`gpu.prove.applier_cost`), 0 where none
    kernel_saving_us: float | None = None   # the step's kernels, original less variant (`kernel_split`), per step
    raw: dict = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_checked(cls, it: dict) -> ProofItem:
        sp = it.get("spread_us")
        return cls(it["what"], it["status"], it.get("kind"), it.get("predicted_us"), it.get("proven_us"),
                   tuple(sp) if isinstance(sp, list) else None, it.get("noise_us"), it.get("rounds"),
                   it.get("why"), float((it.get("applier_cost") or {}).get("us") or 0.0),
                   (it.get("kernels") or {}).get("saving_us"), dict(it))


@dataclass(frozen=True)
class Proof:
    """A proof file read and checked (`load`): its usable ``items``, the ``fingerprint`` of the run it proves
    (None: made before proofs carried one), the ``env`` it was proven in, the prover's ``notes``, the
    ``schema_version`` it was written with. ``raw``: the file's other fields (noise, cost, restored)."""

    items: list[ProofItem]
    fingerprint: dict | None = None
    env: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    schema_version: int = PROOF_VERSION
    raw: dict = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_checked(cls, d: dict, items: list[dict] | None = None) -> Proof:
        """The proof of document `d` whose `items` (``d["items"]`` when None) are checked (`_check_item`)."""
        fp = d.get("fingerprint")
        return cls([ProofItem.from_checked(it) for it in (d.get("items") or [] if items is None else items)],
                   fp if isinstance(fp, dict) else None, d.get("env") if isinstance(d.get("env"), dict) else {},
                   [n for n in d.get("notes") or [] if isinstance(n, str)] if isinstance(d.get("notes"), list)
                   else [], _version(d) or PROOF_VERSION, dict(d))


def _version(d: dict):
    """The schema version a proof document says (``schema_version``, version 1's ``version``), as written."""
    return d.get("schema_version", d.get("version"))


def _q(xs: list[float], p: float) -> float:
    """The p-quantile of xs by linear interpolation (xs non-empty)."""
    s = sorted(xs)
    pos = p * (len(s) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def summarize(original_us: list[list[float]], variant_us: list[list[float]],
              noise_rounds: list[float] | None = None) -> dict:
    """The statistics of one item's rounds. ``original_us[i]`` and ``variant_us[i]`` are the step times (µs) of
    round i's two blocks; ``noise_rounds`` the per-round differences of the original-against-original rounds.
    Returns ``proven_us`` (median saving per step, positive: faster), ``spread_us`` ([q25, q75] of the
    rounds' savings), ``original_step_us`` and ``variant_step_us`` (medians of the blocks' medians),
    ``noise_us`` (median absolute original-against-original difference, None without those rounds),
    ``rounds``."""
    if not original_us or len(original_us) != len(variant_us):
        raise ValueError("summarize: one original and one variant block per round")
    a = [statistics.median(r) for r in original_us]
    b = [statistics.median(r) for r in variant_us]
    d = [x - y for x, y in zip(a, b)]
    noise = statistics.median(abs(x) for x in noise_rounds) if noise_rounds else None
    return {"proven_us": statistics.median(d), "spread_us": [_q(d, 0.25), _q(d, 0.75)],
            "original_step_us": statistics.median(a), "variant_step_us": statistics.median(b),
            "noise_us": noise, "rounds": len(d)}


KERNELS_SHOWN = 8    # the kernels whose time per step changed most, kept per item


def kernel_split(original: list, variant: list, steps: int) -> dict:
    """The GPU's own work in a proof's step with the change off and on: `original` and `variant` are the
    (start ns, name, µs) events CUPTI recorded over `steps` steps of each (every kernel, memset and copy). Returns
    ``original_us`` and ``variant_us`` (the events' time per step, summed: concurrent events count each), their
    difference ``saving_us`` (positive: the variant's kernels take less), ``steps``, ``names`` (distinct names in
    either), and ``changed``: the `KERNELS_SHOWN` names whose time per step changed most, each with its
    ``original_us`` and ``variant_us`` per step (0 where that side never ran it) and its launches per step,
    ``original_calls`` and ``variant_calls`` (a kernel a change moves from one GEMM to another keeps its name and
    changes its launches).

    A prediction times the changed GEMMs alone; in the step they run behind other work, on other operands and
    clocks. Where the saving over whole steps departs from the prediction, this says whether the kernels
    themselves saved that much in the step (the prediction mis-timed them) or the rest of the step moved
    (launch gaps, host time, kernels the change added)."""
    if steps < 1:
        raise ValueError("kernel_split: steps must be at least 1")

    def per_name(events) -> tuple[dict[str, float], dict[str, float]]:
        us: dict[str, float] = {}
        calls: dict[str, int] = {}
        for ev in events:
            us[ev[1]] = us.get(ev[1], 0.0) + float(ev[2])
            calls[ev[1]] = calls.get(ev[1], 0) + 1
        return {k: v / steps for k, v in us.items()}, {k: v / steps for k, v in calls.items()}
    (a, ac), (b, bc) = per_name(original), per_name(variant)
    names = sorted(set(a) | set(b), key=lambda k: (-abs(a.get(k, 0.0) - b.get(k, 0.0)), k))
    return {"original_us": sum(a.values()), "variant_us": sum(b.values()),
            "saving_us": sum(a.values()) - sum(b.values()), "steps": steps, "names": len(names),
            "changed": [{"name": k, "original_us": a.get(k, 0.0), "variant_us": b.get(k, 0.0),
                         "original_calls": ac.get(k, 0.0), "variant_calls": bc.get(k, 0.0)}
                        for k in names[:KERNELS_SHOWN]]}


SETTLED_WIDTH = 0.5   # the rounds' quartile range at most this share of the saving: it is pinned down
MORE_ROUNDS = 3       # ... else rounds are added, up to this many times the rounds asked for


def settled(s: dict) -> bool:
    """Whether an item's rounds pin its saving down (`summarize`'s dict): the quartile range of the rounds'
    savings is at most `SETTLED_WIDTH` of the saving's size, so its ratio to the prediction is known to about
    ±25 %. A noisy program (a host-bound MoE step whose rounds differ by ±700 µs) otherwise gives a median that
    moves from one proof to the next; the prover adds rounds until settled or `MORE_ROUNDS` times the rounds."""
    lo, hi = s["spread_us"]
    return hi - lo <= SETTLED_WIDTH * abs(s["proven_us"])


def verdict(proven_us: float, spread_us: list[float], noise_us: float | None) -> str:
    """'saves' | 'slower' | 'within noise': within noise when the proven saving lies inside the larger of the
    noise floor and the spread's half-width around zero."""
    half = (spread_us[1] - spread_us[0]) / 2
    if abs(proven_us) <= max(noise_us or 0.0, half):
        return "within noise"
    return "saves" if proven_us > 0 else "slower"


def kernel_phrase(kernel_saving_us: float) -> str:
    """``its kernels in the step saved 52.4 µs/step`` (or ``took 115.1 µs/step more``): the step's kernels'
    saving (`kernel_split`) in words, for the text and the page alike."""
    if kernel_saving_us < 0:
        return f"its kernels in the step took {-kernel_saving_us:,.1f} µs/step more"
    return f"its kernels in the step saved {kernel_saving_us:,.1f} µs/step"


PREDICTION_BAND = (0.7, 1.3)    # proven / predicted inside this band: the prediction holds


def holds(ratio: float | None) -> bool:
    """Whether a proven saving's share of its prediction lies in `PREDICTION_BAND`."""
    return ratio is not None and PREDICTION_BAND[0] <= ratio <= PREDICTION_BAND[1]


def in_step_reading(proven_us: float, predicted_us: float, kernel_saving_us: float | None,
                    pinned_down: bool = True) -> str | None:
    """Where a proven saving departs from its prediction (outside `PREDICTION_BAND`), what the step's own kernels
    (`kernel_split`) say about why: ``"kernels"`` when the kernels saved what the step saved (they ran at
    another speed in the step than alone: the prediction, corrected by their time in the step, holds);
    ``"rest"`` when the kernels saved what was predicted and the step did not follow (the GPU's kernels are not
    the step's bound: idle gaps, host time or launches took the difference); ``"both"`` when neither holds.
    None where the prediction holds, without the kernels or a positive prediction, or where the proven saving is
    not `pinned_down` (`settled`): it is then read as its quartiles' range, and one block of kernels each way
    cannot explain a median that moves from one proof to the next."""
    if (kernel_saving_us is None or predicted_us <= 0 or not pinned_down
            or holds(proven_us / predicted_us)):
        return None
    if kernel_saving_us > 0 and holds(proven_us / kernel_saving_us):
        return "kernels"
    if holds(kernel_saving_us / predicted_us):
        return "rest"
    return "both"


def write(path: str | Path, proof: dict) -> None:
    """Writes a proof (the dict `gpu.prove.prove` returns) as JSON, with the schema and its version."""
    out = {"schema": PROOF_SCHEMA, "schema_version": PROOF_VERSION,
           **{k: v for k, v in proof.items() if k not in ("schema", "schema_version", "version")}}
    Path(path).write_text(json.dumps(out, indent=1, allow_nan=False) + "\n")


def _finite(v, nonneg: bool = False) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            and (not nonneg or v >= 0))


def _check_item(it, i: int) -> str | None:
    """Why record i of a proof's items cannot be used, or None."""
    if not isinstance(it, dict):
        return "not an object"
    if it.get("status") not in STATUSES:
        return f"status {it.get('status')!r} is not one of {', '.join(STATUSES)}"
    if not isinstance(it.get("what"), str):
        return "no 'what' text"
    if it["status"] == "proven":
        if not _finite(it.get("proven_us")):
            return f"proven_us {it.get('proven_us')!r} is not a finite number"
        sp = it.get("spread_us")
        if not (isinstance(sp, list) and len(sp) == 2 and all(_finite(x) for x in sp) and sp[0] <= sp[1]):
            return f"spread_us {sp!r} is not [low, high]"
        for k in ("original_step_us", "variant_step_us"):
            if not _finite(it.get(k), nonneg=True):
                return f"{k} {it.get(k)!r} is not a finite number ≥ 0"
        if it.get("noise_us") is not None and not _finite(it.get("noise_us"), nonneg=True):
            return f"noise_us {it.get('noise_us')!r} is not a finite number ≥ 0"
        if abs(it["proven_us"]) > it["original_step_us"] + it["variant_step_us"]:
            return "proven_us is larger than the steps it was measured on"
    if it.get("predicted_us") is not None and not _finite(it.get("predicted_us")):
        return f"predicted_us {it.get('predicted_us')!r} is not a finite number"
    cost = it.get("applier_cost")
    if cost is not None and not (isinstance(cost, dict) and _finite(cost.get("us"), nonneg=True)):
        return f"applier_cost {cost!r} is not an object with a finite 'us' ≥ 0"
    return _check_kernels(it.get("kernels"))


def _check_kernels(k) -> str | None:
    """Why an item's ``kernels`` record (`kernel_split`'s, or ``{"why": ...}`` where CUPTI could not record)
    cannot be used, or None (also when there is none)."""
    if k is None or (isinstance(k, dict) and set(k) == {"why"} and isinstance(k["why"], str)):
        return None
    if not isinstance(k, dict):
        return f"kernels {k!r} is not an object"
    for f in ("original_us", "variant_us"):
        if not _finite(k.get(f), nonneg=True):
            return f"kernels.{f} {k.get(f)!r} is not a finite number ≥ 0"
    if not _finite(k.get("saving_us")) or abs(k["saving_us"] - (k["original_us"] - k["variant_us"])) > 1e-6 * max(
            1.0, k["original_us"]):
        return f"kernels.saving_us {k.get('saving_us')!r} is not original_us less variant_us"
    return None


def load(path: str | Path) -> tuple[Proof, list[str]]:
    """Reads a proof file (gzip or plain JSON) and validates it: returns (`Proof`, notes). A file that is not a
    proof raises ProbeError in one line naming it; an item that cannot be used is dropped with a note naming
    the file and its index, never the whole proof refused."""
    from cublaslt_probe.streams import open_text
    p = Path(path)
    try:
        with open_text(p) as f:
            d = json.loads(f.read().lstrip("\ufeff"))
    except (OSError, ValueError, EOFError) as e:
        raise ProbeError(f"{p}: not a readable proof ({e.__class__.__name__}): give a file written by "
                         "cublaslt_probe.prove(..., out=FILE)") from e
    if not isinstance(d, dict) or d.get("schema") != PROOF_SCHEMA:
        raise ProbeError(f"{p}: not a proof (no schema {PROOF_SCHEMA!r}): give a file written by "
                         "cublaslt_probe.prove(..., out=FILE)")
    v = _version(d)
    if not isinstance(v, int) or isinstance(v, bool) or v > PROOF_VERSION:
        raise ProbeError(f"{p}: proof version {v!r}; this tool reads up to {PROOF_VERSION}: upgrade cublaslt-probe")
    items = d.get("items")
    if not isinstance(items, list):
        raise ProbeError(f"{p}: no 'items' list: not a proof written by cublaslt_probe.prove")
    notes, kept = [], []
    for i, it in enumerate(items):
        why = _check_item(it, i)
        if why:
            notes.append(f"{p.name}: item {i} skipped: {why}")
        else:
            kept.append(it)
    return Proof.from_checked(d, kept), notes


def bind_proof(proof: Proof, a, source: str) -> list[str]:
    """Binds a loaded proof to audit `a` by `binding`'s rule (the fingerprint the proof carries: the run's
    GEMM problems, GPU, library versions): ProofRefused in one line when it is another run's (its GEMM problems
    are not this run's, or another GPU or library); notes otherwise (a proof without a fingerprint is bound by
    nothing and says so)."""
    from cublaslt_probe.analysis.audit.measured import row_keys, run_fingerprint
    from cublaslt_probe.binding import describe, env_differences, names
    fp = proof.fingerprint
    if fp is None or not isinstance(fp.get("gemms"), list):
        return [f"{source}: the proof names no run (no fingerprint): shown as it is, not checked against this run"]
    mine = run_fingerprint(a)
    diffs = env_differences(fp.get("env"), mine["env"])
    fix = "prove this run: `cublaslt-probe prove RUN --from MEASURE -- SCRIPT.py` on its GPU"
    if diffs:
        raise ProofRefused(f"{source} was proven with {'; '.join(diffs)}: not this run's proof (made for "
                           f"{describe(fp)}); {fix}")
    theirs = {tuple(k) for k in fp["gemms"]}
    ours = {k for k in row_keys(a.rows) if k is not None}
    if theirs != ours:
        only = sorted(theirs - ours, key=str) or sorted(ours - theirs, key=str)
        raise ProofRefused(f"{source} is the proof of another run ({describe(fp)}): its GEMM problems differ from "
                           f"this run's ({names(only)}); {fix}")
    return []


class ProofRefused(ProbeError):
    """A proof that is not this run's: a usage error (exit 2)."""


def apply(items: list[dict], proof: Proof | None) -> list[dict]:
    """The advice (`analysis.audit.advice`'s items) with its proof: each item with a record of the same ``what``
    gets ``proof`` (the record, its ``verdict`` and ``ratio`` = proven / predicted, the prediction less the
    applier's own copies where the proof measured them: ``applier_cost``, `gpu.prove.applier_cost`; the
    rounds' quartiles as shares of the prediction, ``ratio_spread``; whether the saving is ``settled``; the
    step's kernels' saving, ``kernel_saving_us``, its share of the prediction, ``kernel_ratio``, and what it
    says of a departure from the prediction, ``in_step``: `in_step_reading`); an item
    proven slower or within noise gets ``disproven`` (it is then not ranked); the ranked items are ordered by
    their best evidence (the proven saving where proven, else the prediction), and ``excludes`` renumbered to
    the new order."""
    if not proof:
        return items
    by_what = {r.what: r for r in proof.items}
    out = []
    for it in items:
        x = dict(it)
        r = by_what.get(it.get("what"))
        if r is not None:
            pred = (it.get("saving_us") or 0.0) - r.applier_cost_us
            x["proof"] = dict(r.raw)
            if r.status == "proven":
                v = verdict(r.proven_us, list(r.spread_us), r.noise_us)
                pinned = settled({"proven_us": r.proven_us, "spread_us": list(r.spread_us)})
                x["proof"].update(verdict=v, ratio=(r.proven_us / pred if pred > 0 else None),
                                  ratio_spread=([q / pred for q in r.spread_us] if pred > 0 else None),
                                  settled=pinned, applier_cost_us=r.applier_cost_us,
                                  kernel_saving_us=r.kernel_saving_us,
                                  kernel_ratio=(r.kernel_saving_us / pred if pred > 0 and r.kernel_saving_us
                                                is not None else None),
                                  in_step=in_step_reading(r.proven_us, pred, r.kernel_saving_us, pinned))
                if v != "saves":
                    k = r.kernel_saving_us
                    x["disproven"] = (f"proven {v} in the program's step: {r.proven_us:,.1f} µs/step "
                                      f"[{r.spread_us[0]:,.1f}, {r.spread_us[1]:,.1f}]"
                                      + (f"; {kernel_phrase(k)}" if k is not None else ""))
        out.append(x)

    def best(x):
        r = x.get("proof") or {}
        return r["proven_us"] if r.get("status") == "proven" else (x.get("saving_us") or 0.0)
    def rank(i):
        x = out[i]
        on = x["saving_us"] > 0 and not x.get("estimate") and not x.get("disproven")
        return (0, -best(x)) if on else (1, i)      # the unranked keep their order
    order = sorted(range(len(out)), key=rank)
    new_no = {old + 1: new + 1 for new, old in enumerate(order)}
    res = [out[i] for i in order]
    for x in res:
        x["excludes"] = sorted(new_no[e] for e in x.get("excludes") or [] if e in new_no)
    return res
