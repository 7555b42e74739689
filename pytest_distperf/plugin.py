"""pytest hooks and the `distperf` fixture. State lives in the session object (session.py), logic in the
modules it calls. Nothing heavy is imported here: without --distperf a session never loads torch."""

from __future__ import annotations

import contextlib
import os
import warnings
from typing import TYPE_CHECKING, Any, Iterator, Sequence

import pytest

from pytest_distperf.spec.settings import CARRIED_OPTIONS, Settings, TestPlan, build_settings, declared, plan_test
from pytest_distperf.errors import BaselineError, DistPerfCheckFailed, DistPerfWarning, SettingsError
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


def pytest_addoption(parser: pytest.Parser) -> None:
    """Each declared setting (spec/settings.py) as its option and ini key."""
    group = parser.getgroup("distperf", "distributed-training performance tests")
    for s in declared():
        if s.option and s.type == "bool":
            group.addoption(s.flag, action="store_true", default=None, dest=s.dest, help=s.help)
        elif s.option:
            group.addoption(s.flag, dest=s.dest, default=None, metavar=s.metavar, help=s.help,
                            **(dict(nargs="?", const=s.const) if s.const is not None else {}))
        if s.ini:
            parser.addini(s.dest, s.help, default=None)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "distperf(world_size=N, nodes=N, device='auto|cpu|cuda', timeout=S, repeats=N, max_repeats=N, "
                   "test_budget=S, time_threshold=0.05, memory_threshold=0.02, memory_floor=BYTES, "
                   "baseline_metrics=(...), "
                   "probes=('comms', 'overlap', 'placement')): "
                   "a distributed performance test, run with --distperf")
    cli = {s.name: config.getoption(s.dest) for s in declared() if s.option}
    ini = {s.name: config.getini(s.dest) for s in declared() if s.ini}
    enabled = bool(cli.pop("enabled"))
    try:
        settings = build_settings(enabled, cli, ini, _known_shapes() if enabled else ())
    except SettingsError as e:
        raise pytest.UsageError(f"distperf: {e}") from None
    if settings.enabled:
        _load_strategies()
    session = DistPerfSession(config, settings, _gate_session(config, settings))
    session.against = _base_checkout(config, settings)
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
    if strategies is not None and config.stash.get(registry_session_key, False):
        strategies.REGISTRY.end_session()
    elif strategies is not None:  # first imported during this session: nothing earlier to bring back
        strategies.REGISTRY.reset()


def _known_shapes() -> tuple[str, ...]:
    """The built-in workload's shape names (imports torch: only for a session with --distperf)."""
    from pytest_distperf.rank.workload import SHAPES

    return tuple(SHAPES)


def _load_strategies() -> None:
    """The strategies libraries register (entry-point group pytest_distperf.strategies): a broken one stops the
    session here, naming it, before any test runs."""
    from pytest_distperf.errors import StrategyError
    from pytest_distperf.strategies import REGISTRY

    try:  # conftests imported before pytest_configure keep what they register (begin_session set the rest aside)
        REGISTRY.load_entry_points()
    except StrategyError as e:
        raise pytest.UsageError(f"distperf: {e}") from None


def _gate_session(config: pytest.Config, settings: Settings) -> "regression.GateSession | None":
    if settings.save and not settings.enabled:
        raise pytest.UsageError("distperf: --distperf-save needs --distperf (it records what the tests measure)")
    reports = _check_report_paths(config, settings.enabled)
    history = _check_history(config)
    from pytest_distperf.decide import policy

    try:
        gs = policy.gate_settings(
            _project_root(config), config.getoption("distperf_baselines"), config.getini("distperf_baselines"),
            settings.save, settings.require_baseline, settings.fail_on_improvement,
            {flag: config.getoption(dest) for flag, dest in CARRIED_OPTIONS.items()}, settings.strict,
            rootdir_fixed=config.inipath is not None or bool(config.getoption("rootdir", None)),
            explain=settings.explain)
    except SettingsError as e:
        if settings.enabled:
            raise pytest.UsageError(f"distperf: {e}") from None
        gs = None  # without --distperf no baseline is read: a folder that cannot be one is no error
    where = ("--distperf-baselines" if config.getoption("distperf_baselines") else
             "ini option distperf_baselines" if config.getini("distperf_baselines") else
             "the default; --distperf-baselines moves it")
    # The reports are written with or without --distperf: none may land in the baselines folder either way.
    _check_apart(reports, (where, gs.baselines_dir) if gs else None, history)
    if not settings.enabled or gs is None:
        return None
    from pytest_distperf.decide import regression

    try:
        gate = regression.GateSession(gs, str(config.rootpath))
        if gs.save and not hasattr(config, "workerinput"):
            gate.store.check_writable()  # before any job runs, not after an hour of them
    except (SettingsError, BaselineError) as e:
        raise pytest.UsageError(f"distperf: {e}") from None
    return gate


def _check_history(config: pytest.Config) -> "tuple[str, str] | None":
    """--distperf-history's database opened and checked before any job: the session appends to it at its end,
    where a bad one would lose the session's record. Returns (option, file) for a SQLite file, else None."""
    url = config.getoption("distperf_history")
    if url is None:
        return None
    from pytest_distperf.store.history import HistoryError, check_target, check_url, database_file

    try:
        if hasattr(config, "workerinput"):
            check_url(url)  # an xdist worker: its form only; the controller, which records it, opens it
        else:
            check_target(url)  # opened and closed; opened again at the end
        path = database_file(url)
    except HistoryError as e:
        raise pytest.UsageError(f"distperf: {e}") from None
    return ("--distperf-history", path) if path else None


def _base_checkout(config: pytest.Config, settings: Settings) -> Any:
    """--distperf-against=REF: REF's code checked out beside HEAD's for the session (decide/against.py)."""
    ref = settings.against
    if not ref:
        if settings.against_exact:
            raise pytest.UsageError("distperf: --distperf-against-exact needs --distperf-against=REF")
        return None
    if not settings.enabled:
        raise pytest.UsageError("distperf: --distperf-against needs --distperf (it compares what the tests measure)")
    if settings.save:
        raise pytest.UsageError("distperf: --distperf-against compares head with base in this session; "
                                "--distperf-save records stored baselines: give one of them")
    from pytest_distperf.decide import against

    try:
        return against.prepare(str(config.rootpath), ref, settings.against_exact)
    except SettingsError as e:
        raise pytest.UsageError(f"distperf: {e}") from None


def _check_report_paths(config: pytest.Config, enabled: bool) -> list[tuple[str, str]]:
    """Every report file the session will write, checked before any job: what is in the way is named.
    Returns them as (option, path), for _check_apart."""
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
    return [(flag, path) for flag, path in targets if path]


def _check_apart(reports: list[tuple[str, str]], baselines: "tuple[str, str] | None",
                 history: "tuple[str, str] | None") -> None:
    """No report over another, inside the baselines folder or over the history database (outputs.check_apart)."""
    from pytest_distperf.store.outputs import OutputPathError, check_apart

    try:
        check_apart(reports, baselines, history)
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


def pytest_report_collectionfinish(config: pytest.Config, items: Sequence[pytest.Item]) -> list[str]:
    """The world sizes, devices and machine classes of the selected tests (the header, before collection, gives
    the defaults)."""
    from pytest_distperf.report.header import collection_lines

    plans = [item.stash[plan_key] for item in items if plan_key in item.stash]
    return collection_lines(config.stash[session_key].settings, plans)


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
            if marker.args:
                raise pytest.UsageError(f"distperf: {item.nodeid}: @pytest.mark.distperf{marker.args!r} takes keyword "
                                        f"arguments only, e.g. distperf(world_size=4)")
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
            # Strict: when upstream fixes the gap the test XPASSes and fails, so the mark gets removed (unless the
            # marker says the gap comes and goes with the machine's load). raises=: only the failed check is the
            # expected failure; a crash still fails the test.
            item.add_marker(pytest.mark.xfail(strict=plan.known_gap_strict, raises=DistPerfCheckFailed,
                                              reason=f"known upstream gap on {plan.device}: {plan.known_gap}"))
    if save_targets:
        try:  # every folder --distperf-save will write, before the first job (not after an hour of them)
            session.gate.store.check_writable(save_targets)  # type: ignore[union-attr]
        except BaselineError as e:
            raise pytest.UsageError(f"distperf: {e}") from None


def _tests_left(request: pytest.FixtureRequest) -> int:
    """This test and the later distperf tests of this process its plan does not skip: what the session budget is
    shared between (session.pairs_share). An xdist worker sees the whole collection but runs about one test in
    `workercount` (which ones is not known in advance): the later tests are divided between the workers."""
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
    gate, bad_baseline = None, None
    if session.gate is not None:
        policy = request.node.stash.get(policy_key, session.gate.settings.policy)
        try:  # the test's baseline file is read now: a bad one fails the test before any job starts
            with _warnings_at_the_test(request.node):
                gate = session.gate_for(request.node.nodeid, str(request.node.path), plan, policy)
        except BaselineError as e:
            bad_baseline = str(e)
    if bad_baseline is not None:  # failed outside the except: else pytest prints the message twice, chained
        pytest.fail(f"distperf baseline: {bad_baseline}", pytrace=False)
    dp = DistPerf(session.settings, plan, session.ledger, request.node.nodeid,
                  str(tmp_path_factory.getbasetemp()), say=_terminal_writer(config), verbose=config.get_verbosity() > 0,
                  gate=gate, deadline=session.deadline, pairs_share=session.pairs_share(_tests_left(request)),
                  check_budget=session.check_budget, root=_project_root(config))
    request.node.stash[fixture_key] = dp
    yield dp
    session.test_seconds.append(dp.clock.elapsed())  # what later tests' shares reserve for each (pairs_share)


def _terminal_writer(config: pytest.Config) -> Any:
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


@contextlib.contextmanager
def _warnings_at_the_test(item: pytest.Item) -> Iterator[None]:
    """The gate reads its baseline before the test's body and decides after it: its warnings (other library
    versions, an undecided verdict, a noisy baseline) are the test's, so they point at the test's line, not at the
    fixture or hook that raised them (errors.warn does this for the warnings of the test's body). Another
    library's warning raised meanwhile keeps its own place."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    path, line, _ = item.location
    for w in caught:
        ours = issubclass(w.category, DistPerfWarning)
        warnings.warn_explicit(w.message, w.category, str(item.config.rootpath / path) if ours else w.filename,
                               (line or 0) + 1 if ours else w.lineno)


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
    if dp.gate is not None:  # the baseline verdict, decided on all the runs the test's jobs ended with, lands on
        with _warnings_at_the_test(item):  # the test's report; its context travels with it (xdist)
            landing = dp.gate.finish(test_passed=rep.passed)
        records += landing.records
        rep.distperf_context = landing.context.to_json() if landing.context else {}
        rep.user_properties += landing.properties
        if landing.failed and landing.message and rep.passed:
            rep.outcome, rep.longrepr = "failed", landing.message
        elif landing.failed and landing.message and rep.failed:
            rep.sections.append(("distperf baseline", landing.message))
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
        elif isinstance(r, JobRecord):  # the job's figures (figures/quantities.py), as every report shows them
            f = r.figures
            rep.user_properties += [(f"distperf.step_time[{f.label}]", f"{f.step_time:.6g}"),
                                    (f"distperf.peak_memory[{f.label}]", f"{f.peak_memory:.0f}")]
            if "train_memory" in f.work:  # the memory figure a CPU job is decided on (figures/quantities.py)
                rep.user_properties.append((f"distperf.train_memory[{f.label}]", f"{f.work['train_memory']:.0f}"))
    # The report holds a copy of item.user_properties, and junitxml writes <property> from the teardown report
    # (built from the item, like record_property does): put them on the item too.
    item.user_properties += [p for p in rep.user_properties if p not in item.user_properties]

