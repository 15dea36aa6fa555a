"""GPU tests (run on the device machine: `python3 -m pytest -m gpu`); skipped with a reason elsewhere."""
import pytest

from cublaslt_probe import dataset, sweep
from cublaslt_probe.cases import Case

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def probe():
    from cublaslt_probe.probe import Probe
    return Probe()


def test_quick_preset_end_to_end(probe, tmp_path):
    cases = sweep.plan("quick").cases
    out = str(tmp_path / "quick.parquet")
    df = sweep.run(cases, out, probe, progress=False)
    assert len(df) == len(cases)
    dataset.validate(dataset.read_parquet(out))
    ok = df[df.error.isna()]
    assert len(ok) >= 0.9 * len(df), df[df.error.notna()][["key", "error"]].to_string()
    assert (ok.n_kernels > 0).all()
    assert (ok.time_us > 0).all() and (ok.tflops > 0).all()
    assert (ok.heuristic_miss_us > 0).all() and (ok.heuristic_hit_us > 0).all()
    # every GEMM that went through cuBLASLt logged exactly one trace line, and its algo matches its kernel
    lt_rows = ok[ok.backend.isin(["torch", "torch-lt", "lt"])]
    assert lt_rows.algo_id.notna().all()
    assert (ok.consistent.dropna()).all()
    assert ok.consistent.notna().sum() >= 0.5 * len(ok)
    assert df.gpu.iloc[0].startswith("NVIDIA") and df.sm_count.iloc[0] > 0


def test_lt_backend_runs_the_algo_it_logged(probe):
    c = Case("lt", "mm", "bf16", "NT", 128, 4096, 4096)
    [rec] = probe.run_window([c])
    assert rec["error"] is None
    row = dataset.build([rec], probe.env).iloc[0]
    assert row.algo_tile == rec["lt_config"]["tile"]
    assert row.consistent


def test_candidates_are_run_and_compared(probe):
    from cublaslt_probe.probe import lt_candidates
    rows = lt_candidates(probe, Case("lt", "mm", "bf16", "NT", 256, 4096, 4096), top=8, reps=5)
    assert 1 <= len(rows) <= 8 and rows[0]["rank"] == 0
    ok = [r for r in rows if r["error"] is None]
    assert ok and all(r["kernels"] for r in ok)
    assert all(r["max_rel_diff_vs_0"] < 2e-2 for r in ok)


def test_error_rows_do_not_stop_a_window(probe):
    bad = Case("torch", "scaled_mm", "fp8", "NT", 3, 5, 7)       # K not a multiple of 16: torch refuses
    good = Case("torch", "mm", "fp16", "NN", 64, 64, 64)
    recs = probe.run_window([bad, good])
    assert recs[0]["error"] and "16" in recs[0]["error"]
    assert recs[1]["error"] is None and recs[1]["kernels"]
