"""The lines distperf adds to pytest's session header: device and why, machine class, stack, baselines.

Read in the pytest process without torch or CUDA: versions from package metadata, GPUs from NVML.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from pytest_distperf.launch.fingerprint import dist_version
from pytest_distperf.spec.settings import Settings, TestPlan

if TYPE_CHECKING:
    from pytest_distperf.decide.regression import GateSession

STACK = ("torch", "deepspeed", "lightning", "accelerate")
NCCL_PACKAGES = ("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11")


def _gpus(n: int) -> str:
    return f"{n} GPU{'s' if n != 1 else ''}"


def device_reason(settings: Settings, gpus: int) -> tuple[str, str]:
    """(device, why) for the session's default world size, as `--distperf-device` resolves it. Said before the
    tests are collected: a marker's world_size may differ, unless the command line overrides it."""
    ws = settings.world_size
    if settings.device == "cpu":
        return "cpu", "--distperf-device=cpu"
    if settings.device == "cuda":
        return "cuda", f"--distperf-device=cuda, {_gpus(gpus)} visible"
    need = (f"tests need {ws}" if settings.world_size_override
            else f"a test of world size {ws} needs {ws}")
    return "cuda" if gpus >= ws else "cpu", f"auto: {_gpus(gpus)} visible, {need}"


def _planned(plans: Sequence[TestPlan]) -> list[TestPlan]:
    """The tests that will run (a skipped test's plan has no device)."""
    return [p for p in plans if p.device is not None]


def _count(items: Sequence[object], what: str) -> str:
    return f"{len(items)} {what}{'s' if len(items) != 1 else ''}"


def world_size_text(settings: Settings, plans: Sequence[TestPlan] = ()) -> str:
    """'world size 2', 'world size 1-4 by test' for the planned tests; before collection the default, said as
    one that a test's marker may override (the command line's is every test's)."""
    planned = _planned(plans)
    if planned:
        sizes = sorted({p.world_size for p in planned})
        return f"world size {sizes[0]}" if len(sizes) == 1 else f"world size {sizes[0]}-{sizes[-1]} by test"
    if settings.world_size_override:
        return f"world size {settings.world_size}"
    return f"world size {settings.world_size} by default (a test's distperf(world_size=N) sets its own)"


def machine_classes(settings: Settings, plans: Sequence[TestPlan] = (), device: str = "cpu") -> list[str]:
    """The machine classes (baseline folders) of the planned tests, each once with how many tests use it; before
    collection the class of the default world size on `device`."""
    from pytest_distperf.launch.fingerprint import machine_class

    cluster = settings.cluster

    def name(dev: str, ws: int, nodes: int) -> str:
        if cluster.launcher == "local":
            return machine_class(dev, ws).name
        from pytest_distperf.launch.base import make_launcher

        return machine_class(dev, ws, nodes, make_launcher(cluster, nodes).inter_node()).name

    planned = _planned(plans)
    if not planned:
        return [name(device, settings.world_size, cluster.nodes)]
    counts: dict[str, int] = {}
    for p in planned:
        key = name(p.device or device, p.world_size, p.nodes)
        counts[key] = counts.get(key, 0) + 1
    return [f"{c} ({n} test{'s' if n != 1 else ''})" if len(counts) > 1 else c for c, n in counts.items()]


def collection_lines(settings: Settings, plans: Sequence[TestPlan]) -> list[str]:
    """After collection (pytest_report_collectionfinish, with the selected items' plans): the world sizes,
    devices and machine classes the selected tests use, which the header, written before collection, can only
    give as defaults. [] without --distperf or a planned test."""
    planned = _planned(plans)
    if not settings.enabled or not planned:
        return []
    devices = sorted({p.device for p in planned if p.device})
    classes = machine_classes(settings, planned)
    return [f"distperf: the {_count(planned, 'selected test')} to run: {world_size_text(settings, planned)}, "
            f"device {'/'.join(devices)}; machine class{'es' if len(classes) != 1 else ''} {', '.join(classes)}"]


def looks_line(settings: Settings, plans: Sequence[TestPlan] = ()) -> str:
    """The design's planned looks and, with a session budget, how it is shared and that it bounds the session."""
    from pytest_distperf.decide.decision import Design
    from pytest_distperf.decide.sequential import planned_looks

    looks = planned_looks(settings.max_repeats, settings.repeats)
    others = sorted({planned_looks(p.max_repeats, p.repeats) for p in plans if p.device is not None} - {looks})
    level = Design().confidence
    line = (f"distperf: verdicts look at {', '.join(map(str, looks))} pairs (runs), {level:.0%} intervals over "
            f"all looks (Pocock-type spending)"
            + (f"; markers also plan {'; '.join(', '.join(map(str, o)) for o in others)}" if others else ""))
    if settings.session_budget:
        tests = sum(1 for p in plans if p.device is not None)
        line += (f"; the {settings.session_budget:g} s session budget is shared: every test gets its first two looks "
                 f"within it, a third or later look only within the time left less a reserve for each later test "
                 f"(the median of what the tests' looks have taken so far{f'; {tests} tests collected' if tests else ''})"
                 f"; no job starts past it (waits for the measurement slot not counted, each xdist worker its own), "
                 f"nor a first look that would end past it at this session's runs of the same jobs: a test whose "
                 f"first look cannot start is skipped, out of budget")
    return line


def gpu_use_lines(settings: Settings, gpus: int, device: str) -> list[str]:
    """GPUs present but left idle, and how to use them; or that the command line's world size overrides the
    markers'."""
    ws = settings.world_size
    lines = []
    if settings.world_size_override:
        lines.append(f"distperf: world size {ws} from the command line, over every marker's world_size")
    if gpus and device == "cpu":
        if settings.device == "cpu":
            how = "--distperf-device=cpu was given; drop it (or --distperf-device=auto) to use them"
        else:
            how = (f"jobs need {ws} ranks, one GPU each; run them on the GPU{'s' if gpus != 1 else ''} with "
                   f"--distperf-world-size {gpus} (the command line overrides the markers' world_size)")
        lines.append(f"distperf: {_gpus(gpus)} visible but unused: {how}")
    return lines


def agent_line(settings: Settings) -> str:
    """How each job's launch agent starts: forked from the session's warm agent, or why a new one per job."""
    cluster = settings.cluster
    if cluster.launcher != "local":
        return (f"distperf: agent: the {cluster.launcher} launcher's own node agents, a new set per job (a warm agent "
                f"serves the local launcher only)")
    if getattr(cluster, "fresh_agent", False):
        return "distperf: agent: fresh, a new agent process per job (distperf_fresh_agent = true)"
    return ("distperf: agent: warm (one per device kind and environment imports torch and the strategy libraries "
            "once and holds no CUDA context; each run's agent and ranks are forked from it as new processes; jobs "
            "launched as Lightning's users launch them start their own; distperf_fresh_agent: a new agent a job)")


def header_lines(settings: Settings, gate: "GateSession | None", plans: Sequence[TestPlan] = ()) -> list[str]:
    if not settings.enabled:
        return ["distperf: off (performance tests are skipped; run with --distperf)"]
    from pytest_distperf.launch.devices import visible_gpu_count

    gpus = visible_gpu_count()
    device, why = device_reason(settings, gpus)
    shape = settings.shape_cuda if device == "cuda" else settings.shape_cpu
    lines = [f"distperf: device {device} ({why}); {world_size_text(settings, plans)}; shape {shape}; "
             f"{settings.repeats} runs a side, up to {settings.max_repeats} pairs while inconclusive "
             f"({settings.test_budget:g} s a test" + (f", {settings.session_budget:g} s a session"
                                                      if settings.session_budget else "")
             + f"); job timeout {settings.timeout:g} s", looks_line(settings, plans)]
    lines += gpu_use_lines(settings, gpus, device)
    stack = [f"{name} {v}" for name in STACK if (v := dist_version(name))]
    nccl = next((v for p in NCCL_PACKAGES if (v := dist_version(p))), None)
    if device == "cuda" and nccl:
        stack.append(f"nccl {nccl}")
    cluster = settings.cluster
    if cluster.launcher != "local":
        lines.append(f"distperf: launcher {cluster.launcher}, {cluster.nodes} node agent(s) a job"
                     + (f" (agents {cluster.agents})" if cluster.launcher == "torchrun" else "")
                     + (f"; job folders in {cluster.shared_dir}" if cluster.shared_dir else ""))
    classes = machine_classes(settings, plans, device)
    line = f"distperf: machine class{'es' if len(classes) != 1 else ''} {', '.join(classes)}; {', '.join(stack)}"
    if not (_planned(plans) or settings.world_size_override):
        # before collection: the default world size's class; a test of another world size saves under its own
        line += (f"; that class is world size {settings.world_size}'s: a test of another world size uses its own "
                 f"(...-ws<N>)")
    lines.append(line)
    lines.append(agent_line(settings))
    if gate is not None:
        mode = "save" if gate.settings.save else "compare"
        lines.append(f"distperf: baselines {gate.settings.baselines_dir} ({mode})")
    return lines
