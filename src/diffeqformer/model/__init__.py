"""The model: DiffEqFormer's time-dependent weights and vector field, and the baselines it is compared with.

Bottom up: ``time_embedding`` (sinusoidal embedding of t) -> ``temporal`` (time-dependent weight units W(t)) ->
``vector_field`` (attention and feed-forward in parallel, with weights W(t)) -> ``transformer`` (the Levanter
``LmHeadModel``, its config registered as ``type: diffeqformer``, its discretisation into N layers) -> ``solve``
(the same ODE with any Diffrax solver) and ``baselines`` (GPT-2, Llama and the weight-shared model as configs).
"""

from .. import __all__ as _PACKAGE_API
from . import attention
from .temporal import TemporalLinear, TemporalNorm, TimeMLP
from .time_embedding import SinusoidalTimeEmbedding
from .transformer import (
    DiffEqFormerConfig,
    DiffEqFormerLMHeadModel,
    DiscreteDiffEqFormerLMHeadModel,
    count_params,
    count_params_formula,
    random_time_grid,
    time_grid,
)
from .vector_field import ParallelBlock, TemporalBlock

attention.install()  # Levanter's default attention by cuDNN on a GPU (see attention's docstring); no effect on a CPU

__all__ = sorted([*_PACKAGE_API, "random_time_grid"])
"""What ``diffeqformer`` itself re-exports (its ``__all__``), and ``random_time_grid``."""
