"""DiffEqFormer: neural ODE transformers with time-dependent weights (Tong et al., ICLR 2025)."""

from .model import (
    DiffEqFormerConfig,
    DiffEqFormerLMHeadModel,
    DiscreteDiffEqFormerLMHeadModel,
    count_params,
    count_params_formula,
    time_grid,
)
from .temporal import TemporalLinear, TemporalNorm, TimeMLP
from .time_embedding import SinusoidalTimeEmbedding
from .vector_field import ParallelBlock, TemporalBlock

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
