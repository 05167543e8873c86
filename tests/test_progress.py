"""The pipeline's time left (``pipeline.progress``), replayed from recorded timings without training anything: a smoke
pipeline in a fresh ``DIFFEQFORMER_HOME`` (``benchmarks/time_left.py --trace``): when each unit and notebook began and
ended, and the steps each run logged. At a moment of that pipeline the replay (``benchmarks/time_left.py``'s
``replay``) writes the logs as they then stood, tells ``Costs`` what had finished, and plays the lanes' schedule
forward from there, as the pipeline did."""

from __future__ import annotations

import importlib.util
import io
import json
from pathlib import Path

import pytest

from diffeqformer import paths
from diffeqformer.pipeline import progress
from diffeqformer.pipeline.planning import NotebookJob

spec = importlib.util.spec_from_file_location("time_left", paths.REPO / "benchmarks" / "time_left.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)
TRACE = json.loads(Path(__file__).with_name("time_left_smoke.json").read_text())
EPOCH = bench.EPOCH
time_left = bench.replay


def test_a_runs_logged_steps_are_its_own(tmp_path):
    """The first and last step a run logged since it began: not an earlier process's (a resumed run), not the
    evaluation before its first step (step -1), not a line cut in the middle."""
    metrics = tmp_path / "metrics.jsonl"
    records = [{"step": 7, "time": 90.0}, {"step": -1, "time": 101.0, "eval/loss": 5.0}]
    records += [{"step": s, "time": 102.0 + s, "train/loss": 4.0} for s in range(6)]
    metrics.write_text("".join(json.dumps(r) + "\n" for r in records) + '{"step": 6, "ti')
    assert progress.logged_steps(metrics, since=100.0) == ((0, 102.0), (5, 107.0))
    assert progress.logged_steps(metrics, since=200.0) is None
    assert progress.logged_steps(tmp_path / "none.jsonl", since=0.0) is None


def test_it_says_estimating_until_a_run_has_logged_its_steps(tmp_path):
    first = min(u["begin"] for u in TRACE["units"])
    assert time_left(TRACE, first + 0.5, tmp_path / "a") is None  # nothing measured on this machine yet
    live = min(t for u in TRACE["units"] for step, t in u["logged"] if step >= progress.LIVE_STEPS - 1)
    assert time_left(TRACE, live - 0.5, tmp_path / "b") is None  # one step short
    assert time_left(TRACE, live + 0.5, tmp_path / "c") is not None
    out = io.StringIO()
    bar = progress.Progress([("train a", None), ("build the book", 60.0)], out)
    bar.begin(0, "train a")
    with bar.estimating([0], lambda: 30.0):
        bar.begin(0, "train a")
    assert out.getvalue().splitlines()[0].endswith("(0:00 elapsed, estimating the time left)")
    assert out.getvalue().splitlines()[1].endswith("(0:00 elapsed, about 1:30 left)")


def test_the_books_price_follows_the_notebooks_measured(tmp_path):
    """The book's build, never measured here, is priced from the notebooks measured so far (a slower machine is
    slower at both), asked again at each line: the cpu book's line said "about 1:00 left" for a build of 2:05 when
    its price was fixed before any notebook had run."""
    costs = progress.Costs("cpu", reference_seconds={})  # no reference measurements: the guesses
    bar = progress.Progress([("build the book", costs.book_seconds)], io.StringIO())
    guess = progress.GUESS_SECONDS["cpu"]
    assert bar.left() == guess["book"]
    costs.notebook_done(NotebookJob("f9", tmp_path, {}, []), 3 * guess["notebook"])
    assert bar.left() == pytest.approx(2 * guess["book"])  # the median of the guess and the one measured
    costs.notebook_done(NotebookJob("f1", tmp_path, {}, []), 3 * guess["notebook"])
    assert bar.left() == pytest.approx(3 * guess["book"])
    costs.book_done(125.0)
    assert bar.left() == 125.0


def test_one_long_notebook_does_not_price_every_other():
    """Without reference measurements, a notebook not yet run here is priced at the median of those measured so far,
    the guess among them: after the cpu book's F1 (30 s) and F3 (614 s), the mean (322 s) priced each other notebook
    at ten times a typical one's."""
    costs = progress.Costs("cpu", reference_seconds={})
    guess = progress.GUESS_SECONDS["cpu"]["notebook"]
    for name, seconds in (("f1_model", 30.0), ("f3_trajectories", 614.0)):
        costs.notebook_done(NotebookJob(name, Path("/nonexistent"), {}, []), seconds)
    job = NotebookJob("f9_time_embedding", Path("/nonexistent"), {}, [])
    assert costs.notebook_seconds(job) == guess
    for seconds in (198.0, 22.0, 98.0, 136.0):
        costs.notebook_done(NotebookJob("other", Path("/nonexistent"), {}, []), seconds)
    assert costs.notebook_seconds(job) == 98.0  # median of 45, 30, 614, 198, 22, 98, 136


@pytest.mark.parametrize("share", [0.25, 0.5, 0.75])
def test_the_time_left_comes_within_a_quarter_of_the_truth(tmp_path, share):
    """From a quarter of a fresh pipeline on, learned from its own runs as they train: within 25% of the time it
    then still took."""
    at = share * TRACE["wall"]
    left, truth = time_left(TRACE, at, tmp_path), TRACE["wall"] - at
    assert left is not None and abs(left - truth) <= 0.25 * truth, (at, left, truth)


def test_an_earlier_builds_timings_price_every_run_from_the_start(tmp_path):
    """What a build measured (``state.json``'s ``timings``, by config hash) prices the same runs in the next one
    before any of them has logged a step; each measurement is saved as it enters (a build that is killed keeps what it
    measured), and what was saved last prices the next build."""
    saved = []
    costs = progress.Costs(TRACE["preset"], save=lambda: saved.append(json.dumps(costs.timings)))
    for unit, u in zip(bench.replay_units(TRACE, tmp_path / "first"), TRACE["units"]):
        unit[0].run_dir.mkdir(parents=True)
        (unit[0].run_dir / "metrics.jsonl").write_text(
            "".join(json.dumps({"step": s, "time": EPOCH + t}) + "\n" for s, t in u["logged"]))
        costs.began(unit, EPOCH + u["begin"])
        costs.ended(unit, EPOCH + u["end"])
    for n in TRACE["notebooks"]:
        costs.notebook_done(NotebookJob(n["name"], tmp_path, {}, []), n["end"] - n["begin"])
    costs.book_done(TRACE["book"])
    assert set(costs.timings["runs"]) == {u["members"][0]["hash"] for u in TRACE["units"]}
    assert len(saved) == len(TRACE["units"]) + len(TRACE["notebooks"]) + 1
    assert len(json.loads(saved[len(TRACE["units"])])["notebooks"]) == 1  # the first notebook, saved as it ended
    at = min(u["begin"] for u in TRACE["units"]) + 0.5
    left, truth = time_left(TRACE, at, tmp_path / "again", json.loads(saved[-1])), TRACE["wall"] - at
    assert left is not None and abs(left - truth) <= 0.25 * truth, (left, truth)


def test_a_notebook_not_run_here_is_priced_from_the_reference():
    """The preset's reference measurements price a notebook this machine has not run yet, at this machine's pace
    once some notebook has run here (the median of their ratios); a notebook the reference lacks, as without one."""
    ref = {"notebooks": {"f1_model": 30.0, "f3_trajectories": 600.0, "f9_time_embedding": 150.0}, "book": 120.0}
    costs = progress.Costs("cpu", reference_seconds=ref)
    f9, new = (NotebookJob(name, Path("/nonexistent"), {}, []) for name in ("f9_time_embedding", "new"))
    assert costs.notebook_seconds(f9) == 150.0 and costs.book_seconds() == 120.0  # this machine's pace not known yet
    costs.notebook_done(NotebookJob("f1_model", Path("/nonexistent"), {}, []), 60.0)  # twice the reference's
    costs.notebook_done(NotebookJob("f3_trajectories", Path("/nonexistent"), {}, []), 1800.0)  # three times
    assert costs.slowness() == 2.5
    assert costs.notebook_seconds(f9) == 375.0 and costs.book_seconds() == 300.0
    assert costs.notebook_seconds(new) == 60.0  # the median of the guess (45 s), 60 s and 1800 s


@pytest.mark.parametrize("preset", ["smoke", "cpu"])
def test_the_reference_measured_every_notebook_of_its_preset(preset):
    """``config/<preset>/notebook_seconds.json`` (``benchmarks/time_left.py --reference``) holds each notebook of the
    preset and the book, with where and when they were measured."""
    from diffeqformer.pipeline import registry

    ref = progress.reference(preset)
    assert set(ref["notebooks"]) == set(registry.presets()[preset]) and ref["book"] > 0
    assert all(seconds > 0 for seconds in ref["notebooks"].values())
    assert ref["preset"] == preset and ref["machine"] and ref["commit"] and ref["measured"]
