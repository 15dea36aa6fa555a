"""Cold-start evidence and host stalls inside `audit` and `trace`, on real H200 captures (fixtures'
PROVENANCE.md: tests/fixtures/programs and tests/fixtures/coldstart)."""
import pathlib

import pandas as pd
from click.testing import CliRunner

from cublaslt_probe.analysis.audit import audit
from cublaslt_probe.analysis.coldstart.observed import apply_observed
from cublaslt_probe.analysis.coldstart.saved import load
from cublaslt_probe.analysis.trace import read_chrome_trace
from cublaslt_probe.cli import main
from cublaslt_probe.names import decode
from cublaslt_probe.render.audit import summary_lines

FIX = pathlib.Path(__file__).parent / "fixtures"
RUN = FIX / "programs" / "compiled_mlp"
COLD = FIX / "coldstart" / "compiled_mlp.json.gz"


def _kernel_rows():
    """Every kernel of the captured compiled MLP step, with the provenance its name gives."""
    det = read_chrome_trace(RUN / "trace.json.gz", detail=True).detail
    names = sorted(set(det.names))
    per_name = {n: [0, 0.0] for n in names}
    for i, d in zip(det.launches["name"], det.launches["dur"]):
        per_name[det.names[i]][0] += 1
        per_name[det.names[i]][1] += float(d)
    rows = pd.DataFrame({"kernel": names, "provenance": pd.Categorical([decode(n).provenance for n in names])})
    return rows, per_name


def test_kernels_seen_compiled_become_observed_the_rest_keep_their_name_evidence():
    rows, per_name = _kernel_rows()
    out, seen = apply_observed(rows, load(COLD), per_name, steps=2)
    tri = out.kernel.str.startswith("triton_")
    assert tri.sum() == 3
    assert (out.loc[tri, "evidence"] == "observed").all()
    assert (out.loc[tri, "provenance"] == "runtime-compiled").all()
    assert (out.loc[~tri, "evidence"] == "name").all() and out.evidence.notna().all()
    assert seen["kernels"] == 3 and seen["by_mechanism"] == {"triton": 3}
    triton_us = sum(v[1] for k, v in per_name.items() if k.startswith("triton_")) / 2
    assert abs(seen["gpu_us"] - triton_us) < 1e-6 and triton_us > 100
    assert all("Triton wrote" in h for h in seen["how"].values())


def test_audit_with_a_cold_start_says_what_was_observed():
    a = audit(RUN, coldstart=load(COLD))
    assert a.observed["kernels"] == 3 and a.observed["gemm_rows"] == 0     # its GEMMs are cuBLAS's
    assert (a.rows.evidence == "name").all()
    assert any(ln.startswith("cold-start evidence (compiled_mlp): 3 kernel name(s) of this trace observed made or "
                             "chosen at run time (runtime-compiled 3; by mechanism: triton 3)")
               for ln in summary_lines(a))
    plain = audit(RUN)
    assert plain.observed is None and (plain.rows.evidence == "name").all() and len(plain.rows) == len(a.rows)


def test_audit_names_the_decode_stall_and_nothing_on_a_busy_step():
    lines = summary_lines(audit(FIX / "programs" / "llama_decode"))
    stall = [ln for ln in lines if ln.startswith("host stall:")]
    assert len(stall) == 1 and "aten::_cudnn_attention_forward (model.layers.0.self_attn)" in stall[0]
    assert "sdpa_kernel(FLASH_ATTENTION)" in stall[0]
    assert not [ln for ln in summary_lines(audit(FIX / "programs" / "gpt2_train")) if ln.startswith("host stall")]


def test_cli_coldstart_option_on_audit_and_trace(tmp_path):
    r = CliRunner().invoke(main, ["audit", str(RUN), "--coldstart", str(COLD), "-f", "jsonl"])
    assert r.exit_code == 0, r.output
    assert '"evidence": "name"' in r.stdout
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    for cmd in (["audit", str(RUN)], ["trace", str(RUN / "trace.json.gz")]):
        r = CliRunner().invoke(main, cmd + ["--coldstart", str(bad)])
        assert r.exit_code == 1 and "not a cold-start result" in r.output and "Traceback" not in r.output


def test_audit_of_a_cut_off_trace_shows_what_it_has_and_exits_partial(tmp_path):
    """The real GPT-2 run's trace cut at 85 % of its bytes (its kernels start at 62 %): the rows before the cut, a
    note, exit 3."""
    import gzip
    import shutil
    raw = gzip.open(FIX / "programs" / "gpt2_train" / "trace.json.gz").read()
    run = tmp_path / "run"
    run.mkdir()
    with gzip.open(run / "trace.json.gz", "wb") as f:
        f.write(raw[: int(len(raw) * 0.85)])
    shutil.copy(FIX / "programs" / "gpt2_train" / "env.json", run / "env.json")
    a = audit(run)
    assert a.partial and len(a.rows) > 0
    assert any("cut off inside the event array" in n for n in a.notes)
    assert not audit(FIX / "programs" / "gpt2_train").partial
    r = CliRunner().invoke(main, ["audit", str(run), "-f", "jsonl"])
    assert r.exit_code == 3 and r.stdout.count("\n") == len(a.rows) and "Traceback" not in r.output


def test_kernels_xla_timed_become_autotuned_whatever_their_name_says():
    """The JAX program's cold start (tests/fixtures/coldstart/compilers): cuBLASLt's nvjet kernels, which XLA's
    autotuner ran among its candidates, are library-selected by their name and autotuned by observation; XLA's
    own GEMM fusions likewise. A row table of those names is upgraded and counted by provenance."""
    cold = load(FIX / "coldstart" / "compilers" / "jax_run1.json.gz")
    from cublaslt_probe.analysis.coldstart.observed import observed_provenance
    names = sorted(observed_provenance(cold))
    rows = pd.DataFrame({"kernel": names, "provenance": pd.Categorical([decode(n).provenance for n in names])})
    nvjet = rows.kernel.str.startswith("nvjet_")
    assert nvjet.sum() == 16 and (rows.loc[nvjet, "provenance"] == "library-selected").all()
    out, seen = apply_observed(rows, cold)
    assert (out.provenance == "autotuned").all() and (out.evidence == "observed").all()
    assert seen["gemm_rows"] == 18 and seen["gemm_rows_by_provenance"] == {"autotuned": 18}
