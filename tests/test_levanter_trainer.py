"""Levanter's own trainer and LoRA accept DiffEqFormer, its discretisation and the baselines (CPU, offline)."""

import equinox as eqx
import haliax as hax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from diffeqformer.model.baselines import baseline_config
from helpers import VOCAB, tiny
from levanter.adaptor.lora import LoraConfig, lora_trainable_params_filter, loraize
from levanter.callbacks.watch import WatchConfig
from levanter.checkpoint import CheckpointerConfig
from levanter.data.dataset import ListAsyncDataset
from levanter.models.lm_model import LmExample
from levanter.optim.config import AdamConfig
from levanter.tracker import NoopConfig
from levanter.trainer import Trainer, TrainerConfig

from diffeqformer import train
from diffeqformer.train import next_token_loss

STEPS = 25


def _dataset(Pos, n=8 * STEPS, seed=0):
    """Chains of a fixed random permutation (next = perm[current]) from random starts: learnable in a few steps."""
    rng = np.random.default_rng(seed)
    perm = rng.permutation(VOCAB.size)
    examples = []
    for _ in range(n):
        tokens = [int(rng.integers(VOCAB.size))]
        for _ in range(Pos.size - 1):
            tokens.append(int(perm[tokens[-1]]))
        examples.append(LmExample.causal(hax.named(jnp.asarray(tokens, dtype=jnp.int32), Pos)))
    return ListAsyncDataset(examples)


def _trainer(tmp_path, steps=STEPS, lr=3e-2) -> Trainer:
    """Levanter's Trainer for `steps` steps, configured as diffeqformer.train configures it (to be entered)."""
    config = TrainerConfig(
        num_train_steps=steps,
        train_batch_size=8,
        tracker=NoopConfig(),
        checkpointer=CheckpointerConfig(base_path=str(tmp_path / "ckpt"), save_interval=None),
        log_dir=tmp_path / "logs",
        require_accelerator=False,
        # as diffeqformer.train configures Levanter: no gradient/parameter-norm hook (it compiles a second training
        # step) and no jaxpr/HLO artifacts (one more trace and lowering of the step)
        watch=WatchConfig(interval=0),
        log_jaxprs=False,
        log_xla_hlo=False,
        id="test",
        jax_config={},  # keep the strict promotion of conftest: Levanter's defaults would reset nothing else
    )
    optimizer = AdamConfig(learning_rate=lr, warmup=0.0, weight_decay=0.0, min_lr_ratio=1.0).build(steps)
    config.initialize()
    return Trainer(config, optimizer, next_token_loss)


def _train(tmp_path, model_init, Pos, *, is_trainable=True, steps=STEPS, lr=3e-2):
    """Run Levanter's Trainer for `steps` steps; return (losses, final model)."""
    losses = []
    # Levanter's trainer internals mix integer step counters with floats; the strict promotion of our tests is for our
    # code, so the trainer runs under JAX's standard rules.
    with jax.numpy_dtype_promotion("standard"), _trainer(tmp_path, steps, lr) as trainer:
        state = trainer.initial_state(jax.random.PRNGKey(0), model_init=model_init, is_trainable=is_trainable)
        loader = trainer.data_loader(_dataset(Pos)).iter_from_step(0)
        for info in trainer.training_steps(state, loader):
            losses.append(float(info.loss))
        model = info.state.model
    return np.array(losses), model


def _assert_learns(losses):
    assert len(losses) == STEPS
    assert np.all(np.isfinite(losses))
    assert losses[-5:].mean() < 0.7 * losses[0], losses  # at least 30% below the initial ~log(vocab) in 25 steps


@pytest.mark.parametrize("changes", [{}, {"variant": "llama"}, {"time_dependent": False}])
def test_levanter_trainer_reduces_loss(tmp_path, changes):
    config = tiny(**changes)
    losses, _ = _train(tmp_path, lambda: config.build(VOCAB, key=jax.random.PRNGKey(1)), config.Pos)
    _assert_learns(losses)


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_levanter_baselines_train_at_same_dims(tmp_path, kind):
    config = tiny()
    base = baseline_config(config, kind)
    assert (base.hidden_dim, base.num_layers, base.num_heads, base.max_seq_len) == (16, 4, 2, 12)
    losses, _ = _train(tmp_path, lambda: base.build(VOCAB, key=jax.random.PRNGKey(1)), base.max_Pos)
    _assert_learns(losses)


@pytest.mark.parametrize("kind", ["diffeqformer", "gpt2"])
def test_a_fresh_state_is_levanters_own_bit_for_bit(tmp_path, kind, request):
    """train.initial_state builds the model in a program of its own, compiled at a lower XLA optimisation level
    (a third of the start-up of a cpu population): the state it starts from is the one Levanter's own compiled
    initialisation gives, bit for bit."""
    config = tiny() if kind == "diffeqformer" else baseline_config(tiny(), kind)
    model_init = lambda: config.build(VOCAB, key=jax.random.PRNGKey(1))  # noqa: E731
    # XLA's default optimisation for Levanter's own initialisation, as a training compiles it (conftest turns most
    # optimisation off for the tests; at level 0 the states differ from level 1's)
    switch = "jax_disable_most_optimizations"
    request.addfinalizer(lambda value=jax.config.read(switch): jax.config.update(switch, value))
    jax.config.update(switch, False)
    states = []
    for own in (True, False):
        with jax.numpy_dtype_promotion("standard"), _trainer(tmp_path / str(own)) as trainer:
            key = jax.random.PRNGKey(3)
            states.append(train.initial_state(trainer, key, model_init) if own else
                          trainer.initial_state(key, model_init=model_init))
    leaves = [jax.tree_util.tree_leaves(eqx.filter(state, eqx.is_array)) for state in states]
    assert len(leaves[0]) == len(leaves[1]) > 10
    for a, b in zip(*leaves):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_lora_on_discretized_model_trains_only_lora_params(tmp_path):
    config = tiny()
    model = config.build(VOCAB, key=jax.random.PRNGKey(1)).discretize(6)
    lora_model = loraize(model, LoraConfig(r=2, target_modules=None), key=jax.random.PRNGKey(2))
    is_trainable = lora_trainable_params_filter(lora_model)
    lora_before, frozen_before = eqx.partition(lora_model, is_trainable)
    arrays = lambda tree: jax.tree_util.tree_leaves(eqx.filter(tree, eqx.is_array))  # noqa: E731
    n_lora, n_frozen = (sum(x.size for x in arrays(t)) for t in (lora_before, frozen_before))
    assert 0 < n_lora < n_frozen // 5

    losses, trained = _train(tmp_path, lambda: lora_model, config.Pos, is_trainable=is_trainable)
    assert losses[-5:].mean() < losses[0]
    lora_after, frozen_after = eqx.partition(trained, is_trainable)
    for a, b in zip(arrays(frozen_before), arrays(frozen_after), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # frozen weights untouched
    assert any(not np.allclose(a, b) for a, b in zip(arrays(lora_before), arrays(lora_after), strict=True))
