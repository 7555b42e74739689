"""The files a job leaves in its folder, shared by the launcher, the agent and the ranks.

    job.pkl             the JobSpec (written by the launcher)
    progress.txt        rank 0's current phase, read by the launcher for -v output
    outcome-rank{r}.json  a rank that stopped on pytest.skip / pytest.xfail
    failed-rank{r}.time   when a rank raised (to find the root cause among failed ranks)
    fatal-rank{r}.log   a rank's Python stacks when it received a fatal signal (faulthandler; empty until then)
    exit-rank{r}.txt    how a rank's process ended ("exit 0", "signal 9"), noted by the agent when it reaps it
    rank{r}.pid / rank{r}.returned   a rank started / got to the end of its body
    result.pkl          what the agent got back from elastic_launch (values or failures)
    agent.log           the agent's own output
    logs/.../{rank}/stderr.log, stdout.log   each rank's output (torch elastic's redirects)

Jobs on several nodes (launch/torchrun.py, launch/slurm.py) add, in a folder every node shares:
    nodes.pkl           the NodePlan: node count, ranks per node, rendezvous id and endpoint
    rdzv-endpoint.txt   the endpoint agent 0 offers when the plan has none (SLURM)
    place-rank{r}.pkl   where rank r runs: host, node agent, node rank, pid, log folder
    value-rank{r}.pkl   rank r's return value (torchrun and the script agent hand back no values)
    error-rank{r}.txt   a script job's rank that raised (agents/script.py)
    result-agent{i}.pkl node agent i's AgentResult; agent{i}.log its own output
    logs/agent{i}/<run>/attempt_0/{local rank}/   each rank's output
    dump-stacks.request on a timeout: each node agent has its ranks dump their stacks

Every .pkl file is an authenticated pickle ("distperf-hmac-v1", HMAC-SHA256 over the file's name and the pickle)
with a per-session key that never touches a folder ($DISTPERF_JOB_KEY, inherited by every agent and rank, or on
the stdin of an agent started by a command template). A file whose MAC does not match is refused before it is
unpickled: whoever can write into a shared job folder could otherwise run code in pytest and in every rank.
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import hashlib
import hmac
import json
import os
import pickle
import secrets
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

from pytest_distperf.errors import FileError
from pytest_distperf.fs.jsonio import write_bytes_atomic
from pytest_distperf.spec.job import JobSpec

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
    host: str | None = None  # where it ran (jobs on several nodes)

    def how(self) -> str:
        return f"died of {self.signal}" if self.signal else f"exited with code {self.exitcode}"

    def brief(self) -> str:
        """How it ended, for the line that lists the other ranks."""
        if self.signal:
            return f"stopped by {self.signal}"
        return self.message if self.exitcode == -1 else f"exit {self.exitcode}"  # -1: no exit of its own to report


@dataclass
class AgentResult:
    values: dict[int, Any] | None = None
    failures: list[RankFailure] = field(default_factory=list)
    agent_error: str | None = None  # the agent itself failed (rendezvous, bad config, ...)
    host: str | None = None  # the agent's host (jobs on several nodes)


KEY_ENV = "DISTPERF_JOB_KEY"
_MAGIC = b"distperf-hmac-v1\n"


class JobFileError(FileError):
    """A job file that fails its authentication (or has none): never unpickled."""


def job_key(create: bool = False) -> bytes:
    """The session's key for job files, from $DISTPERF_JOB_KEY; `create` (the pytest process): made when absent."""
    text = os.environ.get(KEY_ENV, "")
    if not text and create:
        text = os.environ[KEY_ENV] = secrets.token_hex(32)  # inherited by agents and ranks started after this
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) < 16:
        raise JobFileError(f"${KEY_ENV} is {'not set' if not text else 'not a hex key'} in this process (pid "
                           f"{os.getpid()}), so it cannot check job files; an agent on another node gets it from "
                           f"the pytest process through its environment (srun --export=ALL, sbatch) or its stdin "
                           f"(a --distperf-agents command template must pass stdin on, as ssh does)")
    return key


def key_from_stdin() -> None:
    """A node agent started by a command template: the key comes as the first line on stdin."""
    if os.environ.get(KEY_ENV):
        return
    try:
        line = sys.stdin.readline(200).strip()
    except (OSError, ValueError, AttributeError):
        return
    if line:
        os.environ[KEY_ENV] = line


def _mac(key: bytes, path: str, payload: bytes) -> bytes:
    return hmac.new(key, os.path.basename(path).encode() + b"\0" + payload, hashlib.sha256).digest()


def _dump(path: str, obj: Any, create_key: bool = False) -> None:
    payload = pickle.dumps(obj)
    write_file(path, _MAGIC + _mac(job_key(create_key), path, payload) + payload)


def write_file(path: str, data: bytes) -> None:
    """A job-folder file, whole or not at all (0600). Not fsynced: it lives as long as its job."""
    write_bytes_atomic(path, data, durable=False)


def _load(path: str, missing_ok: bool = False) -> Any:
    """Unpickle `path` only when its MAC matches this session's key (JobFileError naming the file otherwise)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        if missing_ok:
            return None
        raise
    head = len(_MAGIC) + hashlib.sha256().digest_size
    if not data.startswith(_MAGIC) or len(data) < head:
        raise JobFileError(f"refusing to unpickle {path}: it carries no distperf authentication (not written by "
                           f"this session); something else wrote into the job folder")
    if not hmac.compare_digest(data[len(_MAGIC):head], _mac(job_key(), path, data[head:])):
        raise JobFileError(f"refusing to unpickle {path}: its HMAC does not match this session's key "
                           f"(${KEY_ENV}): the file was written or changed by someone else, or by another session")
    return pickle.loads(data[head:])


def write_job(job_dir: str, job: JobSpec) -> None:
    _dump(os.path.join(job_dir, JOB), job, create_key=True)


def read_job(job_dir: str) -> JobSpec:
    return _load(os.path.join(job_dir, JOB))


def write_result(job_dir: str, result: AgentResult) -> None:
    _dump(os.path.join(job_dir, RESULT), result)


def read_result(job_dir: str) -> AgentResult | None:
    return _load(os.path.join(job_dir, RESULT), missing_ok=True)


def write_outcome(job_dir: str, rank: int, outcome: str, reason: str) -> None:
    path = os.path.join(job_dir, f"outcome-rank{rank}.json")
    write_file(path, json.dumps({"rank": rank, "outcome": outcome, "reason": reason}).encode())


def read_outcomes(job_dir: str) -> list[dict[str, Any]]:
    out = []
    for path in sorted(glob.glob(os.path.join(job_dir, "outcome-rank*.json"))):
        with open(path) as f:
            out.append(json.load(f))
    return out


def write_failure_time(job_dir: str, rank: int) -> None:
    """When this rank's exception happened: torch elastic's whole seconds cannot tell the rank that failed from
    the peers that failed because of it."""
    write_file(os.path.join(job_dir, f"failed-rank{rank}.time"), repr(time.time()).encode())


def read_failure_times(job_dir: str) -> dict[int, float]:
    return {rank: float(_text(path)) for rank, path in rank_files(job_dir, "failed-rank", ".time").items()}


def rank_files(job_dir: str, prefix: str, suffix: str) -> dict[int, str]:
    """{rank: path} of the job folder's files named `<prefix><rank><suffix>`."""
    out = {}
    for path in glob.glob(os.path.join(job_dir, f"{prefix}*{suffix}")):
        rank = os.path.basename(path)[len(prefix):-len(suffix)]
        if rank.isdigit():
            out[int(rank)] = path
    return out


def _text(path: str) -> str:
    with open(path, errors="replace") as f:
        return f.read()


def _line(path: str) -> str | None:
    """A one-line file's text; None where it is missing or empty."""
    try:
        return _text(path).strip() or None
    except FileNotFoundError:
        return None


def start_rank(job_dir: str, rank: int) -> JobSpec:
    """A rank's first steps: read its job, mark it started, put the job's import path first on sys.path."""
    job = read_job(job_dir)
    write_file(os.path.join(job_dir, f"rank{rank}.pid"), str(os.getpid()).encode())
    for p in reversed(job.sys_path):
        if p not in sys.path:
            sys.path.insert(0, p)
    return job


def mark_returned(job_dir: str, rank: int) -> None:
    write_file(os.path.join(job_dir, f"rank{rank}.returned"), b"")


def started_ranks(job_dir: str) -> dict[int, int]:
    """{rank: pid} of the ranks that have started."""
    return {rank: int(_text(path)) for rank, path in rank_files(job_dir, "rank", ".pid").items()}


def has_returned(job_dir: str, rank: int) -> bool:
    return os.path.exists(os.path.join(job_dir, f"rank{rank}.returned"))


class Progress:
    def __init__(self, job_dir: str):
        self.path = os.path.join(job_dir, PROGRESS)

    def update(self, text: str) -> None:
        write_file(self.path, text.encode())


def read_progress(job_dir: str) -> str | None:
    return _line(os.path.join(job_dir, PROGRESS))


def forward_progress(job_dir: str, on_progress: Any, elapsed: float, last: str | None,
                     fallback: str | None = None) -> str | None:
    """Pass rank 0's phase (else `fallback`) to on_progress(text, elapsed) when it changed; the text passed."""
    text = (read_progress(job_dir) or fallback) if on_progress else None
    if not text or text == last:
        return last
    on_progress(text, elapsed)
    return text


def rank_log(job_dir: str, rank: int) -> str | None:
    """A rank's stderr.log (torch elastic's redirects)."""
    hits = glob.glob(os.path.join(job_dir, LOGS, "*", "attempt_*", str(rank), "stderr.log"))
    return hits[0] if hits else None


def tail(path: str | None, lines: int = 20) -> str:
    if not path or not os.path.exists(path):
        return ""
    with open(path, errors="replace") as f:
        return "".join(f.readlines()[-lines:])


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Linux: have the kernel kill this process when its parent dies (no orphaned ranks)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(sig))  # PR_SET_PDEATHSIG


def no_core_dumps() -> None:
    """No core file for this process and its children: a crash is reported only once the kernel has written the
    whole core (seconds per GiB). A limit of 0 stops file dumps only; the kernel skips piped dumps at exactly 1
    (fs/coredump.c). DISTPERF_CORE_DUMPS=1 keeps the limit as it is (to debug a native crash)."""
    if os.environ.get("DISTPERF_CORE_DUMPS") == "1":
        return
    with contextlib.suppress(ImportError, ValueError, OSError):
        import resource

        _, hard = resource.getrlimit(resource.RLIMIT_CORE)
        soft = 1 if hard == resource.RLIM_INFINITY or hard >= 1 else 0  # a soft limit cannot exceed the hard one
        resource.setrlimit(resource.RLIMIT_CORE, (soft, hard))


def write_exit(job_dir: str, rank: int, exited: bool, status: int) -> None:
    """How rank's process ended: "exit <code>" or "signal <number>" (the first record stays)."""
    path = _exit_path(job_dir, rank)
    if not os.path.exists(path):
        write_file(path, f"{'exit' if exited else 'signal'} {status}".encode())


def read_exits(job_dir: str) -> dict[int, tuple[str, int]]:
    """{rank: ("exit", code) or ("signal", number)} of the ranks whose end the agent saw."""
    out = {}
    for rank, path in rank_files(job_dir, "exit-rank", ".txt").items():
        how, _, status = _text(path).partition(" ")
        out[rank] = (how, int(status))
    return out


def exit_time(job_dir: str, rank: int) -> float:
    """When the agent saw rank's process end (see write_exit)."""
    return os.path.getmtime(_exit_path(job_dir, rank))


def _exit_path(job_dir: str, rank: int) -> str:
    return os.path.join(job_dir, f"exit-rank{rank}.txt")


def signal_name(number: int) -> str:
    """SIGKILL for 9; the number itself for one Python does not name."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


def read_rank_error(job_dir: str, rank: int) -> str | None:
    """The traceback torch elastic's error file holds for a rank that raised."""
    hits = glob.glob(os.path.join(job_dir, LOGS, "*", "attempt_*", str(rank), "error.json"))
    try:
        with open(hits[0]) as f:
            message = json.load(f).get("message")
    except (IndexError, OSError, ValueError, AttributeError):
        return None
    return error_text(message) if isinstance(message, dict) or message else None


def error_text(message: object) -> str:
    """A rank's error as torch elastic gives it: its error file's dict (the traceback), or a plain string."""
    if isinstance(message, dict):
        extra = message.get("extraInfo") or {}
        return str(extra.get("py_callstack") or message.get("message") or message)
    return str(message)


def fatal_report_file(job_dir: str, rank: int) -> Any:
    """Where this rank's faulthandler writes its stacks on a fatal signal, open for it."""
    return open(os.path.join(job_dir, f"fatal-rank{rank}.log"), "w")


def read_fatal_reports(job_dir: str) -> dict[int, str]:
    """{rank: faulthandler's report} of the ranks that received a fatal signal."""
    out = {}
    for rank, path in rank_files(job_dir, "fatal-rank", ".log").items():
        try:
            text = _text(path)
        except OSError:
            continue
        if text.strip():
            out[rank] = text
    return out


# faulthandler's first line names the signal ("Fatal Python error: Aborted")
_FATAL_SIGNALS = {"Segmentation fault": "SIGSEGV", "Aborted": "SIGABRT", "Bus error": "SIGBUS",
                  "Illegal instruction": "SIGILL", "Floating-point exception": "SIGFPE",
                  "Floating point exception": "SIGFPE"}


def fatal_signal(report: str) -> str:
    """The signal a faulthandler report names, e.g. "SIGABRT"; "a fatal signal" when it names none known."""
    first = report.strip().splitlines()[0] if report.strip() else ""
    return next((sig for text, sig in _FATAL_SIGNALS.items() if text in first), "a fatal signal")


def fatal_failure(rank: int, report: str, timestamp: int) -> RankFailure:
    """The failure of a rank that died of a fatal signal, from its faulthandler report (the stacks are its message)."""
    sig = fatal_signal(report)
    return RankFailure(rank=rank, exitcode=-int(getattr(signal, sig, 0) or 0), signal=sig, message=report,
                       timestamp=timestamp)


# -- jobs on several nodes (launch/torchrun.py, launch/slurm.py): every node writes into the same folder -----------
NODE_PLAN = "nodes.pkl"
RDZV_ENDPOINT = "rdzv-endpoint.txt"
STACKS_REQUEST = "dump-stacks.request"  # on a timeout: each node agent signals its ranks (SIGUSR1)


@dataclass
class NodePlan:
    """How the node agents of one job meet: torchrun's c10d rendezvous (written by the launcher)."""

    nodes: int  # node agents, one torchrun each
    nproc_per_node: int
    rdzv_id: str
    rdzv_endpoint: str | None  # host:port; None: agent 0 picks its own host and a free port (SLURM)
    local_addr: str | None = None  # e.g. 127.0.0.1: every agent on this host, all traffic on loopback
    join_timeout: int = 120  # seconds the agents wait for each other at the rendezvous


@dataclass
class RankPlace:
    """Where a rank runs, written by the rank itself (rank/entry.py)."""

    rank: int
    host: str
    agent: int  # index of the node agent that started it
    node_rank: int  # torchrun's GROUP_RANK
    local_rank: int
    pid: int
    log_dir: str | None  # the folder of its stdout.log / stderr.log / error.json


def new_node_job_dir(job: JobSpec, plan: NodePlan, base_dir: str, shared_dir: str | None) -> str:
    """A multi-node job's folder with its spec and node plan, in `shared_dir` (checked) or `base_dir`."""
    from pytest_distperf.fs.safefs import check_shared_folder

    if shared_dir:
        os.makedirs(shared_dir, exist_ok=True)
        check_shared_folder(shared_dir)  # job folders in it are 0700 (mkdtemp), and must stay ours
    job_dir = tempfile.mkdtemp(prefix="job-", dir=shared_dir or base_dir)
    write_job(job_dir, job)
    _dump(os.path.join(job_dir, NODE_PLAN), plan, create_key=True)
    return job_dir


def read_node_plan(job_dir: str) -> NodePlan:
    return _load(os.path.join(job_dir, NODE_PLAN))


def write_rdzv_endpoint(job_dir: str, endpoint: str) -> None:
    write_file(os.path.join(job_dir, RDZV_ENDPOINT), endpoint.encode())


def read_rdzv_endpoint(job_dir: str) -> str | None:
    return _line(os.path.join(job_dir, RDZV_ENDPOINT))


def write_rank_place(job_dir: str, place: RankPlace) -> None:
    _dump(os.path.join(job_dir, f"place-rank{place.rank}.pkl"), place)


def read_rank_places(job_dir: str) -> dict[int, RankPlace]:
    return {p.rank: p for p in map(_load, rank_files(job_dir, "place-rank", ".pkl").values())}


def write_rank_value(job_dir: str, rank: int, value: Any) -> None:
    _dump(os.path.join(job_dir, f"value-rank{rank}.pkl"), value)


def write_rank_error(job_dir: str, rank: int, text: str) -> None:
    write_file(os.path.join(job_dir, f"error-rank{rank}.txt"), text.encode())


def rank_error_files(job_dir: str) -> dict[int, str]:
    return rank_files(job_dir, "error-rank", ".txt")


def read_rank_values(job_dir: str, ranks: list[int] | None = None) -> dict[int, Any]:
    return {rank: _load(path) for rank, path in rank_files(job_dir, "value-rank", ".pkl").items()
            if ranks is None or rank in ranks}


def agent_log(job_dir: str, agent: int) -> str:
    return os.path.join(job_dir, f"agent{agent}.log")


def agent_log_dir(job_dir: str, agent: int) -> str:
    """torchrun's --log-dir of one node agent (rank logs under <run>/attempt_0/<local rank>/)."""
    return os.path.join(job_dir, LOGS, f"agent{agent}")


def write_agent_result(job_dir: str, agent: int, result: AgentResult) -> None:
    _dump(os.path.join(job_dir, f"result-agent{agent}.pkl"), result)


def read_agent_result(job_dir: str, agent: int) -> AgentResult | None:
    return _load(os.path.join(job_dir, f"result-agent{agent}.pkl"), missing_ok=True)


def request_stacks(job_dir: str) -> None:
    write_file(os.path.join(job_dir, STACKS_REQUEST), repr(time.time()).encode())


def stacks_requested(job_dir: str) -> bool:
    return os.path.exists(os.path.join(job_dir, STACKS_REQUEST))


@contextlib.contextmanager
def dropped_on_success(job_dir: str, keep: bool) -> Iterator[None]:
    """The job folder is removed when the block ends without an error, unless `keep`."""
    yield
    if not keep:
        shutil.rmtree(job_dir, ignore_errors=True)


def drop_scratch(values: dict[int, Any]) -> None:
    """A probe job's folder is kept for its Chrome traces, not for the NVMe-offload swap files in its scratch."""
    for v in values.values():
        trace = getattr(getattr(v, "probes", None), "trace_path", None)
        if trace:
            shutil.rmtree(os.path.join(os.path.dirname(trace), "scratch"), ignore_errors=True)
