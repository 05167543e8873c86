"""Eigenvalue spectra of the attention and feed-forward weights along depth (paper Section 5.1, Fig. 2a/2b, App. E).

The matrices and conventions are those of ``CONVENTION`` (rows act on the right, y = x W): QK^h = W_Q^h (W_K^h)^T,
OV^h = W_V^h W_O^h and FFN = W_1 W_2, without the 1/sqrt(d_k) scale, biases, RoPE and (unless ``fold_norm``) the norm
gains. The eigenvalue index ranks them at each depth; it does not follow one through a crossing. Growth with depth
(``depth_growth``) is judged over seeds, each model on its own grid: a DiffEqFormer at its Euler steps (k+1)/L, the
only times training evaluated W(t).
"""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import draccus
import haliax as hax
import jax.numpy as jnp
import numpy as np
import pandas as pd
import xarray as xr
from haliax import NamedArray

from ..model.transformer import DiffEqFormerLMHeadModel, DiscreteDiffEqFormerLMHeadModel
from ..cache import cached, fingerprint, load_netcdf, save_netcdf
from ..numerics import check_positive_int, one_blas_thread
from . import claims

MATRICES = ("qk", "ov", "ffn")
"""The data variables of a spectra dataset."""

DESCRIPTIONS = {
    "qk": "eigenvalues of the QK matrix W_Q^h W_K^h^T (D x D, rank <= d_k): score(x, x') = x W_Q^h W_K^h^T x'^T",
    "ov": "eigenvalues of the OV matrix W_V^h W_O^h (D x D, rank <= d_k): head output = sum_j a_j x_j W_V^h W_O^h",
    "ffn": "eigenvalues of the feed-forward product W_1 W_2 (D x D; Llama/SwiGLU: W_gate W_down)",
}
"""What each data variable holds (also stored in the dataset's attrs)."""

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


def _weights(kind: str, blocks, lead: str, fold_norm: bool) -> _Weights:
    """The stacked blocks' matrices; with ``fold_norm``, LN(x) W = x_hat diag(gamma) W: the rows of the maps fed by a
    norm scaled by its gain."""
    if kind == "gpt2":
        qkv = _np(blocks.attn.c_attn.weight, (lead, "qkv", "heads", "embed", "head_size"))  # qkv: 0 = q, 1 = k, 2 = v
        wo = _np(blocks.attn.c_proj.weight, (lead, "heads", "head_size", "embed"))
        w = _Weights(qkv[:, 0], qkv[:, 1], qkv[:, 2], wo, *_mlp(blocks.mlp, lead))
        norms = blocks.ln_1, blocks.ln_2
    elif kind == "llama":
        w = _Weights(*_levanter_attention(blocks.self_attn, lead), *_mlp(blocks.mlp, lead))
        norms = blocks.input_layernorm, blocks.post_attention_layernorm
    else:  # a DiffEqFormer's ParallelBlock
        w = _Weights(*_levanter_attention(blocks.attn, lead), *_mlp(blocks.mlp, lead))
        norms = blocks.attn_norm, blocks.mlp_norm
    if not fold_norm:
        return w
    ga, gm = _gain(norms[0], lead)[:, None, :, None], _gain(norms[1], lead)[:, :, None]
    return _Weights(w.wq * ga, w.wk * ga, w.wv * ga, w.wo, w.w1 * gm, w.w2)


def _sorted(lam: np.ndarray) -> np.ndarray:
    """Sort the last axis by decreasing |lambda|, then decreasing imaginary part."""
    order = np.lexsort((-lam.imag, -np.abs(lam)), axis=-1)
    return np.take_along_axis(lam, order, axis=-1)


def product_eigvals(a: np.ndarray, b: np.ndarray, method: str = "fast") -> np.ndarray:
    r"""Eigenvalues (complex128, by decreasing magnitude) of the n x n product A B, A: [..., n, r], B: [..., r, n]:
    all n (``"full"``), or the min(n, r) that can be nonzero (``"fast"``: those of B A when r < n)."""
    if method not in ("fast", "full"):
        raise ValueError(f"method must be 'fast' or 'full', got {method!r}")
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    n, r = a.shape[-2], a.shape[-1]
    if b.shape[-2:] != (r, n):
        raise ValueError(f"shapes {a.shape} and {b.shape} do not make a square product")
    m = a @ b if method == "full" or n <= r else b @ a
    if m.size == 0:
        return _sorted(np.zeros(m.shape[:-1], dtype=np.complex128))
    with one_blas_thread():  # LAPACK's geev through NumPy
        return _sorted(np.linalg.eigvals(m).astype(np.complex128))


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
    kind = {"Gpt2LMHeadModel": "gpt2", "LlamaLMHeadModel": "llama"}.get(type(model).__name__)
    if kind is None:
        raise TypeError(f"no spectra for {type(model).__name__}: expected a DiffEqFormer (continuous or discretised), "
                        "Levanter's Gpt2LMHeadModel or LlamaLMHeadModel")
    return kind


def _ode_weights(model: DiffEqFormerLMHeadModel, times: np.ndarray, method: str, fold_norm: bool, batch_size: int):
    """Eigenvalues at each of ``times``, materialising W(t) for ``batch_size`` times at once."""
    parts = []
    for start in range(0, len(times), batch_size):
        t = hax.named(jnp.asarray(times[start : start + batch_size], dtype=jnp.float32), "time")
        parts.append(_eigvals(_weights("ode", model.weights_at(t), "time", fold_norm), method))
    return {k: np.concatenate([p[k] for p in parts]) for k in MATRICES}


def _dataset(lam: dict[str, np.ndarray], dim: str, coords: dict, attrs: dict) -> xr.Dataset:
    n_heads, n_eig = lam["qk"].shape[1:]
    data = {m: ((dim, "ffn_eig") if m == "ffn" else (dim, "head", "eig"), lam[m], {"description": DESCRIPTIONS[m]})
            for m in MATRICES}
    coords = {**coords, "head": np.arange(n_heads), "eig": np.arange(n_eig), "ffn_eig": np.arange(lam["ffn"].shape[-1])}
    return xr.Dataset(data, coords=coords, attrs=attrs)


def spectra(model, times=None, *, method: str = "fast", fold_norm: bool = False, batch_size: int = 32) -> xr.Dataset:
    r"""Eigenvalues of every head's QK and OV matrices and of the feed-forward product along depth, of a DiffEqFormer
    (continuous or discretised) or Levanter's GPT-2 / Llama: ``qk``, ``ov`` [layer | time, head, eig] and ``ffn``
    [layer | time, ffn_eig]. With ``times=None`` one entry per layer (coordinate ``time`` = (k+1)/L); with ``times``
    (the continuous model only) W(t) at those times, ``batch_size`` at once. ``attrs``: model, config, conventions."""
    kind = _model_kind(model)
    check_positive_int(batch_size, "batch_size")
    attrs = {"model_kind": kind, "model_class": f"{type(model).__module__}.{type(model).__qualname__}",
             **_config_attrs(model), "method": method, "fold_norm": int(fold_norm), "convention": CONVENTION,
             "matrices": json.dumps(DESCRIPTIONS)}
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
    else:
        blocks = model.transformer.layers if kind == "llama" else model.transformer.blocks
        lam = _eigvals(_weights(kind, blocks.stacked, blocks.Block.name, fold_norm), method)
    coords = {"layer": np.arange(num_layers), "time": ("layer", layer_time)}
    return _dataset(lam, "layer", coords, attrs)


def depth_dim(ds: xr.Dataset) -> str:
    """The depth dimension of a spectra dataset (or summary): ``"time"`` or ``"layer"``."""
    return "layer" if "layer" in ds.dims else "time"


def summarize(ds: xr.Dataset, *, rtol: float = 1e-6) -> pd.DataFrame:
    r"""Per (depth, matrix, head; <NA> for ``ffn``): ``spectral_radius`` rho, ``max_real``, ``min_real``,
    ``n_nonzero`` (|lambda| > rtol rho), ``frac_positive_real``, ``positivity`` = sum Re lambda / sum |lambda|."""
    dim = depth_dim(ds)
    frames = []
    for name in MATRICES:
        lam = ds[name]
        eig = "ffn_eig" if name == "ffn" else "eig"
        mag = np.abs(lam)
        rho = mag.max(eig)
        nonzero = mag > rtol * rho
        n_nonzero = nonzero.sum(eig)
        stats = xr.Dataset({"spectral_radius": rho, "max_real": lam.real.max(eig), "min_real": lam.real.min(eig),
                            "n_nonzero": n_nonzero,
                            "frac_positive_real": (lam.real > rtol * rho).sum(eig) / n_nonzero.where(n_nonzero > 0),
                            "positivity": lam.real.sum(eig) / mag.sum(eig).where(rho > 0)})
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
    r"""How much each spectrum moves between consecutive depth points, one row per (step, matrix, head): ``change`` =
    || |lambda|_{k+1} - |lambda|_k || / max(|| |lambda|_k ||, || |lambda|_{k+1} ||) of the sorted magnitudes."""
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
    """Mean of ``spectral_change`` over steps and heads, per matrix; it depends on the grid (compare like grids)."""
    change = spectral_change(ds)
    return change.groupby("matrix", sort=False)["change"].mean().reindex(list(MATRICES))


def depth_trends(summary: pd.DataFrame, stats: Sequence[str] = ("spectral_radius", "positivity")) -> pd.DataFrame:
    r"""How each statistic of ``summarize`` moves with depth, one row per (matrix, head, stat): ``spearman`` (with
    ``time``; NaN when constant), ``first``, ``last``, ``mean``, ``peak_time`` (depth of its maximum), ``points``."""
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


def resolving_times(ds_or_config, points: int, *, center: float = 0.5, per_period: int = 8) -> np.ndarray:
    """``points`` times around ``center``, ``per_period`` per period 2 pi / s of the time embedding's fastest sinusoid
    (of a config or a spectra dataset's): a grid that follows W(t) between two Euler steps."""
    config = config_of(ds_or_config) if isinstance(ds_or_config, xr.Dataset) else ds_or_config
    if points < 2 or per_period < 1:
        raise ValueError(f"need points >= 2 and per_period >= 1, got {points}, {per_period}")
    step = 2 * np.pi / config.sinusoidal_scale / per_period
    return center + step * (np.arange(points) - (points - 1) / 2)


def seed_spectra(runs: Mapping[str, object], *, cache_dir: str | Path | None = None,
                 **kwargs) -> dict[str, list[xr.Dataset]]:
    """``{label: run or seed runs}`` -> ``{label: [spectra of each seed's model]}`` on its own depth grid, cached in
    ``cache_dir``; keyword arguments go to ``spectra``."""
    from ..runs import load_model, run_path
    from .statistics import as_list

    def one(run):
        model = load_model(run_path(run))
        return cached_spectra(model, cache_dir, **kwargs) if cache_dir is not None else spectra(model, **kwargs)

    return {label: [one(run) for run in as_list(value)] for label, value in runs.items()}


def log_radius(ds: xr.Dataset, matrix: str) -> np.ndarray:
    r"""The heads' mean log spectral radius of ``matrix`` at each depth point [N] (the log of their geometric mean,
    which weighs every head alike whatever its scale)."""
    rho = np.abs(ds[matrix]).max("ffn_eig" if matrix == "ffn" else "eig").values  # [N] or [N, H]
    if not np.all(rho > 0):
        raise ValueError(f"{matrix}: a spectral radius of 0 has no logarithm")
    return np.log(rho).reshape(ds.sizes[depth_dim(ds)], -1).mean(axis=1)


def log_radius_slope(ds: xr.Dataset) -> dict[str, float]:
    r"""Per matrix, the least-squares slope of ``log_radius`` against the depth fraction ``time`` (exactly 0 for a
    spectrum constant along depth)."""
    t = ds["time"].values.astype(np.float64)
    if t.size < 2:
        raise ValueError("a slope along depth needs at least two depth points")
    tc = t - t.mean()
    out = {}
    for name in MATRICES:
        y = log_radius(ds, name)
        # equal radii at every depth: exactly no slope (y - mean(y) can be rounding noise instead of 0)
        out[name] = 0.0 if np.ptp(y) == 0 else float(tc @ (y - y.mean()) / (tc @ tc))
    return out


def depth_growth(models: Mapping[str, Sequence[xr.Dataset]]) -> pd.DataFrame:
    r"""Whether the spectral radii grow with depth, one row per (model, matrix) of ``{label: [spectra of each seed]}``:
    the seed is the unit (a model's depth points are not independent draws), the one-sample t-test of the seeds'
    ``log_radius_slope`` against 0. Columns: ``slope`` (mean), ``factor`` (e^{slope * span}), ``verdict``, ``change``
    (``mean_change``), ``comparison``, and per seed ``slopes``, ``spearman``, ``peak_time``, ``positivity``."""
    from .statistics import as_list, one_sample

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
                "change": float(np.mean([ch[m] for ch in changes])), "comparison": c, "slopes": tuple(per_seed),
                "spearman": tuple(float(r.spearman.median()) for r in radius),
                "peak_time": tuple(float(ds["time"].values[int(np.argmax(log_radius(ds, m)))]) for ds in datasets),
                "positivity": tuple(float(p.spearman.median()) for p in positivity),
            })
    return pd.DataFrame(rows)


def verdicts(layers: Mapping[str, Sequence[xr.Dataset]], *, ode: str = "ours") -> dict:
    """The verdict on F2's claim that the QK and OV eigenvalues grow with t: the intersection-union test of both
    slopes of ``depth_growth`` of model ``ode``."""
    growth = depth_growth(layers)
    rows = growth[growth.model == ode].set_index("matrix")
    return {"f2_growth": claims.intersection("f2_growth", {f"the {m.upper()} radius": rows.loc[m, "comparison"]
                                                           for m in ("qk", "ov")})}


def load_spectra(path: str | Path) -> xr.Dataset:
    """Read a dataset written by ``cache.save_netcdf``, its spectra first (``MATRICES``; netCDF may reorder them)."""
    ds = load_netcdf(path)
    return ds[[n for n in MATRICES if n in ds.data_vars] + [n for n in ds.data_vars if n not in MATRICES]]


def cached_spectra(model, cache_dir: str | Path, times=None, **kwargs) -> xr.Dataset:
    """``spectra(model, times, **kwargs)``, cached in ``cache_dir`` by the model's configuration and weights
    (``cache.fingerprint``), the times and the keyword arguments."""
    key = {"model": fingerprint(model), "times": None if times is None else np.asarray(times, np.float64).tolist(),
           **kwargs}
    return cached(cache_dir, "spectra", key, lambda: spectra(model, times, **kwargs), save=save_netcdf,
                  load=load_spectra, suffix=".nc")
