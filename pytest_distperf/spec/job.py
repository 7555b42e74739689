"""What a job is: dataclasses of builtins that cross from pytest to the ranks (pickled) and into reports and
baselines (as JSON)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any


def runs_deepspeed(strategy: str | None, options: dict[str, Any]) -> bool:
    """A DeepSpeed strategy, or a front-end on the DeepSpeed engine."""
    return "deepspeed" in (strategy, options.get("engine"))


@dataclass(frozen=True)
class FunctionRef:
    """A module-level function named by where it lives, resolved inside each rank."""

    module: str
    qualname: str
    file: str | None = None


def file_sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


@dataclass(frozen=True)
class ScriptRef:
    """A user's training script run unchanged by its own launcher (distperf.script_job)."""

    path: str  # absolute, in this checkout
    name: str  # the path as the job's identity knows it: relative to the rootdir, the same in every checkout
    args: tuple[str, ...] = ()
    launcher: str = "torchrun"  # spec/profiles.py SCRIPT_LAUNCHERS
    env: tuple[tuple[str, str], ...] = ()
    cwd: str | None = None
    sha256: str = ""  # the file's, when the job was built: reported beside the job, not part of its key


@dataclass
class JobSpec:
    """One job on N ranks: a strategy on a workload (the built-in GPT or a user's factory), a user's own
    step (`step`), or a user function (`function`, run_function)."""

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
    # Phases after timing: the probes over `probe_steps` profiled steps; the work phase's steps per pass (0: none).
    probes: tuple[str, ...] = ()
    probe_steps: int = 3
    work_steps: int = 2
    # This run also measures what one run of a job suffices for (the breakdown, the exact counts): a job's first.
    measure_once: bool = True
    # A user's workload factory instead of the built-in GPT, and its arguments.
    workload: FunctionRef | None = None
    workload_kwargs: dict[str, Any] = field(default_factory=dict)
    # A user's step factory (distperf.step_job): its (args, kwargs) are `args` and `kwargs` above.
    step: FunctionRef | None = None
    # How the ranks are started: "controlled" or "as_user", and the launch profile that resolves to.
    launch: str = "controlled"
    launch_profile: str = "controlled"
    # Resolved by the pytest process for the ranks (which may not know a strategy a conftest registered); not part
    # of the configuration: the strategy's name and given options are.
    adapter: str | None = None
    full_options: dict[str, Any] = field(default_factory=dict)
    # A user's training script (distperf.script_job): its optimizer steps are the steps.
    script: ScriptRef | None = None

    @property
    def backend(self) -> str:
        return "nccl" if self.device == "cuda" else "gloo"

    @property
    def runs_deepspeed(self) -> bool:
        return runs_deepspeed(self.strategy, self.full_options or self.options)

    def describe(self) -> str:
        launch = f" as_user:{self.launch_profile}" if self.launch != "controlled" else ""
        if self.script is not None:
            args = "".join(f" {a}" for a in self.script.args)
            env = "".join(f" {k}={v}" for k, v in self.script.env)
            return f"{self.script.launcher}{env} {self.script.name}{args} x{self.world_size} {self.device}"
        if self.function is not None:
            return f"{self.function.qualname} x{self.world_size} {self.device}"
        if self.step is not None:
            args = [repr(a) for a in self.args] + [f"{k}={v!r}" for k, v in sorted(self.kwargs.items())]
            call = f"({', '.join(args)})" if args else ""
            return f"step:{self.step.module}:{self.step.qualname}{call} x{self.world_size} {self.device}{launch}"
        opts = ",".join(f"{k}={v}" for k, v in sorted(self.options.items()) if k != "ds_config" and v is not None)
        work = self.shape
        if self.workload is not None:
            kw = ",".join(f"{k}={v}" for k, v in sorted(self.workload_kwargs.items()))
            work = f"{self.workload.module}:{self.workload.qualname}" + (f"({kw})" if kw else "")
        return f"{self.strategy}[{opts}] {work} x{self.world_size} {self.device}{launch}".replace("[]", "")

    def config_dict(self, ignore_shape_fields: tuple[str, ...] = ()) -> dict[str, Any]:
        """The parts of the job that decide what is measured. ignore_shape_fields: shape overrides left out (the
        baseline key ignores the knobs that inject a slowdown: it reads as a regression of the same job)."""
        if self.script is not None:
            # Not its hash (a changed script is gated against its baseline) nor its cwd (which differs by checkout).
            s = self.script
            return {"world_size": self.world_size, "device": self.device, "warmup_steps": self.warmup_steps,
                    "steps": self.steps, "script": {"name": s.name, "args": list(s.args), "launcher": s.launcher,
                                                    "env": dict(s.env)},
                    **({"probes": list(self.probes), "probe_steps": self.probe_steps} if self.probes else {})}
        d = asdict(self)
        # Bookkeeping goes, and fields at their defaults: a job that does not use them keeps its hash (and baseline).
        for k in ("sys_path", "progress", "adapter", "full_options", "work_steps", "measure_once", "script",
                  *(() if self.probes else ("probes", "probe_steps"))):
            d.pop(k)
        for k, default in (("workload", None), ("workload_kwargs", {}), ("step", None),
                           ("launch", "controlled"), ("launch_profile", "controlled")):
            if d[k] == default:
                d.pop(k)
            elif k in ("workload", "step"):  # by name: the file's path differs between checkouts
                d[k] = {"module": d[k]["module"], "qualname": d[k]["qualname"]}
        if self.workload is not None or self.step is not None:  # no built-in shape in these jobs
            d.pop("shape")
            d.pop("shape_overrides")
            return d
        d["shape_overrides"] = {k: v for k, v in d["shape_overrides"].items() if k not in ignore_shape_fields}
        return d

    def config_hash(self, ignore_shape_fields: tuple[str, ...] = ()) -> str:
        blob = json.dumps(self.config_dict(ignore_shape_fields), sort_keys=True, default=repr).encode()
        return hashlib.sha256(blob).hexdigest()[:16]
