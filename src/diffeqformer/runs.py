"""The run directory, owned here: its files, its lock, its lifecycle (lock, start or skip, finish) and the reading of
a finished run (its summary, configuration, metrics and model).

A run directory is what ``diffeqformer.train`` writes (``diffeqformer.population`` per member), plus, for a
fine-tuning (``diffeqformer.finetune``), the pretraining's configuration::

    config.yaml           the resolved configuration, its hash on the first line (``# config_hash: <hash>``)
    pretrain_config.yaml  a fine-tuning only: the pretraining's config.yaml
    checkpoints/          Levanter's checkpoints; rerunning the same command resumes from the newest one
    metrics.jsonl         every metric
    model.eqx             the trained model
    complete.json         written last: the summary (final validation loss, config hash, vocabulary size, ...)

A run is *complete* when its ``complete.json`` exists (and records the config hash asked for, if any). Every
trainer (``train``, ``finetune``, ``population``) goes through ``with opened(configs, digests) as run:`` (lock, skip
or write ``config.yaml``), fits, and ends with ``run.finish(k, model, ...)``, or as ``diverged``. Levanter is
imported inside the functions that need it, so that importing this module stays cheap.
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

COMPLETE = "complete.json"
"""The summary a run writes last: its presence means the run finished."""
CONFIG = "config.yaml"
"""The run's resolved configuration (``TrainConfig`` or ``FinetuneConfig``), its hash on the first line."""
HASH_PREFIX = "# config_hash: "
"""How ``config.yaml``'s first line records the configuration's hash."""
PRETRAIN_CONFIG = "pretrain_config.yaml"
"""A fine-tuning's copy of its pretraining's ``config.yaml``."""
METRICS = "metrics.jsonl"
"""Every metric the trainer logs, one JSON object per line (``read_metrics``)."""
MODEL = "model.eqx"
"""The trained parameters, as ``equinox.tree_serialise_leaves`` writes them (``load_model``)."""
CHECKPOINTS = "checkpoints"
"""Levanter's checkpoints (a folder): rerunning the same command resumes from the newest one."""
LOCK = ".lock"
"""The lock a process holds while it trains the run (``lock``)."""

RETRAIN = ("delete {run_dir} and train it again (the same command, or the workflow, "
           "snakemake -s workflow/Snakefile --cores all, which retrains what is missing)")
"""What to do about a corrupt file of a run directory."""


# ------------------------------------------------------------------------------------------- finding a run


def run_path(run) -> Path:
    """A run directory as given to a notebook: absolute, or relative to ``DIFFEQFORMER_HOME``."""
    path = Path(run).expanduser()
    return path if path.is_absolute() else paths.HOME / path


def is_complete(run, config_hash: str | None = None) -> bool:
    """Whether the run finished (its ``complete.json`` exists), given ``config_hash`` with that configuration."""
    complete = run_path(run) / COMPLETE
    if not complete.exists():
        return False
    return config_hash is None or read_complete(run).get("config_hash") == config_hash


def require_complete(run, label: str = "run") -> Path:
    """The run's directory if the run finished; else ``FileNotFoundError`` naming the run (as ``label``) and what
    is missing."""
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
    """A finished run's ``complete.json`` (``finish_run``)."""
    require_complete(run)
    return read_complete(run)


def read_complete(run) -> dict:
    """The run's ``complete.json``; a corrupt one is refused naming the file, with the way to train the run again."""
    path = run_path(run)
    return paths.read_json(path / COMPLETE, RETRAIN.format(run_dir=path))


def has_checkpoints(run) -> bool:
    """Whether the run directory holds Levanter checkpoints (an interrupted or finished run)."""
    return (run_path(run) / CHECKPOINTS).exists()


def checkpoints(run) -> Path:
    """The run's checkpoint folder."""
    return run_path(run) / CHECKPOINTS


def metrics_file(run) -> Path:
    """The run's ``metrics.jsonl``."""
    return run_path(run) / METRICS


def saved_hash(run) -> str | None:
    """The config hash on the first line of the run's ``config.yaml`` (written at the start), or None."""
    saved = run_path(run) / CONFIG
    if not saved.exists():
        return None
    return saved.read_text().split("\n", 1)[0].removeprefix(HASH_PREFIX)


def is_finetuning(run) -> bool:
    """Whether the run is a fine-tuning (its directory holds ``pretrain_config.yaml``), not a pretraining."""
    return (run_path(run) / PRETRAIN_CONFIG).exists()


# --------------------------------------------------------------------------------------- reading a run


def config(run):
    """The run's configuration as its trainer read it (``FinetuneConfig`` or ``TrainConfig``), from ``config.yaml``."""
    from .config import FinetuneConfig, TrainConfig, load_config

    return load_config(_config_file(run, CONFIG), cls=FinetuneConfig if is_finetuning(run) else TrainConfig)


def pretrain_config(run):
    """The ``TrainConfig`` of the pretraining a fine-tuning run started from (its ``pretrain_config.yaml``);
    ``ValueError`` for a run that is not a fine-tuning."""
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
    """How the book names a model configuration: its registered type, told apart where one type holds several of
    the paper's models (a DiffEqFormer with time-independent weights is the weight-shared model; its Llama variant
    is DiffEqFormer-Llama)."""
    kind = model_type(model)
    if kind != "diffeqformer":
        return {"gpt2": "GPT-2", "llama": "Llama"}.get(kind, kind)
    if not getattr(model, "time_dependent", True):
        return "weight-shared"
    return "DiffEqFormer-Llama" if getattr(model, "variant", "") == "llama" else "DiffEqFormer"


def load_model(run, *, merged: bool = False):
    """The trained model of a finished run, rebuilt from its configuration (a fine-tuning's from
    ``pretrain_config.yaml``, adapted: ``config.adapt``), its attention routed as in training. ``merged=True`` folds a
    LoRA fine-tuning's adapters into the weights (``levanter.adaptor.lora.merge_lora_modules``)."""
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
    """Parameters of a pretraining run's model, counted on a shape-only build of its config (nothing computed)."""
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


def median_throughput(metrics) -> Optional[float]:
    """Training tokens/s of a run: the median of Levanter's per-step ``throughput/tokens_per_second`` after the
    first tenth of the steps (compilation, warm-up), from ``read_metrics``."""
    column = "throughput/tokens_per_second"
    if column not in metrics or metrics[column].dropna().empty:
        return None
    values = metrics[column].dropna()
    values = values[values.index >= values.index.max() / 10]
    return float(values.median())


def initial_eval_loss(run) -> Optional[float]:
    """The validation loss of a fine-tuning's pretrained model (logged at step -1)."""
    metrics = read_metrics(run)
    if -1 not in metrics.index or "eval/loss" not in metrics:
        return None
    return float(metrics.loc[-1, "eval/loss"])


def perplexity(loss: Optional[float]) -> Optional[float]:
    r"""The perplexity :math:`e^{L}` of a mean next-token loss :math:`L` in nats; None where there is no loss, or where
    :math:`e^{L}` is not a finite float (a diverged run's, which ``finish_run`` refuses)."""
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
    Vocab: Any
    """Its vocabulary axis (``haliax.Axis``), as it was trained."""


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
               f"python -m diffeqformer.train --config {pre_path} --run_dir {pre_dir}")
        )
    summary = read_complete(pre_dir)
    digest = pretraining_hash(config)
    if summary.get("config_hash") != digest:
        raise ValueError(
            f"pretrain.config: the run in {pre_dir} was trained with another configuration "
            f"(hash {summary.get('config_hash')}) than {pre_path} (hash {digest})"
        )
    return Pretraining(pre, pre_dir, digest, Axis("vocab", summary["vocab_size"]))


# ------------------------------------------------------------------------------------------------- the lifecycle


@contextlib.contextmanager
def lock(run_dir: Path):
    """Hold ``run_dir/.lock`` while training it, so that a second process training the same run waits for the first.
    In a run of several processes only process 0 locks, once all have started (``devices.start``): the others must
    not wait for it, since it waits for them in its first collective."""
    run_dir.mkdir(parents=True, exist_ok=True)
    if not devices.is_primary():
        yield
        return
    with paths.exclusive(run_dir / LOCK, f"{run_dir}: another process is training this run; waiting for it to end"):
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
            raise ValueError(
                f"{run_dir} holds a run with another configuration ({previous.removeprefix('# ')}); "
                "choose another --name/--run_dir or delete it"
            )
    if devices.is_primary():
        paths.write_atomic(saved, f"{HASH_PREFIX}{digest}\n" + dump_config(config))
    return None


@dataclass
class Opened:
    """The runs a trainer trains together (one, or a population's members), locked (``opened``)."""

    configs: Sequence["Config"]
    dirs: list[Path]
    digests: list[str]
    summaries: list[Optional[dict]]
    """Each run's ``complete.json`` if it is already complete for its hash, else None."""
    start: float = field(default_factory=time.time)
    """When the runs were opened (``finish`` records the wall time since)."""

    @property
    def finished(self) -> bool:
        """Whether every run is complete for its hash: there is nothing to train."""
        return all(s is not None for s in self.summaries)

    @property
    def checkpoints(self) -> Path:
        """Where the trainer keeps its checkpoints: in the first run's directory."""
        return self.dirs[0] / CHECKPOINTS

    def finish(self, k: int, model, **extra) -> dict:
        """``finish_run`` of run ``k``."""
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
        if pretraining_dir is not None and not all(s is not None for s in summaries) and devices.is_primary():
            pretrained = (pretraining_dir if isinstance(pretraining_dir, (list, tuple))
                          else [pretraining_dir] * len(dirs))
            for run_dir, pre_dir in zip(dirs, pretrained):
                paths.write_atomic(run_dir / PRETRAIN_CONFIG, (pre_dir / CONFIG).read_text())
        yield Opened(configs, dirs, list(digests), summaries)


def diverged(run_dir: Path, step: int, loss: float) -> SystemExit:
    """The end of a run whose loss at ``step`` has no finite perplexity: one line, no traceback (``SystemExit``),
    no ``complete.json``. Another learning rate is another configuration, which ``start_run`` refuses beside this
    one's checkpoints: hence delete, then train."""
    return SystemExit(
        f"{run_dir}: training diverged at step {step} (loss {loss:.4g}), so the run is not complete: lower "
        f"optimizer.learning_rate (or clip gradients with optimizer.max_grad_norm), delete {run_dir} and train again"
    )


def finish_run(config: "Config", run_dir: Path, model, digest: str, start: float, **extra) -> dict:
    """Save the model, then write ``complete.json`` (the metrics' summary plus ``extra``) and return it; a last loss
    without a finite perplexity ends the run first (``diverged``). Every process of a run calls it: they wait until
    process 0 has logged the last metrics (``devices.barrier``), gather the model (``devices.host_copy``), and
    process 0 writes the files."""
    devices.barrier(f"trained {config.name}")
    metrics = read_metrics(run_dir)
    for column in ("train/loss", "eval/loss"):
        logged = metrics[column].dropna() if column in metrics else ()
        if len(logged) and perplexity(float(logged.iloc[-1])) is None:
            raise diverged(run_dir, int(logged.index[-1]), float(logged.iloc[-1]))
    model = devices.host_copy(model)
    summary = {**_summary(config, metrics, digest, time.time() - start), **extra}
    if devices.is_primary():
        _save_model(model, run_dir / MODEL)
        paths.write_atomic(run_dir / COMPLETE, json.dumps(summary, indent=1) + "\n")
    devices.barrier(f"finished {config.name}")
    return summary


def _save_model(model, path: Path) -> None:
    import equinox as eqx

    tmp = path.with_suffix(".tmp")
    eqx.tree_serialise_leaves(tmp, model)
    tmp.replace(path)


def _summary(config: "Config", metrics, digest: str, wall_s: float) -> dict:
    import jax

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
        "processes": jax.process_count(),
        "devices": jax.device_count(),
    }


def _config_file(run, name: str) -> Path:
    path = run_path(run) / name
    if not path.exists():
        raise FileNotFoundError(f"run {run}: no {name} in {path.parent}")
    return path
