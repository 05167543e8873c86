"""diffeqformer.analysis.perplexity on hand-made runs (metrics.jsonl, complete.json): the numbers F6 shows and glues."""

import json
import math

import numpy as np
import pytest

from diffeqformer.analysis import perplexity, statistics
from diffeqformer.report.words import language as words
from diffeqformer.report.words import statistics as wording
from diffeqformer.report.plots import language


def _run(path, losses, name, steps=20):
    path.mkdir(parents=True)
    lines = []
    for step, loss in losses:
        lines.append({"step": step, "time": 0.0, "train/loss": loss + 0.1})
        lines.append({"step": step, "time": 0.0, "eval/loss": loss})
    lines.append({"step": None, "time": 0.0, "summary": 1.0})
    (path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in lines) + "\n")
    (path / "complete.json").write_text(json.dumps({"name": name, "steps": steps, "tokens_per_second": 100.0,
                                                    "wall_time_s": 5.0}))
    return str(path)


@pytest.fixture
def runs(tmp_path):
    return {"gpt": _run(tmp_path / "g", [(0, 8.0), (10, 6.0), (19, 5.0)], "gpt"),
            "ours": _run(tmp_path / "o", [(0, 8.0), (10, 5.5), (19, 4.5)], "ours"),
            "shared": _run(tmp_path / "s", [(0, 8.0), (10, 6.5), (19, 5.5)], "shared")}


def test_curves_are_exp_of_the_validation_loss(runs):
    frame = perplexity.curves(runs)
    ours = frame[frame.row == "ours"]
    np.testing.assert_allclose(ours.perplexity, np.exp([8.0, 5.5, 4.5]), rtol=1e-12)
    np.testing.assert_allclose(ours.train_perplexity, np.exp([8.1, 5.6, 4.6]), rtol=1e-12)
    assert list(ours.step) == [0, 10, 19]


def test_final_table_in_table_order_with_changes_against_the_baseline(runs):
    table = perplexity.final_table(runs)
    assert list(table.index) == ["gpt", "shared", "ours"]  # the paper's row order, not the dict's
    assert table.loc["ours", "final ppl"] == pytest.approx(math.exp(4.5))
    assert table.loc["ours", "vs baseline %"] == pytest.approx(100 * (math.exp(4.5) / math.exp(5.0) - 1))
    assert math.isnan(table.loc["gpt", "vs baseline %"])
    assert table.loc["ours", "paper row"] == "T1 Our model-small"
    assert table.loc["ours", "seeds"] == 1 and table.loc["ours", "verdict"] == "untested: 1 seed"
    assert math.isnan(table.loc["ours", "params"])  # a hand-made run keeps no config to count them on
    glued = words.f6_headline(table)
    assert glued["ppl_ours"] == f"{math.exp(4.5):.1f}" and glued["steps"] == "20" and glued["seeds"] == "1 seed"
    verdicts = perplexity.verdicts(perplexity.curves(runs))
    assert list(verdicts) == ["f6_ours", "f6_shared", "f6_overfit", "f6_llama"]
    assert verdicts["f6_llama"].word == statistics.UNTESTED and "no DiffEqFormer (Llama) and Llama" in wording.verdict(
        verdicts["f6_llama"])
    assert all(v.word == statistics.UNTESTED for v in verdicts.values())  # one seed each: nothing to judge by


def _seeds(tmp_path, name, finals):
    return [_run(tmp_path / f"{name}{k}", [(0, 8.0), (19, loss)], name) for k, loss in enumerate(finals)]


def test_seeds_give_mean_spread_and_verdict(tmp_path):
    """Three seeds per row: the table holds the mean and standard deviation of the final perplexities; seed k of
    every row is matched (the paired t-test of the book's rule, on log-perplexities): a difference whose p is below
    0.05 is significant, another inconclusive; the change is the ratio of perplexities from the mean log difference."""
    gpt = [5.00, 5.02, 4.98]
    runs = {"gpt": _seeds(tmp_path, "g", gpt), "ours": _seeds(tmp_path, "o", [4.50, 4.53, 4.47]),
            "shared": _seeds(tmp_path, "s", [4.90, 5.10, 5.03])}
    frame = perplexity.curves(runs)
    assert sorted(set(frame.seed)) == [0, 1, 2]
    table = perplexity.final_table(runs)
    ppl = np.exp(gpt)
    assert table.loc["gpt", "seeds"] == 3
    assert table.loc["gpt", "final ppl"] == pytest.approx(ppl.mean())
    assert table.loc["gpt", "sd"] == pytest.approx(ppl.std(ddof=1))
    assert table.loc["ours", "verdict"] == statistics.SIGNIFICANT
    assert table.loc["ours", "vs baseline %"] == pytest.approx(100 * math.expm1(np.mean([-0.50, -0.49, -0.51])))
    assert table.loc["shared", "verdict"] == statistics.INCONCLUSIVE
    glued = words.f6_headline(table)
    assert glued["seeds"] == "3 seeds" and " ± " in glued["ppl_ours"]
    verdict = perplexity.verdicts(frame)["f6_ours"]
    ours = perplexity.comparisons(frame)["ours"]
    assert ours.test == "paired t-test" and ours.p < 0.05 and verdict.word == statistics.REPRODUCED
    assert wording.verdict(verdict).startswith(
        f"significant, with the paper, before Holm's adjustment: {table.loc['ours', 'vs baseline %']:+.1f}% (95% CI ")
    assert f"p = {ours.p:.2g}, paired t-test over 3 seeds; detectable at 80% power: " in wording.verdict(verdict)
    ax = language.perplexity_curves(frame, perplexity.ROWS).axes[0]
    assert len(ax.collections) == 3  # one band per row


def test_bad_runs_are_named(runs, tmp_path):
    with pytest.raises(ValueError, match="unknown row key 'gtp'"):
        perplexity.curves({"gtp": runs["gpt"]})
    with pytest.raises(FileNotFoundError, match="runs\\['ours'\\]"):
        perplexity.curves({"ours": str(tmp_path / "nothing")})
    table = perplexity.final_table({"gpt": runs["gpt"]})
    with pytest.raises(ValueError, match="'ours'"):
        words.f6_headline(table)


def test_plot_has_one_line_pair_per_run(runs):
    ax = language.perplexity_curves(perplexity.curves(runs), perplexity.ROWS).axes[0]
    assert len(ax.lines) == 6 and ax.get_yscale() == "log" and not ax.collections  # one seed: no band
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["GPT-2", "weight-shared", "DiffEqFormer"]


def _curve_run(path, evals, trains, name="run"):
    """A finished run whose metrics hold validation losses ``evals`` and training losses ``trains`` (step -> loss)."""
    path.mkdir(parents=True)
    lines = [{"step": s, "time": 0.0, "train/loss": v} for s, v in trains.items()]
    lines += [{"step": s, "time": 0.0, "eval/loss": v} for s, v in evals.items()]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    (path / "complete.json").write_text(json.dumps({"name": name, "steps": max(evals), "tokens_per_second": 1.0}))
    return str(path)


def test_overfitting_measures_of_a_known_curve(tmp_path):
    """Best validation loss at step 100, higher at the end: the rise is final - best loss (the log of the ratio of the
    perplexities); the gap is the final validation loss less the mean training loss of steps 101-200 (not of every
    step, not of step 200 alone)."""
    evals = {0: 8.0, 100: 4.0, 200: 4.5}
    trains = {s: (5.0 if s <= 100 else 3.0 + (s - 101) / 99) for s in range(1, 201)}  # 3.0 .. 4.0 after step 100
    run = _curve_run(tmp_path / "g", evals, trains)
    frame = perplexity.curves({"gpt": run})
    assert list(frame.train_loss_interval) == pytest.approx([math.nan, 5.0, 3.5], nan_ok=True)
    measures = perplexity.overfitting(frame)["gpt"]
    assert measures["rise"] == [pytest.approx(0.5)]
    assert measures["gap"] == [pytest.approx(4.5 - 3.5)]
    table = perplexity.final_table({"gpt": run})
    assert table.loc["gpt", "rise %"] == pytest.approx(100 * (math.exp(4.5) / math.exp(4.0) - 1))
    assert table.loc["gpt", "gap nats"] == pytest.approx(1.0) and math.isnan(table.loc["gpt", "gap sd"])
    best_last = perplexity.overfitting(perplexity.curves({"gpt": _curve_run(tmp_path / "b", {0: 8.0, 100: 4.0},
                                                                            {100: 3.9})}))["gpt"]
    assert best_last == {"rise": [0.0], "gap": [pytest.approx(0.1)]}  # the last evaluation is the best: no rise


def _overfit_seeds(tmp_path, name, rises, gaps):
    """Seed runs with validation loss 4.0 at step 10 and 4.0 + rise at step 20, training loss 4.0 + rise - gap over
    steps 11-20."""
    return [_curve_run(tmp_path / f"{name}{k}", {0: 8.0, 10: 4.0, 20: 4.0 + r},
                       {s: 4.0 + r - g for s in range(11, 21)}, name)
            for k, (r, g) in enumerate(zip(rises, gaps))]


def test_overfits_less_is_judged_on_the_rise(tmp_path):
    """F6's overfitting claim is judged by one test, the paired t-test of the rise above the best validation loss;
    the gap is compared too, as exploration."""
    gpt = _overfit_seeds(tmp_path, "g", [0.30, 0.32, 0.28], [0.50, 0.52, 0.47])
    ours = _overfit_seeds(tmp_path, "o", [0.00, 0.00, 0.00], [0.20, 0.22, 0.19])
    frame = perplexity.curves({"gpt": gpt, "ours": ours})
    versus = perplexity.overfit_comparisons(perplexity.overfitting(frame))["ours"]
    assert versus["gap"].difference == pytest.approx(-0.2933333, abs=1e-6) and versus["gap"].test == "paired t-test"
    assert versus["gap"].significant and versus["rise"].significant and versus["rise"].difference < 0
    verdict = perplexity.verdicts(frame)["f6_overfit"]
    assert verdict.word == statistics.REPRODUCED and verdict.effect == pytest.approx(100 * math.expm1(-0.30))
    # the same gaps, but DiffEqFormer's validation perplexity rises as much as GPT-2's: inconclusive
    ours = _overfit_seeds(tmp_path, "p", [0.30, 0.33, 0.27], [0.20, 0.22, 0.19])
    overfit = perplexity.verdicts(perplexity.curves({"gpt": gpt, "ours": ours}))["f6_overfit"]
    assert overfit.word == statistics.INCONCLUSIVE


def test_weight_sharing_is_worst_only_when_worse_than_both(tmp_path):
    """The weight-shared model against GPT-2 and against DiffEqFormer, each by the paired t-test: worst only where
    both are significant with it above (the intersection-union test); better than one of them, significantly,
    contradicts the claim."""
    gpt, ours = _seeds(tmp_path, "g", [5.00, 5.02, 4.98]), _seeds(tmp_path, "o", [4.50, 4.53, 4.47])
    worst = {"gpt": gpt, "ours": ours, "shared": _seeds(tmp_path, "s", [5.30, 5.31, 5.29])}
    frame = perplexity.curves(worst)
    versus = perplexity.worst_comparisons(perplexity.final_losses(frame))["shared"]
    assert set(versus) == {"gpt", "ours"} and all(c.significant and c.difference > 0 for c in versus.values())
    verdict = perplexity.verdicts(frame)["f6_shared"]
    assert verdict.word == statistics.REPRODUCED and "decided by the comparison with" in verdict.note
    # between the two: worse than DiffEqFormer, better than GPT-2, so not the worst
    between = {**worst, "shared": _seeds(tmp_path, "t", [4.80, 4.81, 4.79])}
    verdict = perplexity.verdicts(perplexity.curves(between))["f6_shared"]
    assert verdict.word == statistics.CONTRADICTED and verdict.note.endswith("GPT-2") and verdict.effect < 0
    # no DiffEqFormer: the claim cannot be tested
    alone = {"gpt": gpt, "shared": worst["shared"]}
    assert perplexity.verdicts(perplexity.curves(alone))["f6_shared"].word == statistics.UNTESTED
