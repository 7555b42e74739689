"""The engines (torch DDP, FSDP1, DeepSpeed ZeRO) as the raw adapters and the framework front-ends (Lightning
Trainer, Lightning Fabric, HF Accelerate) share them.

A front-end drives its engine configured exactly as the raw adapter of that engine, so a comparison measures the
front-end and nothing else. The option tables and checks at the top are import-light (read by the pytest
process); torch is imported lazily below.
"""

from __future__ import annotations

import copy
import os
from typing import Any

from pytest_distperf.errors import StrategyError
from pytest_distperf.strategies.ds_config import check_user_config

ENGINES = ("ddp", "fsdp", "deepspeed")

# Options of lightning_trainer, lightning_fabric and accelerate.
FRONTEND_OPTIONS: dict[str, Any] = {
    "engine": "ddp",
    "bucket_cap_mb": 25,  # ddp
    "offload": False,  # fsdp: parameters (and so gradients and optimizer step) on the host
    "sharding": "FULL_SHARD",  # fsdp
    "stage": 3,  # deepspeed
    "offload_optimizer": None,  # deepspeed: None | "cpu" | "nvme"
    "offload_param": None,  # deepspeed, stage 3: None | "cpu" | "nvme"
    "nvme_path": None,  # deepspeed
    "ds_config": {},  # deepspeed: merged over the built config, as for the raw adapter
}

# Which options belong to which engine (the rest must keep their defaults).
ENGINE_KEYS: dict[str, frozenset[str]] = {
    "ddp": frozenset({"bucket_cap_mb"}),
    "fsdp": frozenset({"offload", "sharding"}),
    "deepspeed": frozenset({"stage", "offload_optimizer", "offload_param", "nvme_path", "ds_config"}),
}
COMMON_KEYS = frozenset({"engine", "lr", "weight_decay"})


def check_fsdp(o: dict[str, Any]) -> None:
    allowed = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD")
    if o["sharding"] not in allowed:
        raise StrategyError(f"fsdp option sharding={o['sharding']!r} is not one of {allowed}")


def check_deepspeed(o: dict[str, Any]) -> None:
    if o["stage"] not in (0, 1, 2, 3):
        raise StrategyError(f"deepspeed option stage={o['stage']!r} must be 0, 1, 2 or 3")
    for key in ("offload_optimizer", "offload_param"):
        if o[key] not in (None, "cpu", "nvme"):
            raise StrategyError(f"deepspeed option {key}={o[key]!r} must be None, 'cpu' or 'nvme'")
    if o["offload_param"] and o["stage"] != 3:
        raise StrategyError("deepspeed option offload_param needs stage=3")
    if o.get("zero_init") not in (None, True, False):
        raise StrategyError(f"deepspeed option zero_init={o['zero_init']!r} must be True or False")
    if o.get("zero_init") and o["stage"] != 3:
        raise StrategyError("deepspeed option zero_init (deepspeed.zero.Init) needs stage=3")
    check_user_config(o["ds_config"])


def wrap_targets(model: Any, ctx: Any, strategy: str) -> list[Any]:
    """The model's modules that are instances of the workload's wrap units, deepest first (a unit nested in
    another is wrapped before it); a clear error when the workload names none or none is in the model."""
    units = tuple(ctx.wrap_units)
    if not units:
        raise StrategyError(
            f"strategy {strategy!r} shards the model per module class (FSDP units / auto-wrap policy), and "
            f"{ctx.workload_name} names no wrap_units: give Workload(..., wrap_units=(MyBlock, ...)) with the "
            f"model's repeated blocks")
    depth: dict[int, int] = {}
    found = []
    for name, module in model.named_modules():
        if isinstance(module, units) and module is not model:
            depth[id(module)] = name.count(".")
            found.append(module)
    if not found:
        names = " or ".join(u.__name__ for u in units)
        raise StrategyError(f"strategy {strategy!r}: no module of the model is a {names} (the wrap_units of "
                            f"{ctx.workload_name})")
    return sorted(found, key=lambda m: -depth[id(m)])  # stable: siblings keep the model's order


def check_options(name: str, o: dict[str, Any], defaults: dict[str, Any]) -> None:
    """Reject an unknown engine, an option of another engine, and bad engine options."""
    engine = o["engine"]
    if engine not in ENGINES:
        raise StrategyError(f"{name} option engine={engine!r} is not one of {ENGINES}")
    foreign = sorted(k for k in o if k not in COMMON_KEYS | ENGINE_KEYS[engine] and o[k] != defaults.get(k))
    if foreign:
        raise StrategyError(f"{name} option(s) {', '.join(map(repr, foreign))} do not apply to engine={engine!r}; "
                            f"its options are: {', '.join(sorted(ENGINE_KEYS[engine] & set(defaults)))}")
    if engine == "fsdp":
        check_fsdp(o)
    if engine == "deepspeed":
        check_deepspeed(o)


def unsupported_reason(name: str, o: dict[str, Any], device: str) -> str | None:
    """Why this front-end + engine cannot run on this device, or None (found by running them)."""
    engine = o.get("engine", "ddp")
    if device != "cpu" or engine == "ddp":
        return None
    if name in ("lightning_trainer", "lightning_fabric"):
        if engine == "fsdp":
            return ("Lightning's FSDPStrategy needs CUDA: on CPU Lightning refuses it ('requires a GPU accelerator' / "
                    "'FSDP is only available on GPU'), and torch FSDP1 itself needs a non-CPU device")
        return ("Lightning's DeepSpeedStrategy needs CUDA: on CPU it raises 'The DeepSpeed strategy is only "
                "supported on CUDA GPUs but `CPUAccelerator` is used'")
    if name == "accelerate":
        return (f"Accelerate ignores its {'FSDP' if engine == 'fsdp' else 'DeepSpeed'} plugin on CPU: with "
                "Accelerator(cpu=True) the distributed type stays MULTI_CPU and prepare() wraps the model in plain "
                "DDP (accelerate/state.py switches to FSDP/DEEPSPEED only for GPU-class devices), so the plugin "
                "would not be measured")
    return None


# -- inside the ranks (torch imported lazily: this module is also read by the pytest process) -------------------

def node_layout(world_size: int) -> tuple[int, int]:
    """(devices per node, nodes) as torch elastic set them, for Lightning's devices/num_nodes."""
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    return local, max(1, world_size // local)


def fsdp_mixed_precision(ctx: Any) -> Any:
    """The FSDP1 adapters' policy: bf16 compute and fp32 gradient reduction where ctx.bf16."""
    import torch
    from torch.distributed.fsdp import MixedPrecision

    if not ctx.bf16:
        return None
    return MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32, buffer_dtype=torch.bfloat16)


def fsdp_wrap_policy(model: Any, ctx: Any, strategy: str) -> Any:
    """The FSDP1 adapters' wrapping: one FSDP unit per instance of the workload's wrap units."""
    import functools

    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

    wrap_targets(model, ctx, strategy)
    return functools.partial(transformer_auto_wrap_policy, transformer_layer_cls=set(ctx.wrap_units))


def split_optimizer(config: dict[str, Any], ctx: Any = None) -> tuple[dict[str, Any], Any]:
    """(config without "optimizer", a factory params -> the optimizer DeepSpeed would build from it).

    Lightning takes the optimizer from the user, so it is built here as DeepSpeed builds it from the config
    (engine._configure_basic_optimizer): torch AdamW for `torch_adam`, else DeepSpeedCPUAdam in AdamW mode with
    fp32 states (the only optimizer DeepSpeed accepts with offload).
    """
    config = copy.deepcopy(config)
    spec = config.pop("optimizer")
    if ctx is not None and ctx.optimizer is not None:  # the workload's own optimizer
        return config, ctx.optimizer
    if spec.get("type") != "AdamW":
        raise ValueError(f"ds_config optimizer type {spec.get('type')!r}: the Lightning adapters build AdamW only")
    params = dict(spec["params"])
    torch_adam = params.pop("torch_adam", False)
    kwargs = dict(lr=params["lr"], betas=params["betas"], eps=params["eps"],
                  weight_decay=params["weight_decay"])

    def make(parameters: Any) -> Any:
        if torch_adam:
            import torch

            return torch.optim.AdamW(parameters, **kwargs)
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        return DeepSpeedCPUAdam(parameters, adamw_mode=True, fp32_optimizer_states=True, **kwargs)

    return config, make


def default_process_group(ctx: Any = None) -> Any:
    """The process group the worker initialised; None when the front-end starts its own (launched as its
    users launch it)."""
    import torch.distributed as dist

    if ctx is not None and not ctx.controlled:
        return None
    return dist.distributed_c10d._get_default_group()


def check_launch(frontend: str, ctx: Any, group_before: Any, *, cluster_environment: Any, world_size: int,
                 rank: int) -> None:
    """Under the controlled launch the front-end reused torch elastic's ranks and process group; launched as
    its users launch it, Lightning started them itself."""
    ctx.extra["cluster_environment"] = type(cluster_environment).__name__
    if ctx.controlled:
        check_reused_ranks(frontend, group_before, cluster_environment=cluster_environment, world_size=world_size,
                           rank=rank)
        return
    from lightning.fabric.plugins.environments import LightningEnvironment

    if not isinstance(cluster_environment, LightningEnvironment):
        raise RuntimeError(f"{frontend} launched as its users launch it (python script.py) chose "
                           f"{type(cluster_environment).__name__}: the ranks were not started by Lightning's own "
                           "launcher")
    if (world_size, rank) != (ctx.world_size, ctx.rank):
        raise RuntimeError(f"{frontend} sees rank {rank} of {world_size}, the job has rank {ctx.rank} of "
                           f"{ctx.world_size}")


def check_reused_ranks(frontend: str, group_before: Any, *, cluster_environment: Any = None,
                       world_size: int | None = None, rank: int | None = None) -> None:
    """Fail loudly if the front-end started processes or a process group of its own."""
    if default_process_group() is not group_before:
        raise RuntimeError(f"{frontend} replaced the process group the worker initialised; "
                           "it must reuse the ranks torch elastic started")
    if cluster_environment is not None:
        from lightning.fabric.plugins.environments import TorchElasticEnvironment

        if not isinstance(cluster_environment, TorchElasticEnvironment):
            raise RuntimeError(f"{frontend} chose the cluster environment {type(cluster_environment).__name__}, "
                               "not TorchElasticEnvironment: it would launch ranks of its own "
                               "(is TORCHELASTIC_RUN_ID missing from the rank's environment?)")
    if world_size is not None and rank is not None:
        import torch.distributed as dist

        if (dist.get_world_size(), dist.get_rank()) != (world_size, rank):
            raise RuntimeError(f"{frontend} sees rank {rank} of {world_size}, the process group says "
                               f"{dist.get_rank()} of {dist.get_world_size()}")


def adamw(ctx: Any, lr: float, weight_decay: float) -> Any:
    """The raw DDP/FSDP adapters' optimizer (the workload's, or AdamW), as a factory over parameters."""
    return lambda params: ctx.make_optimizer(params, lr=lr, weight_decay=weight_decay)


def lightning_engine(ctx: Any, model: Any, options: dict[str, Any], *, fabric: bool) -> tuple[Any, str, Any, Any]:
    """(Lightning strategy, precision, model, optimizer factory) for the Trainer or Fabric, as the raw adapters.

    FSDP runs `32-true` plus fsdp.py's explicit MixedPrecision: Lightning's own `bf16-mixed` for FSDP would
    reduce gradients in bf16 and add autocast, a different configuration.
    """
    if fabric:
        from lightning.fabric.strategies import DDPStrategy, DeepSpeedStrategy, FSDPStrategy
    else:
        from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy, FSDPStrategy
    lr, wd, engine = options["lr"], options["weight_decay"], options["engine"]
    mixed = "bf16-mixed" if ctx.bf16 else "32-true"
    if engine == "ddp":
        return DDPStrategy(bucket_cap_mb=options["bucket_cap_mb"]), mixed, model, adamw(ctx, lr, wd)
    if engine == "fsdp":
        from torch.distributed.fsdp import CPUOffload, ShardingStrategy

        if options["offload"]:
            model = model.cpu()  # as fsdp.py: FSDP's CPU offload expects the unsharded module on the host
        name = "lightning_fabric" if fabric else "lightning_trainer"
        strategy = FSDPStrategy(auto_wrap_policy=fsdp_wrap_policy(model, ctx, name),
                                mixed_precision=fsdp_mixed_precision(ctx),
                                cpu_offload=CPUOffload(offload_params=True) if options["offload"] else None,
                                sharding_strategy=ShardingStrategy[options["sharding"]], use_orig_params=True)
        return strategy, "32-true", model, adamw(ctx, lr, wd)
    from pytest_distperf.strategies.ds_config import rank_config

    config, make_optimizer = split_optimizer(rank_config(ctx, **options), ctx)
    if not fabric:
        # The Trainer derives this from accumulate_grad_batches (1) and refuses it in the config.
        config.pop("gradient_accumulation_steps", None)
    return DeepSpeedStrategy(config=config), mixed, model, make_optimizer
