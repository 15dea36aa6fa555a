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

The public interface: `Probe(ProbeOptions(...))` with `run_window(cases)` (one raw record per Case, see
`raw_record`), `time_gpu(fn)`, `profile(fns)`, `lt_gemm(problem)`, `lt_candidates(probe, case)` and `startup`
(the start-up phases, each with its time).
"""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import logging
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass

from cublaslt_probe.analysis.candidates import max_rel_diff
from cublaslt_probe.analysis.evidence import WORKSPACE_BYTES, heuristic_workspace, library_path
from cublaslt_probe.cases import Case, grouped_alternatives, invalid_reason, sizes_summary
from cublaslt_probe.dtypes import FP8_ELEMENTS, TORCH_NAMES, lt_types, output_type
from cublaslt_probe.errors import CaptureError, NoCudaDevice, OptionError, error_text
from cublaslt_probe.gpu.timing import (  # noqa: F401  (the timing method's names, imported from here by callers)
    ATTEMPTS,
    BATCH_US,
    CHEAP_SPIN,
    GAP_SLACK_US,
    GAP_US_PER_REP,
    HOST_US_GUESS,
    LOGGED_HOST_US_GUESS,
    MAX_CALLS,
    MAX_PER,
    SINGLE_US,
    SPIN_FLOOR_US,
    SPIN_MARGIN,
    SPIN_SLACK_US,
    Pending,
    Timer,
    Timing,
    covering_batch,
    enqueue_spin,
    estimate_spin,
    gpu_us_per_call,
    timing_plan,
    timing_spin,
)
from cublaslt_probe.vocab import PEAKS

log = logging.getLogger(__name__)

CUBLAS_WORKSPACE = WORKSPACE_BYTES["lt"]   # the workspace the lt backend and candidates pass (32 MiB)
HEAVY_US = 50.0                  # pipeline: a GEMM whose arithmetic takes this long at the H100/H200 SXM's
                                 # dense peak (`heavy_us`) runs one step after another
WARM_CALLS = 1                   # calls before the logged call: the first loads the kernel's module and asks the
                                 # heuristic (answered ahead by the prewarm thread when it runs); the logged call,
                                 # which is the estimating call too for a GEMM run one step after another, follows
HELPERS_FROM_GEMMS = 500         # a pipelined plan of this many GEMMs or more starts the heuristic companion and the
                                 # prewarm thread, and pays every type's set-up and CUPTI's start up front
                                 # (`uses_helpers`; docs/decisions.md, "what a probe sets up")


def require_gpu(what: str):
    try:
        import torch
    except ImportError as e:
        raise NoCudaDevice(what, "torch is not installed: pip install 'cublaslt-probe[torch]'") from e
    if not torch.cuda.is_available():
        raise NoCudaDevice(what, "torch sees no CUDA device")
    return torch


def environment(lib=None) -> dict:
    """GPU, driver and library versions: stamped on every dataset row. Read without starting anything: the
    driver's version from /proc/driver/nvidia/version (nvidia-smi where it is missing), cupy's from its
    package's metadata unless it is imported already."""
    torch = require_gpu("environment")
    props = torch.cuda.get_device_properties(0)
    env = {"gpu": props.name, "sm_count": props.multi_processor_count,
           "cc": f"{props.major}.{props.minor}", "torch_version": torch.__version__,
           "cuda_runtime": torch.version.cuda, "driver": driver_version(), "cublaslt_version": None,
           "cupy_version": cupy_version(), "cublaslt_path": None}
    if lib is not None:
        env["cublaslt_version"] = lib.version_str
        env["cublaslt_path"] = os.path.basename(lib.path)
    return env


def driver_version(proc: str = "/proc/driver/nvidia/version") -> str | None:
    """The NVIDIA driver's version ("580.159.04"): the kernel module's line of `proc`, else nvidia-smi's answer."""
    try:
        with open(proc) as f:
            m = re.search(r"Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)", f.read())
        if m:
            return m.group(1)
    except OSError:
        pass
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError, IndexError):
        return None


def cupy_version() -> str | None:
    """cupy's version: the imported module's, else its installed distribution's (cupy ships as `cupy` or a
    CUDA-specific `cupy-cuda12x`-like name), None when it is not installed. Importing cupy takes a second."""
    mod = sys.modules.get("cupy")
    if mod is not None:
        return getattr(mod, "__version__", None)
    from importlib import metadata
    for name in ("cupy-cuda13x", "cupy-cuda12x", "cupy", "cupy-cuda11x"):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    try:
        names = metadata.packages_distributions().get("cupy") or []
        return metadata.version(names[0]) if names else None
    except (metadata.PackageNotFoundError, OSError, ValueError):
        return None


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
    space_s: float = 0.0            # lt backend: also search the whole algo space within this many s (0: no)
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
        if isinstance(self.space_s, bool) or not isinstance(self.space_s, (int, float)) or not self.space_s >= 0:
            raise OptionError(f"probe option space_s={self.space_s!r}: expected a number of seconds >= 0")
        for name in (f.name for f in dataclasses.fields(self) if f.type in ("bool", bool)):   # every switch
            if not isinstance(getattr(self, name), bool):
                raise OptionError(f"probe option {name}={getattr(self, name)!r}: expected True or False")


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
    from cublaslt_probe.gpu import lt
    bl = c.blas
    return lt.Problem(bl["blas_m"], bl["blas_n"], bl["blas_k"], dtype=c.dtype, trans_a=bl["blas_trans_a"],
                      trans_b=bl["blas_trans_b"], batch=c.batch, bias=c.op == "addmm",
                      workspace_bytes=workspace_bytes, alignment=alignment,
                      b_type=lt_types(c.dtype)[1])


def current_stream(torch, device: int | None = None) -> int:
    """The raw handle (`cudaStream_t` as an int) of torch's current CUDA stream on `device` (the current device
    when None), from `torch._C._cuda_getCurrentRawStream`, which Inductor's generated code calls before every
    launch. `torch.cuda.current_stream()` makes a Stream object through torch's device checks, several times
    the host time of the raw lookup (docs/decisions.md, "Timing events through the driver")."""
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
        from cublaslt_probe.gpu import lt
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
    replay: bool = False  # fn replays the library's launches for one call (`Probe._replayed`)
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
    found when the first lt-backend Case is built if none is given. The operands are views of one random
    buffer per dtype (`_operands`), made with the first GEMM of that dtype (a phase of `startup`, when given:
    the first uses of the fill and of the conversion to the dtype are paid there, not in that GEMM's build);
    the lt backend's workspace with the first lt GEMM."""

    POOL_ALIGN = 1024   # elements: every operand of the pool starts on a boundary at least as wide as an
                        # allocation's (so the library sees the alignment a fresh tensor has)

    def __init__(self, lib=None, startup=None):
        import torch
        self.torch = torch
        self.lib = lib
        self._startup = startup or (lambda name: contextlib.nullcontext())
        self._ws = None
        self._pools: dict[str, object] = {}   # dtype -> a 1-D buffer of random values the operands are views of
        self._made: set[str] = set()          # dtypes whose pool was made once (a phase of the start-up)
        self._blas: dict[str, object] = {}    # set_flags: library name -> torch's value for it

    @property
    def pools(self) -> tuple[str, ...]:
        """The dtypes whose operand pool exists."""
        return tuple(self._pools)

    @property
    def ws(self):
        """The lt backend's workspace (CUBLAS_WORKSPACE bytes), made when first needed."""
        if self._ws is None:
            self._ws = self.torch.empty(CUBLAS_WORKSPACE, dtype=self.torch.uint8, device="cuda")
        return self._ws

    def _pool(self, dtype: str, numel: int):
        """The random buffer of `dtype` with at least `numel` elements: grown (doubled at least) when too small;
        GEMMs built from the smaller one keep it alive until they are released."""
        t = self.torch
        pool = self._pools.get(dtype)
        if pool is None or pool.numel() < numel:
            n = max(numel, 2 * pool.numel() if pool is not None else 0, 1 << 20)
            first = pool is None and dtype not in self._made
            with self._startup(f"operand pool {dtype} (first needed)") if first else contextlib.nullcontext():
                pool = t.randn(n, device="cuda", dtype=t.float32).to(getattr(t, TORCH_NAMES[dtype]))
            self._pools[dtype] = pool
            self._made.add(dtype)
        return pool

    def release_pools(self) -> None:
        """Drop the random buffers (after an out-of-memory error); they are made again when needed."""
        self._pools.clear()

    def _operands(self, dtype: str, *shapes):
        """Torch operands of `dtype`, one per (rows, cols, transposed, batch): views of one random buffer at
        aligned offsets (no allocation or fill per GEMM); each of logical shape (rows, cols), stored transposed
        when asked (`operand_view`), made by one `as_strided` each: one torch call per operand, where a slice, a
        view and a transpose would be three."""
        views, at = [], 0
        for rows, cols, transposed, batch in shapes:
            views.append(operand_view(rows, cols, transposed, batch, at))
            at += -(-batch * rows * cols // self.POOL_ALIGN) * self.POOL_ALIGN
        pool = self._pool(dtype, at)
        return [pool.as_strided(size, stride, offset) for size, stride, offset in views]

    def set_flags(self, c: Case) -> None:
        """torch's flags for `c`: TF32 for the tf32 dtype only; for the torch paths, the BLAS library. Each is
        read first and set only when it differs (a set costs several times a read): the
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

    def build(self, c: Case) -> Built:
        if c.backend in ("torch", "torch-lt"):
            return self._torch(c)
        if c.backend == "cupy":
            return self._cupy(c)
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

    def _cupy(self, c: Case) -> Built:
        """cupy's GEMM of `c`. Its operands are views of the pool torch's are taken from (`_operands`), made
        cupy arrays without a copy (`__cuda_array_interface__`, version 2: no stream to wait for) and laid out
        as fresh arrays are (docs/decisions.md, "cupy's operands")."""
        import cupy as cp
        a, b = self._operands(c.dtype, (c.m, c.k, c.layout[0] == "T", c.batch),
                              (c.k, c.n, c.layout[1] == "T", c.batch))
        a, b = cp.asarray(a), cp.asarray(b)
        return Built(lambda: cp.matmul(a, b), (a, b))

    def _lt(self, c: Case) -> Built:
        if self.lib is None:
            from cublaslt_probe.gpu import lt
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


# --- kernels ------------------------------------------------------------------------------------------------------
def profile_kernels(torch, calls, marker) -> list[list[tuple[str, float]]]:
    """Run `calls` (zero-argument callables, or (setup, fn) pairs whose setup runs first) under CUPTI's activity
    API (`cupti.Activity`); the kernels each launched, in launch order, as (name, µs), named as torch.profiler
    names them (`split_by_marker`)."""
    from cublaslt_probe.gpu.cupti import activity
    rec = activity()
    rec.start()
    try:
        run_marked(torch, calls, marker)
    finally:
        evs = rec.stop()
    return split_by_marker(evs, len(calls))


def run_marked(torch, calls, marker) -> None:
    """Run `calls` ((setup, fn) pairs or callables), filling `marker` (a 1-element int8 CUDA tensor) on the same
    stream before each and once after the last, then wait for the GPU: the marker's kernels split the kernel
    stream per call."""
    for call in calls:
        setup, fn = call if isinstance(call, tuple) else (None, call)
        if setup is not None:
            setup()
        marker.fill_(1)
        fn()
    marker.fill_(1)
    torch.cuda.synchronize()


def split_by_marker(evs: list, n: int) -> list[list[tuple[str, float]]]:
    """The GPU's (start, name, µs) events of a `run_marked` of `n` calls, in start order, split at the marker's
    kernel (the first event) into the (name, µs) of each call."""
    if not evs:
        raise CaptureError("CUPTI recorded no kernels for the capture's calls (the marker's neither): is another "
                           "profiler attached?")
    name = evs[0][1]
    groups: list[list[tuple[str, float]]] = []
    for _, kernel, dur in evs:
        if kernel == name:
            groups.append([])
        elif groups:
            groups[-1].append((kernel, dur))
    groups = groups[:-1]  # the closing marker opens an empty group
    if len(groups) != n:
        raise CaptureError(f"split the kernel stream into {len(groups)} groups for {n} GEMMs: "
                           "another stream or process launched kernels inside the window")
    return groups


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
    too few. Pinned so, none shares a core with another or with another slot's: unpinned, the
    companion's heuristic misses read longer than the probe's own, and two probes on one host slow each other. Taken
    among the CPUs `local` to the probe's GPU (`gpu_local_cpus`) when they hold the
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


def heuristic_groups(items, workspace_of) -> tuple[dict, dict]:
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
    end of the window. Its cuBLASLt is another instance of the same library file (`path`, loaded without
    torch), on the same GPU, so a miss costs what it costs torch, and switching its cache off leaves torch's
    alone."""

    START_S = 120.0   # a companion not ready by then (loading cuBLASLt, paying its set-ups) is given up

    def __init__(self, cpu: int | None = None, path: str | None = None):
        import multiprocessing
        ctx = multiprocessing.get_context("spawn")  # never fork a process holding a CUDA context
        self.conn, child = ctx.Pipe()
        from cublaslt_probe.gpu import lt
        self.proc = ctx.Process(target=lt.serve_heuristics, args=(child, cpu, path), daemon=True,
                                name="cublaslt-probe-heuristics")
        self.proc.start()
        child.close()
        self.started = time.perf_counter()
        self.ready: str | None = None
        self.ready_after_s: float | None = None   # from its spawn to its "ready"
        self.asked: set = set()       # questions asked and not yet collected
        self.answers: dict = {}       # key -> (miss_us, hit_us, error, busy_s)

    def poll_ready(self) -> bool:
        """Is the companion ready (its library loaded, its set-ups paid)? Never waits; raises CaptureError when
        it could not start, or is not ready START_S after its spawn."""
        if self.ready is None:
            if self.conn.poll():
                self.wait_ready()
            elif time.perf_counter() - self.started > self.START_S:
                raise CaptureError(f"the heuristic companion was not ready after {self.START_S:.0f} s")
        return self.ready is not None

    def wait_ready(self) -> None:
        """Wait until the companion has loaded its library and paid its set-ups (`lt.set_up`)."""
        if self.ready is not None:
            return
        if not self.conn.poll(max(0.0, self.START_S - (time.perf_counter() - self.started))):
            raise CaptureError(f"the heuristic companion was not ready after {self.START_S:.0f} s")
        try:
            state, what = self.conn.recv()
        except (EOFError, OSError) as e:
            raise CaptureError(f"the heuristic companion ended before it was ready ({e!r})") from e
        if state != "ready":
            raise CaptureError(f"the heuristic companion could not start: {what}")
        self.ready = what
        self.ready_after_s = time.perf_counter() - self.started

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
    A heuristic miss is most of a fresh GEMM's first call on the host; a hit costs a few µs
    (docs/decisions.md, "The prewarm thread").
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
    rec: dict
    case: Case
    built: Built
    pending: Pending
    phases: dict


class Probe:
    """Runs windows of Cases and returns one raw record (a dict) per Case. One per process.

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

    def time_heuristics(self, items: list[tuple[dict, Case]]) -> None:
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
                rec["heuristic_miss_us"], rec["heuristic_hit_us"] = miss, hit
                rec["heuristic_shared"] = len(groups[key])
                rec["heuristic_where"] = where
                if err:
                    rec["heuristic_error"] = err
        share = round((time.perf_counter() - t) * 1e3 / len(items), 3)
        for rec, _ in items:
            rec.setdefault("probe_ms", {})["heuristic_share"] = share

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
        """One raw record per Case (`_run_window`), on the probe's own stream (the legacy default stream cannot
        be captured: `_replayed`), with Python's garbage collector off while the window runs (as `timeit`
        times; docs/decisions.md, "the garbage collector"). It is switched back on at the window's end."""
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
        """One raw record per Case. Kernel names are captured for the window in one CUPTI session;
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
        records: list[dict] = []
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
            rec = raw_record(c)
            records.append(rec)
            why = invalid_reason(c)
            if why:
                rec["error"] = f"invalid: {why}"
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
        return records

    def _run_one(self, c: Case, rec: dict, win: "_Window") -> bool:
        """Build, warm, log and time `c` into `rec` (pipelined: queued, its timing read by the next `_drain`).
        False when it failed (its record holds the error; after an out-of-memory error the window's GEMMs
        are finished and the pools released)."""
        ph = rec["probe_ms"] = {}
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
                est, b, t = self._capture(c, b, rec, ph, t)
                win.held += _nbytes(b.keep[-1:]) if b.replay else 0
                _fill_timing(rec, self.timer.end(self.timer.start(
                    b.fn, self._key(c, b), *est, None, is_heavy(c), setup=self._own_flags(c),
                    sized_by="logged call")), b)
                t = _lap(ph, "time", t)
                win.built.append((rec, c, b))
                b = None
        except Exception as e:  # noqa: BLE001  a failing GEMM becomes an error row, the sweep goes on
            rec["error"] = error_text(e)
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
        if not pipeline and self.options.space_s and c.backend == "lt":
            self._add_space(c, rec)
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

    def _capture(self, c: Case, b: Built, rec: dict, ph: dict, t: float) -> tuple:
        """One step after another: the warm-up of `c`, then one call that is both its logged call and its
        estimating call (`_logged_estimate`), then its replay (`_replayed`); fills `rec` and the phase times
        `ph`. Returns (the estimate: GPU µs, host µs of a call; the Built to time; the phase clock). Under the
        flags of `c`: a retake of the GEMM in flight, while `_drain` waits for it, sets that GEMM's.

        The host µs of a call (what the spin before a long GEMM's samples covers, `Timer.start`) is the lesser
        of the warm-up call's and the logged call's: the logged call's alone holds the logger's line, and the
        warm-up call's a module load when it met a new kernel (docs/decisions.md, "the logged call sizes")."""
        self.builder.set_flags(c)
        h = time.perf_counter()
        for _ in range(WARM_CALLS):
            b.fn()
        warm_host = (time.perf_counter() - h) * 1e6 / max(WARM_CALLS, 1)
        t = _lap(ph, "build_warm", t)   # the warm-up's GPU time runs on behind the estimate's spin
        rec["log_lines"], (once, logged_host) = self._logged_estimate(b.fn, self._key(c, b))
        t = _lap(ph, "log", t)
        b = self._replayed(c, b)
        rec["lt_config"], rec["lt_waves"] = b.lt_config, b.lt_waves
        return (once, min(warm_host, logged_host)), b, t

    @staticmethod
    def _key(c: Case, b: Built) -> str:
        """Whose host time per call the spin rule learns (`Timer.host_us`): backend and op, and how it is
        launched."""
        return f"{c.backend}|{c.op}|replay" if b.replay else f"{c.backend}|{c.op}"

    def _prepare(self, c: Case, b: Built, rec: dict, ph: dict, t: float) -> tuple:
        """Pipeline: the warm-up, the logged call and the estimating call of `c`, queued behind whatever the
        GPU is running (no wait; the estimate without its spin while the GEMM in flight's batches cover it:
        `Timer.queue_estimate`); fills `rec` and `ph`; returns the queued estimate."""
        for _ in range(WARM_CALLS):
            b.fn()
        t = _lap(ph, "build_warm", t)
        rec["log_lines"] = self.logged_call(b.fn, sync=False)
        t = _lap(ph, "log", t)
        behind = self._inflight.pending if self._inflight is not None else None
        est = self.timer.queue_estimate(b.fn, self._key(c, b), behind=behind)   # the library's call sizes the plan
        b = self._replayed(c, b)
        rec["lt_config"], rec["lt_waves"] = b.lt_config, b.lt_waves
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
            f.rec["error"] = error_text(e)
            self.torch.cuda.synchronize()
        f.phases["time"] = round(f.phases.get("time", 0.0) + (time.perf_counter() - t) * 1e3, 3)
        if f.rec.get("error"):
            f.built.close()
            return
        built.append((f.rec, f.case, f.built))
        if self.options.candidates and f.case.backend == "lt":
            self._add_candidates(f.case, f.rec, f.phases, time.perf_counter())
        if self.options.space_s and f.case.backend == "lt":
            self._add_space(f.case, f.rec)

    def _add_space(self, c: Case, rec: dict) -> None:
        """The whole algo space of lt-backend `c` (`gpu.space.search`) into its record's `space`."""
        from cublaslt_probe.gpu import space
        try:
            rec["space"] = space.search(self, c, budget_s=self.options.space_s)
        except Exception as e:  # noqa: BLE001  the GEMM's own measurement stands
            rec["space"] = {"error": error_text(e)}
            self.torch.cuda.synchronize()

    def _add_candidates(self, c: Case, rec: dict, ph: dict, t: float) -> None:
        from cublaslt_probe.analysis.candidates import compact
        try:
            rec["candidates"] = [compact(r) for r in
                                 lt_candidates(self, c, top=self.options.candidates, reps=self.options.candidate_reps)]
            _lap(ph, "candidates", t)
        except Exception as e:  # noqa: BLE001
            rec["candidates_error"] = error_text(e)

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
                rec["error"] = rec["error"] or f"kernel capture failed: {error_text(e)}"
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


# --- heuristic candidates -------------------------------------------------------------------------------------
def lt_candidates(probe: Probe, c: Case, top: int = 32, workspace_bytes: int = CUBLAS_WORKSPACE,
                  alignment: int = 16, reps: int = 10, trust_rounds: int = 5) -> list[dict]:
    """Every candidate cuBLASLt's heuristic returns for Case `c` (its cuBLAS view), each run: config,
    waves, workspace, the kernels it launched (CUPTI), median time (events, same method as the probe),
    its max relative difference to candidate 0's output and its numerics against a float64 reference
    (`gpu.numerics`: numerics_ok, error_ratio). Candidate 0's row holds the regret's trust model
    (`gpu.space.trust_candidates`: the pick and the fastest correct candidates in `trust_rounds` interleaved
    rounds) under `trust`."""
    from cublaslt_probe.gpu import numerics, space
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
        ref64, absprod = numerics.reference(torch, g.p, g.A, g.B)
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
                num = numerics.check(torch, g.p, g.C, ref64, absprod, split_k=row.get("split_k") or 1,
                                     reduction_in_output_type=row.get("reduction_scheme") == "OUTPUT_TYPE")
                row["numerics_ok"], row["error_ratio"] = num["numerics_ok"], num["error_ratio"]
                t = probe.time_gpu(fn, reps)
                row["time_us"], row["time_us_min"] = t.median_us, t.min_us
                ran.append((row, fn))
            except Exception as e:  # noqa: BLE001
                row["error"] = error_text(e)
                torch.cuda.synchronize()
            out.append(row)
        if ran and ran[0][0]["rank"] == 0:
            # time #0 again after the others: the spread between its two medians is the noise band's evidence
            ran[0][0]["time_us_repeat"] = probe.time_gpu(ran[0][1], reps).median_us
            if trust_rounds:
                ran[0][0]["trust"] = space.trust_candidates(probe, ran, c.dtype, trust_rounds)
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
            loop.update(time_us=None, kernels=[], error=error_text(e))
            torch.cuda.synchronize()
        rows.append(loop)
    finally:
        b.close()
    base = rows[0]["time_us"]
    for r in rows:
        r["saved_us"] = round(base - r["time_us"], 1) if base and r["time_us"] else None
    return rows

