"""`cublaslt-probe`: thin click subcommands, each calling one library function.

Each subcommand lives in a module of this package that exposes ``COMMANDS`` (a list of click commands);
``_MODULES`` lists them. Library errors (`ProbeError`) become one clean ``Error: ...`` line and exit 1.
"""
from __future__ import annotations

import importlib
import logging
import sys

import click

from cublaslt_probe.errors import ProbeError

_MODULES = ["decode", "logs", "sweep", "gpu", "plots", "evidence", "capture"]


class _Group(click.Group):
    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except ProbeError as e:
            raise click.ClickException(str(e)) from e


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="cublaslt-probe")
@click.option("-v", "--verbose", count=True, help="More log output on stderr (-v info, -vv debug).")
def main(verbose: int) -> None:
    """Which cuBLAS/cuBLASLt kernel runs for a GEMM, why, and what choosing it cost."""
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")


for _name in _MODULES:
    try:
        _mod = importlib.import_module(f"cublaslt_probe.cli.{_name}")
    except ModuleNotFoundError as _e:  # a command module not written yet
        if _e.name != f"cublaslt_probe.cli.{_name}":
            raise
        continue
    for _cmd in _mod.COMMANDS:
        main.add_command(_cmd)
