"""Small helpers shared by the command modules."""
from __future__ import annotations

import os

from cublaslt_probe.errors import ProbeError


def check_writable(output: str | None) -> None:
    """Fail before reading a large input, not after, when the output cannot be written."""
    if not output or output == "-":
        return
    parent = os.path.dirname(os.path.abspath(output))
    if not os.path.isdir(parent):
        raise ProbeError(f"cannot write {output}: no such directory {parent}")
    if not os.access(parent, os.W_OK):
        raise ProbeError(f"cannot write {output}: permission denied")
