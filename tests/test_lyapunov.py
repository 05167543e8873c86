"""Lyapunov exponents against systems with known spectra, the token-level method against the direct one, and the
attribution methods it is compared with."""

import haliax as hax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import CAUSAL, VOCAB, random_ids, tiny

from diffeqformer.analysis import attribution, lyapunov
from diffeqformer.analysis.attribution import (
    METHOD_KEYS,
    METHODS,
    attribution_scores,
)
from diffeqformer.analysis.lyapunov import (
    compare_exponents,
    corpus_example,
    encode_text,
    kaplan_yorke_dimension,
    lyapunov_map,
    timings,
    token_lyapunov,
    trajectory,
)
from diffeqformer.report.plots.lyapunov import lyapunov_map as plot_lyapunov_map
from diffeqformer.report.plots.lyapunov import scores_html, tokens_html
from diffeqformer.report.plots.lyapunov import token_scores as plot_scores
from diffeqformer.report.words.lyapunov import lyapunov_headline as headline


def test_kaplan_yorke_dimension():
    assert float(kaplan_yorke_dimension(jnp.array([0.906, 0.0, -14.572]))) == pytest.approx(2 + 0.906 / 14.572)
    assert float(kaplan_yorke_dimension(jnp.array([-1.0, -2.0]))) == 0.0
    assert float(kaplan_yorke_dimension(jnp.array([1.0, 0.5]))) == 2.0


@pytest.fixture(scope="module")
def model_and_ids():
    config = tiny()
    model = config.build(VOCAB, key=jax.random.PRNGKey(3))
    return model, random_ids(jax.random.PRNGKey(4))


def test_trajectory_is_the_forward_pass(model_and_ids):
    model, ids = model_and_ids
    xs = trajectory(model, ids)
    assert xs.shape == (model.config.num_layers + 1, model.config.max_seq_len, model.config.hidden_dim)
    logits = hax.dot(model.ln_f(hax.named(xs[-1], (model.Pos, model.Embed))), model.get_lm_head(), axis="embed")
    np.testing.assert_allclose(logits.rearrange(("position", "vocab")).array,
                               model(ids, CAUSAL).rearrange(("position", "vocab")).array, atol=1e-5)


@pytest.mark.parametrize("output_position", [-1, 5])
def test_token_lyapunov_matches_direct_method(model_and_ids, output_position):
    model, ids = model_and_ids
    fast = token_lyapunov(model, ids, output_position=output_position)
    direct = token_lyapunov(model, ids, output_position=output_position, direct=True)
    np.testing.assert_allclose(fast.exponents.values, direct.exponents.values, atol=1e-4, equal_nan=True)
    n = model.config.max_seq_len
    out = output_position % n
    assert np.all(np.isnan(fast.max_exponent.values[out + 1:]))  # causality: later tokens have no influence
    assert np.all(np.isfinite(fast.max_exponent.values[: out + 1]))
    assert fast.sizes["exponent"] == model.config.hidden_dim


@pytest.mark.parametrize("variant", ["gpt", "llama"])
def test_row_field_is_the_fields_row(variant):
    """The fast method differentiates f_out computed alone (one query, one token's MLP): it must be the row of the
    whole field f, for the gpt variant (learned positions) and llama's (RoPE, RMSNorm, SwiGLU), at any state."""
    model = tiny(variant=variant).build(VOCAB, key=jax.random.PRNGKey(5))
    _, _, x0, blocks, pos_ids = lyapunov.prepare(model, random_ids(jax.random.PRNGKey(6)))
    x = x0.array + 0.5 * jax.random.normal(jax.random.PRNGKey(7), x0.array.shape)
    for k in (0, model.config.num_layers - 1):
        block = lyapunov.step_weights(blocks, k)
        full = lyapunov._field(block, x0.axes, pos_ids)(x)
        for out in (0, 5, x.shape[0] - 1):
            row = jax.jit(lambda x, o: lyapunov._row_field(block, x0.axes, pos_ids, o)(x))(x, out)
            np.testing.assert_allclose(np.asarray(row), np.asarray(full[out]), atol=1e-5)


def _attention_from_probabilities(attn, x, mask, pos_ids):
    """o_proj(probabilities . values): the output of ``attn`` rebuilt from ``attention_probabilities``."""
    probs = attribution.attention_probabilities(attn, x, mask, pos_ids=pos_ids)
    v = attn.v_proj(x).rename({"position": "key_position"})
    v = hax.broadcast_axis(v, attn.config.QHeadsPerGroup).flatten_axes(("kv_head", "q_heads_per_group"), "heads")
    return probs, attn.o_proj(hax.dot(probs, v, axis="key_position"))


@pytest.mark.parametrize("variant", ["gpt", "llama"])
def test_attention_probabilities_give_the_modules_output(variant):
    """The attention maps of the attribution baselines, built from Attention's public parts: with the values they
    give the module's own output (gpt: learned positions; llama: RoPE), and each row sums to one over the keys the
    causal mask allows."""
    model = tiny(variant=variant).build(VOCAB, key=jax.random.PRNGKey(5))
    _, _, x0, blocks, pos_ids = lyapunov.prepare(model, random_ids(jax.random.PRNGKey(6)))
    for k in (0, model.config.num_layers - 1):
        block = lyapunov.step_weights(blocks, k)
        x = block.attn_norm(x0 + 0.5 * hax.random.normal(jax.random.PRNGKey(7), x0.axes))
        pos = pos_ids.astype(jnp.float32) if block.attn.rot_embs is not None else pos_ids  # as ParallelBlock does
        probs, out = _attention_from_probabilities(block.attn, x, CAUSAL, pos)
        want = block.attn(x, CAUSAL, pos_ids=pos)
        np.testing.assert_allclose(out.rearrange(want.axes).array, want.array, atol=1e-5)
        p = probs.rearrange(("heads", "position", "key_position")).array
        np.testing.assert_allclose(p.sum(-1), 1.0, atol=1e-5)
        assert np.all(np.triu(np.asarray(p), 1) == 0)


def test_attention_probabilities_honour_every_attention_option():
    """The same for a Levanter Attention with every option the probabilities must follow: grouped queries, QK norm,
    RoPE, a sliding window, its own scale, a logits soft cap, float32 logits."""
    from levanter.layers.attention import Attention, AttentionConfig
    from levanter.layers.normalization import RmsNormConfig
    from levanter.layers.rotary import DefaultRotaryEmbeddingsConfig

    Embed, Pos = hax.Axis("embed", 16), hax.Axis("position", 12)
    config = AttentionConfig(Embed, num_heads=4, num_kv_heads=2, use_bias=True, upcast_attn=True,
                             rope=DefaultRotaryEmbeddingsConfig(), sliding_window=5, scaling_factor=0.3,
                             logits_soft_cap=2.0, qk_norm=RmsNormConfig(use_weight=True, use_bias=False))
    attn = Attention.init(config, key=jax.random.PRNGKey(8))
    x = hax.random.normal(jax.random.PRNGKey(9), (Pos, Embed))
    pos = hax.arange(Pos, dtype=jnp.float32)
    probs, out = _attention_from_probabilities(attn, x, CAUSAL, pos)
    want = attn(x, CAUSAL, pos_ids=pos)
    np.testing.assert_allclose(out.rearrange(want.axes).array, want.array, atol=1e-5)
    p = probs.rearrange(("heads", "position", "key_position")).array
    band = np.tril(np.ones((12, 12), bool)) & ~np.tril(np.ones((12, 12), bool), -5)  # the last 5 keys up to i
    assert np.all(p[:, ~band] == 0) and np.all(p[:, band] > 0)


def test_lyapunov_map_rows_equal_single_output(model_and_ids):
    model, ids = model_and_ids
    full = lyapunov_map(model, ids)
    for out in (3, 11):
        single = token_lyapunov(model, ids, output_position=out)
        np.testing.assert_allclose(full.exponents.sel(output=out).values, single.exponents.values, atol=1e-5,
                                   equal_nan=True)


def test_weight_shared_model_runs():
    config = tiny(time_dependent=False)
    model = config.build(VOCAB, key=jax.random.PRNGKey(0))
    ds = token_lyapunov(model, random_ids(jax.random.PRNGKey(1)))
    assert np.isfinite(ds.max_exponent.values).all()


def test_attribution_baselines(model_and_ids):
    model, ids = model_and_ids
    n = model.config.max_seq_len
    df = attribution_scores(model, ids)
    for name in METHODS[2:]:
        assert df[name].shape == (n,) and np.all(np.isfinite(df[name])), name
    np.testing.assert_allclose(df["raw attention"].sum(), 1.0, atol=1e-5)  # softmax rows, averaged
    np.testing.assert_allclose(df["attention rollout"].sum(), 1.0, atol=1e-5)
    att = attribution.attention_weights(model, ids)
    assert np.all(att.mean(axis=(0, 1))[4, 5:] == 0)  # causal: position 4 attends to none after it


def test_rendering(model_and_ids):
    import matplotlib

    matplotlib.use("Agg")
    model, ids = model_and_ids
    words = [f"w{i}<" for i in range(model.config.max_seq_len)]
    ds = token_lyapunov(model, ids, tokens=words)
    page = tokens_html(words, ds.max_exponent.values, output_position=-1)
    assert page.count("<span") == len(words) and "w3&lt;" in page
    fig = plot_lyapunov_map(lyapunov_map(model, ids, tokens=words))
    assert fig.axes


def test_attribution_scores_equal_the_single_methods(model_and_ids):
    model, ids = model_and_ids
    out = 7
    words = [f"w{i}" for i in range(model.config.max_seq_len)]
    df = attribution_scores(model, ids, out, tokens=words)
    assert list(df.columns) == ["text", *METHODS] and df.attrs["output_position"] == out
    assert set(METHOD_KEYS) == set(METHODS)
    lyap = token_lyapunov(model, ids, output_position=out)
    want = {"lyapunov (max exponent)": lyap.max_exponent.values, "lyapunov (sum)": lyap.sum_exponents.values}
    for name, values in want.items():
        np.testing.assert_allclose(df[name].values[: out + 1], values[: out + 1], rtol=1e-5, atol=1e-6,
                                   err_msg=name)
        assert np.isnan(df[name].values[out + 1:]).all()  # after the output: causally irrelevant


def test_timings_compare_the_two_methods(model_and_ids):
    model, ids = model_and_ids
    table = timings(model, ids, repeats=1)
    assert list(table.index) == ["fast (reverse-mode rows)", "direct (full Jacobian)"]
    assert (table.median_s > 0).all() and (table.compile_s > 0).all()
    assert table.attrs["max_abs_difference"] < 1e-4 and table.attrs["tokens"] == model.config.max_seq_len
    assert table.attrs["speedup"] == pytest.approx(table.median_s.iloc[1] / table.median_s.iloc[0])
    with pytest.raises(ValueError, match="repeats"):
        timings(model, ids, repeats=0)
    assert table.attrs["finite_exponents"] == ids.size * model.config.hidden_dim
    assert table.attrs["nonfinite_exponents"] == 0


def test_compare_exponents_counts_kinds_and_compares_finite_ones():
    inf, nan = np.inf, np.nan
    a = np.array([[1.0, -inf, nan], [0.5, 2.0, inf]])
    b = np.array([[1.25, -inf, nan], [0.5, 1.5, inf]])
    check = compare_exponents(a, b, names=("fast", "direct"))
    assert check.counts == {"fast": {"finite": 3, "-inf": 1, "+inf": 1, "nan": 1},
                            "direct": {"finite": 3, "-inf": 1, "+inf": 1, "nan": 1}}
    assert (check.mismatched, check.compared, check.max_abs_difference) == (0, 3, 0.5)
    # one method finite where the other is not, -inf against NaN: disagreements, not skipped
    c = np.array([[1.0, nan, nan], [-inf, 2.0, inf]])
    check = compare_exponents(a, c)
    assert (check.mismatched, check.compared, check.max_abs_difference) == (2, 2, 0.0)
    nothing = compare_exponents(np.full(3, -inf), np.full(3, -inf))
    assert (nothing.mismatched, nothing.compared, nothing.max_abs_difference) == (0, 0, None)
    with pytest.raises(ValueError, match="shapes"):
        compare_exponents(a, a[0])


def _edit_exponents(monkeypatch, edit):
    """token_lyapunov, as timings calls it, with ``edit(exponents [token, exponent], direct)`` applied to a copy of
    its exponents: the -inf (a singular step I + h J) and NaN (a non-finite state) that the tiny model does not
    produce."""
    def patched(model, token_ids, **kwargs):
        ds = token_lyapunov(model, token_ids, **kwargs).copy(deep=True)  # the module's own, not an earlier patch
        edit(ds["exponents"].values, kwargs.get("direct", False))
        return ds

    monkeypatch.setattr(lyapunov, "token_lyapunov", patched)


def test_timings_compare_finite_exponents_only(model_and_ids, monkeypatch):
    model, ids = model_and_ids
    D = model.config.hidden_dim

    def direct_nan(e, direct):
        if direct:
            e[4, 0] = np.nan  # the direct method fails where the fast one does not: np.nanmax skipped this

    _edit_exponents(monkeypatch, direct_nan)
    with pytest.raises(ValueError, match="1 of .* differ in kind"):
        timings(model, ids, repeats=1)

    def all_nan(e, direct):
        e[:] = np.nan  # a non-finite state: every difference is NaN (the 'All-NaN slice' of the benchmark)

    _edit_exponents(monkeypatch, all_nan)
    with pytest.raises(ValueError, match="0 are finite in both"):
        timings(model, ids, repeats=1)

    def both_minus_inf(e, direct):
        e[2, -3:] = -np.inf  # the same three exponents of token 2 collapse in both methods

    _edit_exponents(monkeypatch, both_minus_inf)
    table = timings(model, ids, repeats=1)
    assert np.isfinite(table.attrs["max_abs_difference"]) and table.attrs["max_abs_difference"] < 1e-4
    assert (table.attrs["finite_exponents"], table.attrs["nonfinite_exponents"]) == (ids.size * D - 3, 3)


def test_encode_text_and_score_rendering(model_and_ids, tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    from diffeqformer.data.corpora import load_tokenizer
    from diffeqformer.data.synthetic import prepare

    tok = load_tokenizer(prepare(tmp_path, train_documents=2, validation_documents=1).tokenizer)
    ids, labels = encode_text(tok, "alice takes the\nbook .", max_tokens=4)
    assert ids.dtype == np.int32 and list(ids) == tok.encode("alice takes the book")[-4:]
    assert labels == ["alice", "takes", "the", "book"]

    model, ids = model_and_ids
    words = [f"w{i}<" for i in range(model.config.max_seq_len)]
    df = attribution_scores(model, ids, 5, tokens=words)
    page = scores_html(df)
    assert page.count("<tr>") == len(METHODS) and page.count("<span") == len(METHODS) * len(words)
    assert "w3&lt;" in page and "outline" in page
    fig = plot_scores(df)
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == list(METHODS)


def test_corpus_example_and_headline(model_and_ids, tmp_path):
    import json

    from diffeqformer.data.corpora import CorpusLayout, train_tokenizer

    layout = CorpusLayout(tmp_path)
    texts = ["From fairest creatures we desire increase,\nThat thereby beauty's rose might never die",
             "Shall I compare thee to a summer's day?"]
    for split, text in zip(("train", "validation"), texts):
        layout.jsonl("all", split).parent.mkdir(parents=True, exist_ok=True)
        layout.jsonl("all", split).write_text(json.dumps({"text": text}) + "\n")
    train_tokenizer(texts, layout.tokenizer(300), vocab_size=300)
    example = corpus_example("compare thee to a", vocab_size=300, root=tmp_path, max_tokens=3)
    assert len(example.ids) == len(example.tokens) == 3
    assert "".join(example.tokens) == example.tokenizer.decode(list(example.ids))
    assert "compare thee to a".startswith("".join(example.tokens))
    with pytest.raises(ValueError, match="does not occur"):
        corpus_example("From fairest", vocab_size=300, root=tmp_path)  # in the training split only

    model, ids = model_and_ids
    words = [f" w{i}" for i in range(model.config.max_seq_len)]
    df = attribution_scores(model, ids, 6, tokens=words)
    timing = timings(model, ids, repeats=1)
    text = headline(df, timing, tokenizer=example.tokenizer)
    assert text["tokens"] == str(model.config.max_seq_len) and text["output_token"] == "'w6'"
    best = df["lyapunov (max exponent)"].iloc[:6].nlargest(3).index
    assert text["top_lyapunov_max"] == ", ".join(f"'w{i}'" for i in best)
    assert text["speedup"] == f"{timing.attrs['speedup']:.1f}" and "predicted" in text
    assert text["finite_exponents"] == str(ids.size * model.config.hidden_dim) and text["nonfinite_exponents"] == "0"
    assert text["nonfinite_example"] == "0"


def _hand_scores(column: list[float], out: int) -> "pd.DataFrame":
    """attribution_scores' layout with hand-made values: ``column`` for both Lyapunov methods, 1..n for the others."""
    import pandas as pd

    n = len(column)
    df = pd.DataFrame({m: column if m.startswith("lyapunov") else list(np.arange(1.0, n + 1)) for m in METHODS},
                      index=pd.RangeIndex(n, name="token"))
    df.insert(0, "text", [f"t{i}" for i in range(n)])
    df.attrs.update(output_position=out, predicted_token=0)
    return df


def test_headline_and_figure_use_finite_scores_only():
    """nlargest drops NaN but keeps +-inf (it put +inf first, and -inf among the 'top' tokens when fewer than three
    were finite); a -inf made plot_scores' min-max scale infinite and the whole row blank."""
    import matplotlib

    matplotlib.use("Agg")
    df = _hand_scores([np.inf, 0.1, -np.inf, 0.3, np.nan, 9.0], out=5)
    text = headline(df)
    assert text["top_lyapunov_max"] == text["top_lyapunov_sum"] == "'t3', 't1'"
    assert text["top_attention"] == "'t4', 't3', 't2'"
    assert text["nonfinite_example"] == "6"  # three per Lyapunov method
    image = np.ma.masked_invalid(plot_scores(df).axes[0].images[0].get_array())
    row = image[METHODS.index("lyapunov (max exponent)")]
    assert list(np.ma.getmaskarray(row)) == [True, False, True, False, True, True]
    assert (row[1], row[3]) == (0.0, 1.0)


def test_kaplan_yorke_of_nonfinite_exponents(model_and_ids):
    """-inf exponents have a limit (D_KY of the finite ones); NaN or +inf have none (np.nan_to_num made them 0 and
    +-max float, and D_KY a number)."""
    model, _ = model_and_ids
    exps = np.array([[[0.5, -1.0, -2.0], [0.5, -1.0, -np.inf], [0.5, np.nan, -2.0], [np.inf, -1.0, -2.0],
                      [-np.inf, -np.inf, -np.inf]]])
    ds = lyapunov._dataset(exps, [4], 5, None, model).isel(output=0)
    np.testing.assert_allclose(ds.kaplan_yorke.values[:2], [1.5, 1.5])
    assert np.isnan(ds.kaplan_yorke.values[2:4]).all() and ds.kaplan_yorke.values[4] == 0.0
    assert ds.max_exponent.values[4] == ds.sum_exponents.values[1] == -np.inf and np.isnan(ds.sum_exponents.values[2])
