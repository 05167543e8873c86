"""Verdicts that survive noise: a comparison between two models is called a result only when it exceeds the spread
of training seeds.

A *seed* of a run is the same configuration trained with another ``trainer.seed``: another initialisation, another
order of the training sequences and other dropout masks. The pipeline trains a comparison's runs with several seeds
(``pipeline.seeded``); the analyses take a run or a list of seed runs wherever they took a run.

The rule (``RULE``): the difference of the two seed means counts as a result when it is larger than twice its
standard error, :math:`|\\bar a - \\bar b| > 2\\sqrt{s_a^2/n_a + s_b^2/n_b}` (Welch), which needs at least two
seeds on each side; otherwise the comparison is *within noise*. With a single seed on a side there is no spread to
compare with: the comparison is *untested* and says so.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Iterable, Sequence

RULE = ("a difference counts as a result when the difference of the seed means is larger than twice its standard "
        "error (Welch: the square root of s_a^2/n_a + s_b^2/n_b); otherwise it is within noise")
"""The rule, in words, for captions and prose."""

RESULT, NOISE, UNTESTED = "result", "within noise", "untested (one seed)"


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


@dataclass(frozen=True)
class Comparison:
    """``a`` against ``b`` over seeds (e.g. DiffEqFormer's final perplexities against GPT-2's)."""

    a: Spread
    b: Spread

    @property
    def difference(self) -> float:
        """mean(a) - mean(b)."""
        return self.a.mean - self.b.mean

    @property
    def relative(self) -> float:
        """mean(a) / mean(b) - 1."""
        return self.a.mean / self.b.mean - 1.0

    @property
    def se(self) -> float:
        """Welch's standard error of the difference of the means (NaN when a side has one seed)."""
        if self.a.n < 2 or self.b.n < 2:
            return math.nan
        return math.sqrt(self.a.sd**2 / self.a.n + self.b.sd**2 / self.b.n)

    @property
    def verdict(self) -> str:
        """``RESULT``, ``NOISE`` or ``UNTESTED`` (see ``RULE``)."""
        if math.isnan(self.se):
            return UNTESTED
        return RESULT if abs(self.difference) > 2.0 * self.se else NOISE

    @property
    def is_result(self) -> bool:
        return self.verdict == RESULT

    def text(self, digits: int = 1, unit: str = "") -> str:
        """``-48.2 (-9.2%), 2 SE = 11.0: result``."""
        se = "" if math.isnan(self.se) else f", 2 SE = {2 * self.se:.{digits}f}{unit}"
        return f"{self.difference:+.{digits}f}{unit} ({100 * self.relative:+.1f}%){se}: {self.verdict}"


def compare(a: Sequence[float], b: Sequence[float]) -> Comparison:
    """``Comparison`` of the seed values ``a`` against ``b``."""
    return Comparison(spread(a), spread(b))


def sign_word(comparison: Comparison, lower: str, higher: str, same: str) -> str:
    """``lower`` if a is below b as a result, ``higher`` if above as a result, else ``same`` (noise or untested)."""
    if not comparison.is_result:
        return same
    return lower if comparison.difference < 0 else higher
