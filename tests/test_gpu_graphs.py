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

    from cublaslt_probe.analysis.audit import audit
    from cublaslt_probe.gpu.recorder import capture
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


def test_reduce_overhead_inside_the_capture(tmp_path):
    """torch.compile(mode="reduce-overhead") compiled, recorded and replayed inside the capture: the replayed
    GEMMs (cudagraph trees) are joined to the ops of the graph's recording, and each is named by the module of
    its compiled graph node (compiled code runs no module hook)."""
    import torch

    from cublaslt_probe.analysis.audit import audit
    from cublaslt_probe.gpu.recorder import capture

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.up = torch.nn.Linear(1024, 4096, bias=False)
            self.down = torch.nn.Linear(4096, 1024, bias=False)

        def forward(self, x):
            return self.down(torch.nn.functional.gelu(self.up(x)))
    torch.manual_seed(0)
    model = Tiny().cuda().to(torch.bfloat16).eval()
    compiled = torch.compile(model, mode="reduce-overhead")
    x = torch.randn(64, 1024, device="cuda", dtype=torch.bfloat16)
    run = tmp_path / "run"
    with capture(run, model=compiled) as cap, torch.no_grad():
        for _ in range(2):                       # compile and warm up, then record the graph
            torch.compiler.cudagraph_mark_step_begin()
            compiled(x)
        for _ in range(3):
            with cap.step():
                torch.compiler.cudagraph_mark_step_begin()
                compiled(x)
    env = json.loads((run / runfiles.ENV_FILE).read_text())
    assert env["capture"]["cuda_graphs"] and env["capture"]["compiled_gemm_nodes"] == 2
    recs = [json.loads(x) for x in (run / runfiles.COMPILED_GEMMS_FILE).read_text().splitlines()]
    assert [(r["module"], r["m"], r["n"], r["k"]) for r in recs] == [("up", 64, 4096, 1024), ("down", 64, 1024, 4096)]
    a = audit(run)
    assert a.steps == 3 and len(a.rows)
    assert a.rows["graph"].notna().all() and a.attributed_share >= 0.95
    assert {(r.module, r.m, r.n, r.k) for r in a.rows.itertuples()} == {("up", 64, 4096, 1024),
                                                                         ("down", 64, 1024, 4096)}


def test_graph_times_replay_each_path():
    """`measure.graph_times`: a GEMM on torch's paths is timed replayed from a CUDA graph; the raw cuBLASLt
    path is not captured, and says so."""
    from cublaslt_probe.cases import Case
    from cublaslt_probe.gpu.measure import graph_times
    from cublaslt_probe.gpu.probe import Probe
    probe = Probe(reps=5, pipeline=False)
    cases = [Case(p, "mm", "bf16", "NN", 64, 4096, 1024, 1) for p in ("torch", "torch-lt", "lt")]
    got = graph_times(probe, cases)
    assert all(g["graph_us"] and g["graph_us"] > 0 and g["graph_error"] is None for g in got[:2])
    assert got[2]["graph_us"] is None and "not captured" in got[2]["graph_error"]


def test_graph_candidate_times_replay_the_heuristics_candidates():
    """`measure.graph_candidate_times`: the heuristic's candidates, each replayed from a CUDA graph on a stream
    of its own (the raw cuBLASLt call is bound to the stream it was built on)."""
    from cublaslt_probe.cases import Case
    from cublaslt_probe.gpu.measure import graph_candidate_times
    from cublaslt_probe.gpu.probe import Probe
    probe = Probe(reps=5, pipeline=False)
    got = graph_candidate_times(probe, Case("torch", "mm", "bf16", "NT", 16, 14336, 4096, 1), top=3)
    assert set(got) <= {0, 1, 2} and got.get(0) and all(v is None or v > 0 for v in got.values())
