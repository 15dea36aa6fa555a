"""Saved cold starts as evidence: their values validated on load, bound to the program they measured, and the
noise between runs (`--repeat`) — on the real saves of tests/fixtures/coldstart (PROVENANCE.md there and in
compilers/ and repeat/) and on mutations of them written to tmp_path."""
from __future__ import annotations

import copy
import gzip
import json
import math
import re
import statistics
from pathlib import Path

import pytest
from click.testing import CliRunner

from cublaslt_probe.analysis.coldstart.binding import NotThisRun, check_bound
from cublaslt_probe.analysis.coldstart.breakdown import analyse, analyse_round
from cublaslt_probe.analysis.coldstart.causes import iqr, miss_time
from cublaslt_probe.analysis.coldstart.envs import STORAGE_READ_MIN, repeat_envs
from cublaslt_probe.analysis.coldstart.observed import observed_provenance
from cublaslt_probe.analysis.coldstart.rounds import median_runs, rounds_of, spread, within_noise
from cublaslt_probe.analysis.coldstart.runs import step_walls, storage_read, windows
from cublaslt_probe.analysis.coldstart.saved import load
from cublaslt_probe.cli import main
from cublaslt_probe.render.coldstart import render

FIX = Path(__file__).parent / "fixtures"
CS = FIX / "coldstart"
REPEAT = {p: CS / "repeat" / f"{p}_repeat3_run1.json.gz" for p in ("cupy", "numba", "triton")}
COMPILED_RUN = FIX / "programs" / "compiled_mlp"
COMPILED_SAVE = CS / "compiled_mlp.json.gz"
SAVES = sorted(CS.glob("**/*.json.gz"))


def _raw(path: Path) -> dict:
    return json.loads(gzip.open(path).read())


def _write(tmp_path: Path, obj: dict, name: str = "save.json.gz") -> Path:
    out = tmp_path / name
    out.write_bytes(gzip.compress(json.dumps(obj).encode(), 1, mtime=0))
    return out


def _cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def _window(run: dict, name: str) -> dict:
    return next(w for w in run["windows"] if w["name"] == name)


# --- damaged values: one run skipped with a note, or the file refused in one line ------------------------------------
def _set_step1_wall(v):
    def m(d):
        _window(d["runs"]["warm"], "step1")["wall_s"] = v
    return m


def _timer_longer_than_its_window(d):
    w = _window(d["runs"]["warm"], "step1")
    w["jit_s"]["cupy.compile"]["s"] = w["wall_s"] * 1000


def _host_longer_than_wall(d):
    w = _window(d["runs"]["warm"], "step1")
    w["host_s"] = w["wall_s"] * 50


def _negative_lt_count(d):
    d["runs"]["warm"]["lt_counts"]["step3"] = -4


def _fractional_calls(d):
    d["runs"]["warm"]["lt_counts"]["step3"] = 1.5


def _negative_driver_seconds(d):
    g = d["runs"]["warm"]["driver_calls"]["step1"]["by_what"]
    g[next(iter(g))]["seconds"] = -0.5


def _nan_preinit_item(d):
    d["runs"]["warm"]["preinit"] = {"cuda_context": float("nan")}


def _nan_read_bytes(d):
    _window(d["runs"]["warm"], "step1")["process"]["read_bytes"] = float("nan")


def _text_cache_count(d):
    d["runs"]["warm"]["cache_written"]["CUDA_CACHE_PATH"]["count"] = "3"


def _string_wall(d):
    _window(d["runs"]["warm"], "step1")["wall_s"] = "0.1"


def _bad_later_round(d):
    _window(d["repeats"][0]["warm"], "step1")["wall_s"] = float("-inf")


# mutation -> (the field the note names, the save it damages)
SKIPPED = {
    "nan_ms": (_set_step1_wall(float("nan")), r"windows\[\d+\] \(step1\)\.wall_s is nan, not a finite number"),
    "inf_ms": (_set_step1_wall(float("inf")), r"wall_s is inf, not a finite number"),
    "negative_ms": (_set_step1_wall(-0.2), r"wall_s is -0.2, below zero"),
    "not_a_number": (_string_wall, r"wall_s is '0.1', not a number"),
    "timer_longer_than_window": (_timer_longer_than_its_window,
                                 r"jit_s\[cupy.compile\]\.s is [\d.]+ s, longer than the step1 window"),
    "host_longer_than_wall": (_host_longer_than_wall, r"host_s is [\d.]+ s, longer than the step1 window"),
    "negative_calls": (_negative_lt_count, r"lt_counts\[step3\] is -4, below zero"),
    "fractional_calls": (_fractional_calls, r"lt_counts\[step3\] is 1.5, not a whole number"),
    "negative_driver_time": (_negative_driver_seconds, r"driver_calls\[step1\]\.by_what\[\w+\]\.seconds is -0.5"),
    "nan_preinit": (_nan_preinit_item, r"preinit\[cuda_context\] is nan"),
    "nan_bytes_read": (_nan_read_bytes, r"windows\[\d+\] \(step1\)\.process\[read_bytes\] is nan"),
    "cache_count_text": (_text_cache_count, r"cache_written\[CUDA_CACHE_PATH\]\[count\] is '3', not a number"),
}


def _clean_output(text: str, where: str) -> None:
    """No traceback, no impossible figure: nan, inf, a negative time or share, a share over 100 %."""
    assert "Traceback" not in text and "internal error" not in text, where
    head = "\n".join(ln for ln in text.split("\nevidence:")[0].splitlines() if not ln.startswith("note: "))
    assert not re.search(r"\b(nan|inf)\b", head, re.IGNORECASE), where
    assert "miss time -" not in text, where
    for share in re.findall(r"(-?\d[\d,.]*)%", head):
        assert 0 <= float(share.replace(",", "")) <= 100, (share, where)


@pytest.mark.parametrize("mutation", list(SKIPPED))
def test_a_damaged_run_is_skipped_with_a_note_naming_file_run_and_field(mutation, tmp_path):
    mutate, field = SKIPPED[mutation]
    d = _raw(REPEAT["cupy"])
    mutate(d)
    path = _write(tmp_path, d)
    got = load(str(path))
    assert "warm" not in got["runs"] and "cold" in got["runs"]
    assert len(got["load_notes"]) == 1
    note = got["load_notes"][0]
    assert note.startswith(f"{path}: run warm skipped: ") and re.search(field, note), note
    r = _cli("cold-start", "--from", path)
    assert r.exit_code == 0, r.output
    assert f"note: {path}: run warm skipped" in r.output
    _clean_output(r.output, mutation)
    # the other rounds' warm runs carry the breakdown: the median warm run comes from them
    a = analyse(got)
    assert a["rounds"]["chosen"]["warm"] in (2, 3)


def test_a_damaged_run_of_a_later_round_is_skipped_and_named_by_round(tmp_path):
    d = _raw(REPEAT["cupy"])
    _bad_later_round(d)
    path = _write(tmp_path, d)
    got = load(str(path))
    assert len(got["load_notes"]) == 1 and re.fullmatch(
        re.escape(f"{path}: run warm (round 2) skipped: windows[") + r"\d+" + re.escape(
            "] (step1).wall_s is -inf, not a finite number (a value `cold-start --save` does not write); the "
            "breakdown uses the other runs"), got["load_notes"][0])
    assert "warm" in got["runs"] and "warm" not in got["repeats"][0] and "warm" in got["repeats"][1]
    _clean_output(render(analyse(got)), "later round")


REFUSED = {
    "steps_negative": (lambda d: d.update(steps=-2), "steps is -2, below zero"),
    "steps_zero": (lambda d: d.update(steps=0), "steps is 0, fewer than 3"),
    "steps_fraction": (lambda d: d.update(steps=5.5), "steps is 5.5, not a whole number"),
    "steps_text": (lambda d: d.update(steps="6"), "steps is '6', not a number"),
    "steps_nan": (lambda d: d.update(steps=float("nan")), "steps is nan, not a finite number"),
    "repeat_zero": (lambda d: d.update(repeat=0), "repeat is 0, fewer than 1"),
    "repeats_not_rounds": (lambda d: d.update(repeats={"cold": {}}), "'repeats' is not a list of rounds"),
    "every_run_damaged": (lambda d: [w.update(wall_s=-1.0) for r in d["runs"].values() for w in r["windows"]],
                          "every run has a damaged value (windows[0] (setup).wall_s is -1.0, below zero"),
}


@pytest.mark.parametrize("mutation", list(REFUSED))
@pytest.mark.parametrize("save", ("cupy_repeat", "compiled_mlp"))
def test_a_damaged_file_is_refused_in_one_line_naming_file_and_field(mutation, save, tmp_path):
    mutate, why = REFUSED[mutation]
    d = _raw(REPEAT["cupy"] if save == "cupy_repeat" else COMPILED_SAVE)
    mutate(d)
    path = _write(tmp_path, d)
    for args in (("cold-start", "--from", path), ("audit", COMPILED_RUN, "--coldstart", path),
                 ("trace", COMPILED_RUN / "trace.json.gz", "--coldstart", path)):
        r = _cli(*args)
        assert r.exit_code == 1, (args, r.output)
        lines = r.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"Error: {path}: ") and why in lines[0], lines
        assert "cold-start --save" in lines[0]


def test_causes_that_disagree_with_the_excess_show_no_share_beyond_100_percent(tmp_path):
    """The eager Llama save with its warm run's step 1 edited to ten times the cold run's (every value in range
    and consistent within the run, the runs contradicting each other): the shares say >100 %, and a note says the
    runs disagree."""
    d = _raw(CS / "llama_eager.json.gz")
    w1 = _window(d["runs"]["warm"], "step1")
    w1["wall_s"] = w1["host_s"] = _window(d["runs"]["cold"], "step1")["wall_s"] * 10
    path = _write(tmp_path, d)
    r = _cli("cold-start", "--from", path)
    assert r.exit_code == 0, r.output
    assert ">100%" in r.output
    assert "the runs disagree by more than run-to-run noise" in r.output
    _clean_output(r.output, "disagree")


@pytest.mark.parametrize("save", SAVES, ids=lambda p: p.name)
def test_every_real_save_loads_whole_and_shows_no_negative_miss_time(save):
    got = load(str(save))
    assert got["load_notes"] == []
    a = analyse(got)
    h = next((c for c in a["components"] if c["cause"] == "heuristics"), None)
    if h is not None:
        assert h["seconds"] >= 0
        assert not any(re.search(r"miss time -\d", e) for e in h["evidence"])
    if a.get("baseline"):
        _clean_output(render(a), save.name)


def test_a_miss_time_below_the_steady_steps_noise_counts_zero_and_says_so():
    """CuPy's round 2 (compilers/): host time per steady step 8 µs shorter with the heuristics cache off, in steps
    that vary by 45 µs (interquartile range): not a negative miss time, a miss the runs cannot resolve."""
    a = analyse(load(str(CS / "compilers" / "cupy_run2.json.gz")))
    h = next(c for c in a["components"] if c["cause"] == "heuristics")
    assert h["seconds"] == 0.0
    assert any("miss time not resolved" in e and "(-8 µs per call) is within that" in e for e in h["evidence"])
    runs = a and load(str(CS / "compilers" / "cupy_run2.json.gz"))["runs"]
    m = miss_time(runs["preinit"], runs["nocache"])
    assert m["measured_s"] < 0 < m["noise_s"] and m["within_noise"]
    # a resolved one keeps its size: Llama's 16 calls per step, 132 µs each
    b = analyse(load(str(CS / "llama_eager.json.gz")))
    hb = next(c for c in b["components"] if c["cause"] == "heuristics")
    assert hb["seconds"] > 0 and any("miss time 132 µs per call" in e for e in hb["evidence"])


# --- binding: a save refused with another program's run --------------------------------------------------------------
def test_another_programs_save_is_refused_in_one_line_naming_its_program():
    for args in (("audit", FIX / "programs" / "llama_prefill"),
                 ("trace", FIX / "programs" / "llama_prefill" / "trace.json.gz")):
        r = _cli(*args, "--coldstart", COMPILED_SAVE)
        assert r.exit_code == 2, r.output
        err = r.output.strip().splitlines()[-1]
        assert err.startswith(f"Error: {COMPILED_SAVE} is the cold start of capture_coldstart:make_compiled_mlp: "
                              "none of the 3 kernels it saw made at run time"), err
    r = _cli("audit", COMPILED_RUN, "--coldstart", REPEAT["cupy"])
    assert r.exit_code == 2
    assert (f"{REPEAT['cupy']} is the cold start of cupy_prog (cupy_prog.py, sha256 a9482e1ee5d8…): none of the 2 "
            "kernels it saw made at run time") in r.output


def test_the_own_programs_save_is_accepted_and_an_older_save_says_what_binds_it():
    r = _cli("audit", COMPILED_RUN, "--coldstart", COMPILED_SAVE, "-f", "jsonl")
    assert r.exit_code == 0, r.output
    assert (f"note: {COMPILED_SAVE} was saved before cold-start recorded the program's content hash: bound by the "
            "kernels it saw made at run time, found in this trace and the GPU (NVIDIA H200)") in r.stderr
    r = _cli("trace", COMPILED_RUN / "trace.json.gz", "--coldstart", COMPILED_SAVE)
    assert r.exit_code == 0, r.output


def test_a_save_of_another_gpu_or_by_name_another_program_is_refused(tmp_path):
    d = _raw(REPEAT["cupy"])
    d["binding"]["gpu"] = "NVIDIA A100-SXM4-80GB"
    with pytest.raises(NotThisRun, match="measured on NVIDIA A100-SXM4-80GB; this run is on NVIDIA H200"):
        check_bound(d, "f.json", gpu="NVIDIA H200", names={"coldstart_gelu"})
    # a save that saw nothing made at run time (fp8 linears: cuBLASLt's shipped kernels) is bound by its name
    fp8 = load(str(CS / "fp8_linear.json.gz"))
    assert observed_provenance(fp8) == {}
    with pytest.raises(NotThisRun, match=r"is the cold start of capture_coldstart:make_fp8_linear; this run "
                                                   r"is of llama_prefill"):
        check_bound(fp8, "f.json", gpu="NVIDIA H200", program="llama_prefill", names=set())
    notes = check_bound(fp8, "f.json", gpu="NVIDIA H200", program="fp8_linear", names=set())
    assert notes == ["f.json was saved before cold-start recorded the program's content hash: bound by its "
                     "program's name (capture_coldstart:make_fp8_linear) and the GPU (NVIDIA H200)"]


def test_a_new_save_carries_its_program_gpu_and_versions():
    b = load(str(REPEAT["numba"]))["binding"]
    assert b["program"] == "numba_prog" and b["file"] == "numba_prog.py"
    import hashlib
    prog = Path(__file__).parent.parent / "scripts" / "coldstart_programs" / "numba_prog.py"
    assert b["sha256"] == hashlib.sha256(prog.read_bytes()).hexdigest()
    assert b["gpu"] == "NVIDIA H200" and b["versions"]["numba-cuda"] == "0.30.4" and b["versions"]["cuda"] == "13.0"
    head = render(analyse(load(str(REPEAT["numba"])))).splitlines()[1]
    assert head.startswith(f"program numba_prog.py (sha256 {b['sha256'][:12]}…); torch 2.11.0, cuda 13.0")


# --- noise: the median run per environment, each figure's spread, causes within noise --------------------------------
@pytest.fixture(scope="module")
def repeated():
    return {p: load(str(f)) for p, f in REPEAT.items()}


@pytest.mark.parametrize("prog", list(REPEAT))
def test_each_run_is_its_environments_median_and_the_sum_is_exact(repeated, prog):
    d = repeated[prog]
    rounds = rounds_of(d)
    assert len(rounds) == 3 and "cold_again" in rounds[0] and all("cold_again" not in r for r in rounds[1:])
    runs, _, left = median_runs(rounds)
    for name in ("warm", "preinit", "eager"):
        walls = sorted(step_walls(r[name])[0] for r in rounds)
        assert step_walls(runs[name])[0] == walls[1]
    # the cold run: the median of the cold runs that found their files in the OS file cache and cold_again
    read = [k for k, r in enumerate(rounds, 1)
            if storage_read(windows(r["cold"])["step1"]) >= STORAGE_READ_MIN]
    assert read == [1] and len(left) == 1 and left[0].startswith("the cold run of round 1 read")
    pool = [step_walls(r["cold"])[0] for r in rounds[1:]] + [step_walls(rounds[0]["cold_again"])[0]]
    assert step_walls(runs["cold"])[0] == sorted(pool)[1]
    a = analyse(d)
    assert a["step1_s"] == step_walls(runs["cold"])[0]
    assert sum(c["seconds"] for c in a["components"]) + a["unexplained_s"] == pytest.approx(a["excess_s"], abs=1e-9)
    # the target: the causes add up to the excess within 10 % (measured: 0.1 %, 0.2 %, 0.4 %)
    assert abs(a["unexplained_pct"]) < 10 and a["unexplained_within_noise"]


@pytest.mark.parametrize("prog", list(REPEAT))
def test_each_causes_spread_is_its_rounds_and_within_noise_is_size_within_spread(repeated, prog):
    d = repeated[prog]
    a = analyse(d)
    per = [analyse_round({**d, "runs": r}) for r in rounds_of(d)]
    flagged = 0
    for c in a["components"]:
        got = [next((x["measured_s"] or 0.0 for x in p["components"] if x["cause"] == c["cause"]), 0.0) for p in per]
        assert c["rounds_s"] == got
        assert (c["spread"]["min"], c["spread"]["max"], c["spread"]["median"]) == (min(got), max(got),
                                                                                   statistics.median(got))
        width = max(got) - min(got)
        assert c["within_noise"] == (width > 0 and c["seconds"] <= width)
        flagged += c["within_noise"]
    assert flagged >= 1
    text = render(a)
    assert "3 rounds: each run the median of its environment's runs by step 1" in text
    for c in a["components"]:
        line = next(ln for ln in text.splitlines() if ln.startswith(f"  {c['label']}"))
        assert f"{c['spread']['min'] * 1e3:.1f}–{c['spread']['max'] * 1e3:.1f}" in line
        assert ("within noise;" in line) == c["within_noise"]


def test_the_cupy_breakdown_over_three_rounds(repeated):
    """The figures the H200 gave (repeat/PROVENANCE.md): NVRTC's cold compile is real, PTX JIT is within its
    noise (37.1 ms inside 0.0–44.9), and nothing is left over."""
    a = analyse(repeated["cupy"])
    by = {c["cause"]: c for c in a["components"]}
    assert round(by["nvrtc_cupy"]["seconds"] * 1e3, 1) == 199.1 and not by["nvrtc_cupy"]["within_noise"]
    assert round(by["ptx_jit"]["seconds"] * 1e3, 1) == 37.1 and by["ptx_jit"]["within_noise"]
    assert round(by["initialisation"]["seconds"] * 1e3, 1) == 88.3 and not by["initialisation"]["within_noise"]
    assert abs(a["unexplained_s"]) < 1e-3
    assert a["rounds"]["chosen"] == {"cold": 2, "warm": 1, "preinit": 1, "eager": 3, "nocache": 3}


def test_a_save_of_one_round_is_analysed_as_before():
    d = load(str(CS / "compilers" / "cupy_run1.json.gz"))
    a = analyse(d)
    assert a["repeat"] == 1 and "rounds" not in a
    assert not any("within_noise" in c for c in a["components"])
    assert "rounds:" not in render(a).splitlines()[0]


def test_later_rounds_repeat_only_the_runs_of_the_sum():
    cupy = load(str(CS / "compilers" / "cupy_run1.json.gz"))["runs"]
    assert repeat_envs(cupy) == ["cold", "warm", "preinit", "eager", "nocache"]   # no cold_again
    numba = load(str(CS / "compilers" / "numba_run1.json.gz"))["runs"]
    assert repeat_envs(numba) == ["cold", "warm", "preinit", "eager"]   # no matmul logged in a step
    ptx = load(str(CS / "ptx_module.json.gz"))["runs"]
    assert set(ptx) > {"nojit", "forcejit"} and repeat_envs(ptx) == ["cold", "warm"]   # no what-ifs


def test_within_noise_and_spread_rules():
    assert within_noise(0.010, [0.0, 0.012, 0.004])
    assert not within_noise(0.010, [0.009, 0.011, 0.010])
    assert not within_noise(0.0, [0.0, 0.0])          # no spread: nothing to say
    assert not within_noise(0.010, [0.0])             # one round: no spread
    assert spread([3.0, 1.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0, "n": 3}
    assert iqr([1.0, 2.0, 3.0, 100.0]) < 30 and not math.isnan(iqr([1.0]))


def test_repeat_option_is_checked():
    r = _cli("cold-start", "--repeat", "0", "--", "python", "x.py")
    assert r.exit_code == 2 and "--repeat" in r.output
    d = _raw(REPEAT["cupy"])
    assert d["repeat"] == 3 and len(d["repeats"]) == 2
    c = copy.deepcopy(d)
    assert rounds_of(c)[0] is c["runs"]


# --- any number of a real save damaged: skipped or refused by name, never a traceback or an impossible figure -------
def _leaves(o, path=()):
    if isinstance(o, dict):
        for k, v in o.items():
            yield from _leaves(v, (*path, k))
    elif isinstance(o, list):
        for i, v in enumerate(o):
            yield from _leaves(v, (*path, i))
    elif isinstance(o, (int, float)) and not isinstance(o, bool):
        yield path


READ = {"wall_s", "host_s", "jit_s", "compile_s", "lt_counts", "by_what", "preinit", "process", "new_files",
        "cache_written", "steps", "mem_before", "mem_after", "repeat"}
DAMAGE = (float("nan"), float("inf"), -1.0, 1e300, "x", None, -5, 2.5, [], {})


@pytest.mark.parametrize("save", ("repeat/cupy_repeat3_run1", "compilers/jax_run1", "llama_eager", "ptx_module",
                                  "compilers/torch_compile_run1"))
def test_any_number_damaged_is_skipped_or_refused_by_name(save, tmp_path):
    import random
    base = _raw(CS / f"{save}.json.gz")
    # the numbers the analysis reads (a module's or a driver call's own record is evidence text, not a figure)
    leaves = [p for p in _leaves(base) if READ & set(map(str, p))]
    rng = random.Random(save)
    problems = []
    for _ in range(50):
        d = copy.deepcopy(base)
        path, value = rng.choice(leaves), rng.choice(DAMAGE)
        o = d
        for k in path[:-1]:
            o = o[k]
        o[path[-1]] = value
        f = _write(tmp_path, d)
        r = _cli("cold-start", "--from", f)
        where = f"{'.'.join(map(str, path))} = {value!r}"
        if r.exit_code == 1:
            line = r.output.strip().splitlines()
            if len(line) != 1 or not line[0].startswith(f"Error: {f}: ") or "a value in it is not one" in line[0]:
                problems.append(f"{where}: {line[-1][:200] if line else r.output!r}")
            continue
        if r.exit_code not in (0, 3):
            problems.append(f"{where}: exit {r.exit_code} {r.output[-200:]!r}")
            continue
        try:
            _clean_output(r.output, where)
        except AssertionError as e:
            problems.append(f"{where}: {e}")
    assert not problems, "\n".join(problems)
