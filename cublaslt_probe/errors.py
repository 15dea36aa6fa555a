"""The project's small error hierarchy. Messages name the input and the fix."""


class ProbeError(Exception):
    """Base class: every error the CLI turns into a clean `Error: ...` line."""


# The commands that run on any machine (tests/test_cli_help.py checks that every command is in one list).
CPU_COMMANDS = ("decode", "grammars", "parse-log", "trace", "dataset", "merge", "schema", "map", "plot",
                "report", "diff", "audit", "nvmmh")
# The commands that need a GPU; those marked `--from` also render a saved file on any machine.
GPU_COMMANDS = ("sweep", "capture", "prove", "cold-start --from", "candidates --from", "first-call --from",
                "explain --from", "replay --from")


class NoCudaDevice(ProbeError):
    """A GPU-only operation was asked for on a machine without a usable CUDA device."""

    def __init__(self, what: str, detail: str = ""):
        self.what, self.detail = what, detail
        super().__init__(self.message(what))

    def message(self, what: str) -> str:
        """The message with `what` (the command being run, which the CLI knows best) as the asker."""
        saved = [c.split()[0] for c in GPU_COMMANDS if c.endswith("--from")]
        hint = (f"; render a saved file with `{what} --from FILE` on any machine" if what in saved else "")
        return (f"no CUDA device: `{what}` needs an NVIDIA GPU with torch or cupy"
                + (f" ({self.detail})" if self.detail else "") + hint
                + f"; {', '.join(CPU_COMMANDS)} work without one")


class CaptureError(ProbeError):
    """Capturing a log, a kernel name or a timing failed."""


class UnknownKernelName(ProbeError):
    """`decode(name, strict=True)` met a name no grammar understands fully."""


class SchemaError(ProbeError):
    """A dataset does not have the columns or types the schema requires."""


class SpecError(ProbeError):
    """A sweep spec (preset or file) is invalid."""


class OptionError(ProbeError, ValueError):
    """An option of the probe (or another component) has a value it cannot take."""


ERROR_CHARS = 300   # what a record keeps of an error: its type and first few lines, not a whole traceback


def error_text(e: BaseException) -> str:
    """An exception as a record (a row's ``error``, a run's, a variant's) keeps it: ``Type: message``, stripped and cut
    at `ERROR_CHARS` characters, so one long message (a cuBLAS status dump, a compiler log) cannot swell a file."""
    return f"{type(e).__name__}: {e}".strip()[:ERROR_CHARS]
