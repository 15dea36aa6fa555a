"""Sweeps sliced by the schedulers people run (Slurm job arrays, torchrun, Kubernetes Indexed Jobs), run end to
end on the CPU with the numpy backend, their parts merged and checked against the plan."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from cublaslt_probe import sweep
from cublaslt_probe.analysis import dataset
from cublaslt_probe.cli import main
from cublaslt_probe.errors import SpecError

ROOT = Path(__file__).resolve().parent.parent
SBATCH = ROOT / "docs" / "cluster" / "sweep.sbatch"
MANIFEST = ROOT / "docs" / "cluster" / "sweep-indexed-job.yaml"

SPEC = {"name": "cpu", "group": [
    {"backends": ["numpy"], "ops": ["mm", "addmm"], "dtypes": ["fp32", "fp16"], "layouts": ["NN", "NT"],
     "m": [1, 16, 33], "n": [8, 64], "k": [16]},
    {"backends": ["numpy"], "ops": ["bmm"], "dtypes": ["fp32"], "layouts": ["NN"], "shapes": [[4, 8, 16, 3]]},
]}
PLAN = sweep.plan_from_spec(SPEC)
# every variable a scheduler sets: unset in each run unless the test sets it (the suite may run under one)
SCHEDULER_ENV = ["SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_MIN", "SLURM_ARRAY_TASK_MAX", "SLURM_ARRAY_TASK_COUNT",
                 "SLURM_ARRAY_TASK_STEP", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                 "JOB_COMPLETION_INDEX", "CUDA_VISIBLE_DEVICES"]


def _env(**kv):
    env = {k: None for k in SCHEDULER_ENV}
    env.update({k: str(v) for k, v in kv.items()})
    return env


@pytest.fixture
def spec_file(tmp_path):
    p = tmp_path / "s.json"
    p.write_text(json.dumps(SPEC))
    return p


def _sweep(spec_file, out, *extra, **env):
    r = CliRunner().invoke(main, ["sweep", "--spec", str(spec_file), "-o", str(out), "--no-progress", *extra],
                           env=_env(**env))
    return r


def _merged_keys(path):
    df = dataset.validate(dataset.read_parquet(str(path)))
    return sorted(df.key)


# --- slices from each scheduler's environment ---------------------------------------------------------------------
@pytest.mark.parametrize("env, count, want", [
    ({"SLURM_ARRAY_TASK_ID": "7", "SLURM_ARRAY_TASK_MIN": "5", "SLURM_ARRAY_TASK_MAX": "8",
      "SLURM_ARRAY_TASK_COUNT": "4", "SLURM_ARRAY_TASK_STEP": "1"}, None, (3, 4, None)),
    ({"SLURM_ARRAY_TASK_ID": "0", "SLURM_ARRAY_TASK_MIN": "0", "SLURM_ARRAY_TASK_MAX": "0"}, None, (1, 1, None)),
    ({"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4"}, None, (6, 8, 1)),
    ({"JOB_COMPLETION_INDEX": "15"}, 16, (16, 16, None)),
    # torchrun in each task of a 3-task array: rank r of task t is slice t + r·3 of 3·2
    ({"SLURM_ARRAY_TASK_ID": "2", "SLURM_ARRAY_TASK_MIN": "1", "SLURM_ARRAY_TASK_MAX": "3", "RANK": "1",
      "WORLD_SIZE": "2", "LOCAL_RANK": "1"}, None, (5, 6, 1)),
    ({"JOB_COMPLETION_INDEX": "0", "RANK": "1", "WORLD_SIZE": "2"}, 4, (5, 8, None)),
])
def test_slice_from_each_scheduler(env, count, want):
    s = sweep.shard_from_env(env, count)
    assert (s.index, s.count, s.local_rank) == want


@pytest.mark.parametrize("env, count, msg", [
    ({}, None, "no scheduler slice in the environment (looked for SLURM_ARRAY_TASK_ID (Slurm job array), RANK "
               "and WORLD_SIZE (torchrun), JOB_COMPLETION_INDEX (Kubernetes Indexed Job)); give --shard I/N"),
    ({"SLURM_ARRAY_TASK_ID": "9", "SLURM_ARRAY_TASK_MIN": "0", "SLURM_ARRAY_TASK_MAX": "7"}, None,
     "SLURM_ARRAY_TASK_ID=9 is outside SLURM_ARRAY_TASK_MIN..MAX = 0..7"),
    ({"SLURM_ARRAY_TASK_ID": "2", "SLURM_ARRAY_TASK_MIN": "0", "SLURM_ARRAY_TASK_MAX": "6",
      "SLURM_ARRAY_TASK_STEP": "2"}, None, "the Slurm array steps by 2 (SLURM_ARRAY_TASK_STEP)"),
    ({"SLURM_ARRAY_TASK_ID": "3", "SLURM_ARRAY_TASK_MIN": "1", "SLURM_ARRAY_TASK_MAX": "5",
      "SLURM_ARRAY_TASK_COUNT": "3"}, None,
     "the Slurm array is not contiguous (SLURM_ARRAY_TASK_COUNT=3 tasks, ids 1..5)"),
    ({"SLURM_ARRAY_TASK_ID": "3"}, None, "SLURM_ARRAY_TASK_MIN=None is not an integer"),
    ({"JOB_COMPLETION_INDEX": "3"}, None, "needs the Job's completion count: pass --shard-count N"),
    ({"JOB_COMPLETION_INDEX": "4"}, 4, "JOB_COMPLETION_INDEX=4 is outside 0..3 (--shard-count 4)"),
    ({}, 4, "--shard-count 4 is for Kubernetes Indexed Jobs, but JOB_COMPLETION_INDEX is not set"),
    ({"RANK": "2", "WORLD_SIZE": "2"}, None, "RANK=2 is outside 0..WORLD_SIZE-1 = 0..1"),
    ({"RANK": "0"}, None, "WORLD_SIZE=None is not an integer"),
    ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2"}, None,
     "LOCAL_RANK=2 is outside 0..LOCAL_WORLD_SIZE-1"),
    ({"SLURM_ARRAY_TASK_ID": "0", "SLURM_ARRAY_TASK_MIN": "0", "SLURM_ARRAY_TASK_MAX": "1",
      "JOB_COMPLETION_INDEX": "0"}, 2, "both a Slurm array (SLURM_ARRAY_TASK_ID) and a Kubernetes Indexed Job"),
])
def test_inconsistent_scheduler_environments_are_refused(env, count, msg):
    with pytest.raises(SpecError) as e:
        sweep.shard_from_env(env, count)
    assert msg in str(e.value) and "\n" not in str(e.value)


def test_each_local_rank_takes_one_gpu():
    assert [sweep.local_rank_device(r, {"CUDA_VISIBLE_DEVICES": "4,5,6"}) for r in range(3)] == ["4", "5", "6"]
    assert sweep.local_rank_device(2, {}) == "2"
    assert sweep.local_rank_device(1, {"CUDA_VISIBLE_DEVICES": "7"}) == "7"    # bound to one GPU already
    with pytest.raises(SpecError, match="LOCAL_RANK=2 but CUDA_VISIBLE_DEVICES=0,1 lists 2 GPUs"):
        sweep.local_rank_device(2, {"CUDA_VISIBLE_DEVICES": "0,1"})


def test_composed_slices_cover_the_plan_once():
    """Part j of slice i/n (torchrun ranks inside array tasks, --devices inside a slice) is a slice of the whole
    plan: all of them together hold each GEMM once."""
    cases = sweep.plan("quick").cases
    keys = []
    for i in range(1, 4):
        for j in range(1, 3):
            outer = sweep.Slice(i, 3)
            part = outer.split(j, 2)
            assert [c.key for c in part.take(cases)] == [c.key for c in outer.take(cases)[j - 1::2]]
            keys += [c.key for c in part.take(cases)]
    assert sorted(keys) == sorted(cases.keys())


def test_blocks_of_a_slice_are_contiguous_runs_and_each_gemm_knows_its_block():
    """`cut` (how --devices cuts its slice): block j of P of slice i/n is the j-th contiguous run of the slice's
    GEMMs; `members` finds, from a plan position alone, the block that holds it, for plans the blocks divide
    unevenly and slices shorter than their blocks."""
    import numpy as np
    for n in (1, 7, 49, 97, 1000):
        for count, parts in ((1, 1), (1, 6), (3, 4), (2, 64), (5, 3)):
            seen = np.full(n, -1)
            for i in range(1, count + 1):
                run = sweep.Slice(i, count).take(range(n))
                blocks = [sweep.Slice(i, count).cut(j, parts) for j in range(1, parts + 1)]
                held = [list(b.take(range(n))) for b in blocks]
                assert [g for h in held for g in h] == list(run)          # the blocks in order are the slice
                assert max(map(len, held)) - min(map(len, held)) <= 1     # as even as the slice allows
                for b, h in zip(blocks, held):
                    assert (b.members(h, n) == b.member).all()
                    seen[h] = b.member
            assert (seen >= 0).all()
            assert (sweep.Slice(1, count).cut(1, parts).members(np.arange(n), n) == seen).all()


def test_a_blocks_spec_is_read_back_from_a_raw_file_but_not_taken_from_the_command_line():
    sl = sweep.Slice(2, 4).cut(3, 16)
    assert sl.spec == "2/4:3/16" and sl.describe() == "block 3/16 of slice 2/4"
    back = sweep.parse_shard(sl.spec, "f: shard", blocks=True)
    assert (back.index, back.count, back.block) == (2, 4, (3, 16))
    assert sweep.parse_shard("2/4", blocks=True).block is None
    for bad in ("2/4:0/16", "2/4:17/16", "2/4:x", "5/4", "x"):
        with pytest.raises(SpecError, match="expected I/N or I/N:J/P .* the file was edited: run its slice again"):
            sweep.parse_shard(bad, blocks=True)
    with pytest.raises(SpecError, match="expected I/N"):
        sweep.parse_shard("2/4:3/16")
    assert sweep.part_path("o/x.parquet", sl) == "o/x.part-0002-of-0004.block-0003-of-0016.parquet"


def test_merge_names_the_missing_and_short_blocks_of_a_slice_cut_by_devices(tmp_path, spec_file):
    """Slice 1/2 run whole, slice 2/2 by --devices in blocks: merge names a block with no part, a block part
    cut short, and a block part holding another block's GEMMs."""
    out = tmp_path / "p" / "b.parquet"
    out.parent.mkdir()
    assert _sweep(spec_file, out, "--shard", "1/2").exit_code == 0
    r = _sweep(spec_file, out, "--shard", "2/2", "--devices", "0,1", "--window", "16")
    assert r.exit_code == 0, r.output
    count = sweep.fine_slices(len(sweep.Slice(2, 2).take(PLAN.cases)), 2, 16)
    block = [out.parent / f"b.part-0002-of-0002.block-{j:04d}-of-{count:04d}.raw.jsonl" for j in range(1, count + 1)]
    assert all(b.exists() for b in block) and count == 6
    block[1].unlink()
    block[4].unlink()
    lines = block[2].read_text().splitlines(keepends=True)
    block[2].write_text("".join(lines[:-2]))
    r = _merge(out.parent, out=tmp_path / "m.parquet")
    assert r.exit_code == 1
    sizes = [len(sweep.Slice(2, 2).cut(j, count).take(PLAN.cases)) for j in range(1, count + 1)]
    assert f"exactly once: blocks 2, 5 of 6 of slice 2/2 are missing (no part); block 3/6 of slice 2/2 lacks 2 of " \
           f"{sizes[2]} GEMMs (e.g. {json.loads(lines[-2])['key']}; finish it with --resume)" in r.output
    (out.parent / "b.part-0001-of-0002.parquet").unlink()
    (out.parent / "b.part-0001-of-0002.raw.jsonl").unlink()
    r = _merge(out.parent, out=tmp_path / "m.parquet")
    assert "slices 1 of 2 are missing (no part); blocks 2, 5 of 6 of slice 2/2 are missing" in r.output
    # a block part whose records are another block's (an edited or misnamed file)
    head = json.loads(lines[0])
    head["shard"] = "2/2:4/6"
    block[2].write_text(json.dumps(head) + "\n" + "".join(lines[1:]))
    r = _merge(out.parent, out=tmp_path / "m.parquet")
    assert f"{block[2]} (block 4/6 of slice 2/2) holds {len(lines) - 1} GEMMs of other slices" in r.output


# --- end to end: each scheduler's environment, then merge ---------------------------------------------------------
def test_slurm_array_runs_the_shipped_sbatch_script_and_merges(tmp_path, spec_file):
    """The committed sbatch script, run by bash once per array task as Slurm would (array 5-7), then merged."""
    header = [ln for ln in SBATCH.read_text().splitlines() if ln.startswith("#SBATCH")]
    assert "#SBATCH --array=0-15" in header and "#SBATCH --gres=gpu:1" in header
    out = tmp_path / "parts" / "x.parquet"
    for tid in (5, 6, 7):
        env = {k: v for k, v in os.environ.items() if k not in SCHEDULER_ENV}
        env.update(SLURM_ARRAY_TASK_ID=str(tid), SLURM_ARRAY_TASK_MIN="5", SLURM_ARRAY_TASK_MAX="7",
                   SLURM_ARRAY_TASK_COUNT="3", SLURM_ARRAY_TASK_STEP="1", SWEEP=f"--spec {spec_file}", OUT=str(out),
                   PROBE=f"{sys.executable} -m cublaslt_probe")
        r = subprocess.run(["bash", str(SBATCH)], env=env, capture_output=True, text=True, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        assert f"slice {tid - 4}/3 (SLURM_ARRAY_TASK_ID={tid} of array 5-7)" in r.stderr
    names = sorted(p.name for p in out.parent.iterdir())
    assert names == [f"x.part-000{i}-of-0003.{ext}" for i in (1, 2, 3) for ext in ("parquet", "raw.jsonl")]
    env = sweep.raw_env(str(out.parent / "x.part-0002-of-0003.raw.jsonl"))
    assert env["shard"] == "2/3" and env["shard_source"] == "SLURM_ARRAY_TASK_ID=6 of array 5-7"
    assert env["plan"]["digest"] == PLAN.digest() and env["plan"]["cases"] == len(PLAN.cases)
    r = CliRunner().invoke(main, ["merge", str(out.parent), "-o", str(tmp_path / "all.parquet")])
    assert r.exit_code == 0, r.output
    assert f"wrote {tmp_path / 'all.parquet'}: {len(PLAN.cases)} rows from 3 parts (plan 'cpu', each GEMM once)" \
        in r.output
    assert _merged_keys(tmp_path / "all.parquet") == sorted(PLAN.cases.keys())


def test_torchrun_ranks_take_one_gpu_each_and_merge(tmp_path, spec_file):
    """WORLD_SIZE=4 over two hosts of two GPUs: each rank runs its slice on the GPU of its local rank."""
    out = tmp_path / "t.parquet"
    for rank in range(4):
        r = _sweep(spec_file, out, "--shard", "auto", RANK=rank, WORLD_SIZE=4, LOCAL_RANK=rank % 2,
                   LOCAL_WORLD_SIZE=2, CUDA_VISIBLE_DEVICES="2,3")
        assert r.exit_code == 0, r.output
        assert f"slice {rank + 1}/4 (RANK={rank} of WORLD_SIZE=4)" in r.output
        assert f"LOCAL_RANK={rank % 2}: CUDA_VISIBLE_DEVICES={2 + rank % 2}" in r.output
    r = CliRunner().invoke(main, ["merge", str(tmp_path / "t.part-*.raw.jsonl"), "-o", str(tmp_path / "all.parquet")])
    assert r.exit_code == 0, r.output
    assert _merged_keys(tmp_path / "all.parquet") == sorted(PLAN.cases.keys())
    # one process per GPU already: --devices on top of a launcher is refused
    r = _sweep(spec_file, tmp_path / "d.parquet", "--shard", "auto", "--devices", "0,1", RANK=0, WORLD_SIZE=2,
               LOCAL_RANK=0)
    assert r.exit_code == 1 and "--devices with a launcher that starts one process per GPU" in r.output


def test_kubernetes_manifest_passes_the_index_and_count(tmp_path, spec_file):
    """The committed Indexed Job manifest (JSON is YAML): Indexed mode, the index in JOB_COMPLETION_INDEX, the
    completions as --shard-count, one GPU a pod, the parts on a shared volume; its command, run once per index
    with the spec swapped for the CPU one, covers the plan."""
    job = json.loads(MANIFEST.read_text())
    assert job["apiVersion"] == "batch/v1" and job["kind"] == "Job"
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed"
    pod = spec["template"]["spec"]
    (c,) = pod["containers"]
    cmd = c["command"]
    assert cmd[:2] == ["cublaslt-probe", "sweep"]
    assert cmd[cmd.index("--shard") + 1] == "auto"
    assert int(cmd[cmd.index("--shard-count") + 1]) == spec["completions"]
    assert "--resume" in cmd
    env = {e["name"]: e for e in c["env"]}
    assert env["JOB_COMPLETION_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"] == \
        "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
    out = cmd[cmd.index("-o") + 1]
    mount = next(m for m in c["volumeMounts"] if out.startswith(m["mountPath"] + "/"))
    vol = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    assert "persistentVolumeClaim" in vol      # every pod writes its part where the merge reads them
    # run the pod command for each index; only the spec and the output folder change
    args = cmd[2:]
    i = args.index("--preset")
    args[i:i + 2] = ["--spec", str(spec_file)]
    args[args.index("-o") + 1] = str(tmp_path / "k8s" / Path(out).name)
    (tmp_path / "k8s").mkdir()
    for idx in range(spec["completions"]):
        r = CliRunner().invoke(main, ["sweep", *args], env=_env(JOB_COMPLETION_INDEX=idx))
        assert r.exit_code == 0, r.output
    parts = sorted(p.name for p in (tmp_path / "k8s").glob("*.raw.jsonl"))
    assert parts == [f"decode.part-{i:04d}-of-{spec['completions']:04d}.raw.jsonl" for i in range(1, 17)]
    r = CliRunner().invoke(main, ["merge", str(tmp_path / "k8s"), "-o", str(tmp_path / "all.parquet")])
    assert r.exit_code == 0, r.output
    assert _merged_keys(tmp_path / "all.parquet") == sorted(PLAN.cases.keys())


def test_explicit_shards_and_devices_inside_a_slice(tmp_path, spec_file):
    """--shard I/N keeps working; --devices inside a slice leaves parts of the whole plan for `merge`."""
    out = tmp_path / "e.parquet"
    assert _sweep(spec_file, out, "--shard", "1/2").exit_code == 0
    r = _sweep(spec_file, out, "--shard", "2/2", "--devices", "0,1", "--window", "16")
    assert r.exit_code == 0, r.output
    half = len(PLAN.cases) // 2
    count = sweep.fine_slices(half, 2, 16)
    assert count == 6 and f"wrote {count} raw parts of slice 2/2" in r.output
    names = sorted(p.name for p in tmp_path.glob("e.part-*-of-*.raw.jsonl") if ".block-" in p.name)
    # block j of slice 2/2 cut `count` ways: the j-th contiguous run of the slice's GEMMs
    assert names == [f"e.part-0002-of-0002.block-{j:04d}-of-{count:04d}.raw.jsonl" for j in range(1, count + 1)]
    second = [c.key for c in sweep.Slice(2, 2).take(PLAN.cases)]
    held = [r["key"] for name in names for r in dataset.read_raw(tmp_path / name)[1]]
    assert held == second   # the blocks in order are the slice in plan order
    m = sweep.merge([str(tmp_path / "e.part-*")], str(tmp_path / "all.parquet"))
    assert m.rows == len(PLAN.cases)
    assert _merged_keys(tmp_path / "all.parquet") == sorted(PLAN.cases.keys())


# --- merge: what it refuses, and why ------------------------------------------------------------------------------
@pytest.fixture
def four_parts(tmp_path, spec_file):
    out = tmp_path / "p" / "x.parquet"
    out.parent.mkdir()
    for i in range(1, 5):
        assert _sweep(spec_file, out, "--shard", f"{i}/4").exit_code == 0
    return out.parent


def _merge(*inputs, out):
    return CliRunner().invoke(main, ["merge", *map(str, inputs), "-o", str(out)])


def test_merge_names_missing_and_incomplete_slices(tmp_path, four_parts):
    for p in four_parts.glob("x.part-000[24]-*"):
        p.unlink()
    r = _merge(four_parts, out=tmp_path / "m.parquet")
    assert r.exit_code == 1
    assert r.output.startswith(f"Error: the parts do not hold plan 'cpu' ({len(PLAN.cases)} GEMMs) exactly once: "
                               "slices 2, 4 of 4 are missing (no part)")
    assert not (tmp_path / "m.parquet").exists()
    # a part cut short (a worker killed): its slice is named with what it lacks; --resume finishes it
    raw = four_parts / "x.part-0003-of-0004.raw.jsonl"
    (four_parts / "x.part-0003-of-0004.parquet").unlink()
    lines = raw.read_text().splitlines(keepends=True)
    raw.write_text("".join(lines[:-5]))
    r = _merge(four_parts / "x.part-0001-of-0004.parquet", raw, out=tmp_path / "m.parquet")
    assert r.exit_code == 1
    third = [c.key for c in sweep.Slice(3, 4).take(PLAN.cases)]
    lost = json.loads(lines[-5])["key"]
    assert f"slices 2, 4 of 4 are missing (no part); slice 3/4 lacks 5 of {len(third)} GEMMs (e.g. {lost}; " \
           "finish it with --resume)" in r.output


def test_merge_names_gemms_held_twice_and_foreign_parts(tmp_path, four_parts, spec_file):
    # slice 1/2 holds the GEMMs of slices 1/4 and 3/4 again
    assert _sweep(spec_file, four_parts / "x.parquet", "--shard", "1/2").exit_code == 0
    r = _merge(four_parts, out=tmp_path / "m.parquet")
    assert r.exit_code == 1
    first = PLAN.cases[0].key
    assert f"{len(sweep.Slice(1, 2).take(PLAN.cases))} GEMMs are in two parts ({first} in " \
           f"{four_parts / 'x.part-0001-of-0002.parquet'} and {four_parts / 'x.part-0001-of-0004.parquet'}" in r.output
    (four_parts / "x.part-0001-of-0002.parquet").unlink()
    (four_parts / "x.part-0001-of-0002.raw.jsonl").unlink()
    # a part of another sweep
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"name": "other", "group": [SPEC["group"][1]]}))
    assert _sweep(other, tmp_path / "o.parquet").exit_code == 0
    r = _merge(four_parts, tmp_path / "o.parquet", out=tmp_path / "m.parquet")
    assert r.exit_code == 1
    assert f"Error: {tmp_path / 'o.parquet'} ran another plan than {four_parts / 'x.part-0001-of-0004.parquet'} " \
           f"(sweep 'other' vs 'cpu', 1 vs {len(PLAN.cases)} GEMMs): merge the parts of one sweep" in r.output
    # a part whose records are not its slice's (an edited or misnamed file)
    raw = four_parts / "x.part-0002-of-0004.raw.jsonl"
    lines = raw.read_text().splitlines(keepends=True)
    head = json.loads(lines[0])
    head["shard"] = "3/4"
    raw.write_text(json.dumps(head) + "\n" + "".join(lines[1:]))
    (four_parts / "x.part-0002-of-0004.parquet").unlink()
    r = _merge(four_parts, out=tmp_path / "m.parquet")
    assert r.exit_code == 1 and f"{raw} (slice 3/4) holds {len(lines) - 1} GEMMs of other slices" in r.output


def test_merge_refuses_parts_from_another_environment(tmp_path, four_parts):
    raw = four_parts / "x.part-0004-of-0004.raw.jsonl"
    lines = raw.read_text().splitlines(keepends=True)
    head = dict(json.loads(lines[0]), gpu="NVIDIA H200")
    raw.write_text(json.dumps(head) + "\n" + "".join(lines[1:]))
    (four_parts / "x.part-0004-of-0004.parquet").unlink()
    r = _merge(four_parts, out=tmp_path / "m.parquet")
    assert r.exit_code == 1
    assert f"{raw} was measured in another environment than {four_parts / 'x.part-0001-of-0004.parquet'} " \
           "(gpu 'NVIDIA H200' vs 'cpu (numpy)')" in r.output
    r = CliRunner().invoke(main, ["merge", str(four_parts), "-o", str(tmp_path / "m.parquet"), "--allow-env-mismatch"])
    assert r.exit_code == 0, r.output
    df = dataset.read_parquet(str(tmp_path / "m.parquet"))
    assert sorted(df.gpu.unique()) == ["NVIDIA H200", "cpu (numpy)"]


def test_many_small_parts_merge_in_few_tasks_each_row_under_its_own_parts_environment(tmp_path):
    """24 block parts of 2-3 GEMMs, every third measured on another GPU, merged by 2 processes: the rows of
    consecutive parts of one environment are built together (`_raw_to_parquet`), but each row carries its own
    part's GPU; the dataset is one row group, not one per part."""
    import pyarrow.parquet as pq
    out, parts = tmp_path / "b.parquet", []
    for j in range(1, 25):
        sub = sweep.WHOLE.cut(j, 24)
        parts.append(sweep.raw_path(sweep.part_path(str(out), sub)))
        sweep.run_raw(sub.take(PLAN.cases), parts[-1], sweep.NumpyExecutor(), progress=False,
                      meta=sweep.run_meta(PLAN, sub))
    gpu = {}
    for j, path in enumerate(parts):
        lines = open(path).read().splitlines(keepends=True)
        head = json.loads(lines[0])
        if j % 3 == 2:
            head["gpu"] = f"other {j}"
        open(path, "w").write(json.dumps(head) + "\n" + "".join(lines[1:]))
        gpu.update((json.loads(line)["key"], head["gpu"]) for line in lines[1:])
    m = sweep.merge(parts, str(tmp_path / "m.parquet"), allow_env_mismatch=True, jobs=2)
    df = dataset.read_parquet(str(tmp_path / "m.parquet"))
    assert m.rows == len(df) == len(PLAN.cases)
    assert {k: str(g) for k, g in zip(df.key, df.gpu)} == gpu and len(set(gpu.values())) == 9
    assert pq.ParquetFile(tmp_path / "m.parquet").num_row_groups == 1


def test_record_ranges_pack_into_tasks_of_a_least_size_in_order():
    ranges = [(i, 0, None) for i in range(7)]
    assert sweep.parts._tasks(ranges, [3] * 7, 7) == [ranges[0:3], ranges[3:6], ranges[6:7]]
    assert sweep.parts._tasks(ranges, [10] * 7, 7) == [[r] for r in ranges]
    assert sweep.parts._tasks([], [], 7) == []
    gap = [(0, 0, None), (1, 0, None), (3, 0, None), (4, 0, None)]   # part 2 is a dataset: rows stay in part order
    assert sweep.parts._tasks(gap, [1] * 4, 7) == [gap[:2], gap[2:]]


def test_merge_reads_a_fresh_dataset_else_the_raw_file(tmp_path, four_parts):
    pq_, raw = four_parts / "x.part-0001-of-0004.parquet", four_parts / "x.part-0001-of-0004.raw.jsonl"
    found = sweep.find_parts([str(four_parts)])
    assert str(pq_) in found and str(raw) not in found and len(found) == 4
    os.utime(raw, (pq_.stat().st_mtime + 10, pq_.stat().st_mtime + 10))   # appended after the dataset was built
    found = sweep.find_parts([str(four_parts)])
    assert str(raw) in found and str(pq_) not in found
    r = _merge(tmp_path / "nowhere", out=tmp_path / "m.parquet")
    assert r.exit_code == 1 and "no part at" in r.output
    r = _merge(tmp_path / "p" / "y.part-*", out=tmp_path / "m.parquet")
    assert r.exit_code == 1 and f"no file matches {tmp_path / 'p' / 'y.part-*'}" in r.output
    (tmp_path / "empty").mkdir()
    r = _merge(tmp_path / "empty", out=tmp_path / "m.parquet")
    assert r.exit_code == 1 and "no part files in folder" in r.output


def test_merge_of_raw_parts_keeps_a_resumed_gemms_last_record(tmp_path):
    """A resumed part may hold a GEMM twice (--retry-errors re-runs error rows): the later record stands. Raw
    parts merge to the rows of the parts' own datasets, built in this process or in two."""
    out = str(tmp_path / "r.parquet")
    for i in (1, 2):
        sl = sweep.Slice(i, 2)
        cases = sl.take(PLAN.cases)
        sweep.run(cases, sweep.part_path(out, sl), sweep.NumpyExecutor(fail_keys={cases[3].key}), progress=False,
                  meta=sweep.run_meta(PLAN, sl))
        df = sweep.run(cases, sweep.part_path(out, sl), sweep.NumpyExecutor(), progress=False, resume=True,
                       retry_errors=True, meta=sweep.run_meta(PLAN, sl))
        assert df.error.isna().all()
        raw = sweep.raw_path(sweep.part_path(out, sl))
        keys = [json.loads(ln)["key"] for ln in open(raw) if '"gemm"' in ln]
        assert keys.count(cases[3].key) == 2 and len(keys) == len(cases) + 1
    want = sweep.merge([str(tmp_path / "r.part-*.parquet")], str(tmp_path / "want.parquet"))
    want = dataset.read_parquet(str(tmp_path / "want.parquet")).sort_values("key", ignore_index=True)
    assert len(want) == len(PLAN.cases) and want.error.isna().all()
    for jobs in (1, 2):
        m = sweep.merge([str(tmp_path / "r.part-*.raw.jsonl")], str(tmp_path / f"m{jobs}.parquet"), jobs=jobs)
        got = dataset.read_parquet(str(tmp_path / f"m{jobs}.parquet")).sort_values("key", ignore_index=True)
        assert m.rows == len(PLAN.cases)
        assert got.drop(columns="kernels").equals(want.drop(columns="kernels"))
        assert got.attrs["env"]["plan"] == want.attrs["env"]["plan"]


def test_resume_refuses_another_plan_or_slice(tmp_path, spec_file):
    out = tmp_path / "x.parquet"
    assert _sweep(spec_file, out, "--shard", "1/2").exit_code == 0
    raw = tmp_path / "x.part-0001-of-0002.raw.jsonl"
    before = raw.read_text()
    r = _sweep(spec_file, out, "--shard", "1/2", "--resume")
    assert r.exit_code == 0 and raw.read_text() == before          # nothing left to run
    other = tmp_path / "other.json"
    other.write_text(json.dumps(dict(SPEC, group=SPEC["group"][:1])))
    r = _sweep(other, out, "--shard", "1/2", "--resume")
    assert r.exit_code == 1
    assert f"Error: cannot resume {raw}: it holds slice 1/2 of a plan of {len(PLAN.cases)} GEMMs, this run is " \
           f"slice 1/2 of {len(PLAN.cases) - 1} (the spec, --backends or the slicing changed)" in r.output
    assert raw.read_text() == before


# --- --devices: fine slices claimed as workers finish -------------------------------------------------------------
def test_fine_slices_are_quarter_windows_or_whole_windows_past_256_per_worker():
    def sizes(gemms, count):   # GEMMs each block of the plan holds
        return {len(sweep.WHOLE.cut(j, count).take(range(gemms))) for j in range(1, count + 1)}
    assert sweep.fine_slices(4672, 2, 128) == 146 and sizes(4672, 146) == {32}      # the decode preset
    assert sweep.fine_slices(4672, 1, 128) == 146
    assert sweep.fine_slices(1 << 20, 2, 128) == 512 and sizes(1 << 20, 512) == {2048}   # 16 windows each
    assert sweep.fine_slices(4672, 2, 32) == 146 and sizes(4672, 146) == {32}       # 584 of 8 is too many
    assert sweep.fine_slices(1000, 2, 32) == 125 and sizes(1000, 125) == {8}
    assert sweep.fine_slices(10, 4, 32) == 4             # one per worker at least
    assert sweep.fine_slices(0, 1, 32) == 1


def _claims(folder):
    os.makedirs(folder)
    return str(folder)


def test_a_worker_claims_a_windows_worth_of_blocks_then_fewer_as_the_plan_runs_out(tmp_path):
    """Two workers, 40 blocks of 8 GEMMs, windows of 32: groups of 4 blocks (a window) while enough are left
    unclaimed, then a quarter of what is left (guided self-scheduling), down to one block."""
    folder = _claims(tmp_path / "c")
    sizes = {j: 8 for j in range(1, 41)}
    a = sweep.claimed_groups(folder, sweep.claim_order(40, 2, 0), sizes, 32, 2)
    b = sweep.claimed_groups(folder, sweep.claim_order(40, 2, 1), sizes, 32, 2)
    got = {"a": [], "b": []}
    while True:   # the workers take turns, as two of equal speed would
        ga, gb = next(a, None), next(b, None)
        if ga is None and gb is None:
            break
        got["a"] += [ga] if ga else []
        got["b"] += [gb] if gb else []
    # its own run first, a window's worth at a time, while more than 4 x 4 blocks are left unclaimed; then a
    # quarter of what is left; the last claims are single blocks, the very last stolen from the other's end
    assert got == {"a": [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12], [13, 14, 15, 16], [17, 18], [19], [20], [40]],
                   "b": [[21, 22, 23, 24], [25, 26, 27, 28], [29, 30, 31, 32], [33, 34, 35], [36, 37], [38], [39]]}
    # a lone worker fills every window to the end
    lone = sweep.claimed_groups(_claims(tmp_path / "d"), list(range(1, 11)), {j: 8 for j in range(1, 11)}, 32, 1)
    assert list(lone) == [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10]]


def test_each_worker_asks_for_its_own_run_of_blocks_first_then_the_others_from_their_ends():
    assert sweep.claim_order(10, 2, 0) == [1, 2, 3, 4, 5, 10, 9, 8, 7, 6]
    assert sweep.claim_order(10, 2, 1) == [6, 7, 8, 9, 10, 5, 4, 3, 2, 1]
    assert sweep.claim_order(7, 3, 1) == [3, 4, 7, 6, 5, 2, 1]
    assert sweep.claim_order(4, 1, 0) == [1, 2, 3, 4]
    for count, workers in ((64, 2), (7, 3), (5, 5), (128, 8)):
        for me in range(workers):
            assert sorted(sweep.claim_order(count, workers, me)) == list(range(1, count + 1))


def test_each_slice_is_claimed_by_exactly_one_worker_and_a_slow_worker_takes_fewer(tmp_path):
    """Two workers over one claims folder: the one that comes back for more while the other is busy takes the
    rest of its run, then the other's from its end, and no slice is taken twice."""
    fast = sweep.claim(str(tmp_path), sweep.claim_order(10, 2, 0))
    slow = sweep.claim(str(tmp_path), sweep.claim_order(10, 2, 1))
    taken = {"fast": [next(fast)], "slow": [next(slow)]}
    taken["fast"] += [next(fast) for _ in range(8)]   # the slow worker is still busy with its first slice
    taken["slow"] += list(slow)
    taken["fast"] += list(fast)
    assert taken == {"fast": [1, 2, 3, 4, 5, 10, 9, 8, 7], "slow": [6]}
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{j:06d}" for j in range(1, 11)]


def test_a_group_of_blocks_runs_in_whole_windows_each_record_in_its_blocks_part(tmp_path):
    """run_raw_parts: blocks of 5, 6 and 5 GEMMs in windows of 8 run in 2 windows, not one per block (3);
    each part holds its block's GEMMs in plan order under its own environment line. Killed after the first
    window, a resume runs each part's GEMMs left, none twice."""
    subs = [sweep.WHOLE.cut(j, 9) for j in (2, 3, 4)]
    cases = [sub.take(PLAN.cases) for sub in subs]
    assert [len(c) for c in cases] == [5, 6, 5]
    raws = [str(tmp_path / f"p{j}.raw.jsonl") for j in range(3)]
    parts = [(c, r, sweep.run_meta(PLAN, sub)) for c, r, sub in zip(cases, raws, subs)]
    n = sum(len(c) for c in cases)
    ex = sweep.NumpyExecutor()
    assert sweep.run_raw_parts(parts, ex, window=8, progress=False)[0] == n
    assert ex.windows == 2
    for c, r, sub in zip(cases, raws, subs):
        env, recs = dataset.read_raw(r)
        assert env["shard"] == sub.spec and [x["key"] for x in recs] == [x.key for x in c]
    for r in raws:
        os.remove(r)
    with pytest.raises(KeyboardInterrupt):
        sweep.run_raw_parts(parts, sweep.NumpyExecutor(stop_after=1), window=8, progress=False)
    held = [len(dataset.read_raw(r)[1]) for r in raws]
    assert held == [5, 3, 0]        # the first window: block 2 and the first 3 GEMMs of block 3
    assert sweep.run_raw_parts(parts, sweep.NumpyExecutor(), window=8, progress=False, resume=True)[0] == n - 8
    for c, r in zip(cases, raws):
        assert sorted(x["key"] for x in dataset.read_raw(r)[1]) == sorted(x.key for x in c)


def test_a_worker_takes_the_slices_another_left_and_the_parts_cover_the_plan(tmp_path):
    """run_claimed, with the numpy backend: one worker claimed block 1 and stopped; the second took every other
    block; with block 1 finished the parts merge into the whole plan, each GEMM once."""
    folder, out = tmp_path / "claims", tmp_path / "w.parquet"
    folder.mkdir()
    first = sweep.claim(str(folder), sweep.claim_order(6, 2, 0))
    assert next(first) == 1
    gemms, seconds, taken = sweep.run_claimed(PLAN, sweep.WHOLE, 6, str(folder), str(out), sweep.NumpyExecutor(),
                                              window=8, workers=2, me=1)
    assert taken == 5 and seconds > 0
    assert gemms == sum(len(sweep.WHOLE.cut(j, 6).take(PLAN.cases)) for j in range(2, 7))
    parts = [sweep.raw_path(sweep.part_path(str(out), sweep.WHOLE.cut(j, 6))) for j in range(1, 7)]
    assert [os.path.exists(p) for p in parts] == [False] + [True] * 5
    r = CliRunner().invoke(main, ["merge", *parts[1:], "-o", str(tmp_path / "m.parquet")])
    assert r.exit_code == 1 and "blocks 1 of 6 of slice 1/1 are missing (no part)" in r.output, r.output
    sub = sweep.WHOLE.cut(1, 6)
    sweep.run_raw(sub.take(PLAN.cases), parts[0], sweep.NumpyExecutor(), progress=False, meta=sweep.run_meta(PLAN, sub))
    m = sweep.merge(parts, str(tmp_path / "m.parquet"))
    assert m.rows == len(PLAN.cases) and _merged_keys(tmp_path / "m.parquet") == sorted(PLAN.cases.keys())


def test_workers_wait_for_each_other_then_for_no_one_past_the_timeout(tmp_path):
    t = time.time()
    assert sweep.wait_for_workers(str(tmp_path), 2, "0", timeout_s=0.3) >= 0.3   # the other never came
    assert time.time() - t < 5
    assert sweep.wait_for_workers(str(tmp_path), 2, "1", timeout_s=30) < 1        # worker 0 is ready: no wait
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ready-0", "ready-1"]


def test_a_plans_digest_is_computed_once():
    """Every fine slice a --devices worker takes records the plan's identity: the digest is kept, not
    recomputed (0.8 s each for a million GEMMs)."""
    plan = sweep.plan_from_spec(SPEC)
    first = plan.digest()
    other = sweep.plan("quick")
    assert other.digest() != first
    plan.cases = other.cases   # not read again: the digest kept is the one of the plan's first cases
    assert plan.digest() == first and plan.identity()["digest"] == first
    assert sweep.plan_from_spec(SPEC).digest() == first


# --- one large raw part, turned into rows by several processes ----------------------------------------------------
def test_a_large_raw_part_is_cut_into_ranges_of_at_least_a_chunk():
    assert sweep.parts._chunks(100, 4, least=40) == [(0, 50), (50, 100)]     # two ranges of 40 or more
    assert sweep.parts._chunks(79, 4, least=40) == [(0, None)]              # less than two: the whole part
    assert sweep.parts._chunks(10_000, 3, least=40) == [(0, 3334), (3334, 6668), (6668, 10_000)]
    assert sweep.parts._chunks(10_000, 1, least=40) == [(0, None)]


def test_one_raw_part_built_by_several_processes_is_the_part_built_by_one(tmp_path, monkeypatch):
    """`sweep.run` turns its raw file into rows with every core once it holds two chunks or more (processes
    started fresh: the probe's process holds a CUDA context): the rows and their order are those one process
    builds."""
    import pandas as pd
    cases = PLAN.cases
    monkeypatch.setattr(sweep.parts, "CHUNK_ROWS", 12)   # the real threshold is 32,768 records
    monkeypatch.setattr(os, "cpu_count", lambda: 3)
    df = sweep.run(cases, str(tmp_path / "a.parquet"), sweep.NumpyExecutor(reps=1), window=50, progress=False)
    assert len(cases) == 49 and len(sweep.parts._chunks(len(cases), 3, 12)) == 3
    raw = sweep.raw_path(str(tmp_path / "a.parquet"))
    part = sweep.Part(raw, True, sweep.raw_env(raw))
    part.scan(sweep.KeyIndex(cases.key_chunks()))
    sweep.write_dataset([part], str(tmp_path / "one.parquet"), part.env, jobs=1)
    one = dataset.read_parquet(tmp_path / "one.parquet")
    assert list(df.key) == list(cases.keys())
    # the same rows and values (a dictionary column lists its categories in the order each chunk met them)
    pd.testing.assert_frame_equal(df, one, check_categorical=False)
    # merged from the raw file by forked processes, the same
    sweep.write_dataset([part], str(tmp_path / "two.parquet"), part.env, jobs=2, chunk_rows=12)
    pd.testing.assert_frame_equal(dataset.read_parquet(tmp_path / "two.parquet"), one, check_categorical=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.parquet", "a.raw.jsonl", "one.parquet", "two.parquet"]


def test_row_builders_started_ahead_build_the_rows_one_process_builds(tmp_path, monkeypatch):
    """`sweep` starts processes before the probe (`RowBuilders`) that build the dataset at the sweep's end,
    in ranges of `BUILDER_ROWS` records: the same rows, in the same order, as one process builds."""
    import pandas as pd
    cases = PLAN.cases
    monkeypatch.setattr(sweep.parts, "BUILDER_ROWS", 12)   # the real range is 512 records at least
    with sweep.RowBuilders(jobs=3) as rb:
        df = sweep.run(cases, str(tmp_path / "a.parquet"), sweep.NumpyExecutor(reps=1), window=50, progress=False,
                       builders=rb)
        assert len(sweep.parts._chunks(len(cases), rb.jobs, 12)) == 3
    raw = sweep.raw_path(str(tmp_path / "a.parquet"))
    part = sweep.Part(raw, True, sweep.raw_env(raw))
    part.scan(sweep.KeyIndex(cases.key_chunks()))
    sweep.write_dataset([part], str(tmp_path / "one.parquet"), part.env, jobs=1)
    assert list(df.key) == list(cases.keys())
    pd.testing.assert_frame_equal(df, dataset.read_parquet(tmp_path / "one.parquet"), check_categorical=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.parquet", "a.raw.jsonl", "one.parquet"]


def test_a_sweep_whose_row_builders_died_builds_its_dataset_itself(tmp_path, caplog):
    """A builder process killed during the sweep (by the kernel's out-of-memory killer, say) costs nothing:
    the sweep says so and builds the rows in its own process."""
    import signal
    cases = PLAN.cases
    with sweep.RowBuilders(jobs=2) as rb:
        os.kill(rb._ready[0].result(timeout=120), signal.SIGKILL)
        with caplog.at_level("WARNING", logger="cublaslt_probe.sweep"):
            df = sweep.run(cases, str(tmp_path / "a.parquet"), sweep.NumpyExecutor(reps=1), window=50,
                           progress=False, builders=rb)
    assert "processes started to build the dataset stopped" in caplog.text
    assert list(df.key) == list(cases.keys()) and df.error.isna().all() and df.time_us.notna().all()


def test_row_builders_share_the_host_with_the_launchers_other_sweep_processes():
    """torchrun or srun starting eight sweep processes on a 128-core host: 16 builders each, not 128 each
    (1,024 processes holding pandas and pyarrow); never more than BUILDERS_MAX, never none."""
    assert sweep.builder_jobs(128, {"LOCAL_WORLD_SIZE": "8"}) == 16
    assert sweep.builder_jobs(64, {"SLURM_NTASKS_PER_NODE": "8"}) == 8
    assert sweep.builder_jobs(128, {}) == sweep.BUILDERS_MAX
    assert sweep.builder_jobs(2, {"LOCAL_WORLD_SIZE": "8"}) == 1
    assert sweep.builder_jobs(16, {"LOCAL_WORLD_SIZE": "", "SLURM_NTASKS_PER_NODE": "2"}) == 8
    assert sweep.builder_jobs(environ={}) == min(sweep.BUILDERS_MAX, len(os.sched_getaffinity(0)))


def _children(pid: int) -> set[int]:
    out = set()
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.add(int(d))
    return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads processes from /proc (Linux)")
def test_row_builders_end_when_the_sweep_is_killed_outright(tmp_path):
    """A sweep killed with SIGKILL (the out-of-memory killer, a scheduler's preemption) leaves no builder
    process behind, waiting for ever with pandas and pyarrow loaded."""
    import signal
    import subprocess
    import sys
    script = tmp_path / "s.py"
    script.write_text("import sys, time\nfrom cublaslt_probe import sweep\nif __name__ == '__main__':\n"
                      "    rb = sweep.RowBuilders(jobs=2)\n    [f.result(timeout=120) for f in rb._ready]\n"
                      "    print('ready', flush=True)\n    time.sleep(300)\n")
    p = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)})
    try:
        assert p.stdout.readline().strip() == "ready"
        kids = _children(p.pid)
        assert len(kids) >= 2   # the two builders (and multiprocessing's resource tracker)
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    deadline = time.time() + 20
    while time.time() < deadline and any(_alive(k) for k in kids):
        time.sleep(0.2)
    left = [k for k in kids if _alive(k)]
    for k in left:
        os.kill(k, signal.SIGKILL)
    assert not left, left
