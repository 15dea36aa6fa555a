"""Apply the grouped advice of `audit --from` inside the two MoE programs and re-measure the whole step (GPU).

    PYTHONPATH=. python3 scripts/prove_moe_advice.py --out OUT/prove_moe_advice.json [--rounds 31] [--runs DIR]
    PYTHONPATH=. python3 scripts/prove_moe_advice.py --predict-only      # the CPU: the predictions alone
    PYTHONPATH=. python3 scripts/prove_moe_advice.py --summarize benchmarks/results/prove_moe_advice.json

The programs are `scripts/capture_moe.py`'s (its builders, called here): the Mixtral-shaped training step and
the Qwen3-MoE-shaped forward, experts through transformers' `grouped_mm` implementation. The prediction of each
variant is the saving per step of its grouped advice item, as `audit RUN --from tests/fixtures/moe/measure/RUN.json`
renders it (`cublaslt_probe.audit.advice` on the committed run folder and measurements).

Each program is built once; every variant patches the same modules' `forward` for the length of a step (the
experts module: `model.layers.*.mlp.experts`; the router: `model.layers.*.mlp.gate`) and restores it after, so
A and B share weights and inputs. Rounds run every variant once, in turn (A, B1, B2, ..., then reversed in the
next round: the GPU's and host's drift reaches both sides alike); each step's time is its CUDA-event span on
the stream (`gpu`) and its synchronised wall time (`wall`, `prove_advice.one`), and the span of the same step
queued behind a GPU spin (`queued`, `one_queued`: its GPU work without the host's launch gaps, where the step
does not synchronise inside). Medians over the rounds after the warm-up rounds. With `--runs`, each
variant's step is also captured and audited (`kernel_split`): where its GEMM time went and where the rest.

Variants (the experts' forward is transformers' `grouped_mm_experts_forward` written out, with the masks it
applies to expert-parallel sentinel rows, so that only what the advice changes differs):
- `rewrite`: that forward unchanged (the control: what the rewrite itself costs against transformers' own);
- `pad8`: each expert's rows placed at a multiple of 8 in the gathered input (zero rows between the groups,
  offsets of the padded sizes; a host-side bound on the rows, so no synchronisation), the zero rows' outputs
  never gathered back;
- `bmm_padded`: every expert padded to the largest group, one `torch.bmm` per projection (the largest group is
  read on the host: one synchronisation per call, as a `bmm`'s shape needs it);
- `fp8`, `fp8_cached`, `fp8_compiled`: both projections through `torch._scaled_grouped_mm` (e4m3, row-wise
  scales: one per activation row, one per expert column), the activations quantized each call (`quant_rows`:
  eager; `fp8_compiled`: the same function through `torch.compile`, one fused pass); `fp8` quantizes the
  weights each step too (training: they change every step), the others once before the rounds (frozen or
  inference weights). In training the backward stays bf16 (`torch._grouped_mm` on the bf16 weights and
  activations, the products autograd forms for `_grouped_mm`);
- `mm_per_group`: transformers' own `eager` experts implementation (`set_experts_implementation("eager")`:
  one GEMM per expert hit, a Python loop);
- `balanced`: the router forced to a balanced assignment (token t to experts (t*k + j) mod E, j < k, each
  weighted by its softmax probability, renormalised as the router does): every expert gets T*k/E rows. This
  changes the model (which tokens each expert sees); it measures what the advice's saving rests on, not a
  router anyone should ship.

Numerics (GEMM-side variants): the experts module's output on the inputs it got in one step of A, each variant
against transformers' forward (max |B - A| / max |A|), and the model's logits on one batch, A against B.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import statistics
import sys
import time
import types

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

PROGRAMS = {   # name: (capture_moe builder, variants measured in its rounds)
    "qwen3_moe": ("qwen3_moe", ["rewrite", "bmm_padded", "fp8_cached", "fp8_compiled", "balanced", "pad8"]),
    "mixtral_train": ("mixtral_train", ["rewrite", "balanced", "fp8_cached", "fp8_compiled", "fp8",
                                        "mm_per_group"]),
}
PATCHED_EXPERTS = ("pad8", "bmm_padded", "fp8", "fp8_cached", "fp8_compiled")   # variants on the rewrite
# variant -> the advice item it applies (default: itself)
ADVICE_OF = {"fp8_cached": "fp8", "fp8_compiled": "fp8", "rewrite": None}
F8_MAX = 448.0   # torch.finfo(torch.float8_e4m3fn).max


def predictions(name: str) -> list[dict]:
    """The grouped advice items of `audit RUN --from measure/RUN.json` for program `name`, in rank order:
    rank, variant (the measured variant named in the evidence), saving_us per step, what."""
    from cublaslt_probe.audit import advice, audit
    fx = os.path.join(ROOT, "tests", "fixtures", "moe")
    a = audit(os.path.join(fx, name))
    with open(os.path.join(fx, "measure", f"{name}.json"), encoding="utf-8") as f:
        meas = json.load(f)
    out = []
    for rank, it in enumerate(advice(a.rows, meas, a.step_gpu_us), 1):
        if it["kind"] != "grouped" or not it["saving_us"]:
            continue
        m = re.search(r"original [\d.]+ µs, (\w+) [\d.]+ µs", it["evidence"] or "")
        out.append({"rank": rank, "variant": m.group(1) if m else None, "saving_us": round(it["saving_us"], 1),
                    "what": it["what"]})
    return out


# --- the experts' forward, written out with the advice's changes --------------------------------------------

def quant_rows(t):
    """e4m3 copy of 2-D `t` and its row-wise scales (max |row| / F8_MAX)."""
    import torch
    s = (t.abs().amax(dim=1).float() / F8_MAX).clamp_min(1e-12)
    return (t.float() / s[:, None]).to(torch.float8_e4m3fn), s


def quant_weight(w):
    """e4m3 copy of expert weights `w` [E, n, k] and their scales [E, n] (one per expert column of the GEMM)."""
    import torch
    s = (w.abs().amax(dim=2).float() / F8_MAX).clamp_min(1e-12)
    return (w.float() / s[..., None]).to(torch.float8_e4m3fn), s


_FP8: list = []


def _fp8_grouped(torch):
    """A grouped linear x @ W^T (W [E, n, k], offsets along x's rows) with an fp8 forward (the activations
    quantized by `quant`, the weights given quantized) and autograd's bf16 backward products of `_grouped_mm`
    (`_grouped_mm_mat1_backward`, `_grouped_mm_mat2_backward`)."""
    if _FP8:
        return _FP8[0]

    class Fp8Grouped(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, offs, w8, sw, quant):
            x8, sx = quant(x)
            ctx.save_for_backward(x, w, offs)
            return torch._scaled_grouped_mm(x8, w8.transpose(-2, -1), sx, sw, offs=offs, out_dtype=x.dtype)

        @staticmethod
        def backward(ctx, g):
            x, w, offs = ctx.saved_tensors
            gx = torch._grouped_mm(g, w, offs=offs) if ctx.needs_input_grad[0] else None
            gw = torch._grouped_mm(g.transpose(-2, -1), x, offs=offs) if ctx.needs_input_grad[1] else None
            return gx, gw, None, None, None, None
    _FP8.append(Fp8Grouped.apply)
    return _FP8[0]


def experts_forward(self, hidden_states, top_k_index, top_k_weights, *, mode="grouped", mult=1, fp8=None):
    """transformers' `grouped_mm_experts_forward` (gated experts, weights [E, n, k], no bias, no expert-parallel
    sentinels) with the rows of each expert at a multiple of `mult` (mode "grouped"), or every expert padded to
    the largest group and one `torch.bmm` per projection (mode "bmm"); `fp8` = (weights, quant): `weights(module,
    name)` gives a projection's e4m3 weights and scales, `quant` quantizes the activations, and both projections
    run in fp8. The rows the GEMMs do not fill (zero rows, the tail past the last group) take the masks
    transformers applies to sentinel rows, so the elementwise work is the original's on the rows there are;
    their outputs are never gathered back."""
    import torch
    if getattr(self, "has_bias", False) or getattr(self, "is_transposed", False) or not getattr(self, "has_gate", True):
        raise ValueError(f"{type(self).__name__}: the rewrite covers gated experts without bias, weights [E, n, k]")
    dev, k, E = hidden_states.device, top_k_index.size(-1), self.num_experts
    T = hidden_states.shape[0]
    S = T * k
    ids_g, perm = torch.sort(top_k_index.reshape(-1))
    counts = torch.histc(ids_g.int(), bins=E, min=0, max=E - 1).long()
    if mode == "bmm":
        G = max(1, int(counts.max()))                                  # the host sync a bmm's shape needs
        rows, start = E * G, torch.arange(0, E * G, G, device=dev)
    else:
        padded = counts + (-counts) % mult
        offs = torch.cumsum(padded, 0, dtype=torch.int32)
        rows, start = S + E * (mult - 1), offs - padded
    shift = start - (torch.cumsum(counts, 0) - counts)                 # each expert's rows move by this much
    dst = torch.arange(S, device=dev) + shift[ids_g]                   # each sorted row's row in the GEMMs
    src = torch.full((rows,), -1, dtype=torch.long, device=dev)
    src[dst] = perm // k
    mask = (src < 0).unsqueeze(-1)
    x = hidden_states[src.clamp_(min=0)]
    x.masked_fill_(mask, 0.0)

    def proj(inp, name):
        w = getattr(self, name)
        if mode == "bmm":
            return torch.bmm(inp.view(E, G, -1), w.transpose(1, 2)).view(rows, -1)
        if fp8 is not None:
            return _fp8_grouped(torch)(inp, w, offs, *fp8[0](self, name), fp8[1])
        return torch._grouped_mm(inp, w.transpose(-2, -1), offs=offs)
    h = proj(x, "gate_up_proj").masked_fill(mask, 0.0)
    h = self._apply_gate(h)
    y = proj(h, "down_proj").masked_fill(mask, 0.0)
    pair_rows = torch.empty_like(dst)
    pair_rows[perm] = dst                                              # the row of pair (token, j), in token order
    out = (y[pair_rows] * top_k_weights.reshape(-1, 1)).view(T, k, -1).sum(dim=1)
    return out.to(hidden_states.dtype)


def balanced_router(self, hidden_states, *, scores_dtype):
    """The router's logits and softmax, with the assignment forced balanced: token t to experts
    (t*k + j) mod E for j < k, weighted by their probabilities (renormalised where the router does)."""
    import torch
    hs = hidden_states.reshape(-1, self.weight.shape[1])
    logits = torch.nn.functional.linear(hs, self.weight)
    probs = torch.softmax(logits.float(), dim=-1)
    T, k, E = hs.shape[0], self.top_k, self.num_experts
    idx = (torch.arange(T, device=hs.device)[:, None] * k + torch.arange(k, device=hs.device)[None, :]) % E
    top = probs.gather(1, idx)
    if getattr(self, "norm_topk_prob", True):
        top = top / top.sum(dim=-1, keepdim=True)
    return logits, top.to(scores_dtype), idx


class Program:
    """One built program, its experts modules and routers, and the variants as patches of their forwards."""

    def __init__(self, builder):
        import torch
        import capture_moe as cm
        self.torch = torch
        self.model, self.step = getattr(cm, builder)()
        self.experts = [m for m in self.model.modules() if hasattr(m, "gate_up_proj") and hasattr(m, "num_experts")]
        self.routers = [m for m in self.model.modules() if hasattr(m, "top_k") and hasattr(m, "weight")
                        and getattr(m, "weight").dim() == 2 and hasattr(m, "num_experts")]
        if not self.experts or not self.routers:
            raise RuntimeError("no experts module or router found in the program")
        self._w8: dict = {}
        self.scores_dtype = {}
        self.quant_compiled = torch.compile(quant_rows, dynamic=False)

    def fp8_weights(self, cached: bool):
        torch = self.torch

        def get(mod, name):
            key = (id(mod), name)
            if not cached or key not in self._w8:
                with torch.no_grad():
                    self._w8[key] = quant_weight(getattr(mod, name).detach())
            return self._w8[key]
        return get

    def patches(self, variant: str) -> list[tuple[object, object]]:
        if variant == "balanced":
            return [(r, types.MethodType(
                lambda s, h, d=self.scores_dtype[id(r)]: balanced_router(s, h, scores_dtype=d), r))
                for r in self.routers]
        kw = {"rewrite": {}, "pad8": {"mult": 8}, "bmm_padded": {"mode": "bmm"},
              "fp8": {"fp8": (self.fp8_weights(False), quant_rows)},
              "fp8_cached": {"fp8": (self.fp8_weights(True), quant_rows)},
              "fp8_compiled": {"fp8": (self.fp8_weights(True), self.quant_compiled)}}[variant]
        return [(e, types.MethodType(lambda s, *a, kw=kw: experts_forward(s, *a, **kw), e)) for e in self.experts]

    @contextlib.contextmanager
    def applied(self, variant: str | None):
        if variant == "mm_per_group":           # transformers' own "eager" experts implementation
            self.model.set_experts_implementation("eager")
            try:
                yield
            finally:
                self.model.set_experts_implementation("grouped_mm")
            return
        ps = self.patches(variant) if variant else []
        for mod, fn in ps:
            mod.forward = fn
        try:
            yield
        finally:
            for mod, _ in ps:
                del mod.forward

    def prepare(self) -> None:
        """The routers' score dtype (from one call of the original router) and the cached fp8 weights."""
        torch = self.torch
        with torch.no_grad():
            for r in self.routers:
                h = torch.zeros(8, r.weight.shape[1], device=r.weight.device, dtype=r.weight.dtype)
                self.scores_dtype[id(r)] = r(h)[1].dtype
            get = self.fp8_weights(True)
            for e in self.experts:
                get(e, "gate_up_proj"), get(e, "down_proj")

    def numerics(self, variants: list[str]) -> dict:
        """Each GEMM-side variant against transformers' forward: the experts' output on one step's inputs, and
        the model's logits on one batch (max |B - A| / max |A|)."""
        torch = self.torch
        seen = []
        hook = self.experts[0].register_forward_pre_hook(lambda m, a: seen.append(tuple(t.detach() for t in a)))
        try:
            self.step()
        finally:
            hook.remove()
        args = seen[0]
        ids = torch.randint(0, self.model.config.vocab_size, (1, 2048), device="cuda")

        def model_out():
            with torch.no_grad():
                o = self.model(ids, labels=ids if self.model.training else None, use_cache=False)
            return o.logits.float()

        def rel(y, ref):
            return round(float((y.float() - ref.float()).abs().max() / ref.float().abs().max().clamp_min(1e-30)), 6)
        with torch.no_grad():
            ref = self.experts[0](*args)
        ref_model = model_out()
        out = {}
        for v in variants:
            if v == "balanced":
                out[v] = "not compared: a router forced to a balanced assignment computes another model"
                continue
            try:
                with self.applied(v), torch.no_grad():
                    y = self.experts[0](*args)
                with self.applied(v):
                    ym = model_out()
                out[v] = {"experts_output_rel": rel(y, ref), "bitwise_equal": bool(torch.equal(y, ref)),
                          "logits_rel": rel(ym, ref_model)}
            except Exception as e:  # noqa: BLE001  (the variant is left out of the rounds, with the reason)
                out[v] = {"error": f"{type(e).__name__}: {e}"}
        return out


def one_queued(step, cycles: int) -> float:
    """The step's CUDA-event span with its launches queued behind a GPU spin of `cycles` clocks: the GPU runs
    the step's kernels back to back where the host has launched them ahead (ms). A host synchronisation
    inside the step still stops the queue there, as it stops the step."""
    import torch
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    torch.cuda._sleep(cycles)
    s.record()
    step()
    e.record()
    e.synchronize()
    return s.elapsed_time(e)


def measure(prog: Program, variants: list[str], rounds: int, warmup: int) -> dict:
    """Rounds of every variant's step (None: the program as captured), alternating direction each round: each
    variant's step once as launched (`gpu`: CUDA-event span; `wall`) and once queued (`queued`: `one_queued`,
    the spin 2x the variant's warm-up wall time at 2 GHz). A variant's patch is put on before its timing starts
    and taken off after it ends."""
    from prove_advice import one
    names = [None] + variants

    def timed(n, cycles=None):
        with prog.applied(n):
            return one(prog.step) if cycles is None else one_queued(prog.step, cycles)
    walls: dict = {n: [] for n in names}
    for _ in range(warmup):
        for n in names:
            walls[n].append(timed(n)[1])
    cycles = {n: int(2 * max(w) * 1e-3 * 2e9) for n, w in walls.items()}
    samples: dict = {n or "A": {"gpu": [], "wall": [], "queued": []} for n in names}
    for r in range(rounds):
        for n in (names if r % 2 == 0 else names[::-1]):
            g, w = timed(n)
            q = timed(n, cycles[n])
            for key, x in (("gpu", g), ("wall", w), ("queued", q)):
                samples[n or "A"][key].append(x)
    med = {n: {k: statistics.median(v) for k, v in s.items()} for n, s in samples.items()}
    keys = ("gpu", "wall", "queued")
    return {"rounds": rounds, "warmup_rounds": warmup,
            "median_ms": {n: {k: round(m[k], 4) for k in keys} for n, m in med.items()},
            "saving_us": {n: {k: round(1e3 * (med["A"][k] - m[k]), 1) for k in keys}
                          for n, m in med.items() if n != "A"},
            "samples_ms": {n: {k: [round(x, 4) for x in v] for k, v in s.items()} for n, s in samples.items()}}


def kernel_split(prog: Program, variants: list[str], where: str, steps: int = 3) -> dict:
    """Each variant's step captured (`cublaslt_probe.capture`, no log, no group sizes) and audited: the step's
    GPU time, its GEMM time, and the GEMM time of the experts module (grouped, bmm or per-expert GEMMs), per step.
    Where the step's saving falls short of the GEMMs', the rest of the step (gathers, quantization, a host
    synchronisation) took it."""
    from cublaslt_probe.audit import audit
    from cublaslt_probe.recorder import capture
    out = {}
    for n in [None] + variants:
        run = os.path.join(where, n or "A")
        try:
            with prog.applied(n), capture(run, model=prog.model, log=False, label=n or "A", group_sizes=False) as cap:
                for _ in range(steps):
                    with cap.step():
                        prog.step()
            a = audit(run)
            ex = a.rows[a.rows["module"].fillna("").str.contains("experts")]
            out[n or "A"] = {"step_gpu_us": round(a.step_gpu_us, 1), "gemm_gpu_us": round(a.gemm_gpu_us, 1),
                             "experts_gemm_us": round(float(ex["gpu_us"].sum()), 1),
                             "experts_ops": sorted(set(ex["op"].astype(str)))}
        except Exception as e:  # noqa: BLE001
            out[n or "A"] = {"error": f"{type(e).__name__}: {e}"}
        print("kernels", n or "A", json.dumps(out[n or "A"]), flush=True)
    return out


def verdicts(pred: list[dict], meas: dict) -> list[dict]:
    """Per variant: its advice item's predicted saving and the measured ones, against the program as captured
    (A) and against the rewrite of its experts' forward (the control: what the advice changes, alone); the
    ratio measured / predicted of the launched span (the step as it runs) and of the queued span (its GPU work)."""
    out = []
    sv = meas["saving_us"]
    ctrl = sv.get("rewrite")
    for v, s in sv.items():
        item = ADVICE_OF.get(v, v)
        p = next((x for x in pred if x["variant"] == item), None) if item else None
        d = {"variant": v, "advice_rank": p and p["rank"], "predicted_us": p and p["saving_us"],
             "measured_us": s}
        if ctrl and v != "rewrite" and v in PATCHED_EXPERTS:
            d["vs_rewrite_us"] = {k: round(s[k] - ctrl[k], 1) for k in s}
        if p and p["saving_us"]:
            d["ratio"] = {k: round(s[k] / p["saving_us"], 3) for k in ("gpu", "queued")}
            if "vs_rewrite_us" in d:
                d["ratio_vs_rewrite"] = {k: round(d["vs_rewrite_us"][k] / p["saving_us"], 3) for k in ("gpu", "queued")}
            d["meets_70pct"] = d["ratio"]["gpu"] >= 0.7
        out.append(d)
    return out


def paired(measured: dict, variant: str, key: str = "gpu") -> tuple[float, float, float]:
    """Median and quartiles of the per-round savings (A's step minus the variant's, µs): each round's A and B
    ran next to each other, so drift between rounds cancels."""
    a, b = measured["samples_ms"]["A"][key], measured["samples_ms"][variant][key]
    d = sorted(1e3 * (x - y) for x, y in zip(a, b))
    return statistics.median(d), d[len(d) // 4], d[(3 * len(d)) // 4]


def summary_lines(res: dict) -> list[str]:
    """The proof as a table per program (a saved result): the advice's predicted saving per step; the step's
    CUDA-event span saved against A (medians; paired per round, with quartiles) and against the rewrite
    control; the audited kernels' saving: the experts' GEMMs and the whole step's GPU time; numerics."""
    out = []
    for name, p in res.get("programs", {}).items():
        if "error" in p:
            out.append(f"{name}: error {p['error']}")
            continue
        m, ks, num = p["measured"], p.get("kernel_savings_us", {}), p.get("numerics", {})
        med = m["median_ms"]
        out.append(f"{name}: A span {med['A']['gpu']:.3f} ms (median of {m['rounds']} rounds), "
                   f"A kernels {p['kernels']['A']['step_gpu_us']:,.1f} µs/step")
        out.append("  variant        rank  predicted  span saved (paired, IQR)        vs rewrite  experts GEMMs  "
                   "step kernels  numerics (experts, logits)")
        for v in m["saving_us"]:
            vd = next(x for x in p["verdicts"] if x["variant"] == v)
            pm, q1, q3 = paired(m, v)
            pred = vd["predicted_us"]
            k = ks.get(v, {})
            n = num.get(v)
            nt = (f"{n['experts_output_rel']:.3g}, {n['logits_rel']:.3g}" if isinstance(n, dict) and "error" not in n
                  else "not compared" if isinstance(n, str) else "—")

            def pct(x):
                return f" ({100 * x / pred:.0f} %)" if pred and x is not None else ""
            vr = vd.get("vs_rewrite_us", {}).get("gpu")
            out.append(f"  {v:13s}  {vd['advice_rank'] or '—':>4}  {pred if pred is not None else '—':>9}  "
                       f"{m['saving_us'][v]['gpu']:+9.1f}{pct(m['saving_us'][v]['gpu'])} "
                       f"({pm:+.1f}, {q1:+.1f}..{q3:+.1f})"
                       f"  {'—' if vr is None else f'{vr:+.1f}'}{pct(vr)}"
                       f"  {k.get('experts_gemm_us', 0):+.1f}{pct(k.get('experts_gemm_us'))}"
                       f"  {k.get('step_gpu_us', 0):+.1f}{pct(k.get('step_gpu_us'))}  {nt}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--rounds", type=int, default=31)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--runs", default="", help="also capture and audit each variant's step in run folders here")
    ap.add_argument("--only", default="", help="comma-separated programs (default: all)")
    ap.add_argument("--predict-only", action="store_true", help="print the predictions (the CPU) and stop")
    ap.add_argument("--summarize", metavar="FILE", help="print a saved result's tables (the CPU) and stop")
    a = ap.parse_args()
    if a.summarize:
        try:
            with open(a.summarize, encoding="utf-8") as f:
                res = json.load(f)
        except (OSError, ValueError) as e:
            ap.error(f"cannot read {a.summarize}: {e}; give a file this script wrote with --out")
        print("\n".join(summary_lines(res)))
        return
    names = [n for n in a.only.split(",") if n] or list(PROGRAMS)
    bad = [n for n in names if n not in PROGRAMS]
    if bad:
        ap.error(f"unknown program(s) {bad}: choose from {list(PROGRAMS)}")
    preds = {}
    for n in names:
        try:
            preds[n] = predictions(n)
        except Exception as e:  # noqa: BLE001  (the GPU machine's packages: the measurement goes on)
            preds[n] = []
            print(f"{n}: no predictions ({type(e).__name__}: {e})", flush=True)
    if a.predict_only:
        print(json.dumps(preds, indent=1, ensure_ascii=False))
        return
    if not a.out:
        ap.error("--out is required unless --predict-only")
    import torch
    res = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "programs": {}}
    try:
        import transformers
        res["transformers"] = transformers.__version__
    except ImportError:
        pass
    for name in names:
        builder, variants = PROGRAMS[name]
        t0 = time.perf_counter()
        entry: dict = {"predicted": preds[name]}
        try:
            prog = Program(builder)
            prog.prepare()
            entry["numerics"] = prog.numerics(variants)
            print(name, "numerics", json.dumps(entry["numerics"]), flush=True)
            ok = [v for v in variants
                  if not (isinstance(entry["numerics"][v], dict) and "error" in entry["numerics"][v])]
            entry["measured"] = measure(prog, ok, a.rounds, a.warmup)
            entry["verdicts"] = verdicts(preds[name], entry["measured"])
            for v in entry["verdicts"]:
                print(name, json.dumps(v), flush=True)
            if a.runs:
                k = entry["kernels"] = kernel_split(prog, ok, os.path.join(a.runs, name))
                base = k.get("A", {})
                entry["kernel_savings_us"] = {
                    v: {f: round(base[f] - x[f], 1) for f in ("step_gpu_us", "gemm_gpu_us", "experts_gemm_us")}
                    for v, x in k.items() if v != "A" and "error" not in x and "error" not in base}
        except Exception as e:  # noqa: BLE001
            import traceback
            traceback.print_exc()
            entry["error"] = f"{type(e).__name__}: {e}"
        entry["seconds"] = round(time.perf_counter() - t0, 1)
        res["programs"][name] = entry
        prog = None
        torch.cuda.empty_cache()
        with open(a.out, "w", encoding="utf-8") as f:
            json.dump(res, f, indent=1, ensure_ascii=False)


if __name__ == "__main__":
    main()
