"""What a measurement job runs on this rank: its adapter and its batches.

Two kinds of job share the worker's measurement loop:
- a strategy on a workload (the built-in GPT, or a user's `Workload` factory): the strategy's
  adapter module is imported, the model is built (seeded, on the device, or under the adapter's
  `model_init_context`, e.g. DeepSpeed's zero.Init), wrapped by the adapter, and every batch of the
  job is made up front;
- a user's own step (`step_job`): the user's factory returns the step; there are no batches.

`load()` does the imports (so library import memory stays out of the memory baseline), `build()`
the rest (its time is the job's build time).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from dataclasses import dataclass
from typing import Any, Callable

from pytest_distperf.spec.job import FunctionRef, JobSpec
from pytest_distperf.spec.workloads import Workload, WorkloadError, check_workload


@dataclass
class Loaded:
    job: JobSpec
    ctx: Any  # strategies.RankContext
    adapter_module: Any  # None for a user step
    options: dict[str, Any]
    factory: Any  # the user's workload or step factory, imported; None for the built-in workload


@dataclass
class Prepared:
    adapter: Any  # step(*batch) -> loss; optional step_breakdown, torch_optimizer, close
    batches: list[tuple]  # warm-up + timed steps; empty tuples for a user step
    num_params: int  # global parameter count (0 for a user step)
    tokens_per_step: int  # global tokens per step, all ranks (0 when unknown)
    model: Any = None  # the workload's module as built (the adapter wraps it); None for a user step


def ref_text(ref: FunctionRef) -> str:
    return f"{ref.module}:{ref.qualname}"


def load(job: JobSpec, rank: int, local_rank: int, device: Any, scratch_dir: str) -> Loaded:
    from pytest_distperf import strategies

    options: dict[str, Any] = {}
    module = None
    if job.strategy is not None:
        # The pytest process resolved and checked them (it alone knows strategies a conftest registered);
        # a JobSpec made by hand falls back to the registry.
        options = dict(job.full_options) if job.adapter else strategies.validate(job.strategy, job.options)
        module = import_adapter(job.strategy, job.adapter)
    ctx = strategies.RankContext(rank=rank, local_rank=local_rank, world_size=job.world_size, device=device,
                                 micro_batch=1, scratch_dir=scratch_dir, launch=job.launch_profile)
    factory = None
    if job.step is not None:
        factory = _resolve(job.step, "step factory")
    elif job.workload is not None:
        factory = _resolve(job.workload, "workload factory")
    return Loaded(job=job, ctx=ctx, adapter_module=module, options=options, factory=factory)


def resolve_function(ref: FunctionRef) -> Callable[..., Any]:
    try:
        module = importlib.import_module(ref.module)
    except ImportError:
        if not ref.file:
            raise
        spec = importlib.util.spec_from_file_location(ref.module, ref.file)
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        sys.modules[ref.module] = module
        spec.loader.exec_module(module)
    obj: Any = module
    for part in ref.qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _resolve(ref: FunctionRef, kind: str) -> Any:
    try:
        return resolve_function(ref)
    except (ImportError, AttributeError) as e:
        raise WorkloadError(f"{kind} {ref_text(ref)} cannot be imported in the rank: {e}") from e


def import_adapter(strategy: str, adapter: str | None) -> Any:
    from pytest_distperf import strategies

    name = adapter or strategies.adapter_module(strategy)
    try:
        module = importlib.import_module(name)
    except ImportError as e:
        raise strategies.StrategyError(f"strategy {strategy!r}: its adapter module {name!r} cannot be "
                                       f"imported: {e}") from e
    if not callable(getattr(module, "build", None)):
        raise strategies.StrategyError(f"strategy {strategy!r}: adapter module {name!r} has no "
                                       f"build(model, ctx, **options) (see the adapter protocol in "
                                       f"pytest_distperf.strategies)")
    return module


def build(loaded: Loaded) -> Prepared:
    return _build_user_step(loaded) if loaded.job.step is not None else _build_strategy(loaded)


def _build_user_step(loaded: Loaded) -> Prepared:
    from pytest_distperf.rank.userstep import UserStep

    job = loaded.job
    assert job.step is not None
    where = f"step factory {ref_text(job.step)}"
    adapter = UserStep(loaded.factory(*job.args, **job.kwargs), where, loaded.ctx.device)
    count = job.warmup_steps + job.steps
    return Prepared(adapter=adapter, batches=[()] * count, num_params=0,
                    tokens_per_step=adapter.tokens_per_step * job.world_size)


def load_workload(job: JobSpec, factory: Any) -> tuple[Workload, str]:
    """The job's Workload and a name for messages: the user's factory's, or the built-in GPT."""
    import torch

    from pytest_distperf.rank import workload as builtin

    torch.manual_seed(job.seed)  # a factory that builds modules builds the same ones on every side
    if job.workload is None:
        return builtin.builtin_workload(builtin.resolve_shape(job.shape, job.shape_overrides), job.seed), \
            f"built-in workload {job.shape!r}"
    where = f"workload factory {ref_text(job.workload)}"
    return check_workload(factory(**job.workload_kwargs), where), where


def _build_strategy(loaded: Loaded) -> Prepared:
    from pytest_distperf import strategies

    job, ctx, module = loaded.job, loaded.ctx, loaded.adapter_module
    assert job.strategy is not None
    w, where = load_workload(job, loaded.factory)
    ctx.micro_batch, ctx.precision = w.micro_batch, w.precision
    ctx.wrap_units, ctx.optimizer, ctx.workload_name = tuple(w.wrap_units), w.optimizer, where
    init = getattr(module, "model_init_context", None)
    init_context = init(ctx, **loaded.options) if callable(init) else None
    model = build_model(w, job.seed, ctx.device, init_context, where, job.strategy)
    num_params = sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters())
    adapter = module.build(model, ctx, **loaded.options)
    if not callable(getattr(adapter, "step", None)):
        raise strategies.StrategyError(f"strategy {job.strategy!r}: build() of adapter module {module.__name__!r} "
                                       f"returned {type(adapter).__name__}, which has no step(*batch) method")
    batches = make_batches(w, ctx.rank, job.warmup_steps + job.steps, ctx.device)
    tokens = (w.tokens_per_batch or 0) * job.world_size
    return Prepared(adapter=adapter, batches=batches, num_params=num_params, tokens_per_step=tokens, model=model)


def _with_loss_class() -> Any:
    import torch

    class LossModel(torch.nn.Module):
        """model(*batch) -> loss for the strategies: the user's model under `.model`, their loss around it."""

        def __init__(self, model: torch.nn.Module, loss: Any):
            super().__init__()
            self.model = model
            self._loss = loss

        def forward(self, *batch: Any) -> Any:
            return self._loss(self.model, batch)

    return LossModel


def build_model(w: Workload, seed: int, device: Any, init_context: Any, where: str, strategy: str) -> Any:
    """Seeded; on the device, or under the strategy's init context; with the workload's loss around it."""
    import torch

    torch.manual_seed(seed)
    if isinstance(w.model, torch.nn.Module):
        if init_context is not None:
            raise WorkloadError(f"strategy {strategy!r} builds the model inside its own init context (e.g. "
                                f"DeepSpeed zero_init=True: deepspeed.zero.Init), so {where} must give "
                                f"Workload(model=...) as a zero-argument constructor, not a built module")
        model = w.model.to(device)
    elif callable(w.model):
        with (init_context if init_context is not None else device):
            model = w.model()
        if not isinstance(model, torch.nn.Module):
            raise WorkloadError(f"{where}: Workload.model() returned {type(model).__name__}, not a torch.nn.Module")
    else:
        raise WorkloadError(f"{where}: Workload.model must be a torch.nn.Module or a zero-argument callable "
                            f"returning one, got {type(w.model).__name__}")
    if w.loss is not None:
        model = _with_loss_class()(model, w.loss)
    return model


def make_batches(w: Workload, rank: int, count: int, device: Any) -> list[tuple]:
    """Every batch of the job, made up front on the host and moved to the device: no data work in a timed step."""
    return [_to_device(_as_tuple(w.batch(step, rank)), device) for step in range(count)]


def _as_tuple(batch: Any) -> tuple:
    return tuple(batch) if isinstance(batch, (tuple, list)) else (batch,)


def _to_device(batch: tuple, device: Any) -> tuple:
    import torch

    def move(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            return x.to(device)
        if isinstance(x, (tuple, list)):
            return type(x)(move(v) for v in x)
        if isinstance(x, dict):
            return {k: move(v) for k, v in x.items()}
        return x

    return tuple(move(x) for x in batch)


def launch_facts(job: JobSpec, ctx: Any, adapter: Any) -> dict[str, Any]:
    """How this rank was started, for the report (RankResult.extra["launch"]): what a launch changes."""
    import os

    import torch

    from pytest_distperf.launch.devices import usable_cores

    threads = getattr(adapter, "intra_op_threads", None)  # a front-end's own loop thread (Lightning's fit)
    return {
        "profile": job.launch_profile,
        "started_by": "torch elastic" if "TORCHELASTIC_RUN_ID" in os.environ else "lightning",
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "intra_op_threads": threads if threads is not None else torch.get_num_threads(),
        "cpus": usable_cores(),
        **ctx.extra,
    }
