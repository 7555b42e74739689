"""The decision core (measure/decision.py): its boundaries against published values, and its properties by
simulation with fixed seeds -- false alarms with a look after every pair, power, the three outcomes, budgets."""

import math
import random

import pytest

from pytest_distperf.measure import decision as d
from pytest_distperf.measure.decision import FAIL, INCONCLUSIVE, PASS, Budget, Clock, Design


def test_boundaries_match_published_obrien_fleming_type_spending():
    # Lan-DeMets O'Brien-Fleming-type spending, one side's alpha 0.025, 5 equally spaced looks (gsDesign sfLDOF,
    # ldbounds): 4.8769 3.3570 2.6803 2.2898 2.0310
    crit = d.critical_values((0.2, 0.4, 0.6, 0.8, 1.0), 0.025, "obrien-fleming")
    assert crit == pytest.approx((4.8769, 3.3570, 2.6803, 2.2898, 2.0310), abs=2e-4)


def test_student_t_quantiles():
    assert d.t_upper_inv(0.025, 5) == pytest.approx(2.5706, abs=1e-4)
    assert d.t_upper_inv(0.005, 11) == pytest.approx(3.1058, abs=1e-4)
    assert d.t_upper_inv(0.05, 1) == pytest.approx(6.3138, abs=1e-4)
    assert d.t_upper_inv(0.025, 7.5) == pytest.approx(2.3342, abs=2e-3)  # fractional df (between 7 and 8)
    assert d.t_upper_inv(0.025, 1e9) == pytest.approx(1.95996, abs=1e-4)
    assert d.t_upper(d.t_upper_inv(1e-7, 3), 3) == pytest.approx(1e-7, rel=1e-6)


def _pair(rng: random.Random, effect: float, cv: float, rho: float) -> tuple[float, float]:
    """One interleaved pair: both runs share a drift term (correlation rho), A is `effect` x slower."""
    common = rng.gauss(0.0, cv * math.sqrt(rho))
    own = cv * math.sqrt(1.0 - rho)
    return math.exp(math.log(effect) + common + rng.gauss(0.0, own)), math.exp(common + rng.gauss(0.0, own))


def _sequence(rng, effect, cv, rho, limit, start=3, max_pairs=12):
    """One comparison exactly as the harness runs it: `start` pairs, then the stopping rule."""
    design = Design(max_pairs=max_pairs)
    a, b = [], []

    def add_pair():
        x, y = _pair(rng, effect, cv, rho)
        a.append(x)
        b.append(y)

    for _ in range(start):
        add_pair()
    return d.until_decided(lambda: d.decide(d.paired(a, b, design), limit), add_pair, Budget(max_pairs=max_pairs))


def _rates(verdicts):
    n = len(verdicts)
    return {o: sum(v.outcome == o for v in verdicts) / n for o in (PASS, FAIL, INCONCLUSIVE)}


def test_false_alarms_stay_below_one_percent_with_a_look_after_every_pair():
    # Worst case: the limit sits exactly at the true ratio (A/A against 1.0), a look after every pair from 2 on.
    rng = random.Random(20261201)
    verdicts = [_sequence(rng, 1.0, 0.05, 0.0, 1.0, start=2, max_pairs=8) for _ in range(3000)]
    rates = _rates(verdicts)
    assert rates[FAIL] <= 0.01 and rates[PASS] <= 0.01
    # An A/A comparison against a 5 % floor, the gate's default: a false alarm is rarer still.
    verdicts = [_sequence(rng, 1.0, 0.05, 0.5, 1.05) for _ in range(2000)]
    assert _rates(verdicts)[FAIL] <= 0.01


def test_unpaired_false_alarms_against_fixed_stored_runs():
    # The stored runs are drawn once per sequence and stay fixed; only the candidate grows, looked at every run.
    rng = random.Random(7)
    design = Design(max_pairs=10)
    fails = 0
    for _ in range(1500):
        stored = [math.exp(rng.gauss(0.0, 0.05)) for _ in range(6)]
        cand = [math.exp(rng.gauss(0.0, 0.05)) for _ in range(2)]
        v = d.until_decided(lambda: d.decide(d.unpaired(cand, stored, design), 1.0),
                            lambda: cand.append(math.exp(rng.gauss(0.0, 0.05))), Budget(max_pairs=10))
        fails += v.outcome == FAIL
    assert fails / 1500 <= 0.01


def test_power_and_pairs_used():
    # 1xH200 fsdp2 1b varies 1.6 % run to run; with adjacent runs correlated 0.5 a pair's log ratio has sd
    # 1.6 % x sqrt(2 (1 - 0.5)) = 1.6 %. Against no floor (limit 1.0): +5 % caught >= 95 % at a median of at
    # most 6 pairs, +3 % >= 80 %, never more than the 12-pair budget.
    rng = random.Random(11)
    verdicts = [_sequence(rng, 1.05, 0.016, 0.5, 1.0) for _ in range(400)]
    pairs = sorted(v.estimate.n_pairs for v in verdicts)
    assert _rates(verdicts)[FAIL] >= 0.95 and pairs[len(pairs) // 2] <= 6 and pairs[-1] <= 12
    assert _rates([_sequence(rng, 1.03, 0.016, 0.5, 1.0) for _ in range(400)])[FAIL] >= 0.80
    # the same noise, no slowdown, against the gate's default 5 % floor: decided PASS within the budget
    assert _rates([_sequence(rng, 1.0, 0.016, 0.5, 1.05) for _ in range(400)])[PASS] >= 0.95


def test_pair_noise_is_cv_times_sqrt_2_1_minus_rho():
    rng = random.Random(3)
    ests = []
    for _ in range(100):
        pairs = [_pair(rng, 1.0, 0.04, 0.75) for _ in range(40)]
        ests.append(d.paired([p[0] for p in pairs], [p[1] for p in pairs], Design(max_pairs=40)))
    rms = lambda xs: math.sqrt(sum(x * x for x in xs) / len(xs))  # noqa: E731
    assert rms([e.pair_cv for e in ests]) == pytest.approx(0.04 * math.sqrt(2 * (1 - 0.75)), rel=0.05)
    assert rms([e.run_cv for e in ests]) == pytest.approx(0.04, rel=0.05)


def test_pairing_cancels_drift_that_hits_both_sides():
    drift = [1.0, 1.5, 2.0, 2.5]  # the machine slows down over time
    est = d.paired([1.2 * x for x in drift], drift)
    assert est.ratio == pytest.approx(1.2) and est.lo == pytest.approx(1.2) and est.hi == pytest.approx(1.2)
    assert d.decide(est, 1.1).outcome == FAIL and d.decide(est, 1.25).outcome == PASS


def test_three_outcomes_at_the_boundaries():
    e = d.exact(1.1)
    assert d.decide(e, 1.1).outcome == PASS  # within: hi <= limit
    assert d.decide(d.exact(1.1000001), 1.1).outcome == FAIL  # beyond: lo > limit
    assert d.decide(e, 1.1, "at_least").outcome == PASS and d.decide(e, 1.2, "at_least").outcome == FAIL
    assert d.decide(d.exact(0.0), 0.0, "above").outcome == FAIL and d.decide(d.exact(1e-9), 0.0, "above").outcome == PASS
    # an interval that holds the limit
    est = d.paired([1.0, 1.3, 1.1, 0.9], [1.0, 1.0, 1.0, 1.0])
    assert est.lo < 1.05 < est.hi
    v = d.decide(est, 1.05)
    assert v.outcome == INCONCLUSIVE and "holds the limit" in v.reason
    # one pair: no variance, no interval
    one = d.paired([1.5], [1.0])
    assert one.unbounded and d.decide(one, 1.1).outcome == INCONCLUSIVE
    assert "too few" in d.decide(one, 1.1).reason and one.interval_text() == "[0, inf]"


def test_few_pairs_give_wide_but_valid_intervals():
    # 3 pairs of a clearly 2x slower A: still inconclusive against 1.1 (the first looks spend almost no error) ...
    est = d.paired([2.0, 2.1, 1.9], [1.0, 1.0, 1.0])
    assert est.lo < 1.1 and d.decide(est, 1.1).outcome == INCONCLUSIVE
    # ... and decided once the pairs say so
    est = d.paired([2.0, 2.1, 1.9, 2.0, 2.05, 1.95], [1.0] * 6)
    assert d.decide(est, 1.1).outcome == FAIL


def test_budget_stops_give_inconclusive():
    a, b = [1.0, 1.3, 1.1], [1.0, 1.0, 1.0]
    cycle = [1.25, 0.95, 1.15, 1.0]

    def add():
        a.append(cycle[len(a) % 4])
        b.append(1.0)

    messages = []
    v = d.until_decided(lambda: d.decide(d.paired(a, b, Design(max_pairs=5)), 1.08), add, Budget(max_pairs=5),
                        progress=messages.append)
    assert v.outcome == INCONCLUSIVE and v.stopped == "max 5 pairs" and len(a) == 5
    assert messages[0].startswith("inconclusive after 3 pairs (1.") and messages[0].endswith("vs 1.08), running pair 4")
    # wall clock: each pair "takes" 100 s on a fake clock; a 250 s budget allows two of them
    now = [0.0]

    def slow_add():
        now[0] += 100.0
        add()

    a[:], b[:] = [1.0, 1.3, 1.1], [1.0, 1.0, 1.0]
    v = d.until_decided(lambda: d.decide(d.paired(a, b), 1.08), slow_add, Budget(max_pairs=12, seconds=250),
                        clock=Clock(started=0.0, now=lambda: now[0]))
    assert v.outcome == INCONCLUSIVE and v.stopped == "wall-clock budget 250 s" and len(a) == 5
    # the session's deadline (shared by every test): no pair may end past it
    a[:], b[:] = [1.0, 1.3, 1.1], [1.0, 1.0, 1.0]
    now[0] = 1000.0
    v = d.until_decided(lambda: d.decide(d.paired(a, b), 1.08), slow_add,
                        Budget(max_pairs=12, seconds=600, deadline=1150.0, deadline_text="session budget 480 s"),
                        clock=Clock(started=1000.0, now=lambda: now[0]))
    assert v.outcome == INCONCLUSIVE and v.stopped == "session budget 480 s" and len(a) == 4


def test_decided_sequences_stop_at_once():
    calls = []
    v = d.until_decided(lambda: d.decide(d.exact(1.0), 1.1), lambda: calls.append(1), Budget())
    assert v.outcome == PASS and v.stopped == "decided" and not calls


def test_unpaired_edge_cases():
    assert d.unpaired([1.0], [1.0]).unbounded  # one run each: no variance anywhere
    assert d.unpaired([1.0], [1.0, 1.1, 0.9]).unbounded  # the candidate's own variance is unknown
    # a deterministic metric (CUDA peak allocated): identical stored runs, one candidate run -> decided
    est = d.unpaired([110.0], [100.0, 100.0, 100.0])
    assert est.lo == est.hi == pytest.approx(1.1)
    assert d.decide(est, 1.05).outcome == FAIL
    # the interval cannot be narrower than the stored runs allow: their mean's uncertainty stays
    stored = [0.97, 1.0, 1.03]
    wide = d.unpaired([1.0] * 11 + [1.0001], stored)
    assert wide.lo < 0.98 and wide.hi > 1.02


def test_a_baselines_resolution_is_the_reach_of_the_interval_of_an_equally_spread_candidate():
    stored = [1.0, 1.08, 0.95, 1.02, 0.97, 1.05]
    design = Design(max_pairs=6)
    factor = d.unpaired_resolution(stored, 6, design)
    est = d.unpaired([1.3 * x for x in stored], stored, design)  # the same spread, 1.3x slower
    assert est.hi / est.ratio == pytest.approx(factor) and est.ratio / est.lo == pytest.approx(factor)
    # so a candidate fails a limit exactly when its ratio clears limit x factor
    assert d.decide(d.unpaired([1.01 * 1.1 * factor * x for x in stored], stored, design), 1.1).outcome == FAIL
    assert d.decide(d.unpaired([0.99 * 1.1 * factor * x for x in stored], stored, design), 1.1).outcome == INCONCLUSIVE
    assert d.unpaired_resolution(stored, 12, Design(max_pairs=12)) < factor  # more candidate runs reach less far
    assert d.unpaired_resolution([1.0], 6, design) is None  # one stored run: no spread to go by
    assert d.unpaired_resolution([5.0, 5.0, 5.0], 6, design) == 1.0  # an exact metric


def test_records_round_trip_through_json():
    v = d.decide(d.paired([1.2, 1.25, 1.18, 1.22], [1.0, 1.01, 0.99, 1.0]), 1.1)
    again = d.Verdict.from_json(v.to_json())
    assert again == v and d.Estimate.from_json(v.estimate.to_json()) == v.estimate
    unbounded = d.decide(d.paired([1.5], [1.0]), 1.1)
    assert d.Verdict.from_json(unbounded.to_json()) == unbounded
    with pytest.raises(ValueError, match="outcome"):
        d.Verdict.from_json({**v.to_json(), "outcome": "warn"})
    with pytest.raises(ValueError, match="method"):
        d.Estimate.from_json({**v.estimate.to_json(), "method": "bayes"})


def test_bad_input_is_rejected():
    with pytest.raises(ValueError, match="equal"):
        d.paired([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="positive"):
        d.paired([0.0], [1.0])
    with pytest.raises(ValueError, match="direction"):
        d.decide(d.exact(1.0), 1.0, "below")
    with pytest.raises(ValueError, match="max_pairs"):
        Design(max_pairs=1)
    with pytest.raises(ValueError, match="beyond"):
        d.paired([1.0] * 65, [1.0] * 65)
