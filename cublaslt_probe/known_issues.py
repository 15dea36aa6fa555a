"""Known cuBLAS/cuBLASLt wrong-result bugs from NVIDIA's release notes, matched against one algo config.

One table (`ISSUES`): per bug, its id, the affected cuBLAS versions (introduced, fixed), compute capabilities,
algo ids, and a condition on the config and the shape. `match(config, cublas=..., cc=...)` returns the issues a
config meets or can meet; a config that cannot meet an issue's conditions (another algo, the fixed version,
another compute capability, a shape outside the rule) is never flagged.

A config is a plain dict with any of: algo_id, split_k (the logged numSplitsK), stages (the logged stages id,
`64xAUTO` or `MATMUL_STAGES_64xAUTO`), kernel (the kernel name it launched), k (cuBLAS's K), dtype (the probe's
dtype name), grouped (a grouped GEMM), pointer_mode ("host" / "device"), waves. A field the bug's rule reads
that is absent is *unknown*: the verdict is then "can meet" (with the unknowns named), never "meets".

Stage size: cuBLASLt's stages ids are `<stage size>x<stage count>` (cublasLt.h: `CUBLASLT_MATMUL_STAGES_16x1`,
"stage size is 16, number of stages is 1"; `64xAUTO`: size 64, the count chosen by the library); an nvjet
kernel name carries the same `<K tile>x<stages>` pair (`nvjet_tst_64x8_64x16_...`: K tile 64). A stages id
without a size (`UNDEFINED`, `AUTO`) and no nvjet kernel name leave the stage size unknown.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

MEETS, CAN_MEET = "meets", "can meet"


@dataclass(frozen=True)
class KnownIssue:
    """One release-note bug. `rule(config)` returns (holds, unknowns): holds False when the config cannot meet
    the condition; otherwise the names of the fields it could not read (empty when it certainly holds)."""
    bug_id: str
    summary: str
    introduced: str           # first affected cuBLAS version
    fixed: str                # first cuBLAS version with the fix
    cc: tuple[str, ...]       # "9.0" exact, "10.x" any minor
    algo_ids: tuple[int, ...] | None
    rule: Callable[[dict], tuple[bool, tuple[str, ...]]]
    condition: str            # the rule in words
    source: str


def version_tuple(v: str) -> tuple[int, ...]:
    """'13.1.0.3' -> (13, 1, 0, 3); 130100 (cublasLtGetVersion) -> (13, 1, 0). Raises ValueError on other text."""
    s = str(v).strip().lstrip("v")
    if s.isdigit() and len(s) >= 5:
        n = int(s)
        return (n // 10000, (n // 100) % 100, n % 100)
    parts = s.split(".")
    if not all(p.isdigit() for p in parts) or not parts:
        raise ValueError(f"cuBLAS version {v!r}: give it as MAJOR.MINOR.PATCH[.BUILD], e.g. 13.1.0.3")
    return tuple(int(p) for p in parts)


def _before(v: tuple[int, ...], bound: tuple[int, ...]) -> bool | None:
    """v < bound, or None when v is a shorter prefix of bound's (13.8.0 against 13.8.0.4: either side)."""
    n = len(v)
    if n < len(bound) and v == bound[:n]:
        return None
    width = max(n, len(bound))
    return v + (0,) * (width - n) < bound + (0,) * (width - len(bound))


def version_affected(cublas: str | None, introduced: str, fixed: str) -> bool | None:
    """True / False whether cuBLAS `cublas` lies in [introduced, fixed); None when it cannot be told."""
    if cublas is None:
        return None
    v = version_tuple(cublas)
    below_fix = _before(v, version_tuple(fixed))
    below_intro = _before(v, version_tuple(introduced))
    if below_fix is False or below_intro is True:
        return False
    if below_fix is None or below_intro is None:
        return None
    return True


def cc_affected(cc: str | None, listed: tuple[str, ...]) -> bool | None:
    """Whether compute capability 'X.Y' is one of `listed` ('9.0', '10.x'); None when cc is None."""
    if cc is None:
        return None
    m = re.fullmatch(r"\s*(\d+)\.(\d+)\s*", str(cc))
    if not m:
        raise ValueError(f"compute capability {cc!r}: give it as X.Y, e.g. 9.0")
    major, minor = m.groups()
    return any(c in (f"{major}.{minor}", f"{major}.x") for c in listed)


_STAGES_RE = re.compile(r"^(?:MATMUL_STAGES_)?(\d+)x(?:\d+|AUTO)$")
_NVJET_KT_RE = re.compile(r"^nvjet_(?:sm\d+a?_)?[a-z]+_\d+x\d+_(\d+)x\d+_")


def stage_size(stages: str | None, kernel: str | None = None) -> int | None:
    """The stage size (elements of K per stage) from a stages id (`64xAUTO`), else from an nvjet Hopper-style
    kernel name's K tile; None when neither says it (module doc)."""
    if stages:
        m = _STAGES_RE.match(str(stages).strip())
        if m:
            return int(m.group(1))
    if kernel:
        m = _NVJET_KT_RE.match(kernel)
        if m:
            return int(m.group(1))
    return None


def _splitk_tail_rule(cfg: dict) -> tuple[bool, tuple[str, ...]]:
    """Bug 6580689: split-K with SPLITK_NUM not dividing K and floor(K / SPLITK_NUM) a multiple of the stage
    size."""
    s = cfg.get("split_k")
    if s is not None and int(s) <= 1:
        return False, ()
    k = cfg.get("k")
    size = stage_size(cfg.get("stages"), cfg.get("kernel"))
    unknown = [name for name, v in (("split_k", s), ("k", k), ("stage size", size)) if v is None]
    if s is not None and k is not None:
        s, k = int(s), int(k)
        if k % s == 0:
            return False, ()
        if size is not None and (k // s) % size != 0:
            return False, ()
    return True, tuple(unknown)


def _grouped_host_pointer_rule(cfg: dict) -> tuple[bool, tuple[str, ...]]:
    """Grouped GEMM in host pointer mode, BF16/FP16/FP8, more than 2 waves."""
    unknown = []
    for name, ok in (("grouped", lambda v: bool(v)), ("pointer_mode", lambda v: str(v).lower() == "host"),
                     ("dtype", lambda v: str(v) in ("bf16", "fp16") or str(v).startswith("fp8")),
                     ("waves", lambda v: float(v) > 2)):
        v = cfg.get(name)
        if v is None:
            unknown.append(name)
        elif not ok(v):
            return False, ()
    return True, tuple(unknown)


ISSUES: tuple[KnownIssue, ...] = (
    KnownIssue(
        bug_id="6580689",
        summary="cublasLtMatmul can return incorrect output with split-K",
        introduced="12.6.3", fixed="13.8.0.4", cc=("9.0", "10.x", "11.x"), algo_ids=(66,),
        rule=_splitk_tail_rule,
        condition="algo 66 with SPLITK_NUM not dividing K and floor(K / SPLITK_NUM) a multiple of the stage size",
        source="CUDA 13.4 Update 1 release notes, cuBLAS resolved issues"),
    KnownIssue(
        bug_id="grouped-host-pointer",
        summary="cuBLASLt grouped GEMM can return wrong results in host pointer mode beyond 2 waves",
        introduced="13.4.0", fixed="13.8.0.4", cc=("9.0",), algo_ids=None,
        rule=_grouped_host_pointer_rule,
        condition="grouped GEMM, BF16/FP16/FP8, host pointer mode, more than 2 waves (the notes give no bug id)",
        source="CUDA 13.4 Update 1 release notes, cuBLAS resolved issues"),
)


@dataclass(frozen=True)
class Match:
    """An issue a config meets (`verdict` MEETS) or can meet (CAN_MEET, `unknown` naming what is not known)."""
    issue: KnownIssue
    verdict: str
    unknown: tuple[str, ...]

    def text(self) -> str:
        """One line: the bug, the verdict, what is unknown, the fixing version."""
        i = self.issue
        head = f"cuBLAS bug {i.bug_id}" if i.bug_id[0].isdigit() else f"cuBLAS issue ({i.bug_id})"
        state = "meets its conditions" if self.verdict == MEETS else \
            f"can meet its conditions ({', '.join(self.unknown)} unknown)"
        return f"{head}: {i.summary}; this config {state}: {i.condition}; fixed in cuBLAS {i.fixed}"


def match(cfg: dict, *, cublas: str | None = None, cc: str | None = None,
          issues: tuple[KnownIssue, ...] = ISSUES) -> list[Match]:
    """The issues config `cfg` meets or can meet on cuBLAS `cublas` and compute capability `cc` (None: not
    known, named among the unknowns). Raises ValueError on a malformed version or cc."""
    out = []
    for i in issues:
        algo = cfg.get("algo_id")
        unknown: list[str] = []
        if i.algo_ids is not None:
            if algo is None:
                unknown.append("algo id")
            elif int(algo) not in i.algo_ids:
                continue
        v = version_affected(cublas, i.introduced, i.fixed)
        if v is False:
            continue
        if v is None:
            unknown.append("cuBLAS version")
        c = cc_affected(cc, i.cc)
        if c is False:
            continue
        if c is None:
            unknown.append("compute capability")
        holds, more = i.rule(cfg)
        if not holds:
            continue
        unknown += more
        out.append(Match(i, CAN_MEET if unknown else MEETS, tuple(unknown)))
    return out


def label(cfg: dict, *, cublas: str | None = None, cc: str | None = None) -> str | None:
    """The `known_issue` column's value: the matches' texts joined by ' | ', None when none."""
    ms = match(cfg, cublas=cublas, cc=cc)
    return " | ".join(m.text() for m in ms) or None
