"""The pytest side of the warm launch agents (agents/warm.py): one per device kind and agent environment, started
on the first job that needs it, ended when a job of it fails or times out and at the session's end. A job it runs
is a `WarmJob`, with Popen's pid, poll, wait and kill, so launcher.py watches and ends both kinds of agent alike.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pytest_distperf.launch.devices import NVML_CHECK

if TYPE_CHECKING:
    from pytest_distperf.spec.job import JobSpec

# Variables read only after the agent's preload (CUDA init, a forked rank's threads, an op build), so they may
# differ between the jobs one agent serves; every other variable is part of the agent's key.
PER_JOB_VARIABLES = ("OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "PYTEST_CURRENT_TEST", "TORCH_CUDA_ARCH_LIST")
# Not in the warm agent's own environment: the first job's values would be stale for the next.
NOT_IN_AGENT_ENVIRONMENT = ("OMP_NUM_THREADS", "PYTEST_CURRENT_TEST")
READY_TIMEOUT_SECONDS = 300.0  # imports of torch and the strategy libraries on a very busy host
STOP_GRACE_SECONDS = 3.0


@dataclass
class AgentState:
    """What this session's warm agents have done, for the reports."""

    started: int = 0  # warm agents started
    jobs: int = 0  # jobs served by a warm agent
    ended_after_failure: int = 0
    preload_seconds: list[float] = field(default_factory=list)
    start_seconds: list[float] = field(default_factory=list)  # agents' starts (spawn to ready), jobs' imports
    preloaded: list[str] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)  # device kind -> why its jobs got fresh agents


STATE = AgentState()


class Channel:
    """Line-delimited JSON over two file descriptors, unbuffered: nothing waits in a buffer a forked child inherits."""

    def __init__(self, read_fd: int, write_fd: int):
        self.read_fd, self.write_fd = read_fd, write_fd
        self._pending = b""

    def send(self, message: dict[str, Any]) -> None:
        data = (json.dumps(message) + "\n").encode()
        while data:
            data = data[os.write(self.write_fd, data):]

    def receive(self) -> dict[str, Any] | None:
        """The next message; None at EOF."""
        while b"\n" not in self._pending:
            chunk = os.read(self.read_fd, 65536)
            if not chunk:
                return None
            self._pending += chunk
        line, _, self._pending = self._pending.partition(b"\n")
        return json.loads(line)


def agent_key(device: str, env: dict[str, str]) -> tuple[Any, ...]:
    """The warm agent a job's agent environment can use: same device kind, variables but the per-job ones, and
    working directory (`python -m` puts it first on sys.path)."""
    return device, os.getcwd(), tuple(sorted((k, v) for k, v in env.items() if k not in PER_JOB_VARIABLES))


class WarmJob:
    """One job's agent, forked by a warm agent: Popen's interface over the warm agent's messages."""

    def __init__(self, agent: "WarmAgent", pid: int):
        self.agent, self.pid = agent, pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self._read(0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(f"job agent {self.pid}", timeout or 0.0)
            self._read(left)
        return self.returncode

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, 9)

    def _read(self, timeout: float | None) -> None:
        message = self.agent.receive(timeout)
        if message is None:
            return
        if message.get("eof"):  # the warm agent died: the job agent is gone with it (PR_SET_PDEATHSIG)
            self.returncode = -9
        elif message.get("exited") == self.pid:
            self.returncode = int(message["status"])


class WarmAgent:
    def __init__(self, device: str, env: dict[str, str], log_path: str):
        env = {k: v for k, v in env.items() if k not in NOT_IN_AGENT_ENVIRONMENT}
        env[NVML_CHECK] = "1"  # a library's torch.cuda.is_available() at import must not initialise CUDA
        self.device, self.log_path = device, log_path
        self.lock = threading.Lock()  # one job at a time; a concurrent job gets a fresh agent
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "pytest_distperf.agents.warm", device], env=env,
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                         start_new_session=True, bufsize=0)
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.channel = Channel(self.proc.stdout.fileno(), self.proc.stdin.fileno())
        self.ready: dict[str, Any] | None = None

    def wait_ready(self, timeout: float) -> str | None:
        """None once the agent has imported everything; else why it cannot serve (it is then ended)."""
        message = self.receive(timeout) or {}
        if not message.get("ready"):
            why = message.get("reason") or ("it exited while importing" if message
                                            else f"not ready after {timeout:g} s")
            self.stop()
            from pytest_distperf.launch import jobfiles

            tail = jobfiles.tail(self.log_path, 10).strip()
            return why + (f" (its log: {tail.splitlines()[-1]})" if tail and "reason" not in message else "")
        self.ready = message
        return None

    def alive(self) -> bool:
        return self.proc.poll() is None

    def receive(self, timeout: float | None) -> dict[str, Any] | None:
        """The next message within `timeout` seconds (None: none yet); {"eof": True} when the agent is gone."""
        if b"\n" not in self.channel._pending:
            ready, _, _ = select.select([self.channel.read_fd], [], [], timeout)
            if not ready:
                return None
        try:
            message = self.channel.receive()
        except (OSError, ValueError):
            message = None
        return {"eof": True} if message is None else message

    def start_job(self, job_dir: str, env: dict[str, str], log: str, imports: list[str]) -> WarmJob:
        """Fork the job's agent once this agent has imported `imports` (job_imports): their seconds count as the
        agent's start, off the run's time split. OSError when it cannot serve the job (the device's jobs then get
        fresh agents for the session, as when an agent's preload is unsafe)."""
        affinity = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
        self.channel.send({"job_dir": job_dir, "env": env, "cwd": os.getcwd(), "affinity": affinity, "log": log,
                           "imports": imports})
        message = self.receive(READY_TIMEOUT_SECONDS if imports else 30.0)
        if message and message.get("refused"):
            STATE.refused[self.device] = message["refused"]
            raise OSError(f"the warm agent (pid {self.proc.pid}) cannot serve this job: {message['refused']}")
        if not message or "started" not in message:
            raise OSError(f"the warm agent (pid {self.proc.pid}) did not start the job: {message}")
        if message.get("imports_seconds"):
            STATE.start_seconds.append(float(message["imports_seconds"]))
            STATE.preload_seconds.append(float(message["imports_seconds"]))
        return WarmJob(self, int(message["started"]))

    def stop(self) -> None:
        """Close its stdin (it exits at EOF), then end its process group."""
        import signal

        for pipe in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):
                pipe.close() if pipe else None
        try:
            self.proc.wait(STOP_GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)


_agents: dict[tuple[Any, ...], WarmAgent] = {}

# What a DeepSpeed engine imports when it is built, beyond `import deepspeed` (its Muon optimizer's module calls
# torch.compile at import: a second or more): a warm agent imports it before it forks the session's first DeepSpeed
# job, so a session without one never pays for it.
DEEPSPEED_FIRST_USE = ("deepspeed.runtime.zero.muon.muon_optimizer",)


def job_imports(job: "JobSpec") -> list[str]:
    """What the warm agent imports before it forks this job's agent, beyond what it preloaded."""
    return list(DEEPSPEED_FIRST_USE) if job.runs_deepspeed else []


def agent_for(device: str, env: dict[str, str], log_dir: str, timeout: float) -> tuple[WarmAgent | None, str | None]:
    """The warm agent for a job (started now if needed) and its lock held, or (None, why not)."""
    if device in STATE.refused:
        return None, STATE.refused[device]
    key = agent_key(device, env)
    agent = _agents.get(key)
    if agent is not None and not agent.alive():  # died between jobs (e.g. killed): a new one
        _agents.pop(key).stop()
        agent = None
    if agent is None:
        import tempfile

        fd, log_path = tempfile.mkstemp(prefix="warm-agent-", suffix=".log", dir=log_dir)
        os.close(fd)
        started = time.monotonic()
        agent = WarmAgent(device, env, log_path)
        try:
            why = agent.wait_ready(min(timeout, READY_TIMEOUT_SECONDS))
        except BaseException:  # Ctrl-C while it imports: not left behind
            agent.stop()
            raise
        if why:
            STATE.refused[device] = why
            return None, why
        STATE.started += 1
        STATE.start_seconds.append(time.monotonic() - started)
        STATE.preload_seconds.append(float(agent.ready.get("seconds", 0.0)) if agent.ready else 0.0)
        STATE.preloaded = list(agent.ready.get("preloaded", [])) if agent.ready else []
        _agents[key] = agent
    if not agent.lock.acquire(blocking=False):
        return None, "its warm agent is busy with another job of this process"
    return agent, None


def release(agent: WarmAgent, ok: bool) -> None:
    """After a job: keep the agent for the next one, or end it (the job failed or timed out)."""
    STATE.jobs += 1
    agent.lock.release()
    if not ok:
        STATE.ended_after_failure += 1
        for key, a in list(_agents.items()):
            if a is agent:
                del _agents[key]
        agent.stop()


def stop_all() -> None:
    """End every warm agent (session end, interpreter exit); the next session starts its own account."""
    global STATE
    while _agents:
        _, agent = _agents.popitem()
        agent.stop()
    STATE = AgentState()


def agent_pids() -> list[int]:
    return [a.proc.pid for a in _agents.values() if a.alive()]


def describe() -> str:
    """What this session's warm agents did, for the terminal summary ('' when none started)."""
    refused = "; ".join(f"{device} jobs got fresh agents: {why}" for device, why in STATE.refused.items())
    if not STATE.started:
        return refused
    preload = sum(STATE.preload_seconds)
    text = (f"{STATE.started} warm agent(s) served {STATE.jobs} job(s) ({preload:.1f} s of imports, once an agent: "
            f"{', '.join(m for m in STATE.preloaded if '.' not in m)})"
            + (f"; {STATE.ended_after_failure} ended after a failed job" if STATE.ended_after_failure else ""))
    return text + (f"; {refused}" if refused else "")


atexit.register(stop_all)

