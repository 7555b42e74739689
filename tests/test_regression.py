"""The regression verdict: the pure decision per metric, and the gate end to end on real 2-rank CPU jobs.

The end-to-end regression is injected as real extra matmul work inside the step
(`shape_overrides={"extra_work": ...}`), never a sleep.
"""

from __future__ import annotations

import json
import os
import re
import shutil

import pytest

from records import DDP_PERF_TEST

from pytest_distperf.launch import fingerprint
from pytest_distperf.store.baselines import JobEntry, MetricSeries
from pytest_distperf.spec.settings import SettingsError
from pytest_distperf.decide.policy import Policy, policy_for
from pytest_distperf.decide.regression import decide_job
from pytest_distperf.decide.verdicts import DetectableChange, decide_metric, describe_verdict, is_failing
from pytest_distperf.report.terminal import render
from pytest_distperf.report.document import TestDocument

# Saving records each job up to the adaptive budget (--distperf-max-repeats), and a verdict may add runs up to it:
# a busy 2-core box varies by tens of percent run to run, and with fewer runs a side the 98 % interval is too wide
# to call even the injected slowdown.
INNER_OPTS = ("--distperf", "-p", "no:cacheprovider", "--distperf-max-repeats", "8")
MiB = 1 << 20


@pytest.fixture(autouse=True)
def _no_job_summary(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)


def time_series(ms: list[float]) -> MetricSeries:
    return MetricSeries("s", "lower", "time", [x / 1e3 for x in ms])


def decide_time(base: list[float], cur: list[float], policy: Policy = Policy()):
    return decide_metric("t", "job", "step_time", time_series(base), time_series(cur), policy)


# -- time: the decision core's unpaired interval against the 5 % floor ---------------------------------------------
def test_a_slowdown_whose_interval_clears_the_floor_fails():
    v = decide_time([100, 101, 99] * 2, [110, 111, 109] * 2)
    assert v.status == "fail" and v.level == 0.98
    assert v.delta == pytest.approx(0.10, abs=0.002) and v.low > 0.05 and v.threshold == pytest.approx(0.05)


def test_an_interval_that_holds_the_floor_is_inconclusive():
    v = decide_time([100, 100.5, 99.5], [80, 140, 110])  # +8 % on average, runs all over the place
    assert v.delta > 0.05 and v.low < 0.05 < v.high and v.status == "inconclusive"
    assert "holds the limit" in v.note


def test_an_inconclusive_verdict_says_when_the_stored_runs_keep_it_undecided():
    burst = [100, 180, 95, 300, 110, 100]  # a baseline recorded through a burst of other load
    v = decide_time(burst, [105, 100, 98, 102, 101, 99])
    assert v.status == "inconclusive" and v.note.startswith("the interval holds the limit")
    assert "the stored runs' spread (46.2% run-to-run over 6) lets no unchanged job pass within 12 runs" in v.note
    # a quiet baseline: this run's own spread is what leaves it undecided, and the note does not blame the baseline
    assert "stored runs' spread" not in decide_time([100, 101, 99] * 4, [103, 97, 106]).note


def test_a_small_change_whose_interval_stays_below_the_floor_passes():
    assert decide_time([100, 100.1, 99.9] * 2, [101, 101.1, 100.9] * 2).status == "pass"
    # the floor is the smallest slowdown worth failing for, however quiet the machine: +3.5 % never fails at 5 %
    assert decide_time([100, 100.2, 99.8] * 2, [103.5, 103.6, 103.4] * 2).status == "pass"


def test_the_floor_is_per_test_not_a_multiple_of_the_noise():
    quiet = [100, 100.2, 99.8] * 2
    assert decide_time(quiet, [103.5, 103.6, 103.4] * 2, Policy(time_threshold=0.01)).status == "fail"
    noisy = [100, 104, 96] * 2  # ~4 % run-to-run: a wider interval, not a higher limit
    v = decide_time(noisy, [125, 126, 124] * 2)
    assert v.status == "fail" and v.threshold == pytest.approx(0.05)


def test_one_run_per_side_has_no_interval():
    v = decide_time([100], [150])
    assert v.status == "inconclusive" and v.low is None and v.high is None and "too few runs" in v.note


def test_decisions_are_over_runs_not_steps():
    # Each run's steps are tight, but the runs drift: only 3 run-level values per side enter the decision.
    base = MetricSeries("s", "lower", "time", [0.100, 0.106, 0.094], samples=[[0.1] * 50, [0.106] * 50, [0.094] * 50])
    cur = MetricSeries("s", "lower", "time", [0.106, 0.110, 0.102], samples=[[0.106] * 50, [0.11] * 50, [0.102] * 50])
    v = decide_metric("t", "j", "step_time", base, cur, Policy())
    assert v.baseline_runs == 3 and v.current_runs == 3 and v.status != "fail"


def test_the_figures_are_geometric_means_and_delta_is_their_ratio():
    v = decide_time([100, 121], [110, 110])
    assert v.baseline == pytest.approx(0.110) and v.current == pytest.approx(0.110) and v.delta == pytest.approx(0.0)


def test_an_improvement_is_reported_and_fails_only_on_request():
    v = decide_time([100, 101, 99] * 2, [80, 80.5, 79.5] * 2)
    assert v.status == "improved" and "refresh the baseline" in v.note
    assert not is_failing(v, Policy())
    assert is_failing(v, Policy(fail_on_improvement=True))


def test_inconclusive_fails_only_when_strict():
    v = decide_time([100, 100.5, 99.5], [80, 140, 110])
    assert not is_failing(v, Policy()) and is_failing(v, Policy(strict=True))


def test_higher_is_better_metrics_flip_the_direction():
    base = MetricSeries("tok/s", "higher", "time", [1000, 1010, 990] * 2)
    assert decide_metric("t", "j", "tokens", base, MetricSeries("tok/s", "higher", "time", [800, 805, 795] * 2),
                         Policy()).status == "fail"
    assert decide_metric("t", "j", "tokens", base, MetricSeries("tok/s", "higher", "time", [1300, 1305, 1295] * 2),
                         Policy()).status == "improved"


# -- memory and counts ------------------------------------------------------------------------------------------
def mem(values: list[float]) -> MetricSeries:
    return MetricSeries("bytes", "lower", "memory", values)


def test_memory_is_decided_on_its_interval_against_max_of_2_percent_and_64_mib():
    small = 1024 * MiB  # 2 % = 20 MiB < 64 MiB floor
    # CUDA peak allocated is the same bytes every run: the interval is the value
    assert decide_metric("t", "j", "m", mem([small] * 2), mem([small + 60 * MiB]), Policy()).status == "pass"
    assert decide_metric("t", "j", "m", mem([small] * 2), mem([small + 70 * MiB]), Policy()).status == "fail"
    big = 40 * 1024 * MiB  # 2 % = 819 MiB
    assert decide_metric("t", "j", "m", mem([big] * 2), mem([big + 500 * MiB]), Policy()).status == "pass"
    assert decide_metric("t", "j", "m", mem([big] * 2), mem([big + 900 * MiB]), Policy()).status == "fail"
    assert decide_metric("t", "j", "m", mem([big] * 2), mem([big - 900 * MiB]), Policy()).status == "improved"
    # a pass that is worse over its whole interval (the floor let it through) says so, with the limit
    v = decide_metric("t", "j", "m", mem([small] * 2), mem([small + 60 * MiB]), Policy())
    assert v.note.startswith("worse over the whole interval, within the limit max(2%, 64.00 MiB)"), v.note
    assert decide_metric("t", "j", "m", mem([small] * 2), mem([small]), Policy()).note == ""
    # host RSS growth varies run to run: an interval that holds the limit is inconclusive
    noisy = [100 * MiB, 180 * MiB, 140 * MiB]
    assert decide_metric("t", "j", "m", mem(noisy), mem([210 * MiB, 150 * MiB, 180 * MiB]),
                         Policy()).status == "inconclusive"


def test_on_cpu_the_gate_decides_memory_on_the_training_state_and_shows_host_rss_beside_it():
    """Host RSS growth (peak_memory on CPU) grew +80 % while the training state stayed put: the memory verdict is
    train_memory's and passes; RSS is on it in words, never a verdict of its own. On CUDA peak_memory decides."""
    entry = JobEntry("job", "h", {}, {"peak_memory": mem([100 * MiB] * 3), "train_memory": mem([30 * MiB] * 3)})
    current = {"step_time": time_series([100, 101]), "peak_memory": mem([180 * MiB] * 2),
               "train_memory": mem([30 * MiB] * 2)}
    by = {v.metric: v for v in decide_job("t", "job", entry, "h", current, Policy(), "", device="cpu")}
    assert set(by) == {"step_time", "train_memory"} and by["train_memory"].status == "pass"
    assert by["train_memory"].secondary == ("host RSS growth during training (peak_memory; shown, not decided on: it "
                                            "counts imports and one-time allocations): baseline 100.00 MiB, current "
                                            "180.00 MiB (+80.0%)")
    assert by["train_memory"].secondary in "\n".join(describe_verdict(by["train_memory"], Policy()))
    # +60 MiB of training state passes under the 64 MiB floor, and the table says it is worse within the limit
    within = {**current, "train_memory": mem([90 * MiB] * 2)}
    records = decide_job("t", "job", entry, "h", within, Policy(), "", device="cpu")
    lines = render([TestDocument.from_records("t.py::test_x", "passed", 1.0, records)])
    assert "  job train_memory: worse over the whole interval, within the limit max(2%, 64.00 MiB) = +64.00 MiB " \
           "(2 current against 3 stored run(s))" in lines
    # the training state moved: that fails, whatever RSS did
    grown = {**current, "train_memory": mem([130 * MiB] * 2), "peak_memory": mem([100 * MiB] * 2)}
    by = {v.metric: v for v in decide_job("t", "job", entry, "h", grown, Policy(), "", device="cpu")}
    assert by["train_memory"].status == "fail" and "+0.0%" in by["train_memory"].secondary
    # no baseline: the current RSS alone
    [v] = [v for v in decide_job("t", "job", None, "h", current, Policy(), "new", device="cpu")
           if v.metric == "train_memory"]
    assert v.status == "new" and v.secondary.endswith("): current 180.00 MiB")
    # named in baseline_metrics, peak_memory stands for the memory verdict: on CPU the training state's
    p = Policy(metrics=("peak_memory",))
    assert [v.metric for v in decide_job("t", "job", entry, "h", current, p, "", device="cpu")] == ["train_memory"]
    # CUDA: the peak allocated decides, nothing beside it
    cuda = {v.metric: v for v in decide_job("t", "job", entry, "h", current, Policy(), "", device="cuda")}
    assert cuda["peak_memory"].status == "fail" and not any(v.secondary for v in cuda.values())


def test_head_vs_base_decides_cpu_memory_on_the_training_state():
    from pytest_distperf.decide.against import decide_pairs
    from pytest_distperf.decide.decision import Design
    from pytest_distperf.spec.job import JobSpec

    job = JobSpec(world_size=2, device="cpu", strategy="ddp", steps=4)
    pairs = [(fake_run(job, 100, rss_growth=200 * MiB), fake_run(job, 100)) for _ in range(3)]
    by = {v.metric: v for v in decide_pairs("t", "job", pairs, Policy(), Design())}
    assert "peak_memory" not in by and by["train_memory"].status == "pass"
    assert by["train_memory"].secondary.endswith("base 100.00 MiB, head 200.00 MiB (+100.0%)")


def test_counts_are_exact():
    c = lambda *n: MetricSeries("calls", "lower", "count", list(n))  # noqa: E731
    assert decide_metric("t", "j", "comms.all_gather.calls_per_step", c(48, 48), c(48, 48), Policy()).status == "pass"
    assert decide_metric("t", "j", "comms.all_gather.calls_per_step", c(48, 48), c(48, 49), Policy()).status == "fail"
    assert decide_metric("t", "j", "comms.all_gather.calls_per_step", c(48, 48), c(47), Policy()).status == "improved"


# -- new, not comparable, overrides -----------------------------------------------------------------------------
def test_missing_baseline_is_new_and_fails_only_when_required():
    current = {"step_time": time_series([100, 101])}
    [v] = decide_job("t", "job", None, "h", current, Policy(), "no baseline for this test")
    assert v.status == "new" and not is_failing(v, Policy())
    assert is_failing(v, Policy(require_baseline=True))
    entry = JobEntry("job", "h", {}, {"peak_memory": mem([1.0])})
    [v, stored_only] = decide_job("t", "job", entry, "h", current, Policy(), "")
    assert v.status == "new"  # the job is there, this metric is not
    assert (stored_only.metric, stored_only.status) == ("peak_memory", "not comparable")  # and the reverse is said


def test_a_changed_config_is_not_comparable_rather_than_a_regression():
    entry = JobEntry("job", "old-hash", {}, {"step_time": time_series([100, 101, 99])})
    [v] = decide_job("t", "job", entry, "new-hash", {"step_time": time_series([200, 201, 199])}, Policy(), "")
    assert v.status == "not comparable" and "old-hash -> new-hash" in v.note
    assert not is_failing(v, Policy()) and is_failing(v, Policy(require_baseline=True))


def test_a_changed_config_names_the_fields_that_changed_old_to_new():
    entry = JobEntry("job", "old-hash", {"steps": 8, "script": {"args": ["--steps", "200"], "name": "s.py"}},
                     {"step_time": time_series([100, 101, 99])})
    now = {"steps": 16, "script": {"args": ["--steps", "200", "--hidden", "64"], "name": "s.py"}}
    [v] = decide_job("t", "job", entry, "new-hash", {"step_time": time_series([200, 201, 199])}, Policy(), "",
                     config=now)
    assert v.status == "not comparable"
    assert v.note == ('the job\'s configuration changed since the baseline: script.args ["--steps", "200"] -> '
                      '["--steps", "200", "--hidden", "64"]; steps 8 -> 16 (hash old-hash -> new-hash)')
    # the note is in the terminal's table notes (it fails nothing, so no failure message carries it)
    other = decide_job("t", "job", entry, "new-hash", {"step_time": time_series([200, 201, 199]),
                                                        "train_memory": mem([MiB] * 3)}, Policy(), "", config=now)
    lines = render([TestDocument.from_records("t.py::test_x", "passed", 1.0, [u.landed(Policy()) for u in other])])
    assert lines.count(f"  job: {v.note}") == 1  # the job's, once


def test_a_job_missing_from_the_baseline_names_the_nearest_stored_job_and_how_it_differs():
    """A script's arguments are part of its job's name: changed arguments read as that change, not only as new."""
    from pytest_distperf.decide.regression import nearest_job

    def entry(label, args, steps=10):
        return JobEntry(label, "h", {"steps": steps, "script": {"args": args, "name": "s.py"}}, {})
    stored = {"a": entry("a", ["--lr", "1"]), "b": entry("b", ["--lr", "2"], steps=20), "c": entry("c", [], 99)}
    now = {"steps": 10, "script": {"args": ["--lr", "3"], "name": "s.py"}}
    assert nearest_job(stored, now) == ('; the nearest there, a, differs in: script.args ["--lr", "1"] -> '
                                        '["--lr", "3"]')
    far = {"steps": 1, "strategy": "ddp", "shape": "x", "world_size": 4, "device": "cuda"}
    assert nearest_job(stored, far) == "" and nearest_job(stored, None) == "" and nearest_job({}, now) == ""


def test_a_changed_script_is_said_beside_a_failure_and_a_config_change():
    entry = JobEntry("job", "h", {}, {"step_time": time_series([100, 101, 99] * 2)}, script_sha256="a" * 64)
    slower = {"step_time": time_series([130, 131, 129] * 2)}
    [v] = decide_job("t", "job", entry, "h", slower, Policy(), "", script_sha256="b" * 64)
    assert v.status == "fail" and v.note.endswith(
        f"; the script's content changed since the baseline (sha256 {'a' * 12} -> {'b' * 12})")
    [v] = decide_job("t", "job", entry, "h2", slower, Policy(), "", script_sha256="b" * 64)
    assert v.status == "not comparable" and "the script's content changed since the baseline" in v.note
    same = {"step_time": time_series([100, 101, 99] * 2)}
    [v] = decide_job("t", "job", entry, "h", same, Policy(), "", script_sha256="b" * 64)
    assert v.status == "pass" and "script" not in v.note  # said where it explains something
    for stored, now in (("a" * 64, "a" * 64), (None, "b" * 64), ("a" * 64, None)):  # same, or unknown on a side
        entry.script_sha256 = stored
        [v] = decide_job("t", "job", entry, "h", slower, Policy(), "", script_sha256=now)
        assert v.status == "fail" and "script" not in v.note


def test_suggested_commands_quote_node_ids_for_the_shell():
    """zsh takes a parametrized id's brackets for a glob: the command is shell-quoted wherever it is shown."""
    from pytest_distperf.decide.regression import save_command

    nodeid = "tests/test_05_loader.py::test_loader[spawn]"
    assert save_command(nodeid) == "pytest --distperf --distperf-save 'tests/test_05_loader.py::test_loader[spawn]'"
    assert save_command("t.py::test_x", ["--distperf-max-repeats", "8"]) == (
        "pytest --distperf --distperf-save --distperf-max-repeats 8 t.py::test_x")
    [v] = decide_job(nodeid, "job", None, "h", {"step_time": time_series([100, 101])}, Policy(), "new")
    lines = render([TestDocument.from_records(nodeid, "passed", 1.0, [v])])
    assert lines[-1].endswith(f": {save_command(nodeid)}")


def test_verdict_records_round_trip():
    from pytest_distperf.decide.verdicts import MetricVerdict

    v = decide_time([100, 101, 99] * 2, [110, 111, 109] * 2)
    assert MetricVerdict.from_json(json.loads(json.dumps(v.to_json()))) == v
    with pytest.raises(ValueError, match="status"):
        MetricVerdict.from_json({**v.to_json(), "status": "warn"})


def test_marker_overrides_are_validated_and_applied():
    p = policy_for(Policy(), {"time_threshold": 0.1, "memory_floor": 128 * MiB, "baseline_metrics": ["step_time"]},
                   "t.py::test_x")
    assert (p.time_threshold, p.memory_floor, p.metrics) == (0.1, 128 * MiB, ("step_time",))
    with pytest.raises(SettingsError, match=r"t.py::test_x: distperf\(time_threshold=-1\)"):
        policy_for(Policy(), {"time_threshold": -1}, "t.py::test_x")
    with pytest.raises(SettingsError, match="unknown metric"):
        policy_for(Policy(), {"baseline_metrics": ["steptime"]}, "t.py::test_x")
    v = decide_job("t", "j", None, "h", {"step_time": time_series([1]), "peak_memory": mem([1])}, p, "")
    assert [x.metric for x in v] == ["step_time"]


def test_a_bad_marker_override_is_a_usage_error(pytester: pytest.Pytester):
    pytester.makepyfile(test_bad="""
import pytest

@pytest.mark.distperf(world_size=2, time_threshold="fast")
def test_x(distperf):
    pass
""")
    result = pytester.runpytest(*INNER_OPTS)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*test_bad.py::test_x: distperf(time_threshold='fast'): expected a number*"])


# -- end to end on real jobs ------------------------------------------------------------------------------------
PERF_TEST = DDP_PERF_TEST


@pytest.fixture
def saved_baselines(saved_ddp_baseline):
    """A baselines folder saved from the unchanged job, once per test session (tests/conftest.py's real
    --distperf-save session of this PERF_TEST, 8 runs); each test copies it into its pytester dir."""
    return saved_ddp_baseline.folder


def machine_dir() -> str:
    return fingerprint.machine_class("cpu", 2).name


@pytest.mark.slow
def test_an_injected_regression_fails_with_a_message_that_says_how_to_accept_it(
        pytester: pytest.Pytester, saved_baselines, monkeypatch: pytest.MonkeyPatch):
    shutil.copytree(saved_baselines, pytester.path / "baselines")
    pytester.makepyfile(test_perf=PERF_TEST)
    path = pytester.path / "baselines" / machine_dir() / "test_perf--test_ddp.json"
    before = path.read_bytes()
    # 32x the blocks' matmul work, several times the step time: it must stand out even against a baseline that a
    # shared 2-core box recorded through a burst of other load (its runs then spread by tens of percent)
    monkeypatch.setenv("DP_EXTRA_WORK", "32")
    result = pytester.runpytest(*INNER_OPTS, "-v", "--distperf-json", "report.json")
    result.assert_outcomes(failed=1)
    # the injected job is keyed apart from the clean one, and compared against the clean one's stored runs
    result.stdout.fnmatch_lines([
        "*distperf baseline gate failed for test_perf.py::test_ddp (machine class cpu-*",
        "*to accept the current numbers as the new baseline, run:",
        "*pytest --distperf --distperf-save test_perf.py::test_ddp",
    ])
    assert path.read_bytes() == before  # a failing gate never rewrites the baseline
    verdicts = {v["metric"]: v for v in json.loads((pytester.path / "report.json").read_text())["tests"][0]["verdicts"]}
    # the knob adds no parameters: the exact state count did not move, the step's work did
    assert verdicts["optimizer_state_bytes"]["status"] == "pass"
    assert verdicts["flops_per_step"]["status"] == "fail"
    if verdicts["step_time"]["status"] == "fail":
        result.stdout.fnmatch_lines([
            "*ddp tiny x2 cpu +extra_work=32: step_time FAIL: +*% vs baseline, 98% interval [[]+*%, +*%]; limit +5.0% "
            "(time_threshold*",
            "*baseline * (geometric mean of 8 runs, run-to-run *)",
            "*current * (geometric mean of * runs, run-to-run *)",
        ])
        assert verdicts["step_time"]["low"] > 0.05
        result.stdout.fnmatch_lines(["*test_ddp*ddp tiny x2 cpu*step_time*✗*"])
    else:
        # a baseline this shared box recorded through other load can be too spread for step time to decide at the
        # first look; the work figures decide it then, and the failure says so
        assert verdicts["step_time"]["status"] == "inconclusive"
        result.stdout.fnmatch_lines([
            "*ddp tiny x2 cpu +extra_work=32: flops_per_step FAIL: +*% vs baseline; limit exact",
            "*decided where step time stayed inconclusive (wall time run-to-run *",
        ])


@pytest.mark.slow
def test_no_baseline_is_new_and_fails_only_with_require_baseline(pytester: pytest.Pytester,
                                                                  monkeypatch: pytest.MonkeyPatch):
    pytester.makepyfile(test_perf=PERF_TEST)
    monkeypatch.setenv("DP_REPEATS", "1")
    result = pytester.runpytest(*INNER_OPTS, "-v")
    result.assert_outcomes(passed=1)
    # no baseline yet: one line per job with the command that records it, not a row per metric
    result.stdout.fnmatch_lines(["no baseline yet for 1 job(s)*",
                                 "  ddp tiny x2 cpu (* metrics) in test_ddp: pytest --distperf --distperf-save "
                                 "test_perf.py::test_ddp"])
    assert not [line for line in result.stdout.lines if "step_time" in line and line.rstrip().endswith("new")]
    result = pytester.runpytest(*INNER_OPTS, "--distperf-require-baseline")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*step_time NEW: no baseline for this test on machine class cpu-*(--distperf-require-baseline)*",
        "*pytest --distperf --distperf-save test_perf.py::test_ddp"])


@pytest.mark.slow
def test_a_changed_job_config_reads_not_comparable(pytester: pytest.Pytester, saved_baselines,
                                                    monkeypatch: pytest.MonkeyPatch):
    shutil.copytree(saved_baselines, pytester.path / "baselines")
    pytester.makepyfile(test_perf=PERF_TEST)
    monkeypatch.setenv("DP_REPEATS", "1")
    monkeypatch.setenv("DP_STEPS", "4")  # another step count: another configuration hash
    result = pytester.runpytest(*INNER_OPTS, "-v")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*test_ddp*ddp tiny x2 cpu*step_time*≠ config"])


# -- the per-test gate (plain RunResult data: what ranks send back, no jobs) ---------------------------------------
def fake_run(job, ms: float, opt_bytes: int = 1000, rss_growth: int = 100 * MiB, state: int = 30 * MiB):
    from pytest_distperf.rank.results import RankResult, RunResult, WorkResult

    ranks = [RankResult(rank=r, step_times=[ms / 1e3] * 4, losses=[1.0] * 4, cuda_peak_allocated=None,
                        cuda_peak_reserved=None, host_peak_rss=100 * MiB + rss_growth, host_rss_before_build=100 * MiB,
                        optimizer_state_bytes=opt_bytes, num_params=10, tokens_per_step=64, build_seconds=0.1,
                        warmup_seconds=0.1, work=WorkResult(steps=2, state_bytes=state, step_peak_bytes=[MiB] * 2))
             for r in range(2)]
    return RunResult(spec=job, ranks=ranks, wall_seconds=1.0)


def make_gate(tmp_path, save: bool, policy: Policy = Policy()):
    from pytest_distperf.decide.policy import GateSettings
    from pytest_distperf.decide.regression import BaselineGate, GateSession

    session = GateSession(GateSettings(str(tmp_path / "baselines"), save, policy), str(tmp_path))
    return session, BaselineGate(session, "t.py::test_x", "cpu", 2, policy)


def test_the_gate_saves_up_to_the_budget_extends_undecided_jobs_and_warns_on_version_changes(tmp_path):
    from pytest_distperf.errors import DistPerfInconclusive
    from pytest_distperf.errors import BaselineEnvironmentWarning
    from pytest_distperf.decide.stopping import Budget
    from pytest_distperf.spec.job import JobSpec

    job = JobSpec(world_size=2, device="cpu", strategy="ddp", steps=4)
    _, gate = make_gate(tmp_path, save=True)
    gate.budget = Budget(max_pairs=6)
    runs = [fake_run(job, ms) for ms in (100, 101, 99)]
    more = iter([102, 98, 100.5])
    gate.check(job, runs, extend=lambda: runs.append(fake_run(job, next(more))))
    assert len(runs) == 6  # recorded up to the budget: the stored runs bound what later verdicts can resolve
    landing = gate.finish(test_passed=True)
    assert not landing.failed and landing.context.saved == gate.path

    # decided at the first look: no run is added
    _, gate = make_gate(tmp_path, save=False)
    slow = [fake_run(job, ms) for ms in (130, 131, 129)]
    gate.check(job, slow, extend=lambda: pytest.fail("a decided verdict runs nothing more"))
    landing = gate.finish(test_passed=True)
    assert {r.metric: r.status for r in landing.records}["step_time"] == "fail"
    assert landing.failed and "step_time FAIL" in landing.message and "98% interval" in landing.message
    assert "pytest --distperf --distperf-save t.py::test_x" in landing.message

    # undecided: the job runs again until its interval clears the floor (against 6 stored runs spread 1.4 % the
    # design's last look, at 12 runs, still reaches about 5 % each side: a candidate 1 % faster clears +5 %)
    _, gate = make_gate(tmp_path, save=False)
    cur = [fake_run(job, ms) for ms in (103, 97, 106)]
    gate.check(job, cur, extend=lambda: cur.append(fake_run(job, 99.0)))
    landing = gate.finish(test_passed=True)
    assert len(cur) > 3 and {r.metric: r.status for r in landing.records}["step_time"] == "pass"

    # still undecided when the budget runs out: a warning, a failure only when strict
    _, gate = make_gate(tmp_path, save=False)
    gate.budget = Budget(max_pairs=4)
    cur = [fake_run(job, ms) for ms in (104, 96, 110)]
    gate.check(job, cur, extend=lambda: cur.append(fake_run(job, 112)))
    with pytest.warns(DistPerfInconclusive, match=r"step_time INCONCLUSIVE"):
        landing = gate.finish(test_passed=True)
    assert not landing.failed and len(cur) == 4
    assert {r.metric: r.stopped for r in landing.records}["step_time"] == "max 4 runs"  # the stored gate: runs, unpaired
    _, strict = make_gate(tmp_path, save=False, policy=Policy(strict=True))
    strict.check(job, cur)
    landing = strict.finish(test_passed=True)
    assert landing.failed and "--distperf-strict" in landing.message

    path = tmp_path / "baselines" / gate.machine.name / "t--test_x.json"
    doc = json.loads(path.read_text())
    doc["environment"]["torch"] = "0.0.1"
    path.write_text(json.dumps(doc))
    with pytest.warns(BaselineEnvironmentWarning, match=r"torch 0.0.1 -> "):
        make_gate(tmp_path, save=False)


def test_a_save_over_an_existing_baseline_says_what_it_replaced(tmp_path):
    """Not refused (it was asked for), never unsaid: the terminal and the JSON report name what the file held."""
    from pytest_distperf.decide.regression import GateContext
    from pytest_distperf.decide.stopping import Budget
    from pytest_distperf.spec.job import JobSpec

    job = JobSpec(world_size=2, device="cpu", strategy="ddp", steps=4)
    for runs, expect_replaced in ((6, False), (3, True)):
        _, gate = make_gate(tmp_path, save=True)
        gate.budget = Budget(max_pairs=runs)
        gate.check(job, [fake_run(job, 100 + i % 2) for i in range(runs)])
        landing = gate.finish(test_passed=True)
        assert bool(landing.context.replaced) == expect_replaced
    first = json.loads(open(gate.path).read())  # the file as the second save left it
    replaced = landing.context.replaced
    assert replaced["file"] == os.path.relpath(gate.path, tmp_path) and replaced["dropped"] == []
    assert replaced["was"]["runs"] == {"ddp tiny x2 cpu": 6} and replaced["now"]["runs"] == {"ddp tiny x2 cpu": 3}
    assert replaced["now"]["saved_at"] == first["saved_at"]
    text = landing.context.replaced_text()
    was = replaced["was"]
    assert text == (f"{replaced['file']}: replaced a baseline of 6 runs (saved {was['saved_at']} at commit "
                    f"{(was['git_commit'] or '?')[:12]} on host {was['host'] or '?'}) with 3 runs (saved "
                    f"{first['saved_at']} at commit {(was['git_commit'] or '?')[:12]} on host {was['host'] or '?'}); "
                    f"fewer runs than before (ddp tiny x2 cpu 6 -> 3)")
    assert ("distperf.baseline.replaced", text) in landing.properties
    doc = TestDocument.from_records("t.py::test_x", "passed", 1.0, landing.records, landing.context)
    lines = render([doc])
    # its verdicts against the old baseline are shown, and said not to gate
    assert ("--distperf-save: the saved tests' verdicts compare the runs just saved with the baseline they replace: "
            "shown, not enforced") in lines
    assert lines[-2].startswith("saved baselines that replaced one (1): the old contents are gone from the folder")
    assert lines[-1] == f"  {text}"
    # the JSON report carries it, and reads it back
    back = TestDocument.from_json(json.loads(json.dumps(doc.to_json())))
    assert back.context is not None and back.context.replaced == replaced
    assert GateContext(machine_class="m", machine={}, environment={}).replaced_text() == ""
    # a job the new save no longer holds is named
    other = JobSpec(world_size=2, device="cpu", strategy="ddp", options={"bucket_cap_mb": 1}, steps=4)
    _, gate = make_gate(tmp_path, save=True)
    gate.budget = Budget(max_pairs=3)
    gate.check(other, [fake_run(other, 100) for _ in range(3)])
    landing = gate.finish(test_passed=True)
    assert landing.context.replaced["dropped"] == ["ddp tiny x2 cpu"]
    assert landing.context.replaced_text().endswith(" with 3 runs (saved " + landing.context.replaced["now"][
        "saved_at"] + f" at commit {(was['git_commit'] or '?')[:12]} on host {was['host'] or '?'}); no longer "
        f"holds ddp tiny x2 cpu")


def test_a_saved_baseline_says_what_it_lets_the_gate_decide(tmp_path):
    import warnings

    from pytest_distperf.errors import BaselineNoisyWarning
    from pytest_distperf.decide.stopping import Budget
    from pytest_distperf.spec.job import JobSpec

    job = JobSpec(world_size=2, device="cpu", strategy="ddp", steps=4)
    _, gate = make_gate(tmp_path, save=True)
    gate.budget = Budget(max_pairs=12)
    gate.check(job, [fake_run(job, (99, 100, 101)[i % 3]) for i in range(12)])  # 1 % spread
    with warnings.catch_warnings():
        warnings.simplefilter("error", BaselineNoisyWarning)
        landing = gate.finish(test_passed=True)
    saved = {r.metric: r for r in landing.records if isinstance(r, DetectableChange)}
    # counts are exact: nothing to resolve; on CPU memory is decided on the training state, and host RSS growth,
    # stored beside it, is never decided on: nothing said of it either
    assert set(saved) == {"step_time", "train_memory"}
    stored = json.loads((tmp_path / "baselines" / gate.machine.name / "t--test_x.json").read_text())
    assert {"peak_memory", "train_memory"} <= set(stored["jobs"]["ddp tiny x2 cpu"]["metrics"])
    quiet = saved["step_time"]
    assert quiet.can_pass and 0.05 < quiet.fails_above < 0.08 and quiet.candidate_runs == 12
    assert quiet.file == os.path.relpath(gate.path, tmp_path) and quiet.test == "t.py::test_x"
    from pytest_distperf.decide.verdicts import detectable_changes
    from pytest_distperf.store.baselines import metrics_from_runs
    from pytest_distperf.decide.decision import Design
    assert detectable_changes("j", metrics_from_runs([]), Policy(), Design()) == []  # a job that never ran: nothing said

    # a burst of other load through the save: said when it is saved, with what it costs
    _, gate = make_gate(tmp_path, save=True)
    gate.budget = Budget(max_pairs=6)
    gate.check(job, [fake_run(job, ms) for ms in (100, 180, 95, 300, 110, 100)])
    with pytest.warns(BaselineNoisyWarning, match=r"t.py::test_x: saved .*t--test_x.json, but ddp tiny x2 cpu: "
                      r"step_time recorded over 6 run\(s\), run-to-run 4\d.\d%: against 6 run\(s\) as spread, a "
                      r"change fails above \+\d+.\d%, and an unchanged job cannot pass the \+5.0% limit"):
        landing = gate.finish(test_passed=True)
    noisy = next(r for r in landing.records if isinstance(r, DetectableChange) and r.metric == "step_time")
    assert not noisy.can_pass and noisy.fails_above > 0.5
    lines = "\n".join(render([TestDocument.from_records("t.py::test_x", "passed", 1.0, landing.records)]))
    assert "no baseline yet" not in lines  # it was just saved
    assert re.search(r"test_x +ddp tiny x2 cpu +step_time +6 +4\d.\d% +\+5.0% +\+\d+.\d% +no: interval ×/÷", lines)


# -- a job's verdicts as the reports say them -------------------------------------------------------------------
def test_a_verdict_stopped_by_another_figures_failure_says_so_and_names_no_next_look():
    """A failed figure ends the job's runs: an undecided verdict of the job says it stopped there, never 'next look
    at 6' (no further look runs)."""
    from pytest_distperf.decide.regression import until_job_decided
    from pytest_distperf.decide.stopping import Budget, Clock
    from pytest_distperf.report.undecided import undecided_text

    c = lambda *n: MetricSeries("flops", "lower", "count", list(n))  # noqa: E731
    wall = decide_time([100, 101, 99] * 4, [150])  # one run: too few to bound, next look at 3
    flops = decide_metric("t", "job", "flops_per_step", c(1000), c(1200), Policy())
    assert wall.status == "inconclusive" and wall.next_look and flops.status == "fail"
    assert "next look at" in wall.interval_text()

    def extend() -> None:
        raise AssertionError("no run may start once a figure failed")

    why = until_job_decided(lambda: [wall, flops], lambda: 1, extend, Budget(max_pairs=12), Clock())
    assert why == "flops_per_step failed"
    wall.stopped = flops.stopped = why
    assert wall.interval_text() == "1 run: too few to bound" and "next look" not in undecided_text(wall)
    assert undecided_text(wall).endswith("(1 run: too few to bound; stopped: flops_per_step failed)")
    lines = describe_verdict(wall, Policy())
    assert lines[-1].endswith("; stopped: flops_per_step failed") and "next look" not in "\n".join(lines)
    assert "stopped" not in "\n".join(describe_verdict(flops, Policy()))  # the failed one decided: no stop to say
    # a budget's stop drops the next look too; a decided or still looking verdict keeps it
    wall.stopped = "max 1 run"
    assert "next look" not in wall.interval_text()
    wall.stopped = ""
    assert wall.interval_text().endswith("next look at 3")


def test_a_count_says_the_runs_the_job_had_not_only_the_one_that_counted_it():
    """Counts are measured in a job's first run of a session: the message says so, with the job's real run counts,
    as the what-changed lines under it do ('median of 12 baseline / 3 current runs')."""
    c = lambda *n: MetricSeries("ops", "lower", "count", list(n))  # noqa: E731
    entry = JobEntry("job", "h", {}, {"step_time": time_series([100, 101, 99] * 4), "aten_ops_per_step": c(376)})
    current = {"step_time": time_series([100, 101, 99]), "aten_ops_per_step": c(552)}
    by = {v.metric: v for v in decide_job("t", "job", entry, "h", current, Policy(), "")}
    ops = by["aten_ops_per_step"]
    assert ops.status == "fail" and (ops.baseline_job_runs, ops.current_job_runs) == (12, 3)
    lines = describe_verdict(ops, Policy())
    assert lines[1:3] == ["  baseline 376 (counted in the first of 12 runs)",
                          "  current  552 (counted in the first of 3 runs)"], lines
    assert "(1 run)" not in "\n".join(lines)
    # measured in every run: the candidate's worst, the reference's median
    every = decide_metric("t", "job", "comms.all_reduce.calls_per_step", c(4, 4, 4), c(4, 5, 4), Policy())
    assert describe_verdict(every, Policy())[1:3] == ["  baseline 4 (median of 3 runs)", "  current  5 (worst of 3 runs)"]
    # head vs base: both sides' pairs
    from pytest_distperf.decide.against import decide_pairs
    from pytest_distperf.decide.decision import Design
    from pytest_distperf.rank.results import WorkResult
    from pytest_distperf.spec.job import JobSpec

    job = JobSpec(world_size=2, device="cpu", strategy="ddp", steps=4)

    def run(ms: float, ops: int | None):
        r = fake_run(job, ms)
        for rank in r.ranks:
            rank.work = WorkResult(steps=2, state_bytes=30 * MiB, step_peak_bytes=[MiB] * 2,
                                   aten_ops=[ops] * 2 if ops else None)
        return r

    pairs = [(run(100, 552 if i == 0 else None), run(100, 376 if i == 0 else None)) for i in range(3)]
    [ops] = [v for v in decide_pairs("t", "job", pairs, Policy(), Design()) if v.metric == "aten_ops_per_step"]
    lines = describe_verdict(ops, Policy(), ("base", "head"))
    assert lines[1:3] == ["  base 376 (counted in the first of 3 runs)", "  head 552 (counted in the first of 3 runs)"]


def test_no_baseline_yet_shows_the_nearest_stored_job_and_a_save_command_with_the_machine_class_options(tmp_path):
    """The terminal's 'no baseline yet' section: under the job, the nearest stored job and how it differs; the
    command repeats the options that decide where the baseline goes (world size, device, baselines folder)."""
    from pytest_distperf.decide.policy import GateSettings
    from pytest_distperf.decide.regression import BaselineGate, GateSession
    from pytest_distperf.decide.stopping import Budget
    from pytest_distperf.spec.job import JobSpec

    args = ("--distperf-baselines", "my-baselines", "--distperf-device", "cpu", "--distperf-world-size", "1")
    session = GateSession(GateSettings(str(tmp_path / "baselines"), True, Policy(), accept_args=args), str(tmp_path))
    old = JobSpec(world_size=2, device="cpu", strategy="ddp", options={"bucket_cap_mb": 1}, steps=4)
    gate = BaselineGate(session, "t.py::test_x", "cpu", 2, Policy())
    gate.budget = Budget(max_pairs=3)
    gate.check(old, [fake_run(old, 100) for _ in range(3)])
    gate.finish(test_passed=True)
    session = GateSession(GateSettings(str(tmp_path / "baselines"), False, Policy(), accept_args=args), str(tmp_path))
    new = JobSpec(world_size=2, device="cpu", strategy="ddp", options={"bucket_cap_mb": 2}, steps=4)
    gate = BaselineGate(session, "t.py::test_x", "cpu", 2, Policy())
    gate.check(new, [fake_run(new, 100) for _ in range(3)])
    landing = gate.finish(test_passed=True)
    assert landing.context.save_args == list(args)
    doc = TestDocument.from_records("t.py::test_x", "passed", 1.0, landing.records, landing.context)
    for d in (doc, TestDocument.from_json(json.loads(json.dumps(doc.to_json())))):  # also read back from JSON
        lines = render([d])
        start = lines.index("no baseline yet for 1 job(s); to record one, run the command shown:")
        assert lines[start + 1].endswith(": pytest --distperf --distperf-save --distperf-baselines my-baselines "
                                         "--distperf-device cpu --distperf-world-size 1 t.py::test_x"), lines[start + 1]
        assert lines[start + 2] == ("    this job is not in the baseline; the nearest there, ddp[bucket_cap_mb=1] tiny "
                                    "x2 cpu, differs in: options.bucket_cap_mb 1 -> 2"), lines[start + 2:]


def test_a_stored_figure_not_measured_now_is_said_and_fails_under_require_baseline():
    """Nothing stored is dropped unsaid: a gated figure the baseline holds and this run lacks gets a verdict."""
    entry = JobEntry("job", "h", {}, {"step_time": time_series([100, 101, 99]),
                                      "flops_per_step": MetricSeries("flop", "lower", "count", [1e9])})
    verdicts = decide_job("t", "job", entry, "h", {"step_time": time_series([100, 101, 99])}, Policy(), "")
    [v] = [v for v in verdicts if v.metric == "flops_per_step"]
    assert v.status == "not comparable" and v.current is None and "not measured now" in v.note
    assert not is_failing(v, Policy()) and is_failing(v, Policy(require_baseline=True))
    lines = render([TestDocument.from_records("t.py::test_x", "passed", 1.0, [u.landed(Policy()) for u in verdicts])])
    assert any("not measured now" in line for line in lines)
