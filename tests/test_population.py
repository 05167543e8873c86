"""diffeqformer.population at smoke size: each member trains like its solo run (with dropout), ends as an ordinary
run, is not trained again, resumes bit-identically after SIGKILLs, and members that differ in more than their seed are
refused; a member of a population of LoRA fine-tunings fine-tunes like its solo fine-tuning."""

import json
import os
import sys

import equinox as eqx
import jax
import numpy as np
import forked
import pytest
from levanter.models.gpt2 import Gpt2LMHeadModel

from interrupt import check_kills, kill_seed, run_with_kills

from diffeqformer import config as configs
from diffeqformer import paths, population, runs
from diffeqformer.runs import load_model, read_metrics

SMOKE = paths.CONFIG / "smoke" / "diffeqformer.yaml"


def _env(run_dir):
    return {**os.environ, "JAX_PLATFORMS": "cpu"}  # the test run's persistent compilation cache (conftest)


def _population_cmd(run_dir, seeds=2):
    """The smoke DiffEqFormer's population from the command line, with ``DROPOUT`` (``trained``'s config)."""
    return [sys.executable, "-m", "diffeqformer.population", "--config", str(SMOKE), "--seeds", str(seeds),
            "--run_dir", str(run_dir), *DROPOUT]


def _run(cmd, run_dir):
    out = forked.run(cmd, _env(run_dir))
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def _leaves(run_dir):
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(eqx.filter(load_model(run_dir), eqx.is_array))]


def _assert_follows_solo(a, b, member, solo, *, leaves: int):
    """A population member's parameters ``a`` are its solo run's ``b`` (more than ``leaves`` arrays of them) to 1e-4,
    and its train and eval losses are the solo run's to a relative 1e-5 at the same steps; returns its metrics."""
    assert len(a) == len(b) > leaves
    worst = max(float(np.max(np.abs(x - y))) for x, y in zip(a, b))
    assert worst < 1e-4, (str(member), worst)
    mine, its = read_metrics(member), read_metrics(solo)
    for column in ("train/loss", "eval/loss"):
        x, y = mine[column].dropna(), its[column].dropna()
        assert list(x.index) == list(y.index) and len(x) >= 2
        np.testing.assert_allclose(x.to_numpy(), y.to_numpy(), rtol=1e-5, err_msg=f"{member} {column}")
    return mine


DROPOUT = ("--model.embed_pdrop", "0.1", "--model.resid_pdrop", "0.1")
"""Embedding and residual dropout: a member must draw its masks from the keys its solo run draws them from."""

_WITH_DROPOUT = """
import sys
from diffeqformer import config as configs, population, train, use_onednn
use_onednn()  # the kernels of the command line's training, which the population resumed below goes through
config, root, dropout = sys.argv[1], sys.argv[2], sys.argv[3:]
population.main(population.members_of(configs.load_config(config, dropout + ["--run_dir", root + "/pop"]), 2))
for seed in (0, 1):
    train.main(configs.load_config(config, dropout + ["--run_dir", f"{root}/solo{seed}", "--trainer.seed", str(seed)]))
"""


def _train_with_dropout(config, root):
    """A population of seeds 0 and 1 of ``config`` with ``DROPOUT`` (``root/pop``, ``root/pop-seed1``) and the same
    config trained alone with each seed (``root/solo0``, ``root/solo1``): one process trains all four, since the
    interpreter's start-up is most of a smoke run."""
    _run([sys.executable, "-c", _WITH_DROPOUT, str(config), str(root), *DROPOUT], root / "pop")
    return root


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The smoke DiffEqFormer's population with dropout and its two solo runs (``_train_with_dropout``), which the
    tests below check, rerun and resume."""
    return _train_with_dropout(SMOKE, tmp_path_factory.mktemp("population"))


def _parameters_the_loss_depends_on(run_dir):
    """A run's parameters, less the key bias of Levanter's GPT-2 (``c_attn.bias`` at ``qkv`` 1): adding one vector to
    every key adds a constant to each query's scores, which the softmax ignores, so that bias's gradient is float32
    rounding, which Adam scales up to steps of the learning rate's size (measured: the bias ends within 4e-5 of the
    solo run's, and is itself of that size)."""
    model = load_model(run_dir)
    if isinstance(model, Gpt2LMHeadModel):
        bias = model.transformer.blocks.stacked.attn.c_attn.bias
        model = eqx.tree_at(lambda m: m.transformer.blocks.stacked.attn.c_attn.bias, model,
                            np.delete(np.asarray(bias.array), 1, axis=bias.axis_indices("qkv")))
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(eqx.filter(model, eqx.is_array))]


@pytest.mark.parametrize("model", ["gpt2", "diffeqformer"])
def test_with_dropout_each_member_trains_like_its_solo_run(model, tmp_path, request):
    """Member k of a population has its own initialisation, batches, Adam state and clipping, and with embedding and
    residual dropout draws its masks from the keys its solo run draws them from (``PopulationTrainer``): after 20
    steps both members' parameters are their solo runs' up to float32 rounding (the population's program sums and
    fuses differently), and so are their losses. (Members whose keys were split from one key of the step ended 7e-2
    apart.)"""
    if model == "diffeqformer":
        root = request.getfixturevalue("trained")
    else:
        root = _train_with_dropout(paths.CONFIG / "smoke" / f"{model}.yaml", tmp_path)
    for member, solo in (("pop", "solo0"), ("pop-seed1", "solo1")):
        a, b = _parameters_the_loss_depends_on(root / member), _parameters_the_loss_depends_on(root / solo)
        # measured: 1.7e-07 (GPT-2), 3.5e-06 (DiffEqFormer) after 20 steps
        _assert_follows_solo(a, b, root / member, root / solo, leaves=5)


def test_members_end_as_ordinary_runs_of_their_own(trained):
    first, second = trained / "pop", trained / "pop-seed1"
    summaries = [json.loads((d / "complete.json").read_text()) for d in (first, second)]
    assert [s["population"]["member"] for s in summaries] == [0, 1]
    assert all(s["population"]["seeds"] == [0, 1] for s in summaries)
    assert (first / "checkpoints").is_dir() and not (second / "checkpoints").exists()
    assert load_model(first).config.time_embed_dim == 4
    # the same config trained alone is another run: another hash
    same = configs.load_config(SMOKE, [*DROPOUT, "--name", "smoke-diffeqformer-seed1", "--trainer.seed", "1"])
    assert summaries[1]["config_hash"] == configs.config_hash(same, population=[0, 1]) != configs.config_hash(same)
    # each member's own metrics: its own loss, not the population's sum
    assert not read_metrics(first)["train/loss"].equals(read_metrics(second)["train/loss"])
    assert float(read_metrics(second)["train/loss"].dropna().iloc[-1]) == pytest.approx(
        summaries[1]["final_train_loss"])


def test_a_complete_population_is_not_trained_again(trained):
    first, second = trained / "pop", trained / "pop-seed1"
    before = [(d / "metrics.jsonl").read_text() for d in (first, second)]
    out = _run(_population_cmd(first), first)
    assert out.stderr.count("already complete") == 2
    assert [(d / "metrics.jsonl").read_text() for d in (first, second)] == before


def test_population_resume_after_sigkill_equals_uninterrupted(trained, tmp_path):
    """Killed before its first checkpoint, while writing it, and between checkpoints, then rerun: every member's
    parameters bit for bit those of the population that was never interrupted."""
    first, second = trained / "pop", trained / "pop-seed1"
    run_dir = tmp_path / "pop"
    seed = kill_seed()
    kills, stderr = run_with_kills(_population_cmd(run_dir), _env(run_dir), run_dir, seed)
    check_kills(kills, stderr, seed)
    for resumed, full in ((run_dir, first), (tmp_path / "pop-seed1", second)):
        for a, b in zip(_leaves(resumed), _leaves(full), strict=True):
            np.testing.assert_array_equal(a, b, err_msg=f"kill seed {seed}: {kills}")
        assert read_metrics(resumed)["train/loss"].equals(read_metrics(full)["train/loss"])


def test_members_that_differ_in_more_than_their_seed_are_refused(tmp_path):
    members = population.members_of(configs.load_config(SMOKE, ["--run_dir", str(tmp_path / "p")]), 2)
    other = configs.load_config(SMOKE, ["--run_dir", str(tmp_path / "q"), "--trainer.seed", "1",
                                       "--optimizer.learning_rate", "0.01"])
    with pytest.raises(ValueError, match="differs from .* in more than its name and trainer.seed"):
        population.main([members[0], other])
    with pytest.raises(ValueError, match="must differ in trainer.seed"):
        population.check_members([members[0], members[0]])
    with pytest.raises(ValueError, match="at least 2"):
        population.members_of(members[0], 1)
    assert not (tmp_path / "p").exists() and not (tmp_path / "q").exists()  # refused before anything was written


_FINETUNINGS = """
import sys
from diffeqformer import config as configs, finetune, population, use_onednn
use_onednn()  # the kernels of the command line's training (train.cli), which the resumed runs go through
pretrain, lora, root = sys.argv[1:]
args = ["--pretrain.config", pretrain, "--pretrain.run_dir", root + "/pre", "--lora.dropout", "0.1"]
load = lambda extra: configs.load_config(lora, args + extra, cls=configs.FinetuneConfig)
population.main(population.members_of(load(["--run_dir", root + "/pop"]), 2))
finetune.main(load(["--run_dir", root + "/solo1", "--trainer.seed", "1"]))
"""


LORA = paths.CONFIG / "smoke" / "finetune_diffeqformer_lora.yaml"


@pytest.fixture(scope="module")
def finetuned(tmp_path_factory, smoke_run):
    """A smoke pretraining (``pre``: the test run's shared smoke run, conftest), a population of its LoRA
    fine-tunings of seeds 0 and 1 (``pop``, ``pop-seed1``) and the solo fine-tuning of seed 1 (``solo1``), with
    adapter dropout."""
    root = tmp_path_factory.mktemp("finetunings")
    (root / "pre").symlink_to(smoke_run, target_is_directory=True)
    # one process trains the population and the solo run: the interpreter's start-up is most of a run
    _run([sys.executable, "-c", _FINETUNINGS, str(SMOKE), str(LORA), str(root)], root / "pop")
    return root


def test_a_finetuning_member_finetunes_like_its_solo_finetuning(finetuned):
    """A population of two LoRA fine-tunings (adapter dropout on) of one smoke pretraining: member 1 gets seed 1's
    LoRA initialisation, batches, dropout keys and Adam state, so after 20 steps its parameters (adapters,
    embeddings and the frozen discretised weights) are its solo fine-tuning's up to float32 rounding, and so are its
    losses, the pretrained model's at step -1 included; each member ends as an ordinary fine-tuning run."""
    assert configs.config_class(LORA) is configs.FinetuneConfig  # the CLI's dispatch
    assert configs.config_class(SMOKE) is configs.TrainConfig
    first, member, solo = finetuned / "pop", finetuned / "pop-seed1", finetuned / "solo1"
    a, b = ([np.asarray(x) for x in jax.tree_util.tree_leaves(eqx.filter(runs.load_model(d), eqx.is_array))]
            for d in (member, solo))
    mine = _assert_follows_solo(a, b, member, solo, leaves=10)  # measured: 5.4e-07 after 20 steps
    assert mine["eval/loss"].dropna().index[0] == -1

    summaries = [json.loads((d / "complete.json").read_text()) for d in (first, member)]
    alone = json.loads((solo / "complete.json").read_text())
    for k, summary in enumerate(summaries):
        assert set(summary) == set(alone) | {"population"}
        assert summary["population"]["member"] == k and summary["population"]["seeds"] == [0, 1]
        for field in ("method", "euler_steps", "trainable_params", "total_params", "pretrain_config_hash"):
            assert summary[field] == alone[field], field
    assert summaries[1]["pretrained_eval_loss"] == pytest.approx(alone["pretrained_eval_loss"], rel=1e-5)
    assert (first / "checkpoints").is_dir() and not (member / "checkpoints").exists()
    assert (member / "pretrain_config.yaml").read_text() == (finetuned / "pre" / "config.yaml").read_text()
    # its config hash covers the population: the solo fine-tuning of the same config is another run
    args = ["--pretrain.config", str(SMOKE), "--pretrain.run_dir", str(finetuned / "pre"), "--lora.dropout", "0.1"]
    config = population.members_of(configs.load_config(LORA, [*args, "--run_dir", str(first)],
                                                     cls=configs.FinetuneConfig), 2)[1]
    assert summaries[1]["config_hash"] == configs.finetune_hash(
        config, alone["pretrain_config_hash"], population=[0, 1]) != alone["config_hash"]


@pytest.mark.slow
def test_finetuning_population_resume_after_sigkill_equals_uninterrupted(finetuned, tmp_path):
    """The fine-tunings' population from the command line, killed before its first checkpoint, while writing it,
    and between checkpoints, then rerun: every member's parameters (the adapters and embeddings Levanter restores,
    the frozen weights adapted again) bit for bit those of the population that was never interrupted."""
    run_dir = tmp_path / "pop"
    cmd = [sys.executable, "-m", "diffeqformer.population", "--config", str(LORA), "--seeds", "2", "--pretrain.config",
           str(SMOKE), "--pretrain.run_dir", str(finetuned / "pre"), "--lora.dropout", "0.1", "--run_dir", str(run_dir)]
    seed = kill_seed()
    kills, stderr = run_with_kills(cmd, _env(run_dir), run_dir, seed)
    check_kills(kills, stderr, seed)
    for resumed, full in ((run_dir, finetuned / "pop"), (tmp_path / "pop-seed1", finetuned / "pop-seed1")):
        a, b = (jax.tree_util.tree_leaves(eqx.filter(runs.load_model(d), eqx.is_array)) for d in (resumed, full))
        for x, y in zip(a, b, strict=True):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=f"kill seed {seed}: {kills}")
        assert read_metrics(resumed)["train/loss"].equals(read_metrics(full)["train/loss"])
