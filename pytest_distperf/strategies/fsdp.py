"""torch FSDP1 (FullyShardedDataParallel), one unit per wrap unit of the workload (the GPT's blocks)."""

from __future__ import annotations

import torch
from torch.distributed.fsdp import CPUOffload, ShardingStrategy
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

from pytest_distperf.strategies import RankContext, frontend
from pytest_distperf.strategies.phased import PhasedTrainer


class FSDPTrainer(PhasedTrainer):
    def __init__(self, model: torch.nn.Module, ctx: RankContext, *, lr: float, weight_decay: float,
                 offload: bool, sharding: str):
        self.device = ctx.device
        if offload:
            model = model.cpu()  # FSDP's CPU offload expects the unsharded module on the host
        self.model = FSDP(
            model,
            auto_wrap_policy=frontend.fsdp_wrap_policy(model, ctx, "fsdp"),
            sharding_strategy=ShardingStrategy[sharding],
            mixed_precision=frontend.fsdp_mixed_precision(ctx),
            cpu_offload=CPUOffload(offload_params=True) if offload else None,
            device_id=ctx.device if ctx.device.type == "cuda" else None,
            use_orig_params=True,
        )
        self.optimizer = ctx.make_optimizer(self.model.parameters(), lr=lr, weight_decay=weight_decay)


build = FSDPTrainer  # the adapter protocol's build(model, ctx, **options)
