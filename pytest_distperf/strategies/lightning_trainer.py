"""Lightning's `Trainer` running the workload under DDP, FSDP or DeepSpeed.

Why a thread. The worker times one `step()` call per step, the same way for every
strategy; `Trainer.fit` instead owns the loop and returns only when training ends. So
`Trainer.fit` runs, once, on a thread of this rank, and is handed one batch at a time:
a gate in the LightningModule's `on_train_batch_start` hook waits for `step()` to pass in
a batch and releases the loop for exactly one iteration. `step()` returns when the loop
comes back round to the gate for the next batch, so one timed step is one full iteration
of the Trainer's loop -- the per-batch sigterm broadcast, the data fetch, hooks, the
closure with forward and backward, the optimizer step, the bookkeeping after
`on_train_batch_end` -- which is what a user's it/s counts, and it begins and ends with
the marks of the one step timer (CUDA events on the default stream, which the fit thread's
work is queued on too). The alternative, a callback that times
batch start to batch end and hands the times back, would time a different span than the
other strategies (it misses the loop's work between batches) and could not use the
worker's timer. Setup (strategy wrapping, optimizer creation) happens before the first
gate and so lands in build time. The hand-over is one queue round trip between two
threads a step: about 50 us median (100 us p90) on the 2-core CPU box, in the "other" phase
of the breakdown. The profiler probes must record all threads to see the fit thread's ops
(torch.profiler's `_ExperimentalConfig(profile_all_threads=True)`).

The data. The gate hands over the worker's own batches (made on the device up front, as
for every strategy); the Trainer's dataloader yields only step numbers, so
`batch_to_device` moves nothing, as the raw strategies move nothing either.

The rank. Under the controlled launch torch elastic started this process and the worker
initialised the process group: Lightning picks TorchElasticEnvironment (it creates processes
externally, so no relaunch), and `_init_dist_connection` leaves an initialised group alone;
both are checked after setup. Launched as its users launch it (launch profile "lightning"),
`fit` in rank 0 starts the other ranks with Lightning's own launcher, which also sets the
intra-op threads of the thread that runs `fit` and initialises the process group. Progress bar, logger, checkpointing, model summary, sanity and
validation loops are off, and no callbacks are added.

Engines and precision are configured as the raw adapters (frontend.lightning_engine).
The optimizer comes from `configure_optimizers`: torch AdamW, or, when DeepSpeed offloads
the optimizer, DeepSpeedCPUAdam -- the one DeepSpeed builds from the raw adapter's config.

Finishing. `close()` (called by the worker after its last step) makes the gate return -1
from `on_train_batch_start`, which ends the epoch, so `fit` returns through Lightning's own
teardown while the process group is still up.
"""

from __future__ import annotations

import itertools
import queue
import threading
from typing import Any, Iterator

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
        self.intra_op_threads: int | None = None  # torch's threads as seen by the fit thread (the launch sets them)
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
        group = frontend.default_process_group(ctx)
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
        self._thread = threading.Thread(target=self._fit, name="lightning-fit", daemon=True)
        self._thread.start()
        self._wait("ready")  # setup done, the loop waits at the first batch
        frontend.check_launch("Lightning Trainer", ctx, group, cluster_environment=self.trainer.strategy.cluster_environment,
                              world_size=self.trainer.world_size, rank=self.trainer.global_rank)

    def _fit(self) -> None:
        try:
            self.trainer.fit(self.module, train_dataloaders=_Ticks())
            self.module.outbox.put(("done", None))
        except BaseException as e:  # handed to the worker's thread, which raises it
            self.module.outbox.put(("error", e))

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
        if not self._thread.is_alive():
            return
        self.module.inbox.put(_STOP)
        self._wait("done")
        self._thread.join()


def build(model: torch.nn.Module, ctx: RankContext, **options: Any) -> LightningTrainerAdapter:
    return LightningTrainerAdapter(model, ctx, **options)
