"""Tests the session budget stopped before their first look was done: "N out of budget" in every report.

They were not measured, so no report may read them as a pass: each report counts them and lists each with its
reason (session.check_budget and fixture._within_budget say why).
"""

from __future__ import annotations

from typing import Iterable

from pytest_distperf.figures.wording import short_test
from pytest_distperf.report.document import TestDocument

STAT = "out of budget"  # pytest's stats line: '3 passed, 2 skipped, 2 out of budget'
WHAT = "not decided: the session budget ran out before their first look was done (--distperf-session-budget)"


def out_of_budget(tests: Iterable[TestDocument]) -> list[TestDocument]:
    """The tests the session budget stopped before their first look was done, in the order they ended."""
    return [t for t in tests if t.out_of_budget]


def count_text(n: int) -> str:
    return f"{n} {STAT}"


def summary_lines(tests: Iterable[TestDocument], strict: bool = False) -> list[str]:
    """The terminal's lines: a count, then each test with its reason."""
    found = out_of_budget(tests)
    if not found:
        return []
    policy = "they fail (--distperf-strict)" if strict else "skipped, no verdict"
    return ([f"distperf: {count_text(len(found))}: {WHAT}; {policy}"]
            + [f"  {short_test(t.nodeid)}: {t.out_of_budget}" for t in found])


def markdown_lines(tests: Iterable[TestDocument]) -> list[str]:
    """The Markdown job summary's and the PR comment's list: a heading line, then one item a test."""
    found = out_of_budget(tests)
    if not found:
        return []
    clean = lambda text: " ".join(str(text).split())  # noqa: E731  one line an item
    return ([f"**⏱ {count_text(len(found))}** ({WHAT}):"]
            + [f"- `{clean(short_test(t.nodeid))}`: {clean(t.out_of_budget)}" for t in found])
