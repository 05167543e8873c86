"""How clustered the tokens of ``analysis.trajectories`` are, and F3's tests over seeds: the metrics of a solve at
every saved time (from the cosine Gram matrix, as Geshkovski et al.'s public code measures them), their final values,
the paper's Euler steps against more of them, and the verdicts (``statistics.compare``, ``claims.judge``) as tables."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pandas as pd
import xarray as xr

from .statistics import Comparison, Judged, compare, one_sample
from .trajectories import SolverConfig, TrajectoryConfig, growth_label, simulate


def cosine_gram(x: xr.DataArray) -> xr.DataArray:
    """G_ij = <x_i, x_j> / (|x_i| |x_j|) over ``token`` x ``token_j``, for every other index of x (dims must include
    ``token`` and ``dim``). On the sphere this is the plain Gram matrix <x_i, x_j>."""
    u = x / np.sqrt((x**2).sum("dim", skipna=False))
    return xr.dot(u, u.rename(token="token_j"), dim="dim")


def clustering_metrics(ds: xr.Dataset | xr.DataArray, threshold: float = 0.999) -> xr.Dataset:
    """Clustering of the tokens at every saved time, from the cosine Gram matrix G (``cosine_gram``; in free space,
    of directions), over every dimension of x but ``token`` and ``dim``: ``fraction`` of the pairs i < j with
    G_ij > threshold (0.999 as in Geshkovski et al.'s code), ``clusters`` = rank of 1[G > threshold] (as their code
    counts them), ``distance``: mean chord distance sqrt(2 - 2 G_ij) over pairs."""
    x = ds["x"] if isinstance(ds, xr.Dataset) else ds
    g = cosine_gram(x).transpose(..., "token", "token_j")
    arr = np.asarray(g.values, dtype=np.float64)
    n = arr.shape[-1]
    iu = np.triu_indices(n, k=1)
    pairs = arr[..., iu[0], iu[1]]
    finite = np.all(np.isfinite(pairs), axis=-1) if pairs.shape[-1] else np.ones(arr.shape[:-2], bool)
    above = np.where(np.isfinite(arr), arr, 0.0) > threshold
    diag = np.arange(n)
    above[..., diag, diag] = True  # a token is always with itself (G_ii can round to just below a threshold near 1)
    fraction = (pairs > threshold).mean(axis=-1) if pairs.shape[-1] else np.ones(arr.shape[:-2])
    clusters = np.linalg.matrix_rank(above.astype(np.float64)).astype(np.float64)
    distance = np.sqrt(np.clip(2.0 - 2.0 * pairs, 0.0, None)).mean(axis=-1) if pairs.shape[-1] else np.zeros(
        arr.shape[:-2]
    )
    dims = g.dims[:-2]
    coords = {k: v for k, v in g.coords.items() if set(v.dims) <= set(dims)}
    out = xr.Dataset(
        {
            "fraction": (dims, np.where(finite, fraction, np.nan)),
            "clusters": (dims, np.where(finite, clusters, np.nan)),
            "distance": (dims, np.where(finite, distance, np.nan)),
        },
        coords=coords,
        attrs={**(ds.attrs if isinstance(ds, xr.Dataset) else {}), "threshold": threshold},
    )
    out["fraction"].attrs["long_name"] = f"fraction of pairs with cos > {threshold:g}"
    out["clusters"].attrs["long_name"] = f"rank of 1[cos > {threshold:g}]"
    out["distance"].attrs["long_name"] = "mean pairwise chord distance"
    return out


def final_metrics(metrics: xr.Dataset, by: str | None = None) -> pd.DataFrame:
    """Final-time ``clustering_metrics`` (of a solve's, computed first) per value of ``by`` (default ``growth`` or
    ``head``): ``<metric>_mean``, ``<metric>_std`` over seeds (0 with one) and ``seeds`` (the finite runs)."""
    if "x" in metrics:
        metrics = clustering_metrics(metrics)
    by = by or next(d for d in ("growth", "head") if d in metrics.dims)
    last = metrics.isel(time=-1)
    rest = [d for d in last.dims if d != by]
    rows = {}
    for name in ("fraction", "clusters", "distance"):
        v = last[name]
        rows[f"{name}_mean"] = v.mean(rest).values if rest else v.values
        rows[f"{name}_std"] = v.std(rest).values if rest else np.zeros(v.shape)
    counts = last["fraction"].notnull().sum(rest).values if rest else np.ones(last.sizes[by], int)
    index = metrics["growth_label"].values if by == "growth" and "growth_label" in metrics.coords else metrics[by].values
    table = pd.DataFrame(rows, index=pd.Index(index, name="g(t)" if by == "growth" else by))
    table["seeds"] = counts
    return table


def step_convergence(
    config: TrajectoryConfig, steps, *, cache_dir: Path | str | None = None, threshold: float = 0.999
) -> xr.Dataset:
    """``config``'s systems solved with N Euler steps for each N in ``steps`` (each a cached ``simulate`` call): a
    Dataset over (steps, growth, seed) of ``clustering_metrics`` at T and ``success``, attrs of the finest solve."""
    steps = [int(n) for n in steps]
    if not steps:
        raise ValueError("steps must not be empty")
    finals, attrs = [], {}
    for n in steps:
        solver = SolverConfig("euler", adaptive=False, num_steps=n, project=config.solver.project)
        ds = simulate(dataclasses.replace(config, solver=solver), cache_dir=cache_dir)
        final = clustering_metrics(ds.isel(time=[-1]), threshold).isel(time=0, drop=True)
        final["success"] = ds["success"]
        finals.append(final)
        attrs = ds.attrs
    out = xr.concat(finals, dim=pd.Index(steps, name="steps"))
    out.attrs = {**attrs, "threshold": threshold, "steps": steps}
    return out


VERDICT_COLUMNS = ("comparison", "mean a", "mean b", "difference", "low", "high", "p", "test", "seeds",
                   "detectable", "verdict")
"""The columns of ``growth_verdicts`` and ``paired_verdicts``: a row per test; for a trend, ``difference`` is the mean
of the simulations' slopes per unit of p and the means are NaN; ``low``, ``high``: its 95% confidence interval (NaN
for an exact test of values without spread); ``detectable``: the smallest difference the test finds 80% of the time
(``statistics.Judged.detectable``: its power)."""


def _verdict_row(what: str, judged: Judged | None, n: int, *, trend: bool = False) -> dict:
    if judged is None:  # no seed with finite values on both sides
        return dict(comparison=what, **{k: math.nan for k in ("mean a", "mean b", "difference", "low", "high", "p",
                                                              "detectable")},
                    test="", seeds=n, verdict=f"untested: {n} seeds")
    means = (math.nan, math.nan) if trend else (judged.a.mean, judged.b.mean)
    values = (*means, judged.difference, judged.low, judged.high)
    return dict(comparison=what, **dict(zip(("mean a", "mean b", "difference", "low", "high"), values)),
                p=judged.p, test=judged.test, seeds=n, detectable=judged.detectable, verdict=judged.verdict)


def _paired_row(what: str, a: np.ndarray, b: np.ndarray) -> dict:
    """The paired test of ``a`` against ``b`` (per seed) over the seeds finite on both sides."""
    ok = np.isfinite(a) & np.isfinite(b)
    return _verdict_row(what, compare(a[ok], b[ok], paired=True) if ok.any() else None, int(ok.sum()))


def final_fraction(ds: xr.Dataset, threshold: float = 0.999) -> xr.DataArray:
    """Fraction of clustered pairs at T, (growth, seed)."""
    return clustering_metrics(ds.isel(time=[-1]), threshold)["fraction"].isel(time=0, drop=True)


def growth_verdicts(ds: xr.Dataset, threshold: float = 0.999) -> pd.DataFrame:
    """Does weight sharing leave more pairs clustered at T than growth, and does the fraction change with p? Per p > 0
    the paired test of the fraction at T (``g = 1 vs g = t^p``), and ``trend over p`` (``dispersion_test``)."""
    final = final_fraction(ds, threshold)
    powers = [float(p) for p in final["growth"].values]
    if 0.0 not in powers:
        raise ValueError(f"growth_verdicts compares against weight sharing (p = 0), not among {powers}")
    base = final.sel(growth=0.0).values
    rows = [_paired_row(f"g = 1 vs g = {growth_label(p)}", base, final.sel(growth=p).values)
            for p in powers if p != 0.0]
    slopes = dispersion_slopes(ds, threshold)
    rows.append(_verdict_row("trend over p", one_sample(slopes) if slopes else None, len(slopes), trend=True))
    return pd.DataFrame(rows, columns=list(VERDICT_COLUMNS))


def dispersion_slopes(ds: xr.Dataset, threshold: float = 0.999) -> list[float]:
    """Per simulation (seed), the least-squares slope of the fraction of clustered pairs at T against p over its
    finished solves (at least two): the unit of F3's test."""
    final = final_fraction(ds, threshold).transpose("growth", "seed")
    powers = np.asarray(final["growth"].values, dtype=float)
    out = []
    for values in final.values.T:
        ok = np.isfinite(values)
        if len(set(powers[ok])) >= 2:
            x, y = powers[ok] - powers[ok].mean(), values[ok]
            out.append(float(x @ (y - y.mean()) / (x @ x)))
    return out


def dispersion_test(ds: xr.Dataset, threshold: float = 0.999) -> Comparison:
    """F3's primary test (``claims.CLAIMS["f3_dispersion"]``): the one-sample t-test of ``dispersion_slopes`` against
    0 (the exact sign-flip test where every simulation has the same slope)."""
    slopes = dispersion_slopes(ds, threshold)
    if not slopes:
        raise ValueError("no simulation finished two growth laws: nothing to take a slope of")
    return one_sample(slopes)


def verdicts(ds: xr.Dataset, threshold: float = 0.999) -> dict:
    """The verdict on F3's claim (``claims.Verdict``) from ``dispersion_test`` of the paper's weights, solved
    accurately (``ds``)."""
    from . import claims

    return {"f3_dispersion": claims.judge("f3_dispersion", dispersion_test(ds, threshold), unit="simulation")}


def paired_verdicts(a: xr.Dataset, b: xr.Dataset, threshold: float = 0.999) -> pd.DataFrame:
    """For each growth law, the fraction of clustered pairs at T of ``a`` against ``b``, the same seeds solved two ways
    (paired t-tests; e.g. the paper's Euler steps against the accurate solve): a DataFrame with ``VERDICT_COLUMNS``."""
    fa, fb = final_fraction(a, threshold), final_fraction(b, threshold)
    if list(fa["seed"].values) != list(fb["seed"].values) or list(fa["growth"].values) != list(fb["growth"].values):
        raise ValueError("paired_verdicts needs the same seeds and growth laws on both sides")
    rows = [_paired_row(f"g = {growth_label(float(p))}", fa.sel(growth=p).values, fb.sel(growth=p).values)
            for p in fa["growth"].values]
    return pd.DataFrame(rows, columns=list(VERDICT_COLUMNS))


def model_final(datasets, at: float, metric: str = "fraction", threshold: float = 0.999) -> np.ndarray:
    """``metric`` of ``clustering_metrics`` at the saved time nearest ``at``, mean over heads, of each
    ``simulate_model`` Dataset in ``datasets`` (one per trained seed): [runs]."""
    return np.asarray([float(clustering_metrics(ds.sel(time=[at], method="nearest"), threshold)[metric].mean())
                       for ds in datasets])


def model_verdicts(ours, reference, at: float = 1.0, threshold: float = 0.999) -> pd.DataFrame:
    """DiffEqFormer's heads against a reference model's (the weight-shared one) at the saved time nearest ``at``: the
    fraction of clustered pairs and the mean pairwise distance, each the mean over heads of one trained seed
    (``model_final``), compared over the trained seeds by ``statistics.compare``: paired where both have the same
    number of seeds (seed k of both shares its data order: ``workflow.presets.seeded``), else Welch. Returns a DataFrame with
    ``VERDICT_COLUMNS`` (``mean a``: ``ours``)."""
    ours, reference = list(ours), list(reference)
    paired = len(ours) == len(reference)
    rows = []
    for metric in ("fraction", "distance"):
        a, b = model_final(ours, at, metric, threshold), model_final(reference, at, metric, threshold)
        rows.append(_verdict_row(f"{metric} at t = {at:g}", compare(a, b, paired=paired), min(len(a), len(b))))
    return pd.DataFrame(rows, columns=list(VERDICT_COLUMNS))


PAPER_FRACTIONS = {0.0: 1.0, 1.0: 0.0, 2.0: 0.0, 3.0: 0.0, 4.0: 0.0}
"""The fraction of clustered token pairs at T that the paper implies per growth power p (Fig. 2c-d, Fig. 13):
every pair clustered under weight sharing, none under growth. The paper says growth faster than linear does not
cluster and leaves linear growth open; counting it as not clustering gives the smallest slope the claim allows."""


@dataclasses.dataclass(frozen=True)
class PowerDesign:
    """How many simulations F3's test needs to detect the slope the paper implies (``simulations_needed``)."""

    slope: float
    """The least-squares slope of ``PAPER_FRACTIONS`` against p: the effect to detect, per unit p."""
    sd: float
    """The largest standard deviation that simulations' slopes with that mean can have."""
    power: float
    alpha: float
    simulations: int
    """The fewest simulations whose one-sample t-test detects ``slope`` with ``power`` at ``alpha``, two-sided."""


def simulations_needed(fractions=PAPER_FRACTIONS, power: float = 0.8, alpha: float = 0.05) -> PowerDesign:
    """The number of simulations for F3's test (``dispersion_test``) from what the paper implies, by statsmodels'
    ``TTestPower``. A simulation's fractions lie in [0, 1], so its slope against p lies in [-M, M], M the slope of
    fractions 1 where p is above its mean and 0 elsewhere; by the Bhatia-Davis inequality slopes of mean mu within
    [-M, M] have a variance of at most (M - mu)(mu + M). The design holds whatever the simulations' spread."""
    from statsmodels.stats.power import TTestPower

    p = np.asarray(list(fractions), dtype=float)
    x = p - p.mean()
    slope = float(x @ np.asarray(list(fractions.values()), dtype=float) / (x @ x))
    bound = float(x.clip(min=0).sum() / (x @ x))
    sd = math.sqrt((bound - slope) * (slope + bound))
    n = TTestPower().solve_power(effect_size=abs(slope) / sd, alpha=alpha, power=power, alternative="two-sided")
    return PowerDesign(slope, sd, power, alpha, math.ceil(n))


def fraction_table(datasets, verdicts, threshold: float = 0.999) -> pd.DataFrame:
    """F3's results in one table: per setting (``datasets``: name -> a ``simulate`` Dataset; ``verdicts``: name -> its
    ``growth_verdicts``), the fraction of clustered pairs at T per growth law g (mean over the simulations, the
    paper's quantity), then the slope over p with its 95% interval and p, and the difference g = 1 against t^4 with
    its p."""
    rows = {}
    for name, ds in datasets.items():
        final = final_fraction(ds, threshold).mean("seed")
        row = {f"g = {label}": float(v) for label, v in zip(ds["growth_label"].values, final.values)}
        judged = verdicts[name].set_index("comparison")
        for key, what in (("slope", "trend over p"), ("1 vs t^4", "g = 1 vs g = t^4")):
            if what in judged.index:
                found = judged.loc[what]
                row.update({key: found["difference"], f"{key} low": found["low"], f"{key} high": found["high"],
                            f"{key} p": found["p"]})
        row["simulations"] = int(ds.sizes["seed"])
        rows[name] = row
    return pd.DataFrame.from_dict(rows, orient="index").rename_axis("setting")


__all__ = ["PAPER_FRACTIONS", "PowerDesign", "VERDICT_COLUMNS", "clustering_metrics", "cosine_gram",
           "dispersion_slopes", "dispersion_test", "final_fraction", "final_metrics", "fraction_table",
           "growth_verdicts", "model_final", "model_verdicts", "paired_verdicts", "simulations_needed",
           "step_convergence", "verdicts"]
