"""Time-dependent weights: the paper's "time-dependent weight unit" (PAPER.md section 1).

    h(t) = Lin_2( SiLU( Lin_1( e(t) ) ) )        2S+1 -> d_t -> d_t
    W(t) = reshape( Proj( h(t) ) )               d_t  -> in * out   (Proj has a bias: the t-independent part of W)
    b(t) = h(t) . F_b                            time-dependent bias

Every unit can *materialise* itself at times t: it returns the ordinary Haliax module (``hnn.Linear``,
``hnn.LayerNorm``, ``hnn.RmsNorm``) whose weights are W(t). When t carries a named axis (the layers of a
discretisation), the materialised module carries it too, ready to be used as a Haliax ``Stacked`` module.

With ``hypernet="per_weight"`` (the paper's choice) each unit owns its MLP; with ``"shared_mlp"`` (Appendix D.2's
alternative) one MLP computes h(t) for a whole block and the units keep only their projections.
"""

from __future__ import annotations

import math
from typing import Literal

import equinox as eqx
import haliax as hax
import haliax.nn as hnn
import jax.random as jrandom
from haliax import Axis, AxisSpec, NamedArray

NormKind = Literal["layer", "rms"]


class TimeMLP(eqx.Module):
    """h(t) = Lin_2(SiLU(Lin_1(e(t)))): [..., TimeFeatures] -> [..., TimeEmbed]."""

    lin1: hnn.Linear  # [TimeFeatures] -> [TimeHidden]
    lin2: hnn.Linear  # [TimeHidden] -> [TimeEmbed]

    @staticmethod
    def init(TimeFeatures: Axis, TimeEmbed: Axis, *, key) -> "TimeMLP":
        k1, k2 = jrandom.split(key)
        TimeHidden = TimeEmbed.alias("time_hidden")
        return TimeMLP(hnn.Linear.init(TimeFeatures, TimeHidden, key=k1), hnn.Linear.init(TimeHidden, TimeEmbed, key=k2))

    def __call__(self, e: NamedArray) -> NamedArray:
        return self.lin2(hnn.silu(self.lin1(e)))


class TemporalLinear(eqx.Module):
    """A linear map whose weight and bias are functions of t."""

    mlp: TimeMLP | None  # None when the block shares one MLP (hypernet="shared_mlp")
    proj: NamedArray  # [TimeEmbed, In, Out]: Proj's weight
    proj_bias: NamedArray  # [In, Out]: Proj's bias, the part of W(t) that does not depend on t
    bias_proj: NamedArray | None  # [TimeEmbed, Out]: F_b, the time-dependent bias b(t) = h(t) . F_b
    In: AxisSpec = eqx.field(static=True)
    Out: AxisSpec = eqx.field(static=True)
    out_first: bool = eqx.field(static=True)  # weight layout of the materialised hnn.Linear, as Levanter's module has it

    @staticmethod
    def init(TimeFeatures: Axis, TimeEmbed: Axis, In: AxisSpec, Out: AxisSpec, *, key, own_mlp: bool = True,
             use_bias: bool = True, out_first: bool = True) -> "TemporalLinear":
        k_mlp, k_proj, k_bias = jrandom.split(key, 3)
        In_, Out_ = hax.axis_spec_to_tuple(In), hax.axis_spec_to_tuple(Out)
        fan_in = math.prod(ax.size for ax in In_)
        # W(t) = h(t) . Proj: with Proj ~ N(0, 1/(d_t fan_in)), W(t) starts at the fan-in scale (times |h(t)|) of the
        # ordinary Linear layer Levanter would initialise in its place.
        proj = hax.random.truncated_normal(k_proj, (TimeEmbed, *In_, *Out_), -3, 3) / math.sqrt(TimeEmbed.size * fan_in)
        proj_bias = hax.zeros((*In_, *Out_))
        # The official code starts the time-dependent bias near zero (standard deviation 1e-4).
        bias_proj = hax.random.normal(k_bias, (TimeEmbed, *Out_)) * 1e-4 if use_bias else None
        mlp = TimeMLP.init(TimeFeatures, TimeEmbed, key=k_mlp) if own_mlp else None
        return TemporalLinear(mlp, proj, proj_bias, bias_proj, In, Out, out_first)

    def materialize(self, e: NamedArray, h_shared: NamedArray | None = None) -> hnn.Linear:
        """The ordinary ``hnn.Linear`` with weight W(t), bias b(t); e = e(t) is [..., TimeFeatures]."""
        h = self.mlp(e) if self.mlp is not None else h_shared
        if h is None:
            raise ValueError("a TemporalLinear without its own MLP needs the block's shared h(t)")
        TimeEmbed = self.proj.axes[0]
        weight = hax.dot(h, self.proj, axis=TimeEmbed) + self.proj_bias
        In_, Out_ = hax.axis_spec_to_tuple(self.In), hax.axis_spec_to_tuple(self.Out)
        weight = weight.rearrange((..., *Out_, *In_) if self.out_first else (..., *In_, *Out_))
        bias = hax.dot(h, self.bias_proj, axis=TimeEmbed) if self.bias_proj is not None else None
        return hnn.Linear(weight, bias, self.In, self.Out)


class TemporalNorm(eqx.Module):
    """Time-dependent LayerNorm / RMSNorm: norm(x) * (1 + h(t) . F_w) + h(t) . F_b, with F_w = F_b = 0 at init."""

    mlp: TimeMLP | None
    scale_proj: NamedArray  # [TimeEmbed, Embed]: F_w
    shift_proj: NamedArray | None  # [TimeEmbed, Embed]: F_b (LayerNorm with bias only)
    axis: Axis = eqx.field(static=True)
    kind: NormKind = eqx.field(static=True)
    eps: float = eqx.field(static=True)

    @staticmethod
    def init(TimeFeatures: Axis, TimeEmbed: Axis, axis: Axis, *, key, kind: NormKind = "layer", eps: float = 1e-5,
             own_mlp: bool = True, use_bias: bool = True) -> "TemporalNorm":
        mlp = TimeMLP.init(TimeFeatures, TimeEmbed, key=key) if own_mlp else None
        shift = hax.zeros((TimeEmbed, axis)) if use_bias else None
        return TemporalNorm(mlp, hax.zeros((TimeEmbed, axis)), shift, axis, kind, eps)

    def materialize(self, e: NamedArray, h_shared: NamedArray | None = None) -> hnn.LayerNorm | hnn.RmsNorm:
        h = self.mlp(e) if self.mlp is not None else h_shared
        if h is None:
            raise ValueError("a TemporalNorm without its own MLP needs the block's shared h(t)")
        TimeEmbed = self.scale_proj.axes[0]
        weight = hax.dot(h, self.scale_proj, axis=TimeEmbed) + 1.0
        bias = hax.dot(h, self.shift_proj, axis=TimeEmbed) if self.shift_proj is not None else None
        cls = hnn.LayerNorm if self.kind == "layer" else hnn.RmsNorm
        return cls(self.axis, weight, bias, self.eps)
