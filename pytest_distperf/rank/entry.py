"""Rank entry for torchrun: `python -m torch.distributed.run ... -m pytest_distperf.rank.entry JOB_DIR`.

torchrun runs a module in each rank, not a function whose value it hands back, so this entry
writes where the rank runs (host, node, log folder) and, on success, its value into the job
folder, which every node shares with the pytest process. Everything else is the worker's
rank_main, the same as under the local launcher.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import socket
import sys

from pytest_distperf.launch import jobfiles

AGENT_INDEX_ENV = "DISTPERF_AGENT_INDEX"  # set by the node agent: which agent of the job started this rank


def main(job_dir: str) -> int:
    jobfiles.die_with_parent()  # a killed node agent takes its ranks with it
    # Before the place file, through which the node agent finds this rank to ask for its stacks on a timeout.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    rank = int(os.environ["RANK"])
    error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
    place = jobfiles.RankPlace(
        rank=rank, host=socket.gethostname(), agent=int(os.environ.get(AGENT_INDEX_ENV, "-1")),
        node_rank=int(os.environ.get("GROUP_RANK", "0")), local_rank=int(os.environ.get("LOCAL_RANK", "0")),
        pid=os.getpid(), log_dir=os.path.dirname(error_file) if error_file else None)
    jobfiles.write_rank_place(job_dir, place)

    from pytest_distperf.rank.results import RankResult
    from pytest_distperf.rank.worker import rank_main

    value = rank_main(job_dir)  # raises on failure: @record leaves the traceback for the node agent
    if isinstance(value, RankResult):  # a measured job: each rank's numbers say which node they come from
        value.host, value.node_rank = place.host, place.node_rank
    jobfiles.write_rank_value(job_dir, rank, value)
    return 0


if __name__ == "__main__":
    code = main(sys.argv[1])
    # A finished rank leaves as a forked one does (multiprocessing ends its children with os._exit): without C++'s
    # static destructors, one of which (kineto's profiler handler, a joinable std::thread) has aborted a rank whose
    # value was already written ("terminate called without an active exception").
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
