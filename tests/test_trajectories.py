"""Attention-only particle dynamics (analysis.trajectories, model_trajectories, clustering; their plots and words):
clustering, solver order, the sphere constraint, metrics on hand-made configurations, the model-driven field against
Levanter's attention, figures."""

import dataclasses
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
from scipy import stats

from diffeqformer.analysis import clustering, statistics
from diffeqformer.analysis.clustering import (
    VERDICT_COLUMNS,
    clustering_metrics,
    final_fraction,
    final_metrics,
    growth_verdicts,
    model_verdicts,
    paired_verdicts,
    step_convergence,
)
from diffeqformer.analysis.model_trajectories import model_attention_matrices, simulate_model
from diffeqformer.analysis.trajectories import (
    ModelTrajectoryConfig,
    SolverConfig,
    TrajectoryConfig,
    attention_velocity,
    config_from_attrs,
    initial_weights,
    simulate,
    uniform_cube,
    uniform_sphere,
    weight_pieces,
)
from diffeqformer.report.words import trajectories as words
from diffeqformer.report.plots import trajectories as plots

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


def _rk4_reference(x0, pieces, power: float, horizon: float, steps_per_piece: int, sphere: bool) -> np.ndarray:
    """Float64 classical RK4 of dx_i/dt = P_i sum_j softmax_j(g^2 x_i^T Q_k^T K_k x_j) g V_k x_j (beta = 1), piece k
    of ``pieces`` = (Q, K, V) [P, d, d] on the k-th of P equal intervals of [0, horizon], each solved on its own (so
    no step straddles a jump). Free space in plain coordinates (no rescaling); the sphere with a renormalisation
    after each step. Returns x(T)."""
    q, k, v = (np.asarray(w, dtype=np.float64) for w in pieces)
    P = q.shape[0]
    x = np.asarray(x0, dtype=np.float64)
    h = horizon / P / steps_per_piece

    def f(t, x, i):
        g = t**power
        s = g * g * (x @ q[i].T) @ (x @ k[i].T).T
        w = np.exp(s - s.max(axis=1, keepdims=True))
        w /= w.sum(axis=1, keepdims=True)
        vel = g * w @ (x @ v[i].T)
        if sphere:
            vel -= np.sum(vel * x, axis=1, keepdims=True) / np.sum(x * x, axis=1, keepdims=True) * x
        return vel

    for i in range(P):
        for n in range(steps_per_piece):
            t = (i * steps_per_piece + n) * h
            k1 = f(t, x, i)
            k2 = f(t + h / 2, x + h / 2 * k1, i)
            k3 = f(t + h / 2, x + h / 2 * k2, i)
            k4 = f(t + h, x + h * k3, i)
            x = x + h / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
            if sphere:
                x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x


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


def test_free_space_is_solved_to_the_end_in_rescaled_coordinates(free_run):
    # Free space with V = I: the norms grow like exp(int_0^t g). In plain float32 coordinates the scores x_i^T A x_j
    # overflowed for g = t^4 near t = 2.9 (this test once checked that failure); x = e^rho y keeps every solve finite
    # to T, with rho near int_0^T g = T^(p+1) / (p+1) (tokens attend mostly to themselves as g grows).
    ds = free_run
    assert bool(ds["success"].all()) and bool(np.isfinite(ds["x"]).all())
    rho = ds["log_scale"].isel(seed=0, time=-1).values
    integral = np.array([3.0 ** (p + 1) / (p + 1) for p in ds["growth"].values])
    np.testing.assert_array_less(0.5 * integral, rho)
    np.testing.assert_array_less(rho, 1.5 * integral)
    assert 2 * float(rho[-1]) > 89  # scores ~ e^{2 rho} beyond float32's e^88.7: where the plain solve overflowed
    norms = np.sqrt((ds["x"] ** 2).sum("dim"))
    assert 0.05 < float(norms.min()) and float(norms.max()) < 20  # y stays of order one


@pytest.mark.parametrize("weights, power", [("gaussian", 0.0), ("gaussian", 2.0), ("redrawn", 1.0)])
def test_free_space_matches_a_plain_float64_solve(weights, power):
    # Independent reference: RK4 in float64 in the plain coordinates x (no rescaling), piece by piece. T = 2 keeps
    # x finite in float64; the rescaled float32 solve must give the same positions e^rho y.
    cfg = TrajectoryConfig(num_tokens=8, horizon=2.0, num_saves=1, growth_powers=(power,), weights=weights,
                           geometry="free", start="cube", redraws=10, solver=SolverConfig(rtol=1e-7, atol=1e-7))
    ds = simulate(cfg)
    assert bool(ds["success"].all())
    key_w, key_x = jax.random.split(jax.random.PRNGKey(0), 2)
    pieces = weight_pieces(key_w, 3, weights, 10)
    x0 = ds["x"].isel(growth=0, seed=0, time=0).values
    np.testing.assert_allclose(np.asarray(uniform_cube(key_x, 8, 3)), x0)
    reference = _rk4_reference(x0, pieces, power, 2.0, 200, sphere=False)
    x = ds["x"].isel(growth=0, seed=0, time=-1).values * np.exp(float(ds["log_scale"].isel(growth=0, seed=0, time=-1)))
    np.testing.assert_allclose(x, reference, rtol=1e-4, atol=1e-4 * np.abs(reference).max())


def test_a_solve_that_runs_out_of_steps_is_flagged_and_nan():
    ds = simulate(TrajectoryConfig(num_tokens=10, weights="identity", geometry="free", horizon=3.0,
                                   growth_powers=(0.0, 4.0), solver=SolverConfig(max_steps=18)))
    # measured: g = 1 takes 14 steps, t^4 23 on [0, 3] (deterministic: the same float32 solve every time)
    np.testing.assert_array_equal(ds["success"].isel(seed=0).values, [True, False])
    assert bool(np.isnan(ds["x"].sel(growth=4.0).isel(seed=0, time=-1)).all())
    final = clustering_metrics(ds)["fraction"].isel(time=-1, seed=0)
    assert np.isfinite(float(final.sel(growth=0.0))) and np.isnan(float(final.sel(growth=4.0)))


def test_redrawn_weights_adaptive_solve_matches_a_piecewise_reference():
    # The adaptive solve is told the jump times: it must match RK4 run piece by piece with each piece's own weights
    # (a solve that looked up the wrong interval near a jump, or smoothed over it, would be off by the step times
    # the jump in W).
    cfg = TrajectoryConfig(num_tokens=8, horizon=2.0, num_saves=1, growth_powers=(1.0,), weights="redrawn",
                           redraws=20, solver=SolverConfig(rtol=1e-7, atol=1e-7))
    ds = simulate(cfg)
    key_w, _ = jax.random.split(jax.random.PRNGKey(0), 2)
    pieces = weight_pieces(key_w, 3, "redrawn", 20)
    assert not np.allclose(pieces[2][0], pieces[2][1])  # a fresh V on every interval
    np.testing.assert_allclose(ds["v0"].isel(seed=0).values, np.asarray(pieces[2][0]))
    x0 = ds["x"].isel(growth=0, seed=0, time=0).values
    reference = _rk4_reference(x0, pieces, 1.0, 2.0, 50, sphere=True)
    np.testing.assert_allclose(ds["x"].isel(growth=0, seed=0, time=-1).values, reference, atol=1e-4)


@pytest.mark.parametrize("steps", [20, 60])
def test_redrawn_weights_euler_uses_the_interval_of_the_step_start(steps):
    # Euler steps at t_n = n h use the weights of the interval holding t_n, also where t_n is an interval's end
    # (float32 t_n can round to just below it): against an explicit float64 loop that indexes by exact integers.
    cfg = TrajectoryConfig(num_tokens=8, horizon=2.0, num_saves=1, growth_powers=(1.0,), weights="redrawn",
                           redraws=20, solver=SolverConfig("euler", adaptive=False, num_steps=steps))
    ds = simulate(cfg)
    q, k, v = (np.asarray(w, dtype=np.float64) for w in weight_pieces(jax.random.split(jax.random.PRNGKey(0))[0],
                                                                      3, "redrawn", 20))
    x = ds["x"].isel(growth=0, seed=0, time=0).values.astype(np.float64)
    h = 2.0 / steps
    for n in range(steps):
        i, g = n * 20 // steps, n * h
        s = g * g * (x @ q[i].T) @ (x @ k[i].T).T
        w = np.exp(s - s.max(axis=1, keepdims=True))
        w /= w.sum(axis=1, keepdims=True)
        vel = g * w @ (x @ v[i].T)
        vel -= np.sum(vel * x, axis=1, keepdims=True) * x
        x = x + h * vel
        x /= np.linalg.norm(x, axis=1, keepdims=True)
    np.testing.assert_allclose(ds["x"].isel(growth=0, seed=0, time=-1).values, x, atol=1e-4)


def test_starts():
    key = jax.random.PRNGKey(3)
    cube = np.asarray(uniform_cube(key, 4000, 3))
    assert cube.min() >= -1 and cube.max() <= 1 and np.all(np.abs(cube.mean(axis=0)) < 0.05)
    ds = simulate(TrajectoryConfig(num_tokens=50, horizon=0.1, num_saves=1, growth_powers=(0.0,), start="cube",
                                   geometry="free"))
    norms = np.linalg.norm(ds["x"].isel(growth=0, seed=0, time=0).values, axis=-1)
    assert norms.max() <= math.sqrt(3) and norms.std() > 0.1  # not on the sphere


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
    with pytest.raises(ValueError, match="start"):
        TrajectoryConfig(start="ball")
    with pytest.raises(ValueError, match="Euler solver"):
        TrajectoryConfig(weights="redrawn", solver=SolverConfig("heun", adaptive=False))


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
    fig = plots.paths(identity_run, seed=1)
    assert isinstance(fig, Figure) and len(fig.axes) == 5
    fig = plots.metrics(clustering_metrics(identity_run))
    assert isinstance(fig, Figure) and len(fig.axes) == 3
    assert isinstance(plots.paths(free_run), Figure)
    assert isinstance(plots.metrics(free_run), Figure)
    failed = simulate(TrajectoryConfig(num_tokens=10, weights="identity", horizon=3.0, solver=SolverConfig(max_steps=30)))
    assert not bool(failed["success"].all())
    assert isinstance(plots.paths(failed), Figure)  # a failed run (NaN at the end) draws too
    model_run = simulate_model(tiny_model, ModelTrajectoryConfig(heads=(0, 1), num_tokens=10, num_saves=20))
    assert len(plots.paths(model_run).axes) == 2
    assert isinstance(plots.metrics(model_run), Figure)
    # beyond the trained t in [0, 1] the metrics figure marks the extrapolation
    longer = simulate_model(tiny_model, ModelTrajectoryConfig(heads=(0,), num_tokens=6, num_saves=20, t1=1.5))
    labels = plots.metrics(longer).axes[0].get_legend_handles_labels()[1]
    assert any("extrapolated" in label for label in labels)
    assert not any("extrapolated" in label for label in plots.metrics(model_run).axes[0].get_legend_handles_labels()[1])
    plt.close("all")


def test_controls_and_step_convergence_figures(identity_run):
    cfg = TrajectoryConfig(num_tokens=8, horizon=2.0, num_saves=10, growth_powers=(0.0, 2.0), seeds=(0, 1))
    solves = {f"{g} {w}": simulate(dataclasses.replace(cfg, weights=w, geometry=g, start=s))
              for g, s in (("sphere", "sphere"), ("free", "cube")) for w in ("identity", "redrawn")}
    fig = plots.controls(solves)
    assert sum(ax.get_visible() for ax in fig.axes) == 4
    titles = " ".join(ax.get_title() for ax in fig.axes)
    assert "must cluster" in titles and "redrawn" in titles and "free space" in titles and "sphere" in titles
    with pytest.raises(ValueError, match="one n, d, T"):
        plots.controls({"a": identity_run, "b": solves["sphere identity"]})
    fig = plots.step_convergence(step_convergence(cfg, [20, 80]), simulate(cfg))
    assert len(fig.axes) == 2
    plt.close("all")


def test_headline(identity_run, tiny_model):
    driven = simulate_model(tiny_model, ModelTrajectoryConfig(heads=(0, 1), num_tokens=10, num_saves=20))
    text = words.trajectories_headline({"ode": identity_run}, {"ours": driven})
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


# ----------------------------------------------------------------------------------------------------------------------
# Step-size convergence and verdicts
# ----------------------------------------------------------------------------------------------------------------------


def test_step_convergence_approaches_the_accurate_solve():
    # More Euler steps, closer to the accurate solve: the mean pairwise distance at T is continuous in the positions,
    # so its error falls with the step (about first order); the fractions with the most steps are those of that
    # Euler solve itself.
    cfg = TrajectoryConfig(num_tokens=8, horizon=2.0, num_saves=4, growth_powers=(0.0, 2.0), seeds=(0, 1))
    steps = [25, 100, 400, 1600]
    conv = step_convergence(cfg, steps)
    assert conv["fraction"].dims == ("steps", "growth", "seed") and list(conv["steps"].values) == steps
    assert bool(conv["success"].all())
    reference = clustering_metrics(simulate(cfg).isel(time=[-1])).isel(time=0)
    error = np.abs(conv["distance"] - reference["distance"]).max(("growth", "seed")).values
    assert np.all(np.diff(error) < 0), error
    assert error[-1] < error[0] / 20, error
    euler = simulate(dataclasses.replace(cfg, solver=SolverConfig("euler", adaptive=False, num_steps=1600)))
    np.testing.assert_array_equal(conv["fraction"].sel(steps=1600).values,
                                  clustering_metrics(euler.isel(time=[-1]))["fraction"].isel(time=0).values)


def test_growth_verdicts_are_paired_t_tests_and_a_trend(identity_run):
    table = growth_verdicts(identity_run)
    assert list(table.columns) == list(VERDICT_COLUMNS)
    assert list(table["comparison"]) == ["g = 1 vs g = t", "g = 1 vs g = t^2", "g = 1 vs g = t^3", "g = 1 vs g = t^4",
                                         "trend over p"]
    final = clustering_metrics(identity_run)["fraction"].isel(time=-1)  # (growth, seed)
    a, b = final.sel(growth=0.0).values, final.sel(growth=4.0).values
    row = table.iloc[3]
    assert row["mean a"] == pytest.approx(a.mean()) and row["mean b"] == pytest.approx(b.mean())
    assert row["p"] == pytest.approx(stats.ttest_rel(a, b).pvalue)
    assert row["test"] == statistics.PAIRED and row["seeds"] == 2
    assert row["verdict"] == (statistics.SIGNIFICANT if row["p"] < 0.05 else statistics.INCONCLUSIVE)
    # the trend: the fraction falls with p (identity weights freeze sooner the faster g grows); the simulation is the
    # unit, one slope each, tested against 0
    slopes = clustering.dispersion_slopes(identity_run)
    assert len(slopes) == 2 and all(s == pytest.approx(np.polyfit(final["growth"].values, f, 1)[0], abs=1e-12)
                                    for s, f in zip(slopes, final.transpose("seed", "growth").values))
    trend = table.iloc[-1]
    assert trend["difference"] == pytest.approx(np.mean(slopes)) and trend["difference"] < 0 and trend["seeds"] == 2
    assert trend["test"] in (statistics.ONE_SAMPLE, statistics.EXACT_SIGNS) and math.isnan(trend["mean a"])
    assert trend["p"] == pytest.approx(clustering.dispersion_test(identity_run).p)
    texts = words.trajectories_verdict_texts(table)
    assert set(texts) == {"g1_vs_t", "g1_vs_t2", "g1_vs_t3", "g1_vs_t4", "trend"}
    assert texts["g1_vs_t4"].endswith(row["verdict"])


def test_verdicts_leave_out_failed_seeds_and_need_two(identity_run):
    ds = identity_run.copy(deep=True)
    x = ds["x"].values
    x[ds.indexes["growth"].get_loc(4.0), 0, -1] = np.nan  # seed 0's t^4 solve "failed"
    ds["x"] = (ds["x"].dims, x)
    table = growth_verdicts(ds)
    row = table.iloc[3]
    assert row["seeds"] == 1 and row["verdict"] == "untested: 1 seed" and np.isnan(row["p"])
    assert table.iloc[0]["seeds"] == 2
    assert words.trajectories_verdict_texts(table)["g1_vs_t4"] == "untested: 1 seed"
    with pytest.raises(ValueError, match="p = 0"):
        growth_verdicts(identity_run.sel(growth=[1.0, 2.0]))


def test_paired_verdicts(identity_run):
    same = paired_verdicts(identity_run, identity_run)
    assert list(same["comparison"]) == ["g = 1", "g = t", "g = t^2", "g = t^3", "g = t^4"]
    # every paired difference is 0: the exact sign-flip test, p = 1, never a t-test of zero spread
    assert (same["difference"] == 0).all() and (same["verdict"] == statistics.INCONCLUSIVE).all()
    assert (same["test"] == statistics.EXACT_SIGNS).all() and (same["p"] == 1).all()
    with pytest.raises(ValueError, match="same seeds"):
        paired_verdicts(identity_run, identity_run.isel(seed=[0]))


def test_model_verdicts(tiny_model):
    runs = [simulate_model(tiny_model, ModelTrajectoryConfig(heads=(0, 1), num_tokens=6, num_saves=10, seed=s))
            for s in (0, 1)]
    table = model_verdicts(runs, runs)
    assert list(table["comparison"]) == ["fraction at t = 1", "distance at t = 1"]
    assert (table["difference"] == 0).all() and (table["test"] == statistics.EXACT_SIGNS).all()
    assert (table["verdict"] == statistics.INCONCLUSIVE).all()
    assert set(words.trajectories_verdict_texts(table)) == {"fraction_at_t_1", "distance_at_t_1"}


@pytest.mark.parametrize("values, trend", [
    ([0.1, 0.2, 0.2, 0.9], "rises"), ([0.9, 0.5, 0.5, 0.1], "falls"), ([0.4, 0.4, 0.4], "is constant"),
    ([0.1, 0.5, 0.3], "is not monotone"), ([0.94, 0.42, 0.17, 0.10, 0.06], "falls"),
])
def test_monotone_words(values, trend):
    assert words._monotone(values) == trend


def test_simulations_needed_detect_the_slope_the_paper_implies():
    from statsmodels.stats.power import TTestPower

    from diffeqformer.workflow import presets

    design = clustering.simulations_needed()
    assert design.slope == pytest.approx(-0.2)  # fractions 1, 0, 0, 0, 0 over p = 0..4
    assert design.sd == pytest.approx(math.sqrt((0.3 - 0.2) * (0.3 + 0.2)))  # Bhatia-Davis within [-0.3, 0.3]
    power, effect = TTestPower().power, 0.2 / design.sd
    assert power(effect, design.simulations, 0.05) >= 0.8 > power(effect, design.simulations - 1, 0.05)
    assert presets.SIMULATION_SEEDS == design.simulations
    assert "12 simulations" in words.power_text(design, 12) and "fewer" in words.power_text(design, 3)


def test_fraction_table_has_the_paper_columns_first(identity_run):
    table = clustering.fraction_table({"identity": identity_run}, {"identity": growth_verdicts(identity_run)})
    labels = [f"g = {label}" for label in identity_run["growth_label"].values]
    assert list(table.columns[:len(labels)]) == labels
    assert table.loc["identity", labels[0]] == pytest.approx(float(final_fraction(identity_run).sel(growth=0.0).mean()))
    assert table.loc["identity", "simulations"] == identity_run.sizes["seed"]
