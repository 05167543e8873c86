"""The language-modelling figures: F6's perplexity curves (``analysis.perplexity``), x1's perplexity against
solver work (``analysis.inference``) and F11's downstream accuracies (``analysis.downstream``)."""

from __future__ import annotations

from typing import Iterable, Mapping

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from ..figures import log_perplexity_axis
from ..words.language import MODEL_LABELS


def perplexity_curves(frame: pd.DataFrame, rows: Iterable[str], *, log: bool = True, title: str | None = None
                      ) -> Figure:
    """F6: validation perplexity against training step (``perplexity.curves``), one line per row key, in the order
    of ``rows`` (``perplexity.ROWS``): the mean over its seeds, banded from the lowest to the highest seed where there
    are several (dashed: the mean training perplexity)."""
    fig = Figure(figsize=(7, 4))
    ax = fig.subplots()
    for key in [k for k in rows if k in set(frame.row)]:
        by_step = frame[frame.row == key].groupby("step")
        val, seeds = by_step.perplexity, by_step.seed.nunique().max()
        label = frame[frame.row == key].label.iloc[0] + (f" ({seeds} seeds)" if seeds > 1 else "")
        (line,) = ax.plot(val.mean().index, val.mean().values, marker="o", ms=3, lw=1.4, label=label)
        if seeds > 1:
            ax.fill_between(val.min().index, val.min().values, val.max().values, color=line.get_color(), alpha=0.2,
                            lw=0)
        train = by_step.train_perplexity.mean()
        ax.plot(train.index, train.values, ls="--", lw=0.8, color=line.get_color(), alpha=0.6)
    ax.set_ylabel("perplexity (solid: validation, dashed: training)")
    if log:
        log_perplexity_axis(ax, "perplexity (solid: validation, dashed: training)")
    ax.set_xlabel("training step")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    if title:
        ax.set_title(title)
    return fig


_STYLE = {"euler": ("C0", "o"), "euler_left": ("C4", "v"), "heun": ("C1", "s"), "midpoint": ("C2", "^"),
          "tsit5": ("C3", "D"), "dopri5": ("C5", "P"), "bosh3": ("C6", "X")}
_LABEL = {"euler": "Euler, t_k=(k+1)/N (training grid)", "euler_left": "Euler, t_k=k/N", "heun": "Heun",
          "midpoint": "midpoint", "tsit5": "Tsit5 (PID, tol. marked)", "dopri5": "Dopri5 (PID, tol. marked)",
          "bosh3": "Bosh3 (PID, tol. marked)"}


def _num_layers(frame: pd.DataFrame) -> int | None:
    return (frame.attrs.get("model") or {}).get("num_layers")


def perplexity_vs_nfe(frame: pd.DataFrame, *, title: str | None = None) -> Figure:
    """x1: validation perplexity against mean NFE per sequence (``inference.solver_sweep``; log x), a line per
    solver, adaptive solvers' points marked with their tolerance; dotted, the training discretisation (NFE = L),
    a star the model's own forward pass. The legend counts the settings that hit max_steps (no loss)."""
    fig = Figure(figsize=(7.0, 4.5), layout="constrained")
    ax = fig.subplots()
    for solver, rows in frame.groupby("solver", sort=False):
        color, marker = _STYLE.get(solver, ("k", "o"))
        rows = rows.sort_values("nfe")
        ok = rows["loss"].notna()
        label = _LABEL.get(solver, solver)
        if (~ok).any():
            label += f" ({int((~ok).sum())} setting(s) hit max_steps)"
        ax.plot(rows["nfe"][ok], rows["perplexity"][ok], marker=marker, color=color, label=label, lw=1.2, ms=5)
        if rows["adaptive"].iloc[0]:
            for _, r in rows[ok].iterrows():
                ax.annotate(f"{r['tolerance']:.0e}", (r["nfe"], r["perplexity"]), textcoords="offset points",
                            xytext=(4, 4), fontsize=7, color=color)
    L = _num_layers(frame)
    if L:
        ax.axvline(L, color="0.5", ls=":", lw=1, label=f"training: {L} Euler steps")
        own = frame[(frame["solver"] == "euler") & (frame["steps"] == L)]
        if len(own):
            ax.plot(own["nfe"], own["perplexity"], marker="*", ms=14, color="gold", mec="k", ls="none",
                    label="the model's own forward pass", zorder=5)
    ax.set_xscale("log")
    ax.set_xlabel("vector-field evaluations per sequence (NFE)")
    log_perplexity_axis(ax)
    data = frame.attrs.get("data", {})
    ax.set_title(title or f"perplexity vs NFE ({data.get('num_sequences', '?')} validation sequences)")
    ax.legend(fontsize=7)
    return fig


def perplexity_vs_steps(frames: Mapping[str, pd.DataFrame], *, title: str | None = None) -> Figure:
    """x1: perplexity against the number N of Euler steps on the training grid, a line per model name
    (``inference.perplexity_vs_euler_steps``); dotted, each model's L."""
    fig = Figure(figsize=(6.5, 4.0), layout="constrained")
    ax = fig.subplots()
    for i, (name, frame) in enumerate(frames.items()):
        rows = frame[frame["solver"] == "euler"].sort_values("steps")
        ax.plot(rows["steps"].astype(float), rows["perplexity"], marker="o", color=f"C{i}", label=name, ms=4)
        L = _num_layers(frame)
        if L:
            ax.axvline(L, color=f"C{i}", ls=":", lw=1)
    ax.set_xlabel("Euler steps N at inference (weights at t_k = (k+1)/N)")
    log_perplexity_axis(ax)
    ax.set_title(title or "perplexity vs Euler steps (dotted: training steps L)")
    ax.legend(fontsize=8)
    return fig


def _accuracy_panel(ax, task, metric, means, judged, models, colours, chance):
    width = 0.8 / len(models)
    shots = sorted(means[means.task == task].shots.unique())
    for j, model in enumerate(models):
        for i, k in enumerate(shots):
            row = means[(means.task == task) & (means.metric == metric) & (means.model == model) & (means.shots == k)]
            if row.empty:
                continue
            x = i + (j - (len(models) - 1) / 2) * width
            label = MODEL_LABELS.get(model, model) if i == 0 else None
            if metric == "perplexity":  # a bar's length on a log axis means nothing: its mean as a mark
                ax.plot([x], [row["mean"].iloc[0]], "D", color=colours[model], markersize=7, label=label)
            else:
                ax.bar(x, row["mean"].iloc[0], width, color=colours[model], alpha=0.8, label=label)
            values = judged[(judged.task == task) & (judged.metric == metric) & (judged.model == model)
                            & (judged.shots == k)].value
            ax.plot(np.full(len(values), x), values, "o", color="black", markersize=2.5)
    if metric == "perplexity":
        log_perplexity_axis(ax, "perplexity of the last word")
        shown = judged[(judged.task == task) & (judged.metric == metric)].value
        shown = shown[np.isfinite(shown)]
        if len(shown):  # the axis spans the values, not the decades below them
            ax.set_ylim(shown.min() / 1.25, shown.max() * 1.25)
    else:
        top = float(judged[(judged.task == task) & (judged.metric == metric)].value.max())
        ax.set_ylim(0, max(0.05, 1.15 * top, 1.15 * chance.get(task, 0)))
        ax.set_ylabel(metric)
        if top == 0:  # no bar has a height: say so rather than leave the panel looking empty
            ax.text(0.5, 0.5, f"{metric} 0 for every model,\nseed and shots", transform=ax.transAxes,
                    ha="center", va="center", fontsize=8, color="0.35")
        if task in chance:
            ax.axhline(chance[task], color="grey", linestyle="--", linewidth=1)
    ax.set_xticks(range(len(shots)), [f"{k}-shot" for k in shots])
    ax.set_title(task, fontsize=9)


def downstream_accuracies(means: pd.DataFrame, judged: pd.DataFrame, chance: Mapping[str, float]) -> Figure:
    """F11: a panel per task's headline metric, then the last-word task's target perplexity (log scale): a bar per
    model and shots at its mean over seeds (``downstream.summary``; for the perplexity a diamond), a dot per seed
    (``downstream.headline``), dashed the accuracy of guessing (``chance``, ``downstream.CHANCE``)."""
    panels = sorted(set(zip(means.task, means.metric)), key=lambda p: (p[1] == "perplexity", p[0]))
    fig = Figure(figsize=(3.4 * len(panels), 3.2))
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    models = [m for m in MODEL_LABELS if m in set(means.model)] + sorted(set(means.model) - set(MODEL_LABELS))
    colours = dict(zip(models, matplotlib.colormaps["tab10"].colors))
    for ax, (task, metric) in zip(axes, panels):
        _accuracy_panel(ax, task, metric, means, judged, models, colours, chance)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(models), fontsize=8, frameon=False,
               bbox_to_anchor=(0.5, -0.06))
    fig.tight_layout()
    return fig
