"""GPU tests of `audit --measure` on grouped GEMMs (`python3 -m pytest -m gpu tests/test_gpu_grouped_audit.py`);
skipped with a reason where no GPU is visible (conftest): the captured Qwen3-MoE step's grouped rows measured
with their recorded sizes, every variant's numerics against the original, transformers' batched_mm."""
import json
from pathlib import Path

import pytest

from cublaslt_probe.audit import audit
from cublaslt_probe.recorder import read_group_sizes

pytestmark = pytest.mark.gpu

RUN = Path(__file__).parent / "fixtures" / "moe" / "qwen3_moe"


@pytest.fixture(scope="module")
def probe():
    from cublaslt_probe.probe import Probe
    with Probe(reps=10, pipeline=False) as p:
        yield p


def _grouped_rows(run):
    from cublaslt_probe.cli._common import clean
    rows = [{k: clean(v) for k, v in r.items()} for r in audit(run).rows.to_dict("records")]
    return [r for r in rows if r["groups"] is not None]


def test_measure_times_every_variant_with_the_recorded_sizes(probe):
    from cublaslt_probe.measure import measure_gemms
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
    from cublaslt_probe.measure import measure_grouped
    sizes = [5, 0, 3, 8, 1, 7, 4, 4]
    g = {"op": "aten::_grouped_mm", "dtype": "bf16", "layout": "NT", "m": 32, "n": 512, "k": 256, "batch": 1,
         "groups": 8, "group_dim": "m", "group_sizes": json.dumps(sizes), "sizes_source": "recorded"}
    out = measure_grouped(probe, g)
    bm = next(v for v in out["grouped"] if v["variant"] == "batched_mm")
    assert bm["time_us"] > 0 and bm["kernels"]
    assert out["numerics"]["batched_mm"] <= out["tolerance"]
    assert out["group_summary"]["empty"] == 1
