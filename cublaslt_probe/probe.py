"""GPU probe: run GEMMs and capture, per GEMM, the cuBLASLt log lines, the launched kernels, GPU time and
the heuristic's CPU cost. The only module (with `lt.py` and `driver.py`) that touches the GPU; torch/cupy are
imported inside functions so that `import cublaslt_probe.probe` works on a CPU machine.

How each capture is made (the evidence, not a guess):
- log lines: the logger API of the libcublasLt instance torch loaded (`lt.Logger`), level 2 for exactly one
  call of the GEMM after warm-up; one process for the whole sweep.
- kernel names: torch.profiler (CUPTI) over a *window* of many GEMMs; before each GEMM a 1-element int8
  `fill_` marker kernel is launched on the same stream, so the kernel stream splits into one group per GEMM
  (`profile_kernels`).
- GPU time: median over samples timed with CUDA events (`Probe.time_gpu`, which returns a `Timing`). With
  `flush_l2=True` a sample is one call after an L2 flush (zeroing a 256 MB buffer). Without, a sample is a
  batch of back-to-back calls lasting at least BATCH_US, all batches queued behind one GPU spin long enough
  that the GPU never catches up with the host, so the events bracket GEMMs and never the CPU's launch gap.
  An event after each batch's first call splits it; the difference of the two spans over the difference of
  their calls is the sample (`time_us`, a call of a steady back-to-back run; the event and kernel-boundary
  cost cancels), the first call alone gives `time_us_first`. The spin covers the host's lead over the GPU
  (`timing_spin`); the evidence that it did is kept: the batches the GPU reached before the host had
  enqueued them (`timing.behind`, 0) and the GPU's idle time between batches (`time_gap_us`).
- heuristic CPU cost: `cublasLtMatmulAlgoGetHeuristic` for the same column-major problem with the
  backend's workspace limit, timed with the library's heuristics cache off (miss) and on (hit).

The public interface: `Probe(ProbeOptions(...))` with `run_window(cases)` (one raw record per Case, see
`raw_record`), `time_gpu(fn)`, `profile(fns)`, `lt_gemm(problem)` and `lt_candidates(probe, case)`.
"""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import logging
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from cublaslt_probe.candidates import max_rel_diff
from cublaslt_probe.cases import Case, invalid_reason, sizes_summary
from cublaslt_probe.dtypes import FP8_ELEMENTS, TORCH_NAMES, lt_types, output_type
from cublaslt_probe.errors import CaptureError, NoCudaDevice, OptionError
from cublaslt_probe.evidence import WORKSPACE_BYTES, heuristic_workspace, library_path
from cublaslt_probe.kinds import PEAKS

log = logging.getLogger(__name__)

CUBLAS_WORKSPACE = WORKSPACE_BYTES["lt"]   # the workspace the lt backend and candidates pass (32 MiB)
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
HEAVY_US = 50.0                  # pipeline: a GEMM whose arithmetic takes this long at the H100/H200 SXM's
                                 # dense peak (`heavy_us`) runs one step after another
WARM_CALLS = 1                   # calls before the logged call: the first loads the kernel's module and asks the
                                 # heuristic (answered ahead by the prewarm thread when it runs); the logged call,
                                 # then the estimating call follow it


def require_gpu(what: str):
    try:
        import torch
    except ImportError as e:
        raise NoCudaDevice(what, "torch is not installed: pip install 'cublaslt-probe[torch]'") from e
    if not torch.cuda.is_available():
        raise NoCudaDevice(what, "torch sees no CUDA device")
    return torch


def environment(lib=None) -> dict:
    """GPU, driver and library versions: stamped on every dataset row."""
    torch = require_gpu("environment")
    props = torch.cuda.get_device_properties(0)
    env = {"gpu": props.name, "sm_count": props.multi_processor_count,
           "cc": f"{props.major}.{props.minor}", "torch_version": torch.__version__,
           "cuda_runtime": torch.version.cuda, "driver": None, "cublaslt_version": None,
           "cupy_version": None, "cublaslt_path": None}
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        env["driver"] = out.stdout.strip().splitlines()[0] if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError, IndexError):
        pass
    try:
        import cupy
        env["cupy_version"] = cupy.__version__
    except Exception:  # noqa: BLE001  (cupy is an optional extra)
        pass
    if lib is not None:
        env["cublaslt_version"] = lib.version_str
        env["cublaslt_path"] = os.path.basename(lib.path)
    return env


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
    pipeline: bool = True           # prepare each GEMM while the GPU times the one before, and time the heuristic
                                    # in a companion process (False: one step after another, in this process)
    cpu_slot: int | None = None     # pin the probe, its companion and its prewarm thread to three physical cores
                                    # of their own, the slot-th three (one slot per probe process on a host); None:
                                    # no pinning
    prewarm: bool = True            # with the pipeline: ask each GEMM's heuristic question on a thread ahead of its
                                    # first call (HeuristicPrewarm)
    estimate_behind: bool = True    # with the pipeline: no spin before an estimating call that the GEMM in flight's
                                    # batches still cover (`covering_batch`)
    replay_calls: bool = True       # time the library's launches for a call replayed by the driver's own calls
                                    # (`driver.Replay`) in place of its launch path, for GEMMs not heavy and not
                                    # cupy's (`Probe._replayed`); windows on a stream of the probe's
    logged_estimate: bool = True    # a GEMM run one step after another (heavy ones, or every GEMM without the
                                    # pipeline): its logged call is its estimating call too (`Probe._capture`)
    pooled_cupy: bool = True        # cupy's operands are views of the builder's random pool, as torch's are, not
                                    # fresh random arrays (`Builder._cupy`)

    def __post_init__(self):
        ints = {"reps": 1, "heuristic_reps": 1, "mem_budget": 1, "candidates": 0, "candidate_reps": 1, "cpu_slot": 0}
        for name, least in ints.items():
            v = getattr(self, name)
            if name == "cpu_slot" and v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, int) or v < least:
                raise OptionError(f"probe option {name}={v!r}: expected an integer >= {least}")
        if isinstance(self.budget_ms, bool) or not isinstance(self.budget_ms, (int, float)) or not self.budget_ms > 0:
            raise OptionError(f"probe option budget_ms={self.budget_ms!r}: expected a number of ms > 0")
        for name in (f.name for f in dataclasses.fields(self) if f.type in ("bool", bool)):   # every switch
            if not isinstance(getattr(self, name), bool):
                raise OptionError(f"probe option {name}={getattr(self, name)!r}: expected True or False")


@dataclass(frozen=True)
class Timing:
    """What `Probe.time_gpu` measured: the median µs of one call, the samples behind it, and the evidence
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
    sized_by: str = "estimating call"   # what `estimate_us` is: "estimating call", "logged call" (`_capture`) or
                                        # "samples" (a re-time)

    @property
    def min_us(self) -> float:
        return min(self.samples_us)

    def evidence(self) -> dict:
        """The raw record's `timing` field."""
        return {"spin_us": self.spin_us and round(self.spin_us, 1), "enqueue_us": round(self.enqueue_us, 1),
                "attempts": self.attempts, "behind": self.behind, "retaken": self.retaken,
                "estimate_us": round(self.estimate_us, 2), "sized_by": self.sized_by, "rule": self.rule,
                "gap_limit_us": self.gap_limit_us and round(self.gap_limit_us, 3)}


def raw_record(c: Case) -> dict:
    """The raw record of one Case before it runs: its identity, both views, and every measured field empty.
    `Probe.run_window` fills it; docs/dataset.md lists what the dataset reads from it. A grouped GEMM's also
    holds the rows of each group (`group_sizes`) and their summary (`group_summary`, `cases.sizes_summary`);
    its heuristic fields stay empty: torch's grouped GEMM asks cuBLASLt no heuristic question."""
    rec = {"key": c.key, **c.as_dict(), **c.blas, "kernels": [], "kernel_us": [], "log_lines": [],
           "time_us": None, "time_us_reps": 0, "heuristic_miss_us": None, "heuristic_hit_us": None,
           "lt_config": None, "lt_waves": None, "error": None}
    if not c.groups:   # a dense GEMM's record holds no grouped fields
        del rec["groups"], rec["sizes"]
    if c.grouped and invalid_reason(c) is None:
        rec["group_sizes"] = c.group_sizes()
        rec["group_summary"] = sizes_summary(rec["group_sizes"])
    return rec


def _fill_timing(rec: dict, t: Timing, b: "Built") -> None:
    rec["time_us"] = t.median_us
    rec["time_us_reps"] = len(t.samples_us)
    rec["time_us_min"] = t.min_us
    rec["time_gap_us"] = None if t.gap_us is None else round(t.gap_us, 3)
    rec["time_calls_per_rep"] = t.calls_per_rep
    rec["time_us_first"] = t.first_us
    rec["timing"] = t.evidence()
    rec["timing"]["launch"] = b.launch   # "replay": the library's launches replayed
    if b.replay_refused:
        rec["timing"]["replay_refused"] = b.replay_refused   # why this GEMM's calls are the library's own


# --- one cuBLASLt GEMM ----------------------------------------------------------------------------------------
def lt_problem(c: Case, workspace_bytes: int, alignment: int = 16):
    """The cuBLASLt (column-major) Problem of a torch-view Case."""
    from cublaslt_probe import lt
    bl = c.blas
    return lt.Problem(bl["blas_m"], bl["blas_n"], bl["blas_k"], dtype=c.dtype, trans_a=bl["blas_trans_a"],
                      trans_b=bl["blas_trans_b"], batch=c.batch, bias=c.op == "addmm",
                      workspace_bytes=workspace_bytes, alignment=alignment,
                      b_type=lt_types(c.dtype)[1])


def current_stream(torch, device: int | None = None) -> int:
    """The raw handle (`cudaStream_t` as an int) of torch's current CUDA stream on `device` (the current device
    when None), from `torch._C._cuda_getCurrentRawStream`, which Inductor's generated code calls before every
    launch. `torch.cuda.current_stream()` makes a Stream object through torch's device checks: 33 µs of host
    time a call in the probe's process without a device number (bench12_decode_cprofile.txt), 20 with one
    (bench13_decode_cprofile.txt), 2.4 calls per GEMM."""
    if device is None:
        device = torch.cuda.current_device()
    return torch._C._cuda_getCurrentRawStream(device)


def lt_dtypes(p) -> tuple[str, str, str]:
    """The torch dtype names (`TORCH_NAMES` keys) of Problem `p`'s A, B and C (and bias)."""
    cd = output_type(p.dtype) if p.dtype.startswith("fp8") else p.dtype
    return p.dtype, FP8_ELEMENTS.get(p.b_type, p.dtype), cd


def lt_operands(torch, p, take=None) -> tuple:
    """A, B (random), an empty C (torch tensors, column-major storage, leading dimensions honoured) for Problem
    `p`, plus a random bias vector when the problem has one: (A, B, C, bias|None). Fresh tensors; or, given
    `take` (`Builder._operands`), views of its random buffers (A, B and the bias of one dtype taken in one
    call, so that none overlaps another)."""
    (ar, ac), (br, bc), (cr, cc) = p.shapes()
    da, db, dc = lt_dtypes(p)
    C = torch.empty(p.batch, cc, p.ldc or cr, device="cuda", dtype=getattr(torch, TORCH_NAMES[dc]))
    shapes = {"A": (da, (ac, p.lda or ar, False, p.batch)), "B": (db, (bc, p.ldb or br, False, p.batch))}
    if p.bias:
        shapes["bias"] = (dc, (1, cr, False, 1))
    got: dict = {}
    if take is None:
        for name, (dt, (rows, cols, _, batch)) in shapes.items():
            got[name] = torch.randn(batch, rows, cols, device="cuda").to(getattr(torch, TORCH_NAMES[dt]))
    else:
        for dt in dict.fromkeys(dt for dt, _ in shapes.values()):
            names = [n for n, (d, _) in shapes.items() if d == dt]
            got.update(zip(names, take(dt, *(shapes[n][1] for n in names))))
    bias = got.get("bias")
    return got["A"], got["B"], C, None if bias is None else bias.reshape(cr)


class LtGemm:
    """One cuBLASLt GEMM ready to run: the descriptors of Problem `p` (`lt.LtMatmul`), its operands
    (`lt_operands`; D = C unless `out_of_place`), a workspace of `p.workspace_bytes` (or the one given) and
    the current stream. `call(algo)` is the zero-argument launch of one algo. The one builder of an
    LtMatmul call: the lt backend, the candidates and replay use it. Close it (or use `with`) after."""

    def __init__(self, torch, lib, p, *, out_of_place: bool = False, workspace=None, take=None):
        from cublaslt_probe import lt
        self.torch, self.lib, self.p = torch, lib, p
        self.mm = lt.LtMatmul(lib, p)
        try:
            self.A, self.B, self.C, self.bias = lt_operands(torch, p, take)
            if self.bias is not None:
                self.mm.set_pointers(bias=self.bias.data_ptr())
            self.D = torch.empty_like(self.C) if out_of_place else self.C
            self.ws = workspace if workspace is not None else \
                torch.empty(max(p.workspace_bytes, 1), dtype=torch.uint8, device="cuda")
        except Exception:
            self.mm.close()
            raise
        self.stream = current_stream(torch)
        # operands this GEMM holds alive (the workspace given by the caller is the caller's)
        own = [self.A, self.B, self.C] + ([self.D] if out_of_place else [])
        own += [self.bias] if self.bias is not None else []
        if workspace is None:
            own.append(self.ws)
        self.nbytes = sum(t.element_size() * t.numel() for t in own)

    def heuristic(self, requested: int = 1) -> list:
        return self.mm.heuristic(requested)

    def call(self, algo):
        """Zero-argument callable launching `algo` on this GEMM (pointers read once, here)."""
        mm, ws_bytes, stream = self.mm, self.p.workspace_bytes, self.stream
        a, b, c, d, ws = (x.data_ptr() for x in (self.A, self.B, self.C, self.D, self.ws))
        return mm.launcher(algo, a, b, c, ws, ws_bytes, stream, d_ptr=d)

    def close(self) -> None:
        self.mm.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# --- building one GEMM as a zero-argument callable -----------------------------------------------------------
def operand_view(rows: int, cols: int, transposed: bool, batch: int, offset: int) -> tuple:
    """(size, stride, storage offset) of an operand of logical shape (rows, cols), `batch` of them one after
    another, stored row-major from element `offset` of a buffer, or transposed (column-major) when asked:
    what slicing the buffer there, viewing it as (batch,) (rows, cols) or (cols, rows) and transposing the
    last two dimensions gives (pure)."""
    size = (rows, cols)
    stride = (1, rows) if transposed else (cols, 1)
    if batch > 1:
        size, stride = (batch,) + size, (rows * cols,) + stride
    return size, stride, offset


@dataclass
class Built:
    fn: object            # zero-argument callable launching the GEMM
    keep: tuple           # objects the callable needs alive (closed after the window when they can be)
    lt_config: dict | None = None   # lt backend: the config of the algo it runs
    lt_waves: float | None = None
    replay: bool = False  # fn replays the library's launches for one call (ProbeOptions.replay_calls)
    replay_refused: str | None = None   # why its call could not be replayed (`Probe._replayed`)

    @property
    def launch(self) -> str:
        """How its timed calls are launched: "replay" or "library" (the raw record's timing.launch)."""
        return "replay" if self.replay else "library"

    def close(self) -> None:
        """Release what the callable held that must be closed (an lt GEMM's descriptors)."""
        for k in self.keep:
            if hasattr(k, "close"):
                k.close()


class Builder:
    """Makes a callable for a Case on its backend. One per probe process. `lib` (an `lt.LtLibrary`) is
    found when the first lt-backend Case is built if none is given."""

    POOL_ALIGN = 1024   # elements: every operand of the pool starts on a boundary at least as wide as an
                        # allocation's (so the library sees the alignment a fresh tensor has)

    def __init__(self, lib=None):
        import torch
        self.torch = torch
        self.lib = lib
        self.ws = torch.empty(CUBLAS_WORKSPACE, dtype=torch.uint8, device="cuda")
        self._pools: dict[str, object] = {}   # dtype -> a 1-D buffer of random values the operands are views of
        self._blas: dict[str, object] = {}    # set_flags: library name -> torch's value for it
        for dtype in TORCH_NAMES:   # each type's pool made in the probe's start-up, with the first uses of the
            self._pool(dtype, 1)  # fill and of its conversion (a process's first build took 12-27 ms, now 0.6-0.8:
                                  # bench22_first_gemm.txt, bench23_first_gemm.txt)

    def _pool(self, dtype: str, numel: int):
        """The random buffer of `dtype` with at least `numel` elements: grown (doubled at least) when too small;
        GEMMs built from the smaller one keep it alive until they are released."""
        t = self.torch
        pool = self._pools.get(dtype)
        if pool is None or pool.numel() < numel:
            n = max(numel, 2 * pool.numel() if pool is not None else 0, 1 << 20)
            pool = t.randn(n, device="cuda", dtype=t.float32).to(getattr(t, TORCH_NAMES[dtype]))
            self._pools[dtype] = pool
        return pool

    def release_pools(self) -> None:
        """Drop the random buffers (after an out-of-memory error); they are made again when needed."""
        self._pools.clear()

    def _operands(self, dtype: str, *shapes):
        """Torch operands of `dtype`, one per (rows, cols, transposed, batch): views of one random buffer at
        aligned offsets (no allocation or fill per GEMM); each of logical shape (rows, cols), stored transposed
        when asked (`operand_view`), made by one `as_strided` each (a slice, a view and a transpose took three
        calls: 58 µs for a GEMM's operands, bench13_decode_cprofile.txt)."""
        views, at = [], 0
        for rows, cols, transposed, batch in shapes:
            views.append(operand_view(rows, cols, transposed, batch, at))
            at += -(-batch * rows * cols // self.POOL_ALIGN) * self.POOL_ALIGN
        pool = self._pool(dtype, at)
        return [pool.as_strided(size, stride, offset) for size, stride, offset in views]

    def set_flags(self, c: Case) -> None:
        """torch's flags for `c`: TF32 for the tf32 dtype only; for the torch paths, the BLAS library. Each is
        read first and set only when it differs (a set cost 9.6 µs a call, bench13_decode_cprofile.txt): the
        pipeline sets a GEMM's flags again after waiting for the one before, which changes them only when it
        retook that one (`Probe._own_flags`). Read from torch each time, so flags someone else set are never
        taken for the probe's own."""
        cuda = self.torch.backends.cuda
        tf32 = c.dtype == "tf32"
        if cuda.matmul.allow_tf32 != tf32:
            cuda.matmul.allow_tf32 = tf32
        if c.backend in ("torch", "torch-lt"):
            name = "cublaslt" if c.backend == "torch-lt" else "cublas"
            want = self._blas.get(name)
            if want is None or cuda.preferred_blas_library() != want:
                self._blas[name] = cuda.preferred_blas_library(name)   # returns the library now preferred

    def build(self, c: Case, pooled_cupy: bool = True) -> Built:
        if c.backend in ("torch", "torch-lt"):
            return self._torch(c)
        if c.backend == "cupy":
            return self._cupy(c, pooled_cupy)
        if c.backend == "lt":
            return self._lt(c)
        raise CaptureError(f"unknown backend {c.backend!r}")

    def _torch(self, c: Case) -> Built:
        t = self.torch
        ta, tb = c.layout[0] == "T", c.layout[1] == "T"
        if c.grouped:
            return self._grouped(c, tb)
        if c.op == "scaled_mm":
            if c.dtype == "fp8":
                a, b = self._operands("fp8", (c.m, c.k, ta, 1), (c.k, c.n, tb, 1))
            else:   # another fp8 for A (e5m2); B is e4m3
                (a,), (b,) = self._operands(c.dtype, (c.m, c.k, ta, 1)), self._operands("fp8", (c.k, c.n, tb, 1))
            one = t.ones((), device="cuda", dtype=t.float32)
            return Built(lambda: t._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=t.bfloat16), (a, b, one))
        if c.op == "bmm":
            a, b = self._operands(c.dtype, (c.m, c.k, ta, c.batch), (c.k, c.n, tb, c.batch))
            return Built(lambda: t.bmm(a, b), (a, b))
        if c.op == "addmm":
            a, b, bias = self._operands(c.dtype, (c.m, c.k, ta, 1), (c.k, c.n, tb, 1), (1, c.n, False, 1))
            bias = bias.view(c.n)
            return Built(lambda: t.addmm(bias, a, b), (a, b, bias))
        a, b = self._operands(c.dtype, (c.m, c.k, ta, 1), (c.k, c.n, tb, 1))
        return Built(lambda: t.mm(a, b), (a, b))

    def _grouped(self, c: Case, tb: bool) -> Built:
        """torch's grouped GEMM of `c`: `torch._grouped_mm` (bf16, fp16) or `torch._scaled_grouped_mm` (fp8,
        unit row-wise scales: A's one per row, B's one per group and column, the shapes torch asks for), with B
        [groups, k, n] (stored [groups, n, k] and transposed for layout NT, as an MoE layer's weights are) and
        A [m, k] split by int32 offsets, the cumulative group sizes on the GPU (made here, not per call); in
        the batched form A is [groups, m, k] and there are no offsets. The weight gradient's form (`Case.split_k`)
        is 2-D x 2-D: A [m, k] column-major, B [k, n], the offsets splitting k, the output [groups, m, n]."""
        t = self.torch
        batched = c.sizes == "batched"
        if c.split_k:
            a, b = self._operands(c.dtype, (c.m, c.k, True, 1), (c.k, c.n, tb, 1))
        else:
            a, b = self._operands(c.dtype, (c.m, c.k, False, c.groups if batched else 1), (c.k, c.n, tb, c.groups))
        if c.groups == 1 and not c.split_k:   # a batch of one is a plain matrix in the pool's views (`operand_view`)
            a, b = (a.unsqueeze(0) if batched else a), b.unsqueeze(0)
        if batched:
            return Built(lambda: t._grouped_mm(a, b), (a, b))
        ends, run = [], 0
        for x in c.group_sizes():
            run += x
            ends.append(run)
        offs = t.tensor(ends, dtype=t.int32, device="cuda")
        if c.op == "scaled_grouped_mm":
            sa = t.ones(c.m, device="cuda", dtype=t.float32)
            sb = t.ones(c.groups, c.n, device="cuda", dtype=t.float32)
            return Built(lambda: t._scaled_grouped_mm(a, b, sa, sb, offs=offs, out_dtype=t.bfloat16),
                         (a, b, sa, sb, offs))
        return Built(lambda: t._grouped_mm(a, b, offs=offs), (a, b, offs))

    def _cupy(self, c: Case, pooled: bool = True) -> Built:
        """cupy's GEMM of `c`. Its operands are views of the pool torch's are taken from (`_operands`), made
        cupy arrays without a copy (`__cuda_array_interface__`, version 2: no stream to wait for; 0.14 ms while
        the GPU ran a spin) and laid out as fresh arrays are; not `pooled`, fresh random arrays (each GEMM then
        paid a random fill and a conversion per operand; a process's first cupy GEMM took 267 ms to build and
        120 ms to return, against 0.6 ms and 1.4-7.9 ms from the pool: bench22_first_gemm.txt,
        bench23_first_gemm.txt). The llm preset's every fourth cupy GEMM, both ways in one process: 3.67 s
        against 5.29 s, 2.01 against 9.88 ms per GEMM beyond their GPU time; the quick preset's 28 cupy GEMMs,
        four runs each way: 26 within 3 %, the same kernels (bench23_cupy_pool_ab.txt)."""
        import cupy as cp
        dt = {"fp32": cp.float32, "fp16": cp.float16}[c.dtype]
        if pooled:
            a, b = self._operands(c.dtype, (c.m, c.k, c.layout[0] == "T", c.batch),
                                  (c.k, c.n, c.layout[1] == "T", c.batch))
            a, b = cp.asarray(a), cp.asarray(b)
            return Built(lambda: cp.matmul(a, b), (a, b))

        def operand(rows, cols, transposed):
            shape = (cols, rows) if transposed else (rows, cols)
            if c.batch > 1:
                shape = (c.batch,) + shape
            x = cp.random.standard_normal(shape, dtype=cp.float32).astype(dt)
            return x.swapaxes(-1, -2) if transposed else x
        a = operand(c.m, c.k, c.layout[0] == "T")
        b = operand(c.k, c.n, c.layout[1] == "T")
        return Built(lambda: cp.matmul(a, b), (a, b))

    def _lt(self, c: Case) -> Built:
        if self.lib is None:
            from cublaslt_probe import lt
            self.lib = lt.LtLibrary()  # the instance torch loaded (loaded first if nothing has)
        g = LtGemm(self.torch, self.lib, lt_problem(c, CUBLAS_WORKSPACE), workspace=self.ws, take=self._operands)
        res = g.heuristic(1)
        if not res:
            g.close()
            raise CaptureError(f"cuBLASLt heuristic returned no algo for {c.key}")
        algo = res[0].algo
        return Built(g.call(algo), (g,), self.lib.algo_config(algo), float(res[0].wavesCount))


GROUPED_REPLAY = ("torch's grouped GEMM takes its prepare kernel's argument buffer (the groups' pointers and sizes) "
                  "from the caching allocator in each call, so replayed launches would use a buffer freed after "
                  "the capture (a replay stopped on the prepare kernel's device-side assertion); the fp16 one is "
                  "the fallback, one cuBLAS GEMM per group after reading the offsets on the host")


# --- timing: pure rules -----------------------------------------------------------------------------------------
def timing_plan(once_us: float, *, flush: bool = False, reps: int | None = None, max_reps: int = 20,
                budget_ms: float = 3.0) -> tuple[int, int]:
    """(samples, calls per sample) for a GEMM whose one call took about `once_us` (pure; see time_gpu).

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
    a host that has not queued the call when the spin ends makes it read long. Behind two calls' worth, the
    quick preset's 136 pipelined GEMMs were timed in batches of another size in one of four runs on 30 and
    13 of them (a GEMM of about 10 µs read as 17+ µs goes in batches of 3 instead of 5, which read 3-8 %
    lower); behind three, on 6 and 7, on the same host (bench12_fidelity_estimate_ab*.txt: the first of two
    estimating calls queued behind this spin). A logged call that is the estimating call (`logged_estimate`),
    whose host time is `logged_us` with the logger's lines, gets that once and two calls' worth more: what
    the logger adds is the library writing one line, not a launch that can stall (on the llm preset a logged
    call took 34-75 µs by backend and op, against 18-33 µs for a call; 66-164 against 21-71 on a slower host:
    bench21_llm_every4*.txt)."""
    if logged_us is None:
        return SPIN_FLOOR_US + 3 * host_us
    return SPIN_FLOOR_US + 2 * host_us + max(logged_us, host_us)


def gpu_us_per_call(once_us: float) -> float:
    """The GPU's µs per call of a GEMM whose estimating call took `once_us`, as the spin rules count it (pure):
    half of it. The estimating call reads long now and then (a 9 µs GEMM read as 17+ µs, seen on the H200, for
    85 of 6,935 llm GEMMs whose batches then fell behind); counted as the whole estimate, the spin was shorter
    and on a host-paced host 198 of 4,672 decode GEMMs were retaken against 37
    (bench19_lead_at_estimate_rejected.txt)."""
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
    `once_us` on the GPU, when the host takes `host_us` to enqueue one call (pure; see time_gpu).

    The GPU must not reach a batch before the host has enqueued all of it (time_gpu checks this on every
    batch). The host finishes batch i at (i + 1) x per x host_us, the GPU reaches it at spin + i x per x g,
    g its time per call (`gpu_us_per_call`: half the estimate). The spin
    covers the largest lead of the host: nearly all of the enqueue time for a GEMM shorter than its launch,
    only the first batch for a GEMM more than twice as long. Times SPIN_MARGIN, plus SPIN_FLOOR_US and
    SPIN_SLACK_US for a host hiccup.

    Where twice the whole enqueue time (the retake's spin) costs at most CHEAP_SPIN of the samples' GPU time —
    GEMMs of about 1.5 ms or more — the spin is that: the first batch's launch of such a GEMM can take the
    host several times its usual, and a first attempt behind costs a retake of every sample (on the llm
    preset, 53 of 136 GEMMs of 5 ms or more were retaken behind the lead's spin: 4.4 s of GPU time, against
    0.2 s of spin to cover them all; tests/fixtures/probe/long_spin_raw.jsonl).

    A `heavy` GEMM (`heavy_us` >= HEAVY_US) gets the whole enqueue time at least (`enqueue_spin`, the rule
    before the lead's): behind the lead's shorter spin, the quick preset's 4096^3 bf16 and fp16 GEMMs ran 3-6 %
    slower than behind the whole enqueue's, in every run (bench11_fidelity_flags_fix.txt); the GPU's rest
    before their batches is part of what they measure."""
    g = gpu_us_per_call(once_us)
    lead = per * host_us + max(0.0, (reps - 1) * per * (host_us - g))
    spin = SPIN_FLOOR_US + SPIN_MARGIN * lead + SPIN_SLACK_US
    whole = 2 * enqueue_spin(host_us, reps, per)
    if whole <= CHEAP_SPIN * reps * per * once_us:
        spin = max(spin, whole)
    if heavy:
        spin = max(spin, enqueue_spin(host_us, reps, per))
    return spin


def heavy_us(c: Case) -> float:
    """µs the arithmetic of `c` (2·m·n·k·batch) takes at the dense peak of its dtype on an H100/H200 SXM
    (`kinds.PEAKS`), whatever the GPU: a measure of how hard the GEMM drives the tensor cores, not a
    prediction of its time (pure)."""
    rates = PEAKS["H100 SXM"].tflops
    return 2.0 * c.m * c.n * c.k * c.batch / rates.get(c.dtype, rates["fp8"]) / 1e6


def is_heavy(c: Case) -> bool:
    """Does `c` drive the tensor cores hard enough (`heavy_us` >= HEAVY_US) to run one step after another in the
    pipeline, behind the whole enqueue's spin (`timing_spin`)?"""
    return heavy_us(c) >= HEAVY_US


def enqueue_spin(host_us: float, reps: int, per: int) -> float:
    """µs of GPU spin that covers the host's whole enqueue time (times SPIN_MARGIN, plus SPIN_FLOOR_US): the
    retake's rule (twice this), and a reference the benchmark compares `timing_spin` against."""
    return SPIN_FLOOR_US + SPIN_MARGIN * reps * per * host_us


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


# --- kernels ------------------------------------------------------------------------------------------------------
def profile_kernels(torch, calls, marker) -> list[list[tuple[str, float]]]:
    """Run `calls` (zero-argument callables, or (setup, fn) pairs whose setup runs first) under
    torch.profiler; the kernels each launched, in launch order, as (name, µs). Before each call `marker`
    (a 1-element int8 CUDA tensor) is filled on the same stream, which splits the kernel stream per call."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for call in calls:
            setup, fn = call if isinstance(call, tuple) else (None, call)
            if setup is not None:
                setup()
            marker.fill_(1)
            fn()
        marker.fill_(1)
        torch.cuda.synchronize()
    evs = _device_events(prof)
    if not evs:
        raise CaptureError("the profiler recorded no kernels (is CUPTI available?)")
    name = evs[0][1]
    groups: list[list[tuple[str, float]]] = []
    for _, kernel, dur in evs:
        if kernel == name:
            groups.append([])
        elif groups:
            groups[-1].append((kernel, dur))
    groups = groups[:-1]  # the closing marker opens an empty group
    if len(groups) != len(calls):
        raise CaptureError(f"split the kernel stream into {len(groups)} groups for {len(calls)} GEMMs: "
                           "another stream or process launched kernels inside the window")
    return groups


def _device_events(prof) -> list[tuple[float, str, float]]:
    """(start, name, duration µs) of every kernel/memset/memcpy, in start order.

    Reads kineto's results directly (fast); falls back to the Chrome-trace export.
    """
    try:
        from torch.autograd import DeviceType
        out = [(e.start_ns(), e.name(), e.duration_ns() / 1e3)
               for e in prof.profiler.kineto_results.events() if e.device_type() == DeviceType.CUDA]
    except (AttributeError, RuntimeError):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "trace.json")
            prof.export_chrome_trace(path)
            with open(path) as f:
                trace = json.load(f)
        out = [(e.get("ts", 0), e["name"], float(e.get("dur", 0.0))) for e in trace.get("traceEvents", [])
               if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy")]
    out.sort(key=lambda x: x[0])
    return out


class _Events:
    """The CUDA events of `reps` timed batches, on `clock` (`driver.Clock`): start and end of each, and a mid
    event after the first call when a batch holds several calls. The probe pools them by plan and records them
    again (`Probe._event_pool`): a few hundred events at most, kept for the probe's life."""

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


def physical_cores(allowed, siblings_of) -> list[int]:
    """The first allowed logical CPU of each physical core, in CPU order (pure: `siblings_of(cpu)` gives the
    logical CPUs sharing cpu's core)."""
    seen, out = set(), []
    for cpu in sorted(allowed):
        core = frozenset(c for c in siblings_of(cpu) if c in allowed) | {cpu}
        if core not in seen:
            seen.add(core)
            out.append(cpu)
    return out


def parse_cpulist(text: str) -> set[int]:
    """The CPUs of a kernel CPU list such as "0-15,32-47" (sysfs `thread_siblings_list`, `local_cpulist`)."""
    out = set()
    for part in text.strip().split(","):
        if part:
            lo, _, hi = part.partition("-")
            out.update(range(int(lo), int(hi or lo) + 1))
    return out


def _siblings(cpu: int) -> set[int]:
    try:
        with open(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list") as f:
            return parse_cpulist(f.read()) or {cpu}
    except (OSError, ValueError):
        return {cpu}


def gpu_local_cpus(props) -> set[int] | None:
    """The CPUs of the NUMA node the GPU hangs off (its PCI device's `local_cpulist` in sysfs), from torch's
    device properties `props`; None when unknown."""
    try:
        bdf = f"{props.pci_domain_id:04x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
        with open(f"/sys/bus/pci/devices/{bdf}/local_cpulist") as f:
            return parse_cpulist(f.read()) or None
    except (AttributeError, OSError, ValueError):
        return None


def cpu_cores(slot: int, allowed=None, siblings_of=_siblings, local=None) -> tuple[int, int, int] | None:
    """Three logical CPUs on three physical cores of their own for probe process `slot` of this host: the
    probe's own, its heuristic companion's and its prewarm thread's (`HeuristicPrewarm`), counted from the
    last core (the first ones take the system's interrupts); None when the cores this process may use are
    too few. Pinned so, none shares a core with another or with another slot's: on the two-GPU H200 host,
    unpinned, the companion's heuristic misses read 1.6x the probe's own and two probes ran 15 % slower each
    than one alone. Taken among the CPUs `local` to the probe's GPU (`gpu_local_cpus`) when they hold the
    slot's three: a GPU's launches from a core of another NUMA node cost more host time."""
    allowed = sorted(os.sched_getaffinity(0) if allowed is None else allowed)
    if local:
        near = cpu_cores(slot, [c for c in allowed if c in local], siblings_of)
        if near is not None:
            return near
    cores = physical_cores(allowed, siblings_of)
    if len(cores) < 3 * (slot + 1):
        return None
    return cores[-1 - 3 * slot], cores[-2 - 3 * slot], cores[-3 - 3 * slot]


def _heuristic_groups(items, workspace_of) -> tuple[dict, dict]:
    """The records of `items` grouped by the heuristic question their Case asks ({key: [records]}), and each
    question's Problem ({key: Problem}); the key is the Problem as a tuple."""
    groups: dict[tuple, list[dict]] = {}
    problems: dict[tuple, object] = {}
    for rec, c in items:
        p = lt_problem(c, workspace_of(c))
        key = p.key()
        groups.setdefault(key, []).append(rec)
        problems[key] = p
    return groups, problems


class HeuristicCompanion:
    """The process that times the heuristic while the probe times GEMMs (`lt.serve_heuristics`): asked each
    question as its GEMM is prepared, it answers on another core; the probe collects the answers at the
    end of the window. Its cuBLASLt is another instance of the same library file, on the same GPU, so a miss
    costs what it costs torch, and switching its cache off leaves torch's alone."""

    START_S = 120.0   # a companion not ready by then (loading torch and cuBLASLt) is given up

    def __init__(self, cpu: int | None = None):
        import multiprocessing
        ctx = multiprocessing.get_context("spawn")  # never fork a process holding a CUDA context
        self.conn, child = ctx.Pipe()
        from cublaslt_probe import lt
        self.proc = ctx.Process(target=lt.serve_heuristics, args=(child, cpu), daemon=True,
                                name="cublaslt-probe-heuristics")
        self.proc.start()
        child.close()
        self.ready: str | None = None
        self.asked: set = set()       # questions asked and not yet collected
        self.answers: dict = {}       # key -> (miss_us, hit_us, error, busy_s)

    def wait_ready(self) -> None:
        """Wait until the companion has loaded its library and paid its set-ups (`lt.set_up`)."""
        if self.ready is not None:
            return
        if not self.conn.poll(self.START_S):
            raise CaptureError(f"the heuristic companion was not ready after {self.START_S:.0f} s")
        try:
            state, what = self.conn.recv()
        except (EOFError, OSError) as e:
            raise CaptureError(f"the heuristic companion ended before it was ready ({e!r})") from e
        if state != "ready":
            raise CaptureError(f"the heuristic companion could not start: {what}")
        self.ready = what

    def _drain(self, block: bool) -> None:
        try:
            while block or self.conn.poll():
                for ident, *res in self.conn.recv():
                    self.answers[ident] = tuple(res)
                block = False
        except (EOFError, OSError) as e:
            raise CaptureError(f"the heuristic companion ended ({e!r})") from e

    def ask(self, key: tuple, problem, reps: int) -> None:
        if key in self.asked:
            return
        self.wait_ready()
        self._drain(False)   # read what is answered first, so that neither side blocks on a full pipe
        try:
            self.conn.send((key, problem, reps))
        except (OSError, ValueError) as e:
            raise CaptureError(f"the heuristic companion ended ({e!r})") from e
        self.asked.add(key)

    def collect(self, keys: list) -> list[tuple]:
        """(miss_us, hit_us, error, busy_s) for each asked key, waiting for those not answered yet."""
        while any(k not in self.answers for k in keys):
            if not self.proc.is_alive() and not self.conn.poll():
                raise CaptureError(f"the heuristic companion ended (exit code {self.proc.exitcode})")
            self._drain(True)
        out = [self.answers.pop(k) for k in keys]
        self.asked.difference_update(keys)
        return out

    def close(self) -> None:
        try:
            self.conn.send(None)
        except (OSError, ValueError):
            pass
        self.proc.join(5)
        if self.proc.is_alive():
            self.proc.terminate()
        self.conn.close()


def prewarm_problem(c: Case, sm_count: int):
    """The heuristic question the first call of `c` asks cuBLASLt, as this process can ask it directly
    (`HeuristicPrewarm`): the column-major problem with its path's workspace limit (`heuristic_workspace`);
    the lt backend's exactly (its build asks it); on torch's cuBLASLt path and the cuBLAS API, the 256-byte
    alignment of the operands' pointers (views of the operand pools, and outputs from torch's allocator), and
    on the cuBLAS API the SM count its log line shows (`smCountTarget`)."""
    path = library_path(c.backend, c.op, c.n, c.k)
    if path == "lt":
        return lt_problem(c, CUBLAS_WORKSPACE)
    p = lt_problem(c, heuristic_workspace(c.backend, c.op, c.n, c.k), alignment=256)
    if path == "cublas":
        p.sm_count = sm_count
    return p


class HeuristicPrewarm:
    """A thread of the probe's process that asks cuBLASLt, ahead of the probe, the heuristic question each
    GEMM of a window will ask on its first call (`prewarm_problem`), so that the first call finds the answer in
    the library's cache, which is the process's, shared by torch's cuBLAS and cuBLASLt paths and a direct call.
    The first call of a fresh bf16 decode shape took the probe 211 µs of host time (torch, cuBLAS API) and 169
    µs (torch's Lt path), and 35 µs once its question had been asked (a hit costs 2-4 µs; a second call 22-25
    µs in all); the lt backend's build 373 against 216 µs (benchmarks/bench_prewarm.py, one-GPU H200 host).
    The answer is the library's own for the question, so the kernel chosen does not change; a question
    cuBLASLt refuses is left to the first call. Asking writes no cuBLASLt log line at level 2.

    `ask(problems)` queues questions (one asked before in this process is not asked again); `hold()` and
    `release()` bracket the probe's enqueueing of timed batches, when no question is being asked; `idle()` says
    whether all are answered (the probe asks the companion its questions then, not alongside); `cancel()` drops
    those not asked yet and waits for the one being asked; `close()` ends the thread. `answer(problem)` is
    what the thread runs for each (the probe's: one `cublasLtMatmulAlgoGetHeuristic` call); `cpu`, the
    logical CPU the thread runs on (None: the process's)."""

    REMEMBER = 4096   # questions remembered as asked (the library's cache holds 8192 answers by default)

    def __init__(self, answer, cpu: int | None = None):
        import collections
        import threading
        self._answer = answer
        self._todo: collections.deque = collections.deque()
        self._cv = threading.Condition()
        self._busy = threading.Lock()
        self._asked: set = set()
        self._closed = False
        self._held = False   # the probe enqueues timed batches (`hold`)
        self.asked = 0     # questions answered by the thread
        self.refused = 0   # questions the library refused (left to the first call)
        self._thread = threading.Thread(target=self._run, args=(cpu,), name="cublaslt-probe-prewarm", daemon=True)
        self._thread.start()

    def ask(self, problems) -> None:
        with self._cv:
            for p in problems:
                key = p.key()
                if key in self._asked:
                    continue
                if len(self._asked) >= self.REMEMBER:
                    self._asked.clear()
                self._asked.add(key)
                self._todo.append(p)
            self._cv.notify()

    def hold(self) -> None:
        """Ask no new question until `release`, and wait for the one being asked: the probe is about to enqueue
        timed batches, and the thread's Python work between its cuBLASLt calls would take the interpreter's
        lock from the launching thread (which lets it go at each event it records)."""
        with self._cv:
            self._held = True
        self._wait_for_answer()

    def release(self) -> None:
        with self._cv:
            self._held = False
            self._cv.notify()

    def idle(self) -> bool:
        """Nothing queued and nothing being asked."""
        with self._cv:
            return not self._todo and not self._busy.locked()

    def cancel(self) -> None:
        with self._cv:
            for p in self._todo:
                self._asked.discard(p.key())
            self._todo.clear()
        self._wait_for_answer()

    def _wait_for_answer(self) -> None:
        """Return once the question being asked, if any, is answered."""
        with self._busy:
            pass

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._todo.clear()
            self._cv.notify()
        self._thread.join(10)

    def _run(self, cpu: int | None) -> None:
        if cpu is not None:
            os.sched_setaffinity(0, {cpu})   # this thread only
        while True:
            with self._cv:
                while (not self._todo or self._held) and not self._closed:
                    self._cv.wait()
                if self._closed:
                    return
                p = self._todo.popleft()
                self._busy.acquire()
            try:
                self._answer(p)
                self.asked += 1
            except Exception:  # noqa: BLE001  the first call will ask it (and meet the error) itself
                self.refused += 1
            finally:
                self._busy.release()


@dataclass
class _Pending:
    """One GEMM's timing in flight: its plan, events and the first attempt's evidence (`Probe._start`)."""
    fn: object
    key: str
    reps_asked: int | None
    once_us: float
    reps: int
    per: int
    events: _Events
    heavy: bool = False
    spin_us: float | None = None
    rule: str = "lead"
    enqueue_us: float = 0.0
    behind: int = 0
    attempt: int = 1
    case: Case | None = None   # whose flags a retake sets first (in the pipeline the next GEMM's may be set by then)
    sized_by: str = "estimating call"   # the call whose GPU time `once_us` is (Timing.sized_by)


# --- the probe ------------------------------------------------------------------------------------------------
class Probe:
    """Runs windows of Cases and returns one raw record (a dict) per Case. One per process.

    `Probe(ProbeOptions(reps=10))`, or the options as keywords: `Probe(reps=10)`."""

    def __init__(self, options: ProbeOptions | None = None, **kwargs):
        if options is not None and kwargs:
            raise OptionError(f"give the probe options either as ProbeOptions or as keywords, not both ({kwargs})")
        self.options = options if options is not None else ProbeOptions(**kwargs)
        torch = require_gpu("sweep")
        from cublaslt_probe import driver, lt
        self.torch = torch
        self.device = torch.cuda.current_device()   # the probe's GPU: its streams and events are this one's
        props = torch.cuda.get_device_properties(self.device)
        cores = None if self.options.cpu_slot is None else cpu_cores(self.options.cpu_slot,
                                                                      local=gpu_local_cpus(props))
        # started first: it loads torch and cuBLASLt on another core while this process gets ready
        self._companion = HeuristicCompanion(cores and cores[1]) if self.options.pipeline else None
        self.cpus = cores   # (the probe's CPU, its companion's, its prewarm thread's), or None when not pinned
        self.host_cpus = os.sched_getaffinity(0)   # before pinning: the CPUs a helper process may use
        self._inflight = None   # pipeline: the GEMM whose timing the GPU is running (`_drain`)
        self._event_pool: dict[tuple, list] = {}   # spent timing events by (reps, split), recorded again
        self._pair_pool: list = []                 # spent estimate event pairs
        lt.ensure_loaded()
        self.clock = driver.Clock()   # the timing events (torch has run CUDA work: the driver is loaded)
        self.graphs = driver.Graphs(self.clock)
        self._own_stream = torch.cuda.Stream(self.device)   # replay_calls: the windows' stream (capturable)
        self.lib = lt.LtLibrary()
        self.logger = lt.Logger(self.lib)
        self.env = environment(self.lib)
        self.builder = Builder(self.lib)
        setup = self._library_setup()
        self.marker = torch.zeros(1, dtype=torch.int8, device="cuda")
        self.flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda") if self.options.flush_l2 else None
        self.cycles_per_us = self._calibrate_spin()
        self.event_gap_us = self._calibrate_gap()
        self.gap_limit_us = max(GAP_US_PER_REP, self.event_gap_us + GAP_SLACK_US)
        self._host_us: dict[str, float] = {}  # host µs to enqueue one call, by backend|op (learnt while timing)
        self.profile([lambda: None])  # start-up cost once: torch.profiler import, CUPTI init
        setup.join()
        if self._companion is not None:
            try:   # its start and its library's set-ups are start-up too, not the first window's end
                self._companion.wait_ready()
            except CaptureError as e:
                self._drop_companion(e)
        self._prewarm = None
        if self.options.pipeline and self.options.prewarm:
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
        of each type pays whichever path asks it (torch's first bf16 call 90-97 ms to its return, the lt
        backend's first build and call 146 ms, torch's first fp16 call after that 87-101 ms, against 2-5 ms for a
        later GEMM's new kernel: bench22_first_gemm.txt, bench23_first_gemm.txt), asked on a thread of its own
        while this one calibrates: start-up, not the first GEMMs' build and warm-up (each `--devices` worker paid
        them there; in the sweep the prewarm thread met the next type's first, and the probe's first timed
        batches waited for it to be answered: the decode preset's first GEMM took 97 ms to time, 1.0 ms once
        the set-ups were asked here: bench23_devices0.txt). Returns the started thread."""
        import threading

        from cublaslt_probe import lt
        t = threading.Thread(target=lt.set_up, args=(self.lib,), name="cublaslt-setup", daemon=True)
        t.start()
        return t

    def _ask_library(self, p) -> None:
        """The prewarm thread's question: `p` asked of this process's cuBLASLt (its answer is cached there)."""
        from cublaslt_probe import lt
        with lt.LtMatmul(self.lib, p) as mm:
            mm.heuristic(1)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # GPU spin -------------------------------------------------------------------------------------------
    def _calibrate_spin(self) -> float:
        """GPU spin cycles per µs (torch.cuda._sleep counts SM clock cycles), measured with events."""
        torch, clock = self.torch, self.clock
        rate = 1e3
        s, e = clock.event(), clock.event()
        for _ in range(2):  # the first run warms the spin kernel up
            st = self._stream()
            clock.record(s, st); torch.cuda._sleep(400_000); clock.record(e, st)  # noqa: E702
            clock.wait(e)
            rate = 400_000 / max(clock.elapsed_us(s, e), 1.0)
        self._pair_pool.append((s, e))
        return rate

    def _calibrate_gap(self, n: int = 20) -> float:
        """µs the GPU spends between two timed samples when it never waits for the host: the end event of one
        and the start event of the next, nothing between (on the H200s lent: 1.3-1.4 µs on one host, 2.6 on
        another). Median of three runs of `n` samples of a 1-element fill, queued behind a long spin."""
        clock = self.clock
        events = _Events(clock, n, True)
        st, rec = self._stream(), clock.record
        out = []
        for _ in range(3):
            self.spin(5000)
            for i in range(n):
                rec(events.starts[i], st); self.marker.fill_(1); rec(events.mids[i], st)  # noqa: E702
                self.marker.fill_(1); rec(events.ends[i], st)  # noqa: E702
            clock.wait(events.ends[-1])
            out.append(events.gap_us([clock.elapsed_us(a, b) for a, b in zip(events.starts, events.ends)]) / n)
        self._event_pool.setdefault((n, True), []).append(events)   # read: a timing plan can record them again
        return statistics.median(out)

    def _stream(self):
        """The driver handle of torch's current stream on the probe's GPU, as `clock.record` takes it."""
        return self.clock.stream(current_stream(self.torch, self.device))

    def spin(self, us: float) -> None:
        """Keep the GPU busy for about `us` µs (queued on the current stream)."""
        self.torch.cuda._sleep(int(max(us, 1.0) * self.cycles_per_us))

    def first_spin(self, host_us: float, once_us: float, reps: int, per: int, heavy: bool = False) -> tuple[float, str]:
        """(µs of spin before the first attempt's batches, the rule's name): `timing_spin`, the host's lead
        ("lead"; the whole enqueue at least for a heavy GEMM: "heavy")."""
        return timing_spin(host_us, once_us, reps, per, heavy), "heavy" if heavy else "lead"

    # timing -----------------------------------------------------------------------------------------------
    def time_gpu(self, fn, reps: int | None = None, key: str = "", heavy: bool = False) -> Timing:
        """Time `fn` (a zero-argument GEMM launch): the median µs of one call running back to back, with its
        samples and evidence (CUDA events; see the module doc).

        One estimating call sizes the plan (`timing_plan`). With an L2 flush each sample is one call after a
        flush. Without, each sample is a batch of `calls_per_rep` (n >= 3) back-to-back calls, all batches
        queued behind one GPU spin long enough that the GPU never reaches a batch before the host has
        enqueued all of it (`first_spin`), so no event brackets the CPU's launch gap. An event after the
        batch's first call splits it in two: F, the first call, and R, the n-1 calls after it. Each span
        pays once for its opening event and the kernel boundary after it (about 2 µs on an H200, 20 % of a
        10 µs GEMM), so the sample is (R - F) / (n - 2): the time per call of a steady back-to-back run, the
        fixed cost cancelled (differential timing). The median of F is `first_us`. GEMMs of SINGLE_US or
        more run one call per sample (the boundary is then under 1 % of it); one whose samples say it is
        short after all (under SINGLE_US / 2: the estimating call read long) is timed again in batches
        sized by them.

        The host's cost per call is what the last enqueue loop of this `key` (backend and op) took per call;
        for a GEMM timed one call per sample, the larger of that and what its estimating call took. The
        evidence that the spin was long enough: `behind`, the batches the GPU had reached before the host
        finished enqueueing them (an event query after each batch), and `gap_us`, the GPU's idle time
        between batches. When either fails (a batch behind, or more idle per sample than `gap_limit_us`),
        the samples are retaken behind a spin of twice the whole enqueue time at the host's speed in the
        attempt that failed (`enqueue_spin`), and the first attempt's evidence is kept under `retaken`; once
        more when the retake fails too (a host stalled for milliseconds: seen on the two-GPU H200 host, a
        retake's 24 calls enqueued in 3.8 ms after the first attempt's 1.1 ms), ATTEMPTS in all. `reps`
        fixes the number of samples; by default the options' `budget_ms` sets it, at most their `reps`."""
        return self._end(self._start(fn, key, *self._estimate(fn, key), reps, heavy))

    def _queue_estimate(self, fn, key: str, logged: bool = False) -> tuple:
        """Queue one call of `fn` between two events, after a flush or behind a short spin (`estimate_spin`) —
        or, with `estimate_behind`, behind the in-flight GEMM's batches when they cover that spin (`_covered`:
        the host then waited 15-24 µs to read it instead of 69-70, bench19_host_costs_waits.txt); with the host
        µs its launch took. `_read_estimate` waits for it. A `logged` call (`_logged_estimate`) is queued behind
        the spin even after a flush: the host writes its log line before it launches the GEMM. The spin covers
        the host time per call of `key` the last enqueue loop took, and for a `logged` call the last logged
        call's of `key` as well (HOST_US_GUESS, LOGGED_HOST_US_GUESS before the first)."""
        clock = self.clock
        s, e = self._pair_pool.pop() if self._pair_pool else (clock.event(), clock.event())
        if self.flush is not None:
            self.flush.zero_()
        if self.flush is None or logged:
            host = self._host_us.get(key, HOST_US_GUESS)
            need = estimate_spin(host, self._host_us.get(f"{key}|logged", LOGGED_HOST_US_GUESS) if logged else None)
            if not self._covered(need):
                self.spin(need)
        st, rec = self._stream(), clock.record
        h = time.perf_counter()
        bad = rec(s, st); fn(); bad = rec(e, st) or bad  # noqa: E702
        if bad:
            raise clock.error(bad, "cuEventRecord")
        host_us = (time.perf_counter() - h) * 1e6
        if logged:
            self._host_us[f"{key}|logged"] = host_us
        return s, e, host_us

    def _covered(self, need_us: float) -> bool:
        """(`estimate_behind`) Does the GPU still have `need_us` of the in-flight GEMM's batches ahead of it
        (`covering_batch` not started)?"""
        p = self._inflight[3] if self.options.estimate_behind and self._inflight is not None else None
        k = None if p is None else covering_batch(p.once_us, p.reps, p.per, need_us)
        return k is not None and not self.clock.done(p.events.starts[k])

    def _read_estimate(self, queued: tuple) -> tuple[float, float]:
        s, e, host_once = queued
        self.clock.wait(e)
        once = max(self.clock.elapsed_us(s, e), 1.0)
        self._pair_pool.append((s, e))   # read: the pair can be recorded again
        return once, host_once

    def _estimate(self, fn, key: str) -> tuple[float, float]:
        """(GPU µs, host µs) of one call of `fn` after a flush or behind a short spin."""
        return self._read_estimate(self._queue_estimate(fn, key))

    def _logged_estimate(self, fn, key: str) -> tuple[list[str], tuple[float, float]]:
        """(`logged_estimate`) One call of `fn` that is both the logged call (`logged_call`) and the estimating
        call (`_estimate`): (its log lines, (GPU µs, host µs)). Its spin covers a logged call's host time, the
        logger's lines included (`_queue_estimate`), so that its events bracket the GEMM, not the host writing
        the log."""
        self.logger.take()
        self.logger.set_level(2)
        try:
            queued = self._queue_estimate(fn, key, logged=True)
        finally:
            self.logger.set_level(0)
        est = self._read_estimate(queued)
        return self.lt_lines(self.logger.take()), est

    def _start(self, fn, key: str, once_us: float, host_once: float | None, reps_asked: int | None,
               heavy: bool = False, case: Case | None = None, sized_by: str = "estimating call") -> "_Pending":
        """Queue the first attempt of the timing plan sized by `once_us`; `_end` waits for it and checks it."""
        flush = self.flush is not None
        host = self._host_us.get(key, HOST_US_GUESS)
        reps, per = timing_plan(once_us, flush=flush, reps=reps_asked, max_reps=self.options.reps,
                                budget_ms=self.options.budget_ms)
        if per == 1 and host_once is not None:
            # a long GEMM's launch can cost the host several times its backend's usual (seen: 100-170 µs for
            # llm GEMMs of 1-12 ms): its spin, a small part of its time, covers the larger of the two
            host = max(host, host_once)
        pool = self._event_pool.get((reps, per > 1))
        events = pool.pop() if pool else _Events(self.clock, reps, per > 1)
        p = _Pending(fn, key, reps_asked, once_us, reps, per, events, heavy=heavy, case=case, sized_by=sized_by)
        p.spin_us, p.rule = (None, "lead") if flush else self.first_spin(host, once_us, reps, per, heavy)
        self._attempt(p)
        return p

    def _attempt(self, p: "_Pending") -> None:
        prewarm = self._prewarm
        if prewarm is not None:
            prewarm.hold()   # no question started while the batches are enqueued (HeuristicPrewarm.hold)
        try:
            if p.spin_us is not None:
                self.spin(p.spin_us)
            p.enqueue_us, p.behind = self._enqueue(p.fn, p.events, p.reps, p.per)
        finally:
            if prewarm is not None:
                prewarm.release()
        if self.flush is None:
            self._host_us[p.key] = p.enqueue_us / (p.reps * p.per)

    def _end(self, p: "_Pending") -> Timing:
        """Wait for the samples of `p` and check their evidence: retaken behind a longer spin when it fails (up
        to ATTEMPTS attempts in all), timed again in batches when they say the GEMM is short after all (see
        time_gpu)."""
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
            p.spin_us = 2 * enqueue_spin(self._host_us[p.key], p.reps, p.per)
            p.attempt += 1
            self._own_flags(p)
            self._attempt(p)
            t = self._collect(p, retaken)
        self._event_pool.setdefault((p.reps, p.per > 1), []).append(p.events)  # read: can be recorded again
        if t.calls_per_rep == 1 and self.flush is None and t.median_us < SINGLE_US / 2:
            # the estimating call read long (a cold first call, seen: 200+ µs for a 10 µs GEMM; or a host
            # stall after the spin): the samples say the GEMM is short, so time it again in batches sized by
            # them, with no second estimate that could read long again
            self._own_flags(p)
            t = self._end(self._start(p.fn, p.key, t.median_us, None, p.reps_asked, p.heavy, p.case, "samples"))
        return t

    def _own_flags(self, p: "_Pending") -> None:
        """Before a GEMM in flight runs again (a retake, or timed again in batches): its own flags, which the
        pipeline has replaced with the next GEMM's by the time it checks the samples (`_drain`)."""
        if p.case is not None:
            self.builder.set_flags(p.case)

    def _collect(self, p: "_Pending", retaken: dict | None) -> Timing:
        self.clock.wait(p.events.ends[-1])
        totals, firsts, times = p.events.samples(p.per)
        flush = self.flush is not None
        gap = None if flush else p.events.gap_us(totals)
        return Timing(statistics.median(times), tuple(times), p.per, statistics.median(firsts), gap, p.spin_us,
                      p.enqueue_us, p.attempt, None if flush else p.behind, retaken, p.once_us, p.rule,
                      None if flush else self.gap_limit_us, p.sized_by)

    def _enqueue(self, fn, events: _Events, reps: int, per: int) -> tuple[float, int]:
        """Enqueue the timed batches; (host µs it took, batches the GPU had reached before they were queued).
        Events are recorded on the stream named once here: without it, each record asks torch for the current
        stream (13.6-15.5 µs of host time per event on the H200 hosts, 4.7 µs on a named stream; a GEMM launch
        takes 24-30); and through the driver (`driver.Clock`), not torch's `Event`."""
        flush, behind, clock = self.flush, 0, self.clock
        rec, done = clock.record, clock.done
        starts, mids, ends = events.starts, events.mids, events.ends
        st = self._stream()
        h = time.perf_counter()
        for i in range(reps):
            if flush is not None:
                flush.zero_()
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
        return (time.perf_counter() - h) * 1e6, behind

    # heuristic cost -----------------------------------------------------------------------------------------
    @staticmethod
    def heuristic_workspace(c: Case) -> int:
        """The workspace limit the backend's own heuristic query uses for this GEMM."""
        return heuristic_workspace(c.backend, c.op, c.n, c.k)

    def time_heuristics(self, items: list[tuple[dict, Case]]) -> None:
        """Fill heuristic_miss_us / heuristic_hit_us of each record: `cublasLtMatmulAlgoGetHeuristic` for
        the Case's column-major problem with its backend's workspace limit, cache off then on
        (lt.measure_heuristics), with one cache switch for the whole window (switching per GEMM, to hide
        the work behind the GPU's, was measured slower: 1.6 ms per measurement instead of about 1.1 ms).
        With the `pipeline` option the measurements were asked of the companion process as the window ran
        (`HeuristicCompanion`); this collects them.

        Cases whose backends ask cuBLASLt the same question (same problem and workspace limit, e.g.
        `torch`, `cupy` and `lt` of one GEMM) share one measurement: the call is identical."""
        from cublaslt_probe import lt
        if not items:
            return
        t = time.perf_counter()
        groups, problems = _heuristic_groups(items, self.heuristic_workspace)
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
                rec["heuristic_miss_us"], rec["heuristic_hit_us"] = miss, hit
                rec["heuristic_shared"] = len(groups[key])
                rec["heuristic_where"] = where
                if err:
                    rec["heuristic_error"] = err
        share = round((time.perf_counter() - t) * 1e3 / len(items), 3)
        for rec, _ in items:
            rec.setdefault("probe_ms", {})["heuristic_share"] = share

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
        """The kernels each call launched, in launch order, as (name, µs) (`profile_kernels`)."""
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
        from cublaslt_probe.lt import Logger
        return Logger.render(recs)

    def lt_gemm(self, p, *, out_of_place: bool = False) -> LtGemm:
        """A direct cuBLASLt call of Problem `p` on this process's library (`LtGemm`)."""
        return LtGemm(self.torch, self.lib, p, out_of_place=out_of_place)

    # one window --------------------------------------------------------------------------------------------
    def run_window(self, cases: list[Case]) -> list[dict]:
        """One raw record per Case (`_run_window`), with Python's garbage collector off while the window runs
        (as `timeit` times): its collections among the window's allocations cost the decode preset 6-8 % of
        its rate (windows alternating in one process, each timed to the next window's start, so with its
        records written and the collections after it: 548 against 508 and 508 against 478 GEMMs/s,
        bench10_decode_gc_ab_with_writes.txt). It is switched back on at the window's end."""
        was = gc.isenabled()
        gc.disable()
        try:
            if not self.options.replay_calls:
                return self._run_window(cases)
            with self._on_own_stream():
                return self._run_window(cases)
        finally:
            if was:
                gc.enable()

    @contextlib.contextmanager
    def _on_own_stream(self):
        """torch's (and cupy's, when it is loaded) current stream set to the probe's own while the block runs:
        the legacy default stream cannot be captured (`replay_calls`)."""
        with self.torch.cuda.stream(self._own_stream):
            cp = sys.modules.get("cupy")
            if cp is None:
                yield
                return
            with cp.cuda.ExternalStream(self._own_stream.cuda_stream, self.device):
                yield

    def _replayed(self, c: Case, b: Built) -> Built:
        """(`replay_calls`) `b` with its call captured and replayed (`driver.Graphs.replay`): its `fn` makes the
        library's launches for one call by the driver's own calls, and it keeps the replay (closed with it).
        Made after the warm-up, the logged call and the estimating call, which are the library's own. Timed
        GEMM by GEMM against the library's launches, the replay agreed within 3 % on 426 of 426 GEMMs (median
        ratio 1.0000; the library's launches against themselves 410), for 151 µs of host time to enqueue a
        GEMM's timed calls against 403 (bench19_replay_timing.txt). Not for the cupy backend: cupy refuses a
        cuBLAS call while its stream is captured ("calling cuBLAS API during stream capture is currently
        unsupported"). Nor for a heavy GEMM (`is_heavy`): its GPU time outlasts the library's launches, which
        then pace nothing, and its capture would cost host time and keep a large output alive for nothing (on
        the llm preset, every fourth GEMM, replaying all of them gained nothing in the timing phase, 19.35 s
        against 19.31, and the captures took 0.16 s). A call that cannot be captured, or whose graph holds a
        node the replay does not make (`CaptureError`), keeps the library's launches; the raw record says why
        (`timing.replay_refused`). A grouped GEMM is not captured at all (`GROUPED_REPLAY`)."""
        if not self.options.replay_calls or c.backend == "cupy" or is_heavy(c):
            return b
        if c.grouped:
            return dataclasses.replace(b, replay_refused=GROUPED_REPLAY)
        try:
            r = self.graphs.replay(self._stream(), b.fn)
        except CaptureError as e:   # a call the replay cannot make: timed as the library makes it, and why
            return dataclasses.replace(b, replay_refused=str(e)[:200])
        return dataclasses.replace(b, fn=r.launch, keep=b.keep + (r,), replay=True)

    def _run_window(self, cases: list[Case]) -> list[dict]:
        """One raw record per Case. Kernel names are captured for the window in one profiler session;
        the window is cut early when the GEMMs it holds alive pass the options' `mem_budget` bytes.

        With the `pipeline` option (the default) the host prepares each GEMM (operands, warm-up, the logged
        call, the estimating call) while the GPU runs the timed batches of the one before, which were all
        queued before it; the heuristic is timed by the companion process meanwhile. The GPU runs the same
        calls in the same order on one stream, each GEMM's samples bracketed by its own events, so what is
        measured is what the one-step-after-another order measures; only the host's waiting is gone. Not
        behind a GEMM timed one call per sample (SINGLE_US or more): kept busy through such GEMMs, the GPU
        ran the compute-bound ones of the quick preset 5-10 % slower (its clocks under sustained load) than
        with the host's pauses between them; the next GEMM is prepared after it, as before. Nor for a GEMM
        whose arithmetic alone keeps the tensor cores busy HEAVY_US or more (`heavy_us`): its warm-up, logged
        and estimating calls queued back to back behind the GEMM before, the GPU ran the quick preset's
        4096^3 bf16 GEMMs 5-10 % slower than one step after another (bench10_fidelity_before_heavy.txt);
        such a GEMM runs one step after another once the GEMM before has finished. The GEMMs the pipeline
        is for, those the host's launches outlast, have far less arithmetic."""
        records: list[dict] = []
        built: list[tuple[dict, Case, Built]] = []
        heur: list[tuple[dict, Case]] = []
        held = 0
        companion = []   # the window's questions for the companion, asked once the prewarm thread is done
        if self.options.pipeline:
            companion = [c for c in cases if not invalid_reason(c) and not c.grouped]   # (no heuristic question)
            if self._prewarm is not None:   # the first calls' questions, asked ahead of them on another core
                self._prewarm.ask([prewarm_problem(c, self._prewarm_sms) for c in companion])
        for c in cases:
            if companion and (self._prewarm is None or self._prewarm.idle()):
                # the companion works through the window's questions while the window runs; not while the
                # prewarm thread asks its own: at the same time, the companion's hits read 29-32 % and its
                # misses 4-6 % longer (decode, windows alternating, bench11_decode_prewarm_ab.txt)
                for x in companion:
                    self._ask_heuristic(x)
                companion = []
            rec = raw_record(c)
            records.append(rec)
            why = invalid_reason(c)
            if why:
                rec["error"] = f"invalid: {why}"
                continue
            ph = rec["probe_ms"] = {}
            t = time.perf_counter()
            pipeline = self.options.pipeline and not is_heavy(c)
            b = None   # this GEMM's, until the GEMM in flight or the window's list holds it
            try:
                b, held, finished_s = self._build(c, built, held)
                t += finished_s   # the window's GEMMs finished first: theirs (wait, profile_share), not this build's
                if pipeline:
                    est, b = self._prepare(c, b, rec, ph, t)
                    held += _nbytes(b.keep[-1:]) if b.replay else 0   # the replay's output (`_replayed`)
                    self._drain(built)
                    t = time.perf_counter()
                    self.builder.set_flags(c)
                    pending = self._start(b.fn, self._key(c, b), *self._read_estimate(est), None, case=c)
                    self._inflight, b = (rec, c, b, pending, ph), None
                    ph["time"] = round((time.perf_counter() - t) * 1e3, 3)
                    if pending.per == 1:
                        self._drain(built)   # a long GEMM: the next one is prepared on an idle GPU (see above)
                else:
                    self._drain(built)   # (pipeline) a heavy GEMM: prepared on a GPU that has finished, see above
                    est, sized_by, b, t = self._capture(c, b, rec, ph, t)
                    held += _nbytes(b.keep[-1:]) if b.replay else 0
                    _fill_timing(rec, self._end(self._start(b.fn, self._key(c, b), *est, None, is_heavy(c),
                                                            case=c, sized_by=sized_by)), b)
                    t = _lap(ph, "time", t)
                    built.append((rec, c, b))
                    b = None
            except Exception as e:  # noqa: BLE001  a failing GEMM becomes an error row, the sweep goes on
                rec["error"] = f"{type(e).__name__}: {e}".strip()[:500]
                self.torch.cuda.synchronize()
                if b is not None:
                    b.close()   # its lt descriptors, its replay's graph
                self._drain(built)
                if "out of memory" in str(e):
                    self._finish(built)
                    held = 0
                    self.builder.release_pools()
                    self.torch.cuda.empty_cache()
                continue
            if not c.grouped:   # torch's grouped GEMM asks cuBLASLt no heuristic question
                heur.append((rec, c))
            if not pipeline and self.options.candidates and c.backend == "lt":
                self._add_candidates(c, rec, ph, t)
        self._drain(built)
        self._finish(built)
        if self._prewarm is not None:
            self._prewarm.cancel()   # nothing asked while the heuristic may be timed in this process (cache off)
        for x in companion:
            self._ask_heuristic(x)
        self.time_heuristics(heur)
        self.builder.set_flags(Case("torch", "mm", "fp32", "NN", 1, 1, 1))
        return records

    def _build(self, c: Case, built: list, held: int) -> tuple[Built, int, float]:
        """Build `c` under its flags; when the window's GEMMs would pass the memory budget, finish them first.
        Returns the built GEMM, the bytes the window now holds, and the seconds spent finishing the others
        (the caller leaves them out of this GEMM's build phase: the finished GEMMs' records hold them as
        `wait` and `profile_share`; counted in both, 30 builds of the llm preset's every fourth GEMM held 2.45
        s of other GEMMs' kernel capture, and bench_sweep.py's first uses of kernels read 2.15 s for 1.96:
        bench22_llm_every4_slow_host.txt)."""
        self.builder.set_flags(c)
        b = self.builder.build(c, self.options.pooled_cupy)
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

    def _capture(self, c: Case, b: Built, rec: dict, ph: dict, t: float) -> tuple:
        """One step after another: the warm-up, the logged call and the estimating call of `c` (one call, both,
        with `logged_estimate`: `_logged_estimate`), then its replay (`_replayed`); fills `rec` and the phase
        times `ph`. Returns (the estimate: GPU µs, host µs of a call; the call that made it, `Timing.sized_by`;
        the Built to time; the phase clock). Under
        the flags of `c`: a retake of the GEMM in flight, while `_drain` waits for it, sets that GEMM's
        (`_own_flags`).

        With `logged_estimate` the host µs of a call (what the spin before a long GEMM's samples covers,
        `_start`) is the lesser of the warm-up call's and the logged call's: the logged call's alone holds the
        logger's line, and the warm-up call's a module load when it met a new kernel. Taken from the logged
        call alone, the llm preset's timing spins grew by 88 µs (median; bench21_logged_estimate_ab_v2.txt)."""
        self.builder.set_flags(c)
        h = time.perf_counter()
        for _ in range(WARM_CALLS):
            b.fn()
        warm_host = (time.perf_counter() - h) * 1e6 / max(WARM_CALLS, 1)
        key = self._key(c, b)
        if self.options.logged_estimate:
            t = _lap(ph, "build_warm", t)   # the warm-up's GPU time runs on behind the estimate's spin
            rec["log_lines"], (once, logged_host) = self._logged_estimate(b.fn, key)
            est, sized_by = (once, min(warm_host, logged_host)), "logged call"
            t = _lap(ph, "log", t)
        else:
            self.torch.cuda.synchronize()
            t = _lap(ph, "build_warm", t)
            rec["log_lines"] = self.logged_call(b.fn)
            t = _lap(ph, "log", t)
            est, sized_by = self._estimate(b.fn, key), "estimating call"   # the library's call (`_replayed`)
        b = self._replayed(c, b)
        rec["lt_config"], rec["lt_waves"] = b.lt_config, b.lt_waves
        return est, sized_by, b, t

    @staticmethod
    def _key(c: Case, b: Built) -> str:
        """Whose host time per call the spin rule learns (`_host_us`): backend and op, and how it is launched."""
        return f"{c.backend}|{c.op}|replay" if b.replay else f"{c.backend}|{c.op}"

    def _prepare(self, c: Case, b: Built, rec: dict, ph: dict, t: float) -> tuple:
        """Pipeline: the warm-up, the logged call and the estimating call of `c`, queued behind whatever the
        GPU is running (no wait); fills `rec` and `ph`; returns the queued estimate."""
        for _ in range(WARM_CALLS):
            b.fn()
        t = _lap(ph, "build_warm", t)
        rec["log_lines"] = self.logged_call(b.fn, sync=False)
        t = _lap(ph, "log", t)
        est = self._queue_estimate(b.fn, self._key(c, b))   # the library's call sizes the plan (`_replayed`)
        b = self._replayed(c, b)
        rec["lt_config"], rec["lt_waves"] = b.lt_config, b.lt_waves
        _lap(ph, "estimate", t)
        return est, b

    def _drain(self, built: list) -> None:
        """Pipeline: wait for the GEMM in flight, check and fill its timing (retaken when its evidence fails,
        under its own flags), run its candidates when asked, and add it to the window's `built`."""
        if self._inflight is None:
            return
        rec, c, b, pending, ph = self._inflight
        self._inflight = None
        t = time.perf_counter()
        try:
            self.clock.wait(pending.events.ends[-1])
            ph["wait"] = round((time.perf_counter() - t) * 1e3, 3)
            _fill_timing(rec, self._end(pending), b)
        except Exception as e:  # noqa: BLE001
            rec["error"] = f"{type(e).__name__}: {e}".strip()[:500]
            self.torch.cuda.synchronize()
        ph["time"] = round(ph.get("time", 0.0) + (time.perf_counter() - t) * 1e3, 3)
        if rec.get("error"):
            b.close()
            return
        built.append((rec, c, b))
        if self.options.candidates and c.backend == "lt":
            self._add_candidates(c, rec, ph, time.perf_counter())

    def _add_candidates(self, c: Case, rec: dict, ph: dict, t: float) -> None:
        from cublaslt_probe.candidates import compact
        try:
            rec["candidates"] = [compact(r) for r in
                                 lt_candidates(self, c, top=self.options.candidates, reps=self.options.candidate_reps)]
            _lap(ph, "candidates", t)
        except Exception as e:  # noqa: BLE001
            rec["candidates_error"] = f"{type(e).__name__}: {e}"[:300]

    def _finish(self, built) -> None:
        """Profile the built GEMMs of a window (one session), fill their kernels, release them."""
        if not built:
            return
        t = time.perf_counter()
        try:
            groups = self.profile([(lambda c=c: self.builder.set_flags(c), b.fn) for _, c, b in built])
            share = (time.perf_counter() - t) * 1e3 / len(built)
            for (rec, _, _), g in zip(built, groups):
                rec["kernels"] = [n for n, _ in g]
                rec["kernel_us"] = [d for _, d in g]
                rec["probe_ms"]["profile_share"] = round(share, 3)
        except Exception as e:  # noqa: BLE001
            for rec, _, _ in built:
                rec["error"] = rec["error"] or f"kernel capture failed: {type(e).__name__}: {e}"[:500]
        for _, _, b in built:
            b.close()
        built.clear()


# --- heuristic candidates -------------------------------------------------------------------------------------
def lt_candidates(probe: Probe, c: Case, top: int = 32, workspace_bytes: int = CUBLAS_WORKSPACE,
                  alignment: int = 16, reps: int = 10) -> list[dict]:
    """Every candidate cuBLASLt's heuristic returns for Case `c` (its cuBLAS view), each run: config,
    waves, workspace, the kernels it launched (profiler), median time (events, same method as the probe),
    and its max relative difference to candidate 0's output."""
    torch = probe.torch
    why = invalid_reason(Case("lt", c.op, c.dtype, c.layout, c.m, c.n, c.k, c.batch))
    if why:
        raise CaptureError(why)
    out: list[dict] = []
    with probe.lt_gemm(lt_problem(c, workspace_bytes, alignment)) as g:
        t0 = time.perf_counter()
        res = g.heuristic(top)
        heur_us = (time.perf_counter() - t0) * 1e6
        ref = None
        ran = []
        for rank, r in enumerate(res):
            row = {"rank": rank, **probe.lib.algo_config(r.algo), "waves": float(r.wavesCount),
                   "workspace_bytes": int(r.workspaceSize), "state": int(r.state), "heuristic_us": heur_us,
                   "error": None}
            fn = g.call(r.algo)
            try:
                g.C.fill_(float("nan"))
                fn()
                torch.cuda.synchronize()
                y = g.C.float()
                if ref is None:
                    ref = y.clone()
                row["max_rel_diff_vs_0"] = max_rel_diff(y, ref)
                row["nan"] = bool(torch.isnan(y).any().item())
                t = probe.time_gpu(fn, reps)
                row["time_us"], row["time_us_min"] = t.median_us, t.min_us
                ran.append((row, fn))
            except Exception as e:  # noqa: BLE001
                row["error"] = f"{type(e).__name__}: {e}"[:300]
                torch.cuda.synchronize()
            out.append(row)
        if ran and ran[0][0]["rank"] == 0:
            # time #0 again after the others: the spread between its two medians is the noise band's evidence
            ran[0][0]["time_us_repeat"] = probe.time_gpu(ran[0][1], reps).median_us
        if ran:
            for (row, _), kernels in zip(ran, probe.profile([fn for _, fn in ran])):
                row["kernels"] = [n for n, _ in kernels]
                row["kernel_us"] = [d for _, d in kernels]
    return out


# --- grouped GEMM alternatives --------------------------------------------------------------------------------
def time_grouped_alternatives(probe: Probe, c: Case) -> list[dict]:
    """Grouped GEMM `c` and its alternatives (`cases.grouped_alternatives`: padded groups, balanced groups, one
    batched GEMM padded to the largest group, fp8), each run through `probe.run_window` as any GEMM is, and one
    `torch.mm` per non-empty group (the eager experts' loop), timed with `probe.time_gpu` and checked against
    the grouped GEMM's own output on the same operands (`max_rel_diff`; of a split-k GEMM, the non-empty
    groups' outputs). One row per variant: its name, key, rows computed (along k for split-k), median µs,
    µs saved against the original (positive: faster), kernels, error."""
    from cublaslt_probe.cases import grouped_alternatives
    torch = probe.torch
    alts = grouped_alternatives(c)
    recs = probe.run_window(list(alts.values()))
    rows = []
    for name, alt, r in zip(alts, alts.values(), recs):
        n_rows = (alt.k * alt.batch if c.split_k else alt.m * alt.batch)
        rows.append({"variant": name, "key": r["key"], "rows": n_rows, "time_us": r["time_us"],
                     "kernels": r["kernels"], "group_summary": r.get("group_summary"), "error": r["error"]})
    b = probe.builder.build(alts["original"])
    try:
        a, w = b.keep[0], b.keep[1]
        parts, live, at = [], [], 0
        for g, n in enumerate(alts["original"].group_sizes()):
            if n:
                parts.append((a[:, at:at + n], w[at:at + n]) if c.split_k else (a[at:at + n], w[g]))
                live.append(g)
            at += n
        loop = {"variant": "mm_per_group", "key": None, "rows": c.k if c.split_k else c.m, "group_summary": None,
                "error": None}
        try:
            fn = (lambda: [torch.mm(x, y) for x, y in parts])
            ref = b.fn().float()
            if c.split_k:
                ref = ref[live]
            got = (torch.stack if c.split_k else torch.cat)([o.float() for o in fn()])
            loop["max_rel_diff"] = max_rel_diff(got, ref)
            loop["time_us"] = probe.time_gpu(fn, key="torch|mm_per_group").median_us
            loop["kernels"] = [k for k, _ in probe.profile([fn])[0]]
        except Exception as e:  # noqa: BLE001  the other variants' rows stand
            loop.update(time_us=None, kernels=[], error=f"{type(e).__name__}: {e}"[:300])
            torch.cuda.synchronize()
        rows.append(loop)
    finally:
        b.close()
    base = rows[0]["time_us"]
    for r in rows:
        r["saved_us"] = round(base - r["time_us"], 1) if base and r["time_us"] else None
    return rows
