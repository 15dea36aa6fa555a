"""The decoder against the names captured on the H200 (tests/fixtures/names/, PROVENANCE.md there).

These tests back every meaning `cublaslt-probe grammars` marks `measured`:
  names.jsonl         each distinct kernel name with one GEMM (backend, op, dtype, torch-view layout, m, n, k)
                      that launched it;
  nvjet_configs.jsonl cuBLASLt heuristic candidates: the algo config read back with
                      cublasLtMatmulAlgoConfigGetAttribute, paired with the kernels it launched;
  ../probe/probe_raw.jsonl  every probed GEMM with its kernels and cuBLASLt level-2 log line(s).
"""
from __future__ import annotations

import json
import pathlib
import re
from collections import Counter

import pytest

from cublaslt_probe.names import FAMILIES, decode, encode

GRAMMAR_FAMILIES = ("nvjet", "xmma", "cutlass", "cutlass3x")
FIXTURES = pathlib.Path(__file__).parent / "fixtures"


def _jsonl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


@pytest.fixture(scope="module")
def names():
    return _jsonl(FIXTURES / "names" / "names.jsonl")


@pytest.fixture(scope="module")
def configs():
    return _jsonl(FIXTURES / "names" / "nvjet_configs.jsonl")


@pytest.fixture(scope="module")
def probes():
    p = FIXTURES / "probe" / "probe_raw.jsonl"
    if not p.exists():
        pytest.skip("tests/fixtures/probe/probe_raw.jsonl is not in this checkout")
    return _jsonl(p)


@pytest.fixture(scope="module")
def all_names(names, configs):
    out = {r["kernel"] for r in names}
    for r in configs:
        out.update(r["kernels"])
    return sorted(out)


def _first(kernels, family):
    for k in kernels:
        kn = decode(k)
        if kn.family == family:
            return kn
    return None


def _blas_trans(layout):
    """cuBLAS transa, transb of a torch-view layout (torch computes C^T = B^T A^T: cuBLAS A is torch's B)."""
    return layout[1] == "T", layout[0] == "T"


# -------------------------------------------------------------------------------------- coverage
def test_every_captured_name_decodes_fully(all_names):
    assert len(all_names) > 300
    bad = [(decode(n).family, decode(n).unparsed, n[:100]) for n in all_names if not decode(n).known]
    assert bad == []
    fams = Counter(decode(n).family for n in all_names)
    assert set(fams) <= set(FAMILIES) - {"unknown"}
    assert {"nvjet", "xmma", "cutlass", "gemv", "splitk_reduce"} <= set(fams)


def test_every_captured_name_round_trips(all_names):
    for n in all_names:
        kn = decode(n)
        assert encode(kn) == kn.base, n
        if kn.family in GRAMMAR_FAMILIES:
            again = decode(encode(kn))
            assert again.to_dict() | {"name": n, "source": kn.source} == kn.to_dict(), n


def test_strict_accepts_every_captured_name(all_names):
    for n in all_names:
        decode(n, strict=True)


# ----------------------------------------------------------------------------- nvjet config pairs
def _nvjet_pairs(configs):
    pairs = [(r, _first(r["kernels"], "nvjet")) for r in configs]
    pairs = [(r, kn) for r, kn in pairs if kn is not None]
    assert len(pairs) >= 400, "expected the captured nvjet candidates"
    return pairs


def test_nvjet_tile_is_the_configs_tile(configs):
    for r, kn in _nvjet_pairs(configs):
        assert f"{kn.tile_m}x{kn.tile_n}" == r["tile"], (kn.base, r["tile"])


def test_nvjet_k_tile_is_the_k_of_the_stages_config(configs):
    for r, kn in _nvjet_pairs(configs):
        k, count = r["stages"].split("x")
        assert kn.tile_k == int(k), (kn.base, r["stages"])
        assert count == "AUTO"          # the stage count itself is not in the config: stays inferred


def test_nvjet_cluster_is_the_configs_cluster(configs):
    for r, kn in _nvjet_pairs(configs):
        assert f"{kn.cluster_m}x{kn.cluster_n}x1" == r["cluster"], (kn.base, r["cluster"])


def test_nvjet_splitk_flag_iff_more_than_one_split(configs):
    for r, kn in _nvjet_pairs(configs):
        assert kn.split_k == (r["split_k"] > 1), (kn.base, r["split_k"])
        assert ("splitK" in kn.flags) == (r["split_k"] > 1)


def test_nvjet_layout_letters_follow_transa_transb(configs):
    ignored_b = 0
    for r, kn in _nvjet_pairs(configs):
        assert kn.layout[0] == r["blas_trans_a"], (kn.base, r["blas_trans_a"])
        if r["blas_n"] == 1:        # cuBLAS ignores op(B) for a vector B: the name writes N
            assert kn.layout[1] == "N", kn.base
            ignored_b += r["blas_trans_b"] == "T"
        else:
            assert kn.layout[1] == r["blas_trans_b"], (kn.base, r["blas_trans_b"])
    assert ignored_b > 0


def test_nvjet_custom_option_bits(configs):
    """bit 0 <-> last layout letter T; bit 1 <-> raster h; bit 2 <-> coopA or coopB."""
    seen = Counter()
    for r, kn in _nvjet_pairs(configs):
        c = r["custom_option"]
        assert kn.swap_ab == bool(c & 1), (kn.base, c)
        assert (kn.raster == "h") == bool(c & 2), (kn.base, c)
        assert bool({"coopA", "coopB"} & set(kn.flags)) == bool(c & 4), (kn.base, c)
        seen[c] += 1
    assert set(seen) == set(range(8))


def test_nvjet_type_code_matches_the_configs_dtype(configs):
    expect = {"bf16": "tst", "fp16": "hsh", "fp8": "qqtst"}
    for r, kn in _nvjet_pairs(configs):
        assert kn.type_code == expect[r["dtype"]], (kn.base, r["dtype"])


# ---------------------------------------------------------------------- xmma and cutlass pairs
def test_xmma_tilesize_is_the_configs_tile_with_m_and_n_exchanged(configs):
    n = 0
    for r in configs:
        kn = _first(r["kernels"], "xmma")
        if kn is None:
            continue
        n += 1
        assert f"{kn.tile_n}x{kn.tile_m}" == r["tile"], (kn.base, r["tile"])
        k, count = r["stages"].split("x")
        assert kn.tile_k == int(k)
        assert (kn.stages is None) if count == "AUTO" else (kn.stages == int(count)), (kn.base, r["stages"])
        assert kn.layout == (r["blas_trans_a"] + r["blas_trans_b"]).lower()
    assert n > 300


def test_xmma_name_says_nothing_about_split_k(configs):
    splits = {r["split_k"] for r in configs if _first(r["kernels"], "xmma") is not None}
    assert max(splits) > 1
    for r in configs:
        kn = _first(r["kernels"], "xmma")
        if kn is not None:
            assert kn.split_k is None


def test_cutlass_tile_and_stages_are_the_configs(configs):
    n = 0
    for r in configs:
        kn = _first(r["kernels"], "cutlass")
        if kn is None:
            continue
        n += 1
        assert f"{kn.tile_m}x{kn.tile_n}" == r["tile"], (kn.base, r["tile"])
        if r["stages"] == "UNDEFINED":
            assert kn.tile_k is None and kn.stages is None, kn.base
        else:
            assert f"{kn.tile_k}x{kn.stages}" == r["stages"], (kn.base, r["stages"])
        assert kn.layout == (r["blas_trans_a"] + r["blas_trans_b"]).lower()
    assert n > 100


def test_splitkreduce_follows_split_k_with_a_reduction_buffer(configs):
    n = 0
    for r in configs:
        kns = [decode(k) for k in r["kernels"]]
        main = [k for k in kns if k.family in ("nvjet", "cutlass", "gemv")]
        if not main:
            continue
        reduce = any(k.family == "splitk_reduce" for k in kns)
        wants = r["split_k"] > 1 and r["reduction_scheme"] in ("COMPUTE_TYPE", "OUTPUT_TYPE")
        assert reduce == wants, (main[0].base, r["split_k"], r["reduction_scheme"])
        n += wants
    assert n > 200


# ------------------------------------------------------------------ names of the GEMMs that ran
def test_nvjet_type_letters_match_the_gemm_dtypes(names):
    expect = {("bf16", None): "tst", ("fp16", None): "hsh", ("fp8", None): "qqtst",
              ("fp8_e5m2", "torch"): "qrtst",   # torch(a=e5m2, b=e4m3): cuBLAS A = torch's b
              ("fp8_e5m2", "lt"): "rqtst"}      # lt backend: cuBLAS A = e5m2, B = e4m3
    n = 0
    for r in names:
        kn = decode(r["kernel"])
        if kn.family != "nvjet":
            continue
        key = (r["dtype"], r["backend"] if r["dtype"] == "fp8_e5m2" else None)
        assert kn.type_code == expect[key], (kn.base, r)
        assert kn.arch == "sm90"
        n += 1
    assert n > 100


def test_layout_letters_match_the_gemm_layout(names):
    """For every backend that hands cuBLAS the operands as laid out (not cupy, which may copy first)."""
    n = 0
    for r in names:
        kn = decode(r["kernel"])
        if kn.layout is None or r["backend"] == "cupy" or kn.family not in GRAMMAR_FAMILIES + ("gemmSN",):
            continue
        ta, tb = _blas_trans(r["layout"])
        assert kn.trans_a == ta and kn.trans_b == tb, (kn.base, r["layout"], r["backend"])
        n += 1
    assert n > 200


def test_xmma_math_type_is_tf32_exactly_for_tf32_gemms(names):
    for r in names:
        kn = decode(r["kernel"])
        if kn.family == "xmma":
            assert (kn.math_type == "tf32") == (r["dtype"] == "tf32"), (kn.base, r["dtype"])


def test_bias_flag_iff_bias_epilogue_and_bz_iff_beta_zero(probes):
    n_bias = n = 0
    for p in probes:
        log = " ".join(p["log_lines"])
        for k in p["kernels"]:
            kn = decode(k)
            if kn.family != "nvjet" or not log:
                continue
            n += 1
            has_bias = "EPILOGUE_BIAS" in log
            n_bias += has_bias
            assert ("bias" in kn.flags) == has_bias, (kn.base, p["key"])
            betas = set(re.findall(r" beta=(\S+)", log))
            assert kn.beta == "bz" and betas == {"0"}, (kn.base, betas)
    assert n > 400 and n_bias > 50
