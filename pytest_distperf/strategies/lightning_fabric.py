"""Lightning Fabric running the workload in the loop the Fabric docs show, under DDP, FSDP or DeepSpeed, with the
Trainer adapter's engines, precision and optimizer, so Trainer-vs-Fabric compares the two loops only.
"""

from __future__ import annotations

from typing import Any

import torch
from lightning.fabric import Fabric

from pytest_distperf.strategies import RankContext, frontend
from pytest_distperf.strategies.phased import PhasedTrainer


class LightningFabricAdapter(PhasedTrainer):
    def __init__(self, model: torch.nn.Module, ctx: RankContext, **options: Any):
        self.device = ctx.device
        group = frontend.default_process_group(ctx)
        strategy, precision, model, make_optimizer = frontend.lightning_engine(ctx, model, options, fabric=True)
        devices, nodes = frontend.node_layout(ctx.world_size)
        self.fabric = Fabric(accelerator="cuda" if ctx.device.type == "cuda" else "cpu", devices=devices,
                             num_nodes=nodes, strategy=strategy, precision=precision)
        self.fabric.launch()
        frontend.check_launch("Lightning Fabric", ctx, group,
                              cluster_environment=self.fabric.strategy.cluster_environment,
                              world_size=self.fabric.world_size, rank=self.fabric.global_rank)
        if options["engine"] == "fsdp":
            self.model = self.fabric.setup_module(model)
            self.optimizer = self.fabric.setup_optimizers(make_optimizer(self.model.parameters()))
        else:
            self.model, self.optimizer = self.fabric.setup(model, make_optimizer(model.parameters()))

    def backward(self, loss: torch.Tensor) -> None:
        self.fabric.backward(loss)

    def optimizer_step(self) -> None:
        self.optimizer.step()
        self.optimizer.zero_grad()

    def torch_optimizer(self) -> torch.optim.Optimizer:
        opt = self.optimizer.optimizer  # Fabric's wrapper -> torch optimizer, or DeepSpeed's ZeRO optimizer
        return getattr(opt, "optimizer", opt)


build = LightningFabricAdapter  # the adapter protocol's build(model, ctx, **options)
