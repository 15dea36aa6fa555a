"""Known issues (`known_issues`, `logs.issues`, `parse-log --cublas-version --cc`) on real captured log lines.

The lines come from tests/fixtures/logs (captured on the H200, cuBLAS 13.1). Where a test needs a config that
meets bug 6580689's conditions, it alters only the fields the conditions read — K (the K side of Adesc and
Bdesc), numSplitsK or the stages id — and says so; everything else on the line is as captured.
"""
from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner
from conftest import FIXTURES

from cublaslt_probe import known_issues as KI
from cublaslt_probe.cli import main
from cublaslt_probe.logs import parse_line
from cublaslt_probe.logs.issues import annotate, record_config

LOGS = FIXTURES / "logs"


def _line(name: str, number: int) -> str:
    return (LOGS / name).read_text().splitlines()[number - 1]


# level2_torchlt.log line 10: fp16, transa=OP_T, 4096x1x4096, algo 66, 128x8, 64xAUTO, numSplitsK=3 (as captured)
SPLIT3_T = _line("level2_torchlt.log", 10)
# line 9: the same GEMM without transa (A is m x k)
SPLIT3_N = _line("level2_torchlt.log", 9)
# line 13: bf16, algo 66, 64x8, numSplitsK=2, K = 4096
SPLIT2 = _line("level2_torchlt.log", 13)


def with_k(line: str, k: int) -> str:
    """ALTERED: K set to `k` (Adesc's K side by transa, Bdesc's rows); nothing else changes."""
    t = "transa=OP_T" in line
    a = re.search(r"Adesc=\[type=\S+ rows=(\d+) cols=(\d+)", line)
    if t:
        line = line[:a.start(1)] + str(k) + line[a.end(1):]
    else:
        line = line[:a.start(2)] + str(k) + line[a.end(2):]
    return re.sub(r"(Bdesc=\[type=\S+ rows=)\d+", rf"\g<1>{k}", line)


def with_field(line: str, key: str, value: str) -> str:
    """ALTERED: the algo field `key` set to `value`."""
    out, n = re.subn(rf"{key}=\S+?(?=[ \]])", f"{key}={value}", line)
    assert n == 1
    return out


def issues(line: str, **env) -> list:
    r = parse_line(line)
    return KI.match(record_config(r), **env)


H200 = {"cublas": "13.1.0.3", "cc": "9.0"}
# K = 3·1344 + 1: 3 does not divide it and floor(K/3) = 1344 = 21·64 (stage size 64 from 64xAUTO)
K_MEETS_3 = 4033


def test_captured_lines_meet_nothing():
    # as captured: numSplitsK=3 with K=4096 (3 does not divide 4096 but floor = 1365 is no multiple of 64),
    # numSplitsK=2 with K=4096 (2 divides it); lines without split-K
    for line in (SPLIT3_T, SPLIT3_N, SPLIT2):
        assert parse_line(line).k == 4096
        assert issues(line, **H200) == []
    recs = [parse_line(x) for x in (LOGS / "level2_torchlt.log").read_text().splitlines() if "[Trace]" in x]
    assert recs and all(r.known_issue is None for r in annotate(recs, **H200))


@pytest.mark.parametrize("line", [SPLIT3_T, SPLIT3_N], ids=["transa=T", "transa=N"])
def test_split_k_tail_meets_on_the_h200(line):
    ms = issues(with_k(line, K_MEETS_3), **H200)
    assert [(m.issue.bug_id, m.verdict) for m in ms] == [("6580689", KI.MEETS)]
    text = ms[0].text()
    assert "6580689" in text and "fixed in cuBLAS 13.8.0.4" in text and "meets" in text


@pytest.mark.parametrize("cublas,cc,expect", [
    ("13.8.0.4", "9.0", None),          # the fixed version
    ("13.9", "9.0", None),
    ("12.6.2", "9.0", None),            # before it was introduced
    ("12.6.3", "9.0", KI.MEETS),        # the first affected version
    ("13.8.0.3", "10.0", KI.MEETS),     # the last one, on 10.x
    ("13.1.0.3", "12.0", KI.MEETS),     # 12.x: listed? no -> see below
    ("13.1.0.3", "8.0", None),          # another compute capability
    ("13.1.0.3", "8.9", None),
    ("13.8.0", "9.0", KI.CAN_MEET),     # 13.8.0 without its build: before or after 13.8.0.4
    (None, "9.0", KI.CAN_MEET),
    ("13.1.0.3", None, KI.CAN_MEET),
    (None, None, KI.CAN_MEET),
])
def test_versions_and_compute_capabilities(cublas, cc, expect):
    if cc == "12.0":
        expect = None   # the notes list 9.0, 10.x and 11.x only
    ms = issues(with_k(SPLIT3_T, K_MEETS_3), cublas=cublas, cc=cc)
    assert [m.verdict for m in ms] == ([] if expect is None else [expect])
    if expect == KI.CAN_MEET:
        assert "unknown" in ms[0].text()


@pytest.mark.parametrize("k,s,expect", [
    (4033, "3", KI.MEETS),   # floor = 1344 = 21·64
    (4032, "3", None),       # 3 divides K
    (4034, "3", KI.MEETS),   # r = 2
    (4035, "3", None),       # floor = 1345
    (4097, "2", KI.MEETS),   # floor = 2048
    (4096, "2", None),
    (4097, "1", None),       # no split-K
])
def test_the_shape_rule(k, s, expect):
    line = with_field(with_k(SPLIT2, k), "numSplitsK", s)
    ms = issues(line, **H200)
    assert [m.verdict for m in ms] == ([] if expect is None else [expect])


def test_stage_size_from_the_stages_id_and_where_it_is_unknown():
    # ALTERED stages: 32xAUTO makes 4033 (floor 1344 = 42·32) still meet; 128xAUTO not (1344 = 10.5·128)
    base = with_k(SPLIT3_T, K_MEETS_3)
    assert [m.verdict for m in issues(with_field(base, "stages", "MATMUL_STAGES_32xAUTO"), **H200)] == [KI.MEETS]
    assert issues(with_field(base, "stages", "MATMUL_STAGES_128xAUTO"), **H200) == []
    # a stages id without a size: the rule can hold, not certainly
    ms = issues(with_field(base, "stages", "MATMUL_STAGES_UNDEFINED"), **H200)
    assert [m.verdict for m in ms] == [KI.CAN_MEET] and ms[0].unknown == ("stage size",)
    # the kernel name says it where the stages id does not
    cfg = {**record_config(parse_line(with_field(base, "stages", "MATMUL_STAGES_UNDEFINED"))),
           "kernel": "nvjet_sm90_hsh_128x8_64x12_4x1_v_bz_splitK_TNT"}
    assert [m.verdict for m in KI.match(cfg, **H200)] == [KI.MEETS]
    cfg["kernel"] = "nvjet_sm90_hsh_128x8_128x6_4x1_v_bz_splitK_TNT"
    assert KI.match(cfg, **H200) == []


def test_other_algos_are_never_flagged():
    line = with_field(with_k(SPLIT3_T, K_MEETS_3), "algoId", "24")   # ALTERED algo id
    assert issues(line, **H200) == [] and issues(line) == []


def test_grouped_host_pointer_rule():
    grouped = {"algo_id": 66, "split_k": 1, "grouped": True, "pointer_mode": "host", "dtype": "bf16", "waves": 3.5}
    assert [m.verdict for m in KI.match(grouped, cublas="13.4.0", cc="9.0")] == [KI.MEETS]
    assert KI.match(grouped, cublas="13.1.0.3", cc="9.0") == []      # grouped GEMM came in 13.4.0
    assert KI.match(grouped, cublas="13.8.0.4", cc="9.0") == []
    assert KI.match(grouped, cublas="13.4.0", cc="10.0") == []       # Hopper only
    assert KI.match({**grouped, "waves": 2}, cublas="13.4.0", cc="9.0") == []
    assert KI.match({**grouped, "pointer_mode": "device"}, cublas="13.4.0", cc="9.0") == []
    ms = KI.match({**grouped, "waves": None}, cublas="13.4.0", cc="9.0")
    assert [m.verdict for m in ms] == [KI.CAN_MEET] and ms[0].unknown == ("waves",)
    # a logged cublasLtMatmul line is no grouped GEMM
    assert record_config(parse_line(SPLIT2))["grouped"] is False


def test_bad_versions_say_what_to_give():
    with pytest.raises(ValueError, match="13.1.0.3"):
        KI.match({"algo_id": 66}, cublas="thirteen")
    with pytest.raises(ValueError, match="X.Y"):
        KI.match({"algo_id": 66}, cc="9")


# --- the command line ----------------------------------------------------------------------------------------
def run(*args):
    return CliRunner().invoke(main, ["parse-log", *map(str, args)])


@pytest.fixture
def altered_log(tmp_path):
    """Captured lines 9-13 of level2_torchlt.log, lines 1 and 2 ALTERED to K = 4033 (the rule holds)."""
    p = tmp_path / "app_501.log"
    p.write_text("\n".join([with_k(SPLIT3_N, K_MEETS_3), with_k(SPLIT3_T, K_MEETS_3), SPLIT3_N, SPLIT3_T,
                            SPLIT2]) + "\n")
    return p


def test_parse_log_known_issue_column(altered_log):
    r = run(altered_log, "--format", "jsonl", "--cublas-version", "13.1.0.3", "--cc", "9.0")
    assert r.exit_code == 0, r.output
    rows = [json.loads(x) for x in r.stdout.splitlines()]
    flagged = [bool(x["known_issue"]) for x in rows]
    assert flagged == [True, True, False, False, False]
    assert "cuBLAS bug 6580689" in rows[0]["known_issue"] and "meets its conditions" in rows[0]["known_issue"]
    assert "known issue: 2 records (app_501.log:1, app_501.log:2): cuBLAS bug 6580689" in r.stderr
    # the fixed version: nothing
    r = run(altered_log, "--format", "jsonl", "--cublas-version", "13.8.0.4", "--cc", "9.0")
    assert r.exit_code == 0 and not any(json.loads(x)["known_issue"] for x in r.stdout.splitlines())
    assert "known issue" not in r.stderr
    # no environment: the config can meet it
    r = run(altered_log, "--format", "csv")
    assert "can meet its conditions (cuBLAS version, compute capability unknown)" in r.stdout


def test_parse_log_summary_carries_the_column(altered_log):
    r = run(altered_log, "--summary", "--format", "jsonl", "--cublas-version", "13.1.0.3", "--cc", "9.0")
    rows = [json.loads(x) for x in r.stdout.splitlines()]
    assert sorted(bool(x["known_issue"]) for x in rows) == [False, False, False, True, True]


@pytest.mark.parametrize("args,needle", [(["--cublas-version", "13.x"], "--cublas-version"),
                                         (["--cc", "sm90"], "--cc")])
def test_parse_log_bad_environment_is_a_usage_error(altered_log, args, needle):
    r = run(altered_log, *args)
    assert r.exit_code == 2 and needle in r.output and "Traceback" not in r.output


# --- explain ---------------------------------------------------------------------------------------------------
def _evidence():
    return json.loads((FIXTURES / "evidence" / "explain_bf16_NT_16x4096x4096.json").read_text())


def test_explain_on_the_captured_evidence_meets_nothing():
    # as captured on the H200 (cuBLAS 13.1.0, cc 9.0): algo 66, numSplitsK=2, K = 4096: 2 divides K
    from cublaslt_probe.analysis import explain
    a = explain.analyse(_evidence())
    assert a["known_issues"]["pick"] == [] and a["known_issues"]["candidates"] == []
    assert "none that this config can meet on cuBLAS 13.1.0, compute capability 9.0" in explain.render(_evidence())


def test_explain_flags_the_pick_and_the_candidates_when_k_meets_the_rule():
    from cublaslt_probe.analysis import explain
    ev = _evidence()
    # ALTERED: K 4096 -> 4097 on the logged line and in the record (floor(4097/2) = 2048 = 32·64, 2 ∤ 4097);
    # the candidates' configs are as captured (split-K 2 and 3: floor(4097/3) = 1365 is no multiple of 64)
    ev["record"]["log_lines"] = [with_k(x, 4097) for x in ev["record"]["log_lines"]]
    ev["record"]["blas_k"] = 4097
    a = explain.analyse(ev)
    ki = a["known_issues"]
    assert len(ki["pick"]) == 1 and "cuBLAS bug 6580689" in ki["pick"][0] and "meets" in ki["pick"][0]
    split2 = [c["rank"] for c in ev["candidates"] if c["split_k"] == 2]
    assert [c["rank"] for c in ki["candidates"]] == split2
    text = explain.render(ev)
    assert "10. known issues (cuBLAS release notes):" in text and "fixed in cuBLAS 13.8.0.4" in text
    # the fixed library: nothing
    ev["env"]["cublaslt_version"] = "13.8.0.4"
    assert explain.analyse(ev)["known_issues"]["pick"] == []


# --- dataset rows --------------------------------------------------------------------------------------------
def _raw_split3():
    from cublaslt_probe.analysis import dataset
    env, recs = dataset.read_raw(FIXTURES / "probe" / "probe_raw.jsonl")
    r = next(r for r in recs if r["key"] == "torch-lt|mm|fp16|NN|1|4096|4096|1")
    return {**env, "cc": "9.0", "cublaslt_version": "13.1.0"}, r


def test_dataset_rows_get_the_known_issue_column(tmp_path):
    from cublaslt_probe.analysis import dataset
    env, r = _raw_split3()
    # as captured: algo 66, numSplitsK=3, K = 4096 -> nothing
    [row] = dataset.build_rows([r], env)
    assert row["algo_split_k"] == 3 and row["known_issue"] is None
    # ALTERED: K 4096 -> 4033 on the log line and in the record (floor(4033/3) = 1344 = 21·64)
    alt = {**r, "log_lines": [with_k(x, K_MEETS_3) for x in r["log_lines"]], "blas_k": K_MEETS_3, "k": K_MEETS_3,
           "key": r["key"].replace("4096|4096|1", f"4096|{K_MEETS_3}|1")}
    df = dataset.validate(dataset.build([r, alt], env))
    assert df["known_issue"].isna().tolist() == [True, False]
    assert "cuBLAS bug 6580689" in df["known_issue"].iloc[1] and "meets" in df["known_issue"].iloc[1]
    # another compute capability: nothing
    assert dataset.build([alt], {**env, "cc": "8.0"})["known_issue"].isna().all()
    # ALTERED also: the stages id without a size; the kernel that ran (nvjet ..._128x8_64x12_...) still says 64
    undef = {**alt, "log_lines": [with_field(x, "stages", "MATMUL_STAGES_UNDEFINED") for x in alt["log_lines"]]}
    [row] = dataset.build_rows([undef], env)
    assert "_64x" in row["kernel"] and "meets its conditions" in row["known_issue"]
    [row] = dataset.build_rows([{**undef, "kernels": []}], env)
    assert "can meet its conditions (stage size unknown)" in row["known_issue"]
    # a dataset written before the column: read_parquet derives it from the row's own columns
    p = tmp_path / "old.parquet"
    dataset.write_parquet(df, p, env)
    import pyarrow.parquet as pq
    t = pq.read_table(p)
    pq.write_table(t.drop(["known_issue"]), p)
    back = dataset.read_parquet(p)
    assert back["known_issue"].tolist()[1] == df["known_issue"].iloc[1] and back["known_issue"].isna().iloc[0]


# --- audit ---------------------------------------------------------------------------------------------------
def test_audit_rows_get_the_known_issue_from_the_runs_environment(tmp_path):
    import shutil

    from cublaslt_probe.analysis.audit import audit
    src = FIXTURES / "programs" / "llama_decode"
    # as captured (cuBLAS 13.1.0, cc 9.0 in env.json): split-K 2, 3 and 4 on K = 4096 and 14336: nothing
    a = audit(src)
    assert "known_issue" in a.rows.columns and a.rows["known_issue"].isna().all()
    assert not any(n.startswith("known issue") for n in a.notes)
    # ALTERED: on the k/v projections' log lines (4096 -> 1024, numSplitsK=3) numSplitsK 3 -> 17 and stages
    # 64xAUTO -> 16xAUTO: 17 does not divide 4096 and floor(4096/17) = 240 = 15·16
    run = tmp_path / "llama_decode"
    shutil.copytree(src, run)
    log = run / "cublaslt.log"
    lines = log.read_text().splitlines()
    alt = [with_field(with_field(x, "numSplitsK", "17"), "stages", "MATMUL_STAGES_16xAUTO")
           if "cols=1024 " in x and "numSplitsK=3" in x else x for x in lines]
    assert sum(a != b for a, b in zip(lines, alt)) == 8
    log.write_text("\n".join(alt) + "\n")
    b = audit(run)
    hit = b.rows[b.rows["known_issue"].notna()]
    assert len(hit) >= 1 and set(hit["n"]) == {1024} and set(hit["algo_split_k"]) == {17}
    assert all("cuBLAS bug 6580689" in x and "meets" in x for x in hit["known_issue"])
    assert any(n.startswith(f"known issue: {len(hit)} GEMM") for n in b.notes)
    # the same run on the fixed library: nothing
    env = json.loads((run / "env.json").read_text())
    (run / "env.json").write_text(json.dumps({**env, "cublaslt_version": "13.8.0.4"}))
    assert audit(run).rows["known_issue"].isna().all()
