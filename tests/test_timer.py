"""The timing method (`timing.Timer`) on a CPU, through its public entry point `Timer.time`, with a clock that
simulates one device queue (as torch's benchmark utilities test `blocked_autorange` with a fake timer): the
batching, the differential sample, the retakes when the host falls behind, the re-time of a GEMM whose
estimating call read long, and the estimate queued behind the batches in flight."""
import pytest

from cublaslt_probe.errors import CaptureError
from cublaslt_probe.gpu.timing import (
    ATTEMPTS,
    BATCH_US,
    GAP_US_PER_REP,
    MAX_PER,
    SINGLE_US,
    Timer,
    covering_batch,
    estimate_spin,
    timing_plan,
)


class Event:
    t = None   # when the simulated GPU reached it, µs


class SimDevice:
    """One stream of a device and the host that feeds it, in simulated µs. Work queued at host time h starts at
    max(h, the end of the work before); an event is reached when the work before it has run, and costs the GPU
    `event_us` before the next kernel starts (the boundary the differential sample cancels). Each launch costs
    the host `host_us`, plus `stall_us` at the launches whose index is in `stalls`. `gemm_us(i)`: the i-th GEMM
    call's GPU time."""

    def __init__(self, gemm_us, host_us=5.0, event_us=1.0, stalls=None):
        self.gemm_us = gemm_us if callable(gemm_us) else (lambda i, d=gemm_us: d)
        self.host_us_per_call, self.event_us = host_us, event_us
        self.stalls = stalls or {}
        self.host = 0.0
        self.gpu = 0.0
        self.calls = 0
        self.spins: list[float] = []

    def _queue(self, dur: float) -> None:
        self.gpu = max(self.gpu, self.host) + dur

    # the clock
    def event(self):
        return Event()

    def record(self, ev, stream) -> int:
        self.host += 0.5
        ev.t = max(self.gpu, self.host)
        self.gpu = ev.t + self.event_us
        return 0

    def done(self, ev) -> bool:
        return ev.t <= self.host

    def wait(self, ev) -> None:
        self.host = max(self.host, ev.t)

    def elapsed_us(self, a, b) -> float:
        return b.t - a.t

    def stream(self, handle=None):
        return None

    def host_us(self) -> float:
        return self.host

    def error(self, status, what):
        return CaptureError(f"{what} failed: {status}")

    # the work
    def gemm(self) -> None:
        self.host += self.host_us_per_call + self.stalls.get(self.calls, 0.0)
        self._queue(self.gemm_us(self.calls))
        self.calls += 1

    def spin(self, us: float) -> None:
        self.host += 2.0
        self.spins.append(us)
        self._queue(us)

    def tiny(self) -> None:
        self.host += 2.0
        self._queue(0.5)

    def timer(self, **kw) -> Timer:
        return Timer(self, spin=self.spin, tiny=self.tiny, stream=self.stream, **kw)


def test_a_short_gemm_is_timed_in_batches_and_the_event_cost_cancels():
    dev = SimDevice(10.0, event_us=3.0)
    t = dev.timer().time(dev.gemm, key="torch|mm")
    assert (len(t.samples_us), t.calls_per_rep) == timing_plan(10.0 + 3.0)   # sized by the estimating call
    assert 3 <= t.calls_per_rep <= MAX_PER and t.calls_per_rep * 13.0 >= BATCH_US
    assert t.samples_us == pytest.approx([10.0] * len(t.samples_us))      # (R - F) / (n - 2): no event cost
    assert t.first_us == pytest.approx(10.0 + 3.0)                        # the first call carries the boundary
    assert (t.attempts, t.behind, t.retaken) == (1, 0, None)
    assert t.gap_us / len(t.samples_us) <= t.gap_limit_us and t.gap_limit_us >= GAP_US_PER_REP
    assert t.sized_by == "estimating call" and t.rule == "lead"


def test_a_long_gemm_runs_one_call_per_sample_within_the_budget():
    dev = SimDevice(600.0)
    t = dev.timer(budget_ms=3.0).time(dev.gemm, key="torch|mm")
    assert t.calls_per_rep == 1 and len(t.samples_us) == 5 and t.median_us == pytest.approx(601.0)
    assert dev.timer(budget_ms=3.0).time(dev.gemm, reps=7).samples_us.__len__() == 7   # reps fixes the samples


def test_a_host_slower_than_the_gpu_is_covered_by_the_spin():
    """A 4 µs GEMM whose launch costs the host 40 µs: the spin covers the host's lead, the GPU never reaches a
    batch before it is queued, and the host time per call is learnt for the next GEMM of the key."""
    dev = SimDevice(4.0, host_us=40.0)
    timer = dev.timer()
    t = timer.time(dev.gemm, key="torch|mm")
    assert t.behind == 0 and t.attempts == 1 and t.median_us == pytest.approx(4.0)
    assert timer.host_us["torch|mm"] == pytest.approx(40.0 + 0.5 * (2 + 1 / t.calls_per_rep), rel=0.05)


def test_a_host_stall_while_the_batches_are_queued_is_retaken_behind_a_longer_spin():
    dev = SimDevice(10.0, stalls={8: 3000.0})   # call 0 estimates; the stall hits the first attempt's 2nd batch
    t = dev.timer().time(dev.gemm, key="torch|mm")
    assert t.attempts == 2 and t.retaken["behind"] >= 1 and t.behind == 0
    assert t.median_us == pytest.approx(10.0)
    assert dev.spins[-1] > 2 * t.retaken["enqueue_us"] / 2   # the retake's spin covers the whole enqueue, twice


def test_a_retake_the_host_stalled_through_too_is_retaken_once_more_and_no_more():
    # a stall in each attempt, the retake's longer than its spin (which covers the first attempt's, twice)
    dev = SimDevice(10.0, stalls={8: 3000.0, 35: 30000.0, 60: 300000.0})
    t = dev.timer().time(dev.gemm, key="torch|mm")
    assert t.attempts == ATTEMPTS == 3 and "second" in t.retaken and t.retaken["second"]["behind"] >= 1


def test_a_gemm_whose_estimating_call_read_long_is_timed_again_in_batches():
    """The estimating call read 400 µs (a cold first call) for a 20 µs GEMM: the one-call samples say it is
    short, so it is timed again in batches sized by them."""
    dev = SimDevice(lambda i: 400.0 if i == 0 else 20.0)
    t = dev.timer().time(dev.gemm, key="torch|mm")
    assert t.sized_by == "samples" and t.calls_per_rep >= 3 and t.median_us == pytest.approx(20.0)
    assert t.estimate_us < SINGLE_US / 2


def test_a_retake_runs_the_gemms_setup_first():
    """A GEMM in flight sets its own flags again (`Pending.setup`) before it runs again."""
    dev = SimDevice(10.0, stalls={8: 3000.0})
    timer, ran = dev.timer(), []
    once, host = timer.estimate(dev.gemm, "torch|mm")
    t = timer.end(timer.start(dev.gemm, "torch|mm", once, host, None, setup=lambda: ran.append(dev.calls)))
    assert t.attempts == 2 and len(ran) == 1


def test_an_estimate_behind_the_batches_in_flight_goes_without_its_spin_only_while_they_cover_it():
    dev = SimDevice(10.0)
    timer = dev.timer()
    timer.event_gap_us   # noqa: B018  (calibrated first: its spins are not the estimates')
    once, host = timer.estimate(dev.gemm, "torch|mm")
    p = timer.start(dev.gemm, "torch|mm", once, host, None)
    need = estimate_spin(timer.host_us["torch|mm"])
    assert covering_batch(p.once_us, p.reps, p.per, need) is not None
    spins = len(dev.spins)
    timer.read_estimate(timer.queue_estimate(dev.gemm, "torch|mm", behind=p))
    assert len(dev.spins) == spins   # the batches in flight were its spin
    timer.end(p)                     # the GPU has run them: nothing covers the next estimate
    timer.read_estimate(timer.queue_estimate(dev.gemm, "torch|mm", behind=p))
    assert len(dev.spins) == spins + 1 and dev.spins[-1] == pytest.approx(need)


def test_with_an_l2_flush_each_sample_is_one_call_after_a_flush_and_no_gap_is_calibrated():
    dev = SimDevice(10.0)
    flushes = []
    timer = dev.timer(flush=lambda: flushes.append(dev.calls))
    t = timer.time(dev.gemm, key="torch|mm")
    assert t.calls_per_rep == 1 and t.gap_us is None and t.spin_us is None and t.behind is None
    assert len(flushes) == 1 + len(t.samples_us) and timer._gap is None   # the gap is calibrated when first needed
