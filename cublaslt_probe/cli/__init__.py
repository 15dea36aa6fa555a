"""`cublaslt-probe`: thin click subcommands over the library (a command may call several of its functions:
read, check, analyse, render; the rules stay in the library).

Each subcommand lives in a module of this package that exposes ``COMMANDS`` (a list of click commands);
``_MODULES`` lists them. A module that fails to import is reported loudly on every run (its commands are
missing), never skipped in silence. Errors end as one ``Error: ...`` line that names the input and the fix,
with the exit codes of docs/cli.md (cli/_common.py): library errors (`ProbeError`) and file-system errors
exit 1, an option's value the command cannot take (`OptionError`) exits 2 as click's usage errors do,
a closed pipe downstream ends quietly with 0, and anything unexpected is one line naming the bug
(``-vv`` shows its traceback) instead of a traceback.
"""
from __future__ import annotations

import importlib
import logging
import os
import sys
import traceback

import click

from cublaslt_probe.errors import NoCudaDevice, OptionError, ProbeError
from cublaslt_probe.render.text import set_line_width, terminal_width

_MODULES = ["decode", "logs", "sweep", "gpu", "plots", "evidence", "capture", "audit", "coldstart", "prove", "nvmmh"]
_BROKEN: dict[str, str] = {}  # command module -> why it failed to import


def _one_line(msg: str) -> str:
    return " ".join(part.strip() for part in msg.splitlines() if part.strip())


def _quiet_stdout() -> None:
    """After a closed pipe: point stdout at /dev/null so that the interpreter's last flush is silent."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass


class _Group(click.Group):
    def invoke(self, ctx):
        for name, why in _BROKEN.items():
            click.echo(f"warning: the commands of cublaslt_probe.cli.{name} are missing: it failed to import "
                       f"({why}); reinstall the package (pip install -e .) or fix that module", err=True)
        set_line_width(terminal_width())   # tables to stdout fit the terminal; out_format lifts it for files
        try:
            out = super().invoke(ctx)
            sys.stdout.flush()
            return out
        except NoCudaDevice as e:  # named after the command the user ran, not the library call that found out
            raise click.ClickException(_one_line(e.message(ctx.invoked_subcommand or e.what))) from e
        except OptionError as e:  # an option's value the command cannot take: a usage error (exit 2)
            raise click.UsageError(_one_line(str(e)), ctx) from e
        except ProbeError as e:
            raise click.ClickException(_one_line(str(e))) from e
        except BrokenPipeError:  # `... | head`: the reader took what it wanted
            _quiet_stdout()
            ctx.exit(0)
        except (click.ClickException, click.exceptions.Exit, click.Abort, KeyboardInterrupt):
            raise
        except MemoryError as e:
            raise click.ClickException("out of memory: give the command a smaller input") from e
        except OSError as e:
            what = f"{e.filename}: " if e.filename else ""
            raise click.ClickException(_one_line(f"{what}{e.strerror or e}")) from e
        except Exception as e:  # the last line of defence: one line, not a traceback
            logging.getLogger("cublaslt_probe").debug("%s", traceback.format_exc())
            sub = ctx.invoked_subcommand or "cublaslt-probe"
            raise click.ClickException(_one_line(
                f"internal error in `{sub}`: {type(e).__name__}: {e} (a bug: please report it with the "
                f"command line; -vv shows the traceback)")) from e


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="cublaslt-probe")
@click.option("-v", "--verbose", count=True, help="More log output on stderr (-v info, -vv debug).")
def main(verbose: int) -> None:
    """Which cuBLAS/cuBLASLt kernel runs for a GEMM, why, and what choosing it cost.

    Exit status: 0 all good; 1 nothing usable (an Error line says why); 2 usage error; 3 partial: the
    output holds every good record but some input could not be used (stderr says which).
    """
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")


for _name in _MODULES:
    try:
        _mod = importlib.import_module(f"cublaslt_probe.cli.{_name}")
        _cmds = list(_mod.COMMANDS)
    except Exception as _e:  # noqa: BLE001 - reported on every run by _Group.invoke
        _BROKEN[_name] = _one_line(f"{type(_e).__name__}: {_e}")
        continue
    for _cmd in _cmds:
        main.add_command(_cmd)
