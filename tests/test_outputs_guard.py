"""No output replaces another: two report options naming one file, a report inside the baselines folder or over
the --distperf-history database is a usage error before the first job, naming both (store/outputs.check_apart).
No test here starts a job: a test body that ran would say so."""

from __future__ import annotations

import os

import pytest

from pytest_distperf.launch import fingerprint
from pytest_distperf.store.outputs import OutputPathError, check_apart

BODY = """
import pytest

@pytest.mark.distperf(world_size=2)
def test_x(distperf):
    raise AssertionError("a job would have started here")
"""


@pytest.fixture(autouse=True)
def _no_job_summary(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)  # inner sessions must not write to a CI summary


def _refused(pytester: pytest.Pytester, *args: str, enabled: bool = True) -> pytest.RunResult:
    pytester.makepyfile(test_early=BODY)
    result = pytester.runpytest(*(["--distperf"] if enabled else []), *args, "-p", "no:cacheprovider")
    out = result.stdout.str() + result.stderr.str()
    assert "a job would have started here" not in out
    assert result.ret == pytest.ExitCode.USAGE_ERROR, out[-3000:]
    return result


def test_a_report_over_a_stored_baseline_is_refused_and_the_baseline_kept(pytester: pytest.Pytester):
    machine = fingerprint.machine_class("cpu", 2).name
    baseline = pytester.path / "baselines" / machine / "test_early--test_x.json"
    baseline.parent.mkdir(parents=True)
    baseline.write_text('{"format_version": 1}')
    result = _refused(pytester, f"--distperf-json=baselines/{machine}/test_early--test_x.json")
    result.stderr.fnmatch_lines([f"*distperf: --distperf-json: {baseline} lies inside the baselines folder "
                                 f"{pytester.path / 'baselines'} (the default; --distperf-baselines moves it)*"])
    assert baseline.read_text() == '{"format_version": 1}'


@pytest.mark.parametrize("option", ["--distperf-html", "--distperf-pr-comment", "--distperf-benchmark-json",
                                    "--junitxml"])
def test_any_report_inside_a_given_baselines_folder_is_refused(pytester: pytest.Pytester, option):
    result = _refused(pytester, "--distperf-baselines=perf/bl", f"{option}=perf/bl/new/report.out")
    result.stderr.fnmatch_lines([f"*distperf: {option}: {pytester.path}/perf/bl/new/report.out lies inside the "
                                 f"baselines folder {pytester.path}/perf/bl (--distperf-baselines)*"])
    assert not (pytester.path / "perf").exists()


@pytest.mark.parametrize("enabled", [True, False])
def test_a_report_over_the_history_database_is_refused(pytester: pytest.Pytester, enabled):
    """Also without --distperf: the JSON report is written all the same."""
    pytest.importorskip("sqlalchemy")
    db = pytester.path / "hist.db"
    result = _refused(pytester, "--distperf-json=hist.db", f"--distperf-history={db}", enabled=enabled)
    result.stderr.fnmatch_lines([f"*distperf: --distperf-json: {db} is the --distperf-history database; the report "
                                 f"would replace every session's history*"])
    assert not db.exists()


@pytest.mark.parametrize("first, second", [("--distperf-json", "--distperf-html"),
                                           ("--distperf-html", "--distperf-pr-comment"),
                                           ("--distperf-json", "--junitxml")])
def test_two_reports_in_one_file_are_refused_naming_both(pytester: pytest.Pytester, first, second):
    result = _refused(pytester, f"{first}=rep/r.json", f"{second}=./rep/../rep/r.json")
    options = [o for o in ("--distperf-json", "--distperf-benchmark-json", "--distperf-html", "--distperf-pr-comment",
                           "--junitxml") if o in (first, second)]  # checked in this order: the later is named first
    result.stderr.fnmatch_lines([f"*distperf: {options[1]}: {pytester.path}/rep/r.json is also the file of "
                                 f"{options[0]}; one would replace the other*"])


def test_reports_in_distinct_files_beside_the_baselines_pass(tmp_path):
    (tmp_path / "baselines").mkdir()
    check_apart([("--distperf-json", str(tmp_path / "r.json")), ("--distperf-html", str(tmp_path / "r.html")),
                 ("--junitxml", str(tmp_path / "baselines-report.xml"))],
                ("--distperf-baselines", str(tmp_path / "baselines")), ("--distperf-history", str(tmp_path / "h.db")))


def test_a_symlink_or_hard_link_to_another_output_is_the_same_file(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "r.json").write_text("{}")
    os.symlink(tmp_path / "real", tmp_path / "alias")
    with pytest.raises(OutputPathError, match=r"^--distperf-html: .*real/r.json is also the file of --distperf-json"):
        check_apart([("--distperf-json", str(tmp_path / "real" / "r.json")),
                     ("--distperf-html", str(tmp_path / "alias" / "r.json"))])
    os.link(tmp_path / "real" / "r.json", tmp_path / "hard.json")
    with pytest.raises(OutputPathError, match="is also the file of --distperf-json"):
        check_apart([("--distperf-json", str(tmp_path / "real" / "r.json")),
                     ("--distperf-pr-comment", str(tmp_path / "hard.json"))])
    with pytest.raises(OutputPathError, match="lies inside the baselines folder"):
        check_apart([("--distperf-json", str(tmp_path / "alias" / "x.json"))],
                    ("--distperf-baselines", str(tmp_path / "real")))
