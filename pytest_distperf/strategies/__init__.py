"""Strategy adapters: one module each, one small interface.

A strategy module exposes ``build(model, ctx, **options) -> Trainer``. The option
tables live here, free of heavy imports, so the pytest process can reject an unknown
strategy or option before any rank is started.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Protocol

from pytest_distperf.errors import StrategyError

from pytest_distperf.strategies import frontend as _frontend  # import-light: option tables and checks

# name -> (module, {option: default}); every strategy also takes `lr`.
STRATEGIES: dict[str, tuple[str, dict[str, Any]]] = {
    "ddp": ("pytest_distperf.strategies.ddp", {"bucket_cap_mb": 25}),
    "fsdp": ("pytest_distperf.strategies.fsdp", {"offload": False, "sharding": "FULL_SHARD"}),
    "fsdp2": ("pytest_distperf.strategies.fsdp2", {"offload": False, "reshard_after_forward": True}),
    "deepspeed": (
        "pytest_distperf.strategies.deepspeed",
        {"stage": 3, "offload_optimizer": None, "offload_param": None, "nvme_path": None, "ds_config": {}},
    ),
    # Front-ends over the same engines (engine = ddp | fsdp | deepspeed); see strategies/frontend.py.
    "lightning_trainer": ("pytest_distperf.strategies.lightning_trainer", _frontend.FRONTEND_OPTIONS),
    "lightning_fabric": ("pytest_distperf.strategies.lightning_fabric", _frontend.FRONTEND_OPTIONS),
    "accelerate": ("pytest_distperf.strategies.accelerate", _frontend.FRONTEND_OPTIONS),
}
COMMON_OPTIONS: dict[str, Any] = {"lr": 1e-3, "weight_decay": 0.01}


def validate(name: str, options: dict[str, Any]) -> dict[str, Any]:
    """Return the options completed with defaults, or raise StrategyError naming the culprit."""
    if name not in STRATEGIES:
        raise StrategyError(f"unknown strategy {name!r}; known strategies: {', '.join(sorted(STRATEGIES))}")
    defaults = {**COMMON_OPTIONS, **STRATEGIES[name][1]}
    unknown = sorted(set(options) - set(defaults))
    if unknown:
        raise StrategyError(
            f"strategy {name!r} has no option(s) {', '.join(map(repr, unknown))}; "
            f"its options are: {', '.join(sorted(defaults))}"
        )
    merged = {**defaults, **options}
    checker = _CHECKS.get(name)
    if checker:
        checker(merged)
    return merged


def _check_fsdp(o: dict[str, Any]) -> None:
    allowed = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD")
    if o["sharding"] not in allowed:
        raise StrategyError(f"fsdp option sharding={o['sharding']!r} is not one of {allowed}")


def _check_deepspeed(o: dict[str, Any]) -> None:
    from pytest_distperf.strategies.ds_config import check_user_config

    if o["stage"] not in (0, 1, 2, 3):
        raise StrategyError(f"deepspeed option stage={o['stage']!r} must be 0, 1, 2 or 3")
    for key in ("offload_optimizer", "offload_param"):
        if o[key] not in (None, "cpu", "nvme"):
            raise StrategyError(f"deepspeed option {key}={o[key]!r} must be None, 'cpu' or 'nvme'")
    if o["offload_param"] and o["stage"] != 3:
        raise StrategyError("deepspeed option offload_param needs stage=3")
    check_user_config(o["ds_config"])


def unsupported_reason(name: str, options: dict[str, Any], device: str) -> str | None:
    """Why this strategy cannot run on this device (the test is skipped with it), or None."""
    if name == "fsdp" and device == "cpu":
        return ("torch FSDP1 (FullyShardedDataParallel) needs a CUDA device: on CPU it raises "
                "'FSDP needs a non-CPU accelerator device'; use fsdp2 (fully_shard) on CPU")
    if name in _FRONTENDS:
        return _frontend.unsupported_reason(name, options, device)
    return None


_CHECKS = {"fsdp": _check_fsdp, "deepspeed": _check_deepspeed}
_FRONTENDS = ("lightning_trainer", "lightning_fabric", "accelerate")
_CHECKS.update({name: (lambda o, name=name: _frontend.check_options(name, o, STRATEGIES[name][1]))
                for name in _FRONTENDS})


@dataclass
class RankContext:
    rank: int
    local_rank: int
    world_size: int
    device: Any  # torch.device
    micro_batch: int
    scratch_dir: str  # per-job temporary folder (NVMe offload files etc.)

    @property
    def bf16(self) -> bool:
        """Precision policy: bf16 compute with fp32 master weights on CUDA, fp32 on CPU."""
        return self.device.type == "cuda"


class Trainer(Protocol):
    def step(self, inputs: Any, targets: Any) -> Any:
        """One optimizer step; returns the loss tensor (not synchronised)."""

    def torch_optimizer(self) -> Any:
        """The torch optimizer that holds the state and the master weights."""


def build(name: str, model: Any, ctx: RankContext, options: dict[str, Any]) -> Trainer:
    module = importlib.import_module(STRATEGIES[name][0])
    return module.build(model, ctx, **options)


def import_strategy(name: str) -> None:
    """Import the strategy's libraries (so import time stays out of memory baselines)."""
    importlib.import_module(STRATEGIES[name][0])


def optimizer_state_bytes(optimizer: Any) -> int:
    """Bytes on this rank of the optimizer's state and of the (master) params it updates."""

    def nbytes(t: Any) -> int:
        local = t.to_local() if hasattr(t, "to_local") else t
        return local.numel() * local.element_size()

    # DeepSpeed's ZeRO-3 empties param_groups between steps and keeps the fp32 partitions
    # only as keys of `state`, so both places are read.
    params = [p for g in optimizer.param_groups for p in g["params"]] + list(optimizer.state.keys())
    seen: set[int] = set()
    total = 0
    for p in params:
        if hasattr(p, "numel") and id(p) not in seen:
            seen.add(id(p))
            total += nbytes(p)
    for state in optimizer.state.values():
        for v in state.values():
            if hasattr(v, "numel") and v.dim() > 0:
                total += nbytes(v)
    return total
