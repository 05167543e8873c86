"""What each job of ``workflow/Snakefile`` runs: ``python -m diffeqformer.workflow.jobs tokens|train|notebook|publish
...`` (the book job: ``python -m diffeqformer.workflow.build``). Each writes its outputs only once it has succeeded (a temporary name, then a rename), so that a job
killed midway leaves nothing that Snakemake or a reader could take for a result.

Imports nothing heavy at the top: a training job pins itself to its cores before JAX starts its CPU backend."""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import re
import runpy
import shutil
import sys
import tempfile
import time
from pathlib import Path

from .. import paths

KEPT_HEAP = ("glibc.malloc.mmap_threshold=4294967296", "glibc.malloc.trim_threshold=4294967296")
"""glibc malloc settings (``GLIBC_TUNABLES``) for every job: allocations of up to 4 GiB come from the heap and freed
memory stays there, to be reused, where by default glibc maps every allocation above its threshold afresh and
unmaps it when freed, so that each of XLA's CPU steps (which allocates its buffers on every call) touched new pages.
The trained parameters are the same, bit for bit. glibc reads them at a process's start; elsewhere they are
ignored."""
ONE_ARENA = ("glibc.malloc.arena_max=1",)
"""Added for a training job pinned to its cores: one heap for all its threads, whose own arenas otherwise give freed
memory back as well. Not for the jobs that run on every core, where it slows XLA's multi-threaded compilation."""
SHARED_DEVICE = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
"""JAX's settings for every job: on a GPU, JAX takes 75% of the device's memory when a process starts, so that a
second training or a notebook's kernel beside one would find none left; with these, each process allocates what it
uses. The user's own settings win. A CPU ignores them."""
PRUNE_CHECKPOINTS = "DIFFEQFORMER_PRUNE_CHECKPOINTS"
"""Environment variable: ``1`` deletes a run's Levanter checkpoints once the run is complete (the notebooks read its
``model.eqx`` and ``complete.json``), so that a preset's runs fit a small disk."""
IOPUB_TIMEOUT_S = 300
"""How long a cell's output may lag behind its end before Papermill gives up on it (nbclient's default, 4 s, can
fail a cell that has finished, on a busy machine)."""


SLURM_REFUSALS = {
    "Invalid partition name": "slurm_partition (default-resources in the profile's config.yaml)",
    "Invalid account": "slurm_account (default-resources in the profile's config.yaml)",
    "More processors requested than permitted": "cpus_per_task (default-resources in the profile's config.yaml)",
    "Invalid generic resource": "gpus (training in the profile's cluster.yaml)",
    "Memory required by task is not available": "mem_mb (default-resources in the profile's config.yaml)",
    "Requested node configuration is not available": "nodes, tasks or gpus (training in the profile's cluster.yaml), "
                                                     "cpus_per_task or mem_mb (default-resources)",
}
"""What ``sbatch`` says when the cluster refuses a job, and the profile field that asked for it."""


def slurm_refusals(log: str) -> list[str]:
    """One line for each distinct refusal of ``sbatch`` in a workflow's log, naming the profile field to edit (the
    Snakefile's ``onerror`` prints them)."""
    found = {}
    for line in log.splitlines():
        for said, field in SLURM_REFUSALS.items():
            if "sbatch" in line and said.lower() in line.lower():
                found.setdefault(said, f"error: the cluster refused a job ({said}): edit {field}")
    return list(found.values())


def keep_heap(tunables: str | None, settings: tuple[str, ...] = KEPT_HEAP) -> str:
    """``GLIBC_TUNABLES`` with ``settings`` added, keeping any setting of the same names already in ``tunables``."""
    items = [t for t in (tunables or "").split(":") if t]
    names = {t.split("=", 1)[0] for t in items}
    return ":".join(items + [t for t in settings if t.split("=", 1)[0] not in names])


def job_env(env) -> None:
    """What every job's environment gets (``env``, e.g. ``os.environ``, before the jobs start): ``KEPT_HEAP``,
    ``SHARED_DEVICE``, unbuffered output, one tokenizer thread."""
    env["GLIBC_TUNABLES"] = keep_heap(env.get("GLIBC_TUNABLES"))
    for name, value in {**SHARED_DEVICE, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}.items():
        env.setdefault(name, value)


def hold_checkout(folder: Path = Path(".snakemake")):
    """The lock of the one workflow that runs in this directory (``folder/diffeqformer.lock``, held by this process
    until it ends, however it ends), or None where another workflow holds it. Holding it, the locks that Snakemake
    left in ``folder/locks`` are a killed workflow's (SIGKILL, a machine lost), which would refuse every later run
    until ``--unlock``: they are removed. The Snakefile takes it in the main process of a local workflow."""
    folder.mkdir(parents=True, exist_ok=True)
    held = open(folder / "diffeqformer.lock", "w")
    try:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        held.close()
        return None
    stale = sorted((folder / "locks").glob("*.lock"))
    for lock in stale:
        lock.unlink()
    if stale:
        print(f"removed {len(stale)} lock(s) that an interrupted workflow left in {folder / 'locks'}", file=sys.stderr)
    return held


# ---------------------------------------------------------------------------------------------- training jobs


@contextlib.contextmanager
def pinned(threads: int, folder: Path):
    """Run on ``threads`` cores of this process's that no other training job holds (a lock file per core in
    ``folder``, released when the process ends, however it ends), before JAX sizes its thread pool by the cores a
    process may run on: a run trains on the same number of threads, and so to the same bits, whatever runs beside it
    and however many cores ``--cores`` gives Snakemake. Where every core is held (more jobs than cores), it takes the
    first ones: the same threads, only slower."""
    if not hasattr(os, "sched_setaffinity") or "SLURM_STEP_ID" in os.environ:  # SLURM binds a task's cores itself
        yield
        return
    cores = sorted(os.sched_getaffinity(0))
    folder.mkdir(parents=True, exist_ok=True)
    held, taken = [], []
    for core in cores:
        if len(taken) == threads:
            break
        f = open(folder / f"core-{core}.lock", "w")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.close()
            continue
        held.append(f)
        taken.append(core)
    os.sched_setaffinity(0, set(taken if len(taken) == threads else cores[:threads]))
    try:
        yield
    finally:
        for f in held:
            f.close()


def set_aside_stale(run_dir: Path, digest: str) -> None:
    """Move ``run_dir`` to ``runs/.stale/`` when it holds a run of another configuration than ``digest`` (its
    ``config.yaml`` records another hash): Snakemake reruns a training whose configuration changed, and its old
    checkpoints must not be resumed. A run of the same configuration, interrupted, stays and resumes."""
    from ..runs import saved_hash

    saved = saved_hash(run_dir)
    if saved is None or saved == digest:
        return
    aside = run_dir.parent / ".stale" / f"{run_dir.name}-{saved[-12:]}"
    aside.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(aside, ignore_errors=True)
    os.replace(run_dir, aside)
    print(f"moved {run_dir} (a run of another configuration) to {aside}", file=sys.stderr, flush=True)


def train(args) -> None:
    """A training job: the run (or a population's runs) trained by ``python ARGV`` in this process, on its own
    cores; then, in the first process of the job, each run's marker (the job's outputs)."""
    from ..runs import COMPLETE, checkpoints, is_complete

    first = os.environ.get("SLURM_PROCID", "0") == "0"
    runs = [paths.HOME / r for r in args.runs]
    if first:
        for run_dir, digest in zip(runs, args.hashes):
            set_aside_stale(run_dir, digest)
    with pinned(args.threads, paths.HOME / "_build" / "workflow" / "cores"):
        module = args.argv[1]
        sys.argv = [module, *args.argv[2:]]
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        except SystemExit as err:
            if err.code not in (None, 0):
                raise
    if not first:
        return
    for run_dir, digest, marker in zip(runs, args.hashes, args.outputs):
        if not is_complete(run_dir, digest):
            raise SystemExit(f"error: {run_dir} has no {COMPLETE} for config hash {digest} after its training")
        paths.write_atomic(paths.HOME / marker, json.dumps({"config_hash": digest}) + "\n")
        if os.environ.get(PRUNE_CHECKPOINTS) == "1":
            shutil.rmtree(checkpoints(run_dir), ignore_errors=True)


def tokens(args) -> None:
    """A token-cache job: the training and validation caches of one run's data, built before the trainings that
    read them (so that no two trainings build one at once)."""
    from .. import config as configs
    from ..data import corpora

    cls = configs.FinetuneConfig if args.module == "finetune" else configs.TrainConfig
    argv = args.argv
    config = configs.load_config(argv[1], argv[2:], cls=cls)
    corpora.build_token_caches(config.data.levanter_config())
    paths.write_atomic(Path(args.output), json.dumps({"data": repr(config.data)}) + "\n")


# --------------------------------------------------------------------------------------------- notebook jobs


def kernel_over_unix_sockets(folder: str):
    """Jupyter configuration under which kernel and client talk over Unix sockets in ``folder`` instead of TCP ports:
    a port found free by one notebook job can be taken by a kernel another job starts in between ("Address already
    in use"); sockets in a folder of the job's own cannot collide."""
    from traitlets.config import Config

    config = Config()
    config.KernelManager.transport = "ipc"
    config.KernelManager.ip = os.path.join(folder, "kernel")
    return config


def check_outputs(path: Path, notebook: str) -> None:
    """No output of the executed notebook holds a Python traceback (a logged exception does not stop Papermill), and
    none shows a figure as its text (``<Figure size 1300x340 with 5 Axes>``, with no image)."""
    nb = json.loads(Path(path).read_text())
    for i, cell in enumerate(nb["cells"]):
        for out in cell.get("outputs", []):
            text = "".join(out.get("text", ""))
            if out.get("output_type") == "error" or "Traceback (most recent call last)" in text:
                raise SystemExit(f"error: notebook {notebook}: cell {i} printed a traceback:\n{text[-2000:]}")
            data = out.get("data", {})
            plain = "".join(data.get("text/plain", ""))
            if plain.startswith("<Figure size") and not any(k.startswith("image/") for k in data):
                raise SystemExit(f"error: notebook {notebook}: cell {i} shows a figure as text, {plain.strip()!r}: "
                                 f"show figures with diffeqformer.report.figures.save_figure")


def check_figures(folder: Path, notebook: str) -> list[str]:
    """Every figure a notebook saved (``<name>.json`` provenance) has all its files, none empty; their names."""
    names = []
    for record_path in sorted(Path(folder).glob("*.json")):
        record = json.loads(record_path.read_text())
        for f in record["files"]:
            if not (folder / f).exists() or (folder / f).stat().st_size == 0:
                raise SystemExit(f"error: notebook {notebook}: figure file {f} is missing or empty")
        names.append(record["figure"])
    return names


def _execute(notebook: str, work: Path, parameters: dict, name: str) -> float:
    """Papermill on ``notebook`` into ``work/notebook.ipynb`` (the kernel's figures into ``work/figures``), its
    outputs and figures checked; the seconds it took. ``SystemExit`` with the failing cell's exception."""
    import papermill
    from papermill.exceptions import PapermillExecutionError

    os.environ.update(DIFFEQFORMER_FIGURES=str(work / "figures"), PYDEVD_DISABLE_FILE_VALIDATION="1")
    start = time.time()
    try:
        with tempfile.TemporaryDirectory(prefix="diffeqformer-kernel-") as sockets:
            papermill.execute_notebook(notebook, work / "notebook.ipynb", parameters=parameters,
                                       kernel_name="python3", progress_bar=False, log_output=True,
                                       cwd=str(paths.HOME), config=kernel_over_unix_sockets(sockets),
                                       iopub_timeout=IOPUB_TIMEOUT_S)
    except PapermillExecutionError as err:
        trace = "\n".join(re.sub(r"\x1b\[[0-9;]*m", "", line) for line in err.traceback[-12:])
        raise SystemExit(f"error: notebook {name} failed in cell {err.exec_count}: {err.ename}: {err.evalue}\n"
                         f"{trace}") from None
    check_outputs(work / "notebook.ipynb", name)
    check_figures(work / "figures", name)
    return time.time() - start


def notebook(args) -> None:
    """A notebook job: Papermill executes the notebook with its parameters in a work folder of the job's own, the
    outputs are checked, then the executed notebook, its figures and its record (parameters, seconds) are renamed
    into place. A failing cell or check stops the job with its error; the executed copy, with the error, is kept in
    ``failed/``, and nothing of the work folder is left."""
    output, figures, record = Path(args.output), Path(args.figures), Path(args.record)
    work = Path(tempfile.mkdtemp(prefix=f".{args.name}-", dir=output.parent))
    (work / "figures").mkdir()
    parameters = json.loads(args.parameters)
    try:
        seconds = _execute(args.input, work, parameters, args.name)
    except BaseException as err:
        message = getattr(err, "code", None)
        if isinstance(err, SystemExit) and (work / "notebook.ipynb").exists():
            failed = output.parent.parent / "failed" / f"{args.name}.ipynb"
            failed.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(work / "notebook.ipynb", failed)
            message = f"{err.code}\n(the executed notebook, with the error, is in {failed})"
        shutil.rmtree(work, ignore_errors=True)
        if isinstance(err, SystemExit):
            raise SystemExit(message) from None
        raise
    paths.write_atomic(record, json.dumps({"notebook": args.name, "seconds": seconds, "parameters": parameters,
                                           "date": time.strftime("%Y-%m-%dT%H:%M:%S%z")}, indent=1) + "\n")
    swap_in(work / "figures", figures)
    os.replace(work / "notebook.ipynb", output)
    shutil.rmtree(work, ignore_errors=True)


# ------------------------------------------------------------------------------------------------- the book


def swap_in(new: Path, dest: Path) -> None:
    """Replace ``dest`` by ``new`` (same file system): the old one is removed only once the new one is in place."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    old = dest.with_name(f".{dest.name}.old-{os.getpid()}")
    if dest.exists() or dest.is_symlink():
        os.replace(dest, old)
    os.replace(new, dest)
    if old.is_dir() and not old.is_symlink():
        shutil.rmtree(old, ignore_errors=True)
    elif old.exists() or old.is_symlink():
        old.unlink()


def publish(args) -> None:
    """The last job: ``_build/html`` and ``figures/`` point at this preset's book and figures (symbolic links
    replaced in one rename each), which exist only once every notebook and the book have succeeded."""
    from .plan import folder

    for link, target in ((paths.HOME / "_build" / "html", folder(args.preset) / "html"),
                         (paths.FIGURES, folder(args.preset) / "figures")):
        new = link.with_name(f".{link.name}.new-{os.getpid()}")
        new.symlink_to(os.path.relpath(target, link.parent))
        swap_in(new, link)
    paths.write_atomic(Path(args.output), json.dumps({"preset": args.preset}) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m diffeqformer.workflow.jobs", description=__doc__.split("\n")[0])
    verbs = parser.add_subparsers(dest="verb", required=True)
    t = verbs.add_parser("train")
    t.add_argument("--runs", nargs="+", required=True)
    t.add_argument("--hashes", nargs="+", required=True)
    t.add_argument("--outputs", nargs="+", required=True)
    t.add_argument("--threads", type=int, default=1)
    t.add_argument("argv", nargs=argparse.REMAINDER)
    k = verbs.add_parser("tokens")
    k.add_argument("--module", default="train")
    k.add_argument("--output", required=True)
    k.add_argument("argv", nargs=argparse.REMAINDER)
    n = verbs.add_parser("notebook")
    for name in ("name", "input", "output", "figures", "record", "parameters"):
        n.add_argument(f"--{name}", required=True)
    b = verbs.add_parser("publish")
    b.add_argument("--preset", required=True)
    b.add_argument("--output", required=True)
    args = parser.parse_args(argv)
    if getattr(args, "argv", None) and args.argv[0] == "--":
        args.argv = args.argv[1:]
    globals()[args.verb](args)


if __name__ == "__main__":
    main()
