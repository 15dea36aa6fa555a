"""CPU tests of proofs (`analysis.proof`): the rounds' statistics, the within-noise rule, the file's validation
the join that ranks proven items by their proven saving, and `audit --proof` on the proofs of four programs
proven on the H200."""
import json

import pytest
from conftest import FIXTURES

from cublaslt_probe.analysis import proof as P
from cublaslt_probe.errors import ProbeError


def test_the_proven_saving_is_the_median_of_the_rounds_differences_and_its_spread_their_quartiles():
    orig = [[1000.0, 1010.0], [1004.0, 1006.0], [990.0, 1000.0], [1200.0, 1000.0]]
    var = [[900.0, 910.0], [905.0, 905.0], [1000.0, 1000.0], [800.0, 820.0]]
    s = P.summarize(orig, var, noise_rounds=[3.0, -5.0, 1.0])
    # block medians: 1005, 1005, 995, 1100 against 905, 905, 1000, 810 -> savings 100, 100, -5, 290
    assert s["proven_us"] == pytest.approx(100.0)
    assert s["spread_us"] == pytest.approx([73.75, 147.5])
    assert s["original_step_us"] == pytest.approx(1005.0) and s["variant_step_us"] == pytest.approx(905.0)
    assert s["noise_us"] == pytest.approx(3.0) and s["rounds"] == 4
    with pytest.raises(ValueError):
        P.summarize([[1.0]], [])


@pytest.mark.parametrize("proven,spread,noise,want", [
    (100.0, [90.0, 110.0], 3.0, "saves"),
    (-100.0, [-110.0, -90.0], 3.0, "slower"),
    (2.0, [1.0, 3.0], 3.0, "within noise"),       # inside the noise floor
    (10.0, [-20.0, 40.0], 1.0, "within noise"),   # inside the spread's half-width (30)
    (10.0, [9.0, 11.0], None, "saves"),
])
def test_a_saving_inside_the_noise_floor_or_its_spread_is_within_noise(proven, spread, noise, want):
    assert P.verdict(proven, spread, noise) == want


def _proof(tmp_path, items, **top):
    p = tmp_path / "proof.json"
    P.write(p, {"items": items, **top})
    return p


GOOD = {"what": "pad the vocabulary 32001 → 32008 (a multiple of 8) in lm_head", "kind": "pad", "status": "proven",
        "predicted_us": 500.0, "proven_us": 480.0, "spread_us": [470.0, 490.0], "original_step_us": 20000.0,
        "variant_step_us": 19520.0, "noise_us": 12.0, "rounds": 5}


def test_a_proof_file_round_trips_and_bad_items_are_skipped_with_a_note_naming_them(tmp_path):
    bad = [{**GOOD, "proven_us": float("nan")}, {**GOOD, "spread_us": [5.0, 1.0]}, {**GOOD, "status": "maybe"},
           {**GOOD, "original_step_us": -1.0}, {**GOOD, "proven_us": 1e9}, "text", {**GOOD, "what": None}]
    p = tmp_path / "proof.json"
    # nan is not JSON: write the damaged file the way another writer would
    p.write_text(json.dumps({"schema": P.PROOF_SCHEMA, "version": 1, "items": [GOOD, *bad]}))
    d, notes = P.load(p)
    assert [it.raw for it in d.items] == [GOOD]
    assert len(notes) == len(bad) and all(n.startswith("proof.json: item ") for n in notes)
    assert "not a finite number" in notes[0] and "[low, high]" in notes[1] and "status" in notes[2]
    assert "larger than the steps" in notes[4]


def test_a_proof_is_written_with_its_schema_version_and_a_version_1_file_still_reads(tmp_path):
    """`write` puts ``schema_version`` (`PROOF_VERSION`) in the file, whatever version the dict carried; the
    committed proofs read as they are, and each written as version 1 files were (the version under ``version``)
    reads the same; a version past this tool's is refused."""
    p = _proof(tmp_path, [GOOD], version=1, fingerprint={"gemms": []})
    doc = json.loads(p.read_text())
    assert doc["schema_version"] == P.PROOF_VERSION and "version" not in doc
    d, notes = P.load(p)
    assert d.schema_version == P.PROOF_VERSION and d.fingerprint == {"gemms": []} and notes == []
    seen = set()
    for run in sorted((FIXTURES / "proofs").iterdir()):
        if (run / "proof.json").exists():
            new, notes = P.load(run / "proof.json")
            v1 = json.loads((run / "proof.json").read_text())
            seen.add(new.schema_version)
            assert new.schema_version == v1.get("schema_version", v1.get("version")) and new.items and notes == []
            v1["version"] = 1
            v1.pop("schema_version", None)
            (tmp_path / "v1.json").write_text(json.dumps(v1))
            old, notes = P.load(tmp_path / "v1.json")
            assert old.schema_version == 1 and old.items == new.items and notes == [], run
    assert seen == {1, P.PROOF_VERSION}          # both versions among the committed proofs
    p.write_text(json.dumps({**doc, "schema_version": P.PROOF_VERSION + 1}))
    with pytest.raises(ProbeError, match="upgrade"):
        P.load(p)


def test_a_file_that_is_not_a_proof_is_one_line_naming_it(tmp_path):
    for text in ("{", json.dumps({"gemms": []}), json.dumps({"schema": P.PROOF_SCHEMA, "version": 99, "items": []}),
                 json.dumps({"schema": P.PROOF_SCHEMA, "version": 1})):
        p = tmp_path / "x.json"
        p.write_text(text)
        with pytest.raises(ProbeError) as e:
            P.load(p)
        assert str(e.value).startswith(str(p)) and "\n" not in str(e.value)


def test_proven_items_rank_by_their_proven_saving_and_one_proven_slower_is_not_ranked():
    from cublaslt_probe.analysis.audit.advice import disproven, estimates, ranked
    items = [{"what": "a", "kind": "pad", "saving_us": 900.0, "excludes": [2]},
             {"what": "b", "kind": "path", "saving_us": 500.0, "excludes": [1]},
             {"what": "d", "kind": "pin", "saving_us": 50.0, "excludes": []},
             {"what": "c", "kind": "grouped", "saving_us": 1200.0, "estimate": "the experts' whole call"},
             {"what": "q", "kind": "no_gain", "saving_us": 0.0}]
    proof = {"items": [{**GOOD, "what": "a", "proven_us": -8000.0, "spread_us": [-8100.0, -7900.0]},
                       {**GOOD, "what": "b", "proven_us": 450.0, "spread_us": [440.0, 460.0]},
                       {"what": "d", "status": "unproven", "why": "no applier"}]}
    out = P.apply(items, P.Proof.from_checked(proof))
    assert [x["what"] for x in ranked(out)] == ["b", "d"]
    assert out[0]["proof"]["verdict"] == "saves" and out[0]["proof"]["ratio"] == pytest.approx(0.9)
    assert out[0]["excludes"] == [3]            # b excluded a, which moved from item 1 to item 3
    assert [x["what"] for x in disproven(out)] == ["a"] and "slower" in out[2]["disproven"]
    assert [x["what"] for x in out[2:]] == ["a", "c", "q"]      # the unranked in their order
    assert [x["what"] for x in estimates(out)] == ["c"]
    assert out[1]["proof"]["status"] == "unproven"
    assert P.apply(items, None) is items


# --- the proofs of four programs proven on the H200 (tests/fixtures/proofs, scripts/prove_programs.py) ----------

PROOFS = FIXTURES / "proofs"


def _audit(tmp_path, name, *extra, proof=None):
    from click.testing import CliRunner

    from cublaslt_probe.cli import main
    run = PROOFS / name
    args = ["audit", str(run), "--from", str(run / "measure.json"), "--proof", str(proof or run / "proof.json"),
            *extra]
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.mark.parametrize("name", ["llama_vocab32001", "gpt2_train", "titan_moe_train", "mixtral_train",
                                  "decode_reduce_overhead"])
def test_each_captured_proof_binds_to_its_run_and_another_runs_proof_is_refused(tmp_path, name):
    r = _audit(tmp_path, name)
    assert r.exit_code == 0, r.output
    assert "proof" not in " ".join(ln for ln in r.output.splitlines() if ln.startswith("note:")), r.output
    other = "mixtral_train" if name != "mixtral_train" else "llama_vocab32001"
    r = _audit(tmp_path, name, proof=PROOFS / other / "proof.json")
    assert r.exit_code == 2
    lines = [ln for ln in r.output.splitlines() if ln.startswith("Error:")]
    assert len(lines) == 1 and "is the proof of another run" in lines[0] and other in lines[0], r.output


def test_the_llama_proof_shows_predicted_against_proven_and_ranks_by_the_proof(tmp_path):
    r = _audit(tmp_path, "llama_vocab32001")
    text = r.output
    first = next(ln for ln in text.splitlines() if ln.startswith("1. "))
    assert first.startswith("1. pad the vocabulary 32001 → 32008") and "predicted: saves 4,995.4 µs/step" in first
    assert "proven 5,121.7 µs/step [5,067.2, 5,182.0]" in first
    assert "(106 % of the prediction less the applier's own copies, 152.6 µs/step measured)" in first
    second = next(ln for ln in text.splitlines() if ln.startswith("2. "))
    assert second.startswith("2. pin candidate #1") and "(99 % of the prediction)" in second


def test_a_padding_proven_with_its_sliced_logits_is_compared_with_the_prediction_less_the_slicing(tmp_path):
    """GPT-2's training step: the GEMMs save 4,652.7 µs/step; the applier keeps the loss's answer by slicing
    the [4096, 50264] fp32 logits back and padding their gradient (1,350.5 µs/step, timed by the proof), so the
    proof's 3,271.3 µs/step is 99 % of what the applied change was predicted to save, not 70 %."""
    first = next(ln for ln in _audit(tmp_path, "gpt2_train").output.splitlines() if ln.startswith("1. "))
    assert first.startswith("1. pad the vocabulary 50257 → 50264") and "predicted: saves 4,652.7 µs/step" in first
    assert "proven 3,271.3 µs/step [3,237.1, 3,307.1]" in first
    assert "(99 % of the prediction less the applier's own copies, 1,350.5 µs/step measured)" in first


def test_a_compiled_decodes_pins_that_do_not_pay_are_listed_apart_and_its_padding_holds(tmp_path):
    """The decode under torch.compile(mode="reduce-overhead"): the padding holds in the replayed step (102 %);
    the pins of two small projections (predicted 5.0 and 3.9 µs) are within noise after 27 rounds, so not
    ranked."""
    lines = _audit(tmp_path, "decode_reduce_overhead").output.splitlines()
    first = next(ln for ln in lines if ln.startswith("1. "))
    assert first.startswith("1. pad the vocabulary 50257 → 50264") and "(102 % of the prediction)" in first
    ranked = [ln for ln in lines if ln[:1].isdigit() and ln[1:3] == ". "]
    assert not any("q_proj" in ln or "o_proj" in ln for ln in ranked), ranked
    i = lines.index(next(ln for ln in lines if ln.startswith("proven not to pay")))
    below = "\n".join(lines[i:i + 5])
    assert below.count("q_proj") == 1 and below.count("o_proj") == 1, below
    assert below.count("proven within noise in the program's step") == 2 and below.count("over 27 rounds") == 0


def test_a_moe_change_that_the_program_does_not_pay_for_is_never_ranked(tmp_path):
    """The hand-written MoE: its balanced routing, predicted over all six grouped GEMMs it changes (848.7
    µs/step), is proven at 82 % and ranks first as the what-if it is; one bmm over padded experts (its GEMMs
    alone: 1,095.7 µs/step, 8.6 ms slower when applied by hand) is an estimate, never ranked; torch's cuBLASLt
    path, predicted to save 155.9 µs/step, is within noise in the step and listed apart, not ranked, though its
    kernels saved 307.0 µs/step in the step (the step is not bound by its kernels)."""
    text = _audit(tmp_path, "titan_moe_train").output
    lines = text.splitlines()
    ranked = [ln for ln in lines if ln[:1].isdigit() and ln[1:3] == ". "]
    assert ranked[0].startswith("1. balance the router's load over the 64 experts") and (
        "(82 % of the prediction)" in ranked[0] and "the upper bound of a router change" in ranked[0])
    assert not any("torch.bmm" in ln or "preferred_blas_library('cublaslt'), 1 MiB" in ln for ln in ranked)
    i = lines.index(next(ln for ln in lines if ln.startswith("proven not to pay")))
    assert "run on torch's cuBLASLt path" in lines[i + 1] and "predicted to save 155.9 µs/step" in lines[i + 1]
    assert ("proven within noise in the program's step: -22.0 µs/step [-85.8, 26.4]; its kernels in the step saved "
            "307.0 µs/step") in lines[i + 2]
    est = lines.index(next(ln for ln in lines if ln.startswith("estimates (not ranked")))
    assert any("torch.bmm" in ln for ln in lines[est:i])


def test_a_damaged_proof_keeps_its_good_items_and_names_the_bad_one(tmp_path):
    d = json.loads((PROOFS / "llama_vocab32001" / "proof.json").read_text())
    d["items"][1]["proven_us"] = "fast"
    p = tmp_path / "proof.json"
    p.write_text(json.dumps(d))
    r = _audit(tmp_path, "llama_vocab32001", proof=p)
    assert r.exit_code == 0, r.output
    assert "note: proof.json: item 1 skipped: proven_us 'fast' is not a finite number" in r.output
    assert "(106 % of the prediction less the applier's own copies" in r.output and "pin candidate #1" in r.output
    assert "(99 % of the prediction)" not in r.output


def test_a_proof_whose_applier_cost_is_impossible_drops_that_item_with_a_note(tmp_path):
    d = json.loads((PROOFS / "gpt2_train" / "proof.json").read_text())
    d["items"][0]["applier_cost"]["us"] = -1350.5
    p = tmp_path / "proof.json"
    p.write_text(json.dumps(d))
    r = _audit(tmp_path, "gpt2_train", proof=p)
    assert r.exit_code == 0, r.output
    assert "note: proof.json: item 0 skipped: applier_cost" in r.output
    assert "less the applier's own copies" not in r.output


@pytest.mark.parametrize("name", ["llama_vocab32001", "gpt2_train", "titan_moe_train", "mixtral_train",
                                  "decode_reduce_overhead"])
def test_every_proven_item_joins_the_advice_its_saved_measurement_makes(name):
    """A proof joins the advice on each item's text (`apply`): the advice made again from the committed
    measurement names every item the prover proved in the same words (a pin's algo as the log writes it,
    ``... splitK 4``), so none of the proof is lost."""
    from cublaslt_probe.analysis.audit import advice, audit
    from cublaslt_probe.analysis.audit.measured import load_bound
    a = audit(PROOFS / name)
    meas, _ = load_bound(a, str(PROOFS / name / "measure.json"), str(PROOFS / name))
    whats = {it["what"] for it in advice(a.rows, meas, a.step_gpu_us, a.step_gpu_us * a.steps)}
    proof, _ = P.load(PROOFS / name / "proof.json")
    assert proof.items and {it.what for it in proof.items} <= whats, {it.what for it in proof.items} - whats


def test_the_prove_command_reads_its_options_after_the_run_and_the_script_after_the_dashes(tmp_path):
    """`cublaslt-probe prove RUN --from M -- SCRIPT.py ARGS`, as docs/prove.md writes it: --from after RUN is the
    command's option (not the script's), and a script without `model` and `step()` is a usage error naming it
    (checked before anything needs a GPU)."""
    from click.testing import CliRunner

    from cublaslt_probe.cli import main
    script = tmp_path / "prog.py"
    script.write_text("x = 1\n")
    run = PROOFS / "llama_vocab32001"
    r = CliRunner().invoke(main, ["prove", str(run), "--from", str(run / "measure.json"), "--rounds", "3", "--",
                                  str(script), "--lr", "3"])
    assert r.exit_code == 2, r.output
    assert "defines no `model` and `step()`" in r.output and "Missing option" not in r.output


def test_the_measured_gemms_are_the_largest_and_every_other_gemm_of_their_modules():
    """The hand-written MoE's six largest GEMMs hold three of its experts' six grouped GEMMs: the other three are
    measured too (a balanced router changes all six; its first prediction, over three, was 144 % short), the
    router's small GEMMs, whose module did not rank, are not."""
    from cublaslt_probe.analysis.audit import audit
    from cublaslt_probe.analysis.audit.plan import to_measure
    rows = audit(PROOFS / "titan_moe_train").rows.to_dict("records")
    got, more = to_measure(rows, 6)
    experts = [r for r in rows if r["module"].startswith("layers.*.experts")]
    assert len(experts) == 6 and sum(r in rows[:6] for r in experts) == 3
    assert more == 3 and len(got) == 9
    assert all(r in got for r in experts) and not any("router" in r["module"] for r in got)
    assert got == [r for r in rows if r in got]            # still largest first
    assert to_measure(rows, len(rows)) == (rows, 0)


def test_a_saving_is_settled_when_its_rounds_quartile_range_is_within_half_of_it():
    """The prover adds rounds while an item's saving is not pinned down (`proof.settled`): the Mixtral what-if
    proven at 404.6 µs/step with its rounds' quartiles [343.1, 1,062.8] is not; the compiled decode's padding,
    456.3 [455.8, 457.3], is; a saving of about zero never is (its rounds run to the cap)."""
    assert not P.settled({"proven_us": 404.6, "spread_us": [343.1, 1062.8]})
    assert P.settled({"proven_us": 456.3, "spread_us": [455.8, 457.3]})
    assert P.settled({"proven_us": -664.4, "spread_us": [-713.3, -635.4]})
    assert not P.settled({"proven_us": -1.9, "spread_us": [-4.2, 0.7]})


@pytest.mark.parametrize("name", ["titan_moe_train", "mixtral_train", "decode_reduce_overhead"])
def test_each_proven_item_of_a_proof_with_added_rounds_is_settled_or_ran_to_the_cap(name):
    """The proofs captured with added rounds (scripts/prove_programs.py, 9 rounds asked): an item stops at 9,
    18 or 27 rounds, and one that stopped before 27 is settled."""
    d = json.loads((PROOFS / name / "proof.json").read_text())
    proven = [it for it in d["items"] if it["status"] == "proven"]
    assert proven
    for it in proven:
        assert it["rounds"] in (9, 18, 27), it
        assert P.settled(it) or it["rounds"] == P.MORE_ROUNDS * 9, it


def test_a_saving_not_pinned_down_after_the_rounds_says_how_far_its_quartiles_spread(tmp_path):
    """The Mixtral what-if ran to the cap (27 rounds) with quartiles [215.9, 726.4] around 477.9 µs/step:
    the advice says it is not pinned down and spans 35–117 % of the 618.3 predicted; the titan MoE's, settled
    in 9 rounds, says nothing of the kind."""
    first = next(ln for ln in _audit(tmp_path, "mixtral_train").output.splitlines() if ln.startswith("1. "))
    assert ("(77 % of the prediction); not pinned down after 27 rounds: its rounds' quartiles are 35–117 % of the "
            "prediction" in first), first
    first = next(ln for ln in _audit(tmp_path, "titan_moe_train").output.splitlines() if ln.startswith("1. "))
    assert "(82 % of the prediction)" in first and "not pinned down" not in first, first


def test_the_steps_kernels_are_split_per_name_per_step_and_the_most_changed_kept():
    """`kernel_split` of the events CUPTI records over a block of steps with the change off and on: time per step
    per name (a kernel the variant never runs is 0 on its side), the totals' difference, the names ordered by how
    much their time changed."""
    original = [(0, "gemm_a", 560.0), (1, "norm", 3.0), (2, "gemm_a", 566.0), (3, "norm", 3.2), (4, "copy", 1.0)]
    variant = [(0, "gemm_b", 511.0), (1, "norm", 2.4), (2, "gemm_b", 512.0), (3, "norm", 2.4), (4, "copy", 1.0)]
    k = P.kernel_split(original, variant, steps=2)
    assert k["original_us"] == pytest.approx(566.6) and k["variant_us"] == pytest.approx(514.4)
    assert k["saving_us"] == pytest.approx(52.2) and k["steps"] == 2 and k["names"] == 4
    assert [c["name"] for c in k["changed"]] == ["gemm_a", "gemm_b", "norm", "copy"]
    assert k["changed"][0] == {"name": "gemm_a", "original_us": 563.0, "variant_us": 0.0, "original_calls": 1.0,
                               "variant_calls": 0.0}
    assert k["changed"][1] == {"name": "gemm_b", "original_us": 0.0, "variant_us": 511.5, "original_calls": 0.0,
                               "variant_calls": 1.0}
    assert k["changed"][3]["original_calls"] == k["changed"][3]["variant_calls"] == 0.5
    many = [(i, f"k{i}", float(i)) for i in range(20)]
    assert len(P.kernel_split(many, [], 1)["changed"]) == P.KERNELS_SHOWN
    with pytest.raises(ValueError):
        P.kernel_split(original, variant, steps=0)


LIVE_WITH_KERNELS = ("decode_reduce_overhead", "titan_moe_train", "mixtral_train")   # proven with the step's kernels


@pytest.mark.parametrize("name", LIVE_WITH_KERNELS)
def test_every_item_proven_in_the_live_step_carries_its_steps_kernels_off_and_on(name):
    """Each item proven in the live step (not in fresh processes) records the step's kernels with the change
    off and on (`gpu.prove`, CUPTI): both sides ran kernels, the saving is their difference, the most changed
    names are kept with their launches per step."""
    proof, notes = P.load(PROOFS / name / "proof.json")
    live = [it for it in proof.items if it.status == "proven" and "fresh" not in it.raw]
    assert live and notes == []
    for it in live:
        k = it.raw["kernels"]
        assert k["original_us"] > 0 and k["variant_us"] > 0 and k["steps"] == 3, it.what
        assert it.kernel_saving_us == pytest.approx(k["original_us"] - k["variant_us"])
        assert 0 < len(k["changed"]) <= P.KERNELS_SHOWN <= k["names"]
        moved = [abs(c["original_us"] - c["variant_us"]) for c in k["changed"]]
        assert moved == sorted(moved, reverse=True)


def test_the_decodes_pin_swaps_one_gemm_kernel_for_the_candidates_in_the_replayed_step(tmp_path):
    """The compiled decode's lm_head pin, in the step replayed from CUDA graphs: torch's kernel (cutlass 128x128,
    564.8 µs/step) is launched once less and the candidate's (256x128, 513.0) once more; the step's kernels
    saved 52.4 µs/step and the step 52.2 (the prediction, from the GEMMs timed alone: 41.0); the advice says
    both."""
    proof, _ = P.load(PROOFS / "decode_reduce_overhead" / "proof.json")
    pin = next(it for it in proof.items if it.what.startswith("pin candidate #1 (algo 24"))
    (gone,) = [c for c in pin.raw["kernels"]["changed"] if c["original_calls"] == 1 and c["variant_calls"] == 0
               and "gemm" in c["name"]]
    (new,) = [c for c in pin.raw["kernels"]["changed"] if c["variant_calls"] == 1 and c["original_calls"] == 0
              and "gemm" in c["name"]]
    assert "128x128" in gone["name"] and "256x128" in new["name"]
    assert gone["original_us"] == pytest.approx(564.8, abs=0.05) and new["variant_us"] == pytest.approx(513.0, abs=0.05)
    line = next(ln for ln in _audit(tmp_path, "decode_reduce_overhead").output.splitlines()
                if ln.startswith("2. pin candidate #1 (algo 24"))
    assert "(127 % of the prediction); its kernels in the step saved 52.4 µs/step" in line, line


@pytest.mark.parametrize("proven, predicted, kernels, want", [
    (53.9, 37.7, 54.9, "kernels"),     # the earlier capture's lm_head pin: 143 %, its kernels 98 % of the step's
    (-22.0, 155.9, 160.0, "rest"),     # kernels saved what was predicted; the step (host-bound) did not follow
    (10.0, 100.0, 300.0, "both"),
    (696.4, 848.7, 1068.1, None),      # 82 %: the prediction holds, nothing to explain
    (53.9, 37.7, None, None),          # no kernels recorded
    (5.0, 0.0, 5.0, None),             # no positive prediction
])
def test_a_departure_from_the_prediction_is_read_from_the_steps_kernels(proven, predicted, kernels, want):
    assert P.in_step_reading(proven, predicted, kernels) == want
    assert P.in_step_reading(proven, predicted, kernels, pinned_down=False) is None   # a range, not a figure


def test_a_pin_whose_kernels_explain_its_departure_says_the_prediction_timed_them_alone():
    """The decode's lm_head pin as the earlier capture predicted it (37.7 µs/step): proven 52.2 is 139 % of that,
    and its kernels in the step saved 52.4 — the words say the GEMMs ran at another speed in the step and that
    corrected by their time there the prediction holds. Predicted at 52.0 nothing is explained."""
    from cublaslt_probe.render.audit import proof_words
    proof, _ = P.load(PROOFS / "decode_reduce_overhead" / "proof.json")
    what = next(it.what for it in proof.items if it.what.startswith("pin candidate #1 (algo 24"))
    (x,) = P.apply([{"what": what, "saving_us": 37.7}], proof)
    said = proof_words(x)
    assert x["proof"]["in_step"] == "kernels" and "(139 % of the prediction)" in said, said
    assert "its kernels in the step saved 52.4 µs/step and the step 100 % of that: the prediction timed its GEMMs " \
           "alone" in said, said
    (y,) = P.apply([{"what": what, "saving_us": 52.0}], proof)
    assert y["proof"]["in_step"] is None and "timed its GEMMs alone" not in proof_words(y)
    # the titan pin #6, not pinned down after 27 rounds ([10.3, 112.8] around 70.8): at 30.0 predicted (236 %)
    # its one block of kernels explains nothing
    titan, _ = P.load(PROOFS / "titan_moe_train" / "proof.json")
    what = next(it.what for it in titan.items if it.what.startswith("pin candidate #6"))
    (z,) = P.apply([{"what": what, "saving_us": 30.0}], titan)
    assert z["proof"]["settled"] is False and z["proof"]["in_step"] is None, z["proof"]
    # the titan routing (proven 696.4, its kernels 1,068.1) against a prediction of 1,050.0 (66 %): the kernels
    # saved what was predicted, the host-bound step did not follow
    what = next(it.what for it in titan.items if it.what.startswith("balance the router's load"))
    (w,) = P.apply([{"what": what, "saving_us": 1050.0}], titan)
    assert w["proof"]["in_step"] == "rest", w["proof"]
    assert ("its kernels in the step saved 1,068.1 µs/step, 102 % of the prediction, the step 65 % of that: the "
            "rest of the step (GPU idle gaps, host time, launches) took the difference") in proof_words(w)


@pytest.mark.parametrize("kernels, why", [
    ({"original_us": -1.0, "variant_us": 5.0, "saving_us": -6.0}, "kernels.original_us"),
    ({"original_us": 9.0, "variant_us": float("nan"), "saving_us": 1.0}, "kernels.variant_us"),
    ({"original_us": 9.0, "variant_us": 5.0, "saving_us": 400.0}, "kernels.saving_us"),
    ("fast", "kernels 'fast' is not an object"),
])
def test_a_proof_whose_kernels_are_impossible_drops_that_item_with_a_note(tmp_path, kernels, why):
    d = json.loads((PROOFS / "decode_reduce_overhead" / "proof.json").read_text())
    d["items"][1]["kernels"] = kernels
    path = tmp_path / "proof.json"
    path.write_text(json.dumps(d))
    proof, notes = P.load(path)
    assert len(proof.items) == len(d["items"]) - 1 and len(notes) == 1
    assert notes[0].startswith("proof.json: item 1 skipped: " + why), notes
    d["items"][1]["kernels"] = {"why": "CUPTI could not record the step's kernels: no libcupti found"}
    path.write_text(json.dumps(d))
    proof, notes = P.load(path)
    assert notes == [] and proof.items[1].kernel_saving_us is None


def test_every_field_of_the_steps_kernels_damaged_never_breaks_the_audit(tmp_path):
    """Each field of the titan proof's `kernels` records (every item that has one, the list of changed names
    included) replaced by a value of another type, an impossible number or nothing: the proof loads, an item
    whose kernels cannot be read is dropped with a note naming `kernels`, and the advice renders; the audit
    command on the worst case exits 0."""
    from cublaslt_probe.render.audit import proof_words
    base = json.loads((PROOFS / "titan_moe_train" / "proof.json").read_text())
    with_kernels = [i for i, it in enumerate(base["items"]) if "kernels" in it]
    assert len(with_kernels) == 3
    bad = ["fast", None, float("nan"), -1.0, 1e300, [], {}, True]
    checked = 0
    for i in with_kernels:
        for field in list(base["items"][i]["kernels"]) + [None]:
            for value in bad:
                d = json.loads(json.dumps(base))
                if field is None:
                    d["items"][i]["kernels"] = value
                else:
                    d["items"][i]["kernels"][field] = value
                path = tmp_path / "proof.json"
                path.write_text(json.dumps(d))
                proof, notes = P.load(path)
                assert len(proof.items) + len(notes) == len(d["items"])
                assert all(n.startswith(f"proof.json: item {i} skipped: kernels") for n in notes), notes
                for x in P.apply([{"what": it.what, "saving_us": 100.0} for it in proof.items], proof):
                    proof_words(x)
                checked += 1
    assert checked == 3 * (6 + 1) * len(bad)
    r = _audit(tmp_path, "titan_moe_train", proof=path)
    assert r.exit_code == 0, r.output
