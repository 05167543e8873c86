"""F5's attribution: the methods compared with the token-level Lyapunov exponents (attention, attention rollout,
gradient x input), and their benchmark on the synthetic language, whose prompts know which earlier token each
prediction depends on: how often each method ranks that token first (hit@1) or in its top three (hit@3).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Sequence

import equinox as eqx
import haliax as hax
import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
from haliax import NamedArray
from levanter.layers.attention import AttentionMask
from levanter.utils.tree_utils import inference_mode
from tqdm.auto import tqdm

from ..data.synthetic import VOCABULARY, Prompt, encode
from ..model.transformer import DiffEqFormerLMHeadModel
from ..cache import cached, fingerprint
from . import claims, lyapunov
from .statistics import MCNEMAR, Comparison, compare, mcnemar

# ---------------------------------------------------------------------------------------------------------------------
# The attribution methods


def attention_weights(model: DiffEqFormerLMHeadModel, token_ids, *, prepared=None) -> np.ndarray:
    """Attention probabilities [L, heads, query, key] of each Euler step, along the forward trajectory
    (``prepared``: ``lyapunov.prepare(model, token_ids)``, where the caller has it)."""
    model, ids, x0, blocks, pos_ids = prepared if prepared is not None else lyapunov.prepare(model, token_ids)
    return np.asarray(_attention_probs(blocks, x0.array, pos_ids, x0.axes, model.config.num_layers))


@eqx.filter_jit
def _attention_probs(blocks, x, pos_ids, axes, num_steps: int):
    xs = lyapunov.states(blocks, x, pos_ids, axes, num_steps)
    probs = []
    for k in range(num_steps):
        block = lyapunov.step_weights(blocks, k)
        pos = pos_ids.astype(jnp.float32) if block.attn.rot_embs is not None else pos_ids  # as ParallelBlock does
        p = attention_probabilities(block.attn, block.attn_norm(hax.named(xs[k], axes)), AttentionMask.causal(),
                                    pos_ids=pos)
        probs.append(p.rearrange(("heads", "position", "key_position")).array)
    return jnp.stack(probs)


def attention_probabilities(attn, x: NamedArray, mask: AttentionMask | NamedArray | None, *,
                            pos_ids: NamedArray | None = None) -> NamedArray:
    """Attention probabilities [..., heads, position, key_position] of Levanter's ``Attention`` module ``attn`` on
    x [..., position, embed] (already normed), softmax_j(s * q_i . k_j) over the keys j that ``mask`` allows.

    Levanter returns only the output, so they are built as its vanilla backend builds them, from the module's public
    parts and every option of its config (QK norm, RoPE, sliding window, ``scaling_factor``, ``upcast_attn``,
    ``logits_soft_cap``); ``tests/test_lyapunov.py`` checks that o_proj(probabilities . values) is its output."""
    config = attn.config
    if pos_ids is None:
        pos_ids = hax.arange(x.resolve_axis("position"))  # Attention's own default
    q, k, _ = lyapunov.queries_keys_values(attn, x, x, pos_ids, pos_ids)
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


def _raw_attention(att: np.ndarray, output_position: int) -> np.ndarray:
    """Attention of ``output_position`` to each token, averaged over heads and steps: [n]."""
    return att.mean(axis=(0, 1))[output_position]


def _rollout(att: np.ndarray, output_position: int) -> np.ndarray:
    """Attention rollout (Abnar & Zuidema 2020) with the ODE's residual: step k maps x -> x + h A_k x, so
    the token-mixing matrix of a step is (I + h mean_heads A_k) / (1 + h) (rows sum to one); its product over steps."""
    att = att.mean(axis=1)  # [L, n, n]
    L, n, _ = att.shape
    h = 1.0 / L
    roll = np.eye(n)
    for k in range(L):
        roll = ((np.eye(n) + h * att[k]) / (1 + h)) @ roll
    return roll[output_position]


@eqx.filter_jit
def _grad_x_input(model, blocks, x0, pos_ids, axes, out):
    """|sum_d (d logit_target / d e_in,d) * e_in,d| per token, target = the model's top next-token prediction."""
    def target_logits(x):
        final = model.ln_f(hax.named(lyapunov.states(blocks, x, pos_ids, axes, model.config.num_layers)[-1], axes))
        return hax.dot(final, model.get_lm_head(), axis=model.Embed).rearrange(("position", "vocab")).array[out]

    target = jnp.argmax(target_logits(x0))
    grad = jax.grad(lambda x: target_logits(x)[target])(x0)
    return jnp.abs(jnp.sum(grad * x0, axis=-1)), target


METHODS = ("lyapunov (max exponent)", "lyapunov (sum)", "raw attention", "attention rollout", "gradient x input")
"""The attribution methods of ``attribution_scores`` (and of ``attribution.attribution_benchmark``), in this order."""
METHOD_KEYS = dict(zip(METHODS, ("lyapunov_max", "lyapunov_sum", "attention", "rollout", "grad_x_input")))
"""A short identifier of each method (for file and glue names)."""


def attribution_scores(model: DiffEqFormerLMHeadModel, token_ids, output_position: int = -1, *,
                       tokens: Sequence[str] | None = None) -> pd.DataFrame:
    """Every attribution method's score of each input token for the prediction at ``output_position``.

    One row per token (index ``token``), one column per name in ``METHODS`` (``lyapunov.token_lyapunov``'s largest
    exponent and sum, attention averaged over heads and steps, its rollout, gradient x input), plus ``text`` with
    ``tokens``; NaN after the output position. The weights, trajectory and attention maps are computed once for all.
    ``df.attrs``: ``output_position`` (non-negative) and ``predicted_token`` (the logit gradient x input
    differentiates).
    """
    prepared = lyapunov.prepare(model, token_ids)
    n = prepared.x0.array.shape[0]
    out = output_position % n
    lyap = lyapunov.token_lyapunov(model, token_ids, output_position=out, tokens=tokens, prepared=prepared)
    att = attention_weights(model, token_ids, prepared=prepared)
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


# ---------------------------------------------------------------------------------------------------------------------
# The benchmark


def attribution_benchmark(model, items: list[Prompt], *, methods=None, cache_dir: str | Path | None = None,
                          progress: bool = True) -> pd.DataFrame:
    """One row per (prompt, method): the ``rank`` (``_rank``) of the true token among the earlier tokens but BOS by
    the scores for the last position, ``truth_finite``, ``nonfinite``, ``task``, ``correct_prediction``, ``length``.
    ``methods``: ``{name: fn(model, ids, out) -> scores [n]}``, by default those of ``attribution_scores`` (the only
    ones cached in ``cache_dir``)."""
    if cache_dir is not None and methods is not None:
        raise ValueError("cache_dir caches the default methods only")
    # version 2: ranks over finite scores only, and the truth_finite and nonfinite columns
    key = {"model": fingerprint(model), "prompts": [dataclasses.asdict(p) for p in items], "version": 2}
    return cached(cache_dir, "attribution", key, lambda: _benchmark(model, items, methods, progress),
                  save=lambda frame, p: frame.to_csv(p, index=False), load=pd.read_csv, suffix=".csv")


def _benchmark(model, items: list[Prompt], methods, progress: bool) -> pd.DataFrame:
    if methods is None:
        def score_all(m, ids, out):
            return attribution_scores(m, ids, out)
    else:
        def score_all(m, ids, out):
            return pd.DataFrame({name: np.asarray(fn(m, ids, out), dtype=float) for name, fn in methods.items()})

    index = {i: w for i, w in enumerate(VOCABULARY)}
    length = model.config.max_seq_len
    rows = []
    for p_i, item in enumerate(tqdm(items, desc="attribution benchmark", disable=not progress)):
        ids = encode(item)
        if len(ids) > length:
            raise ValueError(f"prompt {p_i} has {len(ids)} tokens, more than model.max_seq_len = {length}")
        out = len(ids) - 1
        # Every prompt is padded to seq_len after its output position: a causal model's scores for positions up to
        # `out` do not see the padding, and one shape means one compilation for all prompts.
        padded = np.concatenate([ids, np.zeros(length - len(ids), np.int32)])
        named = hax.named(jnp.asarray(padded), "position")
        logits = np.asarray(_logits(model, named))[out]
        predicted = index.get(int(np.argmax(logits[: len(VOCABULARY)])), "?")
        truth = item.true_position + 1  # + BOS
        table = score_all(model, named, out)
        for name in [c for c in table.columns if c != "text"]:
            scores = table[name].to_numpy(dtype=float)[: out + 1]
            candidates = scores[1:-1]  # drop BOS and the output position
            finite = np.isfinite(candidates)
            rows.append({"prompt": p_i, "task": item.task, "method": name, "rank": _rank(candidates, truth - 1),
                         "truth_finite": bool(finite[truth - 1]), "nonfinite": int(np.sum(~finite)),
                         "correct_prediction": predicted == item.answer, "length": len(ids)})
    return pd.DataFrame(rows)


def _rank(candidates: np.ndarray, truth: int) -> int:
    """The 1-based rank of ``candidates[truth]`` when the candidates are sorted by score, highest first.

    A score that is not finite (NaN; -inf, a Lyapunov exponent where a step's tangent map I + h J is singular) is no
    measurement of influence, and a sort or argmax would place it by accident: it ranks below every finite score,
    and a truth whose score is not finite ranks last (``len(candidates)``). Ties go to the earlier token.
    """
    candidates = np.asarray(candidates, dtype=float)
    if not np.isfinite(candidates[truth]):
        return len(candidates)
    keyed = np.where(np.isfinite(candidates), candidates, -np.inf)
    order = np.argsort(-keyed, kind="stable")
    return int(np.where(order == truth)[0][0]) + 1


def _logits(model, ids):
    """The model's logits [position, vocab] for one sequence, in inference mode (compiled once per shape)."""
    return _compiled_logits(inference_mode(model, True), ids)


@eqx.filter_jit
def _compiled_logits(model, ids):
    return model(ids, AttentionMask.causal()).rearrange(("position", "vocab")).array


def summarize(results: pd.DataFrame) -> pd.DataFrame:
    """Hit rates per task, method and ``seed`` (where ``results`` has one): ``hit_at_1``, ``hit_at_3``,
    ``chance_at_1``, ``chance_at_3`` (of a random ranking of the c = length - 2 candidates: mean of min(k, c) / c),
    ``model_accuracy``, ``hit_at_1_correct`` (over the prompts the model gets right), ``prompts``,
    ``nonfinite_scores`` and ``truth_nonfinite`` (scores that were not finite; ranked last).
    """
    results = results if "seed" in results else results.assign(seed=0)
    candidates = (results["length"] - 2).clip(lower=1)
    table = results.assign(hit1=results["rank"] <= 1, hit3=results["rank"] <= 3,
                           chance1=1.0 / candidates, chance3=np.minimum(3, candidates) / candidates,
                           hit1_correct=(results["rank"] <= 1).where(results["correct_prediction"].astype(bool)),
                           truth_nonfinite=~results["truth_finite"].astype(bool))
    summary = table.groupby(["task", "method", "seed"], sort=False).agg(
        hit_at_1=("hit1", "mean"), hit_at_3=("hit3", "mean"), chance_at_1=("chance1", "mean"),
        chance_at_3=("chance3", "mean"), model_accuracy=("correct_prediction", "mean"),
        hit_at_1_correct=("hit1_correct", "mean"), prompts=("prompt", "nunique"), nonfinite_scores=("nonfinite", "sum"),
        truth_nonfinite=("truth_nonfinite", "sum"))
    return summary.reset_index()


def over_seeds(summary: pd.DataFrame) -> pd.DataFrame:
    """``summarize``'s rows averaged over seeds per task and method, with ``hit_at_1_sd`` (NaN with one seed) and
    ``seeds``; the counts of scores that were not finite are summed."""
    grouped = summary.groupby(["task", "method"], sort=False)
    out = grouped[["hit_at_1", "hit_at_3", "chance_at_1", "chance_at_3", "model_accuracy",
                   "hit_at_1_correct"]].mean()
    out.insert(1, "hit_at_1_sd", grouped["hit_at_1"].std())
    out["prompts"] = grouped["prompts"].first()
    out["seeds"] = grouped["seed"].nunique()
    out[["nonfinite_scores", "truth_nonfinite"]] = grouped[["nonfinite_scores", "truth_nonfinite"]].sum()
    return out.reset_index()


CLAIM = ("lyapunov (max exponent)", "raw attention")
"""The paper's claim, compared per task: the largest Lyapunov exponent attributes better than attention weights."""


def verdicts(results: pd.DataFrame) -> dict:
    """The verdicts on F5's claims (``claims.CLAIMS``: ``f5_agreement``, ``f5_induction``), each from ``claim`` on
    its task's per-prompt results; a task the results do not hold is untested."""
    out = {}
    for task in ("agreement", "induction"):
        name, rows = f"f5_{task}", results[results["task"] == task]
        if rows.empty or not set(CLAIM) <= set(rows["method"]):
            out[name] = claims.untested(name, f"no {task} prompts were scored by both methods")
            continue
        c, _ = claim(rows)
        note = "the prompt is the unit (one model): share of prompts won less share lost" if c.test == MCNEMAR else ""
        out[name] = claims.judge(name, c, note=note)
    return out


def claim(results: pd.DataFrame) -> tuple[Comparison, float]:
    """The paper's claim (``CLAIM``) on one task's per-prompt results, and the difference of the hit@1 rates: with
    several seeds the model is the unit (paired t-test of the seeds' hit@1 rates), with one the prompt (exact
    McNemar test). Only prompts every seed's model answered are compared."""
    results = results[results["method"].isin(CLAIM)]
    results = results if "seed" in results else results.assign(seed=0)
    hits = results.assign(hit=(results["rank"] <= 1).astype(int)).pivot_table(
        index="prompt", columns=["method", "seed"], values="hit").dropna()
    a, b = (hits[m].to_numpy() for m in CLAIM)
    if a.ndim == 2 and a.shape[1] > 1:
        return compare(a.mean(axis=0), b.mean(axis=0), paired=True), float(a.mean() - b.mean())
    return mcnemar(a, b), float(a.mean() - b.mean())
