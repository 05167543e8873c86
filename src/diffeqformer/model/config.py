"""The configuration of DiffEqFormer (``type: diffeqformer`` in a Levanter YAML file): its fields, axes and
closed-form parameter count; the model it builds is ``model.transformer``'s."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

from haliax import Axis
from haliax.nn.scan import ScanCheckpointPolicy
from levanter.layers.attention import AttentionBackend, AttentionConfig
from levanter.layers.rotary import DefaultRotaryEmbeddingsConfig, RotaryEmbeddingsConfig
from levanter.models.lm_model import LmConfig
from levanter.utils.activation import ActivationFunctionEnum
from levanter.utils.flop_utils import lm_flops_per_token

from ..numerics import check_positive_int
from .time_embedding import SinusoidalTimeEmbedding

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
            raise ValueError(f"model.hidden_dim ({self.hidden_dim}) must be divisible by model.num_heads "
                             f"({self.num_heads})")
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

    model_type = None  # Levanter's LmConfig.model_type: DiffEqFormerLMHeadModel, set by model.transformer

    @property
    def activation(self) -> ActivationFunctionEnum:
        if self.activation_function is not None:
            return ActivationFunctionEnum(self.activation_function)
        return ActivationFunctionEnum.silu if self.variant == "llama" else ActivationFunctionEnum.gelu_new

    @property
    def checkpoint_policy(self) -> ScanCheckpointPolicy:
        return ScanCheckpointPolicy.from_bool_or_str(self.gradient_checkpointing)

    def attention_config(self) -> AttentionConfig:
        return AttentionConfig(Embed=self.Embed, num_heads=self.num_heads, num_kv_heads=self.num_heads,
                               use_bias=self.use_bias, upcast_attn=self.upcast_attn, attn_backend=self.attn_backend,
                               flash_attention_block_size=self.flash_attention_block_size,
                               rope=self.rope if self.variant == "llama" else None)

    def time_embedding(self) -> SinusoidalTimeEmbedding:
        return SinusoidalTimeEmbedding.init(self.sinusoidal_dim, scale=self.sinusoidal_scale,
                                            max_period=self.sinusoidal_max_period)

    def flops_per_token(self, vocab_size: int, context_length: int) -> Optional[float]:
        # The hypernetwork runs once per forward pass, not per token: per token the model costs what GPT costs.
        return lm_flops_per_token(hidden_dim=self.hidden_dim, intermediate_dim=self.Mlp.size,
                                  num_layers=self.num_layers, num_kv_heads=self.num_heads, num_heads=self.num_heads,
                                  seq_len=context_length, vocab_size=vocab_size, glu=self.variant == "llama")

    def total_trainable_params(self, vocab_size: int) -> int:
        """Closed-form parameter count (tests check it against the built model)."""
        return count_params_formula(self, vocab_size)


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
