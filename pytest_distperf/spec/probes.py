"""The probes a job may ask for, validated in the pytest process before any rank starts (rank/probes measures them).
"""

from __future__ import annotations

from typing import Iterable

from pytest_distperf.errors import ProbeError

PROBES = ("comms", "overlap", "placement")


def validate(names: Iterable[str] | str | None, where: str = "probes") -> tuple[str, ...]:
    """Return the probe names as a sorted tuple, or raise ProbeError naming the culprit."""
    if names is None:
        return ()
    if isinstance(names, str):
        names = (names,)
    try:
        names = tuple(names)
    except TypeError:
        raise ProbeError(f"{where}: expected a list of probe names, got {names!r}") from None
    unknown = sorted(n for n in names if n not in PROBES)
    if unknown:
        raise ProbeError(f"{where}: unknown probe(s) {', '.join(map(repr, unknown))}; "
                         f"known probes: {', '.join(PROBES)}")
    return tuple(sorted(set(names)))
