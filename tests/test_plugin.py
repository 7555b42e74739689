"""The plugin surface, through pytester: options, markers, skips, collection."""

import pytest

PERF_TEST = """
import pytest

@pytest.mark.distperf(world_size=2)
@pytest.mark.zero3
def test_perf(distperf):
    assert distperf.world_size == 2

def test_plain():
    pass
"""


def test_perf_tests_are_collected_and_skipped_without_the_flag(pytester):
    pytester.makepyfile(PERF_TEST)
    collected = pytester.runpytest("--collect-only", "-q", "-p", "no:cacheprovider")
    collected.stdout.fnmatch_lines(["*test_perf*", "*test_plain*"])
    result = pytester.runpytest("-rs", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["*run with --distperf to enable*"])


def test_the_plugin_registers_its_marker_and_a_project_its_topic_markers(pytester):
    pytester.makepyfile(PERF_TEST)
    markers = pytester.runpytest("--markers").stdout.str()
    assert "distperf(world_size=N" in markers and "zero3:" not in markers  # zero3 is this repository's own
    pytester.makeini("[pytest]\nmarkers =\n    zero3: ZeRO-3 checks\n")
    result = pytester.runpytest("--strict-markers", "-m", "zero3", "--collect-only", "-q", "-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(["*test_perf*", "*1/2 tests collected (1 deselected)*"])


def test_too_few_gpus_skips_before_anything_is_spawned(pytester):
    pytester.makepyfile("""
        import pytest
        @pytest.mark.distperf(world_size=64, device="cuda")
        def test_big(distperf):
            raise AssertionError("must not run")
    """)
    result = pytester.runpytest("--distperf", "-rs", "-p", "no:cacheprovider")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*needs 64 GPUs (world_size=64); this machine has 0*"])


def test_cuda_only_test_with_forced_cpu_says_why(pytester):
    pytester.makepyfile("""
        import pytest
        @pytest.mark.distperf(world_size=1, device="cuda")
        def test_gpu(distperf):
            pass
    """)
    result = pytester.runpytest("--distperf", "--distperf-device=cpu", "-rs", "-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(["*this test needs CUDA, and --distperf-device=cpu was given*"])


def test_ini_options_set_defaults(pytester):
    pytester.makeini("[pytest]\ndistperf_world_size = 3\ndistperf_device = cpu\n")
    pytester.makepyfile("""
        def test_ws(distperf):
            assert (distperf.world_size, distperf.device) == (3, "cpu")
    """)
    pytester.runpytest("--distperf", "-p", "no:cacheprovider").assert_outcomes(passed=1)


@pytest.mark.parametrize("args,needle", [
    (["--distperf-device=tpu"], "distperf: --distperf-device: expected one of auto, cpu, cuda, got 'tpu'"),
    (["--distperf-world-size=0"], "distperf: --distperf-world-size: expected a positive integer, got '0'"),
])
def test_bad_option_values_are_usage_errors(pytester, args, needle):
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest("--distperf", *args, "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{needle}*"])


def test_bad_marker_argument_names_the_test(pytester):
    pytester.makepyfile("""
        import pytest
        @pytest.mark.distperf(ranks=2)
        def test_typo(distperf):
            pass
    """)
    result = pytester.runpytest("--distperf", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert ("test_bad_marker_argument_names_the_test.py::test_typo: @pytest.mark.distperf has no argument(s) "
            "['ranks']") in result.stderr.str()
    pytester.makepyfile("""
        import pytest
        @pytest.mark.distperf(4)
        def test_positional(distperf):
            pass
    """)
    result = pytester.runpytest("--distperf", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "::test_positional: @pytest.mark.distperf(4,) takes keyword arguments only" in result.stderr.str()


def test_a_known_gap_is_a_strict_xfail_unless_declared_load_dependent(pytester):
    # A test body that passes stands for a decided pass: strict, it fails (the gap is gone: remove the mark);
    # declared not strict on this device, it is reported as XPASS.
    pytester.makepyfile("""
        import pytest
        @pytest.mark.distperf(known_gap={"cpu": "upstream#1: 1.2x"})
        def test_strict(distperf):
            pass
        @pytest.mark.distperf(known_gap={"cpu": "upstream#1: 1.2x", "cuda": "upstream#1: 1.6x"},
                              known_gap_strict={"cpu": False})
        def test_load_dependent(distperf):
            pass
    """)
    result = pytester.runpytest("--distperf", "--distperf-device=cpu", "-rX", "-p", "no:cacheprovider")
    result.assert_outcomes(failed=1, xpassed=1)
    result.stdout.fnmatch_lines(["*XPASS(strict)*known upstream gap on cpu: upstream#1: 1.2x*",
                                 "XPASS*test_load_dependent*known upstream gap on cpu*"])


def test_known_gap_strict_names_only_devices_with_a_gap(pytester):
    pytester.makepyfile("""
        import pytest
        @pytest.mark.distperf(known_gap={"cuda": "upstream#1: 1.6x"}, known_gap_strict={"cpu": False})
        def test_x(distperf):
            pass
    """)
    result = pytester.runpytest("--distperf", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*test_x: distperf(known_gap_strict=...) must map a device of known_gap ('cuda') "
                                 "to True or False, got {'cpu': False}*"])


def test_unknown_strategy_and_option_are_named(pytester):
    pytester.makepyfile("""
        import pytest
        def test_strategy(distperf):
            distperf.job("zero-4")
        def test_option(distperf):
            distperf.job("fsdp2", options={"reshard": True})
        def test_ds_key(distperf):
            distperf.job("deepspeed", options={"ds_config": {"zero_optimisation": {"stage": 3}}})
    """)
    result = pytester.runpytest("--distperf", "-p", "no:cacheprovider")
    result.assert_outcomes(failed=3)
    result.stdout.fnmatch_lines([
        "*unknown strategy 'zero-4'; known strategies: *",
        "*strategy 'fsdp2' has no option(s) 'reshard'; its options are: *",
        "*ds_config has unknown top-level key(s) 'zero_optimisation'*",
    ])


def test_cuda_arch_list_deepspeed_cannot_parse_is_named_before_its_jit_build():
    # The 2xH200 image set an arch-specific entry; DeepSpeed 0.19.8's JIT build failed on it deep in the
    # optimizer set-up. The check asks DeepSpeed's own (CUDA) op builder, so it runs on this CPU box too.
    pytest.importorskip("deepspeed")
    from deepspeed.ops.op_builder.async_io import AsyncIOBuilder

    from pytest_distperf.strategies import StrategyError
    from pytest_distperf.strategies.deepspeed import check_cuda_arch_list

    builder = AsyncIOBuilder()
    check_cuda_arch_list(builder, "8.0;9.0+PTX")
    check_cuda_arch_list(builder, "")
    builder.jit_mode, builder._jit_arch_list = True, "8.0;9.0a"
    try:
        builder.compute_capability_args()
        deepspeed_reads_suffixes = True  # fixed upstream (PR #8619): then there is nothing to refuse
    except ValueError:
        deepspeed_reads_suffixes = False
    builder.jit_mode = False
    if deepspeed_reads_suffixes:
        check_cuda_arch_list(builder, "8.0 9.0a")
    else:
        with pytest.raises(StrategyError, match=r"TORCH_CUDA_ARCH_LIST='8.0 9.0a': DeepSpeed .* cannot parse it "
                                                r".*TORCH_CUDA_ARCH_LIST=9.0"):
            check_cuda_arch_list(builder, "8.0 9.0a")
    assert builder.jit_mode is False  # the builder is left as it was


def test_deepspeed_op_builds_get_an_arch_list_deepspeed_can_read():
    pytest.importorskip("deepspeed")
    from deepspeed.ops.op_builder.async_io import AsyncIOBuilder

    from pytest_distperf.strategies import ds_ops
    from pytest_distperf.strategies.deepspeed import check_cuda_arch_list

    assert ds_ops.deepspeed_environment({"TORCH_CUDA_ARCH_LIST": "8.0;9.0a+PTX 10.0f"}) == {
        "TORCH_CUDA_ARCH_LIST": "8.0;9.0+PTX 10.0"}
    assert ds_ops.deepspeed_environment({"TORCH_CUDA_ARCH_LIST": "9.0"}) == {}
    assert ds_ops.deepspeed_environment({}) == {}
    check_cuda_arch_list(AsyncIOBuilder(), ds_ops.deepspeed_arch_list("8.0 9.0a"))  # DeepSpeed's parser takes it


def test_nvme_offload_needs_async_io_and_a_folder_that_takes_o_direct(tmp_path):
    from pytest_distperf.strategies import ds_ops

    assert ds_ops.needed("deepspeed", {"stage": 3, "offload_optimizer": "nvme"}, "cuda") == [
        "CPUAdamBuilder", "AsyncIOBuilder"]
    assert ds_ops.needed("deepspeed", {"stage": 3, "offload_param": "nvme"}, "cuda") == ["AsyncIOBuilder"]
    assert ds_ops.direct_io_problem(str(tmp_path / "nvme")) in (None, f"{tmp_path / 'nvme'} does not take O_DIRECT "
                                                                      "writes (Invalid argument)")
    assert not list((tmp_path / "nvme").iterdir())  # the probe file is gone


def test_an_op_deepspeed_cannot_build_skips_the_job_with_deepspeeds_reason(monkeypatch):
    from types import SimpleNamespace

    from pytest_distperf.strategies import ds_ops

    monkeypatch.setattr(ds_ops, "_incompatible", {})
    monkeypatch.setattr(ds_ops, "_checked", set())
    monkeypatch.setattr(ds_ops, "is_built", lambda builder, folder=None: False)
    calls = []

    def build_child(cmd, **kwargs):
        calls.append(cmd)
        return SimpleNamespace(returncode=ds_ops.INCOMPATIBLE, stdout="incompatible AsyncIOBuilder: no libaio\n",
                               stderr="")

    for _ in range(2):  # the second job skips without another build child
        with pytest.raises(pytest.skip.Exception, match="async_io op cannot build on this machine.*no libaio"):
            ds_ops.ensure(["AsyncIOBuilder"], "cuda", run=build_child)
    assert len(calls) == 1


def test_the_gates_warnings_point_at_the_test_not_the_hook(pytester):
    pytester.makepyfile(test_w="""
        import warnings
        from pytest_distperf.plugin import _warnings_at_the_test

        from pytest_distperf.errors import DistPerfInconclusive

        def test_x(request):
            with _warnings_at_the_test(request.node):  # as the report hook wraps the gate's finish
                warnings.warn(DistPerfInconclusive("a verdict stayed undecided"))
                warnings.warn(DeprecationWarning("another library's"))  # keeps its own line (9)
    """)
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, warnings=2)
    result.stdout.fnmatch_lines(["*test_w.py:6: DistPerfInconclusive: a verdict stayed undecided",
                                 "*def test_x(request):", "*test_w.py:9: DeprecationWarning: another library's"])


def test_warnings_of_the_tests_body_point_at_the_callers_line_however_deep_the_plugins_calls():
    from pytest_distperf.decide.checks import warn_inconclusive  # the plugin's frames: checks.py, then errors.py
    from pytest_distperf.errors import DistPerfInconclusive, HostBusyWarning, warn

    with pytest.warns(HostBusyWarning) as direct:
        warn(HostBusyWarning("another process took 40 % of the cores"))
    with pytest.warns(DistPerfInconclusive) as nested:
        warn_inconclusive(None, "undecided")  # type: ignore[arg-type]
    for caught in (direct, nested):
        assert [(w.filename, w.lineno > 0) for w in caught] == [(__file__, True)]
