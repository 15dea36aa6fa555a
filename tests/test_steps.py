"""Steps found in captures without step marks (`steps.found_steps`), on the committed real captures: a whole-script
CLI capture, and a training capture with its step marks removed (found from its optimizer steps). Expected
figures are counted independently from the trace's JSON."""
from __future__ import annotations

import gzip
import json
import shutil

import pytest
from conftest import FIXTURES

from cublaslt_probe import runfiles
from cublaslt_probe.analysis.audit import audit
from cublaslt_probe.analysis.trace import PY_MODULE_PREFIX

SCRIPT = FIXTURES / "programs" / "cli_script"
TRAIN = FIXTURES / "programs" / "gpt2_train"


def _events(run):
    with gzip.open(run / runfiles.TRACE_FILE, "rt") as f:
        return json.load(f)


def _gemm_us_after(doc, t0: float, t1: float = float("inf")) -> float:
    """GPU time of the GEMM kernels (nvjet, cutlass, xmma, gemm in the name; not attention's fmha) whose launch
    call lies in [t0, t1), from the runtime and driver events' correlation ids."""
    ev = doc["traceEvents"]
    launch = {e["args"]["correlation"]: e["ts"] for e in ev
              if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in (e.get("args") or {})}
    out = 0.0
    for e in ev:
        low = e["name"].lower() if e.get("cat") == "kernel" else ""
        if not any(w in low for w in ("nvjet", "gemm", "cutlass", "xmma")) or "fmha" in low:
            continue
        t = launch.get(e["args"].get("correlation"))
        if t is not None and t0 <= t < t1:
            out += e["dur"]
    return out


def _top_calls(doc, name):
    return sorted(e["ts"] for e in doc["traceEvents"] if e.get("name") == runfiles.MODULE_PREFIX + name)


def test_script_capture_steps_are_the_model_forward_calls():
    doc = _events(SCRIPT)
    calls = _top_calls(doc, "Sequential_0")
    assert len(calls) == 3                     # the script runs its model three times
    a = audit(SCRIPT)
    assert a.steps == len(calls) - 1           # the first left out as warm-up
    assert any("Sequential_0's forward" in n and "3 calls" in n for n in a.notes)
    # per step: the GEMM kernels launched from the second forward call on, over the steps
    assert a.gemm_gpu_us == pytest.approx(_gemm_us_after(doc, calls[1]) / a.steps, rel=1e-6)
    assert a.rows["gpu_us"].sum() == pytest.approx(a.gemm_gpu_us, rel=1e-6)
    a0 = audit(SCRIPT, warmup=0)
    assert a0.steps == 3
    assert a0.gemm_gpu_us == pytest.approx(_gemm_us_after(doc, calls[0]) / 3, rel=1e-6)
    # every row's calls are per step: each of the 5 GEMMs runs once per step (fwd 2, bwd 3)
    assert sorted(a.rows["calls"].tolist()) == [1.0] * 5


def test_script_capture_says_where_the_rest_went():
    a = audit(SCRIPT)
    note = next(n for n in a.notes if n.startswith("outside the audited steps"))
    assert "memory copies" in note and "cold-start" in note and "nan" not in note
    # the weight copies are outside the steps: the step's GPU time is led by GEMMs, not copies
    assert a.gemm_gpu_us / a.step_gpu_us > 0.3
    assert not a.timeline["kind"].astype(str).str.contains("driver copies").any() or \
        a.timeline.loc[a.timeline["provenance"].astype(str).str.contains("driver"), "total_us"].sum() \
        < 0.1 * a.step_gpu_us
    # host stalls come from the steps, not from the first call's 100 ms in addmm
    assert (a.stalls["worst_us"] < 50_000).all()
    assert audit(SCRIPT, warmup=0).stalls["worst_us"].max() > 100_000


def test_nn_module_python_ranges_find_the_same_steps(tmp_path):
    """A trace whose module ranges are torch's ``nn.Module:`` python functions (with_modules and with_stack)."""
    doc = _events(SCRIPT)
    for e in doc["traceEvents"]:
        if str(e.get("name", "")).startswith(runfiles.MODULE_PREFIX) and e.get("cat") == "user_annotation":
            e["name"] = PY_MODULE_PREFIX + e["name"][len(runfiles.MODULE_PREFIX):]
            e["cat"] = "python_function"
    out = tmp_path / "run"
    out.mkdir()
    with gzip.open(out / runfiles.TRACE_FILE, "wt") as f:
        json.dump(doc, f)
    a = audit(out / runfiles.TRACE_FILE)
    assert a.steps == 2
    assert a.gemm_gpu_us == pytest.approx(audit(SCRIPT).gemm_gpu_us, rel=1e-6)


def test_training_capture_without_step_marks_steps_at_the_optimizer(tmp_path):
    doc = _events(TRAIN)
    opt = sorted((e["ts"], e["ts"] + e["dur"]) for e in doc["traceEvents"]
                 if str(e.get("name", "")).startswith("Optimizer.step#") and e.get("cat") == "user_annotation")
    marked = audit(TRAIN)
    doc["traceEvents"] = [e for e in doc["traceEvents"]
                          if not str(e.get("name", "")).startswith(runfiles.STEP_PREFIX)]
    out = tmp_path / "run"
    shutil.copytree(TRAIN, out)
    with gzip.open(out / runfiles.TRACE_FILE, "wt") as f:
        json.dump(doc, f)
    a = audit(out, warmup=0)
    assert a.steps == len(opt) == marked.steps
    assert any("optimizer step" in n for n in a.notes)
    # the found steps hold the same GEMMs as the marked ones
    assert a.gemm_gpu_us == pytest.approx(marked.gemm_gpu_us, rel=0.01)
    one = audit(out)                            # warm-up 1: the second step alone
    assert one.steps == len(opt) - 1
    assert one.gemm_gpu_us == pytest.approx(_gemm_us_after(doc, opt[0][1], opt[1][1]), rel=0.01)


def test_no_module_ranges_whole_trace_with_a_note():
    a = audit(FIXTURES / "programs" / "llama_decode_with_modules")
    assert a.steps == 1
    assert any("no step ranges and no module ranges" in n for n in a.notes)


def _with_capture_facts(tmp_path, **facts):
    out = tmp_path / "run"
    shutil.copytree(SCRIPT, out)
    env = json.loads((out / runfiles.ENV_FILE).read_text())
    env["capture"].update(facts)
    (out / runfiles.ENV_FILE).write_text(json.dumps(env))
    return out


def test_capture_facts_choose_how_steps_are_found(tmp_path):
    """env.json's ``capture.step_finding`` and ``capture.warmup`` (written by `capture --whole-script`,
    `--warmup N`) decide, and audit's own warmup wins over the capture's."""
    whole = audit(_with_capture_facts(tmp_path / "a", step_finding="whole"))
    assert whole.steps == 1 and any("--whole-script" in n for n in whole.notes)
    run = _with_capture_facts(tmp_path / "b", step_finding="found", warmup=0)
    assert audit(run).steps == 3
    assert audit(run, warmup=2).steps == 1
    bad = audit(_with_capture_facts(tmp_path / "c", step_finding="found", warmup="two"))
    assert bad.steps == 2                       # not a count: audit's default


def test_cli_warmup_option(tmp_path):
    from click.testing import CliRunner

    from cublaslt_probe.cli import main
    r = CliRunner().invoke(main, ["audit", str(SCRIPT), "--warmup", "0", "-f", "jsonl"])
    assert r.exit_code == 0, r.output
    rows = [json.loads(x) for x in r.output.splitlines() if x.startswith("{")]
    assert sum(x["calls"] for x in rows) == 5          # per step: each GEMM once
    r = CliRunner().invoke(main, ["audit", str(SCRIPT), "--warmup", "-1"])
    assert r.exit_code == 2 and "warmup" in r.output
