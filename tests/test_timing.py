"""The one step timer (rank/timing.py): CUDA event pairs read after one synchronisation per window, and
wall time on CPU. The CUDA path runs here against a simulated GPU queue (events that fire when the queue
reaches them), which is what the arithmetic depends on; the real CUDA run is benchmarks/overhead.py."""

from __future__ import annotations

import time

import pytest
import torch

from pytest_distperf.rank import timing
from pytest_distperf.rank.timing import CudaMarks, StepTimer, TimedWindow
from pytest_distperf.rank.results import RankResult, RunResult
from pytest_distperf.spec.job import JobSpec


class FakeGpu:
    """One in-order stream: work queued at host time `host` starts when the stream is free and the work has
    been queued; an event completes when the stream reaches it."""

    def __init__(self) -> None:
        self.host = 0.0  # the host's clock, advanced by the test
        self.free_at = 0.0  # when the stream has done all queued work

    def launch(self, host_cost: float, gpu_cost: float) -> None:
        self.host += host_cost
        self.free_at = max(self.free_at, self.host) + gpu_cost


class FakeEvent:
    def __init__(self, gpu: FakeGpu):
        self.gpu, self.at, self.stream = gpu, None, None

    def record(self, stream: object) -> None:
        self.stream = stream
        self.at = max(self.gpu.free_at, self.gpu.host)

    def elapsed_time(self, end: "FakeEvent") -> float:
        assert self.at is not None and end.at is not None, "elapsed_time on an event that was not recorded"
        return (end.at - self.at) * 1e3  # milliseconds, as torch.cuda.Event


def cuda_window(gpu: FakeGpu, steps: int, monkeypatch: pytest.MonkeyPatch) -> tuple[TimedWindow, list[int]]:
    syncs: list[int] = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: syncs.append(1))
    marks = CudaMarks(torch.device("cuda", 0), steps, new_event=lambda: FakeEvent(gpu), stream="stream-0")
    return TimedWindow(marks), syncs


def test_gpu_bound_steps_read_the_gpu_time_of_each_step(monkeypatch):
    """The host queues faster than the GPU works: each step's time is its GPU work, not its launch time
    (the first step, on an idle GPU, also waits for its first launch), and the window synchronises once,
    at the end."""
    gpu = FakeGpu()
    window, syncs = cuda_window(gpu, 4, monkeypatch)
    gpu_costs = [0.050, 0.052, 0.049, 0.051]
    for cost in gpu_costs:
        window.time(lambda c=cost: gpu.launch(host_cost=0.005, gpu_cost=c))
    assert syncs == []  # nothing waits while the steps run
    times = window.finish()
    assert syncs == [1]
    assert times == pytest.approx([0.005 + gpu_costs[0], *gpu_costs[1:]])
    assert window.finish() == times and syncs == [1]  # read once


def test_host_bound_steps_read_the_hosts_time(monkeypatch):
    """The GPU keeps up (idle between launches): a step's time is the host's, from its first launch to the
    end of its last kernel; a step that begins while the last one's kernel still runs begins after it, so
    the steps add up to the window."""
    gpu = FakeGpu()
    window, _ = cuda_window(gpu, 3, monkeypatch)
    for _ in range(3):
        window.time(lambda: [gpu.launch(host_cost=0.010, gpu_cost=0.001) for _ in range(5)])
    times = window.finish()
    assert times == pytest.approx([5 * 0.010 + 0.001, 5 * 0.010, 5 * 0.010])
    assert sum(times) == pytest.approx(gpu.free_at)


def test_events_are_made_up_front_and_recorded_on_the_windows_stream(monkeypatch):
    gpu = FakeGpu()
    made: list[FakeEvent] = []

    def new_event() -> FakeEvent:
        made.append(FakeEvent(gpu))
        return made[-1]

    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    window = TimedWindow(CudaMarks(torch.device("cuda", 0), 2, new_event=new_event, stream="s"))
    assert len(made) == 4  # before any step
    for _ in range(3):  # one more step than prepared for: still timed
        window.time(lambda: gpu.launch(0.001, 0.002))
    assert len(made) == 6 and {e.stream for e in made} == {"s"}
    assert window.finish() == pytest.approx([0.003, 0.002, 0.002])


def test_a_finished_window_times_no_more_steps(monkeypatch):
    window, _ = cuda_window(FakeGpu(), 1, monkeypatch)
    window.time(lambda: None)
    window.finish()
    with pytest.raises(RuntimeError, match="finished"):
        window.time(lambda: None)


def test_cpu_window_is_wall_time_and_touches_no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: pytest.fail("a CPU window synchronised CUDA"))
    window = StepTimer(torch.device("cpu")).window(2)
    assert isinstance(window._marks, timing.HostMarks)
    out = [window.time(lambda: time.sleep(0.02) or "loss") for _ in range(2)]
    assert out == ["loss", "loss"]
    times = window.finish()
    # a 20 ms sleep timed: measured 20.1-20.2 ms (8 runs, quiet and with two busy loops); the floor is the sleep's
    # own (less 1 ms of clock rounding), the 0.5 s ceiling 25x it, for a scheduler that leaves the process waiting
    assert len(times) == 2 and all(0.019 < t < 0.5 for t in times)


def _rank(rank: int, times: list[float]) -> RankResult:
    return RankResult(rank=rank, step_times=times, losses=[], cuda_peak_allocated=None, cuda_peak_reserved=None,
                      host_peak_rss=0, host_rss_before_build=0, optimizer_state_bytes=0, num_params=1,
                      tokens_per_step=1, build_seconds=0.0, warmup_seconds=0.0)


def test_a_steps_time_is_the_slowest_ranks():
    run = RunResult(spec=JobSpec(world_size=2, device="cpu", strategy="ddp"), wall_seconds=1.0,
                    ranks=[_rank(0, [0.10, 0.30, 0.20]), _rank(1, [0.20, 0.10, 0.25])])
    assert run.step_times == [0.20, 0.30, 0.25]
