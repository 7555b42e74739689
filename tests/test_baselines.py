"""The baseline store: files, format version, bad input, concurrent writers, and --distperf-save end to end.

Store-level tests call baseline.py directly; the end-to-end ones run inner pytest sessions with real
2-rank CPU jobs (ddp on the tiny shape, few steps).
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os

import pytest

from pytest_distperf.launch import fingerprint
from pytest_distperf.fs import jsonio
from pytest_distperf.store.baselines import (FORMAT, BaselineError, BaselineFile, BaselineReplaceable, JobEntry,
                                             MetricSeries, Store, file_name_for, read_json, write_json_atomic)

# Saving records each job up to the adaptive budget (--distperf-max-repeats); 3 keeps these tests quick.
INNER_OPTS = ("--distperf", "-p", "no:cacheprovider", "--distperf-max-repeats", "3")


@pytest.fixture(autouse=True)
def _no_job_summary(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)  # inner sessions must not write to a CI summary


def machine_dir() -> str:
    return fingerprint.machine_class("cpu", 2).name


def sample_file(test: str = "perf/test_x.py::test_a", runs: tuple[float, ...] = (0.10, 0.11, 0.105)) -> BaselineFile:
    metrics = {
        "step_time": MetricSeries("s", "lower", "time", list(runs), [[r, r * 1.01] for r in runs]),
        "peak_memory": MetricSeries("bytes", "lower", "memory", [1e9, 1.01e9, 1e9]),
    }
    job = JobEntry("ddp tiny x2 cpu", "abcdef0123456789", {"strategy": "ddp", "steps": 5}, metrics)
    return BaselineFile(test=test, machine_class="cpu-test-2core-1node-ws2", machine={"device": "cpu"},
                        environment={"torch": "2.0"}, saved_at="2025-01-01T00:00:00+00:00",
                        jobs={job.label: job})


def digest(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


# -- store ------------------------------------------------------------------------------------------------------
def test_save_and_load_round_trip_with_sorted_keys_and_schema(tmp_path):
    store = Store(str(tmp_path))
    doc = sample_file()
    path = store.save(doc)
    assert path == os.path.join(str(tmp_path), "cpu-test-2core-1node-ws2", "perf.test_x--test_a.json")
    text = open(path).read()
    raw = json.loads(text)
    assert raw["format_version"] == FORMAT.version == 1
    assert text == json.dumps(raw, sort_keys=True, indent=2, ensure_ascii=False) + "\n"  # sorted keys, stable
    m = raw["jobs"]["ddp tiny x2 cpu"]["metrics"]["step_time"]
    assert (m["unit"], m["direction"], m["kind"]) == ("s", "lower", "time")
    assert m["runs"] == [0.10, 0.11, 0.105] and len(m["samples"]) == 3  # run-level summaries + raw steps
    loaded = store.load(path, "perf/test_x.py::test_a")
    assert loaded is not None
    assert loaded.jobs["ddp tiny x2 cpu"].metrics["step_time"].runs == [0.10, 0.11, 0.105]
    assert loaded.jobs["ddp tiny x2 cpu"].config_hash == "abcdef0123456789"
    assert store.load(store.path_for("cpu-test-2core-1node-ws2", "perf/test_x.py::test_b"), "x") is None


def test_file_names_are_readable_and_do_not_collide():
    assert file_name_for("perf_tests/test_zero3.py::test_step") == "perf_tests.test_zero3--test_step.json"
    a, b = file_name_for("t.py::test_p[a/b]"), file_name_for("t.py::test_p[a_b]")
    assert a != b and a.startswith("t--test_p_a_b") and "/" not in a


def test_an_older_file_is_brought_up_to_date_when_read_and_the_file_left_alone(tmp_path, monkeypatch):
    """The one upgrade mechanism (fs/jsonio.Format): a fake update_to_2 runs on a version-1 file, in memory."""
    def update_to_2(doc: dict) -> dict:
        job = doc["jobs"]["ddp tiny x2 cpu"]
        job["metrics"] = {("step_time" if k == "step" else k): m for k, m in job["metrics"].items()}
        return doc

    monkeypatch.setattr(FORMAT, "version", 2)
    monkeypatch.setattr(FORMAT, "updates", {2: update_to_2})
    path = tmp_path / "cpu-test-2core-1node-ws2" / "t--test_a.json"  # its machine class's folder
    path.parent.mkdir()
    old = sample_file("t.py::test_a").to_dict()
    old["format_version"] = 1
    metrics = old["jobs"]["ddp tiny x2 cpu"]["metrics"]
    metrics["step"] = metrics.pop("step_time")
    path.write_text(json.dumps(old))
    before = digest(str(path))
    doc = Store(str(tmp_path)).load(str(path), "t.py::test_a")
    assert doc is not None and doc.jobs["ddp tiny x2 cpu"].metrics["step_time"].runs == [0.10, 0.11, 0.105]
    assert digest(str(path)) == before


def test_the_one_format_version_rule():
    """Every file written through jsonio carries format_version; a newer one is refused naming both versions."""
    fmt = jsonio.Format("thing")
    assert fmt.load({"format_version": 1, "a": 1}, "f.json") == {"format_version": 1, "a": 1}
    with pytest.raises(jsonio.FormatVersionError, match=r"f.json: thing format version 2 is newer than the "
                                                        r"version 1 this pytest-distperf reads"):
        fmt.load({"format_version": 2}, "f.json")
    for bad in (None, "1", True, 0):
        with pytest.raises(jsonio.CorruptFileError, match="f.json: not a distperf thing"):
            fmt.load({"format_version": bad}, "f.json")
    fmt.version = 3
    fmt.updates[2] = lambda d: {**d, "steps": ["two"]}  # update_to_2
    fmt.updates[3] = lambda d: {**d, "steps": d["steps"] + ["three"]}  # update_to_3
    assert fmt.load({"format_version": 1}, "f.json") == {"format_version": 3, "steps": ["two", "three"]}
    assert fmt.load({"format_version": 2, "steps": []}, "f.json")["steps"] == ["three"]


def test_every_json_file_written_carries_its_format_version(tmp_path):
    jsonio.write_json_atomic(str(tmp_path / "a.json"), {"a": 1})
    jsonio.write_json_atomic(str(tmp_path / "b.json"), {"format_version": 2, "b": 1})
    assert jsonio.read_json(str(tmp_path / "a.json")) == {"format_version": 1, "a": 1}
    assert jsonio.read_json(str(tmp_path / "b.json"))["format_version"] == 2


BAD_FILES = {
    "corrupt": (b'{"format_version": 1, "test": x}', "corrupt (not valid JSON"),
    "truncated": (json.dumps(sample_file("t.py::test_a").to_dict(), indent=2).encode()[:-40], "truncated"),
    "empty": (b"", "truncated (the file is empty)"),
    "not_utf8": (b'{"a": "\xff\xfe"}', "corrupt (not UTF-8"),
    "wrong_type": (json.dumps({**sample_file("t.py::test_a").to_dict(), "jobs": []}).encode(),
                   "wrong type at jobs: expected an object, got list"),
    "wrong_runs": (json.dumps(sample_file("t.py::test_a").to_dict()).replace("[0.1, 0.11, 0.105]", '"fast"').encode(),
                   "wrong type at jobs['ddp tiny x2 cpu'].metrics['step_time'].runs"),
    "newer": (json.dumps({**sample_file("t.py::test_a").to_dict(), "format_version": FORMAT.version + 1}).encode(),
              f"baseline format version {FORMAT.version + 1} is newer than the version {FORMAT.version}"),
    "no_schema": (b'{"jobs": {}}', "not a distperf baseline"),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_a_bad_file_gives_a_clear_error_naming_it_and_stays_byte_identical(tmp_path, case):
    data, expected = BAD_FILES[case]
    path = tmp_path / "m" / "t--test_a.json"
    path.parent.mkdir()
    path.write_bytes(data)
    with pytest.raises(BaselineError) as e:
        Store(str(tmp_path)).load(str(path), "t.py::test_a")
    assert str(path) in str(e.value) and expected in str(e.value)
    assert path.read_bytes() == data


def test_unwritable_folder_gives_a_clear_error(tmp_path):
    blocker = tmp_path / "afile"
    blocker.write_text("not a folder")
    with pytest.raises(BaselineError, match="afile is a file, not a folder"):
        Store(str(blocker)).check_writable()
    with pytest.raises(BaselineError, match=r"cannot create folder .*afile/sub: .*afile is a file, not a folder"):
        Store(str(blocker / "sub")).check_writable()
    with pytest.raises(BaselineError, match=r"machine class cpu-x: .*cpu-x is a file, not a folder"):
        (tmp_path / "baselines").mkdir()
        (tmp_path / "baselines" / "cpu-x").write_text("")
        Store(str(tmp_path / "baselines")).check_writable(["cpu-x"])
    with pytest.raises(BaselineError, match="cannot create folder"):
        write_json_atomic(str(blocker / "sub" / "x.json"), {"a": 1})
    assert blocker.read_text() == "not a folder"


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores folder permissions")
def test_read_only_folder_gives_a_clear_error(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        with pytest.raises(BaselineError, match="not writable"):
            Store(str(ro)).check_writable()
    finally:
        ro.chmod(0o700)


def test_non_finite_numbers_are_refused_before_touching_the_file(tmp_path):
    path = tmp_path / "x.json"
    path.write_text("{}\n")
    with pytest.raises(BaselineError, match="non-finite"):
        write_json_atomic(str(path), {"a": float("nan")})
    assert path.read_text() == "{}\n"


def _writer(root: str, worker: int, n: int) -> None:
    store = Store(root)
    for i in range(n):
        store.save(sample_file(f"t.py::test_{worker}_{i}", runs=(0.1 + worker, 0.1 + i, 0.1)))
        # ... and everyone rewrites one shared test's file, so writers also race on the same path
        store.save(sample_file("t.py::test_shared", runs=(float(worker + 1), float(i + 1), 1.0)))


def test_concurrent_writers_lose_nothing_and_never_tear_a_file(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), w, 6)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    store = Store(str(tmp_path))
    for w in range(4):
        for i in range(6):
            doc = store.load(store.path_for("cpu-test-2core-1node-ws2", f"t.py::test_{w}_{i}"), f"t.py::test_{w}_{i}")
            assert doc is not None and doc.jobs["ddp tiny x2 cpu"].metrics["step_time"].runs[:2] == [0.1 + w, 0.1 + i]
    shared = store.load(store.path_for("cpu-test-2core-1node-ws2", "t.py::test_shared"), "t.py::test_shared")
    assert shared is not None  # complete and valid: one writer's version, not a mix
    leftovers = [f for f in os.listdir(tmp_path / "cpu-test-2core-1node-ws2") if f.endswith(".tmp")]
    assert leftovers == []


# -- end to end: --distperf-save --------------------------------------------------------------------------------
PERF_TEST = """
import os
import pytest

@pytest.mark.distperf(world_size=2)
def test_ddp(distperf):
    distperf.measure("ddp", repeats=int(os.environ.get("DP_REPEATS", "3")), steps=6, warmup=2)
"""


@pytest.mark.slow
def test_save_then_compare_round_trip_a_a_passes(pytester: pytest.Pytester):
    pytester.makepyfile(test_perf=PERF_TEST)
    saved = pytester.runpytest(*INNER_OPTS, "--distperf-save", "--distperf-json", "saved.json")
    saved.assert_outcomes(passed=1)
    path = pytester.path / "baselines" / machine_dir() / "test_perf--test_ddp.json"
    # what the file lets the gate decide is said as it is saved, not "no baseline yet"
    saved.stdout.fnmatch_lines(["saved baselines: what each lets the gate decide*",
                                "test_ddp*ddp tiny x2 cpu*step_time*3*+5.0%*"])
    assert "no baseline yet" not in saved.stdout.str()
    [resolution] = [r for r in json.loads((pytester.path / "saved.json").read_text())["tests"][0]["baseline_saved"]
                    if r["metric"] == "step_time"]
    assert resolution["runs"] == 3 and resolution["file"].endswith("test_perf--test_ddp.json")
    doc = json.loads(path.read_text())
    assert doc["test"] == "test_perf.py::test_ddp" and doc["machine_class"] == machine_dir()
    assert doc["machine"]["device"] == "cpu" and doc["environment"]["torch"]
    job = doc["jobs"]["ddp tiny x2 cpu"]
    assert set(job["metrics"]) >= {"step_time", "peak_memory", "optimizer_state_bytes"}
    assert len(job["metrics"]["step_time"]["runs"]) == 3 and len(job["metrics"]["step_time"]["samples"][0]) == 6
    before = digest(str(path))

    # A/A: the same code again is compared against the file and passes; the file is not rewritten
    again = pytester.runpytest(*INNER_OPTS, "-v", "--distperf-json", "report.json")
    again.assert_outcomes(passed=1)
    assert digest(str(path)) == before
    verdicts = {v["metric"]: v for v in json.loads((pytester.path / "report.json").read_text())["tests"][0]["verdicts"]}
    assert verdicts["optimizer_state_bytes"]["status"] == "pass"  # exact count, same code
    # The same code never fails the gate. It may read as "improved": run-to-run variation on the 2-core CI box is
    # ~10 % (benchmarks/noise_floor.py); an improvement is reported, and fails only with
    # distperf_fail_on_improvement.
    # A decision needs its interval to clear the 5 % floor; 3 runs a side on a noisy box mostly stay inconclusive.
    assert not verdicts["step_time"]["fails"]
    assert verdicts["step_time"]["status"] in ("pass", "inconclusive", "improved")
    assert verdicts["step_time"]["baseline_runs"] == 3
    again.stdout.fnmatch_lines(["*test_ddp*ddp tiny x2 cpu*step_time*"])


SUBSET_TESTS = """
import pytest

@pytest.mark.distperf(world_size=2)
def test_a(distperf):
    distperf.measure("ddp", repeats=1, steps=3, warmup=1)

@pytest.mark.distperf(world_size=2)
@pytest.mark.other
def test_b(distperf):
    distperf.measure("ddp", repeats=1, steps=4, warmup=1)
"""


@pytest.mark.slow
def test_subset_save_updates_only_the_tests_that_ran(pytester: pytest.Pytester, saved_ddp_baseline):
    pytester.makepyfile(test_sub=SUBSET_TESTS)
    pytester.makeini("[pytest]\nmarkers =\n    other: a marker\n")
    files_only = ("--distperf-max-repeats=2",)  # the test is about which files are written, not their figures
    # both tests' baselines, as a save of them would have left them: the session's real save of a DDP job
    # (tests/conftest.py), under these tests' names
    a = saved_ddp_baseline.copy_to(pytester.path, "test_sub.py::test_a")
    b = saved_ddp_baseline.copy_to(pytester.path, "test_sub.py::test_b")
    folder = pytester.path / "baselines" / machine_dir()
    assert (a, b) == (folder / "test_sub--test_a.json", folder / "test_sub--test_b.json")
    unrelated = folder / "elsewhere--test_z.json"
    unrelated.write_text(json.dumps(sample_file("elsewhere.py::test_z").to_dict()))
    b_before, z_before, a_before = digest(str(b)), digest(str(unrelated)), digest(str(a))

    result = pytester.runpytest(*INNER_OPTS, *files_only, "--distperf-save", "-m", "not other")
    result.assert_outcomes(passed=1, deselected=1)
    assert digest(str(b)) == b_before and digest(str(unrelated)) == z_before
    assert digest(str(a)) != a_before  # re-saved from this run's measurements
    assert json.loads(a.read_text())["jobs"]["ddp tiny x2 cpu"]["config"]["steps"] == 3


@pytest.mark.slow
def test_a_failing_test_is_not_saved(pytester: pytest.Pytester):
    pytester.makepyfile(test_fail="""
import pytest

@pytest.mark.distperf(world_size=2)
def test_fails(distperf):
    distperf.measure("ddp", repeats=1, steps=2, warmup=1)
    assert False, "the test's own check failed"
""")
    pytester.runpytest(*INNER_OPTS, "--distperf-save").assert_outcomes(failed=1)
    assert not (pytester.path / "baselines" / machine_dir() / "test_fail--test_fails.json").exists()


XDIST_TESTS = "import pytest\n" + "".join(f"""
@pytest.mark.distperf(world_size=2)
def test_{i}(distperf):
    distperf.measure("ddp", repeats=1, steps=2, warmup=1, seed={i})
""" for i in range(4))


@pytest.mark.slow
def test_xdist_saving_loses_nothing(pytester: pytest.Pytester):
    pytester.makepyfile(test_par=XDIST_TESTS)
    folder = pytester.path / "baselines" / machine_dir()
    folder.mkdir(parents=True)
    keep = folder / "other--test_keep.json"
    keep.write_text(json.dumps(sample_file("other.py::test_keep").to_dict()))
    keep_before = digest(str(keep))
    # two runs a job (the least a baseline may hold): the test is about files, not figures
    result = pytester.runpytest_subprocess(*INNER_OPTS, "-n", "2", "--distperf-save", "--distperf-max-repeats=2")
    result.assert_outcomes(passed=4)
    for i in range(4):
        doc = json.loads((folder / f"test_par--test_{i}.json").read_text())
        assert doc["jobs"]["ddp tiny x2 cpu"]["config"]["seed"] == i
    assert digest(str(keep)) == keep_before
    assert sorted(f for f in os.listdir(folder) if f.endswith(".json")) == [
        "other--test_keep.json", *[f"test_par--test_{i}.json" for i in range(4)]]


BAD_FILE_TESTS = "import pytest\n" + "".join(f"""
@pytest.mark.distperf(world_size=2)
def test_{name}(distperf):
    distperf.measure("ddp", repeats=1, steps=2, warmup=1)
""" for name in ("corrupt", "truncated", "wrong_type", "newer"))


def test_bad_baseline_files_fail_their_tests_before_any_job_and_stay_byte_identical(pytester: pytest.Pytester):
    pytester.makepyfile(test_bad=BAD_FILE_TESTS)
    folder = pytester.path / "baselines" / machine_dir()
    folder.mkdir(parents=True)
    files = {}
    for case in ("corrupt", "truncated", "wrong_type", "newer"):
        data = BAD_FILES[case][0].replace(b"t.py::test_a", f"test_bad.py::test_{case}".encode())
        files[case] = folder / f"test_bad--test_{case}.json"
        files[case].write_bytes(data)
    # (--distperf-save moves an unusable file aside and writes a new one: tests/test_security.py)
    result = pytester.runpytest(*INNER_OPTS)
    result.assert_outcomes(errors=4)
    # the errors' sections, before the short summary (which repeats each message, whole where CI is set)
    out = result.stdout.str().split("short test summary info")[0]
    assert "During handling of the above exception" not in out  # the error once, not chained to itself
    for case, path in files.items():
        result.stdout.fnmatch_lines([f"*distperf baseline: {path}: *{BAD_FILES[case][1][:20]}*"])
        assert out.count(f"{path}: ") == 1
        assert path.read_bytes() == BAD_FILES[case][0].replace(b"t.py::test_a", f"test_bad.py::test_{case}".encode())
    assert "ddp tiny x2 cpu  1x2" not in result.stdout.str()  # no job ran


def test_unusable_baselines_option_is_a_usage_error(pytester: pytest.Pytester):
    pytester.makepyfile(test_perf=PERF_TEST)
    (pytester.path / "afile").write_text("x")
    result = pytester.runpytest(*INNER_OPTS, "--distperf-save", "--distperf-baselines", "afile")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--distperf-baselines: *afile exists and is not a folder*"])
    result = pytester.runpytest(*INNER_OPTS, "--distperf-save", "--distperf-baselines", "afile/sub")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*baselines folder: cannot create folder *afile/sub: *afile is a file, not a folder*"])
    result = pytester.runpytest("-p", "no:cacheprovider", "--distperf-save")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--distperf-save needs --distperf*"])


@pytest.mark.slow
def test_ini_option_sets_the_baselines_folder(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch):
    pytester.makepyfile(test_perf=PERF_TEST)
    pytester.makeini("[pytest]\ndistperf_baselines = perf/baselines\n")
    monkeypatch.setenv("DP_REPEATS", "1")
    pytester.runpytest(*INNER_OPTS, "--distperf-save").assert_outcomes(passed=1)
    assert (pytester.path / "perf" / "baselines" / machine_dir() / "test_perf--test_ddp.json").is_file()


def test_machine_class_name_is_readable():
    m = fingerprint.MachineClass("cuda", "NVIDIA H200", 2, 1, 2, "nvlink")
    assert m.name == "cuda-nvidia-h200-2gpu-nvlink-1node-ws2"
    c = fingerprint.MachineClass("cpu", "Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz", 2, 1, 2, "none")
    assert c.name == "cpu-intel-xeon-platinum-8375c-2core-1node-ws2"
    here = fingerprint.machine_class("cpu", 2)
    assert here.count == len(os.sched_getaffinity(0)) and here.device == "cpu"
    diffs = fingerprint.soft_differences({"torch": "2.5", "host": "a"}, {"torch": "2.6", "host": "b"})
    assert diffs == ["torch 2.5 -> 2.6"]  # host and commit are context, not warned about


def test_read_json_never_writes(tmp_path):
    p = tmp_path / "x.json"
    p.write_bytes(b"[1, 2")
    with pytest.raises(BaselineError, match="truncated"):
        read_json(str(p))
    assert p.read_bytes() == b"[1, 2"


# -- what picks the decision rule is checked, not taken on the file's word ----------------------------------------
def _saved_file(tmp_path, edit) -> tuple[Store, str, bytes]:
    """sample_file saved in its machine class's folder, its parsed document changed by `edit`, written back."""
    store = Store(str(tmp_path))
    path = store.save(sample_file("t.py::test_a"))
    doc = json.loads(open(path).read())
    edit(doc)
    data = json.dumps(doc).encode()
    with open(path, "wb") as f:
        f.write(data)
    return store, path, data


def _metric(doc: dict, name: str) -> dict:
    return doc["jobs"]["ddp tiny x2 cpu"]["metrics"][name]


@pytest.mark.parametrize("metric, field, value", [("step_time", "kind", "memory"), ("step_time", "direction", "higher"),
                                                  ("peak_memory", "kind", "count"), ("step_time", "kind", "count")])
def test_an_edited_kind_or_direction_of_a_known_metric_is_refused_naming_the_file(tmp_path, metric, field, value):
    """`step_time.kind = "memory"` made an 800x slowdown pass (the memory rule): the definition decides."""
    store, path, data = _saved_file(tmp_path, lambda doc: _metric(doc, metric).update({field: value}))
    with pytest.raises(BaselineReplaceable) as e:
        store.load(path, "t.py::test_a")
    assert str(e.value).startswith(f"{path}: jobs['ddp tiny x2 cpu'].metrics['{metric}'].{field} is '{value}'")
    assert "the file was edited" in str(e.value) and "--distperf-save writes a new one" in str(e.value)
    assert open(path, "rb").read() == data  # left byte-identical


def test_comms_counts_keep_their_definition_and_an_unknown_metric_its_stored_traits(tmp_path):
    def edit(doc):
        metrics = doc["jobs"]["ddp tiny x2 cpu"]["metrics"]
        metrics["comms.all_gather.calls_per_step"] = {**_metric(doc, "peak_memory"), "unit": "calls", "kind": "time"}
        metrics["someone_elses_metric"] = {**_metric(doc, "peak_memory"), "direction": "higher"}

    store, path, _ = _saved_file(tmp_path, edit)
    with pytest.raises(BaselineReplaceable, match=r"comms.all_gather.calls_per_step'\]\.kind is 'time', but "
                                                  r"comms.all_gather.calls_per_step is a count metric"):
        store.load(path, "t.py::test_a")
    store, path, _ = _saved_file(tmp_path, lambda doc: edit(doc) or _metric(doc, "comms.all_gather.calls_per_step")
                                 .update(kind="count"))
    loaded = store.load(path, "t.py::test_a")
    assert loaded is not None and loaded.jobs["ddp tiny x2 cpu"].metrics["someone_elses_metric"].direction == "higher"


def test_a_file_naming_another_machine_class_than_its_folder_is_refused(tmp_path):
    other = "cuda-nvidia-h200-8gpu-nvlink-1node-ws8"
    store, path, data = _saved_file(tmp_path, lambda doc: doc.update(machine_class=other))
    with pytest.raises(BaselineReplaceable) as e:
        store.load(path, "t.py::test_a")
    assert str(e.value) == (f"{path}: holds the baseline of machine class 'cuda-nvidia-h200-8gpu-nvlink-1node-ws8', "
                            f"but sits in the folder of 'cpu-test-2core-1node-ws2'; the file was copied or moved -- "
                            f"move it to its machine class's folder or delete it")
    assert open(path, "rb").read() == data


def test_a_truncated_baseline_says_where_its_json_ends(tmp_path):
    """json's message alone ends mid-phrase ("Unterminated string starting at"); its position completes it."""
    path = tmp_path / "m" / "t--test_a.json"
    path.parent.mkdir()
    path.write_bytes(b'{"format_version": 1, "test": "t.py::te')
    with pytest.raises(BaselineError) as e:
        Store(str(tmp_path)).load(str(path), "t.py::test_a")
    assert str(e.value) == (f"{path}: truncated (the JSON ends at byte 39 before it is complete: Unterminated string "
                            f"starting at line 1 column 31 (char 30))")
    path.write_bytes(b'{"format_version": 1,\n "test": x}')
    with pytest.raises(BaselineError, match=r"corrupt \(not valid JSON: Expecting value at line 2 column 10 "
                                            r"\(char 31\)\)"):
        Store(str(tmp_path)).load(str(path), "t.py::test_a")


def test_a_merge_conflicted_baseline_says_so_and_where(tmp_path):
    """JSON's own error points at line 9 without saying that a merge left its markers there."""
    path = tmp_path / "m" / "t--test_a.json"
    path.parent.mkdir()
    lines = json.dumps(sample_file("t.py::test_a").to_dict(), indent=2, sort_keys=True).splitlines()
    at = next(i for i, line in enumerate(lines) if '"torch"' in line)
    ours, theirs = ["<<<<<<< HEAD", lines[at], "======="], ['    "torch": "2.1"', ">>>>>>> feature"]
    conflicted = lines[:at] + ours + theirs + lines[at + 1:]
    path.write_text("\n".join(conflicted) + "\n")
    with pytest.raises(BaselineReplaceable) as e:
        Store(str(tmp_path)).load(str(path), "t.py::test_a")
    assert str(e.value).startswith(f"{path}: corrupt (not valid JSON: ")
    assert f"; contains git merge-conflict markers (line {at + 1}): resolve the conflict" in str(e.value)
    path.write_text('{"format_version": 1,\n "test": x}')  # no markers: no hint; a '=' inside a line is none either
    with pytest.raises(BaselineError) as e:
        Store(str(tmp_path)).load(str(path), "t.py::test_a")
    assert "merge-conflict" not in str(e.value)
    path.write_text('{"a":\n  "=======" x}')
    with pytest.raises(jsonio.CorruptFileError) as e:
        jsonio.read_json(str(path))
    assert "merge-conflict" not in str(e.value)


def test_a_save_over_a_usable_baseline_returns_what_it_replaced(tmp_path):
    """Saved.replaced is read under the lock the write holds: what is reported replaced is what was replaced."""
    store = Store(str(tmp_path))
    first = sample_file("t.py::test_a", runs=(0.1, 0.11, 0.105, 0.1, 0.1, 0.1))
    first.environment = {"git_commit": "a" * 40, "host": "box1"}
    saved = store.save_over(first)
    assert saved.replaced is None and saved.aside is None and saved.written is first
    second = sample_file("t.py::test_a", runs=(0.2, 0.21, 0.2))
    second.saved_at, second.environment = "2025-02-01T00:00:00+00:00", {"git_commit": "b" * 40, "host": "box2"}
    saved = store.save_over(second)
    assert saved.path == first_path(store) and saved.replaced is not None and saved.aside is None
    assert saved.replaced.provenance() == {"saved_at": "2025-01-01T00:00:00+00:00", "git_commit": "a" * 40,
                                           "host": "box1", "runs": {"ddp tiny x2 cpu": 6}}
    assert store.load(saved.path, "t.py::test_a").jobs["ddp tiny x2 cpu"].runs == 3  # type: ignore[union-attr]
    # an unusable file there is moved aside (never deleted), with why
    with open(saved.path, "w") as f:
        f.write("{")
    saved = store.save_over(first)
    assert saved.replaced is None and saved.aside and "truncated" in (saved.unusable or "")
    assert open(saved.aside).read() == "{" and store.load(saved.path, "t.py::test_a") is not None


def first_path(store: Store) -> str:
    return store.path_for("cpu-test-2core-1node-ws2", "t.py::test_a")


def test_a_script_jobs_file_hash_is_kept_beside_its_config_and_the_config_diff_names_fields(tmp_path):
    store = Store(str(tmp_path))
    doc = sample_file("t.py::test_a")
    job = doc.jobs["ddp tiny x2 cpu"]
    job.script_sha256 = "f" * 64
    loaded = store.load(store.save(doc), "t.py::test_a")
    assert loaded is not None and loaded.jobs["ddp tiny x2 cpu"].script_sha256 == "f" * 64
    assert "script_sha256" not in JobEntry("j", "h", {}, {}).to_dict()  # not a script job: the format as before
    raw = json.loads(open(first_path(store)).read())
    raw["jobs"]["ddp tiny x2 cpu"]["script_sha256"] = 7
    with open(first_path(store), "w") as f:
        json.dump(raw, f)
    with pytest.raises(BaselineError, match=r"at jobs\['ddp tiny x2 cpu'\].script_sha256: expected a string"):
        store.load(first_path(store), "t.py::test_a")
    # what differs, by field, old -> new; nested fields by their path; long values shortened
    stored = JobEntry("j", "h", {"steps": 8, "script": {"args": ["--steps", "200"], "name": "s.py"}}, {})
    assert stored.config_changes({"steps": 16, "script": {"args": ["--steps", "200", "--hidden", "64"],
                                                           "name": "s.py"}, "probes": ["comms"]}) == [
        'probes (unset) -> ["comms"]', 'script.args ["--steps", "200"] -> ["--steps", "200", "--hidden", "64"]',
        "steps 8 -> 16"]
    [long] = stored.config_changes({"steps": 8, "script": {"args": ["x" * 50], "name": "s.py"}})
    assert long.endswith('-> ["' + 'x' * 35 + '...')
    assert JobEntry("j", "h", {}, {}).config_changes({"steps": 8}) == []  # an old entry without its config


def test_readme_states_the_format_versions_the_code_reads():
    """README promised baselines at "schema 3", history at "schema 4" and migrations of older schemas; the code
    reads format version 1 of both, through one upgrade mechanism (fs/jsonio.Format)."""
    from pytest_distperf.store.history.schema import HISTORY

    with open(os.path.join(os.path.dirname(os.path.dirname(__file__)), "README.md"), encoding="utf-8") as f:
        readme = f.read()
    assert FORMAT.version == HISTORY.version == 1
    assert "schema 2" not in readme and "schema 3" not in readme and "schema 4" not in readme
    assert "migrated" not in readme
    assert "`format_version` 1 is the only version there is so far" in readme
    assert "version 1, the only one so far" in readme


# -- a baseline saved from a dirty tree; keys of jobs that once shared a label ----------------------------------------
def test_a_baseline_saved_from_uncommitted_code_says_so_and_an_old_file_reads_as_before(tmp_path):
    """git_dirty/git_dirty_files are optional environment fields (format version 1 still): an old file, without
    them, reads as the plain commit it always named; a dirty one is named '+ uncommitted changes'."""
    store = Store(str(tmp_path))
    doc = sample_file("t.py::test_a")
    doc.environment = {"git_commit": "c" * 40, "git_dirty": True, "git_dirty_files": 3, "host": "box"}
    path = store.save(doc)
    raw = json.loads(open(path).read())
    assert raw["format_version"] == 1 and raw["environment"]["git_dirty"] is True
    loaded = store.load(path, "t.py::test_a")
    assert loaded.provenance()["git_dirty"] is True and loaded.provenance()["git_dirty_files"] == 3
    assert fingerprint.commit_text(loaded.environment) == "c" * 12 + " + uncommitted changes"
    assert fingerprint.commit_text(loaded.provenance()) == "c" * 12 + " + uncommitted changes"
    old = sample_file("t.py::test_b")
    old.environment = {"git_commit": "d" * 40, "host": "box"}  # written before the flag existed
    loaded = store.load(store.save(old), "t.py::test_b")
    assert "git_dirty" not in loaded.provenance() and fingerprint.commit_text(loaded.provenance()) == "d" * 12

