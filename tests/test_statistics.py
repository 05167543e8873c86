"""diffeqformer.analysis.statistics: spreads over seeds and the rule that tells a significant difference from noise.

The rule is checked by simulation: with no true difference it calls at most 5% of comparisons significant (within
the simulation's error), and it finds a clear difference most of the time; the rule it replaced (twice Welch's
standard error) fails the first check, so the check can fail. The smallest detectable difference, the equivalence
test and Holm's adjustment are checked the same way: by what they promise, simulated."""

import math

import numpy as np
import pandas as pd
import pytest
import statsmodels.formula.api as smf
from scipy import stats
from statsmodels.stats.contingency_tables import mcnemar as statsmodels_mcnemar
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.power import TTestPower
from statsmodels.stats.weightstats import ttost_ind, ttost_paired

from diffeqformer.analysis.multiplicity import holm, intersection
from diffeqformer.report.words import statistics as wording
from diffeqformer.analysis.statistics import (CONTRADICTED, EXACT_LABELS, EXACT_SIGNS, INCONCLUSIVE, MCNEMAR,
                                              ONE_SAMPLE, PAIRED, REPRODUCED, SEED_SLOPE, SLOPE, UNTESTED,
                                              WELCH, all_runs, as_list, compare, detectable_difference, equivalence,
                                              mcnemar, one_sample, spread, trend)

DRAWS = 2000
BOUND = 0.05 + 3 * math.sqrt(0.05 * 0.95 / DRAWS)
"""The largest false-positive rate a 5% test may show in ``DRAWS`` simulated comparisons (three binomial errors)."""


def _seed_values(rng, n, difference, *, shared=0.0):
    """[DRAWS, n] seed values of two settings (standard normal per seed, means ``difference`` apart); ``shared``:
    the variance of each seed's value that seed k of both settings shares (its data order), of 1 in all."""
    common = math.sqrt(shared) * rng.standard_normal((DRAWS, n))
    own = math.sqrt(1 - shared)
    a = difference + common + own * rng.standard_normal((DRAWS, n))
    return a, common + own * rng.standard_normal((DRAWS, n))


def _rate(a, b, rule):
    return float(np.mean([rule(x, y) for x, y in zip(a, b)]))


def _welch(x, y):
    return compare(x, y).significant


def _paired(x, y):
    return compare(x, y, paired=True).significant


def _twice_the_standard_error(x, y):
    """The rule ``seeds`` used before: |mean difference| > 2 Welch standard errors."""
    return abs(x.mean() - y.mean()) > 2 * math.sqrt(x.var(ddof=1) / len(x) + y.var(ddof=1) / len(y))


@pytest.mark.parametrize("n", [2, 3])
def test_no_more_than_five_percent_false_results(n):
    rng = np.random.default_rng(36)
    for rule, shared in ((_welch, 0.0), (_paired, 0.0), (_paired, 0.5)):
        a, b = _seed_values(rng, n, 0.0, shared=shared)
        assert _rate(a, b, rule) <= BOUND, (rule.__name__, n, shared)
    a, b = _seed_values(rng, n, 0.0)
    assert _rate(a, b, _twice_the_standard_error) > BOUND  # the old rule fails this test


def test_three_seeds_find_a_difference_of_three_standard_deviations():
    rng = np.random.default_rng(37)
    a, b = _seed_values(rng, 3, 3.0)
    assert _rate(a, b, _welch) > 0.5
    a, b = _seed_values(rng, 3, 3.0, shared=0.5)  # seed k of both sides shares half its variance
    assert _rate(a, b, _paired) > 0.5


def test_mcnemar_false_results_and_power():
    rng = np.random.default_rng(38)
    pairs = 100
    null = [mcnemar(rng.random(pairs) < 0.5, rng.random(pairs) < 0.5).significant for _ in range(DRAWS)]
    assert np.mean(null) <= BOUND
    clear = [mcnemar(rng.random(pairs) < 0.7, rng.random(pairs) < 0.4).significant for _ in range(DRAWS)]
    assert np.mean(clear) > 0.5


def test_mcnemar_counts_each_prompt_once_over_seeds():
    """The same prompts seen by 3 seeds' models, each prompt suiting one method or the other (no difference
    overall): pooling the prompts x seeds as independent pairs finds false results far more often than 5%;
    counting each prompt once does not."""
    rng = np.random.default_rng(39)
    prompts, replicates = 30, 3
    once, pooled = [], []
    for _ in range(DRAWS // 2):
        suits_a = rng.random((prompts, 1)) < 0.5
        a = rng.random((prompts, replicates)) < np.where(suits_a, 0.8, 0.2)
        b = rng.random((prompts, replicates)) < np.where(suits_a, 0.2, 0.8)
        once.append(mcnemar(a, b).significant)
        pooled.append(mcnemar(a.reshape(-1), b.reshape(-1)).significant)
    assert np.mean(once) <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / len(once))
    assert np.mean(pooled) > 0.1


def test_mcnemar_counts_discordant_pairs():
    a = [1] * 9 + [0] * 2 + [1] * 5 + [0] * 4  # 9 pairs only a hits, 2 only b, 5 both, 4 neither
    b = [0] * 9 + [1] * 2 + [1] * 5 + [0] * 4
    c = mcnemar(a, b)
    exact = stats.binomtest(9, 11)
    assert c.test == MCNEMAR and c.p == pytest.approx(exact.pvalue) and c.n == 20
    assert c.difference == pytest.approx(np.mean(a) - np.mean(b)) == pytest.approx(7 / 20)
    ci = exact.proportion_ci(method="exact")
    assert (c.low, c.high) == pytest.approx(((2 * ci.low - 1) * 11 / 20, (2 * ci.high - 1) * 11 / 20))
    assert c.low < c.difference < c.high
    assert mcnemar([1, 1], [1, 1]).verdict == INCONCLUSIVE  # no discordant pair: no difference shown
    assert mcnemar([1], [0]).verdict == f"{UNTESTED}: 1 pair"
    with pytest.raises(ValueError, match="binary"):
        mcnemar([0.5, 1], [0, 1])


def test_interval_and_p_are_scipys():
    a, b = [1.0, 2.5, 3.0], [0.0, 1.0, 2.2]
    welch, paired = compare(a, b), compare(a, b, paired=True)
    for c, want in ((welch, stats.ttest_ind(a, b, equal_var=False)), (paired, stats.ttest_rel(a, b))):
        ci = want.confidence_interval()
        assert (c.low, c.high, c.p) == pytest.approx((ci.low, ci.high, want.pvalue), rel=1e-12)
        assert c.difference == pytest.approx(np.mean(a) - np.mean(b)) and c.low < c.difference < c.high
    assert (welch.test, paired.test) == (WELCH, PAIRED)
    # the seeds share a lot: the paired differences (1.0, 1.5, 0.8) are tighter than the two spreads
    assert paired.significant and not welch.significant
    assert wording.comparison(paired) == (f"+1.1 (+103.1%), 95% CI [{paired.low:+.1f}, {paired.high:+.1f}], "
                                          f"p = {paired.p:.2g}, paired t-test: significant")
    assert welch.verdict == INCONCLUSIVE


def test_untested_and_degenerate():
    assert compare([2.0], [1.0, 1.1]).verdict == f"{UNTESTED}: 1 seed"  # one seed: no spread to judge by
    assert wording.comparison(compare([2.0], [1.0], paired=True)) == "+1.0 (+100.0%): untested: 1 seed"
    with pytest.raises(ValueError, match="same seeds"):
        compare([1.0, 2.0], [1.0, 2.0, 3.0], paired=True)
    assert compare([1.0, 1.0], [1.0, 1.0]).verdict == INCONCLUSIVE  # identical seeds, no difference shown


def test_no_spread_is_an_exact_test_never_p_zero():
    """Equal paired differences (a fraction stuck at 1 against one stuck at 0): the t statistic is d/0, so the test
    is the exact sign-flip test, p = 2 / 2^n, significant only from six pairs on; two constant unpaired sides: the
    exact permutation test of the labels."""
    three = compare([1.0] * 3, [0.0] * 3, paired=True)
    assert (three.test, three.p, three.verdict) == (EXACT_SIGNS, 0.25, INCONCLUSIVE) and math.isnan(three.low)
    assert wording.interval(three) == "p = 0.25, exact sign-flip test (no spread)"
    assert three.detectable == math.inf  # no pattern of three signs reaches p < 0.05
    six = compare([1.0] * 6, [0.0] * 6, paired=True)
    assert six.p == pytest.approx(2 / 64) and six.significant and six.detectable == 0.0
    labels = compare([1.0] * 4, [0.0] * 4)
    assert labels.test == EXACT_LABELS and labels.p == pytest.approx(2 / math.comb(8, 4))
    assert compare([2.0, 3.0], [1.0, 2.0], paired=True).p == 0.5  # the same offset in both seeds
    line = trend([1, 2, 3] * 6, np.tile([3.0, 2.0, 1.0], 6), np.repeat(range(6), 3))  # every point on the line
    assert line.test == EXACT_SIGNS and line.p == pytest.approx(2 / 64) and line.word(-1) == REPRODUCED


def test_four_words_of_a_claim():
    lower = compare([1.0, 1.2, 0.9], [2.0, 2.1, 1.9], paired=True)
    assert lower.significant and lower.word(-1) == REPRODUCED and lower.word(+1) == CONTRADICTED
    noisy = compare([1.0, 2.0, 3.0], [0.0, 1.0, 2.0])
    assert noisy.word(-1) == noisy.word(+1) == INCONCLUSIVE and noisy.verdict == INCONCLUSIVE
    assert compare([1.0], [2.0]).word(-1) == UNTESTED
    with pytest.raises(ValueError, match="direction"):
        lower.word(0)
    slopes = one_sample([0.3, 0.5, 0.4])
    assert slopes.test == ONE_SAMPLE and slopes.difference == pytest.approx(0.4) and slopes.word(+1) == REPRODUCED
    assert slopes.p == pytest.approx(stats.ttest_1samp([0.3, 0.5, 0.4], 0.0).pvalue)


def test_detectable_difference_is_the_80_percent_power_point():
    """Paired differences of sd 3.3% (F6's, in the build that asked for this): a difference of 10.8% is found 80% of
    the time with 3 seeds, 5.6% with 5, 3.8% with 8 (the noncentral t; the normal approximation gives about 10.6,
    5.5, 3.8); and a simulation of the paired t-test at that difference finds it 80% of the time (within the
    simulation's error)."""
    for n, expected in ((3, 10.77), (5, 5.55), (8, 3.81)):
        assert detectable_difference(3.3 / math.sqrt(n), n - 1) == pytest.approx(expected, abs=0.01)
    rng = np.random.default_rng(42)
    n, sd = 3, 1.0
    delta = detectable_difference(sd / math.sqrt(n), n - 1)
    d = delta + sd * rng.standard_normal((DRAWS, n))
    found = np.mean([compare(x, np.zeros(n), paired=True).significant for x in d])
    assert abs(found - 0.8) <= 3 * math.sqrt(0.8 * 0.2 / DRAWS)
    c = compare([1.0, 1.5, 0.8], [0.0, 0.0, 0.0], paired=True)
    assert c.detectable == pytest.approx(detectable_difference(c.se, 2)) and c.se == pytest.approx(
        np.std([1.0, 1.5, 0.8], ddof=1) / math.sqrt(3))


def test_equivalence_tost():
    """Two one-sided tests: with the true difference on the margin, at most 5% of tests show equivalence; a tight
    spread well inside the margin shows it; an interval wholly outside the margin contradicts it."""
    rng = np.random.default_rng(43)
    n, margin = 5, 1.0
    on_edge = margin + 0.5 * rng.standard_normal((DRAWS, n))
    shown = np.mean([equivalence(compare(x, np.zeros(n), paired=True), margin).word() == REPRODUCED
                     for x in on_edge])
    assert shown <= BOUND
    tight = equivalence(compare([0.05, -0.02, 0.01, 0.03, -0.04], [0.0] * 5, paired=True), 0.2)
    assert tight.word() == REPRODUCED and tight.p < 0.05
    c = tight.comparison
    p_low = stats.t(c.df).sf((c.difference + 0.2) / c.se)
    p_high = stats.t(c.df).cdf((c.difference - 0.2) / c.se)
    assert tight.p == pytest.approx(max(p_low, p_high))
    far = equivalence(compare([3.0, 3.1, 2.9], [0.0] * 3, paired=True), 0.2)
    assert far.word() == CONTRADICTED
    assert equivalence(compare([0.1, -0.5, 0.6], [0.0] * 3, paired=True), 0.2).word() == INCONCLUSIVE
    assert equivalence(compare([0.1], [0.0], paired=True), 0.2).word() == UNTESTED
    with pytest.raises(ValueError, match="margin"):
        equivalence(c, 0.0)


def test_holm_adjustment():
    """Holm's step-down adjustment on a known example, NaN left out; and by simulation, 14 tests without a true
    difference find any adjusted p below 0.05 at most 5% of the time."""
    adjusted = holm([0.01, 0.04, math.nan, 0.03, 0.2])
    assert adjusted[:2] == pytest.approx([0.04, 0.09]) and math.isnan(adjusted[2])
    assert adjusted[3:] == pytest.approx([0.09, 0.2])
    rng = np.random.default_rng(44)
    family = [min(holm(rng.random(14))) < 0.05 for _ in range(DRAWS)]
    assert np.mean(family) <= BOUND


def test_intersection_of_two_claims():
    up = compare([1.0, 1.2, 0.9], [0.0, 0.1, -0.1], paired=True)
    flat = compare([1.0, 2.0, 3.0], [0.5, 2.6, 2.2], paired=True)
    down = compare([0.0, 0.1, -0.1], [1.0, 1.2, 0.9], paired=True)
    assert intersection([up, up], +1) == (REPRODUCED, up)
    assert intersection([up, flat], +1) == (INCONCLUSIVE, flat)
    assert intersection([up, flat, down], +1) == (CONTRADICTED, down)
    assert intersection([up, compare([1.0], [0.0])], +1)[0] == UNTESTED


def test_spread_is_mean_and_sample_deviation():
    s = spread([1.0, 2.0, 3.0])
    assert (s.n, s.mean, s.sd) == (3, 2.0, 1.0)
    assert s.se == pytest.approx(1 / math.sqrt(3))
    assert wording.spread(s.values) == "2.0 ± 1.0 (3 seeds)" and wording.spread([4.0]) == "4.0 (1 seed)"


def test_no_verdict_on_nan_or_nothing():
    with pytest.raises(ValueError, match="non-finite"):
        spread([1.0, float("nan")])
    with pytest.raises(ValueError, match="no values"):
        spread([])
    with pytest.raises(ValueError, match="non-finite"):
        compare([1.0, float("-inf")], [1.0, 2.0])


def test_runs_of_a_parameter():
    assert as_list("a") == ["a"] and as_list(["a", "b"]) == ["a", "b"]
    assert all_runs({"ours": [["a0", "a1"], ["b0", "b1"]], "gpt": ["c0"]}) == ["a0", "a1", "b0", "b1", "c0"]


def test_trend_of_one_intercept_is_scipys_linregress():
    x = [1.0, 2.0, 3.0, 4.0, 5.0, 1.0, 3.0]
    y = [4.1, 3.2, 2.2, 0.7, 0.1, 3.7, 1.9]
    t, want = trend(x, y), stats.linregress(x, y)
    half = stats.t(len(x) - 2).ppf(0.975) * want.stderr
    assert (t.slope, t.p) == pytest.approx((want.slope, want.pvalue), rel=1e-12)
    assert (t.low, t.high) == pytest.approx((want.slope - half, want.slope + half), rel=1e-12)
    assert (t.test, t.df, t.n, t.groups) == (SLOPE, 5, 7, 1) and t.significant


def test_trend_with_an_intercept_per_seed():
    """Against a least-squares fit with a column per seed (numpy), and with two settings against the paired
    t-test: the slope is the mean seed-matched difference over the settings' distance, with the same p."""
    rng = np.random.default_rng(40)
    x = np.tile([1.0, 3.0, 5.0], 3)
    seeds = np.repeat([0, 1, 2], 3)
    y = 10.0 * seeds - 0.3 * x + rng.normal(0, 0.2, 9)  # seeds far apart: one intercept would hide the slope
    t = trend(x, y, seeds)
    design = np.column_stack([x, seeds == 0, seeds == 1, seeds == 2]).astype(float)
    coef, rss, *_ = np.linalg.lstsq(design, y, rcond=None)
    se = math.sqrt(rss[0] / (9 - 4) * np.linalg.inv(design.T @ design)[0, 0])
    assert (t.slope, t.df, t.test) == (pytest.approx(coef[0], rel=1e-10), 5, SEED_SLOPE)
    assert t.p == pytest.approx(2 * stats.t(5).sf(abs(coef[0]) / se), rel=1e-8)
    assert t.significant and not trend(x, y).significant  # the seeds' offsets swamp the pooled fit
    a, b = [4.0, 4.5, 3.9], [3.1, 3.9, 3.2]
    two = trend([2.0] * 3 + [6.0] * 3, a + b, [0, 1, 2] * 2)
    paired = compare(b, a, paired=True)
    assert two.slope == pytest.approx(paired.difference / 4) and two.p == pytest.approx(paired.p, rel=1e-10)
    assert (two.low, two.high) == pytest.approx((paired.low / 4, paired.high / 4), rel=1e-10)


def test_trend_known_slope_flat_trend_and_untested():
    exact = trend([1, 2, 3] * 2, [5.0, 3.0, 1.0, 6.0, 4.0, 2.0], [0, 0, 0, 1, 1, 1])  # slope -2, no residual
    assert (exact.slope, exact.p, exact.test) == (pytest.approx(-2.0), 0.5, EXACT_SIGNS)  # two seeds: 2 / 2^2
    flat = trend([1, 2, 3] * 3, [5.0, 5.3, 4.9, 4.2, 3.8, 4.1, 6.0, 6.2, 5.9], [0] * 3 + [1] * 3 + [2] * 3)
    assert flat.verdict == INCONCLUSIVE and flat.low < 0 < flat.high
    assert wording.trend(flat, 2, " per step").endswith(f"{SEED_SLOPE} (9 values, 3 seeds): inconclusive")
    one = trend([1.0, 2.0], [5.0, 4.0])  # two settings of one seed: nothing left to judge the slope by
    assert one.verdict == f"{UNTESTED}: 2 values in 1 seed"
    assert wording.trend(one) == "-1.0: untested: 2 values in 1 seed"
    with pytest.raises(ValueError, match="two settings"):
        trend([1.0, 1.0], [5.0, 4.0])
    with pytest.raises(ValueError, match="non-finite"):
        trend([1.0, 2.0, 3.0], [5.0, math.nan, 4.0])


def test_trend_no_more_than_five_percent_false_results():
    """No trend, seeds sharing half their variance across settings: both fits call at most 5% results; the
    per-seed intercepts find a clear slope more often than one intercept does."""
    rng = np.random.default_rng(41)
    x = np.tile(np.log2([2.0, 8.0, 32.0]), 3)
    seeds = np.repeat([0, 1, 2], 3)

    def draws(slope):
        shared = math.sqrt(0.5) * rng.standard_normal((DRAWS, 3))[:, seeds]
        return slope * x + shared + math.sqrt(0.5) * rng.standard_normal((DRAWS, 9))

    null = draws(0.0)
    assert np.mean([trend(x, y, seeds).significant for y in null]) <= BOUND
    assert np.mean([trend(x, y).significant for y in null]) <= BOUND
    clear = draws(-0.4)
    assert np.mean([trend(x, y, seeds).significant for y in clear]) > np.mean([trend(x, y).significant for y in clear])


def test_holm_and_mcnemar_are_statsmodels():
    """Holm's adjustment against ``multipletests`` on the tested p-values alone; McNemar's p against statsmodels'
    exact test of the full 2 x 2 table of hits (pandas' cross-tabulation)."""
    p = [0.01, 0.04, math.nan, 0.03, 0.2, 0.004, 0.03]
    tested = [q for q in p if not math.isnan(q)]
    want = iter(multipletests(tested, method="holm")[1])
    assert holm(p) == pytest.approx([math.nan if math.isnan(q) else next(want) for q in p], rel=1e-12, nan_ok=True)
    rng = np.random.default_rng(45)
    for pairs, share in ((20, 0.5), (60, 0.7), (200, 0.55)):
        a, b = (rng.random(pairs) < share).astype(int), (rng.random(pairs) < 0.5).astype(int)
        table = pd.crosstab(a, b).reindex(index=[0, 1], columns=[0, 1], fill_value=0).to_numpy()
        assert mcnemar(a, b).p == pytest.approx(statsmodels_mcnemar(table, exact=True).pvalue, rel=1e-12)


def test_trend_is_a_formula_fit():
    """The slope, its p and interval against statsmodels' formula fit of ``y ~ x + C(seed)`` (one intercept and a
    shift per seed), and ``y ~ x`` without seeds."""
    rng = np.random.default_rng(46)
    x = np.tile([1.0, 2.0, 4.0, 8.0], 3)
    data = pd.DataFrame({"x": x, "seed": np.repeat([0, 1, 2], 4)})
    data["y"] = 0.2 * x + data.seed + rng.normal(0, 0.3, len(x))
    for formula, t in (("y ~ x + C(seed)", trend(data.x, data.y, data.seed)), ("y ~ x", trend(data.x, data.y))):
        fit = smf.ols(formula, data).fit()
        assert (t.slope, t.p, t.se, t.df) == pytest.approx(
            (fit.params["x"], fit.pvalues["x"], fit.bse["x"], fit.df_resid), rel=1e-9)
        assert (t.low, t.high) == pytest.approx(tuple(fit.conf_int(0.05).loc["x"]), rel=1e-9)


def test_tost_and_power_are_the_libraries():
    """The TOST p against ``ttost_paired`` and ``ttost_ind`` (Welch's variances) on the values themselves; the
    paired design's smallest detectable difference is where statsmodels' power of the t-test is 80%."""
    a, b = [0.31, 0.12, 0.25, 0.4, 0.18], [0.22, 0.15, 0.2, 0.33, 0.21]
    paired, welch = compare(a, b, paired=True), compare(a, b)
    for margin in (0.05, 0.2):
        assert equivalence(paired, margin).p == pytest.approx(ttost_paired(np.array(a), np.array(b), -margin,
                                                                           margin)[0], rel=1e-12)
        assert equivalence(welch, margin).p == pytest.approx(ttost_ind(a, b, -margin, margin, usevar="unequal")[0],
                                                             rel=1e-12)
    for n in (3, 5, 8):
        effect = detectable_difference(1.0, n - 1) / math.sqrt(n)  # in standard deviations of one difference
        assert TTestPower().power(effect_size=effect, nobs=n, alpha=0.05) == pytest.approx(0.8, abs=1e-9)
