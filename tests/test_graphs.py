"""Kernels replayed from CUDA graphs (`graphs.join`), on the committed H200 captures of tests/fixtures/graphs: a
Llama-shaped decode step replayed from a graph captured inside the capture, the same graph captured before the
capture opened, and unmodified scripts through `capture --`. Expected figures come from the trace's JSON."""
from __future__ import annotations

import gzip
import json
import re
import shutil

import pytest
from click.testing import CliRunner

from cublaslt_probe import graphs, runfiles
from cublaslt_probe.audit import audit, render_html
from cublaslt_probe.cli import main
from cublaslt_probe.names import decode

from conftest import FIXTURES

G = FIXTURES / "graphs"
CAPTURED, BEFORE = G / "graph_captured", G / "graph_before"
NAN = re.compile(r"\bnan\b|\bNaN\b|\bNaT\b|<NA>", re.IGNORECASE)


def _doc(run):
    with gzip.open(run / runfiles.TRACE_FILE, "rt") as f:
        return json.load(f)


def _replayed_gemm_us(doc) -> tuple[float, int]:
    """GEMM-kind GPU time of the kernels linked to cudaGraphLaunch calls made inside the capture's steps, per
    step, and the number of steps (read with json.load)."""
    ev = doc["traceEvents"]
    steps = [(e["ts"], e["ts"] + e["dur"]) for e in ev if e.get("cat") == "user_annotation"
             and e["name"].startswith(runfiles.STEP_PREFIX)]
    launches = {e["args"]["correlation"] for e in ev if e.get("name") == "cudaGraphLaunch"
                and any(a <= e["ts"] <= b for a, b in steps)}
    us = sum(e["dur"] for e in ev if e.get("cat") == "kernel" and e["args"].get("correlation") in launches
             and decode(e["name"]).kind == "gemm")
    return us / len(steps), len(steps)


@pytest.fixture(scope="module")
def captured():
    return audit(CAPTURED)


def test_replayed_rows_carry_module_op_shape_and_algo(captured):
    a = captured
    want, steps = _replayed_gemm_us(_doc(CAPTURED))
    assert a.steps == steps == 4
    # coverage adds up: every replayed GEMM kernel of the steps is in exactly one row
    assert a.rows["gpu_us"].sum() == pytest.approx(want, rel=1e-6)
    assert a.gemm_gpu_us == pytest.approx(want, rel=1e-6)
    r = a.rows
    assert (r["graph"] == 0).all()
    assert a.attributed_share >= 0.95
    assert r["m"].notna().all() and r["op"].eq("aten::mm").all() and r["algo"].notna().all()
    by = {row.module: (row.m, row.n, row.k) for row in r.itertuples()}
    assert by["lm_head"] == (16, 128256, 4096)
    assert by["layers.*.mlp.down_proj"] == (16, 4096, 14336)
    assert by["layers.*.self_attn.k_proj"] == (16, 1024, 4096)
    # each replay repeats the captured op call: one launch per replay, not one per op call of the trace
    calls = dict(zip(r["module"], r["calls"]))
    assert calls["lm_head"] == 1.0 and calls["layers.*.mlp.down_proj"] == 2.0
    assert r["pct_peak"].notna().all() and (r["pct_peak"] > 0).all()
    assert not any("record_shapes" in n or "with_modules" in n or "not linked" in n for n in a.notes)
    assert any("replayed from CUDA graphs captured inside the capture" in n for n in a.notes)


def test_join_follows_the_captured_order(tmp_path):
    """A replay with a node removed no longer matches its capture node for node: it is not joined (its
    kernels keep no op) and a note says so; the other replays still are."""
    doc = _doc(CAPTURED)
    ev = doc["traceEvents"]
    corr = sorted({e["args"]["correlation"] for e in ev if e.get("name") == "cudaGraphLaunch"})
    first = sorted((e for e in ev if e.get("cat") == "kernel" and e["args"].get("correlation") == corr[-1]),
                   key=lambda e: e["ts"])
    first[-1]["args"]["correlation"] = -1            # the last replay loses a node
    out = tmp_path / "run"
    shutil.copytree(CAPTURED, out)
    with gzip.open(out / runfiles.TRACE_FILE, "wt") as f:
        json.dump(doc, f)
    a = audit(out)
    assert any("did not match their capture" in n for n in a.notes)
    assert a.attributed_share == pytest.approx(0.75, abs=0.01)   # 3 of the 4 replays joined


def test_graph_captured_before_the_capture_says_how_to_fix_it():
    a = audit(BEFORE)
    note = next(n for n in a.notes if "whose capture this trace does not hold" in n)
    assert "before the warm-up and the graph capture" in note and "cudaGraphLaunch" in note
    assert not any("profile with" in n or "no module ranges" in n for n in a.notes)
    want, _ = _replayed_gemm_us(_doc(BEFORE))
    assert a.gemm_gpu_us == pytest.approx(want, rel=1e-6)
    assert a.rows["graph"].isna().all()


def test_read_graph_events_counts_nodes():
    ev = graphs.read_graph_events(CAPTURED / runfiles.TRACE_FILE)
    assert list(ev.captures["graph"]) == [0] and len(ev.replays) == 4 and len(ev.graph_launches) == 4
    c = ev.captures.iloc[0]
    calls = ev.launch_calls[(ev.launch_calls["ts"] >= c.ts) & (ev.launch_calls["ts"] <= c.end)]
    per = ev.kernels.groupby("corr").size()
    assert (per == len(calls)).all()                 # one node per call between begin and end of capture


@pytest.mark.parametrize("run", ["graph_captured", "graph_before", "script_infer", "script_train"])
def test_no_nan_in_any_output(run):
    r = CliRunner()
    for fmt in ("table", "jsonl", "csv"):
        res = r.invoke(main, ["audit", str(G / run), "-f", fmt])
        assert res.exit_code == 0, res.output
        assert not NAN.search(res.output), NAN.search(res.output)
    assert not NAN.search(render_html(audit(G / run)))


def test_script_captures_find_their_steps():
    infer = audit(G / "script_infer")
    assert infer.steps == 3                          # 4 forward calls, the first left out
    assert any("GPT2LMHeadModel_0's forward" in n for n in infer.notes)
    note = next(n for n in infer.notes if n.startswith("outside the audited steps"))
    assert "memory copies" in note
    env = json.loads((G / "script_infer" / runfiles.ENV_FILE).read_text())
    assert env["capture"]["step_finding"] == "found" and env["capture"]["warmup"] == 1
