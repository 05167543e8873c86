"""Solving DiffEqFormer's ODE with Diffrax: any solver, any step-size controller.

Training uses the fixed-step Euler scan of ``DiffEqFormerLMHeadModel.activations`` (fastest, exact). This module
solves the same ODE dx/dt = f(t, x) with ``diffrax.diffeqsolve``, for evaluation with other solvers (Heun, midpoint,
adaptive Runge-Kutta with a PID controller) and for analyses that need the continuous trajectory.

The official Euler grid evaluates the weights of step k at t_k = (k+1) h, i.e. it is Diffrax's Euler method for the
shifted field f(t + h, x). ``time_offset`` applies that shift: ``time_offset=h`` reproduces the training path
exactly; ``time_offset=0`` (the default) solves the ODE itself, to which both converge as h -> 0.
"""

from __future__ import annotations

from typing import Callable

import diffrax
import haliax as hax
import jax
import jax.numpy as jnp
from haliax import NamedArray

from .transformer import DiffEqFormerLMHeadModel


def solve_hidden(model: DiffEqFormerLMHeadModel, x0: NamedArray, attn_mask=None, *,
                 solver: diffrax.AbstractSolver | None = None, dt0: float | None = None,
                 stepsize_controller: diffrax.AbstractStepSizeController | None = None, t0: float = 0.0,
                 t1: float = 1.0, time_offset: float = 0.0, adjoint: diffrax.AbstractAdjoint | None = None,
                 max_steps: int = 4096, pos_ids: NamedArray | None = None, saveat: diffrax.SaveAt | None = None,
                 time_map: Callable[[jax.Array], jax.Array] | None = None, supply_first_stage: bool = False,
                 throw: bool = True) -> tuple[NamedArray, diffrax.Solution]:
    """Solve dx/dt = f(t + time_offset, x) from x(t0) = x0 to t1; x0 is [..., Pos, Embed].

    Defaults: Euler with the model's own step 1/L, and Diffrax's recursive-checkpoint adjoint (online
    checkpointing, as the paper trains). Returns x(t1) (without the final norm) and the Diffrax solution.

    ``time_map``: the weights' time for the solver's time t, in place of t + time_offset (``analysis.inference``
    snaps t to the training grid). ``supply_first_stage`` (FSAL solvers such as Tsit5): evaluate f(t0, x0) once, here,
    and hand it to Diffrax as the solver's state, so that retries of a rejected first step do not evaluate it again.
    ``throw``: Diffrax's; with False a solve that hits ``max_steps`` returns, and ``sol.result`` says so.
    """
    if time_map is not None and time_offset != 0.0:
        raise ValueError("give either time_map or time_offset, not both")
    solver = diffrax.Euler() if solver is None else solver
    controller = diffrax.ConstantStepSize() if stepsize_controller is None else stepsize_controller
    if dt0 is None and isinstance(controller, diffrax.ConstantStepSize):
        dt0 = (t1 - t0) / model.config.num_layers
    axes = x0.axes
    if pos_ids is None:
        pos_ids = hax.arange(x0.resolve_axis("position"), dtype=jnp.int32)

    def field(t, y, args):
        t = t + time_offset if time_map is None else time_map(t)
        tt = hax.named(jnp.asarray(t, dtype=y.dtype), ())
        return model.vector_field(tt, hax.named(y, axes), attn_mask, pos_ids=pos_ids).rearrange(axes).array

    term = diffrax.ODETerm(field)
    y0 = x0.array
    solver_state = made_jump = None
    if supply_first_stage:
        solver_state, made_jump = _first_stage_state(solver, term, field, t0, dt0, y0)
    sol = diffrax.diffeqsolve(term, solver, t0=t0, t1=t1, dt0=dt0, y0=y0, stepsize_controller=controller,
                              adjoint=diffrax.RecursiveCheckpointAdjoint() if adjoint is None else adjoint,
                              max_steps=max_steps, saveat=diffrax.SaveAt(t1=True) if saveat is None else saveat,
                              throw=throw, solver_state=solver_state, made_jump=made_jump)
    return hax.named(sol.ys[-1], axes), sol


def _first_stage_state(solver, term, field, t0, dt0, y0):
    """The state of an FSAL Runge-Kutta solver at t0 with its first stage f(t0, y0) evaluated: (state, made_jump).

    Diffrax has no public API that builds an FSAL state from a given first stage: its layout (first-step flag, f0) is
    checked against ``solver.init`` here, and made_jump=False keeps Diffrax from recomputing f0."""
    state = solver.init(term, t0, t0 + dt0, y0, None)
    if not (isinstance(state, tuple) and len(state) == 2):
        raise ValueError(f"supply_first_stage needs an FSAL Runge-Kutta solver, got {type(solver).__name__}")
    first_step, f0 = state
    assert jnp.shape(first_step) == () and jax.tree_util.tree_structure(f0) == jax.tree_util.tree_structure(y0)
    return (jnp.array(False), field(jnp.asarray(t0, y0.dtype), y0, None)), False


def solve_logits(model: DiffEqFormerLMHeadModel, input_ids: NamedArray, attn_mask=None, **solve_kwargs):
    """Logits [..., Pos, Vocab] of the model with the ODE solved by Diffrax (see ``solve_hidden``)."""
    pos_ids = hax.arange(input_ids.resolve_axis("position"), dtype=jnp.int32)
    x0 = model.embeddings.embed(input_ids, pos_ids)
    x1, _ = solve_hidden(model, x0, attn_mask, pos_ids=pos_ids, **solve_kwargs)
    return hax.dot(model.ln_f(x1), model.get_lm_head(), axis=model.Embed)
