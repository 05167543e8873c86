"""Every YAML file in config/ parses into its dataclass; bad input is rejected before any compute."""

import re

import pytest
from levanter.models.gpt2 import Gpt2Config
from levanter.models.llama import LlamaConfig
from levanter.optim.config import AdamConfig
from levanter.trainer import TrainerConfig

from diffeqformer import DiffEqFormerConfig, paths
from diffeqformer.train import DataConfig, TrainConfig, load_config, main, validate

CONFIGS = sorted(p for p in paths.CONFIG.rglob("*.yaml") if not p.name.startswith("finetune_"))  # finetune configs: test_finetune
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
    """load_config skips draccus's command-line parser (1.6 s a call): the result must be draccus.parse's."""
    import draccus

    from diffeqformer.train import config_hash, dump_config

    overrides = OVERRIDES if "diffeqformer" in name else OVERRIDES[:6] + OVERRIDES[-2:]  # no DiffEqFormer fields
    expected = draccus.parse(TrainConfig, config_path=str(paths.CONFIG / name), args=list(overrides))
    config = load_config(paths.CONFIG / name, overrides)
    assert config == expected
    assert dump_config(config) == dump_config(expected)
    assert config_hash(config) == config_hash(expected)


@pytest.mark.parametrize("overrides, message", [
    (["--model.time_embed_dimx", "4"], "time_embed_dimx"),
    (["--trainer.seed"], "--trainer.seed has no value"),
    (["trainer.seed", "1"], "trainer.seed"),
    (["--trainer.seed", "x"], "trainer"),
])
def test_a_bad_override_is_refused_by_name(overrides, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        load_config(paths.CONFIG / "smoke" / "diffeqformer.yaml", overrides)


SMOKE = paths.CONFIG / "smoke" / "diffeqformer.yaml"


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["--trainer.num_train_steps", "0"], "num_train_steps"),
        (["--trainer.num_train_steps", "-5"], "num_train_steps"),
        (["--model.sinusoidal_dim", "7"], "sinusoidal_dim"),
        (["--model.time_embed_dim", "0"], "time_embed_dim"),
        (["--model.num_heads", "3"], "divisible"),
        (["--data.dataset", "imagenet"], "data.dataset"),
        (["--data.domain", "poetry"], "data.domain"),
        (["--data.vocab_size", "100"], "vocab_size"),
        (["--optimizer.learning_rate", "-1"], "optimizer.learning_rate must be a positive number, got -1"),
        (["--optimizer.learning_rate", "0"], "optimizer.learning_rate"),
        (["--optimizer.learning_rate", "nan"], "optimizer.learning_rate"),
        (["--optimizer.weight_decay", "-0.1"], "optimizer.weight_decay must be at least 0"),
        (["--optimizer.beta1", "1.0"], r"optimizer.beta1 must be in \[0, 1\)"),
        (["--optimizer.beta2", "-0.5"], "optimizer.beta2"),
        (["--optimizer.epsilon", "0"], "optimizer.epsilon"),
        (["--optimizer.max_grad_norm", "-1"], "optimizer.max_grad_norm"),
        (["--optimizer.min_lr_ratio", "2"], r"optimizer.min_lr_ratio must be in \[0, 1\]"),
        (["--optimizer.warmup", "-0.1"], "optimizer.warmup"),
        (["--optimizer.warmup", "2.5"], "optimizer.warmup"),
    ],
)
def test_bad_input_is_rejected_before_compute(tmp_path, monkeypatch, overrides, message):
    # before compute: Levanter is never initialised (no trainer, no compilation)
    monkeypatch.setattr("levanter.trainer.initialize", _compute_started)
    with pytest.raises(Exception, match=message):
        config = load_config(SMOKE, overrides + ["--run_dir", str(tmp_path / "run")])
        main(config)
    assert not (tmp_path / "run").exists()  # nothing half-written


def _compute_started(*args, **kwargs):
    raise AssertionError("the bad input reached levanter.trainer.initialize: it was not rejected before compute")


def test_missing_config_file():
    with pytest.raises(FileNotFoundError, match="not_there.yaml"):
        load_config(paths.CONFIG / "smoke" / "not_there.yaml")


@pytest.mark.parametrize("path", CONFIGS, ids=[str(p.relative_to(paths.CONFIG)) for p in CONFIGS])
def test_saved_config_reloads_to_the_same_model(path, tmp_path):
    """What a run saves (config.yaml) is plain YAML that rebuilds the same model and data config."""
    from diffeqformer.train import dump_config

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

    from diffeqformer.train import config_hash

    config = load_config(paths.CONFIG / "smoke" / "diffeqformer.yaml")
    explicit = dataclasses.replace(config, model=dataclasses.replace(config.model, random_step_offset=False))
    changed = dataclasses.replace(config, model=dataclasses.replace(config.model, random_step_offset=True))
    assert config_hash(explicit) == config_hash(config)
    assert config_hash(changed) != config_hash(config)
