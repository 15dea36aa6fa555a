"""`tunableop`: the TunableOp results rows that pin the audit's pin items, on the saved H200 measurements of
tests/fixtures/programs/measure (gpt2_train is the one with pin advice: two lm_head backward GEMMs) and on real
cuBLASLt lines of the captured program logs. The expected rows follow torch's own format strings, read in its
source (docs/tunableop.md names the files and commits):

- solution: CublasltAlgoConfigName, pytorch/pytorch aten/src/ATen/cuda/tunable/GemmCublaslt.h (commit 0cd5a4c1)
  "Gemm_Cublaslt_id_%d_tile_%u_stages_%u_splitk_%d_red_%u_swizzle_%u_custom_%u" + "_inner_%hu_cluster_%hu";
- params: GemmParams::Signature / GemmStridedBatchedParams::Signature, aten/src/ATen/cuda/tunable/GemmCommon.h
  (gderossi/pytorch d22ad013, the PR's branch) "%c%c_%ld_%ld_%ld_ld_%ld_%ld_%ld", "%c%c_%ld_%ld_%ld_B_%ld_ld_...";
- op: GemmTunableOp::Signature, TunableGemm.h "GemmTunableOp_%s_%c%c" (TypeName float -> "tf32" under TF32);
- validators: TuningResultsValidator, Tunable.cpp (gderossi/pytorch 29053f34): PT_VERSION, CUBLASLT_VERSION
  (cublasLtGetVersion()), CUDA_DEVICE (major.minor:name); ReadFile splits each line on ','.
"""
from __future__ import annotations

import copy
import json
import re

import pytest
from click.testing import CliRunner
from conftest import FIXTURES

from cublaslt_probe import tunableop as T
from cublaslt_probe.analysis.audit import advice, audit
from cublaslt_probe.cli import main
from cublaslt_probe.errors import ProbeError
from cublaslt_probe.logs.parser import parse_line

PROGRAMS = FIXTURES / "programs"
MEASURE = PROGRAMS / "measure"


def _sscanf(fmt: str) -> re.Pattern:
    """torch's printf/sscanf format as a regex: each %d %u %hu %ld a number, %c one character."""
    out = re.escape(fmt)
    for spec, rx in (("%hu", r"(\d+)"), ("%ld", r"(\d+)"), ("%d", r"(-?\d+)"), ("%u", r"(\d+)"), ("%c", r"(.)")):
        out = out.replace(re.escape(spec), rx)
    return re.compile(out + "$")


SOLUTION_FMT = _sscanf("Gemm_Cublaslt_id_%d_tile_%u_stages_%u_splitk_%d_red_%u_swizzle_%u_custom_%u"
                       "_inner_%hu_cluster_%hu")
PARAMS_FMT = _sscanf("%c%c_%ld_%ld_%ld_ld_%ld_%ld_%ld")
BATCHED_FMT = _sscanf("%c%c_%ld_%ld_%ld_B_%ld_ld_%ld_%ld_%ld")


@pytest.fixture(scope="module")
def gpt2():
    meas = json.loads((MEASURE / "gpt2_train.json").read_text())
    items = advice(audit(PROGRAMS / "gpt2_train").rows, meas, None)
    return items, meas


def _log_line(program: str, needle: str) -> str:
    """The first trace line of a captured program's cuBLASLt log that holds `needle`."""
    for line in (PROGRAMS / program / "cublaslt.log").read_text().splitlines():
        if "[Trace]" in line and needle in line:
            return line
    raise AssertionError(f"{program}: no trace line with {needle}")


def test_the_pin_items_of_gpt2_train_become_these_exact_lines(gpt2):
    items, meas = gpt2
    pins = [it for it in items if it["kind"] == "pin"]
    assert len(pins) == 2
    p = T.plan(items, meas["env"], meas["gemms"])
    # lm_head bwd, cuBLAS column-major: D 768×50257 = A 768×4096 (N) · B (T), lds 768, 50257, 768 in its line
    assert p.lines == [
        "Validator,PT_VERSION,2.14.0",
        "Validator,CUBLASLT_VERSION,130100",
        "Validator,CUDA_DEVICE,9.0:NVIDIA H200",
        "GemmTunableOp_tf32_NT,nt_768_50257_4096_ld_768_50257_768,"
        "Gemm_Cublaslt_id_23_tile_24_stages_9_splitk_1_red_0_swizzle_0_custom_0_inner_0_cluster_0,2.62334",
        "GemmTunableOp_tf32_NN,nn_768_4096_50257_ld_768_50257_768,"
        "Gemm_Cublaslt_id_23_tile_24_stages_9_splitk_4_red_1_swizzle_0_custom_0_inner_0_cluster_0,2.35787",
    ]
    assert p.written == [it["what"] for it in pins] and p.skipped == []
    assert T.rows(items, meas["env"], meas["gemms"]) == p.lines


def test_each_row_parses_back_with_torchs_formats_to_the_measured_candidate(gpt2):
    """The row read the way torch reads it (ReadFile's split on ',', the solution's sscanf, the params'
    printf) gives back the measured candidate's numbers and the logged line's shape: computed here from the
    measurement file and the log line, not by the code under test."""
    items, meas = gpt2
    pins = [it for it in items if it["kind"] == "pin"]
    for it, line in zip(pins, T.plan(items, meas["env"], meas["gemms"]).rows):
        op, params, sol, ms = line.split(",")
        g = next(g for g in meas["gemms"] if g["key"] == it["change"]["key"] and g["pass"] == it["change"]["pass"])
        c = next(c for c in g["candidates"] if c["tile"] == it["change"]["algo"]["tile"]
                 and c["split_k"] == it["change"]["algo"]["split_k"])
        want = [c["algo_id"], c["tile_enum"], c["stages_enum"], c["split_k"], c["reduction_scheme_enum"],
                c["cta_swizzling"], c["custom_option"], c["inner_shape_enum"], c["cluster_enum"]]
        assert [int(x) for x in SOLUTION_FMT.match(sol).groups()] == want
        assert float(ms) == pytest.approx(c["time_us"] / 1000, rel=1e-5)
        r = parse_line(it["replay"])
        ta, tb, *dims = PARAMS_FMT.match(params).groups()
        assert (ta, tb) == ((r.op_a or "N").lower(), (r.op_b or "N").lower())
        assert [int(x) for x in dims] == [r.m, r.n, r.k, r.lda, r.ldb, r.ldc]
        assert op == f"GemmTunableOp_tf32_{ta.upper()}{tb.upper()}"


def test_validators_name_the_torch_that_reads_them(gpt2):
    _, meas = gpt2
    env = meas["env"]
    assert T.validators(env)[0] == "Validator,PT_VERSION,2.14.0"          # run's torch 2.11 cannot read rows
    assert T.validators(env, "2.15.1+cu130")[0] == "Validator,PT_VERSION,2.15.1"
    assert T.validators({**env, "torch_version": "2.14.2+cu130"})[0] == "Validator,PT_VERSION,2.14.2"
    assert not T.reads_rows(env["torch_version"]) and T.reads_rows("2.14.0") and T.reads_rows("3.0")
    with pytest.raises(ProbeError, match="cublaslt_version"):
        T.validators({k: v for k, v in env.items() if k != "cublaslt_version"})


def test_items_it_cannot_express_are_listed_with_the_reason(gpt2):
    items, meas = gpt2
    pins = [it for it in items if it["kind"] == "pin"]
    no_line = copy.deepcopy(pins[0])
    no_line["replay"] = None
    fp8 = copy.deepcopy(pins[0])
    fp8["replay"] = _log_line("fp8_linear", "R_8F_E4M3")
    dim1 = copy.deepcopy(pins[0])
    dim1["replay"] = _log_line("llama_decode", "cols=1 ")
    p = T.plan([no_line, fp8, dim1, pins[1], pins[1]], meas["env"], meas["gemms"])
    assert len(p.rows) == 1 and p.written == [pins[1]["what"]]
    reasons = [why for _, why in p.skipped]
    assert len(reasons) == 4
    assert reasons[0].startswith("no logged cuBLASLt line")
    assert reasons[1].startswith("types R_8F_E4M3/R_8F_E4M3 -> R_16BF")
    assert reasons[2].startswith("a dimension of 1 (64×1×1)")
    assert reasons[3] == f"its op and params are pinned already, by: {pins[1]['what']}"


def test_without_the_measurement_the_enum_numbers_are_missing_and_said(gpt2):
    items, meas = gpt2
    p = T.plan(items, meas["env"], [])
    assert p.rows == [] and len(p.skipped) == 2
    assert all("not in the measurement" in why for _, why in p.skipped)
    # a measurement whose candidates lack the numbers (an older measurement file)
    old = copy.deepcopy(meas["gemms"])
    for g in old:
        for c in g.get("candidates") or []:
            c.pop("cluster_enum", None)
    p = T.plan(items, meas["env"], old)
    assert p.rows == [] and all("cluster_enum" in why for _, why in p.skipped)


def test_batched_and_bias_gemms_take_their_own_ops():
    """A bmm's line (sdpa_math) keys GemmStridedBatchedTunableOp with its batch; an addmm with a bias epilogue
    (gpt2_train's c_attn) keys GemmAndBiasTunableOp."""
    line = _log_line("sdpa_math", "batchCount=128")
    r = parse_line(line)
    op, params = T.op_and_params(line)
    assert op == "GemmStridedBatchedTunableOp_tf32_TN"
    ta, tb, *dims = BATCHED_FMT.match(params).groups()
    assert (ta, tb) == ("t", "n")
    assert [int(x) for x in dims] == [r.m, r.n, r.k, 128, r.lda, r.ldb, r.ldc] == [2048, 2048, 128, 128, 128,
                                                                                    128, 2048]
    line = _log_line("gpt2_train", "EPILOGUE_BIAS")
    assert T.op_and_params(line) == ("GemmAndBiasTunableOp_tf32_NN", "nn_2304_4096_768_ld_2304_768_2304")
    bf16 = _log_line("compiled_mlp", "EPILOGUE_BIAS")
    assert T.op_and_params(bf16)[0].startswith("GemmAndBiasTunableOp_")


def test_the_cli_writes_the_file_and_says_which_torch_reads_it(tmp_path, gpt2):
    items, meas = gpt2
    out = tmp_path / "pins.csv"
    r = CliRunner().invoke(main, ["audit", str(PROGRAMS / "gpt2_train"), "--from", str(MEASURE / "gpt2_train.json"),
                                  "--tunableop-out", str(out), "-o", str(tmp_path / "rows.jsonl")])
    assert r.exit_code == 0, r.output
    assert (f"wrote 2 TunableOp rows to {out} (torch >= 2.14 reads them; this run's torch 2.11.0+cu130 cannot)"
            in r.output.splitlines())
    assert out.read_text().splitlines() == T.plan(items, meas["env"], meas["gemms"]).lines
    r = CliRunner().invoke(main, ["audit", str(PROGRAMS / "gpt2_train"), "--tunableop-out", str(out)])
    assert r.exit_code == 2
    assert "--tunableop-out writes the pinned algos: add --measure or --from" in r.output
    assert "Traceback" not in r.output


def test_a_damaged_measurement_gives_reasons_not_an_error(gpt2):
    """The real measurement with a non-dict entry, a candidate's enum number turned to text and an item whose
    change is gone: each pin item is skipped with its reason; nothing raises."""
    items, meas = gpt2
    gemms = [None, *copy.deepcopy(meas["gemms"])]
    for g in gemms[1:]:
        for c in g.get("candidates") or []:
            c["tile_enum"] = "two-hundred"
    pins = [it for it in items if it["kind"] == "pin"]
    broken = {**pins[1], "change": None}
    p = T.plan([pins[0], broken], meas["env"], gemms)
    assert p.rows == []
    assert p.skipped[0] == (pins[0]["what"], "the measured candidate's config is not all numbers "
                                             "(invalid literal for int() with base 10: 'two-hundred')")
    assert "not in the measurement" in p.skipped[1][1]
