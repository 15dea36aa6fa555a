"""The `numpy` backend's executor: the plan's numpy GEMMs run as real matmuls on the CPU with host timing
(no kernels, no logs), records of the probe's shape, so a sweep's planning, slices, raw files, resume and
merge run on any machine."""
from __future__ import annotations

import time

from cublaslt_probe.cases import Case
from cublaslt_probe.sweep.spec import numpy_invalid


# --- a CPU executor that really runs (numpy): tests the machinery without a GPU --------------------------------
class NumpyExecutor:
    """Runs Cases with backend `numpy` on the CPU: real matmuls, host timing, no kernels or logs."""

    def __init__(self, reps: int = 3, fail_keys: set[str] | None = None, stop_after: int | None = None):
        import numpy as np
        self.np = np
        self.reps = reps
        self.env = {"gpu": "cpu (numpy)", "sm_count": None, "driver": None, "cuda_runtime": None,
                    "cublaslt_version": None, "torch_version": None, "cupy_version": None,
                    "numpy_version": np.__version__}
        self.fail_keys = fail_keys or set()
        self.stop_after = stop_after   # simulate a kill: raise KeyboardInterrupt after this many windows
        self.windows = 0

    def run_window(self, cases: list[Case]) -> list[dict]:
        if self.stop_after is not None and self.windows >= self.stop_after:
            raise KeyboardInterrupt("simulated kill")
        self.windows += 1
        np = self.np
        out = []
        for c in cases:
            rec = {"key": c.key, **c.as_dict(), **c.blas, "kernels": [], "kernel_us": [], "log_lines": [],
                   "time_us": None, "heuristic_miss_us": None, "heuristic_hit_us": None, "error": None}
            why = numpy_invalid(c)
            if why or c.key in self.fail_keys:
                rec["error"] = why or "simulated failure"
                out.append(rec)
                continue
            dt = np.float32 if c.dtype == "fp32" else np.float16
            rng = np.random.default_rng(0)
            shape_a = (c.batch, c.m, c.k) if c.op == "bmm" else (c.m, c.k)
            shape_b = (c.batch, c.k, c.n) if c.op == "bmm" else (c.k, c.n)
            a = rng.standard_normal(shape_a).astype(dt)
            b = rng.standard_normal(shape_b).astype(dt)
            if c.layout[0] == "T":
                a = np.ascontiguousarray(np.swapaxes(a, -1, -2)).swapaxes(-1, -2)
            if c.layout[1] == "T":
                b = np.ascontiguousarray(np.swapaxes(b, -1, -2)).swapaxes(-1, -2)
            bias = rng.standard_normal(c.n).astype(dt)
            times = []
            for _ in range(self.reps):
                t0 = time.perf_counter_ns()
                y = a @ b
                if c.op == "addmm":
                    y = y + bias
                times.append((time.perf_counter_ns() - t0) / 1e3)
            times.sort()
            rec["time_us"] = times[len(times) // 2]
            rec["time_us_min"] = times[0]
            rec["time_us_reps"] = len(times)
            out.append(rec)
        return out
