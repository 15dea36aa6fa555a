"""Apply the grouped advice of `audit --from` inside the two MoE programs and re-measure the whole step (GPU).

    PYTHONPATH=. python3 scripts/prove_moe_advice.py --out OUT/prove_moe_advice.json [--rounds 21] [--runs DIR]
    PYTHONPATH=. python3 scripts/prove_moe_advice.py --predict-only      # the CPU: the predictions alone
    PYTHONPATH=. python3 scripts/prove_moe_advice.py --summarize benchmarks/results/prove_moe_advice.json

The programs are `scripts/capture_moe.py`'s (its builders, called here): the Mixtral-shaped training step and
the Qwen3-MoE-shaped forward, experts through transformers' `grouped_mm` implementation. The prediction of each
variant comes from `tests/fixtures/moe/measure/RUN.json` (`audit RUN --measure --save`): ``whole_us``, the
experts' whole call as `measure.measure_experts` timed it (µs per call saved × calls per step: what the grouped
advice's saving is), ``gemms_us``, the module's measured grouped GEMMs alone (`measure.measure_grouped`), and
the rank of its advice item (`audit RUN --from ...`, `cublaslt_probe.analysis.audit.advice`) where it has one.

Each program is built once; every variant patches the same modules' `forward` for the length of a step (the
experts module: `model.layers.*.mlp.experts`; the router: `model.layers.*.mlp.gate`) and restores it after, so
A and B share weights and inputs. Rounds run every variant once, in turn (A, B1, B2, ..., then reversed in the
next round: the GPU's and host's drift reaches both sides alike); each step's time is its CUDA-event span on
the stream (`gpu`) and its synchronised wall time (`wall`, `prove_advice.one`). Medians over the rounds after
the warm-up rounds. With `--runs`, each variant's step is also captured and audited (`kernel_split`): where
its GEMM time went and where the rest.

Variants: the GEMM-side ones are `measure.experts_forward`, the very code `measure.measure_experts` timed,
patched onto the experts module (gated experts, weights [E, n, k], no bias, no expert-parallel sentinels):
- `rewrite`: its ``original``, transformers' `grouped_mm` experts forward written out (the control: what the
  rewrite itself costs against transformers' own);
- `pad8` (any `padM`), `bmm_padded`, `fp8`: as `measure.experts_forward` builds them; fp8's weights are
  quantized every step in training (they change each step), once in inference, as the measurement did;
- `mm_per_group`: transformers' own `eager` experts implementation (`set_experts_implementation("eager")`);
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

PROGRAMS = {"qwen3_moe": "qwen3_moe", "mixtral_train": "mixtral_train"}   # name: capture_moe builder
ALWAYS = ["rewrite", "balanced", "pad8", "bmm_padded", "fp8", "mm_per_group"]   # measured in every program


def predictions(name: str) -> list[dict]:
    """Per variant of the experts measured in `tests/fixtures/moe/measure/RUN.json`: ``whole_us`` (the experts'
    whole call, µs per step saved), ``gemms_us`` (the module's measured grouped GEMMs alone) and, where the
    advice (`audit RUN --from ...`) has an item for it, its ``rank`` among all items and ``what``."""
    from cublaslt_probe.analysis.audit import advice, audit
    fx = os.path.join(ROOT, "tests", "fixtures", "moe")
    a = audit(os.path.join(fx, name))
    with open(os.path.join(fx, "measure", f"{name}.json"), encoding="utf-8") as f:
        meas = json.load(f)
    ranked = {}
    for rank, it in enumerate(advice(a.rows, meas, a.step_gpu_us), 1):
        m = re.search(r"original [\d.]+ µs, (\w+) [\d.]+ µs", it["evidence"] or "")
        if it["kind"] == "grouped" and it["saving_us"] and m:
            ranked.setdefault(m.group(1), {"rank": rank, "what": it["what"], "saving_us": round(it["saving_us"], 1)})
    gem: dict[str, float] = {}
    for g in meas["gemms"]:
        for v in g.get("grouped") or []:
            if v.get("time_us") and g.get("original_us"):
                gem[v["variant"]] = (gem.get(v["variant"], 0.0)
                                     + (g["original_us"] - v["time_us"]) * (g.get("calls") or 1))
    out = []
    for ex in meas.get("experts") or []:
        t = {v["variant"]: v["time_us"] for v in ex.get("variants") or [] if v.get("time_us")}
        for v, us in t.items():
            if v == "original":
                continue
            out.append({"variant": v, "whole_us": round((t["original"] - us) * (ex.get("calls") or 1), 1),
                        "gemms_us": round(gem[v], 1) if v in gem else None, **ranked.get(v, {"rank": None})})
    return sorted(out, key=lambda x: (x["rank"] is None, x["rank"] or 0, -x["whole_us"]))


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
        import capture_moe as cm
        import torch
        self.torch = torch
        self.model, self.step = getattr(cm, builder)()
        self.experts = [m for m in self.model.modules() if hasattr(m, "gate_up_proj") and hasattr(m, "num_experts")]
        self.routers = [m for m in self.model.modules() if hasattr(m, "top_k") and hasattr(m, "weight")
                        and m.weight.dim() == 2 and hasattr(m, "num_experts")]
        if not self.experts or not self.routers:
            raise RuntimeError("no experts module or router found in the program")
        self._w8: dict = {}
        self.scores_dtype = {}

    def fp8_weights(self, cached: bool):
        """A projection's e4m3 weights and scales: quantized once (`cached`: frozen or inference weights) or
        every call (training)."""
        from cublaslt_probe.gpu.experts import quant_weight
        torch = self.torch

        def get(w):
            if not cached or id(w) not in self._w8:
                with torch.no_grad():
                    self._w8[id(w)] = quant_weight(w.detach())
            return self._w8[id(w)]
        return get

    def patches(self, variant: str) -> list[tuple[object, object]]:
        from cublaslt_probe.gpu.experts import experts_forward
        if variant == "balanced":
            return [(r, types.MethodType(  # d: each router's own scores dtype, bound as its method is made
                lambda s, h, d=self.scores_dtype[id(r)]: balanced_router(s, h, scores_dtype=d), r))  # noqa: B008
                for r in self.routers]
        v = "original" if variant == "rewrite" else variant
        fp8 = self.fp8_weights(not self.model.training)

        def fwd(s, hidden_states, top_k_index, top_k_weights):
            if getattr(s, "has_bias", False) or getattr(s, "is_transposed", False) or not getattr(s, "has_gate", True):
                raise ValueError(f"{type(s).__name__}: the rewrite covers gated experts without bias, "
                                 "weights [E, n, k]")
            return experts_forward(s.gate_up_proj, s.down_proj, hidden_states, top_k_index, top_k_weights,
                                   variant=v, gate=s._apply_gate, fp8_weights=fp8)
        return [(e, types.MethodType(fwd, e)) for e in self.experts]

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
        """The routers' score dtype (from one call of the original router)."""
        torch = self.torch
        with torch.no_grad():
            for r in self.routers:
                h = torch.zeros(8, r.weight.shape[1], device=r.weight.device, dtype=r.weight.dtype)
                self.scores_dtype[id(r)] = r(h)[1].dtype

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


def measure(prog: Program, variants: list[str], rounds: int, warmup: int) -> dict:
    """Rounds of every variant's step (None: the program as captured), alternating direction each round: each
    variant's step once (`gpu`: its CUDA-event span; `wall`: synchronised wall time, `prove_advice.one`). A
    variant's patch is put on before its timing starts and taken off after it ends."""
    from prove_advice import one
    names = [None] + variants

    def timed(n):
        with prog.applied(n):
            return one(prog.step)
    for _ in range(warmup):
        for n in names:
            timed(n)
    samples: dict = {n or "A": {"gpu": [], "wall": []} for n in names}
    for r in range(rounds):
        for n in (names if r % 2 == 0 else names[::-1]):
            g, w = timed(n)
            samples[n or "A"]["gpu"].append(g)
            samples[n or "A"]["wall"].append(w)
    med = {n: {k: statistics.median(v) for k, v in s.items()} for n, s in samples.items()}
    keys = ("gpu", "wall")
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
    from cublaslt_probe.analysis.audit import audit
    from cublaslt_probe.gpu.recorder import capture
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


def verdicts(pred: list[dict], meas: dict, ksav: dict) -> list[dict]:
    """Per variant: its predicted savings (the experts' whole call: what the advice claims; its GEMMs alone),
    the step's measured saving against the program as captured (A; paired per round: median and quartiles)
    and against the rewrite control, the audited kernels' savings (the experts' GEMMs, the step's kernels),
    and the ratios measured / predicted: the step's span against the whole-call prediction, the experts'
    GEMM kernels against the GEMMs' prediction. The top advice item (rank 1 among the grouped) is ``top``."""
    out = []
    sv = meas["saving_us"]
    ctrl = sv.get("rewrite")
    ranks = sorted(p["rank"] for p in pred if p.get("rank"))
    for v, s in sv.items():
        p = next((x for x in pred if x["variant"] == v), None) or {}
        pm, q1, q3 = paired(meas, v)
        k = ksav.get(v) or {}
        d = {"variant": v, "advice_rank": p.get("rank"), "top": bool(ranks) and p.get("rank") == ranks[0],
             "predicted_whole_us": p.get("whole_us"), "predicted_gemms_us": p.get("gemms_us"),
             "measured_step_us": s["gpu"], "measured_step_paired_us": [round(pm, 1), round(q1, 1), round(q3, 1)],
             "measured_experts_gemms_us": k.get("experts_gemm_us"), "measured_step_kernels_us": k.get("step_gpu_us")}
        if ctrl and v not in ("rewrite", "balanced", "mm_per_group"):
            d["vs_rewrite_us"] = round(s["gpu"] - ctrl["gpu"], 1)
        if p.get("whole_us"):
            d["ratio_step"] = round(s["gpu"] / p["whole_us"], 3)
            d["meets_70pct"] = d["ratio_step"] >= 0.7
        if p.get("gemms_us") and k.get("experts_gemm_us") is not None:
            d["ratio_gemms"] = round(k["experts_gemm_us"] / p["gemms_us"], 3)
        out.append(d)
    return out


def paired(measured: dict, variant: str, key: str = "gpu") -> tuple[float, float, float]:
    """Median and quartiles of the per-round savings (A's step minus the variant's, µs): each round's A and B
    ran next to each other, so drift between rounds cancels."""
    a, b = measured["samples_ms"]["A"][key], measured["samples_ms"][variant][key]
    d = sorted(1e3 * (x - y) for x, y in zip(a, b))
    return statistics.median(d), d[len(d) // 4], d[(3 * len(d)) // 4]


def summary_lines(res: dict) -> list[str]:
    """The proof as a table per program (a saved result): per variant its advice rank, the predicted saving
    per step (the experts' whole call; its GEMMs alone), the step's span saved (medians; paired median and
    quartiles) and its ratio to the whole-call prediction, the audited experts' GEMM kernels saved and their
    ratio to the GEMMs' prediction, the step's kernels saved, numerics."""
    out = []
    for name, p in res.get("programs", {}).items():
        if "error" in p and "measured" not in p:
            out.append(f"{name}: error {p['error']}")
            continue
        m, num = p["measured"], p.get("numerics", {})
        med = m["median_ms"]
        ka = (p.get("kernels") or {}).get("A") or {}
        out.append(f"{name}: A span {med['A']['gpu']:.3f} ms (median of {m['rounds']} rounds), "
                   f"A kernels {ka.get('step_gpu_us', 0):,.1f} µs/step")
        out.append("  variant       rank  pred. whole  step span saved (paired; IQR)           ratio  "
                   "pred. GEMMs  experts' GEMMs saved  ratio  step kernels  numerics (experts, logits)")
        for d in p["verdicts"]:
            v = d["variant"]
            n = num.get(v)
            nt = (f"{n['experts_output_rel']:.3g}, {n['logits_rel']:.3g}" if isinstance(n, dict) and "error" not in n
                  else "another model" if isinstance(n, str) else "—")

            def f(x, spec="+.1f"):
                return "—" if x is None else format(x, spec)
            pm, q1, q3 = d["measured_step_paired_us"]
            out.append(f"  {v:12s}  {f(d['advice_rank'], 'd') if d['advice_rank'] else '—':>4}  "
                       f"{f(d['predicted_whole_us']):>11}  {d['measured_step_us']:+9.1f} "
                       f"({pm:+.1f}; {q1:+.1f}..{q3:+.1f})"
                       f"  {f(d.get('ratio_step'), '.0%'):>6}  {f(d['predicted_gemms_us']):>11}  "
                       f"{f(d['measured_experts_gemms_us']):>20}  {f(d.get('ratio_gemms'), '.0%'):>5}  "
                       f"{f(d['measured_step_kernels_us']):>12}  {nt}" + ("  <- top advice item" if d["top"] else ""))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--rounds", type=int, default=21)
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
        variants = list(dict.fromkeys(ALWAYS + [p["variant"] for p in preds[name] if p.get("rank")
                                                and p["variant"] != "batched_mm"]))
        t0 = time.perf_counter()
        entry: dict = {"predicted": preds[name]}
        prog = None
        try:
            prog = Program(PROGRAMS[name])
            prog.prepare()
            entry["numerics"] = prog.numerics(variants)
            print(name, "numerics", json.dumps(entry["numerics"]), flush=True)
            ok = [v for v in variants
                  if not (isinstance(entry["numerics"][v], dict) and "error" in entry["numerics"][v])]
            entry["measured"] = measure(prog, ok, a.rounds, a.warmup)
            ksav = {}
            if a.runs:
                k = entry["kernels"] = kernel_split(prog, ok, os.path.join(a.runs, name))
                base = k.get("A", {})
                ksav = entry["kernel_savings_us"] = {
                    v: {f: round(base[f] - x[f], 1) for f in ("step_gpu_us", "gemm_gpu_us", "experts_gemm_us")}
                    for v, x in k.items() if v != "A" and "error" not in x and "error" not in base}
            entry["verdicts"] = verdicts(preds[name], entry["measured"], ksav)
            for v in entry["verdicts"]:
                print(name, json.dumps(v), flush=True)
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
