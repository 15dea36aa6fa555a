"""Capture programs as they are deployed (run on the GPU machine): unmodified scripts through
`cublaslt-probe capture -- SCRIPT`, and a decode loop replayed from a CUDA graph.

    PYTHONPATH=. python3 scripts/capture_graphs.py --out OUT [--only NAME,...]

Programs (OUT/NAME/ each; a program that fails is reported in OUT/summary.json and the others still run):
- script_train: `python3 -m cublaslt_probe capture -o OUT/script_train -- scripts/example_user_script.py`
  (a bf16 MLP, three forward+backward steps; the script is not edited).
- script_infer: the same command on scripts/example_infer_script.py: a
  GPT-2-shaped model built from a config (6 layers, random weights, built on the CPU and copied to the GPU as a
  loaded model is), four forward calls of 8 x 256 tokens under torch.no_grad.
- graph_captured: a Llama-3-8B-shaped decode loop (2 layers, real widths and vocabulary, static KV cache of
  512, batch 16, bf16) warmed up and captured into a ``torch.cuda.CUDAGraph`` with `cublaslt_probe.capture`
  open, then replayed 4 times, each replay one `cap.step()`.
- graph_before: the same graph captured before the capture opened; only the 4 replays are captured.

The decode step is plain torch modules (embedding, RMSNorm, q/k/v/o, SDPA over the static cache with a mask
from the position tensor, gate/up/down, lm_head, greedy next token): every op is graph-safe and the position
lives on the GPU, so one graph serves every step.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback

import torch

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)
from cublaslt_probe.recorder import capture  # noqa: E402

DEV = "cuda"
BF16 = torch.bfloat16
HIDDEN, INTER, HEADS, KV_HEADS, HEAD_DIM, VOCAB, LAYERS = 4096, 14336, 32, 8, 128, 128256, 2
BATCH, MAX_LEN, PROMPT = 16, 512, 128

class RMSNorm(torch.nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(n))

    def forward(self, x):
        v = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(v + 1e-5)).to(x.dtype) * self.weight


class Attention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj = torch.nn.Linear(HIDDEN, HEADS * HEAD_DIM, bias=False)
        self.k_proj = torch.nn.Linear(HIDDEN, KV_HEADS * HEAD_DIM, bias=False)
        self.v_proj = torch.nn.Linear(HIDDEN, KV_HEADS * HEAD_DIM, bias=False)
        self.o_proj = torch.nn.Linear(HEADS * HEAD_DIM, HIDDEN, bias=False)
        self.register_buffer("k_cache", torch.zeros(BATCH, KV_HEADS, MAX_LEN, HEAD_DIM))
        self.register_buffer("v_cache", torch.zeros(BATCH, KV_HEADS, MAX_LEN, HEAD_DIM))

    def forward(self, x, pos, mask):
        b = x.shape[0]
        q = self.q_proj(x).view(b, HEADS, 1, HEAD_DIM)
        k = self.k_proj(x).view(b, KV_HEADS, 1, HEAD_DIM)
        v = self.v_proj(x).view(b, KV_HEADS, 1, HEAD_DIM)
        self.k_cache.index_copy_(2, pos, k)
        self.v_cache.index_copy_(2, pos, v)
        o = torch.nn.functional.scaled_dot_product_attention(q, self.k_cache, self.v_cache, attn_mask=mask,
                                                             enable_gqa=True)
        return self.o_proj(o.reshape(b, HEADS * HEAD_DIM))


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.gate_proj = torch.nn.Linear(HIDDEN, INTER, bias=False)
        self.up_proj = torch.nn.Linear(HIDDEN, INTER, bias=False)
        self.down_proj = torch.nn.Linear(INTER, HIDDEN, bias=False)

    def forward(self, x):
        return self.down_proj(torch.nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.input_layernorm = RMSNorm(HIDDEN)
        self.self_attn = Attention()
        self.post_attention_layernorm = RMSNorm(HIDDEN)
        self.mlp = MLP()

    def forward(self, x, pos, mask):
        x = x + self.self_attn(self.input_layernorm(x), pos, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class Decoder(torch.nn.Module):
    """One decode step of a Llama-shaped model over a static KV cache; `tokens` and `pos` are updated in place
    (greedy next token, position + 1), so the step can be replayed from one CUDA graph."""

    def __init__(self):
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(VOCAB, HIDDEN)
        self.layers = torch.nn.ModuleList(Layer() for _ in range(LAYERS))
        self.norm = RMSNorm(HIDDEN)
        self.lm_head = torch.nn.Linear(HIDDEN, VOCAB, bias=False)
        self.register_buffer("tokens", torch.zeros(BATCH, dtype=torch.long))
        self.register_buffer("pos", torch.full((1,), PROMPT, dtype=torch.long))
        self.register_buffer("slots", torch.arange(MAX_LEN))

    def forward(self):
        mask = (self.slots <= self.pos).view(1, 1, 1, MAX_LEN)
        x = self.embed_tokens(self.tokens)
        for layer in self.layers:
            x = layer(x, self.pos, mask)
        logits = self.lm_head(self.norm(x))
        self.tokens.copy_(logits.argmax(-1))
        self.pos.add_(1)
        return logits


def build_decoder():
    old = torch.get_default_dtype()
    torch.set_default_dtype(BF16)
    try:
        with torch.device(DEV):
            m = Decoder()
    finally:
        torch.set_default_dtype(old)
    return m.eval()


def graph_of(model, warmup: int = 3):
    """Warm `model` up on a side stream, then capture one step into a CUDA graph (torch's recipe)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.no_grad(), torch.cuda.stream(s):
        for _ in range(warmup):
            model()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(g):
        model()
    torch.cuda.synchronize()
    return g


def replays(cap, g, n: int = 4) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        with cap.step():
            g.replay()
        out.append(time.perf_counter() - t0)
    return out


def graph_captured(out: str) -> dict:
    model = build_decoder()
    with capture(out, model=model, label="graph_captured") as cap:
        g = graph_of(model)
        walls = replays(cap, g)
    return {"step_wall_s": walls, "graphs": cap._graphs.graphs if cap._graphs else None}


def graph_before(out: str) -> dict:
    model = build_decoder()
    g = graph_of(model)
    with capture(out, model=model, label="graph_before") as cap:
        walls = replays(cap, g)
    return {"step_wall_s": walls}


def step_ms(g, n: int = 20) -> float:
    """Median wall time of a synchronised replay, outside any capture."""
    ts = []
    for _ in range(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        g.replay()
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t0)
    return sorted(ts)[len(ts) // 2] * 1e3


def cli(out: str, script: str) -> dict:
    cmd = [sys.executable, "-m", "cublaslt_probe", "capture", "-o", out, "--", script]
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    if p.returncode:
        raise RuntimeError(f"{' '.join(cmd)}: exit {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-4000:]}")
    return {"command": " ".join(["python3", "-m", "cublaslt_probe", "capture", "-o", out, "--", script]),
            "stdout": p.stdout[-500:], "stderr": p.stderr[-1000:]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default=None)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    progs = {
        "script_train": lambda o: cli(o, "scripts/example_user_script.py"),
        "script_infer": lambda o: cli(o, "scripts/example_infer_script.py"),
        "graph_captured": graph_captured,
        "graph_before": graph_before,
    }
    only = set(args.only.split(",")) if args.only else None
    summary = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(), "programs": {}}
    for name, fn in progs.items():
        if only and name not in only:
            continue
        t0 = time.time()
        try:
            res = fn(os.path.join(args.out, name))
            res["ok"] = True
        except Exception as e:   # one program's failure is reported; the others still run
            res = {"ok": False, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-4000:]}
        res["seconds"] = round(time.time() - t0, 1)
        summary["programs"][name] = res
        print(name, "ok" if res["ok"] else res["error"], res["seconds"], "s", flush=True)
        torch.cuda.empty_cache()
    try:
        summary["replay_step_ms_median"] = step_ms(graph_of(build_decoder()))
    except Exception as e:   # reported, not fatal
        summary["replay_step_ms_median"] = f"{type(e).__name__}: {e}"
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1, default=str)
    return 0 if all(p["ok"] for p in summary["programs"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
