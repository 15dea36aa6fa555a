"""A plain @triton.jit kernel (no torch.compile) next to a torch matmul, for `cold-start`.

    cublaslt-probe cold-start -- python scripts/coldstart_programs/triton_prog.py
"""
import torch
import triton
import triton.language as tl


@triton.jit
def coldstart_fused_add_relu(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, tl.maximum(x + y, 0.0), mask=mask)


def make_step():
    x = torch.randn(1 << 22, device="cuda")
    y = torch.randn_like(x)
    out = torch.empty_like(x)
    a = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)

    def step():
        n = x.numel()
        coldstart_fused_add_relu[(triton.cdiv(n, 1024),)](x, y, out, n, BLOCK=1024)
        a @ a
    return step
