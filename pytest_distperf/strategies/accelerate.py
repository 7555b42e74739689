"""Hugging Face Accelerate running the workload under DDP, its FSDP plugin or its DeepSpeed plugin, in Accelerate's
own loop, each engine configured as its raw adapter. Accelerate's other FSDP defaults are kept as a user gets them
(`backward_prefetch=None`: a difference the parity check measures). On CPU Accelerate silently falls back to DDP
for its plugins, so the adapter refuses any engine other than the one asked for.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import (DeepSpeedPlugin, DistributedDataParallelKwargs, DistributedType, DummyOptim,
                              FullyShardedDataParallelPlugin)

from pytest_distperf.rank.breakdown import PhaseClock
from pytest_distperf.strategies import RankContext, ds_config, frontend, wrap_targets
from pytest_distperf.rank.timing import StepTimer


class AccelerateAdapter:
    def __init__(self, model: torch.nn.Module, ctx: RankContext, **o: Any):
        self._sync = StepTimer(ctx.device).sync
        self.engine = o["engine"]
        group = frontend.default_process_group(ctx)
        plugins: dict[str, Any] = {}
        handlers: list[Any] = []
        mixed = "bf16" if ctx.bf16 else "no"
        if self.engine == "ddp":
            handlers.append(DistributedDataParallelKwargs(bucket_cap_mb=o["bucket_cap_mb"]))
            expected = DistributedType.MULTI_GPU if ctx.device.type == "cuda" else DistributedType.MULTI_CPU
        elif self.engine == "fsdp":
            plugins["fsdp_plugin"] = _fsdp_plugin(model, ctx, o)
            if o["offload"]:
                model = model.cpu()  # as fsdp.py: FSDP's CPU offload expects the unsharded module on the host
            mixed = "no"  # the plugin's policy carries the precision; no autocast on top (as fsdp.py)
            expected = DistributedType.FSDP
        else:
            config = ds_config.rank_config(ctx, **o)
            if ctx.optimizer is not None:
                config.pop("optimizer")
            plugins["deepspeed_plugin"] = DeepSpeedPlugin(hf_ds_config=copy.deepcopy(config), zero3_init_flag=False)
            expected = DistributedType.DEEPSPEED
        self.accelerator = Accelerator(cpu=ctx.device.type == "cpu", mixed_precision=mixed,
                                       kwargs_handlers=handlers, **plugins)
        if self.accelerator.distributed_type != expected:
            raise RuntimeError(f"Accelerate chose {self.accelerator.distributed_type} for engine={self.engine!r} "
                               f"on {ctx.device.type}, not {expected}: the engine would not be measured")
        frontend.check_reused_ranks("Accelerate", group, world_size=self.accelerator.num_processes,
                                    rank=self.accelerator.process_index)

        lr, wd = o["lr"], o["weight_decay"]
        if self.engine == "deepspeed":
            # DeepSpeed builds the optimizer from the config (DummyOptim), unless the workload brings its own.
            opt = (ctx.optimizer(model.parameters()) if ctx.optimizer is not None
                   else DummyOptim(model.parameters(), lr=lr, weight_decay=wd))
            self.model, self.optimizer = self.accelerator.prepare(model, opt)
        else:
            # As the raw adapters: wrap first, then the optimizer over the wrapped (sharded) parameters.
            self.model = self.accelerator.prepare(model)
            self.optimizer = self.accelerator.prepare(frontend.adamw(ctx, lr, wd)(self.model.parameters()))

    def step(self, *batch: torch.Tensor) -> torch.Tensor:
        loss = self.model(*batch)
        self.accelerator.backward(loss)  # DeepSpeed: engine.backward + engine.step
        self.optimizer.step()  # DeepSpeed: a no-op in Accelerate's wrapper
        self.optimizer.zero_grad()
        return loss.detach()

    def step_breakdown(self, *batch: torch.Tensor) -> dict[str, float]:
        clock = PhaseClock(self._sync)
        clock.start()
        loss = self.model(*batch)
        clock.lap("forward")
        if self.engine == "deepspeed":
            # accelerator.backward() runs backward and the optimizer step in one call; its two halves
            # (DeepSpeedEngineWrapper.backward) are made here one by one to time them apart.
            engine = self.accelerator.deepspeed_engine_wrapped.engine
            engine.set_gradient_accumulation_boundary(is_boundary=True)
            engine.backward(loss)
            clock.lap("backward")
            engine.step()
        else:
            self.accelerator.backward(loss)
            clock.lap("backward")
            self.optimizer.step()
        self.optimizer.zero_grad()
        clock.lap("optimizer")
        return clock.stop()

    def torch_optimizer(self) -> torch.optim.Optimizer:
        opt = self.optimizer.optimizer  # Accelerate's wrapper -> torch optimizer, or DeepSpeed's ZeRO optimizer
        return getattr(opt, "optimizer", opt)


def _fsdp_plugin(model: torch.nn.Module, ctx: RankContext, o: dict[str, Any]) -> FullyShardedDataParallelPlugin:
    wrap_targets(model, ctx, "accelerate")  # a clear error when the workload names no units the model has
    return FullyShardedDataParallelPlugin(
        fsdp_version=1, reshard_after_forward=o["sharding"], cpu_offload=bool(o["offload"]), use_orig_params=True,
        mixed_precision_policy=frontend.fsdp_mixed_precision(ctx), auto_wrap_policy="transformer_based_wrap",
        transformer_cls_names_to_wrap=[u.__name__ for u in ctx.wrap_units])


build = AccelerateAdapter  # the adapter protocol's build(model, ctx, **options)
