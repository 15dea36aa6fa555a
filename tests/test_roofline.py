"""One roofline (explain.roofline_floor over explain.gemm_bytes): audit's rows, explain's time section and
the grouped roofline give one floor for one GEMM. Real data: the audits of the committed program captures."""
from __future__ import annotations

import pytest
from conftest import FIXTURES

from cublaslt_probe.analysis import explain, grouped
from cublaslt_probe.analysis.audit import audit, gpu_rates

PROGRAMS = FIXTURES / "programs"


@pytest.mark.parametrize("program", ["gpt2_train", "fp8_linear", "llama_prefill"])
def test_audit_and_explain_give_one_floor_per_gemm(program):
    """Each dense row's floor and bound in `audit` equal explain's for the same GEMM, time and GPU, and a
    grouped GEMM of one group (all rows in it) has the dense floor of that GEMM."""
    rows = audit(PROGRAMS / program).rows
    dense = rows[rows.floor_us.notna() & rows.groups.isna()]
    assert len(dense)
    for r in dense.itertuples():
        c = {"m": int(r.m), "n": int(r.n), "k": int(r.k), "batch": int(r.batch), "dtype": r.dtype}
        p = explain._time(c, {"time_us": r.mean_us}, r.gpu)["peaks"]
        assert r.bound == p["bound"]
        assert r.floor_us == pytest.approx(r.mean_us / p["over_floor"], rel=1e-12)
        if int(r.batch) == 1:
            g = grouped.roofline([c["m"]], "m", c["m"], c["n"], c["k"], r.dtype, gpu_rates(r.gpu))
            assert (g["floor_us"], g["bound"]) == (pytest.approx(r.floor_us, rel=1e-12), r.bound)
