"""The book's statistics over seeds: the tests of the verdict rule (``report.words.statistics.RULE``) and their
four words (``Judged.word``).

A paired t-test where seed k of both sides shares its data order, Welch's otherwise, the exact McNemar test for paired
hits, the t-test of a slope with an intercept per seed for a trend, exact tests on signs or labels where the values
have no spread, two one-sided tests for equivalence (Holm's adjustment: ``multiplicity``); why, in the method page's
"Judging a difference" (``book/model.md``). Every number comes from scipy or statsmodels.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace
from functools import cached_property
from statistics import fmean, stdev
from typing import Callable, Iterable, Sequence

import numpy as np
from scipy import stats
from statsmodels.regression.linear_model import OLS
from statsmodels.stats import contingency_tables, proportion, weightstats

LEVEL = 0.05
"""Significance level of every test (two-sided)."""
POWER = 0.8
"""The probability with which ``Judged.detectable`` is detected."""

REPRODUCED, CONTRADICTED, INCONCLUSIVE, UNTESTED = "reproduced", "contradicted", "inconclusive", "untested"
"""The four verdicts on a claim (``Judged.word``)."""
WORDS = (REPRODUCED, CONTRADICTED, INCONCLUSIVE, UNTESTED)
SIGNIFICANT = "significant"
"""The verdict of a comparison that is no claim's (``Judged.verdict``): significant, inconclusive or untested."""

PAIRED, WELCH, MCNEMAR = "paired t-test", "Welch's t-test", "exact McNemar test"
"""The tests of the rule, as ``Comparison.test`` names them."""
ONE_SAMPLE = "one-sample t-test"
"""``one_sample``'s test."""
EXACT_SIGNS, EXACT_LABELS = "exact sign-flip test (no spread)", "exact permutation test (no spread)"
"""The exact tests of values without spread: of the signs of paired differences (or slopes), of unpaired labels."""
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
        return fmean(self.values)

    @property
    def sd(self) -> float:
        """Sample standard deviation (NaN with one seed)."""
        return stdev(self.values) if self.n > 1 else math.nan

    @property
    def se(self) -> float:
        """Standard error of the mean (NaN with one seed)."""
        return self.sd / math.sqrt(self.n) if self.n > 1 else math.nan


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
    """The noncentrality at which a two-sided t-test at ``LEVEL`` (the normal test at infinite ``df``) rejects with
    probability ``POWER``. Not statsmodels' ``TTestPower``: it solves to 1e-5 only, and at some fractional (Welch) df
    its NaN far tail leads it to a wrong root."""
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
    r"""The smallest true difference a two-sided t-test at ``LEVEL`` detects with probability ``POWER``:
    :math:`\lambda\,\mathrm{se}`, :math:`\lambda` the noncentrality at which the noncentral t rejects that often."""
    if not (math.isfinite(se) and df > 0):
        return math.nan
    return se * _noncentrality(float(df))


class Judged:
    """What ``Comparison``, ``Trend`` and ``Equivalence`` share: the ``effect`` tested, its p (NaN: too little to
    test), standard error and degrees of freedom, and its verdict by the rule."""

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
        """The exact test of values without spread."""
        return self.test in (EXACT_SIGNS, EXACT_LABELS)

    @property
    def nothing_moved(self) -> bool:
        """Every unit differs by exactly 0 (an exact test of a 0 without spread, McNemar's without a discordant pair):
        a claim judged by it is untested (``claims.judge``), not inconclusive with a detectable 0."""
        if self.untested or self.effect != 0:
            return False
        return self.exact or (self.test == MCNEMAR and getattr(self, "low", math.nan) == 0 == getattr(self, "high",
                                                                                                        math.nan))

    @property
    def verdict(self) -> str:
        """The word of a comparison that is no claim's: significant, inconclusive or ``untested: <how few>``."""
        if self.untested:
            return f"{UNTESTED}: {self._untested_words()}"
        return SIGNIFICANT if self.significant else INCONCLUSIVE

    def word(self, direction: int) -> str:
        """The verdict on a claim that expects the effect's sign ``direction`` (+1 or -1)."""
        if direction not in (1, -1):
            raise ValueError(f"a claim's direction is +1 or -1, got {direction!r}")
        if self.untested:
            return UNTESTED
        if not self.significant:
            return INCONCLUSIVE
        return REPRODUCED if math.copysign(1, self.effect) == direction else CONTRADICTED

    @property
    def detectable(self) -> float:
        """The smallest true effect this design detects with probability ``POWER`` (``detectable_difference``);
        without spread, 0 where the exact test can reach p < ``LEVEL`` with these seeds, else infinity."""
        if self.untested:
            return math.nan
        if self.exact:
            return 0.0 if self._least_exact_p() < LEVEL else math.inf
        return detectable_difference(self.se, self.df)

    def _least_exact_p(self) -> float:
        raise NotImplementedError

    def _untested_words(self) -> str:
        raise NotImplementedError


@dataclass(frozen=True)
class Comparison(Judged):
    """``a`` against ``b`` by the rule: ``difference``, two-sided ``p``, 95% interval ``low``, ``high`` (NaN if exact),
    ``test``, ``n`` seeds or pairs counted in ``unit``, ``se`` and ``df``; untested (``n`` < 2): NaN interval and p."""

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
    """The interval, computed when first asked for (a root search for McNemar's; a simulation needs only ``p``)."""

    @property
    def effect(self) -> float:
        return self.difference

    @cached_property
    def _interval(self) -> tuple[float, float]:
        low, high = self.bounds()
        return float(low), float(high)

    low = property(lambda self: self._interval[0])
    high = property(lambda self: self._interval[1])

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


def compare(a: Sequence[float], b: Sequence[float], *, paired: bool = False) -> Comparison:
    """mean(a) - mean(b) over seeds: the paired t-test where ``paired`` (seed k of both shares its data order),
    Welch's otherwise, the exact test where the values have no spread."""
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
        # no spread at all: scipy's t is 0/0 or d/0 (and warns); only the signs or labels hold information, and the
        # exact test's p is 1 for no difference, else the least it can reach
        exact = Comparison(sa, sb, EXACT_SIGNS if paired else EXACT_LABELS, difference, math.nan, n)
        p = 1.0 if difference == 0 else exact._least_exact_p()
        return replace(exact, p=p, se=0.0, df=float(n - 1))
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
    """The one-sample t-test of per-seed values against 0: ``compare(values, zeros, paired=True)``."""
    c = compare(values, [0.0] * len(values), paired=True)
    return replace(c, test=ONE_SAMPLE) if c.test == PAIRED else c


def compare_seeds(a: Sequence[float], b: Sequence[float]) -> Comparison:
    """Two settings' per-seed values by the paired test on the first n seeds of both (n the fewer): seed k of every
    setting reads the same training sequences (``workflow.presets.seeded``)."""
    n = min(len(a), len(b))
    return compare(a[:n], b[:n], paired=True)


def mcnemar(a: Sequence, b: Sequence) -> Comparison:
    """Exact McNemar test of paired 0/1 outcomes [pairs] or [pairs, replicates]: the k of m discordant pairs that
    favour a against Binomial(m, 1/2), difference (2k - m) / N with Clopper-Pearson's interval mapped alike; a pair's
    replicates are not independent, so it counts once (for a when a's summed outcomes exceed b's)."""
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
    """The ``slope`` of a quantity against a setting by the rule, its 95% interval and the two-sided ``p`` of "slope
    0", over ``n`` values in ``groups`` seeds. No residual degree of freedom: untested, NaN interval and p."""

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


def trend(x: Sequence[float], y: Sequence[float], seeds: Sequence | None = None) -> Trend:
    r"""The least-squares slope of :math:`y = \alpha_s + \beta x + \varepsilon` and the t-test of :math:`\beta = 0`, an
    intercept per seed with ``seeds``; values all on the line make t d/0: then the exact sign-flip test of the seeds'
    slopes (p = 2 / 2^seeds; 1 where each seed's values are equal), without an interval."""
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
    """The two one-sided tests (TOST) of a ``Comparison`` within +-``margin``; ``p`` the larger of their p-values."""

    comparison: Comparison
    margin: float
    p: float

    effect = property(lambda self: self.comparison.difference)
    se = property(lambda self: self.comparison.se)
    df = property(lambda self: self.comparison.df)
    untested = property(lambda self: self.comparison.untested)
    exact = property(lambda self: self.comparison.exact)

    @property
    def test(self) -> str:
        return f"{TOST} on the {self.comparison.test}"

    def word(self, direction: int = 0) -> str:
        """Reproduced (equivalent), contradicted (the 95% interval wholly outside the margin), inconclusive or
        untested; an equivalence claim has no ``direction``."""
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
        r"""The smallest margin shown with probability ``POWER`` at a true difference of 0, approximately
        :math:`\mathrm{se}\,(t_{1-\alpha,\,df} + t_{1-(1-\mathrm{power})/2,\,df})`; without spread as ``Judged``'s."""
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
    """The TOST of ``comparison``'s t-test (``ttost_paired``, ``ttost_ind``), the normal one of McNemar's, the exact
    sign-flip test without spread (n equal differences within the margin: 1 / 2^n)."""
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


def percent(log_ratio: float) -> float:
    """A log ratio as a percent change: 100 (e^x - 1)."""
    return 100.0 * math.expm1(log_ratio) if math.isfinite(log_ratio) else log_ratio

