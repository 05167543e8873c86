"""DiffEqFormer: neural ODE transformers with time-dependent weights (Tong et al., ICLR 2025)."""

import os as _os

# transformers (imported through Levanter and our tokenizer code) prints "PyTorch was not found" at import in every
# process; Levanter silences it the same way, but only once its GPT-2 module is imported, which is too late.
_os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

ONEDNN_FLAG = "--xla_cpu_experimental_onednn_custom_call=true"
"""XLA's CPU backend runs matrix products through oneDNN with this flag: faster training steps of the cpu preset's
models (``benchmarks/cpu_kernels.py`` prints the ratio; measurements page), the same losses up to float32 rounding,
other bits; slower for the analyses' many tiny products (F3's trajectories), so only training processes use it
(``use_onednn``). It changes nothing on a GPU."""


def use_onednn(env=None) -> None:
    """Add ``ONEDNN_FLAG`` to ``XLA_FLAGS`` of ``env`` (default: this process's environment, which must be done before
    JAX starts its CPU backend) unless ``DIFFEQFORMER_ONEDNN=0`` or the flags already choose: called by the processes
    that train (``train.cli``, the pipeline's training workers, F9's measured training steps), so that a run trained
    by hand and one trained by the pipeline compute alike."""
    env = _os.environ if env is None else env
    flags = env.get("XLA_FLAGS", "")
    if env.get("DIFFEQFORMER_ONEDNN", "1") != "0" and "xla_cpu_experimental_onednn_custom_call" not in flags:
        env["XLA_FLAGS"] = f"{flags} {ONEDNN_FLAG}".strip()


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

