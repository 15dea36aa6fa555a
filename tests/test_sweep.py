"""Sweep planning, sharding, incremental writing, resume and error rows, run for real on the CPU (numpy)."""
import json
import os

import pytest
from click.testing import CliRunner

from cublaslt_probe import sweep
from cublaslt_probe.analysis import dataset
from cublaslt_probe.cases import invalid_reason
from cublaslt_probe.cli import main
from cublaslt_probe.errors import ProbeError, SpecError

NUMPY_SPEC = {"name": "cpu", "group": [
    {"backends": ["numpy"], "ops": ["mm", "addmm"], "dtypes": ["fp32", "fp16"], "layouts": ["NN", "NT", "TN", "TT"],
     "m": [1, 16, 33], "n": [8, 64], "k": [16]},
    {"backends": ["numpy"], "ops": ["bmm"], "dtypes": ["fp32"], "layouts": ["NN"], "shapes": [[4, 8, 16, 3]]},
]}


def test_presets_plan_deterministically_and_only_valid_cases():
    for name in sweep.PRESETS:
        a, b = sweep.plan(name), sweep.plan(name)
        assert [c.key for c in a.cases] == [c.key for c in b.cases]
        assert len({c.key for c in a.cases}) == len(a.cases)
        assert all(invalid_reason(c) is None for c in a.cases)
    assert 150 <= len(sweep.plan("quick").cases) <= 250
    llm = sweep.plan("llm")
    assert {c.m for c in llm.cases} >= {1, 16384}
    assert {(c.n, c.k) for c in llm.cases} >= {(4096, 4096), (57344, 8192), (8192, 28672), (128256, 4096)}
    sq = sweep.plan("square")
    assert all(c.m == c.n == c.k for c in sq.cases)
    assert {4095, 4096, 4097, 4080, 4112} <= {c.m for c in sq.cases}
    dec = sweep.plan("decode")
    assert {c.m for c in dec.cases if c.dtype == "bf16"} == set(range(1, 257))


def test_product_skips_invalid_combinations_with_reasons():
    p = sweep.plan_from_spec({"group": [{"backends": ["torch", "cupy"], "ops": ["mm", "scaled_mm"],
                                         "dtypes": ["bf16", "fp8"], "layouts": ["NN", "NT"],
                                         "shapes": [[16, 32, 64]]}]})
    keys = {c.key for c in p.cases}
    assert keys == {"torch|mm|bf16|NN|16|32|64|1", "torch|mm|bf16|NT|16|32|64|1", "torch|scaled_mm|fp8|NT|16|32|64|1"}
    reasons = " ".join(p.skipped)
    assert "fp8 runs only as op scaled_mm" in reasons and "cupy backend runs fp32 and fp16 only" in reasons
    assert "left out" in p.summary()


@pytest.mark.parametrize("bad, msg", [
    ({"group": [{"dtypes": ["bf17"], "shapes": [[1, 2, 3]]}]}, "unknown ['bf17']"),
    ({"group": [{"m": [1], "n": [2]}]}, "give `shapes` or all of m, n, k"),
    ({"group": [{"shapes": [[1, 2]]}]}, "must be [m, n, k]"),
    ({"group": [{"m": {"pow2": [8, 2]}, "n": [1], "k": [1]}]}, "pow2 = [lo, hi]"),
    ({"group": [{"colour": "red", "shapes": [[1, 2, 3]]}]}, "unknown keys ['colour']"),
    ({"name": "x"}, "at least one [[group]]"),
])
def test_bad_specs_name_the_problem(bad, msg):
    with pytest.raises(SpecError) as e:
        sweep.plan_from_spec(bad)
    assert msg in str(e.value)


def test_axis_expansion():
    assert sweep.expand_axis({"pow2": [64, 256], "neighbours": [1, 16]}, "m") == \
        [48, 63, 64, 65, 80, 112, 127, 128, 129, 144, 240, 255, 256, 257, 272]
    assert sweep.expand_axis({"range": [1, 9, 4]}, "m") == [1, 5, 9]
    assert sweep.expand_axis([3, 1, 3], "m") == [1, 3]


def test_toml_and_json_spec_files(tmp_path):
    toml = tmp_path / "s.toml"
    toml.write_text('name = "t"\n[[group]]\nbackends = ["torch"]\ndtypes = ["bf16"]\nlayouts = ["NT"]\n'
                    'm = {pow2 = [1, 8]}\nn = [4096]\nk = [4096]\n')
    p = sweep.plan(spec_path=str(toml))
    assert [c.m for c in p.cases] == [1, 2, 4, 8] and p.name == "t"
    js = tmp_path / "s.json"
    js.write_text(json.dumps(NUMPY_SPEC))
    assert len(sweep.plan(spec_path=str(js)).cases) == 3 * 2 * 2 * 4 * 2 + 1
    with pytest.raises(SpecError, match="use a .toml or .json"):
        sweep.load_spec(str(tmp_path / "s.yaml")) if (tmp_path / "s.yaml").write_text("x") else None
    with pytest.raises(SpecError, match="exactly one"):
        sweep.plan("quick", str(toml))


def test_shards_partition_the_plan():
    cases = sweep.plan("quick").cases
    parts = [sweep.shard(cases, f"{i}/3") for i in (1, 2, 3)]
    keys = [c.key for p in parts for c in p]
    assert sorted(keys) == sorted(c.key for c in cases) and len(keys) == len(set(keys))
    for bad in ("0/3", "4/3", "x", "1-3"):
        with pytest.raises(SpecError, match="I/N"):
            sweep.shard(cases, bad)


def _plan():
    return sweep.plan_from_spec(NUMPY_SPEC).cases


def test_numpy_sweep_writes_dataset_and_error_rows(tmp_path):
    cases = _plan()
    out = str(tmp_path / "d.parquet")
    fail = {cases[5].key}
    df = sweep.run(cases, out, sweep.NumpyExecutor(fail_keys=fail), window=7, progress=False)
    assert len(df) == len(cases)
    assert df.loc[df.key == cases[5].key, "error"].item() == "simulated failure"
    ok = df[df.error.isna()]
    assert (ok.time_us > 0).all() and (ok.tflops > 0).all()
    back = dataset.read_parquet(out)
    dataset.validate(back)
    assert back.attrs["env"]["gpu"] == "cpu (numpy)"
    assert list(back.columns) == dataset.COLUMNS
    # the column-major view is recorded
    r = back[back.key == "numpy|mm|fp32|NT|16|64|16|1"].iloc[0]
    assert (r.blas_m, r.blas_n, r.blas_k, r.blas_trans_a, r.blas_trans_b) == (64, 16, 16, "T", "N")


def test_interrupted_sweep_resumes_without_duplicates(tmp_path):
    cases = _plan()
    out = str(tmp_path / "d.parquet")
    ex = sweep.NumpyExecutor(stop_after=3)
    with pytest.raises(KeyboardInterrupt):
        sweep.run(cases, out, ex, window=5, progress=False)
    raw = sweep.raw_path(out)
    env, recs = dataset.read_raw(raw)
    assert len(recs) == 15 and env["gpu"] == "cpu (numpy)"
    # a kill in the middle of writing a record leaves half a line: resume drops it and reruns that GEMM
    with open(raw, "a") as f:
        f.write('{"type": "gemm", "key": "numpy|mm|fp32|NN|1|8|16|1", "m": 1, "n"')
    with pytest.raises(ProbeError, match="--resume"):
        sweep.run(cases, out, sweep.NumpyExecutor(), window=5, progress=False)
    df = sweep.run(cases, out, sweep.NumpyExecutor(), window=5, progress=False, resume=True)
    assert sorted(df.key) == sorted(c.key for c in cases)
    lines = [json.loads(x) for x in open(raw)]
    keys = [x["key"] for x in lines if x.get("type") == "gemm"]
    assert len(keys) == len(set(keys)) == len(cases)


def test_resume_refuses_another_environment(tmp_path):
    cases = _plan()[:4]
    out = str(tmp_path / "d.parquet")
    sweep.run(cases, out, sweep.NumpyExecutor(), progress=False)
    other = sweep.NumpyExecutor()
    other.env = dict(other.env, gpu="NVIDIA H200")
    with pytest.raises(ProbeError, match="another environment: gpu was 'cpu \\(numpy\\)', now 'NVIDIA H200'"):
        sweep.run(cases, out, other, progress=False, resume=True)


def test_shards_merge_to_the_full_sweep(tmp_path):
    plan = sweep.plan_from_spec(NUMPY_SPEC)
    parts = []
    for i in (1, 2):
        sl = sweep.parse_shard(f"{i}/2")
        p = sweep.part_path(str(tmp_path / "x.parquet"), sl)
        sweep.run(sl.take(plan.cases), p, sweep.NumpyExecutor(), progress=False, meta=sweep.run_meta(plan, sl))
        parts.append(p)
    assert [os.path.basename(p) for p in parts] == ["x.part-0001-of-0002.parquet", "x.part-0002-of-0002.parquet"]
    m = sweep.merge(parts, str(tmp_path / "all.parquet"))
    assert (m.rows, m.parts, m.plan) == (len(plan.cases), 2, "cpu")
    df = dataset.validate(dataset.read_parquet(str(tmp_path / "all.parquet")))
    assert sorted(df.key) == sorted(plan.cases.keys())
    assert df.attrs["env"]["plan"]["digest"] == plan.digest() and df.attrs["env"]["shard"] is None
    # the raw parts merge to the same rows as the datasets
    raws = [sweep.raw_path(p) for p in parts]
    sweep.merge(raws, str(tmp_path / "raw.parquet"), jobs=1)
    a = dataset.read_parquet(str(tmp_path / "all.parquet")).sort_values("key", ignore_index=True)
    b = dataset.read_parquet(str(tmp_path / "raw.parquet")).sort_values("key", ignore_index=True)
    assert a.drop(columns="kernels").equals(b.drop(columns="kernels"))
    # one part alone: the other slice is named missing, nothing is written
    with pytest.raises(ProbeError, match=r"slices 2 of 2 are missing \(no part\)"):
        sweep.merge(parts[:1], str(tmp_path / "half.parquet"))
    assert not (tmp_path / "half.parquet").exists()


def test_plan_matches_the_case_by_case_expansion():
    """The array expansion gives the Cases, order, duplicates dropped and skip counts of expanding the product
    one Case at a time, as the plan was first written."""
    import itertools
    from collections import Counter

    from cublaslt_probe.cases import Case

    def one_by_one(spec):
        seen, cases, skipped = set(), [], Counter()
        for g in spec["group"]:
            if "shapes" in g:
                shapes = [tuple(s) if len(s) == 4 else (*s, 1) for s in g["shapes"]]
            else:
                shapes = list(itertools.product(*(sweep.expand_axis(g[a], a) for a in "mnk"),
                                                sweep.expand_axis(g.get("batch", 1), "batch")))
            for (m, n, k, b), op, dt, lay, be in itertools.product(
                    shapes, g.get("ops", ["mm"]), g.get("dtypes", ["bf16"]), g.get("layouts", ["NN"]),
                    g.get("backends", ["torch"])):
                c = Case(be, op, dt, lay, m, n, k, (8 if b == 1 else b) if op == "bmm" else 1)
                why = invalid_reason(c) if be != "numpy" else sweep.numpy_invalid(c)
                if why:
                    skipped[why.split(": ", 1)[-1]] += 1
                elif c.key not in seen:
                    seen.add(c.key)
                    cases.append(c)
        return cases, skipped

    overlapping = {"group": [NUMPY_SPEC["group"][0], {"backends": ["numpy", "torch"], "ops": ["mm", "bmm"],
                                                      "dtypes": ["fp32", "bf16"],
                                                      "shapes": [[16, 64, 16], [4, 8, 16, 3], [16, 64, 16]]}]}
    batches = {"group": [{"backends": ["numpy"], "ops": ["mm", "bmm"], "dtypes": ["fp32"], "m": [4, 8], "n": [8],
                          "k": [16], "batch": [1, 3, 8]}]}
    repeated = {"group": [{"backends": ["numpy"], "shapes": [[4, 8, 16], [2, 8, 16], [4, 8, 16]], "dtypes": ["fp32"]}]}
    dense = [sweep.preset(name) for name in sweep.PRESETS if name != "moe"]   # grouped: tests/test_grouped.py
    for spec in dense + [NUMPY_SPEC, overlapping, batches, repeated]:
        p = sweep.plan_from_spec(spec)
        cases, skipped = one_by_one(spec)
        assert list(p.cases) == cases
        assert p.cases.keys() == [c.key for c in cases]
        assert p.skipped == skipped
        assert [c.key for c in p.cases[3::7]] == [c.key for c in cases[3::7]]


def test_cli_dry_run_and_no_gpu_error(tmp_path):
    r = CliRunner().invoke(main, ["sweep", "--preset", "quick", "-o", str(tmp_path / "q.parquet"), "--dry-run"])
    assert r.exit_code == 0, r.output
    assert "sweep 'quick': 198 GEMMs" in r.output
    try:
        import torch
        has_gpu = torch.cuda.is_available()
    except ImportError:
        has_gpu = False
    if not has_gpu:
        r = CliRunner().invoke(main, ["sweep", "--preset", "quick", "-o", str(tmp_path / "q.parquet")])
        assert r.exit_code == 1
        last = r.output.strip().splitlines()[-1]
        assert last.startswith("Error: no CUDA device: `sweep` needs an NVIDIA GPU")
        assert "decode" in last and "parse-log" in last and "work without one" in last


def test_cli_numpy_sweep_and_merge(tmp_path):
    spec = tmp_path / "s.json"
    spec.write_text(json.dumps(NUMPY_SPEC))
    out = tmp_path / "n.parquet"
    r = CliRunner().invoke(main, ["sweep", "--spec", str(spec), "-o", str(out), "--no-progress"])
    assert r.exit_code == 0, r.output
    assert f"wrote {out}: 97 rows (0 error rows)" in r.output
    r = CliRunner().invoke(main, ["merge", str(out), "-o", str(tmp_path / "m.parquet")])
    assert r.exit_code == 0 and "97 rows from 1 parts (plan 'cpu', each GEMM once)" in r.output
    r = CliRunner().invoke(main, ["merge", str(out), str(out), "-o", str(tmp_path / "m.parquet")])
    assert r.exit_code == 0 and "97 rows from 1 parts" in r.output    # one file named twice is read once
    copy = tmp_path / "copy.parquet"
    copy.write_bytes(out.read_bytes())
    r = CliRunner().invoke(main, ["merge", str(out), str(copy), "-o", str(tmp_path / "m.parquet")])
    assert r.exit_code == 1
    assert f"97 GEMMs are in two parts (numpy|mm|fp32|NN|1|8|16|1 in {out} and {copy}; " in r.output
    r = CliRunner().invoke(main, ["merge", str(tmp_path / "nope.parquet"), "-o", str(tmp_path / "m.parquet")])
    assert r.exit_code == 1 and "Error: no part at" in r.output


def test_cli_devices_runs_one_worker_per_device_and_merges(tmp_path):
    """--devices starts one real worker process per device (CUDA_VISIBLE_DEVICES); they share the plan's fine
    slices, each taken by one of them, and the raw parts are merged. Run here with the numpy backend, which
    executes on the CPU."""
    spec = tmp_path / "s.json"
    spec.write_text(json.dumps(NUMPY_SPEC))
    out = tmp_path / "d.parquet"
    args = ["sweep", "--spec", str(spec), "-o", str(out), "--devices", "0,1", "--no-progress", "--window", "32"]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    assert sweep.fine_slices(97, 2, 32) == 13
    assert f"merged 13 raw parts from 2 devices into {out}: 97 rows" in r.output
    parts = sorted(p.name for p in tmp_path.glob("d.part-*"))
    assert parts == [f"d.part-0001-of-0001.block-{j:04d}-of-0013.raw.jsonl" for j in range(1, 14)]
    assert not (tmp_path / "d.claims").exists()
    # each part says which worker ran it (the first line of a raw file is its environment)
    workers = {json.loads((tmp_path / p).open().readline())["worker"] for p in parts}
    assert workers and workers <= {"0", "1"}
    df = dataset.read_parquet(out)
    assert sorted(df.key) == sorted(c.key for c in sweep.plan_from_spec(NUMPY_SPEC).cases)
    # run again over the same parts: refused before any worker starts, unless resumed (nothing left to run)
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 1
    assert "d.part-0001-of-0001.block-0001-of-0013.raw.jsonl (and 12 more of the 13 parts) already holds" in r.output
    r = CliRunner().invoke(main, args + ["--resume"])
    assert r.exit_code == 0 and "97 rows" in r.output, r.output


def test_parts_without_a_plan_merge_with_only_the_twice_check(tmp_path):
    """Datasets written before plans were recorded (the shipped ones): merged, and refused only for a GEMM held
    twice (nothing to say what is missing)."""
    data = __import__("pathlib").Path(__file__).parent.parent / "data" / "h200_regret.parquet"
    m = sweep.merge([str(data)], str(tmp_path / "m.parquet"))
    assert (m.rows, m.plan) == (len(dataset.read_parquet(str(data))), None)
    cases = _plan()
    a, b = str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet")
    sweep.run(cases[:10], a, sweep.NumpyExecutor(), progress=False)
    sweep.run(cases[9:], b, sweep.NumpyExecutor(), progress=False)
    twice = cases[9].key.replace("|", "[|]")
    with pytest.raises(ProbeError, match=rf"\(97 GEMMs\) exactly once: 1 GEMMs are in two parts \({twice} in "):
        sweep.merge([a, b], str(tmp_path / "m.parquet"))


def test_merge_fills_columns_a_part_predates(tmp_path):
    import pyarrow.parquet as pq
    data = __import__("pathlib").Path(__file__).parent.parent / "data" / "h200_regret.parquet"
    old = pq.read_table(data)
    pq.write_table(old.drop_columns(["log_matches_case", "time_behind"]), tmp_path / "old.parquet")
    sweep.merge([str(tmp_path / "old.parquet")], str(tmp_path / "m.parquet"))
    df = dataset.validate(dataset.read_parquet(str(tmp_path / "m.parquet")))
    assert df.time_behind.isna().all() and df.log_matches_case.isna().all()
    assert df.time_us.equals(dataset.read_parquet(str(data)).time_us)


def test_a_devices_worker_that_dies_leaves_the_blocks_it_had_not_claimed_to_the_others(tmp_path):
    """One block's raw part cannot be opened (a folder stands at its path): the worker that claims it exits
    with an error, leaving the blocks it had claimed with it unrun; the other worker takes every block left;
    the command names the exit codes and --resume, which runs the blocks left."""
    spec = tmp_path / "s.json"
    spec.write_text(json.dumps(NUMPY_SPEC))
    out = tmp_path / "d.parquet"
    bad = tmp_path / "d.part-0001-of-0001.block-0001-of-0013.raw.jsonl"
    bad.mkdir()
    args = ["sweep", "--spec", str(spec), "-o", str(out), "--devices", "0,1", "--no-progress", "--window", "32",
            "--resume"]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 1
    assert "device workers exited with" in r.output and "finish with --resume" in r.output
    codes = sorted(int(x) for x in r.output.split("exited with [")[1].split("]")[0].split(","))
    assert codes[0] == 0 and codes[1] != 0
    done = {int(p.name.split(".block-")[1][:4]) for p in tmp_path.glob("d.part-*.raw.jsonl") if p.is_file()}
    lost = sorted(set(range(1, 14)) - done)   # the group of blocks the dead worker had claimed with block 1
    assert lost == list(range(1, len(lost) + 1)) and len(lost) <= 4, lost
    assert not out.exists()
    # the obstacle gone, --resume runs the blocks left and merges
    bad.rmdir()
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0 and "97 rows" in r.output, r.output
