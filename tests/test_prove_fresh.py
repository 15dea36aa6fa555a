"""CPU tests of proving a workspace in fresh processes (`gpu.prove`'s fresh-process half, `gpu.prove_child`): the
advice carries the size it was measured with, the variant child's command and environment are built from it
(the variable in KiB, as torch reads it), the children's rounds become a record a proof file accepts, a child
that fails names its error, and without a script the item stays unproven naming the route that proves it. The
children's timing needs a GPU: tests/test_gpu_prove.py."""
import json
import os
import sys

import pytest
from conftest import FIXTURES

from cublaslt_probe.analysis import proof as P
from cublaslt_probe.gpu import prove_child
from cublaslt_probe.gpu.prove import (
    Unproven,
    applier_for,
    fresh_command,
    fresh_env,
    fresh_mismatch,
    fresh_setting,
    fresh_summary,
    run_child,
)

TITAN = FIXTURES / "proofs" / "titan_moe_train"


def _advice(measure):
    from cublaslt_probe.analysis.audit import advice, audit
    from cublaslt_probe.analysis.audit.measured import load_bound
    a = audit(TITAN)
    meas, _ = load_bound(a, measure, str(TITAN))
    return advice(a.rows, meas, a.step_gpu_us, a.step_gpu_us * a.steps)


def _switches(items):
    return {it["kind"]: it for it in items if it["kind"] in ("workspace", "path")}


def test_the_workspace_item_carries_the_size_its_gemms_were_timed_with():
    """The titan MoE's committed measurement times its output layer's GEMMs on cuBLASLt with a 32 MiB workspace:
    the advice's workspace item carries that size in its change (the prover reads no words), the path item
    carries none."""
    sw = _switches(_advice(str(TITAN / "measure.json")))
    assert sw["workspace"]["change"] == {"path": "lt", "workspace_bytes": 32 << 20}
    assert sw["path"]["change"] == {"path": "torch-lt"}
    assert "32 MiB" in sw["workspace"]["what"] and sw["workspace"]["saving_us"] > 0


def test_a_measurement_whose_paths_do_not_record_their_workspace_still_advises_and_the_item_is_unproven():
    """A measurement written before its paths recorded their workspace still makes the workspace item; the item
    says no size, and the prover leaves it unproven saying so instead of guessing one."""
    doc = json.loads((TITAN / "measure.json").read_text())
    dropped = 0
    for g in doc["gemms"]:
        for p in g.get("paths") or []:
            dropped += p.pop("workspace", None) is not None
    assert dropped
    ws = _switches(_advice(doc))["workspace"]
    assert ws["change"] == {"path": "lt", "workspace_bytes": None}
    with pytest.raises(Unproven, match="does not say the workspace size"):
        fresh_setting(ws)


def test_the_variant_child_sets_the_items_workspace_in_kib_and_the_blas_path_before_the_script():
    """The workspace item of the titan advice becomes a child that sets torch's BLAS preference to cuBLASLt and
    starts with CUBLASLT_WORKSPACE_SIZE=32768 (KiB: torch multiplies it by 1024); the original's child sets
    neither and keeps the parent's own variable. Both run this package first on PYTHONPATH and the script with
    its arguments after ``--``, which the child reads back as it was given."""
    item = _switches(_advice(str(TITAN / "measure.json")))["workspace"]
    setting = fresh_setting(item)
    assert setting == {"blas": "cublaslt", "env": {"CUBLASLT_WORKSPACE_SIZE": "32768"}}
    script = ["train.py", "--lr", "3", "--", "--blas"]
    var, orig = fresh_command(script, setting), fresh_command(script, None)
    assert var[:3] == [sys.executable, "-m", "cublaslt_probe.gpu.prove_child"]
    opts, got = prove_child.parse(var[3:])
    assert (opts.blas, got, opts.blocks, opts.steps) == ("cublaslt", script, 3, 3)
    opts, got = prove_child.parse(orig[3:])
    assert (opts.blas, got) == (None, script)
    base = {"PATH": "/bin", "PYTHONPATH": "elsewhere", "CUBLASLT_WORKSPACE_SIZE": "2048"}
    v, o = fresh_env(base, setting), fresh_env(base, None)
    assert v["CUBLASLT_WORKSPACE_SIZE"] == "32768" and o["CUBLASLT_WORKSPACE_SIZE"] == "2048"
    root, _, rest = v["PYTHONPATH"].partition(os.pathsep)
    assert os.path.isfile(os.path.join(root, "cublaslt_probe", "gpu", "prove_child.py")) and rest == "elsewhere"
    assert "CUBLASLT_WORKSPACE_SIZE" not in fresh_env({"PATH": "/bin"}, None)
    odd = fresh_setting({"change": {"path": "lt", "workspace_bytes": (1 << 20) + 1}})
    assert odd["env"]["CUBLASLT_WORKSPACE_SIZE"] == "1025"            # rounded up: never less than measured


def test_a_variant_child_that_did_not_run_with_the_setting_is_named():
    """The variant's child reports torch's BLAS preference after its steps and the workspace variable it started
    with: a script that sets its own preference, or a variable that did not reach the child, fails the item."""
    setting = {"blas": "cublaslt", "env": {"CUBLASLT_WORKSPACE_SIZE": "32768"}}
    assert fresh_mismatch(setting, {"blas": "cublaslt", "CUBLASLT_WORKSPACE_SIZE": "32768"}) is None
    assert "ran on 'cublas'" in fresh_mismatch(setting, {"blas": "cublas", "CUBLASLT_WORKSPACE_SIZE": "32768"})
    assert "CUBLASLT_WORKSPACE_SIZE=None" in fresh_mismatch(setting, {"blas": "cublaslt"})


def test_child_rounds_become_a_record_with_a_live_proofs_statistics_that_a_proof_file_accepts(tmp_path):
    """Round i compares child original[i]'s timed steps with child variant[i]'s (medians of all their blocks'
    steps); the noise floor is the original-against-original pairs' median absolute difference. Three rounds
    whose variant runs 100, 120 and 90 µs faster give 100 [95, 110]; the record says how it was measured and a
    proof holding it loads without a note and reads as a saving."""
    def child(us):
        return [[us, us + 1, us - 1], [us + 2, us, us - 2]]
    orig = [child(1000.0), child(1010.0), child(990.0)]
    var = [child(900.0), child(890.0), child(900.0)]
    noise = [(child(1000.0), child(1004.0)), (child(1000.0), child(998.0)), (child(995.0), child(1000.0))]
    s = fresh_summary(orig, var, noise)
    assert (s["proven_us"], s["spread_us"], s["rounds"], s["noise_us"]) == (100.0, [95.0, 110.0], 3, 4.0)
    assert (s["original_step_us"], s["variant_step_us"]) == (1000.0, 900.0)
    assert s["measured"].startswith("in fresh processes: 3 rounds of child pairs") and "3 original-against" in \
        s["measured"]
    what = "run on cuBLASLt with a 32 MiB workspace"
    path = tmp_path / "proof.json"
    P.write(path, {"items": [{"what": what, "kind": "workspace", "predicted_us": 120.0, "status": "proven", **s}]})
    proof, notes = P.load(path)
    assert notes == [] and proof.items[0].rounds == 3
    (x,) = P.apply([{"what": what, "saving_us": 120.0, "excludes": []}], proof)
    assert x["proof"]["verdict"] == "saves"


def test_a_child_that_fails_gives_the_last_line_of_its_stderr(tmp_path):
    """A script that raises while it loads, and one without a step(), fail their child: `run_child` says why in
    the last line of the child's stderr (the exception a traceback ends with). No torch is needed: the original's
    child loads the script before it imports torch."""
    bad = tmp_path / "bad.py"
    bad.write_text("raise RuntimeError('no GPU for this program')\n")
    got = run_child(fresh_command([str(bad), "--x"], None, blocks=1, steps=1, warmup=0), fresh_env(os.environ, None),
                    timeout=120)
    assert got["ok"] is False and got["why"] == "RuntimeError: no GPU for this program"
    empty = tmp_path / "empty.py"
    empty.write_text("model = None\n")
    got = run_child(fresh_command([str(empty)], None, blocks=1, steps=1, warmup=0), fresh_env(os.environ, None),
                    timeout=120)
    assert got["ok"] is False and got["why"] == f"RuntimeError: {empty} defines no step() at its top level"


def test_without_a_script_the_workspace_item_is_unproven_naming_the_route_that_proves_it():
    """In a live step (the Python API given a step callable) a workspace cannot be switched: the item is
    unproven, and the reason names the command (and the `script` argument) that proves it in fresh processes."""
    item = _switches(_advice(str(TITAN / "measure.json")))["workspace"]
    with pytest.raises(Unproven) as e:
        applier_for(None, None, item)
    assert "cublaslt-probe prove RUN --from M -- SCRIPT.py" in str(e.value) and "script=" in str(e.value)
