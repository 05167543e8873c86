"""Every path of the project, as pathlib constants, so that entry points work from any directory.

``DIFFEQFORMER_HOME`` moves the writable folders (data cache, runs, figures) elsewhere, e.g. on Colab.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

import filelock

REPO = Path(__file__).resolve().parents[2]
"""The repository root (src/diffeqformer/paths.py -> ../../..)."""
HOME = Path(os.environ.get("DIFFEQFORMER_HOME", REPO)).resolve()
"""Root of everything the project writes."""

CONFIG = REPO / "config"
NOTEBOOKS = REPO / "notebooks"
BOOK = REPO / "book"
DATA = HOME / "data"
"""Scripts and README are committed here; downloads and caches go below it and are git-ignored."""
DATA_RAW = DATA / "raw"
DATA_CACHE = DATA / "cache"
RUNS = HOME / "runs"
FIGURES = HOME / "figures"

def home_relative(path) -> str:
    """``path`` as records and pages show it: relative to ``HOME`` where it lies below it (``runs/cpu-gpt2``, the
    same on every machine), else absolute."""
    path = Path(path).resolve()
    return str(path.relative_to(HOME)) if path.is_relative_to(HOME) else str(path)


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a hidden temporary file beside it, so that a process killed while writing
    leaves the old file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


@contextlib.contextmanager
def exclusive(lock_file: Path, waiting: str):
    """Hold ``filelock``'s lock on ``lock_file`` (made with its folder if missing) for the block: a second process
    that asks for it prints ``waiting`` and waits until the first one's block ends (or it dies)."""
    lock = filelock.FileLock(lock_file)
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    try:
        lock.acquire(blocking=False)
    except filelock.Timeout:
        print(waiting, file=sys.stderr)
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


def read_json(path: Path, remedy: str):
    """The JSON object in ``path``; a file that is not valid JSON (a disk filled while writing, an edit by hand) is
    refused with ``ValueError`` naming the file and saying what to do (``remedy``)."""
    import json

    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{path} is corrupt ({error}): {remedy}") from None
