"""GPU probe: run GEMMs and capture, per GEMM, the cuBLASLt log lines, the launched kernels, GPU time and
the heuristic's CPU cost. torch/cupy are imported inside functions so that `import cublaslt_probe.gpu.probe` works
on a CPU machine.

How each capture is made (the evidence, not a guess):
- log lines: the logger API of the libcublasLt instance torch loaded (`lt.Logger`), level 2 for exactly one
  call of the GEMM after warm-up; one process for the whole sweep.
- kernel names: CUPTI's activity API (`cupti.Activity`) over a *window* of many GEMMs; before each GEMM a 1-element int8
  `fill_` marker kernel is launched on the same stream, so the kernel stream splits into one group per GEMM
  (`profile_kernels`).
- GPU time: the timing method of `timing.py` (`Timer`, over the driver's events: `driver.Clock`): the median
  of samples of back-to-back calls queued behind a GPU spin, with the evidence that the spin covered the
  host's lead; `Probe.time_gpu` returns its `Timing`.
- heuristic CPU cost: `cublasLtMatmulAlgoGetHeuristic` for the same column-major problem with the
  backend's workspace limit, timed with the library's heuristics cache off (miss) and on (hit).

The public interface: `Probe(ProbeOptions(...))` with `run_window(cases)` (one raw record per Case, a
`raw_record.RawRecord` filled phase by phase and returned in its saved form), `time_gpu(fn)`, `profile(fns)`,
`lt_gemm(problem)` and `startup` (the start-up phases, each with its time). This module is the window
scheduler; the rest of the probe has a module each: `operands` (building a GEMM's call), `kernel_capture`,
`heuristic_helpers` (the companion process and the prewarm thread), `host` (environment, CPU topology) and
`alternatives` (heuristic candidates, a grouped GEMM's alternatives).
"""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import logging
import os
import sys
import time
from dataclasses import dataclass

from cublaslt_probe.analysis.evidence import heuristic_workspace
from cublaslt_probe.cases import Case, invalid_reason
from cublaslt_probe.errors import CaptureError, OptionError, error_text
from cublaslt_probe.gpu.heuristic_helpers import (
    HeuristicCompanion,
    HeuristicPrewarm,
    heuristic_groups,
    prewarm_problem,
)
from cublaslt_probe.gpu.host import cpu_cores, environment, gpu_local_cpus, require_gpu
from cublaslt_probe.gpu.kernel_capture import profile_kernels
from cublaslt_probe.gpu.operands import Builder, Built, LtGemm, current_stream, lt_problem
from cublaslt_probe.gpu.timing import Pending, Timer, Timing
from cublaslt_probe.raw_record import RawRecord
from cublaslt_probe.vocab import PEAKS

log = logging.getLogger(__name__)

HEAVY_US = 50.0                  # pipeline: a GEMM whose arithmetic takes this long at the H100/H200 SXM's
                                 # dense peak (`heavy_us`) runs one step after another
WARM_CALLS = 1                   # calls before the logged call: the first loads the kernel's module and asks the
                                 # heuristic (answered ahead by the prewarm thread when it runs); the logged call,
                                 # which is the estimating call too for a GEMM run one step after another, follows
HELPERS_FROM_GEMMS = 500         # a pipelined plan of this many GEMMs or more starts the heuristic companion and the
                                 # prewarm thread, and pays every type's set-up and CUPTI's start up front
                                 # (`uses_helpers`; docs/decisions.md, "what a probe sets up")


def uses_helpers(options: "ProbeOptions") -> bool:
    """Does a probe with `options` start the heuristic companion and the prewarm thread (and pay every type's
    set-up and CUPTI's start up front)? With the pipeline, when its plan is unknown (a sweep's caller may
    give none) or HELPERS_FROM_GEMMS GEMMs or more: a shorter plan ends before the helpers pay back what they
    cost (docs/decisions.md, "What a probe sets up")."""
    return options.pipeline and (options.plan is None or options.plan >= HELPERS_FROM_GEMMS)


# --- options and results --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ProbeOptions:
    """How the probe measures. Checked when made; a bad value raises `OptionError` naming it."""

    reps: int = 20                  # most timing samples per GEMM (the budget sets fewer for long GEMMs)
    flush_l2: bool = False          # flush L2 (zero 256 MB) before each sample; one call per sample then
    heuristic_reps: int = 5         # heuristic calls timed per problem with the cache off, and again on
    budget_ms: float = 3.0          # GPU time the timing samples of one GEMM may take
    mem_budget: int = 24 << 30      # bytes of operands a window keeps alive before it is cut
    candidates: int = 0             # lt backend: also run the heuristic's top N candidates (0: none)
    candidate_reps: int = 5         # timing samples per candidate
    pipeline: bool = True           # prepare each GEMM while the GPU times the one before (False: one step after
                                    # another); with a large plan the heuristic is timed in a companion process
    cpu_slot: int | None = None     # pin the probe, its companion and its prewarm thread to three physical cores
                                    # of their own, the slot-th three (one slot per probe process on a host); None:
                                    # no pinning
    plan: int | None = None         # GEMMs the caller will time, when it knows (None: unknown, as large as a
                                    # sweep); a plan under HELPERS_FROM_GEMMS starts no helper (`uses_helpers`)

    def __post_init__(self):
        ints = {"reps": 1, "heuristic_reps": 1, "mem_budget": 1, "candidates": 0, "candidate_reps": 1, "cpu_slot": 0,
                "plan": 0}
        for name, least in ints.items():
            v = getattr(self, name)
            if name in ("cpu_slot", "plan") and v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, int) or v < least:
                raise OptionError(f"probe option {name}={v!r}: expected an integer >= {least}")
        if isinstance(self.budget_ms, bool) or not isinstance(self.budget_ms, (int, float)) or not self.budget_ms > 0:
            raise OptionError(f"probe option budget_ms={self.budget_ms!r}: expected a number of ms > 0")
        for name in (f.name for f in dataclasses.fields(self) if f.type in ("bool", bool)):   # every switch
            if not isinstance(getattr(self, name), bool):
                raise OptionError(f"probe option {name}={getattr(self, name)!r}: expected True or False")


# --- filling a raw record, one function per phase (the record starts as `RawRecord.of_case`) ------------------
# The logged call's lines are one field, set where the call is made (`_prepare`, `_prepare_stepwise`).
def _fill_config(rec: RawRecord, b: Built) -> None:
    """The config of the algo the built call runs and its waves (lt backend; None on the others)."""
    rec.lt_config, rec.lt_waves = b.lt_config, b.lt_waves


def _fill_timing(rec: RawRecord, t: Timing, b: Built) -> None:
    """The timing (`Timing`: median, samples, calls per sample, first call, GPU gap) and its evidence, with how
    the timed calls were launched (`Built.launch`) and why not replayed when refused."""
    rec.time_us = t.median_us
    rec.time_us_reps = len(t.samples_us)
    rec.time_us_min = t.min_us
    rec.time_gap_us = None if t.gap_us is None else round(t.gap_us, 3)
    rec.time_calls_per_rep = t.calls_per_rep
    rec.time_us_first = t.first_us
    rec.timing = t.evidence()
    rec.timing["launch"] = b.launch   # "replay": the library's launches replayed
    if b.replay_refused:
        rec.timing["replay_refused"] = b.replay_refused   # why this GEMM's calls are the library's own


def _fill_kernels(rec: RawRecord, kernels: list[tuple[str, float]], share_ms: float) -> None:
    """The kernels the GEMM launched, as (name, µs), and its share of the window's kernel capture."""
    rec.kernels = [n for n, _ in kernels]
    rec.kernel_us = [d for _, d in kernels]
    rec.probe_ms["profile_share"] = round(share_ms, 3)


def _fill_heuristic(rec: RawRecord, miss, hit, error, shared: int, where: str) -> None:
    """The heuristic's host time with the cache off (miss) and on (hit), µs; the records sharing the
    measurement; where it was made ("probe" or "companion"); the library's error, when it refused."""
    rec.heuristic_miss_us, rec.heuristic_hit_us = miss, hit
    rec.heuristic_shared = shared
    rec.heuristic_where = where
    if error:
        rec.heuristic_error = error


GROUPED_REPLAY = ("torch's grouped GEMM takes its prepare kernel's argument buffer (the groups' pointers and sizes) "
                  "from the caching allocator in each call, so replayed launches would use a buffer freed after "
                  "the capture (a replay stopped on the prepare kernel's device-side assertion); the fp16 one is "
                  "the fallback, one cuBLAS GEMM per group after reading the offsets on the host")


def heavy_us(c: Case) -> float:
    """µs the arithmetic of `c` (2·m·n·k·batch) takes at the dense peak of its dtype on an H100/H200 SXM
    (`vocab.PEAKS`), whatever the GPU: a measure of how hard the GEMM drives the tensor cores, not a
    prediction of its time (pure)."""
    rates = PEAKS["H100 SXM"].tflops
    return 2.0 * c.m * c.n * c.k * c.batch / rates.get(c.dtype, rates["fp8"]) / 1e6


def is_heavy(c: Case) -> bool:
    """Does `c` drive the tensor cores hard enough (`heavy_us` >= HEAVY_US) to run one step after another in the
    pipeline, behind the whole enqueue's spin (`timing_spin`)?"""
    return heavy_us(c) >= HEAVY_US


def _nbytes(objs) -> int:
    """Bytes of the operands `objs` (a window's memory budget counts them, and the outputs replays keep). A
    view of the builder's operand pool counts its own size, as the fresh tensor it replaced did: the budget
    cuts windows where it did before (the test of a cut relies on it), though the views hold no memory of
    their own."""
    n = 0
    for o in objs:
        if hasattr(o, "element_size") and hasattr(o, "numel"):
            n += o.element_size() * o.numel()
        elif hasattr(o, "nbytes"):
            n += int(o.nbytes)
    return n


def _lap(ph: dict, name: str, t0: float) -> float:
    t = time.perf_counter()
    ph[name] = round((t - t0) * 1e3, 3)
    return t


# --- the probe ------------------------------------------------------------------------------------------------
class StartUp:
    """The probe's start-up phases, each with its seconds, in the order they were paid: those of `Probe()`
    itself, then those paid when first needed (a dtype's operand pool, the spin and gap calibrations, the
    first kernel capture), named so. `table()` renders them."""

    def __init__(self):
        self.phases: list[tuple[str, float]] = []
        self.started = 0                  # phases paid by `Probe()` itself (those after: paid on first use)

    @contextlib.contextmanager
    def __call__(self, name: str):
        t = time.perf_counter()
        try:
            yield
        finally:
            self.phases.append((name, time.perf_counter() - t))

    def seconds(self) -> dict[str, float]:
        """{phase: seconds} (a phase paid twice is summed)."""
        out: dict[str, float] = {}
        for name, s in self.phases:
            out[name] = out.get(name, 0.0) + s
        return out

    def table(self) -> str:
        return "\n".join(f"{name:48s} {s * 1e3:9.1f} ms" for name, s in self.seconds().items())

    def mark_started(self) -> None:
        """`Probe()` has returned: the phases paid from now on are paid on first use, inside the work."""
        self.started = len(self.phases)

    def on_first_use(self) -> dict[str, float]:
        """{phase: seconds} of the phases paid after `Probe()` returned (inside the windows that needed them)."""
        out: dict[str, float] = {}
        for name, s in self.phases[self.started:]:
            out[name] = out.get(name, 0.0) + s
        return out


@dataclass
class InFlight:
    """Pipeline: the GEMM whose timed batches the GPU is running while the host prepares the next (`_drain`
    waits for it): its raw record, Case, built call, pending timing and phase times."""
    rec: RawRecord
    case: Case
    built: Built
    pending: Pending
    phases: dict


class Probe:
    """Runs windows of Cases and returns one raw record per Case, in its saved form (`RawRecord.to_dict`).
    One per process.

    `Probe(ProbeOptions(reps=10))`, or the options as keywords: `Probe(reps=10)`.

    It sets up only what its work uses: the heuristic companion, the prewarm thread, every type's cuBLASLt
    set-up and the first kernel capture are paid in the start-up of a probe whose plan (`ProbeOptions.plan`)
    is large enough to win them back (`uses_helpers`); a probe for a few GEMMs pays each type's set-up with its
    first GEMM of that type, CUPTI's start with the first kernel capture, the operand pool of a dtype
    with its first GEMM of that dtype, and calibrates the GPU spin and the event gap when its timing first
    needs them. `startup` records each phase with its time."""

    def __init__(self, options: ProbeOptions | None = None, **kwargs):
        if options is not None and kwargs:
            raise OptionError(f"give the probe options either as ProbeOptions or as keywords, not both ({kwargs})")
        self.options = options if options is not None else ProbeOptions(**kwargs)
        self.startup = phase = StartUp()
        torch = require_gpu("sweep")
        self.torch = torch
        with phase("CUDA device"):
            self.device = torch.cuda.current_device()   # the probe's GPU: its streams and events are this one's
            props = torch.cuda.get_device_properties(self.device)
        helpers = uses_helpers(self.options)
        cores = None if self.options.cpu_slot is None else cpu_cores(self.options.cpu_slot,
                                                                      local=gpu_local_cpus(props))
        self._companion = None
        self.cpus = cores   # (the probe's CPU, its companion's, its prewarm thread's), or None when not pinned
        self.host_cpus = os.sched_getaffinity(0)   # before pinning: the CPUs a helper process may use
        self._inflight: InFlight | None = None
        self._prewarm: HeuristicPrewarm | None = None
        self._cycles_per_us: float | None = None
        self._profiled = False
        self._set_up: set[str] = set()   # dtypes whose cuBLASLt set-up this process has paid (`_library_set_up`)
        self._start_set_up(phase, helpers)
        self._start_timer(phase)
        self._finish_start(phase, helpers, props, cores)
        phase.mark_started()

    def _start_set_up(self, phase: StartUp, helpers: bool) -> None:
        """cuBLASLt loaded, the driver's events and graphs, the library, its logger, the environment, the builder;
        with the helpers, every type's set-up asked on a thread of its own (`_library_setup`)."""
        from cublaslt_probe.gpu import driver, lt
        with phase("cuBLAS/cuBLASLt loaded"):
            lt.ensure_loaded()
        if helpers:   # started first: it loads the same cuBLASLt on another core while this process gets ready
            with phase("heuristic companion started"):
                found = lt.loaded_libraries()
                self._companion = HeuristicCompanion(self.cpus and self.cpus[1], found[0] if found else None)
        with phase("driver events and graphs"):
            self.clock = driver.Clock()   # the timing events (torch has run CUDA work: the driver is loaded)
            self.graphs = driver.Graphs(self.clock)
            self._own_stream = self.torch.cuda.Stream(self.device)   # the windows' stream (capturable: `_replayed`)
        with phase("cuBLASLt library and logger"):
            self.lib = lt.LtLibrary()
            self.logger = lt.Logger(self.lib)
        with phase("environment"):
            self.env = environment(self.lib)
        self.builder = Builder(self.lib, startup=phase)
        self._setup_thread = self._library_setup() if helpers else None

    def _start_timer(self, phase: StartUp) -> None:
        """The timing method (`timing.Timer`) over the driver's clock, with the marker and, with `flush_l2`, the
        flush buffer."""
        torch = self.torch
        with phase("marker and flush buffer"):
            self.marker = torch.zeros(1, dtype=torch.int8, device="cuda")
            flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda") if self.options.flush_l2 else None
        self.flush = flush
        self.timer = Timer(self.clock, spin=self.spin, tiny=lambda: self.marker.fill_(1), stream=self._stream,
                           reps=self.options.reps, budget_ms=self.options.budget_ms,
                           flush=None if flush is None else flush.zero_, quiet=self._quiet)

    def _finish_start(self, phase: StartUp, helpers: bool, props, cores) -> None:
        """With the helpers: the calibrations, the first kernel capture, the set-ups joined, the prewarm thread
        started (all start-up, not the first window's); the companion is not waited for (`_companion_ready`).
        Then the pinning."""
        if helpers:
            self._calibrate()
            self.profile([lambda: None])   # CUPTI's start, once
            with phase("cuBLASLt set-ups joined"):
                self._setup_thread.join()
            self._prewarm_sms = props.multi_processor_count
            self._prewarm = HeuristicPrewarm(self._ask_library, cores and cores[2])
        if cores:
            # this thread only, once the CUDA, CUPTI and torch threads exist (they keep every core: pinned
            # earlier, they would inherit this one and compete with the thread that launches the GEMMs)
            os.sched_setaffinity(0, {cores[0]})

    def close(self) -> None:
        """Stop the heuristic companion and the prewarm thread (the probe can still run windows: it then
        measures the heuristic in-process, and the first calls ask their questions themselves)."""
        if self._companion is not None:
            self._companion.close()
            self._companion = None
        if self._prewarm is not None:
            self._prewarm.close()
            self._prewarm = None

    def _library_setup(self):
        """cuBLASLt's one-time set-ups (`lt.set_up`: one per type), which the process's first heuristic question
        of each type pays whichever path asks it, asked on a thread of its own while this one calibrates:
        start-up, not the first GEMMs' build and warm-up (docs/decisions.md, "The library's set-ups"). Returns
        the started thread."""
        import threading

        from cublaslt_probe.gpu import lt
        self._set_up.update(lt.DTYPE_SPEC)
        t = threading.Thread(target=lt.set_up, args=(self.lib,), name="cublaslt-setup", daemon=True)
        t.start()
        return t

    def _ask_library(self, p) -> None:
        """The prewarm thread's question: `p` asked of this process's cuBLASLt (its answer is cached there)."""
        from cublaslt_probe.gpu import lt
        with lt.LtMatmul(self.lib, p) as mm:
            mm.heuristic(1)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # GPU spin and calibration -------------------------------------------------------------------------------
    def _calibrate(self) -> None:
        """The spin's rate and, without an L2 flush, the event gap (each a phase of `startup`)."""
        self.spin(1)
        if self.flush is None:
            self.event_gap_us   # noqa: B018  (made when first read)

    @property
    def cycles_per_us(self) -> float:
        """GPU spin cycles per µs (torch.cuda._sleep counts SM clock cycles), measured with events when first
        needed."""
        if self._cycles_per_us is None:
            with self.startup("spin calibration (first needed)"):
                self._cycles_per_us = self._calibrate_spin()
        return self._cycles_per_us

    def _calibrate_spin(self) -> float:
        torch, clock = self.torch, self.clock
        rate = 1e3
        s, e = clock.event(), clock.event()
        for _ in range(2):  # the first run warms the spin kernel up
            st = self._stream()
            clock.record(s, st); torch.cuda._sleep(400_000); clock.record(e, st)  # noqa: E702  the timed sequence
            clock.wait(e)
            rate = 400_000 / max(clock.elapsed_us(s, e), 1.0)
        self.clock.destroy(s)
        self.clock.destroy(e)
        return rate

    @property
    def event_gap_us(self) -> float:
        """µs the GPU spends between two timed samples when it never waits for the host (`Timer.calibrate_gap`): it
        differs from host to host, so it is measured, not assumed."""
        if self.timer._gap is None:
            with self.startup("gap calibration (first needed)"):
                return self.timer.event_gap_us
        return self.timer.event_gap_us

    @property
    def gap_limit_us(self) -> float:
        self.event_gap_us   # noqa: B018  (calibrated, and its phase recorded, when first read)
        return self.timer.gap_limit_us

    def _stream(self):
        """The driver handle of torch's current stream on the probe's GPU, as `clock.record` takes it."""
        return self.clock.stream(current_stream(self.torch, self.device))

    def spin(self, us: float) -> None:
        """Keep the GPU busy for about `us` µs (queued on the current stream)."""
        self.torch.cuda._sleep(int(max(us, 1.0) * self.cycles_per_us))

    @contextlib.contextmanager
    def _quiet(self):
        """Around the enqueueing of timed batches: the prewarm thread starts no question (HeuristicPrewarm.hold)."""
        prewarm = self._prewarm
        if prewarm is None:
            yield
            return
        prewarm.hold()
        try:
            yield
        finally:
            prewarm.release()

    # timing -----------------------------------------------------------------------------------------------
    def time_gpu(self, fn, reps: int | None = None, key: str = "", heavy: bool = False) -> Timing:
        """Time `fn` (a zero-argument GEMM launch) by the timing method (`timing.Timer.time`): the median µs of
        one call running back to back, with its samples and evidence. `key` names whose host time per call
        the spin rule learns (backend and op); `reps` fixes the number of samples."""
        if self.flush is None:
            self.event_gap_us   # noqa: B018  (the gap calibration's phase recorded under its name)
        return self.timer.time(fn, reps, key, heavy)

    def _logged_estimate(self, fn, key: str) -> tuple[list[str], tuple[float, float]]:
        """One call of `fn` that is both the logged call (`logged_call`) and the estimating call: (its log lines,
        (GPU µs, host µs)). Its spin covers a logged call's host time, the logger's lines included
        (`Timer.queue_estimate`), so that its events bracket the GEMM, not the host writing the log."""
        self.logger.take()
        self.logger.set_level(2)
        try:
            queued = self.timer.queue_estimate(fn, key, logged=True)
        finally:
            self.logger.set_level(0)
        est = self.timer.read_estimate(queued)
        return self.lt_lines(self.logger.take()), est

    def _own_flags(self, c: Case):
        """What runs before a GEMM in flight runs again (a retake, or timed again in batches): its own flags,
        which the pipeline has replaced with the next GEMM's by the time it checks the samples (`_drain`)."""
        return lambda: self.builder.set_flags(c)

    # heuristic cost -----------------------------------------------------------------------------------------
    @staticmethod
    def heuristic_workspace(c: Case) -> int:
        """The workspace limit the backend's own heuristic query uses for this GEMM."""
        return heuristic_workspace(c.backend, c.op, c.n, c.k)

    def time_heuristics(self, items: list[tuple[RawRecord, Case]]) -> None:
        """Fill heuristic_miss_us / heuristic_hit_us of each record: `cublasLtMatmulAlgoGetHeuristic` for
        the Case's column-major problem with its backend's workspace limit, cache off then on
        (lt.measure_heuristics), with one cache switch for the whole window (a switch per GEMM costs more
        than the GPU's work it would hide). With a companion ready as the window began, the measurements are
        asked of it as the window runs (`HeuristicCompanion`); this collects them.

        Cases whose backends ask cuBLASLt the same question (same problem and workspace limit, e.g.
        `torch`, `cupy` and `lt` of one GEMM) share one measurement: the call is identical."""
        from cublaslt_probe.gpu import lt
        if not items:
            return
        t = time.perf_counter()
        groups, problems = heuristic_groups(items, self.heuristic_workspace)
        keys = list(problems)
        where = "probe"
        results = None
        if self._companion is not None and all(k in self._companion.asked for k in keys):
            try:
                results = self._companion.collect(keys)
                where = "companion"
            except CaptureError as e:
                self._drop_companion(e)
        if results is None:
            results = lt.measure_heuristics(self.lib, [problems[k] for k in keys], self.options.heuristic_reps)
        for key, (miss, hit, err, *_) in zip(keys, results):
            for rec in groups[key]:
                _fill_heuristic(rec, miss, hit, err, len(groups[key]), where)
        share = round((time.perf_counter() - t) * 1e3 / len(items), 3)
        for rec, _ in items:
            if rec.probe_ms is None:
                rec.probe_ms = {}
            rec.probe_ms["heuristic_share"] = share

    def _companion_ready(self) -> bool:
        """Has the probe a companion ready to be asked this window's questions? The probe never waits for it:
        the windows before it is ready measure their heuristic in this process (`time_heuristics`)."""
        if self._companion is None:
            return False
        try:
            return self._companion.poll_ready()
        except CaptureError as e:
            self._drop_companion(e)
            return False

    def _ask_heuristic(self, c: Case) -> None:
        """Pipeline: ask the companion for Case `c`'s heuristic measurement now (once per question and window)."""
        if self._companion is None:
            return
        p = lt_problem(c, self.heuristic_workspace(c))
        try:
            self._companion.ask(p.key(), p, self.options.heuristic_reps)
        except CaptureError as e:
            self._drop_companion(e)

    def _drop_companion(self, why: CaptureError) -> None:
        """The companion failed: say why, stop it, and measure the heuristic in this process from now on."""
        log.warning("%s; measuring the heuristic in the probe's process from now on", why)
        if self._companion is not None:
            self._companion.close()
            self._companion = None

    # kernels, log lines, direct cuBLASLt calls ------------------------------------------------------------
    def profile(self, calls) -> list[list[tuple[str, float]]]:
        """The kernels each call launched, in launch order, as (name, µs) (`profile_kernels`). The first session
        of the process also pays CUPTI's start: a phase of its own in `startup`."""
        if self._profiled:
            return profile_kernels(self.torch, calls, self.marker)
        with self.startup("CUPTI started (first kernel capture)"):
            profile_kernels(self.torch, [lambda: None], self.marker)
        self._profiled = True
        return profile_kernels(self.torch, calls, self.marker)

    def logged_call(self, fn, sync: bool = True) -> list[str]:
        """Run `fn` once with the cuBLASLt logger at level 2; the log lines of that call (written by the
        library as the call is made on the host: `sync=False` does not wait for the GPU)."""
        self.logger.take()
        self.logger.set_level(2)
        try:
            fn()
            if sync:
                self.torch.cuda.synchronize()
        finally:
            self.logger.set_level(0)
        return self.lt_lines(self.logger.take())

    @staticmethod
    def lt_lines(recs) -> list[str]:
        from cublaslt_probe.gpu.lt import Logger
        return Logger.render(recs)

    def lt_gemm(self, p, *, out_of_place: bool = False) -> LtGemm:
        """A direct cuBLASLt call of Problem `p` on this process's library (`LtGemm`)."""
        return LtGemm(self.torch, self.lib, p, out_of_place=out_of_place)

    # one window --------------------------------------------------------------------------------------------
    def run_window(self, cases: list[Case]) -> list[dict]:
        """One raw record per Case (`_run_window`) in its saved form, made on the probe's own stream (the legacy
        default stream cannot be captured: `_replayed`), with Python's garbage collector off while the window
        runs (as `timeit` times; docs/decisions.md, "the garbage collector"). It is switched back on at the
        window's end."""
        if "cupy" not in sys.modules and any(c.backend == "cupy" for c in cases):
            # imported before the window's stream is set, so that cupy's calls run on it too (`_on_own_stream`)
            with self.startup("cupy imported (first needed)"):
                import cupy  # noqa: F401
        was = gc.isenabled()
        gc.disable()
        try:
            with self._on_own_stream():
                return self._run_window(cases)
        finally:
            if was:
                gc.enable()

    @contextlib.contextmanager
    def _on_own_stream(self):
        """torch's (and cupy's, when it is imported: `run_window` imports it for a window with cupy's GEMMs)
        current stream set to the probe's own while the block runs."""
        with self.torch.cuda.stream(self._own_stream):
            cp = sys.modules.get("cupy")
            if cp is None:
                yield
                return
            with cp.cuda.ExternalStream(self._own_stream.cuda_stream, self.device):
                yield

    def _replayed(self, c: Case, b: Built) -> Built:
        """`b` with its call captured and replayed (`driver.Graphs.replay`): its `fn` makes the library's
        launches for one call by the driver's own calls, and it keeps the replay (closed with it). Made after
        the warm-up, the logged call and the estimating call, which are the library's own (docs/decisions.md,
        "replayed calls"). Not for the cupy backend: cupy refuses a cuBLAS call while its stream is captured
        ("calling cuBLAS API during stream capture is currently unsupported"). Nor for a heavy GEMM
        (`is_heavy`): its GPU time outlasts the library's launches, which then pace nothing. A call that cannot
        be captured, or whose graph holds a node the replay does not make (`CaptureError`), keeps the library's
        launches; the raw record says why (`timing.replay_refused`). A grouped GEMM is not captured at all
        (`GROUPED_REPLAY`)."""
        if c.backend == "cupy" or is_heavy(c):
            return b
        if c.grouped:
            return dataclasses.replace(b, replay_refused=GROUPED_REPLAY)
        try:
            r = self.graphs.replay(self._stream(), b.fn)
        except CaptureError as e:   # a call the replay cannot make: timed as the library makes it, and why
            return dataclasses.replace(b, replay_refused=str(e)[:200])
        return dataclasses.replace(b, fn=r.launch, keep=b.keep + (r,), replay=True)

    def _library_set_up(self, cases: list[Case]) -> None:
        """Without the helpers: the cuBLASLt set-up of each dtype of `cases` not paid yet, before the window's
        first GEMM (`lt.set_up`), so that no GEMM's warm-up carries another's."""
        from cublaslt_probe.gpu import lt
        todo = [d for d in dict.fromkeys(c.dtype for c in cases) if d in lt.DTYPE_SPEC and d not in self._set_up]
        if todo:
            with self.startup(f"cuBLASLt set-up {', '.join(todo)} (first needed)"):
                lt.set_up(self.lib, todo)
            self._set_up.update(todo)

    def _run_window(self, cases: list[Case]) -> list[dict]:
        """One raw record per Case (`RawRecord.to_dict`). Kernel names are captured for the window in one CUPTI session;
        the window is cut early when the GEMMs it holds alive pass the options' `mem_budget` bytes.

        With the `pipeline` option (the default) the host prepares each GEMM (operands, warm-up, the logged
        call, the estimating call) while the GPU runs the timed batches of the one before, which were all
        queued before it; the heuristic is timed by the companion process meanwhile, when the probe has one.
        The GPU runs the same calls in the same order on one stream, each GEMM's samples bracketed by its own
        events, so what is measured is what the one-step-after-another order measures; only the host's
        waiting is gone. Not behind a GEMM timed one call per sample (SINGLE_US or more): the next GEMM is
        prepared on a GPU that has finished it (kept busy through such GEMMs, the GPU ran compute-bound ones
        slower: its clocks under sustained load). Nor for a heavy GEMM (`is_heavy`), which runs one step after
        another once the GEMM before has finished (docs/decisions.md, "heavy GEMMs")."""
        records: list[RawRecord] = []
        win = _Window()
        companion = []   # the window's questions for the companion, asked once the prewarm thread is done
        self._library_set_up([c for c in cases if not c.grouped])
        if self.flush is None:
            self.event_gap_us   # noqa: B018  (calibrated before the window's first GEMM)
        if self.options.pipeline and (self._prewarm is not None or self._companion is not None):
            asking = [c for c in cases if not invalid_reason(c) and not c.grouped]   # (no heuristic question)
            if self._prewarm is not None:   # the first calls' questions, asked ahead of them on another core
                self._prewarm.ask([prewarm_problem(c, self._prewarm_sms) for c in asking])
            if self._companion_ready():
                companion = asking
        for c in cases:
            if companion and (self._prewarm is None or self._prewarm.idle()):
                # the companion works through the window's questions while the window runs; not while the
                # prewarm thread asks its own (docs/decisions.md, "the prewarm thread")
                for x in companion:
                    self._ask_heuristic(x)
                companion = []
            rec = RawRecord.of_case(c)
            records.append(rec)
            why = invalid_reason(c)
            if why:
                rec.error = f"invalid: {why}"
                continue
            if self._run_one(c, rec, win) and not c.grouped:   # torch's grouped GEMM asks no heuristic question
                win.heur.append((rec, c))
        self._drain(win.built)
        self._finish(win.built)
        if self._prewarm is not None:
            self._prewarm.cancel()   # nothing asked while the heuristic may be timed in this process (cache off)
        for x in companion:
            self._ask_heuristic(x)
        self.time_heuristics(win.heur)
        self.builder.set_flags(Case("torch", "mm", "fp32", "NN", 1, 1, 1))
        return [r.to_dict() for r in records]

    def _run_one(self, c: Case, rec: RawRecord, win: _Window) -> bool:
        """Build, warm, log and time `c` into `rec` (pipelined: queued, its timing read by the next `_drain`).
        False when it failed (its record holds the error; after an out-of-memory error the window's GEMMs
        are finished and the pools released)."""
        ph = rec.probe_ms = {}
        t = time.perf_counter()
        pipeline = self.options.pipeline and not is_heavy(c)
        b = None   # this GEMM's, until the GEMM in flight or the window's list holds it
        try:
            b, win.held, finished_s = self._build(c, win.built, win.held)
            t += finished_s   # the window's GEMMs finished first: theirs (wait, profile_share), not this build's
            if pipeline:
                est, b = self._prepare(c, b, rec, ph, t)
                win.held += _nbytes(b.keep[-1:]) if b.replay else 0   # the replay's output (`_replayed`)
                self._drain(win.built)
                t = time.perf_counter()
                self.builder.set_flags(c)
                pending = self.timer.start(b.fn, self._key(c, b), *self.timer.read_estimate(est), None,
                                           setup=self._own_flags(c))
                self._inflight, b = InFlight(rec, c, b, pending, ph), None
                ph["time"] = round((time.perf_counter() - t) * 1e3, 3)
                if pending.per == 1:
                    self._drain(win.built)   # a long GEMM: the next one is prepared on an idle GPU (see above)
            else:
                self._drain(win.built)   # (pipeline) a heavy GEMM: prepared on a GPU that has finished, see above
                est, b, t = self._prepare_stepwise(c, b, rec, ph, t)
                win.held += _nbytes(b.keep[-1:]) if b.replay else 0
                _fill_timing(rec, self.timer.end(self.timer.start(
                    b.fn, self._key(c, b), *est, None, is_heavy(c), setup=self._own_flags(c),
                    sized_by="logged call")), b)
                t = _lap(ph, "time", t)
                win.built.append((rec, c, b))
                b = None
        except Exception as e:  # noqa: BLE001  a failing GEMM becomes an error row, the sweep goes on
            rec.error = error_text(e)
            self.torch.cuda.synchronize()
            if b is not None:
                b.close()   # its lt descriptors, its replay's graph
            self._drain(win.built)
            if "out of memory" in str(e):
                self._finish(win.built)
                win.held = 0
                self.builder.release_pools()
                self.torch.cuda.empty_cache()
            return False
        if not pipeline and self.options.candidates and c.backend == "lt":
            self._add_candidates(c, rec, ph, t)
        return True

    def _build(self, c: Case, built: list, held: int) -> tuple[Built, int, float]:
        """Build `c` under its flags; when the window's GEMMs would pass the memory budget, finish them first.
        Returns the built GEMM, the bytes the window now holds, and the seconds spent finishing the others
        (the caller leaves them out of this GEMM's build phase: the finished GEMMs' records hold them as
        `wait` and `profile_share`)."""
        self.builder.set_flags(c)
        b = self.builder.build(c)
        nbytes = _nbytes(b.keep)
        finished = 0.0
        if (built or self._inflight) and held + nbytes > self.options.mem_budget:
            t = time.perf_counter()
            self._drain(built)
            self._finish(built)   # profiles the earlier GEMMs, each under its own flags ...
            held = 0
            self.torch.cuda.empty_cache()
            self.builder.set_flags(c)  # ... so this GEMM's flags are set again (seen: tf32/Lt leaking)
            finished = time.perf_counter() - t
        return b, held + nbytes, finished

    def _prepare_stepwise(self, c: Case, b: Built, rec: RawRecord, ph: dict, t: float) -> tuple:
        """One step after another (the pipeline's twin is `_prepare`): the warm-up of `c`, then one call that is
        both its logged call and its estimating call (`_logged_estimate`), then its replay (`_replayed`); fills
        `rec` and the phase times `ph`. Returns (the estimate: GPU µs, host µs of a call; the Built to time; the
        phase clock). Under the flags of `c`: a retake of the GEMM in flight, while `_drain` waits for it, sets
        that GEMM's.

        The host µs of a call (what the spin before a long GEMM's samples covers, `Timer.start`) is the lesser
        of the warm-up call's and the logged call's: the logged call's alone holds the logger's line, and the
        warm-up call's a module load when it met a new kernel (docs/decisions.md, "the logged call sizes")."""
        self.builder.set_flags(c)
        h = time.perf_counter()
        for _ in range(WARM_CALLS):
            b.fn()
        warm_host = (time.perf_counter() - h) * 1e6 / max(WARM_CALLS, 1)
        t = _lap(ph, "build_warm", t)   # the warm-up's GPU time runs on behind the estimate's spin
        rec.log_lines, (once, logged_host) = self._logged_estimate(b.fn, self._key(c, b))
        t = _lap(ph, "log", t)
        b = self._replayed(c, b)
        _fill_config(rec, b)
        return (once, min(warm_host, logged_host)), b, t

    @staticmethod
    def _key(c: Case, b: Built) -> str:
        """Whose host time per call the spin rule learns (`Timer.host_us`): backend and op, and how it is
        launched."""
        return f"{c.backend}|{c.op}|replay" if b.replay else f"{c.backend}|{c.op}"

    def _prepare(self, c: Case, b: Built, rec: RawRecord, ph: dict, t: float) -> tuple:
        """Pipeline: the warm-up, the logged call and the estimating call of `c`, queued behind whatever the
        GPU is running (no wait; the estimate without its spin while the GEMM in flight's batches cover it:
        `Timer.queue_estimate`); fills `rec` and `ph`; returns the queued estimate."""
        for _ in range(WARM_CALLS):
            b.fn()
        t = _lap(ph, "build_warm", t)
        rec.log_lines = self.logged_call(b.fn, sync=False)
        t = _lap(ph, "log", t)
        behind = self._inflight.pending if self._inflight is not None else None
        est = self.timer.queue_estimate(b.fn, self._key(c, b), behind=behind)   # the library's call sizes the plan
        b = self._replayed(c, b)
        _fill_config(rec, b)
        _lap(ph, "estimate", t)
        return est, b

    def _drain(self, built: list) -> None:
        """Pipeline: wait for the GEMM in flight, check and fill its timing (retaken when its evidence fails,
        under its own flags), run its candidates when asked, and add it to the window's `built`."""
        f = self._inflight
        if f is None:
            return
        self._inflight = None
        t = time.perf_counter()
        try:
            self.clock.wait(f.pending.events.ends[-1])
            f.phases["wait"] = round((time.perf_counter() - t) * 1e3, 3)
            _fill_timing(f.rec, self.timer.end(f.pending), f.built)
        except Exception as e:  # noqa: BLE001
            f.rec.error = error_text(e)
            self.torch.cuda.synchronize()
        f.phases["time"] = round(f.phases.get("time", 0.0) + (time.perf_counter() - t) * 1e3, 3)
        if f.rec.error:
            f.built.close()
            return
        built.append((f.rec, f.case, f.built))
        if self.options.candidates and f.case.backend == "lt":
            self._add_candidates(f.case, f.rec, f.phases, time.perf_counter())

    def _add_candidates(self, c: Case, rec: RawRecord, ph: dict, t: float) -> None:
        from cublaslt_probe.analysis.candidates import compact
        from cublaslt_probe.gpu.alternatives import lt_candidates
        try:
            rec.candidates = [compact(r) for r in
                              lt_candidates(self, c, top=self.options.candidates, reps=self.options.candidate_reps)]
            _lap(ph, "candidates", t)
        except Exception as e:  # noqa: BLE001
            rec.candidates_error = error_text(e)

    def _finish(self, built) -> None:
        """Profile the built GEMMs of a window (one session), fill their kernels, release them."""
        if not built:
            return
        t = time.perf_counter()
        try:
            groups = self.profile([(lambda c=c: self.builder.set_flags(c), b.fn) for _, c, b in built])
            share = (time.perf_counter() - t) * 1e3 / len(built)
            for (rec, _, _), g in zip(built, groups):
                _fill_kernels(rec, g, share)
        except Exception as e:  # noqa: BLE001
            for rec, _, _ in built:
                rec.error = rec.error or f"kernel capture failed: {error_text(e)}"
        for _, _, b in built:
            b.close()
        built.clear()


@dataclass
class _Window:
    """What one window holds while it runs: its built GEMMs waiting for the kernel capture, their operand
    bytes, and the records whose heuristic is timed at its end."""
    built: list = dataclasses.field(default_factory=list)   # (record, Case, Built)
    held: int = 0
    heur: list = dataclasses.field(default_factory=list)    # (record, Case)
