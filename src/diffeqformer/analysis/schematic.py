"""F1: the trained weights W(t) as functions of t (``report.plots.schematic`` draws them and the model's diagram).

``weight_curves`` evaluates a few entries of one trained W(t) on a fine grid of t and on the Euler grid
t_k = (k+1)/L the model was trained with; ``variation_ratio`` says how much more they move between the grid's points.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

UNITS = ("q_proj", "k_proj", "v_proj", "o_proj", "mlp_in", "mlp_up", "mlp_out")
"""The ``TemporalLinear`` fields of ``vector_field.TemporalBlock`` whose entries ``weight_curves`` can follow."""


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
    """A few entries of the trained weight ``unit`` of a DiffEqFormer as functions of t on a grid holding the Euler
    points, computed for those entries alone; the Euler points' values come from ``model.weights_at`` independently."""
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


def variation_ratio(curves: WeightCurves) -> float:
    """The entries' total variation along the fine grid of t over that between the Euler points: 1 when W(t) is monotone
    between them, much more when it oscillates there (periods down to 2 pi / 1000), unseen by the trained model."""
    fine = np.abs(np.diff(curves.values, axis=0)).sum()
    coarse = np.abs(np.diff(curves.layer_values, axis=0)).sum()
    return float(fine / coarse) if coarse > 0 else float("inf")

