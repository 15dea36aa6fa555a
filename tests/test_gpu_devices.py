"""GPU test of `sweep --devices` on two GPUs (run on the two-GPU host: `python3 -m pytest -m gpu`)."""
import json

import pytest
from click.testing import CliRunner

from cublaslt_probe import sweep
from cublaslt_probe.analysis import dataset
from cublaslt_probe.cli import main

pytestmark = pytest.mark.gpu

# every m to 256 at three widths (768 GEMMs, 48 fine slices of two workers: the old slices, every 48th GEMM, dealt
# in turn, give each worker every width): neighbouring GEMMs of the plan share kernels, far ones do not
SPEC = {"name": "devices", "group": [{"backends": ["lt"], "ops": ["mm"], "dtypes": ["bf16"], "layouts": ["NT"],
                                      "m": {"range": [1, 256]}, "n": [4096, 6144, 14336], "k": [4096]}]}


def test_two_workers_keep_to_their_own_blocks_and_load_fewer_kernels_each(tmp_path):
    """Each worker keeps to its own half of the plan (worker 0 from block 1, worker 1 from block count/2 + 1),
    the parts cover the plan, and each worker meets far fewer of the sweep's kernels than the slices before the
    blocks (every count-th GEMM, dealt in turn) would have given it."""
    import torch
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs (run it on the two-GPU host)")
    spec = tmp_path / "s.json"
    spec.write_text(json.dumps(SPEC))
    out = tmp_path / "d.parquet"
    r = CliRunner().invoke(main, ["sweep", "--spec", str(spec), "-o", str(out), "--devices", "0,1", "--no-progress",
                                  "--window", "32"])
    assert r.exit_code == 0, r.output
    plan = sweep.plan_from_spec(SPEC)
    count = sweep.fine_slices(len(plan.cases), 2, 32)
    df = dataset.read_parquet(str(out))
    assert len(df) == len(plan.cases) == 768 and count == 96 and df.error.isna().all()
    worker, kernels = {}, {}
    for j in range(1, count + 1):
        raw = sweep.raw_path(sweep.part_path(str(out), sweep.WHOLE.cut(j, count)))
        env, recs = dataset.read_raw(raw)
        worker[j] = env["worker"]
        for rec in recs:
            kernels[rec["key"]] = set(rec["kernels"])
    quarter = count // 4
    assert {worker[j] for j in range(1, quarter + 1)} == {"0"}, worker
    assert {worker[j] for j in range(count // 2 + 1, count // 2 + quarter + 1)} == {"1"}, worker
    met = {w: set() for w in ("0", "1")}
    for j, w in worker.items():
        for c in sweep.WHOLE.cut(j, count).take(plan.cases):
            met[w] |= kernels[c.key]
    before = [set(), set()]
    for j in range(1, count + 1):
        for c in sweep.WHOLE.split(j, count).take(plan.cases):
            before[(j - 1) % 2] |= kernels[c.key]
    each, old = sorted(len(m) for m in met.values()), sorted(len(m) for m in before)
    print(f"distinct kernels per worker {each}; with the slices before {old}; "
          f"in all {len(set().union(*kernels.values()))}")
    assert each[1] <= 0.8 * old[1], (each, old)
