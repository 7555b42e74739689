"""Trends as terminal text: per metric a header, a sparkline of the sessions' values, the change points with
their commit ranges, and (asked for) every session's value."""

from __future__ import annotations

from pytest_distperf.figures.units import fmt_pct, fmt_value
from pytest_distperf.store.history.trend import ChangePoint, Trend, short_commit

BARS = "▁▂▃▄▅▆▇█"
MARK = {"regression": "✗", "improvement": "✓", "change": "~"}


def render(trends: list[Trend], points: bool = False) -> str:
    if not trends:
        return "no series match (see --test/--job/--metric/--machine-class)\n"
    blocks = [_block(t, points) for t in trends]
    found = sum(len(t.change_points) for t in trends)
    settings = trends[0].settings
    blocks.append(f"{len(trends)} series, {found} change point(s) (E-divisive split + Welch t-test, "
                  f"p <= {settings['alpha']:g}, >= {settings['min_size']} sessions a side"
                  + (f", |change| >= {settings['min_change']:.1%}" if settings.get("min_change") else "") + ")")
    return "\n\n".join(blocks) + "\n"


def _block(t: Trend, points: bool) -> str:
    k, pts = t.key, t.points
    better = {"lower": "lower is better", "higher": "higher is better"}.get(t.direction, "")
    values = [p.value for p in pts]
    lines = [f"{k.test}  {k.job}  {k.metric}  [{k.machine_class}]",
             f"  {len(pts)} session(s), {pts[0].created_at:%Y-%m-%d %H:%M} .. {pts[-1].created_at:%Y-%m-%d %H:%M} "
             f"UTC, commits {short_commit(pts[0].git_commit)} .. {short_commit(pts[-1].git_commit)}; "
             f"value = median of the session's runs ({t.unit}, {better})",
             f"  trend  {sparkline(values, {c.index for c in t.change_points})}  first {fmt_value(values[0], t.unit)}"
             f"  min {fmt_value(min(values), t.unit)}  max {fmt_value(max(values), t.unit)}"
             f"  last {fmt_value(values[-1], t.unit)}"]
    if t.change_points:
        lines.append("  change points:")
        lines += ["    " + describe(c, t.unit) for c in t.change_points]
    elif t.strongest is not None and t.strongest.change:
        s = t.strongest
        lines.append(f"  change points: none (the strongest split, sessions {s.index - 1}|{s.index} between "
                     f"{short_commit(s.before.git_commit)} and {short_commit(s.after.git_commit)}: "
                     f"{fmt_pct(s.change)}, p = {s.pvalue:.2g}; a change point needs p <= {t.settings['alpha']:g}"
                     + (f" and |change| >= {t.settings['min_change']:.1%}" if t.settings.get("min_change") else "")
                     + ")")
    else:
        lines.append("  change points: none")
    if points:
        lines.append("  sessions:")
        starts = {c.index for c in t.change_points}
        for i, p in enumerate(pts):
            runs = ", ".join(fmt_value(v, t.unit) for v in p.runs)
            load = f"  other load {p.host_load:.1f} cores" if p.host_load is not None else ""
            lines.append(f"    {'|' if i in starts else ' '} {i:>4}  {p.created_at:%Y-%m-%d %H:%M:%S}  "
                         f"{short_commit(p.git_commit):<12}  {fmt_value(p.value, t.unit):>11}  runs {runs}{load}")
    return "\n".join(lines)


def describe(c: ChangePoint, unit: str) -> str:
    """One line: mark, size, commit range, levels, p-value and what else changed there."""
    notes = []
    if c.config_changed:
        notes.append("job configuration changed")
    notes += list(c.environment_changes)
    return (f"{MARK[c.verdict]} {fmt_pct(c.change)} {c.verdict} between commit {short_commit(c.before.git_commit)} "
            f"({c.before.created_at:%Y-%m-%d %H:%M}) and {short_commit(c.after.git_commit)} "
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
