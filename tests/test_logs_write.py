"""The streaming encoders of `cublaslt_probe.logs.write` against the plain encodings, on every real line.

The memoized encoders must give exactly what encoding each record afresh gives; the lines are the real
fixture logs (tests/fixtures/logs, PROVENANCE.md there), repeated and shuffled so the memos are hit.
"""
from __future__ import annotations

import csv
import io
import json
import random

import pandas as pd
import pyarrow.parquet as pq
import pytest
from conftest import FIXTURES

from cublaslt_probe.cli._common import Table
from cublaslt_probe.logs import parse_log, records_to_frame
from cublaslt_probe.logs.frame import Summary, summarize
from cublaslt_probe.logs.record import FIELD_NAMES
from cublaslt_probe.logs.write import (
    CSV_HEADER,
    RECORD_RIGHT,
    ParquetStream,
    csv_chunks,
    jsonl_chunks,
    record_cells,
    record_header,
    record_json,
    table_chunks,
)

LOGS = FIXTURES / "logs"


def _lines() -> list[str]:
    out = []
    for p in sorted(LOGS.glob("*.log")):
        out += p.read_text().splitlines()
    rng = random.Random(1)
    many = out * 3
    rng.shuffle(many)
    return many


def _records(api=True):
    return list(parse_log(_lines(), api=api, name="x.log"))


def test_jsonl_chunks_equal_plain_json():
    recs = _records()
    assert len(recs) > 1000
    got = b"".join(jsonl_chunks(recs, chunk=7)).decode("utf-8")
    assert got == "".join(record_json(r) + "\n" for r in recs)
    assert got.isascii()


def test_memo_never_serves_another_records_fields():
    """Same text, other extra (another library tag, other pointers): encoded afresh."""
    recs = _records()
    a = recs[0]
    b = parse_log([f"[2026-11-30 03:21:52][cublasLtX][{a.pid}][Trace][{a.function}] {a.message}"],
                  name="x.log")
    b = list(b)
    if b:
        pair = [a, b[0]]
        assert b"".join(jsonl_chunks(pair)).decode() == "".join(record_json(r) + "\n" for r in pair)


def test_csv_chunks_read_back_as_the_frame():
    recs = _records()
    text = CSV_HEADER + b"".join(csv_chunks(recs, chunk=5)).decode("utf-8")
    back = pd.read_csv(io.StringIO(text), keep_default_na=False, dtype=str)
    want = records_to_frame(recs)
    assert list(back.columns) == list(FIELD_NAMES) and len(back) == len(want)
    for col in ("line", "m", "n", "k", "algo_id", "function", "tile", "message", "extra"):
        w = ["" if pd.isna(v) else str(v) for v in want[col].astype(object)]
        assert list(back[col]) == w, col


def test_csv_quotes_a_lone_cr():
    recs = list(parse_log(["[2026-11-30 03:21:52][cublasLt][1][Info][cublasLtCreate] a\rb",
                           "[2026-11-30 03:21:52][cublasLt][1][Info][cublasLtCreate] a\rb, \"c\""], api=True))
    assert [r.message for r in recs] == ["a\rb", 'a\rb, "c"']
    text = CSV_HEADER + b"".join(csv_chunks(recs)).decode("utf-8")
    rows = list(csv.reader(io.StringIO(text, newline="")))
    assert len(rows) == 3 and [r[FIELD_NAMES.index("message")] for r in rows[1:]] == ["a\rb", 'a\rb, "c"']


@pytest.mark.parametrize("multi,api", [(False, False), (True, True)])
def test_table_chunks_render_like_the_renderer(multi, api):
    """The memoized rows equal the table renderer's row of every record's cells, line numbers past the
    sampled width included."""
    recs = _records(api=api)
    for i, r in enumerate(recs):
        r.line = 1 + i * 99_991  # numbers of up to 7 digits, and wider ones
    header = record_header(multi, api)
    table = Table(header, RECORD_RIGHT, min_widths={"line": 7})
    table.layout([record_cells(r, multi, api) for r in recs[:50]])
    at = 1 if multi else 0
    got = b"".join(table_chunks(recs, multi, api, table.row, table.widths[at], chunk=9)).decode()
    want = "".join(table.row(record_cells(r, multi, api)) for r in recs)
    assert got.splitlines()[:200] == want.splitlines()[:200]
    assert got == want
    assert any(len(str(r.line)) > 7 for r in recs)


def test_running_summary_equals_the_frame_summary():
    recs = _records(api=False)
    acc = Summary()
    for r in recs:
        acc.add(r)
    got, want = acc.frame(), summarize(records_to_frame(recs))
    assert list(got.columns) == list(want.columns)
    assert len(got) == len(want) > 10
    for col in got.columns:
        assert [None if pd.isna(v) else v for v in got[col].astype(object)] == \
            [None if pd.isna(v) else v for v in want[col].astype(object)], col


def test_parquet_stream_in_small_row_groups(tmp_path):
    recs = _records()
    recs[3].time = "2026-11-30 03:21:52.123456"  # fractional seconds survive
    p = tmp_path / "x.parquet"
    w = ParquetStream(str(p), batch=100)
    for r in recs:
        w.write(r)
    w.close()
    f = pq.ParquetFile(p)
    assert f.metadata.num_row_groups == -(-len(recs) // 100)
    got = pd.read_parquet(p)
    want = records_to_frame(recs)
    assert list(got.columns) == list(FIELD_NAMES) and len(got) == len(want)
    assert str(got["m"].dtype) == "Int64"
    for col in ("line", "m", "tile", "extra", "time", "beta_value"):
        assert [None if pd.isna(v) else v for v in got[col].astype(object)] == \
            [None if pd.isna(v) else v for v in want[col].astype(object)], col
    assert json.loads(got["extra"][0]) == recs[0].extra
