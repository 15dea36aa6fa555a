"""The click group's last line of defence, in process: each kind of failure inside a command becomes one line
on stderr with the documented exit status, never a traceback. The failing commands are added to the real group
for the test (nothing of cuBLAS, torch or a file format is stood in for)."""
from __future__ import annotations

import errno

import click
import pytest
from click.testing import CliRunner

from cublaslt_probe.cli import _BROKEN, main
from cublaslt_probe.errors import NoCudaDevice, OptionError, SpecError


def _raiser(exc: BaseException):
    @click.command("failing-for-test")
    def cmd():
        raise exc
    return cmd


@pytest.fixture
def run():
    added = []

    def invoke(exc):
        cmd = _raiser(exc)
        main.add_command(cmd)
        added.append(cmd.name)
        return CliRunner().invoke(main, [cmd.name])
    yield invoke
    for name in added:
        main.commands.pop(name, None)


@pytest.mark.parametrize("exc, exit_code, line", [
    (SpecError("the spec names no shapes:\n  add m, n and k"), 1, "Error: the spec names no shapes: add m, n and k"),
    (FileNotFoundError(errno.ENOENT, "No such file or directory", "runs/x.json"), 1,
     "Error: runs/x.json: No such file or directory"),
    (OSError(errno.ENOSPC, "No space left on device"), 1, "Error: No space left on device"),
    (MemoryError(), 1, "Error: out of memory: give the command a smaller input"),
    (KeyError("time_us"), 1, "Error: internal error in `failing-for-test`: KeyError: 'time_us' (a bug: please "
                             "report it with the command line; -vv shows the traceback)"),
])
def test_a_failure_inside_a_command_is_one_line(run, exc, exit_code, line):
    r = run(exc)
    assert r.exit_code == exit_code, r.output
    assert r.output.strip().splitlines() == [line]
    assert "Traceback" not in r.output


def test_no_gpu_is_named_after_the_command_the_user_ran(run):
    r = run(NoCudaDevice("torch.cuda.is_available"))
    assert r.exit_code == 1
    [out] = r.output.strip().splitlines()
    assert out.startswith("Error: ") and "failing-for-test" in out and "torch.cuda.is_available" not in out


def test_a_closed_pipe_ends_the_command_quietly(run):
    r = run(BrokenPipeError())
    assert r.exit_code == 0 and r.output == ""


def test_a_usage_error_keeps_clicks_own_status(run):
    r = run(click.UsageError("give --preset or --spec"))
    assert r.exit_code == 2 and "give --preset or --spec" in r.output


def test_a_command_module_that_failed_to_import_is_warned_about_on_every_run(run):
    _BROKEN["plots"] = "ImportError: matplotlib is broken"
    try:
        r = run(SpecError("x"))
    finally:
        _BROKEN.pop("plots")
    first = r.output.splitlines()[0]
    assert first.startswith("warning: the commands of cublaslt_probe.cli.plots are missing")
    assert "matplotlib is broken" in first and "pip install -e ." in first


def test_an_option_value_the_library_refuses_is_a_usage_error(run):
    r = run(OptionError("unknown x axis 'q'; choose one of m, n, k"))
    assert r.exit_code == 2
    assert r.output.strip().splitlines()[-1] == "Error: unknown x axis 'q'; choose one of m, n, k"
    assert "Traceback" not in r.output


def test_a_record_keeps_an_errors_type_and_its_start_only():
    """`errors.error_text`: what every row, run and variant keeps of an exception (one home, one length)."""
    from cublaslt_probe.errors import ERROR_CHARS, error_text
    text = error_text(OSError("cuBLAS status dump " + "0x00 " * 1000))
    assert text.startswith("OSError: cuBLAS status dump 0x00") and len(text) == ERROR_CHARS
    assert error_text(KeyError("gpu")) == "KeyError: 'gpu'"
