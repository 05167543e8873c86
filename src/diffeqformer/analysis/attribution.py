"""F5's attribution benchmark: how often each attribution method of ``lyapunov.attribution_scores`` ranks the true
token of a synthetic prompt (``synthetic.prompts``) first (hit@1) or in its top three (hit@3).

The synthetic language knows which earlier token each prediction depends on (the antecedent of a pronoun, the first
occurrence of a copied word); scoring the methods against it turns the paper's qualitative Fig. 3 into a measurement.
``attribution_benchmark`` ranks the methods' scores per prompt (cached by a hash of the model and the prompts),
``summarize`` and ``over_seeds`` turn the ranks into hit rates, ``plot_summary`` draws them, ``claim`` tests the paper's
claim on the per-prompt hits and ``headline`` gives the numbers the book quotes.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import equinox as eqx
import haliax as hax
import jax.numpy as jnp
import numpy as np
import pandas as pd
from levanter.layers.attention import AttentionMask
from levanter.utils.tree_utils import inference_mode
from tqdm.auto import tqdm

from ..data.synthetic import VOCABULARY, Prompt, encode
from ..numerics import cached, fingerprint
from .lyapunov import METHOD_KEYS, attribution_scores
from .seeds import MCNEMAR, Comparison, compare, mcnemar


def attribution_benchmark(model, items: list[Prompt], *, methods=None, cache_dir: str | Path | None = None,
                          progress: bool = True) -> pd.DataFrame:
    """Per prompt: the model's prediction, and for each attribution method the rank of the true token.

    Scores are computed for the last position (which predicts the answer); the output position itself and the BOS
    token are excluded from the ranking, since the question is which *earlier* token drives the prediction. The
    ranking uses finite scores only (``_rank``): a score that is not finite (NaN, or +-inf: a Lyapunov exponent is
    -inf where a step's tangent map I + h J is singular) ranks below every finite one, and a true token whose own
    score is not finite ranks last, whatever the other scores; each row says how often this happened.
    ``methods``: ``{name: fn(model, ids, out) -> scores [n]}``; by default every method of
    ``lyapunov.attribution_scores`` (``lyapunov.METHODS``), computed together per prompt. With ``cache_dir`` (default
    methods only) the table is read from / written to ``cache_dir/attribution-<hash>.csv``, the hash covering the
    model's configuration and weights and the prompts. ``progress``: show a progress bar (a notebook executed by
    Papermill would store every update of it).
    Returns a DataFrame with one row per (prompt, method): ``rank`` of the true token among the candidates,
    ``truth_finite`` (whether its score is finite), ``nonfinite`` (how many candidates' scores are not), ``task``,
    ``correct_prediction``, ``length``; ``summarize`` turns it into hit rates.
    """
    if cache_dir is not None and methods is not None:
        raise ValueError("cache_dir caches the default methods only")
    # version 2: ranks over finite scores only, and the truth_finite and nonfinite columns
    key = {"model": fingerprint(model), "prompts": [dataclasses.asdict(p) for p in items], "version": 2}
    return cached(cache_dir, "attribution", key, lambda: _benchmark(model, items, methods, progress),
                  save=lambda frame, p: frame.to_csv(p, index=False), load=pd.read_csv, suffix=".csv")


def _benchmark(model, items: list[Prompt], methods, progress: bool) -> pd.DataFrame:
    if methods is None:
        def score_all(m, ids, out):
            return attribution_scores(m, ids, out)
    else:
        def score_all(m, ids, out):
            return pd.DataFrame({name: np.asarray(fn(m, ids, out), dtype=float) for name, fn in methods.items()})

    index = {i: w for i, w in enumerate(VOCABULARY)}
    length = model.config.max_seq_len
    rows = []
    for p_i, item in enumerate(tqdm(items, desc="attribution benchmark", disable=not progress)):
        ids = encode(item)
        if len(ids) > length:
            raise ValueError(f"prompt {p_i} has {len(ids)} tokens, more than model.max_seq_len = {length}")
        out = len(ids) - 1
        # Every prompt is padded to seq_len after its output position: a causal model's scores for positions up to
        # `out` do not see the padding, and one shape means one compilation for all prompts.
        padded = np.concatenate([ids, np.zeros(length - len(ids), np.int32)])
        named = hax.named(jnp.asarray(padded), "position")
        logits = np.asarray(_logits(model, named))[out]
        predicted = index.get(int(np.argmax(logits[: len(VOCABULARY)])), "?")
        truth = item.true_position + 1  # + BOS
        table = score_all(model, named, out)
        for name in [c for c in table.columns if c != "text"]:
            scores = table[name].to_numpy(dtype=float)[: out + 1]
            candidates = scores[1:-1]  # drop BOS and the output position
            finite = np.isfinite(candidates)
            rows.append({"prompt": p_i, "task": item.task, "method": name, "rank": _rank(candidates, truth - 1),
                         "truth_finite": bool(finite[truth - 1]), "nonfinite": int(np.sum(~finite)),
                         "correct_prediction": predicted == item.answer, "length": len(ids)})
    return pd.DataFrame(rows)


def _rank(candidates: np.ndarray, truth: int) -> int:
    """The 1-based rank of ``candidates[truth]`` when the candidates are sorted by score, highest first.

    Only finite scores are ranked. A score that is not finite is no measurement of influence: NaN compares False
    with everything, and a sort or argmax places it by accident (``np.argmax`` returns the first NaN's index;
    ``np.nan_to_num`` would turn +inf into the largest float and -inf and NaN into a tie broken by position, so a
    true token tied at -inf with the tokens after it would be ranked first among them). So: a finite truth's rank is
    counted among the finite scores (every non-finite one ranks below it), and a truth whose score is not finite
    ranks last (``len(candidates)``). Ties between finite scores go to the earlier token (a stable sort).
    """
    candidates = np.asarray(candidates, dtype=float)
    if not np.isfinite(candidates[truth]):
        return len(candidates)
    keyed = np.where(np.isfinite(candidates), candidates, -np.inf)
    order = np.argsort(-keyed, kind="stable")
    return int(np.where(order == truth)[0][0]) + 1


def _logits(model, ids):
    """The model's logits [position, vocab] for one sequence, in inference mode (compiled once per shape)."""
    return _compiled_logits(inference_mode(model, True), ids)


@eqx.filter_jit
def _compiled_logits(model, ids):
    return model(ids, AttentionMask.causal()).rearrange(("position", "vocab")).array


def summarize(results: pd.DataFrame) -> pd.DataFrame:
    """Hit rates per task and method (and per seed, where ``results`` has a ``seed`` column: the benchmark of each
    seed's model, concatenated), with the model's accuracy on the task and what a random ranking would score.

    Columns: ``hit_at_1``, ``hit_at_3`` (fraction of prompts whose true token the method ranks first / in its top
    three), ``chance_at_1``, ``chance_at_3`` (the same for a uniformly random ranking of the c = length - 2 candidate
    tokens: the mean of min(k, c) / c), ``model_accuracy`` (fraction of prompts whose answer is the model's top
    prediction), ``hit_at_1_correct`` (hit@1 over the prompts the model gets right; NaN if none), ``prompts``, and
    how often a score was not finite (ranked below every finite one; ``attribution_benchmark``): ``nonfinite_scores``
    (candidate scores, summed over prompts) and ``truth_nonfinite`` (prompts whose true token's score was not finite,
    ranked last).
    """
    results = results if "seed" in results else results.assign(seed=0)
    candidates = (results["length"] - 2).clip(lower=1)
    table = results.assign(hit1=results["rank"] <= 1, hit3=results["rank"] <= 3,
                           chance1=1.0 / candidates, chance3=np.minimum(3, candidates) / candidates,
                           hit1_correct=(results["rank"] <= 1).where(results["correct_prediction"].astype(bool)),
                           truth_nonfinite=~results["truth_finite"].astype(bool))
    summary = table.groupby(["task", "method", "seed"], sort=False).agg(
        hit_at_1=("hit1", "mean"), hit_at_3=("hit3", "mean"), chance_at_1=("chance1", "mean"),
        chance_at_3=("chance3", "mean"), model_accuracy=("correct_prediction", "mean"),
        hit_at_1_correct=("hit1_correct", "mean"), prompts=("prompt", "nunique"), nonfinite_scores=("nonfinite", "sum"),
        truth_nonfinite=("truth_nonfinite", "sum"))
    return summary.reset_index()


def over_seeds(summary: pd.DataFrame) -> pd.DataFrame:
    """``summarize``'s rows averaged over seeds, per task and method: every rate is the mean over the seeds' models,
    ``hit_at_1_sd`` its standard deviation (NaN with one seed), ``seeds`` their number; the counts of scores that
    were not finite are summed."""
    grouped = summary.groupby(["task", "method"], sort=False)
    out = grouped[["hit_at_1", "hit_at_3", "chance_at_1", "chance_at_3", "model_accuracy",
                   "hit_at_1_correct"]].mean()
    out.insert(1, "hit_at_1_sd", grouped["hit_at_1"].std())
    out["prompts"] = grouped["prompts"].first()
    out["seeds"] = grouped["seed"].nunique()
    out[["nonfinite_scores", "truth_nonfinite"]] = grouped[["nonfinite_scores", "truth_nonfinite"]].sum()
    return out.reset_index()


def plot_summary(summary: pd.DataFrame):
    """Hit@1 (dark) and hit@3 (light) of every method, one panel per task (means over seeds, each seed's hit@1 as a
    dot where there are several), with a random ranking's hit@1 and hit@3 as dashed and dotted lines; the model's
    accuracy on the task is in the panel's title."""
    import matplotlib.pyplot as plt

    mean = over_seeds(summary)
    tasks = list(dict.fromkeys(mean["task"]))
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.6 * len(tasks), 3.8), sharey=True, squeeze=False,
                             layout="constrained")
    for ax, task in zip(axes[0], tasks):
        sub = mean[mean["task"] == task]
        x = np.arange(len(sub))
        ax.bar(x - 0.2, sub["hit_at_1"], width=0.4, color="C0", label="hit@1")
        ax.bar(x + 0.2, sub["hit_at_3"], width=0.4, color="C0", alpha=0.4, label="hit@3")
        if sub["seeds"].max() > 1:
            for i, method in enumerate(sub["method"]):
                per_seed = summary[(summary["task"] == task) & (summary["method"] == method)]["hit_at_1"]
                ax.plot(np.full(len(per_seed), i - 0.2), per_seed, "o", ms=3, color="k",
                        label="hit@1 of each seed" if i == 0 else None)
        ax.axhline(sub["chance_at_1"].mean(), color="0.3", ls="--", lw=1, label="random ranking, hit@1")
        ax.axhline(sub["chance_at_3"].mean(), color="0.3", ls=":", lw=1, label="random ranking, hit@3")
        ax.set_xticks(x, sub["method"], rotation=30, ha="right", fontsize=8)
        ax.set_ylim(0, 1)
        seeds = int(sub["seeds"].max())
        ax.set_title(f"{task}: model accuracy {sub['model_accuracy'].iloc[0]:.2f}, "
                     f"{int(sub['prompts'].iloc[0])} prompts" + (f", {seeds} seeds" if seeds > 1 else ""),
                     fontsize=9)
    axes[0, 0].set_ylabel("fraction of prompts")
    axes[0, 0].legend(fontsize=7, frameon=False)
    fig.suptitle("Does the top-ranked input token match the ground truth?", fontsize=10)
    return fig


CLAIM = ("lyapunov (max exponent)", "raw attention")
"""The paper's claim, compared per task: the largest Lyapunov exponent attributes better than attention weights."""


def headline(results: pd.DataFrame) -> dict[str, str]:
    """The numbers (as text) the book's prose quotes about the benchmark, keyed for ``figures.glue``, from the
    per-prompt results of ``attribution_benchmark`` (with a ``seed`` column where there are several seeds' models).

    For each task t and method (short key k of ``lyapunov.METHOD_KEYS``): ``hit1_t_k`` (mean over seeds, ``± sd``
    with several), ``hit3_t_k``, ``hit1_correct_t_k`` (hit@1 over the prompts the model gets right; "n/a" if none);
    per task: ``accuracy_t``, ``chance1_t``, ``chance3_t``, ``prompts_t``, ``seeds_t``, ``best_t`` (the method with
    the highest mean hit@1, ties listed; "none" when every method ties), ``claim_t`` (the largest exponent's hit@1
    against attention's: ``verdicts``' text), ``nonfinite_t`` and ``truth_nonfinite_t`` (``summarize``'s counts of
    scores that were not finite, summed over the methods and seeds: the hit rates rank finite scores only).
    """
    summary = summarize(results)
    mean = over_seeds(summary)
    out = {}
    for task, sub in mean.groupby("task", sort=False):
        for row in sub.itertuples():
            key = METHOD_KEYS.get(row.method, row.method.replace(" ", "_"))
            sd = "" if pd.isna(row.hit_at_1_sd) else f" ± {row.hit_at_1_sd:.2f}"
            out[f"hit1_{task}_{key}"] = f"{row.hit_at_1:.2f}{sd}"
            out[f"hit3_{task}_{key}"] = f"{row.hit_at_3:.2f}"
            correct = row.hit_at_1_correct
            out[f"hit1_correct_{task}_{key}"] = "n/a" if pd.isna(correct) else f"{correct:.2f}"
        out[f"accuracy_{task}"] = f"{sub['model_accuracy'].iloc[0]:.2f}"
        out[f"chance1_{task}"] = f"{sub['chance_at_1'].iloc[0]:.2f}"
        out[f"chance3_{task}"] = f"{sub['chance_at_3'].iloc[0]:.2f}"
        out[f"prompts_{task}"] = f"{int(sub['prompts'].iloc[0])}"
        seeds = int(sub["seeds"].max())
        out[f"seeds_{task}"] = f"{seeds} seed" + ("s" if seeds > 1 else "")
        out[f"nonfinite_{task}"] = f"{int(sub['nonfinite_scores'].sum())}"
        out[f"truth_nonfinite_{task}"] = f"{int(sub['truth_nonfinite'].sum())}"
        best = list(sub[sub["hit_at_1"] == sub["hit_at_1"].max()]["method"])
        if len(best) == len(sub):
            out[f"best_{task}"] = f"none: all methods tie at {sub['hit_at_1'].max():.2f}"
        else:
            out[f"best_{task}"] = best[0] if len(best) == 1 else ", ".join(best[:-1]) + " and " + best[-1]
        if set(CLAIM) <= set(sub["method"]):
            out[f"claim_{task}"] = verdicts(results)[f"f5_{task}"].text()
    return out


def verdicts(results: pd.DataFrame) -> dict:
    """The verdicts on F5's claims (``claims.CLAIMS``: ``f5_agreement``, ``f5_induction``), each from ``claim`` on
    its task's per-prompt results; a task the results do not hold is untested."""
    from . import claims

    out = {}
    for task in ("agreement", "induction"):
        name, rows = f"f5_{task}", results[results["task"] == task]
        if rows.empty or not set(CLAIM) <= set(rows["method"]):
            out[name] = claims.untested(name, f"no {task} prompts were scored by both methods")
            continue
        c, _ = claim(rows)
        note = "the prompt is the unit (one model): share of prompts won less share lost" if c.test == MCNEMAR else ""
        out[name] = claims.judge(name, c, note=note)
    return out


def claim(results: pd.DataFrame) -> tuple[Comparison, float]:
    """The paper's claim (``CLAIM``) on one task's per-prompt results: the largest exponent's hits at 1 against
    attention's, judged by ``seeds.RULE``, and the difference of their hit@1 rates (means over prompts and seeds).

    With several seeds' models the unit is the model: each seed's model gives one hit@1 rate per method, and the
    paired t-test over the seeds (``seeds.compare(..., paired=True)``: both methods read the same model) asks
    whether the difference holds from one training run to the next. Testing the prompts pooled over the models
    (McNemar's test, a prompt counted once) asks only whether it holds for these models, whose hit rates differ far
    more than the prompts show (two builds that disagreed: the method page, "Judging a difference"). With one seed's
    model, the prompt is the unit: the exact McNemar test on its per-prompt hits (``seeds.mcnemar``). Only prompts
    every seed's model answered are compared."""
    results = results[results["method"].isin(CLAIM)]
    results = results if "seed" in results else results.assign(seed=0)
    hits = results.assign(hit=(results["rank"] <= 1).astype(int)).pivot_table(
        index="prompt", columns=["method", "seed"], values="hit").dropna()
    a, b = (hits[m].to_numpy() for m in CLAIM)
    if a.ndim == 2 and a.shape[1] > 1:
        return compare(a.mean(axis=0), b.mean(axis=0), paired=True), float(a.mean() - b.mean())
    return mcnemar(a, b), float(a.mean() - b.mean())
