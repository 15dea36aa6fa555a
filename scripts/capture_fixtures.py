#!/usr/bin/env python3
"""Capture the real GPU fixtures the CPU tests use (run on an NVIDIA GPU machine).

    PYTHONPATH=. python3 scripts/capture_fixtures.py --out OUTDIR [--parts names,candidates,logs]

Parts:
  names       probe a spread of shapes x dtypes x layouts x ops x backends; writes probe_raw.jsonl (one raw
              probe record per GEMM: kernels, log lines, times) and names.jsonl (each distinct kernel name
              with one GEMM that launched it).
  candidates  cuBLASLt heuristic candidates (top 32) for a set of problems, each run once under the profiler:
              nvjet_configs.jsonl (algo config <-> launched kernels, waves, time).
  logs        child processes with CUBLASLT_LOG_LEVEL 2/4/5/mask 31 and CUBLAS_LOGINFO_DBG=1 running a known
              list of GEMMs (scripts/log_child.py); logs + manifest.jsonl.
Also writes env.json (GPU, driver, versions) for the PROVENANCE files.
"""
import argparse
import json
import os
import subprocess
import sys
import time
import traceback

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from cublaslt_probe.cases import Case, invalid_reason

HERE = os.path.dirname(os.path.abspath(__file__))

SHAPES = [  # torch view (M, N, K): decode, prefill, square, odd, tiny, large-K, skinny
    (1, 4096, 4096), (16, 4096, 4096), (128, 4096, 4096), (1024, 4096, 4096), (4096, 4096, 4096),
    (4096, 14336, 4096), (4096, 4096, 14336), (127, 4095, 8191), (2048, 2048, 65536), (64, 64, 64),
    (3, 5, 7), (1, 1, 1024), (8, 1024, 1), (256, 256, 256), (8192, 1024, 1024), (32, 128256, 4096),
]


def names_cases():
    cases = []
    for (m, n, k) in SHAPES:
        for dt in ("fp32", "tf32", "fp16", "bf16"):
            for lay in ("NN", "NT", "TN", "TT"):
                for be in ("torch", "torch-lt", "lt"):
                    cases.append(Case(be, "mm", dt, lay, m, n, k))
                cases.append(Case("torch", "addmm", dt, lay, m, n, k))
                if dt in ("fp32", "fp16"):
                    cases.append(Case("cupy", "mm", dt, lay, m, n, k))
        for dt in ("fp8", "fp8_e5m2"):
            for be in ("torch", "lt"):
                cases.append(Case(be, "scaled_mm", dt, "NT", m, n, k))
    for (m, n, k) in [(128, 128, 64), (512, 512, 512), (1, 4096, 128), (2048, 2048, 128)]:
        for dt in ("fp32", "fp16", "bf16"):
            for lay in ("NN", "NT", "TN", "TT"):
                cases.append(Case("torch", "bmm", dt, lay, m, n, k, 8))
                if dt != "bf16":
                    cases.append(Case("cupy", "bmm", dt, lay, m, n, k, 8))
                cases.append(Case("lt", "bmm", dt, lay, m, n, k, 8))
    return [c for c in cases if not invalid_reason(c)]


def part_names(out, probe):
    cases = names_cases()
    t0 = time.time()
    recs = []
    with open(os.path.join(out, "probe_raw.jsonl"), "w") as f:
        for i in range(0, len(cases), 48):
            for r in probe.run_window(cases[i:i + 48]):
                recs.append(r)
                f.write(json.dumps(r) + "\n")
    dt = time.time() - t0
    errs = [r for r in recs if r["error"]]
    print(f"names: {len(recs)} GEMMs in {dt:.1f}s ({len(recs)/dt:.0f}/s), {len(errs)} errors", flush=True)
    for r in errs[:15]:
        print("  ERR", r["key"], r["error"][:200], flush=True)
    seen = {}
    for r in recs:
        for kname in r["kernels"]:
            if kname not in seen:
                seen[kname] = {"kernel": kname, "backend": r["backend"], "op": r["op"], "dtype": r["dtype"],
                               "layout": r["layout"], "m": r["m"], "n": r["n"], "k": r["k"], "batch": r["batch"]}
    with open(os.path.join(out, "names.jsonl"), "w") as f:
        for v in seen.values():
            f.write(json.dumps(v) + "\n")
    print(f"names: {len(seen)} distinct kernel names", flush=True)


CAND_PROBLEMS = [  # torch view
    (16, 4096, 4096), (128, 4096, 4096), (4096, 4096, 4096), (1024, 14336, 4096), (4096, 1024, 14336),
    (127, 4095, 8191), (1, 4096, 4096), (2048, 2048, 65536),
]


def part_candidates(out, probe):
    from cublaslt_probe.gpu.alternatives import lt_candidates
    t0 = time.time()
    n = 0
    with open(os.path.join(out, "nvjet_configs.jsonl"), "w") as f:
        for (m, nn, k) in CAND_PROBLEMS:
            for dt in ("bf16", "fp16", "fp32", "tf32", "fp8"):
                lays = ["NT"] if dt == "fp8" else ["NN", "NT", "TN", "TT"]
                for lay in lays:
                    op = "scaled_mm" if dt == "fp8" else "mm"
                    c = Case("lt", op, dt, lay, m, nn, k)
                    try:
                        rows = lt_candidates(probe, c, top=32, reps=5)
                    except Exception as e:  # noqa: BLE001
                        print("  cand ERR", c.key, e, flush=True)
                        continue
                    for r in rows:
                        r.update({"problem": c.key, **c.as_dict(), **c.blas})
                        f.write(json.dumps(r) + "\n")
                        n += 1
    print(f"candidates: {n} rows in {time.time()-t0:.1f}s", flush=True)


LOG_RUNS = {  # name: (env, case keys)
    "level2_torch": ({"CUBLASLT_LOG_LEVEL": "2"}, "torch"),
    "level2_torchlt": ({"CUBLASLT_LOG_LEVEL": "2"}, "torch-lt"),
    "level2_mixed": ({"CUBLASLT_LOG_LEVEL": "2"}, "mixed"),
    "level4_torch": ({"CUBLASLT_LOG_LEVEL": "4"}, "small"),
    "level5_torch": ({"CUBLASLT_LOG_LEVEL": "5"}, "small"),
    "mask31_torch": ({"CUBLASLT_LOG_MASK": "31"}, "small"),
}


def log_cases(which):
    shapes = [(1, 4096, 4096), (16, 4096, 4096), (128, 4096, 4096), (4096, 4096, 4096), (127, 4095, 8191),
              (2048, 2048, 65536), (8, 1024, 1)]
    cs = []
    if which in ("torch", "torch-lt"):
        for (m, n, k) in shapes:
            for dt in ("fp32", "tf32", "fp16", "bf16"):
                for lay in ("NN", "NT", "TN", "TT"):
                    cs.append(Case(which, "mm", dt, lay, m, n, k))
    elif which == "mixed":
        for (m, n, k) in shapes:
            for dt in ("fp16", "bf16"):
                cs.append(Case("torch", "addmm", dt, "NT", m, n, k))
                cs.append(Case("torch", "bmm", dt, "NN", m, n, k if k > 1 else 8, 4))
            cs.append(Case("torch", "scaled_mm", "fp8", "NT", m, n, max(k, 16)))
            cs.append(Case("cupy", "mm", "fp32", "TN", m, n, k))
            cs.append(Case("cupy", "mm", "fp16", "NN", m, n, k))
            cs.append(Case("lt", "mm", "bf16", "NT", m, n, k))
    else:
        for (m, n, k) in shapes[:4]:
            cs.append(Case("torch", "mm", "bf16", "NT", m, n, k))
            cs.append(Case("torch-lt", "mm", "fp16", "NN", m, n, k))
            cs.append(Case("torch", "addmm", "bf16", "NT", m, n, k))
    return [c for c in cs if not invalid_reason(c)]


def part_logs(out):
    man_path = os.path.join(out, "manifest.jsonl")
    with open(man_path, "w") as man:
        for name, (env_add, which) in LOG_RUNS.items():
            cases = log_cases(which)
            keys = os.path.join(out, f"{name}.cases")
            with open(keys, "w") as f:
                f.write("\n".join(c.key for c in cases))
            env = {k: v for k, v in os.environ.items() if not k.startswith(("CUBLASLT_LOG", "CUBLAS_LOG"))}
            env.update(env_add)
            env["CUBLASLT_LOG_FILE"] = os.path.join(out, f"{name}.log")
            t0 = time.time()
            p = subprocess.run([sys.executable, os.path.join(HERE, "log_child.py"), keys,
                                os.path.join(out, f"{name}.ran.jsonl")], env=env, capture_output=True,
                               text=True, timeout=300)
            print(f"logs: {name}: rc={p.returncode} {time.time()-t0:.1f}s {p.stderr[-500:]}", flush=True)
            if os.path.exists(os.path.join(out, f"{name}.ran.jsonl")):
                with open(os.path.join(out, f"{name}.ran.jsonl")) as f:
                    for line in f:
                        man.write(json.dumps({"log": f"{name}.log", **json.loads(line)}) + "\n")
            os.remove(keys)
        # cuBLAS's own API log
        cases = log_cases("small")[:6]
        keys = os.path.join(out, "cublas_dbg.cases")
        with open(keys, "w") as f:
            f.write("\n".join(c.key for c in cases))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("CUBLASLT_LOG", "CUBLAS_LOG"))}
        env.update({"CUBLAS_LOGINFO_DBG": "1", "CUBLAS_LOGDEST_DBG": os.path.join(out, "cublas_api.log")})
        p = subprocess.run([sys.executable, os.path.join(HERE, "log_child.py"), keys,
                            os.path.join(out, "cublas_api.ran.jsonl")], env=env, capture_output=True, text=True,
                           timeout=300)
        print(f"logs: cublas_api: rc={p.returncode} {p.stderr[-500:]}", flush=True)
        os.remove(keys)
        if os.path.exists(os.path.join(out, "cublas_api.ran.jsonl")):
            with open(os.path.join(out, "cublas_api.ran.jsonl")) as f:
                for line in f:
                    man.write(json.dumps({"log": "cublas_api.log", **json.loads(line)}) + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--parts", default="names,candidates,logs")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    parts = a.parts.split(",")
    probe = None
    if "names" in parts or "candidates" in parts:
        from cublaslt_probe.gpu.probe import Probe
        probe = Probe()
        env = dict(probe.env)
        env["date"] = time.strftime("%Y-%m-%d")
        env["header"] = (probe.lib.enums.header or "").split("site-packages/")[-1]
        env["n_header_enums"] = len(probe.lib.enums.values)
        env["command"] = "PYTHONPATH=. python3 scripts/capture_fixtures.py " + " ".join(sys.argv[1:])
        with open(os.path.join(a.out, "env.json"), "w") as f:
            json.dump(env, f, indent=1)
        print("env:", json.dumps(env), flush=True)
    for part in parts:
        t0 = time.time()
        try:
            if part == "names":
                part_names(a.out, probe)
            elif part == "candidates":
                part_candidates(a.out, probe)
            elif part == "logs":
                part_logs(a.out)
        except Exception:  # noqa: BLE001
            traceback.print_exc()
        print(f"part {part} done in {time.time()-t0:.1f}s", flush=True)


if __name__ == "__main__":
    main()
