"""The smoke pipeline, run once per test session for the tests marked ``pipeline`` (end to end, browser).

``make test`` runs those tests in one process beside the unit tests, with ``DIFFEQFORMER_SMOKE_HOME`` pointing at a
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
    rewritten: list[str]
    """The outputs (``OUTPUTS``) that the second run added, changed or removed, relative to ``home``."""

    @property
    def html(self) -> Path:
        return self.home / "_build" / "html"


OUTPUTS = ("runs", "_build/pipeline/cache", "_build/html")
"""What a run with nothing to do leaves as it is: the trained runs, the executed notebooks (the pipeline's cache of
them) and the built book. (``figures/`` is gathered from that cache again on every run; ``state.json`` and the logs
are written again.)"""


def outputs(home: Path) -> dict[str, tuple[int, int, int]]:
    """Every file of ``OUTPUTS`` below ``home``: its path relative to ``home`` -> (inode, mtime in ns, size)."""
    found = {}
    for folder in OUTPUTS:
        for f in (home / folder).rglob("*"):
            if f.is_file():
                stat = f.stat()
                found[str(f.relative_to(home))] = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
    return found


def _run(home: Path) -> PipelineRun:
    env = {**os.environ, "DIFFEQFORMER_HOME": str(home), "PYTHONUNBUFFERED": "1"}
    start = time.perf_counter()
    out = subprocess.run(COMMAND, env=env, capture_output=True, text=True, timeout=1800)
    return PipelineRun(out.returncode, time.perf_counter() - start, out.stdout, out.stderr)


_done: list[SmokeBook] = []  # the fixture is imported by two test modules: run the pipeline once per process


@pytest.fixture(scope="session")
def smoke_book(tmp_path_factory) -> SmokeBook:
    """The smoke pipeline run twice in one DIFFEQFORMER_HOME: the first run does the work (or finds it cached), the
    second must find everything cached (and so rewrite none of the ``OUTPUTS``)."""
    if _done:
        return _done[0]
    home = Path(os.environ.get("DIFFEQFORMER_SMOKE_HOME") or tmp_path_factory.mktemp("smoke-home")).resolve()
    home.mkdir(parents=True, exist_ok=True)
    if not (home / "data").exists():
        # The corpus, its tokenizer and Levanter's token caches are inputs, not outputs: share the repository's.
        (home / "data").symlink_to(paths.DATA, target_is_directory=True)
    shutil.rmtree(home / "runs" / ".stale", ignore_errors=True)  # smoke runs moved aside last time: cheap to redo
    first = _run(home)
    before = outputs(home)
    second = _run(home) if first.returncode == 0 else None
    after = outputs(home)
    rewritten = sorted(name for name in before.keys() | after.keys() if before.get(name) != after.get(name))
    for name, r in (("first", first), ("second", second)):
        if r is not None:
            print(f"smoke pipeline, {name} run: {r.seconds:.1f} s (exit {r.returncode})")
    _done.append(SmokeBook(home, first, second, rewritten))
    return _done[0]
