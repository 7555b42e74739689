"""Undecided verdicts, said as loudly as failures: what was estimated, why it stayed undecided, and the noise.

An inconclusive verdict passes its test (unless --distperf-strict), so every text report words it with
`undecided_text`, which keeps it from being mistaken for a pass.
"""

from __future__ import annotations

from typing import Iterable, Union

from pytest_distperf.decide.checks import Check
from pytest_distperf.decide.verdicts import MetricVerdict
from pytest_distperf.figures.wording import short_test
from pytest_distperf.report.document import TestDocument

Verdict = Union[Check, MetricVerdict]

STRICT_HINT = "--distperf-strict makes an undecided verdict fail the test"


def _pct(x: float, sign: str = "") -> str:
    return f"{x:{sign}.0%}".replace("%", " %")


def undecided_text(record: Verdict) -> str:
    """'+62 % estimated, undecided: this machine's run-to-run is 22 % (...)' for a baseline verdict (or the stored
    runs' where theirs is larger), '1.06x estimated against a 1.10x limit, undecided: pair-to-pair variation is
    14 % (...)' for a check."""
    interval = record.interval_text()  # the words every report uses where the design cannot bound it
    stopped = record.stopped or ""
    stop = f"; stopped: {stopped}" if stopped and stopped not in ("decided", "fixed runs") else ""
    if isinstance(record, Check):
        head = f"{record.ratio:.3g}x estimated against a {record.threshold:.3g}x limit"
        cv, noise = ((record.pair_cv, "pair-to-pair variation") if record.method == "paired" and record.pair_cv
                     is not None else (record.run_cv_a, "run-to-run"))
        runs, limit = (f"{record.pairs} pairs; " if record.pairs else ""), " the limit"
        noise = f"this machine's {noise} is {_pct(cv)}" if cv is not None else "too few runs to measure the noise"
    else:
        delta = record.delta
        head = f"{_pct(delta, '+')} estimated" if delta is not None else "change not estimated"
        noise, runs = _noisier_side(record)
        limit = f" the {record.threshold:+.1%} limit" if record.threshold is not None else " the limit"
    if not interval.startswith("["):  # words: the design could not bound it (wording.bound_text)
        return f"{head}, undecided: {noise} ({interval}{stop})"
    return f"{head}, undecided: {noise} ({runs}interval {interval} holds{limit}{stop})"


def _noisier_side(v: MetricVerdict) -> tuple[str, str]:
    """The run-to-run spread of the side that widens the interval most (the larger; both when they round alike),
    naming it, and the runs behind it: a quiet run against noisy stored runs is the stored runs' to fix."""
    other = "the base's" if v.reference else "the stored runs'"
    current, reference = v.current_cv, v.baseline_cv
    runs = f"{v.current_runs} runs; " if v.current_runs else ""
    if current is None and reference is None:
        return "too few runs to measure the noise", runs
    if current is not None and (reference is None or round(current * 100) > round(reference * 100)):
        return f"this machine's run-to-run is {_pct(current)}", runs
    assert reference is not None  # both None returned above
    if not v.reference and v.baseline_runs:
        runs = f"{v.current_runs} runs against {v.baseline_runs} stored; " if v.current_runs else ""
    if current is None or round(reference * 100) > round(current * 100):
        now = f", this machine's now {_pct(current)}" if current is not None else ""
        return f"{other} run-to-run is {_pct(reference)}{now}", runs
    return f"run-to-run is {_pct(current)} on both sides (this machine's and {other})", runs


def subject(record: Verdict) -> str:
    """What the verdict is about: 'step_time of deepspeed[stage=3] tiny x2 cpu' or a check's name."""
    if isinstance(record, Check):
        return f"{record.name} ({record.a} vs {record.b})"
    return f"{record.metric} of {record.job}"


def undecided(tests: Iterable[TestDocument]) -> list[tuple[str, Verdict]]:
    """(test, verdict) of every undecided (INCONCLUSIVE) check and baseline verdict, each shared verdict (same
    text) once. A 'new' baseline or a changed config is not undecided."""
    seen: set[tuple[str, str]] = set()
    out: list[tuple[str, Verdict]] = []
    for t in tests:
        found: list[Verdict] = [c for c in t.checks if c.outcome == "inconclusive"]
        found += [v for v in t.verdicts if v.status == "inconclusive"]
        for r in found:
            key = (subject(r), undecided_text(r))
            if key not in seen:
                seen.add(key)
                out.append((t.nodeid, r))
    return out


def failed_by(test: TestDocument) -> str:
    """Why a test that did not pass did not, in words for an undecided verdict of it: 'its test failed on another
    verdict (flops_per_step of ddp x2 cpu FAIL)'; 'its test failed (<reason>)' where no verdict failed it; '' for
    a test that passed."""
    if test.outcome == "passed":
        return ""
    if test.outcome == "skipped":
        return (f"its test is an expected failure (xfail: {test.xfail_reason})" if test.xfail_reason is not None
                else "its test was skipped")
    failing = ([f"{c.name} ({c.a} vs {c.b}) FAIL" for c in test.checks if c.outcome == "fail"]
               + [f"{v.metric} of {v.job} {v.status.upper()}" for v in test.verdicts
                  if v.fails or v.status == "fail"])
    if failing:
        shown = ", ".join(failing[:3]) + (f" and {len(failing) - 3} more" if len(failing) > 3 else "")
        return f"its test failed on another verdict ({shown})"
    reason = " ".join((test.failure or "").split())[:200]
    return f"its test {'errored' if test.outcome == 'error' else 'failed'}" + (f" ({reason})" if reason else "")


def summary_lines(tests: Iterable[TestDocument], strict: bool = False) -> list[str]:
    """The terminal summary's lines: a count and what the verdicts do to their tests, then each undecided verdict
    (one whose test did not pass says why: an undecided verdict never lets a failed test pass)."""
    tests = list(tests)
    found = undecided(tests)
    if not found:
        return []
    by_id = {t.nodeid: t for t in tests}
    why = {nodeid: failed_by(by_id[nodeid]) for nodeid, _ in found}
    if strict:
        policy = "they fail their tests (--distperf-strict)"
    elif not any(why.values()):
        policy = f"they neither passed nor failed; their tests pass ({STRICT_HINT})"
    else:
        other = sum(1 for w in why.values() if w)
        passed = len(why) - other
        tests_ = "their test" + ("s" if len(why) != 1 else "")
        policy = ("they neither passed nor failed; " + (f"{passed} of their tests pass, {other} did not"
                                                         if passed else f"{tests_} did not pass")
                  + f" for another reason, said under each ({STRICT_HINT})")
    lines = [f"distperf: {len(found)} undecided (inconclusive) verdict{'s' if len(found) != 1 else ''}: {policy}"]
    lines += [f"  {short_test(nodeid)}: {subject(r)}: {undecided_text(r)}"
              + (f"; {why[nodeid]}" if why[nodeid] and not strict else "") for nodeid, r in found]
    return lines
