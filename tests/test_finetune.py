"""diffeqformer.finetune at smoke size: LoRA trains only its adapters, a discretisation with N != L fine-tunes, resume
after SIGKILL equals an uninterrupted run, bad input is rejected before anything is written; the Fig. 5 grid."""

import json
import os
import sys
import time

import equinox as eqx
import haliax as hax
import jax
import numpy as np
import forked
import pytest
from helpers import VOCAB, assert_close, random_ids, tiny
from interrupt import kill_seed, run_with_kills
from levanter.layers.attention import AttentionMask
from levanter.adaptor.lora import LoraConfig, LowRankLinear, lora_trainable_params_filter

from diffeqformer import paths
from diffeqformer.config import METHODS, FinetuneConfig, adapt, pretraining_of
from diffeqformer.population import members_of
from diffeqformer.runs import load_model
from diffeqformer.finetune import PRETRAIN_SEEDS, discretisations, compiled_adapt, finetune_grid, main, trainable
from diffeqformer.config import config_hash as train_config_hash
from diffeqformer.config import load_config
from diffeqformer.runs import read_metrics
from diffeqformer.runs import load_model as load_pretrained

PRETRAIN = paths.CONFIG / "smoke" / "diffeqformer.yaml"  # 3 Euler steps
LORA = paths.CONFIG / "smoke" / "finetune_diffeqformer_lora.yaml"  # both discretise it to 5 steps
FULL = paths.CONFIG / "smoke" / "finetune_diffeqformer_full.yaml"
FINETUNE_CONFIGS = sorted(paths.CONFIG.rglob("finetune_*.yaml"))

arrays = lambda tree: jax.tree_util.tree_leaves(eqx.filter(tree, eqx.is_array))  # noqa: E731


@pytest.fixture(scope="module")
def env():
    # the test run's persistent compilation cache (conftest): reruns of a configuration skip XLA compilation
    return {**os.environ, "JAX_PLATFORMS": "cpu"}


def _run(module, config, run_dir, env, *extra):
    cmd = [sys.executable, "-m", module, "--config", str(config), "--run_dir", str(run_dir), *map(str, extra)]
    out = forked.run(cmd, env, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def pretrained(smoke_run):
    """One smoke pretraining run (20 steps of the 3-step DiffEqFormer: conftest.smoke_run, which test_train checks).

    Its config file is the smoke one (``PRETRAIN``): written next to the run, it is the file the fine-tunings name as
    ``pretrain.config``."""
    assert (smoke_run.parent / "pretrain.yaml").read_text() == PRETRAIN.read_text()
    return smoke_run


def _from(pretrained):
    return ["--pretrain.config", str(pretrained.parent / "pretrain.yaml"), "--pretrain.run_dir", str(pretrained)]


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory, pretrained, env):
    run_dir = tmp_path_factory.mktemp("lora") / "run"
    start = time.perf_counter()
    _run("diffeqformer.finetune", LORA, run_dir, env, *_from(pretrained))
    print(f"smoke LoRA fine-tuning: {time.perf_counter() - start:.1f} s wall")
    return run_dir


def test_lora_trains_the_adapters_and_the_embeddings(lora_run, pretrained):
    tuned = load_model(lora_run)
    model = load_pretrained(pretrained)
    # discretised as the fine-tuning discretised it (one compiled program), and as the model does op by op
    reference = compiled_adapt(model, FinetuneConfig(steps=5, method="full"), key=jax.random.PRNGKey(0))
    config = load_config(lora_run / "config.yaml", cls=FinetuneConfig)
    assert config.lora_embeddings  # the paper's code trains the embeddings with the adapters
    is_trained = trainable(config, tuned)
    trained, frozen = eqx.partition(tuned, is_trained)
    ref_frozen = eqx.filter(reference, trainable(config, reference), inverse=True)  # all but the embeddings
    for a, b in zip(arrays(frozen), arrays(ref_frozen), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # every other pretrained weight untouched
    # Two programs computing W(t): they agree to float32 rounding. Measured 1.9e-9 on one machine; 1.5e-7 (4.3e-7
    # relative, 16 of 5120 weights past 1e-7) on another, with the same code: XLA's CPU code differs by processor.
    for a, b in zip(arrays(reference), arrays(model.discretize(5)), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)
    tokens = tuned.embeddings.token_embeddings.weight.array
    assert np.any(np.asarray(tokens) != np.asarray(reference.embeddings.token_embeddings.weight.array))
    adapters = eqx.filter(tuned, lora_trainable_params_filter(tuned))
    lora_b = [m.lora_B.weight.array for m in jax.tree_util.tree_leaves(adapters, is_leaf=_is_lora)
              if isinstance(m, LowRankLinear)]
    assert len(lora_b) == 6  # q, k, v, o and the two MLP maps (each stacked over the 5 layers)
    assert all(np.any(np.asarray(b) != 0) for b in lora_b)  # B starts at zero: every adapter has learned

    summary = json.loads((lora_run / "complete.json").read_text())
    n_trained, n_frozen = (sum(x.size for x in arrays(t)) for t in (trained, frozen))
    n_embeddings = sum(x.size for x in arrays(tuned.embeddings))
    n_lora = sum(x.size for x in arrays(adapters))
    assert summary["trainable_params"] == n_trained == n_lora + n_embeddings
    assert summary["total_params"] == n_trained + n_frozen and 0 < n_lora < summary["total_params"] // 10
    assert (summary["method"], summary["euler_steps"]) == ("lora", 5)
    merged = load_model(lora_run, merged=True)  # the adapters folded into the weights: the reference's named shapes
    assert _named_shapes(merged) == _named_shapes(reference)


def test_lora_without_embeddings_trains_only_the_adapters(getkey):
    # built and adapted in one compiled program (op by op: 120 small compilations, 35 CPU-s of CI; so 17 s)
    build = eqx.filter_jit(lambda model_key, lora_key: adapt(tiny().build(VOCAB, key=model_key),
                                                             FinetuneConfig(steps=2, method="lora"), key=lora_key))
    model = build(getkey(), getkey())
    only = trainable(FinetuneConfig(method="lora", lora_embeddings=False), model)
    both = trainable(FinetuneConfig(method="lora"), model)
    count = lambda spec: sum(x.size for x in arrays(eqx.filter(model, spec)))  # noqa: E731
    assert count(both) - count(only) == sum(x.size for x in arrays(model.embeddings))
    assert count(only) == sum(x.size for x in arrays(eqx.filter(model, lora_trainable_params_filter(model))))


def _named_shapes(model):
    leaves = jax.tree_util.tree_leaves(model, is_leaf=lambda x: isinstance(x, hax.NamedArray))
    return [dict(x.shape) for x in leaves if isinstance(x, hax.NamedArray)]


def _is_lora(node):
    return isinstance(node, LowRankLinear)


def test_metrics_start_from_the_pretrained_model(lora_run):
    metrics = read_metrics(lora_run)
    summary = json.loads((lora_run / "complete.json").read_text())
    evals = metrics["eval/loss"].dropna()
    assert evals.index[0] == -1  # evaluated before the first update
    assert summary["pretrained_eval_loss"] == pytest.approx(evals.loc[-1])
    assert summary["final_eval_loss"] == pytest.approx(evals.iloc[-1]) and evals.iloc[-1] < evals.loc[-1]
    assert summary["final_eval_perplexity"] == pytest.approx(np.exp(evals.iloc[-1]), rel=1e-6)
    assert summary["tokens_per_second"] > 0 and summary["wall_time_s"] > 0
    assert (lora_run / "config.yaml").read_text().startswith("# config_hash: " + summary["config_hash"])
    assert load_config(lora_run / "pretrain_config.yaml").model.num_layers == 3


def test_full_finetuning_of_another_discretisation_learns(tmp_path, pretrained, env):
    run_dir = tmp_path / "run"
    _run("diffeqformer.finetune", FULL, run_dir, env, *_from(pretrained))
    summary = json.loads((run_dir / "complete.json").read_text())
    assert summary["euler_steps"] == 5 and summary["trainable_params"] == summary["total_params"]
    metrics = read_metrics(run_dir)
    train = metrics["train/loss"].dropna()
    assert len(train) == 20 and np.all(np.isfinite(train)) and train.iloc[-5:].mean() < train.iloc[:5].mean()
    assert summary["final_eval_loss"] < summary["pretrained_eval_loss"]
    model = load_model(run_dir)
    assert model.config.num_layers == 5 and model.transformer.blocks.Block.size == 5


def test_complete_run_is_not_rerun(lora_run, pretrained, capsys):
    before = (lora_run / "metrics.jsonl").read_text()
    summary = main(load_config(LORA, [*_from(pretrained), "--run_dir", str(lora_run)], cls=FinetuneConfig))
    assert "already complete" in capsys.readouterr().err
    assert summary == json.loads((lora_run / "complete.json").read_text())
    assert (lora_run / "metrics.jsonl").read_text() == before


def test_another_config_in_the_same_run_dir_is_refused(lora_run, pretrained):
    before = sorted(p.name for p in lora_run.iterdir())
    config = load_config(LORA, [*_from(pretrained), "--run_dir", str(lora_run), "--lora.r", "2"], cls=FinetuneConfig)
    with pytest.raises(ValueError, match="another configuration"):
        main(config)
    assert sorted(p.name for p in lora_run.iterdir()) == before


def test_resume_after_sigkill_equals_uninterrupted_run(lora_run, pretrained, tmp_path, env):
    """Killed before its first checkpoint, while writing it, and between checkpoints, then rerun: the same
    adapters, bit for bit, as the fine-tuning that was never interrupted."""
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "diffeqformer.finetune", "--config", str(LORA), *_from(pretrained),
           "--run_dir", str(run_dir)]
    seed = kill_seed()
    kills, stderr = run_with_kills(cmd, env, run_dir, seed, timeout=900)
    print(f"kill seed {seed}: " + "; ".join(f"{k.what} (committed: {k.committed})" for k in kills))
    assert "resuming from step 11" in stderr, (seed, stderr[-2000:])
    resumed, full = arrays(load_model(run_dir)), arrays(load_model(lora_run))
    assert len(resumed) == len(full) > 10
    for a, b in zip(resumed, full):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=f"kill seed {seed}: {kills}")


@pytest.fixture(scope="module")
def fake_gpt_pretraining(tmp_path_factory):
    """A finished-looking GPT-2 pretraining run: validation reads only complete.json (it builds models shape-only)."""
    run_dir = tmp_path_factory.mktemp("gpt") / "run"
    run_dir.mkdir()
    config = load_config(paths.CONFIG / "smoke" / "gpt2.yaml")
    (run_dir / "complete.json").write_text(json.dumps({"config_hash": train_config_hash(config), "vocab_size": 4096}))
    return run_dir


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["--steps", "0"], "steps must be a positive integer"),
        (["--steps", "2.5"], "steps"),
        (["--steps", "null"], "steps must be given"),
        (["--lora.r", "0"], "lora.r"),
        (["--lora.r", "33"], "lora.r"),  # the smoke model is 32 wide
        (["--lora.target_modules", "nothing_is_called_this"], "target_modules"),
        (["--method", "adapters"], "method"),
        (["--trainer.num_train_steps", "0"], "num_train_steps"),
        (["--data.domain", "poetry"], "data.domain"),
        (["--data.vocab_size", "512"], "tokenizer"),
        (["--pretrain.config", ""], "pretrain.config"),
        (["--pretrain.config", "config/smoke/not_there.yaml"], "pretrain.config"),
        (["--pretrain.config", "config/smoke/gpt2.yaml"], "pretrain.config.*another configuration"),
        (["--pretrain.run_dir", "{tmp}/nowhere"], "pretrain.run_dir"),
        (["--pretrain.run_dir", "{tmp}/unfinished"], "pretrain.run_dir.*no finished"),
        (["--pretrain.config", "config/smoke/gpt2.yaml", "--pretrain.run_dir", "{gpt}"], "steps must be null"),
    ],
)
def test_bad_input_is_rejected_before_anything_is_written(tmp_path, monkeypatch, pretrained, fake_gpt_pretraining,
                                                           overrides, message):
    (tmp_path / "unfinished").mkdir()
    (tmp_path / "unfinished" / "config.yaml").write_text(PRETRAIN.read_text())  # started, never completed
    overrides = [o.format(tmp=tmp_path, gpt=fake_gpt_pretraining) for o in overrides]
    def compute_started(*args, **kwargs):
        raise AssertionError("the bad input reached levanter.trainer.initialize: it was not rejected before compute")

    monkeypatch.setattr("levanter.trainer.initialize", compute_started)
    with pytest.raises(ValueError, match=message):
        args = [*_from(pretrained), *overrides, "--run_dir", str(tmp_path / "run")]
        main(load_config(LORA, args, cls=FinetuneConfig))
    assert not (tmp_path / "run").exists()  # nothing half-written


def test_lora_starts_as_the_discretised_model(getkey):
    """B = 0 at initialisation: the adapted model computes exactly what the pretrained model, discretised, computes."""
    config = FinetuneConfig(steps=6, method="lora", lora=LoraConfig(r=2))
    ids, mask = random_ids(getkey()), AttentionMask.causal()

    @eqx.filter_jit  # one compilation: the tiny model op by op takes a minute on two busy cores
    def logits(model_key, lora_key):
        model = tiny().build(VOCAB, key=model_key)
        lora = adapt(model, config, key=lora_key)
        assert sum(isinstance(m, LowRankLinear) for m in jax.tree_util.tree_leaves(lora, is_leaf=_is_lora)) == 6
        return lora(ids, mask), model.discretize(6)(ids, mask)

    assert_close(*logits(getkey(), getkey()), 1e-5)


@pytest.mark.parametrize("path", FINETUNE_CONFIGS, ids=[str(p.relative_to(paths.CONFIG)) for p in FINETUNE_CONFIGS])
def test_finetune_yaml_parses(path):
    config = load_config(path, cls=FinetuneConfig)
    assert config.name.startswith(path.parent.name) and config.method in METHODS
    assert (paths.REPO / config.pretrain.config).exists()


@pytest.mark.parametrize("preset, max_pretrain, max_finetune", [("cpu", 300, 150), ("gpu", None, None),
                                                                  ("paper", None, None)])
def test_fig5_grid(preset, max_pretrain, max_finetune):
    runs = finetune_grid(preset)
    names = [r.name for r in runs]
    seeds = PRETRAIN_SEEDS.get(preset, 1)
    assert len(set(names)) == len(names) == 4 * seeds + 2 * 2 * (len(discretisations(preset)) + 1) * seeds + 2
    pretrainings = {r.name: load_config(r.config, list(r.overrides)) for r in runs
                    if r.name.startswith(f"{preset}-pretrain")}
    assert len(pretrainings) == 4 * seeds and all(c.name == name for name, c in pretrainings.items())
    assert max_pretrain is None or all(c.trainer.num_train_steps <= max_pretrain for c in pretrainings.values())
    corpus = lambda c: (c.data.dataset, c.data.domain)  # noqa: E731
    assert len({corpus(c) for c in pretrainings.values()}) == 2
    # a model's pretraining seeds: one population, named and seeded as pipeline.seeded names and seeds them
    for r in runs:
        if r.name in pretrainings:
            assert r.population == (tuple(range(seeds)) if seeds > 1 else ())
    steps = []
    for run in runs:
        if run.module != "diffeqformer.finetune":
            continue
        # each starts from a pretraining listed before it, on the other corpus or domain; its overrides parse
        assert len(run.after) == 1 and names.index(run.after[0]) < names.index(run.name)
        config = load_config(run.config, list(run.overrides), cls=FinetuneConfig)
        pre = pretrainings[run.after[0]]
        assert config.name == run.name and pretraining_of(config)[0].name == pre.name
        assert config.pretrain.population == seeds and pre.trainer.seed == config.pretrain.member
        assert corpus(config) != corpus(pre) and corpus(config) in {corpus(c) for c in pretrainings.values()}
        assert max_finetune is None or config.trainer.num_train_steps <= max_finetune
        assert (config.steps is None) == (pre.model.num_layers == 24)
        steps.append(config.steps or 0)
    assert sorted(steps) == sorted([0] * 4 * seeds + [n for n in discretisations(preset) for _ in range(4 * seeds)])
    # a setting's seeds: one population, named and seeded as population.members_of names and seeds them, member k
    # fine-tuning pretraining seed k
    tunings = [r for r in runs if r.module == "diffeqformer.finetune"]
    for first in tunings[::seeds]:
        members = [r for r in tunings if r.name.removeprefix(first.name) in ("", *(f"-seed{k}" for k in range(9)))]
        configs = [load_config(r.config, list(r.overrides), cls=FinetuneConfig) for r in members]
        assert [c.name for c in configs] == [first.name] + [f"{first.name}-seed{k}" for k in range(1, seeds)]
        assert [c.trainer.seed for c in configs] == list(range(seeds))
        assert [c.pretrain.member for c in configs] == list(range(seeds))
        assert seeds == 1 or configs == members_of(configs[0], seeds)
        assert all(r.population == (tuple(range(seeds)) if seeds > 1 else ()) for r in members)
    assert sum(r.name.startswith(f"{preset}-scratch") for r in runs) == 2


def test_fig5_grid_needs_its_configs():
    with pytest.raises(FileNotFoundError, match="pretrain_diffeqformer18"):
        finetune_grid("smoke")
