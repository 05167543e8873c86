"""The sentences the book's pages show: headlines, labels and the wording of what an analysis found.

The analyses compute and return data (``diffeqformer.analysis``); the plots draw it (``diffeqformer.report.plots``);
this module words it, in one place, so that a page's prose and the Verdicts page never say a thing two ways. Each
function takes the data an analysis returned and returns text (Markdown where it is a sentence of a page).
"""

from __future__ import annotations

import math
import re
from typing import Mapping, Sequence

import numpy as np
import pandas as pd
import xarray as xr

from ..analysis import attribution, clustering, lyapunov, spectra

# ----------------------------------------------------------------------------------------------------------------------
# F2: eigenvalue spectra (analysis.spectra)


def growth_trend(comparison, slopes: Sequence[float]) -> str:
    """How a spectral radius moves with depth, as a phrase, from ``spectra.depth_growth``'s test and per-seed slopes."""
    if all(s == 0 for s in slopes):
        return "is constant"
    if comparison.untested:
        return f"is untested ({comparison.verdict.split(': ', 1)[1]})"
    if not comparison.significant:
        return "shows no trend its seeds can tell from their spread (inconclusive)"
    return "grows with depth" if comparison.difference > 0 else "shrinks with depth"


def growth_words(row) -> str:
    """One row of ``spectra.depth_growth`` in words: ``slope -1.20 per unit t (x0.37 over the grid), 95% CI [-2.1,
    -0.3], p = 0.03, one-sample t-test over 3 seeds: significant``; untested: ``slope ... (x0.37 over the grid):
    untested: 1 seed``."""
    c = row["comparison"]
    head = f"slope {row['slope']:+.2f} per unit t (x{row['factor']:.2f} over the grid)"
    return f"{head}: {c.verdict}" if c.untested else f"{head}, {c.interval(2)} over {c.n} seeds: {c.verdict}"


def _values(values, fmt: str) -> str:
    return ", ".join("n/a" if not np.isfinite(v) else format(v, fmt) for v in values)


def growth_table(growth: pd.DataFrame) -> pd.DataFrame:
    """``spectra.depth_growth`` as the book shows it: the trend in words, the test's 95% interval (blank without one:
    untested, or an exact test of seeds without spread) and p, the per-seed values as text."""
    out = growth.drop(columns=["comparison", "slopes", "spearman", "peak_time", "positivity"])
    out.insert(out.columns.get_loc("verdict") + 1, "trend",
               [growth_trend(c, s) for c, s in zip(growth.comparison, growth.slopes)])
    out.insert(out.columns.get_loc("verdict"), "95% CI", [
        "" if c.untested or not np.isfinite(c.low) else f"[{c.low:+.2f}, {c.high:+.2f}]" for c in growth.comparison])
    out.insert(out.columns.get_loc("verdict"), "p", [c.p for c in growth.comparison])
    out["slope per seed"] = [_values(v, "+.2f") for v in growth.slopes]
    out["Spearman per seed"] = [_values(v, "+.2f") for v in growth.spearman]
    out["peak t per seed"] = [_values(v, ".2f") for v in growth.peak_time]
    return out


def spectra_headline(layers: Mapping[str, Sequence], zoom=None, *, ode: str = "ours") -> dict[str, str]:
    """The numbers (as text) F2's prose quotes, keyed for ``figures.glue``.

    ``layers``: every model's spectra on its own depth grid, one dataset per seed (``spectra.seed_spectra``);
    ``zoom``: the ODE's spectra on a grid that resolves e(t) (``spectra.resolving_times``); ``ode``: the key of the
    DiffEqFormer. Per model key k and matrix m, from ``spectra.depth_growth``: ``trend_k_m`` (``growth_trend``),
    ``growth_k_m`` (``growth_words``), ``spearman_k_m``, ``peak_k_m``, ``positivity_k_m`` (per seed),
    ``change_layers_k_m``, ``seeds_k``; ``points`` (the ODE's Euler steps); with ``zoom``: ``change_zoom_m``,
    ``zoom_spacing``, ``period`` (2 pi / s).
    """
    out = {}
    for row in spectra.depth_growth(layers).itertuples(index=False):
        key = f"{row.model}_{row.matrix}"
        out[f"trend_{key}"] = growth_trend(row.comparison, row.slopes)
        out[f"growth_{key}"] = growth_words(row._asdict())
        out[f"spearman_{key}"] = _values(row.spearman, "+.2f")
        out[f"peak_{key}"] = _values(row.peak_time, ".2f")
        out[f"positivity_{key}"] = _values(row.positivity, "+.2f")
        out[f"change_layers_{key}"] = f"{row.change:.2f}"
        out[f"seeds_{row.model}"] = str(row.seeds)
    out["points"] = str(layers[ode][0].sizes[spectra.depth_dim(layers[ode][0])])
    if zoom is not None:
        zoom_change = spectra.mean_change(zoom)
        for m in spectra.MATRICES:
            out[f"change_zoom_{m}"] = f"{float(zoom_change[m]):.3f}"
        out["zoom_spacing"] = f"{float(np.diff(zoom['time'].values).mean()):.2g}"
        out["period"] = f"{2 * np.pi / spectra.config_of(zoom).sinusoidal_scale:.2g}"
    return out


# ----------------------------------------------------------------------------------------------------------------------
# F3: trajectories (analysis.trajectories)


def trajectories_verdict_texts(table: pd.DataFrame, digits: int = 2) -> dict[str, str]:
    """Each row of an ``analysis.clustering`` verdict table as one line for the prose, keyed by a slug of its comparison
    (``g1_vs_t2``, ``trend``, ``g_t2``, ``fraction_at_t_1``): ``+0.65 [-0.09, +1.38], p = 0.063, paired t-test:
    inconclusive`` (for the trend: the slope per unit p), or ``untested: 1 seed``."""
    out = {}
    for _, row in table.iterrows():
        slug = (row["comparison"].replace("trend over p", "trend").replace("g = 1 vs g = ", "g1_vs_")
                .replace("g = ", "g_").replace("^", ""))
        slug = re.sub(r"_+", "_", re.sub(r"[^a-z0-9]", "_", slug.lower())).strip("_")
        if row["verdict"].startswith("untested"):
            out[slug] = row["verdict"]
            continue
        p = f"p = {row['p']:.2g}" if row["p"] >= 1e-3 else "p < 0.001"
        interval = "" if math.isnan(row["low"]) else f" [{row['low']:+.{digits}f}, {row['high']:+.{digits}f}]"
        out[slug] = f"{row['difference']:+.{digits}f}{interval}, {p}, {row['test']}: {row['verdict']}"
    return out


def _power_key(power: float) -> str:
    return f"p{power:g}".replace(".", "_")


def _monotone(values) -> str:
    """'rises', 'falls' or 'is not monotone' for a sequence (ties allowed), 'is constant' when all are equal."""
    v = np.asarray(values, dtype=float)
    d = np.diff(v)
    if np.all(np.abs(d) < 1e-12):
        return "is constant"
    if np.all(d >= -1e-12):
        return "rises"
    if np.all(d <= 1e-12):
        return "falls"
    return "is not monotone"


def trajectories_headline(polynomial: "dict[str, xr.Dataset]", driven: "dict[str, xr.Dataset] | None" = None,
                          threshold: float = 0.999, convergence: xr.Dataset | None = None) -> dict[str, str]:
    """The numbers (as text) the book's prose quotes about the trajectories, keyed for ``figures.glue``: final-time
    ``clustering_metrics``, means over seeds (or heads and trained seeds).

    ``polynomial``: ``{name: trajectories.simulate(...)}``, giving ``fraction_<name>_p<p>``, ``clusters_<name>_p<p>``
    (``p2``, ``p0_5``), ``fraction_trend_<name>`` (rises / falls / is not monotone as p grows), ``seeds_<name>``,
    ``failed_<name>`` (unfinished solves), ``num_tokens``, ``horizon``. ``driven``: ``{name: [simulate_model(...) per
    trained seed]}`` (or one Dataset), giving ``model_fraction_<name>``, ``model_clusters_<name>``,
    ``model_distance_<name>``, ``model_fraction_at1_<name>`` (at the saved time nearest t = 1, the end of the trained
    range), ``model_heads_<name>``, ``model_runs_<name>``, ``model_horizon``. ``convergence``
    (``clustering.step_convergence``): ``sweep_max`` (its most Euler steps), ``sweep_fraction_p<p>``.
    """
    out = {}
    for name, ds in polynomial.items():
        table = clustering.final_metrics(clustering.clustering_metrics(ds, threshold))
        for p, (_, row) in zip(ds["growth"].values, table.iterrows()):
            out[f"fraction_{name}_{_power_key(float(p))}"] = f"{row['fraction_mean']:.2f}"
            out[f"clusters_{name}_{_power_key(float(p))}"] = f"{row['clusters_mean']:.1f}"
        out[f"fraction_trend_{name}"] = _monotone(table["fraction_mean"].to_numpy())
        out[f"seeds_{name}"] = f"{ds.sizes['seed']}"
        out[f"failed_{name}"] = f"{int((~ds['success'].astype(bool)).sum())}"
        out["num_tokens"] = f"{ds.sizes['token']}"
        out["horizon"] = f"{float(ds['time'].values[-1]):g}"
    for name, runs in (driven or {}).items():
        runs = list(runs) if isinstance(runs, (list, tuple)) else [runs]
        finals = [clustering.clustering_metrics(ds.isel(time=[-1]), threshold).isel(time=0) for ds in runs]
        for metric, digits in (("fraction", 2), ("clusters", 1), ("distance", 2)):
            value = np.mean([float(f[metric].mean()) for f in finals])
            out[f"model_{metric}_{name}"] = f"{value:.{digits}f}"
        at1 = clustering.model_final(runs, 1.0, "fraction", threshold)
        out[f"model_fraction_at1_{name}"] = f"{float(np.mean(at1)):.2f}"
        out[f"model_heads_{name}"] = f"{runs[0].sizes['head']}"
        out[f"model_runs_{name}"] = f"{len(runs)}"
        out["model_horizon"] = f"{float(runs[0]['time'].values[-1]):g}"
    if convergence is not None:
        last = convergence.isel(steps=-1)
        out["sweep_max"] = f"{int(last['steps']):,}"
        for p in convergence["growth"].values:
            out[f"sweep_fraction_{_power_key(float(p))}"] = f"{float(last['fraction'].sel(growth=p).mean()):.2f}"
    return out



# ----------------------------------------------------------------------------------------------------------------------
# F5: Lyapunov exponents and attribution (analysis.lyapunov, analysis.attribution)


def lyapunov_headline(scores: pd.DataFrame, timing: pd.DataFrame | None = None, *, tokenizer=None,
                      top: int = 3) -> dict[str, str]:
    """The numbers and tokens (as text) F5's prose quotes about one example, keyed for ``figures.glue``.

    ``scores``: ``attribution.attribution_scores`` (with ``text``); ``timing``: ``lyapunov.timings``. Keys: ``tokens``,
    ``output_token`` (the token at the output position), ``top_<key>`` per method (``attribution.METHOD_KEYS``): its
    ``top`` highest-scoring earlier tokens, quoted, best first (the output position itself is left out, as in the
    attribution benchmark; only finite scores are ranked, so fewer than ``top`` when fewer are finite);
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
        best = values[finite].nlargest(top).index  # nlargest keeps +-inf: +inf would come first
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
        if set(attribution.CLAIM) <= set(sub["method"]):
            out[f"claim_{task}"] = attribution.verdicts(results)[f"f5_{task}"].text()
    return out


# ----------------------------------------------------------------------------------------------------------------------
# F7-F10: fine-tuning and the ablations (analysis.ablations)


# ----------------------------------------------------------------------------------------------------------------------
# F6, F11, x1: perplexity, downstream tasks, adaptive steps (analysis.perplexity, analysis.downstream, analysis.inference)

MODEL_LABELS = {"gpt": "GPT-2", "shared": "weight-shared", "ours": "DiffEqFormer", "llama": "Llama",
                "ours_llama": "DiffEqFormer (Llama)"}
"""How the book names F6's base models (the keys of F11's ``runs``), in the order tables and legends list them."""


def f6_headline(table) -> dict[str, str]:
    """The numbers F6's prose quotes from ``perplexity.final_table``: GPT-2's and DiffEqFormer's final validation
    perplexity (mean ± sd over seeds), the change between them, their parameters, the steps and the seeds. Needs the
    rows ``gpt`` and ``ours``."""
    import math

    missing = [k for k in ("gpt", "ours") if k not in table.index]
    if missing:
        raise ValueError(f"F6 needs runs for the rows {missing} (runs={{'gpt': ..., 'ours': ...}})")

    def ppl(key):
        t = table.loc[key]
        return f"{t['final ppl']:.1f}" + (f" ± {t['sd']:.1f}" if t["seeds"] > 1 else "")

    def params(key):
        value = table.loc[key, "params"]
        return f"{value / 1e6:.2f}M" if math.isfinite(value) else "not recorded"

    found = sorted(set(int(n) for n in table["seeds"]))
    return {"ppl_gpt": ppl("gpt"), "ppl_ours": ppl("ours"),
            "change_ours": f"{table.loc['ours', 'vs baseline %']:+.1f}%",
            "params_gpt": params("gpt"), "params_ours": params("ours"),
            "steps": str(table.loc["ours", "steps"]),
            "seeds": " to ".join(map(str, (found[0], found[-1]) if len(found) > 1 else found))
            + (" seed" if found == [1] else " seeds")}


def _digits(metric: str) -> int:
    return 1 if metric == "perplexity" else 3


def f11_table(means, found):
    """F11's table from ``downstream.summary`` and ``downstream.comparisons``: one row per task, shots and metric;
    per model its mean ± sd over seeds; per comparison the difference, p and verdict."""
    import math

    index = ["task", "shots", "metric"]

    def cell(row) -> str:
        digits = _digits(row.metric)
        return f"{row['mean']:.{digits}f}" + ("" if row.seeds < 2 else f" ± {row.sd:.{digits}f}")

    wide = means.assign(cell=means.apply(cell, axis=1)).pivot(index=index, columns="model", values="cell")
    wide = wide[[m for m in MODEL_LABELS if m in wide.columns] + [m for m in wide.columns if m not in MODEL_LABELS]]
    wide.columns = [MODEL_LABELS.get(m, m) for m in wide.columns]
    wide.insert(0, "examples", means.groupby(index).examples.first().reindex(wide.index))
    for (model, baseline), c in found.groupby(["model", "baseline"], sort=False):
        c = c.set_index(index)
        wide[f"{MODEL_LABELS.get(model, model)} vs {MODEL_LABELS.get(baseline, baseline)}"] = c.apply(
            lambda r: f"{r.difference:+.{_digits(r.name[2])}f}, " + (f"p = {r.p:.2g}: " if not math.isnan(r.p) else "")
            + r.verdict, axis=1)
    return wide.reset_index().set_index(index)


def f11_tasks(task_files) -> str:
    """One sentence per held-out task (``data.tasks.TaskFiles``): its examples and how they were built."""
    from ..data import tasks as held_out

    m = task_files.manifest
    c = m["counts"]
    docs = ", ".join(m["documents"])
    return (f"From the held-out documents ({docs}), passages of at most {m['max_tokens']} tokens: "
            f"{held_out.LASTWORD} has {c[held_out.LASTWORD]['test']} test examples (and "
            f"{c[held_out.LASTWORD]['fewshot']} for few-shot prompts) drawn from "
            f"{c[held_out.LASTWORD]['candidates']} passages whose last word, of {held_out.MIN_WORD_LETTERS} letters or "
            f"more and none of the {held_out.COMMON_WORDS} commonest, occurs in an earlier line of the passage and not "
            f"before it in its own line; {held_out.NEXTLINE} has {c[held_out.NEXTLINE]['test']} test examples (and "
            f"{c[held_out.NEXTLINE]['fewshot']} for few-shot prompts) drawn from {c[held_out.NEXTLINE]['candidates']} "
            f"passages, each with the true next line and {held_out.NUM_CHOICES - 1} lines that follow other held-out "
            f"passages, of a length within {held_out.DISTRACTOR_LENGTH:.0%} of it.")


def f11_sentences(means, found, exploratory) -> dict[str, str]:
    """F11's glued texts from ``downstream.summary``, ``downstream.comparisons`` and ``downstream.exploratory``: per
    held-out task, metric and shots, DiffEqFormer's mean against GPT-2's with their comparison; ``seeds`` (how many
    per model); ``verdicts``, how many of the exploratory comparisons came out significant, beside the count
    expected by chance."""
    from ..analysis import seeds
    from ..data import tasks as held_out

    out = {"seeds": ", ".join(f"{MODEL_LABELS.get(m, m)} {n}" for m, n in
                              means.groupby("model", sort=False).seeds.max().items())}
    means = means.set_index(["task", "shots", "metric", "model"])
    for row in found[(found.model == "ours") & (found.baseline == "gpt")].itertuples():
        if row.task in held_out.TASKS:
            ours, gpt = (means.loc[(row.task, row.shots, row.metric, m)] for m in ("ours", "gpt"))
            out[f"{row.task.removeprefix('shakespeare_')}_{row.metric}_{row.shots}"] = (
                f"{ours['mean']:.{_digits(row.metric)}f} against {gpt['mean']:.{_digits(row.metric)}f} ({row.text})")
    judged = exploratory[~exploratory.verdict.str.startswith(seeds.UNTESTED)]
    hits = judged[judged.verdict == seeds.SIGNIFICANT]
    listed = "; ".join(
        f"{MODEL_LABELS.get(r.model, r.model)} {'below' if r.difference < 0 else 'above'} "
        f"{MODEL_LABELS.get(r.baseline, r.baseline)} on {r.task} {r.metric} {r.shots}-shot (p = {r.p:.2g})"
        for r in hits.itertuples())
    untested = len(exploratory) - len(judged)
    out["verdicts"] = (f"Besides the primary test, {len(judged)} comparisons have seeds to judge them by; they are "
                       f"exploratory: with no true difference anywhere, {seeds.chance_count(len(judged)):.1f} of them "
                       f"would come out significant at 5% by chance, and {len(hits)} "
                       f"{'does' if len(hits) == 1 else 'do'}" + (f" ({listed})" if listed else "") + "."
                       + (f" {untested} more {'is' if untested == 1 else 'are'} untested (one seed)." if untested
                          else ""))
    return out


_SOLVERS = {"euler": "Euler", "euler_left": "left-point Euler", "heun": "Heun", "midpoint": "midpoint",
            "tsit5": "Tsit5", "dopri5": "Dopri5", "bosh3": "Bosh3"}


def x1_headline(sweep, by_steps=None) -> dict[str, str]:
    """x1's sentences from an ``inference.solver_sweep`` (and ``inference.perplexity_vs_euler_steps`` frames per
    model name): ``own`` (the model's own L Euler steps), ``best_fixed`` (the best fixed-step setting),
    ``adaptive`` (each adaptive solver at its loosest and tightest tolerance) and ``spread`` (per model, the range
    of perplexity over the step counts)."""
    import pandas as pd

    out = {}
    L = (sweep.attrs.get("model") or {}).get("num_layers")
    own = sweep[(sweep["solver"] == "euler") & (sweep["steps"] == L)]
    if not len(own) and by_steps:  # the step counts of the sweep left out L: the first model's Euler frame has it
        first = next(iter(by_steps.values()))
        own = first[(first["solver"] == "euler") & (first["steps"] == L)]
    out["own"] = (f"{own['perplexity'].iloc[0]:.1f} with its own {L} Euler steps (NFE {L})" if len(own)
                  else f"not evaluated with its own {L} Euler steps (L is not among the step counts)")
    fixed = sweep[~sweep["adaptive"] & sweep["loss"].notna()]
    if len(fixed):
        b = fixed.loc[fixed["perplexity"].idxmin()]
        out["best_fixed"] = (f"{b['perplexity']:.1f} with {_SOLVERS.get(b['solver'], b['solver'])} at {b['steps']} "
                             f"steps (NFE {b['nfe']:.0f})")
    texts = []
    for solver, rows in sweep[sweep["adaptive"]].groupby("solver", sort=False):
        rows = rows.sort_values("tolerance")
        ends = rows.iloc[[-1, 0]] if len(rows) > 1 else rows
        parts = [(f"{r.perplexity:.1f}" if pd.notna(r.loss) else "no result (max_steps)")
                 + f" at tolerance {r.tolerance:g} (NFE {r.nfe:.0f})" for r in ends.itertuples()]
        texts.append(f"{_SOLVERS.get(solver, solver)}: " + ", ".join(parts))
    out["adaptive"] = "; ".join(texts) if texts else "no adaptive solver was evaluated"
    spreads = [f"{name}: {p.min():.1f} to {p.max():.1f} (x{p.max() / p.min():.2f})"
               for name, p in ((n, f[f["solver"] == "euler"]["perplexity"]) for n, f in (by_steps or {}).items())]
    if spreads:
        out["spread"] = "; ".join(spreads)
    return out
