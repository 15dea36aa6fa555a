"""Building one GEMM as a zero-argument callable: the operands (views of one random buffer per dtype), the
cuBLASLt problem of a Case (`lt_problem`), a direct cuBLASLt call (`LtGemm`), and the `Builder` that makes a
Case's call on its backend (`Built`). torch and cupy are imported inside functions."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

from cublaslt_probe.analysis.evidence import WORKSPACE_BYTES
from cublaslt_probe.cases import Case
from cublaslt_probe.dtypes import FP8_ELEMENTS, TORCH_NAMES, lt_types, output_type
from cublaslt_probe.errors import CaptureError

CUBLAS_WORKSPACE = WORKSPACE_BYTES["lt"]   # the workspace the lt backend and candidates pass (32 MiB)


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
