"""pytest hooks and the `distperf` fixture. State lives in the session object (session.py), logic in the
modules it calls. Nothing heavy is imported here: without --distperf a session never loads torch."""

from __future__ import annotations

import contextlib
import os
from typing import TYPE_CHECKING, Any, Iterator

import pytest

from pytest_distperf.spec.settings import DEVICE_CHOICES, TestPlan, build_settings, plan_test
from pytest_distperf.errors import BaselineError, DistPerfCheckFailed, SettingsError
from pytest_distperf.launch.devices import visible_gpu_count
from pytest_distperf.session import DistPerfSession

if TYPE_CHECKING:
    from pytest_distperf.fixture import DistPerf
    from pytest_distperf.decide import regression
    from pytest_distperf.decide.policy import Policy

session_key = pytest.StashKey[DistPerfSession]()
plan_key = pytest.StashKey[TestPlan]()
fixture_key = pytest.StashKey["DistPerf"]()
policy_key = pytest.StashKey["Policy"]()
registry_session_key = pytest.StashKey[bool]()  # this config set the strategy registry aside (begin_session)

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
    "max_repeats": "adaptive repeats: interleaved pairs (or runs) a verdict may grow to while inconclusive (default 12)",
    "test_budget": "adaptive repeats: wall-clock seconds per test after which no further pair starts (default 600)",
    "session_budget": "wall-clock seconds per pytest process (each xdist worker) after which no job starts "
                      "(default: no limit; waits for the measurement slot not counted): bounds a CI gate's time; "
                      "a test whose first look cannot start is skipped, out of budget (fails with --distperf-strict), "
                      "undecided verdicts stay inconclusive",
    # where ranks run (docs/cluster.md)
    "launcher": "local|torchrun|slurm: ranks on this host, on N torchrun node agents, or in SLURM jobs",
    "nodes": "node agents per job (a test's distperf(nodes=N) wins); world size = ranks over all nodes",
    "rdzv_endpoint": "torchrun: HOST:PORT of the c10d rendezvous, reachable from every node (default 127.0.0.1)",
    "agents": "torchrun: how agents 1..N-1 start: local (this host), srun (the allocation's other nodes), "
              "or a command template with {command} (and {index}), e.g. 'ssh node{index} {command}'",
    "shared_dir": "job folders here: a folder every node mounts under the same path (rank results come back there)",
    "slurm_partition": "slurm: partition",
    "slurm_account": "slurm: account",
    "slurm_time_limit": "slurm: time limit in minutes (default: the job timeout + 3)",
    "slurm_gpus_per_node": "slurm: GPUs per node",
    "slurm_cpus_per_task": "slurm: CPUs per node agent (task)",
    "slurm_agents_per_node": "slurm: node agents (tasks) per SLURM node; >1 acts several nodes out on one host",
}
# Options that pick the machine class or the jobs: repeated in the "accept this change" command.
CLUSTER_OPTIONS = ("launcher", "nodes", "rdzv_endpoint", "agents", "shared_dir", "slurm_partition", "slurm_account",
                   "slurm_time_limit", "slurm_gpus_per_node", "slurm_cpus_per_task", "slurm_agents_per_node")
CARRIED_OPTIONS = {"--distperf-" + name.replace("_", "-"): "distperf_" + name
                   for name in ("device", "world_size", "repeats", "shape_cpu", "shape_cuda", *CLUSTER_OPTIONS)}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("distperf", "distributed-training performance tests")
    group.addoption("--distperf", action="store_true", help="run distperf performance tests (else they are skipped)")
    for name, text in SETTING_HELP.items():
        group.addoption("--distperf-" + name.replace("_", "-"), dest="distperf_" + name, default=None, help=text)
        parser.addini("distperf_" + name, text, default=None)
    group.addoption("--distperf-keep-jobs", action="store_true",
                    help="keep every job's folder (rank logs) instead of only those of failed jobs")
    group.addoption("--distperf-lock-gpu-clocks", dest="distperf_lock_gpu_clocks", nargs="?", const="default",
                    default=None, metavar="MHZ|external",
                    help="lock the GPUs' clocks for the session (NVML, needs root; at the default applications clock, "
                         "or =MHZ), unlocked when it ends; CUDA tests are skipped where that is refused. "
                         "=external: they are locked outside pytest (nothing is locked, no warning that they are not)")
    parser.addini("distperf_lock_gpu_clocks", "true, a clock in MHz, or external: as --distperf-lock-gpu-clocks",
                  default=None)
    group.addoption("--distperf-fresh-agent", action="store_true", default=None, dest="distperf_fresh_agent",
                    help="start a new launch agent (python, torch and the strategy libraries imported again) for "
                         "every job, instead of forking each job's agent from the session's warm agent")
    parser.addini("distperf_fresh_agent", "true: a new launch agent per job (as --distperf-fresh-agent)", default=None)
    group.addoption("--distperf-save", action="store_true",
                    help="record baselines for the distperf tests that ran and passed; other entries stay as they are")
    group.addoption("--distperf-baselines", dest="distperf_baselines", default=None, metavar="DIR",
                    help="baselines folder (default: baselines/ at the rootdir); write --distperf-baselines=DIR")
    parser.addini("distperf_baselines", "baselines folder, relative to the rootdir", default=None)
    group.addoption("--distperf-require-baseline", action="store_true",
                    help="fail tests with no baseline for this machine class ('new') or a changed config (for CI)")
    group.addoption("--distperf-fail-on-improvement", action="store_true",
                    help="fail when a metric improved beyond its threshold (keeps baselines fresh)")
    group.addoption("--distperf-strict", action="store_true", default=None, dest="distperf_strict",
                    help="an inconclusive verdict (its interval holds the limit after the repeats allowed) fails the "
                         "test instead of warning")
    parser.addini("distperf_strict", "true: an inconclusive verdict fails the test (as --distperf-strict)",
                  default=None)
    group.addoption("--distperf-json", dest="distperf_json", default=None, metavar="PATH",
                    help="write a JSON report: job configs, environment, per-rank metrics, checks, verdicts")
    group.addoption("--distperf-benchmark-json", dest="distperf_benchmark_json", default=None, metavar="PATH",
                    help="export step times in pytest-benchmark's JSON format (pytest-benchmark compare, "
                         "github-action-benchmark)")
    group.addoption("--distperf-html", dest="distperf_html", default=None, metavar="PATH",
                    help="write one self-contained HTML report with plots (no network needed to open it)")
    group.addoption("--distperf-pr-comment", dest="distperf_pr_comment", default=None, metavar="PATH",
                    help="write a pull-request comment: at most 25 lines of Markdown, every failing, inconclusive "
                         "or improved metric listed")
    group.addoption("--distperf-html-url", dest="distperf_html_url", default=None, metavar="URL",
                    help="where the HTML report will be, for the PR comment's link (default: $DISTPERF_HTML_URL)")
    group.addoption("--distperf-against", dest="distperf_against", default=None, metavar="REF",
                    help="head vs base: every job also runs on REF's code (a git worktree of the merge base of REF "
                         "and HEAD), interleaved in pairs, and each metric is decided on the pairs instead of "
                         "against stored baselines")
    parser.addini("distperf_against", "a git ref: as --distperf-against", default=None)
    group.addoption("--distperf-against-exact", action="store_true", dest="distperf_against_exact",
                    help="with --distperf-against: compare against REF itself, not its merge base with HEAD")
    group.addoption("--distperf-history", dest="distperf_history", default=None, metavar="URL",
                    help="append this session's results to a history database: a file, sqlite:///PATH or "
                         "postgresql://USER:PASSWORD@HOST:PORT/DB (`python -m pytest_distperf history URL` "
                         "prints the trends and their change points)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "distperf(world_size=N, nodes=N, device='auto|cpu|cuda', timeout=S, repeats=N, max_repeats=N, "
                   "test_budget=S, time_threshold=0.05, memory_threshold=0.02, memory_floor=BYTES, "
                   "baseline_metrics=(...), "
                   "probes=('comms', 'overlap', 'placement')): "
                   "a distributed performance test, run with --distperf")
    for name, text in TOPIC_MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")
    cli = {name: config.getoption("distperf_" + name) for name in SETTING_HELP}
    ini = {name: config.getini("distperf_" + name) for name in SETTING_HELP}
    cli["lock_gpu_clocks"] = config.getoption("distperf_lock_gpu_clocks")
    ini["lock_gpu_clocks"] = config.getini("distperf_lock_gpu_clocks")
    cli["strict"], ini["strict"] = config.getoption("distperf_strict"), config.getini("distperf_strict")
    cli["fresh_agent"] = config.getoption("distperf_fresh_agent")
    ini["fresh_agent"] = config.getini("distperf_fresh_agent")
    try:
        settings = build_settings(config.getoption("distperf"), cli, ini, config.getoption("distperf_keep_jobs"))
    except SettingsError as e:
        raise pytest.UsageError(f"distperf: {e}") from None
    if settings.enabled:
        _load_strategies()
    session = DistPerfSession(config, settings, _gate_session(config, settings.enabled, settings.strict))
    session.against = _base_checkout(config, settings.enabled)
    config.stash[session_key] = session
    config.pluginmanager.register(session, "distperf-session")


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config) -> None:
    """Before the rootdir's conftests are imported: a fresh registry of strategies for this session, so that a
    conftest's `register(...)` at import is kept (an earlier in-process session's registrations are set aside
    and come back at pytest_unconfigure). Only when the registry was imported already: nothing heavy here."""
    import sys

    strategies = sys.modules.get("pytest_distperf.strategies")
    if strategies is not None:
        strategies.REGISTRY.begin_session()
        early_config.stash[registry_session_key] = True


def pytest_unconfigure(config: pytest.Config) -> None:
    import sys

    strategies = sys.modules.get("pytest_distperf.strategies")
    session = config.stash.get(session_key, None)
    if session is not None and session.against is not None:
        session.against.remove()
    if strategies is not None and config.stash.get(registry_session_key, False):
        strategies.REGISTRY.end_session()
    elif strategies is not None:  # first imported during this session: nothing earlier to bring back
        strategies.REGISTRY.reset()


def _load_strategies() -> None:
    """The strategies libraries register (entry-point group pytest_distperf.strategies): a broken one stops the
    session here, naming it, before any test runs."""
    from pytest_distperf.errors import StrategyError
    from pytest_distperf.strategies import REGISTRY

    try:  # conftests imported before pytest_configure keep what they register (begin_session set the rest aside)
        REGISTRY.load_entry_points()
    except StrategyError as e:
        raise pytest.UsageError(f"distperf: {e}") from None


def _gate_session(config: pytest.Config, enabled: bool, strict: bool = False) -> "regression.GateSession | None":
    if config.getoption("distperf_save") and not enabled:
        raise pytest.UsageError("distperf: --distperf-save needs --distperf (it records what the tests measure)")
    _check_report_paths(config, enabled)
    if config.getoption("distperf_history") is not None:
        from pytest_distperf.store.history import HistoryError, check_url

        try:
            check_url(config.getoption("distperf_history"))  # its form, before any job; opened at the end
        except HistoryError as e:
            raise pytest.UsageError(f"distperf: {e}") from None
    if not enabled:
        return None
    from pytest_distperf.decide import policy, regression

    try:
        gs = policy.gate_settings(
            _project_root(config), config.getoption("distperf_baselines"), config.getini("distperf_baselines"),
            config.getoption("distperf_save"), config.getoption("distperf_require_baseline"),
            config.getoption("distperf_fail_on_improvement"),
            {flag: config.getoption(dest) for flag, dest in CARRIED_OPTIONS.items()}, strict,
            rootdir_fixed=config.inipath is not None or bool(config.getoption("rootdir", None)))
        gate = regression.GateSession(gs, str(config.rootpath))
        if gs.save and not hasattr(config, "workerinput"):
            gate.store.check_writable()  # before any job runs, not after an hour of them
    except (SettingsError, BaselineError) as e:
        raise pytest.UsageError(f"distperf: {e}") from None
    return gate


def _base_checkout(config: pytest.Config, enabled: bool) -> Any:
    """--distperf-against=REF: REF's code checked out beside HEAD's for the session (decide/against.py)."""
    ref = config.getoption("distperf_against") or config.getini("distperf_against")
    if not ref:
        if config.getoption("distperf_against_exact"):
            raise pytest.UsageError("distperf: --distperf-against-exact needs --distperf-against=REF")
        return None
    if not enabled:
        raise pytest.UsageError("distperf: --distperf-against needs --distperf (it compares what the tests measure)")
    if config.getoption("distperf_save"):
        raise pytest.UsageError("distperf: --distperf-against compares head with base in this session; "
                                "--distperf-save records stored baselines: give one of them")
    from pytest_distperf.decide import against

    try:
        return against.prepare(str(config.rootpath), ref, bool(config.getoption("distperf_against_exact")))
    except SettingsError as e:
        raise pytest.UsageError(f"distperf: {e}") from None


def _check_report_paths(config: pytest.Config, enabled: bool) -> None:
    """Every report file the session will write, checked before any job: what is in the way is named."""
    from pytest_distperf.store.outputs import REPORT_FILE_OPTIONS, OutputPathError, check_file

    targets = [(flag, config.getoption(dest, None)) for dest, flag in REPORT_FILE_OPTIONS.items()
               if enabled or dest.startswith("distperf_")]
    if enabled and os.environ.get("GITHUB_STEP_SUMMARY"):
        targets.append(("$GITHUB_STEP_SUMMARY", os.environ["GITHUB_STEP_SUMMARY"]))
    for flag, path in targets:
        if path is None:
            continue
        if path == "":
            raise pytest.UsageError(f"distperf: {flag}: expected a file path, got ''")
        try:
            check_file(path, flag)
        except OutputPathError as e:
            raise pytest.UsageError(f"distperf: {e}") from None


def _project_root(config: pytest.Config) -> str:
    """Where the default and ini-relative baselines folder start: the rootdir when an ini file (or --rootdir)
    fixed it; else the folder pytest was started in. Without an ini file pytest infers the rootdir from the
    arguments, and a path-like option value taken for a test path moves it (pytest-dev/pytest#8846)."""
    if config.inipath is not None or config.getoption("rootdir", None):
        return str(config.rootpath)
    return str(config.invocation_params.dir)


def _is_distperf(item: pytest.Item) -> bool:
    return item.get_closest_marker("distperf") is not None or "distperf" in getattr(item, "fixturenames", ())


def pytest_report_header(config: pytest.Config) -> list[str]:
    return config.stash[session_key].report_header()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    session = config.stash[session_key]
    settings = session.settings
    perf_items = [i for i in items if _is_distperf(i)]
    if not settings.enabled:
        skip = pytest.mark.skip(reason="distperf performance test: run with --distperf to enable")
        for item in perf_items:
            item.add_marker(skip)
        return
    gpus = visible_gpu_count() if perf_items else 0
    save_targets: set[str] = set()  # machine classes whose baselines --distperf-save will write
    for item in perf_items:
        kwargs: dict[str, Any] = {}
        for marker in reversed(list(item.iter_markers("distperf"))):  # module, class, then function: closest wins
            kwargs.update(marker.kwargs)
        try:
            plan = plan_test(settings, kwargs, gpus, item.nodeid)
            plan = session.with_clock_skip(plan)  # locked clocks asked for and refused (launch/gpuclocks.py)
            if session.gate is not None:
                from pytest_distperf.decide import policy

                item.stash[policy_key] = policy.policy_for(session.gate.settings.policy, kwargs, item.nodeid)
        except SettingsError as e:
            raise pytest.UsageError(f"distperf: {e}") from None
        item.stash[plan_key] = plan
        session.plans.append(plan)
        if plan.device is not None and session.gate is not None and session.gate.settings.save:
            from pytest_distperf.launch.base import make_launcher

            save_targets.add(session.gate.machine(plan.device, plan.world_size, plan.nodes,
                                                  make_launcher(settings.cluster, plan.nodes).inter_node()).name)
        if plan.skip_reason:
            item.add_marker(pytest.mark.skip(reason=plan.skip_reason))
        elif plan.known_gap:
            # Strict: when upstream fixes the gap the test XPASSes and fails, so the mark gets removed.
            # raises=: only the failed check is the expected failure; a crash still fails the test.
            item.add_marker(pytest.mark.xfail(strict=True, raises=DistPerfCheckFailed,
                                              reason=f"known upstream gap on {plan.device}: {plan.known_gap}"))
    if save_targets:
        try:  # every folder --distperf-save will write, before the first job (not after an hour of them)
            session.gate.store.check_writable(save_targets)  # type: ignore[union-attr]
        except BaselineError as e:
            raise pytest.UsageError(f"distperf: {e}") from None


def _tests_left(request: pytest.FixtureRequest) -> int:
    """This test and the later ones of this process that may run adaptive pairs (distperf tests their plan does not
    skip), in run order: what the session budget is shared between (session.pairs_share). Each pytest-xdist worker
    has its own budget and deadline but the whole collection in `session.items`, of which it runs about one in
    `workercount` (the schedulers deal the tests out as workers free up, so which ones is not known in advance):
    the later tests are divided between the workers."""
    items = request.session.items
    if request.node not in items:
        return 1
    later = items[items.index(request.node) + 1:]
    count = sum(1 for i in later if _is_distperf(i) and getattr(i.stash.get(plan_key, None), "device", "") is not None)
    workers = max(1, int(getattr(request.config, "workerinput", {}).get("workercount", 1)))
    return 1 + -(-count // workers)  # this test, and its worker's share of the later ones (rounded up)


@pytest.fixture
def distperf(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator["DistPerf"]:
    """Run strategies or your own function on N ranks started by torch's elastic launcher."""
    config = request.config
    session = config.stash[session_key]
    if not session.settings.enabled:
        pytest.skip("distperf performance test: run with --distperf to enable")
    from pytest_distperf.fixture import DistPerf

    plan = request.node.stash.get(plan_key, None)
    if plan is None:
        plan = plan_test(session.settings, {}, visible_gpu_count(), request.node.nodeid)
    progress = _progress_writer(config) if config.get_verbosity() > 0 else None
    gate = None
    if session.gate is not None:
        from pytest_distperf.decide import regression

        policy = request.node.stash.get(policy_key, session.gate.settings.policy)
        problem = None
        try:  # the test's baseline file is read now: a bad one fails the test before any job starts
            from pytest_distperf.launch.base import make_launcher

            inter_node = make_launcher(session.settings.cluster, plan.nodes).inter_node()
            if session.against is not None:  # head vs base in the stored baselines' place (decide/against.py)
                from pytest_distperf.decide.against import AgainstGate

                gate = AgainstGate(session.against, request.node.nodeid, policy,
                                   session.gate.machine(plan.device, plan.world_size, plan.nodes, inter_node),
                                   session.gate.environment(plan.device), test_file=str(request.node.path))
            else:
                gate = regression.BaselineGate(
                    session.gate, request.node.nodeid, plan.device, plan.world_size, policy, nodes=plan.nodes,
                    inter_node=inter_node, test_file=str(request.node.path))
        except BaselineError as e:
            problem = str(e)
        if problem:
            pytest.fail(f"distperf baseline: {problem}", pytrace=False)
    dp = DistPerf(session.settings, plan, session.cache, request.node.nodeid,
                  str(tmp_path_factory.getbasetemp()), progress, gate=gate, deadline=session.deadline,
                  pairs_share=session.pairs_share(_tests_left(request)), check_budget=session.check_budget)
    request.node.stash[fixture_key] = dp
    dp.notice = _progress_writer(config)  # said also without -v: a one-time DeepSpeed op build (strategies/ds_ops.py)
    yield dp
    session.test_seconds.append(dp.clock.elapsed())  # what later tests' shares reserve for each (pairs_share)


def _progress_writer(config: pytest.Config) -> Any:
    """Live lines on the terminal during a test: output capture is suspended for each write
    (as pytest's live logging does), else the lines would land in the test's captured stdout."""
    from pytest_distperf.store.redact import redact_text

    tr = config.pluginmanager.get_plugin("terminalreporter")
    capman = config.pluginmanager.get_plugin("capturemanager")
    if tr is None:
        return None

    def write(text: str) -> None:
        ctx = capman.global_and_fixture_disabled() if capman else contextlib.nullcontext()
        with ctx:
            tr.write_line(f"    [distperf] {redact_text(text)}")  # the one redaction (redact.py)

    return write


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    outcome = yield
    rep = outcome.get_result()
    dp = item.stash.get(fixture_key, None)
    if rep.when == "setup" and rep.failed and _is_distperf(item):
        rep.distperf_context = {}  # failed before running (e.g. a bad baseline file): still in the reports
    if dp is not None and dp.out_of_budget and rep.when in ("setup", "call") and not rep.passed:
        rep.distperf_out_of_budget = dp.out_of_budget  # the session budget stopped it (fixture._within_budget),
        # in the test or in a fixture of its (a shared probe run in setup)
    if dp is None or rep.when != "call":
        return
    records = dp.test_records()  # its jobs as they ended, checks, probes
    if dp.gate is not None:
        landing = dp.gate.finish(test_passed=rep.passed)  # decided on all the runs the test's jobs ended with
        records += landing.records
        _land_baseline(rep, landing)
    if not records:
        return
    from pytest_distperf.decide.checks import Check
    from pytest_distperf.report.document import JobRecord

    # An attribute of the report travels with it to the xdist controller (as JSON); it is not a JUnit property.
    rep.distperf_records = [r.to_json() for r in records]
    for r in records:
        if isinstance(r, Check):
            prefix = f"distperf.{r.name}"
            rep.user_properties += [(f"{prefix}.ratio", f"{r.ratio:.4f}"), (f"{prefix}.threshold", r.threshold),
                                    (f"{prefix}.passed", r.passed), (f"{prefix}.outcome", r.outcome)]
        elif isinstance(r, JobRecord):  # the job's figures (measure/figures.py), as every report shows them
            f = r.figures
            rep.user_properties += [(f"distperf.step_time[{f.label}]", f"{f.step_time:.6g}"),
                                    (f"distperf.peak_memory[{f.label}]", f"{f.peak_memory:.0f}")]
            if "train_memory" in f.work:  # the memory figure a CPU job is decided on (measure/figures.py)
                rep.user_properties.append((f"distperf.train_memory[{f.label}]", f"{f.work['train_memory']:.0f}"))
    # The report holds a copy of item.user_properties, and junitxml writes <property> from the teardown report
    # (built from the item, like record_property does): put them on the item too.
    item.user_properties += [p for p in rep.user_properties if p not in item.user_properties]


def _land_baseline(rep: pytest.TestReport, landing: "regression.Landing") -> None:
    """The baseline verdict lands on the test's own report; its context travels with it (xdist) to the reports."""
    rep.distperf_context = landing.context.to_json() if landing.context else {}
    rep.user_properties += landing.properties
    if landing.failed and landing.message:
        if rep.passed:
            rep.outcome, rep.longrepr = "failed", landing.message
        elif rep.failed:
            rep.sections.append(("distperf baseline", landing.message))
