"""GPU tests of candidates, first-call, explain and replay (run where an NVIDIA GPU is visible: pytest -m gpu)."""
import json

import pytest
from click.testing import CliRunner

from cublaslt_probe.cli import main

pytestmark = pytest.mark.gpu


def test_candidates_cli_marks_pick_and_fastest(tmp_path):
    save = tmp_path / "c.json"
    r = CliRunner().invoke(main, ["candidates", "--m", "512", "--n", "4096", "--k", "4096", "--dtype", "bf16",
                                  "--layout", "NT", "--top", "8", "--save", str(save)])
    assert r.exit_code == 0, r.output
    assert "heuristic pick" in r.output and "fastest" in r.output and "regret = time(#0)" in r.output
    saved = json.loads(save.read_text())
    assert 1 <= len(saved["candidates"]) <= 8


def test_first_call_verdict():
    r = CliRunner().invoke(main, ["first-call", "--m", "64", "--n", "2048", "--k", "2048", "--dtype", "bf16"])
    assert r.exit_code == 0, r.output
    assert "verdict: selected by heuristics; no runtime compilation observed" in r.output
    assert "lazy module loading" in r.output


def test_explain_one_screen():
    r = CliRunner().invoke(main, ["explain", "--m", "128", "--n", "4096", "--k", "4096", "--dtype", "bf16"])
    assert r.exit_code == 0, r.output
    for part in ("1. cuBLASLt log", "3. kernel(s) that ran", "5. tiles and waves", "8. among the heuristic"):
        assert part in r.output
    assert "agrees with the logged algo (tile, cluster, split-K): yes" in r.output


def test_replay_every_line_of_a_committed_level2_log(fixtures):
    from cublaslt_probe.gpu import replay
    from cublaslt_probe.logs import load_log
    recs, _ = load_log(fixtures / "logs" / "level2_torchlt.log")
    res = replay.replay([r for r in recs if r.kind == "trace"], reps=3)
    ran = [r for r in res if not r.get("error")]
    assert len(ran) == len(res), [r["error"] for r in res if r.get("error")][:3]
    assert all(r["consistent_with_log"] is not False for r in ran)
    assert sum(1 for r in ran if r["consistent_with_log"]) >= 0.7 * len(ran)
