"""Executing one notebook: Papermill in a child process, then the checks of what it printed and saved."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from .. import paths
from ..forks import ADDRESS, ForkServer
from .planning import NotebookJob, PipelineError, cache_dir, work_dir
from .processes import child_env


def _strip_ansi(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


_CHILDREN: set = set()
"""The notebook executions running now (``execute_notebook``), for ``stop_notebooks``."""


def stop_notebooks() -> None:
    """End every notebook execution still running (another lane failed)."""
    for proc in list(_CHILDREN):
        if proc.poll() is None:
            proc.terminate()


def notebook_env(figures: Path | None = None) -> dict[str, str]:
    """The environment of a notebook's Papermill child (and so of its kernel): this process's, with its figures
    folder (``figures``), the child's parent (``processes.child_env``) and unbuffered output."""
    env = {**child_env(os.environ), "PYDEVD_DISABLE_FILE_VALIDATION": "1", "PYTHONUNBUFFERED": "1"}
    return env if figures is None else {**env, "DIFFEQFORMER_FIGURES": str(figures)}


FORKS_OFF = "DIFFEQFORMER_NOTEBOOK_FORKS"
"""Environment variable: ``0`` starts every notebook's processes afresh (``forks`` off)."""


def fork_server(log: Path) -> ForkServer | None:
    """A ``forks.ForkServer`` for this pipeline's notebooks, with their environment (``notebook_env``), its
    output to ``log``; None where ``FORKS_OFF`` is ``0``, and outside Linux (where forking a process that has
    imported these libraries is not known to be safe: macOS's system libraries, for one, refuse some after a fork)."""
    if os.environ.get(FORKS_OFF) == "0" or not sys.platform.startswith("linux"):
        return None
    return ForkServer(notebook_env(), log)


def execute_notebook(job: NotebookJob, staging: Path, log: Path, forks: ForkServer | None = None) -> float:
    """Run one notebook with Papermill into ``staging``, then move the result into its cache entry. Returns the
    seconds it took. Papermill runs in a child process (``processes.execute_notebook_child``) with the notebook's own
    environment (its figures folder), so that two lanes can execute notebooks at once; its standard error, and the
    kernel's, goes to ``log``. With ``forks``, that process and the kernel are forked from it (``forks``), else
    started afresh. On error, keeps the executed copy in ``_build/pipeline/failed/`` and raises ``PipelineError``
    with the notebook's own exception and the end of its traceback."""
    work = staging / "execute" / job.name
    shutil.rmtree(work, ignore_errors=True)
    (work / "figures").mkdir(parents=True)
    output = work / "notebook.ipynb"
    env = notebook_env(work / "figures")
    if forks is not None:
        env[ADDRESS] = forks.address
    spec = {"input": str(job.path), "output": str(output), "parameters": job.parameters,
            "error": str(work / "error.json")}
    argv = ["-m", "diffeqformer.pipeline.processes", json.dumps(spec)]
    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.time()
    with log.open("a") as err_log, open(os.devnull) as devnull:
        proc = forks and forks.start(argv, env, paths.REPO, (devnull.fileno(), err_log.fileno(), err_log.fileno()))
        if proc is None:
            proc = subprocess.Popen([sys.executable, *argv], stdin=subprocess.DEVNULL, stdout=err_log,
                                    stderr=err_log, env=env, cwd=paths.REPO)
        _CHILDREN.add(proc)
        try:
            rc = proc.wait()
        finally:
            _CHILDREN.discard(proc)
    if rc != 0:
        failed = work_dir() / "failed" / f"{job.name}.ipynb"
        failed.parent.mkdir(parents=True, exist_ok=True)
        if output.exists():
            shutil.copy(output, failed)
        if (work / "error.json").exists():
            error = json.loads((work / "error.json").read_text())
            trace = "\n".join(_strip_ansi(line) for line in error["traceback"][-12:])
            raise PipelineError(f"notebook {job.name} failed in cell {error['exec_count']}: {error['ename']}: "
                                f"{error['evalue']}\n{trace}\n(the executed notebook, with the error, is in {failed})")
        tail = "\n".join(log.read_text().splitlines()[-25:])
        raise PipelineError(f"notebook {job.name}: its execution ended with exit code {rc}; the end of {log}:\n{tail}")
    seconds = time.time() - start
    check_outputs(output, job.name)
    check_figures(work / "figures", job.name)
    record = {"notebook": job.name, "key": job.key, "seconds": seconds, "parameters": job.parameters,
              "date": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    (work / "record.json").write_text(json.dumps(record, indent=1) + "\n")
    cache_dir().mkdir(parents=True, exist_ok=True)
    shutil.rmtree(job.cache_dir, ignore_errors=True)
    os.replace(work, job.cache_dir)
    return seconds


def check_outputs(path: Path, notebook: str) -> None:
    """No output of the executed notebook holds a Python traceback (a logged exception does not stop Papermill, and
    the book leaves standard error out), and none shows a figure as its text (``<Figure size 1300x340 with 5
    Axes>``, with no image: what a kernel displays for a figure when no PNG formatter is registered)."""
    nb = json.loads(Path(path).read_text())
    for i, cell in enumerate(nb["cells"]):
        for out in cell.get("outputs", []):
            text = out.get("text", "")
            text = "".join(text) if isinstance(text, list) else text
            if out.get("output_type") == "error" or "Traceback (most recent call last)" in text:
                raise PipelineError(f"notebook {notebook}: cell {i} printed a traceback:\n{text[-2000:]}")
            data = out.get("data", {})
            plain = data.get("text/plain", "")
            plain = "".join(plain) if isinstance(plain, list) else plain
            if plain.startswith("<Figure size") and not any(k.startswith("image/") for k in data):
                raise PipelineError(f"notebook {notebook}: cell {i} shows a figure as text, {plain.strip()!r}, not "
                                    f"as an image: show figures with diffeqformer.report.figures.save_figure (which "
                                    f"displays the PNG it saved)")


def check_figures(folder: Path, notebook: str) -> list[str]:
    """Every figure a notebook saved (``<name>.json`` provenance) has all its files, none empty."""
    names = []
    for record_path in sorted(folder.glob("*.json")):
        record = json.loads(record_path.read_text())
        for f in record["files"]:
            if not (folder / f).exists() or (folder / f).stat().st_size == 0:
                raise PipelineError(f"notebook {notebook}: figure file {f} is missing or empty")
        names.append(record["figure"])
    return names
