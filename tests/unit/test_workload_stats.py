"""Workload statistics (parity_ui.core.pooled): Wilson intervals, the survival curve, exact
quantiles, the token figures against hand computations, position buckets, masked positions,
streaming equals all-at-once, JSON, and the verdict against a noise floor. Pure and fast."""
from __future__ import annotations

import json
import math
import random
import statistics
import time
from collections import Counter

import pytest

from parity_ui.core.pooled import (
    DEFAULT_BUCKETS, FLOOR_FIGURE_NAMES, NOT_IDENTICAL, RHO_BANDS, Accumulator, FloorVerdict, PairSample,
    WorkloadStats, compare_to_floor, quantile, token_stats, wilson, wilson_interval, wilson_lower, workload_stats,
)


def sample(i: int, side: list, ref: list, *, identical: bool = False, first: int | None = None,
           verdict: str | None = None, positions: list[int] | None = None, length: int | None = None) -> PairSample:
    return PairSample(prompt_index=i, identical=identical, first_divergence=first,
                      length=len(side) if length is None else length, verdict=verdict, logp_side=side,
                      logp_ref=ref, positions=list(range(len(side))) if positions is None else positions)


def gapped(i: int, gaps: list[float], base: float = -1.0, **kw) -> PairSample:
    """A sample whose side logprobs are `base` and whose reference differs by -gap (dlogp = gap)."""
    return sample(i, [base] * len(gaps), [base - g for g in gaps], **kw)


def random_samples(n: int, seed: int, tokens: int = 40, spread: float = 0.05) -> list[PairSample]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        side = [-rng.expovariate(1.5) for _ in range(tokens)]
        ref = [min(0.0, a + rng.gauss(0, spread)) for a in side]
        if rng.random() < 0.1:
            side[rng.randrange(tokens)] = -1e30  # masked
        same = rng.random() < 0.3
        out.append(sample(i, side, ref, identical=same, first=None if same else rng.randrange(tokens),
                          verdict="identical" if same else rng.choice(["numerical near-tie", "real disagreement"])))
    return out


# --- Wilson ------------------------------------------------------------------------------------

# 95% Wilson intervals for n = 10, to 4 decimals: the published table (Newcombe 1998's method 3),
# re-derived here by inverting the score test numerically.
WILSON_10 = [(0.0000, 0.2775), (0.0179, 0.4042), (0.0567, 0.5098), (0.1078, 0.6032), (0.1682, 0.6873),
             (0.2366, 0.7634), (0.3127, 0.8318), (0.3968, 0.8922), (0.4902, 0.9433), (0.5958, 0.9821),
             (0.7225, 1.0000)]


def test_wilson_matches_the_table_for_every_k():
    for k, (low, high) in enumerate(WILSON_10):
        got = wilson(k, 10)
        assert got[0] == pytest.approx(low, abs=5e-5) and got[1] == pytest.approx(high, abs=5e-5), k


def test_wilson_closed_forms_at_the_ends():
    # Worked by hand from the formula: p = 1 gives low = n / (n + z^2); p = 0 gives high = z^2 / (n + z^2).
    for n in (1, 7, 100, 10_000):
        assert wilson(n, n)[0] == pytest.approx(n / (n + 1.96 ** 2), rel=1e-12)
        assert wilson(0, n) == (0.0, pytest.approx(1.96 ** 2 / (n + 1.96 ** 2), rel=1e-12))
        z1 = 1.6448536269514722  # one-sided 95%
        assert wilson_lower(n, n) == pytest.approx(n / (n + z1 * z1), rel=1e-12)


def test_wilson_one_sided_bound_is_between_the_two_sided_low_and_the_share():
    for k in range(0, 51):
        w = wilson_interval(k, 50)
        assert w.low <= w.lower_one_sided <= k / 50 + 1e-15
        assert w.lower_one_sided < k / 50 or k == 0


@pytest.mark.parametrize("k,n", [(0, 0), (-1, 5), (6, 5)])
def test_wilson_refuses_impossible_counts(k, n):
    with pytest.raises(ValueError, match="0 <= k <= n"):
        wilson(k, n)


# --- quantiles, survival -------------------------------------------------------------------------

def test_quantile_is_exact_with_linear_interpolation():
    values = [float(v) for v in range(101)]
    assert quantile(values, 0.5) == 50.0 and quantile(values, 0.95) == 95.0 and quantile(values, 0.99) == 99.0
    assert quantile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5
    assert quantile([1.0, 2.0, 3.0, 4.0], 0.99) == pytest.approx(3.97)
    assert quantile([7.0], 0.99) == 7.0
    with pytest.raises(ValueError):
        quantile([], 0.5)
    with pytest.raises(ValueError):
        quantile([1.0], 1.5)


def test_pooled_quantiles_equal_quantiles_of_all_gaps_sorted():
    """The pooled |dlogp| quantiles come from searching every bucket's sorted gaps together; they
    must equal the plain quantile of all gaps, positive and negative, with repeats."""
    rng = random.Random(3)
    samples, gaps = [], []
    for i in range(30):
        g = [rng.choice([0.0, 0.25, -0.25, rng.uniform(-2, 2)]) for _ in range(300)]
        gaps += g
        samples.append(gapped(i, g, base=-3.0))
    stats = workload_stats(samples)
    abs_sorted = sorted(abs(g) for g in gaps)
    t = stats.tokens
    assert t.abs_dlogp_p50 == quantile(abs_sorted, 0.5)
    assert t.abs_dlogp_p95 == quantile(abs_sorted, 0.95)
    assert t.abs_dlogp_p99 == quantile(abs_sorted, 0.99)
    assert t.abs_dlogp_max == abs_sorted[-1]


def test_pooled_pearson_equals_the_correlation_of_all_probabilities():
    """The pooled Pearson r is combined from the buckets' centred sums; it must equal the plain
    correlation of every pair, and be None when a probability vector is constant."""
    rng = random.Random(4)
    side = [-rng.expovariate(1.0) for _ in range(400)]
    ref = [min(0.0, a + rng.gauss(0, 0.3)) for a in side]
    stats = workload_stats([sample(0, side, ref)])  # 400 positions: all four buckets
    assert len([b for b in stats.by_position if b.tokens.pairs]) == 4
    expected = statistics.correlation([math.exp(a) for a in side], [math.exp(b) for b in ref])
    assert stats.tokens.pearson == pytest.approx(expected, rel=1e-12)
    assert token_stats([-0.5] * 10, [-0.5 - i / 10 for i in range(10)]).pearson is None
    constant_across_buckets = workload_stats([sample(0, [-0.5] * 100, [-0.5 - i / 100 for i in range(100)])])
    assert constant_across_buckets.tokens.pearson is None


def test_survival_curve_and_medians_on_a_small_example():
    samples = [
        gapped(0, [0.1] * 8, first=2), gapped(1, [0.1] * 8, first=2), gapped(2, [0.1] * 8, first=5),
        gapped(3, [0.0] * 8, identical=True), gapped(4, [0.0] * 8, identical=True),
        gapped(5, [0.3] * 8),  # scored mode: not identical, no first divergence defined
    ]
    s = workload_stats(samples).sequences
    assert (s.n, s.identical, s.diverged, s.divergence_unknown) == (6, 2, 3, 1)
    assert s.share_identical == pytest.approx(2 / 6)
    surv = s.survival
    assert surv.n == 5 and surv.at == [2, 5] and surv.share == [pytest.approx(0.6), pytest.approx(0.4)]
    # S(k) = share whose first divergence is > k; identical prompts never leave the curve.
    assert [surv.value(k) for k in (0, 1, 2, 4, 5, 1000)] == [1.0, 1.0, 0.6, 0.6, 0.4, 0.4]
    assert s.median_first_divergence == 2.0  # of 2, 2, 5
    assert s.median_first_divergence_all == 5.0  # of 2, 2, 5, 8, 8 (identical at their length)


def test_verdict_counts_and_worst_prompts():
    samples = [gapped(0, [0.1, 0.2], first=7, verdict="numerical near-tie"),
               gapped(1, [0.9, 0.0], first=3, verdict="real disagreement"),
               gapped(2, [0.0, 0.0], identical=True, verdict="identical"),
               gapped(3, [0.0, -0.4], first=3, verdict="numerical near-tie"),
               gapped(4, [0.05, 0.0], first=20)]
    stats = workload_stats(samples, top_n=2)
    assert stats.sequences.verdicts == {"identical": 1, "numerical near-tie": 2, "real disagreement": 1}
    assert [w.prompt_index for w in stats.worst_by_divergence] == [1, 3]  # ties by index
    assert [w.prompt_index for w in stats.worst_by_gap] == [1, 3]
    all_gaps = workload_stats(samples, top_n=10).worst_by_gap
    assert [w.prompt_index for w in all_gaps] == [1, 3, 0, 4]  # the identical prompt has no gap
    assert all_gaps[1].max_abs_dlogp == pytest.approx(0.4) and all_gaps[1].first_divergence == 3


# --- token figures -------------------------------------------------------------------------------

def test_token_figures_against_hand_computation():
    side = [-0.1, -1.0, -2.0, -0.5]
    ref = [-0.2, -1.0, -1.5, -0.495]
    t = token_stats(side, ref)
    d = [a - b for a, b in zip(side, ref)]  # 0.1, 0, -0.5, -0.005
    rho = [math.exp(b - a) for a, b in zip(side, ref)]
    assert t.pairs == 4 and t.skipped == 0
    assert t.k1 == pytest.approx(sum(d) / 4)
    assert t.k3 == pytest.approx(sum(r - math.log(r) - 1 for r in rho) / 4)
    assert t.token_mult_prob_error == pytest.approx(sum(math.exp(abs(x)) for x in d) / 4)
    assert (t.rho_min, t.rho_max) == (pytest.approx(min(rho)), pytest.approx(max(rho)))
    assert t.rho_mean == pytest.approx(sum(rho) / 4)
    assert t.abs_dlogp_mean == pytest.approx(0.605 / 4) and t.abs_dlogp_max == pytest.approx(0.5)
    assert t.abs_dlogp_p50 == pytest.approx(0.0525)  # halfway between 0.005 and 0.1
    p_side, p_ref = [math.exp(x) for x in side], [math.exp(x) for x in ref]
    assert t.abs_dprob_max == pytest.approx(max(abs(a - b) for a, b in zip(p_side, p_ref)))
    assert t.abs_dprob_mean == pytest.approx(sum(abs(a - b) for a, b in zip(p_side, p_ref)) / 4)
    assert t.pearson == pytest.approx(statistics.correlation(p_side, p_ref), rel=1e-12)
    # rho: 0.905 (outside the two tight bands), 1.0 (inside all), 1.649 (outside all),
    # 1.005 (outside only [0.999, 1.002]); [0.8, 1.2]: only 1.649
    assert [b.outside for b in t.outside] == [0.25, 0.5, 0.75, 0.25]
    assert t.extreme_share == 0.0  # no |dlogp| above ln 2 (the largest is 0.5)
    assert [(b.low, b.high) for b in t.outside] == list(RHO_BANDS)


def test_band_edges_follow_the_comparison_of_each_ratio():
    """Counted by bisection over the sorted gaps, yet exactly what comparing each ratio says."""
    lo, hi = math.log(0.9), math.log(1.1)
    # rho = exp(-gap): just below 0.9, just above it, just above 1.1, just below it, exactly 1
    gaps = [-lo + 1e-9, -lo - 1e-9, -hi - 1e-9, -hi + 1e-9, 0.0]
    t = token_stats([-1.0] * 5, [-1.0 - g for g in gaps])
    rho = [math.exp(-g) for g in gaps]
    assert [b.outside for b in t.outside] == [sum(1 for r in rho if not a <= r <= b) / 5 for a, b in RHO_BANDS]
    assert t.outside[0].outside == 2 / 5


def test_kl_sign_and_k3_non_negative():
    # The side more sure of its own tokens than the reference: KL(side||ref) estimate > 0.
    sure = token_stats([-0.1] * 5, [-0.7] * 5)
    assert sure.k1 == pytest.approx(0.6) and sure.k3 > 0
    unsure = token_stats([-0.7] * 5, [-0.1] * 5)
    assert unsure.k1 == pytest.approx(-0.6) and unsure.k3 > 0
    # k3 ~ dlogp^2 / 2 for small gaps, not lost to rounding
    tiny = token_stats([-1.0] * 4, [-1.0 - 1e-6] * 4)
    assert tiny.k3 == pytest.approx(0.5e-12, rel=1e-3)


def test_identical_logprobs_give_zero_figures():
    rng = random.Random(1)
    samples = []
    for i in range(20):
        lp = [-rng.expovariate(1.0) for _ in range(50)]
        samples.append(sample(i, lp, list(lp), identical=True, verdict="identical"))
    stats = workload_stats(samples)
    t = stats.tokens
    assert t.pairs == 1000
    assert (t.abs_dlogp_mean, t.abs_dlogp_p99, t.abs_dlogp_max, t.abs_dprob_max, t.k1, t.k3) == (0, 0, 0, 0, 0, 0)
    assert t.token_mult_prob_error == 1.0 and t.rho_min == t.rho_mean == t.rho_max == 1.0
    assert all(b.outside == 0.0 for b in t.outside)
    assert t.pearson == pytest.approx(1.0, abs=1e-12)
    assert stats.sequences.share_identical == 1.0
    assert stats.sequences.seq_ratio.min == stats.sequences.seq_ratio.max == 1.0
    assert stats.worst_by_gap == [] and stats.worst_by_divergence == []
    v = compare_to_floor(stats, workload_stats(samples))
    assert v.verdict == "within noise" and v.exceeded == [] and not v.identical.worse


def test_masked_and_missing_positions_are_skipped_and_counted():
    side = [-0.5, -1e30, -0.4, None, -0.3, float("nan"), -0.2, float("-inf")]
    ref = [-0.6, -0.2, -1e25, -0.1, -0.35, -0.1, -0.1, -0.3]
    masked = workload_stats([sample(0, side, ref, positions=[0, 1, 2, 3, 20, 21, 22, 70])])
    clean = workload_stats([sample(0, [-0.5, -0.3, -0.2], [-0.6, -0.35, -0.1], positions=[0, 20, 22])])
    assert masked.tokens.skipped == 5 and masked.tokens.pairs == 3
    assert [b.tokens.skipped for b in masked.by_position] == [3, 1, 1, 0]
    drop = ("skipped",)
    for a, b in [(masked.tokens, clean.tokens), *((x.tokens, y.tokens) for x, y in
                                                   zip(masked.by_position, clean.by_position))]:
        assert {k: v for k, v in a.__dict__.items() if k not in drop} == \
            {k: v for k, v in b.__dict__.items() if k not in drop}
    # a sample with nothing scorable still counts as a sequence
    none = workload_stats([sample(0, [-1e30, None], [-0.1, -0.2])])
    assert none.tokens.pairs == 0 and none.tokens.skipped == 2 and none.tokens.k1 is None
    assert none.sequences.without_pairs == 1 and none.sequences.seq_ratio.median is None


def test_position_buckets():
    assert DEFAULT_BUCKETS == (0, 16, 64, 256)
    # gap = 0.01 * bucket number, for positions 0..299 out of order
    positions = list(range(300))
    random.Random(2).shuffle(positions)
    gaps = [0.01 * (sum(p >= e for e in DEFAULT_BUCKETS)) for p in positions]
    stats = workload_stats([gapped(0, gaps, positions=positions)])
    assert [(b.start, b.end) for b in stats.by_position] == [(0, 16), (16, 64), (64, 256), (256, None)]
    assert [b.tokens.pairs for b in stats.by_position] == [16, 48, 192, 44]
    assert [b.tokens.abs_dlogp_max for b in stats.by_position] == \
        [pytest.approx(0.01), pytest.approx(0.02), pytest.approx(0.03), pytest.approx(0.04)]
    assert stats.tokens.pairs == 300
    custom = workload_stats([gapped(0, gaps, positions=positions)], buckets=(0, 100))
    assert [b.tokens.pairs for b in custom.by_position] == [100, 200]
    for bad in [(), (1, 16), (0, 16, 16), (0, 8.5)]:
        with pytest.raises(ValueError, match="buckets"):
            Accumulator(bad)


def test_one_at_a_time_equals_all_at_once_in_any_order():
    samples = random_samples(120, seed=5)
    acc = Accumulator()
    for s in samples:
        acc.add(s)
    streamed = acc.result(top_n=5)
    assert len(acc) == 120
    shuffled = list(samples)
    random.Random(9).shuffle(shuffled)
    assert streamed.to_dict() == workload_stats(samples, top_n=5).to_dict() == \
        workload_stats(shuffled, top_n=5).to_dict()
    assert acc.result(top_n=5).to_dict() == streamed.to_dict()  # result() does not consume


def test_json_round_trip():
    stats = workload_stats(random_samples(60, seed=6))
    text = json.dumps(stats.to_dict(), allow_nan=False)
    back = WorkloadStats.from_dict(json.loads(text))
    assert back == stats
    empty = workload_stats([])
    assert WorkloadStats.from_dict(json.loads(json.dumps(empty.to_dict(), allow_nan=False))) == empty


def test_huge_gaps_saturate_to_finite_json():
    # A logit masked to float16's minimum on one side: hundreds of nats; ratios saturate, no overflow.
    stats = workload_stats([sample(i, [-0.01] * 200, [-900.0] * 200, first=0) for i in range(20)]
                           + [sample(20, [-900.0], [-0.01], first=0)])
    t = stats.tokens
    assert t.abs_dlogp_max == pytest.approx(899.99) and t.rho_min == 0.0 and t.rho_max > 1e200
    assert math.isfinite(t.rho_mean) and math.isfinite(t.token_mult_prob_error) and math.isfinite(t.k3)
    json.dumps(stats.to_dict(), allow_nan=False)
    json.dumps(compare_to_floor(stats, workload_stats([])).to_dict(), allow_nan=False)


def test_bad_samples_are_refused_and_leave_the_accumulator_unchanged():
    acc = Accumulator()
    acc.add(gapped(0, [0.1, 0.2], first=1))
    before = acc.result().to_dict()
    cases = [
        (gapped(0, [0.1]), "added twice"),
        (sample(1, [-0.1, -0.2], [-0.1]), "parallel"),
        (gapped(1, [0.1], identical=True, first=0), "identical, yet"),
        (gapped(1, [0.1], first=-1), "negative"),
        (sample(1, [-0.1, 0.5], [-0.1, -0.2]), "above 0"),
        (sample(1, [-0.1, None, 0.5], [-0.1, -0.2, -0.1]), "above 0"),  # the slow path too
        (sample(1, [-0.1, -1e30], [-0.1, -0.1], positions=[0, -3]), "position -3"),
        (gapped(-1, [0.1]), "0-based"),
    ]
    for bad, message in cases:
        with pytest.raises(ValueError, match=message):
            acc.add(bad)
    assert len(acc) == 1 and acc.result().to_dict() == before
    with pytest.raises(ValueError, match="top_n"):
        acc.result(top_n=-1)


# --- the noise floor -----------------------------------------------------------------------------

def alternating(n: int, gap: float, first: int | None = 3, start: int = 0) -> list[PairSample]:
    return [gapped(start + i, [gap, -gap] * 32, first=first) for i in range(n)]


def test_a_planted_larger_gap_exceeds_the_floor_by_its_factor():
    floor = workload_stats(alternating(50, 0.01))
    side = workload_stats(alternating(50, 0.05))
    v = compare_to_floor(side, floor)
    assert v.verdict == "exceeds noise"
    checks = {c.name: c for c in v.figures}
    for name in ("abs_dlogp_mean", "abs_dlogp_p99", "abs_dlogp_max"):
        assert checks[name].exceeds and checks[name].factor == pytest.approx(5.0)
        assert name in v.exceeded
    assert checks["k3"].factor == pytest.approx(25.0, rel=2e-3)  # ~ gap^2 / 2
    assert "|Δlogprob| p99 0.05 vs 0.01 (5x)" in v.summary  # the display name, not the key
    # the other way round the side is quieter than its floor
    assert compare_to_floor(floor, side).verdict == "within noise"


def test_tolerance_and_epsilon():
    # gaps that stay on the same side of every band edge: only the factor decides
    floor = workload_stats(alternating(50, 0.02))
    side = workload_stats(alternating(50, 0.028))
    assert compare_to_floor(side, floor).verdict == "within noise"  # 1.4x < 1.5x (k3: 1.96x < 1.5^2)
    tight = compare_to_floor(side, floor, tolerance=1.2)
    assert tight.verdict == "exceeds noise" and "abs_dlogp_max" in tight.exceeded
    # a large epsilon on every figure the gap moves makes the same excess noise
    loose = compare_to_floor(side, floor, tolerance=1.2, epsilon={n: 1.0 for n in FLOOR_FIGURE_NAMES})
    assert loose.verdict == "within noise"
    assert {c.note for c in loose.figures if c.factor and c.factor > 1.2} == {"within (difference below epsilon)"}
    with pytest.raises(ValueError, match="unknown figure 'p99'"):
        compare_to_floor(side, floor, epsilon={"p99": 0.1})
    with pytest.raises(ValueError, match="tolerance"):
        compare_to_floor(side, floor, tolerance=0.5)


def test_zero_floor():
    floor = workload_stats([gapped(i, [0.0] * 64, identical=True) for i in range(50)])
    # rounding-level differences over a zero floor stay noise
    tiny = compare_to_floor(workload_stats([gapped(i, [1e-7, -1e-7] * 32, identical=True) for i in range(50)]), floor)
    assert tiny.verdict == "within noise"
    assert {c.name: c.note for c in tiny.figures}["abs_dlogp_max"] == "within (difference below epsilon)"
    # zero against zero is within, with no factor
    same = {c.name: c for c in compare_to_floor(floor, floor).figures}["abs_dlogp_max"]
    assert same.note == "within (both zero)" and same.factor is None and not same.exceeds
    # a real gap over a zero floor exceeds with an infinite factor
    v = compare_to_floor(workload_stats(alternating(50, 0.1)), floor)
    c = {c.name: c for c in v.figures}["abs_dlogp_max"]
    assert v.verdict == "exceeds noise" and c.factor == math.inf and c.floor_is_zero
    assert c.note == "exceeds (floor is zero)" and "floor is zero" in v.summary
    d = v.to_dict()
    assert {f["name"]: f for f in d["figures"]}["abs_dlogp_max"]["factor"] is None
    json.dumps(d, allow_nan=False)


def test_share_identical_is_judged_by_wilson_intervals():
    def run(identical: int, n: int = 100):
        return workload_stats([gapped(i, [0.0] * 4, identical=True) if i < identical else
                               gapped(i, [0.0] * 4, first=2) for i in range(n)])
    worse = compare_to_floor(run(40), run(90))
    check = {c.name: c for c in worse.figures}["not_identical"]
    assert worse.identical.worse and worse.exceeded == ["not_identical"] and worse.verdict == "exceeds noise"
    assert worse.identical.side_ci.high < worse.identical.floor_ci.low
    assert check.factor == pytest.approx(6.0) and check.note == "exceeds (Wilson intervals apart)"
    assert "share identical 0.4 [0.309, 0.498] below the floor's 0.9" in worse.summary
    # 16 against 10 prompts in 100 diverge: 1.6x, but the intervals overlap: sampling noise
    close = compare_to_floor(run(84), run(90))
    check = {c.name: c for c in close.figures}["not_identical"]
    assert check.factor == pytest.approx(1.6) and not check.exceeds and close.verdict == "within noise"
    assert check.note == "within (Wilson intervals overlap)"
    # the same shares over 10,000 prompts are apart
    assert compare_to_floor(run(8400, 10_000), run(9000, 10_000)).exceeded == ["not_identical"]


def test_a_floor_without_scorable_tokens_is_not_comparable_even_where_the_shares_identical_agree():
    """A replay's rows are identical by construction: with no token figure on the floor, the share
    identical alone would have called a side 0.25 nats off 'within noise'."""
    side = workload_stats([gapped(i, [0.25] * 4, identical=True) for i in range(100)])
    floor = workload_stats([sample(i, [None] * 4, [None] * 4, identical=True) for i in range(100)])
    v = compare_to_floor(side, floor)
    assert v.verdict == "not comparable" and "share of identical streams alone" in v.summary
    # A side worse than its floor on the share identical still exceeds, token figures or not.
    worse = workload_stats([sample(i, [None] * 4, [None] * 4, first=0) for i in range(100)])
    assert compare_to_floor(worse, floor).verdict == "exceeds noise"


def test_empty_stats_are_not_comparable():
    v = compare_to_floor(workload_stats([]), workload_stats([]))
    assert v.verdict == "not comparable" and v.exceeded == []


def test_ten_thousand_prompts_of_128_tokens_take_seconds():
    rng = random.Random(7)
    side_block = [-rng.expovariate(1.5) for _ in range(1024)]
    ref_block = [min(0.0, a + rng.gauss(0, 0.02)) for a in side_block]
    # 10,000 different windows of the two blocks (slicing is cheap; the figures are what is timed)
    samples = [sample(i, side_block[o:o + 128], ref_block[o:o + 128], first=i % 128)
               for i, o in ((i, (i * 37) % 896) for i in range(10_000))]
    start = time.process_time()
    stats = workload_stats(samples)
    spent = time.process_time() - start
    print(f"10,000 x 128 tokens: {spent:.2f} s CPU")
    assert stats.tokens.pairs == 1_280_000
    assert spent < 30  # generous: ~1.6 s CPU on the 2-core development machine


# --- the verdict's uncertainty (issue 33, item 7) --------------------------------------------------

def _same_process(rng: random.Random, n: int, mult: float = 1.0, tokens: int = 64) -> list[PairSample]:
    """n prompts whose gaps are drawn from one process: each prompt its own scale (some prompts are
    harder), every token a Gaussian gap at that scale; `mult` scales every gap."""
    out = []
    for i in range(n):
        scale = rng.lognormvariate(-5, 1.0) * mult
        side = [-rng.expovariate(1.0) for _ in range(tokens)]
        out.append(sample(i, side, [min(0.0, a + rng.gauss(0, scale)) for a in side]))
    return out


def test_a_side_equal_to_the_floor_in_distribution_on_few_prompts_is_not_called_exceeds():
    called, over = Counter(), 0
    for seed in range(12):
        rng = random.Random(seed)
        v = compare_to_floor(workload_stats(_same_process(rng, 16)), workload_stats(_same_process(rng, 16)))
        called[v.verdict] += 1
        # the point factors alone (the old verdict) are over the limit on most of these draws
        over += any(c.factor is not None and c.factor > c.limit and c.side - c.floor > c.epsilon
                    for c in v.figures if c.name != NOT_IDENTICAL)
        for c in v.figures:
            if c.uncertain:
                assert c.note == "too few prompts to tell" and not c.exceeds
                assert c.factor_low <= c.limit < c.factor  # its interval reaches the limit
    assert over >= 6, over
    assert called["exceeds noise"] <= 1, called  # at most one false alarm in 12 (~5% over many draws)
    assert called["too few prompts to tell"] >= 4, called
    v = next(v for seed in range(12) if (v := compare_to_floor(
        workload_stats(_same_process(random.Random(seed), 16)),
        workload_stats(_same_process(random.Random(seed + 100), 16)))).verdict == "too few prompts to tell")
    assert v.summary.startswith("too few prompts to tell: over 16 prompts, ") and "95% interval" in v.summary
    assert not v.exceeded and v.uncertain and v.prompts == 16
    assert FloorVerdict.from_dict(json.loads(json.dumps(v.to_dict(), allow_nan=False))) == v


def test_a_real_excess_on_few_prompts_still_exceeds_with_its_interval():
    rng = random.Random(3)
    v = compare_to_floor(workload_stats(_same_process(rng, 16, mult=10)), workload_stats(_same_process(rng, 16)))
    assert v.verdict == "exceeds noise"
    c = {c.name: c for c in v.figures}["abs_dlogp_mean"]
    assert c.exceeds and c.factor_low > c.limit and c.factor_low <= c.factor <= c.factor_high
    assert f"({c.factor:.3g}x, 95% interval {c.factor_low:.3g}x–{c.factor_high:.3g}x)" in v.summary


def test_resamples_are_seeded_paired_and_stored():
    samples = _same_process(random.Random(5), 20)
    a, b = workload_stats(samples), workload_stats(list(reversed(samples)))
    assert a.resamples == b.resamples  # the same prompts, any order: the same draws
    assert set(a.resamples) == set(FLOOR_FIGURE_NAMES) and all(len(v) == 200 for v in a.resamples.values())
    assert WorkloadStats.from_dict(json.loads(json.dumps(a.to_dict()))).resamples == a.resamples
    # a side against itself: every paired resample's factor is 1
    c = {c.name: c for c in compare_to_floor(a, b).figures}["abs_dlogp_p99"]
    assert c.factor_low == c.factor_high == pytest.approx(1.0)
    # one prompt: nothing to resample, judged on the point factor as before
    assert workload_stats(samples[:1]).resamples is None
