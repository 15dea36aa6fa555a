"""`cublaslt-probe diff` on the real H200 datasets in data/ (see data/ and tests/fixtures/probe/PROVENANCE.md).

The genuine difference on one GPU: torch's cuBLAS path (32 MiB workspace) against its cuBLASLt path (1 MiB)
in data/h200_llm.parquet. Expected counts come from an independent pandas merge, not from the module.
"""
from __future__ import annotations

import json
import pathlib

import pandas as pd
import pytest
from click.testing import CliRunner

from cublaslt_probe.analysis import dataset
from cublaslt_probe.analysis.diff import KEY, EnvMismatch, diff, diff_files, kernel_change, kernel_label, sort_rows
from cublaslt_probe.cli import main
from cublaslt_probe.errors import ProbeError
from cublaslt_probe.render.plots import diff_map

DATA = pathlib.Path(__file__).parent.parent / "data"
LLM = DATA / "h200_llm.parquet"
SQUARE = DATA / "h200_square.parquet"


@pytest.fixture(scope="module")
def llm():
    return dataset.read_parquet(LLM)


@pytest.fixture(scope="module")
def paths(llm):
    r = diff(llm, llm, ("torch", "torch-lt"))
    return r


def oracle(a: pd.DataFrame, b: pd.DataFrame, ba: str, bb: str) -> dict:
    """Counts by a plain merge of the two backends' rows."""
    x = a[a.backend.astype(str) == ba][KEY + ["kernel", "time_us"]]
    y = b[b.backend.astype(str) == bb][KEY + ["kernel", "time_us"]]
    m = x.merge(y, on=KEY, how="outer", indicator=True, suffixes=("_a", "_b"))
    both = m[m._merge == "both"]
    meas = both[both.kernel_a.notna() & both.kernel_b.notna()]
    return {"only_a": int((m._merge == "left_only").sum()), "only_b": int((m._merge == "right_only").sum()),
            "both": len(both), "unmeasured": len(both) - len(meas),
            "changed": int((meas.kernel_a != meas.kernel_b).sum()),
            "same": int((meas.kernel_a == meas.kernel_b).sum()),
            "slower": int((both.time_us_b > 1.05 * both.time_us_a).sum()),
            "faster": int((both.time_us_b < 0.95 * both.time_us_a).sum()),
            "within": int(((both.time_us_b >= 0.95 * both.time_us_a)
                           & (both.time_us_b <= 1.05 * both.time_us_a)).sum())}


def test_torch_vs_torch_lt_counts_match_a_plain_merge(llm, paths):
    want = oracle(llm, llm, "torch", "torch-lt")
    got = {k: paths.summary[k] for k in want}
    assert got == want
    # the measured fact the diff rests on: the two torch paths pick different kernels on hundreds of shapes
    assert want["changed"] > 300 and want["same"] > 1500
    assert paths.summary["rows_a"] == (llm.backend == "torch").sum()
    assert paths.summary["rows_b"] == (llm.backend == "torch-lt").sum()


def test_only_in_a_is_scaled_mm_which_has_no_torch_lt_row(paths):
    only = paths.joined[paths.joined.status == "only_a"]
    assert set(only.op.astype(str)) == {"scaled_mm"}


def test_changed_rows_carry_both_kernels_and_the_change(llm, paths):
    ch = paths.changed()
    assert len(ch) == paths.summary["changed"]
    assert (ch.kernel_a != ch.kernel_b).all()
    assert ch.change.notna().all() and (ch.change != "").all()
    # time change is B against A, in %
    assert (ch.time_change_pct - 100 * (ch.time_us_b / ch.time_us_a - 1)).abs().max() < 1e-9
    assert (ch.tflops_change_pct - 100 * (ch.tflops_b / ch.tflops_a - 1)).abs().max() < 1e-9
    # sorted by |time change|, largest first
    mags = ch.time_change_pct.abs().to_numpy()
    assert (mags[:-1] >= mags[1:]).all()
    # decoded fields come from each side's row of the dataset
    row = ch.iloc[0]
    a = llm[llm.key == row.key_a].iloc[0]
    b = llm[llm.key == row.key_b].iloc[0]
    assert (row.kernel_a, row.tile_m_a, row.kernel_short_b) == (a.kernel, a.tile_m, b.kernel_short)


def test_speed_classes_partition_the_measured_rows(paths):
    s = paths.summary
    measured = paths.joined.time_change_pct.notna().sum()
    assert s["faster"] + s["slower"] + s["within"] == measured
    assert s["changed_faster"] + s["changed_slower"] + s["changed_within"] <= s["changed"]


def test_same_dataset_without_backends_is_all_same(llm):
    r = diff(llm, llm)
    s = r.summary
    assert s["changed"] == 0 and s["only_a"] == 0 and s["only_b"] == 0
    assert s["same"] + s["unmeasured"] == len(llm)
    assert s["slower"] == s["faster"] == 0


def test_two_sweeps_of_one_gpu_join_on_their_common_shapes():
    a, b = dataset.read_parquet(LLM), dataset.read_parquet(SQUARE)
    r = diff(a, b)
    # oracle over all backends at once: join on backend too
    m = a[KEY + ["backend", "kernel"]].merge(b[KEY + ["backend", "kernel"]], on=KEY + ["backend"], how="inner")
    assert r.summary["both"] == len(m)
    assert r.summary["only_a"] == len(a) - len(m) and r.summary["only_b"] == len(b) - len(m)


@pytest.mark.parametrize("a,b,want", [
    ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_splitK_TNT", "nvjet_sm90_tst_128x128_64x6_2x1_v_bz_TNT",
     "tile 256x128→128x128; k×stages 64x4→64x6; cluster 1x2→2x1; splitK yes→no; raster h→v; flags -coopA"),
    ("sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x64x32_warpgroupsize1x1x1_execute_segment_k_on_kernel__5x_cublas",
     "sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x64x32_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas",
     "segment-K yes→no"),
    ("nvjet_sm90_tst_64x8_64x16_4x1_v_bz_splitK_NNT", "nvjet_sm90_tst_64x8_64x16_4x1_v_bz_splitK_NNT", None),
])
def test_kernel_change(a, b, want):
    assert kernel_change(a, b) == want


def test_kernel_label_names_helpers_by_function(llm):
    gemvx = llm[llm.kernel.str.contains("gemvx::kernel", regex=False, na=False)].kernel.iloc[0]
    assert kernel_label(gemvx) == "gemvx::kernel"
    assert kernel_label("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT") == "256x128 · 64x4 · 1x2 · coopA"
    assert kernel_label(None) is None


# ------------------------------------------------------------------------------------- environments
@pytest.fixture(scope="module")
def other_gpu(tmp_path_factory, llm):
    """The llm dataset with its recorded environment altered (GPU and driver): the refusal must trigger."""
    env = dict(llm.attrs["env"], gpu="NVIDIA B200", driver="590.10")
    df = llm.copy()
    df["gpu"] = "NVIDIA B200"
    df["driver"] = "590.10"
    df = dataset.coerce(df)
    p = tmp_path_factory.mktemp("env") / "b200_llm.parquet"
    dataset.write_parquet(df, p, env)
    return p


def test_env_mismatch_is_refused_and_named(other_gpu):
    with pytest.raises(EnvMismatch) as e:
        diff_files(LLM, other_gpu)
    msg = str(e.value)
    assert "gpu NVIDIA H200 in A vs NVIDIA B200 in B" in msg
    assert "driver 580.159.04 in A vs 590.10 in B" in msg
    assert "cublaslt_version" not in msg and "torch_version" not in msg
    assert "--allow-env-mismatch" in msg
    assert isinstance(e.value, ProbeError)


def test_env_mismatch_allowed_lists_the_differences(other_gpu):
    r = diff_files(LLM, other_gpu, allow_env_mismatch=True)
    assert [d[0] for d in r.env_diff] == ["gpu", "driver"]
    assert r.summary["changed"] == 0 and r.summary["only_a"] == 0


def test_unrecorded_env_on_one_side_counts_as_a_difference(llm):
    b = llm.copy()
    b.attrs = {"env": {}}
    b = b.drop(columns=["torch_version"])
    with pytest.raises(EnvMismatch, match=r"torch_version 2\.11\.0\+cu130 in A vs \(unknown\) in B"):
        diff(llm, b)


def test_unknown_backend_lists_the_backends(llm):
    with pytest.raises(ProbeError, match="no rows with backend 'cublas'; backends there: cupy, lt, torch, torch-lt"):
        diff(llm, llm, ("cublas", "torch"))


def test_same_backend_on_both_sides_of_one_file_is_all_same(llm):
    r = diff(llm, llm, ("lt", "lt"))
    assert r.summary["changed"] == 0 and r.summary["both"] == (llm.backend == "lt").sum()


# ----------------------------------------------------------------------------------------------- map
def test_diff_map_reuses_the_path_difference_map(paths):
    from matplotlib.figure import Figure
    fig = diff_map(paths.joined, x="m", y="n")
    assert isinstance(fig, Figure)
    info = fig._cublaslt_probe
    # the map pins bf16 NT mm K=4096 (the map defaults); count the same cells from the joined rows
    j = paths.joined
    cell = j[(j.dtype == "bf16") & (j.layout == "NT") & (j.op == "mm") & (j.k == 4096) & (j.batch == 1)]
    measured = cell[cell.kernel_a.notna() & cell.kernel_b.notna()]
    assert info == {"shapes": len(measured), "different": int((measured.status == "changed").sum())}


def test_diff_map_without_backends_maps_one_backend(llm):
    r = diff(llm, llm)
    fig = diff_map(r.joined, x="m", y="nk", backend="torch-lt", dtype="fp16")
    assert fig._cublaslt_probe["different"] == 0


# ----------------------------------------------------------------------------------------------- CLI
def run(*args):
    return CliRunner().invoke(main, ["diff", *map(str, args)])


HEADER = """\
A: {p} [torch]  ({rows_a:,} GEMMs)
B: {p} [torch-lt]  ({rows_b:,} GEMMs)
environment: gpu NVIDIA H200 · cublaslt_version 13.1.0 · torch_version 2.11.0+cu130 · driver 580.159.04 (the same on both sides)
in both: {both:,}: same kernel {same:,}, changed {changed:,}, unmeasured {unmeasured:,}; only in A: {only_a:,}; only in B: {only_b:,}
B against A (time, ±5%): {faster:,} faster, {slower:,} slower, {within:,} within; where the kernel changed: \
{changed_faster:,} faster, {changed_slower:,} slower, {changed_within:,} within

op  dtype  layout"""  # noqa: E501  the command's exact output


def test_cli_table_exact(llm):
    """Header exact (its numbers from the plain merge); the rows are the largest time changes, in order."""
    r = run(LLM, LLM, "--backends", "torch,torch-lt", "--top", "3")
    assert r.exit_code == 0, r.output
    want = oracle(llm, llm, "torch", "torch-lt")
    x = llm[llm.backend == "torch"].merge(llm[llm.backend == "torch-lt"], on=KEY, suffixes=("_a", "_b"))
    x = x[x.kernel_a.notna() & x.kernel_b.notna() & (x.kernel_a != x.kernel_b)]
    change = 100 * (x.time_us_b / x.time_us_a - 1)
    slow = (change > 5).sum()
    fast = (change < -5).sum()
    counts = dict(want, rows_a=(llm.backend == "torch").sum(), rows_b=(llm.backend == "torch-lt").sum(),
                  changed_faster=fast, changed_slower=slow, changed_within=len(x) - fast - slow)
    head = HEADER.format(p=LLM, **counts)
    assert r.stdout.startswith(head)
    lines = r.stdout[len(head) - len("op  dtype  layout"):].splitlines()
    assert lines[0].split() == ["op", "dtype", "layout", "m", "n", "k", "batch", "kernel", "A", "kernel", "B",
                                "change", "A", "us", "B", "us", "time", "TFLOP/s", "A", "TFLOP/s", "B"]
    assert set(lines[1]) == {"-", " "}
    top = x.assign(c=change).reindex(change.abs().sort_values(ascending=False, kind="stable").index).head(3)
    for line, row in zip(lines[2:5], top.itertuples()):
        assert line.split()[:7] == [row.op, row.dtype, row.layout, str(row.m), str(row.n), str(row.k), "1"]
        assert line.endswith(f"{row.c:+.1f}%  {row.tflops_a:9,.1f}  {row.tflops_b:9,.1f}")
    assert lines[5] == f"… {want['changed'] - 3:,} more rows (--top 0 shows all)"


def test_cli_env_mismatch_is_a_clean_error(other_gpu):
    r = run(LLM, other_gpu)
    assert r.exit_code == 1
    assert r.stderr.startswith("Error: the datasets come from different environments: gpu NVIDIA H200 in A vs "
                               "NVIDIA B200 in B; driver 580.159.04 in A vs 590.10 in B")
    r = run(LLM, other_gpu, "--allow-env-mismatch", "--dtype", "bf16")
    assert r.exit_code == 0
    assert "environment differs (--allow-env-mismatch): gpu NVIDIA H200 → NVIDIA B200; driver 580.159.04 → " \
           "590.10" in r.stdout
    assert "no GEMM changed kernel" in r.stdout


def test_cli_jsonl_csv_parquet_agree(tmp_path, paths):
    r = run(LLM, LLM, "--backends", "torch,torch-lt", "--format", "jsonl")
    rows = [json.loads(x) for x in r.stdout.splitlines()]
    assert len(rows) == paths.summary["changed"]
    assert {x["status"] for x in rows} == {"changed"}
    out = tmp_path / "d.parquet"
    r = run(LLM, LLM, "--backends", "torch,torch-lt", "--all", "-o", out)
    assert r.exit_code == 0 and r.stderr == f"wrote {len(paths.joined):,} rows to {out}\n"
    back = pd.read_parquet(out)
    assert len(back) == len(paths.joined)
    assert back.status.astype(str).value_counts().to_dict() == \
        {k: v for k, v in paths.joined.status.astype(str).value_counts().to_dict().items()}
    csv = tmp_path / "d.csv"
    run(LLM, LLM, "--backends", "torch,torch-lt", "-o", csv)
    assert len(pd.read_csv(csv)) == paths.summary["changed"]
    assert rows[0]["kernel_a"] == sort_rows(paths.joined[paths.joined.status == "changed"]).kernel_a.iloc[0]


def test_cli_filters_and_map(tmp_path):
    png = tmp_path / "map.png"
    r = run(LLM, LLM, "--backends", "torch,torch-lt", "--dtype", "fp16", "--layout", "NT", "--map", png,
            "--y", "nk", "--top", "1")
    assert r.exit_code == 0, r.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "wrote map" in r.stderr
    assert "\nmm  fp16   NT" in r.stdout


def test_cli_errors():
    r = run(LLM, LLM, "--backends", "a,b,c")
    assert r.exit_code == 2 and "BACKEND_A,BACKEND_B" in r.output
    r = run(LLM, "nope.parquet")
    assert r.exit_code == 1 and r.stderr.startswith("Error: no dataset at nope.parquet")
    r = run(LLM, LLM, "--map", "x.gif")
    assert r.exit_code == 2 and "--map x.gif: `diff` writes .png, .svg or .pdf, not .gif" in r.stderr
    r = run(LLM, LLM, "--dtype", "fp64")
    assert r.exit_code == 1 and "no rows in dataset A with dtype in ['fp64']" in r.stderr


def test_docs_describe_every_column(paths):
    doc = (pathlib.Path(__file__).parent.parent / "docs" / "diff.md").read_text()
    for col in paths.joined.columns:
        root = col[:-2] if col.endswith(("_a", "_b")) and col not in ("only_a", "only_b") else col
        assert f"`{col}`" in doc or f"`{root}_*`" in doc or f"`{root}_a`" in doc, col
    for status in ("changed", "same", "only_a", "only_b", "unmeasured"):
        assert f"`{status}`" in doc
