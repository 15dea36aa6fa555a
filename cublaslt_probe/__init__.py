"""cublaslt-probe: which cuBLAS/cuBLASLt kernel runs for a GEMM, why, and what choosing it cost.

The CPU side (decoder, log parser, dataset, plots) imports without torch or cupy; only
`cublaslt_probe.gpu.lt` and `cublaslt_probe.gpu.probe` touch the GPU, and only when called.
"""
from cublaslt_probe.errors import (CaptureError, NoCudaDevice, ProbeError, SchemaError, SpecError,
                                   UnknownKernelName)

__version__ = "0.1.0"


def __getattr__(name):  # lazy: keep `import cublaslt_probe` cheap and GPU-free
    if name in ("decode", "encode", "KernelName"):
        from cublaslt_probe import names
        return getattr(names, name)
    if name == "capture":
        from cublaslt_probe.gpu.recorder import capture
        return capture
    if name in ("parse_log", "parse_cublas_log"):
        from cublaslt_probe import logs
        return getattr(logs, name)
    raise AttributeError(f"module 'cublaslt_probe' has no attribute {name!r}")


__all__ = ["capture", "decode", "encode", "KernelName", "parse_log", "parse_cublas_log", "ProbeError",
           "NoCudaDevice", "CaptureError", "UnknownKernelName", "SchemaError", "SpecError"]

