"""diffeqformer.analysis.seeds: spreads over seeds and the rule that tells a result from noise."""

import math

import pytest

from diffeqformer.analysis.seeds import NOISE, RESULT, UNTESTED, all_runs, as_list, compare, spread


def test_spread_is_mean_and_sample_deviation():
    s = spread([1.0, 2.0, 3.0])
    assert (s.n, s.mean, s.sd) == (3, 2.0, 1.0)
    assert s.se == pytest.approx(1 / math.sqrt(3))
    assert s.text() == "2.0 ± 1.0 (3 seeds)" and spread([4.0]).text() == "4.0 (1 seed)"


def test_rule_twice_the_welch_standard_error():
    # difference 1.0; standard error sqrt(1/3 + 1/3) = 0.816: 1.0 < 2 SE, within noise
    within = compare([1.0, 2.0, 3.0], [0.0, 1.0, 2.0])
    assert within.se == pytest.approx(math.sqrt(2 / 3)) and within.verdict == NOISE
    # the same difference with ten times less spread: a result
    assert compare([1.9, 2.0, 2.1], [0.9, 1.0, 1.1]).verdict == RESULT
    assert compare([2.0], [1.0, 1.1]).verdict == UNTESTED  # one seed: no spread to judge by


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
