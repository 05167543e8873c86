"""x1: validation perplexity against the number of vector-field evaluations (NFE) of ODE solvers at inference.

A trained DiffEqFormer defines dx/dt = f(t, x) on [0, 1], so any solver may replace its L Euler steps. ``solver_sweep``
evaluates fixed-step solvers at N steps (``euler`` on the training grid, weights of step k at W((k+1)/N), so N = L
is the model's own forward pass; ``euler_left``, ``heun``, ``midpoint`` on the ODE itself) and adaptive Runge-Kutta
solvers (``tsit5``, ``dopri5``, ``bosh3``) with Diffrax's PID controller at rtol = atol = ``tolerance``, each
sequence solved on its own (``jax.vmap``) with its own steps.

NFE counts Diffrax's ``num_steps`` (accepted and rejected): s * num_steps for a fixed-step solver of s stages, and
1 + (s - 1) * num_steps for the FSAL adaptive ones, f(0, x_0) being evaluated once here and handed to Diffrax as the
solver state (``tests/test_inference.py`` counts the evaluations). The first step is the model's own 1/L; a solve
that reaches ``max_steps`` before t = 1 has no loss (NaN), counted in ``max_steps_hit``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import diffrax
import draccus
import equinox as eqx
import haliax as hax
import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
from haliax import Axis
from levanter.layers.attention import AttentionMask
from levanter.utils.tree_utils import inference_mode

from ..model.solve import solve_hidden
from ..model.transformer import DiffEqFormerLMHeadModel
from ..cache import cached, fingerprint
from ..numerics import check_positive_int

FIXED_SOLVERS = {"euler": 1, "euler_left": 1, "heun": 2, "midpoint": 2}
"""Fixed-step solvers and their stages (vector-field evaluations per step)."""
ADAPTIVE_SOLVERS = {"tsit5": 7, "dopri5": 7, "bosh3": 4}
"""Adaptive FSAL Runge-Kutta solvers and their stages (each step costs stages - 1 evaluations, see the module doc)."""

COLUMNS = (
    "solver", "adaptive", "steps", "tolerance", "nfe", "nfe_min", "nfe_max", "accepted_steps", "rejected_steps",
    "loss", "perplexity", "wall_s", "max_steps_hit", "num_sequences", "num_tokens",
)
"""Columns of a sweep's DataFrame, one row per (solver, steps) or (solver, tolerance): nfe, accepted_steps and
rejected_steps per sequence (mean; nfe also min, max), loss (nats per scored token; NaN if a sequence hit max_steps),
wall_s (after compilation), max_steps_hit (sequences that stopped at max_steps)."""

NFE_CONVENTION = (
    "NFE per sequence from Diffrax stats: fixed-step solvers stages * num_steps; FSAL adaptive solvers "
    "1 + (stages - 1) * num_steps with f(0, x0) evaluated once and passed as the solver state (num_steps counts "
    "accepted and rejected steps); initial step 1/L, no initial-step heuristic."
)


@dataclass(frozen=True)
class SweepConfig:
    """Which solvers, step counts and tolerances ``solver_sweep`` evaluates."""

    fixed_solvers: tuple[str, ...] = ("euler", "heun", "midpoint")
    """Fixed-step solvers (keys of ``FIXED_SOLVERS``)."""
    steps: tuple[int, ...] = (1, 2, 3, 4, 6, 8, 12, 16, 24)
    """Step counts N of the fixed-step solvers."""
    adaptive_solvers: tuple[str, ...] = ("tsit5",)
    """Adaptive solvers (keys of ``ADAPTIVE_SOLVERS``)."""
    tolerances: tuple[float, ...] = (1e-1, 1e-2, 1e-3, 1e-4)
    """rtol = atol of the PID controller."""
    max_steps: int = 4096
    """Cap on the steps (accepted + rejected) of one adaptive solve."""
    pcoeff: float = 0.4
    """Proportional coefficient of the PID controller (Diffrax's suggestion for non-stiff problems: 0.4)."""
    icoeff: float = 1.0
    """Integral coefficient of the PID controller."""
    batch_size: int = 16
    """Sequences solved together (one ``jax.vmap``): each gets its own adaptive steps, but a chunk runs until its
    slowest sequence is done, so wall times follow the slowest sequence of each chunk."""

    def __post_init__(self):
        for solver in self.fixed_solvers:
            _check_solver(solver, FIXED_SOLVERS, "fixed_solvers")
        for solver in self.adaptive_solvers:
            _check_solver(solver, ADAPTIVE_SOLVERS, "adaptive_solvers")
        for n in self.steps:
            check_positive_int(n, "steps")
        for tol in self.tolerances:
            _check_tolerance(tol, "tolerances")
        check_positive_int(self.max_steps, "max_steps")
        check_positive_int(self.batch_size, "batch_size")
        if not (self.pcoeff >= 0 and self.icoeff > 0):
            raise ValueError(f"pcoeff must be >= 0 and icoeff > 0, got {self.pcoeff!r}, {self.icoeff!r}")


@dataclass(frozen=True)
class TokenData:
    """Validation sequences: token ids, document (segment) ids and the loss mask, each [batch, seq]."""

    tokens: np.ndarray
    """int32 token ids."""
    segment_ids: np.ndarray
    """int32 document ids: attention does not cross a change (Levanter's packing of documents)."""
    loss_mask: np.ndarray
    """float32: 1 where position i is scored on predicting token i + 1 (Levanter: all but the last position)."""
    source: str = "array"
    """Where the tokens come from (a run directory, or 'array')."""

    @classmethod
    def from_tokens(cls, tokens, source: str = "array") -> "TokenData":
        """Plain token ids [batch, seq]: one document per sequence, every position but the last scored."""
        tokens = np.asarray(tokens)
        if tokens.ndim != 2 or not np.issubdtype(tokens.dtype, np.integer):
            raise ValueError(f"tokens must be an integer array [batch, seq], got {tokens.dtype}{list(tokens.shape)}")
        mask = np.ones(tokens.shape, np.float32)
        mask[:, -1] = 0.0
        return cls(tokens.astype(np.int32), np.zeros(tokens.shape, np.int32), mask, source)

    @property
    def num_sequences(self) -> int:
        return int(self.tokens.shape[0])

    def digest(self) -> str:
        """SHA-256 (16 hex digits) of the three arrays: part of the cache key of a sweep."""
        h = hashlib.sha256()
        for a in (self.tokens, self.segment_ids, self.loss_mask):
            h.update(np.ascontiguousarray(a).tobytes())
        return h.hexdigest()[:16]

    def describe(self) -> dict:
        return {"source": self.source, "num_sequences": self.num_sequences, "seq_len": int(self.tokens.shape[1]),
                "scored_tokens": int(self.loss_mask.sum()), "sha256": self.digest()}


def validation_data(run_dir: str | Path, num_sequences: int = 64) -> TokenData:
    """The first ``num_sequences`` sequences of a run's validation set (Levanter's validation cache, as its training
    evaluated them), with their document ids and loss masks."""
    from ..runs import config as run_config

    check_positive_int(num_sequences, "num_sequences")
    run_dir = Path(run_dir)
    config = run_config(run_dir)
    eval_sets = config.data.levanter_config().tagged_eval_sets(config.model.max_Pos)
    examples = []
    with jax.numpy_dtype_promotion("standard"):  # Levanter's LmExample.causal multiplies a bool mask by floats
        for dataset, _tags in eval_sets:
            sync = dataset.as_sync_dataset()
            take = min(len(sync), num_sequences - len(examples))
            examples += sync.get_batch(list(range(take)))
            if len(examples) == num_sequences:
                break
    if not examples:
        raise ValueError(f"{run_dir}: the validation set holds no sequence of length {config.model.max_seq_len}")

    def stack(get):
        return np.stack([np.asarray(get(e)) for e in examples])

    tokens = stack(lambda e: e.tokens.array).astype(np.int32)
    segments = examples[0].attn_mask.segment_ids
    seg = stack(lambda e: e.attn_mask.segment_ids[0].array) if segments is not None else np.zeros_like(tokens)
    mask = stack(lambda e: e.loss_weight.array).astype(np.float32)
    return TokenData(tokens, seg.astype(np.int32), mask, str(run_dir))


def as_token_data(data, model: DiffEqFormerLMHeadModel | None = None) -> TokenData:
    """``data`` as ``TokenData`` (a plain [batch, seq] int array becomes one document per sequence), checked
    against the model's vocabulary and maximum length."""
    data = data if isinstance(data, TokenData) else TokenData.from_tokens(data)
    if data.tokens.ndim != 2 or data.tokens.shape[1] < 2 or data.tokens.shape[0] < 1:
        raise ValueError(f"tokens must be [batch >= 1, seq >= 2], got shape {data.tokens.shape}")
    if not data.segment_ids.shape == data.loss_mask.shape == data.tokens.shape:
        raise ValueError("tokens, segment_ids and loss_mask must have the same shape")
    if model is not None:
        if data.tokens.shape[1] > model.config.max_seq_len:
            raise ValueError(f"sequences of {data.tokens.shape[1]} tokens exceed "
                             f"model.max_seq_len={model.config.max_seq_len}")
        if data.tokens.min() < 0 or data.tokens.max() >= model.Vocab.size:
            raise ValueError(f"token ids must be in [0, {model.Vocab.size})")
    if data.loss_mask.sum() <= 0:
        raise ValueError("loss_mask scores no token")
    return data


# --- Solving one chunk of sequences


def _check_solver(solver, known: Mapping[str, int], parameter: str = "solver") -> None:
    if solver not in known:
        raise ValueError(f"{parameter}: unknown solver {solver!r}; choose one of {tuple(known)}")


def _check_tolerance(tolerance, parameter: str = "tolerance") -> None:
    if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float, np.floating)) or not (
        math.isfinite(tolerance) and tolerance > 0
    ):
        raise ValueError(f"{parameter} must be positive and finite, got {tolerance!r}")


def _diffrax_solver(name: str) -> diffrax.AbstractSolver:
    return {
        "euler": diffrax.Euler, "euler_left": diffrax.Euler, "heun": diffrax.Heun, "midpoint": diffrax.Midpoint,
        "tsit5": diffrax.Tsit5, "dopri5": diffrax.Dopri5, "bosh3": diffrax.Bosh3,
    }[name]()


def nfe_from_stats(solver: str, num_steps):
    """Vector-field evaluations of one solve of ``solve_sequences`` from Diffrax's ``num_steps`` (see module doc)."""
    if solver in FIXED_SOLVERS:
        return FIXED_SOLVERS[solver] * num_steps
    _check_solver(solver, {**FIXED_SOLVERS, **ADAPTIVE_SOLVERS})
    return 1 + (ADAPTIVE_SOLVERS[solver] - 1) * num_steps


def _solve_one(model, tokens, segment_ids, dt0, tol, *, solver: str, max_steps: int, pcoeff: float, icoeff: float,
               field_hook=None):
    """Logits [seq, vocab] of one sequence with the ODE solved by ``solver`` (``solve.solve_hidden``), and Diffrax's
    step counts. ``field_hook(t)`` is called at every evaluation of the field, with the weights' time t."""
    Pos = Axis("position", tokens.shape[0])
    ids = hax.named(tokens, Pos)
    pos_ids = hax.arange(Pos, dtype=jnp.int32)
    mask = AttentionMask.causal().with_segment_ids(hax.named(segment_ids, Pos))
    x0 = model.embeddings.embed(ids, pos_ids)
    snap = solver == "euler"

    def time_map(t):
        if snap:  # the training grid: step k = round(t/h) uses W((k+1)/N), computed exactly as model.time_grid does
            n = 1.0 / dt0
            t = (jnp.round(t * n) + 1.0) / jnp.round(n)
        if field_hook is not None:
            field_hook(t)
        return t

    adaptive = solver in ADAPTIVE_SOLVERS
    controller = (diffrax.PIDController(rtol=tol, atol=tol, pcoeff=pcoeff, icoeff=icoeff) if adaptive
                  else diffrax.ConstantStepSize())
    x1, sol = solve_hidden(
        model, x0, mask, solver=_diffrax_solver(solver), dt0=dt0, stepsize_controller=controller, max_steps=max_steps,
        pos_ids=pos_ids, time_map=time_map, supply_first_stage=adaptive, throw=False,
    )
    logits = hax.dot(model.ln_f(x1), model.get_lm_head(), axis=model.Embed).rearrange((Pos, model.Vocab)).array
    hit = sol.result == diffrax.RESULTS.max_steps_reached
    stats = sol.stats
    return logits, (stats["num_steps"], stats["num_accepted_steps"], stats["num_rejected_steps"], hit)


def _token_losses(logits, tokens, loss_mask):
    """Summed next-token cross-entropy of one sequence: logits [seq, vocab] at i score tokens[i + 1]."""
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    targets = jnp.roll(tokens, -1)
    nll = -jnp.take_along_axis(logp, targets[:, None], axis=-1)[:, 0]
    return jnp.sum(nll * loss_mask)


@eqx.filter_jit
def _solve_batch(model, tokens, segment_ids, loss_mask, dt0, tol, *, solver: str, max_steps: int, pcoeff: float,
                 icoeff: float):
    """``_solve_one`` vmapped over sequences [batch, seq]: logits, summed losses per sequence, step counts."""
    one = lambda tok, seg: _solve_one(model, tok, seg, dt0, tol, solver=solver, max_steps=max_steps,  # noqa: E731
                                      pcoeff=pcoeff, icoeff=icoeff)
    logits, stats = jax.vmap(one)(tokens, segment_ids)
    return logits, jax.vmap(_token_losses)(logits, tokens, loss_mask), stats


def _chunks(data: TokenData, batch_size: int):
    """Chunks of ``batch_size`` sequences; the last is padded with copies of the first sequence, weight 0."""
    n = data.num_sequences
    for start in range(0, n, batch_size):
        idx = np.arange(start, start + batch_size)
        valid = idx < n
        idx = np.where(valid, idx, 0)
        yield data.tokens[idx], data.segment_ids[idx], data.loss_mask[idx] * valid[:, None], valid


def _run(model, data: TokenData, solver: str, config: SweepConfig, *, steps=None, tolerance=None):
    """Solve every sequence of ``data`` in chunks of ``config.batch_size``: summed loss, per-sequence stats, seconds."""
    adaptive = solver in ADAPTIVE_SOLVERS
    dt0 = jnp.float32(1.0 / (model.config.num_layers if adaptive else steps))
    tol = jnp.float32(tolerance if adaptive else 1.0)
    kw = dict(solver=solver, max_steps=config.max_steps, pcoeff=config.pcoeff, icoeff=config.icoeff)
    nll, stats = 0.0, []
    start = time.perf_counter()
    for tokens, seg, mask, valid in _chunks(data, config.batch_size):
        _, losses, chunk_stats = jax.block_until_ready(_solve_batch(model, tokens, seg, mask, dt0, tol, **kw))
        nll += float(np.sum(np.asarray(losses, np.float64)))
        stats.append([np.asarray(x)[valid] for x in chunk_stats])
    num_steps, accepted, rejected, hit = (np.concatenate(x) for x in zip(*stats))
    return nll, (num_steps.astype(np.int64), accepted, rejected, hit), time.perf_counter() - start


def _row(model, data: TokenData, solver: str, config: SweepConfig, *, steps=None, tolerance=None) -> dict:
    adaptive = solver in ADAPTIVE_SOLVERS
    nll, (num_steps, accepted, rejected, hit), wall = _run(model, data, solver, config, steps=steps,
                                                            tolerance=tolerance)
    nfe = nfe_from_stats(solver, num_steps)
    tokens = int(data.loss_mask.sum())
    loss = nll / tokens if not hit.any() else math.nan
    return {
        "solver": solver, "adaptive": adaptive, "steps": None if adaptive else int(steps),
        "tolerance": float(tolerance) if adaptive else math.nan, "nfe": float(nfe.mean()), "nfe_min": int(nfe.min()),
        "nfe_max": int(nfe.max()), "accepted_steps": float(accepted.mean()), "rejected_steps": float(rejected.mean()),
        "loss": loss, "perplexity": math.exp(loss), "wall_s": wall, "max_steps_hit": int(hit.sum()),
        "num_sequences": data.num_sequences, "num_tokens": tokens,
    }


# --- Public API


def solve_sequences(model: DiffEqFormerLMHeadModel, tokens, solver: str = "euler", *, steps: int | None = None,
                    tolerance: float | None = None, max_steps: int = 4096, segment_ids=None, pcoeff: float = 0.4,
                    icoeff: float = 1.0) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Logits [batch, seq, vocab] of ``tokens``, the ODE solved by ``solver`` per sequence (vmapped), and per-sequence
    step statistics; fixed-step solvers need ``steps``, adaptive ones ``tolerance``."""
    adaptive = _check_one(solver, steps, tolerance)
    check_positive_int(max_steps, "max_steps")
    data = as_token_data(tokens, model)
    model = inference_mode(model, True)  # no dropout
    seg = data.segment_ids if segment_ids is None else np.asarray(segment_ids, np.int32)
    dt0 = jnp.float32(1.0 / (model.config.num_layers if adaptive else steps))
    tol = jnp.float32(tolerance if adaptive else 1.0)
    logits, _, (n, acc, rej, hit) = _solve_batch(model, data.tokens, seg, data.loss_mask, dt0, tol, solver=solver,
                                                 max_steps=max_steps, pcoeff=pcoeff, icoeff=icoeff)
    n = np.asarray(n).astype(np.int64)
    stats = {"num_steps": n, "accepted_steps": np.asarray(acc), "rejected_steps": np.asarray(rej),
             "nfe": nfe_from_stats(solver, n), "max_steps_hit": np.asarray(hit)}
    return np.asarray(logits), stats


def _check_one(solver, steps, tolerance) -> bool:
    _check_solver(solver, {**FIXED_SOLVERS, **ADAPTIVE_SOLVERS})
    if solver in ADAPTIVE_SOLVERS:
        if tolerance is None:
            raise ValueError(f"tolerance is required by the adaptive solver {solver!r}")
        _check_tolerance(tolerance)
        return True
    if steps is None:
        raise ValueError(f"steps is required by the fixed-step solver {solver!r}")
    check_positive_int(steps, "steps")
    return False


def solver_sweep(model: DiffEqFormerLMHeadModel, data, config: SweepConfig = SweepConfig()) -> pd.DataFrame:
    """Validation loss and perplexity against NFE (columns ``COLUMNS``) for every solver and step count / tolerance of
    ``config``, on ``data`` (``TokenData`` or token ids [batch, seq]); ``attrs``: the configurations and timings."""
    data = as_token_data(data, model)
    model = inference_mode(model, True)  # no dropout
    runs = [(s, {"steps": n}) for s in config.fixed_solvers for n in config.steps]
    runs += [(s, {"tolerance": tol}) for s in config.adaptive_solvers for tol in config.tolerances]
    rows, compile_s = [], {}
    for solver, kw in runs:
        if solver not in compile_s:  # compile (and run the cheapest setting once) so that wall_s excludes it
            start = time.perf_counter()
            warm = {"tolerance": max(config.tolerances)} if solver in ADAPTIVE_SOLVERS else {"steps": 1}
            _run(model, TokenData(*(a[: config.batch_size] for a in (data.tokens, data.segment_ids,
                                                                       data.loss_mask))), solver, config, **warm)
            compile_s[solver] = time.perf_counter() - start
        rows.append(_row(model, data, solver, config, **kw))
    frame = pd.DataFrame(rows, columns=list(COLUMNS))
    frame["steps"] = frame["steps"].astype("Int64")
    frame.attrs.update({
        "sweep": dataclasses.asdict(config),
        "model": _jsonable(draccus.encode(model.config)),
        "model_fingerprint": fingerprint(model),
        "data": data.describe(),
        "nfe_convention": NFE_CONVENTION,
        "compile_s": compile_s,
        "compile_note": "compile_s: seconds to compile each solver and run its cheapest setting on one chunk",
        "diffrax_version": importlib.metadata.version("diffrax"),
        "jax_backend": jax.default_backend(),
    })
    return frame


def perplexity_vs_euler_steps(model: DiffEqFormerLMHeadModel, data, steps: Sequence[int] = tuple(range(1, 25)), *,
                              batch_size: int = 16) -> pd.DataFrame:
    """``solver_sweep`` with Euler on the training grid alone (t_k = (k+1)/N, i.e. ``model.discretize(N)``) at
    each N in ``steps``: perplexity against the number of steps, e.g. to compare step placements in training."""
    return solver_sweep(model, data, SweepConfig(fixed_solvers=("euler",), steps=tuple(steps), adaptive_solvers=(),
                                                 tolerances=(), batch_size=batch_size))


def cached_sweep(model: DiffEqFormerLMHeadModel, data, config: SweepConfig, cache_dir: str | Path) -> pd.DataFrame:
    """``solver_sweep``, cached in ``cache_dir`` by the model's fingerprint, the data's digest and the configuration."""
    data = as_token_data(data, model)
    key = {"model": fingerprint(model), "data": data.digest(), "sweep": dataclasses.asdict(config)}
    return cached(cache_dir, "solver-sweep", key, lambda: solver_sweep(model, data, config), save=save_sweep,
                  load=load_sweep, suffix=".csv")


def save_sweep(frame: pd.DataFrame, path: str | Path) -> Path:
    """Write a sweep as ``<path>.csv`` and its ``attrs`` (configuration, data, conventions) as ``<path>.json``."""
    path = Path(path).with_suffix(".csv")
    path.parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(path, index=False)
    path.with_suffix(".json").write_text(json.dumps(_jsonable(frame.attrs), indent=1) + "\n")
    return path


def load_sweep(path: str | Path) -> pd.DataFrame:
    """Read a sweep written by ``save_sweep``, with its column types and ``attrs``."""
    path = Path(path).with_suffix(".csv")
    frame = pd.read_csv(path)
    frame["steps"] = frame["steps"].astype("Int64")
    frame["adaptive"] = frame["adaptive"].astype(bool)
    sidecar = path.with_suffix(".json")
    if sidecar.exists():
        frame.attrs.update(json.loads(sidecar.read_text()))
    return frame


def _jsonable(x: Any):
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.floating,)):
        return float(x)
    if isinstance(x, (str, int, float, bool)) or x is None:
        return x
    return getattr(x, "value", str(x))  # enums (activation functions) and anything else: a string
