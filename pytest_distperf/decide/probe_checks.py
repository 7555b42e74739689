"""Assertions over probe results, producing the same Check records as decide/checks.py.

    checks = distperf.probe_checks(zero3_run, fsdp2_run)
    checks.assert_collectives_within("all_gather", 1.5)      # A's all-gathers per step <= 1.5 x B's
    distperf.probe_checks(run).assert_no_pageable_copies()   # one run against an absolute limit

Every number is the worst rank's over every run given. Counts and sizes per step are exact (the probes' per-step
medians): PASS or FAIL, never INCONCLUSIVE. A check whose probe has nothing to measure on this device skips the
test; a failing one's message ends with the probe phase's Chrome traces.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from pytest_distperf.errors import DistPerfCheckFailed
from pytest_distperf.decide.checks import Check, check_limit
from pytest_distperf.decide import decision
from pytest_distperf.decide.decision import FAIL
from pytest_distperf.rank.probes.results import ProbeResult
from pytest_distperf.rank.results import RunResult
from pytest_distperf.figures.units import fmt_bytes, fmt_seconds

PERFETTO = "https://ui.perfetto.dev"


@dataclass
class ProbeCheck(Check):
    """A Check whose verdict is `ratio <direction> threshold` (decision.DIRECTIONS); absolute checks put the
    measured value in `ratio` and the limit in `b_value` (b = "limit")."""

    direction: str = "at_most"


def decided(name: str, a: str, b: str, a_value: float, b_value: float, value: float, limit: float, unit: str,
            direction: str = "at_most") -> ProbeCheck:
    v = decision.decide(decision.exact(value), limit, direction)
    return ProbeCheck.from_verdict(name, a, b, a_value, b_value, unit, v, direction=direction)


def _skip(reason: str) -> None:
    import pytest

    pytest.skip(reason)


class ProbeSide:
    """The probe results of every rank of every run of one job."""

    def __init__(self, runs: RunResult | list[RunResult], label: str | None = None):
        self.runs = runs if isinstance(runs, list) else [runs]
        if not self.runs:
            raise ValueError("probe checks need at least one run")
        self.label = label or self.runs[0].spec.describe()
        self.device = self.runs[0].spec.device
        self.results: list[ProbeResult] = [r.probes for run in self.runs for r in run.ranks if r.probes is not None]
        if not self.results:
            raise ValueError(f"{self.label} ran without probes: build its job with "
                             f"distperf.job(..., probes=('comms', 'overlap', 'placement'))")

    def need(self, probe: str) -> list[Any]:
        """This probe's result of every rank; skips the test where it had nothing to measure."""
        values = [getattr(r, probe) for r in self.results]
        if all(v is None for v in values):
            why = next((r.not_measured[probe] for r in self.results if probe in r.not_measured), None)
            if why:
                _skip(f"{probe} probe of {self.label}: {why}")
            raise ValueError(f"{self.label} ran without the {probe!r} probe; add it to the job's probes=")
        return values

    def traces(self) -> list[str]:
        return [f"{self.label} rank {r.rank}: {r.trace_path}" for r in self.results if r.trace_path]


class ProbeAssertions:
    def __init__(self, a: RunResult | list[RunResult], b: RunResult | list[RunResult] | None = None, *,
                 on_check: Callable[[Check], None] | None = None):
        self.a = ProbeSide(a)
        self.b = ProbeSide(b) if b is not None else None
        self.checks: list[ProbeCheck] = []
        self._on_check = on_check

    def _finish(self, check: ProbeCheck, lines: list[str]) -> ProbeCheck:
        __tracebackhide__ = True
        self.checks.append(check)
        if self._on_check:
            self._on_check(check)
        if check.outcome == FAIL:
            traces = self.a.traces() + (self.b.traces() if self.b else [])
            if traces:
                lines += [f"  Chrome trace of the probe phase (open in {PERFETTO}):"] + [f"    {t}" for t in traces]
            else:
                lines.append("  (no probe trace was kept)")
            raise DistPerfCheckFailed("\n".join(lines), check)
        return check

    def _absolute(self, name: str, value: float, limit: float, unit: str, direction: str) -> ProbeCheck:
        return decided(name, self.a.label, "limit", value, limit, value, limit, unit, direction)

    def _other(self) -> ProbeSide:
        if self.b is None:
            raise ValueError("this check compares two jobs: distperf.probe_checks(run_a, run_b)")
        return self.b

    @staticmethod
    def collectives_per_step(side: ProbeSide, kind: str) -> float:
        return max(c.kind(kind).per_step for c in side.need("comms"))

    @staticmethod
    def _comm_line(side: ProbeSide, kind: str) -> str:
        c = side.need("comms")[0]
        s = c.kind(kind)
        others = ", ".join(f"{k} {v.per_step:g}" for k, v in sorted(c.by_kind.items()) if k != kind) or "none"
        unsized = f", {s.unsized} call(s) of unknown size" if s.unsized else ""
        return (f"{side.label}: {s.per_step:g} {kind}/step (per step {s.counts}, counted from {c.source}), "
                f"{fmt_bytes(s.bytes_per_step)}/step, message median {fmt_bytes(s.size_median)} "
                f"(min {fmt_bytes(s.size_min)}, max {fmt_bytes(s.size_max)}{unsized}), ops {s.ops or '-'}; "
                f"other collectives per step: {others}")

    def assert_collectives_within(self, kind: str, k: float) -> ProbeCheck:
        """Fail unless A's calls per step of `kind` (e.g. "all_gather") are at most k x B's."""
        __tracebackhide__ = True
        k = check_limit("ProbeAssertions.assert_collectives_within", k)
        b = self._other()
        alone = [s.label for s in (self.a, b) if s.runs[0].spec.world_size < 2]
        if alone:  # one rank gathers, reduces and scatters nothing: 0 vs 0 would read as a pass
            _skip(f"{kind} per step: {', '.join(alone)} ran on one rank, where no collective runs; compare "
                  f"collectives at world size 2 or more")
        va, vb = self.collectives_per_step(self.a, kind), self.collectives_per_step(b, kind)
        ratio = va / vb if vb else (1.0 if va == 0 else float("inf"))
        check = decided(f"{kind}_per_step", self.a.label, b.label, va, vb, ratio, k, "count")
        return self._finish(check, [
            f"{kind} calls per step of {self.a.label} are {ratio:.3f}x {b.label}'s, above the {k:.2f}x limit",
            f"  A {self._comm_line(self.a, kind)}", f"  B {self._comm_line(b, kind)}"])

    def assert_overlap_at_least(self, floor: float) -> ProbeCheck:
        """Fail unless at least `floor` of A's NCCL kernel time runs under compute kernels (CUDA)."""
        __tracebackhide__ = True
        floor = check_limit("ProbeAssertions.assert_overlap_at_least", floor, zero=True)
        results = self.a.need("overlap")
        fractions = [o.fraction for o in results if o is not None and o.fraction is not None]
        if not fractions:
            _skip(f"overlap probe of {self.a.label}: no NCCL kernel ran in the probed steps")
        worst = min(fractions)
        o = results[fractions.index(worst)]
        check = self._absolute("comm_overlap", worst, floor, "frac", "at_least")
        return self._finish(check, [
            f"only {worst:.1%} of {self.a.label}'s communication-kernel time overlaps compute kernels, "
            f"below the {floor:.0%} floor",
            f"  per step: comm {[fmt_seconds(x) for x in o.comm_seconds]}, exposed "
            f"{[fmt_seconds(x) for x in o.exposed_seconds]}, compute {[fmt_seconds(x) for x in o.compute_seconds]}, "
            f"NCCL kernels {o.comm_kernels}"])

    def _optimizers(self) -> list[Any]:
        placements = self.a.need("placement")
        if not any(p.optimizer for p in placements):
            raise AssertionError(f"{self.a.label}: no `Optimizer.step#<Class>.step` range in the probed steps, so "
                                 f"the probe cannot tell where the optimizer ran")
        return placements

    def assert_optimizer_cpu_time(self, optimizer: str) -> ProbeCheck:
        """Fail unless the optimizer class `optimizer` (e.g. "DeepSpeedCPUAdam") ran with CPU time in every step."""
        __tracebackhide__ = True
        placements = self._optimizers()
        per_rank = [min(p.optimizer[optimizer].cpu_seconds) if optimizer in p.optimizer else 0.0 for p in placements]
        seen = sorted({name for p in placements for name in p.optimizer})
        check = self._absolute(f"{optimizer}_cpu_time", min(per_rank), 0.0, "s", "above")
        return self._finish(check, [
            f"{self.a.label}: {optimizer}.step() did not run in every probed step (least time per step "
            f"{fmt_seconds(min(per_rank))}); optimizers that ran: {', '.join(seen)}"])

    def assert_no_optimizer_gpu_kernels(self) -> ProbeCheck:
        """Fail if any GPU kernel was launched from inside an optimizer's step() (CUDA)."""
        __tracebackhide__ = True
        placements = self._optimizers()
        if all(o.gpu_kernels is None for p in placements for o in p.optimizer.values()):
            _skip(f"placement probe of {self.a.label}: GPU kernels inside optimizer.step() need CUDA")
        worst = max(max(o.gpu_kernels or [0]) for p in placements for o in p.optimizer.values())
        detail = "; ".join(f"rank {r.rank} {o.name}: kernels/step {o.gpu_kernels} "
                           f"({[fmt_seconds(x) for x in o.gpu_kernel_seconds or []]}), CPU "
                           f"{[fmt_seconds(x) for x in o.cpu_seconds]}"
                           for r, p in zip(self.a.results, placements) for o in p.optimizer.values())
        check = self._absolute("optimizer_gpu_kernels", worst, 0, "count", "at_most")
        return self._finish(check, [f"{self.a.label}: {worst} GPU kernel(s) launched inside optimizer.step() "
                                    f"in one step; expected none (the optimizer should run on the CPU)",
                                    f"  {detail}"])

    def assert_optimizer_state_on(self, device_type: str) -> ProbeCheck:
        """Fail unless every optimizer-state tensor (and master param it updates) is on `device_type`."""
        __tracebackhide__ = True
        if self.a.device == device_type == "cpu":
            _skip(f"{self.a.label} is a CPU job: every tensor is on the CPU, so state placement needs CUDA "
                  f"to tell offload from no offload")
        placements = self.a.need("placement")
        elsewhere = max(sum(n for dev, n in p.state_bytes.items() if dev != device_type) for p in placements)
        check = self._absolute(f"optimizer_state_off_{device_type}", elsewhere, 0, "bytes", "at_most")
        return self._finish(check, [
            f"{self.a.label}: {fmt_bytes(elsewhere)} of optimizer state is not on {device_type}",
            "  " + "; ".join(f"rank {r.rank}: " + ", ".join(f"{d} {fmt_bytes(n)} ({p.state_tensors.get(d, 0)} tensors)"
                                                          for d, n in sorted(p.state_bytes.items()))
                             for r, p in zip(self.a.results, placements))])

    def _copies(self) -> list[Any]:
        placements = self.a.need("placement")
        if all(p.copies is None for p in placements):
            _skip(f"placement probe of {self.a.label}: host/device copies need CUDA")
        return placements

    def assert_no_pageable_copies(self) -> ProbeCheck:
        """Fail if any host/device copy in the probed steps used pageable (unpinned) host memory (CUDA)."""
        __tracebackhide__ = True
        placements = self._copies()
        worst = max(max(p.pageable_per_step()) for p in placements)
        detail = "; ".join(f"rank {r.rank} {c.kind}: {c.pageable_counts} pageable of {c.counts} copies/step "
                           f"({fmt_bytes(max(c.pageable_bytes))} max/step)"
                           for r, p in zip(self.a.results, placements) for c in (p.copies or {}).values()
                           if any(c.pageable_counts))
        check = self._absolute("pageable_copies", worst, 0, "count", "at_most")
        return self._finish(check, [f"{self.a.label}: {worst} pageable host/device copies in one step; "
                                    f"expected none (pinned buffers let copies overlap)", f"  {detail}"])

    def assert_copy_bytes_within(self, kind: str, expected_bytes: float, k: float) -> ProbeCheck:
        """Fail unless `kind` copies ("DtoH", "HtoD", "DtoD") move at most k x `expected_bytes` per step (CUDA)."""
        __tracebackhide__ = True
        k = check_limit("ProbeAssertions.assert_copy_bytes_within", k)
        expected_bytes = check_limit("ProbeAssertions.assert_copy_bytes_within(expected_bytes=...)", expected_bytes)
        placements = self._copies()
        worst = max(p.copy(kind).bytes_per_step for p in placements)
        ratio = worst / expected_bytes if expected_bytes > 0 else float("inf")
        check = decided(f"{kind}_bytes_per_step", self.a.label, "expected", worst, expected_bytes, ratio, k, "bytes")
        return self._finish(check, [
            f"{self.a.label}: {kind} copies move {fmt_bytes(worst)} per step, {ratio:.3f}x the expected "
            f"{fmt_bytes(expected_bytes)}, above the {k:.2f}x limit",
            "  " + "; ".join(f"rank {r.rank}: {p.copy(kind).counts} copies/step, "
                             f"{[fmt_bytes(x) for x in p.copy(kind).bytes]}"
                             for r, p in zip(self.a.results, placements))])
