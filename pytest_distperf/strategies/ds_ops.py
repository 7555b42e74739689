"""DeepSpeed's JIT-built ops, built (or found in torch's extension cache) before the first timed job, never inside
one: each takes a minute or more. The pytest process checks the cache without importing DeepSpeed and builds what
is missing in a child process (`python -m pytest_distperf build-ops`) while it holds the CPU measurement slot; an
op DeepSpeed says cannot build skips its jobs with the reason.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from typing import Any, Callable, Iterable

from pytest_distperf.spec.job import runs_deepspeed

# builder class -> the op's name (its folder and .so in the extension cache)
OPS = {"ShareMemCommBuilder": "deepspeed_shm_comm", "CPUAdamBuilder": "cpu_adam", "AsyncIOBuilder": "async_io"}
INCOMPATIBLE = 3  # build-ops' exit status when DeepSpeed says an op cannot build on this machine
_incompatible: dict[str, str] = {}  # op builder -> DeepSpeed's reason, found by this process's build child
_checked: set[tuple[str, ...]] = set()  # op sets this process found built (or built): not checked again


def cache_dir() -> str:
    """The folder torch builds this interpreter's extensions in (torch.utils.cpp_extension._get_build_directory)."""
    if os.environ.get("TORCH_EXTENSIONS_DIR"):
        return os.environ["TORCH_EXTENSIONS_DIR"]
    try:
        import torch

        cuda_version = torch.version.cuda
    except ImportError:
        cuda_version = None
    py = f"py{sys.version_info.major}{sys.version_info.minor}{getattr(sys, 'abiflags', '')}"
    cu = "cpu" if not cuda_version else f"cu{str(cuda_version).replace('.', '')}"
    return os.path.join(os.path.expanduser("~"), ".cache", "torch_extensions", f"{py}_{cu}")


def is_built(builder: str, folder: str | None = None) -> bool:
    """The op is in the cache, built from this environment's DeepSpeed: torch's JIT load rebuilds an op whose
    build.ninja names another DeepSpeed's sources (another virtualenv's), and would do so inside a job's build."""
    name = OPS[builder]
    op = os.path.join(folder or cache_dir(), name)
    return os.path.exists(os.path.join(op, f"{name}.so")) and _built_from_this_deepspeed(op)


def _built_from_this_deepspeed(op: str) -> bool:
    import importlib.util

    spec = importlib.util.find_spec("deepspeed")  # a top-level package: found, not imported
    ninja = os.path.join(op, "build.ninja")
    if spec is None or not spec.origin or not os.path.exists(ninja):
        return True  # nothing to tell by
    here = os.path.dirname(spec.origin)
    with open(ninja, encoding="utf-8", errors="replace") as f:
        text = f.read()
    return here in text or os.path.realpath(here) in text


def needed(strategy: str | None, options: dict[str, Any], device: str) -> list[str]:
    """The op builders a job of this strategy (or a front-end on the DeepSpeed engine) will JIT-load."""
    if not runs_deepspeed(strategy, options):
        return []
    ops = ["ShareMemCommBuilder"] if device == "cpu" else []
    if options.get("offload_optimizer"):
        ops.append("CPUAdamBuilder")
    if "nvme" in (options.get("offload_optimizer"), options.get("offload_param")):
        ops.append("AsyncIOBuilder")
    return ops


def deepspeed_arch_list(value: str) -> str:
    """TORCH_CUDA_ARCH_LIST as DeepSpeed 0.19.8 can read it: "9.0a" loses its letter suffix, which DeepSpeed's
    parser refuses (deepspeedai/DeepSpeed#7589); its ops use no arch-specific instruction."""
    import re

    return re.sub(r"(\d+\.\d+)[a-z]+", r"\1", value)


def deepspeed_environment(env: dict[str, str]) -> dict[str, str]:
    """What DeepSpeed's op builds (here and in a DeepSpeed job's ranks) need changed in `env`: {} or the arch list."""
    value = env.get("TORCH_CUDA_ARCH_LIST", "")
    fixed = deepspeed_arch_list(value)
    return {"TORCH_CUDA_ARCH_LIST": fixed} if fixed != value else {}


def direct_io_problem(folder: str) -> str | None:
    """None where `folder` takes an O_DIRECT write (DeepSpeed's NVMe swap files), else why not (e.g. tmpfs)."""
    import mmap

    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f".distperf-odirect-{os.getpid()}")
    block = mmap.mmap(-1, 4096)  # page-aligned, as O_DIRECT wants
    try:
        fd = os.open(path, os.O_CREAT | os.O_WRONLY | getattr(os, "O_DIRECT", 0), 0o600)
        try:
            os.write(fd, block)
        finally:
            os.close(fd)
    except OSError as e:
        return f"{folder} does not take O_DIRECT writes ({e.strerror})"
    finally:
        block.close()
        if os.path.exists(path):
            os.remove(path)
    return None


def ensure(builders: Iterable[str], device: str, progress: Callable[[str], None] | None = None,
           run: Callable[..., Any] = subprocess.run, slot: Any = None,
           may_start: Callable[[str], None] | None = None) -> list[str]:
    """Build the ops not in the cache yet in a child process; returns the ops built. `slot`: held while building.
    `may_start(what)`: raises to refuse a build (the session budget)."""
    import contextlib

    builders = tuple(sorted(set(builders)))
    _skip_incompatible(builders)
    if not builders or builders in _checked:
        return []
    folder = cache_dir()
    missing = [b for b in builders if not is_built(b, folder)]
    if not missing:
        _checked.add(builders)
        return []
    say = progress or (lambda text: None)
    names = ", ".join(OPS[b] for b in missing)
    if may_start is not None:
        may_start(f"the build of DeepSpeed's op(s) {names}")
    say(f"building DeepSpeed's JIT op(s) {names} before the first timed job (once; cached in {folder}; "
        f"`python -m pytest_distperf build-ops` pre-builds them)")
    env = dict(os.environ)
    env.update(deepspeed_environment(env))
    if device == "cpu":  # the ranks' view: DeepSpeed's CPU accelerator, no GPU
        env.update(DS_ACCELERATOR="cpu", CUDA_VISIBLE_DEVICES="")
    started = time.monotonic()
    with slot if slot is not None else contextlib.nullcontext():
        done = run([sys.executable, "-m", "pytest_distperf", "build-ops", *missing], env=env, capture_output=True,
                   text=True)
    code, out = getattr(done, "returncode", 0), getattr(done, "stdout", "") or ""
    if code == INCOMPATIBLE:
        for line in out.splitlines():
            if line.startswith("incompatible "):
                builder, _, why = line[len("incompatible "):].partition(": ")
                _incompatible[builder] = why
        _skip_incompatible(builders)
    if code != 0:
        tail = "\n".join((out + (getattr(done, "stderr", "") or "")).splitlines()[-30:])
        from pytest_distperf.errors import StrategyError

        raise StrategyError(f"building DeepSpeed's op(s) {names} failed (cache {folder}); the build's last "
                            f"lines:\n{tail}\n(run `python -m pytest_distperf build-ops` to see it all)")
    say(f"built DeepSpeed's op(s) {names} in {time.monotonic() - started:.0f} s (cached in {folder})")
    _checked.add(builders)
    return missing


def _skip_incompatible(builders: Iterable[str]) -> None:
    for b in builders:
        if b in _incompatible:
            import pytest

            pytest.skip(f"DeepSpeed's {OPS[b]} op cannot build on this machine ({b}().is_compatible() is False: "
                        f"{_incompatible[b]})")


# -- `python -m pytest_distperf build-ops` -------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("builders", nargs="*", metavar="BUILDER",
                        help=f"op builders to build (default: all of {', '.join(OPS)})")
    parser.add_argument("--list", action="store_true", help="say which ops are built, build nothing")


def run(args: argparse.Namespace) -> int:
    builders = list(args.builders or OPS)
    unknown = [b for b in builders if b not in OPS]
    if unknown:
        print(f"unknown op builder(s) {', '.join(unknown)}; choose from {', '.join(OPS)}", file=sys.stderr)
        return 2
    folder = cache_dir()
    if args.list:
        for b in builders:
            print(f"{OPS[b]} ({b}): {'built' if is_built(b, folder) else 'not built'} in {folder}")
        return 0
    if len(builders) > 1:
        return _build_each_in_a_child(builders, asked=bool(args.builders))
    os.environ.update(deepspeed_environment(dict(os.environ)))
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator()
    incompatible = []
    for b in builders:
        started = time.monotonic()
        builder = accelerator.create_op_builder(b)
        if builder is None:
            print(f"{OPS[b]} ({b}): not used by DeepSpeed's {type(accelerator).__name__}; skipped")
            continue
        if not builder.is_compatible(verbose=False):
            why = ("libaio's library and headers not found, e.g. apt install libaio-dev" if b == "AsyncIOBuilder"
                   else "see DeepSpeed's ds_report")
            print(f"incompatible {b}: {why}", flush=True)
            incompatible.append(b)
            continue
        print(f"{OPS[b]} ({b}): building or loading, cache {folder} ...", flush=True)
        builder.load()
        print(f"{OPS[b]} ({b}): ready in {time.monotonic() - started:.1f} s", flush=True)
    # Asked for by name (a job needs it): say it cannot build; `build-ops` of every op builds what can.
    return INCOMPATIBLE if incompatible and args.builders else 0


def _build_each_in_a_child(builders: list[str], asked: bool) -> int:
    """One child process per op: an op's build is mostly one long compiler run, so they overlap."""
    children = [subprocess.Popen([sys.executable, "-m", "pytest_distperf", "build-ops", b], stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True) for b in builders]
    codes = []
    for child in children:
        out, _ = child.communicate()
        print(out, end="", flush=True)
        codes.append(child.returncode)
    failed = [c for c in codes if c not in (0, INCOMPATIBLE)]
    if failed:
        return failed[0]
    return INCOMPATIBLE if INCOMPATIBLE in codes and asked else 0
