"""The files a job leaves in its folder, shared by the launcher, the agent and the ranks.

    job.pkl             the JobSpec (written by the launcher)
    progress.txt        rank 0's current phase, read by the launcher for -v output
    outcome-rank{r}.json  a rank that stopped on pytest.skip / pytest.xfail
    failed-rank{r}.time   when a rank raised (to find the root cause among failed ranks)
    rank{r}.pid / rank{r}.returned   a rank started / got to the end of its body
    result.pkl          what the agent got back from elastic_launch (values or failures)
    agent.log           the agent's own output
    logs/.../{rank}/stderr.log, stdout.log   each rank's output (torch elastic's redirects)
"""

from __future__ import annotations

import ctypes
import glob
import json
import os
import pickle
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from pytest_distperf.spec import JobSpec

JOB = "job.pkl"
RESULT = "result.pkl"
PROGRESS = "progress.txt"
AGENT_LOG = "agent.log"
LOGS = "logs"


@dataclass
class RankFailure:
    rank: int
    exitcode: int
    signal: str | None  # e.g. "SIGKILL" when the rank died of a signal
    message: str  # the rank's traceback when it raised, else what torch elastic reported
    timestamp: int = 0  # when torch elastic saw it fail (the earliest is the root cause)


@dataclass
class AgentResult:
    values: dict[int, Any] | None = None
    failures: list[RankFailure] = field(default_factory=list)
    agent_error: str | None = None  # the agent itself failed (rendezvous, bad config, ...)


def _write_atomic(path: str, data: bytes) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def write_job(job_dir: str, job: JobSpec) -> None:
    _write_atomic(os.path.join(job_dir, JOB), pickle.dumps(job))


def read_job(job_dir: str) -> JobSpec:
    with open(os.path.join(job_dir, JOB), "rb") as f:
        return pickle.load(f)


def write_result(job_dir: str, result: AgentResult) -> None:
    _write_atomic(os.path.join(job_dir, RESULT), pickle.dumps(result))


def read_result(job_dir: str) -> AgentResult | None:
    try:
        with open(os.path.join(job_dir, RESULT), "rb") as f:
            return pickle.load(f)
    except FileNotFoundError:
        return None


def write_outcome(job_dir: str, rank: int, outcome: str, reason: str) -> None:
    path = os.path.join(job_dir, f"outcome-rank{rank}.json")
    _write_atomic(path, json.dumps({"rank": rank, "outcome": outcome, "reason": reason}).encode())


def read_outcomes(job_dir: str) -> list[dict[str, Any]]:
    out = []
    for path in sorted(glob.glob(os.path.join(job_dir, "outcome-rank*.json"))):
        with open(path) as f:
            out.append(json.load(f))
    return out


def write_failure_time(job_dir: str, rank: int) -> None:
    """When this rank's exception happened, precisely: torch elastic's timestamps are whole seconds,
    too coarse to tell the rank that failed from the peers that failed because of it."""
    _write_atomic(os.path.join(job_dir, f"failed-rank{rank}.time"), repr(time.time()).encode())


def read_failure_times(job_dir: str) -> dict[int, float]:
    out = {}
    for path in glob.glob(os.path.join(job_dir, "failed-rank*.time")):
        rank = int(os.path.basename(path)[len("failed-rank"):-len(".time")])
        with open(path) as f:
            out[rank] = float(f.read())
    return out


def mark_started(job_dir: str, rank: int) -> None:
    _write_atomic(os.path.join(job_dir, f"rank{rank}.pid"), str(os.getpid()).encode())


def mark_returned(job_dir: str, rank: int) -> None:
    _write_atomic(os.path.join(job_dir, f"rank{rank}.returned"), b"")


def started_ranks(job_dir: str) -> dict[int, int]:
    """{rank: pid} of the ranks that have started."""
    out = {}
    for path in glob.glob(os.path.join(job_dir, "rank*.pid")):
        with open(path) as f:
            out[int(os.path.basename(path)[4:-4])] = int(f.read())
    return out


def has_returned(job_dir: str, rank: int) -> bool:
    return os.path.exists(os.path.join(job_dir, f"rank{rank}.returned"))


class Progress:
    def __init__(self, job_dir: str):
        self.path = os.path.join(job_dir, PROGRESS)

    def update(self, text: str) -> None:
        _write_atomic(self.path, text.encode())


def read_progress(job_dir: str) -> str | None:
    try:
        with open(os.path.join(job_dir, PROGRESS)) as f:
            return f.read().strip() or None
    except FileNotFoundError:
        return None


def rank_log(job_dir: str, rank: int, stream: str = "stderr") -> str | None:
    hits = glob.glob(os.path.join(job_dir, LOGS, "*", "attempt_*", str(rank), f"{stream}.log"))
    return hits[0] if hits else None


def tail(path: str | None, lines: int = 20) -> str:
    if not path or not os.path.exists(path):
        return ""
    with open(path, errors="replace") as f:
        return "".join(f.readlines()[-lines:])


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Linux: have the kernel kill this process when its parent dies (no orphaned ranks)."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(sig))  # PR_SET_PDEATHSIG
        except OSError:
            pass
