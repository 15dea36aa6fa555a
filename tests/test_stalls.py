"""Host stalls on real H200 program captures (tests/fixtures/programs, PROVENANCE.md there)."""
import pathlib

import pytest

from cublaslt_probe.stalls import STALL_COLUMNS, cause, host_stalls
from cublaslt_probe.trace import read_chrome_trace

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
