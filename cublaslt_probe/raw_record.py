"""What the probe records of one GEMM (`RawRecord`): the writer's fields in the order its saved form holds them,
and the reader's one route from the saved JSON of any version (`RawRecord.from_dict`).

Pure data, no GPU. The probe (`gpu/probe.py`) starts a record from its Case (`RawRecord.of_case`), fills it one
phase at a time (the logged call, the timing, the kernels, the candidates, the heuristic) and returns it in its
saved form (`to_dict`), the line the sweep writes to a raw file; the dataset (`analysis/dataset.build_rows`)
reads it back through `from_dict`, which holds every default an older record needs; `dataset.RAW_NOT_READ`
names the fields no column reads.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields

from cublaslt_probe.cases import Case, invalid_reason, sizes_summary
from cublaslt_probe.vocab import ENV_KEYS

# The fields every raw record carries, with their types: a line without them is not a record.
REQUIRED = {"key": str, "backend": str, "op": str, "dtype": str, "layout": str, "m": int, "n": int, "k": int}
# Environment columns a reader stamps on each record from its file's env line (`dataset._stamp`); "cc" is the
# compute capability some records carry themselves.
RECORD_ENV = (*ENV_KEYS, "cc")
# The sweep runner's tag of a record's line in a raw file ({"type": "gemm", ...}): the file's, not the record's.
LINE_KIND = "type"


@dataclass
class RawRecord:
    """One GEMM's raw record. Fields in the order of the saved form; those under "set by a phase" are saved
    only once their phase has set them (`to_dict`)."""

    # identity: the Case, both views
    key: str
    backend: str
    op: str
    dtype: str
    layout: str
    m: int
    n: int
    k: int
    batch: int | None = 1
    groups: int = 0                  # grouped ops only (saved only when non-zero, with `sizes`)
    sizes: str = ""
    blas_m: int | None = None        # the column-major problem cuBLAS receives (`Case.blas`)
    blas_n: int | None = None
    blas_k: int | None = None
    blas_trans_a: str | None = None
    blas_trans_b: str | None = None
    # the evidence, always saved (empty until measured)
    kernels: list = field(default_factory=list)      # names of the kernels the GEMM launched, in launch order
    kernel_us: list = field(default_factory=list)    # their own durations (CUPTI), µs
    log_lines: list = field(default_factory=list)    # the logged call's cuBLASLt lines
    time_us: float | None = None
    time_us_reps: int | None = None
    heuristic_miss_us: float | None = None
    heuristic_hit_us: float | None = None
    lt_config: dict | None = None    # lt backend: the config of the algo it ran
    lt_waves: float | None = None
    error: str | None = None
    # set by a phase
    group_sizes: list | None = None  # a valid grouped GEMM's rows per group, and their summary
    group_summary: dict | None = None
    probe_ms: dict | None = None     # wall ms of each step of the probe for this GEMM
    time_us_min: float | None = None     # the timing (saved together, with `timing`)
    time_gap_us: float | None = None
    time_calls_per_rep: int | None = None
    time_us_first: float | None = None
    timing: dict | None = None       # the timing's evidence (`timing.Timing.evidence`) and how calls launched
    candidates: list | None = None   # the heuristic's candidates run (compact rows), or why they could not be
    candidates_error: str | None = None
    heuristic_shared: int | None = None  # the heuristic measurement: records sharing it, where it was made
    heuristic_where: str | None = None
    heuristic_error: str | None = None
    # read, never written by the probe
    env: dict = field(default_factory=dict)     # `RECORD_ENV` keys found on the record
    extra: dict = field(default_factory=dict)   # keys of other versions, kept as read

    @classmethod
    def of_case(cls, c: Case) -> RawRecord:
        """The record of Case `c` before it runs: its identity, both views, and every measurement empty. A
        grouped GEMM's also holds the rows of each group (`group_sizes`) and their summary (`group_summary`,
        `cases.sizes_summary`); its heuristic fields stay empty: torch's grouped GEMM asks cuBLASLt no
        heuristic question."""
        rec = cls(key=c.key, **c.as_dict(), **c.blas, time_us_reps=0)
        if c.grouped and invalid_reason(c) is None:
            rec.group_sizes = c.group_sizes()
            rec.group_summary = sizes_summary(rec.group_sizes)
        return rec

    @classmethod
    def from_dict(cls, d: dict) -> RawRecord:
        """The record of a saved raw line (a dict with `REQUIRED`'s keys; checked by the reader) of any version
        of the probe. The one home of what an older record lacks: batch 1; no kernels, kernel times or log
        lines; the first call's time is the median's (`time_us_first`); one call per sample when it has samples
        (`time_calls_per_rep`). The line's kind (`LINE_KIND`) is dropped; unknown keys are kept in `extra`."""
        known = {f.name for f in fields(cls)} - {"env", "extra"}
        vals = {k: v for k, v in d.items() if k in known}
        vals["batch"] = d.get("batch", 1)
        for name in ("kernels", "kernel_us", "log_lines"):
            vals[name] = list(d.get(name) or [])
        vals["time_us_first"] = d.get("time_us_first", d.get("time_us"))
        vals["time_calls_per_rep"] = d.get("time_calls_per_rep", 1 if d.get("time_us_reps") else None)
        env = {k: d[k] for k in RECORD_ENV if k in d and k not in known}
        extra = {k: v for k, v in d.items() if k not in known and k not in env and k != LINE_KIND}
        return cls(**vals, env=env, extra=extra)

    def to_dict(self) -> dict:
        """The saved form: the fields in order, a dense GEMM's without `groups` and `sizes`, each phase's fields
        only once it has set them (the timing's five together), then `env` and `extra`."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name in _ALWAYS}
        if not self.groups:
            del out["groups"], out["sizes"]
        for name in _SET_BY_PHASE:
            v = getattr(self, name)
            if name in _TIMING:
                if self.timing is not None:
                    out[name] = v
            elif v is not None:
                out[name] = v
        out.update(self.env)
        out.update(self.extra)
        return out


_NAMES = [f.name for f in fields(RawRecord)]
_ALWAYS = set(_NAMES[:_NAMES.index("group_sizes")])
_SET_BY_PHASE = _NAMES[_NAMES.index("group_sizes"):_NAMES.index("env")]
_TIMING = {"time_us_min", "time_gap_us", "time_calls_per_rep", "time_us_first", "timing"}
