"""The H200 space atlas (data/h200_space.parquet, its three raw captures) and `candidates --space` on real
captures: the schema, the columns as the raw records give them, the trust labels' rules, numerics gating, the
figures by dtype and token class, the report page."""
import copy
import gzip
import json
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from cublaslt_probe.analysis import dataset
from cublaslt_probe.analysis import space as sm
from cublaslt_probe.cli import main

ROOT = Path(__file__).resolve().parent.parent
ATLAS = ROOT / "data" / "h200_space.parquet"
# The captures the atlas is built from (data/PROVENANCE.md) and their GEMM records: bf16 at 16, 128 and 1 tokens
# (complete); bf16 at 4 to 4,096 tokens (cut by its deadline: 104 of 144); fp8 at 16 and 128 tokens (20 of 32).
RAWS = {"h200_space.raw.jsonl.gz": 48, "h200_space_more_tokens.raw.jsonl.gz": 104,
        "h200_space_fp8.raw.jsonl.gz": 20}
CAND = ROOT / "tests" / "fixtures" / "evidence" / "candidates_space_bf16_16x4096x4096.json"


@pytest.fixture(scope="module")
def atlas():
    return dataset.read_parquet(ATLAS)


@pytest.fixture(scope="module")
def raw():
    out = []
    for name, n in RAWS.items():
        with gzip.open(ROOT / "data" / name, "rt") as f:
            recs = [r for r in map(json.loads, f) if "key" in r]
        assert len(recs) == n, name
        out += recs
    return out


def test_the_atlas_has_the_schema_and_every_gemm_searched(atlas):
    dataset.validate(atlas)
    assert len(atlas) == 172 and atlas["error"].isna().all()
    assert atlas["dtype"].value_counts().to_dict() == {"bf16": 152, "fp8": 20}
    assert atlas["space_regret"].notna().all() and atlas["space_regret_label"].isin(sm.LABELS).all()
    assert (atlas["space_timed"] >= atlas["space_pruned"]).all() and (atlas["space_timed"] > 0).all()
    assert atlas["numerics_ok"].all() and atlas["pick_in_space"].all()
    for c in ("nvmmh_us", "nvmmh_agrees", "nvmmh_log_err", "nvmmh_space_agrees", "nvmmh_space_log_err"):
        assert atlas[c].notna().all(), c


def test_fp8_rows_are_scored_as_fp8_by_nvmmh(atlas):
    """An fp8 row's model columns are the model's answer for the fp8 problem (QQTST), not the bf16 one."""
    pytest.importorskip("nvMatmulHeuristics", reason="the model is asked again (the test extra's wheel)")
    from cublaslt_probe import nvmmh
    fp8 = atlas[atlas["dtype"] == "fp8"]
    for r in fp8.head(4).itertuples():
        top = nvmmh.configs(int(r.m), int(r.n), int(r.k), "fp8", r.layout)[0]
        assert r.nvmmh_us == pytest.approx(top.pred_us) and r.nvmmh_tile == top.tile
        assert r.nvmmh_us != pytest.approx(nvmmh.configs(int(r.m), int(r.n), int(r.k), "bf16", r.layout)[0].pred_us)


def test_the_atlas_columns_are_what_the_raw_records_say(atlas, raw):
    by_key = atlas.set_index("key")
    assert len(raw) == len(atlas) and {r["key"] for r in raw} == set(by_key.index)
    for r in raw:
        want = sm.columns(r["space"])
        row = by_key.loc[r["key"]]
        for col, v in want.items():
            got = row[col]
            if v is None:
                assert pd.isna(got), (r["key"], col)
            elif isinstance(v, float):
                assert got == pytest.approx(v), (r["key"], col)
            else:
                assert got == v, (r["key"], col)


def test_every_label_follows_the_trust_rule(atlas):
    for r in atlas.itertuples():
        pct = r.space_regret * 100
        if r.space_regret_label == "pick is best":
            assert pct == 0 and r.space_best_us == r.space_pick_us
        elif r.space_regret_label == "loss":
            assert pct > r.space_noise_pct and r.space_flip_rate <= sm.FLIP_LIMIT
        else:
            assert pct <= r.space_noise_pct or r.space_flip_rate > sm.FLIP_LIMIT
        assert r.space_noise_pct >= sm.NOISE_FLOOR_PCT


def test_the_trust_model_recomputed_from_the_recorded_rounds(raw, atlas):
    """The rounds a capture recorded give back its winner, regret and noise floor; the label is the current
    rule's (`record_trust`), which the atlas's column holds."""
    labels = atlas.set_index("key")["space_regret_label"]
    for r in raw:
        tr = r["space"]["trust"]
        again = sm.record_trust(r["space"])
        assert {k: again[k] for k in ("winner", "regret_pct", "noise_pct", "medians")} == \
            {k: tr[k] for k in ("winner", "regret_pct", "noise_pct", "medians")}
        assert labels[r["key"]] == again["label"]


def test_a_pick_that_failed_its_numerics_is_never_the_best(raw):
    """Mutation of real records: the pick's output marked wrong. Its rounds stay, but the space's best is
    another finalist, the regret is no loss of the pick's, and `numerics_ok` is false."""
    changed = 0
    for r in raw:
        sp = copy.deepcopy(r["space"])
        names = [n for n in sp["finalists"] if n != "pick"]
        if not names:
            continue
        sp["pick"]["numerics_ok"] = False
        tr = sm.trust(sp["trust"]["times"], "pick", names, pick_ok=False)
        assert tr["winner"] != "pick" and tr["label"] != "pick is best"
        sp["trust"] = tr
        col = sm.columns(sp)
        assert col["numerics_ok"] is False and col["space_best_us"] == tr["medians"][tr["winner"]]
        changed += 1
    assert changed == len(raw)


def test_a_failed_search_leaves_the_row_s_space_columns_null(raw):
    """Mutation of a real record: its search failed. The row keeps the GEMM's own measurement; every space
    column is null."""
    rec = copy.deepcopy(raw[0])
    rec["space"] = {"error": "CaptureError: cublasLtMatmulAlgoCheck returned cublasStatus 15"}
    df = dataset.build([rec], {})
    assert df["time_us"].iloc[0] > 0
    assert all(pd.isna(df[c].iloc[0]) for c in sm.SCHEMA)


def test_summary_and_classes_of_the_atlas(atlas):
    s = sm.summary(atlas)
    assert s["gemms"] == 172 and sum(s["labels"].values()) == 172 and s["dtypes"] == {"bf16": 152, "fp8": 20}
    assert s["labels"]["loss"] == int((atlas["space_regret_label"] == "loss").sum())
    assert s["regret_pct"]["max"] == pytest.approx(100 * atlas["space_regret"].max())
    assert s["best_outside_topn"] == int((atlas["space_best_in_topn"] == False).sum())  # noqa: E712
    cls = sm.by_class(atlas)
    assert list(cls["worst_regret_pct"]) == sorted(cls["worst_regret_pct"], reverse=True)
    assert cls.groupby("dtype", observed=True)["gemms"].sum().to_dict() == {"bf16": 152, "fp8": 20}
    fp8 = atlas[atlas["dtype"] == "fp8"]
    assert cls[cls["dtype"] == "fp8"]["worst_regret_pct"].max() == pytest.approx(100 * fp8["space_regret"].max())


# The token classes written out here, apart from the code's TOKEN_CLASSES: m from, m to.
TOKENS = {"decode": (1, 16), "small": (17, 256), "mid": (257, 2048), "large": (2049, 10**9)}


def _rows_of(atlas, r: dict):
    """The atlas's rows a `by_tokens` / `nvmmh_by_tokens` row stands for: its dtype, and its token class's m."""
    cls = r["tokens"].split()[0]
    g = atlas[atlas["dtype"] == r["dtype"]]
    if cls != "all":
        lo, hi = TOKENS[cls]
        g = g[(g["m"] >= lo) & (g["m"] <= hi)]
    return g


def test_the_figures_by_dtype_and_token_class(atlas):
    """Each (dtype, token class) row of `by_tokens` is its GEMMs' figures, recomputed here from the rows; each
    dtype ends with its "all" row. The atlas has bf16 in all four classes, fp8 at 16 and 128 tokens."""
    t = sm.by_tokens(atlas)
    want = [("bf16", c) for c in ("decode", "small", "mid", "large", "all")] + \
        [("fp8", c) for c in ("decode", "small", "all")]
    assert [(r.dtype, r.tokens.split()[0]) for r in t.itertuples()] == want
    for r in t.to_dict("records"):
        g = _rows_of(atlas, r)
        reg = 100 * g["space_regret"].astype(float)
        assert r["gemms"] == len(g) and r["m"] == ", ".join(str(m) for m in sorted(set(g["m"])))
        assert r["regret_median_pct"] == pytest.approx(reg.median())
        assert r["regret_p90_pct"] == pytest.approx(reg.quantile(0.9))
        assert r["regret_worst_pct"] == pytest.approx(reg.max())
        for lab in sm.LABELS:
            assert r[lab] == (g["space_regret_label"] == lab).sum()
        outside = int((~g["space_best_in_topn"].astype(bool)).sum())
        assert r["best_outside_topn"] == outside and r["best_outside_topn_pct"] == pytest.approx(100 * outside / len(g))
        assert r["kernels"] == int(g["space_kernels"].median())
        assert r["configs_valid"] == int(g["space_configs"].median())
    nv = sm.nvmmh_by_tokens(atlas)
    assert list(nv["tokens"]) == list(t["tokens"]) and list(nv["dtype"]) == list(t["dtype"])
    for r in nv.to_dict("records"):
        g = _rows_of(atlas, r)
        assert r["tile_is_pick_s_pct"] == pytest.approx(100 * g["nvmmh_agrees"].astype(bool).mean())
        assert r["tile_is_space_best_s_pct"] == pytest.approx(100 * g["nvmmh_space_agrees"].astype(bool).mean())
        assert r["median_abs_log_err_pick"] == pytest.approx(g["nvmmh_log_err"].abs().median())
        assert r["median_abs_log_err_space_best"] == pytest.approx(g["nvmmh_space_log_err"].abs().median())


def test_summary_refuses_a_dataset_without_space(tmp_path):
    df = dataset.read_parquet(ROOT / "data" / "h200_regret.parquet")
    from cublaslt_probe.errors import SchemaError
    with pytest.raises(SchemaError, match="--space"):
        sm.summary(df)


def test_the_report_page_has_the_space_section(atlas, tmp_path):
    from cublaslt_probe.render import report
    page = report.build_report(atlas, tmp_path / "r.html", dpi=30).read_text(encoding="utf-8")
    s = sm.summary(atlas)
    assert 'id="space"' in page and "The whole algo space" in page
    assert f"<b>{s['labels']['loss']}</b> losses beyond noise" in page
    assert "nvMatmulHeuristics" in page and "Shape classes, worst first" in page
    assert "For 172 GEMMs (bf16 152, fp8 20)" in page and "By dtype and token count" in page
    assert "<th>fp8: loss</th>" in page and "<th>bf16: within noise</th>" in page
    tok = page[page.index("By dtype and token count"):page.index("Regret distribution")]
    assert "<td>fp8</td>" in tok and "<td>small (17–256)</td>" in tok and "<td>large (m &gt; 2048)</td>" in tok
    nv = page[page.index("<h3>nvMatmulHeuristics"):]
    assert nv.count("<td>fp8</td>") == 3 and nv.count("<td>bf16</td>") == 5


def test_candidates_space_renders_from_a_saved_capture():
    r = CliRunner().invoke(main, ["candidates", "--from", str(CAND)])
    assert r.exit_code == 0, r.output
    sp = json.loads(CAND.read_text())["space"]
    col = sm.columns(sp)
    assert "whole space (" in r.output and "trust: pick is best" in r.output
    assert f"space regret = pick / space best - 1 = {col['space_regret'] * 100:+.1f} % (loss" in r.output
    assert "space_1   66 256x16 64xAUTO 4x1x1 c1 s0 k4 COMPUTE_TYPE" in r.output
    j = CliRunner().invoke(main, ["candidates", "--from", str(CAND), "-f", "json"])
    got = json.loads(j.output)
    assert got["space_columns"]["space_regret_label"] == "loss" and got["regret"]["regret_label"] == "pick is best"


def test_a_wrong_candidate_is_never_the_fastest():
    """Mutation of the real capture: candidate #3 made the fastest by far, but its output marked wrong
    (`numerics_ok` false, as `lt_candidates` records it against the float64 reference): the regret ignores it."""
    from cublaslt_probe.analysis import candidates as cm
    cands = copy.deepcopy(json.loads(CAND.read_text())["candidates"])
    for c in cands:
        c.pop("trust", None)
    cands[3]["time_us"] = 1.0
    assert cm.regret(cands, "bf16")["best_rank"] == 3
    cands[3]["numerics_ok"] = False
    reg = cm.regret(cands, "bf16")
    assert reg["best_rank"] != 3 and reg["best_time_us"] > 1.0


def test_the_candidates_regret_is_the_trust_model_s():
    from cublaslt_probe.analysis import candidates as cm
    cands = json.loads(CAND.read_text())["candidates"]
    tr = cands[0]["trust"]
    reg = cm.regret(cands, "bf16")
    assert reg["regret_label"] == tr["label"] == "pick is best" and reg["best_rank"] == 0
    assert reg["noise_pct"] == tr["noise_pct"] and reg["pick_time_us"] == tr["medians"]["pick"]


def _doc_rows(table_head: str) -> list[list[str]]:
    """The rows of the docs/space.md table whose header starts with `table_head`: cells without ** and spaces."""
    lines = (ROOT / "docs" / "space.md").read_text(encoding="utf-8").splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith(table_head))
    rows = []
    for ln in lines[start + 2:]:
        if not ln.startswith("|"):
            break
        rows.append([c.strip().replace("**", "") for c in ln.strip("|").split("|")])
    return rows


def test_the_docs_atlas_tables_are_the_atlas_s_figures(atlas):
    """docs/space.md's two atlas tables, row by row, are `by_tokens` and `nvmmh_by_tokens` on the shipped atlas
    (to the digits written)."""
    t = sm.by_tokens(atlas)
    doc = _doc_rows("| dtype | tokens | GEMMs | regret median")
    assert len(doc) == len(t)
    for cells, r in zip(doc, t.to_dict("records")):
        assert cells[0] == r["dtype"] and int(cells[2]) == r["gemms"], cells
        want_m = "all" if r["tokens"] == "all" else ", ".join(f"{int(m):,}" for m in r["m"].split(", "))
        assert cells[1] == want_m, cells
        assert cells[3] == " / ".join(f"{r[c]:.1f}" for c in ("regret_median_pct", "regret_p90_pct",
                                                                 "regret_worst_pct")) + " %", cells
        assert cells[4] == " / ".join(str(r[lab]) for lab in sm.LABELS), cells
        assert cells[5] == f"{r['best_outside_topn']} ({r['best_outside_topn_pct']:.0f} %)", cells
        assert cells[6] == f"{r['noise_median_pct']:.1f} %", cells
        assert cells[9] == f"{r['timed']} / {r['pruned']}", cells
    nv = sm.nvmmh_by_tokens(atlas)
    doc = _doc_rows("| dtype | tokens | GEMMs | top-1 tile")
    assert len(doc) == len(nv)
    for cells, r in zip(doc, nv.to_dict("records")):
        assert cells[0] == r["dtype"] and int(cells[2]) == r["gemms"], cells
        assert cells[3:] == [f"{r['tile_is_pick_s_pct']:.1f} %", f"{r['tile_is_space_best_s_pct']:.1f} %",
                             f"{r['median_abs_log_err_pick']:.2f}", f"{r['median_abs_log_err_space_best']:.2f}",
                             f"{r['median_pred_over_pick']:.2f}"], cells


def test_each_rows_search_budget_and_time_are_its_records(atlas, raw):
    """The atlas mixes budgets (0.6 s a GEMM in the first capture, 1.2 s in the two later): each row says its
    own (`space_budget_s`) and what its search took (`space_elapsed_s`), as its raw record has them."""
    assert atlas.groupby(["dtype", "space_budget_s"], observed=True).size().to_dict() == {
        ("bf16", 0.6): 48, ("bf16", 1.2): 104, ("fp8", 1.2): 20}
    by_key = {r["key"]: r["space"] for r in raw}
    for r in atlas.itertuples():
        sp = by_key[r.key]
        assert r.space_budget_s == sp["budget_s"] and r.space_elapsed_s == pytest.approx(sp["elapsed_s"])
    assert (atlas["space_elapsed_s"] > 0).all()
