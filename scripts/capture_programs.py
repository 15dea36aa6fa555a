"""Capture real programs into run folders with `cublaslt_probe.capture` (run on the GPU machine).

    PYTHONPATH=. python3 scripts/capture_programs.py --out OUT [--only NAME,...]

Each program is built from a config with random weights (no downloads), warmed up, then captured for
`--steps` steps into OUT/NAME/ (trace.json.gz, cublaslt.log, env.json). A program that fails is reported
and the others still run. OUT/summary.json lists, per program, the step wall times and what failed.

Programs:
- llama_prefill: Llama-3-8B-shaped (2 layers, real widths and vocabulary), bf16, prefill 1 x 2048 tokens.
- llama_decode: the same model, decode batch 8 (one token per step over a 512-token KV cache).
- llama_decode_with_modules: the same decode under a plain torch.profiler(with_modules=True) and no module
  ranges of ours (a trace "captured elsewhere").
- mixtral_moe: a Mixtral-shaped MoE model (1 layer, 8 experts, top 2), experts through torch's grouped GEMM,
  prefill 1 x 2048 tokens.
- gpt2_train: a GPT-2-shaped training step (12 layers, vocabulary 50257), fp32 with tf32, AdamW, 8 x 512.
- gpt2_train_padvocab: the same with the vocabulary padded to 50304 (the what-if of the first).
- compiled_mlp: a torch.compile'd bf16 MLP block (LayerNorm, Linear, GELU, Linear) at 4096 tokens.
- compiled_mm_autotune: a torch.compile'd bf16 Linear with max-autotune restricted to Triton templates.
- sdpa_<flash|efficient|cudnn|math>: bf16 attention forward+backward through each SDPA backend.
- fp8_linear: fp8 linears through torch._scaled_mm at 16 and 2048 tokens.
- odd_linear: bf16 linears with a 4095-wide weight (leading dimensions not 16-byte aligned) and 4096.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from cublaslt_probe.gpu.recorder import capture

DEV = "cuda"
BF16 = torch.bfloat16


def _build(cls, config, dtype=BF16):
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(DEV):
            m = cls(config)
    finally:
        torch.set_default_dtype(old)
    return m.eval()


def llama_config():
    from transformers import LlamaConfig
    return LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=2,
                       num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
                       rope_theta=500000.0, tie_word_embeddings=False)


_LLAMA = {}


def llama():
    if "m" not in _LLAMA:
        from transformers import LlamaForCausalLM
        _LLAMA["m"] = _build(LlamaForCausalLM, llama_config())
    return _LLAMA["m"]


def prog_llama_prefill():
    model = llama()
    ids = torch.randint(0, 128256, (1, 2048), device=DEV)

    def step():
        with torch.no_grad():
            model(ids, use_cache=False)
    return model, step


def _decode_state(model, batch=8, ctx=512):
    from transformers import DynamicCache
    ids = torch.randint(0, 128256, (batch, ctx), device=DEV)
    with torch.no_grad():
        out = model(ids, use_cache=True, past_key_values=DynamicCache())
    return out.past_key_values, torch.randint(0, 128256, (batch, 1), device=DEV)


def prog_llama_decode():
    model = llama()
    cache, nxt = _decode_state(model)

    def step():
        with torch.no_grad():
            model(nxt, use_cache=True, past_key_values=cache)
    return model, step


def prog_mixtral_moe():
    from transformers import MixtralConfig, MixtralForCausalLM
    cfg = MixtralConfig(vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=1,
                        num_attention_heads=32, num_key_value_heads=8, num_local_experts=8,
                        num_experts_per_tok=2, max_position_embeddings=8192)
    model = _build(MixtralForCausalLM, cfg)
    try:
        model.set_experts_implementation("grouped_mm")
    except Exception as e:  # noqa: BLE001  (older transformers: the default path runs)
        print("mixtral_moe: set_experts_implementation failed:", e)
    ids = torch.randint(0, 32000, (1, 2048), device=DEV)

    def step():
        with torch.no_grad():
            model(ids, use_cache=False)
    return model, step


def _gpt2_train(vocab):
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    cfg = GPT2Config(vocab_size=vocab, n_positions=1024, n_embd=768, n_layer=12, n_head=12)
    model = _build(GPT2LMHeadModel, cfg, dtype=torch.float32).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    ids = torch.randint(0, 50257, (8, 512), device=DEV)

    def step():
        out = model(ids, labels=ids)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return model, step


def prog_gpt2_train():
    return _gpt2_train(50257)


def prog_gpt2_train_padvocab():
    return _gpt2_train(50304)


class MLP(torch.nn.Module):
    def __init__(self, d=4096, h=14336):
        super().__init__()
        self.norm = torch.nn.LayerNorm(d)
        self.up = torch.nn.Linear(d, h)
        self.down = torch.nn.Linear(h, d)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


def prog_compiled_mlp():
    with torch.device(DEV):
        block = MLP().to(BF16)
    model = torch.compile(block)
    x = torch.randn(4096, 4096, device=DEV, dtype=BF16)

    def step():
        with torch.no_grad():
            model(x)
    return model, step


def prog_compiled_mm_autotune():
    import torch._inductor.config as ic
    ic.max_autotune = True
    ic.max_autotune_gemm_backends = "TRITON"
    with torch.device(DEV):
        lin = torch.nn.Linear(4096, 4096, bias=False).to(BF16)
    model = torch.compile(lin)
    x = torch.randn(2048, 4096, device=DEV, dtype=BF16)

    def step():
        with torch.no_grad():
            model(x)
    return model, step


def _sdpa(backend_name):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backend = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
               "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}[backend_name]

    class Attention(torch.nn.Module):
        def forward(self, q, k, v):
            with sdpa_kernel(backend):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    model = Attention()
    q, k, v = (torch.randn(4, 32, 2048, 128, device=DEV, dtype=BF16, requires_grad=True) for _ in range(3))

    def step():
        model(q, k, v).sum().backward()
    return model, step


def prog_fp8_linear():
    class FP8Linear(torch.nn.Module):
        def __init__(self, k, n):
            super().__init__()
            self.w = torch.randn(n, k, device=DEV).to(torch.float8_e4m3fn)
            self.scale = torch.ones((), device=DEV)

        def forward(self, x):
            return torch._scaled_mm(x, self.w.t(), scale_a=self.scale, scale_b=self.scale, out_dtype=BF16)

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.up = FP8Linear(4096, 14336)
            self.down = FP8Linear(14336, 4096)

        def forward(self, x):
            return self.down(self.up(x).to(torch.float8_e4m3fn))
    model = Model()
    xs = [torch.randn(t, 4096, device=DEV).to(torch.float8_e4m3fn) for t in (16, 2048)]

    def step():
        for x in xs:
            model(x)
    return model, step


def prog_odd_linear():
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.odd = torch.nn.Linear(4096, 4095, bias=False)
            self.even = torch.nn.Linear(4096, 4096, bias=False)

        def forward(self, x):
            return self.odd(x), self.even(x)
    with torch.device(DEV):
        model = Model().to(BF16)
    x = torch.randn(2048, 4096, device=DEV, dtype=BF16)

    def step():
        with torch.no_grad():
            model(x)
    return model, step


PROGRAMS = {
    "llama_prefill": prog_llama_prefill,
    "llama_decode": prog_llama_decode,
    "llama_decode_with_modules": prog_llama_decode,
    "mixtral_moe": prog_mixtral_moe,
    "gpt2_train": prog_gpt2_train,
    "gpt2_train_padvocab": prog_gpt2_train_padvocab,
    "compiled_mlp": prog_compiled_mlp,
    "compiled_mm_autotune": prog_compiled_mm_autotune,
    "sdpa_flash": lambda: _sdpa("flash"),
    "sdpa_efficient": lambda: _sdpa("efficient"),
    "sdpa_cudnn": lambda: _sdpa("cudnn"),
    "sdpa_math": lambda: _sdpa("math"),
    "fp8_linear": prog_fp8_linear,
    "odd_linear": prog_odd_linear,
}


def step_ms(step, reps=5) -> float:
    """Median wall time of one step, GPU synchronised (for predicted-vs-measured comparisons)."""
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    return times[len(times) // 2]


def run_one(name: str, out: str, steps: int, warmup: int) -> dict:
    t0 = time.perf_counter()
    model, step = PROGRAMS[name]()
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    info = {"build_and_warmup_s": round(time.perf_counter() - t0, 3)}
    folder = os.path.join(out, name)
    if name.endswith("_with_modules"):
        from torch.profiler import ProfilerActivity, profile
        os.makedirs(folder, exist_ok=True)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True,
                     with_modules=True) as prof:
            for _ in range(steps):
                step()
            torch.cuda.synchronize()
        prof.export_chrome_trace(os.path.join(folder, "trace.json"))
        os.system(f"gzip -f {os.path.join(folder, 'trace.json')}")
    else:
        with capture(folder, model=model, label=name) as cap:
            for _ in range(steps):
                with cap.step():
                    step()
        info["step_wall_s"] = cap.step_wall_s
    info["step_ms_median"] = round(step_ms(step), 4)
    return info


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default="")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=3)
    a = ap.parse_args()
    names = [n for n in a.only.split(",") if n] or list(PROGRAMS)
    os.makedirs(a.out, exist_ok=True)
    summary = {}
    for name in names:
        t0 = time.perf_counter()
        try:
            summary[name] = run_one(name, a.out, a.steps, a.warmup)
        except Exception:  # noqa: BLE001  (one failing program must not stop the others)
            summary[name] = {"error": traceback.format_exc()}
            traceback.print_exc()
        summary[name]["total_s"] = round(time.perf_counter() - t0, 2)
        print(name, json.dumps({k: v for k, v in summary[name].items() if k != "error"}), flush=True)
        torch.cuda.empty_cache()
    _LLAMA.clear()
    with open(os.path.join(a.out, "summary.json"), "w") as f:
        json.dump({"torch": torch.__version__, "gpu": torch.cuda.get_device_name(0), "programs": summary}, f,
                  indent=1)


if __name__ == "__main__":
    main()
