"""The session plugin object: what one pytest session of distperf owns.

One `DistPerfSession` is registered per pytest process (as pytest-xdist registers its `DSession`). It holds the
resolved settings, what its tests share (`SessionLedger`), the baseline gate, and what the reports need
(the records each test's report carries, also those xdist workers send), and it writes the session's reports.
Nothing heavy is imported at module import: torch loads only when a distperf test runs.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Callable

import pytest

from pytest_distperf.spec.settings import Settings, TestPlan

if TYPE_CHECKING:
    from pytest_distperf.decide.policy import Policy
    from pytest_distperf.decide.regression import Gate, GateSession
    from pytest_distperf.launch.gpuclocks import SessionClocks
    from pytest_distperf.report.document import TestDocument
    from pytest_distperf.rank.results import RunResult


@dataclass(frozen=True)
class StatTally:
    """One entry of a stats-line category of the plugin's own ('undecided', 'out of budget'): pytest counts it,
    --durations (which lists every entry with a duration) does not."""
    nodeid: str
    count_towards_summary: bool = True


@dataclass
class SessionLedger:
    """What the session's tests share: runs (shared comparisons and probe runs), failed jobs, what runs took, and
    the time spent waiting for a measurement slot (off the budgets' clock). What one run of a job suffices for
    (JobSpec.measure_once) is not shared: each test measures it in its own runs (fixture._run_once), as its figures
    and gate read those only."""

    # (A's config hash, B's) -> both sides' runs (lists that adaptive repeats extend) and the test that began them
    comparisons: dict[tuple[str, str], tuple[list["RunResult"], list["RunResult"], str]] = field(
        default_factory=dict)
    probe_runs: dict[str, "RunResult | BaseException"] = field(default_factory=dict)  # config hash -> run or skip
    # config hash -> (test that ran it, its error): not launched again for the next test that shares it
    failed_jobs: dict[str, tuple[str, str]] = field(default_factory=dict)
    slot_wait_seconds: float = 0.0  # waits for a measurement slot another process's job held: not our time
    # a job's label -> its latest run's seconds on the budget clock, op builds left out: what a first look of the
    # job is expected to take (fixture._first_look_fits)
    run_seconds: dict[str, float] = field(default_factory=dict)

    def budget_now(self) -> float:
        """The test's and the session's budget clock: monotonic time less the slot waits."""
        return time.monotonic() - self.slot_wait_seconds


def failure_text(report: pytest.TestReport, max_lines: int = 3, max_chars: int = 600) -> str:
    """What a failed test's reports show as its reason: the exception's message (pytest's reprcrash: the
    'E ...' line, e.g. 'StrategyError: unknown strategy ...'), its first lines; else the failure text's first
    non-empty lines (a baseline gate failure is a plain message)."""
    crash = getattr(report.longrepr, "reprcrash", None)
    text = getattr(crash, "message", None) or str(report.longrepr or "")
    lines = [line.rstrip() for line in text.strip().splitlines() if line.strip()][:max_lines]
    return "\n".join(lines)[:max_chars]


class DistPerfSession:
    """Settings, shared runs, the baseline gate and the report collectors of one pytest process."""

    def __init__(self, config: pytest.Config, settings: Settings, gate: "GateSession | None") -> None:
        self.config = config
        self.settings = settings
        self.ledger = SessionLedger()
        self.gate = gate
        self.is_controller = not hasattr(config, "workerinput")  # xdist workers send their reports here
        self.summary: list["TestDocument"] = []  # the tests whose calls carried records, for the terminal
        self.entries: dict[str, "TestDocument"] = {}  # every distperf test's document, for the session's reports
        self.written: list[str] = []
        self.write_errors: list[str] = []
        self.plans: list[TestPlan] = []
        self.gpu_clocks: "SessionClocks | None" = None  # set at session start (launch/gpuclocks.py)
        # --distperf-session-budget, on the budget clock from here: no job or op build starts after it (check_budget)
        self.deadline = (self.ledger.budget_now() + settings.session_budget) if settings.session_budget else None
        self.test_seconds: list[float] = []  # each finished distperf test's own time (its clock: waits left out)
        self.against: Any = None  # --distperf-against: REF's checkout (decide/against.BaseCheckout)

    def check_budget(self, what: str) -> None:
        """Before a job or a DeepSpeed op build starts: SessionBudgetSpent, naming the budget and `what`, once the
        session's deadline has passed (on the budget's clock: waits for the measurement slot left out)."""
        now = self.ledger.budget_now()
        if self.deadline is not None and now >= self.deadline:
            from pytest_distperf.errors import SessionBudgetSpent

            budget = self.settings.session_budget
            raise SessionBudgetSpent(f"session budget {budget:g} s spent ({now - self.deadline + budget:.0f} s "
                                     f"run, waits for the measurement slot left out): {what} not started")

    def pairs_share(self, tests_left: int) -> tuple[Callable[[float, float], float], str] | None:
        """A starting test's share of --distperf-session-budget for its third and later looks (stopping.session_share):
        the time left but a reserve for each later test, the median of what tests' looks have taken (so a cheap test
        does not starve, and an expensive first test does not spend later tests' looks). (share, how a stop names
        it); None without a session budget."""
        if self.deadline is None:
            return None
        from pytest_distperf.decide.stopping import session_share

        deadline, tests_left, finished = self.deadline, max(1, tests_left), list(self.test_seconds)
        later = tests_left - 1

        def share(now: float, elapsed: float) -> float:  # on the test's clock, as its deadline is compared
            return session_share(now, deadline, tests_left, statistics.median(finished + [elapsed]))

        return share, (f"its share of the session budget for a third look ({later} later test"
                       f"{'s' if later != 1 else ''} each held what a test's looks have taken so far)")

    def gate_for(self, nodeid: str, test_file: str, plan: TestPlan, policy: "Policy") -> "Gate":
        """The one place a test's gate is chosen: head vs base with --distperf-against, else its stored baseline
        (read now: BaselineError for a bad file fails the test before any job starts)."""
        from pytest_distperf.decide.regression import BaselineGate
        from pytest_distperf.launch.base import make_launcher

        assert self.gate is not None and plan.device is not None, "a gate needs --distperf and a planned device"
        inter_node = make_launcher(self.settings.cluster, plan.nodes).inter_node()
        if self.against is None:
            return BaselineGate(self.gate, nodeid, plan.device, plan.world_size, policy, nodes=plan.nodes,
                                inter_node=inter_node, test_file=test_file)
        from pytest_distperf.decide.against import AgainstGate

        return AgainstGate(self.against, nodeid, policy,
                           self.gate.machine(plan.device, plan.world_size, plan.nodes, inter_node),
                           self.gate.environment(plan.device), test_file=test_file)

    # -- what the session prints first ---------------------------------------------------------------------
    def pytest_report_header(self, config: pytest.Config) -> list[str]:
        from pytest_distperf.store.redact import redact_text
        from pytest_distperf.report.header import header_lines

        against = [f"distperf: {self.against.label()}: every job runs in interleaved head/base pairs, decided on "
                   f"the pairs (no stored baselines)"] if self.against else []
        if self.against and self.against.problem:
            against.append(f"distperf: head vs base cannot compare: {self.against.problem}")
        return [redact_text(line) for line in header_lines(self.settings, self.gate, self.plans) + against + (
            self.gpu_clocks.header_lines() if self.gpu_clocks else [])]  # e.g. an agents template, a URL

    # -- GPU clocks: locked for the session where asked, always unlocked (launch/gpuclocks.py) -------------
    @pytest.hookimpl(tryfirst=True)  # before pytest-xdist starts its workers: they inherit the lock state's path
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        if not self.settings.enabled or self.settings.device == "cpu":
            return
        from pytest_distperf.errors import SettingsError, UnsafeFolderError
        from pytest_distperf.launch.allocator import lock_dir
        from pytest_distperf.launch.devices import visible_gpu_ids
        from pytest_distperf.launch.gpuclocks import SessionClocks

        try:  # an unsafe lock folder (another user's, group-writable) is a usage error naming it
            self.gpu_clocks = SessionClocks(self.settings.lock_gpu_clocks, lock_dir(), controller=self.is_controller)
            self.gpu_clocks.start(visible_gpu_ids())
        except (SettingsError, UnsafeFolderError) as e:
            raise pytest.UsageError(f"distperf: {e}") from None

    def with_clock_skip(self, plan: TestPlan) -> TestPlan:
        """A CUDA test skips when locked clocks were asked for and refused (the reason says why)."""
        reason = self.gpu_clocks.skip_reason() if self.gpu_clocks and plan.device == "cuda" else None
        return replace(plan, device=None, skip_reason=reason) if reason else plan

    # -- collecting what tests report (also from xdist workers) --------------------------------------------
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """The test's document (report/document.py), made once from the records its report carried."""
        records: list[dict[str, Any]] = getattr(report, "distperf_records", None) or []
        context = getattr(report, "distperf_context", None)  # decide/regression.GateContext's JSON; {}: none
        late = getattr(report, "distperf_out_of_budget", None)  # SessionBudgetSpent's words (plugin.py)
        if not self.is_controller or (context is None and not records and not late):
            return
        if not (report.when == "call" or late or (report.failed and report.nodeid not in self.entries)):
            return
        from pytest_distperf.decide.regression import GateContext
        from pytest_distperf.report.document import TestDocument

        # a setup that failed is pytest's error; one the session budget skipped (a fixture's job) a skip
        outcome = report.outcome if report.when == "call" else "skipped" if report.skipped else "error"
        doc = TestDocument.from_records(
            report.nodeid, outcome, report.duration, records, GateContext.from_json(context or {}),
            str(report.longrepr) if report.failed else None,
            # the reason, not only the traceback's last line ('.../userjobs.py:33: StrategyError')
            failure=failure_text(report) if report.failed else None,
            xfail_reason=getattr(report, "wasxfail", None),  # else an xfail reads as a skip (or a pass)
            out_of_budget=late)
        self.entries[report.nodeid] = doc
        if report.when == "call" and records:
            from pytest_distperf.report.undecided import undecided

            self.summary.append(doc)
            if undecided([doc]):  # '4 passed, 1 undecided' in yellow; the outcome and exit status stay
                self._add_stat("undecided", report)
        if late:
            from pytest_distperf.report.out_of_budget import STAT

            self._add_stat(STAT, report)  # '2 skipped, 2 out of budget': never read as a pass

    # -- the end of the session ----------------------------------------------------------------------------
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if not self.is_controller:
            return
        from pytest_distperf.errors import BaselineError
        from pytest_distperf.store.history.errors import HistoryError
        from pytest_distperf.store.redact import redact_args, redact_text
        from pytest_distperf.report import files

        gate, opt = self.gate, self.config.getoption
        try:
            self.written = files.write_session_reports(
                list(self.entries.values()), str(self.config.rootpath), opt("distperf_json"),
                opt("distperf_benchmark_json"), os.environ.get("GITHUB_STEP_SUMMARY"),
                invocation={"args": redact_args(self.config.invocation_params.args),  # no password in a report
                            "baselines": gate.settings.baselines_dir if gate else None,
                            "save": bool(gate and gate.settings.save),
                            "require_baseline": bool(gate and gate.settings.policy.require_baseline),
                            "fail_on_improvement": bool(gate and gate.settings.policy.fail_on_improvement),
                            "gpu_clocks": self.gpu_clocks.record() if self.gpu_clocks else None,
                            "against": self.against.to_json() if self.against else None},
                device="cuda" if any(p.device == "cuda" for p in self.plans) else "cpu",  # the environment's
                html_path=opt("distperf_html"), pr_comment_path=opt("distperf_pr_comment"),
                html_url=opt("distperf_html_url"), history_url=self.config.getoption("distperf_history", None),
                enabled=self.settings.enabled)
        except (BaselineError, HistoryError, OSError) as e:
            # The paths were checked before the first job; what fails now fails the run, never as an internal error.
            self.write_errors.append(redact_text(str(e)))
            if session.exitstatus == pytest.ExitCode.OK:
                session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def _add_stat(self, key: str, report: pytest.TestReport) -> None:
        """One more `key` in pytest's stats line ('4 passed, 1 undecided'). The test's report is already counted
        by its outcome: a tally, not the report, goes under `key`, else --durations lists the test twice."""
        tr = self.config.pluginmanager.get_plugin("terminalreporter")
        if tr is None:
            return
        tally = [StatTally(report.nodeid)]
        add = getattr(tr, "_add_stats", None)  # also resets pytest's colour of the stats line
        if add is not None:
            add(key, tally)
        else:
            tr.stats.setdefault(key, []).extend(tally)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        from pytest_distperf.report import out_of_budget

        late = out_of_budget.summary_lines(self.entries.values(), self.settings.strict)
        if self.summary or late:
            from pytest_distperf.report import terminal
            from pytest_distperf.report.undecided import summary_lines

            terminalreporter.write_sep("=", "distperf")
            for line in terminal.render(self.summary):
                terminalreporter.write_line(line)
            for lines in (summary_lines(self.summary, self.settings.strict), late):
                for i, line in enumerate(lines):
                    terminalreporter.write_line(("" if i else "\n") + line, yellow=True, bold=not i)
        from pytest_distperf.launch import warm_pool  # import-light (no torch): the launcher's own module object

        agents = warm_pool.describe()
        if agents:
            terminalreporter.write_line(f"distperf: agent: {agents}")
        for line in self.written:
            terminalreporter.write_line(f"distperf: wrote {line}")
        for line in self.write_errors:
            terminalreporter.write_line(f"distperf: could not write a report: {line}", red=True)

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        from pytest_distperf.launch import warm_pool

        warm_pool.stop_all()  # the session's warm agents end with it
        if self.against is not None:
            self.against.remove()
        if self.gpu_clocks is not None:
            self.gpu_clocks.restore()
