"""Capture the compilers' cold-start fixtures (run on the GPU machine, from the repository root).

    PYTHONPATH=. python3 scripts/capture_coldstart_compilers.py --out OUT [--only cupy,jax] [--rounds 2]
                                                                [--repeat 3] [--budget SECONDS]

Runs `cublaslt-probe cold-start --save` on each program of scripts/coldstart_programs/ (CuPy kernels + a
matmul, a plain Triton kernel + a torch matmul, a Numba kernel, a jitted JAX MLP, a torch.compile'd block, and
two steps that are their program's first use of JAX or of Numba),
`--rounds` times: OUT/NAME_runK.json is round K's saved run and OUT/NAME_runK.txt its rendering. Every
`cold-start` runs alone, one after another (round 1: each program in turn, then round 2 in the same order): a
program that shared the machine's CPUs with another would compile slower by a varying amount, and round 2 could
not repeat round 1. `--repeat N` is cold-start's own (each run made N times, medians and spread; the file
is then NAME_repeatN_runK.json). `--budget S` skips a program whose expected time (`EXPECTED_S` × the repeats)
no longer fits in what is left of S seconds, and says so. OUT/versions.json holds the versions of the
frameworks found.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PROGRAMS = ("cupy", "triton", "numba", "jax", "torch_compile", "jax_first_use", "numba_first_use")
# seconds one round of cold-start took per program on the H200 (the compilers' fixtures: the runs' walls, rounded up)
EXPECTED_S = {"cupy": 35, "triton": 36, "numba": 36, "jax": 60, "torch_compile": 84, "jax_first_use": 48,
              "numba_first_use": 40}
PACKAGES = ("torch", "triton", "cupy-cuda13x", "cupy-cuda12x", "numba", "numba-cuda", "jax", "jaxlib",
            "jax-cuda13-plugin", "jax-cuda12-plugin", "nvidia-cuda-nvrtc")


def versions() -> dict:
    out = {"python": sys.version.split()[0]}
    for p in PACKAGES:
        try:
            out[p] = importlib.metadata.version(p)
        except importlib.metadata.PackageNotFoundError:
            pass
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default=",".join(PROGRAMS))
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--timeout", type=float, default=200.0, help="seconds per child process")
    ap.add_argument("--repeat", type=int, default=1, help="cold-start --repeat")
    ap.add_argument("--budget", type=float, default=None, help="seconds for the whole capture")
    a = ap.parse_args()
    start = time.time()
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "versions.json"), "w") as f:
        json.dump(versions(), f, indent=1)
    names = [n.strip() for n in a.only.split(",") if n.strip()]
    for k in range(1, a.rounds + 1):
        for name in names:
            t0 = time.time()
            need = EXPECTED_S.get(name, 60) * a.repeat
            if a.budget is not None and t0 - start + need > a.budget:
                print(f"round {k} {name}: skipped (expected {need} s, {a.budget - (t0 - start):.0f} s left)",
                      flush=True)
                continue
            prog = os.path.join(HERE, "coldstart_programs", f"{name}_prog.py")
            stem = f"{name}_repeat{a.repeat}_run{k}" if a.repeat > 1 else f"{name}_run{k}"
            save = os.path.join(a.out, f"{stem}.json")
            cmd = [sys.executable, "-m", "cublaslt_probe", "cold-start", "--steps", str(a.steps), "--label", name,
                   "--timeout", str(a.timeout), "--repeat", str(a.repeat), "--save", save, "--", "python", prog]
            with open(os.path.join(a.out, f"{stem}.txt"), "w") as log:
                rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT).returncode
            print(f"round {k} {name}: exit {rc} in {time.time() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
