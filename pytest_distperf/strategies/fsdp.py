"""torch FSDP1 (FullyShardedDataParallel), one unit per transformer block."""

from __future__ import annotations

import functools

import torch
from torch.distributed.fsdp import CPUOffload, MixedPrecision, ShardingStrategy
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

from pytest_distperf.strategies import RankContext
from pytest_distperf.strategies.phased import PhasedTrainer
from pytest_distperf.rank.workload import Block


class FSDPTrainer(PhasedTrainer):
    def __init__(self, model: torch.nn.Module, ctx: RankContext, *, lr: float, weight_decay: float,
                 offload: bool, sharding: str):
        self.device = ctx.device
        mp = None
        if ctx.bf16:
            mp = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32, buffer_dtype=torch.bfloat16)
        if offload:
            model = model.cpu()  # FSDP's CPU offload expects the unsharded module on the host
        self.model = FSDP(
            model,
            auto_wrap_policy=functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={Block}),
            sharding_strategy=ShardingStrategy[sharding],
            mixed_precision=mp,
            cpu_offload=CPUOffload(offload_params=True) if offload else None,
            device_id=ctx.device if ctx.device.type == "cuda" else None,
            use_orig_params=True,
        )
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr, weight_decay=weight_decay)


def build(model: torch.nn.Module, ctx: RankContext, **options) -> FSDPTrainer:
    return FSDPTrainer(model, ctx, **options)
