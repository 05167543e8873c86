"""F2's figures: eigenvalues of QK, OV and the FFN product against depth (``analysis.spectra``'s datasets)."""

from __future__ import annotations

import json
from typing import Mapping, Sequence

import numpy as np
import xarray as xr
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from ...analysis.spectra import MATRICES, depth_dim, log_radius

TITLES = {"qk": r"QK: $W_Q^h W_K^{h\top}$", "ov": r"OV: $W_V^h W_O^h$", "ffn": r"FFN: $W_1 W_2$"}


def _euler_times(ds: xr.Dataset) -> np.ndarray:
    """The Euler steps' times t_k = (k+1)/L of the model a dataset was computed from (empty without its config)."""
    num_layers = json.loads(ds.attrs["config"]).get("num_layers") if "config" in ds.attrs else None
    return (np.arange(num_layers or 0) + 1.0) / (num_layers or 1)


def _interpolated(ds: xr.Dataset) -> bool:
    """Whether a continuous model's dataset holds times off its Euler grid, where training never evaluated W(t)."""
    if depth_dim(ds) == "layer":
        return False
    euler = _euler_times(ds)
    return not all(np.isclose(euler, t, rtol=0, atol=1e-9).any() for t in ds["time"].values)


def _depth_label(ds, x: str | None = None) -> str:
    """The x-axis label: layer index, the depth fraction of a layer, an Euler step's time, or t off the Euler grid
    (said to be an interpolation: training only ever evaluated W(t) at its Euler steps)."""
    x = x or depth_dim(ds)
    ode = ds.attrs.get("model_kind", "").startswith("diffeqformer")
    if x == "layer":
        return "Euler step k" if ode else "layer k"
    if depth_dim(ds) == "layer":
        return "Euler step $t_k = (k+1)/L$" if ode else "depth $(k+1)/L$ of layer k"
    return "t (interpolation between the Euler steps)" if _interpolated(ds) else "Euler step $t_k$"


MODEL_LABELS = {"diffeqformer": "DiffEqFormer", "diffeqformer-shared": "weight-shared DiffEqFormer",
                "diffeqformer-discrete": "discretised DiffEqFormer", "gpt2": "GPT-2", "llama": "Llama"}
"""A spectra dataset's ``model_kind``, named in the titles."""


def _model_label(ds) -> str:
    return MODEL_LABELS.get(ds.attrs.get("model_kind", ""), ds.attrs.get("model_kind", "model"))


def _panels(n: int, nrows: int = 1, *, width: float = 3.0, height: float = 2.6):
    fig = Figure(figsize=(max(width * n + 1.0, 7.0), height * nrows + 0.8), layout="constrained")
    return fig, fig.subplots(nrows, n, squeeze=False, sharex=True)


def _points(ds: xr.Dataset, matrix: str, x: str):
    """Per panel (head, or the one FFN panel): flat arrays of depth coordinate and eigenvalue."""
    lam = ds[matrix]
    xs = ds[x].values
    if matrix == "ffn":
        lam = lam.expand_dims(head=[0], axis=1)
    values = lam.values  # [N, H, E]
    _, heads, e = values.shape
    return [(np.repeat(xs, e), values[:, h, :].reshape(-1)) for h in range(heads)]


def _mark_layers(ax, ds: xr.Dataset, x: str) -> None:
    """Faint vertical lines at the Euler steps' times t_k = (k+1)/L, on plots against continuous t."""
    if x != "time" or depth_dim(ds) != "time":
        return
    lo, hi = float(ds["time"].min()), float(ds["time"].max())
    for t in _euler_times(ds):
        if lo <= t <= hi:
            ax.axvline(t, color="0.85", lw=0.8, zorder=0)


def vs_depth(ds: xr.Dataset, matrix: str = "qk", part: str = "real", *, x: str | None = None,
             logy: bool = False, axes_row=None) -> Figure:
    r"""Eigenvalues of ``matrix`` against depth, one panel per head (Fig. 2a: ``part="real"``; 2b: ``part="abs"``).

    Each dot is one eigenvalue at one t (or layer). ``part="real"``: Re lambda, coloured by |lambda|;
    ``part="abs"``: |lambda|, coloured by Re lambda / |lambda| = cos(arg lambda) (red: positive real, blue:
    negative real, white: imaginary). ``x`` picks the depth coordinate: ``"time"`` (t, or (k+1)/L for layers) or
    ``"layer"``; by default the dataset's own depth dimension. ``logy``: log-scale magnitudes (``part="abs"``; the
    axis then starts at 1e-3 of the largest). On plots against continuous t, faint vertical lines mark the times
    t_k = (k+1)/L of the model's Euler steps.
    """
    if matrix not in MATRICES or part not in ("real", "abs"):
        raise ValueError(f"matrix must be one of {MATRICES} and part 'real' or 'abs', got {matrix!r}, {part!r}")
    x = x or depth_dim(ds)
    panels = _points(ds, matrix, x)
    standalone = axes_row is None
    if standalone:
        axes_row = _panels(len(panels))[1][0]
    fig = axes_row[0].figure
    mags = np.abs(ds[matrix].values)
    if part == "real":
        norm, cmap, clabel = Normalize(0.0, float(mags.max()) or 1.0), "viridis", r"$|\lambda|$"
    else:
        norm, cmap, clabel = Normalize(-1.0, 1.0), "coolwarm", r"Re$\,\lambda\,/\,|\lambda|$"
    for h, (ax, (xs, lam)) in enumerate(zip(axes_row, panels)):
        mag = np.abs(lam)
        if part == "real":
            y, c = lam.real, mag
        else:
            y, c = mag, np.divide(lam.real, mag, out=np.zeros_like(mag), where=mag > 0)
        order = np.argsort(mag)  # large eigenvalues drawn last, on top
        size = 4 if ds.sizes[depth_dim(ds)] > 48 else 10  # few depth points (an Euler grid): larger dots
        sc = ax.scatter(xs[order], y[order], c=c[order], cmap=cmap, norm=norm, s=size, linewidths=0)
        if part == "real":
            ax.axhline(0.0, color="0.6", lw=0.6, zorder=0)
        elif logy:
            ax.set_yscale("log")
            ax.set_ylim(1e-3 * (float(mags.max()) or 1.0), 2.0 * (float(mags.max()) or 1.0))
        _mark_layers(ax, ds, x)
        ax.set_title(f"{TITLES[matrix]}, head {h}" if matrix != "ffn" else TITLES[matrix], fontsize=9)
    if standalone:
        fig.supxlabel(_depth_label(ds, x), fontsize=10)
    axes_row[0].set_ylabel(r"Re $\lambda$" if part == "real" else r"$|\lambda|$")
    fig.colorbar(sc, ax=list(axes_row), label=clabel, shrink=0.9)
    what = "real part" if part == "real" else "magnitude"
    where = " (interpolation in t)" if _interpolated(ds) else ""
    fig.suptitle(f"{_model_label(ds)}: {what} of the eigenvalues of {TITLES[matrix]} against depth{where}")
    return fig


def complex_plane(ds: xr.Dataset, matrix: str = "qk") -> Figure:
    """Eigenvalues of ``matrix`` in the complex plane, one panel per head, coloured by depth (t or layer)."""
    if matrix not in MATRICES:
        raise ValueError(f"matrix must be one of {MATRICES}, got {matrix!r}")
    dim = depth_dim(ds)
    panels = _points(ds, matrix, dim)
    fig, axes = _panels(len(panels), width=3.0, height=3.0)
    depth = ds[dim].values
    norm = Normalize(float(depth.min()), float(depth.max()) if depth.max() > depth.min() else float(depth.min()) + 1)
    for h, (ax, (xs, lam)) in enumerate(zip(axes[0], panels)):
        sc = ax.scatter(lam.real, lam.imag, c=xs, cmap="plasma", norm=norm, s=4, linewidths=0)
        ax.axhline(0.0, color="0.6", lw=0.6, zorder=0)
        ax.axvline(0.0, color="0.6", lw=0.6, zorder=0)
        ax.set_title(f"{TITLES[matrix]}, head {h}" if matrix != "ffn" else TITLES[matrix], fontsize=9)
        ax.set_xlabel(r"Re $\lambda$")
    axes[0, 0].set_ylabel(r"Im $\lambda$")
    fig.colorbar(sc, ax=list(axes[0]), label=_depth_label(ds), shrink=0.9)
    fig.suptitle(f"{_model_label(ds)}: eigenvalues of {TITLES[matrix]} in the complex plane")
    return fig


def comparison(datasets: Mapping[str, xr.Dataset], matrix: str = "qk", part: str = "real", *,
               logy: bool = False) -> Figure:
    r"""One row of ``vs_depth`` panels per model, all against the depth fraction ``time`` (t, or (k+1)/L).

    For the ODE model against a GPT: the ODE's eigenvalues at its Euler steps (or, labelled as an interpolation, at
    any t) next to the GPT's at its layers, on the same axes. Rows are labelled with the mapping's keys; each row
    keeps its own y range (a trained ODE's weights need not be on a GPT's scale).
    """
    names = list(datasets)
    n_panels = max(1 if matrix == "ffn" else ds.sizes["head"] for ds in datasets.values())
    fig, axes = _panels(n_panels, nrows=len(names))
    for row, name in enumerate(names):
        ds = datasets[name]
        vs_depth(ds, matrix, part, x="time", logy=logy, axes_row=axes[row])
        axes[row, 0].set_ylabel(f"{name}\n" + (r"Re $\lambda$" if part == "real" else r"$|\lambda|$"))
    ode = ("t, interpolated between the ODE's Euler steps" if any(_interpolated(ds) for ds in datasets.values())
           else "Euler step $t_k$ (ODE)")
    fig.supxlabel(f"depth: {ode} or $(k+1)/L$ (layer k)", fontsize=10)
    what = "real part" if part == "real" else "magnitude"
    fig.suptitle(f"{what} of the eigenvalues of {TITLES[matrix]}: " + " vs ".join(names))
    return fig


def growth(models: Mapping[str, Sequence[xr.Dataset]]) -> Figure:
    r"""What ``spectra.depth_growth`` judges: the heads' geometric-mean spectral radius :math:`\exp \overline{\log\rho}`
    of QK and OV (and the FFN's radius) against depth, a row per model (the mapping's keys label the rows), a line
    per seed, at the model's own depth points (a DiffEqFormer's Euler steps t_k, a baseline's layers at (k+1)/L)."""
    fig, axes = _panels(len(MATRICES), nrows=len(models), width=3.4, height=2.2)
    for row, (name, datasets) in enumerate(models.items()):
        for seed, ds in enumerate(datasets):
            for ax, m in zip(axes[row], MATRICES):
                radius = np.exp(log_radius(ds, m))
                ax.plot(ds["time"].values, radius, marker="o", ms=3, lw=1, label=f"seed {seed}")
        for ax, m in zip(axes[row], MATRICES):
            ax.set_yscale("log")
            low, high = ax.get_ylim()
            if high < 10 * low:  # less than a decade: plain numbers, not 5.75 x 10^-1
                for setter in (ax.yaxis.set_major_formatter, ax.yaxis.set_minor_formatter):
                    setter(FuncFormatter(lambda v, _: f"{v:.3g}"))
            ax.grid(alpha=0.3, which="both")
            if row == 0:
                ax.set_title(TITLES[m], fontsize=9)
        axes[row, 0].set_ylabel(f"{name}\nradius (head mean)")
        axes[row, -1].legend(fontsize=7)
    fig.supxlabel("depth: Euler step $t_k$ (ODE) or $(k+1)/L$ (layer k)", fontsize=10)
    fig.suptitle("Spectral radius against depth, one line per seed (geometric mean over heads; log scale)")
    return fig
