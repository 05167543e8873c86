"""diffeqformer.workflow.jobs, what each job of ``workflow/Snakefile`` runs: a notebook job on tiny notebooks (its
outputs only on success, a failing cell named with a copy kept, figures checked, its kernel on Unix sockets), a
training job (its cores, its markers, a stale run set aside, checkpoints pruned when asked), the jobs' environment,
and publishing a preset's book."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from diffeqformer import paths, runs
from diffeqformer.workflow import jobs, plan

PINNING = hasattr(os, "sched_setaffinity")

# -------------------------------------------------------------------------------------------- notebook jobs


def _notebook(path: Path, name: str, body: str | None = None) -> Path:
    """A tiny notebook: a parameters cell (``preset``, ``x``), then a cell that saves a figure with pyplot and fails
    for a negative ``x`` (or ``body``)."""
    nb = nbformat.v4.new_notebook()
    nb.metadata = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}
    params = nbformat.v4.new_code_cell('preset: str = "x"\nx: int = 1  # must be positive')
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params, nbformat.v4.new_code_cell(body if body is not None else (
        "import os\nimport matplotlib.pyplot as plt\nfrom diffeqformer.report import figures\n"
        f"figures.start({name!r}, dict(preset=preset, x=x))\n"
        "fig, ax = plt.subplots()\nax.plot([0, x])\n"
        f"figures.save_figure(fig, {name + '_fig'!r}, caption='A line.', show=False)\n"
        "print('cwd:', os.getcwd(), 'x:', x)\n"
        "if x < 0:\n    raise ValueError(f'x must be positive, got {x}')\n"))]
    nbformat.write(nb, path)
    return path


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A temporary DIFFEQFORMER_HOME, for this process and the kernels it starts."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setattr(paths, "HOME", home)
    monkeypatch.setattr(paths, "FIGURES", home / "figures")
    monkeypatch.setenv("DIFFEQFORMER_HOME", str(home))
    return home


def _outputs(name: str) -> dict[str, Path]:
    """Where the Snakefile puts notebook ``name``'s outputs: below ``_build/workflow/p/``."""
    work = plan.folder("p")
    return {"output": work / "notebooks" / f"{name}.ipynb", "figures": work / "notebook-figures" / name,
            "record": work / "records" / f"{name}.json"}


def _execute(notebook: Path, name: str, **parameters) -> dict[str, Path]:
    """``python -m diffeqformer.workflow.jobs notebook ...`` in this process, as the Snakefile's rule runs it (which
    makes the output's folder first); its outputs."""
    out = _outputs(name)
    out["output"].parent.mkdir(parents=True, exist_ok=True)
    jobs.main(["notebook", "--name", name, "--input", str(notebook), "--output", str(out["output"]),
               "--figures", str(out["figures"]), "--record", str(out["record"]),
               "--parameters", json.dumps({"preset": "p", **parameters})])
    return out


def _printed(notebook: Path) -> str:
    return "".join(o.get("text", "") for c in nbformat.read(notebook, as_version=4).cells
                   for o in c.get("outputs", []))


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_notebook_job_writes_the_executed_notebook_its_figures_and_its_record(home, tmp_path):
    """Executed with its parameters in the home (its working directory), the kernel's figures in the job's own folder
    (not ``figures/``), then renamed into place; nothing of the job's work is left beside its outputs."""
    out = _execute(_notebook(tmp_path / "nb_a.ipynb", "nb_a"), "nb_a", x=2)
    assert f"cwd: {home} x: 2" in _printed(out["output"])
    assert sorted(p.name for p in out["figures"].iterdir()) == ["nb_a_fig.json", "nb_a_fig.png", "nb_a_fig.svg"]
    assert json.loads((out["figures"] / "nb_a_fig.json").read_text())["parameters"] == {"preset": "p", "x": 2}
    record = json.loads(out["record"].read_text())
    assert record["notebook"] == "nb_a" and record["parameters"] == {"preset": "p", "x": 2} and record["seconds"] > 0
    assert sorted(p.name for p in out["output"].parent.iterdir()) == ["nb_a.ipynb"]
    assert not paths.FIGURES.exists() and not (plan.folder("p") / "failed").exists()


def test_a_failing_cell_stops_the_job_with_its_error_and_leaves_the_previous_outputs(home, tmp_path):
    """The message names the notebook, the cell, the exception and the copy kept in ``failed/``; the outputs of the
    last run that succeeded stay as they were."""
    notebook = _notebook(tmp_path / "nb_a.ipynb", "nb_a")
    out = _execute(notebook, "nb_a", x=1)
    before = _files(plan.folder("p"))
    with pytest.raises(SystemExit) as stopped:
        _execute(notebook, "nb_a", x=-1)
    message = str(stopped.value.code)
    failed = plan.folder("p") / "failed" / "nb_a.ipynb"
    assert message.startswith("error: notebook nb_a failed in cell ") and str(failed) in message
    assert "ValueError: x must be positive, got -1" in message and "raise ValueError" in message
    cell = int(message.split("failed in cell ")[1].split(":")[0])
    errors = [c for c in nbformat.read(failed, as_version=4).cells
              if any(o.output_type == "error" for o in c.get("outputs", []))]
    assert [c.execution_count for c in errors] == [cell]  # the cell named is the one that failed
    assert _files(plan.folder("p")) == {**before, "failed/nb_a.ipynb": failed.read_bytes()}
    assert "x: 1" in _printed(out["output"])


def test_a_figure_shown_as_text_stops_the_job(home, tmp_path):
    """A ``Figure`` shown as an object without an image (``<Figure size ...>``) stops the job before any output is
    written; ``check_outputs`` passes the same figure with its image, and stops on a printed traceback."""
    body = "from matplotlib.figure import Figure\nfig = Figure()\nfig.add_subplot().plot([0, x])\nfig"
    with pytest.raises(SystemExit, match=r"notebook nb_a: cell \d shows a figure as text, "
                                         r"'<Figure size 640x480 with 1 Axes>': show figures with "):
        _execute(_notebook(tmp_path / "nb_a.ipynb", "nb_a", body), "nb_a")
    assert not any(p.exists() for p in _outputs("nb_a").values())
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("display(fig)", outputs=[nbformat.v4.new_output(
        "display_data", data={"text/plain": "<Figure size 1300x340 with 5 Axes>"})])]
    nbformat.write(nb, tmp_path / "nb.ipynb")
    with pytest.raises(SystemExit, match="cell 0 shows a figure as text, '<Figure size 1300x340 with 5 Axes>'"):
        jobs.check_outputs(tmp_path / "nb.ipynb", "nb")
    nb.cells[0].outputs[0]["data"]["image/png"] = "iVBORw0KGgo="
    nbformat.write(nb, tmp_path / "nb.ipynb")
    jobs.check_outputs(tmp_path / "nb.ipynb", "nb")  # the same figure with its image
    nb.cells[0].outputs.append(nbformat.v4.new_output(
        "stream", name="stderr", text="Traceback (most recent call last):\n  ...\nKeyError: 'a'\n"))
    nbformat.write(nb, tmp_path / "nb.ipynb")
    with pytest.raises(SystemExit, match="notebook nb: cell 0 printed a traceback:\nTraceback"):
        jobs.check_outputs(tmp_path / "nb.ipynb", "nb")


def test_a_figure_with_a_missing_file_stops_the_job(tmp_path):
    """``check_figures``: each saved figure's record names files that exist and are not empty."""
    (tmp_path / "f.json").write_text(json.dumps({"figure": "f", "files": ["f.png", "f.json"]}))
    (tmp_path / "f.png").write_bytes(b"")
    with pytest.raises(SystemExit, match="notebook nb: figure file f.png is missing or empty"):
        jobs.check_figures(tmp_path, "nb")
    (tmp_path / "f.png").write_bytes(b"\x89PNG")
    assert jobs.check_figures(tmp_path, "nb") == ["f"]


def test_a_notebook_that_fails_a_check_leaves_no_work_folder(home, tmp_path, monkeypatch):
    """A notebook whose outputs fail a check (here a printed traceback) leaves nothing beside the outputs, as a
    failing cell does, and its executed copy in ``failed/``."""
    import papermill

    def execute(source, target, **kwargs):
        nb = nbformat.v4.new_notebook()
        nb.cells = [nbformat.v4.new_code_cell("1", outputs=[nbformat.v4.new_output(
            "stream", name="stderr", text="Traceback (most recent call last):\nKeyError: 'a'\n")])]
        nbformat.write(nb, target)

    monkeypatch.setattr(papermill, "execute_notebook", execute)
    with pytest.raises(SystemExit, match="printed a traceback"):
        _execute(tmp_path / "in.ipynb", "nb_a")
    assert list(_outputs("nb_a")["output"].parent.iterdir()) == []
    assert (plan.folder("p") / "failed" / "nb_a.ipynb").exists()


def test_a_figure_built_without_pyplot_is_an_image_in_the_executed_notebook(home, tmp_path):
    """The kernel loads no matplotlib backend for a ``Figure`` made without pyplot (as spectra.py makes F2's): shown
    as an object it was text only, ``<Figure size ...>``. ``save_figure`` shows the PNG it saved."""
    body = ("from matplotlib.figure import Figure\nfrom diffeqformer.report import figures\n"
            "figures.start('nb_a', dict(preset=preset, x=x))\n"
            "fig = Figure()\nfig.add_subplot().plot([0, x])\n"
            "figures.save_figure(fig, 'nb_a_fig', caption='A line.')\n")
    out = _execute(_notebook(tmp_path / "nb_a.ipynb", "nb_a", body), "nb_a")
    shown = [sorted(o.data) for o in nbformat.read(out["output"], as_version=4).cells[-1].outputs
             if o.output_type == "display_data"]
    assert shown[:2] == [["image/png", "text/plain"], ["text/markdown", "text/plain"]]


def test_a_notebook_kernel_listens_on_unix_sockets_of_its_own(home, tmp_path):
    """The job starts its kernel on ZeroMQ's ipc transport, in a folder it removes afterwards: over TCP ports, a
    kernel started beside another job's kernels could find its port taken and die at start (CI failed so: "Address
    already in use", then "Kernel died before replying to kernel_info")."""
    body = ("import json\nfrom ipykernel import get_connection_file\n"
            f"json.dump(json.load(open(get_connection_file())), open({str(tmp_path / 'connection.json')!r}, 'w'))\n")
    _execute(_notebook(tmp_path / "nb.ipynb", "nb", body), "nb")
    connection = json.loads((tmp_path / "connection.json").read_text())
    assert connection["transport"] == "ipc", connection
    sockets = Path(connection["ip"]).parent
    assert sockets.name.startswith("diffeqformer-kernel-") and not sockets.exists()


def test_a_notebook_waits_for_a_busy_kernels_output(home, tmp_path, monkeypatch):
    """Papermill makes nbclient's 4 s wait for a finished cell's output an error; on a machine busy with other work
    that failed F3's notebook in a `make book`. The notebook jobs wait minutes (``IOPUB_TIMEOUT_S``)."""
    import papermill

    seen = {}

    def execute(source, target, **kwargs):
        seen.update(kwargs)
        nbformat.write(nbformat.v4.new_notebook(), target)

    monkeypatch.setattr(papermill, "execute_notebook", execute)
    out = _execute(tmp_path / "in.ipynb", "nb", x=3)
    assert seen["iopub_timeout"] == jobs.IOPUB_TIMEOUT_S >= 60
    assert seen["parameters"] == {"preset": "p", "x": 3} and seen["cwd"] == str(home)
    assert seen["config"].KernelManager.transport == "ipc" and out["output"].exists()


# -------------------------------------------------------------------------------------------- training jobs


@pytest.fixture
def affinity():
    """This thread's cores, restored afterwards (``jobs.pinned`` pins the process it runs in for good)."""
    before = os.sched_getaffinity(0) if PINNING else None
    yield before
    if PINNING:
        os.sched_setaffinity(0, before)


HOLDER = ("import os, sys\nfrom pathlib import Path\nfrom diffeqformer.workflow import jobs\n"
          "with jobs.pinned(1, Path(sys.argv[1])):\n    print(sorted(os.sched_getaffinity(0)), flush=True)\n"
          "    sys.stdin.readline()\n")


@pytest.mark.skipif(not PINNING or len(os.sched_getaffinity(0)) < 2, reason="needs two cores to pin to")
def test_two_training_jobs_pin_themselves_to_cores_of_their_own(tmp_path, monkeypatch, affinity):
    """``pinned(threads, folder)``: a job takes ``threads`` of its cores that no other job holds (a lock per core,
    released when the holder ends); where too few are free it takes the first ones. Under SLURM too: a node that
    does not bind tasks to cores leaves a training every core, whose threads would change its bits."""
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        theirs = set(json.loads(holder.stdout.readline()))
        with jobs.pinned(1, tmp_path):
            ours = os.sched_getaffinity(0)
        assert len(theirs) == len(ours) == 1 and theirs != ours and theirs | ours <= affinity
        os.sched_setaffinity(0, affinity)
        with jobs.pinned(2, tmp_path):  # one core is free: the first two, the same threads
            assert os.sched_getaffinity(0) == set(sorted(affinity)[:2])
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    os.sched_setaffinity(0, affinity)
    with jobs.pinned(1, tmp_path):  # the holder ended: its core is free again
        assert os.sched_getaffinity(0) == {min(affinity)}
    os.sched_setaffinity(0, affinity)
    monkeypatch.setenv("SLURM_STEP_ID", "0")
    with jobs.pinned(1, tmp_path):
        assert os.sched_getaffinity(0) == {min(affinity)}


def test_a_run_of_another_configuration_is_set_aside_and_one_of_the_same_stays(tmp_path):
    """A run directory whose ``config.yaml`` records another config hash moves to ``runs/.stale/`` (its checkpoints
    must not be resumed); one of the same hash stays and resumes; a directory without one is left alone."""
    run = tmp_path / "runs" / "smoke-gpt2"
    (run / runs.CHECKPOINTS / "step-1").mkdir(parents=True)
    (run / runs.CONFIG).write_text(f"{runs.HASH_PREFIX}0123456789abcdef\nname: smoke-gpt2\n")
    jobs.set_aside_stale(run, "0123456789abcdef")
    assert (run / runs.CHECKPOINTS / "step-1").is_dir()
    jobs.set_aside_stale(run, "fedcba9876543210")
    aside = tmp_path / "runs" / ".stale" / "smoke-gpt2-456789abcdef"
    assert not run.exists() and (aside / runs.CHECKPOINTS / "step-1").is_dir()
    assert (aside / runs.CONFIG).read_text().startswith(f"{runs.HASH_PREFIX}0123456789abcdef\n")
    (run / runs.CHECKPOINTS).mkdir(parents=True)
    jobs.set_aside_stale(run, "fedcba9876543210")
    jobs.set_aside_stale(tmp_path / "runs" / "missing", "fedcba9876543210")
    assert (run / runs.CHECKPOINTS).is_dir() and not (tmp_path / "runs" / "missing").exists()


TRAINER = """\
import json, os, sys
from pathlib import Path

args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
run = Path(args["--run"])
(run / "checkpoints" / "step-1").mkdir(parents=True, exist_ok=True)
(run / "cores.json").write_text(json.dumps(sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []))
if "--exit" in args:
    raise SystemExit(int(args["--exit"]))
(run / "complete.json").write_text(json.dumps({"config_hash": args["--hash"]}))
"""
"""Stands in for ``diffeqformer.train``: leaves a checkpoint, the cores it ran on and a ``complete.json`` of the
config hash it is given (or exits with ``--exit``)."""


@pytest.fixture
def trainer(home, tmp_path, monkeypatch, affinity):
    """``train(*argv, digest=...)``: a training job of run ``runs/a`` (config hash ``digest``) whose module is
    ``TRAINER``, run in this process as the Snakefile's rule runs it."""
    (tmp_path / "fake_trainer.py").write_text(TRAINER)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "argv", list(sys.argv))  # the job sets the module's
    for name in ("SLURM_PROCID", "SLURM_STEP_ID", jobs.PRUNE_CHECKPOINTS):
        monkeypatch.delenv(name, raising=False)

    def train(*argv, digest="0123456789abcdef"):
        jobs.main(["train", "--threads", "1", "--runs", "runs/a", "--hashes", digest, "--outputs",
                   f"runs/a/trained-{digest}.json", "--", "-m", "fake_trainer", "--run", str(home / "runs" / "a"),
                   *argv])

    return train


@pytest.mark.parametrize("prune", [False, True])
def test_a_training_job_writes_its_marker_and_prunes_checkpoints_when_asked(home, trainer, monkeypatch, prune):
    """The job trains on one core of its own and, the run complete for its hash, writes the marker (its output);
    with ``DIFFEQFORMER_PRUNE_CHECKPOINTS=1`` (a GPU machine's small disk) the run's checkpoints are deleted, its
    summary kept; without it they stay (resume, as on this machine)."""
    if prune:
        monkeypatch.setenv(jobs.PRUNE_CHECKPOINTS, "1")
    trainer("--hash", "0123456789abcdef")
    run = home / "runs" / "a"
    marker = run / "trained-0123456789abcdef.json"
    assert json.loads(marker.read_text()) == {"config_hash": "0123456789abcdef"}
    assert runs.is_complete(run, "0123456789abcdef") and runs.checkpoints(run).exists() is not prune
    assert len(json.loads((run / "cores.json").read_text())) == (1 if PINNING else 0)


def test_a_training_job_that_leaves_no_complete_run_writes_no_marker(home, trainer):
    """A trainer that fails fails the job with its status; one that ends without a ``complete.json`` of the job's
    config hash stops the job, naming it; neither writes a marker. A stale run there is set aside first."""
    run = home / "runs" / "a"
    (run / runs.CHECKPOINTS / "old").mkdir(parents=True)
    (run / runs.CONFIG).write_text(f"{runs.HASH_PREFIX}aaaaaaaaaaaaaaaa\n")
    with pytest.raises(SystemExit) as failed:
        trainer("--hash", "0123456789abcdef", "--exit", "3")
    assert failed.value.code == 3
    assert (home / "runs" / ".stale" / "a-aaaaaaaaaaaa" / runs.CHECKPOINTS / "old").is_dir()
    with pytest.raises(SystemExit, match=f"error: {run} has no complete.json for config hash 0123456789abcdef"):
        trainer("--hash", "another")
    assert not list(run.glob("trained-*.json"))


def test_a_training_jobs_other_processes_write_no_marker(home, trainer, monkeypatch):
    """Under SLURM every task of a job runs the same command: only the first (``SLURM_PROCID=0``) writes the
    markers."""
    monkeypatch.setenv("SLURM_PROCID", "1")
    trainer("--hash", "0123456789abcdef")
    assert runs.is_complete(home / "runs" / "a") and not list((home / "runs" / "a").glob("trained-*.json"))


def test_every_job_reuses_freed_memory_and_shares_the_gpu(monkeypatch):
    """``job_env`` (the Snakefile applies it to its own environment, which every job inherits): the heap settings
    (``KEPT_HEAP``, the user's own settings of the same names kept), JAX allocating GPU memory as it needs it (the
    user's choice wins), unbuffered output, one tokenizer thread. A training job adds ``ONE_ARENA``."""
    assert jobs.keep_heap(None) == ":".join(jobs.KEPT_HEAP)
    assert jobs.keep_heap("glibc.malloc.trim_threshold=0:glibc.rtld.x=1") == \
        ":".join(["glibc.malloc.trim_threshold=0", "glibc.rtld.x=1", jobs.KEPT_HEAP[0]])  # the user's stay
    assert jobs.keep_heap("a=1", jobs.ONE_ARENA) == ":".join(["a=1", *jobs.ONE_ARENA])
    assert jobs.keep_heap(jobs.keep_heap(None), jobs.ONE_ARENA) == ":".join(jobs.KEPT_HEAP + jobs.ONE_ARENA)
    assert not any("arena" in t for t in jobs.KEPT_HEAP)  # one arena slowed multi-threaded compilation
    env: dict[str, str] = {}
    jobs.job_env(env)
    assert env == {"GLIBC_TUNABLES": jobs.keep_heap(None), "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
                   "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
    jobs.job_env(env)
    assert env["GLIBC_TUNABLES"] == jobs.keep_heap(None)  # applied twice, the same
    env = {"XLA_PYTHON_CLIENT_PREALLOCATE": "true", "GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=1"}
    jobs.job_env(env)
    assert env["XLA_PYTHON_CLIENT_PREALLOCATE"] == "true"
    assert env["GLIBC_TUNABLES"] == ":".join(["glibc.malloc.mmap_threshold=1", jobs.KEPT_HEAP[1]])


# ------------------------------------------------------------------------------------------- the book, published


def test_swap_in_replaces_a_folder_and_a_link(tmp_path):
    """``swap_in``: the new folder in place, the old one removed (nothing left beside it); a symbolic link replaced
    without touching the folder it pointed at."""
    (tmp_path / "new").mkdir()
    (tmp_path / "new" / "a").write_text("new")
    jobs.swap_in(tmp_path / "new", tmp_path / "out" / "dest")  # nothing there yet
    (tmp_path / "newer").mkdir()
    (tmp_path / "newer" / "b").write_text("newer")
    jobs.swap_in(tmp_path / "newer", tmp_path / "out" / "dest")
    assert _files(tmp_path / "out") == {"dest/b": b"newer"} and not (tmp_path / "newer").exists()
    (tmp_path / "target").mkdir()
    (tmp_path / "target" / "kept").write_text("kept")
    (tmp_path / "link").symlink_to("target")
    (tmp_path / "link2").symlink_to("out/dest")
    jobs.swap_in(tmp_path / "link2", tmp_path / "link")
    assert os.readlink(tmp_path / "link") == "out/dest" and (tmp_path / "link" / "b").read_text() == "newer"
    assert (tmp_path / "target" / "kept").read_text() == "kept"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "out", "target"]


def test_publishing_points_the_book_and_the_figures_at_the_presets(home):
    """``jobs publish``: ``_build/html`` and ``figures`` become relative symbolic links to the preset's
    ``_build/workflow/<preset>/html`` and ``figures``; publishing another preset moves them, leaving the first's."""
    for preset in ("p", "q"):
        for name in ("html", "figures"):
            (plan.folder(preset) / name).mkdir(parents=True)
            (plan.folder(preset) / name / "index").write_text(preset)
    jobs.main(["publish", "--preset", "p", "--output", str(home / "_build" / "published.json")])
    assert os.readlink(home / "_build" / "html") == "workflow/p/html"
    assert os.readlink(home / "figures") == "_build/workflow/p/figures"
    assert (home / "figures" / "index").read_text() == (home / "_build" / "html" / "index").read_text() == "p"
    assert json.loads((home / "_build" / "published.json").read_text()) == {"preset": "p"}
    jobs.main(["publish", "--preset", "q", "--output", str(home / "_build" / "published.json")])
    assert os.readlink(home / "_build" / "html") == "workflow/q/html"
    assert (home / "figures" / "index").read_text() == "q"
    assert (plan.folder("p") / "html" / "index").read_text() == "p"
    assert sorted(p.name for p in (home / "_build").iterdir()) == ["html", "published.json", "workflow"]


def test_the_workflow_holding_the_checkout_removes_a_killed_workflows_locks(tmp_path):
    """``hold_checkout``: the first holder removes the locks Snakemake left in ``.snakemake/locks``; a second workflow
    while the first runs gets None and leaves them; the lock is free again once its holder has closed it."""
    folder = tmp_path / ".snakemake"
    (folder / "locks").mkdir(parents=True)
    (folder / "locks" / "0.output.lock").write_text("runs/x\n")
    first = jobs.hold_checkout(folder)
    assert first is not None and not any((folder / "locks").iterdir())
    (folder / "locks" / "0.output.lock").write_text("runs/x\n")  # the running workflow's own lock
    assert jobs.hold_checkout(folder) is None and (folder / "locks" / "0.output.lock").exists()
    first.close()
    again = jobs.hold_checkout(folder)
    assert again is not None and not (folder / "locks" / "0.output.lock").exists()
    again.close()


def test_a_job_the_cluster_refuses_is_reported_with_the_profile_field_to_edit():
    """``jobs.slurm_refusals``: each distinct refusal of sbatch in a workflow's log, once, with the field that asked for
    it; a log without one gives nothing."""
    log = ("SLURM sbatch failed. The error message was 'sbatch: error: Batch job submission failed: Invalid partition "
           "name specified'.\n    sbatch call:\n        sbatch -p nowhere ...\n") * 2
    assert jobs.slurm_refusals(log) == ["error: the cluster refused a job (Invalid partition name): edit "
                                        "slurm_partition (default-resources in the profile's config.yaml)"]
    assert jobs.slurm_refusals("Invalid partition name, said a user\nall done") == []
