"""`audit.advice` on the saved H200 measurements of tests/fixtures/programs/measure (PROVENANCE there) and on
copies of them changed the way other programs' measurements differ (a GEMM faster or slower on one path or
padding). The expected savings are summed from the measurement file itself, never by the code under test.
"""
from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner
from conftest import FIXTURES

from cublaslt_probe.analysis.audit import ADVICE_KEYS, advice, audit
from cublaslt_probe.cli import main
from cublaslt_probe.render.audit import advice_lines, figures

PROGRAMS = FIXTURES / "programs"
MEASURE = PROGRAMS / "measure"
NAMES = sorted(p.stem for p in MEASURE.glob("*.json"))


@pytest.fixture(scope="module")
def audits():
    return {n: audit(PROGRAMS / n) for n in NAMES}


def _measure(name):
    return json.loads((MEASURE / f"{name}.json").read_text())


def _gemm(m, module, **key):
    (g,) = [g for g in m["gemms"] if g.get("module") == module
            and all(g["key"][k] == v for k, v in key.items())]
    return g


def _path(g, path):
    (p,) = [p for p in g["paths"] if p["path"] == path]
    return p


def _net(m, path):
    """The switch to `path` over every measured GEMM that took another path: (original - path) × calls, with
    its sign, and how many got faster / slower."""
    d = [(g["original_us"] - _path(g, path)["time_us"]) * g["calls"] for g in m["gemms"]
         if g.get("original_us") and not g["case"].startswith(path + "|")]
    return sum(d), sum(x > 0 for x in d), sum(x <= 0 for x in d)


def _pad(m, module, old, value):
    """Padding `old` → `value` in `module`: (original - padded) × calls over its GEMMs, with the sign."""
    total = 0.0
    for g in m["gemms"]:
        if g.get("module") == module:
            for w in g.get("whatifs") or []:
                if w["value"] == value and g["key"][w["dim"]] == old:
                    total += (g["original_us"] - w["time_us"]) * g["calls"]
    return total


def _lines(a, items):
    return "\n".join(advice_lines(items))


# ------------------------------------------------------------------------------------------ global switches
def test_a_switch_whose_gemms_net_nothing_is_not_advised(audits):
    """Llama decode: with a 32 MiB workspace down_proj runs 6 % faster, but the five other measured GEMMs it
    moves run slower: together the switch saves nothing, so there is no item, and a quiet line says why."""
    a, m = audits["llama_decode"], _measure("llama_decode")
    items = advice(a.rows, m, a.step_gpu_us)
    assert not [it for it in items if it["kind"] in ("path", "workspace")]
    net, faster, slower = _net(m, "lt")
    assert net < 0 and (faster, slower) == (1, 5)
    (q,) = [it for it in items if it["what"].startswith("run on cuBLASLt with a 32 MiB workspace")]
    assert q["saving_us"] == 0 and q["kind"] == "no_gain"
    assert f"(1 faster, 5 slower): {-net:,.1f} µs/step slower" in q["what"]
    # the GEMMs it moves that were not measured, named: k_proj and v_proj (typed cuBLAS wrapper in the log),
    # and the rotary bmm that has no log line
    assert "3 GEMMs it moves were not measured" in q["what"]
    for name in ("self_attn.k_proj", "self_attn.v_proj", "model.rotary_emb fwd aten::bmm 64×1×1 (path unknown)"):
        assert name in q["what"]
    (down,) = [it for it in items if "(model.layers.*.mlp.down_proj)" in it["what"]]
    assert "faster alone (lt 31.2 µs), but that change does not pay over every GEMM it moves" in down["what"]


def test_a_switch_that_pays_nets_the_slower_gemms_and_names_the_unmeasured(audits):
    """The same decode measurement with down_proj much faster on the 32 MiB workspace (as another program's
    GEMM may be): the saving is the net over all six measured GEMMs (down_proj's two calls a step counted
    twice), less than the faster one alone, and the three unmeasured GEMMs are named in evidence and risk."""
    a, m = audits["llama_decode"], _measure("llama_decode")
    _path(_gemm(m, "model.layers.*.mlp.down_proj"), "lt")["time_us"] = 20.0
    (ws,) = [it for it in advice(a.rows, m, a.step_gpu_us) if it["kind"] == "workspace"]
    net, faster, slower = _net(m, "lt")
    down = _gemm(m, "model.layers.*.mlp.down_proj")
    alone = (down["original_us"] - 20.0) * 2
    assert ws["saving_us"] == pytest.approx(net) and 0 < net < alone
    assert ws["what"].startswith("run on cuBLASLt with a 32 MiB workspace") and "workspace 32 MiB" in ws["risk"]
    assert f"({faster} faster, {slower} slower): {net:,.1f} µs/step" in ws["evidence"]
    assert "(model.layers.*.mlp.gate_proj): original 30.3 µs, lt 31.9 µs" in ws["evidence"]
    gate = _gemm(m, "model.layers.*.mlp.gate_proj")
    lost = (_path(gate, "lt")["time_us"] - gate["original_us"]) * 2
    assert f"× 2 calls/step, {lost:,.1f} µs/step slower" in ws["evidence"]
    assert "3 GEMMs it moves were not measured" in ws["evidence"]
    assert "model.layers.*.self_attn.v_proj" in ws["evidence"]
    assert "3 GEMMs it moves" in ws["risk"] and "their time after the change is unknown" in ws["risk"]
    assert len(ws["gemms"]) == 6


def test_a_path_switch_moves_only_the_gemms_on_the_other_path(audits):
    """GPT-2: the backward GEMMs ran on the cuBLAS path (cublasLtSSSMatmul), the forward addmm on torch's
    cuBLASLt path already. With the c_proj grad-input GEMM made fast on the cuBLASLt path, the switch nets the
    six measured cuBLAS-path GEMMs (c_fc's is 29 µs slower a call, ×12) and names the cuBLAS-path GEMMs not
    measured — never a forward addmm, which the switch does not move."""
    a, m = audits["gpt2_train"], _measure("gpt2_train")
    _path(_gemm(m, "transformer.h.*.mlp.c_proj", layout="TN"), "torch-lt")["time_us"] = 20.0
    items = advice(a.rows, m, a.step_gpu_us)
    (sw,) = [it for it in items if it["kind"] == "path"]
    net, faster, slower = _net(m, "torch-lt")
    assert sw["saving_us"] == pytest.approx(net) and sw["what"].startswith("run on torch's cuBLASLt path")
    rows = a.rows.to_dict("records")
    measured = {(g["module"], g["pass"], g["key"]["m"], g["key"]["n"], g["key"]["k"]) for g in m["gemms"]}
    unmeasured = [r for r in rows if r["log_function"] != "cublasLtMatmul"
                  and (r["module"], r["pass"], r["m"], r["n"], r["k"]) not in measured]
    assert len(unmeasured) == 5
    assert f"{len(unmeasured)} GEMMs it moves were not measured" in sw["evidence"]
    assert "aten::addmm" not in sw["evidence"]
    # it moves the lm_head GEMMs the padding changes: the two are alternatives
    (pad,) = [it for it in items if it["kind"] == "pad"]
    n_pad, n_sw = items.index(pad) + 1, items.index(sw) + 1
    assert n_sw in pad["excludes"] and n_pad in sw["excludes"]


# ------------------------------------------------------------------------------------------ paddings
def test_the_smallest_padding_within_noise_of_the_best_is_advised(audits):
    """GPT-2's vocabulary: 50272 saves the most, 50264 is within 3 % of it and pads less: 50264 is advised,
    50272 and 50304 are listed with their own savings."""
    a, m = audits["gpt2_train"], _measure("gpt2_train")
    (pad,) = [it for it in advice(a.rows, m, a.step_gpu_us) if it["kind"] == "pad"]
    s = {v: _pad(m, "lm_head", 50257, v) for v in (50264, 50272, 50304)}
    assert max(s, key=s.get) == 50272 and s[50264] >= 0.97 * s[50272]
    assert pad["what"] == "pad the vocabulary 50257 → 50264 (a multiple of 8) in lm_head"
    assert pad["saving_us"] == pytest.approx(s[50264])
    assert (f"also measured: 50272 saves {s[50272]:,.1f} µs/step, 50304 saves {s[50304]:,.1f} µs/step"
            in pad["evidence"])


def test_a_padding_beyond_noise_of_the_best_is_not_advised_and_slower_gemms_subtract(audits):
    """The same measurement with 50264 only half as good on the forward GEMM, and the grad-weight GEMM slower
    than the original at 50304: 50272 is now the only one near the best, and 50304's listed saving nets the
    slower GEMM."""
    a, m = audits["gpt2_train"], _measure("gpt2_train")
    for g in m["gemms"]:
        for w in g.get("whatifs") or []:
            if g["module"] == "lm_head" and w["value"] == 50264 and w["dim"] == "n":
                w["time_us"] = (w["time_us"] + g["original_us"]) / 2
            if g["module"] == "lm_head" and w["value"] == 50304 and w["dim"] == "k":
                w["time_us"] = g["original_us"] + 500.0
    (pad,) = [it for it in advice(a.rows, m, a.step_gpu_us) if it["kind"] == "pad"]
    s = {v: _pad(m, "lm_head", 50257, v) for v in (50264, 50272, 50304)}
    assert s[50264] < 0.97 * s[50272]
    assert pad["what"].startswith("pad the vocabulary 50257 → 50272 (a multiple of 16)")
    assert pad["saving_us"] == pytest.approx(s[50272])
    assert f"50304 saves {s[50304]:,.1f} µs/step" in pad["evidence"]
    assert "k=50304" not in pad["evidence"]


def test_a_padding_names_the_gemms_of_its_module_it_changes_unmeasured(audits):
    """GPT-2's lm_head with its grad-weight GEMM (k = 50257) measured without what-ifs: the padding still
    changes it, so the item counts it out of the saving and names it in evidence and risk."""
    a, m = audits["gpt2_train"], _measure("gpt2_train")
    _gemm(m, "lm_head", layout="NN")["whatifs"] = []
    (pad,) = [it for it in advice(a.rows, m, a.step_gpu_us) if it["kind"] == "pad"]
    assert pad["what"].startswith("pad the vocabulary 50257 → 50264")
    assert pad["saving_us"] == pytest.approx(_pad(m, "lm_head", 50257, 50264))
    assert len(pad["gemms"]) == 2
    assert "1 GEMM it pads at 50264 was not measured" in pad["evidence"]
    assert "lm_head bwd aten::mm 4096×768×50257" in pad["evidence"]
    assert "1 GEMM it pads at 50264" in pad["risk"]


def test_a_padding_that_slows_the_other_gemms_of_its_module_is_not_advised(audits):
    """GPT-2's lm_head with only its grad-input GEMM faster when padded and the two others 2 ms slower: the
    padding changes all three, so it nets a loss at every value and is not advised; a quiet line says so."""
    a, m = audits["gpt2_train"], _measure("gpt2_train")
    for g in m["gemms"]:
        for w in g.get("whatifs") or []:
            if g["module"] == "lm_head" and w["dim"] != "m":
                w["time_us"] = g["original_us"] + 2000.0
    items = advice(a.rows, m, a.step_gpu_us)
    assert not [it for it in items if it["kind"] == "pad"]
    net = _pad(m, "lm_head", 50257, 50264)
    assert net < 0
    (q,) = [it for it in items if it["what"].startswith("pad 50257 → 50264 in lm_head")]
    assert q["what"] == (f"pad 50257 → 50264 in lm_head: no net saving over the 3 measured GEMMs with 50257 "
                         f"({-net:,.1f} µs/step slower); no advice")
    # the two pins left change different GEMMs: they add up
    pins = [it for it in items if it["saving_us"] > 0]
    assert [it["kind"] for it in pins] == ["pin", "pin"] and all(it["excludes"] == [] for it in pins)
    total = sum(it["saving_us"] for it in pins)
    assert f"items 1 and 2 exclude no other: together they save {total:,.1f} µs/step" in _lines(a, items)


# ------------------------------------------------------------------------------------------ exclusion
def test_items_that_change_one_gemm_say_they_exclude_each_other(audits):
    """GPT-2: the padding of lm_head and the two pinned algos for its unpadded GEMMs change the same GEMMs:
    the padding excludes them, each pin is an alternative to it, and no total adds them up."""
    a, m = audits["gpt2_train"], _measure("gpt2_train")
    items = advice(a.rows, m, a.step_gpu_us)
    assert all(list(it) == list(ADVICE_KEYS) for it in items)
    pad, pin1, pin2 = items[:3]
    assert (pad["kind"], pin1["kind"], pin2["kind"]) == ("pad", "pin", "pin")
    assert (pad["excludes"], pin1["excludes"], pin2["excludes"]) == ([2, 3], [1], [1])
    text = _lines(a, items).splitlines()
    assert text[0].endswith(" — excludes items 2 and 3")
    assert [x for x in text if x.startswith("2. pin candidate #1")][0].endswith(" — alternative to item 1")
    assert not [x for x in text if "together" in x]


def test_items_on_different_gemms_add_up(audits):
    """The 4095-wide linear with its 4096-wide twin given a faster candidate: the padding of one and the pin
    of the other change different GEMMs, so they exclude nothing and the total is their sum."""
    a, m = audits["odd_linear"], _measure("odd_linear")
    g = _gemm(m, "even")
    (c1,) = [c for c in g["candidates"] if c["rank"] == 1]
    c1["time_us"] = 70.0
    items = advice(a.rows, m, a.step_gpu_us)
    pad, pin = items[:2]
    assert (pad["kind"], pin["kind"]) == ("pad", "pin") and pad["excludes"] == pin["excludes"] == []
    assert pin["saving_us"] == pytest.approx(g["original_us"] - 70.0)
    total = pad["saving_us"] + pin["saving_us"]
    assert f"items 1 and 2 exclude no other: together they save {total:,.1f} µs/step" in _lines(a, items)


# ------------------------------------------------------------------------------------------ output
@pytest.mark.parametrize("name", NAMES)
def test_advice_text_has_no_nan_or_negative_number(name, tmp_path):
    r = CliRunner().invoke(main, ["audit", str(PROGRAMS / name), "--from", str(MEASURE / f"{name}.json"),
                                  "--html", str(tmp_path / "a.html")])
    assert r.exit_code == 0, r.output
    adv = r.stdout[r.stdout.index("advice (measured):"):]
    assert "nan" not in adv.lower()
    assert not re.search(r"(?<![\w×.])-\d", adv), adv


@pytest.mark.parametrize("name", ["gpt2_train", "odd_linear", "llama_decode"])
def test_whatif_plot_ticks_are_integers_that_do_not_touch(name, audits):
    """The what-if curves are drawn against the elements added: short integer ticks, well apart, whatever
    the padded value (GPT-2's 50257 → 50304 wrote 5-digit labels almost touching; 4095 → 4096 wrote 4095.2)."""
    from cublaslt_probe.analysis.audit.measured import checked
    fig = figures(audits[name], checked(_measure(name)))["whatifs"]
    fig.set_dpi(100)
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    for ax in fig.axes:
        box = ax.get_window_extent(r)
        labels = [(t.get_text(), t.get_window_extent(r)) for t in ax.get_xticklabels()
                  if t.get_text() and box.x0 - 1 <= (t.get_window_extent(r).x0 + t.get_window_extent(r).x1) / 2
                  <= box.x1 + 1]
        assert len(labels) >= 2
        assert all(re.fullmatch(r"−?\d+", s) for s, _ in labels), [s for s, _ in labels]
        height = labels[0][1].height
        assert all(b.x0 - a.x1 >= 2 * height for (_, a), (_, b) in zip(labels, labels[1:]))
