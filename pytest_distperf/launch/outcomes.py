"""Turn launcher errors into pytest outcomes: the one place the launcher meets pytest."""

from __future__ import annotations

import contextlib
from typing import Iterator

import pytest

from pytest_distperf.launch.launcher import JobError, RankOutcome

# What as_pytest_outcome raises: a caller that runs a job whose failure is not the test's catches these.
PYTEST_OUTCOMES = (pytest.fail.Exception, pytest.skip.Exception, pytest.xfail.Exception)


@contextlib.contextmanager
def as_pytest_outcome() -> Iterator[None]:
    """The test's outcome for a launcher error, reported once: raised outside the `except` and `from None`, so
    pytest shows no "During handling of the above exception" chain repeating the same message."""
    try:
        yield
        return
    except RankOutcome as e:
        text = f"rank {e.rank}: {e.reason}"
        outcome: BaseException = pytest.xfail.Exception(text) if e.outcome == "xfailed" else pytest.skip.Exception(text)
    except JobError as e:
        outcome = pytest.fail.Exception(str(e), pytrace=False)
    raise outcome from None
