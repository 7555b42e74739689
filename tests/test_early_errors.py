"""Errors before the jobs: every path the session will write is checked at configure or collection time, and
the message says what is in the way. No test here starts a job: a test body that ran would say so."""

from __future__ import annotations

import os

import pytest

from pytest_distperf.launch import fingerprint
from pytest_distperf.store.outputs import OutputPathError, check_file, check_folder

BODY = """
import pytest

@pytest.mark.distperf(world_size=2)
def test_x(distperf):
    raise AssertionError("a job would have started here")
"""


def _run(pytester, *args):
    pytester.makepyfile(test_early=BODY)
    result = pytester.runpytest("--distperf", *args, "-p", "no:cacheprovider")
    assert "a job would have started here" not in result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()[-2000:] + result.stderr.str()[-2000:]
    return result


def test_a_file_where_the_machine_class_folder_goes_stops_the_save_before_any_job(pytester):
    machine = fingerprint.machine_class("cpu", 2).name
    (pytester.path / "baselines").mkdir()
    (pytester.path / "baselines" / machine).write_text("not a folder")
    result = _run(pytester, "--distperf-save")
    result.stderr.fnmatch_lines([f"*--distperf-save: baselines of machine class {machine}: "
                                 f"*baselines/{machine} is a file, not a folder*"])


def test_a_file_where_the_baselines_folder_goes_stops_the_save(pytester):
    (pytester.path / "perf").write_text("")
    result = _run(pytester, "--distperf-save", "--distperf-baselines=perf/baselines")
    result.stderr.fnmatch_lines(["*cannot create folder *perf/baselines*perf is a file, not a folder*"])


@pytest.mark.parametrize("option", ["--distperf-json", "--distperf-benchmark-json", "--junitxml"])
def test_a_report_that_cannot_be_written_stops_the_session_before_any_job(pytester, option):
    (pytester.path / "out").write_text("")
    result = _run(pytester, f"{option}=out/report.json")
    result.stderr.fnmatch_lines([f"*{option}: cannot write *out/report.json: *out is a file, not a folder*"])


def test_a_folder_given_as_a_report_file_is_named(pytester):
    (pytester.path / "reports").mkdir()
    result = _run(pytester, "--distperf-json=reports")
    result.stderr.fnmatch_lines(["*--distperf-json: *reports is a folder; give a file path*"])


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder: the check rightly passes")
def test_a_read_only_folder_is_named_with_its_mode(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        with pytest.raises(OutputPathError, match=r"folder .*ro is not writable \(permission denied \(mode 0555"):
            check_file(str(folder / "report.json"), "--distperf-json")
        with pytest.raises(OutputPathError, match="mode 0555"):
            check_folder(str(folder / "cpu-x"), "--distperf-save")
    finally:
        folder.chmod(0o755)


def test_paths_that_can_be_written_pass_and_nothing_is_left_behind(tmp_path):
    check_file(str(tmp_path / "new" / "deeper" / "report.json"), "--distperf-json")
    check_folder(str(tmp_path / "baselines" / "cpu-x"), "--distperf-save")
    assert sorted(os.listdir(tmp_path)) == []  # the checks create nothing that stays


def test_a_folder_that_refuses_writes_its_mode_allows_is_not_blamed_on_its_mode(tmp_path, monkeypatch):
    # what an immutable folder (chattr +i) gives: EPERM while the mode grants writing
    import errno
    import tempfile

    def refuse(*args, **kwargs):
        raise PermissionError(errno.EPERM, "Operation not permitted")
    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    with pytest.raises(OutputPathError, match=r"operation not permitted, though mode 07\d\d, .* allows writing: "
                                              r"the folder may be immutable \(`lsattr -d "):
        check_file(str(tmp_path / "report.json"), "--distperf-json")


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc")
def test_a_folder_whose_file_system_makes_no_files_is_named_as_such():
    with pytest.raises(OutputPathError, match=r"folder /proc is not writable \(its file system creates no files there"):
        check_file("/proc/report.json", "--distperf-json")
