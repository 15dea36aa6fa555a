"""GPU tests of grouped GEMMs (`python3 -m pytest -m gpu tests/test_gpu_grouped.py`); skipped with a reason
where no GPU is visible (conftest): the probe's grouped GEMMs against a loop over the experts, their records, and
the capture's group sizes against the trace of the same step."""
import gzip
import json

import pytest

from cublaslt_probe import runfiles, sweep
from cublaslt_probe.cases import Case, sizes_summary

pytestmark = pytest.mark.gpu

G, N, K = 16, 256, 512
CASES = [
    Case("torch", "grouped_mm", "bf16", "NT", 1000, N, K, 1, G, "seed=3,top_k=2"),
    Case("torch", "grouped_mm", "bf16", "NN", 1024, N, K, 1, G, "zipf=1"),
    Case("torch", "grouped_mm", "bf16", "NT", 64, N, K, G, G, "batched"),
    Case("torch", "grouped_mm", "fp16", "NT", 1024, N, K, 1, G, "uniform"),
    Case("torch", "scaled_grouped_mm", "fp8", "NT", 1024, N, K, 1, G, "seed=1,top_k=1"),
]


@pytest.fixture(scope="module")
def probe():
    from cublaslt_probe.gpu.probe import Probe
    with Probe() as p:
        yield p


@pytest.mark.parametrize("c", CASES, ids=lambda c: c.key)
def test_a_grouped_gemm_is_the_loop_over_its_groups(probe, c):
    """The probe's grouped GEMM gives, group by group, what one matmul per group of the same operands gives."""
    torch = probe.torch
    b = probe.builder.build(c)
    try:
        out = b.fn().float()
        a, w = b.keep[0].float(), b.keep[1].float()
        if c.sizes == "batched":
            ref = torch.bmm(a, w)
        else:
            parts, at = [], 0
            for g, rows in enumerate(c.group_sizes()):
                parts.append(a[at:at + rows] @ w[g])
                at += rows
            ref = torch.cat(parts)
        assert out.shape == ref.shape
        err = ((out - ref).abs().max() / ref.abs().max()).item()
        assert err < (0.05 if c.dtype == "fp8" else 0.01), err
    finally:
        b.close()


def test_grouped_records_hold_kernels_time_and_sizes(probe):
    recs = probe.run_window(CASES)
    for c, r in zip(CASES, recs):
        assert r["error"] is None, (c.key, r["error"])
        assert r["kernels"] and r["time_us"] > 0, c.key
        assert r["group_sizes"] == c.group_sizes() and sum(r["group_sizes"]) == c.m * c.batch
        assert r["group_summary"] == sizes_summary(c.group_sizes())
        assert r["heuristic_miss_us"] is None   # no cuBLASLt heuristic question is asked
        assert r["timing"]["launch"] == "library" and "allocator" in r["timing"]["replay_refused"]
        if c.dtype == "fp16":   # torch's fallback: one cuBLAS GEMM per non-empty group, logged by cuBLASLt
            assert len(r["kernels"]) >= G and r["log_lines"]
        else:                   # CUTLASS's grouped kernel: nothing in cuBLASLt's log
            assert r["log_lines"] == []
            assert any("GroupProblemShape" in k for k in r["kernels"]), r["kernels"]


def test_the_moe_preset_plans_what_the_builder_runs(probe):
    """Every moe preset GEMM of the smallest token count builds and runs one call."""
    small = [c for c in sweep.plan("moe").cases if c.m * c.batch <= 256]
    assert small
    for c in small:
        b = probe.builder.build(c)
        try:
            b.fn()
        finally:
            b.close()
    probe.torch.cuda.synchronize()


def _moe_layer(torch):
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock
    cfg = MixtralConfig(hidden_size=256, intermediate_size=512, num_local_experts=8, num_experts_per_tok=2)
    cfg._experts_implementation = "grouped_mm"
    with torch.device("cuda"):
        layer = MixtralSparseMoeBlock(cfg).to(torch.bfloat16)
    for p in layer.parameters():
        torch.nn.init.normal_(p, std=0.02)
    return layer


def test_capture_records_the_group_sizes_of_every_grouped_call(tmp_path):
    """Forward and backward of a Mixtral-shaped MoE layer, two steps: one record per grouped call the program
    made (the trace's forward calls, on the step's thread), in trace order within each step, with the same
    operand dims, and sizes that add up to the routed rows; the trace holds each call once."""
    import torch

    from cublaslt_probe.gpu.recorder import capture
    from cublaslt_probe.runfiles import read_group_sizes
    layer = _moe_layer(torch)
    x = torch.randn(2, 64, 256, device="cuda", dtype=torch.bfloat16)
    with capture(tmp_path / "run", model=layer) as cap:
        for _ in range(2):
            with cap.step():
                layer(x).float().square().mean().backward()
    recs = read_group_sizes(tmp_path / "run")
    with gzip.open(tmp_path / "run" / runfiles.TRACE_FILE, "rt") as f:
        events = json.load(f)["traceEvents"]
    steps = sorted((e for e in events
                    if e.get("cat") == "user_annotation" and e["name"].startswith(runfiles.STEP_PREFIX)),
                   key=lambda e: e["ts"])
    grouped = sorted((e for e in events if e.get("cat") == "cpu_op" and e.get("name") == "aten::_grouped_mm"),
                     key=lambda e: e["ts"])
    calls = [e for e in grouped if e["tid"] == steps[0]["tid"]]   # the program's; backward's run on autograd's thread
    assert len(recs) == len(calls) == 2 * 2   # per step: gate+up and down
    assert len(grouped) == 2 * 5   # each once: per step 2 forward, 3 backward (x needs no gradient: no dA of gate+up)
    for s, st in enumerate(steps):
        inside = [e for e in calls if st["ts"] <= e["ts"] <= st["ts"] + st["dur"]]
        mine = [r for r in recs if r["step"] == s]
        assert [r["call"] for r in mine] == list(range(len(inside)))
        for r, e in zip(mine, inside):
            dims = e["args"]["Input Dims"]
            assert (r["a"], r["b"]) == (dims[0], dims[1])
            assert r["group_dim"] == "m" and sum(r["sizes"]) == r["a"][0] == 2 * 64 * 2 and r["groups"] == 8
    env = json.loads((tmp_path / "run" / runfiles.ENV_FILE).read_text())
    assert env["capture"]["group_sizes_calls"] == len(recs)


def test_capture_without_group_sizes_writes_none(tmp_path):
    import torch

    from cublaslt_probe.gpu.recorder import capture
    from cublaslt_probe.runfiles import read_group_sizes
    layer = _moe_layer(torch)
    x = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16)
    with capture(tmp_path / "run", model=layer, group_sizes=False) as cap:
        with cap.step(), torch.no_grad():
            layer(x[None])
    assert read_group_sizes(tmp_path / "run") is None
    assert json.loads((tmp_path / "run" / runfiles.ENV_FILE).read_text())["capture"]["group_sizes_calls"] is None


def test_grouped_alternatives_run_and_the_loop_matches(probe):
    """The alternatives of a routed grouped GEMM all run; one mm per group gives the grouped GEMM's output."""
    from cublaslt_probe.gpu.alternatives import time_grouped_alternatives
    rows = time_grouped_alternatives(probe, CASES[0])
    by = {r["variant"]: r for r in rows}
    assert list(by) == ["original", "pad8", "pad16", "pad64", "pad128", "balanced", "bmm_padded", "fp8",
                        "mm_per_group"]
    assert all(r["error"] is None and r["time_us"] > 0 and r["kernels"] for r in rows), rows
    assert by["original"]["rows"] == 1000 < by["pad8"]["rows"] <= by["pad128"]["rows"]
    assert by["pad8"]["group_summary"]["unaligned"] == 0 and by["original"]["saved_us"] == 0
    assert by["mm_per_group"]["max_rel_diff"] < 0.01
    assert sum(1 for k in by["mm_per_group"]["kernels"] if "nvjet" in k or "gemm" in k) >= G - 1


SPLIT_K = Case("torch", "grouped_mm", "bf16", "TN", 256, 512, 1024, 1, 8, "k:zipf=1")


def test_the_weight_gradients_grouped_gemm_is_the_loop_over_its_k_slices(probe):
    """The weight gradient's form (A [m, k] column-major, B [k, n], offsets along k): each group's output is
    the product of its own slice of k; its record holds the sizes along k, and its alternatives run."""
    from cublaslt_probe.gpu.alternatives import time_grouped_alternatives
    c = SPLIT_K
    b = probe.builder.build(c)
    try:
        out = b.fn().float()
        a, w = b.keep[0].float(), b.keep[1].float()
        assert b.keep[0].stride() == (1, c.m)           # column-major A, as autograd passes it
        parts, at = [], 0
        for rows in c.group_sizes():
            parts.append(a[:, at:at + rows] @ w[at:at + rows])
            at += rows
        ref = probe.torch.stack(parts)
        assert out.shape == ref.shape == (c.groups, c.m, c.n)
        assert ((out - ref).abs().max() / ref.abs().max()).item() < 0.01
    finally:
        b.close()
    rec = probe.run_window([c])[0]
    assert rec["error"] is None and rec["kernels"] and rec["time_us"] > 0
    assert rec["group_sizes"] == c.group_sizes() and sum(rec["group_sizes"]) == c.k
    by = {r["variant"]: r for r in time_grouped_alternatives(probe, c)}
    assert list(by) == ["original", "pad8", "pad16", "pad64", "pad128", "balanced", "bmm_padded", "mm_per_group"]
    assert all(r["error"] is None and r["time_us"] > 0 for r in by.values()), by
    assert by["original"]["rows"] == c.k < by["pad128"]["rows"]
    assert by["mm_per_group"]["max_rel_diff"] < 0.01
