"""A Numba step that is the program's first use of Numba's CUDA target: its context and first transfers happen
inside step 1 (for `cold-start`'s preinit run, which makes them apart and times them).

    cublaslt-probe cold-start -- python scripts/coldstart_programs/numba_first_use_prog.py
"""
import numpy as np

# numba-cuda 0.30.4 needs np.row_stack, which numpy 2.5 removed (see numba_prog.py)
if not hasattr(np, "row_stack"):
    np.row_stack = np.vstack

from numba import cuda  # noqa: E402


@cuda.jit
def coldstart_scale(x, out):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = 2.0 * x[i]


def step():
    x = cuda.to_device(np.ones(1 << 20, np.float32))
    out = cuda.device_array_like(x)
    coldstart_scale[(x.size + 255) // 256, 256](x, out)
    cuda.synchronize()
