"""F5's pictures: the token-level Lyapunov map, the attribution methods' scores of an example's tokens (a figure,
and coloured HTML for the page), and the attribution benchmark's hit rates."""

from __future__ import annotations

import html
from typing import Sequence

import matplotlib
import numpy as np
import pandas as pd
import xarray as xr
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from ...analysis import attribution


def tokens_html(tokens: Sequence[str], scores, *, output_position: int | None = None, cmap: str = "Reds") -> str:
    """Tokens as HTML spans, background coloured by score (NaN: uncoloured), the output position outlined."""
    scores = np.asarray(scores, dtype=float)
    finite = scores[np.isfinite(scores)]
    lo, hi = (finite.min(), finite.max()) if finite.size else (0.0, 1.0)
    colormap = matplotlib.colormaps[cmap]
    spans = []
    for i, (tok, s) in enumerate(zip(tokens, scores)):
        style = "padding:1px 2px;border-radius:3px;"
        if np.isfinite(s):
            rgba = colormap(0.85 * (s - lo) / (hi - lo) if hi > lo else 0.0)
            style += f"background:{matplotlib.colors.to_hex(rgba)};"
        if output_position is not None and i == output_position % len(tokens):
            style += "outline:2px solid #1f4e9c;"
        spans.append(f'<span title="{s:.3f}" style="{style}">{html.escape(tok)}</span>')
    return '<div style="font-family:monospace;line-height:1.9">' + "".join(spans) + "</div>"


SCORE_LABELS = {"max_exponent": "largest Lyapunov exponent $\\lambda_1$ (e-folds per unit $t$)",
                "sum_exponents": "sum of the Lyapunov exponents (e-folds per unit $t$)",
                "kaplan_yorke": "Kaplan-Yorke dimension (directions, no unit)"}
"""What each score of a ``lyapunov_map`` is, for a colour bar."""


def lyapunov_map(ds: xr.Dataset, score: str = "max_exponent") -> Figure:
    """Heat map of a ``lyapunov.lyapunov_map`` score: output position (rows) x input token (columns)."""
    fig = Figure(figsize=(6.5, 5.5))
    ax = fig.subplots()
    values = ds[score].transpose("output", "token").values
    im = ax.imshow(values, cmap="magma", aspect="auto", interpolation="nearest")
    ax.set_xlabel("input token")
    ax.set_ylabel("output position")
    ax.set_title(f"Token-level Lyapunov map ({score.replace('_', ' ')})")
    if "text" in ds.coords and ds.sizes["token"] <= 40:
        text = ds["text"].values
        ax.set_xticks(range(ds.sizes["token"]), text, rotation=90, fontsize=7)
        ax.set_yticks(range(ds.sizes["output"]), [text[int(o)] for o in ds["output"].values], fontsize=7)
    fig.colorbar(im, ax=ax, shrink=0.8, label=SCORE_LABELS.get(score, score.replace("_", " ")))
    return fig


def _earlier_only(scores: pd.DataFrame) -> tuple[list[str], list[str], np.ndarray]:
    """The tokens, the methods and their scores [method, token] with the output position itself set to NaN: its own
    score (the token's influence on itself) dwarfs every other, and the question is which earlier token matters.
    Scores that are not finite are NaN too (uncoloured): one -inf would make a row's min-max scale infinite."""
    tokens = list(scores["text"]) if "text" in scores else [str(i) for i in scores.index]
    methods = [c for c in scores.columns if c != "text"]
    values = scores[methods].to_numpy(dtype=float).T.copy()
    values[~np.isfinite(values)] = np.nan
    out = scores.attrs.get("output_position")
    if out is not None:
        values[:, out] = np.nan
    return tokens, methods, values


def scores_html(scores: pd.DataFrame, *, cmap: str = "Reds") -> str:
    """An HTML table: one line of coloured tokens (``tokens_html``) per method of ``attribution.attribution_scores``,
    each on its own scale over the earlier tokens; the output position is outlined and left uncoloured."""
    out = scores.attrs.get("output_position")
    rows = []
    tokens, methods, values = _earlier_only(scores)
    for method, row in zip(methods, values):
        line = tokens_html(tokens, row, output_position=out, cmap=cmap)
        rows.append(f'<tr><td style="padding-right:8px;white-space:nowrap;vertical-align:top">{html.escape(method)}'
                    f"</td><td>{line}</td></tr>")
    return "<table>" + "".join(rows) + "</table>"


def token_scores(scores: pd.DataFrame, *, cmap: str = "Reds") -> Figure:
    """``scores_html`` as a figure: rows are methods, columns input tokens, each row min-max scaled to [0, 1] over the
    earlier tokens' finite scores (scores that are not finite, later tokens and the outlined output position itself:
    white); token labels as x ticks."""
    tokens, methods, values = _earlier_only(scores)  # values: [method, token]
    finite = np.isfinite(values)  # a row without any finite score stays blank (lo = inf, hi = -inf)
    lo = np.min(np.where(finite, values, np.inf), axis=1, keepdims=True)
    hi = np.max(np.where(finite, values, -np.inf), axis=1, keepdims=True)
    scaled = (values - lo) / np.where(hi > lo, hi - lo, 1.0)
    n = values.shape[1]
    fig = Figure(figsize=(max(6.0, 0.24 * n + 2.5), 0.45 * len(methods) + 1.6), layout="constrained")
    ax = fig.subplots()
    im = ax.imshow(np.ma.masked_invalid(scaled), cmap=cmap, vmin=0, vmax=1, aspect="auto", interpolation="nearest")
    ax.set_yticks(range(len(methods)), methods, fontsize=8)
    ax.set_xticks(range(n), tokens, rotation=90, fontsize=7)
    out = scores.attrs.get("output_position")
    if out is not None:
        ax.add_patch(Rectangle((out - 0.5, -0.5), 1, len(methods), fill=False, edgecolor="#1f4e9c", lw=2))
    fig.colorbar(im, ax=ax, label="score, min-max scaled per method", shrink=0.9)
    ax.set_title("Which input tokens drive the prediction at the outlined position", fontsize=10)
    return fig


def benchmark(summary: pd.DataFrame) -> Figure:
    """The attribution benchmark (``attribution.summarize``): hit@1 (dark) and hit@3 (light) of every method, a panel
    per task (means over seeds; each seed's hit@1 as a dot where there are several), a random ranking's hit@1 and
    hit@3 as dashed and dotted lines, the model's accuracy on the task in the panel's title."""
    mean = attribution.over_seeds(summary)
    tasks = list(dict.fromkeys(mean["task"]))
    fig = Figure(figsize=(4.6 * len(tasks), 3.8), layout="constrained")
    axes = fig.subplots(1, len(tasks), sharey=True, squeeze=False)
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
