"""GPU tests of `audit --measure` on grouped GEMMs (`python3 -m pytest -m gpu tests/test_gpu_grouped_audit.py`);
skipped with a reason where no GPU is visible (conftest): the captured Qwen3-MoE step's grouped rows measured
with their recorded sizes, every variant's numerics against the original, transformers' batched_mm."""
import json
from pathlib import Path

import pytest

from cublaslt_probe.analysis.audit import audit
from cublaslt_probe.runfiles import read_group_sizes

pytestmark = pytest.mark.gpu

RUN = Path(__file__).parent / "fixtures" / "moe" / "qwen3_moe"


@pytest.fixture(scope="module")
def probe():
    from cublaslt_probe.gpu.probe import Probe
    with Probe(reps=10, pipeline=False) as p:
        yield p


def _grouped_rows(run):
    from cublaslt_probe.cli._common import clean
    rows = [{k: clean(v) for k, v in r.items()} for r in audit(run).rows.to_dict("records")]
    return [r for r in rows if r["groups"] is not None]


def test_measure_times_every_variant_with_the_recorded_sizes(probe):
    from cublaslt_probe.gpu.measure import measure_gemms
    rows = _grouped_rows(RUN)
    assert len(rows) == 2
    res = measure_gemms(rows, probe=probe)
    sizes = read_group_sizes(RUN)[0]["sizes"]
    for g in res["gemms"]:
        assert not g.get("skipped") and not g.get("error"), g
        assert g["case"].endswith("sizes=" + ",".join(map(str, sizes))) and g["sizes_source"] == "recorded"
        names = [v["variant"] for v in g["grouped"]]
        assert names == ["original", "pad8", "pad16", "pad64", "pad128", "balanced", "bmm_padded", "fp8",
                         "mm_per_group", "batched_mm"]
        assert g["original_us"] > 0
        timed = [v for v in g["grouped"] if v["variant"] != "batched_mm"]
        assert all(v["time_us"] and v["time_us"] > 0 for v in timed), timed
        batched = g["grouped"][-1]
        assert batched["time_us"] is None and "GiB" in batched["not_run"]   # 16,384 rows x 2048 x 1536: too big
        for name in ("pad8", "pad16", "pad64", "pad128", "bmm_padded", "mm_per_group"):
            assert g["numerics"][name] is not None and g["numerics"][name] <= g["tolerance"], (name, g["numerics"])
        assert g["numerics"]["fp8"] is not None and g["numerics"]["fp8"] <= g["tolerance_fp8"]
        assert g["implementations"] == {"grouped_mm": "original", "eager": "mm_per_group", "batched_mm": "batched_mm"}


def test_batched_mm_runs_as_transformers_runs_it_where_it_fits(probe):
    """A decode-sized grouped GEMM (32 rows over 8 experts): transformers' batched_mm (the weights gathered per
    row) is timed and gives the grouped GEMM's output."""
    from cublaslt_probe.gpu.measure import measure_grouped
    sizes = [5, 0, 3, 8, 1, 7, 4, 4]
    g = {"op": "aten::_grouped_mm", "dtype": "bf16", "layout": "NT", "m": 32, "n": 512, "k": 256, "batch": 1,
         "groups": 8, "group_dim": "m", "group_sizes": json.dumps(sizes), "sizes_source": "recorded"}
    out = measure_grouped(probe, g)
    bm = next(v for v in out["grouped"] if v["variant"] == "batched_mm")
    assert bm["time_us"] > 0 and bm["kernels"]
    assert out["numerics"]["batched_mm"] <= out["tolerance"]
    assert out["group_summary"]["empty"] == 1


MIXTRAL = Path(__file__).parent / "fixtures" / "moe" / "mixtral_train"


def test_the_weight_gradients_rows_are_measured_with_their_sizes_along_k(probe):
    """The Mixtral step's weight-gradient grouped rows (offsets along k) are measured, not skipped: every
    variant timed, padded along k and the bmm giving the original's output."""
    from cublaslt_probe.gpu.measure import measure_grouped
    sizes = read_group_sizes(MIXTRAL)[0]["sizes"]
    rows = [r for r in _grouped_rows(MIXTRAL) if r["group_dim"] == "k"]
    assert len(rows) == 2
    for r in rows:
        g = measure_grouped(probe, r)
        assert "skipped" not in g and g["case"].endswith("k:sizes=" + ",".join(map(str, sizes))), g
        assert all(v["time_us"] and v["time_us"] > 0 for v in g["grouped"]), g["grouped"]
        for name in ("pad8", "pad128", "bmm_padded", "mm_per_group"):
            assert g["numerics"][name] is not None and g["numerics"][name] <= g["tolerance"], (name, g["numerics"])


def test_every_experts_variant_gives_the_originals_output_and_gradients(probe):
    """`experts_forward`: each variant's output and, under autograd, the gradients of the weights and the input
    match transformers' grouped_mm forward written out (fp8 within fp8's tolerance), all finite."""
    from cublaslt_probe.gpu.experts import experts_forward, quant_weight, route
    torch = probe.torch
    E, H, II, T, k = 8, 256, 128, 64, 2
    gen = torch.Generator(device="cuda").manual_seed(1)
    sizes = [40, 0, 7, 21, 13, 9, 17, 21]
    base = [(torch.randn(*s, device="cuda", generator=gen) * sc).to(torch.bfloat16)
            for s, sc in (((E, 2 * II, H), 0.05), ((E, H, II), 0.05), ((T, H), 1.0))]
    wts = torch.softmax(torch.randn(T, k, device="cuda", generator=gen), -1).to(torch.bfloat16)
    idx = route(torch, sizes, T, k)
    gy = torch.randn(T, H, device="cuda", generator=gen).to(torch.bfloat16)

    def run(variant):
        w1, w2, x = (t.clone().requires_grad_(True) for t in base)
        y = experts_forward(w1, w2, x, idx, wts, variant=variant, fp8_weights=lambda w: quant_weight(w.detach()))
        y.backward(gy)
        return [t.float() for t in (y, w1.grad, w2.grad, x.grad)]
    ref = run("original")
    for variant, tol in (("pad8", 0.02), ("pad128", 0.02), ("bmm_padded", 0.02), ("mm_per_group", 0.02),
                         ("batched_mm", 0.02), ("fp8", 0.2)):
        got = run(variant)
        for name, a, b in zip(("out", "dw1", "dw2", "dx"), got, ref):
            assert torch.isfinite(a).all(), (variant, name)
            err = ((a - b).abs().max() / b.abs().max()).item()
            assert err < tol, (variant, name, err)


@pytest.mark.parametrize("run", [RUN, MIXTRAL], ids=["qwen3_moe", "mixtral_train"])
def test_the_experts_whole_call_is_measured_for_every_variant(probe, run):
    """`measure_experts` on the captured programs' grouped rows: every variant of the experts' whole call
    timed (forward; forward and backward for the training step), batched_mm left out with the memory it would
    take, the outputs against the original's."""
    from cublaslt_probe.gpu.measure import measure_experts
    ex = measure_experts(probe, _grouped_rows(run))
    assert "skipped" not in ex and ex["scope"] == ("forward" if run == RUN else "forward and backward"), ex
    by = {v["variant"]: v for v in ex["variants"]}
    assert list(by) == ["original", "pad8", "pad16", "pad128", "balanced", "bmm_padded", "fp8", "mm_per_group",
                        "batched_mm"]
    assert all(v["time_us"] and v["time_us"] > 0 and v["error"] is None for n, v in by.items() if n != "batched_mm"), by
    assert "GiB" in by["batched_mm"]["not_run"]
    for name in ("pad8", "pad128", "bmm_padded", "mm_per_group"):
        assert ex["numerics"][name] <= ex["tolerance"], (name, ex["numerics"])
    assert 0 < ex["numerics"]["fp8"] < 0.2        # two fp8 GEMMs and the gate between: compared, not bounded
    assert ex["seconds"] < 10
