"""Every YAML file in config/ parses into its dataclass; bad input is rejected before any compute."""

import re
import sys

import forked
import pytest
from levanter.models.gpt2 import Gpt2Config
from levanter.models.llama import LlamaConfig
from levanter.optim.config import AdamConfig
from levanter.trainer import TrainerConfig

from diffeqformer import DiffEqFormerConfig, paths, train
from diffeqformer.config import DataConfig, TrainConfig, load_config, validate

# finetune configs: test_finetune
CONFIGS = sorted(p for p in paths.CONFIG.rglob("*.yaml") if not p.name.startswith("finetune_"))
PRESETS = ("smoke", "cpu", "gpu", "paper")


def test_every_preset_has_configs():
    for preset in PRESETS:
        assert list((paths.CONFIG / preset).glob("*.yaml")), f"no config in config/{preset}"
    assert (paths.CONFIG / "smoke" / "diffeqformer.yaml").exists()


@pytest.mark.parametrize("path", CONFIGS, ids=[str(p.relative_to(paths.CONFIG)) for p in CONFIGS])
def test_yaml_parses_into_train_config(path):
    config = load_config(path)
    assert isinstance(config, TrainConfig)
    assert isinstance(config.data, DataConfig)
    assert isinstance(config.model, (DiffEqFormerConfig, Gpt2Config, LlamaConfig))
    assert isinstance(config.trainer, TrainerConfig)
    assert isinstance(config.optimizer, AdamConfig)
    assert config.name and config.name.startswith(path.parent.name)
    validate(config)
    # the model type in the file is the one that was built
    assert f"type: {config.model.get_choice_name(type(config.model))}" in path.read_text()


def test_overrides_in_draccus_style():
    config = load_config(paths.CONFIG / "smoke" / "diffeqformer.yaml", ["--model.time_embed_dim", "32"])
    assert config.model.time_embed_dim == 32


# Overrides of every kind the pipeline's registry passes: a name, ints, floats, bools, a string choice, the form
# with "=", and a list.
OVERRIDES = ["--name", "cpu-x", "--trainer.seed", "2", "--optimizer.beta2", "0.95", "--model.time_embed_dim=4",
             "--model.hypernet", "shared_mlp", "--model.random_step_offset", "True",
             "--trainer.checkpointer.keep", "[{every: 50}]"]


@pytest.mark.parametrize("name", ["cpu/diffeqformer.yaml", "cpu/gpt2.yaml", "smoke/synthetic_diffeqformer.yaml"])
def test_load_config_is_what_draccus_parses(name):
    """load_config parses with draccus's parser, built once a class: the result must be draccus.parse's."""
    import draccus

    from diffeqformer.config import config_hash, dump_config

    overrides = OVERRIDES if "diffeqformer" in name else OVERRIDES[:6] + OVERRIDES[-2:]  # no DiffEqFormer fields
    expected = draccus.parse(TrainConfig, config_path=str(paths.CONFIG / name), args=list(overrides))
    config = load_config(paths.CONFIG / name, overrides)
    assert config == expected
    assert dump_config(config) == dump_config(expected)
    assert config_hash(config) == config_hash(expected)


SMOKE = paths.CONFIG / "smoke" / "diffeqformer.yaml"

PROBES = [
    # overrides that name no field, or no value
    (["--model.time_embed_dimx", "4"], "time_embed_dimx"),
    (["--trainer.seed"], "--trainer.seed: expected one argument"),  # argparse's wording
    (["trainer.seed", "1"], "trainer.seed"),
    (["--trainer.seed", "x"], "trainer.seed"),
    (["--trainer.eval_batch_size", "8"], "eval_batch_size"),  # Levanter's is per_device_eval_parallelism
    # trainer
    (["--trainer.num_train_steps", "0"], "trainer.num_train_steps"),
    (["--trainer.num_train_steps", "-5"], "trainer.num_train_steps"),
    (["--trainer.num_train_steps", "1.5"], "trainer.num_train_steps"),
    (["--trainer.num_train_steps", "null"], "trainer.num_train_steps must be a positive integer, got None"),
    (["--trainer.train_batch_size", "0"], "trainer.train_batch_size"),
    (["--trainer.train_batch_size", "2.5"], "trainer.train_batch_size"),
    (["--trainer.steps_per_eval", "0"], "trainer.steps_per_eval"),
    (["--trainer.max_eval_batches", "0"], r"trainer.max_eval_batches \(or null .*\) must be a positive integer"),
    (["--trainer.max_eval_batches", "-1"], "trainer.max_eval_batches"),
    (["--trainer.seed", "1.5"], "trainer.seed"),
    (["--trainer.seed", "null"], "trainer.seed must be an integer, got None"),
    (["--trainer.per_device_parallelism", "0"], r"trainer.per_device_parallelism \(or -1\)"),
    (["--trainer.per_device_eval_parallelism", "-2"], "trainer.per_device_eval_parallelism"),
    # model
    (["--model.type", "transformer_xl"], "model.*transformer_xl"),
    (["--model.sinusoidal_dim", "7"], "sinusoidal_dim"),
    (["--model.time_embed_dim", "0"], "time_embed_dim"),
    (["--model.num_heads", "3"], "divisible"),
    # data
    (["--data.dataset", "imagenet"], "data.dataset"),
    (["--data.domain", "poetry"], "data.domain"),
    (["--data.vocab_size", "100"], "data.vocab_size must be an integer >= 257"),
    (["--data.vocab_size", "x"], "data.vocab_size"),
    (["--data.shuffle", "maybe"], "data.shuffle"),
    # optimizer
    (["--optimizer.type", "sgdx"], "optimizer.*sgdx"),
    (["--optimizer.learning_rate", "-1"], "optimizer.learning_rate must be a positive number, got -1"),
    (["--optimizer.learning_rate", "0"], "optimizer.learning_rate"),
    (["--optimizer.learning_rate", "nan"], "optimizer.learning_rate"),
    (["--optimizer.learning_rate", "inf"], "optimizer.learning_rate"),
    (["--optimizer.learning_rate", "fast"], "optimizer.learning_rate"),
    (["--optimizer.weight_decay", "-0.1"], "optimizer.weight_decay must be at least 0"),
    (["--optimizer.beta1", "1.0"], r"optimizer.beta1 must be in \[0, 1\)"),
    (["--optimizer.beta2", "-0.5"], "optimizer.beta2"),
    (["--optimizer.epsilon", "0"], "optimizer.epsilon"),
    (["--optimizer.max_grad_norm", "-1"], "optimizer.max_grad_norm"),
    (["--optimizer.min_lr_ratio", "2"], r"optimizer.min_lr_ratio must be in \[0, 1\]"),
    (["--optimizer.warmup", "-0.1"], "optimizer.warmup"),
    (["--optimizer.warmup", "2.5"], "optimizer.warmup"),
    # the run
    (["--name", ""], "name must be a non-empty string"),
]
"""Bad input on the command line, and what its error must say (a regex): the field."""


def _error_of(argv, monkeypatch) -> str:
    """The error ``python -m diffeqformer.train`` ends with for ``argv``, run in this process: a ``SystemExit``
    whose message Python prints as it is, with no traceback; checked to be one line, and to come before compute."""
    monkeypatch.setattr("levanter.trainer.initialize", _compute_started)
    monkeypatch.setattr(train, "use_compilation_cache", lambda *args: None)
    with pytest.raises(SystemExit) as exit_:
        train.cli(argv)
    message = str(exit_.value.code)
    assert message.startswith(("error: ", "usage: ")) and "\n" not in message, message
    return message


@pytest.mark.parametrize("overrides,message", PROBES, ids=[" ".join(o) for o, _ in PROBES])
def test_bad_input_is_one_line_naming_the_field_before_compute(tmp_path, monkeypatch, overrides, message):
    # before compute: Levanter is never initialised (no trainer, no compilation)
    error = _error_of(["--config", str(SMOKE), "--run_dir", str(tmp_path / "run"), *overrides], monkeypatch)
    assert re.search(message, error), error
    assert not (tmp_path / "run").exists()  # nothing half-written


BAD_FILES = {
    "missing": (None, "config file not found: .*missing"),
    "a directory": (None, r"config file not found: .*a directory \(a directory\)"),
    "not YAML": ("name: [cpu\n", r"bad.yaml: not valid YAML \(.*line 1, column 7"),
    "a list": ("- name: cpu\n", "bad.yaml: a config file is a mapping of fields .*got a list"),
    "not text": (b"\xff\xfe\x00name", "bad.yaml: not valid YAML"),
}


@pytest.mark.parametrize("case", BAD_FILES)
def test_a_bad_config_file_is_one_line_naming_it(tmp_path, monkeypatch, case):
    content, message = BAD_FILES[case]
    path = tmp_path / ("bad.yaml" if content is not None else case)
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    elif case == "a directory":
        path.mkdir()
    assert re.search(message, _error_of(["--config", str(path)], monkeypatch))


def test_no_config_file_is_the_usage(monkeypatch):
    assert "--config without a file" in _error_of(["--config"], monkeypatch)
    assert _error_of([], monkeypatch).startswith("usage: python -m diffeqformer.train --config")


def test_bad_input_ends_without_a_traceback(tmp_path):
    """As a user sees it: the process prints one line and exits with status 1."""
    out = forked.run([sys.executable, "-m", "diffeqformer.train", "--config", str(SMOKE), "--run_dir",
                      str(tmp_path / "run"), "--trainer.max_eval_batches", "0"], timeout=300)
    assert out.returncode == 1
    assert out.stderr.strip().splitlines() == ["error: trainer.max_eval_batches (or null for the whole validation "
                                               "split) must be a positive integer, got 0"]


def _compute_started(*args, **kwargs):
    raise AssertionError("the bad input reached levanter.trainer.initialize: it was not rejected before compute")


@pytest.mark.parametrize("path", CONFIGS, ids=[str(p.relative_to(paths.CONFIG)) for p in CONFIGS])
def test_saved_config_reloads_to_the_same_model(path, tmp_path):
    """What a run saves (config.yaml) is plain YAML that rebuilds the same model and data config."""
    from diffeqformer.config import dump_config

    config = load_config(path)
    text = dump_config(config)
    assert "!!python" not in text
    saved = tmp_path / "config.yaml"
    saved.write_text(text)
    again = load_config(saved)
    assert again.model == config.model and again.data == config.data


def test_config_hash_ignores_model_defaults_but_not_changes():
    """A model field at its default does not enter the hash (new options keep old runs valid); a changed one does."""
    import dataclasses

    from diffeqformer.config import config_hash, hashed_tree

    config = load_config(paths.CONFIG / "smoke" / "diffeqformer.yaml")
    explicit = dataclasses.replace(config, model=dataclasses.replace(config.model, random_step_offset=False))
    changed = dataclasses.replace(config, model=dataclasses.replace(config.model, random_step_offset=True))
    assert config_hash(explicit) == config_hash(config)
    assert config_hash(changed) != config_hash(config)
    # the data's tuning split likewise: hashed when set, so that runs trained before the option keep their hashes
    tuning = dataclasses.replace(config, data=dataclasses.replace(config.data, tuning=True))
    assert config_hash(tuning) != config_hash(config)
    assert "tuning" not in hashed_tree(config)["data"] and hashed_tree(tuning)["data"]["tuning"] is True


def test_config_hash_leaves_out_the_devices_and_the_checkpoints():
    """A run's identity does not depend on how it is laid over devices and processes, nor on when it is checkpointed
    (``config.TRAINER_LAYOUT``): a run resumes on another number of devices. What it trains on and evaluates does."""
    from diffeqformer.config import FinetuneConfig, config_hash

    pretraining = "7e5f0a1b2c3d4e5f"
    for path, cls, extra in ((paths.CONFIG / "smoke" / "diffeqformer.yaml", None, {}),
                             (paths.CONFIG / "smoke" / "finetune_diffeqformer_lora.yaml", FinetuneConfig,
                              {"pretrain_config_hash": pretraining})):
        def digest(*overrides):
            config = load_config(path, list(overrides), **({"cls": cls} if cls else {}))
            return config_hash(config, **extra)

        base = digest()
        for layout in (["--trainer.mesh.axes", "{model: 2}"], ["--trainer.distributed.num_processes", "2"],
                       ["--trainer.per_device_parallelism", "2"], ["--trainer.checkpointer.save_interval", "1h"],
                       ["--trainer.require_accelerator", "true"]):
            assert digest(*layout) == base, layout
        for training in (["--trainer.seed", "5"], ["--trainer.per_device_eval_parallelism", "2"],
                         ["--trainer.train_batch_size", "8"]):
            assert digest(*training) != base, training
