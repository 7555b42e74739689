"""DeepSpeed ZeRO stages 0-3, optimizer/parameter offload to CPU or NVMe passed through."""

from __future__ import annotations

import os
from typing import Any

import deepspeed
import torch

from pytest_distperf.strategies import RankContext, StrategyError
from pytest_distperf.strategies.ds_config import rank_config
from pytest_distperf.strategies.phased import PhasedTrainer


class DeepSpeedTrainer(PhasedTrainer):
    def __init__(self, model: torch.nn.Module, ctx: RankContext, **options: Any):
        self.device = ctx.device
        config = self.config = rank_config(ctx, **options)
        _check_sections(config)
        if "nvme" in (options["offload_optimizer"], options["offload_param"]):
            _require_async_io()
        # initialize() builds the optimizer (and any JIT op it needs) in build time, never in a timed step;
        # a workload's own optimizer is handed over instead of the config's.
        client = {}
        if ctx.optimizer is not None:
            config.pop("optimizer")
            client["optimizer"] = ctx.optimizer(model.parameters())
        self.engine, self.optimizer, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                                                 config=config, **client)

    def forward(self, *batch: torch.Tensor) -> torch.Tensor:
        return self.engine(*batch)

    def backward(self, loss: torch.Tensor) -> None:
        self.engine.backward(loss)

    def optimizer_step(self) -> None:
        self.engine.step()  # also zeroes the gradients

    def torch_optimizer(self) -> torch.optim.Optimizer:
        opt = self.engine.optimizer
        return getattr(opt, "optimizer", opt)  # ZeRO/bf16 wrappers hold the torch optimizer inside


def model_init_context(ctx: RankContext, **options: Any) -> Any:
    """zero_init=True: the model is built inside deepspeed.zero.Init, each rank holding only its partition of
    every parameter from the start (how ZeRO-3 users build a model too large for one device)."""
    if not options["zero_init"]:
        return None
    return deepspeed.zero.Init(config_dict_or_path=rank_config(ctx, **options))


def _require_async_io() -> None:
    """NVMe offload needs DeepSpeed's async I/O op (libaio): skip the test, with the reason, where it cannot build."""
    from deepspeed.ops.op_builder import AsyncIOBuilder

    builder = AsyncIOBuilder()
    if not builder.is_compatible():
        import pytest

        pytest.skip("NVMe offload needs DeepSpeed's async I/O op, and AsyncIOBuilder().is_compatible() is False "
                    "on this machine (libaio library and headers not found; e.g. apt install libaio-dev)")
    check_cuda_arch_list(builder, os.environ.get("TORCH_CUDA_ARCH_LIST", ""))


def check_cuda_arch_list(builder: Any, arch_list: str) -> None:
    """Ask DeepSpeed's own parser whether it can read TORCH_CUDA_ARCH_LIST before its JIT build does: 0.19.8
    fails on "9.0a" deep inside the optimizer set-up (deepspeedai/DeepSpeed#7589)."""
    arch_list = arch_list.strip()
    if not arch_list or not hasattr(builder, "compute_capability_args"):  # the CPU op builders compile no CUDA
        return
    saved = builder.jit_mode, getattr(builder, "_jit_arch_list", None)
    builder.jit_mode, builder._jit_arch_list = True, arch_list
    try:
        builder.compute_capability_args()
    except ValueError as e:
        raise StrategyError(
            f"TORCH_CUDA_ARCH_LIST={arch_list!r}: DeepSpeed {deepspeed.__version__} cannot parse it when it "
            f"JIT-builds the async I/O op that NVMe offload needs ({e}; deepspeedai/DeepSpeed#7589). Set "
            f"TORCH_CUDA_ARCH_LIST to major.minor entries without a letter suffix, e.g. TORCH_CUDA_ARCH_LIST=9.0 "
            f"on H100/H200.") from None
    finally:
        builder.jit_mode, builder._jit_arch_list = saved


def _check_sections(config: dict) -> None:
    """Let DeepSpeed's own pydantic models reject bad nested keys, with the section named."""
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    try:
        DeepSpeedZeroConfig(**config.get("zero_optimization", {}))
    except Exception as e:  # pydantic.ValidationError; keep pydantic out of our imports
        raise StrategyError(f"ds_config['zero_optimization'] is invalid: {e}") from None


build = DeepSpeedTrainer  # the adapter protocol's build(model, ctx, **options)
