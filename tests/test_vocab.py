"""One definition per kind of value (`cublaslt_probe.vocab`), and the modules that read it."""
import dataclasses

import pytest

from cublaslt_probe import vocab
from cublaslt_probe.analysis import diff
from cublaslt_probe.cases import Case, invalid_reason
from cublaslt_probe.cli import main
from cublaslt_probe.logs import LogRecord
from cublaslt_probe.names import KernelName
from cublaslt_probe.render.plots.select import ordered


def _choices(command: str, option: str) -> tuple:
    param = next(p for p in main.commands[command].params if p.name == option)
    return tuple(param.type.choices)


def test_the_gpu_commands_offer_the_kinds():
    for cmd in ("candidates", "first-call", "explain"):
        assert _choices(cmd, "dtype") == vocab.DTYPES
        assert _choices(cmd, "layout") == vocab.LAYOUTS
        assert _choices(cmd, "op") == vocab.OPS
    assert _choices("explain", "backend") == vocab.BACKENDS
    assert set(_choices("first-call", "backend")) < set(vocab.BACKENDS)


def test_cases_check_against_the_kinds():
    for b in vocab.BACKENDS:
        assert not (invalid_reason(Case(b, "mm", "fp32", "NN", 8, 8, 8)) or "").startswith("unknown backend")
    assert invalid_reason(Case("numpy", "mm", "fp32", "NN", 8, 8, 8)).startswith("unknown backend 'numpy'")
    assert "choose from torch, torch-lt, cupy, lt" in invalid_reason(Case("x", "mm", "fp32", "NN", 8, 8, 8))


def test_display_order_is_the_kinds_order():
    assert ordered(["numpy", "cupy", "lt", "torch-lt", "torch"], "backend") == list(vocab.ORDER["backend"])
    assert ordered(list(reversed(vocab.DTYPES)) + ["int8"], "dtype") == list(vocab.DTYPES) + ["int8"]


def test_diff_refuses_the_environment_keys_resume_and_merge_refuse():
    assert diff.ENV_CHECKED == vocab.ENV_MATCH and set(vocab.ENV_MATCH) <= set(vocab.ENV_KEYS)
    a = {k: "x" for k in vocab.ENV_KEYS}
    for k in vocab.ENV_KEYS:
        changed = diff.env_differences(a, {**a, k: "y"})
        assert [d[0] for d in changed] == ([k] if k in vocab.ENV_MATCH else [])


@pytest.mark.parametrize("gpu, product", [("NVIDIA H200", "H200 SXM"), ("NVIDIA H200 NVL", "H200 NVL"),
                                          ("NVIDIA H100 80GB HBM3", "H100 SXM"), ("NVIDIA H100 PCIe", "H100 PCIe"),
                                          ("NVIDIA H100 NVL", "H100 NVL"), ("H100 PCIe", "H100 PCIe")])
def test_peaks_are_keyed_by_the_exact_product(gpu, product):
    assert vocab.gpu_peaks(gpu).product == product
    assert vocab.peak_tflops("bf16", gpu) == vocab.PEAKS[product].tflops["bf16"]


@pytest.mark.parametrize("gpu", ["NVIDIA H100", "NVIDIA A100-SXM4-80GB", "NVIDIA GH200 480GB", "", None,
                                 "cpu (numpy)"])
def test_an_unknown_gpu_has_an_unknown_peak(gpu):
    assert vocab.gpu_peaks(gpu) is None and vocab.peak_tflops("bf16", gpu) is None


def test_the_peak_tables_are_frozen_and_complete():
    for p in vocab.PEAKS.values():
        assert set(p.tflops) == set(vocab.DTYPES) and p.hbm_tbps > 0
        assert p.tflops["fp8"] > p.tflops["bf16"] == p.tflops["fp16"] > p.tflops["tf32"] > p.tflops["fp32"]
    with pytest.raises(TypeError):
        vocab.PEAKS["H200 SXM"].tflops["bf16"] = 1.0
    assert set(vocab.GPU_PRODUCTS.values()) == set(vocab.PEAKS)


def test_a_field_name_the_decoder_and_the_log_parser_share_has_one_type():
    """A field name both `KernelName` and `LogRecord` (and the cuBLAS API log's `CublasCall`) carry means one
    thing with one type: the log's own values have their own names (op_a, algo_stages, num_splits_k,
    beta_value, file)."""
    from cublaslt_probe.logs import CublasCall
    dec = {f.name: str(f.type) for f in dataclasses.fields(KernelName)}
    logged = {f.name: str(f.type) for f in dataclasses.fields(LogRecord)}
    differ = {n for n in dec.keys() & logged.keys() if dec[n] != logged[n]}
    assert differ == set()
    assert dec["split_k"] == "bool | None" and "split_k" not in logged and logged["num_splits_k"] == "int | None"
    assert {"trans_a", "trans_b", "stages", "beta", "source"}.isdisjoint(logged)
    call = {f.name for f in dataclasses.fields(CublasCall)} | {n for n in dir(CublasCall) if not n.startswith("_")}
    assert {"op_a", "op_b", "file"} <= call and {"trans_a", "trans_b", "source"}.isdisjoint(call)


@pytest.mark.parametrize("case, says", [
    (Case("torch", "gemm", "bf16", "NT", 8, 8, 8),
     "unknown op 'gemm' in torch/gemm/bf16/NT: choose from mm, bmm, addmm, scaled_mm"),
    (Case("torch", "mm", "bf8", "NT", 8, 8, 8),
     "unknown dtype 'bf8' in torch/mm/bf8/NT: choose from fp32, tf32, fp16, bf16"),
    (Case("torch", "mm", "bf16", "NX", 8, 8, 8), "unknown layout 'NX' in torch/mm/bf16/NX: choose from NN, NT, TN, TT"),
    (Case("torch", "mm", "bf16", "NT", 0, 8, 8), "non-positive size in torch/mm/bf16/NT m=0"),
    (Case("torch", "mm", "fp8", "NT", 8, 8, 16), "fp8 runs only as op scaled_mm"),
    (Case("lt", "scaled_mm", "fp8", "NN", 16, 16, 16), "fp8 scaled_mm needs layout NT"),
    (Case("torch", "bmm", "bf16", "NN", 8, 8, 8, 1), "bmm needs batch >= 2"),
    (Case("torch", "mm", "bf16", "NN", 8, 8, 8, 4), "batch=4 is only meaningful for op bmm"),
    (Case("cupy", "mm", "bf16", "NN", 8, 8, 8), "the cupy backend runs fp32 and fp16 only"),
    (Case("cupy", "addmm", "fp16", "NN", 8, 8, 8), "cupy has no fused addmm"),
])
def test_a_case_outside_the_kinds_says_which_and_what_to_choose(case, says):
    assert says in invalid_reason(case)


def test_a_case_key_round_trips_and_counts_its_flops():
    c = Case("torch-lt", "bmm", "fp16", "TN", 3, 5, 7, 2)
    assert Case.from_key(c.key) == c and c.flops == 2 * 3 * 5 * 7 * 2


def test_decoded_columns_have_the_decoders_types():
    """One type per decoded field: the column type of each `DECODED_COLUMNS` entry is its KernelName type."""
    types = {f.name: str(f.type) for f in dataclasses.fields(KernelName)}
    column = {"int | None": "Int64", "bool | None": "boolean", "str": "category"}
    for name, (dtype, _) in vocab.DECODED_COLUMNS.items():
        if name == "kernel_short":
            assert isinstance(KernelName(name="x").short, str) and dtype == "string"
            continue
        assert column[types[name]] == dtype, name
    from cublaslt_probe.analysis import dataset
    assert all(dataset.SCHEMA[c] == vocab.DECODED_COLUMNS[c] for c in vocab.DECODED_COLUMNS)
