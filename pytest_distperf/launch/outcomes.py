"""Turn launcher errors into pytest outcomes: the one place the launcher meets pytest."""

from __future__ import annotations

import contextlib
from typing import Iterator

import pytest

from pytest_distperf.launch.launcher import JobError, RankOutcome


@contextlib.contextmanager
def as_pytest_outcome() -> Iterator[None]:
    try:
        yield
    except RankOutcome as e:
        if e.outcome == "xfailed":
            pytest.xfail(f"rank {e.rank}: {e.reason}")
        pytest.skip(f"rank {e.rank}: {e.reason}")
    except JobError as e:
        pytest.fail(str(e), pytrace=False)
