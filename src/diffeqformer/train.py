"""Training: ``python -m diffeqformer.train --config config/<preset>/<name>.yaml [--model.time_embed_dim 32 ...]``.

A thin layer over Levanter's trainer, data cache and checkpointing. Each run lives in ``runs/<name>/`` (or
``--run_dir``):

    config.yaml      the resolved configuration (what was trained)
    checkpoints/     Levanter checkpoints; rerunning the same command resumes from the newest one
    metrics.jsonl    every metric Levanter logs (train loss, eval loss, throughput), one JSON object per line
    complete.json    written last: final validation loss and perplexity, wall time, the config's hash

A run whose ``complete.json`` matches its configuration is not trained again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional

import draccus
import jax
import jax.random as jrandom
import optax
from haliax import Axis
from haliax.partitioning import round_axis_for_partitioning
from levanter.models.lm_model import LmConfig, LmExample, LmHeadModel
from levanter.optim.config import AdamConfig, OptimizerConfig
from levanter.tracker import NoopConfig, Tracker, TrackerConfig
from levanter.trainer import TrainerConfig

from . import paths, use_onednn
from .dispatch import Trainer, batched_maps
from .model.transformer import DiffEqFormerConfig
from .numerics import check_positive_int

logger = logging.getLogger(__name__)

LOOP_VERSION = 3
"""Version of the training loop's numerics, hashed into every run's config hash: runs trained by an older loop are
trained again. 3: marin-levanter on JAX 0.11. (2 trained without buffer donation and with a strongly typed step
counter, which jaxlib 0.7.2 needed for a resumed run to end bit-identical to an uninterrupted one; on JAX 0.11.2
Levanter's own trainer does, donation and all: ``tests/test_train.py`` kills and resumes runs to check it.)"""

DECAY_ODE = r".*token_embeddings.*|.*position_embeddings.*"
"""Weight decay of the ODE model, a regex for Levanter's ``weight_decay_modules`` (``re.match`` on each parameter's
path): the paper's code decays only its embeddings (not the hypernetworks, norms or biases)."""
DECAY_BASELINE = r"(?!.*norm)(.*\.)?(attn|self_attn|mlp)\.(.*\.)?weight$|.*token_embeddings.*|.*position_embeddings.*"
"""Weight decay of the baselines (GPT-2, Llama, the weight-shared model) and of every fine-tuned model (a discretised
DiffEqFormer or a baseline), nanoGPT's convention: the weight matrices of the attention and MLP submodules
(``attn``/``self_attn``/``mlp``, LoRA adapters included) and the embeddings; never a norm or a bias. A path that
names a norm anywhere is excluded: the parallel block's ``attn_norm``/``mlp_norm`` (GPT-2's ``ln_1``/``ln_2``) are
norms, although their names begin like the submodules'."""


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
    """Shuffle the training sequences (one Feistel permutation, the same each epoch). Levanter's own default is not to
    shuffle, which feeds the corpus document after document: with it, every model's validation loss jumped up and
    down with the genre it was reading (128-d cpu runs: 6.55 at step 50, 7.31 at step 100, for GPT-2 and
    DiffEqFormer alike)."""

    def levanter_config(self):
        import dataclasses

        from .data.corpora import lm_dataset_config

        config = lm_dataset_config(self.dataset, self.domain, vocab_size=self.vocab_size)
        return dataclasses.replace(config, shuffle=self.shuffle, permutation_type="feistel")


@dataclass
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
    """Also log to Weights & Biases (off by default)."""


def run_dir_of(config: TrainConfig) -> Path:
    return Path(config.run_dir) if config.run_dir else paths.RUNS / config.name


def validate(config: TrainConfig) -> None:
    """Reject bad input before any compute, naming the field."""
    validate_name(config)
    validate_trainer(config.trainer)
    validate_optimizer(config.optimizer)
    validate_data(config.data)
    for name in ("max_seq_len", "hidden_dim", "num_layers", "num_heads"):
        check_positive_int(getattr(config.model, name, 1), f"model.{name}")
    if config.model.hidden_dim % config.model.num_heads:
        raise ValueError(
            f"model.hidden_dim ({config.model.hidden_dim}) must be divisible by model.num_heads "
            f"({config.model.num_heads})"
        )
    validate_regularisers(config.model)


def validate_regularisers(model: LmConfig) -> None:
    """Reject a dropout rate outside [0, 1), and a regulariser that the model would not apply, naming the field.

    Levanter's GPT-2 has an ``attn_pdrop`` field that its attention never reads: ``Gpt2Attention`` calls
    ``dot_product_attention`` without a dropout rate, so the rate is that function's default, 0, whatever the
    attention backend (the field only travels to and from Hugging Face configs). A GPT-2 config with attention
    dropout would claim a regulariser it does not have; DiffEqFormer, like the official code, has none either."""
    from levanter.models.gpt2 import Gpt2Config

    if not isinstance(model, Gpt2Config):  # DiffEqFormerConfig checks its own rates; Levanter's Llama has none
        return
    for name in ("embed_pdrop", "resid_pdrop", "attn_pdrop"):
        rate = getattr(model, name)
        if not 0.0 <= rate < 1.0:
            raise ValueError(f"model.{name} must be in [0, 1), got {rate!r}")
    if model.attn_pdrop != 0:
        raise ValueError(
            f"model.attn_pdrop must be 0, got {model.attn_pdrop!r}: Levanter's GPT-2 does not apply attention "
            "dropout (its attention passes no dropout rate to dot_product_attention), so the value would do nothing"
        )


def validate_name(config) -> None:
    """Reject a run name that is not a non-empty string: without ``run_dir`` the run would be written in ``runs/``
    itself (an empty name) or fail on a path of None."""
    if not isinstance(config.name, str) or not config.name.strip():
        raise ValueError(f"name must be a non-empty string (the run directory is runs/<name>), got {config.name!r}")


def validate_trainer(t: TrainerConfig) -> None:
    """Reject a trainer section that would not train, naming the field: a non-positive number of steps, batch size,
    evaluation interval or number of evaluation batches (an evaluation of no batch has no loss), a seed that is not an
    integer, a number of examples per device that is neither -1 (Levanter's: the batch split over the devices) nor
    positive."""
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
    """Reject an optimizer section that would not train, naming the field: a learning rate that is not a positive
    finite number (a negative one climbs the loss), a negative weight decay, Adam's betas outside [0, 1), a
    non-positive epsilon or gradient-norm bound, a warm-up or final learning-rate ratio outside [0, 1]."""
    def number(name):
        value = getattr(o, name, None)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ValueError(f"optimizer.{name} must be a number, got {value!r}")
        return value

    def check(name, ok, expected):
        value = number(name)
        if value is not None and not (math.isfinite(value) and ok(value)):
            raise ValueError(f"optimizer.{name} must be {expected}, got {value!r}")

    check("learning_rate", lambda v: v > 0, "a positive number")
    check("weight_decay", lambda v: v >= 0, "at least 0")
    check("beta1", lambda v: 0 <= v < 1, "in [0, 1)")
    check("beta2", lambda v: 0 <= v < 1, "in [0, 1)")
    check("epsilon", lambda v: v > 0, "a positive number")
    check("max_grad_norm", lambda v: v > 0, "a positive number (or null for no clipping)")
    check("min_lr_ratio", lambda v: 0 <= v <= 1, "in [0, 1]")
    warmup = number("warmup")
    if warmup is not None and not (math.isfinite(warmup) and (0 <= warmup <= 1 or float(warmup).is_integer()
                                                                and warmup > 1)):
        raise ValueError(f"optimizer.warmup must be a fraction of the steps in [0, 1] or a whole number of steps, "
                         f"got {warmup!r}")


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


def plain_tree(config) -> dict:
    """A draccus-encoded config reduced to plain YAML values (enums to their values, paths to strings).

    ``draccus.dump`` writes str-valued enums (Levanter's activation functions) as Python-object tags that a safe
    YAML loader refuses, hence this reduction."""
    import enum

    def plain(x):
        if isinstance(x, enum.Enum):
            return x.value
        if isinstance(x, dict):
            return {k: plain(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [plain(v) for v in x]
        if isinstance(x, Path):
            return str(x)
        return x

    return plain(draccus.encode(config))


def dump_config(config) -> str:
    """The config as plain YAML that ``load_config`` reads back."""
    import yaml

    return yaml.safe_dump(plain_tree(config), sort_keys=False)


def config_hash(config: TrainConfig, *, population: Optional[list[int]] = None) -> str:
    """Hash of what determines the trained parameters (not where the run is written, nor logging).

    ``population``: the seeds of the population the run is trained in (``diffeqformer.population``), hashed too, so
    that a member of a population and the solo run of the same config never share a hash.

    Model fields left at their class default are not hashed, so that adding a model option whose default keeps the
    old behaviour (e.g. ``random_step_offset``) does not invalidate finished runs. Any value that differs from the
    default is hashed, so two configs that train differently never share a hash. So is the weight-decay mask the run
    trains with (``with_paper_weight_decay``), which the config leaves to the code: a run trained with another mask
    is trained again."""
    import yaml

    tree = plain_tree(dataclasses.replace(config, run_dir=None, wandb=False))
    defaults = plain_tree(type(config.model)())
    tree["model"] = {k: v for k, v in tree["model"].items() if k not in defaults or defaults[k] != v}
    tree["training_loop"] = LOOP_VERSION
    if config.optimizer.weight_decay:
        tree["weight_decay_modules"] = with_paper_weight_decay(config.optimizer, config.model).weight_decay_modules
    if population is not None:
        tree["population"] = [int(seed) for seed in population]
    return hashlib.sha256(yaml.safe_dump(tree, sort_keys=False).encode()).hexdigest()[:16]


def next_token_loss(model: LmHeadModel, example: LmExample, *, key=None):
    """Levanter's next-token cross-entropy of ``model`` on ``example`` (mean over the loss weights): the loss every
    run trains on, as Levanter's ``train_lm`` defines it (``model.compute_next_token_loss``)."""
    return model.compute_next_token_loss(example, key=key)


def with_paper_weight_decay(optimizer: OptimizerConfig, model: LmConfig) -> OptimizerConfig:
    """The paper's weight-decay masks, unless the config sets its own ``weight_decay_modules``."""
    decay = DECAY_ODE if isinstance(model, DiffEqFormerConfig) and model.time_dependent else DECAY_BASELINE
    return with_weight_decay(optimizer, decay)


def with_weight_decay(optimizer: OptimizerConfig, modules: str) -> OptimizerConfig:
    """Decay the parameters whose path matches the regex ``modules`` (only), unless the config sets its own."""
    if optimizer.weight_decay_modules is not None:
        return optimizer
    return dataclasses.replace(optimizer, weight_decay_modules=modules, default_weight_decay_mask=False)


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

    path: str = paths.RUN_METRICS

    def init(self, run_id: Optional[str]) -> Tracker:
        return JsonlTracker(Path(self.path))


def read_metrics(run_dir: str | Path):
    """The metrics of a run as a pandas DataFrame: one row per step, a column per metric (NaN where not logged).

    After a resume, the last value logged for a step wins."""
    import pandas as pd

    path = Path(run_dir) / paths.RUN_METRICS
    if not path.exists():
        raise FileNotFoundError(f"no metrics file at {path}; has the run started?")
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    frame = pd.DataFrame([r for r in records if r.get("step") is not None])
    if frame.empty:
        return frame
    return frame.drop(columns="time").groupby("step").last().sort_index()


def trainer_config_of(config: TrainConfig, run_dir: Path) -> TrainerConfig:
    """Levanter's trainer config of a run: metrics to ``metrics.jsonl`` (and W&B), checkpoints in the run directory."""
    trackers: list[TrackerConfig] = [JsonlTrackerConfig(str(run_dir / paths.RUN_METRICS))]
    if config.wandb:
        from levanter.tracker.wandb import WandbConfig

        trackers.append(WandbConfig(name=config.name))
    checkpointer = dataclasses.replace(
        config.trainer.checkpointer, base_path=str(run_dir / paths.RUN_CHECKPOINTS), append_run_id_to_base_path=False
    )
    return dataclasses.replace(
        config.trainer,
        id=config.name,
        tracker=tuple(trackers),
        checkpointer=checkpointer,
        log_dir=run_dir / "logs",
        # Levanter traces and lowers the train step once more to store its jaxpr and HLO as tracker artifacts
        # (about 5 s per smoke run on this CPU); no part of this project reads them.
        log_jaxprs=False,
        log_xla_hlo=False,
        require_accelerator=False if config.trainer.require_accelerator is None else config.trainer.require_accelerator,
    )


def initialize_and_build(trainer_config: TrainerConfig, optimizer: OptimizerConfig) -> optax.GradientTransformation:
    """Levanter's initialisation for ``trainer_config``, then ``optimizer`` built for its steps: in that order, since
    building the optimiser evaluates its learning-rate schedule with jax.numpy, which starts JAX's backend, and
    jax.distributed.initialize (which Levanter calls on a cluster) refuses to run after that."""
    import levanter.trainer

    levanter.trainer.initialize(trainer_config)
    return optimizer.build(trainer_config.num_train_steps)


INIT_COMPILER_OPTIONS = {"xla_backend_optimization_level": 1}
"""XLA options for the programs that run once at a run's start (``compiled_once``): the one that initialises a
fresh model (``initial_state``) and the fine-tuning's adaptation of a pretrained one (``finetune.compiled_adapt``).
At the default level (2) the initialisation's compilation was most of a run's start-up. Measured on one core of the
two-core machine, as a pipeline lane runs (2026-11-26), from ``Trainer`` to initial state: the cpu DiffEqFormer's
population of three 21.1 s with Levanter's own compiled initialisation, 6.9 s this way; the cpu GPT-2's 7.7 s and
3.6 s. The states are the same, bit for bit (level 0: 5.8 s, but other bits). The training step stays at the default
level: 369-381 ms a step against 424 ms at level 1 (cpu DiffEqFormer population)."""


def compiled_once(fn, axis_mapping=None):
    """``fn`` as one program compiled with ``INIT_COMPILER_OPTIONS``, its output sharded by ``axis_mapping`` (in the
    mesh of the trainer entered, if any): for a program that runs once at a run's start."""
    import haliax as hax

    return hax.named_jit(fn, axis_resources=axis_mapping, compiler_options=INIT_COMPILER_OPTIONS)


def initial_state(trainer: Trainer, training_key, model_init):
    """``trainer.initial_state`` (inside ``with trainer``): a run's checkpoint if it has one, else a fresh state
    whose model ``model_init`` builds in a program of its own (``compiled_once``), placed as the trainer shards its
    parameters (Levanter then adds the optimiser state without compiling the model's initialisation again)."""
    if trainer.checkpoint_load_plan()[1]:  # resuming: the model's shape is enough
        return trainer.initial_state(training_key, model_init=model_init)
    model = compiled_once(model_init, trainer.parameter_axis_mapping)()
    return trainer.initial_state(training_key, model=model)


def main(config: TrainConfig) -> dict:
    """Train (or resume, or skip a finished run) and return the contents of ``complete.json``."""
    validate(config)
    run_dir = run_dir_of(config)
    with run_lock(run_dir):
        digest = config_hash(config)
        finished = start_run(config, run_dir, digest)
        if finished is not None:
            return finished

        data = config.data.levanter_config()
        trainer_config = trainer_config_of(config, run_dir)
        optimizer = initialize_and_build(trainer_config, with_paper_weight_decay(config.optimizer, config.model))

        start = time.time()
        with Trainer(trainer_config, optimizer, next_token_loss) as trainer:
            data_key, model_key, training_key = jrandom.split(jrandom.PRNGKey(trainer_config.seed), 3)
            Vocab = round_axis_for_partitioning(Axis("vocab", len(data.the_tokenizer)), trainer.parameter_axis_mapping)
            state = initial_state(trainer, training_key, lambda: config.model.build(Vocab, key=model_key))
            flops = config.model.flops_per_token(Vocab.size, config.model.max_seq_len)
            state = fit(trainer, state, config, data, data_key=data_key, Pos=config.model.max_Pos,
                        flops_per_token=flops, run_dir=run_dir)
            return finish_run(config, run_dir, state.model, digest, start, vocab_size=Vocab.size)


@contextlib.contextmanager
def run_lock(run_dir: Path):
    """Hold an exclusive lock on ``run_dir`` (``run_dir/.lock``) while training it: a second process that would
    train the same run (a pipeline rerun while the killed one's worker is still ending, two pipelines at once) waits
    for the first instead of writing the same checkpoints and metrics file."""
    import fcntl

    run_dir.mkdir(parents=True, exist_ok=True)
    with (run_dir / ".lock").open("w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"{run_dir}: another process is training this run; waiting for it to end", file=sys.stderr)
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def start_run(config, run_dir: Path, digest: str) -> Optional[dict]:
    """The summary of a finished run of this configuration (nothing to do), else None once ``config.yaml`` is written.

    Refuses a run directory that holds checkpoints of another configuration."""
    complete = run_dir / paths.RUN_COMPLETE
    if complete.exists():
        summary = paths.read_run_json(complete)
        if summary.get("config_hash") == digest:
            print(f"{config.name}: already complete ({run_dir}); not retraining", file=sys.stderr)
            return summary
    saved = run_dir / paths.RUN_CONFIG
    if saved.exists() and (run_dir / paths.RUN_CHECKPOINTS).exists():
        previous = saved.read_text().split("\n", 1)[0]
        if previous != paths.RUN_HASH_PREFIX + digest:
            raise ValueError(
                f"{run_dir} holds a run with another configuration ({previous.removeprefix('# ')}); "
                "choose another --name/--run_dir or delete it"
            )
    paths.write_atomic(saved, f"{paths.RUN_HASH_PREFIX}{digest}\n" + dump_config(config))
    return None


FAST_LOSS_BACKWARD = "LEVANTER_CE_XLA_FAST_BWD"
"""Levanter's switch for the faster backward pass of its fused cross-entropy's XLA path (the one a GPU takes when its
batched kernel finds no block size for the vocabulary); only the gradient's rounding differs."""


def use_fast_loss_backward() -> bool:
    """On a GPU, turn on ``FAST_LOSS_BACKWARD`` unless the environment already sets it (the reproducing page has the
    measurement); on any other platform leave it alone, so that the cpu preset's numbers stay the same. Called once
    the trainer has started JAX's backend (``fit``). Returns whether it is on."""
    if jax.default_backend() == "gpu":
        os.environ.setdefault(FAST_LOSS_BACKWARD, "1")
    return os.environ.get(FAST_LOSS_BACKWARD, "0").strip().lower() in ("1", "true", "yes", "on")


def fit(trainer: Trainer, state, config, data, *, data_key, Pos: Axis, flops_per_token: Optional[float],
        run_dir: Path, evaluate_first: bool = False, train_set=None, eval_hook=None):
    """Run Levanter's training loop from ``state`` (fresh or resumed) to ``trainer.num_train_steps``; return the state.

    Hooks: validation loss every ``trainer.steps_per_eval`` steps and at the end, throughput every step.
    ``evaluate_first`` also evaluates the initial model, logged at step -1: Levanter logs the metrics of update k
    (0-indexed) at step k, so step -1 is the model before any update. A non-finite training loss (Levanter's trainer
    raises on one, ``trainer.crash_on_nan``/``crash_on_inf``) ends the process with one line (``diverged``); the
    checkpoints written before it stay, none of the diverged state. ``config`` supplies the run's ``name``.

    Levanter's training mixture restarts a corpus when it is used up, with the same permutation, so a small corpus is
    read for as many passes as ``num_train_steps`` takes. ``train_set`` and ``eval_hook`` replace the training data
    (``data.train_set`` with ``data_key``) and the evaluation (Levanter's ``cb_tagged_lm_evaluate``): a population
    (``diffeqformer.population``) passes its members' data and evaluations."""
    import levanter.callbacks
    import levanter.eval
    from levanter.callbacks import StepInfo

    use_fast_loss_backward()
    trainer_config = trainer.config
    if train_set is None:
        train_set = batched_maps(data.train_set(Pos, trainer_config.batch_schedule, key=data_key))
    eval_sets = data.tagged_eval_sets(Pos)
    _check_validation_length(eval_sets, Pos)
    if int(state.step) > 0:
        print(f"{config.name}: resuming from step {int(state.step)}", file=sys.stderr)
    max_eval = trainer_config.max_eval_batches
    max_eval = max_eval * trainer_config.eval_batch_size if max_eval is not None else None
    if eval_hook is None:
        eval_hook = levanter.eval.cb_tagged_lm_evaluate(
            trainer_config.EvalBatch, eval_sets, data.the_tokenizer, trainer.device_mesh,
            trainer.compute_axis_mapping, max_eval, mp=trainer_config.mp,
        )
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
            raise diverged(run_dir, done[0] + 1, NON_FINITE_LOSS[str(err)]) from None
        raise


NON_FINITE_LOSS = {"Loss is NaN": float("nan"), "Loss is Inf": float("inf")}
"""The errors Levanter's trainer raises for a non-finite training loss (``Trainer.train_step``), and that loss."""


def diverged(run_dir: Path, step: int, loss: float) -> SystemExit:
    """The end of a run whose loss at ``step`` is not finite, or too large for its perplexity (``perplexity``): one
    line naming the run directory, the step and what to do, printed without a traceback (``SystemExit``; its exit
    status is 1). No ``complete.json`` is written, so the run is not taken for finished; its config hash is the
    same, so the same command would diverge again, and another learning rate is another configuration, which
    ``start_run`` refuses beside this one's checkpoints: hence delete, then train."""
    return SystemExit(
        f"{run_dir}: training diverged at step {step} (loss {loss:.4g}), so the run is not complete: lower "
        f"optimizer.learning_rate (or clip gradients with optimizer.max_grad_norm), delete {run_dir} and train again"
    )


def once_per_step(hook):
    """``hook`` run at most once per step. Levanter's trainer runs every hook once more after the last step (forced);
    when ``num_train_steps`` is a multiple of ``steps_per_eval`` (every config here) the evaluation of the last
    step then ran twice, the same numbers logged twice: a whole evaluation per run (eight batches of a 24-layer model
    in a fine-tuning, one per member in a population)."""
    evaluated = set()

    def run(info):
        if info.step not in evaluated:
            evaluated.add(info.step)
            hook(info)

    return run


def finish_run(config, run_dir: Path, model, digest: str, start: float, **extra) -> dict:
    """Save the model, then write ``complete.json`` (the summary of the metrics, plus ``extra``) and return it.

    A run whose last training or validation loss is not finite or overflows its perplexity has diverged: it ends
    with ``diverged``, before the model or the summary is written."""
    metrics = read_metrics(run_dir)
    for column in ("train/loss", "eval/loss"):
        logged = metrics[column].dropna() if column in metrics else ()
        if len(logged) and perplexity(float(logged.iloc[-1])) is None:
            raise diverged(run_dir, int(logged.index[-1]), float(logged.iloc[-1]))
    _save_model(model, run_dir / paths.RUN_MODEL)
    summary = {**_summary(config, metrics, digest, time.time() - start), **extra}
    paths.write_atomic(run_dir / paths.RUN_COMPLETE, json.dumps(summary, indent=1) + "\n")
    return summary


def _save_model(model, path: Path) -> None:
    import equinox as eqx

    tmp = path.with_suffix(".tmp")
    eqx.tree_serialise_leaves(tmp, model)
    tmp.replace(path)


def load_model(run_dir: str | Path):
    """The trained model of a finished run, rebuilt from its ``config.yaml`` (no Levanter checkpoint machinery)."""
    import equinox as eqx

    run_dir = Path(run_dir)
    complete = run_dir / paths.RUN_COMPLETE
    if not complete.exists():
        raise FileNotFoundError(f"{run_dir} holds no finished run (no {paths.RUN_COMPLETE})")
    config = load_config(run_dir / paths.RUN_CONFIG)
    Vocab = Axis("vocab", json.loads(complete.read_text())["vocab_size"])
    skeleton = eqx.filter_eval_shape(config.model.build, Vocab, key=jrandom.PRNGKey(0))
    return eqx.tree_deserialise_leaves(run_dir / paths.RUN_MODEL, skeleton)


def _check_validation_length(eval_sets, Pos: Axis) -> None:
    for dataset, tags in eval_sets:
        if len(dataset.as_sync_dataset()) < 1:
            raise ValueError(
                f"the validation split {tags} holds fewer tokens than model.max_seq_len ({Pos.size}): "
                "lower model.max_seq_len or choose another data.domain"
            )


def median_throughput(metrics) -> Optional[float]:
    """Training tokens/s of a run: the median of Levanter's per-step ``throughput/tokens_per_second`` over the steps
    after the first tenth (which hold the compilation and warm-up), from ``read_metrics``. A single step's value (the
    last one) varies by 20-30% on a shared CPU; the median over the run does not."""
    column = "throughput/tokens_per_second"
    if column not in metrics or metrics[column].dropna().empty:
        return None
    values = metrics[column].dropna()
    values = values[values.index >= values.index.max() / 10]
    return float(values.median())


def perplexity(loss: Optional[float]) -> Optional[float]:
    r"""The perplexity :math:`e^{L}` of a mean next-token loss :math:`L` in nats; None where there is no loss, or where
    it is not finite or too large for a float (:math:`L > \ln(\text{float max}) \approx 709.8`: a diverged run's,
    which ``finish_run`` refuses)."""
    if loss is None or not math.isfinite(loss):
        return None
    try:
        return math.exp(loss)
    except OverflowError:
        return None


def _summary(config: TrainConfig, metrics, digest: str, wall_s: float) -> dict:
    def last(column):
        if column not in metrics or metrics[column].dropna().empty:
            return None
        return float(metrics[column].dropna().iloc[-1])

    eval_loss = last("eval/loss")
    return {
        "name": config.name,
        "config_hash": digest,
        "steps": config.trainer.num_train_steps,
        "final_train_loss": last("train/loss"),
        "final_eval_loss": eval_loss,
        "final_eval_perplexity": perplexity(eval_loss),
        "tokens_per_second": median_throughput(metrics),
        "wall_time_s": wall_s,
        "jax_backend": jax.default_backend(),
    }


def parse_overrides(overrides: list[str] | None) -> dict:
    """Nested values of draccus-style overrides: ``["--model.time_embed_dim", "32", "--trainer.seed=1"]`` ->
    ``{"model": {"time_embed_dim": 32}, "trainer": {"seed": 1}}``, each value parsed as draccus's command line parses
    it (YAML)."""
    from draccus import cfgparsing, utils

    flat: dict[str, Any] = {}
    items = iter(overrides or [])
    for item in items:
        if not item.startswith("--") or item == "--":
            raise ValueError(f"an override must look like --field.name VALUE, got {item!r}")
        key, eq, value = item[2:].partition("=")
        if not eq:
            value = next(items, None)
            if value is None:
                raise ValueError(f"the override {item} has no value")
        flat[key] = cfgparsing.parse_string(value)
    return utils.deflatten(flat, sep=".")


def load_config(path: str | Path, overrides: list[str] | None = None, *, cls: type = TrainConfig):
    """Parse a YAML file (plus draccus-style overrides such as ``--model.time_embed_dim 32``) into ``cls``.

    This is what ``draccus.parse`` does (the file's values, the overrides merged over them, decoded into ``cls``)
    without building its command-line parser: that parser reads the docstring of every field of every registered
    Levanter config class, 1.6 s per call here, and the pipeline loads about 70 configs before it trains anything
    (and each notebook those of its runs). An override naming no field is refused by the decoder, by name."""
    import mergedeep
    from draccus import cfgparsing
    from draccus.parsers import decoding

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"config file not found: {path}" + (" (a directory)" if path.is_dir() else ""))
    values = parse_overrides(overrides)
    try:
        with path.open(encoding="utf-8") as handle:
            loaded = cfgparsing.load_config(handle, file=str(path)) or {}
    except Exception as err:  # draccus wraps YAML's error, which says where: "line 1, column 7"
        raise ValueError(f"{path}: not valid YAML ({one_line(err.__cause__ or err)})") from None
    if not isinstance(loaded, dict):
        raise ValueError(f"{path}: a config file is a mapping of fields (name: ..., model: ...), got a "
                         f"{type(loaded).__name__}")
    try:
        return decoding.decode(cls, mergedeep.merge(loaded, values))
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
        raise


def one_line(error) -> str:
    """An error's message on one line: the lines of a multi-line one (draccus lists every type it tried, YAML points
    at the column) joined by "; ", or by a space after a colon."""
    text = ""
    for line in filter(None, (line.strip() for line in str(error).splitlines())):
        text += (" " if text.endswith(":") else "; ") + line if text else line
    return text


def use_compilation_cache(directory: str | Path | None = None) -> Path:
    """Keep XLA's compiled programs on disk (JAX's persistent compilation cache), below
    ``DIFFEQFORMER_HOME/_build/jax-cache`` unless ``JAX_COMPILATION_CACHE_DIR`` names another place.

    A run whose shapes another run already compiled (the same model fine-tuned in both directions, a rerun, the
    pipeline's next run) loads its train and eval steps instead of compiling them: measured on the smoke run,
    42 s -> 30 s per process. Every program is stored, however fast it compiles: a 64-d run of 100 steps compiles
    about 30 small programs of 0.35 s each besides its train step. With a threshold of 0.5 s such a run took 54 s
    although its train step was in the cache; with none it took 60 s the first time and 39 s the second."""
    directory = Path(os.environ.get("JAX_COMPILATION_CACHE_DIR") or directory or paths.HOME / "_build" / "jax-cache")
    directory.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(directory))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    return directory


def cli(argv: list[str] | None = None, *, cls: type = TrainConfig, run=main, module: str = "diffeqformer.train"):
    """``python -m <module> --config file.yaml [overrides]``: parse into ``cls`` and call ``run``; bad input exits with
    a one-line error."""
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
        config = load_config(path, overrides, cls=cls)
        use_compilation_cache()
        run(config)
    except (ValueError, FileNotFoundError, DatasetUnavailableError) as err:
        raise SystemExit(f"error: {one_line(err)}") from None


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    cli()
