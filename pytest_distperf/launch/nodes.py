"""A job's node agents, seen from the pytest process (the torchrun and SLURM launchers): plan them, then gather
every rank's value or say which host and rank failed, all through the job folder every node sees under the same
path. An agent that left no result died (killed, OOM, its node lost): it is the root cause.
"""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass
from typing import Any

from pytest_distperf.launch import jobfiles
from pytest_distperf.errors import JobError, UsageError
from pytest_distperf.launch.launcher import RankFailed, RankOutcome, root_cause
from pytest_distperf.spec.job import JobSpec

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


@dataclass
class AgentExit:
    """How one node agent ended, as far as the pytest process (or SLURM) could see."""

    agent: int
    host: str | None  # None where unknown (the agent never wrote anything)
    exitcode: int | None  # None: not known here (an agent on another host)
    log: str  # tail of the agent's own output
    ended_here: bool = False  # the launcher ended it (timeout, or its peers had failed): not a cause


def plan_nodes(job: JobSpec, nodes: int, endpoint: str | None, local_addr: str | None = None,
               join_timeout: int = 120) -> jobfiles.NodePlan:
    if nodes < 1 or job.world_size % nodes:
        raise UsageError(f"{job.describe()}: world size {job.world_size} does not split over {nodes} nodes "
                         f"(it must be a multiple of the node count: ranks per node = world size / nodes)")
    return jobfiles.NodePlan(nodes=nodes, nproc_per_node=job.world_size // nodes,
                             rdzv_id=f"distperf-{uuid.uuid4().hex}",
                             rdzv_endpoint=endpoint, local_addr=local_addr, join_timeout=join_timeout)


def any_failed(job_dir: str, agents: int) -> bool:
    """Some agent's result reports failed ranks or its own error."""
    results = (jobfiles.read_agent_result(job_dir, a) for a in range(agents))
    return any(r is not None and (r.failures or r.agent_error) for r in results)


def is_loopback(endpoint: str) -> bool:
    host = endpoint.rsplit(":", 1)[0].strip("[]")
    return host in LOOPBACK_HOSTS


def collect(job: JobSpec, job_dir: str, exits: dict[int, AgentExit], where: str,
            results: dict[int, jobfiles.AgentResult | None] | None = None) -> dict[int, Any]:
    """Every rank's value, or the failure: RankOutcome (skip/xfail), RankFailed or JobError. `where`: how the agents
    ran, for messages; `results`: each agent's result as it came back (default: the job folder's)."""
    for outcome in jobfiles.read_outcomes(job_dir):
        raise RankOutcome(outcome["outcome"], outcome["reason"], outcome["rank"])
    places = jobfiles.read_rank_places(job_dir)
    if results is None:
        results = {a: jobfiles.read_agent_result(job_dir, a) for a in exits}
    # agents that ended without a result: their own death is the root cause
    dead = [a for a, r in sorted(results.items()) if r is None and not exits[a].ended_here]
    failures = [f for _, r in sorted(results.items()) if r is not None for f in r.failures]
    errors = {a: r.agent_error for a, r in results.items() if r is not None and r.agent_error}
    ended = sorted(a for a in exits if exits[a].ended_here)
    values = {rank: v for r in results.values() if r is not None for rank, v in (r.values or {}).items()}
    values.update(jobfiles.read_rank_values(job_dir))  # ranks whose agent died after they returned
    if not dead and not failures and not errors and not ended:
        missing = sorted(set(range(job.world_size)) - set(values))
        if missing:
            raise JobError(f"ranks {missing} of {job.describe()} ({where}) returned nothing\n"
                           f"{_tails(job, job_dir, places, exits)}\njob folder: {job_dir}", job_dir)
        return values
    head = f"distperf job {job.describe()} ({where}) failed: "
    headline_error = None  # the agent error already shown as the headline
    if dead:
        lines = [head + "; ".join(_dead_agent(a, exits[a], places) for a in dead) + " (root cause)"]
        rest = failures
        failures = [jobfiles.RankFailure(rank=p.rank, exitcode=-9, signal="SIGKILL", host=p.host,
                                         message=f"its node agent {p.agent} died")
                    for p in sorted(places.values(), key=lambda p: p.rank) if p.agent in dead] + failures
    elif failures:
        root = root_cause(failures, jobfiles.read_failure_times(job_dir))
        stack = jobfiles.read_fatal_reports(job_dir).get(root.rank) if root.signal else None  # faulthandler's
        lines = [f"{head}rank {root.rank} on host {root.host or '?'}{_node(places.get(root.rank))} {root.how()} "
                 f"(root cause)", "", (stack or root.message).rstrip()]
        rest = [f for f in failures if f is not root]
        failures = [root] + rest
    elif errors:
        headline_error = min(errors, key=lambda a: (exits[a].ended_here, a))
        lines = [f"{head}node agent {headline_error} on host {results[headline_error].host or '?'} could not run "
                 f"its ranks:", "", errors[headline_error].rstrip()]
        rest = []
    else:
        lines = [f"{head}node agents {ended} were ended without a result"]
        rest = []
    if rest:
        lines += ["", "other ranks: " + ", ".join(f"rank {f.rank} on {f.host or '?'} {f.brief()}" for f in rest)]
    for a, text in sorted(errors.items()):
        if a != headline_error:
            lines.append(f"node agent {a} on {results[a].host or '?'}: {text.strip().splitlines()[-1]}")
    if ended and (dead or failures or errors):
        lines.append(f"node agents ended by distperf after that: {', '.join(map(str, ended))}")
    lines.append(_tails(job, job_dir, places, exits))
    lines.append(f"job folder (logs of every rank and agent): {job_dir}")
    message = "\n".join(lines)
    if failures:
        raise RankFailed(message, failures, job_dir)
    raise JobError(message, job_dir)


def _node(place: jobfiles.RankPlace | None) -> str:
    return f" (node {place.node_rank}, agent {place.agent})" if place else ""


def _dead_agent(agent: int, exit: AgentExit, places: dict[int, jobfiles.RankPlace]) -> str:
    ranks = sorted(p.rank for p in places.values() if p.agent == agent)
    host = exit.host or next((p.host for p in places.values() if p.agent == agent), None) or "?"
    if exit.exitcode is not None and exit.exitcode < 0:
        name = jobfiles.signal_name(-exit.exitcode)
        how = f"died of {'signal ' + name if name.isdigit() else name}"
    elif exit.exitcode is not None:
        how = f"exited with code {exit.exitcode} without a result"
    else:
        how = "ended without a result"
    held = f", ranks {', '.join(map(str, ranks))}" if ranks else ", before its ranks started"
    return f"node agent {agent} (host {host}{held}) {how}"


def rank_log(place: jobfiles.RankPlace | None) -> str | None:
    return os.path.join(place.log_dir, "stderr.log") if place and place.log_dir else None


def _tails(job: JobSpec, job_dir: str, places: dict[int, jobfiles.RankPlace], exits: dict[int, AgentExit],
           lines: int = 15) -> str:
    parts = []
    for rank in range(job.world_size):
        place = places.get(rank)
        text = jobfiles.tail(rank_log(place), lines).rstrip()
        where = f" on {place.host}, agent {place.agent}" if place else " (never started)"
        parts.append(f"--- rank {rank}{where}: stderr (last {lines} lines) ---\n{text or '(empty)'}")
    for a, exit in sorted(exits.items()):
        host = exit.host or next((p.host for p in places.values() if p.agent == a), "?")
        if exit.log.strip():
            parts.append(f"--- node agent {a} on {host} (last lines) ---\n{exit.log.rstrip()}")
    return "\n".join(parts)


def timeout_message(job: JobSpec, job_dir: str, timeout: float, exits: dict[int, AgentExit], where: str = "") -> str:
    places = jobfiles.read_rank_places(job_dir)
    return "\n".join([
        f"distperf job {job.describe()}{f' ({where})' if where else ''} timed out after {timeout:g} s "
        f"(last progress: {jobfiles.read_progress(job_dir) or 'none'}); every node agent was ended.",
        "Python stacks of every rank at the timeout (faulthandler; each node agent signals its own ranks):",
        _tails(job, job_dir, places, exits, lines=60),
        f"job folder (logs of every rank and agent): {job_dir}",
    ])


def free_port(host: str = "") -> int:
    """A port free now on this host; torchrun binds its store there a moment later."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]
