"""The workload interface: what a user's workload factory returns in every rank.

    # mypkg/bench.py (module level: every rank imports it by name)
    def make_workload(layers=4):
        return Workload(model=lambda: MyModel(layers), batch=my_batch, loss=my_loss, wrap_units=(MyBlock,))

    distperf.job("fsdp2", workload="mypkg.bench:make_workload", workload_kwargs={"layers": 2})

Import-light: no torch at import, so the pytest process can name this class.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from pytest_distperf.errors import WorkloadError

PRECISIONS = ("auto", "fp32")


@dataclass
class Workload:
    """A model, its per-rank batches and its loss, as one job trains them.

    model: a `torch.nn.Module`, or a zero-argument callable that builds one (needed where a strategy
        builds the model inside its own context, e.g. DeepSpeed `zero_init=True`). Built after
        `torch.manual_seed(seed)`, inside `with device:`. Under zero.Init each submodule is partitioned as
        soon as its __init__ returns: a parent's later in-place init of a child's weights does not reach them
        (initialise them in the child, or under deepspeed.zero.GatheredParameters).
    batch: `batch(step, rank)` -> this rank's batch for that step: a tuple of the model's positional
        inputs (tensors are moved to the rank's device) or one tensor. Must depend only on (step, rank)
        (and the seed the factory was given) so both sides of a comparison see the same data.
    loss: `loss(model, batch)` -> scalar loss tensor. None: `model(*batch)` returns the loss.
    optimizer: `optimizer(params)` -> a torch optimizer, as the user trains. None: the strategy's
        AdamW(lr, weight_decay), the same on both sides of a comparison.
    wrap_units: the module classes that are sharding units (FSDP/FSDP2 units, Lightning's and
        Accelerate's auto-wrap policies). A strategy that shards per unit refuses a workload without them.
    tokens_per_batch: tokens per rank per step, for tok/s (None: not reported).
    micro_batch: samples per rank per step (DeepSpeed's train_micro_batch_size_per_gpu).
    precision: "auto" = the harness's policy (bf16 compute over fp32 master weights on CUDA, fp32 on
        CPU); "fp32" = fp32 everywhere, as a user who sets no precision trains.
    """

    model: Any
    batch: Callable[[int, int], Any]
    loss: Callable[[Any, Any], Any] | None = None
    optimizer: Callable[[Any], Any] | None = None
    wrap_units: tuple[type, ...] = ()
    tokens_per_batch: int | None = None
    micro_batch: int = 1
    precision: str = "auto"


def check_workload(w: Any, where: str) -> Workload:
    """Check a factory's return value field by field (inside the rank, before anything is built)."""
    if not isinstance(w, Workload):
        raise WorkloadError(f"{where} returned {type(w).__name__}, not a pytest_distperf.Workload")
    tokens = w.tokens_per_batch
    for name, ok, expected in (
            ("batch", callable(w.batch), "a callable batch(step, rank)"),
            ("loss", w.loss is None or callable(w.loss), "callable or None"),
            ("optimizer", w.optimizer is None or callable(w.optimizer), "callable or None"),
            ("wrap_units", isinstance(w.wrap_units, (tuple, list)) and all(isinstance(u, type) for u in w.wrap_units),
             "a tuple of module classes"),
            ("precision", w.precision in PRECISIONS, f"one of {PRECISIONS}"),
            ("micro_batch", isinstance(w.micro_batch, int) and w.micro_batch >= 1, "a positive int"),
            ("tokens_per_batch", tokens is None or (isinstance(tokens, int) and tokens >= 0),
             "a non-negative int or None")):
        if not ok:
            raise WorkloadError(f"{where}: Workload.{name} must be {expected}, got {getattr(w, name)!r}")
    return w
