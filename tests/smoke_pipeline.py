"""The smoke workflow (Snakemake, ``workflow/Snakefile``), run once per test session for the tests marked
``pipeline`` (end to end, browser).

``make test`` runs those tests in one process beside the unit tests, with ``DIFFEQFORMER_SMOKE_HOME`` pointing at a
git-ignored folder, so that a second ``make test`` with nothing changed reuses the trained smoke runs and executed
notebooks; without it the workflow runs from nothing in a temporary folder. Either way the corpus (``data/``) is the
repository's, shared through a symbolic link.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from diffeqformer import paths

SNAKEMAKE = [str(Path(sys.executable).with_name("snakemake")), "-s", str(paths.REPO / "workflow" / "Snakefile")]
"""Snakemake on the workflow, from this environment."""


def command(home: Path, *extra: str, cores: int = 2, preset: str = "smoke", config: tuple = ()) -> list[str]:
    """The workflow's command for ``preset`` in ``home`` (Snakemake's ``--directory``), ``extra`` options and targets
    before its ``--config`` items (``config``: more of them, e.g. ``set=[...]``)."""
    return [*SNAKEMAKE, "--directory", str(home), "--cores", str(cores), "--rerun-incomplete", *extra,
            "--config", f"preset={preset}", *config]


@dataclass
class PipelineRun:
    returncode: int
    seconds: float
    stdout: str
    stderr: str

    def explain(self) -> str:
        return f"exit {self.returncode} after {self.seconds:.0f} s\n{self.stdout[-4000:]}\n{self.stderr[-4000:]}"


@dataclass
class SmokeBook:
    home: Path
    first: PipelineRun
    second: PipelineRun | None
    rewritten: list[str]
    """The outputs (``OUTPUTS``) that the second run added, changed or removed, relative to ``home``."""

    @property
    def html(self) -> Path:
        return self.home / "_build" / "html"


OUTPUTS = ("runs", "_build/workflow/smoke/notebooks", "_build/workflow/smoke/notebook-figures",
           "_build/workflow/smoke/html", "_build/workflow/smoke/figures", "_build/published.json")
"""What a run with nothing to do leaves as it is: the trained runs, the executed notebooks and their figures, the
built book, the gathered figures and the record of what ``_build/html`` and ``figures/`` point at."""


def outputs(home: Path) -> dict[str, tuple[int, int, int]]:
    """Every file of ``OUTPUTS`` below ``home``: its path relative to ``home`` -> (inode, mtime in ns, size)."""
    found = {}
    for folder in OUTPUTS:
        for f in [home / folder, *(home / folder).rglob("*")]:
            if f.is_file():
                stat = f.stat()
                found[str(f.relative_to(home))] = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
    return found


def run_workflow(home: Path, *extra: str, cores: int = 2, timeout: float = 1800, **options) -> PipelineRun:
    """The smoke workflow in ``home`` (``command``, with its ``options``), its output captured."""
    env = {**os.environ, "DIFFEQFORMER_HOME": str(home), "PYTHONUNBUFFERED": "1"}
    start = time.perf_counter()
    out = subprocess.run(command(home, *extra, cores=cores, **options), env=env, capture_output=True, text=True,
                         timeout=timeout)
    return PipelineRun(out.returncode, time.perf_counter() - start, out.stdout, out.stderr)


def losses(run_dir: Path) -> list[dict]:
    """Every line of a run's ``metrics.jsonl`` reduced to its losses: what two trainings of one run must share bit
    for bit."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if "loss" in k} for line in lines if line.strip()]


_done: list[SmokeBook] = []  # the fixture is imported by two test modules: run the pipeline once per process


def new_home(home: Path) -> Path:
    """A fresh DIFFEQFORMER_HOME for another workflow run: the corpus shared by a link and, once the smoke workflow
    has run in this process, its plan (which depends on the code, not on the home: ``plan.load`` checks its key), so
    that a test of what runs after the plan does not make the plan again (some 20 CPU-seconds)."""
    home.mkdir(parents=True, exist_ok=True)
    (home / "data").symlink_to(paths.DATA, target_is_directory=True)
    made = Path("_build/workflow/smoke/plan.json")
    if _done and (_done[0].home / made).exists():
        (home / made).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(_done[0].home / made, home / made)
    return home


@pytest.fixture(scope="session")
def smoke_book(tmp_path_factory) -> SmokeBook:
    """The smoke workflow run twice in one DIFFEQFORMER_HOME: the first run does the work (or finds it up to date), the
    second must find nothing to do (and so rewrite none of the ``OUTPUTS``)."""
    if _done:
        return _done[0]
    home = Path(os.environ.get("DIFFEQFORMER_SMOKE_HOME") or tmp_path_factory.mktemp("smoke-home")).resolve()
    home.mkdir(parents=True, exist_ok=True)
    if not (home / "data").exists():
        # The corpus, its tokenizer and Levanter's token caches are inputs, not outputs: share the repository's.
        (home / "data").symlink_to(paths.DATA, target_is_directory=True)
    shutil.rmtree(home / "runs" / ".stale", ignore_errors=True)  # smoke runs moved aside last time: cheap to redo
    first = run_workflow(home)
    before = outputs(home)
    second = run_workflow(home) if first.returncode == 0 else None
    after = outputs(home)
    rewritten = sorted(name for name in before.keys() | after.keys() if before.get(name) != after.get(name))
    for name, r in (("first", first), ("second", second)):
        if r is not None:
            print(f"smoke workflow, {name} run: {r.seconds:.1f} s (exit {r.returncode})")
    _done.append(SmokeBook(home, first, second, rewritten))
    return _done[0]
