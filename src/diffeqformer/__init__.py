"""DiffEqFormer: neural ODE transformers with time-dependent weights (Tong et al., ICLR 2025)."""

import os as _os

# transformers (imported through Levanter and our tokenizer code) prints "PyTorch was not found" at import in every
# process; Levanter silences it the same way, but only once its GPT-2 module is imported, which is too late.
_os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

from .model import (
    DiffEqFormerConfig,
    DiffEqFormerLMHeadModel,
    DiscreteDiffEqFormerLMHeadModel,
    ParallelBlock,
    SinusoidalTimeEmbedding,
    TemporalBlock,
    TemporalLinear,
    TemporalNorm,
    TimeMLP,
    count_params,
    count_params_formula,
    time_grid,
)

__all__ = [
    "DiffEqFormerConfig",
    "DiffEqFormerLMHeadModel",
    "DiscreteDiffEqFormerLMHeadModel",
    "ParallelBlock",
    "SinusoidalTimeEmbedding",
    "TemporalBlock",
    "TemporalLinear",
    "TemporalNorm",
    "TimeMLP",
    "count_params",
    "count_params_formula",
    "time_grid",
]
