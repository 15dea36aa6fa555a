"""What kind of work a kernel does and how it came to exist: the allowed values, in one place.

Every `KernelName` carries three classification fields (docs/provenance.md explains each value and the
evidence that would show it):

* ``kind``: the work: `KINDS`. A GEMM is a GEMM whichever library launched it; a cuBLAS helper that is
  part of a GEMM (split-K reduce, GEMV, the stand-alone epilogue) is ``gemm`` too, so that a step's GEMM
  time adds up.
* ``provenance``: how the kernel's code came to exist and was chosen: `PROVENANCES`.
* ``evidence``: what the two rest on: `EVIDENCE`. The decoder only reads names, so it writes ``name``;
  code that watched the process (loaded modules, NVRTC / nvJitLink calls, JIT caches) upgrades it to
  ``observed``.

Other modules import these tuples and constants instead of spelling the strings.
"""
from __future__ import annotations

# ------------------------------------------------------------------------------------------- kind
GEMM = "gemm"
ATTENTION = "attention"
ELEMENTWISE = "elementwise"
REDUCTION = "reduction"
COPY = "copy"
COMMUNICATION = "communication"
OTHER = "other"
KINDS: tuple[str, ...] = (GEMM, ATTENTION, ELEMENTWISE, REDUCTION, COPY, COMMUNICATION, OTHER)

# ------------------------------------------------------------------------------------- provenance
LIBRARY_SELECTED = "library-selected"   # precompiled kernel a library's heuristic picked (cuBLAS/cuBLASLt)
AHEAD_OF_TIME = "ahead-of-time"         # compiled into a binary / shipped as a cubin, launched directly
RUNTIME_COMPILED = "runtime-compiled"   # generated and compiled while the program runs
UNKNOWN = "unknown"
PROVENANCES: tuple[str, ...] = (LIBRARY_SELECTED, AHEAD_OF_TIME, RUNTIME_COMPILED, UNKNOWN)
AUTOTUNED = "autotuned"                 # chosen by timing candidates (XLA's autotuner): only observed, a name
                                        # cannot tell it (cold-start sets it from the autotuner's own logs)

# --------------------------------------------------------------------------------------- evidence
BY_NAME = "name"          # inferred from the kernel name's family (all the decoder can know)
OBSERVED = "observed"     # seen in what the process did (written by code that watched it)
EVIDENCE: tuple[str, ...] = (BY_NAME, OBSERVED)

# ------------------------------------------------------------------ CUTLASS 3 problem-shape kinds
SINGLE = "single"         # one GEMM (or a strided batch of equal GEMMs)
GROUPED = "grouped"       # GroupProblemShape: a list of GEMMs of different sizes (MoE experts)
PTR_ARRAY = "ptr_array"   # pointer-array batch: equal-size GEMMs whose operands are arrays of pointers
PROBLEM_SHAPES: tuple[str, ...] = (SINGLE, GROUPED, PTR_ARRAY)


def check(kind: str, provenance: str, evidence: str = BY_NAME) -> None:
    """Raise ValueError when a value is not one of the allowed ones (used where classes are built)."""
    if kind not in KINDS:
        raise ValueError(f"kind {kind!r} is not one of {KINDS}")
    if provenance not in PROVENANCES:
        raise ValueError(f"provenance {provenance!r} is not one of {PROVENANCES}")
    if evidence not in EVIDENCE:
        raise ValueError(f"evidence {evidence!r} is not one of {EVIDENCE}")
