"""diffeqformer.train at smoke size: metrics file, skip when complete, resumes after SIGKILLs equal a full run."""

import json
import os
import sys

import equinox as eqx
import jax
import numpy as np
import forked
import pytest
from interrupt import check_kills, kill_seed, run_with_kills

from diffeqformer import config as configs
from diffeqformer import paths, runs, train
from diffeqformer.runs import load_model, read_metrics

SMOKE = paths.CONFIG / "smoke" / "diffeqformer.yaml"


def _train_cmd(run_dir):
    return [sys.executable, "-m", "diffeqformer.train", "--config", str(SMOKE), "--run_dir", str(run_dir)]


def _env():
    # the test run's persistent compilation cache (conftest): the first process of the test run (or of the smoke
    # pipeline beside it) to need the training step compiles it, the others load it
    return {**os.environ, "JAX_PLATFORMS": "cpu"}


def _assert_same_parameters(run_dir, other_dir, err_msg=""):
    """The two runs' saved models have the same parameters, bit for bit."""
    a = jax.tree_util.tree_leaves(eqx.filter(load_model(run_dir), eqx.is_array))
    b = jax.tree_util.tree_leaves(eqx.filter(load_model(other_dir), eqx.is_array))
    assert len(a) == len(b) > 10
    for x, y in zip(a, b):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=err_msg)


def _run(run_dir):
    # A subprocess, as a user runs it: Levanter's trainer sets global JAX and logging state.
    env = _env()
    out = forked.run(_train_cmd(run_dir), env)
    assert out.returncode == 0, out.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def full_run(smoke_run):
    """The smoke DiffEqFormer trained from the command line, never interrupted: the test run's shared smoke run
    (conftest), which test_finetune fine-tunes; tests read it (and rerun it as a complete run, which writes
    nothing)."""
    return smoke_run


def test_smoke_run_writes_metrics_and_summary(full_run):
    run_dir = full_run
    summary = json.loads((run_dir / "complete.json").read_text())
    metrics = read_metrics(run_dir)
    assert metrics.index.max() == 19
    train = metrics["train/loss"].dropna()
    assert len(train) == 20 and np.all(np.isfinite(train))
    evals = metrics["eval/loss"].dropna()
    assert len(evals) >= 2 and evals.iloc[-1] < evals.iloc[0]  # learns something in 20 steps
    assert summary["final_eval_perplexity"] == pytest.approx(np.exp(evals.iloc[-1]), rel=1e-6)
    assert summary["tokens_per_second"] > 0
    assert (run_dir / "config.yaml").read_text().startswith("# config_hash: " + summary["config_hash"])
    model = load_model(run_dir)
    assert model.config.time_embed_dim == 4
    print(f"smoke run: {summary['wall_time_s']:.1f} s wall, final eval loss {evals.iloc[-1]:.3f}")


def test_each_evaluation_runs_once(full_run):
    """The last step's evaluation is not repeated by the trainer's forced hooks at the end (train.once_per_step):
    every step has at most one eval/loss record, and the last step has one (20 steps, an evaluation every 10)."""
    run_dir = full_run
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in records if "eval/loss" in r]
    assert len(steps) == len(set(steps)), steps
    assert max(steps) == 19


def test_complete_run_is_not_retrained(full_run):
    run_dir = full_run
    before = (run_dir / "metrics.jsonl").read_text()
    out = _run(run_dir)
    assert "already complete" in out.stderr
    assert (run_dir / "metrics.jsonl").read_text() == before


def test_resume_after_sigkill_equals_uninterrupted_run(full_run, tmp_path):
    """Killed before its first checkpoint, while writing it, and between checkpoints, then rerun: the same
    parameters, bit for bit, as the run that was never interrupted."""
    full_dir = full_run
    run_dir = tmp_path / "run"
    seed = kill_seed()
    kills, stderr = run_with_kills(_train_cmd(run_dir), _env(), run_dir, seed)
    check_kills(kills, stderr, seed)
    _assert_same_parameters(run_dir, full_dir, err_msg=f"kill seed {seed}: {kills}")
    assert read_metrics(run_dir)["train/loss"].equals(read_metrics(full_dir)["train/loss"])


def _assert_diverged(out, run_dir, step):
    """The process ended with the one line of ``runs.diverged`` (run directory, step, remedy), no traceback, and
    nothing claims the run finished."""
    assert out.returncode == 1, out.stderr[-3000:]
    # the line, not the last one: Levanter's progress bar logs its end as the process exits
    [last] = [line for line in out.stderr.splitlines() if "diverged" in line]
    assert last.startswith(f"{run_dir}: training diverged at step {step} (loss "), last
    # in the line, not at its end: a log line of Levanter's checkpoint thread can land before its newline
    assert (f"lower optimizer.learning_rate (or clip gradients with optimizer.max_grad_norm), delete {run_dir} and "
            "train again") in last, last
    assert "Traceback" not in out.stderr
    assert not (run_dir / runs.COMPLETE).exists() and not (run_dir / runs.MODEL).exists()


def test_non_finite_loss_stops_with_a_message(tmp_path):
    run_dir = tmp_path / "run"
    cmd = _train_cmd(run_dir) + ["--optimizer.learning_rate", "1e30", "--optimizer.warmup", "0"]
    out = forked.run(cmd, {**os.environ, "JAX_PLATFORMS": "cpu"})
    _assert_diverged(out, run_dir, step=1)  # update 0 makes the parameters non-finite; update 1's loss shows it
    assert not list((run_dir / runs.CHECKPOINTS).glob("step-*"))  # no checkpoint of a diverged state


_HUGE_LOSS = """
import sys
import diffeqformer.train as t

t.next_token_loss = lambda model, example, *, key=None: 1e3 * model.compute_next_token_loss(example, key=key)
t.cli(sys.argv[1:])
"""


def test_a_loss_too_large_for_its_perplexity_ends_as_diverged(tmp_path):
    """A finite training loss that overflows exp (about 8000 nats here: the smoke run's loss, scaled) is not a crash
    in math.exp (OverflowError) nor a finished run: the run ends diverged at its last step."""
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-c", _HUGE_LOSS, "--config", str(SMOKE), "--run_dir", str(run_dir)]
    out = forked.run(cmd, _env())
    _assert_diverged(out, run_dir, step=19)


@pytest.mark.parametrize("loss, expected", [(2.0, np.exp(2.0)), (None, None), (float("nan"), None),
                                            (float("inf"), None), (709.0, np.exp(709.0)), (710.0, None), (1e30, None)])
def test_perplexity_of_a_diverged_loss_is_none(loss, expected):
    assert runs.perplexity(loss) == expected


def test_finish_run_refuses_a_diverged_validation_loss(tmp_path):
    """A finite train loss and a validation loss that overflows exp: ``diverged`` at that evaluation's step, before
    the model or complete.json is written."""
    (tmp_path / runs.METRICS).write_text("".join(json.dumps(r) + "\n" for r in [
        {"step": 0, "time": 0.0, "train/loss": 8.0}, {"step": 9, "time": 1.0, "train/loss": 7.0, "eval/loss": 1e4}]))
    config = configs.load_config(SMOKE)
    with pytest.raises(SystemExit, match=rf"^{tmp_path}: training diverged at step 9 \(loss 1e\+04\)") as exit_:
        runs.finish_run(config, tmp_path, model=None, digest="h", start=0.0)
    assert "\n" not in str(exit_.value.code)
    assert sorted(p.name for p in tmp_path.iterdir()) == [runs.METRICS]


def test_flat_dispatch_trains_what_levanters_named_jit_trains(full_run, tmp_path):
    """diffeqformer.trainer.Trainer calls the training step through FlatJit; the same run trained by Levanter's
    own Trainer (its named_jit step) ends with the same parameters, bit for bit, and the same train-loss series."""
    full_dir = full_run
    run_dir = tmp_path / "run"
    script = ("import sys, levanter.trainer, diffeqformer.train as t; t.Trainer = levanter.trainer.Trainer; "
              "t.cli(sys.argv[1:])")
    cmd = [sys.executable, "-c", script, "--config", str(SMOKE), "--run_dir", str(run_dir)]
    out = forked.run(cmd, _env())
    assert out.returncode == 0, out.stderr[-3000:]
    _assert_same_parameters(run_dir, full_dir)
    assert read_metrics(run_dir)["train/loss"].equals(read_metrics(full_dir)["train/loss"])


_COUNT_SAVEABLE = """
import json
import sys
import levanter.trainer_state as ts
import diffeqformer.train as t

levanters = ts.TrainerState.saveable_state
steps = []
ts.TrainerState.saveable_state = property(lambda state: steps.append(int(state.step)) or levanters.fget(state))
t.cli(sys.argv[1:])
print("saveable_state at steps", json.dumps(steps))
"""


def test_train_state_is_filtered_for_checkpoints_only(full_run, tmp_path):
    """Our Trainer's checkpoint hook has Levanter's ``saveable_state`` computed when a checkpoint is written, not
    after every step (Levanter's own hook does, 20 times in this run); the run is the full run, bit for bit (and
    ``test_resume_after_sigkill_equals_uninterrupted_run`` resumes from such checkpoints)."""
    full_dir = full_run
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-c", _COUNT_SAVEABLE, "--config", str(SMOKE), "--run_dir", str(run_dir),
           "--trainer.checkpointer.keep", '[{"every": 5}]']
    out = forked.run(cmd, _env())
    assert out.returncode == 0, out.stderr[-3000:]
    saved = sorted(int(line.rsplit(" ", 1)[1].rstrip(".")) for line in out.stderr.splitlines()
                   if "Saving checkpoint at step" in line and " to " not in line)
    steps = json.loads(out.stdout.split("saveable_state at steps", 1)[1])
    assert saved == [5, 10, 15, 19] and sorted(steps) == [s + 1 for s in saved], (saved, steps)
    _assert_same_parameters(run_dir, full_dir)


_BEFORE_INITIALIZE = """
import sys
import levanter.trainer
from jax._src import xla_bridge
from diffeqformer import devices

start = devices.start

def started(config):  # where jax.distributed.initialize runs on a cluster: record, then go on
    print("backend started before initialize:", xla_bridge.backends_are_initialized(), flush=True)
    return start(config)

def initialize(config):  # Levanter's own initialisation, after it: stop
    raise SystemExit(0)

devices.start = started
levanter.trainer.initialize = initialize
from diffeqformer import config as configs, population, train
config = configs.load_config(sys.argv[2], ["--run_dir", sys.argv[3]])
if sys.argv[1] == "population":
    population.main(population.members_of(config, 2))
else:
    train.main(config)
"""


@pytest.mark.parametrize("module", ["train", "population"])
def test_levanter_initializes_before_jax_starts_its_backend(module, tmp_path):
    # jax.distributed.initialize (multi-host, or a cluster Levanter detects) raises once JAX's backend has started;
    # building the optimiser evaluates its learning-rate schedule with jax.numpy, which starts it. Seen on an H200
    # machine with mpi4py: "jax.distributed.initialize() must be called before any JAX calls that might initialise
    # the XLA backend".
    out = forked.run([sys.executable, "-c", _BEFORE_INITIALIZE, module, str(SMOKE), str(tmp_path / "run")], _env())
    assert out.returncode == 0, out.stderr[-3000:]
    assert "backend started before initialize: False" in out.stdout


@pytest.mark.parametrize("platform", ["cpu", "gpu"])
def test_fast_loss_backward_only_on_a_gpu(monkeypatch, platform):
    """Levanter's faster cross-entropy backward is turned on for a GPU and never on a CPU (the cpu preset's
    gradients stay bit for bit); a value the user set wins."""
    monkeypatch.delenv(train.FAST_LOSS_BACKWARD, raising=False)
    monkeypatch.setattr(train.jax, "default_backend", lambda: platform)
    assert train.use_fast_loss_backward() == (platform == "gpu")
    assert (train.FAST_LOSS_BACKWARD in os.environ) == (platform == "gpu")
    monkeypatch.setenv(train.FAST_LOSS_BACKWARD, "0")
    assert not train.use_fast_loss_backward()
