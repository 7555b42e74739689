"""One node's agent: `python -m pytest_distperf.agents.node JOB_DIR AGENT_INDEX`. Runs torchrun with the job
folder's node plan in this process, so that what it raises (which rank failed, how) lands in this agent's result
with the host's name. The torchrun command is printed first, to reproduce one node by hand.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import socket
import sys
import threading
import time
from typing import Any

from pytest_distperf.launch import jobfiles
from pytest_distperf.launch.nodes import free_port
from pytest_distperf.agents.elastic import SHUTDOWN_GRACE_SECONDS, run_ranks

RANK_ENTRY = "pytest_distperf.rank.entry"
MONITOR_INTERVAL_SECONDS = 0.1
ENDPOINT_POLL_SECONDS = 0.1
STACKS_POLL_SECONDS = 0.2


def torchrun_args(plan: jobfiles.NodePlan, job_dir: str, agent: int, endpoint: str) -> list[str]:
    """torchrun's command line for one node (without the leading `python -m torch.distributed.run`)."""
    args = ["--nnodes", str(plan.nodes), "--nproc-per-node", str(plan.nproc_per_node),
            "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", plan.rdzv_id,
            "--rdzv-conf", f"join_timeout={plan.join_timeout}",
            "--max-restarts", "0", "--monitor-interval", str(MONITOR_INTERVAL_SECONDS),
            "--log-dir", jobfiles.agent_log_dir(job_dir, agent), "--redirects", "3"]
    if plan.local_addr:
        args += ["--local-addr", plan.local_addr]
    if _torchrun_has_option("--shutdown-timeout"):  # torch before 2.5 has no such option (then 30 s)
        args += ["--shutdown-timeout", str(SHUTDOWN_GRACE_SECONDS)]
    return args + ["-m", RANK_ENTRY, job_dir]


def _torchrun_has_option(flag: str) -> bool:
    from torch.distributed.run import get_args_parser

    return any(flag in action.option_strings for action in get_args_parser()._actions)


def rendezvous_endpoint(plan: jobfiles.NodePlan, job_dir: str, agent: int) -> str:
    """The plan's endpoint; without one agent 0 offers its own host and a free port, the others read it."""
    if plan.rdzv_endpoint:
        return plan.rdzv_endpoint
    if agent == 0:
        endpoint = f"{socket.gethostname()}:{free_port()}"
        jobfiles.write_rdzv_endpoint(job_dir, endpoint)
        return endpoint
    deadline = time.monotonic() + plan.join_timeout
    while time.monotonic() < deadline:
        endpoint = jobfiles.read_rdzv_endpoint(job_dir)
        if endpoint:
            return endpoint
        time.sleep(ENDPOINT_POLL_SECONDS)
    raise TimeoutError(f"node agent 0 wrote no rendezvous endpoint into {job_dir} within {plan.join_timeout} s")


def main(job_dir: str, agent: int) -> int:
    jobfiles.die_with_parent(signal.SIGTERM)  # SIGTERM: torch elastic's handler then stops the ranks
    jobfiles.no_core_dumps()
    host = socket.gethostname()
    jobfiles.key_from_stdin()  # started by a command template: the job-file key comes on stdin
    return run_ranks(lambda: _run_torchrun(job_dir, agent, host),
                     lambda result: jobfiles.write_agent_result(job_dir, agent, result), host)


def _run_torchrun(job_dir: str, agent: int, host: str) -> dict[int, Any]:
    """torchrun in this process; the values of this agent's ranks."""
    plan = jobfiles.read_node_plan(job_dir)
    args = torchrun_args(plan, job_dir, agent, rendezvous_endpoint(plan, job_dir, agent))
    print(f"node agent {agent} on {host}: {shlex.join([sys.executable, '-m', 'torch.distributed.run', *args])}",
          flush=True)
    os.environ["DISTPERF_AGENT_INDEX"] = str(agent)  # the ranks write it into their place files
    threading.Thread(target=_dump_stacks_on_request, args=(job_dir, agent), daemon=True).start()
    os.environ.pop("TORCHELASTIC_ERROR_FILE", None)  # each rank gets its own from torchrun
    from torch.distributed.run import parse_args, run

    run(parse_args(args))
    mine = [p.rank for p in jobfiles.read_rank_places(job_dir).values() if p.agent == agent]
    return jobfiles.read_rank_values(job_dir, mine)


def _dump_stacks_on_request(job_dir: str, agent: int) -> None:
    """On a timeout the launcher, maybe on another host, asks through the job folder: this agent's ranks then
    get SIGUSR1 and write their Python stacks to their stderr logs."""
    while not jobfiles.stacks_requested(job_dir):
        time.sleep(STACKS_POLL_SECONDS)
    for place in jobfiles.read_rank_places(job_dir).values():
        if place.agent == agent:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(place.pid, signal.SIGUSR1)


def agent_index(text: str) -> int:
    """An index, or `procid+K`: SLURM's task id plus K (agents started by one srun)."""
    if text.startswith("procid+"):
        return int(os.environ["SLURM_PROCID"]) + int(text[len("procid+"):])
    return int(text)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], agent_index(sys.argv[2])))
