"""How a verdict record reads in every report: its mark (✓ ~ ✗ new ≠ config) and its interval."""

from __future__ import annotations

from typing import Any

STATUS_MARK = {"pass": "✓", "inconclusive": "~ inconclusive", "fail": "✗", "improved": "✓ improved", "new": "new",
               "not comparable": "≠ config"}


def status_mark(record: dict[str, Any]) -> str:
    """✓ ~ ✗ new ... of a verdict record; a verdict that fails the test always shows ✗."""
    mark = STATUS_MARK.get(record["status"], record["status"])
    if record.get("fails") and not mark.startswith("✗"):
        mark = "✗ " + mark.replace("✓ ", "")
    return mark


def fmt_interval(record: dict[str, Any]) -> str:
    """'[+7.9%, +11.7%]' of a verdict record's delta; unbounded ends read -100% / +inf; '-' when exact or none."""
    low, high = record.get("low"), record.get("high")
    if record.get("metric_kind") == "count" or (low is None and high is None and record.get("level") is None):
        return "-"
    lo = "-100%" if low is None else f"{low:+.1%}"
    hi = "+inf" if high is None else f"{high:+.1%}"
    return f"[{lo}, {hi}]"


def pair_to_pair(record: dict[str, Any]) -> str:
    """A check record's pair-to-pair variation (sd of the pairs' log ratios) as a percent; '-' when the check
    was not paired or had too few pairs to have one."""
    cv = record.get("pair_cv")
    return "-" if record.get("method") != "paired" or cv is None else f"{cv:.1%}"
