#!/usr/bin/env python3
"""Timed batches gated by a host flag (a stream wait on a value) against the probe's method, GEMM by GEMM (GPU).

    PYTHONPATH=. python3 benchmarks/bench_wait_timing.py [--preset quick] [--also decode:256] [--rounds 2]

The probe queues a GEMM's timed batches behind a GPU spin long enough that the GPU never reaches a batch
before the host has enqueued all of it (`timing_spin`: the host's lead times SPIN_MARGIN plus SPIN_SLACK_US
and SPIN_FLOOR_US), and retakes the samples when it did. Here each batch is preceded on the stream by a wait
for a counter in pinned host memory (`cuStreamWaitValue32`), which the host raises once it has enqueued the
batch: the GPU cannot enter a batch early, whatever the spin. Methods, per GEMM, in turn `--rounds` times
(the order reversed every other round), each with the same plan, events and differential samples:

- `probe`: `Probe.time_gpu` as it is;
- `gated`: the waits, behind a spin of the host's lead alone (SPIN_FLOOR_US + lead, no margin or slack);
- `floor`: the waits, behind a spin of SPIN_FLOOR_US only (the GPU follows the host batch by batch).

Printed: how many GEMMs each method times within 3 % of the probe's (the mean of its rounds), the probe
against itself (odd rounds against even), and per method the medians of the host's enqueue, the wall time
from the spin's launch to the GPU's end of the last batch (what the pipeline waits for), and the GPU's idle
time between batches.
"""
import ctypes
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))
from bench_graph_timing import arguments, gemms, picks, row_line, turns, versus  # noqa: E402  (the same GEMMs, built and warmed alike)

GEQ = 0   # CU_STREAM_WAIT_VALUE_GEQ: (int32)(*addr - value) >= 0


class Gate:
    """A counter in pinned host memory and the driver's stream wait on it."""

    def __init__(self, torch):
        L = ctypes.CDLL("libcuda.so.1", mode=getattr(os, "RTLD_NOLOAD", 0))
        self.wait_value = getattr(L, "cuStreamWaitValue32_v2", None) or L.cuStreamWaitValue32
        self.wait_value.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint]
        self.flag = torch.zeros(1, dtype=torch.int32, pin_memory=True)
        self.addr = self.flag.data_ptr()
        self.cell = ctypes.c_uint32.from_address(self.addr)
        self.count = 0


def time_gated(probe, gate, fn, reps, per, spin_us, events):
    """(median µs, gap µs, enqueue µs, wall µs, behind) of `fn`'s batches, each behind a wait on the gate."""
    clock, st = probe.clock, probe._stream()
    rec, done = clock.record, clock.done
    starts, mids, ends = events.starts, events.mids, events.ends
    w, cell, addr = gate.wait_value, gate.cell, gate.addr
    base = gate.count
    t0 = time.perf_counter()
    probe.spin(spin_us)
    h = time.perf_counter()
    behind = 0
    for i in range(reps):
        st_ = w(st, addr, (base + i + 1) & 0xFFFFFFFF, GEQ)
        if st_:
            raise clock.error(st_, "cuStreamWaitValue32")
        rec(starts[i], st)
        fn()
        if mids:
            rec(mids[i], st)
            for _ in range(per - 1):
                fn()
        rec(ends[i], st)
        cell.value = (base + i + 1) & 0xFFFFFFFF
        if done(starts[i]):
            behind += 1
    enq = (time.perf_counter() - h) * 1e6
    gate.count = base + reps
    clock.wait(ends[-1])
    wall = (time.perf_counter() - t0) * 1e6
    totals, firsts, times = events.samples(per)
    return statistics.median(times), events.gap_us(totals), enq, wall, behind


def main():
    a = arguments(__doc__, "the methods")
    import torch
    from cublaslt_probe.gpu.probe import SPIN_FLOOR_US, Probe, _Events, gpu_us_per_call, timing_spin
    probe = Probe(pipeline=False)
    gate = Gate(torch)
    forms = ("probe", "gated", "floor")
    rows = []
    log = open(a.out, "w") if a.out else None
    for c, b, key in gemms(probe, a.preset, a.also):
        res = {f: [] for f in forms}
        ev = {f: [] for f in forms}
        plan = None
        err = None
        try:
            for f in turns(forms, a.rounds):
                if f == "probe" or plan is None:
                    t0 = time.perf_counter()
                    t = probe.time_gpu(b.fn, key=key)
                    wall = (time.perf_counter() - t0) * 1e6
                    if plan is None:
                        plan = (len(t.samples_us), t.calls_per_rep, t.estimate_us)
                    if f != "probe":
                        continue
                    res[f].append(t.median_us)
                    ev[f].append({"enqueue": t.enqueue_us, "wall": wall, "gap": t.gap_us,
                                  "spin": t.spin_us, "attempts": t.attempts})
                    continue
                reps, per, once = plan
                host = probe.timer.host_us.get(key, 30.0)
                if per == 1:
                    lead_spin = timing_spin(host, once, reps, per)   # long GEMMs: the probe's own spin
                else:   # timing_spin's lead, with neither margin nor slack
                    lead_spin = SPIN_FLOOR_US + per * host + max(0.0, (reps - 1) * per * (host - gpu_us_per_call(once)))
                spin = lead_spin if f == "gated" else SPIN_FLOOR_US
                events = _Events(probe.clock, reps, per > 1)
                med, gap, enq, wall, behind = time_gated(probe, gate, b.fn, reps, per, spin, events)
                for e in events.starts + events.ends + (events.mids or []):
                    probe.clock.destroy(e)
                res[f].append(med)
                ev[f].append({"enqueue": enq, "wall": wall, "gap": gap, "spin": spin, "attempts": 1,
                              "behind": behind})
        except Exception as e:  # noqa: BLE001
            err = f"{type(e).__name__}: {e}"[:200]
            torch.cuda.synchronize()
        b.close()
        rows.append({"key": c.key, "plan": plan, "res": res, "ev": ev, "error": err})
        row_line(c.key, plan and plan[:2], res, forms, err, log)
    head, groups = picks(rows, forms, a.rounds)
    out = [head]
    for label, pick in groups:
        out.append(f"{label}: {len(pick)} GEMMs")
        for f in forms[1:]:
            out.append(versus(pick, f))
        for f in forms:
            d = [statistics.mean(r["res"][f][0::2]) / statistics.mean(r["res"][f][1::2]) for r in pick]
            w = sum(abs(x - 1) <= 0.03 for x in d)
            out.append(f"  {f} vs itself (odd vs even rounds): within 3 % {w}/{len(d)} ({w / len(d) * 100:.1f} %)")
        for f in forms:
            es = [e for r in pick for e in r["ev"][f]]
            out.append(f"  {f}: median µs per GEMM: spin {statistics.median(e['spin'] for e in es):.1f}, enqueue "
                       f"{statistics.median(e['enqueue'] for e in es):.1f}, wall to the GPU's end "
                       f"{statistics.median(e['wall'] for e in es):.1f} (sum {sum(e['wall'] for e in es) / 1e3:.1f} ms), "
                       f"GPU idle between batches {statistics.median(e['gap'] for e in es):.1f}; retaken "
                       f"{sum(e['attempts'] > 1 for e in es)}, behind {sum(e.get('behind', 0) for e in es)} of {len(es)}")
    print("\n".join(out))
    if log:
        log.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
