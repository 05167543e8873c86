"""Attention-only particle dynamics (diffeqformer.analysis.trajectories): clustering, solver order, the sphere
constraint, metrics on hand-made configurations, the model-driven field against Levanter's attention, figures."""

import math

import equinox as eqx
import haliax as hax
import jax
import jax.numpy as jnp
import matplotlib
import numpy as np
import pytest
import xarray as xr
from helpers import TINY, VOCAB, tiny

from diffeqformer import DiffEqFormerLMHeadModel
from diffeqformer.analysis import trajectories
from diffeqformer.analysis.trajectories import (
    ModelTrajectoryConfig,
    SolverConfig,
    TrajectoryConfig,
    attention_velocity,
    clustering_metrics,
    config_from_attrs,
    final_metrics,
    headline,
    initial_weights,
    model_attention_matrices,
    plot_metrics,
    plot_trajectories,
    simulate,
    simulate_model,
    uniform_sphere,
)

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402


def _norm_error(x: xr.DataArray) -> float:
    return float(np.max(np.abs(np.sqrt((x**2).sum("dim", skipna=False)) - 1.0)))


@pytest.fixture(scope="module")
def identity_run() -> xr.Dataset:
    """Q = K = V = I, every growth law, two seeds, T = 10: Geshkovski et al.'s canonical system (about 3 s)."""
    return simulate(TrajectoryConfig(weights="identity", seeds=(0, 1)))


@pytest.fixture(scope="module")
def free_run() -> xr.Dataset:
    """Free space, Q = K = V = I, every growth law, T = 3."""
    return simulate(TrajectoryConfig(num_tokens=10, weights="identity", geometry="free", horizon=3.0))


@pytest.fixture(scope="module")
def tiny_model():
    return TINY.build(VOCAB, key=jax.random.PRNGKey(0))


# ----------------------------------------------------------------------------------------------------------------------
# Dynamics
# ----------------------------------------------------------------------------------------------------------------------


def test_weight_sharing_with_identity_weights_collapses_to_one_cluster():
    # Q = K = V = I, beta = 1, d = 3, g = 1: for d >= 3 and small beta, Geshkovski et al. ("A mathematical perspective
    # on transformers") prove that almost every start converges to a single point on S^{d-1}, exponentially fast (and
    # conjecture it for every beta).
    # Measured over 20 seeds with n = 40: every pair has <x_i, x_j> > 0.999 by t = 15 (median t = 9), and the smallest
    # inner product at t = 40 is 1 - 2e-7. T = 30 leaves a factor-2 margin over the slowest seed. (Ten seeds: the same
    # batch shape as ``identity_run``, so the compiled solve is shared.)
    ds = simulate(TrajectoryConfig(weights="identity", growth_powers=(0.0,), horizon=30.0, seeds=tuple(range(10))))
    metrics = clustering_metrics(ds).isel(growth=0)
    final = metrics.isel(time=-1)
    np.testing.assert_array_equal(final["fraction"].values, 1.0)
    np.testing.assert_array_equal(final["clusters"].values, 1.0)
    assert float(final["distance"].max()) < 0.05
    # and it starts dispersed: uniform on the sphere, mean chord distance 4/3
    assert float(metrics["fraction"].isel(time=0).max()) < 0.01
    assert abs(float(metrics["distance"].isel(time=0).mean()) - 4 / 3) < 0.15


def test_growth_freezes_identity_dynamics(identity_run):
    # A(t) = g^2 I makes the softmax concentrate on the token itself, where the tangent velocity vanishes: the faster
    # g grows, the earlier the tokens freeze, the fewer pairs cluster: one mechanism that produces the paper's claim.
    fraction = clustering_metrics(identity_run)["fraction"].isel(time=-1).mean("seed").values
    assert fraction[0] > 0.7
    assert np.all(np.diff(fraction[1:]) < 0), fraction  # t, t^2, t^3, t^4: strictly decreasing
    assert fraction[-1] < 0.2


def test_diffrax_matches_an_explicit_euler_loop_with_renormalisation():
    # Independent reference: the update of Geshkovski et al.'s public code, x <- normalise(x + h P_x v), in float64.
    cfg = TrajectoryConfig(
        num_tokens=8, horizon=2.0, growth_powers=(1.0,), num_saves=1,
        solver=SolverConfig("euler", adaptive=False, num_steps=200),
    )
    ds = simulate(cfg)
    q, k, v = (ds[name].isel(seed=0).values.astype(np.float64) for name in ("q0", "k0", "v0"))
    x = ds["x"].isel(growth=0, seed=0, time=0).values.astype(np.float64)
    h = cfg.horizon / 200
    for step in range(200):
        g = (step * h) ** 1.0
        scores = g * g * (x @ q.T) @ (x @ k.T).T
        w = np.exp(scores - scores.max(axis=1, keepdims=True))
        w /= w.sum(axis=1, keepdims=True)
        vel = g * w @ (x @ v.T)
        vel -= np.sum(vel * x, axis=1, keepdims=True) * x
        x = x + h * vel
        x /= np.linalg.norm(x, axis=1, keepdims=True)
    np.testing.assert_allclose(ds["x"].isel(growth=0, seed=0, time=-1).values, x, atol=1e-4)


@pytest.mark.parametrize("geometry", ["sphere", "free"])
def test_velocity_formula(geometry, getkey):
    x = uniform_sphere(getkey(), 6, 3) * 1.5  # off the sphere on purpose: the projection must use |x|^2
    a = jax.random.normal(getkey(), (3, 3))
    b = jax.random.normal(getkey(), (3, 3))
    v = np.asarray(attention_velocity(x, a, b, 0.7, geometry == "sphere"), dtype=np.float64)
    xs, an, bn = (np.asarray(m, dtype=np.float64) for m in (x, a, b))
    for i in range(6):
        s = np.array([0.7 * xs[i] @ an @ xs[j] for j in range(6)])
        w = np.exp(s - s.max()) / np.exp(s - s.max()).sum()
        vi = sum(w[j] * (bn @ xs[j]) for j in range(6))
        if geometry == "sphere":
            vi = vi - (vi @ xs[i]) / (xs[i] @ xs[i]) * xs[i]
            assert abs(v[i] @ xs[i]) < 1e-5  # tangent
        np.testing.assert_allclose(v[i], vi, atol=1e-5)


def _final_error_slope(solver: str, project: bool) -> tuple[np.ndarray, float]:
    """Max error at T against a fine Tsit5 reference for N = 50, 100, 200 constant steps, and the fitted order."""
    base = dict(num_tokens=8, horizon=2.0, growth_powers=(1.0,), num_saves=1)

    def final(name, steps, proj):
        cfg = TrajectoryConfig(**base, solver=SolverConfig(name, adaptive=False, num_steps=steps, project=proj))
        return simulate(cfg)["x"].isel(time=-1).values

    reference = final("tsit5", 1000, False)
    steps = np.array([50, 100, 200])
    errors = np.array([np.abs(final(solver, int(n), project) - reference).max() for n in steps])
    slope = np.polyfit(np.log(base["horizon"] / steps), np.log(errors), 1)[0]
    return errors, slope


def test_solvers_converge_at_their_order():
    # Like diffrax's own tests: the slope of log(error) against log(step). Sphere, g(t) = t (time-dependent field),
    # unprojected: the solvers' order on the tangent ODE itself. Measured: Euler 1.02, Heun 2.06 (four seeds: 1.00 to
    # 1.02 and 2.03 to 2.14).
    euler_errors, euler_slope = _final_error_slope("euler", project=False)
    heun_errors, heun_slope = _final_error_slope("heun", project=False)
    assert euler_slope >= 0.9, euler_errors
    assert heun_slope >= 1.8, heun_errors
    assert np.all(heun_errors < euler_errors / 10)


def test_projection_keeps_the_order():
    # The projection method (renormalising after each step) keeps the order of the solver it wraps. Measured for
    # Euler: 0.95 (four seeds: 0.95 to 1.03); Heun with projection: 2.07.
    errors, slope = _final_error_slope("euler", project=True)
    assert slope >= 0.9, errors


def test_unprojected_solution_stays_on_the_sphere():
    # The tangent field conserves |x_i| exactly; with few steps float32 round-off and the tolerance keep the drift
    # below 1e-5 without any renormalisation (measured: 1.3e-6 for g = 1 and g = t at rtol = atol = 1e-7).
    cfg = TrajectoryConfig(growth_powers=(0.0, 1.0), solver=SolverConfig(rtol=1e-7, atol=1e-7, project=False))
    ds = simulate(cfg)
    assert bool(ds["success"].all())
    assert _norm_error(ds["x"]) <= 1e-5


def test_default_solution_stays_on_the_sphere_for_every_growth(identity_run):
    # Fast growth needs ~10^4 steps, over which float32 drift would accumulate to ~1e-4: the projection method holds
    # the constraint at every saved time (dense output included).
    assert bool(identity_run["success"].all())
    assert _norm_error(identity_run["x"]) <= 1e-5


def test_free_space_is_not_projected_and_failures_are_nan(free_run):
    # Free space with V = I: the norms grow like exp(int_0^t g). At T = 3 the scores x_i^T A x_j overflow float32 for
    # g = t^4 (near t = 2.9): that solve stops at the first non-finite state, is flagged, and its later times are NaN.
    ds = free_run
    norms = np.sqrt((ds["x"] ** 2).sum("dim", skipna=False))
    np.testing.assert_array_equal(ds["success"].isel(seed=0).values, [True, True, True, True, False])
    assert float(norms.sel(growth=[0.0, 1.0, 2.0, 3.0]).isel(time=-1).min()) > 1.5
    overflowed = ds["x"].sel(growth=4.0).isel(seed=0)
    assert bool(np.isfinite(overflowed.sel(time=1.5)).all())
    assert bool(np.isnan(overflowed.isel(time=-1)).all())
    final = clustering_metrics(ds)["fraction"].isel(time=-1, seed=0)
    assert np.isnan(float(final.sel(growth=4.0))) and np.isfinite(final.sel(growth=[0.0, 1.0, 2.0, 3.0])).all()


def test_dataset_layout_config_and_cache(tmp_path):
    cfg = TrajectoryConfig(horizon=1.0, growth_powers=(0.0, 2.0), seeds=(3, 4, 5, 6, 7))
    ds = simulate(cfg, cache_dir=tmp_path)
    assert ds["x"].dims == ("growth", "seed", "time", "token", "dim")
    assert ds["x"].shape == (2, 5, 201, 40, 3)
    np.testing.assert_allclose(ds["time"].values, np.linspace(0.0, 1.0, 201), atol=1e-12)
    assert list(ds["growth_label"].values) == ["1", "t^2"]
    assert ds.attrs["geometry"] == "sphere" and ds.attrs["seeds"] == [3, 4, 5, 6, 7] and ds.attrs["horizon"] == 1.0
    assert config_from_attrs(ds.attrs) == cfg
    # different seeds, different weights and starts; the same seed for every growth law
    assert not np.allclose(ds["q0"].sel(seed=3), ds["q0"].sel(seed=4))
    np.testing.assert_array_equal(ds["x"].isel(growth=0, time=0).values, ds["x"].isel(growth=1, time=0).values)
    files = list(tmp_path.glob("trajectories-*.nc"))
    assert len(files) == 1
    cached = simulate(cfg, cache_dir=tmp_path)
    xr.testing.assert_equal(cached["x"], ds["x"])
    xr.testing.assert_equal(cached["success"], ds["success"])
    assert config_from_attrs(cached.attrs) == cfg


def test_bad_configurations_fail_with_a_message():
    with pytest.raises(ValueError, match="geometry"):
        TrajectoryConfig(geometry="torus")
    with pytest.raises(ValueError, match="Euler has no error estimate"):
        SolverConfig(solver="euler")
    with pytest.raises(ValueError, match="weights"):
        TrajectoryConfig(weights="orthogonal")
    with pytest.raises(ValueError, match="growth_powers"):
        TrajectoryConfig(growth_powers=(-1.0,))


def test_initial_weights():
    q, k, v = initial_weights(jax.random.PRNGKey(0), 3, "gaussian_qk")
    np.testing.assert_array_equal(np.asarray(v), np.eye(3))
    assert not np.allclose(q, k)
    q, k, v = initial_weights(jax.random.PRNGKey(0), 400, "gaussian")
    # fan-in scale: E|Q x|^2 = |x|^2
    assert abs(float(jnp.mean(q**2)) * 400 - 1.0) < 0.02


# ----------------------------------------------------------------------------------------------------------------------
# Metrics on hand-made configurations
# ----------------------------------------------------------------------------------------------------------------------


def _positions(points) -> xr.DataArray:
    arr = np.asarray(points, dtype=np.float64)[None]  # one time
    return xr.DataArray(arr, dims=("time", "token", "dim"), coords={"time": [0.0]})


def test_metrics_all_tokens_equal():
    m = clustering_metrics(_positions(np.tile([0.0, 0.6, 0.8], (7, 1)))).isel(time=0)
    assert float(m["fraction"]) == 1.0 and float(m["clusters"]) == 1.0
    assert float(m["distance"]) == pytest.approx(0.0, abs=1e-6)


def test_metrics_orthogonal_tokens():
    m = clustering_metrics(_positions(np.eye(4))).isel(time=0)
    assert float(m["fraction"]) == 0.0 and float(m["clusters"]) == 4.0
    assert float(m["distance"]) == pytest.approx(math.sqrt(2), abs=1e-9)


def test_metrics_three_clusters_of_sizes_2_3_5():
    points = [[1, 0, 0]] * 2 + [[0, 1, 0]] * 3 + [[0, 0, -1]] * 5
    m = clustering_metrics(_positions(points)).isel(time=0)
    assert float(m["fraction"]) == pytest.approx((1 + 3 + 10) / 45)
    assert float(m["clusters"]) == 3.0
    assert float(m["distance"]) == pytest.approx((45 - 14) / 45 * math.sqrt(2))


def test_metrics_use_cosine_similarity_and_the_threshold():
    # free space: 2 e1 and 5 e1 point the same way
    m = clustering_metrics(_positions([[2.0, 0, 0], [5.0, 0, 0]])).isel(time=0)
    assert float(m["fraction"]) == 1.0 and float(m["clusters"]) == 1.0
    angle = math.acos(0.9995)
    pair = _positions([[1.0, 0, 0], [math.cos(angle), math.sin(angle), 0]])
    assert float(clustering_metrics(pair, threshold=0.999)["fraction"].isel(time=0)) == 1.0
    assert float(clustering_metrics(pair, threshold=0.9999)["clusters"].isel(time=0)) == 2.0


def test_final_metrics_table(identity_run):
    table = final_metrics(clustering_metrics(identity_run))
    assert list(table.index) == ["1", "t", "t^2", "t^3", "t^4"]
    assert {"fraction_mean", "clusters_mean", "distance_mean", "fraction_std", "seeds"} <= set(table.columns)
    assert (table["seeds"] == 2).all()
    assert table["fraction_mean"].between(0, 1).all()
    assert table["clusters_mean"].between(1, 40).all()


# ----------------------------------------------------------------------------------------------------------------------
# Driven by a DiffEqFormer
# ----------------------------------------------------------------------------------------------------------------------


def test_model_matrices_reproduce_one_head_of_levanter_attention(tiny_model, getkey):
    # Keep head 1 only (zero the other head's output projection) and drop every bias: Levanter's attention output
    # for unmasked tokens must then be sum_j softmax_j(x_i^T A x_j) B x_j.
    head = 1
    x = jax.random.normal(getkey(), (7, TINY.hidden_dim))

    @eqx.filter_jit
    def both(model, x):
        t = hax.named(jnp.float32(0.37), ())
        attn = model.weights_at(t).attn
        keep = (hax.arange(attn.o_proj.weight.resolve_axis("heads")) == head).astype(jnp.float32)
        attn = eqx.tree_at(lambda a: a.o_proj.weight, attn, attn.o_proj.weight * keep)
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            attn = eqx.tree_at(lambda a, n=name: getattr(a, n).bias, attn, getattr(attn, name).bias * 0.0)
        out = attn(hax.named(x, (TINY.Pos.resize(7), TINY.Embed)), None).array
        a, b = model_attention_matrices(model, t, head)
        return out, attention_velocity(x, a, b, 1.0, False)

    out, ours = both(tiny_model, x)
    np.testing.assert_allclose(np.asarray(ours), np.asarray(out), atol=1e-5)


def test_model_matrices_at_many_times(tiny_model):
    @eqx.filter_jit
    def at(model, ts):
        many = model_attention_matrices(model, hax.named(ts, "time"), 0)
        one = model_attention_matrices(model, hax.named(ts[2], ()), 0)
        return many, one

    (a, b), (a2, _) = at(tiny_model, jnp.linspace(0.0, 1.0, 5))
    assert a.shape == b.shape == (5, TINY.hidden_dim, TINY.hidden_dim)
    np.testing.assert_allclose(np.asarray(a[2]), np.asarray(a2), atol=1e-6)


def test_model_driven_simulation(tiny_model, tmp_path):
    cfg = ModelTrajectoryConfig(heads=(0, 1), num_tokens=10, num_saves=20)
    ds = simulate_model(tiny_model, cfg, cache_dir=tmp_path)
    assert len(list(tmp_path.glob("model-trajectories-*.nc"))) == 1
    xr.testing.assert_identical(simulate_model(tiny_model, cfg, cache_dir=tmp_path), ds)
    D = TINY.hidden_dim
    assert ds["x"].dims == ("head", "time", "token", "dim")
    assert ds["x"].shape == (2, 21, 10, D)
    assert ds["x_pca"].shape == (2, 21, 10, 3)
    assert bool(np.isfinite(ds["x"]).all()) and bool(np.isfinite(ds["x_pca"]).all())
    assert bool(ds["success"].all())
    assert _norm_error(ds["x"]) <= 1e-5
    assert float(ds["time"][-1]) == pytest.approx(1.0)
    assert ds.attrs["beta_used"] == D
    # the step is capped to resolve sin(1000 t): at least 8 steps per period 2 pi / 1000 on [0, 1]
    assert int(ds["num_steps"].min()) >= 1000 / (2 * math.pi) * 8
    assert (ds["qk_radius"] > 0).all() and (ds["ov_radius"] > 0).all()
    table = final_metrics(ds)
    assert list(table.index) == [0, 1]


def test_model_driven_simulation_with_weight_sharing(tiny_model):
    # A weight-sharing DiffEqFormer (its block is a plain ParallelBlock), built from the tiny model's W(0.5) rather
    # than initialised, which would cost seconds.
    block = tiny_model.weights_at(hax.named(jnp.float32(0.5), ()))
    model = DiffEqFormerLMHeadModel(
        tiny_model.embeddings, block, tiny_model.ln_f, tiny_model.time_embedding, tiny(time_dependent=False)
    )
    ds = simulate_model(model, ModelTrajectoryConfig(heads=(0, 1), num_tokens=10, num_saves=20, geometry="free"))
    assert ds["x"].shape == (2, 21, 10, TINY.hidden_dim)
    assert bool(np.isfinite(ds["x"]).all())
    # constant weights: constant spectra, those of W(0.5)
    np.testing.assert_allclose(ds["qk_radius"].values, np.broadcast_to(ds["qk_radius"].values[:, :1], (2, 21)),
                               rtol=1e-5)


def test_model_head_out_of_range(tiny_model):
    with pytest.raises(ValueError, match="head 2"):
        simulate_model(tiny_model, ModelTrajectoryConfig(heads=(2,)))


# ----------------------------------------------------------------------------------------------------------------------
# Figures
# ----------------------------------------------------------------------------------------------------------------------


def test_figures(identity_run, free_run, tiny_model):
    fig = plot_trajectories(identity_run, seed=1)
    assert isinstance(fig, Figure) and len(fig.axes) == 5
    fig = plot_metrics(clustering_metrics(identity_run))
    assert isinstance(fig, Figure) and len(fig.axes) == 3
    assert isinstance(plot_trajectories(free_run), Figure)  # the overflowed run (NaN at the end) draws too
    assert isinstance(plot_metrics(free_run), Figure)
    model_run = simulate_model(tiny_model, ModelTrajectoryConfig(heads=(0, 1), num_tokens=10, num_saves=20))
    assert len(plot_trajectories(model_run).axes) == 2
    assert isinstance(plot_metrics(model_run), Figure)
    plt.close("all")


def test_headline(identity_run, tiny_model):
    driven = simulate_model(tiny_model, ModelTrajectoryConfig(heads=(0, 1), num_tokens=10, num_saves=20))
    text = headline({"ode": identity_run}, {"ours": driven})
    table = final_metrics(clustering_metrics(identity_run))
    assert text["fraction_ode_p0"] == f"{table['fraction_mean'].iloc[0]:.2f}"
    assert text["clusters_ode_p4"] == f"{table['clusters_mean'].iloc[-1]:.1f}"
    assert text["seeds_ode"] == "2" and text["failed_ode"] == "0" and text["num_tokens"] == "40"
    # Q = K = V = I: the faster the weights grow, the fewer pairs are clustered at T (0.75, 0.54, 0.22, 0.11, 0.07 for
    # p = 0..4). The fraction falls at every step of p, and the headline's word says so.
    assert np.all(np.diff(table["fraction_mean"].to_numpy()) < 0)
    assert text["fraction_trend_ode"] == "falls"
    final = clustering_metrics(driven.isel(time=[-1])).isel(time=0)
    assert text["model_fraction_ours"] == f"{float(final['fraction'].mean()):.2f}"
    assert text["model_heads_ours"] == "2" and text["model_horizon"] == "1"
    assert text["model_fraction_at1_ours"] == text["model_fraction_ours"]  # t1 = 1: the end is t = 1


@pytest.mark.parametrize("values, trend", [
    ([0.1, 0.2, 0.2, 0.9], "rises"), ([0.9, 0.5, 0.5, 0.1], "falls"), ([0.4, 0.4, 0.4], "is constant"),
    ([0.1, 0.5, 0.3], "is not monotone"), ([0.94, 0.42, 0.17, 0.10, 0.06], "falls"),
])
def test_monotone_words(values, trend):
    assert trajectories._monotone(values) == trend
