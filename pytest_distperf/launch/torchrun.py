"""The torchrun launcher: a job's ranks on N node agents (agents/node.py, each running torchrun) that meet through
torchrun's c10d rendezvous. Agent 0 runs here; agents 1..N-1 here too, by srun, or from a command template. The
job folder is the meeting point (nodes.py). When one agent fails, the others get a short grace to report.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable

from pytest_distperf.errors import JobTimeout
from pytest_distperf.launch import jobfiles, nodes
from pytest_distperf.launch.launcher import agent_environment, end_tree, threads_per_rank
from pytest_distperf.launch.nodes import free_port
from pytest_distperf.spec.job import JobSpec

NODE_AGENT = "pytest_distperf.agents.node"
POLL_SECONDS = 0.05
PEER_GRACE_SECONDS = 10.0  # after one agent failed, how long the others get to write their own result
STACK_DUMP_SECONDS = 1.5  # the agents look for the request every 0.2 s


@dataclass
class TorchrunLauncher:
    """agents: how agents 1..N-1 start: "local" (all on this host), "srun" (on the other nodes of the current
    SLURM allocation) or a template such as "ssh node{index} {command}"."""

    nodes: int
    rdzv_endpoint: str | None = None  # host:port; default 127.0.0.1:<free port> (every agent here)
    agents: str = "local"
    shared_dir: str | None = None  # job folders go here (default: pytest's temporary folder)
    join_timeout: int = 120
    name: str = "torchrun"

    def launch(self, job: JobSpec, *, timeout: float, base_dir: str | None = None,
               on_progress: Callable[[str, float], None] | None = None, keep: bool = False,
               env: dict[str, str] | None = None) -> dict[int, Any]:
        endpoint = self.rdzv_endpoint or f"127.0.0.1:{free_port('127.0.0.1')}"
        loopback = nodes.is_loopback(endpoint)
        plan = nodes.plan_nodes(job, self.nodes, endpoint, local_addr="127.0.0.1" if loopback else None,
                                join_timeout=self.join_timeout)
        job_dir = jobfiles.new_node_job_dir(job, plan, base_dir, self.shared_dir)
        agents = _Agents(job, job_dir, plan, self.agents, self._environment(job, plan, env, loopback))
        with jobfiles.dropped_on_success(job_dir, keep):
            try:
                agents.start()
                self._watch(job, job_dir, agents, timeout, on_progress)
                return nodes.collect(job, job_dir, agents.exits(), f"{self.nodes} torchrun agents, {self.agents}")
            finally:
                agents.end()  # no-op after clean exits; Ctrl-C and errors land here too

    def local_ranks(self, job: JobSpec) -> int:
        return job.world_size if self.agents == "local" else job.world_size // self.nodes

    def inter_node(self) -> str:
        from pytest_distperf.launch.fingerprint import inter_node

        return inter_node(self.nodes, one_host=self.agents == "local")

    def _environment(self, job: JobSpec, plan: Any, env: dict[str, str] | None, loopback: bool) -> dict[str, str]:
        base = agent_environment(job, env, loopback=loopback)  # ranks on other hosts: their sockets must reach them
        if "OMP_NUM_THREADS" not in {**os.environ, **(env or {})}:
            # every agent here: the host's cores split over all ranks; elsewhere: each node's over its own
            base["OMP_NUM_THREADS"] = str(threads_per_rank(job.world_size if self.agents == "local"
                                                           else plan.nproc_per_node))
        return base

    def _watch(self, job: JobSpec, job_dir: str, agents: "_Agents", timeout: float,
               on_progress: Callable[[str, float], None] | None) -> None:
        start = time.monotonic()
        failed_since: float | None = None
        last = None
        while agents.running():
            elapsed = time.monotonic() - start
            if elapsed > timeout:
                request_stacks(job_dir)
                agents.end()
                raise JobTimeout(nodes.timeout_message(job, job_dir, timeout, agents.exits()), job_dir)
            if failed_since is None and agents.any_failed():
                failed_since = time.monotonic()
            # a dead agent is the root cause already: its peers' own failures would only follow from it
            if agents.any_dead() or (failed_since is not None
                                     and time.monotonic() - failed_since > PEER_GRACE_SECONDS):
                agents.end()
                return
            last = jobfiles.forward_progress(job_dir, on_progress, elapsed, last)
            time.sleep(POLL_SECONDS)


class _Agents:
    """The processes this launcher started for one job: one per agent, or one srun for agents 1..N-1."""

    def __init__(self, job: JobSpec, job_dir: str, plan: jobfiles.NodePlan, how: str, env: dict[str, str]):
        self.job, self.job_dir, self.plan, self.how, self.env = job, job_dir, plan, how, env
        self.procs: dict[int, subprocess.Popen] = {}  # agent index (srun: 1 for agents 1..N-1) -> process
        self.ended_here: set[int] = set()
        self._logs: list[Any] = []

    def start(self) -> None:
        self._popen(0, node_agent_command(self.job_dir, 0), self._agent_env(0))
        if self.how == "local":
            for i in range(1, self.plan.nodes):
                self._popen(i, node_agent_command(self.job_dir, i), self._agent_env(i))
            return
        # Agents elsewhere get their devices from their own node (SLURM's gres, the engine), not this host's.
        elsewhere = {k: v for k, v in self.env.items() if k != "CUDA_VISIBLE_DEVICES"}
        if "CUDA_VISIBLE_DEVICES" in os.environ:
            elsewhere["CUDA_VISIBLE_DEVICES"] = os.environ["CUDA_VISIBLE_DEVICES"]
        if self.how == "srun" and self.plan.nodes > 1:
            others = self.plan.nodes - 1
            # --relative=1: the allocation's nodes after the first, where pytest runs (a batch script's host)
            command = ["srun", f"--nodes={others}", f"--ntasks={others}", "--ntasks-per-node=1", "--relative=1",
                       "--kill-on-bad-exit=1", "--export=ALL", *node_agent_command(self.job_dir, "procid+1")]
            self._popen(1, command, elsewhere)
        elif self.how != "srun":
            for i in range(1, self.plan.nodes):
                command = self.how.format(command=shlex.join(node_agent_command(self.job_dir, i)), index=i)
                self._popen(i, ["/bin/sh", "-c", command], elsewhere, key_on_stdin=True)  # ssh passes no env

    def _agent_env(self, agent: int) -> dict[str, str]:
        """Every agent here: each gets its own slice of the GPUs the job was given."""
        env = dict(self.env)
        if self.job.device == "cuda" and self.how == "local":
            visible = env.get("CUDA_VISIBLE_DEVICES")
            ids = visible.split(",") if visible else [str(i) for i in range(self.job.world_size)]
            per = self.plan.nproc_per_node
            env["CUDA_VISIBLE_DEVICES"] = ",".join(ids[agent * per:(agent + 1) * per])
        return env

    def _popen(self, agent: int, command: list[str], env: dict[str, str], key_on_stdin: bool = False) -> None:
        log = open(jobfiles.agent_log(self.job_dir, agent), "wb")
        self._logs.append(log)
        # A templated agent (e.g. over ssh) gets the job-file key on stdin: never on a command line (ps shows it)
        self.procs[agent] = proc = subprocess.Popen(command, env=env, stdin=subprocess.PIPE if key_on_stdin
                                                    else subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                                    start_new_session=True)
        if key_on_stdin and proc.stdin is not None:
            with contextlib.suppress(OSError):  # the agent died at once: its exit is reported as usual
                proc.stdin.write(jobfiles.job_key().hex().encode() + b"\n")
                proc.stdin.close()

    def running(self) -> bool:
        return any(p.poll() is None for p in self.procs.values())

    def any_failed(self) -> bool:
        return (any(p.poll() not in (None, 0) for p in self.procs.values())
                or nodes.any_failed(self.job_dir, self.plan.nodes))

    def any_dead(self) -> bool:
        """An agent process that ended without writing its result (killed, OOM-killed, crashed)."""
        return any(p.poll() is not None and jobfiles.read_agent_result(self.job_dir, a) is None
                   for a, p in self.procs.items() if not (self.how == "srun" and a > 0))

    def end(self) -> None:
        for agent, proc in self.procs.items():
            if proc.poll() is None:
                self.ended_here.add(agent)
            end_tree(proc)
        for log in self._logs:
            log.close()
        self._logs.clear()

    def exits(self) -> dict[int, nodes.AgentExit]:
        out = {}
        for a in range(self.plan.nodes):
            by_srun = self.how == "srun" and a > 0  # one srun process (key 1) started agents 1..N-1
            key = 1 if by_srun else a
            proc = None if by_srun else self.procs.get(a)  # the agent itself, or the engine's client for it
            result = jobfiles.read_agent_result(self.job_dir, a)
            here = socket.gethostname() if self.how == "local" or a == 0 else None
            out[a] = nodes.AgentExit(
                agent=a, host=result.host if result else here,
                exitcode=proc.returncode if proc is not None and a not in self.ended_here else None,
                log=jobfiles.tail(jobfiles.agent_log(self.job_dir, key), 10),
                ended_here=key in self.ended_here and result is None)
        return out


def node_agent_command(job_dir: str, agent: int | str) -> list[str]:
    return [sys.executable, "-m", NODE_AGENT, job_dir, str(agent)]


def request_stacks(job_dir: str) -> None:
    jobfiles.request_stacks(job_dir)
    time.sleep(STACK_DUMP_SECONDS)
