"""Adaptive fine-tuning (PAPER.md section 3, Fig. 5): ``python -m diffeqformer.finetune --config file.yaml [...]``.

A DiffEqFormer pretrained with L Euler steps becomes an ordinary N-layer transformer for any N
(``DiffEqFormerLMHeadModel.discretize``); that transformer, or a pretrained GPT/Llama as it is, is then fine-tuned on
a target domain with Levanter's trainer, either fully or with Levanter's LoRA (``levanter.adaptor.lora``: adapters
on every linear map that ``lora.target_modules`` selects, everything else frozen).

A fine-tuning run names the finished pretraining run it starts from twice: the pretraining's config file and its run
directory (``pretrain.config``, ``pretrain.run_dir``); the run must be complete and must have been trained with exactly
that configuration (same config hash). The run directory (``runs/<name>/`` or ``--run_dir``) holds what a training
run holds (``diffeqformer.train``) plus ``pretrain_config.yaml``, the pretraining's resolved configuration:

    config.yaml           the resolved fine-tuning configuration, its hash on the first line
    pretrain_config.yaml  the pretraining's config.yaml (what ``load_model`` rebuilds the model from)
    checkpoints/          Levanter checkpoints (LoRA: the adapters and their optimiser state only)
    metrics.jsonl         every metric; the validation loss of the model before fine-tuning is logged at step -1
    model.eqx             the fine-tuned model (LoRA: with its adapters, not merged)
    complete.json         final and initial validation loss, parameter counts (trainable and total), throughput, ...

Its config hash covers the fine-tuning configuration and the pretraining's config hash, not the paths.
``finetune_grid`` lists every run of the Fig. 5 experiment.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Optional

import equinox as eqx
import jax
import jax.random as jrandom
import levanter
from haliax import Axis
from haliax.partitioning import round_axis_for_partitioning
from levanter.adaptor.lora import LoraConfig, lora_trainable_params_filter, loraize, merge_lora_modules
from levanter.optim.config import AdamConfig, OptimizerConfig
from levanter.tracker import NoopConfig
from levanter.trainer import TrainerConfig

from . import paths, train
from .dispatch import Trainer
from .model.transformer import DiffEqFormerConfig, count_params
from .train import (
    DECAY_BASELINE,
    DataConfig,
    TrainConfig,
    cli,
    dump_config,
    finish_run,
    fit,
    load_config,
    next_token_loss,
    read_metrics,
    run_dir_of,
    run_lock,
    start_run,
    trainer_config_of,
    validate_data,
    validate_optimizer,
    validate_trainer,
    with_weight_decay,
)

METHODS = ("lora", "full")
"""Fine-tuning methods: LoRA adapters only, or every parameter."""


@dataclass(frozen=True)
class PaperLoraConfig(LoraConfig):
    """Levanter's ``LoraConfig`` with LoRA's own initialisation (Hu et al., 2021): A drawn at random, B = 0, so the
    adapted model starts as the pretrained model and the first update moves B. (Levanter's default is the reverse,
    A = 0 and B random.)"""

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


@dataclass
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
    """LoRA also trains the embeddings (token and position embeddings, tied with the output layer; an untied output
    layer too), as the paper's code does. Without them the output layer cannot follow the target domain's words."""
    data: DataConfig = field(default_factory=DataConfig)
    """The target domain; its tokenizer must be the pretraining's."""
    trainer: TrainerConfig = field(default_factory=lambda: TrainerConfig(tracker=NoopConfig()))
    optimizer: OptimizerConfig = field(default_factory=AdamConfig)
    """Weight decay (unless weight_decay_modules is set): attention/MLP weights and embeddings, as for GPT."""
    run_dir: Optional[str] = None
    """Where the run is written (default: runs/<name>)."""
    wandb: bool = False
    """Also log to Weights & Biases (off by default)."""


@dataclass(frozen=True)
class Pretraining:
    """A finished pretraining run, checked against its config file (``validate``)."""

    config: TrainConfig
    run_dir: Path
    config_hash: str
    Vocab: Axis


def pretraining_of(config: FinetuneConfig) -> tuple[TrainConfig, Path]:
    """The pretraining's configuration (parsed from ``pretrain.config``) and its run directory (``pretrain.run_dir``,
    else the configuration's own); neither is checked here (``validate`` does)."""
    pre = load_config(_repository_path(config.pretrain.config))
    return pre, Path(config.pretrain.run_dir) if config.pretrain.run_dir else run_dir_of(pre)


def validate(config: FinetuneConfig) -> Pretraining:
    """Reject bad input before anything is written, naming the field; return the checked pretraining run.

    Takes seconds: the pretrained model is built shape-only (to check the LoRA rank and targets), not loaded."""
    train.validate_name(config)
    validate_trainer(config.trainer)
    validate_optimizer(config.optimizer)
    validate_data(config.data)
    if config.method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {config.method!r}")
    if config.steps is not None and (not _is_int(config.steps) or config.steps < 1):
        raise ValueError(
            f"steps must be a positive integer (or null for a GPT/Llama pretraining), got {config.steps!r}"
        )

    if not config.pretrain.config:
        raise ValueError("pretrain.config must name the pretraining's config file")
    pre_path = _repository_path(config.pretrain.config)
    if not pre_path.exists():
        raise ValueError(f"pretrain.config: no such file {config.pretrain.config}")
    pre, pre_dir = pretraining_of(config)
    complete = pre_dir / paths.RUN_COMPLETE
    if not complete.exists():
        raise ValueError(
            f"pretrain.run_dir: {pre_dir} holds no finished pretraining run (no {paths.RUN_COMPLETE}); "
            f"train it first: python -m diffeqformer.train --config {pre_path} --run_dir {pre_dir}"
        )
    summary = paths.read_run_json(complete)
    digest = train.config_hash(pre)
    if summary.get("config_hash") != digest:
        raise ValueError(
            f"pretrain.config: the run in {pre_dir} was trained with another configuration "
            f"(hash {summary.get('config_hash')}) than {pre_path} (hash {digest})"
        )

    ode = isinstance(pre.model, DiffEqFormerConfig)
    kind = pre.model.get_choice_name(type(pre.model))
    if ode and config.steps is None:
        raise ValueError(
            f"steps must be given for a DiffEqFormer pretraining (it was trained with {pre.model.num_layers})"
        )
    if not ode and config.steps is not None:
        raise ValueError(f"steps must be null for a {kind} pretraining: only a DiffEqFormer can be discretised")
    if _tokenizer_of(config.data) != _tokenizer_of(pre.data):
        raise ValueError(
            f"data: the fine-tuning data's tokenizer ({_tokenizer_of(config.data)}) is not the pretraining's "
            f"({_tokenizer_of(pre.data)}); set data.dataset/data.vocab_size as in {pre_path}"
        )

    pretraining = Pretraining(pre, pre_dir, digest, Axis("vocab", summary["vocab_size"]))
    if config.method == "lora":
        r, hidden = config.lora.r, pre.model.hidden_dim
        if not _is_int(r) or not 1 <= r <= hidden:
            raise ValueError(f"lora.r must be an integer from 1 to the hidden size {hidden}, got {r!r}")
        if not (math.isfinite(config.lora.alpha) and config.lora.alpha > 0):
            raise ValueError(f"lora.alpha must be positive, got {config.lora.alpha!r}")
        if not 0.0 <= config.lora.dropout < 1.0:
            raise ValueError(f"lora.dropout must be in [0, 1), got {config.lora.dropout!r}")
        if config.lora.zero_init_b and config.lora.a_init_mode == "zero":
            raise ValueError("lora.zero_init_b with lora.a_init_mode 'zero' starts both factors at zero, and then "
                             "neither receives a gradient: set one of them differently")
        shape = eqx.filter_eval_shape(
            lambda: adapt(pre.model.build(pretraining.Vocab, key=jrandom.PRNGKey(0)), config, key=jrandom.PRNGKey(0))
        )
        if not any(jax.tree_util.tree_leaves(lora_trainable_params_filter(shape))):
            raise ValueError(f"lora.target_modules {config.lora.target_modules!r} matches no linear layer of the model")
    return pretraining


def config_hash(config: FinetuneConfig, pretrain_config_hash: str, *,
                population: Optional[list[int]] = None) -> str:
    """Hash of what determines the fine-tuned parameters: the fine-tuning config without its paths, and the
    pretraining's config hash (so the same file at another path, or the same run moved, hashes the same).

    ``population``: the seeds of the population the run is trained in (``diffeqformer.population``), hashed too, as
    ``train.config_hash`` hashes them."""
    relevant = dataclasses.replace(config, run_dir=None, wandb=False, pretrain=PretrainRef())
    text = dump_config(relevant) + f"pretrain_config_hash: {pretrain_config_hash}\n"
    if population is not None:
        text += f"population: {[int(seed) for seed in population]}\n"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def adapt(model, config: FinetuneConfig, *, key):
    """The pretrained model as it is fine-tuned: a DiffEqFormer discretised to ``config.steps`` Euler steps, then,
    for LoRA, with Levanter's adapters on the linear maps that ``config.lora.target_modules`` selects."""
    if config.steps is not None:
        model = model.discretize(config.steps)
    if config.method == "lora":
        model = loraize(model, config.lora, key=key)
    return model


def compiled_adapt(model, config: FinetuneConfig, *, key, axis_mapping=None):
    """``adapt`` as one program, compiled as a fresh model's initialisation is (``train.compiled_once``) and sharded
    by ``axis_mapping``: on one core 1.7 s for the cpu preset's 18-step DiffEqFormer with LoRA, against 4.8-5.1 s op
    by op. Its discretisation rounds differently from the op-by-op one (by up to 2e-9 in the smoke model's weights);
    resumed, a fine-tuning runs the same program again, so its frozen weights are the same."""
    return train.compiled_once(lambda m, k: adapt(m, config, key=k), axis_mapping)(model, key)


def trainable(config: FinetuneConfig, model):
    """The trainer's ``is_trainable`` filter: everything (full fine-tuning), or the LoRA adapters and, with
    ``lora_embeddings``, the embeddings and an untied output layer."""
    if config.method != "lora":
        return True
    spec = lora_trainable_params_filter(model)
    if config.lora_embeddings:
        spec = eqx.tree_at(lambda s: s.embeddings, spec, True)
        if getattr(model, "lm_head", None) is not None:
            spec = eqx.tree_at(lambda s: s.lm_head, spec, True)
    return spec


def main(config: FinetuneConfig) -> dict:
    """Fine-tune (or resume, or skip a finished run) and return the contents of ``complete.json``."""
    pretraining = validate(config)
    run_dir = run_dir_of(config)
    with run_lock(run_dir):
        digest = config_hash(config, pretraining.config_hash)
        finished = start_run(config, run_dir, digest)
        if finished is not None:
            return finished
        paths.write_atomic(run_dir / paths.RUN_PRETRAIN_CONFIG, (pretraining.run_dir / paths.RUN_CONFIG).read_text())

        data = config.data.levanter_config()
        trainer_config = trainer_config_of(config, run_dir)
        optimizer = train.initialize_and_build(trainer_config, with_weight_decay(config.optimizer, DECAY_BASELINE))

        start = time.time()
        with Trainer(trainer_config, optimizer, next_token_loss) as trainer:
            data_key, adapter_key, training_key = jrandom.split(jrandom.PRNGKey(trainer_config.seed), 3)
            Vocab = round_axis_for_partitioning(Axis("vocab", len(data.the_tokenizer)), trainer.parameter_axis_mapping)
            if Vocab != pretraining.Vocab:
                raise ValueError(f"data: {Vocab.size} tokens, but the pretrained model has {pretraining.Vocab.size}")
            model = compiled_adapt(train.load_model(pretraining.run_dir), config, key=adapter_key,
                                   axis_mapping=trainer.parameter_axis_mapping)
            # On resume Levanter restores the trainable parameters from the checkpoint and takes the frozen ones
            # from here.
            state = trainer.initial_state(training_key, model=model, is_trainable=trainable(config, model))
            counts = {
                "trainable_params": count_params(state.trainable_model),
                "total_params": count_params(state.model),
            }
            levanter.tracker.log_summary(counts)
            model_config = state.model.config
            flops = model_config.flops_per_token(Vocab.size, model_config.max_seq_len)
            state = fit(trainer, state, config, data, data_key=data_key, Pos=model_config.max_Pos,
                        flops_per_token=flops, run_dir=run_dir, evaluate_first=True)
            return finish_run(
                config, run_dir, state.model, digest, start,
                vocab_size=Vocab.size, method=config.method, euler_steps=config.steps, **counts,
                pretrained_eval_loss=initial_eval_loss(run_dir), pretrain_config_hash=pretraining.config_hash,
            )


def load_model(run_dir: str | Path, *, merged: bool = False):
    """The fine-tuned model of a finished run, rebuilt from ``pretrain_config.yaml`` and ``config.yaml``.

    LoRA runs keep their adapters (``LoraLinear`` modules); ``merged=True`` folds them into the weights
    (``levanter.adaptor.lora.merge_lora_modules``), which gives a model of the (discretised) pretrained model's
    structure."""
    run_dir = Path(run_dir)
    complete = run_dir / paths.RUN_COMPLETE
    if not complete.exists():
        raise FileNotFoundError(f"{run_dir} holds no finished run (no {paths.RUN_COMPLETE})")
    config = load_config(run_dir / paths.RUN_CONFIG, cls=FinetuneConfig)
    pre = load_config(run_dir / paths.RUN_PRETRAIN_CONFIG)
    Vocab = Axis("vocab", json.loads(complete.read_text())["vocab_size"])
    key = jrandom.PRNGKey(0)  # only shapes matter: the values are read from the file
    skeleton = eqx.filter_eval_shape(lambda: adapt(pre.model.build(Vocab, key=key), config, key=key))
    model = eqx.tree_deserialise_leaves(run_dir / paths.RUN_MODEL, skeleton)
    return merge_lora_modules(model) if merged else model


def initial_eval_loss(run_dir: Path) -> Optional[float]:
    """The validation loss of the pretrained model, before fine-tuning (logged at step -1), from ``metrics.jsonl``."""
    metrics = read_metrics(run_dir)
    if -1 not in metrics.index or "eval/loss" not in metrics:
        return None
    return float(metrics.loc[-1, "eval/loss"])


def _tokenizer_of(data: DataConfig) -> str:
    """Which tokenizer ``data.lm_dataset_config`` uses for a corpus."""
    from .data.corpora import ONLINE_TOKENIZER

    if data.dataset in ("wikitext103", "openwebtext"):
        return ONLINE_TOKENIZER
    if data.dataset == "shakespeare":
        return f"shakespeare BPE with {data.vocab_size} tokens"
    return data.dataset  # synthetic: its own word-level vocabulary


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _repository_path(path: str) -> Path:
    """``path`` as given if it exists (relative to the working directory), else relative to the repository root."""
    given = Path(path)
    return given if given.is_absolute() or given.exists() else paths.REPO / given


# --------------------------------------------------------------------------------------------- the Fig. 5 grid

DISCRETISATIONS = (9, 12, 18, 24)
"""Euler steps N of the fine-tuned DiffEqFormers (it is pretrained with 18): the paper's."""
PRESET_DISCRETISATIONS = {"cpu": (9, 18, 24)}
"""Presets that fine-tune fewer N: the cpu preset leaves out 12 (fewer steps, the same, more) to build the book
within 40 minutes on two cores (a fine-tuning there costs about a minute)."""
DIRECTIONS = (("plays", "prose"), ("prose", "plays"))
"""(pretraining domain, fine-tuning domain) of the offline corpus: the paper's WikiText-103 <-> OpenWebText."""
ONLINE_DIRECTIONS = (("wikitext103", "openwebtext"), ("openwebtext", "wikitext103"))
"""The paper's directions, for presets whose fine-tuning templates train on an online corpus (``data.dataset`` is
then the domain)."""
PRETRAINED = {"diffeqformer18": "pretrain_diffeqformer18_{domain}.yaml", "gpt2_24": "pretrain_gpt2_24_{domain}.yaml"}
"""The pretrained models of a preset: an 18-step DiffEqFormer and the 24-layer GPT-2 baseline, one per domain."""
TEMPLATES = {method: f"finetune_{method}.yaml" for method in METHODS}
"""The fine-tuning configs of a preset, one per method; the grid overrides name, pretrain, steps and data.domain."""
FINETUNE_SEEDS = {"cpu": 3, "gpu": 3}
"""Seeds of each fine-tuning setting, per preset (others: 1): F7's comparisons are judged over seeds
(``analysis.seeds.RULE``); a setting's seeds are trained together, as one population (``diffeqformer.population``)."""


@dataclass(frozen=True)
class GridRun:
    """One run of an experiment: ``python -m <module> --config <config> <overrides>`` writes ``runs/<name>``."""

    name: str
    module: str
    """``diffeqformer.train`` (pretraining, training from scratch) or ``diffeqformer.finetune``."""
    config: Path
    overrides: tuple[str, ...] = ()
    after: tuple[str, ...] = ()
    """Names of the runs that must be complete first (the pretraining a fine-tuning starts from)."""
    population: tuple[int, ...] = ()
    """The trainer seeds of the population the run is a member of, trained together (``python -m
    diffeqformer.population --config <config> <overrides of the first member> --seeds <n>``; ``argv`` trains a
    member alone, which is another run: another config hash); empty: trained alone."""

    @property
    def run_dir(self) -> Path:
        return paths.RUNS / self.name

    def argv(self) -> list[str]:
        """The arguments after ``python``."""
        return ["-m", self.module, "--config", str(self.config), *self.overrides]


def discretisations(preset: str) -> tuple[int, ...]:
    """The Euler steps N a preset fine-tunes the 18-step DiffEqFormer with."""
    return PRESET_DISCRETISATIONS.get(preset, DISCRETISATIONS)


def finetune_grid(preset: str = "cpu") -> list[GridRun]:
    """Every run of the Fig. 5 experiment at a preset, in an order that runs each pretraining before its fine-tunings:

    * the pretrainings: an 18-step DiffEqFormer and a 24-layer GPT-2 on each domain (``PRETRAINED``);
    * for each direction (``DIRECTIONS``; ``ONLINE_DIRECTIONS`` where the templates train on an online corpus) and
      method (``METHODS``): the DiffEqFormer discretised to each N of
      ``discretisations(preset)``, and the 24-layer GPT-2, fine-tuned on the other domain (``TEMPLATES``), each
      with ``FINETUNE_SEEDS`` seeds: ``<name>``, ``<name>-seed1``, ... (the template's ``trainer.seed`` and the
      next ones), one population;
    * a 24-layer GPT-2 trained from scratch on each target domain for as many steps as a fine-tuning.

    Needs ``config/<preset>/`` to hold the files named in ``PRETRAINED`` and ``TEMPLATES`` (cpu, gpu and paper do)."""
    folder = paths.CONFIG / preset
    templates = {method: folder / f for method, f in TEMPLATES.items()}
    loaded = {method: load_config(p, cls=FinetuneConfig) for method, p in templates.items() if p.exists()}
    offline = all(t.data.dataset == "shakespeare" for t in loaded.values())
    directions = DIRECTIONS if offline else ONLINE_DIRECTIONS
    domain_field = "--data.domain" if offline else "--data.dataset"
    domains = sorted({d for direction in directions for d in direction})
    pretrained = {(m, d): folder / f.format(domain=d) for m, f in PRETRAINED.items() for d in domains}
    missing = [str(p) for p in [*pretrained.values(), *templates.values()] if not p.exists()]
    if missing:
        raise FileNotFoundError(f"finetune_grid({preset!r}) needs {', '.join(missing)}")

    pre_names = {key: load_config(path).name for key, path in pretrained.items()}
    runs = [GridRun(pre_names[key], "diffeqformer.train", path) for key, path in pretrained.items()]
    for source, target in directions:
        for method in METHODS:
            for model, steps in [*(("diffeqformer18", n) for n in discretisations(preset)), ("gpt2_24", None)]:
                label = f"{model}-{source}-to-{target}" + (f"-n{steps}" if steps else "") + f"-{method}"
                name = f"{preset}-finetune-{label}"
                overrides = (
                    "--name", name,
                    "--pretrain.config", str(pretrained[model, source].relative_to(paths.REPO)),
                    "--steps", "null" if steps is None else str(steps),
                    domain_field, target,
                )
                after = (pre_names[model, source],)
                first, n = loaded[method].trainer.seed, FINETUNE_SEEDS.get(preset, 1)
                population = tuple(range(first, first + n)) if n > 1 else ()
                runs.append(GridRun(name, "diffeqformer.finetune", templates[method], overrides, after, population))
                for k in range(1, n):  # named and seeded as population.members_of and pipeline.seeded do
                    seeded = (*overrides[2:], "--name", f"{name}-seed{k}", "--trainer.seed", str(first + k))
                    runs.append(GridRun(f"{name}-seed{k}", "diffeqformer.finetune", templates[method], seeded, after,
                                        population))
    for target in domains:
        name = f"{preset}-scratch-gpt2_24-{target}"
        overrides = (
            "--name", name,
            "--trainer.num_train_steps", str(loaded["full"].trainer.num_train_steps),
            "--trainer.steps_per_eval", str(loaded["full"].trainer.steps_per_eval),
        )
        runs.append(GridRun(name, "diffeqformer.train", pretrained["gpt2_24", target], overrides))
    return runs


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    cli(cls=FinetuneConfig, run=main, module="diffeqformer.finetune")
