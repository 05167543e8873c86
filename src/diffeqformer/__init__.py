"""DiffEqFormer: neural ODE transformers with time-dependent weights (Tong et al., ICLR 2025)."""

import os as _os

# transformers (imported through Levanter and our tokenizer code) prints "PyTorch was not found" at import in every
# process; Levanter silences it the same way, but only once its GPT-2 module is imported, which is too late.
_os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

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


def __getattr__(name: str):
    """The model's public names, imported on first use (PEP 562): importing ``diffeqformer.paths`` or the pipeline's
    Papermill child does not load JAX, Levanter and the model (7 s here)."""
    if name in __all__:
        from . import model

        return getattr(model, name)
    raise AttributeError(f"module 'diffeqformer' has no attribute {name!r}")

