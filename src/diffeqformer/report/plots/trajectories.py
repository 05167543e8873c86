"""F3's figures: token paths in 3-D, clustering against t, the controls side by side, Euler steps against the
accurate solve; each takes the Datasets of ``analysis.trajectories``, ``analysis.model_trajectories`` and
``analysis.clustering`` and returns a Figure (no solve)."""

from __future__ import annotations

import matplotlib
import numpy as np
import xarray as xr
from matplotlib.figure import Figure

from ...analysis.clustering import clustering_metrics, final_fraction


def _panel_dim(ds: xr.Dataset) -> str | None:
    return next((d for d in ("growth", "head") if d in ds.dims), None)


def _panel_title(ds: xr.Dataset, dim: str | None, i: int) -> str:
    if dim == "growth":
        p = float(ds["growth"].values[i])
        tex = "1" if p == 0 else ("t" if p == 1 else f"t^{{{p:g}}}")
        return f"$g(t) = {tex}$"
    if dim == "head":
        return f"head {int(ds['head'].values[i])}"
    return ""


_WEIGHT_LABELS = {"identity": "$Q = K = V = I$ (must cluster at $g = 1$)",
                  "gaussian": "Gaussian $Q(0), K(0), V(0)$ (the paper's)",
                  "gaussian_qk": "Gaussian $Q(0), K(0)$, $V = I$",
                  "redrawn": "Gaussian, redrawn on {redraws} intervals (time-varying control)"}


def _control_label(attrs: dict) -> str:
    return _WEIGHT_LABELS[attrs["weights"]].format(redraws=attrs.get("redraws", "?"))


def _geometry_label(attrs: dict) -> str:
    """'on the sphere (Geshkovski et al.), start uniform on $S^2$' and the like."""
    d = attrs.get("dim")
    d = int(d) if d is not None else None  # netCDF gives numpy integers back
    start = "in $[-1, 1]^{%s}$" % (d or "d") if attrs.get("start") == "cube" else "on $S^{%s}$" % (
        d - 1 if d else "d-1")
    where = "on the sphere (Geshkovski et al.)" if attrs.get("geometry") == "sphere" else "free space (the paper)"
    return f"{where}, start uniform {start}"


def _describe(attrs: dict, setting: bool = True) -> str:
    """One line with every parameter a reader needs to read the figure (``setting``: with geometry and weights)."""
    solver = attrs.get("solver_solver", "?")
    mode = "adaptive" if attrs.get("solver_adaptive", 1) else f"{attrs.get('solver_num_steps', '?')} steps"
    if solver != "euler" and attrs.get("solver_adaptive", 1):
        mode += f", rtol {attrs.get('solver_rtol', '?'):g}"
    beta = float(attrs.get("beta_used", attrs.get("beta", float("nan"))))
    parts = [f"$n = {attrs.get('num_tokens', '?')}$", f"$d = {attrs.get('dim', '?')}$",
             f"$T = {float(attrs.get('horizon', float('nan'))):g}$", rf"$\beta = {beta:g}$"]
    if attrs.get("kind") == "polynomial":
        if setting:
            parts += [_geometry_label(attrs), _control_label(attrs)]
    else:
        parts.append("on the sphere" if attrs.get("geometry") == "sphere" else "in free space")
        parts.append(f"DiffEqFormer heads ($D = {attrs.get('model_hidden_dim')}$)")
    return ", ".join(parts) + f"; {solver} ({mode})"


def _growth_colour(i: int, n: int):
    return matplotlib.colormaps["viridis"](0.9 * i / max(n - 1, 1)) if n > 1 else "C0"


def paths(ds: xr.Dataset, *, seed: int | None = None, threshold: float = 0.999, max_jump: float = 0.1) -> Figure:
    """A row of 3-D panels, one per growth law (or head): every token's path coloured by token, start points open,
    end points filled, on the sphere a faint wireframe; each title gives the final fraction of clustered pairs.

    ``seed``: which seed (default: the first). In free space the directions x/|x| are drawn; model-driven Datasets
    in their top-3 principal components (``x_pca``). A segment between two saved times longer than ``max_jump``
    times the picture (fast growth spins clusters faster than the saves resolve) is left out rather than drawn as a
    chord through the sphere, and the figure says so.
    """
    dim = _panel_dim(ds)
    use_pca = "x_pca" in ds
    x = ds["x_pca"].rename(pc="dim") if use_pca else ds["x"]
    if "seed" in x.dims:
        x = x.sel(seed=seed) if seed is not None else x.isel(seed=0)
    if x.sizes["dim"] != 3:
        raise ValueError(f"3-D trajectories need dim = 3 (got {x.sizes['dim']}); use a model-driven Dataset's x_pca")
    geometry = ds.attrs.get("geometry", "sphere")
    directions = geometry == "free" and not use_pca
    if directions:
        x = x / np.sqrt((x**2).sum("dim", skipna=False))
    on_sphere = (geometry == "sphere" or directions) and not use_pca
    panels = x.sizes[dim] if dim else 1
    x_full = ds["x"].sel(seed=x["seed"]) if "seed" in ds["x"].dims else ds["x"]
    final = clustering_metrics(x_full.isel(time=[-1]), threshold)["fraction"].isel(time=0)

    fig = Figure(figsize=(3.3 * max(panels, 2), 4.1))
    gaps = 0
    for i in range(panels):
        ax = fig.add_subplot(1, panels, i + 1, projection="3d")
        arr = (x.isel({dim: i}) if dim else x).transpose("time", "token", "dim").values
        gaps += _draw_paths(ax, arr, on_sphere, max_jump)
        if not on_sphere:
            explained = ds["pca_explained"].isel({dim: i}).values if use_pca and dim else None
            _label_axes(ax, use_pca, explained)
        frac = float(final.isel({dim: i}) if dim else final)
        ax.set_title(f"{_panel_title(ds, dim, i)}\nclustered pairs at $T$: {frac:.2f}", fontsize=10, pad=0)
    seed_text = f", seed {int(x['seed'])}" if "seed" in ds.dims else ""
    what = "top-3 principal components" if use_pca else ("directions $x/|x|$" if directions else "positions")
    note = f"\n{gaps} steps between saved times longer than {max_jump:g} x the picture not drawn" if gaps else ""
    fig.suptitle(f"Attention-only token trajectories ({what}), start $\\circ$, end $\\bullet$, colour = token"
                 f"{seed_text}\n{_describe(ds.attrs)}{note}", fontsize=9.5)
    fig.subplots_adjust(left=0.01, right=0.99, bottom=0.02, top=0.76 if gaps else 0.8, wspace=0.02)
    return fig


def _draw_paths(ax, arr: np.ndarray, on_sphere: bool, max_jump: float) -> int:
    """One panel's paths, arr [time, token, 3]; returns the number of segments left out (``paths``)."""
    cmap = matplotlib.colormaps["turbo"]
    n = arr.shape[1]
    colours = [cmap(0.05 + 0.9 * j / max(n - 1, 1)) for j in range(n)]
    if on_sphere:
        u, v = np.meshgrid(np.linspace(0, 2 * np.pi, 25), np.linspace(0, np.pi, 13))
        ax.plot_wireframe(np.cos(u) * np.sin(v), np.sin(u) * np.sin(v), np.cos(v), color="0.55", alpha=0.2,
                          linewidth=0.4)
        ax.set(xlim=(-1.0, 1.0), ylim=(-1.0, 1.0), zlim=(-1.0, 1.0))
        ax.set_box_aspect((1, 1, 1), zoom=1.25)
        ax.set_axis_off()
    size = 2.0 if on_sphere else float(np.nanmax(np.nanmax(arr, axis=(0, 1)) - np.nanmin(arr, axis=(0, 1))))
    gaps = 0
    for j in range(n):
        path, jumps = _break_long_segments(arr[:, j], max_jump * size)
        gaps += jumps
        ax.plot(path[:, 0], path[:, 1], path[:, 2], color=colours[j], linewidth=0.8, alpha=0.8)
    ax.scatter(*arr[0].T, s=12, facecolors="none", edgecolors=colours, linewidths=0.8, depthshade=False)
    end = arr[-1]
    ok = np.all(np.isfinite(end), axis=-1)
    ax.scatter(*end[ok].T, s=28, c=[c for c, k in zip(colours, ok) if k], edgecolors="k", linewidths=0.6,
               depthshade=False)
    ax.view_init(elev=22, azim=35)
    return gaps


def _label_axes(ax, use_pca: bool, explained: np.ndarray | None) -> None:
    ax.set_box_aspect((1, 1, 1), zoom=0.9)
    for k, setter in enumerate((ax.set_xlabel, ax.set_ylabel, ax.set_zlabel)):
        name = f"PC{k + 1}" if use_pca else f"$x_{k + 1}$"
        if explained is not None:
            name += f" ({100 * explained[k]:.0f}%)"
        setter(name, fontsize=8, labelpad=-4)
    ax.tick_params(labelsize=6, pad=0)


def _break_long_segments(path: np.ndarray, max_length: float) -> tuple[np.ndarray, int]:
    """[T, 3] -> the same points with a NaN row inserted wherever consecutive points are further apart than
    max_length (matplotlib breaks a line at NaN), and the number of such gaps."""
    jump = np.linalg.norm(np.diff(path, axis=0), axis=-1) > max_length
    if not jump.any():
        return path, 0
    where = np.nonzero(jump)[0] + 1
    return np.insert(path, where, np.nan, axis=0), int(jump.sum())


def metrics(metrics: xr.Dataset) -> Figure:
    """Fraction of clustered pairs, number of clusters and mean pairwise distance against t: one line per growth law
    (or head), the mean over seeds with a min-max band, of ``clustering_metrics`` (or of a solve's, computed first)."""
    if "x" in metrics:
        metrics = clustering_metrics(metrics)
    dim = _panel_dim(metrics)
    lines = metrics.sizes[dim] if dim else 1
    fig = Figure(figsize=(13, 3.9), constrained_layout=True)
    axes = fig.subplots(1, 3)
    thr = metrics.attrs.get("threshold", 0.999)
    cos = r"\langle x_i, x_j\rangle" if metrics.attrs.get("geometry") == "sphere" else r"\cos(x_i, x_j)"
    labels = {"fraction": f"fraction of pairs with ${cos} > {thr:g}$",
              "clusters": f"clusters: rank of $1[{cos} > {thr:g}]$",
              "distance": r"mean pairwise distance $|\hat x_i - \hat x_j|$"}
    t = metrics["time"].values
    extrapolated = metrics.attrs.get("kind") == "model" and t[-1] > 1.0
    for ax, name in zip(axes, ("fraction", "clusters", "distance")):
        if extrapolated:
            ax.axvspan(1.0, t[-1], color="0.85", alpha=0.6, lw=0,
                       label="$t > 1$: $W(t)$ extrapolated (trained on $[0, 1]$)" if name == "fraction" else None)
        for i in range(lines):
            m = metrics[name].isel({dim: i}) if dim else metrics[name]
            colour = _growth_colour(i, lines)
            if "seed" in m.dims:
                if m.sizes["seed"] > 1:
                    ax.fill_between(t, m.min("seed").values, m.max("seed").values, color=colour, alpha=0.15, lw=0)
                m = m.mean("seed")
            ax.plot(t, m.values, color=colour, lw=1.8, label=_panel_title(metrics, dim, i) or None)
        ax.set_xlabel("$t$")
        ax.set_ylabel(labels[name])
        ax.set_xlim(t[0], t[-1])
        ax.grid(alpha=0.3)
    axes[0].set_ylim(-0.02, 1.02)
    axes[1].set_ylim(0, None)
    axes[2].set_ylim(0, 1.08 * max(float(metrics["distance"].max()), 0.1))
    if dim or extrapolated:
        axes[0].legend(fontsize=9, frameon=False)
    seeds = f"; mean over {metrics.sizes['seed']} seeds, band: min to max" if "seed" in metrics.dims else ""
    fig.suptitle(f"Clustering against $t$: {_describe(metrics.attrs)}{seeds}", fontsize=10)
    return fig


def controls(solves: "dict[str, xr.Dataset]", threshold: float = 0.999) -> Figure:
    """The fraction of clustered token pairs against t, a panel per ``simulate`` Dataset in ``solves`` (rows: geometry
    and start, columns: weights), a line per growth law, the mean over seeds with a min-max band, the legend giving
    the mean at T. All must share n, d, T, beta and the solver (the title states them)."""
    datasets = list(solves.values())
    rows = list(dict.fromkeys(_geometry_label(ds.attrs) for ds in datasets))
    cols = list(dict.fromkeys(_control_label(ds.attrs) for ds in datasets))
    shared = {_describe(ds.attrs, setting=False) for ds in datasets}
    if len(shared) > 1:
        raise ValueError(f"controls needs one n, d, T, beta and solver for every panel, got {sorted(shared)}")
    fig = Figure(figsize=(4.4 * len(cols), 3.2 * len(rows) + 0.6), constrained_layout=True)
    axes = fig.subplots(len(rows), len(cols), squeeze=False, sharex=True, sharey=True)
    for ax in axes.flat:
        ax.set_visible(False)
    for ds in datasets:
        ax = axes[rows.index(_geometry_label(ds.attrs)), cols.index(_control_label(ds.attrs))]
        ax.set_visible(True)
        fraction = clustering_metrics(ds, threshold)["fraction"]
        t = fraction["time"].values
        G = fraction.sizes["growth"]
        for i in range(G):
            f = fraction.isel(growth=i)
            colour = _growth_colour(i, G)
            if f.sizes["seed"] > 1:
                ax.fill_between(t, f.min("seed").values, f.max("seed").values, color=colour, alpha=0.12, lw=0)
            mean = f.mean("seed")
            failed = int((~ds["success"].isel(growth=i).astype(bool)).sum())
            note = f", {failed} failed" if failed else ""
            ax.plot(t, mean.values, color=colour, lw=1.6,
                    label=f"{_panel_title(ds, 'growth', i)}: {float(mean.values[-1]):.2f}{note}")
        ax.set_title(f"{_control_label(ds.attrs)}\n{_geometry_label(ds.attrs)}", fontsize=8.5)
        ax.set_ylim(-0.02, 1.02)
        ax.set_xlim(t[0], t[-1])
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, frameon=False, title="$g(t)$: mean at $T$", title_fontsize=7, loc="upper left")
    for ax in axes[-1]:
        ax.set_xlabel("$t$")
    for ax in axes[:, 0]:
        ax.set_ylabel(f"fraction of pairs, $\\cos > {threshold:g}$")
    seeds = datasets[0].sizes["seed"]
    fig.suptitle(f"Clustered token pairs against $t$ for each control: {shared.pop()}; mean over {seeds} seeds "
                 "(band: min to max)", fontsize=10)
    return fig


def step_convergence(convergence: xr.Dataset, reference: xr.Dataset, threshold: float = 0.999) -> Figure:
    """Left: the fraction of clustered pairs at T against the number of Euler steps (``clustering.step_convergence``),
    a line per growth law (mean over seeds, min-max bars), the accurate solve of the same systems (``reference``)
    dashed. Right: per seed, |fraction with N steps - the accurate solve's|, mean over seeds."""
    ref = final_fraction(reference, threshold)
    fraction = convergence["fraction"]
    if list(ref["seed"].values) != list(fraction["seed"].values):
        raise ValueError("the convergence study and its reference must have the same seeds")
    steps = fraction["steps"].values
    G = fraction.sizes["growth"]
    fig = Figure(figsize=(12, 4.2), constrained_layout=True)
    left, right = fig.subplots(1, 2)
    for i in range(G):
        colour = _growth_colour(i, G)
        label = _panel_title(convergence, "growth", i)
        f = fraction.isel(growth=i)
        mean = f.mean("seed").values
        left.errorbar(steps, mean, yerr=[mean - f.min("seed").values, f.max("seed").values - mean], color=colour,
                      marker="o", ms=4, lw=1.5, capsize=2, label=f"{label}, Euler")
        left.axhline(float(ref.isel(growth=i).mean()), color=colour, ls="--", lw=1.2)
        gap = np.abs(f - ref.isel(growth=i)).mean("seed").values
        right.plot(steps, gap, color=colour, marker="o", ms=4, lw=1.5, label=label)
    left.plot([], [], color="0.3", ls="--", label="accurate solve (dashed)")
    left.set_ylim(-0.02, 1.02)
    left.set_ylabel(f"fraction of pairs with $\\cos > {threshold:g}$ at $T$")
    left.legend(fontsize=7.5, frameon=False, ncol=2, loc="lower right")
    right.set_ylim(0, None)
    right.set_ylabel("mean over seeds of |Euler $-$ accurate| at $T$")
    right.legend(fontsize=8, frameon=False, title="$g(t)$", title_fontsize=8)
    for ax in (left, right):
        ax.set_xscale("log")
        ax.set_xlabel("explicit Euler steps on $[0, T]$")
        ax.axvline(200, color="0.5", lw=0.8, ls=":")
        ax.grid(alpha=0.3)
    left.text(200, 1.0, " the paper's 200", fontsize=7.5, color="0.4", va="top")
    fig.suptitle(f"Euler steps against the accurate solve ({_describe(reference.attrs)}): "
                 f"{convergence.sizes['seed']} seeds", fontsize=9.5)
    return fig


__all__ = ["controls", "metrics", "paths", "step_convergence"]
