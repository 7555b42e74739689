"""The baseline gate's policy: the limits a test gates on, from the session's options and the test's marker."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Any

from pytest_distperf.errors import SettingsError
from pytest_distperf.figures.quantities import KNOWN_METRICS, memory_metric


@dataclass(frozen=True)
class Policy:
    time_threshold: float = 0.05  # the smallest slowdown worth failing for: the interval must clear 1 + this
    # The work figures' times do not move with the host: a floor of wall time's size would leave +3 % unfailable.
    work_threshold: float = 0.01
    memory_threshold: float = 0.02
    memory_floor: int = 64 << 20  # bytes
    fail_on_improvement: bool = False
    require_baseline: bool = False
    strict: bool = False
    explain: bool = False
    metrics: tuple[str, ...] | None = None  # gated metrics; None: all

    def gates(self, metric: str, device: str | None = None) -> bool:
        """Whether the gate decides this metric; "peak_memory" in `metrics` stands for the device's memory figure."""
        if self.metrics is None or metric in self.metrics:
            return True
        return device is not None and metric == memory_metric(device) and "peak_memory" in self.metrics


def policy_for(base: Policy, marker_kwargs: dict[str, Any], where: str) -> Policy:
    """`base` with the test's @pytest.mark.distperf(...) overrides; SettingsError naming the marker key."""

    def number(key: str, low: float, high: float) -> float:
        value = marker_kwargs[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
            raise SettingsError(f"{where}: distperf({key}={value!r}): expected a number in [{low:g}, {high:g}]")
        return float(value)

    changes: dict[str, Any] = {key: kind(number(key, 0.0, high)) for key, high, kind in (
        ("time_threshold", 10.0, float), ("work_threshold", 10.0, float), ("memory_threshold", 10.0, float),
        ("memory_floor", float(1 << 50), int)) if key in marker_kwargs}
    if "baseline_metrics" in marker_kwargs:
        names = marker_kwargs["baseline_metrics"]
        if isinstance(names, str) or not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
            raise SettingsError(f"{where}: distperf(baseline_metrics={names!r}): expected a list of metric names "
                                f"(() gates none)")
        unknown = [n for n in names if n not in KNOWN_METRICS and not n.startswith("comms.")]
        if unknown:
            raise SettingsError(f"{where}: distperf(baseline_metrics=...): unknown metric(s) {unknown}; known: "
                                f"{', '.join(KNOWN_METRICS)} and comms.<kind>.calls_per_step / .bytes_per_step")
        changes["metrics"] = tuple(names)
    return replace(base, **changes)


@dataclass(frozen=True)
class GateSettings:
    baselines_dir: str
    save: bool
    policy: Policy
    accept_args: tuple[str, ...] = ()  # options repeated in the "accept this change" command
    project_root: str | None = None  # what test keys are relative to; None: the baselines folder's parent


def gate_settings(rootdir: str, baselines_cli: str | None, baselines_ini: str | None, save: bool,
                  require_baseline: bool, fail_on_improvement: bool, carried: dict[str, Any],
                  strict: bool = False, rootdir_fixed: bool = False, explain: bool = False) -> GateSettings:
    """`carried`: the options that pick the machine class or the jobs (repeated in the accept command).
    `rootdir_fixed`: an ini file or --rootdir fixed `rootdir`, so test keys are relative to it; otherwise to the
    baselines folder's parent."""
    if baselines_cli not in (None, ""):
        raw, where, base = baselines_cli, "--distperf-baselines", os.getcwd()
    elif baselines_ini not in (None, ""):
        raw, where, base = baselines_ini, "ini option distperf_baselines", rootdir
    else:
        raw, where, base = "baselines", "default baselines folder", rootdir
    path = os.path.normpath(os.path.join(base, os.path.expanduser(str(raw))))
    if os.path.exists(path) and not os.path.isdir(path):
        raise SettingsError(f"{where}: {path} exists and is not a folder")
    given = {"--distperf-baselines": baselines_cli, **carried}
    args = [arg for flag, value in given.items() if value not in (None, "") for arg in (flag, str(value))]
    return GateSettings(baselines_dir=path, save=save,
                        policy=Policy(fail_on_improvement=fail_on_improvement, require_baseline=require_baseline,
                                      strict=strict, explain=explain),
                        accept_args=tuple(args), project_root=rootdir if rootdir_fixed else None)
