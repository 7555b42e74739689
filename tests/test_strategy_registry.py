"""Your own strategy: the `pytest_distperf.strategies` entry-point group, register(), and the adapter protocol.

A throwaway distribution (a dist-info folder with an entry point, on the inner session's sys.path)
ships a strategy whose adapter runs in real 2-rank CPU jobs; broken registrations are usage errors at
start-up naming the entry point and its distribution; adapters registered by a fixture that break the
protocol fail naming the strategy and the module.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_distperf.errors import StrategyError
from pytest_distperf.strategies.registry import Registry, Strategy

INNER = ("--distperf", "-p", "no:cacheprovider", "-rsfE")

REGISTRATION = """
from pytest_distperf.strategies.registry import Strategy, StrategyError


def _check(o):
    if not 0 <= o["momentum"] < 1:
        raise StrategyError(f"plain_sgd option momentum={o['momentum']!r} must be in [0, 1)")


STRATEGY = Strategy(name="plain_sgd", adapter="mystrat_adapter", options={"momentum": 0.0}, check=_check)
"""

# The adapter protocol at its smallest: build() returning an object with step(*batch); nothing optional.
ADAPTER = """
import torch
from torch.nn.parallel import DistributedDataParallel


class PlainSGD:
    def __init__(self, model, ctx, *, lr, weight_decay, momentum):
        self.model = DistributedDataParallel(model)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay)

    def step(self, *batch):
        loss = self.model(*batch)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad()
        return loss.detach()


def build(model, ctx, **options):
    return PlainSGD(model, ctx, **options)
"""


def make_distribution(site: Path, entry_points: str, modules: dict[str, str]) -> None:
    info = site / "mystrat-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: mystrat\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[pytest_distperf.strategies]\n" + entry_points)
    for name, text in modules.items():
        (site / f"{name}.py").write_text(text)


@pytest.mark.slow
def test_an_entry_point_strategy_runs_in_real_ranks(pytester: pytest.Pytester):
    site = pytester.path / "site"
    make_distribution(site, "plain_sgd = mystrat_reg:STRATEGY\n",
                      {"mystrat_reg": REGISTRATION, "mystrat_adapter": ADAPTER})
    pytester.syspathinsert(site)
    pytester.makepyfile("""
        import pytest

        pytestmark = pytest.mark.distperf(world_size=2, repeats=1)

        def test_runs(distperf):
            job = distperf.job("plain_sgd", options={"momentum": 0.9}, steps=3, warmup=1)
            assert job.describe() == "plain_sgd[momentum=0.9] tiny x2 cpu"
            run = distperf.run(job)
            assert len(run.step_times) == 3 and len(set(run.losses)) == 3  # it trained: each step's loss differs
            assert run.ranks[0].optimizer_state_bytes == 0  # no torch_optimizer(): optional
            assert run.ranks[0].step_breakdown == {}  # no step_breakdown(): optional

        def test_unknown_option(distperf):
            distperf.job("plain_sgd", options={"nesterov": True})

        def test_bad_value(distperf):
            distperf.job("plain_sgd", options={"momentum": 2})

        def test_unknown_strategy(distperf):
            distperf.job("plain_sdg")
    """)
    result = pytester.runpytest(*INNER)
    result.assert_outcomes(passed=1, failed=3)
    result.stdout.fnmatch_lines([
        "*test_unknown_option*strategy 'plain_sgd' has no option(s) 'nesterov'; its options are: lr, momentum, "
        "weight_decay*",
        "*test_bad_value*plain_sgd option momentum=2 must be in [[]0, 1)*",
        "*test_unknown_strategy*unknown strategy 'plain_sdg'; known strategies: accelerate, ddp, deepspeed, fsdp, "
        "fsdp2, lightning_fabric, lightning_trainer, plain_sgd*",
    ])


@pytest.mark.parametrize("entry, modules, needle", [
    ("plain_sgd = mystrat_broken:STRATEGY\n", {"mystrat_broken": "import no_such_dependency_xyz\n"},
     "*entry point plain_sgd = mystrat_broken:STRATEGY (group 'pytest_distperf.strategies', distribution mystrat) "
     "cannot be loaded: ModuleNotFoundError: No module named 'no_such_dependency_xyz'*"),
    ("plain_sgd = mystrat_reg:build\n", {"mystrat_reg": REGISTRATION + "\ndef build():\n    pass\n"},
     "*entry point plain_sgd = mystrat_reg:build (*distribution mystrat) must be a "
     "pytest_distperf.strategies.registry.Strategy, got function*"),
    ("other_name = mystrat_reg:STRATEGY\n", {"mystrat_reg": REGISTRATION},
     "*entry point other_name = mystrat_reg:STRATEGY (*) names a Strategy called 'plain_sgd'; the entry point's "
     "name must be the strategy's name*"),
    ("ddp = mystrat_reg:DDP\n", {"mystrat_reg": REGISTRATION + "\nDDP = Strategy(name='ddp', adapter='json')\n"},
     "*strategy 'ddp' registered by entry point ddp = mystrat_reg:DDP (*) would replace the built-in strategy*"),
    ("plain_sgd = mystrat_reg:STRATEGY\n", {"mystrat_reg": REGISTRATION},
     "*entry point plain_sgd = mystrat_reg:STRATEGY (*): its adapter module 'mystrat_adapter' cannot be found on "
     "sys.path*"),
], ids=["import_error", "not_a_strategy", "name_mismatch", "builtin_name", "adapter_missing"])
def test_a_broken_entry_point_is_a_usage_error_at_start(pytester: pytest.Pytester, entry, modules, needle):
    site = pytester.path / "site"
    make_distribution(site, entry, modules)
    pytester.syspathinsert(site)
    pytester.makepyfile("def test_nothing():\n    pass\n")
    result = pytester.runpytest(*INNER)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*distperf: " + needle.lstrip("*")])
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)  # without --distperf nothing is loaded


FIXTURE_ADAPTERS = {
    "adapter_nobuild": "def make(model, ctx, **options):\n    return None\n",
    "adapter_nostep": "def build(model, ctx, **options):\n    return object()\n",
}


@pytest.mark.slow
def test_fixture_registered_adapters_that_break_the_protocol(pytester: pytest.Pytester):
    for name, text in FIXTURE_ADAPTERS.items():
        pytester.makepyfile(**{name: text})
    pytester.makeconftest("""
        import pytest
        from pytest_distperf.strategies import register, unregister
        from pytest_distperf.strategies.registry import Strategy

        @pytest.fixture
        def broken_strategies():
            mine = [Strategy(name="no_build", adapter="adapter_nobuild"),
                    Strategy(name="no_step", adapter="adapter_nostep")]
            for s in mine:
                register(s)
            yield
            for s in mine:
                unregister(s.name)
    """)
    pytester.makepyfile("""
        import pytest
        from pytest_distperf.strategies import register
        from pytest_distperf.strategies.registry import Strategy

        pytestmark = pytest.mark.distperf(world_size=2)

        def test_no_build(distperf, broken_strategies):
            distperf.run("no_build", steps=1, warmup=1)

        def test_no_step(distperf, broken_strategies):
            distperf.run("no_step", steps=1, warmup=1)

        def test_builtin_name(distperf):
            register(Strategy(name="fsdp2", adapter="adapter_nostep"))

        def test_gone_after_the_fixture(distperf):
            distperf.job("no_step")
    """)
    result = pytester.runpytest(*INNER)
    result.assert_outcomes(failed=4)
    result.stdout.fnmatch_lines([
        "*StrategyError: strategy 'no_build': adapter module 'adapter_nobuild' has no build(model, ctx, **options)*",
        "*StrategyError: strategy 'no_step': build() of adapter module 'adapter_nostep' returned object, which has "
        "no step(*batch) method*",
        "*strategy 'fsdp2' registered by register() would replace the built-in strategy of that name*",
        "*test_gone_after_the_fixture*unknown strategy 'no_step'*",
    ])


# -- pure parts ---------------------------------------------------------------------------------------------------

def test_registry_checks_a_record_before_taking_it():
    reg = Registry({})
    for record, needle in [
        (object(), "must be a pytest_distperf.strategies.registry.Strategy, got object"),
        (Strategy(name="my-strat", adapter="json"), "strategy name 'my-strat' must be an identifier"),
        (Strategy(name="s", adapter=""), "Strategy.adapter must name the adapter module"),
        (Strategy(name="s", adapter="json", user_launch="mpirun"), "user_launch='mpirun' is not one of"),
        (Strategy(name="s", adapter="json", check=1), "Strategy.check must be callable or None"),
        (Strategy(name="s", adapter="no_such_module_xyz.adapter"), "cannot be found"),
    ]:
        with pytest.raises(StrategyError, match="registered by test") as e:
            reg.register(record, origin="test")  # type: ignore[arg-type]
        assert needle in str(e.value)
    reg.register(Strategy(name="s", adapter="json"), origin="test")
    with pytest.raises(StrategyError, match="already registered by test"):
        reg.register(Strategy(name="s", adapter="csv"), origin="another test")
