"""The model against independent references: time embedding, weight units, block, ODE loop, discretisation."""

import math

import equinox as eqx
import haliax as hax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import CAUSAL, VOCAB, assert_close, random_ids, tiny

from diffeqformer import (
    DiffEqFormerConfig,
    DiscreteDiffEqFormerLMHeadModel,
    SinusoidalTimeEmbedding,
    TemporalLinear,
    count_params,
    count_params_formula,
)


def test_time_embedding_matches_numpy():
    te = SinusoidalTimeEmbedding.init(6, scale=1000.0, max_period=10000.0)
    t = np.array([0.0, 0.25, 1.0], dtype=np.float32)
    got = te(hax.named(jnp.asarray(t), "layers")).array
    w = np.exp(-np.log(10000.0) * np.arange(6) / 6)
    args = 1000.0 * t[:, None] * w[None, :]
    want = np.concatenate([t[:, None], np.sin(args), np.cos(args)], axis=1)
    assert got.shape == (3, 13)
    assert_close(got, want, 1e-4)  # sin of arguments up to 1000 rad: float32 argument rounding ~6e-5


def test_temporal_linear_matches_einsum(getkey):
    te = SinusoidalTimeEmbedding.init(4)
    In, Out, TimeEmbed = hax.Axis("embed", 5), hax.Axis("mlp", 7), hax.Axis("time_embed", 3)
    lin = TemporalLinear.init(te.TimeFeatures, TimeEmbed, In, Out, key=getkey(), out_first=False)
    lin = eqx.tree_at(lambda m: m.proj_bias, lin, hax.random.normal(getkey(), lin.proj_bias.axes))
    t = hax.named(jnp.array([0.1, 0.7]), "layers")
    e = te(t)
    got = lin.materialize(e)

    raw = lambda a, *names: a.rearrange(names).array  # noqa: E731
    l1, l2 = lin.mlp.lin1, lin.mlp.lin2
    e_ = raw(e, "layers", "time_features")
    pre = e_ @ raw(l1.weight, "time_features", "time_hidden") + l1.bias.array[None, :]
    h = (pre * jax.nn.sigmoid(pre)) @ raw(l2.weight, "time_hidden", "time_embed") + l2.bias.array[None, :]
    W = np.einsum("ld,dio->lio", h, raw(lin.proj, "time_embed", "embed", "mlp")) + raw(lin.proj_bias, "embed", "mlp")[None]
    b = h @ raw(lin.bias_proj, "time_embed", "mlp")
    assert_close(got.weight.rearrange(("layers", "embed", "mlp")), W, 1e-5)
    assert_close(got.bias.rearrange(("layers", "mlp")), b, 1e-5)


def _reference_gpt_block(block, x, num_heads):
    """f(x) = Attn(LN1 x) + MLP(LN2 x) written with plain jax.numpy from the block's weights (x: [T, D])."""
    raw = lambda a, *names: a.rearrange(names).array  # noqa: E731

    def ln(norm, v):
        mu = v.mean(-1, keepdims=True)
        var = ((v - mu) ** 2).mean(-1, keepdims=True)
        return (v - mu) / jnp.sqrt(var + norm.eps) * norm.weight.array[None, :] + norm.bias.array[None, :]

    a = ln(block.attn_norm, x)
    att = block.attn
    q = jnp.einsum("td,hkd->htk", a, raw(att.q_proj.weight, "kv_head", "head_size", "embed", "q_heads_per_group")[..., 0])
    q = q + raw(att.q_proj.bias, "kv_head", "head_size", "q_heads_per_group")[..., 0][:, None, :]
    k = jnp.einsum("td,hkd->htk", a, raw(att.k_proj.weight, "kv_head", "head_size", "embed"))
    k = k + raw(att.k_proj.bias, "kv_head", "head_size")[:, None, :]
    v = jnp.einsum("td,hkd->htk", a, raw(att.v_proj.weight, "kv_head", "head_size", "embed"))
    v = v + raw(att.v_proj.bias, "kv_head", "head_size")[:, None, :]
    T = x.shape[0]
    scores = jnp.einsum("hik,hjk->hij", q, k) / math.sqrt(q.shape[-1])
    scores = jnp.where(jnp.tril(jnp.ones((1, T, T), bool)), scores, -jnp.inf)
    y = jnp.einsum("hij,hjk->hik", jax.nn.softmax(scores, axis=-1), v)
    attn_out = jnp.einsum("hik,hkd->id", y, raw(att.o_proj.weight, "heads", "head_size", "embed"))
    attn_out = attn_out + att.o_proj.bias.array[None, :]

    m = ln(block.mlp_norm, x)
    hid = m @ raw(block.mlp.c_fc.weight, "embed", "mlp") + block.mlp.c_fc.bias.array[None, :]
    hid = 0.5 * hid * (1.0 + jnp.tanh(math.sqrt(2.0 / math.pi) * (hid + 0.044715 * hid**3)))  # gelu_new
    mlp_out = hid @ raw(block.mlp.c_proj.weight, "mlp", "embed") + block.mlp.c_proj.bias.array[None, :]
    return attn_out + mlp_out


def test_parallel_block_matches_plain_jax(getkey):
    config = tiny()
    model = config.build(VOCAB, key=getkey())
    block = model.weights_at(hax.named(jnp.float32(0.5), ()))
    x = hax.random.normal(getkey(), (config.Pos, config.Embed))
    got = block(x, CAUSAL).rearrange((config.Pos, config.Embed)).array
    want = _reference_gpt_block(block, x.array, config.num_heads)
    assert_close(got, want, 1e-4)


@pytest.mark.parametrize("variant", ["gpt", "llama"])
@pytest.mark.parametrize("hypernet", ["per_weight", "shared_mlp"])
def test_ode_forward_equals_explicit_euler_loop(getkey, variant, hypernet):
    config = tiny(variant=variant, hypernet=hypernet)
    model = config.build(VOCAB, key=getkey())
    ids = random_ids(getkey())
    logits = model(ids, CAUSAL)

    pos = hax.arange(config.Pos, dtype=jnp.int32)
    x = model.embeddings.embed(ids, pos)
    L = config.num_layers
    for k in range(L):  # weights materialised one step at a time, residual updates by hand
        block = model.weights_at(hax.named(jnp.float32((k + 1) / L), ()))
        x = x + block(x, CAUSAL, pos_ids=pos) * (1.0 / L)
    want = hax.dot(model.ln_f(x), model.get_lm_head(), axis="embed")
    assert_close(logits.rearrange(want.axes), want, 1e-4)


@pytest.mark.parametrize("variant", ["gpt", "llama"])
def test_discretize_same_steps_equals_continuous(getkey, variant):
    model = tiny(variant=variant).build(VOCAB, key=getkey())
    ids = random_ids(getkey())
    disc = model.discretize(model.config.num_layers)
    assert isinstance(disc, DiscreteDiffEqFormerLMHeadModel)
    assert_close(disc(ids, CAUSAL), model(ids, CAUSAL), 1e-5)


def test_discretize_other_steps_differs(getkey):
    model = tiny().build(VOCAB, key=getkey())
    ids = random_ids(getkey())
    ref = model(ids, CAUSAL).array
    for n in (2, 7):
        other = model.discretize(n)(ids, CAUSAL).array
        assert other.shape == ref.shape
        assert float(jnp.max(jnp.abs(other - ref))) > 1e-3


def test_weight_shared_discretize_is_one_block_repeated(getkey):
    config = tiny(time_dependent=False)
    model = config.build(VOCAB, key=getkey())
    ids = random_ids(getkey())
    pos = hax.arange(config.Pos, dtype=jnp.int32)
    for n in (config.num_layers, 3):
        x = model.embeddings.embed(ids, pos)
        for _ in range(n):
            x = x + model.block(x, CAUSAL, pos_ids=pos) * (1.0 / n)
        want = hax.dot(model.ln_f(x), model.get_lm_head(), axis="embed")
        assert_close(model.discretize(n)(ids, CAUSAL).rearrange(want.axes), want, 1e-4)
    assert_close(model(ids, CAUSAL), model.discretize(config.num_layers)(ids, CAUSAL), 1e-5)


@pytest.mark.parametrize("variant", ["gpt", "llama"])
@pytest.mark.parametrize("time_dependent", [True, False])
def test_causality(getkey, variant, time_dependent):
    model = tiny(variant=variant, time_dependent=time_dependent).build(VOCAB, key=getkey())
    ids = random_ids(getkey())
    j = 7
    changed = ids.array.at[j].set((ids.array[j] + 1) % VOCAB.size)
    a = model(ids, CAUSAL).array
    b = model(hax.named(changed, ids.axes), CAUSAL).array
    assert_close(a[:j], b[:j], 1e-5)
    assert float(jnp.max(jnp.abs(a[j:] - b[j:]))) > 1e-6  # the change is seen from position j on


def test_batched_input(getkey):
    model = tiny().build(VOCAB, key=getkey())
    Batch = hax.Axis("batch", 3)
    ids = random_ids(getkey(), Batch=Batch)
    batched = model(ids, CAUSAL)
    for i in range(Batch.size):
        assert_close(batched["batch", i].rearrange(("position", "vocab")), model(ids["batch", i], CAUSAL), 1e-5)


@pytest.mark.parametrize(
    "changes",
    [{}, {"variant": "llama"}, {"hypernet": "shared_mlp"}, {"time_dependent": False},
     {"variant": "llama", "time_dependent": False}, {"use_bias": False}],
)
def test_param_count_formula(getkey, changes):
    config = tiny(**changes)
    assert count_params(config.build(VOCAB, key=getkey())) == count_params_formula(config, VOCAB.size)
    shape_only = eqx.filter_eval_shape(config.build, VOCAB, key=getkey())
    assert count_params(shape_only) == count_params_formula(config, VOCAB.size)
    assert config.total_trainable_params(VOCAB.size) == count_params_formula(config, VOCAB.size)


def test_params_grow_linearly_with_time_embed_dim():
    """Paper: parameters grow linearly with d_t (about d_t times one block's weights). Beyond the exactly linear
    part, each per-weight MLP adds d_t^2 (its second layer): remove that and the count is affine in d_t."""
    counts = {}
    for d_t in (4, 8, 12, 16):
        config = tiny(time_embed_dim=d_t)
        counts[d_t] = count_params_formula(config, VOCAB.size)
    units = 8  # 6 linears + 2 norms in the GPT variant, each with its own MLP
    affine = {d: c - units * d * d for d, c in counts.items()}
    slopes = np.diff([affine[d] for d in sorted(affine)])
    assert len(set(slopes.tolist())) == 1
    D, M = tiny().hidden_dim, tiny().Mlp.size
    weights_of_one_block = 4 * D * D + 2 * D * M
    assert slopes[0] / 4 > weights_of_one_block  # the slope per unit d_t exceeds one block's weight count


@pytest.mark.parametrize(
    "field,value,message",
    [
        ("num_layers", 0, "num_layers"),
        ("num_layers", -3, "num_layers"),
        ("sinusoidal_dim", 5, "sinusoidal_dim"),
        ("time_embed_dim", 0, "time_embed_dim"),
        ("num_heads", 3, "divisible"),
        ("hypernet", "both", "hypernet"),
        ("variant", "mamba", "variant"),
        ("resid_pdrop", 1.5, "resid_pdrop"),
    ],
)
def test_bad_config_names_the_field(field, value, message):
    with pytest.raises(ValueError, match=message):
        tiny(**{field: value})


def test_discretize_rejects_bad_steps(getkey):
    model = tiny().build(VOCAB, key=getkey())
    for bad in (0, -1, 2.5):
        with pytest.raises(ValueError, match="num_steps"):
            model.discretize(bad)


def test_registered_with_levanter():
    from levanter.models.lm_model import LmConfig

    assert LmConfig.get_choice_class("diffeqformer") is DiffEqFormerConfig


# Randomised step placement in training (config.random_step_offset)


def test_random_time_grid_keeps_steps_and_varies_the_offset(getkey):
    from diffeqformer.model.transformer import random_time_grid, time_grid

    L = tiny().Layers
    firsts = []
    for _ in range(50):
        t = np.asarray(random_time_grid(L, key=getkey()).array)
        np.testing.assert_allclose(np.diff(t), 1.0 / L.size, atol=1e-6)
        assert 0.0 < t[0] <= 1.0 / L.size and t[-1] <= 1.0
        firsts.append(t[0])
    assert np.ptp(firsts) > 0.5 / L.size  # spread over the first step's interval
    assert time_grid(L).array[0] == np.float32(1.0 / L.size)


@eqx.filter_jit
def _logits(model, ids, key):
    return model(ids, CAUSAL, key=key).array


def test_random_step_offset_off_ignores_the_key(getkey):
    model = tiny().build(VOCAB, key=getkey())
    ids = random_ids(getkey())
    plain = np.asarray(_logits(model, ids, None))
    for _ in range(2):
        np.testing.assert_array_equal(np.asarray(_logits(model, ids, getkey())), plain)


def test_random_step_offset_on_uses_the_key_in_training_only(getkey):
    key = getkey()
    fixed = tiny().build(VOCAB, key=key)
    model = tiny(random_step_offset=True).build(VOCAB, key=key)
    ids = random_ids(getkey())
    # no key (evaluation): exactly the deterministic model
    np.testing.assert_array_equal(np.asarray(_logits(model, ids, None)), np.asarray(_logits(fixed, ids, None)))
    k1, k2 = getkey(), getkey()
    a, b = _logits(model, ids, k1), _logits(model, ids, k2)
    assert float(jnp.max(jnp.abs(a - b))) > 1e-4
    np.testing.assert_array_equal(np.asarray(_logits(model, ids, k1)), np.asarray(a))  # same key, same u

    # against an explicit Euler loop at t_k = (k + u)/L, u drawn as the model draws it
    _, k_time = jax.random.split(k1)
    u = 1.0 - jax.random.uniform(k_time, (), dtype=jnp.float32)
    pos = hax.arange(model.config.Pos, dtype=jnp.int32)
    x = model.embeddings.embed(ids, pos)
    L = model.config.num_layers
    for k in range(L):
        x = x + model.weights_at(hax.named((k + u) / L, ()))(x, CAUSAL, pos_ids=pos) * (1.0 / L)
    want = hax.dot(model.ln_f(x), model.get_lm_head(), axis="embed").rearrange(("position", "vocab"))
    assert_close(a, want, 1e-4)


def test_random_step_offset_is_validated():
    with pytest.raises(ValueError, match="random_step_offset"):
        tiny(random_step_offset="yes")
    assert not DiffEqFormerConfig().random_step_offset  # off by default: the official grid


@pytest.mark.slow  # ~70 s: a Levanter Trainer run; the flag-on/off forward tests above stay in make test
def test_random_step_offset_trains_with_levanter(tmp_path):
    """Levanter's loss function sees a different grid for each key (its trainer passes one per step), and Levanter's
    trainer brings the loss down with random step placement."""
    from levanter.models.lm_model import LmExample
    from test_levanter_trainer import _train

    from diffeqformer.train import next_token_loss

    config = tiny(random_step_offset=True)
    model = config.build(VOCAB, key=jax.random.PRNGKey(1))
    tokens = hax.named(jnp.arange(config.max_seq_len, dtype=jnp.int32) % VOCAB.size, config.Pos)
    example = LmExample.causal(tokens)
    loss = eqx.filter_jit(next_token_loss)
    with jax.numpy_dtype_promotion("standard"):  # Levanter's loss mixes its integer mask with floats
        l1, l2 = (float(loss(model, example, key=jax.random.PRNGKey(k))) for k in (1, 2))
    assert l1 != l2

    losses, _ = _train(tmp_path, lambda: config.build(VOCAB, key=jax.random.PRNGKey(1)), config.Pos, steps=15)
    assert len(losses) == 15 and np.all(np.isfinite(losses))
    assert losses[-3:].mean() < 0.8 * losses[0], losses


@pytest.mark.parametrize("changes", [dict(variant="gpt"), dict(variant="llama"), dict(hypernet="shared_mlp"),
                                     dict(random_step_offset=True), dict(time_dependent=False)])
def test_bfloat16_compute_keeps_the_ode_state_in_bfloat16(getkey, changes):
    """Under the gpu and paper presets' policy (f32 parameters, bfloat16 compute) the model computes in bfloat16:
    W(t) made from float32 time features was float32, so the Euler scan's carry turned float32 and the scan refused
    it (TypeError), and no DiffEqFormer of those presets could train. Its logits are those of the float32 model up to
    bfloat16 rounding, and its gradients reach the float32 parameters."""
    import jmp

    policy = jmp.get_policy("p=f32,c=bfloat16")
    model = tiny(**changes).build(VOCAB, key=getkey())
    ids, key = random_ids(getkey()), getkey()
    low = policy.cast_to_compute(model)
    block = eqx.filter(low.weights_at(hax.named(jnp.float32(0.5), ())), eqx.is_inexact_array)
    assert {leaf.dtype for leaf in jax.tree_util.tree_leaves(block)} == {jnp.dtype(jnp.bfloat16)}
    logits = eqx.filter_jit(_logits)(low, ids, key)  # compiled: op by op the five took 63 s, so 48 s
    assert logits.dtype == jnp.bfloat16
    want = eqx.filter_jit(_logits)(model, ids, key)
    # bfloat16 keeps 8 significant bits (relative rounding 2^-8 = 0.4%), rounded again in each of the 4 steps:
    # measured 1.7-2.6% of the largest logit for these five models
    err = float(jnp.max(jnp.abs(logits.astype(jnp.float32) - want)))
    assert err <= 0.05 * float(jnp.max(jnp.abs(want))), err

    def loss(m):
        return jnp.mean(_logits(policy.cast_to_compute(m), ids, key).astype(jnp.float32) ** 2)

    grads = eqx.filter_jit(eqx.filter_grad(loss))(model)
    leaves = jax.tree_util.tree_leaves(eqx.filter(grads, eqx.is_inexact_array))
    assert all(g.dtype == jnp.float32 and bool(jnp.all(jnp.isfinite(g))) for g in leaves)
    assert any(float(jnp.max(jnp.abs(g))) > 0 for g in leaves)


def test_a_sequence_longer_than_the_learned_positions_is_refused():
    """The GPT variant learns max_seq_len positions: a longer input names the limit instead of reading positions
    that do not exist (the lookup past the table's end would repeat its last row)."""
    config = tiny()
    model = config.build(VOCAB, key=jax.random.PRNGKey(0))
    ids = hax.named(jnp.zeros(config.max_seq_len + 1, dtype=jnp.int32), "position")
    with pytest.raises(ValueError, match="longer than model.max_seq_len"):
        model(ids, CAUSAL)
    llama = tiny(variant="llama").build(VOCAB, key=jax.random.PRNGKey(0))  # rotary positions: any length
    assert llama(ids, CAUSAL).axes[0].size == config.max_seq_len + 1
