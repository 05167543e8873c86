"""Eigenvalue spectra of the attention and feed-forward weights along depth (paper Section 5.1, Fig. 2a/2b, App. E).

Conventions. A token is a row vector x in R^D and every linear map acts on the right, as ``hnn.Linear`` computes
y = x . W. For head h with d_k = D / H,

    q = x W_Q^h,  k = x W_K^h,  v = x W_V^h               W_Q^h, W_K^h, W_V^h : D x d_k,  W_O^h : d_k x D
    score(x_i, x_j) = q_i k_j^T = x_i W_Q^h (W_K^h)^T x_j^T    QK^h = W_Q^h (W_K^h)^T    (D x D, rank <= d_k)
    head output at i = sum_j a_ij x_j W_V^h W_O^h              OV^h = W_V^h W_O^h        (D x D, rank <= d_k)

and for the feed-forward F(x) = act(x W_1) W_2 with W_1 : D x M, W_2 : M x D the FFN matrix is W_1 W_2 (D x D). For
the SwiGLU feed-forward of the Llama variants, F(x) = (act(x W_gate) * (x W_up)) W_down, we take W_1 = W_gate (the
branch through the nonlinearity, GPT's W_1) and W_2 = W_down. In the column-vector convention the same matrices are
the transposes (W_K W_Q^T, W_O^T W_V^T), which have the same eigenvalues; what matters is pairing the right factors.
Left out on purpose: the 1/sqrt(d_k) score scale, the biases (they add terms linear in x to the score), the norms'
gains (unless ``fold_norm=True``, which uses diag(gamma) W in place of W for the maps fed by a norm), and rotary
embeddings (for RoPE models QK^h is the form at relative position 0; at offset r it is W_Q^h R_r (W_K^h)^T).
For the ODE model these are the weights W(t) of the vector field; an Euler step of size 1/L scales the update, not
the matrices, so compare magnitudes with a discrete model's with that factor in mind.

Eigenvalues are complex and kept complex. A product of a D x r and an r x D matrix has at most r nonzero eigenvalues,
and they are the eigenvalues of the r x r product taken the other way round (AB and BA share their nonzero
eigenvalues), so by default (``method="fast"``) only the min(D, r) eigenvalues that can be nonzero are computed:

    eig(W_Q W_K^T) = eig(W_K^T W_Q) u {0}^(D - d_k)      eig(W_V W_O) = eig(W_O W_V) u {0}^(D - d_k)
    eig(W_1 W_2)   = eig(W_2 W_1) u {0}^(D - M)          (the M x M form only when M < D)

``method="full"`` diagonalises the D x D matrices themselves (the tests check that the two agree). Eigenvalues are
computed by LAPACK (NumPy, one OpenBLAS thread) in float64 from the float32 weights and sorted by decreasing magnitude
(conjugate pairs: positive imaginary part first), so ``eig = 0`` is the largest. The index ranks the eigenvalues at
each t; it does not follow one eigenvalue through a crossing.

Data. ``spectra`` returns an ``xarray.Dataset``: ``qk`` and ``ov`` of dims (time | layer, head, eig) and ``ffn`` of
dims (time | layer, ffn_eig), complex128, with the model's configuration in ``attrs``. ``summarize`` turns it into a
tidy ``pandas.DataFrame`` of statistics per t, head and matrix; the ``plot_*`` functions only draw.

Growth with depth. ``depth_growth`` judges whether the spectral radii grow with depth over seeds (``seeds.RULE``),
each seed's model on its own depth grid: a DiffEqFormer at its Euler steps t_k = (k+1)/L, the only times at which
training evaluated W(t). Between them W(t) is an interpolation that training never saw, and its time embedding
oscillates with period 2 pi / s (s = 1000): a grid of spacing 0.01 samples that oscillation at about 1.6 periods a
step, so a trend read off it is aliased; t = 0 is off the grid too. Plots of a grid off the Euler steps say so.
"""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Sequence

import draccus
import haliax as hax
import jax.numpy as jnp
import numpy as np
import pandas as pd
import xarray as xr
from haliax import NamedArray

from ..model.transformer import DiffEqFormerLMHeadModel, DiscreteDiffEqFormerLMHeadModel
from ..model.vector_field import ParallelBlock
from ..numerics import cached, check_positive_int, fingerprint, load_netcdf, one_blas_thread, save_netcdf
from . import claims

if TYPE_CHECKING:
    from matplotlib.figure import Figure

MATRICES = ("qk", "ov", "ffn")
"""The data variables of a spectra dataset."""

DESCRIPTIONS = {
    "qk": "eigenvalues of the QK matrix W_Q^h W_K^h^T (D x D, rank <= d_k): score(x, x') = x W_Q^h W_K^h^T x'^T",
    "ov": "eigenvalues of the OV matrix W_V^h W_O^h (D x D, rank <= d_k): head output = sum_j a_j x_j W_V^h W_O^h",
    "ffn": "eigenvalues of the feed-forward product W_1 W_2 (D x D; Llama/SwiGLU: W_gate W_down)",
}
"""What each data variable holds (also stored in the dataset's attrs)."""

TITLES = {"qk": r"QK: $W_Q^h W_K^{h\top}$", "ov": r"OV: $W_V^h W_O^h$", "ffn": r"FFN: $W_1 W_2$"}
"""Plot titles naming each matrix."""

CONVENTION = (
    "x is a row vector and maps act on the right (y = x W). QK^h = W_Q^h W_K^h^T, OV^h = W_V^h W_O^h, FFN = W_1 W_2 "
    "(Llama: W_gate W_down), all D x D. No 1/sqrt(d_k), no biases, no RoPE rotation; norm gains folded in only if "
    "fold_norm. Eigenvalues in float64 from float32 weights, sorted by decreasing |lambda| (conjugate pairs: +imag "
    "first); method='fast' keeps only the min(D, r) possibly nonzero eigenvalues of a rank-r product (the other "
    "D - r are exactly 0), method='full' keeps all D."
)
"""The conventions, as stored in ``attrs["convention"]``."""


@dataclass(frozen=True)
class _Weights:
    """Per-head projection matrices as float64 NumPy arrays, with a leading axis of N times or layers."""

    wq: np.ndarray  # [N, H, D, d_k]
    wk: np.ndarray  # [N, H, D, d_k]
    wv: np.ndarray  # [N, H, D, d_k]
    wo: np.ndarray  # [N, H, d_k, D]
    w1: np.ndarray  # [N, D, M]
    w2: np.ndarray  # [N, M, D]


def _np(x: NamedArray, axes: Sequence[str]) -> np.ndarray:
    return np.asarray(x.rearrange(tuple(axes)).array, dtype=np.float64)


def _gain(norm, lead: str) -> np.ndarray:
    """The norm's gain gamma as [N, D] (N = 1 for a norm without the leading axis)."""
    if norm is None or getattr(norm, "weight", None) is None:
        raise ValueError("fold_norm=True needs norms with a weight (gain)")
    w = norm.weight
    if lead not in [ax.name for ax in w.axes]:  # a static norm inside a stacked block: same gain everywhere
        return np.asarray(w.array, dtype=np.float64)[None, :]
    return _np(w, (lead, "embed"))


def _levanter_attention(attn, lead: str) -> tuple[np.ndarray, ...]:
    """W_Q, W_K, W_V, W_O of Levanter's ``Attention`` (grouped-query layout, heads flattened kv-head-major)."""
    wq = _np(attn.q_proj.weight, (lead, "kv_head", "q_heads_per_group", "embed", "head_size"))
    n, g, p, d, dk = wq.shape
    wq = wq.reshape(n, g * p, d, dk)
    # Levanter flattens (kv_head, q_heads_per_group) into heads kv-head-major: query head g*p + j uses kv head g.
    wk = np.repeat(_np(attn.k_proj.weight, (lead, "kv_head", "embed", "head_size")), p, axis=1)
    wv = np.repeat(_np(attn.v_proj.weight, (lead, "kv_head", "embed", "head_size")), p, axis=1)
    wo = _np(attn.o_proj.weight, (lead, "heads", "head_size", "embed"))
    return wq, wk, wv, wo


def _mlp(mlp, lead: str) -> tuple[np.ndarray, np.ndarray]:
    if hasattr(mlp, "c_fc"):  # GPT-2: act(x W_fc) W_proj
        return _np(mlp.c_fc.weight, (lead, "embed", "mlp")), _np(mlp.c_proj.weight, (lead, "mlp", "embed"))
    return _np(mlp.gate_proj.weight, (lead, "embed", "mlp")), _np(mlp.down_proj.weight, (lead, "mlp", "embed"))


def _fold(weights: _Weights, attn_gain: np.ndarray, mlp_gain: np.ndarray) -> _Weights:
    """LN(x) W = (x_hat * gamma) W = x_hat diag(gamma) W: scale the rows of the maps fed by a norm."""
    ga, gm = attn_gain[:, None, :, None], mlp_gain[:, :, None]
    return _Weights(weights.wq * ga, weights.wk * ga, weights.wv * ga, weights.wo, weights.w1 * gm, weights.w2)


def _parallel_block_weights(block: ParallelBlock, lead: str, fold_norm: bool) -> _Weights:
    w = _Weights(*_levanter_attention(block.attn, lead), *_mlp(block.mlp, lead))
    return _fold(w, _gain(block.attn_norm, lead), _gain(block.mlp_norm, lead)) if fold_norm else w


def _gpt2_weights(blocks, lead: str, fold_norm: bool) -> _Weights:
    qkv = _np(blocks.attn.c_attn.weight, (lead, "qkv", "heads", "embed", "head_size"))  # qkv: 0 = q, 1 = k, 2 = v
    wo = _np(blocks.attn.c_proj.weight, (lead, "heads", "head_size", "embed"))
    w = _Weights(qkv[:, 0], qkv[:, 1], qkv[:, 2], wo, *_mlp(blocks.mlp, lead))
    return _fold(w, _gain(blocks.ln_1, lead), _gain(blocks.ln_2, lead)) if fold_norm else w


def _llama_weights(layers, lead: str, fold_norm: bool) -> _Weights:
    w = _Weights(*_levanter_attention(layers.self_attn, lead), *_mlp(layers.mlp, lead))
    if fold_norm:
        return _fold(w, _gain(layers.input_layernorm, lead), _gain(layers.post_attention_layernorm, lead))
    return w


def _sorted(lam: np.ndarray) -> np.ndarray:
    """Sort the last axis by decreasing |lambda|, then decreasing imaginary part."""
    order = np.lexsort((-lam.imag, -np.abs(lam)), axis=-1)
    return np.take_along_axis(lam, order, axis=-1)


def product_eigvals(a: np.ndarray, b: np.ndarray, method: str = "fast") -> np.ndarray:
    r"""Eigenvalues of the n x n product A B for A: [..., n, r], B: [..., r, n], sorted by decreasing magnitude.

    ``method="fast"`` returns the min(n, r) eigenvalues that can be nonzero: when r < n those of the r x r matrix
    B A (AB and BA have the same nonzero eigenvalues; AB has n - r more zeros). ``method="full"`` returns all n
    eigenvalues of A B. Computed in float64 (complex128 result), batched over the leading axes.
    """
    if method not in ("fast", "full"):
        raise ValueError(f"method must be 'fast' or 'full', got {method!r}")
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    n, r = a.shape[-2], a.shape[-1]
    if b.shape[-2:] != (r, n):
        raise ValueError(f"shapes {a.shape} and {b.shape} do not make a square product")
    m = a @ b if method == "full" or n <= r else b @ a
    return _sorted(_eigvals_f64(m))


def _eigvals_f64(m: np.ndarray) -> np.ndarray:
    """Eigenvalues of a batch of real float64 matrices (LAPACK geev through NumPy), with one OpenBLAS thread."""
    if m.size == 0:
        return np.zeros(m.shape[:-1], dtype=np.complex128)
    with one_blas_thread():
        return np.linalg.eigvals(m).astype(np.complex128)


def _eigvals(w: _Weights, method: str) -> dict[str, np.ndarray]:
    return {
        "qk": product_eigvals(w.wq, np.swapaxes(w.wk, -1, -2), method),  # W_Q W_K^T
        "ov": product_eigvals(w.wv, w.wo, method),  # W_V W_O
        "ffn": product_eigvals(w.w1, w.w2, method),  # W_1 W_2
    }


def _config_attrs(model) -> dict[str, str]:
    config = model.config
    cls = type(config)
    return {"config": json.dumps(draccus.encode(config)), "config_class": f"{cls.__module__}.{cls.__qualname__}"}


def config_of(ds: xr.Dataset):
    """The model configuration stored in a spectra dataset's attrs, decoded back into its dataclass."""
    module, _, name = ds.attrs["config_class"].rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    return draccus.decode(cls, json.loads(ds.attrs["config"]))


def _model_kind(model) -> str:
    if isinstance(model, DiffEqFormerLMHeadModel):
        return "diffeqformer" if model.config.time_dependent else "diffeqformer-shared"
    if isinstance(model, DiscreteDiffEqFormerLMHeadModel):
        return "diffeqformer-discrete"
    name = type(model).__name__
    if name == "Gpt2LMHeadModel":
        return "gpt2"
    if name == "LlamaLMHeadModel":
        return "llama"
    raise TypeError(
        f"no spectra for {name}: expected a DiffEqFormer (continuous or discretised), Levanter's Gpt2LMHeadModel "
        "or LlamaLMHeadModel"
    )


def _ode_weights(model: DiffEqFormerLMHeadModel, times: np.ndarray, method: str, fold_norm: bool, batch_size: int):
    """Eigenvalues at each of ``times``, materialising W(t) for ``batch_size`` times at once."""
    parts = []
    for start in range(0, len(times), batch_size):
        t = hax.named(jnp.asarray(times[start : start + batch_size], dtype=jnp.float32), "time")
        parts.append(_eigvals(_parallel_block_weights(model.weights_at(t), "time", fold_norm), method))
    return {k: np.concatenate([p[k] for p in parts]) for k in MATRICES}


def _dataset(lam: dict[str, np.ndarray], dim: str, coords: dict, attrs: dict) -> xr.Dataset:
    n_heads, n_eig = lam["qk"].shape[1:]
    data = {
        "qk": ((dim, "head", "eig"), lam["qk"], {"description": DESCRIPTIONS["qk"]}),
        "ov": ((dim, "head", "eig"), lam["ov"], {"description": DESCRIPTIONS["ov"]}),
        "ffn": ((dim, "ffn_eig"), lam["ffn"], {"description": DESCRIPTIONS["ffn"]}),
    }
    coords = {**coords, "head": np.arange(n_heads), "eig": np.arange(n_eig), "ffn_eig": np.arange(lam["ffn"].shape[-1])}
    return xr.Dataset(data, coords=coords, attrs=attrs)


def spectra(model, times=None, *, method: str = "fast", fold_norm: bool = False, batch_size: int = 32) -> xr.Dataset:
    r"""Complex eigenvalues of every head's QK and OV matrices and of the feed-forward product, along depth.

    ``model`` is a ``DiffEqFormerLMHeadModel`` (time-dependent or weight-shared), a ``DiscreteDiffEqFormerLMHeadModel``,
    or Levanter's ``Gpt2LMHeadModel`` / ``LlamaLMHeadModel`` (the baselines of ``diffeqformer.model.baselines``).

    - ``times=None``: one entry per layer, dimension ``layer`` (k = 0..L-1). For the ODE model layer k is W(t_k) with
      t_k = (k+1)/L, the weights of Euler step k; every dataset carries that depth fraction as the coordinate ``time``
      along ``layer`` (for the discrete baselines it is only the position (k+1)/L, not an ODE time).
    - ``times``: any 1-d array of t (ODE model only; W(t) is defined for every t), dimension ``time``. The weights
      of ``batch_size`` times are materialised in one batched call.

    Returns an ``xarray.Dataset`` with ``qk``, ``ov``: [time | layer, head, eig] and ``ffn``: [time | layer, ffn_eig],
    complex128, each sorted by decreasing magnitude; eig has d_k entries (``method="fast"``: the eigenvalues that can
    be nonzero, from the d_k x d_k forms W_K^T W_Q and W_O W_V) or D (``method="full"``), ffn_eig min(D, M) or D.
    ``attrs``: model kind and class, the configuration (JSON) and its class, method, fold_norm, the conventions.
    """
    kind = _model_kind(model)
    if method not in ("fast", "full"):
        raise ValueError(f"method must be 'fast' or 'full', got {method!r}")
    check_positive_int(batch_size, "batch_size")
    attrs = {
        "model_kind": kind,
        "model_class": f"{type(model).__module__}.{type(model).__qualname__}",
        **_config_attrs(model),
        "method": method,
        "fold_norm": int(fold_norm),
        "convention": CONVENTION,
        "matrices": json.dumps(DESCRIPTIONS),
    }
    num_layers = model.config.num_layers
    layer_time = (np.arange(num_layers) + 1.0) / num_layers
    if times is not None:
        if kind not in ("diffeqformer", "diffeqformer-shared"):
            raise TypeError(f"spectra at arbitrary times need a continuous DiffEqFormerLMHeadModel, not a {kind} model")
        times = np.atleast_1d(np.asarray(times, dtype=np.float64))
        if times.ndim != 1 or times.size == 0:
            raise ValueError(f"times must be a non-empty 1-d array, got shape {times.shape}")
        lam = _ode_weights(model, times, method, fold_norm, batch_size)
        return _dataset(lam, "time", {"time": times}, attrs)

    if kind in ("diffeqformer", "diffeqformer-shared"):
        lam = _ode_weights(model, layer_time, method, fold_norm, batch_size)
    elif kind == "diffeqformer-discrete":
        blocks = model.transformer.blocks
        lam = _eigvals(_parallel_block_weights(blocks.stacked, blocks.Block.name, fold_norm), method)
    elif kind == "gpt2":
        blocks = model.transformer.blocks
        lam = _eigvals(_gpt2_weights(blocks.stacked, blocks.Block.name, fold_norm), method)
    else:  # llama
        layers = model.transformer.layers
        lam = _eigvals(_llama_weights(layers.stacked, layers.Block.name, fold_norm), method)
    coords = {"layer": np.arange(num_layers), "time": ("layer", layer_time)}
    return _dataset(lam, "layer", coords, attrs)


def depth_dim(ds: xr.Dataset) -> str:
    """The depth dimension of a spectra dataset (or summary): ``"time"`` or ``"layer"``."""
    return "layer" if "layer" in ds.dims else "time"


def summarize(ds: xr.Dataset, *, rtol: float = 1e-6) -> pd.DataFrame:
    r"""Statistics of every spectrum: one row per (time | layer, matrix, head), head <NA> for ``ffn``.

    With rho = max |lambda| (the spectral radius) of that matrix, an eigenvalue counts as nonzero when
    |lambda| > rtol * rho and as having a positive real part when Re lambda > rtol * rho. Columns:

    - ``spectral_radius``: rho = max_i |lambda_i|
    - ``max_real``, ``min_real``: the extreme real parts
    - ``n_nonzero``: number of nonzero eigenvalues (at most d_k for QK/OV)
    - ``frac_positive_real``: #{Re lambda > rtol rho} / n_nonzero
    - ``positivity``: sum_i Re lambda_i / sum_i |lambda_i| in [-1, 1] (Elhage et al. 2021's eigenvalue positivity:
      +1 when all eigenvalues are positive reals, the signature of copying OV / self-matching QK circuits)
    """
    dim = depth_dim(ds)
    frames = []
    for name in MATRICES:
        lam = ds[name]
        eig = "ffn_eig" if name == "ffn" else "eig"
        mag = np.abs(lam)
        rho = mag.max(eig)
        nonzero = mag > rtol * rho
        n_nonzero = nonzero.sum(eig)
        stats = xr.Dataset(
            {
                "spectral_radius": rho,
                "max_real": lam.real.max(eig),
                "min_real": lam.real.min(eig),
                "n_nonzero": n_nonzero,
                "frac_positive_real": (lam.real > rtol * rho).sum(eig) / n_nonzero.where(n_nonzero > 0),
                "positivity": lam.real.sum(eig) / mag.sum(eig).where(rho > 0),
            }
        )
        df = stats.to_dataframe().reset_index()
        if "head" not in df:
            df["head"] = pd.NA
        df["head"] = df["head"].astype("Int64")
        df["matrix"] = name
        frames.append(df)
    keys = [dim, "time"] if dim == "layer" else [dim]
    out = pd.concat(frames, ignore_index=True)
    stats_cols = ["spectral_radius", "max_real", "min_real", "n_nonzero", "frac_positive_real", "positivity"]
    out = out[[*keys, "matrix", "head", *stats_cols]]
    rank = {name: i for i, name in enumerate(MATRICES)}
    out = out.sort_values([*keys[:1], "matrix", "head"], key=lambda c: c.map(rank) if c.name == "matrix" else c)
    return out.reset_index(drop=True)


def spectral_change(ds: xr.Dataset) -> pd.DataFrame:
    r"""How much each spectrum moves between consecutive depth points: one row per (step k, matrix, head).

    ``change`` = || |lambda|_{k+1} - |lambda|_k ||_2 / max(||\,|lambda|_k||_2, ||\,|lambda|_{k+1}||_2), the relative
    change of the magnitude-sorted spectrum from point k to k+1 (0: identical; of order 1 when consecutive spectra
    are unrelated). Small values along a fine grid of t are what "smooth spectral flow" means; compare the ODE
    model's values with a GPT's between its layers. Columns: ``step`` (k), ``time_from``, ``time_to``, ``matrix``,
    ``head`` (<NA> for ffn), ``change``.
    """
    dim = depth_dim(ds)
    times = ds["time"].values
    rows = []
    for name in MATRICES:
        mag = np.abs(ds[name].values)  # sorted by magnitude already
        diff = np.linalg.norm(mag[1:] - mag[:-1], axis=-1)
        scale = np.maximum(np.linalg.norm(mag[1:], axis=-1), np.linalg.norm(mag[:-1], axis=-1))
        change = diff / np.where(scale > 0, scale, np.nan)
        if change.ndim == 1:
            change = change[:, None]
        for k in range(change.shape[0]):
            for h in range(change.shape[1]):
                rows.append((k, times[k], times[k + 1], name, h if name != "ffn" else pd.NA, change[k, h]))
    df = pd.DataFrame(rows, columns=["step", "time_from", "time_to", "matrix", "head", "change"])
    df["head"] = df["head"].astype("Int64")
    df.attrs["depth_dim"] = dim
    return df


def mean_change(ds: xr.Dataset) -> pd.Series:
    """Mean of ``spectral_change`` over steps and heads, per matrix (index ``qk``, ``ov``, ``ffn``).

    The typical relative change of a spectrum from one depth point to the next. It depends on the grid: compare
    models on the same kind of grid (an ODE at its Euler times t_k against a GPT's layers), or follow one ODE as its
    grid of t is refined (it tends to 0 for weights continuous in t; a GPT has nothing between its layers).
    """
    change = spectral_change(ds)
    return change.groupby("matrix", sort=False)["change"].mean().reindex(list(MATRICES))


def depth_trends(summary: pd.DataFrame, stats: Sequence[str] = ("spectral_radius", "positivity")) -> pd.DataFrame:
    r"""How each statistic of ``summarize`` moves with depth: one row per (matrix, head, stat).

    Columns: ``spearman``, the Spearman rank correlation of the statistic with the depth fraction ``time`` (t, or
    (k+1)/L for layer k): +1 when it grows monotonically with depth, -1 when it shrinks, NaN when it is constant (a
    weight-shared model); ``first`` and ``last``, its value at the shallowest and deepest point; ``mean``;
    ``peak_time``, the depth fraction of its maximum; ``points``, the number of depth points. Rows of ``ffn`` have
    head <NA>.
    """
    missing = [s for s in stats if s not in summary.columns]
    if missing:
        raise ValueError(f"{missing} are not columns of the summary")
    rows = []
    for (matrix, head), g in summary.groupby(["matrix", "head"], sort=False, dropna=False):
        g = g.sort_values("time")
        t = g["time"].astype(float)
        for stat in stats:
            v = g[stat].astype(float)
            constant = v.nunique(dropna=True) < 2 or t.nunique() < 2
            # Spearman = Pearson correlation of the ranks (ties get their mean rank), as scipy.stats.spearmanr.
            rho = np.nan if constant else float(np.corrcoef(t.rank().to_numpy(), v.rank().to_numpy())[0, 1])
            rows.append({"matrix": matrix, "head": head, "stat": stat, "spearman": rho,
                         "first": float(v.iloc[0]), "last": float(v.iloc[-1]), "mean": float(v.mean()),
                         "peak_time": float(t.iloc[int(np.nanargmax(v.to_numpy()))]), "points": len(g)})
    out = pd.DataFrame(rows)
    out["head"] = out["head"].astype("Int64")
    return out


def model_table(datasets: Mapping[str, xr.Dataset]) -> pd.DataFrame:
    """One row per (model, matrix): how its spectra move with depth, for models compared on their own depth grids.

    Columns: ``radius_spearman`` and ``positivity_spearman`` (medians over heads of ``depth_trends``' Spearman
    correlations with depth; NaN for a constant spectrum), ``radius_first`` and ``radius_last`` (spectral radius at
    the shallowest and deepest point, mean over heads), ``peak_time`` (median over heads of the depth fraction of the
    largest radius), ``mean_change`` (``mean_change``: relative change between consecutive depth points) and
    ``points`` (number of depth points). Pass datasets on comparable grids (e.g. every model per layer).
    """
    rows = []
    for name, ds in datasets.items():
        trends = depth_trends(summarize(ds))
        change = mean_change(ds)
        for matrix in MATRICES:
            radius = trends[(trends["matrix"] == matrix) & (trends["stat"] == "spectral_radius")]
            positivity = trends[(trends["matrix"] == matrix) & (trends["stat"] == "positivity")]
            rows.append({"model": name, "matrix": matrix,
                         "radius_spearman": radius["spearman"].median(),  # NaN only when every head's is NaN
                         "positivity_spearman": positivity["spearman"].median(),
                         "radius_first": radius["first"].mean(), "radius_last": radius["last"].mean(),
                         "peak_time": radius["peak_time"].median(), "mean_change": float(change[matrix]),
                         "points": int(radius["points"].iloc[0])})
    return pd.DataFrame(rows)


def runs_spectra(runs: Mapping[str, str | Path], times=None, *, cache_dir: str | Path | None = None,
                 **kwargs) -> dict[str, xr.Dataset]:
    """Spectra of the trained model of each run (``{label: run_dir}``), keyed by label, in the mapping's order.
    A relative run directory is relative to ``DIFFEQFORMER_HOME`` (``paths.HOME``).

    Continuous DiffEqFormers (time-dependent or weight-shared) are evaluated at ``times`` (their Euler steps' times
    when None); discretised models and the GPT-2 / Llama baselines per layer. With ``cache_dir`` every dataset goes
    through ``cached_spectra``. Keyword arguments go to ``spectra``.
    """
    from ..runs import run_path
    from ..runs import load_model

    out = {}
    for label, run in runs.items():
        model = load_model(run_path(run))
        at = times if _model_kind(model) in ("diffeqformer", "diffeqformer-shared") else None
        out[label] = (cached_spectra(model, cache_dir, at, **kwargs) if cache_dir is not None
                      else spectra(model, at, **kwargs))
    return out


def resolving_times(ds_or_config, points: int, *, center: float = 0.5, per_period: int = 8) -> np.ndarray:
    """``points`` times around ``center``, ``per_period`` of them per period 2 pi / s of the fastest sinusoid of the
    time embedding e(t) (s = ``sinusoidal_scale`` of the model's config, or of a spectra dataset's): a grid fine
    enough to follow W(t) between two of the model's Euler points."""
    config = config_of(ds_or_config) if isinstance(ds_or_config, xr.Dataset) else ds_or_config
    if points < 2 or per_period < 1:
        raise ValueError(f"need points >= 2 and per_period >= 1, got {points}, {per_period}")
    step = 2 * np.pi / config.sinusoidal_scale / per_period
    return center + step * (np.arange(points) - (points - 1) / 2)


def seed_spectra(runs: Mapping[str, object], *, cache_dir: str | Path | None = None,
                 **kwargs) -> dict[str, list[xr.Dataset]]:
    """Spectra of every seed of every model on the model's own depth grid: ``{label: run or list of seed runs}`` ->
    ``{label: [dataset per seed]}``, in the mapping's order (``runs_spectra`` with ``times=None``: a continuous
    DiffEqFormer at its Euler steps t_k = (k+1)/L, the only times training evaluated W(t); the other models per
    layer). Keyword arguments go to ``spectra`` (the book passes ``fold_norm=True``)."""
    from .seeds import as_list

    return {label: [runs_spectra({label: run}, None, cache_dir=cache_dir, **kwargs)[label] for run in as_list(value)]
            for label, value in runs.items()}


def log_radius_slope(ds: xr.Dataset) -> dict[str, float]:
    r"""How fast the spectral radii of one model grow along its depth grid, per matrix: the least-squares slope
    :math:`\beta` of :math:`\overline{\log\rho}(t) = \frac{1}{H}\sum_h \log \max_i |\lambda_i^h(t)|` (the FFN's one
    radius for ``ffn``) against the depth fraction ``time`` (t, or (k+1)/L for layer k), in log-radius per unit t:
    the radius changes by a factor :math:`e^{\beta\,\Delta t}` over a depth span :math:`\Delta t` (+ grows, - shrinks).

    The mean of the logs is the log of the heads' geometric mean radius, so every head weighs alike whatever its
    scale. A spectrum that is constant along depth (weight sharing) has slope exactly 0."""
    t = ds["time"].values.astype(np.float64)
    if t.size < 2:
        raise ValueError("a slope along depth needs at least two depth points")
    tc = t - t.mean()
    out = {}
    for name in MATRICES:
        eig = "ffn_eig" if name == "ffn" else "eig"
        rho = np.abs(ds[name]).max(eig).values  # [N] or [N, H]
        if not np.all(rho > 0):
            raise ValueError(f"{name}: a spectral radius of 0 has no logarithm")
        y = np.log(rho).reshape(len(t), -1).mean(axis=1)
        # equal radii at every depth: exactly no slope (y - mean(y) can be rounding noise instead of 0)
        out[name] = 0.0 if np.ptp(y) == 0 else float(tc @ (y - y.mean()) / (tc @ tc))
    return out


def depth_growth(models: Mapping[str, Sequence[xr.Dataset]]) -> pd.DataFrame:
    r"""Whether the spectral radii grow with depth, judged over seeds by ``seeds.RULE``: one row per (model,
    matrix), from ``{label: [spectra of each seed on the model's own depth grid]}`` (``seed_spectra``).

    Each seed gives one number, its ``log_radius_slope``; the seed is the unit of the test, since the depth points of
    one trained model are not independent draws. The test is the one-sample t-test of the seeds' slopes against 0
    (``seeds.one_sample``; the exact sign-flip test where every seed has the same slope). Columns: ``model``,
    ``matrix``, ``seeds``, ``slope`` (mean over seeds, per unit t), ``factor`` (:math:`e^{\text{slope}\,\Delta t}`
    over the grid's span :math:`\Delta t`), ``verdict`` (``seeds.RULE``: significant, inconclusive, untested),
    ``trend`` (a phrase: grows / shrinks with depth, inconclusive, constant, untested), ``change`` (the mean over
    seeds of ``mean_change``: relative change of the spectrum between neighbouring depth points), ``comparison`` (the
    ``seeds.Comparison``), and per seed: ``slopes``, ``spearman`` (median over heads of the Spearman correlation of
    the radius with depth, ``depth_trends``), ``peak_time`` (depth of the largest head-mean radius) and
    ``positivity`` (median over heads of the Spearman correlation of the eigenvalue positivity with depth)."""
    from .seeds import as_list, one_sample

    rows = []
    for label, datasets in models.items():
        datasets = as_list(datasets)
        slopes = [log_radius_slope(ds) for ds in datasets]
        trends = [depth_trends(summarize(ds)) for ds in datasets]
        span = float(np.ptp(datasets[0]["time"].values))
        changes = [mean_change(ds) for ds in datasets]
        for m in MATRICES:
            per_seed = [s[m] for s in slopes]
            c = one_sample(per_seed)
            radius = [t[(t.matrix == m) & (t.stat == "spectral_radius")] for t in trends]
            positivity = [t[(t.matrix == m) & (t.stat == "positivity")] for t in trends]
            rows.append({
                "model": label, "matrix": m, "seeds": len(per_seed), "slope": c.difference,
                "factor": float(np.exp(c.difference * span)), "verdict": c.verdict,
                "trend": _growth_phrase(c, per_seed), "change": float(np.mean([ch[m] for ch in changes])),
                "comparison": c, "slopes": tuple(per_seed),
                "spearman": tuple(float(r.spearman.median()) for r in radius),
                "peak_time": tuple(_peak_time(ds, m) for ds in datasets),
                "positivity": tuple(float(p.spearman.median()) for p in positivity),
            })
    return pd.DataFrame(rows)


GROWTH_HIDDEN = ("comparison", "slopes", "spearman", "peak_time", "positivity")
"""Columns of ``depth_growth`` for the code and the prose, not for the table (``growth_shown`` writes them out)."""


def growth_shown(growth: pd.DataFrame) -> pd.DataFrame:
    """``depth_growth`` as the book shows it: the test's 95% interval and p as numbers, the per-seed values as text."""
    out = growth.drop(columns=list(GROWTH_HIDDEN))
    out.insert(out.columns.get_loc("verdict"), "95% CI", [_interval(c) for c in growth.comparison])
    out.insert(out.columns.get_loc("verdict"), "p", [c.p for c in growth.comparison])
    out["slope per seed"] = [_values(v, "+.2f") for v in growth.slopes]
    out["Spearman per seed"] = [_values(v, "+.2f") for v in growth.spearman]
    out["peak t per seed"] = [_values(v, ".2f") for v in growth.peak_time]
    return out


def _interval(c) -> str:
    """``[-0.12, +0.40]``; empty without one (untested, or an exact test where the seeds have no spread)."""
    return "" if c.untested or not np.isfinite(c.low) else f"[{c.low:+.2f}, {c.high:+.2f}]"


def _values(values, fmt: str) -> str:
    return ", ".join("n/a" if not np.isfinite(v) else format(v, fmt) for v in values)


def _peak_time(ds: xr.Dataset, matrix: str) -> float:
    """The depth fraction at which the head-mean log radius of ``matrix`` is largest."""
    eig = "ffn_eig" if matrix == "ffn" else "eig"
    rho = np.abs(ds[matrix]).max(eig).values
    y = np.log(rho).reshape(ds.sizes[depth_dim(ds)], -1).mean(axis=1)
    return float(ds["time"].values[int(np.argmax(y))])


def _growth_phrase(comparison, slopes: Sequence[float]) -> str:
    if all(s == 0 for s in slopes):
        return "is constant"
    if comparison.untested:
        return f"is untested ({comparison.verdict.split(': ', 1)[1]})"
    if not comparison.significant:
        return "shows no trend its seeds can tell from their spread (inconclusive)"
    return "grows with depth" if comparison.difference > 0 else "shrinks with depth"


def growth_words(row) -> str:
    """One row of ``depth_growth`` in words: ``slope -1.20 per unit t (x0.37 over the grid), 95% CI [-2.1, -0.3],
    p = 0.03, one-sample t-test over 3 seeds: significant``; untested: ``slope -1.20 per unit t (x0.37 over the
    grid): untested: 1 seed``."""
    c = row["comparison"]
    head = f"slope {row['slope']:+.2f} per unit t (x{row['factor']:.2f} over the grid)"
    if c.untested:
        return f"{head}: {c.verdict}"
    return f"{head}, {c.interval(2)} over {c.n} seeds: {c.verdict}"


def growth_verdict(growth: pd.DataFrame, model: str = "ours"):
    """The verdict (``claims.Verdict``) on Fig. 2a-b's claim that the magnitudes of the QK and OV eigenvalues grow
    with t (``claims.CLAIMS["f2_growth"]``): the intersection-union test of the QK and the OV slopes over the seeds
    (``depth_growth``), decided by the one against the claim or with the larger p."""
    rows = growth[growth.model == model].set_index("matrix")
    return claims.intersection("f2_growth", {f"the {m.upper()} radius": rows.loc[m, "comparison"] for m in ("qk", "ov")})


def verdicts(layers: Mapping[str, Sequence[xr.Dataset]], *, ode: str = "ours") -> dict:
    """The verdict on F2's claim (``claims.CLAIMS["f2_growth"]``): ``growth_verdict`` of ``depth_growth``."""
    return {"f2_growth": growth_verdict(depth_growth(layers), ode)}


def headline(layers: Mapping[str, Sequence[xr.Dataset]], zoom: xr.Dataset | None = None, *,
             ode: str = "ours") -> dict[str, str]:
    """The numbers (as text) that the book's prose quotes about spectra, keyed for ``figures.glue``.

    ``layers``: every model's spectra on its own depth grid, one dataset per seed (``seed_spectra``); ``zoom``: the
    ODE's spectra on a grid that resolves e(t) (``resolving_times``), an interpolation between its Euler steps;
    ``ode``: the key of the DiffEqFormer whose growth the verdict judges. Keys, per model key k and matrix m (qk,
    ov, ffn), from ``depth_growth``: ``trend_k_m`` (a phrase), ``growth_k_m`` (``growth_words``), ``spearman_k_m``,
    ``peak_k_m`` and ``positivity_k_m`` (per seed), ``change_layers_k_m`` (mean relative change between neighbouring
    depth points, mean over seeds), ``seeds_k``; ``points`` (the ODE's Euler steps L) (``verdicts`` judges the
    claim); with ``zoom``: ``change_zoom_m``, ``zoom_spacing``, ``period`` (2 pi / s).
    """
    growth = depth_growth(layers)
    out = {}
    for row in growth.itertuples(index=False):
        key = f"{row.model}_{row.matrix}"
        out[f"trend_{key}"] = row.trend
        out[f"growth_{key}"] = growth_words(row._asdict())
        out[f"spearman_{key}"] = _values(row.spearman, "+.2f")
        out[f"peak_{key}"] = _values(row.peak_time, ".2f")
        out[f"positivity_{key}"] = _values(row.positivity, "+.2f")
        out[f"change_layers_{key}"] = f"{row.change:.2f}"
        out[f"seeds_{row.model}"] = str(row.seeds)
    out["points"] = str(layers[ode][0].sizes[depth_dim(layers[ode][0])])
    if zoom is not None:
        zoom_change = mean_change(zoom)
        for m in MATRICES:
            out[f"change_zoom_{m}"] = f"{float(zoom_change[m]):.3f}"
        out["zoom_spacing"] = f"{float(np.diff(zoom['time'].values).mean()):.2g}"
        out["period"] = f"{2 * np.pi / config_of(zoom).sinusoidal_scale:.2g}"
    return out



def save_spectra(ds: xr.Dataset, path: str | Path) -> Path:
    """Write a spectra dataset to netCDF (``.nc``, ``numerics.save_netcdf``); complex variables become
    ``<name>_real`` and ``<name>_imag``.

    NetCDF has no complex type, so each complex variable is split into two float64 variables that ``load_spectra``
    joins again; the attrs (configuration, conventions) travel with the file.
    """
    return save_netcdf(ds, path)


def load_spectra(path: str | Path) -> xr.Dataset:
    """Read a dataset written by ``save_spectra``, with complex variables and int64 coordinates restored."""
    ds = load_netcdf(path)
    for coord in ds.coords:  # files written before save_netcdf marked them: every int32 coordinate was int64
        if ds[coord].dtype == np.int32:
            ds[coord] = ds[coord].astype(np.int64)
    return ds[[n for n in MATRICES if n in ds.data_vars] + [n for n in ds.data_vars if n not in MATRICES]]


def cached_spectra(model, cache_dir: str | Path, times=None, **kwargs) -> xr.Dataset:
    """``spectra(model, times, **kwargs)``, read from ``cache_dir/spectra-<hash>.nc`` when it was computed before.

    The hash covers the model's configuration and weights (``numerics.fingerprint``), the times and the keyword
    arguments.
    """
    key = {"model": fingerprint(model), "times": None if times is None else np.asarray(times, np.float64).tolist(),
           **kwargs}
    return cached(cache_dir, "spectra", key, lambda: spectra(model, times, **kwargs), save=save_spectra,
                  load=load_spectra, suffix=".nc")


# ---------------------------------------------------------------------------------------------------------------------
# Plots: cheap functions of the data above, each returning a matplotlib Figure (no pyplot state is touched).


def _euler_times(ds: xr.Dataset) -> np.ndarray:
    """The Euler steps' times t_k = (k+1)/L of the model a dataset was computed from (empty without its config)."""
    num_layers = json.loads(ds.attrs["config"]).get("num_layers") if "config" in ds.attrs else None
    return (np.arange(num_layers or 0) + 1.0) / (num_layers or 1)


def _interpolated(ds: xr.Dataset) -> bool:
    """Whether a continuous model's dataset holds times off its Euler grid, where training never evaluated W(t)."""
    if depth_dim(ds) == "layer":
        return False
    euler = _euler_times(ds)
    return not all(np.isclose(euler, t, rtol=0, atol=1e-9).any() for t in ds["time"].values)


def _depth_label(ds, x: str | None = None) -> str:
    """The x-axis label: layer index, the depth fraction of a layer, an Euler step's time, or t off the Euler grid
    (said to be an interpolation: training only ever evaluated W(t) at its Euler steps)."""
    x = x or depth_dim(ds)
    ode = ds.attrs.get("model_kind", "").startswith("diffeqformer")
    if x == "layer":
        return "Euler step k" if ode else "layer k"
    if depth_dim(ds) == "layer":
        return "Euler step $t_k = (k+1)/L$" if ode else "depth $(k+1)/L$ of layer k"
    return "t (interpolation between the Euler steps)" if _interpolated(ds) else "Euler step $t_k$"


def _model_label(ds) -> str:
    return {
        "diffeqformer": "DiffEqFormer",
        "diffeqformer-shared": "weight-shared DiffEqFormer",
        "diffeqformer-discrete": "discretised DiffEqFormer",
        "gpt2": "GPT-2",
        "llama": "Llama",
    }.get(ds.attrs.get("model_kind", ""), ds.attrs.get("model_kind", "model"))


def _panels(n: int, nrows: int = 1, *, width: float = 3.0, height: float = 2.6):
    from matplotlib.figure import Figure

    ncols = n
    fig = Figure(figsize=(max(width * ncols + 1.0, 7.0), height * nrows + 0.8), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False, sharex=True)
    return fig, axes


def _points(ds: xr.Dataset, matrix: str, x: str):
    """Per panel (head, or the one FFN panel): flat arrays of depth coordinate and eigenvalue."""
    lam = ds[matrix]
    xs = ds[x].values
    if matrix == "ffn":
        lam = lam.expand_dims(head=[0], axis=1)
    values = lam.values  # [N, H, E]
    _, heads, e = values.shape
    return [(np.repeat(xs, e), values[:, h, :].reshape(-1)) for h in range(heads)]


def _mark_layers(ax, ds: xr.Dataset, x: str) -> None:
    """Faint vertical lines at the Euler steps' times t_k = (k+1)/L, on plots against continuous t."""
    if x != "time" or depth_dim(ds) != "time":
        return
    lo, hi = float(ds["time"].min()), float(ds["time"].max())
    for t in _euler_times(ds):
        if lo <= t <= hi:
            ax.axvline(t, color="0.85", lw=0.8, zorder=0)


def plot_vs_depth(ds: xr.Dataset, matrix: str = "qk", part: str = "real", *, x: str | None = None,
                  logy: bool = False, axes_row=None, colorbar: bool = True) -> "Figure":
    r"""Eigenvalues of ``matrix`` against depth, one panel per head (Fig. 2a: ``part="real"``; 2b: ``part="abs"``).

    Each dot is one eigenvalue at one t (or layer). ``part="real"``: Re lambda, coloured by |lambda|;
    ``part="abs"``: |lambda|, coloured by Re lambda / |lambda| = cos(arg lambda) (red: positive real, blue:
    negative real, white: imaginary). ``x`` picks the depth coordinate: ``"time"`` (t, or (k+1)/L for layers) or
    ``"layer"``; by default the dataset's own depth dimension. ``logy``: log-scale magnitudes (``part="abs"``; the
    axis then starts at 1e-3 of the largest). On plots against continuous t, faint vertical lines mark the times
    t_k = (k+1)/L of the model's Euler steps.
    """
    if matrix not in MATRICES or part not in ("real", "abs"):
        raise ValueError(f"matrix must be one of {MATRICES} and part 'real' or 'abs', got {matrix!r}, {part!r}")
    x = x or depth_dim(ds)
    panels = _points(ds, matrix, x)
    standalone = axes_row is None
    if standalone:
        fig, axes = _panels(len(panels))
        axes_row = axes[0]
    else:
        fig = axes_row[0].figure
    from matplotlib.colors import Normalize

    mags = np.abs(ds[matrix].values)
    if part == "real":
        norm, cmap, clabel = Normalize(0.0, float(mags.max()) or 1.0), "viridis", r"$|\lambda|$"
    else:
        norm, cmap, clabel = Normalize(-1.0, 1.0), "coolwarm", r"Re$\,\lambda\,/\,|\lambda|$"
    for h, (ax, (xs, lam)) in enumerate(zip(axes_row, panels)):
        mag = np.abs(lam)
        if part == "real":
            y, c = lam.real, mag
        else:
            y, c = mag, np.divide(lam.real, mag, out=np.zeros_like(mag), where=mag > 0)
        order = np.argsort(mag)  # large eigenvalues drawn last, on top
        size = 4 if ds.sizes[depth_dim(ds)] > 48 else 10  # few depth points (an Euler grid): larger dots
        sc = ax.scatter(xs[order], y[order], c=c[order], cmap=cmap, norm=norm, s=size, linewidths=0)
        if part == "real":
            ax.axhline(0.0, color="0.6", lw=0.6, zorder=0)
        elif logy:
            ax.set_yscale("log")
            ax.set_ylim(1e-3 * (float(mags.max()) or 1.0), 2.0 * (float(mags.max()) or 1.0))
        _mark_layers(ax, ds, x)
        ax.set_title(f"{TITLES[matrix]}, head {h}" if matrix != "ffn" else TITLES[matrix], fontsize=9)
    if standalone:
        fig.supxlabel(_depth_label(ds, x), fontsize=10)
    axes_row[0].set_ylabel(r"Re $\lambda$" if part == "real" else r"$|\lambda|$")
    if colorbar:
        fig.colorbar(sc, ax=list(axes_row), label=clabel, shrink=0.9)
    what = "real part" if part == "real" else "magnitude"
    where = " (interpolation in t)" if _interpolated(ds) else ""
    fig.suptitle(f"{_model_label(ds)}: {what} of the eigenvalues of {TITLES[matrix]} against depth{where}")
    return fig


def plot_complex_plane(ds: xr.Dataset, matrix: str = "qk") -> "Figure":
    """Eigenvalues of ``matrix`` in the complex plane, one panel per head, coloured by depth (t or layer)."""
    if matrix not in MATRICES:
        raise ValueError(f"matrix must be one of {MATRICES}, got {matrix!r}")
    dim = depth_dim(ds)
    panels = _points(ds, matrix, dim)
    fig, axes = _panels(len(panels), width=3.0, height=3.0)
    from matplotlib.colors import Normalize

    depth = ds[dim].values
    norm = Normalize(float(depth.min()), float(depth.max()) if depth.max() > depth.min() else float(depth.min()) + 1)
    for h, (ax, (xs, lam)) in enumerate(zip(axes[0], panels)):
        sc = ax.scatter(lam.real, lam.imag, c=xs, cmap="plasma", norm=norm, s=4, linewidths=0)
        ax.axhline(0.0, color="0.6", lw=0.6, zorder=0)
        ax.axvline(0.0, color="0.6", lw=0.6, zorder=0)
        ax.set_title(f"{TITLES[matrix]}, head {h}" if matrix != "ffn" else TITLES[matrix], fontsize=9)
        ax.set_xlabel(r"Re $\lambda$")
    axes[0, 0].set_ylabel(r"Im $\lambda$")
    fig.colorbar(sc, ax=list(axes[0]), label=_depth_label(ds), shrink=0.9)
    fig.suptitle(f"{_model_label(ds)}: eigenvalues of {TITLES[matrix]} in the complex plane")
    return fig


def plot_comparison(datasets: Mapping[str, xr.Dataset], matrix: str = "qk", part: str = "real", *,
                    logy: bool = False) -> "Figure":
    r"""One row of ``plot_vs_depth`` panels per model, all against the depth fraction ``time`` (t, or (k+1)/L).

    For the ODE model against a GPT: the ODE's eigenvalues at its Euler steps (or, labelled as an interpolation, at
    any t) next to the GPT's at its layers, on the same axes. Rows are labelled with the mapping's keys; each row
    keeps its own y range (a trained ODE's weights need not be on a GPT's scale).
    """
    names = list(datasets)
    n_panels = max(1 if matrix == "ffn" else ds.sizes["head"] for ds in datasets.values())
    fig, axes = _panels(n_panels, nrows=len(names))
    for row, name in enumerate(names):
        ds = datasets[name]
        plot_vs_depth(ds, matrix, part, x="time", logy=logy, axes_row=axes[row], colorbar=True)
        axes[row, 0].set_ylabel(f"{name}\n" + (r"Re $\lambda$" if part == "real" else r"$|\lambda|$"))
    ode = ("t, interpolated between the ODE's Euler steps" if any(_interpolated(ds) for ds in datasets.values())
           else "Euler step $t_k$ (ODE)")
    fig.supxlabel(f"depth: {ode} or $(k+1)/L$ (layer k)", fontsize=10)
    what = "real part" if part == "real" else "magnitude"
    fig.suptitle(f"{what} of the eigenvalues of {TITLES[matrix]}: " + " vs ".join(names))
    return fig


def plot_summary(summary: pd.DataFrame, stat: str = "spectral_radius") -> "Figure":
    """One summary statistic (a column of ``summarize``) against depth: a panel per matrix, a line per head."""
    if stat not in summary.columns:
        raise ValueError(f"{stat!r} is not a column of the summary")
    dim = "layer" if "layer" in summary.columns else "time"
    fig, axes = _panels(len(MATRICES), width=3.4)
    for ax, name in zip(axes[0], MATRICES):
        sub = summary[summary["matrix"] == name]
        if name == "ffn":
            ax.plot(sub[dim], sub[stat], marker="." if dim == "layer" else None, color="k", label="FFN")
        else:
            for h, g in sub.groupby("head"):
                ax.plot(g[dim], g[stat], marker="." if dim == "layer" else None, lw=1, label=f"head {h}")
            ax.legend(fontsize=7)
        ax.set_title(TITLES[name], fontsize=9)
        ax.set_xlabel("layer k" if dim == "layer" else "t")
    axes[0, 0].set_ylabel(stat.replace("_", " "))
    fig.suptitle(f"{stat.replace('_', ' ')} of each head's QK and OV matrices and of the FFN product against depth")
    return fig


def plot_growth(models: Mapping[str, Sequence[xr.Dataset]]) -> "Figure":
    r"""What ``depth_growth`` judges: the heads' geometric-mean spectral radius :math:`\exp \overline{\log\rho}`
    of QK and OV (and the FFN's radius) against depth, a row per model (the mapping's keys label the rows), a line
    per seed, at the model's own depth points (a DiffEqFormer's Euler steps t_k, a baseline's layers at (k+1)/L)."""
    from matplotlib.ticker import FuncFormatter

    fig, axes = _panels(len(MATRICES), nrows=len(models), width=3.4, height=2.2)
    for row, (name, datasets) in enumerate(models.items()):
        for seed, ds in enumerate(datasets):
            for ax, m in zip(axes[row], MATRICES):
                rho = np.abs(ds[m]).max("ffn_eig" if m == "ffn" else "eig").values
                radius = np.exp(np.log(rho).reshape(len(ds["time"]), -1).mean(axis=1))
                ax.plot(ds["time"].values, radius, marker="o", ms=3, lw=1, label=f"seed {seed}")
        for ax, m in zip(axes[row], MATRICES):
            ax.set_yscale("log")
            low, high = ax.get_ylim()
            if high < 10 * low:  # less than a decade: plain numbers, not 5.75 x 10^-1
                for setter in (ax.yaxis.set_major_formatter, ax.yaxis.set_minor_formatter):
                    setter(FuncFormatter(lambda v, _: f"{v:.3g}"))
            ax.grid(alpha=0.3, which="both")
            if row == 0:
                ax.set_title(TITLES[m], fontsize=9)
        axes[row, 0].set_ylabel(f"{name}\nradius (head mean)")
        axes[row, -1].legend(fontsize=7)
    fig.supxlabel("depth: Euler step $t_k$ (ODE) or $(k+1)/L$ (layer k)", fontsize=10)
    fig.suptitle("Spectral radius against depth, one line per seed (geometric mean over heads; log scale)")
    return fig
