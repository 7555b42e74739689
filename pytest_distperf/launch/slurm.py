"""The SLURM launcher: each job is a SLURM job submitted with submitit, one task per node agent (agents/node.py),
whose result comes back through submitit; values and logs are in the shared job folder. The timeout counts from
the moment SLURM starts the job (the queue wait is bounded apart); on expiry, Ctrl-C or any error the job is
cancelled and waited for until it has left the queue.
"""

from __future__ import annotations

import math
import os
import subprocess
import time
from dataclasses import dataclass
from typing import Any, Callable

from pytest_distperf.errors import JobError, JobTimeout, UsageError
from pytest_distperf.launch import jobfiles, nodes
from pytest_distperf.launch.devices import CPU_ONLY_ENVIRONMENT, usable_cores
from pytest_distperf.launch.launcher import agent_environment
from pytest_distperf.launch.torchrun import node_agent_command, request_stacks
from pytest_distperf.spec.job import JobSpec

POLL_SECONDS = 0.25
PEER_GRACE_SECONDS = 10.0  # after one agent reported a failure, how long the others get before scancel
CANCEL_WAIT_SECONDS = 30.0  # how long scancel may take to clear the job from the queue
SIGNAL_BEFORE_LIMIT_SECONDS = 30
ACTIVE_STATES = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING")


@dataclass
class NodeTaskReport:
    """What one SLURM task returns through submitit: how its node agent ended, and its result."""

    agent: int
    host: str
    exitcode: int
    result: jobfiles.AgentResult | None  # None: the agent died before writing one


def run_node_agent(job_dir: str, env: dict[str, str]) -> NodeTaskReport:
    """Runs inside each SLURM task: one node agent, agent index = the task's SLURM_PROCID."""
    import socket

    agent = int(os.environ["SLURM_PROCID"])
    environment = {**os.environ, **env}
    if "OMP_NUM_THREADS" not in environment:  # this node's cores (its CPU share in SLURM) over its ranks
        plan = jobfiles.read_node_plan(job_dir)
        cores = usable_cores()
        if os.environ.get("SLURM_CPUS_PER_TASK", "").isdigit():
            cores = min(cores, int(os.environ["SLURM_CPUS_PER_TASK"]))
        environment["OMP_NUM_THREADS"] = str(max(1, cores // plan.nproc_per_node))
    with open(jobfiles.agent_log(job_dir, agent), "wb") as log:
        proc = subprocess.run(node_agent_command(job_dir, agent), env=environment, stdin=subprocess.DEVNULL,
                              stdout=log, stderr=subprocess.STDOUT)
    return NodeTaskReport(agent=agent, host=socket.gethostname(), exitcode=proc.returncode,
                          result=jobfiles.read_agent_result(job_dir, agent))


@dataclass
class SlurmLauncher:
    nodes: int  # node agents (SLURM tasks); SLURM nodes = nodes / agents_per_node
    partition: str | None = None
    account: str | None = None
    gpus_per_node: int | None = None
    cpus_per_task: int | None = None
    time_limit_min: int | None = None  # SLURM's --time; default: the job timeout, rounded up, + 3 min
    agents_per_node: int = 1  # >1 only to act several nodes on one host (a one-host test cluster)
    shared_dir: str | None = None
    queue_timeout: float = 900.0  # how long a job may wait in the queue before it is cancelled
    name: str = "slurm"

    def launch(self, job: JobSpec, *, timeout: float, base_dir: str | None = None,
               on_progress: Callable[[str, float], None] | None = None, keep: bool = False,
               env: dict[str, str] | None = None) -> dict[int, Any]:
        import submitit

        if self.nodes % self.agents_per_node:
            raise UsageError(f"{self.nodes} node agents do not split into {self.agents_per_node} per SLURM node")
        plan = nodes.plan_nodes(job, self.nodes, endpoint=None)
        job_dir = jobfiles.new_node_job_dir(job, plan, base_dir, self.shared_dir)
        executor = submitit.AutoExecutor(folder=os.path.join(job_dir, "slurm"), cluster="slurm")
        executor.update_parameters(**self._parameters(job, timeout))
        # On top of what sbatch exports: the job's import path, not the one-host defaults (run_node_agent sets
        # threads from its own node).
        agent_env = {k: v for k, v in agent_environment(job, env, loopback=False).items()
                     if k in ("PYTHONPATH", "PYTHONUNBUFFERED") or k in (env or {})
                     or (job.device == "cpu" and k in CPU_ONLY_ENVIRONMENT)}  # a CPU job's ranks see no GPU there too
        submitted = executor.submit(run_node_agent, job_dir, agent_env)
        slurm_id = str(submitted.job_id)
        where = f"SLURM job {slurm_id}, {self.nodes} node agents"
        with jobfiles.dropped_on_success(job_dir, keep):
            try:
                self._watch(job, job_dir, submitted, timeout, on_progress, where)
                reports = {a: _report(submitted.task(a)) for a in range(self.nodes)}
                exits = {a: nodes.AgentExit(agent=a, host=r.host if r else None, exitcode=r.exitcode if r else None,
                                            log=_task_log(submitted, a, job_dir)) for a, r in reports.items()}
                return nodes.collect(job, job_dir, exits, where,
                                     results={a: r.result if r else None for a, r in reports.items()})
            finally:
                cancel(slurm_id)  # no-op when it has ended; Ctrl-C and errors land here too

    def local_ranks(self, job: JobSpec) -> int:
        return 0  # every rank runs where SLURM puts it

    def inter_node(self) -> str:
        from pytest_distperf.launch.fingerprint import inter_node

        return inter_node(self.nodes, one_host=self.nodes == self.agents_per_node)

    def _parameters(self, job: JobSpec, timeout: float) -> dict[str, Any]:
        params: dict[str, Any] = {
            "nodes": self.nodes // self.agents_per_node, "tasks_per_node": self.agents_per_node,
            # SLURM's own limit is a backstop behind distperf's timeout, which cancels the job first.
            "timeout_min": self.time_limit_min or math.ceil(timeout / 60) + 3,
            # submitit asks for SIGUSR2 this long before the limit, and SLURM may send it up to 60 s earlier
            # still; submitit's handler then aborts the task. Kept well after distperf's own timeout.
            "slurm_signal_delay_s": SIGNAL_BEFORE_LIMIT_SECONDS,
            "name": f"distperf-{job.strategy or (job.function.qualname if job.function else 'job')}",
            # a task that dies takes the step down with it; the others are not left waiting for it
            "slurm_srun_args": ["--kill-on-bad-exit=1"],
        }
        optional = {"cpus_per_task": self.cpus_per_task, "gpus_per_node": self.gpus_per_node,
                    "slurm_partition": self.partition, "slurm_account": self.account}
        return {**params, **{k: v for k, v in optional.items() if v}}

    def _watch(self, job: JobSpec, job_dir: str, submitted: Any, timeout: float,
               on_progress: Callable[[str, float], None] | None, where: str) -> None:
        submitted_at = time.monotonic()
        started_at: float | None = None
        failed_since: float | None = None
        last = None
        while True:
            state = queue_state(str(submitted.job_id))
            if state is None:
                return  # left the queue: done, failed or cancelled; the task reports say which
            now = time.monotonic()
            if state != "PENDING" and started_at is None:
                started_at = now
            if started_at is None and now - submitted_at > self.queue_timeout:
                cancel(str(submitted.job_id))
                raise JobError(f"distperf job {job.describe()} ({where}) waited {self.queue_timeout:g} s in the "
                               f"SLURM queue without starting; cancelled. job folder: {job_dir}", job_dir)
            if started_at is not None and now - started_at > timeout:
                request_stacks(job_dir)
                cancel(str(submitted.job_id))
                exits = {a: nodes.AgentExit(agent=a, host=None, exitcode=None, log=_task_log(submitted, a, job_dir),
                                            ended_here=True) for a in range(self.nodes)}
                raise JobTimeout(nodes.timeout_message(job, job_dir, timeout, exits, where)
                                 + "\nthe SLURM job was cancelled (scancel)", job_dir)
            failed, dead = _failed_and_dead(submitted, job_dir, self.nodes)
            if failed_since is None and failed:
                failed_since = now
            # a dead agent is the root cause already: its peers' own failures would only follow from it
            if dead or (failed_since is not None and now - failed_since > PEER_GRACE_SECONDS):
                cancel(str(submitted.job_id))
                return
            last = jobfiles.forward_progress(job_dir, on_progress, now - submitted_at, last,
                                             fallback="queued" if started_at is None else None)
            time.sleep(POLL_SECONDS)


def queue_state(slurm_id: str) -> str | None:
    """The job's state while SLURM still lists it; None once it has left the queue (squeue: sacct needs an
    accounting database, which a small cluster may not run)."""
    out = subprocess.run(["squeue", "-h", "-j", slurm_id, "-o", "%T"], capture_output=True, text=True, timeout=30)
    states = [s for s in out.stdout.split() if s]
    if out.returncode != 0 and "Invalid job id" not in out.stderr:
        raise JobError(f"squeue failed for SLURM job {slurm_id}: {out.stderr.strip()}")
    active = [s for s in states if s in ACTIVE_STATES]
    return active[0] if active else None


def cancel(slurm_id: str) -> None:
    """scancel, then wait until SLURM no longer lists the job (its processes are gone by then)."""
    if queue_state(slurm_id) is None:
        return
    subprocess.run(["scancel", slurm_id], capture_output=True, timeout=30)
    deadline = time.monotonic() + CANCEL_WAIT_SECONDS
    while time.monotonic() < deadline and queue_state(slurm_id) is not None:
        time.sleep(POLL_SECONDS)


def _failed_and_dead(submitted: Any, job_dir: str, agents: int) -> tuple[bool, bool]:
    """(some agent reported a failure, some agent died without a result)."""
    failed, dead = nodes.any_failed(job_dir, agents), False
    for a in range(agents):
        task = submitted.task(a)
        if task.paths.result_pickle.exists():
            report = _report(task)
            failed = failed or report is None or report.exitcode != 0
            dead = dead or report is None or report.result is None
    return failed, dead


def _report(task: Any) -> NodeTaskReport | None:
    """A task's report; None when it ended without one (killed or cancelled)."""
    if not task.paths.result_pickle.exists():
        return None
    try:
        return task.result()
    except Exception as e:  # submitit's FailedJobError: run_node_agent itself raised (its traceback)
        agent = int(task.task_id or 0)
        return NodeTaskReport(agent=agent, host="?", exitcode=1, result=jobfiles.AgentResult(agent_error=str(e)))


def _task_log(submitted: Any, agent: int, job_dir: str, lines: int = 10) -> str:
    """The agent's own output, else what SLURM/submitit captured of the task."""
    text = jobfiles.tail(jobfiles.agent_log(job_dir, agent), lines)
    if text.strip():
        return text
    task = submitted.task(agent)
    return "\n".join(jobfiles.tail(str(p), lines) for p in (task.paths.stderr, task.paths.stdout))
