"""GPU: a small model replayed from a CUDA graph, captured with `cublaslt_probe.capture` open during the graph's
capture and replay, then audited end to end."""
from __future__ import annotations

import gzip
import json

import pytest

from cublaslt_probe import runfiles

pytestmark = pytest.mark.gpu


def _model(torch):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(1024, 4096, bias=False), torch.nn.GELU(),
                               torch.nn.Linear(4096, 1024, bias=False)).cuda().to(torch.bfloat16).eval()


def test_graph_captured_inside_the_capture(tmp_path):
    import torch
    from cublaslt_probe.audit import audit
    from cublaslt_probe.recorder import capture
    model = _model(torch)
    x = torch.randn(64, 1024, device="cuda", dtype=torch.bfloat16)
    run = tmp_path / "run"
    with capture(run, model=model) as cap:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.no_grad(), torch.cuda.stream(s):
            for _ in range(2):
                model(x)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(g):
            y = model(x)
        for _ in range(3):
            with cap.step():
                g.replay()
    with torch.no_grad():
        torch.testing.assert_close(y, model(x))            # the graph computes what the model does
    env = json.loads((run / runfiles.ENV_FILE).read_text())
    graphs = env["capture"]["cuda_graphs"]
    assert [(e["graph"], e["replays"]) for e in graphs] == [(0, 3)]
    if graphs[0]["dot"]:                                   # torch versions that keep the graph for debug_dump
        dot = (run / graphs[0]["dot"]).read_text()
        assert dot.count("nvjet") + dot.count("gemm") >= 2
    else:
        assert "debug_dump" in graphs[0]["error"]
    with gzip.open(run / runfiles.TRACE_FILE, "rt") as f:
        names = {e.get("name") for e in json.load(f)["traceEvents"]}
    assert runfiles.GRAPH_CAPTURE_PREFIX + "0" in names and runfiles.GRAPH_REPLAY_PREFIX + "0" in names
    a = audit(run)
    assert a.steps == 3
    assert a.gemm_gpu_us > 0 and len(a.rows)
    # the replayed GEMMs are joined to the launches captured: module, op and shapes as if eager
    assert (a.rows["graph"] == 0).all() and a.attributed_share >= 0.95
    assert {(r.m, r.n, r.k) for r in a.rows.itertuples()} == {(64, 4096, 1024), (64, 1024, 4096)}
    text = " ".join(a.notes)
    assert "with_modules" not in text and "record_shapes" not in text
