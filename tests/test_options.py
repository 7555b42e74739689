"""Settings and per-test plans: command line > ini > default, marker > settings, device choice."""

import pytest

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
