"""pytest-distperf: distributed-training performance as a pytest merge gate.

The public API. Importing the package is cheap (no torch); the names below load on first use. The errors and
warnings exported are the bases a user catches or filters; every specific one is in pytest_distperf.errors.
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
    "JobSpec": "pytest_distperf.spec.job",
    "FunctionRef": "pytest_distperf.spec.job",
    "RunResult": "pytest_distperf.rank.results",
    "RankResult": "pytest_distperf.rank.results",
    "Comparison": "pytest_distperf.decide.checks",
    "ProbeAssertions": "pytest_distperf.decide.probe_checks",
    "DistPerfError": "pytest_distperf.errors",
    "DistPerfCheckFailed": "pytest_distperf.errors",
    "DistPerfWarning": "pytest_distperf.errors",
    "DistPerfInconclusive": "pytest_distperf.errors",
    # Your own model, step, script and strategy
    "Workload": "pytest_distperf.spec.workloads",
    "phase": "pytest_distperf.spec.phases",
    "step": "pytest_distperf.rank.script_steps",
    "Strategy": "pytest_distperf.strategies.registry",
}

__all__ = ["__version__", *_PUBLIC]

if TYPE_CHECKING:
    from pytest_distperf.errors import DistPerfCheckFailed, DistPerfError, DistPerfInconclusive, DistPerfWarning
    from pytest_distperf.fixture import DistPerf
    from pytest_distperf.decide.checks import Comparison
    from pytest_distperf.decide.probe_checks import ProbeAssertions
    from pytest_distperf.rank.results import RankResult, RunResult
    from pytest_distperf.rank.script_steps import step
    from pytest_distperf.spec.phases import phase
    from pytest_distperf.spec.job import FunctionRef, JobSpec
    from pytest_distperf.strategies.registry import Strategy
    from pytest_distperf.spec.workloads import Workload


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'pytest_distperf' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value
