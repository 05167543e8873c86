"""Spectra against independent NumPy references: QK, OV, FFN of the ODE model and of the baselines, fast vs full
eigenvalues, weight sharing, continuity in t, tidy summaries, the netCDF round trip, the words and the plots."""

import dataclasses

import equinox as eqx
import haliax as hax
import jax
import jax.numpy as jnp
import matplotlib
import numpy as np
import pytest
import xarray as xr
from diffeqformer.model.baselines import baseline_config
from helpers import VOCAB, tiny
from matplotlib.figure import Figure
from scipy.optimize import linear_sum_assignment

from diffeqformer.analysis import statistics
from diffeqformer.cache import save_netcdf
from diffeqformer.analysis import spectra as S
from diffeqformer.report.words import spectra as words
from diffeqformer.report.plots import spectra as P

matplotlib.use("Agg")

TIMES = np.array([0.0, 0.37, 1.0])


def assert_same_eigenvalues(got, want, tol=1e-4):
    """Equal as multisets: the best one-to-one matching (Hungarian) is within tol * spectral radius."""
    got, want = np.asarray(got).ravel(), np.asarray(want).ravel()
    assert got.shape == want.shape, (got.shape, want.shape)
    cost = np.abs(got[:, None] - want[None, :])
    rows, cols = linear_sum_assignment(cost)
    err, scale = cost[rows, cols].max(), np.abs(want).max()
    assert err <= tol * scale, f"eigenvalues differ by {err:.3e} (spectral radius {scale:.3e})"


def names(x):
    return tuple(ax.name for ax in x.axes)


def padded(lam, size):
    """The fast path's nonzero eigenvalues plus the structural zeros of the D x D matrix."""
    return np.concatenate([lam, np.zeros(size - lam.size, dtype=lam.dtype)])


def raw_head_matrices(block, i, h):
    """W_Q, W_K, W_V (D x d_k) and W_O (d_k x D) of head h at time index i, by plain indexing of the raw arrays."""
    a = block.attn
    assert names(a.q_proj.weight) == ("time", "kv_head", "q_heads_per_group", "head_size", "embed")
    assert names(a.k_proj.weight) == ("time", "kv_head", "head_size", "embed")
    assert names(a.v_proj.weight) == ("time", "kv_head", "head_size", "embed")
    assert names(a.o_proj.weight) == ("time", "embed", "heads", "head_size")
    f64 = lambda x: np.asarray(x.array, dtype=np.float64)  # noqa: E731
    wq = f64(a.q_proj.weight)[i, h, 0].T
    wk = f64(a.k_proj.weight)[i, h].T
    wv = f64(a.v_proj.weight)[i, h].T
    wo = f64(a.o_proj.weight)[i, :, h, :].T
    return wq, wk, wv, wo


def random_model(config, seed=0):
    """A model of ``config`` with every float parameter drawn from N(0, 0.3^2).

    Not ``config.build``: initialising a model runs dozens of small XLA compilations (~20 s per model on two busy CPU
    cores), and the spectra do not care how the random weights were drawn, only that every matrix is generic.
    """
    rng = np.random.default_rng(seed)
    skeleton = eqx.filter_eval_shape(config.build, VOCAB, key=jax.random.PRNGKey(0))

    def fill(leaf):
        if isinstance(leaf, jax.ShapeDtypeStruct) and jnp.issubdtype(leaf.dtype, jnp.floating):
            return jnp.asarray(0.3 * rng.standard_normal(leaf.shape), dtype=leaf.dtype)
        return leaf

    return jax.tree_util.tree_map(fill, skeleton)


@pytest.fixture(scope="module")
def model():
    return random_model(tiny())


@pytest.fixture(scope="module")
def ds(model):
    return S.spectra(model, TIMES)


def block_at(model, times):
    return model.weights_at(hax.named(jnp.asarray(times, dtype=jnp.float32), "time"))


def test_dataset_layout(ds, model):
    c = model.config
    assert ds.qk.dims == ("time", "head", "eig") and ds.ov.dims == ("time", "head", "eig")
    assert ds.ffn.dims == ("time", "ffn_eig")
    assert ds.qk.shape == (3, c.num_heads, c.HeadSize.size)
    assert ds.ffn.shape == (3, c.hidden_dim)  # min(D, M) = D
    assert all(ds[m].dtype == np.complex128 for m in S.MATRICES)
    assert np.abs(ds.qk.imag).max() > 0  # complex eigenvalues are kept
    np.testing.assert_array_equal(ds.time.values, TIMES)
    assert ds.attrs["model_kind"] == "diffeqformer"
    assert S.config_of(ds) == c
    mags = np.abs(ds.qk.values)
    assert np.all(np.diff(mags, axis=-1) <= 0)  # sorted by decreasing magnitude


@pytest.mark.parametrize("matrix", ["qk", "ov"])
def test_attention_spectra_match_numpy(ds, model, matrix):
    block = block_at(model, TIMES)
    D = model.config.hidden_dim
    for i in range(len(TIMES)):
        for h in range(model.config.num_heads):
            wq, wk, wv, wo = raw_head_matrices(block, i, h)
            full = wq @ wk.T if matrix == "qk" else wv @ wo  # D x D
            want = np.linalg.eigvals(full)
            assert_same_eigenvalues(padded(ds[matrix].values[i, h], D), want)


@pytest.mark.parametrize("variant", ["gpt", "llama"])
def test_ffn_spectrum_matches_numpy(variant):
    model = random_model(tiny(variant=variant), 1)
    ds = S.spectra(model, TIMES)
    mlp = block_at(model, TIMES).mlp
    if variant == "gpt":
        assert names(mlp.c_fc.weight) == ("time", "embed", "mlp")
        assert names(mlp.c_proj.weight) == ("time", "mlp", "embed")
        w1, w2 = np.asarray(mlp.c_fc.weight.array, np.float64), np.asarray(mlp.c_proj.weight.array, np.float64)
    else:  # W_1 = W_gate, W_2 = W_down, both stored output-first
        assert names(mlp.gate_proj.weight) == ("time", "mlp", "embed")
        assert names(mlp.down_proj.weight) == ("time", "embed", "mlp")
        w1 = np.swapaxes(np.asarray(mlp.gate_proj.weight.array, np.float64), 1, 2)
        w2 = np.swapaxes(np.asarray(mlp.down_proj.weight.array, np.float64), 1, 2)
    for i in range(len(TIMES)):
        assert_same_eigenvalues(ds.ffn.values[i], np.linalg.eigvals(w1[i] @ w2[i]))


def test_product_eigvals_fast_equals_full():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((3, 10, 4))  # n = 10 > r = 4: the fast path diagonalises B A (4 x 4)
    b = rng.standard_normal((3, 4, 10))
    fast, full = S.product_eigvals(a, b), S.product_eigvals(a, b, "full")
    assert fast.shape == (3, 4) and full.shape == (3, 10)
    for i in range(3):
        assert_same_eigenvalues(padded(fast[i], 10), full[i])
        assert_same_eigenvalues(full[i], np.linalg.eigvals(a[i] @ b[i]))
    # r >= n: the n x n product itself, both ways
    np.testing.assert_array_equal(S.product_eigvals(b, a), S.product_eigvals(b, a, "full"))


def test_model_fast_equals_full(ds, model):
    full = S.spectra(model, TIMES, method="full")
    D = model.config.hidden_dim
    assert full.qk.shape[-1] == D and full.ffn.shape[-1] == D
    for matrix in ("qk", "ov"):
        for i in range(len(TIMES)):
            for h in range(model.config.num_heads):
                assert_same_eigenvalues(padded(ds[matrix].values[i, h], D), full[matrix].values[i, h])
    assert_same_eigenvalues(ds.ffn.values, full.ffn.values)


def test_weight_shared_spectra_identical_for_all_t():
    shared = random_model(baseline_config(tiny(), "shared"), 2)
    ds = S.spectra(shared, np.linspace(0.0, 1.0, 5))
    assert ds.attrs["model_kind"] == "diffeqformer-shared"
    for m in S.MATRICES:
        for i in range(1, 5):
            np.testing.assert_array_equal(ds[m].values[i], ds[m].values[0])
    layers = S.spectra(shared)
    np.testing.assert_array_equal(layers.qk.values, np.broadcast_to(ds.qk.values[:1], layers.qk.shape))


def test_time_dependent_spectra_change_continuously(model):
    # The sinusoids run at up to s = 1000 rad per unit t, so "small" dt is 1e-6 (1e-3 rad).
    t0 = np.array([0.2, 0.6])
    base, near, far = (S.spectra(model, t0 + dt) for dt in (0.0, 1e-6, 1e-2))
    for m in S.MATRICES:
        rho = np.abs(base[m].values).max()
        small = np.abs(np.abs(near[m].values) - np.abs(base[m].values)).max()
        big = np.abs(np.abs(far[m].values) - np.abs(base[m].values)).max()
        assert small <= 1e-2 * rho, (m, small, rho)
        assert small < 0.1 * big, (m, small, big)  # and the spectrum does move with t


def test_layer_spectra_are_the_euler_steps(model):
    L = model.config.num_layers
    layers = S.spectra(model)
    assert layers.qk.dims == ("layer", "head", "eig")
    np.testing.assert_array_equal(layers.layer.values, np.arange(L))
    np.testing.assert_allclose(layers.time.values, (np.arange(L) + 1.0) / L)
    at_times = S.spectra(model, (np.arange(L) + 1.0) / L)
    for m in S.MATRICES:
        np.testing.assert_array_equal(layers[m].values, at_times[m].values)
    discrete = S.spectra(model.discretize(L))  # W(t_k) materialised by the model itself, in float32 t
    assert discrete.attrs["model_kind"] == "diffeqformer-discrete"
    for m in S.MATRICES:
        for k in range(L):
            assert_same_eigenvalues(discrete[m].values[k], layers[m].values[k])


def test_gpt2_baseline_matches_numpy():
    gpt = random_model(baseline_config(tiny(), "gpt2"), 3)  # random LayerNorm gains too, for fold_norm
    blocks = gpt.transformer.blocks.stacked
    assert names(blocks.attn.c_attn.weight) == ("layers", "embed", "qkv", "heads", "head_size")
    assert names(blocks.attn.c_proj.weight) == ("layers", "heads", "head_size", "embed")
    qkv = np.asarray(blocks.attn.c_attn.weight.array, np.float64)
    wo = np.asarray(blocks.attn.c_proj.weight.array, np.float64)
    g = np.asarray(blocks.ln_1.weight.array, np.float64)
    ds, folded = S.spectra(gpt), S.spectra(gpt, fold_norm=True)
    assert ds.attrs["model_kind"] == "gpt2" and ds.qk.dims == ("layer", "head", "eig")
    D = gpt.config.hidden_dim
    for k in range(gpt.config.num_layers):
        for h in range(gpt.config.num_heads):
            wq, wk, wv = qkv[k, :, 0, h], qkv[k, :, 1, h], qkv[k, :, 2, h]
            assert_same_eigenvalues(padded(ds.qk.values[k, h], D), np.linalg.eigvals(wq @ wk.T))
            assert_same_eigenvalues(padded(ds.ov.values[k, h], D), np.linalg.eigvals(wv @ wo[k, h]))
            gq = np.diag(g[k]) @ wq @ wk.T @ np.diag(g[k])  # LN(x) W_Q = x_hat diag(gamma) W_Q
            assert_same_eigenvalues(padded(folded.qk.values[k, h], D), np.linalg.eigvals(gq))
    w1 = np.asarray(blocks.mlp.c_fc.weight.array, np.float64)
    w2 = np.asarray(blocks.mlp.c_proj.weight.array, np.float64)
    for k in range(gpt.config.num_layers):
        assert_same_eigenvalues(ds.ffn.values[k], np.linalg.eigvals(w1[k] @ w2[k]))
    with pytest.raises(TypeError, match="arbitrary times"):
        S.spectra(gpt, [0.5])


def test_llama_baseline_with_grouped_query_heads_matches_numpy():
    config = dataclasses.replace(baseline_config(tiny(num_heads=4), "llama"), num_kv_heads=2)
    llama = random_model(config, 4)
    ds = S.spectra(llama)
    assert ds.attrs["model_kind"] == "llama" and ds.qk.shape == (4, 4, 4)
    a = llama.transformer.layers.stacked.self_attn
    assert names(a.q_proj.weight) == ("layer", "kv_head", "q_heads_per_group", "head_size", "embed")
    q, k_, v = (np.asarray(w.array, np.float64) for w in (a.q_proj.weight, a.k_proj.weight, a.v_proj.weight))
    o = np.asarray(a.o_proj.weight.array, np.float64)  # [layer, embed, heads, head_size]
    D = config.hidden_dim
    for layer in range(config.num_layers):
        for g in range(2):
            for j in range(2):
                h = 2 * g + j  # Levanter flattens (kv_head, q_heads_per_group) kv-head-major
                qk = q[layer, g, j].T @ k_[layer, g]
                ov = v[layer, g].T @ o[layer, :, h, :].T
                assert_same_eigenvalues(padded(ds.qk.values[layer, h], D), np.linalg.eigvals(qk))
                assert_same_eigenvalues(padded(ds.ov.values[layer, h], D), np.linalg.eigvals(ov))
    w1 = np.swapaxes(np.asarray(llama.transformer.layers.stacked.mlp.gate_proj.weight.array, np.float64), 1, 2)
    w2 = np.swapaxes(np.asarray(llama.transformer.layers.stacked.mlp.down_proj.weight.array, np.float64), 1, 2)
    for layer in range(config.num_layers):
        assert_same_eigenvalues(ds.ffn.values[layer], np.linalg.eigvals(w1[layer] @ w2[layer]))


def test_unknown_model_is_rejected():
    with pytest.raises(TypeError, match="no spectra"):
        S.spectra(object())


def test_summary_is_tidy_and_correct(ds, model):
    df = S.summarize(ds)
    H = model.config.num_heads
    assert len(df) == len(TIMES) * (2 * H + 1)
    assert list(df.columns[:3]) == ["time", "matrix", "head"]
    assert df.loc[df.matrix == "ffn", "head"].isna().all()
    row = df[(df.time == TIMES[1]) & (df.matrix == "ov") & (df["head"] == 1)].iloc[0]
    lam = ds.ov.values[1, 1]
    rho = np.abs(lam).max()
    assert row.spectral_radius == pytest.approx(rho)
    assert row.max_real == pytest.approx(lam.real.max())
    nonzero = np.abs(lam) > 1e-6 * rho
    assert row.n_nonzero == nonzero.sum()
    assert row.frac_positive_real == pytest.approx((lam.real > 1e-6 * rho).sum() / nonzero.sum())
    assert row.positivity == pytest.approx(lam.real.sum() / np.abs(lam).sum())
    layer_df = S.summarize(S.spectra(model))
    assert list(layer_df.columns[:4]) == ["layer", "time", "matrix", "head"]
    change = S.spectral_change(ds)
    assert len(change) == (len(TIMES) - 1) * (2 * H + 1) and (change.change >= 0).all()


def test_save_load_round_trip(ds, tmp_path):
    path = save_netcdf(ds, tmp_path / "spectra.nc")
    back = S.load_spectra(path)
    assert back.identical(ds)
    assert back.qk.dtype == np.complex128 and back["head"].dtype == np.int64
    assert S.config_of(back) == S.config_of(ds)


def test_cached_spectra_reuses_the_file(model, tmp_path):
    first = S.cached_spectra(model, tmp_path, TIMES)
    files = list(tmp_path.glob("spectra-*.nc"))
    assert len(files) == 1
    assert S.cached_spectra(model, tmp_path, TIMES).identical(first)
    S.cached_spectra(model, tmp_path, TIMES[:2])
    assert len(list(tmp_path.glob("spectra-*.nc"))) == 2


def test_plots_return_figures(ds, tmp_path):
    gpt = S.spectra(random_model(baseline_config(tiny(), "gpt2"), 5))
    figs = [
        P.vs_depth(ds, "qk", "real"),
        P.vs_depth(ds, "ov", "abs", logy=True),
        P.vs_depth(gpt, "ffn", "abs"),
        P.complex_plane(ds, "ov"),
        P.complex_plane(gpt, "qk"),
        P.comparison({"DiffEqFormer": ds, "GPT-2": gpt}, "qk", "abs"),
    ]
    for i, fig in enumerate(figs):
        assert isinstance(fig, Figure)
        fig.savefig(tmp_path / f"{i}.png")
    assert "QK" in figs[0].axes[0].get_title()
    with pytest.raises(ValueError):
        P.vs_depth(ds, "qk", "imag")


def test_depth_trends_against_scipy(ds):
    from scipy.stats import spearmanr

    summary = S.summarize(ds)
    trends = S.depth_trends(summary)
    H = ds.sizes["head"]
    assert len(trends) == (2 * H + 1) * 2 and set(trends.stat) == {"spectral_radius", "positivity"}
    for matrix, head in (("qk", 0), ("ov", 1), ("ffn", None)):
        same_head = summary["head"].isna() if head is None else summary["head"] == head
        rows = summary[(summary.matrix == matrix) & same_head]
        want = spearmanr(rows.time, rows.spectral_radius).statistic
        got = trends[(trends.matrix == matrix) & (trends.stat == "spectral_radius")
                     & (trends["head"].isna() if head is None else trends["head"] == head)].iloc[0]
        assert got.spearman == pytest.approx(want, abs=1e-12)
        assert got.first == pytest.approx(rows.spectral_radius.iloc[0])
        assert got.last == pytest.approx(rows.spectral_radius.iloc[-1])
        assert got.peak_time == rows.time.iloc[int(np.argmax(rows.spectral_radius.to_numpy()))]
        assert got.points == len(TIMES)


def test_trends_and_changes_of_a_weight_shared_model():
    """Constant spectra: no trend (NaN correlation) and no change between depth points."""
    shared = S.spectra(random_model(tiny(time_dependent=False), 3), TIMES)
    trends = S.depth_trends(S.summarize(shared))
    assert trends.spearman.isna().all()
    assert (S.mean_change(shared) == 0).all()
    ode = S.spectra(random_model(tiny()))
    change = S.spectral_change(ode)
    assert S.mean_change(ode)["qk"] == pytest.approx(change[change.matrix == "qk"].change.mean())


def test_seed_spectra_reads_trained_runs(tmp_path):
    """A continuous model at its Euler steps, a GPT-2 per layer, both through the cache."""
    import json

    from diffeqformer.runs import MODEL as RUN_MODEL
    from diffeqformer.config import TrainConfig, dump_config

    runs = {}
    for name, config, seed in (("ode", tiny(), 0), ("gpt", baseline_config(tiny(), "gpt2"), 1)):
        run = tmp_path / name
        run.mkdir()
        (run / "config.yaml").write_text(dump_config(TrainConfig(name=name, model=config)))
        (run / "complete.json").write_text(json.dumps({"vocab_size": VOCAB.size}))
        eqx.tree_serialise_leaves(run / RUN_MODEL, random_model(config, seed))
        runs[name] = run
    got = {label: seeds[0] for label, seeds in S.seed_spectra(runs, cache_dir=tmp_path / "cache").items()}
    assert list(got) == ["ode", "gpt"]
    assert S.depth_dim(got["ode"]) == "layer" and got["ode"].sizes["layer"] == tiny().num_layers
    assert S.depth_dim(got["gpt"]) == "layer" and got["gpt"].sizes["layer"] == tiny().num_layers
    xr.testing.assert_equal(got["ode"], S.spectra(random_model(tiny(), 0)))  # the saved weights were read
    assert len(list((tmp_path / "cache").glob("spectra-*.nc"))) == 2


def test_resolving_times(ds, model):
    zoom_t = S.resolving_times(ds, 5, center=0.5, per_period=4)
    step = 2 * np.pi / model.config.sinusoidal_scale / 4
    np.testing.assert_allclose(np.diff(zoom_t), step, rtol=1e-12)
    assert zoom_t.mean() == pytest.approx(0.5)
    with pytest.raises(ValueError):
        S.resolving_times(model.config, 1)


def test_fold_norm_uses_the_time_dependent_gains(model):
    """fold_norm on the ODE model: QK^h(t) = diag(gamma_1(t)) W_Q W_K^T diag(gamma_1(t)), OV^h(t) = diag(gamma_1(t))
    W_V W_O and W_1 W_2 -> diag(gamma_2(t)) W_1 W_2, with gamma(t) = 1 + h(t) . F_w varying with t."""
    block = block_at(model, TIMES)
    gain = lambda norm: np.asarray(norm.weight.array, np.float64)  # noqa: E731  [time, embed]
    g1, g2 = gain(block.attn_norm), gain(block.mlp_norm)
    assert np.abs(g1[0] - g1[-1]).max() > 1e-2  # the random F_w make the gains depend on t
    folded = S.spectra(model, TIMES, fold_norm=True)
    assert folded.attrs["fold_norm"] == 1
    D = model.config.hidden_dim
    w1 = np.asarray(block.mlp.c_fc.weight.array, np.float64)
    w2 = np.asarray(block.mlp.c_proj.weight.array, np.float64)
    for i in range(len(TIMES)):
        G1, G2 = np.diag(g1[i]), np.diag(g2[i])
        for h in range(model.config.num_heads):
            wq, wk, wv, wo = raw_head_matrices(block, i, h)
            assert_same_eigenvalues(padded(folded.qk.values[i, h], D), np.linalg.eigvals(G1 @ wq @ wk.T @ G1))
            assert_same_eigenvalues(padded(folded.ov.values[i, h], D), np.linalg.eigvals(G1 @ wv @ wo))
        assert_same_eigenvalues(folded.ffn.values[i], np.linalg.eigvals(G2 @ w1[i] @ w2[i]))


def growing(slopes, *, layers=6, heads=2, d_k=3, seed=0, scale=1.0):
    """Layer spectra of models whose spectral radius at depth t is scale * exp(slope * t) in every head and in the
    FFN, one dataset per slope (seed); the other eigenvalues are complex and smaller."""
    rng = np.random.default_rng(seed)
    t = (np.arange(layers) + 1.0) / layers
    out = []
    for slope in slopes:
        rho = scale * np.exp(slope * t)[:, None, None]
        rest = rho * rng.uniform(0.1, 0.9, (layers, heads, d_k - 1)) * np.exp(1j * rng.uniform(0, np.pi, (1, 1, 1)))
        qk = np.concatenate([rho * np.ones((layers, heads, 1)), rest], axis=-1)
        ffn = np.concatenate([rho[:, 0], rest[:, 0]], axis=-1)
        out.append(xr.Dataset({"qk": (("layer", "head", "eig"), qk), "ov": (("layer", "head", "eig"), -qk),
                               "ffn": (("layer", "ffn_eig"), ffn)},
                              coords={"layer": np.arange(layers), "time": ("layer", t)}))
    return out


def test_log_radius_slope_against_polyfit(ds):
    for m, got in S.log_radius_slope(ds).items():
        eig = "ffn_eig" if m == "ffn" else "eig"
        y = np.log(np.abs(ds[m]).max(eig).values).reshape(len(TIMES), -1).mean(axis=1)
        assert got == pytest.approx(np.polyfit(TIMES, y, 1)[0], rel=1e-10)
    assert S.log_radius_slope(growing([1.5])[0]) == pytest.approx({m: 1.5 for m in S.MATRICES}, rel=1e-12)
    # constant spectra have no slope, exactly: not the rounding noise of log(0.41) - mean(log(0.41), ...) (-5e-32)
    assert S.log_radius_slope(growing([0.0], scale=0.41)[0]) == {m: 0.0 for m in S.MATRICES}


def test_depth_growth_is_judged_over_seeds():
    """A slope that every seed shares is significant; slopes of both signs are inconclusive; one seed is untested;
    a constant spectrum is constant. The test is the one-sample t-test of the seeds' slopes (scipy's). The claim
    (both QK and OV grow) is reproduced where both grow, contradicted where they shrink, untested with one seed."""
    from scipy.stats import ttest_1samp

    models = {"up": growing([1.0, 1.2, 0.9]), "down": growing([-2.0, -1.7, -2.2], seed=1),
              "mixed": growing([1.0, -1.1, 0.2], seed=2), "one": growing([1.0]),
              "flat": growing([0.0, 0.0], scale=0.41)}
    g = S.depth_growth(models).set_index(["model", "matrix"])
    assert len(g) == 5 * len(S.MATRICES)
    up = g.loc[("up", "qk")]
    assert up.slope == pytest.approx((1.0 + 1.2 + 0.9) / 3) and up.seeds == 3
    assert up.comparison.p == pytest.approx(ttest_1samp([1.0, 1.2, 0.9], 0.0).pvalue, rel=1e-9)
    assert up.factor == pytest.approx(np.exp(up.slope * (1 - 1 / 6)))
    assert up.comparison.test == statistics.ONE_SAMPLE
    trend = lambda key: words.growth_trend(g.loc[key].comparison, g.loc[key].slopes)  # noqa: E731
    assert up.verdict == statistics.SIGNIFICANT and trend(("up", "qk")) == "grows with depth"
    assert trend(("down", "ov")) == "shrinks with depth"
    assert g.loc[("mixed", "ffn")].verdict == statistics.INCONCLUSIVE
    assert trend(("mixed", "ffn")) == "shows no trend its seeds can tell from their spread (inconclusive)"
    assert trend(("one", "qk")) == "is untested (1 seed)"
    assert trend(("flat", "qk")) == "is constant" and g.loc[("flat", "qk")].slope == 0
    assert g.loc[("up", "qk")].peak_time == (1.0, 1.0, 1.0) and g.loc[("down", "qk")].peak_time[0] == 1 / 6
    assert g.loc[("up", "qk")].spearman == (1.0, 1.0, 1.0)
    shown = words.growth_table(g.reset_index())
    assert not {"comparison", "slopes", "spearman", "peak_time", "positivity"} & set(shown.columns)
    assert "95% CI" in shown and "slope per seed" in shown
    assert list(shown.columns[5:10]) == ["95% CI", "p", "verdict", "trend", "change"]
    assert shown.set_index(["model", "matrix"]).loc[("down", "ov"), "trend"] == "shrinks with depth"
    def verdict(label):
        return S.verdicts(models, ode=label)["f2_growth"]

    up_verdict = verdict("up")
    assert up_verdict.claim == "f2_growth" and up_verdict.word == statistics.REPRODUCED and up_verdict.n == 3
    # the intersection-union test: its p is the larger of the two matrices' p
    assert up_verdict.p == pytest.approx(max(g.loc[("up", m)].comparison.p for m in ("qk", "ov")))
    down = verdict("down")
    assert down.word == statistics.CONTRADICTED and down.effect < 0 and "decided by the QK radius" in down.note
    assert verdict("one").word == statistics.UNTESTED
    assert verdict("mixed").word == statistics.INCONCLUSIVE


def test_headline_quotes_the_growth_over_seeds(model):
    layers = {"ours": growing([1.0, 1.2, 0.9]), "gpt": growing([0.1, -0.1])}
    zoom = S.spectra(model, S.resolving_times(model.config, 5, per_period=4))
    text = words.spectra_headline(layers, zoom)
    g = S.depth_growth(layers).set_index(["model", "matrix"])
    assert text["points"] == "6" and text["seeds_ours"] == "3" and text["seeds_gpt"] == "2"
    assert text["trend_ours_qk"] == "grows with depth"
    assert text["trend_gpt_ov"] == words.growth_trend(g.loc[("gpt", "ov")].comparison, g.loc[("gpt", "ov")].slopes)
    assert text["growth_ours_qk"].startswith(f"slope {g.loc[('ours', 'qk')].slope:+.2f} per unit t (x")
    assert text["growth_ours_qk"].endswith("one-sample t-test over 3 seeds: significant")
    assert text["spearman_ours_qk"] == "+1.00, +1.00, +1.00" and text["peak_ours_qk"] == "1.00, 1.00, 1.00"
    assert "verdict" not in text and S.verdicts(layers)["f2_growth"].word == statistics.REPRODUCED
    assert text["change_zoom_qk"] == f"{S.mean_change(zoom)['qk']:.3f}"
    assert text["change_layers_gpt_ov"] == f"{np.mean([S.mean_change(d)['ov'] for d in layers['gpt']]):.2f}"
    assert all(isinstance(v, str) for v in text.values())


def test_plots_say_where_t_is_an_interpolation(model):
    euler = S.spectra(model)  # the Euler steps
    on_grid = S.spectra(model, (np.arange(model.config.num_layers) + 1.0) / model.config.num_layers)
    between = S.spectra(model, S.resolving_times(model.config, 5, per_period=4))
    title = lambda fig: fig.get_suptitle()  # noqa: E731
    assert "interpolation" not in title(P.vs_depth(euler, "qk", "abs", x="time"))
    assert "interpolation" not in title(P.vs_depth(on_grid, "qk", "abs"))
    assert "interpolation" in title(P.vs_depth(between, "qk", "abs"))
    assert "interpolation" in P.vs_depth(between, "qk", "abs").get_supxlabel()
    assert "Euler step" in P.vs_depth(euler, "qk", "abs", x="time").get_supxlabel()
    assert "interpolated" in P.comparison({"ode": between, "euler": euler}, "qk").get_supxlabel()
    assert "interpolated" not in P.comparison({"euler": euler}, "qk").get_supxlabel()
    fig = P.growth({"ode": [euler, euler], "gpt": [S.spectra(random_model(baseline_config(tiny(), "gpt2"), 5))]})
    assert isinstance(fig, Figure) and len(fig.axes[0].lines) == 2 and len(fig.axes[3].lines) == 1
