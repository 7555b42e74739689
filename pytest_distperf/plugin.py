"""pytest hooks and the `distperf` fixture. Logic lives in the modules they call."""

from __future__ import annotations

import json
from typing import Any, Iterator

import pytest

from pytest_distperf import report
from pytest_distperf.devices import DEVICE_CHOICES, visible_gpu_count
from pytest_distperf.options import Settings, SettingsError, TestPlan, build_settings, plan_test
from pytest_distperf.session import DistPerf, RunCache

settings_key = pytest.StashKey[Settings]()
cache_key = pytest.StashKey[RunCache]()
plan_key = pytest.StashKey[TestPlan]()
fixture_key = pytest.StashKey[DistPerf]()

TOPIC_MARKERS = {
    "zero3": "DeepSpeed ZeRO stage 3 performance checks",
    "fsdp": "torch FSDP / FSDP2 performance checks",
    "ddp": "torch DDP performance checks",
    "deepspeed": "DeepSpeed performance checks",
    "offload": "optimizer / parameter offload checks",
    "comm": "collective communication checks",
    "lightning": "Lightning Trainer / Fabric checks",
    "accelerate": "Hugging Face Accelerate checks",
}
SETTING_HELP = {
    "device": f"device for distperf jobs: {'|'.join(DEVICE_CHOICES)} (auto: CUDA+NCCL when enough GPUs, else CPU+gloo)",
    "world_size": "default number of ranks per job",
    "timeout": "wall-clock limit in seconds for one job (all ranks are ended on expiry)",
    "repeats": "runs per side in a comparison (interleaved A B A B ...)",
    "shape_cpu": "built-in workload shape for CPU jobs",
    "shape_cuda": "built-in workload shape for CUDA jobs",
}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("distperf", "distributed-training performance tests")
    group.addoption("--distperf", action="store_true", help="run distperf performance tests (else they are skipped)")
    for name, text in SETTING_HELP.items():
        group.addoption("--distperf-" + name.replace("_", "-"), dest="distperf_" + name, default=None, help=text)
        parser.addini("distperf_" + name, text, default=None)
    group.addoption("--distperf-keep-jobs", action="store_true",
                    help="keep every job's folder (rank logs) instead of only those of failed jobs")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "distperf(world_size=N, device='auto|cpu|cuda', timeout=S, repeats=N): "
                   "a distributed performance test, run with --distperf")
    for name, text in TOPIC_MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")
    cli = {name: config.getoption("distperf_" + name) for name in SETTING_HELP}
    ini = {name: config.getini("distperf_" + name) for name in SETTING_HELP}
    try:
        settings = build_settings(config.getoption("distperf"), cli, ini, config.getoption("distperf_keep_jobs"))
    except SettingsError as e:
        raise pytest.UsageError(f"distperf: {e}") from None
    config.stash[settings_key] = settings
    config.stash[cache_key] = RunCache()
    config.pluginmanager.register(SummaryCollector(), "distperf-summary")


def _is_distperf(item: pytest.Item) -> bool:
    return item.get_closest_marker("distperf") is not None or "distperf" in getattr(item, "fixturenames", ())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    settings = config.stash[settings_key]
    perf_items = [i for i in items if _is_distperf(i)]
    if not settings.enabled:
        skip = pytest.mark.skip(reason="distperf performance test: run with --distperf to enable")
        for item in perf_items:
            item.add_marker(skip)
        return
    gpus = visible_gpu_count() if perf_items else 0
    for item in perf_items:
        marker = item.get_closest_marker("distperf")
        try:
            plan = plan_test(settings, dict(marker.kwargs) if marker else {}, gpus, item.nodeid)
        except SettingsError as e:
            raise pytest.UsageError(f"distperf: {e}") from None
        item.stash[plan_key] = plan
        if plan.skip_reason:
            item.add_marker(pytest.mark.skip(reason=plan.skip_reason))


@pytest.fixture
def distperf(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DistPerf]:
    """Run strategies or your own function on N ranks started by torch's elastic launcher."""
    config = request.config
    settings = config.stash[settings_key]
    if not settings.enabled:
        pytest.skip("distperf performance test: run with --distperf to enable")
    plan = request.node.stash.get(plan_key, None)
    if plan is None:
        plan = plan_test(settings, {}, visible_gpu_count(), request.node.nodeid)
    tr = config.pluginmanager.get_plugin("terminalreporter")
    progress = None
    if tr is not None and config.get_verbosity() > 0:
        progress = lambda text: tr.write_line(f"    [distperf] {text}")  # noqa: E731
    dp = DistPerf(settings, plan, config.stash[cache_key], request.node.nodeid,
                  str(tmp_path_factory.getbasetemp()), progress)
    request.node.stash[fixture_key] = dp
    yield dp


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    outcome = yield
    rep = outcome.get_result()
    dp = item.stash.get(fixture_key, None)
    if dp is None or rep.when != "call" or not dp.records:
        return
    # user_properties travel with the report (xdist) and become JUnit <property> elements.
    rep.user_properties.append(("distperf", json.dumps(dp.records, sort_keys=True)))
    for r in dp.records:
        if r["kind"] == "check":
            prefix = f"distperf.{r['name']}"
            rep.user_properties += [(f"{prefix}.ratio", f"{r['ratio']:.4f}"), (f"{prefix}.threshold", r["threshold"]),
                                    (f"{prefix}.passed", r["passed"])]


class SummaryCollector:
    """Gathers distperf records from test reports (also those xdist workers send) for the summary table."""

    def __init__(self) -> None:
        self.records: list[tuple[str, list[dict[str, Any]]]] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "call":
            self.records += [(report.nodeid, json.loads(v)) for k, v in report.user_properties if k == "distperf"]

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.records:
            terminalreporter.write_sep("=", "distperf")
            for line in report.render(self.records):
                terminalreporter.write_line(line)
