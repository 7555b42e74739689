"""The script agent: `python -m pytest_distperf.agents.script JOB_DIR`, for jobs launched as Lightning's users
launch them and for a user's own training script (distperf.script_job, under its own launcher).

It stands where the user's shell stands: it starts rank 0 (`python -m pytest_distperf.rank.script JOB_DIR`, or
the script) and waits; the framework in rank 0 starts the other ranks. When rank 0 has exited, the values and
errors the ranks left become the same AgentResult the elastic agent writes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from pytest_distperf.launch import jobfiles
from pytest_distperf.spec.job import JobSpec
from pytest_distperf.spec.profiles import SCRIPT_LAUNCHERS

RANK_EXIT_GRACE_SECONDS = 5.0  # ranks started by rank 0 die with it (PR_SET_PDEATHSIG); wait that long at most
FAIL_FAST_GRACE_SECONDS = 1.0  # after a rank's error, how long the others may take to write theirs
SITE_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "rank", "script_site")


def script_command(job: JobSpec, job_dir: str) -> tuple[list[str], dict[str, str], str]:
    """(command, environment added, working folder) of a script job: the user's launcher on the user's script,
    with distperf's sitecustomize first on the path (it installs the step watch in the script's processes)."""
    script = job.script
    assert script is not None
    launcher = SCRIPT_LAUNCHERS[script.launcher](job.world_size, job.device)
    command = [sys.executable, *launcher, script.path, *script.args]
    path = [SITE_DIR] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = {**dict(script.env), "PYTHONPATH": os.pathsep.join(path), "DISTPERF_SCRIPT": os.path.realpath(script.path),
           "DISTPERF_SCRIPT_JOB": os.path.abspath(job_dir)}
    return command, env, script.cwd or os.path.dirname(script.path)


def collect(job_dir: str, world_size: int, rank0_exitcode: int, launcher: str | None = None) -> "object":
    """The AgentResult of a script job from the files its ranks left. `launcher`: the script's (distperf.script_job),
    None for a job launched as Lightning's users launch it (rank.script)."""
    values = jobfiles.read_rank_values(job_dir)
    errors = jobfiles.rank_error_files(job_dir)
    raised = jobfiles.read_failure_times(job_dir)
    failures = []
    for rank, path in sorted(errors.items()):
        code, sig = _exit(rank, rank in raised, launcher, rank0_exitcode)
        with open(path, errors="replace") as f:
            failures.append(jobfiles.RankFailure(rank=rank, exitcode=code, signal=sig, message=f.read(),
                                                 timestamp=int(os.path.getmtime(path))))
    # A rank that died of a signal left no error, only its stacks (faulthandler): it is the root cause, not the
    # peers whose connections it broke.
    fatal = {rank: text for rank, text in jobfiles.read_fatal_reports(job_dir).items() if rank not in errors}
    failures += [jobfiles.fatal_failure(rank, text, int(time.time())) for rank, text in sorted(fatal.items())]
    if jobfiles.read_outcomes(job_dir):  # a rank stopped on pytest.skip/xfail: the launcher reads that first
        return jobfiles.AgentResult(values=values)
    if rank0_exitcode != 0 and 0 not in errors and 0 not in fatal and 0 not in values:
        sig = jobfiles.signal_name(-rank0_exitcode) if rank0_exitcode < 0 else None
        how = f"died of {sig}" if sig else f"exited with code {rank0_exitcode}"
        # After another rank's error rank 0 was ended because of it (by this agent, or Lightning's own watcher):
        # no signal is reported, or the launcher would take it for the root cause.
        why = (f" after rank(s) {sorted(errors)} failed: a job ends every rank when one fails" if errors
               else " without an error")
        failures.append(jobfiles.RankFailure(rank=0, exitcode=rank0_exitcode, signal=None if errors else sig,
                                             timestamp=int(time.time()),
                                             message=f"rank 0 (the script process) {how}{why}"))
    if failures:
        now, started = int(time.time()), jobfiles.started_ranks(job_dir)
        for rank in range(world_size):  # ranks that ended with rank 0, without a value or an error of their own
            if rank not in values and rank not in errors and all(f.rank != rank for f in failures):
                why = ("ended without a value or an error (stopped with the script's other ranks)" if rank in started
                       else "never ran the script (no process of the job started it)")
                failures.append(jobfiles.RankFailure(rank=rank, exitcode=-1, signal=None, timestamp=now, message=why))
        return jobfiles.AgentResult(failures=failures)
    return jobfiles.AgentResult(values=values)


def _exit(rank: int, raised: bool, launcher: str | None, rc: int) -> tuple[int, str | None]:
    """(exit code, signal) of a rank that left an error, where this agent knows them; (-1, None) where it does not
    (launcher._failure_message says so): a script's ranks are waited for by the script's launcher, and a script that
    ended early may well have exited 0."""
    if launcher is None or raised:
        return 1, None  # rank.script returns 1 after its error; Python exits 1 after an exception the script raised
    if launcher == "python" and rank == 0:  # the process this agent started is rank 0 itself
        return rc, jobfiles.signal_name(-rc) if rc < 0 else None
    if launcher != "python" and rc == 0:
        return 0, None  # torchrun, deepspeed and accelerate exit 0 only when every rank did
    return -1, None


def main(job_dir: str) -> int:
    jobfiles.die_with_parent(signal.SIGTERM)
    jobfiles.no_core_dumps()  # a core file delays every crash report
    job = jobfiles.read_job(job_dir)
    # Inside a SLURM allocation Lightning would take SLURMEnvironment (ranks started by srun) and start no ranks
    # of its own: the script runs as on a workstation, where `python script.py` starts them.
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    command, cwd = [sys.executable, "-m", "pytest_distperf.rank.script", job_dir], None
    if job.script is not None:
        command, added, cwd = script_command(job, job_dir)
        env.update(added)
    try:
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, env=env, cwd=cwd)
    except OSError as e:
        jobfiles.write_result(job_dir, jobfiles.AgentResult(agent_error=f"could not start the script: {e}"))
        return 2
    # The launcher ends the whole tree on a timeout; a SIGTERM to this agent alone goes on to rank 0.
    signal.signal(signal.SIGTERM, lambda *_: proc.terminate())
    failed_since = None
    while proc.poll() is None:
        # Fail fast, as the elastic agent does: once a rank has left its error, end rank 0 after a moment
        # instead of waiting on collectives that never complete (Lightning's own watcher looks every 5 s).
        if failed_since is None and jobfiles.rank_error_files(job_dir):
            failed_since = time.monotonic()
        if failed_since is not None and time.monotonic() - failed_since > FAIL_FAST_GRACE_SECONDS:
            # a launcher ends its ranks on SIGTERM (torchrun, deepspeed); Lightning's rank 0 takes its ranks along
            proc.terminate() if job.script is not None else proc.kill()
        time.sleep(0.05)
    rc = proc.returncode
    from pytest_distperf.launch.launcher import pid_alive

    deadline = time.monotonic() + RANK_EXIT_GRACE_SECONDS
    while time.monotonic() < deadline and any(
            pid_alive(pid) for rank, pid in jobfiles.started_ranks(job_dir).items() if rank != 0):
        time.sleep(0.05)
    jobfiles.write_result(job_dir, collect(job_dir, job.world_size, rc, job.script.launcher if job.script else None))
    return 0 if rc == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
