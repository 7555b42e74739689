"""One training step as three phases: `step()` runs them back to back (what the worker times), `step_breakdown()`
with a device synchronisation after each, after timing, so a failing ratio says where the time goes."""

from __future__ import annotations

from typing import Any

from pytest_distperf.rank.breakdown import PhaseClock
from pytest_distperf.rank.timing import StepTimer


class PhasedTrainer:
    """The plain torch loop; an adapter overrides the phases its library does differently."""

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
        """The torch optimizer that holds the state (optimizer_state_bytes)."""
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
