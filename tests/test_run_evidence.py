"""What `audit` and `trace` read from a run folder, checked record by record (issue 47): compiled GEMM records
that match no op, group sizes that do not split the GEMM's rows, kernel events written twice or longer than the
trace, empty or repeated step marks, and steps that hold under half of the trace's GEMM time.

Each test changes a committed H200 capture (tests/fixtures/programs, tests/fixtures/moe, tests/fixtures/graphs;
PROVENANCE.md there) the way a damaged, merged or hand-edited file differs, and checks that the figures (steps,
GEMM time per step, attribution, the rows) stay the unchanged capture's, or lose exactly what was bad, and that
a note (or the first line) names what was set aside.
"""
from __future__ import annotations

import copy
import gzip
import json
import re
import shutil

import pytest
import trace_mutations as TM
from click.testing import CliRunner
from conftest import FIXTURES, copy_run
from test_audit_robust import same_rows

from cublaslt_probe import runfiles
from cublaslt_probe.analysis.audit import audit
from cublaslt_probe.analysis.trace import read_chrome_trace
from cublaslt_probe.cli import main

PROGRAMS, MOE, GRAPHS = FIXTURES / "programs", FIXTURES / "moe", FIXTURES / "graphs"
RO = GRAPHS / "reduce_overhead"


@pytest.fixture(scope="module")
def base():
    cache: dict = {}

    def get(run):
        if run not in cache:
            cache[run] = audit(run)
        return cache[run]
    return get


def cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def same_figures(a, b):
    assert a.steps == b.steps
    assert a.gemm_gpu_us == pytest.approx(b.gemm_gpu_us) and a.step_gpu_us == pytest.approx(b.step_gpu_us)
    assert a.attributed_share == pytest.approx(b.attributed_share)
    same_rows(a, b)


# ------------------------------------------------------------------------------------------ compiled records
def test_compiled_records_of_another_program_keep_the_steps_and_modules(tmp_path, base):
    """The reduce-overhead program's compiled_gemms.jsonl put in the GPT-2 training run (whose GEMMs none of
    them names): the steps (2), the modules (100 % attributed) and every row stay the unchanged run's, and a
    note names the records by file and line."""
    run = copy_run(tmp_path, PROGRAMS / "gpt2_train")
    shutil.copy(RO / runfiles.COMPILED_GEMMS_FILE, run)
    a, b = audit(run), base(PROGRAMS / "gpt2_train")
    assert b.steps == 2 and b.attributed_share == pytest.approx(1.0)
    same_figures(a, b)
    note = next(n for n in a.notes if "compiled GEMM records" in n)
    assert f"{runfiles.COMPILED_GEMMS_FILE}:1,2,3,4,5,… (10 more): 15 of the 15 compiled GEMM records name no " \
           "GEMM op of this trace" in note and "steps and module ranges are kept" in note
    assert not any("no step" in n for n in a.notes)


def test_compiled_records_that_match_nothing_are_named_beside_those_that_do(tmp_path, base):
    """The reduce-overhead run's own records with a copy of each whose problem no op has (m + 1): the rows and
    their modules are the unchanged run's; the copies are named by line (16-30)."""
    run = copy_run(tmp_path, RO)
    path = run / runfiles.COMPILED_GEMMS_FILE
    recs = [json.loads(x) for x in path.read_text().splitlines()]
    path.write_text("".join(json.dumps(r) + "\n" for r in recs + [dict(r, m=r["m"] + 1) for r in recs]))
    a, b = audit(run), base(RO)
    same_figures(a, b)
    assert list(a.rows["module"]) == list(b.rows["module"]) and "lm_head" in set(a.rows["module"])
    assert any(f"{runfiles.COMPILED_GEMMS_FILE}:16,17,18,19,20,… (10 more): 15 of the 30 compiled GEMM records "
               "name no GEMM op" in n for n in a.notes), a.notes


def test_compiled_records_with_a_bom_and_a_bad_line(tmp_path, base):
    """A byte order mark costs nothing; a record whose m is not a positive integer is skipped and named."""
    run = copy_run(tmp_path, RO)
    path = run / runfiles.COMPILED_GEMMS_FILE
    lines = path.read_text().splitlines()
    bad = json.loads(lines[0]) | {"m": "128"}
    path.write_bytes(b"\xef\xbb\xbf" + "\n".join(lines + [json.dumps(bad)]).encode() + b"\n")
    a, b = audit(run), base(RO)
    same_figures(a, b)
    assert list(a.rows["module"]) == list(b.rows["module"])
    assert any(f"{runfiles.COMPILED_GEMMS_FILE}:16: 1 line(s) skipped, not a compiled GEMM record (line 16: m is "
               "not a positive integer)" in n for n in a.notes), a.notes


# ------------------------------------------------------------------------------------------ group sizes
MIXTRAL = MOE / "mixtral_train"


def _sizes_run(tmp_path, change, raw=None):
    """mixtral_train with its group_sizes.jsonl records changed by `change(records)` (or its bytes `raw`)."""
    run = copy_run(tmp_path, MIXTRAL)
    path = run / runfiles.GROUP_SIZES_FILE
    if raw is not None:
        path.write_bytes(raw(path.read_bytes()))
    else:
        recs = [json.loads(x) for x in path.read_text().splitlines()]
        change(recs)
        path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return run


def _grouped(a):
    return a.rows[a.rows["groups"].notna()].reset_index(drop=True)


GROUPED_COLS = ["sizes_source", "group_sizes", "group_routings", "group_max", "group_imbalance", "floor_us"]


@pytest.mark.parametrize("what, size, why", [
    ("a sum that differs", lambda s: s + 5, None),
    ("a negative size", lambda s: -s, "a group size is not an integer >= 0 (-"),
    ("a non-integer size", lambda s: s + 0.5, "a group size is not an integer >= 0 ("),
    ("a size written as text", lambda s: str(s), 'a group size is not an integer >= 0 ("'),
])
def test_a_bad_group_sizes_record_after_a_good_one_is_skipped_and_named(tmp_path, base, what, size, why):
    """Line 4 (step 1's second call, whose operands' dims line 2 also has) changed: the grouped rows keep the
    sizes the good records give (never the bad one's, never 'recorded' for it), and a note names line 4."""
    def change(recs):
        recs[3]["sizes"][0] = size(recs[3]["sizes"][0])
    run = _sizes_run(tmp_path, change)
    a, b = audit(run), base(MIXTRAL)
    same_figures(a, b)
    assert _grouped(a)[GROUPED_COLS].equals(_grouped(b)[GROUPED_COLS])
    note = next(n for n in a.notes if f"{runfiles.GROUP_SIZES_FILE}:4" in n)
    if why is None:
        assert "1 group sizes record(s) skipped: their sizes do not split the rows of the GEMM they name (line 4: " \
               "8 sizes adding up to 4,101; the GEMM has 4,096 rows in 8 groups)" in note
    else:
        assert "1 line(s) skipped, not a group sizes record (line 4: " + why in note
    r = cli("audit", run, "-f", "jsonl")
    assert r.exit_code == 0 and "internal error" not in r.output


def test_group_sizes_that_fit_no_call_are_assumed_and_named(tmp_path, base):
    """Every record of the second call (lines 2 and 4) adds up to more than its GEMM's rows: its rows fall back
    to equal sizes, said 'assumed', and the note names both lines."""
    def change(recs):
        for r in (recs[1], recs[3]):
            r["sizes"][0] += 8
    a = audit(_sizes_run(tmp_path, change))
    g, gb = _grouped(a), _grouped(base(MIXTRAL))
    assert (g["sizes_source"] == "assumed").sum() > (gb["sizes_source"] == "assumed").sum()
    assert any(f"{runfiles.GROUP_SIZES_FILE}:2,4: 2 group sizes record(s) skipped" in n for n in a.notes), a.notes
    assert a.gemm_gpu_us == pytest.approx(base(MIXTRAL).gemm_gpu_us)


def test_group_sizes_with_a_bom_are_read_whole(tmp_path, base):
    a = audit(_sizes_run(tmp_path, None, raw=lambda d: b"\xef\xbb\xbf" + d))
    same_figures(a, base(MIXTRAL))
    assert _grouped(a)[GROUPED_COLS].equals(_grouped(base(MIXTRAL))[GROUPED_COLS])
    assert not any(runfiles.GROUP_SIZES_FILE in n for n in a.notes)


# ------------------------------------------------------------------------------------------ kernel events
def _kernels(doc, gemm_only=False):
    return [e for e in doc["traceEvents"] if e.get("cat") in TM.KERNEL_CATS
            and (not gemm_only or TM.is_gemm(e.get("name")))]


@pytest.mark.parametrize("program", ["llama_decode", "gpt2_train"])
def test_kernel_events_written_twice_count_once(tmp_path, base, program):
    """Every kernel event written a second time (a file merged with itself, an exporter run twice): the steps,
    GEMM time, rows and `trace`'s totals are the unchanged capture's; a note says how many and how long."""
    doubled = {}

    def change(doc):
        ks = _kernels(doc)
        doubled["n"], doubled["us"] = len(ks), sum(e["dur"] for e in ks)
        doc["traceEvents"] += [copy.deepcopy(e) for e in ks]
    run = copy_run(tmp_path, PROGRAMS / program, trace=change)
    a, b = audit(run), base(PROGRAMS / program)
    same_figures(a, b)
    assert any(f"{doubled['n']:,} kernel or copy events repeat another exactly" in n
               and f"({doubled['us']:,.1f} µs not counted twice)" in n for n in a.notes), a.notes
    s, s0 = read_chrome_trace(run / runfiles.TRACE_FILE), read_chrome_trace(PROGRAMS / program / runfiles.TRACE_FILE)
    assert s.stats.kernels == s0.stats.kernels and s.stats.gpu_time_us == pytest.approx(s0.stats.gpu_time_us)
    assert s.kernels["total_us"].sum() == pytest.approx(s0.kernels["total_us"].sum())
    r = cli("trace", run / runfiles.TRACE_FILE)
    assert r.exit_code == 0 and f"{doubled['n']:,} kernel or copy events repeating another exactly" in r.output


@pytest.mark.parametrize("program", ["llama_decode", "gpt2_train"])
def test_a_kernel_longer_than_the_trace_counts_nothing(tmp_path, base, program):
    """A few GEMM kernels given 1e300 µs: each counts 0 µs (the GEMM time is the unchanged capture's less their
    real durations, nothing absurd), and the note says they were longer than the trace."""
    lost = []

    def change(doc):
        ks = _kernels(doc, gemm_only=True)
        for e in ks[:: max(1, len(ks) // 3)]:
            lost.append(e["dur"])
            e["dur"] = 1e300
    run = copy_run(tmp_path, PROGRAMS / program, trace=change)
    a, b = audit(run), base(PROGRAMS / program)
    assert a.steps == b.steps and a.partial
    in_steps = b.gemm_gpu_us * b.steps
    assert in_steps - sum(lost) - 1e-6 <= a.gemm_gpu_us * a.steps < in_steps
    assert a.step_gpu_us < b.step_gpu_us and a.step_gpu_us > 0.5 * b.step_gpu_us
    assert any(f"longer than the trace: {len(lost)}" in n for n in a.notes), a.notes
    r = cli("trace", run / runfiles.TRACE_FILE, "-f", "jsonl", "--top", "0")
    assert r.exit_code == 3 and "e+" not in r.stdout and "inf" not in r.stdout
    total = sum(json.loads(x)["total_us"] for x in r.stdout.splitlines())
    assert total == pytest.approx(sum(e["dur"] for e in _kernels(TM.load(PROGRAMS / program / runfiles.TRACE_FILE),
                                                                 True)) - sum(lost))


@pytest.mark.parametrize("trace", sorted(FIXTURES.glob("*/*/trace.json.gz")) + sorted(FIXTURES.glob("traces/*.gz")),
                         ids=lambda p: f"{p.parent.name}/{p.name}")
def test_no_real_capture_has_a_repeated_or_overlong_event(trace):
    """The rules above set nothing aside in a real capture: every kernel of every fixture is counted."""
    st = read_chrome_trace(trace).stats
    assert (st.duplicate_events, st.long_durations, st.bad_durations) == (0, 0, 0)


# ------------------------------------------------------------------------------------------ steps
def _steps(doc):
    return sorted(TM._steps(doc), key=lambda e: e["ts"])


def _empty_mark(doc):
    """A third step mark after everything the trace holds: no kernel runs in it."""
    end = max(e["ts"] + e.get("dur", 0) for e in doc["traceEvents"] if isinstance(e.get("ts"), (int, float)))
    doc["traceEvents"].append(dict(copy.deepcopy(_steps(doc)[-1]), name=TM.STEP_PREFIX + "2", ts=end + 10.0,
                                   dur=50.0))


def _second_thread(doc):
    """The same step marks again on another thread of the process (a data loader's copy of the loop's marks)."""
    doc["traceEvents"] += [dict(copy.deepcopy(e), tid=e["tid"] + 1) for e in _steps(doc)]


def _written_again(doc):
    """Step 1's mark written again over its second half, on its own thread."""
    e = _steps(doc)[-1]
    doc["traceEvents"].append(dict(copy.deepcopy(e), ts=e["ts"] + e["dur"] / 2, dur=e["dur"] / 2))


@pytest.mark.parametrize("program", ["llama_decode", "gpt2_train"])
@pytest.mark.parametrize("mutate, said", [
    (_empty_mark, "1 step mark(s) hold no GPU work (cublaslt_probe.step:2): not counted as steps"),
    (_second_thread, "2 step(s) marked more than once (cublaslt_probe.step:0, cublaslt_probe.step:1: 4 overlapping "
                     "ranges on up to 2 threads): each counted as one step"),
    (_written_again, "1 step range(s) written again inside a range of the same name (cublaslt_probe.step:1): the "
                     "outer one is the step"),
], ids=["empty mark", "second thread", "written again"])
def test_odd_step_marks_keep_the_per_step_figures(tmp_path, base, program, mutate, said):
    run = copy_run(tmp_path, PROGRAMS / program, trace=mutate)
    a = audit(run)
    same_figures(a, base(PROGRAMS / program))
    assert said in a.notes, a.notes
    assert a.warning is None


def test_whole_trace_is_one_step(tmp_path, base):
    """--whole-trace: one step holding every GEMM kernel of the file (the two captured steps and what ran
    around them), whatever the step marks say."""
    doc = TM.load(PROGRAMS / "gpt2_train" / runfiles.TRACE_FILE)
    truth = TM.gemm_truth(doc["traceEvents"])[0]
    a = audit(PROGRAMS / "gpt2_train", whole_trace=True)
    assert a.steps == 1 and a.gemm_gpu_us == pytest.approx(truth) and a.rows["gpu_us"].sum() == pytest.approx(truth)
    assert a.attributed_share == pytest.approx(1.0)
    assert any("--whole-trace" in n for n in a.notes)
    r = cli("audit", PROGRAMS / "gpt2_train", "--whole-trace")
    assert r.exit_code == 0 and r.output.splitlines()[1].startswith("1 step; per step:")


# ------------------------------------------------------------------------------------------ coverage
def _attention_then_mlp(tmp_path, both_calls=False):
    """One profile of one process that ran attention by SDPA's math path outside any module (the sdpa_math
    capture, forward and backward, its module ranges taken out, moved to end before the next part starts) and
    then a compiled MLP under its module (the compiled_mlp capture, the module range of its first step taken
    out unless `both_calls`), without step marks: a bare trace whose one outermost module call is its one step
    (with `both_calls`: two steps found, the first left out as warm-up)."""
    mlp = TM.load(PROGRAMS / "compiled_mlp" / runfiles.TRACE_FILE)
    att = TM.load(PROGRAMS / "sdpa_math" / runfiles.TRACE_FILE)
    timed = lambda doc: [e for e in doc["traceEvents"] if isinstance(e.get("ts"), (int, float))]
    shift = max(e["ts"] + e.get("dur", 0) for e in timed(att)) - min(e["ts"] for e in timed(mlp)) + 1000.0
    for e in timed(att):
        e["ts"] -= shift
    first_mlp = min((e for e in mlp["traceEvents"] if e.get("name") == runfiles.MODULE_PREFIX + "MLP"),
                    key=lambda e: e["ts"])
    keep = lambda e, doc: not (str(e.get("name", "")).startswith(TM.STEP_PREFIX) or (e is first_mlp
                                                                                      and not both_calls)
                               or (doc is att and str(e.get("name", "")).startswith(runfiles.MODULE_PREFIX)))
    mlp["traceEvents"] = [e for d in (att, mlp) for e in d["traceEvents"] if keep(e, d)]
    path = tmp_path / "attention_then_mlp.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump(mlp, f)
    return path, mlp


def test_steps_holding_under_half_the_gemm_time_say_so_first(tmp_path):
    """The one MLP call holds ~12 % of the trace's GEMM time: the audit's first line says how much is left
    out and how to count it; --whole-trace audits all of it, with no warning."""
    path, doc = _attention_then_mlp(tmp_path)
    truth = TM.gemm_truth(doc["traceEvents"])[0]
    a = audit(path)
    assert a.steps == 1 and 0 < a.gemm_gpu_us < 0.5 * truth
    left = (truth - a.gemm_gpu_us) / 1e3
    assert a.warning == (f"the audited steps hold {100 * a.gemm_gpu_us / truth:.1f} % of the trace's GEMM time: "
                         f"{left:,.3f} ms of GEMMs ran outside them and are left out (--whole-trace audits the "
                         "whole trace as one step)")
    r = cli("audit", path)
    assert r.exit_code == 0 and r.output.splitlines()[0] == f"warning: {a.warning}"
    r = cli("audit", path, "-f", "jsonl")
    assert r.exit_code == 0 and r.stderr.splitlines()[0] == f"warning: {a.warning}"
    w = audit(path, whole_trace=True)
    assert w.warning is None and w.steps == 1 and w.gemm_gpu_us == pytest.approx(truth)
    r = cli("audit", path, "--whole-trace")
    assert r.exit_code == 0 and not r.output.startswith("warning") and \
        re.search(rf"GEMMs {truth / 1e3:,.3f} ms", r.output)


def test_the_coverage_warning_names_the_warm_up_left_out(tmp_path):
    """Both MLP calls kept: two steps found, the first left out as warm-up; the warning says --warmup 0 too."""
    path, doc = _attention_then_mlp(tmp_path, both_calls=True)
    a = audit(path)
    assert a.steps == 1 and "(--warmup 0 keeps the 1 step(s) left out as warm-up, --whole-trace audits the " \
        "whole trace as one step)" in a.warning
    assert audit(path, warmup=0).steps == 2 and audit(path, warmup=0).warning is not None
