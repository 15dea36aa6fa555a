"""The probe's timing plan (how many samples, how many back-to-back calls each) is pure: checked on the CPU,
and against the plans the H200 captures in data/ were measured with."""
from pathlib import Path

import pytest

from cublaslt_probe.analysis import dataset
from cublaslt_probe.gpu.timing import (
    CHEAP_SPIN,
    MAX_CALLS,
    MAX_PER,
    SINGLE_US,
    SPIN_FLOOR_US,
    SPIN_MARGIN,
    SPIN_SLACK_US,
    enqueue_spin,
    timing_plan,
    timing_spin,
)

GRID = [x / 10 for x in range(10, 2000)] + list(range(200, 20000, 7)) + [50_000, 200_000, 2_000_000]


def test_short_gemms_run_in_batches_long_ones_alone():
    for once in GRID:
        reps, per = timing_plan(once)
        if once < SINGLE_US:
            assert 3 <= per <= MAX_PER and per * once >= min(50.0, 3 * once)
            assert 5 <= reps and reps * per <= max(MAX_CALLS, 5 * per)
        else:
            assert per == 1 and 5 <= reps <= 20


def test_a_flush_means_one_call_per_sample_and_reps_can_be_fixed():
    assert timing_plan(8.0, flush=True)[1] == 1
    assert timing_plan(8.0, reps=7) == (7, 5)
    assert timing_plan(5000.0, max_reps=3)[0] == 3


def test_the_retime_of_a_short_gemm_never_falls_back_to_single_calls():
    """time_gpu re-times a GEMM whose estimate read long but whose samples say it is short (under
    SINGLE_US / 2), with its own median as the estimate: that plan always batches."""
    for med in GRID:
        if med < SINGLE_US / 2:
            assert timing_plan(med)[1] >= 3


@pytest.mark.parametrize("name", ["llm", "square", "grid", "regret"])
def test_data_file_every_measurement_followed_a_plan(name):
    """A check of the shipped data files data/h200_*.parquet against `timing_plan`."""
    df = dataset.read_parquet(Path(__file__).resolve().parent.parent / "data" / f"h200_{name}.parquet")
    ok = df[df.error.isna()]
    plans = {timing_plan(x) for x in GRID}
    seen = set(zip(ok.time_reps.astype(int), ok.time_calls_per_rep.astype(int)))
    assert seen <= plans, seen - plans


def test_the_spin_keeps_every_batch_queued_ahead_of_the_gpu():
    """Simulate the enqueue loop: the host finishes batch i at (i + 1) x per x host; the GPU, after the spin,
    reaches it at spin + i x per x g, g its time per call, here half of what the estimating call read (as
    seen on the H200). Every batch must be fully queued first, with SPIN_SLACK_US to spare for a host
    hiccup, and the spin must not exceed covering the whole enqueue time (the previous rule)."""
    for host in (5.0, 12.0, 27.0, 40.0, 80.0):
        for once in GRID:
            if once >= 5 * SINGLE_US:
                continue
            reps, per = timing_plan(once)
            spin = timing_spin(host, once, reps, per)
            for i in range(reps):
                assert spin + i * per * once / 2 - (i + 1) * per * host >= SPIN_SLACK_US, (host, once, i)
            whole = 2 * enqueue_spin(host, reps, per)
            if whole <= CHEAP_SPIN * reps * per * once:   # cheap next to the samples: the retake's spin
                assert spin == max(whole, SPIN_FLOOR_US + SPIN_MARGIN * per * host + SPIN_SLACK_US)
            else:
                assert spin <= SPIN_FLOOR_US + SPIN_MARGIN * reps * per * host + SPIN_SLACK_US


def test_a_gemm_twice_as_long_as_its_launch_needs_a_spin_for_its_first_batch_only():
    assert timing_spin(27.0, 60.0, 8, 3) == timing_spin(27.0, 60.0, 80, 3) == \
        SPIN_FLOOR_US + SPIN_MARGIN * 3 * 27.0 + SPIN_SLACK_US
    # a shorter GEMM: the host falls behind by (host - once / 2) per call
    assert timing_spin(27.0, 6.0, 5, 5) == SPIN_FLOOR_US + SPIN_MARGIN * (5 * 27.0 + 4 * 5 * 24.0) + SPIN_SLACK_US
    assert timing_spin(27.0, 45.0, 8, 3) < timing_spin(27.0, 45.0, 80, 3)


def test_on_a_real_llm_capture_the_cheap_whole_enqueue_spin_covers_every_first_attempt_that_fell_behind():
    """tests/fixtures/probe/long_spin_raw.jsonl: GEMMs of 200 µs or more from a real llm sweep whose first
    attempt ran behind the lead's spin. The host's µs per call that attempt was sized by is read back from its
    spin (for these, the lead is one call: spin = FLOOR + MARGIN x host + SLACK); with it, where twice the
    whole enqueue is cheap next to the samples, the spin now given is longer than the whole enqueue that
    attempt took (the GPU would still have been spinning), and it costs at most CHEAP_SPIN of the samples."""
    import json
    path = Path(__file__).resolve().parent / "fixtures" / "probe" / "long_spin_raw.jsonl"
    recs = [json.loads(line) for line in path.read_text().splitlines()[1:]]
    behind = [r for r in recs if r["timing"]["attempts"] > 1]
    assert len(behind) == 85 and all(r["timing"]["retaken"]["behind"] for r in behind)
    covered, cheap_ones, lead_only = 0, 0, 0
    for r in behind:
        first, reps, once = r["timing"]["retaken"], r["time_us_reps"], r["timing"]["estimate_us"]
        host = (first["spin_us"] - SPIN_FLOOR_US - SPIN_SLACK_US) / SPIN_MARGIN
        assert once / 2 >= host > 0   # so the lead was one call, and `host` is what that spin was sized by
        spin = timing_spin(host, once, reps, 1)
        if spin > first["spin_us"] + 0.2:
            cheap_ones += 1
            assert spin <= CHEAP_SPIN * reps * once + 1e-6
            covered += spin >= first["enqueue_us"]
        else:
            lead_only += 1
    assert cheap_ones == 71 and covered == cheap_ones, (cheap_ones, covered)   # 14 shorter ones keep the lead
    # the GEMMs of 5 ms or more all get it: they are where a retake costs most
    assert all(timing_spin((r["timing"]["retaken"]["spin_us"] - SPIN_FLOOR_US - SPIN_SLACK_US) / SPIN_MARGIN,
                           r["timing"]["estimate_us"], r["time_us_reps"], 1) >= r["timing"]["retaken"]["enqueue_us"]
               for r in behind if r["time_us"] >= 5000)


@pytest.mark.parametrize("name", ["h200_llm", "h200_square", "h200_grid"])
def test_heavy_us_is_arithmetic_no_real_gemm_outran(name):
    """`heavy_us` (a GEMM's arithmetic at the H100/H200 SXM peaks) is never more than what the H200 measured:
    the peaks are peaks, so a GEMM called heavy really kept the tensor cores busy that long."""
    from cublaslt_probe.cases import Case
    from cublaslt_probe.gpu.probe import heavy_us
    df = dataset.read_parquet(Path(__file__).parent.parent / "data" / f"{name}.parquet")
    df = df[df.time_us.notna()]
    assert len(df) > 300
    worst = max(heavy_us(Case(r.backend, r.op, r.dtype, r.layout, r.m, r.n, r.k, r.batch)) / r.time_us
                for r in df.itertuples())
    assert 0.5 < worst < 1.0, worst


def test_the_pipeline_runs_every_decode_gemm_and_heavy_ones_run_one_step_after_another():
    """Decode GEMMs (the host-bound ones the pipeline is for) are all light; the quick preset's 4096^3 bf16
    and fp32 127x4095x8191, which the GPU ran 5-10 % slower queued behind other GEMMs, are heavy."""
    from cublaslt_probe import sweep
    from cublaslt_probe.cases import Case
    from cublaslt_probe.gpu.probe import HEAVY_US, heavy_us, is_heavy
    assert max(heavy_us(c) for c in sweep.plan("decode").cases) < HEAVY_US
    assert not any(is_heavy(c) for c in sweep.plan("decode").cases)
    assert heavy_us(Case("torch", "mm", "bf16", "NN", 4096, 4096, 4096)) >= HEAVY_US
    assert heavy_us(Case("lt", "mm", "fp32", "NN", 127, 4095, 8191)) >= HEAVY_US
    assert heavy_us(Case("torch", "mm", "tf32", "NN", 127, 4095, 8191)) < HEAVY_US
    assert is_heavy(Case("torch", "mm", "bf16", "NN", 4096, 4096, 4096))
    assert not is_heavy(Case("torch", "mm", "tf32", "NN", 127, 4095, 8191))


def test_a_heavy_gemm_rests_the_gpu_for_the_whole_enqueue_at_least():
    """The 4096^3 bf16 GEMM of the quick preset (about 175 µs, 6 batches of 3): the lead's spin is shorter than
    the whole enqueue's; heavy, it gets the whole enqueue's. A spin that was already longer is kept."""
    from cublaslt_probe.gpu.timing import enqueue_spin
    host, once, reps, per = 27.0, 175.0, 6, 3
    lead = timing_spin(host, once, reps, per)
    assert lead < enqueue_spin(host, reps, per) == timing_spin(host, once, reps, per, heavy=True)
    long_ = timing_spin(30.0, 2000.0, 5, 1)   # cheap: twice the whole enqueue already
    assert timing_spin(30.0, 2000.0, 5, 1, heavy=True) == long_ == 2 * enqueue_spin(30.0, 5, 1)


def test_the_estimating_call_is_queued_before_its_spin_ends():
    """The spin before the estimating call leaves the host three calls' worth of time to queue the call and its
    two events (`estimate_spin`): with two, the quick preset's plans changed between runs two to five times as
    often."""
    from cublaslt_probe.gpu.timing import estimate_spin
    for host in (5.0, 25.0, 47.0, 160.0):
        assert estimate_spin(host) == SPIN_FLOOR_US + 3 * host
    assert estimate_spin(30.0) > SPIN_FLOOR_US + 2 * 30.0 + 25.0


def test_a_logged_estimating_call_is_queued_before_its_spin_ends():
    """A logged call that is the estimating call (`logged_estimate`) gets its own host time, the logger's line
    included, and two calls' worth more: more than a plain call's spin, less than three logged calls' worth."""
    from cublaslt_probe.gpu.timing import estimate_spin
    for host, logged in ((35.0, 116.0), (21.0, 66.0), (71.0, 164.0)):
        spin = estimate_spin(host, logged)
        assert spin == SPIN_FLOOR_US + 2 * host + logged
        assert estimate_spin(host) < spin < estimate_spin(logged)
    assert estimate_spin(40.0, 10.0) == estimate_spin(40.0)   # never less than a plain call's


def test_an_estimate_behind_the_batches_in_flight_starts_from_the_last_batch_that_covers_its_spin():
    """`covering_batch`: the latest of the in-flight plan's batches from whose start the GPU still has the
    estimating call's spin worth of work (at half the estimate per call, `timing_spin`'s rule); None when the
    whole plan is shorter, and the estimating call then gets its spin."""
    from cublaslt_probe.gpu.timing import covering_batch, estimate_spin
    for once in GRID[::7]:
        reps, per = timing_plan(once)
        for host in (4.0, 22.0, 35.0, 160.0):
            need = estimate_spin(host)
            k = covering_batch(once, reps, per, need)
            left = (lambda i, reps=reps, per=per, once=once: (reps - i) * per * max(once, 1.0) / 2)
            if left(0) < need:
                assert k is None, (once, reps, per, host)
            else:
                assert 0 <= k < reps and left(k) >= need and (k == reps - 1 or left(k + 1) < need), \
                    (once, reps, per, host, k)
    # decode's usual plan: 8 batches of 3 calls of a 20 µs GEMM cover a 86 µs spin from the sixth on
    assert covering_batch(20.0, 8, 3, estimate_spin(22.0)) == 5
    assert covering_batch(3.0, 5, 5, estimate_spin(22.0)) is None
