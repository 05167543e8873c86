"""DiffEqFormer: a transformer whose weights are functions of a continuous layer index t (PAPER.md section 1).

The hidden states solve dx/dt = f(t, x) on [0, 1]; f is the parallel attention + feed-forward block of
``vector_field`` with every weight produced by a time-dependent weight unit. Training uses L explicit Euler steps
with the official time grid t_k = (k+1)/L (the weights of step k are W(t_k)):

    x_{k+1} = x_k + (1/L) f(t_k, x_k),    k = 0..L-1

With ``random_step_offset`` the training forward pass (the one that gets a PRNG key) uses t_k = (k+u)/L instead,
one u ~ U(0, 1] per call, so that the weights are trained at every t rather than at L fixed points; without a key
(evaluation, inference) the grid is the official one.

Weights for all L steps are materialised once per forward pass (one batched hypernetwork call) and the steps run as
a Haliax scan with gradient checkpointing, so the cost is that of an L-layer GPT. ``discretize(N)`` turns the model
into an ordinary N-layer Levanter transformer; ``diffeqformer.model.solve`` solves the same ODE with any Diffrax solver.
"""

from __future__ import annotations

import dataclasses
import math

import equinox as eqx
import haliax as hax
import haliax.nn as hnn
import jax
import jax.numpy as jnp
import jax.random as jrandom
from haliax import Axis, NamedArray
from haliax.jax_utils import maybe_rng_split, shaped_rng_split
from haliax.nn.scan import Stacked
from levanter.layers.attention import AttentionMask
from levanter.models.lm_model import LmHeadModel

from ..numerics import check_positive_int
from .config import DiffEqFormerConfig
from .time_embedding import SinusoidalTimeEmbedding
from .vector_field import ParallelBlock, TemporalBlock, make_norm, stack_blocks

def time_grid(Steps: Axis, dtype=jnp.float32) -> NamedArray:
    """The official Euler grid t_k = (k+1)/N, k = 0..N-1: the weights of step k are W(t_k)."""
    return (hax.arange(Steps, dtype=dtype) + 1.0) / Steps.size


def random_time_grid(Steps: Axis, *, key, dtype=jnp.float32) -> NamedArray:
    """A randomly shifted Euler grid t_k = (k+u)/N, k = 0..N-1, with one u ~ U(0, 1] for all steps.

    Every step keeps its length 1/N and its place in [k/N, (k+1)/N]; the first weight time t_0 = u/N lies in
    (0, 1/N] (the official code defines this grid but never uses it). u = 1 gives ``time_grid``."""
    u = 1.0 - jrandom.uniform(key, (), dtype=dtype)  # U[0, 1) -> (0, 1]
    return (hax.arange(Steps, dtype=dtype) + u) / Steps.size


class Embeddings(eqx.Module):
    """Token embeddings (tied with the output head), learned positions for the GPT variant, dropout."""

    token_embeddings: hnn.Embedding  # [Vocab, Embed]
    position_embeddings: hnn.Embedding | None  # [Pos, Embed]
    dropout: hnn.Dropout

    @staticmethod
    def init(Vocab: Axis, config: DiffEqFormerConfig, *, key) -> "Embeddings":
        k_tok, k_pos = jrandom.split(key)
        tok = hnn.Embedding.init(Vocab, config.Embed, key=k_tok, initializer_range=config.initializer_range)
        pos = None
        if config.variant == "gpt":
            pos = hnn.Embedding.init(config.Pos, config.Embed, key=k_pos, initializer_range=config.initializer_range / 2)
        return Embeddings(tok, pos, hnn.Dropout(config.embed_pdrop))

    @property
    def Vocab(self) -> Axis:
        return self.token_embeddings.Vocab

    def embed(self, input_ids: NamedArray, pos_ids: NamedArray, *, key=None) -> NamedArray:
        x = self.token_embeddings(input_ids)
        if self.position_embeddings is not None:
            x = x + self.position_embeddings.embed(pos_ids)
        return self.dropout(x, key=key)


def euler_steps(blocks: Stacked[ParallelBlock], x: NamedArray, mask, step_size: float, *, key=None, pos_ids=None):
    """x <- x + h * block_k(x) for each block of the stack, with the stack's checkpoint policy."""
    keys = maybe_rng_split(key, blocks.Block.size) if key is not None else None

    def step(block: ParallelBlock, x: NamedArray, key) -> NamedArray:
        return x + block(x, mask, key=key, pos_ids=pos_ids) * step_size

    return blocks.fold_via(step)(x, keys)


class _LmBase(LmHeadModel[DiffEqFormerConfig]):
    """What the continuous and discretised models share: embeddings, tied head, final norm."""

    @property
    def config(self) -> DiffEqFormerConfig:
        return self._config

    @property
    def Vocab(self) -> Axis:
        return self.embeddings.Vocab

    def get_lm_head(self) -> NamedArray:
        return self.embeddings.token_embeddings.weight

    def resize_vocab(self, new_size: int, key=None):
        tok = self.embeddings.token_embeddings.resize_embeddings(new_size, key=key)
        return dataclasses.replace(self, embeddings=dataclasses.replace(self.embeddings, token_embeddings=tok))

    def _embed(self, input_ids, key, pos_ids):
        length = input_ids.resolve_axis("position").size
        if self.embeddings.position_embeddings is not None and length > self.config.max_seq_len:
            # The learned position table has max_seq_len rows; a lookup past its end does not fail (JAX clamps or
            # fills an out-of-bounds gather), so the model would silently read a sequence it cannot represent.
            raise ValueError(f"a sequence of {length} tokens is longer than model.max_seq_len "
                             f"({self.config.max_seq_len}), the number of learned positions")
        if pos_ids is None:
            pos_ids = hax.arange(input_ids.resolve_axis("position"), dtype=jnp.int32)
        return self.embeddings.embed(input_ids, pos_ids, key=key), pos_ids


class DiffEqFormerLMHeadModel(_LmBase):
    """The continuous model: embeddings -> ODE on [0, 1] (L Euler steps) -> final norm -> tied head."""

    embeddings: Embeddings
    block: TemporalBlock | ParallelBlock  # ParallelBlock when config.time_dependent is False (weight sharing)
    ln_f: hnn.LayerNorm | hnn.RmsNorm  # static final norm
    time_embedding: SinusoidalTimeEmbedding
    _config: DiffEqFormerConfig = eqx.field(static=True)

    @classmethod
    def init(cls, Vocab: Axis, config: DiffEqFormerConfig, *, key) -> "DiffEqFormerLMHeadModel":
        k_emb, k_block = jrandom.split(key)
        te = config.time_embedding()
        if config.time_dependent:
            block = TemporalBlock.init(config, te.TimeFeatures, key=k_block)
        else:
            block = ParallelBlock.init(config, key=k_block)
        return cls(Embeddings.init(Vocab, config, key=k_emb), block, make_norm(config), te, config)

    def weights_at(self, t: NamedArray) -> ParallelBlock:
        """The block f(t, .) with weights W(t); t may carry axes (e.g. ``Layers``), which the weights then carry.

        The features e(t) are computed in t's precision (float32 from ``time_grid``: sin(1000 t f) in bfloat16 would
        round the argument to a multiple of 4), then cast to the dtype of the block's parameters, so that W(t) and
        the state x keep the dtype the model computes in (bfloat16 under Levanter's ``p=f32,c=bfloat16`` policy: a
        float32 W(t) would make the Euler scan's carry float32, which the scan refuses)."""
        if isinstance(self.block, TemporalBlock):
            dtype = jax.tree_util.tree_leaves(eqx.filter(self.block, eqx.is_inexact_array))[0].dtype
            return self.block.materialize(self.time_embedding(t).astype(dtype))
        return self.block if not t.axes else stack_blocks(self.block, t.axes[0])

    def vector_field(self, t: NamedArray, x: NamedArray, mask=None, *, pos_ids=None, key=None) -> NamedArray:
        """f(t, x) for a scalar time t."""
        return self.weights_at(t)(x, mask, key=key, pos_ids=pos_ids)

    def discretize(self, num_steps: int) -> "DiscreteDiffEqFormerLMHeadModel":
        """An ordinary ``num_steps``-layer transformer: layer k has weights W((k+1)/num_steps) and its residual
        update is scaled by 1/num_steps. With num_steps == num_layers it computes exactly what this model computes."""
        check_positive_int(num_steps, "num_steps")
        config = dataclasses.replace(self.config, num_layers=num_steps)
        blocks = Stacked(self.weights_at(time_grid(config.Layers)), config.Layers, config.checkpoint_policy)
        transformer = DiscreteTransformer(blocks, self.ln_f, 1.0 / num_steps)
        return DiscreteDiffEqFormerLMHeadModel(self.embeddings, transformer, config)

    def activations(self, input_ids: NamedArray, attn_mask: AttentionMask | NamedArray | None = None, *, key=None,
                    pos_ids: NamedArray | None = None) -> NamedArray:
        """Final-normed hidden states [..., Pos, Embed] after L Euler steps on the official grid t_k = (k+1)/L, or,
        with ``config.random_step_offset`` and a key (training), on ``random_time_grid``."""
        L = self.config.Layers
        times = time_grid(L)
        if self.config.random_step_offset and key is not None and isinstance(self.block, TemporalBlock):
            key, k_time = jrandom.split(key)
            times = random_time_grid(L, key=k_time)
        k_embed, k_ode = maybe_rng_split(key, 2)
        x, pos_ids = self._embed(input_ids, k_embed, pos_ids)
        h = 1.0 / L.size
        if isinstance(self.block, TemporalBlock):
            blocks = Stacked(self.weights_at(times), L, self.config.checkpoint_policy)
            x = euler_steps(blocks, x, attn_mask, h, key=k_ode, pos_ids=pos_ids)
        else:  # weight sharing: one block applied L times, without L copies of its weights
            keys = maybe_rng_split(k_ode, L.size) if k_ode is not None else None

            def step(x, t, key):
                del t  # scanned only so that the scan always has an input (keys may be None)
                return x + self.block(x, attn_mask, key=key, pos_ids=pos_ids) * h

            x = hax.fold(step, L, remat=self.config.checkpoint_policy)(x, time_grid(L), keys)
        return self.ln_f(x)


DiffEqFormerConfig.model_type = DiffEqFormerLMHeadModel  # what the config builds (model.config cannot import it)


class DiscreteTransformer(eqx.Module):
    """N ordinary parallel blocks applied as x <- x + h f_k(x), then the final norm."""

    blocks: Stacked[ParallelBlock]
    ln_f: hnn.LayerNorm | hnn.RmsNorm
    step_size: float = eqx.field(static=True)

    def __call__(self, x, mask, *, key=None, pos_ids=None):
        return self.ln_f(euler_steps(self.blocks, x, mask, self.step_size, key=key, pos_ids=pos_ids))


class DiscreteDiffEqFormerLMHeadModel(_LmBase):
    """A DiffEqFormer discretised to ``config.num_layers`` ordinary layers (``DiffEqFormerLMHeadModel.discretize``).

    Every layer is built from Levanter's own modules (``Attention``, ``Gpt2Mlp``/``LlamaMlp``, Haliax norms and
    ``hnn.Linear``), so Levanter's LoRA and trainer treat it like any other transformer."""

    embeddings: Embeddings
    transformer: DiscreteTransformer
    _config: DiffEqFormerConfig = eqx.field(static=True)

    @classmethod
    def init(cls, Vocab: Axis, config: DiffEqFormerConfig, *, key) -> "DiscreteDiffEqFormerLMHeadModel":
        """A randomly initialised discrete model (independent weights per layer)."""
        k_emb, k_blocks = jrandom.split(key)
        blocks = Stacked.init(config.Layers, ParallelBlock, gradient_checkpointing=config.checkpoint_policy)(
            config, key=shaped_rng_split(k_blocks, config.num_layers)
        )
        transformer = DiscreteTransformer(blocks, make_norm(config), 1.0 / config.num_layers)
        return cls(Embeddings.init(Vocab, config, key=k_emb), transformer, config)

    def activations(self, input_ids: NamedArray, attn_mask: AttentionMask | NamedArray | None = None, *, key=None,
                    pos_ids: NamedArray | None = None) -> NamedArray:
        k_embed, k_blocks = maybe_rng_split(key, 2)
        x, pos_ids = self._embed(input_ids, k_embed, pos_ids)
        return self.transformer(x, attn_mask, key=k_blocks, pos_ids=pos_ids)


def count_params(model: eqx.Module) -> int:
    """Number of floating-point parameters of any model, also of a shape-only one (``eqx.filter_eval_shape``)."""
    import jax

    def is_param(leaf) -> bool:
        return hasattr(leaf, "shape") and hasattr(leaf, "dtype") and jnp.issubdtype(leaf.dtype, jnp.inexact)

    return int(sum(math.prod(leaf.shape) for leaf in jax.tree_util.tree_leaves(model) if is_param(leaf)))
