"""F11's verdict from per-seed task scores (no model, no harness): the one primary test, the last-word task's
zero-shot accuracy of DiffEqFormer against GPT-2 paired by seed, and every other comparison counted as exploratory
beside the number expected by chance."""

import pandas as pd
import pytest
from scipy import stats

from diffeqformer.analysis import downstream, multiplicity, statistics
from diffeqformer.data import tasks as held_out
from diffeqformer.report.words import language as words
from diffeqformer.report.plots import language

OURS = {held_out.LASTWORD: [0.40, 0.43, 0.41], held_out.NEXTLINE: [0.30, 0.36, 0.31]}
GPT = {held_out.LASTWORD: [0.35, 0.36, 0.37], held_out.NEXTLINE: [0.33, 0.30, 0.34]}


def _results(ours=OURS, gpt=GPT, shots=(0, 5)) -> pd.DataFrame:
    """Per-seed scores as ``downstream.evaluate_runs`` returns them: each task's headline metric, at each shot
    count (the five-shot scores the zero-shot ones less 0.01)."""
    rows = []
    for model, scores in (("ours", ours), ("gpt", gpt)):
        for task, values in scores.items():
            metric = downstream.HEADLINE[task]
            for k in shots:
                rows += [{"task": task, "shots": k, "metric": metric, "model": model, "seed": seed,
                          "value": value - 0.01 * (k > 0), "n": 50} for seed, value in enumerate(values)]
    return pd.DataFrame(rows)


def test_the_primary_test_is_the_zero_shot_last_word_accuracy_paired_by_seed():
    verdict = downstream.verdicts(_results())["f11_lastword"]
    paired = stats.ttest_rel(OURS[held_out.LASTWORD], GPT[held_out.LASTWORD])
    assert verdict.word == statistics.REPRODUCED and verdict.n == 3 and verdict.test == statistics.PAIRED
    assert verdict.p == pytest.approx(paired.pvalue)
    assert verdict.effect == pytest.approx((0.05 + 0.07 + 0.04) / 3)
    assert verdict.low < verdict.effect < verdict.high and verdict.detectable > 0
    # GPT-2 ahead on it: contradicted, the same test
    flipped = downstream.verdicts(_results(ours=GPT, gpt=OURS))["f11_lastword"]
    assert flipped.word == statistics.CONTRADICTED and flipped.p == pytest.approx(verdict.p)
    # without the last-word task there is nothing to judge the claim by
    nextline = {held_out.NEXTLINE: OURS[held_out.NEXTLINE]}
    none = downstream.verdicts(_results(ours=nextline, gpt={held_out.NEXTLINE: GPT[held_out.NEXTLINE]}))
    assert none["f11_lastword"].word == statistics.UNTESTED


def test_every_other_comparison_is_exploratory_beside_the_count_expected_by_chance():
    """Two tasks at two shot counts give four comparisons of DiffEqFormer with GPT-2; the primary one leaves three,
    of which 0.15 (written 0.2) would be significant by chance; the five-shot last-word one is (the same spread as
    the primary)."""
    results = _results()
    means, found = downstream.summary(results), downstream.comparisons(results)
    text = words.f11_sentences(means, found, downstream.exploratory(found))["verdicts"]
    assert text.startswith("Besides the primary test, 3 comparisons have seeds to judge them by; they are "
                           "exploratory: with no true difference anywhere, 0.2 of them would come out significant "
                           "at 5% by chance, and 1 does (DiffEqFormer above GPT-2 on shakespeare_lastword acc 5-shot")
    assert multiplicity.chance_count(3) == pytest.approx(0.15)


def test_the_table_and_the_figure_show_every_model_and_comparison():
    results = _results()
    means, found = downstream.summary(results), downstream.comparisons(results)
    table = words.f11_table(means, found)
    assert list(table.columns) == ["examples", "GPT-2", "DiffEqFormer", "DiffEqFormer vs GPT-2"] and len(table) == 4
    assert table.loc[(held_out.LASTWORD, 0, "acc"), "DiffEqFormer vs GPT-2"].endswith(f": {statistics.SIGNIFICANT}")
    fig = language.downstream_accuracies(means, downstream.headline(results), downstream.CHANCE)
    assert [ax.get_title() for ax in fig.axes] == sorted(held_out.TASKS)
