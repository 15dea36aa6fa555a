"""A saved measurement (`audit --measure`) as types: what `gpu.measure.measure_gemms` writes and the advice, the
binding and the page read. CPU only.

The file is JSON: ``schema_version`` (`SCHEMA_VERSION`; a file without one is read as the version its keys say:
``schema`` 2 for the files stamped with a fingerprint before the version had its name, 1 before fingerprints),
``env``, ``fingerprint``, ``gemms`` (one record per measured GEMM) and ``experts`` (one per experts module
rebuilt whole). `Measurement.from_checked` builds the types from a document `measured.check_measure` has checked
(every value the readers use is of its type, or absent); the saved record stays beside each type (``raw``: what
a binding keeps and TunableOp's writer reads). The values a page shows and the rules would otherwise
recompute when drawing are computed here, once: a GEMM's ``label``, a candidate's ``algo_text``, each
alternative's ``kernel_label`` (its decoded label), ``kernel_short`` and ``main_short``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

from cublaslt_probe.analysis.audit.plan import GRAPH_TIMING
from cublaslt_probe.errors import ProbeError

SCHEMA_VERSION = 3      # 1: no fingerprint; 2: ``fingerprint`` (written as ``schema``); 3: ``schema_version``


def schema_version(doc: dict) -> int:
    """The version of saved measurement `doc`: its ``schema_version``, else its older ``schema``, else 1. A
    ProbeError when it is newer than this tool reads (one line: upgrade)."""
    v = doc.get("schema_version", doc.get("schema", 1))
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        v = 1
    if v > SCHEMA_VERSION:
        raise ProbeError(f"measurement schema version {v}: this tool reads up to {SCHEMA_VERSION}: upgrade "
                         "cublaslt-probe")
    return v


def _label(key: dict) -> str:
    return (f"{key.get('op')} {key.get('dtype')} {key.get('layout')} {key.get('m')}×{key.get('n')}×{key.get('k')}"
            + (f" ×{key['batch']}" if (key.get("batch") or 1) > 1 else ""))


def _kernel_label(name) -> str:
    """A kernel name as a page shows it: whole when short, its decoded label when it is a mangled or templated
    name of hundreds of characters (`KernelName.label`); '' for none."""
    if not isinstance(name, str) or not name:
        return ""
    from cublaslt_probe.names import decode
    return decode(name).label()


def _kernel_short(name) -> str | None:
    """A kernel as advice names it: its decoded short form (a CUTLASS template's mangled name is pages long)."""
    if not isinstance(name, str) or not name:
        return None
    from cublaslt_probe.names import decode
    return decode(name).short or name


def _main_short(kernels) -> str:
    """The GEMM's kernel among `kernels` (`evidence.main_kernel`) as a variant's table shows it: its decoded short
    form, else its first 40 characters; '' for none."""
    if not isinstance(kernels, list) or not kernels:
        return ""
    from cublaslt_probe.analysis.evidence import main_kernel
    from cublaslt_probe.names import decode
    k = main_kernel(kernels)
    return (decode(k).short or k[:40]) if k else ""


def _num(v) -> float | None:
    """A finite number as saved (an int stays an int: a page prints what the file holds), else None."""
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def _int(v) -> int | None:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def _str(v) -> str | None:
    return v if isinstance(v, str) else None


@dataclass(frozen=True)
class Timed:
    """One timed alternative of a measured GEMM: its time per call (None: not timed), the kernels it launched
    (``kernel``: the GEMM's), why it failed or was not run, its eager time where it was timed replayed from a
    graph (``eager_us``, ``graph_error``), the cuBLASLt log line of its call."""

    time_us: float | None = None
    kernel: str | None = None
    kernels: tuple[str, ...] = ()
    error: str | None = None
    not_run: str | None = None
    eager_us: float | None = None
    graph_error: str | None = None
    log_line: str | None = None
    kernel_label: str = ""          # the kernel as a page shows it (decoded label of a long name)
    kernel_short: str | None = None  # its decoded short form
    main_short: str = ""            # the GEMM's kernel among ``kernels``, short (`_main_short`)
    raw: dict = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_checked(cls, x: dict):
        own = {f.name for f in fields(cls)} - set(Timed.__dataclass_fields__)
        ks = x.get("kernels")
        return cls(time_us=_num(x.get("time_us")), kernel=_str(x.get("kernel")),
                   kernels=tuple(k for k in ks if isinstance(k, str)) if isinstance(ks, list) else (),
                   error=_str(x.get("error")), not_run=_str(x.get("not_run")), eager_us=_num(x.get("eager_us")),
                   graph_error=_str(x.get("graph_error")), log_line=_str(x.get("log_line")),
                   kernel_label=_kernel_label(x.get("kernel")), kernel_short=_kernel_short(x.get("kernel")),
                   main_short=_main_short(x.get("kernels")),
                   raw=dict(x), **{k: x.get(k) for k in own})


@dataclass(frozen=True)
class PathTime(Timed):
    """The GEMM on another of torch's paths (``path``: torch | torch-lt | lt) with its ``workspace`` (bytes)."""

    path: str | None = None
    workspace: int | None = None


@dataclass(frozen=True)
class WhatIf(Timed):
    """The GEMM with dimension ``dim`` padded to ``value`` (a multiple of ``multiple``), on its own path."""

    dim: str | None = None
    value: int | None = None
    multiple: int | None = None


CONFIG_FIELDS = ("algo_id", "tile", "stages", "cluster", "split_k", "reduction_scheme", "custom_option",
                 "cta_swizzling", "inner_shape", "workspace_bytes")   # a candidate's config, as a pin takes it


@dataclass(frozen=True)
class Candidate(Timed):
    """One of cuBLASLt's heuristic candidates (``rank`` 0: the heuristic's pick), its config and whether its
    numerics agree with candidate 0's (``ok_numerics``)."""

    rank: int | None = None
    algo_id: int | None = None
    tile: str | None = None
    stages: str | None = None
    cluster: str | None = None
    split_k: int | None = None
    reduction_scheme: str | None = None
    custom_option: int | None = None
    cta_swizzling: int | None = None
    inner_shape: str | None = None
    workspace_bytes: int | None = None
    ok_numerics: bool | None = None

    @property
    def config(self) -> dict:
        """The candidate's algo config, `CONFIG_FIELDS` (what `gpu.pin.pin_linear` takes)."""
        return {k: self.raw.get(k) for k in CONFIG_FIELDS}

    @property
    def algo_text(self) -> str:
        """The candidate as the log writes an algo: ``algo 66 tile 128x64 stages 64xAUTO cluster 1x2x1``."""
        c = self.raw
        parts = [f"algo {c['algo_id']}"] if c.get("algo_id") is not None else []
        for k in ("tile", "stages", "cluster"):
            if c.get(k):
                parts.append(f"{k} {c[k]}")
        if (c.get("split_k") or 1) > 1:
            parts.append(f"splitK {c['split_k']}")
        return " ".join(parts) or str(c.get("kernel") or "")


@dataclass(frozen=True)
class Variant(Timed):
    """A grouped GEMM's variant (rows computed, ``rows``) or a variant of an experts module's whole call
    (``reps`` timed); ``saved_us`` against the original as the GPU side computed it."""

    variant: str | None = None
    rows: int | None = None
    saved_us: float | None = None
    reps: int | None = None


def _list(cls, xs) -> list:
    return [cls.from_checked(x) for x in xs or [] if isinstance(x, dict)]


@dataclass(frozen=True)
class GemmMeasurement:
    """One measured GEMM: its problem (``key``: op, dtype, layout, m, n, k, batch, groups), the audited row's
    module, pass and path it stands for, the original's time on its path, and its alternatives: ``paths``,
    ``whatifs``, ``candidates`` (single GEMMs) or ``grouped`` (a grouped GEMM's variants, ``original`` first);
    each alternative's ``numerics`` against the original (max rel. error, by label: ``path:torch``, ``m=4096``,
    a variant's name) and the dtype's ``tolerance`` (fp8's: ``tolerance_fp8``). ``skipped`` or ``error`` when
    it was not measured. ``timing`` is ``graph`` when its times are graph-replayed (``timing_note`` says how)."""

    key: dict
    module: str | None = None
    pass_: str | None = None
    log_function: str | None = None
    case: str | None = None
    original: Timed | None = None
    original_us: float | None = None
    paths: list[PathTime] = field(default_factory=list)
    whatifs: list[WhatIf] = field(default_factory=list)
    candidates: list[Candidate] = field(default_factory=list)
    grouped: list[Variant] = field(default_factory=list)
    regret: dict | None = None
    numerics: dict = field(default_factory=dict)
    tolerance: float | None = None
    tolerance_fp8: float | None = None
    group_dim: str | None = None
    sizes_source: str | None = None
    group_summary: dict | None = None
    implementations: dict = field(default_factory=dict)
    timing: str | None = None
    skipped: str | None = None
    error: str | None = None
    raw: dict = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_checked(cls, g: dict) -> GemmMeasurement:
        orig = g.get("original")
        return cls(key=dict(g["key"]), module=_str(g.get("module")), pass_=_str(g.get("pass")),
                   log_function=_str(g.get("log_function")), case=_str(g.get("case")),
                   original=Timed.from_checked(orig) if isinstance(orig, dict) else None,
                   original_us=_num(g.get("original_us")), paths=_list(PathTime, g.get("paths")),
                   whatifs=_list(WhatIf, g.get("whatifs")), candidates=_list(Candidate, g.get("candidates")),
                   grouped=_list(Variant, g.get("grouped")), regret=g.get("regret"),
                   numerics=dict(g.get("numerics") or {}), tolerance=g.get("tolerance"),
                   tolerance_fp8=g.get("tolerance_fp8"), group_dim=_str(g.get("group_dim")),
                   sizes_source=_str(g.get("sizes_source")), group_summary=g.get("group_summary"),
                   implementations=dict(g.get("implementations") or {}), timing=_str(g.get("timing")),
                   skipped=_str(g.get("skipped")), error=_str(g.get("error")), raw=dict(g))

    @property
    def label(self) -> str:
        """The GEMM as advice and pages name it: ``aten::mm bf16 NT 8×128256×4096`` (``×B`` when batched)."""
        return _label(self.key)

    def variant(self, name: str) -> Variant | None:
        """Grouped variant `name`, when it was timed."""
        return next((v for v in self.grouped if v.variant == name and v.time_us), None)


@dataclass(frozen=True)
class ExpertsMeasurement:
    """One experts module rebuilt and timed as one whole call (`gpu.measure.measure_experts`): ``module``,
    ``groups``, ``scope`` (forward, or forward and backward), the ``problem`` rebuilt (experts, hidden, inter,
    rows, top_k, tokens, ...), the ``variants`` (time per call each), their ``numerics`` against the original's
    output and the tolerances; or ``skipped`` with the reason."""

    module: str | None = None
    groups: int | None = None
    scope: str | None = None
    problem: dict = field(default_factory=dict)
    sizes_source: str | None = None
    variants: list[Variant] = field(default_factory=list)
    numerics: dict = field(default_factory=dict)
    tolerance: float | None = None
    tolerance_fp8: float | None = None
    skipped: str | None = None
    raw: dict = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_checked(cls, e: dict) -> ExpertsMeasurement:
        return cls(module=_str(e.get("module")), groups=_int(e.get("groups")), scope=_str(e.get("scope")),
                   problem=dict(e.get("problem") or {}), sizes_source=_str(e.get("sizes_source")),
                   variants=_list(Variant, e.get("variants")), numerics=dict(e.get("numerics") or {}),
                   tolerance=e.get("tolerance"), tolerance_fp8=e.get("tolerance_fp8"),
                   skipped=_str(e.get("skipped")), raw=dict(e))

    def times(self) -> tuple[float | None, dict[str, float]]:
        """(original µs per call, {variant: µs per call}) of the variants timed."""
        t = {v.variant: float(v.time_us) for v in self.variants if v.variant and v.time_us and v.time_us > 0}
        return t.get("original"), t


@dataclass(frozen=True)
class Measurement:
    """A saved measurement, checked (`measured.check_measure`): the GEMMs measured, the experts modules timed
    whole (None: the file has no such list), the environment it was measured in and the fingerprint of the run
    it measured (None: written before fingerprints)."""

    gemms: list[GemmMeasurement]
    experts: list[ExpertsMeasurement] | None = None
    env: dict = field(default_factory=dict)
    fingerprint: dict | None = None
    schema_version: int = SCHEMA_VERSION
    raw: dict = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_checked(cls, doc: dict) -> Measurement:
        ex = doc.get("experts")
        fp = doc.get("fingerprint")
        return cls(gemms=[GemmMeasurement.from_checked(g) for g in doc.get("gemms") or []],
                   experts=[ExpertsMeasurement.from_checked(e) for e in ex] if isinstance(ex, list) else None,
                   env=dict(doc.get("env") or {}), fingerprint=fp if isinstance(fp, dict) else None,
                   schema_version=schema_version(doc), raw=dict(doc))

    def with_records(self, gemms: list[GemmMeasurement], experts: list[ExpertsMeasurement] | None
                     ) -> Measurement:
        """The same measurement holding only `gemms` and `experts` (a binding's choice)."""
        raw = {**self.raw, "gemms": [g.raw for g in gemms]}
        if experts is not None:
            raw["experts"] = [e.raw for e in experts]
        return Measurement(gemms, experts, self.env, self.fingerprint, self.schema_version, raw)

    def graph_note(self) -> str | None:
        """The line that says which measured GEMMs were timed replayed from a CUDA graph; None when none was."""
        n = sum(1 for g in self.gemms if g.timing == "graph")
        if not n:
            return None
        return f"{n} GEMM{'s' if n != 1 else ''} from CUDA graphs: times {GRAPH_TIMING}"
