"""Small configurations and plain-JAX references shared by the tests."""

import dataclasses

import haliax as hax
import jax.numpy as jnp
from levanter.layers.attention import AttentionMask

from diffeqformer import DiffEqFormerConfig

# A config small enough to compile in seconds on two CPU cores.
TINY = DiffEqFormerConfig(
    max_seq_len=12, hidden_dim=16, num_layers=4, num_heads=2, mlp_scale=2, time_embed_dim=6, sinusoidal_dim=4
)
VOCAB = hax.Axis("vocab", 40)
CAUSAL = AttentionMask.causal()


def tiny(**changes) -> DiffEqFormerConfig:
    return dataclasses.replace(TINY, **changes)


def random_ids(key, config=TINY, Batch=None):
    axes = (config.Pos,) if Batch is None else (Batch, config.Pos)
    return hax.random.randint(key, axes, 0, VOCAB.size)


def assert_close(a, b, tol):
    a = a.array if hasattr(a, "array") else a
    b = b.array if hasattr(b, "array") else b
    err = float(jnp.max(jnp.abs(a - b)))
    assert err <= tol, f"max abs difference {err:.3e} exceeds {tol:.0e}"
