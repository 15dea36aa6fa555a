"""Kernels replayed from CUDA graphs (`graphs.join`), on the committed H200 captures of tests/fixtures/graphs: a
Llama-shaped decode step replayed from a graph captured inside the capture, the same graph captured before the
capture opened, and unmodified scripts through `capture --`. Expected figures come from the trace's JSON."""
from __future__ import annotations

import gzip
import json
import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import FIXTURES

from cublaslt_probe import runfiles
from cublaslt_probe.analysis import graphs
from cublaslt_probe.analysis.audit import audit
from cublaslt_probe.cli import main
from cublaslt_probe.names import decode
from cublaslt_probe.render.audit import render_html

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


def _without_kernel(tmp_path, pick) -> Path:
    """A copy of the graph_captured run whose last replay lost one kernel (`pick` chooses it among the replay's
    kernels in GPU order): its correlation id no longer names the graph launch."""
    doc = _doc(CAPTURED)
    ev = doc["traceEvents"]
    corr = sorted({e["args"]["correlation"] for e in ev if e.get("name") == "cudaGraphLaunch"})
    last = sorted((e for e in ev if e.get("cat") == "kernel" and e["args"].get("correlation") == corr[-1]),
                  key=lambda e: e["ts"])
    pick(last)["args"]["correlation"] = -1
    out = tmp_path / "run"
    shutil.copytree(CAPTURED, out)
    with gzip.open(out / runfiles.TRACE_FILE, "wt") as f:
        json.dump(doc, f)
    return out


def test_a_replay_short_of_a_node_joins_its_gemms_in_order(tmp_path):
    """A replay that lost a kernel that is not a GEMM no longer matches its capture node for node; its GEMM
    kernels still match the capture's GEMM ops one for one, in order, and are joined (a note says how)."""
    a = audit(_without_kernel(tmp_path, lambda ks: ks[-1]))
    assert any("joined to the capture's GEMM ops in order" in n for n in a.notes)
    assert not any("did not match their capture" in n for n in a.notes)
    assert a.attributed_share == pytest.approx(1.0)
    assert a.rows["m"].notna().all()


def test_a_replay_short_of_a_gemm_is_not_joined(tmp_path):
    """A replay that lost a GEMM kernel matches its capture neither node for node nor GEMM for GEMM: it is not
    joined (its kernels keep no op) and a note says so; the other replays still are."""
    a = audit(_without_kernel(tmp_path, lambda ks: next(k for k in ks if decode(k["name"]).kind == "gemm")))
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


@pytest.mark.parametrize("run", ["graph_captured", "graph_before", "script_infer", "script_train", "reduce_overhead"])
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


# --------------------------------------------------------------------------- torch.compile(mode="reduce-overhead")
RO = G / "reduce_overhead"


@pytest.fixture(scope="module")
def reduce_overhead():
    return audit(RO)


def test_reduce_overhead_rows_carry_module_op_and_shape(reduce_overhead):
    """Inductor's cudagraph trees launch the graph inside the compiled region (its kernels' External id names
    that op, not the ones that built them); the replayed GEMMs are joined to the ops of the graph's recording
    and named by the modules of the compiled graph's nodes."""
    a = reduce_overhead
    want, steps = _replayed_gemm_us(_doc(RO))
    assert a.steps == steps == 4
    assert a.gemm_gpu_us == pytest.approx(want, rel=1e-6) and a.rows["gpu_us"].sum() == pytest.approx(want, rel=1e-6)
    r = a.rows
    assert r["graph"].notna().all() and a.attributed_share >= 0.95
    assert r["m"].notna().all() and r["op"].eq("aten::mm").all()
    by = {row.module: (row.m, row.n, row.k, row.calls) for row in r.itertuples()}
    assert by["lm_head"] == (128, 128256, 4096, 1.0)
    assert by["layers.*.mlp.down_proj"] == (128, 4096, 14336, 2.0)
    assert by["layers.*.self_attn.k_proj"] == (128, 1024, 4096, 2.0)
    assert len(by) == 8                               # 7 per layer (q, k, v, o, gate, up, down) and lm_head
    assert any("named by the module their graph node came from" in n for n in a.notes)
    assert not any("record_shapes" in n or "not linked" in n for n in a.notes)


def test_reduce_overhead_without_the_compiled_records_names_only_the_wrapper(tmp_path):
    """Without compiled_gemms.jsonl the join still gives op and shapes, but inside compiled code no module range
    ran: every GEMM falls to the compiled model's own range."""
    out = tmp_path / "run"
    shutil.copytree(RO, out)
    (out / runfiles.COMPILED_GEMMS_FILE).unlink()
    a = audit(out)
    assert a.rows["m"].notna().all() and a.rows["graph"].notna().all()
    assert set(a.rows["module"]) == {"Forward"}


def test_reduce_overhead_replays_need_their_capture(tmp_path):
    """The graph's recording range taken out of the trace: its replays cannot be joined, and the note says how
    to capture them."""
    doc = _doc(RO)
    for e in doc["traceEvents"]:
        if str(e.get("name", "")).startswith(runfiles.GRAPH_CAPTURE_PREFIX):
            e["name"] = "renamed"
    out = tmp_path / "run"
    shutil.copytree(RO, out)
    with gzip.open(out / runfiles.TRACE_FILE, "wt") as f:
        json.dump(doc, f)
    a = audit(out)
    assert a.rows["m"].isna().all()
    assert any("whose capture this trace does not hold" in n for n in a.notes)


@pytest.mark.parametrize("path, cls, want", [
    ("L['self'].layers[0].mlp.down_proj", None, "layers.0.mlp.down_proj"),
    ("L['self']._modules['layers']._modules['0']._modules['mlp']", None, "layers.0.mlp"),
    ("self.layers.0.self_attn", None, "layers.0.self_attn"),
    ("L['self']", "Forward", "Forward"),
    ("L__self___layers_0_mlp", None, "layers_0_mlp"),
    ("L['model'].lm_head", None, "lm_head"),
    (None, None, None),
    ("weird path!", None, "weird path!"),
])
def test_module_path_reads_dynamo_paths(path, cls, want):
    assert graphs.module_path(path, cls) == want


def test_compiled_records_are_checked_line_by_line(tmp_path):
    """A damaged line of compiled_gemms.jsonl is skipped; the others still name their modules."""
    out = tmp_path / "run"
    shutil.copytree(RO, out)
    lines = (out / runfiles.COMPILED_GEMMS_FILE).read_text().splitlines()
    (out / runfiles.COMPILED_GEMMS_FILE).write_text("\n".join(["{not json", '{"graph": "x"}'] + lines) + "\n")
    assert len(graphs.read_compiled_gemms(out)) == len(lines)
    assert "lm_head" in set(audit(out).rows["module"])


def test_graph_rows_measured_replayed_from_a_graph_say_so():
    """The saved `audit --measure` of the reduce-overhead program (H200): its GEMMs come from a CUDA graph, so
    the original, the other paths, the what-ifs and the heuristic's candidates were timed replayed from a graph
    (eager times kept); the output says the times are graph-replayed, and no item mixes the two timings."""
    meas = json.loads((RO / "measure.json").read_text())
    for g in meas["gemms"]:
        assert g["timing"] == "graph" and g["graph"] is not None
        rows = [g["original"], *g["paths"], *g["whatifs"], *g["candidates"]]
        assert all(r["eager_us"] > 0 and r["time_us"] > 0 and not r.get("graph_error") for r in rows)
    res = CliRunner().invoke(main, ["audit", str(RO), "--from", str(RO / "measure.json")])
    assert res.exit_code == 0, res.output
    assert "3 GEMMs from CUDA graphs: times graph-replayed" in res.output
    assert "advice (measured):" in res.output and not NAN.search(res.output)
