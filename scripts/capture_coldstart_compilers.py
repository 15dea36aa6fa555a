"""Capture the compilers' cold-start fixtures (run on the GPU machine, from the repository root).

    PYTHONPATH=. python3 scripts/capture_coldstart_compilers.py --out OUT [--only cupy,jax] [--rounds 2]

Runs `cublaslt-probe cold-start --save` on each program of scripts/coldstart_programs/ (CuPy kernels + a
matmul, a plain Triton kernel + a torch matmul, a Numba kernel, a jitted JAX MLP, a torch.compile'd block, and
two steps that are their program's first use of JAX or of Numba),
`--rounds` times: OUT/NAME_runK.json is round K's saved run and OUT/NAME_runK.txt its rendering. Every
`cold-start` runs alone, one after another (round 1: each program in turn, then round 2 in the same order): a
program that shared the machine's CPUs with another would compile slower by a varying amount, and round 2 could
not repeat round 1. OUT/versions.json holds the versions of the frameworks found.
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
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "versions.json"), "w") as f:
        json.dump(versions(), f, indent=1)
    names = [n.strip() for n in a.only.split(",") if n.strip()]
    for k in range(1, a.rounds + 1):
        for name in names:
            t0 = time.time()
            prog = os.path.join(HERE, "coldstart_programs", f"{name}_prog.py")
            save = os.path.join(a.out, f"{name}_run{k}.json")
            cmd = [sys.executable, "-m", "cublaslt_probe", "cold-start", "--steps", str(a.steps), "--label", name,
                   "--timeout", str(a.timeout), "--save", save, "--", "python", prog]
            with open(os.path.join(a.out, f"{name}_run{k}.txt"), "w") as log:
                rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT).returncode
            print(f"round {k} {name}: exit {rc} in {time.time() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
