"""How a record reads in every report: a verdict's mark (✓ ~ ✗ new ≠ config), its interval (bound_text), a test's
short name (short_test).

A leaf module: the decision core (decide/decision.py) uses bound_text for its own texts."""

from __future__ import annotations

from typing import Any, Mapping

STATUS_MARK = {"pass": "✓", "inconclusive": "~ inconclusive", "fail": "✗", "improved": "✓ improved", "new": "new",
               "not comparable": "≠ config"}


def short_test(nodeid: str) -> str:
    """A test as the tables name it: its node id without the file ('TestX::test_y[p]', 'test_y')."""
    return nodeid.split("::", 1)[-1]


def status_mark(record: dict[str, Any]) -> str:
    """✓ ~ ✗ new ... of a verdict record; a verdict that fails the test always shows ✗."""
    mark = STATUS_MARK.get(record["status"], record["status"])
    if record.get("fails") and not mark.startswith("✗"):
        mark = "✗ " + mark.replace("✓ ", "")
    return mark


WIDE = 10.0  # an interval end beyond 10x (or below 1/10 of) its estimate bounds nothing a reader can use


def _end(x: float | None, digits: int) -> str:
    return "inf" if x is None else (f"{x:.{digits}f}" if x < 1000 else f"{x:.2g}")


def bound_text(ratio: float, low: float | None, high: float | None, n: int, unit: str = "pairs",
               spread: float | None = None, spread_name: str = "pair-to-pair", next_look: int | None = None,
               delta: bool = False, digits: int = 3, decided: bool = False) -> str:
    """The one text of an interval in every report: '[0.970, 1.160]' (ratio) or '[+7.9%, +11.7%]' (delta: the
    ends as changes), or -- where an end is unbounded, or beyond 10x or below 1/10 of the estimate -- words:
    '3 pairs at 31.0% pair-to-pair: too few to bound; next look at 6' (next_look 0: the design's last look,
    'too noisy to bound at the last look'; None: not said). low/high: ratio ends (None: unbounded). A decided
    verdict's wide interval keeps its numbers (the end that decided it is the one that matters), marked wide."""
    wide = (low is None or high is None or not ratio > 0 or low <= 0
            or high > WIDE * ratio or low < ratio / WIDE)
    if delta:
        numbers = f"[{'-100%' if low is None else f'{low - 1:+.1%}'}, {'+inf' if high is None else f'{high - 1:+.1%}'}]"
    else:
        numbers = f"[{'0' if low is None else _end(low, digits)}, {_end(high, digits)}]"
    if not wide:
        return numbers
    what = f"{n} {unit if n != 1 else unit.rstrip('s')}"
    if spread is not None and n >= 2:
        what += f" at {spread:.1%} {spread_name}"
    if decided:
        return f"{numbers} (wide: {what})"
    if next_look == 0:
        return f"{what}: too noisy to bound at the last look"
    return f"{what}: too few to bound" + (f"; next look at {next_look}" if next_look else "")


def record_bound_text(record: Mapping[str, Any], digits: int = 3) -> str:
    """bound_text of a report record: a check's ratio (gate/checks.Check: ratio, low, high, pairs, method) or a
    baseline verdict's change (decide/verdicts.MetricVerdict: delta, low, high as changes, current_runs);
    '-' when exact or without an interval."""
    if "pairs" in record and "ratio" in record:  # a check
        method = record.get("method")
        if method not in ("paired", "unpaired"):
            return "-"
        paired = method == "paired"
        return bound_text(record["ratio"], record.get("low"), record.get("high"), int(record.get("pairs") or 0),
                          "pairs" if paired else "runs", record.get("pair_cv") if paired else record.get("run_cv_a"),
                          "pair-to-pair" if paired else "run-to-run", record.get("next_look"), digits=digits,
                          decided=record.get("outcome") in ("pass", "fail"))
    low, high = record.get("low"), record.get("high")
    if record.get("metric_kind") == "count" or (low is None and high is None and record.get("level") is None):
        return "-"
    delta = record.get("delta")
    return bound_text(1.0 + (delta or 0.0), None if low is None else 1.0 + low, None if high is None else 1.0 + high,
                      int(record.get("current_runs") or 0), "runs", record.get("current_cv"), "run-to-run",
                      record.get("next_look"), delta=True, decided=record.get("status") in ("pass", "fail", "improved"))


def is_words(text: str) -> bool:
    """Whether an interval text is words (bound_text could not bound it), not numbers."""
    return not text.startswith("[")


def fmt_interval(record: Mapping[str, Any]) -> str:
    """A verdict record's interval as every report shows it (record_bound_text)."""
    return record_bound_text(record)


def pair_to_pair(record: dict[str, Any]) -> str:
    """A check record's pair-to-pair variation (sd of the pairs' log ratios) as a percent; '-' when the check
    was not paired or had too few pairs to have one."""
    cv = record.get("pair_cv")
    return "-" if record.get("method") != "paired" or cv is None else f"{cv:.1%}"
