"""cublaslt-probe: which cuBLAS/cuBLASLt kernel runs for a GEMM, why, and what choosing it cost.

The CPU side (names, logs, sweep planning, analysis, render, cli and the shared vocabulary beside this file)
imports without torch or cupy; only the modules of `cublaslt_probe.gpu` touch the GPU (torch, cupy, ctypes to the
CUDA libraries), and only when called. `capture`, `prove` and `pin_linear` are the GPU entry points a program
calls, `cold_start_step` marks a step of a script `cold-start` runs (a no-op elsewhere); `decode`, `encode`,
`parse_log` and `parse_cublas_log` run anywhere. docs/architecture.md maps every module.
"""
from cublaslt_probe.errors import CaptureError, NoCudaDevice, ProbeError, SchemaError, SpecError, UnknownKernelName

__version__ = "0.1.0"


def __getattr__(name):  # lazy: keep `import cublaslt_probe` cheap and GPU-free
    if name in ("decode", "encode", "KernelName"):
        from cublaslt_probe import names
        return getattr(names, name)
    if name == "capture":
        from cublaslt_probe.gpu.recorder import capture
        return capture
    if name == "prove":
        from cublaslt_probe.gpu.prove import prove_run
        return prove_run
    if name == "cold_start_step":
        from cublaslt_probe.gpu.coldstart_step import cold_start_step
        return cold_start_step
    if name == "pin_linear":
        from cublaslt_probe.gpu.pin import pin_linear
        return pin_linear
    if name in ("parse_log", "parse_cublas_log"):
        from cublaslt_probe import logs
        return getattr(logs, name)
    raise AttributeError(f"module 'cublaslt_probe' has no attribute {name!r}")


__all__ = ["capture", "prove", "pin_linear", "cold_start_step", "decode", "encode", "KernelName", "parse_log",
           "parse_cublas_log", "ProbeError",
           "NoCudaDevice", "CaptureError", "UnknownKernelName", "SchemaError", "SpecError"]

