"""The workflow on Snakemake, end to end (marked ``pipeline``: the smoke workflow's process of ``make test``): every
notebook executed and the book built; a second run does nothing; what reruns after a change (Snakemake's dry runs in
a copy of the smoke home); the same numbers whatever ``--cores``; bad input refused in one line; a failing job's log;
the dry runs of the gpu preset and of the SLURM profile."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from smoke_pipeline import command, losses, new_home, run_workflow, smoke_book  # noqa: F401 (session fixture)

from diffeqformer import paths
from diffeqformer.workflow.presets import presets

pytestmark = pytest.mark.pipeline
SMOKE = presets()["smoke"]
FAILING = 'set=["f1_model.unit=no_such_weight"]'
"""A parameter value that F1's notebook refuses in its first cells (the plan of it is made once, for two tests)."""


def _plan(home: Path, preset: str) -> dict:
    """The plan the workflow made in ``home`` (``plan.load`` keeps it there)."""
    return json.loads((home / "_build" / "workflow" / preset / "plan.json").read_text())["plan"]


@pytest.fixture(scope="module")
def smoke_plan(smoke_book):
    return _plan(smoke_book.home, "smoke")


def _copy(home: Path, dest: Path) -> Path:
    """A copy of the smoke home (its runs, outputs and Snakemake's records; the corpus shared by its link)."""
    shutil.copytree(home, dest, symlinks=True, ignore=shutil.ignore_patterns("jax-cache"))
    return dest


def _would_run(home: Path, **options) -> set[str]:
    """The jobs a dry run of the workflow in ``home`` lists (Snakemake's job table)."""
    out = run_workflow(home, "-n", "--quiet", "rules", **options)
    assert out.returncode == 0, out.explain()
    text = out.stdout + out.stderr
    if "Nothing to be done" in text:
        return set()
    table = text.split("Job stats:", 1)[1].split("\n\n", 1)[0]
    return {m[1] for m in re.finditer(r"^(\w+)\s+\d+\s*$", table, flags=re.M)} - {"total"}


@contextlib.contextmanager
def _edited(path: Path, new: str | None = None):
    """``path`` edited (to ``new``; by default a comment added: Snakemake compares an input's checksum as well as its
    time), then restored, bytes and time."""
    stat, text = path.stat(), path.read_bytes()
    assert new is None or new.encode() != text
    comment = b"\n# edited by a test\n" if path.suffix == ".py" else b"\n<!-- edited by a test -->\n"
    path.write_bytes(text + comment if new is None else new.encode())
    try:
        yield
    finally:
        path.write_bytes(text)
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def test_smoke_workflow_end_to_end(smoke_book):
    """Every notebook of the smoke preset executes, every figure file exists and is not empty, the book builds with
    warnings as errors, one log per job; a second run with nothing changed trains, executes and builds nothing."""
    book = smoke_book
    assert book.first.returncode == 0, book.first.explain()
    figures = book.home / "figures"
    records = [json.loads(p.read_text()) for p in figures.glob("*.json")]
    names = {r["figure"] for r in records}
    assert {"f1_schematic", "f1_weights", "f6_curves", "f6_table"} <= names
    for record in records:
        assert "Scale: smoke preset" in record["caption"]
        # provenance names runs relative to the home ('runs/smoke-gpt2'), not by this machine's paths
        assert record["runs"] and all(r.startswith("runs/") for r in record["runs"]), record["runs"]
        assert str(book.home) not in json.dumps(record), record["figure"]
        for f in record["files"]:
            assert (figures / f).stat().st_size > 0, f
    plots = {r["figure"] for r in records if any(f.endswith(".png") for f in r["files"])}  # tables are CSV only
    assert {"f1_schematic", "f2_radius", "f4_controls", "f5_lyapunov_map", "f6_curves"} <= plots
    for name in plots:
        assert (figures / f"{name}.png").stat().st_size > 1000 and (figures / f"{name}.svg").stat().st_size > 0
    assert (book.html / "index.html").exists()
    for nb in SMOKE:
        assert (book.html / "notebooks" / f"{nb}.html").exists(), nb
    # the parameters in the registry's order: F6 pairs its models in the order of its dict
    record = json.loads((book.home / "_build" / "workflow" / "smoke" / "records" / "f6_perplexity.json").read_text())
    assert list(record["parameters"]["runs"]) == list(SMOKE["f6_perplexity"]["runs"]) == ["gpt", "shared", "ours"]
    logs = {p.name for p in (book.home / "_build" / "workflow" / "smoke" / "logs").iterdir()}
    assert {f"notebook-{nb}.log" for nb in SMOKE} | {"book.log"} <= logs
    assert book.second is not None and book.second.returncode == 0, book.second.explain()
    assert "Nothing to be done" in book.second.stdout + book.second.stderr
    assert not book.rewritten, f"a run with nothing to do rewrote {book.rewritten[:10]}"


def test_a_changed_module_reruns_only_the_notebooks_that_import_it(smoke_book, smoke_plan):
    """An analysis module edited: the notebooks that import it, directly or through other modules, are executed
    again, then the book; no training, no other notebook. A chapter edited: the book alone."""
    module = paths.REPO / "src" / "diffeqformer" / "analysis" / "spectra.py"
    importers = {f"notebook_{job['name']}" for job in smoke_plan["notebooks"] if str(module) in job["sources"]}
    assert "notebook_f2_spectra" in importers and len(importers) < len(SMOKE)
    with _edited(module):
        assert _would_run(smoke_book.home) == importers | {"book", "publish", "all"}
    with _edited(paths.BOOK / "model.md"):
        assert _would_run(smoke_book.home) == {"book", "publish", "all"}


def test_a_changed_parameter_or_config_reruns_what_reads_it(smoke_book, smoke_plan):
    """A notebook parameter changed: that notebook and the book. A training config changed (its config hash, and so
    the name of its job's output): that training, the notebooks that read the run, the book; nothing else."""
    assert _would_run(smoke_book.home, config=(FAILING,)) == {"notebook_f1_model", "book", "publish", "all"}
    unit = next(u for u in smoke_plan["trainings"] if u["runs"] == ["runs/smoke-shared"])
    readers = {f"notebook_{job['name']}" for job in smoke_plan["notebooks"] if unit["outputs"][0] in job["inputs"]}
    assert readers and len(readers) < len(SMOKE)
    config = paths.CONFIG / "smoke" / "shared.yaml"
    with _edited(config, config.read_text().replace("learning_rate: 3e-3", "learning_rate: 3.1e-3")):
        assert _would_run(smoke_book.home) == {f"train_{unit['name']}", *readers, "book", "publish", "all"}


def test_a_run_trains_to_the_same_numbers_whatever_the_cores(smoke_book, smoke_plan, tmp_path):
    """One training job run alone with ``--cores 1`` in a fresh home (its token cache built: the data folder is shared)
    gives the metrics of the same run trained with ``--cores 2`` beside other jobs in the smoke home, bit for bit (each
    training job's threads are fixed)."""
    home = new_home(tmp_path / "home")
    unit = next(u for u in smoke_plan["trainings"] if "runs/smoke-gpt2" in u["runs"])
    tokens = Path("_build/workflow/smoke/tokens") / f"{unit['tokens']}.json"  # its token cache, in the shared data
    (home / tokens).parent.mkdir(parents=True)
    shutil.copy(smoke_book.home / tokens, home / tokens)
    out = run_workflow(home, f"train_{unit['name']}", cores=1)
    assert out.returncode == 0, out.explain()
    run = Path("runs") / "smoke-gpt2"
    assert losses(home / run) == losses(smoke_book.home / run) and any(losses(home / run))


def test_a_failing_job_prints_its_log_and_leaves_the_book(smoke_book, tmp_path):
    """A notebook that fails: the job's name and the end of its log are printed, the workflow stops, and the book and
    figures it had built stay as they were."""
    home = _copy(smoke_book.home, tmp_path / "home")
    before = {p: (home / p).resolve() for p in ("_build/html", "figures")}
    out = run_workflow(home, config=(FAILING,))
    text = out.stdout + out.stderr
    assert out.returncode != 0
    assert "notebook_f1_model" in text and "--- the end of _build/workflow/smoke/logs/notebook-f1_model.log" in text
    assert "no_such_weight" in text
    assert {p: (home / p).resolve() for p in before} == before and (home / "_build/html/index.html").exists()
    assert (home / "_build" / "workflow" / "smoke" / "failed" / "f1_model.ipynb").exists()


def test_bad_input_is_refused_in_one_line_before_anything_runs(smoke_book, tmp_path):
    """An unknown preset: refused before any job starts, in one line naming it (Snakemake's report of the plan's
    error; the plan's other refusals, parameters of the wrong type or undeclared, configs that do not parse, a
    notebook missing from ``_toc.yml``: ``test_workflow_plan.py``)."""
    home = tmp_path / "home"
    home.mkdir()
    out = run_workflow(home, preset="nope")
    errors = [line for line in (out.stdout + out.stderr).splitlines() if "unknown preset" in line]
    assert out.returncode != 0 and len(errors) == 1 and "unknown preset 'nope'; choose one of: smoke" in errors[0]
    assert not (home / "runs").exists() and not (home / "_build" / "html").exists()


def test_the_gpu_preset_and_the_slurm_profile_dry_run(tmp_path):
    """Without a GPU or a cluster: the gpu preset's dry run lists every training of its plan; the SLURM profile's
    dry run of the paper preset gives each training its nodes, tasks, GPUs and srun."""
    listed = _would_run(tmp_path, preset="gpu")
    gpu = _plan(tmp_path, "gpu")
    assert {f"train_{u['name']}" for u in gpu["trainings"]} <= listed
    out = subprocess.run(command(tmp_path, "-n", "--profile", str(paths.REPO / "workflow/profiles/slurm"),
                                 preset="paper"), capture_output=True, text=True, cwd=paths.REPO)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-3000:]
    jobs = re.findall(r"rule (train_\w+):.*?resources: ([^\n]*)", text, flags=re.S)
    assert jobs and all("nodes=1" in r and "tasks=8" in r and "gpu=8" in r and "mpi=srun" in r for _, r in jobs)
