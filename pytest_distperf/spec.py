"""What a job is: plain data that crosses the process boundary from pytest to the ranks.

Everything here is a dataclass of builtins so it pickles for the local launcher and
turns into JSON for reports and baselines.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any

@dataclass(frozen=True)
class FunctionRef:
    """A module-level function named by where it lives, resolved inside each rank."""

    module: str
    qualname: str
    file: str | None = None


@dataclass
class JobSpec:
    """One job: a strategy on the built-in workload, or a user function, on N ranks."""

    world_size: int
    device: str  # "cpu" or "cuda"
    strategy: str | None = None  # None when `function` is set
    options: dict[str, Any] = field(default_factory=dict)
    shape: str = "tiny"
    shape_overrides: dict[str, Any] = field(default_factory=dict)
    warmup_steps: int = 3
    steps: int = 10
    seed: int = 1234
    function: FunctionRef | None = None
    args: tuple = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    sys_path: list[str] = field(default_factory=list)
    progress: bool = False
    # Probe phase after timing (pytest_distperf.probes): which probes, over how many profiled steps.
    probes: tuple[str, ...] = ()
    probe_steps: int = 3

    @property
    def backend(self) -> str:
        return "nccl" if self.device == "cuda" else "gloo"

    def describe(self) -> str:
        if self.function is not None:
            return f"{self.function.qualname} x{self.world_size} {self.device}"
        opts = ",".join(f"{k}={v}" for k, v in sorted(self.options.items()) if k != "ds_config" and v is not None)
        return f"{self.strategy}[{opts}] {self.shape} x{self.world_size} {self.device}".replace("[]", "")

    def config_dict(self, ignore_shape_fields: tuple[str, ...] = ()) -> dict[str, Any]:
        """The parts of the job that decide what is measured (not where or how it is launched).

        ignore_shape_fields: shape overrides left out, e.g. the baseline key ignores the knobs that inject
        a slowdown, so an injected slowdown reads as a regression of the same job, like a code change would.
        """
        d = asdict(self)
        for k in ("sys_path", "progress"):
            d.pop(k)
        if not self.probes:  # jobs without probes keep the hash they had before probes existed
            d.pop("probes")
            d.pop("probe_steps")
        d["shape_overrides"] = {k: v for k, v in d["shape_overrides"].items() if k not in ignore_shape_fields}
        return d

    def config_hash(self, ignore_shape_fields: tuple[str, ...] = ()) -> str:
        blob = json.dumps(self.config_dict(ignore_shape_fields), sort_keys=True, default=repr).encode()
        return hashlib.sha256(blob).hexdigest()[:16]
