"""`audit` on real run folders changed the way real files differ (issue 36): other profiler settings, env.json
of another type or another GPU, steps written twice or nested, launch records dropped, a log of another
process. Each test copies a committed H200 capture of tests/fixtures/programs to tmp_path, changes it, and
compares the audit with the unchanged capture's or with a plain json.load of the changed trace.
"""
from __future__ import annotations

import gzip
import json
import re

import pandas as pd
import pytest
from click.testing import CliRunner
from conftest import FIXTURES, copy_run

from cublaslt_probe import runfiles
from cublaslt_probe.analysis.audit import audit, collapse
from cublaslt_probe.cli import main
from cublaslt_probe.names import decode

PROGRAMS = FIXTURES / "programs"
GEMM_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::linear", "aten::matmul")
NAN = re.compile(r"\bnan\b", re.IGNORECASE)


def run_copy(tmp_path, program: str, trace=None, env=None, log=None):
    """A copy of the captured program's run folder in tmp_path, changed as `conftest.copy_run` says."""
    return copy_run(tmp_path, PROGRAMS / program, trace=trace, env=env, log=log)


def cli(*args):
    return CliRunner().invoke(main, ["audit", *map(str, args)])


def assert_readable(run):
    """The table and the jsonl of `run` print, and no `nan` in either (rows, notes)."""
    for fmt in ("table", "jsonl"):
        r = cli(run, "--top", "0", "-f", fmt)
        assert r.exit_code == 0, r.output
        assert "internal error" not in r.output
        lines = [x for x in r.output.splitlines() if not x.startswith("host stall:")]   # stalls.py's own
        assert not [x for x in lines if NAN.search(x)], fmt


def gemm_us_by_ext(doc) -> dict[int, float]:
    """GEMM-kind kernel time by External id, read with json.load."""
    out: dict[int, float] = {}
    for e in doc["traceEvents"]:
        if e.get("cat") == "kernel" and decode(e["name"]).kind == "gemm":
            x = e["args"].get("External id")
            out[x] = out.get(x, 0.0) + e["dur"]
    return out


def same_rows(a, b, cols=("gpu_us", "calls", "share", "pct_peak", "floor_us", "waves", "align_fallback")):
    """The two audits' (or row frames') rows agree on every per-step and per-row figure, in the audit's
    order."""
    a, b = getattr(a, "rows", a), getattr(b, "rows", b)
    ka = a[["module", "pass", "op", "m", "n", "k", "kernel", *cols]].reset_index(drop=True)
    kb = b[["module", "pass", "op", "m", "n", "k", "kernel", *cols]].reset_index(drop=True)
    pd.testing.assert_frame_equal(ka, kb, check_exact=False, rtol=1e-9)


@pytest.fixture(scope="module")
def base():
    cache: dict = {}

    def get(program):
        if program not in cache:
            cache[program] = audit(PROGRAMS / program)
        return cache[program]
    return get


# ------------------------------------------------------------------------------------------ crashes
def _drop_modules_around_first(op_name):
    def mutate(doc):
        evs = doc["traceEvents"]
        op = next(e for e in evs if e.get("cat") == "cpu_op" and e["name"] == op_name)
        doc["_op_ext"] = op["args"]["External id"]
        doc["traceEvents"] = [e for e in evs if not (
            e.get("cat") == "user_annotation" and e["name"].startswith(runfiles.MODULE_PREFIX)
            and e["ts"] <= op["ts"] <= e["ts"] + e["dur"])]
    return mutate


def test_forward_only_gemm_outside_every_module(tmp_path, base):
    """A forward-only trace (no autograd nodes) where one GEMM op lies outside every module range: that op's
    kernels form the row without a module, every other GEMM keeps its module, the time adds up."""
    run = run_copy(tmp_path, "llama_decode", trace=_drop_modules_around_first("aten::mm"))
    with gzip.open(run / runfiles.TRACE_FILE, "rt") as f:
        doc = json.load(f)
    a, b = audit(run), base("llama_decode")
    no_mod = a.rows[a.rows.module.isna()]
    assert len(no_mod) == 1 and no_mod.op.iloc[0] == "aten::mm" and pd.isna(no_mod["pass"].iloc[0])
    assert no_mod.gpu_us.iloc[0] == pytest.approx(gemm_us_by_ext(doc)[doc["_op_ext"]] / a.steps)
    assert a.rows.gpu_us.sum() == pytest.approx(b.rows.gpu_us.sum())
    assert a.rows.module.notna().sum() == len(a.rows) - 1
    assert_readable(run)


def test_training_step_without_sequence_numbers(tmp_path, base):
    """A training trace without ``Sequence number`` (another profiler setting): the backward GEMMs have no
    module (pandas 3 holds the missing module as NaN), the forward ones keep theirs; the time adds up."""
    def mutate(doc):
        for e in doc["traceEvents"]:
            if e.get("cat") == "cpu_op":
                e["args"].pop("Sequence number", None)
    run = run_copy(tmp_path, "gpt2_train", trace=mutate)
    a, b = audit(run), base("gpt2_train")
    assert a.rows.gpu_us.sum() == pytest.approx(b.rows.gpu_us.sum())
    fwd = b.rows[b.rows["pass"] == "fwd"].gpu_us.sum()
    assert a.rows[a.rows.module.notna()].gpu_us.sum() == pytest.approx(fwd)
    assert a.rows.module.isna().any() and (a.rows.module.isna() == a.rows["pass"].isna()).all()
    assert_readable(run)


ODD_ENVS = {
    "a list": lambda e: [e],
    "a string": lambda e: "NVIDIA H200",
    "null": lambda e: None,
    "fields of other types": lambda e: {**e, "cc": 9.0, "sm_count": "132", "gpu": 5},
    "capture not an object": lambda e: {**e, "capture": ["steps", 2]},
    "capture fields of other types": lambda e: {**e, "capture": {**e["capture"], "steps": "two",
                                                                  "allow_tf32": "false"}},
    "numbers out of range": lambda e: {**e, "sm_count": -1, "cc": float("nan")},
}


@pytest.mark.parametrize("kind", list(ODD_ENVS))
def test_env_of_another_shape(tmp_path, base, kind):
    """env.json valid JSON but not an object, or fields of another type: each field is checked on its own,
    the usable ones kept (``"sm_count": "132"`` is 132), the rest named in a note; the rows are the
    unchanged run's."""
    run = run_copy(tmp_path, "odd_linear", env=ODD_ENVS[kind])
    a = audit(run)
    same_rows(a, base("odd_linear"))
    assert a.env.get("sm_count") == 132 and a.env.get("cc") == "9.0" and a.gpu == "NVIDIA H200"
    assert a.steps == 2
    env_notes = [n for n in a.notes if runfiles.ENV_FILE in n]
    assert len(env_notes) == 1
    if kind == "fields of other types":
        assert "gpu=5" in env_notes[0] and "sm_count" not in env_notes[0] and "cc=" not in env_notes[0]
    assert_readable(run)


# ------------------------------------------------------------------------------------------ GPU facts
def test_env_of_another_gpu_changes_nothing(tmp_path, base):
    """env.json of an H100 (114 SMs) and of an older architecture next to an H200 trace: waves, alignment
    fallbacks and peaks are the H200's (the trace's deviceProperties), and the note says where each came
    from."""
    for env in ({"gpu": "NVIDIA H100 80GB HBM3", "sm_count": 114, "cc": "9.0"},
                {"gpu": "NVIDIA H200", "sm_count": 66, "cc": "10.0"}):
        run = run_copy(tmp_path / env["cc"], "llama_decode", env=lambda e, env=env: {**e, **env})
        a = audit(run)
        same_rows(a, base("llama_decode"))
        assert a.env["sm_count"] == 132 and a.env["cc"] == "9.0" and a.gpu == "NVIDIA H200"
        note = next(n for n in a.notes if n.startswith("env.json says"))
        assert "132 SMs" in note and f"{env['sm_count']} SMs" in note and "SM count" in note
        assert ("nothing of env.json" in note) == (env["gpu"] != "NVIDIA H200")


# ------------------------------------------------------------------------------------------ module names
def _rename_modules(mapping):
    """Rename the components of the capture's module ranges (CPU and GPU copies) by `mapping`."""
    def mutate(doc):
        for e in doc["traceEvents"]:
            if e.get("cat") in ("user_annotation", "gpu_user_annotation") and \
                    e["name"].startswith(runfiles.MODULE_PREFIX):
                path = e["name"][len(runfiles.MODULE_PREFIX):].split(".")
                e["name"] = runfiles.MODULE_PREFIX + ".".join(mapping.get(p, p) for p in path)
    return mutate


@pytest.mark.parametrize("cls", ["_LoRALinear", "mlp", "Ärmel", "线性"])
@pytest.mark.parametrize("with_env", [True, False], ids=["run", "bare trace"])
def test_class_and_order_names_collapse_whatever_the_class(tmp_path, base, cls, with_env):
    """A class-and-order capture (global hooks: ``Linear_0``, ``Linear_1``) whose class names start with an
    underscore, a lower-case or a non-ASCII letter: the layers collapse as ``Linear_*`` does, the same rows;
    decided from env.json's module_naming, or, for a bare trace, from the names themselves."""
    run = run_copy(tmp_path, "cli_script", trace=_rename_modules({"Linear_0": f"{cls}_0",
                                                                  "Linear_1": f"{cls}_1"}))
    a, b = audit(run if with_env else run / runfiles.TRACE_FILE), base("cli_script")
    assert len(a.rows) == len(b.rows) == 5
    assert set(a.rows.module) == {f"{cls}_*"} and set(b.rows.module) == {"Linear_*"}
    same_rows(a.rows.assign(module=b.rows.module), b)


@pytest.mark.parametrize("with_env", [True, False], ids=["run", "bare trace"])
def test_attribute_names_stay_apart(tmp_path, base, with_env):
    """Attribute paths: ``layers.3`` collapses; attributes named ``proj_1`` / ``proj_2`` (k_proj and v_proj of
    the same shape renamed) or ``conv2d_1x1`` stay as they are, never folded into one row."""
    run = run_copy(tmp_path, "llama_decode", trace=_rename_modules({"k_proj": "proj_1", "v_proj": "proj_2",
                                                                    "q_proj": "conv2d_1x1"}))
    a, b = audit(run if with_env else run / runfiles.TRACE_FILE), base("llama_decode")
    assert len(a.rows) == len(b.rows)
    mods = set(a.rows.module.dropna())
    assert {"model.layers.*.self_attn.proj_1", "model.layers.*.self_attn.proj_2",
            "model.layers.*.self_attn.conv2d_1x1"} <= mods
    assert collapse("model.layers.3.mlp", class_order=False) == "model.layers.*.mlp"
    assert collapse("model.layers.3.conv2d_1x1") == "model.layers.*.conv2d_1x1"


# ------------------------------------------------------------------------------------------ steps
def _step_events(doc):
    return [e for e in doc["traceEvents"] if e.get("cat") == "user_annotation"
            and e["name"].startswith(runfiles.STEP_PREFIX)]


def _duplicate_steps(doc):
    doc["traceEvents"] += [dict(e) for e in _step_events(doc)]


def _enclosing_step(doc):
    steps = _step_events(doc)
    a, b = min(e["ts"] for e in steps), max(e["ts"] + e["dur"] for e in steps)
    doc["traceEvents"].append({**steps[0], "name": runfiles.STEP_PREFIX + "all", "ts": a - 1, "dur": b - a + 2})


@pytest.mark.parametrize("program", ["gpt2_train", "mixtral_moe"])
@pytest.mark.parametrize("mutate", [_duplicate_steps, _enclosing_step], ids=["each step twice", "enclosing"])
def test_steps_written_twice_or_enclosed_are_the_same_steps(tmp_path, base, program, mutate):
    """Every step range written twice (a file merged or exported twice), or one more step range around all
    steps: the same number of steps, rows and per-step figures as the unchanged capture, and a note."""
    run = run_copy(tmp_path, program, trace=mutate)
    a, b = audit(run), base(program)
    assert a.steps == b.steps == 2
    assert a.step_gpu_us == pytest.approx(b.step_gpu_us) and a.gemm_gpu_us == pytest.approx(b.gemm_gpu_us)
    same_rows(a, b)
    assert any("written more than once" in n or "enclose other step ranges" in n for n in a.notes)
    assert_readable(run)


def test_overlapping_steps_of_another_thread_count_each_launch_once(tmp_path, base):
    """A second thread's step ranges of the same names that overlap the first's (step 0's starts and ends
    inside step 0, step 1's starts inside step 1 and ends after it): each launch is counted once, none
    dropped; a step is a name, so the steps stay 2 and the per-step figures the unchanged capture's, with
    notes naming the overlap and the steps marked twice."""
    def mutate(doc):
        steps = _step_events(doc)
        for i, e in enumerate(steps):
            doc["traceEvents"].append({**e, "name": runfiles.STEP_PREFIX + f"{i}", "tid": e["tid"] + 1,
                                       "ts": e["ts"] + e["dur"] / 4, "dur": e["dur"] / 4 if i == 0 else e["dur"]})
    run = run_copy(tmp_path, "gpt2_train", trace=mutate)
    a, b = audit(run), base("gpt2_train")
    assert a.steps == b.steps == 2
    assert a.gemm_gpu_us == pytest.approx(b.gemm_gpu_us) and a.step_gpu_us == pytest.approx(b.step_gpu_us)
    assert a.rows.gpu_us.sum() == pytest.approx(b.rows.gpu_us.sum())
    assert any("overlap in time" in n for n in a.notes)
    assert any("2 step(s) marked more than once" in n and "on up to 2 threads" in n for n in a.notes), a.notes


# ------------------------------------------------------------------------------------------ launch records
def _drop_launch_records(doc):
    """What a trace exported without its runtime events and External ids looks like."""
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("cat") not in ("cuda_runtime", "cuda_driver",
                                                                                "ac2g")]
    for e in doc["traceEvents"]:
        if isinstance(e.get("args"), dict):
            e["args"].pop("External id", None)
            e["args"].pop("correlation", None)


def plain_gemm_us(doc) -> float:
    return sum(e["dur"] for e in doc["traceEvents"] if e.get("cat") == "kernel" and decode(e["name"]).kind == "gemm")


@pytest.mark.parametrize("program", ["mixtral_moe", "compiled_mlp", "odd_linear", "gpt2_train"])
def test_kernels_without_launch_records_are_placed_by_gpu_time(tmp_path, base, program):
    """Runtime events and External ids dropped: no kernel has a CPU launch time, and those that run after
    their step's CPU range ends (up to half of the GEMM time here) still count in their step: the GEMM time
    is the unchanged capture's (every GEMM kernel of these captures runs in a step); the notes say how the
    launches were placed and why modules and ops are missing, never to record shapes."""
    run = run_copy(tmp_path, program, trace=_drop_launch_records)
    with gzip.open(run / runfiles.TRACE_FILE, "rt") as f:
        doc = json.load(f)
    a, b = audit(run), base(program)
    assert a.steps == b.steps
    assert a.gemm_gpu_us == pytest.approx(b.gemm_gpu_us)
    assert a.gemm_gpu_us * a.steps == pytest.approx(plain_gemm_us(doc))
    assert a.step_gpu_us == pytest.approx(b.step_gpu_us)
    assert a.rows.module.isna().all() and a.rows.op.isna().all()
    placed = next(n for n in a.notes if "have no launch record" in n and "placed in steps by GPU time" in n)
    copies = sum(1 for e in doc["traceEvents"] if e.get("cat") == "gpu_user_annotation"
                 and e["name"].startswith(runfiles.MODULE_PREFIX))
    backward = any(e.get("cat") == "cpu_op" and e["name"].startswith("autograd::engine") for e in doc["traceEvents"])
    if copies:                                # GPU copies of the module ranges: around every forward kernel
        n = re.match(r"([\d,]+) launches", placed).group(1)
        assert "inside the GPU copy of one of its step's ranges" in placed
        assert backward or f"placed in steps by GPU time: {n} inside the GPU copy" in placed
    assert any("not linked to the ops" in n and "no External id" in n for n in a.notes)
    assert not any("record_shapes" in n for n in a.notes)
    assert_readable(run)


def test_ops_without_shapes_say_record_shapes(tmp_path):
    """A trace taken with record_shapes off (no Input Dims, ``record_shapes: 0``): the note asks for it."""
    def mutate(doc):
        doc["record_shapes"] = 0
        for e in doc["traceEvents"]:
            if e.get("cat") == "cpu_op":
                for k in ("Input Dims", "Input type", "Input Strides", "Concrete Inputs"):
                    e["args"].pop(k, None)
    a = audit(run_copy(tmp_path, "llama_decode", trace=mutate))
    assert any("record_shapes=True" in n for n in a.notes)
    assert not any("not linked" in n for n in a.notes)


# ------------------------------------------------------------------------------------------ the log
def _shift_log(seconds):
    from datetime import datetime, timedelta

    def mutate(text):
        def sub(m):
            t = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S") + timedelta(seconds=seconds)
            return f"[{t:%Y-%m-%d %H:%M:%S}]"
        return re.sub(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\]", sub, text, flags=re.MULTILINE)
    return mutate


@pytest.mark.parametrize("shift,joined", [(86400, False), (3 * 3600 + 7 * 60, False), (-5 * 3600, True),
                                          (5 * 3600 + 1800, True)],
                         ids=["a day later", "3 h 7 min later", "UTC-5", "UTC+5:30"])
def test_log_of_another_run_is_not_joined(tmp_path, base, shift, joined):
    """The run's log with its times moved: by a day or by 3 h 7 min it is another run's log and is not joined
    (no algo on any row, a note); by a time zone's offset it is the same run's, joined as before."""
    run = run_copy(tmp_path, "llama_decode", log=_shift_log(shift))
    a, b = audit(run), base("llama_decode")
    assert b.rows.algo.notna().sum() >= len(b.rows) - 1
    if joined:
        same_rows(a, b, cols=("gpu_us", "algo", "log_calls"))
        assert not any("another run" in n for n in a.notes)
    else:
        assert a.rows.algo.isna().all() and a.rows.log_calls.isna().all()
        assert any("a log of another run is not joined" in n for n in a.notes)
        same_rows(a, b, cols=("gpu_us", "calls", "share", "pct_peak", "floor_us"))


def test_two_kinds_of_gpu_judge_each_launch_by_its_device(tmp_path, base):
    """Step 1 of the decode run moved to a second GPU of another kind (device 1: an H100 PCIe, 114 SMs, in
    deviceProperties and on its kernels): each GEMM has a row per GPU, judged with that GPU's peak and SM
    count; the GEMM time is the unchanged capture's."""
    from cublaslt_probe.vocab import gpu_peaks

    def mutate(doc):
        step1 = sorted(e["ts"] for e in _step_events(doc))[1]
        doc["deviceProperties"].append({**doc["deviceProperties"][0], "id": 1, "name": "NVIDIA H100 PCIe",
                                        "numSms": 114})
        for e in doc["traceEvents"]:
            if e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy", "gpu_user_annotation") and e["ts"] >= step1:
                e["pid"] = 1
                if "device" in e["args"]:
                    e["args"]["device"] = 1
    run = run_copy(tmp_path, "llama_decode", trace=mutate)
    a, b = audit(run), base("llama_decode")
    assert a.gemm_gpu_us == pytest.approx(b.gemm_gpu_us) and a.rows.gpu_us.sum() == pytest.approx(b.rows.gpu_us.sum())
    assert set(a.rows.gpu) == {"NVIDIA H200", "NVIDIA H100 PCIe"} and set(b.rows.gpu) == {"NVIDIA H200"}
    assert any("2 kinds of GPU" in n for n in a.notes)
    key = ["module", "op", "m", "n", "k", "kernel"]
    for gpu, sms in (("NVIDIA H200", 132), ("NVIDIA H100 PCIe", 114)):
        mine = a.rows[a.rows.gpu == gpu]
        assert len(mine) >= len(b.rows) - 1
        assert (mine.peak_tflops == gpu_peaks(gpu).tflops["bf16"])[mine.dtype == "bf16"].all()
        both = mine.merge(b.rows, on=key, suffixes=("", "_b"))
        assert len(both) == len(mine)
        w = both.dropna(subset=["waves"])
        assert len(w) and list(w.waves) == pytest.approx(list(w.waves_b * 132 / sms))
    assert_readable(run)


def test_log_of_another_process_is_not_joined(tmp_path, base):
    """The run's log with its lines' ``[pid]`` changed to another process: not joined (a note names both);
    with half its lines of another process (a log of two processes), the trace's own lines still join."""
    other = lambda text: re.sub(r"^(\[[^]]*\]\[cublasLt\])\[454\]", r"\1[4242]", text, flags=re.MULTILINE)
    a, b = audit(run_copy(tmp_path / "all", "llama_decode", log=other)), base("llama_decode")
    assert a.rows.algo.isna().all()
    assert any("4242" in n and "454" in n and "not joined" in n for n in a.notes)
    same_rows(a, b, cols=("gpu_us", "calls", "share", "pct_peak", "floor_us"))

    def mixed(text):
        return text + other(text)
    c = audit(run_copy(tmp_path / "mixed", "llama_decode", log=mixed))
    same_rows(c, b, cols=("gpu_us", "algo", "log_calls"))
    assert any("lines of process 4242" in n and "left out" in n for n in c.notes)


def _second_rank(doc, same_tid=False, prefix=""):
    """The same program run a second later by a second process on a second GPU of the same kind, merged into
    one file (as HTA and Perfetto users merge rank traces): its ids and autograd sequence numbers repeat the
    first's (`same_tid`: its thread ids too; `prefix`: its module names get one, as another program's)."""
    rank = []
    for e in doc["traceEvents"]:
        e2 = json.loads(json.dumps(e))
        if isinstance(e2.get("ts"), (int, float)):
            e2["ts"] += 1e6
        if prefix and str(e2.get("name", "")).startswith(runfiles.MODULE_PREFIX):
            e2["name"] = runfiles.MODULE_PREFIX + prefix + e2["name"][len(runfiles.MODULE_PREFIX):]
        if e.get("pid") == 454:
            e2["pid"] = 455
            if e2.get("tid") == 454 and not same_tid:
                e2["tid"] = 455
        elif e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy", "gpu_user_annotation", "ac2g") or \
                e.get("ph") == "M":
            e2["pid"] = e["pid"] + 1 if isinstance(e.get("pid"), int) and e["pid"] >= 0 else e.get("pid")
            if isinstance(e2.get("args"), dict) and "device" in e2["args"]:
                e2["args"]["device"] = 1
        else:
            continue
        rank.append(e2)
    doc["traceEvents"] += rank
    doc["deviceProperties"].append({**doc["deviceProperties"][0], "id": 1})


def test_two_ranks_merged_step_is_both_ranks_step(tmp_path, base):
    """Two processes running the same decode steps merged into one file: 2 steps, each both ranks' (calls and
    GPU time per step twice one process's, no launch of one rank folded into the other's; the rest of every
    row the one process's), a note naming both pids; --pid keeps one (and the run's log, process 454's, is
    not joined to process 455)."""
    run = run_copy(tmp_path, "llama_decode", trace=_second_rank)
    a, b = audit(run), base("llama_decode")
    assert a.steps == 2
    assert a.gemm_gpu_us == pytest.approx(2 * b.gemm_gpu_us) and a.step_gpu_us == pytest.approx(2 * b.step_gpu_us)
    same_rows(a.rows.assign(calls=a.rows.calls / 2, gpu_us=a.rows.gpu_us / 2), b)
    assert any("2 processes (454, 455)" in n for n in a.notes)
    one = audit(run, pid=455)                  # the run folder's log is process 454's: not joined
    assert one.steps == 2
    same_rows(one, b, cols=("gpu_us", "calls", "share", "pct_peak", "floor_us"))
    assert one.rows.algo.isna().all() and any("another process's log is not joined" in n for n in one.notes)
    r = cli(run, "--pid", "455", "-f", "jsonl", "--top", "0")
    assert r.exit_code == 0 and len(r.output.strip().splitlines()) >= len(b.rows)
    r = cli(run, "--pid", "999")
    assert r.exit_code == 2 and "Error: --pid 999: no such process in this trace: it holds 454, 455" in r.output


def test_two_ranks_each_keep_their_modules(tmp_path, base):
    """A training step and another program's (module names prefixed ``r1.``) merged, with the same thread id
    and the same autograd sequence numbers: each rank's forward and backward GEMMs keep their own modules."""
    run = run_copy(tmp_path, "gpt2_train", trace=lambda d: _second_rank(d, same_tid=True, prefix="r1."))
    a, b = audit(run), base("gpt2_train")
    r1 = a.rows.module.str.startswith("r1.").fillna(False).astype(bool)
    for part in (a.rows[r1], a.rows[~r1]):
        assert part.gpu_us.sum() == pytest.approx(b.rows.gpu_us.sum())
        got = part.assign(module=part.module.str.replace("r1.", "", regex=False))
        assert sorted(zip(got.module, got["pass"], got.m, got.n, got.k)) == \
            sorted(zip(b.rows.module, b.rows["pass"], b.rows.m, b.rows.n, b.rows.k))


def test_an_idle_gpu_of_another_kind_changes_nothing(tmp_path, base):
    """deviceProperties that list a second GPU of another kind on which no kernel ran (the machine's other
    GPUs): the audit is the unchanged capture's, with the GPU that ran the kernels."""
    def mutate(doc):
        doc["deviceProperties"].append({**doc["deviceProperties"][0], "id": 1, "name": "NVIDIA H100 PCIe",
                                        "numSms": 114})
    a, b = audit(run_copy(tmp_path, "llama_decode", trace=mutate)), base("llama_decode")
    same_rows(a, b)
    assert a.gpu == "NVIDIA H200" and a.env["sm_count"] == 132 and not any("kinds of GPU" in n for n in a.notes)


def test_launches_left_out_say_their_gemm_time(tmp_path):
    """The last step's range lost (a capture stopped before its mark was written): its launches are outside
    every step, and the note gives their GEMM time, as a plain json.load of the file sums it."""
    def mutate(doc):
        last = max(_step_events(doc), key=lambda e: e["ts"])
        doc["_cut"] = (last["ts"], last["ts"] + last["dur"])
        doc["traceEvents"].remove(last)
    run = run_copy(tmp_path, "llama_decode", trace=mutate)
    with gzip.open(run / runfiles.TRACE_FILE, "rt") as f:
        doc = json.load(f)
    launch = {e["args"]["correlation"]: e["ts"] for e in doc["traceEvents"]
              if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    lo, hi = doc["_cut"]
    lost = sum(e["dur"] for e in doc["traceEvents"] if e.get("cat") == "kernel"
               and decode(e["name"]).kind == "gemm" and lo <= launch[e["args"]["correlation"]] <= hi)
    a = audit(run)
    assert a.steps == 1
    note = next(n for n in a.notes if "outside the 1 step ranges are left out" in n)
    said = re.search(r"\(([\d,.]+) µs of GEMM time", note).group(1)
    assert float(said.replace(",", "")) == pytest.approx(lost, abs=0.05)
