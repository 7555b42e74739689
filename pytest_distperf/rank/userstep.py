"""A user's own training step as an adapter: what `distperf.step_job(make_step)` measures.

`make_step(*args, **kwargs)` runs in every rank (process group initialised, device set) and
returns the step: a callable `step()` doing one whole training iteration, or an object with a
callable `step` attribute and, optionally, `torch_optimizer()` (optimizer-state bytes and the
placement probe read it), `close()` (called after the last step while the process group is up)
and `tokens_per_step` (tokens per rank per step, for tok/s). `step()` may return the loss.

The worker runs it like any strategy: warm-up, timed steps (rank/timing.py),
memory peaks, then the probe phase and the breakdown phase. Phases the user marks with
`pytest_distperf.phase("...")` are timed in the breakdown phase only.
"""

from __future__ import annotations

from typing import Any, Callable

from pytest_distperf.spec import phases
from pytest_distperf.rank.breakdown import PhaseClock
from pytest_distperf.rank.timing import StepTimer


class StepFactoryError(TypeError):
    """make_step returned something that is not a step; the message names the factory."""


class UserStep:
    def __init__(self, made: Any, where: str, device: Any):
        step = made if callable(made) else getattr(made, "step", None)
        if not callable(step):
            raise StepFactoryError(f"{where} returned {type(made).__name__}: expected the step, a callable step() "
                                   f"(or an object with a step() method)")
        self._step: Callable[[], Any] = step
        self._made = made
        self._sync = StepTimer(device).sync
        tokens = getattr(made, "tokens_per_step", None)
        if tokens is not None and (not isinstance(tokens, int) or tokens < 0):
            raise StepFactoryError(f"{where}: tokens_per_step must be a non-negative int, got {tokens!r}")
        self.tokens_per_step = tokens or 0

    def step(self, *batch: Any) -> Any:
        return self._step()

    def step_breakdown(self, *batch: Any) -> dict[str, float]:
        """One step with the user's marked phases timed; {} when the step marks none."""
        clock = PhaseClock(self._sync)
        with phases.recording(clock):
            clock.start()
            self._step()
            result = clock.stop()
        return result if clock.phases else {}

    def torch_optimizer(self) -> Any:
        get = getattr(self._made, "torch_optimizer", None)
        return get() if callable(get) else None

    def close(self) -> None:
        close = getattr(self._made, "close", None)
        if callable(close) and close is not self._step:
            close()
