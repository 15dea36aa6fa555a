"""CuPy program for `cold-start`: an ElementwiseKernel, a RawKernel and a matmul, compiled by CuPy with NVRTC.

    cublaslt-probe cold-start -- python scripts/coldstart_programs/cupy_prog.py
"""
import cupy as cp

SRC = r'''
extern "C" __global__ void coldstart_scale_shift(const float* x, float* y, float a, float b, int n) {
    int i = blockDim.x * blockIdx.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + b;
}
'''


def make_step():
    n = 1 << 22
    x = cp.random.standard_normal(n, dtype=cp.float32)  # CuPy's own random kernels compile in the setup
    y = cp.empty_like(x)
    a = cp.random.standard_normal((2048, 2048), dtype=cp.float32)
    cp.cuda.Device().synchronize()
    gelu = cp.ElementwiseKernel("float32 x", "float32 y",
                                "y = 0.5f * x * (1.0f + tanhf(0.7978845608f * (x + 0.044715f * x * x * x)))",
                                "coldstart_gelu")
    raw = cp.RawKernel(SRC, "coldstart_scale_shift")

    def step():
        gelu(x, y)
        raw(((n + 255) // 256,), (256,), (y, y, cp.float32(2.0), cp.float32(1.0), cp.int32(n)))
        (a @ a).sum()
        cp.cuda.Device().synchronize()
    return step
