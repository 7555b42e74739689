"""Probes: what a few extra, profiled steps after the timing phase tell about *why* a step is slow.

- ``comms``: every collective per step and per kind (count, bytes, message sizes); gloo and NCCL.
- ``overlap``: share of NCCL kernel time hidden under compute kernels, exposed comm time (CUDA).
- ``placement``: host/device copies (CUDA), the optimizer's ``step()`` split into CPU time and
  GPU kernels, where the optimizer state lives, and process CPU utilisation during the step.

The probe phase runs after the timing phase, under ``torch.profiler``, so probes never change
the reported step time (see ``runner.py``). This module stays free of torch: the pytest process
imports it to validate probe names.
"""

from __future__ import annotations

from typing import Any, Iterable

from pytest_distperf.errors import ProbeError

PROBES = ("comms", "overlap", "placement")
STEP_MARK = "distperf:step"  # the record_function range around each profiled step


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


def __getattr__(name: str) -> Any:
    # `from pytest_distperf import probes; probes.Recorder(...)` inside a rank, without making
    # the pytest process import torch through this package.
    if name == "Recorder":
        from pytest_distperf.rank.probes.recorder import Recorder

        return Recorder
    raise AttributeError(name)
