"""The launch agent: `python -m pytest_distperf.agents.elastic JOB_DIR`, torch's elastic launcher in its own
process and session, so that its signal handlers, environment writes and CUDA never touch the pytest process, and
the launcher there can time it out and end the whole tree.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import sys
import uuid
from typing import Any, Callable

SHUTDOWN_GRACE_SECONDS = 3  # a rank that traps SIGTERM after a peer failed gets SIGKILL after this
# CPU ranks are forked (torch is imported already; this agent runs no tensor op, so no OpenMP pool breaks in a
# child). CUDA ranks are spawned, as CUDA does not survive fork, except under the warm agent (no CUDA init there).
START_METHODS = {"cpu": "fork", "cuda": "spawn"}


def main(job_dir: str, warm: bool = False) -> int:
    """Run the job's ranks. `warm`: this agent was forked from the warm agent, so its ranks are forked whatever
    the device, and each sets its threads itself (torch was imported before the job's environment was set)."""
    from pytest_distperf.launch import jobfiles

    jobfiles.die_with_parent(signal.SIGTERM)  # SIGTERM: elastic's handler then stops the ranks
    jobfiles.no_core_dumps()  # inherited by the ranks, also a crash before rank_main runs
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
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
    return run_ranks(lambda: dict(elastic_launch(config, entry)(job_dir)),
                     lambda result: jobfiles.write_result(job_dir, result))


def run_ranks(run: Callable[[], dict[int, Any]], write: Callable[[Any], None], host: str | None = None) -> int:
    """Write how run() ended as the agent's result: 0 its values, 1 failed ranks, 2 the agent's own error
    (rendezvous failure, a lost store, SIGTERM from the launcher, ...)."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    from pytest_distperf.launch import jobfiles

    try:
        write(jobfiles.AgentResult(values=run(), host=host))
        return 0
    except ChildFailedError as e:
        write(jobfiles.AgentResult(failures=rank_failures(e, host), host=host))
        return 1
    except BaseException as e:
        import traceback

        write(jobfiles.AgentResult(agent_error="".join(traceback.format_exception(e)), host=host))
        return 2


@dataclasses.dataclass(frozen=True)
class WarmRankSetup:
    """What a rank forked from a warm agent's job agent sets for itself to start as a fresh launch's would."""

    threads: int | None  # torch.set_num_threads: the job's OMP_NUM_THREADS (None: torch's default, as loaded)
    drop_env: tuple[str, ...]  # variables only the agent needed (the NVML-based CUDA check)


def warm_rank_setup() -> WarmRankSetup:
    """In a job agent forked from the warm agent: torch.cuda checks through NVML (no cuInit, so its ranks can
    still be forked for CUDA), and the job's threads, which libgomp read when the warm agent loaded torch."""
    from pytest_distperf.launch.devices import NVML_CHECK

    drop: tuple[str, ...] = ()
    if NVML_CHECK not in os.environ:
        os.environ[NVML_CHECK] = "1"
        drop = (NVML_CHECK,)
    import torch.cuda

    if hasattr(torch.cuda, "_cached_device_count"):  # counted under another job's CUDA_VISIBLE_DEVICES
        torch.cuda._cached_device_count = None
    try:  # as libgomp reads it for the outermost level ("4" or "4,2")
        threads = int(os.environ.get("OMP_NUM_THREADS", "").split(",")[0])
    except ValueError:
        threads = 0
    return WarmRankSetup(threads=threads if threads > 0 else None, drop_env=drop)


def forked_rank_entry(warm: WarmRankSetup | None) -> Any:
    """The rank entry elastic forks (a named function: elastic uses its name). A forked rank would keep torch
    elastic's signal handlers (they raise instead of ending the rank): Python's own come back. A rank of a warm
    agent also takes the job's threads and drops the agent's own variables."""

    def forked_rank_main(job_dir: str) -> Any:
        python_signal_handlers()
        if warm is not None:
            for name in warm.drop_env:
                os.environ.pop(name, None)
            if warm.threads is not None:
                import torch

                torch.set_num_threads(warm.threads)
        from pytest_distperf.rank.worker import rank_main

        return rank_main(job_dir)

    return forked_rank_main


def python_signal_handlers(*more: signal.Signals) -> None:
    """The handlers a new Python process starts with, for a process forked from one that changed them."""
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, *more):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def rank_failures(error: Any, host: str | None = None) -> list["jobfiles.RankFailure"]:
    """torch elastic's ChildFailedError as RankFailures."""
    from pytest_distperf.launch import jobfiles

    return [jobfiles.RankFailure(rank=rank, exitcode=f.exitcode, host=host, timestamp=f.timestamp,
                                 signal=jobfiles.signal_name(-f.exitcode) if f.exitcode < 0 else None,
                                 message=jobfiles.error_text(f.message))
            for rank, f in sorted(error.failures.items())]


def record_rank_exits(job_dir: str) -> None:
    """Note how each rank's process ended when torch's ProcessContext.join() reaps it: elastic reports only the
    rank it sees fail first, and a rank that leaves by os._exit(0) not at all (its peers would read as the cause).
    Once the ranks are done (join returned True or raised), their error files go too: torch writes a failed rank's
    traceback to /tmp/pytorch-errorfile-*.pickle and never removes it (the job's failure is read from the job
    folder, not from there)."""
    from torch.multiprocessing.spawn import ProcessContext

    from pytest_distperf.launch import jobfiles

    join = ProcessContext.join

    def join_noting_exits(self: Any, *args: Any, **kwargs: Any) -> Any:
        done = True  # unless join returns False: the ranks are still running
        try:
            done = join(self, *args, **kwargs)
            return done
        finally:
            ranks = {pid: rank for rank, pid in jobfiles.started_ranks(job_dir).items()}
            for process in getattr(self, "processes", ()):
                code = process.exitcode
                if code is not None and process.pid in ranks:
                    jobfiles.write_exit(job_dir, ranks[process.pid], code >= 0, abs(code))
            if done:
                for path in getattr(self, "error_files", ()):
                    with contextlib.suppress(OSError, TypeError):
                        os.remove(path)

    ProcessContext.join = join_noting_exits  # type: ignore[method-assign]


def plain_torch_log_format() -> None:
    """torch's log formatter imports the compiler stack (seconds) the first time it formats an exception, which
    torch elastic logs when a rank fails: its records go to a plain handler instead (same stream, same levels)."""
    import logging

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname).1s%(asctime)s %(process)d %(name)s] %(message)s"))
    for name in ("torch.distributed.elastic", "torch.distributed.launcher"):
        logger = logging.getLogger(name)
        logger.addHandler(handler)
        logger.propagate = False


def _shutdown_grace(config_cls: type) -> dict[str, int]:
    """A rank that traps SIGTERM after a peer failed (Lightning does) gets SIGKILL after SHUTDOWN_GRACE_SECONDS
    instead of torch's 30 s; older torch has no such field."""
    names = {f.name for f in dataclasses.fields(config_cls)}
    return {"shutdown_timeout": SHUTDOWN_GRACE_SECONDS} if "shutdown_timeout" in names else {}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
