"""Adaptive fine-tuning (PAPER.md section 3, Fig. 5): ``python -m diffeqformer.finetune --config file.yaml [...]``.

A DiffEqFormer pretrained with L Euler steps becomes an N-layer transformer for any N
(``DiffEqFormerLMHeadModel.discretize``); it, or a pretrained GPT/Llama, is fine-tuned on a target domain by Levanter's
trainer, fully or with Levanter's LoRA (adapters on the linear maps ``lora.target_modules`` selects, the rest frozen).
The configuration (``config.FinetuneConfig``) names the finished pretraining twice, ``pretrain.config`` and
``pretrain.run_dir``, which must agree (same config hash); its hash covers that hash, not the paths. The run directory
(``runs``) adds the pretraining's ``config.yaml``, logs the model's validation loss before fine-tuning at step -1, and
its ``complete.json`` adds that loss and the parameter counts. ``finetune_grid`` lists every run of Fig. 5.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import equinox as eqx
import jax
import jax.random as jrandom
import levanter
from levanter.adaptor.lora import lora_trainable_params_filter

from . import paths, runs, train
from .config import (METHODS, DataConfig, FinetuneConfig, adapt, config_hash, load_config, seed_member,
                     validate_finetune, with_finetune_weight_decay)
from .data.corpora import build_token_caches
from .trainer import Trainer
from .model.config import DiffEqFormerConfig
from .model.transformer import count_params
from .train import cli, fit, next_token_loss


def validate(config: FinetuneConfig) -> runs.Pretraining:
    """Reject bad input before anything is written, naming the field, and return the checked pretraining: the
    fields, the finished pretraining, its model kind against ``steps``, its tokenizer, the LoRA rank and targets
    (on a shape-only build of the model)."""
    validate_finetune(config)
    pretraining = runs.pretraining(config)
    pre = pretraining.config
    ode = isinstance(pre.model, DiffEqFormerConfig)
    if ode and config.steps is None:
        raise ValueError(f"steps must be given for a DiffEqFormer pretraining (it was trained with "
                         f"{pre.model.num_layers})")
    if not ode and config.steps is not None:
        raise ValueError(f"steps must be null for a {runs.model_type(pre.model)} pretraining: only a DiffEqFormer can "
                         "be discretised")
    if _tokenizer_of(config.data) != _tokenizer_of(pre.data):
        raise ValueError(f"data: the fine-tuning data's tokenizer ({_tokenizer_of(config.data)}) is not the "
                         f"pretraining's ({_tokenizer_of(pre.data)}); set data.dataset/data.vocab_size as in "
                         f"{config.pretrain.config}")
    if config.method == "lora":
        r, hidden = config.lora.r, pre.model.hidden_dim
        if not (isinstance(r, int) and not isinstance(r, bool)) or not 1 <= r <= hidden:
            raise ValueError(f"lora.r must be an integer from 1 to the hidden size {hidden}, got {r!r}")
        shape = eqx.filter_eval_shape(
            lambda: adapt(pre.model.build(pretraining.Vocab, key=jrandom.PRNGKey(0)), config, key=jrandom.PRNGKey(0))
        )
        if not any(jax.tree_util.tree_leaves(lora_trainable_params_filter(shape))):
            raise ValueError(f"lora.target_modules {config.lora.target_modules!r} matches no linear layer of the model")
    return pretraining


def _tokenizer_of(data: DataConfig) -> str:
    """Which tokenizer ``data.lm_dataset_config`` uses for a corpus."""
    from .data.corpora import ONLINE_TOKENIZER

    if data.dataset in ("wikitext103", "openwebtext"):
        return ONLINE_TOKENIZER
    if data.dataset == "shakespeare":
        return f"shakespeare BPE with {data.vocab_size} tokens"
    return data.dataset  # synthetic: its own word-level vocabulary


def compiled_adapt(model, config: FinetuneConfig, *, key, axis_mapping=None):
    """``adapt`` as one compiled program sharded by ``axis_mapping`` (``train.compiled_once``), faster than op by op.
    It rounds differently from the op-by-op one; a resumed fine-tuning runs the same program, so the same bits."""
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
    digest = config_hash(config, pretrain_config_hash=pretraining.config_hash)
    trainer_config = train.started(config, pretraining.config.model)
    with runs.opened([config], [digest], pretraining_dir=pretraining.run_dir) as run:
        if run.finished:
            return run.summaries[0]
        data = config.data.levanter_config()
        build_token_caches(data)
        optimizer = train.initialize_and_build(trainer_config, with_finetune_weight_decay(config.optimizer))
        with Trainer(trainer_config, optimizer, next_token_loss) as trainer:
            data_key, adapter_key, training_key = jrandom.split(jrandom.PRNGKey(trainer_config.seed), 3)
            Vocab = train.vocab_axis(data, trainer)
            if Vocab != pretraining.Vocab:
                raise ValueError(f"data: {Vocab.size} tokens, but the pretrained model has {pretraining.Vocab.size}")
            model = compiled_adapt(runs.load_model(pretraining.run_dir), config, key=adapter_key,
                                   axis_mapping=trainer.parameter_axis_mapping)
            # on resume Levanter restores the trainable parameters from the checkpoint, the frozen ones from here
            state = trainer.initial_state(training_key, model=model, is_trainable=trainable(config, model))
            counts = {"trainable_params": count_params(state.trainable_model),
                      "total_params": count_params(state.model)}
            levanter.tracker.log_summary(counts)
            model_config = state.model.config
            flops = model_config.flops_per_token(Vocab.size, model_config.max_seq_len)
            state = fit(trainer, state, config, data, data_key=data_key, Pos=model_config.max_Pos,
                        flops_per_token=flops, run_dir=run.dirs[0], evaluate_first=True)
            return run.finish(0, state.model, vocab_size=Vocab.size, method=config.method, euler_steps=config.steps,
                              **counts, pretrained_eval_loss=runs.initial_eval_loss(run.dirs[0]),
                              pretrain_config_hash=pretraining.config_hash)


# --------------------------------------------------------------------------------------------- the Fig. 5 grid

DISCRETISATIONS = (9, 12, 18, 24)
"""Euler steps N of the fine-tuned DiffEqFormers (it is pretrained with 18): the paper's."""
PRESET_DISCRETISATIONS = {"cpu": (9, 18, 24)}
"""Presets that fine-tune fewer N: the cpu preset keeps fewer, the same and more steps, so its book builds sooner."""
DIRECTIONS = (("plays", "prose"), ("prose", "plays"))
"""(pretraining domain, fine-tuning domain) of the offline corpus: the paper's WikiText-103 <-> OpenWebText."""
ONLINE_DIRECTIONS = (("wikitext103", "openwebtext"), ("openwebtext", "wikitext103"))
"""The paper's directions, for presets whose templates train on an online corpus (``data.dataset`` is the domain)."""
PRETRAINED = {"diffeqformer18": "pretrain_diffeqformer18_{domain}.yaml", "gpt2_24": "pretrain_gpt2_24_{domain}.yaml"}
"""The pretrained models of a preset: an 18-step DiffEqFormer and the 24-layer GPT-2 baseline, one per domain."""
TEMPLATES = {method: f"finetune_{method}.yaml" for method in METHODS}
"""The fine-tuning configs of a preset, one per method; the grid overrides name, pretrain, steps and data.domain."""
PRETRAIN_SEEDS = {"cpu": 3, "gpu": 3}
"""Pretraining seeds of each model and domain, per preset (others: 1), one population. Seed k of each setting
fine-tunes pretraining seed k, so that a comparison over seeds compares architectures, not two checkpoints (the
book's verdict rule); a setting's fine-tunings are one population too."""


@dataclass(frozen=True)
class GridRun:
    """One run of an experiment: ``python -m <module> --config <config> <overrides>`` writes ``runs/<name>``."""

    name: str
    module: str
    config: Path
    overrides: tuple[str, ...] = ()
    after: tuple[str, ...] = ()
    """Names of the runs that must be complete first (the pretraining a fine-tuning starts from)."""
    population: tuple[int, ...] = ()
    """The trainer seeds of the population it is a member of (trained by ``diffeqformer.population``); empty: alone."""

    def argv(self) -> list[str]:
        """The arguments after ``python`` that train it alone."""
        return ["-m", self.module, "--config", str(self.config), *self.overrides]


def _pretrainings(path: Path, n: int) -> list[GridRun]:
    """The pretraining of ``path`` with ``n`` seeds (named as ``workflow.presets.seeded`` names them)."""
    members = [seed_member(load_config(path), k) for k in range(n)]
    population = tuple(m.trainer.seed for m in members) if n > 1 else ()
    return [GridRun(m.name, "diffeqformer.train", path,
                    () if k == 0 else ("--name", m.name, "--trainer.seed", str(m.trainer.seed)), (), population)
            for k, m in enumerate(members)]


def discretisations(preset: str) -> tuple[int, ...]:
    """The Euler steps N a preset fine-tunes the 18-step DiffEqFormer with."""
    return PRESET_DISCRETISATIONS.get(preset, DISCRETISATIONS)


def finetune_grid(preset: str = "cpu") -> list[GridRun]:
    """Every run of Fig. 5 at a preset, each pretraining before its fine-tunings: the ``PRETRAINED`` models on each
    domain; per direction and method, the DiffEqFormer at each of ``discretisations(preset)`` and the GPT-2
    fine-tuned on the other domain (``TEMPLATES``); a GPT-2 from scratch on each target domain for as many steps.
    Each of the first two with ``PRETRAIN_SEEDS`` seeds, one population (``<name>``, ``<name>-seed1``, ...), seed k
    fine-tuning pretraining seed k. Needs ``config/<preset>/`` to hold those files (cpu, gpu and paper do)."""
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

    n = PRETRAIN_SEEDS.get(preset, 1)
    pre_runs = {key: _pretrainings(path, n) for key, path in pretrained.items()}
    runs = [r for members in pre_runs.values() for r in members]
    pre_names = {key: [r.name for r in members] for key, members in pre_runs.items()}
    for source, target in directions:
        for method in METHODS:
            for model, steps in [*(("diffeqformer18", n_) for n_ in discretisations(preset)), ("gpt2_24", None)]:
                label = f"{model}-{source}-to-{target}" + (f"-n{steps}" if steps else "") + f"-{method}"
                name = f"{preset}-finetune-{label}"
                pre_file = str(pretrained[model, source].relative_to(paths.REPO))
                overrides = ("--name", name, "--pretrain.config", pre_file, "--steps",
                             "null" if steps is None else str(steps), domain_field, target,
                             *(("--pretrain.population", str(n)) if n > 1 else ()))
                first = loaded[method].trainer.seed
                population = tuple(range(first, first + n)) if n > 1 else ()
                for k in range(n):  # named and seeded as population.members_of names and seeds them
                    own = name if k == 0 else f"{name}-seed{k}"
                    member = overrides if k == 0 else (*overrides[2:], "--name", own, "--trainer.seed", str(first + k),
                                                       "--pretrain.member", str(k))
                    runs.append(GridRun(own, "diffeqformer.finetune", templates[method], member,
                                        (pre_names[model, source][k],), population))
    for target in domains:
        name = f"{preset}-scratch-gpt2_24-{target}"
        overrides = ("--name", name, "--trainer.num_train_steps", str(loaded["full"].trainer.num_train_steps),
                     "--trainer.steps_per_eval", str(loaded["full"].trainer.steps_per_eval))
        runs.append(GridRun(name, "diffeqformer.train", pretrained["gpt2_24", target], overrides))
    return runs


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    cli(cls=FinetuneConfig, run=main, module="diffeqformer.finetune")
