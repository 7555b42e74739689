"""The launch agent: `python -m pytest_distperf.agents.elastic JOB_DIR`.

Runs torch's elastic launcher in its own process (its own session), so that:
- torch elastic's signal handlers and environment writes never touch the pytest process;
- CUDA is never initialised in the pytest process;
- the launcher in pytest owns a wall-clock timeout and can end the whole process tree.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import uuid
from typing import Any

SHUTDOWN_GRACE_SECONDS = 3  # a rank that traps SIGTERM after a peer failed gets SIGKILL after this
# CPU ranks are forked from this agent, which has torch imported already: they skip their own `import torch`
# and interpreter teardown. This agent runs no tensor op (no OpenMP pool to break in a child). CUDA ranks are
# spawned, as CUDA does not survive fork, except under the warm agent, where nothing has initialised CUDA.
START_METHODS = {"cpu": "fork", "cuda": "spawn"}


def main(job_dir: str, warm: bool = False) -> int:
    """Run the job's ranks. `warm`: this agent was forked from the warm agent (torch imported before the job's
    environment was set), so its ranks are forked whatever the device, and each sets its threads itself."""
    from pytest_distperf.launch import jobfiles

    jobfiles.die_with_parent(signal.SIGTERM)  # SIGTERM: elastic's handler then stops the ranks
    jobfiles.no_core_dumps()  # inherited by the ranks, also a crash before rank_main runs
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from pytest_distperf.launch import rendezvous
    from pytest_distperf.rank.worker import rank_main

    plain_torch_log_format()
    record_rank_exits(job_dir)
    rendezvous.register()

    job = jobfiles.read_job(job_dir)
    start_method = "fork" if warm else START_METHODS[job.device]
    entry = rank_main if start_method == "spawn" else forked_rank_entry(warm_rank_setup() if warm else None)
    config = LaunchConfig(
        min_nodes=1, max_nodes=1, nproc_per_node=job.world_size, run_id=uuid.uuid4().hex,
        rdzv_backend=rendezvous.BACKEND_NAME,  # torch's dynamic rendezvous, stores on 127.0.0.1:<free port>
        rdzv_endpoint=f"{rendezvous.LOOPBACK}:0", rdzv_configs={"timeout": 120}, local_addr=rendezvous.LOOPBACK,
        max_restarts=0, monitor_interval=0.1, start_method=start_method,
        logs_specs=DefaultLogsSpecs(log_dir=os.path.join(job_dir, jobfiles.LOGS), redirects=Std.ALL),
        **_shutdown_grace(LaunchConfig))

    try:
        values = elastic_launch(config, entry)(job_dir)
        jobfiles.write_result(job_dir, jobfiles.AgentResult(values=dict(values)))
        return 0
    except ChildFailedError as e:
        jobfiles.write_result(job_dir, jobfiles.AgentResult(failures=rank_failures(e)))
        return 1
    except BaseException as e:  # rendezvous failure, SIGTERM from the launcher, ...
        import traceback

        jobfiles.write_result(job_dir, jobfiles.AgentResult(agent_error="".join(traceback.format_exception(e))))
        return 2


@dataclasses.dataclass(frozen=True)
class WarmRankSetup:
    """What a rank forked from a warm agent's job agent sets for itself to start as a fresh launch's would."""

    threads: int | None  # torch.set_num_threads: the job's OMP_NUM_THREADS (None: torch's default, as loaded)
    drop_env: tuple[str, ...]  # variables only the agent needed (the NVML-based CUDA check)


def warm_rank_setup() -> WarmRankSetup:
    """In a job agent forked from the warm agent: make its torch.cuda checks go through NVML (no cuInit, so its
    ranks can still be forked for CUDA), and note what its ranks must set. libgomp read OMP_NUM_THREADS when the
    warm agent loaded torch, started without it: a rank sets the job's value explicitly."""
    from pytest_distperf.launch.devices import NVML_CHECK

    drop: tuple[str, ...] = ()
    if NVML_CHECK not in os.environ:
        os.environ[NVML_CHECK] = "1"
        drop = (NVML_CHECK,)
    import torch.cuda

    if hasattr(torch.cuda, "_cached_device_count"):  # counted under another job's CUDA_VISIBLE_DEVICES
        torch.cuda._cached_device_count = None
    return WarmRankSetup(threads=omp_threads(os.environ.get("OMP_NUM_THREADS")), drop_env=drop)


def omp_threads(value: str | None) -> int | None:
    """OMP_NUM_THREADS as libgomp reads it for the outermost level ("4" or "4,2"); None when unset or invalid."""
    try:
        n = int((value or "").split(",")[0])
    except ValueError:
        return None
    return n if n > 0 else None


def forked_rank_entry(warm: WarmRankSetup | None) -> Any:
    """The rank entry elastic forks: rank_main after forked_rank_setup (a named function: elastic uses its name)."""

    def forked_rank_main(job_dir: str) -> Any:
        forked_rank_setup(warm)
        from pytest_distperf.rank.worker import rank_main

        return rank_main(job_dir)

    return forked_rank_main


def forked_rank_setup(warm: WarmRankSetup | None) -> None:
    """A spawned rank starts with Python's signal handlers; a forked one would keep torch elastic's from this
    agent (they raise in the main thread instead of ending the rank), so restore them. A rank of a warm agent
    also takes the job's threads and drops the agent's own variables."""
    python_signal_handlers()
    if warm is None:
        return
    for name in warm.drop_env:
        os.environ.pop(name, None)
    if warm.threads is not None:
        import torch

        torch.set_num_threads(warm.threads)


def python_signal_handlers(*more: signal.Signals) -> None:
    """The handlers a new Python process starts with, for a process forked from one that changed them."""
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, *more):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def rank_failures(error: Any, host: str | None = None) -> list["jobfiles.RankFailure"]:
    """torch elastic's ChildFailedError as RankFailures (also used by the multi-node agent, agents/node.py)."""
    from pytest_distperf.launch import jobfiles

    return [jobfiles.RankFailure(rank=rank, exitcode=f.exitcode, host=host, timestamp=f.timestamp,
                                 signal=jobfiles.signal_name(-f.exitcode) if f.exitcode < 0 else None,
                                 message=jobfiles.error_text(f.message))
            for rank, f in sorted(error.failures.items())]


def record_rank_exits(job_dir: str) -> None:
    """Note how each rank's process ended (exit code or signal) when torch's process context reaps it. Elastic
    reports only the rank it sees fail first, and to it a rank that leaves with exit code 0 and no value
    (os._exit(0)) is no failure: its peers' broken connections would then read as the cause. The exit codes are
    on the context's processes once its join() has reaped them; this wraps join() to write them down."""
    from torch.multiprocessing.spawn import ProcessContext

    from pytest_distperf.launch import jobfiles

    join = ProcessContext.join

    def join_noting_exits(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return join(self, *args, **kwargs)
        finally:
            ranks = {pid: rank for rank, pid in jobfiles.started_ranks(job_dir).items()}
            for process in getattr(self, "processes", ()):
                code = process.exitcode
                if code is not None and process.pid in ranks:
                    jobfiles.write_exit(job_dir, ranks[process.pid], code >= 0, abs(code))

    ProcessContext.join = join_noting_exits  # type: ignore[method-assign]


def plain_torch_log_format() -> None:
    """torch's log formatter imports the compiler stack (seconds) the first time it formats a record with an
    exception, which torch elastic logs when a rank fails. torch elastic's and the launcher's records go to a
    plain handler of their own instead (same stream, same levels)."""
    import logging

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname).1s%(asctime)s %(process)d %(name)s] %(message)s"))
    for name in ("torch.distributed.elastic", "torch.distributed.launcher"):
        logger = logging.getLogger(name)
        logger.addHandler(handler)
        logger.propagate = False


def _shutdown_grace(config_cls: type) -> dict[str, int]:
    """After the first rank fails the others get SIGTERM; one that traps it (Lightning does) gets
    SIGKILL after this grace instead of torch's default 30 s. Older torch has no such field."""
    names = {f.name for f in dataclasses.fields(config_cls)}
    return {"shutdown_timeout": SHUTDOWN_GRACE_SECONDS} if "shutdown_timeout" in names else {}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
