"""Grouped GEMMs on the CPU: specs and the moe preset planned (`sweep --dry-run`), group sizes made the same way
here as on the GPU that measured them (tests/fixtures/moe, captured by scripts/capture_moe.py), and the group
sizes a capture recorded joined to the grouped calls of its trace."""
import gzip
import json
import re
import shutil

import pytest
from click.testing import CliRunner

from cublaslt_probe import runfiles, sweep
from cublaslt_probe.analysis import dataset
from cublaslt_probe.cases import Case, group_sizes, invalid_reason, sizes_code, sizes_summary
from cublaslt_probe.cli import main
from cublaslt_probe.errors import SpecError
from cublaslt_probe.gpu.recorder import sizes_from_offsets
from cublaslt_probe.runfiles import read_group_sizes

SPEC = """
name = "experts"
[[group]]
ops = ["grouped_mm", "scaled_grouped_mm"]
dtypes = ["bf16", "fp8"]
layouts = ["NT", "TN"]
shapes = [[64, 1536, 2048]]
groups = [4, 8]
group_sizes = ["uniform", {seed = 1, top_k = 2}, "batched"]

[[group]]
ops = ["grouped_mm"]
dtypes = ["bf16"]
layouts = ["NN"]
shapes = [[10, 256, 512]]
group_sizes = [1, 0, 6, 3]

[[group]]
ops = ["mm"]
shapes = [[64, 1536, 2048]]
"""


def test_a_grouped_spec_plans_the_right_gemms_on_the_cpu(tmp_path):
    spec = tmp_path / "experts.toml"
    spec.write_text(SPEC)
    r = CliRunner().invoke(main, ["sweep", "--spec", str(spec), "--dry-run", "-o", str(tmp_path / "x.parquet")])
    assert r.exit_code == 0, r.output
    assert "sweep 'experts': 12 GEMMs" in r.output
    assert "torch/bf16: 8, torch/fp8: 4" in r.output
    assert "a grouped GEMM reads A row-major" in r.output                     # TN left out, with the reason
    assert "planned in the 2-D x 3-D form only" in r.output                   # fp8 batched left out
    keys = sweep.plan(None, str(spec)).cases.keys()
    assert keys == [
        "torch|grouped_mm|bf16|NT|64|1536|2048|1|4|uniform",
        "torch|scaled_grouped_mm|fp8|NT|64|1536|2048|1|4|uniform",
        "torch|grouped_mm|bf16|NT|64|1536|2048|1|4|seed=1,top_k=2",
        "torch|scaled_grouped_mm|fp8|NT|64|1536|2048|1|4|seed=1,top_k=2",
        "torch|grouped_mm|bf16|NT|16|1536|2048|4|4|batched",   # 3-D x 3-D: 4 groups of 16 rows
        "torch|grouped_mm|bf16|NT|64|1536|2048|1|8|uniform",
        "torch|scaled_grouped_mm|fp8|NT|64|1536|2048|1|8|uniform",
        "torch|grouped_mm|bf16|NT|64|1536|2048|1|8|seed=1,top_k=2",
        "torch|scaled_grouped_mm|fp8|NT|64|1536|2048|1|8|seed=1,top_k=2",
        "torch|grouped_mm|bf16|NT|8|1536|2048|8|8|batched",
        "torch|grouped_mm|bf16|NN|10|256|512|1|4|sizes=1,0,6,3",
        "torch|mm|bf16|NN|64|1536|2048|1",                     # a dense GEMM's key is what it was
    ]
    cases = list(sweep.plan(None, str(spec)).cases)
    assert [c.key for c in cases] == keys and all(invalid_reason(c) is None for c in cases)
    assert all(Case.from_key(c.key) == c for c in cases)
    assert cases[10].group_sizes() == [1, 0, 6, 3] and cases[4].group_sizes() == [16] * 4
    assert sum(cases[2].group_sizes()) == 64 and len(cases[2].group_sizes()) == 4


@pytest.mark.parametrize("group, msg", [
    ({"ops": ["grouped_mm", "mm"], "shapes": [[8, 8, 8]], "groups": 2}, "in a [[group]] of their own"),
    ({"ops": ["grouped_mm"], "shapes": [[8, 8, 8]]}, "grouped GEMMs need `groups`"),
    ({"ops": ["grouped_mm"], "shapes": [[8, 8, 8, 2]], "groups": 2}, "not a batch"),
    ({"ops": ["grouped_mm"], "shapes": [[8, 8, 8]], "groups": 2, "group_sizes": "skewed"}, "use \"uniform\""),
    ({"ops": ["grouped_mm"], "shapes": [[8, 8, 8]], "groups": 2, "group_sizes": {"zipf": -1}}, "from 0 to 8"),
    ({"ops": ["grouped_mm"], "shapes": [[8, 8, 8]], "groups": 2, "group_sizes": []}, "group_sizes is empty"),
    ({"ops": ["grouped_mm"], "shapes": [[8, 8, 8]], "groups": 0}, "no positive values"),
    ({"ops": ["grouped_mm"], "shapes": [[8, 8, 8]], "group_sizes": [3, 4]}, "every shape's m = 7"),
    ({"ops": ["grouped_mm"], "shapes": [[7, 8, 8]], "groups": 3, "group_sizes": [3, 4]}, "groups = 2"),
])
def test_bad_grouped_specs_name_the_problem(group, msg):
    with pytest.raises(SpecError) as e:
        sweep.plan_from_spec({"group": [group]})
    assert msg in str(e.value)


def test_group_sizes_are_made_as_the_code_says():
    assert group_sizes("uniform", 10, 4) == [3, 3, 2, 2]
    assert group_sizes("batched", 16, 4, 4) == [16] * 4
    z = group_sizes("zipf=1", 1000, 8)
    assert sum(z) == 1000 and z == sorted(z, reverse=True) and z[0] > 2 * z[1] - 2
    r = group_sizes("seed=0,top_k=8", 16384, 128)
    assert sum(r) == 16384
    assert r == group_sizes("seed=0,top_k=8", 16384, 128) != group_sizes("seed=1,top_k=8", 16384, 128)
    assert max(r) <= 2048   # top-8 picks 8 distinct experts per token: no expert gets a token twice
    with pytest.raises(ValueError, match="not tokens x top_k"):
        group_sizes("seed=0,top_k=8", 100, 128)
    assert sizes_code({"seed": 3}) == "seed=3,top_k=1" and sizes_code({"zipf": 1.0}) == "zipf=1"
    assert sizes_summary([0, 8, 3, 13]) == {"groups": 4, "rows": 24, "min": 0, "max": 13, "mean": 6.0, "empty": 1,
                                            "unaligned": 2, "imbalance": 2.167}
    assert sizes_from_offsets([3, 3, 10]) == [3, 0, 7]


@pytest.mark.parametrize("c, msg", [
    (Case("torch-lt", "grouped_mm", "bf16", "NT", 8, 8, 8, 1, 2, "uniform"), "use backend torch"),
    (Case("torch", "grouped_mm", "fp32", "NT", 8, 8, 8, 1, 2, "uniform"), "runs bf16 and fp16"),
    (Case("torch", "grouped_mm", "fp8", "NT", 8, 8, 8, 1, 2, "uniform"), "fp8 runs only as op scaled_mm"),
    (Case("torch", "scaled_grouped_mm", "fp8", "NN", 8, 8, 8, 1, 2, "uniform"), "needs layout NT"),
    (Case("torch", "grouped_mm", "bf16", "TT", 8, 8, 8, 1, 2, "uniform"), "reads A row-major"),
    (Case("torch", "grouped_mm", "bf16", "NT", 8, 8, 8, 3, 2, "batched"), "batch = groups"),
    (Case("torch", "grouped_mm", "bf16", "NT", 8, 8, 8, 1, 2, "sizes=1,2"), "adding up to 3"),
    (Case("torch", "mm", "bf16", "NT", 8, 8, 8, 1, 2, "uniform"), "only meaningful for ops grouped_mm"),
])
def test_grouped_cases_that_cannot_run_say_why(c, msg):
    assert msg in (invalid_reason(c) or "")


def test_the_moe_preset_plans_real_expert_shapes_on_the_cpu():
    r = CliRunner().invoke(main, ["sweep", "--preset", "moe", "--dry-run", "-o", "x.parquet"])
    assert r.exit_code == 0 and "sweep 'moe': 156 GEMMs" in r.output, r.output
    cases = list(sweep.plan("moe").cases)
    assert all(invalid_reason(c) is None for c in cases) and len({c.key for c in cases}) == len(cases)
    shapes = {(c.groups, c.n, c.k) for c in cases}
    assert {(8, 28672, 4096), (8, 4096, 14336), (128, 1536, 2048), (128, 2048, 768), (32, 4096, 7168),
            (128, 5760, 2880)} <= shapes
    assert {c.m * c.batch for c in cases if c.groups == 128 and c.n == 1536} == {128, 1024, 16384, 65536}


# --- the GPU's records ------------------------------------------------------------------------------------------
def _raw(fixtures):
    with gzip.open(fixtures / "moe" / "moe_sweep.raw.jsonl.gz", "rt") as f:
        return [r for r in map(json.loads, f) if r.get("type") != "env"]


def test_the_gpu_ran_the_plan_with_the_sizes_the_cpu_makes(fixtures):
    """Every record of the moe sweep on the H200 has the key the CPU plans, and the group sizes (and summary)
    the CPU makes for that key: the sizes are a function of the key, on any machine."""
    recs = _raw(fixtures)
    assert [r["key"] for r in recs] == sweep.plan("moe").cases.keys()
    for r in recs:
        c = Case.from_key(r["key"])
        assert r["error"] is None and r["groups"] == c.groups and r["sizes"] == c.sizes
        assert r["group_sizes"] == c.group_sizes()
        assert r["group_summary"] == sizes_summary(c.group_sizes())
        # CUTLASS's grouped kernel behind torch's prepare kernel; no cuBLASLt call, so no log line
        assert len(r["kernels"]) == 2 and "prepare_grouped_gemm_data" in r["kernels"][0]
        assert "GroupProblemShape" in r["kernels"][1] and r["log_lines"] == []
        assert r["heuristic_miss_us"] is None and r["time_us"] > 0


def test_grouped_records_build_into_the_dataset(fixtures, tmp_path):
    raw = tmp_path / "moe.raw.jsonl.gz"
    shutil.copy(fixtures / "moe" / "moe_sweep.raw.jsonl.gz", raw)
    env, rows, counts = dataset.write_from_raw([raw], tmp_path / "moe.parquet")
    df = dataset.read_parquet(tmp_path / "moe.parquet")
    assert rows == len(df) == 156 and counts["error"] == 0
    assert set(df.op) == {"grouped_mm", "scaled_grouped_mm"}
    assert df.kernel.str.contains("GroupProblemShape").all()   # the GEMM, not torch's prepare kernel before it
    assert set(df.family) == {"cutlass_template"} and df.tile_m.notna().all() and df.cluster_m.notna().all()
    three_d = df[df.key.str.endswith("|batched")]
    assert (three_d.batch > 1).all() and (three_d.tflops > 0).all()


# --- a capture's group sizes -----------------------------------------------------------------------------------
def _forward_calls(run):
    """The trace's grouped calls the program made, per step, in order (backward's run on autograd's thread)."""
    with gzip.open(run / runfiles.TRACE_FILE, "rt") as f:
        ev = json.load(f)["traceEvents"]
    steps = sorted((e for e in ev if e.get("cat") == "user_annotation" and e["name"].startswith(runfiles.STEP_PREFIX)),
                   key=lambda e: e["ts"])
    calls = sorted((e for e in ev if e.get("cat") == "cpu_op" and e.get("name") == "aten::_grouped_mm"),
                   key=lambda e: e["ts"])
    return [[e for e in calls if e["tid"] == s["tid"] and s["ts"] <= e["ts"] <= s["ts"] + s["dur"]]
            for s in steps], calls


@pytest.mark.parametrize("name, experts, per_step, in_trace", [("mixtral_train", 8, 2, 12), ("qwen3_moe", 128, 2, 4)])
def test_recorded_group_sizes_join_the_traces_grouped_calls(fixtures, name, experts, per_step, in_trace):
    """By step, the order of the calls and their operands' dims, each record is one forward grouped call of the
    trace; the sizes split all of A's rows; the trace holds each call once (backward's too)."""
    run = fixtures / "moe" / name
    recs = read_group_sizes(run)
    by_step, calls = _forward_calls(run)
    assert len(calls) == in_trace and len(by_step) == 2
    env = json.loads((run / runfiles.ENV_FILE).read_text())
    assert env["capture"]["group_sizes_calls"] == len(recs) == 2 * per_step
    for step, inside in enumerate(by_step):
        mine = [r for r in recs if r["step"] == step]
        assert [r["call"] for r in mine] == list(range(per_step)) and len(inside) == per_step
        for r, e in zip(mine, inside):
            assert [r["a"], r["b"], r["offs"]] == e["args"]["Input Dims"][:3]
            assert r["group_dim"] == "m" and r["groups"] == experts == len(r["sizes"])
            assert sum(r["sizes"]) == r["a"][0] == 2048 * (2 if experts == 8 else 8)
            assert r["summary"] == sizes_summary(r["sizes"])
        assert mine[0]["sizes"] == mine[1]["sizes"]   # gate+up and down route the same rows


def test_a_run_without_group_sizes_says_unknown_and_a_bad_line_is_skipped_and_named(fixtures, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(fixtures / "moe" / "qwen3_moe", run)
    (run / runfiles.GROUP_SIZES_FILE).unlink()
    assert read_group_sizes(run) is None
    shutil.copy(fixtures / "moe" / "qwen3_moe" / runfiles.GROUP_SIZES_FILE, run)
    lines = (run / runfiles.GROUP_SIZES_FILE).read_text().splitlines()
    (run / runfiles.GROUP_SIZES_FILE).write_text("\n".join(lines[:2] + [lines[2][:40]] + lines[3:]) + "\n")
    notes: list[str] = []
    recs = read_group_sizes(run, notes)
    assert [r[runfiles.LINE_KEY] for r in recs] == [1, 2, 4] and len(lines) == 4
    assert len(notes) == 1 and re.search(r"group_sizes.jsonl:3: 1 line\(s\) skipped, not a group sizes record "
                                         r"\(line 3: not JSON\)", notes[0]), notes


def test_grouped_alternatives_do_the_same_expert_work_other_ways(fixtures):
    """From the sizes a captured Qwen3-MoE router gave: padded groups are multiples of their pad and never
    smaller, balanced groups split the same rows evenly, the batched GEMM holds every group at the largest size."""
    from cublaslt_probe.cases import grouped_alternatives
    sizes = read_group_sizes(fixtures / "moe" / "qwen3_moe")[0]["sizes"]
    c = Case("torch", "grouped_mm", "bf16", "NT", sum(sizes), 1536, 2048, 1, len(sizes), sizes_code(sizes))
    alts = grouped_alternatives(c)
    assert list(alts) == ["original", "pad8", "pad16", "pad64", "pad128", "balanced", "bmm_padded", "fp8"]
    assert all(invalid_reason(a) is None for a in alts.values())
    assert alts["original"].group_sizes() == sizes
    for p in (8, 16, 64, 128):
        padded = alts[f"pad{p}"].group_sizes()
        assert all(x % p == 0 and x >= s and x - s < p for x, s in zip(padded, sizes))
    assert sizes_summary(alts["balanced"].group_sizes())["imbalance"] < sizes_summary(sizes)["imbalance"]
    bmm = alts["bmm_padded"]
    assert (bmm.op, bmm.batch, bmm.m) == ("bmm", len(sizes), max(sizes))
    assert alts["fp8"].op == "scaled_grouped_mm" and alts["fp8"].group_sizes() == sizes
    with pytest.raises(ValueError, match="2-D x 3-D"):
        grouped_alternatives(Case("torch", "grouped_mm", "bf16", "NT", 8, 8, 8, 2, 2, "batched"))


def test_random_routing_in_blocks_gives_the_sizes_the_gpu_measured(fixtures, monkeypatch):
    """Routing tokens a block at a time (memory bounded for any m) draws the same random stream as one draw:
    the sizes of the H200's records come out of blocks of 100 tokens too."""
    from cublaslt_probe import cases
    monkeypatch.setattr(cases, "ROUTE_TOKENS", 100)
    cases._sizes.cache_clear()
    try:
        recs = [r for r in _raw(fixtures) if r["sizes"].startswith("seed=") and r["m"] > 1000]
        assert len(recs) >= 10
        for r in recs:
            assert cases.group_sizes(r["sizes"], r["m"], r["groups"]) == r["group_sizes"]
    finally:
        cases._sizes.cache_clear()


SPLIT_K_SPEC = """
name = "wgrad"
[[group]]
ops = ["grouped_mm"]
dtypes = ["bf16"]
layouts = ["TN", "NT"]
shapes = [[28672, 4096, 4096]]
groups = 8
group_sizes = [{k = "uniform"}, {k = {seed = 0, top_k = 2}}, {k = [512, 0, 1024, 512, 512, 512, 512, 512]}]
"""


def test_the_weight_gradients_grouped_form_is_planned_with_offsets_along_k(tmp_path):
    """group_sizes {k = X} plans the weight gradient's 2-D x 2-D grouped GEMM: layout TN only, its sizes
    adding up to k (the tokens), not m; the sizes made the same way as m's."""
    spec = tmp_path / "wgrad.toml"
    spec.write_text(SPLIT_K_SPEC)
    r = CliRunner().invoke(main, ["sweep", "--spec", str(spec), "--dry-run", "-o", str(tmp_path / "x.parquet")])
    assert r.exit_code == 0, r.output
    assert "sweep 'wgrad': 3 GEMMs" in r.output and "layout TN" in r.output   # NT left out, with the reason
    cases = list(sweep.plan(None, str(spec)).cases)
    assert [c.key for c in cases] == [
        "torch|grouped_mm|bf16|TN|28672|4096|4096|1|8|k:uniform",
        "torch|grouped_mm|bf16|TN|28672|4096|4096|1|8|k:seed=0,top_k=2",
        "torch|grouped_mm|bf16|TN|28672|4096|4096|1|8|k:sizes=512,0,1024,512,512,512,512,512"]
    assert all(c.split_k and c.group_dim == "k" and sum(c.group_sizes()) == c.k for c in cases)
    assert cases[1].group_sizes() == group_sizes("seed=0,top_k=2", 4096, 8)
    assert all(Case.from_key(c.key) == c for c in cases)
    bad = Case("torch", "grouped_mm", "bf16", "TN", 8, 8, 100, 1, 2, "k:sizes=1,2")
    assert "adding up to 3" in invalid_reason(bad)
    with pytest.raises(ValueError, match="not batched"):
        sizes_code({"k": "batched"})
