"""The capture API and command on a machine without a GPU: what they refuse, in one line (the capture itself is
tested on the GPU: tests/test_gpu_audit.py)."""
import pytest
from click.testing import CliRunner

import cublaslt_probe
from cublaslt_probe import runfiles
from cublaslt_probe.cli import main
from cublaslt_probe.errors import CaptureError
from cublaslt_probe.gpu.recorder import capture, run_script


def test_cublaslt_probe_capture_stays_the_function():
    """The capture code lives in `recorder`: a submodule named `capture` would replace the package's
    `capture` function by itself once imported (seen: the second `cublaslt_probe.capture(...)` failed)."""
    import importlib
    importlib.import_module("cublaslt_probe.cli.capture")
    for _ in range(2):
        assert cublaslt_probe.capture is capture and callable(cublaslt_probe.capture)


def test_capture_refuses_a_model_that_is_not_a_module(tmp_path):
    with pytest.raises(CaptureError, match="model=int is not a torch.nn.Module"):
        capture(tmp_path / "run", model=3)


def test_run_script_refuses_a_missing_script_and_no_script(tmp_path):
    with pytest.raises(CaptureError, match="no such file"):
        run_script(tmp_path / "run", [str(tmp_path / "missing.py")])
    with pytest.raises(CaptureError, match="no script given"):
        run_script(tmp_path / "run", [])


def test_capture_command_errors_are_one_line(tmp_path):
    r = CliRunner().invoke(main, ["capture", "-o", str(tmp_path / "run"), "--", str(tmp_path / "missing.py")])
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert r.output.count("Error:") == 1 and "no such file" in r.output
    assert not (tmp_path / "run" / runfiles.TRACE_FILE).exists()


def test_run_folder_names_are_the_ones_audit_reads():
    from cublaslt_probe.analysis.audit import resolve
    assert (runfiles.TRACE_FILE, runfiles.LOG_FILE, runfiles.ENV_FILE) == ("trace.json.gz", "cublaslt.log",
                                                                          "env.json")
    assert resolve is not None
