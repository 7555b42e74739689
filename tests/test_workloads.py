"""The workload interface: a user's model, batches and loss under the named strategies.

Real 2-rank CPU jobs through the plugin's launcher: a user's workload factory, imported by name in
every rank, trains under fsdp2 (per-unit sharding from its wrap_units, counted by the comms probe),
ddp and DeepSpeed ZeRO-3 with zero.Init, with the same losses; the seed case's model (Lightning's
demo Transformer, perf_tests/lightning_18336.py) runs at a tiny size under fsdp2, ddp and both
Lightning front-ends. Bad factories and bad workloads fail with messages naming them.
"""

from __future__ import annotations

import os

from pathlib import Path

import pytest

from pytest_distperf.errors import WorkloadError
from pytest_distperf.spec.workloads import Workload, check_workload

INNER = ("--distperf", "-p", "no:cacheprovider", "-rsfE")
PERF_TESTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "perf_tests")

USER_WORKLOAD = """
import torch
import torch.nn as nn
import torch.nn.functional as F

from pytest_distperf.spec.workloads import Workload


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.lin = nn.Linear(width, width)

    def forward(self, x):
        return x + torch.tanh(self.lin(x))


class Net(nn.Module):
    def __init__(self, width, depth):
        super().__init__()
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Linear(width, 1)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.head(x).squeeze(-1)


def mse(model, batch):
    x, y = batch
    return F.mse_loss(model(x), y)


def data(width):
    def batch(step, rank):
        g = torch.Generator().manual_seed(1000 * step + rank)
        x = torch.randn(8, width, generator=g)
        return x, x.mean(-1)
    return batch


def make(width=32, depth=3):
    return Workload(model=lambda: Net(width, depth), batch=data(width), loss=mse, wrap_units=(Block,),
                    tokens_per_batch=8, micro_batch=8)


def no_units(width=32):
    return Workload(model=lambda: Net(width, 2), batch=data(width), loss=mse)


def foreign_units(width=32):
    return Workload(model=lambda: Net(width, 2), batch=data(width), loss=mse, wrap_units=(nn.Conv1d,))


def built_module(width=32):
    torch.manual_seed(0)
    return Workload(model=Net(width, 2), batch=data(width), loss=mse, wrap_units=(Block,))


def not_a_workload():
    return {"model": None}


def bad_precision():
    return Workload(model=lambda: Net(8, 1), batch=data(8), precision="fp16")
"""


@pytest.mark.slow
def test_user_workload_under_fsdp2_ddp_and_zero3(pytester: pytest.Pytester):
    pytester.makepyfile(userwork=USER_WORKLOAD)
    pytester.makepyfile("""
        import pytest

        pytestmark = pytest.mark.distperf(world_size=2, repeats=1)
        W = dict(workload="userwork:make", steps=3, warmup=1)

        def test_fsdp2_shards_per_unit_and_trains_like_ddp(distperf):
            fsdp2 = distperf.job("fsdp2", probes=("comms",), **W)
            ddp = distperf.job("ddp", **W)
            cmp = distperf.compare(fsdp2, ddp)
            cmp.assert_losses_match(1e-4)
            run = cmp.a.runs[0]
            assert "userwork:make" in fsdp2.describe() and len(run.step_times) == 3
            width, depth = 32, 3
            assert run.ranks[0].num_params == depth * (width * width + width) + width + 1
            assert run.tokens_per_step == 8 * 2
            # one fully_shard unit per Block (3) plus the root: gathered in forward and again in backward
            ag = run.ranks[0].probes.comms.kind("all_gather")
            assert ag.counts == [2 * (depth + 1)] * 3
            assert round(run.optimizer_bytes_per_param) == 12  # AdamW fp32, sharded over 2 ranks

        def test_zero3_built_inside_zero_init_trains_like_zero3(distperf):
            # The same engine, the model built partitioned (deepspeed.zero.Init) or whole: the same weights and
            # losses. (Against FSDP2 the losses part after a step or two by more than rounding on this small
            # model: Adam's first updates are about sign(grad), and the engines' fp32 reductions round near-zero
            # gradients differently.)
            zero_init = distperf.job("deepspeed", options={"stage": 3, "zero_init": True}, **W)
            cmp = distperf.compare(zero_init, distperf.job("deepspeed", options={"stage": 3}, **W))
            cmp.assert_losses_match(1e-6)
            width, depth = 32, 3
            assert cmp.a.runs[0].ranks[0].num_params == depth * (width * width + width) + width + 1
    """)
    result = pytester.runpytest(*INNER)
    result.assert_outcomes(passed=2)


@pytest.mark.slow
def test_bad_workloads_fail_with_messages_naming_them(pytester: pytest.Pytester):
    pytester.makepyfile(userwork=USER_WORKLOAD)
    pytester.makepyfile("""
        import pytest

        pytestmark = pytest.mark.distperf(world_size=2)
        W = dict(steps=1, warmup=1)

        def test_no_colon(distperf):
            distperf.job("ddp", workload="userwork.make")

        def test_missing_module(distperf):
            distperf.job("ddp", workload="no_such_module_xyz:make")

        def test_missing_factory(distperf):
            distperf.job("ddp", workload="userwork:nope")

        def test_shape_with_workload(distperf):
            distperf.job("ddp", workload="userwork:make", shape="small")

        def test_kwargs_without_workload(distperf):
            distperf.job("ddp", workload_kwargs={"width": 8})

        def test_not_a_workload(distperf):
            distperf.run("ddp", workload="userwork:not_a_workload", **W)

        def test_bad_precision(distperf):
            distperf.run("ddp", workload="userwork:bad_precision", **W)

        def test_fsdp2_without_wrap_units(distperf):
            distperf.run("fsdp2", workload="userwork:no_units", **W)

        def test_wrap_units_not_in_the_model(distperf):
            distperf.run("fsdp2", workload="userwork:foreign_units", **W)

        def test_zero_init_needs_a_constructor(distperf):
            distperf.run("deepspeed", options={"stage": 3, "zero_init": True}, workload="userwork:built_module", **W)
    """)
    result = pytester.runpytest(*INNER)
    result.assert_outcomes(failed=10)
    out = result.stdout.str()
    for needle in [
        "test_no_colon*distperf.job(workload='userwork.make'): expected 'module:function'*",
        "test_missing_module*workload factory 'no_such_module_xyz:make' cannot be imported*No module named*",
        "test_missing_factory*workload factory 'userwork:nope': module userwork has no attribute 'nope'*",
        "test_shape_with_workload*shape*describe the built-in workload*not a workload factory*",
        "test_kwargs_without_workload*distperf.job(workload_kwargs=...) needs workload=*",
        "*workload factory userwork:not_a_workload returned dict, not a pytest_distperf.Workload*",
        "*workload factory userwork:bad_precision: Workload.precision must be one of ('auto', 'fp32'), got 'fp16'*",
        "*strategy 'fsdp2' shards the model per module class*workload factory userwork:no_units names no "
        "wrap_units*",
        "*strategy 'fsdp2': no module of the model is a Conv1d (the wrap_units of workload factory "
        "userwork:foreign_units)*",
        "*DeepSpeed zero_init=True*workload factory userwork:built_module must give Workload(model=...) as a "
        "zero-argument constructor*",
    ]:
        result.stdout.fnmatch_lines(["*" + needle])
    assert out.count("failed: rank") >= 5  # the rank-side ones name the rank, with its traceback


@pytest.mark.slow
def test_reporter_model_at_a_tiny_size_on_cpu(pytester: pytest.Pytester):
    # Lightning's demo Transformer as Lightning-AI/pytorch-lightning#18336 trained it (nll loss, Adam lr=0.1, fp32,
    # units = encoder/decoder layers), small: under fsdp2, ddp and the Lightning front-ends' CPU engine (ddp).
    pytester.syspathinsert(PERF_TESTS)
    pytester.makepyfile("""
        import pytest

        pytestmark = pytest.mark.distperf(world_size=2, repeats=1)

        def tiny(distperf, strategy, **options):
            from lightning_18336 import TINY_SIZE
            return distperf.job(strategy, workload="lightning_18336:reporter_transformer",
                                workload_kwargs=TINY_SIZE, steps=3, warmup=1, **options)

        def test_fsdp2_and_ddp(distperf):
            cmp = distperf.compare(tiny(distperf, "fsdp2", probes=("comms",)), tiny(distperf, "ddp"))
            fsdp2 = cmp.a.runs[0]
            # dropout is on (train mode), as the reporter trained: losses are finite, not equal across strategies
            assert all(0 < x < 100 for x in fsdp2.losses) and fsdp2.tokens_per_step == 32 * 2
            # units: 2 encoder + 2 decoder layers + the root, each gathered in forward and in backward
            assert fsdp2.ranks[0].probes.comms.kind("all_gather").counts == [2 * 5] * 3
            opt = cmp.b.runs[0]
            assert round(opt.optimizer_bytes_per_param) == 24  # Adam fp32, replicated on 2 ranks (DDP)

        def test_trainer_and_fabric(distperf):
            cmp = distperf.compare(tiny(distperf, "lightning_trainer"), tiny(distperf, "lightning_fabric"))
            assert all(0 < x < 100 for x in cmp.a.runs[0].losses + cmp.b.runs[0].losses)
            assert cmp.a.runs[0].optimizer_bytes_per_param == cmp.b.runs[0].optimizer_bytes_per_param
    """)
    result = pytester.runpytest(*INNER)
    result.assert_outcomes(passed=2)


def test_seed_case_skips_on_cpu_with_the_reason(pytester: pytest.Pytester):
    pytester.syspathinsert(PERF_TESTS)
    # a basename of its own: another test of this process may have imported perf_tests' module by its name
    source = Path(PERF_TESTS, "test_lightning_18336.py").read_text()
    (pytester.path / "test_seed_004_copy.py").write_text(source)
    result = pytester.runpytest(*INNER, "--distperf-device", "cpu")
    result.assert_outcomes(skipped=4)
    result.stdout.fnmatch_lines(["*SKIPPED*Lightning's FSDPStrategy needs CUDA*"])


# -- pure parts ---------------------------------------------------------------------------------------------------

def test_check_workload_names_the_factory_and_the_field():
    ok = Workload(model=object, batch=lambda s, r: ())
    assert check_workload(ok, "f") is ok
    bad = [
        (Workload(model=object, batch=None), "Workload.batch must be a callable batch(step, rank)"),
        (Workload(model=object, batch=lambda s, r: (), loss=1), "Workload.loss must be callable or None"),
        (Workload(model=object, batch=lambda s, r: (), wrap_units=("Block",)), "tuple of module classes"),
        (Workload(model=object, batch=lambda s, r: (), micro_batch=0), "micro_batch must be a positive int"),
        (Workload(model=object, batch=lambda s, r: (), tokens_per_batch=-1), "tokens_per_batch must be"),
        ("nope", "returned str, not a pytest_distperf.Workload"),
    ]
    for value, needle in bad:
        with pytest.raises(WorkloadError, match=r"^factory X") as e:
            check_workload(value, "factory X")
        assert needle in str(e.value)


def test_the_builtin_gpt_is_a_workload_with_the_old_batches():
    import torch

    from pytest_distperf.rank import prepare, workload

    shape = workload.resolve_shape("tiny")
    w = workload.builtin_workload(shape, seed=7)
    assert w.wrap_units == (workload.Block,) and w.micro_batch == shape.micro_batch
    assert w.tokens_per_batch == shape.micro_batch * shape.seq_len
    got = prepare.make_batches(w, rank=1, count=2, device=torch.device("cpu"))
    want = workload.make_batches(shape, 7, 1, 2, torch.device("cpu"))
    assert all(torch.equal(a, b) for g, h in zip(got, want) for a, b in zip(g, h))
    model = prepare.build_model(w, 7, torch.device("cpu"), None, "built-in", "ddp")
    same = workload.build_model(shape, 7, torch.device("cpu"))
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), same.parameters()))
