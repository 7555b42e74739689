"""pytest hooks and the `distperf` fixture. Logic lives in the modules they call."""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any, Iterator

import pytest

from pytest_distperf.gate import regression

from pytest_distperf.report import terminal as report

from pytest_distperf.report import files as reports
from pytest_distperf.gate.store import BaselineError
from pytest_distperf.gate.checks import DistPerfCheckFailed
from pytest_distperf.launch.devices import DEVICE_CHOICES, visible_gpu_count
from pytest_distperf.config import Settings, SettingsError, TestPlan, build_settings, plan_test
from pytest_distperf.fixture import DistPerf, RunCache

settings_key = pytest.StashKey[Settings]()
cache_key = pytest.StashKey[RunCache]()
plan_key = pytest.StashKey[TestPlan]()
fixture_key = pytest.StashKey[DistPerf]()
gate_key = pytest.StashKey["regression.GateSession | None"]()
policy_key = pytest.StashKey[regression.Policy]()

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
# Options that pick the machine class or the jobs: repeated in the "accept this change" command.
CARRIED_OPTIONS = {"--distperf-" + name.replace("_", "-"): "distperf_" + name
                   for name in ("device", "world_size", "repeats", "shape_cpu", "shape_cuda")}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("distperf", "distributed-training performance tests")
    group.addoption("--distperf", action="store_true", help="run distperf performance tests (else they are skipped)")
    for name, text in SETTING_HELP.items():
        group.addoption("--distperf-" + name.replace("_", "-"), dest="distperf_" + name, default=None, help=text)
        parser.addini("distperf_" + name, text, default=None)
    group.addoption("--distperf-keep-jobs", action="store_true",
                    help="keep every job's folder (rank logs) instead of only those of failed jobs")
    group.addoption("--distperf-save", action="store_true",
                    help="record baselines for the distperf tests that ran and passed; other entries stay as they are")
    group.addoption("--distperf-baselines", dest="distperf_baselines", default=None, metavar="DIR",
                    help="baselines folder (default: baselines/ at the rootdir)")
    parser.addini("distperf_baselines", "baselines folder, relative to the rootdir", default=None)
    group.addoption("--distperf-require-baseline", action="store_true",
                    help="fail tests with no baseline for this machine class ('new') or a changed config (for CI)")
    group.addoption("--distperf-fail-on-improvement", action="store_true",
                    help="fail when a metric improved beyond its threshold (keeps baselines fresh)")
    group.addoption("--distperf-json", dest="distperf_json", default=None, metavar="PATH",
                    help="write a JSON report: job configs, environment, per-rank metrics, checks, verdicts")
    group.addoption("--distperf-benchmark-json", dest="distperf_benchmark_json", default=None, metavar="PATH",
                    help="export step times in pytest-benchmark's JSON format (pytest-benchmark compare, "
                         "github-action-benchmark)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "distperf(world_size=N, device='auto|cpu|cuda', timeout=S, repeats=N, time_threshold=0.05, "
                   "time_k=3, memory_threshold=0.02, memory_floor=BYTES, baseline_metrics=(...), "
                   "probes=('comms', 'overlap', 'placement')): "
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
    config.stash[gate_key] = _gate_session(config, settings.enabled)
    if not hasattr(config, "workerinput"):  # the controller writes the session's reports (xdist workers send theirs)
        config.pluginmanager.register(ReportWriter(config), "distperf-reports")


def _gate_session(config: pytest.Config, enabled: bool) -> regression.GateSession | None:
    if config.getoption("distperf_save") and not enabled:
        raise pytest.UsageError("distperf: --distperf-save needs --distperf (it records what the tests measure)")
    for opt in ("distperf_json", "distperf_benchmark_json"):
        path = config.getoption(opt)
        if path is not None and (path == "" or os.path.isdir(path)):
            raise pytest.UsageError(f"distperf: --{opt.replace('_', '-')}: expected a file path, got {path!r}")
    if not enabled:
        return None
    try:
        gs = regression.gate_settings(
            str(config.rootpath), config.getoption("distperf_baselines"), config.getini("distperf_baselines"),
            config.getoption("distperf_save"), config.getoption("distperf_require_baseline"),
            config.getoption("distperf_fail_on_improvement"),
            {flag: config.getoption(dest) for flag, dest in CARRIED_OPTIONS.items()})
        session = regression.GateSession(gs, str(config.rootpath))
        if gs.save and not hasattr(config, "workerinput"):
            session.store.check_writable()  # before any job runs, not after an hour of them
    except (SettingsError, BaselineError) as e:
        raise pytest.UsageError(f"distperf: {e}") from None
    return session


def _is_distperf(item: pytest.Item) -> bool:
    return item.get_closest_marker("distperf") is not None or "distperf" in getattr(item, "fixturenames", ())


def _session_device(session: pytest.Session) -> str:
    """cuda when any collected test was planned on CUDA, else cpu (for the session-level environment)."""
    planned = {item.stash[plan_key].device for item in session.items if plan_key in item.stash}
    return "cuda" if "cuda" in planned else "cpu"


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
        kwargs: dict[str, Any] = {}
        for marker in reversed(list(item.iter_markers("distperf"))):  # module, class, then function: closest wins
            kwargs.update(marker.kwargs)
        try:
            plan = plan_test(settings, kwargs, gpus, item.nodeid)
            gate = config.stash[gate_key]
            if gate is not None:
                item.stash[policy_key] = regression.policy_for(gate.settings.policy, kwargs, item.nodeid)
        except SettingsError as e:
            raise pytest.UsageError(f"distperf: {e}") from None
        item.stash[plan_key] = plan
        if plan.skip_reason:
            item.add_marker(pytest.mark.skip(reason=plan.skip_reason))
        elif plan.known_gap:
            # Strict: when upstream fixes the gap the test XPASSes and fails, so the mark gets removed.
            # raises=: only the failed check is the expected failure; a crash still fails the test.
            item.add_marker(pytest.mark.xfail(strict=True, raises=DistPerfCheckFailed,
                                              reason=f"known upstream gap on {plan.device}: {plan.known_gap}"))


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
    progress = _progress_writer(config) if config.get_verbosity() > 0 else None
    gate = None
    gate_session = config.stash[gate_key]
    if gate_session is not None:
        policy = request.node.stash.get(policy_key, gate_session.settings.policy)
        problem = None
        try:  # the test's baseline file is read now: a bad one fails the test before any job starts
            gate = regression.BaselineGate(gate_session, request.node.nodeid, plan.device, plan.world_size, policy)
        except BaselineError as e:
            problem = str(e)
        if problem:
            pytest.fail(f"distperf baseline: {problem}", pytrace=False)
    dp = DistPerf(settings, plan, config.stash[cache_key], request.node.nodeid,
                  str(tmp_path_factory.getbasetemp()), progress, gate=gate)
    request.node.stash[fixture_key] = dp
    yield dp


def _progress_writer(config: pytest.Config) -> Any:
    """Live lines on the terminal during a test: output capture is suspended for each write
    (as pytest's live logging does), else the lines would land in the test's captured stdout."""
    tr = config.pluginmanager.get_plugin("terminalreporter")
    capman = config.pluginmanager.get_plugin("capturemanager")
    if tr is None:
        return None

    def write(text: str) -> None:
        ctx = capman.global_and_fixture_disabled() if capman else contextlib.nullcontext()
        with ctx:
            tr.write_line(f"    [distperf] {text}")

    return write


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    outcome = yield
    rep = outcome.get_result()
    dp = item.stash.get(fixture_key, None)
    if rep.when == "setup" and rep.failed and _is_distperf(item):
        rep.distperf_detail = {}  # failed before running (e.g. a bad baseline file): still in the reports
    if dp is not None and rep.when == "call" and dp.gate is not None:
        _land_baseline(rep, dp.gate.finish(test_passed=rep.passed))
    if dp is None or rep.when != "call" or not dp.records:
        return
    # user_properties travel with the report (xdist) and become JUnit <property> elements.
    rep.user_properties.append(("distperf", json.dumps(dp.records, sort_keys=True)))
    for r in dp.records:
        if r["kind"] == "check":
            prefix = f"distperf.{r['name']}"
            rep.user_properties += [(f"{prefix}.ratio", f"{r['ratio']:.4f}"), (f"{prefix}.threshold", r["threshold"]),
                                    (f"{prefix}.passed", r["passed"])]
    # The report holds a copy of item.user_properties, and junitxml writes <property> from the teardown report
    # (built from the item, like record_property does): put them on the item too.
    item.user_properties += [p for p in rep.user_properties if p not in item.user_properties]


def _land_baseline(rep: pytest.TestReport, landing: regression.Landing) -> None:
    """The baseline verdict lands on the test's own report; details travel with it (xdist) to the reports."""
    rep.distperf_detail = landing.detail
    rep.user_properties += landing.properties
    if landing.failed and landing.message:
        if rep.passed:
            rep.outcome, rep.longrepr = "failed", landing.message
        elif rep.failed:
            rep.sections.append(("distperf baseline", landing.message))


class ReportWriter:
    """Collects distperf test reports (also those xdist workers send) and writes the session's reports."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.entries: dict[str, reports.ReportEntry] = {}
        self.written: list[str] = []
        self.errors: list[str] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        detail = getattr(report, "distperf_detail", None)
        records = [r for k, v in report.user_properties if k == "distperf" for r in json.loads(v)]
        if detail is None and not records:
            return
        if report.when == "call" or (report.failed and report.nodeid not in self.entries):
            outcome = report.outcome if report.when == "call" else "error"
            self.entries[report.nodeid] = reports.ReportEntry(
                report.nodeid, outcome, report.duration, records, detail,
                str(report.longrepr) if report.failed else None)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        gate = self.config.stash.get(gate_key, None)
        try:
            self.written = reports.write_session_reports(
                list(self.entries.values()), str(self.config.rootpath), self.config.getoption("distperf_json"),
                self.config.getoption("distperf_benchmark_json"), os.environ.get("GITHUB_STEP_SUMMARY"),
                invocation={"args": list(self.config.invocation_params.args),
                            "baselines": gate.settings.baselines_dir if gate else None,
                            "save": bool(gate and gate.settings.save),
                            "require_baseline": bool(gate and gate.settings.policy.require_baseline),
                            "fail_on_improvement": bool(gate and gate.settings.policy.fail_on_improvement)},
                device=_session_device(session))
        except (BaselineError, OSError) as e:
            self.errors.append(str(e))
            session.exitstatus = pytest.ExitCode.INTERNAL_ERROR

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        for line in self.written:
            terminalreporter.write_line(f"distperf: wrote {line}")
        for line in self.errors:
            terminalreporter.write_line(f"distperf: could not write a report: {line}", red=True)


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
