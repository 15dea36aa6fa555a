"""Every kernel of the captured fixtures is named: no kernel of a real trace (MoE training, CUDA graphs,
reduce-overhead, scripts, compiled programs, the trace fixtures) decodes to the unknown family or an unknown
provenance, and every kernel a saved cold start observed has a provenance. The names come from the captures
themselves (tests/fixtures/*/PROVENANCE.md), read as the profiler wrote them."""
from __future__ import annotations

import gzip
import json
from collections import Counter

import pytest
from conftest import FIXTURES

from cublaslt_probe.analysis.coldstart.observed import observed_provenance
from cublaslt_probe.analysis.coldstart.saved import load
from cublaslt_probe.names import classes as C
from cublaslt_probe.names import decode

TRACE_DIRS = ("moe", "graphs", "programs", "traces", "coldstart")
_KERNEL_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def _chrome_traces():
    for d in TRACE_DIRS:
        for p in sorted((FIXTURES / d).rglob("*.json*")):
            if p.name.endswith((".json", ".json.gz")):
                with (gzip.open(p, "rt", encoding="utf-8") if p.suffix == ".gz" else open(p, encoding="utf-8")) as f:
                    doc = json.load(f)
                if isinstance(doc, dict) and "traceEvents" in doc:
                    yield p, doc


def _kernel_names() -> dict[str, Counter]:
    """Kernel name -> launches per trace file, over every Chrome trace of the fixture folders."""
    names: dict[str, Counter] = {}
    for p, doc in _chrome_traces():
        for e in doc["traceEvents"]:
            if isinstance(e, dict) and e.get("ph") == "X" and e.get("cat") in _KERNEL_CATS:
                names.setdefault(e["name"], Counter())[str(p.relative_to(FIXTURES))] += 1
    return names


NAMES = _kernel_names()
COLDSTART = sorted((FIXTURES / "coldstart").rglob("*.json.gz"))


def test_the_captures_cover_the_five_kinds_of_program():
    files = {f.split("/")[0] for c in NAMES.values() for f in c}
    assert {"moe", "graphs", "programs", "traces"} <= files
    assert len(NAMES) > 200 and len(COLDSTART) > 10


def test_no_captured_kernel_is_unknown():
    bad = []
    for name, where in NAMES.items():
        kn = decode(name)
        if kn.family == "unknown" or kn.provenance == C.UNKNOWN:
            bad.append(f"{kn.kind} {kn.provenance} {kn.family}: {name[:160]} ({', '.join(sorted(where))})")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("path", COLDSTART, ids=lambda p: p.name)
def test_every_kernel_a_cold_start_observed_has_a_provenance(path):
    for name, obs in observed_provenance(load(str(path))).items():
        assert obs["provenance"] in (*C.PROVENANCES, C.AUTOTUNED) and obs["provenance"] != C.UNKNOWN, (name, obs)


@pytest.mark.parametrize("name, family, kind, provenance, library, op", [
    ("void (anonymous namespace)::indexing_backward_kernel<c10::BFloat16, 4>(long const*, long const*, "
     "c10::BFloat16 const*, c10::BFloat16*, long, long, long, long, bool)",
     "framework", "reduction", "ahead-of-time", "torch", "indexing_backward"),
    ("void (anonymous namespace)::indexing_backward_kernel_stride_1<float>(long const*, long const*, float const*, "
     "float*, long, long, long, long, bool)",
     "framework", "reduction", "ahead-of-time", "torch", "indexing_backward_kernel_stride_1"),
    ("void scal_64addr_kernel<float, float, 1, true, 6, 5, 5, 3>(cublasTransposeParams<float>, float const*, "
     "float*, float const*)", "helper", "gemm", "library-selected", "cublas", "scal"),
])
def test_the_names_once_unknown(name, family, kind, provenance, library, op):
    kn = decode(name)
    assert (kn.family, kn.kind, kn.provenance, kn.library, kn.op) == (family, kind, provenance, library, op)
    assert kn.known and not kn.unparsed


def test_the_cublas_helper_of_the_probe_capture_is_named():
    """scal_64addr_kernel as the probe captured it (CuPy's fp32 GEMM of 4 x 128256 x 8192)."""
    kernels = [k for line in (FIXTURES / "probe" / "long_spin_raw.jsonl").read_text().splitlines()
               for k in (json.loads(line).get("kernels") or [])]
    scal = [k for k in kernels if "scal_64addr" in k]
    assert scal and all(decode(k).family == "helper" and decode(k).a_type == "fp32" for k in scal)
