"""Sinusoidal embedding of the continuous layer index t (PAPER.md section 1).

    e(t) = [ t, sin(s t w_k), cos(s t w_k) ]_{k<S},   w_k = exp(-ln(P) k / S)

The embedding has no learned parameters; it is shared by every time-dependent weight of the model.
"""

from __future__ import annotations

import math

import equinox as eqx
import haliax as hax
from haliax import Axis, NamedArray


class SinusoidalTimeEmbedding(eqx.Module):
    """e(t) of dimension 2S+1 for t of any shape, appended as the axis `TimeFeatures`."""

    Sinusoids: Axis = eqx.field(static=True)  # S frequencies
    scale: float = eqx.field(static=True)  # s: the layer index lives in [0, 1], so it is stretched first
    max_period: float = eqx.field(static=True)  # P

    @staticmethod
    def init(sinusoidal_dim: int, *, scale: float = 1000.0, max_period: float = 10000.0) -> "SinusoidalTimeEmbedding":
        return SinusoidalTimeEmbedding(Axis("sinusoids", sinusoidal_dim), scale, max_period)

    @property
    def TimeFeatures(self) -> Axis:
        """Output axis: 2S+1 features."""
        return Axis("time_features", 2 * self.Sinusoids.size + 1)

    def __call__(self, t: NamedArray) -> NamedArray:
        """[...] -> [..., TimeFeatures]"""
        freqs = hax.exp(-math.log(self.max_period) * hax.arange(self.Sinusoids, dtype=t.dtype) / self.Sinusoids.size)
        args = (t * self.scale).broadcast_axis(self.Sinusoids) * freqs
        One = Axis("time_features", 1)
        parts = [t.broadcast_axis(One), hax.sin(args).rename({"sinusoids": "time_features"}),
                 hax.cos(args).rename({"sinusoids": "time_features"})]
        return hax.concatenate("time_features", parts).rearrange((..., "time_features"))
