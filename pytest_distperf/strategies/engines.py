"""The engines' option checks (FSDP, DeepSpeed) and the sharding-unit lookup, shared by the raw adapters and the
front-ends (strategies/frontend.py) that drive the same engines. Import-light: no torch, no engine."""

from __future__ import annotations

from typing import Any

from pytest_distperf.errors import StrategyError


def check_fsdp(o: dict[str, Any]) -> None:
    allowed = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD")
    if o["sharding"] not in allowed:
        raise StrategyError(f"fsdp option sharding={o['sharding']!r} is not one of {allowed}")


def check_deepspeed(o: dict[str, Any]) -> None:
    from pytest_distperf.strategies.ds_config import check_user_config

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
