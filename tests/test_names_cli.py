"""`cublaslt-probe decode` and `cublaslt-probe grammars`: exact output through click's CliRunner."""
from __future__ import annotations

import csv
import io
import json

import pytest
from click.testing import CliRunner

from cublaslt_probe.cli import main
from cublaslt_probe.cli.decode import COMMANDS
from cublaslt_probe.names import JSONL_KEYS, decode

NVJET = "nvjet_sm90_hsh_128x8_64x12_4x1_v_bz_splitK_NNT"             # REFERENCE.md §5
TST = "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT"               # REFERENCE.md §5
AMPERE = "ampere_sgemm_128x64_tn"                                    # public trace (file id 8120377271)


def run(*args, input=None):
    return CliRunner().invoke(main, list(args), input=input, catch_exceptions=False)


def test_decode_one_name_table():
    r = run("decode", NVJET)
    assert r.exit_code == 0
    assert r.output == """\
name          nvjet_sm90_hsh_128x8_64x12_4x1_v_bz_splitK_NNT
family        nvjet
short         128x8 · 64x12 · 4x1 · splitK
arch          sm90
a_type        fp16
b_type        fp16
c_type        fp16
compute_type  fp32
tile_m        128
tile_n        8
tile_k        64
stages        12
cluster_m     4
cluster_n     1
split_k       true
layout        NNT
trans_a       false
trans_b       false
flags         splitK
base          nvjet_sm90_hsh_128x8_64x12_4x1_v_bz_splitK_NNT
source        bare
kind          gemm
provenance    library-selected
evidence      name
library       cublas
op            gemm
type_code     hsh
d_type        fp16
raster        v
beta          bz
swap_ab       true
"""


def test_decode_several_names_table():
    r = run("decode", TST, AMPERE, "Memset (Device)", "flash_fwd_kernel")
    assert r.exit_code == 0
    assert r.output == """\
name                                            family      arch  types           tile     k x stages  cluster  layout  flags  unparsed
nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT  nvjet       sm90  tst             256x128  64x4        1x2      TNT     coopA
ampere_sgemm_128x64_tn                          legacy      sm80  fp32/fp32/fp32  128x64                        tn
Memset (Device)                                 helper
flash_fwd_kernel                                flash_attn
"""  # noqa: E501  the command's exact output


@pytest.mark.parametrize("args", [("decode",), ("decode", "-")])
def test_decode_reads_stdin_one_name_per_line(args):
    r = run(*args, "-f", "jsonl", input=f"{TST}\n\n  \nnot_a_kernel\r\n{AMPERE}")
    assert r.exit_code == 0
    lines = r.output.split("\n")
    assert lines[-1] == ""
    objs = [json.loads(x) for x in lines[:-1]]
    assert [o["name"] for o in objs] == [TST, "", "  ", "not_a_kernel", AMPERE]
    assert [o["family"] for o in objs] == ["nvjet", "unknown", "unknown", "unknown", "legacy"]
    for o in objs:
        assert tuple(o)[:len(JSONL_KEYS)] == JSONL_KEYS


def test_decode_jsonl_line_is_exact():
    r = run("decode", "-f", "jsonl", TST)
    assert r.output == json.dumps(decode(TST).to_dict(), ensure_ascii=False) + "\n"
    o = json.loads(r.output)
    assert {k: o[k] for k in JSONL_KEYS} == {
        "name": TST, "family": "nvjet", "arch": "sm90", "a_type": "bf16", "b_type": "bf16", "c_type": "bf16",
        "compute_type": "fp32", "tile_m": 256, "tile_n": 128, "tile_k": 64, "stages": 4, "cluster_m": 1,
        "cluster_n": 2, "split_k": False, "layout": "TNT", "trans_a": True, "trans_b": False,
        "flags": ["coopA"], "unparsed": []}


def test_decode_jsonl_empty_line_gives_nulls():
    r = run("decode", "-f", "jsonl", input="\n")
    o = json.loads(r.output)
    assert o["name"] == "" and o["family"] == "unknown" and o["flags"] == [] and o["unparsed"] == []
    assert all(o[k] is None for k in JSONL_KEYS if k not in ("name", "family", "flags", "unparsed"))


def test_decode_json_is_one_array_in_input_order():
    r = run("decode", "-f", "json", AMPERE, TST)
    objs = json.loads(r.output)
    assert [o["name"] for o in objs] == [AMPERE, TST]
    assert r.output.startswith("[\n  {\n    \"name\": \"ampere_sgemm_128x64_tn\",\n    \"family\": \"legacy\",")


def test_decode_csv():
    r = run("decode", "-f", "csv", TST, "")
    rows = list(csv.reader(io.StringIO(r.output)))
    assert tuple(rows[0][:len(JSONL_KEYS)]) == JSONL_KEYS
    assert rows[1][:19] == [TST, "nvjet", "sm90", "bf16", "bf16", "bf16", "fp32", "256", "128", "64", "4", "1",
                            "2", "false", "TNT", "true", "false", "coopA", ""]
    assert rows[2][:3] == ["", "unknown", ""]
    assert len(rows) == 3


def test_decode_empty_stdin():
    assert run("decode", input="").output == ""
    assert run("decode", "-f", "json", input="").output == "[]\n"
    assert run("decode", "-f", "csv", input="").output.startswith("name,family,arch,")


def test_decode_mixes_arguments_and_stdin():
    r = run("decode", "-f", "jsonl", AMPERE, "-", TST, input="x\n")
    assert [json.loads(x)["name"] for x in r.output.splitlines()] == [AMPERE, "x", TST]


def test_decode_strict_fails_cleanly():
    r = CliRunner().invoke(main, ["decode", "--strict", TST, "foo", "nvjet_sm90_tst_128x8_TNT"])
    assert r.exit_code == 1
    assert r.output == ("Error: unknown kernel name 'foo': no grammar matches it; `cublaslt-probe grammars` "
                        "lists the known families (decode without --strict keeps it as family 'unknown') "
                        "(and 1 more)\n")


def test_decode_strict_passes_known_names():
    r = run("decode", "--strict", "-f", "jsonl", TST, AMPERE)
    assert r.exit_code == 0 and len(r.output.splitlines()) == 2


@pytest.mark.parametrize("text", ["_" * 10_000, "日本語", "void foo<<((", "\x00", "_Zxx"])
def test_decode_odd_input_never_tracebacks(text):
    for fmt in ("table", "json", "jsonl", "csv"):
        r = CliRunner().invoke(main, ["decode", "-f", fmt, text])
        assert r.exit_code == 0, r.output
        assert r.exception is None


def test_grammars_lists_every_family_with_tokens():
    r = run("grammars")
    assert r.exit_code == 0
    heads = [ln.split("  ")[0] for ln in r.output.splitlines() if ln and not ln.startswith(" ")]
    assert heads == ["nvjet", "nvjet_sm120", "xmma", "cutlass", "cutlass3x", "legacy", "helpers", "cudnn", "triton",
                     "fmha_cutlass", "trtllm_bmm", "nccl", "nccl_legacy", "signatures"]
    assert "    coopA|coopB               flags" in r.output
    assert "measured" in r.output and "inferred" in r.output


def test_grammars_one_family_exact_head():
    r = run("grammars", "nvjet")
    lines = r.output.splitlines()
    assert lines[0] == ("nvjet  (family nvjet): cuBLASLt's precompiled GEMM kernels, picked by its heuristic "
                        "(library-selected; Hopper, datacenter Blackwell)")
    assert lines[1] == ("  template: nvjet[_<arch>]_<types>_<M>x<N>_<Ktile>x<stages>_<Cm>x<Cn>[_2cta]_<h|v>_"
                        "<bz|badd>[_<flag>...]_<L1><L2><L3>")
    assert any(ln.startswith("    <M>x<N>") and " measured " in ln for ln in lines)
    assert "nvjet_sm120" in r.output   # the family has two grammars


def test_grammars_helper_family_maps_to_helpers():
    assert run("grammars", "gemv").output.startswith("helpers  (family helper)")


def test_grammars_json():
    objs = json.loads(run("grammars", "-f", "json", "xmma").output)
    assert [o["grammar"] for o in objs] == ["xmma"]
    assert {"token", "field", "meaning", "evidence", "source"} == set(objs[0]["tokens"][0])


def test_grammars_unknown_family_is_a_usage_error():
    r = CliRunner().invoke(main, ["grammars", "bogus"])
    assert r.exit_code == 2
    assert "'bogus' is not one of" in r.output


@pytest.mark.parametrize("cmd", COMMANDS, ids=[c.name for c in COMMANDS])
def test_commands_have_help(cmd):
    assert cmd.help and cmd.help.strip()
    r = run(cmd.name, "--help")
    assert r.exit_code == 0 and r.output.startswith("Usage: ")
