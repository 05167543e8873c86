"""Baselines at the dimensions of a DiffEqFormer config (PAPER.md section 1).

- ``gpt2``: Levanter's own GPT-2 (sequential pre-norm blocks, L independent layers).
- ``llama``: Levanter's own Llama (RoPE, RMSNorm, SwiGLU), tied embeddings as in the ODE model.
- ``shared``: the weight-shared model, one block applied L times (ALBERT / Zhong et al. 2022), which is DiffEqFormer
  with ``time_dependent=False``.

Levanter's GPT-2 and Llama configs are Hugging Face compatible; nothing here loads or converts an HF checkpoint, so
building and training them needs no internet.
"""

from __future__ import annotations

import dataclasses

from levanter.models.gpt2 import Gpt2Config
from levanter.models.llama import LlamaConfig
from levanter.models.lm_model import LmConfig

from .config import DiffEqFormerConfig

BASELINES = ("gpt2", "llama", "shared")


def baseline_config(config: DiffEqFormerConfig, kind: str) -> LmConfig:
    """The ``kind`` baseline with the same width, depth (L layers), heads, MLP width, sequence length and dropout."""
    common = {"max_seq_len": config.max_seq_len, "hidden_dim": config.hidden_dim, "num_layers": config.num_layers,
              "num_heads": config.num_heads, "initializer_range": config.initializer_range,
              "layer_norm_epsilon": config.layer_norm_epsilon, "activation_function": config.activation,
              "upcast_attn": config.upcast_attn, "attn_backend": config.attn_backend,
              "flash_attention_block_size": config.flash_attention_block_size}
    if kind == "gpt2":
        return Gpt2Config(**common, mlp_scale=config.mlp_scale, embed_pdrop=config.embed_pdrop,
                          resid_pdrop=config.resid_pdrop, use_bias=config.use_bias,
                          gradient_checkpointing=bool(config.gradient_checkpointing))
    if kind == "llama":
        return LlamaConfig(**common, intermediate_dim=config.Mlp.size, num_kv_heads=config.num_heads,
                           tie_word_embeddings=True, use_bias=False, rope=config.rope,
                           gradient_checkpointing=config.gradient_checkpointing)
    if kind == "shared":
        return dataclasses.replace(config, time_dependent=False)
    raise ValueError(f"unknown baseline {kind!r}; choose one of {BASELINES}")
