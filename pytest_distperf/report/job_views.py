"""The view of the HTML report's #jobs and #probes sections: each job once with its per-rank step times, memory
and breakdown; each probed job with its collectives, probe metrics and one step's timeline."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

from markupsafe import Markup

from pytest_distperf.figures.quantities import SCOPES, JobFigures, step_time_of, time_split_text
from pytest_distperf.figures.units import fmt_bytes, fmt_seconds
from pytest_distperf.rank.probes.results import ProbeSummary, StepTimeline
from pytest_distperf.report.document import JobRecord, TestDocument, unique_jobs
from pytest_distperf.report.charts import WIDTH, bar_chart, breakdown_chart, strip_chart, timeline_chart
from pytest_distperf.figures.wording import short_test
from pytest_distperf.report.rows import probe_records, run_steps
from pytest_distperf.report.svg import COMM_COLOUR, COMPUTE_COLOUR, OVERLAP_COLOUR, RANK_COLOURS, legend

STRAGGLER_MARK = 0.05  # a rank whose median step is this much above the fastest rank's is drawn in red
BYTES_COLOUR = "#E69F00"
# the rank record's memory figure per device, and what it is
MEMORY_OF_DEVICE = {"cuda": ("cuda_peak_allocated", "CUDA peak allocated")}
HOST_MEMORY = ("host_training_bytes", "host RSS growth during training")
Figure = tuple[str, str, str]  # text, value in bold, text after


@dataclass
class JobSection:
    label: str
    runs: int
    steps: int  # timed steps of the first run
    tests: list[str]
    figures: list[Figure]
    host_bound_text: str
    time_split_text: str  # where the runs' wall time went (figures/quantities.time_split_text)
    ranks: Markup
    memory_what: str
    memory: Markup | None
    breakdown: tuple[Markup, Markup] | None  # legend, chart


@dataclass
class TimelineView:
    first: StepTimeline  # whose step the note describes
    comm_ms: float
    legend: Markup
    chart: Markup


@dataclass
class ProbeSection:
    label: str
    steps: int
    tests: list[str]
    collectives: list[tuple[str, str, str, str]]  # kind, calls / step, bytes / step, message sizes
    charts: Markup | None
    metrics: list[tuple[str, str]]  # overlap.* and placement.* values
    not_measured: list[tuple[str, str]]
    timeline: TimelineView | None
    traces: list[str]


def job_sections(tests: Iterable[TestDocument]) -> list[JobSection]:
    return [_job_section(shared.job, shared.tests) for shared in unique_jobs(tests) if shared.job.runs]


def _job_section(job: JobRecord, tests: list[str]) -> JobSection:
    runs = job.runs
    records = [r for run in runs for r in run["ranks"]]
    ranks = sorted({r.get("rank") for r in records}, key=lambda v: (v is None, v))
    hosts = {r.get("rank"): r.get("host") for r in records if r.get("host")}
    several_hosts = len(set(hosts.values())) > 1  # on several nodes a rank's row says where it ran
    key, what = MEMORY_OF_DEVICE.get(job.figures.device, HOST_MEMORY)
    rows: list[tuple[str, list[float], str, str]] = [
        ("step (slowest rank)", [t for run in runs for t in run_steps(run)], "#24292f", "circle")]
    medians, bars = [], []
    for k, rank in enumerate(ranks):
        own, colour = [r for r in records if r.get("rank") == rank], RANK_COLOURS[k % len(RANK_COLOURS)]
        times = [float(t) for r in own for t in r["step_times"]]
        name = f"rank {rank}" + (f" ({hosts.get(rank)})" if several_hosts and hosts.get(rank) else "")
        rows.append((name, times, colour, "circle"))
        medians.append(step_time_of(times) if times else 0.0)  # the rank's step time
        vals = [float(r[key]) for r in own if r.get(key) is not None]
        if vals:
            bars.append((f"rank {rank}", max(vals), colour, f"rank {rank}: {what} {fmt_bytes(max(vals))} (largest of "
                         f"{len(vals)} run(s); each: {', '.join(fmt_bytes(v) for v in vals)})"))
    notes: dict[int, tuple[str, bool]] = {}
    fastest = min(medians, default=0.0)
    for k, med in enumerate(medians):
        if len(medians) > 1 and fastest > 0:
            behind = med / fastest - 1
            slowest = med == max(medians)
            text = "fastest" if med == fastest else ("slowest " if slowest else "") + f"{behind:+.1%}"
            notes[k + 1] = (text, slowest and behind >= STRAGGLER_MARK)
    label = job.label
    broken_down = [r for r in runs[0]["ranks"] if r.get("step_breakdown")]  # the first run's, per rank
    return JobSection(
        label=label, runs=len(runs), steps=len(run_steps(runs[0])), tests=[short_test(n) for n in tests],
        figures=figures_parts(job.figures), host_bound_text=job.figures.host_bound_text() or "",
        time_split_text=time_split_text(job.figures.time_split) if job.figures.time_split else "",
        ranks=strip_chart(rows, "s", f"step time per rank of {label}", "strip ranks", notes=notes),
        memory_what=what,
        memory=bar_chart(bars, "bytes", f"memory per rank of {label}", "bars memory") if bars else None,
        breakdown=breakdown_chart(broken_down, f"step breakdown of {label}") if broken_down else None)


def figures_parts(f: JobFigures) -> list[Figure]:
    """The job's figures as the document states them (figures/quantities.py defines each)."""
    parts: list[Figure] = [("step time ", fmt_seconds(f.step_time), f" ({SCOPES['step_time'][1]})")]
    if f.run_cv is not None:
        parts.append((f"run-to-run {f.run_cv:.1%}", "", ""))
    parts.append((f"p10–p90 {fmt_seconds(f.step_p10)} – {fmt_seconds(f.step_p90)}", "", ""))
    parts.append(("peak memory ", fmt_bytes(f.peak_memory), f" ({f.memory_kind})"))
    if f.tokens_per_s:
        parts.append((f"{f.tokens_per_s:,.0f} tokens/s", "", ""))
    parts.append((f"optimizer state {f.optimizer_bytes_per_param:.1f} B/param", "", ""))
    work = f.work
    if "gpu_time" in work:
        parts.append(("GPU kernel time ", fmt_seconds(work["gpu_time"]), "/step"))
    if f.gpu_busy_share is not None:
        parts.append((f"GPU busy {f.gpu_busy_share:.0%} of the step", "", ""))
    for name, what in (("kernels_per_step", "kernels"), ("flops_per_step", "FLOP"), ("aten_ops_per_step", "ops"),
                       ("instructions_per_step", "instructions")):
        if name in work:
            parts.append((f"{work[name]:.4g} {what}/step", "", ""))
    if "train_memory" in work:
        parts.append((f"training state {fmt_bytes(work['train_memory'])}", "", ""))
    return parts


def probe_sections(tests: Iterable[TestDocument]) -> list[ProbeSection]:
    return [_probe_section(p, nodeids) for p, nodeids in probe_records(tests)]


def _probe_section(p: ProbeSummary, tests: list[str]) -> ProbeSection:
    m: Mapping[str, float] = p.metrics
    calls_of = {k.split(".")[1]: float(v) for k, v in m.items()
                if k.startswith("comms.") and k.count(".") == 2 and k.endswith(".calls_per_step")}
    kinds = sorted(calls_of)
    rows, charts = [], None
    for kind in kinds:
        size = (f"{fmt_bytes(m[f'comms.{kind}.size_min'])} / {fmt_bytes(m[f'comms.{kind}.size_median'])} / "
                f"{fmt_bytes(m[f'comms.{kind}.size_max'])}" if f"comms.{kind}.size_median" in m else "unsized")
        per_step = fmt_bytes(m[f"comms.{kind}.bytes_per_step"]) if f"comms.{kind}.bytes_per_step" in m else "–"
        rows.append((kind, f"{calls_of[kind]:g}", per_step, size))
    label = p.label
    if kinds:
        charts = bar_chart([(k, calls_of[k], COMM_COLOUR, f"{k}: {calls_of[k]:g} calls per step") for k in kinds],
                           "calls", f"collective calls per step of {label}", "bars collectives", width=WIDTH // 2)
        sized = [k for k in kinds if f"comms.{k}.bytes_per_step" in m]
        if sized:
            charts += bar_chart([(k, float(m[f"comms.{k}.bytes_per_step"]), BYTES_COLOUR, "") for k in sized],
                                "bytes", f"collective bytes per step of {label}", "bars collective-bytes",
                                width=WIDTH // 2)
    timelines = [StepTimeline.from_dict(t) for t in p.timelines]
    timeline = None
    if timelines:
        key = legend([("bar", COMPUTE_COLOUR, "compute"), ("bar", COMM_COLOUR, "communication"),
                      ("bar", OVERLAP_COLOUR, "both at once (overlap)")])
        timeline = TimelineView(timelines[0], timelines[0].comm_time() / 1e3, Markup(key),
                                timeline_chart(timelines, f"compute and communication timeline of one step of {label}"))
    return ProbeSection(
        label=label, steps=p.steps, tests=[short_test(n) for n in tests], collectives=rows, charts=charts,
        metrics=[(k, _probe_value(k, v)) for k, v in sorted(m.items()) if k.startswith(("overlap.", "placement."))],
        not_measured=sorted(p.not_measured.items()), timeline=timeline, traces=list(p.traces))


def _probe_value(key: str, v: float) -> str:
    if key.endswith(("_s", ".cpu_s", "gpu_kernel_s")):
        return fmt_seconds(v)
    if "bytes" in key:
        return fmt_bytes(v)
    if key == "overlap.fraction":
        return f"{v:.0%}"
    return f"{v:.4g}"
