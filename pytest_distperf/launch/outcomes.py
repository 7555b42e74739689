"""Turn launcher errors into pytest outcomes: the one place the launcher meets pytest."""

from __future__ import annotations

import contextlib
from typing import Iterator, NoReturn

import pytest

from pytest_distperf.errors import SessionBudgetSpent
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


def out_of_budget(error: SessionBudgetSpent, strict: bool) -> NoReturn:
    """A test the session budget stopped before its first look was done (not started, or cut short after some of
    its runs: `error.cut_short`, fixture._first_look): skipped with the budget's words, or with --distperf-strict
    failed (as an undecided verdict fails under it: an unmeasured test is no pass either)."""
    if strict:
        what = "cut short in its first look" if error.cut_short else "left unstarted"
        raise pytest.fail.Exception(f"{error}\n  (--distperf-strict: a test the session budget {what} fails)",
                                    pytrace=False) from None
    raise pytest.skip.Exception(str(error), _use_item_location=True) from None  # shown at the test, not here
