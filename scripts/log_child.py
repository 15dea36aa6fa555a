#!/usr/bin/env python3
"""Child process for log captures: run each GEMM of a case list exactly once, in order, and record what ran.

    CUBLASLT_LOG_LEVEL=2 CUBLASLT_LOG_FILE=x.log python3 scripts/log_child.py CASES_FILE RAN_JSONL

The logging variables must be set before the library initialises, hence a child process. Each GEMM is
built (no cuBLAS call), run once and synchronised; RAN_JSONL gets one line per GEMM, in launch order, with
the case and its column-major (cuBLAS) view, so a test can pair the n-th trace line with the n-th GEMM.
"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def main():
    import torch

    from cublaslt_probe.cases import Case
    from cublaslt_probe.gpu import lt
    from cublaslt_probe.gpu.operands import Builder
    cases = [Case.from_key(k) for k in open(sys.argv[1]).read().split("\n") if k.strip()]
    b = Builder(None)
    with open(sys.argv[2], "w") as out:
        for i, c in enumerate(cases):
            if c.backend == "lt" and b.lib is None:
                # Bind to the libcublasLt the earlier torch GEMMs loaded (the case lists put torch first,
                # so this adds no GEMM of its own to the log).
                b.lib = lt.LtLibrary()
            rec = {"index": i, "key": c.key, **c.as_dict(), **c.blas, "error": None}
            try:
                b.set_flags(c)
                built = b.build(c)
                built.fn()
                torch.cuda.synchronize()
                rec["lt_config"] = built.lt_config
            except Exception as e:  # noqa: BLE001
                rec["error"] = f"{type(e).__name__}: {e}"[:300]
            out.write(json.dumps(rec) + "\n")
            out.flush()


if __name__ == "__main__":
    main()
