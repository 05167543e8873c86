"""diffeqformer.analysis.perplexity on hand-made runs (metrics.jsonl, complete.json): the numbers F6 shows and glues."""

import json
import math

import numpy as np
import pytest

from diffeqformer.analysis import perplexity


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
    words = perplexity.headline(table)
    assert words["ppl_ours"] == f"{math.exp(4.5):.1f}" and words["steps"] == "20" and words["seeds"] == "1 seed"
    assert words["llama_sentence"] == "No Llama pair is trained at this preset."
    assert words["shared_sentence"].startswith("Weight-shared against GPT-2: +")
    assert "no spread to judge it by" in words["shared_sentence"]


def _seeds(tmp_path, name, finals):
    return [_run(tmp_path / f"{name}{k}", [(0, 8.0), (19, loss)], name) for k, loss in enumerate(finals)]


def test_seeds_give_mean_spread_and_verdict(tmp_path):
    """Three seeds per row: the table holds the mean and standard deviation of the final perplexities; seed k of
    every row is matched (the paired t-test of seeds.RULE): a difference whose p is below 0.05 is a result, another
    within noise."""
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
    assert table.loc["ours", "verdict"] == "result" and table.loc["ours", "vs baseline %"] < 0
    assert table.loc["shared", "verdict"] == "within noise"
    words = perplexity.headline(table, frame)
    assert words["seeds"] == "3 seeds" and " ± " in words["ppl_ours"]
    assert words["ours_sentence"].startswith("DiffEqFormer ends below GPT-2 by") and "a result" in words["ours_sentence"]
    assert "within noise" in words["shared_sentence"]
    ours = perplexity.comparisons(frame)["ours"]
    assert ours.test == "paired t-test" and ours.p < 0.05 and f"p = {ours.p:.2g}, paired t-test over 3 seeds" in \
        words["ours_sentence"]
    ax = perplexity.plot_curves(frame)
    assert len(ax.collections) == 3  # one band per row


def test_bad_runs_are_named(runs, tmp_path):
    with pytest.raises(ValueError, match="unknown row key 'gtp'"):
        perplexity.curves({"gtp": runs["gpt"]})
    with pytest.raises(FileNotFoundError, match="runs\\['ours'\\]"):
        perplexity.curves({"ours": str(tmp_path / "nothing")})
    table = perplexity.final_table({"gpt": runs["gpt"]})
    with pytest.raises(ValueError, match="'ours'"):
        perplexity.headline(table)


def test_plot_has_one_line_pair_per_run(runs):
    ax = perplexity.plot_curves(perplexity.curves(runs))
    assert len(ax.lines) == 6 and ax.get_yscale() == "log" and not ax.collections  # one seed: no band
