"""torch DistributedDataParallel; bf16 autocast over fp32 weights on CUDA."""

from __future__ import annotations

import contextlib

import torch
from torch.nn.parallel import DistributedDataParallel

from pytest_distperf.strategies import RankContext
from pytest_distperf.strategies.phased import PhasedTrainer


class DDPTrainer(PhasedTrainer):
    def __init__(self, model: torch.nn.Module, ctx: RankContext, *, lr: float, weight_decay: float, bucket_cap_mb: int):
        self.ctx, self.device = ctx, ctx.device
        ids = [ctx.device.index] if ctx.device.type == "cuda" else None
        self.model = DistributedDataParallel(model, device_ids=ids, bucket_cap_mb=bucket_cap_mb)
        self.optimizer = ctx.make_optimizer(self.model.parameters(), lr=lr, weight_decay=weight_decay)

    def _autocast(self):
        if self.ctx.bf16:
            return torch.autocast(device_type=self.ctx.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def forward(self, *batch: torch.Tensor) -> torch.Tensor:
        with self._autocast():
            return self.model(*batch)


build = DDPTrainer  # the adapter protocol's build(model, ctx, **options)
