"""Probes: what a few extra, profiled steps after the timing phase tell about *why* a step is slow.

- ``comms``: every collective per step and per kind (count, bytes, message sizes); gloo and NCCL.
- ``overlap``: share of NCCL kernel time hidden under compute kernels, exposed comm time (CUDA).
- ``placement``: host/device copies (CUDA), the optimizer's ``step()`` split into CPU time and
  GPU kernels, where the optimizer state lives, and process CPU utilisation during the step.

The probe phase runs after the timing phase, under ``torch.profiler`` (``runner.py``), so probes never change
the reported step time. The probe names are a setting (spec/probes.py). No torch here: the pytest process
imports the probes' results (results.py) through this package.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    # `from pytest_distperf.rank import probes; probes.Recorder(...)` inside a rank, without making
    # the pytest process import torch through this package.
    if name == "Recorder":
        from pytest_distperf.rank.probes.recorder import Recorder

        return Recorder
    raise AttributeError(name)
