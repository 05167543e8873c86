"""The words of the book's statistics (``analysis.statistics``, ``analysis.claims``): the rule, p-values, spreads,
comparisons, trends and claims' verdicts as the pages quote them."""

from __future__ import annotations

import math

from ...analysis import claims, statistics

RULE = ("a difference is significant when a two-sided test rejects 'no difference' at the 5% level (p < 0.05; its "
        "95% confidence interval then excludes zero): a paired t-test on the seed-matched differences where seed k "
        "of both sides shares its data order, Welch's t-test otherwise, the exact McNemar test for per-prompt hits, an "
        "exact test on signs or labels where the values have no spread; a claim is reproduced when its test is "
        "significant in the paper's direction, contradicted when significant against it, inconclusive otherwise "
        "(with the interval and the smallest difference the design detects 80% of the time), and untested with fewer "
        "than two seeds (or pairs), or when every difference is exactly 0 (the measure does not move at this scale)")
"""The rule of every verdict (``analysis.statistics``), in words, for captions and prose."""


def p_text(p: float) -> str:
    """``p = 0.031``, or ``p < 0.001``."""
    return f"p = {p:.2g}" if p >= 1e-3 else "p < 0.001"


def spread(values, digits: int = 1) -> str:
    """Values over seeds (``statistics.spread``) as ``464.2 ± 6.1 (3 seeds)``, or ``464.2 (1 seed)``."""
    s = statistics.spread(values)
    sd = "" if s.n == 1 else f" ± {s.sd:.{digits}f}"
    return f"{s.mean:.{digits}f}{sd} ({s.n} seed{'' if s.n == 1 else 's'})"


def interval(c: statistics.Comparison, digits: int = 1, unit: str = "") -> str:
    """``95% CI [-60.1, -36.3], p = 0.003, paired t-test``; without spread no interval; untested: empty."""
    if c.untested:
        return ""
    ci = "" if math.isnan(c.low) else f"95% CI [{c.low:+.{digits}f}{unit}, {c.high:+.{digits}f}{unit}], "
    return f"{ci}{p_text(c.p)}, {c.test}"


def comparison(c: statistics.Comparison, digits: int = 1, unit: str = "") -> str:
    """``-48.2 (-9.2%), 95% CI [-60.1, -36.3], p = 0.003, paired t-test: significant``; untested:
    ``+0.4 (+0.1%): untested: 1 seed``."""
    relative = "" if math.isnan(c.relative) else f" ({100 * c.relative:+.1f}%)"
    ci = "" if c.untested else f", {interval(c, digits, unit)}"
    return f"{c.difference:+.{digits}f}{unit}{relative}{ci}: {c.verdict}"


def trend(t: statistics.Trend, digits: int = 1, unit: str = "") -> str:
    """``-4.1 per doubling, 95% CI [-6.0, -2.2], p = 0.002, t-test of the slope (9 values, 3 seeds): ...``."""
    if t.untested:
        return f"{t.slope:+.{digits}f}{unit}: {t.verdict}"
    ci = "" if math.isnan(t.low) else f", 95% CI [{t.low:+.{digits}f}, {t.high:+.{digits}f}]"
    return (f"{t.slope:+.{digits}f}{unit}{ci}, {p_text(t.p)}, {t.test} ({t.n} values, "
            f"{t.groups} seed{'' if t.groups == 1 else 's'}): {t.verdict}")


def effect(v: claims.Verdict) -> str:
    """``-9.2% (95% CI -15.1% to -3.0%)``, ``+0.33 per unit t (95% CI -0.95 to +1.61)`` (the unit written once), or
    the effect alone without an interval."""
    c = v.of
    if math.isnan(v.low):
        return c.format(v.effect)
    low, high = (v.low, v.high) if c.limit is None else (max(v.low, -c.limit), min(v.high, c.limit))
    return f"{c.format(v.effect)} (95% CI {c.format(low, unit=False)} to {c.format(high, unit=False)})"


def detectable(v: claims.Verdict) -> str:
    """The smallest effect detected 80% of the time (for an equivalence claim: the smallest margin shown 80% of the
    time), or why there is none."""
    c = v.of
    if c.measured:
        return "a measurement"
    if math.isnan(v.detectable):
        return "n/a"
    if math.isinf(v.detectable) or (c.limit is not None and v.detectable > c.limit):
        past = "" if math.isinf(v.detectable) else f" (past the largest possible, {c.format(c.limit, sign=False)})"
        return f"none with these seeds{past}"
    return c.format(v.detectable, sign=False)


def verdict(v: claims.Verdict) -> str:
    """A headline claim's test as a page's prose quotes it: ``significant, with the paper, before Holm's adjustment:
    -9.2% (95% CI -15.1% to -3.0%), p = 0.011, paired t-test over 5 seeds; detectable at 80% power: 5.5%``. What the
    test found and which way, not the verdict's word: that is the page's opening's, after Holm's adjustment across
    the book's claims, which a notebook does not know."""
    units = f"{v.n} {v.unit}{'' if v.n == 1 else 's'}"
    note = [v.note] if v.note else []
    if v.word == statistics.UNTESTED:
        return f"{statistics.UNTESTED} ({'; '.join([units, *note])})"
    if v.of.measured:
        return "; ".join([f"{v.word}: {effect(v)}", *note])
    found = exploratory(v) + (", before Holm's adjustment" if v.word != statistics.INCONCLUSIVE else "")
    words = [f"{found}: {effect(v)}, {p_text(v.p)}, {v.test} over {units}"]
    if v.negligible:
        words.append(f"negligible: within the practical threshold of +-{v.of.format(v.of.negligible, sign=False)}")
    label = "equivalence shown 80% of the time within" if v.of.margin else "detectable at 80% power"
    return "; ".join([*words, f"{label}: {detectable(v)}", *note])


def pointing(claim: claims.Claim, effect: float) -> str:
    """Which way an estimate points against the claim: ``with the paper``, ``against the paper`` or, for a claim of
    equivalence, whether it lies within the margin."""
    if claim.margin is not None:
        inside = abs(effect) <= abs(claim.written(claim.margin))
        margin = claim.format(claim.written(claim.margin), sign=False)
        return f"{'within' if inside else 'outside'} the margin of +-{margin}"
    if effect == 0 or math.isnan(effect):
        return "in neither direction"
    return "with the paper" if (effect > 0) == (claim.direction > 0) else "against the paper"


def exploratory(v: claims.Verdict) -> str:
    """An exploratory comparison's result in words no headline verdict uses, its direction always shown:
    ``significant, with the paper``, ``not significant, pointing against the paper``; for a claim of equivalence
    ``equivalent within the margin of +-5.0%`` or ``equivalence not shown, outside the margin of +-5.0%``."""
    if v.word == statistics.UNTESTED:
        return statistics.UNTESTED
    where = pointing(v.of, v.effect)
    if v.of.margin is not None:
        return f"equivalent {where}" if v.word == statistics.REPRODUCED else f"equivalence not shown, {where}"
    return f"significant, {where}" if v.word != statistics.INCONCLUSIVE else f"not significant, pointing {where}"
