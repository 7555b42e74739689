"""Settings and per-test plans: command line > ini > default, marker > settings, device choice."""

import re
from pathlib import Path

import pytest

from pytest_distperf.spec import settings as settings_module
from pytest_distperf.spec.settings import Settings, SettingsError, build_settings, plan_test, resolve_device


def settings(**cli):
    return build_settings(True, cli, {})


def test_defaults_apply_when_nothing_is_set():
    s = build_settings(True, {}, {})
    assert (s.device, s.world_size, s.timeout, s.repeats) == (
        Settings.device, Settings.world_size, Settings.timeout, Settings.repeats)


def test_command_line_beats_ini_beats_default():
    s = build_settings(True, {"world_size": "4"}, {"world_size": "8", "timeout": "30"})
    assert s.world_size == 4 and s.timeout == 30.0


@pytest.mark.parametrize("cli,ini,needle", [
    ({"device": "tpu"}, {}, "--distperf-device"),
    ({}, {"device": "gpu"}, "ini option distperf_device"),
    ({"world_size": "zero"}, {}, "--distperf-world-size"),
    ({}, {"timeout": "-5"}, "ini option distperf_timeout"),
])
def test_bad_values_name_their_source(cli, ini, needle):
    with pytest.raises(SettingsError, match=needle):
        build_settings(True, cli, ini)


@pytest.mark.parametrize("option,marker,ws,gpus,expected", [
    ("auto", None, 2, 0, ("cpu", None)),
    ("auto", None, 2, 1, ("cpu", None)),  # not enough GPUs for auto -> CPU + gloo
    ("auto", None, 2, 2, ("cuda", None)),
    ("cpu", None, 2, 8, ("cpu", None)),
    ("cuda", None, 1, 1, ("cuda", None)),
    ("auto", "cpu", 2, 8, ("cpu", None)),
])
def test_resolve_device(option, marker, ws, gpus, expected):
    assert resolve_device(option, marker, ws, gpus) == expected


def test_too_few_gpus_names_both_numbers():
    device, reason = resolve_device("auto", "cuda", 4, 2)
    assert device is None and "needs 4 GPUs" in reason and "this machine has 2" in reason
    device, reason = resolve_device("cuda", None, 2, 0)
    assert device is None and "needs 2 GPUs" in reason and "has 0" in reason


def test_cuda_test_with_cpu_forced_is_skipped_with_reason():
    assert resolve_device("cpu", "cuda", 1, 1) == (None, "this test needs CUDA, and --distperf-device=cpu was given")


def test_marker_overrides_settings_and_rejects_unknown_keys():
    plan = plan_test(settings(), {"world_size": 3, "timeout": 12, "repeats": 5}, gpus=0, where="t.py::x")
    assert (plan.device, plan.world_size, plan.timeout, plan.repeats) == ("cpu", 3, 12.0, 5)
    with pytest.raises(SettingsError, match=r"t.py::x: @pytest.mark.distperf has no argument\(s\) \['ranks'\]"):
        plan_test(settings(), {"ranks": 2}, gpus=0, where="t.py::x")
    with pytest.raises(SettingsError, match="distperf\\(device=...\\)"):
        plan_test(settings(), {"device": "gpu"}, gpus=0, where="t.py::x")


def test_adaptive_repeats_and_strict_from_option_ini_and_marker():
    s = build_settings(True, {}, {})
    assert (s.max_repeats, s.test_budget, s.strict) == (12, 600.0, False)
    s = build_settings(True, {"max_repeats": "6", "strict": True}, {"max_repeats": "20", "test_budget": "120",
                                                                    "strict": "false"})
    assert (s.max_repeats, s.test_budget, s.strict) == (6, 120.0, True)
    assert build_settings(True, {"strict": None}, {"strict": "true"}).strict
    plan = plan_test(s, {"max_repeats": 4, "test_budget": 30}, gpus=0, where="t.py::x")
    assert (plan.max_repeats, plan.test_budget) == (4, 30.0)
    # The budget bounds the first look too: 2 pairs at most, not the 3 a side a test starts with.
    capped = plan_test(build_settings(True, {"max_repeats": "2"}, {}), {}, gpus=0, where="t.py::x")
    assert (capped.repeats, capped.max_repeats) == (2, 2)
    assert build_settings(True, {"max_repeats": "2"}, {}).repeats == 2  # as the header says it
    with pytest.raises(SettingsError, match="--distperf-max-repeats: expected a number of pairs from 2 to 64"):
        build_settings(True, {"max_repeats": "100"}, {})
    with pytest.raises(SettingsError, match="ini option distperf_strict: expected true or false"):
        build_settings(True, {}, {"strict": "maybe"})
    with pytest.raises(SettingsError, match=r"t.py::x: distperf\(max_repeats=...\)"):
        plan_test(s, {"max_repeats": 1}, gpus=0, where="t.py::x")
    assert s.session_budget is None
    assert build_settings(True, {}, {"session_budget": "480"}).session_budget == 480.0
    with pytest.raises(SettingsError, match="--distperf-session-budget: expected a positive number, got '0'"):
        build_settings(True, {"session_budget": "0"}, {})


def _shown(default):
    """A declared default as README's table writes it."""
    if isinstance(default, bool):
        return "on" if default else "off"
    return "none" if default is None else f"{default:g}" if isinstance(default, (int, float)) else str(default)


def test_readme_settings_table_matches_the_declarations():
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    section = readme.split("\n## Options and ini keys\n", 1)[1].split("\n## ", 1)[0]
    declared = {s.name: s for s in settings_module.declared()}
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if len(cells) != 4:
            continue
        flags = re.findall(r"`(--distperf[a-z-]*)", cells[0])
        keys = re.findall(r"`(distperf_[a-z_]+)`", cells[1])
        names = {("enabled" if f == "--distperf" else f[len("--distperf-"):].replace("-", "_")) for f in flags}
        names |= {k[len("distperf_"):] for k in keys}
        if not names:  # the header
            continue
        assert len(names) == 1 and names <= declared.keys(), f"README names what is not declared: {line}"
        s = declared[names.pop()]
        assert s.name not in rows, f"README lists {s.name} twice"
        assert (flags, keys) == ([s.flag] if s.option else [], [s.dest] if s.ini else []), line
        assert cells[2] == _shown(s.default), f"{s.name}: README says {cells[2]}, declared {s.default!r}"
        rows[s.name] = line
    assert rows.keys() == declared.keys(), f"not in README: {sorted(declared.keys() - rows.keys())}"


def test_options_and_ini_keys_come_from_the_declarations(pytester):
    result = pytester.runpytest("--help")
    options = set(re.findall(r"^\s+(--distperf[a-z-]*)", result.stdout.str(), re.M))
    keys = set(re.findall(r"^\s+(distperf_[a-z_]+) \(", result.stdout.str(), re.M))
    declared = settings_module.declared()
    assert options == {s.flag for s in declared if s.option} and len(options) <= 25
    assert keys == {s.dest for s in declared if s.ini}
    # An ini-only setting is read from the ini file (or -o), never from a command-line value.
    assert build_settings(True, {}, {"fresh_agent": "true"}).cluster.fresh_agent
    assert not build_settings(True, {"keep_jobs": "true"}, {}).keep_jobs
    with pytest.raises(SettingsError, match="ini option distperf_slurm_partition is an option of the slurm launcher"):
        build_settings(True, {}, {"slurm_partition": "gpu"})
