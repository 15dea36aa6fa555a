"""`cublaslt_probe.cold_start_step()`: marks one step of a script that `cublaslt-probe cold-start` runs.

    import cublaslt_probe
    for batch in batches:
        with cublaslt_probe.cold_start_step():
            train_step(batch)

Outside a cold-start child it does nothing. Inside one, the child (`coldstart_child.main`) makes its `Session`
the active one (`active`) for the time the script runs, and each marked step opens and closes a step window of it.
This module imports neither torch nor the child, so a script imports it on any machine.
"""
from __future__ import annotations

import contextlib
from typing import Iterator, Protocol

from cublaslt_probe.errors import error_text


class StepSession(Protocol):
    """What a marked step needs of the child's session (`coldstart_child.Session`)."""

    def start_step(self) -> None: ...

    def end_marked(self, error: str | None = None) -> None: ...


_ACTIVE: StepSession | None = None


@contextlib.contextmanager
def active(session: StepSession) -> Iterator[StepSession]:
    """Make `session` the one marked steps report to, until the block ends."""
    global _ACTIVE
    _ACTIVE = session
    try:
        yield session
    finally:
        _ACTIVE = None


@contextlib.contextmanager
def cold_start_step() -> Iterator[None]:
    """Mark one step of a script run under `cublaslt-probe cold-start` (a no-op otherwise)."""
    session = _ACTIVE
    if session is None:
        yield
        return
    session.start_step()
    try:
        yield
    except BaseException as e:
        session.end_marked(error=error_text(e))
        raise
    session.end_marked()
