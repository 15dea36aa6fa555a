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
- reduce_overhead: the same layers without a cache (`Forward`, batch 16 x 8 tokens) under
  `torch.compile(mode="reduce-overhead")` (Inductor's cudagraph trees), compiled, recorded and replayed inside
  one capture; the trace trimmed to the graph's recording and the 4 replayed steps.

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
from cublaslt_probe.gpu.recorder import capture

DEV = "cuda"
BF16 = torch.bfloat16
# Llama-3-8B's widths and vocabulary, 2 layers; decode batch 16 over a static cache of 512; `build_decoder` and
# `build_forward` take any of these as keyword arguments (a padded size, for one)
CFG = {"hidden": 4096, "inter": 14336, "heads": 32, "kv_heads": 8, "head_dim": 128, "vocab": 128256, "layers": 2,
       "batch": 16, "max_len": 512, "prompt": 128, "seq": 8}


class RMSNorm(torch.nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(n))

    def forward(self, x):
        v = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(v + 1e-5)).to(x.dtype) * self.weight


class Attention(torch.nn.Module):
    """Llama's attention: q/k/v/o projections and SDPA with grouped KV heads; with `cache`, one new token per
    sequence written into a static KV cache at `pos` (decode), else causal over the input (no cache)."""

    def __init__(self, c: dict, cache: bool):
        super().__init__()
        self.c = c
        self.q_proj = torch.nn.Linear(c["hidden"], c["heads"] * c["head_dim"], bias=False)
        self.k_proj = torch.nn.Linear(c["hidden"], c["kv_heads"] * c["head_dim"], bias=False)
        self.v_proj = torch.nn.Linear(c["hidden"], c["kv_heads"] * c["head_dim"], bias=False)
        self.o_proj = torch.nn.Linear(c["heads"] * c["head_dim"], c["hidden"], bias=False)
        if cache:
            shape = (c["batch"], c["kv_heads"], c["max_len"], c["head_dim"])
            self.register_buffer("k_cache", torch.zeros(shape))
            self.register_buffer("v_cache", torch.zeros(shape))

    def forward(self, x, pos=None, mask=None):
        c = self.c
        if pos is None:                      # [b, s, hidden], causal over s
            b, n = x.shape[0], x.shape[1]
            q = self.q_proj(x).view(b, n, c["heads"], c["head_dim"]).transpose(1, 2)
            k = self.k_proj(x).view(b, n, c["kv_heads"], c["head_dim"]).transpose(1, 2)
            v = self.v_proj(x).view(b, n, c["kv_heads"], c["head_dim"]).transpose(1, 2)
            o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            return self.o_proj(o.transpose(1, 2).reshape(b, n, c["heads"] * c["head_dim"]))
        b = x.shape[0]
        q = self.q_proj(x).view(b, c["heads"], 1, c["head_dim"])
        k = self.k_proj(x).view(b, c["kv_heads"], 1, c["head_dim"])
        v = self.v_proj(x).view(b, c["kv_heads"], 1, c["head_dim"])
        self.k_cache.index_copy_(2, pos, k)
        self.v_cache.index_copy_(2, pos, v)
        o = torch.nn.functional.scaled_dot_product_attention(q, self.k_cache, self.v_cache, attn_mask=mask,
                                                             enable_gqa=True)
        return self.o_proj(o.reshape(b, c["heads"] * c["head_dim"]))


class MLP(torch.nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        self.gate_proj = torch.nn.Linear(c["hidden"], c["inter"], bias=False)
        self.up_proj = torch.nn.Linear(c["hidden"], c["inter"], bias=False)
        self.down_proj = torch.nn.Linear(c["inter"], c["hidden"], bias=False)

    def forward(self, x):
        return self.down_proj(torch.nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(torch.nn.Module):
    def __init__(self, c: dict, cache: bool):
        super().__init__()
        self.input_layernorm = RMSNorm(c["hidden"])
        self.self_attn = Attention(c, cache)
        self.post_attention_layernorm = RMSNorm(c["hidden"])
        self.mlp = MLP(c)

    def forward(self, x, pos=None, mask=None):
        x = x + self.self_attn(self.input_layernorm(x), pos, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class Decoder(torch.nn.Module):
    """One decode step of a Llama-shaped model over a static KV cache; `tokens` and `pos` are updated in place
    (greedy next token, position + 1), so the step can be replayed from one CUDA graph."""

    def __init__(self, c: dict):
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(c["vocab"], c["hidden"])
        self.layers = torch.nn.ModuleList(Layer(c, True) for _ in range(c["layers"]))
        self.norm = RMSNorm(c["hidden"])
        self.lm_head = torch.nn.Linear(c["hidden"], c["vocab"], bias=False)
        self.register_buffer("tokens", torch.zeros(c["batch"], dtype=torch.long))
        self.register_buffer("pos", torch.full((1,), c["prompt"], dtype=torch.long))
        self.register_buffer("slots", torch.arange(c["max_len"]))
        self.max_len = c["max_len"]

    def forward(self):
        mask = (self.slots <= self.pos).view(1, 1, 1, self.max_len)
        x = self.embed_tokens(self.tokens)
        for layer in self.layers:
            x = layer(x, self.pos, mask)
        logits = self.lm_head(self.norm(x))
        self.tokens.copy_(logits.argmax(-1))
        self.pos.add_(1)
        return logits


class Forward(torch.nn.Module):
    """The same Llama-shaped layers over a chunk of tokens without a cache (causal attention): a pure function
    of its input ids, as `torch.compile(mode="reduce-overhead")` replays from CUDA graphs."""

    def __init__(self, c: dict):
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(c["vocab"], c["hidden"])
        self.layers = torch.nn.ModuleList(Layer(c, False) for _ in range(c["layers"]))
        self.norm = RMSNorm(c["hidden"])
        self.lm_head = torch.nn.Linear(c["hidden"], c["vocab"], bias=False)

    def forward(self, ids):
        x = self.embed_tokens(ids)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x))


def _build(cls, **over):
    c = {**CFG, **over}
    old = torch.get_default_dtype()
    torch.set_default_dtype(BF16)
    try:
        with torch.device(DEV):
            m = cls(c)
    finally:
        torch.set_default_dtype(old)
    return m.eval(), c


def build_decoder(**over):
    """The decode model (`Decoder`) of `CFG`, any size given in `over` in its place."""
    return _build(Decoder, **over)[0]


def build_forward(**over):
    """The cache-free model (`Forward`) of `CFG` and its config, any size given in `over` in its place."""
    return _build(Forward, **over)


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


def reduce_overhead(out: str, model=None, ids=None, steps: int = 4) -> dict:
    """`Forward` (batch 16 x 8 tokens) under `torch.compile(mode="reduce-overhead")`, everything inside one
    capture: the first call compiles it and runs it once (cudagraph trees' warm-up), the second records its
    CUDA graph, then `steps` calls, each one `cap.step()`, replay it. The trace is trimmed to what the graph's
    recording and the steps hold (`trim_trace`). Returns the summary and, under ``_run``, the compiled model
    and its input, for a caller that measures it again."""
    if model is None:
        model, c = build_forward()
        ids = torch.randint(0, c["vocab"], (c["batch"], c["seq"]), device=DEV)
    compiled = torch.compile(model, mode="reduce-overhead")
    t0 = time.perf_counter()
    with capture(out, model=compiled, label="reduce_overhead") as cap, torch.no_grad():
        for _ in range(2):
            torch.compiler.cudagraph_mark_step_begin()
            compiled(ids)
        first_s = time.perf_counter() - t0
        walls = []
        for _ in range(steps):
            t1 = time.perf_counter()
            with cap.step():
                torch.compiler.cudagraph_mark_step_begin()
                compiled(ids)
            walls.append(time.perf_counter() - t1)
    kept = trim_trace(out)
    return {"step_wall_s": walls, "compile_and_record_s": round(first_s, 2), "trim": kept,
            "graphs": cap._graphs.graphs if cap._graphs else None, "_run": (compiled, ids)}


def trim_trace(run: str) -> dict:
    """Keep in `run`'s trace the events that reach the first capture range of a CUDA graph the trace replays, or
    later (the ranges open around it included), and every event without a time (metadata): the compilation
    and warm-up before it are dropped. Nothing is dropped when no replayed graph's capture is in the trace.
    Returns the counts."""
    import gzip

    from cublaslt_probe import runfiles
    path = os.path.join(run, runfiles.TRACE_FILE)
    with gzip.open(path, "rt") as f:
        doc = json.load(f)
    ev = doc.get("traceEvents") or []
    def named(prefix):
        return [e for e in ev if isinstance(e.get("name"), str) and e["name"].startswith(prefix) and "ts" in e]
    replayed = {e["name"][len(runfiles.GRAPH_REPLAY_PREFIX):] for e in named(runfiles.GRAPH_REPLAY_PREFIX)}
    caps = [e["ts"] for e in named(runfiles.GRAPH_CAPTURE_PREFIX)
            if e["name"][len(runfiles.GRAPH_CAPTURE_PREFIX):] in replayed]
    if not caps:
        return {"events": len(ev), "kept": len(ev)}
    cut = float(min(caps))

    def keep(e):
        if "ts" not in e:
            return True
        try:
            return float(e["ts"]) + float(e.get("dur") or 0) >= cut
        except (TypeError, ValueError):
            return True
    doc["traceEvents"] = [e for e in ev if keep(e)]
    with gzip.open(path, "wt", compresslevel=9) as f:
        json.dump(doc, f, separators=(",", ":"))
    return {"events": len(ev), "kept": len(doc["traceEvents"]), "cut_us": cut}


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
        "reduce_overhead": reduce_overhead,
    }
    only = set(args.only.split(",")) if args.only else None
    summary = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(), "programs": {}}
    for name, fn in progs.items():
        if only and name not in only:
            continue
        t0 = time.time()
        try:
            res = fn(os.path.join(args.out, name))
            res.pop("_run", None)
            res["ok"] = True
        except Exception as e:  # noqa: BLE001  one program's failure is reported; the others still run
            res = {"ok": False, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-4000:]}
        res["seconds"] = round(time.time() - t0, 1)
        summary["programs"][name] = res
        print(name, "ok" if res["ok"] else res["error"], res["seconds"], "s", flush=True)
        torch.cuda.empty_cache()
    try:
        summary["replay_step_ms_median"] = step_ms(graph_of(build_decoder()))
    except Exception as e:  # noqa: BLE001  reported, not fatal
        summary["replay_step_ms_median"] = f"{type(e).__name__}: {e}"
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1, default=str)
    return 0 if all(p["ok"] for p in summary["programs"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
