"""GPU tests (run where an NVIDIA GPU is visible: `python3 -m pytest -m gpu`); skipped with a reason elsewhere."""
import dataclasses
import re
import statistics

import pytest

from cublaslt_probe import sweep
from cublaslt_probe.analysis import dataset
from cublaslt_probe.cases import Case
from cublaslt_probe.logs import without_pointers

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def probe():
    from cublaslt_probe.gpu.probe import Probe
    return Probe()


def test_quick_preset_end_to_end(probe, tmp_path):
    cases = sweep.plan("quick").cases
    out = str(tmp_path / "quick.parquet")
    df = sweep.run(cases, out, probe, progress=False)
    assert len(df) == len(cases)
    dataset.validate(dataset.read_parquet(out))
    ok = df[df.error.isna()]
    assert len(ok) >= 0.9 * len(df), df[df.error.notna()][["key", "error"]].to_string()
    assert (ok.n_kernels > 0).all()
    assert (ok.time_us > 0).all() and (ok.tflops > 0).all()
    assert (ok.heuristic_miss_us > 0).all() and (ok.heuristic_hit_us > 0).all()
    # every GEMM that went through cuBLASLt logged exactly one trace line, and its algo matches its kernel
    lt_rows = ok[ok.backend.isin(["torch", "torch-lt", "lt"])]
    assert lt_rows.algo_id.notna().all()
    assert (ok.consistent.dropna()).all()
    assert ok.log_matches_case.notna().all() and ok.log_matches_case.all()
    assert ok.consistent.notna().sum() >= 0.5 * len(ok)
    assert df.gpu.iloc[0].startswith("NVIDIA") and df.sm_count.iloc[0] > 0
    # timing evidence: the spin covered the host (the GPU idled only the events' ~1.4 µs between samples),
    # short GEMMs were timed in batches, and the first call after an event pays a boundary cost on the
    # whole (the differential sample removes it)
    # (the allowance: the calibrated cost of an event pair, 1.3-2.6 µs on the H200 hosts lent, plus 0.75 µs)
    assert 2.0 <= probe.gap_limit_us < 4.0
    over = ok[ok.time_gap_us / ok.time_reps > probe.gap_limit_us]
    if len(over):   # the raw records' whole timing evidence, every attempt, to say what the GPU waited for
        import json
        with open(sweep.raw_path(out)) as f:
            raw = {r["key"]: r for r in map(json.loads, f) if r.get("type") == "gemm"}
        pytest.fail(f"idle between samples over {probe.gap_limit_us:.2f} µs each: " + "; ".join(
            f"{k}: gap {raw[k]['time_gap_us']} over {raw[k]['time_us_reps']} x {raw[k]['time_calls_per_rep']} "
            f"of {raw[k]['time_us']:.1f} µs, timing {raw[k]['timing']}" for k in over.key))
    # every timing batch was fully queued before the GPU reached it (the spin is sized to the host's lead)
    assert ok.time_behind.notna().all() and (ok.time_behind == 0).all(), \
        ok[ok.time_behind != 0][["key", "time_us", "time_behind"]].to_string()
    short = ok[ok.time_us < 50]
    assert len(short) and (short.time_calls_per_rep >= 3).all(), \
        short[short.time_calls_per_rep < 3][["key", "time_us", "time_us_first", "time_calls_per_rep"]].to_string()
    assert (short.time_us_first - short.time_us).median() > 0.5
    # torch, cupy and lt of one shape ask cuBLASLt the same question: one heuristic measurement
    assert (ok.heuristic_shared >= 1).all() and (ok.heuristic_shared > 1).any()


def test_lt_backend_runs_the_algo_it_logged(probe):
    c = Case("lt", "mm", "bf16", "NT", 128, 4096, 4096)
    [rec] = probe.run_window([c])
    assert rec["error"] is None
    row = dataset.build([rec], probe.env).iloc[0]
    assert row.algo_tile == rec["lt_config"]["tile"]
    assert row.consistent


def test_time_gpu_returns_the_samples_and_their_evidence(probe):
    b = probe.builder
    c = Case("torch", "mm", "bf16", "NT", 16, 4096, 4096)
    b.set_flags(c)
    fn = b.build(c).fn
    fn()
    t = probe.time_gpu(fn, key="torch|mm")
    assert t.calls_per_rep >= 3 and len(t.samples_us) >= 5 and t.min_us <= t.median_us
    assert t.behind == 0 and t.gap_us is not None and t.gap_us / len(t.samples_us) <= t.gap_limit_us
    assert t.evidence()["rule"] == "lead" and t.evidence()["attempts"] in (1, 2)
    t = probe.time_gpu(fn, reps=7, key="torch|mm")
    assert len(t.samples_us) == 7


def test_candidates_are_run_and_compared(probe):
    from cublaslt_probe.gpu.alternatives import lt_candidates
    rows = lt_candidates(probe, Case("lt", "mm", "bf16", "NT", 256, 4096, 4096), top=8, reps=5)
    assert 1 <= len(rows) <= 8 and rows[0]["rank"] == 0
    ok = [r for r in rows if r["error"] is None]
    assert ok and all(r["kernels"] for r in ok)
    assert all(r["max_rel_diff_vs_0"] < 2e-2 for r in ok)


def test_error_rows_do_not_stop_a_window(probe):
    bad = Case("torch", "scaled_mm", "fp8", "NT", 3, 5, 7)       # K not a multiple of 16: torch refuses
    good = Case("torch", "mm", "fp16", "NN", 64, 64, 64)
    recs = probe.run_window([bad, good])
    assert recs[0]["error"] and "16" in recs[0]["error"]
    assert recs[1]["error"] is None and recs[1]["kernels"]


def test_a_window_cut_by_memory_keeps_each_gemms_flags(probe):
    """Cutting a window (memory budget) profiles the earlier GEMMs under their own flags; the GEMM that cut it
    must then run under its own again (this leaked tf32 and the Lt path into 33 llm rows once)."""
    cases = [Case("torch", "mm", "fp32", "NT", 64, 1024, 1024), Case("torch", "mm", "tf32", "NT", 64, 1024, 1024),
             Case("torch-lt", "mm", "bf16", "NN", 64, 1024, 1024), Case("torch", "mm", "bf16", "NN", 64, 1024, 1024),
             Case("torch", "mm", "fp32", "NN", 64, 1024, 1024)]
    options = probe.options
    probe.options = dataclasses.replace(options, mem_budget=1)  # every GEMM cuts the window
    try:
        recs = probe.run_window(cases)
    finally:
        probe.options = options
    df = dataset.build(recs, probe.env)
    assert df.error.isna().all()
    assert df.log_matches_case.all(), df[["key", "log_function", "log_matches_case"]].to_string()
    assert df.consistent.dropna().all()



@pytest.mark.parametrize("pipeline", [True, False])
def test_the_gemm_that_cuts_a_window_leaves_the_others_capture_out_of_its_build(probe, pipeline):
    """A GEMM that cuts its window (memory budget) first finishes the GEMMs before it: their kernel capture
    is theirs (`profile_share`), not this GEMM's build phase. The first GEMM's profiled call runs about 20
    ms (fp32 8192^3, no tf32); the small GEMMs after it have met their kernels already."""
    small = [Case("torch", "mm", "bf16", "NN", 64, 1024, 1024), Case("lt", "mm", "bf16", "NN", 64, 1024, 1024)]
    long_ = Case("torch", "mm", "fp32", "NN", 8192, 8192, 8192)
    options = probe.options
    probe.options = dataclasses.replace(options, mem_budget=1, pipeline=pipeline)  # every GEMM cuts the window
    try:
        probe.run_window(small)   # their kernels loaded, their questions asked
        recs = probe.run_window([long_] + small)
    finally:
        probe.options = options
    assert all(r["error"] is None for r in recs), [r["error"] for r in recs]
    session_ms = recs[0]["probe_ms"]["profile_share"]   # the first window held one GEMM: its whole capture
    assert session_ms > 15, recs[0]["probe_ms"]
    for r in recs[1:]:
        assert r["probe_ms"]["build_warm"] < session_ms / 2, (r["key"], r["probe_ms"], session_ms)
def test_the_pipeline_measures_what_one_step_after_another_measures(probe):
    """The same window with the pipeline on (the default: each GEMM prepared while the GPU times the one before,
    the heuristic timed by the companion process) and off, twice each, alternating: the same kernels and log
    lines, the timing evidence holds, the times agree within the method's noise, and the heuristic was timed
    where each mode says."""
    cases = [c for c in sweep.plan("quick").cases if c.backend in ("torch", "torch-lt", "lt", "cupy")][::6][:24]
    probe._companion.wait_ready()   # (the probe never waits for it: a window before it is ready measures in-process)
    runs = {True: [], False: []}
    for on in (True, False, False, True):
        probe.options = dataclasses.replace(probe.options, pipeline=on)
        runs[on].append({r["key"]: r for r in probe.run_window(cases)})
    probe.options = dataclasses.replace(probe.options, pipeline=True)
    on, off = runs[True][1], runs[False][0]
    assert all(not r["error"] for r in on.values()), [r["error"] for r in on.values() if r["error"]]
    assert {r["heuristic_where"] for r in on.values()} == {"companion"}
    assert {r["heuristic_where"] for r in off.values()} == {"probe"}
    devs, miss_on, miss_off = [], [], []
    for k, r in on.items():
        assert r["kernels"] == off[k]["kernels"], k
        assert without_pointers(r["log_lines"]) == without_pointers(off[k]["log_lines"]), k
        assert r["timing"]["behind"] == 0 and r["time_gap_us"] / r["time_us_reps"] <= r["timing"]["gap_limit_us"], \
            (k, r["timing"])
        # pipelined, unless its arithmetic is heavy: then one step after another in both modes
        from cublaslt_probe.gpu.probe import is_heavy
        assert ("wait" in r["probe_ms"] and "estimate" in r["probe_ms"]) == (not is_heavy(Case.from_key(k))), k
        assert r["heuristic_miss_us"] > 0 and r["heuristic_hit_us"] > 0
        miss_on.append(r["heuristic_miss_us"])
        miss_off.append(off[k]["heuristic_miss_us"])
        # each mode's two runs averaged: the method's own run-to-run noise is about 1 % (median)
        t_on = (r["time_us"] + runs[True][0][k]["time_us"]) / 2
        t_off = (off[k]["time_us"] + runs[False][1][k]["time_us"]) / 2
        devs.append(abs(t_on / t_off - 1))
    assert sorted(devs)[len(devs) // 2] < 0.03, sorted(devs)
    # the companion's misses and the probe's own: the same calls on another core. The cores differ: pinned
    # (bench_pipeline), the two medians were 0.6-1.7x apart in this session's runs; this probe is not pinned,
    # and the median of the GEMMs' ratios read 0.6-1 in earlier runs and 2.67 once on the two-GPU host
    # (bench12_gpu_tests_probe_x2host_ratio.txt). A miss timed with the cache on (a hit) would read 20-60x
    # short. The median of the GEMMs' ratios is compared: the misses fall in two clusters, 10-60 µs and
    # 150-260 µs, so a ratio of two medians jumps between them.
    ratio = statistics.median(a / b for a, b in zip(miss_on, miss_off))
    assert 1 / 3 < ratio < 3.0, (ratio, miss_on, miss_off)


def test_the_sweep_command_builds_its_dataset_in_processes_started_before_the_probe(tmp_path):
    """`cublaslt-probe sweep` on the GPU: the processes it starts before the probe (`sweep.RowBuilders`,
    spawned: the sweep's process then holds a CUDA context) build the dataset, every row with its kernels."""
    import subprocess
    import sys
    spec = tmp_path / "s.toml"
    spec.write_text('name = "rows"\n[[group]]\nbackends = ["torch"]\ndtypes = ["bf16"]\nlayouts = ["NT"]\n'
                    "m = {range = [1, 40, 1]}\nn = [4096]\nk = [4096]\n")
    out = tmp_path / "o.parquet"
    p = subprocess.run([sys.executable, "-m", "cublaslt_probe", "sweep", "--spec", str(spec), "-o", str(out),
                        "--no-progress"], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "then built the dataset in" in p.stderr
    df = dataset.read_parquet(out)
    assert len(df) == 40 and df.error.isna().all() and df.kernel.notna().all() and (df.time_us > 0).all()
    assert sorted(df.m) == list(range(1, 41)) and df.algo_id.notna().all() and df.log_matches_case.all()


def test_the_librarys_one_time_set_ups_are_paid_in_the_probes_start_up():
    """cuBLASLt's first heuristic question of each type in a process pays a set-up of the library's (87-146 ms
    on the H200); a probe without the helpers asks one of each type of a window before its first GEMM
    (`Probe._library_set_up`), a sweep's probe all of them while it starts. A fresh process, without the
    pipeline: the first GEMM of each type, fp16 and fp32 after bf16, and cupy's, holds its own costs only in its
    build and warm-up (its kernel's load, 2-5 ms)."""
    import json
    import subprocess
    import sys
    code = ("import json\nfrom cublaslt_probe.cases import Case\nfrom cublaslt_probe.gpu.probe import Probe\n"
            "p = Probe(pipeline=False)\n"
            "cs = [Case('torch', 'mm', 'bf16', 'NT', 1, 4096, 4096),\n"
            "      Case('torch', 'mm', 'fp16', 'NT', 2, 4096, 4096),\n"
            "      Case('lt', 'mm', 'fp32', 'NT', 3, 4096, 4096), Case('cupy', 'mm', 'fp16', 'NT', 4, 4096, 6144)]\n"
            "print(json.dumps([[r['key'], r['error'], r['probe_ms']] for r in p.run_window(cs)]))\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    recs = json.loads(p.stdout.strip().splitlines()[-1])
    assert [e for _, e, _ in recs] == [None] * 4, recs
    assert all(ph["build_warm"] < 40 for _, _, ph in recs), recs


COMPANION_CHILD = """
import json
from cublaslt_probe import sweep
from cublaslt_probe.gpu.probe import Probe
cases = [c for c in sweep.plan("quick").cases if c.backend in ("torch", "lt")][:6]
with Probe() as p:
    waited = p._companion.ready is not None
    first = p.run_window(cases)
    p._companion.wait_ready()
    later = p.run_window(cases)
    print(json.dumps({"waited": waited, "ready_after_s": p._companion.ready_after_s,
                      "first": [[r["heuristic_where"], r["kernels"]] for r in first],
                      "later": [[r["heuristic_where"], r["kernels"]] for r in later]}))
"""


def test_the_probe_does_not_wait_for_its_companion():
    """A sweep's probe starts without waiting for its heuristic companion (which loads torch and cuBLASLt in a
    process of its own): the windows run before it is ready measure their heuristic in the probe's process, and
    once it is ready the next window's questions go to it. In a process of its own (one probe per process: a
    second one here would take the cuBLASLt logger from the module's)."""
    import json
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    p = subprocess.run([sys.executable, "-c", COMPANION_CHILD], capture_output=True, text=True, timeout=300, cwd=root)
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert not got["waited"]   # the constructor returned before the companion was ready
    assert {w for w, _ in got["first"]} == {"probe"}, got["first"]
    assert {w for w, _ in got["later"]} == {"companion"}, got["later"]
    assert got["ready_after_s"] > 0
    assert [k for _, k in got["later"]] == [k for _, k in got["first"]]


def test_cupy_operands_from_the_pool_are_laid_out_as_fresh_arrays(probe):
    """cupy's operands are views of the builder's pool (`Builder._cupy`): in every layout, and batched, its GEMM
    gives what torch's product of the same values gives, and its operands and log line are those of fresh
    cupy arrays of the layout (made here: a transposed operand is the swapped view of a fresh array)."""
    import cupy as cp
    torch = probe.torch
    for op, layout, m, n, k, batch in [("mm", lo, 24, 40, 56, 1) for lo in ("NN", "NT", "TN", "TT")] + \
                                     [("bmm", "TN", 16, 24, 32, 3)]:
        c = Case("cupy", op, "fp32", layout, m, n, k, batch)
        pooled = probe.builder.build(c)
        pool = probe.builder._pools["fp32"]
        assert all(pool.data_ptr() <= x.data.ptr < pool.data_ptr() + pool.nbytes for x in pooled.keep)
        a, b = (torch.as_tensor(x, device="cuda") for x in pooled.keep)
        assert tuple(a.shape[-2:]) == (m, k) and tuple(b.shape[-2:]) == (k, n)

        def fresh(rows, cols, transposed, batch=batch):
            shape = ((batch,) if batch > 1 else ()) + ((cols, rows) if transposed else (rows, cols))
            x = cp.random.standard_normal(shape, dtype=cp.float32)
            return x.swapaxes(-1, -2) if transposed else x
        fa, fb = fresh(m, k, layout[0] == "T"), fresh(k, n, layout[1] == "T")
        for x, y in zip(pooled.keep, (fa, fb)):
            assert x.shape == y.shape and x.strides == y.strides and x.dtype == y.dtype
        got = torch.as_tensor(pooled.fn(), device="cuda")
        want = torch.matmul(a.double(), b.double()).float()
        assert torch.allclose(got, want, rtol=1e-4, atol=1e-3), (c.key, (got - want).abs().max().item())
        lines = probe.logged_call(pooled.fn)
        again = probe.logged_call(lambda fa=fa, fb=fb: cp.matmul(fa, fb))
        assert lines and without_pointers(lines) == without_pointers(again), c.key


def test_the_garbage_collector_is_off_in_a_window_and_back_on_after(probe):
    import gc
    seen = []
    c = Case("torch", "mm", "bf16", "NT", 16, 4096, 4096)
    build = probe.builder.build

    def spy(case, *a):
        seen.append(gc.isenabled())
        return build(case, *a)
    probe.builder.build = spy
    try:
        probe.run_window([c])
        assert seen == [False] and gc.isenabled()
        gc.disable()   # a caller that switched it off keeps it off
        probe.run_window([c])
        assert not gc.isenabled()
    finally:
        gc.enable()
        del probe.builder.build


def test_a_prewarmed_first_call_runs_the_algo_its_own_question_gets(probe):
    """The prewarm thread asks each GEMM's question ahead of its first call; the algo every call then ran is the
    one the backend's own question gets with cuBLASLt's cache off (asked afresh by the call itself)."""
    cases = [Case(b, "mm", dt, "NT", m, n, 4096) for b in ("torch", "torch-lt", "lt") for dt in ("bf16", "fp16")
             for m, n in ((3, 4104), (7, 6152), (45, 2056))]   # shapes no other test runs
    before = probe._prewarm.asked
    recs = probe.run_window(cases)
    assert probe._prewarm.asked - before == len(cases)   # one question per GEMM: the forms differ by backend
    assert all(not r["error"] for r in recs), [r["error"] for r in recs]
    cap = probe.lib.cache_capacity()
    probe.lib.set_cache_capacity(0)
    try:
        for c, r in zip(cases, recs):
            probe.builder.set_flags(c)
            b = probe.builder.build(c)
            fresh = probe.logged_call(b.fn)
            b.close()
            algo = [re.search(r"algo=\[[^]]*\]", "\n".join(x)).group(0) for x in (r["log_lines"], fresh)]
            assert algo[0] == algo[1], (c.key, algo)
    finally:
        probe.lib.set_cache_capacity(cap)


def test_a_heavy_gemm_after_a_pipelined_one_runs_under_its_own_flags(probe):
    """A heavy GEMM runs once the pipelined GEMM in flight has finished; waiting for that one can set its flags
    (tf32, torch's cuBLASLt path: a retake runs it under its own), so the heavy GEMM must set its own again
    before its calls."""
    from cublaslt_probe.gpu.probe import is_heavy
    cases = [Case("torch-lt", "mm", "tf32", "NN", 16, 4096, 4096), Case("torch", "mm", "fp32", "NN", 128, 4096, 4096)]
    assert not is_heavy(cases[0]) and is_heavy(cases[1])
    recs = probe.run_window(cases)
    assert "wait" in recs[0]["probe_ms"] and "wait" not in recs[1]["probe_ms"]   # pipelined, then heavy
    assert (recs[0]["timing"]["rule"], recs[1]["timing"]["rule"]) == ("lead", "heavy")   # the whole enqueue's spin
    df = dataset.build(recs, probe.env)
    assert df.error.isna().all()
    assert df.log_matches_case.all(), df[["key", "log_function", "log_matches_case"]].to_string()


def test_a_retake_the_host_stalled_through_is_retaken_once_more(probe, monkeypatch):
    """A host that stalls for milliseconds while it enqueues the timed batches (seen on the two-GPU H200 host: a
    retake's 24 calls enqueued in 3.8 ms) leaves the GPU waiting inside them: the first attempt and its retake
    fail their evidence here (a sleep in each enqueue loop, longer than the retake's spin), the third attempt,
    behind a spin sized by the stalled retake, passes; the record keeps both failures."""
    import time

    from cublaslt_probe.gpu.timing import ATTEMPTS
    b = probe.builder
    c = Case("torch", "mm", "bf16", "NT", 16, 4096, 4096)
    b.set_flags(c)
    gemm = b.build(c).fn
    gemm()
    state = {"attempt": 0, "calls": 0}
    attempt = probe.timer._attempt

    def watched(p):
        state["attempt"], state["calls"] = p.attempt, 0
        attempt(p)
    monkeypatch.setattr(probe.timer, "_attempt", watched)

    def fn():
        state["calls"] += 1
        if state["calls"] == 3 and state["attempt"] in (1, 2):
            time.sleep(0.004 if state["attempt"] == 1 else 0.03)   # past the first spin, then the retake's
        gemm()
    t = probe.time_gpu(fn, key="torch|mm")
    assert ATTEMPTS == 3 and t.attempts == 3, t.evidence()
    assert t.retaken["behind"] >= 1 and t.retaken["second"]["behind"] >= 1, t.evidence()
    assert t.behind == 0 and t.gap_us / len(t.samples_us) <= t.gap_limit_us, t.evidence()
    assert t.evidence()["retaken"]["second"]["spin_us"] > t.retaken["spin_us"]


def test_the_drivers_events_time_what_torchs_events_time(probe):
    """The probe's timing events (`driver.Clock`, the driver torch loaded, on torch's stream) against torch's
    own `torch.cuda.Event` around the same GPU work: two spins of known length and a GEMM batch, each
    bracketed by both kinds at once. They read alike (to the events' own cost), an event not yet passed
    reads not done, and an error names the call."""
    import ctypes

    from cublaslt_probe.errors import CaptureError
    from cublaslt_probe.gpu.driver import Clock
    from cublaslt_probe.gpu.operands import current_stream
    torch, clock = probe.torch, probe.clock
    assert isinstance(clock, Clock)
    c = Case("torch", "mm", "bf16", "NT", 16, 4096, 4096)
    probe.builder.set_flags(c)
    gemm = probe.builder.build(c).fn
    gemm()
    torch.cuda.synchronize()
    st = torch.cuda.current_stream()
    assert current_stream(torch) == st.cuda_stream and current_stream(torch, probe.device) == st.cuda_stream
    h = clock.stream(current_stream(torch))
    work = [lambda: probe.spin(200), lambda: probe.spin(2000), lambda: [gemm() for _ in range(5)]]
    for w in work:
        ta, tb = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        da, db = clock.event(), clock.event()
        probe.spin(3000)   # the GPU reaches the events only once all four are queued
        assert clock.record(da, h) == 0
        ta.record(st)
        w()
        tb.record(st)
        assert clock.record(db, h) == 0
        assert not clock.done(db)
        clock.wait(db)
        assert clock.done(db)
        # the driver's pair brackets torch's: it spans theirs plus two events' own GPU time (the probe's
        # calibrated gap: 1.2-1.4 µs on the one-GPU H200 hosts, 2.6 on the two-GPU one)
        ours, theirs = clock.elapsed_us(da, db), ta.elapsed_time(tb) * 1e3
        assert theirs > 10 and -1.0 <= ours - theirs <= 0.02 * theirs + 2 * probe.event_gap_us + 1.0, \
            (ours, theirs, probe.event_gap_us)
        clock.destroy(da)
        clock.destroy(db)
    never = clock.event()   # never recorded: the driver refuses to time it, and the error says which call
    with pytest.raises(CaptureError, match="cuEventElapsedTime failed: CUDA_ERROR_INVALID_HANDLE"):
        clock.elapsed_us(never, never)
    assert isinstance(never, ctypes.c_void_p)


def test_the_lt_backends_operands_are_disjoint_views_of_the_builders_buffers(probe):
    """The lt backend takes A, B and the bias from the builder's random buffers (no allocation or fill per
    GEMM): none overlaps another, including A and B of one dtype and a bias of theirs, and an e5m2 A with its
    e4m3 B; C is the GEMM's own; each GEMM's output is right."""
    torch, b = probe.torch, probe.builder
    for c in (Case("lt", "addmm", "bf16", "NT", 64, 512, 256), Case("lt", "scaled_mm", "fp8_e5m2", "NT", 64, 512, 256),
              Case("lt", "bmm", "fp16", "NN", 32, 256, 128, batch=3)):
        b.set_flags(c)
        built = b.build(c)
        g = built.keep[0]
        pools = [(p.data_ptr(), p.data_ptr() + p.numel() * p.element_size()) for p in b._pools.values()]
        spans = {n: (t.data_ptr(), t.data_ptr() + t.numel() * t.element_size())
                 for n, t in (("A", g.A), ("B", g.B), ("C", g.C), ("bias", g.bias)) if t is not None}
        for n, (lo, hi) in spans.items():
            inside = any(p0 <= lo and hi <= p1 for p0, p1 in pools)
            assert inside == (n != "C"), (c.key, n)
        items = sorted(spans.values())
        assert all(hi <= lo2 for (_, hi), (lo2, _) in zip(items, items[1:])), (c.key, spans)
        built.fn()
        torch.cuda.synchronize()
        # column-major D (m x n here = the blas view) of A^op and B^op: compare against torch in fp32
        p = g.p
        (ar, ac), (br, bc), (cr, cc) = p.shapes()
        A = g.A.reshape(p.batch, ac, ar).float().transpose(-1, -2)
        B = g.B.reshape(p.batch, bc, br).float().transpose(-1, -2)
        A = A.transpose(-1, -2) if p.trans_a == "T" else A
        B = B.transpose(-1, -2) if p.trans_b == "T" else B
        want = A @ B + (g.bias.float().view(1, -1, 1) if g.bias is not None else 0)
        got = g.C.reshape(p.batch, cc, cr).float().transpose(-1, -2)
        assert torch.allclose(got, want, rtol=0.05, atol=0.05 * want.abs().max().item()), c.key
        built.close()


def test_a_retaken_gemm_in_flight_runs_under_its_own_flags(probe, monkeypatch):
    """With the pipeline, the next GEMM's flags are set by the time the samples of the GEMM in flight are read;
    a retake (here every attempt fails its evidence) must set that GEMM's own flags again before it runs it.
    Every call of every GEMM (warm-up, logged, estimating, timed, retaken, profiled) is checked against its
    case's flags as torch reads them at the call. The library is called for the warm-up, logged and estimating
    calls and the capture; the timed, retaken and profiled calls launch what the capture holds (`_replayed`)."""
    from cublaslt_probe.gpu.operands import Built
    from cublaslt_probe.gpu.probe import WARM_CALLS
    from cublaslt_probe.gpu.timing import ATTEMPTS, Timer
    torch, b = probe.torch, probe.builder
    cases = [Case("torch", "mm", "fp32", "NN", 16, 1024, 1024), Case("torch-lt", "mm", "tf32", "NN", 16, 1024, 1024),
             Case("torch", "mm", "fp32", "NT", 16, 1024, 1024), Case("torch-lt", "mm", "tf32", "NT", 16, 1024, 1024)]
    seen = []
    build = b.build

    def watched_build(c, *a):
        built = build(c, *a)
        fn = built.fn

        def call():
            seen.append((c.key, torch.backends.cuda.matmul.allow_tf32,
                         str(torch.backends.cuda.preferred_blas_library()).split(".")[-1].lower()))
            fn()
        return Built(call, built.keep, built.lt_config, built.lt_waves)
    monkeypatch.setattr(b, "build", watched_build)
    monkeypatch.setattr(Timer, "gap_limit_us", -1.0)   # no attempt's evidence passes
    recs = probe.run_window(cases)
    assert all("wait" in r["probe_ms"] for r in recs)   # each was in flight while the next one was prepared
    assert all(r["timing"]["attempts"] == ATTEMPTS for r in recs), [r["timing"] for r in recs]
    want = {c.key: (c.dtype == "tf32", "cublaslt" if c.backend == "torch-lt" else "cublas") for c in cases}
    wrong = [s for s in seen if s[1:] != want[s[0]]]
    assert not wrong, wrong[:5]
    assert len(seen) == 4 * (WARM_CALLS + 3), len(seen)
    assert {r["timing"]["launch"] for r in recs} == {"replay"}


def test_set_flags_reads_torchs_flags_before_it_skips_a_set(probe):
    """`Builder.set_flags` sets a flag only when torch's differs: flags someone else set between two calls are
    read, not taken for the ones the builder set last."""
    torch, b = probe.torch, probe.builder
    cuda = torch.backends.cuda
    lt16 = Case("torch-lt", "mm", "tf32", "NN", 16, 256, 256)
    blas16 = Case("torch", "mm", "fp32", "NN", 16, 256, 256)
    try:
        b.set_flags(blas16)
        assert not cuda.matmul.allow_tf32 and "cublaslt" not in str(cuda.preferred_blas_library()).lower()
        cuda.matmul.allow_tf32 = True   # someone else's
        cuda.preferred_blas_library("cublaslt")
        b.set_flags(blas16)
        assert not cuda.matmul.allow_tf32 and "cublaslt" not in str(cuda.preferred_blas_library()).lower()
        b.set_flags(lt16)
        assert cuda.matmul.allow_tf32 and "cublaslt" in str(cuda.preferred_blas_library()).lower()
        cuda.matmul.allow_tf32 = False
        cuda.preferred_blas_library("cublas")
        b.set_flags(lt16)
        assert cuda.matmul.allow_tf32 and "cublaslt" in str(cuda.preferred_blas_library()).lower()
    finally:
        b.set_flags(Case("torch", "mm", "fp32", "NN", 1, 1, 1))


def test_an_algos_config_is_read_once_and_handed_out_as_a_copy(probe):
    """`LtLibrary.algo_config` keeps each algo's config by its bytes: for each of a problem's heuristic
    candidates (which differ in algo id, tile, stages, split-k...), asked again in reverse order
    once all are kept, it is what the library says of that algo; a caller's change to the dict it got does not
    reach the next caller."""
    from cublaslt_probe.gpu import lt
    lib = probe.builder.lib or lt.LtLibrary()
    p = lt.Problem(1024, 64, 4096, dtype="bf16", trans_a="T", trans_b="N")
    with lt.LtMatmul(lib, p) as mm:
        algos = [r.algo for r in mm.heuristic(16)]
    first = [lib.algo_config(a) for a in algos]
    assert len(algos) >= 4 and len({tuple(sorted(c.items())) for c in first}) >= 4   # configs that differ
    for a, cfg in zip(reversed(algos), reversed(first)):
        got = lib.algo_config(a)
        assert got == lib.read_algo_config(a) == cfg
        got["tile"] = "changed"
    assert [lib.algo_config(a) for a in algos] == first


def test_an_estimate_goes_without_its_spin_only_while_the_batches_in_flight_cover_it(probe, monkeypatch):
    """The estimating call is queued without its spin while the batch of the GEMM in flight that covers that
    spin (`covering_batch`) has not started (`Timer.queue_estimate` with `behind`); with its spin once it has, or
    with nothing in flight. The estimate then reads what it reads behind the spin."""
    from cublaslt_probe.gpu.timing import estimate_spin
    c = next(c for c in sweep.plan("decode").cases if c.backend == "torch" and c.dtype == "bf16")
    probe.builder.set_flags(c)
    b = probe.builder.build(c)
    key = f"{c.backend}|{c.op}"
    b.fn()
    probe.torch.cuda.synchronize()
    timer, spins = probe.timer, []
    spin = timer.spin
    monkeypatch.setattr(timer, "spin", lambda us: (spins.append(us), spin(us)))
    need = estimate_spin(timer.host_us.get(key, 30.0))
    try:
        spin(20_000)   # the batches cannot start for 20 ms
        p = timer.start(b.fn, key, 20.0, None, None)
        assert timer.covered(p, need)
        del spins[:]
        once, _ = timer.read_estimate(timer.queue_estimate(b.fn, key, behind=p))
        assert spins == [], "queued behind the batches in flight, the estimate gets no spin"
        probe.clock.wait(p.events.ends[-1])
        assert not timer.covered(p, need), "the batches have run: nothing covers the estimate"
        timer.end(p)
        assert not timer.covered(None, need)
        del spins[:]
        # behind its spin an estimate can read long now and then (a host stall after the spin), so the shortest
        # of three is compared
        alone = min(timer.read_estimate(timer.queue_estimate(b.fn, key))[0] for _ in range(3))
        assert len(spins) == 3 and spins[0] == pytest.approx(estimate_spin(timer.host_us[key]))
        assert 0.8 < once / alone < 1.25, (once, alone)
    finally:
        probe.torch.cuda.synchronize()
        b.close()


def test_replayed_calls_time_what_the_librarys_launches_time(probe):
    """The window's timed calls are replayed by the driver (`driver.Replay`) for every GEMM but cupy's and heavy
    ones; the same GEMMs timed through the library's own launches (`Probe.time_gpu` on the built call), runs
    alternating (replay, library, library, replay): each record says how its calls were launched, the timing
    evidence holds, the times agree within the method's noise, and the replay enqueues the timed calls in less
    host time."""
    from cublaslt_probe.gpu.probe import is_heavy
    quick = sweep.plan("quick").cases
    cases = [c for c in quick if c.backend != "cupy"][4::8][:20] + [c for c in quick if c.backend == "cupy"][::7]
    assert {c.backend for c in cases} == {"torch", "torch-lt", "lt", "cupy"} and any(c.op == "scaled_mm" for c in cases)
    assert any(is_heavy(c) for c in cases) and not all(is_heavy(c) for c in cases)
    light = [c for c in cases if c.backend != "cupy" and not is_heavy(c)]

    def library():
        out = {}
        with probe._on_own_stream():
            for c in light:
                probe.builder.set_flags(c)
                b = probe.builder.build(c)
                try:
                    b.fn()
                    out[c.key] = probe.time_gpu(b.fn, key=f"{c.backend}|{c.op}")
                finally:
                    b.close()
        return out
    runs = {"replay": [], "library": []}
    for mode in ("replay", "library", "library", "replay"):
        runs[mode].append({r["key"]: r for r in probe.run_window(cases)} if mode == "replay" else library())
    for recs in runs["replay"]:
        assert all(not r["error"] for r in recs.values()), [r["error"] for r in recs.values() if r["error"]]
        for k, r in recs.items():
            lib = Case.from_key(k).backend == "cupy" or is_heavy(Case.from_key(k))
            assert r["timing"]["launch"] == ("library" if lib else "replay"), (k, r["timing"])
            assert r["timing"]["behind"] == 0 and r["time_gap_us"] / r["time_us_reps"] <= r["timing"]["gap_limit_us"], \
                (k, r["timing"])
    devs, enq = [], []
    for c in light:
        on = [runs["replay"][i][c.key] for i in (0, 1)]
        off = [runs["library"][i][c.key] for i in (0, 1)]
        devs.append(abs(sum(r["time_us"] for r in on) / sum(t.median_us for t in off) - 1))
        enq.append(statistics.mean(r["timing"]["enqueue_us"] / r["time_calls_per_rep"] / r["time_us_reps"] for r in on)
                   / statistics.mean(t.enqueue_us / t.calls_per_rep / len(t.samples_us) for t in off))
    assert sorted(devs)[len(devs) // 2] < 0.03, sorted(devs)
    assert statistics.median(enq) < 0.8, sorted(enq)


def test_a_replay_computes_what_the_librarys_call_computes(probe):
    """`driver.Graphs.replay` on the quick preset's GEMMs (all but cupy's, which cannot be captured): the replay,
    launched into an output filled with NaN, writes what the library's own call wrote, for each form the
    library's launches take (a memset before the kernel, a split-K kernel and the reduce behind its programmatic
    edge, one kernel)."""
    t = probe.torch
    kinds = set()
    with probe._on_own_stream():
        for c in [c for c in sweep.plan("quick").cases if c.backend != "cupy"][::3]:
            probe.builder.set_flags(c)
            b = probe.builder.build(c)
            try:
                out = b.fn()
                got = b.keep[0].D if c.backend == "lt" else None   # the lt backend writes D in place
                want = (got if got is not None else out).clone()
                r = probe.graphs.replay(probe._stream(), b.fn)
                try:
                    dst = got if got is not None else r.out
                    dst.fill_(float("nan"))
                    r.launch()
                    t.cuda.synchronize()
                    kinds.add(r.kinds)
                    t.testing.assert_close(dst.float(), want.float(), rtol=2e-3, atol=2e-3, msg=c.key)
                finally:
                    r.close()
            finally:
                b.close()
    assert {("memset", "kernel"), ("kernel", "programmatic kernel"), ("kernel",)} <= kinds, kinds


def test_a_windows_memory_budget_counts_the_outputs_replays_keep(probe, monkeypatch):
    """Each GEMM's replay keeps its captured output alive until the window ends: the budget counts it, so GEMMs
    with small operands and a large output cut the window (their calls made by the library would free their
    outputs call by call)."""
    cases = [Case("torch", "mm", "bf16", "NN", 8192, 8192 + 64 * i, 64) for i in range(4)]   # 1 MB in, 128 out
    finished = []
    finish = probe._finish
    monkeypatch.setattr(probe, "_finish", lambda built: (built and finished.append(len(built)), finish(built)))
    monkeypatch.setattr(probe, "options", dataclasses.replace(probe.options, mem_budget=100 << 20))
    recs = probe.run_window(cases)
    assert all(not r["error"] and r["kernels"] for r in recs), [r["error"] for r in recs]
    assert {r["timing"]["launch"] for r in recs} == {"replay"}
    assert finished == [1, 1, 1, 1], finished


def test_a_call_the_replay_cannot_make_keeps_the_librarys_launches_and_says_why(probe, monkeypatch):
    """A GEMM whose call also copies memory (a graph node the replay does not make) is timed through the
    library's launch path, with the reason in its raw record, and the window's other GEMMs are replayed."""
    from cublaslt_probe.gpu.operands import Built
    cases = [Case("torch", "mm", "bf16", "NT", 16, 4096, 4096), Case("torch", "mm", "fp16", "NT", 16, 4096, 4096)]
    torch, build = probe.torch, probe.builder.build
    x, y = torch.zeros(1 << 20, device="cuda"), torch.ones(1 << 20, device="cuda")

    def copying_build(c, *a):
        b = build(c, *a)
        if c.dtype != "bf16":
            return b
        fn = b.fn
        return Built(lambda: (fn(), x.copy_(y))[0], b.keep, b.lt_config, b.lt_waves)
    monkeypatch.setattr(probe.builder, "build", copying_build)
    recs = {r["key"]: r for r in probe.run_window(cases)}
    copying, plain = recs[cases[0].key], recs[cases[1].key]
    assert not copying["error"] and copying["kernels"] and copying["time_us"] > 0, copying["error"]
    assert copying["timing"]["launch"] == "library"
    assert "node of type 1 is not replayed" in copying["timing"]["replay_refused"], copying["timing"]
    assert plain["timing"]["launch"] == "replay" and "replay_refused" not in plain["timing"]
    # a call that refuses capture (it waits for its stream) is refused as well, with its error
    with probe._on_own_stream():
        b = build(cases[1])
        try:
            sync = torch.cuda.current_stream().synchronize
            refused = probe._replayed(cases[1], Built(lambda: (b.fn(), sync())[0], b.keep))
            assert not refused.replay and "cannot be captured" in refused.replay_refused, refused.replay_refused
            out = b.fn()   # the stream is usable after the refused capture
            torch.cuda.synchronize()
            assert out.isfinite().all()
        finally:
            b.close()


def _counting_build(probe, monkeypatch):
    """The builder's GEMMs with their library calls counted by key (the replay's timed calls are not the
    library's: only its capture is counted)."""
    from cublaslt_probe.gpu.operands import Built
    calls, build = {}, probe.builder.build

    def counting(c, *a):
        b = build(c, *a)
        fn = b.fn

        def counted():
            calls[c.key] = calls.get(c.key, 0) + 1
            return fn()
        return Built(counted, b.keep, b.lt_config, b.lt_waves)
    monkeypatch.setattr(probe.builder, "build", counting)
    return calls


def test_a_gemm_run_one_step_after_another_is_sized_by_its_logged_call(probe, monkeypatch):
    """A GEMM run one step after another (heavy ones in the pipeline; every GEMM without it) makes no estimating
    call of its own: its logged call sizes its plan (the warm-up, the logged call, then the timed calls, or with
    the replay its capture), and the estimate reads what a separate estimating call reads (the spin covers the
    host writing the log, so the events bracket the GEMM alone)."""
    from cublaslt_probe.gpu.probe import WARM_CALLS, is_heavy
    quick = sweep.plan("quick").cases
    heavy = [c for c in quick if is_heavy(c) and c.backend != "cupy"][::4]
    light = [c for c in quick if not is_heavy(c) and c.backend != "cupy"][::9]
    assert len(heavy) >= 10 and len(light) >= 10
    calls = _counting_build(probe, monkeypatch)
    recs = []
    options = probe.options
    try:
        for pipeline, cases in ((True, heavy), (False, light)):
            probe.options = dataclasses.replace(options, pipeline=pipeline)
            recs += probe.run_window(cases)
    finally:
        probe.options = options
    monkeypatch.undo()
    assert all(not r["error"] for r in recs), [r["error"] for r in recs if r["error"]]
    est, compared = [], 0
    for r in recs:
        k = r["key"]
        assert r["timing"]["sized_by"] in ("logged call", "samples"), (k, r["timing"])
        assert r["timing"]["behind"] == 0 and r["time_gap_us"] / r["time_us_reps"] <= r["timing"]["gap_limit_us"], \
            (k, r["timing"])
        if r["timing"]["attempts"] == 1 and r["timing"]["sized_by"] == "logged call":
            # warm-up, logged call, samples and the profiled call; with the replay, its capture instead of the
            # samples and the profiled call (their launches are the replay's)
            timed = 1 if r["timing"]["launch"] == "replay" else r["time_us_reps"] * r["time_calls_per_rep"] + 1
            assert calls[k] == WARM_CALLS + 1 + timed, (k, calls[k], timed)
            compared += 1
        c = Case.from_key(k)
        probe.builder.set_flags(c)
        b = probe.builder.build(c)
        try:
            b.fn()
            est.append(r["timing"]["estimate_us"] / min(probe.timer.estimate(b.fn, f"{c.backend}|{c.op}")[0]
                                                        for _ in range(2)))
        finally:
            b.close()
    assert compared >= 0.8 * len(recs), (compared, len(recs))
    assert 0.95 < statistics.median(est) < 1.05, sorted(est)
    assert sum(0.85 < x < 1.15 for x in est) >= 0.85 * len(est), sorted(est)


def test_a_gemm_that_fails_once_built_is_closed(probe, monkeypatch):
    """A GEMM that fails after it was built, before the GEMM in flight or the window's list holds it, becomes an
    error row and what it holds is closed (an lt GEMM's descriptors, a replay's graph); the window's other
    GEMMs run."""
    from cublaslt_probe.gpu.operands import Built
    build, replayed, start, own_flags = probe.builder.build, probe._replayed, probe.timer.start, probe._own_flags
    current = {}
    failing = {"torch|mm|bf16|NT|16|4096|1024|1", "lt|mm|bf16|NT|16|4096|1024|1", "torch|mm|bf16|NT|4096|4096|4096|1"}
    cases = [Case.from_key(k) for k in sorted(failing)] + [Case("torch", "mm", "fp16", "NT", 16, 4096, 1024)]
    made, closed = {}, []

    class Watch:   # kept by the GEMM: says when its Built is closed
        def __init__(self, key):
            self.key = key

        def close(self):
            closed.append(self.key)

    def watched_build(c, *a):
        b = build(c, *a)
        return Built(b.fn, b.keep + (Watch(c.key),), b.lt_config, b.lt_waves)

    def watched_replay(c, b):
        made[c.key] = out = replayed(c, b)
        return out

    def watched_flags(c):   # made for the timing's start of `c`, right before it is called
        current["case"] = c
        return own_flags(c)

    def failing_start(fn, key, *a, **kw):
        c = current.pop("case", None)   # None: a re-time of the GEMM in flight
        if c is not None and c.key in failing:
            raise RuntimeError(f"injected: {c.key}")
        return start(fn, key, *a, **kw)
    monkeypatch.setattr(probe.builder, "build", watched_build)
    monkeypatch.setattr(probe, "_replayed", watched_replay)
    monkeypatch.setattr(probe, "_own_flags", watched_flags)
    monkeypatch.setattr(probe.timer, "start", failing_start)
    recs = {r["key"]: r for r in probe.run_window(cases)}
    for k in failing:
        assert recs[k]["error"] == f"RuntimeError: injected: {k}", recs[k]
        assert closed.count(k) == 1, (k, closed)
    good = cases[-1].key
    assert not recs[good]["error"] and recs[good]["kernels"], recs[good]
    assert closed.count(good) == 1   # closed once, after the window's profile
    replays = [x for k in failing for x in made[k].keep if hasattr(x, "nbytes") and hasattr(x, "launch")]
    assert replays and all(r._graph is None for r in replays), replays
    lt = made["lt|mm|bf16|NT|16|4096|1024|1"].keep[0]
    assert lt.mm._objs == [], "the lt GEMM's descriptors were not destroyed"
