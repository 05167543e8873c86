"""The smoke workflow killed (SIGKILL of its process group, as a crash or a pre-empted machine would) in the middle of
training and in the middle of executing notebooks, then rerun: it finishes with the same figures and glued numbers as
an uninterrupted run (an interrupted training resumes from its Levanter checkpoint: Snakemake deletes a killed job's
marker, never the run directory), no process of the killed one lives on, and a kill never leaves half-written figures
or a half-built book.

Slow (two smoke workflows from nothing, about 15 minutes on two cores): ``make test-slow``. The kill moments come from
a seeded generator (``DIFFEQFORMER_KILL_SEED`` replays them, see ``interrupt.py``)."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import random
import re
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest
from interrupt import kill_seed
from smoke_pipeline import command

from diffeqformer import paths

pytestmark = pytest.mark.slow
VOLATILE = {"date", "seconds", "wall_s", "finished", "time", "tokens_per_second", "wall_time_s", "elapsed"}
"""Fields of the figure records that measure the machine, not the result."""
MEASURED_COLUMN = re.compile(r"tokens/s|MiB|_s$")
"""Table columns that measure the machine (throughput, memory, seconds): two runs never agree on them."""
MEASURED_FIGURES = {"f5_timings", "f9_time_embedding", "f9_memory_fit", "f9_memory_table", "f9_measured"}
"""Figures that are measurements of the machine (F5's timings, F9's throughput and memory panels, F9's memory fit and
its table, which has a row of the resident memory, F9's measured training steps as measured)."""
MEASURED_GLUE = {"f5_time_fast", "f5_time_direct", "f5_speedup", "f9_throughput", "f9_memory", *MEASURED_FIGURES}
"""Glued values that measure the machine: F5's Lyapunov timings and speed-up, F9's throughput and memory ratios, and
the measured figures' glued images."""


def _home(tmp_path_factory, name: str) -> Path:
    home = tmp_path_factory.mktemp(name)
    (home / "data").symlink_to(paths.DATA, target_is_directory=True)  # the corpus is an input: share it
    return home


def _env(home: Path) -> dict:
    return {**os.environ, "DIFFEQFORMER_HOME": str(home), "PYTHONUNBUFFERED": "1"}


def _run(home: Path, *extra: str) -> subprocess.CompletedProcess:
    out = subprocess.run(command(home, *extra), env=_env(home), capture_output=True, text=True, timeout=2400)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out


def _tree(root: Path) -> dict[str, str]:
    """Every file below ``root``, by relative path, with the hash of its bytes."""
    if not root.exists():
        return {}
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _kill_when(home: Path, ready, seed: int, what: str, *extra: str) -> None:
    """Start the workflow in a process group of its own, wait for ``ready(its output so far)``, SIGKILL the group (as
    a killed terminal or a pre-empted machine does), and check that none of its processes (Snakemake, its jobs,
    notebook kernels, F9's measuring processes) lives on."""
    log = home / f"workflow-{len(list(home.glob('workflow-*.log')))}.log"
    with log.open("w") as out:
        proc = subprocess.Popen(command(home, *extra), env=_env(home), stdout=out, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True)
        deadline = time.time() + 1800
        while not ready(log.read_text()):
            assert proc.poll() is None, \
                f"(kill seed {seed}) the workflow ended before {what}:\n{log.read_text()[-3000:]}"
            assert time.time() < deadline, f"(kill seed {seed}) not at {what} within 30 minutes"
            time.sleep(0.05)
        children = psutil.Process(proc.pid).children(recursive=True)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    gone, alive = psutil.wait_procs(children, timeout=20)
    for p in alive:
        p.kill()
    alive = [p for p in alive if _running(p)]  # a zombie has ended: it waits only to be reaped by its new parent
    assert not alive, f"(kill seed {seed}) processes of the workflow killed at {what} lived on: {alive}"


def _running(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _glued(executed: Path) -> dict[str, str]:
    """Every glued value of the executed notebooks in the folder ``executed`` (MyST-NB ``glue``), by notebook and
    name, but those that measure the machine (``MEASURED_GLUE``)."""
    values = {}
    for nb in sorted(executed.glob("*.ipynb")):
        for cell in json.loads(nb.read_text())["cells"]:
            for output in cell.get("outputs", []):
                meta = output.get("metadata", {}).get("scrapbook", {})
                if meta.get("name") and meta["name"] not in MEASURED_GLUE:
                    values[f"{nb.stem}:{meta['name']}"] = json.dumps(output.get("data"), sort_keys=True)
    return values


def _figure_data(home: Path) -> dict:
    """The figures' records without what measures the machine (dates, durations) and with the home folder as
    ``<home>``, the tables without their columns that measure the machine (``MEASURED_COLUMN``), and the bytes of
    every other data file (images; an SVG without its creation date), ``MEASURED_FIGURES`` aside."""
    figures = home / "figures"
    records, files = {}, {}
    for p in sorted(figures.iterdir()):
        if p.suffix == ".json":
            record = json.loads(p.read_text().replace(str(home), "<home>"))
            records[p.name] = {k: v for k, v in record.items() if k not in VOLATILE}
        elif p.stem in MEASURED_FIGURES:
            continue
        elif p.suffix == ".csv":
            rows = list(csv.reader(io.StringIO(p.read_text())))
            keep = [i for i, name in enumerate(rows[0]) if not MEASURED_COLUMN.search(name)] if rows else []
            files[p.name] = [[row[i] for i in keep if i < len(row)] for row in rows]
        else:
            data = p.read_bytes()
            if p.suffix == ".svg":
                data = re.sub(rb"<dc:date>[^<]*</dc:date>", b"", data)
            files[p.name] = hashlib.sha256(data).hexdigest()
    return {"records": records, "files": files}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    home = _home(tmp_path_factory, "uninterrupted")
    _run(home)
    return home


def test_a_killed_workflow_reruns_to_the_same_figures(uninterrupted, tmp_path_factory):
    seed = kill_seed()
    rng = random.Random(seed)
    home = _home(tmp_path_factory, "killed")

    # 1. In the middle of training: once some run has logged a random number of steps.
    steps = rng.randint(3, 15)

    def training(_):
        return any(max((json.loads(line).get("step") or -1 for line in m.read_text().splitlines()[:-1]
                        if line.strip()), default=-1) >= steps for m in (home / "runs").glob("*/metrics.jsonl"))

    _kill_when(home, training, seed, f"step {steps} of the first training run")
    assert not (home / "figures").exists() and not (home / "_build" / "html").exists()

    # 2. In the middle of executing a notebook, a random one of the first three.
    nth = rng.randint(1, 3)

    def executing(output):
        started = re.findall(r"rule notebook_(\w+):", output)
        return len(started) >= nth and any(
            (home / "_build" / "workflow" / "smoke" / "notebooks").glob(f".{started[nth - 1]}-*/notebook.ipynb"))

    _kill_when(home, executing, seed, f"notebook {nth}")
    assert not (home / "figures").exists() and not (home / "_build" / "html").exists()

    # 3. Rerun: it finishes, with the uninterrupted run's figures and glued numbers.
    _run(home)
    executed = Path("_build") / "workflow" / "smoke" / "notebooks"
    assert _figure_data(home) == _figure_data(uninterrupted), f"kill seed {seed}"
    assert _glued(home / executed) == _glued(uninterrupted / executed) != {}, f"kill seed {seed}"
    assert (home / "_build" / "html" / "index.html").exists()

    # 4. A forced re-execution killed in the middle of its notebooks leaves the finished figures and book as they were.
    figures, html = _tree(home / "figures"), _tree(home / "_build" / "html")
    nth = rng.randint(1, 3)
    made = json.loads((home / "_build" / "workflow" / "smoke" / "plan.json").read_text())["plan"]
    every = [f"notebook_{job['name']}" for job in made["notebooks"]]
    _kill_when(home, executing, seed, f"notebook {nth} of a forced re-execution", "--forcerun", *every)
    assert _tree(home / "figures") == figures and _tree(home / "_build" / "html") == html, f"kill seed {seed}"
