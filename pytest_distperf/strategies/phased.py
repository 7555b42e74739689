"""One training step as three phases, shared by the adapters whose loop is theirs to write.

`step()` runs forward, backward and optimizer back to back: that is what the worker times.
`step_breakdown()` runs the same three methods with a device synchronisation after each, in a
short phase after timing (pytest_distperf.rank.breakdown), so a failing ratio says where the time goes.
"""

from __future__ import annotations

from typing import Any

from pytest_distperf.rank.breakdown import PhaseClock
from pytest_distperf.rank.timing import StepTimer


class PhasedTrainer:
    """Defaults are the plain torch loop; an adapter overrides the phases its library does differently."""

    device: Any  # torch.device
    model: Any  # the wrapped module: model(*batch) -> loss
    optimizer: Any

    def forward(self, *batch: Any) -> Any:
        return self.model(*batch)

    def backward(self, loss: Any) -> None:
        loss.backward()

    def optimizer_step(self) -> None:
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def torch_optimizer(self) -> Any:
        """The torch optimizer that holds the state (strategies/__init__.optimizer_state_bytes reads it)."""
        return self.optimizer

    def step(self, *batch: Any) -> Any:
        loss = self.forward(*batch)
        self.backward(loss)
        self.optimizer_step()
        return loss.detach()

    def step_breakdown(self, *batch: Any) -> dict[str, float]:
        clock = PhaseClock(StepTimer(self.device).sync)
        clock.start()
        loss = self.forward(*batch)
        clock.lap("forward")
        self.backward(loss)
        clock.lap("backward")
        self.optimizer_step()
        clock.lap("optimizer")
        return clock.stop()
