"""The model: DiffEqFormer's time-dependent weights and vector field, and the baselines it is compared with.

Bottom up: ``time_embedding`` (sinusoidal embedding of t) -> ``temporal`` (time-dependent weight units W(t)) ->
``config`` (the configuration, registered as ``type: diffeqformer``) -> ``vector_field`` (attention and feed-forward
in parallel, with weights W(t)) -> ``transformer`` (the Levanter ``LmHeadModel``, its discretisation into N layers)
-> ``solve`` (the same ODE with any Diffrax solver) and ``baselines`` (GPT-2, Llama and the weight-shared model as
configs). ``attention.install``, called where a model is trained or loaded, routes Levanter's default attention
through cuDNN on a GPU.
"""

from .. import __all__ as _PACKAGE_API
from . import attention
from .config import DiffEqFormerConfig, count_params_formula
from .temporal import TemporalLinear, TemporalNorm, TimeMLP
from .time_embedding import SinusoidalTimeEmbedding
from .transformer import (DiffEqFormerLMHeadModel, DiscreteDiffEqFormerLMHeadModel, count_params, random_time_grid,
                          time_grid)
from .vector_field import ParallelBlock, TemporalBlock

__all__ = sorted([*_PACKAGE_API, "random_time_grid"])
"""What ``diffeqformer`` itself re-exports (its ``__all__``), and ``random_time_grid``."""
