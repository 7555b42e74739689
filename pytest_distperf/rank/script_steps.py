"""A rank of a user's training script, run unchanged by its own launcher (distperf.script_job).

The script's launcher (torchrun, `python` for Lightning's own, deepspeed, accelerate launch) starts its ranks as it
always does; each rank's interpreter loads distperf's sitecustomize (rank/script_site), which installs a StepWatch
in the process that runs the job's script, before the script's first line.

Steps are the optimizer steps torch's global hook reports (`torch.optim.optimizer.register_optimizer_step_post_hook`
fires for every `torch.optim.Optimizer` subclass, as Kineto's on-demand tracing counts a script's steps). With
gradient accumulation one step is one optimizer step; with several optimizers (a GAN's generator and
discriminator), the steps of the first one that steps, while the size and memory figures (parameters, optimizer
state, training state) cover every optimizer that stepped, a tensor that two of them update counted once. A script
whose update the hook cannot see (weights updated by hand, an optimizer that is not a `torch.optim.Optimizer`)
calls `pytest_distperf.step()` once a step instead.

At each step boundary: the warm-up steps pass; then the timed window (timing.MeteredWindow, as for every job: a
lap a step); then the work phase's passes (rank/work.py) and the probes (rank/probes/runner.py) over the next
steps; then the rank leaves its result in the job folder, waits for the other ranks (a barrier on the script's
process group, when it has one) and ends the script with SystemExit(0). A script that ends first leaves an error
saying how many steps it took and how many were needed, after closing the phase it ended in (a profiler or FLOP
counter left active through the interpreter's shutdown can crash it).

Import-light: `step()` is public API; torch is imported by install().
"""

from __future__ import annotations

import atexit
import os
import sys
import time
import traceback
import weakref
from typing import Any, Generator

_WATCH: "StepWatch | None" = None


def step() -> None:
    """Mark the end of one training step, in a script run by `distperf.script_job` whose update torch's optimizer
    hook cannot see. Outside such a job it does nothing, so the script runs as before."""
    if _WATCH is not None:
        _WATCH.marker()


def install(job_dir: str) -> None:
    """Called by the sitecustomize in the process that runs the job's script."""
    import faulthandler
    import signal

    from torch.optim.optimizer import register_optimizer_step_post_hook

    from pytest_distperf.launch import jobfiles
    from pytest_distperf.rank.script import own_logs

    global _WATCH
    # torchrun, deepspeed and accelerate set RANK; Lightning sets LOCAL_RANK for the ranks it starts (one node)
    rank = int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0")))
    own_logs(job_dir, rank)  # where the launcher reads a failed rank's last lines
    # Before the pid file, by which the launcher's timeout finds this rank to ask for its stacks (SIGUSR1).
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    job = jobfiles.start_rank(job_dir, rank)
    # On a fatal signal the stacks go where the launcher reads them (a script may enable faulthandler itself: then
    # its own setting wins and the launcher names the signal without the stacks).
    faulthandler.enable(jobfiles.fatal_report_file(job_dir, rank), all_threads=True)
    _WATCH = StepWatch(job_dir, job, rank)
    register_optimizer_step_post_hook(_WATCH.on_optimizer_step)
    previous_hook = sys.excepthook

    def keep_error(kind: Any, value: Any, tb: Any) -> None:
        # when it raised, as the harness's ranks write it: of two ranks that raised within a second, the one whose
        # exit broke the other's collective is the root cause (launcher.root_cause)
        jobfiles.write_failure_time(job_dir, rank)
        if _WATCH is not None:
            _WATCH.script_error = "".join(traceback.format_exception(kind, value, tb))
        previous_hook(kind, value, tb)

    sys.excepthook = keep_error
    atexit.register(_WATCH.at_exit)


class StepWatch:
    def __init__(self, job_dir: str, job: Any, rank: int):
        from pytest_distperf.rank.timing import host_rss

        self.job_dir, self.job, self.rank = job_dir, job, rank
        self.steps_seen = 0
        self.optimizer: Any = None  # the first optimizer that stepped: its steps are the job's
        # every optimizer that stepped, in that order; weakly, so one the script drops is not kept alive
        self.optimizers: weakref.WeakKeyDictionary[Any, None] = weakref.WeakKeyDictionary()
        self.by_marker = False  # pytest_distperf.step() marks the steps: optimizer hooks are ignored
        self.done = False
        self.script_error: str | None = None
        self.started, self.started_at = time.perf_counter(), time.time()
        self.rss_before = host_rss()
        self.device: Any = None
        self.first_step_at = 0.0
        self.warmup_seconds = 0.0
        self.window: Any = None  # timing.MeteredWindow while the timed steps run
        self.readings: Any = None  # timing.WindowReadings once they have
        self.after: Generator[int, None, tuple[Any, Any]] | None = None  # the phases after timing
        self.after_started = 0.0  # perf_counter() at the timed steps' end

    @property
    def needed(self) -> int:
        """Steps the job takes at most: warm-up, timed, the work phase's passes, the probes'."""
        probes = 2 * self.job.probe_steps + 1 if self.job.probes else 0
        return (self.job.warmup_steps + self.job.steps + (3 if self.job.measure_once else 2) * self.job.work_steps
                + probes)

    def on_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self.by_marker or self.done:
            return
        if self.window is None:  # noted in warm-up and after timing: the timed steps do nothing but the step
            try:
                self.optimizers.setdefault(optimizer)
            except TypeError:  # not weakly referable: its steps may still count, its figures are left out
                pass
        if self.optimizer is None:
            self.optimizer = optimizer
        elif optimizer is not self.optimizer:
            return
        self._boundary()

    def marker(self) -> None:
        if self.done:
            return
        if not self.by_marker:
            if self.steps_seen > self.job.warmup_steps:
                raise RuntimeError(f"pytest_distperf.step() was first called after {self.steps_seen} optimizer steps "
                                   f"had been timed by torch's optimizer hook: call it once a step from the first "
                                   f"step on, or not at all")
            # From here the markers count: what the hook counted is dropped (warm-up, no timed step yet).
            if self.window is not None:
                self.window.abandon()
                self.window = None
            self.by_marker, self.steps_seen = True, 0
        self._boundary()

    def _boundary(self) -> None:
        """The end of step n (the start of step n + 1)."""
        import torch

        self.steps_seen += 1
        n, warmup, steps = self.steps_seen, self.job.warmup_steps, self.job.steps
        if n == 1:
            self.device = (torch.device("cuda", torch.cuda.current_device()) if self.job.device == "cuda"
                           else torch.device("cpu"))
            self._sync()
            self.first_step_at = time.perf_counter()
        if n == warmup:
            self._sync()
            self.warmup_seconds = time.perf_counter() - self.first_step_at
            from pytest_distperf.rank.timing import MeteredWindow

            self.window = MeteredWindow(self.device, steps)
            self.window.lap()
        elif warmup < n <= warmup + steps:
            self.window.lap()
            if n == warmup + steps:
                self.readings, self.window = self.window.finish(), None
                self.after_started = time.perf_counter()
                self.after = self._after_timing()
                self._advance(first=True)
        elif self.after is not None:
            self._advance()

    def _advance(self, first: bool = False) -> None:
        """The next step of the phases after timing; their end ends the job."""
        try:
            next(self.after) if first else self.after.send(None)
        except StopIteration as done:
            self.after = None
            self._finish(*done.value)

    def _after_timing(self) -> Generator[int, None, tuple[Any, Any]]:
        """The work phase's passes, then the probes, over the script's next steps (each yields where a step runs)."""
        from pytest_distperf.rank import work as work_phase
        from pytest_distperf.rank.probes.runner import probe_passes

        work = probes = None
        optimizers = self._optimizers()
        if self.job.work_steps:
            work = yield from work_phase.passes(self.job.work_steps, self._sync, self.device, model=optimizers,
                                                optimizer=optimizers, counts=self.job.measure_once)
        if self.job.probes:
            probes = yield from probe_passes(probes=self.job.probes, steps=self.job.probe_steps, sync=self._sync,
                                             device=self.device, optimizer=optimizers,
                                             group_size=self.job.world_size, rank=self.rank, job_dir=self.job_dir)
        return work, probes

    def _optimizers(self) -> "_Optimizers | None":
        """Every optimizer that stepped and is still alive, as one; None when none did."""
        live = list(self.optimizers.keys())
        return _Optimizers(live) if live else None

    def _sync(self) -> None:
        if self.device.type == "cuda":
            import torch

            torch.cuda.synchronize(self.device)

    def _finish(self, work: Any, probes: Any) -> None:
        from pytest_distperf import strategies
        from pytest_distperf.launch import jobfiles
        from pytest_distperf.rank.results import RankResult

        self.done = True
        optimizers = self._optimizers()
        params = list(optimizers.parameters()) if optimizers is not None else []
        result = RankResult(
            rank=self.rank, **self.readings.result_fields(), losses=[], host_rss_before_build=self.rss_before,
            optimizer_state_bytes=strategies.optimizer_state_bytes(optimizers) if optimizers is not None else 0,
            num_params=sum(p.numel() for p in params), tokens_per_step=0,
            build_seconds=self.first_step_at - self.started, build_started_at=self.started_at,
            warmup_seconds=self.warmup_seconds, work=work, probes=probes,
            after_seconds=time.perf_counter() - self.after_started,
            extra={"launch": {"profile": "script", "started_by": self.job.script.launcher,
                              "steps_by": "pytest_distperf.step()" if self.by_marker else "torch's optimizer hook",
                              "optimizer": optimizers.names() if optimizers is not None else None,
                              "script_sha256": self.job.script.sha256,
                              "omp_num_threads": os.environ.get("OMP_NUM_THREADS")}})
        jobfiles.write_rank_value(self.job_dir, self.rank, result)
        jobfiles.mark_returned(self.job_dir, self.rank)
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.barrier()  # every rank has left its result before any ends its script (a launcher ends the rest)
        raise SystemExit(0)

    def at_exit(self) -> None:
        """The script ended before the job had its steps: an error for the launcher, naming what was missing."""
        if self.done:
            return
        from pytest_distperf.launch import jobfiles

        unclosed = self._close()
        script = self.job.script.name
        what = "pytest_distperf.step() calls" if self.by_marker else "optimizer steps"
        needed = (f"the job needs up to {self.needed} ({self.job.warmup_steps} warm-up + {self.job.steps} timed + "
                  f"the work phase's and the probes' {self.needed - self.job.warmup_steps - self.job.steps})")
        if self.script_error:  # the script's own error is the news, not the steps it did not get to
            text = f"{script} raised after {self.steps_seen} {what} ({needed}):\n\n{self.script_error}"
        elif self.steps_seen == 0:
            text = (f"{script} ended without a step distperf could see: steps are found by torch's optimizer hook, "
                    f"which fires for every torch.optim.Optimizer subclass{_not_optimizers()}. Only processes that "
                    f"run the script are watched, one a rank (processes the script starts itself, as "
                    f"torch.multiprocessing.spawn does, are not: launcher='torchrun' starts the ranks). If the "
                    f"script updates its weights another way, call pytest_distperf.step() once a step.")
        else:
            text = (f"{script} ended after {self.steps_seen} {what}, without an exception; {needed}: let the script "
                    f"run longer (its own arguments) or ask for fewer (distperf.script_job(steps=..., warmup=...)); "
                    f"if it stopped on an error of its own (sys.exit), its output below says why")
        jobfiles.write_rank_error(self.job_dir, self.rank, text + unclosed)

    def _close(self) -> str:
        """Close the phase the script ended in (the timed window, or the passes after it: a profiler, a FLOP
        counter), so none is active through the interpreter's shutdown. Never raises: what failed to close is
        returned as a line for the error, after the script's own news."""
        failed = []
        after, window, self.after, self.window = self.after, self.window, None, None
        for what, close in (("the phases after timing", after.close if after is not None else None),
                            ("the timed window", window.abandon if window is not None else None)):
            if close is None:
                continue
            try:
                close()
            except BaseException as e:  # the script's end is reported whatever closing raised
                failed.append(f"\n(closing {what} at the script's end raised {type(e).__name__}: {e})")
        return "".join(failed)


class _Optimizers:
    """The optimizers that stepped, as one optimizer (param_groups, state: what strategies.optimizer_state_bytes,
    work.state_bytes and the probes read) and as a model (parameters(): a script's model is not known to the
    harness, its optimizers are). A tensor several of them update is one parameter; each keeps its own state."""

    def __init__(self, optimizers: list[Any]):
        self.optimizers = optimizers
        self.state = _States(optimizers)

    @property
    def param_groups(self) -> list[dict[str, Any]]:  # read when asked: DeepSpeed's ZeRO-3 refills its groups
        return [{"params": list(self.parameters())}]

    def parameters(self) -> Any:
        seen: set[int] = set()
        for optimizer in self.optimizers:
            for group in optimizer.param_groups:
                for p in group["params"]:
                    if id(p) not in seen:
                        seen.add(id(p))
                        yield p

    def names(self) -> str:
        return ", ".join(type(o).__name__ for o in self.optimizers)


class _States:
    """The optimizers' `state` dicts read as one (keys and values of each in turn): two optimizers' states of the
    same tensor are both kept, where one merged dict would keep one."""

    def __init__(self, optimizers: list[Any]):
        self.optimizers = optimizers

    def keys(self) -> list[Any]:
        return [k for o in self.optimizers for k in o.state.keys()]

    def values(self) -> list[Any]:
        return [v for o in self.optimizers for v in o.state.values()]


def _not_optimizers() -> str:
    """Objects in this process that hold parameter groups but are not torch.optim.Optimizers, by class."""
    import gc
    import warnings

    from torch.optim import Optimizer

    def holds_groups(o: Any) -> bool:  # an instance attribute: a module's or a mock's __getattr__ answers anything
        try:
            return "param_groups" in vars(o) and not isinstance(o, (Optimizer, type))
        except TypeError:  # no __dict__
            return False

    with warnings.catch_warnings():  # a deprecated attribute's warning, met on the way
        warnings.simplefilter("ignore")
        names = sorted({f"{type(o).__module__}.{type(o).__qualname__}" for o in gc.get_objects() if holds_groups(o)})
    return f"; these hold param_groups but are not torch.optim.Optimizers: {', '.join(names)}" if names else ""
