"""Rank entry point. The only code that imports the heavy libraries.

Started by torch's elastic agent (agents/elastic.py): forked for a CPU job, spawned for CUDA (forked for both
under the warm agent, agents/warm.py). It joins the process group, then either measures a job -- a strategy on
a workload, or the user's own step (rank/prepare.py): warm-up, a timing phase with nothing else attached, then
probes and the step breakdown -- or calls the user's function.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import time
from typing import Any

from torch.distributed.elastic.multiprocessing.errors import record

from pytest_distperf.launch import jobfiles
from pytest_distperf.spec.profiles import PROFILES
from pytest_distperf.spec.job import JobSpec
from pytest_distperf.rank.prepare import resolve_function
from pytest_distperf.rank.results import RankResult

# torch's error for CUDA in a process forked after its parent asked torch about CUDA (torch elastic's LaunchConfig
# calls torch.cuda.is_available() in the agent).
FORKED_CUDA_REFUSAL = "Cannot re-initialize CUDA in forked subprocess"
EXIT_OUTCOME = 75  # the rank stopped on pytest.skip/xfail; its outcome file says which


@record
def rank_main(job_dir: str) -> Any:
    import torch
    import torch.distributed as dist

    jobfiles.die_with_parent()
    jobfiles.no_core_dumps()  # a crash is reported only once its core is written: none is
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    # On timeout the launcher sends SIGUSR1 to every rank: each dumps its Python stacks to its stderr log.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    # On a fatal signal (SIGSEGV, SIGABRT, ...) the stacks go to a file the launcher watches: the failure shows
    # them, and a death the agent is slow to report (the kernel still busy with the process) fails the job anyway.
    faulthandler.enable(jobfiles.fatal_report_file(job_dir, rank), all_threads=True)
    job = jobfiles.start_rank(job_dir, rank)

    if job.device == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        if PROFILES[job.launch_profile].pin_cpu:  # launched as the user launches: no pinning (spec/profiles.py)
            _pin_to_own_cores(local_rank, int(os.environ["LOCAL_WORLD_SIZE"]))
        dist.init_process_group("gloo")
    progress = jobfiles.Progress(job_dir) if rank == 0 else None  # read by -v and by a timeout's message
    try:
        if job.function is not None:
            if progress:
                progress.update(f"running {job.function.qualname}")
            value = resolve_function(job.function)(*job.args, **job.kwargs)
        else:
            value = run_strategy(job, rank, local_rank, device, job_dir, progress)
        if device.type == "cpu" and torch.cuda.is_initialized():
            raise RuntimeError(f"rank {rank}: this CPU job initialised CUDA (something in the rank made a GPU visible "
                               f"again and used it); a CPU job must not touch a GPU -- its numbers would mix devices")
    except BaseException as e:
        jobfiles.write_failure_time(job_dir, rank)
        if isinstance(e, torch.OutOfMemoryError) and device.type == "cuda":
            raise RuntimeError(_oom_message(rank, device)) from e
        if device.type == "cpu" and FORKED_CUDA_REFUSAL in str(e):
            raise RuntimeError(f"rank {rank}: this CPU job used CUDA (torch refuses CUDA in a CPU rank, which is "
                               "forked from the launch agent); a CPU job must not touch a GPU -- its numbers would "
                               "mix devices") from e
        outcome = _pytest_outcome(e)
        if outcome is None:
            raise  # @record writes the traceback for the launcher; the agent stops the other ranks
        jobfiles.write_outcome(job_dir, rank, outcome, str(getattr(e, "msg", e)))
        raise SystemExit(EXIT_OUTCOME) from None
    # Only on success: after a failure a peer may be gone and the teardown could block.
    dist.destroy_process_group()
    jobfiles.mark_returned(job_dir, rank)
    return value


def _pin_to_own_cores(local_rank: int, local_world_size: int) -> None:
    """CPU jobs: each rank on its own slice of the allowed cores (the launcher gives it as many threads),
    so ranks do not migrate across each other's cores between steps, a source of run-to-run variation."""
    if not hasattr(os, "sched_setaffinity") or os.environ.get("DISTPERF_NO_PIN"):
        return
    cores = sorted(os.sched_getaffinity(0))
    per_rank = len(cores) // local_world_size
    if per_rank >= 1:
        os.sched_setaffinity(0, cores[local_rank * per_rank:(local_rank + 1) * per_rank])


def _oom_message(rank: int, device: Any) -> str:
    """The rank's memory at an OOM, for the error's text: in MiB, as nvidia-smi shows it."""
    import torch

    def mib(n: int) -> str:
        return f"{n / 2**20:,.0f} MiB"

    total = torch.cuda.get_device_properties(device).total_memory
    return (f"CUDA out of memory on rank {rank} ({device}, {torch.cuda.get_device_name(device)}): "
            f"allocated {mib(torch.cuda.memory_allocated(device))}, "
            f"reserved {mib(torch.cuda.memory_reserved(device))}, "
            f"peak allocated {mib(torch.cuda.max_memory_allocated(device))}, total {mib(total)}")


def _pytest_outcome(e: BaseException) -> str | None:
    """'skipped' or 'xfailed' for pytest's outcome exceptions (only if the rank imported pytest)."""
    outcomes = sys.modules.get("_pytest.outcomes")
    if outcomes is None:
        return None
    if isinstance(e, outcomes.XFailed):
        return "xfailed"
    if isinstance(e, outcomes.Skipped):
        return "skipped"
    return None


def run_strategy(job: JobSpec, rank: int, local_rank: int, device: Any, job_dir: str,
                 progress: "jobfiles.Progress | None") -> RankResult:
    from pytest_distperf.rank import prepare
    from pytest_distperf.rank.timing import StepTimer, host_rss

    # A strategy on a workload, or the user's own step (rank/prepare.py); library and user-module
    # imports happen in load(), before the memory baseline.
    scratch_dir = os.path.join(job_dir, "scratch")
    os.makedirs(scratch_dir, exist_ok=True)
    loaded = prepare.load(job, rank, local_rank, device, scratch_dir)
    timer = StepTimer(device)

    rss_before = host_rss()
    build_started_at = time.time()  # the start-up's end, against the launcher's wall clock (RunResult.launched_at)
    t0 = time.perf_counter()
    if progress:
        progress.update("building model and strategy")
    prepared = prepare.build(loaded)

    def measure() -> RankResult:
        return _measure(job, prepared, loaded.ctx, timer, t0, build_started_at, rss_before, rank, device, job_dir,
                        progress)

    # An adapter that owns the training loop (Lightning's Trainer.fit) runs it on this, the main, thread, as its
    # users do (a loop on a second thread is not theirs), and the measurement on a second thread.
    run_loop = getattr(prepared.adapter, "run_loop", None)
    return run_loop(measure) if run_loop else measure()


def _measure(job: JobSpec, prepared: Any, ctx: Any, timer: Any, t0: float, build_started_at: float, rss_before: int,
             rank: int, device: Any, job_dir: str, progress: "jobfiles.Progress | None") -> RankResult:
    """Warm-up, timing, probes and breakdown of a built adapter; ends with the adapter's close()."""
    from pytest_distperf import strategies
    from pytest_distperf.rank import breakdown, prepare
    from pytest_distperf.rank.timing import MeteredWindow

    say = progress.update if progress else (lambda text: None)
    trainer, batches = prepared.adapter, prepared.batches
    timed = batches[job.warmup_steps:]

    def extra_step(i: int) -> Any:  # the work, probe and breakdown phases' steps, on the timed steps' batches
        return trainer.step(*timed[i % len(timed)])

    timer.sync()
    build_seconds = time.perf_counter() - t0  # an adapter's run_loop calls measure once its setup is done

    t0 = time.perf_counter()
    for i in range(job.warmup_steps):
        say(f"warm-up step {i + 1}/{job.warmup_steps}")
        trainer.step(*batches[i])
    timer.sync()
    warmup_seconds = time.perf_counter() - t0

    losses: list[Any] = []  # what step() returned: the loss tensor (or None from a user's step)
    say(f"{job.steps} timed steps")  # once: a progress file written between steps is host work inside the loop
    window = MeteredWindow(device, job.steps)
    for i in range(job.steps):
        losses.append(window.time(lambda b=timed[i]: trainer.step(*b)))
    readings = window.finish()
    after_started = time.perf_counter()

    # After timing and the memory reads, so that what follows never changes what they report.
    optimizer = getattr(trainer, "torch_optimizer", lambda: None)()  # optional in the adapter protocol
    work = None
    if job.work_steps:  # what the step asks of the machine
        from pytest_distperf.rank import work as work_phase

        say("work figures")
        work = work_phase.measure(extra_step, job.work_steps, timer.sync, device, model=prepared.model,
                                  optimizer=optimizer, counts=job.measure_once)
    probe_result = None
    if job.probes:
        from pytest_distperf.rank.probes.runner import run_probe_phase

        probe_result = run_probe_phase(probes=job.probes, steps=job.probe_steps, step=extra_step, sync=timer.sync,
                                       device=device, optimizer=optimizer, group_size=job.world_size, rank=rank,
                                       job_dir=job_dir, progress=say)
    # Where the time goes: a few extra device-synchronised steps, in the first run of each test's runs of a job
    # only (reports and checks read one run's breakdown).
    step_breakdown: dict[str, float] = {}
    if job.measure_once:
        say("step breakdown")
        step_breakdown = breakdown.collect(trainer, timed)
    after_seconds = time.perf_counter() - after_started  # each phase ends device-synchronised

    result = RankResult(
        rank=rank, **readings.result_fields(),
        losses=[float(x) for x in losses] if all(x is not None for x in losses) else [],
        host_rss_before_build=rss_before,
        optimizer_state_bytes=strategies.optimizer_state_bytes(optimizer) if optimizer is not None else 0,
        num_params=prepared.num_params, tokens_per_step=prepared.tokens_per_step, build_seconds=build_seconds,
        build_started_at=build_started_at, warmup_seconds=warmup_seconds, probes=probe_result,
        step_breakdown=step_breakdown, work=work, after_seconds=after_seconds,
        extra={"launch": prepare.launch_facts(job, ctx, trainer)})
    close = getattr(trainer, "close", None)
    if close:  # a front-end running its own loop (Lightning Trainer) ends it while the process group is up
        close()
    return result
