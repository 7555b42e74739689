"""Strategy adapters: one module each, one small protocol (docs/adapters.md), the built-in ones and a library's
alike. A strategy is a `registry.Strategy` record (BUILTIN below, an entry point, or `register()`); the records
are import-light, so the pytest process rejects an unknown strategy or option before any rank is started.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from pytest_distperf.strategies import frontend as _frontend
from pytest_distperf.strategies.frontend import check_deepspeed, check_fsdp, wrap_targets
from pytest_distperf.strategies.registry import COMMON_OPTIONS, Registry, Strategy, StrategyError, validate_options

__all__ = ["BUILTIN", "COMMON_OPTIONS", "RankContext", "REGISTRY", "Strategy", "StrategyError",
           "register", "unregister", "validate", "unsupported_reason", "adapter_module", "wrap_targets",
           "optimizer_state_bytes"]


def _unsupported_fsdp(options: dict[str, Any], device: str) -> str | None:
    if device == "cpu":
        return ("torch FSDP1 (FullyShardedDataParallel) needs a CUDA device: on CPU it raises "
                "'FSDP needs a non-CPU accelerator device'; use fsdp2 (fully_shard) on CPU")
    return None


def _frontend_strategy(name: str, user_launch: str) -> Strategy:
    return Strategy(name=name, adapter=f"pytest_distperf.strategies.{name}", options=_frontend.FRONTEND_OPTIONS,
                    check=lambda o: _frontend.check_options(name, o, _frontend.FRONTEND_OPTIONS),
                    unsupported=lambda o, device: _frontend.unsupported_reason(name, o, device),
                    user_launch=user_launch)


BUILTIN: dict[str, Strategy] = {s.name: s for s in (
    Strategy("ddp", "pytest_distperf.strategies.ddp", {"bucket_cap_mb": 25}),
    Strategy("fsdp", "pytest_distperf.strategies.fsdp", {"offload": False, "sharding": "FULL_SHARD"},
             check=check_fsdp, unsupported=_unsupported_fsdp),
    Strategy("fsdp2", "pytest_distperf.strategies.fsdp2", {"offload": False, "reshard_after_forward": True}),
    Strategy("deepspeed", "pytest_distperf.strategies.deepspeed",
             {"stage": 3, "offload_optimizer": None, "offload_param": None, "nvme_path": None, "ds_config": {},
              "zero_init": False},
             check=check_deepspeed, user_launch="deepspeed"),
    # Front-ends over the same engines (engine = ddp | fsdp | deepspeed).
    _frontend_strategy("lightning_trainer", "lightning"),
    _frontend_strategy("lightning_fabric", "lightning"),
    _frontend_strategy("accelerate", "accelerate"),
)}
REGISTRY = Registry(BUILTIN)
register, unregister = REGISTRY.register, REGISTRY.unregister


def validate(name: str, options: dict[str, Any]) -> dict[str, Any]:
    """Return the options completed with defaults, or raise StrategyError naming the culprit."""
    return validate_options(REGISTRY.get(name), options)


def unsupported_reason(name: str, options: dict[str, Any], device: str) -> str | None:
    """Why this strategy cannot run on this device (the test is skipped with it), or None."""
    strategy = REGISTRY.get(name)
    return strategy.unsupported(options, device) if strategy.unsupported else None


def adapter_module(name: str) -> str:
    return REGISTRY.get(name).adapter


@dataclass
class RankContext:
    rank: int
    local_rank: int
    world_size: int
    device: Any  # torch.device
    micro_batch: int
    scratch_dir: str  # per-job temporary folder (NVMe offload files etc.)
    launch: str = "controlled"  # the launch profile (pytest_distperf.spec.profiles)
    # From the workload (pytest_distperf.spec.workloads.Workload):
    precision: str = "auto"
    wrap_units: tuple[type, ...] = ()  # module classes that are sharding units
    optimizer: Callable[[Any], Any] | None = None  # the workload's optimizer factory, or None: AdamW
    workload_name: str = "the workload"  # for messages
    extra: dict[str, Any] = field(default_factory=dict)  # what the adapter reports back (RankResult.extra)

    @property
    def bf16(self) -> bool:
        """Precision policy: bf16 compute with fp32 master weights on CUDA, fp32 on CPU or for an fp32 workload."""
        return self.device.type == "cuda" and self.precision == "auto"

    @property
    def controlled(self) -> bool:
        """The harness started the ranks and the process group (else the framework's own launcher does)."""
        return self.launch != "lightning"

    def make_optimizer(self, params: Any, *, lr: float, weight_decay: float) -> Any:
        """The workload's optimizer, or the strategies' AdamW(lr, weight_decay)."""
        if self.optimizer is not None:
            return self.optimizer(params)
        import torch

        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)


def optimizer_state_bytes(optimizer: Any) -> int:
    """Bytes on this rank of the optimizer's state and of the (master) params it updates."""

    def nbytes(t: Any) -> int:
        local = t.to_local() if hasattr(t, "to_local") else t
        return local.numel() * local.element_size()

    # DeepSpeed's ZeRO-3 empties param_groups between steps and keeps the fp32 partitions only as keys of `state`.
    params = [p for g in optimizer.param_groups for p in g["params"]] + list(optimizer.state.keys())
    unique = {id(p): p for p in params if hasattr(p, "numel")}
    states = [v for state in optimizer.state.values() for v in state.values() if hasattr(v, "numel") and v.dim() > 0]
    return sum(nbytes(t) for t in [*unique.values(), *states])
