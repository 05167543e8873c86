"""F1: the model drawn as a diagram, and the trained weights W(t) as curves in t.

``draw`` draws the paper's Fig. 1 with matplotlib: (a) the vector field f(t, x) = A(t, x, X) + F(t, x), attention
and feed-forward in parallel, every weight W(t) coming from (b) a time-dependent weight unit
t -> e(t) -> h(t) -> W(t). ``weight_curves`` evaluates a few entries of one trained W(t) on a fine grid of t, and
``plot_weight_curves`` draws them with the Euler grid t_k = (k+1)/L (the "layers" the model was trained with)
marked.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

UNITS = ("q_proj", "k_proj", "v_proj", "o_proj", "mlp_in", "mlp_up", "mlp_out")
"""The ``TemporalLinear`` fields of ``vector_field.TemporalBlock`` whose entries ``weight_curves`` can follow."""

_INPUT = "#e8eef7"
_WEIGHT = "#fde8c8"
_OP = "#e3f1e0"


def _box(ax, x, y, text, color, w=0.22, h=0.085, fontsize=9):
    from matplotlib.patches import FancyBboxPatch

    ax.add_patch(FancyBboxPatch((x - w / 2, y - h / 2), w, h, boxstyle="round,pad=0.01,rounding_size=0.015",
                                facecolor=color, edgecolor="0.25", linewidth=0.9))
    ax.text(x, y, text, ha="center", va="center", fontsize=fontsize)


def _arrow(ax, start, end, text=None, rad=0.0):
    ax.annotate("", xy=end, xytext=start,
                arrowprops=dict(arrowstyle="-|>", color="0.25", lw=0.9, shrinkA=2, shrinkB=2,
                                connectionstyle=f"arc3,rad={rad}"))
    if text:
        ax.text((start[0] + end[0]) / 2 + 0.01, (start[1] + end[1]) / 2, text, fontsize=7.5, color="0.3",
                va="center")


def draw(config=None):
    """The schematic of DiffEqFormer (paper Fig. 1) as a matplotlib figure with two panels.

    With ``config`` (a ``DiffEqFormerConfig``) the panels are annotated with its dimensions: width D, heads,
    time-embedding width d_t, number of sinusoids S and Euler steps L."""
    import matplotlib.pyplot as plt

    fig, (ax_f, ax_w) = plt.subplots(1, 2, figsize=(11, 5.2), gridspec_kw=dict(width_ratios=[1.25, 1]))
    for ax in (ax_f, ax_w):
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.axis("off")
    dims = {}
    if config is not None:
        dims = dict(D=config.hidden_dim, H=config.num_heads, dt=config.time_embed_dim, S=config.sinusoidal_dim,
                    L=config.num_layers)

    # (a) the vector field: attention and feed-forward read the same x(t) and their updates are added.
    ax = ax_f
    ax.set_title("(a) vector field  $dx_i/dt = A(t, x_i, X) + F(t, x_i)$", fontsize=10)
    _box(ax, 0.5, 0.06, "tokens $X(t) = (x_1(t), \\dots, x_n(t))$" + (f",  $D={dims['D']}$" if dims else ""),
         _INPUT, w=0.62)
    _box(ax, 0.27, 0.27, "LN$_1(t)$", _WEIGHT)
    _box(ax, 0.73, 0.27, "LN$_2(t)$", _WEIGHT)
    heads = f"{dims['H']} heads, " if dims else ""
    _box(ax, 0.27, 0.50, f"causal attention\n{heads}$W_Q(t), W_K(t)$,\n$W_V(t), W_O(t)$", _WEIGHT, w=0.36, h=0.17)
    _box(ax, 0.73, 0.50, "feed-forward\n$W_2(t)\\,\\sigma(W_1(t)\\,\\cdot + b_1(t))$\n$+\\, b_2(t)$", _WEIGHT,
         w=0.36, h=0.17)
    _box(ax, 0.5, 0.72, "$+$", _OP, w=0.07, h=0.07, fontsize=12)
    _box(ax, 0.5, 0.90, "Euler: $x_{k+1} = x_k + \\frac{1}{L} f(t_k, x_k)$" + (f",  $L={dims['L']}$" if dims else ""),
         _OP, w=0.62)
    _arrow(ax, (0.36, 0.10), (0.27, 0.225))
    _arrow(ax, (0.64, 0.10), (0.73, 0.225))
    _arrow(ax, (0.27, 0.315), (0.27, 0.41))
    _arrow(ax, (0.73, 0.315), (0.73, 0.41))
    _arrow(ax, (0.27, 0.59), (0.465, 0.72), "$A$")
    _arrow(ax, (0.73, 0.59), (0.535, 0.72), "$F$")
    _arrow(ax, (0.5, 0.755), (0.5, 0.855), "$f(t, x)$")
    ax.plot([0.19, 0.04, 0.04], [0.06, 0.06, 0.90], color="0.55", lw=0.9, ls="--")  # the residual stream x_k
    ax.annotate("", xy=(0.19, 0.90), xytext=(0.04, 0.90),
                arrowprops=dict(arrowstyle="-|>", color="0.55", lw=0.9, shrinkA=0, shrinkB=1))
    ax.text(0.055, 0.48, "$x_k$", fontsize=8, color="0.4", va="center")
    ax.text(0.5, -0.02, "orange: weights that are functions of $t$", fontsize=7.5, color="0.35", ha="center")

    # (b) the time-dependent weight unit.
    ax = ax_w
    ax.set_title("(b) time-dependent weight unit", fontsize=10)
    s = f" = {2 * dims['S'] + 1}" if dims else ""
    dt = f" = {dims['dt']}" if dims else ""
    rows = [
        (0.06, "layer index $t \\in [0, 1]$", _INPUT),
        (0.25, f"$e(t) = [t, \\sin(s t w_k), \\cos(s t w_k)]$\ndimension $2S+1{s}$", _OP),
        (0.45, "$h(t) = \\mathrm{Lin}_2(\\mathrm{SiLU}(\\mathrm{Lin}_1(e(t))))$\n"
               f"hypernetwork, width $d_t{dt}$", _WEIGHT),
        (0.66, "$W(t) = \\mathrm{reshape}(\\mathrm{Proj}\\,h(t))$,  $b(t) = h(t) \\cdot F_b$", _WEIGHT),
        (0.88, "used by the block at $t$: $W_Q, W_K, W_V, W_O, W_1, W_2$,\nbiases, norm scale and shift", _INPUT),
    ]
    for y, text, color in rows:
        _box(ax, 0.5, y, text, color, w=0.9, h=0.11 if "\n" in text else 0.075, fontsize=8.5)
    for (y0, *_), (y1, *_) in zip(rows[:-1], rows[1:]):
        _arrow(ax, (0.5, y0 + 0.05), (0.5, y1 - 0.055))
    ax.text(0.52, 0.555, "one unit per weight (hypernet: per_weight)", fontsize=7.5, color="0.35", ha="left",
            va="center")
    fig.tight_layout()
    return fig


@dataclass(frozen=True)
class WeightCurves:
    """Entries of one trained weight W(t): ``values[i, j]`` is entry ``entries[j]`` at ``t[i]``; ``layer_t`` and
    ``layer_values`` are the same entries on the Euler grid the model was trained with."""

    unit: str
    t: np.ndarray  # [T]
    values: np.ndarray  # [T, K]
    entries: tuple[tuple[int, ...], ...]  # K indices into the weight's (in..., out...) shape
    layer_t: np.ndarray  # [L]
    layer_values: np.ndarray  # [L, K]


def weight_curves(model, unit: str = "q_proj", *, num_entries: int = 4, num_times: int = 2001, seed: int = 0):
    """A few entries of the trained weight ``unit`` of a DiffEqFormer as continuous functions of t.

    Only the chosen entries are computed (h(t) on the grid, then the matching columns of Proj), so a fine grid
    costs little even for a wide model. The grid contains the Euler points t_k, whose values are taken
    independently from ``model.weights_at`` (the path the forward pass takes): curve and points must agree.
    """
    import haliax as hax
    import jax.numpy as jnp

    from ..model.temporal import TemporalLinear
    from ..model.transformer import time_grid

    if unit not in UNITS:
        raise ValueError(f"unit must be one of {UNITS}, got {unit!r}")
    block = model.block
    lin = getattr(block, unit, None)
    if not isinstance(lin, TemporalLinear):
        raise ValueError("weight_curves needs a time-dependent DiffEqFormer (time_dependent: true); "
                         f"this model's {unit!r} is {type(lin).__name__}")
    if num_entries < 1 or num_times < 2:
        raise ValueError(f"num_entries >= 1 and num_times >= 2 needed, got {num_entries}, {num_times}")
    shape = tuple(ax.size for ax in lin.proj.axes[1:])  # (In..., Out...)
    rng = np.random.default_rng(seed)
    flat = rng.choice(int(np.prod(shape)), size=min(num_entries, int(np.prod(shape))), replace=False)
    entries = tuple(tuple(int(i) for i in np.unravel_index(f, shape)) for f in flat)

    Layers = model.config.Layers
    layer_t = np.asarray(time_grid(Layers).array)
    grid = np.union1d(np.linspace(0.0, 1.0, num_times, dtype=np.float32), layer_t)  # the layer points lie on it
    t = hax.named(jnp.asarray(grid, dtype=jnp.float32), "time")
    e = model.time_embedding(t)
    h = lin.mlp(e) if lin.mlp is not None else block.shared_mlp(e)  # [time, TimeEmbed]
    proj = np.asarray(lin.proj.array).reshape(lin.proj.axes[0].size, -1)[:, flat]  # [TimeEmbed, K]
    values = np.asarray(h.array) @ proj + np.asarray(lin.proj_bias.array).reshape(-1)[flat][None, :]

    materialised = getattr(model.weights_at(time_grid(Layers)), "attn" if unit.endswith("_proj") else "mlp")
    field = {"q_proj": "q_proj", "k_proj": "k_proj", "v_proj": "v_proj", "o_proj": "o_proj",
             "mlp_in": "c_fc" if model.config.variant == "gpt" else "gate_proj", "mlp_up": "up_proj",
             "mlp_out": "c_proj" if model.config.variant == "gpt" else "down_proj"}[unit]
    weight = getattr(materialised, field).weight
    names = [ax.name for ax in lin.proj.axes[1:]]
    layer_values = np.stack([np.asarray(weight[{n: i for n, i in zip(names, idx)}].array) for idx in entries], -1)
    return WeightCurves(unit, grid, np.asarray(values), entries, layer_t, layer_values)


def plot_weight_curves(curves: WeightCurves, ax=None):
    """Draw ``curves``: one line per entry over t in [0, 1], the Euler grid's values as points."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(8, 3.6))
    for j, idx in enumerate(curves.entries):
        (line,) = ax.plot(curves.t, curves.values[:, j], lw=0.8, label=f"{curves.unit}{list(idx)}")
        ax.plot(curves.layer_t, curves.layer_values[:, j], "o", ms=5, color=line.get_color())
    for t in curves.layer_t:
        ax.axvline(t, color="0.85", lw=0.6, zorder=0)
    ax.set_xlabel("layer index $t$ (grey: the Euler grid $t_k = (k+1)/L$ used in training)")
    ax.set_ylabel("weight entry $W(t)$")
    ax.set_xlim(0, 1)
    ax.legend(fontsize=7, ncol=2, loc="best")
    return ax


def variation_ratio(curves: WeightCurves) -> float:
    """How far the entries travel along the fine grid of t, as a multiple of how far they travel from one Euler
    point to the next (total variation, summed over entries). 1 means W(t) is monotone between the layer points;
    much more than 1 means it oscillates between them (the sinusoids' scale s = 1000 allows periods of about
    2 pi / 1000 in t), which the trained model never sees at its own L steps."""
    fine = np.abs(np.diff(curves.values, axis=0)).sum()
    coarse = np.abs(np.diff(curves.layer_values, axis=0)).sum()
    return float(fine / coarse) if coarse > 0 else float("inf")

