"""Audit programs as they are deployed and check each one's top advice on the step (run on the GPU machine).

    PYTHONPATH=. python3 scripts/prove_graph_advice.py --out OUT [--top-measure 4] [--rounds 30]

Programs (`scripts/capture_graphs.py` builds them):
- graph_decode: the Llama-shaped decode step replayed from a `torch.cuda.CUDAGraph` captured inside the capture;
- reduce_overhead: the same layers without a cache under `torch.compile(mode="reduce-overhead")` (cudagraph
  trees), compiled, recorded and replayed inside the capture (its run folder is the committed fixture);
- script_infer: the unmodified inference script scripts/example_infer_script.py through `capture --`
  (`recorder.run_script`, what the CLI runs), its steps found without marks.

For each: `audit` of the run (coverage: the share of GEMM time whose rows have a module, and a module and
shapes; the share from graphs), `audit --measure` of its largest GEMMs (graph-replayed where the row came from a
graph), the advice, and the top item that can be applied to the program: a BLAS path switch (set before the graph
is captured or compiled) or a padding of a size the model fixes (the model built with the padded size). A pinned
algo cannot be set through torch: it is reported, and the next item is taken. The step with the change (B) and
without (A) are built in this process and stepped alternately (A, B, A, B, ...), each step's CUDA-event span on
the stream; the measured saving is the difference of the medians, against the advice's predicted µs per step.

Writes OUT/prove_graph_advice.json (and OUT/NAME/: each run folder, with measure.json) as it goes: a program
that fails is reported there and the others still run.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import runpy
import shutil
import statistics
import sys
import time
import traceback

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)
import capture_graphs as cg

from cublaslt_probe.analysis.audit import PATH_WORDS, advice, audit
from cublaslt_probe.cli._common import clean
from cublaslt_probe.gpu.measure import measure_gemms
from cublaslt_probe.gpu.recorder import run_script

SCRIPT = os.path.join(HERE, "example_infer_script.py")
BLAS = {"torch": "cublas", "torch-lt": "cublaslt"}
PAD = re.compile(r"pad (?:the vocabulary )?(\d+) → (\d+)")


def coverage(a) -> dict:
    """Shares of the audited GEMM time (per step) whose rows have a module, a module and shapes, a graph."""
    r = a.rows
    total = float(r["gpu_us"].sum()) if len(r) else 0.0

    def pct(mask) -> float | None:
        return round(100 * float(r.loc[mask, "gpu_us"].sum()) / total, 2) if total > 0 else None
    mod = r["module"].notna()
    return {"steps": a.steps, "gemm_us_per_step": round(a.gemm_gpu_us, 2), "step_gpu_us": round(a.step_gpu_us, 2),
            "rows": len(r), "module_pct": pct(mod), "module_and_shapes_pct": pct(mod & r["m"].notna()),
            "graph_pct": pct(r["graph"].notna()), "notes": a.notes}


def advise(run: str, top: int) -> tuple:
    a = audit(run)
    gemms = [{k: clean(v) for k, v in g.items()} for g in a.rows.head(top).to_dict("records")]
    meas = measure_gemms(gemms, allow_tf32=False)
    with open(os.path.join(run, "measure.json"), "w") as f:
        json.dump(meas, f, indent=1, default=str)
    items = advice(a.rows, meas, a.step_gpu_us)
    return a, meas, items


def change_of(item: dict, sizes: dict) -> dict | None:
    """How to apply `item` to a program whose fixed sizes are `sizes` (name -> value): {"blas": library} or
    {"size": name, "value": padded}; None when it cannot be applied through torch or the model."""
    if item["kind"] == "path":
        target = next((p for p, w in PATH_WORDS.items() if item["what"] == f"run on {w}"), None)
        return {"blas": BLAS[target]} if target in BLAS else None
    if item["kind"] == "pad":
        m = PAD.search(item["what"])
        if m:
            old, new = int(m.group(1)), int(m.group(2))
            name = next((k for k, v in sizes.items() if v == old), None)
            return {"size": name, "old": old, "value": new} if name else None
    return None


def pick(items: list[dict], sizes: dict) -> tuple[dict | None, dict | None, list[str]]:
    """The first item with a saving that can be applied, its change, and why the ones before it were not."""
    skipped = []
    for it in items:
        if not it.get("saving_us") or it["saving_us"] <= 0:
            continue
        ch = change_of(it, sizes)
        if ch is not None:
            return it, ch, skipped
        skipped.append(f"{it['kind']}: {it['what']} ({it['saving_us']:.1f} µs/step predicted): not applicable "
                       "through torch or the model's sizes")
    return None, None, skipped


def with_blas(step, lib: str | None):
    if lib is None:
        return step

    def run():
        old = torch.backends.cuda.preferred_blas_library()
        torch.backends.cuda.preferred_blas_library(lib)
        try:
            return step()
        finally:
            torch.backends.cuda.preferred_blas_library(old)
    return run


def span_ms(step) -> float:
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    s.record()
    step()
    e.record()
    e.synchronize()
    return s.elapsed_time(e)


def ab(a_step, b_step, rounds: int) -> dict:
    for _ in range(3):
        a_step()
        b_step()
    res = {"a": [], "b": []}
    for _ in range(rounds):
        res["a"].append(span_ms(a_step))
        res["b"].append(span_ms(b_step))
    ma, mb = statistics.median(res["a"]), statistics.median(res["b"])
    return {"rounds": rounds, "a_ms": round(ma, 4), "b_ms": round(mb, 4), "saving_us": round(1e3 * (ma - mb), 1),
            "samples_ms": {k: [round(x, 4) for x in v] for k, v in res.items()}}


def summary_of(items: list[dict]) -> list[dict]:
    return [{k: it.get(k) for k in ("kind", "what", "module", "saving_us", "saving_pct", "evidence", "risk")}
            for it in items[:6]]


def graph_decode(run: str, args) -> dict:
    out = cg.graph_captured(run)
    a, meas, items = advise(run, args.top_measure)
    res = {"capture": {k: v for k, v in out.items() if k != "graphs"}, "coverage": coverage(a),
           "advice": summary_of(items)}
    sizes = {k: cg.CFG[k] for k in ("vocab", "hidden", "inter", "batch")}
    it, ch, skipped = pick(items, sizes)
    res["skipped"] = skipped
    if it is None:
        return res
    res["applied"] = {"item": it["what"], "predicted_us": round(it["saving_us"], 1), "change": ch}
    a_model = cg.build_decoder()
    ga = cg.graph_of(a_model)
    over = {ch["size"]: ch["value"]} if "size" in ch else {}
    b_model = cg.build_decoder(**over)
    gb = with_blas(lambda: cg.graph_of(b_model), ch.get("blas"))()   # the switch is baked in at capture
    res["applied"]["measured"] = ab(ga.replay, gb.replay, args.rounds)
    return res


def reduce_overhead(run: str, args) -> dict:
    out = cg.reduce_overhead(run)
    compiled, ids = out.pop("_run")
    a, meas, items = advise(run, args.top_measure)
    res = {"capture": {k: v for k, v in out.items() if k != "graphs"}, "graphs": out.get("graphs"),
           "coverage": coverage(a), "advice": summary_of(items)}
    sizes = {k: cg.CFG[k] for k in ("vocab", "hidden", "inter")}
    sizes["tokens"] = cg.CFG["batch"] * cg.CFG["seq"]
    it, ch, skipped = pick(items, sizes)
    res["skipped"] = skipped
    if it is None:
        return res
    res["applied"] = {"item": it["what"], "predicted_us": round(it["saving_us"], 1), "change": ch}
    if ch.get("size") == "tokens":
        res["applied"]["measured"] = {"error": "the token count is the input's, not a size of the model"}
        return res
    over = {ch["size"]: ch["value"]} if "size" in ch else {}
    b_model, c = cg.build_forward(**over)
    b_compiled = torch.compile(b_model, mode="reduce-overhead")

    def step(m):
        def run_it():
            torch.compiler.cudagraph_mark_step_begin()
            with torch.no_grad():
                m(ids)
        return run_it
    b_step = with_blas(step(b_compiled), ch.get("blas"))
    for _ in range(3):
        b_step()               # compiled, recorded (with the switch set) and replayed once
    res["applied"]["measured"] = ab(step(compiled), b_step, args.rounds)
    return res


def script_infer(run: str, args) -> dict:
    t0 = time.perf_counter()
    run_script(run, [SCRIPT])
    res = {"capture": {"seconds": round(time.perf_counter() - t0, 1),
                       "command": "cublaslt-probe capture -o RUN -- scripts/example_infer_script.py"}}
    a, meas, items = advise(run, args.top_measure)
    res["coverage"] = coverage(a)
    res["advice"] = summary_of(items)
    ns = runpy.run_path(SCRIPT)                  # the script's own model, config and input, run once more
    cfg, model, ids = ns["cfg"], ns["model"], ns["ids"]
    sizes = {"vocab_size": cfg.vocab_size, "n_embd": cfg.n_embd}
    it, ch, skipped = pick(items, sizes)
    res["skipped"] = skipped
    if it is None:
        return res
    res["applied"] = {"item": it["what"], "predicted_us": round(it["saving_us"], 1), "change": ch}
    b_model = model
    if "size" in ch:
        from transformers import GPT2LMHeadModel
        b_cfg = type(cfg).from_dict({**cfg.to_dict(), ch["size"]: ch["value"]})
        b_model = GPT2LMHeadModel(b_cfg).eval().to(torch.bfloat16).cuda()

    def step(m):
        def run_it():
            with torch.no_grad():
                m(ids)
        return run_it
    res["applied"]["measured"] = ab(step(model), with_blas(step(b_model), ch.get("blas")), args.rounds)
    return res


PROGRAMS = {"reduce_overhead": reduce_overhead, "graph_decode": graph_decode, "script_infer": script_infer}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default="")
    ap.add_argument("--top-measure", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=30)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    doc = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "programs": {}}
    for name in [n for n in args.only.split(",") if n] or list(PROGRAMS):
        t0 = time.time()
        run = os.path.join(args.out, name)
        shutil.rmtree(run, ignore_errors=True)
        try:
            res = PROGRAMS[name](run, args)
        except Exception as e:  # noqa: BLE001  one program's failure is reported; the others still run
            res = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]}
        res["seconds"] = round(time.time() - t0, 1)
        doc["programs"][name] = res
        print(name, json.dumps({k: v for k, v in res.items() if k in ("coverage", "applied", "error", "seconds")},
                               default=str)[:1500], flush=True)
        with open(os.path.join(args.out, "prove_graph_advice.json"), "w") as f:
            json.dump(doc, f, indent=1, default=str)
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
