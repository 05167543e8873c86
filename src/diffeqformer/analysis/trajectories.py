"""Attention-only particle dynamics: do tokens cluster? (PAPER.md section 2, Fig. 2c/2d, Fig. 13).

One attention head moves n tokens x_1..x_n in R^d (column vectors):

    dx_i/dt = P_i sum_j softmax_j( beta x_i^T A(t) x_j ) B(t) x_j,

with the bilinear form A(t) = Q(t)^T K(t) (the score <Q x_i, K x_j>) and the value map B(t) = V(t). Two geometries:

* ``"sphere"``: P_i = I - x_i x_i^T / |x_i|^2 projects the velocity onto the tangent space of the sphere at x_i
  (LayerNorm as a projection, Geshkovski et al. 2023, "The emergence of clusters in self-attention dynamics" and
  "A mathematical perspective on transformers"). The projected field is tangent for any |x_i|, so the exact flow keeps
  |x_i| = 1.
* ``"free"``: P_i = I, no projection.

``simulate`` runs the paper's experiment: random Q(0), K(0), V(0) and W(t) = g(t) W(0) for every weight, with
g(t) = t^p (p = 0 is weight sharing), so A(t) = g(t)^2 A(0) and B(t) = g(t) B(0). Its controls
(``TrajectoryConfig.weights``): Q = K = V = I, the case in which Geshkovski et al. prove that weight sharing clusters
(it must cluster, or the simulation is wrong), and Gaussian weights drawn afresh on each of ``redraws`` intervals of
[0, T] (W(t) = g(t) W_k on the k-th: weights that change with t without growing). ``step_convergence`` solves the same
systems with more and more Euler steps, ``growth_verdicts`` and ``paired_verdicts`` judge differences over seeds by the
book's rule (``seeds.RULE``). ``simulate_model`` drives the same dynamics with one head of a
``DiffEqFormerLMHeadModel``. Both return an ``xarray.Dataset``; ``clustering_metrics`` and ``final_metrics`` reduce it,
``plot_trajectories``, ``plot_metrics``, ``plot_controls`` and ``plot_step_convergence`` draw it. The expensive step
(the solve) and the cheap ones (metrics, figures) are separate functions, so a figure never re-runs a simulation.

Numerical choices, stated once:

* Solver: Diffrax's Tsit5 with a PID step-size controller by default, saving at ``num_saves + 1`` equally spaced
  times. The paper uses 200 explicit Euler steps; ``SolverConfig(solver="euler", adaptive=False, num_steps=200)``
  reproduces that. With fast growth g(t) = t^p the velocity reaches g(T) |B| (10^4 at T = 10, p = 4), so a fixed step
  of T/200 moves a token by far more than the sphere's size per step: such runs show the discretisation, not the ODE
  (the adaptive solve of the same systems takes orders of magnitude more steps: measurements page).
* Sphere constraint: in float32 the drift of |x_i| accumulates over the 10^4-10^5 steps that fast growth needs
  (far above the tolerances: measurements page). We therefore renormalise: the standard projection method
  (Hairer, Lubich & Wanner, "Geometric Numerical Integration", IV.4) divides each token by its norm after every step,
  and the dense output from which the saved times are interpolated is projected the same way. This keeps the order of
  the underlying solver (tested); ``SolverConfig(project=False)`` turns it off, and the tests check that the
  unprojected solve of the tangent field stays on the sphere to 1e-5 by itself where the step count is small.
* Free space: the norms grow like exp(int_0^t g) (10^4 at T = 10 for p = 4), so x itself overflows float32, and the
  scores x_i^T A x_j far sooner (p = 4 near t = 2.9 with Q = K = V = I). ``simulate`` therefore solves for
  x_i = e^rho y_i with a common log-scale rho(t), d rho/dt = mean_i <y_i, v_i> / |y_i|^2 (v_i the velocity of y_i
  before rescaling), which keeps the y_i of order one: dy_i/dt = v_i - (d rho/dt) y_i, with the scores
  beta e^{2 rho} y_i^T A y_j. This is the same ODE in other coordinates; its only approximation is that the score
  scale beta g^2 e^{2 rho} is capped at ``SCORE_CAP``, where the softmax is a hard maximum in float32 anyway (two
  scores then get different weights only if they agree to 1 part in 10^20, i.e. for tokens that coincide, whose
  values coincide too). The Dataset's ``x`` holds y and ``log_scale`` holds rho. Clustering in free space is measured
  on directions x/|x| = y/|y|. A solve still stops at the first non-finite state (tokens whose norms drift apart by
  10^38); it is flagged (``success = False``) and its later times are NaN. ``simulate_model`` solves for x itself.
* Redrawn weights are piecewise constant in t: the adaptive solver is told the jump times (Diffrax's
  ``ClipStepSizeController(jump_ts=...)``), so no step straddles a jump; Euler steps evaluate the weights at the
  step's start (a half-step offset makes the interval lookup immune to the rounding of t).
* Softmax with a large beta g(t)^2 is nearly a hard max; see ``SolverConfig.dtmin`` for what that asks of the step.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import diffrax
import equinox as eqx
import haliax as hax
import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
import xarray as xr

from ..numerics import cached, check_positive_int, digest, fingerprint, load_netcdf, one_blas_thread, save_netcdf
from .seeds import Comparison, Judged, compare, one_sample

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from ..model.transformer import DiffEqFormerLMHeadModel

GEOMETRIES = ("sphere", "free")
WEIGHTS = ("gaussian", "identity", "gaussian_qk", "redrawn")
STARTS = ("sphere", "cube")
SCORE_CAP = 1e25
"""Free space: the largest score scale beta g(t)^2 e^{2 rho}; beyond it the softmax is a hard maximum in float32 (a
score gap of 10^-7 relative already weighs exp(-10^18)), and the cap keeps the scores finite."""
SOLVERS: dict[str, Callable[[], diffrax.AbstractSolver]] = {
    "euler": diffrax.Euler,
    "heun": diffrax.Heun,
    "midpoint": diffrax.Midpoint,
    "ralston": diffrax.Ralston,
    "bosh3": diffrax.Bosh3,
    "tsit5": diffrax.Tsit5,
    "dopri5": diffrax.Dopri5,
    "dopri8": diffrax.Dopri8,
}
"""Explicit Diffrax solvers by name (orders 1, 2, 2, 2, 3, 5, 5, 8)."""


# ----------------------------------------------------------------------------------------------------------------------
# Configuration
# ----------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SolverConfig:
    """How the ODE is solved (shared by ``simulate`` and ``simulate_model``)."""

    solver: str = "tsit5"
    """A key of ``SOLVERS``."""
    adaptive: bool = True
    """PID step-size control (needs a solver with an error estimate: not Euler, Heun is fine); False: constant steps."""
    num_steps: int = 200
    """Constant steps: their number on [t0, t1]. Adaptive: the first step is (t1 - t0) / num_steps."""
    rtol: float = 1e-6
    """Relative tolerance of the PID controller."""
    atol: float = 1e-6
    """Absolute tolerance of the PID controller (positions are O(1))."""
    max_steps: int = 2_000_000
    """Diffrax's step budget; a solve that exhausts it is marked ``success = False`` and its later times are NaN. A run
    that chatters at ``dtmin`` over the whole horizon needs about 2.5 / dtmin steps (every forced step is followed by
    one or two rejected tries: float32 rounds t0 + dtmin to a step just above dtmin)."""
    dtmin: float = 3e-6
    """Adaptive: the smallest step, as a fraction of t1 - t0; such a step is taken even if its error estimate is too
    large. Needed because with fast growth the softmax is nearly a hard max (beta g(t)^2 ~ 10^8 at t = 10, p = 4):
    where a token's arg max switches the field jumps, and along a switching surface the solution chatters (a sliding
    mode), so that the controller asks for steps at float32's resolution of t. 3e-6 was chosen on the default
    experiment (measurements page): a smaller dtmin let chattering runs stall, and with 1e-5 a forced step can move a
    token by g(T) |V| dtmin T ~ 1 rad (Q = K = V = I, g = t^4). Chattering runs are not converged in the usual sense:
    their final fractions of clustered pairs depend on dtmin (measurements page)."""
    project: bool = True
    """Sphere only: renormalise every token after each step (the projection method; see the module docstring)."""

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
    """T: the dynamics runs on [0, T]. T = 10 with dt = T/200 = 0.05 is the scale of Geshkovski et al.'s simulations
    (T = 15, dt = 0.1); on [0, 1] no growth law moves the tokens noticeably (t^p <= 1)."""
    num_saves: int = 200
    """Saved intervals: the Dataset has num_saves + 1 times 0, T/num_saves, ..., T."""
    beta: float = 1.0
    """Inverse temperature of the softmax (Geshkovski et al.'s default; beta = 0 is uniform attention)."""
    geometry: str = "sphere"
    """'sphere' (tangent projection, Geshkovski et al.) or 'free' (no projection, the paper's App. C.8)."""
    start: str = "sphere"
    """x(0): 'sphere' (uniform on S^{d-1}) or 'cube' (uniform in [-1, 1]^d: the paper's 'uniform random start', whose
    range it does not give; centred, so that the directions x/|x| cover the whole sphere as from the 'sphere' start)."""
    growth_powers: tuple[float, ...] = (0.0, 1.0, 2.0, 3.0, 4.0)
    """Powers p of g(t) = t^p: 0 is weight sharing, 1..4 the paper's polynomial growth."""
    weights: str = "gaussian"
    """Q(0), K(0), V(0): 'gaussian' (i.i.d. N(0, 1/d) entries, the fan-in scale: the paper's 'random' weights),
    'identity' (Q = K = V = I, Geshkovski et al.'s canonical case), 'gaussian_qk' (Gaussian Q, K and V = I) or
    'redrawn' (Gaussian Q, K, V drawn afresh on each of ``redraws`` equal intervals of [0, T], times g(t): a control
    whose weights change with t without growing; the authors' public notebook redraws V at every Euler step in one of
    its settings)."""
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
        if self.geometry not in GEOMETRIES:
            raise ValueError(f"geometry must be one of {GEOMETRIES}, got {self.geometry!r}")
        if self.weights not in WEIGHTS:
            raise ValueError(f"weights must be one of {WEIGHTS}, got {self.weights!r}")
        if self.start not in STARTS:
            raise ValueError(f"start must be one of {STARTS}, got {self.start!r}")
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
    """Inverse temperature; None means D, which makes unit-sphere tokens score like LayerNorm outputs (radius sqrt(D),
    no affine part): (sqrt(D) x)^T A (sqrt(D) y) = D x^T A y."""
    geometry: str = "sphere"
    """'sphere' or 'free', as in ``TrajectoryConfig``."""
    t1: float = 1.0
    """End time; the model is trained on [0, 1]."""
    num_saves: int = 200
    """Saved intervals on [0, t1]."""
    seed: int = 0
    """Seed of the start tokens and of nothing else."""
    steps_per_period: int = 8
    """Adaptive solves: the step is capped at (shortest sinusoid period of e(t)) / steps_per_period, so that the
    solver resolves the weights' fastest oscillation (period 2 pi / s = 0.0063 for the paper's s = 1000)."""
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


def _key_of(config: TrajectoryConfig | ModelTrajectoryConfig) -> dict:
    """The configuration as the cache's key: its type and every field."""
    return {"type": type(config).__name__, **dataclasses.asdict(config)}


def config_hash(config: TrajectoryConfig | ModelTrajectoryConfig) -> str:
    """First 16 hex digits of the SHA-256 of the configuration's canonical JSON (the datasets' ``config_hash``)."""
    return digest(_key_of(config))


def config_from_attrs(attrs: dict) -> TrajectoryConfig | ModelTrajectoryConfig:
    """The configuration a Dataset of ``simulate`` / ``simulate_model`` was made with (from ``attrs['config']``)."""
    raw = json.loads(attrs["config"])
    kind = raw.pop("type")
    raw["solver"] = SolverConfig(**raw["solver"])
    for key in ("growth_powers", "seeds", "heads"):
        if key in raw:
            raw[key] = tuple(raw[key])
    return {"TrajectoryConfig": TrajectoryConfig, "ModelTrajectoryConfig": ModelTrajectoryConfig}[kind](**raw)


def _attrs(config: TrajectoryConfig | ModelTrajectoryConfig, **extra) -> dict:
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
    content = json.dumps({"type": type(config).__name__, **dataclasses.asdict(config)}, sort_keys=True)
    return {**flat, **{k: safe(v) for k, v in extra.items()}, "config": content, "config_hash": config_hash(config)}


# ----------------------------------------------------------------------------------------------------------------------
# Dynamics and solve
# ----------------------------------------------------------------------------------------------------------------------


def attention_velocity(x: jax.Array, A: jax.Array, B: jax.Array, beta, sphere: bool) -> jax.Array:
    """The attention-only vector field at one time: [n, d] -> [n, d].

    v_i = P_i sum_j S_ij B x_j,  S_ij = softmax_j(beta x_i^T A x_j),  P_i = I - x_i x_i^T / |x_i|^2 on the sphere
    (identity in free space). A and B are [d, d]; beta is a scalar.
    """
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

    @property
    def t0(self):
        return self.inner.t0

    @property
    def t1(self):
        return self.inner.t1

    def evaluate(self, t0, t1=None, left=True):
        if t1 is not None:
            return self.evaluate(t1, left=left) - self.evaluate(t0, left=left)
        return _normalise_rows(self.inner.evaluate(t0, left=left))


class SphereProjection(diffrax.AbstractWrappedSolver):
    """Wraps a Diffrax solver: after each step every token (row of y, [..., n, d]) is divided by its norm, and so is
    the dense output from which the saved times are interpolated.

    The standard projection method for an ODE with the invariant |x_i| = 1 (Hairer, Lubich & Wanner, GNI IV.4): the
    correction is of the size of the step's own error, so the solver keeps its order, and the drift cannot accumulate.
    Error estimates and the FSAL stage are the wrapped solver's; they refer to the unprojected step end, which differs
    from the projected one by the step's drift (far below the tolerances), so that is harmless.
    """

    solver: diffrax.AbstractSolver

    @property
    def term_structure(self):
        return self.solver.term_structure

    @property
    def interpolation_cls(self):  # pyright: ignore
        inner_cls = self.solver.interpolation_cls
        return lambda **kwargs: _ProjectedInterpolation(inner_cls(**kwargs))

    @property
    def term_compatible_contr_kwargs(self):
        return self.solver.term_compatible_contr_kwargs

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


def _solve(
    field: Callable,
    y0,
    args,
    ts: jax.Array,
    dt0: jax.Array,
    solver: SolverConfig,
    sphere: bool,
    dtmax: float | None = None,
    jump_ts: jax.Array | None = None,
):
    """Solve dy/dt = field(t, y, args) from ts[0] to ts[-1] with (first) step dt0, saved at ts. Returns
    (ys [len(ts), ...] (a pytree like y0), num_steps, success); times a failed solve did not reach are NaN (Diffrax
    fills them with inf). ``jump_ts``: times where the field jumps, which adaptive steps do not straddle.
    ``solver.num_steps`` is not read here: dt0 is traced, so that solves differing only in the step share a compile."""
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
        diffrax.ODETerm(field),
        method,
        t0=t0,
        t1=t1,
        dt0=dt0,
        y0=y0,
        args=args,
        saveat=diffrax.SaveAt(ts=ts),
        stepsize_controller=controller,
        max_steps=solver.max_steps,
        throw=False,
        # Stop at the first non-finite state (free space can overflow float32) instead of stepping on to max_steps.
        event=diffrax.Event(lambda t, y, args, **kwargs: jnp.logical_not(_all_finite(y))),
    )
    success = sol.result == diffrax.RESULTS.successful
    ys = jax.tree.map(lambda a: jnp.where(jnp.isfinite(a), a, jnp.nan), sol.ys)
    return ys, sol.stats["num_steps"], success


def _all_finite(tree) -> jax.Array:
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(a)) for a in jax.tree.leaves(tree)]))


def growth_label(power: float) -> str:
    """'1', 't', 't^2', ... for g(t) = t^power."""
    if power == 0:
        return "1"
    if power == 1:
        return "t"
    return f"t^{power:g}"


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
    """Q, K, V of every interval, each [P, d, d]: for 'redrawn', P = ``pieces`` independent Gaussian draws
    (``initial_weights(..., 'gaussian')`` with the key of each interval); for the other kinds P = 1,
    ``initial_weights(key, dim, kind)``."""
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
    """Free space in the coordinates x_i = e^rho y_i (module docstring): (dy/dt [n, d], d rho/dt)."""
    scale = jnp.minimum(beta * jnp.exp(jnp.minimum(2.0 * rho, 80.0)), SCORE_CAP)  # exp(80) < float32's max
    v = attention_velocity(y, scale * A, B, 1.0, False)
    rate = jnp.mean(jnp.sum(v * y, axis=-1) / jnp.sum(y * y, axis=-1))
    return v - rate * y, rate


@functools.lru_cache(maxsize=None)
def _polynomial_runner(solver: SolverConfig, sphere: bool, pieces: bool) -> Callable:
    """The compiled solve of a batch of (power, Q, K, V [P, d, d], x(0)), one per (solver settings, geometry,
    whether the weights jump): times, beta, the step and the jump times are traced arguments, so e.g. a convergence
    study compiles once per solver. Fixed weights do without the jump times, whose step controller
    (``ClipStepSizeController``) costs more per step (measurements page). Free space solves for (y, rho) (module
    docstring)."""

    def field(t, state, args):
        power, q, k, v, beta, jumps, shift = args
        t = jnp.asarray(t, jnp.float32)
        if pieces:  # the interval holding t (+ half a constant step: module docstring)
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
            return _solve(field, y0, (power, q, k, v, beta, jumps, shift), ts, dt0, solver, sphere, jump_ts=jump_ts)

        # lax.map, not vmap: a vmapped adaptive solve runs every system for as many steps as the slowest one needs
        # (fast growth needs orders of magnitude more than weight sharing) at the batched cost; a sequential map
        # does not.
        return jax.lax.map(one, batch)

    return jax.jit(run)


def simulate(config: TrajectoryConfig = TrajectoryConfig(), *, cache_dir: Path | str | None = None) -> xr.Dataset:
    """Solve the random-weight dynamics for every growth power and seed of ``config``.

    For seed s: key = PRNGKey(s) split into (weights, start); Q(0), K(0), V(0) from ``weight_pieces``; x(0) from
    ``config.start``; every power p uses the same weights and start. For power p: Q(t) = t^p Q(0) etc., so
    A(t) = t^{2p} Q(0)^T K(0) and B(t) = t^p V(0) (with 'redrawn' weights, those of the interval holding t). All
    (p, s) pairs are solved in one compiled call (a sequential ``lax.map`` over Diffrax solves, compiled once per
    solver setting and shape).

    Returns a Dataset with
      ``x``          (growth, seed, time, token, dim)   positions (free space: y = x e^-rho, see the module docstring)
      ``log_scale``  (growth, seed, time)               free space only: rho, so that x = e^rho y
      ``q0``, ``k0``, ``v0`` (seed, row, col)           Q(0), K(0), V(0) (redrawn: those of the first interval)
      ``success``    (growth, seed)                     the solve reached T, finite, within ``max_steps``
      ``num_steps``  (growth, seed)                     accepted + rejected solver steps
    coordinates growth (the powers p, with ``growth_label``), seed, time, token, dim; ``attrs`` holds every
    configuration field (``config`` as JSON for ``config_from_attrs``). With ``cache_dir``, the Dataset is read from /
    written to ``cache_dir/trajectories-<config_hash>.nc``.
    """
    return cached(cache_dir, "trajectories", _key_of(config), lambda: _simulate(config), save=save_netcdf,
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
        attrs=_attrs(config, kind="polynomial"),
    )
    ds["x"].attrs["description"] = "token positions x_i(t)" if sphere else "y_i(t) = x_i(t) e^-rho(t)"
    return ds


# ----------------------------------------------------------------------------------------------------------------------
# Driven by a DiffEqFormer
# ----------------------------------------------------------------------------------------------------------------------


def model_attention_matrices(model: "DiffEqFormerLMHeadModel", t: hax.NamedArray, head: int):
    """The bilinear form A(t) and value map B(t) of one head of the model, each [..., D, D] (leading axes: those of t).

    With W_Q^h(t), W_K^h(t), W_V^h(t) of shape [head_size, D] (rows of the model's projections for head h) and
    W_O^h(t) of shape [D, head_size],

        A(t) = W_Q^h(t)^T W_K^h(t) / sqrt(head_size),   B(t) = W_O^h(t) W_V^h(t),

    so that the head's output at token i is sum_j softmax_j(x_i^T A x_j) B x_j for a layer input x (biases dropped).
    These are the paper's QK and OV matrices (written W_Q W_K^T and W_V W_O in its row-vector convention).
    """
    attn = model.weights_at(t).attn
    groups = attn.q_proj.weight.resolve_axis("q_heads_per_group").size
    kv, g = divmod(head, groups)
    wq = attn.q_proj.weight.rearrange((..., "kv_head", "q_heads_per_group", "head_size", "embed")).array[..., kv, g, :, :]
    wk = attn.k_proj.weight.rearrange((..., "kv_head", "head_size", "embed")).array[..., kv, :, :]
    wv = attn.v_proj.weight.rearrange((..., "kv_head", "head_size", "embed")).array[..., kv, :, :]
    wo = attn.o_proj.weight.rearrange((..., "heads", "embed", "head_size")).array[..., head, :, :]
    head_size = wq.shape[-2]
    a = jnp.swapaxes(wq, -1, -2) @ wk / math.sqrt(head_size)
    b = wo @ wv
    return a, b


def simulate_model(
    model: "DiffEqFormerLMHeadModel",
    config: ModelTrajectoryConfig = ModelTrajectoryConfig(),
    *,
    cache_dir: Path | str | None = None,
) -> xr.Dataset:
    """Tokens moved by one head of a DiffEqFormer: dx_i/dt = P_i sum_j softmax_j(beta x_i^T A(t) x_j) B(t) x_j.

    A(t), B(t) from ``model_attention_matrices``, evaluated at every solver stage (so the model's own growth of its QK
    and OV spectra drives the dynamics), in the model's width D with no projection to 3-D: that is the system the
    head actually defines. The rest of the block (LayerNorm's affine part, biases, the MLP, the other heads) is left
    out, as in the paper's attention-only simulation. Tokens start uniform on S^{D-1}.

    Solver: adaptive solves cap the step at 2 pi / (s * steps_per_period), s the sinusoid scale of the time
    embedding, because W(t) contains sin(s t) (period 0.0063 for s = 1000) and a controller that only sees the tokens
    could step over it. Note that the network was trained on its L Euler grid points only; between them W(t) is
    whatever the hypernetwork extrapolates.

    Returns a Dataset with ``x`` (head, time, token, dim), ``x_pca`` (head, time, token, pc: the positions projected on
    the top-3 principal components of all times and tokens of that head, centred, for 3-D pictures),
    ``pca_explained`` (head, pc: fraction of variance), ``qk_radius`` and ``ov_radius`` (head, time: spectral radii
    max |eig| of A(t) and B(t)), ``success`` and ``num_steps`` (head); attrs as in ``simulate`` plus the model's size
    and ``model_fingerprint``. With ``cache_dir``, the Dataset is read from / written to
    ``cache_dir/model-trajectories-<hash>.nc``, the hash covering the configuration and the model's weights.
    """
    model_key = fingerprint(model)
    return cached(cache_dir, "model-trajectories", {**_key_of(config), "model": model_key},
                  lambda: _simulate_model(model, config, model_key), save=save_netcdf, load=load_netcdf, suffix=".nc")


def _simulate_model(model: "DiffEqFormerLMHeadModel", config: ModelTrajectoryConfig, model_key: str) -> xr.Dataset:
    mc = model.config
    D = mc.hidden_dim
    for h in config.heads:
        if h >= mc.num_heads:
            raise ValueError(f"head {h} does not exist: the model has {mc.num_heads} heads")
    beta = float(D) if config.beta is None else config.beta
    sphere = config.geometry == "sphere"
    ts = jnp.linspace(0.0, config.t1, config.num_saves + 1, dtype=jnp.float32)
    x0 = uniform_sphere(jax.random.PRNGKey(config.seed), config.num_tokens, D)
    scale = model.time_embedding.scale
    dtmax = 2 * math.pi / (scale * config.steps_per_period) if config.solver.adaptive else None

    solver = dataclasses.replace(config.solver, num_steps=1)
    dt0 = jnp.float32(config.t1 / config.solver.num_steps)
    xs, steps, oks, qk_r, ov_r = [], [], [], [], []
    for h in config.heads:
        head = jnp.asarray(h, dtype=jnp.int32)
        ys, n_steps, ok = _run_model(model, head, x0, ts, dt0, beta, solver, sphere, dtmax)
        xs.append(np.asarray(ys))
        steps.append(int(n_steps))
        oks.append(bool(ok))
        a, b = _matrices_at(model, ts, head)
        # eigenvalues of non-symmetric matrices: numpy (jnp.linalg.eigvals is CPU-only), with one BLAS thread (many
        # small matrices: see numerics.one_blas_thread)
        with one_blas_thread():
            qk_r.append(np.abs(np.linalg.eigvals(np.asarray(a, dtype=np.float64))).max(axis=-1))
            ov_r.append(np.abs(np.linalg.eigvals(np.asarray(b, dtype=np.float64))).max(axis=-1))
    x = np.stack(xs)
    x_pca, explained = _pca3(x)

    ds = xr.Dataset(
        {
            "x": (("head", "time", "token", "dim"), x),
            "x_pca": (("head", "time", "token", "pc"), x_pca),
            "pca_explained": (("head", "pc"), explained),
            "qk_radius": (("head", "time"), np.stack(qk_r)),
            "ov_radius": (("head", "time"), np.stack(ov_r)),
            "success": ("head", np.asarray(oks)),
            "num_steps": ("head", np.asarray(steps, dtype=np.int32)),
        },
        coords={
            "head": ("head", np.asarray(config.heads, dtype=np.int32)),
            "time": ("time", np.linspace(0.0, config.t1, config.num_saves + 1)),
            "token": ("token", np.arange(config.num_tokens, dtype=np.int32)),
            "dim": ("dim", np.arange(D, dtype=np.int32)),
            "pc": ("pc", np.arange(x_pca.shape[-1], dtype=np.int32)),
        },
        attrs=_attrs(
            config,
            kind="model",
            dim=D,
            horizon=config.t1,
            beta_used=beta,
            dtmax=dtmax,
            model_hidden_dim=D,
            model_num_heads=mc.num_heads,
            model_num_layers=mc.num_layers,
            model_time_dependent=mc.time_dependent,
            model_sinusoidal_scale=float(scale),
            model_fingerprint=model_key,
        ),
    )
    return ds


@eqx.filter_jit
def _run_model(model, head, x0, ts, dt0, beta: float, solver: SolverConfig, sphere: bool, dtmax: float | None):
    # Module level, with the Python scalars static: repeated calls with the same shapes reuse the compiled solve.
    def field(t, x, head):
        a, b = model_attention_matrices(model, hax.named(jnp.asarray(t, dtype=x.dtype), ()), head)
        return attention_velocity(x, a, b, beta, sphere)

    return _solve(field, x0, head, ts, dt0, solver, sphere, dtmax=dtmax)


@eqx.filter_jit
def _matrices_at(model, ts, head):
    return model_attention_matrices(model, hax.named(ts, "time"), head)


def _pca3(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x [heads, time, token, D] -> (coordinates on the top min(3, D) principal axes, explained variance fractions),
    per head, with all times and tokens pooled and centred. NaN (failed solves) rows are left out of the fit."""
    heads, T, n, D = x.shape
    k = min(3, D)
    out = np.full((heads, T, n, k), np.nan)
    explained = np.full((heads, k), np.nan)
    for h in range(heads):
        flat = x[h].reshape(-1, D).astype(np.float64)
        ok = np.all(np.isfinite(flat), axis=-1)
        if ok.sum() < 2:
            continue
        mean = flat[ok].mean(axis=0)
        _, s, vt = np.linalg.svd(flat[ok] - mean, full_matrices=False)
        out[h] = ((flat - mean) @ vt[:k].T).reshape(T, n, k)
        explained[h] = (s[:k] ** 2) / np.sum(s**2)
    return out, explained


# ----------------------------------------------------------------------------------------------------------------------
# Clustering metrics (cheap: numpy on the saved positions)
# ----------------------------------------------------------------------------------------------------------------------


def cosine_gram(x: xr.DataArray) -> xr.DataArray:
    """G_ij = <x_i, x_j> / (|x_i| |x_j|) over ``token`` x ``token_j``, for every other index of x (dims must include
    ``token`` and ``dim``). On the sphere this is the plain Gram matrix <x_i, x_j>."""
    u = x / np.sqrt((x**2).sum("dim", skipna=False))
    return xr.dot(u, u.rename(token="token_j"), dim="dim")


def clustering_metrics(ds: xr.Dataset | xr.DataArray, threshold: float = 0.999) -> xr.Dataset:
    """Clustering of the tokens at every saved time, from the cosine Gram matrix G (``cosine_gram``).

    ``fraction``: fraction of the n(n-1)/2 pairs i < j with G_ij > threshold (Geshkovski et al.'s public code uses
    0.999; in free space G is the cosine similarity, so the metric asks about directions).
    ``clusters``: rank of the 0/1 matrix 1[G > threshold] (numpy's SVD rank), as Geshkovski et al.'s code counts
    clusters (they threshold at 0.9999 for this count; one threshold here, so that fraction 1 means 1 cluster). When
    "G_ij > threshold" is an equivalence relation the matrix is block-diagonal with all-ones blocks after a
    permutation, and its rank is exactly the number of clusters (= number of distinct rows); otherwise it is a proxy.
    ``distance``: mean over pairs i < j of the chord distance |x_i/|x_i| - x_j/|x_j|| = sqrt(2 - 2 G_ij), in [0, 2]
    (mean pairwise distance on the sphere; of directions in free space).

    Returns a Dataset with these three variables over every dimension of x except ``token`` and ``dim``; NaN where the
    positions are NaN (a failed solve).
    """
    x = ds["x"] if isinstance(ds, xr.Dataset) else ds
    g = cosine_gram(x).transpose(..., "token", "token_j")
    arr = np.asarray(g.values, dtype=np.float64)
    n = arr.shape[-1]
    iu = np.triu_indices(n, k=1)
    pairs = arr[..., iu[0], iu[1]]
    finite = np.all(np.isfinite(pairs), axis=-1) if pairs.shape[-1] else np.ones(arr.shape[:-2], bool)
    above = np.where(np.isfinite(arr), arr, 0.0) > threshold
    diag = np.arange(n)
    above[..., diag, diag] = True  # a token is always with itself (G_ii can round to just below a threshold near 1)
    fraction = (pairs > threshold).mean(axis=-1) if pairs.shape[-1] else np.ones(arr.shape[:-2])
    clusters = np.linalg.matrix_rank(above.astype(np.float64)).astype(np.float64)
    distance = np.sqrt(np.clip(2.0 - 2.0 * pairs, 0.0, None)).mean(axis=-1) if pairs.shape[-1] else np.zeros(
        arr.shape[:-2]
    )
    dims = g.dims[:-2]
    coords = {k: v for k, v in g.coords.items() if set(v.dims) <= set(dims)}
    out = xr.Dataset(
        {
            "fraction": (dims, np.where(finite, fraction, np.nan)),
            "clusters": (dims, np.where(finite, clusters, np.nan)),
            "distance": (dims, np.where(finite, distance, np.nan)),
        },
        coords=coords,
        attrs={**(ds.attrs if isinstance(ds, xr.Dataset) else {}), "threshold": threshold},
    )
    out["fraction"].attrs["long_name"] = f"fraction of pairs with cos > {threshold:g}"
    out["clusters"].attrs["long_name"] = f"rank of 1[cos > {threshold:g}]"
    out["distance"].attrs["long_name"] = "mean pairwise chord distance"
    return out


def final_metrics(metrics: xr.Dataset, by: str | None = None) -> pd.DataFrame:
    """Final-time values of ``clustering_metrics`` as a table: one row per value of ``by`` (default: ``growth`` or
    ``head``, whichever exists), columns ``<metric>_mean``, ``<metric>_std`` over seeds (std 0 with one seed) and
    ``seeds`` (number of finite runs). Pass the trajectories Dataset to compute the metrics first."""
    if "x" in metrics:
        metrics = clustering_metrics(metrics)
    by = by or next(d for d in ("growth", "head") if d in metrics.dims)
    last = metrics.isel(time=-1)
    rest = [d for d in last.dims if d != by]
    rows = {}
    for name in ("fraction", "clusters", "distance"):
        v = last[name]
        rows[f"{name}_mean"] = v.mean(rest).values if rest else v.values
        rows[f"{name}_std"] = v.std(rest).values if rest else np.zeros(v.shape)
    counts = last["fraction"].notnull().sum(rest).values if rest else np.ones(last.sizes[by], int)
    index = metrics["growth_label"].values if by == "growth" and "growth_label" in metrics.coords else metrics[by].values
    table = pd.DataFrame(rows, index=pd.Index(index, name="g(t)" if by == "growth" else by))
    table["seeds"] = counts
    return table


def step_convergence(
    config: TrajectoryConfig, steps, *, cache_dir: Path | str | None = None, threshold: float = 0.999
) -> xr.Dataset:
    """``config``'s systems solved with N explicit Euler steps on [0, T] for each N in ``steps`` (renormalised on the
    sphere, as ``config.solver.project`` says), reduced to the clustering at T.

    Returns a Dataset over (steps, growth, seed) with ``fraction``, ``clusters``, ``distance`` at T
    (``clustering_metrics``) and ``success``; attrs: those of the solve with the most steps. Every solve is a
    ``simulate`` call, cached with ``cache_dir``; all share one compiled Euler solve (the step is traced)."""
    steps = [int(n) for n in steps]
    if not steps:
        raise ValueError("steps must not be empty")
    finals, attrs = [], {}
    for n in steps:
        solver = SolverConfig("euler", adaptive=False, num_steps=n, project=config.solver.project)
        ds = simulate(dataclasses.replace(config, solver=solver), cache_dir=cache_dir)
        final = clustering_metrics(ds.isel(time=[-1]), threshold).isel(time=0, drop=True)
        final["success"] = ds["success"]
        finals.append(final)
        attrs = ds.attrs
    out = xr.concat(finals, dim=pd.Index(steps, name="steps"))
    out.attrs = {**attrs, "threshold": threshold, "steps": steps}
    return out


VERDICT_COLUMNS = ("comparison", "mean a", "mean b", "difference", "low", "high", "p", "test", "seeds",
                   "detectable", "verdict")
"""The columns of ``growth_verdicts`` and ``paired_verdicts``: a row per test; for a trend, ``difference`` is the mean
of the simulations' slopes per unit of p and the means are NaN; ``low``, ``high``: its 95% confidence interval (NaN
for an exact test of values without spread); ``detectable``: the smallest difference the test finds 80% of the time
(``seeds.Judged.detectable``: its power)."""


def _verdict_row(what: str, judged: Judged | None, n: int, *, trend: bool = False) -> dict:
    if judged is None:  # no seed with finite values on both sides
        return dict(comparison=what, **{k: math.nan for k in ("mean a", "mean b", "difference", "low", "high", "p",
                                                              "detectable")},
                    test="", seeds=n, verdict=f"untested: {n} seeds")
    means = (math.nan, math.nan) if trend else (judged.a.mean, judged.b.mean)
    values = (*means, judged.difference, judged.low, judged.high)
    return dict(comparison=what, **dict(zip(("mean a", "mean b", "difference", "low", "high"), values)),
                p=judged.p, test=judged.test, seeds=n, detectable=judged.detectable, verdict=judged.verdict)


def _final_fraction(ds: xr.Dataset, threshold: float) -> xr.DataArray:
    """Fraction of clustered pairs at T, (growth, seed)."""
    return clustering_metrics(ds.isel(time=[-1]), threshold)["fraction"].isel(time=0, drop=True)


def growth_verdicts(ds: xr.Dataset, threshold: float = 0.999) -> pd.DataFrame:
    """Does weight sharing leave more token pairs clustered at T than growth does, and does the clustered fraction
    change with the power p? Judged over the simulations by the book's rule (``seeds.RULE``) on ``simulate``'s
    Dataset (which must hold p = 0); the simulation (seed) is the unit:

    * for each p > 0, ``g = 1 vs g = t^p``: the paired t-test of the fraction at T (seed s of every power shares its
      weights and start, so the seeds are matched), ``mean a`` under g = 1, ``mean b`` under t^p;
    * ``trend over p``: ``dispersion_slopes``, each simulation's least-squares slope of the fraction against p,
      tested against 0 by the one-sample t-test over the simulations (``dispersion_test``); the paper's "dispersion
      increases with the order" is a negative slope.

    Where every simulation gives the same value (fractions stuck at 0 or 1) the test is the exact sign-flip test,
    never a t-test of zero spread. Seeds whose solve failed (NaN) on either side of a comparison are left out;
    ``seeds`` counts those used. Returns a DataFrame with ``VERDICT_COLUMNS``."""
    final = _final_fraction(ds, threshold)
    powers = [float(p) for p in final["growth"].values]
    if 0.0 not in powers:
        raise ValueError(f"growth_verdicts compares against weight sharing (p = 0), not among {powers}")
    base = final.sel(growth=0.0).values
    rows = []
    for p in powers:
        if p == 0.0:
            continue
        other = final.sel(growth=p).values
        ok = np.isfinite(base) & np.isfinite(other)
        judged = compare(base[ok], other[ok], paired=True) if ok.any() else None
        rows.append(_verdict_row(f"g = 1 vs g = {growth_label(p)}", judged, int(ok.sum())))
    slopes = dispersion_slopes(ds, threshold)
    rows.append(_verdict_row("trend over p", one_sample(slopes) if slopes else None, len(slopes), trend=True))
    return pd.DataFrame(rows, columns=list(VERDICT_COLUMNS))


def dispersion_slopes(ds: xr.Dataset, threshold: float = 0.999) -> list[float]:
    """Per simulation (seed), the least-squares slope of the fraction of clustered pairs at T against the power p
    over its finished solves (a seed with fewer than two is left out): one number per simulation, the unit of
    F3's test."""
    final = _final_fraction(ds, threshold).transpose("growth", "seed")
    powers = np.asarray(final["growth"].values, dtype=float)
    out = []
    for values in final.values.T:
        ok = np.isfinite(values)
        if len(set(powers[ok])) >= 2:
            x, y = powers[ok] - powers[ok].mean(), values[ok]
            out.append(float(x @ (y - y.mean()) / (x @ x)))
    return out


def dispersion_test(ds: xr.Dataset, threshold: float = 0.999) -> Comparison:
    """F3's primary test (``claims.CLAIMS["f3_dispersion"]``): the one-sample t-test of ``dispersion_slopes`` against
    0 (the exact sign-flip test where every simulation has the same slope)."""
    slopes = dispersion_slopes(ds, threshold)
    if not slopes:
        raise ValueError("no simulation finished two growth laws: nothing to take a slope of")
    return one_sample(slopes)


def verdicts(ds: xr.Dataset, threshold: float = 0.999) -> dict:
    """The verdict on F3's claim (``claims.Verdict``) from ``dispersion_test`` of the paper's weights, solved
    accurately (``ds``)."""
    from . import claims

    return {"f3_dispersion": claims.judge("f3_dispersion", dispersion_test(ds, threshold), unit="simulation")}


def paired_verdicts(a: xr.Dataset, b: xr.Dataset, threshold: float = 0.999) -> pd.DataFrame:
    """For each growth law, the fraction of clustered pairs at T of ``a`` against ``b``: the same systems (same
    seeds, so paired t-tests) solved two ways, e.g. with the paper's Euler steps against the accurate solve. Returns a
    DataFrame with ``VERDICT_COLUMNS`` (``mean a``: a's fraction)."""
    fa, fb = _final_fraction(a, threshold), _final_fraction(b, threshold)
    if list(fa["seed"].values) != list(fb["seed"].values) or list(fa["growth"].values) != list(fb["growth"].values):
        raise ValueError("paired_verdicts needs the same seeds and growth laws on both sides")
    rows = []
    for p in fa["growth"].values:
        va, vb = fa.sel(growth=p).values, fb.sel(growth=p).values
        ok = np.isfinite(va) & np.isfinite(vb)
        judged = compare(va[ok], vb[ok], paired=True) if ok.any() else None
        rows.append(_verdict_row(f"g = {growth_label(float(p))}", judged, int(ok.sum())))
    return pd.DataFrame(rows, columns=list(VERDICT_COLUMNS))


def model_final(datasets, at: float, metric: str = "fraction", threshold: float = 0.999) -> np.ndarray:
    """``metric`` of ``clustering_metrics`` at the saved time nearest ``at``, mean over heads, of each
    ``simulate_model`` Dataset in ``datasets`` (one per trained seed): [runs]."""
    out = []
    for ds in datasets:
        m = clustering_metrics(ds.sel(time=[at], method="nearest"), threshold)[metric]
        out.append(float(m.mean()))
    return np.asarray(out)


def model_verdicts(ours, reference, at: float = 1.0, threshold: float = 0.999) -> pd.DataFrame:
    """DiffEqFormer's heads against a reference model's (the weight-shared one) at the saved time nearest ``at``: the
    fraction of clustered pairs and the mean pairwise distance, each the mean over heads of one trained seed
    (``model_final``), compared over the trained seeds by ``seeds.compare``: paired where both have the same number of
    seeds (seed k of both shares its data order: ``workflow.presets.seeded``), else Welch. Returns a DataFrame with
    ``VERDICT_COLUMNS`` (``mean a``: ``ours``)."""
    ours, reference = list(ours), list(reference)
    paired = len(ours) == len(reference)
    rows = []
    for metric in ("fraction", "distance"):
        a, b = model_final(ours, at, metric, threshold), model_final(reference, at, metric, threshold)
        rows.append(_verdict_row(f"{metric} at t = {at:g}", compare(a, b, paired=paired), min(len(a), len(b))))
    return pd.DataFrame(rows, columns=list(VERDICT_COLUMNS))


def verdict_texts(table: pd.DataFrame, digits: int = 2) -> dict[str, str]:
    """Each row of a ``growth_verdicts`` / ``paired_verdicts`` table as one line for the prose, keyed by a slug of its
    comparison (``g1_vs_t2``, ``trend``, ``g_t2``, ``fraction_at_t_1``): ``+0.65 [-0.09, +1.38], p = 0.063, paired
    t-test: inconclusive`` (for the trend: the slope per unit p), or ``untested: 1 seed``."""
    out = {}
    for _, row in table.iterrows():
        slug = (row["comparison"].replace("trend over p", "trend").replace("g = 1 vs g = ", "g1_vs_")
                .replace("g = ", "g_").replace("^", ""))
        slug = re.sub(r"_+", "_", re.sub(r"[^a-z0-9]", "_", slug.lower())).strip("_")
        if row["verdict"].startswith("untested"):
            out[slug] = row["verdict"]
            continue
        p = f"p = {row['p']:.2g}" if row["p"] >= 1e-3 else "p < 0.001"
        interval = "" if math.isnan(row["low"]) else f" [{row['low']:+.{digits}f}, {row['high']:+.{digits}f}]"
        out[slug] = f"{row['difference']:+.{digits}f}{interval}, {p}, {row['test']}: {row['verdict']}"
    return out


def _key(power: float) -> str:
    return f"p{power:g}".replace(".", "_")


def _monotone(values) -> str:
    """'rises', 'falls' or 'is not monotone' for a sequence (ties allowed), 'is constant' when all are equal."""
    v = np.asarray(values, dtype=float)
    d = np.diff(v)
    if np.all(np.abs(d) < 1e-12):
        return "is constant"
    if np.all(d >= -1e-12):
        return "rises"
    if np.all(d <= 1e-12):
        return "falls"
    return "is not monotone"


def headline(
    polynomial: "dict[str, xr.Dataset]",
    driven: "dict[str, xr.Dataset] | None" = None,
    threshold: float = 0.999,
    convergence: xr.Dataset | None = None,
) -> dict[str, str]:
    """The numbers (as text) the book's prose quotes about the trajectories, keyed for ``figures.glue``.

    ``polynomial``: ``{name: simulate(...)}`` (e.g. the accurate solve and the paper's Euler steps); ``driven``:
    ``{name: simulate_model(...)}`` or ``{name: [simulate_model(...) per trained seed]}``. Final-time values of
    ``clustering_metrics``, means over seeds (or heads and trained seeds):
    ``fraction_<name>_p<p>`` and ``clusters_<name>_p<p>`` per growth power p (``p2``, ``p0_5``),
    ``fraction_trend_<name>`` (how the clustered fraction changes as p grows: rises / falls / is not monotone),
    ``seeds_<name>``, ``failed_<name>`` (solves that did not finish); ``model_fraction_<name>``,
    ``model_clusters_<name>``, ``model_distance_<name>`` (mean pairwise distance) at the end,
    ``model_fraction_at1_<name>`` at the saved time nearest t = 1 (the end of the range the models were trained on),
    ``model_heads_<name>``, ``model_runs_<name>`` (trained seeds), ``model_horizon``; ``num_tokens``, ``horizon``;
    with ``convergence`` (``step_convergence``): ``sweep_max`` (its most Euler steps) and ``sweep_fraction_p<p>``
    (the mean fraction at T with that many).
    """
    out = {}
    for name, ds in polynomial.items():
        table = final_metrics(clustering_metrics(ds, threshold))
        for p, (_, row) in zip(ds["growth"].values, table.iterrows()):
            out[f"fraction_{name}_{_key(float(p))}"] = f"{row['fraction_mean']:.2f}"
            out[f"clusters_{name}_{_key(float(p))}"] = f"{row['clusters_mean']:.1f}"
        out[f"fraction_trend_{name}"] = _monotone(table["fraction_mean"].to_numpy())
        out[f"seeds_{name}"] = f"{ds.sizes['seed']}"
        out[f"failed_{name}"] = f"{int((~ds['success'].astype(bool)).sum())}"
        out["num_tokens"] = f"{ds.sizes['token']}"
        out["horizon"] = f"{float(ds['time'].values[-1]):g}"
    for name, runs in (driven or {}).items():
        runs = list(runs) if isinstance(runs, (list, tuple)) else [runs]
        finals = [clustering_metrics(ds.isel(time=[-1]), threshold).isel(time=0) for ds in runs]
        for metric, digits in (("fraction", 2), ("clusters", 1), ("distance", 2)):
            value = np.mean([float(f[metric].mean()) for f in finals])
            out[f"model_{metric}_{name}"] = f"{value:.{digits}f}"
        out[f"model_fraction_at1_{name}"] = f"{float(np.mean(model_final(runs, 1.0, 'fraction', threshold))):.2f}"
        out[f"model_heads_{name}"] = f"{runs[0].sizes['head']}"
        out[f"model_runs_{name}"] = f"{len(runs)}"
        out["model_horizon"] = f"{float(runs[0]['time'].values[-1]):g}"
    if convergence is not None:
        last = convergence.isel(steps=-1)
        out["sweep_max"] = f"{int(last['steps']):,}"
        for p in convergence["growth"].values:
            out[f"sweep_fraction_{_key(float(p))}"] = f"{float(last['fraction'].sel(growth=p).mean()):.2f}"
    return out


# ----------------------------------------------------------------------------------------------------------------------
# Figures (cheap: no solve)
# ----------------------------------------------------------------------------------------------------------------------

def _panel_dim(ds: xr.Dataset) -> str | None:
    return next((d for d in ("growth", "head") if d in ds.dims), None)


def _panel_title(ds: xr.Dataset, dim: str | None, i: int) -> str:
    if dim == "growth":
        p = float(ds["growth"].values[i])
        tex = "1" if p == 0 else ("t" if p == 1 else f"t^{{{p:g}}}")
        return f"$g(t) = {tex}$"
    if dim == "head":
        return f"head {int(ds['head'].values[i])}"
    return ""


WEIGHT_LABELS = {
    "identity": "$Q = K = V = I$ (must cluster at $g = 1$)",
    "gaussian": "Gaussian $Q(0), K(0), V(0)$ (the paper's)",
    "gaussian_qk": "Gaussian $Q(0), K(0)$, $V = I$",
    "redrawn": "Gaussian, redrawn on {redraws} intervals (time-varying control)",
}
"""How figures name each kind of weights (``TrajectoryConfig.weights``)."""


def control_label(attrs: dict) -> str:
    """The weights of a ``simulate`` Dataset, as its figures name them."""
    return WEIGHT_LABELS[attrs["weights"]].format(redraws=attrs.get("redraws", "?"))


def geometry_label(attrs: dict) -> str:
    """Geometry and start of a ``simulate`` Dataset: 'on the sphere (Geshkovski et al.), start uniform on $S^2$'."""
    d = attrs.get("dim")
    d = int(d) if d is not None else None  # netCDF gives numpy integers back
    start = "in $[-1, 1]^{%s}$" % (d or "d") if attrs.get("start") == "cube" else "on $S^{%s}$" % (
        d - 1 if d else "d-1")
    where = "on the sphere (Geshkovski et al.)" if attrs.get("geometry") == "sphere" else "free space (the paper)"
    return f"{where}, start uniform {start}"


def _describe(attrs: dict, setting: bool = True) -> str:
    """One line with every parameter a reader needs to read the figure (``setting``: with geometry and weights)."""
    solver = attrs.get("solver_solver", "?")
    mode = "adaptive" if attrs.get("solver_adaptive", 1) else f"{attrs.get('solver_num_steps', '?')} steps"
    if solver != "euler" and attrs.get("solver_adaptive", 1):
        mode += f", rtol {attrs.get('solver_rtol', '?'):g}"
    beta = float(attrs.get("beta_used", attrs.get("beta", float("nan"))))
    parts = [
        f"$n = {attrs.get('num_tokens', '?')}$",
        f"$d = {attrs.get('dim', '?')}$",
        f"$T = {float(attrs.get('horizon', float('nan'))):g}$",
        rf"$\beta = {beta:g}$",
    ]
    if attrs.get("kind") == "polynomial":
        if setting:
            parts += [geometry_label(attrs), control_label(attrs)]
    else:
        parts.append("on the sphere" if attrs.get("geometry") == "sphere" else "in free space")
        parts.append(f"DiffEqFormer heads ($D = {attrs.get('model_hidden_dim')}$)")
    return ", ".join(parts) + f"; {solver} ({mode})"


def plot_trajectories(
    ds: xr.Dataset,
    *,
    seed: int | None = None,
    directions: bool | None = None,
    max_tokens: int | None = None,
    threshold: float = 0.999,
    max_jump: float = 0.1,
) -> "Figure":
    """A row of 3-D panels, one per growth law (or head): the trajectory of every token coloured by token, start points
    as open circles, end points filled; on the sphere the unit sphere is drawn as a faint wireframe.

    ``seed``: which seed to draw (default: the first). ``directions``: draw x/|x| (default: True in free space, where
    norms can grow by orders of magnitude, False on the sphere). Model-driven Datasets (``x_pca``) are drawn in their
    top-3 principal components, without a sphere. The panel title gives the final fraction of clustered pairs.

    Fast growth makes tokens move further between two saved times than a straight chord can show (a cluster rotating
    at g(t) |Im lambda(V)| ~ 10^4 rad per unit time): a segment longer than ``max_jump`` times the size of the picture
    (2 on the sphere) is left out rather than drawn as a chord through the sphere, and the figure says so.
    """
    import matplotlib.pyplot as plt

    dim = _panel_dim(ds)
    use_pca = "x_pca" in ds
    x = ds["x_pca"].rename(pc="dim") if use_pca else ds["x"]
    if "seed" in x.dims:
        x = x.sel(seed=seed) if seed is not None else x.isel(seed=0)
    if x.sizes["dim"] != 3:
        raise ValueError(f"3-D trajectories need dim = 3 (got {x.sizes['dim']}); use a model-driven Dataset's x_pca")
    geometry = ds.attrs.get("geometry", "sphere")
    if directions is None:
        directions = geometry == "free" and not use_pca
    if directions:
        x = x / np.sqrt((x**2).sum("dim", skipna=False))
    on_sphere = (geometry == "sphere" or directions) and not use_pca
    panels = x.sizes[dim] if dim else 1
    x_full = ds["x"].sel(seed=x["seed"]) if "seed" in ds["x"].dims else ds["x"]
    final = clustering_metrics(x_full.isel(time=[-1]), threshold)["fraction"].isel(time=0)

    cmap = plt.get_cmap("turbo")
    fig = plt.figure(figsize=(3.3 * max(panels, 2), 4.1))
    gaps = 0
    for i in range(panels):
        ax = fig.add_subplot(1, panels, i + 1, projection="3d")
        arr = (x.isel({dim: i}) if dim else x).transpose("time", "token", "dim").values
        n = arr.shape[1] if max_tokens is None else min(max_tokens, arr.shape[1])
        colours = [cmap(0.05 + 0.9 * j / max(n - 1, 1)) for j in range(n)]
        if on_sphere:
            u, v = np.meshgrid(np.linspace(0, 2 * np.pi, 25), np.linspace(0, np.pi, 13))
            ax.plot_wireframe(
                np.cos(u) * np.sin(v), np.sin(u) * np.sin(v), np.cos(v), color="0.55", alpha=0.2, linewidth=0.4
            )
        size = 2.0 if on_sphere else float(np.nanmax(np.nanmax(arr, axis=(0, 1)) - np.nanmin(arr, axis=(0, 1))))
        for j in range(n):
            path, jumps = _break_long_segments(arr[:, j], max_jump * size)
            gaps += jumps
            ax.plot(path[:, 0], path[:, 1], path[:, 2], color=colours[j], linewidth=0.8, alpha=0.8)
        ax.scatter(*arr[0, :n].T, s=12, facecolors="none", edgecolors=colours, linewidths=0.8, depthshade=False)
        end = arr[-1, :n]
        ok = np.all(np.isfinite(end), axis=-1)
        ax.scatter(*end[ok].T, s=28, c=[c for c, k in zip(colours, ok) if k], edgecolors="k", linewidths=0.6,
                   depthshade=False)
        ax.view_init(elev=22, azim=35)
        if on_sphere:
            lim = 1.0
            ax.set(xlim=(-lim, lim), ylim=(-lim, lim), zlim=(-lim, lim))
            ax.set_box_aspect((1, 1, 1), zoom=1.25)
            ax.set_axis_off()
        else:
            ax.set_box_aspect((1, 1, 1), zoom=0.9)
            explained = ds["pca_explained"].isel({dim: i}).values if use_pca and dim else None
            for k, setter in enumerate((ax.set_xlabel, ax.set_ylabel, ax.set_zlabel)):
                name = f"PC{k + 1}" if use_pca else f"$x_{k + 1}$"
                if explained is not None:
                    name += f" ({100 * explained[k]:.0f}%)"
                setter(name, fontsize=8, labelpad=-4)
            ax.tick_params(labelsize=6, pad=0)
        frac = float(final.isel({dim: i}) if dim else final)
        ax.set_title(f"{_panel_title(ds, dim, i)}\nclustered pairs at $T$: {frac:.2f}", fontsize=10, pad=0)
    seed_text = f", seed {int(x['seed'])}" if "seed" in ds.dims else ""
    what = "top-3 principal components" if use_pca else ("directions $x/|x|$" if directions else "positions")
    note = f"\n{gaps} steps between saved times longer than {max_jump:g} x the picture not drawn" if gaps else ""
    fig.suptitle(
        f"Attention-only token trajectories ({what}), start $\\circ$, end $\\bullet$, colour = token{seed_text}\n"
        + _describe(ds.attrs)
        + note,
        fontsize=9.5,
    )
    fig.subplots_adjust(left=0.01, right=0.99, bottom=0.02, top=0.76 if gaps else 0.8, wspace=0.02)
    return fig


def _break_long_segments(path: np.ndarray, max_length: float) -> tuple[np.ndarray, int]:
    """[T, 3] -> the same points with a NaN row inserted wherever consecutive points are further apart than
    max_length (matplotlib breaks a line at NaN), and the number of such gaps."""
    jump = np.linalg.norm(np.diff(path, axis=0), axis=-1) > max_length
    if not jump.any():
        return path, 0
    where = np.nonzero(jump)[0] + 1
    return np.insert(path, where, np.nan, axis=0), int(jump.sum())


def plot_metrics(metrics: xr.Dataset) -> "Figure":
    """Fraction of clustered pairs, number of clusters and mean pairwise distance against t: one line per growth law
    (or head), the mean over seeds with a min-max band. Pass ``clustering_metrics(ds)`` (or the trajectories, whose
    metrics are then computed, a cheap reduction)."""
    import matplotlib.pyplot as plt

    if "x" in metrics:
        metrics = clustering_metrics(metrics)
    dim = _panel_dim(metrics)
    lines = metrics.sizes[dim] if dim else 1
    palette = plt.get_cmap("viridis")
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.9), constrained_layout=True)
    thr = metrics.attrs.get("threshold", 0.999)
    cos = r"\langle x_i, x_j\rangle" if metrics.attrs.get("geometry") == "sphere" else r"\cos(x_i, x_j)"
    labels = {
        "fraction": f"fraction of pairs with ${cos} > {thr:g}$",
        "clusters": f"clusters: rank of $1[{cos} > {thr:g}]$",
        "distance": r"mean pairwise distance $|\hat x_i - \hat x_j|$",
    }
    t = metrics["time"].values
    extrapolated = metrics.attrs.get("kind") == "model" and t[-1] > 1.0
    for ax, name in zip(axes, ("fraction", "clusters", "distance")):
        if extrapolated:
            ax.axvspan(1.0, t[-1], color="0.85", alpha=0.6, lw=0,
                       label="$t > 1$: $W(t)$ extrapolated (trained on $[0, 1]$)" if name == "fraction" else None)
        for i in range(lines):
            m = metrics[name].isel({dim: i}) if dim else metrics[name]
            colour = palette(0.9 * i / max(lines - 1, 1)) if lines > 1 else "C0"
            if "seed" in m.dims:
                if m.sizes["seed"] > 1:
                    ax.fill_between(t, m.min("seed").values, m.max("seed").values, color=colour, alpha=0.15, lw=0)
                m = m.mean("seed")
            ax.plot(t, m.values, color=colour, lw=1.8, label=_panel_title(metrics, dim, i) or None)
        ax.set_xlabel("$t$")
        ax.set_ylabel(labels[name])
        ax.set_xlim(t[0], t[-1])
        ax.grid(alpha=0.3)
    axes[0].set_ylim(-0.02, 1.02)
    axes[1].set_ylim(0, None)
    axes[2].set_ylim(0, 1.08 * max(float(metrics["distance"].max()), 0.1))
    if dim or extrapolated:
        axes[0].legend(fontsize=9, frameon=False)
    seeds = f"; mean over {metrics.sizes['seed']} seeds, band: min to max" if "seed" in metrics.dims else ""
    fig.suptitle(f"Clustering against $t$: {_describe(metrics.attrs)}{seeds}", fontsize=10)
    return fig


def _growth_colour(i: int, n: int):
    import matplotlib.pyplot as plt

    return plt.get_cmap("viridis")(0.9 * i / max(n - 1, 1)) if n > 1 else "C0"


def plot_controls(solves: "dict[str, xr.Dataset]", threshold: float = 0.999) -> "Figure":
    """The fraction of clustered token pairs against t for every control: one panel per ``simulate`` Dataset in
    ``solves`` (rows: geometry and start, columns: weights, each panel labelled), one line per growth law, the mean over
    seeds with a min-max band; the legend gives the mean at T. All Datasets must share n, d, T, beta and the solver
    (the title states them)."""
    import matplotlib.pyplot as plt

    datasets = list(solves.values())
    rows = list(dict.fromkeys(geometry_label(ds.attrs) for ds in datasets))
    cols = list(dict.fromkeys(control_label(ds.attrs) for ds in datasets))
    shared = {_describe(ds.attrs, setting=False) for ds in datasets}
    if len(shared) > 1:
        raise ValueError(f"plot_controls needs one n, d, T, beta and solver for every panel, got {sorted(shared)}")
    fig, axes = plt.subplots(len(rows), len(cols), figsize=(4.4 * len(cols), 3.2 * len(rows) + 0.6), squeeze=False,
                             sharex=True, sharey=True, constrained_layout=True)
    for ax in axes.flat:
        ax.set_visible(False)
    for ds in datasets:
        ax = axes[rows.index(geometry_label(ds.attrs)), cols.index(control_label(ds.attrs))]
        ax.set_visible(True)
        fraction = clustering_metrics(ds, threshold)["fraction"]
        t = fraction["time"].values
        G = fraction.sizes["growth"]
        for i in range(G):
            f = fraction.isel(growth=i)
            colour = _growth_colour(i, G)
            if f.sizes["seed"] > 1:
                ax.fill_between(t, f.min("seed").values, f.max("seed").values, color=colour, alpha=0.12, lw=0)
            mean = f.mean("seed")
            failed = int((~ds["success"].isel(growth=i).astype(bool)).sum())
            note = f", {failed} failed" if failed else ""
            ax.plot(t, mean.values, color=colour, lw=1.6,
                    label=f"{_panel_title(ds, 'growth', i)}: {float(mean.values[-1]):.2f}{note}")
        ax.set_title(f"{control_label(ds.attrs)}\n{geometry_label(ds.attrs)}", fontsize=8.5)
        ax.set_ylim(-0.02, 1.02)
        ax.set_xlim(t[0], t[-1])
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, frameon=False, title="$g(t)$: mean at $T$", title_fontsize=7, loc="upper left")
    for ax in axes[-1]:
        ax.set_xlabel("$t$")
    for ax in axes[:, 0]:
        ax.set_ylabel(f"fraction of pairs, $\\cos > {threshold:g}$")
    seeds = datasets[0].sizes["seed"]
    fig.suptitle(f"Clustered token pairs against $t$ for each control: {shared.pop()}; mean over {seeds} seeds "
                 "(band: min to max)", fontsize=10)
    return fig


def plot_step_convergence(convergence: xr.Dataset, reference: xr.Dataset, threshold: float = 0.999) -> "Figure":
    """Left: the fraction of clustered pairs at T against the number of explicit Euler steps (``step_convergence``),
    one line per growth law (mean over seeds, min-max bars), the accurate solve ``reference`` (``simulate`` of the same
    systems) as a dashed line of the same colour. Right: per seed, |fraction with N steps - fraction of the accurate
    solve|, mean over seeds: whether each system's Euler solve converges to its own accurate solve."""
    import matplotlib.pyplot as plt

    ref = _final_fraction(reference, threshold)
    fraction = convergence["fraction"]
    if list(ref["seed"].values) != list(fraction["seed"].values):
        raise ValueError("the convergence study and its reference must have the same seeds")
    steps = fraction["steps"].values
    G = fraction.sizes["growth"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.2), constrained_layout=True)
    for i in range(G):
        colour = _growth_colour(i, G)
        label = _panel_title(convergence, "growth", i)
        f = fraction.isel(growth=i)
        mean = f.mean("seed").values
        left.errorbar(steps, mean, yerr=[mean - f.min("seed").values, f.max("seed").values - mean], color=colour,
                      marker="o", ms=4, lw=1.5, capsize=2, label=f"{label}, Euler")
        left.axhline(float(ref.isel(growth=i).mean()), color=colour, ls="--", lw=1.2)
        gap = np.abs(f - ref.isel(growth=i)).mean("seed").values
        right.plot(steps, gap, color=colour, marker="o", ms=4, lw=1.5, label=label)
    left.plot([], [], color="0.3", ls="--", label="accurate solve (dashed)")
    left.set_xscale("log")
    left.set_ylim(-0.02, 1.02)
    left.set_xlabel("explicit Euler steps on $[0, T]$")
    left.set_ylabel(f"fraction of pairs with $\\cos > {threshold:g}$ at $T$")
    left.legend(fontsize=7.5, frameon=False, ncol=2, loc="lower right")
    right.set_xscale("log")
    right.set_ylim(0, None)
    right.set_xlabel("explicit Euler steps on $[0, T]$")
    right.set_ylabel("mean over seeds of |Euler $-$ accurate| at $T$")
    right.legend(fontsize=8, frameon=False, title="$g(t)$", title_fontsize=8)
    for ax in (left, right):
        ax.axvline(200, color="0.5", lw=0.8, ls=":")
        ax.grid(alpha=0.3)
    left.text(200, 1.0, " the paper's 200", fontsize=7.5, color="0.4", va="top")
    fig.suptitle(f"Euler steps against the accurate solve ({_describe(reference.attrs)}): "
                 f"{convergence.sizes['seed']} seeds", fontsize=9.5)
    return fig


__all__ = [
    "GEOMETRIES",
    "ModelTrajectoryConfig",
    "SCORE_CAP",
    "SOLVERS",
    "STARTS",
    "SolverConfig",
    "SphereProjection",
    "TrajectoryConfig",
    "VERDICT_COLUMNS",
    "WEIGHTS",
    "WEIGHT_LABELS",
    "attention_velocity",
    "clustering_metrics",
    "config_from_attrs",
    "config_hash",
    "control_label",
    "cosine_gram",
    "final_metrics",
    "geometry_label",
    "growth_label",
    "growth_verdicts",
    "headline",
    "initial_weights",
    "model_attention_matrices",
    "model_final",
    "model_verdicts",
    "paired_verdicts",
    "plot_controls",
    "plot_metrics",
    "plot_step_convergence",
    "plot_trajectories",
    "simulate",
    "simulate_model",
    "step_convergence",
    "uniform_cube",
    "verdict_texts",
    "uniform_sphere",
    "weight_pieces",
]
