"""The built-in sweeps (`preset`): GEMM shapes of real models (LLM projections, MoE expert GEMMs) at
several token counts, as specs `plan_from_spec` expands; `plan` gives the plan of a preset or a spec file."""
from __future__ import annotations

from cublaslt_probe.errors import SpecError
from cublaslt_probe.sweep.spec import Plan, expand_axis, load_spec, plan_from_spec
from cublaslt_probe.vocab import PRESETS

# --- presets ----------------------------------------------------------------------------------------------
# (name, hidden, intermediate, q+k+v out, vocab): projection shapes of open models, F.linear weights (N, K).
LLM_MODELS = [
    ("llama3-8b", 4096, 14336, 4096 + 2 * 1024, 128256),
    ("llama3-70b", 8192, 28672, 8192 + 2 * 1024, 128256),
    ("mixtral-8x7b", 4096, 14336, 4096 + 2 * 1024, 32000),
    ("qwen2.5-7b", 3584, 18944, 3584 + 2 * 512, 152064),
]
TOKENS = [1, 4, 16, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]


def llm_weights() -> list[tuple[int, int]]:
    """Distinct (N, K) = (out_features, in_features) of the projections: qkv, o, gate+up, down, lm_head."""
    w = []
    for _, h, inter, qkv, vocab in LLM_MODELS:
        w += [(qkv, h), (h, h), (2 * inter, h), (h, inter), (vocab, h)]
    return sorted(set(w))


# (name, hidden, expert intermediate, experts on one GPU, top-k routed rows per token on one GPU): the expert
# GEMMs of open MoE models as one GPU runs them. DeepSeek-V3's 256 routed experts (top-8) are served with
# expert parallelism: one of 8 ranks holds 32 of them and gets, on average, one routed row per token.
MOE_MODELS = [
    ("mixtral-8x7b", 4096, 14336, 8, 2),
    ("qwen3-moe-30b-a3b", 2048, 768, 128, 8),
    ("deepseek-v3-ep8", 7168, 2048, 32, 1),
    ("gpt-oss-120b", 2880, 2880, 128, 4),
]
MOE_TOKENS = [16, 128, 2048, 8192]


def moe_groups() -> list[dict]:
    """The moe preset's groups: for each model, its two expert GEMMs (gate+up: n = 2 x intermediate, k = hidden;
    down: n = hidden, k = intermediate) at MOE_TOKENS tokens (m = tokens x top-k rows), in bf16 with uniform,
    random top-k and skewed group sizes, the 3-D x 3-D form, and fp8 with random routing."""
    out = []
    for _, h, inter, experts, top in MOE_MODELS:
        shapes = [[t * top, n, k] for t in MOE_TOKENS for n, k in ((2 * inter, h), (h, inter))]
        base = {"backends": ["torch"], "layouts": ["NT"], "shapes": shapes, "groups": experts}
        out.append({**base, "ops": ["grouped_mm"], "dtypes": ["bf16"],
                    "group_sizes": ["uniform", {"seed": 0, "top_k": top}, {"zipf": 1.0}, "batched"]})
        out.append({**base, "ops": ["scaled_grouped_mm"], "dtypes": ["fp8"],
                    "group_sizes": [{"seed": 0, "top_k": top}]})
    return out


def preset(name: str) -> dict:
    all_be = ["torch", "torch-lt", "cupy", "lt"]
    if name == "quick":
        shapes = [[1, 4096, 4096], [16, 4096, 4096], [128, 4096, 4096], [1024, 4096, 4096],
                  [4096, 4096, 4096], [127, 4095, 8191]]
        return {"name": "quick", "group": [
            {"backends": ["torch", "torch-lt", "lt"], "ops": ["mm"], "dtypes": ["fp32", "tf32", "fp16", "bf16"],
             "layouts": ["NN", "NT"], "shapes": shapes},
            {"backends": ["torch", "torch-lt"], "ops": ["addmm"], "dtypes": ["bf16"], "layouts": ["NT"],
             "shapes": shapes},
            {"backends": ["torch", "lt"], "ops": ["scaled_mm"], "dtypes": ["fp8"], "layouts": ["NT"],
             "shapes": shapes[:5]},
            {"backends": ["cupy"], "ops": ["mm"], "dtypes": ["fp32", "fp16"], "layouts": ["NN", "NT"],
             "shapes": shapes},
            {"backends": ["torch", "cupy"], "ops": ["bmm"], "dtypes": ["fp16"], "layouts": ["NN", "TN"],
             "shapes": [[128, 128, 64, 8], [512, 512, 512, 8]]},
        ]}
    if name == "llm":
        shapes = [[t, n, k] for (n, k) in llm_weights() for t in TOKENS]
        big = [s for s in shapes if s[0] * s[1] * s[2] > 2 ** 36]   # > 68.7 GFLOP/2: fp32 would dominate
        small = [s for s in shapes if s not in big]
        return {"name": "llm", "group": [
            {"backends": all_be, "ops": ["mm"], "dtypes": ["bf16", "fp16"], "layouts": ["NN", "NT", "TN", "TT"],
             "shapes": shapes},
            {"backends": all_be, "ops": ["mm"], "dtypes": ["fp32", "tf32"], "layouts": ["NT"], "shapes": small},
            {"backends": ["torch", "torch-lt"], "ops": ["addmm"], "dtypes": ["bf16"], "layouts": ["NT"],
             "shapes": shapes},
            {"backends": ["torch", "lt"], "ops": ["scaled_mm"], "dtypes": ["fp8"], "layouts": ["NT"],
             "shapes": shapes},
        ]}
    if name == "square":
        cubes = [[x, x, x] for x in expand_axis({"pow2": [64, 8192], "neighbours": [1, 8, 16]}, "m")]
        return {"name": "square", "group": [
            {"backends": all_be, "ops": ["mm"], "dtypes": ["fp32", "tf32", "fp16", "bf16"],
             "layouts": ["NN", "NT", "TN", "TT"], "shapes": cubes},
            {"backends": ["torch", "lt"], "ops": ["scaled_mm"], "dtypes": ["fp8"], "layouts": ["NT"],
             "shapes": [s for s in cubes if s[0] % 16 == 0]},
        ]}
    if name == "grid":  # the natural input of `map`: m x n at a fixed k
        ax = sorted({x for p in range(4, 15) for x in (2 ** p, 3 * 2 ** (p - 1))} - {24576})
        g = {"m": ax, "n": ax, "k": [4096]}
        return {"name": "grid", "group": [
            {"backends": ["torch", "torch-lt", "lt"], "ops": ["mm"], "dtypes": ["bf16"], "layouts": ["NN", "NT"], **g},
            {"backends": ["torch", "torch-lt", "lt"], "ops": ["mm"], "dtypes": ["fp16", "tf32"], "layouts": ["NT"],
             **g},
            {"backends": ["torch", "lt"], "ops": ["scaled_mm"], "dtypes": ["fp8"], "layouts": ["NT"], **g},
        ]}
    if name == "regret":  # heuristic candidates for the llm shapes: run with --candidates 32
        shapes = [[t, n, k] for (n, k) in llm_weights() for t in TOKENS]
        return {"name": "regret", "group": [
            {"backends": ["lt"], "ops": ["mm"], "dtypes": ["bf16"], "layouts": ["NT"], "shapes": shapes},
            {"backends": ["lt"], "ops": ["scaled_mm"], "dtypes": ["fp8"], "layouts": ["NT"], "shapes": shapes},
        ]}
    if name == "decode":
        return {"name": "decode", "group": [
            {"backends": ["torch", "torch-lt", "lt"], "ops": ["mm"], "dtypes": ["bf16", "fp16"], "layouts": ["NT"],
             "m": {"range": [1, 256]}, "n": [4096, 6144, 14336], "k": [4096]},
            {"backends": ["torch", "lt"], "ops": ["scaled_mm"], "dtypes": ["fp8"], "layouts": ["NT"],
             "m": {"range": [16, 256, 16]}, "n": [4096, 14336], "k": [4096]},
        ]}
    if name == "moe":   # mixture-of-experts expert GEMMs (grouped): see MOE_MODELS
        return {"name": "moe", "group": moe_groups()}
    raise SpecError(f"unknown preset {name!r}: choose from {', '.join(PRESETS)}")


def plan(preset_name: str | None = None, spec_path: str | None = None, backends: list[str] | None = None) -> Plan:
    if bool(preset_name) == bool(spec_path):
        raise SpecError("give exactly one of --preset NAME or --spec FILE")
    spec = preset(preset_name) if preset_name else load_spec(spec_path)
    return plan_from_spec(spec, backends)
