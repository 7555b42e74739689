"""Start a job's ranks on this host and get their return values back.

pytest ──► agent (torch elastic_launch, own session, c10d on 127.0.0.1, no restarts) ──► N ranks. The agent is
forked from the session's warm agent (warm_pool.py) unless `fresh_agent`, a script job or a warm agent that cannot
serve. On the timeout every rank dumps its Python stacks (SIGUSR1), then the whole tree gets SIGTERM and, after a
grace, SIGKILL; nothing is left behind on any exit path, Ctrl-C included.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

import psutil

from pytest_distperf.errors import JobError, JobTimeout, ProfilerAbortWarning, warn
from pytest_distperf.launch import jobfiles
from pytest_distperf.launch.devices import CPU_ONLY_ENVIRONMENT, usable_cores
from pytest_distperf.spec import profiles
from pytest_distperf.spec.job import JobSpec

POLL_SECONDS = 0.05
TERM_GRACE_SECONDS = 3.0
STACK_DUMP_SECONDS = 1.0
# A rank gone without a value or an error (torch elastic would wait for ever) fails the job after this grace,
# which lets the agent report a crash first.
VANISHED_GRACE_SECONDS = 8.0
# A fatal-signal report whose death the agent has not reported after this long (a core dump being written).
FATAL_REPORT_GRACE_SECONDS = 10.0
# Without these gloo, TensorPipe and NCCL's bootstrap listen on the address the hostname resolves to.
LOOPBACK_ENVIRONMENT = {"GLOO_SOCKET_IFNAME": "lo", "TP_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"}


class RankFailed(JobError):
    def __init__(self, message: str, failures: list[jobfiles.RankFailure], job_dir: str):
        super().__init__(message, job_dir)
        self.failures = failures


class RankOutcome(Exception):
    """A rank stopped on pytest.skip() or pytest.xfail(): the test takes that outcome."""

    def __init__(self, outcome: str, reason: str, rank: int):
        super().__init__(f"rank {rank}: {reason}")
        self.outcome, self.reason, self.rank = outcome, reason, rank


def threads_per_rank(local_ranks: int) -> int:
    """Intra-op threads per rank: the usable cores split between this machine's ranks, as Lightning's launcher
    does (torch's default, a thread per core in every rank, oversubscribes the host)."""
    return max(1, usable_cores() // max(1, local_ranks))


def launch_threads(job: JobSpec, env: dict[str, str]) -> dict[str, str]:
    """OMP_NUM_THREADS as the job's launch profile sets it (spec/profiles.py)."""
    return profiles.thread_environment(profiles.PROFILES[job.launch_profile], env, job.world_size, job.device,
                                       usable_cores(), psutil.cpu_count(logical=False) or usable_cores())


def agent_environment(job: JobSpec, overrides: dict[str, str] | None = None, *,
                      loopback: bool = True) -> dict[str, str]:
    """The environment of the agent and so of every rank. `loopback`: all ranks on this machine."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHELASTIC_")}
    env.update(overrides or {})
    path = [p for p in job.sys_path if p] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(path))
    env["PYTHONUNBUFFERED"] = "1"
    env.update(launch_threads(job, env))
    if loopback:
        env.update(LOOPBACK_ENVIRONMENT)  # over a user's cluster settings: a local job never listens on the network
    if job.device == "cpu":
        env.update(CPU_ONLY_ENVIRONMENT)
    return env


# A rank may abort inside torch.profiler's stop during distperf's own profiled phases (a heap corruption of unknown
# cause: docs/design/known-defects.md): that run is measured once more, with a ProfilerAbortWarning.
_PROFILER_STOP = re.compile(r'torch/profiler/profiler\.py", line \d+ in (stop|__exit__)')
_OWN_PROFILED_PHASE = re.compile(r'pytest_distperf/rank/(work|probes/\w+)\.py", line \d+')


def is_profiler_abort(error: "RankFailed") -> bool:
    """A rank died of SIGABRT or SIGSEGV in torch.profiler's stop, inside distperf's work or probe phase."""
    text = str(error)
    return (any(f.signal in ("SIGABRT", "SIGSEGV") for f in error.failures)
            and bool(_PROFILER_STOP.search(text)) and bool(_OWN_PROFILED_PHASE.search(text)))


def launch(job: JobSpec, *, timeout: float, base_dir: str | None = None,
           on_progress: Callable[[str, float], None] | None = None, keep: bool = False,
           env: dict[str, str] | None = None, fresh_agent: bool = False) -> dict[int, Any]:
    """Run the job on `job.world_size` ranks; return {rank: value} or raise a JobError/RankOutcome.
    `fresh_agent`: a new agent process instead of one forked from the warm agent."""
    once = functools.partial(_launch_once, job, timeout=timeout, base_dir=base_dir, on_progress=on_progress,
                             keep=keep, env=env, fresh_agent=fresh_agent)
    try:
        return once()
    except RankFailed as e:
        if not is_profiler_abort(e):
            raise
        aborted = e.job_dir
    warn(ProfilerAbortWarning(
        f"distperf job {job.describe()}: a rank died in torch.profiler's stop during distperf's profiled phase "
        f"(a known, rare heap corruption: docs/design/known-defects.md); the run is measured again. The aborted "
        f"run's folder: {aborted}"))
    return once()


def _launch_once(job: JobSpec, *, timeout: float, base_dir: str | None, on_progress: Callable[[str, float], None]
                 | None, keep: bool, env: dict[str, str] | None, fresh_agent: bool) -> dict[int, Any]:
    job_dir = tempfile.mkdtemp(prefix="job-", dir=base_dir)
    jobfiles.write_job(job_dir, job)
    start = time.monotonic()
    agent_env = agent_environment(job, env)
    agent_ok = False
    with jobfiles.dropped_on_success(job_dir, keep), open(os.path.join(job_dir, jobfiles.AGENT_LOG), "wb") as log:
        proc, warm = _start_agent(job, job_dir, agent_env, log, base_dir, timeout, fresh_agent)
        try:
            _watch(job, job_dir, proc, start, timeout, on_progress)
            try:
                values = _collect(job, job_dir)
            except RankOutcome:
                agent_ok = True  # a skip or xfail: the agent did nothing wrong
                raise
            agent_ok = True
            return values
        finally:
            end_tree(proc)  # no-op after a clean exit; Ctrl-C and errors land here too
            if warm is not None:  # a failed or timed-out job ends its warm agent: the next job gets a new one
                from pytest_distperf.launch import warm_pool

                warm_pool.release(warm, ok=agent_ok)


def _start_agent(job: JobSpec, job_dir: str, env: dict[str, str], log: Any, base_dir: str | None, timeout: float,
                 fresh_agent: bool) -> tuple[Any, Any]:
    """(the job's agent process, the warm agent it was forked from or None): torch elastic's agent, or the
    script agent for a job launched as a script (spec/profiles.py)."""
    if profiles.PROFILES[job.launch_profile].starter == "script":
        agent = "pytest_distperf.agents.script"
    else:
        agent = "pytest_distperf.agents.elastic"
        if not fresh_agent:
            from pytest_distperf.launch import warm_pool

            warm, _ = warm_pool.agent_for(job.device, env, base_dir or tempfile.gettempdir(), timeout)
            if warm is not None:
                try:
                    return warm.start_job(job_dir, env, log.name, warm_pool.job_imports(job)), warm
                except OSError:
                    warm_pool.release(warm, ok=False)
    proc = subprocess.Popen([sys.executable, "-m", agent, job_dir], env=env, stdin=subprocess.DEVNULL, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    return proc, None


def _watch(job: JobSpec, job_dir: str, proc: Any, start: float, timeout: float,
           on_progress: Callable[[str, float], None] | None) -> None:
    """Until the agent exits: end the job on its timeout, a rank gone without a word, or an unreported fatal
    signal."""
    last = None
    vanished_since: float | None = None
    fatal_since: float | None = None
    while proc.poll() is None:
        elapsed = time.monotonic() - start
        if elapsed > timeout:
            _dump_stacks(proc.pid, job_dir)
            end_tree(proc)
            raise JobTimeout(_timeout_message(job, job_dir, timeout), job_dir)
        vanished = _vanished_ranks(job_dir)
        vanished_since = (vanished_since or time.monotonic()) if vanished else None
        if vanished_since and time.monotonic() - vanished_since > VANISHED_GRACE_SECONDS:
            end_tree(proc)
            raise JobError(_vanished_message(job, job_dir, vanished), job_dir)
        fatal = jobfiles.read_fatal_reports(job_dir)
        fatal_since = (fatal_since or time.monotonic()) if fatal else None
        if fatal_since and time.monotonic() - fatal_since > FATAL_REPORT_GRACE_SECONDS:
            end_tree(proc)  # SIGKILL also ends a core dump in progress
            now = int(time.time())
            raise _rank_failed(job, job_dir, [jobfiles.fatal_failure(rank, text, now) for rank, text in
                                              sorted(fatal.items())], late=True)
        last = jobfiles.forward_progress(job_dir, on_progress, elapsed, last)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(POLL_SECONDS)  # back at once when the agent exits, else check again


def _collect(job: JobSpec, job_dir: str) -> dict[int, Any]:
    for outcome in jobfiles.read_outcomes(job_dir):
        raise RankOutcome(outcome["outcome"], outcome["reason"], outcome["rank"])
    result = jobfiles.read_result(job_dir)
    if result is None:
        log = jobfiles.tail(os.path.join(job_dir, jobfiles.AGENT_LOG), 40)
        raise JobError(f"distperf agent for {job.describe()} exited without a result\n{log}\njob folder: {job_dir}",
                       job_dir)
    if result.agent_error:
        raise JobError(f"distperf could not launch {job.describe()}:\n{result.agent_error}\njob folder: {job_dir}",
                       job_dir)
    if result.failures:
        quiet = _quiet_exits(job_dir)
        if quiet:  # a rank that left with exit code 0 and no value: its peers failed because of it
            raise JobError(_vanished_message(job, job_dir, quiet), job_dir)
        raise _rank_failed(job, job_dir, result.failures)
    values = result.values or {}
    missing = sorted(set(range(job.world_size)) - set(values))
    if missing:  # every rank exited 0, these without a value: say what each left, for the next look
        started = jobfiles.started_ranks(job_dir)
        left = ", ".join(f"rank {r} " + (f"started (pid {started[r]})" if r in started else "never started") +
                         (", marked returned" if jobfiles.has_returned(job_dir, r) else "") for r in missing)
        hint = ""
        if job.script is not None and job.script.launcher == "python" and not set(missing) & set(started):
            hint = ("\nlauncher='python' runs the script once, as rank 0, and expects its framework (e.g. Lightning's "
                    "Trainer) to start the other ranks; this script started none: use launcher='torchrun' to start "
                    "every rank, or world_size=1")
        raise JobError(f"ranks {missing} of {job.describe()} returned nothing ({left}){hint}\n"
                       f"{_stderr_tails(job, job_dir)}\njob folder: {job_dir}", job_dir)
    return values


def root_cause(failures: list[jobfiles.RankFailure], raised_at: dict[int, float]) -> jobfiles.RankFailure:
    """The rank that failed first on its own, not a peer that failed because of it: one killed by a signal other
    than the agent's SIGTERM (its peers then fail on the broken connection), else the earliest exception by the
    precise times the ranks wrote (raised_at)."""
    killed = [f for f in failures if f.signal and f.signal != "SIGTERM"]
    if killed:
        return min(killed, key=lambda f: (f.timestamp, f.rank))
    own = [f for f in failures if f.signal != "SIGTERM"] or failures
    return min(own, key=lambda f: (raised_at.get(f.rank, float(f.timestamp) + 1.0), f.rank))


def _with_unreported_failures(job_dir: str, failures: list[jobfiles.RankFailure]) -> list[jobfiles.RankFailure]:
    """The failures torch elastic reported plus those it did not: it reports the first failed process it sees,
    which can be a peer that failed a moment after the rank that raised first or was killed."""
    known = {f.rank for f in failures}
    exits = jobfiles.read_exits(job_dir)
    raised = jobfiles.read_failure_times(job_dir)
    killed = {rank: jobfiles.exit_time(job_dir, rank) for rank, (how, status) in exits.items()
              if how == "signal" and jobfiles.signal_name(status) != "SIGTERM" and rank not in raised}
    extra = []
    for rank, at in sorted({**raised, **killed}.items()):
        if rank in known:
            continue
        how, status = exits.get(rank, ("exit", 1))
        sig = None if how == "exit" else jobfiles.signal_name(status)
        extra.append(jobfiles.RankFailure(
            rank=rank, exitcode=status if how == "exit" else -status, signal=sig, timestamp=int(at),
            message=jobfiles.read_rank_error(job_dir, rank) or "(no error file: see its stderr below)"))
    return failures + extra


def _rank_failed(job: JobSpec, job_dir: str, reported: list[jobfiles.RankFailure], late: bool = False) -> RankFailed:
    """The error for failed ranks: what torch elastic reported and what it did not (a rank that died of a signal
    while elastic reported the peer whose connection it broke), one list for the message and for the callers that
    read the failures (is_profiler_abort)."""
    failures = _with_unreported_failures(job_dir, reported)
    return RankFailed(_failure_message(job, job_dir, failures, late), failures, job_dir)


def _failure_message(job: JobSpec, job_dir: str, failures: list[jobfiles.RankFailure], late: bool = False) -> str:
    root = root_cause(failures, jobfiles.read_failure_times(job_dir))
    errors = jobfiles.rank_error_files(job_dir)
    lines = [f"distperf job {job.describe()} failed: rank {root.rank} {_how(root, errors, brief=False)} (root cause)"]
    if late:
        lines.append(f"(its exit was not reported {FATAL_REPORT_GRACE_SECONDS:g} s after the signal -- a core dump "
                     f"being written? -- so every rank was ended)")
    stack = jobfiles.read_fatal_reports(job_dir).get(root.rank) if root.signal else None
    lines += ["", (stack or root.message).rstrip(), ""]
    others = [f for f in failures if f is not root]
    if others:
        lines.append("other ranks: " + ", ".join(f"rank {f.rank} {_how(f, errors, brief=True)}" for f in others))
    lines.append(_stderr_tails(job, job_dir))
    lines.append(f"job folder (logs of every rank): {job_dir}")
    return "\n".join(lines)


def _how(failure: jobfiles.RankFailure, errors: dict[int, str], brief: bool) -> str:
    """How a failed rank ended. A script's rank that left an error with exit code -1: its exit was seen by the
    script's launcher, not by distperf (agents/script.py), so no code is claimed for it."""
    if failure.exitcode == -1 and not failure.signal and failure.rank in errors:
        return "left an error" if brief else "left an error, its exit code seen by the script's launcher only"
    return failure.brief() if brief else failure.how()


def _timeout_message(job: JobSpec, job_dir: str, timeout: float) -> str:
    started = jobfiles.started_ranks(job_dir)
    unstarted = [str(r) for r in range(job.world_size) if r not in started]
    return "\n".join([
        f"distperf job {job.describe()} timed out after {timeout:g} s "
        f"(last progress: {jobfiles.read_progress(job_dir) or 'none'}); every rank was ended.",
        *([f"rank(s) {', '.join(unstarted)} had not started (still importing: no stacks to show); a timeout "
           f"shorter than the ranks' start cannot show where they were"] if unstarted else []),
        "Python stacks of each rank at the timeout (faulthandler):",
        _stderr_tails(job, job_dir, lines=60),
        f"job folder (logs of every rank): {job_dir}",
    ])


def _stderr_tails(job: JobSpec, job_dir: str, lines: int = 15) -> str:
    tails = {rank: jobfiles.tail(jobfiles.rank_log(job_dir, rank), lines).rstrip() for rank in range(job.world_size)}
    return "\n".join(f"--- rank {rank} stderr (last {lines} lines) ---\n{text or '(empty)'}"
                     for rank, text in tails.items())


def pid_alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _vanished_ranks(job_dir: str) -> dict[int, int]:
    return {rank: pid for rank, pid in jobfiles.started_ranks(job_dir).items()
            if not jobfiles.has_returned(job_dir, rank) and not pid_alive(pid)}


def _quiet_exits(job_dir: str) -> dict[int, int]:
    """{rank: pid} of the ranks that ended with exit code 0 without returning a value."""
    started = jobfiles.started_ranks(job_dir)
    return {rank: started.get(rank, 0) for rank, how in jobfiles.read_exits(job_dir).items()
            if how == ("exit", 0) and not jobfiles.has_returned(job_dir, rank)}


def _vanished_message(job: JobSpec, job_dir: str, vanished: dict[int, int]) -> str:
    ranks = ", ".join(f"rank {r} (pid {p})" for r, p in sorted(vanished.items()))
    return "\n".join([
        f"distperf job {job.describe()} failed: {ranks} exited without returning a value and without an error "
        "(os._exit or sys.exit(0) inside the rank?). A rank that does not run the test body to its end is a failure; "
        "the other ranks were ended.",
        _stderr_tails(job, job_dir),
        f"job folder (logs of every rank): {job_dir}",
    ])


def _dump_stacks(agent_pid: int, job_dir: str) -> None:
    """SIGUSR1 to the ranks under the agent (those that left their pid): faulthandler writes each one's stacks to
    its log. Never to a process between the agent and its ranks (torchrun under a script job): with no handler,
    SIGUSR1 would end it and leave its ranks running with no stacks written."""
    try:
        tree = psutil.Process(agent_pid).children(recursive=True)
    except psutil.Error:
        return
    ranks = {*jobfiles.started_ranks(job_dir).values(), *(p.pid for p in jobfiles.read_rank_places(job_dir).values())}
    for p in tree:
        if p.pid in ranks:
            _signal(p, signal.SIGUSR1)
    time.sleep(STACK_DUMP_SECONDS)


def end_tree(proc: Any) -> None:
    """SIGTERM the agent's whole tree, then SIGKILL what is left after a grace. `proc`: a Popen or a
    warm_pool.WarmJob."""
    try:
        tree = [psutil.Process(proc.pid)]
        tree += tree[0].children(recursive=True)
    except psutil.Error:
        tree = []
    if proc.poll() is None or any(p.is_running() for p in tree[1:]):
        for p in tree:
            _signal(p, signal.SIGTERM)
        _, alive = psutil.wait_procs(tree, timeout=TERM_GRACE_SECONDS)
        for p in alive:
            _signal(p, signal.SIGKILL)
        psutil.wait_procs(alive, timeout=TERM_GRACE_SECONDS)
    try:
        proc.wait(timeout=TERM_GRACE_SECONDS)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    # What is left in the agent's process group (multiprocessing's resource tracker, an orphaned rank): a group
    # outlives its leader.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def _signal(p: psutil.Process, sig: int) -> None:
    with contextlib.suppress(psutil.Error):
        p.send_signal(sig)
