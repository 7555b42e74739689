"""How a job's ranks are started: the harness's controlled launch, or "as_user", the launch profile of the job's
strategy (Strategy.user_launch). The profiles differ in who starts the ranks, intra-op threads per rank and CPU
pinning. A user's own OMP_NUM_THREADS wins in every profile, as it does for each of these launchers.
"""

from __future__ import annotations

from dataclasses import dataclass

from pytest_distperf.errors import UsageError

LAUNCH_CHOICES = ("controlled", "as_user")


@dataclass(frozen=True)
class LaunchProfile:
    name: str
    starter: str  # "elastic": the harness's agent runs torch elastic; "script": the framework starts the rest
    threads: str  # "cores_per_rank" | "one" | "torch_default" | "accelerate" | "framework"
    pin_cpu: bool  # CPU jobs: each rank on its own slice of the cores


PROFILES: dict[str, LaunchProfile] = {p.name: p for p in (
    LaunchProfile("controlled", "elastic", "cores_per_rank", True),  # the harness's: CPU ranks pinned
    LaunchProfile("torchrun", "elastic", "one", False),  # OMP_NUM_THREADS=1 with more than one rank
    LaunchProfile("deepspeed", "elastic", "torch_default", False),  # no thread setting: a thread per core a rank
    LaunchProfile("accelerate", "elastic", "accelerate", False),
    LaunchProfile("lightning", "script", "framework", False),  # `python script.py`: Lightning starts the rest
    LaunchProfile("script", "script", "framework", False),  # a user's script through its own launcher (script_job)
)}


# A script job's launcher (distperf.script_job) for `n` ranks on this host: the arguments after `python`.
SCRIPT_LAUNCHERS = {
    "torchrun": lambda n, device: ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}"],
    "python": lambda n, device: [],  # the script's framework starts its other ranks (Lightning's Trainer)
    "deepspeed": lambda n, device: ["-m", "deepspeed.launcher.runner", f"--num_gpus={n}"],
    # --multi_gpu is accelerate's torchrun path on CPU too (its --cpu spreads ranks only through mpirun); a CPU
    # job's ranks see no GPU, so the script's own device choice lands on the CPU
    "accelerate": lambda n, device: ["-m", "accelerate.commands.launch", *(["--multi_gpu"] if n > 1 else []),
                                     f"--num_processes={n}"],
}


def check_choice(launch: object, where: str) -> str:
    if launch not in LAUNCH_CHOICES:
        raise UsageError(f"{where}: launch={launch!r} is not one of {', '.join(map(repr, LAUNCH_CHOICES))}")
    return str(launch)


def resolve(launch: str, user_launch: str) -> LaunchProfile:
    return PROFILES["controlled" if launch == "controlled" else user_launch]


def thread_environment(profile: LaunchProfile, env: dict[str, str], local_ranks: int, device: str,
                       cores: int, physical_cores: int) -> dict[str, str]:
    """OMP_NUM_THREADS as this profile's launcher sets it (a value the user set is kept)."""
    if "OMP_NUM_THREADS" in env:
        return {}
    if profile.threads == "cores_per_rank":
        return {"OMP_NUM_THREADS": str(max(1, cores // max(1, local_ranks)))}
    if profile.threads == "one" and local_ranks > 1:
        return {"OMP_NUM_THREADS": "1"}
    if profile.threads == "accelerate":
        if device == "cpu":
            per_rank = physical_cores // max(1, local_ranks)
            return {"OMP_NUM_THREADS": str(per_rank if per_rank > 1 else 1)}
        return {"OMP_NUM_THREADS": "1"}
    return {}  # torch_default, framework: left unset
