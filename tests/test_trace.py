"""`cublaslt_probe.analysis.trace` and `cublaslt-probe trace`.

Two kinds of input:
- the real torch.profiler traces captured on the H200 (tests/fixtures/traces/, see its PROVENANCE); the
  tests on them skip, saying why, until those files exist;
- small traces each test builds in tmp_path from the documented Kineto Chrome-trace format (event fields as
  torch.profiler writes them) with real kernel names from tests/fixtures/names. They are labelled
  synthetic and never stored: they exist to pin the parser's edge cases (chunk boundaries, gzip, malformed
  and cut-off files) and the linking rules exactly.
The Nsight Systems reader is tested only on an SQLite file built here with the documented schema: no real
nsys export can be captured on the project's GPU machine.
"""
from __future__ import annotations

import gzip
import json
import sqlite3

import pandas as pd
import pytest
from click.testing import CliRunner
from conftest import FIXTURES
from hypothesis import given, settings
from hypothesis import strategies as st

from cublaslt_probe.analysis.trace import (
    TIMELINE_SCHEMA,
    TRACE_COLUMNS,
    by_kernel,
    classify,
    iter_chrome_events,
    problem_of,
    read_chrome_trace,
    read_nsys_sqlite,
    read_trace,
    timeline_groups,
    timeline_sentence,
)
from cublaslt_probe.analysis.trace.schema import kernel_kind
from cublaslt_probe.cli import main
from cublaslt_probe.errors import ProbeError
from cublaslt_probe.names import decode

TRACES = FIXTURES / "traces"
NAMES = [json.loads(x)["kernel"] for x in (FIXTURES / "names" / "names.jsonl").read_text().splitlines()]
NVJET = "nvjet_sm90_tst_64x8_64x16_2x1_v_bz_splitK_NNT"
NVJET_FP8 = "nvjet_sm90_qqtst_64x8_128x16_4x1_v_bz_algo2_TNT"
CUTLASS = ("void cutlass::Kernel2<cutlass_80_simt_sgemm_64x64_8x5_nn_align1>"
           "(cutlass_80_simt_sgemm_64x64_8x5_nn_align1::Params)")
REDUCE = next(n for n in NAMES if "splitKreduce" in n)
ELEMENTWISE = ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
               "std::array<char*, 1ul> >(int, at::native::FillFunctor<float>, std::array<char*, 1ul>)")
assert all(n in NAMES for n in (NVJET, NVJET_FP8, CUTLASS))


# ------------------------------------------------------------------------------ synthetic trace builder
def op(ext, name, dims=None, types=None, strides=None, ts=0.0):
    args = {"External id": ext, "Record function id": 0, "Ev Idx": ext}
    if dims is not None:
        args.update({"Input Dims": dims, "Input type": types, "Input Strides": strides,
                     "Concrete Inputs": [""] * len(dims)})
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 100, "tid": 100, "ts": ts, "dur": 5.0, "args": args}


def runtime(ext, corr, ts=0.0):
    return {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 100, "tid": 100, "ts": ts,
            "dur": 3.0, "args": {"External id": ext, "cbid": 211, "correlation": corr}}


def kernel(name, dur, ts, ext=None, corr=None, stream=7):
    args = {"queued": 0, "device": 0, "context": 1, "stream": stream, "registers per thread": 168,
            "shared memory": 0, "grid": [1, 2, 1], "block": [384, 1, 1]}
    if ext is not None:
        args["External id"] = ext
    if corr is not None:
        args["correlation"] = corr
    return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur, "args": args}


def flow(corr, ts):
    return {"ph": "f", "id": corr, "pid": 0, "tid": 7, "ts": ts, "cat": "ac2g", "name": "ac2g", "bp": "e"}


BF16 = ["c10::BFloat16", "c10::BFloat16"]


def synthetic_events():
    """A forward linear (addmm with split-K + reduce), an mm, a bmm, an fp8 _scaled_mm and a fill."""
    return [
        op(1, "aten::addmm", [[4096], [16, 4096], [4096, 4096], [], []],
           ["c10::BFloat16", "c10::BFloat16", "c10::BFloat16", "Scalar", "Scalar"],
           [[1], [4096, 1], [1, 4096], [], []], ts=1.0),
        runtime(1, 11, ts=2.0), runtime(1, 12, ts=3.0),
        op(2, "aten::mm", [[16, 4096], [4096, 4096]], BF16, [[4096, 1], [4096, 1]], ts=10.0),
        runtime(2, 21, ts=11.0),
        op(3, "aten::bmm", [[8, 128, 64], [8, 64, 256]], ["c10::Half", "c10::Half"],
           [[8192, 64, 1], [16384, 1, 64]], ts=20.0),
        runtime(3, 31, ts=21.0),
        op(4, "aten::_scaled_mm", [[64, 4096], [4096, 1024], [], [], [], [], [], []],
           ["c10::Float8_e4m3fn", "c10::Float8_e4m3fn", "float", "float", "", "", "ScalarType", "bool"],
           [[4096, 1], [1, 4096], [], [], [], [], [], []], ts=30.0),
        runtime(4, 41, ts=31.0),
        op(5, "aten::fill_", [[1]], ["float"], [[1]], ts=40.0),
        runtime(5, 51, ts=41.0),
        kernel(NVJET, 8.0, 100.0, 1, 11), kernel(REDUCE, 2.0, 108.5, 1, 12),
        kernel(NVJET, 6.0, 120.0, 2, 21), kernel(REDUCE, 1.0, 126.5, None, 22),   # unlinked reduce
        kernel(CUTLASS, 30.0, 130.0, None, 31),         # linked through the runtime call only
        kernel(NVJET_FP8, 4.0, 170.0, 4, 41, stream=9),
        kernel(ELEMENTWISE, 49.0, 180.0, 5, 51),
        flow(11, 100.0), flow(21, 120.0),
    ]


def write_trace(path, events, *, indent=1, gz=False, head=None, tail=None):
    """Write a synthetic trace in Kineto's object layout (keys before and after traceEvents)."""
    doc = dict(head if head is not None else {"schemaVersion": 1,
                                              "deviceProperties": [{"id": 0, "name": "NVIDIA H200"}]})
    doc["traceEvents"] = events
    doc.update(tail if tail is not None else {"traceName": "synthetic", "displayTimeUnit": "ms"})
    text = json.dumps(doc, indent=indent)
    if gz:
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def synth(tmp_path):
    return write_trace(tmp_path / "synthetic.json", synthetic_events())


# ----------------------------------------------------------------------------------------- the parser
@pytest.mark.parametrize("chunk", [1, 7, 64, 4096, 1 << 22])
@pytest.mark.parametrize("indent", [None, 2])
@pytest.mark.parametrize("gz", [False, True])
def test_stream_equals_json_load(tmp_path, chunk, indent, gz):
    evs = synthetic_events() + [{"name": "quote \" brace }, { and ünïcode ✓", "ph": "i", "args": {"x": [1e-3, -2,
                                                                                                      None, True]}}]
    p = write_trace(tmp_path / ("t.json.gz" if gz else "t.json"), evs, indent=indent, gz=gz)
    meta = {}
    got = list(iter_chrome_events(p, meta, chunk_bytes=chunk))
    assert got == evs
    assert meta == {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H200"}],
                    "traceName": "synthetic", "displayTimeUnit": "ms"}


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
                           lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
                           max_leaves=12)


@settings(max_examples=150, deadline=None)
@given(events=st.lists(st.dictionaries(st.text(max_size=10), json_values, max_size=5), max_size=8),
       chunk=st.integers(1, 200), indent=st.sampled_from([None, 0, 2]))
def test_stream_equals_json_load_on_any_events(tmp_path_factory, events, chunk, indent):
    p = tmp_path_factory.mktemp("h") / "t.json"
    p.write_text(json.dumps({"a": [1, {"b": "}, {"}], "traceEvents": events, "z": 2.5}, indent=indent))
    meta = {}
    assert list(iter_chrome_events(p, meta, chunk_bytes=chunk)) == events
    assert meta == {"a": [1, {"b": "}, {"}], "z": 2.5}


def test_bare_array_and_trailing_comma(tmp_path):
    evs = synthetic_events()
    p = tmp_path / "a.json"
    p.write_text(json.dumps(evs)[:-1] + ",\n]")
    assert list(iter_chrome_events(p, chunk_bytes=16)) == evs


def test_malformed_event_is_skipped_and_counted(tmp_path, caplog):
    evs = synthetic_events()
    text = json.dumps({"traceEvents": evs}, indent=1)
    bad = text.replace('"name": "aten::mm"', '"name": aten::mm', 1)
    p = tmp_path / "bad.json"
    p.write_text(bad)
    s = read_chrome_trace(p, chunk_bytes=32)
    assert s.stats.bad_events == 1 and not s.stats.truncated
    assert s.stats.events == len(evs) - 1
    assert "malformed event skipped" in caplog.text
    # the mm's kernel lost its op; everything else is unchanged
    assert s.kernels[s.kernels.op == "aten::mm"].empty
    assert s.stats.kernels == 7


def test_cut_off_file_keeps_the_events_before_the_cut(tmp_path, caplog):
    evs = synthetic_events()
    text = json.dumps({"traceEvents": evs}, indent=1)
    cut = text.index('"name": "' + CUTLASS[:20])        # inside the cutlass kernel event
    p = tmp_path / "cut.json.gz"
    with gzip.open(p, "wt") as f:
        f.write(text[:cut])
    got = list(iter_chrome_events(p, chunk_bytes=50))
    assert got == evs[:len(got)] and len(got) == evs.index(next(e for e in evs if e.get("name") == CUTLASS))
    s = read_trace(p)
    assert s.stats.truncated and "cut off" in caplog.text


def test_cut_gzip_stream_is_truncated_not_an_error(tmp_path):
    p = write_trace(tmp_path / "t.json.gz", synthetic_events(), gz=True)
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 2])
    s = read_trace(p)
    assert s.stats.truncated and s.stats.events < len(synthetic_events())


@pytest.mark.parametrize("content,msg", [
    ('{"schemaVersion": 1, "traceName": "x"}', "no traceEvents array"),
    ("hello", "not a Chrome trace"),
    ('"just a string"', "not a Chrome trace"),
])
def test_not_a_trace(tmp_path, content, msg):
    p = tmp_path / "x.json"
    p.write_text(content)
    with pytest.raises(ProbeError, match=msg):
        read_trace(p)


def test_missing_file_and_nsys_report(tmp_path):
    with pytest.raises(ProbeError, match="cannot read trace .*nope.json"):
        read_trace(tmp_path / "nope.json")
    rep = tmp_path / "x.nsys-rep"
    rep.write_bytes(b"\x00binary report")
    with pytest.raises(ProbeError, match="nsys export --type sqlite"):
        read_trace(rep)


# ------------------------------------------------------------------------------------------- linking
def test_synthetic_summary(synth):
    s = read_trace(synth)
    df = s.kernels
    assert list(df.columns) == TRACE_COLUMNS
    assert s.gpu_time_us == 8 + 2 + 6 + 1 + 30 + 4 + 49
    assert s.device == "NVIDIA H200"
    st_ = s.stats
    assert (st_.kernels, st_.gemm_launches, st_.reduce_launches, st_.reduce_attached) == (7, 4, 2, 2)
    assert (st_.linked, st_.with_shapes, st_.cpu_ops, st_.flows) == (4, 4, 5, 2)
    rows = {(r.kernel, r.op): r for r in df.itertuples(index=False)}
    assert len(rows) == 4
    # split-K reduce with the same External id: counted with its GEMM
    addmm = rows[(NVJET, "aten::addmm")]
    assert (addmm.count, addmm.total_us, addmm.reduce_us) == (1, 10.0, 2.0)
    assert (addmm.dtype, addmm.layout, addmm.m, addmm.n, addmm.k, addmm.batch) == ("bf16", "NT", 16, 4096, 4096, 1)
    assert addmm.input_dims == "[[4096], [16, 4096], [4096, 4096], [], []]"
    # a reduce without External id: the GEMM launched before it on its stream
    mm = rows[(NVJET, "aten::mm")]
    assert (mm.total_us, mm.reduce_us, mm.layout) == (7.0, 1.0, "NN")
    # kernel without External id: linked through its runtime call's correlation
    bmm = rows[(CUTLASS, "aten::bmm")]
    assert (bmm.dtype, bmm.layout, bmm.batch, bmm.m, bmm.n, bmm.k) == ("fp16", "NT", 8, 128, 256, 64)
    fp8 = rows[(NVJET_FP8, "aten::_scaled_mm")]
    assert (fp8.dtype, fp8.layout, fp8.m, fp8.n, fp8.k) == ("fp8", "NT", 64, 1024, 4096)
    assert fp8.family == "nvjet" and fp8.types == "qqtst" and fp8.tile_n == 8
    assert df.share.tolist() == pytest.approx([30 / 100, 10 / 100, 7 / 100, 4 / 100])
    assert df.total_us.is_monotonic_decreasing
    fam = s.families.set_index("family")
    assert fam.loc["framework", "total_us"] == 49 and fam.loc["splitk_reduce", "launches"] == 2


def test_reduce_of_another_op_is_not_attached(tmp_path):
    evs = [op(1, "aten::mm", [[16, 64], [64, 64]], BF16, [[64, 1], [64, 1]]),
           op(2, "aten::add", [[16, 64]], ["c10::BFloat16"], [[64, 1]]),
           kernel(NVJET, 5.0, 10.0, 1, 1), kernel(REDUCE, 1.0, 16.0, 2, 2)]
    s = read_trace(write_trace(tmp_path / "t.json", evs))
    assert s.stats.reduce_attached == 0
    assert set(s.kernels.family.astype(str)) == {"nvjet", "splitk_reduce"}
    assert s.kernels.set_index("family").loc["splitk_reduce", "op"] == "aten::add"


def test_trace_without_shapes_or_ops(tmp_path):
    evs = [kernel(NVJET, 5.0, 10.0), kernel(NVJET, 7.0, 20.0), kernel(ELEMENTWISE, 8.0, 30.0)]
    s = read_trace(write_trace(tmp_path / "t.json", evs))
    (r,) = s.kernels.itertuples(index=False)
    assert (r.count, r.total_us, r.min_us, r.max_us, r.share) == (2, 12.0, 5.0, 7.0, 0.6)
    assert pd.isna(r.op) and pd.isna(r.m) and pd.isna(r.input_dims)


def test_empty_trace(tmp_path):
    s = read_trace(write_trace(tmp_path / "t.json", []))
    assert s.kernels.empty and list(s.kernels.columns) == TRACE_COLUMNS and s.gpu_time_us == 0
    assert by_kernel(s.kernels).empty


def test_by_kernel_sums_the_shape_rows(synth):
    s = read_trace(synth)
    k = by_kernel(s.kernels).set_index("kernel")
    assert k.loc[NVJET, "count"] == 2 and k.loc[NVJET, "total_us"] == 17.0
    assert k.loc[NVJET, "ops"] == "aten::addmm, aten::mm" and k.loc[NVJET, "shapes"] == 2
    assert k.loc[NVJET, "share"] == pytest.approx(0.17)


@pytest.mark.parametrize("opname,dims,types,strides,want", [
    ("aten::mm", [[16, 4096], [4096, 4096]], BF16, [[4096, 1], [1, 4096]],
     dict(m=16, n=4096, k=4096, batch=1, dtype="bf16", layout="NT")),
    ("aten::mm", [[4096, 16], [4096, 4096]], BF16, [[1, 4096], [4096, 1]],
     dict(m=4096, n=4096, k=16, batch=1, dtype="bf16", layout="TN")),
    ("aten::mm", [[64, 32], [32, 128]], ["float", "float"], [[1, 64], [1, 32]],
     dict(m=64, n=128, k=32, batch=1, dtype="fp32", layout="TT")),
    ("aten::mm", [[1, 32], [32, 1]], ["c10::Half", "c10::Half"], [[32, 1], [1, 1]],
     dict(m=1, n=1, k=32, batch=1, dtype="fp16", layout="NN")),
    ("aten::_scaled_mm", [[64, 4096], [4096, 1024]], ["c10::Float8_e5m2", "c10::Float8_e4m3fn"],
     [[4096, 1], [1, 4096]], dict(m=64, n=1024, k=4096, batch=1, dtype="fp8_e5m2", layout="NT")),
    ("aten::baddbmm", [[4, 8, 16], [4, 8, 32], [4, 32, 16], [], []], ["float"] * 3 + ["Scalar"] * 2,
     [[128, 16, 1], [256, 32, 1], [512, 16, 1], [], []], dict(m=8, n=16, k=32, batch=4, dtype="fp32", layout="NN")),
    ("aten::mm", [[16, 64], [64, 64]], BF16, None, dict(m=16, n=64, k=64, batch=1, dtype="bf16", layout=None)),
    ("aten::add", [[16, 64]], ["float"], [[64, 1]], {}),
    ("aten::mm", None, None, None, {}),
    # grouped GEMMs: the Mixtral experts' gate/up projection of tests/fixtures/programs/mixtral_moe (2-D x 3-D,
    # offsets split M), and torch's other three conventions
    ("aten::_grouped_mm", [[4096, 4096], [8, 4096, 28672], [8], [], []], ["c10::BFloat16", "c10::BFloat16", "int",
     "", ""], [[4096, 1], [117440512, 1, 4096], [1], [], []],
     dict(m=4096, n=28672, k=4096, batch=1, groups=8, group_dim="m", dtype="bf16", layout="NT")),
    ("aten::_grouped_mm", [[8, 64, 128], [128, 512], [8]], BF16 + ["int"], [[8192, 128, 1], [512, 1], [1]],
     dict(m=64, n=512, k=128, batch=1, groups=8, group_dim="n", dtype="bf16", layout="NN")),
    ("aten::_grouped_mm", [[64, 1024], [1024, 32], [4]], BF16 + ["int"], [[1024, 1], [32, 1], [1]],
     dict(m=64, n=32, k=1024, batch=1, groups=4, group_dim="k", dtype="bf16", layout="NN")),
    ("aten::_grouped_mm", [[4, 16, 32], [4, 32, 8]], BF16, [[512, 32, 1], [256, 8, 1]],
     dict(m=16, n=8, k=32, batch=4, groups=4, group_dim=None, dtype="bf16", layout="NN")),
    ("aten::_grouped_mm", [[64, 1024], [1024, 32], []], BF16 + ["int"], [[1024, 1], [32, 1], []], {}),
])
def test_problem_of(opname, dims, types, strides, want):
    js = (lambda v: None if v is None else json.dumps(v))
    assert problem_of(opname, js(dims), js(types), js(strides)) == want


# ------------------------------------------------------------------------------------- Nsight Systems
def build_nsys(path, rows):
    """An SQLite file with the tables and columns of an `nsys export --type sqlite` (the documented
    schema, only the columns the reader uses). Built by the test: not an export of a real capture."""
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE StringIds (id INTEGER NOT NULL PRIMARY KEY, value TEXT NOT NULL)")
    con.execute("CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER NOT NULL, end INTEGER NOT NULL, "
                "deviceId INTEGER NOT NULL, contextId INTEGER, streamId INTEGER NOT NULL, correlationId INTEGER, "
                "globalPid INTEGER, demangledName INTEGER NOT NULL, shortName INTEGER NOT NULL, "
                "mangledName INTEGER, gridX INTEGER, blockX INTEGER)")
    ids = {}
    for name in dict.fromkeys(r[3] for r in rows):
        ids[name] = len(ids) + 1
        con.execute("INSERT INTO StringIds VALUES (?, ?)", (ids[name], name))
        short = decode(name).base or name
        if short not in ids:
            ids[short] = len(ids) + 1000
            con.execute("INSERT INTO StringIds VALUES (?, ?)", (ids[short], short))
    for i, (start, end, stream, name) in enumerate(rows):
        con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?, ?, 0, 1, ?, ?, 1, ?, ?, NULL, 1, 128)",
                    (start, end, stream, i, ids[name], ids[decode(name).base or name]))
    con.commit()
    con.close()
    return path


def test_nsys_reader_on_the_documented_schema(tmp_path):
    p = build_nsys(tmp_path / "r.sqlite", [
        (1000, 9000, 7, NVJET), (9500, 11500, 7, REDUCE), (20000, 26000, 7, NVJET),
        (30000, 60000, 9, CUTLASS), (61000, 110000, 7, ELEMENTWISE), (200000, 201000, 11, REDUCE)])
    s = read_trace(p)
    assert s.stats.format == "nsys"
    assert s.gpu_time_us == pytest.approx(8 + 2 + 6 + 30 + 49 + 1)
    rows = s.kernels.set_index("kernel")
    assert rows.loc[NVJET, "count"] == 2 and rows.loc[NVJET, "total_us"] == pytest.approx(16.0)
    assert rows.loc[NVJET, "reduce_us"] == pytest.approx(2.0)
    assert rows.loc[NVJET, "min_us"] == pytest.approx(6.0) and rows.loc[NVJET, "max_us"] == pytest.approx(10.0)
    assert rows.loc[REDUCE, "count"] == 1            # the reduce alone on stream 11 keeps its own row
    assert rows.loc[CUTLASS, "family"] == "cutlass" and pd.isna(rows.loc[CUTLASS, "op"])
    assert (s.stats.reduce_launches, s.stats.reduce_attached) == (2, 1)


def test_nsys_without_kernel_table(tmp_path):
    p = tmp_path / "e.sqlite"
    con = sqlite3.connect(p)
    con.execute("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT)")
    con.commit()
    con.close()
    with pytest.raises(ProbeError, match="no table CUPTI_ACTIVITY_KIND_KERNEL.*nsys profile --trace cuda"):
        read_nsys_sqlite(p)


def nsys_from_chrome(doc: dict, path):
    """The kernel events of a real Chrome capture written into the documented nsys schema by this test (not an
    nsys export): one row per event (start and end in ns, device, stream, correlation, its name in StringIds),
    so two events alike are two rows alike. An end too large for an SQLite integer is stored as a real."""
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE StringIds (id INTEGER NOT NULL PRIMARY KEY, value TEXT NOT NULL)")
    con.execute("CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER NOT NULL, end INTEGER NOT NULL, "
                "deviceId INTEGER NOT NULL, streamId INTEGER NOT NULL, correlationId INTEGER, "
                "demangledName INTEGER NOT NULL, shortName INTEGER NOT NULL)")
    ids: dict = {}
    for e in doc["traceEvents"]:
        if e.get("cat") != "kernel":
            continue
        if e["name"] not in ids:
            ids[e["name"]] = len(ids) + 1
            con.execute("INSERT INTO StringIds VALUES (?, ?)", (ids[e["name"]], e["name"]))
        a = e.get("args") or {}
        start = round(e["ts"] * 1000)
        end = start + round(e["dur"] * 1000) if e["dur"] < 1e15 else float(start + e["dur"] * 1000)
        con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (start, end, a.get("device", 0), a.get("stream", 0), a.get("correlation"), ids[e["name"]],
                     ids[e["name"]]))
    con.commit()
    con.close()
    return path


def _real_doc():
    with gzip.open(TRACES / "transformer_bf16.json.gz", "rt") as f:
        return json.load(f)


def test_nsys_reader_agrees_with_the_chrome_reader_on_a_real_capture(tmp_path):
    """The H200 capture's kernels read through either reader: the same kernels, GPU time and GEMM rows."""
    doc = _real_doc()
    c = read_chrome_trace(TRACES / "transformer_bf16.json.gz")
    n = read_trace(nsys_from_chrome(doc, tmp_path / "t.sqlite"))
    kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel"]
    assert n.stats.kernels == len(kernels) == c.stats.kernels and n.stats.gemm_launches == c.stats.gemm_launches
    assert n.gpu_time_us == pytest.approx(sum(e["dur"] for e in kernels), abs=1e-3 * len(kernels))
    assert n.stats.gemm_launches > 10
    by_n = n.kernels.groupby("kernel")["total_us"].sum()
    by_c = c.kernels.groupby("kernel")["total_us"].sum()
    assert by_n.to_dict() == pytest.approx(by_c.to_dict(), abs=1e-3 * len(kernels))
    assert (n.stats.duplicate_events, n.stats.long_durations, n.stats.bad_durations) == (0, 0, 0)


def test_nsys_rows_written_twice_or_longer_than_the_trace_are_set_aside_as_in_a_chrome_trace(tmp_path):
    """Every kernel written twice and three GEMM kernels given 1e300 µs, in the Chrome trace and in the same
    events through the nsys schema: both readers count each event once, count the three 0 µs, and agree on
    every figure; the GEMM time is the capture's less the three kernels' real durations."""
    doc = _real_doc()
    ks = [e for e in doc["traceEvents"] if e.get("cat") == "kernel"]
    gemms = [e for e in ks if kernel_kind(e["name"], {}) == 1]
    lost = 0.0
    for e in gemms[::len(gemms) // 3][:3]:
        lost += e["dur"]
        e["dur"] = 1e300
    doc["traceEvents"] += [json.loads(json.dumps(e)) for e in ks]
    write_trace(tmp_path / "t.json", doc["traceEvents"])
    c, c0 = read_trace(tmp_path / "t.json"), read_chrome_trace(TRACES / "transformer_bf16.json.gz")
    n = read_trace(nsys_from_chrome(doc, tmp_path / "t.sqlite"))
    for s in (c, n):
        assert (s.stats.duplicate_events, s.stats.long_durations, s.stats.kernels) == (len(ks), 3, len(ks))
        assert s.gemm_time_us == pytest.approx(c0.gemm_time_us - lost, abs=1e-3 * len(ks))
    assert n.stats.duplicate_us == pytest.approx(c.stats.duplicate_us, rel=1e-9)
    r = CliRunner().invoke(main, ["trace", str(tmp_path / "t.sqlite")])
    assert "internal error" not in r.output and "e+" not in r.stdout
    assert f"{len(ks):,} kernel or copy events repeating another exactly" in r.output
    assert "longer than the trace: 3" in r.output


@pytest.mark.parametrize("value", [None, "fast", -5])
def test_nsys_row_without_a_valid_end_counts_nothing(tmp_path, value):
    """One GEMM row of the real capture (in the nsys schema) whose end is missing, text or before its start:
    it counts 0 µs and is counted as without a valid duration; every other figure is the capture's."""
    doc = _real_doc()
    p = nsys_from_chrome(doc, tmp_path / "t.sqlite")
    n0 = read_trace(p)
    con = sqlite3.connect(p)
    con.execute("PRAGMA ignore_check_constraints = 1")
    rowid, start, end = next(r for r in con.execute(
        "SELECT k.rowid, k.start, k.end FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.demangledName "
        "WHERE s.value LIKE 'nvjet%' ORDER BY k.rowid"))
    con.execute("CREATE TABLE k2 AS SELECT * FROM CUPTI_ACTIVITY_KIND_KERNEL")   # without NOT NULL
    con.execute("DROP TABLE CUPTI_ACTIVITY_KIND_KERNEL")
    con.execute("ALTER TABLE k2 RENAME TO CUPTI_ACTIVITY_KIND_KERNEL")
    con.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET end = ? WHERE rowid = ?",
                (start + value if type(value) is int else value, rowid))
    con.commit()
    con.close()
    n = read_trace(p)
    assert n.stats.bad_durations == 1 and n.stats.kernels == n0.stats.kernels
    assert n.gemm_time_us == pytest.approx(n0.gemm_time_us - (end - start) / 1e3)
    r = CliRunner().invoke(main, ["trace", str(p)])
    assert "internal error" not in r.output and "Traceback" not in r.output


# ----------------------------------------------------------------------------------------------- CLI
def run(*args):
    return CliRunner().invoke(main, ["trace", *map(str, args)])


TABLE = """\
{p}: Chrome trace, NVIDIA H200; 20 events, 7 kernel launches, GPU time 0.100 ms
GPU time: 51.0 % library-selected cuBLAS GEMMs, 49.0 % ahead-of-time torch elementwise
GEMM kernels: 4 launches of 3 kernels, 0.051 ms = 51.0% of GPU time; 4 linked to an op, 4 with input shapes; 2 of 2 split-K reduces counted with their GEMM

share  count  total_us  mean_us  family   provenance        decoded                      op                dtype  layout    m     n     k  batch  groups  kernel
-----  -----  --------  -------  -------  ----------------  ---------------------------  ----------------  -----  ------  ---  ----  ----  -----  ------  -----------------------------------------------
30.0%      1      30.0    30.00  cutlass  library-selected  64x64 · 8x5                  aten::bmm         fp16   NT      128   256    64      8          cutlass_80_simt_sgemm_64x64_8x5_nn_align1
10.0%      1      10.0    10.00  nvjet    library-selected  64x8 · 64x16 · 2x1 · splitK  aten::addmm       bf16   NT       16  4096  4096      1          nvjet_sm90_tst_64x8_64x16_2x1_v_bz_splitK_NNT
 7.0%      1       7.0     7.00  nvjet    library-selected  64x8 · 64x16 · 2x1 · splitK  aten::mm          bf16   NN       16  4096  4096      1          nvjet_sm90_tst_64x8_64x16_2x1_v_bz_splitK_NNT
 4.0%      1       4.0     4.00  nvjet    library-selected  64x8 · 128x16 · 4x1 · algo2  aten::_scaled_mm  fp8    NT       64  1024  4096      1          nvjet_sm90_qqtst_64x8_128x16_4x1_v_bz_algo2_TNT
"""  # noqa: E501  the command's exact output


def test_cli_table_exact(synth):
    r = run(synth)
    assert r.exit_code == 0, r.output
    assert r.stdout == TABLE.format(p=synth)
    assert r.stderr == ""


def test_cli_by_kernel_top(synth):
    r = run(synth, "--by", "kernel", "--top", "1")
    assert r.exit_code == 0
    lines = r.stdout.splitlines()
    assert lines[4].split()[:5] == ["share", "count", "total_us", "mean_us", "family"]
    assert lines[6].startswith("30.0%      1      30.0    30.00  cutlass  library-selected")
    assert lines[-1] == "… 2 more rows (--top 0 shows all)"


def test_cli_machine_formats(synth, tmp_path):
    r = run(synth, "--format", "jsonl")
    rows = [json.loads(x) for x in r.stdout.splitlines()]
    assert [x["total_us"] for x in rows] == [30.0, 10.0, 7.0, 4.0]
    assert list(rows[0]) == TRACE_COLUMNS
    assert rows[3]["op"] == "aten::_scaled_mm" and rows[3]["m"] == 64 and rows[3]["split_k"] is False
    out = tmp_path / "k.parquet"
    r = run(synth, "-o", out)
    assert r.exit_code == 0 and r.stderr == f"wrote 4 rows to {out}\n" and r.stdout == ""
    back = pd.read_parquet(out)
    assert back.kernel.tolist() == [x["kernel"] for x in rows]
    csv = run(synth, "--format", "csv").stdout
    assert csv.splitlines()[0] == ",".join(TRACE_COLUMNS)


def test_cli_errors(tmp_path):
    r = run(tmp_path / "missing.json")
    assert r.exit_code == 1 and r.stderr.startswith("Error: cannot read trace")
    p = tmp_path / "x.json"
    p.write_text("{}")
    r = run(p)
    assert r.exit_code == 1 and "no traceEvents array" in r.stderr
    r = run(p, "-o", tmp_path / "no" / "dir.csv")
    assert r.exit_code == 1 and "no such directory" in r.stderr


# ------------------------------------------------------------------------------ real H200 trace fixtures
def real_traces():
    return sorted(TRACES.glob("*.json.gz")) + sorted(TRACES.glob("*.json")) if TRACES.is_dir() else []


needs_traces = pytest.mark.skipif(not real_traces(), reason="the real H200 torch.profiler traces are not in "
                                  "tests/fixtures/traces/ yet (captured by scripts on the device machine)")


def _load(p):
    with gzip.open(p, "rt") if str(p).endswith(".gz") else open(p) as f:
        return json.load(f)


@needs_traces
@pytest.mark.parametrize("path", real_traces(), ids=lambda p: p.name)
def test_real_trace_stream_equals_json_load(path):
    doc = _load(path)
    meta = {}
    assert list(iter_chrome_events(path, meta, chunk_bytes=1 << 12)) == doc["traceEvents"]
    assert meta == {k: v for k, v in doc.items() if k != "traceEvents"}


@needs_traces
@pytest.mark.parametrize("path", real_traces(), ids=lambda p: p.name)
def test_real_trace_against_a_plain_reading(path):
    """Totals and GEMM launches against a direct json.load of the same file."""
    evs = _load(path)["traceEvents"]
    kernels = [e for e in evs if e.get("cat") == "kernel"]
    copies = [e for e in evs if e.get("cat") in ("gpu_memcpy", "gpu_memset")]
    s = read_trace(path)
    assert s.stats.bad_events == 0 and not s.stats.truncated
    assert (s.stats.kernels, s.stats.copies) == (len(kernels), len(copies))
    assert s.gpu_time_us == pytest.approx(sum(e["dur"] for e in kernels + copies))
    assert s.timeline.total_us.sum() == pytest.approx(s.gpu_time_us)
    assert s.timeline.launches.sum() == len(kernels) + len(copies)
    reduce = [e for e in kernels if decode(e["name"]).family == "splitk_reduce"]
    gemm = [e for e in kernels if classify(decode(e["name"]))[0] == "gemm" and e not in reduce]
    assert gemm, "a GEMM trace without GEMM kernels"
    assert s.kernels[s.kernels.family != "splitk_reduce"]["count"].sum() == len(gemm)
    assert s.kernels.total_us.sum() == pytest.approx(sum(e["dur"] for e in gemm + reduce))
    # every GEMM kernel of a torch.profiler trace with record_shapes is linked to the op that launched it
    ops = {e["args"]["External id"]: e for e in evs if e.get("cat") == "cpu_op" and "External id" in e.get("args", {})}
    for e in gemm[:50]:
        ext = e["args"].get("External id")
        if ext in ops:
            launched_by = ops[ext]["name"]
            assert ((s.kernels.kernel == e["name"]) & (s.kernels.op == launched_by)).any()
    assert s.stats.linked == sum(1 for e in gemm if e["args"].get("External id") in ops)
    for n in {e["name"] for e in gemm}:
        assert not decode(n).unparsed, f"GEMM kernel with tokens the decoder does not know: {n}"


@needs_traces
def test_real_traces_show_the_gemm_ops_and_their_shapes():
    seen = pd.concat([read_trace(p).kernels for p in real_traces()])
    ops = set(seen.op.dropna())
    assert ops & {"aten::mm", "aten::addmm", "aten::bmm"}, ops
    derived = seen[seen.op.isin(["aten::mm", "aten::addmm", "aten::_scaled_mm", "aten::bmm"])]
    assert derived.m.notna().all() and derived.dtype.notna().all()


@needs_traces
def test_real_fp8_trace_has_scaled_mm():
    fp8 = [p for p in real_traces() if "fp8" in p.name or "scaled" in p.name]
    if not fp8:
        pytest.skip("no fp8 trace among the fixtures")
    df = read_trace(fp8[0]).kernels
    sm = df[df.op == "aten::_scaled_mm"]
    assert len(sm) and set(sm.dtype.astype(str)) <= {"fp8", "fp8_e5m2"}
    assert (sm.family == "nvjet").any()


def test_docs_list_every_column():
    doc = (FIXTURES.parent.parent / "docs" / "trace.md").read_text()
    missing = [c for c in TRACE_COLUMNS if f"| `{c}` |" not in doc]
    assert not missing, f"docs/trace.md lacks columns {missing}"
    assert "untested on a real export" in doc.lower() or "not been run on a real" in doc


def test_malformed_last_event_is_not_a_cut(tmp_path):
    evs = synthetic_events()
    text = json.dumps({"traceEvents": evs, "traceName": "x"}, indent=1)
    i = text.rindex('"name": "ac2g"')
    p = tmp_path / "bad_last.json"
    p.write_text(text[:i] + '"name": ac2g' + text[i + len('"name": "ac2g"'):])
    meta = {}
    got = list(iter_chrome_events(p, meta, chunk_bytes=64))
    assert got == evs[:-1] and meta == {"traceName": "x"}
    s = read_trace(p)
    assert (s.stats.bad_events, s.stats.truncated) == (1, False)


FP8_TOP3 = """\
tests/fixtures/traces/fp8_linear.json.gz: Chrome trace, NVIDIA H200; 336 events, 25 kernel launches and 3 memcpy/memset, GPU time 0.588 ms
GPU time: 81.9 % library-selected cuBLAS GEMMs, 10.4 % ahead-of-time torch copies, 7.3 % ahead-of-time torch elementwise, 0.4 % ahead-of-time driver copies
GEMM kernels: 9 launches of 6 kernels, 0.481 ms = 81.9% of GPU time; 9 linked to an op, 9 with input shapes; 1 of 1 split-K reduces counted with their GEMM

share  count  total_us  mean_us  family  provenance        decoded                              op                dtype  layout     m      n      k  batch  groups  kernel
-----  -----  --------  -------  ------  ----------------  -----------------------------------  ----------------  -----  ------  ----  -----  -----  -----  ------  -------------------------------------------------------
29.6%      1     174.1   174.11  nvjet   library-selected  128x128 · 128x6 · 2x1 · coopA algo2  aten::_scaled_mm  fp8    NT      2048  14336   4096      1          nvjet_sm90_qqtst_128x128_128x6_2x1_v_bz_coopA_algo2_TNT
25.7%      1     151.2   151.23  nvjet   library-selected  128x128 · 128x6 · 2x1 · coopA algo2  aten::_scaled_mm  fp8    NT      2048   4096  14336      1          nvjet_sm90_qqtst_128x128_128x6_2x1_v_bz_coopA_algo2_TNT
 7.8%      1      45.8    45.76  nvjet   library-selected  128x128 · 128x6 · 2x1 · coopA algo2  aten::_scaled_mm  fp8    NT      2048   4096   4096      1          nvjet_sm90_qqtst_128x128_128x6_2x1_v_bz_coopA_algo2_TNT
… 6 more rows (--top 0 shows all)
"""  # noqa: E501  the command's exact output


@needs_traces
def test_cli_on_the_real_fp8_trace_exact(monkeypatch):
    monkeypatch.chdir(FIXTURES.parent.parent)
    r = run("tests/fixtures/traces/fp8_linear.json.gz", "--top", "3")
    assert r.exit_code == 0 and r.stderr == ""
    assert r.stdout == FP8_TOP3


@needs_traces
def test_real_fp8_trace_shapes_are_the_captured_models():
    """PROVENANCE: three fp8 linears 4096→14336→4096→4096 at 16, 256 and 2048 tokens, F.linear-style (NT)."""
    df = read_trace(TRACES / "fp8_linear.json.gz").kernels
    got = sorted(df[["m", "n", "k"]].astype(int).itertuples(index=False, name=None))
    want = sorted((m, n, k) for m in (16, 256, 2048) for n, k in ((14336, 4096), (4096, 14336), (4096, 4096)))
    assert got == want
    assert set(df.layout.astype(str)) == {"NT"} and set(df.dtype.astype(str)) == {"fp8"}
    split = df[df.split_k.fillna(False).astype(bool)]
    assert len(split) == 1 and split.reduce_us.iloc[0] > 0      # its splitKreduce is counted with it


@needs_traces
def test_real_transformer_forward_linears():
    """PROVENANCE: TransformerEncoderLayer(d_model=1024, ff=4096) on 4×512 tokens, bf16, two steps."""
    df = read_trace(TRACES / "transformer_bf16.json.gz").kernels
    assert set(df.dtype.astype(str)) == {"bf16"} and (df["count"] == 2).all()
    addmm = sorted(df[df.op == "aten::addmm"][["m", "n", "k"]].astype(int).itertuples(index=False, name=None))
    assert addmm == [(2048, 1024, 1024), (2048, 1024, 4096), (2048, 4096, 1024)]   # out_proj, linear2, linear1
    assert df[df.op == "aten::addmm"].kernel_flags.str.contains("bias").all()          # bias epilogue
    gpu_us = read_trace(TRACES / "transformer_bf16.json.gz").gpu_time_us
    assert df.total_us.sum() / gpu_us == pytest.approx(0.3615, abs=1e-3)   # of kernels + memcpy + memset


@needs_traces
def test_real_fp8_trace_agrees_with_the_sweep_of_the_same_gpu():
    """Two independent captures on the H200: the trace's derived (op, dtype, layout, m, n, k) finds the sweep's
    row for the same GEMM, and cuBLASLt chose the same kernel in both."""
    from cublaslt_probe.analysis.dataset import read_parquet
    t = read_trace(TRACES / "fp8_linear.json.gz").kernels
    t = t.assign(op=t.op.map({"aten::_scaled_mm": "scaled_mm"}))
    d = read_parquet(FIXTURES.parent.parent / "data" / "h200_llm.parquet")
    d = d[d.backend == "torch"]
    keys = ["op", "dtype", "layout", "m", "n", "k", "batch"]
    t = t.astype({"dtype": str, "layout": str})
    d = d.astype({"op": str, "dtype": str, "layout": str})
    m = t.merge(d, on=keys, suffixes=("_trace", "_sweep"))
    assert len(m) >= 6
    assert (m.kernel_trace == m.kernel_sweep).all()


# ------------------------------------------------------------------------------- the whole GPU timeline
PROGRAMS = FIXTURES / "programs"


def program_traces():
    return sorted(PROGRAMS.glob("*/trace.json.gz")) if PROGRAMS.is_dir() else []


@pytest.mark.parametrize("path", real_traces() + program_traces(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_timeline_covers_every_kernel_and_copy(path):
    """Every kernel, memcpy and memset of the trace is in exactly one (kind, provenance, family) group, and the
    detail reading (audit's) lists the same GEMMs as the summary."""
    evs = _load(path)["traceEvents"]
    gpu = [e for e in evs if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    s = read_chrome_trace(path, detail=True)
    tl = s.timeline
    assert tl.launches.sum() == len(gpu) and tl.total_us.sum() == pytest.approx(sum(e["dur"] for e in gpu))
    assert tl.share.sum() == pytest.approx(1.0)
    for (kind, prov, fam), part in tl.groupby(["kind", "provenance", "family"]):
        want = [e for e in gpu if (*classify(decode(e["name"])), decode(e["name"]).family) == (kind, prov, fam)]
        assert part.launches.sum() == len(want)
    plain = read_trace(path).kernels
    pd.testing.assert_frame_equal(s.kernels, plain)
    det = s.detail
    assert len(det.launches) == len(gpu) - s.stats.reduce_attached
    gemm = det.launches[det.launches.kind > 0]
    assert gemm.dur.sum() == pytest.approx(plain.total_us.sum())
    # the sentence names the largest group first, with its share
    g = timeline_groups(tl)
    assert timeline_sentence(tl).startswith(f"{100 * g.share.iloc[0]:.1f} % {g.label.iloc[0]}")
    assert g.total_us.sum() == pytest.approx(tl.total_us.sum())


@pytest.mark.parametrize("path", program_traces(), ids=lambda p: p.parent.name)
def test_every_gemm_kind_kernel_is_in_the_gemm_table(path):
    """The rows hold every GEMM-kind kernel of the timeline, whichever library it comes from."""
    s = read_trace(path)
    gemm_time = s.timeline.loc[s.timeline.kind == "gemm", "total_us"].sum()
    assert s.kernels.total_us.sum() == pytest.approx(gemm_time)


def test_real_mixtral_grouped_gemm():
    """tests/fixtures/programs/mixtral_moe: the experts run torch's CUTLASS 3 grouped GEMM through
    aten::_grouped_mm (8 experts, 4096 tokens, hidden 4096, ffn 14336; gate and up fused: N = 28672), compiled
    into libtorch ahead of time: GEMM rows with their op and group count, not cuBLAS."""
    s = read_trace(PROGRAMS / "mixtral_moe" / "trace.json.gz")
    g = s.kernels[s.kernels.op == "aten::_grouped_mm"]
    main = g[g.total_us > 100]
    got = sorted(main[["m", "n", "k", "groups"]].astype(int).itertuples(index=False, name=None))
    assert got == [(4096, 4096, 14336, 8), (4096, 28672, 4096, 8)]
    assert set(main.group_dim.astype(str)) == {"m"} and set(main.provenance.astype(str)) == {"ahead-of-time"}
    assert set(main.problem_shape.astype(str)) == {"grouped"}
    assert main.total_us.sum() / s.gpu_time_us > 0.4       # the experts are most of the layer's GPU time
    assert "ahead-of-time" in timeline_sentence(s.timeline).split(",")[0]


def test_cli_by_class_lists_the_whole_timeline(tmp_path):
    path = PROGRAMS / "mixtral_moe" / "trace.json.gz"
    r = run(path, "--by", "class", "-f", "jsonl")
    assert r.exit_code == 0, r.output
    rows = [json.loads(x) for x in r.stdout.splitlines()]
    evs = _load(path)["traceEvents"]
    gpu = [e for e in evs if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    assert sum(x["launches"] for x in rows) == len(gpu)
    assert sum(x["total_us"] for x in rows) == pytest.approx(sum(e["dur"] for e in gpu))
    assert list(rows[0]) == list(TIMELINE_SCHEMA)
    assert (rows[0]["kind"], rows[0]["provenance"], rows[0]["family"]) == ("gemm", "ahead-of-time", "cutlass_template")
    t = run(path, "--by", "class", "--top", "2").stdout.splitlines()
    assert t[4].split() == ["share", "launches", "kernels", "total_us", "kind", "provenance", "library", "family"]
    assert t[6].split()[4:] == ["gemm", "ahead-of-time", "torch", "cutlass_template"]


def test_kernel_dur_not_a_number_is_counted_and_warned(tmp_path):
    """The real odd-width capture with one GEMM's dur written as a string number and one as text: the first
    counts with its value, the second is kept with 0 µs, counted, and the CLI warns and exits 3 (partial)."""
    src = FIXTURES / "programs" / "odd_linear" / "trace.json.gz"
    doc = json.loads(gzip.open(src).read())
    ks = [e for e in doc["traceEvents"] if e.get("cat") == "kernel"]
    total = sum(e["dur"] for e in ks)
    lost = ks[1]["dur"]
    ks[0]["dur"] = str(ks[0]["dur"])
    ks[1]["dur"] = "n/a"
    p = tmp_path / "t.json"
    p.write_text(json.dumps(doc))
    s = read_chrome_trace(p)
    assert s.stats.bad_durations == 1 and s.stats.kernels == len(ks)
    assert s.gpu_time_us == pytest.approx(total - lost)
    r = CliRunner().invoke(main, ["trace", str(p), "-f", "jsonl"])
    assert r.exit_code == 3
    assert "1 kernel or copy event without a numeric dur" in r.stderr and "Traceback" not in r.output
