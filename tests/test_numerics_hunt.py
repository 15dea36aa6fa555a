"""The split-K bug hunt on the H200 (tests/fixtures/numerics, PROVENANCE.md there) against the known-issue
table, and the numerics check's tolerance arithmetic (CPU: `gpu.numerics.bound_terms` imports no torch)."""
from __future__ import annotations

import gzip
import json

import pytest
from conftest import FIXTURES

from cublaslt_probe import known_issues as KI
from cublaslt_probe.gpu import numerics

HUNT = FIXTURES / "numerics" / "hunt_splitk_h200.json.gz"


@pytest.fixture(scope="module")
def hunt():
    with gzip.open(HUNT, "rt") as f:
        return json.load(f)


def rows(cols: dict) -> list[dict]:
    return [dict(zip(cols, vals)) for vals in zip(*cols.values())]


def verdict(r: dict, env: dict) -> str | None:
    cfg = {"algo_id": r.get("algo_id", 66), "split_k": r["split_k"], "stages": r["stages"], "k": r["k"],
           "kernel": r.get("kernel"), "grouped": False}
    ms = KI.match(cfg, cublas=env["cublaslt"], cc=env["cc"])
    assert len(ms) <= 1
    return ms[0].verdict if ms else None


def test_every_failing_config_meets_the_bug(hunt):
    fails = rows(hunt["failures"])
    assert len(fails) == hunt["counts"]["failed"] == 6972
    assert {verdict(r, hunt["env"]) for r in fails} == {KI.MEETS}
    assert all(not r["numerics_ok"] and r["error_ratio"] > 1 for r in fails)
    # the same configs on the fixed library or on an A100 are not flagged
    r = fails[0]
    cfg = {"algo_id": 66, "split_k": r["split_k"], "stages": r["stages"], "k": r["k"]}
    assert KI.match(cfg, cublas="13.8.0.4", cc="9.0") == [] and KI.match(cfg, cublas="13.1.0", cc="8.0") == []


def test_no_config_outside_the_conditions_failed(hunt):
    table = hunt["ran_failed_by_dtype_layout_split_verdict"]
    assert sum(ran for ran, _ in table.values()) == hunt["counts"]["ran"]
    assert all(failed == 0 for key, (_, failed) in table.items() if key.endswith("|none"))
    meets = {k: v for k, v in table.items() if k.endswith("|meets")}
    assert sum(ran for ran, _ in meets.values()) == 6984 and sum(f for _, f in meets.values()) == 6972


def test_the_near_misses_are_flagged_configs(hunt):
    """The 12 configs that meet the conditions yet pass the (worst-case) bound: one fp16 TN shape, K = 8193
    (floor(8193/s) = 8192/s), all with the same error at 0.96 of the bound; no config outside the conditions
    comes above 0.5 of it (the output's rounding alone reaches 0.5)."""
    ok = rows(hunt["passing_sample"])
    flagged = [r for r in ok if verdict(r, hunt["env"]) == KI.MEETS]
    assert len(flagged) == 12
    assert {(r["dtype"], r["layout"], r["tokens"], r["k"]) for r in flagged} == {("fp16", "TN", 16, 8193)}
    assert min(r["error_ratio"] for r in flagged) > 0.9
    assert max(r["error_ratio"] for r in ok if verdict(r, hunt["env"]) is None) < 0.5


def test_the_heuristic_picks_a_failing_config_and_the_table_flags_each(hunt):
    picks = rows(hunt["picks"])
    assert len(picks) == 1992
    bad = [p for p in picks if not p["numerics_ok"]]
    assert len(bad) == 16 and all(p["known_issue"] and "6580689" in p["known_issue"] for p in bad)
    assert ({(p["layout"], p["tokens"], p["algo_id"], p["tile"], p["split_k"]) for p in bad}
            == {("NT", 16, 66, "64x32", 2)})
    assert all(p["numerics_ok"] for p in picks if not p["known_issue"])
    assert all(verdict(p, hunt["env"]) == KI.MEETS for p in bad)
    # the table, applied now, flags no pick that computed the right answer (the picks include algo 66 with
    # split-K 2 and 3 on K that the split divides, or whose floor is no multiple of 64)
    good66 = [p for p in picks if p["numerics_ok"] and p["algo_id"] == 66 and p["split_k"] > 1]
    assert len(good66) > 100 and not any(verdict(p, hunt["env"]) for p in good66)
    # torch's own layout (TN, K a multiple of 8): the heuristic's algo-66 split-K is at most 3 there, so
    # K % s = 0 or floor(K/s) is no multiple of 64: it never picks a config that meets the conditions
    aligned = [p for p in picks if p["layout"] == "TN" and p["k"] % 8 == 0 and p["algo_id"] == 66]
    assert aligned and max(p["split_k"] for p in aligned) <= 3 and not any(p["known_issue"] for p in aligned)


def test_bound_terms():
    c_ref, c_abs = numerics.bound_terms("bf16", 4096)
    assert c_ref == 2 * 2 ** -8 and c_abs == 2 * 4096 * 2 ** -24
    assert numerics.bound_terms("fp16", 4096)[0] == 2 * 2 ** -11
    # a split-K reduced in the output type: each partial rounded once more
    assert numerics.bound_terms("bf16", 4096, 4, True)[1] == 2 * (4096 * 2 ** -24 + 4 * 2 ** -8)
    assert numerics.bound_terms("bf16", 4096, 1, True) == numerics.bound_terms("bf16", 4096)
    with pytest.raises(ValueError, match="int8"):
        numerics.bound_terms("int8", 16)
