"""Session settings (command line > ini > default) and each test's plan (marker > settings).

Plain logic over plain values, testable without pytest.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
from dataclasses import dataclass, field
from typing import Any, Callable

from pytest_distperf.errors import ProbeError, SettingsError
from pytest_distperf.spec.probes import validate as validate_probes

DEVICE_CHOICES = ("auto", "cpu", "cuda")
LAUNCHERS = ("local", "torchrun", "slurm")
# --distperf-lock-gpu-clocks: the GPU's default applications clock (else its max graphics clock), or clocks locked
# outside pytest (launch/gpuclocks acts on them)
CLOCKS_DEFAULT, CLOCKS_EXTERNAL = "default", "external"
# The most looks (pairs, or candidate runs) a verdict may take: decide/decision.py designs its boundaries up to it.
MAX_LOOKS = 64

DEFAULTS: dict[str, Any] = {
    "device": "auto",
    "world_size": 2,
    "timeout": 900.0,
    "repeats": 3,
    "shape_cpu": "tiny",
    "shape_cuda": "1b",
    "lock_gpu_clocks": None,  # --distperf-lock-gpu-clocks (launch/gpuclocks.py)
    # adaptive repeats (decide/stopping.py): interleaved pairs (or runs) at most, and wall-clock seconds per test
    "max_repeats": 12,
    "test_budget": 600.0,
    "session_budget": None,  # wall-clock seconds per pytest process; none by default
    "strict": False,  # an INCONCLUSIVE verdict fails the test
    # where ranks run (launch/base.py): one host, torchrun node agents, or SLURM jobs
    "launcher": "local",
    "nodes": 1,
    "rdzv_endpoint": None,
    "agents": "local",
    "shared_dir": None,
    "slurm_partition": None,
    "slurm_account": None,
    "slurm_time_limit": None,
    "slurm_gpus_per_node": None,
    "slurm_cpus_per_task": None,
    "slurm_agents_per_node": 1,
    "fresh_agent": False,  # a new launch agent per job instead of the session's warm agent (launch/warm_pool.py)
}
MARKER_KEYS = ("world_size", "device", "timeout", "repeats", "nodes", "max_repeats", "test_budget",
               # baseline gate overrides, validated in decide/policy.py:policy_for
               "time_threshold", "time_k", "work_threshold", "memory_threshold", "memory_floor", "baseline_metrics",
               "probes",  # default probes of the test's jobs (pytest_distperf.spec.probes)
               "known_gap")  # {"cpu"|"cuda": "upstream issue + measured value"}: a strict xfail there


@dataclass(frozen=True)
class ClusterSettings:
    """Where ranks run: the launcher and its options (docs/cluster.md). Read by launch/base.make_launcher."""

    launcher: str = "local"  # local | torchrun | slurm
    nodes: int = 1  # node agents per job, unless the test's marker says nodes=N
    rdzv_endpoint: str | None = None  # torchrun: host:port of the c10d rendezvous (default 127.0.0.1:<free>)
    agents: str = "local"  # torchrun: how agents 1..N-1 start: local | srun | a template with {command}
    shared_dir: str | None = None  # job folders, on a file system every node mounts under the same path
    slurm_partition: str | None = None
    slurm_account: str | None = None
    slurm_time_limit: int | None = None  # minutes
    slurm_gpus_per_node: int | None = None
    slurm_cpus_per_task: int | None = None
    slurm_agents_per_node: int = 1  # node agents (SLURM tasks) per SLURM node
    fresh_agent: bool = False  # local launcher: a new agent process per job, not one forked from the warm agent


@dataclass(frozen=True)
class Settings:
    enabled: bool
    device: str
    world_size: int
    timeout: float
    repeats: int
    shape_cpu: str
    shape_cuda: str
    keep_jobs: bool = False
    lock_gpu_clocks: str | int | None = None  # None | "default" | MHz | "external" (launch/gpuclocks.py)
    max_repeats: int = 12  # pairs (or runs) a verdict may grow to while INCONCLUSIVE
    test_budget: float = 600.0  # wall-clock seconds per test after which no further pair is started
    session_budget: float | None = None  # wall-clock seconds per session after which no job starts
    strict: bool = False  # an INCONCLUSIVE verdict fails the test (--distperf-strict)
    cluster: ClusterSettings = field(default_factory=ClusterSettings)
    # --distperf-world-size given on the command line: it overrides the markers' world_size (ini and default
    # do not); how a 1-GPU box runs suites written for 2 ranks on its GPU
    world_size_override: bool = False


@dataclass(frozen=True)
class TestPlan:
    device: str | None  # None: skipped, see skip_reason
    world_size: int
    timeout: float
    repeats: int
    skip_reason: str | None = None
    probes: tuple[str, ...] = ()  # distperf(probes=[...]): the default for every job the test builds
    known_gap: str | None = None  # on this device the check fails for a known upstream reason (strict xfail)
    max_repeats: int = 12  # adaptive repeats: see Settings
    test_budget: float = 600.0
    nodes: int = 1  # node agents the test's jobs run on (world_size ranks over them)

    def default_shape(self, settings: Settings) -> str:
        return settings.shape_cuda if self.device == "cuda" else settings.shape_cpu


def _positive(value: Any, kind: Callable[[Any], Any], where: str) -> Any:
    what = "a positive integer" if kind is int else "a positive number"
    if kind is int and isinstance(value, float) and not value.is_integer():
        raise SettingsError(f"{where}: expected {what}, got {value!r}")
    try:
        v = kind(value)
    except (TypeError, ValueError):
        raise SettingsError(f"{where}: expected {what}, got {value!r}") from None
    if v <= 0:
        raise SettingsError(f"{where}: expected {what}, got {value!r}")
    return v


def parse_clock_setting(value: Any, where: str) -> str | int | None:
    """None (off), CLOCKS_DEFAULT, CLOCKS_EXTERNAL, or MHz from a command-line/ini value."""
    if value is None or value is False:
        return None
    text = str(value).strip().lower()
    if text in ("", "false", "0", "no", "off"):
        return None
    if text in ("true", "1", "yes", "on", CLOCKS_DEFAULT):
        return CLOCKS_DEFAULT
    if text == CLOCKS_EXTERNAL:
        return CLOCKS_EXTERNAL
    if text.isdigit():
        return int(text)
    hint = (" (argparse took a path as the option's value: write --distperf-lock-gpu-clocks=MHZ, or put the flag "
            "after the paths)" if os.path.exists(str(value)) else "")
    raise SettingsError(f"{where}: expected nothing (the default applications clock), a clock in MHz, 'external' "
                        f"(clocks locked outside pytest) or false; got {value!r}{hint}")


def resolve_device(option: str, marker: str | None, world_size: int, gpus: int) -> tuple[str | None, str | None]:
    """Return (device, None) or (None, skip reason).

    option: --distperf-device (auto|cpu|cuda); marker: the test's own device= (None/auto: follow the option;
    cpu: always CPU; cuda: the test needs GPUs).
    """
    if marker in (None, "auto"):
        if option == "cpu":
            return "cpu", None
        if option == "auto":
            return ("cuda", None) if gpus >= world_size > 0 and gpus > 0 else ("cpu", None)
        return ("cuda", None) if gpus >= world_size else (None, _too_few(world_size, gpus))
    if marker == "cpu":
        return "cpu", None
    if option == "cpu":
        return None, "this test needs CUDA, and --distperf-device=cpu was given"
    return ("cuda", None) if gpus >= world_size else (None, _too_few(world_size, gpus))


def _too_few(world_size: int, gpus: int) -> str:
    return f"needs {world_size} GPU{'s' if world_size != 1 else ''} (world_size={world_size}); this machine has {gpus}"


def _max_repeats(value: Any, where: str) -> int:
    n = _positive(value, int, where)
    if not 2 <= n <= MAX_LOOKS:
        raise SettingsError(f"{where}: expected a number of pairs from 2 to {MAX_LOOKS}, got {value!r}")
    return n


def first_look(repeats: int, max_repeats: int) -> int:
    """Pairs (or runs) a verdict starts with: the budget bounds every verdict's pairs, its first look included."""
    return min(repeats, max_repeats)


def _flag(value: Any, where: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes", "on"):
        return True
    if text in ("false", "0", "no", "off", ""):
        return False
    raise SettingsError(f"{where}: expected true or false, got {value!r}")


def _device(value: Any, where: str) -> str:
    if value not in DEVICE_CHOICES:
        raise SettingsError(f"{where}: expected one of {', '.join(DEVICE_CHOICES)}, got {value!r}")
    return value


def build_settings(enabled: bool, cli: dict[str, Any], ini: dict[str, Any], keep_jobs: bool = False) -> Settings:
    """cli/ini map each setting name to a value or None (unset)."""

    def pick(name: str) -> tuple[Any, str]:
        flag = "--distperf-" + name.replace("_", "-")
        if cli.get(name) not in (None, ""):
            return cli[name], flag
        if ini.get(name) not in (None, ""):
            return ini[name], f"ini option distperf_{name}"
        return DEFAULTS[name], f"default distperf_{name}"

    device, where = pick("device")
    ws, ws_where = pick("world_size")
    timeout, t_where = pick("timeout")
    repeats, r_where = pick("repeats")
    shape_cpu, _ = pick("shape_cpu")
    shape_cuda, _ = pick("shape_cuda")
    clocks = parse_clock_setting(*pick("lock_gpu_clocks"))
    max_repeats, m_where = pick("max_repeats")
    test_budget, b_where = pick("test_budget")
    session_budget, sb_where = pick("session_budget")
    strict, s_where = pick("strict")
    adaptive = dict(max_repeats=_max_repeats(max_repeats, m_where), test_budget=_positive(test_budget, float, b_where),
                    session_budget=None if session_budget is None else _positive(session_budget, float, sb_where),
                    strict=_flag(strict, s_where))
    return Settings(enabled=enabled, device=_device(device, where), world_size=_positive(ws, int, ws_where),
                    timeout=_positive(timeout, float, t_where),
                    repeats=first_look(_positive(repeats, int, r_where), adaptive["max_repeats"]),
                    shape_cpu=str(shape_cpu), shape_cuda=str(shape_cuda), keep_jobs=keep_jobs, lock_gpu_clocks=clocks,
                    cluster=build_cluster(pick), world_size_override=ws_where.startswith("--"), **adaptive)


LOCAL_AGENT_STARTS = ("local", "srun")
_ENDPOINT = re.compile(r"^(\[[0-9a-fA-F:.]+\]|[^:\s\[\]]+):(\d+)$")
_TORCHRUN_ONLY = ("rdzv_endpoint", "agents")
_SLURM_ONLY = ("slurm_partition", "slurm_account", "slurm_time_limit", "slurm_gpus_per_node", "slurm_cpus_per_task",
               "slurm_agents_per_node")


def build_cluster(pick: Callable[[str], tuple[Any, str]]) -> ClusterSettings:
    """The launcher options, each checked against the launcher that uses it (docs/cluster.md)."""
    launcher, where = pick("launcher")
    if launcher not in LAUNCHERS:
        raise SettingsError(f"{where}: expected one of {', '.join(LAUNCHERS)}, got {launcher!r}")
    for names, owner in ((_TORCHRUN_ONLY, "torchrun"), (_SLURM_ONLY, "slurm")):
        for name in names:
            value, name_where = pick(name)
            if launcher != owner and not name_where.startswith("default"):
                raise SettingsError(f"{name_where} is an option of the {owner} launcher; this run uses "
                                    f"{launcher!r} (--distperf-launcher {owner})")
    nodes_value, nodes_where = pick("nodes")
    nodes = _positive(nodes_value, int, nodes_where)
    if nodes > 1 and launcher == "local":
        raise SettingsError(f"{nodes_where}: {nodes} nodes need --distperf-launcher torchrun or slurm "
                            f"(the local launcher runs every rank on this host)")
    endpoint, endpoint_where = pick("rdzv_endpoint")
    match = _ENDPOINT.match(str(endpoint)) if endpoint is not None else None
    if endpoint is not None and not (match and 0 < int(match.group(2)) < 65536):
        raise SettingsError(f"{endpoint_where}: expected host:port (a host every node reaches, a port from 1 to "
                            f"65535), got {endpoint!r}")
    agents, agents_where = pick("agents")
    if agents not in LOCAL_AGENT_STARTS and "{command}" not in str(agents):
        raise SettingsError(f"{agents_where}: expected local, srun, or a command template with {{command}} "
                            f"(and optionally {{index}}), e.g. \"ssh node{{index}} {{command}}\"; got {agents!r}")
    shared, _ = pick("shared_dir")

    def optional_positive(name: str) -> int | None:
        value, name_where = pick(name)
        return None if value is None else _positive(value, int, name_where)

    per_node, per_node_where = pick("slurm_agents_per_node")
    cluster = ClusterSettings(
        launcher=launcher, nodes=nodes, rdzv_endpoint=endpoint, agents=str(agents),
        shared_dir=os.path.abspath(os.path.expanduser(str(shared))) if shared else None,
        slurm_partition=pick("slurm_partition")[0], slurm_account=pick("slurm_account")[0],
        slurm_time_limit=optional_positive("slurm_time_limit"),
        slurm_gpus_per_node=optional_positive("slurm_gpus_per_node"),
        slurm_cpus_per_task=optional_positive("slurm_cpus_per_task"),
        slurm_agents_per_node=_positive(per_node, int, per_node_where), fresh_agent=_flag(*pick("fresh_agent")))
    if launcher == "slurm":
        missing = [what for what, ok in (("the submitit package (pip install 'pytest-distperf[slurm]')",
                                          importlib.util.find_spec("submitit")),
                                         ("sbatch on PATH", shutil.which("sbatch"))) if not ok]
        if missing:
            raise SettingsError(f"{where}: the slurm launcher needs {' and '.join(missing)}")
    return cluster


def _nodes_and_gpus(cluster: ClusterSettings, nodes: int, ws: int, gpus: int) -> tuple[int, int]:
    """(GPUs a CUDA job needs, GPUs it can have): on this host, except under SLURM (per SLURM node)."""
    if cluster.launcher == "slurm":
        return ws // nodes * cluster.slurm_agents_per_node, cluster.slurm_gpus_per_node or 0
    if cluster.launcher == "torchrun" and cluster.agents != "local":
        return ws // nodes, gpus  # agent 0's share here; the other nodes alike
    return ws, gpus


def plan_test(settings: Settings, marker_kwargs: dict[str, Any], gpus: int, where: str) -> TestPlan:
    unknown = sorted(set(marker_kwargs) - set(MARKER_KEYS))
    if unknown:
        raise SettingsError(f"{where}: @pytest.mark.distperf has no argument(s) {unknown}; "
                            f"it takes {', '.join(MARKER_KEYS)}")
    if "world_size" in marker_kwargs:  # checked also where the command line overrides it
        _positive(marker_kwargs["world_size"], int, f"{where}: distperf(world_size=...)")
    ws = (settings.world_size if getattr(settings, "world_size_override", False)
          else _positive(marker_kwargs.get("world_size", settings.world_size), int,
                         f"{where}: distperf(world_size=...)"))
    timeout = _positive(marker_kwargs.get("timeout", settings.timeout), float, f"{where}: distperf(timeout=...)")
    repeats = _positive(marker_kwargs.get("repeats", settings.repeats), int, f"{where}: distperf(repeats=...)")
    max_repeats = _max_repeats(marker_kwargs.get("max_repeats", settings.max_repeats),
                               f"{where}: distperf(max_repeats=...)")
    test_budget = _positive(marker_kwargs.get("test_budget", settings.test_budget), float,
                            f"{where}: distperf(test_budget=...)")
    repeats = first_look(repeats, max_repeats)
    nodes = _positive(marker_kwargs.get("nodes", settings.cluster.nodes), int, f"{where}: distperf(nodes=...)")
    if ws % nodes:
        raise SettingsError(f"{where}: world size {ws} does not split over {nodes} nodes "
                            f"(ranks per node = world size / nodes)")
    marker_device = marker_kwargs.get("device")
    if marker_device is not None:
        _device(marker_device, f"{where}: distperf(device=...)")
    device, reason = resolve_device(settings.device, marker_device, *_nodes_and_gpus(settings.cluster, nodes, ws, gpus))
    if nodes > 1 and settings.cluster.launcher == "local":
        device, reason = None, (f"needs {nodes} nodes (distperf(nodes={nodes})): run it with --distperf-launcher "
                                f"torchrun or slurm")
    try:
        probes = validate_probes(marker_kwargs.get("probes"), f"{where}: distperf(probes=...)")
    except ProbeError as e:
        raise SettingsError(str(e)) from None
    gaps = marker_kwargs.get("known_gap") or {}
    if not isinstance(gaps, dict) or not all(k in ("cpu", "cuda") and isinstance(v, str) and v for k, v in gaps.items()):
        raise SettingsError(f"{where}: distperf(known_gap=...) must map 'cpu'/'cuda' to a non-empty reason "
                            f"(the upstream issue and the measured value), got {gaps!r}")
    return TestPlan(device=device, world_size=ws, timeout=timeout, repeats=repeats, skip_reason=reason,
                    probes=probes, known_gap=gaps.get(device) if device else None, nodes=nodes,
                    max_repeats=max_repeats, test_budget=test_budget)
