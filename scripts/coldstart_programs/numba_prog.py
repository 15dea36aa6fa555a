"""A Numba CUDA kernel for `cold-start`: compiled by Numba (NVVM, then linked) at its first launch.

    cublaslt-probe cold-start -- python scripts/coldstart_programs/numba_prog.py
"""
import math

import numpy as np
from numba import cuda


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
