"""F5's attribution benchmark on the synthetic language: it runs and caches, ranks finite scores only, and its
summary, plot and headline quote the hit rates."""

import haliax as hax
import jax
import numpy as np
import pandas as pd
import pytest
from scipy import stats
from diffeqformer.data.synthetic import VOCABULARY, Prompt, encode, prompts

from diffeqformer import DiffEqFormerConfig
from diffeqformer.analysis import statistics
from diffeqformer.analysis.attribution import (METHODS, attribution_benchmark, attribution_scores, claim, over_seeds,
                                              summarize)
from diffeqformer.report.plots.lyapunov import benchmark as plot_summary
from diffeqformer.report.words.lyapunov import attribution_headline as headline
from diffeqformer.report.words import statistics as wording


def test_benchmark_runs_on_a_random_model(tmp_path):
    config = DiffEqFormerConfig(max_seq_len=64, hidden_dim=16, num_layers=2, num_heads=2, mlp_scale=2,
                                time_embed_dim=4, sinusoidal_dim=4)
    model = config.build(hax.Axis("vocab", len(VOCABULARY)), key=jax.random.PRNGKey(0))
    items = prompts(4, seed=5, context_items=1)
    results = attribution_benchmark(model, items, cache_dir=tmp_path)
    assert list(results["method"].unique()) == list(METHODS)
    cached = list(tmp_path.glob("attribution-*.csv"))
    assert len(cached) == 1
    pd.testing.assert_frame_equal(attribution_benchmark(model, items, cache_dir=tmp_path), results)
    attribution_benchmark(model, items[:2], cache_dir=tmp_path)
    assert len(list(tmp_path.glob("attribution-*.csv"))) == 2  # other prompts, other file
    with pytest.raises(ValueError, match="default methods"):
        attribution_benchmark(model, items, cache_dir=tmp_path, methods={"raw attention": None})
    # the rank of one method by hand: the true token's place among BOS-less, output-less candidates
    scores = attribution_scores(model, hax.named(jax.numpy.asarray(
        np.concatenate([encode(items[0]), np.zeros(64 - len(encode(items[0])), np.int32)])), "position"),
        len(encode(items[0])) - 1)["raw attention"].to_numpy()[1: len(encode(items[0])) - 1]
    truth = items[0].true_position
    want = 1 + int(np.sum(scores > scores[truth]))
    got = results[(results.prompt == 0) & (results.method == "raw attention")]["rank"].iloc[0]
    assert got == want
    assert len(results) == 4 * 5
    lengths = results["length"].to_numpy()
    assert np.all(results["rank"] >= 1) and np.all(results["rank"] <= lengths - 2)
    table = summarize(results)
    assert set(table.columns) >= {"task", "method", "hit_at_1", "hit_at_3", "model_accuracy"}
    assert np.all((table.hit_at_1 <= table.hit_at_3) & (table.hit_at_3 <= 1))


def test_summary_hit_rates_chance_and_accuracy():
    rows = []
    # agreement: 2 prompts of length 12 (10 candidates); induction: one of length 5 (3 candidates)
    cases = ((0, "agreement", 12, True, (1, 4)), (1, "agreement", 12, False, (2, 1)), (2, "induction", 5, True, (3, 1)))
    for prompt, task, length, correct, ranks in cases:
        for method, rank in zip(("a", "b"), ranks):
            # method b's score of prompt 0's true token was not finite (ranked last: 10 of 10), 3 scores in all
            truth_finite = not (prompt == 0 and method == "b")
            rows.append({"prompt": prompt, "task": task, "method": method,
                         "rank": rank if truth_finite else length - 2, "truth_finite": truth_finite,
                         "nonfinite": 0 if truth_finite else 3, "correct_prediction": correct, "length": length})
    table = summarize(pd.DataFrame(rows)).set_index(["task", "method"])
    assert table.loc[("agreement", "a"), "hit_at_1"] == 0.5 and table.loc[("agreement", "a"), "hit_at_3"] == 1.0
    assert table.loc[("agreement", "b"), "hit_at_3"] == 0.5
    counts = table[["nonfinite_scores", "truth_nonfinite"]]
    assert list(counts.loc[("agreement", "b")]) == [3, 1] and list(counts.loc[("agreement", "a")]) == [0, 0]
    assert table.loc[("agreement", "a"), "chance_at_1"] == pytest.approx(0.1)
    assert table.loc[("agreement", "a"), "chance_at_3"] == pytest.approx(0.3)
    assert table.loc[("induction", "a"), "chance_at_3"] == pytest.approx(1.0)  # 3 candidates: top three is all
    assert table.loc[("agreement", "a"), "model_accuracy"] == 0.5
    assert table.loc[("agreement", "a"), "hit_at_1_correct"] == 1.0  # prompt 0 only
    assert table.loc[("agreement", "b"), "hit_at_1_correct"] == 0.0
    assert table.loc[("induction", "a"), "prompts"] == 1


def test_plot_summary():
    import matplotlib

    matplotlib.use("Agg")
    rows = [{"prompt": p, "task": t, "method": m, "rank": 1 + p % 3, "truth_finite": True, "nonfinite": 0,
             "correct_prediction": p % 2 == 0, "length": 20}
            for p, t in enumerate(("agreement", "induction") * 3) for m in METHODS]
    fig = plot_summary(summarize(pd.DataFrame(rows)))
    assert len(fig.axes) == 2 and "accuracy" in fig.axes[0].get_title()


def test_headline_quotes_the_summary():
    rows = [{"prompt": p, "task": t, "method": m, "rank": 1 + (p + 2 * i) % 4, "truth_finite": p != 1 or i != 0,
             "nonfinite": 2 * (p == 1 and i == 0), "correct_prediction": p < 2, "length": 20}
            for p, t in enumerate(("agreement", "induction") * 3) for i, m in enumerate(METHODS)]
    results = pd.DataFrame(rows)
    summary = summarize(results)
    text = headline(results)
    assert text["best_agreement"] == "lyapunov (max exponent), raw attention and gradient x input"
    row = summary[(summary.task == "induction") & (summary.method == "raw attention")].iloc[0]
    assert text["hit1_induction_attention"] == f"{row.hit_at_1:.2f}"
    assert text["hit3_agreement_lyapunov_max"] == f"{summary.hit_at_3.iloc[0]:.2f}"
    assert text["accuracy_agreement"] == f"{row.model_accuracy:.2f}" and text["prompts_induction"] == "3"
    agreement = summary[summary.task == "agreement"]
    best = list(agreement[agreement.hit_at_1 == agreement.hit_at_1.max()].method)
    assert text["best_agreement"] == (best[0] if len(best) == 1 else ", ".join(best[:-1]) + " and " + best[-1])
    assert (text["nonfinite_induction"], text["truth_nonfinite_induction"]) == ("2", "1")  # prompt 1 is induction
    assert (text["nonfinite_agreement"], text["truth_nonfinite_agreement"]) == ("0", "0")
    tie = headline(results.assign(rank=1))
    assert tie["best_induction"] == "none: all methods tie at 1.00"


def _claim_rows(hits_per_seed, prompts):
    """Per-prompt results of one task: seed s's model ranks the true token first for the first ``lyap`` prompts by
    the largest exponent and the first ``attn`` by attention."""
    return [{"seed": seed, "prompt": p, "task": "agreement", "method": method, "rank": 1 if p < hits else 2,
             "truth_finite": True, "nonfinite": 0, "correct_prediction": True, "length": 12}
            for seed, (lyap, attn) in enumerate(hits_per_seed) for p in range(prompts)
            for method, hits in (("lyapunov (max exponent)", lyap), ("raw attention", attn))]


def test_hit_rates_over_seeds_and_the_claim():
    """Three seeds' benchmarks: the table averages each rate over the seeds' models, the headline quotes mean ± sd,
    and the largest exponent against attention is judged with the model as the unit (a paired t-test over the
    seeds' hit@1 rates); one seed's model, with the prompt as the unit (McNemar's test)."""
    rows = _claim_rows([(4, 1), (4, 2), (3, 1)], 4)  # prompts (of 4) each method puts first, per seed
    summary = summarize(pd.DataFrame(rows))
    assert len(summary) == 2 * 3  # a row per method and seed
    mean = over_seeds(summary).set_index("method")
    assert mean.loc["raw attention", "hit_at_1"] == pytest.approx(np.mean([0.25, 0.5, 0.25]))
    assert mean.loc["raw attention", "hit_at_1_sd"] == pytest.approx(np.std([0.25, 0.5, 0.25], ddof=1))
    assert mean.loc["raw attention", "seeds"] == 3
    text = headline(pd.DataFrame(rows))
    assert text["seeds_agreement"] == "3 seeds" and " ± " in text["hit1_agreement_attention"]
    # per seed: hit@1 1.00 - 0.25, 1.00 - 0.50, 0.75 - 0.25: differences 0.75, 0.50, 0.50
    paired = stats.ttest_rel([1.0, 1.0, 0.75], [0.25, 0.5, 0.25])
    assert text["claim_agreement"].startswith(
        "significant, with the paper, before Holm's adjustment: +0.583 hit@1 (95% CI ")
    assert f"{wording.p_text(paired.pvalue)}, paired t-test over 3 seeds; detectable at 80% power: " in \
        text["claim_agreement"]
    c, hits = claim(pd.DataFrame(rows))
    assert c.p == pytest.approx(paired.pvalue) and hits == pytest.approx(7 / 12)
    # the seeds disagree: one model favours the largest exponent, two attention, by much: inconclusive, however many
    # prompts (pooled over the models, McNemar's test would call 40 of 60 prompts against 20 significant)
    split = _claim_rows([(50, 10), (10, 30), (10, 30)], 60)
    c, _ = claim(pd.DataFrame(split))
    assert c.verdict == statistics.INCONCLUSIVE and c.test == statistics.PAIRED
    one = pd.DataFrame([r for r in rows if r["seed"] == 0])
    assert claim(one)[0].p == pytest.approx(stats.binomtest(3, 3).pvalue)  # one seed: McNemar on the prompts
    assert f"{wording.p_text(stats.binomtest(3, 3).pvalue)}, exact McNemar test over 4 pairs" in \
        headline(one)["claim_agreement"]
    assert headline(one)["claim_agreement"].startswith("not significant, pointing with the paper: ")
    assert headline(one[one.prompt == 0])["claim_agreement"].startswith(f"{statistics.UNTESTED} (1 pair")


def _tiny_synthetic_model():
    config = DiffEqFormerConfig(max_seq_len=64, hidden_dim=16, num_layers=2, num_heads=2, mlp_scale=2,
                                time_embed_dim=4, sinusoidal_dim=4)
    return config.build(hax.Axis("vocab", len(VOCABULARY)), key=jax.random.PRNGKey(0))


def test_benchmark_ranks_finite_scores_only():
    """A score that is not finite ranks below every finite one; a true token with such a score ranks last. The old
    ranking (np.nan_to_num, then a stable sort) put +inf first and broke a tie at -inf or NaN by position."""
    model = _tiny_synthetic_model()
    # a hand-made prompt whose true token is the first candidate (word 0): a positional tie-break favours it
    item = Prompt(("arthur", "finds", "the", "map", "with"), "his", 0, "agreement")
    c = len(item.words) - 1  # candidates: the words before the output position ("with"), 4

    def scores(fill):
        def method(m, ids, out):
            s = np.arange(ids.array.shape[0], 0, -1, dtype=float) / 100  # finite, earlier tokens higher
            return fill(s, out)
        return method

    def plus_inf_elsewhere(s, out):
        s[3] = np.inf  # a non-truth candidate overflows
        return s

    def all_nan(s, out):
        return np.full_like(s, np.nan)

    def minus_inf_from_truth(s, out):
        s[1:] = -np.inf  # the truth (token 1 after BOS) and every later candidate collapse
        return s

    methods = {"+inf elsewhere": scores(plus_inf_elsewhere), "all NaN": scores(all_nan),
               "-inf from truth": scores(minus_inf_from_truth)}
    results = attribution_benchmark(model, [item], methods=methods, progress=False).set_index("method")
    assert results.loc["+inf elsewhere", "rank"] == 1 and results.loc["+inf elsewhere", "truth_finite"]
    assert results.loc["+inf elsewhere", "nonfinite"] == 1
    for name in ("all NaN", "-inf from truth"):
        assert results.loc[name, "rank"] == c and not results.loc[name, "truth_finite"], name
        assert results.loc[name, "nonfinite"] == c, name
    table = summarize(results.reset_index()).set_index("method")
    assert table.loc["+inf elsewhere", "hit_at_1"] == 1.0
    assert table.loc["all NaN", "hit_at_3"] == 0.0 and table.loc["all NaN", "truth_nonfinite"] == 1


def test_benchmark_on_minus_inf_exponents(monkeypatch):
    """The default methods, with every Lyapunov exponent -inf (what a singular tangent map gives; a trained model
    gives none): both Lyapunov scores rank the true token last, and the other methods are unaffected."""
    from diffeqformer.analysis import lyapunov

    real = lyapunov._exponents

    def collapsed(*args, **kwargs):
        exps, n = real(*args, **kwargs)
        return np.full_like(exps, -np.inf), n

    model = _tiny_synthetic_model()
    items = [p for p in prompts(6, seed=5, context_items=1) if p.task == "agreement"]
    before = attribution_benchmark(model, items, progress=False)
    monkeypatch.setattr(lyapunov, "_exponents", collapsed)
    after = attribution_benchmark(model, items, progress=False)
    lyap = after["method"].isin(METHODS[:2])
    candidates = after["length"] - 2
    assert (after.loc[lyap, "rank"] == candidates[lyap]).all() and not after.loc[lyap, "truth_finite"].any()
    assert (after.loc[lyap, "nonfinite"] == candidates[lyap]).all()
    pd.testing.assert_frame_equal(after[~lyap], before[~lyap])
    assert (before["nonfinite"] == 0).all() and before["truth_finite"].all()
