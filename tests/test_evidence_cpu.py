"""CPU side of candidates, explain, first-call and replay, on real H200 captures (tests/fixtures/evidence)."""
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from cublaslt_probe.analysis import candidates as cm
from cublaslt_probe.analysis import dataset, evidence, explain
from cublaslt_probe.cli import main
from cublaslt_probe.errors import SchemaError
from cublaslt_probe.gpu import firstcall, replay
from cublaslt_probe.logs import load_log


def ev(fixtures, name):
    return json.loads((fixtures / "evidence" / name).read_text())


# --- the evidence rules -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("log", ["level2_torch.log", "level2_torchlt.log", "level2_mixed.log"])
def test_every_logged_call_of_the_level2_logs_is_the_case_asked_for(fixtures, log):
    """Each trace line of a captured log against the case that made it (tests/fixtures/logs/manifest.jsonl):
    the function it names is the one its backend's library path logs, and its compute type its dtype's."""
    man = [json.loads(x) for x in (fixtures / "logs" / "manifest.jsonl").read_text().splitlines()]
    ran = [m for m in man if m["log"] == log and not m["error"]]
    trace = [r for r in load_log(fixtures / "logs" / log)[0] if r.kind == "trace"]
    assert len(trace) == len(ran) > 50
    for m, r in zip(ran, trace):
        assert evidence.expects_lt_function(m["backend"], m["op"], m["n"], m["k"]) is not None, m["key"]
        assert evidence.log_matches_case(m, r) is True, (m["key"], r.function, r.compute_type)
        # the same line read as another path's call does not match
        other = {"cublas": "lt", "torch-lt": "cupy", "lt": "cupy"}[evidence.library_path(m["backend"], m["op"], m["n"],
                                                                                         m["k"])]
        assert evidence.log_matches_case({**m, "backend": other, "op": "mm"}, r) is False, m["key"]


def test_library_paths_and_their_workspace():
    assert [evidence.library_path("torch", op) for op in ("mm", "bmm", "addmm", "scaled_mm")] == \
        ["cublas", "cublas", "torch-lt", "torch-lt"]
    assert {evidence.library_path("torch-lt", op) for op in ("mm", "bmm", "addmm", "scaled_mm")} == {"torch-lt"}
    assert evidence.library_path("cupy", "bmm") == "cublas" and evidence.library_path("lt", "mm") == "lt"
    assert evidence.library_path("torch", "addmm", n=1024, k=1) == "cublas"      # measured: level2_mixed.log
    assert evidence.library_path("torch", "addmm", n=1, k=1024) == "cublas"      # measured: probe_raw.jsonl
    assert evidence.library_path("torch", "addmm", n=4096, k=4096) == "torch-lt"
    assert evidence.library_path("numpy", "mm") is None and evidence.expects_lt_function("numpy", "mm") is None
    assert evidence.expects_lt_function("torch-lt", "bmm") is None      # not measured: not checked
    assert evidence.heuristic_workspace("torch-lt", "mm") == evidence.heuristic_workspace("torch", "addmm") == 1 << 20
    assert evidence.heuristic_workspace("torch", "mm") == evidence.heuristic_workspace("lt", "mm") == 32 << 20


def test_main_kernel_is_the_first_gemm_family_kernel():
    memset, reduce_ = "Memset (Device)", "void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16>()"
    nv = "nvjet_sm90_tst_64x16_64x16_4x1_v_bz_splitK_TNT"
    assert evidence.main_kernel([memset, nv, reduce_]) == nv
    assert evidence.main_kernel([memset]) == memset and evidence.main_kernel([]) is None


# --- candidates and regret -------------------------------------------------------------------------------------
def test_regret_arithmetic_on_a_real_candidate_list(fixtures):
    s = ev(fixtures, "candidates_bf16_256x4096x4096.json")
    c = s["candidates"]
    reg = cm.regret(c, "bf16")
    times = {x["rank"]: x["time_us"] for x in c}
    best = min(times, key=times.get)
    assert reg["best_rank"] == best == 2
    assert reg["regret_pct"] == pytest.approx((times[0] / times[best] - 1) * 100)
    assert reg["noise_pct"] == pytest.approx(abs(times[0] / c[0]["time_us_repeat"] - 1) * 100)
    assert reg["best_kernel"] == "nvjet_sm90_tst_80x128_64x8_4x2_h_bz_TNN"


def test_a_raw_record_keeps_the_compact_candidate_rows(fixtures):
    rows = ev(fixtures, "candidates_bf16_256x4096x4096.json")["candidates"]
    kept = [cm.compact(r) for r in rows]
    assert all(list(k) == list(cm.CANDIDATE_KEYS) for k in kept)
    assert [k["time_us"] for k in kept] == [r["time_us"] for r in rows]
    assert all("state" in r and "state" not in k for r, k in zip(rows, kept))      # dropped: not kept
    slim = json.loads(cm.to_json(kept))
    assert [s["kernel"] for s in slim] == [evidence.main_kernel(r["kernels"]) for r in rows]
    assert all("kernels" not in s for s in slim)


def test_a_wrong_answer_is_never_the_fastest(fixtures):
    c = [dict(x) for x in ev(fixtures, "candidates_bf16_256x4096x4096.json")["candidates"]]
    c[2]["max_rel_diff_vs_0"] = 0.5          # pretend the fastest candidate computed garbage
    assert cm.regret(c, "bf16")["best_rank"] != 2


def test_candidates_cli_from_saved_file(fixtures):
    p = fixtures / "evidence" / "candidates_bf16_256x4096x4096.json"
    r = CliRunner().invoke(main, ["candidates", "--from", str(p)])
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert lines[0].startswith("bf16 NT M=256 N=4096 K=4096 on NVIDIA H200 (cuBLASLt 13.1.0); workspace 33554432 B")
    row0 = next(x for x in lines if x.startswith("0 "))
    row2 = next(x for x in lines if x.startswith("2 "))
    assert row0.rstrip().endswith("heuristic pick") and row2.rstrip().endswith("fastest")
    assert "regret = time(#0) / time(best) - 1 = 29.47 / 28.96 - 1 = +1.8 %  (best is #2)" in r.output
    r = CliRunner().invoke(main, ["candidates", "--from", str(p), "--format", "jsonl"])
    rows = [json.loads(x) for x in r.output.splitlines()]
    assert [x["rank"] for x in rows] == list(range(8)) and rows[0]["matches_0"] is True
    assert rows[0]["tflops"] == pytest.approx(2 * 256 * 4096 * 4096 / rows[0]["time_us"] / 1e6)


def test_fp8_candidates_render(fixtures):
    p = fixtures / "evidence" / "candidates_fp8_2048x4096x4096.json"
    r = CliRunner().invoke(main, ["candidates", "--from", str(p)])
    assert r.exit_code == 0 and "fp8 NT M=2048" in r.output and "nvjet" in r.output


def test_regret_over_the_committed_config_pairs(fixtures):
    by = {}
    for line in (fixtures / "names" / "nvjet_configs.jsonl").read_text().splitlines():
        row = json.loads(line)
        by.setdefault(row["problem"], []).append(row)
    regs = [cm.regret(sorted(rows, key=lambda r: r["rank"]), rows[0]["dtype"]) for rows in by.values()]
    done = [r for r in regs if r["regret_pct"] is not None]
    assert len(done) >= 100
    assert all(r["regret_pct"] >= 0 for r in done)
    assert all(r["best_rank"] is not None for r in done)


DATA = Path(__file__).resolve().parent.parent / "data"


def test_data_file_h200_regret_headline():
    """A check of the shipped data file data/h200_regret.parquet (and of `summary` on it)."""
    df = dataset.read_parquet(DATA / "h200_regret.parquet")
    dataset.validate(df)
    s = cm.summary(df)
    assert s["problems"] == 384 == int(df.regret_pct.notna().sum())
    assert 0.9 <= s["pick_fastest_within_noise"] <= 1.0
    assert s["noise_band_pct"] >= cm.NOISE_FLOOR_PCT
    assert s["worst_regret_pct"] == pytest.approx(df.regret_pct.max())
    assert set(s["by_dtype"]) == {"bf16", "fp8"}
    with pytest.raises(SchemaError, match="no regret columns"):
        cm.summary(df.drop(columns=["regret_pct"]))


def test_noise_band():
    assert cm.noise_band([]) == cm.NOISE_FLOOR_PCT
    assert cm.noise_band([0.1] * 19 + [30.0]) == cm.NOISE_FLOOR_PCT
    assert cm.noise_band(list(range(1, 101))) == 95


# --- explain --------------------------------------------------------------------------------------------------
def test_waves_arithmetic():
    w = explain.waves(4096, 4096, 256, 128, 1, 1, 132)
    assert (w["ctas"], w["full_waves"], w["last_wave_ctas"]) == (512, 3, 116)
    assert w["waves"] == pytest.approx(512 / 132)
    w = explain.waves(4096, 16, 64, 16, 2, 1, 132)
    assert w["ctas"] == 128 and w["last_wave_util"] == pytest.approx(128 / 132)
    assert explain.waves(264, 128, 2, 128, 1, 1, 132)["last_wave_util"] == 1.0


def test_explain_renders_the_whole_chain(fixtures):
    text = explain.render(ev(fixtures, "explain_bf16_NT_4096x4096x4096.json"))
    assert "cublasLtTSTMatmul: algoId=66 tile=256x128 stages=64xAUTO cluster=1x2x1 splitK=1" in text
    assert "* nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT" in text
    assert "agrees with the logged algo (tile, cluster, split-K): yes" in text
    assert "⌈4096/256⌉·⌈4096/128⌉ = 512 CTAs over 132 SMs = 3.88 waves; last wave 116/132 SMs busy (88%)" in text
    assert "compute-bound" in text and "the kernel that ran is #0" in text
    assert "verdict: selected by heuristics; no runtime compilation observed" in text
    text = explain.render(ev(fixtures, "explain_bf16_NT_16x4096x4096.json"))
    assert "⌈4096/64⌉·⌈16/16⌉·2 (split-K) = 128 CTAs" in text and "memory-bound" in text
    r = CliRunner().invoke(main, ["explain", "--from",
                                  str(fixtures / "evidence" / "explain_bf16_NT_16x4096x4096.json")])
    assert r.exit_code == 0 and r.output.startswith("GEMM  torch mm bf16 NT  M=16 N=4096 K=4096")


def test_explain_is_analysed_as_data_then_rendered(fixtures):
    saved = ev(fixtures, "explain_bf16_NT_4096x4096x4096.json")
    a = explain.analyse(saved)
    assert a["error"] is None and a["kernels"]["main"] == "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT"
    assert a["algo"]["algo_id"] == 66 and a["decoded"]["agrees_with_log"] is True
    assert (a["waves"]["ctas"], a["waves"]["sms"], a["waves"]["tile"]) == (512, 132, (256, 128))
    assert a["time"]["peaks"]["source"] == "NVIDIA H200 SXM datasheet" and a["time"]["peaks"]["bound"] == "compute"
    assert a["candidates"]["rank_of_kernel"] == 0 and a["candidates"]["regret"]["best_rank"] == 4
    assert a["first_call"]["verdict"].startswith("selected by heuristics")
    assert explain.render_analysis(a) == explain.render(saved)


@pytest.mark.parametrize("gpu, peak, hbm", [("NVIDIA H200", 989.5, 4.8), ("NVIDIA H100 80GB HBM3", 989.5, 3.35),
                                            ("NVIDIA H100 PCIe", 756.5, 2.0), ("NVIDIA H100 NVL", 835.5, 3.9),
                                            ("NVIDIA H200 NVL", 835.5, 4.8)])
def test_explain_takes_the_peak_of_the_exact_product(fixtures, gpu, peak, hbm):
    saved = ev(fixtures, "explain_bf16_NT_4096x4096x4096.json")
    saved["env"]["gpu"] = gpu
    p = explain.analyse(saved)["time"]["peaks"]
    assert (p["tflops"], p["hbm_tbps"]) == (peak, hbm)
    assert f"of {peak:.0f} TFLOP/s bf16 dense peak" in explain.render(saved)


def test_explain_on_an_unknown_gpu_says_peak_unknown_and_counts_no_waves_without_sms(fixtures):
    saved = ev(fixtures, "explain_bf16_NT_4096x4096x4096.json")
    saved["env"].update(gpu="NVIDIA H100 SXM5 94GB", sm_count=None)     # no datasheet entry, no SM count
    text = explain.render(saved)
    assert "peak unknown for NVIDIA H100 SXM5 94GB" in text and "floors:" not in text
    assert "(the SM count of the GPU is not recorded: waves not counted)" in text and "CTAs over" not in text


# --- first call -------------------------------------------------------------------------------------------------
def test_first_call_analysis(fixtures):
    raw = ev(fixtures, "firstcall_bf16_NT_16x4096x4096.json")
    a = firstcall.analyse(raw)
    comp = a["components_us"]
    runs = raw["runs"]
    assert comp["heuristic_miss_us"] == pytest.approx(runs["nocache"]["launch_us"] - runs["lazy"]["launch_us"])
    assert comp["module_loading_us"] == max(0.0, runs["lazy_pre"]["first_us"] - runs["eager"]["first_us"])
    assert comp["first_call_us"] > 100 * comp["steady_us"]
    assert a["verdict"] == "selected by heuristics; no runtime compilation observed"
    text = firstcall.render(a)
    assert "heuristic cache miss" in text and "lazy 0 files" in text


def test_first_call_verdict_follows_the_evidence(fixtures):
    raw = ev(fixtures, "firstcall_bf16_NT_4096x4096x4096.json")
    raw["runs"]["lazy"]["cache_files"] = 3          # as if the driver had written PTX JIT output
    assert firstcall.analyse(raw)["verdict"].startswith("runtime compilation observed")
    raw = ev(fixtures, "firstcall_bf16_NT_4096x4096x4096.json")
    raw["runs"]["nojit"] = {"ok": False, "error": "no kernel image", "cache_files": 0}
    assert firstcall.analyse(raw)["verdict"].startswith("inconclusive")
    r = CliRunner().invoke(main, ["first-call", "--from",
                                  str(fixtures / "evidence" / "firstcall_bf16_NT_4096x4096x4096.json")])
    assert r.exit_code == 0 and r.output.startswith("first-call anatomy for torch|mm|bf16|NT|4096|4096|4096|1")


# --- replay ---------------------------------------------------------------------------------------------------
def test_every_trace_line_of_the_level2_logs_is_replayable(fixtures):
    man = [json.loads(x) for x in (fixtures / "logs" / "manifest.jsonl").read_text().splitlines()]
    recs, _ = load_log(fixtures / "logs" / "level2_torch.log")
    ran = [m for m in man if m["log"] == "level2_torch.log" and not m["error"]]
    trace = [r for r in recs if r.kind == "trace"]
    assert len(trace) == len(ran) == 112
    for r, m in zip(trace, ran):
        pr = replay.problem_from_record(r)
        assert pr["dtype"] == m["dtype"]
        assert (pr["m"], pr["n"], pr["k"]) == (m["blas_m"], m["blas_n"], m["blas_k"])


def test_unreplayable_lines_say_why(fixtures):
    recs, _ = load_log(fixtures / "logs" / "level2_torch.log")
    r = next(x for x in recs if x.kind == "trace")
    import dataclasses
    with pytest.raises(replay.NotReplayable, match="lacks algo_id"):
        replay.problem_from_record(dataclasses.replace(r, algo_id=None))
    with pytest.raises(replay.NotReplayable, match="epilogue EPILOGUE_GELU needs inputs"):
        replay.problem_from_record(dataclasses.replace(r, epilogue="EPILOGUE_GELU"))
    with pytest.raises(replay.NotReplayable, match="not among the replayable"):
        replay.problem_from_record(dataclasses.replace(r, a_type="R_64F", b_type="R_64F"))


@pytest.mark.parametrize("name, n, match", [("level2_torch", 112, 103), ("level2_torchlt", 112, 103),
                                            ("level2_mixed", 55, 54)])
def test_saved_replays(fixtures, name, n, match):
    res = ev(fixtures, f"replay_{name}.json")
    assert len(res) == n and all(not r.get("error") for r in res)
    # every replay whose kernel names a tile agrees with the logged algo; the rest are gemv/gemmSN kernels
    assert sum(1 for r in res if r["consistent_with_log"]) == match
    assert all(r["consistent_with_log"] is not False for r in res)
    text = replay.render(res)
    assert text.endswith(f"replayed {n}/{n} lines; {match} launched a kernel matching the logged algo")
    r = CliRunner().invoke(main, ["replay", str(fixtures / "evidence" / f"replay_{name}.json"), "--from"])
    assert r.exit_code == 0 and "heuristic today" in r.output


def test_the_gpu_commands_refuse_bad_input_before_any_gpu_work(tmp_path):
    """Wrong shapes, the wrong saved file, a log with no trace line: one line each, found on the CPU."""
    ev = Path(__file__).resolve().parent / "fixtures" / "evidence"
    logs = Path(__file__).resolve().parent / "fixtures" / "logs"

    def run(*args):
        r = CliRunner().invoke(main, [str(a) for a in args])
        assert "Traceback" not in r.output
        return r.exit_code, r.output.strip()
    code, out = run("explain", "--m", "16", "--n", "4096")
    assert code == 2 and out.endswith("Error: give --m, --n and --k (or --from FILE.json)")
    code, out = run("explain", "--m", "16", "--n", "64", "--k", "64", "--dtype", "fp8", "--backend", "cupy")
    assert code == 2 and "cupy" in out
    code, out = run("first-call", "--from", ev / "explain_bf16_NT_16x4096x4096.json")
    assert code == 1 and "is a file saved by `explain --save`, not what `first-call --save` writes" in out
    assert "(or run `explain --from" in out
    empty = tmp_path / "empty_replay.json"
    empty.write_text("[]")
    code, out = run("replay", empty, "--from")
    assert code == 1 and "holds no replay results" in out
    code, out = run("replay", logs / "level2_torch.log")
    assert code == 2 and out.endswith("Error: give --line N or --all")
    code, out = run("replay", logs / "level2_torch.log", "--line", "999999")
    assert code == 1 and "line 999999 is not a matmul trace line (trace lines: 1, " in out
    code, out = run("replay", logs / "cublas_api.log", "--all")
    assert code == 1 and "holds no matmul trace line: capture the log with CUBLASLT_LOG_LEVEL=2" in out
