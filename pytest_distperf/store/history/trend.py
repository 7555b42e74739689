"""Trends: one metric's value per session (the median of its runs) over time, with the step changes found in it,
each naming its commit range and whether the job's configuration or the recorded versions changed across it;
and their terminal text (`render_text`)."""

from __future__ import annotations

import datetime as _dt
import itertools
import statistics
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from pytest_distperf.figures.units import fmt_pct, fmt_value
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
    git_dirty: bool = False  # the session ran uncommitted changes on top of git_commit

    @property
    def commit(self) -> str:
        """'cc03c20abcde', or 'cc03c20abcde + uncommitted changes' (launch/fingerprint.commit_text)."""
        return short_commit(self.git_commit, self.git_dirty)


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
        return f"{self.before.commit}..{self.after.commit}"

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

    @property
    def sessions_needed(self) -> int:
        """The sessions a change point needs: min_size on each side of it."""
        return 2 * int(self.settings.get("min_size", changepoints.DEFAULT_MIN_SIZE))

    @property
    def searched(self) -> bool:
        """Whether the series is long enough to look for a change point at all (else "none" would read as looked
        for and not found)."""
        return len(self.points) >= self.sessions_needed

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
        doc["searched"], doc["sessions_needed"] = self.searched, self.sessions_needed
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
    """The trends whose key contains each given filter (substring match) and is among `keys` when given."""
    wanted = {"test": test, "job": job, "metric": metric, "machine_class": machine_class}
    keys = [k for k in store.series_keys()
            if all(v is None or v in getattr(k, name) for name, v in wanted.items()) and (keys is None or k in keys)]
    settings = {"alpha": alpha, "min_size": min_size, "min_change": min_change}
    return [trend_of(key, store.series_rows(key), settings) for key in keys]


def trend_of(key: SeriesKey, rows: list[SeriesRow], settings: dict[str, Any]) -> Trend:
    points: list[TrendPoint] = []
    for session_id, group in itertools.groupby(rows, key=lambda r: r.session_id):
        session = list(group)
        first, runs = session[0], tuple(r.value for r in session)
        points.append(TrendPoint(session_id=session_id, created_at=first.created_at, git_commit=first.git_commit,
                                 host=first.host, torch=first.torch, deepspeed=first.deepspeed,
                                 config_hash=first.config_hash, value=statistics.median(runs), runs=runs,
                                 host_load=max((r.host_load for r in session if r.host_load is not None),
                                               default=None), git_dirty=first.git_dirty))
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


def short_commit(commit: str | None, dirty: bool = False) -> str:
    """The commit's first 12 characters ('?' unknown), '+ uncommitted changes' after it when `dirty`."""
    from pytest_distperf.launch.fingerprint import describe_commit

    return describe_commit(commit, dirty)


# -- as terminal text -----------------------------------------------------------------------------------------
BARS = "▁▂▃▄▅▆▇█"
MARK = {"regression": "✗", "improvement": "✓", "change": "~"}


def render_text(trends: list[Trend], points: bool = False) -> str:
    """Per metric a header, a sparkline of the sessions' values, the change points with their commit ranges,
    and (with `points`) every session's value."""
    if not trends:
        return "no series match (see --test/--job/--metric/--machine-class)\n"
    blocks = [_block(t, points) for t in trends]
    found = sum(len(t.change_points) for t in trends)
    settings = trends[0].settings
    short = sum(not t.searched for t in trends)
    unsearched = f"; {short} series too short to look for one" if short else ""
    blocks.append(f"{len(trends)} series, {found} change point(s){unsearched} (E-divisive split + Welch t-test, "
                  f"p <= {settings['alpha']:g}, >= {settings['min_size']} sessions a side{_min_change(settings, ',')})")
    return "\n\n".join(blocks) + "\n"


def _block(t: Trend, points: bool) -> str:
    k, pts = t.key, t.points
    better = {"lower": "lower is better", "higher": "higher is better"}.get(t.direction, "")
    values = [p.value for p in pts]
    lines = [f"{k.test}  {k.job}  {k.metric}  [{k.machine_class}]",
             f"  {len(pts)} session(s), {pts[0].created_at:%Y-%m-%d %H:%M} .. {pts[-1].created_at:%Y-%m-%d %H:%M} "
             f"UTC, commits {pts[0].commit} .. {pts[-1].commit}; "
             f"value = median of the session's runs ({t.unit}, {better})",
             f"  trend  {sparkline(values, {c.index for c in t.change_points})}  first {fmt_value(values[0], t.unit)}"
             f"  min {fmt_value(min(values), t.unit)}  max {fmt_value(max(values), t.unit)}"
             f"  last {fmt_value(values[-1], t.unit)}"]
    if not t.searched:
        lines.append(f"  change points: not looked for: too few sessions ({len(pts)}; a change point needs "
                     f"{t.settings.get('min_size', changepoints.DEFAULT_MIN_SIZE)} on each side, "
                     f"{t.sessions_needed} in all)")
    elif t.change_points:
        lines.append("  change points:")
        lines += ["    " + describe(c, t.unit) for c in t.change_points]
    elif t.strongest is not None and t.strongest.change:
        s = t.strongest
        lines.append(f"  change points: none (the strongest split, sessions {s.index - 1}|{s.index} between "
                     f"{s.before.commit} and {s.after.commit}: "
                     f"{fmt_pct(s.change)}, p = {s.pvalue:.2g}; a change point needs p <= {t.settings['alpha']:g}"
                     f"{_min_change(t.settings, ' and')})")
    else:
        lines.append("  change points: none")
    if points:
        lines.append("  sessions:")
        starts = {c.index for c in t.change_points}
        for i, p in enumerate(pts):
            runs = ", ".join(fmt_value(v, t.unit) for v in p.runs)
            load = f"  other load {p.host_load:.1f} cores" if p.host_load is not None else ""
            lines.append(f"    {'|' if i in starts else ' '} {i:>4}  {p.created_at:%Y-%m-%d %H:%M:%S}  "
                         f"{p.commit:<12}  {fmt_value(p.value, t.unit):>11}  runs {runs}{load}")
    return "\n".join(lines)


def _min_change(settings: dict[str, Any], joint: str) -> str:
    return f"{joint} |change| >= {settings['min_change']:.1%}" if settings.get("min_change") else ""


def describe(c: ChangePoint, unit: str) -> str:
    """One line: mark, size, commit range, levels, p-value and what else changed there."""
    notes = []
    if c.config_changed:
        notes.append("job configuration changed")
    notes += list(c.environment_changes)
    return (f"{MARK[c.verdict]} {fmt_pct(c.change)} {c.verdict} between commit {c.before.commit} "
            f"({c.before.created_at:%Y-%m-%d %H:%M}) and {c.after.commit} "
            f"({c.after.created_at:%Y-%m-%d %H:%M}), sessions {c.index - 1}|{c.index}: "
            f"{fmt_value(c.before_mean, unit)} -> {fmt_value(c.after_mean, unit)}, p = {c.pvalue:.2g}, "
            f"t = {c.tstat:.2f}" + (f"; {'; '.join(notes)}" if notes else ""))


def sparkline(values: list[float], breaks: set[int] | None = None) -> str:
    """One bar per value scaled between min and max; '|' before each point that starts a new segment."""
    lo, hi = min(values), max(values)
    span = hi - lo
    out = []
    for i, v in enumerate(values):
        if breaks and i in breaks:
            out.append("|")
        out.append(BARS[int((v - lo) / span * (len(BARS) - 1) + 0.5)] if span else BARS[0])
    return "".join(out)
