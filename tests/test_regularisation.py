"""Regularisation: which parameters each model kind decays (the masks the trainers use), every dropout rate a config
exposes changes a training forward pass or is refused, and the pairs the book compares are regularised alike."""

import dataclasses

import equinox as eqx
import haliax as hax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import CAUSAL, VOCAB, random_ids, tiny
from levanter.adaptor.lora import loraize
from levanter.models.gpt2 import Gpt2Config
from levanter.models.llama import LlamaConfig
from levanter.optim.config import AdamConfig

from diffeqformer import config as configs
from diffeqformer import DiffEqFormerConfig, paths
from diffeqformer.config import PaperLoraConfig
from diffeqformer.model.baselines import baseline_config
from diffeqformer.config import (TrainConfig, load_config, validate, with_finetune_weight_decay,
                                 with_paper_weight_decay)

EMBEDDINGS = {".embeddings.token_embeddings.weight", ".embeddings.position_embeddings.weight"}
PARALLEL_BLOCK = {f".attn.{p}_proj.weight" for p in "qkvo"} | {".mlp.c_fc.weight", ".mlp.c_proj.weight"}
GPT2_LAYER = {".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight"}
LLAMA_LAYER = ({f".self_attn.{p}_proj.weight" for p in "qkvo"}
               | {f".mlp.{p}_proj.weight" for p in ("gate", "up", "down")})

ALL = "every parameter"
"""What the paper's code decays where it gives no mask: the Llama ODE model's pretraining, every fine-tuning."""

DECAYED = {
    # Pretraining (configs.with_paper_weight_decay): the ODE model decays its embeddings only; no hypernetwork
    # parameter, norm or bias. Its Llama variant: every parameter (the paper's code gives it no mask).
    "diffeqformer": EMBEDDINGS,
    "diffeqformer_llama": ALL,
    # The baselines: attention and MLP weight matrices and embeddings, never a norm or a bias.
    "gpt2": EMBEDDINGS | {".transformer.blocks.stacked" + p for p in GPT2_LAYER},
    "llama": {".embeddings.token_embeddings.weight"} | {".transformer.layers.stacked" + p for p in LLAMA_LAYER},
    "shared": EMBEDDINGS | {".block" + p for p in PARALLEL_BLOCK},
    # Fine-tuning (finetune.main: configs.with_finetune_weight_decay for every model): every parameter it trains, a
    # discretised DiffEqFormer as the GPT-2 (the paper's fine-tuning optimiser has no mask).
    "discretised": ALL,
    "finetuned_gpt2": ALL,
}


def _model_and_optimizer(kind: str):
    """A tiny model of ``kind``, shapes only (the mask reads only the structure), and the optimiser config its
    trainer builds, weight-decay mask included."""
    key = jax.random.PRNGKey(0)
    if kind in ("diffeqformer", "diffeqformer_llama", "gpt2", "llama", "shared"):
        config = {"diffeqformer": tiny(), "diffeqformer_llama": tiny(variant="llama", use_bias=False)}.get(kind)
        config = config or baseline_config(tiny(), kind)
        return eqx.filter_eval_shape(config.build, VOCAB, key=key), with_paper_weight_decay(AdamConfig(), config)
    if kind == "discretised":
        model = eqx.filter_eval_shape(lambda: tiny().build(VOCAB, key=key).discretize(3))
    else:
        model = eqx.filter_eval_shape(baseline_config(tiny(), "gpt2").build, VOCAB, key=key)
    return model, with_finetune_weight_decay(AdamConfig())


def _decayed(optimizer: AdamConfig, model) -> set[str]:
    """The paths of the parameters that ``optimizer``'s weight-decay mask (Levanter's, built from its
    ``weight_decay_modules``) decays."""
    mask = optimizer.build_weight_decay_mask()(model)
    flags = jax.tree_util.tree_flatten_with_path(mask)[0]
    return {jax.tree_util.keystr(path) for path, flag in flags if flag is True}


def _every_parameter(model) -> set[str]:
    """The paths of every array of ``model`` (a shape-only build)."""
    leaves = jax.tree_util.tree_flatten_with_path(model, is_leaf=lambda x: isinstance(x, hax.NamedArray))[0]
    return {jax.tree_util.keystr(path) for path, leaf in leaves if hasattr(leaf, "shape")}


@pytest.mark.parametrize("kind", sorted(DECAYED))
def test_decayed_parameters_of_each_model_kind(kind):
    model, optimizer = _model_and_optimizer(kind)
    expected = _every_parameter(model) if DECAYED[kind] is ALL else DECAYED[kind]
    assert _decayed(optimizer, model) == expected


def test_lora_decays_every_parameter_it_trains():
    """LoRA fine-tuning, as the paper's fine-tuning code: every parameter decays, the adapters, the embeddings it
    trains, norms and biases alike (the frozen weights match too, but get no update)."""
    model = eqx.filter_eval_shape(lambda: loraize(tiny().build(VOCAB, key=jax.random.PRNGKey(0)).discretize(3),
                                                  PaperLoraConfig(r=2), key=jax.random.PRNGKey(1)))
    optimizer = with_finetune_weight_decay(AdamConfig())
    decayed = _decayed(optimizer, model)
    adapters = {p for p in decayed if ".lora." in p}
    assert adapters == {f".transformer.blocks.stacked{m}.lora.lora_{ab}.weight"
                        for m in (p.removesuffix(".weight") for p in PARALLEL_BLOCK) for ab in "AB"}
    assert decayed == _every_parameter(model) and EMBEDDINGS <= decayed
    assert any("norm" in p for p in decayed) and any(p.endswith("bias") for p in decayed)


@pytest.mark.parametrize("name, retrained", [("shared", True), ("gpt2", True), ("diffeqformer", False)])
def test_a_run_trained_with_another_weight_decay_mask_is_trained_again(monkeypatch, name, retrained):
    """The mask is not in the config file, so its regex is hashed: changing the baselines' mask changes the hash of
    the runs that use it (GPT-2, the weight-shared model), not of DiffEqFormer's."""
    config = load_config(paths.CONFIG / "cpu" / f"{name}.yaml")
    before = configs.config_hash(config)
    monkeypatch.setattr(configs, "DECAY_BASELINE", configs.DECAY_BASELINE + "|.*norm.*")
    assert (configs.config_hash(config) != before) == retrained


def test_a_finetuning_trained_with_another_weight_decay_mask_is_trained_again(monkeypatch):
    """A fine-tuning's mask (every parameter it trains) is not in its config file either: its hash covers it."""
    config = load_config(paths.CONFIG / "cpu" / "finetune_full.yaml", cls=configs.FinetuneConfig)
    before = configs.config_hash(config, pretrain_config_hash="0" * 16)
    monkeypatch.setattr(configs, "DECAY_ALL", r".*embeddings.*")
    assert configs.config_hash(config, pretrain_config_hash="0" * 16) != before


# Every dropout rate of every model kind: the field must change a training forward pass, or be refused by the
# config validation with a message naming it.
def _dropout_fields(config) -> list[str]:
    return [f.name for f in dataclasses.fields(config) if f.name.endswith("pdrop") or "dropout" in f.name]


MODEL_KINDS = {
    "diffeqformer": tiny(),
    "diffeqformer_llama": tiny(variant="llama", use_bias=False),
    "shared": baseline_config(tiny(), "shared"),
    "gpt2": baseline_config(tiny(), "gpt2"),
    "llama": baseline_config(tiny(), "llama"),
    "discretised": tiny(),  # built, then discretised to 3 steps
}
CASES = [(kind, name) for kind, config in MODEL_KINDS.items() for name in _dropout_fields(config)]


def test_the_dropout_fields_are_the_expected_ones():
    """The list the next test runs over: if Levanter adds a dropout field to a model, it must be tested too."""
    assert {kind: _dropout_fields(c) for kind, c in MODEL_KINDS.items()} == {
        "diffeqformer": ["embed_pdrop", "resid_pdrop"], "diffeqformer_llama": ["embed_pdrop", "resid_pdrop"],
        "shared": ["embed_pdrop", "resid_pdrop"], "discretised": ["embed_pdrop", "resid_pdrop"],
        "gpt2": ["embed_pdrop", "resid_pdrop", "attn_pdrop"], "llama": [],
    }


def _random(build, seed=0):
    """The model ``build()`` returns with every float parameter drawn from N(0, 0.3^2) by NumPy: its structure (and
    so its dropout modules) is the built model's, without the dozens of small XLA compilations of an initialisation."""
    rng = np.random.default_rng(seed)

    def fill(leaf):
        if isinstance(leaf, jax.ShapeDtypeStruct) and jnp.issubdtype(leaf.dtype, jnp.floating):
            return jnp.asarray(0.3 * rng.standard_normal(leaf.shape), dtype=leaf.dtype)
        return leaf

    return jax.tree_util.tree_map(fill, eqx.filter_eval_shape(build))


def _with_parameters_of(model, build):
    """The model ``build()`` returns, with the parameters of ``model`` (the same leaves; the dropout rates, static
    fields, are ``build``'s)."""
    return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(eqx.filter_eval_shape(build)),
                                        jax.tree_util.tree_leaves(model))


def _training_logits(models, ids) -> list:
    """The logits of a training forward pass (dropout key 1) of each model, in one compiled program."""
    return eqx.filter_jit(lambda ms: [m(ids, CAUSAL, key=jax.random.PRNGKey(1)).array for m in ms])(models)


def _build(kind: str, config):
    def build():
        model = config.build(VOCAB, key=jax.random.PRNGKey(0))
        return model.discretize(3) if kind == "discretised" else model

    return build


@pytest.mark.parametrize("kind, name", CASES, ids=[f"{k}-{n}" for k, n in CASES])
def test_every_dropout_rate_has_an_effect_or_is_refused(kind, name):
    config = dataclasses.replace(MODEL_KINDS[kind], **{name: 0.5})
    try:
        validate(TrainConfig(model=config))
    except ValueError as err:
        assert f"model.{name}" in str(err) and "do nothing" in str(err), err
        return
    ids = random_ids(jax.random.PRNGKey(2), tiny(), hax.Axis("batch", 2))
    with_dropout = _random(_build(kind, config))
    without = _with_parameters_of(with_dropout, _build(kind, dataclasses.replace(config, **{name: 0.0})))
    with_dropout, without = _training_logits([with_dropout, without], ids)
    assert not np.allclose(with_dropout, without), f"{kind}: model.{name} = 0.5 changes nothing in training"


def test_lora_dropout_has_an_effect():
    ids = random_ids(jax.random.PRNGKey(2), tiny(), hax.Axis("batch", 2))

    def build(rate):
        lora = PaperLoraConfig(r=2, dropout=rate)
        return lambda: loraize(tiny().build(VOCAB, key=jax.random.PRNGKey(0)).discretize(3), lora,
                               key=jax.random.PRNGKey(3))

    with_dropout = _random(build(0.5))  # B random too (not LoRA's B = 0), so that the adapters contribute
    without = _with_parameters_of(with_dropout, build(0.0))
    with_dropout, without = _training_logits([with_dropout, without], ids)
    assert not np.allclose(with_dropout, without)


def test_gpt2_attention_dropout_is_refused_by_name():
    config = load_config(paths.CONFIG / "smoke" / "gpt2.yaml", ["--model.attn_pdrop", "0.1"])
    with pytest.raises(ValueError, match=r"model\.attn_pdrop must be 0.*does not apply attention dropout"):
        validate(config)
    with pytest.raises(ValueError, match=r"model\.resid_pdrop must be in \[0, 1\)"):
        validate(load_config(paths.CONFIG / "smoke" / "gpt2.yaml", ["--model.resid_pdrop", "1.0"]))


# The pairs the book compares: within a preset every language model of one family (GPT-2-like: GPT-2, DiffEqFormer,
# the weight-shared model; Llama-like: Llama and DiffEqFormer's Llama variant) has the same dropout, biases and
# weight decay. The synthetic-language models (F5) are compared with nothing.
def _regularisers(config: TrainConfig) -> dict:
    model = config.model
    return {
        "embed_pdrop": getattr(model, "embed_pdrop", 0.0),
        "resid_pdrop": getattr(model, "resid_pdrop", 0.0),
        "attn_pdrop": getattr(model, "attn_pdrop", 0.0),  # DiffEqFormer and Llama have no attention dropout
        "use_bias": model.use_bias,
        "weight_decay": config.optimizer.weight_decay,
    }


def _family(model) -> str:
    llama = isinstance(model, LlamaConfig) or isinstance(model, DiffEqFormerConfig) and model.variant == "llama"
    return "llama" if llama else "gpt"


PRESETS = ("smoke", "cpu", "gpu", "paper")


@pytest.mark.parametrize("preset", PRESETS)
def test_compared_models_are_regularised_alike(preset):
    configs = sorted(p for p in (paths.CONFIG / preset).glob("*.yaml")
                     if not p.name.startswith(("finetune_", "synthetic_")))
    families: dict[str, dict[str, list[str]]] = {}
    for path in configs:
        config = load_config(path)
        assert isinstance(config.model, (DiffEqFormerConfig, Gpt2Config, LlamaConfig)), path
        key = repr(sorted(_regularisers(config).items()))
        families.setdefault(_family(config.model), {}).setdefault(key, []).append(path.name)
    for family, groups in families.items():
        assert len(groups) == 1, f"config/{preset}: the {family} models are regularised differently: {groups}"
