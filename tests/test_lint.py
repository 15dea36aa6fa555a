"""The linter as CI runs it: `ruff check` with the rules in pyproject.toml ([tool.ruff]) on the package, the tests,
the scripts and the benchmarks. A failure prints ruff's own report (file:line:col, rule, message)."""
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHECKED = ["cublaslt_probe", "tests", "scripts", "benchmarks"]


@pytest.mark.skipif(importlib.util.find_spec("ruff") is None,
                    reason="ruff is not installed (pip install -e '.[test]' installs it)")
def test_ruff_clean():
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise",
                           *CHECKED], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, f"ruff check found:\n{done.stdout}{done.stderr}"
