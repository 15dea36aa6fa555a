"""Grouped GEMM rows in `audit`: the run folder's recorded group sizes joined to them (or equal sizes assumed),
the grouped roofline, and the advice `--from` renders from the H200's saved measurements of the two MoE
captures (tests/fixtures/moe/measure, PROVENANCE there). Expected values come from the recording and the
measurement files themselves, never from the code under test; changed copies are made in tmp_path.
"""
from __future__ import annotations

import json
import re
import shutil

import pytest
from click.testing import CliRunner
from conftest import FIXTURES

from cublaslt_probe import runfiles
from cublaslt_probe.analysis.audit import advice, audit, gpu_rates
from cublaslt_probe.cases import sizes_summary
from cublaslt_probe.cli import main
from cublaslt_probe.render.audit import advice_lines, table_rows
from cublaslt_probe.runfiles import read_group_sizes

MOE = FIXTURES / "moe"
EXPERTS = "model.layers.*.mlp.experts"


def _grouped(a):
    return a.rows[a.rows["groups"].notna()]


def _measure(name):
    return json.loads((MOE / "measure" / f"{name}.json").read_text())


@pytest.mark.parametrize("name, rows", [("qwen3_moe", 2), ("mixtral_train", 6)])
def test_recorded_sizes_join_every_grouped_row(name, rows):
    """Forward rows by their operands' dims, backward rows (the data gradient splitting m, the weight gradient
    splitting k) through the forward rows of their module: all carry the recorded split and its summary."""
    recs = read_group_sizes(MOE / name)
    sizes = recs[0]["sizes"]
    assert all(r["sizes"] == sizes for r in recs)      # one routing in these steps
    g = _grouped(audit(MOE / name))
    assert len(g) == rows and set(g["pass"]) == ({"fwd"} if rows == 2 else {"fwd", "bwd"})
    want = sizes_summary(sizes)
    for r in g.to_dict("records"):
        assert r["sizes_source"] == "recorded" and json.loads(r["group_sizes"]) == sizes, r["pass"]
        assert (r["group_min"], r["group_max"], r["group_mean"], r["group_empty"], r["group_unaligned"],
                r["group_imbalance"], r["group_routings"]) == (want["min"], want["max"], want["mean"], want["empty"],
                                                               want["unaligned"], want["imbalance"], 1)
    if name == "mixtral_train":
        assert set(g["group_dim"]) == {"m", "k"}


def test_the_grouped_floor_reads_each_live_experts_weights_once(tmp_path):
    """Qwen3's gate+up GEMM is memory-bound once its 128 experts' weights count: its floor is the bytes of the
    real rows, every expert's weights and the output over HBM; an expert left without rows (its rows moved to
    another in a changed recording) takes its weights out of the floor."""
    a = audit(MOE / "qwen3_moe")
    r = _grouped(a).iloc[0]
    _, bw, _ = gpu_rates(a.gpu)
    m, n, k = 16384, 1536, 2048
    assert (int(r["m"]), int(r["n"]), int(r["k"])) == (m, n, k)
    assert r["floor_us"] == pytest.approx((m * k + 128 * k * n + m * n) * 2 / (bw * 1e12) * 1e6)
    assert r["bound"] == "memory" and r["floor_ratio"] == pytest.approx(r["mean_us"] / r["floor_us"])
    assert r["group_waves"] == pytest.approx(sum(-(-s // int(r["tile_m"])) for s in json.loads(r["group_sizes"]))
                                             * -(-n // int(r["tile_n"])) / 132)
    run = tmp_path / "run"
    shutil.copytree(MOE / "qwen3_moe", run)
    recs = read_group_sizes(run)
    for x in recs:
        x["sizes"][1] += x["sizes"][0]
        x["sizes"][0] = 0
    (run / runfiles.GROUP_SIZES_FILE).write_text("".join(json.dumps(x) + "\n" for x in recs))
    r2 = _grouped(audit(run)).iloc[0]
    assert r2["group_empty"] == 1 and r2["group_max"] == max(recs[0]["sizes"])
    assert r["floor_us"] - r2["floor_us"] == pytest.approx(k * n * 2 / (bw * 1e12) * 1e6)


def test_calls_that_split_differently_keep_the_median_routing(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(MOE / "qwen3_moe", run)
    recs = read_group_sizes(run)
    for x in recs:
        if x["step"] == 1:     # the second step's router sends 40 more rows to expert 0, 40 fewer to expert 1
            x["sizes"][0] += 40
            x["sizes"][1] -= 40
    (run / runfiles.GROUP_SIZES_FILE).write_text("".join(json.dumps(x) + "\n" for x in recs))
    g = _grouped(audit(run))
    assert list(g["group_routings"]) == [2, 2]
    calm = min((x["sizes"] for x in recs), key=lambda s: sizes_summary(s)["imbalance"])
    assert all(json.loads(s) == calm for s in g["group_sizes"])


@pytest.mark.parametrize("how, why", [("bare", "a bare trace"), ("no file", "no group_sizes.jsonl"),
                                      ("not recorded", "captured without recording them")])
def test_without_a_recording_sizes_are_assumed_equal_and_say_so(tmp_path, how, why):
    run = tmp_path / "run"
    shutil.copytree(MOE / "qwen3_moe", run)
    (run / runfiles.GROUP_SIZES_FILE).unlink()
    if how == "not recorded":
        env = json.loads((run / runfiles.ENV_FILE).read_text())
        env["capture"]["group_sizes_calls"] = None
        (run / runfiles.ENV_FILE).write_text(json.dumps(env))
    a = audit(run / runfiles.TRACE_FILE if how == "bare" else run)
    g = _grouped(a)
    assert set(g["sizes_source"]) == {"assumed"}
    assert all(json.loads(s) == [128] * 128 for s in g["group_sizes"])
    assert any(why in n and "equal sizes assumed" in n for n in a.notes), a.notes
    flags = [row[-1] for row, r in zip(table_rows(a.rows), a.rows.to_dict("records")) if not pd_na(r["groups"])]
    assert flags == ["sizes-assumed"] * 2


def pd_na(v):
    import pandas as pd
    return pd.isna(v)


def test_a_damaged_recording_line_is_skipped_and_named(tmp_path):
    """One cut line of group_sizes.jsonl costs only itself: the audit runs, the other records still give the
    rows their sizes, and a note names the file and line."""
    run = tmp_path / "run"
    shutil.copytree(MOE / "qwen3_moe", run)
    lines = (run / runfiles.GROUP_SIZES_FILE).read_text().splitlines()
    (run / runfiles.GROUP_SIZES_FILE).write_text("\n".join([lines[0], lines[1][:30]] + lines[2:]) + "\n")
    r = CliRunner().invoke(main, ["audit", str(run)])
    assert r.exit_code == 0 and "group_sizes.jsonl:2: 1 line(s) skipped, not a group sizes record" in r.output
    assert "Traceback" not in r.output
    assert set(_grouped(audit(run))["sizes_source"]) == set(_grouped(audit(MOE / "qwen3_moe"))["sizes_source"])


def test_measure_rebuilds_the_grouped_gemms_it_can():
    """The forward and data-gradient rows become probe Cases with the recorded sizes along m, the weight
    gradient's (offsets along k) a split-k Case with the same sizes along k; an unrecorded row gets equal sizes."""
    from cublaslt_probe.analysis.audit.plan import grouped_case_of
    from cublaslt_probe.cases import grouped_alternatives
    from cublaslt_probe.cli._common import clean
    sizes = read_group_sizes(MOE / "mixtral_train")[0]["sizes"]
    rows = [{k: clean(v) for k, v in r.items()} for r in _grouped(audit(MOE / "mixtral_train")).to_dict("records")]
    for r in rows:
        c, why = grouped_case_of(r)
        assert why is None
        if r["group_dim"] == "k":
            assert c.split_k and c.layout == "TN" and c.group_sizes() == sizes and c.k == r["k"] == sum(sizes)
            assert grouped_alternatives(c)["pad8"].group_sizes() == [-(-x // 8) * 8 for x in sizes]
        else:
            assert c.group_sizes() == sizes and (c.m, c.n, c.k) == (r["m"], r["n"], r["k"]) and c.layout == r["layout"]
    c, _ = grouped_case_of({**rows[1], "group_sizes": None})
    assert c.group_sizes() == [512] * 8


def _items(name):
    a = audit(MOE / name)
    return a, advice(a.rows, _measure(name), a.step_gpu_us)


def _saving(meas, variant):
    """µs/step the variant saves over the measured grouped GEMMs that have it, from the file alone."""
    out = 0.0
    for g in meas["gemms"]:
        for v in g.get("grouped") or []:
            if v["variant"] == variant and v["time_us"]:
                out += (g["original_us"] - v["time_us"]) * g["calls"]
    return out


def _whole_saving(meas, variant):
    """µs/step the variant saves in the experts' whole call (`measure_experts`), from the file alone."""
    ex = meas["experts"][0]
    t = {v["variant"]: v["time_us"] for v in ex["variants"]}
    return (t["original"] - t[variant]) * ex["calls"]


def test_qwen3_advice_rests_on_the_experts_whole_call_not_their_gemms():
    """Padding, one bmm and fp8 make Qwen3's grouped GEMMs faster, but the experts' whole forward (gathers,
    padding, the bmm's host synchronisation, fp8's quantization) slower: each gets a quiet line saying both,
    not advice; the router item's saving is the whole call's, and says what was and was not measured."""
    a, items = _items("qwen3_moe")
    meas = _measure("qwen3_moe")
    grouped = [it for it in items if it["kind"] == "grouped"]
    assert [it["what"] for it in grouped] == [
        f"balance the router's load over the 128 experts in {EXPERTS} (advice for the router, not the GEMM)"]
    router = grouped[0]
    assert router["saving_us"] == pytest.approx(_whole_saving(meas, "balanced")) and router["saving_us"] > 0
    assert router["saving_us"] < _saving(meas, "balanced")          # the call saves less than its GEMMs
    assert "whole forward" in router["evidence"] and "its grouped GEMMs alone: +157.6 µs/step" in router["evidence"]
    assert "not measured: the rest of the step" in router["risk"]
    quiet = {it["what"].split(":")[0]: it["what"] for it in items if it["kind"] == "no_gain"}
    for name, what in (("pad8", "pad each expert's token count to a multiple of 8"),
                       ("bmm_padded", "run the experts"), ("fp8", "run the expert GEMMs")):
        how = {"bmm_padded": " as one torch.bmm, every expert padded to the largest group",
               "fp8": " in fp8 (torch._scaled_grouped_mm, row-wise scales)"}
        line = quiet[f"{what} in {EXPERTS}" + ("" if name.startswith("pad") else how[name])]
        assert _saving(meas, name) > 0 > _whole_saving(meas, name)
        assert (f"its grouped GEMMs save {_saving(meas, name):,.1f} µs/step, but the experts' whole forward is "
                f"{-_whole_saving(meas, name):,.1f} µs/step slower") in line


@pytest.mark.parametrize("name", ["qwen3_moe", "mixtral_train"])
def test_without_the_whole_call_a_restructuring_variant_is_an_estimate_never_ranked(name):
    """A measurement without the experts' whole call (`audit --measure` before it existed; a module whose
    gate+up and down were not both measured): padding the groups, one bmm, fp8 and another experts
    implementation change the layer, not only its GEMMs, so their GEMMs' saving is an estimate, listed apart
    with what would have to be measured, never a ranked item (issue 49: the one-bmm item, ranked first on its
    GEMMs' 1,208 µs/step, made the program's step 8,567 µs slower); balancing the router keeps the layer's ops
    and ranks on its GEMMs' saving."""
    a = audit(MOE / name)
    meas = {k: v for k, v in _measure(name).items() if k != "experts"}
    items = advice(a.rows, meas, a.step_gpu_us)
    ranked = [it for it in items if it["saving_us"] > 0 and not it["estimate"]]
    est = [it for it in items if it["estimate"]]
    restructuring = [v for v in ("fp8", "bmm_padded", "pad8", "pad16", "pad128", "mm_per_group")
                     if _saving(meas, v) > 0]
    assert restructuring and est and all(it["saving_us"] > 0 for it in est)
    assert all("router" in it["what"] for it in ranked if it["kind"] == "grouped")
    if _saving(meas, "balanced") > 0:
        router = next(it for it in ranked if "router" in it["what"])
        assert router["saving_us"] == pytest.approx(_saving(meas, "balanced"))
    assert not (ranked and ranked[0]["estimate"]) and items.index(est[0]) >= len(ranked)
    best = max(restructuring, key=lambda v: _saving(meas, v))
    assert est[0]["saving_us"] == pytest.approx(_saving(meas, best))
    assert all("the layer's whole call" in it["estimate"] for it in est)
    text = "\n".join(advice_lines(items))
    assert "estimates (not ranked" in text and "to rank it, measure the layer's whole call" in text
    for line in (x for x in text.splitlines() if re.match(r"\d+\. ", x)):
        assert "router" in line or "pin" in line or "pad the vocabulary" in line or "run on" in line, line


def test_mixtral_advice_balances_the_router_over_forward_and_backward():
    """The training step's experts are timed forward and backward; balancing the router is the one item, its
    saving the whole call's; eager and fp8 (weights quantized every call, as training must) are quiet lines;
    the weight gradients' grouped rows (offsets along k) are measured, none left as not measured."""
    a, items = _items("mixtral_train")
    meas = _measure("mixtral_train")
    grouped = [it for it in items if it["kind"] == "grouped"]
    assert len(grouped) == 1 and "router" in grouped[0]["what"]
    assert grouped[0]["saving_us"] == pytest.approx(_whole_saving(meas, "balanced"))
    assert "whole forward and backward" in grouped[0]["evidence"]
    assert not any(it["what"].startswith("pad each expert") for it in grouped)
    quiet = [it["what"] for it in items if it["kind"] == "no_gain"]
    assert any("\"eager\"): its grouped GEMMs save" in q and "whole forward and backward is 24,295.3 µs/step "
               "slower" in q for q in quiet)
    assert any(q.startswith(f"run the expert GEMMs in {EXPERTS} in fp8") and "slower" in q for q in quiet)
    assert sum(it["kind"] == "not_measured" for it in items) == 0
    k_rows = [g for g in meas["gemms"] if g.get("group_dim") == "k"]
    assert len(k_rows) == 2 and all(g["case"].split("|")[-1].startswith("k:sizes=") for g in k_rows)


def test_advice_says_assumed_when_the_measured_sizes_were(tmp_path):
    meas = _measure("qwen3_moe")
    for g in meas["gemms"]:
        if g.get("grouped"):
            g["sizes_source"] = "assumed"
    a = audit(MOE / "qwen3_moe")
    grouped = [it for it in advice(a.rows, meas, a.step_gpu_us) if it["kind"] == "grouped"]
    assert grouped and all(it["what"].endswith("[group sizes assumed equal: none recorded]") for it in grouped)


@pytest.mark.parametrize("name", ["qwen3_moe", "mixtral_train"])
def test_from_renders_the_variants_table_and_the_advice(tmp_path, name):
    meas = _measure(name)
    html = tmp_path / "a.html"
    r = CliRunner().invoke(main, ["audit", str(MOE / name), "--from", str(MOE / "measure" / f"{name}.json"),
                                  "--html", str(html)])
    assert r.exit_code == 0, r.output
    out = r.output
    for g in meas["gemms"]:
        for v in g.get("grouped") or []:
            if v["time_us"]:
                assert f"{v['time_us']:,.1f}" in out
    assert "original (experts_implementation grouped_mm)" in out
    assert "mm_per_group (experts_implementation eager)" in out
    assert "batched_mm not run: it gathers each row's expert weights" in out
    assert not re.search(r"\bnan\b", out, re.I)
    page = html.read_text()
    assert "original (experts_implementation grouped_mm)" in page and "group sizes (recorded)" in page


@pytest.mark.parametrize("name", ["qwen3_moe", "mixtral_train"])
def test_the_page_names_cutlass_kernels_by_their_decoded_label_not_the_mangled_name(name):
    """The grouped GEMMs' CUTLASS kernels have mangled names of ~1,300 characters: the variants' table shows
    each timed variant's kernel decoded (tile · stages · cluster, from the measurement as read), and the
    evidence chain the row's label (`Audit.kernel_labels`, decoded once by `audit`), never the mangled name."""
    from cublaslt_probe.analysis.audit.measured import checked
    from cublaslt_probe.render.audit import chain, grouped_tables
    a = audit(MOE / name)
    tables = grouped_tables(checked(_measure(name)))
    assert tables
    for _title, body, _notes in tables:
        for row in body:
            if row[2] != "not run":
                assert row[-1] and "_ZN" not in row[-1] and " · " in row[-1], row
    r = _grouped(a).iloc[0].to_dict()
    (line,) = [x for x in chain(r, labels=a.kernel_labels) if x.startswith("kernel (")]
    assert r["kernel"].startswith("_ZN") and r["kernel"] not in line and a.kernel_labels[r["kernel"]] in line
    assert len(line) < 400


@pytest.mark.parametrize("name, want", [
    ("qwen3_moe", {"experts": 128, "hidden": 2048, "inter": 768, "rows": 16384, "top_k": 8, "tokens": 2048,
                   "train": False, "top_k_source": "router"}),
    ("mixtral_train", {"experts": 8, "hidden": 4096, "inter": 14336, "rows": 4096, "top_k": 2, "tokens": 2048,
                       "train": True, "top_k_source": "router"}),
])
def test_the_experts_module_is_rebuilt_from_its_grouped_rows(name, want):
    """The experts' whole call is rebuilt from the audit: gate+up and down paired, the recorded sizes, the
    routing's top-k from the router GEMM beside the module (model.layers.*.mlp.gate, n = experts)."""
    from cublaslt_probe.analysis.audit.plan import experts_problem
    from cublaslt_probe.cli._common import clean
    a = audit(MOE / name)
    rows = [{k: clean(v) for k, v in r.items()} for r in _grouped(a).to_dict("records")]
    prob, why = experts_problem(rows)
    assert why is None and {k: prob[k] for k in want} == want
    assert prob["sizes"] == read_group_sizes(MOE / name)[0]["sizes"] and prob["sizes_source"] == "recorded"
    from cublaslt_probe.analysis.grouped import top_k
    d = a.rows.to_dict("index")
    i = next(j for j, r in d.items() if r["pass"] == "fwd" and r["group_dim"] == "m")
    assert top_k(d, i, want["rows"]) == want["top_k"]
    assert top_k({j: r for j, r in d.items() if r["module"] != "model.layers.*.mlp.gate"}, i, want["rows"]) is None
    prob, _ = experts_problem([{**r, "group_top_k": None} for r in rows])
    assert prob["top_k"] == 1 and prob["tokens"] == want["rows"] and prob["top_k_source"].startswith("assumed")
    prob, why = experts_problem([r for r in rows if not (r["pass"] == "fwd" and r["n"] == want["hidden"])])
    assert prob is None and "--top-measure" in why
