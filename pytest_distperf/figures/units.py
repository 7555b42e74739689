"""Formatting of times and sizes for messages and tables."""

from __future__ import annotations


def fmt_seconds(s: float) -> str:
    if s >= 1:
        return f"{s:.3f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.1f} ms"
    return f"{s * 1e6:.0f} us"


def fmt_bytes(n: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def fmt_rate(tokens_per_s: float) -> str:
    if tokens_per_s >= 1e6:
        return f"{tokens_per_s / 1e6:.2f}M"
    if tokens_per_s >= 1e3:
        return f"{tokens_per_s / 1e3:.1f}k"
    return f"{tokens_per_s:.0f}"


def fmt_value(value: float | None, unit: str, digits: int = 6) -> str:
    """A value in its unit: seconds and bytes scaled, anything else to `digits` significant digits."""
    if value is None:
        return "-"
    if unit == "s":
        return fmt_seconds(value)
    if unit == "bytes":
        return fmt_bytes(value)
    return f"{value:.{digits}g}"


def fmt_pct(x: float | None) -> str:
    return "-" if x is None else f"{x:+.1%}"
