"""The dtype vocabulary (dtypes.py) is the one home of every dtype spelling: each reader (trace, log, audit,
replay) names a GEMM's dtype through it, and the GPU layer's own table agrees with it.

Real data: the fp8 program's trace and cuBLASLt log (tests/fixtures/programs/fp8_linear), and mutated copies
of them whose B operand is e5m2, the way a program that quantizes weights and activations differently writes.
"""
from __future__ import annotations

import json
import re

import pytest
from conftest import FIXTURES

from cublaslt_probe import dtypes, vocab
from cublaslt_probe.analysis.audit import _log_dtype
from cublaslt_probe.analysis.trace import GEMM_OPS, iter_chrome_events, problem_of
from cublaslt_probe.gpu import lt
from cublaslt_probe.gpu.replay import problem_from_record
from cublaslt_probe.logs import parse_log

FP8 = FIXTURES / "programs" / "fp8_linear"


def _bytes_of_log_type(spelling: str) -> int:
    """Bytes per element as cuBLAS's own type name writes its width (R_16BF: 16 bits, R_8F_E4M3: 8)."""
    return int(re.match(r"R_(\d+)", spelling).group(1)) // 8


@pytest.mark.parametrize("dtype", vocab.DTYPES)
def test_each_sweep_dtype_round_trips_through_the_lt_problem_and_its_log_spelling(dtype):
    """A sweep dtype -> the lt backend's types (lt.DTYPE_SPEC) -> cuBLAS's spellings -> `log_dtype` gives
    the same dtype back, and the bytes per element are the widths those spellings write."""
    spec_dtype, b_elem = dtypes.lt_types(dtype)
    a_elem, cd, compute, _ = lt.DTYPE_SPEC[spec_dtype]
    b_elem = b_elem or a_elem
    assert cd == dtypes.output_type(dtype)
    a_log, b_log, c_log = dtypes.log_type(a_elem), dtypes.log_type(b_elem), dtypes.log_type(cd)
    assert dtypes.log_dtype(a_log, b_log, compute.removeprefix("CUBLAS_")) == dtype
    assert dtypes.element_bytes(dtype) == (_bytes_of_log_type(a_log), _bytes_of_log_type(c_log))
    assert dtype in dtypes.TORCH_NAMES


def _fp8_log_record(tmp_path, b_type: str):
    text = (FP8 / "cublaslt.log").read_text()
    lines = [ln for ln in text.splitlines() if "Bdesc=[type=R_8F_E4M3" in ln]
    assert lines, "the fp8 program's log has fp8 matmul lines"
    p = tmp_path / "cublaslt.log"
    p.write_text(lines[0].replace("Bdesc=[type=R_8F_E4M3", f"Bdesc=[type={b_type}") + "\n")
    [rec] = list(parse_log(p))
    return rec


def _fp8_trace_problem(b_type: str) -> dict:
    for ev in iter_chrome_events(FP8 / "trace.json.gz"):
        args = ev.get("args") or {}
        if ev.get("name") == "aten::_scaled_mm" and args.get("Input Dims"):
            types = list(args["Input type"])
            types[GEMM_OPS["aten::_scaled_mm"][1]] = b_type
            return problem_of(ev["name"], json.dumps(args["Input Dims"]), json.dumps(types),
                              json.dumps(args.get("Input Strides")))
    raise AssertionError("the fp8 program's trace has a _scaled_mm with shapes")


@pytest.mark.parametrize("log_b, torch_b, want", [
    ("R_8F_E4M3", "c10::Float8_e4m3fn", "fp8"),                      # as captured
    ("R_8F_E5M2", "c10::Float8_e5m2", "fp8_e4m3xfp8_e5m2"),          # A e4m3 x B e5m2: no name of its own
])
def test_every_reader_names_an_fp8_pair_alike(tmp_path, log_b, torch_b, want):
    """The trace, audit's log join and replay give one name for A e4m3 x B e5m2: `fp8` is e4m3 x e4m3, so
    the pair is written `<A>x<B>`; replay still rebuilds it with B e5m2."""
    rec = _fp8_log_record(tmp_path, log_b)
    assert _log_dtype(rec) == want
    pr = problem_from_record(rec)
    assert pr["dtype"] == want
    assert (dtypes.lt_types(pr["dtype"])[0], pr["b_type"]) == ("fp8", dtypes.short_dtype(log_b))
    assert _fp8_trace_problem(torch_b)["dtype"] == want
