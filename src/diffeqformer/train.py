"""Training: ``python -m diffeqformer.train --config config/<preset>/<name>.yaml [--model.time_embed_dim 32 ...]``.

A thin layer over Levanter's trainer, data cache and checkpointing; the run directory and its lifecycle are
``runs``'s. A run whose ``complete.json`` matches its configuration is not trained again; an interrupted one resumes.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional

import jax
import jax.random as jrandom
import optax
from haliax import Axis
from haliax.partitioning import round_axis_for_partitioning
from levanter.models.lm_model import LmConfig, LmExample, LmHeadModel
from levanter.optim.config import OptimizerConfig
from levanter.tracker import Tracker, TrackerConfig
from levanter.trainer import TrainerConfig

from . import devices, paths, runs, use_onednn
from .config import (Config, TrainConfig, config_class, config_hash, load_config, one_line, run_dir_of, validate,
                     with_paper_weight_decay)
from .data.corpora import build_token_caches
from .trainer import Trainer, batched_maps
from .model import attention

logger = logging.getLogger(__name__)


def next_token_loss(model: LmHeadModel, example: LmExample, *, key=None):
    """Levanter's next-token cross-entropy of ``model`` on ``example`` (mean over the loss weights): the loss every
    run trains on, as Levanter's ``train_lm`` defines it (``model.compute_next_token_loss``)."""
    return model.compute_next_token_loss(example, key=key)


class MetricsOnlyTracker(Tracker):
    """A Levanter tracker that keeps metrics only (``log``, for subclasses): no hyperparameters, no artifacts, a
    summary logged as metrics without a step."""

    def log_hyperparameters(self, hparams: dict[str, Any]):
        pass

    def log_summary(self, metrics: dict[str, Any]):
        self.log(metrics, step=None)

    def log_artifact(self, artifact_path, *, name: Optional[str] = None, type: Optional[str] = None):
        pass

    def finish(self):
        pass


class JsonlTracker(MetricsOnlyTracker):
    """A Levanter tracker that appends every logged metric to a JSON-lines file (read by ``read_metrics``)."""

    name = "jsonl"

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        _drop_partial_last_line(self.path)

    def _write(self, record: dict):
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")

    def log(self, metrics: Mapping[str, Any], *, step: Optional[int], commit: Optional[bool] = None):
        scalars = {}
        for key, value in metrics.items():
            try:
                scalars[key] = float(value)
            except (TypeError, ValueError):
                continue  # histograms, strings: not for this file
        if scalars:
            self._write({"step": step, "time": time.time(), **scalars})


def _drop_partial_last_line(path: Path) -> None:
    """Cut a JSON-lines file after its last complete line: a process killed in the middle of a write leaves half a
    record, which the next record appended after it would turn into one unreadable line."""
    if not path.exists():
        return
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        with path.open("r+b") as f:
            f.truncate(data.rfind(b"\n") + 1)


@TrackerConfig.register_subclass("jsonl")
@dataclass(frozen=True)
class JsonlTrackerConfig(TrackerConfig):
    """Config of ``JsonlTracker``."""

    path: str = runs.METRICS

    def init(self, run_id: Optional[str]) -> Tracker:
        from levanter.tracker import NoopTracker

        # process 0 alone writes the file, as Levanter's own file trackers do: one line per step
        return JsonlTracker(Path(self.path)) if devices.is_primary() else NoopTracker()


def trainer_config_of(config: Config, run_dir: Path) -> TrainerConfig:
    """Levanter's trainer config of a run: metrics to ``metrics.jsonl`` (and W&B), checkpoints in the run directory."""
    trackers: list[TrackerConfig] = [JsonlTrackerConfig(str(runs.metrics_file(run_dir)))]
    if config.wandb:
        from levanter.tracker.wandb import WandbConfig

        trackers.append(WandbConfig(name=config.name))
    checkpointer = dataclasses.replace(
        config.trainer.checkpointer, base_path=str(runs.checkpoints(run_dir)), append_run_id_to_base_path=False
    )
    return dataclasses.replace(
        config.trainer,
        id=config.name,
        tracker=tuple(trackers),
        checkpointer=checkpointer,
        log_dir=run_dir / "logs",
        # Levanter would trace and lower the train step once more to store its jaxpr and HLO, which nothing reads
        log_jaxprs=False,
        log_xla_hlo=False,
        require_accelerator=False if config.trainer.require_accelerator is None else config.trainer.require_accelerator,
    )


def started(config: Config, model: LmConfig) -> TrainerConfig:
    """The run's trainer config once its processes have started (``devices.start``) and its mesh is checked against
    ``model`` and the batch (``devices.check``): before ``runs.opened``, where only process 0 locks, so that bad
    input leaves nothing behind."""
    trainer_config = devices.start(trainer_config_of(config, run_dir_of(config)))
    devices.check(trainer_config, model)
    return trainer_config


def initialize_and_build(trainer_config: TrainerConfig, optimizer: OptimizerConfig) -> optax.GradientTransformation:
    """Levanter's initialisation, then ``optimizer`` built for the run's steps (building it evaluates the learning
    rate with jax.numpy, which starts JAX's backend: after ``devices.start``). Every training starts here, so here
    Levanter's attention is routed through cuDNN on a GPU (``model.attention.install``)."""
    import levanter.trainer

    attention.install()
    levanter.trainer.initialize(trainer_config)
    return optimizer.build(trainer_config.num_train_steps)


INIT_COMPILER_OPTIONS = {"xla_backend_optimization_level": 1}
"""XLA options for the programs that run once at a run's start (``compiled_once``): level 1 compiles faster than the
default 2, to the same states bit for bit; the training step keeps the default."""


def compiled_once(fn, axis_mapping=None):
    """``fn`` as one program compiled with ``INIT_COMPILER_OPTIONS``, its output sharded by ``axis_mapping``."""
    import haliax as hax

    return hax.named_jit(fn, axis_resources=axis_mapping, compiler_options=INIT_COMPILER_OPTIONS)


def initial_state(trainer: Trainer, training_key, model_init):
    """``trainer.initial_state``: the run's checkpoint if it has one, else a fresh state whose model ``model_init``
    builds in a program of its own (``compiled_once``), sharded as the trainer shards its parameters."""
    if trainer.checkpoint_load_plan()[1]:  # resuming: the model's shape is enough
        return trainer.initial_state(training_key, model_init=model_init)
    model = compiled_once(model_init, trainer.parameter_axis_mapping)()
    return trainer.initial_state(training_key, model=model)


def vocab_axis(data, trainer: Trainer) -> Axis:
    """The vocabulary axis of ``data``'s tokenizer, rounded up as ``trainer`` shards it."""
    return round_axis_for_partitioning(Axis("vocab", len(data.the_tokenizer)), trainer.parameter_axis_mapping)


def main(config: TrainConfig) -> dict:
    """Train (or resume, or skip a finished run) and return the contents of ``complete.json``."""
    validate(config)
    trainer_config = started(config, config.model)
    with runs.opened([config], [config_hash(config)]) as run:
        if run.finished:
            return run.summaries[0]
        data = config.data.levanter_config()
        build_token_caches(data)
        optimizer = initialize_and_build(trainer_config, with_paper_weight_decay(config.optimizer, config.model))
        with Trainer(trainer_config, optimizer, next_token_loss) as trainer:
            data_key, model_key, training_key = jrandom.split(jrandom.PRNGKey(trainer_config.seed), 3)
            Vocab = vocab_axis(data, trainer)
            state = initial_state(trainer, training_key, lambda: config.model.build(Vocab, key=model_key))
            flops = config.model.flops_per_token(Vocab.size, config.model.max_seq_len)
            state = fit(trainer, state, config, data, data_key=data_key, Pos=config.model.max_Pos,
                        flops_per_token=flops, run_dir=run.dirs[0])
            return run.finish(0, state.model, vocab_size=Vocab.size)


FAST_LOSS_BACKWARD = "LEVANTER_CE_XLA_FAST_BWD"
"""Levanter's switch for the faster backward pass of its fused cross-entropy's XLA path (the one a GPU takes when its
batched kernel finds no block size for the vocabulary); only the gradient's rounding differs."""


def use_fast_loss_backward() -> bool:
    """On a GPU, turn on ``FAST_LOSS_BACKWARD`` unless the environment sets it; elsewhere leave it alone, so that the
    cpu preset's numbers stay the same. Returns whether it is on."""
    if jax.default_backend() == "gpu":
        os.environ.setdefault(FAST_LOSS_BACKWARD, "1")
    return os.environ.get(FAST_LOSS_BACKWARD, "0").strip().lower() in ("1", "true", "yes", "on")


def fit(trainer: Trainer, state, config, data, *, data_key, Pos: Axis, flops_per_token: Optional[float],
        run_dir: Path, evaluate_first: bool = False, train_set=None, eval_hook=None):
    """Run Levanter's training loop from ``state`` (fresh or resumed) to ``trainer.num_train_steps``; return the state.

    Validation loss every ``trainer.steps_per_eval`` steps and at the end (``evaluate_first``: also the initial
    model's, at step -1, since Levanter logs update k at step k), throughput every step. A non-finite training loss
    ends the process with one line (``runs.diverged``), the checkpoints before it kept. ``train_set`` and
    ``eval_hook`` replace the training data (``data.train_set`` with ``data_key``) and the evaluation
    (``evaluation``): a population passes its members'."""
    import levanter.callbacks
    from levanter.callbacks import StepInfo

    use_fast_loss_backward()
    trainer_config = trainer.config
    if train_set is None:
        train_set = batched_maps(data.train_set(Pos, trainer_config.batch_schedule, key=data_key))
    eval_sets = data.tagged_eval_sets(Pos)
    _check_validation_length(eval_sets, Pos)
    if int(state.step) > 0:
        print(f"{config.name}: resuming from step {int(state.step)}", file=sys.stderr)
    if eval_hook is None:
        eval_hook = evaluation(trainer, eval_sets, data.the_tokenizer, config)
    if evaluate_first and int(state.step) == 0:
        eval_hook(StepInfo(state, loss=float("nan"), step_duration=0.0))
    trainer.add_hook(once_per_step(eval_hook), every=trainer_config.steps_per_eval)
    trainer.add_hook(
        levanter.callbacks.log_performance_stats(
            Pos.size, trainer_config.batch_schedule, 3 * flops_per_token * Pos.size if flops_per_token else None
        ),
        every=1,
    )
    if int(state.step) >= trainer_config.num_train_steps:  # killed after its last checkpoint
        return state
    done = [int(state.step) - 1]  # the last update whose hooks ran: Levanter raises on a bad loss before them
    trainer.add_hook(lambda info: done.__setitem__(0, info.step), every=1)
    loader = trainer.data_loader(train_set).iter_from_step(int(state.step))
    try:
        return trainer.train(state, loader).state  # ends with every hook forced: evaluation, checkpoint
    except RuntimeError as err:
        if str(err) in NON_FINITE_LOSS:
            raise runs.diverged(run_dir, done[0] + 1, NON_FINITE_LOSS[str(err)]) from None
        raise


def evaluation(trainer: Trainer, eval_sets, tokenizer, config, prefix: str = "eval"):
    """Levanter's evaluation hook (``cb_tagged_lm_evaluate``) of ``eval_sets`` as a run evaluates: its evaluation
    batch, mesh and precision, ``evaluated_examples`` of ``config``, metrics under ``prefix``."""
    import levanter.eval

    return levanter.eval.cb_tagged_lm_evaluate(trainer.config.EvalBatch, eval_sets, tokenizer, trainer.device_mesh,
                                               trainer.compute_axis_mapping, evaluated_examples(config.trainer),
                                               prefix=prefix, mp=trainer.config.mp)


def evaluated_examples(trainer: TrainerConfig) -> Optional[int]:
    """The validation examples an evaluation reads (None: all): ``trainer.max_eval_batches`` batches of the run's
    evaluation batch on one device (``per_device_eval_parallelism``, else ``per_device_parallelism``, else the largest
    training batch), whatever the number of devices (Levanter's own count grows with them). ``trainer``: the run's
    section, before Levanter resolves its -1s."""
    from levanter.schedule import distinct_values

    if trainer.max_eval_batches is None:
        return None
    per_batch = next((p for p in (trainer.per_device_eval_parallelism, trainer.per_device_parallelism) if p > 0),
                     max(distinct_values(trainer.train_batch_size)))
    return trainer.max_eval_batches * per_batch


NON_FINITE_LOSS = {"Loss is NaN": float("nan"), "Loss is Inf": float("inf")}
"""The errors Levanter's trainer raises for a non-finite training loss (``Trainer.train_step``), and that loss."""


def once_per_step(hook):
    """``hook`` run at most once per step: Levanter runs every hook once more after the last step (forced), which
    would evaluate the last step twice where ``num_train_steps`` is a multiple of ``steps_per_eval``."""
    evaluated = set()

    def run(info):
        if info.step not in evaluated:
            evaluated.add(info.step)
            hook(info)

    return run


def _check_validation_length(eval_sets, Pos: Axis) -> None:
    for dataset, tags in eval_sets:
        if len(dataset.as_sync_dataset()) < 1:
            raise ValueError(
                f"the validation split {tags} holds fewer tokens than model.max_seq_len ({Pos.size}): "
                "lower model.max_seq_len or choose another data.domain"
            )


def use_compilation_cache(directory: str | Path | None = None) -> Path:
    """Keep XLA's compiled programs on disk (JAX's persistent compilation cache, every program however fast it
    compiles), below ``DIFFEQFORMER_HOME/_build/jax-cache`` unless ``JAX_COMPILATION_CACHE_DIR`` names another place:
    a run whose shapes another run compiled (a rerun, the other fine-tuning direction) loads its steps."""
    directory = Path(os.environ.get("JAX_COMPILATION_CACHE_DIR") or directory or paths.HOME / "_build" / "jax-cache")
    directory.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(directory))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    return directory


def cli(argv: list[str] | None = None, *, cls: type | None = TrainConfig, run=main,
        module: str = "diffeqformer.train"):
    """``python -m <module> --config file.yaml [overrides]``: parse into ``cls`` (None: the file's, ``config_class``)
    and call ``run``; bad input exits with a one-line error."""
    use_onednn()
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--config" not in argv and "--config_path" not in argv:
        raise SystemExit(f"usage: python -m {module} --config config/<preset>/<name>.yaml [overrides]")
    key = "--config" if "--config" in argv else "--config_path"
    i = argv.index(key)
    if i + 1 == len(argv):
        raise SystemExit(f"usage: python -m {module} --config config/<preset>/<name>.yaml [overrides] ({key} without a "
                         "file)")
    path, overrides = argv[i + 1], argv[:i] + argv[i + 2 :]
    from .data.corpora import DatasetUnavailableError  # an online corpus asked for offline: said in one line too

    try:
        config = load_config(path, overrides, cls=cls or config_class(path))
        if devices.several_processes(config.trainer):  # one line, not a native abort, when another process dies
            devices.watched(config.name)
        use_compilation_cache()
        run(config)
    except (ValueError, FileNotFoundError, DatasetUnavailableError) as err:
        raise SystemExit(f"error: {one_line(err)}") from None
    except jax.errors.JaxRuntimeError as err:
        if not jax.distributed.is_initialized():
            raise
        # in a run of several processes: a collective whose peer died (Gloo: "Connection reset by peer")
        devices.stopped(config.name, f"a collective failed, most likely because another process of the run stopped "
                                     f"({one_line(err)[:200]})")


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    cli()
