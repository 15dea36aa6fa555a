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
from conftest import FIXTURES

from cublaslt_probe.cli import main
from cublaslt_probe.names import decode

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


# --- dataset --------------------------------------------------------------------------------------------

def _raw_lines(name: str, n: int) -> list[str]:
    with gzip.open(ROOT / "data" / f"{name}.raw.jsonl.gz", "rt") as f:
        return [next(f) for _ in range(n)]


@pytest.fixture
def two_gpus(tmp_path):
    """Two real raw files; B's environment line names another GPU (as a file from another machine)."""
    a, b = tmp_path / "A.raw.jsonl", tmp_path / "B.raw.jsonl"
    a.write_text("".join(_raw_lines("h200_square", 40)))
    lines = _raw_lines("h200_llm", 30)
    env = json.loads(lines[0])
    assert env["type"] == "env"
    env["gpu"] = "NVIDIA H100 80GB HBM3"
    b.write_text(json.dumps(env) + "\n" + "".join(lines[1:]))
    return a, b


def test_dataset_refuses_mixed_environments(two_gpus, tmp_path):
    a, b = two_gpus
    for order in ((a, b), (b, a)):
        r = run("dataset", *order, "-o", tmp_path / "ab.parquet")
        assert r.exit_code == 1
        line = one_error_line(r)
        assert "another environment" in line and "--allow-env-mismatch" in line and "H100" in line
    assert not (tmp_path / "ab.parquet").exists()


def test_dataset_keeps_each_rows_own_environment(two_gpus, tmp_path):
    from cublaslt_probe.analysis.dataset import read_parquet
    a, b = two_gpus
    for order in ((a, b), (b, a)):
        out = tmp_path / "ab.parquet"
        r = run("dataset", *order, "-o", out, "--allow-env-mismatch")
        assert r.exit_code == 0, r.output
        df = read_parquet(out)
        by_file = df.groupby(df["key"].isin([json.loads(x)["key"] for x in a.read_text().splitlines()[1:]]))
        gpus = {bool(k): set(g["gpu"].astype(str)) for k, g in by_file}
        assert gpus == {True: {"NVIDIA H200"}, False: {"NVIDIA H100 80GB HBM3"}}
        assert "gpu" not in df.attrs["env"]  # the file-level environment holds only what both share
        assert df.attrs["env"]["cublaslt_version"] == "13.1.0"


def test_dataset_keeps_the_readable_half_of_a_cut_gzip(tmp_path):
    lines = _raw_lines("h200_square", 1200)
    full = gzip.compress("".join(lines).encode())
    cut = tmp_path / "cut.raw.jsonl.gz"
    cut.write_bytes(full[: len(full) // 2])
    with gzip.open(cut, "rt") as f:  # what a reader can get out of the cut file
        readable = []
        try:
            for line in f:
                readable.append(line)
        except EOFError:
            pass
    n_good = sum(1 for x in readable[1:] if x.endswith("\n"))
    assert 100 < n_good < 1199
    out = tmp_path / "cut.parquet"
    r = run("dataset", cut, "-o", out)
    assert r.exit_code == 3, r.output
    assert "cut off after line" in r.stderr and "kept" in r.stderr
    assert len(pd.read_parquet(out)) == n_good


def test_dataset_wrong_inputs_are_one_line_errors(tmp_path):
    out = tmp_path / "x.parquet"
    pq = ROOT / "data" / "h200_square.parquet"
    r = run("dataset", pq, "-o", out)
    assert r.exit_code == 1 and "is a Parquet file" in one_error_line(r)
    notgz = tmp_path / "plain.raw.jsonl.gz"  # named .gz but not gzip: read as what it is
    notgz.write_text("".join(_raw_lines("h200_square", 11)))
    r = run("dataset", notgz, "-o", out)
    assert r.exit_code == 0 and len(pd.read_parquet(out)) == 10
    junk = tmp_path / "junk.bin"
    junk.write_bytes(bytes(range(256)) * 8)
    r = run("dataset", junk, "-o", out)
    assert r.exit_code == 1 and "binary data" in one_error_line(r)
    r = run("dataset", notgz, "-o", tmp_path / "no" / "x.parquet")
    assert r.exit_code == 1 and "no such directory" in one_error_line(r)
    r = run("dataset", notgz, "--env", pq, "-o", out)
    assert r.exit_code == 1 and "Parquet file, not JSON" in one_error_line(r)


def test_dataset_says_how_many_duplicates_it_replaced(tmp_path):
    lines = _raw_lines("h200_square", 21)
    a, b = tmp_path / "a.raw.jsonl", tmp_path / "b.raw.jsonl"
    a.write_text("".join(lines))
    b.write_text("".join(lines[:1] + lines[11:]))  # keys 11..20 again
    r = run("dataset", a, b, "-o", tmp_path / "x.parquet")
    assert r.exit_code == 0
    assert "10 records repeated a key" in r.stderr
    assert len(pd.read_parquet(tmp_path / "x.parquet")) == 20


# --- trace ----------------------------------------------------------------------------------------------
TRACE = FIXTURES / "traces" / "transformer_bf16.json.gz"


def test_trace_refuses_a_cublaslt_log():
    r = run("trace", LOGS / "level2_torch.log")
    assert r.exit_code == 1
    line = one_error_line(r)
    assert "is a cuBLASLt log, not a profiler trace" in line and "parse-log" in line


def test_trace_format_and_suffix_must_agree(tmp_path):
    r = run("trace", TRACE, "--format", "csv", "-o", tmp_path / "x.json")
    assert r.exit_code == 2 and "write " in r.stderr and "x.csv" in r.stderr
    assert not (tmp_path / "x.json").exists()
    r = run("trace", TRACE, "-o", tmp_path / "x.csv")  # the suffix alone picks the format
    assert r.exit_code == 0
    back = pd.read_csv(tmp_path / "x.csv")
    assert "kernel" in back.columns and len(back) > 0


def test_trace_cut_off_is_partial_and_says_so_once(tmp_path):
    cut = tmp_path / "cut.json"
    cut.write_bytes(gzip.decompress(TRACE.read_bytes())[:30_000])
    r = run("trace", cut)
    assert r.exit_code == 3
    assert "cut off inside the event array" in r.stdout
    assert "0 malformed" not in r.output


# --- parse-log ------------------------------------------------------------------------------------------

def test_parse_log_refuses_a_png_and_random_bytes(tmp_path):
    from matplotlib.figure import Figure
    png = tmp_path / "map.png"
    Figure(figsize=(1, 1)).savefig(png, dpi=20)      # a PNG as the plotting commands write one
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rnd = tmp_path / "random.bin"
    rnd.write_bytes(os.urandom(20_000).replace(b"\x1f\x8b", b"xx"))
    for p in (png, rnd):
        r = run("parse-log", p)
        assert r.exit_code == 1 and r.stdout == ""
        line = one_error_line(r)
        assert str(p) in line and "not a cuBLASLt log" in line and "--cublas" in line


def test_parse_log_cut_gzip_keeps_its_records_and_exits_3(tmp_path):
    text = (LOGS / "level2_torch.log").read_bytes() * 20
    gz = gzip.compress(text)
    cut = tmp_path / "cut.log.gz"
    cut.write_bytes(gz[: len(gz) // 2])
    r = run("parse-log", cut, "-f", "jsonl")
    assert r.exit_code == 3
    rows = [json.loads(x) for x in r.stdout.splitlines()]
    assert 100 < len(rows) < 112 * 20 and [x["line"] for x in rows] == list(range(1, len(rows) + 1))
    assert f"cannot read {cut} past line" in r.stderr and "broken gzip" in r.stderr
    assert f"cannot read {cut}: past" not in r.stderr


def test_parse_log_lists_every_bad_line_with_vv(tmp_path):
    p = tmp_path / "junk.log"
    good = (LOGS / "level2_torch.log").read_text().splitlines()[0]
    p.write_text("\n".join([good] + [f"junk {i}" for i in range(12)]) + "\n")
    def listed(r):
        return sum(ln.startswith("bad line ") for ln in r.stderr.splitlines())
    r = run("parse-log", p)
    assert listed(r) == 5 and "-vv" in r.stderr
    r = run("-vv", "parse-log", p)
    assert listed(r) == 12
    assert r.exit_code == 0  # foreign lines lose no GEMM


def test_parse_log_into_head_is_quiet():
    """`parse-log ... --format jsonl | head -5`: the rows arrive, nothing is said, exit status 0."""
    script = (f"{sys.executable} -m cublaslt_probe parse-log {LOGS / 'level2_torch.log'} "
              f"{LOGS / 'level2_torch.log'} --format jsonl | head -5; echo \"rc=${{PIPESTATUS[0]}}\" >&2")
    p = subprocess.run(["bash", "-c", script], capture_output=True, text=True, cwd=ROOT)
    assert len(p.stdout.splitlines()) == 5
    assert p.stderr.strip() == "rc=0", p.stderr


# --- messages -------------------------------------------------------------------------------------------

def _has_gpu() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


@pytest.mark.skipif(_has_gpu(), reason="the message of a machine without a GPU")
@pytest.mark.parametrize("cmd", ["candidates", "explain", "first-call"])
def test_no_gpu_names_the_command_run_and_every_cpu_command(cmd):
    r = run(cmd, "--m", "16", "--n", "4096", "--k", "4096")
    assert r.exit_code == 1
    line = one_error_line(r)
    assert f"`{cmd}` needs an NVIDIA GPU" in line and "`sweep`" not in line
    assert f"`{cmd} --from FILE`" in line
    for c in ("trace", "plot", "dataset", "merge", "schema", "parse-log", "decode"):
        assert c in line


def test_pathdiff_on_a_square_sweep_blames_no_option_not_given(tmp_path):
    r = run("plot", "pathdiff", ROOT / "data" / "h200_square.parquet", "-o", tmp_path / "pd.png")
    assert r.exit_code == 0, r.output
    assert "--backend" not in r.output and (tmp_path / "pd.png").stat().st_size > 1000


@pytest.mark.parametrize("cmd,saved,by", [("candidates", "firstcall_bf16_NT_16x4096x4096.json", "first-call"),
                                          ("first-call", "explain_bf16_NT_16x4096x4096.json", "explain"),
                                          ("explain", "replay_level2_torch.json", "replay"),
                                          ("replay", "candidates_bf16_256x4096x4096.json", "candidates")])
def test_from_given_another_commands_file(cmd, saved, by):
    p = FIXTURES / "evidence" / saved
    r = run(cmd, "--from", p) if cmd != "replay" else run(cmd, p, "--from")
    assert r.exit_code == 1
    line = one_error_line(r)
    assert f"saved by `{by} --save`" in line and f"`{by} --from" in line


def test_dataset_streams_in_row_groups_and_equals_the_in_memory_build(tmp_path):
    """`write_from_raw` (what `dataset` runs) writes the rows `build` makes of `read_raws`, in row groups
    of one batch each: the dataset is never held whole."""
    import pyarrow.parquet as pq

    from cublaslt_probe.analysis import dataset
    raw = ROOT / "data" / "h200_square.raw.jsonl.gz"
    out = tmp_path / "sq.parquet"
    env, rows, counts = dataset.write_from_raw([raw], out, batch=500)
    assert rows == 3184 and pq.ParquetFile(out).metadata.num_row_groups == 7
    env2, recs = dataset.read_raws([raw])
    want = dataset.build(recs, env2)
    got = dataset.read_parquet(out)
    assert env == env2 == got.attrs["env"]
    assert counts["error"] == int(want["error"].notna().sum())
    assert list(got["key"]) == list(want["key"])
    for col in ("kernel", "family", "tile_m", "algo_tile", "time_us", "consistent", "gpu", "kernels"):
        a = [None if (not isinstance(v, (list, __import__("numpy").ndarray)) and pd.isna(v)) else
             (list(v) if not isinstance(v, str) and hasattr(v, "__len__") else v) for v in got[col]]
        b = [None if (not isinstance(v, (list, __import__("numpy").ndarray)) and pd.isna(v)) else
             (list(v) if not isinstance(v, str) and hasattr(v, "__len__") else v) for v in want[col]]
        assert a == b, col
