"""Token-level Lyapunov exponents of DiffEqFormer (eq. 8 of the paper, by the QR / Benettin method): the tangent
matrix Phi is re-orthonormalised after every step, Q R = Phi, Phi <- Q, and the exponents are the time averages of
log|R_ii| (Benettin et al. 1980).

Token level (Section 5.2, Appendix B): for output position `out` and input token `in`, on the forward pass's Euler grid
Phi_{k+1} = (I + h J_{out,in}(t_k, X_k)) Phi_k, h = 1/L, J_{out,in} = d f_out / d x_in at the state X_k entering step
k (the authors' notebook paired W(t_k) with the state one step later). D reverse-mode products of f_out give it for
every input token at once; the direct method (the authors') builds the full (nD x nD) Jacobian per step.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import NamedTuple, Sequence

import equinox as eqx
import haliax as hax
import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
import xarray as xr
from haliax import NamedArray
from levanter.layers.attention import AttentionMask, dot_product_attention
from levanter.utils.tree_utils import inference_mode

from ..model.transformer import DiffEqFormerLMHeadModel, time_grid
from ..numerics import one_blas_thread


def kaplan_yorke_dimension(exponents) -> jnp.ndarray:
    """D_KY = k + (lambda_1 + ... + lambda_k) / |lambda_{k+1}|, k the largest index whose partial sum is >= 0, of
    the exponents along the last axis (any order): 0 if lambda_1 < 0, n if every partial sum is >= 0."""
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


class Prepared(NamedTuple):
    """What every token-level computation on one sequence shares (``prepare``)."""

    model: DiffEqFormerLMHeadModel  # in inference mode
    ids: NamedArray  # [position]
    x0: NamedArray  # the embeddings [position, embed]
    blocks: object  # the vector field's weights at every Euler step, with a leading "layers" axis
    pos_ids: NamedArray  # [position]


def prepare(model: DiffEqFormerLMHeadModel, token_ids) -> Prepared:
    """The embeddings and every Euler step's weights of one sequence ``token_ids`` [position]."""
    model = inference_mode(model, True)
    ids = token_ids if isinstance(token_ids, NamedArray) else hax.named(jnp.asarray(token_ids, jnp.int32), "position")
    if ids.ndim != 1:
        raise ValueError(f"token_ids must be one sequence [position], got axes {ids.axes}")
    return Prepared(model, ids, *_embed_and_materialize(model, ids))


@eqx.filter_jit
def _embed_and_materialize(model, ids):
    # Compiled: run op by op, the hypernetworks of every weight cost seconds per call on a CPU.
    Pos = ids.resolve_axis("position")
    pos_ids = hax.arange(Pos, dtype=jnp.int32)
    x0 = model.embeddings.embed(ids, pos_ids).rearrange((Pos, model.Embed))
    blocks = model.weights_at(time_grid(model.config.Layers))  # every weight gets a leading "layers" axis
    return x0, blocks, pos_ids


def step_weights(blocks, k: int):
    """The weights of Euler step ``k`` out of ``prepare``'s stacked ``blocks``."""

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
    model, ids, x0, blocks, pos_ids = prepare(model, token_ids)
    return states(blocks, x0.array, pos_ids, x0.axes, model.config.num_layers)


@eqx.filter_jit
def states(blocks, x, pos_ids, axes, num_steps: int):
    """The Euler steps' states [num_steps + 1, n, D] from the raw state ``x`` [n, D] (``prepare``'s parts)."""
    h = 1.0 / num_steps
    xs = [x]
    for k in range(num_steps):
        xs.append(xs[-1] + h * _field(step_weights(blocks, k), axes, pos_ids)(xs[-1]))
    return jnp.stack(xs)


def queries_keys_values(attn, xq, xkv, q_pos, kv_pos):
    """Queries of xq [..., kv_head, q_heads_per_group, position, head_size], keys and values of xkv [..., kv_head,
    key_position, head_size], as Levanter's ``Attention`` builds them (QK norm, RoPE), from its public parts."""
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


def _row_field(block, axes, pos_ids, out):
    """``_field(block, axes, pos_ids)(x)[out]`` [D], computed for that row alone (one token's query and MLP), so that
    ``_rows_fast``'s D reverse-mode products differentiate through one token's MLP instead of all n tokens'."""
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
        q, k, v = queries_keys_values(attn, xa["position", one], xa, positions["position", one], positions)
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
    """Euler step ``k`` (a traced index into the stacked weights ``blocks``: taken out of the stack outside the
    compiled step, op by op, they cost more than the step) of the state and of every (output, input) tangent matrix."""
    block = step_weights(blocks, k)

    def one_out(out, phi):
        return _qr_step(phi, rows_fn(block, x, out, pos_ids, axes), h)

    phis, logs = jax.vmap(one_out)(outs, phis)
    return x + h * _field(block, axes, pos_ids)(x), phis, logs


def _exponents(model, token_ids, output_positions: Sequence[int], rows_fn, prepared=None) -> tuple[np.ndarray, int]:
    """Exponents [len(outs), n_in, D] (sorted decreasing) for several output positions."""
    model, ids, x0, blocks, pos_ids = prepared if prepared is not None else prepare(model, token_ids)
    n, D = x0.array.shape
    L = model.config.num_layers
    h = 1.0 / L
    outs = [o % n for o in output_positions]

    x = x0.array
    phis = jnp.broadcast_to(jnp.eye(D, dtype=x.dtype), (len(outs), n, D, D))
    total = jnp.zeros((len(outs), n, D), x.dtype)
    out_ids = jnp.asarray(outs, dtype=jnp.int32)
    # The batched QR runs through LAPACK (OpenBLAS), whose worker threads slow it down on a busy machine
    # (numerics.one_blas_thread); the result is read (np.asarray) inside the block, so every step runs under it.
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
    pair = ("output", "token")
    ds = xr.Dataset(
        {"exponents": (("output", "token", "exponent"), exps), "max_exponent": (pair, exps[..., 0]),
         "sum_exponents": (pair, exps.sum(axis=-1)), "kaplan_yorke": (pair, np.where(defined, kaplan_yorke, np.nan))},
        coords={"output": list(outs), "token": np.arange(n), "exponent": np.arange(exps.shape[-1])},
        attrs={"model_config": repr(model.config), "steps": model.config.num_layers,
               "time_grid": "t_k = (k+1)/L, Jacobian at the state entering step k", "horizon": 1.0},
    )
    if tokens is not None:
        ds = ds.assign_coords(text=("token", list(tokens)))
    return ds


def token_lyapunov(model: DiffEqFormerLMHeadModel, token_ids, *, output_position: int = -1,
                   tokens: Sequence[str] | None = None, direct: bool = False,
                   prepared: Prepared | None = None) -> xr.Dataset:
    """Lyapunov spectrum of every input token's influence on ``output_position``: ``exponents`` (token, exponent;
    sorted decreasing; -inf where a tangent map I + h J is singular) and the scores ``max_exponent``,
    ``sum_exponents``, ``kaplan_yorke`` (NaN after the output). ``direct``: with the full Jacobian (the reference)."""
    exps, n = _exponents(model, token_ids, [output_position], _rows_direct if direct else _rows_fast, prepared)
    return _dataset(exps, [output_position % n], n, tokens, model).isel(output=0)


def lyapunov_map(model: DiffEqFormerLMHeadModel, token_ids, *, tokens: Sequence[str] | None = None) -> xr.Dataset:
    """The Lyapunov map: scores for every (output position, input token) pair, one vectorised pass per step."""
    outs = list(range(len(token_ids) if not isinstance(token_ids, NamedArray) else token_ids.array.shape[0]))
    exps, n = _exponents(model, token_ids, outs, _rows_fast)
    return _dataset(exps, outs, n, tokens, model)


VALUE_KINDS = ("finite", "-inf", "+inf", "nan")
"""The kinds of value an exponent can take, as ``compare_exponents`` counts them."""


def _value_kind(x: np.ndarray) -> np.ndarray:
    """Index into ``VALUE_KINDS`` of every entry of ``x``."""
    return np.select([np.isfinite(x), np.isneginf(x), np.isposinf(x)], [0, 1, 2], default=3)


class ExponentAgreement(NamedTuple):
    """How two computations of the same exponents agree (``compare_exponents``)."""

    counts: dict[str, dict[str, int]]  # per computation (by name): how many values of each kind in VALUE_KINDS
    mismatched: int  # entries where the two differ in kind (one finite and the other not, -inf against NaN, ...)
    compared: int  # entries finite in both
    max_abs_difference: float | None  # max |a - b| over the entries finite in both; None when there are none


def compare_exponents(a, b, *, names: tuple[str, str] = ("a", "b")) -> ExponentAgreement:
    """Compare two computations of the same exponents: their kinds of value (finite, -inf, +inf, NaN) entry by entry
    (``np.nanmax`` of |a - b| would skip where they may disagree), the difference where both are finite."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.shape != b.shape:
        raise ValueError(f"the two computations have different shapes: {a.shape} and {b.shape}")
    kind_a, kind_b = _value_kind(a), _value_kind(b)
    counts = {name: {kind: int(np.sum(k == i)) for i, kind in enumerate(VALUE_KINDS)}
              for name, k in zip(names, (kind_a, kind_b))}
    both = (kind_a == 0) & (kind_b == 0)
    difference = float(np.max(np.abs(a[both] - b[both]))) if both.any() else None
    return ExponentAgreement(counts, int(np.sum(kind_a != kind_b)), int(both.sum()), difference)


def timings(model: DiffEqFormerLMHeadModel, token_ids, *, repeats: int = 3) -> pd.DataFrame:
    """Wall-clock seconds of ``token_lyapunov`` for the last position, fast and direct: median and minimum of
    ``repeats`` runs after a compiling one (``compile_s``); ``attrs``: ``speedup``, ``tokens`` and the methods'
    agreement (``compare_exponents``), a ValueError if they differ in kind anywhere or none is finite in both."""
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


def corpus_example(text: str, *, vocab_size: int = 4096, max_tokens: int | None = None, root=None) -> Example:
    """``text``, checked to occur verbatim in the validation split of the Shakespeare corpus (held out from training)
    prepared below ``root`` (default ``paths.DATA``), tokenised with its BPE of ``vocab_size`` tokens."""
    from ..data.corpora import CorpusLayout, load_tokenizer

    layout = CorpusLayout() if root is None else CorpusLayout(Path(root))
    path = layout.jsonl("all", "validation")
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist: prepare the corpus (python -m diffeqformer.data prepare)")
    if not any(text in json.loads(line)["text"] for line in path.read_text().splitlines() if line):
        raise ValueError(f"the example does not occur in the validation split of the corpus: {text[:60]!r}...")
    tokenizer = load_tokenizer(layout.tokenizer(vocab_size))
    ids, tokens = encode_text(tokenizer, text, max_tokens=max_tokens)
    return Example(ids, tokens, tokenizer)


def encode_text(tokenizer, text: str, *, max_tokens: int | None = None) -> tuple[np.ndarray, list[str]]:
    """Token ids of ``text`` (no special tokens added), at most ``max_tokens`` of them, and each token decoded on its
    own for display (line breaks shown as a return sign, so that a label stays on one line)."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    if max_tokens is not None:
        ids = ids[:max_tokens]
    labels = [one_line(tokenizer.decode([i])) for i in ids]
    return np.asarray(ids, dtype=np.int32), labels


def one_line(token: str) -> str:
    """A decoded token on one line: line breaks shown as a return sign."""
    return token.replace("\r", "").replace("\n", "\u21b5")
