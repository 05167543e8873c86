"""F2's words: the eigenvalue spectra's growth with depth, as phrases, table cells and the headline."""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from ...analysis import spectra
from . import statistics as wording


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
    return f"{head}: {c.verdict}" if c.untested else f"{head}, {wording.interval(c, 2)} over {c.n} seeds: {c.verdict}"


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
