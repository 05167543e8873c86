"""DiffEqFormer: neural ODE transformers with time-dependent weights (Tong et al., ICLR 2025)."""

import os as _os

# transformers (imported through Levanter and our tokenizer code) prints "PyTorch was not found" at import in every
# process; Levanter silences it the same way, but only once its GPT-2 module is imported, which is too late.
_os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

ONEDNN_FLAG = "--xla_cpu_experimental_onednn_custom_call=true"
"""XLA's CPU backend runs matrix products through oneDNN with this flag: faster training steps of the cpu preset's
models, the same losses up to float32 rounding; slower for the analyses' many tiny products, so only training
processes use it (``use_onednn``). It changes nothing on a GPU."""

ONEDNN_CACHEABLE_FLAG = "--xla_cpu_use_onednn=true"
"""oneDNN as XLA's CPU library rather than through custom calls: unlike ``ONEDNN_FLAG``'s, a program compiled with it
can be kept in JAX's persistent compilation cache. F9's measured steps use it (``use_onednn(cacheable=True)``)."""


def use_onednn(env=None, *, cacheable: bool = False) -> None:
    """Add ``ONEDNN_FLAG`` (``cacheable``: ``ONEDNN_CACHEABLE_FLAG``) to ``XLA_FLAGS`` of ``env`` (default: this
    process's environment, which must be done before JAX starts its CPU backend) unless ``DIFFEQFORMER_ONEDNN=0`` or
    the flags already choose: called by the processes that train (``train.cli``, which the workflow's training jobs run),
    so that a run trained by hand and one trained by the workflow compute alike, and by F9's measured training steps."""
    env = _os.environ if env is None else env
    flags = env.get("XLA_FLAGS", "")
    chosen = "xla_cpu_experimental_onednn_custom_call" in flags or "xla_cpu_use_onednn" in flags
    if env.get("DIFFEQFORMER_ONEDNN", "1") != "0" and not chosen:
        env["XLA_FLAGS"] = f"{flags} {ONEDNN_CACHEABLE_FLAG if cacheable else ONEDNN_FLAG}".strip()


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
    """The model's public names, imported on first use (PEP 562): importing ``diffeqformer.paths`` or the workflow's
    Papermill child does not wait for JAX, Levanter and the model to load."""
    if name in __all__:
        from . import model

        return getattr(model, name)
    raise AttributeError(f"module 'diffeqformer' has no attribute {name!r}")

