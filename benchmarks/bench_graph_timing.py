#!/usr/bin/env python3
"""Timed batches from a CUDA graph against the probe's method, GEMM by GEMM, in one process (GPU).

    PYTHONPATH=. python3 benchmarks/bench_graph_timing.py [--preset quick] [--also decode:256] [--rounds 2]

The probe times a GEMM in batches of calls queued behind a GPU spin that covers the host's enqueue of them all
(`Probe.time_gpu`): on the one-GPU host the enqueue took 516 µs a GEMM (median, decode) and the spin about as
long. A graph is launched at once, so it needs no spin, and when it repeats one captured call it needs no
launch per call either. Two forms, both with the same events, plan and differential samples as the probe:

- `copies`: one call captured on the probe's stream, the graph built of its copies (child-graph nodes) and
  the event-record nodes of the plan's batches, instantiated and launched;
- `captured`: the plan's whole sequence (events recorded as external records, every call) captured, then
  instantiated and launched: the host still makes every call, but no spin is queued;
- `launches`: one call captured and instantiated once per GEMM, and the probe's own method (`Probe.time_gpu`:
  its spin, events, checks and differential samples) timing a launch of that graph in place of the call:
  one `cuGraphLaunch` per call (a few µs of host time) instead of the library's launch path, every call
  still a launch of its own on the stream. Its host time per call is learnt under a key of its own;
- `replay`: the same, but each call launches what the captured call holds by the driver's own calls, node by
  node on the stream (`driver.Graphs.replay`: `cuLaunchKernelEx` with each kernel's grid, block, shared
  memory, parameters and launch attributes, programmatic stream serialization where the library's launch had
  it; `cuMemsetD*Async` for the memsets): no graph is launched.

Per GEMM, the three methods run in turn `--rounds` times (probe, copies, captured, then the reverse order),
each timed GEMM's median µs kept; printed: how many GEMMs each graph form times within 3 % of the probe's
(the mean of its rounds against the probe's), the probe against itself (its odd rounds against its even
ones: the method's own noise), and the host µs each method took per GEMM (the probe's spin and enqueue; the
graphs' capture, build, instantiate and launch). The GEMMs run on a stream of their own (a graph cannot be
captured on the legacy default stream), for all three methods.
"""
import argparse
import ctypes
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

RECORD_EXTERNAL = 1    # CU_EVENT_RECORD_EXTERNAL: a captured record is an event-record node


class Graphs:
    """The driver's calls to build, instantiate and launch a graph, on the libcuda torch loaded (capture and
    node listing are the probe's: `probe.graphs`, `driver.Graphs`)."""

    def __init__(self):
        L = ctypes.CDLL("libcuda.so.1", mode=getattr(os, "RTLD_NOLOAD", 0))
        vp, P = ctypes.c_void_p, ctypes.POINTER
        self.L = L
        L.cuGraphCreate.argtypes = [P(vp), ctypes.c_uint]
        L.cuGraphAddEventRecordNode.argtypes = [P(vp), vp, P(vp), ctypes.c_size_t, vp]
        L.cuGraphAddChildGraphNode.argtypes = [P(vp), vp, P(vp), ctypes.c_size_t, vp]
        L.cuGraphInstantiateWithFlags.argtypes = [P(vp), vp, ctypes.c_ulonglong]
        L.cuGraphLaunch.argtypes = [vp, vp]
        L.cuGraphExecDestroy.argtypes = [vp]
        L.cuGraphDestroy.argtypes = [vp]
        L.cuEventRecordWithFlags.argtypes = [vp, vp, ctypes.c_uint]
        L.cuGetErrorName.argtypes = [ctypes.c_int, P(ctypes.c_char_p)]

    def check(self, st, what):
        if st:
            name = ctypes.c_char_p()
            self.L.cuGetErrorName(st, ctypes.byref(name))
            raise RuntimeError(f"{what}: {(name.value or b'').decode() or st}")

    def copies(self, child, events, reps, per):
        """A graph of `reps` batches of `per` copies of `child`, bracketed by the plan's events (start, mid after
        the first call when split, end), in one chain."""
        L, vp = self.L, ctypes.c_void_p
        g = vp()
        self.check(L.cuGraphCreate(ctypes.byref(g), 0), "cuGraphCreate")
        prev = vp()
        node = vp()

        def add(fn, arg):
            nonlocal prev
            dep = ctypes.byref(prev) if prev.value else None
            self.check(fn(ctypes.byref(node), g, dep, 1 if prev.value else 0, arg), fn.__name__)
            prev = vp(node.value)
        for i in range(reps):
            add(L.cuGraphAddEventRecordNode, events.starts[i])
            add(L.cuGraphAddChildGraphNode, child)
            if events.mids:
                add(L.cuGraphAddEventRecordNode, events.mids[i])
            for _ in range(per - 1):
                add(L.cuGraphAddChildGraphNode, child)
            add(L.cuGraphAddEventRecordNode, events.ends[i])
        return g

    def instantiate(self, g):
        e = ctypes.c_void_p()
        self.check(self.L.cuGraphInstantiateWithFlags(ctypes.byref(e), g, 0), "cuGraphInstantiate")
        return e


def time_graph(probe, G, fn, reps, per, form):
    """(median µs, samples' GPU gap µs, host µs by phase, nodes in one call's graph) of `fn` timed from a graph."""
    from cublaslt_probe.gpu.probe import _Events
    clock, st = probe.clock, probe._stream()
    events = _Events(clock, reps, per > 1)
    t0 = time.perf_counter()
    keep = []
    child = None
    if form == "copies":
        child, out = probe.graphs.capture(st, fn)
        keep.append(out)
        t1 = time.perf_counter()
        g = G.copies(child, events, reps, per)
    else:
        def body():
            rec = G.L.cuEventRecordWithFlags
            for i in range(reps):
                rec(events.starts[i], st, RECORD_EXTERNAL)
                keep.append(fn())
                if events.mids:
                    rec(events.mids[i], st, RECORD_EXTERNAL)
                for _ in range(per - 1):
                    keep.append(fn())
                rec(events.ends[i], st, RECORD_EXTERNAL)
        t1 = time.perf_counter()
        g, _ = probe.graphs.capture(st, body)
    t2 = time.perf_counter()
    e = G.instantiate(g)
    t3 = time.perf_counter()
    G.check(G.L.cuGraphLaunch(e, st), "cuGraphLaunch")
    t4 = time.perf_counter()
    clock.wait(events.ends[-1])
    totals, firsts, times = events.samples(per)
    gap = events.gap_us(totals)
    nodes = len(probe.graphs.nodes(child)) if child is not None else None
    G.L.cuGraphExecDestroy(e)
    G.L.cuGraphDestroy(g)
    if child is not None:
        G.L.cuGraphDestroy(child)
    for ev in events.starts + events.ends + (events.mids or []):
        clock.destroy(ev)
    host = {"capture": (t1 - t0) * 1e6 if form == "copies" else (t2 - t1) * 1e6,
            "build": (t2 - t1) * 1e6 if form == "copies" else 0.0,
            "instantiate": (t3 - t2) * 1e6, "launch": (t4 - t3) * 1e6}
    return statistics.median(times), gap, host, nodes


def launcher(launch, e, st):
    """A zero-argument launch of executable graph `e` on stream `st` (`cuGraphLaunch`)."""
    return lambda: launch(e, st)


def gemms(probe, preset: str, also: str):
    """(Case, built GEMM, its timing key) for each GEMM of `preset` and N spread over another preset ("NAME:N"),
    built under its flags and called twice; cupy's are left out (they run on cupy's stream)."""
    import torch
    from cublaslt_probe import sweep
    from cublaslt_probe.cases import invalid_reason
    cases = list(sweep.plan(preset).cases)
    if also:
        name, _, n = also.partition(":")
        more = list(sweep.plan(name).cases)
        step = max(1, len(more) // int(n))
        cases += more[::step][:int(n)]
    for c in cases:
        if invalid_reason(c) or c.backend == "cupy":
            continue
        probe.builder.set_flags(c)
        b = probe.builder.build(c)
        for _ in range(2):
            b.fn()
        torch.cuda.synchronize()
        yield c, b, f"{c.backend}|{c.op}"


def versus(pick, f: str) -> str:
    """How the mean of method `f`'s rounds compares with the probe's, over the GEMMs' rows `pick`."""
    d = [statistics.mean(r["res"][f]) / statistics.mean(r["res"]["probe"]) for r in pick]
    w = sum(abs(x - 1) <= 0.03 for x in d)
    return (f"  {f} vs probe: within 3 % {w}/{len(d)} ({w / len(d) * 100:.1f} %), median ratio "
            f"{statistics.median(d):.4f}, p5 {sorted(d)[len(d) // 20]:.4f}, p95 {sorted(d)[len(d) * 19 // 20]:.4f}")


def turns(forms, rounds: int):
    """The methods in turn for each of `rounds` rounds, the order reversed every other round."""
    for r in range(rounds):
        yield from (forms if r % 2 == 0 else forms[::-1])


def row_line(key: str, plan, res: dict, forms, err, log) -> None:
    """Print (and write to `log`) one GEMM's plan and each method's medians, or its error."""
    line = f"{key:44s} plan {plan} " + "  ".join(f"{f} " + ",".join(f"{x:.2f}" for x in res[f]) for f in forms) \
        + (f"  ERROR {err}" if err else "")
    print(line)
    if log:
        log.write(line + "\n")


def picks(rows: list, forms, rounds: int) -> tuple[list, list]:
    """(the summary's first line, [(label, rows)]): the GEMMs every method timed every round, all of them, those
    timed one call per sample, those timed in batches (the groups that hold any)."""
    ok = [r for r in rows if not r["error"] and all(len(r["res"][f]) == rounds for f in forms)]
    head = f"GEMMs timed by all the methods: {len(ok)} of {len(rows)} (errors {sum(bool(r['error']) for r in rows)})"
    groups = (("all", ok), ("one call per sample", [r for r in ok if r["plan"][1] == 1]),
              ("batches of several calls", [r for r in ok if r["plan"][1] > 1]))
    return head, [(label, pick) for label, pick in groups if pick]


def arguments(doc: str, methods: str, forms: tuple = ()) -> argparse.Namespace:
    """The command line both benchmarks take (--preset, --also, --rounds, --out; --forms, a subset of `forms`
    starting with the probe's, when given), checked: a bad value stops with argparse's one-line error before
    the GPU is touched."""
    from cublaslt_probe.vocab import PRESETS
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--preset", default="quick", choices=PRESETS)
    ap.add_argument("--also", default="decode:256", help="PRESET:N: also N GEMMs spread over that preset ('' for none)")
    ap.add_argument("--rounds", type=int, default=2, help=f"rounds of {methods} per GEMM (even)")
    ap.add_argument("--out", default="")
    if forms:
        ap.add_argument("--forms", default=",".join(forms), help=f"methods to run, comma-separated, of {forms}")
    a = ap.parse_args()
    if forms:
        a.forms = tuple(a.forms.split(","))
        if a.forms[0] != forms[0] or not set(a.forms) <= set(forms) or len(set(a.forms)) != len(a.forms) \
                or len(a.forms) < 2:
            ap.error(f"--forms {','.join(a.forms)}: expected {forms[0]} first, then some of {', '.join(forms[1:])}")
    name, _, n = a.also.partition(":")
    if a.also and (name not in PRESETS or not n.isdigit() or int(n) < 1):
        ap.error(f"--also {a.also!r}: expected PRESET:N with PRESET one of {', '.join(PRESETS)} and N >= 1")
    if a.rounds < 2 or a.rounds % 2:
        ap.error(f"--rounds {a.rounds}: expected an even number, 2 at least")
    return a


def main():
    a = arguments(__doc__, "the methods", ("probe", "copies", "captured", "launches", "replay"))
    import torch
    from cublaslt_probe.gpu.probe import Probe, timing_plan
    stream = torch.cuda.Stream()
    torch.cuda.set_stream(stream)
    probe = Probe(pipeline=False)
    G = Graphs()
    forms = a.forms
    rows = []
    log = open(a.out, "w") if a.out else None
    for c, b, key in gemms(probe, a.preset, a.also):
        res = {f: [] for f in forms}
        host = {f: [] for f in forms}
        plan = None
        err = None
        one = None   # launches: (the captured call's graph, its executable graph, its output, the launch)
        rp = None    # replay: the captured call's replay (driver.Replay)
        try:
            for f in turns(forms, a.rounds):
                if f in ("probe", "launches", "replay"):
                    if f == "launches" and one is None:
                        g, out = probe.graphs.capture(probe._stream(), b.fn)
                        e = G.instantiate(g)
                        one = (g, e, out, launcher(G.L.cuGraphLaunch, e, probe._stream()))
                    if f == "replay" and rp is None:
                        rp = probe.graphs.replay(probe._stream(), b.fn)
                    fn = {"probe": b.fn, "launches": one and one[3], "replay": rp and rp.launch}[f]
                    t = probe.time_gpu(fn, key=key if f == "probe" else f"{key}|{f}")
                    res[f].append(t.median_us)
                    host[f].append({"spin": t.spin_us, "enqueue": t.enqueue_us, "calls per sample": t.calls_per_rep})
                    if plan is None:
                        plan = (len(t.samples_us), t.calls_per_rep)
                else:
                    if plan is None:
                        once = probe.timer.estimate(b.fn, key)[0]
                        plan = timing_plan(once, reps=None, max_reps=probe.options.reps,
                                           budget_ms=probe.options.budget_ms)
                    med, gap, h, nodes = time_graph(probe, G, b.fn, plan[0], plan[1], f)
                    res[f].append(med)
                    host[f].append({**h, "gap": gap, "nodes": nodes})
        except Exception as e:  # noqa: BLE001
            err = f"{type(e).__name__}: {e}"[:200]
            torch.cuda.synchronize()
        if one is not None:
            G.L.cuGraphExecDestroy(one[1])
            G.L.cuGraphDestroy(one[0])
        if rp is not None:
            rp.close()
        b.close()
        rows.append({"key": c.key, "plan": plan, "res": res, "host": host, "error": err})
        row_line(c.key, plan, res, forms, err, log)
    head, groups = picks(rows, forms, a.rounds)
    out = [head]
    for label, pick in groups:
        out.append(f"{label}: {len(pick)} GEMMs")
        for f in forms[1:]:
            out.append(versus(pick, f))
        d = [statistics.mean(r["res"]["probe"][0::2]) / statistics.mean(r["res"]["probe"][1::2]) for r in pick]
        w = sum(abs(x - 1) <= 0.03 for x in d)
        out.append(f"  probe vs probe (odd vs even rounds): within 3 % {w}/{len(d)} ({w / len(d) * 100:.1f} %)")
        for f in forms:
            hs = [h for r in pick for h in r["host"][f]]
            keys = [k for k in hs[0] if k != "nodes"]
            out.append(f"  {f} host µs per GEMM, median: " + ", ".join(
                f"{k} {statistics.median(h[k] for h in hs if h[k] is not None):.1f}" for k in keys))
        if "copies" in forms:
            nodes = [h["nodes"] for r in pick for h in r["host"]["copies"]]
            out.append(f"  nodes in one captured call: {sorted(set(nodes))}")
    print("\n".join(out))
    if log:
        log.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
