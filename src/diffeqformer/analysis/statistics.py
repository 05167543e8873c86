"""Verdicts that say what the evidence can support: a test of the paper's claim over seeds ends in one of four words.

A *seed* of a run is the same configuration trained with another ``trainer.seed``: another initialisation, another
order of the training sequences and other dropout masks. The workflow trains a comparison's runs with several seeds
(``workflow.presets.seeded``: seeds 0..n-1 of each setting, named ``<name>``, ``<name>-seed1``, ...); the analyses take a run
or a list of seed runs wherever they took a run.

The rule (``RULE``), in code once (``compare``, ``mcnemar``, ``trend``, ``equivalence``, ``Judged.word``):

- Seed k of two settings shares its data order, so where the caller says the seeds are matched
  (``compare(a, b, paired=True)``) the test is a paired t-test on the n seed-matched differences
  :math:`d_k = a_k - b_k` (n - 1 degrees of freedom): what the seeds share cancels in :math:`d_k`, which makes the
  test stronger than one on the two means. One number per seed tested against 0 (a slope per seed) is the same test,
  named the *one-sample t-test* (``one_sample``).
- Otherwise Welch's t-test, with the Welch-Satterthwaite degrees of freedom.
- Per-item hits of two methods on one model's items: the exact McNemar test, a binomial test of the discordant items
  (one method right, the other wrong) against one half (``mcnemar``; an item seen by several models counts once).
- A trend over more than two settings: the slope of a least-squares line through every seed's value (``trend``),
  with an intercept per seed where seed k of every setting shares its data order.
- Where the values have no spread at all (every paired difference equal, or every value of a side equal), a t
  statistic is d/0 and says nothing: the test is then exact, on signs or labels alone (``EXACT_SIGNS``,
  ``EXACT_LABELS``): three equal differences give p = 2 / 2^3 = 0.25, never p = 0.

A claim names the direction it expects (the sign of the difference) before any number is seen (``claims.CLAIMS``),
and its test ends in one of four words (``Judged.word``):

- *reproduced*: significant (two-sided p < 0.05) in the paper's direction;
- *contradicted*: significant against it;
- *inconclusive*: not significant; it is reported with its 95% interval and the smallest difference this design
  detects 80% of the time (``Judged.detectable``), which says how large an effect the test could have missed;
- *untested*: fewer than two seeds (or pairs) on a side, nothing to judge a difference by; for a claim also when
  every difference is exactly 0 (no run overfit, every model scored 0: the measure does not move at this scale).

A claim that two models are *comparable* is tested for equivalence (``equivalence``: two one-sided tests, TOST, with a
stated margin): reproduced when the difference lies within the margin (both one-sided tests reject at 5%),
contradicted when its 95% interval lies wholly outside the margin, inconclusive otherwise.

Several claims tested at 5% each find some significant differences by chance: the verdicts page adjusts the
headline claims' primary tests together by Holm's method (``holm``); every other comparison of the book is exploratory.

Every number comes from a library, but Holm's adjustment (``holm`` says why): the t-tests and the power from
``scipy.stats`` (``ttest_rel``, ``ttest_ind(equal_var=False)``, the noncentral t), the rest from statsmodels
(``mcnemar``, ``proportion_confint``, ``OLS``, ``ttost_paired``, ``ttost_ind``). Why not "twice the standard error",
the rule this replaced: with 2-3 seeds a side Welch's t has 1-4 degrees of freedom, whose two-sided 5% critical values
(12.7 at 1, 4.30, 3.18, 2.78 at 4) are all far above 2, so that rule called many more than 5% of comparisons without a
true difference results (``tests/test_statistics.py`` simulates it).
"""

from __future__ import annotations

import functools
import math
import statistics
from dataclasses import dataclass, field
from functools import cached_property
from typing import Callable, Iterable, Sequence

import numpy as np
from scipy import stats
from statsmodels.regression.linear_model import OLS
from statsmodels.stats import contingency_tables, proportion, weightstats

LEVEL = 0.05
"""Significance level of every test (two-sided)."""
POWER = 0.8
"""The probability with which ``Judged.detectable`` is detected."""

RULE = ("a difference is significant when a two-sided test rejects 'no difference' at the 5% level (p < 0.05; its "
        "95% confidence interval then excludes zero): a paired t-test on the seed-matched differences where seed k "
        "of both sides shares its data order, Welch's t-test otherwise, the exact McNemar test for per-prompt hits, an "
        "exact test on signs or labels where the values have no spread; a claim is reproduced when its test is "
        "significant in the paper's direction, contradicted when significant against it, inconclusive otherwise "
        "(with the interval and the smallest difference the design detects 80% of the time), and untested with fewer "
        "than two seeds (or pairs), or when every difference is exactly 0 (the measure does not move at this scale)")
"""The rule, in words, for captions and prose."""

REPRODUCED, CONTRADICTED, INCONCLUSIVE, UNTESTED = "reproduced", "contradicted", "inconclusive", "untested"
"""The four verdicts on a claim (``Judged.word``)."""
WORDS = (REPRODUCED, CONTRADICTED, INCONCLUSIVE, UNTESTED)
SIGNIFICANT = "significant"
"""The verdict of a comparison that is no claim's (``Judged.verdict``): significant, inconclusive or untested."""

PAIRED, WELCH, MCNEMAR = "paired t-test", "Welch's t-test", "exact McNemar test"
"""The tests of ``RULE``, as ``Comparison.test`` names them."""
ONE_SAMPLE = "one-sample t-test"
"""``compare(values, zeros, paired=True)`` under its own name (``one_sample``)."""
EXACT_SIGNS, EXACT_LABELS = "exact sign-flip test (no spread)", "exact permutation test (no spread)"
"""The exact tests where the values have no spread: of the signs of the paired differences (or per-seed slopes), of
the labels of two unpaired sides."""
SEED_SLOPE, SLOPE = "t-test of the slope with an intercept per seed", "t-test of the slope"
"""The tests of a ``Trend``: seeds matched across the settings, or not."""
TOST = "two one-sided tests (TOST)"


def as_list(runs) -> list:
    """A run or a list of seed runs as a list."""
    return list(runs) if isinstance(runs, (list, tuple)) else [runs]


def all_runs(value) -> list:
    """Every run named in a notebook parameter: a run, or dicts and lists of them (seed lists included), in order."""
    if isinstance(value, dict):
        return [r for v in value.values() for r in all_runs(v)]
    if isinstance(value, (list, tuple)):
        return [r for v in value for r in all_runs(v)]
    return [value]


@dataclass(frozen=True)
class Spread:
    """Values of one quantity over seeds."""

    values: tuple[float, ...]

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.values)

    @property
    def sd(self) -> float:
        """Sample standard deviation (NaN with one seed)."""
        return statistics.stdev(self.values) if self.n > 1 else math.nan

    @property
    def se(self) -> float:
        """Standard error of the mean (NaN with one seed)."""
        return self.sd / math.sqrt(self.n) if self.n > 1 else math.nan

    def text(self, digits: int = 1) -> str:
        """``464.2 ± 6.1 (3 seeds)``, or ``464.2 (1 seed)``."""
        if self.n == 1:
            return f"{self.mean:.{digits}f} (1 seed)"
        return f"{self.mean:.{digits}f} ± {self.sd:.{digits}f} ({self.n} seeds)"


def spread(values: Iterable[float]) -> Spread:
    """``Spread`` of finite values; raises on an empty or non-finite input (a verdict must not rest on NaN)."""
    values = tuple(float(v) for v in values)
    if not values:
        raise ValueError("no values: a spread needs at least one seed")
    bad = [v for v in values if not math.isfinite(v)]
    if bad:
        raise ValueError(f"non-finite values {bad}: a verdict cannot rest on them")
    return Spread(values)


@functools.cache
def _noncentrality(df: float) -> float:
    """The noncentrality at which a two-sided t-test at ``LEVEL`` with ``df`` degrees of freedom rejects with
    probability ``POWER`` (the normal test's where df is infinite). Not statsmodels' ``TTestPower``: it solves to
    1e-5 only, and at some fractional (Welch) df its NaN far tail leads it to a wrong root."""
    from scipy.optimize import brentq

    dist = stats.norm if math.isinf(df) else None
    crit = float((dist or stats.t(df)).ppf(1 - LEVEL / 2))

    def power(ncp: float) -> float:
        if dist is not None:
            return float(stats.norm.sf(crit - ncp) + stats.norm.cdf(-crit - ncp))
        # the far tail (rejecting on the wrong side) is below 1e-3 here, and scipy's nct gives NaN for it at times
        wrong = float(stats.nct.cdf(-crit, df, ncp))
        return float(stats.nct.sf(crit, df, ncp)) + (wrong if math.isfinite(wrong) else 0.0)

    high = 4.0
    while power(high) < POWER:
        high *= 2
    return float(brentq(lambda ncp: power(ncp) - POWER, 0.0, high))


def detectable_difference(se: float, df: float) -> float:
    r"""The smallest true difference that a two-sided t-test at ``LEVEL`` detects with probability ``POWER``, for a
    design whose estimate has standard error ``se`` and ``df`` degrees of freedom: :math:`\delta = \lambda\,
    \mathrm{se}`, with :math:`\lambda` the noncentrality of the noncentral t distribution at which the test rejects
    with that probability (with 3 paired seeds, df 2, :math:`\lambda` = 5.5; with 5, 3.6)."""
    if not (math.isfinite(se) and df > 0):
        return math.nan
    return se * _noncentrality(float(df))


class Judged:
    """What ``Comparison``, ``Trend`` and ``Equivalence`` share: the ``effect`` tested, a p-value (NaN when there was
    too little to test), the standard error and degrees of freedom behind it, and the words it gives by ``RULE``."""

    p: float
    se: float
    df: float
    test: str

    @property
    def effect(self) -> float:
        """The number the test is about (a difference of means, a slope)."""
        raise NotImplementedError

    @property
    def untested(self) -> bool:
        """Too few seeds, pairs or values to test."""
        return math.isnan(self.p)

    @property
    def significant(self) -> bool:
        """p < ``LEVEL``."""
        return not self.untested and self.p < LEVEL

    @property
    def exact(self) -> bool:
        """Whether the test was the exact one of values without spread (``EXACT_SIGNS``, ``EXACT_LABELS``)."""
        return self.test in (EXACT_SIGNS, EXACT_LABELS)

    @property
    def nothing_moved(self) -> bool:
        """Whether every unit differs by exactly 0, so that the test has nothing to count: an exact test of values
        without spread whose value is 0, or the exact McNemar test with no discordant pair (its interval the point
        0). A claim judged by such a test is untested (``claims.judge``), not inconclusive with a detectable 0."""
        if self.untested or self.effect != 0:
            return False
        return self.exact or (self.test == MCNEMAR and getattr(self, "low", math.nan) == 0 == getattr(self, "high",
                                                                                                        math.nan))

    @property
    def verdict(self) -> str:
        """A comparison's word where it is no claim's: ``significant``, ``inconclusive`` or ``untested: ...`` saying
        with how few (``RULE``)."""
        if self.untested:
            return f"{UNTESTED}: {self._untested_words()}"
        return SIGNIFICANT if self.significant else INCONCLUSIVE

    def word(self, direction: int) -> str:
        """The verdict on a claim that expects the effect's sign ``direction`` (+1 or -1): reproduced, contradicted,
        inconclusive or untested (``RULE``)."""
        if direction not in (1, -1):
            raise ValueError(f"a claim's direction is +1 or -1, got {direction!r}")
        if self.untested:
            return UNTESTED
        if not self.significant:
            return INCONCLUSIVE
        return REPRODUCED if math.copysign(1, self.effect) == direction else CONTRADICTED

    @property
    def detectable(self) -> float:
        """The smallest true effect this design detects with probability ``POWER`` by the same test at ``LEVEL``
        (``detectable_difference``), from its own standard error. Without spread (an exact test), 0 where the exact
        test can reach p < ``LEVEL`` with these seeds (any constant difference is detected), else infinity; NaN when
        untested."""
        if self.untested:
            return math.nan
        if self.exact:
            return 0.0 if self._least_exact_p() < LEVEL else math.inf
        return detectable_difference(self.se, self.df)

    def _least_exact_p(self) -> float:
        raise NotImplementedError

    def _untested_words(self) -> str:
        raise NotImplementedError


def p_text(p: float) -> str:
    """``p = 0.031``, or ``p < 0.001``."""
    return f"p = {p:.2g}" if p >= 1e-3 else "p < 0.001"


@dataclass(frozen=True)
class Comparison(Judged):
    """``a`` against ``b`` (e.g. DiffEqFormer's final log-perplexities over seeds against GPT-2's), judged by
    ``RULE``.

    ``difference`` is what the test is about, ``p`` its two-sided p-value and ``low``, ``high`` its 95% confidence
    interval (NaN for an exact test of values without spread); ``test`` names the test (``PAIRED``, ``ONE_SAMPLE``,
    ``WELCH``, ``MCNEMAR``, ``EXACT_SIGNS``, ``EXACT_LABELS``), ``n`` the seeds (the fewer of the two sides') or pairs
    it rests on, counted in ``unit``; ``se`` and ``df`` the standard error of ``difference`` and its degrees of
    freedom (``Judged.detectable``). Untested comparisons (``n`` < 2) have NaN interval and p."""

    a: Spread
    b: Spread
    test: str
    difference: float
    p: float
    n: int
    unit: str = "seed"
    se: float = math.nan
    df: float = math.nan
    bounds: Callable[[], tuple[float, float]] = field(default=lambda: (math.nan, math.nan), repr=False,
                                                      compare=False)
    """The interval, computed when first asked for (an exact binomial interval is a root search, and a simulation
    of the rule needs only ``p``)."""

    @property
    def effect(self) -> float:
        return self.difference

    @cached_property
    def _interval(self) -> tuple[float, float]:
        low, high = self.bounds()
        return float(low), float(high)

    @property
    def low(self) -> float:
        """Lower end of the 95% confidence interval of ``difference``."""
        return self._interval[0]

    @property
    def high(self) -> float:
        """Upper end of the 95% confidence interval of ``difference``."""
        return self._interval[1]

    @property
    def relative(self) -> float:
        """mean(a) / mean(b) - 1 (NaN where mean(b) is 0)."""
        return self.a.mean / self.b.mean - 1.0 if self.b.mean != 0 else math.nan

    def _untested_words(self) -> str:
        return f"{self.n} {self.unit}{'' if self.n == 1 else 's'}"

    def _least_exact_p(self) -> float:
        if self.test == EXACT_SIGNS:
            return min(1.0, 2.0 ** (1 - self.n))
        na, nb = self.a.n, self.b.n
        return min(1.0, (2 if na == nb else 1) / math.comb(na + nb, na))

    def interval(self, digits: int = 1, unit: str = "") -> str:
        """``95% CI [-60.1, -36.3], p = 0.003, paired t-test`` (``p = 0.25, exact sign-flip test (no spread)``
        without spread; empty when untested)."""
        if self.untested:
            return ""
        if math.isnan(self.low):
            return f"{p_text(self.p)}, {self.test}"
        return f"95% CI [{self.low:+.{digits}f}{unit}, {self.high:+.{digits}f}{unit}], {p_text(self.p)}, {self.test}"

    def text(self, digits: int = 1, unit: str = "") -> str:
        """``-48.2 (-9.2%), 95% CI [-60.1, -36.3], p = 0.003, paired t-test: significant``; untested:
        ``+0.4 (+0.1%): untested: 1 seed``."""
        relative = "" if math.isnan(self.relative) else f" ({100 * self.relative:+.1f}%)"
        interval = "" if self.untested else f", {self.interval(digits, unit)}"
        return f"{self.difference:+.{digits}f}{unit}{relative}{interval}: {self.verdict}"


def _exact_no_spread(sa: Spread, sb: Spread, paired: bool) -> tuple[float, str]:
    """p of the exact test of values without spread (``RULE``): of the signs of n equal paired differences (only
    the all-positive and all-negative sign patterns are as extreme, p = 2 / 2^n), or of the labels of two sides each
    of one value (only the observed split, and its mirror where the sides are as large, are as extreme)."""
    difference = sa.mean - sb.mean
    if difference == 0:
        return 1.0, EXACT_SIGNS if paired else EXACT_LABELS
    if paired:
        return min(1.0, 2.0 ** (1 - sa.n)), EXACT_SIGNS
    return min(1.0, (2 if sa.n == sb.n else 1) / math.comb(sa.n + sb.n, sa.n)), EXACT_LABELS


def compare(a: Sequence[float], b: Sequence[float], *, paired: bool = False) -> Comparison:
    """``Comparison`` of the seed values ``a`` against ``b``: mean(a) - mean(b), by the paired t-test where
    ``paired`` (seed k of ``a`` and of ``b`` share the data order: equal numbers of seeds, in the same order),
    otherwise by Welch's t-test; by the exact test where the values have no spread (``RULE``)."""
    sa, sb = spread(a), spread(b)
    if paired:
        if sa.n != sb.n:
            raise ValueError(f"a paired comparison needs the same seeds on both sides, got {sa.n} and {sb.n}")
        n, test = sa.n, PAIRED
        differences = np.subtract(sa.values, sb.values)
        degenerate = n >= 2 and len(set(differences.tolist())) == 1
    else:
        n, test = min(sa.n, sb.n), WELCH
        degenerate = n >= 2 and len(set(sa.values)) == 1 and len(set(sb.values)) == 1
    difference = sa.mean - sb.mean
    if n < 2:
        return Comparison(sa, sb, test, difference, math.nan, n)
    if degenerate:
        # no spread at all: scipy's t is 0/0 or d/0 (and warns); only the signs or labels hold information
        p, test = _exact_no_spread(sa, sb, paired)
        return Comparison(sa, sb, test, difference, p, n, se=0.0, df=float(n - 1))
    if paired:
        result = stats.ttest_rel(sa.values, sb.values)
        se, df = float(np.std(differences, ddof=1) / math.sqrt(n)), float(n - 1)
    else:
        result = stats.ttest_ind(sa.values, sb.values, equal_var=False)
        va, vb = np.var(sa.values, ddof=1) / sa.n, np.var(sb.values, ddof=1) / sb.n
        se, df = float(math.sqrt(va + vb)), float(result.df)
    return Comparison(sa, sb, test, difference, float(result.pvalue), n, se=se, df=df,
                      bounds=lambda: tuple(result.confidence_interval(1 - LEVEL)))


def one_sample(values: Sequence[float]) -> Comparison:
    """The one-sample t-test of per-seed values against 0 (e.g. each seed's slope of its spectral radius against
    depth: F2): ``compare(values, zeros, paired=True)`` under its own name, ``ONE_SAMPLE`` (or the exact sign-flip
    test where every value is the same)."""
    c = compare(values, [0.0] * len(values), paired=True)
    return Comparison(c.a, c.b, ONE_SAMPLE if c.test == PAIRED else c.test, c.difference, c.p, c.n, c.unit, c.se,
                      c.df, c.bounds)


def mcnemar(a: Sequence, b: Sequence) -> Comparison:
    r"""Exact McNemar test of paired binary outcomes (e.g. whether attribution methods a and b rank a prompt's true
    token first): ``a`` and ``b`` are [pairs] of 0/1, or [pairs, replicates] where each pair is seen several times
    (the same prompt by each seed's model).

    One outcome per pair: of the :math:`m` discordant pairs (one side 1, the other 0), :math:`k` favour a; under no
    difference :math:`k \sim \mathrm{Binomial}(m, 1/2)`, tested two-sided (statsmodels' exact ``mcnemar``). The
    difference is :math:`(k - (m - k)) / N` over the :math:`N` pairs, i.e. mean(a) - mean(b), and its interval is
    the exact (Clopper-Pearson) interval of :math:`k/m` mapped the same way (given m). With replicates, a pair
    favours a when a's outcomes summed over the replicates exceed b's: the replicates of one pair are not
    independent (a prompt that suits one method suits it in every seed), so each pair counts once; the difference
    is then the share of pairs that favour a less the share that favour b (with one replicate, mean(a) - mean(b)).
    Its standard error for ``Judged.detectable`` is the normal approximation :math:`\sqrt m / N`. Fewer than two
    pairs: untested."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.shape != b.shape or a.ndim not in (1, 2):
        raise ValueError(f"paired outcomes need the same shape, [pairs] or [pairs, replicates]: {a.shape}, {b.shape}")
    if not np.all(np.isin(a, (0, 1)) & np.isin(b, (0, 1))):
        raise ValueError("McNemar's test takes binary outcomes (0 or 1)")
    per_pair = (a.mean(axis=1), b.mean(axis=1)) if a.ndim == 2 else (a, b)
    sa, sb = spread(per_pair[0]), spread(per_pair[1])
    n = len(sa.values)
    margin = a.sum(axis=-1) - b.sum(axis=-1) if a.ndim == 2 else a - b
    k, m = int(np.sum(margin > 0)), int(np.sum(margin != 0))
    difference = (2 * k - m) / n
    if n < 2:
        return Comparison(sa, sb, MCNEMAR, difference, math.nan, n, "pair")
    se = math.sqrt(max(m, 1)) / n
    if m == 0:
        return Comparison(sa, sb, MCNEMAR, 0.0, 1.0, n, "pair", se, math.inf, bounds=lambda: (0.0, 0.0))
    p = float(contingency_tables.mcnemar([[0, k], [m - k, 0]], exact=True).pvalue)
    return Comparison(sa, sb, MCNEMAR, difference, p, n, "pair", se, math.inf, bounds=lambda: tuple(
        (2 * q - 1) * m / n for q in proportion.proportion_confint(k, m, LEVEL, method="beta")))


@dataclass(frozen=True)
class Trend(Judged):
    """The slope of a quantity against a setting (e.g. final perplexity per doubling of d_t), judged by ``RULE``:
    ``slope`` with its 95% confidence interval ``low``, ``high`` and two-sided p-value ``p`` of the t-test of
    "slope 0" with ``df`` degrees of freedom and standard error ``se``, over ``n`` values in ``groups`` seeds
    (``test``: ``SEED_SLOPE``, ``SLOPE``, or ``EXACT_SIGNS`` where every point lies on the line). No residual degree
    of freedom (e.g. two settings of one seed): untested, NaN interval and p."""

    slope: float
    low: float
    high: float
    p: float
    df: int
    n: int
    groups: int
    test: str
    se: float = math.nan

    @property
    def effect(self) -> float:
        return self.slope

    def _untested_words(self) -> str:
        return f"{self.n} value{'' if self.n == 1 else 's'} in {self.groups} seed{'' if self.groups == 1 else 's'}"

    def _least_exact_p(self) -> float:
        return min(1.0, 2.0 ** (1 - self.groups))

    def text(self, digits: int = 1, unit: str = "") -> str:
        """``-4.1 per doubling, 95% CI [-6.0, -2.2], p = 0.002, t-test of the slope with an intercept per seed (9
        values, 3 seeds): significant`` with ``unit`` = `` per doubling``."""
        if self.untested:
            return f"{self.slope:+.{digits}f}{unit}: {self.verdict}"
        interval = "" if math.isnan(self.low) else f", 95% CI [{self.low:+.{digits}f}, {self.high:+.{digits}f}]"
        return (f"{self.slope:+.{digits}f}{unit}{interval}, {p_text(self.p)}, {self.test} ({self.n} values, "
                f"{self.groups} seed{'' if self.groups == 1 else 's'}): {self.verdict}")


def trend(x: Sequence[float], y: Sequence[float], seeds: Sequence | None = None) -> Trend:
    r"""``Trend`` of the values ``y`` against ``x`` (one pair per seed and setting): the least-squares slope
    :math:`\hat\beta` of :math:`y = \alpha_s + \beta x + \varepsilon` and the t-test of :math:`\beta = 0`.

    ``seeds`` (the seed of each value) gives each seed its own intercept :math:`\alpha_s`: seed k of every setting
    shares its data order, and what it shares then cancels from the slope, as it does from a paired difference
    (with two settings the test is the paired t-test, the slope the mean difference over the settings' distance).
    Without ``seeds``, one intercept: ``scipy.stats.linregress``'s test. ``OLS`` fits x and a column per seed, with
    values less seeds less one degrees of freedom. Where every value lies on the line (residuals within 1e-12 of
    the values: rounding) the t statistic is d/0: the test is then the exact sign-flip test of the seeds' slopes
    (all equal: p = 2 / 2^seeds; p = 1 where each seed's values are equal), without an interval."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"a trend needs one x per value, got shapes {x.shape} and {y.shape}")
    spread(y)  # finite values only
    labels = np.zeros(len(x), dtype=int) if seeds is None else np.unique(np.asarray(seeds), return_inverse=True)[1]
    if len(labels) != len(x):
        raise ValueError(f"one seed per value: {len(labels)} seeds for {len(x)} values")
    groups = int(labels.max()) + 1
    # the slope, then one intercept per seed; centred, so that the fit's rounding scales with the values' spread
    design = np.column_stack([x - x.mean(), np.eye(groups)[labels]])
    if np.linalg.matrix_rank(design) <= groups:
        raise ValueError("a trend needs at least two settings of x within a seed")
    fit = OLS(y - y.mean(), design).fit()
    slope, df, test = float(fit.params[0]), int(fit.df_resid), SLOPE if seeds is None else SEED_SLOPE
    if df < 1:
        return Trend(slope, math.nan, math.nan, math.nan, df, len(x), groups, test)
    if fit.ssr <= 1e-24 * float(y @ y):  # every point on the line: the t statistic would be d/0
        flat = len(set(zip(labels.tolist(), y.tolist()))) == groups
        return Trend(0.0 if flat else slope, math.nan, math.nan, 1.0 if flat else min(1.0, 2.0 ** (1 - groups)), df,
                     len(x), groups, EXACT_SIGNS, 0.0)
    low, high = fit.conf_int(LEVEL)[0]
    return Trend(slope, float(low), float(high), float(fit.pvalues[0]), df, len(x), groups, test, float(fit.bse[0]))


@dataclass(frozen=True)
class Equivalence(Judged):
    """An equivalence test of a ``Comparison`` with the margin ``margin`` (in the comparison's units): the two
    one-sided tests (TOST) of "difference <= -margin" and "difference >= +margin", each at ``LEVEL``; ``p`` is the
    larger of their p-values, below ``LEVEL`` exactly when the 90% interval of the difference lies within
    (-margin, +margin). ``word``: reproduced (equivalent), contradicted (the 95% interval lies wholly outside the
    margin), inconclusive, untested."""

    comparison: Comparison
    margin: float
    p: float

    @property
    def effect(self) -> float:
        return self.comparison.difference

    @property
    def se(self) -> float:
        return self.comparison.se

    @property
    def df(self) -> float:
        return self.comparison.df

    @property
    def test(self) -> str:
        return f"{TOST} on the {self.comparison.test}"

    @property
    def untested(self) -> bool:
        return self.comparison.untested

    @property
    def exact(self) -> bool:
        return self.comparison.exact

    def word(self, direction: int = 0) -> str:
        """Reproduced (equivalent within the margin), contradicted (different by more than the margin, its 95%
        interval wholly outside it), inconclusive or untested; ``direction`` is not used (an equivalence claim has
        none)."""
        c = self.comparison
        if c.untested:
            return UNTESTED
        if self.p < LEVEL:
            return REPRODUCED
        if c.significant and not math.isnan(c.low) and (c.low > self.margin or c.high < -self.margin):
            return CONTRADICTED
        if c.exact and c.significant and abs(c.difference) > self.margin:
            return CONTRADICTED
        return INCONCLUSIVE

    @property
    def verdict(self) -> str:
        word = self.word()
        return word if word != UNTESTED else self.comparison.verdict

    @property
    def detectable(self) -> float:
        r"""The smallest margin within which this design shows equivalence with probability ``POWER`` when the true
        difference is 0: :math:`\mathrm{se}\,(t_{1-\alpha,\,df} + t_{1-(1-\mathrm{power})/2,\,df})`, the usual
        approximation; NaN when untested, 0 or infinity without spread as ``Judged.detectable``."""
        c = self.comparison
        if c.untested:
            return math.nan
        if c.exact:
            return 0.0 if 2.0 ** (-c.n) < LEVEL else math.inf
        dist = stats.t(c.df) if math.isfinite(c.df) else stats.norm
        return c.se * float(dist.ppf(1 - LEVEL) + dist.ppf(1 - (1 - POWER) / 2))

    def _untested_words(self) -> str:
        return self.comparison._untested_words()


def equivalence(comparison: Comparison, margin: float) -> Equivalence:
    """``Equivalence`` of ``comparison`` within +-``margin`` (> 0): the TOST of its t-test (``ttost_paired``, or
    ``ttost_ind`` with Welch's variances), of McNemar's difference the normal TOST of its standard error; where the
    values have no spread, the exact sign-flip test of each side (n equal differences within the margin: 1 / 2^n)."""
    if not (math.isfinite(margin) and margin > 0):
        raise ValueError(f"an equivalence margin must be positive, got {margin!r}")
    c = comparison
    if c.untested:
        return Equivalence(c, margin, math.nan)
    if c.exact or c.se == 0:
        p = 2.0 ** (-c.n) if abs(c.difference) < margin else 1.0
        return Equivalence(c, margin, p)
    a, b = np.asarray(c.a.values), np.asarray(c.b.values)
    if c.test in (PAIRED, ONE_SAMPLE):
        p = weightstats.ttost_paired(a, b, -margin, margin)[0]
    elif c.test == WELCH:
        p = weightstats.ttost_ind(a, b, -margin, margin, usevar="unequal")[0]
    else:  # H0: difference <= -margin, H0: difference >= +margin
        p = max(stats.norm.sf((c.difference + margin) / c.se), stats.norm.cdf((c.difference - margin) / c.se))
    return Equivalence(c, margin, float(p))


def holm(p_values: Sequence[float]) -> list[float]:
    r"""Holm's adjustment of p-values tested together (NaN, an untested one, stays NaN and is not counted): sorted
    ascending, the i-th of m becomes :math:`\max_{j \le i} \min(1, (m - j + 1)\,p_{(j)})`. An adjusted p below
    ``LEVEL`` keeps the family's chance of any false "significant" at most ``LEVEL``. Not statsmodels'
    ``multipletests(method="holm")``, the same numbers: it runs a full garbage collection on every call."""
    p = np.array(p_values, dtype=float)
    tested = np.flatnonzero(~np.isnan(p))
    order = tested[np.argsort(p[tested], kind="stable")]
    p[order] = np.minimum(1.0, np.maximum.accumulate(p[order] * np.arange(len(order), 0, -1)))
    return p.tolist()


def intersection(tests: Sequence[Judged], direction: int) -> tuple[str, Judged]:
    """The intersection-union test of a claim that needs every one of ``tests`` in ``direction`` (e.g. F2: both the
    QK and the OV radius grow): reproduced only when every test is significant in that direction (the claim's p is
    the largest of theirs, a test at ``LEVEL`` without correction), contradicted when any is significant against it,
    untested when any is untested, inconclusive otherwise. Returns the word and the test that decides it: the one
    against the claim, else the one with the largest p."""
    words = [t.word(direction) for t in tests]
    if CONTRADICTED in words:
        return CONTRADICTED, tests[words.index(CONTRADICTED)]
    if UNTESTED in words:
        return UNTESTED, tests[words.index(UNTESTED)]
    deciding = max(tests, key=lambda t: t.p)
    return (REPRODUCED if all(w == REPRODUCED for w in words) else INCONCLUSIVE), deciding


def chance_count(tests: int) -> float:
    """How many of ``tests`` comparisons without any true difference come out significant at ``LEVEL``, on
    average: ``LEVEL`` x ``tests``."""
    return LEVEL * tests


def percent(log_ratio: float) -> float:
    """A log ratio as a percent change: 100 (e^x - 1)."""
    return 100.0 * math.expm1(log_ratio) if math.isfinite(log_ratio) else log_ratio

