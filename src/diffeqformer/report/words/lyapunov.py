"""F5's words: the Lyapunov scores' and the attribution benchmark's headlines."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ...analysis import attribution, lyapunov
from . import statistics as wording


def lyapunov_headline(scores: pd.DataFrame, timing: pd.DataFrame | None = None, *, tokenizer=None) -> dict[str, str]:
    """The numbers and tokens (as text) F5's prose quotes about one example, keyed for ``figures.glue``.

    ``scores``: ``attribution.attribution_scores`` (with ``text``); ``timing``: ``lyapunov.timings``. Keys: ``tokens``,
    ``output_token`` (the token at the output position), ``top_<key>`` per method (``attribution.METHOD_KEYS``): its
    three highest-scoring earlier tokens, quoted, best first (the output position itself is left out, as in the
    attribution benchmark; only finite scores are ranked, so fewer than three when fewer are finite);
    ``nonfinite_example``, how many earlier tokens' scores are not finite, summed over the methods; with ``timing``:
    ``time_fast``, ``time_direct`` (median seconds), ``speedup``, ``max_difference`` (over the exponents finite in
    both methods), ``finite_exponents`` (their number) and ``nonfinite_exponents`` (the others, non-finite in both);
    with ``tokenizer``: ``predicted``, the model's top next token at the output position.
    """
    out = scores.attrs["output_position"]
    labels = list(scores["text"]) if "text" in scores else [str(i) for i in scores.index]

    def quoted(i):
        return repr(labels[i].strip() or labels[i])

    result = {"tokens": f"{len(scores)}", "output_token": quoted(out)}
    if tokenizer is not None:
        word = lyapunov.one_line(tokenizer.decode([scores.attrs["predicted_token"]]))
        result["predicted"] = repr(word.strip() or word)
    earlier = scores.iloc[:out]
    nonfinite = 0
    for method, key in attribution.METHOD_KEYS.items():
        values = earlier[method].astype(float)
        finite = np.isfinite(values)
        nonfinite += int((~finite).sum())
        best = values[finite].nlargest(3).index  # nlargest keeps +-inf: +inf would come first
        result[f"top_{key}"] = ", ".join(quoted(i) for i in best)
    result["nonfinite_example"] = f"{nonfinite}"
    if timing is not None:
        result["time_fast"] = f"{timing['median_s'].iloc[0]:.2g}"
        result["time_direct"] = f"{timing['median_s'].iloc[1]:.2g}"
        result["speedup"] = f"{timing.attrs['speedup']:.1f}"
        result["max_difference"] = f"{timing.attrs['max_abs_difference']:.1e}"
        result["finite_exponents"] = f"{timing.attrs['finite_exponents']}"
        result["nonfinite_exponents"] = f"{timing.attrs['nonfinite_exponents']}"
    return result


def attribution_headline(results: pd.DataFrame) -> dict[str, str]:
    """The numbers (as text) F5's prose quotes about the benchmark, keyed for ``figures.glue``, from the per-prompt
    results of ``attribution.attribution_benchmark`` (with a ``seed`` column where there are several seeds' models).

    For each task t and method (short key k of ``attribution.METHOD_KEYS``): ``hit1_t_k`` (mean over seeds, ``± sd``
    with several), ``hit3_t_k``, ``hit1_correct_t_k`` (hit@1 over the prompts the model gets right; "n/a" if none);
    per task: ``accuracy_t``, ``chance1_t``, ``chance3_t``, ``prompts_t``, ``seeds_t``, ``best_t`` (the method with
    the highest mean hit@1, ties listed; "none" when every method ties), ``claim_t`` (the largest exponent's hit@1
    against attention's: ``attribution.verdicts``' text), ``nonfinite_t`` and ``truth_nonfinite_t`` (the counts of
    scores that were not finite, summed over the methods and seeds: the hit rates rank finite scores only).
    """
    mean = attribution.over_seeds(attribution.summarize(results))
    out = {}
    for task, sub in mean.groupby("task", sort=False):
        for row in sub.itertuples():
            key = attribution.METHOD_KEYS.get(row.method, row.method.replace(" ", "_"))
            sd = "" if pd.isna(row.hit_at_1_sd) else f" ± {row.hit_at_1_sd:.2f}"
            out[f"hit1_{task}_{key}"] = f"{row.hit_at_1:.2f}{sd}"
            out[f"hit3_{task}_{key}"] = f"{row.hit_at_3:.2f}"
            correct = row.hit_at_1_correct
            out[f"hit1_correct_{task}_{key}"] = "n/a" if pd.isna(correct) else f"{correct:.2f}"
        for key, column in (("accuracy", "model_accuracy"), ("chance1", "chance_at_1"), ("chance3", "chance_at_3")):
            out[f"{key}_{task}"] = f"{sub[column].iloc[0]:.2f}"
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
        if set(attribution.CLAIM) <= set(sub["method"]):
            out[f"claim_{task}"] = wording.verdict(attribution.verdicts(results)[f"f5_{task}"])
    return out
