"""`python -m pytest_distperf.rank.script JOB_DIR`: a rank of a job launched as the framework's users
launch it (launch profile "lightning", see pytest_distperf.spec.profiles).

Rank 0 is this process, started by the script agent the way a user runs `python script.py`. The
framework's own launcher inside it (Lightning: `Trainer(devices=N).fit`, `Fabric(devices=N).launch()`)
starts ranks 1..N-1 by running this same command again with LOCAL_RANK set, picks the threads per
rank and initialises the process group: nothing of that is done here. Each rank runs the worker's
measurement (pytest_distperf.rank.worker.run_strategy) and leaves its value or its error in the job
folder for the script agent; rank 0 waits for the ranks it started before it exits (they die with it).
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import sys
import traceback


def own_logs(job_dir: str, rank: int) -> None:
    """Each rank writes to its own stdout/stderr logs, where the launcher reads a failed rank's last lines
    (children inherit rank 0's descriptors from the framework's launcher)."""
    from pytest_distperf.launch import jobfiles

    folder = os.path.join(job_dir, jobfiles.LOGS, "script", "attempt_0", str(rank))
    os.makedirs(folder, exist_ok=True)
    for name, stream, fd in (("stdout", sys.stdout, 1), ("stderr", sys.stderr, 2)):
        stream.flush()
        f = os.open(os.path.join(folder, f"{name}.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(f, fd)
        os.close(f)


def _die_with_rank_zero() -> None:
    """End this rank when rank 0 is gone. Not PR_SET_PDEATHSIG: it fires when the *thread* that started the
    process exits, and Lightning's Trainer starts ranks from the thread that runs `fit`, which ends (close())
    before these ranks have written their values."""
    import threading
    import time

    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="distperf-rank0-watch", daemon=True).start()


def _wait_for_started_ranks(job_dir: str, world_size: int) -> None:
    """Until every rank the framework started has exited (not just registered: a slow one may not have yet)."""
    import time

    import psutil

    from pytest_distperf.launch import jobfiles

    while True:
        started = jobfiles.started_ranks(job_dir)
        ours = set()
        for child in psutil.Process().children():
            with contextlib.suppress(psutil.Error):
                if child.status() != psutil.STATUS_ZOMBIE:
                    ours.add(child.pid)
        pending = [pid for rank, pid in started.items() if rank != 0 and pid in ours]
        if not pending and (len(started) >= world_size or not ours):
            return
        time.sleep(0.05)


def main(job_dir: str) -> int:
    from pytest_distperf.launch import jobfiles
    from pytest_distperf.launch.jobfiles import write_rank_error, write_rank_value

    rank = int(os.environ.get("LOCAL_RANK", "0"))  # one node: the framework sets LOCAL_RANK for ranks 1..N-1
    own_logs(job_dir, rank)
    if rank == 0:
        jobfiles.die_with_parent()
    else:
        _die_with_rank_zero()
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    faulthandler.enable(jobfiles.fatal_report_file(job_dir, rank), all_threads=True)  # stacks on a fatal signal
    job = jobfiles.start_rank(job_dir, rank)

    import torch

    from pytest_distperf.rank import worker

    device = torch.device("cuda", rank) if job.device == "cuda" else torch.device("cpu")
    progress = jobfiles.Progress(job_dir) if rank == 0 else None  # read by -v and by a timeout's message
    try:
        value = worker.run_strategy(job, rank, rank, device, job_dir, progress)
    except BaseException as e:
        jobfiles.write_failure_time(job_dir, rank)
        outcome = worker._pytest_outcome(e)
        if outcome is not None:
            jobfiles.write_outcome(job_dir, rank, outcome, str(getattr(e, "msg", e)))
            return worker.EXIT_OUTCOME
        text = "".join(traceback.format_exception(e))
        if isinstance(e, torch.OutOfMemoryError) and device.type == "cuda":
            text += "\n" + worker._oom_message(rank, device)
        write_rank_error(job_dir, rank, text)
        traceback.print_exc()
        return 1
    write_rank_value(job_dir, rank, value)
    jobfiles.mark_returned(job_dir, rank)
    if rank == 0:
        _wait_for_started_ranks(job_dir, job.world_size)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
