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
    """(device, why) for the session's default world size, as `--distperf-device` resolves it."""
    ws = settings.world_size
    if settings.device == "cpu":
        return "cpu", "--distperf-device=cpu"
    if settings.device == "cuda":
        return "cuda", f"--distperf-device=cuda, {_gpus(gpus)} visible"
    return "cuda" if gpus >= ws else "cpu", f"auto: {_gpus(gpus)} visible, tests need {ws}"


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
    if getattr(settings, "world_size_override", False):
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
    from pytest_distperf.launch.fingerprint import machine_class
    from pytest_distperf.launch.devices import visible_gpu_count

    gpus = visible_gpu_count()
    device, why = device_reason(settings, gpus)
    shape = settings.shape_cuda if device == "cuda" else settings.shape_cpu
    lines = [f"distperf: device {device} ({why}); world size {settings.world_size}; shape {shape}; "
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
    if cluster.launcher == "local":
        machine = machine_class(device, settings.world_size)
    else:
        from pytest_distperf.launch.base import make_launcher

        machine = machine_class(device, settings.world_size, cluster.nodes,
                                make_launcher(cluster, cluster.nodes).inter_node())
        lines.append(f"distperf: launcher {cluster.launcher}, {cluster.nodes} node agent(s) a job"
                     + (f" (agents {cluster.agents})" if cluster.launcher == "torchrun" else "")
                     + (f"; job folders in {cluster.shared_dir}" if cluster.shared_dir else ""))
    lines.append(f"distperf: machine class {machine.name}; {', '.join(stack)}")
    lines.append(agent_line(settings))
    if gate is not None:
        mode = "save" if gate.settings.save else "compare"
        lines.append(f"distperf: baselines {gate.settings.baselines_dir} ({mode})")
    return lines
