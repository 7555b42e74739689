"""Trends: one metric's value per session over time, with the step changes found in it (plain data).

A point is a session (the median of its run-level values), in the order the sessions ended. Each change point
(changepoints.find_splits) names its commit range, the step's size, the t-test's p-value and whether the job's
configuration or the recorded versions changed across it.
"""

from __future__ import annotations

import datetime as _dt
import statistics
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from pytest_distperf.store.history import changepoints

if TYPE_CHECKING:  # the store needs the history extra (SQLAlchemy); a report's trend chart must not
    from pytest_distperf.store.history.store import HistoryStore, SeriesKey, SeriesRow

ENVIRONMENT_FIELDS = ("torch", "deepspeed", "host")


@dataclass(frozen=True)
class TrendPoint:
    session_id: str
    created_at: _dt.datetime
    git_commit: str | None
    host: str | None
    torch: str | None
    deepspeed: str | None
    config_hash: str | None
    value: float  # median of the session's runs
    runs: tuple[float, ...]
    host_load: float | None = None  # the most other load on the host's cores during any of its runs


@dataclass(frozen=True)
class ChangePoint:
    index: int  # the first point after the change
    before: TrendPoint  # the last session before it
    after: TrendPoint  # the first session after it
    before_mean: float  # mean of the segment before (back to the previous change point)
    after_mean: float  # mean of the segment after (up to the next change point)
    change: float | None  # after_mean / before_mean - 1
    pvalue: float  # Welch t-test, two-sided, at this split
    tstat: float
    direction: str  # the metric's: "lower" or "higher" is better
    config_changed: bool  # the job's configuration hash differs between the two sessions
    environment_changes: tuple[str, ...]  # e.g. "torch 2.12.0 -> 2.13.0"

    @property
    def verdict(self) -> str:
        """'regression', 'improvement' or 'change' (no direction to judge by)."""
        if self.after_mean == self.before_mean or self.direction not in ("lower", "higher"):
            return "change"
        worse = self.after_mean > self.before_mean if self.direction == "lower" else self.after_mean < self.before_mean
        return "regression" if worse else "improvement"

    @property
    def commit_range(self) -> str:
        return f"{short_commit(self.before.git_commit)}..{short_commit(self.after.git_commit)}"

    def text(self) -> str:
        """'<commit>..<commit> (+20.0%) regression, p = 0.001, ...': one line (the HTML trend page's)."""
        change = "" if self.change is None else f" ({self.change:+.1%})"
        notes = [self.verdict, f"p = {self.pvalue:.2g}"] + ["job configuration changed"] * self.config_changed
        return f"{self.commit_range}{change} " + ", ".join(notes + list(self.environment_changes))


@dataclass(frozen=True)
class Trend:
    key: SeriesKey
    unit: str
    direction: str
    kind: str | None
    points: tuple[TrendPoint, ...]
    change_points: tuple[ChangePoint, ...]
    settings: dict[str, Any] = field(default_factory=dict)  # alpha, min_size, min_change used
    # With no change point: the strongest split over the whole series, which did not hold (None when too short).
    strongest: ChangePoint | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (times as ISO 8601 strings)."""
        def plain(x: Any) -> Any:
            if isinstance(x, _dt.datetime):
                return x.isoformat()
            if isinstance(x, dict):
                return {k: plain(v) for k, v in x.items()}
            if isinstance(x, (list, tuple)):
                return [plain(v) for v in x]
            return x

        doc = plain(asdict(self))
        for cp, d in zip(self.change_points, doc["change_points"]):
            d["verdict"], d["commit_range"] = cp.verdict, cp.commit_range
        if self.strongest is not None:
            doc["strongest"]["verdict"] = self.strongest.verdict
            doc["strongest"]["commit_range"] = self.strongest.commit_range
        return doc


def build_trends(store: HistoryStore, test: str | None = None, job: str | None = None, metric: str | None = None,
                 machine_class: str | None = None, alpha: float = changepoints.DEFAULT_ALPHA,
                 min_size: int = changepoints.DEFAULT_MIN_SIZE, min_change: float = 0.0,
                 keys: set[SeriesKey] | None = None) -> list[Trend]:
    """The trends whose key contains each given filter (substring match), and is among `keys` when given;
    sorted by key."""
    wanted = {"test": test, "job": job, "metric": metric, "machine_class": machine_class}
    keys = [k for k in store.series_keys()
            if all(v is None or v in getattr(k, name) for name, v in wanted.items()) and (keys is None or k in keys)]
    settings = {"alpha": alpha, "min_size": min_size, "min_change": min_change}
    return [trend_of(key, store.series_rows(key), settings) for key in keys]


def trend_of(key: SeriesKey, rows: list[SeriesRow], settings: dict[str, Any]) -> Trend:
    points: list[TrendPoint] = []
    for row in rows:
        if points and points[-1].session_id == row.session_id:
            last = points[-1]
            points[-1] = TrendPoint(**{**asdict(last), "runs": (*last.runs, row.value),
                                       "host_load": _max(last.host_load, row.host_load)})
        else:
            points.append(TrendPoint(session_id=row.session_id, created_at=row.created_at, git_commit=row.git_commit,
                                     host=row.host, torch=row.torch, deepspeed=row.deepspeed,
                                     config_hash=row.config_hash, value=row.value, runs=(row.value,),
                                     host_load=row.host_load))
    points = [TrendPoint(**{**asdict(p), "value": statistics.median(p.runs)}) for p in points]
    last = rows[-1] if rows else None
    direction = last.direction if last else "lower"
    splits = changepoints.find_splits([p.value for p in points], **settings)
    change_points = tuple(_change_point(points, s, direction) for s in splits)
    strongest = None
    if not change_points:
        split = changepoints.strongest_split([p.value for p in points], settings["min_size"])
        strongest = _change_point(points, split, direction) if split is not None else None
    return Trend(key=key, unit=last.unit if last else "", direction=direction, kind=last.kind if last else None,
                 points=tuple(points), change_points=change_points, settings=dict(settings), strongest=strongest)


def _change_point(points: list[TrendPoint], split: changepoints.Split, direction: str) -> ChangePoint:
    before, after = points[split.index - 1], points[split.index]
    env = tuple(f"{name} {getattr(before, name) or '?'} -> {getattr(after, name) or '?'}"
                for name in ENVIRONMENT_FIELDS if getattr(before, name) != getattr(after, name))
    return ChangePoint(index=split.index, before=before, after=after, before_mean=split.before_mean,
                       after_mean=split.after_mean, change=split.change, pvalue=split.pvalue, tstat=split.tstat,
                       direction=direction, config_changed=before.config_hash != after.config_hash,
                       environment_changes=env)


def _max(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else max(a, b)


def short_commit(commit: str | None) -> str:
    return commit[:12] if commit else "?"
