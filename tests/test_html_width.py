"""No page is wider than its window: on the audit pages of the captured programs (the MoE ones hold CUTLASS
grouped GEMMs whose mangled names run past 1,200 characters) and on the dataset report, no table cell or list
item holds an unbreakable token longer than `MAX_TOKEN` characters, every cell may wrap (CSS
``overflow-wrap``), and no cell holds a raw float or Python's True / False / None / nan."""
from __future__ import annotations

import html
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import FIXTURES

from cublaslt_probe.analysis.dataset import write_parquet
from cublaslt_probe.cli import main
from cublaslt_probe.names import decode
from cublaslt_probe.names.model import LABEL_WIDTH
from cublaslt_probe.render import plots

MAX_TOKEN = LABEL_WIDTH
DATA = Path(__file__).resolve().parent.parent / "data"
RUNS = [("moe", "mixtral_train"), ("moe", "qwen3_moe"), ("programs", "mixtral_moe"), ("programs", "gpt2_train"),
        ("programs", "fp8_linear")]
_RAW = re.compile(r"-?\d+\.\d{5,}(?:e-?\d+)?|True|False|None|nan|NaN")


def _cells(page: str) -> list[str]:
    """The text of every table cell, list item, paragraph, heading and summary of `page` (figures and styles
    left out)."""
    body = re.sub(r"<style.*?</style>|<svg.*?</svg>|src=\"data:[^\"]*\"", "", page, flags=re.S)
    return [html.unescape(re.sub(r"<[^>]+>", " ", c)) for _, c in
            re.findall(r"<(td|li|p|h[1-4]|summary)\b[^>]*>(.*?)</\1>", body, flags=re.S)]


def check_page(page: str) -> None:
    cells = _cells(page)
    assert cells
    long = [t for c in cells for t in c.split() if len(t) > MAX_TOKEN]
    assert not long, f"{len(long)} tokens over {MAX_TOKEN} characters, e.g. {long[0][:120]}…"
    raw = [c.strip() for c in cells if _RAW.fullmatch(c.strip())]
    assert not raw, f"raw values in cells: {raw[:5]}"
    assert re.search(r"td[^{]*\{[^}]*overflow-wrap:\s*anywhere", page)


@pytest.mark.parametrize("where, run", RUNS, ids=[r for _, r in RUNS])
def test_an_audit_page_fits_its_window(where, run, tmp_path):
    out = tmp_path / "audit.html"
    r = CliRunner().invoke(main, ["audit", str(FIXTURES / where / run), "--from",
                                  str(FIXTURES / where / "measure" / f"{run}.json"), "-o", str(out)])
    assert r.exit_code == 0, r.output
    check_page(out.read_text(encoding="utf-8"))


def test_the_moe_page_names_its_grouped_gemm_by_its_decoded_label(tmp_path):
    out = tmp_path / "audit.html"
    CliRunner().invoke(main, ["audit", str(FIXTURES / "moe" / "mixtral_train"), "--from",
                              str(FIXTURES / "moe" / "measure" / "mixtral_train.json"), "-o", str(out)])
    page = out.read_text(encoding="utf-8")
    assert "_ZN7cutlass13device_kernel" not in page
    assert ("cutlass::device_kernel&lt;…&gt; (cutlass_template 128x256 · 64x4 · 2x1 · LinearCombination, grouped)"
            in page)


def test_a_long_name_keeps_its_decoded_fields_in_its_label():
    name = "_ZN7cutlass13device_kernelI" + "x" * 3000
    assert len(decode(name).label()) <= LABEL_WIDTH
    short = "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT"
    assert decode(short).label() == short


def test_the_report_page_fits_its_window_and_writes_yes_no(tmp_path):
    grid = plots.load(DATA / "h200_grid.parquet")     # its environment records flush_l2: a boolean
    df = grid[(grid["m"] <= 32) & (grid["n"] <= 32) & (grid["dtype"] == "bf16")].copy()
    data = tmp_path / "slice.parquet"
    write_parquet(df.reset_index(drop=True), data, grid.attrs["env"])
    out = tmp_path / "page.html"
    r = CliRunner().invoke(main, ["report", str(data), "-o", str(out), "--dpi", "30", "--quiet"])
    assert r.exit_code == 0, r.output
    assert out.is_file() and r.stderr.strip().splitlines()[-1].startswith(f"wrote {out} (")
    page = out.read_text(encoding="utf-8")
    check_page(page)
    assert "<td>flush_l2</td>\n      <td>no</td>" in page
