"""The particle dynamics of ``analysis.trajectories`` driven by one head of a trained DiffEqFormer (Fig. 2d): A(t)
and B(t) are the head's QK and OV matrices at every solver stage, in the model's width D; the rest of the block
(LayerNorm's affine part, biases, the MLP, the other heads) is left out, as in the paper's attention-only simulation.
Adaptive solves cap the step at a fraction of the time embedding's shortest period (``ModelTrajectoryConfig``)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import TYPE_CHECKING

import equinox as eqx
import haliax as hax
import jax
import jax.numpy as jnp
import numpy as np
import xarray as xr

from ..cache import cached, fingerprint, load_netcdf, save_netcdf

from ..numerics import one_blas_thread
from .trajectories import (ModelTrajectoryConfig, SolverConfig, attention_velocity, config_key, dataset_attrs, solve,
                           uniform_sphere)

if TYPE_CHECKING:
    from ..model.transformer import DiffEqFormerLMHeadModel


def model_attention_matrices(model: "DiffEqFormerLMHeadModel", t: hax.NamedArray, head: int):
    """The bilinear form A(t) = W_Q^h(t)^T W_K^h(t) / sqrt(head_size) and value map B(t) = W_O^h(t) W_V^h(t) of one
    head, each [..., D, D] (leading axes: those of t), so that the head's output at token i is
    sum_j softmax_j(x_i^T A x_j) B x_j (biases dropped): the paper's QK and OV matrices (W_Q W_K^T and W_V W_O in its
    row-vector convention)."""
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


def simulate_model(model: "DiffEqFormerLMHeadModel", config: ModelTrajectoryConfig = ModelTrajectoryConfig(), *,
                   cache_dir: Path | str | None = None) -> xr.Dataset:
    """Tokens moved by each head of ``config.heads`` (``model_attention_matrices``) from a start uniform on S^{D-1},
    cached in ``cache_dir`` by the configuration and the weights: ``x`` (head, time, token, dim), ``x_pca`` (on the
    head's top-3 principal components), ``pca_explained``, ``qk_radius``, ``ov_radius`` (max |eig| of A(t), B(t)),
    ``success``, ``num_steps``; attrs as ``trajectories.simulate``'s plus the model's."""
    model_key = fingerprint(model)
    return cached(cache_dir, "model-trajectories", {**config_key(config), "model": model_key},
                  lambda: _simulate_model(model, config, model_key), save=save_netcdf, load=load_netcdf, suffix=".nc")


def _solve_heads(model, config: ModelTrajectoryConfig, beta: float, dtmax: float | None):
    """Per head of ``config``: (x [time, token, D], num_steps, success, qk radius [time], ov radius [time])."""
    sphere = config.geometry == "sphere"
    ts = jnp.linspace(0.0, config.t1, config.num_saves + 1, dtype=jnp.float32)
    x0 = uniform_sphere(jax.random.PRNGKey(config.seed), config.num_tokens, model.config.hidden_dim)
    solver = dataclasses.replace(config.solver, num_steps=1)
    dt0 = jnp.float32(config.t1 / config.solver.num_steps)
    out = []
    for h in config.heads:
        head = jnp.asarray(h, dtype=jnp.int32)
        ys, n_steps, ok = _run_model(model, head, x0, ts, dt0, beta, solver, sphere, dtmax)
        a, b = _matrices_at(model, ts, head)
        # eigenvalues of non-symmetric matrices: numpy (jnp.linalg.eigvals is CPU-only), one BLAS thread
        with one_blas_thread():
            qk = np.abs(np.linalg.eigvals(np.asarray(a, dtype=np.float64))).max(axis=-1)
            ov = np.abs(np.linalg.eigvals(np.asarray(b, dtype=np.float64))).max(axis=-1)
        out.append((np.asarray(ys), int(n_steps), bool(ok), qk, ov))
    return out


def _simulate_model(model: "DiffEqFormerLMHeadModel", config: ModelTrajectoryConfig, model_key: str) -> xr.Dataset:
    mc = model.config
    D = mc.hidden_dim
    for h in config.heads:
        if h >= mc.num_heads:
            raise ValueError(f"head {h} does not exist: the model has {mc.num_heads} heads")
    beta = float(D) if config.beta is None else config.beta
    scale = model.time_embedding.scale
    dtmax = 2 * math.pi / (scale * config.steps_per_period) if config.solver.adaptive else None
    xs, steps, oks, qk_r, ov_r = zip(*_solve_heads(model, config, beta, dtmax))
    x = np.stack(xs)
    x_pca, explained = _pca3(x)
    return xr.Dataset(
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
        attrs=dataset_attrs(config, kind="model", dim=D, horizon=config.t1, beta_used=beta, dtmax=dtmax,
                            model_hidden_dim=D, model_num_heads=mc.num_heads, model_num_layers=mc.num_layers,
                            model_time_dependent=mc.time_dependent, model_sinusoidal_scale=float(scale),
                            model_fingerprint=model_key),
    )


@eqx.filter_jit
def _run_model(model, head, x0, ts, dt0, beta: float, solver: SolverConfig, sphere: bool, dtmax: float | None):
    # Module level, with the Python scalars static: repeated calls with the same shapes reuse the compiled solve.
    def field(t, x, head):
        a, b = model_attention_matrices(model, hax.named(jnp.asarray(t, dtype=x.dtype), ()), head)
        return attention_velocity(x, a, b, beta, sphere)

    return solve(field, x0, head, ts, dt0, solver, sphere, dtmax=dtmax)


@eqx.filter_jit
def _matrices_at(model, ts, head):
    return model_attention_matrices(model, hax.named(ts, "time"), head)


def _pca3(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x [heads, time, token, D] -> (coordinates on the top min(3, D) principal axes, explained variance fractions),
    per head, all times and tokens pooled and centred; NaN rows (failed solves) are left out of the fit."""
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


__all__ = ["model_attention_matrices", "simulate_model"]
