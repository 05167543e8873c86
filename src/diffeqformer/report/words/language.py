"""The words of F6 (perplexity), F11 (downstream tasks) and x1 (adaptive steps): headlines, table cells, model names."""

from __future__ import annotations

import math

import pandas as pd

from ...analysis import multiplicity, statistics
from ...data import tasks as held_out
from . import statistics as wording

MODEL_LABELS = {"gpt": "GPT-2", "shared": "weight-shared", "ours": "DiffEqFormer", "llama": "Llama",
                "ours_llama": "DiffEqFormer (Llama)"}
"""How the book names F6's base models (the keys of F11's ``runs``), in the order tables and legends list them."""


def f6_headline(table) -> dict[str, str]:
    """The numbers F6's prose quotes from ``perplexity.final_table``: GPT-2's and DiffEqFormer's final validation
    perplexity (mean ± sd over seeds), the change between them, their parameters, the steps and the seeds. Needs the
    rows ``gpt`` and ``ours``."""
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
    out = {"seeds": ", ".join(f"{MODEL_LABELS.get(m, m)} {n}" for m, n in
                              means.groupby("model", sort=False).seeds.max().items())}
    means = means.set_index(["task", "shots", "metric", "model"])
    for row in found[(found.model == "ours") & (found.baseline == "gpt")].itertuples():
        if row.task in held_out.TASKS:
            ours, gpt = (means.loc[(row.task, row.shots, row.metric, m)] for m in ("ours", "gpt"))
            d = _digits(row.metric)
            out[f"{row.task.removeprefix('shakespeare_')}_{row.metric}_{row.shots}"] = (
                f"{ours['mean']:.{d}f} against {gpt['mean']:.{d}f} ({wording.comparison(row.comparison, d)})")
    judged = exploratory[~exploratory.verdict.str.startswith(statistics.UNTESTED)]
    hits = judged[judged.verdict == statistics.SIGNIFICANT]
    listed = "; ".join(
        f"{MODEL_LABELS.get(r.model, r.model)} {'below' if r.difference < 0 else 'above'} "
        f"{MODEL_LABELS.get(r.baseline, r.baseline)} on {r.task} {r.metric} {r.shots}-shot (p = {r.p:.2g})"
        for r in hits.itertuples())
    untested = len(exploratory) - len(judged)
    out["verdicts"] = (f"Besides the primary test, {len(judged)} comparisons have seeds to judge them by; they are "
                       f"exploratory: with no true difference anywhere, "
                       f"{multiplicity.chance_count(len(judged)):.1f} of them would come out significant at 5% by "
                       f"chance, and {len(hits)} "
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


def x1_against_f6(run_dir, num_sequences: int) -> str:
    """x1's sentence on why its own-steps perplexity is not F6's for the same model: the validation sequences each
    reads (``train.evaluated_examples`` for the training's evaluation, which F6 reports) and the seeds."""
    from ...runs import config as run_config
    from ...train import evaluated_examples

    trainer = run_config(run_dir).trainer
    examples = evaluated_examples(trainer)
    read = "the whole validation split" if examples is None else f"the first {examples} validation sequences"
    return (f"Its own-steps perplexity is not F6's for the same model: F6 reports the training's last evaluation, "
            f"over {read} (as far as the split holds them), as the mean over the seeds' models (their number is in "
            f"F6's table); this page evaluates the first {num_sequences} sequences with the seed-0 model alone. The "
            "model and its steps are the same; the sequences and seeds are not.")
