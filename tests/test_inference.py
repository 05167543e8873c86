"""Solvers at inference: the training grid against the model's forward pass, NFE against counted evaluations,
convergence under tighter tolerances, the sweep's table and files, and bad input.

Every solve here has the same shapes and static settings (4 sequences of TINY's 12 tokens, MAX_STEPS), so each
solver compiles once for the whole file.
"""

import math

import haliax as hax
import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest
from helpers import CAUSAL, VOCAB, assert_close, tiny

from diffeqformer.analysis.inference import (
    ADAPTIVE_SOLVERS,
    COLUMNS,
    FIXED_SOLVERS,
    SweepConfig,
    TokenData,
    _solve_one,
    load_sweep,
    nfe_from_stats,
    perplexity_vs_euler_steps,
    save_sweep,
    solve_sequences,
    solver_sweep,
)
from diffeqformer.report.words import language as words
from diffeqformer.report.plots import language

MAX_STEPS = 1024
Batch = hax.Axis("batch", 4)


@pytest.fixture(scope="module")
def model():
    return tiny().build(VOCAB, key=jax.random.PRNGKey(0))


@pytest.fixture(scope="module")
def ids():
    return np.asarray(jax.random.randint(jax.random.PRNGKey(1), (Batch.size, tiny().max_seq_len), 0, VOCAB.size))


def _forward(m, ids):
    return m(hax.named(jnp.asarray(ids), (Batch, tiny().Pos)), CAUSAL).rearrange((Batch, "position", "vocab")).array


def test_euler_on_training_grid_is_the_model(model, ids):
    """Euler with N = L steps is the model's own forward pass; with other N it is ``discretize(N)``."""
    L = model.config.num_layers
    logits, stats = solve_sequences(model, ids, "euler", steps=L, max_steps=MAX_STEPS)
    assert_close(logits, _forward(model, ids), 1e-5)
    assert stats["nfe"].tolist() == [L] * Batch.size
    logits3, _ = solve_sequences(model, ids, "euler", steps=3, max_steps=MAX_STEPS)
    assert_close(logits3, _forward(model.discretize(3), ids), 1e-5)


@pytest.mark.parametrize("solver", ["euler", "heun", "midpoint"])
def test_fixed_step_nfe_is_steps_times_stages(model, ids, solver):
    for steps in (1, 5, 24):
        _, stats = solve_sequences(model, ids, solver, steps=steps, max_steps=MAX_STEPS)
        assert stats["num_steps"].tolist() == [steps] * Batch.size
        assert stats["rejected_steps"].tolist() == [0] * Batch.size
        assert stats["nfe"].tolist() == [steps * FIXED_SOLVERS[solver]] * Batch.size


@pytest.mark.parametrize("solver,steps,tolerance", [("heun", 5, 1.0), ("tsit5", None, 1e-3)])
def test_nfe_formula_counts_every_evaluation(model, ids, solver, steps, tolerance):
    """The NFE from Diffrax's statistics equals the vector-field calls counted by a host callback (one sequence;
    Tsit5 rejects steps at this tolerance, so the count covers rejected steps too)."""
    calls = []
    hook = lambda t: jax.debug.callback(lambda t: calls.append(float(t)), t)  # noqa: E731
    dt0 = 1.0 / (steps or model.config.num_layers)

    @jax.jit
    def run(tokens):
        return _solve_one(model, tokens, jnp.zeros_like(tokens), jnp.float32(dt0), jnp.float32(tolerance),
                          solver=solver, max_steps=MAX_STEPS, pcoeff=0.4, icoeff=1.0, field_hook=hook)[1]

    num_steps, _, rejected, hit = jax.block_until_ready(run(jnp.asarray(ids[0], dtype=jnp.int32)))
    assert not bool(hit)
    if solver in ADAPTIVE_SOLVERS:
        assert int(rejected) > 0
    assert len(calls) == nfe_from_stats(solver, int(num_steps))


def test_tighter_tolerance_costs_more_and_converges(model, ids):
    """Tsit5 against a tol = 1e-7 reference: NFE grows as the tolerance tightens, and the logits converge once the
    steps resolve W(t)'s fastest oscillation (period 2 pi / 1000 at the paper's scale s = 1000); looser solves
    step over the oscillation and plateau at a similar error (what the module doc warns about)."""
    ref, ref_stats = solve_sequences(model, ids, "tsit5", tolerance=1e-7, max_steps=MAX_STEPS)
    assert not ref_stats["max_steps_hit"].any()
    tolerances = (1e-1, 1e-2, 1e-3, 1e-4, 1e-5, 1e-6)
    nfe, err = [], []
    for tol in tolerances:
        logits, stats = solve_sequences(model, ids, "tsit5", tolerance=tol, max_steps=MAX_STEPS)
        nfe.append(stats["nfe"].mean())
        err.append(float(np.max(np.abs(logits - ref))))
    assert np.all(np.diff(nfe) > 0), nfe
    assert err[-1] < err[-2] < err[-3], err  # 1e-4 -> 1e-5 -> 1e-6
    assert err[-1] < 0.1 * max(err), err


def test_sweep_table_files_and_plots(model, ids, tmp_path):
    """A sweep over 6 sequences (a padded last chunk of 4) has the documented columns, one row per setting, NFE
    per sequence, a loss that matches the forward pass, NaN where max_steps was hit, and survives a round trip."""
    six = np.concatenate([ids, ids[:2, ::-1]])
    config = SweepConfig(fixed_solvers=("euler", "heun"), steps=(2, 4), adaptive_solvers=("tsit5",),
                         tolerances=(1e-1, 1e-9), max_steps=MAX_STEPS, batch_size=Batch.size)
    frame = solver_sweep(model, six, config)
    assert tuple(frame.columns) == COLUMNS
    assert len(frame) == 2 * 2 + 2
    assert frame["solver"].tolist() == ["euler", "euler", "heun", "heun", "tsit5", "tsit5"]
    assert frame["nfe"].tolist()[:4] == [2, 4, 4, 8]
    assert (frame["num_sequences"] == 6).all() and (frame["num_tokens"] == 6 * 11).all()

    # Euler at N = L (4 for TINY): mean next-token cross-entropy of the forward pass
    logits = np.concatenate([_forward(model, six[:4]), _forward(model, np.concatenate([six[4:], six[:2]]))])[:6]
    logp = jax.nn.log_softmax(jnp.asarray(logits), axis=-1)
    nll = -np.take_along_axis(np.asarray(logp)[:, :-1], six[:, 1:, None], axis=-1)
    row = frame[(frame["solver"] == "euler") & (frame["steps"] == 4)].iloc[0]
    assert math.isclose(row["loss"], float(nll.mean()), rel_tol=1e-5)
    assert math.isclose(row["perplexity"], math.exp(row["loss"]), rel_tol=1e-12)

    loose, capped = frame[frame["solver"] == "tsit5"].itertuples()
    assert loose.max_steps_hit == 0 and np.isfinite(loose.loss) and pd.isna(loose.steps)
    assert capped.max_steps_hit == 6 and np.isnan(capped.loss) and capped.nfe == nfe_from_stats("tsit5", MAX_STEPS)
    assert frame.attrs["model"]["num_layers"] == 4 and frame.attrs["data"]["num_sequences"] == 6

    path = save_sweep(frame, tmp_path / "sweep")
    again = load_sweep(path)
    pd.testing.assert_frame_equal(again, frame)
    assert again.attrs["sweep"]["tolerances"] == [1e-1, 1e-9]

    euler = perplexity_vs_euler_steps(model, TokenData.from_tokens(six), steps=(2, 4), batch_size=Batch.size)
    np.testing.assert_allclose(euler["loss"], frame["loss"][:2], rtol=1e-12)

    language.perplexity_vs_nfe(frame).savefig(tmp_path / "nfe.png")
    language.perplexity_vs_steps({"fixed": euler, "again": euler}).savefig(tmp_path / "steps.png")


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(solver="rk4", steps=4), "solver"),
        (dict(solver="euler", steps=0), "steps"),
        (dict(solver="heun", steps=-2), "steps"),
        (dict(solver="euler", steps=2.5), "steps"),
        (dict(solver="euler"), "steps"),
        (dict(solver="tsit5", tolerance=0.0), "tolerance"),
        (dict(solver="tsit5", tolerance=-1e-3), "tolerance"),
        (dict(solver="tsit5", tolerance=float("nan")), "tolerance"),
        (dict(solver="tsit5"), "tolerance"),
        (dict(solver="tsit5", tolerance=1e-3, max_steps=0), "max_steps"),
    ],
)
def test_bad_input_names_the_parameter(model, ids, kwargs, message):
    with pytest.raises(ValueError, match=message):
        solve_sequences(model, ids, **kwargs)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(fixed_solvers=("rk4",)), "fixed_solvers"),
        (dict(adaptive_solvers=("euler",)), "adaptive_solvers"),
        (dict(steps=(1, 0)), "steps"),
        (dict(tolerances=(1e-3, 0.0)), "tolerances"),
        (dict(max_steps=0), "max_steps"),
        (dict(batch_size=0), "batch_size"),
    ],
)
def test_bad_sweep_config_names_the_field(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SweepConfig(**kwargs)


def test_bad_tokens_are_rejected(model, ids):
    for bad, message in [(ids[0], "batch"), (ids.astype(np.float32), "integer"), (ids[:, :1], "seq >= 2"),
                         (np.full((1, 13), 1), "seq_len"), (ids + VOCAB.size, "token ids")]:
        with pytest.raises(ValueError, match=message):
            solve_sequences(model, bad, "euler", steps=2, max_steps=MAX_STEPS)


@pytest.mark.slow
def test_validation_data_follows_the_run_config(tmp_path):
    """``validation_data`` reads a run's validation set as Levanter's evaluation does (smoke config)."""
    from diffeqformer import paths
    from diffeqformer.analysis.inference import validation_data
    from diffeqformer.config import load_config

    source = paths.CONFIG / "smoke" / "diffeqformer.yaml"
    (tmp_path / "config.yaml").write_text(source.read_text())
    data = validation_data(tmp_path, num_sequences=3)
    seq_len = load_config(source).model.max_seq_len
    assert data.tokens.shape == data.segment_ids.shape == data.loss_mask.shape == (3, seq_len)
    np.testing.assert_array_equal(data.loss_mask[:, :-1], 1.0)
    np.testing.assert_array_equal(data.loss_mask[:, -1], 0.0)
    assert data.source == str(tmp_path)


def test_headline_sentences():
    rows = [("euler", False, 6, float("nan"), 6.0, 100.0), ("euler", False, 12, float("nan"), 12.0, 90.0),
            ("heun", False, 6, float("nan"), 12.0, 95.0), ("tsit5", True, pd.NA, 1e-1, 30.0, 120.0),
            ("tsit5", True, pd.NA, 1e-3, 300.0, 99.0)]
    frame = pd.DataFrame(rows, columns=["solver", "adaptive", "steps", "tolerance", "nfe", "perplexity"])
    frame["loss"] = np.log(frame["perplexity"])
    frame["steps"] = frame["steps"].astype("Int64")
    frame.attrs["model"] = {"num_layers": 6}
    by_steps = {"fixed": frame[frame.solver == "euler"], "random": frame[frame.solver == "euler"].assign(
        perplexity=[100.0, 100.0])}
    text = words.x1_headline(frame, by_steps)
    assert text["own"] == "100.0 with its own 6 Euler steps (NFE 6)"
    assert text["best_fixed"] == "90.0 with Euler at 12 steps (NFE 12)"
    assert text["adaptive"] == "Tsit5: 120.0 at tolerance 0.1 (NFE 30), 99.0 at tolerance 0.001 (NFE 300)"
    assert text["spread"] == "fixed: 90.0 to 100.0 (x1.11); random: 100.0 to 100.0 (x1.00)"


def test_headline_finds_the_models_own_steps_in_the_step_frames():
    sweep = pd.DataFrame({"solver": ["euler"], "adaptive": [False], "steps": pd.array([2], dtype="Int64"),
                          "tolerance": [float("nan")], "nfe": [2.0], "perplexity": [50.0], "loss": [np.log(50.0)]})
    sweep.attrs["model"] = {"num_layers": 3}
    steps = pd.DataFrame({"solver": ["euler", "euler"], "steps": pd.array([1, 3], dtype="Int64"),
                          "perplexity": [70.0, 40.0]})
    assert words.x1_headline(sweep, {"fixed": steps})["own"] == "40.0 with its own 3 Euler steps (NFE 3)"
    assert words.x1_headline(sweep)["own"] == ("not evaluated with its own 3 Euler steps (L is not among the step "
                                                "counts)")
