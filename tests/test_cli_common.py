"""The CLI's shared output and input checks (cli/_common), on real files: where a command writes, how it
renders values, and how it names a file that is not what it wanted."""
from __future__ import annotations

import gzip
import io
import json
import math
import os
import sys
from datetime import datetime

import numpy as np
import pandas as pd
import pytest

from cublaslt_probe.cli._common import (
    cell,
    check_dataset_file,
    check_writable,
    check_writable_dir,
    clean,
    json_default,
    sniff,
    text_output,
    write_frame,
    write_text,
)
from cublaslt_probe.errors import ProbeError


def test_an_output_that_cannot_be_written_is_refused_before_the_work(tmp_path):
    check_writable(str(tmp_path / "out.csv"))               # a new file in a writable folder: fine
    check_writable(None) or check_writable("-")              # stdout
    with pytest.raises(ProbeError, match="it is a directory"):
        check_writable(str(tmp_path))
    with pytest.raises(ProbeError, match="no such directory"):
        check_writable(str(tmp_path / "absent" / "out.csv"))


def test_an_output_folder_is_made_now_or_refused(tmp_path):
    check_writable_dir(str(tmp_path / "a" / "b"))
    assert (tmp_path / "a" / "b").is_dir()
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(ProbeError, match="it is a file"):
        check_writable_dir(str(f))
    with pytest.raises(ProbeError, match="cannot create the directory"):
        check_writable_dir(str(f / "below"))


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (a device that is always full)")
def test_a_full_disk_names_the_output():
    with pytest.raises(ProbeError, match="cannot write /dev/full: No space left on device"):
        write_text("/dev/full", "x" * (2 << 20))


def test_text_output_to_a_file_and_to_a_text_only_stdout(tmp_path, monkeypatch):
    p = tmp_path / "t.txt"
    write_text(str(p), "µs\n")
    assert p.read_bytes() == "µs\n".encode()                 # UTF-8 whatever the locale
    with pytest.raises(ProbeError, match="cannot write"):
        with text_output(str(tmp_path / "absent" / "t.txt")):
            pass
    out = io.StringIO()                                      # an embedding application's text-only stdout
    monkeypatch.setattr(sys, "stdout", out)
    write_text(None, "one µs\n")
    assert out.getvalue() == "one µs\n"


def test_values_are_made_plain_for_json_and_tables():
    assert [clean(v) for v in (None, pd.NA, pd.NaT, float("nan"), np.int64(3), np.float32(0.5), "x")] == \
        [None, None, None, None, 3, 0.5, "x"]
    assert json_default(datetime(2026, 11, 30, 11, 0)) == "2026-11-30T11:00:00"
    assert json_default(np.int32(7)) == 7 and json_default({1}) == "{1}"
    assert [cell(v) for v in (None, math.nan, True, False, 3)] == ["", "", "yes", "no", "3"]
    assert cell(12.3456, ".1f") == "12.3" and cell("abc", ".1f") == "abc"


def test_frames_in_every_format(tmp_path):
    df = pd.DataFrame({"key": ["a", "b"], "time_us": [1.5, float("nan")], "kernels": [["k1", "k2"], []],
                       "when": [pd.Timestamp("2026-11-30"), pd.NaT]})
    write_frame(df, "csv", str(tmp_path / "f.csv"))
    lines = (tmp_path / "f.csv").read_text().splitlines()
    assert lines[0] == "key,time_us,kernels,when" and lines[1].startswith('a,1.5,"[""k1"", ""k2""]",2026-11-30')
    write_frame(df, "json", str(tmp_path / "f.json"))
    doc = json.loads((tmp_path / "f.json").read_text())
    assert doc[1] == {"key": "b", "time_us": None, "kernels": [], "when": None}
    write_frame(df, "jsonl", str(tmp_path / "f.jsonl"))
    assert [json.loads(x)["key"] for x in (tmp_path / "f.jsonl").read_text().splitlines()] == ["a", "b"]
    write_frame(df[["key", "time_us"]], "table", str(tmp_path / "f.txt"))
    t = (tmp_path / "f.txt").read_text().splitlines()
    assert t[0].split() == ["key", "time_us"] and t[-1].split() == ["b"]
    with pytest.raises(ProbeError, match="cannot write"):
        write_frame(df[["key"]], "parquet", str(tmp_path / "absent" / "f.parquet"))


@pytest.mark.parametrize("data, kind", [
    (b"", "empty"),
    (gzip.compress(b""), "an empty gzip file"),
    (gzip.compress(b'{"type": "env", "gpu": "H200"}\n'), "a gzip file holding a raw probe file (JSONL)"),
    (b"\x1f\x8b\x08\x00garbage", "a gzip file (damaged)"),
    (b"\x00\x01\x02", "binary data"),
    (b'{"traceEvents": []}', "a Chrome trace (JSON)"),
    (b'{"a": 1}', "a JSON document"),
    (b"I! cuBLAS (v13.1) function cublasGemmEx() called", "a cuBLAS API log"),
    (b"\xff\xfe\xfd" * 100, "binary data"),
    (b"hello\n", "text"),
])
def test_a_file_is_named_by_what_it_holds(tmp_path, data, kind):
    p = tmp_path / "f"
    p.write_bytes(data)
    assert sniff(str(p)) == kind


def test_a_dataset_is_asked_for_and_something_else_given(tmp_path):
    log = tmp_path / "x.parquet"
    pd.DataFrame({"message": ["m"], "m": [1]}).to_parquet(log)
    with pytest.raises(ProbeError, match="looks like parse-log's output"):
        check_dataset_file(str(log))
    broken = tmp_path / "b.parquet"
    broken.write_bytes(b"PAR1" + b"\x00" * 64)
    with pytest.raises(ProbeError, match="damaged Parquet file"):
        check_dataset_file(str(broken))
    raw = tmp_path / "r.raw.jsonl"
    raw.write_text('{"type": "env", "gpu": "NVIDIA H200"}\n')
    check_dataset_file(str(raw), raw_ok=True)
    with pytest.raises(ProbeError, match=r"a raw probe file \(JSONL\), not a dataset: give a dataset .parquet"):
        check_dataset_file(str(raw))
