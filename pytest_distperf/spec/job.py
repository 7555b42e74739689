"""What a job is: dataclasses of builtins that cross from pytest to the ranks (pickled) and into reports and
baselines (as JSON).

A job's label (`describe()`) names it in every report and keys its baseline. Two jobs of one test whose labels
would read the same although their configurations differ (`job("ddp")` and `job("ddp", steps=5)`) are told apart:
by the test's `LabelScope` (the `distperf` fixture holds one) the first job keeps its label and each later one
gets the fields it differs in (`ddp tiny x2 cpu steps=5`, `label_difference`). A job that no other job of its test
is confused with keeps its label as it always was, so its baselines stay where they are.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, replace
from typing import Any

# Fault-injection knobs of the workload: left out of the config hash on purpose, so an injected
# slowdown reads as a regression (as a code change would), not as "not comparable"; their own label suffix
# (store/baselines.injection_suffix) names them.
INJECTION_FIELDS = ("extra_work",)


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
    # What tells this job from an earlier job of its test whose label reads the same (" steps=5"); set by the
    # test's LabelScope, not part of the configuration.
    label_suffix: str = ""

    @property
    def backend(self) -> str:
        return "nccl" if self.device == "cuda" else "gloo"

    @property
    def runs_deepspeed(self) -> bool:
        return runs_deepspeed(self.strategy, self.full_options or self.options)

    def describe(self) -> str:
        """The job's label: what it runs, then (label_suffix) how it differs from an earlier job of its test that
        would read the same."""
        return self.base_label() + self.label_suffix

    def base_label(self) -> str:
        """The label from what the job runs alone: strategy, options, workload, world size, device, launch."""
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
        for k in ("sys_path", "adapter", "full_options", "work_steps", "measure_once", "script",
                  "label_suffix",
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


    def label_config(self) -> dict[str, Any]:
        """The configuration as a baseline stores it (JSON types, injection knobs left out): what label
        differences are read from, here and in a stored baseline (store/baselines.py)."""
        return json.loads(json.dumps(self.config_dict(INJECTION_FIELDS), sort_keys=True, default=repr))


# -- telling apart jobs that read the same --------------------------------------------------------------------
# Field names as the job()/step_job() keywords give them.
_KEYWORDS = {"warmup_steps": "warmup"}
# Containers whose keys are the job's own words: shown without the container's name.
_FLAT = ("options", "shape_overrides", "workload_kwargs", "kwargs")
_MOST_SHOWN = 3
_VALUE_CHARS = 24
_UNSET = object()  # a key the other configuration lacks


def _differing(old: Any, new: Any, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    """(path, new value) where `new` differs from `old`; a key one side lacks once, where it is missing
    (_UNSET: `new` lacks it)."""
    if isinstance(old, dict) and isinstance(new, dict):
        return [d for k in sorted(set(old) | set(new), key=str)
                for d in _differing(old.get(k, _UNSET), new.get(k, _UNSET), path + (str(k),))]
    return [] if old == new else [(path, new)]


def _shown(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, separators=(",", ":"), default=repr)
    if len(text) > _VALUE_CHARS:
        text = text[:_VALUE_CHARS - 9] + "~" + hashlib.sha256(text.encode()).hexdigest()[:8]
    return text


def label_difference(first: dict[str, Any], config: dict[str, Any]) -> str:
    """' steps=5 warmup=1': the fields where `config` differs from `first` (both label_config()s), each as its
    keyword (an option's or a shape field's name alone, a nested one by its path), at most four (else three and a
    count of the rest); '' where they do not differ."""
    parts = []
    for path, value in _differing(first, config):
        shown = path[1:] if len(path) > 1 and path[0] in _FLAT else path
        name = ".".join(_KEYWORDS.get(p, p) for p in shown) or "config"
        parts.append(f"{name}=(unset)" if value is _UNSET else f"{name}={_shown(value)}")
    if len(parts) > _MOST_SHOWN + 1:  # "+1 more" would take the room of the one it leaves out
        parts = parts[:_MOST_SHOWN] + [f"+{len(parts) - _MOST_SHOWN} more"]
    return "".join(f" {p}" for p in parts)


class LabelScope:
    """One test's jobs by label: the first of a label keeps it, a later one with another configuration gets its
    label_difference from the first (and ' #n' should that read the same as another's too)."""

    def __init__(self) -> None:
        self._firsts: dict[str, dict[str, Any]] = {}  # base label -> the first job's label_config
        self._suffixes: dict[tuple[str, str], str] = {}  # (base label, config hash) -> suffix
        self._taken: set[str] = set()  # full labels given out

    def label(self, job: JobSpec) -> JobSpec:
        """`job` with its label told apart from the test's earlier jobs'."""
        return replace(job, label_suffix=self.suffix_for(job))

    def suffix_for(self, job: JobSpec) -> str:
        base, config = job.base_label(), job.label_config()
        key = (base, hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest())
        if key in self._suffixes:
            return self._suffixes[key]
        first = self._firsts.setdefault(base, config)
        suffix = label_difference(first, config)
        n, unique = 1, suffix
        while base + unique in self._taken:
            n += 1
            unique = f"{suffix} #{n}"
        self._suffixes[key] = unique
        self._taken.add(base + unique)
        return unique
