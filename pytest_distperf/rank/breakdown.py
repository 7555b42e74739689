"""Where the time of a step goes: forward, backward, optimizer, and the rest ("other": a framework's hooks,
bookkeeping, per-step collectives).

Measured inside the ranks by a strategy's optional `step_breakdown(inputs, targets)`, in a short phase after the
timing phase (its device synchronisations would slow timed steps); figures/quantities.py reads it back, so a failing
step-time check says which phase one side spends its extra time in.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterable

PHASES = ("forward", "backward", "optimizer")
ALL_KEYS = PHASES + ("other", "total")
STEPS = 3  # breakdown steps per job: a median robust to one outlier, a few seconds on the largest shapes


class PhaseClock:
    """Laps of one step, each ended by a device synchronisation. `sync` is StepTimer.sync.

    start() and stop() may run on one thread and lap() on another (the Trainer adapter's loop on
    the main thread, the measurement on a second), as long as they follow each other in time.
    """

    def __init__(self, sync: Callable[[], None]):
        self._sync = sync
        self._start = self._last = 0.0
        self.phases: dict[str, float] = {}

    def start(self) -> None:
        self._sync()
        self._start = self._last = time.perf_counter()

    def lap(self, name: str) -> None:
        self._sync()
        now = time.perf_counter()
        self.phases[name] = self.phases.get(name, 0.0) + now - self._last
        self._last = now

    def skip(self) -> None:
        """Start the next phase here: the time since the last lap stays in "other" (a user's unmarked code)."""
        self._sync()
        self._last = time.perf_counter()

    def stop(self) -> dict[str, float]:
        self._sync()
        total = time.perf_counter() - self._start
        out = {k: self.phases.get(k, 0.0) for k in PHASES}
        out.update({k: v for k, v in self.phases.items() if k not in PHASES})  # phases a user named
        out["other"] = max(0.0, total - sum(out.values()))
        out["total"] = total
        return out


def collect(trainer: Any, batches: list[Any], steps: int = STEPS) -> dict[str, float]:
    """Run `steps` extra steps through the strategy's step_breakdown (if it has one); the median step's phases."""
    measure = getattr(trainer, "step_breakdown", None)
    if measure is None or not batches:
        return {}
    return median_step(measure(*batches[i % len(batches)]) for i in range(steps))


def median_step(steps: Iterable[dict[str, float]]) -> dict[str, float]:
    """The step with the median total, whole: per-phase medians of different steps would not add up."""
    ordered = sorted((s for s in steps if s), key=lambda s: s["total"])
    return dict(ordered[(len(ordered) - 1) // 2]) if ordered else {}
