"""Maps and companion plots built from the committed H200 datasets (small filtered slices, to stay fast).

Figures are checked for what a reader relies on: the title names GPU, cuBLAS version, dtype, layout, K and
backend; one legend entry per distinct kernel named by its decoded short form; written files have the
requested format. Bad arguments give a ProbeError naming what is available.
"""
from __future__ import annotations

import pathlib

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner
from matplotlib.figure import Figure

from cublaslt_probe.analysis.dataset import write_parquet
from cublaslt_probe.cli import main
from cublaslt_probe.errors import ProbeError, SchemaError
from cublaslt_probe.render import plots

DATA = pathlib.Path(__file__).resolve().parent.parent / "data"
GRID, LLM, SQUARE, REGRET = (DATA / f"h200_{n}.parquet" for n in ("grid", "llm", "square", "regret"))
PRESENT = [p for p in (GRID, LLM, SQUARE) if p.exists()]
MAGIC = {"png": b"\x89PNG\r\n\x1a\n", "svg": b"<?xml", "pdf": b"%PDF"}


def needs(path):
    return pytest.mark.skipif(not path.exists(), reason=f"{path.name} is not in data/ (yet)")


@pytest.fixture(scope="module")
def llm():
    return plots.load(LLM)


@pytest.fixture(scope="module")
def grid():
    if not GRID.exists():
        pytest.skip("data/h200_grid.parquet is not shipped yet")
    return plots.load(GRID)


@pytest.fixture(scope="module")
def square():
    return plots.load(SQUARE)


def small(df, **eq):
    """A slice of df: the given column values, M up to 1024 and N up to 8192 (keeps figures quick to draw)."""
    out = df
    for c, v in eq.items():
        out = out[out[c].astype(str) == str(v)]
    out = out[(out["m"] <= 1024) & (out["n"] <= 8192)]
    out = out.copy()
    out.attrs = dict(df.attrs)
    return out


def title(fig: Figure) -> str:
    return fig._suptitle.get_text()


def legend_texts(fig: Figure) -> list[str]:
    return [t.get_text() for lg in fig.legends for t in lg.get_texts()]


# ------------------------------------------------------------------------------------------- datasets / axes
def test_default_dataset_prefers_grid():
    expected = GRID if GRID.exists() else LLM
    assert plots.default_dataset() == expected


@pytest.mark.parametrize("path,axes", [(GRID, ("m", "n")), (LLM, ("m", "nk")), (SQUARE, ("m", "backend"))],
                         ids=["grid", "llm", "square"])
def test_auto_axes(path, axes):
    if not path.exists():
        pytest.skip(f"{path.name} not shipped")
    assert plots.auto_axes(plots.load(path)) == axes


@pytest.mark.parametrize("path", PRESENT, ids=[p.stem for p in PRESENT])
def test_kernel_map_builds_on_every_dataset(path):
    df = plots.load(path)
    df = df[df["m"] <= 256]
    fig = plots.kernel_map(df)          # defaults: bf16 NT, torch (or every backend for the square sweep)
    assert isinstance(fig, Figure)
    t = title(fig)
    for word in ("NVIDIA H200", "cuBLASLt 13.1.0", "bf16 NT"):
        assert word in t
    assert "backend torch" in t or plots.auto_axes(plots.load(path))[1] == "backend"
    assert ("K = 4096" in t) or ("K per row" in t) or ("M = N = K" in t)
    assert fig._cublaslt_probe["cells"] > 0


def test_map_title_and_legend_name_kernels_by_short_form(llm):
    fig = plots.kernel_map(small(llm), "m", "nk", dtype="bf16", layout="NT", backend="torch")
    t = title(fig)
    assert t.startswith("Kernel per shape — NVIDIA H200 · cuBLASLt 13.1.0\nbf16 NT · op mm · backend torch")
    texts = legend_texts(fig)
    assert fig._cublaslt_probe["values"] == len(texts)
    assert all(" · " in s for s in texts)           # decoded short forms: tile · Ktile x stages · cluster
    assert any("splitK" in s for s in texts)
    assert [s.split()[0] for s in texts] == [str(i) for i in range(1, len(texts) + 1)]


def test_map_with_30_plus_kernels_keeps_legend_outside(llm):
    fig = plots.kernel_map(llm, "m", "nk", dtype="bf16", layout="NT", backend="torch")
    n = fig._cublaslt_probe["values"]
    assert n >= 30
    assert len(set(map(tuple, plots.style.palette(n)))) == min(n, 80)
    fig.draw_without_rendering()
    ax_box = fig.axes[0].get_window_extent()
    for lg in fig.legends:
        assert lg.get_window_extent().x0 >= ax_box.x1     # legend right of the map, not over it


def test_k_is_pinned_to_4096_when_cells_would_hold_several(llm):
    sel = plots.select(small(llm), "m", "n", dtype="bf16", layout="NT", backend="torch")
    assert sel.pins["k"] == 4096 and "k" in sel.auto
    assert set(sel.df["k"]) == {4096}
    fig = plots.kernel_map(small(llm), "m", "n", dtype="bf16", layout="NT", backend="torch")
    assert "K = 4096" in title(fig)


def test_grid_map_has_region_boundaries(grid):
    df = small(grid)
    fig = plots.kernel_map(df, dtype="bf16", layout="NT", backend="torch")
    lines = [c for c in fig.axes[0].collections if c.__class__.__name__ == "LineCollection"]
    assert lines and len(lines[0].get_segments()) > 0
    assert "K = 4096" in title(fig)


@pytest.mark.parametrize("color,needle", [("tile", "x"), ("cluster", "x"), ("family", "nvjet"),
                                          ("split_k", "split-K"), ("stages", "")])
def test_colour_fields(llm, color, needle):
    fig = plots.kernel_map(small(llm), "m", "nk", dtype="bf16", layout="NT", backend="torch", color=color)
    texts = legend_texts(fig)
    assert texts and any(needle in s for s in texts)
    assert fig._cublaslt_probe["values"] <= len(plots.select(small(llm), "m", "nk", dtype="bf16", layout="NT",
                                                             backend="torch").df)


def test_square_map_has_backends_as_rows(square):
    df = square[square["m"] <= 300]
    fig = plots.kernel_map(df, dtype="fp16", layout="TN")
    assert "M = N = K" in title(fig)
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["torch", "torch-lt", "lt", "cupy"]


# ------------------------------------------------------------------------------------------- labels
def test_kernel_labels_disambiguate_shared_short_forms():
    ka = "cutlass_75_tensorop_s1688gemm_bf16_64x64_tn_align1"
    kb = "cutlass_75_tensorop_bf16_s1688gemm_bf16_64x64_tn_align1"
    a = f"void cutlass::Kernel2<{ka}>({ka}::Params)"      # real names from the H200 square sweep
    b = f"void cutlass::Kernel2<{kb}>({kb}::Params)"
    c = "nvjet_sm90_tst_128x128_64x6_2x1_v_bz_NNT"
    d = "nvjet_sm90_tst_128x128_64x6_2x1_v_bz_TNT"
    labels = plots.kernel_labels(pd.DataFrame({"kernel": [a, b, c, d]}))
    assert labels[a] == "cutlass 64x64"
    assert labels[b] == "cutlass 64x64 (bf16)"
    assert labels[c] == "128x128 · 64x6 · 2x1 (NNT)"
    assert labels[d] == "128x128 · 64x6 · 2x1 (TNT)"


# ------------------------------------------------------------------------------------------- companions
def test_tflops_map_peak_from_datasheet_and_override(llm):
    df = small(llm)
    fig = plots.tflops_map(df, "m", "nk", dtype="bf16", layout="NT", backend="torch")
    assert fig._cublaslt_probe["peak"] == 989.5
    assert "% of the datasheet dense peak 989.5 TFLOP/s" in title(fig)
    fig = plots.tflops_map(df, "m", "nk", dtype="bf16", layout="NT", backend="torch", peak=788, annotate="pct")
    assert "% of the given peak 788 TFLOP/s" in title(fig)
    fig = plots.tflops_map(df, "m", "nk", dtype="fp8", layout="NT", backend="torch")
    assert fig._cublaslt_probe["peak"] == 1978.9


def test_tflops_pct_needs_a_peak_for_unknown_gpus(llm):
    df = small(llm).assign(gpu="Some Other GPU")
    df.attrs = {"env": {"gpu": "Some Other GPU", "cublaslt_version": "13.1.0"}}
    with pytest.raises(ProbeError, match="no peak known for this GPU/dtype: give --peak"):
        plots.tflops_map(df, "m", "nk", dtype="bf16", layout="NT", annotate="pct")


def test_tflops_map_marks_error_rows(grid):
    df = grid[(grid["m"] <= 64) & (grid["n"] <= 64)]
    fig = plots.tflops_map(df, dtype="fp8", layout="NT", backend="torch")   # n = 24 cannot run in fp8
    assert "hatched: did not run (error)" in title(fig)


def test_pathdiff_counts_match_the_table(llm):
    df = small(llm)
    fig = plots.pathdiff_map(df, x="m", y="nk", dtype="bf16", layout="NT")
    table = plots.pathdiff_table(df, "torch", "torch-lt")
    n = len(table[(table["dtype"] == "bf16") & (table["layout"] == "NT") & (table["op"] == "mm")])
    assert fig._cublaslt_probe["different"] == n
    assert f"torch vs torch-lt: different kernels in {n} of " in title(fig)


def test_pathdiff_two_datasets(llm):
    a = small(llm, backend="torch")
    b = a.copy()
    b.attrs = dict(a.attrs)
    rows = b.index[(b["dtype"] == "bf16") & (b["layout"] == "NT") & (b["op"] == "mm")][:3]
    b.loc[rows, "kernel"] = "nvjet_sm90_tst_8x8_64x16_4x1_v_bz_NNT"   # a kernel no row ran
    fig = plots.pathdiff_map(a, b, x="m", y="nk", dtype="bf16", layout="NT")
    assert fig._cublaslt_probe["different"] == 3
    assert "A (NVIDIA H200 · cuBLASLt 13.1.0, torch) vs B" in title(fig)


def test_heuristic_plot(llm):
    fig = plots.heuristic_plot(small(llm), x="m")
    assert len(fig.axes) == 2
    ticks = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    assert ticks[0].startswith("fp32\nmiss ") and "hit " in ticks[0]
    assert "Heuristic query cost — NVIDIA H200 · cuBLASLt 13.1.0" in title(fig)


def test_regret_map_with_candidates():
    if REGRET.exists():
        df = plots.load(REGRET)
    else:   # real rows with a made-up regret column: the plot, not the numbers, is under test
        df = plots.load(LLM)
        df["regret_pct"] = np.where(df["backend"] == "lt", np.linspace(0, 30, len(df)), np.nan)
    fig = plots.regret_map(df[df["m"] <= 256])
    t = title(fig)
    assert "Regret of the chosen kernel" in t and "backend lt" in t and "from the best candidate" in t


def test_regret_map_without_candidates_says_why(llm):
    no_cols = llm.drop(columns=[c for c in plots.REGRET_COLUMNS if c in llm.columns])
    with pytest.raises(ProbeError, match=r"lacks the candidate columns \(regret_pct, best_rank, best_kernel, "
                                         r"n_candidates\).*sweep --candidates"):
        plots.regret_map(no_cols)
    empty = llm.assign(regret_pct=np.nan)
    with pytest.raises(ProbeError, match="has the candidate columns but no GEMM with candidates"):
        plots.regret_map(empty)


# ------------------------------------------------------------------------------------------- bad arguments
def test_unknown_dtype_names_the_dtypes(llm):
    with pytest.raises(ProbeError) as e:
        plots.kernel_map(llm, dtype="bf17")
    assert str(e.value) == "no rows for dtype=bf17; dtypes in this dataset: fp32, tf32, fp16, bf16, fp8"


def test_filter_that_leaves_nothing_names_what_is_there(llm):
    with pytest.raises(ProbeError) as e:
        plots.kernel_map(llm, dtype="fp8", layout="NN")
    assert str(e.value) == "no rows for layout=NN with dtype=fp8; layouts there: NT"
    with pytest.raises(ProbeError, match=r"no rows for k=1234 with dtype=bf16, layout=NT, op=mm, backend=torch; "
                                         r"k values there: 3584, 4096, 8192, 14336, 18944, 28672"):
        plots.kernel_map(llm, "m", "n", k=1234)


def test_unknown_axis_and_colour(llm):
    with pytest.raises(ProbeError, match="unknown x axis 'q'; choose one of m, n, k, batch, nk, dtype"):
        plots.kernel_map(llm, x="q")
    with pytest.raises(ProbeError, match=r"cannot colour by 'bogus'.*Choose kernel, tile, cluster, family, "
                                         r"split_k, or a dataset column \(gpu, sm_count"):
        plots.kernel_map(small(llm), color="bogus")


def test_ambiguous_cells_ask_for_a_pin(llm):
    with pytest.raises(ProbeError, match=r"several rows per cell of the map \(k × n\).*pin m with --m "
                                         r"\(values: 1, 4, 16"):
        plots.kernel_map(llm, x="k", y="n")


def test_pinning_an_axis_is_refused(llm):
    with pytest.raises(ProbeError, match="--n pins n, but n is an axis of the map"):
        plots.kernel_map(llm, "m", "n", n=4096)


def test_dataset_missing_columns(llm):
    with pytest.raises(SchemaError, match=r"map needs column kernel, which this dataset lacks; it has: gpu"):
        plots.kernel_map(llm.drop(columns=["kernel"]))
    with pytest.raises(SchemaError, match=r"map needs columns dtype, layout, which this dataset lacks"):
        plots.kernel_map(llm.drop(columns=["dtype", "layout"]))
    with pytest.raises(SchemaError, match=r"the heuristic plot needs columns heuristic_miss_us, heuristic_hit_us"):
        plots.heuristic_plot(llm.drop(columns=["heuristic_miss_us", "heuristic_hit_us"]))


def test_heuristic_bad_filter(llm):
    with pytest.raises(ProbeError, match="no rows for backend=nope; backend values there: torch, torch-lt, lt, cupy"):
        plots.heuristic_plot(llm, backend="nope")


# ------------------------------------------------------------------------------------------- saving / CLI
@pytest.fixture(scope="module")
def small_file(tmp_path_factory, llm):
    """A small real slice written as a dataset file, for the CLI."""
    df = llm[(llm["m"] <= 64) & llm["n"].isin([4096, 6144, 28672]) & llm["dtype"].isin(["bf16", "fp8"])]
    df = df.reset_index(drop=True)
    p = tmp_path_factory.mktemp("data") / "small.parquet"
    write_parquet(df, p, llm.attrs["env"])
    return p


def tiny_map(llm):
    df = llm[(llm["m"] <= 16) & llm["n"].isin([4096, 6144])]
    return plots.kernel_map(df, "m", "nk", dtype="fp8", backend="torch")


def test_save_writes_the_requested_format(llm, tmp_path):
    fig = tiny_map(llm)
    for fmt in ("png", "svg", "pdf"):
        out = tmp_path / f"map.{fmt}"
        assert plots.save(fig, out, dpi=40) == fmt
        data = out.read_bytes()
        assert len(data) > 1000 and data.startswith(MAGIC[fmt])


def test_save_refuses_unknown_extension(llm, tmp_path):
    fig = tiny_map(llm)
    with pytest.raises(ProbeError, match=r"cannot write .*map.jpg: give a file ending in .png, .svg or .pdf"):
        plots.save(fig, tmp_path / "map.jpg")


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_cli_map(small_file, tmp_path):
    fmt = "svg"
    out = tmp_path / f"map.{fmt}"
    r = run("map", small_file, "-o", out, "--dtype", "bf16", "--layout", "NT", "--backend", "torch")
    assert r.exit_code == 0, r.output
    assert out.read_bytes().startswith(MAGIC[fmt])
    assert r.stderr == f"wrote {out} ({fmt}): 16 shapes (M × N×K), 12 distinct kernel values\n"
    assert r.stderr.rstrip().endswith("distinct kernel values")


def test_cli_map_bad_dtype(small_file, tmp_path):
    r = run("map", small_file, "-o", tmp_path / "m.png", "--dtype", "bf17")
    assert r.exit_code == 2  # an option's value the dataset does not hold: a usage error
    assert r.stderr.endswith("\nError: no rows for dtype=bf17; dtypes in this dataset: bf16, fp8\n")


def test_cli_map_missing_dataset(tmp_path):
    r = run("map", tmp_path / "nope.parquet", "-o", tmp_path / "m.png")
    assert r.exit_code == 1
    assert r.stderr.startswith(f"Error: no dataset at {tmp_path / 'nope.parquet'}")


@pytest.mark.parametrize("kind,args,fmt", [("tflops", ["--pct"], "png"), ("heuristic", ["--backend", "lt"], "svg"),
                                           ("pathdiff", ["--dtype", "bf16"], "png")])
def test_cli_plot(small_file, tmp_path, kind, args, fmt):
    out = tmp_path / f"{kind}.{fmt}"
    r = run("plot", kind, small_file, "-o", out, "--dpi", "40", *args)
    assert r.exit_code == 0, r.output
    assert out.read_bytes().startswith(MAGIC[fmt])
    assert r.stderr == f"wrote {out} ({fmt})\n"


def test_cli_plot_regret_without_candidates(small_file, tmp_path):
    r = run("plot", "regret", small_file, "-o", tmp_path / "r.png")
    assert r.exit_code == 1
    assert "Error: the regret map needs heuristic candidates timed per GEMM" in r.stderr


def test_cli_pathdiff_refuses_backend(small_file, tmp_path):
    r = run("plot", "pathdiff", small_file, "-o", tmp_path / "p.png", "--backend", "torch")
    assert r.exit_code == 2
    assert r.stderr.endswith("\nError: pathdiff compares two backends: give them with --a and --b, not --backend\n")


@pytest.mark.parametrize("cmd", ["map", "plot", "report"])
def test_commands_have_help(cmd):
    r = run(cmd, "--help")
    assert r.exit_code == 0
    assert len(r.output.split("Options:")[0].strip().splitlines()) >= 3


def test_cli_map_on_the_shipped_default_says_which_and_refuses_a_non_image(tmp_path):
    r = run("map", "-o", tmp_path / "m.txt")
    assert r.exit_code == 2 and "`map` writes .png, .svg or .pdf, not .txt" in r.output
    out = tmp_path / "m.svg"
    r = run("map", "-o", out, "--dtype", "bf16", "--layout", "NT", "--backend", "torch")
    assert r.exit_code == 0, r.output
    first = r.stderr.splitlines()[0]
    assert first.startswith("dataset: ") and first.endswith("(the shipped default; give DATASET for another)")
    assert "h200_grid.parquet" in first and out.read_bytes().startswith(MAGIC["svg"])
