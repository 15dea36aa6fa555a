"""The trace reader on real captures changed the way real files differ (issue 36, reader side).

Every input is a committed capture (tests/fixtures/programs/*/trace.json.gz, tests/fixtures/traces/) copied into
tmp_path and changed there: a field of another type, an id beyond int64, a damaged gzip, rank traces merged into
one file, ranges written as B/E pairs, bad durations, a bare event array, a byte order mark. The oracle is the
unchanged capture read alone (or the same capture with the changed events left out).
"""
from __future__ import annotations

import gzip
import json
import math
import re
import zlib

import pandas as pd
import pytest
from click.testing import CliRunner
from conftest import FIXTURES

from cublaslt_probe.analysis import trace as trace_mod
from cublaslt_probe.analysis.audit import audit
from cublaslt_probe.analysis.trace import RANGE_PREFIXES, by_kernel, read_chrome_trace, read_trace
from cublaslt_probe.analysis.trace import events as trace_events
from cublaslt_probe.cli import main
from cublaslt_probe.cli._common import sniff
from cublaslt_probe.errors import OptionError, ProbeError

PROGRAMS = FIXTURES / "programs"
LLAMA = PROGRAMS / "llama_prefill" / "trace.json.gz"      # record_function module and step ranges, pid 454
MIXTRAL = PROGRAMS / "mixtral_moe" / "trace.json.gz"      # another program, also pid 454 on device 0
GPT2 = PROGRAMS / "gpt2_train" / "trace.json.gz"          # two training steps, split-K reduces
FP8 = FIXTURES / "traces" / "fp8_linear.json.gz"
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation")
ROW_KEY = ["kernel", "op", "input_dims", "input_types", "input_strides", "count", "total_us", "reduce_us"]


def load(path) -> dict:
    return json.loads(gzip.decompress(path.read_bytes()))


def write(path, doc, gz: bool = False, bom: bool = False, indent: int | None = 1):
    data = (b"\xef\xbb\xbf" if bom else b"") + json.dumps(doc, indent=indent).encode()
    path.write_bytes(gzip.compress(data, compresslevel=1) if gz else data)
    return path


def run(*args):
    return CliRunner().invoke(main, ["trace", *map(str, args)])


def rows(df: pd.DataFrame) -> pd.DataFrame:
    return df[ROW_KEY].astype(object).sort_values(ROW_KEY[:6], key=lambda s: s.astype(str)).reset_index(drop=True)


def gemm_kernels(doc) -> list[dict]:
    from cublaslt_probe.names import decode
    return [e for e in doc["traceEvents"] if e.get("cat") == "kernel" and decode(e["name"]).kind == "gemm"]


# ------------------------------------------------------------------------------------------------ crashes
def test_device_properties_as_one_object(tmp_path):
    doc = load(LLAMA)
    doc["deviceProperties"] = doc["deviceProperties"][0]
    p = write(tmp_path / "trace.json", doc)
    s = read_trace(p)
    assert s.device == "NVIDIA H200"
    assert s.meta["deviceProperties"] == [load(LLAMA)["deviceProperties"][0]]
    a = audit(p)                                       # reads deviceProperties for the SM count
    assert a.gpu == "NVIDIA H200" and len(a.rows)
    r = run(p)
    assert r.exit_code == 0 and "Chrome trace, NVIDIA H200;" in r.stdout


@pytest.mark.parametrize("value", ["NVIDIA H200", 5, [3, "x"]])
def test_device_properties_of_another_type_reads_as_none(tmp_path, value):
    doc = load(LLAMA)
    doc["deviceProperties"] = value
    s = read_trace(write(tmp_path / "trace.json", doc))
    assert s.device is None and s.meta["deviceProperties"] == []


def test_event_with_a_bad_name_or_args_is_skipped_and_counted(tmp_path):
    doc = load(LLAMA)
    ev = doc["traceEvents"]
    k = gemm_kernels(doc)
    bad = [k[0], k[1], next(e for e in ev if e.get("cat") == "cpu_op"), next(e for e in ev if e.get("cat") ==
                                                                              "cuda_runtime"), k[2]]
    bad[0]["name"] = ["nvjet", 1]                    # unhashable
    bad[1]["name"] = 12345
    bad[2]["args"] = "External id 5"
    bad[3]["args"] = [1, 2]
    bad[4]["cat"] = ["kernel"]
    p = write(tmp_path / "bad.json", doc)
    s = read_chrome_trace(p, detail=True)
    doc["traceEvents"] = [e for e in ev if not any(e is b for b in bad)]
    want = read_chrome_trace(write(tmp_path / "without.json", doc), detail=True)
    assert s.stats.bad_events == 5
    assert s.stats.events == want.stats.events + 5
    assert (s.stats.kernels, s.stats.gpu_time_us, s.stats.linked) == (
        want.stats.kernels, want.stats.gpu_time_us, want.stats.linked)
    pd.testing.assert_frame_equal(rows(s.kernels), rows(want.kernels))
    r = run(p)
    assert r.exit_code == 3 and "5 malformed events skipped" in r.stdout and "Traceback" not in r.output


@pytest.mark.parametrize("field,value", [("Input Dims", [["a", "b"], ["c", "d"]]), ("Input Dims", 5),
                                         ("Input type", 7), ("Input Strides", [["x", 1], [1, "y"]])])
def test_gemm_op_whose_shapes_are_not_integers(tmp_path, field, value):
    """A GEMM op whose recorded inputs are of another type keeps its row, without the shape it cannot give."""
    doc = load(LLAMA)
    op = next(e for e in doc["traceEvents"] if e.get("cat") == "cpu_op" and e["name"] == "aten::mm")
    op["args"][field] = value
    s, want = read_trace(write(tmp_path / "t.json", doc)), read_trace(LLAMA)
    assert s.stats.gemm_launches == want.stats.gemm_launches and s.gemm_time_us == want.gemm_time_us
    assert s.kernels["m"].isna().sum() >= (field != "Input Strides" and field != "Input type")
    r = run(tmp_path / "t.json")
    assert r.exit_code == 0, r.output


def test_ids_beyond_int64_are_missing_and_counted(tmp_path):
    doc = load(LLAMA)
    k = gemm_kernels(doc)[0]
    call = next(e for e in doc["traceEvents"] if e.get("cat") in ("cuda_runtime", "cuda_driver")
                and e["args"].get("correlation") == k["args"]["correlation"])
    k["args"]["correlation"] = 2 ** 63 + 5
    k["args"]["External id"] = 2 ** 64
    call["args"]["correlation"] = 2 ** 63 + 5
    p = write(tmp_path / "ids.json", doc)
    s = read_chrome_trace(p, detail=True)
    base = read_chrome_trace(LLAMA)
    assert s.stats.bad_ids == 3
    assert s.stats.gemm_launches == base.stats.gemm_launches and s.stats.gpu_time_us == base.stats.gpu_time_us
    assert s.stats.linked == base.stats.linked - 1      # that one kernel is unlinked, nothing else changes
    assert s.kernels["op"].isna().sum() == 1
    r = run(p)
    assert r.exit_code == 3 and "3 correlation or External ids beyond 2^63-1 read as missing" in r.stdout


def _damage(data: bytes, at: int) -> bytes:
    return data[:at] + bytes(b ^ 0x5A for b in data[at:at + 16]) + data[at + 16:]


@pytest.mark.parametrize("at", [0, 3, 10, 40, 200, 1000, 3000])
def test_gzip_damaged_in_its_first_kilobytes(tmp_path, at):
    p = tmp_path / "t.json.gz"
    p.write_bytes(_damage(LLAMA.read_bytes(), at))
    assert sniff(str(p)).startswith(("a gzip file", "binary data"))       # the sniffer itself does not raise
    try:
        s = read_trace(p)
    except ProbeError as e:
        assert "\n" not in str(e) and str(p) in str(e)
    else:
        assert s.stats.truncated and s.stats.gzip_error
    r = run(p)
    assert r.exit_code in (1, 3), r.output
    assert "internal error" not in r.output and "Traceback" not in r.output
    if r.exit_code == 1:
        assert r.stderr.startswith("Error: ") and len(r.stderr.strip().splitlines()) == 1
    else:
        assert "the gzip stream is damaged inside the event array" in r.stdout


def test_gzip_damaged_mid_stream_keeps_every_event_before_the_damage(tmp_path):
    """A run of 0xFF bytes in the middle of the compressed stream (zlib: invalid block type a few bytes on):
    every event that lies whole before the damage is read, in order; the rest is reported as cut."""
    data = GPT2.read_bytes()
    at = len(data) // 2
    bad = data[:at] + b"\xff" * 64 + data[at + 64:]
    p = tmp_path / "t.json.gz"
    p.write_bytes(bad)
    # the oracle: what zlib decompresses before the damage, fed one byte at a time from it
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    good = [d.decompress(bad[:at])]
    with pytest.raises(zlib.error):
        for i in range(at, at + 65536):
            good.append(d.decompress(bad[i:i + 1]))
    readable = len(b"".join(good))
    text = gzip.decompress(data).decode()
    events = json.loads(text)["traceEvents"]
    dec, pos, whole = json.JSONDecoder(), text.index("[", text.index('"traceEvents"')) + 1, 0
    while True:
        pos = text.index("{", pos)
        _, end = dec.raw_decode(text, pos)
        if len(text[:end].encode()) > readable:
            break
        whole, pos = whole + 1, end
    st = trace_mod.TraceStats(path=str(p))
    got = list(trace_mod.iter_chrome_events(p, stats=st))
    assert st.truncated and "invalid block type" in st.gzip_error and not st.gzip_damaged_after_events
    assert len(got) == whole > 1000 and got == events[:whole]
    r = run(p)
    assert r.exit_code == 3 and "the gzip stream is damaged inside the event array (Error -3" in r.stdout


def test_deep_nesting_is_one_malformed_event(tmp_path):
    doc = load(FP8)
    op = next(e for e in doc["traceEvents"] if e.get("cat") == "cpu_op")
    op["args"]["deep"] = "@DEEP@"
    text = json.dumps(doc, indent=1).replace('"@DEEP@"', "[" * 200_000 + "]" * 200_000)
    p = tmp_path / "deep.json"
    p.write_text(text)
    s = read_chrome_trace(p)
    doc["traceEvents"].remove(op)
    want = read_chrome_trace(write(tmp_path / "without.json", doc))
    assert s.stats.bad_events == 1 and s.stats.events == want.stats.events
    pd.testing.assert_frame_equal(rows(s.kernels), rows(want.kernels))
    r = run(p)
    assert r.exit_code == 3 and "1 malformed event skipped" in r.stdout


# ------------------------------------------------------------------------------------------- durations
def test_nan_negative_infinite_and_zero_durations(tmp_path):
    doc = load(LLAMA)
    k = gemm_kernels(doc)
    lost = sum(e["dur"] for e in k[:4])
    k[0]["dur"], k[1]["dur"], k[2]["dur"], k[3]["dur"] = "NaN", -5000.0, float("inf"), 0
    p = write(tmp_path / "dur.json", doc)            # json writes inf as Infinity, which json reads back
    s = read_chrome_trace(p, detail=True)
    base = read_chrome_trace(LLAMA)
    assert (s.stats.bad_durations, s.stats.zero_durations) == (3, 1)
    assert s.stats.gpu_time_us == pytest.approx(base.stats.gpu_time_us - lost)
    for df, cols in ((s.kernels, ["share", "count", "total_us", "mean_us", "min_us", "max_us", "reduce_us"]),
                     (s.timeline, ["launches", "total_us", "share"]), (s.families, ["total_us", "share"]),
                     (s.detail.launches, ["dur", "reduce_us"])):
        v = df[cols].astype(float).to_numpy()
        assert (v >= 0).all() and pd.notna(v).all() and (v < math.inf).all()
    assert s.gemm_time_us == pytest.approx(base.gemm_time_us - lost)
    r = run(p, "--top", "0")
    assert r.exit_code == 3 and "3 kernel or copy events without a numeric dur" in r.stdout
    body = r.stdout.split("\n\n", 1)[1].lower()                     # the table
    assert not re.search(r"\bnan\b|\binf\b| -\d", body)


# ----------------------------------------------------------------------------------- bare array, BOM
@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("bom", [False, True])
@pytest.mark.parametrize("bare", [False, True])
def test_bare_array_and_byte_order_mark(tmp_path, gz, bom, bare):
    doc = load(FP8)
    p = write(tmp_path / ("t.json.gz" if gz else "t.json"), doc["traceEvents"] if bare else doc, gz=gz, bom=bom)
    s, want = read_trace(p), read_trace(FP8)
    assert s.stats.events == want.stats.events and not s.stats.bad_events
    pd.testing.assert_frame_equal(s.kernels, want.kernels)
    r, w = run(p, "--top", "0"), run(FP8, "--top", "0")
    assert r.exit_code == 0, r.output
    # the same table; a bare array has no deviceProperties, so the header names no GPU
    assert r.stdout.split("\n", 1)[1] == w.stdout.split("\n", 1)[1]


# ------------------------------------------------------------------------------------------ gzip trailer
def test_damaged_gzip_trailer_reads_every_event_and_says_so(tmp_path):
    data = FP8.read_bytes()
    p = tmp_path / "t.json.gz"
    p.write_bytes(data[:-8] + bytes(b ^ 0xFF for b in data[-8:]))      # CRC and size wrong
    s, want = read_trace(p), read_trace(FP8)
    assert s.stats.gzip_damaged_after_events and not s.stats.truncated
    assert s.stats.events == want.stats.events
    pd.testing.assert_frame_equal(s.kernels, want.kernels)
    r = run(p)
    assert r.exit_code == 0, r.output
    assert "damaged only after the last event" in r.stdout and "cut off inside the event array" not in r.stdout
    p.write_bytes(data[:-8])                                            # trailer missing
    assert read_trace(p).stats.gzip_damaged_after_events


def test_gzip_cut_inside_the_events_is_still_cut_off(tmp_path):
    data = FP8.read_bytes()
    p = tmp_path / "t.json.gz"
    p.write_bytes(data[:len(data) // 2])
    s = read_trace(p)
    assert s.stats.truncated and not s.stats.gzip_damaged_after_events
    r = run(p)
    assert r.exit_code == 3 and "cut off inside the event array" in r.stdout


# ------------------------------------------------------------------------------------------- big event
def test_one_huge_event_is_read_with_linear_buffering(tmp_path, monkeypatch):
    """A single event of several MB, read in 64 KB chunks: the text put into the reader's buffer stays a small
    multiple of the file (each chunk joined a bounded number of times), and the events are those of json.load."""
    doc = load(FP8)
    op = next(e for e in doc["traceEvents"] if e.get("cat") == "cpu_op")
    op["args"]["Concrete Inputs"] = [[i, i + 1] for i in range(150_000)]
    p = write(tmp_path / "big.json", doc)
    built = []
    fill = trace_events._JsonStream.fill

    def counting(self, *a, **k):
        got = fill(self, *a, **k)
        built.append(len(self.buf))
        return got

    monkeypatch.setattr(trace_events._JsonStream, "fill", counting)
    events = list(trace_mod.iter_chrome_events(p, chunk_bytes=1 << 16))
    assert events == json.loads(p.read_text())["traceEvents"]
    assert sum(built) < 6 * p.stat().st_size


# --------------------------------------------------------------------------------------------- B/E ranges
def _as_begin_end(doc, keep) -> dict:
    """The complete (X) events that `keep` picks rewritten as B/E pairs, in the order a Chrome trace writes
    them (by time; at one time an E before a B, the outer B first)."""
    ev = doc["traceEvents"]
    picked = [e for e in ev if keep(e)]
    rest = [e for e in ev if not keep(e)]
    be = []
    for e in picked:
        b = {k: v for k, v in e.items() if k != "dur"}
        b["ph"] = "B"
        be.append((e["ts"], 1, -e["dur"], b))
        be.append((e["ts"] + e["dur"], 0, 0.0, {"ph": "E", "pid": e["pid"], "tid": e["tid"], "ts": e["ts"] + e["dur"]}))
    be.sort(key=lambda x: x[:3])
    out = dict(doc)
    out["traceEvents"] = rest + [x[3] for x in be]
    return out


def test_ranges_written_as_begin_end_pairs(tmp_path):
    doc = load(LLAMA)
    ranges = lambda e: e.get("cat") == "user_annotation" and e["name"].startswith(RANGE_PREFIXES)
    p = write(tmp_path / "be.json", _as_begin_end(doc, ranges))
    s, want = read_chrome_trace(p, detail=True), read_chrome_trace(LLAMA, detail=True)
    cols = ["name", "ts", "end", "tid", "pid", "gpu", "device"]
    got_r = s.detail.ranges[cols].sort_values(["gpu", "ts", "name"]).reset_index(drop=True)
    want_r = want.detail.ranges[cols].sort_values(["gpu", "ts", "name"]).reset_index(drop=True)
    pd.testing.assert_frame_equal(got_r, want_r, check_exact=False, rtol=0, atol=1e-3)
    assert (got_r["end"] > got_r["ts"]).all()
    pd.testing.assert_frame_equal(rows(s.kernels), rows(want.kernels))
    a, w = audit(p), audit(LLAMA)
    assert a.steps == w.steps and len(a.rows) == len(w.rows) > 0
    assert a.rows["calls"].sum() == w.rows["calls"].sum()


def test_ops_and_ranges_as_begin_end_pairs(tmp_path):
    """Every CPU op and annotation as a B/E pair (a Chrome trace another tool wrote): the ops' and ranges'
    ends, hence audit's attribution, are those of the complete events."""
    doc = load(GPT2)
    cpu = lambda e: e.get("ph") == "X" and e.get("cat") in ("cpu_op", "python_function", "user_annotation")
    p = write(tmp_path / "be.json", _as_begin_end(doc, cpu))
    s, want = read_chrome_trace(p, detail=True), read_chrome_trace(GPT2, detail=True)
    assert len(want.detail.ranges) and len(want.detail.ops)
    for a, b in ((s.detail.ranges, want.detail.ranges), (s.detail.ops, want.detail.ops)):
        key = ["ts", "end", "tid"]
        pd.testing.assert_frame_equal(a[key].sort_values(key).reset_index(drop=True),
                                      b[key].sort_values(key).reset_index(drop=True), atol=1e-3, rtol=0)
    pd.testing.assert_frame_equal(rows(s.kernels), rows(want.kernels))


def test_gpu_user_annotations_are_ranges_on_the_gpu(tmp_path):
    doc = load(LLAMA)
    s = read_chrome_trace(LLAMA, detail=True)
    r = s.detail.ranges
    gpu_ev = [e for e in doc["traceEvents"] if e.get("cat") == "gpu_user_annotation"
              and e["name"].startswith(RANGE_PREFIXES)]
    assert r["gpu"].sum() == len(gpu_ev) > 0
    g = r[r["gpu"]]
    assert set(g["device"]) == {0} and set(g["tid"]) == {e["tid"] for e in gpu_ev} and set(g["pid"]) == {454}
    c = r[~r["gpu"]]
    assert set(c["device"]) == {-1} and set(c["pid"]) == {454}
    assert list(r.columns) == ["name", "ts", "end", "tid", "pid", "gpu", "device"]


# ------------------------------------------------------------------------------- several processes in one file
def _as_rank(doc, pid, dt=0.0, device=None, drop_kernel_ext=False) -> dict:
    """A capture as another rank of a merged file: its OS pid (and main thread id) `pid`, its times moved by
    `dt` µs, its GPU events on `device`."""
    doc = json.loads(json.dumps(doc))
    old = {e["pid"] for e in doc["traceEvents"] if e.get("cat") == "cpu_op"}
    for e in doc["traceEvents"]:
        if e.get("pid") in old:
            e["pid"] = pid
            if e.get("tid") in old:
                e["tid"] = pid
        elif device is not None and e.get("cat") in GPU_CATS:
            e["pid"] = device
            if "device" in e.get("args", {}):
                e["args"]["device"] = device
        if drop_kernel_ext and e.get("cat") == "kernel":
            e["args"].pop("External id", None)
        if "ts" in e and isinstance(e["ts"], (int, float)):
            e["ts"] += dt
    return doc


def _merge(*docs) -> dict:
    out = dict(docs[0])
    out["traceEvents"] = [e for d in docs for e in d["traceEvents"]]
    return out


def _first_ts(doc):
    return min(e["ts"] for e in doc["traceEvents"] if e.get("cat") == "kernel")


CASES = {
    # two programs, the second's OS pid changed, both on device 0, at the times they were taken
    "two programs": (LLAMA, MIXTRAL, dict()),
    # ... run at the same moment (ranks run together), the kernels without External id (correlation only)
    "two programs at once": (LLAMA, MIXTRAL, dict(align=True, drop_kernel_ext=True)),
    # ... the second on device 1
    "two programs, two GPUs": (LLAMA, MIXTRAL, dict(align=True, device=1, drop_kernel_ext=True)),
    # the same capture twice (the same program on two ranks): identical times and ids
    "same capture twice": (LLAMA, LLAMA, dict()),
    # ... the second 7.5 µs later (both launches precede both kernels)
    "same capture, 7.5 us apart": (GPT2, GPT2, dict(dt=7.5, drop_kernel_ext=True)),
}


def _build(tmp_path, a_path, b_path, align=False, dt=0.0, device=None, drop_kernel_ext=False):
    a = _as_rank(load(a_path), 1001, drop_kernel_ext=drop_kernel_ext)
    b0 = load(b_path)
    shift = _first_ts(a) - _first_ts(b0) if align else dt
    b = _as_rank(b0, 2002, shift, device, drop_kernel_ext)
    return (write(tmp_path / "a.json", a, indent=None), write(tmp_path / "b.json", b, indent=None),
            write(tmp_path / "merged.json.gz", _merge(a, b), gz=True, indent=None))


@pytest.mark.parametrize("case", list(CASES))
def test_merged_processes_are_joined_within_each(tmp_path, case):
    a_path, b_path, kw = CASES[case]
    pa, pb, pm = _build(tmp_path, a_path, b_path, **kw)
    m = read_chrome_trace(pm, detail=True)
    assert m.pids == [1001, 2002] and m.stats.processes == 2 and m.stats.no_process == 0
    for pid, alone in ((1001, read_chrome_trace(pa, detail=True)), (2002, read_chrome_trace(pb, detail=True))):
        mine = m.kernels[m.kernels["pid"] == pid]
        pd.testing.assert_frame_equal(rows(mine), rows(alone.kernels))       # ops, shapes, counts, times
        assert (alone.kernels["pid"] == pid).all()
        d, da = m.detail.for_process(pid), alone.detail
        assert len(d.ops) == len(da.ops) and len(d.launches) == len(da.launches)
        cpu, cpu_a = d.ranges[~d.ranges["gpu"]], da.ranges[~da.ranges["gpu"]]
        pd.testing.assert_frame_equal(cpu.reset_index(drop=True), cpu_a.reset_index(drop=True))
        # GPU ranges: all its own are kept; one given this pid is one of its own; on a stream two processes
        # share, a range around kernels of both cannot be told (pid -1) and is kept by both
        g, ga = d.ranges[d.ranges["gpu"]], da.ranges[da.ranges["gpu"]]
        own = set(zip(ga["name"], ga["ts"].round(3)))
        assert own <= set(zip(g["name"], g["ts"].round(3)))
        mine = g[g["pid"] == pid]
        assert set(zip(mine["name"], mine["ts"].round(3))) <= own
        assert len(mine) == len(ga) or kw.get("dt") or kw.get("align") or a_path == b_path
        def key(det):                    # each launch's kernel and op record
            ok = det.ops["key"].to_numpy()
            return sorted((det.names[n], det.op_keys[ok[r]] if r >= 0 else None)
                          for n, r in zip(det.launches["name"].tolist(), det.launches["op_row"].tolist()))

        assert key(d) == key(da)
    assert m.stats.gemm_launches == sum(read_chrome_trace(p).stats.gemm_launches for p in (pa, pb))
    pr = m.detail.processes()
    assert list(pr["pid"]) == [1001, 2002] and list(pr.columns) == ["pid", "devices", "gemm_launches",
                                                                    "gpu_time_us"]
    assert pr["gpu_time_us"].sum() == pytest.approx(m.stats.gpu_time_us)
    assert list(pr["devices"]) == ["0", "1" if kw.get("device") == 1 else "0"]


def test_merged_processes_on_the_command_line(tmp_path):
    pa, pb, pm = _build(tmp_path, LLAMA, MIXTRAL)
    r = run(pm, "--top", "0")
    assert r.exit_code == 0, r.output
    assert "this file holds 2 processes (pids 1001, 2002" in r.stdout
    table = r.stdout.split("\n\n", 1)[1].splitlines()
    assert table[0].split()[:2] == ["pid", "share"]
    body = [ln.split()[0] for ln in table[2:] if ln.strip()]
    a, b = read_trace(pa), read_trace(pb)
    assert body.count("1001") == len(a.kernels) and body.count("2002") == len(b.kernels)
    k = by_kernel(read_trace(pm).kernels)
    assert len(k) == len(by_kernel(a.kernels)) + len(by_kernel(b.kernels))
    one = run(pa)
    assert "this file holds" not in one.stdout and one.stdout.split("\n\n", 1)[1].startswith("share")


def test_for_process_keeps_the_unlinked_kernels_of_its_device(tmp_path):
    a = _as_rank(load(LLAMA), 1001)
    b = _as_rank(load(MIXTRAL), 2002, _first_ts(a) - _first_ts(load(MIXTRAL)), device=1)
    lone = next(e for e in gemm_kernels(b))
    lone["args"].pop("correlation")
    lone["args"].pop("External id")
    m = read_chrome_trace(write(tmp_path / "m.json", _merge(a, b)), detail=True)
    L = m.detail.launches
    row = L[(L["device"] == 1) & (L["op_row"] < 0) & (L["kind"] == 1)]
    assert len(row) == 1 and row["pid"].iloc[0] == 2002       # the only process on device 1
    assert m.stats.no_process == 0
    with pytest.raises(OptionError, match="--pid 7: no such process in this trace"):
        m.detail.for_process(7)


@pytest.mark.parametrize("value", ["rank0", None, [4, 5]])
def test_an_event_whose_pid_cannot_be_read_is_the_one_process_s(tmp_path, value):
    doc = load(LLAMA)
    ev = doc["traceEvents"]
    op = next(e for e in ev if e.get("cat") == "cpu_op" and e["name"] == "aten::mm")
    call = next(e for e in ev if e.get("cat") in ("cuda_runtime", "cuda_driver"))
    op["pid"], call["pid"] = value, value
    s, want = read_chrome_trace(write(tmp_path / "t.json", doc), detail=True), read_chrome_trace(LLAMA)
    assert s.pids == [454] and s.stats.processes == 1 and set(s.detail.ops["pid"]) == {454}
    pd.testing.assert_frame_equal(s.kernels, want.kernels)
    assert "this file holds" not in run(tmp_path / "t.json").stdout


def test_strides_that_are_not_json_values_are_not_shown(tmp_path):
    doc = load(LLAMA)
    op = next(e for e in doc["traceEvents"] if e.get("cat") == "cpu_op" and e["name"] == "aten::mm")
    op["args"]["Input Strides"] = [[float("nan"), 1], [1, 4096]]
    s = read_trace(write(tmp_path / "t.json", doc))
    row = s.kernels[s.kernels["input_dims"] == json.dumps(op["args"]["Input Dims"], separators=(", ", ": "))]
    gone = row[row["input_strides"].isna()]
    assert len(gone) == 1 and gone["layout"].isna().all() and gone["m"].notna().all()
    r = run(tmp_path / "t.json", "-f", "jsonl")
    assert r.exit_code == 0 and not re.search(r"\bnan\b", r.stdout, re.I)
