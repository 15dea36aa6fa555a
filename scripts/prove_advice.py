"""Apply an audit's advice to a real program and re-measure the whole step (run on the GPU machine).

    PYTHONPATH=. python3 scripts/prove_advice.py --out OUT/prove.json [--rounds 15]

Each pair is (the program as captured, the program with one advice applied), both from
`scripts/capture_programs.py`, built once and stepped alternately in one process (A, B, A, B, ...: the host's
speed drifts between processes, not within one round). A step's time is its CUDA-event span on the stream
(`gpu_ms`, what the advice's µs-per-step saving predicts) and its synchronised wall time (`wall_ms`).

Pairs:
- gpt2_vocab: GPT-2 training step, vocabulary 50257 -> 50304 (pad to a multiple of 64);
- gpt2_vocab_50264: the same step, vocabulary 50257 -> 50264 (a multiple of 8: the smallest padding that `audit`
  finds within noise of the best);
- odd_linear_pad: a bf16 linear 4096 -> 4095 padded to 4096 (the other linear of the step unchanged);
- llama_decode_lt: Llama decode step, torch's default cuBLAS path -> its cuBLASLt path
  (`torch.backends.cuda.preferred_blas_library("cublaslt")`). Confounded, kept as it ran: each step of A meets
  a KV length no step had before, and B's step right after meets the same length, whose cuDNN attention plan A
  has just built; the difference is the plan build (see `stalls`), not the BLAS path;
- llama_decode_flash: Llama decode step, SDPA through cuDNN (torch's choice) -> pinned to FlashAttention
  (`torch.nn.attention.sdpa_kernel(SDPBackend.FLASH_ATTENTION)`): the advice for a host stall in cuDNN
  attention at each new KV length. B never runs cuDNN attention, so A's plan builds are its own.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import capture_programs as cp


def odd_linear_padded():
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.odd = torch.nn.Linear(4096, 4096, bias=False)
            self.even = torch.nn.Linear(4096, 4096, bias=False)

        def forward(self, x):
            return self.odd(x)[:, :4095], self.even(x)
    with torch.device(cp.DEV):
        model = Model().to(cp.BF16)
    x = torch.randn(2048, 4096, device=cp.DEV, dtype=cp.BF16)

    def step():
        with torch.no_grad():
            model(x)
    return model, step


def with_blas(builder, lib):
    def build():
        model, step = builder()

        def wrapped():
            old = torch.backends.cuda.preferred_blas_library()
            torch.backends.cuda.preferred_blas_library(lib)
            try:
                step()
            finally:
                torch.backends.cuda.preferred_blas_library(old)
        return model, wrapped
    return build


def with_sdpa(builder, backend_name):
    def build():
        from torch.nn.attention import SDPBackend, sdpa_kernel
        model, step = builder()
        backend = getattr(SDPBackend, backend_name)

        def wrapped():
            with sdpa_kernel(backend):
                step()
        return model, wrapped
    return build


PAIRS = {
    "gpt2_vocab": (cp.prog_gpt2_train, cp.prog_gpt2_train_padvocab),
    "gpt2_vocab_50264": (cp.prog_gpt2_train, lambda: cp._gpt2_train(50264)),
    "odd_linear_pad": (cp.prog_odd_linear, odd_linear_padded),
    "llama_decode_lt": (cp.prog_llama_decode, with_blas(cp.prog_llama_decode, "cublaslt")),
    "llama_decode_flash": (cp.prog_llama_decode, with_sdpa(cp.prog_llama_decode, "FLASH_ATTENTION")),
}


def one(step) -> tuple[float, float]:
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    s.record()
    step()
    e.record()
    e.synchronize()
    return s.elapsed_time(e), (time.perf_counter() - t0) * 1e3


def measure(a_step, b_step, rounds: int) -> dict:
    for _ in range(3):
        a_step(); b_step()  # noqa: E702  the timed pair on one line
    res = {"a_gpu": [], "b_gpu": [], "a_wall": [], "b_wall": []}
    for _ in range(rounds):
        for tag, fn in (("a", a_step), ("b", b_step)):
            g, w = one(fn)
            res[f"{tag}_gpu"].append(g)
            res[f"{tag}_wall"].append(w)
    med = {k: statistics.median(v) for k, v in res.items()}
    return {"rounds": rounds, **{f"{k}_ms": round(v, 4) for k, v in med.items()},
            "saving_gpu_ms": round(med["a_gpu"] - med["b_gpu"], 4),
            "saving_wall_ms": round(med["a_wall"] - med["b_wall"], 4),
            "samples": {k: [round(x, 4) for x in v] for k, v in res.items()}}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--only", default="")
    a = ap.parse_args()
    out = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "pairs": {}}
    for name in [n for n in a.only.split(",") if n] or list(PAIRS):
        build_a, build_b = PAIRS[name]
        try:
            _, sa = build_a()
            _, sb = build_b()
            out["pairs"][name] = measure(sa, sb, a.rounds)
        except Exception as e:  # noqa: BLE001
            out["pairs"][name] = {"error": f"{type(e).__name__}: {e}"}
        print(name, json.dumps({k: v for k, v in out["pairs"][name].items() if k != "samples"}), flush=True)
        cp._LLAMA.clear()
        torch.cuda.empty_cache()
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
