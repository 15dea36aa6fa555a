"""`cublaslt_probe.analysis.audit` and `cublaslt-probe audit` on the real H200 run folders of tests/fixtures/programs
(see the PROVENANCE there): coverage, attribution, grouped GEMMs, alignment fallbacks, collapsed layers, the
log join, bad input. The expectations come from the programs the capture script ran (its docstring) and from
an independent plain json.load of each trace, never from the code under test.
"""
from __future__ import annotations

import gzip
import json
import shutil

import pandas as pd
import pytest
from click.testing import CliRunner
from conftest import FIXTURES

from cublaslt_probe import runfiles
from cublaslt_probe.analysis.audit import AUDIT_COLUMNS, FIXED_KEYS, audit, collapse
from cublaslt_probe.cli import main
from cublaslt_probe.names import decode
from cublaslt_probe.render.audit import render_html

PROGRAMS = FIXTURES / "programs"
RUNS = sorted(p for p in PROGRAMS.iterdir() if (p / runfiles.ENV_FILE).exists()) if PROGRAMS.is_dir() else []


def _events(path):
    with gzip.open(path, "rt") as f:
        return json.load(f)["traceEvents"]


def plain_step_gemm_us(trace) -> tuple[float, int]:
    """GEMM-kind GPU time per step and the number of steps, read with json.load: a kernel belongs to a step
    when its launch call (cuda_runtime, same correlation) starts inside a step range; a trace without step
    ranges is one step."""
    evs = _events(trace)
    steps = [(e["ts"], e["ts"] + e["dur"]) for e in evs if e.get("cat") == "user_annotation"
             and e["name"].startswith(runfiles.STEP_PREFIX)]
    launch = {e["args"]["correlation"]: e["ts"] for e in evs if e.get("cat") in ("cuda_runtime", "cuda_driver")
              and "correlation" in e.get("args", {})}
    total = 0.0
    for e in evs:
        if e.get("cat") != "kernel" or decode(e["name"]).kind != "gemm":
            continue
        t = launch.get(e["args"].get("correlation"), e["ts"])
        if not steps or any(a <= t <= b for a, b in steps):
            total += e["dur"]
    return total / max(len(steps), 1), max(len(steps), 1)


@pytest.fixture(scope="module")
def audits():
    return {p.name: audit(p) for p in RUNS}


# ------------------------------------------------------------------------------------------ coverage
@pytest.mark.parametrize("run", RUNS, ids=lambda p: p.name)
def test_rows_add_up_to_the_steps_gemm_time(run, audits):
    a = audits[run.name]
    want, steps = plain_step_gemm_us(run / runfiles.TRACE_FILE)
    if not a.env.get("capture", {}).get("steps_marked", 1):
        pytest.skip("no step marks: the steps audit finds are checked in test_steps.py")
    assert a.steps == steps
    assert a.rows.gpu_us.sum() == pytest.approx(want, rel=0.01)
    assert a.gemm_gpu_us == pytest.approx(want, rel=0.01)
    assert a.rows.share.sum() == pytest.approx(want / a.step_gpu_us, rel=0.01)
    assert list(a.rows.columns) == AUDIT_COLUMNS


@pytest.mark.parametrize("run", RUNS, ids=lambda p: p.name)
def test_attribution_on_captured_runs(run, audits):
    """Every capture run has module ranges: at least 95 % of its GEMM time gets a module."""
    a = audits[run.name]
    if not len(a.rows):
        pytest.skip("no GEMM in this program")
    assert a.attribution == "capture ranges"
    assert a.attributed_share >= 0.95


def test_backward_gemms_take_their_forward_module(audits):
    """GPT-2 training step: the vocabulary (50257) appears only in lm_head, so every GEMM with it — the
    forward and its two backward GEMMs (grad input, grad weight) — belongs to lm_head; the MLP's backward
    GEMMs to the MLP modules of all 12 layers."""
    r = audits["gpt2_train"].rows
    vocab = r[(r.m == 50257) | (r.n == 50257) | (r.k == 50257)]
    assert set(vocab.module) == {"lm_head"}
    assert sorted(vocab["pass"].astype(str)) == ["bwd", "bwd", "fwd"]
    fc = r[r.module == "transformer.h.*.mlp.c_fc"]
    assert set(fc["pass"].astype(str)) == {"fwd", "bwd"} and set(fc.instances) == {12}
    assert (fc.calls == 12).all()                                  # once per layer per step
    assert set(fc[fc["pass"] == "fwd"].op) == {"aten::addmm"}


def test_layers_collapse(audits):
    """Llama prefill, 2 decoder layers: each projection is one row of 2 modules, 2 calls per step."""
    r = audits["llama_prefill"].rows
    down = r[r.module == "model.layers.*.mlp.down_proj"]
    assert len(down) == 1 and down.instances.iloc[0] == 2 and down.calls.iloc[0] == 2
    assert (down.m.iloc[0], down.n.iloc[0], down.k.iloc[0]) == (2048, 4096, 14336)
    assert collapse("model.layers.31.mlp.down_proj") == "model.layers.*.mlp.down_proj"
    assert collapse("LlamaMLP_3") == "LlamaMLP_*" and collapse("lm_head") == "lm_head"


def test_grouped_gemm_rows(audits):
    """Mixtral MoE layer: the experts' two grouped GEMMs (8 experts; gate+up fused N = 2 × 14336, then down)
    with torch's grouped-GEMM setup kernel folded into them."""
    a = audits["mixtral_moe"]
    g = a.rows[a.rows.op == "aten::_grouped_mm"]
    got = sorted(g[["m", "n", "k", "groups"]].astype(int).itertuples(index=False, name=None))
    assert got == [(4096, 4096, 14336, 8), (4096, 28672, 4096, 8)]
    assert set(g.module) == {"model.layers.*.mlp.experts"} and (g.helper_us > 0).all()
    assert set(g.provenance.astype(str)) == {"ahead-of-time"} and g.share.sum() > 0.4
    assert g.waves.isna().all()                                    # group sizes are not in the trace


def test_alignment_fallbacks(audits):
    """odd_linear: the same linear with N = 4095 (output rows of 8190 bytes) and 4096; GPT-2: vocabulary
    50257. The odd ones run an older-architecture CUTLASS kernel, the even ones nvjet."""
    r = audits["odd_linear"].rows.set_index("module")
    assert r.loc["odd", "align_fallback"] == True and "C ld=4095" in r.loc["odd", "misaligned"]  # noqa: E712
    assert r.loc["even", "align_fallback"] == False and pd.isna(r.loc["even", "misaligned"])  # noqa: E712
    assert str(r.loc["odd", "arch"]) < "sm90" <= str(r.loc["even", "arch"])
    g = audits["gpt2_train"].rows
    assert g[g.module == "lm_head"].align_fallback.all()
    assert not g[g.module != "lm_head"].align_fallback.fillna(False).any()


def test_log_join_and_roofline(audits):
    """The logged algo matches the kernel; fp32 GEMMs run as TF32 in the GPT-2 step (the log says so); the
    floor is never above the measured time."""
    g = audits["gpt2_train"].rows
    assert g.algo.notna().all() and (g.log_consistent != False).all()  # noqa: E712
    assert set(g.dtype.astype(str)) == {"tf32"}
    for a in audits.values():
        r = a.rows[a.rows.floor_us.notna()]
        assert (r.floor_ratio >= 1).all()
        assert (r.pct_peak <= 100).all()
    p = audits["llama_prefill"].rows
    lm = p[p.module == "lm_head"].iloc[0]
    assert lm.tflops == pytest.approx(2 * 2048 * 128256 * 4096 / lm.mean_us / 1e6)
    assert lm.waves == pytest.approx(-(-128256 // lm.tile_m) * -(-2048 // lm.tile_n) / 132)


def test_triton_template_shape_from_its_arguments(audits):
    r = audits["compiled_mm_autotune"].rows
    (row,) = r.to_dict("records")
    assert row["provenance"] == "runtime-compiled" and row["shape_from"] == "kernel arguments"
    assert (row["m"], row["n"], row["k"]) == (2048, 4096, 4096)
    assert any("no matmul trace lines" in n for n in audits["compiled_mm_autotune"].notes)


# ------------------------------------------------------------------------------------------ bad input
def test_trace_captured_elsewhere_falls_back_to_op_and_shapes():
    """A plain torch.profiler trace (with_modules=True records no module events in this torch): no steps,
    no modules: one note each, the rows by op and shape."""
    a = audit(PROGRAMS / "llama_decode_with_modules" / "trace.json.gz")
    assert a.attribution == "none" and a.rows.module.isna().all()
    assert any("no step ranges" in n for n in a.notes) and any("no module ranges" in n for n in a.notes)
    assert a.rows.m.notna().all() and a.rows.gpu_us.sum() == pytest.approx(a.gemm_gpu_us)


def _strip(src, dst, drop):
    """A copy of a real trace with some event args removed (derived in the test, never stored)."""
    with gzip.open(src, "rt") as f:
        doc = json.load(f)
    for e in doc["traceEvents"]:
        for k in drop:
            (e.get("args") or {}).pop(k, None)
    with gzip.open(dst, "wt") as f:
        json.dump(doc, f)
    return dst


def test_trace_without_shapes(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(PROGRAMS / "llama_prefill", run)
    _strip(PROGRAMS / "llama_prefill" / runfiles.TRACE_FILE, run / runfiles.TRACE_FILE,
           ("Input Dims", "Input type", "Input Strides"))
    a = audit(run)
    assert any("no input shapes" in n for n in a.notes)
    assert a.rows.m.isna().all() and a.rows.pct_peak.isna().all()
    assert a.rows.module.notna().all()                            # attribution does not need shapes
    assert a.rows.gpu_us.sum() == pytest.approx(audit(PROGRAMS / "llama_prefill").rows.gpu_us.sum())


def test_run_from_another_gpu(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(PROGRAMS / "odd_linear", run)
    env = json.loads((run / runfiles.ENV_FILE).read_text())
    env["gpu"] = "NVIDIA B200"
    (run / runfiles.ENV_FILE).write_text(json.dumps(env))
    a = audit(run)
    assert any("env.json says NVIDIA B200" in n for n in a.notes) and a.gpu == "NVIDIA H200"
    assert a.rows.pct_peak.notna().all()                          # the trace's own GPU's rates
    # a bare trace of a GPU without a peak table: rows still there, floors not
    t = tmp_path / "t.json.gz"
    with gzip.open(PROGRAMS / "odd_linear" / runfiles.TRACE_FILE, "rt") as f:
        doc = json.load(f)
    doc["deviceProperties"][0]["name"] = "NVIDIA GeForce RTX 4090"
    with gzip.open(t, "wt") as f:
        json.dump(doc, f)
    b = audit(t)
    assert any("no peak rates for GPU NVIDIA GeForce RTX 4090" in n for n in b.notes)
    assert b.rows.floor_us.isna().all() and len(b.rows) == 2


def test_log_without_trace_lines(tmp_path):
    empty = tmp_path / "empty.log"
    empty.write_text("")
    a = audit(PROGRAMS / "odd_linear" / runfiles.TRACE_FILE, empty)
    assert any("no matmul trace lines" in n for n in a.notes) and a.rows.algo.isna().all()
    assert len(a.rows) == 2


# ------------------------------------------------------------------------------------------ CLI
def run_cli(*args):
    return CliRunner().invoke(main, ["audit", *map(str, args)])


def test_cli_jsonl_keys_and_table(tmp_path):
    r = run_cli(PROGRAMS / "gpt2_train", "--format", "jsonl")
    assert r.exit_code == 0, r.output
    rows = [json.loads(x) for x in r.stdout.splitlines()]
    assert list(rows[0])[:len(FIXED_KEYS)] == list(FIXED_KEYS)
    assert rows[0]["module"] == "lm_head" and rows[0]["align_fallback"] is True
    t = run_cli(PROGRAMS / "gpt2_train", "--top", "3", "--html", tmp_path / "a.html")
    assert t.exit_code == 0
    lines = t.stdout.splitlines()
    assert lines[1].startswith("2 steps; per step: GPU time") and "100.0 % of GEMM time has a module" in lines[3]
    assert "transformer.h.*.mlp.c_proj ×12" in t.stdout or "lm_head" in lines[7]
    assert lines[-1] == "… 12 more rows (--top 0 shows all)"
    page = (tmp_path / "a.html").read_text()
    assert page.count("<svg") >= 2 and "lm_head" in page


def test_cli_errors(tmp_path):
    r = run_cli(tmp_path / "missing")
    assert r.exit_code == 1 and "no such file or folder" in r.stderr
    r = run_cli(tmp_path)
    assert r.exit_code == 1 and "no trace.json.gz in this folder" in r.stderr
    bad = tmp_path / "m.json"
    bad.write_text("[1, 2]")
    r = run_cli(PROGRAMS / "odd_linear", "--from", bad)
    assert r.exit_code == 1 and "no 'gemms' list" in r.stderr
    r = run_cli(PROGRAMS / "odd_linear", "--from", bad, "--measure")
    assert r.exit_code == 2
    log = FIXTURES / "logs" / "level2_torch.log"                  # a cuBLASLt log given as the trace
    r = run_cli(log)
    assert r.exit_code == 1 and "is a cuBLASLt log, not a profiler trace" in r.stderr
    from cublaslt_probe.errors import ProbeError
    with pytest.raises(ProbeError, match="no profiler events in it: give a torch.profiler Chrome trace"):
        audit(log)


def test_html_without_measurements(audits):
    page = render_html(audits["mixtral_moe"])
    assert page.startswith("<!doctype html>") and "aten::_grouped_mm" in page and "audit --measure" in page


def test_docs_list_every_column():
    doc = (FIXTURES.parent.parent / "docs" / "audit.md").read_text()
    missing = [c for c in AUDIT_COLUMNS if f"| `{c}` |" not in doc]
    assert not missing, f"docs/audit.md lacks columns {missing}"


# ------------------------------------------------------------------ traces captured elsewhere (synthetic)
def test_nn_module_ranges_and_profiler_steps(tmp_path):
    """A trace written in the documented Kineto event format (built here, labelled synthetic, not stored) with
    what torch.profiler(with_modules=True) and a profiler schedule add: ``nn.Module: Class_N`` python
    functions and ``ProfilerStep#N`` annotations. Attribution falls back to them."""
    from test_trace import BF16, NVJET, kernel, op, runtime, write_trace

    def pyfn(name, ts, dur):
        return {"ph": "X", "cat": "python_function", "name": name, "pid": 100, "tid": 100, "ts": ts, "dur": dur,
                "args": {"Python id": 1, "Python parent id": 0}}

    def step(i, ts, dur):
        return {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{i}", "pid": 100, "tid": 100,
                "ts": ts, "dur": dur, "args": {"External id": 900 + i}}

    evs = [step(0, 0.0, 150.0), step(1, 150.0, 250.0)]
    for i, t0 in enumerate((0.0, 160.0)):                     # two steps, two Linear modules each
        for j, dt in enumerate((0.0, 60.0)):
            ext = 10 * i + j + 1
            t = t0 + dt
            evs += [pyfn("nn.Module: Model_0", t0, 140.0) if j == 0 else None,
                    pyfn(f"nn.Module: Linear_{j}", t + 1, 50.0),
                    op(ext, "aten::mm", [[16, 64], [64, 128]], BF16, [[64, 1], [1, 64]], ts=t + 5),
                    runtime(ext, 100 + ext, ts=t + 6), kernel(NVJET, 4.0 + j, t + 300.0, corr=100 + ext)]
    p = write_trace(tmp_path / "synthetic.json", [e for e in evs if e is not None])
    a = audit(p)
    assert a.attribution == "nn.Module" and a.steps == 2
    (r,) = a.rows.to_dict("records")                          # same kernel and problem: one row, two modules
    assert r["module"] == "Model_*.Linear_*" and r["instances"] == 2
    assert (r["calls"], r["gpu_us"]) == (2, 9.0) and r["pass"] == "fwd"
    assert (r["m"], r["n"], r["k"], r["layout"]) == (16, 128, 64, "NT")


# ------------------------------------------------------------------------------------------ advice
MEASURE = PROGRAMS / "measure"


def _measure(name):
    return json.loads((MEASURE / f"{name}.json").read_text())


def _saving(m, module, dim_values):
    """Per-step saving of a padding, from the measurement file alone: (original - padded) × calls, summed
    over the module's GEMMs that measured that padded value."""
    total = 0.0
    for g in m["gemms"]:
        if g.get("module") != module:
            continue
        for w in g.get("whatifs") or []:
            if (w["dim"], w["value"]) in dim_values and w.get("time_us"):
                total += (g["original_us"] - w["time_us"]) * g["calls"]
    return total


def test_advice_pads_the_gpt2_vocabulary(audits):
    """GPT-2 training step measured on the H200: the lm_head GEMMs with the vocabulary 50257 (forward, grad
    input, grad weight) run an older CUTLASS kernel; padded to 50264, 50272 or 50304 each runs an sm90 kernel
    ~2.5x faster: the smallest padding within 3 % of the best saving is advised."""
    from cublaslt_probe.analysis.audit import advice
    a, m = audits["gpt2_train"], _measure("gpt2_train")
    items = advice(a.rows, m, a.step_gpu_us)
    top = items[0]
    assert top["kind"] == "pad" and top["module"] == "lm_head"
    assert top["what"].startswith("pad the vocabulary 50257 → 50264 (a multiple of 8)")
    want = _saving(m, "lm_head", {("m", 50264), ("n", 50264), ("k", 50264)})
    assert top["saving_us"] == pytest.approx(want) and want > 4000
    assert top["saving_pct"] == pytest.approx(100 * want / a.step_gpu_us)
    assert len(top["gemms"]) == 3 and "also measured: 50272" in top["evidence"]
    assert "numerics agree" in top["risk"] and "grows by 7" in top["risk"]
    # the other paddings of the same value are alternatives, not extra items
    assert sum(1 for it in items if it["kind"] == "pad") == 1
    savings = [it["saving_us"] for it in items if it["saving_us"] > 0]
    assert savings == sorted(savings, reverse=True)
    # the MLP GEMMs: measured, nothing faster, and they say how far from the floor they are
    quiet = [it for it in items if it["saving_us"] == 0]
    assert {it["module"] for it in quiet} >= {"transformer.h.*.mlp.c_fc", "transformer.h.*.mlp.c_proj"}
    assert all("× its floor" in it["what"] and "no advice" in it["what"] for it in quiet)


def test_advice_pads_the_odd_linear_and_leaves_the_even_one():
    from cublaslt_probe.analysis.audit import advice
    a, m = audit(PROGRAMS / "odd_linear"), _measure("odd_linear")
    items = advice(a.rows, m, a.step_gpu_us)
    assert items[0]["what"] == "pad 4095 → 4096 (a multiple of 8) in odd"
    assert items[0]["saving_us"] == pytest.approx(_saving(m, "odd", {("n", 4096)}))
    assert items[1]["saving_us"] == 0 and items[1]["module"] == "even"


def test_advice_on_grouped_and_fast_gemms(audits):
    from cublaslt_probe.analysis.audit import advice
    a = audits["mixtral_moe"]
    items = advice(a.rows, _measure("mixtral_moe"), a.step_gpu_us)
    grouped = [it for it in items if it["kind"] == "not_measured"]
    assert len(grouped) == 2 and all("aten::_grouped_mm" in it["what"] for it in grouped)
    p = audits["llama_prefill"]
    assert all(it["saving_us"] == 0 for it in advice(p.rows, _measure("llama_prefill"), p.step_gpu_us))


def test_cli_renders_advice_from_saved_measurements(tmp_path):
    r = run_cli(PROGRAMS / "gpt2_train", "--from", MEASURE / "gpt2_train.json", "--top", "2",
                "--html", tmp_path / "a.html")
    assert r.exit_code == 0, r.output
    out = r.stdout
    assert "advice (measured):" in out
    assert "1. pad the vocabulary 50257 → 50264 (a multiple of 8) in lm_head: saves 4,624.1 µs/step" in out
    page = (tmp_path / "a.html").read_text()
    assert "pad the vocabulary 50257 → 50264" in page and page.count("<svg") >= 3     # with the what-if curves
    # measurements of another GPU are refused in one line (tests/test_measure_binding.py: the binding)
    m = _measure("gpt2_train")
    m["env"]["gpu"] = "NVIDIA A100-SXM4-80GB"
    other = tmp_path / "other.json"
    other.write_text(json.dumps(m))
    r = run_cli(PROGRAMS / "gpt2_train", "--from", other, "--top", "1")
    assert r.exit_code == 2 and "advice (measured)" not in r.stdout
    assert "GPU NVIDIA A100-SXM4-80GB (this run: NVIDIA H200)" in r.output and len(r.output.splitlines()) == 1


def test_recommended_algos_export_as_replayable_log_lines(tmp_path):
    """A pin advice carries the GEMM's own logged line with the candidate's algo: the log parser reads it and
    replay's CPU side rebuilds the original problem with the candidate's algo (the GPU side pins it)."""
    from cublaslt_probe.gpu.replay import problem_from_record
    from cublaslt_probe.logs import parse_line
    out = tmp_path / "pins.log"
    r = run_cli(PROGRAMS / "gpt2_train", "--from", MEASURE / "gpt2_train.json", "--replay-out", out, "-f", "jsonl")
    assert r.exit_code == 0, r.output
    lines = out.read_text().splitlines()
    m = _measure("gpt2_train")
    (g,) = [g for g in m["gemms"] if (g["key"]["m"], g["key"]["n"], g["key"]["k"]) == (4096, 768, 50257)]
    best = min((c for c in g["candidates"] if c["ok_numerics"]), key=lambda c: c["time_us"])
    recs = [parse_line(x, i) for i, x in enumerate(lines, 1)]
    (rec,) = [x for x in recs if (x.torch_m, x.torch_n, x.torch_k) == (4096, 768, 50257)]
    pinned = problem_from_record(rec)
    assert pinned["algo_id"] == best["algo_id"]
    assert (pinned["config"]["tile"], pinned["config"]["split_k"]) == (best["tile"], best["split_k"])
    orig = problem_from_record(parse_line(g["original"]["log_line"], 1))
    same = ("dtype", "m", "n", "k", "trans_a", "trans_b", "lda", "ldb", "ldc", "batch")
    assert {k: pinned[k] for k in same} == {k: orig[k] for k in same}
    assert run_cli(PROGRAMS / "gpt2_train", "--replay-out", out).exit_code == 2      # needs measurements


ODD_WITH_ADVICE = """\
tests/fixtures/programs/odd_linear/trace.json.gz + tests/fixtures/programs/odd_linear/cublaslt.log; GPU NVIDIA H200 (132 SMs)
2 steps; per step: GPU time 0.767 ms, GEMMs 0.767 ms (100.0 %) in 2 distinct GEMMs
GPU time: 100.0 % library-selected cuBLAS GEMMs
attribution: capture ranges; 100.0 % of GEMM time has a module; torch allow_tf32=True

share  calls  gpu_us  module  pass  op        dtype  layout     m     n     k  groups  family   provenance        decoded                       algo                                  pct_peak  floor_ratio  waves  flags
-----  -----  ------  ------  ----  --------  -----  ------  ----  ----  ----  ------  -------  ----------------  ----------------------------  ------------------------------------  --------  -----------  -----  --------------
88.5%      1   679.3  odd     fwd   aten::mm  bf16   NT      2048  4095  4096          cutlass  library-selected  256x128                       algo 24 tile 256x128 stages UNDEFIN…      10.2         9.78   1.94  align-fallback
11.5%      1    87.9  even    fwd   aten::mm  bf16   NT      2048  4096  4096          nvjet    library-selected  256x128 · 64x4 · 1x2 · coopA  algo 66 tile 256x128 stages 64xAUTO…      79.0         1.27   1.94

advice (measured):
1. pad 4095 → 4096 (a multiple of 8) in odd: saves 585.2 µs/step (76.3 % of the step)
   evidence: aten::mm bf16 NT 2048×4095×4096: original 673.5 µs, n=4096 88.2 µs (nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT); × 1 calls/step
   risk: numerics agree (max rel. error 0.003 ≤ 0.02); n grows by 1 (more work and memory; slice the result back)
- aten::mm bf16 NT 2048×4096×4096 (even): at 1.27× its floor (79 % of the roofline); no measured alternative beats it by 3 %; no advice
"""  # noqa: E501  the command's exact output


def test_cli_table_and_advice_exact(monkeypatch):
    """The 4095-wide linear next to its 4096-wide twin: the fallback kernel at 10 % of peak, and the padding that
    the saved measurement says saves 585 µs per step."""
    monkeypatch.chdir(FIXTURES.parent.parent)
    r = run_cli("tests/fixtures/programs/odd_linear", "--from", "tests/fixtures/programs/measure/odd_linear.json")
    assert r.exit_code == 0 and r.stderr == ""
    assert r.stdout == ODD_WITH_ADVICE


def test_html_chain_per_gemm(audits):
    """The page's per-GEMM chain: shapes from the op, the logged algo agreeing with the kernel, the roofline,
    the alignment fallback and the measured regret, for the GPT-2 vocabulary GEMM."""
    from cublaslt_probe.analysis.audit import advice
    from cublaslt_probe.analysis.audit.measured import checked
    from cublaslt_probe.render.audit import chain
    a, m = audits["gpt2_train"], checked(_measure("gpt2_train"))
    r = a.rows.to_dict("records")[0]
    (g,) = [g for g in m.gemms if (g.key["m"], g.key["n"], g.key["k"]) == (r["m"], r["n"], r["k"])]
    lines = chain(r, g, labels=a.kernel_labels)
    assert "m=50257 n=768 k=4096" in lines[0] and "the kernel agrees" in lines[1]
    assert any(x.startswith("alignment fallback: A ld=50257") for x in lines)
    assert lines[-1].startswith(f"measured: original {g.original_us:,.1f} µs")
    page = render_html(a, advice(a.rows, m, a.step_gpu_us), m)
    assert page.count("<details") == min(12, len(a.rows)) and "heuristic regret" in page


def test_cli_option_and_input_errors_are_one_line(tmp_path):
    r = run_cli(PROGRAMS / "sdpa_flash")                         # attention only: no GEMM in its steps
    assert r.exit_code == 0 and r.stdout.splitlines()[-1] == "no GEMM kernels in the steps of this trace"
    r = run_cli(PROGRAMS / "odd_linear", "--save", tmp_path / "m.json")
    assert r.exit_code == 2 and "--save writes what --measure measured: add --measure" in r.output
    r = run_cli(PROGRAMS / "odd_linear", "--from", tmp_path / "absent.json")
    assert r.exit_code == 1 and "cannot read measurements" in r.stderr and "absent.json" in r.stderr
    text = tmp_path / "m.txt"
    text.write_text("GEMM times: 12 µs\n")
    r = run_cli(PROGRAMS / "odd_linear", "--from", text)
    assert r.exit_code == 1 and "not a JSON measurement file" in r.stderr and "audit --measure --save" in r.stderr
    for res in (r,):
        assert "Traceback" not in res.output


def test_cli_jsonl_keeps_its_notes_on_stderr(tmp_path):
    m = _measure("gpt2_train")
    m["gemms"][0]["key"]["k"] = 4097          # a GEMM this run does not have: named in a note
    other = tmp_path / "other.json"
    other.write_text(json.dumps(m))
    r = run_cli(PROGRAMS / "gpt2_train", "--from", other, "--format", "jsonl", "--top", "2")
    assert r.exit_code == 0
    assert len(r.stdout.splitlines()) == 2 and all(json.loads(x)["module"] for x in r.stdout.splitlines())
    assert "note: " in r.stderr and "1 of its 6 measured GEMMs are not in this run" in r.stderr
