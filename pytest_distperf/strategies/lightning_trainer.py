"""Lightning's `Trainer` running the workload under DDP, FSDP or DeepSpeed.

`Trainer.fit` owns the loop, so `run_loop` runs it on the rank's main thread (where its users run it) and the
measurement on a second thread. A gate in `on_train_batch_start` waits for `step()` to hand in a batch, so one
timed step is one full iteration of the loop. `close()` makes the gate return -1, so `fit` returns through
Lightning's own teardown while the process group is up.
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


build = LightningTrainerAdapter  # the adapter protocol's build(model, ctx, **options)
