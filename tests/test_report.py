"""The HTML report and the tables behind it, on small slices of the committed H200 datasets."""
from __future__ import annotations

import base64
import pathlib
import re

import pandas as pd
import pytest
from click.testing import CliRunner

from cublaslt_probe.analysis.dataset import write_parquet
from cublaslt_probe.cli import main
from cublaslt_probe.errors import SchemaError
from cublaslt_probe.render import plots, report

DATA = pathlib.Path(__file__).resolve().parent.parent / "data"


@pytest.fixture(scope="module")
def llm():
    return plots.load(DATA / "h200_llm.parquet")


@pytest.fixture(scope="module")
def slice_(llm):
    """bf16 mm and fp8 scaled_mm, NT, small M: two map groups; torch and torch-lt both present."""
    df = llm[(llm["m"] <= 64) & (llm["layout"] == "NT") & llm["dtype"].isin(["bf16", "fp8"])
             & (llm["op"] != "addmm") & llm["n"].isin([4096, 8192])].copy()
    df.attrs = dict(llm.attrs)
    return df


@pytest.fixture(scope="module")
def built(slice_, tmp_path_factory):
    """The report of the slice, built through the CLI: (index.html path, its text, stderr lines)."""
    tmp = tmp_path_factory.mktemp("report")
    data = tmp / "slice.parquet"
    write_parquet(slice_.reset_index(drop=True), data, slice_.attrs["env"])
    out = tmp / "rep"
    r = CliRunner().invoke(main, ["report", str(data), "-o", str(out), "--dpi", "60"])
    assert r.exit_code == 0, r.output
    path = out / "index.html"
    return path, path.read_text(encoding="utf-8"), r.stderr.splitlines()


def test_report_has_every_section(built):
    path, page, _ = built
    assert path.name == "index.html"
    for anchor, title in report.SECTIONS:
        assert f'<section id="{anchor}"><h2>{title}</h2>' in page
    assert "<h1>cublaslt-probe report — NVIDIA H200 · cuBLASLt 13.1.0</h1>" in page
    for h3 in ("bf16 NT mm · torch", "fp8 NT scaled_mm · torch"):
        assert f">{h3}</h3>" in page
    assert 'class="error"' not in page


def test_report_images_are_embedded_pngs(built):
    _, page, _ = built
    imgs = re.findall(r'<img alt="([^"]*)" src="data:image/png;base64,([^"]+)">', page)
    alts = [a for a, _ in imgs]
    assert "kernel map bf16 NT mm · torch" in alts and "TFLOP/s fp8 NT scaled_mm · torch" in alts
    assert "heuristic cost" in alts
    for _, data in imgs:
        raw = base64.b64decode(data)
        assert raw.startswith(b"\x89PNG\r\n\x1a\n") and len(raw) > 2000
    assert "<script" not in page and 'src="http' not in page       # self-contained


def test_report_progress_lines(built, slice_):
    path, _, err = built
    assert err[0] == f"report on {path.parent.parent / 'slice.parquet'}: {len(slice_):,} rows"
    lines = err[1:-1]
    n = len(lines)
    assert lines[0] == f"[1/{n}] environment and coverage"
    assert lines[-1] == f"[{n}/{n}] consistency"
    assert f"[2/{n}] kernel map bf16 NT mm · torch" in lines
    assert all(re.fullmatch(rf"\[{i}/{n}\] .+", s) for i, s in enumerate(lines, 1))
    assert err[-1].startswith(f"wrote {path} (") and err[-1].endswith(" MB)")


def test_report_sections_say_what_they_found(built, slice_):
    _, page, _ = built
    assert f"{len(slice_):,} GEMMs over" in page
    assert "agree, 0 disagree" in page
    assert "Host time of <code>cublasLtMatmulAlgoGetHeuristic</code>" in page
    assert "torch-lt faster" in page


def test_report_on_a_square_slice(tmp_path):
    sq = plots.load(DATA / "h200_square.parquet")
    df = sq[(sq["m"] <= 80) & (sq["dtype"] == "fp16") & (sq["layout"] == "NT")].copy()
    df.attrs = dict(sq.attrs)
    lines: list[str] = []
    page = report.build_report(df, tmp_path, progress=lines.append, dpi=60).read_text(encoding="utf-8")
    n = len(lines)
    assert lines[:2] == [f"[1/{n}] environment and coverage", f"[2/{n}] kernel map fp16 NT mm"]
    assert lines[-1] == f"[{n}/{n}] consistency"
    assert "(square sweep: every backend in one map)" in page
    assert ">fp16 NT mm</h3>" in page and 'class="error"' not in page


def test_report_rejects_a_dataset_missing_columns(slice_, tmp_path):
    with pytest.raises(SchemaError, match=r"the report needs column tflops, which this dataset lacks"):
        report.build_report(slice_.drop(columns=["tflops"]), tmp_path)


# ------------------------------------------------------------------------------------------- tables
def _frame(rows):
    base = {"backend": "torch", "op": "mm", "dtype": "bf16", "layout": "NT", "batch": 1, "error": None,
            "family": "nvjet"}
    return pd.DataFrame([{**base, **r} for r in rows])


def test_find_cliffs_kinds():
    # along m at n = k = 4096: 16 -> 32 doubles TFLOP/s (scaling), 32 -> 48 loses 30 % (TFLOP/s falls),
    # 48 -> 64 is 5x faster per FLOP: time falls (the 48 row is the anomaly)
    rows = [dict(m=16, n=4096, k=4096, tflops=100.0, kernel="a", kernel_short="A"),
            dict(m=32, n=4096, k=4096, tflops=200.0, kernel="a", kernel_short="A"),
            dict(m=48, n=4096, k=4096, tflops=140.0, kernel="b", kernel_short="B"),
            dict(m=64, n=4096, k=4096, tflops=700.0, kernel="c", kernel_short="C")]
    df = _frame(rows)
    cl = report.find_cliffs(df)
    assert list(cl["kind"]) == ["time falls", "TFLOP/s falls"]
    assert list(cl["from"]) == [48, 32] and list(cl["to"]) == [64, 48]
    assert list(cl["change %"]) == [400.0, -30.0]
    assert list(cl["kernel from"]) == ["B", "A"] and list(cl["kernel to"]) == ["C", "B"]
    assert cl["kernel changed"].all()
    assert cl["fixed"].iloc[0] == "n=4096, k=4096"
    everything = report.find_cliffs(df, all_pairs=True)
    assert sorted(everything["kind"]) == ["TFLOP/s falls", "scaling", "time falls"]


def test_find_cliffs_ignores_small_changes_and_other_groups():
    rows = [dict(m=16, n=4096, k=4096, tflops=100.0, kernel="a"),
            dict(m=32, n=4096, k=4096, tflops=90.0, kernel="a"),                 # -10 %: not a cliff
            dict(m=64, n=4096, k=4096, tflops=10.0, kernel="a", backend="lt")]   # another backend
    assert report.find_cliffs(_frame(rows)).empty


def test_find_cliffs_on_a_square_sweep():
    rows = [dict(m=v, n=v, k=v, tflops=t, kernel=k) for v, t, k in [(4095, 130.0, "x"), (4096, 750.0, "y")]]
    cl = report.find_cliffs(_frame(rows))
    assert list(cl["axis"]) == ["m=n=k"] and list(cl["kind"]) == ["time falls"]


def test_tables_on_real_data(slice_):
    cov = report.coverage(slice_)
    assert set(cov.columns) >= {"backend", "op", "dtype", "layout", "rows", "errors", "kernels"}
    assert cov["rows"].sum() == len(slice_)
    tk = report.top_kernels(slice_, n=3)
    assert (tk.groupby("dtype")["share %"].max() <= 100).all()
    assert not tk["kernel"].str.startswith("nvjet ").any()          # nvjet configs are not prefixed
    hs = report.heuristic_summary(slice_)
    assert hs["dtype"].tolist()[-1] == "all" and hs["GEMMs"].iloc[-1] == slice_["heuristic_miss_us"].notna().sum()
    counts, bad = report.consistency_summary(slice_)
    assert list(counts.columns[-3:]) == ["agree", "disagree", "not comparable"]
    assert bad.empty
    ps = report.path_summary(slice_)
    assert {"GEMMs", "different kernels", "torch-lt faster", "torch-lt slower"} <= set(ps.columns)


def test_report_degrades_when_a_table_cannot_be_built(slice_, tmp_path):
    tiny = slice_[(slice_["dtype"] == "fp8") & (slice_["m"] <= 4)]
    tiny = tiny.drop(columns=["kernel_short", "heuristic_miss_us", "heuristic_hit_us"])
    page = report.build_report(tiny, tmp_path, dpi=40).read_text(encoding="utf-8")
    assert '<p class="note">The dataset has no heuristic times.</p>' in page
    assert ('<p class="error">top kernels: top kernels needs column kernel_short, which this dataset lacks'
            in page)
    for anchor, _ in report.SECTIONS:      # every other section is still there
        assert f'<section id="{anchor}">' in page


def test_the_analysis_is_data_and_the_page_renders_it(slice_):
    a = report.analyse(slice_)
    assert list(a.sections) == [anchor for anchor, _ in report.SECTIONS]
    assert a.sections["coverage"]["rows"] == len(slice_) and a.sections["consistency"]["disagree"] == 0
    groups = a.sections["maps"]["groups"]
    assert [g["label"] for g in groups] == ["bf16 NT mm · torch", "fp8 NT scaled_mm · torch"]
    assert all(isinstance(f, report.Figure) for f in a.figures())      # drawn only when the page is rendered
    assert a.sections["heuristic"]["regret"] is None


def test_regret_is_part_of_the_heuristic_section(tmp_path):
    rg = plots.load(DATA / "h200_regret.parquet")
    df = rg[rg["m"] <= 16].copy()
    df.attrs = dict(rg.attrs)
    a = report.analyse(df)
    r = a.sections["heuristic"]["regret"]
    assert r is not None and set(r["table"]["dtype"]) == {"bf16", "fp8", "all"}
    assert [f.step for f in r["figures"]] == ["regret map bf16 NT mm", "regret map fp8 NT scaled_mm"]
    page = report.build_report(df, tmp_path, dpi=30).read_text(encoding="utf-8")
    heuristic = page[page.index('<section id="heuristic">'):]
    heuristic = heuristic[:heuristic.index("</section>")]
    assert "<h3>Regret: the chosen kernel against the fastest heuristic candidate</h3>" in heuristic
    assert heuristic.count('alt="regret ') == 2


def test_consistency_table_has_no_empty_header_column():
    """The crosstab's axis name once rendered as an extra, empty header cell in the report's HTML."""
    from cublaslt_probe.analysis.dataset import read_parquet
    from cublaslt_probe.render.report import _table, consistency_summary
    t, _ = consistency_summary(read_parquet(DATA / "h200_grid.parquet"))
    html = _table(t)
    header = html.split("</thead>")[0]
    assert header.count("</th>") == len(t.columns) == 5
