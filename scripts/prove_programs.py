"""Capture, audit, measure and prove real programs end to end (run on the GPU machine).

    PYTHONPATH=. python3 scripts/prove_programs.py --out OUT [--only NAME,...] [--rounds 5]

For each program: build it (random weights, nothing downloaded), warm it up, capture two steps into OUT/NAME/
(`cublaslt_probe.capture`), audit the run, measure its six largest GEMMs and the other GEMMs of their modules (`audit
--measure`'s measurement, saved as OUT/NAME/measure.json), make the advice, then prove every item with a predicted
saving in the same process (`cublaslt_probe.gpu.prove.prove`: rounds alternating the original and the changed
program, the noise floor from original against original) and write OUT/NAME/proof.json. OUT/prove_programs.json lists
per program and item the predicted and proven saving per step, and the cost of proving.

Programs:
- llama_vocab32001: Llama-shaped (2 layers, hidden 4096, intermediate 14336), vocabulary 32001, bf16, prefill
  1 x 2048 tokens (inference).
- gpt2_train: a GPT-2-shaped training step (12 layers, vocabulary 50257), fp32 with tf32, AdamW (fused), 8 x 512
  (the same program as scripts/capture_programs.py's): the vocabulary's padding proven with its backward and
  the optimizer's update through the padded weight, which is tied to the embedding.
- titan_moe_train: a hand-written MoE in torchtitan's style (its router named `router` returns top scores, expert
  indices and tokens per expert; tokens permuted by expert; experts through `torch._grouped_mm`; weighted
  scatter back), 64 experts, top-6, dim 2048, 2 layers, bf16, AdamW, 4 x 2048 tokens.
- mixtral_train: transformers' Mixtral-shaped MoE training step (1 layer, 8 experts, top 2, 1 x 2048 tokens;
  scripts/capture_moe.py's), experts through `grouped_mm`.
- decode_reduce_overhead: the Llama-shaped layers of scripts/capture_graphs.py with a GPT-style vocabulary of
  50257, batch 16 x 8 tokens, under `torch.compile(mode="reduce-overhead")` (replayed from CUDA graphs); the
  model's modules are changed under the compiled program, which compiles and records again.
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
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import capture_programs as cp

from cublaslt_probe.analysis.audit import audit
from cublaslt_probe.analysis.audit.measured import stamp
from cublaslt_probe.analysis.audit.plan import to_measure
from cublaslt_probe.cli._common import clean
from cublaslt_probe.gpu import measure as M
from cublaslt_probe.gpu.prove import ROUNDS, prove_run
from cublaslt_probe.gpu.recorder import capture


def prog_llama_vocab32001():
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=32001, hidden_size=4096, intermediate_size=14336, num_hidden_layers=2,
                      num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
                      tie_word_embeddings=False)
    model = cp._build(LlamaForCausalLM, cfg)
    ids = torch.randint(0, 32001, (1, 2048), device=cp.DEV)

    def step():
        with torch.no_grad():
            model(ids, use_cache=False)
    return model, None, step


def prog_gpt2_train():
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.backends.cuda.matmul.allow_tf32 = True
    cfg = GPT2Config(vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12)
    model = cp._build(GPT2LMHeadModel, cfg, dtype=torch.float32).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    ids = torch.randint(0, 50257, (8, 512), device=cp.DEV)

    def step():
        out = model(ids, labels=ids)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return model, opt, step


class TitanRouter(torch.nn.Module):
    """torchtitan's top-k router: softmax scores, the top-k experts per token, their scores and the tokens per
    expert (named `router`, not `gate`)."""

    def __init__(self, dim, experts, top_k):
        super().__init__()
        self.gate = torch.nn.Linear(dim, experts, bias=False)
        self.experts, self.top_k = experts, top_k

    def forward(self, x):
        scores = torch.softmax(self.gate(x).float(), dim=-1)
        top_scores, idx = torch.topk(scores, self.top_k, dim=-1)
        counts = torch.histc(idx.view(-1).float(), bins=self.experts, min=0, max=self.experts - 1)
        return top_scores, idx, counts.to(torch.int64)


class TitanExperts(torch.nn.Module):
    """The experts as torchtitan runs them: rows permuted by expert, two `torch._grouped_mm` with offsets, SiLU
    gate (w1, w3), then w2."""

    def __init__(self, dim, hidden, experts):
        super().__init__()
        self.w1 = torch.nn.Parameter(torch.randn(experts, dim, hidden) * 0.02)
        self.w3 = torch.nn.Parameter(torch.randn(experts, dim, hidden) * 0.02)
        self.w2 = torch.nn.Parameter(torch.randn(experts, hidden, dim) * 0.02)

    def forward(self, x, counts):
        offs = torch.cumsum(counts, 0, dtype=torch.int32)
        h = torch.nn.functional.silu(torch._grouped_mm(x, self.w1, offs=offs)) * torch._grouped_mm(x, self.w3,
                                                                                                     offs=offs)
        return torch._grouped_mm(h, self.w2, offs=offs)


class TitanMoE(torch.nn.Module):
    def __init__(self, dim=2048, hidden=1408, experts=64, top_k=6):
        super().__init__()
        self.router = TitanRouter(dim, experts, top_k)
        self.experts = TitanExperts(dim, hidden, experts)
        self.top_k = top_k

    def forward(self, x):
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        top_scores, idx, counts = self.router(x)
        order = torch.argsort(idx.view(-1), stable=True)          # token permutation by expert
        rows = x[order // self.top_k]
        out = self.experts(rows, counts) * top_scores.view(-1)[order, None].to(x.dtype)
        y = torch.zeros_like(x).index_add_(0, order // self.top_k, out)   # weighted scatter back
        return y.reshape(shape)


class TitanModel(torch.nn.Module):
    def __init__(self, layers=2, dim=2048, vocab=32000):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.layers = torch.nn.ModuleList(TitanMoE(dim) for _ in range(layers))
        self.norm = torch.nn.RMSNorm(dim)
        self.output = torch.nn.Linear(dim, vocab, bias=False)

    def forward(self, ids):
        h = self.embed(ids)
        for layer in self.layers:
            h = h + layer(h)
        return self.output(self.norm(h))


def prog_titan_moe_train():
    """A hand-written MoE training step in torchtitan's style: 64 experts, top-6, dim 2048, 2 layers, bf16, AdamW,
    4 x 2048 tokens."""
    torch.manual_seed(0)
    model = TitanModel().to(cp.DEV, torch.bfloat16).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, 32000, (4, 2048), device=cp.DEV)

    def step():
        logits = model(ids)
        torch.nn.functional.cross_entropy(logits.view(-1, logits.shape[-1]).float(), ids.view(-1)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return model, opt, step


def prog_mixtral_train():
    import capture_moe as cm
    model, step = cm.mixtral_train()
    return model, None, step


def prog_decode_reduce_overhead():
    import capture_graphs as cg
    model, c = cg.build_forward(vocab=50257)
    ids = torch.randint(0, c["vocab"], (c["batch"], c["seq"]), device=cp.DEV)
    compiled = torch.compile(model, mode="reduce-overhead")

    def step():
        with torch.no_grad():
            torch.compiler.cudagraph_mark_step_begin()
            compiled(ids)
    step.capture_model = compiled      # the capture names the compiled graph's GEMMs by their modules
    return model, None, step


PROGRAMS = {"llama_vocab32001": prog_llama_vocab32001, "gpt2_train": prog_gpt2_train,
            "titan_moe_train": prog_titan_moe_train, "mixtral_train": prog_mixtral_train,
            "decode_reduce_overhead": prog_decode_reduce_overhead}


def run_one(name: str, out: str, rounds: int) -> dict:
    t0 = time.perf_counter()
    model, opt, step = PROGRAMS[name]()
    compiled = getattr(step, "capture_model", None)
    for _ in range(0 if compiled is not None else 3):
        step()
    torch.cuda.synchronize()
    folder = os.path.join(out, name)
    with capture(folder, model=compiled if compiled is not None else model, label=name) as cap:
        for _ in range(3 if compiled is not None else 0):   # compiled inside the capture (its GEMMs' records),
            step()                                           # recorded, warmed: outside the steps
        for _ in range(2):
            with cap.step():
                step()
    a = audit(folder)
    gemms, _ = to_measure([{k: clean(v) for k, v in r.items()} for r in a.rows.to_dict("records")], 6)
    tf32 = bool((a.env.get("capture") or {}).get("allow_tf32"))
    meas = stamp(M.measure_gemms(gemms, allow_tf32=tf32), a, folder)     # as `audit --measure --save` writes it
    mpath = os.path.join(folder, "measure.json")
    with open(mpath, "w") as f:
        json.dump(meas, f, indent=1, default=str)
    t1 = time.perf_counter()
    proof = prove_run(folder, step, model, mpath, optimizer=opt, rounds=rounds)
    proof["program"] = name
    table = [{**{k: r.get(k) for k in ("what", "kind", "status", "predicted_us", "proven_us", "spread_us", "why")},
              "applier_cost_us": (r.get("applier_cost") or {}).get("us"),
              "kernel_saving_us": (r.get("kernels") or {}).get("saving_us")} for r in proof["items"]]
    return {"step_gpu_us": a.step_gpu_us, "items": table, "noise_us": proof["noise"]["rounds_us"],
            "prove_s": round(time.perf_counter() - t1, 2), "total_s": round(time.perf_counter() - t0, 2),
            "restored_differs": proof["restored"]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default="")
    ap.add_argument("--rounds", type=int, default=ROUNDS)
    a = ap.parse_args()
    names = [n for n in a.only.split(",") if n] or list(PROGRAMS)
    os.makedirs(a.out, exist_ok=True)
    summary = {}
    for name in names:
        try:
            summary[name] = run_one(name, a.out, a.rounds)
        except Exception:  # noqa: BLE001  (one failing program must not stop the others)
            summary[name] = {"error": traceback.format_exc()}
            traceback.print_exc()
        print(name, json.dumps(summary[name], default=str)[:3000], flush=True)
        torch.cuda.empty_cache()
    with open(os.path.join(a.out, "prove_programs.json"), "w") as f:
        json.dump({"torch": torch.__version__, "gpu": torch.cuda.get_device_name(0), "programs": summary}, f,
                  indent=1, default=str)


if __name__ == "__main__":
    main()
