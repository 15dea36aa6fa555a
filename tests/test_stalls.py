"""Host stalls on real H200 program captures (tests/fixtures/programs, PROVENANCE.md there)."""
import gzip
import json
import pathlib
import shutil

import pandas as pd
import pytest
from click.testing import CliRunner

from cublaslt_probe import runfiles
from cublaslt_probe.analysis.stalls import STALL_COLUMNS, cause, host_stalls
from cublaslt_probe.analysis.trace import read_chrome_trace
from cublaslt_probe.cli import main

PROGRAMS = pathlib.Path(__file__).parent / "fixtures" / "programs"


def _stalls(name, steps=2, **kw):
    s = read_chrome_trace(PROGRAMS / name / "trace.json.gz", detail=True)
    return host_stalls(s.detail, steps, **kw)


def test_decode_with_new_kv_lengths_stalls_in_cudnn_attention():
    # each captured decode step met a KV length cuDNN had not planned for: layer 0's attention held the host
    # for tens of ms while its kernels ran for µs; layer 1 (same shape, same step) did not
    df = _stalls("llama_decode")
    assert list(df.columns) == list(STALL_COLUMNS)
    assert len(df) == 1, df
    r = df.iloc[0].to_dict()
    assert r["op"] == "aten::_cudnn_attention_forward"
    assert r["module"] == "model.layers.0.self_attn"
    assert r["calls"] == 1.0
    assert r["host_us"] > 10_000 and r["gpu_us"] < 100
    assert "runtime-compiled" in r["provenance"] and "cudnn" in r["families"]
    c = cause(r)
    assert c["cause"].startswith("cuDNN built an execution plan") and c["cause"].endswith("inferred")
    assert "ms of host time per call" in c["evidence"]


def test_the_same_decode_on_seen_lengths_has_no_attention_stall():
    df = _stalls("llama_decode_with_modules")
    assert not (df.op == "aten::_cudnn_attention_forward").any(), df


@pytest.mark.parametrize("name", ["gpt2_train", "compiled_mlp", "odd_linear"])
def test_programs_whose_ops_keep_the_gpu_busy_have_no_stall(name):
    assert _stalls(name).empty


def test_thresholds_are_what_decides():
    # the attention op's host time is far above its kernels' time: a ratio beyond it finds nothing
    assert _stalls("llama_decode", min_ratio=1e6).empty
    assert len(_stalls("llama_decode", min_host_us=1.0, min_ratio=2.0)) > 1


def _reference(det, steps, min_host_us, min_ratio):
    """The stalls computed call by call, the plain way: each op's own kernels, its innermost module range of
    its thread (the latest-starting one around its start), grouped by (op, module)."""
    prefix = runfiles.MODULE_PREFIX
    mods = [r for r in det.ranges.to_dict("records") if r["name"].startswith(prefix)]
    lz = det.launches[det.launches.op_row >= 0]
    per_op: dict[int, list] = {}
    for row, dur, name in zip(lz.op_row.tolist(), lz.dur.tolist(), lz.name.tolist()):
        per_op.setdefault(row, [0.0, set()])
        per_op[row][0] += dur
        per_op[row][1].add(det.names[name])
    out: dict[tuple, dict] = {}
    for row in sorted(per_op):
        op = det.ops.loc[row]
        gpu, kernels = per_op[row]
        host = float(op.end - op.ts)
        if not (host >= min_host_us and host >= min_ratio * max(gpu, 1e-9)):
            continue
        around = [m for m in mods if m["tid"] == op.tid and m["ts"] <= op.ts <= m["end"]]
        module = max(around, key=lambda m: m["ts"])["name"][len(prefix):] if around else None
        r = out.setdefault((det.op_keys[int(op.key)][0], module), {"calls": 0, "host": 0.0, "kernels": set()})
        r["calls"] += 1
        r["host"] += host
        r["kernels"] |= kernels
    return {k: (v["calls"] / steps, v["host"] / steps, sorted(v["kernels"])) for k, v in out.items()}


@pytest.mark.parametrize("name", ["llama_decode", "gpt2_train", "mixtral_moe"])
def test_every_stalled_call_is_counted_in_its_op_and_module(name):
    # thresholds low enough that most op calls of the step count: the whole-column joins must give what a
    # call-by-call reading gives, module by module, with the same kernels
    s = read_chrome_trace(PROGRAMS / name / "trace.json.gz", detail=True)
    df = host_stalls(s.detail, 2, min_host_us=5.0, min_ratio=1.5)
    want = _reference(s.detail, 2, 5.0, 1.5)
    assert len(df) == len(want) and len(df) > 5
    got = {(r["op"], None if pd.isna(r["module"]) else r["module"]): (r["calls"], r["host_us"], r["kernels"])
           for r in df.to_dict("records")}
    assert got.keys() == want.keys()
    for k, (calls, host, kernels) in want.items():
        assert got[k][0] == calls and got[k][1] == pytest.approx(host) and got[k][2] == kernels
    assert list(df.host_us) == sorted(df.host_us, reverse=True)
    assert all(m is None or isinstance(m, str) for m in df.module)       # a missing module is None, never NaN


def _without_module_ranges(src, dst):
    """A real capture with its module ranges taken out (what a trace profiled without the capture API has)."""
    dst.mkdir()
    with gzip.open(src / "trace.json.gz", "rt") as f:
        doc = json.load(f)
    doc["traceEvents"] = [e for e in doc["traceEvents"] if not str(e.get("name", "")).startswith(
        runfiles.MODULE_PREFIX)]
    with gzip.open(dst / "trace.json.gz", "wt") as f:
        json.dump(doc, f)
    for extra in ("cublaslt.log", "env.json"):
        shutil.copy(src / extra, dst / extra)
    return dst


def test_a_stall_outside_every_module_has_no_module_and_prints_none(tmp_path):
    run = _without_module_ranges(PROGRAMS / "llama_decode", tmp_path / "run")
    s = read_chrome_trace(run / "trace.json.gz", detail=True)
    df = host_stalls(s.detail, 2)
    (r,) = df.to_dict("records")
    assert r["op"] == "aten::_cudnn_attention_forward" and r["module"] is None
    out = CliRunner().invoke(main, ["audit", str(run)])
    assert out.exit_code == 0, out.output
    (line,) = [x for x in out.stdout.splitlines() if x.startswith("host stall:")]
    assert "in aten::_cudnn_attention_forward for " in line
    assert "nan" not in line.lower() and "None" not in line and "()" not in line


def test_stall_lines_read_a_missing_module_as_missing_in_any_dtype(tmp_path):
    # the same stall in a string column (pandas 3 makes [str, None] one, with NaN): still no "(nan)"
    from cublaslt_probe.analysis.audit import audit
    from cublaslt_probe.render.audit import stall_lines
    a = audit(_without_module_ranges(PROGRAMS / "llama_decode", tmp_path / "run"))
    stalls = a.stalls
    # "str" is pandas 3's string dtype (missing stays missing); pandas 2 writes a missing value as the text "<NA>"
    dtypes = ("object", "string") + (("str",) if int(pd.__version__.split(".")[0]) >= 3 else ())
    for dtype in dtypes:
        a.stalls = stalls.astype({"module": dtype})
        (line,) = stall_lines(a)
        assert line.startswith("host stall: ") and " in aten::_cudnn_attention_forward for " in line, line
