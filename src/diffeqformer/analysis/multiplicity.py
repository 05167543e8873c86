"""Many tests at once: Holm's adjustment of the headline claims' p-values, the intersection-union test of a claim
that needs several, and how many comparisons come out significant by chance."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .statistics import CONTRADICTED, INCONCLUSIVE, LEVEL, REPRODUCED, UNTESTED, Judged


def holm(p_values: Sequence[float]) -> list[float]:
    r"""Holm's adjustment (a NaN stays NaN, uncounted): :math:`\max_{j \le i} \min(1, (m - j + 1)\,p_{(j)})`, the
    numbers of statsmodels' ``multipletests(method="holm")`` without its full garbage collection on every call."""
    p = np.array(p_values, dtype=float)
    tested = np.flatnonzero(~np.isnan(p))
    order = tested[np.argsort(p[tested], kind="stable")]
    p[order] = np.minimum(1.0, np.maximum.accumulate(p[order] * np.arange(len(order), 0, -1)))
    return p.tolist()


def intersection(tests: Sequence[Judged], direction: int) -> tuple[str, Judged]:
    """The intersection-union test of a claim that needs all ``tests`` in ``direction``: reproduced only when every
    one is, contradicted (or untested) when any is; the word and the test that decides it (else the largest p)."""
    words = [t.word(direction) for t in tests]
    if CONTRADICTED in words:
        return CONTRADICTED, tests[words.index(CONTRADICTED)]
    if UNTESTED in words:
        return UNTESTED, tests[words.index(UNTESTED)]
    deciding = max(tests, key=lambda t: t.p)
    return (REPRODUCED if all(w == REPRODUCED for w in words) else INCONCLUSIVE), deciding


def chance_count(tests: int) -> float:
    """How many of ``tests`` comparisons without a true difference come out significant at ``LEVEL``, on average."""
    return LEVEL * tests
