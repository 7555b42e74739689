"""Simulated operating characteristic of the decision core (pytest_distperf.decide.decision): the shipped design
(planned looks, Pocock-type spending, Bonferroni over the looks) beside the previous one (a look after every
pair, Kim-DeMets power-3 spending through the recursive integration, 0.7 of the error spent, Student's t at the
nominal levels).

Each simulated sequence is one comparison as the harness runs it: the first look's pairs (3), then pairs while
INCONCLUSIVE, up to the budget (12): the new design steps to its planned looks (3 -> 6 -> 12), the old one added
one pair at a time and looked after each. The intervals are the core's own: its nominal levels (sequential.look_levels;
for the old design sequential_methods.critical_values with power-3 spending) and sequential.t_upper_inv, applied to many
sequences at once with numpy (the per-sequence decision, stopping.until_decided, is the same rule; tests/
test_decision.py runs it on sequences).

Effects are in SDs of the quantity the interval is made of -- a pair's log ratio (paired), or a candidate run's log
value minus a stored run's (unpaired) -- beyond the limit (+: a FAIL is right) or inside it (-: a PASS is right);
0 puts the limit at the true ratio, where a FAIL is a false FAIL and a PASS a false PASS. A run's log value has one
of three noise shapes, standardised to sd 1: gaussian (log-normal run times), skewed (gamma run times of shape 4,
CV 50 %: the log is skewed, -0.53), t3 (Student's t with 3 df: heavy tails). A pair's log ratio is the difference of
two such runs (a drift common to the pair cancels). Unpaired: m stored runs drawn once per sequence, spread
0.25-2x the candidate's. A stress case beyond the contract, stragglers: a log value that is itself strongly skewed
(a centred gamma of shape 2, skewness 1.4), for A alone in a pair and for both sides unpaired; both error directions
are reported, so the mirrored skew is covered.

    python benchmarks/decision_power.py                        # writes benchmarks/results/decision-power.md
    python benchmarks/decision_power.py --sequences 5000 --out -   # quicker, to stdout
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

try:
    import numpy as np
except ImportError:  # pragma: no cover - a benchmark, not the plugin
    sys.exit("benchmarks/decision_power.py needs numpy (pip install numpy)")

from benchmarks import sequential_methods  # noqa: E402
from pytest_distperf.decide import decision, sequential  # noqa: E402

N, FIRST = decision.DEFAULT_MAX_PAIRS, sequential.FIRST_LOOK
ALPHA = (1.0 - decision.DEFAULT_CONFIDENCE) / 2.0  # one side's error over all looks
EFFECTS = (0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 12.0)
SHAPES = ("gaussian", "skewed", "t3")
STRESS = "stragglers"
STORED = (2, 3, 5, 12, 40)
SPREADS = (0.25, 1.0, 2.0)  # stored runs' spread relative to the candidate's


# -- the two designs: looks and one side's nominal level at each --------------------------------------------------
def new_design(method: str, m: int = 0) -> list[tuple[int, float]]:
    """The shipped design: its planned looks and levels (decision.Design.level)."""
    design = decision.Design(max_pairs=N, first_look=FIRST)
    return [(n, design.level(method, n, m)) for n in design.looks]


def old_design(method: str, m: int = 0) -> list[tuple[int, float]]:
    """The previous design: a look after every pair from 2 to N on the known-variance power-3 boundary, 0.7 of
    the error spent (its T_APPROXIMATION_SHARE), the harness starting at 3 pairs."""
    if method == "paired":
        times = tuple(n / N for n in range(2, N + 1))
    else:
        full = 1.0 / (1.0 / m + 1.0 / N)
        times = tuple(min(1.0, (1.0 / (1.0 / m + 1.0 / n)) / full) for n in range(2, N + 1))
    crit = sequential_methods.critical_values(times, ALPHA * 0.7, "power3")
    return [(n, sequential.normal_upper(crit[n - 2])) for n in range(FIRST, N + 1)]


DESIGNS: dict[str, Callable[..., list[tuple[int, float]]]] = {"old": old_design, "new": new_design}


def t_crit(level: float, df: float) -> float:
    return math.inf if level <= 0 else sequential.t_upper_inv(level, df)


# -- noise ---------------------------------------------------------------------------------------------------------
_LOG_GAMMA4 = (1.2561176684318, math.sqrt(0.2838229557371))  # mean, sd of log Gamma(4): digamma(4), trigamma(4)


def noise(rng: np.random.Generator, shape: str, size: tuple[int, ...]) -> np.ndarray:
    """A run's log value, standardised to sd 1."""
    if shape == "gaussian":
        return rng.standard_normal(size)
    if shape == "skewed":
        return (np.log(rng.gamma(4.0, 1.0, size)) - _LOG_GAMMA4[0]) / _LOG_GAMMA4[1]
    if shape == "t3":
        return rng.standard_t(3, size) / math.sqrt(3.0)
    if shape == STRESS:
        return (rng.gamma(2.0, 1.0, size) - 2.0) / math.sqrt(2.0)
    raise ValueError(shape)


def pair_noise(rng: np.random.Generator, shape: str, size: tuple[int, ...]) -> np.ndarray:
    """A pair's log ratio, sd 1: the difference of A's and B's run (stragglers: A's alone)."""
    if shape == STRESS:
        return noise(rng, shape, size)
    return (noise(rng, shape, size) - noise(rng, shape, size)) / math.sqrt(2.0)


# -- one row: many sequences at once ------------------------------------------------------------------------------
def run(design: list[tuple[int, float]], y: np.ndarray, x: np.ndarray | None = None) -> dict[str, float]:
    """y: S x N log values with the limit at 0 (paired: pair log ratios; unpaired: candidate log runs, x: S x m
    stored log runs). Returns the FAIL / PASS / inconclusive rates, the first look's decision rate and the mean
    pairs (runs) used, an inconclusive sequence counted at the budget."""
    s = y.shape[0]
    outcome = np.zeros(s, dtype=np.int8)  # 0 undecided, 1 FAIL, -1 PASS
    used = np.full(s, float(N))
    first = None
    if x is not None:
        m = x.shape[1]
        mx, vx = x.mean(1), x.var(1, ddof=1)
    for n, level in design:
        yy = y[:, :n]
        mean = yy.mean(1)
        if x is None:
            se, df = np.sqrt(yy.var(1, ddof=1) / n), n - 1
        else:
            mean = mean - mx
            se, df = np.sqrt(yy.var(1, ddof=1) / n + vx / m), min(n, m) - 1
        c = t_crit(level, df)
        open_ = outcome == 0
        fail = open_ & (mean - c * se > 0)
        pas = open_ & (mean + c * se <= 0)
        outcome[fail], outcome[pas] = 1, -1
        used[fail | pas] = n
        if first is None:
            first = float((fail | pas).mean())
    return {"fail": float((outcome == 1).mean()), "pass": float((outcome == -1).mean()),
            "inconclusive": float((outcome == 0).mean()), "first": first or 0.0, "pairs": float(used.mean())}


def paired_row(rng, design, shape, effect, s):
    return run(design, effect + pair_noise(rng, shape, (s, N)))


def unpaired_row(rng, design, shape, effect, s, m, spread):
    scale = math.sqrt(1.0 + spread * spread)  # the sd of a candidate run minus a stored run
    y = (effect * scale + noise(rng, shape, (s, N)))
    x = spread * noise(rng, shape, (s, m))
    return run(design, y, x)


# -- the report ----------------------------------------------------------------------------------------------------
def pct(x: float) -> str:
    return f"{100 * x:.1f}%" if x >= 0.001 or x == 0 else f"{100 * x:.2f}%"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sequences", type=int, default=20000, help="simulated comparisons per power row")
    ap.add_argument("--null-sequences", type=int, default=100000, help="per error-rate row (limit at the truth)")
    ap.add_argument("--seed", type=int, default=20261202)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "decision-power.md"),
                    help="Markdown file to write ('-': stdout)")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    started = time.monotonic()
    out: list[str] = []
    say = out.append

    say("# Decision core: operating characteristic, previous design beside the shipped one\n")
    say(f"`python benchmarks/decision_power.py` (seed {args.seed}; {args.sequences} sequences a power row, "
        f"{args.null_sequences} an error-rate row). Budget {N} pairs (runs), first look at {FIRST}; "
        f"{decision.DEFAULT_CONFIDENCE:.0%} repeated intervals: at most {ALPHA:.0%} false FAILs and {ALPHA:.0%} "
        f"false PASSes over all looks. Effects in SDs of a pair's log ratio (unpaired: of a candidate run's log "
        f"value minus a stored run's) beyond (+) or inside (-) the limit.\n")
    say("## Critical values (paired, Student's t at each look's nominal level)\n")
    say("| pairs | old design | new design | fixed-size t test, same level |")
    say("|---|---|---|---|")
    old, new = dict(old_design("paired")), dict(new_design("paired"))
    for n in range(FIRST, N + 1):
        say(f"| {n} | {t_crit(old[n], n - 1):.2f} | {f'{t_crit(new[n], n - 1):.2f}' if n in new else '(no look)'} | "
            f"{t_crit(ALPHA, n - 1):.2f} |")
    say("")

    say("## Errors with the limit at the true ratio (over all looks)\n")
    say("| mode | stored runs | spread stored/candidate | noise | old false FAIL | old false PASS | "
        "new false FAIL | new false PASS |")
    say("|---|---|---|---|---|---|---|---|")
    worst: dict[tuple[str, str], float] = {}
    cases = [("paired", 0, 0.0)] + [("unpaired", m, r) for m in STORED for r in SPREADS]
    for mode, m, spread in cases:
        for shape in (*SHAPES, STRESS):
            cells = []
            for name, make in DESIGNS.items():
                if mode == "paired":
                    r = paired_row(rng, make("paired"), shape, 0.0, args.null_sequences)
                else:
                    r = unpaired_row(rng, make("unpaired", m), shape, 0.0, args.null_sequences, m, spread)
                cells += [pct(r["fail"]), pct(r["pass"])]
                for kind in ("fail", "pass"):
                    key = (name, f"{mode} {shape}")
                    worst[key] = max(worst.get(key, 0.0), r[kind])
            where = f"| {mode} | {m or '-'} | {spread if mode == 'unpaired' else '-'} | {shape} | "
            say(where + " | ".join(cells) + " |")
    say("")
    say("Worst false FAIL or false PASS:\n")
    for (name, case), v in sorted(worst.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        say(f"- {case}, {name} design: {pct(v)}")
    say("")

    def oc(mode: str, m: int = 0, spread: float = 1.0) -> None:
        say("| noise | effect (SDs) | design | FAIL | PASS | inconclusive | decided at the first look | mean pairs |")
        say("|---|---|---|---|---|---|---|---|")
        for shape in SHAPES:
            for effect in (*EFFECTS, *(-e for e in EFFECTS)):
                for name, make in DESIGNS.items():
                    if mode == "paired":
                        r = paired_row(rng, make("paired"), shape, effect, args.sequences)
                    else:
                        r = unpaired_row(rng, make("unpaired", m), shape, effect, args.sequences, m, spread)
                    say(f"| {shape} | {effect:+g} | {name} | {pct(r['fail'])} | {pct(r['pass'])} | "
                        f"{pct(r['inconclusive'])} | {pct(r['first'])} | {r['pairs']:.1f} |")
        say("")

    say("## Operating characteristic, paired (interleaved pairs)\n")
    oc("paired")
    say("## Operating characteristic, unpaired: candidate runs against 12 stored runs as spread\n")
    oc("unpaired", 12, 1.0)
    say("## Operating characteristic, unpaired: against 3 stored runs as spread\n")
    oc("unpaired", 3, 1.0)
    say(f"wall time {time.monotonic() - started:.0f} s")
    text = "\n".join(out) + "\n"
    if args.out == "-":
        sys.stdout.write(text)
    else:
        Path(args.out).write_text(text)
        print(text)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
