"""The terminal tables of distperf runs and checks, read from the session document."""

from __future__ import annotations

from typing import Callable, Iterable

from pytest_distperf.figures.units import fmt_bytes, fmt_pct, fmt_rate, fmt_seconds, fmt_value
from pytest_distperf.figures.wording import pair_to_pair, short_test
from pytest_distperf.figures.quantities import TIME_PARTS, JobFigures, time_split_text
from pytest_distperf.decide.checks import Check
from pytest_distperf.decide.probe_checks import ProbeCheck
from pytest_distperf.decide.regression import NEAREST, save_command
from pytest_distperf.decide.verdicts import MetricVerdict, DetectableChange
from pytest_distperf.figures.explain import Explanation
from pytest_distperf.rank.probes.results import ProbeSummary
from pytest_distperf.report.document import TestDocument, unique_jobs
from pytest_distperf.report.outcomes import OUTCOME_MARK, status_mark
from pytest_distperf.report.rows import shared


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    line = lambda r: "  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip()  # noqa: E731
    return [line(header), line(["-" * w for w in widths]), *map(line, rows)]


def _fmt_value(value: float, unit: str) -> str:
    return fmt_value(value, unit, digits=4)  # a check's sides: four digits keep the table narrow


# What the job table's figures are (figures/quantities.py), said once under it.
LEGEND = ("step time: slowest rank per step, median of a run's steps, geometric mean of the runs; run-to-run: sd of "
          "log run step times; peak mem: highest rank (CUDA peak allocated, CPU host RSS growth: a secondary figure, "
          "memory on CPU is decided on train mem), geometric mean of the runs; collectives: per step, per rank (the "
          "rank with the most)")
_KIND_ABBREV = {"all_gather": "AG", "reduce_scatter": "RS", "all_reduce": "AR", "broadcast": "BC"}
_LIMIT_SYMBOL = {"at_most": "<= ", "at_least": ">= ", "above": "> "}  # probe checks (probe_checks.ProbeCheck)


def _probe_row(r: ProbeSummary) -> list[str]:
    """One job's probe metrics (probes.results.ProbeResult.metrics) as table cells; '-' where not measured."""
    m = r.metrics
    kinds = sorted(k.split(".")[1] for k in m if k.startswith("comms.") and k.endswith(".calls_per_step"))
    comms = " ".join(f"{_KIND_ABBREV.get(k, k)} {m[f'comms.{k}.calls_per_step']:g}" for k in kinds) or "-"
    ag = fmt_bytes(m["comms.all_gather.size_median"]) if "comms.all_gather.size_median" in m else "-"
    overlap = f"{m['overlap.fraction']:.0%}" if "overlap.fraction" in m else "-"
    exposed = fmt_seconds(m["overlap.exposed_per_step_s"]) if "overlap.exposed_per_step_s" in m else "-"
    copy_kinds = sorted(x.split(".")[2] for x in m
                        if x.startswith("placement.copies.") and x.endswith(".bytes_per_step"))
    copies = " ".join(f"{k} {m[f'placement.copies.{k}.per_step']:g} "
                      f"({fmt_bytes(m[f'placement.copies.{k}.bytes_per_step'])})" for k in copy_kinds) or "-"
    pageable = f"{m['placement.copies.pageable_per_step']:g}" if "placement.copies.pageable_per_step" in m else "-"
    opts = []
    for name in sorted({k.split(".")[2] for k in m if k.startswith("placement.optimizer.")}):
        text = f"{name} CPU {fmt_seconds(m[f'placement.optimizer.{name}.cpu_s'])}"
        if f"placement.optimizer.{name}.gpu_kernels" in m:
            text += (f" / GPU {m[f'placement.optimizer.{name}.gpu_kernels']:g} kernels "
                     f"{fmt_seconds(m[f'placement.optimizer.{name}.gpu_kernel_s'])}")
        opts.append(text)
    util = f"{m['placement.cpu_utilisation']:.2f}" if "placement.cpu_utilisation" in m else "-"
    return [r.label, str(r.steps), comms, ag, overlap, exposed, copies, pageable, "; ".join(opts) or "-", util]


WORK_LEGEND = ("work figures: measured in steps of their own after timing (rank/work.py); GPU time: compute "
               "kernels + memcpy/memset, busiest rank; GPU busy: share of the step time the GPU was busy; counts: "
               "the rank with the most; train mem (CPU): parameters, gradients, optimizer state + a step's "
               "allocation peak, the figure CPU memory checks and the gate decide on")


def _work_row(r: JobFigures) -> list[str]:
    """A job's work figures (JobFigures.work) as table cells, with its host-bound note last ('' when none)."""
    w = r.work

    def count(name: str) -> str:
        return f"{w[name]:.4g}" if name in w else "-"

    share = r.gpu_busy_share
    note = r.host_bound_text() or ""
    return [r.label, fmt_seconds(w["gpu_time"]) if "gpu_time" in w else "-",
            "-" if share is None else f"{share:.0%}", count("kernels_per_step"), count("flops_per_step"),
            count("aten_ops_per_step"), count("instructions_per_step"),
            fmt_bytes(w["train_memory"]) if "train_memory" in w else "-", note]


def baseline_row(nodeid: str, v: MetricVerdict) -> list[str]:
    """One metric of one job against its baseline (the terminal's and the Markdown summary's cells)."""
    return [short_test(nodeid), v.job, v.metric, fmt_value(v.baseline, v.unit), fmt_value(v.current, v.unit),
            fmt_pct(v.delta), v.interval_text(), status_mark(v.status, v.fails)]


def _merge_shared(rows: list[list[str]]) -> list[list[str]]:
    """Tests that share a job's runs (a cached comparison) get the same verdict rows: show each once,
    under the first test, with how many more tests carry it."""
    return [[row[0] + (f" (+{len(tests) - 1} tests)" if len(tests) > 1 else ""), *row[1:]]
            for row, tests in shared(((row[0], row) for row in rows), lambda row: tuple(row[1:]))]


def _job_row(r: JobFigures) -> list[str]:
    """One job's figures (figures/quantities.JobFigures) as the job table's cells."""
    return [r.label, f"{r.runs}x{r.steps}", fmt_seconds(r.step_time),
            "-" if r.run_cv is None else f"{r.run_cv:.1%}", f"{fmt_seconds(r.step_p10)} - {fmt_seconds(r.step_p90)}",
            fmt_rate(r.tokens_per_s) if r.tokens_per_s else "-",  # 0: a workload that counts no tokens
            fmt_bytes(r.peak_memory), f"{r.optimizer_bytes_per_param:.1f}"]


def _check_row(nodeid: str, r: Check) -> list[str]:
    ci = f" {r.interval_text()}" if r.method in ("paired", "unpaired") else ""  # words where it cannot bound
    ratio = f"{r.ratio:.3f}{ci}" if r.unit != "rel" else f"{r.ratio:.1e}"
    limit = f"{r.threshold:.2f}" if r.unit != "rel" else f"{r.threshold:.0e}"
    if isinstance(r, ProbeCheck):  # the limit is absolute or a ratio, with its direction
        absolute = r.b == "limit"
        limit = _LIMIT_SYMBOL.get(r.direction, "") + (_fmt_value(r.threshold, r.unit) if absolute
                                                      else f"{r.threshold:.2f}")
        ratio = _fmt_value(r.ratio, r.unit) if absolute else ratio
    pairs = str(r.pairs) if r.method == "paired" else "-"
    return [short_test(nodeid), r.name, f"{r.a} = {_fmt_value(r.a_value, r.unit)}",
            f"{r.b} = {_fmt_value(r.b_value, r.unit)}", ratio, pairs, pair_to_pair(r.method, r.pair_cv), limit,
            OUTCOME_MARK[r.outcome]]


def render(tests: Iterable[TestDocument]) -> list[str]:
    """The session's tables, each section after a blank line."""
    tests = list(tests)
    jobs = [shared.job.figures for shared in unique_jobs(tests)]  # a job shared by several tests: its row once
    lines = _jobs_section(tests, jobs)
    for section in (_time_split_section(jobs), _work_section(jobs), _checks_section(tests), _probes_section(tests),
                    _baselines_section(tests), *_against_sections(tests), _unrecorded_section(tests),
                    _saved_section(tests)):
        if section:
            lines += [""] + section
    return lines


def _secondary_lines(secondaries: dict[str, str]) -> list[str]:
    """A figure shown beside the one that decided, never decided on (CPU memory: host RSS growth)."""
    return [f"  {where}: {text}" for where, text in secondaries.items()]


def _jobs_section(tests: list[TestDocument], jobs: list[JobFigures]) -> list[str]:
    if not jobs:
        return []
    departures: dict[str, dict[str, str]] = {}  # job -> where its adapter departs from its library's defaults
    for j in (j for t in tests for j in t.jobs if j.departures):
        departures.setdefault(j.figures.label, j.departures)
    return (_table(["job", "runs x steps", "step time", "run-to-run", "steps p10 - p90", "tok/s", "peak mem",
                    "opt B/param"], [_job_row(r) for r in jobs]) + [f"  {LEGEND}"]
            + [f"  {label} departs from its library's defaults: " + "; ".join(f"{k} {v}" for k, v in sorted(d.items()))
               for label, d in departures.items()])


def _time_split_section(jobs: list[JobFigures]) -> list[str]:
    splits = [(r.label, r.time_split) for r in jobs if r.time_split]
    return time_split_lines(splits) if splits else []


def _work_section(jobs: list[JobFigures]) -> list[str]:
    rows = [_work_row(r) for r in jobs if r.work]
    if not rows:
        return []
    return (_table(["job: work per step", "GPU time", "GPU busy", "kernels", "FLOP", "ops", "instructions",
                    "train mem"], [row[:-1] for row in rows])
            + [f"  {WORK_LEGEND}"] + [f"  {row[0]}: {row[-1]}" for row in rows if row[-1]])


def _checks_section(tests: list[TestDocument]) -> list[str]:
    rows = [_check_row(t.nodeid, c) for t in tests for c in t.checks]
    if not rows:
        return []
    secondaries: dict[str, str] = {}
    for t in tests:
        for c in t.checks:
            if getattr(c, "secondary", ""):
                secondaries.setdefault(f"{short_test(t.nodeid)} {c.name}", c.secondary)
    return _table(["test", "check", "A", "B", "A/B [98% interval]", "pairs", "pair-to-pair", "limit", "verdict"],
                  rows) + _secondary_lines(secondaries)


def _probes_section(tests: list[TestDocument]) -> list[str]:
    rows = [_probe_row(p) for t in tests for p in t.probes]
    return _table(["probed job (worst rank)", "steps", "collectives/step/rank", "AG median", "overlap", "exposed/step",
                   "copies/step (bytes)", "pageable/step", "optimizer.step()", "CPU cores busy"], rows) if rows else []


def _baselines_section(tests: list[TestDocument]) -> list[str]:
    verdicts = [(t.nodeid, v) for t in tests for v in t.verdicts if not v.reference]
    shown = [(nodeid, v) for nodeid, v in verdicts if v.status != "new"]
    # the failed and undecided verdicts' notes are in the failure message and the warning; a pass's, and a changed
    # configuration's that fails nothing (what changed), only here
    if not shown:
        return []
    saved = {t.nodeid for t in tests if t.saved}
    note = (["--distperf-save: the saved tests' verdicts compare the runs just saved with the baseline they replace: "
             "shown, not enforced"] if any(nodeid in saved for nodeid, _ in shown) else [])
    return note + _verdict_lines(shown, [v for _, v in verdicts], ("baseline", "current"),
                                 lambda v: v.status == "pass" or v.status == "not comparable" and not v.fails)


def _against_sections(tests: list[TestDocument]) -> list[list[str]]:
    """Head vs base (decide/against.py): a table per "head ... vs base ...", then why each undecided, failed or
    incomparable verdict is so."""
    references = dict.fromkeys(v.reference for t in tests for v in t.verdicts if v.reference)
    sections = []
    for reference in references:
        shown = [(t.nodeid, v) for t in tests for v in t.verdicts if v.reference == reference]
        sections.append([f"{reference}:"] + _verdict_lines(shown, [v for _, v in shown], ("base", "head"), lambda v: True))
    return sections


def _verdict_lines(shown: list[tuple[str, MetricVerdict]], explained: list[MetricVerdict], sides: tuple[str, str],
                   noted: Callable[[MetricVerdict], bool]) -> list[str]:
    """A table of baseline verdicts (each shared row once), the notes of the `noted` verdicts (a pass has one only
    when it is worse within its limit), the secondary figures, and what changed under `explained`."""
    rows = [baseline_row(nodeid, v) for nodeid, v in shown]
    secondaries: dict[str, str] = {}
    for _, v in shown:
        if v.secondary:
            secondaries.setdefault(f"{v.job} {v.metric}", v.secondary)
    lines = _table(["test", "job", "metric", *sides, "Δ %", "98% interval", "status"], _merge_shared(rows))
    # a changed configuration is the job's, the same on each of its metrics: said once
    lines += dict.fromkeys(f"  {v.job}: {v.note}" if v.status == "not comparable" else f"  {v.job} {v.metric}: {v.note}"
                           for _, v in shown if v.note and noted(v))
    return lines + _secondary_lines(secondaries) + explanation_lines(explained, sides)


def explanation_lines(verdicts: list[MetricVerdict], sides: tuple[str, str] = ("baseline", "current")) -> list[str]:
    """What changed by operator/kernel under the verdicts that carry it: once per job (every verdict of a job
    carries the same diff), naming the verdicts."""
    by_job: dict[str, tuple[list[str], dict]] = {}
    for v in verdicts:
        if v.explanation:
            by_job.setdefault(v.job, ([], v.explanation))[0].append(f"{v.metric} {v.status.upper()}")
    out = []
    for job, (names, explanation) in by_job.items():
        out.append(f"  {job} ({', '.join(names)}):")
        out += ["    " + line for line in Explanation.from_json(explanation).lines(sides)]
    return out


def _unrecorded_section(tests: list[TestDocument]) -> list[str]:
    """The jobs with no baseline yet, each with the command that records it (repeating the options that decide
    where the baseline goes) and, where the baseline holds a job near it, how that one differs."""
    saved = {(t.nodeid, r.job) for t in tests for r in t.saved}
    unrecorded: dict[tuple[str, str], list[MetricVerdict]] = {}  # (test, job) -> its metrics with no baseline yet
    args: dict[str, list[str]] = {}
    for t in tests:
        for v in t.verdicts:
            if not v.reference and v.status == "new" and (t.nodeid, v.job) not in saved:
                unrecorded.setdefault((t.nodeid, v.job), []).append(v)
                args[t.nodeid] = list(t.context.save_args) if t.context is not None else []
    if not unrecorded:
        return []
    lines = [f"no baseline yet for {len(unrecorded)} job(s); to record one, run the command shown:"]
    for (nodeid, job), verdicts in unrecorded.items():
        lines.append(f"  {job} ({len(verdicts)} metrics) in {short_test(nodeid)}: {save_command(nodeid, args[nodeid])}")
        # the job's missing-baseline note where it names the stored job nearest to this one (regression.nearest_job)
        lines += [f"    {note}" for note in dict.fromkeys(v.note for v in verdicts) if NEAREST in note]
    return lines


def _saved_section(tests: list[TestDocument]) -> list[str]:
    """What each baseline just saved lets the gate decide (decide/verdicts.DetectableChange), then each save that
    replaced a baseline, with what that held: never unsaid."""
    rows = [_saved_row(t.nodeid, r) for t in tests for r in t.saved]
    replaced = [t.context.replaced_text() for t in tests if t.context is not None and t.context.replaced]
    lines = []
    if rows:
        lines = (["saved baselines: what each lets the gate decide against as many runs as the budget, as spread"]
                 + _table(["test", "job", "metric", "runs", "run-to-run", "limit", "fails above",
                           "unchanged passes"], rows))
    if replaced:
        lines += [f"saved baselines that replaced one ({len(replaced)}): the old contents are gone from the folder "
                  f"(git has them where the baselines are committed)"] + [f"  {text}" for text in replaced]
    return lines


def time_split_lines(splits: list[tuple[str, dict[str, float]]]) -> list[str]:
    """Where the jobs' wall time went (figures/quantities.run_time_split): a row a job, then the session's total."""
    parts = TIME_PARTS

    def cells(split: dict[str, float]) -> list[str]:
        wall = split["wall"]
        return [f"{wall:.1f} s"] + [f"{split[p]:.1f} s ({split[p] / wall:.0%})" if wall > 0 and p in split else "-"
                                    for p in parts]

    rows = [[label] + cells(split) for label, split in splits]
    total = {k: sum(s.get(k, 0.0) for _, s in splits) for k in ("wall", *parts)}
    lines = _table(["job: where the runs' time went", "wall", "start-up", "build", "warm-up", "timed",
                    "after timing", "other"], rows)
    if total["wall"] > 0:
        lines.append(f"  {len(splits)} job(s), {time_split_text(total)}")
    return lines


def _saved_row(nodeid: str, r: DetectableChange) -> list[str]:
    """One metric of a job just saved: what its stored runs let the gate decide."""
    cv = "-" if r.run_cv is None else f"{r.run_cv:.1%}"
    passes = ("yes" if r.can_pass else "no: too few runs" if r.factor is None
              else f"no: interval ×/÷{r.factor_text()}")
    return [short_test(nodeid), r.job, r.metric, str(r.runs), cv, f"+{r.limit:.1%}", r.fails_above_text(), passes]
