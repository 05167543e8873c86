"""Attention-only particle dynamics: one head moves n tokens (PAPER.md section 2, Fig. 2c/2d, Fig. 13).

    dx_i/dt = P_i sum_j softmax_j( beta x_i^T A(t) x_j ) B(t) x_j,   A = Q^T K,  B = V,

on the sphere (``"sphere"``: P_i = I - x_i x_i^T / |x_i|^2, Geshkovski et al. 2023) or in free space (``"free"``:
P_i = I). ``simulate`` solves it for random Q(0), K(0), V(0) and W(t) = t^p W(0) (p = 0: weight sharing), with the
controls of ``TrajectoryConfig.weights``; ``analysis.model_trajectories`` with the heads of a trained model. Both return
an ``xarray.Dataset``; ``analysis.clustering`` measures it, ``report.plots.trajectories`` draws it. Numerics (details
and measurements: the measurements page):

* Diffrax's Tsit5 with a PID controller by default; the paper's 200 Euler steps are
  ``SolverConfig(solver="euler", adaptive=False, num_steps=200)``.
* On the sphere every token is renormalised after each step and in the dense output (the projection method).
* Free space solves for x_i = e^rho y_i with a common log-scale rho (``log_scale``), so that y stays of order one in
  float32; the score scale is capped at ``SCORE_CAP``. A solve stops at its first non-finite state.
* Redrawn weights jump at known times: adaptive steps do not straddle them, Euler steps look them up at t + h/2.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import xarray as xr

from ..cache import cached, digest, load_netcdf, save_netcdf

from ..numerics import check_positive_int

GEOMETRIES = ("sphere", "free")
WEIGHTS = ("gaussian", "identity", "gaussian_qk", "redrawn")
STARTS = ("sphere", "cube")
SCORE_CAP = 1e25
"""Free space: the largest score scale beta g(t)^2 e^{2 rho}; beyond it the float32 softmax is a hard maximum anyway
(a relative score gap of 10^-7 already weighs exp(-10^18)), and the cap keeps the scores finite."""
SOLVERS: dict[str, Callable[[], diffrax.AbstractSolver]] = {
    "euler": diffrax.Euler, "heun": diffrax.Heun, "midpoint": diffrax.Midpoint, "ralston": diffrax.Ralston,
    "bosh3": diffrax.Bosh3, "tsit5": diffrax.Tsit5, "dopri5": diffrax.Dopri5, "dopri8": diffrax.Dopri8}
"""Explicit Diffrax solvers by name (orders 1, 2, 2, 2, 3, 5, 5, 8)."""


@dataclass(frozen=True)
class SolverConfig:
    """How the ODE is solved (shared by ``simulate`` and ``simulate_model``)."""

    solver: str = "tsit5"
    """A key of ``SOLVERS``."""
    adaptive: bool = True
    """PID step-size control (needs an error estimate: not Euler); False: constant steps."""
    num_steps: int = 200
    """Constant steps: their number on [t0, t1]. Adaptive: the first step is (t1 - t0) / num_steps."""
    rtol: float = 1e-6
    """Relative tolerance of the PID controller."""
    atol: float = 1e-6
    """Absolute tolerance of the PID controller (positions are O(1))."""
    max_steps: int = 2_000_000
    """Diffrax's step budget; a solve that exhausts it is marked ``success = False``, its later times NaN. A run that
    chatters at ``dtmin`` over the whole horizon needs about 2.5 / dtmin steps (forced steps and rejected tries)."""
    dtmin: float = 3e-6
    """Adaptive: the smallest step, as a fraction of t1 - t0, taken even if its error estimate is too large. With fast
    growth the softmax is nearly a hard max; where a token's arg max switches the solution chatters along the switching
    surface and the controller would ask for steps at float32's resolution of t. A smaller dtmin lets such runs stall, a
    larger one lets a forced step move a token by up to a radian; their final clustering depends on dtmin (the
    measurements page)."""
    project: bool = True
    """Sphere only: renormalise every token after each step (the projection method)."""

    def __post_init__(self):
        if self.solver not in SOLVERS:
            raise ValueError(f"solver must be one of {tuple(SOLVERS)}, got {self.solver!r}")
        if self.adaptive and self.solver == "euler":
            raise ValueError("Euler has no error estimate: use adaptive=False, or an adaptive solver such as 'tsit5'")
        for name in ("num_steps", "max_steps"):
            check_positive_int(getattr(self, name), name)
        if not (self.rtol > 0 and self.atol > 0):
            raise ValueError("rtol and atol must be positive")
        if not 0 < self.dtmin < 1:
            raise ValueError(f"dtmin is a fraction of the time span in (0, 1), got {self.dtmin!r}")


@dataclass(frozen=True)
class TrajectoryConfig:
    """The random-weight experiment of Fig. 2c/2d: n tokens, one head, W(t) = t^p W(0) for each power p."""

    num_tokens: int = 40
    """n: number of tokens (particles)."""
    dim: int = 3
    """d: dimension of the tokens (3 for the 3-D pictures)."""
    horizon: float = 10.0
    """T: the dynamics runs on [0, T] (Geshkovski et al.'s scale; on [0, 1], t^p <= 1 hardly moves the tokens)."""
    num_saves: int = 200
    """Saved intervals: the Dataset has num_saves + 1 times 0, T/num_saves, ..., T."""
    beta: float = 1.0
    """Inverse temperature of the softmax (beta = 0 is uniform attention)."""
    geometry: str = "sphere"
    """'sphere' (tangent projection, Geshkovski et al.) or 'free' (no projection, the paper's App. C.8)."""
    start: str = "sphere"
    """x(0): 'sphere' (uniform on S^{d-1}) or 'cube' (uniform in [-1, 1]^d, the paper's 'uniform random start')."""
    growth_powers: tuple[float, ...] = (0.0, 1.0, 2.0, 3.0, 4.0)
    """Powers p of g(t) = t^p: 0 is weight sharing, 1..4 the paper's polynomial growth."""
    weights: str = "gaussian"
    """Q(0), K(0), V(0): 'gaussian' (i.i.d. N(0, 1/d), the paper's random weights), 'identity' (Q = K = V = I, whose
    weight sharing Geshkovski et al. prove clusters), 'gaussian_qk' (Gaussian Q, K; V = I) or 'redrawn' (Gaussian,
    drawn afresh on each of ``redraws`` equal intervals of [0, T], times g(t): weights that change without growing)."""
    redraws: int = 200
    """'redrawn' weights: the number of intervals (200 on [0, 10]: a draw per step of the paper's Euler grid)."""
    seeds: tuple[int, ...] = (0,)
    """One simulation per seed (weights and start both drawn from it); the Dataset gets a ``seed`` dimension."""
    solver: SolverConfig = dataclasses.field(default_factory=SolverConfig)
    """How the ODE is solved."""

    def __post_init__(self):
        for name in ("num_tokens", "dim", "num_saves", "redraws"):
            check_positive_int(getattr(self, name), name)
        if not self.horizon > 0:
            raise ValueError(f"horizon must be positive, got {self.horizon!r}")
        if not self.beta >= 0:
            raise ValueError(f"beta must be >= 0, got {self.beta!r}")
        for name, options in (("geometry", GEOMETRIES), ("weights", WEIGHTS), ("start", STARTS)):
            if getattr(self, name) not in options:
                raise ValueError(f"{name} must be one of {options}, got {getattr(self, name)!r}")
        if self.weights == "redrawn" and not self.solver.adaptive and self.solver.solver != "euler":
            # Constant steps look the interval up at t + h/2, right for Euler's one stage at the step's start only.
            raise ValueError("redrawn weights with constant steps need the Euler solver (or an adaptive one)")
        if not self.growth_powers or any(p < 0 for p in self.growth_powers):
            raise ValueError(f"growth_powers must be a non-empty tuple of powers >= 0, got {self.growth_powers!r}")
        if not self.seeds:
            raise ValueError("seeds must not be empty")


@dataclass(frozen=True)
class ModelTrajectoryConfig:
    """The same dynamics driven by one head of a DiffEqFormer, in the model's width D, on the model's t in [0, t1]."""

    heads: tuple[int, ...] = (0,)
    """Attention heads to simulate (one simulation each; the Dataset gets a ``head`` dimension)."""
    num_tokens: int = 40
    """n: number of tokens, drawn uniformly on S^{D-1}."""
    beta: float | None = None
    """Inverse temperature; None means D: unit-sphere tokens then score like LayerNorm outputs (radius sqrt(D))."""
    geometry: str = "sphere"
    """'sphere' or 'free', as in ``TrajectoryConfig``."""
    t1: float = 1.0
    """End time; the model is trained on [0, 1]."""
    num_saves: int = 200
    """Saved intervals on [0, t1]."""
    seed: int = 0
    """Seed of the start tokens and of nothing else."""
    steps_per_period: int = 8
    """Adaptive solves: the step is capped at (shortest sinusoid period of the time embedding) / steps_per_period: W(t)
    oscillates that fast, and a controller that sees only the tokens could step over it."""
    solver: SolverConfig = dataclasses.field(default_factory=SolverConfig)
    """How the ODE is solved."""

    def __post_init__(self):
        for name in ("num_tokens", "num_saves", "steps_per_period"):
            check_positive_int(getattr(self, name), name)
        if not self.heads or any(h < 0 for h in self.heads):
            raise ValueError(f"heads must be a non-empty tuple of head indices, got {self.heads!r}")
        if self.geometry not in GEOMETRIES:
            raise ValueError(f"geometry must be one of {GEOMETRIES}, got {self.geometry!r}")
        if not self.t1 > 0:
            raise ValueError(f"t1 must be positive, got {self.t1!r}")
        if self.beta is not None and not self.beta > 0:
            raise ValueError(f"beta must be positive or None, got {self.beta!r}")


def config_key(config: TrajectoryConfig | ModelTrajectoryConfig) -> dict:
    """The configuration as the cache's key: its type and every field."""
    return {"type": type(config).__name__, **dataclasses.asdict(config)}


def config_from_attrs(attrs: dict) -> TrajectoryConfig | ModelTrajectoryConfig:
    """The configuration a Dataset of ``simulate`` / ``simulate_model`` was made with (from ``attrs['config']``)."""
    raw = json.loads(attrs["config"])
    kind = raw.pop("type")
    raw["solver"] = SolverConfig(**raw["solver"])
    for key in ("growth_powers", "seeds", "heads"):
        if key in raw:
            raw[key] = tuple(raw[key])
    return {"TrajectoryConfig": TrajectoryConfig, "ModelTrajectoryConfig": ModelTrajectoryConfig}[kind](**raw)


def dataset_attrs(config: TrajectoryConfig | ModelTrajectoryConfig, **extra) -> dict:
    """Every field flat (``solver_*`` for the solver), netCDF-safe (no bool, no None), plus the JSON for round trips."""

    def safe(v):
        if isinstance(v, bool):
            return int(v)
        if v is None:
            return "none"
        if isinstance(v, tuple):
            return list(v)
        return v

    flat = {k: safe(v) for k, v in dataclasses.asdict(config).items() if k != "solver"}
    flat.update({f"solver_{k}": safe(v) for k, v in dataclasses.asdict(config.solver).items()})
    key = config_key(config)
    return {**flat, **{k: safe(v) for k, v in extra.items()}, "config": json.dumps(key, sort_keys=True),
            "config_hash": digest(key)}


def attention_velocity(x: jax.Array, A: jax.Array, B: jax.Array, beta, sphere: bool) -> jax.Array:
    """The attention-only field at one time, [n, d] -> [n, d]: v_i = P_i sum_j softmax_j(beta x_i^T A x_j) B x_j."""
    scores = beta * ((x @ A) @ x.T)  # [n, n]: x_i^T A x_j
    weights = jax.nn.softmax(scores, axis=-1)
    v = weights @ (x @ B.T)  # row i: sum_j S_ij (B x_j)^T
    if sphere:
        radial = jnp.sum(v * x, axis=-1, keepdims=True) / jnp.sum(x * x, axis=-1, keepdims=True)
        v = v - radial * x
    return v


def _normalise_rows(y: jax.Array) -> jax.Array:
    return y / jnp.linalg.norm(y, axis=-1, keepdims=True)


class _ProjectedInterpolation(diffrax.AbstractLocalInterpolation):
    """The wrapped solver's dense output within one step, with every token divided by its norm."""

    inner: diffrax.AbstractLocalInterpolation

    t0 = property(lambda self: self.inner.t0)
    t1 = property(lambda self: self.inner.t1)

    def evaluate(self, t0, t1=None, left=True):
        if t1 is not None:
            return self.evaluate(t1, left=left) - self.evaluate(t0, left=left)
        return _normalise_rows(self.inner.evaluate(t0, left=left))


class SphereProjection(diffrax.AbstractWrappedSolver):
    """Wraps a Diffrax solver: every token (row of y) of each step and of the dense output is divided by its norm; the
    correction is of the step's own error, so the solver keeps its order, error estimates and FSAL stage."""

    solver: diffrax.AbstractSolver

    term_structure = property(lambda self: self.solver.term_structure)
    term_compatible_contr_kwargs = property(lambda self: self.solver.term_compatible_contr_kwargs)

    @property
    def interpolation_cls(self):  # pyright: ignore
        inner_cls = self.solver.interpolation_cls
        return lambda **kwargs: _ProjectedInterpolation(inner_cls(**kwargs))

    def order(self, terms):
        return self.solver.order(terms)

    def error_order(self, terms):
        return self.solver.error_order(terms) if hasattr(self.solver, "error_order") else None

    def init(self, terms, t0, t1, y0, args):
        return self.solver.init(terms, t0, t1, y0, args)

    def step(self, terms, t0, t1, y0, args, solver_state, made_jump):
        y1, y_error, dense_info, solver_state, result = self.solver.step(
            terms, t0, t1, y0, args, solver_state, made_jump
        )
        y1 = _normalise_rows(y1)
        if "y1" in dense_info:
            dense_info = {**dense_info, "y1": y1}
        return y1, y_error, dense_info, solver_state, result

    def func(self, terms, t0, y0, args):
        return self.solver.func(terms, t0, y0, args)


def solve(field: Callable, y0, args, ts: jax.Array, dt0: jax.Array, solver: SolverConfig, sphere: bool,
           dtmax: float | None = None, jump_ts: jax.Array | None = None):
    """Solve dy/dt = field(t, y, args) from step dt0, saved at ts: (ys, num_steps, success), NaN past a failure;
    adaptive steps do not straddle ``jump_ts``; dt0 is traced, so solves differing only in the step share a compile."""
    inner = SOLVERS[solver.solver]()
    method = SphereProjection(inner) if (sphere and solver.project) else inner
    t0, t1 = ts[0], ts[-1]
    if solver.adaptive:
        controller = diffrax.PIDController(
            rtol=solver.rtol, atol=solver.atol, dtmax=dtmax, dtmin=solver.dtmin * (t1 - t0), force_dtmin=True
        )
        if jump_ts is not None:
            controller = diffrax.ClipStepSizeController(controller, jump_ts=jump_ts)
    else:
        controller = diffrax.ConstantStepSize()
    sol = diffrax.diffeqsolve(
        diffrax.ODETerm(field), method, t0=t0, t1=t1, dt0=dt0, y0=y0, args=args, saveat=diffrax.SaveAt(ts=ts),
        stepsize_controller=controller, max_steps=solver.max_steps, throw=False,
        # Stop at the first non-finite state (free space can overflow float32) instead of stepping on to max_steps.
        event=diffrax.Event(lambda t, y, args, **kwargs: jnp.logical_not(_all_finite(y))),
    )
    success = sol.result == diffrax.RESULTS.successful
    ys = jax.tree.map(lambda a: jnp.where(jnp.isfinite(a), a, jnp.nan), sol.ys)
    return ys, sol.stats["num_steps"], success


def _all_finite(tree) -> jax.Array:
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(a)) for a in jax.tree.leaves(tree)]))


def growth_label(power: float) -> str:
    """'1', 't', 't^2', ... for g(t) = t^power (the Datasets' ``growth_label``)."""
    return {0: "1", 1: "t"}.get(power, f"t^{power:g}")


def initial_weights(key: jax.Array, dim: int, kind: str) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Q(0), K(0), V(0), each [d, d] (see ``TrajectoryConfig.weights``)."""
    kq, kk, kv = jax.random.split(key, 3)
    eye = jnp.eye(dim, dtype=jnp.float32)
    if kind == "identity":
        return eye, eye, eye
    scale = 1.0 / math.sqrt(dim)
    q = jax.random.normal(kq, (dim, dim), dtype=jnp.float32) * scale
    k = jax.random.normal(kk, (dim, dim), dtype=jnp.float32) * scale
    if kind == "gaussian_qk":
        return q, k, eye
    if kind == "gaussian":
        return q, k, jax.random.normal(kv, (dim, dim), dtype=jnp.float32) * scale
    raise ValueError(f"weights must be one of {WEIGHTS}, got {kind!r}")


def weight_pieces(key: jax.Array, dim: int, kind: str, pieces: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Q, K, V of every interval, each [P, d, d]: for 'redrawn' P = ``pieces`` Gaussian draws, one key per interval;
    else P = 1, ``initial_weights(key, dim, kind)``."""
    if kind != "redrawn":
        return tuple(w[None] for w in initial_weights(key, dim, kind))
    return jax.vmap(lambda k: initial_weights(k, dim, "gaussian"))(jax.random.split(key, pieces))


def uniform_sphere(key: jax.Array, n: int, dim: int) -> jax.Array:
    """n points uniform on S^{dim-1}: normalised standard Gaussians, [n, dim]."""
    return _normalise_rows(jax.random.normal(key, (n, dim), dtype=jnp.float32))


def uniform_cube(key: jax.Array, n: int, dim: int) -> jax.Array:
    """n points uniform in [-1, 1]^dim, [n, dim]."""
    return jax.random.uniform(key, (n, dim), dtype=jnp.float32, minval=-1.0, maxval=1.0)


def _free_velocity(y: jax.Array, rho: jax.Array, A: jax.Array, B: jax.Array, beta) -> tuple[jax.Array, jax.Array]:
    """Free space in the coordinates x_i = e^rho y_i: (dy/dt [n, d], d rho/dt)."""
    scale = jnp.minimum(beta * jnp.exp(jnp.minimum(2.0 * rho, 80.0)), SCORE_CAP)  # exp(80) < float32's max
    v = attention_velocity(y, scale * A, B, 1.0, False)
    rate = jnp.mean(jnp.sum(v * y, axis=-1) / jnp.sum(y * y, axis=-1))
    return v - rate * y, rate


@functools.lru_cache(maxsize=None)
def _polynomial_runner(solver: SolverConfig, sphere: bool, pieces: bool) -> Callable:
    """The compiled solve of a batch of (power, Q, K, V [P, d, d], x(0)), one per (solver settings, geometry, jumps);
    times, beta, the step and the jump times are traced (fixed weights skip the costlier jump-aware controller)."""

    def field(t, state, args):
        power, q, k, v, beta, jumps, shift = args
        t = jnp.asarray(t, jnp.float32)
        if pieces:  # the interval holding t (+ half a constant step)
            i = jnp.searchsorted(jumps, t + shift, side="right")
            q, k, v = q[i], k[i], v[i]
        else:
            q, k, v = q[0], k[0], v[0]
        g = jnp.power(t, power)
        A, B = g * g * (q.T @ k), g * v
        if sphere:
            return attention_velocity(state, A, B, beta, True)
        return _free_velocity(*state, A, B, beta)

    def run(batch, ts, dt0, beta, jumps):
        shift = jnp.zeros((), jnp.float32) if solver.adaptive else dt0 / 2
        jump_ts = jumps if (pieces and solver.adaptive) else None

        def one(inputs):
            power, q, k, v, x = inputs
            y0 = x if sphere else (x, jnp.zeros((), x.dtype))
            return solve(field, y0, (power, q, k, v, beta, jumps, shift), ts, dt0, solver, sphere, jump_ts=jump_ts)

        # lax.map, not vmap: a vmapped adaptive solve runs every system for as many steps as the slowest one needs.
        return jax.lax.map(one, batch)

    return jax.jit(run)


def simulate(config: TrajectoryConfig = TrajectoryConfig(), *, cache_dir: Path | str | None = None) -> xr.Dataset:
    """Solve the random-weight dynamics for every growth power and seed of ``config`` in one compiled call (seed s:
    PRNGKey(s) split into weights and start, shared by every power), cached in ``cache_dir``: ``x`` (growth, seed,
    time, token, dim; free space: y), ``log_scale`` (free space: rho), ``q0``, ``k0``, ``v0`` (seed, row, col),
    ``success`` and ``num_steps`` (growth, seed); ``attrs``: the configuration (``config_from_attrs``)."""
    return cached(cache_dir, "trajectories", config_key(config), lambda: _simulate(config), save=save_netcdf,
                  load=load_netcdf, suffix=".nc")


def _simulate(config: TrajectoryConfig) -> xr.Dataset:
    n, d = config.num_tokens, config.dim
    ts = jnp.linspace(0.0, config.horizon, config.num_saves + 1, dtype=jnp.float32)
    keys = jnp.stack([jax.random.PRNGKey(s) for s in config.seeds])
    key_w, key_x = jax.vmap(lambda k: jax.random.split(k, 2), out_axes=1)(keys)
    q, k, v = jax.vmap(lambda key: weight_pieces(key, d, config.weights, config.redraws))(key_w)
    start = uniform_sphere if config.start == "sphere" else uniform_cube
    x0 = jax.vmap(lambda k: start(k, n, d))(key_x)
    powers = jnp.asarray(config.growth_powers, dtype=jnp.float32)

    G, S = len(config.growth_powers), len(config.seeds)
    batch = (jnp.repeat(powers, S), *(jnp.tile(a, (G,) + (1,) * (a.ndim - 1)) for a in (q, k, v, x0)))
    pieces = config.weights == "redrawn" and config.redraws > 1
    sphere = config.geometry == "sphere"
    run = _polynomial_runner(dataclasses.replace(config.solver, num_steps=1), sphere, pieces)
    dt0 = jnp.float32(config.horizon / config.solver.num_steps)
    # the interval ends, where the weights jump: an adaptive solve steps to each, and not across
    jumps = jnp.linspace(0.0, config.horizon, config.redraws + 1, dtype=jnp.float32)[1:-1] if pieces else None
    ys, num_steps, success = run(batch, ts, dt0, jnp.float32(config.beta), jumps)
    ys, log_scale = (ys, None) if sphere else ys
    ys = ys.reshape(G, S, *ys.shape[1:])
    num_steps, success = num_steps.reshape(G, S), success.reshape(G, S)
    extra = {} if sphere else {"log_scale": (("growth", "seed", "time"), np.asarray(log_scale).reshape(G, S, -1))}
    coords = {
        "growth": ("growth", np.asarray(config.growth_powers, dtype=np.float64)),
        "growth_label": ("growth", [growth_label(p) for p in config.growth_powers]),
        "seed": ("seed", np.asarray(config.seeds, dtype=np.int32)),
        "time": ("time", np.linspace(0.0, config.horizon, config.num_saves + 1)),
        "token": ("token", np.arange(n, dtype=np.int32)),
        "dim": ("dim", np.arange(d, dtype=np.int32)),
    }
    ds = xr.Dataset(
        {
            "x": (("growth", "seed", "time", "token", "dim"), np.asarray(ys)),
            **extra,
            "q0": (("seed", "row", "col"), np.asarray(q[:, 0])),
            "k0": (("seed", "row", "col"), np.asarray(k[:, 0])),
            "v0": (("seed", "row", "col"), np.asarray(v[:, 0])),
            "success": (("growth", "seed"), np.asarray(success)),
            "num_steps": (("growth", "seed"), np.asarray(num_steps, dtype=np.int32)),
        },
        coords=coords,
        attrs=dataset_attrs(config, kind="polynomial"),
    )
    ds["x"].attrs["description"] = "token positions x_i(t)" if sphere else "y_i(t) = x_i(t) e^-rho(t)"
    return ds


__all__ = ["GEOMETRIES", "ModelTrajectoryConfig", "SCORE_CAP", "SOLVERS", "STARTS", "SolverConfig", "SphereProjection",
           "TrajectoryConfig", "WEIGHTS", "attention_velocity", "config_from_attrs", "config_key", "dataset_attrs",
           "growth_label", "initial_weights", "simulate", "solve", "uniform_cube", "uniform_sphere", "weight_pieces"]
