"""The JSON report's format (REPORT) and its runs as it holds them (`tests[].jobs[].runs[]`): each run written
once, with its id, its figures and its per-rank measurements, so that no reader of a report derives a figure.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from pytest_distperf.rank.time_table import run_table, trimmed
from pytest_distperf.fs.jsonio import Format
from pytest_distperf.figures.quantities import node_step_medians, rank_probe_metrics, run_figures, step_time_of

if TYPE_CHECKING:
    from pytest_distperf.rank.results import RunResult

REPORT = Format("JSON report")


def run_to_dict(run: "RunResult") -> dict[str, Any]:
    """One run with its figures and per-rank measurements, JSON-ready."""
    ranks = [{
        "rank": k.rank, "host": k.host, "node_rank": k.node_rank,
        "step_times": list(k.step_times), "step_median": step_time_of(k.step_times),
        "losses": list(k.losses), "cuda_peak_allocated": k.cuda_peak_allocated,
        "cuda_peak_reserved": k.cuda_peak_reserved, "host_peak_rss": k.host_peak_rss,
        "host_training_bytes": k.host_training_bytes, "optimizer_state_bytes": k.optimizer_state_bytes,
        "build_seconds": k.build_seconds, "warmup_seconds": k.warmup_seconds, "after_seconds": k.after_seconds,
        "step_breakdown": dict(k.step_breakdown),  # forward/backward/optimizer/other, also when nothing failed
        "extra": json.loads(json.dumps(k.extra, default=repr)),
        "probes": rank_probe_metrics(k),
        "gpu_window": k.gpu_window.to_json() if getattr(k, "gpu_window", None) is not None else None,  # clocks
        # per profiled step; a rank's table as compact as a run's (the run's own, below, is what explains)
        "work": ({**asdict(k.work), "explain": trimmed(k.work.explain) if k.work.explain else k.work.explain}
                 if getattr(k, "work", None) is not None else None),
    } for k in run.ranks]
    figures = run_figures(run)
    load = run.host_other_load
    return {"id": run.id, "figures": figures.to_json(),
            "wall_seconds": run.wall_seconds, "step_times": run.step_times, "peak_memory": run.peak_memory,
            "work": figures.work,
            "explain": run_table([k.work.explain if getattr(k, "work", None) is not None else None
                                  for k in run.ranks]),
            "tokens_per_step": run.tokens_per_step, "num_params": run.ranks[0].num_params, "ranks": ranks,
            "node_step_medians": node_step_medians(run),
            "host_other_load_cores": round(load[0], 2) if load else None}

