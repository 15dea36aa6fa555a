"""The conventions the README states, command by command, on real inputs (the shipped datasets, the captured
fixtures): every command writes with -o and the suffix decides the format (one rule: cli/_common.py
`SUFFIX_FORMATS`), a suffix a command does not write is a usage error naming those it does, option misuse
exits 2, tables fit the terminal's width (COLUMNS), and one GEMM's floor ratio is the same figure in the
table and in the advice."""
from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import click
import pandas as pd
import pytest
from click.testing import CliRunner
from conftest import FIXTURES

from cublaslt_probe.analysis.dataset import read_parquet
from cublaslt_probe.cli import main

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "data"
EV = FIXTURES / "evidence"
TST = "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT"
TRACE = FIXTURES / "traces" / "transformer_bf16.json.gz"


def run(*args, env=None, input=None):
    return CliRunner().invoke(main, [str(a) for a in args], env=env, input=input)


def last_error(r) -> str:
    return r.stderr.strip().splitlines()[-1]


# --- every command writes with -o ----------------------------------------------------------------------

def test_every_command_has_o():
    for name, cmd in main.commands.items():
        opts = {o for p in cmd.params if isinstance(p, click.Option) for o in p.opts}
        assert {"-o", "--output"} <= opts, name


@pytest.mark.parametrize("args, suffix, check", [
    (["decode", TST], ".json", lambda t: json.loads(t)[0]["tile_m"] == 256),
    (["decode", TST], ".jsonl", lambda t: json.loads(t.splitlines()[0])["family"] == "nvjet"),
    (["decode", TST], ".csv", lambda t: next(csv.DictReader(t.splitlines()))["stages"] == "4"),
    (["trace", TRACE], ".json", lambda t: isinstance(json.loads(t), list) and json.loads(t)[0]["kernel"]),
    (["trace", TRACE], ".jsonl", lambda t: json.loads(t.splitlines()[0])["kernel"]),
    (["parse-log", FIXTURES / "logs" / "level2_torch.log"], ".json", lambda t: len(json.loads(t)) == 112),
    (["grammars", "nvjet"], ".json", lambda t: json.loads(t)[0]["family"] == "nvjet"),
    (["grammars", "nvjet"], ".txt", lambda t: t.startswith("nvjet  (family nvjet): ")),
    (["schema"], ".json", lambda t: json.loads(t)[0]["column"] == "gpu"),
    (["schema"], ".md", lambda t: t.startswith("| column | type | meaning |")),
    (["candidates", "--from", EV / "candidates_bf16_256x4096x4096.json"], ".csv",
     lambda t: next(csv.DictReader(t.splitlines()))["algo_id"] == "66"),
    (["candidates", "--from", EV / "candidates_bf16_256x4096x4096.json"], ".json",
     lambda t: json.loads(t)["case"]["m"] == 256),
    (["first-call", "--from", EV / "firstcall_bf16_NT_16x4096x4096.json"], ".json", lambda t: json.loads(t)),
    (["explain", "--from", EV / "explain_bf16_NT_16x4096x4096.json"], ".json", lambda t: json.loads(t)["case"]),
    (["replay", EV / "replay_level2_torch.json", "--from"], ".json", lambda t: len(json.loads(t)) > 0),
    (["cold-start", "--from", FIXTURES / "coldstart" / "fp8_linear.json.gz"], ".json",
     lambda t: json.loads(t)["baseline"] == "cold"),
    (["audit", FIXTURES / "programs" / "odd_linear"], ".html", lambda t: t.startswith("<!doctype html>")),
    (["audit", FIXTURES / "programs" / "odd_linear"], ".json", lambda t: json.loads(t)[0]["module"] == "odd"),
    (["diff", DATA / "h200_llm.parquet", DATA / "h200_llm.parquet", "--backends", "torch,torch-lt"], ".json",
     lambda t: len(json.loads(t)) == 328),
])
def test_the_suffix_decides_the_format(args, suffix, check, tmp_path):
    out = tmp_path / f"out{suffix}"
    r = run(*args, "-o", out)
    assert r.exit_code == 0, r.output
    assert r.stdout == ""
    assert check(out.read_text(encoding="utf-8"))
    assert re.fullmatch(rf"wrote (?:[\d,]+ rows to )?{re.escape(str(out))}.*", r.stderr.splitlines()[-1])


@pytest.mark.parametrize("args", [["decode", TST], ["grammars", "nvjet"], ["schema"],
                                  ["explain", "--from", EV / "explain_bf16_NT_16x4096x4096.json"],
                                  ["cold-start", "--from", FIXTURES / "coldstart" / "fp8_linear.json.gz"]])
def test_a_txt_file_holds_what_stdout_shows(args, tmp_path):
    out = tmp_path / ("out.md" if args == ["schema"] else "out.txt")
    to_file, to_stdout = run(*args, "-o", out), run(*args)
    assert to_file.exit_code == to_stdout.exit_code == 0
    assert out.read_text(encoding="utf-8") == to_stdout.stdout


def test_parquet_by_suffix_is_parquet(tmp_path):
    out = tmp_path / "t.parquet"
    assert run("trace", TRACE, "-o", out).exit_code == 0
    assert out.read_bytes()[:4] == b"PAR1" and len(pd.read_parquet(out)) == 12


@pytest.mark.parametrize("args, name, line", [
    (["decode", TST], "x.parquet", "Error: -o {o}: `decode` writes .txt, .csv, .jsonl or .json, not .parquet: "
                                   "give -o a name ending in one of them"),
    (["trace", TRACE], "t.xyz", "Error: -o {o}: `trace` writes .txt, .csv, .jsonl, .json or .parquet, not .xyz: "
                                "give -o a name ending in one of them"),
    (["grammars"], "g.csv", "Error: -o {o}: `grammars` writes .txt or .json, not .csv: give -o a name ending in "
                            "one of them"),
    (["schema"], "s.txt", "Error: -o {o}: `schema` writes .md or .json, not .txt: give -o a name ending in one of "
                          "them"),
    (["dataset", DATA / "h200_grid.raw.jsonl.gz"], "d.csv",
     "Error: -o {o}: `dataset` writes .parquet, not .csv: give -o a name ending in it"),
    (["merge", DATA / "h200_grid.parquet"], "m.jsonl",
     "Error: -o {o}: `merge` writes .parquet, not .jsonl: give -o a name ending in it"),
    (["map"], "m.gif", "Error: -o {o}: `map` writes .png, .svg or .pdf, not .gif: give -o a name ending in one of "
                       "them"),
    (["report"], "r.pdf", "Error: -o {o}: `report` writes .html, not .pdf: give -o a name ending in it"),
    (["audit", FIXTURES / "programs" / "odd_linear"], "a.txt.gz",
     "Error: -o {o}: `audit` writes .txt, .csv, .jsonl, .json, .parquet or .html, not .gz: give -o a name ending "
     "in one of them"),
])
def test_a_suffix_the_command_does_not_write_is_a_usage_error(args, name, line, tmp_path):
    out = tmp_path / name
    r = run(*args, "-o", out)
    assert r.exit_code == 2
    assert last_error(r) == line.format(o=out)
    assert not out.exists()


def test_format_and_suffix_must_agree(tmp_path):
    r = run("grammars", "-f", "json", "-o", tmp_path / "g.txt")
    assert r.exit_code == 2
    assert last_error(r) == f"Error: -o {tmp_path / 'g.txt'} names a text file but --format json was asked: " \
                            f"write {tmp_path / 'g'}.json or drop --format"


def test_report_writes_the_page_where_a_html_is_given(tmp_path):
    """-o X.html writes the page X.html (its folder made), not a folder X.html/ with an index.html: on a slice
    of the shipped grid (the small bf16 shapes), as the choice of the output depends on -o alone."""
    from cublaslt_probe.analysis.dataset import write_parquet
    from cublaslt_probe.render import plots
    grid = plots.load(DATA / "h200_grid.parquet")
    data = tmp_path / "slice.parquet"
    write_parquet(grid[(grid["m"] <= 32) & (grid["n"] <= 32) & (grid["dtype"] == "bf16")].reset_index(drop=True),
                  data, grid.attrs["env"])
    out = tmp_path / "sub" / "r.html"
    r = run("report", data, "-o", out, "--dpi", "20", "--quiet")
    assert r.exit_code == 0, r.output
    assert out.is_file() and not (out / "index.html").exists()
    assert out.read_text(encoding="utf-8").startswith("<!doctype html>")


def test_merge_of_two_separate_datasets_says_what_to_do(tmp_path):
    r = run("merge", DATA / "h200_grid.parquet", DATA / "h200_llm.parquet", "-o", tmp_path / "m.parquet")
    assert r.exit_code == 1
    line = last_error(r)
    assert line.startswith("Error: the parts do not hold their GEMMs (12844 GEMMs) exactly once: 265 GEMMs are in "
                           "two parts (")
    assert line.endswith("these are datasets of separate sweeps, not parts of one: give each to map, plot, report "
                         "or audit on its own, or compare two with `cublaslt-probe diff A B`")


# --- usage errors exit 2 -------------------------------------------------------------------------------

@pytest.mark.parametrize("args, line", [
    (["explain", "--m", "16"], "Error: give --m, --n and --k (or --from FILE.json)"),
    (["candidates", "--m", "1", "--n", "1", "--k", "1", "--dtype", "fp8", "--layout", "NN"],
     "Error: lt/scaled_mm/fp8/NN: fp8 scaled_mm needs layout NT (A row-major, B column-major: cuBLAS TN)"),
    (["replay", FIXTURES / "logs" / "level2_torch.log"], "Error: give --line N or --all"),
    (["cold-start"], "Error: no program: use `cublaslt-probe cold-start -- python SCRIPT.py [ARGS]` (or --from "
                     "FILE.json)"),
    (["cold-start", "--from", "x.json", "--", "python", "s.py"],
     "Error: give either --from FILE.json or a script after `--`, not both"),
    (["sweep", "-o", "x.parquet"], "Error: give exactly one of --preset NAME or --spec FILE"),
    (["sweep", "--preset", "quick", "--shard-count", "2", "-o", "x.parquet"],
     "Error: --shard-count goes with --shard auto (in a Kubernetes Indexed Job)"),
    (["sweep", "--preset", "quick", "--shard", "5/2", "-o", "x.parquet"],
     "Error: --shard '5/2': expected I/N with 1 <= I <= N, e.g. 1/4, or auto"),
    (["sweep", "--preset", "quick", "--backends", "foo", "-o", "x.parquet"],
     "Error: --backends foo: unknown backend foo; choose from torch, torch-lt, cupy, lt, numpy"),
    (["plot", "heuristic", "--x", "q"], "Error: unknown x axis 'q' for the heuristic plot; choose m, n, k or batch"),
    (["map", "--color", "nope", "--dtype", "bf16"],
     "Error: cannot colour by 'nope': the dataset has no column nope. Choose kernel, tile, cluster, family, split_k, "
     "or a dataset column (" + ", ".join(c for c in read_parquet(DATA / "h200_grid.parquet").columns) + ")"),
    (["explain", "--m", "16", "--n", "64", "--k", "64", "--save", "e.csv"],
     "Error: --save e.csv: `explain` writes .json, not .csv: give --save a name ending in it"),
    (["cold-start", "--save", "c.txt", "--", "python", "s.py"],
     "Error: --save c.txt: `cold-start` writes .json, not .txt: give --save a name ending in it"),
    (["map", "--x", "foo"], "Error: unknown x axis 'foo'; choose one of m, n, k, batch, nk, dtype, layout, op, "
                            "backend"),
    (["plot", "tflops", "--x", "m", "--y", "m"], "Error: x and y are both 'm': choose two different axes"),
    (["diff", DATA / "h200_llm.parquet", DATA / "h200_llm.parquet", "--map", "w.gif"],
     "Error: --map w.gif: `diff` writes .png, .svg or .pdf, not .gif: give --map a name ending in one of them"),
    (["audit", FIXTURES / "programs" / "odd_linear", "--html", "a.txt"],
     "Error: --html a.txt: `audit` writes .html, not .txt: give --html a name ending in it"),
    (["audit", FIXTURES / "programs" / "odd_linear", "--pid", "12345"],
     "Error: --pid 12345: no such process in this trace: it holds 454"),
])
def test_option_misuse_exits_2(args, line, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = run(*args)
    assert r.exit_code == 2, r.output
    assert last_error(r) == line
    assert "Traceback" not in r.output


# --- tables fit the terminal ---------------------------------------------------------------------------

@pytest.mark.parametrize("args, columns", [
    (["audit", FIXTURES / "programs" / "gpt2_train"], 80),
    (["audit", FIXTURES / "programs" / "gpt2_train"], 120),
    (["trace", FIXTURES / "moe" / "mixtral_train" / "trace.json.gz"], 80),
    (["trace", FIXTURES / "moe" / "mixtral_train" / "trace.json.gz"], 120),
    (["trace", FIXTURES / "moe" / "mixtral_train" / "trace.json.gz", "--by", "class"], 80),
    (["decode", TST, "sm90_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_"
                     "k_off_kernel__5x_cublas"], 80),
    (["parse-log", FIXTURES / "logs" / "level2_torch.log"], 80),
    (["parse-log", FIXTURES / "logs" / "level2_torch.log", "--summary"], 80),
    (["diff", DATA / "h200_llm.parquet", DATA / "h200_llm.parquet", "--backends", "torch,torch-lt"], 80),
    (["diff", DATA / "h200_llm.parquet", DATA / "h200_llm.parquet", "--backends", "torch,torch-lt"], 120),
])
def test_a_table_fits_the_terminal(args, columns):
    wide = run(*args)
    assert wide.exit_code == 0
    rows = _table_lines(wide.stdout)
    assert max(map(len, rows)) > columns         # the table is wider than the terminal ...
    r = run(*args, env={"COLUMNS": str(columns)})
    assert r.exit_code == 0
    fitted = _table_lines(r.stdout)
    assert len(fitted) == len(rows)              # ... and fits it, row for row
    assert max(map(len, fitted)) <= columns, max(fitted, key=len)


def _table_lines(text: str) -> list[str]:
    """The lines of the first table of `text`: from the line above its dashed rule (the first line when it has
    none) to the first empty line."""
    lines = text.splitlines()
    i = next((i for i, ln in enumerate(lines) if re.fullmatch(r"[- ]+", ln) and "--" in ln), 1)
    out = lines[i - 1:i + 1]
    for ln in lines[i + 1:]:
        if not ln.strip() or ln.startswith(("…", "(")):
            break
        out.append(ln)
    return out


MOE = FIXTURES / "moe"
PROSE = [
    ["audit", MOE / "mixtral_train", "--from", MOE / "measure" / "mixtral_train.json"],
    ["audit", FIXTURES / "programs" / "gpt2_train", "--from", FIXTURES / "programs" / "measure" / "gpt2_train.json"],
    ["trace", FIXTURES / "programs" / "gpt2_train" / "trace.json.gz"],
    ["diff", DATA / "h200_grid.parquet", DATA / "h200_square.parquet"],
    ["grammars", "nvjet"],
]


def _over(text: str, columns: int) -> list[str]:
    """The lines wider than `columns` that hold more than one word (a kernel name alone may be wider)."""
    return [ln for ln in text.splitlines() if len(ln) > columns and len(ln.split()) > 1]


@pytest.mark.parametrize("args", PROSE, ids=lambda a: " ".join(str(x).split("/")[-1] for x in a[:2]))
def test_prose_fits_the_terminal(args):
    """Sentences, advice, notes and headers are broken at spaces to the terminal's width, as tables are
    fitted to it: no line of the captured runs' outputs is wider than 80 characters but a lone kernel name."""
    wide = run(*args, env={"COLUMNS": "0"})
    assert wide.exit_code == 0 and _over(wide.stdout, 120)      # wider than the terminal without the width
    r = run(*args, env={"COLUMNS": "80"})
    assert r.exit_code == 0
    assert not _over(r.stdout, 80), _over(r.stdout, 80)[:3]


def test_wrapped_prose_keeps_every_word_and_figure():
    """`wrap` on a whole audit (advice with kernel names, notes, host stalls, tables): every word in order, a
    figure on the line of its unit, a kernel name whole, the continuation under the item's text, and the
    table's rows untouched."""
    from cublaslt_probe.render.text import wrap
    text = run(*PROSE[0], env={"COLUMNS": "0"}).stdout + run(*PROSE[1], env={"COLUMNS": "0"}).stdout
    out = wrap(text, 80)
    assert out.split() == text.split() and out != text
    rows = [ln for ln in text.splitlines() if "  " in ln.strip() and len(ln) > 80]
    assert rows and set(_over(out, 80)) == set(rows)            # only the (unfitted) table rows are wider
    assert not re.search(r"\d\n\s*(µs|ms|%)", out)
    assert "sm90_xmma_gemm_f32f32_tf32f32_f32_nt_n_tilesize128x256x32_warpgroupsize2x1x1_execute_segment_k_off_" \
           "kernel__5x_cublas" in out
    item = next(ln for ln in out.splitlines() if ln.startswith("1. pad the vocabulary"))
    after = out.splitlines()[out.splitlines().index(item) + 1]
    assert after.startswith("   ") and not after.startswith("    ")


def test_a_fitted_table_names_the_columns_it_left_out():
    r = run("audit", FIXTURES / "programs" / "gpt2_train", env={"COLUMNS": "80"})
    assert ("\n(11 more columns not shown in 80 characters: n, k, groups, family, provenance,\n  decoded, algo, "
            "pct_peak, floor_ratio, waves, flags; COLUMNS=0 or -o FILE.csv\n  shows every column)\n") in r.stdout
    assert "more column" not in run("audit", FIXTURES / "programs" / "gpt2_train", env={"COLUMNS": "0"}).stdout


def test_a_table_written_to_a_file_keeps_every_column(tmp_path):
    out = tmp_path / "t.txt"
    r = run("trace", TRACE, "-o", out, env={"COLUMNS": "60"})
    assert r.exit_code == 0
    assert out.read_text(encoding="utf-8") == run("trace", TRACE).stdout


def test_module_paths_are_cut_at_their_start():
    r = run("audit", FIXTURES / "programs" / "gpt2_train", env={"COLUMNS": "120"})
    assert re.search(r"^ 3\.4%\s+12\s+1,269\.2\s+…\S*c_proj ×12\s", r.stdout, re.M), r.stdout


# --- one figure, one rounding ----------------------------------------------------------------------------

@pytest.mark.parametrize("run_name", ["gpt2_train", "llama_prefill", "odd_linear", "mixtral_moe"])
def test_a_floor_ratio_is_the_same_in_the_table_and_the_advice(run_name):
    r = run("audit", FIXTURES / "programs" / run_name, "--from", FIXTURES / "programs" / "measure" /
            f"{run_name}.json", "--top", "0")
    assert r.exit_code == 0, r.output
    table: dict[tuple, set] = {}     # (module, op, dtype, layout, m, n, k) -> the floor ratios the table prints
    lines = r.stdout.splitlines()
    head = next(ln for ln in lines if ln.startswith("share "))
    at = head.index("floor_ratio")
    for ln in lines[lines.index(head) + 2:]:
        if not ln.strip():
            break
        m = re.search(r"\d\s+(\S+)(?: ×\d+)?\s+(?:fwd|bwd)?\s+aten::(\S+)\s+(\w+)\s+(\w\w)\s+(\d+)\s+(\d+)\s+(\d+)",
                      ln)
        table.setdefault(m.groups(), set()).add(ln[at:at + len("floor_ratio")].strip())
    said = re.findall(r"^- aten::(\S+) (\w+) (\w\w) (\d+)×(\d+)×(\d+) \((\S+)\): at ([\d.]+)× its floor",
                      r.stdout, re.M)
    assert said
    for op, dt, lay, m, n, k, module, ratio in said:
        assert ratio in table[(module, op, dt, lay, m, n, k)], (module, op, dt, lay, m, n, k, ratio)
