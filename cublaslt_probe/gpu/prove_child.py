"""The child of a fresh-process proof: one program started anew, under the settings that must precede torch's first
cuBLASLt handle, its steps timed as the live prover times them.

`python -m cublaslt_probe.gpu.prove_child --blocks B --steps S --warmup W [--blas cublaslt|cublas] -- SCRIPT
[ARGS...]` (`command` builds it, `parse` reads it): with ``--blas`` it sets torch's BLAS preference
(`torch.backends.cuda.preferred_blas_library`) before the script runs; it loads the script as `prove` does
(`runpy.run_path` with run_name ``__cublaslt_probe_prove__``, ``sys.argv`` the script and its arguments, so the
training loop under ``if __name__ == '__main__':`` does not run), runs W untimed steps of its ``step()``, then
B blocks of S steps back to back (`timing.step_block_us`, the live prover's method), and prints one JSON line:
``blocks_us`` and what it ran with (`observed`: torch's preferred BLAS library after the steps, the
CUBLASLT_WORKSPACE_SIZE it started with, torch's version, the GPU). A failure prints ``{"ok": false, ...}`` and
its traceback on stderr, and exits 1. The parent, `gpu.prove`, sets the environment (the workspace variable,
read once by torch before its first cuBLASLt handle) and compares the children.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

RUN_NAME = "__cublaslt_probe_prove__"     # the script is loaded, not run as __main__ (as `cublaslt-probe prove`)
WORKSPACE_VAR = "CUBLASLT_WORKSPACE_SIZE"  # torch's cuBLASLt workspace, in KiB, read before its first handle
BLAS = ("cublaslt", "cublas")
MODULE = "cublaslt_probe.gpu.prove_child"


def command(script: list[str], *, blocks: int, steps: int, warmup: int, blas: str | None = None,
            python: str | None = None) -> list[str]:
    """The child's command line: this module run by `python` (default: this interpreter) on `script` (the path and
    its arguments), `blocks` × `steps` timed steps after `warmup`, torch's BLAS preference set to `blas` first
    (None: left to the script)."""
    if not script:
        raise ValueError("prove_child.command: no script")
    if blas is not None and blas not in BLAS:
        raise ValueError(f"prove_child.command: blas {blas!r} is not one of {', '.join(BLAS)}")
    return ([python or sys.executable, "-m", MODULE, "--blocks", str(blocks), "--steps", str(steps),
             "--warmup", str(warmup)] + (["--blas", blas] if blas else []) + ["--", *script])


def _positive(s: str) -> int:
    v = int(s)
    if v < 1:
        raise argparse.ArgumentTypeError(f"{s} is not a positive integer")
    return v


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """The child's options and the script (path and arguments, everything after ``--``) of a command line that
    `command` built (without the interpreter and ``-m MODULE``)."""
    if "--" not in argv:
        raise SystemExit("prove_child: no script (give it after --)")
    at = argv.index("--")
    p = argparse.ArgumentParser(prog="python -m cublaslt_probe.gpu.prove_child")
    p.add_argument("--blocks", type=_positive, required=True)
    p.add_argument("--steps", type=_positive, required=True)
    p.add_argument("--warmup", type=int, default=0)
    p.add_argument("--blas", choices=BLAS, default=None)
    opts = p.parse_args(argv[:at])
    script = argv[at + 1:]
    if not script:
        raise SystemExit("prove_child: no script after --")
    return opts, script


def blas_name(torch) -> str:
    """torch's preferred BLAS library as `BLAS` names it ('cublaslt', 'cublas'; torch's own name otherwise)."""
    return str(torch.backends.cuda.preferred_blas_library()).rsplit(".", 1)[-1].lower()


def observed(torch, workspace_kib: str | None) -> dict:
    """What the child ran with: torch's BLAS preference now, the workspace variable it started with (KiB, as
    given; None: unset, torch's default), torch's version and the GPU."""
    return {"blas": blas_name(torch), WORKSPACE_VAR: workspace_kib, "torch_version": torch.__version__,
            "gpu": torch.cuda.get_device_name()}


def main(argv: list[str] | None = None) -> int:
    opts, script = parse(sys.argv[1:] if argv is None else argv)
    workspace = os.environ.get(WORKSPACE_VAR)          # as this process started: what torch's handle reads
    try:
        if opts.blas:
            import torch
            torch.backends.cuda.preferred_blas_library(opts.blas)
        import runpy
        old = sys.argv
        sys.argv = list(script)
        try:
            ns = runpy.run_path(script[0], run_name=RUN_NAME)
        finally:
            sys.argv = old
        step = ns.get("step")
        if not callable(step):
            raise RuntimeError(f"{script[0]} defines no step() at its top level")
        import torch

        from cublaslt_probe.gpu.timing import step_block_us
        for _ in range(opts.warmup):
            step()
        blocks = [step_block_us(torch, step, opts.steps) for _ in range(opts.blocks)]
        print(json.dumps({"ok": True, "blocks_us": blocks, "observed": observed(torch, workspace)}), flush=True)
        return 0
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # noqa: BLE001  (the program's own error, a SystemExit too: to the parent)
        import traceback
        traceback.print_exc()
        print(json.dumps({"ok": False, "error": f"{e.__class__.__name__}: {e}"}), flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
