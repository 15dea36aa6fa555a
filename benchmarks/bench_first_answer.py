#!/usr/bin/env python3
"""Fast to the first answer: the GPU commands' start, this tree against another, each command in fresh processes
(run it on the GPU machine).

    PYTHONPATH=. python3 benchmarks/bench_first_answer.py --base OTHER_TREE [--rounds 2] [--out first_answer.json]

A first answer is paid in a fresh process, so the A/B runs fresh processes, the two trees alternating (base,
this, this, base, ...), each running the command the way the CLI does (`cublaslt_probe.cli.main` in the child,
the tree on PYTHONPATH):

- `import torch` alone (the floor every GPU command pays);
- `explain` of one bf16 GEMM (16x4096x4096, NT): the whole process, its `import torch`, the probe's start, and
  the answer's evidence (saved with --save, compared between the trees: kernels, log lines, candidates, time);
- `audit --measure` of a committed 9-GEMM program (tests/fixtures/programs/llama_decode, --top-measure 9);
- `sweep --preset decode`: the probe's start (its constructor) and the GEMMs/s from its end to the sweep's end
  (the dataset written).

Each child prints the probe's start-up phases: this tree's own record (`Probe.startup`); for a tree without one
(the base), the same phases timed by wrapping the functions that pay them (`BASE_PHASES`), what is left of the
constructor's time is "other". With --threshold, the heuristic companion's start (spawned to ready, this tree)
and the in-process heuristic measurement per question, the two numbers `probe.HELPERS_FROM_GEMMS` weighs.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TREE = os.path.dirname(HERE)
CASE = ["--m", "16", "--n", "4096", "--k", "4096", "--dtype", "bf16", "--layout", "NT"]
PROGRAM = os.path.join("tests", "fixtures", "programs", "llama_decode")
COMMANDS = {
    "explain": ["explain", *CASE, "--top", "8"],
    "audit_measure": ["audit", PROGRAM, "--measure", "--top-measure", "9"],
    "sweep_decode": ["sweep", "--preset", "decode", "--no-progress"],
}
# a tree whose probe records no phases (the tree before the probe recorded them, whose modules sat at the
# package's top: cublaslt_probe.probe, .lt, .driver): the functions that pay them (module, attribute path, phase)
BASE_PHASES = [
    ("cublaslt_probe.probe", "HeuristicCompanion.__init__", "heuristic companion started"),
    ("cublaslt_probe.lt", "ensure_loaded", "cuBLAS/cuBLASLt loaded"),
    ("cublaslt_probe.driver", "Clock.__init__", "driver events and graphs"),
    ("cublaslt_probe.driver", "Graphs.__init__", "driver events and graphs"),
    ("cublaslt_probe.lt", "LtLibrary.__init__", "cuBLASLt library and logger"),
    ("cublaslt_probe.lt", "Logger.__init__", "cuBLASLt library and logger"),
    ("cublaslt_probe.probe", "environment", "environment"),
    ("cublaslt_probe.probe", "Builder.__init__", "operand pools, every dtype"),
    ("cublaslt_probe.probe", "Probe._calibrate_spin", "spin and gap calibration"),
    ("cublaslt_probe.probe", "Probe._calibrate_gap", "spin and gap calibration"),
    ("cublaslt_probe.probe", "Probe.profile", "profiler and CUPTI started (first kernel capture)"),
    ("cublaslt_probe.probe", "HeuristicCompanion.wait_ready", "heuristic companion ready"),
]


# --- the child: one command in a fresh process -------------------------------------------------------------------
def _wrap(phases: list, module: str, path: str, label: str, once: bool = False) -> None:
    import importlib
    owner = importlib.import_module(module)
    *outer, name = path.split(".")
    for part in outer:
        owner = getattr(owner, part)
    fn = getattr(owner, name)
    state = {"n": 0}

    def timed(*a, **kw):
        state["n"] += 1
        if once and state["n"] > 1:
            return fn(*a, **kw)
        t = time.perf_counter()
        try:
            return fn(*a, **kw)
        finally:
            phases.append((label, time.perf_counter() - t))
    setattr(owner, name, timed)


def child(name: str, out: str, extra: list) -> None:
    t0 = time.perf_counter()
    import torch  # noqa: F401
    t_torch = time.perf_counter() - t0
    if name == "import_torch":
        with open(out, "w") as f:
            json.dump({"import_torch_s": t_torch}, f)
        return
    try:
        from cublaslt_probe.gpu import probe as probe_mod
    except ImportError:   # a tree from before the package's folders: its probe sat at the top
        from cublaslt_probe import probe as probe_mod
    from cublaslt_probe.cli import main
    phases, made = [], {}
    own = hasattr(probe_mod, "StartUp")
    if not own:
        for module, path, label in BASE_PHASES:
            _wrap(phases, module, path, label, once=path == "Probe.profile")
    init = probe_mod.Probe.__init__

    def watched(self, *a, **kw):
        t = time.perf_counter()
        made["t_start"] = t - t0
        init(self, *a, **kw)
        made["probe"] = self
        made["start_s"] = time.perf_counter() - t
        made["t_ready"] = time.perf_counter() - t0
    probe_mod.Probe.__init__ = watched
    try:
        main([*COMMANDS[name], *extra], standalone_mode=False)
    finally:
        t_end = time.perf_counter() - t0
    p = made.get("probe")
    res = {"import_torch_s": t_torch, "total_s": t_end, "probe_start_s": made.get("start_s"),
           "probe_ready_at_s": made.get("t_ready")}
    if own and p is not None:
        phases = list(p.startup.phases)
    by: dict = {}
    for label, s in phases:
        by[label] = by.get(label, 0.0) + s
    if not own and made.get("start_s") is not None:
        # phases paid inside the constructor; the rest of its time is "other" (the library's set-ups joined...)
        by["other (set-ups joined, marker, ...)"] = max(0.0, made["start_s"] - sum(by.values()))
    res["phases"] = {k: round(s, 4) for k, s in by.items()}
    res["helpers"] = bool(p is not None and getattr(p, "_companion", None) is not None)
    with open(out, "w") as f:
        json.dump(res, f)


def threshold_child(out: str) -> None:
    """The companion's start alone (spawned, to ready), then the heuristic measured in this process per question
    for the decode preset's first 256 GEMMs' questions."""
    from cublaslt_probe import sweep
    from cublaslt_probe.gpu import lt
    from cublaslt_probe.gpu.heuristic_helpers import HeuristicCompanion, heuristic_groups
    from cublaslt_probe.gpu.probe import Probe
    t = time.perf_counter()
    comp = HeuristicCompanion()
    comp.wait_ready()
    ready = time.perf_counter() - t
    comp.close()
    probe = Probe(pipeline=False)
    cases = [c for c in sweep.plan("decode").cases[:256] if not c.grouped]
    _, problems = heuristic_groups([({}, c) for c in cases], probe.heuristic_workspace)
    lt.measure_heuristics(probe.lib, list(problems.values())[:8], 5)   # warm
    t = time.perf_counter()
    lt.measure_heuristics(probe.lib, list(problems.values()), 5)
    per = (time.perf_counter() - t) / len(problems)
    with open(out, "w") as f:
        json.dump({"companion_ready_s": ready, "heuristic_in_process_ms_per_question": per * 1e3,
                   "questions": len(problems), "break_even_questions": ready / per}, f)


# --- the parent ---------------------------------------------------------------------------------------------------
def run_child(tree: str, name: str, extra: list, tmp: str, timeout: float) -> dict:
    out = os.path.join(tmp, f"{name}-{abs(hash((tree, time.time())))}.json")
    env = {**os.environ, "PYTHONPATH": tree + os.pathsep + os.environ.get("PYTHONPATH", "")}
    t = time.perf_counter()
    p = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", name, "--child-out", out, "--", *extra],
                       cwd=tree, env=env, capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - t
    if p.returncode != 0:
        return {"error": p.stderr[-1500:], "wall_s": wall}
    with open(out) as f:
        res = json.load(f)
    res["wall_s"] = wall
    return res


def same_answer(a: dict, b: dict) -> dict:
    """The explain evidence of the two trees compared: kernels, log lines (without pointers), candidates' identity,
    time ratio."""
    import re

    from cublaslt_probe.logs import without_pointers

    def same(lines):   # two processes' lines of one call: no time stamps, pointers or pid
        return [re.sub(r"^\[cublasLt\]\[\d+\]", "[cublasLt]", x) for x in without_pointers(lines)]
    ra, rb = a["record"], b["record"]
    ident = ("rank", "algo_id", "tile", "stages", "split_k", "kernels")
    return {"kernels": ra["kernels"] == rb["kernels"],
            "log_lines": bool(ra["log_lines"]) and same(ra["log_lines"]) == same(rb["log_lines"]),
            "candidates": [[c.get(k) for k in ident] for c in a.get("candidates") or []] ==
                          [[c.get(k) for k in ident] for c in b.get("candidates") or []],
            "time_ratio": rb["time_us"] / ra["time_us"] if ra.get("time_us") and rb.get("time_us") else None}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", help="the other tree (its repository root)")
    ap.add_argument("--rounds", type=int, default=2, help="rounds of import torch and explain (audit and sweep: one)")
    ap.add_argument("--out", default="first_answer.json")
    ap.add_argument("--threshold", action="store_true")
    ap.add_argument("--reverse", action="store_true", help="this tree first in each pair of runs")
    ap.add_argument("--only", default="", help="comma-separated: import_torch,explain,audit_measure,sweep_decode")
    ap.add_argument("--sweeps", type=int, default=1, help="runs of sweep_decode per tree")
    ap.add_argument("--keep", help="a folder to keep the sweeps' datasets and raw files in (their per-GEMM phases)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--child-out", help=argparse.SUPPRESS)
    ap.add_argument("extra", nargs="*", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child == "threshold":
        return threshold_child(a.child_out)
    if a.child:
        return child(a.child, a.child_out, a.extra)
    trees = {"before": os.path.abspath(a.base), "after": TREE} if a.base else {"after": TREE}
    only = set(a.only.split(",")) if a.only else {"import_torch", "explain", "audit_measure", "sweep_decode"}
    res: dict = {"trees": list(trees), "runs": {}}

    def save():
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
    with tempfile.TemporaryDirectory() as tmp:
        order = list(trees)[::-1] if a.reverse else list(trees)
        for name, rounds in (("import_torch", a.rounds), ("explain", a.rounds), ("audit_measure", 1),
                             ("sweep_decode", a.sweeps)):
            if name not in only:
                continue
            for r in range(rounds):
                for tree in (order if r % 2 == 0 else order[::-1]):
                    extra = []
                    if name == "explain":
                        extra = ["--save", os.path.join(tmp, f"explain-{tree}-{r}.json")]
                    elif name == "sweep_decode":
                        extra = ["-o", os.path.join(a.keep or tmp, f"decode-{tree}-{r}.parquet")]
                    got = run_child(trees[tree], name, extra, tmp, 280)
                    if name == "explain" and "error" not in got:
                        with open(extra[1]) as f:
                            ev = json.load(f)
                        got["evidence"] = {"record": ev["record"], "candidates": ev.get("candidates")}
                    if name == "sweep_decode" and "error" not in got:
                        import pyarrow.parquet as pq
                        n = pq.read_metadata(extra[1]).num_rows
                        got["gemms"] = n
                        got["gemms_per_s"] = n / (got["total_s"] - got["probe_ready_at_s"])
                    res["runs"].setdefault(name, {}).setdefault(tree, []).append(got)
                    print(f"{name:14s} {tree:6s} " + (f"ERROR {got['error'][-300:]}" if "error" in got else
                          f"wall {got['wall_s']:.2f} s, import torch {got['import_torch_s']:.2f} s"
                          + (f", probe start {got['probe_start_s']:.2f} s" if got.get("probe_start_s") else "")
                          + (f", {got['gemms_per_s']:.1f} GEMMs/s" if got.get("gemms_per_s") else "")), flush=True)
                    save()
        if a.threshold:
            env = {**os.environ, "PYTHONPATH": TREE}
            out = os.path.join(tmp, "threshold.json")
            subprocess.run([sys.executable, os.path.abspath(__file__), "--child", "threshold", "--child-out", out],
                           cwd=TREE, env=env, timeout=240, check=True)
            with open(out) as f:
                res["threshold"] = json.load(f)
            print("threshold:", res["threshold"], flush=True)
    ex = res["runs"].get("explain", {})
    if len(ex) == 2 and all("evidence" in x for t in ex.values() for x in t):
        res["same_answer"] = same_answer(ex["before"][0]["evidence"], ex["after"][0]["evidence"])
    for t in res["runs"].get("explain", {}).values():
        for x in t:
            x.pop("evidence", None)   # compared above; not kept in the results file
    summary = {}
    for name, per in res["runs"].items():
        for tree, xs in per.items():
            ok = [x for x in xs if "error" not in x]
            if ok:
                summary[f"{name}.{tree}.wall_s"] = round(statistics.median(x["wall_s"] for x in ok), 2)
                if ok[0].get("probe_start_s") is not None:
                    summary[f"{name}.{tree}.probe_start_s"] = round(
                        statistics.median(x["probe_start_s"] for x in ok), 2)
                if ok[0].get("gemms_per_s"):
                    rate = statistics.median(x["gemms_per_s"] for x in ok)
                    summary[f"{name}.{tree}.gemms_per_s"] = round(rate, 1)
    res["summary"] = summary
    save()
    print(json.dumps(summary, indent=1))
    print(json.dumps(res.get("same_answer"), indent=1))


if __name__ == "__main__":
    main()
