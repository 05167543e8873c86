"""Seed copies of one configuration trained together: one model whose every weight has a leading ``seed`` axis
(``haliax.vmap``), under one Levanter trainer. The cpu preset trains each compared setting several times (verdicts are
judged over seeds, ``workflow.presets.seeded``); one after the other, each copy would pay its own start-up and run a
program too small to keep two cores busy.

Member k follows its solo run up to floating-point rounding (``tests/test_population.py``): it starts from its own
seed's initialisation, reads its solo run's batches (``Interleaved``), has its own Adam state and clipping
(``population_optimizer``; the loss is the members' sum, so no member's update depends on another's) and draws its
dropout masks from its solo run's keys (``PopulationTrainer``). Checkpoints live in the first member's run directory;
each member ends as an ordinary run (its own ``metrics.jsonl``, ``config.yaml``, ``model.eqx``, ``complete.json``)
whose config hash covers the population (``config.config_hash(config, population=seeds)``), so that it is not taken
for its solo run. In a population of fine-tunings (``finetune_main``) only the trained weights have the ``seed`` axis.
"""

from __future__ import annotations

import dataclasses
import math
import re
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import equinox as eqx
import haliax as hax
import jax
import jax.numpy as jnp
import jax.random as jrandom
import optax
from haliax import Axis, NamedArray
from levanter.data.dataset import AsyncDataset
from levanter.tracker import Tracker, TrackerConfig

from . import devices, finetune, paths, runs, train
from .config import (Config, FinetuneConfig, adapt, config_hash, plain_tree, run_dir_of, seed_member, validate,
                     with_finetune_weight_decay, with_paper_weight_decay)
from .data.corpora import build_token_caches
from .trainer import Trainer, batched_maps
from .model.transformer import count_params

SEED = "seed"
"""The name of the population's axis."""
_MEMBER_METRIC = re.compile(r"(train|eval)/member(\d+)/(.+)")


def check_members(configs: Sequence[Config]) -> list[int]:
    """The members' seeds, after checking that the configs differ in name, run directory and ``trainer.seed`` only
    (and in all three), fine-tunings also in the pretraining member they start from (``pretrain.member``)."""
    if len(configs) < 2:
        raise ValueError(f"a population needs at least two members, got {len(configs)}")

    def rest(config):
        tree = plain_tree(dataclasses.replace(config, name="", run_dir=None))
        tree["trainer"].pop("seed")
        if "pretrain" in tree:
            tree["pretrain"].pop("member")
        return tree

    first = rest(configs[0])
    for config in configs[1:]:
        if rest(config) != first:
            raise ValueError(f"population member {config.name!r} differs from {configs[0].name!r} in more than its "
                             f"name and trainer.seed")
    seeds = [c.trainer.seed for c in configs]
    for what, values in (("trainer.seed", seeds), ("name", [c.name for c in configs]),
                         ("run directory", [run_dir_of(c) for c in configs])):
        if len(set(values)) != len(values):
            raise ValueError(f"population members must differ in {what}, got {values}")
    if configs[0].wandb:
        raise ValueError("a population logs to its members' metrics.jsonl only: set wandb false")
    if not isinstance(configs[0].trainer.train_batch_size, int):
        raise ValueError("a population needs a fixed trainer.train_batch_size (not a schedule)")
    if configs[0].trainer.per_device_parallelism >= 0:  # Levanter's microbatches are contiguous slices of the batch
        raise ValueError("a population's loss splits its batch by member, which microbatches would cut across: leave "
                         "trainer.per_device_parallelism at -1")
    return seeds


# ----------------------------------------------------------------------------------------------- the pieces


class Interleaved(AsyncDataset):
    """The members' data streams as one: each batch of ``n * batch`` examples is member 0's batch of the step, then
    member 1's, ... (global index i is member ``(i // batch) % n``'s ``(i // (n * batch)) * batch + i % batch``)."""

    def __init__(self, members: Sequence[AsyncDataset], batch: int):
        super().__init__()
        self.members = list(members)
        self.batch = batch

    def _where(self, i: int) -> tuple[int, int]:
        n, b = len(self.members), self.batch
        return (i // b) % n, (i // (n * b)) * b + i % b

    async def async_len(self) -> int:
        return len(self.members) * min([await m.async_len() for m in self.members])

    async def final_length_is_known(self) -> bool:
        return all([await m.final_length_is_known() for m in self.members])

    def is_finite(self) -> bool:
        return all(m.is_finite() for m in self.members)

    async def current_len(self) -> Optional[int]:
        lengths = [await m.current_len() for m in self.members]
        return None if any(x is None for x in lengths) else len(self.members) * min(lengths)

    async def get_batch(self, indices: Sequence[int]):
        wanted: dict[int, list[tuple[int, int]]] = defaultdict(list)  # member -> (position, own index)
        for position, i in enumerate(indices):
            member, own = self._where(int(i))
            wanted[member].append((position, own))
        out: list[Any] = [None] * len(indices)
        for member, pairs in wanted.items():
            examples = await self.members[member].get_batch([own for _, own in pairs])
            for (position, _), example in zip(pairs, examples):
                out[position] = example
        return out


class PopulationOptState(eqx.Module):
    """The members' optimiser states, each leaf with the population's axis (without ``hyperparams``, which Levanter
    would log as a single optimiser's scalars)."""

    members: Any


def population_optimizer(inner: optax.GradientTransformation, Seed: Axis) -> optax.GradientTransformationExtraArgs:
    """``inner`` vmapped over the members: each its own moments, step count and gradient clipping."""

    def init(params):
        return PopulationOptState(hax.vmap(inner.init, Seed)(params))

    def update(updates, state, params=None, **extra):
        new, members = hax.vmap(lambda g, s, p: inner.update(g, s, p), Seed)(updates, state.members, params)
        return new, PopulationOptState(members)

    return optax.GradientTransformationExtraArgs(init, update)


def population_loss(Seed: Axis):
    """The trainer's loss: the sum of the members' next-token losses, each on its part of the batch, with member
    k's dropout key ``member_keys[k]`` (``[seed, key]``, from ``PopulationTrainer``; none: no dropout, as Levanter
    evaluates); each member's loss is the metric ``member<k>/loss``."""

    def loss(model, example, *, key=None, member_keys=None):
        if key is not None and member_keys is None:
            raise ValueError("a population member draws dropout from its own key: train it with PopulationTrainer, "
                             "which passes member_keys")
        Member = Axis("batch", example.tokens.resolve_axis("batch").size // Seed.size)

        def split(x):
            if isinstance(x, NamedArray) and "batch" in x.axis_names:
                return hax.unflatten_axis(x, "batch", (Seed, Member))
            return x

        example = jax.tree.map(split, example, is_leaf=lambda x: isinstance(x, NamedArray))
        mapping = hax.partitioning.current_thread_local_mapping() or {}
        with hax.axis_mapping({**mapping, **member_batch_mapping(mapping)}):
            losses = hax.vmap(lambda m, e, k: m.compute_next_token_loss(e, key=k), Seed)(model, example, member_keys)
        return losses.sum(), {f"member{k}/loss": losses.array[k] for k in range(Seed.size)}

    return loss


def member_batch_mapping(mapping) -> dict:
    """Where a member's batch goes inside the loss: the trainer's batch axes less those of the population's axis
    (``lay_over_devices``), which ``haliax.vmap`` already takes (two logical axes on one mesh axis are refused)."""
    mapping = mapping or {}
    members = set(devices.mesh_axes(mapping.get(SEED)))
    rest = tuple(a for a in devices.mesh_axes(mapping.get("batch")) if a not in members)
    return {"batch": rest[0] if len(rest) == 1 else rest or None}


def lay_over_devices(trainer_config, n: int, batch: int):
    """``trainer_config`` with the ``n`` members laid over the mesh's ``replica`` axis, so that no collective joins
    two members. Unless ``trainer.mesh.axes.replica`` sets it, that axis is the largest number dividing both ``n`` and
    the devices of the ``data`` axis (4 members on 4 devices: one each; 2: two each, sharded as a solo run is). Each
    member's ``batch`` must divide by the batch's other mesh axes (``ValueError`` otherwise). After ``devices.start``.
    """
    mesh = trainer_config.mesh
    replica = mesh.axes.get("replica", 1)
    if replica == 1:
        replica = math.gcd(n, devices.mesh_sizes(trainer_config).get("data", 1))
    elif n % replica:
        raise ValueError(f"trainer.mesh.axes.replica ({replica}) must divide the population's {n} members (--seeds)")
    axes = {**mesh.axes, "replica": replica}
    if mesh.axes.get("replica", 1) == 1 and axes.get("data", -1) != -1:
        axes["data"] //= replica  # the replica axis takes its devices from the data axis (by default, -1, the rest)
    laid = dataclasses.replace(trainer_config, mesh=dataclasses.replace(
        mesh, axes=axes, param_mapping={**mesh.param_mapping, SEED: "replica"},
        compute_mapping={**mesh.compute_mapping, SEED: "replica"}))
    sizes = devices.mesh_sizes(laid)
    rest = devices.mesh_axes(member_batch_mapping(laid.compute_axis_mapping)["batch"])
    within = math.prod(sizes.get(a, 1) for a in rest)
    if batch % within:
        split = " x ".join(a for a in rest if sizes.get(a, 1) > 1)
        raise ValueError(f"trainer.train_batch_size ({batch}, each member's) must be divisible by the mesh's {split} "
                         f"axes ({within} devices), which split each member's batch: change it or trainer.mesh")
    return laid


class PopulationTrainer(Trainer):
    """``trainer.Trainer`` whose state's ``training_key`` is the members' training keys (``[seed, key]``, each its
    solo run's), each split per step as Levanter's step splits a solo run's: the first half is the member's dropout
    key (``population_loss``'s ``member_keys``), the second its next training key. Levanter's step cannot split a
    stack of keys, so it gets a placeholder key, whose halves go unused."""

    def _train_step(self, state, batch, batch_kwargs, _no_hooks=False):
        halves = jax.vmap(jrandom.split)(state.training_key)  # [seed, 2, key]: each member's split, as a solo step's
        result = super()._train_step(eqx.tree_at(lambda s: s.training_key, state, state.training_key[0]), batch,
                                     {**batch_kwargs, "member_keys": halves[:, 0]}, _no_hooks=_no_hooks)
        new_state = eqx.tree_at(lambda s: s.training_key, result.new_state, halves[:, 1])
        return dataclasses.replace(result, new_state=new_state)


def member(tree, k: int):
    """Member ``k`` of a population's pytree (a model, a state): every leaf with the population's axis, indexed."""

    def take(x):
        return x[SEED, k] if isinstance(x, NamedArray) and SEED in x.axis_names else x

    return jax.tree.map(take, tree, is_leaf=lambda x: isinstance(x, NamedArray))


class PopulationTracker(train.MetricsOnlyTracker):
    """Each member's metrics to its own ``metrics.jsonl``: ``train/member<k>/...`` and ``eval/member<k>/...`` to
    member k without ``member<k>/``, the members' summed ``train/loss`` to nobody, any other metric to every member."""

    name = "population"

    def __init__(self, paths: Sequence[Path]):
        self.members = [train.JsonlTracker(p) for p in paths]

    def log(self, metrics: Mapping[str, Any], *, step: Optional[int], commit: Optional[bool] = None):
        own: list[dict[str, Any]] = [{} for _ in self.members]
        shared: dict[str, Any] = {}
        for key, value in metrics.items():
            match = _MEMBER_METRIC.fullmatch(key)
            if match:
                own[int(match[2])][f"{match[1]}/{match[3]}"] = value
            elif key != "train/loss":
                shared[key] = value
        for tracker, values in zip(self.members, own):
            if values or shared:
                tracker.log({**shared, **values}, step=step, commit=commit)


@TrackerConfig.register_subclass("population")
@dataclass(frozen=True)
class PopulationTrackerConfig(TrackerConfig):
    """Config of ``PopulationTracker``."""

    paths: tuple[str, ...] = ()

    def init(self, run_id: Optional[str]) -> Tracker:
        from levanter.tracker import NoopTracker

        # process 0 alone writes the files, as Levanter's own file trackers do: one line per step
        return PopulationTracker([Path(p) for p in self.paths]) if devices.is_primary() else NoopTracker()


def member_evaluations(trainer, data, Pos: Axis, base: Config, n: int):
    """A trainer hook that evaluates each member as its solo run is evaluated (``train.evaluation``), logged as
    ``eval/member<k>/...``."""
    from levanter.callbacks import StepInfo

    eval_sets = data.tagged_eval_sets(Pos)
    hooks = [train.evaluation(trainer, eval_sets, data.the_tokenizer, base, prefix=f"eval/member{k}")
             for k in range(n)]

    def evaluate(info: StepInfo):
        for k, hook in enumerate(hooks):
            state = eqx.tree_at(lambda s: s.model, info.state, member(info.state.model, k))
            hook(StepInfo(state, info.loss, info.step_duration))

    return evaluate


# ------------------------------------------------------------------------------------------------- training


def _trainer_config(configs: Sequence[Config], model):
    """Levanter's trainer config of a population (its first member's, with the members' batches side by side,
    checkpoints in the first member's run directory and each member's metrics in its own), started, laid over the
    devices and checked against ``model`` as ``train.started`` checks a solo run's."""
    base, dirs = configs[0], [run_dir_of(c) for c in configs]
    n, batch = len(configs), base.trainer.train_batch_size
    trainer_config = devices.start(dataclasses.replace(
        train.trainer_config_of(base, dirs[0]), id=f"{base.name}-population", train_batch_size=n * batch,
        tracker=(PopulationTrackerConfig(tuple(str(runs.metrics_file(d)) for d in dirs)),)))
    trainer_config = lay_over_devices(trainer_config, n, batch)
    devices.check(trainer_config, model)
    return trainer_config


def _train(configs, digests, model, optimizer, initial_state, summary=lambda run, k, state: {}, **opened):
    """Train a population (or resume it, or skip it when every member is complete); return each member's
    ``complete.json``. ``model`` is the model config the mesh is checked against, ``initial_state(trainer, Seed,
    Vocab, model_keys, training_keys)`` the trainer's first state, ``summary(run, k, state)`` what member k's adds;
    ``opened`` goes to ``runs.opened``."""
    trainer_config = _trainer_config(configs, model)  # before the lock: runs.lock
    with runs.opened(configs, digests, **opened) as run:
        if run.finished:
            return run.summaries
        base, n, seeds = configs[0], len(configs), [c.trainer.seed for c in configs]
        Seed = Axis(SEED, n)
        data = base.data.levanter_config()
        build_token_caches(data)
        inner = train.initialize_and_build(trainer_config, optimizer)
        with PopulationTrainer(trainer_config, population_optimizer(inner, Seed), population_loss(Seed)) as trainer:
            keys = [jrandom.split(jrandom.PRNGKey(seed), 3) for seed in seeds]  # data, model/adapter, training
            model_keys, training_keys = (jnp.stack([k[i] for k in keys]) for i in (1, 2))
            Vocab = train.vocab_axis(data, trainer)
            state = initial_state(trainer, Seed, Vocab, model_keys, training_keys)
            model_config = state.model.config
            Pos, batch = model_config.max_Pos, base.trainer.train_batch_size
            member_schedule = dataclasses.replace(trainer_config, train_batch_size=batch).batch_schedule
            train_set = Interleaved([batched_maps(data.train_set(Pos, member_schedule, key=k[0])) for k in keys], batch)
            state = train.fit(trainer, state, base, data, data_key=None, Pos=Pos,
                              flops_per_token=model_config.flops_per_token(Vocab.size, model_config.max_seq_len),
                              run_dir=run.dirs[0], evaluate_first=isinstance(base, FinetuneConfig),
                              train_set=train_set, eval_hook=member_evaluations(trainer, data, Pos, base, n))

            def throughput(k):  # a member's share of the population's tokens/s
                tokens_per_second = runs.median_throughput(runs.read_metrics(run.dirs[k]))
                return tokens_per_second / n if tokens_per_second is not None else None

            checkpoints = paths.home_relative(run.checkpoints)
            return [run.finish(k, member(state.model, k), vocab_size=Vocab.size, tokens_per_second=throughput(k),
                               **summary(run, k, state), population={"seeds": seeds, "member": k,
                                                                     "checkpoints": checkpoints})
                    for k in range(n)]


def main(configs: Sequence[Config]) -> list[dict]:
    """Train a population of training runs (``TrainConfig``) or of fine-tunings (``finetune_main``) and return each
    member's ``complete.json``."""
    if configs and all(isinstance(c, FinetuneConfig) for c in configs):
        return finetune_main(configs)
    for config in configs:
        validate(config)
    seeds, base = check_members(configs), configs[0]

    def fresh(trainer, Seed, Vocab, model_keys, training_keys):
        return train.initial_state(trainer, training_keys,
                                   lambda: hax.vmap(lambda k: base.model.build(Vocab, key=k), Seed)(model_keys))

    return _train(configs, [config_hash(c, population=seeds) for c in configs], base.model,
                  with_paper_weight_decay(base.optimizer, base.model), fresh)


def finetune_main(configs: Sequence[FinetuneConfig]) -> list[dict]:
    """Fine-tune a population: member k is its solo fine-tuning (``finetune.main``) of its seed, its pretrained model
    adapted with its own adapter key, trained where ``finetune.trainable`` says on its own batches and dropout keys;
    its ``complete.json`` is a solo fine-tuning's plus ``population``. Resumed, Levanter restores the trained part
    from the checkpoint and the frozen part comes from the same adaptation again."""
    seeds = check_members(configs)
    pretrainings = [finetune.validate(c) for c in configs]
    base = configs[0]

    def adapted(trainer, Seed, Vocab, adapter_keys, training_keys):
        if any(Vocab != p.Vocab for p in pretrainings):
            raise ValueError(f"data: {Vocab.size} tokens, but a pretrained model has another vocabulary "
                             f"({sorted({p.Vocab.size for p in pretrainings})})")
        model = _adapted(base, [p.run_dir for p in pretrainings], Seed, adapter_keys, trainer.parameter_axis_mapping)
        return trainer.initial_state(training_keys, model=model, is_trainable=finetune.trainable(base, model))

    def summary(run, k, state):
        return dict(method=configs[k].method, euler_steps=configs[k].steps,
                    trainable_params=count_params(member(state.trainable_model, 0)),
                    total_params=count_params(member(state.model, 0)),
                    pretrained_eval_loss=runs.initial_eval_loss(run.dirs[k]),
                    pretrain_config_hash=pretrainings[k].config_hash)

    digests = [config_hash(c, population=seeds, pretrain_config_hash=p.config_hash)
               for c, p in zip(configs, pretrainings)]
    return _train(configs, digests, pretrainings[0].config.model, with_finetune_weight_decay(base.optimizer),
                  adapted, summary, pretraining_dir=[p.run_dir for p in pretrainings])


def _adapted(base: FinetuneConfig, pretrained: Sequence[Path], Seed: Axis, adapter_keys, axis_mapping):
    """The population's model, compiled as one program: member k's pretraining (run directory ``pretrained[k]``)
    adapted with member k's adapter key; every weight with the population's axis, unless all members start from the
    same pretraining: then the frozen weights, the same in every member, are kept once."""

    def adapt_each(model, adapter_keys):
        if len(set(pretrained)) > 1:
            return hax.vmap(lambda m, key: adapt(m, base, key=key), Seed)(model, adapter_keys)
        adapted = hax.vmap(lambda key: adapt(model, base, key=key), Seed)(adapter_keys)
        # adapt draws only the adapters; the loss's vmap broadcasts the frozen weights kept once (one matrix product
        # over the members' batches instead of one per member)
        spec, named = finetune.trainable(base, adapted), lambda x: isinstance(x, NamedArray)
        return eqx.combine(eqx.filter(adapted, spec, is_leaf=named),
                           eqx.filter(member(adapted, 0), spec, inverse=True, is_leaf=named), is_leaf=named)

    model = (runs.load_model(pretrained[0]) if len(set(pretrained)) == 1
             else stacked([runs.load_model(run_dir) for run_dir in pretrained], Seed))
    return train.compiled_once(adapt_each, axis_mapping)(model, adapter_keys)


def stacked(models: Sequence[Any], Seed: Axis):
    """Models of one structure as one, every named array with the leading axis ``Seed`` (``member`` takes model k
    back out); a leaf that is no named array must be the same in every model."""

    def stack(*leaves):
        if isinstance(leaves[0], NamedArray):
            return hax.stack(Seed, leaves)
        if any(not bool(jnp.array_equal(leaf, leaves[0])) for leaf in leaves[1:]):
            raise ValueError("the models differ in an array without named axes, which a population cannot stack")
        return leaves[0]

    return jax.tree_util.tree_map(stack, *models, is_leaf=lambda x: isinstance(x, NamedArray))


def members_of(config: Config, n: int) -> list[Config]:
    """``config`` and ``n - 1`` copies with the next ``trainer.seed`` values, named ``<name>-seed<k>`` (and
    ``<run_dir>-seed<k>``: ``config.seed_member``). A fine-tuning of a pretraining population
    (``pretrain.population`` > 1) starts member k from the pretraining's member ``pretrain.member`` + k."""
    if not isinstance(n, int) or n < 2:
        raise ValueError(f"--seeds must be an integer of at least 2, got {n!r}")
    out = [seed_member(config, k) for k in range(n)]
    if isinstance(config, FinetuneConfig) and config.pretrain.population > 1:
        out = [dataclasses.replace(m, pretrain=dataclasses.replace(m.pretrain, member=config.pretrain.member + k))
               for k, m in enumerate(out)]
    return out


def cli(argv: list[str] | None = None) -> None:
    """``python -m diffeqformer.population --config file.yaml --seeds 3 [overrides]``: the config and its next seeds
    as one population (``members_of``), of fine-tunings if the file is a fine-tuning's (``config_class``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    i = argv.index("--seeds") if "--seeds" in argv else len(argv)
    if i + 1 >= len(argv):
        raise SystemExit("usage: python -m diffeqformer.population --config config/<preset>/<name>.yaml --seeds N "
                         "[overrides]")
    try:
        n = int(argv[i + 1])
    except ValueError:
        raise SystemExit(f"error: --seeds must be an integer, got {argv[i + 1]!r}") from None
    del argv[i : i + 2]
    train.cli(argv, cls=None, run=lambda config: main(members_of(config, n)), module="diffeqformer.population")


if __name__ == "__main__":
    import os

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    cli()
