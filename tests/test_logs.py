"""Unit tests of the cuBLASLt / cuBLAS log parser (`cublaslt_probe.logs`).

The lines used here are real captured lines: REF_LINE is the measured line quoted in REFERENCE.md §2, the
others are copied from tests/fixtures/logs (see PROVENANCE.md there).
"""
from __future__ import annotations

import dataclasses
import gzip
import io
import pickle

import pytest

from cublaslt_probe import logs
from cublaslt_probe.errors import ProbeError
from cublaslt_probe.logs import (
    FIELD_NAMES,
    LogReadError,
    LogRecord,
    ParseStats,
    load_log,
    load_logs,
    parse_line,
    parse_log,
    parse_logs,
    parse_message,
    records_to_frame,
    scan,
    short_dtype,
    summarize,
)
from cublaslt_probe.logs.parser import _fast_record, _template

# bf16, torch cuBLASLt path, 16x4096x4096 (REFERENCE.md §2)
REF_LINE = (
    "[2026-11-30 03:21:52][cublasLt][479][Trace][cublasLtMatmul] A=0X7F0118000000 Adesc=[type=R_16BF "
    "rows=4096 cols=4096 ld=4096] B=0X7F0133E00000 Bdesc=[type=R_16BF rows=4096 cols=16 ld=4096] "
    "C=0X7F0133E20000 Cdesc=[type=R_16BF rows=4096 cols=16 ld=4096] D=0X7F0133E20000 Ddesc=[type=R_16BF "
    "rows=4096 cols=16 ld=4096] computeDesc=[computeType=COMPUTE_32F scaleType=R_32F transa=OP_T] "
    "algo=[algoId=66 tile=MATMUL_TILE_64x16 stages=MATMUL_STAGES_64xAUTO "
    "reductionScheme=REDUCTION_SCHEME_COMPUTE_TYPE numSplitsK=2 customOption=1 "
    "clusterShape=CLUSTER_SHAPE_2x1x1] workSpace=0X7F0133E40000 workSpaceSizeInBytes=1048576 beta=0 "
    "outOfPlace=0 stream=0X0")
# fp32, torch default (cuBLAS) path: internal legacy name, smCountTarget, algo without tile (level2_torch.log:1)
LEGACY_LINE = (
    "[2026-11-30 04:30:56][cublasLt][479][Trace][cublasLtSSSMatmul] A=0X7F2A54000000 Adesc=[type=R_32F "
    "rows=4096 cols=4096 ld=4096] B=0X7F2A73E00000 Bdesc=[type=R_32F rows=4096 cols=1 ld=4096] "
    "C=0X7F2A73E04000 Cdesc=[type=R_32F rows=4096 cols=1 ld=4096] D=0X7F2A73E04000 Ddesc=[type=R_32F "
    "rows=4096 cols=1 ld=4096] computeDesc=[computeType=COMPUTE_32F scaleType=R_32F smCountTarget=132] "
    "algo=[algoId=13 customOption=100] workSpace=0X0 workSpaceSizeInBytes=0 beta=0 outOfPlace=0 stream=0X0")
# bf16 bmm, batch 4 (level2_mixed.log:4)
BATCHED_LINE = (
    "[2026-11-30 04:31:05][cublasLt][519][Trace][cublasLtTSTMatmul] A=0X7FE958000000 Adesc=[type=R_16BF "
    "rows=4096 cols=4096 ld=4096 batchCount=4 stridedBatchOffset=16777216] B=0X7FE967F18000 "
    "Bdesc=[type=R_16BF rows=4096 cols=1 ld=4096 batchCount=4 stridedBatchOffset=4096] C=0X7FE967F28000 "
    "Cdesc=[type=R_16BF rows=4096 cols=1 ld=4096 batchCount=4 stridedBatchOffset=4096] D=0X7FE967F28000 "
    "Ddesc=[type=R_16BF rows=4096 cols=1 ld=4096 batchCount=4 stridedBatchOffset=4096] "
    "computeDesc=[computeType=COMPUTE_32F scaleType=R_32F smCountTarget=132] algo=[algoId=66 "
    "tile=MATMUL_TILE_128x8 stages=MATMUL_STAGES_64xAUTO customOption=1 clusterShape=CLUSTER_SHAPE_2x1x1] "
    "workSpace=0X7FE949A00000 workSpaceSizeInBytes=0 beta=0 outOfPlace=0 stream=0X0")
# fp8 _scaled_mm (level2_mixed.log:5)
FP8_LINE = (
    "[2026-11-30 04:31:05][cublasLt][519][Trace][cublasLtMatmul] A=0X7FE952000000 Adesc=[type=R_8F_E4M3 "
    "rows=4096 cols=4096 ld=4096] B=0X7FE967E06000 Bdesc=[type=R_8F_E4M3 rows=4096 cols=1 ld=4096] "
    "C=0X7FE952000000 Cdesc=[type=R_16BF rows=4096 cols=1 ld=4096] D=0X7FE967E00000 Ddesc=[type=R_16BF "
    "rows=4096 cols=1 ld=4096] computeDesc=[computeType=COMPUTE_32F scaleType=R_32F transa=OP_T "
    "aScalePointer=0x7fe967e07000 bScalePointer=0x7fe967e07000] algo=[algoId=66 tile=MATMUL_TILE_64x8 "
    "stages=MATMUL_STAGES_128xAUTO customOption=1 clusterShape=CLUSTER_SHAPE_4x1x1] "
    "workSpace=0X7FE967E08000 workSpaceSizeInBytes=1048576 beta=0 outOfPlace=1 stream=0X0")
# level 5: the heuristic query of the legacy path, with its preference (level5_torch.log:3)
API_LINE = (
    "[2026-11-30 04:31:14][cublasLt][560][Api][cublasLtTSTMatmulAlgoGetHeuristic] Adesc=[type=R_16BF "
    "rows=4096 cols=4096 ld=4096] Bdesc=[type=R_16BF rows=4096 cols=1 ld=4096] Cdesc=[type=R_16BF rows=4096 "
    "cols=1 ld=4096] Ddesc=[type=R_16BF rows=4096 cols=1 ld=4096] preference=[maxWavesCount=0.0 "
    "maxWorkspaceSizeinBytes=33554432 minBytesAlignmentA=16 minBytesAlignmentB=16 minBytesAlignmentC=16 "
    "minBytesAlignmentD=16 implMask=18446744069414584319] computeDesc=[computeType=COMPUTE_32F "
    "scaleType=R_32F transa=OP_T smCountTarget=132]")
INFO_LINE = ("[2026-11-30 04:31:14][cublasLt][560][Info][cublasLtTSTMatmulAlgoGetHeuristic]  "
             "heuristicResults=[66]")
INFO_TEXT_LINE = ("[2026-11-30 04:31:14][cublasLt][560][Info][cublasLtCtxInit] Discovered per-ctx shared "
                  "memory size limit = 0")
API_CALL_LINE = (
    "[2026-11-30 04:31:14][cublasLt][560][Api][cublasLtMatmulDescSetAttribute] matmulDesc=0X2781AC90 "
    "attr=MATMUL_DESC_TRANSA buf=0X7FFDD37AA50C sizeInBytes=4")


# --- one line -------------------------------------------------------------------------------------------

def test_reference_line_every_field():
    r = parse_line(REF_LINE, 7)
    assert r is not None
    expected = dict(
        line=7, time="2026-11-30 03:21:52", pid=479, level=2, kind="trace", function="cublasLtMatmul",
        a_type="R_16BF", b_type="R_16BF", c_type="R_16BF", d_type="R_16BF", compute_type="COMPUTE_32F",
        scale_type="R_32F", op_a="T", op_b="N", m=4096, n=16, k=4096, lda=4096, ldb=4096,
        ldc=4096, ldd=4096, batch_count=None, epilogue=None, algo_id=66, tile="64x16", algo_stages="64xAUTO",
        cluster="2x1x1", num_splits_k=2, reduction_scheme="COMPUTE_TYPE", custom_option=1, cta_swizzling=0,
        workspace_bytes=1048576, beta_value=0.0, out_of_place=False, sm_count_target=None, torch_m=16,
        torch_n=4096, torch_k=4096, known_issue=None, file=None, message=REF_LINE.split("] ", 1)[1],
        extra={"A": "0X7F0118000000", "B": "0X7F0133E00000", "C": "0X7F0133E20000",
               "D": "0X7F0133E20000", "workSpace": "0X7F0133E40000", "stream": "0X0"})
    assert r.to_dict() == expected
    assert list(r.to_dict()) == list(FIELD_NAMES)


def test_field_names_are_the_contract():
    assert FIELD_NAMES == (
        "line", "time", "pid", "level", "kind", "function", "a_type", "b_type", "c_type", "d_type",
        "compute_type", "scale_type", "op_a", "op_b", "m", "n", "k", "lda", "ldb", "ldc", "ldd",
        "batch_count", "epilogue", "algo_id", "tile", "algo_stages", "cluster", "num_splits_k", "reduction_scheme",
        "custom_option", "cta_swizzling", "workspace_bytes", "beta_value", "out_of_place", "sm_count_target",
        "torch_m", "torch_n", "torch_k", "known_issue", "file", "message", "extra")
    assert LogRecord.__slots__  # a slots dataclass
    assert dataclasses.is_dataclass(LogRecord)


def test_legacy_line_defaults_and_sm_count():
    r = parse_line(LEGACY_LINE)
    assert (r.function, r.kind, r.m, r.n, r.k, r.op_a, r.op_b) == ("cublasLtSSSMatmul", "trace",
                                                                       4096, 1, 4096, "N", "N")
    assert (r.algo_id, r.custom_option, r.sm_count_target) == (13, 100, 132)
    # cuBLASLt prints only non-default config values: the absent ones take the enum's zero value
    assert (r.tile, r.algo_stages, r.cluster, r.num_splits_k, r.reduction_scheme, r.cta_swizzling) == (
        "UNDEFINED", "UNDEFINED", "AUTO", 1, "NONE", 0)
    assert r.workspace_bytes == 0 and r.extra["workSpace"] == "0X0"


def test_problem_size_falls_back_to_d():
    r = parse_line(REF_LINE.replace("rows=4096 cols=16", "rows=4x96 cols=16", 1))  # B rows damaged
    assert (r.m, r.n, r.k) == (4096, 16, 4096) and r.extra["Bdesc.rows"] == "4x96"


def test_batched_line():
    r = parse_line(BATCHED_LINE)
    assert (r.batch_count, r.m, r.n, r.k) == (4, 4096, 1, 4096)
    assert r.extra["Adesc.stridedBatchOffset"] == "16777216"
    assert r.extra["Bdesc.stridedBatchOffset"] == "4096"
    assert not any(k.endswith("batchCount") for k in r.extra)  # all equal: no duplicate


def test_fp8_line_types_and_scale_pointers():
    r = parse_line(FP8_LINE)
    assert (r.a_type, r.b_type, r.c_type, r.d_type) == ("R_8F_E4M3", "R_8F_E4M3", "R_16BF", "R_16BF")
    assert r.dtypes == {"a": "fp8_e4m3", "b": "fp8_e4m3", "c": "bf16", "d": "bf16", "compute": "fp32",
                        "scale": "fp32"}
    assert r.out_of_place is True
    assert r.extra["computeDesc.aScalePointer"] == "0x7fe967e07000"
    assert (r.algo_stages, r.cluster) == ("128xAUTO", "4x1x1")


def test_api_heuristic_line_preference():
    r = parse_line(API_LINE)
    assert (r.kind, r.level, r.function) == ("api", 5, "cublasLtTSTMatmulAlgoGetHeuristic")
    assert (r.m, r.n, r.k, r.op_a) == (4096, 1, 4096, "T")
    assert (r.workspace_bytes, r.sm_count_target) == (33554432, 132)
    assert r.extra["preference.minBytesAlignmentA"] == "16"
    assert r.extra["preference.implMask"] == "18446744069414584319"
    assert r.algo_id is None and r.num_splits_k is None  # a query has no algo yet


def test_info_lines():
    r = parse_line(INFO_LINE)
    assert (r.kind, r.level, r.extra) == ("info", 4, {"heuristicResults": "66"})
    free = parse_line(INFO_TEXT_LINE)
    assert free.kind == "info" and free.message == "Discovered per-ctx shared memory size limit = 0"
    assert free.extra == {} and free.m is None


def test_api_call_line_keys_go_to_extra():
    r = parse_line(API_CALL_LINE)
    assert r.kind == "api" and r.extra == {"matmulDesc": "0X2781AC90", "attr": "MATMUL_DESC_TRANSA",
                                           "buf": "0X7FFDD37AA50C", "sizeInBytes": "4"}


def test_unknown_keys_are_kept_verbatim():
    line = REF_LINE.replace("numSplitsK=2", "numSplitsK=2 innerShape=MATMUL_INNER_SHAPE_MMA884 newKey=7") \
        .replace(" stream=0X0", " stream=0X0 future=[a=1 b=[c=2]]")
    r = parse_line(line)
    assert r.extra["algo.innerShape"] == "MATMUL_INNER_SHAPE_MMA884"
    assert r.extra["algo.newKey"] == "7"
    assert r.extra["future.a"] == "1" and r.extra["future.b.c"] == "2"
    assert (r.num_splits_k, r.algo_id) == (2, 66)


def test_unparseable_known_value_goes_to_extra():
    line = LEGACY_LINE.replace("beta=0", "beta=?")  # seen in level2_mixed.log for tiny GEMMs
    r = parse_line(line)
    assert r.beta_value is None and r.extra["beta"] == "?"


@pytest.mark.parametrize("line,reason", [
    ("", None),
    ("hello world", "not a cuBLASLt log line"),
    ("I! cuBLAS (v13.1.0) function cublasStatus_t cublasCreate_v2(cublasContext**) called:", None),
    ("[2026-11-30 03:21:52][cublasLt][479][Trace]", "damaged cuBLASLt line prefix"),
    (REF_LINE[:300], "line ends inside '[...]' (truncated?)"),
    (REF_LINE.split(" algo=")[0], "matmul trace without algo=[...] (truncated?)"),
    (REF_LINE.replace("rows=4096", "rows=4x96"),
     "matmul trace without a complete problem size (Adesc/Bdesc rows, cols)"),
    (REF_LINE.replace("] B=", "]] B=", 1), f"unbalanced ']' at column {REF_LINE.index('] B=') + 2}"),
])
def test_bad_and_skipped_lines(line, reason):
    st = ParseStats()
    assert parse_line(line, 3, stats=st) is None
    if reason is None:
        assert (st.skipped, st.bad) == (1, 0)
    else:
        assert (st.skipped, st.bad) == (0, 1)
        assert st.bad_lines[0].line == 3 and st.bad_lines[0].reason == reason


@pytest.mark.parametrize("body,expected", [
    ("", []),
    ("a=1", [("a", "1")]),
    ("a= b=2", [("a", ""), ("b", "2")]),
    ("d=[x=2 y=3] e=[]", [("d", [("x", "2"), ("y", "3")]), ("e", [])]),
    ("n=[p=[q=1] z=[1 2]]", [("n", [("p", [("q", "1")]), ("z", "1 2")])]),
    ("  heuristicResults=[66]", [("heuristicResults", "66")]),
    ("v=(1,0) w=a=b", [("v", "(1,0)"), ("w", "a=b")]),
])
def test_scan(body, expected):
    assert scan(body) == expected


@pytest.mark.parametrize("body", ["x=[1", "x=1]", "free text", "a=[b=[c=1]", "a=[[1]]", "=1", "a=1 [b=2]"])
def test_scan_rejects(body):
    with pytest.raises(logs.parser.DamagedLine):
        scan(body)


def test_parse_message_from_logger_callback():
    body = REF_LINE.split("] ", 1)[1]
    r = parse_message(2, "cublasLtMatmul", body, line=5)
    assert (r.kind, r.function, r.m, r.n, r.k, r.tile, r.line, r.time, r.pid) == (
        "trace", "cublasLtMatmul", 4096, 16, 4096, "64x16", 5, None, None)
    full = parse_message(2, "ignored", REF_LINE)  # a whole formatted line works too
    assert (full.function, full.pid, full.time) == ("cublasLtMatmul", 479, "2026-11-30 03:21:52")
    assert parse_message("Trace", "cublasLtMatmul", body[:200]) is None


# --- type names -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("name,short", [
    ("R_16BF", "bf16"), ("R_16F", "fp16"), ("R_32F", "fp32"), ("COMPUTE_32F", "fp32"),
    ("COMPUTE_32F_FAST_TF32", "tf32"), ("R_8F_E4M3", "fp8_e4m3"), ("R_8F_E5M2", "fp8_e5m2"),
    ("CUDA_R_16BF", "bf16"), ("CUBLAS_COMPUTE_32F", "fp32"), ("R_99X", "R_99X"), (None, None),
])
def test_short_dtype(name, short):
    assert short_dtype(name) == short


# --- streams, sources and the caches --------------------------------------------------------------------

REAL_LINES = [REF_LINE, LEGACY_LINE, BATCHED_LINE, FP8_LINE]


def _same(a: LogRecord, b: LogRecord) -> None:
    assert a.to_dict() == b.to_dict()


def test_fast_constructor_matches_init():
    r = parse_line(REF_LINE, 3)
    fast = _fast_record(3, r.time, _template(r), r.extra)
    assert fast.extra is not r.extra
    assert fast == r and type(fast) is LogRecord
    assert pickle.loads(pickle.dumps(fast)) == r


def test_cached_records_equal_fresh_parses():
    # repeats (whole-line cache), new timestamps (after-timestamp cache), new pointers (pointer cache)
    lines = []
    for i in range(3):
        for line in REAL_LINES:
            lines.append(line)
            lines.append(line.replace(":52]", f":5{i}]").replace(":56]", f":5{i}]").replace(":05]", f":0{i}]"))
            lines.append(line.replace("0X7F", f"0X{i}F").replace("0x7f", f"0x{i}f"))
    st = ParseStats()
    got = list(parse_log([x + "\n" for x in lines], stats=st))
    assert len(got) == len(lines) and st.bad == 0
    for i, (rec, line) in enumerate(zip(got, lines), 1):
        _same(rec, parse_line(line, i))
    # records from the cache do not share their extra dict
    got[0].extra["mine"] = "1"
    assert "mine" not in got[3 * len(REAL_LINES)].extra


def test_records_are_independent_objects():
    got = list(parse_log([REF_LINE + "\n"] * 3))
    got[0].m = 1
    assert got[1].m == 4096


def test_sources_path_gz_text_binary_iterable(tmp_path):
    text = "\n".join(REAL_LINES) + "\n"
    plain = tmp_path / "a.log"
    plain.write_text(text)
    gz = tmp_path / "a.log.gz"
    gz.write_bytes(gzip.compress(text.encode()))
    nosuffix = tmp_path / "gzipped_without_suffix"
    nosuffix.write_bytes(gzip.compress(text.encode()))
    want = [parse_line(x, i, source=None).to_dict() for i, x in enumerate(REAL_LINES, 1)]

    def strip(recs):
        return [dict(r.to_dict(), file=None) for r in recs]

    assert strip(parse_log(plain)) == want
    assert strip(parse_log(str(gz))) == want
    assert strip(parse_log(nosuffix)) == want
    assert [r.file for r in parse_log(plain)] == [str(plain)] * 4
    with open(plain) as f:
        assert strip(parse_log(f)) == want
    with open(plain, "rb") as f:
        assert strip(parse_log(f)) == want
        assert not f.closed  # the caller's file stays open
    assert strip(parse_log(io.BytesIO(text.encode()))) == want
    assert strip(parse_log(text.splitlines())) == want
    assert strip(parse_log([x.encode() for x in text.splitlines()])) == want


def test_crlf_and_missing_final_newline():
    data = ("\r\n".join(REAL_LINES)).encode()
    recs = list(parse_log(io.BytesIO(data)))
    assert [r.line for r in recs] == [1, 2, 3, 4]
    assert all(not r.message.endswith(("\r", "\n")) for r in recs)
    assert recs[-1].extra["stream"] == "0X0"


def test_api_flag_selects_kinds():
    lines = [API_LINE, INFO_LINE, REF_LINE, API_CALL_LINE, INFO_TEXT_LINE]
    st = ParseStats()
    assert [r.kind for r in parse_log(lines, stats=st)] == ["trace"]
    assert (st.records, st.skipped, st.bad) == (1, 4, 0)
    assert [r.kind for r in parse_log(lines, api=True)] == ["api", "info", "trace", "api", "info"]


def test_stats_and_report():
    st = ParseStats(max_examples=2)
    lines = [REF_LINE, "junk 1", "", "junk 2", REF_LINE[:100], REF_LINE]
    recs = list(parse_log(lines, stats=st, name="x.log"))
    assert [r.line for r in recs] == [1, 6]
    assert (st.lines, st.records, st.skipped, st.bad) == (6, 2, 1, 3)
    assert [b.line for b in st.bad_lines] == [2, 4]
    assert st.report() == [
        "read 1 file, 6 lines: 2 records, 1 skipped, 3 bad",
        "bad line x.log:2: not a cuBLASLt log line: 'junk 1'",
        "bad line x.log:4: not a cuBLASLt log line: 'junk 2'",
        "... and 1 more bad lines",
    ]


def test_stats_updated_when_stopped_early():
    st = ParseStats()
    it = parse_log([REF_LINE] * 10, stats=st)
    next(it)
    next(it)
    it.close()
    assert (st.lines, st.records) == (2, 2)


def test_missing_file_and_directory_raise_probe_error(tmp_path):
    with pytest.raises(LogReadError, match="cannot read .*nope.log: no such file"):
        list(parse_log(tmp_path / "nope.log"))
    with pytest.raises(ProbeError, match="is a directory"):
        list(parse_log(tmp_path))


def test_truncated_gzip_keeps_the_records_before_the_cut(tmp_path):
    data = gzip.compress(("\n".join([REF_LINE] * 200) + "\n").encode())
    p = tmp_path / "cut.log.gz"
    p.write_bytes(data[: len(data) // 2])
    st = ParseStats()
    recs = list(parse_logs([p], stats=st))
    assert len(recs) == st.records and st.records > 0
    assert st.files_failed and "broken gzip" in st.files_failed[0][1]


def test_parse_logs_merges_and_skips_unreadable(tmp_path):
    a, b = tmp_path / "app_1.log", tmp_path / "app_2.log"
    a.write_text(REF_LINE + "\n")
    b.write_text(LEGACY_LINE + "\n" + BATCHED_LINE + "\n")
    st = ParseStats()
    recs = list(parse_logs([a, tmp_path / "missing.log", tmp_path, b], stats=st))
    assert [(r.file, r.line, r.pid) for r in recs] == [(str(a), 1, 479), (str(b), 1, 479),
                                                         (str(b), 2, 519)]
    assert st.files_read == [str(a), str(b)]
    assert [p for p, _ in st.files_failed] == [str(tmp_path / "missing.log"), str(tmp_path)]
    with pytest.raises(LogReadError, match="no log could be read"):
        list(parse_logs([tmp_path / "missing.log"]))


def test_load_log(tmp_path):
    recs, st = load_log(REAL_LINES)
    assert len(recs) == 4 and st.records == 4
    p = tmp_path / "x.log"
    p.write_text(REF_LINE + "\n")
    recs, st = load_logs([p, p])
    assert len(recs) == 2 and st.files_read == [str(p), str(p)]


# --- frames ---------------------------------------------------------------------------------------------

def test_records_to_frame_schema():
    df = records_to_frame(parse_log(REAL_LINES + [API_LINE], api=True))
    assert list(df.columns) == list(FIELD_NAMES)
    assert str(df["m"].dtype) == "Int64" and str(df["algo_id"].dtype) == "Int64"
    assert str(df["tile"].dtype) == "category"
    assert str(df["time"].dtype).startswith("datetime64")
    assert df.loc[4, "algo_id"] is __import__("pandas").NA
    assert df.loc[0, "extra"].startswith('{"A":"0X7F0118000000"')
    empty = records_to_frame([])
    assert list(empty.columns) == list(FIELD_NAMES) and len(empty) == 0


def test_summarize_counts_identical_gemms():
    lines = [REF_LINE] * 3 + [LEGACY_LINE] * 5 + [REF_LINE.replace("0X7F01", "0X1111")] + [FP8_LINE]
    s = summarize(records_to_frame(parse_log(lines)))
    assert list(s["count"]) == [5, 4, 1]
    assert list(s["function"]) == ["cublasLtSSSMatmul", "cublasLtMatmul", "cublasLtMatmul"]
    assert list(s["first_line"]) == [4, 1, 10]
    assert s["share"].sum() == pytest.approx(1.0)
    assert (s.loc[1, "torch_m"], s.loc[1, "torch_n"], s.loc[1, "torch_k"]) == (16, 4096, 4096)
    # a different algo for the same problem is another row
    other = REF_LINE.replace("algoId=66", "algoId=67")
    assert len(summarize(parse_log([REF_LINE, other]))) == 2
    assert len(summarize([])) == 0


def test_lazy_pandas_import():
    import subprocess
    import sys
    code = ("import sys; from cublaslt_probe.logs import parse_log; "
            "print('pandas' in sys.modules)")
    root = __import__("pathlib").Path(__file__).resolve().parent.parent
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root)
    assert out.stdout.strip() == "False"


def test_top_level_exports():
    import cublaslt_probe
    assert cublaslt_probe.parse_log is parse_log
    assert cublaslt_probe.parse_cublas_log is logs.parse_cublas_log


def test_one_pass_tokenizer_equals_scanner(fixtures):
    """`_assign_fast` (split on spaces) gives what `scan` + `_assign_pairs` give, on every real line."""
    from cublaslt_probe.logs.parser import _PREFIX, _assign_fast, _assign_pairs, _flatten_tree
    bodies = []
    for p in sorted((fixtures / "logs").glob("*.log")):
        for line in p.read_text().splitlines():
            m = _PREFIX.match(line)
            if m:
                bodies.append(line[m.end():])
    bodies += ["a=1 a=2 e=[] n=[p=[q=1] z=[y=]] w=a=b", "x=[]]", "r=[66 12]", "a=\t1"]
    fast_used = 0
    for body in bodies:
        fast = _assign_fast(body)
        try:
            tree = scan(body)
        except logs.parser.DamagedLine:
            assert fast is None, body
            continue
        pairs, groups = [], []
        _flatten_tree(tree, "", pairs, groups)
        if fast is not None:
            fast_used += 1
            assert fast == (*_assign_pairs(pairs), groups), body
    assert fast_used > 500


def test_lone_cr_is_not_a_line_break(tmp_path):
    """Line numbers count "\\n" only (as wc -l, grep -n and sed do); a CR inside a line keeps its GEMM."""
    split = REF_LINE.replace(" B=0X", "\rB=0X", 1)
    p = tmp_path / "cr.log"
    p.write_bytes(("\n".join([LEGACY_LINE, split, BATCHED_LINE + "\r", REF_LINE]) + "\n").encode())
    st = ParseStats()
    recs = list(parse_log(p, stats=st))
    assert [r.line for r in recs] == [1, 2, 3, 4]
    assert (st.lines, st.bad) == (4, 0)
    assert (recs[1].m, recs[1].n, recs[1].k, recs[1].tile) == (4096, 16, 4096, "64x16")
    assert recs[1].extra["B"] == "0X7F0133E00000"
    assert recs[2].to_dict() == parse_line(BATCHED_LINE, 3, source=str(p)).to_dict()


@pytest.mark.parametrize("spelling, letter",
                         [("T", "T"), ("N", "N"), ("C", "C"), ("HERMITAN", "C"), ("CONJG", "CONJG")])
def test_both_logs_read_every_op_spelling_as_one_letter(spelling, letter):
    """One table (`logs.record.OP_LETTERS`) reads the transpose of both logs: the captured cuBLASLt line
    (``transa=OP_T``) and the captured cuBLAS call (``CUBLAS_OP_T(1)``) with the op re-spelled, HERMITAN (cuBLAS's
    other name for C) and CONJG included."""
    from pathlib import Path
    logs_dir = Path(__file__).parent / "fixtures" / "logs"
    lt_line = next(x for x in open(logs_dir / "level2_torchlt.log") if "transa=OP_T" in x)
    assert parse_line(lt_line.replace("transa=OP_T", f"transa=OP_{spelling}")).op_a == letter
    text = open(logs_dir / "cublas_api.log").read().replace("val=CUBLAS_OP_T(1)", f"val=CUBLAS_OP_{spelling}(1)")
    calls = [c for c in logs.parse_cublas_log(io.StringIO(text)) if c.value("transa") is not None]
    assert calls and {c.op_a for c in calls} >= {letter}
