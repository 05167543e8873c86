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
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Callable, NamedTuple, Sequence

import diffrax
import equinox as eqx
import haliax as hax
import jax
import jax.numpy as jnp
import numpy as np
import xarray as xr
from haliax import NamedArray
from levanter.layers.attention import AttentionMask, dot_product_attention
from levanter.utils.tree_utils import inference_mode

from ..model.transformer import DiffEqFormerLMHeadModel, time_grid
from ..numerics import one_blas_thread

if TYPE_CHECKING:
    import pandas as pd

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

    with one_blas_thread():  # the per-step QR runs through LAPACK: see _exponents
        exps = jax.block_until_ready(run(y0))
    return jnp.sort(exps)[::-1]


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
    x0, blocks, pos_ids = _embed_and_materialize(model, ids)
    return model, ids, x0, blocks, pos_ids


@eqx.filter_jit
def _embed_and_materialize(model, ids):
    # Compiled: run op by op, the hypernetworks of every weight cost seconds per call on a CPU.
    Pos = ids.resolve_axis("position")
    pos_ids = hax.arange(Pos, dtype=jnp.int32)
    x0 = model.embeddings.embed(ids, pos_ids).rearrange((Pos, model.Embed))
    blocks = model.weights_at(time_grid(model.config.Layers))  # every weight gets a leading "layers" axis
    return x0, blocks, pos_ids


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


def _row_field(block, axes, pos_ids, out):
    """f_out: the row ``out`` of the field f_k, as a function of the raw [n, D] state: [D].

    The same as ``_field(block, axes, pos_ids)(x)[out]``, computed for that row alone: the query, the attention and
    the MLP of token ``out``, the keys and values of every token (the attention of ``Attention.__call__`` for one
    query, from its public parts). The rows' reverse-mode products (``_rows_fast``, D of them per output and step)
    then differentiate through one token's MLP instead of all n tokens', which makes them cheaper (measurements page;
    ``tests/test_lyapunov.py`` checks the row against the full field)."""
    attn = block.attn
    config = attn.config
    if config.sliding_window is not None:
        raise NotImplementedError("the token-level Lyapunov rows assume full causal attention (no sliding window)")
    if pos_ids is not None and attn.rot_embs is not None:
        pos_ids = pos_ids.astype(jnp.float32)  # as ParallelBlock hands them to RoPE

    def f(x):
        X = hax.named(x, axes)
        Pos = X.resolve_axis("position")
        one = hax.dslice(out, 1)
        xa = block.attn_norm(X)
        positions = pos_ids if pos_ids is not None else hax.arange(Pos, dtype=jnp.float32)
        q, k, v = _queries_keys_values(attn, xa["position", one], xa, positions["position", one], positions)
        causal = hax.arange(Pos.alias("key_position")) <= out  # the keys the query at `out` sees
        a = dot_product_attention(
            "position", "key_position", "head_size", q, k, v, causal,
            attention_dtype=jnp.float32 if config.upcast_attn else x.dtype, attn_backend=config.attn_backend,
            flash_block_size=config.flash_attention_block_size, scaling_factor=config.scaling_factor,
            logits_soft_cap=config.logits_soft_cap, inference=True, prng=None,
        )
        a = attn.o_proj(a.flatten_axes(("kv_head", "q_heads_per_group"), "heads").astype(x.dtype))
        m = block.mlp(block.mlp_norm(X["position", one]))
        return (a + m)["position", 0].rearrange((axes[1],)).array

    return f


def _rows_fast(block, x, out, pos_ids, axes):
    """J_{out, in} for every in: [n_in, D_out, D_in], from D reverse-mode products of f_out alone."""
    _, vjp = jax.vjp(_row_field(block, axes, pos_ids, out), x)
    (rows,) = jax.vmap(vjp)(jnp.eye(x.shape[1], dtype=x.dtype))  # [D_out, n, D_in]
    return jnp.transpose(rows, (1, 0, 2))


def _rows_direct(block, x, out, pos_ids, axes):
    """The same from the full Jacobian [n, D, n, D] of the whole field (the authors' direct method)."""
    return jnp.transpose(jax.jacrev(_field(block, axes, pos_ids))(x)[out], (1, 0, 2))


def _qr_step(phi, rows, h):
    """Phi <- QR(I + h J) Phi per input token; returns the new Q and log|diag R|. phi, rows: [n, D, D]."""
    D = phi.shape[-1]
    m = jnp.broadcast_to(jnp.eye(D, dtype=phi.dtype), rows.shape) + h * rows
    q, r = jnp.linalg.qr(m @ phi)
    return q, jnp.log(jnp.abs(jnp.diagonal(r, axis1=-2, axis2=-1)))


@eqx.filter_jit
def _tangent_step(blocks, k, x, phis, outs, pos_ids, axes, h: float, rows_fn):
    """Euler step ``k`` (a traced index into the stacked weights ``blocks``) of the state and of every (output, input)
    tangent matrix; compiled once per shape. (Taking step k's weights out of the stack outside the compiled step,
    op by op, costs more than the step itself: measurements page.)"""
    block = _layer(blocks, k)

    def one_out(out, phi):
        return _qr_step(phi, rows_fn(block, x, out, pos_ids, axes), h)

    phis, logs = jax.vmap(one_out)(outs, phis)
    return x + h * _field(block, axes, pos_ids)(x), phis, logs


def _exponents(model, token_ids, output_positions: Sequence[int], rows_fn, prepared=None) -> tuple[np.ndarray, int]:
    """Exponents [len(outs), n_in, D] (sorted decreasing) for several output positions."""
    model, ids, x0, blocks, pos_ids = prepared if prepared is not None else _prepare(model, token_ids)
    n, D = x0.array.shape
    L = model.config.num_layers
    h = 1.0 / L
    outs = [o % n for o in output_positions]

    x = x0.array
    phis = jnp.broadcast_to(jnp.eye(D, dtype=x.dtype), (len(outs), n, D, D))
    total = jnp.zeros((len(outs), n, D), x.dtype)
    out_ids = jnp.asarray(outs, dtype=jnp.int32)
    # XLA runs the batched QR on the CPU through LAPACK (OpenBLAS). On a busy machine OpenBLAS's worker threads make
    # the step far slower than one thread does (measurements page): see numerics.one_blas_thread. The result is read
    # (np.asarray) inside the block, so every step runs under it.
    with one_blas_thread():
        for k in range(L):
            x, phis, logs = _tangent_step(blocks, jnp.asarray(k, jnp.int32), x, phis, out_ids, pos_ids, x0.axes, h,
                                          rows_fn)
            total = total + logs
        exps = np.asarray(-jnp.sort(-total / (L * h), axis=-1))  # the horizon is t = 1
    return exps, n


def _dataset(exps: np.ndarray, outs: Sequence[int], n: int, tokens: Sequence[str] | None, model) -> xr.Dataset:
    causal = np.arange(n)[None, :] <= np.asarray(outs)[:, None]  # tokens after `out` cannot influence it
    exps = np.where(causal[..., None], exps, np.nan)
    # D_KY has a limit when exponents are -inf (a direction collapsed: lambda_{k+1} = -inf adds nothing), none when
    # one is NaN or +inf; np.nan_to_num would make those finite (NaN -> 0, +-inf -> +-max float) and D_KY a number.
    defined = causal & ~np.any(np.isnan(exps) | np.isposinf(exps), axis=-1)
    kaplan_yorke = np.asarray(kaplan_yorke_dimension(np.where(defined[..., None], exps, 0.0)))
    ds = xr.Dataset(
        {
            "exponents": (("output", "token", "exponent"), exps),
            "max_exponent": (("output", "token"), exps[..., 0]),
            "sum_exponents": (("output", "token"), exps.sum(axis=-1)),
            "kaplan_yorke": (("output", "token"), np.where(defined, kaplan_yorke, np.nan)),
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
    ``max_exponent``, ``sum_exponents`` and ``kaplan_yorke`` (NaN for tokens after the output: causality). An exponent
    is -inf where a step's tangent map I + h J_{out,in} is singular, NaN where the trajectory is not finite; the
    scores follow (the sum is -inf if any exponent is; ``kaplan_yorke`` is NaN if any is NaN or +inf).
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


VALUE_KINDS = ("finite", "-inf", "+inf", "nan")
"""The kinds of value an exponent can take, as ``compare_exponents`` counts them."""


def _value_kind(x: np.ndarray) -> np.ndarray:
    """Index into ``VALUE_KINDS`` of every entry of ``x``."""
    return np.select([np.isfinite(x), np.isneginf(x), np.isposinf(x)], [0, 1, 2], default=3)


class ExponentAgreement(NamedTuple):
    """How two computations of the same exponents agree (``compare_exponents``)."""

    counts: dict[str, dict[str, int]]
    """Per computation (by name): how many of its values are of each kind in ``VALUE_KINDS``."""
    mismatched: int
    """Entries where the two differ in kind: one finite and the other not, or -inf against NaN, etc."""
    compared: int
    """Entries finite in both."""
    max_abs_difference: float | None
    """max |a - b| over the entries finite in both; None when there are none (nothing was compared)."""


def compare_exponents(a, b, *, names: tuple[str, str] = ("a", "b")) -> ExponentAgreement:
    """Compare two computations ``a``, ``b`` (same shape) of the same exponents where both are finite.

    An exponent is -inf where a step's tangent map I + h J_{out,in} is singular (log|R_ii| = log 0), NaN where the
    state or the Jacobian is not finite, and NaN by construction for tokens after the output position (leave those out
    before comparing: they are not computed). |a - b| is NaN wherever either is (-inf - -inf = NaN), so a maximum
    over all entries is NaN, and ``np.nanmax`` silently skips exactly the entries where the two may disagree. Here the
    kinds of value are compared entry by entry (``mismatched``), and the difference is taken over the entries finite
    in both only.
    """
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.shape != b.shape:
        raise ValueError(f"the two computations have different shapes: {a.shape} and {b.shape}")
    kind_a, kind_b = _value_kind(a), _value_kind(b)
    counts = {name: {kind: int(np.sum(k == i)) for i, kind in enumerate(VALUE_KINDS)}
              for name, k in zip(names, (kind_a, kind_b))}
    both = (kind_a == 0) & (kind_b == 0)
    difference = float(np.max(np.abs(a[both] - b[both]))) if both.any() else None
    return ExponentAgreement(counts, int(np.sum(kind_a != kind_b)), int(both.sum()), difference)


# ---------------------------------------------------------------------------------------------------------------------
# Attribution methods to compare against


def attention_weights(model: DiffEqFormerLMHeadModel, token_ids, *, _prepared=None) -> np.ndarray:
    """Attention probabilities [L, heads, query, key] of each Euler step, along the forward trajectory."""
    model, ids, x0, blocks, pos_ids = _prepared if _prepared is not None else _prepare(model, token_ids)
    return np.asarray(_attention_probs(blocks, x0.array, pos_ids, x0.axes, model.config.num_layers))


@eqx.filter_jit
def _attention_probs(blocks, x, pos_ids, axes, num_steps: int):
    xs = _states(blocks, x, pos_ids, axes, num_steps)
    probs = []
    for k in range(num_steps):
        block = _layer(blocks, k)
        pos = pos_ids.astype(jnp.float32) if block.attn.rot_embs is not None else pos_ids  # as ParallelBlock does
        p = attention_probabilities(block.attn, block.attn_norm(hax.named(xs[k], axes)), AttentionMask.causal(),
                                    pos_ids=pos)
        probs.append(p.rearrange(("heads", "position", "key_position")).array)
    return jnp.stack(probs)


def _queries_keys_values(attn, xq, xkv, q_pos, kv_pos):
    """The queries of xq and the keys and values of xkv of Levanter's ``Attention`` (as its ``__call__`` builds
    them), from the module's public parts: projections, QK norm, RoPE at positions q_pos and kv_pos. q is
    [..., kv_head, q_heads_per_group, position, head_size]; k and v are [..., kv_head, key_position, head_size]."""
    q = attn.q_proj(xq)
    k, v = attn.k_proj(xkv), attn.v_proj(xkv)
    if attn.config.qk_norm is not None:
        q, k = attn.q_norm(q), attn.k_norm(k)
    if attn.rot_embs is not None:
        q = attn.rot_embs(q, q_pos).astype(q.dtype)
        k = attn.rot_embs(k, kv_pos).astype(k.dtype)
    q = q.rearrange((..., "kv_head", "q_heads_per_group", "position", "head_size"))
    k = k.rearrange((..., "kv_head", "position", "head_size")).rename({"position": "key_position"})
    v = v.rearrange((..., "kv_head", "position", "head_size")).rename({"position": "key_position"})
    return q, k, v


def attention_probabilities(attn, x: NamedArray, mask: AttentionMask | NamedArray | None, *,
                            pos_ids: NamedArray | None = None) -> NamedArray:
    """Attention probabilities [..., heads, position, key_position] of Levanter's ``Attention`` module ``attn`` on
    x [..., position, embed] (already normed), softmax_j(s * q_i . k_j) over the keys j that ``mask`` allows.

    Levanter has no public function that returns them (``Attention.__call__`` returns only the output), so they are
    built as its vanilla backend builds them, from the module's public parts and every option of its config:
    projections, QK norm, RoPE, sliding window, scale s (``scaling_factor``, default 1/sqrt(head_size)), float32
    logits with ``upcast_attn``, ``logits_soft_cap``. ``o_proj`` of (probabilities . values) is the module's output
    (``tests/test_lyapunov.py`` checks it, for the gpt and llama variants)."""
    config = attn.config
    if pos_ids is None:
        pos_ids = hax.arange(x.resolve_axis("position"))  # Attention's own default
    q, k, _ = _queries_keys_values(attn, x, x, pos_ids, pos_ids)
    if config.sliding_window is not None and isinstance(mask, AttentionMask):
        mask = mask.with_sliding_window(config.sliding_window)
    if isinstance(mask, AttentionMask):
        mask = mask.materialize(q.resolve_axis("position"), k.resolve_axis("key_position"))
    scale = config.scaling_factor if config.scaling_factor is not None else 1.0 / math.sqrt(q.axis_size("head_size"))
    dtype = jnp.float32 if config.upcast_attn else x.dtype
    logits = hax.dot((q * scale).astype(dtype), k.astype(dtype), axis="head_size")
    if config.logits_soft_cap is not None:
        logits = hax.tanh(logits / config.logits_soft_cap) * config.logits_soft_cap
    if mask is not None:
        logits = hax.where(mask, logits, -1e9)
    probs = hax.nn.softmax(logits, axis="key_position").astype(q.dtype)
    return probs.flatten_axes(("kv_head", "q_heads_per_group"), "heads")


def raw_attention_scores(model, token_ids, output_position: int = -1) -> np.ndarray:
    """Attention of ``output_position`` to each token, averaged over heads and steps: [n]."""
    return _raw_attention(attention_weights(model, token_ids), output_position)


def _raw_attention(att: np.ndarray, output_position: int) -> np.ndarray:
    return att.mean(axis=(0, 1))[output_position]


def attention_rollout(model, token_ids, output_position: int = -1) -> np.ndarray:
    """Attention rollout (Abnar & Zuidema 2020) with the ODE's residual: step k maps x -> x + h A_k x, so
    the token-mixing matrix of a step is (I + h mean_heads A_k) / (1 + h) (rows sum to one); its product over steps."""
    return _rollout(attention_weights(model, token_ids), output_position)


def _rollout(att: np.ndarray, output_position: int) -> np.ndarray:
    att = att.mean(axis=1)  # [L, n, n]
    L, n, _ = att.shape
    h = 1.0 / L
    roll = np.eye(n)
    for k in range(L):
        roll = ((np.eye(n) + h * att[k]) / (1 + h)) @ roll
    return roll[output_position]


def gradient_x_input(model: DiffEqFormerLMHeadModel, token_ids, output_position: int = -1, *,
                     _prepared=None) -> np.ndarray:
    """|sum_d (d logit_target / d e_in,d) * e_in,d| per token, target = the model's top next-token prediction."""
    model, ids, x0, blocks, pos_ids = _prepared if _prepared is not None else _prepare(model, token_ids)
    out = jnp.asarray(output_position % x0.array.shape[0], jnp.int32)
    return np.asarray(_grad_x_input(model, blocks, x0.array, pos_ids, x0.axes, out)[0])


@eqx.filter_jit
def _grad_x_input(model, blocks, x0, pos_ids, axes, out):
    def target_logits(x):
        final = model.ln_f(hax.named(_states(blocks, x, pos_ids, axes, model.config.num_layers)[-1], axes))
        return hax.dot(final, model.get_lm_head(), axis=model.Embed).rearrange(("position", "vocab")).array[out]

    target = jnp.argmax(target_logits(x0))
    grad = jax.grad(lambda x: target_logits(x)[target])(x0)
    return jnp.abs(jnp.sum(grad * x0, axis=-1)), target


METHODS = ("lyapunov (max exponent)", "lyapunov (sum)", "raw attention", "attention rollout", "gradient x input")
"""The attribution methods of ``attribution_scores`` (and of ``attribution.attribution_benchmark``), in this order."""
METHOD_KEYS = dict(zip(METHODS, ("lyapunov_max", "lyapunov_sum", "attention", "rollout", "grad_x_input")))
"""A short identifier of each method (for file and glue names)."""


def attribution_scores(model: DiffEqFormerLMHeadModel, token_ids, output_position: int = -1, *,
                       tokens: Sequence[str] | None = None) -> "pd.DataFrame":
    """Every attribution method's score of each input token for the prediction at ``output_position``.

    One row per token (index ``token``), one column per name in ``METHODS``, plus ``text`` when ``tokens`` are
    given: the Lyapunov scores of ``token_lyapunov`` (largest exponent and sum of all exponents of the token's tangent
    dynamics), ``raw_attention_scores``, ``attention_rollout`` and ``gradient_x_input``. Tokens after the output
    position get NaN (a causal model cannot use them). The weights, the trajectory and the attention maps are computed
    once and shared by the methods. ``df.attrs``: ``output_position`` (non-negative) and ``predicted_token``, the
    model's top next-token prediction there (the logit that gradient x input differentiates).
    """
    import pandas as pd

    prepared = _prepare(model, token_ids)
    n = prepared[2].array.shape[0]
    out = output_position % n
    exps, _ = _exponents(model, token_ids, [out], _rows_fast, prepared=prepared)
    lyap = _dataset(exps, [out], n, tokens, prepared[0]).isel(output=0)
    att = attention_weights(model, token_ids, _prepared=prepared)
    after = np.arange(n) > out
    columns = {
        METHODS[0]: lyap.max_exponent.values,
        METHODS[1]: lyap.sum_exponents.values,
        METHODS[2]: _raw_attention(att, out),
        METHODS[3]: _rollout(att, out),
    }
    model_, _, x0, blocks, pos_ids = prepared
    gxi, predicted = _grad_x_input(model_, blocks, x0.array, pos_ids, x0.axes, jnp.asarray(out, jnp.int32))
    columns[METHODS[4]] = np.asarray(gxi)
    df = pd.DataFrame({k: np.where(after, np.nan, np.asarray(v, dtype=float)) for k, v in columns.items()},
                      index=pd.RangeIndex(n, name="token"))
    if tokens is not None:
        df.insert(0, "text", list(tokens))
    df.attrs["output_position"] = out
    df.attrs["predicted_token"] = int(predicted)
    return df


def timings(model: DiffEqFormerLMHeadModel, token_ids, *, repeats: int = 3) -> "pd.DataFrame":
    """Wall-clock seconds of ``token_lyapunov`` for the last position by the fast method (D reverse-mode rows per
    step) and the direct one (the full Jacobian per step, the authors' method): one row per method with the median
    and minimum of ``repeats`` runs after a first, compiling, call (``compile_s``: that call's time). ``attrs``:
    ``speedup`` (direct median / fast median), ``tokens``, and the two methods' agreement (``compare_exponents``):
    ``max_abs_difference`` over the ``finite_exponents`` exponents finite in both, ``nonfinite_exponents`` (the rest,
    of the same kind in both). Raises ValueError if the methods disagree on which exponents are finite, or if none is
    finite in both: then there is no agreement to report."""
    import time

    import pandas as pd

    if repeats < 1:
        raise ValueError(f"repeats must be positive, got {repeats}")
    rows, results = [], {}
    for name, direct in (("fast (reverse-mode rows)", False), ("direct (full Jacobian)", True)):
        start = time.perf_counter()
        results[name] = token_lyapunov(model, token_ids, direct=direct).exponents.values
        first = time.perf_counter() - start
        runs = []
        for _ in range(repeats):
            start = time.perf_counter()
            token_lyapunov(model, token_ids, direct=direct).exponents.values  # .values: wait for the result
            runs.append(time.perf_counter() - start)
        rows.append({"method": name, "median_s": float(np.median(runs)), "min_s": float(np.min(runs)),
                     "compile_s": first, "repeats": repeats})
    df = pd.DataFrame(rows).set_index("method")
    fast, direct = results.values()
    agreement = compare_exponents(fast, direct, names=tuple(results))
    if agreement.mismatched or agreement.compared == 0:
        raise ValueError(f"the fast and direct exponents cannot be compared: {agreement.mismatched} of {fast.size} "
                         f"differ in kind (finite, -inf, +inf, NaN), {agreement.compared} are finite in both; "
                         f"counts {agreement.counts}")
    df.attrs.update(speedup=float(df["median_s"].iloc[1] / df["median_s"].iloc[0]),
                    max_abs_difference=agreement.max_abs_difference, finite_exponents=agreement.compared,
                    nonfinite_exponents=int(fast.size - agreement.compared), tokens=int(fast.shape[0]))
    return df


class Example(NamedTuple):
    """A text prepared for the token-level analyses: token ids, one display label per token, the tokenizer."""

    ids: np.ndarray
    tokens: list[str]
    tokenizer: object


def corpus_example(text: str, *, vocab_size: int = 4096, domain: str = "all", split: str = "validation",
                   max_tokens: int | None = None, root=None) -> Example:
    """``text``, checked to occur verbatim in the Shakespeare corpus (``split`` of ``domain``; the validation split
    is held out from training), tokenised with the corpus's BPE of ``vocab_size`` tokens (``encode_text``).

    Needs the prepared corpus (``python -m diffeqformer.data prepare``, or any training run on it) below ``root``
    (default ``paths.DATA``)."""
    from ..data.corpora import CorpusLayout, load_tokenizer

    layout = CorpusLayout() if root is None else CorpusLayout(Path(root))
    path = layout.jsonl(domain, split)
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist: prepare the corpus (python -m diffeqformer.data prepare)")
    if not any(text in json.loads(line)["text"] for line in path.read_text().splitlines() if line):
        raise ValueError(f"the example does not occur in the {split} split of the {domain!r} corpus: {text[:60]!r}...")
    tokenizer = load_tokenizer(layout.tokenizer(vocab_size))
    ids, tokens = encode_text(tokenizer, text, max_tokens=max_tokens)
    return Example(ids, tokens, tokenizer)


def headline(scores: "pd.DataFrame", timing: "pd.DataFrame | None" = None, *, tokenizer=None,
             top: int = 3) -> dict[str, str]:
    """The numbers and tokens (as text) the book's prose quotes about one example, keyed for ``figures.glue``.

    ``scores``: ``attribution_scores`` (with ``text``); ``timing``: ``timings``. Keys: ``tokens`` (their number),
    ``output_token`` (the token at the output position), ``top_<key>`` for each method (``METHOD_KEYS``): its
    ``top`` highest-scoring earlier tokens, quoted, best first (the output position itself is left out, as in the
    attribution benchmark; only finite scores are ranked, so fewer than ``top`` when fewer are finite);
    ``nonfinite_example``, how many earlier tokens' scores are not finite, summed over the methods; with ``timing``:
    ``time_fast``, ``time_direct`` (median seconds), ``speedup``, ``max_difference`` (over the exponents finite in
    both methods), ``finite_exponents`` (their number) and ``nonfinite_exponents`` (the others, non-finite in both);
    with ``tokenizer``: ``predicted``, the model's top next token at the output position.
    """
    out = scores.attrs["output_position"]
    labels = list(scores["text"]) if "text" in scores else [str(i) for i in scores.index]

    def quoted(i):
        return repr(labels[i].strip() or labels[i])

    result = {"tokens": f"{len(scores)}", "output_token": quoted(out)}
    if tokenizer is not None:
        word = _display(tokenizer.decode([scores.attrs["predicted_token"]]))
        result["predicted"] = repr(word.strip() or word)
    earlier = scores.iloc[:out]
    nonfinite = 0
    for method, key in METHOD_KEYS.items():
        values = earlier[method].astype(float)
        finite = np.isfinite(values)
        nonfinite += int((~finite).sum())
        best = values[finite].nlargest(top).index  # nlargest keeps +-inf: +inf would come first
        result[f"top_{key}"] = ", ".join(quoted(i) for i in best)
    result["nonfinite_example"] = f"{nonfinite}"
    if timing is not None:
        result["time_fast"] = f"{timing['median_s'].iloc[0]:.2g}"
        result["time_direct"] = f"{timing['median_s'].iloc[1]:.2g}"
        result["speedup"] = f"{timing.attrs['speedup']:.1f}"
        result["max_difference"] = f"{timing.attrs['max_abs_difference']:.1e}"
        result["finite_exponents"] = f"{timing.attrs['finite_exponents']}"
        result["nonfinite_exponents"] = f"{timing.attrs['nonfinite_exponents']}"
    return result


def encode_text(tokenizer, text: str, *, max_tokens: int | None = None) -> tuple[np.ndarray, list[str]]:
    """Token ids of ``text`` (no special tokens added), at most ``max_tokens`` of them, and each token decoded on its
    own for display (line breaks shown as a return sign, so that a label stays on one line)."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    if max_tokens is not None:
        ids = ids[:max_tokens]
    labels = [_display(tokenizer.decode([i])) for i in ids]
    return np.asarray(ids, dtype=np.int32), labels


def _display(token: str) -> str:
    """A decoded token on one line: line breaks shown as a return sign."""
    return token.replace("\r", "").replace("\n", "\u21b5")


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


SCORE_LABELS = {"max_exponent": "largest Lyapunov exponent (per unit t)",
                "sum_exponents": "sum of the Lyapunov exponents (per unit t)",
                "kaplan_yorke": "Kaplan-Yorke dimension"}
"""What each score of a ``lyapunov_map`` is, for a colour bar."""


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
        text = ds["text"].values
        ax.set_xticks(range(ds.sizes["token"]), text, rotation=90, fontsize=7)
        ax.set_yticks(range(ds.sizes["output"]), [text[int(o)] for o in ds["output"].values], fontsize=7)
    ax.figure.colorbar(im, ax=ax, shrink=0.8, label=SCORE_LABELS.get(score, score.replace("_", " ")))
    return ax.figure


def _earlier_only(scores: "pd.DataFrame") -> tuple[list[str], np.ndarray]:
    """Methods and their scores [method, token] with the output position itself set to NaN: its own score (the
    token's influence on itself) dwarfs every other, and the question is which earlier token matters. Scores that
    are not finite are NaN too (left uncoloured): one -inf would make a row's min-max scale infinite, the row blank."""
    methods = [c for c in scores.columns if c != "text"]
    values = scores[methods].to_numpy(dtype=float).T.copy()
    values[~np.isfinite(values)] = np.nan
    out = scores.attrs.get("output_position")
    if out is not None:
        values[:, out] = np.nan
    return methods, values


def scores_html(scores: "pd.DataFrame", *, cmap: str = "Reds") -> str:
    """An HTML table: one line of coloured tokens (``tokens_html``) per method of ``attribution_scores``, each line
    coloured on its own scale over the earlier tokens; the output position is outlined and left uncoloured."""
    tokens = scores["text"] if "text" in scores else [str(i) for i in scores.index]
    out = scores.attrs.get("output_position")
    rows = []
    methods, values = _earlier_only(scores)
    for method, row in zip(methods, values):
        line = tokens_html(list(tokens), row, output_position=out, cmap=cmap)
        rows.append(f'<tr><td style="padding-right:8px;white-space:nowrap;vertical-align:top">{html.escape(method)}'
                    f"</td><td>{line}</td></tr>")
    return "<table>" + "".join(rows) + "</table>"


def plot_scores(scores: "pd.DataFrame", *, cmap: str = "Reds"):
    """The same as a figure: rows are methods, columns input tokens, each row min-max scaled to [0, 1] over the
    earlier tokens' finite scores (scores that are not finite, later tokens and the outlined output position itself:
    white); token labels as x ticks."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    methods, values = _earlier_only(scores)  # [method, token]
    finite = np.isfinite(values)  # a row without any finite score stays blank (lo = inf, hi = -inf)
    lo = np.min(np.where(finite, values, np.inf), axis=1, keepdims=True)
    hi = np.max(np.where(finite, values, -np.inf), axis=1, keepdims=True)
    scaled = (values - lo) / np.where(hi > lo, hi - lo, 1.0)
    n = values.shape[1]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.24 * n + 2.5), 0.45 * len(methods) + 1.6), layout="constrained")
    im = ax.imshow(np.ma.masked_invalid(scaled), cmap=cmap, vmin=0, vmax=1, aspect="auto", interpolation="nearest")
    ax.set_yticks(range(len(methods)), methods, fontsize=8)
    labels = scores["text"] if "text" in scores else [str(i) for i in scores.index]
    ax.set_xticks(range(n), list(labels), rotation=90, fontsize=7)
    out = scores.attrs.get("output_position")
    if out is not None:
        ax.add_patch(Rectangle((out - 0.5, -0.5), 1, len(methods), fill=False, edgecolor="#1f4e9c", lw=2))
    fig.colorbar(im, ax=ax, label="score, min-max scaled per method", shrink=0.9)
    ax.set_title("Which input tokens drive the prediction at the outlined position", fontsize=10)
    return fig
