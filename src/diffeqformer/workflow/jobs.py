"""What each job of ``workflow/Snakefile`` runs: ``python -m diffeqformer.workflow.jobs tokens|train|notebook|publish``
(the book: ``workflow.pages``). A job writes its outputs only once it has succeeded (a temporary name, then a rename).
Nothing heavy is imported at the top: a training job pins itself to its cores before JAX starts."""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import re
import runpy
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path

from .. import paths

KEPT_HEAP = ("glibc.malloc.mmap_threshold=4294967296", "glibc.malloc.trim_threshold=4294967296")
"""``GLIBC_TUNABLES`` of every job: allocations up to 4 GiB come from the heap and freed memory stays there, where
glibc would map and unmap each of XLA's per-step buffers afresh. The trained bits are the same."""
ONE_ARENA = ("glibc.malloc.arena_max=1",)
"""Added for a training job pinned to its cores (not for jobs on every core: it slows XLA's compilation)."""
PRUNE_CHECKPOINTS = "DIFFEQFORMER_PRUNE_CHECKPOINTS"
"""``1``: delete a run's Levanter checkpoints once it is complete, so that a preset's runs fit a small disk."""
IOPUB_TIMEOUT_S = 300
"""How long a cell's output may lag behind its end (nbclient's 4 s fails finished cells on a busy machine)."""


_PROFILE = "(default-resources in the profile's config.yaml)"
SLURM_REFUSALS = {
    "Invalid partition name": f"slurm_partition {_PROFILE}",
    "Invalid account": f"slurm_account {_PROFILE}",
    "More processors requested than permitted": f"cpus_per_task {_PROFILE}",
    "Invalid generic resource": "gpus (training in the profile's cluster.yaml)",
    "Memory required by task is not available": f"mem_mb {_PROFILE}",
    "Requested node configuration is not available": "nodes, tasks or gpus (training in the profile's cluster.yaml), "
                                                     "cpus_per_task or mem_mb (default-resources)",
}
"""What ``sbatch`` says when the cluster refuses a job -> the profile field that asked for it."""


def slurm_refusals(log: str) -> list[str]:
    """One line per distinct refusal of ``sbatch`` in a workflow's log, naming the profile field to edit."""
    found = {}
    for line in (line for line in log.splitlines() if "sbatch" in line):
        for said, field in SLURM_REFUSALS.items():
            if said.lower() in line.lower():
                found.setdefault(said, f"error: the cluster refused a job ({said}): edit {field}")
    return list(found.values())


def keep_heap(tunables: str | None, settings: tuple[str, ...] = KEPT_HEAP) -> str:
    """``GLIBC_TUNABLES`` with ``settings`` added, keeping any setting of the same names already in ``tunables``."""
    items = [t for t in (tunables or "").split(":") if t]
    names = {t.split("=", 1)[0] for t in items}
    return ":".join(items + [t for t in settings if t.split("=", 1)[0] not in names])


def job_env(env) -> None:
    """Every job's environment: ``KEPT_HEAP``; on a GPU, each process allocates what it uses (not 75% of the device)
    so that jobs can share it; unbuffered output; one tokenizer thread."""
    env["GLIBC_TUNABLES"] = keep_heap(env.get("GLIBC_TUNABLES"))
    for name, value in {"XLA_PYTHON_CLIENT_PREALLOCATE": "false", "PYTHONUNBUFFERED": "1",
                        "TOKENIZERS_PARALLELISM": "false"}.items():
        env.setdefault(name, value)


def _try_lock(path: Path):
    """``path`` opened and locked (``flock``, released when the process ends), or None where another holds it."""
    held = open(path, "w")
    try:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return held
    except BlockingIOError:
        held.close()


def hold_checkout(folder: Path = Path(".snakemake")):
    """The lock of the one workflow running in this directory, or None where another holds it. Held, the locks in
    ``folder/locks`` are a killed workflow's, which would refuse every run until ``--unlock``: they go."""
    folder.mkdir(parents=True, exist_ok=True)
    held = _try_lock(folder / "diffeqformer.lock")
    stale = sorted((folder / "locks").glob("*.lock")) if held else []
    for lock in stale:
        lock.unlink()
    if stale:
        print(f"removed {len(stale)} lock(s) that an interrupted workflow left in {folder / 'locks'}", file=sys.stderr)
    return held


@contextlib.contextmanager
def pinned(threads: int, folder: Path):
    """Run on ``threads`` of this process's cores that no other training holds (a lock file per core in ``folder``),
    before JAX sizes its thread pool: a run trains on as many threads, so to the same bits, whatever runs beside it.
    Where too few are free it takes the first ones. The locks are per host (``folder/<hostname>``): a cluster's nodes
    share the folder, and SLURM may leave a task every core of its node (``TaskPlugin=task/none``)."""
    if not hasattr(os, "sched_setaffinity"):
        yield
        return
    folder = folder / socket.gethostname()
    folder.mkdir(parents=True, exist_ok=True)
    cores, held = sorted(os.sched_getaffinity(0)), {}
    for core in cores:
        if len(held) < threads and (f := _try_lock(folder / f"core-{core}.lock")):
            held[core] = f
    os.sched_setaffinity(0, set(held) if len(held) == threads else set(cores[:threads]))
    try:
        yield
    finally:
        for f in held.values():
            f.close()


def set_aside_stale(run_dir: Path, digest: str) -> None:
    """Move ``run_dir`` to ``runs/.stale/`` when it holds a run of another config hash than ``digest``, so that its
    checkpoints are not resumed; an interrupted run of the same config stays and resumes."""
    from ..runs import saved_hash

    if (saved := saved_hash(run_dir)) in (None, digest):
        return
    aside = run_dir.parent / ".stale" / f"{run_dir.name}-{saved[-12:]}"
    aside.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(aside, ignore_errors=True)
    os.replace(run_dir, aside)
    print(f"moved {run_dir} (a run of another configuration) to {aside}", file=sys.stderr, flush=True)


def train(args) -> None:
    """A training job: ``python ARGV`` in this process on its own cores; then, in the job's first process, each run's
    marker (the job's outputs)."""
    from ..runs import COMPLETE, checkpoints, is_complete

    first = os.environ.get("SLURM_PROCID", "0") == "0"
    runs = [paths.HOME / r for r in args.runs]
    for run_dir, digest in zip(runs, args.hashes) if first else ():
        set_aside_stale(run_dir, digest)
    with pinned(args.threads, paths.HOME / "_build" / "workflow" / "cores"):
        sys.argv = [args.argv[1], *args.argv[2:]]
        try:
            runpy.run_module(args.argv[1], run_name="__main__", alter_sys=True)
        except SystemExit as err:
            if err.code not in (None, 0):
                raise
    for run_dir, digest, marker in zip(runs, args.hashes, args.outputs) if first else ():
        if not is_complete(run_dir, digest):
            raise SystemExit(f"error: {run_dir} has no {COMPLETE} for config hash {digest} after its training")
        paths.write_atomic(paths.HOME / marker, json.dumps({"config_hash": digest}) + "\n")
        if os.environ.get(PRUNE_CHECKPOINTS) == "1":
            shutil.rmtree(checkpoints(run_dir), ignore_errors=True)


def tokens(args) -> None:
    """A token-cache job: one run's training and validation caches, before the trainings that read them."""
    from .. import config as configs
    from ..data import corpora

    cls = configs.FinetuneConfig if args.module == "finetune" else configs.TrainConfig
    config = configs.load_config(args.argv[1], args.argv[2:], cls=cls)
    corpora.build_token_caches(config.data.levanter_config())
    paths.write_atomic(Path(args.output), json.dumps({"data": repr(config.data)}) + "\n")


def check_outputs(path: Path, notebook: str) -> None:
    """No output of the executed notebook holds a traceback (a logged exception does not stop Papermill) or shows a
    figure as its text (``<Figure size 1300x340 with 5 Axes>``, no image)."""
    for i, cell in enumerate(json.loads(Path(path).read_text())["cells"]):
        for out in cell.get("outputs", []):
            text, data = "".join(out.get("text", "")), out.get("data", {})
            if out.get("output_type") == "error" or "Traceback (most recent call last)" in text:
                raise SystemExit(f"error: notebook {notebook}: cell {i} printed a traceback:\n{text[-2000:]}")
            plain = "".join(data.get("text/plain", ""))
            if plain.startswith("<Figure size") and not any(k.startswith("image/") for k in data):
                raise SystemExit(f"error: notebook {notebook}: cell {i} shows a figure as text, {plain.strip()!r}: "
                                 f"show figures with diffeqformer.report.figures.save_figure")


def check_figures(folder: Path, notebook: str) -> list[str]:
    """Every figure a notebook saved (``<name>.json`` provenance) has all its files, none empty; their names."""
    names = []
    for record in (json.loads(p.read_text()) for p in sorted(Path(folder).glob("*.json"))):
        for f in record["files"]:
            if not (folder / f).exists() or (folder / f).stat().st_size == 0:
                raise SystemExit(f"error: notebook {notebook}: figure file {f} is missing or empty")
        names.append(record["figure"])
    return names


def _execute(notebook: str, work: Path, parameters: dict, name: str) -> float:
    """Papermill on ``notebook`` into ``work/notebook.ipynb`` (figures into ``work/figures``), checked; its seconds.
    Kernel and client talk over Unix sockets in a folder of the job's own: a TCP port found free can be taken."""
    import papermill
    from papermill.exceptions import PapermillExecutionError
    from traitlets.config import Config

    os.environ.update(DIFFEQFORMER_FIGURES=str(work / "figures"), PYDEVD_DISABLE_FILE_VALIDATION="1")
    start, config = time.time(), Config()
    try:
        with tempfile.TemporaryDirectory(prefix="diffeqformer-kernel-") as sockets:
            config.KernelManager.transport, config.KernelManager.ip = "ipc", os.path.join(sockets, "kernel")
            papermill.execute_notebook(notebook, work / "notebook.ipynb", parameters=parameters,
                                       kernel_name="python3", progress_bar=False, log_output=True,
                                       cwd=str(paths.HOME), config=config, iopub_timeout=IOPUB_TIMEOUT_S)
    except PapermillExecutionError as err:
        trace = "\n".join(re.sub(r"\x1b\[[0-9;]*m", "", line) for line in err.traceback[-12:])
        raise SystemExit(f"error: notebook {name} failed in cell {err.exec_count}: {err.ename}: {err.evalue}\n"
                         f"{trace}") from None
    check_outputs(work / "notebook.ipynb", name)
    check_figures(work / "figures", name)
    return time.time() - start


def notebook(args) -> None:
    """A notebook job: executed in a work folder of its own, checked, then the notebook, its figures and its record
    renamed into place. On failure the executed copy, with the error, is kept in ``failed/``; nothing else is left."""
    output, parameters = Path(args.output), json.loads(args.parameters)
    work = Path(tempfile.mkdtemp(prefix=f".{args.name}-", dir=output.parent))
    (work / "figures").mkdir()
    try:
        seconds = _execute(args.input, work, parameters, args.name)
        paths.write_atomic(Path(args.record), json.dumps({
            "notebook": args.name, "seconds": seconds, "parameters": parameters,
            "date": time.strftime("%Y-%m-%dT%H:%M:%S%z")}, indent=1) + "\n")
        swap_in(work / "figures", Path(args.figures))
        os.replace(work / "notebook.ipynb", output)
    except SystemExit as err:
        if not (work / "notebook.ipynb").exists():
            raise
        failed = output.parent.parent / "failed" / f"{args.name}.ipynb"
        failed.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(work / "notebook.ipynb", failed)
        raise SystemExit(f"{err.code}\n(the executed notebook, with the error, is in {failed})") from None
    finally:
        shutil.rmtree(work, ignore_errors=True)


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
    """The last job: ``_build/html`` and ``figures/`` become links to this preset's book and figures (each replaced in
    one rename), which exist only once every notebook and the book have succeeded."""
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
    t, k = verbs.add_parser("train"), verbs.add_parser("tokens")
    for name in ("runs", "hashes", "outputs"):
        t.add_argument(f"--{name}", nargs="+", required=True)
    t.add_argument("--threads", type=int, default=1)
    k.add_argument("--module", default="train")
    k.add_argument("--output", required=True)
    for verb, names in (("notebook", ("name", "input", "output", "figures", "record", "parameters")),
                        ("publish", ("preset", "output"))):
        p = verbs.add_parser(verb)
        for name in names:
            p.add_argument(f"--{name}", required=True)
    for p in (t, k):
        p.add_argument("argv", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if getattr(args, "argv", None) and args.argv[0] == "--":
        args.argv = args.argv[1:]
    globals()[args.verb](args)


if __name__ == "__main__":
    main()
