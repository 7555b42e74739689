"""DeepSpeed configuration: our defaults, the user's overrides merged over them, and checks. Top-level keys are
checked here (DeepSpeed ignores unknown ones silently); nested sections by DeepSpeed's own models in the rank."""

from __future__ import annotations

import copy
import os
from typing import Any

from pytest_distperf.errors import StrategyError

# Top-level keys DeepSpeed reads (deepspeed/runtime/config.py and its section parsers).
KNOWN_TOP_LEVEL = frozenset({
    "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "optimizer",
    "scheduler", "fp16", "bf16", "amp", "torch_autocast", "zero_optimization", "zero_allow_untested_optimizer",
    "zero_force_ds_cpu_optimizer", "gradient_clipping", "prescale_gradients", "gradient_predivide_factor",
    "communication_data_type", "seq_parallel_communication_data_type", "data_types", "sparse_gradients",
    "steps_per_print", "wall_clock_breakdown", "memory_breakdown", "dump_state", "activation_checkpointing",
    "flops_profiler", "comms_logger", "aio", "checkpoint", "tensorboard", "wandb", "csv_monitor", "comet",
    "monitor_config", "compile", "elasticity", "autotuning", "pipeline", "curriculum_learning",
    "data_efficiency", "compression_training", "eigenvalue", "progressive_layer_drop", "sparse_attention",
    "disable_allgather", "timers", "graph_harvesting", "use_data_before_expert_parallelism",
    "use_node_local_storage", "load_universal_checkpoint", "nebula", "weight_quantization", "hybrid_engine",
    "tensor_parallel", "zenflow",
})


def check_user_config(cfg: Any) -> None:
    if not isinstance(cfg, dict):
        raise StrategyError(f"deepspeed option ds_config must be a dict, got {type(cfg).__name__}")
    unknown = sorted(set(cfg) - KNOWN_TOP_LEVEL)
    if unknown:
        raise StrategyError(f"ds_config has unknown top-level key(s) {', '.join(map(repr, unknown))}")


def merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in override.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else copy.deepcopy(v)
    return out


def build_config(*, stage: int, micro_batch: int, bf16: bool, lr: float, weight_decay: float,
                 offload_optimizer: str | None, offload_param: str | None, nvme_path: str,
                 user: dict[str, Any]) -> dict[str, Any]:
    """The same optimizer, learning rate and precision policy as the torch strategies: without offload torch's
    AdamW (`torch_adam`), so a comparison measures the sharding engine, not two Adam kernels; with offload
    DeepSpeed requires its own DeepSpeedCPUAdam."""
    zero: dict[str, Any] = {"stage": stage}
    for key, device in (("offload_optimizer", offload_optimizer), ("offload_param", offload_param)):
        if device:
            zero[key] = {"device": device, "pin_memory": True, **({"nvme_path": nvme_path} if device == "nvme" else {})}
    base = {
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": 1,
        "optimizer": {
            "type": "AdamW",
            "params": {"lr": lr, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": weight_decay,
                       "torch_adam": not offload_optimizer},
        },
        "zero_optimization": zero,
        "bf16": {"enabled": bf16},
        # Same reduction precision as the FSDP adapters (reduce_dtype=float32).
        "communication_data_type": "fp32",
        "steps_per_print": 1 << 30,
        "wall_clock_breakdown": False,
    }
    return merge(base, user)


def departures(*, bf16: bool, offload_optimizer: str | None, user: dict[str, Any],
               own_optimizer: bool = False) -> dict[str, str]:
    """Where build_config departs from DeepSpeed's own defaults, for the reports: setting -> what this harness
    uses, DeepSpeed's default and why. A setting the user's ds_config gives is theirs, not a departure."""
    out: dict[str, str] = {}
    if bf16 and "communication_data_type" not in user:
        out["communication_data_type"] = (
            "fp32 (DeepSpeed's default: the gradients' dtype, bf16 here): gradients are reduced in fp32 to match "
            "FSDP2's reduce_dtype=float32; costs memory and bandwidth against DeepSpeed's default")
    user_params = ((user.get("optimizer") or {}).get("params") or {}) if isinstance(user.get("optimizer"), dict) else {}
    if not offload_optimizer and not own_optimizer and "torch_adam" not in user_params:
        out["optimizer.params.torch_adam"] = (
            "true (DeepSpeed's default: its fused Adam): torch's AdamW, the optimizer of the torch strategies, so a "
            "comparison measures the sharding engine, not two Adam kernels")
    return out


def rank_config(ctx: Any, *, lr: float, weight_decay: float, stage: int, offload_optimizer: str | None,
                offload_param: str | None, nvme_path: str | None, ds_config: dict,
                **_not_config: Any) -> dict[str, Any]:
    """A rank's DeepSpeed config, the one every DeepSpeed route uses: NVMe offload in the rank's scratch folder,
    the departures in ctx.extra. Options that are not the config's (zero_init, engine, ...) are ignored."""
    nvme_path = nvme_path or os.path.join(ctx.scratch_dir, f"nvme-rank{ctx.rank}")
    ctx.extra["departures"] = departures(bf16=ctx.bf16, offload_optimizer=offload_optimizer, user=ds_config,
                                         own_optimizer=getattr(ctx, "optimizer", None) is not None)
    return build_config(stage=stage, micro_batch=ctx.micro_batch, bf16=ctx.bf16, lr=lr, weight_decay=weight_decay,
                        offload_optimizer=offload_optimizer, offload_param=offload_param, nvme_path=nvme_path,
                        user=ds_config)
