#!/usr/bin/env python3
"""Can NVIDIA's `cupti-python` binding replace the probe's ctypes activity layer? (run on the GPU machine)

    PYTHONPATH=.:SITE python3 benchmarks/bench_cupti_python.py [--out cupti_python.json]

SITE holds cupti-python and what it needs (cuda-bindings, cuda-pathfinder, pyelftools) installed with --no-deps:
the binding's own libcupti requirement (nvidia-cuda-cupti 13.4) is deliberately not installed, so the question
answered is whether the binding works against the libcupti torch ships. One process with torch: which libcupti
the binding loads, its version, whether its activity records of a set of GEMM launches carry the same kernel
names and durations as `gpu.cupti.Activity`'s (the probe's capture), and what one capture of N launches costs on
the host each way (rounds alternating, medians). Everything is written to --out as JSON; a failure at any stage
is recorded with its message, not raised.
"""
import argparse
import json
import statistics
import time
import traceback


def loaded_cupti() -> list[str]:
    with open("/proc/self/maps") as f:
        return sorted({line.split()[-1] for line in f if "libcupti" in line})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--launches", type=int, default=200)
    a = ap.parse_args()
    import torch

    from cublaslt_probe.gpu.cupti import activity
    res: dict = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(0)}
    x = torch.randn(512, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)

    def work():
        for _ in range(a.launches):
            torch.mm(x, w)
        torch.cuda.synchronize()
    work()
    ours = activity()

    def ours_capture():
        t = time.perf_counter()
        ours.start()
        work()
        ev = ours.stop()
        return time.perf_counter() - t, [(n, d) for _, n, d in ev]
    try:
        from cupti import cupti
        res["cupti_python_import"] = "ok"
        res["libcupti_after_import"] = loaded_cupti()
        try:
            res["cupti_version"] = int(cupti.get_version())
        except Exception as e:  # noqa: BLE001
            res["cupti_version_error"] = repr(e)
        got: list = []

        def requested():
            return 8 * 1024 * 1024, 0

        def completed(activities):
            for r in activities:
                if int(r.kind) == int(cupti.ActivityKind.CONCURRENT_KERNEL):
                    got.append((r.name, (r.end - r.start) / 1e3))

        def theirs_capture():
            got.clear()
            t = time.perf_counter()
            cupti.activity_register_callbacks(requested, completed)
            cupti.activity_enable(cupti.ActivityKind.CONCURRENT_KERNEL)
            work()
            cupti.activity_disable(cupti.ActivityKind.CONCURRENT_KERNEL)
            cupti.activity_flush_all(1)
            return time.perf_counter() - t, list(got)
        theirs_capture()
        ours_capture()
        rows = {"ours": [], "theirs": [], "ours_kernels": None, "theirs_kernels": None}
        for _ in range(a.rounds):
            for who, fn in (("ours", ours_capture), ("theirs", theirs_capture)):
                s, ev = fn()
                rows[who].append(s)
                rows[f"{who}_kernels"] = ev
        res["capture_s_median"] = {k: statistics.median(rows[k]) for k in ("ours", "theirs")}
        res["capture_s_all"] = {k: rows[k] for k in ("ours", "theirs")}
        o, t = rows["ours_kernels"], rows["theirs_kernels"]
        res["kernels"] = {"ours": len(o), "theirs": len(t),
                          "same_names": [n for n, _ in o] == [n for n, _ in t],
                          "ours_name": o[0][0] if o else None, "theirs_name": t[0][0] if t else None,
                          "ours_median_us": statistics.median(d for _, d in o) if o else None,
                          "theirs_median_us": statistics.median(d for _, d in t) if t else None}
        res["libcupti_after_capture"] = loaded_cupti()
    except Exception as e:  # noqa: BLE001  (every failure is the answer, recorded)
        res["error"] = repr(e)
        res["traceback"] = traceback.format_exc()[-3000:]
        res["libcupti_loaded"] = loaded_cupti()
    text = json.dumps(res, indent=1)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
