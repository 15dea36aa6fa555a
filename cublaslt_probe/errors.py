"""The project's small error hierarchy. Messages name the input and the fix."""


class ProbeError(Exception):
    """Base class: every error the CLI turns into a clean `Error: ...` line."""


class NoCudaDevice(ProbeError):
    """A GPU-only operation was asked for on a machine without a usable CUDA device."""

    def __init__(self, what: str, detail: str = ""):
        msg = (f"no CUDA device: `{what}` needs an NVIDIA GPU with torch or cupy"
               + (f" ({detail})" if detail else "")
               + "; `decode`, `grammars`, `parse-log`, `map`, `report` and `diff` work without one")
        super().__init__(msg)


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
