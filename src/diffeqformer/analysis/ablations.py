"""F7-F10: adaptive fine-tuning (Fig. 5) and the ablations (beta2, Fig. 7; d_t, Figs. 14-16 and Table 6;
hypernetwork design, Fig. 18), read from finished runs.

Every function takes run directories (absolute, or relative to ``DIFFEQFORMER_HOME``) and reads what the runs wrote:
``config.yaml``, ``metrics.jsonl``, ``complete.json`` and, for a fine-tuning, ``pretrain_config.yaml``. The only
measurement made here is the time and peak memory of a training step (``measure_training_step``), in a process of
its own per run, because a process's high-water mark cannot be reset everywhere.

    python -m diffeqformer.analysis.ablations --measure runs/cpu-diffeqformer --batch 16 --steps 10
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import statistics
import subprocess
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from .. import use_onednn
from ..config import config_field
from ..report.figures import log_perplexity_axis
from ..runs import config as run_config
from ..runs import (
    is_finetuning,
    median_throughput,
    model_type,
    parameter_count,
    pretrain_config,
    read_metrics,
    require_complete,
    run_path,
    summary,
)
from ..train import next_token_loss
from . import claims, seeds
from .seeds import Comparison, Trend, as_list, compare, spread, trend

# --------------------------------------------------------------------------------------------------- one run


def describe(run) -> dict:
    """What the tables and captions need of one finished run: name, kind (``pretraining`` / ``fine-tuning``),
    model type and depth, data domain, method, Euler steps N of a fine-tuned DiffEqFormer, the pretraining's domain,
    final/best/initial validation perplexity, parameter counts, throughput and wall time."""
    path = require_complete(run)
    done = summary(path)
    config = run_config(path)
    finetune = is_finetuning(path)
    pretraining = pretrain_config(path) if finetune else None
    model = (pretraining or config).model
    metrics = read_metrics(path)
    curve = _eval_curve(metrics, run)
    out = {
        "run": str(run), "name": done.get("name", path.name), "kind": "fine-tuning" if finetune else "pretraining",
        "model": model_type(model), "layers": model.num_layers,
        "hidden_dim": model.hidden_dim, "domain": config.data.domain,
        "method": config.method if finetune else "from scratch",
        "steps": done.get("euler_steps") if finetune else None,
        "source": pretraining.data.domain if finetune else None,
        "final_ppl": done.get("final_eval_perplexity"), "best_ppl": float(curve.perplexity.min()),
        "final_loss": float(curve.eval_loss.iloc[-1]), "best_loss": float(curve.eval_loss.min()),
        "pretrain_seed": (pretraining or config).trainer.seed,
        "initial_ppl": float(curve.perplexity.iloc[0]) if finetune else None,
        "trainable_params": done.get("trainable_params"), "total_params": done.get("total_params"),
        # a population's member (diffeqformer.population) records its share of the population's throughput
        "tokens_per_second": done["tokens_per_second"] if "tokens_per_second" in done else median_throughput(metrics),
        "wall_time_s": done.get("wall_time_s"),
        "train_steps": done.get("steps"), "config": config, "config_hash": done.get("config_hash"),
        "pretrain_config_hash": done.get("pretrain_config_hash"),
    }
    if out["trainable_params"] is None:
        out["trainable_params"] = out["total_params"] = parameter_count(path)
    return out


def eval_curve(run):
    """Validation loss and perplexity against the training step (a fine-tuning's step -1, the model before it was
    fine-tuned, is shown as step 0)."""
    return _eval_curve(read_metrics(run_path(run)), run)


def mean_curve(runs):
    """``eval_curve`` of a setting's seeds: the mean validation loss over the seeds at each step that all of them
    evaluated, and its perplexity."""
    curves = [eval_curve(r).set_index("step").eval_loss for r in as_list(runs)]
    loss = curves[0].to_frame().join([c.rename(i) for i, c in enumerate(curves[1:], 1)], how="inner").mean(axis=1)
    return loss.rename("eval_loss").reset_index().assign(perplexity=lambda f: f.eval_loss.map(math.exp))


def _eval_curve(metrics, run):
    import pandas as pd

    if "eval/loss" not in metrics:
        raise ValueError(f"{run}: the metrics hold no validation loss (eval/loss)")
    loss = metrics["eval/loss"].dropna()
    steps = [max(int(s), 0) for s in loss.index]
    frame = pd.DataFrame({"step": steps, "eval_loss": loss.values, "perplexity": [math.exp(v) for v in loss]})
    return frame.drop_duplicates("step", keep="last").reset_index(drop=True)


# ---------------------------------------------------------------------------------------------- F7: Fig. 5


def _label(d: dict) -> str:
    if d["kind"] == "pretraining":
        return f"{_model_name(d)} from scratch"
    return f"DiffEqFormer N={d['steps']}" if d["steps"] else _model_name(d)


def _model_name(d: dict) -> str:
    kind = {"diffeqformer": "DiffEqFormer", "gpt2": "GPT-2", "llama": "Llama"}.get(d["model"], d["model"])
    unit = "steps" if d["model"] == "diffeqformer" else "layers"
    return f"{kind} ({d['layers']} {unit})"


def finetune_table(runs: Mapping[str, str] | Sequence[str]):
    """One row per setting of the Fig. 5 experiment (direction, method, model: a fine-tuning over its seeds, or a
    model trained from scratch on a fine-tuning's target domain): trainable parameters, validation perplexity before
    fine-tuning, final and best (means over the seeds), the final's standard deviation over the seeds, final - best
    (how far a run ended above its best validation perplexity: overfitting), the number of seeds, and per seed, in
    the order of the pretraining seeds they start from (``pretrain seeds``; seed k of two settings is matched by it),
    the final perplexity (``finals``), the final validation loss (``losses``, the log of the final perplexity), the
    rise of the final loss above the run's best (``rises``), the first seed's run (``run``) and all of them
    (``runs``). The pretrainings the fine-tunings start from are left out (their own curves are F6's business)."""
    import pandas as pd

    described = [describe(r) for r in (runs.values() if isinstance(runs, Mapping) else runs)]
    tunes = [d for d in described if d["kind"] == "fine-tuning"]
    if not tunes:
        raise ValueError("runs holds no fine-tuning run (a run directory with pretrain_config.yaml)")
    pretrained = {d["pretrain_config_hash"] for d in tunes}
    targets = {d["domain"] for d in tunes}
    records = []
    for d in described:
        if d["kind"] == "pretraining":
            if d["config_hash"] in pretrained or d["domain"] not in targets:
                continue  # a pretraining a fine-tuning starts from, or unrelated: not a from-scratch baseline
            for method in sorted({t["method"] for t in tunes if t["domain"] == d["domain"]}):
                source = next(t["source"] for t in tunes if t["domain"] == d["domain"])
                records.append(_finetune_record(d, method, source))
        else:
            records.append(_finetune_record(d, d["method"], d["source"]))
    settings = []
    for _, rows in pd.DataFrame.from_records(records).groupby(["direction", "method", "model"], sort=False):
        rows = rows.sort_values("pretrain seed", kind="stable")
        final = spread(rows["final ppl"])
        first = rows.iloc[0]
        settings.append({
            "direction": first.direction, "method": first.method, "model": first.model,
            "model_order": first.model_order, "trainable params": first["trainable params"],
            "ppl before": rows["ppl before"].mean() if first["ppl before"] is not None else None,
            "final ppl": final.mean, "sd": final.sd, "best ppl": rows["best ppl"].mean(),
            "final - best": rows["final - best"].mean(), "seeds": final.n, "finals": final.values,
            "losses": tuple(rows["final loss"]), "rises": tuple(rows["final loss"] - rows["best loss"]),
            "pretrain seeds": tuple(int(k) for k in rows["pretrain seed"]), "run": first.run, "runs": tuple(rows.run),
        })
    table = pd.DataFrame.from_records(settings)
    order = {"lora": 0, "full": 1}
    table["_m"] = table.method.map(order)
    table["_k"] = table.model_order
    return (table.sort_values(["direction", "_m", "_k"]).drop(columns=["_m", "_k", "model_order"])
            .reset_index(drop=True))


def _finetune_record(d: dict, method: str, source: str) -> dict:
    scratch = d["kind"] == "pretraining"
    return {
        "direction": f"{source} -> {d['domain']}", "method": method, "model": _label(d),
        "model_order": (2, 0) if scratch else ((0, d["steps"]) if d["steps"] else (1, 0)),
        "trainable params": d["trainable_params"], "ppl before": None if scratch else d["initial_ppl"],
        "final ppl": d["final_ppl"], "best ppl": d["best_ppl"], "final - best": d["final_ppl"] - d["best_ppl"],
        "final loss": d["final_loss"], "best loss": d["best_loss"], "pretrain seed": d["pretrain_seed"],
        "run": d["run"],
    }


FINETUNE_HIDDEN = ("run", "runs", "finals", "losses", "rises", "pretrain seeds")
"""Columns of a ``finetune_table`` that are for the code, not for the reader."""


def plot_finetune(table, *, log: bool = True):
    """Fig. 5: validation perplexity during fine-tuning, one panel per direction (rows) and method (columns), one
    line per model (the mean over its seeds), each with its own marker, so that lines that coincide stay visible;
    the model trained from scratch on the target domain is dashed grey. ``plot_finetune_differences`` draws the
    differences themselves."""
    fig, panels = _finetune_panels(table, 3.6)
    for ax, rows, first_column in panels:
        odes = [m for m in rows.model if m.startswith("DiffEqFormer N=")]
        for row in rows.itertuples():
            curve = mean_curve(row.runs)
            ax.plot(curve.step, curve.perplexity, label=row.model, **_finetune_style(row.model, odes))
        if log:
            log_perplexity_axis(ax, "validation perplexity" if first_column else "")
        elif first_column:
            ax.set_ylabel("validation perplexity")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def _finetune_panels(table, height: float):
    """A figure with one panel per direction (rows) and method (columns) of a ``finetune_table``, titled, the
    bottom row's x axis labelled, and (panel, the table's rows of that panel, whether it is in the first column)
    for each."""
    import matplotlib.pyplot as plt

    directions = list(dict.fromkeys(table.direction))
    methods = list(dict.fromkeys(table.method))
    fig, axes = plt.subplots(len(directions), len(methods), figsize=(5.2 * len(methods), height * len(directions)),
                             squeeze=False, sharey=True)
    panels = []
    for i, direction in enumerate(directions):
        for j, method in enumerate(methods):
            ax = axes[i][j]
            ax.set_title(f"{direction}, {_method_name(method)}", fontsize=10)
            if i == len(directions) - 1:
                ax.set_xlabel("fine-tuning step")
            panels.append((ax, table[(table.direction == direction) & (table.method == method)], j == 0))
    return fig, panels


MARKERS = ("o", "s", "^", "D", "v", "P")
"""The markers of the DiffEqFormer lines of F7, one per N."""


def _finetune_style(model: str, odes: Sequence[str]) -> dict:
    """Line style of one model of F7: DiffEqFormer N (viridis, a hollow marker per N, on top), the GPT-2 baseline
    (red, thick, translucent and under the others, so that a DiffEqFormer line on it shows), from scratch (dashed
    grey)."""
    import matplotlib.pyplot as plt

    if "from scratch" in model:
        return dict(color="0.5", ls="--", marker=".", ms=3, lw=1.2)
    if model.startswith("DiffEqFormer N="):
        k = odes.index(model)
        return dict(color=plt.get_cmap("viridis")(0.15 + 0.7 * k / max(len(odes) - 1, 1)),
                    marker=MARKERS[k % len(MARKERS)], ms=4, lw=1.1, mfc="none", zorder=3)
    return dict(color="tab:red", lw=3.0, alpha=0.55, marker="x", ms=5, zorder=2)


def _method_name(method: str) -> str:
    return "LoRA" if method == "lora" else f"{method} fine-tuning"


def plot_finetune_differences(table):
    """Each DiffEqFormer N against the GPT-2 baseline during fine-tuning, one panel per direction and method: the
    difference of the validation log-perplexities (mean over the pairs of the same pretraining seed) as a percent
    ratio, with the range over the pairs shaded; zero is the GPT-2 line of ``plot_finetune``, and the band of
    +-``claims.NEGLIGIBLE_PERCENT`` marks what this book calls negligible."""
    import numpy as np

    fig, panels = _finetune_panels(table, 3.0)
    for ax, rows, first_column in panels:
        gpt = _baseline_row(rows)
        odes = [m for m in rows.model if m.startswith("DiffEqFormer N=")]
        ax.axhspan(-claims.NEGLIGIBLE_PERCENT, claims.NEGLIGIBLE_PERCENT, color="0.88", lw=0,
                   label=f"within +-{claims.NEGLIGIBLE_PERCENT:g}%: negligible")
        ax.axhline(0, color="tab:red", lw=1.5, alpha=0.6, label=gpt.model if gpt is not None else "GPT-2")
        for _, row in rows[rows.model.isin(odes)].iterrows() if gpt is not None else ():
            base = dict(zip(gpt["pretrain seeds"], gpt.runs))
            pairs = [eval_curve(run).set_index("step").eval_loss - eval_curve(base[k]).set_index("step").eval_loss
                     for k, run in zip(row["pretrain seeds"], row.runs) if k in base]
            if not pairs:
                continue
            percent = 100 * np.expm1(np.column_stack([p.dropna().values for p in pairs]))
            style = _finetune_style(row.model, odes)
            ax.plot(pairs[0].dropna().index, percent.mean(axis=1), label=row.model, **style)
            if percent.shape[1] > 1:
                ax.fill_between(pairs[0].dropna().index, percent.min(axis=1), percent.max(axis=1),
                                color=style["color"], alpha=0.15, lw=0)
        if first_column:
            ax.set_ylabel("DiffEqFormer against GPT-2 (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def _baseline_row(rows):
    """The GPT-2 baseline's row among one panel's rows of a ``finetune_table`` (None if it is not there)."""
    gpt = rows[~rows.model.str.startswith("DiffEqFormer") & ~rows.model.str.contains("from scratch")]
    return gpt.iloc[0] if len(gpt) else None


PRETRAINING = "pretraining seed"
"""The unit of F7's tests."""

OVERFIT_TARGETS = ("plays", "wikitext103")
"""The fine-tuning domains on which F7 tests "fewer steps overfit less": the paper reports it on WikiText-103, for
which the offline corpus's plays stand (``finetune.DIRECTIONS``)."""


def finetune_differences(table, method: str) -> dict[tuple[str, int], dict[int, float]]:
    """Per direction and N, under ``method``: pretraining seed -> DiffEqFormer's final validation log-perplexity
    less the GPT-2 baseline's (same direction, same pretraining seed)."""
    out = {}
    for direction, rows in table[table.method == method].groupby("direction", sort=False):
        gpt = _baseline_row(rows)
        if gpt is None:
            continue
        base = dict(zip(gpt["pretrain seeds"], gpt.losses))
        for _, row in rows[rows.model.str.startswith("DiffEqFormer N=")].iterrows():
            n = int(row.model.split("=")[1])
            out[direction, n] = {k: v - base[k] for k, v in zip(row["pretrain seeds"], row.losses) if k in base}
    return out


def finetune_per_seed(table, method: str) -> list[float]:
    """F7's primary number under ``method``, one per pretraining seed: the mean over directions and N of
    ``finetune_differences`` (on the pretraining seeds every setting has)."""
    differences = finetune_differences(table, method)
    if not differences:
        return []
    common = set.intersection(*(set(d) for d in differences.values()))
    return [statistics.fmean(d[k] for d in differences.values()) for k in sorted(common)]


def finetune_verdicts(table) -> dict[str, claims.Verdict]:
    """The verdicts on F7's claims (``claims.CLAIMS``), each from its one primary test over the pretraining seeds:
    ``f7_lora`` (the one-sample t-test of ``finetune_per_seed`` under LoRA), ``f7_full`` (the same under full
    fine-tuning, tested for equivalence), ``f7_overfit`` (the slope of each DiffEqFormer's rise above its best
    against N, with an intercept per pretraining seed, under full fine-tuning on ``OVERFIT_TARGETS``)."""
    out = {}
    for name, method in (("f7_lora", "lora"), ("f7_full", "full")):
        per_seed = finetune_per_seed(table, method)
        out[name] = (claims.judge(name, seeds.one_sample(per_seed), unit=PRETRAINING) if per_seed
                     else claims.untested(name, f"this preset fine-tunes no DiffEqFormer and GPT-2 with "
                                                f"{_method_name(method)}"))
    full = table[(table.method == "full") & table.model.str.startswith("DiffEqFormer N=")
                 & table.direction.map(lambda d: d.split(" -> ")[1] in OVERFIT_TARGETS)]
    x = [int(m.split("=")[1]) for m, rises in zip(full.model, full.rises) for _ in rises]
    y = [r for rises in full.rises for r in rises]
    groups = [k for ks in full["pretrain seeds"] for k in ks]
    if len(set(x)) >= 2:
        out["f7_overfit"] = claims.judge("f7_overfit", trend(x, y, groups), unit=PRETRAINING, if_untested=(
            "the rises of the other direction's fine-tunings, which do move, are exploratory (the table below): the "
            "paper's claim is about the target that stands for WikiText-103"))
    else:
        out["f7_overfit"] = claims.untested("f7_overfit", "this preset fine-tunes fewer than two N fully on the "
                                                          "target standing for WikiText-103")
    return out


def finetune_secondary(table):
    """F7's exploratory comparisons: per method, direction and N, DiffEqFormer against GPT-2 over the pretraining
    seeds (the one-sample t-test of the seed-matched differences of final log-perplexities): the ratio in percent
    with its 95% interval, p, the verdict on its method's claim (LoRA: lower; full: equivalent within
    ``claims.EQUIVALENCE_PERCENT``), whether a significant ratio is negligible (within ``claims.NEGLIGIBLE_PERCENT``)
    and the smallest ratio the design detects 80% of the time."""
    import pandas as pd

    rows = []
    for method, name in (("lora", "f7_lora"), ("full", "f7_full")):
        for (direction, n), per_seed in finetune_differences(table, method).items():
            v = claims.judge(name, seeds.one_sample(list(per_seed.values())), unit=PRETRAINING)
            rows.append({"method": _method_name(method), "direction": direction, "N": n,
                         "effect (95% CI)": v.effect_text(), "p": v.p, "verdict": v.word,
                         "negligible": "yes" if v.negligible else "", "detectable at 80%": v.detectable_text(),
                         "pretraining seeds": v.n})
    return pd.DataFrame(rows)


def finetune_scale(table) -> str:
    """One line for captions: the pretrainings' and fine-tunings' scale, read from the runs."""
    d = describe(table[~table.model.str.contains("from scratch")].run.iloc[0])
    pre = d["config"].pretrain.config
    trainer = d["config"].trainer
    return (f"pretrained as in {pre} ({d['hidden_dim']}-d), fine-tuned {trainer.num_train_steps} steps of "
            f"{trainer.train_batch_size} sequences")


# ------------------------------------------------------------------------------------------ F8-F10: ablations


def ablation_table(runs: Sequence[str | Sequence[str]], fields: Mapping[str, str]):
    """One row per entry of ``runs`` (a run, or a list of runs: the seeds of one setting): the configuration values
    named by ``fields`` (column -> dotted config field, e.g. ``{"d_t": "model.time_embed_dim"}``, read from the
    first seed), model, number of seeds, the mean final validation perplexity over the seeds and its standard
    deviation, the mean best perplexity, parameters, mean training tokens/s, wall time; ``run`` is the first seed
    (for measurements that do not depend on the seed), ``runs`` all of them, ``finals`` each seed's final
    perplexity and ``losses`` its log, the final validation loss (for ``seeds.compare``)."""
    import pandas as pd

    records = []
    for entry in runs:
        described = [describe(run) for run in as_list(entry)]
        d = described[0]
        final = spread(s["final_ppl"] for s in described)
        record = {column: config_field(d["config"], dotted) for column, dotted in fields.items()}
        record.update({"model": _model_name(d), "seeds": final.n, "final ppl": final.mean, "sd": final.sd,
                       "best ppl": sum(s["best_ppl"] for s in described) / final.n, "params": d["total_params"],
                       "tokens/s": sum(s["tokens_per_second"] or math.nan for s in described) / final.n,
                       "run": str(as_list(entry)[0]), "runs": tuple(str(r) for r in as_list(entry)),
                       "finals": final.values, "losses": tuple(s["final_loss"] for s in described)})
        records.append(record)
    return pd.DataFrame.from_records(records)


HIDDEN_COLUMNS = ("run", "runs", "finals", "losses")
"""Columns of an ``ablation_table`` that are for the code, not for the reader."""


def shown(table):
    """The table as the book shows it: without ``HIDDEN_COLUMNS``."""
    return table.drop(columns=[c for c in HIDDEN_COLUMNS if c in table])


def plot_ablation_curves(table, label, *, log: bool = True, ax=None, styles: Mapping | None = None):
    """Validation perplexity during training, one line per row of an ``ablation_table``, labelled by
    ``label(row)``: the mean over the row's seeds, with the band from the lowest to the highest seed where there
    are several."""
    import matplotlib.pyplot as plt
    import pandas as pd

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4))
    for row in table.itertuples():
        curves = pd.concat([eval_curve(r) for r in row.runs]).groupby("step").perplexity
        text = label(row) + (f" ({row.seeds} seeds)" if row.seeds > 1 else "")
        (line,) = ax.plot(curves.mean().index, curves.mean().values, marker="o", ms=3, lw=1.3, label=text,
                          **(styles or {}).get(label(row), {}))
        if row.seeds > 1:
            ax.fill_between(curves.min().index, curves.min().values, curves.max().values, color=line.get_color(),
                            alpha=0.2, lw=0)
    ax.set_ylabel("validation perplexity")
    if log:
        log_perplexity_axis(ax)
    ax.set_xlabel("training step")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    return ax


def _settings(a: Sequence[float], b: Sequence[float]) -> Comparison:
    """Final validation log-perplexities of two settings over seeds compared by ``seeds.RULE``: the difference is
    the log of the ratio of perplexities. Seeds are matched by their place in the lists: the workflow trains every
    setting as seeds 0..n-1 (``workflow.presets.seeded``), and seed k of two settings reads the training sequences in the
    same order, so the first n seeds of both (n the fewer) are compared by the paired t-test."""
    n = min(len(a), len(b))
    return compare(a[:n], b[:n], paired=True)


def change_words(comparison: Comparison) -> str:
    """A comparison of log-perplexities in words: ``-9.5% (95% CI -12.0% to -7.0%), p = 0.01, paired t-test over 3
    seeds: significant``; ``+0.4%: untested: 1 seed``."""
    change = f"{seeds.percent(comparison.difference):+.1f}%"
    if comparison.untested:
        return f"{change}: {comparison.verdict}"
    interval = ("" if math.isnan(comparison.low) else
                f" (95% CI {seeds.percent(comparison.low):+.1f}% to {seeds.percent(comparison.high):+.1f}%)")
    return (f"{change}{interval}, {seeds.p_text(comparison.p)}, {comparison.test} over {comparison.n} seeds: "
            f"{comparison.verdict}")


def beta2_table(runs: Mapping[str, Sequence[str | Sequence[str]]]):
    """F8 (Fig. 7): one row per setting of ``runs`` (model key, e.g. ``ours`` / ``gpt`` -> its runs, or lists of
    seed runs, differing in Adam's beta2): final and best validation perplexity (means over seeds), the change of
    the final one against the same model at beta2 = 0.999 in percent (the ratio from the seed-matched differences
    of log-perplexities, negative: better), and whether that change is significant (``seeds.RULE``; seeds matched
    as in ``_settings``)."""
    import pandas as pd

    parts = []
    for key, group in runs.items():
        t = ablation_table(group, {"beta2": "optimizer.beta2"})
        t.insert(0, "key", key)
        base = t[t.beta2 == 0.999]
        ref = base.losses.iloc[0] if len(base) else None
        changes = [None if (ref is None or b == 0.999) else _settings(f, ref) for f, b in zip(t.losses, t.beta2)]
        t["vs 0.999 %"] = [seeds.percent(c.difference) if c else math.nan for c in changes]
        t["verdict"] = [c.verdict if c else "" for c in changes]
        parts.append(t.sort_values("beta2"))
    return pd.concat(parts, ignore_index=True)


def beta2_interaction(table) -> Comparison | None:
    """F8's primary test: per seed, DiffEqFormer's change of final log-perplexity from beta2 = 0.999 to the lower
    beta2, less GPT-2's (the interaction of model and beta2), by the one-sample t-test over the seeds all four
    settings share (seed k of each reads the same sequences). None where a setting is missing."""
    changes = {}
    for key, rows in table.groupby("key", sort=False):
        base, low = rows[rows.beta2 == 0.999], rows[rows.beta2 < 0.999]
        if len(base) and len(low):
            changes[key] = (low.losses.iloc[0], base.losses.iloc[0])
    if not {"ours", "gpt"} <= set(changes):
        return None
    n = min(len(v) for pair in changes.values() for v in pair)
    per_seed = [(changes["ours"][0][k] - changes["ours"][1][k]) - (changes["gpt"][0][k] - changes["gpt"][1][k])
                for k in range(n)]
    return seeds.one_sample(per_seed)


def beta2_headline(table) -> dict[str, str]:
    """Sentences for F8: per model key the perplexity at each beta2 (mean ± sd over seeds) and the change at the
    lower beta2 with its verdict (exploratory; ``beta2_verdicts`` judges the paper's claim by the interaction)."""
    out = {}
    for key, rows in table.groupby("key", sort=False):
        values = ", ".join(f"{spread(r.finals).text()} at beta2 = {r.beta2:g}" for r in rows.itertuples())
        base, low = rows[rows.beta2 == 0.999], rows[rows.beta2 < 0.999]
        change = (f" (the lower beta2: {change_words(_settings(low.losses.iloc[0], base.losses.iloc[0]))})"
                  if len(base) and len(low) else "")
        out[key] = f"{rows.model.iloc[0]}: {values}{change}"
    return out


def beta2_verdicts(table) -> dict[str, claims.Verdict]:
    """The verdict on F8's claim (``claims.CLAIMS["f8_beta2"]``) from its primary test, ``beta2_interaction``."""
    interaction = beta2_interaction(table)
    return {"f8_beta2": claims.judge("f8_beta2", interaction) if interaction is not None else
            claims.untested("f8_beta2", "the preset did not train both models at both values of beta2")}


def time_embedding_trend(table) -> Trend:
    """F9's perplexity trend: the slope of every seed's final validation log-perplexity against log2 d_t (the log
    of the ratio of perplexities per doubling of d_t), over all settings of ``table`` (``time_embedding_table``),
    judged by ``seeds.trend``. Seeds are matched by their place in each setting's list where every setting has as
    many (seed k of every d_t reads the training sequences in the same order: an intercept per seed), otherwise one
    intercept."""
    matched = len({len(f) for f in table.losses}) == 1
    return trend([math.log2(d) for d, losses in zip(table.d_t, table.losses) for _ in losses],
                 [v for losses in table.losses for v in losses],
                 [k for losses in table.losses for k in range(len(losses))] if matched else None)


def time_embedding_verdicts(table, *, batch: int | None = None) -> dict[str, claims.Verdict]:
    """The verdicts on F9's claims: ``f9_dt`` from ``time_embedding_trend``, ``f9_memory`` a measurement
    (``MemoryGrowth.grows_far_less``: the memory's growth against the parameters' over d_t)."""
    out = {"f9_dt": claims.judge("f9_dt", time_embedding_trend(table))}
    memory = next((c for c in MEMORY_SOURCES if c in table and table[c].notna().all()), None)
    if memory is None:
        out["f9_memory"] = claims.untested("f9_memory", "the preset measured no memory")
    else:
        growth = time_embedding_memory(table, memory, batch=batch)
        out["f9_memory"] = claims.measured("f9_memory", growth.grows_far_less, growth.growth_ratio,
                                           note=f"{memory_explanation(growth)} ({growth.source})")
    return out


def time_embedding_headline(table, *, batch: int | None = None) -> dict[str, str]:
    """Sentences for F9: how perplexity (mean over seeds), parameters, throughput and measured memory change from
    the smallest to the largest d_t, the perplexity trend over every d_t (``time_embedding_trend``, as a percent
    change per doubling), what an added parameter costs in memory (``memory_growth``: ``time_embedding_memory``;
    ``memory_rss``: the same fit of the resident memory, where measured); ``time_embedding_verdicts`` judges the
    paper's claims. ``batch``: the sequences of the measured step."""
    lo, hi = table.iloc[0], table.iloc[-1]
    memory = next((c for c in MEMORY_SOURCES if c in table and table[c].notna().all()), None)
    speed = "step tokens/s" if "step tokens/s" in table else "tokens/s"
    ratio = lambda c: hi[c] / lo[c]  # noqa: E731
    verdicts = time_embedding_verdicts(table, batch=batch)
    out = {
        "range": f"d_t = {int(lo.d_t)} to {int(hi.d_t)}",
        "ppl": f"{spread(lo.finals).text()} to {spread(hi.finals).text()}",
        "best_dt": f"{int(table.loc[table['final ppl'].idxmin(), 'd_t'])}",
        "params": f"{lo.params / 1e6:.2f}M to {hi.params / 1e6:.2f}M (x{ratio('params'):.2f})",
        "throughput": f"x{ratio(speed):.2f}",
        "memory": (f"x{ratio(memory):.2f} ({lo[memory]:.0f} to {hi[memory]:.0f} MiB, {MEMORY_SOURCES[memory]})"
                   if memory else "not measured"),
        "trend": verdicts["f9_dt"].text(),
    }
    if memory is None:
        out["memory_growth"] = out["memory_rss"] = "not measured"
        return out
    out["memory_growth"] = time_embedding_memory(table, memory, batch=batch).text()
    out["memory_rss"] = (time_embedding_memory(table, "training MiB", batch=batch).text()
                         if memory != "training MiB" and "training MiB" in table else "not measured")
    return out


def hypernetwork_verdicts(table) -> dict[str, claims.Verdict]:
    """The verdict on F10's claim: per-weight MLPs against one shared MLP, the paired t-test of the final
    log-perplexities (seeds matched as in ``_settings``)."""
    rows = table.set_index("hypernet")
    if not {"per_weight", "shared_mlp"} <= set(rows.index):
        return {"f10_hypernet": claims.untested("f10_hypernet", "the preset did not train both designs")}
    return {"f10_hypernet": claims.judge("f10_hypernet",
                                         _settings(rows.loc["per_weight"].losses, rows.loc["shared_mlp"].losses))}


def hypernetwork_headline(table) -> dict[str, str]:
    """Sentences for F10: per-weight MLPs against one shared MLP (final validation perplexity over seeds,
    parameters); ``hypernetwork_verdicts`` judges the paper's claim."""
    rows = table.set_index("hypernet")
    if not {"per_weight", "shared_mlp"} <= set(rows.index):
        return {"comparison": "The preset did not train both hypernetwork designs."}
    a, b = rows.loc["per_weight"], rows.loc["shared_mlp"]
    return {"comparison": (f"per-weight MLPs {spread(a.finals).text()} ({a.params / 1e6:.2f}M parameters) against "
                           f"one shared MLP {spread(b.finals).text()} ({b.params / 1e6:.2f}M)")}


# --------------------------------------------------------------------------------------------- peak memory


def compiled_train_step(model, tokens, *, learning_rate: float = 1e-4, donate: bool = True, mp=None):
    """A jitted AdamW train step (forward, backward, update; Levanter's next-token loss) over the model's float
    arrays, compiled for ``tokens`` (batch x position). ``donate``: the step's outputs take the buffers of the
    parameters and optimiser state it is given, as the trainer's step does (``dispatch``), so that a step holds one
    copy of them, not two. ``mp``: a ``jmp.Policy`` (a run's ``trainer.mp``) whose compute dtype the loss runs in, as
    in training; None: the parameters' own dtype. Returns (step, params, opt_state, XLA's planned peak bytes:
    ``memory_parts``' ``peak``, or None)."""
    import equinox as eqx
    import haliax as hax
    import jax
    import optax
    from levanter.models.lm_model import LmExample

    params, static = eqx.partition(model, eqx.is_inexact_array)
    optimizer = optax.adamw(learning_rate)
    opt_state = optimizer.init(params)

    def step(params, opt_state, tokens):
        batch = hax.vmap(LmExample.causal, tokens.axes[0])(tokens)

        def loss_fn(p):
            # a fixed dropout key: a model with dropout pays for its masks as in training (the same mask each step)
            m = eqx.combine(p, static)
            return next_token_loss(mp.cast_to_compute(m) if mp is not None else m, batch,
                                   key=jax.random.PRNGKey(0)).scalar()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    compiled = jax.jit(step, donate_argnums=(0, 1) if donate else ()).lower(params, opt_state, tokens).compile()
    parts = memory_parts(compiled)
    return compiled, params, opt_state, parts["peak"] if parts else None


def memory_parts(compiled) -> dict[str, int] | None:
    """XLA's plan for a compiled step, in bytes (None where the backend gives none): ``arguments`` (for a train
    step: parameters and optimiser state), ``outputs``, ``aliased`` (outputs written into donated arguments),
    ``temporaries`` (gradients, activations, workspace) and ``peak`` = arguments + outputs - aliased +
    temporaries. Planned, not measured."""
    mem = compiled.memory_analysis()
    if mem is None:
        return None
    parts = {"arguments": mem.argument_size_in_bytes, "outputs": mem.output_size_in_bytes,
             "aliased": mem.alias_size_in_bytes, "temporaries": mem.temp_size_in_bytes}
    parts["peak"] = parts["arguments"] + parts["outputs"] - parts["aliased"] + parts["temporaries"]
    return parts


PARAMETER_BYTES = 16
"""Bytes a float32 parameter holds while it trains with Adam: itself, its gradient and Adam's two moments, 4 each."""


@dataclass(frozen=True)
class MemoryGrowth:
    """Peak memory of a training step against the parameter count, over the settings of a sweep (F9: d_t): the
    least-squares line memory = ``fixed`` + ``per_parameter`` x parameters. ``per_parameter`` is what each added
    parameter costs (``PARAMETER_BYTES`` if it costs what its own training state takes), ``fixed`` what does not
    grow with the parameters (activations, the weights W(t) generated for a forward pass, workspace); ``source``
    says what was measured (e.g. ``H100 allocator peak, batch 16``)."""

    params: tuple[float, ...]
    memory: tuple[float, ...]
    """Bytes, one per setting."""
    source: str
    per_parameter: float
    fixed: float

    @property
    def memory_ratio(self) -> float:
        """Memory at the most parameters over memory at the fewest."""
        return self.memory[-1] / self.memory[0]

    @property
    def params_ratio(self) -> float:
        return self.params[-1] / self.params[0]

    @property
    def parameter_state(self) -> tuple[float, ...]:
        """``PARAMETER_BYTES`` x parameters of each setting: the memory its parameters' training state takes."""
        return tuple(PARAMETER_BYTES * p for p in self.params)

    @property
    def growth_ratio(self) -> float:
        """How much the memory grows for what the parameters grow, from the fewest parameters to the most: the ratio
        of their relative growths, (memory ratio - 1) / (parameter ratio - 1); 1 when the memory grows as fast as
        the parameters."""
        return (self.memory_ratio - 1) / (self.params_ratio - 1)

    @property
    def grows_far_less(self) -> bool:
        """Fig. 16's claim as the paper words it: the memory grows by less than half as much as the parameters
        (``growth_ratio`` below 1/2)."""
        return self.growth_ratio < 0.5

    @property
    def far_less(self) -> bool:
        """The stricter reading (exploratory): whether an added parameter costs less than half of
        ``PARAMETER_BYTES``. Any memory that does not grow with the parameters makes ``grows_far_less`` easier to
        meet; this asks what each added parameter costs."""
        return self.per_parameter < PARAMETER_BYTES / 2

    def text(self) -> str:
        """``14.0 B per added parameter (16 expected), 2.80 GiB fixed; memory x3.18 for parameters x5.67 (H100
        ...)``."""
        return (f"{self.per_parameter:.1f} B per added parameter ({PARAMETER_BYTES} expected), "
                f"{_bytes(self.fixed)} that does not grow with them; memory x{self.memory_ratio:.2f} for parameters "
                f"x{self.params_ratio:.2f} ({self.source})")


def _bytes(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if abs(n) >= 2**30 else f"{n / 2**20:.1f} MiB"


def memory_growth(params: Sequence[float], memory: Sequence[float], source: str) -> MemoryGrowth:
    """``MemoryGrowth`` of peak memories ``memory`` (bytes) at parameter counts ``params`` (at least two different
    counts), sorted by parameters. The memory of a step does not depend on the seed, so there is no spread over
    seeds to judge by: the fit describes one measurement per setting."""
    import numpy as np

    pairs = sorted(zip((float(p) for p in params), (float(m) for m in memory)))
    x, y = np.array([p for p, _ in pairs]), np.array([m for _, m in pairs])
    if len(set(x)) < 2 or not np.all(np.isfinite(y)):
        raise ValueError("a memory growth needs finite memories at two or more parameter counts")
    slope, intercept = np.polyfit(x, y, 1)
    return MemoryGrowth(tuple(x), tuple(y), source, float(slope), float(intercept))


def gpu_memory_growth(path: str | Path) -> tuple[MemoryGrowth, "pandas.DataFrame"]:
    """The d_t sweep of a GPU measurement file (``benchmarks/gpu/measure.py``'s JSON: the first pair's DiffEqFormer
    and the ``time_embed_dim`` entries, each with ``params`` and ``peak_memory_gib``, the allocator's peak) as a
    ``MemoryGrowth`` and a table (d_t, parameters, peak GiB, ``PARAMETER_BYTES`` x parameters in GiB)."""
    import pandas as pd

    result = json.loads(Path(path).read_text())
    sweep = [result["pairs"][0]["diffeqformer"], *result.get("time_embed_dim", [])]
    sweep = sorted((m for m in sweep if m.get("peak_memory_gib") is not None), key=lambda m: m["params"])
    if len(sweep) < 2:
        raise ValueError(f"{path}: fewer than two d_t with a measured peak memory")
    first = sweep[0]
    source = (f"{result['device']}, allocator peak at batch {first['batch']}, {first['layers']} x {first['hidden']}, "
              f"seq {first['seq']}, {first['policy']}, one device")
    growth = memory_growth([m["params"] for m in sweep], [m["peak_memory_gib"] * 2**30 for m in sweep], source)
    table = pd.DataFrame({"d_t": [m["time_embed_dim"] for m in sweep], "params": [m["params"] for m in sweep],
                          "peak GiB": [m["peak_memory_gib"] for m in sweep]})
    table[f"{PARAMETER_BYTES} B x params GiB"] = table.params * PARAMETER_BYTES / 2**30
    return growth, table


def memory_verdict(growth: MemoryGrowth) -> str:
    """Whether Fig. 16's claim (peak memory grows far less than the parameter count), as the paper words it
    (``MemoryGrowth.grows_far_less``), holds in a sweep that is not the book's headline measurement (the GPU
    benchmark's), then ``memory_explanation``, with the stricter, exploratory reading."""
    word = "holds" if growth.grows_far_less else "does not hold"
    return f"Fig. 16's claim, as the paper words it, {word} in this sweep ({growth.source}): " \
           f"{memory_explanation(growth)}"


def memory_explanation(growth: MemoryGrowth) -> str:
    """How much the memory grew for what the parameters grew, then, exploratory, what an added parameter costs
    against its training state and why the memory grows less than the parameters all the same."""
    half = "less" if growth.far_less else "more"
    return (f"memory x{growth.memory_ratio:.2f} where the parameters grow x{growth.params_ratio:.2f}: "
            f"{growth.growth_ratio:.2f} of their growth. Exploratory, stricter: an added parameter costs "
            f"{growth.per_parameter:.1f} B against the {PARAMETER_BYTES} B of its own training state (f32 parameter, "
            f"gradient, Adam's two moments), {half} than half, and {_bytes(growth.fixed)} of the memory does not grow "
            "with d_t (activations, the weights generated for a forward pass, workspace): that part is what the "
            "paper's explanation, weights computed once per forward pass, is about.")


def _status_mib(field: str) -> float | None:
    """A memory figure of this process from Linux's /proc/self/status (``VmRSS``, ``VmHWM``) in MiB; None elsewhere."""
    try:
        text = Path("/proc/self/status").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024  # kB
    return None


def _reset_peak_rss() -> bool:
    """Reset this process's resident-memory high-water mark to its current value (Linux: ``clear_refs`` 5), so that
    a transient peak of the imports does not hide what comes after. False where that is not possible."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _peak_rss_mib() -> float:
    """The high-water mark of resident memory: ``VmHWM`` (resettable), else ``ru_maxrss`` (since the start)."""
    hwm = _status_mib("VmHWM")
    if hwm is not None:
        return hwm
    scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, KiB on Linux
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / 2**20


READY = "@ready to time"
"""What ``_measure(wait_turn=True)`` prints when its step is compiled and has run once, before it waits for its turn."""


CACHE_EVENTS = ("/jax/compilation_cache/compile_requests_use_cache", "/jax/compilation_cache/cache_hits")
"""The events JAX records when a program is asked of the persistent compilation cache, and when it is found there."""


def _measure(run, batch: int, steps: int, wait_turn: bool = False) -> dict:
    """In this process (which must not have started JAX's runtime before): the run's model built from its config,
    ``steps`` AdamW steps on random tokens, the memory that took and the time per step. ``wait_turn``: after the
    compilation and one step, print ``READY`` and time the steps only once a line arrives on standard input
    (``measure_training_steps`` starts the processes of several runs side by side and lets them time their steps one
    after the other)."""
    import statistics
    import time

    import haliax as hax
    import jax

    jax.numpy.zeros(1).block_until_ready()  # the runtime itself, before anything of the model
    reset = _reset_peak_rss()
    baseline = _status_mib("VmRSS") if reset else _peak_rss_mib()
    config = run_config(run)
    vocab = hax.Axis("vocab", summary(run)["vocab_size"])
    model = config.model.build(vocab, key=jax.random.PRNGKey(0))
    tokens = hax.random.randint(jax.random.PRNGKey(1), (hax.Axis("batch", batch), config.model.max_Pos), 0, vocab.size)
    events = []  # the persistent compilation cache's requests and hits, in order
    jax.monitoring.register_event_listener(lambda event, **_: events.append(event) if event in CACHE_EVENTS else None)
    start = time.perf_counter()
    step, params, opt_state, planned = compiled_train_step(model, tokens, mp=config.trainer.mp)
    compile_s = time.perf_counter() - start
    # the step is the last program compiled_train_step compiles (before it: the optimiser state's small programs)
    from_cache = events[-1:] == [CACHE_EVENTS[1]]
    parts = memory_parts(step) or {}
    num_params = sum(x.size for x in jax.tree_util.tree_leaves(params))
    del model
    if wait_turn:
        params, opt_state, loss = step(params, opt_state, tokens)
        jax.block_until_ready(loss)
        print(READY, flush=True)
        sys.stdin.readline()
    seconds = []
    timed_from = time.time()
    for _ in range(steps):
        start = time.perf_counter()
        params, opt_state, loss = step(params, opt_state, tokens)
        jax.block_until_ready(loss)
        seconds.append(time.perf_counter() - start)
    timed_to = time.time()
    peak = _peak_rss_mib()
    stats = jax.devices()[0].memory_stats() or {}
    step_s = statistics.median(seconds[1:] if len(seconds) > 1 else seconds)
    return {"run": str(run), "batch": batch, "steps": steps, "backend": jax.default_backend(),
            "step_s": step_s, "tokens_per_second": batch * config.model.max_Pos.size / step_s, "compile_s": compile_s,
            "step_from_cache": from_cache,
            "timed_from": timed_from, "timed_to": timed_to,
            "rss_baseline_mib": baseline, "rss_peak_mib": peak, "training_mib": peak - baseline,
            "peak_since": "runtime start" if reset else "process start",
            "params": num_params, "xla_planned_mib": planned / 2**20 if planned is not None else None,
            **{f"xla_{name}_mib": value / 2**20 for name, value in parts.items() if name != "peak"},
            "device_peak_mib": stats["peak_bytes_in_use"] / 2**20 if "peak_bytes_in_use" in stats else None}


def measure_training_step(run, *, batch: int = 16, steps: int = 10) -> dict:
    """Measured cost of a training step of the run's model (built fresh from its config, random tokens, AdamW, its
    dropout): ``step_s`` (median seconds per step, after the first) and ``tokens_per_second``, measured back to back
    for the runs of a sweep rather than taken from trainings that ran at different times, and its memory:

    * ``training_mib``: the process's peak resident memory minus its resident memory once JAX's runtime was up (on
      the CPU backend the arrays live in host memory; on Linux the high-water mark is reset at that point, so that
      the imports' own transient peak does not hide a small model): the model's parameters, AdamW state, the
      compiled step and its activations for ``batch`` sequences. XLA's compiler needs several times that while it
      compiles, and outside Linux a process's high-water mark cannot be reset, so the step is compiled in a first
      process of its own (``compile_mib``: that process's peak) into a private persistent compilation cache, and
      measured in a second one that loads it (``step_from_cache``; on the CPU both run oneDNN as XLA's library,
      ``ONEDNN_CACHEABLE_FLAG``, since the training's custom calls make programs the cache cannot keep: with them the
      second process would compile again and its peak would be the compiler's);
    * ``device_peak_mib``: the accelerator allocator's peak (``peak_bytes_in_use``; GPU/TPU only, else None);
    * ``xla_planned_mib``: what XLA planned for the compiled step (``memory_parts``: arguments + outputs - the
      outputs written into the donated parameters and optimiser state + temporaries), planned, not measured, and its
      parts ``xla_arguments_mib``, ``xla_outputs_mib``, ``xla_aliased_mib``, ``xla_temporaries_mib``;
    * ``params``: the parameters (float array elements) the step trains.

    ``measure_training_steps`` measures several runs so, compiling them side by side."""
    return measure_training_steps([run], batch=batch, steps=steps)[0]


def measure_training_steps(runs: Sequence, *, batch: int = 16, steps: int = 10, progress: bool = False) -> list[dict]:
    """``measure_training_step`` for each of ``runs``: their compiling processes run side by side (nothing in them
    is timed that a result uses: ``first_compile_s`` is then the time of a compilation beside the others, and one
    keeps about one core busy), then their measuring processes: these start, load their compiled step and run it
    once side by side too, then time their steps one after the other, each while the others wait on their standard
    input, so that no two timed steps share the machine. ``progress``: a progress bar over the runs' timed
    measurements. F9's times in a fresh ``make book`` with this schedule, and with each measuring process started
    only after the previous one had finished: measurements page."""
    import tempfile

    from tqdm.auto import tqdm

    if batch < 1 or steps < 1:
        raise ValueError(f"batch and steps must be positive, got batch={batch!r}, steps={steps!r}")
    for run in runs:
        require_complete(run)

    def start(run, n: int, cache: str, *extra: str):
        argv = ["-m", "diffeqformer.analysis.ablations", "--measure", str(run_path(run)), "--batch", str(batch),
                "--steps", str(n), "--cache", cache, *extra]
        # standard error to a file: a pipe nobody reads while the process waits for its turn could fill and block it
        with Path(f"{cache}-{'measure' if extra else 'compile'}.err").open("w") as err:
            p = subprocess.Popen([sys.executable, *argv], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=err, text=True)
        p.err_path = err.name
        return p

    def result(run, p, stdin: str | None = None) -> dict:
        stdout, _ = p.communicate(stdin)
        if p.returncode != 0:
            stderr = Path(p.err_path).read_text(errors="replace")
            raise RuntimeError(f"measuring a training step of {run} failed:\n{stderr[-3000:]}")
        return json.loads(stdout.strip().splitlines()[-1])

    with tempfile.TemporaryDirectory(prefix="diffeqformer-measure-") as tmp:
        caches = [str(Path(tmp) / f"cache-{i}") for i in range(len(runs))]  # one private cache per run
        procs: list = []
        try:  # a failed run stops the others
            procs = [start(run, 1, cache) for run, cache in zip(runs, caches)]
            compiled = [result(run, p) for run, p in zip(runs, procs)]
            procs = [start(run, steps, cache, "--wait-turn") for run, cache in zip(runs, caches)]
            for run, p in zip(runs, procs):
                line = p.stdout.readline()
                if line.strip() != READY:
                    result(run, p)  # raises with the process's error, or says what it printed instead
                    raise RuntimeError(f"measuring a training step of {run}: expected {READY!r}, got {line!r}")
            out = []
            for run, p, first in tqdm(list(zip(runs, procs, compiled)), desc="time and memory of a training step",
                                      disable=not progress):
                measured = result(run, p, "go\n")
                if not measured["step_from_cache"]:
                    warnings.warn(f"{run}: the measuring process compiled the step again (the compilation cache did "
                                  "not keep it): its training MiB includes the compiler's memory")
                measured.update(run=str(run), compile_mib=first["training_mib"], first_compile_s=first["compile_s"])
                out.append(measured)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
    return out


def time_embedding_table(runs: Sequence[str], measured: Sequence[Mapping] | None = None):
    """F9 (Table 6, Figs. 14-16): one row per d_t, sorted: final and best validation perplexity, parameters,
    training tokens/s (the trainer's median) and, given ``measure_training_step`` results for the same runs, the
    tokens/s and memory measured back to back."""
    table = ablation_table(runs, {"d_t": "model.time_embed_dim"}).sort_values("d_t").reset_index(drop=True)
    if measured is not None:
        by_run = {str(run_path(m["run"])): m for m in measured}
        for column, key in [("step tokens/s", "tokens_per_second"), ("training MiB", "training_mib"),
                            ("device peak MiB", "device_peak_mib"), ("XLA planned MiB", "xla_planned_mib")]:
            table[column] = [by_run[str(run_path(r))].get(key) for r in table.run]
        for column, key in [("XLA arguments MiB", "xla_arguments_mib"), ("XLA temporaries MiB", "xla_temporaries_mib")]:
            table[column] = [by_run[str(run_path(r))].get(key) for r in table.run]
        if table["device peak MiB"].isna().all():
            table = table.drop(columns="device peak MiB")
        table[f"{PARAMETER_BYTES} B x params MiB"] = table.params * PARAMETER_BYTES / 2**20
    return table


MEMORY_SOURCES = {"device peak MiB": "the accelerator allocator's peak", "XLA planned MiB": "XLA's plan of the step",
                  "training MiB": "resident memory above the runtime's"}
"""The memory columns of a ``time_embedding_table``, in the order ``time_embedding_memory`` prefers them."""


def time_embedding_memory(table, column: str | None = None, *, batch: int | None = None) -> MemoryGrowth:
    """``MemoryGrowth`` of F9's measured step (``time_embedding_table`` with measurements) against the parameters of
    each d_t: by default the accelerator allocator's peak where there is one, else XLA's plan of the step (on the CPU
    backend the resident memory of small models is dominated by the heap's own noise: the ``training MiB`` of one
    run moved by tens of MiB between two builds; pass ``column="training MiB"`` to fit it anyway). ``batch``: the
    sequences of the measured step, for the source's description."""
    column = column or next((c for c in MEMORY_SOURCES if c in table and table[c].notna().all()), None)
    if column is None:
        raise ValueError("the table holds no measured memory (time_embedding_table with measure_training_steps)")
    model = run_config(table.run.iloc[0]).model
    at = f" at batch {batch}" if batch is not None else ""
    # the measured step runs on one device, unsharded: a run sharded over n devices holds its parameters' share there
    return memory_growth(table.params, table[column] * 2**20, f"{MEMORY_SOURCES[column]}{at} on one device, "
                                                              f"{model.num_layers} x {model.hidden_dim}, seq "
                                                              f"{model.max_seq_len}")


def plot_memory(growths: Mapping[str, MemoryGrowth]):
    """Fig. 16 on what it means: a panel per ``MemoryGrowth`` (the mapping's keys title them), peak memory against
    the parameter count, with the fitted line (its slope: bytes per added parameter), the line of
    ``PARAMETER_BYTES`` per parameter from the first setting (where the points follow it, each parameter d_t adds
    costs what its own training state takes) and the fitted part that does not grow with the parameters."""
    import textwrap

    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(1, len(growths), figsize=(5.0 * len(growths), 4.0), squeeze=False)
    for ax, (title, g) in zip(axes[0], growths.items()):
        unit, scale = ("GiB", 2**30) if max(g.memory) >= 2**30 else ("MiB", 2**20)
        x, y = np.array(g.params), np.array(g.memory)
        line = np.linspace(0, x.max() * 1.05, 50)
        ax.plot(x / 1e6, y / scale, "o", color="black", label="planned" if "plan" in g.source else "measured",
                zorder=3)
        ax.plot(line / 1e6, (g.fixed + g.per_parameter * line) / scale, color="tab:blue",
                label=f"fit: {g.per_parameter:.1f} B per parameter")
        ax.plot(line / 1e6, (y[0] + PARAMETER_BYTES * (line - x[0])) / scale, "--", color="tab:red",
                label=f"{PARAMETER_BYTES} B per parameter from the first d_t")
        ax.axhline(g.fixed / scale, color="0.5", lw=1, ls=":", label=f"fixed: {_bytes(g.fixed)}")
        ax.set_xlabel("parameters (M)")
        ax.set_ylabel(f"peak memory of a training step ({unit})")
        ax.set_title(title + "\n" + "\n".join(textwrap.wrap(g.source, 60)), fontsize=8)
        ax.set_xlim(0, None)
        ax.set_ylim(0, None)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    return fig


def plot_time_embedding(table):
    """Figs. 14-16 in one figure: perplexity (the mean over seeds, and each seed's as a dot), parameter count,
    training throughput and the peak memory that F9's verdict judges (``MEMORY_SOURCES``) against d_t."""
    import matplotlib.pyplot as plt

    speed = "step tokens/s" if "step tokens/s" in table else "tokens/s"
    panels = [("final ppl", "final validation perplexity"), ("params", "parameters"), (speed, "training tokens/s")]
    memory = next((c for c in MEMORY_SOURCES if c in table and table[c].notna().all()), None)
    if memory is not None:  # the memory the verdict judges (time_embedding_memory)
        panels.append((memory, f"peak memory (MiB):\n{MEMORY_SOURCES[memory]}"))
    fig, axes = plt.subplots(1, len(panels), figsize=(3.3 * len(panels), 3.2))
    for ax, (column, title) in zip(axes, panels):
        ax.plot(table.d_t, table[column], marker="o", label="mean over seeds" if column == "final ppl" else None)
        if column == "final ppl" and "finals" in table:  # the spread: each seed's final perplexity as a dot
            xs = [d for d, finals in zip(table.d_t, table.finals) for _ in finals]
            ax.scatter(xs, [v for finals in table.finals for v in finals], s=12, color="black", zorder=3,
                       label="each seed")
            ax.legend(fontsize=7)
        ax.set_xscale("log", base=2)
        ax.set_xticks(list(table.d_t), [str(v) for v in table.d_t])
        ax.set_xlabel("time-embedding size $d_t$")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def _main(argv: list[str] | None = None) -> None:
    use_onednn(cacheable=True)  # oneDNN's kernels in a form the compilation cache keeps (measure_training_step)
    parser = argparse.ArgumentParser(prog="python -m diffeqformer.analysis.ablations")
    parser.add_argument("--measure", metavar="RUN_DIR", required=True,
                        help="measure time and peak memory of training steps of this run's model (one JSON line)")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--wait-turn", action="store_true",
                        help=f"after compiling and one step, print '{READY}' and time once a line comes on stdin")
    parser.add_argument("--cache", metavar="DIR", help="JAX's persistent compilation cache for this process, which "
                        "keeps every program (set here rather than in the environment, which a forked process "
                        "shares with its server)")
    args = parser.parse_args(argv)
    if args.batch < 1 or args.steps < 1:
        raise SystemExit(f"error: --batch and --steps must be positive, got {args.batch} and {args.steps}")
    if args.cache:
        import jax

        jax.config.update("jax_compilation_cache_dir", args.cache)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    print(json.dumps(_measure(args.measure, args.batch, args.steps, wait_turn=args.wait_turn)))


if __name__ == "__main__":
    _main()
