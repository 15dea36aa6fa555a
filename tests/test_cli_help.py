"""Every command of the click group: its --help runs, every option says what it does, the output options
use one vocabulary, and a command module that fails to import is reported, not skipped."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from cublaslt_probe.cli import _BROKEN, main
from cublaslt_probe.cli._common import FORMATS
from cublaslt_probe.errors import CPU_COMMANDS, GPU_COMMANDS

ROOT = Path(__file__).resolve().parent.parent


def _commands(group: click.Group, prefix=()):
    for name, cmd in sorted(group.commands.items()):
        yield prefix + (name,), cmd
        if isinstance(cmd, click.Group):
            yield from _commands(cmd, prefix + (name,))


COMMANDS = list(_commands(main))


def test_every_command_module_imports():
    assert _BROKEN == {}
    assert len(COMMANDS) >= 16


@pytest.mark.parametrize("path,cmd", COMMANDS, ids=[" ".join(p) for p, _ in COMMANDS])
def test_help_of_every_command(path, cmd):
    r = CliRunner().invoke(main, [*path, "--help"])
    assert r.exit_code == 0, r.output
    assert r.stdout.startswith(f"Usage: main {' '.join(path)}") or r.stdout.startswith("Usage: ")
    assert cmd.help and cmd.help.strip(), f"{path}: no docstring"
    for p in cmd.params:
        if isinstance(p, click.Option) and not p.hidden:
            assert p.help, f"{' '.join(path)} {p.opts[0]} has no help text"
            if p.required:
                assert "[required]" in r.stdout  # click shows it
    # one vocabulary: -o is always -o/--output (with --out kept as an alias)
    for p in cmd.params:
        if isinstance(p, click.Option) and ("-o" in p.opts or "--out" in p.opts or "--output" in p.opts):
            assert {"-o", "--output"} <= set(p.opts), f"{path}: {p.opts}"


def test_every_command_is_listed_as_cpu_or_gpu():
    listed = set(CPU_COMMANDS) | {c.split()[0] for c in GPU_COMMANDS}
    top = {p[0] for p, _ in COMMANDS}
    assert top == listed


def test_row_writing_commands_share_the_format_choices():
    for name in ("parse-log", "trace", "diff"):
        fmt = next(p for p in main.commands[name].params if p.name == "fmt")
        assert tuple(fmt.type.choices) == FORMATS, name
    fmt = next(p for p in main.commands["decode"].params if p.name == "fmt")
    assert set(FORMATS) - {"parquet"} <= set(fmt.type.choices)


def test_gemm_sizes_say_they_are_required_without_from():
    r = CliRunner().invoke(main, ["explain", "--help"])
    assert " ".join(r.stdout.split()).count("[required without --from]") == 3


def test_a_broken_command_module_is_reported_loudly():
    code = ("import sys; sys.modules['cublaslt_probe.cli.plots'] = None\n"
            "from cublaslt_probe.cli import main\n"
            "main(['schema'])\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    assert "cublaslt_probe.cli.plots" in p.stderr and "failed to import" in p.stderr
    assert "Traceback" not in p.stderr
    assert p.stdout.startswith("| column | type | meaning |")


def test_shipped_datasets_are_found_after_a_non_editable_install(tmp_path):
    """pyproject installs every shipped dataset to <prefix>/share/cublaslt-probe/data, and the default
    dataset is found there by a package installed under <prefix>/lib/pythonX.Y/site-packages."""
    import shutil

    import tomllib
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())
    files = conf["tool"]["setuptools"]["data-files"]["share/cublaslt-probe/data"]
    assert set(files) == {f"data/{p.name}" for p in (ROOT / "data").glob("*.parquet")} | {"data/PROVENANCE.md"}
    site = tmp_path / "lib" / "python3.11" / "site-packages"
    shutil.copytree(ROOT / "cublaslt_probe", site / "cublaslt_probe",
                    ignore=shutil.ignore_patterns("__pycache__"))
    share = tmp_path / "share" / "cublaslt-probe" / "data"
    share.mkdir(parents=True)
    for f in files:
        shutil.copy(ROOT / f, share)
    code = "from cublaslt_probe.render.plots.select import default_dataset; print(default_dataset())"
    env = {k: v for k, v in __import__("os").environ.items() if k != "CUBLASLT_PROBE_DATA"}
    p = subprocess.run([sys.executable, "-S", "-c", f"import sys; sys.path[:0] = [{str(site)!r}] + "
                        f"{[p for p in sys.path if 'site-packages' in p]!r}; {code}"],
                       capture_output=True, text=True, cwd=tmp_path, env=env)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == str(share / "h200_grid.parquet")
