#!/usr/bin/env python3
"""Does a kernel run as long under the probe's kernel capture as under torch.profiler? (run on the GPU machine)

    PYTHONPATH=. python3 benchmarks/bench_capture_durations.py [--out capture_durations.json]

One process, the GEMMs of tests/test_gpu_kernel_capture.py built by the probe's Builder. Each GEMM's GPU time is
taken three ways, rounds alternating: CUDA events around the call with nothing attached (`events`), the same
events while the probe's capture (`cupti.Activity`) records (`events_under_activity`) with the duration the
activity record gives (`activity`), and the events while torch.profiler records with kineto's duration
(`torch_profiler`). Medians over the rounds, µs. Tells a capture that reports a wrong duration (its record, not
the kernel) from a kernel that runs slower while it is recorded (the events agree with the record).
"""
import argparse
import json
import statistics
import sys

CASES = ["torch|mm|bf16|NN|4096|3584|3584|1", "torch-lt|mm|bf16|TN|4|3584|3584|1", "torch|mm|bf16|NT|16|4096|4096|1",
         "lt|mm|bf16|NT|16|4096|4096|1"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    import torch
    from torch.profiler import ProfilerActivity, profile

    from cublaslt_probe.cases import Case
    from cublaslt_probe.gpu.cupti import activity
    from cublaslt_probe.gpu.operands import Builder
    b = Builder()
    res = {}
    for key in CASES:
        c = Case.from_key(key)
        built = b.build(c)
        b.set_flags(c)
        fn = built.fn
        for _ in range(5):
            fn()
        torch.cuda.synchronize()

        def timed(fn=fn):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            fn()
            e1.record()
            e1.synchronize()
            return e0.elapsed_time(e1) * 1e3
        out = {k: [] for k in ("events", "events_under_activity", "activity", "events_under_profiler",
                               "torch_profiler")}
        for _ in range(a.rounds):
            fn()
            out["events"].append(timed())
            rec = activity()
            rec.start()
            out["events_under_activity"].append(timed())
            evs = rec.stop()
            out["activity"].append(max(d for _, _, d in evs))
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                out["events_under_profiler"].append(timed())
            ds = [e.duration_ns() / 1e3 for e in prof.profiler.kineto_results.events()
                  if e.device_type() == torch.autograd.DeviceType.CUDA]
            out["torch_profiler"].append(max(ds) if ds else None)
        res[key] = {k: statistics.median(v) for k, v in out.items() if v and None not in v}
        res[key]["rounds"] = {k: [round(x, 1) for x in v] for k, v in out.items() if v and None not in v}
        print(key, json.dumps(res[key]["rounds"]), flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"torch": torch.__version__, "gpu": torch.cuda.get_device_name(0), "cases": res}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
