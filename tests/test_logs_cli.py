"""`cublaslt-probe parse-log`: exact output, formats, stdin, and the bad-input contract on the command line.

Inputs are written by the tests from real captured lines (tests/test_logs.py) or are the real fixtures.
"""
from __future__ import annotations

import gzip
import json

import pandas as pd
import pytest
from click.testing import CliRunner
from conftest import FIXTURES
from test_logs import BATCHED_LINE, LEGACY_LINE, REF_LINE

from cublaslt_probe.cli import main
from cublaslt_probe.logs import FIELD_NAMES

LOGS = FIXTURES / "logs"


def run(*args, input=None):
    return CliRunner().invoke(main, ["parse-log", *map(str, args)], input=input)


@pytest.fixture
def small_log(tmp_path):
    p = tmp_path / "app_479.log"
    p.write_text("\n".join([REF_LINE, LEGACY_LINE, REF_LINE, "junk", BATCHED_LINE]) + "\n")
    return p


TABLE = """\
   line  pid  function           types                 op     m   n     k  batch  epilogue  algo tile stages cluster splitK customOpt  workspace
-------  ---  -----------------  --------------------  --  ----  --  ----  -----  --------  -----------------------------------------  ---------
      1  479  cublasLtMatmul     bf16,bf16->bf16 fp32  TN  4096  16  4096                   66 64x16 64xAUTO 2x1x1 sk2 co1               1048576
      2  479  cublasLtSSSMatmul  fp32,fp32->fp32 fp32  NN  4096   1  4096                   13 - - - sk1 co100                                 0
      3  479  cublasLtMatmul     bf16,bf16->bf16 fp32  TN  4096  16  4096                   66 64x16 64xAUTO 2x1x1 sk2 co1               1048576
      5  519  cublasLtTSTMatmul  bf16,bf16->bf16 fp32  NN  4096   1  4096      4            66 128x8 64xAUTO 2x1x1 sk1 co1                     0
"""  # noqa: E501  the exact output; the line column has room for 7 digits: a long log's rows stay aligned

SUMMARY = """\
count  share  function           types                 op     m   n     k  batch  epilogue  algo tile stages cluster splitK customOpt  torch MxNxK
-----  -----  -----------------  --------------------  --  ----  --  ----  -----  --------  -----------------------------------------  ------------
    2  50.0%  cublasLtMatmul     bf16,bf16->bf16 fp32  TN  4096  16  4096                   66 64x16 64xAUTO 2x1x1 sk2 co1             16x4096x4096
    1  25.0%  cublasLtSSSMatmul  fp32,fp32->fp32 fp32  NN  4096   1  4096                   13 - - - sk1 co100                         1x4096x4096
    1  25.0%  cublasLtTSTMatmul  bf16,bf16->bf16 fp32  NN  4096   1  4096      4            66 128x8 64xAUTO 2x1x1 sk1 co1             1x4096x4096
"""  # noqa: E501  the command's exact output


def test_table(small_log):
    r = run(small_log)
    assert r.exit_code == 0
    assert r.stdout == TABLE
    assert r.stderr == (f"read 1 file, 5 lines: 4 records, 0 skipped, 1 bad\n"
                        f"bad line {small_log}:4: not a cuBLASLt log line: 'junk'\n")


def test_summary(small_log):
    r = run(small_log, "--summary")
    assert r.exit_code == 0 and r.stdout == SUMMARY


def test_clean_input_prints_nothing_on_stderr(tmp_path):
    p = tmp_path / "ok.log"
    p.write_text(REF_LINE + "\n")
    r = run(p)
    assert r.exit_code == 0 and r.stderr == ""


def test_jsonl_streams_every_field(small_log):
    r = run(small_log, "--format", "jsonl")
    rows = [json.loads(x) for x in r.stdout.splitlines()]
    assert [d["line"] for d in rows] == [1, 2, 3, 5]
    assert list(rows[0]) == list(FIELD_NAMES)
    assert rows[0]["tile"] == "64x16" and rows[0]["extra"]["A"] == "0X7F0118000000"


def test_summary_jsonl_and_csv(small_log):
    rows = [json.loads(x) for x in run(small_log, "--summary", "--format", "jsonl").stdout.splitlines()]
    assert [(d["count"], d["function"], d["batch_count"]) for d in rows] == [
        (2, "cublasLtMatmul", None), (1, "cublasLtSSSMatmul", None), (1, "cublasLtTSTMatmul", 4)]
    csv = run(small_log, "--summary", "--format", "csv").stdout.splitlines()
    assert csv[0].startswith("count,share,function,a_type,")
    assert csv[1].startswith("2,0.5,cublasLtMatmul,R_16BF,")


def test_csv_and_parquet_round_trip(small_log, tmp_path):
    out = tmp_path / "gemms.csv"
    assert run(small_log, "--format", "csv", "-o", out).exit_code == 0
    df = pd.read_csv(out)
    assert list(df.columns) == list(FIELD_NAMES) and list(df["m"]) == [4096] * 4
    pq = tmp_path / "gemms.parquet"
    r = run(small_log, "--format", "parquet", "-o", pq)
    assert r.exit_code == 0 and r.stdout == ""
    df = pd.read_parquet(pq)
    assert list(df.columns) == list(FIELD_NAMES)
    assert list(df["tile"].astype(str)) == ["64x16", "UNDEFINED", "64x16", "128x8"]
    assert str(df["m"].dtype) == "Int64"


def test_parquet_needs_output(small_log):
    r = run(small_log, "--format", "parquet")
    assert r.exit_code == 2 and "give it a path with -o" in r.stderr


def test_stdin_plain_and_gzip():
    r = run("-", input=REF_LINE + "\n" + LEGACY_LINE + "\n")
    assert r.exit_code == 0 and len(r.stdout.splitlines()) == 4
    r = run("-", "--format", "jsonl", input=gzip.compress((REF_LINE + "\n").encode()))
    assert r.exit_code == 0 and json.loads(r.stdout)["file"] == "<stdin>"


def test_several_files_merge_with_pids(tmp_path):
    a, b = tmp_path / "app_1.log", tmp_path / "app_2.log.gz"
    a.write_text(REF_LINE + "\n")
    b.write_bytes(gzip.compress((BATCHED_LINE + "\n").encode()))
    r = run(a, b)
    assert r.exit_code == 0
    lines = [x.split()[:4] for x in r.stdout.splitlines()]
    assert lines[0] == ["file", "line", "pid", "function"]
    assert lines[2:] == [["app_1.log", "1", "479", "cublasLtMatmul"],
                         ["app_2.log.gz", "1", "519", "cublasLtTSTMatmul"]]


def test_missing_and_directory_with_one_good_file(small_log, tmp_path):
    r = run(tmp_path / "missing.log", small_log, tmp_path)
    assert r.exit_code == 3  # partial: records written, two inputs unreadable
    # several files: a file column first, then the same table
    assert [ln.split(None, 1)[1] for ln in r.stdout.splitlines()[2:]] == \
        [ln.strip() for ln in TABLE.splitlines()[2:]]
    assert f"cannot read {tmp_path / 'missing.log'}: no such file\n" in r.stderr
    assert f"cannot read {tmp_path}: is a directory (give the log files inside it)\n" in r.stderr
    assert "Traceback" not in r.output


def test_nothing_readable_is_an_error(tmp_path):
    r = run(tmp_path / "missing.log", tmp_path)
    assert r.exit_code == 1
    assert r.stdout == ""
    assert r.stderr == (f"Error: no log could be read ({tmp_path / 'missing.log'}: no such file; "
                        f"{tmp_path}: is a directory (give the log files inside it))\n")


def test_empty_file(tmp_path):
    p = tmp_path / "empty.log"
    p.write_text("")
    r = run(p)
    assert r.exit_code == 1  # nothing usable
    assert r.stderr.startswith("Error: no GEMM records in") and len(r.stderr.splitlines()) == 1
    assert "no GEMM records in" in r.stderr and "CUBLASLT_LOG_LEVEL" in r.stderr


def test_binary_garbage_file(tmp_path):
    p = tmp_path / "lib.so"
    p.write_bytes(bytes(range(256)) * 20 + b"\n" + REF_LINE.encode() + b"\n")
    r = run(p)
    assert r.exit_code == 0 and "Traceback" not in r.output
    out = r.stdout.splitlines()
    assert len(out) == 3 and out[2].split()[1:3] == ["479", "cublasLtMatmul"]
    assert "bad line" in r.stderr


def test_output_to_unwritable_path(small_log, tmp_path):
    r = run(small_log, "-o", tmp_path / "no" / "such" / "dir.txt")
    assert r.exit_code == 1
    assert r.stderr == f"Error: cannot write {tmp_path / 'no' / 'such' / 'dir.txt'}: no such directory " \
        f"{tmp_path / 'no' / 'such'}\n"


def test_api_flag_on_level5_fixture():
    r = run(LOGS / "level5_torch.log", "--api", "--format", "jsonl")
    kinds = {json.loads(x)["kind"] for x in r.stdout.splitlines()}
    assert kinds == {"api", "info", "trace"}
    plain = run(LOGS / "level5_torch.log", "--format", "jsonl")
    assert {json.loads(x)["kind"] for x in plain.stdout.splitlines()} == {"trace"}


def test_summary_on_real_fixtures():
    r = run(*sorted(LOGS.glob("level2_*.log")), "--summary", "--format", "jsonl")
    rows = [json.loads(x) for x in r.stdout.splitlines()]
    counts = [d["count"] for d in rows]
    assert counts == sorted(counts, reverse=True)
    assert sum(counts) == 112 + 112 + 55


def test_cublas_log():
    r = run(LOGS / "cublas_api.log", "--cublas")
    assert r.exit_code == 0
    gemm = [x for x in r.stdout.splitlines() if "cublasGemmEx" in x]
    assert gemm[0].split() == ["37", "600", "cublasGemmEx", "TN", "4096", "1", "4096", "R_16BF",
                               "COMPUTE_32F"]
    rows = [json.loads(x) for x in run(LOGS / "cublas_api.log", "--cublas", "--format", "jsonl")
            .stdout.splitlines()]
    assert rows[6]["function"] == "cublasGemmEx" and rows[6]["arg_transa"] == "CUBLAS_OP_T(1)"


def test_help_exists():
    r = CliRunner().invoke(main, ["parse-log", "--help"])
    assert r.exit_code == 0 and "CUBLASLT_LOG_LEVEL" in r.stdout
    assert main.get_command(None, "parse-log").help
