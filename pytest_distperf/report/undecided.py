"""Undecided verdicts, said as loudly as failures: what was estimated, why it stayed undecided, and the noise.

An INCONCLUSIVE verdict -- a ratio check or a baseline metric whose interval still holds its limit after the
repeats the budget allowed -- passes the test (unless --distperf-strict), so every report must make it
impossible to mistake for a pass: the terminal summary (a yellow line, and `N undecided` in pytest's stats
line), the Markdown job summary and the PR comment all use `undecided_text` below, e.g.

    +62 % estimated, undecided: this machine's run-to-run is 22 % (6 runs; interval [-7.3%, +182.2%] holds the
    +5.0% limit; stopped: max 6 runs)

Reads report records only (gate/checks.Check.to_dict, decide/verdicts.MetricVerdict.to_record); decides nothing.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

STRICT_HINT = "--distperf-strict makes an undecided verdict fail the test"


def is_undecided(record: Mapping[str, Any]) -> bool:
    """An INCONCLUSIVE check or baseline verdict (a 'new' baseline or a changed config is not undecided)."""
    if record.get("kind") == "check":
        return record.get("outcome") == "inconclusive"
    if record.get("kind") == "baseline":
        return record.get("status") == "inconclusive"
    return False


def _pct(x: float) -> str:
    return f"{x:.0%}".replace("%", " %")


def _signed_pct(x: float) -> str:
    return f"{x:+.0%}".replace("%", " %")


def _interval(record: Mapping[str, Any]) -> str:
    """The verdict's interval: a check's ratio ends, a baseline verdict's ends as changes; 'unbounded' where an
    end is missing (too few runs to bound it)."""
    from pytest_distperf.measure.wording import record_bound_text

    return record_bound_text(record)  # the words every report uses where the design cannot bound it


def undecided_text(record: Mapping[str, Any]) -> str:
    """'+62 % estimated, undecided: this machine's run-to-run is 22 % (...)' for a baseline verdict,
    '1.06x estimated against a 1.10x limit, undecided: pair-to-pair variation is 14 % (...)' for a check."""
    interval = _interval(record)
    stopped = record.get("stopped") or ""
    stop = f"; stopped: {stopped}" if stopped and stopped not in ("decided", "fixed runs") else ""
    if record.get("kind") == "check":
        ratio, limit = record.get("ratio"), record.get("threshold")
        head = (f"{ratio:.3g}x estimated against a {limit:.3g}x limit" if ratio is not None and limit is not None
                else "estimate unavailable")
        if record.get("method") == "paired" and record.get("pair_cv") is not None:
            noise = f"this machine's pair-to-pair variation is {_pct(record['pair_cv'])}"
        elif record.get("run_cv_a") is not None:
            noise = f"this machine's run-to-run is {_pct(record['run_cv_a'])}"
        else:
            noise = "too few runs to measure the noise"
        n = f"{record.get('pairs')} pairs; " if record.get("pairs") else ""
        if not interval.startswith("["):  # words: the design could not bound it (wording.bound_text)
            return f"{head}, undecided: {noise} ({interval}{stop})"
        return f"{head}, undecided: {noise} ({n}interval {interval} holds the limit{stop})"
    delta = record.get("delta")
    head = f"{_signed_pct(delta)} estimated" if delta is not None else "change not estimated"
    cv = record.get("current_cv")
    if cv is None:
        cv = record.get("baseline_cv")
    noise = f"this machine's run-to-run is {_pct(cv)}" if cv is not None else "too few runs to measure the noise"
    threshold = record.get("threshold")
    limit = f" the {threshold:+.1%} limit" if threshold is not None else " the limit"
    runs = f"{record.get('current_runs')} runs; " if record.get("current_runs") else ""
    if not interval.startswith("["):  # words: the design could not bound it (wording.bound_text)
        return f"{head}, undecided: {noise} ({interval}{stop})"
    return f"{head}, undecided: {noise} ({runs}interval {interval} holds{limit}{stop})"


def subject(record: Mapping[str, Any]) -> str:
    """What the verdict is about: 'step_time of deepspeed[stage=3] tiny x2 cpu' or a check's name."""
    if record.get("kind") == "check":
        return f"{record.get('name')} ({record.get('a')} vs {record.get('b')})"
    return f"{record.get('metric')} of {record.get('job')}"


def undecided(records_by_test: Iterable[tuple[str, list[dict[str, Any]]]]) -> list[tuple[str, dict[str, Any]]]:
    """(test, record) of every undecided verdict, each shared verdict (same text) once."""
    seen: set[tuple[str, str]] = set()
    out = []
    for nodeid, records in records_by_test:
        for r in records:
            if is_undecided(r):
                key = (subject(r), undecided_text(r))
                if key not in seen:
                    seen.add(key)
                    out.append((nodeid, r))
    return out


def summary_lines(records_by_test: Iterable[tuple[str, list[dict[str, Any]]]], strict: bool = False) -> list[str]:
    """The terminal summary's lines: a count, then each undecided verdict."""
    found = undecided(records_by_test)
    if not found:
        return []
    policy = ("they fail their tests (--distperf-strict)" if strict
              else f"they neither passed nor failed; their tests pass ({STRICT_HINT})")
    lines = [f"distperf: {len(found)} undecided (inconclusive) verdict{'s' if len(found) != 1 else ''}: {policy}"]
    lines += [f"  {nodeid.split('::')[-1]}: {subject(r)}: {undecided_text(r)}" for nodeid, r in found]
    return lines
