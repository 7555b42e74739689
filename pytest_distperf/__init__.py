"""pytest-distperf: distributed-training performance as a pytest merge gate.

The public API. Importing the package is cheap (no torch); the names below load on first use.
"""

from __future__ import annotations

from importlib import import_module
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

try:
    __version__ = version("pytest-distperf")
except PackageNotFoundError:  # a source tree on sys.path without an install
    __version__ = "0.0.0+unknown"

_PUBLIC = {
    "DistPerf": "pytest_distperf.fixture",
    "JobSpec": "pytest_distperf.spec",
    "FunctionRef": "pytest_distperf.spec",
    "RunResult": "pytest_distperf.results",
    "RankResult": "pytest_distperf.results",
    "Comparison": "pytest_distperf.gate.checks",
    "ProbeAssertions": "pytest_distperf.gate.probe_checks",
    "DistPerfError": "pytest_distperf.errors",
    "UsageError": "pytest_distperf.errors",
    "SettingsError": "pytest_distperf.errors",
    "StrategyError": "pytest_distperf.errors",
    "ProbeError": "pytest_distperf.errors",
    "FileError": "pytest_distperf.errors",
    "BaselineError": "pytest_distperf.errors",
    "JobError": "pytest_distperf.errors",
    "JobTimeout": "pytest_distperf.errors",
    "DistPerfCheckFailed": "pytest_distperf.errors",
    "DistPerfWarning": "pytest_distperf.errors",
    "HostBusyWarning": "pytest_distperf.errors",
    "BaselineEnvironmentWarning": "pytest_distperf.errors",
    "DistPerfInconclusive": "pytest_distperf.errors",
    "GpuClockWarning": "pytest_distperf.errors",
    # Your own model, step and strategy
    "Workload": "pytest_distperf.workloads",
    "phase": "pytest_distperf.phases",
    "Strategy": "pytest_distperf.strategies.registry",
    "WorkloadError": "pytest_distperf.errors",
    "PhaseError": "pytest_distperf.errors",
}

__all__ = ["__version__", *_PUBLIC]

if TYPE_CHECKING:
    from pytest_distperf.errors import (BaselineEnvironmentWarning, BaselineError, DistPerfCheckFailed,
                                        DistPerfError, DistPerfInconclusive, DistPerfWarning, FileError,
                                        HostBusyWarning, JobError, JobTimeout, PhaseError, ProbeError, SettingsError,
                                        StrategyError, UsageError, WorkloadError)
    from pytest_distperf.fixture import DistPerf
    from pytest_distperf.gate.checks import Comparison
    from pytest_distperf.gate.probe_checks import ProbeAssertions
    from pytest_distperf.results import RankResult, RunResult
    from pytest_distperf.phases import phase
    from pytest_distperf.spec import FunctionRef, JobSpec
    from pytest_distperf.strategies.registry import Strategy
    from pytest_distperf.workloads import Workload


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'pytest_distperf' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value
