"""The dataset builder on real H200 probe records (tests/fixtures/probe, see its PROVENANCE)."""
import json
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from cublaslt_probe.analysis import dataset
from cublaslt_probe.cli import main
from cublaslt_probe.errors import SchemaError

FIXTURES = Path(__file__).resolve().parent / "fixtures"
DATA = Path(__file__).resolve().parent.parent / "data"


@pytest.fixture(scope="module")
def raw():
    env = json.loads((FIXTURES / "probe" / "env.json").read_text())
    _, recs = dataset.read_raw(FIXTURES / "probe" / "probe_raw.jsonl")
    return env, recs


@pytest.fixture(scope="module")
def df(raw):
    env, recs = raw
    return dataset.build(recs, env)


def test_schema_and_rows(df, raw):
    env, recs = raw
    dataset.validate(df)
    assert list(df.columns) == dataset.COLUMNS
    assert len(df) == len(recs) == 1344
    assert (df.gpu == "NVIDIA H200").all() and (df.sm_count == 132).all()
    assert (df.cublaslt_version == env["cublaslt_version"]).all()


def test_error_rows_are_the_fp8_shapes_cublaslt_refused(df):
    err = df[df.error.notna()]
    assert len(err) == 16
    assert set(err.op) == {"scaled_mm"}
    assert ((err.k % 16 != 0) | (err.n % 16 != 0)).all()
    assert err.time_us.isna().all() and err.kernel.isna().all()


def test_every_comparable_row_is_consistent(df):
    comp = df[df.consistent.notna()]
    assert len(comp) >= 1100
    assert comp.consistent.all()
    # nvjet names carry the logged tile as written; xmma names carry it swapped (measured)
    nv = df[(df.family == "nvjet") & df.algo_tile.notna()]
    assert (nv.tile_m.astype(str) + "x" + nv.tile_n.astype(str) == nv.algo_tile).all()
    xm = df[(df.family == "xmma") & df.algo_tile.notna()]
    assert len(xm) > 100 and (xm.tile_n.astype(str) + "x" + xm.tile_m.astype(str) == xm.algo_tile).all()
    # nvjet `splitK` <=> logged numSplitsK > 1
    assert (nv.split_k == (nv.algo_split_k > 1)).all()
    assert nv.split_k.sum() > 50


def test_every_logged_call_of_the_capture_is_the_gemm_asked_for(df):
    """The capture's logged function and compute type agree with each case's library path
    (`evidence.library_path`), including torch addmm with one row or column in B (K = 1 or N = 1), which
    torch runs through the cuBLAS API; the calls that logged no line are cupy's 1x1 GEMMs."""
    ok = df[df.error.isna()]
    logged = ok[ok.log_matches_case.notna()]
    assert len(logged) == 1320 and logged.log_matches_case.all(), \
        logged[~logged.log_matches_case][["key", "log_function"]].to_string()
    assert set(ok[ok.log_matches_case.isna()].backend) == {"cupy"}
    thin = logged[(logged.backend == "torch") & (logged.op == "addmm") & ((logged.k == 1) | (logged.n == 1))]
    assert len(thin) == 32 and (thin.log_function != "cublasLtMatmul").all()


def test_the_lt_backend_log_agrees_with_the_algo_config_it_ran(df):
    lt = df[(df.backend == "lt") & df.error.isna() & df.lt_algo_tile.notna() & df.algo_tile.notna()]
    assert len(lt) > 200
    assert (lt.lt_algo_tile == lt.algo_tile).all()


def test_views_and_arithmetic(df):
    ok = df[df.error.isna()]
    assert ((ok.blas_m == ok.n) & (ok.blas_n == ok.m) & (ok.blas_k == ok.k)).all()
    assert (ok.blas_trans_a == ok.layout.str[1]).all() and (ok.blas_trans_b == ok.layout.str[0]).all()
    flops = 2 * ok.m * ok.n * ok.k * ok.batch
    assert ((flops / ok.time_us / 1e6 - ok.tflops).abs() < 1e-9).all()
    assert (ok.heuristic_hit_us < ok.heuristic_miss_us).mean() > 0.9
    r = ok[(ok.key == "torch|mm|bf16|NT|4096|4096|4096|1")].iloc[0]
    assert r.family == "nvjet" and r.log_function == "cublasLtTSTMatmul" and r.tflops > 500
    assert r.kernel in r.kernels


def test_main_kernel_skips_memsets_and_reduce_kernels(df):
    two = df[df.n_kernels >= 2]
    assert len(two) > 100
    assert not two.kernel.str.startswith("Memset").any()
    assert not two.kernel.str.contains("splitKreduce").any()


def test_parquet_roundtrip_keeps_env(df, raw, tmp_path):
    env, _ = raw
    p = tmp_path / "d.parquet"
    dataset.write_parquet(df, p, env)
    back = dataset.read_parquet(p)
    assert back.attrs["env"]["driver"] == env["driver"]
    assert list(back.kernels.iloc[0]) == list(df.kernels.iloc[0])
    pd.testing.assert_series_equal(back.time_us, df.time_us)


def test_validate_names_what_is_wrong(df):
    with pytest.raises(SchemaError, match=r"lacks columns \['kernel'\]"):
        dataset.validate(df.drop(columns=["kernel"]))
    with pytest.raises(SchemaError, match="duplicate rows for key"):
        dataset.validate(pd.concat([df.head(2), df.head(1)]))
    bad = df.copy()
    bad["time_us"] = "fast"
    with pytest.raises(SchemaError, match=r"time_us \(object|time_us \(str"):
        dataset.validate(bad)


def test_cli_dataset_and_schema(tmp_path):
    out = tmp_path / "d.parquet"
    r = CliRunner().invoke(main, ["dataset", str(FIXTURES / "probe" / "probe_raw.jsonl"), "--env",
                                  str(FIXTURES / "probe" / "env.json"), "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert r.output.strip() == f"wrote {out}: 1344 rows, 16 error rows, 1166 consistent / 1166 comparable"
    r = CliRunner().invoke(main, ["schema"])
    assert r.exit_code == 0 and "| `consistent` | boolean |" in r.output
    r = CliRunner().invoke(main, ["dataset", str(tmp_path / "missing.jsonl"), "-o", str(out)])
    assert r.exit_code == 1 and "Error: raw file" in r.output


def test_log_matches_case_flags_the_gemms_that_ran_under_another_gemms_flags():
    """A real llm capture from before the flags fix (tests/fixtures/probe/PROVENANCE.md): the check names
    exactly the 16 GEMMs whose logged call ran under the previous GEMM's flags, and passes the 16 that did not."""
    env, recs = dataset.read_raw(FIXTURES / "probe" / "leaked_flags_raw.jsonl")
    df = dataset.build(recs, env)
    bad = df[df.log_matches_case == False]  # noqa: E712
    assert len(df) == 32 and len(bad) == 16 and df.log_matches_case.notna().all()
    # the three ways it leaked, each read from the log line, not from the key
    tf32_as_fp32 = bad[(bad.dtype == "fp32")]
    assert len(tf32_as_fp32) == 2
    assert all("COMPUTE_32F_FAST_TF32" in r["log_lines"][0] for r in recs if r["key"] in set(tf32_as_fp32.key))
    assert (bad[(bad.backend == "torch") & (bad.dtype != "fp32")].log_function.isin(
        ["cublasLtMatmul", "cublasLtSSSMatmul"])).all()
    assert (bad[(bad.backend == "torch-lt") & (bad.dtype != "tf32")].log_function != "cublasLtMatmul").all()
    # every GEMM whose logged algo disagreed with its profiled kernel in that capture is among the flagged
    assert set(df[df.consistent == False].key) <= set(bad.key)  # noqa: E712


@pytest.mark.parametrize("name", ["llm", "square", "grid", "regret"])
def test_data_file_carries_its_timing_evidence(name):
    """A check of the shipped data files data/h200_*.parquet: each logged call is the GEMM asked for; the GPU never
    idled between timing samples beyond the events' own cost (the spin covered the host); short GEMMs were timed
    in batches of 3-5 calls, and the first call after an event paid a boundary cost that the differential sample
    removed."""
    df = dataset.read_parquet(DATA / f"h200_{name}.parquet")
    ok = df[df.error.isna()]
    assert ok.log_matches_case.all() and (ok.consistent.dropna()).all()
    assert (ok.time_gap_us / ok.time_reps <= 2.0).all()
    short = ok[ok.time_us < 50]
    assert len(short) > 100 and short.time_calls_per_rep.between(3, 5).all()
    assert 1.0 < (short.time_us_first - short.time_us).median() < 3.0
    assert (ok.time_us_first >= 0.9 * ok.time_us).mean() > 0.99
    assert ok.heuristic_miss_us.notna().all() and (ok.heuristic_shared >= 1).all()


def test_a_capture_with_the_lead_spin_carries_its_evidence():
    """A real llm capture timed behind the spin sized to the host's lead over the GPU (timing_spin): every
    batch was queued before the GPU reached it (time_behind 0), the GPU idled only the events' cost between
    samples; the GEMMs whose first attempt fell behind were retaken behind a longer spin, and that first
    attempt is kept; for a GEMM longer than its launch the spin is shorter than the host's enqueue time."""
    env, recs = dataset.read_raw(FIXTURES / "probe" / "lead_spin_raw.jsonl")
    df = dataset.build(recs, env)
    dataset.validate(df)
    assert len(df) == 60 and df.error.isna().all()
    assert df.time_behind.notna().all() and (df.time_behind == 0).all()
    assert (df.time_gap_us / df.time_reps <= 2.0).all()
    timing = {r["key"]: r["timing"] for r in recs}
    retaken = [t for t in timing.values() if t["attempts"] == 2]
    assert len(retaken) == 12
    for t in retaken:
        assert t["retaken"]["behind"] > 0 or t["retaken"]["gap_us"] > 0
        assert t["spin_us"] > t["retaken"]["spin_us"]
    once = df[df.key.map(lambda k: timing[k]["attempts"] == 1)]
    host = once.key.map(lambda k: timing[k]["enqueue_us"]) / (once.time_reps * once.time_calls_per_rep)
    spin = once.key.map(lambda k: timing[k]["spin_us"])
    enqueue = once.key.map(lambda k: timing[k]["enqueue_us"])
    # the whole-enqueue rule gave spin > 1.25 x enqueue for every GEMM; here, for GEMMs longer than their
    # launch and timed in many calls, the spin is a fraction of the enqueue time
    longer = (once.time_us > 2 * host) & (once.time_reps * once.time_calls_per_rep >= 15)
    assert longer.sum() >= 5 and (spin[longer] < 0.8 * enqueue[longer]).all(), \
        pd.DataFrame({"spin": spin, "enqueue": enqueue})[longer]
    # the old captures (whole-enqueue spin) have no such column: null, not 0
    old = dataset.read_parquet(DATA / "h200_square.parquet")
    assert old.time_behind.isna().all()


def test_every_writer_shares_one_core_that_writes_whole_or_not_at_all(raw, tmp_path):
    """`record_tables` + `write_tables`, which the dataset command, `merge` and `sweep` all write through: the
    rows of the real capture in row groups of `batch`; a failure part-way leaves the earlier file as it was and
    no temporary file."""
    import pyarrow.parquet as pq
    env, recs = raw
    recs = [dict(r) for r in recs]
    schema = dataset.arrow_schema(env)
    out = tmp_path / "d.parquet"
    n = dataset.write_tables((t for t, _ in dataset.record_tables(recs, env, schema, batch=100)), out, schema)
    assert n == len(recs) and pq.ParquetFile(out).metadata.num_row_groups == -(-len(recs) // 100)
    whole = dataset.read_parquet(out)
    assert list(whole.key) == [r["key"] for r in recs] and whole.attrs["env"] == env

    def failing():
        for i, (t, _) in enumerate(dataset.record_tables(recs, env, schema, batch=50)):
            if i == 2:
                raise OSError("disk full")
            yield t
    with pytest.raises(OSError, match="disk full"):
        dataset.write_tables(failing(), out, schema)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.parquet"]
    pd.testing.assert_frame_equal(dataset.read_parquet(out), whole)
