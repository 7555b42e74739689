"""The launcher interface, and the one place that picks a launcher from the settings: `local` (one host,
launcher.py), `torchrun` (N node agents meeting through c10d, torchrun.py) or `slurm` (a SLURM job per distperf
job, slurm.py). Every launcher returns {rank: value} or raises JobError, RankFailed, JobTimeout or RankOutcome,
which outcomes.py turns into the test's outcome."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol

from pytest_distperf.spec.job import JobSpec
from pytest_distperf.spec.settings import LAUNCHERS


class Launcher(Protocol):
    name: str

    def launch(self, job: JobSpec, *, timeout: float, base_dir: str | None = None,
               on_progress: Callable[[str, float], None] | None = None, keep: bool = False,
               env: dict[str, str] | None = None) -> dict[int, Any]: ...

    def local_ranks(self, job: JobSpec) -> int:
        """Ranks of the job that run on this host (the GPUs it takes here)."""

    def inter_node(self) -> str:
        """What connects the job's nodes (fingerprint.inter_node), part of the machine class."""


@dataclass(frozen=True)
class LocalLauncher:
    """launcher.launch; each job's agent forked from the session's warm agent unless `fresh_agent`."""

    name: str = "local"
    fresh_agent: bool = False

    def launch(self, job: JobSpec, *, timeout: float, base_dir: str | None = None,
               on_progress: Callable[[str, float], None] | None = None, keep: bool = False,
               env: dict[str, str] | None = None) -> dict[int, Any]:
        from pytest_distperf.launch.launcher import launch

        return launch(job, timeout=timeout, base_dir=base_dir, on_progress=on_progress, keep=keep, env=env,
                      fresh_agent=self.fresh_agent)

    def local_ranks(self, job: JobSpec) -> int:
        return job.world_size

    def inter_node(self) -> str:
        return "none"


def make_launcher(cluster: Any, nodes: int) -> Launcher:
    """The launcher for a test: `cluster` is config.ClusterSettings, `nodes` the test's node count."""
    if cluster.launcher == "local":
        return LocalLauncher(fresh_agent=getattr(cluster, "fresh_agent", False))
    if cluster.launcher == "torchrun":
        from pytest_distperf.launch.torchrun import TorchrunLauncher

        return TorchrunLauncher(nodes=nodes, rdzv_endpoint=cluster.rdzv_endpoint, agents=cluster.agents,
                                shared_dir=cluster.shared_dir)
    if cluster.launcher == "slurm":
        from pytest_distperf.launch.slurm import SlurmLauncher

        return SlurmLauncher(nodes=nodes, partition=cluster.slurm_partition, account=cluster.slurm_account,
                             gpus_per_node=cluster.slurm_gpus_per_node, cpus_per_task=cluster.slurm_cpus_per_task,
                             time_limit_min=cluster.slurm_time_limit, agents_per_node=cluster.slurm_agents_per_node,
                             shared_dir=cluster.shared_dir)
    raise ValueError(f"unknown launcher {cluster.launcher!r}; expected one of {', '.join(LAUNCHERS)}")
