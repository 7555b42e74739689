"""Jobs own their devices, also across pytest-xdist workers: a file-lock allocator.

GPU jobs: one lock file per GPU; a job takes `world_size` free GPUs (all or none, so two
jobs never deadlock on half an allocation), runs with CUDA_VISIBLE_DEVICES set to them,
and waits while too few are free. A job that needs more GPUs than the machine has is
skipped at collection, so nobody waits for ever.
CPU measurement jobs: one at a time per machine (one lock), each rank given
cores // world_size threads by the launcher, so concurrent jobs never share cores and
skew each other's step times. CPU jobs that measure nothing (`run_function`) don't lock.
Every grant is appended to `allocations.log` in the lock folder.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from typing import Callable, Iterator

from filelock import FileLock, Timeout

POLL_SECONDS = 0.2


def lock_dir() -> str:
    path = os.environ.get("DISTPERF_LOCK_DIR") or os.path.join(tempfile.gettempdir(), f"pytest-distperf-locks-{os.getuid()}")
    os.makedirs(path, exist_ok=True)
    return path


def _log(folder: str, text: str) -> None:
    with open(os.path.join(folder, "allocations.log"), "a") as f:
        f.write(f"{time.strftime('%H:%M:%S')} pid={os.getpid()} {text}\n")


@contextlib.contextmanager
def gpus(world_size: int, gpu_ids: list[str], owner: str, on_wait: Callable[[str], None] | None = None,
         folder: str | None = None) -> Iterator[dict[str, str]]:
    """Hold `world_size` GPUs for the block; yields the environment overrides for the job."""
    if world_size > len(gpu_ids):
        raise RuntimeError(f"{owner} needs {world_size} GPUs; only {len(gpu_ids)} are visible")
    folder = folder or lock_dir()
    locks = {g: FileLock(os.path.join(folder, f"gpu{g}.lock")) for g in gpu_ids}
    waited_since = None
    while True:
        held = []
        for g, lock in locks.items():
            try:
                lock.acquire(timeout=0)
                held.append(g)
            except Timeout:
                continue
            if len(held) == world_size:
                break
        if len(held) == world_size:
            break
        for g in held:
            locks[g].release()
        if waited_since is None:
            waited_since = time.monotonic()
            if on_wait:
                on_wait(f"{owner}: waiting for {world_size} free GPU(s) of {len(gpu_ids)}")
        time.sleep(POLL_SECONDS)
    waited = time.monotonic() - waited_since if waited_since else 0.0
    _log(folder, f"granted GPUs {','.join(held)} to {owner} after {waited:.1f} s")
    try:
        yield {"CUDA_VISIBLE_DEVICES": ",".join(held)}
    finally:
        for g in held:
            locks[g].release()
        _log(folder, f"released GPUs {','.join(held)} from {owner}")


@contextlib.contextmanager
def cpu(owner: str, on_wait: Callable[[str], None] | None = None, folder: str | None = None) -> Iterator[dict[str, str]]:
    """Hold the machine's CPU measurement slot for the block."""
    folder = folder or lock_dir()
    lock = FileLock(os.path.join(folder, "cpu.lock"))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        if on_wait:
            on_wait(f"{owner}: waiting for the CPU measurement slot (another job is measuring)")
        lock.acquire()
    _log(folder, f"granted the CPU slot to {owner}")
    try:
        yield {}
    finally:
        lock.release()
