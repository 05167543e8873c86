"""F7-F10's figures (``analysis.ablations``' tables, ``analysis.memory``'s fits): fine-tuning curves and their
differences, training curves of the ablations, the time-embedding sweep and its memory."""

from __future__ import annotations

import textwrap
from typing import Mapping, Sequence

import matplotlib
import numpy as np
from matplotlib.figure import Figure

from ...analysis import ablations, claims
from ...analysis.memory import PARAMETER_BYTES, MemoryGrowth
from ..figures import log_perplexity_axis
from ..words.ablations import size

MARKERS = ("o", "s", "^", "D", "v", "P")
"""The markers of the DiffEqFormer lines of F7, one per N."""


def _finetune_panels(table, height: float):
    """A figure with one panel per direction (rows) and method (columns) of a ``finetune_table``, titled, the
    bottom row's x axis labelled, and (panel, that panel's rows of the table, whether it is in the first column)."""
    directions = list(dict.fromkeys(table.direction))
    methods = list(dict.fromkeys(table.method))
    fig = Figure(figsize=(5.2 * len(methods), height * len(directions)))
    axes = fig.subplots(len(directions), len(methods), squeeze=False, sharey=True)
    panels = []
    for i, direction in enumerate(directions):
        for j, method in enumerate(methods):
            ax = axes[i][j]
            ax.set_title(f"{direction}, {ablations.method_name(method)}", fontsize=10)
            if i == len(directions) - 1:
                ax.set_xlabel("fine-tuning step")
            panels.append((ax, table[(table.direction == direction) & (table.method == method)], j == 0))
    return fig, panels


def _finetune_style(model: str, odes: Sequence[str]) -> dict:
    """DiffEqFormer N (viridis, a hollow marker per N, on top), the GPT-2 baseline (red, thick, translucent and
    under the others, so that a DiffEqFormer line on it shows), from scratch (dashed grey)."""
    if "from scratch" in model:
        return dict(color="0.5", ls="--", marker=".", ms=3, lw=1.2)
    if model.startswith("DiffEqFormer N="):
        k = odes.index(model)
        return dict(color=matplotlib.colormaps["viridis"](0.15 + 0.7 * k / max(len(odes) - 1, 1)),
                    marker=MARKERS[k % len(MARKERS)], ms=4, lw=1.1, mfc="none", zorder=3)
    return dict(color="tab:red", lw=3.0, alpha=0.55, marker="x", ms=5, zorder=2)


def finetune(table, *, log: bool = True) -> Figure:
    """Fig. 5: validation perplexity during fine-tuning, a panel per direction (rows) and method (columns), a line
    per model (the mean over its seeds) with a marker of its own, so that lines that coincide stay visible.
    The shared y axis spans the compared lines (DiffEqFormer and the GPT-2 baseline), not the from-scratch line,
    which starts far above them: where it leaves the axis, the panel writes its final perplexity."""
    fig, panels = _finetune_panels(table, 3.6)
    compared, scratch = [], []
    for ax, rows, first_column in panels:
        odes = [m for m in rows.model if m.startswith("DiffEqFormer N=")]
        for row in rows.itertuples():
            curve = ablations.mean_curve(row.runs)
            ax.plot(curve.step, curve.perplexity, label=row.model, **_finetune_style(row.model, odes))
            if "from scratch" in row.model:
                scratch.append((ax, curve.perplexity.iloc[-1], curve.perplexity.max()))
            else:
                compared.extend(curve.perplexity)
        if log:
            log_perplexity_axis(ax, "validation perplexity" if first_column else "")
        elif first_column:
            ax.set_ylabel("validation perplexity")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    if compared:
        low, high = min(compared), max(compared)
        pad = (high / low) ** 0.05 if log else 1.0
        limits = (low / pad, high * pad) if log else (low - 0.05 * (high - low), high + 0.05 * (high - low))
        panels[0][0].set_ylim(*limits)  # shared by every panel
        for ax, final, peak in scratch:
            if peak > limits[1]:
                ax.text(0.98, 0.97, f"from scratch (dashed): above the axis, ends at {final:.0f}",
                        transform=ax.transAxes, ha="right", va="top", fontsize=7, color="0.35")
    fig.tight_layout()
    return fig


def finetune_differences(table) -> Figure:
    """Each DiffEqFormer N against the GPT-2 baseline during fine-tuning (``ablations.gpt_differences``), a panel
    per direction and method: the mean over the seed-matched pairs, the range over them shaded; zero is GPT-2, and
    the band of +-``claims.NEGLIGIBLE_PERCENT`` is what the book calls negligible."""
    fig, panels = _finetune_panels(table, 3.0)
    for ax, rows, first_column in panels:
        gpt = ablations.baseline_row(rows)
        odes = [m for m in rows.model if m.startswith("DiffEqFormer N=")]
        ax.axhspan(-claims.NEGLIGIBLE_PERCENT, claims.NEGLIGIBLE_PERCENT, color="0.88", lw=0,
                   label=f"within +-{claims.NEGLIGIBLE_PERCENT:g}%: negligible")
        ax.axhline(0, color="tab:red", lw=1.5, alpha=0.6, label=gpt.model if gpt is not None else "GPT-2")
        for model, (steps, percent) in ablations.gpt_differences(rows).items():
            style = _finetune_style(model, odes)
            ax.plot(steps, percent.mean(axis=1), label=model, **style)
            if percent.shape[1] > 1:
                ax.fill_between(steps, percent.min(axis=1), percent.max(axis=1), color=style["color"], alpha=0.15,
                                lw=0)
        if first_column:
            ax.set_ylabel("DiffEqFormer against GPT-2 (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def _curves(ax, table, label, log: bool) -> None:
    for row in table.itertuples():
        band = ablations.seed_band(row.runs)
        text = label(row) + (f" ({row.seeds} seeds)" if row.seeds > 1 else "")
        (line,) = ax.plot(band.index, band["mean"].values, marker="o", ms=3, lw=1.3, label=text)
        if row.seeds > 1:
            ax.fill_between(band.index, band["min"].values, band["max"].values, color=line.get_color(), alpha=0.2,
                            lw=0)
    ax.set_ylabel("validation perplexity")
    if log:
        log_perplexity_axis(ax)
    ax.set_xlabel("training step")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)


def curves(table, label, *, log: bool = True) -> Figure:
    """Validation perplexity during training, a line per row of an ``ablation_table`` labelled ``label(row)``: the
    mean over the row's seeds, shaded from the lowest to the highest seed where there are several."""
    fig = Figure(figsize=(7, 4))
    _curves(fig.subplots(), table, label, log)
    return fig


def beta2(table, *, log: bool = True) -> Figure:
    """F8 (Fig. 7): ``curves`` of a ``beta2_table``, a panel per model key."""
    keys = list(dict.fromkeys(table.key))
    fig = Figure(figsize=(5.5 * len(keys), 3.8))
    axes = fig.subplots(1, len(keys), sharey=True, squeeze=False)
    for ax, key in zip(axes[0], keys):
        rows = table[table.key == key]
        _curves(ax, rows, lambda r: f"beta2 = {r.beta2:g}", log)
        ax.set_title(rows.model.iloc[0], fontsize=10)
    fig.tight_layout()
    return fig


def memory(growths: Mapping[str, MemoryGrowth]) -> Figure:
    """Fig. 16 on what it means: a panel per ``MemoryGrowth`` (titled by its key), peak memory against the parameter
    count, with the fitted line (its slope: bytes per added parameter), the line of ``PARAMETER_BYTES`` per
    parameter from the first setting and the fitted part that does not grow with the parameters."""
    fig = Figure(figsize=(5.0 * len(growths), 4.0))
    axes = fig.subplots(1, len(growths), squeeze=False)
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
        ax.axhline(g.fixed / scale, color="0.5", lw=1, ls=":", label=f"fixed: {size(g.fixed)}")
        ax.set_xlabel("parameters (M)")
        ax.set_ylabel(f"peak memory of a training step ({unit})")
        ax.set_title(title + "\n" + "\n".join(textwrap.wrap(g.source, 60)), fontsize=8)
        ax.set_xlim(0, None)
        ax.set_ylim(0, None)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    return fig


def time_embedding(table) -> Figure:
    """Figs. 14-16 in one: against d_t, perplexity (the mean over seeds, and each seed's as a dot), parameters,
    training throughput and the peak memory F9's verdict judges (``ablations.memory_column``)."""
    speed = "step tokens/s" if "step tokens/s" in table else "tokens/s"
    panels = [("final ppl", "final validation perplexity"), ("params", "parameters"), (speed, "training tokens/s")]
    memory = ablations.memory_column(table)
    if memory is not None:
        panels.append((memory, f"peak memory (MiB):\n{ablations.MEMORY_SOURCES[memory]}"))
    fig = Figure(figsize=(3.3 * len(panels), 3.2))
    for ax, (column, title) in zip(fig.subplots(1, len(panels)), panels):
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
