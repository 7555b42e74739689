"""Every error and warning distperf raises, under one base each, so a user can catch them all (the bases are
also exported by pytest_distperf).

Import-light on purpose: plugin.py and the user's conftest can import it without torch.
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from typing import Any


class DistPerfError(Exception):
    """Base of every distperf error."""


class UsageError(DistPerfError, ValueError):
    """A bad option, ini, marker or argument value; the message names where it came from."""


class SettingsError(UsageError):
    """A bad command-line option, ini or marker value."""


class StrategyError(UsageError):
    """An unknown strategy, option or option value, or an adapter that does not fit the protocol."""


class ProbeError(UsageError):
    """An unknown probe name, or a probe result that cannot be read."""


class WorkloadError(UsageError):
    """A workload or step factory, or what it returned, cannot be used; the message names the factory."""


class PhaseError(UsageError):
    """Phases marked with pytest_distperf.phase() nested in one another."""


class FileError(DistPerfError):
    """A file or folder distperf reads or writes that cannot be used; the message names it."""


class BaselineError(FileError):
    """A baseline file or folder that cannot be used; the message names it and what to do."""


class UnsafeFolderError(FileError):
    """A lock, state or shared folder another user could write to (or not a plain folder); the message names
    it, its owner and mode, and what to do."""


class LockWaitTimeout(DistPerfError):
    """A wait for a device lock ran past its limit; the message names the lock's holder (pid and command)."""


class SessionBudgetSpent(DistPerfError):
    """--distperf-session-budget ran out before a job (or a DeepSpeed op build) could start; the message names the
    budget and what was not started. A test whose first look it stops is skipped (fails with --distperf-strict);
    adaptive repeats it stops leave their verdict as the last planned look had it. `cut_short`: the first look had
    run some of its runs (kept in the reports)."""

    def __init__(self, message: str, cut_short: bool = False):
        super().__init__(message)
        self.cut_short = cut_short


class JobError(DistPerfError):
    """A job did not produce a value for every rank."""

    def __init__(self, message: str, job_dir: str | None = None):
        super().__init__(message)
        self.job_dir = job_dir


class JobTimeout(JobError):
    """A job ran past its wall-clock limit; the message holds each rank's stacks."""


class DistPerfCheckFailed(DistPerfError, AssertionError):
    """A check between strategies (or against a probe) decided FAIL. Only this satisfies a known-gap xfail."""

    def __init__(self, message: str, check: Any):
        super().__init__(message)
        self.check = check


class DistPerfWarning(UserWarning):
    """Base of every distperf warning."""


class ProfilerAbortWarning(DistPerfWarning):
    """A rank died inside torch.profiler's stop in distperf's own profiled phase; the run was measured again."""


class HostBusyWarning(DistPerfWarning):
    """The machine was busy with other work while a job was timed."""


class GpuClockWarning(DistPerfWarning):
    """A timed window ran on throttled GPU clocks, on clocks that were not locked, or could not be read."""


class BaselineEnvironmentWarning(DistPerfWarning):
    """Library/driver versions differ from those the baseline was recorded with."""


class BaselineUnmatchedWarning(DistPerfWarning):
    """A test has no baseline file, but its machine-class folder holds others (a renamed or moved test?)."""


class BaselineNoisyWarning(DistPerfWarning):
    """A baseline just saved is spread too widely for an unchanged job ever to pass its limit against it."""


class BaselineReplacedWarning(DistPerfWarning):
    """--distperf-save moved an unusable baseline aside (`<name>.corrupt-<UTC time>`) and wrote a new one."""


class DistPerfInconclusive(DistPerfWarning):
    """A verdict's interval straddles its limit after the repeats allowed; `--distperf-strict` fails it instead."""


_OWN_FRAMES = (os.path.dirname(os.path.abspath(__file__)) + os.sep, contextlib.__file__)


def warn(warning: DistPerfWarning) -> None:
    """Warn at the first caller outside distperf (the test, or the user's helper that called the fixture), however
    deep distperf's own calls run: the line a reader can act on."""
    frame, level = sys._getframe(0), 1
    while frame is not None and frame.f_code.co_filename.startswith(_OWN_FRAMES):
        frame, level = frame.f_back, level + 1
    warnings.warn(warning, stacklevel=level)
