"""Fused attention on NVIDIA GPUs: cuDNN's flash attention through JAX, for Levanter's default attention backend.

Levanter's default backend on a GPU is Transformer Engine; where that is not installed (it is no dependency of this
project) Levanter falls back to its reference flash attention in JAX, whose loops XLA does not fuse into one kernel.
``install`` routes Levanter's ``dot_product_attention`` (used by its GPT-2, its Llama and DiffEqFormer) through
``jax.nn.dot_product_attention(implementation="cudnn")`` when the call asks for the default backend and is one cuDNN
computes exactly: a causal mask without segments, offsets or windows, no bias, soft cap, sink or attention dropout,
bfloat16 or float16 inputs. Every other call, and every call on another platform (a CPU: the cpu preset's numerics
are unchanged), goes to Levanter; a config that names a backend gets it, and ``DIFFEQFORMER_CUDNN_ATTENTION=0``
leaves Levanter's default alone everywhere.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import os

import haliax as hax
import jax
import jax.numpy as jnp
import levanter.layers.attention as levanter_attention
from haliax import NamedArray
from levanter.layers.attention import AttentionBackend, AttentionMask

LEVANTER_ATTENTION = levanter_attention.dot_product_attention
"""Levanter's own function, which every call this module does not take goes to."""
PATCHED_MODULES = ("levanter.layers.attention", "levanter.models.gpt2")
"""The modules whose name ``dot_product_attention`` ``install`` rebinds (GPT-2 imports the function by name)."""
CUDNN_DTYPES = (jnp.bfloat16, jnp.float16)
ENV_SWITCH = "DIFFEQFORMER_CUDNN_ATTENTION"
"""Set to 0, Levanter's default attention is left as it is."""


def jax_attention(QPos, KPos, Key, query: NamedArray, key: NamedArray, value: NamedArray, *, scaling_factor: float,
                  implementation: str | None) -> NamedArray:
    """Causal attention of named arrays by ``jax.nn.dot_product_attention``, whose layout is [B, T, N, H] with N
    query heads sharing K key heads. The axes that ``key`` has too (batch, its heads) become B and K = 1; those it
    lacks (Levanter's ``q_heads_per_group`` of grouped-query attention) become N. Returns ``query``'s axes in their
    order, with ``value``'s head size, as Levanter's ``dot_product_attention`` does. ``implementation``: JAX's
    (``"cudnn"``, ``"xla"`` or None)."""
    QPos, KPos, Key = query.resolve_axis(QPos), key.resolve_axis(KPos), query.resolve_axis(Key)
    Value = value.resolve_axis(Key.name)
    rest = [ax for ax in query.axes if ax.name not in (QPos.name, Key.name)]
    shared = tuple(ax for ax in rest if ax.name in key.shape)
    grouped = tuple(ax for ax in rest if ax.name not in key.shape)

    def layout(x: NamedArray, Pos, Size, heads) -> jax.Array:
        x = x.rearrange((*shared, Pos, *heads, Size)).array
        return x.reshape((-1, Pos.size, max(1, math.prod(ax.size for ax in heads)), Size.size))

    out = jax.nn.dot_product_attention(layout(query, QPos, Key, grouped), layout(key, KPos, Key, ()),
                                       layout(value, KPos, Value, ()), scale=scaling_factor, is_causal=True,
                                       implementation=implementation)
    axes = (*shared, QPos, *grouped, Value)
    out = hax.named(out.reshape(tuple(ax.size for ax in axes)), axes)
    return out.rearrange(tuple(Value if ax.name == Key.name else ax for ax in query.axes))


def cudnn_applies(query: NamedArray, mask, bias, attention_dtype, attn_backend, use_flash, dropout, inference,
                  logits_soft_cap, attn_sink) -> bool:
    """Whether a call of Levanter's ``dot_product_attention`` with these arguments is one cuDNN computes exactly and
    that asked for the default backend, on a GPU."""
    default = attn_backend in (None, AttentionBackend.DEFAULT) and use_flash in (None, True)
    causal_only = (isinstance(mask, AttentionMask) and mask.is_causal and mask.causal_offset is None
                   and mask.explicit_mask is None and mask.segment_ids is None and mask.sliding_window is None
                   and mask.bidirectional_window is None)
    return (default and causal_only and bias is None and logits_soft_cap is None and attn_sink is None
            and (dropout == 0.0 or inference) and query.dtype in CUDNN_DTYPES
            and (attention_dtype is None or attention_dtype == query.dtype)
            and jax.default_backend() == "gpu")


def dot_product_attention(QPos, KPos, Key, query, key, value, mask=None, bias=None, attention_dtype=None,
                          precision=None, use_flash=None, attn_backend=None, flash_block_size=None, dropout=0.0, *,
                          logits_soft_cap=None, scaling_factor=None, inference=True, prng=None, attn_sink=None):
    """Levanter's ``dot_product_attention`` (same arguments, same result), computed by cuDNN where
    ``cudnn_applies``, else by Levanter."""
    if cudnn_applies(query, mask, bias, attention_dtype, attn_backend, use_flash, dropout, inference,
                     logits_soft_cap, attn_sink):
        if scaling_factor is None:
            scaling_factor = 1.0 / float(query.resolve_axis(Key).size) ** 0.5
        return jax_attention(QPos, KPos, Key, query, key, value, scaling_factor=scaling_factor,
                             implementation="cudnn")
    return LEVANTER_ATTENTION(QPos, KPos, Key, query, key, value, mask, bias, attention_dtype, precision, use_flash,
                               attn_backend, flash_block_size, dropout, logits_soft_cap=logits_soft_cap,
                               scaling_factor=scaling_factor, inference=inference, prng=prng, attn_sink=attn_sink)


def install() -> bool:
    """Route Levanter's default attention through cuDNN (see the module's docstring); no-op where Transformer Engine
    is installed (Levanter's default then works as intended) or ``DIFFEQFORMER_CUDNN_ATTENTION`` is ``0``. Returns
    whether it is installed."""
    if importlib.util.find_spec("transformer_engine") is not None or os.environ.get(ENV_SWITCH, "1") == "0":
        return False
    for name in PATCHED_MODULES:
        module = importlib.import_module(name)
        if getattr(module, "dot_product_attention", None) in (LEVANTER_ATTENTION, dot_product_attention):
            module.dot_product_attention = dot_product_attention
    return True
