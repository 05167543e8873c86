"""A finished run, found, checked and loaded in one place: its directory, whether it finished, its summary and its
typed configuration (defaults filled in).

A run directory is what ``diffeqformer.train`` (and ``diffeqformer.population``, per member) writes, plus, for a
fine-tuning (``diffeqformer.finetune``), the pretraining's configuration::

    config.yaml           the resolved configuration, its hash on the first line (``# config_hash: <hash>``)
    pretrain_config.yaml  a fine-tuning only: the pretraining's config.yaml
    metrics.jsonl         every metric
    model.eqx             the trained model
    complete.json         written last: the summary (final validation loss, config hash, vocabulary size, ...)

A run is *complete* when its ``complete.json`` exists (and, where a config hash is asked for, records that hash).
Analysis modules, figures and the pipeline ask here; ``train`` and ``finetune`` (below this module) keep their own
check of the run they are writing. The file names are spelled once, in ``paths`` (``paths.RUN_COMPLETE``, ...), the
one module below the trainers that both they and this module import; the constants here are those names.

Reading a configuration imports the trainer (Levanter), so it happens inside the functions that need it: importing
this module (as ``figures`` does, which every notebook imports) stays cheap.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from . import paths

COMPLETE = paths.RUN_COMPLETE
"""The summary a run writes last: its presence means the run finished."""
CONFIG = paths.RUN_CONFIG
"""The run's resolved configuration (``TrainConfig`` or ``FinetuneConfig``), its hash on the first line."""
PRETRAIN_CONFIG = paths.RUN_PRETRAIN_CONFIG
"""A fine-tuning's copy of its pretraining's ``config.yaml``."""
METRICS = paths.RUN_METRICS
"""Every metric the trainer logs, one JSON object per line (``train.read_metrics``)."""
MODEL = paths.RUN_MODEL
"""The trained parameters (``train.load_model``, ``finetune.load_model``)."""
CHECKPOINTS = paths.RUN_CHECKPOINTS
"""Levanter's checkpoints (a folder)."""
HASH_PREFIX = paths.RUN_HASH_PREFIX
"""How ``config.yaml``'s first line records the configuration's hash."""


def run_path(run) -> Path:
    """A run directory as given to a notebook: absolute, or relative to ``DIFFEQFORMER_HOME`` (e.g.
    ``runs/cpu-diffeqformer``), so that a notebook's defaults work from any working directory."""
    path = Path(run).expanduser()
    return path if path.is_absolute() else paths.HOME / path


def is_complete(run, config_hash: str | None = None) -> bool:
    """Whether the run finished (its ``complete.json`` exists) and, given ``config_hash``, finished with that
    configuration (``complete.json`` records that hash)."""
    complete = run_path(run) / COMPLETE
    if not complete.exists():
        return False
    return config_hash is None or read_complete(run).get("config_hash") == config_hash


def require_complete(run, label: str = "run") -> Path:
    """The run's directory (``run_path``) if the run finished; else ``FileNotFoundError`` naming the run (as
    ``label``, e.g. ``"runs['ours'] ="``) and what is missing: the directory, or its ``complete.json``."""
    path = run_path(run)
    if not path.is_dir():
        missing = f"no such directory {path}"
    elif not (path / COMPLETE).exists():
        missing = f"{path} has no {COMPLETE}: it has not finished"
    else:
        return path
    raise FileNotFoundError(f"{label} {run}: no finished run there ({missing}); train it first, e.g. "
                            f"python -m diffeqformer.pipeline --preset <preset>")


def summary(run) -> dict:
    """The contents of a finished run's ``complete.json``: final validation loss and perplexity, config hash,
    vocabulary size, wall time, ... (``train.finish_run``)."""
    require_complete(run)
    return read_complete(run)


def read_complete(run) -> dict:
    """The run's ``complete.json``; a corrupt one is refused naming the file, with the way to train the run again."""
    return paths.read_run_json(run_path(run) / COMPLETE)


def saved_hash(run) -> str | None:
    """The config hash on the first line of the run's ``config.yaml`` (written when the run starts, so also for a
    run that has not finished), or None without that file."""
    saved = run_path(run) / CONFIG
    if not saved.exists():
        return None
    return saved.read_text().split("\n", 1)[0].removeprefix(HASH_PREFIX)


def is_finetuning(run) -> bool:
    """Whether the run is a fine-tuning (its directory holds ``pretrain_config.yaml``), not a pretraining."""
    return (run_path(run) / PRETRAIN_CONFIG).exists()


def config(run):
    """The run's configuration as its trainer read it, typed and with every default filled in: ``FinetuneConfig``
    for a fine-tuning, else ``TrainConfig``. Needs the run's ``config.yaml`` (not that the run finished)."""
    from .finetune import FinetuneConfig
    from .train import load_config

    path = _config_file(run, CONFIG)
    return load_config(path, cls=FinetuneConfig) if is_finetuning(run) else load_config(path)


def pretrain_config(run):
    """The ``TrainConfig`` of the pretraining a fine-tuning run started from (its ``pretrain_config.yaml``);
    ``ValueError`` for a run that is not a fine-tuning."""
    from .train import load_config

    if not is_finetuning(run):
        raise ValueError(f"run {run}: not a fine-tuning (no {PRETRAIN_CONFIG})")
    return load_config(_config_file(run, PRETRAIN_CONFIG))


def model_config(run):
    """The model configuration the run's model is built from: a fine-tuning's is its pretraining's."""
    return (pretrain_config(run) if is_finetuning(run) else config(run)).model


def model_type(model) -> str:
    """The name a model configuration is registered under (its ``type`` in YAML): ``diffeqformer``, ``gpt2``, ..."""
    return model.get_choice_name(type(model))


def config_field(cfg, dotted: str) -> Any:
    """``cfg.model.time_embed_dim`` for ``"model.time_embed_dim"``; ``AttributeError`` naming the field if the
    configuration has no such field."""
    node = cfg
    for part in dotted.split("."):
        if not hasattr(node, part):
            raise AttributeError(f"{type(cfg).__name__} has no field {dotted!r} (no {part!r})")
        node = getattr(node, part)
    return node


def _config_file(run, name: str) -> Path:
    path = run_path(run) / name
    if not path.exists():
        raise FileNotFoundError(f"run {run}: no {name} in {path.parent}")
    return path
