"""Advice from saved GPU measurements (`audit --measure`): typed `AdviceItem`s, one rule per kind (pin an algo,
switch the GEMM path, pad a dimension, a grouped-GEMM variant), ranked and turned into dicts by `advice`. CPU only.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import pandas as pd

from cublaslt_probe.analysis.audit.judge import NEAR_FLOOR
from cublaslt_probe.analysis.audit.measured import check_measure, match_rows
from cublaslt_probe.analysis.audit.measurement import Candidate, ExpertsMeasurement, GemmMeasurement, Measurement
from cublaslt_probe.analysis.audit.schema import _na, row_label
from cublaslt_probe.vocab import figure

# --------------------------------------------------------------------------- advice from measurements
MIN_GAIN = 0.03          # a measured alternative must beat the original by 3 % (above timing noise)
PATH_WORDS = {
    "torch": "the cuBLAS path (torch.backends.cuda.preferred_blas_library('cublas'), 32 MiB workspace)",
    "torch-lt": "torch's cuBLASLt path (torch.backends.cuda.preferred_blas_library('cublaslt'), 1 MiB workspace)",
    "lt": "cuBLASLt with a 32 MiB workspace (preferred_blas_library('cublaslt') and CUBLASLT_WORKSPACE_SIZE=32768)",
}
ADVICE_KEYS = ("what", "kind", "module", "saving_us", "saving_pct", "evidence", "risk", "gemms", "replay",
                "excludes", "estimate", "change")


def _numerics_risk(g: GemmMeasurement, label: str) -> str:
    num = g.numerics.get(label)
    tol = g.tolerance
    if num is None:
        return "numerics not compared"
    if tol is not None and num > tol:
        return f"numerics differ: max rel. error {num:.2g} > tolerance {tol:.2g}"
    return f"numerics agree (max rel. error {num:.2g}" + (f" ≤ {tol:.2g})" if tol is not None else ")")


def pinned_line(g: GemmMeasurement, cand: Candidate) -> str | None:
    """The measured GEMM's own cuBLASLt log line with candidate `cand`'s algo in place of the logged one: a
    line `cublaslt-probe replay` rebuilds and runs with that algo pinned. None without a logged line."""
    line = g.original.log_line if g.original else None
    c = cand.raw
    if not line or "algo=[" not in line or c.get("algo_id") is None:
        return None
    algo = [f"algoId={c['algo_id']}"]
    if c.get("tile"):
        algo.append(f"tile=MATMUL_TILE_{c['tile']}")
    if c.get("stages"):
        algo.append(f"stages=MATMUL_STAGES_{c['stages']}")
    if (c.get("split_k") or 1) > 1:
        algo += [f"reductionScheme=REDUCTION_SCHEME_{c.get('reduction_scheme') or 'NONE'}",
                 f"numSplitsK={c['split_k']}"]
    if c.get("custom_option"):
        algo.append(f"customOption={c['custom_option']}")
    if c.get("cta_swizzling"):
        algo.append(f"ctaSwizzling={c['cta_swizzling']}")
    if c.get("cluster"):
        algo.append(f"clusterShape=CLUSTER_SHAPE_{c['cluster']}")
    line = re.sub(r"algo=\[[^\]]*\]", "algo=[" + " ".join(algo) + "]", line, count=1)
    return re.sub(r"workSpaceSizeInBytes=\d+", f"workSpaceSizeInBytes={int(c.get('workspace_bytes') or 0)}", line,
                  count=1)


@dataclass
class _Measured:
    """One measured GEMM as the advice reads it: the audit rows it stands for, its calls per step and its GPU
    time per step in the run (``run_us``: the most a change of it can save), its measured time on the path it
    took (``path``: torch | torch-lt)."""

    i: int
    g: GemmMeasurement
    label: str
    module: str | None
    rows: list[int]
    calls: float
    orig: float
    path: str | None
    run_us: float | None = None

    @property
    def where(self) -> str:
        return f" ({self.module})" if self.module else ""

    @property
    def ids(self) -> frozenset:
        """What an item that changes this GEMM touches: its audit rows (the measurement itself without rows)."""
        return frozenset(("row", r) for r in self.rows) or frozenset({("g", self.i)})

    def saved(self, t: float) -> tuple[float, bool]:
        """(µs per step saved running it in `t` µs a call, whether that was capped): never more than its time
        in the run, which is all a change of it can save."""
        d = (self.orig - t) * self.calls
        if self.run_us is not None and d > self.run_us:
            return self.run_us, True
        return d, False

    def change(self, name: str, t: float, kernel: str | None, named: bool = True) -> tuple[float, str]:
        """(saving per step, evidence) of running it as alternative `name` in `t` µs: negative when slower.
        `named`: the evidence names its module."""
        d, cap = self.saved(t)
        return d, (f"{self.label}{self.where if named else ''}: original {self.orig:.1f} µs, {name} {t:.1f} µs "
                   f"({kernel or ''}); × {self.calls:g} calls/step" + (f", {-d:,.1f} µs/step slower" if d < 0 else "")
                   + (f", at most its {self.run_us:,.1f} µs/step in this run" if cap else ""))


@dataclass
class AdviceItem:
    """One change and what the measurements say it does to the step. ``saving_us`` nets every measured GEMM
    the change moves, slower ones subtracting; ``touches`` holds every GEMM it changes, measured or not (audit
    rows), ``helped`` the measured ones it makes faster, ``setting`` the global switch it sets. Two items that
    touch one GEMM, or set one switch two ways, exclude each other: their savings do not add."""

    kind: str
    what: str
    module: str | None
    saving_us: float
    evidence: str
    risk: str
    gemms: list[str]
    touches: frozenset = frozenset()
    helped: frozenset = frozenset()
    setting: str | None = None
    replay: str | None = None
    excludes: list[int] = field(default_factory=list)
    estimate: str | None = None
    change: dict | None = None     # what an applier needs (gpu.prove): pad {"from", "to"}; path {"path"};
                                   # workspace {"path", "workspace_bytes"} (the size its GEMMs were timed with,
                                   # None where the measurement does not say); pin {"algo", "kernel", "key",
                                   # "pass"}; grouped {"variant", "groups"}

    def clashes(self, other: AdviceItem) -> bool:
        return bool(self.touches & other.touches) or (self.setting is not None and self.setting == other.setting)

    def as_dict(self, step_us: float | None) -> dict:
        d = {**self.__dict__, "saving_pct": (100 * self.saving_us / step_us if step_us else None)
             if self.saving_us > 0 else 0.0}
        return {k: d.get(k) for k in ADVICE_KEYS}


PIN_KEYS = ("algo_id", "tile", "stages", "cluster", "split_k", "reduction_scheme", "custom_option", "cta_swizzling",
            "inner_shape", "workspace_bytes")   # a candidate's config, as `gpu.pin.pin_linear` takes it


def _quiet(what: str, kind: str, module, evidence: str = "", gemms: list[str] | None = None) -> AdviceItem:
    return AdviceItem(kind, what, module, 0.0, evidence, "", gemms or [])


def _row_gemm(r: dict) -> str:
    """An audit row as advice names it: ``transformer.h.*.mlp.c_fc ×12 fwd aten::addmm 4096×3072×768``."""
    def v(x):
        return "?" if _na(x) else str(x)
    return (f"{row_label(r)}" + ("" if _na(r.get("pass")) else f" {r['pass']}") + f" {v(r.get('op'))} "
            f"{v(r.get('m'))}×{v(r.get('n'))}×{v(r.get('k'))}")


def _not_measured(rows: pd.DataFrame, idx: list[int], what: str, limit: int = 8) -> tuple[str, str]:
    """(evidence, risk) naming the GEMMs a change moves that were not measured, with their time per step."""
    if not idx:
        return "", ""
    sub = rows.loc[idx]
    us = float(sub["gpu_us"].sum())
    names = [_row_gemm(r) + ("" if not _na(r.get("log_function")) else " (path unknown)")
             for r in sub.to_dict("records")]
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    n = f"{len(idx)} GEMM{'s' if len(idx) != 1 else ''}"
    return (f"{n} it {what} {'were' if len(idx) != 1 else 'was'} not measured ({us:,.1f} µs/step): "
            + ", ".join(names[:limit]) + more,
            f"{n} it {what} ({us:,.1f} µs/step) {'were' if len(idx) != 1 else 'was'} not measured: their time "
            "after the change is unknown")


def _measured_gemms(rows: pd.DataFrame, measure: Measurement) -> tuple[list[_Measured], list[AdviceItem]]:
    """The GEMMs measured with a time that stand for rows of this run, and a quiet item for each that was not
    measured (grouped, an error). Calls per step and the time a change can save come from the run's rows,
    never from the measurement; a row two records stand for is counted by the first (a measurement without
    module names matching rows another record names)."""
    from cublaslt_probe.analysis.audit.measured import row_keys
    from cublaslt_probe.analysis.evidence import path_of
    out, quiet, claimed = [], [], set()
    keys, narrow = row_keys(rows), rows[["module", "pass", "calls", "gpu_us"]]   # once for all the GEMMs
    for i, g in enumerate(measure.gemms):
        matched = match_rows(narrow, g, keys)
        matched = matched[[int(x) not in claimed for x in matched.index]] if len(matched) else matched
        if not len(matched):          # not a GEMM of this run (`measured.bind_measure` names those)
            continue
        module = g.module if g.module is not None else (
            matched["module"].iloc[0] if not pd.isna(matched["module"].iloc[0]) else None)
        label = g.label
        if g.skipped or g.error:
            quiet.append(_quiet(f"{label}{f' ({module})' if module else ''}: not measured — "
                                f"{g.skipped or g.error}", "not_measured", module, gemms=[label]))
            continue
        if not g.original_us:
            continue
        claimed |= {int(x) for x in matched.index}
        case = str(g.case or "").split("|")[0]
        path = case if case in ("torch", "torch-lt") else path_of(g.log_function)
        out.append(_Measured(i, g, label, module, [int(x) for x in matched.index], float(matched["calls"].sum()),
                             float(g.original_us), path, float(matched["gpu_us"].sum())))
    return out, quiet


def _pin_items(ms: list[_Measured]) -> list[AdviceItem]:
    """Pin the fastest correct heuristic candidate of one GEMM when it beats the original by `MIN_GAIN`."""
    out = []
    for m in ms:
        cands = [c for c in m.g.candidates if c.time_us and c.ok_numerics is not False]
        if not cands:
            continue
        c = min(cands, key=lambda c: c.time_us)
        if not (c.time_us < m.orig * (1 - MIN_GAIN) and c.rank != 0):
            continue
        c0 = next((x for x in cands if x.rank == 0), None)
        out.append(AdviceItem(
            "pin", f"pin candidate #{c.rank} ({c.algo_text}) for {m.module or m.label}", m.module,
            m.saved(c.time_us)[0],
            f"{m.label}: original {m.orig:.1f} µs, candidate #{c.rank} {c.time_us:.1f} µs"
            + (f", #0 {c0.time_us:.1f} µs" if c0 else "") + f"; × {m.calls:g} calls/step",
            "numerics checked against candidate #0" if c.ok_numerics else
            "numerics not checked; needs the algo pinned through cuBLASLt (replay)",
            [m.label], m.ids, frozenset({m.i}), replay=pinned_line(m.g, c),
            change={"algo": {k: c.raw.get(k) for k in PIN_KEYS}, "kernel": c.kernel, "key": m.g.raw.get("key"),
                    "pass": m.g.pass_}))
    return out


def _moved_rows(rows: pd.DataFrame, target: str) -> list[int]:
    """The audit rows a switch to path `target` moves: those whose logged function puts them on another path,
    and, where no log line says, every GEMM of an op torch runs through its BLAS switch."""
    from cublaslt_probe.analysis.evidence import TORCH_OPS, path_of
    out = []
    for i, lf, op in zip(rows.index, rows["log_function"].tolist(), rows["op"].tolist()):
        p = path_of(None if _na(lf) else lf)
        if (p is not None and p != target) or (p is None and not _na(op) and op in TORCH_OPS):
            out.append(int(i))
    return out


def _switch_items(rows: pd.DataFrame, ms: list[_Measured]) -> tuple[list[AdviceItem], list[AdviceItem]]:
    """A path or workspace switch moves every GEMM on the other paths, not only those that got faster: its
    saving nets the measured ones with their sign, and names those it moves that were not measured. Advice
    only when the net beats the moved GEMMs' own time by `MIN_GAIN`; else a quiet line, when some GEMM alone
    got faster."""
    from cublaslt_probe.analysis.evidence import TIMED_BACKENDS
    items, quiet = [], []
    for target in TIMED_BACKENDS:
        done = []
        for m in ms:
            if m.path is None or m.path == target:
                continue
            p = next((p for p in m.g.paths if p.path == target and p.time_us), None)
            if p is not None:
                done.append((m, p))
        if not any(p.time_us < m.orig * (1 - MIN_GAIN) for m, p in done):
            continue
        changes = [m.change(target, p.time_us, p.kernel) for m, p in done]
        net = sum(d for d, _ in changes)
        base = sum(m.orig * m.calls for m, _ in done)
        seen = {r for m, _ in done for r in m.rows}
        moved = _moved_rows(rows, target)
        ev_un, risk_un = _not_measured(rows, [r for r in moved if r not in seen], "moves")
        faster = sum(d > 0 for d, _ in changes)
        words = PATH_WORDS.get(target, target)
        summary = (f"net over the {len(done)} measured GEMM{'s' if len(done) != 1 else ''} it moves "
                   f"({faster} faster, {len(done) - faster} slower): ")
        kind = "workspace" if target == "lt" else "path"
        if net <= MIN_GAIN * base:
            quiet.append(_quiet(f"run on {words}: no net saving — {summary}"
                                + (f"{net:,.1f} µs/step saved, under 3 % of their time" if net > 0 else
                                   f"{-net:,.1f} µs/step slower") + (f"; {ev_un}" if ev_un else "") + "; no advice",
                                "no_gain", None, gemms=[m.label for m, _ in done]))
            continue
        ws = max((p.workspace or 0 for _, p in done), default=0)
        risk = list(dict.fromkeys(_numerics_risk(m.g, f"path:{target}") for m, _ in done))
        items.append(AdviceItem(
            kind, f"run on {words}", None, net,
            "; ".join(e for _, e in changes) + f"; {summary}{net:,.1f} µs/step" + (f"; {ev_un}" if ev_un else ""),
            "; ".join(risk) + (f"; workspace {ws / 2**20:g} MiB" if ws else "") + (f"; {risk_un}" if risk_un else ""),
            [m.label for m, _ in done],
            frozenset().union(*(m.ids for m, _ in done)) | frozenset(("row", r) for r in moved),
            frozenset(m.i for (m, _), (d, _) in zip(done, changes) if d > 0), setting="blas path",
            change={"path": target, **({"workspace_bytes": ws or None} if kind == "workspace" else {})}))
    return items, quiet


def _pad_items(rows: pd.DataFrame, ms: list[_Measured]) -> tuple[list[AdviceItem], list[AdviceItem]]:
    """Padding one value in one module changes every GEMM of the module with that value in m, n or k: each
    padded value nets its measured GEMMs with their sign (the slower what-if when the value is in two dims).
    Of the values whose net beats those GEMMs' time by `MIN_GAIN`, the smallest whose saving is within
    `MIN_GAIN` of the best is advised (the least extra work and memory); the other values measured are listed
    in its evidence. A GEMM without a module is padded on its own."""
    groups: dict[tuple, list[_Measured]] = {}
    for m in ms:
        key = m.g.key
        for w in m.g.whatifs:
            old = key.get(w.dim)
            if w.time_us and old is not None:
                gk = (m.module, old) if m.module else (None, old, m.i)
                if m not in groups.setdefault(gk, []):
                    groups[gk].append(m)
    items, quiet = [], []
    for gk, whatif_ms in groups.items():
        module, old = gk[0], gk[1]

        def holds(key, old=old):
            return old in (key.get("m"), key.get("n"), key.get("k"))
        members = whatif_ms if module is None else [m for m in ms if m.module == module and holds(m.g.key)]
        group_rows = [r for m in whatif_ms for r in m.rows] if module is None else [
            int(i) for i, r in zip(rows.index, rows.to_dict("records"))
            if not _na(r["module"]) and r["module"] == module
            and any(not _na(r[d]) and int(r[d]) == old for d in ("m", "n", "k"))]
        values = sorted({w.value for m in whatif_ms for w in m.g.whatifs
                         if w.time_us and m.g.key.get(w.dim) == old})
        res = {}
        for v in values:
            done, beat = [], False
            for m in members:
                key = m.g.key
                ws = [w for w in m.g.whatifs if w.value == v and w.time_us and key.get(w.dim) == old]
                if ws:
                    w = max(ws, key=lambda w: w.time_us)
                    done.append((m, w, *m.change(f"{w.dim}={v}", w.time_us, w.kernel, named=module is None)))
                    beat |= any(x.time_us < m.orig * (1 - MIN_GAIN) for x in ws)
            net = sum(d for _, _, d, _ in done)
            res[v] = {"done": done, "net": net, "beat": beat,
                      "ok": net > MIN_GAIN * sum(m.orig * m.calls for m, *_ in done)}
        ok = [v for v in values if res[v]["ok"]]
        vocab = bool(module) and re.search(r"(lm_head|embed|wte|vocab)", str(module)) is not None
        in_mod = f" in {module}" if module else ""
        if not ok:
            beaten = [v for v in values if res[v]["beat"]]
            if beaten:
                v = beaten[0]
                net, n = res[v]["net"], len(res[v]["done"])
                quiet.append(_quiet(f"pad {old} → {v}{in_mod}: no net saving over the {n} measured GEMM"
                                    f"{'s' if n != 1 else ''} with {old} ("
                                    + (f"{-net:,.1f} µs/step slower" if net <= 0 else
                                       f"{net:,.1f} µs/step saved, under 3 % of their time") + "); no advice",
                                    "no_gain", module))
            continue
        best = max(res[v]["net"] for v in ok)
        pick = min(v for v in ok if res[v]["net"] >= best * (1 - MIN_GAIN))
        r = res[pick]
        seen = {x for m, *_ in r["done"] for x in m.rows}
        ev_un, risk_un = _not_measured(rows, [x for x in group_rows if x not in seen], f"pads at {pick}")
        also = [f"{v} saves {res[v]['net']:,.1f} µs/step" if res[v]["net"] > 0 else
                f"{v} is {-res[v]['net']:,.1f} µs/step slower" for v in values if v != pick]
        risk = list(dict.fromkeys(
            _numerics_risk(m.g, f"{w.dim}={pick}") + f"; {w.dim} grows by {pick - old} (more work and "
            "memory; slice the result back)" for m, w, _, _ in r["done"]))
        mult = r["done"][0][1].multiple or 1
        items.append(AdviceItem(
            "pad", f"pad {'the vocabulary ' if vocab else ''}{old} → {pick} (a multiple of {mult}){in_mod}", module,
            r["net"], "; ".join(e for *_, e in r["done"]) + (f"; also measured: {', '.join(also)}" if also else "")
            + (f"; {ev_un}" if ev_un else ""),
            "; ".join(risk) + (f"; {risk_un}" if risk_un else ""), [m.label for m, *_ in r["done"]],
            frozenset().union(*(m.ids for m in members)) | frozenset(("row", x) for x in group_rows),
            frozenset(m.i for m, _, d, _ in r["done"] if d > 0), change={"from": int(old), "to": int(pick)}))
    return items, quiet


GROUPED_WORDS = {
    "balanced": "balance the router's load over the {groups} experts{in_mod} (advice for the router, not the GEMM)",
    "mm_per_group": "run the experts{in_mod} one GEMM per expert (transformers: config._experts_implementation = "
                    "\"eager\")",
    "bmm_padded": "run the experts{in_mod} as one torch.bmm, every expert padded to the largest group",
    "batched_mm": "run the experts{in_mod} with transformers' config._experts_implementation = \"batched_mm\" "
                  "(each row's expert weights gathered, one bmm)",
    "fp8": "run the expert GEMMs{in_mod} in fp8 (torch._scaled_grouped_mm, row-wise scales)",
}
GROUPED_RISK = {
    "balanced": "a router change (auxiliary load-balancing loss, capacity): which tokens each expert sees changes, "
                "hence the model's quality; measured as the same rows split evenly",
    "mm_per_group": "a Python loop over the experts: one launch per expert hit, index kernels to gather and "
                    "scatter its rows and a host synchronisation to find them, all outside the GEMM time measured "
                    "here and able to outweigh it",
    "bmm_padded": "a custom experts forward (none of transformers' implementations); its time follows the largest "
                  "group: a more skewed routing makes it slower; the saving is the GEMMs' alone: the padding rows "
                  "also pass through the layer's other ops (gather, activation, routing weights) and sizing the "
                  "batch to the largest group needs a host synchronisation per call, neither measured here",
    "batched_mm": "memory: the gathered weights (rows x n x k) are made every call",
    "fp8": "the expert weights quantized to fp8 and the activations per row each call (the quantization's own "
           "time not measured: quantizing the weights every step, as training does, can outweigh the saving); "
           "model accuracy must be checked",
}


# Variants whose GEMMs' saving is the change's own: balancing the router keeps the layer's code and its rows (the
# same ops over rows split otherwise). Every other grouped variant restructures the layer (padding the groups, one
# bmm, fp8 with its quantization, another experts implementation): without the whole call measured it is an
# estimate, never a ranked saving.
GEMM_ONLY_RANKS = frozenset({"balanced"})
ESTIMATE_NEEDS = ("the layer's whole call{in_mod} with the change (its gathers, padding, quantization, host "
                  "synchronisations and other ops, forward and backward in training): `audit --measure` rebuilds "
                  "it when the module's gate+up and down grouped GEMMs are both among the measured "
                  "(--top-measure), or an A/B of the program's own step")


# what each variant brings besides its GEMMs, when the experts' whole forward was measured with it
WHOLE_RISK = {
    "balanced": "a router change (auxiliary load-balancing loss, capacity): which tokens each expert sees changes, "
                "hence the model's quality; measured as the experts' call with the same rows split evenly, the "
                "router's own change not",
    "mm_per_group": "transformers' eager loop: one launch set per expert hit and a host synchronisation per expert, "
                    "all in the time measured",
    "bmm_padded": "a custom experts forward (none of transformers' implementations); its time follows the largest "
                  "group (a more skewed routing makes it slower); the padding rows through the gather, gate and "
                  "weighting and the host synchronisation that sizes the batch are in the time measured",
    "batched_mm": "memory: the gathered weights (rows x n x k) are made every call, in the time measured",
    "fp8": "the expert weights quantized to fp8 {when} and the activations per row each call, in eager torch, "
           "in the time measured; model accuracy must be checked",
}


def _whole_numerics(ex: ExpertsMeasurement, name: str) -> str:
    if name == "balanced":
        return "numerics not compared (another routing)"
    x = ex.numerics.get(name)
    tol = ex.tolerance_fp8 if name == "fp8" else ex.tolerance
    if x is None:
        return "numerics not compared"
    if tol is not None and x > tol:
        return f"numerics of the experts' output differ: max rel. error {x:.2g} > tolerance {tol:.2g}"
    return f"numerics of the experts' output agree (max rel. error {x:.2g}" + (f" ≤ {tol:.2g})" if tol else ")")


def _grouped_numerics(done: list, name: str) -> str:
    """One line for the numerics of variant `name` over the GEMMs measured with it (the worst of them)."""
    got = [(m.g.numerics.get(name), m.g.tolerance_fp8 if name == "fp8" else m.g.tolerance) for m, *_ in done]
    if any(x is None for x, _ in got):
        return "numerics not compared" + ("" if name == "balanced" else " for every GEMM")
    worst, tol = max(got, key=lambda xt: xt[0])
    if tol is not None and any(t is not None and x > t for x, t in got):
        return f"numerics differ: max rel. error {worst:.2g} > tolerance {tol:.2g}"
    return f"numerics agree (max rel. error {worst:.2g}" + (f" ≤ {tol:.2g})" if tol is not None else ")")


def _grouped_items(rows: pd.DataFrame, ms: list[_Measured], experts: list[ExpertsMeasurement] | None = None
                   ) -> tuple[list[AdviceItem], list[AdviceItem]]:
    """Advice for grouped GEMMs (`measure.measure_grouped`). The experts of one module share their routing:
    padding the groups, balancing the router, another experts implementation or fp8 changes every grouped
    GEMM of the module with those groups, so each variant nets the GEMMs measured with it, with their sign,
    and names the module's grouped GEMMs it changes that were not (a weight gradient's; a layout fp8 is not
    measured in). Where the module's experts were also measured whole (`measure.measure_experts`, in
    `experts`: the gathers, padding, host synchronisations and GEMMs of one call, forward and backward in
    training), a variant's saving is that call's, × its calls per step, and the GEMMs' net is evidence: a
    variant whose GEMMs pay but whose whole call does not gets a quiet line, not advice. A variant is advised
    when its saving beats the original's time (the call's, or the GEMMs') by `MIN_GAIN`; of the paddings, the
    smallest multiple within `MIN_GAIN` of the best (a quiet line when none pays). Every item changes the same
    GEMMs: they exclude each other. Items resting on sizes that were assumed say so."""
    items, quiet = [], []
    for (module, _), members in _grouped_modules(ms).items():
        items_m, quiet_m = _module_grouped_items(rows, members, module, experts)
        items += items_m
        quiet += quiet_m
    return items, quiet


def _grouped_modules(ms: list[_Measured]) -> dict[tuple, list[_Measured]]:
    """The measured grouped GEMMs of `ms` by (module, groups), in measurement order: the GEMMs of one module
    with one group count share their routing, so a variant changes them together; a GEMM of no module stands
    alone (keyed by its index)."""
    by_mod: dict[tuple, list[_Measured]] = {}
    for m in ms:
        if m.g.grouped:
            gk = (m.module, m.g.key.get("groups")) if m.module else (None, m.i)
            by_mod.setdefault(gk, []).append(m)
    return by_mod


def _module_grouped_items(rows: pd.DataFrame, members: list[_Measured], module,
                          experts: list[ExpertsMeasurement] | None
                          ) -> tuple[list[AdviceItem], list[AdviceItem]]:
    """`_grouped_items` for the grouped GEMMs `members` of one module (None: one GEMM of no module): the items
    and quiet lines of the whole call (`_whole_items`) where `experts` measured it, else of the GEMMs' own
    nets. The module's rows that a variant changes are its audit rows with the same groups and the members'."""
    groups = members[0].g.key.get("groups")
    in_mod = f" in {module}" if module else f" of {members[0].label}"
    mod_rows = {int(i) for i, r in zip(rows.index, rows.to_dict("records"))
                if module and not _na(r["module"]) and r["module"] == module and not _na(r["groups"])
                and int(r["groups"]) == int(groups or 0)} | {r for m in members for r in m.rows}
    assumed = any(m.g.sizes_source == "assumed" for m in members)
    tag = " [group sizes assumed equal: none recorded]" if assumed else ""
    touches = frozenset().union(*(m.ids for m in members)) | frozenset(("row", r) for r in mod_rows)
    names = list(dict.fromkeys(v.variant for m in members for v in m.g.grouped if v.variant != "original"))
    res = {n: _grouped_net(members, module, n) for n in names}
    ex = next((e for e in experts or [] if e.module == module and e.groups == groups and e.times()[0]), None)
    if ex is not None:
        return _whole_items(rows, ex, res, members, module, groups, in_mod, tag, touches, mod_rows)
    pays, quiet = _paying_variants(names, res, module, in_mod, tag)
    pads = [n for n in names if n.startswith("pad")]
    items = [_grouped_item(rows, name, res, pads, module, groups, in_mod, tag, touches, mod_rows)
             for name in pays]
    if not pays:
        quiet.append(_quiet(f"grouped GEMMs{in_mod}: no alternative beats the original by 3 % over the "
                            f"{len(members)} measured; no advice{tag}", "no_gain", module,
                            gemms=[m.label for m in members]))
    return items, quiet


def _grouped_net(members: list[_Measured], module, name: str) -> dict:
    """Variant `name` over the grouped GEMMs `members`: ``done`` (each GEMM measured with it: the GEMM, the
    variant, its saving per step and its evidence), ``net`` (the savings' sum, with their sign) and ``ok``
    (the net beats the GEMMs' original time per step by `MIN_GAIN`). A GEMM of no module names itself."""
    done = [(m, v, *m.change(name, v.time_us, v.kernel_short, named=module is None))
            for m in members for v in [m.g.variant(name)] if v]
    base = sum(m.orig * m.calls for m, *_ in done)
    net = sum(d for *_, d, _ in done)
    return {"done": done, "net": net, "ok": bool(done) and net > MIN_GAIN * base}


def _paying_variants(names: list[str], res: dict, module, in_mod: str, tag: str
                     ) -> tuple[list[str], list[AdviceItem]]:
    """The variants of `names` whose net (`res`, `_grouped_net`) pays, in order; of the paddings only the
    smallest multiple within `MIN_GAIN` of the best, since they exclude each other. With paddings measured and
    none paying, a quiet line giving each multiple's net."""
    pays = [n for n in names if res[n]["ok"]]
    pads = [n for n in names if n.startswith("pad")]
    ok_pads = [n for n in pads if n in pays]
    quiet = []
    if ok_pads:
        best = max(res[n]["net"] for n in ok_pads)
        keep = min((n for n in ok_pads if res[n]["net"] >= best * (1 - MIN_GAIN)), key=lambda n: int(n[3:]))
        pays = [n for n in pays if not n.startswith("pad") or n == keep]
    elif pads:
        shown = ", ".join(f"×{n[3:]} {res[n]['net']:+,.1f}" for n in pads if res[n]["done"])
        quiet.append(_quiet(f"pad each expert's token count{in_mod}: no net saving (µs/step saved per multiple: "
                            f"{shown}); no advice{tag}", "no_gain", module))
    return pays, quiet


def _grouped_item(rows: pd.DataFrame, name: str, res: dict, pads: list[str], module, groups, in_mod: str,
                  tag: str, touches: frozenset, mod_rows: set) -> AdviceItem:
    """The advice item of paying variant `name` of one module's grouped GEMMs: its net saving, the GEMMs'
    evidence, the module's rows it changes that were not measured (`mod_rows` less the measured), and the
    risk: the padding's extra rows (`_pad_words`), or the variant's words (`GROUPED_WORDS`, `GROUPED_RISK`)."""
    done, net = res[name]["done"], res[name]["net"]
    seen = {r for m, *_ in done for r in m.rows}
    ev_un, risk_un = _not_measured(rows, sorted(mod_rows - seen), "changes")
    if name.startswith("pad"):
        what, risk, also = _pad_words(name, done, res, pads, in_mod)
    else:
        what = GROUPED_WORDS.get(name, "{name}{in_mod}").format(groups=groups, in_mod=in_mod, name=name)
        risk, also = GROUPED_RISK.get(name, ""), []
        if name == "bmm_padded":
            risk += f"; {done[0][1].rows - done[0][0].g.grouped[0].rows:,} padding rows per call"
    return AdviceItem(
        "grouped", what + tag, module, net,
        "; ".join(e for *_, e in done) + (f"; also measured: {', '.join(also)}" if also else "")
        + (f"; {ev_un}" if ev_un else "") + tag,
        "; ".join(x for x in (risk, _grouped_numerics(done, name), risk_un) if x),
        [m.label for m, *_ in done], touches, frozenset(m.i for m, _, d, _ in done if d > 0),
        estimate=None if name in GEMM_ONLY_RANKS else ESTIMATE_NEEDS.format(in_mod=in_mod),
        change={"variant": name, "groups": groups})


def _pad_words(name: str, done: list, res: dict, pads: list[str], in_mod: str) -> tuple[str, str, list[str]]:
    """(what, risk, also) of padding variant `name` (``padN``: each expert's token count to a multiple of N):
    the zero rows and bytes it adds to the first measured GEMM (`done`, `_grouped_net`), what the experts'
    forward must do, and the other multiples' nets (`res`) as evidence."""
    mult = int(name[3:])
    what = f"pad each expert's token count to a multiple of {mult}{in_mod}"
    m0, v0 = done[0][0], done[0][1]
    rows0 = m0.g.grouped[0].rows
    extra = v0.rows - rows0
    k0 = m0.g.key
    mib = extra * ((k0.get("k") or 0) + (k0.get("n") or 0)) * 2 / 2**20
    risk = (f"{extra:,} zero rows per call ({100 * extra / max(1, rows0):.1f} % more rows: about "
            f"{mib:,.1f} MiB more input and output in {m0.label}); the experts' forward must place each "
            f"expert's rows at a multiple of {mult} (offsets of the padded sizes) and drop the zero rows "
            "after); the saving is the GEMMs' alone: the zero rows also pass through the layer's other "
            "ops (activation, routing weights), not measured here")
    also = [f"×{n[3:]} {'saves' if res[n]['net'] > 0 else 'costs'} {abs(res[n]['net']):,.1f} µs/step"
            for n in pads if n != name and res[n]["done"]]
    return what, risk, also


def _whole_items(rows, ex: dict, res: dict, members: list[_Measured], module, groups, in_mod: str, tag: str,
                 touches: frozenset, mod_rows: set) -> tuple[list[AdviceItem], list[AdviceItem]]:
    """`_grouped_items` for a module whose experts were measured whole (`ex`): items saved per step by the
    whole call, the GEMMs' net (`res`) as evidence; quiet lines for the variants whose GEMMs pay and whose
    call does not, or for none paying."""
    base, t = ex.times()
    # calls per step from the run: the module's forward grouped rows (one per experts call), never the file's
    fwd = [float(rows.loc[r, "calls"]) for r in sorted(mod_rows) if rows.loc[r, "pass"] == "fwd"
           and not _na(rows.loc[r, "calls"])]
    calls = max(fwd) if fwd else max(m.calls for m in members)
    scope = ex.scope or "forward"
    prob = ex.problem
    net = {n: (base - x) * calls for n, x in t.items() if n != "original"}
    pays = [n for n in net if net[n] > MIN_GAIN * base * calls]
    pads = [n for n in net if n.startswith("pad")]
    ok_pads = [n for n in pads if n in pays]
    if ok_pads:
        best = max(net[n] for n in ok_pads)
        keep = min((n for n in ok_pads if net[n] >= best * (1 - MIN_GAIN)), key=lambda n: int(n[3:]))
        pays = [n for n in pays if not n.startswith("pad") or n == keep]
    tokens = prob.get("tokens")
    how = (f"the experts' whole {scope}{in_mod} rebuilt ({prob.get('experts')} experts, "
           f"{f'{tokens:,}' if isinstance(tokens, int) else '?'} tokens × top-{prob.get('top_k')} "
           f"[top-k {prob.get('top_k_source')}], the {ex.sizes_source} "
           f"sizes) and timed as one call of the program: gathers, padding, host synchronisations and GEMMs")
    not_meas = ("not measured: the rest of the step and how much of this call's launch time the GPU hides "
                "behind other work (the call was timed alone, from a synchronised start)")
    items, quiet = [], []
    for name in sorted(pays, key=lambda n: -net[n]):
        gm = res.get(name)
        gemm_ev = (f"; its grouped GEMMs alone: {gm['net']:+,.1f} µs/step (" + "; ".join(e for *_, e in gm["done"])
                   + ")") if gm and gm["done"] else ""
        if name.startswith("pad"):
            mult = int(name[3:])
            what = f"pad each expert's token count to a multiple of {mult}{in_mod}"
            mv = next(((m, v) for m in members for v in [m.g.variant(name)] if v), None)
            extra = (mv[1].rows - mv[0].g.grouped[0].rows) if mv else None
            risk = ((f"{extra:,} zero rows per call; " if extra else "") + "the experts' forward must place each "
                    f"expert's rows at a multiple of {mult} (offsets of the padded sizes) and gather the real rows "
                    "back; the zero rows through the gate and the GEMMs are in the time measured")
            also = [f"×{n[3:]} {'saves' if net[n] > 0 else 'costs'} {abs(net[n]):,.1f} µs/step" for n in pads
                    if n != name]
        else:
            what = GROUPED_WORDS.get(name, "{name}{in_mod}").format(groups=groups, in_mod=in_mod, name=name)
            risk = WHOLE_RISK.get(name, "").format(
                when="every call (training: the weights change every step)" if scope != "forward" else "once")
            also = []
        items.append(AdviceItem(
            "grouped", what + tag, module, net[name],
            f"{how}: original {base:.1f} µs, {name} {t[name]:.1f} µs per call × {calls:g} calls/step" + gemm_ev
            + (f"; also measured: {', '.join(also)}" if also else "") + tag,
            "; ".join(x for x in (risk, _whole_numerics(ex, name), not_meas) if x),
            [m.label for m in members], touches,
            frozenset(m.i for m in members if gm and any(mm is m and d > 0 for mm, _, d, _ in gm["done"])),
            change={"variant": name, "groups": groups}))
    for name, gm in res.items():
        if name in pays or not gm["ok"] or name not in net:
            continue
        what = (f"pad each expert's token count to a multiple of {name[3:]}{in_mod}" if name.startswith("pad")
                else GROUPED_WORDS.get(name, "{name}{in_mod}").format(groups=groups, in_mod=in_mod, name=name))
        quiet.append(_quiet(
            f"{what}: its grouped GEMMs save {gm['net']:,.1f} µs/step, but the experts' whole {scope} "
            + (f"is {-net[name]:,.1f} µs/step slower" if net[name] < 0 else f"saves only {net[name]:,.1f} µs/step")
            + f" (original {base:.1f} µs, {name} {t[name]:.1f} µs per call): no advice{tag}", "no_gain", module,
            how, [m.label for m in members]))
    if not pays:
        shown = ", ".join(f"{n} {net[n]:+,.1f}" for n in net)
        quiet.append(_quiet(f"the experts{in_mod}: no variant of their whole {scope} beats the original by 3 % "
                            f"(µs/step saved: {shown}); no advice{tag}", "no_gain", module, how,
                            [m.label for m in members]))
    return items, quiet


def advice(rows: pd.DataFrame, measure: Measurement | dict, step_gpu_us: float | None = None,
           trace_gpu_us: float | None = None) -> list[dict]:
    """Ranked advice from saved measurements (`measure.measure_gemms`' result) against the audit rows.

    Each item (keys `ADVICE_KEYS`): ``what`` to change, ``kind`` (pad | path | workspace | pin | grouped; quiet:
    at_floor | no_gain | not_measured), ``module``, ``saving_us`` per step (per-call change × calls per step,
    netted over every measured GEMM the change moves), ``saving_pct`` of the step's GPU time, ``evidence``
    (the numbers, and the GEMMs it changes that were not measured), ``risk`` (numerics, memory, what was not
    measured), the ``gemms`` measured, the pinned log line to ``replay``, and the numbers of the items it
    ``excludes`` (they change one of its GEMMs or set its switch the other way: their savings do not add), and
    the ``estimate``: what would have to be measured, for an item whose saving is its GEMMs' alone while the
    change restructures a layer (`ESTIMATE_NEEDS`; None for a ranked item).
    Ranked items come first, largest saving first; then the estimates (not ranked; largest GEMM saving first);
    then the GEMMs with no advice (near their floor, or faster alone with a change that does not pay over every
    GEMM it moves) and those not measured. Every value read is checked first (a dict by `measured.check_measure`,
    no time longer than `trace_gpu_us`, the audited steps' GPU time, when given; a `Measurement` is checked
    already), calls per step come from the run's rows, and no item saves more than the step's GPU time."""
    measure = check_measure(measure, limit_us=trace_gpu_us)[0]
    step = step_gpu_us or (float(rows["gpu_us"].sum() / rows["share"].sum()) if len(rows) and rows["share"].sum()
                           else None)
    ms, not_measured = _measured_gemms(rows, measure)
    switch, switch_quiet = _switch_items(rows, ms)
    pads, pad_quiet = _pad_items(rows, ms)
    grouped, grouped_quiet = _grouped_items(rows, ms, measure.experts)
    found = _pin_items(ms) + switch + pads + grouped
    for x in found:
        if step and x.saving_us > step:
            x.evidence += f"; capped at the step's GPU time ({x.saving_us:,.1f} µs/step computed, {step:,.1f} in all)"
            x.saving_us = step
    items = sorted([x for x in found if x.estimate is None], key=lambda x: -x.saving_us)
    estimates = sorted([x for x in found if x.estimate is not None], key=lambda x: -x.saving_us)
    for a, x in enumerate(items):
        x.excludes = [b + 1 for b, y in enumerate(items) if b != a and x.clashes(y)]
    helped = {i for x in items + estimates for i in x.helped}
    quiet: list[AdviceItem] = []
    for m in ms:
        if m.i in helped:
            continue
        floor = pd.Series([rows.loc[r, "floor_us"] for r in m.rows], dtype="float64").dropna()
        # the row's own floor_ratio (the run's time over its floor), the figure the table prints
        ran = pd.Series([rows.loc[r, "floor_ratio"] for r in m.rows], dtype="float64").dropna()
        ratio = float(ran.iloc[0]) if len(ran) else (
            m.orig / float(floor.iloc[0]) if len(floor) and float(floor.iloc[0]) > 0 else None)
        key = m.g.key
        alone = [f"{p.path} {p.time_us:.1f} µs" for p in m.g.paths if p.time_us and
                 p.time_us < m.orig * (1 - MIN_GAIN)] + [
            f"{w.dim}={w.value} {w.time_us:.1f} µs" for w in m.g.whatifs if w.time_us
            and w.time_us < m.orig * (1 - MIN_GAIN) and key.get(w.dim) is not None]
        at = (f"at {figure('floor_ratio', ratio)}× its floor ({100 / ratio:.0f} % of the roofline)" if ratio
              is not None
              else "floor unknown")
        if alone:
            why = (f"{at}; faster alone ({', '.join(alone)}), but that change does not pay over every GEMM it "
                   "moves")
        elif ratio is not None and ratio <= NEAR_FLOOR:
            why = f"within {100 * (ratio - 1):.0f} % of its floor"
        else:
            why = f"{at}; no measured alternative beats it by 3 %"
        quiet.append(_quiet(f"{m.label}{m.where}: {why}; no advice",
                            "at_floor" if ratio and ratio <= NEAR_FLOOR and not alone else "no_gain", m.module,
                            f"original {m.orig:.1f} µs" + (f", floor {float(floor.iloc[0]):.1f} µs" if len(floor)
                                                           else ""), [m.label]))
    quiet = not_measured + quiet
    return [x.as_dict(step) for x in items + estimates] + [q.as_dict(step) for q in quiet + switch_quiet
                                                           + pad_quiet + grouped_quiet]


def ranked(items: list[dict]) -> list[dict]:
    """The ranked items of `advice`: a saving, no estimate, and not proven slower or within noise in the
    program's step (``disproven``: `analysis.proof.apply`)."""
    return [x for x in items if x["saving_us"] > 0 and not x.get("estimate") and not x.get("disproven")]


def disproven(items: list[dict]) -> list[dict]:
    """The items a proof found slower or within noise in the program's step (`analysis.proof.apply`)."""
    return [x for x in items if x["saving_us"] > 0 and x.get("disproven")]


def estimates(items: list[dict]) -> list[dict]:
    """The estimates of `advice` (not ranked): a GEMM saving of a change that restructures a layer."""
    return [x for x in items if x["saving_us"] > 0 and x.get("estimate") and not x.get("disproven")]


def advice_total(items: list[dict]) -> tuple[list[int], float, float | None]:
    """The items that add up: in rank order, each item that excludes none taken before it. Returns their
    numbers, their summed saving per step and its share of the step (%)."""
    take: list[int] = []
    us, pct = 0.0, 0.0
    for n, it in enumerate(ranked(items), 1):
        if not set(it.get("excludes") or []) & set(take):
            take.append(n)
            us += it["saving_us"]
            pct = None if pct is None or it.get("saving_pct") is None else pct + it["saving_pct"]
    return take, us, pct
