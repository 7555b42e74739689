"""Session settings (command line > ini > default) and each test's plan (marker > settings).

Each setting is declared once, as a field of Settings or ClusterSettings made with `setting()`: its name, type
(the annotation), default and help. plugin.py derives the command-line options and ini keys from `declared()`;
README's settings table is checked against it (tests/test_options.py). Plain logic over plain values, testable
without pytest.
"""

from __future__ import annotations

import importlib.util
import math
import os
import re
import shutil
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Sequence

from pytest_distperf.errors import ProbeError, SettingsError
from pytest_distperf.spec.probes import validate as validate_probes

DEVICE_CHOICES = ("auto", "cpu", "cuda")
LAUNCHERS = ("local", "torchrun", "slurm")
LOCAL_AGENT_STARTS = ("local", "srun")
# --distperf-lock-gpu-clocks: the GPU's default applications clock, or clocks locked outside pytest
CLOCKS_DEFAULT, CLOCKS_EXTERNAL = "default", "external"
# The most pairs (or candidate runs) a verdict may take.
MAX_LOOKS = 64
MARKER_KEYS = ("world_size", "device", "timeout", "repeats", "nodes", "max_repeats", "test_budget",
               # baseline gate overrides, validated in decide/policy.py:policy_for
               "time_threshold", "work_threshold", "memory_threshold", "memory_floor", "baseline_metrics",
               "probes",  # default probes of the test's jobs (pytest_distperf.spec.probes)
               "known_gap",  # {"cpu"|"cuda": "upstream issue + measured value"}: a strict xfail there
               "known_gap_strict")  # {"cpu"|"cuda": False}: a gap that comes and goes with the machine's load


def setting(default: Any, help: str, *, option: bool = True, ini: bool = True, carried: bool = False,
            metavar: str | None = None, const: str | None = None,
            check: Callable[[Any, str], Any] | None = None) -> Any:
    """A dataclass field that is a setting: a command-line option --distperf-<name> and/or an ini key
    distperf_<name>. carried: it picks the machine class or the jobs (the "accept this change" command repeats it);
    const: the option's value given without one; check: (value, where) -> value, instead of the type's check."""
    return field(default=default, metadata=dict(help=help, option=option, ini=ini, carried=carried, metavar=metavar,
                                                const=const, check=check))


@dataclass(frozen=True)
class Setting:
    """A declared setting, as plugin.py registers it and README's table shows it."""

    name: str
    type: str  # the field's annotation, e.g. "int | None"
    default: Any
    help: str
    option: bool
    ini: bool
    carried: bool
    metavar: str | None
    const: str | None
    check: Callable[[Any, str], Any] | None

    @property
    def flag(self) -> str:
        return "--distperf" if self.name == "enabled" else "--distperf-" + self.name.replace("_", "-")

    @property
    def dest(self) -> str:
        return "distperf" if self.name == "enabled" else "distperf_" + self.name

    def parse(self, value: Any, where: str) -> Any:
        if self.check is not None:
            return self.check(value, where)
        if value is None and self.type.endswith("| None"):
            return None
        kind = self.type.removesuffix(" | None")
        if kind == "bool":
            return _flag(value, where)
        if kind in ("int", "float"):
            return _positive(value, int if kind == "int" else float, where)
        return str(value)


def _positive(value: Any, kind: Callable[[Any], Any], where: str) -> Any:
    try:
        v = kind(value)
    except (TypeError, ValueError, OverflowError):  # int(inf) overflows
        v = 0
    # `not v > 0`, not `v <= 0`: NaN compares false both ways. inf is no count, limit or budget either (a budget's
    # "none" is the unset option), and True is no count (int(True) == 1).
    if (isinstance(value, bool) or not v > 0 or not math.isfinite(v)
            or (kind is int and isinstance(value, float) and not value.is_integer())):
        what = "a positive integer" if kind is int else "a positive number"
        raise SettingsError(f"{where}: expected {what}, got {value!r}") from None
    return v


_YES, _NO = ("true", "1", "yes", "on"), ("false", "0", "no", "off", "")


def _flag(value: Any, where: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _YES or text in _NO:
        return text in _YES
    raise SettingsError(f"{where}: expected true or false, got {value!r}")


def _choice(choices: tuple[str, ...]) -> Callable[[Any, str], str]:
    def check(value: Any, where: str) -> str:
        if value not in choices:
            raise SettingsError(f"{where}: expected one of {', '.join(choices)}, got {value!r}")
        return value

    return check


def _max_repeats(value: Any, where: str) -> int:
    n = _positive(value, int, where)
    if not 2 <= n <= MAX_LOOKS:
        raise SettingsError(f"{where}: expected a number of pairs from 2 to {MAX_LOOKS}, got {value!r}")
    return n


def parse_clock_setting(value: Any, where: str) -> str | int | None:
    """None (off), CLOCKS_DEFAULT, CLOCKS_EXTERNAL, or MHz from a command-line/ini value."""
    if value is None or value is False:
        return None
    text = str(value).strip().lower()
    if text in _NO:
        return None
    if text in _YES or text == CLOCKS_DEFAULT:
        return CLOCKS_DEFAULT
    if text == CLOCKS_EXTERNAL:
        return CLOCKS_EXTERNAL
    if text.isdigit():
        return int(text)
    hint = (" (argparse took a path as the option's value: write --distperf-lock-gpu-clocks=MHZ, or put the flag "
            "after the paths)" if os.path.exists(str(value)) else "")
    raise SettingsError(f"{where}: expected nothing (the default applications clock), a clock in MHz, 'external' "
                        f"(clocks locked outside pytest) or false; got {value!r}{hint}")


_ENDPOINT = re.compile(r"^(\[[0-9a-fA-F:.]+\]|[^:\s\[\]]+):(\d+)$")


def _endpoint(value: Any, where: str) -> str | None:
    match = _ENDPOINT.match(str(value)) if value is not None else None
    if value is not None and not (match and 0 < int(match.group(2)) < 65536):
        raise SettingsError(f"{where}: expected host:port (a host every node reaches, a port from 1 to 65535), "
                            f"got {value!r}")
    return value


def _agents(value: Any, where: str) -> str:
    if value not in LOCAL_AGENT_STARTS and "{command}" not in str(value):
        raise SettingsError(f"{where}: expected local, srun, or a command template with {{command}} "
                            f"(and optionally {{index}}), e.g. \"ssh node{{index}} {{command}}\"; got {value!r}")
    return str(value)


def _folder(value: Any, where: str) -> str | None:
    return os.path.abspath(os.path.expanduser(str(value))) if value else None


@dataclass(frozen=True)
class ClusterSettings:
    """Where ranks run: the launcher and its options (docs/cluster.md)."""

    launcher: str = setting("local", "local|torchrun|slurm: ranks on this host, on N torchrun node agents, or in "
                            "SLURM jobs", carried=True, check=_choice(LAUNCHERS))
    nodes: int = setting(1, "node agents per job (a test's distperf(nodes=N) wins); world size = ranks over all "
                         "nodes", carried=True)
    rdzv_endpoint: str | None = setting(None, "torchrun: HOST:PORT of the c10d rendezvous, reachable from every node "
                                        "(default 127.0.0.1:<free>)", carried=True, check=_endpoint)
    agents: str = setting("local", "torchrun: how agents 1..N-1 start: local (this host), srun (the allocation's "
                          "other nodes), or a command template with {command} (and {index}), e.g. "
                          "'ssh node{index} {command}'", carried=True, check=_agents)
    shared_dir: str | None = setting(None, "job folders here: a folder every node mounts under the same path (rank "
                                     "results come back there)", carried=True, check=_folder)
    # A cluster's SLURM facts live in the project's ini file (or -o distperf_slurm_...=...).
    slurm_partition: str | None = setting(None, "slurm: partition", option=False)
    slurm_account: str | None = setting(None, "slurm: account", option=False)
    slurm_time_limit: int | None = setting(None, "slurm: time limit in minutes (default: the job timeout + 3)",
                                           option=False)
    slurm_gpus_per_node: int | None = setting(None, "slurm: GPUs per node", option=False)
    slurm_cpus_per_task: int | None = setting(None, "slurm: CPUs per node agent (task)", option=False)
    slurm_agents_per_node: int = setting(1, "slurm: node agents (tasks) per SLURM node; >1 acts several nodes out "
                                         "on one host", option=False)
    fresh_agent: bool = setting(False, "true: a new launch agent (python, torch and the strategy libraries imported "
                                "again) for every job, instead of forking each job's agent from the session's warm "
                                "agent (launch/warm_pool.py)", option=False)


@dataclass(frozen=True)
class Settings:
    """The session's settings. A field made with setting() is a command-line option, an ini key or both."""

    enabled: bool = setting(False, "run distperf performance tests (else they are skipped)", ini=False)
    device: str = setting("auto", f"device for distperf jobs: {'|'.join(DEVICE_CHOICES)} (auto: CUDA+NCCL when "
                          f"enough GPUs, else CPU+gloo)", carried=True, check=_choice(DEVICE_CHOICES))
    # On the command line it overrides the markers' (world_size_override): a 1-GPU box runs 2-rank suites.
    world_size: int = setting(2, "default number of ranks per job (on the command line: of every job)", carried=True)
    timeout: float = setting(900.0, "wall-clock limit in seconds for one job (all ranks are ended on expiry)")
    repeats: int = setting(3, "runs per side in a comparison (interleaved A B A B ...)", carried=True)
    # adaptive repeats (decide/stopping.py)
    max_repeats: int = setting(12, "adaptive repeats: interleaved pairs (or runs) a verdict may grow to while "
                               "inconclusive", check=_max_repeats)
    test_budget: float = setting(600.0, "adaptive repeats: wall-clock seconds per test after which no further pair "
                                 "starts", option=False)
    session_budget: float | None = setting(
        None, "wall-clock seconds per pytest process (each xdist worker) after which no job starts (waits for the "
        "measurement slot not counted), nor a first look that would end past it at this session's runs of its jobs: "
        "bounds a CI gate's time; a test whose first look cannot start is skipped, "
        "out of budget (fails with --distperf-strict), undecided verdicts stay inconclusive")
    strict: bool = setting(False, "an inconclusive verdict (its interval holds the limit after the repeats allowed) "
                           "fails the test instead of warning")
    shape_cpu: str = setting("tiny", "built-in workload shape for CPU jobs", option=False)
    shape_cuda: str = setting("1b", "built-in workload shape for CUDA jobs", option=False)
    keep_jobs: bool = setting(False, "true: keep every job's folder (rank logs), not only those of failed jobs",
                              option=False)
    lock_gpu_clocks: str | int | None = setting(
        None, "lock the GPUs' clocks for the session (NVML, needs root; at the default applications clock, or "
        "=MHZ), unlocked when it ends; CUDA tests are skipped where that is refused. =external: they are locked "
        "outside pytest (nothing is locked, no warning that they are not)", metavar="MHZ|external",
        const=CLOCKS_DEFAULT, check=parse_clock_setting)
    # the baseline gate (decide/policy.py) and head vs base (decide/against.py)
    save: bool = setting(False, "record baselines for the distperf tests that ran and passed; other entries stay as "
                         "they are", ini=False)
    baselines: str | None = setting(None, "baselines folder (default: baselines/ at the rootdir; in the ini file "
                                    "relative to the rootdir); write --distperf-baselines=DIR", metavar="DIR")
    require_baseline: bool = setting(False, "fail tests with no baseline for this machine class ('new') or a changed "
                                     "config (for CI)", ini=False)
    fail_on_improvement: bool = setting(False, "true: fail when a metric improved beyond its threshold (keeps "
                                        "baselines fresh)", option=False)
    explain: bool = setting(False, "true: say what changed (operators/kernels) under every verdict, not only a "
                            "failed one", option=False)
    against: str | None = setting(None, "head vs base: every job also runs on REF's code (a git worktree of the "
                                  "merge base of REF and HEAD), interleaved in pairs, and each metric is decided on "
                                  "the pairs instead of against stored baselines", metavar="REF")
    against_exact: bool = setting(False, "with --distperf-against: compare against REF itself, not its merge base "
                                  "with HEAD", ini=False)
    # reports (store/outputs.py, session.py)
    json: str | None = setting(None, "write a JSON report: job configs, environment, per-rank metrics, checks, "
                               "verdicts", ini=False, metavar="PATH")
    benchmark_json: str | None = setting(None, "export step times in pytest-benchmark's JSON format (pytest-benchmark "
                                         "compare, github-action-benchmark)", ini=False, metavar="PATH")
    html: str | None = setting(None, "write one self-contained HTML report with plots (no network needed to open it)",
                               ini=False, metavar="PATH")
    pr_comment: str | None = setting(None, "write a pull-request comment: at most 25 lines of Markdown, every "
                                     "failing, inconclusive or improved metric listed", ini=False, metavar="PATH")
    html_url: str | None = setting(None, "where the HTML report will be, for the PR comment's link (default: "
                                   "$DISTPERF_HTML_URL)", ini=False, metavar="URL")
    history: str | None = setting(None, "append this session's results to a history database: a file path, "
                                  "sqlite:///RELATIVE/PATH, sqlite:////ABSOLUTE/PATH (four slashes) or "
                                  "postgresql://USER:PASSWORD@HOST:PORT/DB (`python -m "
                                  "pytest_distperf history URL` prints the trends and their change points)",
                                  ini=False, metavar="URL")
    cluster: ClusterSettings = field(default_factory=ClusterSettings)
    world_size_override: bool = False  # --distperf-world-size was given on the command line
    # where repeats / max_repeats were given ("--distperf-repeats=5", "ini option distperf_max_repeats=4"); "": the
    # default (first_look: a default repeats shrinks to max_repeats, a given one above it is an error)
    repeats_given: str = ""
    max_repeats_given: str = ""


def declared() -> list[Setting]:
    return [Setting(f.name, str(f.type), f.default, **f.metadata)
            for cls in (Settings, ClusterSettings) for f in fields(cls) if "help" in f.metadata]


# Options that pick the machine class or the jobs: repeated in the "accept this change" command.
CARRIED_OPTIONS = {s.flag: s.dest for s in declared() if s.carried and s.option}


@dataclass(frozen=True)
class TestPlan:
    device: str | None  # None: skipped, see skip_reason
    world_size: int
    timeout: float
    repeats: int
    skip_reason: str | None = None
    probes: tuple[str, ...] = ()  # distperf(probes=[...]): the default for every job the test builds
    known_gap: str | None = None  # on this device the check fails for a known upstream reason (strict xfail)
    known_gap_strict: bool = True  # False: a pass there is reported (XPASS), not failed
    max_repeats: int = 12  # adaptive repeats: see Settings
    test_budget: float = 600.0
    nodes: int = 1  # node agents the test's jobs run on (world_size ranks over them)

    def default_shape(self, settings: Settings) -> str:
        return settings.shape_cuda if self.device == "cuda" else settings.shape_cpu


def resolve_device(option: str, marker: str | None, world_size: int, gpus: int) -> tuple[str | None, str | None]:
    """(device, None) or (None, skip reason). marker: the test's own device= (None/auto: follow the option)."""
    follows = marker in (None, "auto")
    if marker == "cpu" or (follows and option == "cpu"):
        return "cpu", None
    if option == "cpu":
        return None, "this test needs CUDA, and --distperf-device=cpu was given"
    if 0 < world_size <= gpus:
        return "cuda", None
    if follows and option == "auto":
        return "cpu", None
    return None, (f"needs {world_size} GPU{'s' if world_size != 1 else ''} (world_size={world_size}); this machine "
                  f"has {gpus}")


def build_settings(enabled: bool, cli: dict[str, Any], ini: dict[str, Any], shapes: Sequence[str] = ()) -> Settings:
    """cli/ini map setting names to a value or None (unset). Each value is checked, naming where it came from;
    `shapes`: the built-in workload's shape names (rank/workload.py, beside torch: the plugin passes them where
    jobs will run), the default shapes' check; () skips it."""
    values: dict[str, Any] = {}
    where: dict[str, str] = {}
    for s in declared():
        if s.name == "enabled":
            continue
        if s.option and cli.get(s.name) not in (None, ""):
            value, where[s.name] = cli[s.name], s.flag
        elif s.ini and ini.get(s.name) not in (None, ""):
            value, where[s.name] = ini[s.name], f"ini option {s.dest}"
        else:
            value, where[s.name] = s.default, f"default {s.dest}"
        values[s.name] = s.parse(value, where[s.name])
    cluster = ClusterSettings(**{f.name: values.pop(f.name) for f in fields(ClusterSettings)})
    _check_cluster(cluster, where)
    if enabled and shapes:
        check_shapes(values, where, tuple(shapes))
    given = {name: "" if where[name].startswith("default") else f"{where[name]}={values[name]}"
             for name in ("repeats", "max_repeats")}
    values["repeats"] = first_look(values["repeats"], given["repeats"], values["max_repeats"],
                                   given["max_repeats"] or f"{where['max_repeats']}={values['max_repeats']}", "")
    return Settings(enabled=enabled, cluster=cluster, world_size_override=where["world_size"].startswith("--"),
                    repeats_given=given["repeats"], max_repeats_given=given["max_repeats"], **values)


SHAPE_SETTINGS = ("shape_cpu", "shape_cuda")


def check_shapes(values: dict[str, Any], where: dict[str, str], known: tuple[str, ...]) -> None:
    """Each default-shape setting names a shape: else a usage error naming the ini key, before any job (a test
    would otherwise fail in resolve_shape with a traceback that names no setting)."""
    for name in SHAPE_SETTINGS:
        if values[name] not in known:
            raise SettingsError(f"{where[name]}: unknown shape {values[name]!r}; known: {', '.join(known)}")


def first_look(repeats: int, repeats_given: str, max_repeats: int, max_repeats_given: str, where: str) -> int:
    """The first look's runs: the budget bounds it too. The default repeats shrink to max_repeats; repeats given
    (an option, ini key or marker argument: `repeats_given` names it, "" for the default) above it are an error,
    not a silent cut."""
    if repeats > max_repeats and repeats_given:
        raise SettingsError(f"{where}{repeats_given} is more than {max_repeats_given}: the first look's runs count "
                            f"toward the most a verdict may take; lower the one or raise the other")
    return min(repeats, max_repeats)


_ONLY = {"torchrun": ("rdzv_endpoint", "agents"),
         "slurm": tuple(f.name for f in fields(ClusterSettings) if f.name.startswith("slurm_"))}


def _check_cluster(cluster: ClusterSettings, where: dict[str, str]) -> None:
    launcher = cluster.launcher
    for owner, names in _ONLY.items():
        for name in names:
            if launcher != owner and not where[name].startswith("default"):
                raise SettingsError(f"{where[name]} is an option of the {owner} launcher; this run uses "
                                    f"{launcher!r} (--distperf-launcher {owner})")
    if cluster.nodes > 1 and launcher == "local":
        raise SettingsError(f"{where['nodes']}: {cluster.nodes} nodes need --distperf-launcher torchrun or slurm "
                            f"(the local launcher runs every rank on this host)")
    if launcher == "slurm":
        missing = [what for what, ok in (("the submitit package (pip install 'pytest-distperf[slurm]')",
                                          importlib.util.find_spec("submitit")),
                                         ("sbatch on PATH", shutil.which("sbatch"))) if not ok]
        if missing:
            raise SettingsError(f"{where['launcher']}: the slurm launcher needs {' and '.join(missing)}")


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
    by_name = {s.name: s for s in declared()}

    def marked(name: str, setting_value: Any) -> Any:
        if marker_kwargs.get(name) is None:
            return setting_value
        return by_name[name].parse(marker_kwargs[name], f"{where}: distperf({name}=...)")

    ws = marked("world_size", settings.world_size)  # checked also where the command line overrides it
    ws = settings.world_size if settings.world_size_override else ws
    timeout, test_budget = marked("timeout", settings.timeout), marked("test_budget", settings.test_budget)
    max_repeats = marked("max_repeats", settings.max_repeats)
    repeats = marked("repeats", settings.repeats)
    in_marker = {name: f"distperf({name}={value})" for name, value in (("repeats", repeats),
                                                                        ("max_repeats", max_repeats))
                 if marker_kwargs.get(name) is not None}
    repeats = first_look(repeats, in_marker.get("repeats", settings.repeats_given), max_repeats,
                         in_marker.get("max_repeats", settings.max_repeats_given or
                                       f"default distperf_max_repeats={max_repeats}"), f"{where}: ")
    nodes = marked("nodes", settings.cluster.nodes)
    if ws % nodes:
        raise SettingsError(f"{where}: world size {ws} does not split over {nodes} nodes "
                            f"(ranks per node = world size / nodes)")
    device, reason = resolve_device(settings.device, marked("device", None),  # None: follows --distperf-device
                                    *_nodes_and_gpus(settings.cluster, nodes, ws, gpus))
    if nodes > 1 and settings.cluster.launcher == "local":
        device, reason = None, (f"needs {nodes} nodes (distperf(nodes={nodes})): run it with --distperf-launcher "
                                f"torchrun or slurm")
    try:
        probes = validate_probes(marker_kwargs.get("probes"), f"{where}: distperf(probes=...)")
    except ProbeError as e:
        raise SettingsError(str(e)) from None
    gaps = marker_kwargs.get("known_gap") or {}
    if not isinstance(gaps, dict) or not all(k in ("cpu", "cuda") and v and isinstance(v, str)
                                             for k, v in gaps.items()):
        raise SettingsError(f"{where}: distperf(known_gap=...) must map 'cpu'/'cuda' to a non-empty reason "
                            f"(the upstream issue and the measured value), got {gaps!r}")
    strict = marker_kwargs.get("known_gap_strict") or {}
    if not isinstance(strict, dict) or not all(k in gaps and isinstance(v, bool) for k, v in strict.items()):
        raise SettingsError(f"{where}: distperf(known_gap_strict=...) must map a device of known_gap ("
                            f"{', '.join(map(repr, gaps)) or 'none declared'}) to True or False, got {strict!r}")
    return TestPlan(device=device, world_size=ws, timeout=timeout, repeats=repeats, skip_reason=reason,
                    probes=probes, known_gap=gaps.get(device) if device else None,
                    known_gap_strict=strict.get(device, True) if device else True, nodes=nodes,
                    max_repeats=max_repeats, test_budget=test_budget)
