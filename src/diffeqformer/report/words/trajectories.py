"""F3's words: the trajectories' verdict lines and headline numbers."""

from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd
import xarray as xr

from ...analysis import clustering
from . import statistics as wording


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
        interval = "" if math.isnan(row["low"]) else f" [{row['low']:+.{digits}f}, {row['high']:+.{digits}f}]"
        out[slug] = (f"{row['difference']:+.{digits}f}{interval}, {wording.p_text(row['p'])}, {row['test']}: "
                     f"{row['verdict']}")
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


def power_text(design, num_seeds: int) -> str:
    """F3's design in a sentence: the slope the paper implies, how many simulations detect it (``design``:
    ``clustering.simulations_needed``) and how many this page ran (``num_seeds``)."""
    ran = ("as many as this page runs" if num_seeds == design.simulations else
           f"this page runs {num_seeds}, " + ("more" if num_seeds > design.simulations else "fewer, so the verdict "
                                              "can miss it"))
    return (f"The paper implies every pair clustered under weight sharing and none under growth, a slope of "
            f"{design.slope:+.2f} per unit p; whatever the simulations' spread (their slopes' standard deviation is "
            f"at most {design.sd:.2f} with that mean), {design.simulations} simulations detect it "
            f"{design.power:.0%} of the time at p < {design.alpha:g} (statsmodels' TTestPower, two-sided): {ran}")
