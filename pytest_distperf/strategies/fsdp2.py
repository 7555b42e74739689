"""torch FSDP2 (`fully_shard`), one unit per wrap unit of the workload (the GPT's blocks) plus the root."""

from __future__ import annotations

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

from pytest_distperf.strategies import RankContext, wrap_targets
from pytest_distperf.strategies.phased import PhasedTrainer


class FSDP2Trainer(PhasedTrainer):
    def __init__(self, model: torch.nn.Module, ctx: RankContext, *, lr: float, weight_decay: float,
                 offload: bool, reshard_after_forward: bool):
        self.device = ctx.device
        mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
        bf16 = dict(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if ctx.bf16 else {}
        mp = MixedPrecisionPolicy(**bf16)
        policy = CPUOffloadPolicy(pin_memory=ctx.device.type == "cuda") if offload else OffloadPolicy()
        kwargs = dict(mesh=mesh, mp_policy=mp, offload_policy=policy)
        for unit in wrap_targets(model, ctx, "fsdp2"):
            fully_shard(unit, reshard_after_forward=reshard_after_forward, **kwargs)
        self.model = fully_shard(model, reshard_after_forward=reshard_after_forward, **kwargs)
        self.optimizer = ctx.make_optimizer(self.model.parameters(), lr=lr, weight_decay=weight_decay)


build = FSDP2Trainer  # the adapter protocol's build(model, ctx, **options)
