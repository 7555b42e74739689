"""The stopping rule of adaptive repeats: look; while undecided, add pairs (or runs) up to the next planned look
of the group-sequential design (decide/sequential.py) and look again. Only planned looks are ever made, so "stop as
soon as decided" keeps the repeated intervals' error bound."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field, replace
from typing import Callable, TypeVar

from pytest_distperf.decide.decision import (DEFAULT_CONFIDENCE, DEFAULT_MAX_PAIRS, INCONCLUSIVE, Design,
                                             Verdict)
from pytest_distperf.decide.sequential import FIRST_LOOK, planned_looks
from pytest_distperf.errors import SessionBudgetSpent
from pytest_distperf.spec.settings import MAX_LOOKS

T = TypeVar("T")  # what a look returns


@dataclass(frozen=True)
class Budget:
    """How far adaptive repeats may go: pairs (or candidate runs) in all, wall-clock seconds from the test's start,
    the session's deadline, and this test's share of the session (`session_share`), which only looks past the
    second planned one must keep to."""

    max_pairs: int = DEFAULT_MAX_PAIRS
    seconds: float | None = None
    deadline: float | None = None
    deadline_text: str = "the session's wall-clock budget"
    first_look: int = FIRST_LOOK
    # A moment, or a function of (now, the test's elapsed seconds) giving one when a third look is due
    share_deadline: float | Callable[[float, float], float] | None = None
    share_text: str = "its share of the session's wall-clock budget"

    def __post_init__(self) -> None:
        if not 1 <= self.max_pairs <= MAX_LOOKS:
            raise ValueError(f"max_pairs must be in [1, {MAX_LOOKS}], got {self.max_pairs!r}")
        if self.seconds is not None and self.seconds <= 0:
            raise ValueError(f"seconds must be positive, got {self.seconds!r}")

    @property
    def looks(self) -> tuple[int, ...]:
        return planned_looks(self.max_pairs, self.first_look)

    def design(self, confidence: float = DEFAULT_CONFIDENCE) -> Design:
        return Design(confidence=confidence, max_pairs=max(2, self.max_pairs), first_look=self.first_look)


def session_share(now: float, deadline: float, tests_left: int, reserve_each: float | None = None) -> float:
    """The moment after which a test may not run pairs for its third or later look, so every test gets its first
    two looks before an earlier one takes a third. `tests_left` counts this test and every later one. With
    `reserve_each` (what a test's first two looks have cost so far) the share is everything but the later tests'
    reserve; without it, an equal share of the time left."""
    left = max(0.0, deadline - now)
    if reserve_each is None:
        return now + left / max(1, tests_left)
    return now + max(0.0, left - reserve_each * max(0, tests_left - 1))


@dataclass
class Clock:

    started: float = field(default_factory=time.monotonic)
    pair_seconds: list[float] = field(default_factory=list)
    now: Callable[[], float] = time.monotonic

    def elapsed(self) -> float:
        return self.now() - self.started


def progress_text(v: Verdict, next_look: int) -> str:
    """'inconclusive after 3 pairs (1.06 [0.97, 1.16] vs 1.10), running pairs 4-6 for the look at 6'."""
    e = v.estimate
    unit = e.unit
    first = e.seen + 1
    span = f"{unit[:-1]} {first}" if first == next_look else f"{unit} {first}-{next_look}"
    return (f"inconclusive after {e.n_pairs} {unit} ({e.text(2)} vs {v.limit:.2f}), running {span} for the look "
            f"at {next_look}")


def next_step(pairs: int, budget: Budget) -> int:
    """The planned look the next pairs go to (0: none left)."""
    return min((k for k in budget.looks if k > pairs), default=0)


def stop_reason(pairs: int, budget: Budget, clock: Clock, unit: str = "pairs") -> str | None:
    """Why no pairs may start toward the next planned look (None: they may): the pair budget, or pairs that would
    end (at the mean duration of those added so far) past a budget, the deadline or, for a third or later look,
    the test's share of the session. `unit`: what the budget counts, "pairs" (paired comparisons) or "runs" (the
    unpaired baseline gate's candidate runs): decision.SAMPLE_UNITS."""
    target = next_step(pairs, budget)
    if not target:
        return f"max {budget.max_pairs} {unit if budget.max_pairs != 1 else unit[:-1]}"
    expected = statistics.fmean(clock.pair_seconds) * (target - pairs) if clock.pair_seconds else 0.0
    if budget.seconds is not None and clock.elapsed() + expected > budget.seconds:
        return f"wall-clock budget {budget.seconds:g} s"
    if budget.deadline is not None and clock.now() + expected > budget.deadline:
        return budget.deadline_text
    if budget.share_deadline is not None and budget.looks.index(target) >= 2:
        share = budget.share_deadline
        if callable(share):
            share = share(clock.now(), clock.elapsed())
        if clock.now() + expected > share:
            return budget.share_text
    return None


def look_until(look: Callable[[], T], pending: Callable[[T], bool], seen: Callable[[T], int],
               add_pair: Callable[[], None] | None, budget: Budget, clock: Clock,
               progress: Callable[[T, int], None] | None = None,
               unit: str | Callable[[T], str] = "pairs") -> tuple[T, str]:
    """The one stopping rule of adaptive repeats: look; while `pending` holds of the look and the budget allows,
    add pairs (or runs) up to the next planned look and look again. Returns the last look and why it stopped:
    "decided", "fixed runs" (no `add_pair`) or stop_reason's words. `seen`: the pairs the look was over; `unit`:
    what they are, "pairs" or "runs" (or a function of the look giving it), for stop_reason's words."""
    while True:
        current = look()
        if not pending(current):
            return current, "decided"
        if add_pair is None:
            return current, "fixed runs"
        n = seen(current)
        why = stop_reason(n, budget, clock, unit(current) if callable(unit) else unit)
        if why:
            return current, why
        target = next_step(n, budget)
        if progress:
            progress(current, target)
        for _ in range(target - n):  # the pairs between planned looks are not looked at
            started = clock.now()
            try:
                add_pair()
            except SessionBudgetSpent:  # the session's deadline passed mid-step: no job starts after it
                return current, budget.deadline_text
            clock.pair_seconds.append(clock.now() - started)


def until_decided(look: Callable[[], Verdict], add_pair: Callable[[], None] | None, budget: Budget,
                  clock: Clock | None = None, progress: Callable[[str], None] | None = None) -> Verdict:
    """One quantity's verdict under look_until. `look` decides on all the data there is (runs may be shared with
    other tests); the estimate is the planned look's, so every look is covered by the repeated intervals."""
    v, why = look_until(look, lambda v: v.outcome == INCONCLUSIVE, lambda v: v.estimate.seen, add_pair, budget,
                        clock or Clock(), (lambda v, target: progress(progress_text(v, target))) if progress else None,
                        lambda v: v.estimate.unit)  # pairs for a paired estimate, runs for an unpaired one
    return replace(v, stopped=why)
