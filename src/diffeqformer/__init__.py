"""DiffEqFormer: neural ODE transformers with time-dependent weights (Tong et al., ICLR 2025)."""

import os as _os

# transformers (imported through Levanter and our tokenizer code) prints "PyTorch was not found" at import in every
# process; Levanter silences it the same way, but only once its GPT-2 module is imported, which is too late.
_os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

ONEDNN_FLAG = "--xla_cpu_experimental_onednn_custom_call=true"
"""XLA's CPU backend runs matrix products through oneDNN with this flag: faster cpu-preset training steps
(``benchmarks/cpu_kernels.py`` prints the ratio; the measurements page), the same losses up to float32 rounding, other
bits. ``DIFFEQFORMER_ONEDNN=0`` leaves XLA's own kernels. It must be in ``XLA_FLAGS`` before
JAX starts its CPU backend, so it is added when the package is imported; it changes nothing on a GPU."""


def _use_onednn(env=_os.environ) -> None:
    """Add ``ONEDNN_FLAG`` to ``XLA_FLAGS`` unless ``DIFFEQFORMER_ONEDNN=0`` or the flags already set it."""
    flags = env.get("XLA_FLAGS", "")
    if env.get("DIFFEQFORMER_ONEDNN", "1") != "0" and "xla_cpu_experimental_onednn_custom_call" not in flags:
        env["XLA_FLAGS"] = f"{flags} {ONEDNN_FLAG}".strip()


_use_onednn()

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

