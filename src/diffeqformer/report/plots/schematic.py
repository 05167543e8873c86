"""F1's figures: the model as a diagram (the paper's Fig. 1) and the trained weights W(t) as curves in t
(``analysis.schematic.weight_curves``)."""

from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.patches import FancyBboxPatch

_INPUT, _WEIGHT, _OP = "#e8eef7", "#fde8c8", "#e3f1e0"


def _box(ax, x, y, text, color, w=0.22, h=0.085, fontsize=9):
    ax.add_patch(FancyBboxPatch((x - w / 2, y - h / 2), w, h, boxstyle="round,pad=0.01,rounding_size=0.015",
                                facecolor=color, edgecolor="0.25", linewidth=0.9))
    ax.text(x, y, text, ha="center", va="center", fontsize=fontsize)


def _arrow(ax, start, end, text=None):
    ax.annotate("", xy=end, xytext=start, arrowprops=dict(arrowstyle="-|>", color="0.25", lw=0.9, shrinkA=2, shrinkB=2))
    if text:
        ax.text((start[0] + end[0]) / 2 + 0.01, (start[1] + end[1]) / 2, text, fontsize=7.5, color="0.3",
                va="center")


def _vector_field(ax, dims: dict) -> None:
    """Panel (a): attention and feed-forward read the same x(t) and their updates are added."""
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


def _weight_unit(ax, dims: dict) -> None:
    """Panel (b): the time-dependent weight unit t -> e(t) -> h(t) -> W(t)."""
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


def diagram(config=None) -> Figure:
    """DiffEqFormer drawn as the paper's Fig. 1, two panels; with ``config`` (a ``DiffEqFormerConfig``) annotated
    with its width D, heads, time-embedding width d_t, number of sinusoids S and Euler steps L."""
    fig = Figure(figsize=(11, 5.2))
    ax_f, ax_w = fig.subplots(1, 2, gridspec_kw=dict(width_ratios=[1.25, 1]))
    for ax in (ax_f, ax_w):
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.axis("off")
    dims = {} if config is None else dict(D=config.hidden_dim, H=config.num_heads, dt=config.time_embed_dim,
                                          S=config.sinusoidal_dim, L=config.num_layers)
    _vector_field(ax_f, dims)
    _weight_unit(ax_w, dims)
    fig.tight_layout()
    return fig


def weight_curves(curves, *, title: str | None = None) -> Figure:
    """``analysis.schematic.WeightCurves``: one line per entry over t in [0, 1], the Euler grid's values as points."""
    fig = Figure(figsize=(8, 3.6))
    ax = fig.subplots()
    for j, idx in enumerate(curves.entries):
        (line,) = ax.plot(curves.t, curves.values[:, j], lw=0.8, label=f"{curves.unit}{list(idx)}")
        ax.plot(curves.layer_t, curves.layer_values[:, j], "o", ms=5, color=line.get_color())
    for t in curves.layer_t:
        ax.axvline(t, color="0.85", lw=0.6, zorder=0)
    ax.set_xlabel("layer index $t$ (grey: the Euler grid $t_k = (k+1)/L$ used in training)")
    ax.set_ylabel("weight entry $W(t)$")
    ax.set_xlim(0, 1)
    ax.legend(fontsize=7, ncol=2, loc="best")
    if title:
        ax.set_title(title)
    return fig
