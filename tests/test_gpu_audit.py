"""GPU: capture a small program, audit it, measure its GEMMs, and get advice (`python3 -m pytest -m gpu`)."""
import json

import pytest
from click.testing import CliRunner

from cublaslt_probe import runfiles
from cublaslt_probe.cli import main

pytestmark = pytest.mark.gpu


def _program():
    import torch

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.up = torch.nn.Linear(1024, 4095, bias=False)     # out width not 16-byte aligned in bf16
            self.down = torch.nn.Linear(4095, 1024, bias=False)

        def forward(self, x):
            return self.down(torch.nn.functional.gelu(self.up(x)))

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList([Block(), Block()])

        def forward(self, x):
            for b in self.layers:
                x = x + b(x)
            return x

    with torch.device("cuda"):
        model = Model().to(torch.bfloat16)
    x = torch.randn(2048, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    return model, lambda: model(x).float().pow(2).mean().backward()


def test_capture_audit_measure_end_to_end(tmp_path):
    import cublaslt_probe
    from cublaslt_probe.analysis.audit import audit
    model, step = _program()
    step()
    run = tmp_path / "run"
    with cublaslt_probe.capture(run, model=model) as cap:
        for _ in range(2):
            with cap.step():
                step()
    for f in (runfiles.TRACE_FILE, runfiles.LOG_FILE, runfiles.ENV_FILE):
        assert (run / f).stat().st_size > 0, f
    env = json.loads((run / runfiles.ENV_FILE).read_text())
    assert env["capture"]["steps"] == 2 and "layers.0.up" in env["capture"]["modules"]
    a = audit(run)
    assert a.steps == 2
    assert abs(a.rows.gpu_us.sum() - a.gemm_gpu_us) <= 0.01 * a.gemm_gpu_us
    assert a.attributed_share >= 0.95
    mods = set(a.rows.module.dropna())
    assert {"layers.*.up", "layers.*.down"} <= mods, mods
    assert set(a.rows["pass"].dropna()) == {"fwd", "bwd"}
    # the 4095-wide GEMMs ran and were joined to their log lines
    assert a.rows.algo.notna().sum() >= 0.8 * len(a.rows)
    save = tmp_path / "measure.json"
    r = CliRunner().invoke(main, ["audit", str(run), "--measure", "--top-measure", "3", "--save", str(save),
                                  "--html", str(tmp_path / "audit.html"), "--format", "jsonl"])
    assert r.exit_code == 0, r.output
    meas = json.loads(save.read_text())
    # the 3 largest and every other GEMM of their modules (`plan.to_measure`): both linears' fwd and bwd
    from cublaslt_probe.analysis.audit.plan import to_measure
    want, more = to_measure(a.rows.to_dict("records"), 3)
    assert more > 0 and len(meas["gemms"]) == len(want) == 3 + more, [g["module"] for g in meas["gemms"]]
    assert {g["module"] for g in meas["gemms"]} == {r["module"] for r in want}
    # bound to the run it measured: its GEMM problems, GPU and libraries (tests/test_measure_binding.py)
    from cublaslt_probe.analysis.audit.measured import run_fingerprint
    from cublaslt_probe.analysis.audit.measurement import SCHEMA_VERSION
    assert meas["schema_version"] == SCHEMA_VERSION and meas["fingerprint"]["gemms"] == run_fingerprint(a)["gemms"]
    assert meas["fingerprint"]["env"]["gpu"] == meas["env"]["gpu"]
    measured = [g for g in meas["gemms"] if "original_us" in g]
    assert measured, meas["gemms"]
    for g in measured:
        assert g["original_us"] > 0
        assert {p["path"] for p in g["paths"]} | {g["case"].split("|")[0]} == {"torch", "torch-lt", "lt"}
        assert any(c["rank"] == 0 and c["time_us"] for c in g["candidates"])
    # a 4095-wide problem has a padded what-if, timed
    odd = [g for g in measured if 4095 in (g["key"]["m"], g["key"]["n"], g["key"]["k"])]
    assert odd and all(any(w["value"] == 4096 and w["time_us"] for w in g["whatifs"]) for g in odd)
    assert (tmp_path / "audit.html").read_text().count("<svg") >= 1
    # rendered again from the saved file, on any machine
    r2 = CliRunner().invoke(main, ["audit", str(run), "--from", str(save)])
    assert r2.exit_code == 0 and "advice" in r2.output, r2.output
