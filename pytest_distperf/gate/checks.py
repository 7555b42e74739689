"""Ratio checks between two strategies: "A within k x of B" for step time and memory.

A Comparison holds the runs of both sides (interleaved A B A B ... when repeated) and
turns them into Checks: plain records with the numbers, the threshold and the verdict,
which the assertion message, the terminal table and JUnit properties all read.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import Any, Callable

from pytest_distperf.errors import DistPerfCheckFailed
from pytest_distperf.rank import breakdown
from pytest_distperf.results import RunResult
from pytest_distperf.measure.stats import RatioEstimate, max_relative_difference, paired_ratio, summarize
from pytest_distperf.measure.units import fmt_bytes, fmt_seconds


@dataclass
class Check:
    name: str  # "step_time", "peak_memory", "loss_match"
    a: str
    b: str
    a_value: float
    b_value: float
    ratio: float
    low: float | None
    high: float | None
    threshold: float
    passed: bool
    unit: str  # "s", "bytes", "rel"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class SideSummary:
    label: str
    runs: list[RunResult]

    @property
    def run_step_medians(self) -> list[float]:
        return [summarize(r.step_times).median for r in self.runs]

    @property
    def pooled_steps(self) -> list[float]:
        return [t for r in self.runs for t in r.step_times]

    @property
    def step_median(self) -> float:
        return statistics.median(self.run_step_medians)

    @property
    def peak_memories(self) -> list[int]:
        return [r.peak_memory for r in self.runs]

    @property
    def tokens_per_second(self) -> float:
        return self.runs[0].tokens_per_step / self.step_median

    def step_line(self) -> str:
        s = summarize(self.pooled_steps)
        return (f"{self.label}: median {fmt_seconds(self.step_median)} (p10 {fmt_seconds(s.p10)}, "
                f"p90 {fmt_seconds(s.p90)}, IQR {fmt_seconds(s.iqr)}) over {len(self.runs)} run(s) x "
                f"{len(self.runs[0].step_times)} steps")

    def memory_line(self) -> str:
        mems = self.peak_memories
        kind = "CUDA peak allocated" if self.runs[0].spec.device == "cuda" else "host RSS growth during training"
        return (f"{self.label}: {kind} median {fmt_bytes(statistics.median(mems))} "
                f"(min {fmt_bytes(min(mems))}, max {fmt_bytes(max(mems))}) over {len(mems)} run(s)")


class Comparison:
    def __init__(self, a: SideSummary, b: SideSummary, on_check: Callable[[Check], None] | None = None):
        if len(a.runs) != len(b.runs) or not a.runs:
            raise ValueError("a comparison needs the same, non-zero number of runs on both sides")
        self.a, self.b = a, b
        self.checks: list[Check] = []
        self._on_check = on_check

    def _add(self, check: Check) -> None:
        self.checks.append(check)
        if self._on_check:
            self._on_check(check)

    @property
    def step_time_ratio(self) -> RatioEstimate:
        return paired_ratio(self.a.run_step_medians, self.b.run_step_medians)

    @property
    def memory_ratio(self) -> RatioEstimate:
        return paired_ratio([max(m, 1) for m in self.a.peak_memories], [max(m, 1) for m in self.b.peak_memories])

    @property
    def loss_difference(self) -> float:
        return max_relative_difference(self.a.runs[0].losses, self.b.runs[0].losses)

    def _config_notes(self) -> str:
        a, b = self.a.runs[0], self.b.runs[0]
        line = (f"optimizer state + master weights: {a.optimizer_bytes_per_param:.1f} vs "
                f"{b.optimizer_bytes_per_param:.1f} bytes/param (summed over ranks)")
        if abs(a.optimizer_bytes_per_param - b.optimizer_bytes_per_param) > 0.5:
            line += " -- the sides keep different optimizer precision: a config mismatch, not only a speed gap"
        return line

    def _ratio_check(self, name: str, k: float, est: RatioEstimate, a_value: float, b_value: float,
                     unit: str, lines: tuple[str, str], what: str) -> Check:
        __tracebackhide__ = True  # pytest shows the message, not this frame
        check = Check(name=name, a=self.a.label, b=self.b.label, a_value=a_value, b_value=b_value,
                      ratio=est.ratio, low=est.low, high=est.high, threshold=k, passed=est.ratio <= k, unit=unit)
        self._add(check)
        if not check.passed:
            raise DistPerfCheckFailed("\n".join([
                f"{what} of {self.a.label} is {est.ratio:.3f}x {self.b.label}'s, above the {k:.2f}x limit",
                f"  A {lines[0]}",
                f"  B {lines[1]}",
                f"  ratio A/B {est.ratio:.3f}, 95% interval {est.interval_text()} over {est.pairs} interleaved "
                f"pair(s); threshold {k:.2f}",
                f"  {self._config_notes()}",
                *(breakdown.message_lines(self.a, self.b) if name == "step_time" else []),  # where the time goes
            ]), check)
        return check

    def assert_step_time_within(self, k: float) -> Check:
        """Fail unless A's median step time is at most k x B's."""
        __tracebackhide__ = True
        return self._ratio_check("step_time", k, self.step_time_ratio, self.a.step_median, self.b.step_median,
                                 "s", (self.a.step_line(), self.b.step_line()), "median step time")

    def assert_memory_within(self, k: float) -> Check:
        """Fail unless A's peak memory is at most k x B's (CUDA peak allocated; host RSS growth on CPU)."""
        __tracebackhide__ = True
        return self._ratio_check("peak_memory", k, self.memory_ratio, statistics.median(self.a.peak_memories),
                                 statistics.median(self.b.peak_memories), "bytes",
                                 (self.a.memory_line(), self.b.memory_line()), "peak memory")

    def assert_losses_match(self, rtol: float) -> Check:
        """Same seed, same batches: the loss curves of A and B agree within rtol at every step."""
        __tracebackhide__ = True
        diff = self.loss_difference
        la, lb = self.a.runs[0].losses, self.b.runs[0].losses
        check = Check(name="loss_match", a=self.a.label, b=self.b.label, a_value=la[-1], b_value=lb[-1],
                      ratio=diff, low=None, high=None, threshold=rtol, passed=diff <= rtol, unit="rel")
        self._add(check)
        if not check.passed:
            raise DistPerfCheckFailed(
                f"losses of {self.a.label} and {self.b.label} differ by {diff:.2e} (relative), above {rtol:.1e}\n"
                f"  A: {[round(x, 5) for x in la]}\n  B: {[round(x, 5) for x in lb]}", check)
        return check
