"""Capture the compilers' cold-start fixtures (run on the GPU machine, from the repository root).

    PYTHONPATH=. python3 scripts/capture_coldstart_compilers.py --out OUT [--only cupy,jax] [--rounds 2]

Runs `cublaslt-probe cold-start --save` on each program of scripts/coldstart_programs/ (CuPy kernels + a
matmul, a plain Triton kernel + a torch matmul, a Numba kernel, a jitted JAX MLP, a torch.compile'd block),
`--rounds` times: OUT/NAME_runK.json is round K's saved run and OUT/NAME_runK.txt its rendering. Within a round
the programs run side by side (one process each, the runs of one program one after another); the rounds run
one after the other, so round 2 repeats round 1 under the same load. OUT/versions.json holds the versions of
the frameworks found.
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
PROGRAMS = ("cupy", "triton", "numba", "jax", "torch_compile")
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
        t0 = time.time()
        procs = {}
        for name in names:
            prog = os.path.join(HERE, "coldstart_programs", f"{name}_prog.py")
            save = os.path.join(a.out, f"{name}_run{k}.json")
            cmd = [sys.executable, "-m", "cublaslt_probe", "cold-start", "--steps", str(a.steps), "--label", name,
                   "--timeout", str(a.timeout), "--save", save, "--", "python", prog]
            log = open(os.path.join(a.out, f"{name}_run{k}.txt"), "w")
            procs[name] = (subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT), log)
        for name, (p, log) in procs.items():
            p.wait()
            log.close()
            print(f"round {k} {name}: exit {p.returncode}", flush=True)
        print(f"round {k}: {time.time() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
