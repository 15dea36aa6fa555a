#!/usr/bin/env python3
"""The probe's pipeline (ProbeOptions.pipeline) against one step after another, A/B in one process (GPU).

    PYTHONPATH=. python3 benchmarks/bench_pipeline.py [--preset decode] [--limit 1200] [--every 1] [--warm-all]
        [--fidelity quick] [--runs 2] [--save runs.json] [--paired]
        [--backends cupy]

Throughput: the plan's windows run alternately with the pipeline on and off (on, off, off, on, ...: each mode
sees the same host state and GPU temperature), one probe, one process; per mode, GEMMs/s over the windows'
wall time, the host phases per GEMM, the GEMMs' own GPU time and the overhead beyond it, and the heuristic
miss/hit µs (timed by the companion process, or in the probe's process). The raw records' JSON lines are
written as the sweep writes them, and that cost is printed apart. With --paired every window runs in both modes,
the first alternating from window to window, so that both modes time the same GEMMs (windows alternating give
each mode other GEMMs: in bench19_estimate_behind_ab.txt the on windows held more first uses of a kernel); the
rates of first and second runs are printed apart too. The window that runs a GEMM first meets its kernels' module
loads; with --warm-all every GEMM has run once before, and the modes differ in nothing else.

Fidelity (--fidelity PRESET): every window of that plan runs on and off --runs times each (2: on, off, off,
on; the order turned from window to window); per GEMM, |time_us on / off - 1| (the mean of each mode's runs,
of its first two, and run by run), the same for off / off again (the run-to-run noise of the method: the
mean of its odd runs against that of its even ones), and whether kernels and log lines are the same, and how
often the plan (calls per sample) differs between the runs.
"""
import argparse
import dataclasses
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


TOGGLE = "pipeline"   # the ProbeOptions field the two modes set True (on) and False (off)


def mode(probe, on: bool) -> None:
    """Set `probe`'s options for a mode: the pipeline on or off."""
    probe.options = dataclasses.replace(probe.options, **{TOGGLE: on})


def windows_of(cases, size):
    return [cases[i:i + size] for i in range(0, len(cases), size)]


def gpu_us(rec) -> float:
    """µs the GEMM's own kernels ran in all its calls: timed samples, the warm-up (`WARM_CALLS`), the logged
    call, the estimate (the logged call itself when its record says it sized the plan: `timing.sized_by`), the
    profiled call (a re-time's extra samples are left out)."""
    from cublaslt_probe.gpu.probe import WARM_CALLS
    if rec.get("error") or rec.get("time_us") is None:
        return 0.0
    own = 2 if (rec.get("timing") or {}).get("sized_by") == "logged call" else 3
    return rec["time_us"] * ((rec.get("time_us_reps") or 0) * (rec.get("time_calls_per_rep") or 1) + WARM_CALLS + own)


def throughput(probe, cases, window, paired: bool = False):
    """Windows alternating between the modes (on, off, off, on, ...); `paired`: every window in both modes, the
    mode that runs it first alternating from window to window (the first run meets the window's new kernels
    and heuristic questions), so that both modes time the same GEMMs; the wall time of first and second runs
    is printed apart as well."""
    modes = {True: {"wall": 0.0, "recs": [], "write": 0.0}, False: {"wall": 0.0, "recs": [], "write": 0.0}}
    turn = {(on, first): 0.0 for on in (True, False) for first in (True, False)}
    sink = open(os.devnull, "w")
    for i, w in enumerate(windows_of(cases, window)):
        order = ((i % 2 == 0, True), (i % 2 == 1, False)) if paired else (((i % 4) in (0, 3), True),)
        for on, first in order:
            mode(probe, on)
            t = time.perf_counter()
            recs = probe.run_window(w)
            wall = time.perf_counter() - t
            modes[on]["wall"] += wall
            turn[on, first] += wall
            t = time.perf_counter()
            for r in recs:
                sink.write(json.dumps({"type": "gemm", **r}) + "\n")
            modes[on]["write"] += time.perf_counter() - t
            modes[on]["recs"] += recs
    if paired:
        n = len(modes[True]["recs"]) / 2
        print(f"paired windows, {TOGGLE} on / off: as the window's first run {n / turn[True, True]:.1f} / "
              f"{n / turn[False, True]:.1f} GEMMs/s, as its second {n / turn[True, False]:.1f} / "
              f"{n / turn[False, False]:.1f} (each over half the windows)")
    for on in (False, True):
        m = modes[on]
        recs, wall = m["recs"], m["wall"]
        n = len(recs)
        gs = sum(gpu_us(r) for r in recs) / 1e6
        print(f"{TOGGLE} {'on ' if on else 'off'}: {n} GEMMs in {wall:.2f} s = {n / wall:.1f} GEMMs/s "
              f"(run_window; writing their JSON lines {m['write'] / n * 1e3:.3f} ms per GEMM more); "
              f"GPU time in the GEMMs {gs:.2f} s, overhead beyond it {(wall - gs) / n * 1e3:.2f} ms per GEMM; "
              f"errors {sum(bool(r.get('error')) for r in recs)}")
        ph = {}
        for r in recs:
            for k, v in (r.get("probe_ms") or {}).items():
                ph.setdefault(k, []).append(v)
        print("    host phases, median ms per GEMM: "
              + ", ".join(f"{k} {statistics.median(v):.3f}" for k, v in ph.items()))
        print("    host phases, mean ms per GEMM:   " + ", ".join(f"{k} {sum(v) / n:.3f}" for k, v in ph.items()))
        miss = [r["heuristic_miss_us"] for r in recs if r.get("heuristic_miss_us") is not None]
        hit = [r["heuristic_hit_us"] for r in recs if r.get("heuristic_hit_us") is not None]
        where = sorted({r.get("heuristic_where") for r in recs if r.get("heuristic_where")})
        tim = [r["timing"] for r in recs if r.get("timing")]
        print(f"    heuristic (timed in: {', '.join(where)}): miss median {statistics.median(miss):.1f} µs, hit median "
              f"{statistics.median(hit):.2f} µs over {len(miss)} GEMMs; "
              f"timing retaken {sum(t['attempts'] > 1 for t in tim)}"
              f", behind after the last attempt {sum(bool(t.get('behind')) for t in tim)}; first spin median "
              f"{statistics.median(t['spin_us'] for t in tim if t.get('spin_us') is not None):.0f} µs, enqueue median "
              f"{statistics.median(t['enqueue_us'] for t in tim if t.get('enqueue_us') is not None):.0f} µs")
    return modes


def fidelity(probe, cases, window, per_mode: int = 2):
    """Each window `per_mode` times in each mode (on, off, off, on, ...; off, on, on, off, ... for the next
    window): each mode compared with the other (the mean of its runs, the mean of its first two, and run by
    run) and with itself (the mean of its odd runs against that of its even ones)."""
    if per_mode < 2 or per_mode % 2:
        sys.exit("--runs: an even number, 2 at least")
    runs = {f"{m}{i}": {} for i in range(1, per_mode + 1) for m in ("on", "off")}
    for i, w in enumerate(windows_of(cases, window)):
        a, b = ("on", "off") if i % 2 == 0 else ("off", "on")
        order = [f"{m}{2 * p + j}" for p in range(per_mode // 2) for m, j in ((a, 1), (b, 1), (b, 2), (a, 2))]
        for name in order:
            mode(probe, name.startswith("on"))
            for r in probe.run_window(w):
                runs[name][r["key"]] = r
    print(f"fidelity: {TOGGLE} on and off, {per_mode} runs of each")
    keys = [k for k in runs["on1"] if all(not runs[n][k].get("error") and runs[n][k].get("time_us") for n in runs)]
    every = range(1, per_mode + 1)

    def t(name, k):
        """time_us of run `name` (on1, off2, ...), or the mean of a mode's runs: `on` all of them, `on:2` the
        first two, `on:odd` / `on:even` the odd / even ones."""
        if name in runs:
            return runs[name][k]["time_us"]
        mode, _, which = name.partition(":")
        pick = {"": every, "2": range(1, 3), "odd": every[0::2], "even": every[1::2]}[which]
        return statistics.mean(runs[f"{mode}{i}"][k]["time_us"] for i in pick)
    pairs = [("on", "off", f"{TOGGLE} on vs off, each the mean of its {per_mode} runs")]
    if per_mode > 2:
        pairs += [("on:2", "off:2",
                   f"{TOGGLE} on vs off, each the mean of its first two runs (the protocol of --runs 2)")]
    pairs += [("on1", "off1", f"{TOGGLE} on vs off, first runs"), ("on2", "off2", f"{TOGGLE} on vs off, second runs"),
              ("off:even", "off:odd", "off vs off (the method's own noise"
               + (", the mean of its odd runs vs that of its even ones)" if per_mode > 2 else ")")),
              ("on:even", "on:odd", "on vs on")]
    for a, b, label in pairs:
        d = [abs(t(a, k) / t(b, k) - 1) * 100 for k in keys]
        print(f"fidelity, {label}: over {len(d)} GEMMs, within 3 %: {sum(x <= 3 for x in d)}/{len(d)} "
              f"({sum(x <= 3 for x in d) / len(d) * 100:.1f} %), median |Δ| {statistics.median(d):.2f} %, "
              f"max {max(d):.1f} %")
    from cublaslt_probe.cases import Case
    from cublaslt_probe.gpu.probe import is_heavy
    from cublaslt_probe.logs import without_pointers
    for label, part in (("run one step after another in both modes (heavy_us >= HEAVY_US)",
                         [k for k in keys if is_heavy(Case.from_key(k))]),
                        ("pipelined", [k for k in keys if not is_heavy(Case.from_key(k))])):
        d = [abs(t("on", k) / t("off", k) - 1) * 100 for k in part]
        n = [abs(t("off2", k) / t("off1", k) - 1) * 100 for k in part]
        if d:
            print(f"    of them {label}: {len(d)}, on vs off within 3 %: {sum(x <= 3 for x in d)}, median on/off "
                  f"{statistics.median(t('on', k) / t('off', k) for k in part):.4f}; off vs off within 3 %: "
                  f"{sum(x <= 3 for x in n)}")
    flips = [k for k in keys if len({runs[n][k]["time_calls_per_rep"] for n in runs}) > 1]

    def est(n, k):
        return runs[n][k]["timing"]["estimate_us"]
    print(f"    plans: calls per sample differ between the runs on {len(flips)} GEMMs, of them "
          f"{sum(abs(t('off2', k) / t('off1', k) - 1) * 100 > 3 for k in flips)} with off vs off beyond 3 %; "
          f"the estimate_us of all runs within 10 % of each other on "
          f"{sum(max(est(n, k) for n in runs) <= 1.1 * min(est(n, k) for n in runs) for k in keys)}"
          f"/{len(keys)}")
    same = sum(all(runs[n][k].get("kernels") == runs["off1"][k].get("kernels") for n in runs) for k in keys)
    def lines(n, k):
        return without_pointers(runs[n][k].get("log_lines"))
    logs = sum(all(lines(n, k) == lines("off1", k) for n in runs) for k in keys)
    print(f"fidelity: same kernels in all runs on {same}/{len(keys)} GEMMs, same log lines on {logs}/{len(keys)}; "
          "errors " + ", ".join(f"{n} {sum(bool(r.get('error')) for r in runs[n].values())}" for n in runs))
    for k in [k for k in keys if any(runs[n][k].get("kernels") != runs["off1"][k].get("kernels") for n in runs)][:6]:
        print(f"    kernels differ, {k}: " + "; ".join(
            f"{n} {[x[:70] for x in runs[n][k].get('kernels') or []]}" for n in runs
            if n == "off1" or runs[n][k].get("kernels") != runs["off1"][k].get("kernels")))
    for k in [k for k in keys if any(lines(n, k) != lines("off1", k) for n in runs)][:4]:
        print(f"    log lines differ, {k}: " + "; ".join(
            f"{n} {lines(n, k)}" for n in runs if n == "off1" or lines(n, k) != lines("off1", k)))
    worst = sorted(keys, key=lambda k: -abs(t("on", k) / t("off", k) - 1))[:16]
    for k in worst:
        print(f"    {k:40s} " + "  ".join(
            f"{n} {runs[n][k]['time_us']:8.2f} ({runs[n][k]['time_calls_per_rep']}/s, "
            f"a{runs[n][k]['timing']['attempts']}, "
            f"est {runs[n][k]['timing']['estimate_us']:.0f})" for n in runs))
    return runs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="decode")
    ap.add_argument("--limit", type=int, default=1200, help="the first N GEMMs of the plan (0: all)")
    ap.add_argument("--every", type=int, default=1, metavar="K", help="throughput: every K-th of those GEMMs")
    ap.add_argument("--window", type=int, default=32)
    ap.add_argument("--fidelity", default="", metavar="PRESET",
                    help="also compare the modes GEMM by GEMM on this preset")
    ap.add_argument("--save", help="write every fidelity run's records (key, time_us, calls per sample, attempts) "
                                   "to this JSON file")
    ap.add_argument("--warm", type=int, default=64, help="GEMMs run first and not counted (start-up, caches)")
    ap.add_argument("--warm-all", action="store_true",
                    help="throughput: run every measured GEMM once first, not counted, so that neither mode meets a "
                         "kernel new to the process (its module load) or a heuristic question new to it")
    ap.add_argument("--runs", type=int, default=2, help="fidelity: runs of each mode per window (even)")
    ap.add_argument("--backends", default="",
                    help="throughput: only the plan's GEMMs of these backends (comma-separated)")
    ap.add_argument("--paired", action="store_true", help="throughput: every window in both modes (see throughput)")
    a = ap.parse_args()
    from cublaslt_probe import sweep
    from cublaslt_probe.gpu.probe import Probe
    t = time.time()
    probe = Probe(cpu_slot=0)
    print(f"probe start-up: {time.time() - t:.2f} s; event gap {probe.event_gap_us:.2f} µs per sample, "
          f"allowed {probe.gap_limit_us:.2f}")
    cases = list(sweep.plan(a.preset, backends=a.backends.split(",") if a.backends else None).cases)
    probe.run_window(cases[-a.warm:])
    if a.limit:
        cases = cases[:a.limit]
    cases = cases[::a.every]
    if a.warm_all:
        t = time.time()
        for w in windows_of(cases, a.window):
            probe.run_window(w)
        print(f"warm-up: every measured GEMM run once, {time.time() - t:.1f} s")
    throughput(probe, cases, a.window, a.paired)
    if a.fidelity:
        runs = fidelity(probe, list(sweep.plan(a.fidelity).cases), a.window, a.runs)
        if a.save:
            with open(a.save, "w") as f:
                json.dump({n: {k: [r.get("time_us"), r.get("time_calls_per_rep"),
                                   (r.get("timing") or {}).get("attempts"),
                                   (r.get("timing") or {}).get("estimate_us")] for k, r in rs.items()}
                           for n, rs in runs.items()}, f)
    probe.close()


if __name__ == "__main__":
    main()
