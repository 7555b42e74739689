"""The outcomes a report shows, their order and their marks: a CSS class and a symbol per outcome, so a verdict
reads in greyscale and for colour-blind readers too."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Iterable

if TYPE_CHECKING:
    from pytest_distperf.report.document import TestDocument

OUTCOME_STYLE: dict[str, tuple[str, str]] = {  # outcome -> (css class, symbol), most urgent first
    "fail": ("v-fail", "✗"),
    "error": ("v-fail", "✗"),
    "xpass": ("v-fail", "!"),
    "inconclusive": ("v-inconclusive", "?"),
    "warn": ("v-inconclusive", "~"),
    "improved": ("v-improved", "★"),
    "xfail": ("v-xfail", "⊘"),
    "pass": ("v-pass", "✓"),
    "new": ("v-neutral", "○"),
    "not comparable": ("v-neutral", "≠"),
    "skipped": ("v-neutral", "–"),
}
UNKNOWN_STYLE = ("v-neutral", "·")
# The same outcomes in words, for the text reports (terminal, Markdown): a check's, then a baseline verdict's.
OUTCOME_MARK = {"pass": "✓ pass", "fail": "✗ FAIL", "inconclusive": "~ inconclusive"}
STATUS_MARK = {"pass": "✓", "inconclusive": "~ inconclusive", "fail": "✗", "improved": "✓ improved", "new": "new",
               "not comparable": "≠ config"}
LEGEND = ("pass", "fail", "inconclusive", "xfail", "improved", "new")  # the outcomes the page's legend explains
_TEST_OUTCOMES = {"passed": "pass", "failed": "fail", "skipped": "skipped", "error": "error"}  # pytest's words
LIMIT_SIGN = {"at_most": "≤", "at_least": "≥", "above": ">"}  # a check's direction as the sign of its limit


def status_mark(status: str, fails: bool = False) -> str:
    """✓ ~ ✗ new ... of a baseline verdict's status; a verdict that fails the test always shows ✗."""
    mark = STATUS_MARK.get(status, status)
    if fails and not mark.startswith("✗"):
        mark = "✗ " + mark.replace("✓ ", "")
    return mark


def style(outcome: str) -> tuple[str, str]:
    """(css class, symbol) of an outcome."""
    return OUTCOME_STYLE.get(outcome, UNKNOWN_STYLE)


def mark(outcome: str) -> str:
    return style(outcome)[1]


def rank(outcome: str) -> int:
    """Order of outcomes when listed or counted: what needs a look first."""
    return list(OUTCOME_STYLE).index(outcome) if outcome in OUTCOME_STYLE else len(OUTCOME_STYLE)


def counted(outcomes: Iterable[str]) -> list[tuple[str, int]]:
    """(outcome, how many), most urgent first."""
    return sorted(Counter(outcomes).items(), key=lambda item: rank(item[0]))


def test_outcome(test: "TestDocument") -> str:
    """pass / fail / xfail / xpass / skipped / error of one test (pytest's outcome, its xfail reason)."""
    if test.xfail_reason is not None:
        return "xpass" if test.outcome == "passed" else "xfail"
    return _TEST_OUTCOMES.get(test.outcome, test.outcome)


def record_outcome(outcome: str, xfailed: bool = False) -> str:
    """A check's outcome or a baseline verdict's status as the reports show it: a failing one of a declared
    known gap (strict xfail) reads xfail."""
    return "xfail" if xfailed and outcome == "fail" else outcome
