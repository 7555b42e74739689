"""The terminal table of distperf runs and checks. Reads records; computes nothing new."""

from __future__ import annotations

from typing import Any, Iterable

from pytest_distperf.units import fmt_bytes, fmt_rate, fmt_seconds

VERDICT = {True: "✓ pass", False: "✗ FAIL"}


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    line = lambda r: "  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip()  # noqa: E731
    return [line(header), line(["-" * w for w in widths]), *map(line, rows)]


def _fmt_value(value: float, unit: str) -> str:
    if unit == "s":
        return fmt_seconds(value)
    if unit == "bytes":
        return fmt_bytes(value)
    return f"{value:.4g}"


def render(records_by_test: Iterable[tuple[str, list[dict[str, Any]]]]) -> list[str]:
    runs, checks = [], []
    for nodeid, records in records_by_test:
        for r in records:
            if r["kind"] == "run":
                runs.append([
                    r["label"], f"{r['runs']}x{r['steps']}", fmt_seconds(r["step_median"]),
                    f"{fmt_seconds(r['step_p10'])} - {fmt_seconds(r['step_p90'])}", fmt_rate(r["tokens_per_s"]),
                    fmt_bytes(r["peak_memory"]), f"{r['optimizer_bytes_per_param']:.1f}",
                ])
            elif r["kind"] == "check":
                ci = f" [{r['low']:.3f}, {r['high']:.3f}]" if r.get("low") is not None else ""
                ratio = f"{r['ratio']:.3f}{ci}" if r["unit"] != "rel" else f"{r['ratio']:.1e}"
                limit = f"{r['threshold']:.2f}" if r["unit"] != "rel" else f"{r['threshold']:.0e}"
                checks.append([
                    nodeid.split("::")[-1], r["name"], f"{r['a']} = {_fmt_value(r['a_value'], r['unit'])}",
                    f"{r['b']} = {_fmt_value(r['b_value'], r['unit'])}", ratio, limit, VERDICT[r["passed"]],
                ])
    lines: list[str] = []
    if runs:
        lines += _table(["job", "runs x steps", "step median", "p10 - p90", "tok/s", "peak mem", "opt B/param"], runs)
    if checks:
        lines += [""] + _table(["test", "check", "A", "B", "A/B [95% CI]", "limit", "verdict"], checks)
    return lines
