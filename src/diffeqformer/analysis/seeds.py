"""Verdicts that survive noise: a comparison between two models is called a result only when a two-sided test at the
5% level rejects "no difference".

A *seed* of a run is the same configuration trained with another ``trainer.seed``: another initialisation, another
order of the training sequences and other dropout masks. The pipeline trains a comparison's runs with several seeds
(``pipeline.seeded``: seeds 0..n-1 of each setting, named ``<name>``, ``<name>-seed1``, ...); the analyses take a run
or a list of seed runs wherever they took a run.

The rule (``RULE``), in code once (``compare``, ``mcnemar``, ``trend``):

- Seed k of two settings shares its data order, so where the caller says the seeds are matched
  (``compare(a, b, paired=True)``) the test is a paired t-test on the n seed-matched differences
  :math:`d_k = a_k - b_k` (n - 1 degrees of freedom): what the seeds share cancels in :math:`d_k`, which makes the
  test stronger than one on the two means.
- Otherwise Welch's t-test, with the Welch-Satterthwaite degrees of freedom.
- Two methods read on the same seeds' models (F5's attribution methods): the paired t-test on the seeds' rates (the
  model is the unit). Per-item hits of two methods on one model's items: the exact McNemar test, a binomial test of
  the discordant items (one method right, the other wrong) against one half (``mcnemar``; an item seen by several
  models counts once, which tests those models only).

A trend over more than two settings (F9's perplexity against d_t) is judged by the same test of one number, the
slope of a least-squares line through every seed's value (``trend``): with an intercept per seed where seed k of
every setting shares its data order (the paired t-test is its two-setting case), otherwise one intercept.

A difference is a *result* when the test's p-value is below 0.05 (then its 95% confidence interval excludes zero),
otherwise *within noise*. Fewer than two seeds on a side (or fewer than two pairs) leave nothing to judge the
difference by: the comparison is *untested* and says with how many. Every number comes from ``scipy.stats``
(``ttest_rel``, ``ttest_ind(equal_var=False)``, ``binomtest`` and their confidence intervals).

Why not "twice the standard error", the rule this replaced: with 2-3 seeds a side, Welch's t has 1-4 degrees of
freedom, whose two-sided 5% critical values (12.7 at 1, 4.30, 3.18, 2.78 at 4) are all far above 2, so that rule
called many more than 5% of comparisons without a true difference results (``tests/test_seeds.py`` simulates it).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from functools import cached_property
from typing import Callable, Iterable, Sequence

import numpy as np
from scipy import stats

LEVEL = 0.05
"""Significance level of every verdict (two-sided)."""

RULE = ("a difference counts as a result when a two-sided test rejects 'no difference' at the 5% level (p < 0.05; its "
        "95% confidence interval then excludes zero): a paired t-test on the seed-matched differences where seed k "
        "of both sides shares its data order (and for two methods read on the same seeds' models), otherwise "
        "Welch's t-test, and for per-prompt hits of two methods on one model the exact McNemar test; otherwise it is "
        "within noise, and with fewer than two seeds (or pairs) it is untested")
"""The rule, in words, for captions and prose."""

RESULT, NOISE, UNTESTED = "result", "within noise", "untested"
"""The verdicts; an untested one says with how many seeds: ``untested: 1 seed`` (``Comparison.verdict``)."""

PAIRED, WELCH, MCNEMAR = "paired t-test", "Welch's t-test", "exact McNemar test"
"""The tests of ``RULE``, as ``Comparison.test`` names them."""

SEED_SLOPE, SLOPE = "t-test of the slope with an intercept per seed", "t-test of the slope"
"""The tests of a ``Trend``: seeds matched across the settings, or not."""


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


class Judged:
    """What ``Comparison`` and ``Trend`` share: a p-value (NaN when there was too little to test) and the verdict it
    gives by ``RULE``; ``_untested_words`` says with how few."""

    p: float

    @property
    def untested(self) -> bool:
        """Too few seeds, pairs or values to test."""
        return math.isnan(self.p)

    @property
    def verdict(self) -> str:
        """``RESULT`` (p < ``LEVEL``), ``NOISE``, or ``untested: ...`` saying with how few (see ``RULE``)."""
        if self.untested:
            return f"{UNTESTED}: {self._untested_words()}"
        return RESULT if self.p < LEVEL else NOISE

    @property
    def is_result(self) -> bool:
        """Whether the verdict is ``RESULT``."""
        return self.verdict == RESULT

    def _untested_words(self) -> str:
        raise NotImplementedError


@dataclass(frozen=True)
class Comparison(Judged):
    """``a`` against ``b`` (e.g. DiffEqFormer's final perplexities over seeds against GPT-2's), judged by ``RULE``.

    ``difference`` is what the test is about, ``p`` its two-sided p-value and ``low``, ``high`` its 95% confidence
    interval; ``test`` names the test (``PAIRED``, ``WELCH``, ``MCNEMAR``), ``n`` the seeds (the fewer of the two
    sides') or pairs it rests on, counted in ``unit``. Untested comparisons (``n`` < 2) have NaN interval and p."""

    a: Spread
    b: Spread
    test: str
    difference: float
    p: float
    n: int
    unit: str = "seed"
    bounds: Callable[[], tuple[float, float]] = field(default=lambda: (math.nan, math.nan), repr=False,
                                                      compare=False)
    """The interval, computed when first asked for (an exact binomial interval is a root search, and a simulation
    of the rule needs only ``p``)."""

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

    def interval(self, digits: int = 1, unit: str = "") -> str:
        """``95% CI [-60.1, -36.3], p = 0.003, paired t-test`` (empty when untested)."""
        if self.untested:
            return ""
        p = f"p = {self.p:.2g}" if self.p >= 1e-3 else "p < 0.001"
        return f"95% CI [{self.low:+.{digits}f}{unit}, {self.high:+.{digits}f}{unit}], {p}, {self.test}"

    def text(self, digits: int = 1, unit: str = "") -> str:
        """``-48.2 (-9.2%), 95% CI [-60.1, -36.3], p = 0.003, paired t-test: result``; untested:
        ``+0.4 (+0.1%): untested: 1 seed``."""
        relative = "" if math.isnan(self.relative) else f" ({100 * self.relative:+.1f}%)"
        interval = "" if self.untested else f", {self.interval(digits, unit)}"
        return f"{self.difference:+.{digits}f}{unit}{relative}{interval}: {self.verdict}"


def compare(a: Sequence[float], b: Sequence[float], *, paired: bool = False) -> Comparison:
    """``Comparison`` of the seed values ``a`` against ``b``: mean(a) - mean(b), by the paired t-test where
    ``paired`` (seed k of ``a`` and of ``b`` share the data order: equal numbers of seeds, in the same order),
    otherwise by Welch's t-test (``RULE``)."""
    sa, sb = spread(a), spread(b)
    if paired:
        if sa.n != sb.n:
            raise ValueError(f"a paired comparison needs the same seeds on both sides, got {sa.n} and {sb.n}")
        n, test = sa.n, PAIRED
        degenerate = n >= 2 and len({x - y for x, y in zip(sa.values, sb.values)}) == 1
    else:
        n, test = min(sa.n, sb.n), WELCH
        degenerate = n >= 2 and len(set(sa.values)) == 1 and len(set(sb.values)) == 1
    difference = sa.mean - sb.mean
    if n < 2:
        return Comparison(sa, sb, test, difference, math.nan, n)
    if degenerate:
        # No spread at all (identical seeds): scipy's t is 0/0 or d/0 and warns; the answer is plain.
        return Comparison(sa, sb, test, difference, 1.0 if difference == 0 else 0.0, n,
                          bounds=lambda: (difference, difference))
    result = (stats.ttest_rel(sa.values, sb.values) if paired
              else stats.ttest_ind(sa.values, sb.values, equal_var=False))
    return Comparison(sa, sb, test, difference, float(result.pvalue), n,
                      bounds=lambda: tuple(result.confidence_interval(1 - LEVEL)))


def mcnemar(a: Sequence, b: Sequence) -> Comparison:
    r"""Exact McNemar test of paired binary outcomes (e.g. whether attribution methods a and b rank a prompt's true
    token first): ``a`` and ``b`` are [pairs] of 0/1, or [pairs, replicates] where each pair is seen several times
    (the same prompt by each seed's model).

    One outcome per pair: of the :math:`m` discordant pairs (one side 1, the other 0), :math:`k` favour a; under no
    difference :math:`k \sim \mathrm{Binomial}(m, 1/2)`, tested two-sided by ``scipy.stats.binomtest``. The
    difference is :math:`(k - (m - k)) / N` over the :math:`N` pairs, i.e. mean(a) - mean(b), and its interval is
    the exact (Clopper-Pearson) interval of :math:`k/m` mapped the same way (given m). With replicates, a pair
    favours a when a's outcomes summed over the replicates exceed b's: the replicates of one pair are not
    independent (a prompt that suits one method suits it in every seed), so each pair counts once; the difference
    is then the share of pairs that favour a less the share that favour b (with one replicate, mean(a) - mean(b)).
    Fewer than two pairs: untested."""
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
    if m == 0:
        return Comparison(sa, sb, MCNEMAR, 0.0, 1.0, n, "pair", bounds=lambda: (0.0, 0.0))
    result = stats.binomtest(k, m, 0.5)

    def bounds():
        ci = result.proportion_ci(1 - LEVEL, method="exact")
        return (2 * ci.low - 1) * m / n, (2 * ci.high - 1) * m / n

    return Comparison(sa, sb, MCNEMAR, difference, float(result.pvalue), n, "pair", bounds=bounds)


@dataclass(frozen=True)
class Trend(Judged):
    """The slope of a quantity against a setting (e.g. final perplexity per doubling of d_t), judged by ``RULE``:
    ``slope`` with its 95% confidence interval ``low``, ``high`` and two-sided p-value ``p`` of the t-test of
    "slope 0" with ``df`` degrees of freedom, over ``n`` values in ``groups`` seeds (``test``: ``SEED_SLOPE`` or
    ``SLOPE``). No residual degree of freedom (e.g. two settings of one seed): untested, NaN interval and p."""

    slope: float
    low: float
    high: float
    p: float
    df: int
    n: int
    groups: int
    test: str

    def _untested_words(self) -> str:
        return f"{self.n} value{'' if self.n == 1 else 's'} in {self.groups} seed{'' if self.groups == 1 else 's'}"

    def text(self, digits: int = 1, unit: str = "") -> str:
        """``-4.1 per doubling, 95% CI [-6.0, -2.2], p = 0.002, t-test of the slope with an intercept per seed (9
        values, 3 seeds): result`` with ``unit`` = `` per doubling``."""
        if self.untested:
            return f"{self.slope:+.{digits}f}{unit}: {self.verdict}"
        p = f"p = {self.p:.2g}" if self.p >= 1e-3 else "p < 0.001"
        return (f"{self.slope:+.{digits}f}{unit}, 95% CI [{self.low:+.{digits}f}, {self.high:+.{digits}f}], {p}, "
                f"{self.test} ({self.n} values, {self.groups} seed{'' if self.groups == 1 else 's'}): {self.verdict}")


def trend(x: Sequence[float], y: Sequence[float], seeds: Sequence | None = None) -> Trend:
    r"""``Trend`` of the values ``y`` against ``x`` (one pair per seed and setting): the least-squares slope
    :math:`\hat\beta` of :math:`y = \alpha_s + \beta x + \varepsilon` and the t-test of :math:`\beta = 0`.

    ``seeds`` (the seed of each value) gives each seed its own intercept :math:`\alpha_s`: seed k of every setting
    shares its data order, and what it shares then cancels from the slope, as it does from a paired difference
    (with two settings the test is the paired t-test, the slope the mean difference over the settings' distance).
    Without ``seeds``, one intercept: ``scipy.stats.linregress``'s test. Degrees of freedom: values less seeds
    less one. The interval is :math:`\hat\beta \pm t_{0.975,\,df}\,\mathrm{se}`."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"a trend needs one x per value, got shapes {x.shape} and {y.shape}")
    spread(y)  # finite values only
    labels = np.zeros(len(x), dtype=int) if seeds is None else np.unique(np.asarray(seeds), return_inverse=True)[1]
    if len(labels) != len(x):
        raise ValueError(f"one seed per value: {len(labels)} seeds for {len(x)} values")
    groups = int(labels.max()) + 1 if len(labels) else 0
    # within each seed, distances from the seed's means: the per-seed intercepts drop out
    xc, yc = x.copy(), y.copy()
    for g in range(groups):
        xc[labels == g] -= x[labels == g].mean()
        yc[labels == g] -= y[labels == g].mean()
    sxx = float(xc @ xc)
    if sxx == 0:
        raise ValueError("a trend needs at least two settings of x within a seed")
    slope = float(xc @ yc) / sxx
    df = len(x) - groups - 1
    test = SLOPE if seeds is None else SEED_SLOPE
    if df < 1:
        return Trend(slope, math.nan, math.nan, math.nan, df, len(x), groups, test)
    residual = yc - slope * xc
    se = math.sqrt(float(residual @ residual) / df / sxx)
    if se == 0:  # every point on the line: scipy's t would be d/0
        return Trend(slope, slope, slope, 1.0 if slope == 0 else 0.0, df, len(x), groups, test)
    t = stats.t(df)
    half = float(t.ppf(1 - LEVEL / 2)) * se
    return Trend(slope, slope - half, slope + half, float(2 * t.sf(abs(slope) / se)), df, len(x), groups, test)


def sign_word(comparison: Comparison, lower: str, higher: str, same: str) -> str:
    """``lower`` if a is below b as a result, ``higher`` if above as a result, else ``same`` (noise or untested)."""
    if not comparison.is_result:
        return same
    return lower if comparison.difference < 0 else higher
