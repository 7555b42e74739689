"""torch DistributedDataParallel; bf16 autocast over fp32 weights on CUDA."""

from __future__ import annotations

import contextlib

import torch
from torch.nn.parallel import DistributedDataParallel

from pytest_distperf.breakdown import PhaseClock
from pytest_distperf.strategies import RankContext
from pytest_distperf.timing import StepTimer


class DDPTrainer:
    def __init__(self, model: torch.nn.Module, ctx: RankContext, *, lr: float, weight_decay: float, bucket_cap_mb: int):
        self.ctx = ctx
        ids = [ctx.device.index] if ctx.device.type == "cuda" else None
        self.model = DistributedDataParallel(model, device_ids=ids, bucket_cap_mb=bucket_cap_mb)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr, weight_decay=weight_decay)

    def _autocast(self):
        if self.ctx.bf16:
            return torch.autocast(device_type=self.ctx.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        with self._autocast():
            loss = self.model(inputs, targets)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    def step_breakdown(self, inputs: torch.Tensor, targets: torch.Tensor) -> dict[str, float]:
        """step() split into device-synchronised phases (pytest_distperf.breakdown)."""
        clock = PhaseClock(StepTimer(self.ctx.device).sync)
        clock.start()
        with self._autocast():
            loss = self.model(inputs, targets)
        clock.lap("forward")
        loss.backward()
        clock.lap("backward")
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        clock.lap("optimizer")
        return clock.stop()

    def torch_optimizer(self) -> torch.optim.Optimizer:
        return self.optimizer


def build(model: torch.nn.Module, ctx: RankContext, **options) -> DDPTrainer:
    return DDPTrainer(model, ctx, **options)
