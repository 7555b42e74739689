"""The warm launch agent: `python -m pytest_distperf.agents.warm DEVICE`, one per session, device kind and agent
environment (launch/warm_pool.py). It imports torch, the rank code and the strategy libraries once, holds no CUDA
context, stays single-threaded and runs no tensor op, and for each job forks a child that becomes the job's
elastic agent as a fresh process would be (own session, log, environment, cwd, affinity): only imports are shared.

Protocol, one JSON object a line: the launcher sends {"job_dir", "env", "cwd", "affinity", "log", "imports"};
this agent answers once {"ready": true, ...} (or {"ready": false, "reason"}), then per job, once it has imported
what "imports" adds, {"started": pid, "imports_seconds"} (or {"refused": reason}, and it exits) and
{"exited": pid, "status": code}. EOF on stdin ends it.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import signal
import sys
import threading
import time
from typing import Any

from pytest_distperf.launch.warm_pool import Channel

# torch._dynamo: torch's compile stack, which DDP and FSDP2 import when they wrap a model (seconds).
HARNESS_MODULES = ("torch", "torch._dynamo", "torch.distributed",
                   "torch.distributed.elastic.multiprocessing", "torch.distributed.launcher.api",
                   "pytest_distperf.agents.elastic", "pytest_distperf.launch.rendezvous", "pytest_distperf.rank.worker",
                   "pytest_distperf.rank.prepare", "pytest_distperf.rank.timing", "pytest_distperf.strategies")
# Not lightning: importing it starts a native thread, under which forked ranks aborted in the profiler's stop.
# Lightning's jobs import it in their ranks, as with a fresh agent. What a library imports on a job's first use
# comes with the first job that needs it (warm_pool.job_imports).
STRATEGY_LIBRARIES = ("deepspeed", "accelerate")


def cuda_forks_cleanly() -> str | None:
    """None when a process forked from here can use CUDA, else why not: a library may call cuInit at import,
    past torch's own lazy-init flag, so a forked child tries it."""
    import torch

    if torch.cuda.is_initialized():
        return "importing the strategy libraries initialised CUDA in the agent"
    pid = os.fork()
    if pid == 0:
        try:
            torch.zeros(1, device="cuda").add_(1)
            torch.cuda.synchronize()
            code = 0
        except BaseException:
            code = 4
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        return "a process forked from the agent could not initialise CUDA (a preloaded library initialised the driver)"
    return None


def preload(device: str = "cpu") -> tuple[list[str], str | None]:
    """Import what the job agents and ranks need; ([modules imported], why this agent cannot serve or None)."""
    loaded: list[str] = []
    for name in HARNESS_MODULES:
        importlib.import_module(name)
        loaded.append(name)
    import_libraries(STRATEGY_LIBRARIES, loaded)
    return loaded, fork_problem(device)


def import_libraries(names: Any, loaded: list[str]) -> None:
    """Import each of `names` not yet in `loaded`, adding it there; one whose library is not installed, or failed
    to import, is left to the ranks, as in a fresh agent."""
    for name in names:
        library = name.split(".")[0]
        if importlib.util.find_spec(library) is None or (name != library and library not in loaded):
            continue
        try:
            importlib.import_module(name)
        except Exception as e:  # a broken library, another version's layout: the ranks import it themselves
            print(f"distperf warm agent: not preloading {name}: {type(e).__name__}: {e}", file=sys.stderr)
            continue
        loaded.append(name)


def fork_problem(device: str) -> str | None:
    """None while a child forked from here is a clean process to its ranks, else why not."""
    if threading.active_count() > 1:
        names = ", ".join(t.name for t in threading.enumerate() if t is not threading.main_thread())
        return f"importing the strategy libraries started Python threads ({names}), unsafe to fork"
    if device == "cuda":  # a CPU job's ranks never touch the GPU
        return cuda_forks_cleanly()
    return None


def run_job(request: dict[str, Any], channel: Channel) -> None:
    """In the forked child: become the job's elastic agent, as a fresh process would be."""
    os.setsid()  # own session and process group: the launcher ends the job's tree by it
    os.close(channel.read_fd)
    os.close(channel.write_fd)
    from pytest_distperf.agents.elastic import python_signal_handlers

    python_signal_handlers(signal.SIGUSR1)
    log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.close(devnull)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    if request.get("affinity") and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, request["affinity"])
    code = 2
    try:
        from pytest_distperf.agents import elastic as agent

        code = agent.main(request["job_dir"], warm=True)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


def main() -> int:
    from pytest_distperf.launch import jobfiles

    jobfiles.die_with_parent(signal.SIGKILL)  # the pytest process gone: so is this agent (its jobs die with it)
    # The protocol moves off fds 0/1, so that whatever an import prints lands in this agent's log (stderr).
    channel = Channel(os.dup(0), os.dup(1))
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)
    started = time.monotonic()
    device = sys.argv[1] if len(sys.argv) > 1 else "cpu"
    try:
        loaded, problem = preload(device)
    except BaseException as e:
        channel.send({"ready": False, "reason": f"preloading failed: {type(e).__name__}: {e}"})
        return 1
    if problem:
        channel.send({"ready": False, "reason": problem, "preloaded": loaded})
        return 1
    tried = set(loaded)  # names imported, or tried, here: a job's imports are tried once
    channel.send({"ready": True, "pid": os.getpid(), "preloaded": loaded,
                  "seconds": round(time.monotonic() - started, 3)})
    while True:
        request = channel.receive()
        if request is None:  # the launcher closed the pipe: the session is over
            return 0
        job_started = time.monotonic()
        wanted = [name for name in request.get("imports", ()) if name not in tried]
        if wanted:  # once a name: an import that failed may still have started a thread or touched CUDA
            tried.update(wanted)
            import_libraries(wanted, loaded)
            problem = fork_problem(device)
            if problem:
                channel.send({"refused": problem})
                return 1
        pid = os.fork()
        if pid == 0:
            run_job(request, channel)  # never returns
        channel.send({"started": pid, "imports_seconds": round(time.monotonic() - job_started, 3) if wanted
                      else 0.0})
        _, status = os.waitpid(pid, 0)
        channel.send({"exited": pid, "status": os.waitstatus_to_exitcode(status)})


if __name__ == "__main__":
    sys.exit(main())
