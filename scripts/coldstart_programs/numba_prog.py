"""A Numba CUDA kernel for `cold-start`: compiled by Numba (NVVM, then linked) at its first launch.

    cublaslt-probe cold-start -- python scripts/coldstart_programs/numba_prog.py
"""
import math

import numpy as np

# numba-cuda 0.30.4 registers an overload of np.row_stack when it compiles its first kernel, and numpy 2.5
# removed np.row_stack (an alias of np.vstack): without this alias every compile fails with AttributeError.
# The alias is the program's, so the tool is measured on a program that runs; it leaves numpy as it is where
# row_stack exists.
if not hasattr(np, "row_stack"):
    np.row_stack = np.vstack

from numba import cuda  # noqa: E402


@cuda.jit
def coldstart_saxpy_tanh(a, x, y, out):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = math.tanh(a * x[i] + y[i])


def make_step():
    n = 1 << 22
    x = cuda.to_device(np.random.default_rng(0).standard_normal(n).astype(np.float32))
    y = cuda.to_device(np.random.default_rng(1).standard_normal(n).astype(np.float32))
    out = cuda.device_array_like(x)
    cuda.synchronize()

    def step():
        coldstart_saxpy_tanh[(n + 255) // 256, 256](np.float32(2.0), x, y, out)
        cuda.synchronize()
    return step
