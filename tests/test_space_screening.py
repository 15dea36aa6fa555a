"""The space search's batched first samples (`gpu.space.first_samples`) on a CPU, through the simulated device
queue the timer's tests use (tests/test_timer.py's `SimDevice`): each call between its own events behind one
spin that covers the host's enqueue, a call the GPU reached before the host queued it flagged, and the host's
speed learnt for the next batch."""
import pytest
from test_timer import SimDevice

from cublaslt_probe.gpu import space
from cublaslt_probe.gpu.timing import HOST_US_GUESS


def _durations(i):
    return 8.0 + (i % 7)   # distinct kernels: 8 to 14 µs


def test_a_covered_batch_gives_each_call_its_own_time():
    dev = SimDevice(_durations, host_us=5.0, event_us=1.0)
    timer = dev.timer()
    got = space.first_samples(timer, [dev.gemm] * 40)
    assert [b for _, b in got] == [False] * 40
    assert [us for us, _ in got] == pytest.approx([_durations(i) + 1.0 for i in range(40)])  # + the boundary
    assert len(dev.spins) == 1 and dev.spins[0] >= 40 * 1.25 * HOST_US_GUESS
    assert timer.host_us["lt|screen"] == pytest.approx(5.0 + 1.0, rel=0.05)   # the launch and two records


def test_a_host_slower_than_the_guess_is_flagged_then_covered():
    """A host that takes 60 µs a launch (twice the first guess): the GPU overtakes it near the batch's end, those
    samples read long (they hold the launch gap) and are flagged; the next batch is sized by the speed learnt
    and none is flagged."""
    dev = SimDevice(_durations, host_us=60.0, event_us=1.0)
    timer = dev.timer()
    first = space.first_samples(timer, [dev.gemm] * 64)
    flagged = [i for i, (_, b) in enumerate(first) if b]
    assert flagged and flagged[-1] == 63 and flagged == list(range(flagged[0], 64))
    assert all(first[i][0] > _durations(i) + 1.0 + 10 for i in flagged)
    assert all(first[i][0] == pytest.approx(_durations(i) + 1.0) for i in range(flagged[0]))
    again = space.first_samples(timer, [dev.gemm] * 64)
    assert not any(b for _, b in again)


def test_no_call_no_wait():
    dev = SimDevice(_durations)
    assert space.first_samples(dev.timer(), []) == []
