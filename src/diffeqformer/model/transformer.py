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
from dataclasses import dataclass
from typing import Optional, Type

import equinox as eqx
import haliax as hax
import haliax.nn as hnn
import jax
import jax.numpy as jnp
import jax.random as jrandom
from haliax import Axis, NamedArray
from haliax.jax_utils import maybe_rng_split, shaped_rng_split
from haliax.nn.scan import ScanCheckpointPolicy, Stacked
from levanter.layers.attention import AttentionBackend, AttentionConfig, AttentionMask
from levanter.layers.rotary import DefaultRotaryEmbeddingsConfig, RotaryEmbeddingsConfig
from levanter.models.lm_model import LmConfig, LmHeadModel
from levanter.utils.activation import ActivationFunctionEnum
from levanter.utils.flop_utils import lm_flops_per_token

from ..numerics import check_positive_int
from .time_embedding import SinusoidalTimeEmbedding
from .vector_field import ParallelBlock, TemporalBlock, make_norm, stack_blocks

HYPERNETS = ("per_weight", "shared_mlp")
VARIANTS = ("gpt", "llama")


@LmConfig.register_subclass("diffeqformer")
@dataclass(frozen=True)
class DiffEqFormerConfig(LmConfig["DiffEqFormerLMHeadModel"]):
    """Configuration of DiffEqFormer; ``type: diffeqformer`` in a Levanter YAML file."""

    max_seq_len: int = 1024
    """Maximum sequence length (learned positions for the GPT variant); Levanter's ``LmConfig`` field."""
    hidden_dim: int = 768
    """Model width D."""
    num_layers: int = 12
    """Number of explicit Euler steps L on [0, 1] (the 'layers' of the ODE)."""
    num_heads: int = 12
    """Attention heads; hidden_dim must be divisible by it."""
    mlp_scale: int = 4
    """Feed-forward width as a multiple of hidden_dim."""
    time_embed_dim: int = 20
    """d_t: width of the hypernetwork's hidden state h(t). Parameters grow linearly with it."""
    sinusoidal_dim: int = 128
    """S: number of sinusoid frequencies in e(t) (e(t) has 2S+1 features); must be even."""
    sinusoidal_scale: float = 1000.0
    """s: t is multiplied by it before the sinusoids (t lives in [0, 1])."""
    sinusoidal_max_period: float = 10000.0
    """P: the longest period of the sinusoids."""
    hypernet: str = "per_weight"
    """'per_weight' (each weight owns its MLP, the paper's choice) or 'shared_mlp' (Appendix D.2's alternative)."""
    time_dependent: bool = True
    """False: one weight set for all t, the weight-shared baseline."""
    random_step_offset: bool = False
    """Training (a PRNG key given): Euler grid t_k = (k+u)/L, one u ~ U(0, 1] per call; else t_k = (k+1)/L. No
    effect on the weight-shared model (its weights do not depend on t)."""
    variant: str = "gpt"
    """'gpt' (LayerNorm, GELU MLP, learned positions) or 'llama' (RMSNorm, SwiGLU, RoPE)."""
    initializer_range: float = 0.02
    """Standard deviation of the token embeddings (positions: half of it)."""
    embed_pdrop: float = 0.0
    """Dropout on the embeddings."""
    resid_pdrop: float = 0.0
    """Dropout on the attention and feed-forward updates."""
    layer_norm_epsilon: float = 1e-5
    """Epsilon of every norm."""
    activation_function: Optional[ActivationFunctionEnum] = None
    """Feed-forward activation; default gelu_new (gpt) or silu (llama)."""
    use_bias: bool = True
    """Biases (time-dependent ones in the ODE model) in the linear maps and LayerNorms."""
    rope: RotaryEmbeddingsConfig = dataclasses.field(default_factory=DefaultRotaryEmbeddingsConfig)
    """Rotary embeddings of the llama variant."""
    gradient_checkpointing: bool | str = True
    """Haliax scan checkpoint policy over the Euler steps: True, False, 'nested', 'offload', ..."""
    upcast_attn: bool = False
    """Compute attention in float32 under mixed precision."""
    attn_backend: Optional[AttentionBackend] = None
    """Levanter attention backend (None: the default for the platform)."""
    flash_attention_block_size: Optional[int] = None
    """Block size of flash attention, where used."""

    def __post_init__(self):
        positive = ("max_seq_len", "hidden_dim", "num_layers", "num_heads", "mlp_scale", "time_embed_dim",
                    "sinusoidal_dim")
        for name in positive:
            check_positive_int(getattr(self, name), f"model.{name}")
        if self.hidden_dim % self.num_heads:
            raise ValueError(
                f"model.hidden_dim ({self.hidden_dim}) must be divisible by model.num_heads ({self.num_heads})"
            )
        if self.sinusoidal_dim % 2:
            raise ValueError(f"model.sinusoidal_dim must be even, got {self.sinusoidal_dim}")
        if self.hypernet not in HYPERNETS:
            raise ValueError(f"model.hypernet must be one of {HYPERNETS}, got {self.hypernet!r}")
        if self.variant not in VARIANTS:
            raise ValueError(f"model.variant must be one of {VARIANTS}, got {self.variant!r}")
        for name in ("embed_pdrop", "resid_pdrop"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"model.{name} must be in [0, 1), got {getattr(self, name)!r}")
        if not isinstance(self.random_step_offset, bool):
            raise ValueError(f"model.random_step_offset must be true or false, got {self.random_step_offset!r}")
        if self.sinusoidal_scale <= 0 or self.sinusoidal_max_period <= 0:
            raise ValueError("model.sinusoidal_scale and model.sinusoidal_max_period must be positive")

    # Axes
    Pos = property(lambda self: self.max_Pos)  # Levanter's max_Pos: Axis("position", max_seq_len)
    Embed = property(lambda self: Axis("embed", self.hidden_dim))
    Heads = property(lambda self: Axis("heads", self.num_heads))
    HeadSize = property(lambda self: Axis("head_size", self.hidden_dim // self.num_heads))
    Layers = property(lambda self: Axis("layers", self.num_layers))
    Mlp = property(lambda self: Axis("mlp", self.hidden_dim * self.mlp_scale))
    TimeEmbed = property(lambda self: Axis("time_embed", self.time_embed_dim))

    @property
    def model_type(self) -> Type["DiffEqFormerLMHeadModel"]:
        return DiffEqFormerLMHeadModel

    @property
    def activation(self) -> ActivationFunctionEnum:
        if self.activation_function is not None:
            return ActivationFunctionEnum(self.activation_function)
        return ActivationFunctionEnum.silu if self.variant == "llama" else ActivationFunctionEnum.gelu_new

    @property
    def checkpoint_policy(self) -> ScanCheckpointPolicy:
        return ScanCheckpointPolicy.from_bool_or_str(self.gradient_checkpointing)

    def attention_config(self) -> AttentionConfig:
        return AttentionConfig(
            Embed=self.Embed,
            num_heads=self.num_heads,
            num_kv_heads=self.num_heads,
            use_bias=self.use_bias,
            upcast_attn=self.upcast_attn,
            attn_backend=self.attn_backend,
            flash_attention_block_size=self.flash_attention_block_size,
            rope=self.rope if self.variant == "llama" else None,
        )

    def time_embedding(self) -> SinusoidalTimeEmbedding:
        return SinusoidalTimeEmbedding.init(
            self.sinusoidal_dim, scale=self.sinusoidal_scale, max_period=self.sinusoidal_max_period
        )

    def flops_per_token(self, vocab_size: int, context_length: int) -> Optional[float]:
        # The hypernetwork runs once per forward pass, not per token: per token the model costs what GPT costs.
        return lm_flops_per_token(
            hidden_dim=self.hidden_dim,
            intermediate_dim=self.Mlp.size,
            num_layers=self.num_layers,
            num_kv_heads=self.num_heads,
            num_heads=self.num_heads,
            seq_len=context_length,
            vocab_size=vocab_size,
            glu=self.variant == "llama",
        )

    def total_trainable_params(self, vocab_size: int) -> int:
        """Closed-form parameter count (tests check it against the built model)."""
        return count_params_formula(self, vocab_size)


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

    @property
    def config(self) -> DiffEqFormerConfig:
        return self._config

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

    @property
    def config(self) -> DiffEqFormerConfig:
        return self._config

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


def count_params_formula(config: DiffEqFormerConfig, vocab_size: int) -> int:
    """Trainable parameters of ``config.build(Vocab)``, in closed form.

    For the time-dependent model every weight of shape (in, out) costs d_t*in*out (projection) + in*out (its bias)
    + d_t*out (time-dependent bias), and every per-weight MLP (2S+1)*d_t + d_t + d_t^2 + d_t: linear in d_t but for
    the small d_t^2 term of the MLPs.
    """
    D, M, d_t = config.hidden_dim, config.Mlp.size, config.time_embed_dim
    F = 2 * config.sinusoidal_dim + 1
    llama = config.variant == "llama"
    linears = [(D, D)] * 4 + ([(D, M), (D, M), (M, D)] if llama else [(D, M), (M, D)])
    norm_vectors = 1 if llama else (2 if config.use_bias else 1)  # vectors per norm: weight (+ bias)
    total = vocab_size * D + (0 if llama else config.max_seq_len * D) + norm_vectors * D  # embeddings + final norm
    if not config.time_dependent:
        total += sum(i * o + (o if config.use_bias else 0) for i, o in linears) + 2 * norm_vectors * D
        return total
    mlp = F * d_t + d_t + d_t * d_t + d_t
    units = len(linears) + 2
    total += sum(d_t * i * o + i * o + (d_t * o if config.use_bias else 0) for i, o in linears)
    total += 2 * norm_vectors * d_t * D
    total += units * mlp if config.hypernet == "per_weight" else mlp
    return total


def count_params(model: eqx.Module) -> int:
    """Number of floating-point parameters of any model, also of a shape-only one (``eqx.filter_eval_shape``)."""
    import jax

    def is_param(leaf) -> bool:
        return hasattr(leaf, "shape") and hasattr(leaf, "dtype") and jnp.issubdtype(leaf.dtype, jnp.inexact)

    return int(sum(math.prod(leaf.shape) for leaf in jax.tree_util.tree_leaves(model) if is_param(leaf)))
