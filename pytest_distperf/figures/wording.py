"""How an interval, a check's pair-to-pair variation and a test's name read in every report."""

from __future__ import annotations


def short_test(nodeid: str) -> str:
    """A test as the tables name it: its node id without the file ('TestX::test_y[p]', 'test_y')."""
    return nodeid.split("::", 1)[-1]


WIDE = 10.0  # an interval end beyond 10x (or below 1/10 of) its estimate bounds nothing a reader can use


def _end(x: float | None, digits: int) -> str:
    return "inf" if x is None else (f"{x:.{digits}f}" if x < 1000 else f"{x:.2g}")


def bound_text(ratio: float, low: float | None, high: float | None, n: int, unit: str = "pairs",
               spread: float | None = None, spread_name: str = "pair-to-pair", next_look: int | None = None,
               delta: bool = False, digits: int = 3, decided: bool = False) -> str:
    """'[0.970, 1.160]' (ratio) or '[+7.9%, +11.7%]' (delta), or, where an end is unbounded (None) or beyond WIDE
    of the estimate, words: '3 pairs at 31.0% pair-to-pair: too few to bound; next look at 6' (next_look 0: the
    last look; None: not said). A decided verdict's wide interval keeps its numbers (the end that decided it is the
    one that matters), marked wide."""
    wide = (low is None or high is None or not ratio > 0 or low <= 0
            or high > WIDE * ratio or low < ratio / WIDE)
    if delta:
        numbers = f"[{'-100%' if low is None else f'{low - 1:+.1%}'}, {'+inf' if high is None else f'{high - 1:+.1%}'}]"
    else:
        numbers = f"[{'0' if low is None else _end(low, digits)}, {_end(high, digits)}]"
    if not wide:
        return numbers
    what = f"{n} {unit if n != 1 else unit.rstrip('s')}"
    if spread is not None and n >= 2:
        what += f" at {spread:.1%} {spread_name}"
    if decided:
        return f"{numbers} (wide: {what})"
    if next_look == 0:
        return f"{what}: too noisy to bound at the last look"
    return f"{what}: too few to bound" + (f"; next look at {next_look}" if next_look else "")


def is_words(text: str) -> bool:
    """Whether an interval text is words (bound_text could not bound it), not numbers."""
    return not text.startswith("[")


def pair_to_pair(method: str | None, pair_cv: float | None) -> str:
    """A check's pair-to-pair variation as a percent; '-' when it was not paired or had too few pairs."""
    return "-" if method != "paired" or pair_cv is None else f"{pair_cv:.1%}"
