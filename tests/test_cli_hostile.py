"""Regression tests of hostile input, one per reproduction: no traceback, no wrong label, no lost record.

Inputs are built by the tests from the real fixtures (tests/fixtures, PROVENANCE.md in each folder) and
the shipped raw files (data/, data/PROVENANCE.md); exit codes follow docs/cli.md (0 all good, 1 nothing
usable, 2 usage, 3 partial).
"""
from __future__ import annotations

import csv
import gzip
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from cublaslt_probe.cli import main
from cublaslt_probe.names import decode

from conftest import FIXTURES

ROOT = Path(__file__).resolve().parent.parent
LOGS = FIXTURES / "logs"
TST = "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT"


def run(*args, input=None):
    return CliRunner().invoke(main, [str(a) for a in args], input=input)


def one_error_line(r) -> str:
    assert "Traceback" not in r.output and r.exception is None or isinstance(r.exception, SystemExit)
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), r.stderr
    return lines[0]


# --- decode ---------------------------------------------------------------------------------------------

def test_a_name_with_a_huge_size_field_loses_no_other_name():
    """A size field of more digits than int() converts: that token is not understood, the rest decode."""
    huge = TST.replace("256x128", "9" * 5000 + "x128")
    names = [TST] * 50 + [huge] + [TST] * 50
    r = run("decode", "-f", "jsonl", input="\n".join(names) + "\n")
    assert r.exit_code == 0, r.output
    objs = [json.loads(x) for x in r.stdout.splitlines()]
    assert len(objs) == 101 and [o["name"] for o in objs] == names
    assert objs[0]["tile_m"] == 256 and objs[50]["unparsed"]
    assert decode(huge).name == huge


def test_table_cuts_long_names_and_streams():
    """One 1 MB name among others: the table stays narrow (the name cut with an ellipsis)."""
    long = "x" * 1_000_000
    r = run("decode", input="\n".join([TST, long, TST]) + "\n")
    assert r.exit_code == 0
    lines = r.stdout.splitlines()
    assert len(lines) == 4 and max(map(len, lines)) < 300
    assert "…" in lines[2] and lines[1].startswith(TST)
    # csv and jsonl keep the name whole
    r = run("decode", "-f", "jsonl", input=long + "\n")
    assert json.loads(r.stdout)["name"] == long


def test_invalid_utf8_on_stdin_and_in_an_argument():
    r = CliRunner().invoke(main, ["decode", "-f", "jsonl", "-"], input=b"nvjet_\xff_x\n" + TST.encode() + b"\n")
    assert r.exit_code == 3 and "not UTF-8" in r.stderr
    r.stdout_bytes.decode("utf-8")  # valid UTF-8
    assert [json.loads(x)["name"] for x in r.stdout.splitlines()] == ["nvjet_\ufffd_x", TST]
    arg = os.fsdecode(b"nvjet_\xff")  # as Python hands an undecodable argv byte over (a surrogate)
    r = run("decode", "-f", "jsonl", arg)
    assert r.exit_code == 3 and json.loads(r.stdout)["name"] == "nvjet_\ufffd"


@pytest.mark.parametrize("locale", ["C.UTF-8", "C"])
def test_invalid_utf8_argument_in_a_real_process(locale):
    env = dict(os.environ, LC_ALL=locale, LANG=locale)
    p = subprocess.run([sys.executable, "-m", "cublaslt_probe", "decode", "-f", "jsonl", b"nvjet_\xff_x", TST],
                       capture_output=True, env=env, cwd=ROOT)
    assert p.returncode == 3 and b"Traceback" not in p.stderr
    rows = [json.loads(x) for x in p.stdout.decode("utf-8").splitlines()]
    assert [o["name"] for o in rows] == ["nvjet_\ufffd_x", TST]


def test_csv_quotes_a_lone_carriage_return():
    r = run("decode", "-f", "csv", "a\rb", TST)
    rows = list(csv.reader(io.StringIO(r.stdout, newline="")))
    assert len(rows) == 3 and [x[0] for x in rows[1:]] == ["a\rb", TST]
    r = run("decode", "-f", "csv", input="a\rb\nc\n")  # a lone CR on stdin stays in its name
    rows = list(csv.reader(io.StringIO(r.stdout, newline="")))
    assert [x[0] for x in rows[1:]] == ["a\rb", "c"]
