"""Seed copies of one configuration trained together: one vmapped population under one Levanter trainer.

Every comparison of F5, F6 and F8-F10 is judged over seeds (``statistics.RULE``), so the cpu preset trains each compared
setting several times, the copies differing only in ``trainer.seed`` (``workflow.presets.seeded``). Trained one after the
other, each copy pays its own start-up and runs a program too small to keep two cores busy. Here the copies train as
one model whose every weight has a leading ``seed`` axis (``haliax.vmap``):

- member k starts from the initialisation of its own seed and reads the batches its own run would read (the
  trainer's batch is the members' batches side by side, ``Interleaved``), so without dropout a member follows its
  solo run up to floating-point rounding (``tests/test_population.py``);
- each member has its own Adam state and its own gradient clipping (``population_optimizer`` vmaps the optimiser), and
  the loss is the sum of the members' losses, whose gradient with respect to a member's weights is its own loss's:
  no member's update depends on another's;
- member k draws its dropout masks from the keys its solo run would draw them from: the trainer's state holds the
  members' training keys side by side, and each step splits member k's as Levanter's step splits a solo run's
  (``PopulationTrainer``), so with dropout too a member follows its solo run up to floating-point rounding;
- checkpoints (Levanter's, of the whole population) live in the first member's run directory; each member's metrics
  go to its own ``metrics.jsonl`` (``PopulationTracker``), and each member ends as an ordinary run: its own
  ``config.yaml``, ``model.eqx`` and ``complete.json``, read by ``runs.load_model`` like any other.

A member's config hash covers the population (``config.config_hash(config, population=seeds)``): a run trained in a
population is not taken for the solo run of the same config, nor the reverse.

A population of fine-tunings (``config.FinetuneConfig`` members, ``finetune_main``) starts every member from the
same checked pretraining: member k gets its solo fine-tuning's adapter, data and training keys, so its LoRA
initialisation, batches and dropout masks; only the weights it trains have the ``seed`` axis (the frozen ones are the
same in every member and kept once). It ends as an ordinary fine-tuning run (``runs.load_model`` reads it); its
config hash is ``config.config_hash(config, population=seeds, pretrain_config_hash=...)``.
"""

from __future__ import annotations

import dataclasses
import re
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
from .config import (
    Config,
    FinetuneConfig,
    TrainConfig,
    adapt,
    config_class,
    config_hash,
    plain_tree,
    run_dir_of,
    validate,
    seed_member,
    with_finetune_weight_decay,
    with_paper_weight_decay,
)
from .data.corpora import build_token_caches
from .dispatch import Trainer, batched_maps
from .model.transformer import count_params

SEED = "seed"
"""The name of the population's axis."""
_MEMBER_METRIC = re.compile(r"(train|eval)/member(\d+)/(.+)")



def check_members(configs: Sequence[Config]) -> list[int]:
    """The members' seeds, after checking that the configs differ in name, run directory and ``trainer.seed`` only
    (and in all three), and fine-tunings also in the seed of their pretraining's population they start from
    (``pretrain.member``)."""
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
    names = [c.name for c in configs]
    dirs = [run_dir_of(c) for c in configs]
    for what, values in (("trainer.seed", seeds), ("name", names), ("run directory", dirs)):
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
    """The members' data streams as one: the population's batch of ``n * batch`` examples is member 0's batch of
    the step, then member 1's, ... (global index i belongs to member ``(i // batch) % n``, at its own index
    ``(i // (n * batch)) * batch + i % batch``)."""

    def __init__(self, members: Sequence[AsyncDataset], batch: int):
        super().__init__()
        self.members = list(members)
        self.batch = batch

    def _where(self, i: int) -> tuple[int, int]:
        n, b = len(self.members), self.batch
        return (i // b) % n, (i // (n * b)) * b + i % b

    async def async_len(self) -> int:
        lengths = [await m.async_len() for m in self.members]
        return len(self.members) * min(lengths)

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
    """The members' optimiser states, each leaf with the population's leading axis. (A wrapper without
    ``hyperparams``: Levanter logs those of a single optimiser as scalars.)"""

    members: Any


def population_optimizer(inner: optax.GradientTransformation, Seed: Axis) -> optax.GradientTransformationExtraArgs:
    """``inner`` applied to each member on its own (``haliax.vmap`` over the population's axis): its own moments,
    step count and gradient clipping."""

    def init(params):
        return PopulationOptState(hax.vmap(inner.init, Seed)(params))

    def update(updates, state, params=None, **extra):
        new, members = hax.vmap(lambda g, s, p: inner.update(g, s, p), Seed)(updates, state.members, params)
        return new, PopulationOptState(members)

    return optax.GradientTransformationExtraArgs(init, update)


def population_loss(Seed: Axis):
    """The trainer's loss: the sum over the members of each one's next-token loss on its part of the batch, and each
    member's loss as the metric ``member<k>/loss`` (logged ``train/member<k>/loss``).

    Member k's dropout key is ``member_keys[k]`` (``[seed, key]``, passed by ``PopulationTrainer``); Levanter's one
    key of the step, ``key``, is not used. Without ``member_keys`` the members run without dropout keys, as Levanter
    evaluates (``key=None``)."""

    def loss(model, example, *, key=None, member_keys=None):
        if key is not None and member_keys is None:
            raise ValueError("a population member draws dropout from its own key: train it with PopulationTrainer, "
                             "which passes member_keys")
        Batch = example.tokens.resolve_axis("batch")
        Member = Axis("batch", Batch.size // Seed.size)

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


def _mesh_axes(physical) -> tuple[str, ...]:
    """The mesh axes of a value of a resolved axis mapping (one name, several, or None)."""
    return () if physical is None else (physical,) if isinstance(physical, str) else tuple(physical)


def member_batch_mapping(mapping) -> dict:
    """Where a member's batch goes inside the population's loss: the mesh axes of the trainer's batch less those the
    population's axis is laid over (``lay_over_devices``), which ``haliax.vmap`` over the members already takes. Two
    logical axes on one mesh axis would be refused."""
    mapping = mapping or {}
    members = set(_mesh_axes(mapping.get(SEED)))
    rest = tuple(a for a in _mesh_axes(mapping.get("batch")) if a not in members)
    return {"batch": rest[0] if len(rest) == 1 else rest or None}


def lay_over_devices(trainer_config, n: int, batch: int):
    """``trainer_config`` (the population's, Levanter's ``TrainerConfig``) with the population's axis laid over the
    devices: the mesh's ``replica`` axis (Levanter's axis of data-parallel replicas) splits the members, so that
    member k's parameters, optimiser state and batch live on devices of their own, and no collective joins two
    members. Unless ``trainer.mesh.axes.replica`` sets it, the replica axis is the largest number that divides both
    the ``n`` members and the devices of the ``data`` axis: 4 members on 4 devices, one device each; 2 members, two
    devices each, over which each member is sharded as a solo run is. Within a member the batch and the parameters are
    split as in a solo run, so a member's per-step ``batch`` must divide by the batch's other mesh axes; ``ValueError``
    naming the field otherwise. Needs the device count: after ``devices.start``."""
    import math

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
    rest = member_batch_mapping(laid.compute_axis_mapping)["batch"]
    within = math.prod(sizes.get(a, 1) for a in _mesh_axes(rest))
    if batch % within:
        split = " x ".join(a for a in _mesh_axes(rest) if sizes.get(a, 1) > 1)
        raise ValueError(f"trainer.train_batch_size ({batch}, each member's) must be divisible by the mesh's {split} "
                         f"axes ({within} devices), which split each member's batch: change it or trainer.mesh")
    return laid


class PopulationTrainer(Trainer):
    """``dispatch.Trainer`` for a population: its state's ``training_key`` is the members' training keys side by side
    (``[seed, key]``, member k's the one ``train.main`` gives the solo run of its seed), and its step splits each
    member's key as Levanter's step splits a solo run's (``key, new_key = split(training_key)``): the first half is
    member k's dropout key of the step (``population_loss``'s ``member_keys``), the second its next training key. So
    member k's dropout masks are its solo run's, step for step.

    Levanter's step splits one key of shape ``[key]``; a stack of keys cannot pass through it (``jax.random.split``
    refuses a batch of keys). So this step hands Levanter's a placeholder key, whose halves go unused, and puts the
    members' next keys in the new state itself."""

    def _train_step(self, state, batch, batch_kwargs, _no_hooks=False):
        halves = jax.vmap(jrandom.split)(state.training_key)  # [seed, 2, key]: each member's split, as a solo step's
        result = super()._train_step(eqx.tree_at(lambda s: s.training_key, state, state.training_key[0]), batch,
                                     {**batch_kwargs, "member_keys": halves[:, 0]}, _no_hooks=_no_hooks)
        new_state = eqx.tree_at(lambda s: s.training_key, result.new_state, halves[:, 1])
        return dataclasses.replace(result, new_state=new_state)


def member(tree, k: int):
    """Member ``k`` of a population's pytree (a model, a state): every leaf with the population's axis, indexed."""

    def take(x):
        if isinstance(x, NamedArray):
            return x[SEED, k] if SEED in x.axis_names else x
        return x

    return jax.tree.map(take, tree, is_leaf=lambda x: isinstance(x, NamedArray))


class PopulationTracker(train.MetricsOnlyTracker):
    """Writes each member's metrics to its own ``metrics.jsonl``: ``train/member<k>/...`` and ``eval/member<k>/...``
    go to member k without the ``member<k>`` part, the trainer's ``train/loss`` (the members' sum) to nobody, and
    every other metric (throughput, progress) to every member."""

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
    """A trainer hook that evaluates each member with Levanter's own evaluator (``cb_tagged_lm_evaluate``, the
    solo runs' ``eval/loss``: the validation sets of ``data`` (Levanter's data config) at ``Pos``, the examples
    ``train.evaluated_examples`` of the first member's config ``base``), logged as ``eval/member<k>/...``."""
    import levanter.eval
    from levanter.callbacks import StepInfo

    config, eval_sets, tokenizer = trainer.config, data.tagged_eval_sets(Pos), data.the_tokenizer
    hooks = [levanter.eval.cb_tagged_lm_evaluate(config.EvalBatch, eval_sets, tokenizer, trainer.device_mesh,
                                                 trainer.compute_axis_mapping, train.evaluated_examples(base.trainer),
                                                 prefix=f"eval/member{k}", mp=config.mp)
             for k in range(n)]

    def evaluate(info: StepInfo):
        for k, hook in enumerate(hooks):
            state = eqx.tree_at(lambda s: s.model, info.state, member(info.state.model, k))
            hook(StepInfo(state, info.loss, info.step_duration))

    return evaluate


# ------------------------------------------------------------------------------------------------- training


def _trainer_config(configs: Sequence[Config], model):
    """Levanter's trainer config of a population of ``configs`` (its first member's, the base): the members' batches
    side by side, checkpoints in the first member's run directory, each member's metrics to its own
    ``metrics.jsonl``; once its processes have started (``devices.start``), the members laid over the devices
    (``lay_over_devices``) and the mesh checked against ``model`` (``devices.check``), as ``train.started``."""
    base, dirs = configs[0], [run_dir_of(c) for c in configs]
    n, batch = len(configs), base.trainer.train_batch_size
    trainer_config = devices.start(dataclasses.replace(
        train.trainer_config_of(base, dirs[0]), id=f"{base.name}-population", train_batch_size=n * batch,
        tracker=(PopulationTrackerConfig(tuple(str(runs.metrics_file(d)) for d in dirs)),)))
    trainer_config = lay_over_devices(trainer_config, n, batch)
    devices.check(trainer_config, model)
    return trainer_config


def _train_set(data, trainer_config, Pos: Axis, data_keys, batch: int) -> Interleaved:
    """The members' training batches side by side, member k's those its solo run reads with ``data_keys[k]``."""
    member_schedule = dataclasses.replace(trainer_config, train_batch_size=batch).batch_schedule
    return Interleaved([batched_maps(data.train_set(Pos, member_schedule, key=k)) for k in data_keys], batch)


def _member_throughput(run_dir: Path, n: int) -> Optional[float]:
    """A member's share of the population's training tokens/s (``runs.median_throughput``)."""
    throughput = runs.median_throughput(runs.read_metrics(run_dir))
    return throughput / n if throughput is not None else None


def main(configs: Sequence[Config]) -> list[dict]:
    """Train the members of a population (or resume it, or skip it when every member is complete) and return each
    member's ``complete.json``. Members are training runs (``TrainConfig``) or fine-tunings
    (``FinetuneConfig``, ``finetune_main``)."""
    from haliax.partitioning import round_axis_for_partitioning

    if configs and all(isinstance(c, FinetuneConfig) for c in configs):
        return finetune_main(configs)
    for config in configs:
        validate(config)
    seeds = check_members(configs)
    trainer_config = _trainer_config(configs, configs[0].model)  # before the lock: runs.lock
    with runs.opened(configs, [config_hash(c, population=seeds) for c in configs]) as run:
        if run.finished:
            return run.summaries
        base, n = configs[0], len(configs)
        Seed = Axis(SEED, n)
        batch = base.trainer.train_batch_size
        data = base.data.levanter_config()
        build_token_caches(data)
        inner = train.initialize_and_build(trainer_config, with_paper_weight_decay(base.optimizer, base.model))
        with PopulationTrainer(trainer_config, population_optimizer(inner, Seed), population_loss(Seed)) as trainer:
            keys = [jrandom.split(jrandom.PRNGKey(seed), 3) for seed in seeds]  # data, model, training: as train.main
            model_keys, training_keys = (jnp.stack([k[i] for k in keys]) for i in (1, 2))
            Vocab = round_axis_for_partitioning(Axis("vocab", len(data.the_tokenizer)), trainer.parameter_axis_mapping)
            state = train.initial_state(
                trainer, training_keys, lambda: hax.vmap(lambda k: base.model.build(Vocab, key=k), Seed)(model_keys))
            Pos = base.model.max_Pos
            train_set = _train_set(data, trainer_config, Pos, [k[0] for k in keys], batch)
            flops = base.model.flops_per_token(Vocab.size, base.model.max_seq_len)
            state = train.fit(trainer, state, base, data, data_key=None, Pos=Pos, flops_per_token=flops,
                              run_dir=run.dirs[0], train_set=train_set,
                              eval_hook=member_evaluations(trainer, data, Pos, base, n))
            return [run.finish(k, member(state.model, k), vocab_size=Vocab.size,
                               tokens_per_second=_member_throughput(run.dirs[k], n),
                               population=_membership(run, seeds, k)) for k in range(n)]


def _membership(run: runs.Opened, seeds: list[int], k: int) -> dict:
    """What a member's ``complete.json`` records of its population: the seeds, its place, where the checkpoints are."""
    return {"seeds": seeds, "member": k, "checkpoints": paths.home_relative(run.checkpoints)}


def finetune_main(configs: Sequence[FinetuneConfig]) -> list[dict]:
    """Fine-tune the members of a population from their pretrainings (or resume, or skip it when every member is
    complete) and return each member's ``complete.json``, whose fields are those of a solo fine-tuning's
    (``finetune.main``) plus ``population``.

    Member k is its solo fine-tuning of its seed: its pretrained model adapted (discretised, LoRA adapters drawn
    from the member's adapter key: ``config.adapt`` vmapped over the keys), trained where ``finetune.trainable``
    says (the trainable weights have the population's axis), on its own batches and dropout keys, with its own Adam
    state; its pretrained model's validation loss is logged at step -1. Where every member starts from the same
    pretraining, the frozen weights are the same in every member and kept once, shared; where member k starts from
    its own pretraining seed (``pretrain.member``), every weight has the population's axis. Resumed, Levanter
    restores the trainable part of the population's checkpoint and takes the frozen part from the same adaptation
    run again."""
    from haliax.partitioning import round_axis_for_partitioning

    seeds = check_members(configs)
    pretrainings = [finetune.validate(c) for c in configs]
    digests = [config_hash(c, population=seeds, pretrain_config_hash=p.config_hash)
               for c, p in zip(configs, pretrainings)]
    trainer_config = _trainer_config(configs, pretrainings[0].config.model)  # before the lock: runs.lock
    with runs.opened(configs, digests, pretraining_dir=[p.run_dir for p in pretrainings]) as run:
        if run.finished:
            return run.summaries
        base, n = configs[0], len(configs)
        Seed = Axis(SEED, n)
        data = base.data.levanter_config()
        build_token_caches(data)
        inner = train.initialize_and_build(trainer_config, with_finetune_weight_decay(base.optimizer))
        with PopulationTrainer(trainer_config, population_optimizer(inner, Seed), population_loss(Seed)) as trainer:
            keys = [jrandom.split(jrandom.PRNGKey(seed), 3) for seed in seeds]  # data, adapter, training: finetune.main
            adapter_keys, training_keys = (jnp.stack([k[i] for k in keys]) for i in (1, 2))
            Vocab = round_axis_for_partitioning(Axis("vocab", len(data.the_tokenizer)), trainer.parameter_axis_mapping)
            if any(Vocab != p.Vocab for p in pretrainings):
                raise ValueError(f"data: {Vocab.size} tokens, but a pretrained model has another vocabulary "
                                 f"({sorted({p.Vocab.size for p in pretrainings})})")

            model = _adapted(base, [p.run_dir for p in pretrainings], Seed, adapter_keys,
                             trainer.parameter_axis_mapping)
            state = trainer.initial_state(training_keys, model=model, is_trainable=finetune.trainable(base, model))
            counts = {"trainable_params": count_params(member(state.trainable_model, 0)),
                      "total_params": count_params(member(state.model, 0))}
            model_config = state.model.config
            Pos = model_config.max_Pos
            flops = model_config.flops_per_token(Vocab.size, model_config.max_seq_len)
            state = train.fit(trainer, state, base, data, data_key=None, Pos=Pos, flops_per_token=flops,
                              run_dir=run.dirs[0], evaluate_first=True,
                              train_set=_train_set(data, trainer_config, Pos, [k[0] for k in keys],
                                                   base.trainer.train_batch_size),
                              eval_hook=member_evaluations(trainer, data, Pos, base, n))
            return [run.finish(k, member(state.model, k), vocab_size=Vocab.size,
                               tokens_per_second=_member_throughput(run.dirs[k], n), method=config.method,
                               euler_steps=config.steps, **counts,
                               pretrained_eval_loss=runs.initial_eval_loss(run.dirs[k]),
                               pretrain_config_hash=pretraining.config_hash, population=_membership(run, seeds, k))
                    for k, (config, pretraining) in enumerate(zip(configs, pretrainings))]


def _adapted(base: FinetuneConfig, pretrained: Sequence[Path], Seed: Axis, adapter_keys, axis_mapping):
    """The population's model, compiled as one program: member k's pretraining (``pretrained[k]``, a run directory)
    adapted with member k's adapter key. Where every member starts from the same pretraining its frozen weights are
    kept once, shared; otherwise every weight has the population's axis."""

    def adapt_each(model, adapter_keys):
        if len(set(pretrained)) > 1:  # member k's own pretraining: every weight has the population's axis
            return hax.vmap(lambda m, key: adapt(m, base, key=key), Seed)(model, adapter_keys)
        adapted = hax.vmap(lambda key: adapt(model, base, key=key), Seed)(adapter_keys)
        # adapt draws only the adapters: the frozen weights are the same in every member, so they are kept once,
        # without the population's axis (the loss's vmap broadcasts them: one matrix product over the members'
        # batches instead of one per member)
        spec, named = finetune.trainable(base, adapted), lambda x: isinstance(x, NamedArray)
        return eqx.combine(eqx.filter(adapted, spec, is_leaf=named),
                           eqx.filter(member(adapted, 0), spec, inverse=True, is_leaf=named), is_leaf=named)

    model = (runs.load_model(pretrained[0]) if len(set(pretrained)) == 1
             else stacked([runs.load_model(run_dir) for run_dir in pretrained], Seed))
    return train.compiled_once(adapt_each, axis_mapping)(model, adapter_keys)


def stacked(models: Sequence[Any], Seed: Axis):
    """Models of one structure as one, every named array with the leading axis ``Seed`` (member k: ``models[k]``,
    which ``member`` takes back out). A leaf that is no named array must be the same in every model."""

    def stack(*leaves):
        if isinstance(leaves[0], NamedArray):
            return hax.stack(Seed, leaves)
        if any(not bool(jnp.array_equal(leaf, leaves[0])) for leaf in leaves[1:]):
            raise ValueError("the models differ in an array without named axes, which a population cannot stack")
        return leaves[0]

    return jax.tree_util.tree_map(stack, *models, is_leaf=lambda x: isinstance(x, NamedArray))


def members_of(config: Config, n: int) -> list[Config]:
    """``config`` and ``n - 1`` copies with the next ``trainer.seed`` values, named as ``workflow.presets.seeded`` names
    them: ``<name>-seed<k>`` (and ``<run_dir>-seed<k>`` when the config sets ``run_dir``: ``config.seed_member``).
    A fine-tuning of a pretraining trained as a population (``pretrain.population`` > 1) starts its member k from the
    pretraining's member ``pretrain.member`` + k: each fine-tuning seed from its own pretraining seed."""
    if not isinstance(n, int) or n < 2:
        raise ValueError(f"--seeds must be an integer of at least 2, got {n!r}")
    out = [seed_member(config, k) for k in range(n)]
    if isinstance(config, FinetuneConfig) and config.pretrain.population > 1:
        out = [dataclasses.replace(m, pretrain=dataclasses.replace(m.pretrain, member=config.pretrain.member + k))
               for k, m in enumerate(out)]
    return out


def cli(argv: list[str] | None = None) -> None:
    """``python -m diffeqformer.population --config file.yaml --seeds 3 [overrides]``: the config and its next seeds
    as one population (``members_of``): training runs, or fine-tunings if the file is a fine-tuning's
    (``config_class``)."""
    import sys

    argv = list(sys.argv[1:] if argv is None else argv)
    if "--seeds" not in argv or argv.index("--seeds") + 1 >= len(argv):
        raise SystemExit("usage: python -m diffeqformer.population --config config/<preset>/<name>.yaml --seeds N "
                         "[overrides]")
    i = argv.index("--seeds")
    try:
        n = int(argv[i + 1])
    except ValueError:
        raise SystemExit(f"error: --seeds must be an integer, got {argv[i + 1]!r}") from None
    del argv[i : i + 2]
    key = "--config" if "--config" in argv else "--config_path"
    cls = config_class(argv[argv.index(key) + 1]) if key in argv[:-1] else TrainConfig
    train.cli(argv, cls=cls, run=lambda config: main(members_of(config, n)), module="diffeqformer.population")


if __name__ == "__main__":
    import os

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    cli()
