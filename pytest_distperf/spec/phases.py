"""Phases a user marks inside their own step, for the step breakdown: `with phase("forward"): ...`.

Outside the breakdown phase (a few extra steps after timing, rank/breakdown.py) `phase()` costs one global read, so
the timed steps carry no synchronisation. During it each marked phase is bracketed by a device synchronisation and
its time added to that name; unmarked time is "other". Import-light (no torch): user modules import it at top level.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from pytest_distperf.errors import PhaseError

# The PhaseClock of the breakdown step in progress, or None. Not a thread-local: a framework's loop may run the
# user's code on another thread than the measurement (Lightning's fit).
_clock: Any = None
_open: str | None = None


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    global _open
    clock = _clock
    if clock is None:
        yield
        return
    if _open is not None:
        raise PhaseError(f"distperf phase {name!r} started inside phase {_open!r}: phases cannot nest")
    clock.skip()  # the time since the last phase ended is "other"
    _open = name
    try:
        yield
    finally:
        _open = None
        clock.lap(name)


@contextlib.contextmanager
def recording(clock: Any) -> Iterator[None]:
    """Inside the ranks: route the marked phases of the steps run in this block to `clock`."""
    global _clock, _open
    _clock, _open = clock, None
    try:
        yield
    finally:
        _clock, _open = None, None
