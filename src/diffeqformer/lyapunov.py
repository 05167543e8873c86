"""Lyapunov exponents: of any ODE (the QR / Benettin method), and token-level exponents of DiffEqFormer.

General spectrum (PAPER.md section 2, eq. 8). For y' = f(t, y) the tangent matrix Phi' = J(t, y) Phi, Phi(0) = I,
is re-orthonormalised after every step, Q R = Phi, Phi <- Q, and the exponents are the time averages of log|R_ii|
(Benettin et al. 1980; Wolf et al. 1985). Tangent directions are pushed through f by forward-mode JVPs.

Token level (Section 5.2, Appendix B). For an output position `out` and an input token `in`,

    dPhi/dt = J_{out,in}(t) Phi,    J_{out,in}(t) = d f_out / d x_in (t, X(t)),    Phi(0) = I  (D x D)

along the model's own trajectory X(t). With the Euler grid of the forward pass (step k: weights W(t_k),
t_k = (k+1)/L, state X_k entering the step) the tangent update is Phi_{k+1} = (I + h J_{out,in}(t_k, X_k)) Phi_k,
h = 1/L: the Jacobian of step k is taken at the state that step k itself sees (the authors' notebook paired W(t_k)
with the state one step later). For one output, D reverse-mode products (one per row of f_out) give J_{out,in}
for every input token at once; the direct method (the authors') builds the full (nD x nD) Jacobian per step.
"""

from __future__ import annotations

import html
import math
from typing import Callable, Sequence

import diffrax
import equinox as eqx
import haliax as hax
import jax
import jax.numpy as jnp
import numpy as np
import xarray as xr
from haliax import NamedArray
from levanter.layers.attention import AttentionMask
from levanter.utils.tree_utils import inference_mode

from .model import DiffEqFormerLMHeadModel, time_grid

# ---------------------------------------------------------------------------------------------------------------------
# General ODEs


def lyapunov_spectrum(
    vector_field: Callable,
    y0,
    t0: float,
    t1: float,
    dt: float,
    *,
    args=None,
    transient: float = 0.0,
    solver: diffrax.AbstractSolver | None = None,
) -> jnp.ndarray:
    """All Lyapunov exponents of y' = f(t, y, args) (Diffrax's vector-field convention), sorted decreasing.

    y0 may be any array (it is flattened: n = y0.size exponents). The state and the n tangent directions are
    advanced together by ``solver`` (default: Tsit5) with fixed step ``dt``; after each step the tangents are
    re-orthonormalised by QR. log|R_ii| is accumulated after ``transient`` time units and averaged over the rest.
    """
    if not t1 > t0:
        raise ValueError(f"t1 must exceed t0, got t0={t0}, t1={t1}")
    if dt <= 0:
        raise ValueError(f"dt must be positive, got {dt}")
    if not 0.0 <= transient < t1 - t0:
        raise ValueError(f"transient must be in [0, t1 - t0), got {transient}")
    solver = diffrax.Tsit5() if solver is None else solver
    shape = jnp.shape(y0)
    y0 = jnp.ravel(jnp.asarray(y0))
    n = y0.size
    steps = int(round((t1 - t0) / dt))
    skip = int(round(transient / dt))

    def flat_field(t, y):
        return jnp.ravel(vector_field(t, jnp.reshape(y, shape), args))

    def joint(t, state, _):
        y, Q = state
        dy, dQ = jax.vmap(lambda q: jax.jvp(lambda v: flat_field(t, v), (y,), (q,)), in_axes=1, out_axes=(None, 1))(Q)
        return dy, dQ

    term = diffrax.ODETerm(joint)

    @jax.jit
    def run(y0):
        state0 = (y0, jnp.eye(n, dtype=y0.dtype))
        solver_state = solver.init(term, t0, t0 + dt, state0, None)

        def step(carry, k):
            state, solver_state, (logs, comp) = carry
            ta = t0 + k.astype(y0.dtype) * dt
            # made_jump: the tangents were replaced by QR since the last step, so an FSAL solver (Tsit5) must not
            # reuse its stored derivative.
            state, _, _, solver_state, _ = solver.step(term, ta, ta + dt, state, None, solver_state, made_jump=True)
            y, Q = state
            Q, R = jnp.linalg.qr(Q)
            growth = jnp.log(jnp.abs(jnp.diagonal(R)))
            growth = jnp.where(k >= skip, growth, jnp.zeros_like(growth))
            # Kahan summation: tens of thousands of small float32 increments into a large total lose ~1e-3.
            y_c = growth - comp
            total = logs + y_c
            comp = (total - logs) - y_c
            return ((y, Q), solver_state, (total, comp)), None

        zeros = jnp.zeros(n, y0.dtype)
        (_, _, (logs, _)), _ = jax.lax.scan(step, (state0, solver_state, (zeros, zeros)), jnp.arange(steps))
        return logs / ((steps - skip) * dt)

    return jnp.sort(run(y0))[::-1]


def kaplan_yorke_dimension(exponents) -> jnp.ndarray:
    """D_KY = k + (lambda_1 + ... + lambda_k) / |lambda_{k+1}|, k the largest index whose partial sum is >= 0.

    Exponents along the last axis (any order; they are sorted). 0 if lambda_1 < 0; n if all partial sums are >= 0.
    """
    lam = -jnp.sort(-jnp.asarray(exponents), axis=-1)
    n = lam.shape[-1]
    partial = jnp.cumsum(lam, axis=-1)
    k = jnp.sum(partial >= 0, axis=-1)  # partial sums decrease once negative, so this counts the leading run
    idx = jnp.clip(k, 1, n) - 1
    next_idx = jnp.clip(k, 0, n - 1)
    s_k = jnp.take_along_axis(partial, idx[..., None], axis=-1)[..., 0]
    lam_next = jnp.take_along_axis(lam, next_idx[..., None], axis=-1)[..., 0]
    frac = s_k / jnp.abs(lam_next)
    return jnp.where(k == 0, 0.0, jnp.where(k >= n, float(n), k.astype(lam.dtype) + frac))


# ---------------------------------------------------------------------------------------------------------------------
# DiffEqFormer's trajectory and Jacobians


def _prepare(model: DiffEqFormerLMHeadModel, token_ids):
    model = inference_mode(model, True)
    ids = token_ids if isinstance(token_ids, NamedArray) else hax.named(jnp.asarray(token_ids, jnp.int32), "position")
    if ids.ndim != 1:
        raise ValueError(f"token_ids must be one sequence [position], got axes {ids.axes}")
    Pos = ids.resolve_axis("position")
    pos_ids = hax.arange(Pos, dtype=jnp.int32)
    x0 = model.embeddings.embed(ids, pos_ids).rearrange((Pos, model.Embed))
    blocks = model.weights_at(time_grid(model.config.Layers))  # every weight gets a leading "layers" axis
    return model, ids, x0, blocks, pos_ids


def _layer(blocks, k: int):
    def take(leaf):
        is_stacked = isinstance(leaf, NamedArray) and any(ax.name == "layers" for ax in leaf.axes)
        return leaf["layers", k] if is_stacked else leaf

    return jax.tree_util.tree_map(take, blocks, is_leaf=lambda x: isinstance(x, NamedArray))


def _field(block, axes, pos_ids):
    """f_k as a function of the raw [n, D] state."""
    mask = AttentionMask.causal()

    def f(x):
        return block(hax.named(x, axes), mask, pos_ids=pos_ids).rearrange(axes).array

    return f


def trajectory(model: DiffEqFormerLMHeadModel, token_ids) -> jnp.ndarray:
    """States X_0..X_L [L+1, n, D] of the forward pass (X_0 the embeddings; X_L before the final norm)."""
    model, ids, x0, blocks, pos_ids = _prepare(model, token_ids)
    return _states(blocks, x0.array, pos_ids, x0.axes, model.config.num_layers)


@eqx.filter_jit
def _states(blocks, x, pos_ids, axes, num_steps: int):
    h = 1.0 / num_steps
    xs = [x]
    for k in range(num_steps):
        xs.append(xs[-1] + h * _field(_layer(blocks, k), axes, pos_ids)(xs[-1]))
    return jnp.stack(xs)


def _rows_fast(f, x, out):
    """J_{out, in} for every in: [n_in, D_out, D_in], from D reverse-mode products of f_out."""
    _, vjp = jax.vjp(lambda v: f(v)[out], x)
    (rows,) = jax.vmap(vjp)(jnp.eye(x.shape[1], dtype=x.dtype))  # [D_out, n, D_in]
    return jnp.transpose(rows, (1, 0, 2))


def _rows_direct(f, x, out):
    """The same from the full Jacobian [n, D, n, D] (the authors' direct method)."""
    return jnp.transpose(jax.jacrev(f)(x)[out], (1, 0, 2))


def _qr_step(phi, rows, h):
    """Phi <- QR(I + h J) Phi per input token; returns the new Q and log|diag R|. phi, rows: [n, D, D]."""
    D = phi.shape[-1]
    m = jnp.broadcast_to(jnp.eye(D, dtype=phi.dtype), rows.shape) + h * rows
    q, r = jnp.linalg.qr(m @ phi)
    return q, jnp.log(jnp.abs(jnp.diagonal(r, axis1=-2, axis2=-1)))


@eqx.filter_jit
def _tangent_step(block, x, phis, outs, pos_ids, axes, h: float, rows_fn):
    """One Euler step of the state and of every (output, input) tangent matrix; compiled once per shape."""
    f = _field(block, axes, pos_ids)

    def one_out(out, phi):
        return _qr_step(phi, rows_fn(f, x, out), h)

    phis, logs = jax.vmap(one_out)(outs, phis)
    return x + h * f(x), phis, logs


def _exponents(model, token_ids, output_positions: Sequence[int], rows_fn) -> tuple[np.ndarray, int]:
    """Exponents [len(outs), n_in, D] (sorted decreasing) for several output positions."""
    model, ids, x0, blocks, pos_ids = _prepare(model, token_ids)
    n, D = x0.array.shape
    L = model.config.num_layers
    h = 1.0 / L
    outs = [o % n for o in output_positions]

    x = x0.array
    phis = jnp.broadcast_to(jnp.eye(D, dtype=x.dtype), (len(outs), n, D, D))
    total = jnp.zeros((len(outs), n, D), x.dtype)
    out_ids = jnp.asarray(outs, dtype=jnp.int32)
    for k in range(L):
        x, phis, logs = _tangent_step(_layer(blocks, k), x, phis, out_ids, pos_ids, x0.axes, h, rows_fn)
        total = total + logs
    exps = -jnp.sort(-total / (L * h), axis=-1)  # the horizon is t = 1
    return np.asarray(exps), n


def _dataset(exps: np.ndarray, outs: Sequence[int], n: int, tokens: Sequence[str] | None, model) -> xr.Dataset:
    causal = np.arange(n)[None, :] <= np.asarray(outs)[:, None]  # tokens after `out` cannot influence it
    exps = np.where(causal[..., None], exps, np.nan)
    ds = xr.Dataset(
        {
            "exponents": (("output", "token", "exponent"), exps),
            "max_exponent": (("output", "token"), exps[..., 0]),
            "sum_exponents": (("output", "token"), exps.sum(axis=-1)),
            "kaplan_yorke": (("output", "token"), np.where(causal, np.asarray(kaplan_yorke_dimension(
                np.nan_to_num(exps))), np.nan)),
        },
        coords={"output": list(outs), "token": np.arange(n), "exponent": np.arange(exps.shape[-1])},
        attrs={"model_config": repr(model.config), "steps": model.config.num_layers,
               "time_grid": "t_k = (k+1)/L, Jacobian at the state entering step k", "horizon": 1.0},
    )
    if tokens is not None:
        ds = ds.assign_coords(text=("token", list(tokens)))
    return ds


def token_lyapunov(
    model: DiffEqFormerLMHeadModel,
    token_ids,
    *,
    output_position: int = -1,
    tokens: Sequence[str] | None = None,
    direct: bool = False,
) -> xr.Dataset:
    """Lyapunov spectrum of every input token's influence on ``output_position``.

    Returns a Dataset over (token, exponent) with ``exponents`` (sorted decreasing), and the per-token scores
    ``max_exponent``, ``sum_exponents`` and ``kaplan_yorke`` (NaN for tokens after the output: causality).
    ``direct=True`` computes the same with the full Jacobian per step (the reference, for tests and benchmarks).
    """
    exps, n = _exponents(model, token_ids, [output_position], _rows_direct if direct else _rows_fast)
    return _dataset(exps, [output_position % n], n, tokens, model).isel(output=0)


def lyapunov_map(
    model: DiffEqFormerLMHeadModel, token_ids, *, tokens: Sequence[str] | None = None, outputs=None
) -> xr.Dataset:
    """The Lyapunov map: scores for every (output position, input token) pair, one vectorised pass per step."""
    n = len(token_ids) if not isinstance(token_ids, NamedArray) else token_ids.array.shape[0]
    outs = list(range(n)) if outputs is None else list(outputs)
    exps, n = _exponents(model, token_ids, outs, _rows_fast)
    return _dataset(exps, [o % n for o in outs], n, tokens, model)


# ---------------------------------------------------------------------------------------------------------------------
# Attribution methods to compare against


def attention_weights(model: DiffEqFormerLMHeadModel, token_ids) -> np.ndarray:
    """Attention probabilities [L, heads, query, key] of each Euler step, along the forward trajectory."""
    model, ids, x0, blocks, pos_ids = _prepare(model, token_ids)
    return np.asarray(_attention_probs(blocks, x0.array, pos_ids, x0.axes, model.config.num_layers))


@eqx.filter_jit
def _attention_probs(blocks, x, pos_ids, axes, num_steps: int):
    xs = _states(blocks, x, pos_ids, axes, num_steps)
    probs = []
    for k in range(num_steps):
        block = _layer(blocks, k)
        pos = pos_ids.astype(jnp.float32) if block.attn.rot_embs is not None else pos_ids
        q, kk, _ = block.attn._compute_qkv(block.attn_norm(hax.named(xs[k], axes)), key=None, pos_ids=pos)
        q = q.rearrange(("kv_head", "q_heads_per_group", "position", "head_size")).array[:, 0]
        kk = kk.rearrange(("kv_head", "position", "head_size")).array
        scores = jnp.einsum("hqd,hkd->hqk", q, kk) / math.sqrt(q.shape[-1])
        n = scores.shape[-1]
        scores = jnp.where(jnp.tril(jnp.ones((1, n, n), bool)), scores, -jnp.inf)
        probs.append(jax.nn.softmax(scores, axis=-1))
    return jnp.stack(probs)


def raw_attention_scores(model, token_ids, output_position: int = -1) -> np.ndarray:
    """Attention of ``output_position`` to each token, averaged over heads and steps: [n]."""
    att = attention_weights(model, token_ids)
    return att.mean(axis=(0, 1))[output_position]


def attention_rollout(model, token_ids, output_position: int = -1) -> np.ndarray:
    """Attention rollout (Abnar & Zuidema 2020) with the ODE's residual: step k maps x -> x + h A_k x, so
    the token-mixing matrix of a step is (I + h mean_heads A_k) / (1 + h) (rows sum to one); its product over steps."""
    att = attention_weights(model, token_ids).mean(axis=1)  # [L, n, n]
    L, n, _ = att.shape
    h = 1.0 / L
    roll = np.eye(n)
    for k in range(L):
        roll = ((np.eye(n) + h * att[k]) / (1 + h)) @ roll
    return roll[output_position]


def gradient_x_input(model: DiffEqFormerLMHeadModel, token_ids, output_position: int = -1) -> np.ndarray:
    """|sum_d (d logit_target / d e_in,d) * e_in,d| per token, target = the model's top next-token prediction."""
    model, ids, x0, blocks, pos_ids = _prepare(model, token_ids)
    out = jnp.asarray(output_position % x0.array.shape[0], jnp.int32)
    return np.asarray(_grad_x_input(model, blocks, x0.array, pos_ids, x0.axes, out))


@eqx.filter_jit
def _grad_x_input(model, blocks, x0, pos_ids, axes, out):
    def target_logits(x):
        final = model.ln_f(hax.named(_states(blocks, x, pos_ids, axes, model.config.num_layers)[-1], axes))
        return hax.dot(final, model.get_lm_head(), axis=model.Embed).rearrange(("position", "vocab")).array[out]

    target = jnp.argmax(target_logits(x0))
    grad = jax.grad(lambda x: target_logits(x)[target])(x0)
    return jnp.abs(jnp.sum(grad * x0, axis=-1))


# ---------------------------------------------------------------------------------------------------------------------
# Rendering


def tokens_html(tokens: Sequence[str], scores, *, output_position: int | None = None, cmap: str = "Reds") -> str:
    """Tokens as HTML spans, background coloured by score (NaN: uncoloured), the output position outlined."""
    import matplotlib

    scores = np.asarray(scores, dtype=float)
    finite = scores[np.isfinite(scores)]
    lo, hi = (finite.min(), finite.max()) if finite.size else (0.0, 1.0)
    colormap = matplotlib.colormaps[cmap]
    spans = []
    for i, (tok, s) in enumerate(zip(tokens, scores)):
        style = "padding:1px 2px;border-radius:3px;"
        if np.isfinite(s):
            rgba = colormap(0.85 * (s - lo) / (hi - lo) if hi > lo else 0.0)
            style += f"background:{matplotlib.colors.to_hex(rgba)};"
        if output_position is not None and i == output_position % len(tokens):
            style += "outline:2px solid #1f4e9c;"
        spans.append(f'<span title="{s:.3f}" style="{style}">{html.escape(tok)}</span>')
    return '<div style="font-family:monospace;line-height:1.9">' + "".join(spans) + "</div>"


def plot_lyapunov_map(ds: xr.Dataset, score: str = "max_exponent", ax=None):
    """Heat map of a ``lyapunov_map`` score: output position (rows) x input token (columns)."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6.5, 5.5))
    values = ds[score].transpose("output", "token").values
    im = ax.imshow(values, cmap="magma", aspect="auto", interpolation="nearest")
    ax.set_xlabel("input token")
    ax.set_ylabel("output position")
    ax.set_title(f"Token-level Lyapunov map ({score.replace('_', ' ')})")
    if "text" in ds.coords and ds.sizes["token"] <= 40:
        ax.set_xticks(range(ds.sizes["token"]), ds["text"].values, rotation=90, fontsize=7)
    ax.figure.colorbar(im, ax=ax, shrink=0.8)
    return ax.figure
