"""One relative difference (candidates.max_rel_diff): the candidates, the audit's numerics and the grouped
variants all compare outputs with it, and it is max |y - ref| / max |ref|."""
from __future__ import annotations

import pathlib
import re

import numpy as np
import pytest

import cublaslt_probe
from cublaslt_probe.analysis.candidates import TOLERANCE, max_rel_diff

PACKAGE = pathlib.Path(cublaslt_probe.__file__).parent


def test_max_rel_diff_is_the_measure_the_tolerance_bounds():
    """An fp16 GEMM (numpy) against the same GEMM in fp32: within the fp16 tolerance, and exactly
    max |y - ref| / max |ref|; equal outputs give 0; a zero reference shows any difference."""
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((64, 256), dtype=np.float32), rng.standard_normal((256, 32), dtype=np.float32)
    ref = a @ b
    y = (a.astype(np.float16) @ b.astype(np.float16)).astype(np.float32)
    d = max_rel_diff(y, ref)
    assert type(d) is float and 0 < d <= TOLERANCE["fp16"]
    assert d == pytest.approx(float(np.abs(y - ref).max()) / float(np.abs(ref).max()), rel=1e-6)
    assert max_rel_diff(ref, ref) == 0.0
    assert max_rel_diff(ref, np.zeros_like(ref)) == pytest.approx(float(np.abs(ref).max()) / 1e-30, rel=1e-6)


def test_no_module_computes_a_relative_difference_of_its_own():
    """Every max |y - y0| / max |y0| in the package is a call of `max_rel_diff`: a module that writes the
    arithmetic out again (`.abs().max()`, `clamp_min(1e-30)`) fails here."""
    own = re.compile(r"\.abs\(\)\.max\(\)|clamp_min\(1e-30\)|clip\(min=1e-30\)")
    found = [f"{p.relative_to(PACKAGE)}:{i}" for p in sorted(PACKAGE.rglob("*.py"))
             for i, line in enumerate(p.read_text().splitlines(), 1) if own.search(line)]
    assert found == ["analysis/candidates.py:" + str(_line_of_rule())]


def _line_of_rule() -> int:
    lines = (PACKAGE / "analysis" / "candidates.py").read_text().splitlines()
    return next(i for i, ln in enumerate(lines, 1) if "clip(min=1e-30)" in ln)
