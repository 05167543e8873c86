"""The gpu preset (issue 35): the cpu preset's runs, notebooks and seeds, larger, offline by default; one switch moves
its language models to WikiText-103, which fails offline with the project's message. Checked through the registry
(``presets.presets()["gpu"]``) and the workflow's plan of it (``plan.make("gpu")``: its trainings and notebooks)."""

import os
import re
import subprocess
import sys

import jax.numpy as jnp
import pytest

from diffeqformer import paths
from diffeqformer.data.corpora import DatasetUnavailableError
from diffeqformer.config import METHODS, FinetuneConfig, pretraining_of, run_dir_of
from diffeqformer.finetune import finetune_grid
from diffeqformer.workflow import plan, presets
from diffeqformer.workflow.presets import Run
from diffeqformer.config import load_config, validate, validate_data, validate_optimizer, validate_trainer

CPU, GPU = paths.CONFIG / "cpu", paths.CONFIG / "gpu"
OFFLINE = ("shakespeare", "synthetic")
WIDTH, TOKENS = 4, 10
"""The issue's floor: the gpu preset's models at least 4 times the cpu preset's width and 10 times its tokens."""


MARKER = re.compile(r"runs/(gpu-[\w.-]+)/trained-[0-9a-f]{16}\.json")
"""A training job's output: ``runs/<run>/trained-<16 hex digits of its config hash>.json``."""


@pytest.fixture(scope="module")
def gpu_plan():
    """The workflow's plan of the gpu preset (``plan.make``: checked, resolved; nothing is trained or written)."""
    return plan.make("gpu")


def _runs_of(entries) -> dict[str, Run]:
    """Every run of registry entries by its run directory (``runs/<name>``), as the plan names it."""
    return {paths.home_relative(run_dir_of(r.load())): r for r in plan.collect_runs(list(entries.values()))}


def _load(path):
    """A config file of either kind: a fine-tuning template, or a training."""
    return load_config(path, cls=FinetuneConfig) if path.name.startswith("finetune_") else load_config(path)


def _check(config) -> None:
    """``configs.validate``, or for a fine-tuning what ``finetune.validate`` checks before it needs the finished
    pretraining (trainer, optimiser, data, method, steps, the pretraining's own config)."""
    if not isinstance(config, FinetuneConfig):
        validate(config)
        return
    validate_trainer(config.trainer)
    validate_optimizer(config.optimizer)
    validate_data(config.data)
    assert config.method in METHODS and (config.steps is None or config.steps >= 1)
    validate(pretraining_of(config)[0])


def _tokens(config) -> int:
    """Tokens a run trains on: steps x sequences x their length (a fine-tuning's length is its pretraining's)."""
    model = pretraining_of(config)[0].model if isinstance(config, FinetuneConfig) else config.model
    t = config.trainer
    return t.num_train_steps * t.train_batch_size * model.max_seq_len


def test_the_gpu_plan_builds(gpu_plan):
    """Every notebook of the cpu preset, in its order; every run a notebook reads trained by one job of the plan
    (a population's members by one), each writing its marker; a fine-tuning after its pretraining's job."""
    assert [j["name"] for j in gpu_plan["notebooks"]] == list(presets.presets()["gpu"]) == list(presets.presets()["cpu"])
    trainings = gpu_plan["trainings"]
    assert trainings and all(len(u["runs"]) == len(u["outputs"]) == len(u["hashes"]) for u in trainings)
    outputs = [o for u in trainings for o in u["outputs"]]
    assert len(set(outputs)) == len(outputs) and all(MARKER.fullmatch(o) for o in outputs), outputs
    runs = _runs_of(presets.presets()["gpu"])
    assert {r for u in trainings for r in u["runs"]} == set(runs)
    for job in gpu_plan["notebooks"]:
        assert job["inputs"] and set(job["inputs"]) <= set(outputs), job["name"]
    finetunings = [u for u in trainings if runs[u["runs"][0]].module == "finetune"]
    assert finetunings and all(u["after"] and set(u["after"]) <= set(outputs) for u in finetunings)
    assert not [u for u in trainings if u not in finetunings and u["after"]]


def test_every_gpu_config_validates_and_mirrors_the_cpu_presets():
    gpu = sorted(p.name for p in GPU.glob("*.yaml"))
    assert gpu == sorted(p.name for p in CPU.glob("*.yaml"))
    for name in gpu:
        config = _load(GPU / name)
        _check(config)
        assert config.name.startswith("gpu-"), name
        if config.data.dataset != "synthetic":  # bfloat16 compute, float32 parameters, as the paper trains
            assert config.trainer.mp.compute_dtype == jnp.bfloat16, name
            assert config.trainer.mp.param_dtype == jnp.float32, name


def test_every_gpu_run_is_offline_by_default(gpu_plan):
    runs = _runs_of(presets.presets()["gpu"])
    for run_dir in (r for u in gpu_plan["trainings"] for r in u["runs"]):
        config = runs[run_dir].load()
        assert config.data.dataset in OFFLINE, run_dir
        if not isinstance(config, FinetuneConfig):  # a fine-tuning's overrides: test_every_verdict_has_...
            validate(config)
    assert "paper_tasks" not in presets.presets()["gpu"]["f11_downstream"]  # the held-out tasks alone, offline


def _skeleton(value):
    """A notebook's parameters with each run replaced by its number of seeds (its population's size, else 1)."""
    if isinstance(value, Run):
        return ("seeds", len(value.population) or 1)
    if isinstance(value, dict):
        return {k: _skeleton(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_skeleton(v) for v in value]
    return None


def _setting(name: str) -> str:
    """A Fig. 5 run's setting: its name without preset, Euler steps N and seed."""
    return re.sub(r"-n\d+|-seed\d+$", "", name.split("-", 1)[1])


def test_every_verdict_has_the_cpu_presets_seeds():
    cpu, gpu = presets.presets()["cpu"], presets.presets()["gpu"]
    assert list(gpu) == list(cpu)
    for notebook in cpu:
        if notebook == "f7_finetuning":  # keyed by run name: compare settings and seeds
            continue
        assert set(gpu[notebook]) == set(cpu[notebook]), notebook
        assert _skeleton(gpu[notebook]) == _skeleton(cpu[notebook]), notebook
    grids = {p: list(e["f7_finetuning"]["runs"].values()) for p, e in (("cpu", cpu), ("gpu", gpu))}
    for preset, runs in grids.items():  # every fine-tuning setting trained as a population of the same size
        assert {len(r.population) for r in runs if r.module == "finetune"} == {presets.CPU_SEEDS}, preset
    settings = {p: {_setting(r.load().name) for r in runs} for p, runs in grids.items()}
    assert settings["gpu"] == settings["cpu"]  # both directions, both methods, the pretrainings, the scratch runs
    directions = {(r.load().data.domain, pretraining_of(r.load())[0].data.domain)
                  for r in grids["gpu"] if r.module == "finetune"}
    assert directions == {("plays", "prose"), ("prose", "plays")}
    assert len(finetune_grid("gpu")) == len(grids["gpu"])


@pytest.mark.parametrize("name", sorted(p.name for p in CPU.glob("*.yaml")))
def test_width_and_tokens_per_model_against_the_cpu_preset(name):
    cpu, gpu = _load(CPU / name), _load(GPU / name)
    if cpu.data.dataset == "synthetic":  # F5's benchmark model: the cpu preset's, which learns both tasks
        assert (gpu.model, _tokens(gpu), gpu.optimizer) == (cpu.model, _tokens(cpu), cpu.optimizer)
        return
    assert _tokens(gpu) >= TOKENS * _tokens(cpu), name
    if isinstance(gpu, FinetuneConfig):
        cpu, gpu = pretraining_of(cpu)[0], pretraining_of(gpu)[0]
    assert gpu.model.hidden_dim >= WIDTH * cpu.model.hidden_dim, name
    assert (gpu.model.num_layers, gpu.data.domain) == (cpu.model.num_layers, cpu.data.domain), name


def test_wikitext_fails_offline_with_the_projects_message(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    config = load_config(GPU / "diffeqformer.yaml", ["--data.dataset", "wikitext103"])
    validate(config)
    with pytest.raises(DatasetUnavailableError, match="'wikitext103' needs the Hugging Face hub.*offline corpus"):
        config.data.levanter_config()


@pytest.mark.slow  # a fresh Python that imports JAX and Levanter: 30 s
def test_the_training_command_names_the_missing_hub_in_one_line(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "JAX_PLATFORMS": "cpu", "DIFFEQFORMER_HOME": str(tmp_path)}
    out = subprocess.run([sys.executable, "-m", "diffeqformer.train", "--config", str(GPU / "diffeqformer.yaml"),
                          "--data.dataset", "wikitext103", "--run_dir", str(tmp_path / "run")],
                         capture_output=True, text=True, env=env, cwd=paths.REPO, timeout=300)
    assert out.returncode != 0 and "needs the Hugging Face hub" in out.stderr
    assert "Traceback" not in out.stderr
