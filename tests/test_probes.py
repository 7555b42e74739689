"""Probes: collectives counted exactly on real 2-rank gloo jobs; the trace readers, checks and report.

The CUDA-side readers (kernels, copies, overlap) have nothing to read on this CPU machine; they
are tested on a small trace written in Kineto's Chrome-trace format (field names as Kineto's
CuptiActivity.cpp writes them), and for real on the GPU run of perf_tests.
"""

import re
from pathlib import Path

import pytest

from pytest_distperf.rank import probes

from pytest_distperf.report import terminal as report
from pytest_distperf.report.document import TestDocument
from pytest_distperf.decide.checks import DistPerfCheckFailed
from pytest_distperf.errors import ProbeError
from pytest_distperf.spec.probes import validate as validate_probes
from pytest_distperf.spec.settings import SettingsError, build_settings, plan_test
from pytest_distperf.decide.probe_checks import ProbeAssertions
from pytest_distperf.rank.probes import comms, overlap, placement
from pytest_distperf.rank.probes.comms import nccl_kernel_kind
from pytest_distperf.rank.probes.results import CollectiveStats, CommsResult, PlacementResult, ProbeResult, probe_summary
from pytest_distperf.rank.probes.trace import STEP_MARK, Trace, intersection_length, union
from pytest_distperf.spec.job import JobSpec
from pytest_distperf.rank.results import RankResult, RunResult

# -- real jobs: a user function with a known set of collectives --------------------------------------------------

USER_FUNCTIONS = """
import torch
import torch.distributed as dist
from pytest_distperf.rank import probes

def three_gathers_one_reduce(numel, steps):
    ws = dist.get_world_size()
    x = torch.full((numel,), float(dist.get_rank()))
    dist.barrier()  # outside every step: must not be counted
    with probes.Recorder(("comms",)) as rec:
        dist.all_reduce(torch.ones(7))  # inside the profiler but outside every step: not counted
        for _ in range(steps):
            with rec.step():
                # three all-gathers, each through a different API (list, into-tensor, async)
                dist.all_gather([torch.empty(numel) for _ in range(ws)], x)
                dist.all_gather_into_tensor(torch.empty(numel * ws), x)
                dist.all_gather_into_tensor(torch.empty(numel * ws), x, async_op=True).wait()
                dist.all_reduce(x.to(torch.bfloat16))
    return rec.result()
"""


@pytest.mark.slow
def test_user_function_collectives_counted_exactly_with_bytes(pytester):
    pytester.makepyfile(helpers=USER_FUNCTIONS)
    pytester.makepyfile("""
        from helpers import three_gathers_one_reduce

        NUMEL, STEPS = 1000, 4

        def test_counts(distperf):
            for rank, result in enumerate(distperf.run_function(three_gathers_one_reduce, NUMEL, STEPS)):
                comms = result.comms
                assert result.rank == rank and result.steps == STEPS and comms.group_size == 2
                assert sorted(comms.by_kind) == ["all_gather", "all_reduce"]
                ag, ar = comms.kind("all_gather"), comms.kind("all_reduce")
                assert ag.counts == [3] * STEPS and ar.counts == [1] * STEPS
                # all_gather message = the gathered buffer: 1000 fp32 x 2 ranks = 8000 bytes
                assert ag.sizes == [8000] * 3 * STEPS and ag.bytes == [24000] * STEPS
                assert (ag.size_median, ag.size_min, ag.size_max) == (8000, 8000, 8000)
                assert ag.ops == {"c10d::allgather_": STEPS, "c10d::_allgather_base_": 2 * STEPS}
                # all_reduce message = the tensor: 1000 bf16 = 2000 bytes
                assert ar.bytes == [2000] * STEPS and ar.dtypes == {"bfloat16": STEPS}
                assert result.trace_path is None and result.overlap is None
    """)
    pytester.runpytest("--distperf", "-p", "no:cacheprovider").assert_outcomes(passed=1)


# -- real jobs: DDP, FSDP2 and ZeRO-3 on the built-in workload -----------------------------------------------------

STRATEGY_TESTS = """
import os
import pytest

PROBES = ("comms", "overlap", "placement")

def probed(distperf, strategy, **options):
    return distperf.probe(distperf.job(strategy, options=options, steps=2, warmup=1, probes=PROBES), shared=True)

def comms(run):
    results = [r.probes.comms for r in run.ranks]
    for c in results[1:]:  # every rank issues the same collectives
        assert {k: v.counts for k, v in c.by_kind.items()} == {k: v.counts for k, v in results[0].by_kind.items()}
    return results[0]

def test_ddp(distperf):
    run = probed(distperf, "ddp")
    c, n = comms(run), run.ranks[0].num_params
    assert sorted(c.by_kind) == ["all_reduce"]
    ar = c.kind("all_reduce")
    assert ar.bytes == [4 * n] * 3  # every fp32 gradient all-reduced once per step, in buckets
    assert ar.counts[0] >= 1 and len(set(ar.counts)) == 1

def test_fsdp2(distperf):
    run = probed(distperf, "fsdp2")
    c, n = comms(run), run.ranks[0].num_params
    units = 2 + 1  # tiny: one fully_shard unit per block (2) plus the root
    assert sorted(c.by_kind) == ["all_gather", "reduce_scatter"]
    # reshard_after_forward: each unit gathered in forward and again in backward; grads reduce-scattered once
    assert c.kind("all_gather").counts == [2 * units] * 3 and c.kind("all_gather").bytes == [2 * 4 * n] * 3
    assert c.kind("reduce_scatter").counts == [units] * 3 and c.kind("reduce_scatter").bytes == [4 * n] * 3

def test_zero3(distperf):
    run = probed(distperf, "deepspeed", stage=3)
    c, n = comms(run), run.ranks[0].num_params
    tensors = 2 + 8 * 2 + 2 + 1  # embeddings, 8 per block, final norm, head
    ag = c.kind("all_gather")
    assert ag.bytes == [4 * n] * 3  # each parameter gathered once per step (fp32 on CPU) ...
    assert 1 <= ag.counts[0] <= tensors  # ... in at most one call per parameter tensor
    assert c.kind("reduce_scatter").bytes == [4 * n] * 3  # each gradient reduced once
    assert set(c.by_kind) <= {"all_gather", "reduce_scatter", "all_reduce"}

def test_zero3_vs_fsdp2_all_gathers(distperf):
    distperf.probe_checks(probed(distperf, "deepspeed", stage=3), probed(distperf, "fsdp2")).assert_collectives_within(
        "all_gather", 100.0)

def test_ddp_all_gathers_vs_fsdp2_fails_with_traces(distperf):
    distperf.probe_checks(probed(distperf, "fsdp2"), probed(distperf, "ddp")).assert_collectives_within(
        "all_gather", 1.5)

def test_overlap_needs_cuda(distperf):
    distperf.probe_checks(probed(distperf, "ddp")).assert_overlap_at_least(0.5)

def test_pageable_copies_need_cuda(distperf):
    distperf.probe_checks(probed(distperf, "ddp")).assert_no_pageable_copies()

def test_placement_on_cpu(distperf):
    run = probed(distperf, "ddp")
    for r in run.ranks:
        p = r.probes.placement
        assert p.optimizer["AdamW"].calls == [1, 1, 1] and min(p.optimizer["AdamW"].cpu_seconds) > 0
        assert p.optimizer["AdamW"].gpu_kernels is None and p.copies is None
        assert p.state_bytes == {"cpu": r.optimizer_state_bytes} and p.state_tensors["cpu"] > 0
        assert 0 < p.cpu_utilisation <= p.cpu_cores
        assert os.path.exists(r.probes.trace_path)  # kept in the job folder for Perfetto
    distperf.probe_checks(run).assert_optimizer_cpu_time("AdamW")

@pytest.mark.distperf(probes=["comms"])
def test_marker_sets_default_probes(distperf):
    assert distperf.job("ddp").probes == ("comms",)
    assert distperf.job("ddp", probes=["placement", "comms"]).probes == ("comms", "placement")
    assert distperf.job("ddp", probes=()).probes == ()

def test_unknown_probe_is_rejected(distperf):
    with pytest.raises(ValueError, match="unknown probe.*'kernels'.*known probes: comms, overlap, placement"):
        distperf.job("ddp", probes=["comms", "kernels"])
"""


@pytest.mark.slow
def test_strategies_report_collectives_that_fit_the_model(pytester):
    pytester.makepyfile(STRATEGY_TESTS)
    result = pytester.runpytest("--distperf", "-p", "no:cacheprovider", "-rs", "-v")
    result.assert_outcomes(passed=7, failed=1, skipped=2)
    out = result.stdout.str()
    result.stdout.fnmatch_lines([
        "*all_gather calls per step of fsdp2 tiny x2 cpu are infx ddp tiny x2 cpu's, above the 1.50x limit*",
        "*Chrome trace of the probe phase (open in https://ui.perfetto.dev):*",
        "*SKIPPED*overlap probe of ddp tiny x2 cpu: needs CUDA*",
        "*SKIPPED*placement probe of ddp tiny x2 cpu: host/device copies need CUDA*",
    ])
    traces = re.findall(r"(?:fsdp2|ddp) tiny x2 cpu rank [01]: (\S+probe-trace-rank[01]\.json)", out)
    assert len(traces) == 4 and all(Path(t).is_file() for t in traces)
    assert not any((Path(t).parent / "scratch").exists() for t in traces)  # kept for the trace, not for scratch
    # the terminal table's probe section
    result.stdout.fnmatch_lines(["*all_gather_per_step*fsdp2 tiny x2 cpu = 6*ddp tiny x2 cpu = 0*<= 1.50*FAIL*",
                                 "*probed job*collectives/step*AG median*", "*ddp tiny x2 cpu*AR 1*AdamW CPU*",
                                 "*fsdp2 tiny x2 cpu*AG 6 RS 3*"])


# -- pure parts ---------------------------------------------------------------------------------------------------

def test_interval_arithmetic():
    assert union([(5, 7), (0, 2), (1, 3), (7, 8), (9, 9)]) == [(0, 3), (5, 8)]
    assert intersection_length([(0, 10)], [(2, 3), (5, 20)]) == 6
    assert intersection_length([(0, 1)], []) == 0
    assert overlap.overlap_of([(0, 4), (2, 6)], [(5, 10)]) == (6, 1, 5)


def test_names_from_cupti_and_nccl():
    assert placement.memcpy_kind("Memcpy HtoD (Pinned -> Device)") == ("HtoD", False)
    assert placement.memcpy_kind("Memcpy DtoH (Device -> Pageable)") == ("DtoH", True)
    assert placement.memcpy_kind("Memset (Device)") is None
    assert nccl_kernel_kind("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)") == "all_gather"
    assert nccl_kernel_kind("ncclKernel_ReduceScatter_RING_LL_Sum_float(ncclWorkElem)") == "reduce_scatter"
    assert nccl_kernel_kind("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)") == "send_recv"
    assert nccl_kernel_kind("ampere_bf16_s16816gemm_bf16_128x64") is None


def test_probe_names_validated_where_they_come_from():
    assert validate_probes(["placement", "comms", "comms"]) == ("comms", "placement")
    with pytest.raises(ProbeError, match="x.py: unknown probe"):
        validate_probes("nope", "x.py")
    settings = build_settings(True, {}, {})
    with pytest.raises(SettingsError, match=r"t.py::test: distperf\(probes=...\): unknown probe\(s\) 'gpu'"):
        plan_test(settings, {"probes": ["gpu"]}, 0, "t.py::test")
    assert plan_test(settings, {"probes": ("overlap",)}, 0, "t.py::test").probes == ("overlap",)


def _x(cat, name, ts, dur, tid=0, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": args}


def kineto_trace(launch_tid=100):
    """Two probed steps on one GPU, in the Chrome-trace format Kineto writes (times in us)."""
    main = 100
    return [
        _x("user_annotation", STEP_MARK, 0, 1000, main),
        _x("user_annotation", STEP_MARK, 1100, 1000, main),
        _x("gpu_user_annotation", STEP_MARK, 5, 990, 7),  # Kineto's GPU-side copy: not a step
        # step 0: a gemm overlapping an all-gather for 120 us of its 300 us
        _x("cuda_runtime", "cudaLaunchKernel", 10, 2, launch_tid, correlation=1),
        _x("kernel", "ampere_bf16_s16816gemm", 20, 200, 7, correlation=1, stream=7),
        _x("cuda_runtime", "cudaLaunchKernel", 15, 2, launch_tid, correlation=2),
        # Kineto puts the issuing op's arguments on an NCCL kernel (as on 2xH200, torch 2.11)
        _x("kernel", "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 100, 300, 20,
           correlation=2, stream=20, **{"Collective name": "_allgather_base", "In msg nelems": 1024,
                                        "Out msg nelems": 2048, "Group size": 2, "dtype": "BFloat16"}),
        # the optimizer step launches one kernel and one pageable D2H copy; another thread launches one more
        _x("user_annotation", "Optimizer.step#AdamW.step", 500, 200, main),
        _x("cuda_runtime", "cudaLaunchKernel", 550, 2, launch_tid, correlation=3),
        _x("kernel", "void multi_tensor_apply_kernel<...>", 600, 50, 7, correlation=3, stream=7),
        _x("cuda_runtime", "cudaLaunchKernel", 560, 2, 200, correlation=4),
        _x("kernel", "void other_thread_kernel<...>", 660, 10, 7, correlation=4, stream=7),
        _x("cuda_runtime", "cudaMemcpyAsync", 580, 2, launch_tid, correlation=5),
        _x("gpu_memcpy", "Memcpy DtoH (Device -> Pageable)", 680, 5, 7, correlation=5, bytes=4096),
        # step 1: a pinned H2D copy, then a reduce-scatter with nothing to hide it
        _x("cuda_runtime", "cudaMemcpyAsync", 1200, 2, launch_tid, correlation=6),
        _x("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", 1210, 90, 7, correlation=6, bytes=1 << 20),
        _x("cuda_runtime", "cudaLaunchKernel", 1300, 2, launch_tid, correlation=7),
        _x("kernel", "ncclDevKernel_ReduceScatter_Sum_f32_RING_LL(...)", 1400, 100, 20, correlation=7, stream=20),
    ]


def test_overlap_copies_and_optimizer_split_from_a_kineto_trace():
    trace = Trace(kineto_trace())
    assert trace.steps == [(0, 1000), (1100, 2100)]
    o = overlap.measure(trace)
    assert o.comm_kernels == [1, 1]
    assert o.comm_seconds == pytest.approx([300e-6, 100e-6]) and o.overlapped_seconds == pytest.approx([120e-6, 0])
    assert o.exposed_seconds == pytest.approx([180e-6, 100e-6]) and o.fraction == pytest.approx(0.3)
    copies = placement.copies(trace)
    assert copies["DtoH"].counts == [1, 0] and copies["DtoH"].pageable_bytes == [4096, 0]
    assert copies["HtoD"].bytes == [0, 1 << 20] and copies["HtoD"].pageable_counts == [0, 0]
    c = comms.measure([], 2, trace)  # on CUDA the kernels are the record, whatever the event tree holds
    assert c.source == "NCCL kernels"
    ag, rs = c.kind("all_gather"), c.kind("reduce_scatter")
    assert ag.counts == [1, 0] and ag.sizes == [4096] and ag.bytes == [4096, 0] and ag.ops == {"_allgather_base": 1}
    assert ag.dtypes == {"BFloat16": 1} and ag.unsized == 0
    assert rs.counts == [0, 1] and rs.unsized == 1 and rs.sizes == [] and rs.bytes == [0, 0]  # no args: no size
    adamw = placement.optimizer_steps(trace, cuda=True)["AdamW"]
    assert adamw.calls == [1, 0] and adamw.cpu_seconds == pytest.approx([200e-6, 0])
    assert adamw.gpu_kernels == [1, 0] and adamw.gpu_copies == [1, 0]  # not the other thread's kernel
    assert adamw.gpu_kernel_seconds == pytest.approx([50e-6, 0])


def test_kernels_are_not_attributed_when_launch_threads_do_not_match():
    with pytest.raises(RuntimeError, match="cannot attribute GPU work"):
        placement.optimizer_steps(Trace(kineto_trace(launch_tid=999)), cuda=True)


def _cuda_run(result: ProbeResult) -> RunResult:
    spec = JobSpec(world_size=1, device="cuda", strategy="deepspeed", probes=("overlap", "placement"))
    rank = RankResult(rank=0, step_times=[1.0], losses=[1.0], cuda_peak_allocated=1, cuda_peak_reserved=1,
                      host_peak_rss=1, host_rss_before_build=0, optimizer_state_bytes=1, num_params=10,
                      tokens_per_step=1, build_seconds=0.0, warmup_seconds=0.0, probes=result)
    return RunResult(spec=spec, ranks=[rank], wall_seconds=1.0)


def test_cuda_checks_on_a_kineto_trace():
    trace = Trace(kineto_trace())
    result = ProbeResult(rank=0, device="cuda", steps=2, probes=["overlap", "placement"],
                         overlap=overlap.measure(trace), trace_path="/jobs/job-1/probe-trace-rank0.json",
                         placement=PlacementResult(steps=2, optimizer=placement.optimizer_steps(trace, True),
                                                   state_bytes={"cpu": 800, "cuda": 64},
                                                   state_tensors={"cpu": 3, "cuda": 1}, cpu_seconds=1.0,
                                                   wall_seconds=2.0, cpu_cores=4, copies=placement.copies(trace)))
    recorded = []
    checks = ProbeAssertions(_cuda_run(result), on_check=recorded.append)
    checks.assert_copy_bytes_within("HtoD", 1 << 20, 1.1)
    with pytest.raises(DistPerfCheckFailed, match=r"(?s)1 GPU kernel\(s\) launched inside optimizer.step\(\).*"
                                                  r"kernels/step \[1, 0\].*ui.perfetto.dev.*probe-trace-rank0.json"):
        checks.assert_no_optimizer_gpu_kernels()
    with pytest.raises(DistPerfCheckFailed, match=r"1 pageable host/device copies"):
        checks.assert_no_pageable_copies()
    with pytest.raises(DistPerfCheckFailed, match=r"only 30.0% of .* below the 50% floor"):
        checks.assert_overlap_at_least(0.5)
    with pytest.raises(DistPerfCheckFailed, match=r"64 B of optimizer state is not on cpu"):
        checks.assert_optimizer_state_on("cpu")
    assert [(c.name, c.passed, c.direction) for c in recorded] == [
        ("HtoD_bytes_per_step", True, "at_most"), ("optimizer_gpu_kernels", False, "at_most"),
        ("pageable_copies", False, "at_most"), ("comm_overlap", False, "at_least"),
        ("optimizer_state_off_cpu", False, "at_most")]
    assert result.placement.cpu_utilisation == 0.5

    # the report: check rows show the limit's direction, the probe row the metrics
    rec = probe_summary("zero3", [_cuda_run(result)])
    lines = report.render([TestDocument.from_records("t.py::test", "passed", 1.0, [*recorded, rec])])
    text = "\n".join(lines)
    assert ">= 0.5" in text and "<= 0 B" in text
    row = next(line for line in lines if line.startswith("zero3"))
    for cell in ("30%", "140 us", "DtoH 0.5 (2.00 KiB)", "AdamW CPU 100 us / GPU 0.5 kernels", "0.50"):
        assert cell in row, (cell, row)


def _comms_run(label: str, recorded: dict[str, list[int]], unsized: dict[str, int]) -> RunResult:
    by_kind = {k: CollectiveStats(k, counts, [1 << 20] * len(counts), [1 << 20] * sum(counts),
                                  unsized=unsized.get(k, 0))
               for k, counts in recorded.items()}
    result = ProbeResult(rank=1, device="cuda", steps=2, probes=["comms"],
                         comms=CommsResult(steps=2, by_kind=by_kind, group_size=2, source="NCCL kernels"))
    run = _cuda_run(result)
    run.spec = JobSpec(world_size=2, device="cuda", strategy=label, probes=("comms",))  # 2xH200 counts, group of 2
    return run


def test_counts_are_checked_and_stored_bytes_only_where_every_call_has_a_size():
    # 2xH200's counts: ZeRO-3 fragments its all-gathers, FSDP2 one per block and pass
    fsdp2 = _comms_run("fsdp2", {"all_gather": [50, 50], "reduce_scatter": [25, 25]}, {"reduce_scatter": 1})
    zero3 = _comms_run("deepspeed", {"all_gather": [142, 142], "reduce_scatter": [1, 1]}, {})
    with pytest.raises(DistPerfCheckFailed, match=r"(?s)142 all_gather/step \(per step \[142, 142\], counted from "
                                                  r"NCCL kernels\).*50 all_gather/step"):
        ProbeAssertions(zero3, fsdp2).assert_collectives_within("all_gather", 1.5)
    ProbeAssertions(fsdp2, zero3).assert_collectives_within("all_gather", 1.5)
    # a kind with calls of unknown size keeps its count but not its bytes, in metrics and in baselines
    m = fsdp2.ranks[0].probes.metrics()
    assert m["comms.reduce_scatter.calls_per_step"] == 25 and "comms.reduce_scatter.bytes_per_step" not in m
    assert m["comms.all_gather.bytes_per_step"] == 1 << 20
    from pytest_distperf.figures.quantities import run_comms as _comms_counts

    counts = _comms_counts(fsdp2)
    assert counts["comms.reduce_scatter.calls_per_step"] == 25 and "comms.reduce_scatter.bytes_per_step" not in counts
    assert _comms_counts(zero3)["comms.all_gather.calls_per_step"] == 142


def test_a_collectives_check_between_one_rank_jobs_skips_saying_so():
    """At world size 1 nothing is gathered: 0 vs 0 must not read as a pass (nor turn a strict known gap into an
    XPASS, as it did on 1xH200 with --distperf-world-size 1)."""
    one = [_comms_run(name, {}, {}) for name in ("deepspeed", "fsdp2")]
    for run in one:
        run.spec = JobSpec(world_size=1, device="cuda", strategy=run.spec.strategy, probes=("comms",))
    with pytest.raises(pytest.skip.Exception, match="ran on one rank, where no collective runs"):
        ProbeAssertions(*one).assert_collectives_within("all_gather", 1.5)


def test_the_collector_is_paused_while_a_trace_is_analysed_and_restored_after_an_error():
    import gc

    from pytest_distperf.rank.probes.trace import collector_paused

    assert gc.isenabled()
    with pytest.raises(ValueError):
        with collector_paused():
            assert not gc.isenabled()
            raise ValueError("an analysis that fails")
    assert gc.isenabled()
    gc.disable()  # a caller that had it off keeps it off
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
