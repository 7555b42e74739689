"""The JSON report's format: its version, and its runs as it holds them (`tests[].jobs[].runs[]`).

A run is written once, with its stable id, its figures (measure/figures.run_figures: the one derivation) and its
per-rank measurements; its job (report/document.JobRecord) holds its id, figures and runs. Every reader of a
report -- the history, the HTML report, the PR comment -- reads the figures written here and derives none.
Reports of REPORT_VERSION 1 carry no `figures` per run: `run_figures_in` derives them from the measurements
those reports hold, through the same definitions.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, Mapping

from pytest_distperf.measure.figures import (RunFigures, comms_counts, node_step_medians, peak_memory_of,
                                             rank_probe_metrics, run_figures, step_time_of)

if TYPE_CHECKING:
    from pytest_distperf.rank.results import RunResult

# 4: each test's `out_of_budget` (why --distperf-session-budget stopped it before its first look was done, else
# null) and their count, `summary.out_of_budget`.
# 3: each job once (`tests[].jobs[]`: figures, runs, slot waits, departures; no `tests[].runs[]`), for every test
# that ran one, and the test's machine class also head vs base. 2: stable ids of jobs and runs and each run's
# figures (`tests[].jobs[].runs[].figures`). 1: neither.
REPORT_VERSION = 4


class ReportVersionError(ValueError):
    """A report written by a newer pytest-distperf than this one reads."""


def check_version(doc: Mapping[str, Any], source: str) -> int:
    """The document's report_version (1 when absent); ReportVersionError naming `source` when it is newer."""
    version = doc.get("report_version", 1)
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ReportVersionError(f"{source}: report_version must be a positive integer, got {version!r}")
    if version > REPORT_VERSION:
        raise ReportVersionError(f"{source}: written as report version {version}, newer than the {REPORT_VERSION} "
                                 f"this pytest-distperf reads; upgrade pytest-distperf")
    return version


def run_to_dict(run: "RunResult") -> dict[str, Any]:
    """One run with its figures and per-rank measurements, JSON-ready."""
    ranks = []
    for k in run.ranks:
        ranks.append({
            "rank": k.rank, "host": k.host, "node_rank": k.node_rank,
            "step_times": list(k.step_times), "step_median": step_time_of(k.step_times),
            "losses": list(k.losses), "cuda_peak_allocated": k.cuda_peak_allocated,
            "cuda_peak_reserved": k.cuda_peak_reserved, "host_peak_rss": k.host_peak_rss,
            "host_training_bytes": k.host_training_bytes, "optimizer_state_bytes": k.optimizer_state_bytes,
            "build_seconds": k.build_seconds, "warmup_seconds": k.warmup_seconds,
            # where a step's time goes (forward/backward/optimizer/other), also when no check failed
            "step_breakdown": dict(k.step_breakdown),
            "extra": json.loads(json.dumps(k.extra, default=repr)),
            "probes": rank_probe_metrics(k),
            # the GPU's clocks, throttle reasons, power and temperature over the timed steps (rank/clocks.py)
            "gpu_window": k.gpu_window.to_json() if getattr(k, "gpu_window", None) is not None else None,
            # what the steps asked of the machine, per profiled step (rank/work.py)
            "work": asdict(k.work) if getattr(k, "work", None) is not None else None,
        })
    figures = run_figures(run)
    load = run.host_other_load
    return {"id": run.id, "figures": figures.to_json(),
            "wall_seconds": run.wall_seconds, "step_times": run.step_times, "peak_memory": run.peak_memory,
            "work": figures.work,
            "tokens_per_step": run.tokens_per_step, "num_params": run.ranks[0].num_params, "ranks": ranks,
            "node_step_medians": node_step_medians(run),
            "host_other_load_cores": round(load[0], 2) if load else None}


def run_figures_in(run: Mapping[str, Any]) -> RunFigures:
    """A report run's figures: as written (report version 2), or derived from the measurements a version-1 run
    holds through the same definitions. KeyError, TypeError or ValueError where the run lacks them."""
    if isinstance(run.get("figures"), Mapping):
        return RunFigures.from_json(run["figures"])
    ranks = run["ranks"]
    return RunFigures(id=str(run.get("id") or ""), step_time=step_time_of([float(t) for t in run["step_times"]]),
                      peak_memory=peak_memory_of(float(run["peak_memory"])),
                      optimizer_state_bytes=float(sum(k["optimizer_state_bytes"] for k in ranks)),
                      work={str(n): float(v) for n, v in (run.get("work") or {}).items()},
                      comms=comms_counts(k.get("probes") for k in ranks))
