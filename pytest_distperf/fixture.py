"""What a test holds as the `distperf` fixture: build jobs, run them, compare two strategies.

Two ways in:
- `distperf.run("fsdp2")` / `distperf.compare(distperf.job("deepspeed", stage=3), distperf.job("fsdp2"))`:
  named strategies on the built-in workload;
- `distperf.job("fsdp2", workload="pkg.mod:make_workload")`: a named strategy on the user's own model
  (pytest_distperf.spec.workloads); `distperf.measure(distperf.step_job(make_step))`:
  the user's own training step, measured like a strategy (rank/userstep.py);
- `distperf.run_function(fn, *args)`: the user's module-level function in every rank
  (process group initialised, device set); returns the per-rank values.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import os
import sys
import time
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

from pytest_distperf import strategies
from pytest_distperf.strategies import ds_ops
from pytest_distperf.spec import userjobs
from pytest_distperf.spec.profiles import PROFILES

from pytest_distperf.rank import hostload
from pytest_distperf.rank.clocks import ClockWarnings
from pytest_distperf.decide.checks import Adaptive, Check, Comparison
from pytest_distperf.launch import warm_pool
from pytest_distperf.launch.base import make_launcher
from pytest_distperf.launch.launcher import JobError
from pytest_distperf.spec.settings import Settings, TestPlan
from pytest_distperf.errors import DistPerfInconclusive, GpuClockWarning, SessionBudgetSpent, UsageError, warn
from pytest_distperf.rank.probes.results import probe_summary
from pytest_distperf.spec.job import JobSpec, LabelScope
from pytest_distperf.rank.results import RunResult
from pytest_distperf.decide.stopping import Budget, Clock
from pytest_distperf.figures.quantities import JobRuns
from pytest_distperf.report.document import JobRecord, Record
from pytest_distperf.rank.workload import resolve_shape

Say = Callable[[str], None]  # a line on the terminal, live during the test (plugin._terminal_writer)

if TYPE_CHECKING:
    from pytest_distperf.session import SessionLedger
    from pytest_distperf.decide.regression import Gate


def _label(job: JobSpec) -> str:
    """A job's name in every report: its description, and its injected work when it carries any (store/baselines.py)."""
    from pytest_distperf.store.baselines import injection_suffix

    return job.describe() + injection_suffix(job)


def _job_keywords(strategy: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """run()/measure()'s keywords are job()'s; a strategy's own option among them is named, with where it goes."""
    import inspect

    known = inspect.signature(DistPerf.job).parameters
    unknown = sorted(k for k in kwargs if k not in known)
    if unknown:
        given = ", ".join(f"{k!r}: {kwargs[k]!r}" for k in unknown)
        raise UsageError(f"distperf job {strategy!r}: {', '.join(unknown)} is not a keyword of job(); a strategy's "
                         f"own options go in options={{{given}}}")
    return kwargs


def _count(where: str, keyword: str, value: Any, least: int) -> int:
    """A verb's count keyword, checked at the call (not in every rank): an int (not a bool) >= least."""
    __tracebackhide__ = True  # the test's call is the error's place
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise UsageError(f"{where}({keyword}=...) must be an integer of at least {least}, got {value!r}")
    return value


def _within_budget(method: Callable[..., Any]) -> Callable[..., Any]:
    """A call that launches jobs: a job the session budget stopped (SessionBudgetSpent) skips the test, noted out
    of budget (fails with --distperf-strict). Adaptive repeats catch it first: their verdict stands."""
    @functools.wraps(method)
    def call(self: "DistPerf", *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except SessionBudgetSpent as e:
            from pytest_distperf.launch import outcomes

            self.out_of_budget = str(e)
            outcomes.out_of_budget(e, self.settings.strict)
    return call


class DistPerf:
    def __init__(self, settings: Settings, plan: TestPlan, ledger: "SessionLedger", nodeid: str, base_dir: str,
                 say: Say | None = None, verbose: bool = False, gate: "Gate | None" = None,
                 deadline: float | None = None, pairs_share: tuple[Any, str] | None = None,
                 check_budget: Callable[[str], None] | None = None, root: str | None = None):
        assert plan.device is not None, "a skipped test gets no distperf fixture"
        self.settings, self.plan, self.ledger, self.nodeid, self.base_dir = settings, plan, ledger, nodeid, base_dir
        self.say, self.verbose = say, verbose  # verbose (-v): also each job's progress, waits and pairs
        self.root = root  # the project's root: a script job's script is named relative to it
        self.records: list[Record] = []  # the test's records (report/document.py), read by the plugin
        self.gate = gate  # this test's gate (decide/regression.Gate); None without --distperf
        self._clock_warnings = ClockWarnings(settings.lock_gpu_clocks)  # GPU clocks in the timed steps
        # no job or op build starts past the session's deadline (session.check_budget)
        self._check_budget = check_budget or (lambda what: None)
        self.out_of_budget: str | None = None  # why the session budget stopped the test (_within_budget)
        # Adaptive repeats: an INCONCLUSIVE verdict gets more pairs up to the test's budget (its clock runs from
        # here), the session's deadline and, from a third look, the test's share of it (stopping.session_share).
        self.budget = Budget(max_pairs=plan.max_repeats, seconds=plan.test_budget, deadline=deadline,
                             deadline_text=f"session budget {settings.session_budget:g} s"
                             if settings.session_budget else "", first_look=plan.repeats,
                             share_deadline=pairs_share[0] if pairs_share else None,
                             share_text=pairs_share[1] if pairs_share else "")
        self.clock = Clock(started=ledger.budget_now(), now=ledger.budget_now)
        self._slot_wait = 0.0  # the last launch's waits for its measurement slot (RunResult.slot_wait_seconds)
        self._launched_at: float | None = None  # when the last launch began (RunResult.launched_at)
        self._op_build = 0.0  # the last launch's DeepSpeed op builds, seconds (RunResult.op_build_seconds)
        # What one run of a job suffices for (JobSpec.measure_once: the counting pass, the breakdown) is measured
        # once in each run list, the test's view of a job (_run sets _joins, the list the next run joins; a list
        # that tests share holds its one such run for all of them), so a test's figures never depend on which
        # tests ran the job before. The base side's runs go to the gate's lists: once a test (config hashes).
        self._base_measured: set[str] = set()
        self._joins: list[RunResult] = []
        self._labels = LabelScope()  # this test's jobs whose labels would read the same are told apart
        if gate is not None:
            gate.budget = self.budget
        self._jobs: dict[int, JobRuns] = {}  # by the id of its run list: each job the test ran

    @contextlib.contextmanager
    def _timed_slot(self, slot: Any, what: str, owner: str) -> Any:
        """Enter the allocator's slot, timing the wait: it goes to RunResult.slot_wait_seconds, off the budgets,
        and into a progress line."""
        started = time.monotonic()
        with slot as env:
            waited = time.monotonic() - started
            self._slot_wait += waited  # a run may wait twice: for its op build's slot and for its own
            self.ledger.slot_wait_seconds += waited
            if self.verbose and self.say and waited >= 0.5:
                self.say(f"{owner}: got {what} after waiting {waited:.1f} s (not counted against the test's "
                         f"or the session's budget)")
            yield env

    @property
    def device(self) -> str:
        return self.plan.device  # type: ignore[return-value]

    @property
    def world_size(self) -> int:
        return self.plan.world_size

    # -- building jobs -----------------------------------------------------------------------------------------
    def job(self, strategy: str, *, options: dict[str, Any] | None = None,
            shape: str | dict[str, str] | None = None, shape_overrides: dict | None = None,
            steps: int = 10, warmup: int = 3, seed: int = 1234, world_size: int | None = None,
            probes: Any = None, probe_steps: int = 3, workload: Any = None,
            workload_kwargs: dict[str, Any] | None = None, launch: str = "controlled") -> JobSpec:
        """A strategy job on the built-in workload. `shape` may be a name or {"cpu": ..., "cuda": ...}.

        `workload`: the user's workload factory instead, "module:function" or the module-level function,
        called in every rank with `workload_kwargs` (pytest_distperf.spec.workloads). `launch`: "controlled" or
        "as_user", how the strategy's users start it (pytest_distperf.spec.profiles).

        `options`: the strategy's own options (e.g. {"stage": 3}), kept apart from the harness's arguments.
        `probes`: e.g. ("comms", "overlap", "placement"), measured over `probe_steps` profiled steps
        after the timing phase (pytest_distperf.rank.probes)."""
        __tracebackhide__ = userjobs.hides_usage_error  # a usage error points at the test's call
        options = userjobs.strategy_options(strategy, options)
        with userjobs.naming(self.nodeid):
            full_options = strategies.validate(strategy, options)
        reason = strategies.unsupported_reason(strategy, options, self.device)
        if reason:
            import pytest

            pytest.skip(reason)
        with userjobs.naming(self.nodeid):
            user: dict[str, Any] = userjobs.strategy_fields(strategy, full_options, launch, "distperf.job")
            launcher = self.settings.cluster.launcher
            # rank 0 runs as the user's script and the framework starts the others: only the local launcher can
            if PROFILES[user["launch_profile"]].starter == "script" and launcher != "local":
                raise UsageError(f"distperf.job({strategy!r}, launch='as_user') starts rank 0 as a script and lets "
                                 f"{user['launch_profile']}'s own launcher start the rest, on this host only; the "
                                 f"{launcher} launcher cannot (use launch='controlled')")
            if workload is not None:
                if shape is not None or shape_overrides:
                    raise UsageError("distperf.job(shape=/shape_overrides=) describe the built-in workload; "
                                     f"{workload!r} is not a workload factory's argument (use workload_kwargs)")
                user["workload"] = userjobs.function_ref(workload, f"distperf.job(workload={workload!r})",
                                                         "workload factory")
                user["workload_kwargs"] = dict(workload_kwargs or {})
                userjobs.check_call(workload, (), user["workload_kwargs"], "workload factory", "workload_kwargs")
            elif workload_kwargs:
                raise UsageError("distperf.job(workload_kwargs=...) needs workload=... (the factory they go to)")
        if isinstance(shape, dict):
            shape = shape.get(self.device)
        name = shape or self.plan.default_shape(self.settings)
        try:
            resolve_shape(name, shape_overrides)  # reject a bad shape here, not in every rank
        except ValueError as e:
            raise UsageError(f"distperf.job(shape={name!r}, shape_overrides={shape_overrides!r}): {e}") from None
        return self._spec("distperf.job", world_size, probes, probe_steps, strategy=strategy, options=options,
                          shape=name, shape_overrides=dict(shape_overrides or {}), steps=steps, warmup_steps=warmup,
                          seed=seed, **user)

    def step_job(self, make_step: Callable[..., Any] | str, *, args: tuple = (), kwargs: dict[str, Any] | None = None,
                 steps: int = 10, warmup: int = 3, seed: int = 1234, world_size: int | None = None,
                 probes: Any = None, probe_steps: int = 3, launch: str = "controlled") -> JobSpec:
        """A job of the user's own step: `make_step(*args, **kwargs)` runs in every rank (process group up) and
        returns `step()`, one whole training iteration. Measured like a strategy job: warm-up, timing, memory,
        probes, the breakdown of the phases it marks (pytest_distperf.phase); run/measure/compare/probe take it."""
        __tracebackhide__ = userjobs.hides_usage_error  # a usage error points at the test's call
        with userjobs.naming(self.nodeid):
            ref = userjobs.function_ref(make_step, "distperf.step_job", "step factory")
            args, kwargs = userjobs.check_step_arguments(args, kwargs, "distperf.step_job")
            userjobs.check_call(make_step, args, kwargs, "step factory", "distperf.step_job(args=..., kwargs=...)")
            user = userjobs.launch_fields(launch, "torchrun", "distperf.step_job")  # a user's own loop: as torchrun
            return self._spec("distperf.step_job", world_size, probes, probe_steps, step=ref, args=args,
                              kwargs=kwargs, steps=steps, warmup_steps=warmup, seed=seed, **user)

    def script_job(self, script: str | os.PathLike, *, args: tuple = (), launcher: str = "torchrun", warmup: int = 3,
                   steps: int = 10, env: dict[str, str] | None = None, cwd: str | os.PathLike | None = None,
                   world_size: int | None = None, probes: Any = None, probe_steps: int = 3) -> JobSpec:
        """A job of the user's training script, run unchanged: `launcher` ("torchrun", "python" where the script's
        framework starts its own ranks, "deepspeed", "accelerate") starts it with `args` on `world_size` ranks of
        this host, `env` added to the environment, in `cwd` (the script's folder by default). Its steps are its
        optimizer steps (pytest_distperf.rank.script_steps): `warmup` of them, then `steps` timed, then the
        work phase's and the probes'; then the script is ended. run/measure/compare/probe take it like any job."""
        __tracebackhide__ = True  # a usage error points at the test's call
        with userjobs.naming(self.nodeid):
            ref = userjobs.script_ref(script, args, launcher, env, cwd, self.device, self.root)
            if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 1:
                raise UsageError(f"distperf.script_job(warmup={warmup!r}): the first timed step starts at a warm-up "
                                 f"step's end (a step's start is the previous step's end): at least 1")
            if self.settings.cluster.launcher != "local":
                raise UsageError(f"distperf.script_job runs the script's own launcher on this host; the "
                                 f"{self.settings.cluster.launcher} launcher cannot")
            return self._spec("distperf.script_job", world_size, probes, probe_steps, script=ref, steps=steps,
                              warmup_steps=warmup, launch="as_user", launch_profile="script")

    def _spec(self, where: str, world_size: int | None, probes: Any, probe_steps: int, **fields: Any) -> JobSpec:
        """A measured job on the test's device: its probes (the test's by default) checked here, not in the ranks."""
        from pytest_distperf.spec import probes as probe_names

        __tracebackhide__ = userjobs.hides_usage_error  # a usage error points at the test's call; any other keeps this frame

        probes = probe_names.validate(probes, f"{where}(probes=...)") if probes is not None else self.plan.probes
        # Every verb's counts, checked here once: in the ranks steps=0 divides by zero and warmup=-1 indexes
        # past the batches. (script_job asks warmup >= 1 itself.)
        _count(where, "probe_steps", probe_steps, 1)
        _count(where, "steps", fields["steps"], 1)
        _count(where, "warmup", fields["warmup_steps"], 0)
        return self._labels.label(JobSpec(world_size=self._world_size(where, world_size), device=self.device,
                                          sys_path=list(sys.path), probes=probes, probe_steps=probe_steps, **fields))

    def _world_size(self, where: str, world_size: int | None) -> int:
        """A verb's world_size (None: the test's); 0 is no world size, not the test's."""
        return self.world_size if world_size is None else _count(where, "world_size", world_size, 1)

    # -- running -----------------------------------------------------------------------------------------------
    def _launch(self, job: JobSpec, remember_failure: bool = True) -> dict[int, Any]:
        from pytest_distperf.launch import outcomes

        started = time.monotonic()
        last_print = [0.0]

        def on_progress(text: str, elapsed: float) -> None:
            # Only jobs longer than a few seconds talk, and at most every two seconds.
            if self.verbose and self.say and elapsed > 3 and time.monotonic() - last_print[0] > 2:
                last_print[0] = time.monotonic()
                self.say(f"{job.describe()}: {text} ({time.monotonic() - started:.0f} s)")

        # Strategy jobs are deterministic configurations: one that failed fails the next test that shares it
        # without a relaunch. User functions (run_function) are always run.
        key = job.config_hash() if job.function is None and remember_failure else None
        self._prepare_ops(job)
        self._check_budget(f"job {job.describe()}")  # before its slot: a wait for it is off the budget's clock
        with outcomes.as_pytest_outcome():
            if key in self.ledger.failed_jobs:
                nodeid, error = self.ledger.failed_jobs[key]
                raise JobError(f"{job.describe()} failed earlier in this session, in {nodeid}; not run again. "
                               f"Its error:\n{error}")
            try:
                launcher = make_launcher(self.settings.cluster, self.plan.nodes)  # launch/base.py
                with self._devices(job, launcher.local_ranks(job)) as env:
                    if job.device == "cuda" and job.runs_deepspeed:
                        # DeepSpeed's op loads in the ranks read the arch list (ds_ops.deepspeed_arch_list)
                        env = {**env, **ds_ops.deepspeed_environment({**os.environ, **env})}
                    self._launched_at = time.time()  # the start-up of the run's split begins (figures.run_time_split)
                    values = launcher.launch(job, timeout=self.plan.timeout, base_dir=self.base_dir,
                                             on_progress=on_progress, env=env,
                                             keep=self.settings.keep_jobs or bool(job.probes))  # probes keep traces
            except JobError as e:
                if key is not None:
                    self.ledger.failed_jobs[key] = (self.nodeid, str(e))
                raise
        if job.probes and not self.settings.keep_jobs:
            from pytest_distperf.launch.jobfiles import drop_scratch

            drop_scratch(values)
        return values

    def _prepare_ops(self, job: JobSpec) -> None:
        """DeepSpeed's JIT ops this job will load, built before it (once; strategies/ds_ops.py), never inside a
        timed step; the build holds the CPU measurement slot and says what it builds and where it caches it."""
        options = dict(job.full_options or job.options)
        ops = ds_ops.needed(job.strategy, options, job.device)
        if not ops:
            return
        if "AsyncIOBuilder" in ops:  # NVMe offload: the swap folder must take DeepSpeed's O_DIRECT writes
            problem = ds_ops.direct_io_problem(options.get("nvme_path") or self.base_dir)
            if problem:
                import pytest

                pytest.skip(f"NVMe offload: {problem}; DeepSpeed's async I/O writes its swap files with O_DIRECT")
        from pytest_distperf.launch import allocator

        owner = f"{self.nodeid} [DeepSpeed op build]"  # said also without -v: a build takes minutes
        started, waited = time.monotonic(), self._slot_wait
        with userjobs.naming(self.nodeid):
            built = ds_ops.ensure(ops, job.device, self.say, may_start=self._check_budget,
                                  slot=self._timed_slot(allocator.cpu(owner, self.say), "the CPU measurement slot",
                                                        owner))
        if built:  # the session's set-up, not the run's: off its time split (the slot's wait is counted apart)
            self._op_build = time.monotonic() - started - (self._slot_wait - waited)

    def _devices(self, job: JobSpec, local_ranks: int):
        """The devices this job owns on this host while it runs (see allocator.py for the policy)."""
        from pytest_distperf.launch import allocator
        from pytest_distperf.launch.devices import visible_gpu_ids

        owner, say = f"{self.nodeid} [{job.describe()}]", self.say if self.verbose else None
        if job.device == "cuda" and local_ranks:  # no local ranks (SLURM): their nodes own their GPUs
            return self._timed_slot(allocator.gpus(local_ranks, visible_gpu_ids(), owner, say),
                                    f"{local_ranks} GPU(s)", owner)
        if job.device != "cuda" and job.function is None:
            return self._timed_slot(allocator.cpu(owner, say), "the CPU measurement slot", owner)
        return contextlib.nullcontext({})

    @_within_budget
    def run(self, strategy: str | JobSpec, **kwargs: Any) -> RunResult:
        """One run of a job. Gated against its baseline on that run alone (one run has no run-to-run variation:
        a time verdict needs measure() or compare())."""
        return self._measured(strategy, 1, kwargs, adaptive=False)[0]

    @_within_budget
    def measure(self, strategy: str | JobSpec, *, repeats: int | None = None, **kwargs: Any) -> list[RunResult]:
        """Run one job `repeats` times (the test's repeats by default): the run-level repeats a baseline
        verdict needs to tell a regression from run-to-run drift. While its baseline verdict is INCONCLUSIVE
        the job runs again, up to the test's budget (max_repeats, test_budget); the list holds every run."""
        return self._measured(strategy, repeats or self.plan.repeats, kwargs, adaptive=True)

    def _measured(self, strategy: str | JobSpec, repeats: int, kwargs: dict, adaptive: bool) -> list[RunResult]:
        job = strategy if isinstance(strategy, JobSpec) else self.job(strategy, **_job_keywords(strategy, kwargs))
        self._first_look_fits((job,), repeats)
        label, runs = _label(job), []

        def one_more() -> None:
            runs.append(self._run(job, runs))
            self._record_run(label, runs)  # each run as it ends: a look the budget cuts short keeps what ran

        with self._first_look(repeats, "run", lambda: len(runs)):
            while len(runs) < repeats:
                one_more()

        self._gate(job, runs, one_more if adaptive else None)
        return runs

    def _run(self, job: JobSpec, joins: list[RunResult]) -> RunResult:
        """One run of the job, for the run list `joins` (the test's view of the job: its reports and gate read it);
        the gate may pair it with its twin on the base's code (Gate.run)."""
        started = self.clock.now()
        self._joins = joins
        result = self.gate.run(job, self._run_once) if self.gate is not None else self._run_once(job)
        self.ledger.run_seconds[job.describe()] = self.clock.now() - started - result.op_build_seconds
        return result

    def _first_look_fits(self, jobs: Sequence[JobSpec], runs: int) -> None:
        """A first look starts only where it would end within the session's deadline at what this session's runs
        of the same jobs took (a job not run yet counts nothing), as each later look does (stopping.stop_reason):
        a test skipped out of budget, not one stopped halfway through its look."""
        if self.budget.deadline is None:
            return
        expected = runs * math.fsum(self.ledger.run_seconds.get(j.describe(), 0.0) for j in jobs)
        left = self.budget.deadline - self.clock.now()
        if 0 < left < expected:  # past the deadline, the first job's check_budget says so
            names = " and ".join(j.describe() for j in jobs)
            raise SessionBudgetSpent(
                f"session budget {self.settings.session_budget:g} s: {left:.0f} s left, and the first look "
                f"({runs} run{'s' if runs != 1 else ''} of {names}) would take about {expected:.0f} s at this "
                f"session's runs of the same jobs: not started")

    @contextlib.contextmanager
    def _first_look(self, planned: int, unit: str, done: Callable[[], int],
                    keep: Callable[[], None] = lambda: None) -> Iterator[None]:
        """Around a test's first look of `planned` runs (or pairs): a session budget that stops it after some ran
        says so, "cut short", not "not started"; what ran stays among the test's jobs (`keep` records the run
        lists), in every report, with no verdict (the look is not done)."""
        try:
            yield
        except SessionBudgetSpent as e:
            if not done():
                raise
            keep()
            raise SessionBudgetSpent(f"{e}; the first look was cut short after {done()} of its {planned} {unit}s: "
                                     f"what ran is in the report, with no verdict", cut_short=True) from None

    def _run_once(self, job: JobSpec, side: str = "head") -> RunResult:
        """One launch of `job`; the base side of a pair ("base") is never remembered as a failed job."""
        first = (job.config_hash() not in self._base_measured if side == "base"
                 else not any(r.spec.measure_once for r in self._joins))
        job = dataclasses.replace(job, measure_once=first)
        start = time.monotonic()
        self._slot_wait, self._launched_at, self._op_build = 0.0, None, 0.0
        agents_before = len(warm_pool.STATE.start_seconds)
        values = self._launch(job, remember_failure=side == "head")
        if side == "base":
            self._base_measured.add(job.config_hash())
        result = RunResult(spec=job, ranks=[values[r] for r in sorted(values)], wall_seconds=time.monotonic() - start,
                           slot_wait_seconds=self._slot_wait, launched_at=self._launched_at,
                           agent_start_seconds=math.fsum(warm_pool.STATE.start_seconds[agents_before:]),
                           op_build_seconds=self._op_build)
        busy = hostload.busy_host_message(job.describe(), result.host_other_load)
        if busy:
            warn(hostload.HostBusyWarning(busy))
        clocks = self._clock_warnings.check(job.describe(), result.ranks) if job.device == "cuda" else None
        if clocks:
            warn(GpuClockWarning(clocks))
        return result

    @_within_budget
    def run_function(self, fn: Callable[..., Any], *args: Any, world_size: int | None = None,
                     **kwargs: Any) -> list[Any]:
        """Call `fn(*args, **kwargs)` in every rank; return the values ordered by rank."""
        ref = userjobs.function_ref(fn, "distperf.run_function", "function")
        job = JobSpec(world_size=self._world_size("distperf.run_function", world_size), device=self.device,
                      function=ref, args=tuple(args),
                      kwargs=kwargs, sys_path=list(sys.path))
        values = self._launch(job)
        return [values[r] for r in sorted(values)]

    @_within_budget
    def compare(self, a: JobSpec, b: JobSpec, *, repeats: int | None = None, shared: bool = False) -> Comparison:
        """Run A and B in `repeats` interleaved pairs (A B, then B A, ...) and return their Comparison. A check
        that is INCONCLUSIVE on them runs more pairs, up to the test's budget (max_repeats, test_budget).

        `shared=True`: tests of this session that compare the same two jobs share one set of runs; a test that
        needs more pairs extends that set once for every later test."""
        key, fresh = (a.config_hash(), b.config_hash()), ([], [], self.nodeid)
        runs_a, runs_b, _ = self.ledger.comparisons.setdefault(key, fresh) if shared else fresh
        label_a, label_b = _label(a), _label(b)

        def one_more_pair() -> None:
            i = len(runs_a)
            if self.verbose and self.say:
                self.say(f"pair {i + 1}: {label_a} vs {label_b}")
            # A B, then B A: what drifts within a pair hits both orders alike
            (first, first_runs), (second, second_runs) = ((a, runs_a), (b, runs_b))[::1 if i % 2 == 0 else -1]
            first_runs.append(self._run(first, first_runs))
            try:
                second_runs.append(self._run(second, second_runs))
            except SessionBudgetSpent:
                first_runs.pop()  # no half pair: the sides (also of tests sharing them) stay paired
                raise
            self._record_run(label_a, runs_a)
            self._record_run(label_b, runs_b)

        if not runs_a:
            self._first_look_fits((a, b), repeats or self.plan.repeats)

        def keep() -> None:  # a first look cut short: the pairs that ran (also shared ones) are the test's
            for label, runs in ((label_a, runs_a), (label_b, runs_b)):
                if runs:
                    self._record_run(label, runs)

        with self._first_look(repeats or self.plan.repeats, "pair", lambda: min(len(runs_a), len(runs_b)), keep):
            while len(runs_a) < (repeats or self.plan.repeats):
                one_more_pair()
        side_a, side_b = self._record_run(label_a, runs_a), self._record_run(label_b, runs_b)
        # Every test that uses these runs (also shared ones) is gated on them against its own baseline.
        self._gate(a, runs_a, one_more_pair)
        self._gate(b, runs_b, one_more_pair)
        adaptive = Adaptive(extend=one_more_pair, budget=self.budget, clock=self.clock,
                            progress=self.say if self.verbose else None, on_inconclusive=self._inconclusive)
        return Comparison(side_a, side_b, on_check=self._record_check, adaptive=adaptive)

    @_within_budget
    def probe(self, job: JobSpec, *, shared: bool = False) -> RunResult:
        """Run a job that has probes. `shared=True`: once per session, tests checking different probes of one
        job share its run (and its skip, e.g. no async I/O for NVMe)."""
        if not job.probes:
            raise UsageError(f"distperf.probe() needs a job with probes, e.g. distperf.job(..., probes=('comms',)); "
                             f"{job.describe()} has none")
        key, runs = job.config_hash(), self.ledger.probe_runs if shared else {}
        if key not in runs:
            self._first_look_fits((job,), 1)
            try:
                runs[key] = self._run(job, [])
            except BaseException as e:
                if type(e).__name__ == "Skipped":  # true for every test of this job
                    runs[key] = e
                raise
            self._record_run(_label(job), [runs[key]])
        cached = runs[key]
        if isinstance(cached, BaseException):
            import pytest

            pytest.skip(str(getattr(cached, "msg", cached)))
        self._gate(job, [cached])
        return cached

    def probe_checks(self, a: RunResult | list[RunResult], b: RunResult | list[RunResult] | None = None) -> Any:
        """Assertions over the probe results of A (and B): see pytest_distperf.decide.probe_checks."""
        from pytest_distperf.decide.probe_checks import ProbeAssertions

        return ProbeAssertions(a, b, on_check=self._record_check)

    # -- records for reports -----------------------------------------------------------------------------------
    def _record_run(self, label: str, runs: list[RunResult]) -> JobRuns:
        """A job of the test: its record is made when the test ends (test_records), from the runs its list holds
        then (a list grows with adaptive repeats)."""
        if id(runs) not in self._jobs:
            self._jobs[id(runs)] = JobRuns(label, [runs])
            if runs[0].spec.probes:
                self.records.append(probe_summary(label, runs))
        return self._jobs[id(runs)]

    def test_records(self) -> list[Record]:
        """The test's records as it ends (report/document.py): each job's figures and runs, then its checks and
        probes."""
        jobs: list[Record] = []
        for job in self._jobs.values():
            first = job.runs[0]
            extra = (getattr(first.ranks[0], "extra", None) or {}) if first.ranks else {}
            departures = extra.get("departures") or (extra.get("launch") or {}).get("departures")  # ctx.extra's
            jobs.append(JobRecord.from_runs(job.label, job.runs, dict(departures or {})))
        return jobs + self.records

    def _record_check(self, check: Check) -> None:
        self.records.append(check)

    def _inconclusive(self, check: Check, message: str) -> None:
        """A check still INCONCLUSIVE after its budget: a warning; a failure with --distperf-strict; in a known-gap
        test a skip (only a FAIL satisfies the gap's strict xfail, and an undecided check neither confirms nor
        refutes it)."""
        import pytest

        warn(DistPerfInconclusive(message))
        if self.settings.strict:
            pytest.fail(f"{message}\n  (--distperf-strict: an inconclusive verdict fails the test)", pytrace=False)
        if self.plan.known_gap:
            pytest.skip(f"inconclusive: {message.splitlines()[0]}; the known gap ({self.plan.known_gap}) was neither "
                        f"confirmed nor refuted")

    def _gate(self, job: JobSpec, runs: list[RunResult], extend: Callable[[], None] | None = None) -> None:
        """Tell this test's gate about a job's runs (Gate.check: `extend` adds runs while a verdict is undecided);
        decided again when the test ends."""
        if self.gate is not None:
            self.gate.check(job, runs, extend, self.clock, self.say if self.verbose else None)
