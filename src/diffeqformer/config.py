"""The configurations, typed and frozen: a training run's (``TrainConfig``) and a fine-tuning's (``FinetuneConfig``),
read from YAML with draccus overrides (``load_config``), validated (naming the bad field), hashed (``config_hash``) and
dumped here and nowhere else; the models' are Levanter's ``LmConfig`` subclasses, chosen by their ``type`` in YAML."""

from __future__ import annotations

import argparse
import copy
import dataclasses
import functools
import hashlib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional

import draccus
import yaml
from draccus.argparsing import ArgumentParser
from levanter.adaptor.lora import LoraConfig, loraize
from levanter.models.lm_model import LmConfig
from levanter.optim.config import AdamConfig, OptimizerConfig
from levanter.tracker import NoopConfig
from levanter.trainer import TrainerConfig

from . import paths
from .model.config import DiffEqFormerConfig
from .numerics import check_positive_int

LOOP_VERSION = 3
"""Version of the training loop's numerics, hashed into every run's config hash: runs of an older loop train again."""

DECAY_ODE = r".*token_embeddings.*|.*position_embeddings.*"
"""Weight decay of the ODE model (GPT variant), a regex for Levanter's ``weight_decay_modules``: the paper's code
decays ``time_embedding`` and the embeddings; its time embedding has no parameters, so only the embeddings decay."""

DECAY_BASELINE = r"(?!.*norm)(.*\.)?(attn|self_attn|mlp)\.(.*\.)?weight$|.*token_embeddings.*|.*position_embeddings.*"
"""Weight decay of the baselines (GPT-2, Llama, the weight-shared model), as the paper's code and nanoGPT decay them:
the weight matrices of attention and MLP, and the embeddings; never a norm (such as ``attn_norm``) or a bias."""

DECAY_ALL = r".*"
"""Weight decay of every parameter, as the paper's code has for its Llama ODE model and its fine-tunings."""

@dataclass(frozen=True)
class DataConfig:
    """Which corpus to train on."""

    dataset: str = "shakespeare"
    """'shakespeare' (offline default), 'wikitext103' or 'openwebtext' (need the internet)."""
    domain: str = "all"
    """Shakespeare corpus domain: 'all', 'plays' or 'prose'."""
    vocab_size: int = 4096
    """Size of the byte-level BPE trained on the offline corpus (online corpora use GPT-2's tokenizer)."""
    shuffle: bool = True
    """Shuffle the training sequences (one Feistel permutation, the same each epoch); unshuffled, Levanter feeds the
    corpus document after document and the validation loss follows the genre being read."""
    tuning: bool = False
    """Train on part of the domain's training documents and evaluate on the rest (``corpora.tuning_split``), never on
    the validation split: the split a learning rate is chosen on. Hashed only when set."""

    def levanter_config(self):
        from .data.corpora import lm_dataset_config

        config = lm_dataset_config(self.dataset, self.domain, vocab_size=self.vocab_size, tuning=self.tuning)
        return dataclasses.replace(config, shuffle=self.shuffle, permutation_type="feistel")


@dataclass(frozen=True)
class TrainConfig:
    """One training run: data, model, Levanter trainer and optimiser, and where the run is written."""

    name: str = "diffeqformer"
    """Run name: the run directory is runs/<name> unless run_dir is given."""
    data: DataConfig = field(default_factory=DataConfig)
    model: LmConfig = field(default_factory=DiffEqFormerConfig)
    """Any Levanter LmConfig: type diffeqformer, gpt2 or llama."""
    trainer: TrainerConfig = field(default_factory=lambda: TrainerConfig(tracker=NoopConfig()))
    optimizer: OptimizerConfig = field(default_factory=AdamConfig)
    run_dir: Optional[str] = None
    """Where the run is written (default: runs/<name>)."""
    wandb: bool = False
    """Also log to Weights & Biases."""


METHODS = ("lora", "full")
"""Fine-tuning methods: LoRA adapters only, or every parameter."""


@dataclass(frozen=True)
class PaperLoraConfig(LoraConfig):
    """Levanter's ``LoraConfig`` with LoRA's own initialisation (Hu et al., 2021; Levanter's is the reverse): A drawn
    at random, B = 0, so the adapted model starts as the pretrained one."""

    zero_init_b: bool = True
    """B starts at zero (LoRA's convention)."""
    a_init_mode: Literal["random", "zero"] = "random"
    """A starts random ('random'), as in LoRA; 'zero' with zero_init_b would leave both factors without gradient."""


@dataclass(frozen=True)
class PretrainRef:
    """The finished pretraining run a fine-tuning starts from."""

    config: str = ""
    """Its config file (relative paths: to the working directory, else to the repository root)."""
    run_dir: Optional[str] = None
    """Its run directory (default: runs/<name in that config file>); it must hold a run of exactly that config."""
    population: int = 1
    """How many seeds of that config were pretrained together (``diffeqformer.population``); 1: alone."""
    member: int = 0
    """Which seed of that population the fine-tuning starts from (``seed_member``)."""


@dataclass(frozen=True)
class FinetuneConfig:
    """One fine-tuning run: the pretrained model, how it is discretised and adapted, the target data, the trainer."""

    name: str = "finetune"
    """Run name: the run directory is runs/<name> unless run_dir is given."""
    pretrain: PretrainRef = field(default_factory=PretrainRef)
    steps: Optional[int] = None
    """Euler steps N of the discretised DiffEqFormer (any N >= 1); null for a GPT/Llama pretraining."""
    method: str = "lora"
    """'lora' (Levanter's LoRA adapters, the rest frozen) or 'full' (every parameter)."""
    lora: PaperLoraConfig = field(default_factory=PaperLoraConfig)
    """Levanter's LoRA: rank r, alpha (adapters scaled by alpha/r), dropout, target_modules (None: every linear map)."""
    lora_embeddings: bool = True
    """LoRA also trains the embeddings (and an untied output layer), as the paper's code does."""
    data: DataConfig = field(default_factory=DataConfig)
    """The target domain; its tokenizer must be the pretraining's."""
    trainer: TrainerConfig = field(default_factory=lambda: TrainerConfig(tracker=NoopConfig()))
    optimizer: OptimizerConfig = field(default_factory=AdamConfig)
    """Weight decay (unless weight_decay_modules is set): attention/MLP weights and embeddings, as for GPT."""
    run_dir: Optional[str] = None
    """Where the run is written (default: runs/<name>)."""
    wandb: bool = False
    """Also log to Weights & Biases (off by default)."""


Config = TrainConfig | FinetuneConfig
"""A run's configuration: a training run's or a fine-tuning's."""


def run_dir_of(config: Config) -> Path:
    """Where a run is written: its ``run_dir``, else ``runs/<name>``."""
    return Path(config.run_dir) if config.run_dir else paths.RUNS / config.name


def validate(config: TrainConfig) -> None:
    """Reject bad input before any compute, naming the field (and GPT-2's attention dropout, which Levanter ignores)."""
    from levanter.models.gpt2 import Gpt2Config

    validate_common(config)
    model = config.model
    for name in ("max_seq_len", "hidden_dim", "num_layers", "num_heads"):
        check_positive_int(getattr(model, name, 1), f"model.{name}")
    if model.hidden_dim % model.num_heads:
        raise ValueError(f"model.hidden_dim ({model.hidden_dim}) must be divisible by model.num_heads "
                         f"({model.num_heads})")
    if not isinstance(model, Gpt2Config):  # DiffEqFormer checks its own dropout rates; Levanter's Llama has none
        return
    for name in ("embed_pdrop", "resid_pdrop", "attn_pdrop"):
        rate = getattr(model, name)
        if not 0.0 <= rate < 1.0:
            raise ValueError(f"model.{name} must be in [0, 1), got {rate!r}")
    if model.attn_pdrop != 0:
        raise ValueError(f"model.attn_pdrop must be 0, got {model.attn_pdrop!r}: Levanter's GPT-2 does not apply "
                         "attention dropout (its attention passes no dropout rate), so the value would do nothing")


def validate_common(config: Config) -> None:
    """Reject a bad run name (the run would be written in ``runs/`` itself), trainer, optimiser or data section."""
    if not isinstance(config.name, str) or not config.name.strip():
        raise ValueError(f"name must be a non-empty string (the run directory is runs/<name>), got {config.name!r}")
    validate_trainer(config.trainer)
    validate_optimizer(config.optimizer)
    validate_data(config.data)


def validate_trainer(t: TrainerConfig) -> None:
    """Reject a trainer section that would not train, naming the field."""
    check_positive_int(t.num_train_steps, "trainer.num_train_steps")
    if isinstance(t.train_batch_size, int):  # else a schedule of batch sizes
        check_positive_int(t.train_batch_size, "trainer.train_batch_size")
    check_positive_int(t.steps_per_eval, "trainer.steps_per_eval")
    if t.max_eval_batches is not None:
        check_positive_int(t.max_eval_batches, "trainer.max_eval_batches (or null for the whole validation split)")
    if isinstance(t.seed, bool) or not isinstance(t.seed, int):
        raise ValueError(f"trainer.seed must be an integer, got {t.seed!r}")
    for name in ("per_device_parallelism", "per_device_eval_parallelism"):
        if getattr(t, name) != -1:
            check_positive_int(getattr(t, name), f"trainer.{name} (or -1)")


def validate_optimizer(o: OptimizerConfig) -> None:
    """Reject an optimizer section that would not train, naming the field."""
    for name, ok, expected in (
            ("learning_rate", lambda v: v > 0, "a positive number"), ("weight_decay", lambda v: v >= 0, "at least 0"),
            ("beta1", lambda v: 0 <= v < 1, "in [0, 1)"), ("beta2", lambda v: 0 <= v < 1, "in [0, 1)"),
            ("epsilon", lambda v: v > 0, "a positive number"),
            ("max_grad_norm", lambda v: v > 0, "a positive number (or null for no clipping)"),
            ("min_lr_ratio", lambda v: 0 <= v <= 1, "in [0, 1]"),
            ("warmup", lambda v: 0 <= v <= 1 or float(v).is_integer() and v > 1,
             "a fraction of the steps in [0, 1] or a whole number of steps")):
        value = getattr(o, name, None)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ValueError(f"optimizer.{name} must be a number, got {value!r}")
        if value is not None and not (math.isfinite(value) and ok(value)):
            raise ValueError(f"optimizer.{name} must be {expected}, got {value!r}")


def validate_data(data: DataConfig) -> None:
    """Reject an unknown corpus or domain, or a vocabulary size the tokenizer cannot have."""
    from .data.corpora import DATASETS, DOMAINS, check_vocab_size

    if data.dataset not in DATASETS:
        raise ValueError(f"data.dataset must be one of {DATASETS}, got {data.dataset!r}")
    if data.domain not in DOMAINS:
        raise ValueError(f"data.domain must be one of {DOMAINS}, got {data.domain!r}")
    try:
        check_vocab_size(data.vocab_size)
    except ValueError as err:  # the tokenizer's check names its argument, vocab_size: say which section's
        raise ValueError(f"data.{err}") from None


def validate_finetune(config: FinetuneConfig) -> None:
    """Reject a fine-tuning's bad fields, naming the field (what needs the pretraining: ``finetune.validate``)."""
    validate_common(config)
    if config.method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {config.method!r}")
    if config.steps is not None and (type(config.steps) is not int or config.steps < 1):
        raise ValueError(f"steps must be a positive integer (or null for a GPT/Llama pretraining), "
                         f"got {config.steps!r}")
    if not config.pretrain.config:
        raise ValueError("pretrain.config must name the pretraining's config file")
    if config.method == "lora":
        if not (math.isfinite(config.lora.alpha) and config.lora.alpha > 0):
            raise ValueError(f"lora.alpha must be positive, got {config.lora.alpha!r}")
        if not 0.0 <= config.lora.dropout < 1.0:
            raise ValueError(f"lora.dropout must be in [0, 1), got {config.lora.dropout!r}")
        if config.lora.zero_init_b and config.lora.a_init_mode == "zero":
            raise ValueError("lora.zero_init_b with lora.a_init_mode 'zero' starts both factors at zero, and then "
                             "neither receives a gradient: set one of them differently")


def plain_tree(config) -> dict:
    """A draccus-encoded config reduced to plain YAML values (enums to their values, paths to strings): ``draccus.dump``
    writes Levanter's str-valued enums as Python-object tags that a safe YAML loader refuses."""
    import enum

    def plain(x):
        if isinstance(x, dict):
            return {k: plain(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [plain(v) for v in x]
        return x.value if isinstance(x, enum.Enum) else str(x) if isinstance(x, Path) else x

    return plain(draccus.encode(config))


def dump_config(config) -> str:
    """The config as plain YAML that ``load_config`` reads back."""
    return yaml.safe_dump(plain_tree(config), sort_keys=False)


def config_hash(config: Config, *, population: Optional[list[int]] = None,
                pretrain_config_hash: Optional[str] = None) -> str:
    """Hash of what determines the trained parameters (``hashed_tree``), a training run's or a fine-tuning's
    (``finetune_hash``); ``population``: the seeds it is trained with, if in a population. Model fields at their class
    default are left out, so that a new option keeps finished runs valid; the weight-decay mask is hashed."""
    if isinstance(config, FinetuneConfig):
        if pretrain_config_hash is None:
            raise ValueError("a fine-tuning's config hash covers its pretraining's: pass pretrain_config_hash")
        return finetune_hash(config, pretrain_config_hash, population=population)
    tree = hashed_tree(config)
    defaults = plain_tree(type(config.model)())
    tree["model"] = {k: v for k, v in tree["model"].items() if k not in defaults or defaults[k] != v}
    tree["training_loop"] = LOOP_VERSION
    if config.optimizer.weight_decay:
        tree["weight_decay_modules"] = with_paper_weight_decay(config.optimizer, config.model).weight_decay_modules
    if population is not None:
        tree["population"] = [int(seed) for seed in population]
    return hashlib.sha256(yaml.safe_dump(tree, sort_keys=False).encode()).hexdigest()[:16]


TRAINER_LAYOUT = ("mesh", "distributed", "per_device_parallelism", "allow_nondivisible_batch_size",
                  "use_explicit_mesh_axes", "require_accelerator", "jax_compilation_cache_dir", "shutdown_at_exit",
                  "checkpointer")
"""Fields of the trainer section that no config hash covers: how a run is laid over devices and processes and when it
is checkpointed, which change how the steps are computed, not what (float32 rounding aside: ``tests/test_devices.py``);
``per_device_eval_parallelism`` is covered: it sets which examples are evaluated (``train.evaluated_examples``)."""


def hashed_tree(config: Config) -> dict:
    """What of a configuration its hash covers, as plain values: all but ``run_dir``, W&B and ``TRAINER_LAYOUT``."""
    tree = plain_tree(dataclasses.replace(config, run_dir=None, wandb=False))
    for name in TRAINER_LAYOUT:
        tree["trainer"].pop(name, None)
    if not tree["data"].get("tuning"):
        tree["data"].pop("tuning", None)  # DataConfig.tuning: runs from before it keep their hashes
    return tree


def with_paper_weight_decay(optimizer: OptimizerConfig, model: LmConfig) -> OptimizerConfig:
    """The paper's weight-decay mask of a pretraining of ``model``, unless the config sets its own."""
    if isinstance(model, DiffEqFormerConfig) and model.time_dependent:
        return with_weight_decay(optimizer, DECAY_ALL if model.variant == "llama" else DECAY_ODE)
    return with_weight_decay(optimizer, DECAY_BASELINE)


def with_finetune_weight_decay(optimizer: OptimizerConfig) -> OptimizerConfig:
    """The paper's weight-decay mask of a fine-tuning (``DECAY_ALL``), unless the config sets its own."""
    return with_weight_decay(optimizer, DECAY_ALL)


def with_weight_decay(optimizer: OptimizerConfig, modules: str) -> OptimizerConfig:
    """Decay the parameters whose path matches the regex ``modules`` (only), unless the config sets its own."""
    if optimizer.weight_decay_modules is not None:
        return optimizer
    return dataclasses.replace(optimizer, weight_decay_modules=modules, default_weight_decay_mask=False)


def override_pairs(overrides: list[str] | tuple[str, ...] | None) -> list[tuple[str, str]]:
    """The (dotted field, value as written) of each override: ``["--model.x", "32", "--trainer.seed=1"]`` ->
    ``[("model.x", "32"), ("trainer.seed", "1")]``; ``ValueError`` for an item that is not one."""
    pairs, items = [], iter(overrides or [])
    for item in items:
        if not item.startswith("--") or item == "--":
            raise ValueError(f"an override must look like --field.name VALUE, got {item!r}")
        key, eq, value = item[2:].partition("=")
        if not eq and (value := next(items, None)) is None:
            raise ValueError(f"the override {item} has no value")
        pairs.append((key, value))
    return pairs


def without_overrides(overrides: list[str] | tuple[str, ...], *fields: str) -> tuple[str, ...]:
    """``overrides`` less those that set one of ``fields`` (dotted names, e.g. ``"trainer.seed"``)."""
    return tuple(item for key, value in override_pairs(overrides) if key not in fields
                 for item in (f"--{key}", value))


def override_args(values: dict[str, Any]) -> tuple[str, ...]:
    """Overrides that set each dotted field of ``values`` (a string as it is, anything else as JSON, which draccus
    reads as YAML): ``{"optimizer.beta2": 0.95}`` -> ``("--optimizer.beta2", "0.95")``."""
    import json

    return tuple(item for key, value in values.items()
                 for item in (f"--{key}", value if isinstance(value, str) else json.dumps(value)))


@functools.cache
def _parser(cls: type):
    """draccus's parser of ``cls`` (``draccus.parse``'s), built once: it reads every registered class's docstrings."""
    return ArgumentParser(cls, exit_on_error=False)


def load_config(path: str | Path, overrides: list[str] | None = None, *, cls: type = TrainConfig):
    """Parse a YAML file plus draccus-style overrides (``--model.time_embed_dim 32``) into ``cls``, as
    ``draccus.parse`` does; bad input is refused in one line naming the file or the override."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"config file not found: {path}" + (" (a directory)" if path.is_dir() else ""))
    return copy.deepcopy(_load_config(path, path.read_bytes(), tuple(map(str, overrides or [])), cls))


@functools.lru_cache(maxsize=1024)
def _load_config(path: Path, content: bytes, overrides: tuple[str, ...], cls: type):
    """``load_config`` of a file's bytes, parsed once (a copy is returned: Levanter's ``initialize`` sets fields)."""
    try:
        loaded = yaml.safe_load(content.decode("utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as err:  # YAML's error says where: "line 1, column 7"
        raise ValueError(f"{path}: not valid YAML ({one_line(err)})") from None
    if not isinstance(loaded, dict | None):
        raise ValueError(f"{path}: a config file is a mapping of fields (name: ..., model: ...), got a "
                         f"{type(loaded).__name__}")
    args = [*(["--config_path", str(path)] if loaded else []), *overrides]
    try:
        return _parser(cls).parse_args(args)
    except argparse.ArgumentError as err:  # an override without a value, or a choice that does not exist
        raise ValueError(one_line(err)) from None
    except draccus.utils.DecodingError as err:  # a value of the wrong type: "`epochs`: Couldn't parse 'x' into an int"
        raise ValueError(f"{path}: {one_line(err)}") from None
    except Exception as err:
        # draccus reports "Couldn't instantiate class ..." and keeps our validation error as the cause: surface it.
        cause, innermost = err, None
        while cause is not None:
            if isinstance(cause, ValueError):
                innermost = cause
            cause = cause.__cause__ or cause.__context__
        if innermost is not None and innermost is not err:
            raise ValueError(f"{path}: {innermost}") from None
        if isinstance(err, draccus.utils.DraccusException):  # an override that names no field
            raise ValueError(one_line(err)) from None
        raise


def one_line(error) -> str:
    """An error's message on one line: its lines joined by "; ", or by a space after a colon."""
    text = ""
    for line in filter(None, (line.strip() for line in str(error).splitlines())):
        text += (" " if text.endswith(":") else "; ") + line if text else line
    return text


def finetune_hash(config: FinetuneConfig, pretrain_config_hash: str, *,
                  population: Optional[list[int]] = None) -> str:
    """Hash of what determines the fine-tuned parameters: the config without its paths (``hashed_tree``) and the
    pretraining's config hash (so the same file at another path hashes the same), and ``population`` as a training's."""
    tree = hashed_tree(dataclasses.replace(config, pretrain=PretrainRef()))
    text = yaml.safe_dump(tree, sort_keys=False) + f"pretrain_config_hash: {pretrain_config_hash}\n"
    if config.optimizer.weight_decay:
        text += f"weight_decay_modules: {with_finetune_weight_decay(config.optimizer).weight_decay_modules}\n"
    if population is not None:
        text += f"population: {[int(seed) for seed in population]}\n"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def adapt(model, config: FinetuneConfig, *, key):
    """The pretrained model as it is fine-tuned: discretised to ``config.steps`` Euler steps, with LoRA's adapters."""
    if config.steps is not None:
        model = model.discretize(config.steps)
    if config.method == "lora":
        model = loraize(model, config.lora, key=key)
    return model


def pretraining_of(config: FinetuneConfig) -> tuple[TrainConfig, Path]:
    """The pretraining's configuration (member ``pretrain.member`` of ``pretrain.config``'s population) and its run
    directory, unchecked (``runs.pretraining`` checks them)."""
    ref = config.pretrain
    if not (type(ref.population) is int and ref.population >= 1 and type(ref.member) is int
            and 0 <= ref.member < ref.population):
        raise ValueError(f"pretrain.member must be a seed of the pretraining's population (0 to pretrain.population - "
                         f"1), got member {ref.member!r} of {ref.population!r}")
    pre = seed_member(load_config(repository_path(ref.config)), ref.member)
    return pre, Path(ref.run_dir) if ref.run_dir else run_dir_of(pre)


def pretraining_hash(config: FinetuneConfig) -> str:
    """The config hash a fine-tuning's pretraining must have been trained with (its population's seeds hashed too)."""
    pre, ref = pretraining_of(config)[0], config.pretrain
    first = pre.trainer.seed - ref.member  # member k is seed_member(k)
    return config_hash(pre, population=[first + k for k in range(ref.population)] if ref.population > 1 else None)


def seed_member(config: Config, k: int) -> Config:
    """Seed k of ``config``: ``trainer.seed`` + k, named ``<name>-seed<k>`` (its ``run_dir`` too, if set)."""
    if k == 0:
        return config
    return dataclasses.replace(config, name=f"{config.name}-seed{k}",
                               run_dir=f"{config.run_dir}-seed{k}" if config.run_dir else None,
                               trainer=dataclasses.replace(config.trainer, seed=config.trainer.seed + k))


def repository_path(path: str) -> Path:
    """``path`` as given if it exists (relative to the working directory), else relative to the repository root."""
    given = Path(path)
    return given if given.is_absolute() or given.exists() else paths.REPO / given


def config_class(path: str | Path) -> type:
    """``FinetuneConfig`` for a YAML file that names a pretraining (``pretrain``), else ``TrainConfig``."""
    path = Path(path)
    loaded = yaml.safe_load(path.read_text()) if path.exists() else None
    return FinetuneConfig if isinstance(loaded, dict) and "pretrain" in loaded else TrainConfig


def config_field(config: Config, dotted: str) -> Any:
    """``config.model.time_embed_dim`` for ``"model.time_embed_dim"``; ``AttributeError`` naming a missing field."""
    node = config
    for part in dotted.split("."):
        if not hasattr(node, part):
            raise AttributeError(f"{type(config).__name__} has no field {dotted!r} (no {part!r})")
        node = getattr(node, part)
    return node
