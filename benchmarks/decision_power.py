"""Simulated power of the decision core (pytest_distperf.measure.decision), as shipped.

Each simulated sequence is one comparison run the way the harness runs it: `--start` pairs (the test's
repeats), then `decision.until_decided` adds one pair at a time while the verdict is INCONCLUSIVE, up
to `--max-pairs`. Run times are log-normal: a run's log time has sd CV; the two runs of an interleaved
pair share a drift term, so their correlation is rho and a pair's log ratio has sd CV sqrt(2 (1 - rho)).
The unpaired mode draws `--stored` baseline runs once per sequence and grows only the candidate.

It prints, per noise level, slowdown and limit: FAIL / PASS / INCONCLUSIVE rates (95 % Wilson interval
of the FAIL rate) and the pairs used (median, 90th percentile, max). A/A rows (slowdown 0) give the
false-alarm rate; the others the catch rate. Real run times are in detection_power.py.

    python benchmarks/decision_power.py                              # the closing note's table
    python benchmarks/decision_power.py --cv 0.016 --rho 0.5 --effects 0,0.03,0.05 --floors 0
    python benchmarks/decision_power.py --mode unpaired --stored 12 --cv 0.016 --floors 0,0.05
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pytest_distperf.measure import decision  # noqa: E402
from pytest_distperf.measure.decision import FAIL, INCONCLUSIVE, PASS, Budget, Design  # noqa: E402
from pytest_distperf.measure.stats import wilson  # noqa: E402


def sequence(rng: random.Random, args: argparse.Namespace, cv: float, effect: float, limit: float
             ) -> decision.Verdict:
    design = Design(max_pairs=args.max_pairs)
    own = cv * math.sqrt(1.0 - args.rho)
    shared = cv * math.sqrt(args.rho)
    slow = math.log1p(effect)
    a: list[float] = []
    b: list[float] = []
    if args.mode == "paired":
        def add() -> None:
            drift = rng.gauss(0.0, shared)
            a.append(math.exp(slow + drift + rng.gauss(0.0, own)))
            b.append(math.exp(drift + rng.gauss(0.0, own)))

        def look() -> decision.Verdict:
            return decision.decide(decision.paired(a, b, design), limit)
    else:
        b.extend(math.exp(rng.gauss(0.0, cv)) for _ in range(args.stored))

        def add() -> None:
            a.append(math.exp(slow + rng.gauss(0.0, cv)))

        def look() -> decision.Verdict:
            return decision.decide(decision.unpaired(a, b, design), limit)
    for _ in range(args.start):
        add()
    return decision.until_decided(look, add, Budget(max_pairs=args.max_pairs))


def floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=("paired", "unpaired"), default="paired")
    ap.add_argument("--cv", default="0.016,0.03,0.10", help="run-to-run variation (sd of log run time), list")
    ap.add_argument("--rho", type=float, default=0.5, help="correlation of the two runs of a pair (paired mode)")
    ap.add_argument("--effects", default="0,0.03,0.05,0.15", help="injected slowdowns, list")
    ap.add_argument("--floors", default="0,0.05", help="limits as 1 + floor (the gate's tolerance), list")
    ap.add_argument("--start", type=int, default=3, help="pairs (or candidate runs) before the first look")
    ap.add_argument("--max-pairs", type=int, default=decision.DEFAULT_MAX_PAIRS)
    ap.add_argument("--stored", type=int, default=12, help="stored baseline runs (unpaired mode)")
    ap.add_argument("--sequences", type=int, default=2000, help="simulated comparisons per row")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.start < 1 or args.start > args.max_pairs:
        ap.error("--start must be in [1, --max-pairs]")
    rng = random.Random(args.seed)
    started = time.monotonic()
    side = (f"interleaved pairs, rho {args.rho:g}" if args.mode == "paired"
            else f"candidate runs against {args.stored} stored runs")
    print(f"decision core: {Design().confidence:.0%} repeated intervals, {decision.DESIGN_SPENDING} spending, "
          f"{side}; {args.start} before the first look, at most {args.max_pairs}; {args.sequences} sequences a row")
    print(f"{'CV':>6}{'pair sd':>9}{'slowdown':>10}{'limit':>7}{'FAIL':>8}{'95% CI':>17}{'PASS':>8}{'inconcl.':>10}"
          f"{'pairs med':>11}{'p90':>5}{'max':>5}")
    for cv in floats(args.cv):
        pair_sd = f"{cv * math.sqrt(2 * (1 - args.rho)):.1%}" if args.mode == "paired" else "-"
        for floor in floats(args.floors):
            for effect in floats(args.effects):
                verdicts = [sequence(rng, args, cv, effect, 1.0 + floor) for _ in range(args.sequences)]
                n = len(verdicts)
                counts = {o: sum(v.outcome == o for v in verdicts) for o in (PASS, FAIL, INCONCLUSIVE)}
                pairs = sorted(v.estimate.n_pairs for v in verdicts)
                lo, hi = wilson(counts[FAIL], n)
                print(f"{cv:>6.1%}{pair_sd:>9}{effect:>+10.0%}{1 + floor:>7.2f}{counts[FAIL] / n:>8.1%}"
                      f"{f'[{lo:.1%}, {hi:.1%}]':>17}{counts[PASS] / n:>8.1%}{counts[INCONCLUSIVE] / n:>10.1%}"
                      f"{pairs[n // 2]:>11}{pairs[int(0.9 * (n - 1))]:>5}{pairs[-1]:>5}", flush=True)
    print(f"slowdown 0: FAIL is the false-alarm rate; otherwise the catch rate. wall time "
          f"{time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
