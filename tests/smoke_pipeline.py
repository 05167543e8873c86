"""The smoke pipeline, run once per test session for the tests marked ``pipeline`` (end to end, browser).

``make test`` runs those tests in one process after the unit tests, with ``DIFFEQFORMER_SMOKE_HOME`` pointing at a
git-ignored folder, so that a second ``make test`` with nothing changed reuses the trained smoke runs and executed
notebooks; without it the pipeline runs from nothing in a temporary folder. Either way the corpus (``data/``) is the
repository's, shared through a symbolic link.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from diffeqformer import paths

# --retrain-stale: a change to the configuration dataclasses (a new field) changes every run's config hash; the
# smoke runs of an earlier `make test` are then trained again instead of stopping the pipeline.
COMMAND = [sys.executable, "-m", "diffeqformer.pipeline", "--preset", "smoke", "--retrain-stale"]


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

    @property
    def html(self) -> Path:
        return self.home / "_build" / "html"


def _run(home: Path) -> PipelineRun:
    env = {**os.environ, "DIFFEQFORMER_HOME": str(home), "PYTHONUNBUFFERED": "1"}
    start = time.perf_counter()
    out = subprocess.run(COMMAND, env=env, capture_output=True, text=True, timeout=1800)
    return PipelineRun(out.returncode, time.perf_counter() - start, out.stdout, out.stderr)


_done: list[SmokeBook] = []  # the fixture is imported by two test modules: run the pipeline once per process


@pytest.fixture(scope="session")
def smoke_book(tmp_path_factory) -> SmokeBook:
    """The smoke pipeline run twice in one DIFFEQFORMER_HOME: the first run does the work (or finds it cached), the
    second must find everything cached."""
    if _done:
        return _done[0]
    home = Path(os.environ.get("DIFFEQFORMER_SMOKE_HOME") or tmp_path_factory.mktemp("smoke-home")).resolve()
    home.mkdir(parents=True, exist_ok=True)
    if not (home / "data").exists():
        # The corpus, its tokenizer and Levanter's token caches are inputs, not outputs: share the repository's.
        (home / "data").symlink_to(paths.DATA, target_is_directory=True)
    shutil.rmtree(home / "runs" / ".stale", ignore_errors=True)  # smoke runs moved aside last time: cheap to redo
    first = _run(home)
    second = _run(home) if first.returncode == 0 else None
    for name, r in (("first", first), ("second", second)):
        if r is not None:
            print(f"smoke pipeline, {name} run: {r.seconds:.1f} s (exit {r.returncode})")
    _done.append(SmokeBook(home, first, second))
    return _done[0]
