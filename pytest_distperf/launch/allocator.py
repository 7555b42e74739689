"""Jobs own their devices, also across pytest-xdist workers: a file-lock allocator.

A GPU job takes `world_size` free GPUs (a lock file each, all or none) as its CUDA_VISIBLE_DEVICES; CPU measurement
jobs run one at a time per machine, so concurrent jobs never skew each other's step times. Every grant goes to
`allocations.log`; the lock folder is 0700 and checked on every use. A wait gives up after LOCK_WAIT_SECONDS
($DISTPERF_LOCK_TIMEOUT) naming the holder, which each holder writes to `<lock>.holder`.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
import tempfile
import time
from typing import Callable, Iterator

from pytest_distperf.errors import LockWaitTimeout
from pytest_distperf.fs.safefs import check_private_folder, make_private_folder, open_nofollow

POLL_SECONDS = 0.2
LOCK_WAIT_SECONDS = 3 * 3600.0  # above any sane queue of jobs; a holder stuck longer is named in the error
LOCK_TIMEOUT_ENV = "DISTPERF_LOCK_TIMEOUT"


def lock_dir() -> str:
    """The lock and state folder, created 0700 and checked (ours, no group/other write, not a symlink)."""
    default = os.path.join(tempfile.gettempdir(), f"pytest-distperf-locks-{os.getuid()}")
    return make_private_folder(os.environ.get("DISTPERF_LOCK_DIR") or default)


def wait_limit() -> float:
    text = os.environ.get(LOCK_TIMEOUT_ENV)
    try:
        return float(text) if text else LOCK_WAIT_SECONDS
    except ValueError:
        return LOCK_WAIT_SECONDS


class FolderLock:
    """An exclusive flock on a file of the checked lock folder, opened with O_NOFOLLOW."""

    def __init__(self, path: str):
        self.path = path
        self.fd: int | None = None

    def try_acquire(self) -> bool:
        fd = open_nofollow(self.path, os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self.fd = fd
        _write_holder(self.path)
        return True

    def release(self) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.path + ".holder")
            os.close(self.fd)  # closing drops the flock
            self.fd = None


def _write_holder(lock_path: str) -> None:
    command = " ".join(sys.argv)[:300]
    fd = open_nofollow(lock_path + ".holder", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    with os.fdopen(fd, "w") as f:
        f.write(f"pid={os.getpid()} since={time.strftime('%Y-%m-%dT%H:%M:%S')} command={command}\n")


def holder(lock_path: str) -> str:
    """Who holds a lock, as its holder wrote it: "pid=... since=... command=..."."""
    try:
        fd = open_nofollow(lock_path + ".holder", os.O_RDONLY)
        with os.fdopen(fd) as f:
            return f.read(1000).strip() or "unknown (empty holder file)"
    except OSError:
        return "unknown (no holder file)"


def _log(folder: str, text: str) -> None:
    fd = open_nofollow(os.path.join(folder, "allocations.log"), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    with os.fdopen(fd, "a") as f:
        f.write(f"{time.strftime('%H:%M:%S')} pid={os.getpid()} {text}\n")


def _timed_out(what: str, waited: float, locks: list[FolderLock]) -> LockWaitTimeout:
    held_by = "; ".join(f"{os.path.basename(lk.path)} held by {holder(lk.path)}" for lk in locks)
    return LockWaitTimeout(f"gave up after {waited:.0f} s waiting for {what} ({held_by}); end that process if "
                           f"it is stuck, or raise ${LOCK_TIMEOUT_ENV}")


def _acquire(locks: dict[str, FolderLock], count: int, waiting: str, what: str,
             on_wait: Callable[[str], None] | None, timeout: float | None) -> tuple[list[str], float]:
    """`count` of `locks`, all or none (two jobs never deadlock on half an allocation), waiting while too few
    are free: (the keys held, seconds waited)."""
    limit = wait_limit() if timeout is None else timeout
    since = None
    while True:
        held = []
        for key, lock in locks.items():
            if len(held) < count and lock.try_acquire():
                held.append(key)
        if len(held) == count:
            return held, time.monotonic() - since if since else 0.0
        for key in held:
            locks[key].release()
        if since is None:
            since = time.monotonic()
            if on_wait:
                on_wait(waiting)
        elif time.monotonic() - since > limit:
            raise _timed_out(what, time.monotonic() - since, [lk for k, lk in locks.items() if k not in held])
        time.sleep(POLL_SECONDS)


@contextlib.contextmanager
def gpus(world_size: int, gpu_ids: list[str], owner: str, on_wait: Callable[[str], None] | None = None,
         folder: str | None = None, timeout: float | None = None) -> Iterator[dict[str, str]]:
    """Hold `world_size` GPUs for the block; yields the environment overrides for the job."""
    if world_size > len(gpu_ids):
        raise RuntimeError(f"{owner} needs {world_size} GPUs; only {len(gpu_ids)} are visible")
    folder = folder or lock_dir()
    check_private_folder(folder)
    locks = {g: FolderLock(os.path.join(folder, f"gpu{g}.lock")) for g in gpu_ids}
    held, waited = _acquire(locks, world_size, f"{owner}: waiting for {world_size} free GPU(s) of {len(gpu_ids)}",
                            f"{world_size} free GPU(s) of {len(gpu_ids)} in {folder}", on_wait, timeout)
    _log(folder, f"granted GPUs {','.join(held)} to {owner} after {waited:.1f} s")
    try:
        yield {"CUDA_VISIBLE_DEVICES": ",".join(held)}
    finally:
        for g in held:
            locks[g].release()
        _log(folder, f"released GPUs {','.join(held)} from {owner}")


@contextlib.contextmanager
def cpu(owner: str, on_wait: Callable[[str], None] | None = None, folder: str | None = None,
        timeout: float | None = None) -> Iterator[dict[str, str]]:
    """Hold the machine's CPU measurement slot for the block."""
    folder = folder or lock_dir()
    check_private_folder(folder)
    lock = FolderLock(os.path.join(folder, "cpu.lock"))
    _acquire({"cpu": lock}, 1, f"{owner}: waiting for the CPU measurement slot (another job is measuring)",
             f"the CPU measurement slot {lock.path}", on_wait, timeout)
    try:
        _log(folder, f"granted the CPU slot to {owner}")
        yield {}
    finally:
        lock.release()
