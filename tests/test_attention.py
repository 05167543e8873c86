"""The cuDNN attention route (diffeqformer.model.attention): the same attention as Levanter's, taken only where cuDNN
computes it exactly, and never on a CPU."""

import os
import subprocess
import sys

import haliax as hax
import jax
import jax.numpy as jnp
import levanter.layers.attention as levanter_attention
import levanter.models.gpt2 as levanter_gpt2
import numpy as np
import pytest
from levanter.layers.attention import AttentionBackend, AttentionMask

from diffeqformer.model import attention

Batch, Pos, KPos, Heads, HeadSize = (hax.Axis("batch", 2), hax.Axis("position", 16), hax.Axis("key_position", 16),
                                     hax.Axis("heads", 3), hax.Axis("head_size", 8))


def qkv(getkey, dtype=jnp.float32):
    q = hax.random.normal(getkey(), (Batch, Pos, Heads, HeadSize)).astype(dtype)
    k = hax.random.normal(getkey(), (Batch, KPos, Heads, HeadSize)).astype(dtype)
    v = hax.random.normal(getkey(), (Batch, KPos, Heads, HeadSize)).astype(dtype)
    return q, k, v


def test_jax_attention_is_levanters_causal_attention(getkey):
    """The rearrangement into JAX's [B, T, N, H] and back: the same numbers and axes as Levanter's vanilla attention,
    also with the heads axis before the positions."""
    q, k, v = qkv(getkey)
    ref = levanter_attention.dot_product_attention("position", "key_position", "head_size", q, k, v,
                                                   mask=AttentionMask.causal(), attn_backend=AttentionBackend.VANILLA)
    for query in (q, q.rearrange((Heads, Batch, Pos, HeadSize))):
        out = attention.jax_attention("position", "key_position", "head_size", query, k, v,
                                      scaling_factor=HeadSize.size ** -0.5, implementation=None)
        assert set(out.axes) == set(ref.axes)
        np.testing.assert_allclose(out.rearrange(ref.axes).array, ref.array, rtol=1e-5, atol=1e-5)


def test_jax_attention_with_grouped_query_heads(getkey):
    """Levanter's attention layer splits the query heads into (kv_head, q_heads_per_group), which key and value lack
    the second of: JAX's query heads sharing one key head, the same numbers as Levanter's."""
    KvHeads, Group = hax.Axis("kv_head", 2), hax.Axis("q_heads_per_group", 3)
    q = hax.random.normal(getkey(), (Batch, KvHeads, Group, Pos, HeadSize))
    k = hax.random.normal(getkey(), (Batch, KvHeads, KPos, HeadSize))
    v = hax.random.normal(getkey(), (Batch, KvHeads, KPos, HeadSize))
    ref = levanter_attention.dot_product_attention("position", "key_position", "head_size", q, k, v,
                                                   mask=AttentionMask.causal(), attn_backend=AttentionBackend.VANILLA)
    out = attention.jax_attention("position", "key_position", "head_size", q, k, v,
                                  scaling_factor=HeadSize.size ** -0.5, implementation=None)
    assert out.axes == q.axes
    np.testing.assert_allclose(out.rearrange(ref.axes).array, ref.array, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("config", ["config/cpu/diffeqformer.yaml", "config/cpu/gpt2.yaml"])
def test_routed_models_train_as_levanters(config, monkeypatch):
    """DiffEqFormer and GPT-2 of the cpu preset with their attention taken by the route (a GPU simulated, JAX's XLA
    attention in place of cuDNN, float32 allowed): the same loss and gradients as with Levanter's own attention."""
    import equinox as eqx
    import jax.random as jrandom
    import yaml
    from draccus.parsers import decoding
    from levanter.models.lm_model import LmConfig, LmExample

    mc = decoding.decode(LmConfig, dict(yaml.safe_load(open(config))["model"]))
    Vocab, B = hax.Axis("vocab", 64), hax.Axis("batch", 2)
    model = mc.build(Vocab, key=jrandom.PRNGKey(0))
    tokens = hax.named(jrandom.randint(jrandom.PRNGKey(1), (B.size, mc.max_Pos.size), 0, Vocab.size), (B, mc.max_Pos))
    example = hax.vmap(LmExample.causal, B)(tokens)
    key = jrandom.PRNGKey(2)  # the same dropout masks in both
    loss_and_grad = eqx.filter_value_and_grad(lambda m: m.compute_next_token_loss(example, key=key).scalar())
    # compiled (op by op the two took 98 CPU-s of CI, so 55 s), each call its own program: the route is taken when
    # it is traced
    loss, grads = eqx.filter_jit(lambda m: loss_and_grad(m))(model)
    routed = []
    xla = attention.jax_attention
    monkeypatch.setattr(attention.jax, "default_backend", lambda: "gpu")
    monkeypatch.setattr(attention, "CUDNN_DTYPES", (jnp.float32,))
    monkeypatch.setattr(attention, "jax_attention",
                        lambda *a, implementation, **k: routed.append(a[3].axes) or xla(*a, implementation=None, **k))
    attention.install()
    loss_r, grads_r = eqx.filter_jit(lambda m: loss_and_grad(m))(model)
    assert routed, "the model's attention did not take the route"
    np.testing.assert_allclose(loss_r, loss, rtol=1e-5)
    for g, g_r in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(grads_r)):
        np.testing.assert_allclose(g_r, g, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("change", ["none", "cpu", "backend", "no_flash", "not_causal", "segments", "window", "bias",
                                    "soft_cap", "dropout", "float32", "upcast"])
def test_cudnn_applies_only_where_it_is_exact(getkey, monkeypatch, change):
    """cuDNN takes a call only on a GPU, for the default backend, a plain causal mask, no bias, cap or dropout, in
    bfloat16 (a CPU is simulated as a GPU by patching the backend's name; nothing runs on a GPU here)."""
    q, _, _ = qkv(getkey, jnp.bfloat16)
    call = dict(query=q, mask=AttentionMask.causal(), bias=None, attention_dtype=None, attn_backend=None,
                use_flash=None, dropout=0.0, inference=False, logits_soft_cap=None, attn_sink=None)
    platform = "cpu" if change == "cpu" else "gpu"
    monkeypatch.setattr(attention.jax, "default_backend", lambda: platform)
    changed = {
        "none": {}, "cpu": {}, "backend": {"attn_backend": AttentionBackend.VANILLA}, "no_flash": {"use_flash": False},
        "not_causal": {"mask": AttentionMask(is_causal=False)},
        "segments": {"mask": AttentionMask.causal().with_segment_ids(hax.zeros(Pos, dtype=jnp.int32))},
        "window": {"mask": AttentionMask(is_causal=True, sliding_window=4)},
        "bias": {"bias": hax.zeros((Pos, KPos))}, "soft_cap": {"logits_soft_cap": 30.0},
        "dropout": {"dropout": 0.1}, "float32": {"query": q.astype(jnp.float32)},
        "upcast": {"attention_dtype": jnp.float32},
    }[change]
    assert attention.cudnn_applies(**{**call, **changed}) == (change == "none")
    if change == "dropout":  # dropout does nothing at inference: cuDNN may take it then
        assert attention.cudnn_applies(**{**call, **changed, "inference": True})


def test_installed_route_leaves_cpu_attention_unchanged(getkey, monkeypatch):
    """Installed (as training and loading a model do), Levanter's GPT-2 and attention layer call the route, which on a CPU
    hands every call to Levanter's own function: the same output, bit for bit."""
    assert attention.install() or pytest.skip("Transformer Engine is installed: Levanter's default is kept")
    assert levanter_gpt2.dot_product_attention is attention.dot_product_attention
    assert levanter_attention.dot_product_attention is attention.dot_product_attention
    q, k, v = qkv(getkey)
    args = ("position", "key_position", "head_size", q, k, v)
    routed = attention.dot_product_attention(*args, mask=AttentionMask.causal())
    direct = attention.LEVANTER_ATTENTION(*args, mask=AttentionMask.causal())
    assert jax.default_backend() == "cpu"
    np.testing.assert_array_equal(routed.array, direct.rearrange(routed.axes).array)



def test_importing_the_model_leaves_levanter_alone():
    """The route is installed where a model is trained or loaded (``train.initialize_and_build``,
    ``runs.load_model``), not by importing the package."""
    code = ("import diffeqformer.model, levanter.layers.attention as a, levanter.models.gpt2 as g; "
            "from diffeqformer.model import attention; "
            "assert a.dot_product_attention is g.dot_product_attention is attention.LEVANTER_ATTENTION")
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "JAX_PLATFORMS": "cpu"})
