"""GPU tests of a one-shot command's probe: it sets up only what its GEMMs use (no heuristic companion, no prewarm
thread, the operand pool of its own dtype only, no other type's cuBLASLt set-up), and its answers are those of a
sweep's probe, which sets everything up as it starts. Skipped with a reason without a GPU."""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cublaslt_probe.cases import Case
from cublaslt_probe.logs import without_pointers

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parent.parent
CASE = Case("torch", "mm", "bf16", "NT", 16, 4096, 4096)
SAME = ("rank", "algo_id", "tile", "stages", "cluster", "split_k", "reduction_scheme", "custom_option",
        "cta_swizzling", "inner_shape", "waves", "workspace_bytes", "kernels")   # a candidate's identity

def same_lines(lines) -> list:
    """Log lines as two processes' lines of the same call compare: without time stamps, pointers and the pid."""
    return [re.sub(r"^\[cublasLt\]\[\d+\]", "[cublasLt]", x) for x in without_pointers(lines)]


# a fresh process, as `explain` runs: the probe the command makes, what it started, and its answer
CHILD = """
import json, multiprocessing, sys, threading
from cublaslt_probe.cases import Case
from cublaslt_probe.gpu.explain import gather
from cublaslt_probe.gpu.probe import Probe, ProbeOptions
opts = json.loads(sys.argv[1])
p = Probe(ProbeOptions(**opts))
ev = gather(Case.from_key(sys.argv[2]), top=8, probe=p)
print(json.dumps({"companion": p._companion is not None, "prewarm": p._prewarm is not None,
                  "children": [c.name for c in multiprocessing.active_children()],
                  "threads": sorted(t.name for t in threading.enumerate()), "pools": list(p.builder.pools),
                  "phases": [n for n, _ in p.startup.phases], "record": ev["record"],
                  "candidates": ev.get("candidates"), "error": ev.get("candidates_error")}))
"""


def _one_shot(options: dict, case: Case = CASE) -> dict:
    p = subprocess.run([sys.executable, "-c", CHILD, json.dumps(options), case.key], capture_output=True, text=True,
                       timeout=300, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def explained():
    return _one_shot({"pipeline": False})


def test_a_one_shot_probe_starts_no_helper_and_builds_only_what_its_gemm_uses(explained):
    got = explained
    assert not got["companion"] and not got["prewarm"] and got["children"] == [], got
    assert not {"cublaslt-probe-prewarm", "cublaslt-setup"} & set(got["threads"]), got["threads"]
    assert got["pools"] == ["bf16"], got["pools"]
    assert "cuBLASLt set-up bf16 (first needed)" in got["phases"], got["phases"]
    assert not any(n.startswith("heuristic companion") or n == "cuBLASLt set-ups joined" for n in got["phases"]), \
        got["phases"]
    assert any(n.startswith("CUPTI started") for n in got["phases"]), got["phases"]


def test_a_pipelined_probe_for_a_small_plan_starts_no_helper_either():
    got = _one_shot({"plan": 9})
    assert not got["companion"] and not got["prewarm"] and got["children"] == [], got
    assert got["record"]["heuristic_where"] == "probe" and got["record"]["heuristic_miss_us"] > 0


def test_a_one_shot_answer_is_the_sweep_probes(explained):
    """The one-shot probe's record of the GEMM and its candidates against a sweep's probe (companion, prewarm
    thread, every set-up at its start) in this process: the same kernels, log lines, algo and candidates, times
    within the method's noise."""
    from cublaslt_probe.gpu.explain import gather
    from cublaslt_probe.gpu.probe import Probe
    with Probe() as probe:
        assert probe._companion is not None and probe._prewarm is not None
        ev = gather(CASE, top=8, probe=probe)
    one, full = explained["record"], ev["record"]
    assert not one["error"] and not full["error"], (one["error"], full["error"])
    assert one["kernels"] == full["kernels"]
    assert one["log_lines"] and same_lines(one["log_lines"]) == same_lines(full["log_lines"])
    assert abs(one["time_us"] / full["time_us"] - 1) < 0.1, (one["time_us"], full["time_us"])
    assert one["timing"]["launch"] == full["timing"]["launch"] == "replay"
    cands = explained["candidates"]
    assert cands and [[c[k] for k in SAME] for c in cands] == [[c[k] for k in SAME] for c in ev["candidates"]]
