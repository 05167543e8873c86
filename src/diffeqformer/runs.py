"""The run directory: its files, its lock, its lifecycle (lock, start or skip, finish) and the reading of a finished
run. ``diffeqformer.train`` writes it (``diffeqformer.population`` per member; ``diffeqformer.finetune`` adds the
pretraining's configuration)::

    config.yaml           the resolved configuration, its hash on the first line (``# config_hash: <hash>``)
    pretrain_config.yaml  a fine-tuning only: the pretraining's config.yaml
    checkpoints/          Levanter's checkpoints; rerunning the same command resumes from the newest one
    metrics.jsonl         every metric the trainer logs, one JSON object per line
    model.eqx             the trained model (``equinox.tree_serialise_leaves``)
    complete.json         written last: the summary (final validation loss, config hash, vocabulary size, ...)

A run is *complete* when its ``complete.json`` exists (and records the config hash asked for). Every trainer goes
through ``with opened(configs, digests) as run:`` (lock, skip or write ``config.yaml``), fits, and ends with
``run.finish(k, model, ...)`` or ``diverged``. Levanter is imported where it is needed: importing this is cheap.
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Sequence

from . import devices, paths

if TYPE_CHECKING:
    from .config import Config, FinetuneConfig, TrainConfig

COMPLETE, CONFIG, PRETRAIN_CONFIG = "complete.json", "config.yaml", "pretrain_config.yaml"
METRICS, MODEL, CHECKPOINTS = "metrics.jsonl", "model.eqx", "checkpoints"
HASH_PREFIX = "# config_hash: "
LOCK = ".lock"  # held while a process trains the run
RETRAIN = ("delete {run_dir} and train it again (the same command, or the workflow, "  # about a corrupt file
           "snakemake -s workflow/Snakefile --cores all, which retrains what is missing)")


# ------------------------------------------------------------------------------------------- finding a run


def run_path(run) -> Path:
    """A run directory as given to a notebook: absolute, or relative to ``DIFFEQFORMER_HOME``."""
    path = Path(run).expanduser()
    return path if path.is_absolute() else paths.HOME / path


def is_complete(run, config_hash: str | None = None) -> bool:
    """Whether the run finished (its ``complete.json`` exists), given ``config_hash`` with that configuration."""
    if not (run_path(run) / COMPLETE).exists():
        return False
    return config_hash is None or read_complete(run).get("config_hash") == config_hash


def require_complete(run, label: str = "run") -> Path:
    """The run's directory if the run finished; else ``FileNotFoundError`` naming the run (as ``label``)."""
    path = run_path(run)
    if not path.is_dir():
        missing = f"no such directory {path}"
    elif not (path / COMPLETE).exists():
        missing = f"{path} has no {COMPLETE}: it has not finished"
    else:
        return path
    raise FileNotFoundError(f"{label} {run}: no finished run there ({missing}); train it first, e.g. "
                            f"snakemake -s workflow/Snakefile --cores all --config preset=<preset>")


def summary(run) -> dict:
    """A finished run's ``complete.json``."""
    require_complete(run)
    return read_complete(run)


def read_complete(run) -> dict:
    """The run's ``complete.json``; a corrupt one is refused naming the file and how to train the run again."""
    path = run_path(run)
    return paths.read_json(path / COMPLETE, RETRAIN.format(run_dir=path))


def checkpoints(run) -> Path:
    """The run's folder of Levanter checkpoints."""
    return run_path(run) / CHECKPOINTS


def metrics_file(run) -> Path:
    """The run's ``metrics.jsonl``."""
    return run_path(run) / METRICS


def saved_hash(run) -> str | None:
    """The config hash on the first line of the run's ``config.yaml`` (written at the start), or None."""
    saved = run_path(run) / CONFIG
    return saved.read_text().split("\n", 1)[0].removeprefix(HASH_PREFIX) if saved.exists() else None


def is_finetuning(run) -> bool:
    """Whether the run is a fine-tuning (its directory holds ``pretrain_config.yaml``)."""
    return (run_path(run) / PRETRAIN_CONFIG).exists()


# --------------------------------------------------------------------------------------- reading a run


def config(run):
    """The run's configuration (``FinetuneConfig`` or ``TrainConfig``), from ``config.yaml``."""
    from .config import FinetuneConfig, TrainConfig, load_config

    return load_config(_config_file(run, CONFIG), cls=FinetuneConfig if is_finetuning(run) else TrainConfig)


def pretrain_config(run):
    """The ``TrainConfig`` of the pretraining a fine-tuning started from; ``ValueError`` for another run."""
    from .config import load_config

    if not is_finetuning(run):
        raise ValueError(f"run {run}: not a fine-tuning (no {PRETRAIN_CONFIG})")
    return load_config(_config_file(run, PRETRAIN_CONFIG))


def model_config(run):
    """The model configuration the run's model is built from: a fine-tuning's is its pretraining's."""
    return (pretrain_config(run) if is_finetuning(run) else config(run)).model


def model_type(model) -> str:
    """The name a model configuration is registered under (its ``type`` in YAML): ``diffeqformer``, ``gpt2``, ..."""
    return model.get_choice_name(type(model))


def model_label(model) -> str:
    """How the book names a model configuration: its type, or, for a DiffEqFormer, the paper's model it is
    (time-independent weights: weight-shared; its Llama variant: DiffEqFormer-Llama)."""
    kind = model_type(model)
    if kind != "diffeqformer":
        return {"gpt2": "GPT-2", "llama": "Llama"}.get(kind, kind)
    if not getattr(model, "time_dependent", True):
        return "weight-shared"
    return "DiffEqFormer-Llama" if getattr(model, "variant", "") == "llama" else "DiffEqFormer"


def load_model(run, *, merged: bool = False):
    """The trained model of a finished run, rebuilt from its configuration (a fine-tuning's adapted:
    ``config.adapt``), its attention routed as in training; ``merged`` folds LoRA adapters into the weights."""
    import equinox as eqx
    import jax.random as jrandom
    from haliax import Axis
    from levanter.adaptor.lora import merge_lora_modules

    from .config import adapt
    from .model import attention

    path = run_path(run)
    if not (path / COMPLETE).exists():
        raise FileNotFoundError(f"{path} holds no finished run (no {COMPLETE})")
    attention.install()
    Vocab = Axis("vocab", read_complete(path)["vocab_size"])
    key = jrandom.PRNGKey(0)  # only shapes matter: the values are read from the file
    if is_finetuning(path):
        cfg, pre = config(path), pretrain_config(path)
        skeleton = eqx.filter_eval_shape(lambda: adapt(pre.model.build(Vocab, key=key), cfg, key=key))
    else:
        skeleton = eqx.filter_eval_shape(config(path).model.build, Vocab, key=key)
    model = eqx.tree_deserialise_leaves(path / MODEL, skeleton)
    return merge_lora_modules(model) if merged else model


def parameter_count(run) -> int:
    """Parameters of a pretraining run's model, counted on a shape-only build of its config."""
    import equinox as eqx
    import jax
    from haliax import Axis

    from .model.transformer import count_params

    model = config(run).model
    shape = eqx.filter_eval_shape(lambda: model.build(Axis("vocab", summary(run)["vocab_size"]),
                                                      key=jax.random.PRNGKey(0)))
    return count_params(shape)


def read_metrics(run):
    """The metrics of a run, one row per step (the last value logged for it wins), a column per metric."""
    import pandas as pd

    path = metrics_file(run)
    if not path.exists():
        raise FileNotFoundError(f"no metrics file at {path}; has the run started?")
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    frame = pd.DataFrame([r for r in records if r.get("step") is not None])
    if frame.empty:
        return frame
    return frame.drop(columns="time").groupby("step").last().sort_index()


def _logged(metrics, column: str):
    """The logged values of ``column`` (an empty tuple where it was never logged)."""
    return metrics[column].dropna() if column in metrics else ()


def median_throughput(metrics) -> Optional[float]:
    """Training tokens/s of a run: the median of Levanter's ``throughput/tokens_per_second`` after the first tenth
    of the steps (compilation, warm-up), from ``read_metrics``."""
    values = _logged(metrics, "throughput/tokens_per_second")
    if not len(values):
        return None
    return float(values[values.index >= values.index.max() / 10].median())


def initial_eval_loss(run) -> Optional[float]:
    """The validation loss of a fine-tuning's pretrained model (logged at step -1)."""
    metrics = read_metrics(run)
    if -1 not in metrics.index or "eval/loss" not in metrics:
        return None
    return float(metrics.loc[-1, "eval/loss"])


def perplexity(loss: Optional[float]) -> Optional[float]:
    r"""The perplexity :math:`e^{L}` of a mean next-token loss :math:`L` in nats; None without a loss or where
    :math:`e^{L}` is not a finite float (a diverged run's)."""
    if loss is None or not math.isfinite(loss):
        return None
    try:
        return math.exp(loss)
    except OverflowError:
        return None


# ----------------------------------------------------------------------------------------- a fine-tuning's start


@dataclass(frozen=True)
class Pretraining:
    """A finished pretraining run, checked against its config file (``pretraining``)."""

    config: "TrainConfig"
    run_dir: Path
    config_hash: str
    Vocab: Any  # its vocabulary axis (haliax.Axis), as it was trained


def pretraining(config: "FinetuneConfig") -> Pretraining:
    """The finished pretraining a fine-tuning names (``pretrain.config``, ``pretrain.run_dir``), checked to have
    been trained with that file's configuration; ``ValueError`` naming the field and what to do otherwise."""
    from haliax import Axis

    from .config import pretraining_hash, pretraining_of, repository_path

    pre_path = repository_path(config.pretrain.config)
    if not pre_path.exists():
        raise ValueError(f"pretrain.config: no such file {config.pretrain.config}")
    pre, pre_dir = pretraining_of(config)
    if not (pre_dir / COMPLETE).exists():
        raise ValueError(
            f"pretrain.run_dir: {pre_dir} holds no finished pretraining run (no {COMPLETE}); train it first: "
            + (f"python -m diffeqformer.population --config {pre_path} --seeds {config.pretrain.population}"
               if config.pretrain.population > 1 else
               f"python -m diffeqformer.train --config {pre_path} --run_dir {pre_dir}"))
    summary = read_complete(pre_dir)
    digest = pretraining_hash(config)
    if summary.get("config_hash") != digest:
        raise ValueError(f"pretrain.config: the run in {pre_dir} was trained with another configuration "
                         f"(hash {summary.get('config_hash')}) than {pre_path} (hash {digest})")
    return Pretraining(pre, pre_dir, digest, Axis("vocab", summary["vocab_size"]))


# ------------------------------------------------------------------------------------------------- the lifecycle


@contextlib.contextmanager
def lock(run_dir: Path):
    """Hold ``run_dir/.lock`` while training it, so that a second process training the run waits for the first. In a
    run of several processes only process 0 locks: the others must not wait for it, as it waits for them."""
    run_dir.mkdir(parents=True, exist_ok=True)
    waiting = f"{run_dir}: another process is training this run; waiting for it to end"
    with paths.exclusive(run_dir / LOCK, waiting) if devices.is_primary() else contextlib.nullcontext():
        yield


def start_run(config: "Config", run_dir: Path, digest: str) -> Optional[dict]:
    """The summary of a finished run of this configuration, else None once process 0 has written ``config.yaml``;
    refuses a run directory that holds checkpoints of another configuration."""
    from .config import dump_config

    if (run_dir / COMPLETE).exists():
        summary = read_complete(run_dir)
        if summary.get("config_hash") == digest:
            print(f"{config.name}: already complete ({run_dir}); not retraining", file=sys.stderr)
            return summary
    saved = run_dir / CONFIG
    if saved.exists() and (run_dir / CHECKPOINTS).exists():
        previous = saved.read_text().split("\n", 1)[0]
        if previous != HASH_PREFIX + digest:
            raise ValueError(f"{run_dir} holds a run with another configuration ({previous.removeprefix('# ')}); "
                             "choose another --name/--run_dir or delete it")
    if devices.is_primary():
        paths.write_atomic(saved, f"{HASH_PREFIX}{digest}\n" + dump_config(config))
    return None


@dataclass
class Opened:
    """The runs a trainer trains together (one, or a population's members), locked (``opened``)."""

    configs: Sequence["Config"]
    dirs: list[Path]
    digests: list[str]
    summaries: list[Optional[dict]]  # each run's complete.json if it is complete for its hash, else None
    start: float = field(default_factory=time.time)

    @property
    def finished(self) -> bool:
        """Whether every run is complete for its hash: there is nothing to train."""
        return all(s is not None for s in self.summaries)

    @property
    def checkpoints(self) -> Path:
        """Where the trainer keeps its checkpoints: in the first run's directory."""
        return self.dirs[0] / CHECKPOINTS

    def finish(self, k: int, model, **extra) -> dict:
        """``finish_run`` of run ``k``, its wall time counted from the opening."""
        return finish_run(self.configs[k], self.dirs[k], model, self.digests[k], self.start, **extra)


@contextlib.contextmanager
def opened(configs: Sequence["Config"], digests: Sequence[str], *,
           pretraining_dir: Path | Sequence[Path] | None = None):
    """Lock the run directories of ``configs`` for the block and start each run not complete for its hash
    (``start_run``; ``pretraining_dir``'s ``config.yaml``, one or one per run, as ``pretrain_config.yaml``)."""
    from .config import run_dir_of

    dirs = [run_dir_of(c) for c in configs]
    with contextlib.ExitStack() as locks:
        for run_dir in dirs:
            locks.enter_context(lock(run_dir))
        summaries = [start_run(c, d, h) for c, d, h in zip(configs, dirs, digests)]
        run = Opened(configs, dirs, list(digests), summaries)
        if pretraining_dir is not None and not run.finished and devices.is_primary():
            pretrained = (pretraining_dir if isinstance(pretraining_dir, (list, tuple))
                          else [pretraining_dir] * len(dirs))
            for run_dir, pre_dir in zip(dirs, pretrained):
                paths.write_atomic(run_dir / PRETRAIN_CONFIG, (pre_dir / CONFIG).read_text())
        yield run


def diverged(run_dir: Path, step: int, loss: float) -> SystemExit:
    """The end of a run whose loss at ``step`` has no finite perplexity: one line, no traceback, no
    ``complete.json``. Another learning rate is another configuration, which ``start_run`` refuses beside this one's
    checkpoints: hence delete, then train."""
    return SystemExit(
        f"{run_dir}: training diverged at step {step} (loss {loss:.4g}), so the run is not complete: lower "
        f"optimizer.learning_rate (or clip gradients with optimizer.max_grad_norm), delete {run_dir} and train again")


def finish_run(config: "Config", run_dir: Path, model, digest: str, start: float, **extra) -> dict:
    """Save the model, then write ``complete.json`` (the metrics' summary plus ``extra``) and return it; a last loss
    without a finite perplexity ends the run first (``diverged``). Every process calls it: they wait until process 0
    has logged the last metrics, gather the model, and process 0 writes the files."""
    import equinox as eqx
    import jax

    from .cache import write_atomically

    devices.barrier(f"trained {config.name}")
    metrics = read_metrics(run_dir)
    for column in ("train/loss", "eval/loss"):
        logged = _logged(metrics, column)
        if len(logged) and perplexity(float(logged.iloc[-1])) is None:
            raise diverged(run_dir, int(logged.index[-1]), float(logged.iloc[-1]))
    model = devices.host_copy(model)
    final = {c: float(v.iloc[-1]) if len(v := _logged(metrics, c)) else None for c in ("train/loss", "eval/loss")}
    summary = {"name": config.name, "config_hash": digest, "steps": config.trainer.num_train_steps,
               "final_train_loss": final["train/loss"], "final_eval_loss": final["eval/loss"],
               "final_eval_perplexity": perplexity(final["eval/loss"]), "tokens_per_second": median_throughput(metrics),
               "wall_time_s": time.time() - start, "jax_backend": jax.default_backend(),
               "processes": jax.process_count(), "devices": jax.device_count(), **extra}
    if devices.is_primary():
        write_atomically(run_dir / MODEL, lambda path: eqx.tree_serialise_leaves(path, model))
        paths.write_atomic(run_dir / COMPLETE, json.dumps(summary, indent=1) + "\n")
    devices.barrier(f"finished {config.name}")
    return summary


def _config_file(run, name: str) -> Path:
    path = run_path(run) / name
    if not path.exists():
        raise FileNotFoundError(f"run {run}: no {name} in {path.parent}")
    return path
