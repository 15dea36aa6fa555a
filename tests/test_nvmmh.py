"""nvMatmulHeuristics beside cuBLASLt (cublaslt_probe.nvmmh, `cublaslt-probe nvmmh`): the real library on
this CPU (no GPU, no driver), asked about real rows of the shipped H200 dataset; without the wheel the
module still imports and every entry point says how to install it."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from cublaslt_probe import nvmmh
from cublaslt_probe.analysis.dataset import read_parquet
from cublaslt_probe.cli import main
from cublaslt_probe.errors import OptionError

ROOT = Path(__file__).resolve().parent.parent
LLM = ROOT / "data" / "h200_llm.parquet"

try:
    import nvMatmulHeuristics  # noqa: F401
    HAVE = True
except (ImportError, OSError):
    HAVE = False
needs_lib = pytest.mark.skipif(not HAVE, reason=f"nvMatmulHeuristics is not installed ({nvmmh.INSTALL})")


@pytest.fixture(scope="module")
def llm():
    return read_parquet(LLM)


def _row(df, key: str) -> dict:
    rows = df[df["key"] == key].to_dict("records")
    assert len(rows) == 1, key
    return rows[0]


# ----------------------------------------------------------------------------------- the problem it is asked
@pytest.mark.parametrize("layout,blas", [("NT", "TN_COL_MAJOR"), ("NN", "NN_COL_MAJOR"), ("TN", "NT_COL_MAJOR"),
                                         ("TT", "TT_COL_MAJOR")])
def test_the_model_is_asked_cublas_column_major_problem(layout, blas):
    # torch C[16, 4096] = A[16, 8192] @ B: cuBLAS computes Cᵀ, m = torch n, n = torch m, op(A) = layout[1]
    assert nvmmh.blas_problem(16, 4096, 8192, layout, 3) == (4096, 16, 8192, 3, blas)


@pytest.mark.parametrize("name,enum", [("NVIDIA H200", "H200_SXM"), ("H200", "H200_SXM"),
                                       ("NVIDIA H100 80GB HBM3", "H100_SXM"), ("NVIDIA H100 PCIe", "H100_PCIE"),
                                       ("NVIDIA H100 NVL", "H100_NVL"), ("H20", "H20_SXM"),
                                       ("NVIDIA A100-SXM4-80GB", "A100_SXM_80GB"), ("h200_sxm", "H200_SXM")])
def test_gpu_names_map_to_the_library_gpus(name, enum):
    assert nvmmh.gpu_name(name) == enum


def test_an_unknown_gpu_names_the_ones_it_knows():
    with pytest.raises(OptionError, match="H200_SXM"):
        nvmmh.gpu_name("NVIDIA Z100")


# --------------------------------------------------------------------------------- the pick, from the data
def test_the_pick_of_a_logged_nvjet_row(llm):
    p = nvmmh.pick_of(_row(llm, "torch|mm|bf16|NN|256|3584|3584|1"))   # nvjet_sm90_tst_128x64_64x8_2x4_h_bz_NNT
    assert p == {"tile": (128, 64), "cluster": (2, 4), "split_k": 1, "stages": 8}


def test_an_xmma_name_is_read_swapped_when_the_log_is_missing(llm):
    row = _row(llm, "torch|mm|bf16|TT|4|37888|3584|1")   # ..._tilesize64x256x64_cgasize1x1x1_..., logged 256x64
    assert nvmmh.pick_of(row)["tile"] == (256, 64)
    unlogged = {**row, "algo_tile": None, "algo_cluster": None, "algo_split_k": None}
    assert nvmmh.pick_of(unlogged)["tile"] == (256, 64)


def test_a_cutlass_row_without_cluster_has_none(llm):
    p = nvmmh.pick_of(_row(llm, "torch|mm|bf16|TN|4|3584|3584|1"))   # cutlass_80_..._64x64_32x6_nt_align2
    assert p["tile"] == (64, 64) and p["cluster"] is None   # the log says clusterShape AUTO


# -------------------------------------------------------------------------------------- the real library
@needs_lib
def test_it_runs_without_a_gpu_and_ranks_configs_in_cublas_frame():
    # decode: torch 1 x 3584 @ 3584 x 3584 -> cuBLAS m = 3584, n = 1: a tall, one-column problem
    cfgs = nvmmh.configs(1, 3584, 3584, "bf16", "NN", gpu="NVIDIA H200", top=8)
    assert [c.rank for c in cfgs] == list(range(1, len(cfgs) + 1)) and len(cfgs) >= 4
    assert all(c.pred_us > 0 for c in cfgs)
    assert [c.pred_us for c in cfgs] == sorted(c.pred_us for c in cfgs)
    assert all(c.tile_n <= 16 < c.tile_m for c in cfgs)   # small N: the frame is cuBLAS's, not torch's
    assert cfgs[0].as_dict()["tile"] == f"{cfgs[0].tile_m}x{cfgs[0].tile_n}"


@needs_lib
def test_h100_and_h200_differ():
    h100 = nvmmh.configs(8192, 8192, 8192, gpu="H100")[0].pred_us
    h200 = nvmmh.configs(8192, 8192, 8192, gpu="H200")[0].pred_us
    assert h100 != h200 and 100 < h200 < 3000


@needs_lib
def test_a_dtype_it_cannot_model_is_an_option_error():
    with pytest.raises(OptionError, match="bf16"):
        nvmmh.configs(16, 16, 16, "int8")


@needs_lib
def test_a_row_where_the_model_agrees_with_cublaslt(llm):
    row = _row(llm, "torch|mm|bf16|NN|16|3584|3584|1")   # nvjet_sm90_tst_64x16_64x16_4x1_v_bz_splitK_NNT
    s = nvmmh.score_row(row, nvmmh.configs(16, 3584, 3584, "bf16", "NN"))
    assert (s["nvmmh_tile"], s["nvmmh_cluster"]) == ("64x16", "4x1")
    assert s["nvmmh_agrees"] is True and s["nvmmh_agrees_cluster"] is True and s["nvmmh_tile_rank"] == 1
    assert s["nvmmh_log_err"] == pytest.approx(__import__("math").log(s["nvmmh_us"] / row["time_us"]))


@needs_lib
def test_a_row_where_the_pick_is_lower_in_the_models_list(llm):
    row = _row(llm, "torch|mm|bf16|NN|256|3584|3584|1")   # picked 128x64, cluster 2x4
    cfgs = nvmmh.configs(256, 3584, 3584, "bf16", "NN")
    s = nvmmh.score_row(row, cfgs)
    assert s["nvmmh_agrees"] is False and s["nvmmh_agrees_cluster"] is False
    assert s["nvmmh_tile_rank"] == 5 and cfgs[4].tile == "128x64"
    assert s["nvmmh_pick_us"] == cfgs[4].pred_us and s["nvmmh_us"] == cfgs[0].pred_us


@needs_lib
def test_whole_llm_dataset_bf16_numbers_of_docs(llm):
    """The numbers docs/nvmmh.md records (library 0.1.0.27, CUTLASS3 target, top 8)."""
    sc = nvmmh.scored(llm[llm["dtype"] == "bf16"])
    assert sc.attrs["nvmmh"] == {"gpu": "H200_SXM", "top": 8, "target": "CUTLASS3"}
    s = nvmmh.summary(sc).set_index("dtype").loc["bf16"]
    assert (s["rows"], s["with_tile"], s["with_cluster"]) == (2688, 2688, 2598)
    assert (s["tile_agree_pct"], s["tile_cluster_agree_pct"], s["tile_in_topk_pct"]) == (29.7, 23.9, 36.8)
    assert s["median_abs_log_err"] == pytest.approx(0.321, abs=5e-4)
    assert s["median_abs_log_err_pick"] == pytest.approx(0.219, abs=5e-4)


@needs_lib
def test_unmeasured_rows_and_other_dtypes_keep_nulls(llm):
    rows = llm[llm["dtype"] == "bf16"].head(3).copy()
    rows.loc[rows.index[0], "error"] = "out of memory"
    rows["dtype"] = rows["dtype"].astype(str)
    rows.loc[rows.index[1], "dtype"] = "int8"
    sc = nvmmh.scored(rows)
    assert sc["nvmmh_tile"].isna().tolist() == [True, True, False]
    assert list(sc.columns[-len(nvmmh.COLUMNS):]) == list(nvmmh.COLUMNS)


# ------------------------------------------------------------------------------------------------- CLI
@needs_lib
def test_cli_summary(tmp_path):
    r = CliRunner().invoke(main, ["nvmmh", str(LLM), "--dtype", "bf16"])
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert lines[0].startswith("nvMatmulHeuristics (CUTLASS3, H200_SXM, top 8) against cuBLASLt's picks")
    assert lines[3].split()[:7] == ["bf16", "2688", "2688", "29.7", "2598", "23.9", "36.8"]


@needs_lib
def test_cli_columns_parquet(tmp_path):
    out = tmp_path / "x.parquet"
    r = CliRunner().invoke(main, ["nvmmh", str(LLM), "--dtype", "bf16", "--columns", "-o", str(out)])
    assert r.exit_code == 0, r.output
    import pandas as pd
    df = pd.read_parquet(out)
    assert len(df) == 2688 and {"key", "time_us", "nvmmh_tile", "nvmmh_us", "nvmmh_agrees"} <= set(df.columns)
    assert df["nvmmh_agrees"].sum() == 799   # 29.7 % of 2688


def test_cli_bad_gpu_is_a_usage_error():
    r = CliRunner().invoke(main, ["nvmmh", str(LLM), "--gpu", "Z100"])
    assert r.exit_code == 2 and "Z100" in r.output and "Traceback" not in r.output


def test_without_the_wheel_the_module_imports_and_says_how_to_install():
    code = ("import sys; sys.modules['nvMatmulHeuristics'] = None\n"
            "from cublaslt_probe import nvmmh\n"
            "from cublaslt_probe.cli import main\n"
            f"main(['nvmmh', {str(LLM)!r}, '--dtype', 'bf16'])\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 1, p.stderr
    err = p.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("Error: nvMatmulHeuristics is not available")
    assert err[0].endswith("pip install nvidia-matmul-heuristics")


@needs_lib
def test_cli_a_txt_file_holds_what_stdout_shows(tmp_path):
    out = tmp_path / "s.txt"
    to_file = CliRunner().invoke(main, ["nvmmh", str(LLM), "--by", "backend", "-o", str(out)])
    to_stdout = CliRunner().invoke(main, ["nvmmh", str(LLM), "--by", "backend"])
    assert to_file.exit_code == to_stdout.exit_code == 0
    assert to_file.stdout == "" and to_file.stderr.splitlines()[-1] == f"wrote {out}"
    assert out.read_text(encoding="utf-8") == to_stdout.stdout
    assert [ln.split()[0] for ln in to_stdout.stdout.splitlines()[3:]] == ["cupy", "lt", "torch", "torch-lt", "all"]


def test_cli_a_suffix_it_does_not_write_is_a_usage_error(tmp_path):
    r = CliRunner().invoke(main, ["nvmmh", str(LLM), "-o", str(tmp_path / "x.png")])
    assert r.exit_code == 2 and "`nvmmh` writes .txt, .csv, .jsonl, .json or .parquet, not .png" in r.output


# ------------------------------------------------------------------------------------------------ explain
def _explain(name: str) -> str:
    import json

    from cublaslt_probe.analysis import explain
    ev = json.loads((ROOT / "tests" / "fixtures" / "evidence" / name).read_text())
    return explain.render(ev).split("11. second opinion", 1)[1]


@needs_lib
def test_explain_gives_the_models_second_opinion():
    # captured: 16x4096x4096 bf16 NT ran nvjet_sm90_tst_64x16_64x16_2x1_v_bz_splitK_TNT (logged 64x16, 2x1x1, 2-way)
    text = _explain("explain_bf16_NT_16x4096x4096.json")
    lines = [ln.strip() for ln in text.splitlines()[1:]]
    assert lines[0] == "on H200_SXM, predicted for its own configs (not cuBLAS's kernels):"
    assert lines[1] == "#1 64x16x128 · cluster 4x1 · 8 stages · split-K 1: 33.0 µs predicted"
    assert lines[4] == "the pick's tile is its #1 (33.0 µs predicted; measured 24.7 µs)"


def test_explain_without_the_wheel_says_how_to_install():
    code = ("import sys, json; sys.modules['nvMatmulHeuristics'] = None\n"
            "from cublaslt_probe.analysis import explain\n"
            "ev = json.load(open('tests/fixtures/evidence/explain_bf16_NT_16x4096x4096.json'))\n"
            "print(explain.render(ev).split('11. second opinion', 1)[1])\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    assert "(not asked: nvMatmulHeuristics is not available" in p.stdout
    assert p.stdout.rstrip().endswith("pip install nvidia-matmul-heuristics)")
