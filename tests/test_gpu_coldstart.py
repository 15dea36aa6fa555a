"""GPU tests of `cold-start`: real child processes on the GPU, the analysis on what they measured.

The step factories below are module-level so that the children can load them from this file by name.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from cublaslt_probe.analysis.coldstart.breakdown import analyse, forced_jit
from cublaslt_probe.analysis.coldstart.observed import observed_provenance
from cublaslt_probe.analysis.coldstart.runs import compute_cache_written, modules_in, new_problems, ptx_loads, windows
from cublaslt_probe.gpu.coldstart import run

HERE = Path(__file__).resolve()


def _capture_script():
    spec = importlib.util.spec_from_file_location("capture_coldstart", HERE.parent.parent / "scripts" /
                                                  "capture_coldstart.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def make_eager_step():
    import torch
    a = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, 2048, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(4096, device="cuda", dtype=torch.bfloat16)

    def step():
        torch.relu(torch.nn.functional.linear(a, w, b)) @ w
    return step


def _mlp(x, w1, w2):
    import torch
    return torch.nn.functional.gelu(x @ w1) @ w2 + x


def make_compiled_step():
    import torch
    x = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)
    w1 = torch.randn(1024, 2048, device="cuda", dtype=torch.bfloat16)
    w2 = torch.randn(2048, 1024, device="cuda", dtype=torch.bfloat16)
    f = torch.compile(_mlp)

    def step():
        f(x, w1, w2)
    return step


def make_ptx_step():
    return _capture_script().make_ptx_only()


def _target(name):
    return f"{HERE}:{name}"


def _adds_up(a):
    total = sum(c["seconds"] for c in a["components"]) + a["unexplained_s"]
    assert total == pytest.approx(a["excess_s"], abs=1e-9)
    assert a["excess_s"] == pytest.approx(a["step1_s"] - a["steady_s"], abs=1e-12)


@pytest.mark.gpu
def test_eager_step_is_not_runtime_compiled_and_adds_up():
    raw = run(_target("make_eager_step"), steps=5, env_set="default", timeout=240, repeat=1)
    assert all(r.get("ok") for r in raw["runs"].values()), {k: r.get("error") for k, r in raw["runs"].items()}
    a = analyse(raw)
    assert not a["compilation"]["observed"], a["compilation"]
    _adds_up(a)
    cold = raw["runs"]["cold"]
    # CUPTI saw the lazy loads of step 1 and the eager run loaded its modules at start instead
    assert modules_in(cold, "step1").get("count", 0) > 0
    assert modules_in(raw["runs"]["eager"], "step1").get("count", 0) < \
        modules_in(cold, "step1")["count"]
    # the level-2 log of step 1 holds its GEMMs (two per step: the Lt path with bias and the cuBLAS path)
    newp, lines = new_problems(cold)
    assert lines >= 2 and newp >= 2
    assert {c["cause"] for c in a["components"]} >= {"initialisation", "module_loading", "heuristics"}


@pytest.mark.gpu
def test_compiled_step_is_runtime_compiled_and_a_warm_cache_removes_it():
    raw = run(_target("make_compiled_step"), steps=4, env_set="compile", timeout=300, repeat=1)
    assert all(r.get("ok") for r in raw["runs"].values()), {k: r.get("error") for k, r in raw["runs"].items()}
    a = analyse(raw)
    assert a["compilation"]["observed"] and "triton" in a["compilation"]["mechanisms"]
    comp = {c["cause"]: c for c in a["components"]}
    assert comp["runtime_compilation"]["seconds"] > 0.2
    cold_w = windows(raw["runs"]["cold"])["step1"]
    warm_w = windows(raw["runs"]["warm"])["step1"]
    assert cold_w.get("triton_kernels")
    assert not warm_w.get("triton_kernels")  # warm cache: nothing compiled again
    prov = observed_provenance(raw)
    assert any(v["mechanism"] == "triton" for v in prov.values())
    _adds_up(a)


@pytest.mark.gpu
def test_ptx_module_is_jit_compiled_detected_and_timed():
    raw = run(_target("make_ptx_step"), steps=4, envs="cold,warm,nojit,forcejit,forcejit_warm",
                        timeout=240, repeat=1)
    runs = raw["runs"]
    assert runs["cold"]["ok"] and runs["warm"]["ok"], runs["cold"].get("error")
    a = analyse(raw)
    assert a["compilation"]["observed"] and "ptx-jit" in a["compilation"]["mechanisms"]
    assert compute_cache_written(runs["cold"]) > 0
    loads = ptx_loads(runs["cold"])
    assert loads and loads[0]["name"].startswith("cuModuleLoadData") and loads[0]["seconds"] > 0
    prov = observed_provenance(raw)
    assert prov.get("coldstart_ptx_0", {}).get("mechanism") == "ptx-jit"
    assert not runs["nojit"]["ok"]  # PTX only: with JIT disabled and an empty ComputeCache it cannot load
    assert runs["forcejit"]["ok"] and runs["forcejit_warm"]["ok"]
    fj = forced_jit(raw)
    assert fj["detected"] and compute_cache_written(runs["forcejit"]) > 0
    assert fj["seconds"] > 0.05  # forced JIT, timed: forcejit step 1 − warm step 1
    _adds_up(a)
