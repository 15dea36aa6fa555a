"""The cold-start page's two tables fit the terminal's width like every other table (`render.text.Table`): on every
committed save of tests/fixtures/coldstart (PROVENANCE.md there, in compilers/ and in repeat/, the JAX save with
three rounds among them), read back through `cold-start --from` at COLUMNS=100 and 160, no line of the run table or
of the causes table is wider than the terminal, and every figure is whole in its column: each run's steps and
spread, each cause's ms, spread and share, the unexplained row; the prose (environment, cause, how) is broken onto
more lines, never cut; a failed run is marked under its row with its error."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from cublaslt_probe.analysis.coldstart.breakdown import analyse
from cublaslt_probe.analysis.coldstart.runs import fmt_ms
from cublaslt_probe.analysis.coldstart.saved import load
from cublaslt_probe.cli import main

CS = Path(__file__).parent / "fixtures" / "coldstart"
SAVES = sorted(CS.glob("**/*.json.gz"))
JAX_ROUNDS = CS / "repeat" / "jax_repeat3_run1.json.gz"


def _page(save: Path, columns: int) -> str:
    r = CliRunner().invoke(main, ["cold-start", "--from", str(save)], env={"COLUMNS": str(columns)})
    assert r.exit_code in (0, 3), r.output        # 3: no run got through its steps (the page says why)
    return r.stdout


def _table(lines: list[str], first: str, figure: str) -> tuple[list[str], list[list[list[str]]], list[str]]:
    """The table whose header starts with `first`: its header, its rows (each the fragments of each cell, one a
    line: a prose cell broken over lines has several; a row starts on the line with a value in the column
    `figure`, which is never broken) and the lines indented by six, under a row, that are none of its cells (a
    failed run's mark and error). Columns are read where the dashed rule under the header puts them."""
    i = next(i for i, ln in enumerate(lines) if ln.startswith(f"  {first}  "))
    spans = [m.span() for m in re.finditer(r"-+", lines[i + 1])]
    header = [lines[i][s:e].strip() for s, e in spans]
    fs, fe = spans[header.index(figure)]
    rows: list[list[list[str]]] = []
    under: list[str] = []
    for ln in lines[i + 2:]:
        if not ln.strip():
            break
        if len(ln) - len(ln.lstrip()) == 6:
            under.append(ln.strip())
            continue
        if ln[fs:fe].strip():
            rows.append([[] for _ in spans])
        for k, (s, e) in enumerate(spans):
            cell = (ln[s:] if k == len(spans) - 1 else ln[s:e]).strip()
            if cell:
                rows[-1][k].append(cell)
    return header, rows, under


def _table_lines(lines: list[str]) -> list[str]:
    """The lines of the run table and of the causes table (when the page has one), headers and rules with them."""
    i = lines.index(next(ln for ln in lines if ln.startswith("  run  ")))
    out = lines[i:lines.index("", i)]
    j = next((j for j, ln in enumerate(lines) if ln.startswith("  cause  ")), None)
    return out + (lines[j:lines.index("", j)] if j is not None else [])


def _cell(row: list[list[str]], header: list[str], name: str) -> str:
    return " ".join(row[header.index(name)])


@pytest.mark.parametrize("columns", [100, 160])
@pytest.mark.parametrize("save", SAVES, ids=lambda p: str(p.relative_to(CS)))
def test_the_tables_fit_the_width_and_keep_every_figure(save, columns):
    a = analyse(load(save))
    rounds = (a.get("rounds") or {}).get("n", 1) >= 2
    lines = _page(save, columns).splitlines()
    table = _table_lines(lines)
    assert max(map(len, table)) <= columns, max(table, key=len)
    header, rows, under = _table(lines, "run", "step 1")
    assert header == ["run", "environment", "step 1", "step 2", "steady", "run wall"] + \
        (["step 1 spread ms", "runs", "round"] if rounds else [])
    assert len(rows) == len(a["table"])
    for t, row in zip(a["table"], rows):
        assert _cell(row, header, "run") == t["run"]
        assert _cell(row, header, "environment") == t["env"]          # broken over lines, never cut
        assert [_cell(row, header, h) for h in ("step 1", "step 2", "steady", "run wall")] == \
            [fmt_ms(t["step1_s"]), fmt_ms(t["step2_s"]), fmt_ms(t["steady_s"]), f"{t['wall_s'] or 0:.1f}s"]
        if rounds:
            sp = (t.get("spread") or {}).get("step1_s")
            assert _cell(row, header, "step 1 spread ms") == f"{sp['min'] * 1e3:.1f}–{sp['max'] * 1e3:.1f}"
            assert [_cell(row, header, "runs"), _cell(row, header, "round")] == [str(t["rounds"]), str(t["round"])]
    failed = [t for t in a["table"] if not t["ok"]]
    assert len(under) == len(failed) and all(u.startswith("FAILED: ") for u in under)
    assert all(" ".join(t["error"].split())[-160:] in " ".join(under) for t in failed)
    if a.get("baseline") is not None:
        header, rows, _ = _table(lines, "cause", "ms")
        assert header == ["cause", "ms"] + (["spread ms"] if rounds else []) + ["share", "how"]
        comps = sorted(a["components"], key=lambda c: -c["seconds"])
        assert len(rows) == len(comps) + 1
        for c, row in zip(comps, rows):
            assert _cell(row, header, "cause") == c["label"]
            assert _cell(row, header, "ms") == f"{c['seconds'] * 1e3:.1f}"
            assert _cell(row, header, "share") == (f"{100 * c['seconds'] / a['excess_s']:.1f}%"
                                                   if c["seconds"] <= a["excess_s"] else ">100%")
            assert _cell(row, header, "how") == ("within noise; " if c.get("within_noise") else "") + c["how"]
            if rounds:
                assert _cell(row, header, "spread ms") == f"{c['spread']['min'] * 1e3:.1f}–" \
                                                          f"{c['spread']['max'] * 1e3:.1f}"
        last = rows[-1]
        assert _cell(last, header, "cause") == ("unexplained" if a["unexplained_s"] >= 0 else
                                                "causes beyond the excess (noise between the runs)")
        assert _cell(last, header, "ms") == f"{abs(a['unexplained_s']) * 1e3:.1f}"
        assert _cell(last, header, "share") == f"{abs(a['unexplained_pct']):.1f}%"
        if rounds:
            assert f"{a['noise_s'] * 1e3:.1f} ms" in _cell(last, header, "how")


def test_the_fitted_tables_are_the_whole_tables_broken_not_cut(tmp_path):
    """The JAX save with three rounds: at full width (no COLUMNS, or written with -o to a file) its tables are
    wider than 100 characters, one line a row; at 100 they fit by breaking the prose cells (more lines, the same
    words), and the file written with -o at COLUMNS=100 is the full-width page."""
    whole = _page(JAX_ROUNDS, 0)
    fitted = _page(JAX_ROUNDS, 100)
    assert max(map(len, _table_lines(whole.splitlines()))) > 100
    for first, figure in (("run", "step 1"), ("cause", "ms")):
        (h0, rows0, _), (h1, rows1, _) = (_table(whole.splitlines(), first, figure),
                                          _table(fitted.splitlines(), first, figure))
        assert h0 == h1 and len(rows0) == len(rows1)
        assert all(len(cell) == 1 for row in rows0 for cell in row if cell)
        assert any(len(cell) > 1 for row in rows1 for cell in row)
        assert [[" ".join(c) for c in r] for r in rows0] == [[" ".join(c) for c in r] for r in rows1]
    out = tmp_path / "jax.txt"
    r = CliRunner().invoke(main, ["cold-start", "--from", str(JAX_ROUNDS), "-o", str(out)], env={"COLUMNS": "100"})
    assert r.exit_code == 0 and out.read_text(encoding="utf-8") == whole


def test_columns_left_out_at_80_are_named_with_the_file_that_holds_them():
    """At 80 characters the run table of three rounds leaves out its last columns, named on its closing line with
    the output that has them (the page's text file: `cold-start` writes no CSV); the causes table still fits
    whole."""
    page = _page(JAX_ROUNDS, 80)
    lines = page.splitlines()
    assert max(map(len, _table_lines(lines))) <= 80
    flat = " ".join(page.split())
    assert "(3 more columns not shown in 80 characters: step 1 spread ms, runs, round; COLUMNS=0 or -o FILE.txt " \
           "shows every column)" in flat
    assert _table(lines, "cause", "ms")[0] == ["cause", "ms", "spread ms", "share", "how"]
