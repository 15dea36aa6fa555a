"""The probe's timing method: how one GEMM's GPU time is measured with events, behind a clock that can be swapped.

`Timer(clock, spin=..., tiny=..., stream=...)` times a zero-argument launch (`Timer.time`, the probe's
`time_gpu`): one estimating call sizes the plan (`timing_plan`); the samples are batches of back-to-back calls
queued behind one GPU spin (`timing_spin`), an event after each batch's first call splitting it so that the
event and kernel-boundary cost cancels (differential timing); the evidence that the spin covered the host's
lead (`Timing.behind`, `Timing.gap_us`) is checked, and a batch that fails it is retaken behind a longer spin
(`enqueue_spin`), ATTEMPTS attempts in all.

The clock is what the timer reads and writes time through: `event()`, `record(ev, stream)` (the driver's
status, 0 on success), `done(ev)`, `wait(ev)`, `elapsed_us(a, b)`, `stream(handle)`, `error(status, what)` and
`host_us()` (the host's clock, µs). On the GPU it is `driver.Clock`; a test gives one that simulates a device
queue, so that retakes, batching and re-times are checked on a CPU through `Timer.time` (as torch's benchmark
utilities test `blocked_autorange` with a fake timer). `spin(us)` queues a GPU spin, `tiny()` a 1-element
kernel (the gap calibration's), `stream()` the clock's handle of the current stream; `flush()` (or None)
zeroes the L2 flush buffer before each sample; `quiet` brackets the enqueueing of timed batches (the prewarm
thread holds its questions then).

The pure rules (`timing_plan`, `timing_spin`, `estimate_spin`, `covering_batch`, `enqueue_spin`) are checked
on their own in tests/test_timing_plan.py.
"""
from __future__ import annotations

import contextlib
import math
import statistics
from dataclasses import dataclass, field

SPIN_FLOOR_US = 20.0             # GPU spin before the timed batches: this, plus SPIN_MARGIN x the host's lead
SPIN_MARGIN = 1.25               # over the GPU (timing_spin; the host time per call is learnt per backend and op
SPIN_SLACK_US = 100.0            # from the last enqueue loop), plus this slack for a host hiccup
BATCH_US = 50.0                  # a timing sample (batch of back-to-back calls) lasts at least this long
MAX_CALLS = 24                   # timed calls per GEMM at most, when batches hold several calls (5 samples at least)
MAX_PER = 5                      # calls per batch at most
SINGLE_US = 200.0                # GEMMs this long run one call per timing sample
GAP_US_PER_REP = 2.0             # GPU idle between batches above this (or above the calibrated event gap plus
GAP_SLACK_US = 0.75              # this, on a GPU whose events cost more): the spin was too short
HOST_US_GUESS = 30.0             # host µs to enqueue one call before the first enqueue loop of a backend and op
LOGGED_HOST_US_GUESS = 120.0     # ... and one logged call before the first of them (`Probe._logged_estimate`)
CHEAP_SPIN = 0.1                 # a spin costing at most this share of the samples' GPU time covers the whole
                                 # enqueue, twice (timing_spin)
ATTEMPTS = 3                     # timing attempts at most: a retake, and another when the host stalled through it
GAP_SAMPLES = 20                 # samples of the gap calibration (`Timer.calibrate_gap`), three runs of them


@dataclass(frozen=True)
class Timing:
    """What `Timer.time` measured: the median µs of one call, the samples behind it, and the evidence
    that the samples bracketed GEMMs (see the module doc)."""

    median_us: float                # median sample: µs of one call
    samples_us: tuple[float, ...]   # every sample, µs per call
    calls_per_rep: int              # back-to-back calls per sample
    first_us: float                 # median time of the first call of a sample (right after an event), µs
    gap_us: float | None            # GPU idle between the samples, µs in all (None with an L2 flush)
    spin_us: float | None           # GPU spin before the samples (None with an L2 flush)
    enqueue_us: float               # host time to enqueue every sample
    attempts: int                   # 2 (3) when the first attempt (and its retake) failed its checks and was retaken
    behind: int | None              # samples the GPU reached before the host had enqueued them (None: flush)
    retaken: dict | None            # the first attempt's evidence when it was retaken (the second's under "second")
    estimate_us: float              # the estimating call (or the samples of a re-time) the plan was sized by
    rule: str = "lead"              # the spin rule of the first attempt
    gap_limit_us: float | None = None   # the GPU idle allowed per sample (None with an L2 flush)
    sized_by: str = "estimating call"   # what `estimate_us` is: "estimating call", "logged call" (the probe's
                                        # `_prepare_stepwise`) or "samples" (a re-time)

    @property
    def min_us(self) -> float:
        return min(self.samples_us)

    def evidence(self) -> dict:
        """The raw record's `timing` field."""
        return {"spin_us": self.spin_us and round(self.spin_us, 1), "enqueue_us": round(self.enqueue_us, 1),
                "attempts": self.attempts, "behind": self.behind, "retaken": self.retaken,
                "estimate_us": round(self.estimate_us, 2), "sized_by": self.sized_by, "rule": self.rule,
                "gap_limit_us": self.gap_limit_us and round(self.gap_limit_us, 3)}


# --- pure rules -------------------------------------------------------------------------------------------------
def timing_plan(once_us: float, *, flush: bool = False, reps: int | None = None, max_reps: int = 20,
                budget_ms: float = 3.0) -> tuple[int, int]:
    """(samples, calls per sample) for a GEMM whose one call took about `once_us` (pure; see `Timer.time`).

    With an L2 flush, or from SINGLE_US up, one call per sample; below, 3 to MAX_PER back-to-back calls, as
    many as make BATCH_US (3 at least: the differential sample needs a first call and two after it). The
    number of samples, unless `reps` fixes it: what `budget_ms` of GPU time allows, at least 5, at most
    `max_reps`, and at most MAX_CALLS calls in all once the batches hold several (5 samples at least)."""
    once_us = max(once_us, 1.0)
    if flush or once_us >= SINGLE_US:
        per = 1
    else:
        per = max(3, min(MAX_PER, math.ceil(BATCH_US / once_us)))
    if reps is None:
        reps = int(min(max_reps, max(5, math.ceil(budget_ms * 1e3 / (once_us * per))), max(5, MAX_CALLS // per)))
    return max(1, reps), per


def estimate_spin(host_us: float, logged_us: float | None = None) -> float:
    """µs of GPU spin before the estimating call, when the host takes `host_us` to enqueue one call (pure): room
    for the call and its two events, three calls' worth, plus SPIN_FLOOR_US. The estimate sizes the plan, and
    a host that has not queued the call when the spin ends makes it read long (docs/decisions.md, "the
    estimating call's spin"). A logged call that is the estimating call (the probe's `_logged_estimate`), whose
    host time is `logged_us` with the logger's lines, gets that once and two calls' worth more: what the logger
    adds is the library writing one line, not a launch that can stall."""
    if logged_us is None:
        return SPIN_FLOOR_US + 3 * host_us
    return SPIN_FLOOR_US + 2 * host_us + max(logged_us, host_us)


def gpu_us_per_call(once_us: float) -> float:
    """The GPU's µs per call of a GEMM whose estimating call took `once_us`, as the spin rules count it (pure):
    half of it. The estimating call reads long now and then; counted as the whole estimate, the spin is
    shorter than the batches need on a host-paced host (docs/decisions.md, "The GPU's time per call in the
    spin rule")."""
    return max(once_us, 1.0) / 2


def covering_batch(once_us: float, reps: int, per: int, need_us: float) -> int | None:
    """The last of `reps` timed batches of `per` calls (of a GEMM whose estimating call took `once_us`) that
    leaves `need_us` of GPU work or more from its start to the plan's end, at `gpu_us_per_call`; None when the
    whole plan is shorter (pure). While that batch has not started, a call queued behind the plan cannot find
    the GPU idle for `need_us`: the batches are its spin."""
    k = reps - math.ceil(need_us / (per * gpu_us_per_call(once_us)))
    return k if k >= 0 else None


def timing_spin(host_us: float, once_us: float, reps: int, per: int, heavy: bool = False) -> float:
    """µs of GPU spin to put before `reps` timed batches of `per` calls of a GEMM whose estimating call took
    `once_us` on the GPU, when the host takes `host_us` to enqueue one call (pure; see `Timer.time`).

    The GPU must not reach a batch before the host has enqueued all of it (the timer checks this on every
    batch). The host finishes batch i at (i + 1) x per x host_us, the GPU reaches it at spin + i x per x g,
    g its time per call (`gpu_us_per_call`: half the estimate). The spin covers the largest lead of the host:
    nearly all of the enqueue time for a GEMM shorter than its launch, only the first batch for a GEMM more
    than twice as long. Times SPIN_MARGIN, plus SPIN_FLOOR_US and SPIN_SLACK_US for a host hiccup.

    Where twice the whole enqueue time (the retake's spin) costs at most CHEAP_SPIN of the samples' GPU time —
    GEMMs of about 1.5 ms or more — the spin is that: the first batch's launch of such a GEMM can take the
    host several times its usual, and a first attempt behind costs a retake of every sample
    (tests/fixtures/probe/long_spin_raw.jsonl).

    A `heavy` GEMM (the probe's `is_heavy`) gets the whole enqueue time at least (`enqueue_spin`): the GPU's
    rest before its batches is part of what it measures (docs/decisions.md, "Heavy GEMMs")."""
    g = gpu_us_per_call(once_us)
    lead = per * host_us + max(0.0, (reps - 1) * per * (host_us - g))
    spin = SPIN_FLOOR_US + SPIN_MARGIN * lead + SPIN_SLACK_US
    whole = 2 * enqueue_spin(host_us, reps, per)
    if whole <= CHEAP_SPIN * reps * per * once_us:
        spin = max(spin, whole)
    if heavy:
        spin = max(spin, enqueue_spin(host_us, reps, per))
    return spin


def enqueue_spin(host_us: float, reps: int, per: int) -> float:
    """µs of GPU spin that covers the host's whole enqueue time (times SPIN_MARGIN, plus SPIN_FLOOR_US): the
    retake's rule (twice this), and the heavy GEMMs' least spin (`timing_spin`)."""
    return SPIN_FLOOR_US + SPIN_MARGIN * reps * per * host_us


# --- events of one plan ---------------------------------------------------------------------------------------
class Events:
    """The events of `reps` timed batches, on `clock`: start and end of each, and a mid event after the first
    call when a batch holds several calls. The timer pools them by plan and records them again: a few hundred
    events at most, kept for the timer's life."""

    def __init__(self, clock, reps: int, split: bool):
        ev = clock.event
        self.clock = clock
        self.starts, self.ends = [ev() for _ in range(reps)], [ev() for _ in range(reps)]
        self.mids = [ev() for _ in range(reps)] if split else None

    def samples(self, per: int) -> tuple[list[float], list[float], list[float]]:
        """(µs of each batch, of its first call, of one call: the sample) once the last batch has ended.
        The sample of a split batch is differential: (the per-1 calls after the mid event) - (the one call
        after the start event) = per-2 calls, the event and kernel-boundary cost cancelling out."""
        us = self.clock.elapsed_us
        if not self.mids:
            totals = [us(a, b) for a, b in zip(self.starts, self.ends)]
            return totals, totals, totals
        firsts = [us(a, m) for a, m in zip(self.starts, self.mids)]
        rests = [us(m, b) for m, b in zip(self.mids, self.ends)]
        times = [max(r - f, 0.0) / (per - 2) for f, r in zip(firsts, rests)]
        return [f + r for f, r in zip(firsts, rests)], firsts, times

    def gap_us(self, totals: list[float]) -> float:
        """GPU idle time between the batches: their whole span minus their own times."""
        return max(0.0, self.clock.elapsed_us(self.starts[0], self.ends[-1]) - sum(totals))


@dataclass
class Pending:
    """One GEMM's timing in flight: its plan, events and the first attempt's evidence (`Timer.start`)."""
    fn: object
    key: str
    reps_asked: int | None
    once_us: float
    reps: int
    per: int
    events: Events
    heavy: bool = False
    spin_us: float | None = None
    rule: str = "lead"
    enqueue_us: float = 0.0
    behind: int = 0
    attempt: int = 1
    setup: object = None   # run before the GEMM runs again (a retake or a re-time): the probe sets its flags, which
                           # in the pipeline the next GEMM's may have replaced by then
    sized_by: str = "estimating call"   # the call whose GPU time `once_us` is (Timing.sized_by)


@dataclass
class Timer:
    """The timing method over `clock` (see the module doc). `reps` and `budget_ms`: the most samples, and the
    GPU time the samples of one GEMM may take (`timing_plan`). `host_us` holds the host µs to enqueue one call
    that the last enqueue loop of each key (backend and op) took: the spin rules size by it."""

    clock: object
    spin: object                    # spin(us): queue a GPU spin of about `us`
    tiny: object                    # tiny(): queue a 1-element kernel (`calibrate_gap`)
    stream: object                  # stream(): the clock's handle of the current stream
    reps: int = 20
    budget_ms: float = 3.0
    flush: object = None            # flush(): zero the L2 flush buffer (None: no flush)
    quiet: object = contextlib.nullcontext   # a context around each enqueue of timed batches
    host_us: dict = field(default_factory=dict)
    _gap: float | None = None
    _event_pool: dict = field(default_factory=dict)   # spent timing events by (reps, split), recorded again
    _pair_pool: list = field(default_factory=list)    # spent estimate event pairs

    # calibration ----------------------------------------------------------------------------------------------
    @property
    def event_gap_us(self) -> float:
        """µs the GPU spends between two timed samples when it never waits for the host (`calibrate_gap`, made
        when first needed)."""
        if self._gap is None:
            self._gap = self.calibrate_gap()
        return self._gap

    @property
    def gap_limit_us(self) -> float:
        """The GPU idle allowed per sample: GAP_US_PER_REP, or the calibrated event gap plus GAP_SLACK_US on a
        GPU whose events cost more."""
        return max(GAP_US_PER_REP, self.event_gap_us + GAP_SLACK_US)

    def calibrate_gap(self, n: int = GAP_SAMPLES) -> float:
        """µs the GPU spends between two timed samples when it never waits for the host: the end event of one
        and the start event of the next, nothing between. Median of three runs of `n` samples of `tiny`,
        queued behind a long spin."""
        clock = self.clock
        events = Events(clock, n, True)
        st, rec = self.stream(), clock.record
        out = []
        for _ in range(3):
            self.spin(5000)
            for i in range(n):
                rec(events.starts[i], st); self.tiny(); rec(events.mids[i], st)  # noqa: E702  the timed sequence
                self.tiny(); rec(events.ends[i], st)  # noqa: E702
            clock.wait(events.ends[-1])
            out.append(events.gap_us([clock.elapsed_us(a, b) for a, b in zip(events.starts, events.ends)]) / n)
        self._event_pool.setdefault((n, True), []).append(events)   # read: a timing plan can record them again
        return statistics.median(out)

    # the public entry point ----------------------------------------------------------------------------------
    def time(self, fn, reps: int | None = None, key: str = "", heavy: bool = False) -> Timing:
        """Time `fn` (a zero-argument GEMM launch): the median µs of one call running back to back, with its
        samples and evidence.

        One estimating call sizes the plan (`timing_plan`). With an L2 flush each sample is one call after a
        flush. Without, each sample is a batch of `calls_per_rep` (n >= 3) back-to-back calls, all batches
        queued behind one GPU spin long enough that the GPU never reaches a batch before the host has
        enqueued all of it (`timing_spin`), so no event brackets the CPU's launch gap. An event after the
        batch's first call splits it in two: F, the first call, and R, the n-1 calls after it; each span
        pays once for its opening event and the kernel boundary after it, so the sample is (R - F) / (n - 2):
        the time per call of a steady back-to-back run, the fixed cost cancelled. The median of F is
        `first_us`. GEMMs of SINGLE_US or more run one call per sample; one whose samples say it is short
        after all (under SINGLE_US / 2: the estimating call read long) is timed again in batches sized by them.

        The host's cost per call is what the last enqueue loop of this `key` took per call; for a GEMM timed
        one call per sample, the larger of that and what its estimating call took. The evidence that the
        spin was long enough: `behind`, the batches the GPU had reached before the host finished enqueueing
        them, and `gap_us`, the GPU's idle time between batches. When either fails (a batch behind, or more
        idle per sample than `gap_limit_us`), the samples are retaken behind a spin of twice the whole enqueue
        time at the host's speed in the attempt that failed (`enqueue_spin`), and the first attempt's evidence
        is kept under `retaken`; once more when the retake fails too, ATTEMPTS in all. `reps` fixes the
        number of samples; by default `budget_ms` sets it, at most the timer's `reps`."""
        return self.end(self.start(fn, key, *self.estimate(fn, key), reps, heavy))

    # the estimating call -------------------------------------------------------------------------------------
    def queue_estimate(self, fn, key: str, logged: bool = False, behind: Pending | None = None) -> tuple:
        """Queue one call of `fn` between two events, after a flush or behind a short spin (`estimate_spin`) —
        or behind `behind`'s batches (a GEMM in flight) when they cover that spin (`covered`); with the host
        µs its launch took. `read_estimate` waits for it. A `logged` call is queued behind the spin even after
        a flush: the host writes its log line before it launches the GEMM. The spin covers the host time per
        call of `key` the last enqueue loop took, and for a `logged` call the last logged call's of `key` as
        well (HOST_US_GUESS, LOGGED_HOST_US_GUESS before the first)."""
        clock = self.clock
        s, e = self._pair_pool.pop() if self._pair_pool else (clock.event(), clock.event())
        if self.flush is not None:
            self.flush()
        if self.flush is None or logged:
            host = self.host_us.get(key, HOST_US_GUESS)
            need = estimate_spin(host, self.host_us.get(f"{key}|logged", LOGGED_HOST_US_GUESS) if logged else None)
            if not self.covered(behind, need):
                self.spin(need)
        st, rec = self.stream(), clock.record
        h = clock.host_us()
        bad = rec(s, st); fn(); bad = rec(e, st) or bad  # noqa: E702
        if bad:
            raise clock.error(bad, "cuEventRecord")
        host_us = clock.host_us() - h
        if logged:
            self.host_us[f"{key}|logged"] = host_us
        return s, e, host_us

    def covered(self, p: Pending | None, need_us: float) -> bool:
        """Does the GPU still have `need_us` of `p`'s batches ahead of it (`covering_batch` not started)?"""
        k = None if p is None else covering_batch(p.once_us, p.reps, p.per, need_us)
        return k is not None and not self.clock.done(p.events.starts[k])

    def read_estimate(self, queued: tuple) -> tuple[float, float]:
        """(GPU µs, host µs) of a queued estimating call, once the GPU has run it."""
        s, e, host_once = queued
        self.clock.wait(e)
        once = max(self.clock.elapsed_us(s, e), 1.0)
        self._pair_pool.append((s, e))   # read: the pair can be recorded again
        return once, host_once

    def estimate(self, fn, key: str) -> tuple[float, float]:
        """(GPU µs, host µs) of one call of `fn` after a flush or behind a short spin."""
        return self.read_estimate(self.queue_estimate(fn, key))

    # the samples ----------------------------------------------------------------------------------------------
    def start(self, fn, key: str, once_us: float, host_once: float | None, reps_asked: int | None,
              heavy: bool = False, setup=None, sized_by: str = "estimating call") -> Pending:
        """Queue the first attempt of the timing plan sized by `once_us`; `end` waits for it and checks it."""
        flush = self.flush is not None
        host = self.host_us.get(key, HOST_US_GUESS)
        reps, per = timing_plan(once_us, flush=flush, reps=reps_asked, max_reps=self.reps, budget_ms=self.budget_ms)
        if per == 1 and host_once is not None:
            # a long GEMM's launch can cost the host several times its backend's usual: its spin, a small part
            # of its time, covers the larger of the two
            host = max(host, host_once)
        pool = self._event_pool.get((reps, per > 1))
        events = pool.pop() if pool else Events(self.clock, reps, per > 1)
        p = Pending(fn, key, reps_asked, once_us, reps, per, events, heavy=heavy, setup=setup, sized_by=sized_by)
        if not flush:
            p.spin_us, p.rule = timing_spin(host, once_us, reps, per, heavy), "heavy" if heavy else "lead"
        self._attempt(p)
        return p

    def _attempt(self, p: Pending) -> None:
        with self.quiet():
            if p.spin_us is not None:
                self.spin(p.spin_us)
            p.enqueue_us, p.behind = self._enqueue(p.fn, p.events, p.reps, p.per)
        if self.flush is None:
            self.host_us[p.key] = p.enqueue_us / (p.reps * p.per)

    def end(self, p: Pending) -> Timing:
        """Wait for the samples of `p` and check their evidence: retaken behind a longer spin when it fails (up
        to ATTEMPTS attempts in all), timed again in batches when they say the GEMM is short after all (see
        `time`)."""
        t = self._collect(p, None)
        retaken = None
        while t.gap_us is not None and (t.gap_us > self.gap_limit_us * p.reps or t.behind) and p.attempt < ATTEMPTS:
            failed = {"spin_us": round(p.spin_us, 1), "enqueue_us": round(p.enqueue_us, 1), "behind": p.behind,
                      "gap_us": round(t.gap_us, 3)}
            if retaken is None:
                retaken = failed
            else:
                retaken["second"] = failed
            # the host's time per call in the attempt that failed (`_attempt` learnt it)
            p.spin_us = 2 * enqueue_spin(self.host_us[p.key], p.reps, p.per)
            p.attempt += 1
            if p.setup is not None:
                p.setup()
            self._attempt(p)
            t = self._collect(p, retaken)
        self._event_pool.setdefault((p.reps, p.per > 1), []).append(p.events)  # read: can be recorded again
        if t.calls_per_rep == 1 and self.flush is None and t.median_us < SINGLE_US / 2:
            # the estimating call read long (a cold first call, or a host stall after the spin): the samples
            # say the GEMM is short, so time it again in batches sized by them, with no second estimate that
            # could read long again
            if p.setup is not None:
                p.setup()
            t = self.end(self.start(p.fn, p.key, t.median_us, None, p.reps_asked, p.heavy, p.setup, "samples"))
        return t

    def _collect(self, p: Pending, retaken: dict | None) -> Timing:
        self.clock.wait(p.events.ends[-1])
        totals, firsts, times = p.events.samples(p.per)
        flush = self.flush is not None
        gap = None if flush else p.events.gap_us(totals)
        return Timing(statistics.median(times), tuple(times), p.per, statistics.median(firsts), gap, p.spin_us,
                      p.enqueue_us, p.attempt, None if flush else p.behind, retaken, p.once_us, p.rule,
                      None if flush else self.gap_limit_us, p.sized_by)

    def _enqueue(self, fn, events: Events, reps: int, per: int) -> tuple[float, int]:
        """Enqueue the timed batches; (host µs it took, batches the GPU had reached before they were queued).
        Events are recorded on the stream named once here, through the clock (the driver's own calls on the
        GPU): torch's `Event` and current-stream lookups cost several times more host time per event."""
        flush, behind, clock = self.flush, 0, self.clock
        rec, done = clock.record, clock.done
        starts, mids, ends = events.starts, events.mids, events.ends
        st = self.stream()
        h = clock.host_us()
        for i in range(reps):
            if flush is not None:
                flush()
            bad = rec(starts[i], st)
            fn()
            if mids:
                bad = rec(mids[i], st) or bad
                for _ in range(per - 1):
                    fn()
            bad = rec(ends[i], st) or bad
            if bad:
                raise clock.error(bad, "cuEventRecord")
            if flush is None and done(starts[i]):
                behind += 1  # the GPU was already in this batch: it may have waited for the host inside it
        return clock.host_us() - h, behind


# --------------------------------------------------------------------------- whole calls and graph replays
# Loops beside `Timer` for what it does not time: a CUDA graph's replay, a whole call of a program's module, a
# program's steps. They read torch's CUDA events (each record and read is cheap next to what they bracket), and
# each says the evidence it gives.

def step_block_us(torch, step, n: int) -> list[float]:
    """n steps back to back, as a training or serving loop runs them, each between two CUDA events on the
    current stream, the host synchronised once after the last: their GPU spans in µs. Evidence: each step's GPU
    time as the program's loop pays it, queued behind the one before. A synchronisation after every step would
    start each step on an idle GPU and time the host's launch latency with it (docs/prove.md has the noise either
    way). The proof's method: `gpu.prove`'s rounds in the live program and `gpu.prove_child`'s in a fresh one."""
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
    for a, b in ev:
        a.record()
        step()
        b.record()
    ev[-1][1].synchronize()
    return [a.elapsed_time(b) * 1e3 for a, b in ev]


def per_call_us(torch, fn, reps: int = 20) -> float:
    """µs per call of `fn`, `reps` calls back to back between two CUDA events on the current stream after one
    untimed call. Evidence: the GPU span of a run of calls as a loop issues them, launches and any idle between
    them included: a cost per call of work too small or too mixed to time one call at a time (a copy, a step)."""
    fn()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) * 1e3 / reps


def replayed_us(torch, fn, stream, calls: int, reps: int) -> float:
    """The median µs per call of `fn` (a zero-argument launch on `stream`, warmed up) replayed from a CUDA graph
    that holds `calls` calls of it: the CUDA-event span of each of `reps` replays divided by `calls`. Evidence: a
    time per call with no launch in it (a graph replay launches once), as a program's graph runs its GEMMs; the
    events bracket the whole replay, so a GEMM's time is the replay's over `calls`, idle between kernels
    included."""
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=stream):
        for _ in range(calls):
            fn()
    try:
        g.replay()
        per = []
        for _ in range(reps):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            g.replay()
            e1.record()
            e1.synchronize()
            per.append(e0.elapsed_time(e1) * 1e3 / calls)
        return round(statistics.median(per), 3)
    finally:
        del g


class CallSpan:
    """The CUDA-event span of one whole call from a synchronised start (`span_us(fn)`): the GPU's time from the
    first event to the last, host launches and host synchronisations inside the call included (the GPU waits
    for them), nothing queued before it. Evidence: what one call of a module costs when nothing else hides its
    launches (the upper bound of its cost inside a step); `rounds` runs several calls in alternating order so
    that a drift of the GPU's clocks falls on all of them alike."""

    def __init__(self, torch):
        self.torch = torch
        self.start = torch.cuda.Event(enable_timing=True)
        self.end = torch.cuda.Event(enable_timing=True)

    def span_us(self, fn) -> float:
        """µs of one call of `fn` (a zero-argument callable), from a synchronised start."""
        self.torch.cuda.synchronize()
        self.start.record()
        fn()
        self.end.record()
        self.end.synchronize()
        return self.start.elapsed_time(self.end) * 1e3

    def rounds(self, make, names: list[str], rounds: int) -> dict[str, list[float]]:
        """`rounds` rounds that time each of `names` once (`make(name)`: the zero-argument call to time, made
        fresh each time), in order, the order reversed every other round: name -> its spans (µs)."""
        out: dict[str, list[float]] = {n: [] for n in names}
        for r in range(rounds):
            for n in (names if r % 2 == 0 else names[::-1]):
                out[n].append(self.span_us(make(n)))
        return out
