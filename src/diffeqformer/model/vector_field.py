"""The vector field of the ODE: attention and feed-forward in parallel (PAPER.md section 1).

    f(t, x) = A(t, LN_1(t, x)) + F(t, LN_2(t, x))

``ParallelBlock`` is f at fixed weights, built from Levanter's own modules (``levanter.layers.attention.Attention``,
``Gpt2Mlp`` or ``LlamaMlp``, Haliax norms): one layer of a discretised model. ``TemporalBlock`` holds the
time-dependent weight units and materialises the ``ParallelBlock`` of any time t (or of a whole axis of times, for
all layers at once).
"""

from __future__ import annotations

import equinox as eqx
import haliax as hax
import haliax.nn as hnn
import jax
import jax.numpy as jnp
import jax.random as jrandom
from haliax import Axis, NamedArray
from haliax.jax_utils import maybe_rng_split
from levanter.layers.attention import Attention, AttentionConfig, AttentionMask
from levanter.layers.rotary import RotaryEmbeddings
from levanter.models.gpt2 import Gpt2Mlp
from levanter.models.llama import LlamaMlp

from .config import DiffEqFormerConfig
from .temporal import TemporalLinear, TemporalNorm, TimeMLP


def make_norm(config: DiffEqFormerConfig) -> hnn.LayerNorm | hnn.RmsNorm:
    """The static norm of the variant: LayerNorm (gpt) or RMSNorm (llama)."""
    if config.variant == "llama":
        return hnn.RmsNorm.init(config.Embed, eps=config.layer_norm_epsilon, use_bias=False)
    return hnn.LayerNorm.init(config.Embed, eps=config.layer_norm_epsilon, use_bias=config.use_bias)


class ParallelBlock(eqx.Module):
    """f(x) = A(LN_1 x) + F(LN_2 x) at fixed weights. Returns the update f(x), not x + f(x)."""

    attn_norm: hnn.LayerNorm | hnn.RmsNorm  # [Embed]
    attn: Attention  # [Embed] -> [Heads, HeadSize] -> [Embed]
    mlp_norm: hnn.LayerNorm | hnn.RmsNorm  # [Embed]
    mlp: Gpt2Mlp | LlamaMlp  # [Embed] -> [Mlp] -> [Embed]
    dropout: hnn.Dropout

    @staticmethod
    def init(config: DiffEqFormerConfig, *, key) -> "ParallelBlock":
        k_attn, k_mlp = jrandom.split(key)
        attn = Attention.init(config.attention_config(), key=k_attn)
        if config.variant == "llama":
            mlp = LlamaMlp.init(config.Embed, config.Mlp, config.activation, key=k_mlp, use_bias=config.use_bias)
        else:
            mlp = Gpt2Mlp.init(config.Embed, config.Mlp, config.activation, key=k_mlp, use_bias=config.use_bias)
        return ParallelBlock(make_norm(config), attn, make_norm(config), mlp, hnn.Dropout(config.resid_pdrop))

    def __call__(self, x: NamedArray, mask: AttentionMask | NamedArray | None, *, key=None,
                 pos_ids: NamedArray | None = None) -> NamedArray:
        k_attn, k_drop1, k_mlp, k_drop2 = maybe_rng_split(key, 4)
        if self.attn.rot_embs is not None:
            # Levanter's RoPE multiplies positions by float32 frequencies: hand it float32 positions, so that the
            # product does not rely on implicit int -> float promotion (the tests run with strict promotion).
            if pos_ids is None:
                pos_ids = hax.arange(x.resolve_axis("position"))
            pos_ids = pos_ids.astype(jnp.float32)
        a = self.attn(self.attn_norm(x), mask, key=k_attn, pos_ids=pos_ids)
        m = self.mlp(self.mlp_norm(x), key=k_mlp)
        return self.dropout(a, key=k_drop1) + self.dropout(m, key=k_drop2)


class TemporalBlock(eqx.Module):
    """The time-dependent weights of f(t, x): every weight, bias and norm parameter is a function of t."""

    shared_mlp: TimeMLP | None  # hypernet="shared_mlp": one h(t) for the whole block
    attn_norm: TemporalNorm
    q_proj: TemporalLinear  # [Embed] -> [KVHeads, QHeadsPerGroup, HeadSize]
    k_proj: TemporalLinear  # [Embed] -> [KVHeads, HeadSize]
    v_proj: TemporalLinear  # [Embed] -> [KVHeads, HeadSize]
    o_proj: TemporalLinear  # [Heads, HeadSize] -> [Embed]
    mlp_norm: TemporalNorm
    mlp_in: TemporalLinear  # [Embed] -> [Mlp] (GPT: c_fc; Llama: gate_proj)
    mlp_up: TemporalLinear | None  # [Embed] -> [Mlp] (Llama only: up_proj)
    mlp_out: TemporalLinear  # [Mlp] -> [Embed]
    attn_config: AttentionConfig = eqx.field(static=True)
    rot_embs: RotaryEmbeddings | None = eqx.field(static=True)
    activation: object = eqx.field(static=True)
    variant: str = eqx.field(static=True)
    dropout: hnn.Dropout  # kept as a module so that Levanter's inference_mode reaches the materialised blocks

    @staticmethod
    def init(config: DiffEqFormerConfig, TimeFeatures: Axis, *, key) -> "TemporalBlock":
        ac = config.attention_config()
        TimeEmbed, Embed, Mlp = config.TimeEmbed, config.Embed, config.Mlp
        own = config.hypernet == "per_weight"
        keys = iter(jrandom.split(key, 12))
        bias = config.use_bias

        def lin(In, Out, out_first=True):
            return TemporalLinear.init(TimeFeatures, TimeEmbed, In, Out, key=next(keys), own_mlp=own, use_bias=bias,
                                       out_first=out_first)

        def norm():
            kind = "rms" if config.variant == "llama" else "layer"
            return TemporalNorm.init(TimeFeatures, TimeEmbed, Embed, key=next(keys), kind=kind,
                                     eps=config.layer_norm_epsilon, own_mlp=own, use_bias=bias and kind == "layer")

        shared = None if own else TimeMLP.init(TimeFeatures, TimeEmbed, key=next(keys))
        q = lin(Embed, (ac.KVHeads, ac.QHeadsPerGroup, ac.HeadSize))
        k = lin(Embed, (ac.KVHeads, ac.HeadSize))
        v = lin(Embed, (ac.KVHeads, ac.HeadSize))
        o = lin((ac.Heads, ac.HeadSize), Embed)
        if config.variant == "llama":
            mlp_in, mlp_up, mlp_out = lin(Embed, Mlp), lin(Embed, Mlp), lin(Mlp, Embed)
        else:  # Levanter's Gpt2Mlp keeps its weights input-first
            mlp_in, mlp_up, mlp_out = lin(Embed, Mlp, False), None, lin(Mlp, Embed, False)
        rot = ac.rope.build(ac.HeadSize) if ac.rope is not None else None
        return TemporalBlock(shared, norm(), q, k, v, o, norm(), mlp_in, mlp_up, mlp_out, ac, rot,
                             config.activation.to_fn(), config.variant, hnn.Dropout(config.resid_pdrop))

    def materialize(self, e: NamedArray) -> ParallelBlock:
        """The ``ParallelBlock`` with weights W(t), for e = e(t) of shape [..., TimeFeatures].

        Extra axes of e (e.g. ``Layers``) become axes of every weight, so materialising at L times gives the
        weights of an L-layer model in one batched computation.
        """
        h = self.shared_mlp(e) if self.shared_mlp is not None else None
        m = lambda unit: unit.materialize(e, h)  # noqa: E731
        attn = Attention(self.attn_config, m(self.q_proj), m(self.k_proj), m(self.v_proj), m(self.o_proj),
                         None, None, self.rot_embs)
        if self.variant == "llama":
            mlp = LlamaMlp(m(self.mlp_in), m(self.mlp_up), m(self.mlp_out), self.activation)
        else:
            mlp = Gpt2Mlp(m(self.mlp_in), m(self.mlp_out), self.activation)
        return ParallelBlock(m(self.attn_norm), attn, m(self.mlp_norm), mlp, self.dropout)


def stack_blocks(block: ParallelBlock, Layers: Axis) -> ParallelBlock:
    """The same ``ParallelBlock`` repeated along ``Layers``: weight sharing written out as an ordinary stack."""

    def bcast(leaf):
        return hax.broadcast_axis(leaf, Layers).rearrange((Layers, ...)) if isinstance(leaf, NamedArray) else leaf

    return jax.tree_util.tree_map(bcast, block, is_leaf=lambda x: isinstance(x, NamedArray))
