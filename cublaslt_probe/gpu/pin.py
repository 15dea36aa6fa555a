"""A cuBLASLt algo pinned on an `nn.Linear`'s forward: the way to apply a pin on torch versions whose TunableOp
cannot (torch 2.11 takes no cuBLASLt candidates; TunableOp on CUDA does from torch 2.14, and never inside a CUDA
graph's capture).

`pin_linear(module, algo, tokens=...)` replaces the module's forward with one that runs `y = x W^T (+ b)` as the
cuBLASLt matmul torch itself would issue (column-major m = out features, n = tokens, k = in features, A = W
transposed, B = x; the bias through the BIAS epilogue), with the pinned algo config, on torch's current stream, its
workspace from torch's caching allocator, through the libcublasLt instance torch loaded (`gpu.lt`: ctypes, because
the pin must run in the very library instance, handle and heuristics cache torch uses). Nothing syncs the host, so
the forward can be captured in a CUDA graph; in code torch.compile traces the matmul is a torch.library custom op,
so torch.compile (reduce-overhead included) keeps it whole instead of tracing into ctypes. Calls whose problem is
not the pinned one (another token count, a non-contiguous input, another dtype or device) run the module's own
forward. The backward is torch's (`grad_x = grad_y W`, `grad_W = grad_yᵀ x`), so a pin changes the forward GEMM
only.

Limits: inputs must be contiguous in their last dimension and 16-byte aligned (torch's allocations are); the
algo must be valid for the problem (`cublasLtMatmulAlgoCheck` is asked once, at pinning); the pinned forward
costs host time per call more than torch's (the ctypes call): benchmarks/bench_pin_overhead.py measures it, A/B in
one process (docs/prove.md has the figures).
"""
from __future__ import annotations

import itertools

from cublaslt_probe.errors import CaptureError

TORCH_DTYPES = {"torch.bfloat16": "bf16", "torch.float16": "fp16", "torch.float32": "fp32"}
_LIB: dict = {}


def problem_dtype(torch, dtype) -> str | None:
    """The project's dtype name of a torch GEMM on tensors of `dtype`: fp32 is tf32 where torch allows TF32
    matmuls (torch.backends.cuda.matmul.allow_tf32); None for a dtype without a cuBLASLt problem here."""
    name = TORCH_DTYPES.get(str(dtype))
    return "tf32" if name == "fp32" and torch.backends.cuda.matmul.allow_tf32 else name


def _library():
    from cublaslt_probe.gpu import lt
    if "lib" not in _LIB:
        _LIB["lib"] = lt.LtLibrary()
    return _LIB["lib"]


class PinnedLinear:
    """The pinned forward of one `nn.Linear` (see the module doc); `remove()` gives the module its own forward
    back."""

    def __init__(self, module, algo: dict, tokens: int, dtype: str | None = None):
        import torch

        from cublaslt_probe.gpu import lt
        self.torch, self.module, self.tokens = torch, module, int(tokens)
        w = module.weight
        self.dtype = dtype or problem_dtype(torch, w.dtype)
        if self.dtype is None:
            raise CaptureError(f"pin_linear: weight dtype {w.dtype} has no cuBLASLt problem here (bf16, fp16, fp32)")
        self.lib = _library()
        self.problem = lt.Problem(m=module.out_features, n=self.tokens, k=module.in_features, dtype=self.dtype,
                                  trans_a="T", trans_b="N", bias=module.bias is not None,
                                  workspace_bytes=int(algo.get("workspace_bytes") or 0))
        self.mm = lt.LtMatmul(self.lib, self.problem)
        self.algo = lt.pinned_algo(self.lib, self.problem, int(algo["algo_id"]),
                                   {k: algo.get(k) for k in ("tile", "stages", "cluster", "split_k",
                                                             "reduction_scheme", "custom_option",
                                                             "cta_swizzling", "inner_shape")})
        self.workspace = max(int(algo.get("workspace_bytes") or 0), self._check())
        self.key = next(_KEYS)
        _PINS[self.key] = self
        self._fn = _pinned_function(torch)
        self._op = _op(torch)
        self.attach()

    def _check(self) -> int:
        """`lt.algo_check` of the pinned algo on the problem: the workspace it needs (bytes)."""
        from cublaslt_probe.gpu import lt
        st, res = lt.algo_check(self.mm, self.algo)
        if st:
            self.mm.close()
            raise CaptureError(f"pin_linear: the algo is not valid for {self.problem.m}x{self.problem.n}x"
                               f"{self.problem.k} {self.dtype} (cublasLtMatmulAlgoCheck status {st}): pin a "
                               "candidate measured for this GEMM")
        return int(res.workspaceSize)

    def matches(self, x) -> bool:
        w = self.module.weight
        return (x.dim() >= 2 and x.is_cuda and x.dtype == w.dtype and x.shape[-1] == self.problem.k
                and x.numel() // x.shape[-1] == self.tokens and x.is_contiguous() and w.is_contiguous())

    def launch(self, x, out) -> None:
        """cublasLtMatmul with the pinned algo: out[tokens, m] = x W^T (+ b), on torch's current stream."""
        torch = self.torch
        b = self.module.bias
        ws = torch.empty(max(self.workspace, 1), dtype=torch.uint8, device=x.device)
        if b is not None:
            self.mm.set_pointers(bias=b.data_ptr())
        self.mm.run(self.algo, self.module.weight.data_ptr(), x.data_ptr(), out.data_ptr(), ws.data_ptr(),
                    self.workspace, torch.cuda.current_stream(x.device).cuda_stream)

    def forward(self, x):
        if not self.matches(x):
            return type(self.module).forward(self.module, x)
        w, b = self.module.weight, self.module.bias
        if self.torch.compiler.is_compiling():
            return self._op(x, w, b, self.key)
        return self._fn.apply(x, w, b, self)   # eager: an autograd.Function costs less host time than the op

    def attach(self) -> None:
        """The pinned forward on the module (again). The same bound method every time, so a compiled program
        that saw it once finds its compiled code again instead of compiling anew."""
        self.module.forward = self.forward

    def detach(self) -> None:
        """The module's own forward back; the pin stays ready to `attach` again."""
        if self.module.__dict__.get("forward") == self.forward:
            del self.module.forward

    def remove(self) -> None:
        """`detach`, and the pin's cuBLASLt objects freed (idempotent)."""
        self.detach()
        if _PINS.pop(self.key, None) is not None:
            self.mm.close()


_PINS: dict[int, PinnedLinear] = {}
_KEYS = itertools.count(1)


def _backward(ctx, gy):
    """torch's backward of `y = x Wᵀ (+ b)`: the pin changes the forward GEMM only."""
    x, w = ctx.saved_tensors
    g2 = gy.reshape(-1, gy.shape[-1])
    gx = (gy @ w) if ctx.needs_input_grad[0] else None
    gw = (g2.t() @ x.reshape(-1, x.shape[-1])) if ctx.needs_input_grad[1] else None
    gb = g2.sum(0) if ctx.has_b and ctx.needs_input_grad[2] else None
    return gx, gw, gb, None


def _pinned_function(torch):
    """The pinned matmul as an autograd.Function (eager calls: its dispatch costs less host time than the
    custom op's); defined once per process."""
    if "fn" in _LIB:
        return _LIB["fn"]

    class Pinned(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, b, pin):
            out = torch.empty((*x.shape[:-1], w.shape[0]), dtype=x.dtype, device=x.device)
            pin.launch(x, out)
            ctx.save_for_backward(x, w)
            ctx.has_b = b is not None
            return out

        backward = staticmethod(_backward)

    _LIB["fn"] = Pinned
    return Pinned


def _op(torch):
    """The pinned matmul as one torch.library custom op, ``cublaslt_probe::pinned_linear(x, w, b, pin)``
    (defined once per process; `pin` keys the live pins), for the code torch.compile traces: torch.compile and
    CUDA-graph trees see an opaque op with a shape function and a registered backward instead of tracing into
    ctypes (a graph break, and a `torch.Stream` without a CUDA handle inside the traced code), so a pin applies
    under ``torch.compile``, reduce-overhead included."""
    if "op" in _LIB:
        return _LIB["op"]

    @torch.library.custom_op("cublaslt_probe::pinned_linear", mutates_args=(),
                             schema="(Tensor x, Tensor w, Tensor? b, int pin) -> Tensor")
    def pinned_linear(x, w, b, pin):
        out = torch.empty((*x.shape[:-1], w.shape[0]), dtype=x.dtype, device=x.device)
        _PINS[pin].launch(x, out)
        return out

    @pinned_linear.register_fake
    def _(x, w, b, pin):
        return x.new_empty((*x.shape[:-1], w.shape[0]))

    def setup_context(ctx, inputs, output):
        x, w, b, _pin = inputs
        ctx.save_for_backward(x, w)
        ctx.has_b = b is not None

    pinned_linear.register_autograd(_backward, setup_context=setup_context)
    _LIB["op"] = pinned_linear
    return pinned_linear


def pin_linear(module, algo: dict, *, tokens: int) -> PinnedLinear:
    """Pins `algo` (a candidate's config: ``algo_id``, ``tile``, ``stages``, ``cluster``, ``split_k``,
    ``reduction_scheme``, ``custom_option``, ``cta_swizzling``, ``workspace_bytes``, as `candidates` and the
    saved measurement give them) on `module`'s forward for inputs of `tokens` rows; returns the pin, whose
    `remove()` undoes it. Raises CaptureError when the algo is not valid for the problem."""
    return PinnedLinear(module, algo, tokens)
