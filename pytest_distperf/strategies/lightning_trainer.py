"""Lightning's `Trainer` running the workload under DDP, FSDP or DeepSpeed.

Who owns the main thread. The worker times one `step()` call per step, the same way for every
strategy; `Trainer.fit` instead owns the loop and returns only when training ends. So the
adapter's `run_loop` runs `Trainer.fit`, once, on the rank's main thread -- where its users run
it -- and the worker's measurement (warm-up, timing, probes, breakdown) on a second thread,
which hands the loop one batch at a time: a gate in the LightningModule's `on_train_batch_start`
hook waits for `step()` to pass in a batch and releases the loop for exactly one iteration.
`step()` returns when the loop comes back round to the gate for the next batch, so one timed
step is one full iteration of the Trainer's loop -- the per-batch sigterm broadcast, the data
fetch, hooks, the closure with forward and backward, the optimizer step, the bookkeeping after
`on_train_batch_end` -- which is what a user's it/s counts, and it begins and ends with the marks
of the one step timer (CUDA events on the default stream, which the loop's work is queued on too).
The loop must not be the one on the second thread: the reporter's own script of #18336 with `fit`
moved to a second thread ran its CPU-offloaded optimizer much slower than with `fit` on the main
thread (benchmarks/seed004_reporter.py --fit-thread; figures in benchmarks/results/). A callback
that times batch start to batch end instead would time a different span than the other strategies
(it misses the loop's work between batches) and could not use the worker's timer. Setup (strategy
wrapping, optimizer creation) happens before the first gate, and the measurement starts there, so
setup lands in build time. The hand-over is one queue round trip between two threads a step, in
the "other" phase of the breakdown. The profiler probes record all threads (torch.profiler's
`_ExperimentalConfig(profile_all_threads=True)`): the step marks are on the measuring thread, the
loop's ops on the main thread.

The data. The gate hands over the worker's own batches (made on the device up front, as
for every strategy); the Trainer's dataloader yields only step numbers, so
`batch_to_device` moves nothing, as the raw strategies move nothing either.

The rank. Under the controlled launch torch elastic started this process and the worker
initialised the process group: Lightning picks TorchElasticEnvironment (it creates processes
externally, so no relaunch), and `_init_dist_connection` leaves an initialised group alone;
both are checked after setup. Launched as its users launch it (launch profile "lightning"),
`fit` in rank 0 starts the other ranks with Lightning's own launcher, which also sets the
intra-op threads and initialises the process group. On the main thread `fit` also installs
Lightning's SIGTERM handler, as it does for its users. Progress bar, logger, checkpointing,
model summary, sanity and validation loops are off, and no callbacks are added.

Engines and precision are configured as the raw adapters (frontend.lightning_engine).
The optimizer comes from `configure_optimizers`: torch AdamW, or, when DeepSpeed offloads
the optimizer, DeepSpeedCPUAdam -- the one DeepSpeed builds from the raw adapter's config.

Finishing. `close()` (called by the measurement after its last step) makes the gate return -1
from `on_train_batch_start`, which ends the epoch, so `fit` returns through Lightning's own
teardown while the process group is still up. A measurement that fails ends the loop the same
way; a loop that fails wakes the measurement, and the rank raises the loop's error.
"""

from __future__ import annotations

import itertools
import queue
import threading
from typing import Any, Callable, Iterator

import lightning.pytorch as pl
import torch

from pytest_distperf.rank.breakdown import PhaseClock
from pytest_distperf.strategies import RankContext, frontend
from pytest_distperf.rank.timing import StepTimer

_STOP = object()


class _Ticks:
    """The Trainer's dataloader: endless step numbers (the tensors come through the gate)."""

    def __iter__(self) -> Iterator[int]:
        return itertools.count()


class _Module(pl.LightningModule):
    def __init__(self, model: torch.nn.Module, make_optimizer: Any):
        super().__init__()
        self.model = model
        self._make_optimizer = make_optimizer
        self.inbox: queue.Queue = queue.Queue()  # batches (or _STOP) from step()
        self.outbox: queue.Queue = queue.Queue()  # ("ready", last loss) / ("done", None) / ("error", exc)
        self.batch: tuple | None = None
        self.intra_op_threads: int | None = None  # torch's threads as the loop sees them (the launch sets them)
        self.loss: torch.Tensor | None = None
        self.clock: PhaseClock | None = None  # set only for step_breakdown()

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> int | None:
        # The gate: report the previous step done, wait for the next batch.
        self.outbox.put(("ready", self.loss))
        item = self.inbox.get()
        if item is _STOP:
            return -1  # Lightning ends the epoch, and with max_epochs=1 the fit
        self.batch = item
        return None

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if self.intra_op_threads is None:
            self.intra_op_threads = torch.get_num_threads()
        loss = self.model(*self.batch)
        self.loss = loss.detach()
        return loss

    def on_before_backward(self, loss: torch.Tensor) -> None:
        if self.clock:
            self.clock.lap("forward")

    def on_after_backward(self) -> None:
        if self.clock:
            self.clock.lap("backward")

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.clock:
            self.clock.lap("optimizer")

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return self._make_optimizer(self.trainer.model.parameters())


class LightningTrainerAdapter:
    def __init__(self, model: torch.nn.Module, ctx: RankContext, **options: Any):
        self.ctx = ctx
        self._sync = StepTimer(ctx.device).sync
        self._group = frontend.default_process_group(ctx)
        strategy, precision, model, make_optimizer = frontend.lightning_engine(ctx, model, options, fabric=False)
        devices, nodes = frontend.node_layout(ctx.world_size)
        self.module = _Module(model, make_optimizer)
        self.trainer = pl.Trainer(
            accelerator="cuda" if ctx.device.type == "cuda" else "cpu", devices=devices, num_nodes=nodes,
            strategy=strategy, precision=precision, max_epochs=1, max_steps=-1, limit_val_batches=0,
            num_sanity_val_steps=0, enable_progress_bar=False, enable_model_summary=False,
            enable_checkpointing=False, logger=False, use_distributed_sampler=False,
            accumulate_grad_batches=1, default_root_dir=ctx.scratch_dir,
        )

    def run_loop(self, measure: Callable[[], Any]) -> Any:
        """`Trainer.fit` on this thread (the rank's main thread), `measure` on a second thread from the moment
        setup is done and the loop waits at its first batch. Returns what `measure` returned."""
        outcome: dict[str, Any] = {}

        def measuring() -> None:
            try:
                if self.ctx.device.type == "cuda":
                    torch.cuda.set_device(self.ctx.device)  # the current device is per thread
                self._wait("ready")
                frontend.check_launch("Lightning Trainer", self.ctx, self._group,
                                      cluster_environment=self.trainer.strategy.cluster_environment,
                                      world_size=self.trainer.world_size, rank=self.trainer.global_rank)
                outcome["value"] = measure()
            except BaseException as e:
                outcome["error"] = e
            finally:
                self.module.inbox.put(_STOP)  # a loop still waiting at the gate ends its epoch

        thread = threading.Thread(target=measuring, name="distperf-measure", daemon=True)
        thread.start()
        try:
            self.trainer.fit(self.module, train_dataloaders=_Ticks())
        except BaseException as e:
            self.module.outbox.put(("error", e))  # the measurement may be waiting for the loop
            thread.join()
            raise
        self.module.outbox.put(("done", None))
        thread.join()
        if "error" in outcome:
            raise outcome["error"]
        return outcome["value"]

    def _wait(self, expected: str) -> Any:
        kind, payload = self.module.outbox.get()
        if kind == "error":
            raise RuntimeError(f"Lightning Trainer.fit failed on rank {self.ctx.rank}: {payload!r}") from payload
        if kind != expected:
            raise RuntimeError(f"Lightning Trainer.fit: expected {expected!r}, got {kind!r} "
                               "(did the fit loop end early? check max_epochs/max_steps)")
        return payload

    def step(self, *batch: torch.Tensor) -> torch.Tensor:
        self.module.inbox.put(batch)
        return self._wait("ready")

    @property
    def intra_op_threads(self) -> int | None:
        return self.module.intra_op_threads

    def step_breakdown(self, *batch: torch.Tensor) -> dict[str, float]:
        clock = PhaseClock(self._sync)
        self.module.clock = clock
        try:
            clock.start()
            self.step(*batch)
            return clock.stop()
        finally:
            self.module.clock = None

    def torch_optimizer(self) -> torch.optim.Optimizer:
        opt = self.trainer.optimizers[0]
        return getattr(opt, "optimizer", opt)  # DeepSpeed's ZeRO wrapper holds the torch optimizer inside

    def close(self) -> None:
        """End Trainer.fit through Lightning's own teardown (the process group must still be up)."""
        self.module.inbox.put(_STOP)
        self._wait("done")


def build(model: torch.nn.Module, ctx: RankContext, **options: Any) -> LightningTrainerAdapter:
    return LightningTrainerAdapter(model, ctx, **options)
