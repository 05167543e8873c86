"""What the pipeline's child processes share: ``exit_with_parent`` (training workers and Papermill children end with
the pipeline that started them), ``keep_heap`` (their memory allocator's settings), and the Papermill child itself.

Imports nothing of the package but ``paths``, and the package ``__init__`` files import nothing eagerly, so a
Papermill child starts without waiting for the registry (Levanter, JAX, the model) to import (measurements page); the
notebook's kernel imports what the notebook needs."""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Mapping

from .. import paths


KEPT_HEAP = ("glibc.malloc.mmap_threshold=4294967296", "glibc.malloc.trim_threshold=4294967296")
"""glibc malloc settings (``GLIBC_TUNABLES``) for every process the pipeline starts: allocations of up to 4 GiB come
from the heap and freed memory stays there, to be reused. By default glibc maps every allocation above its threshold
(at most 32 MiB) afresh and unmaps it when freed; XLA's CPU runtime allocates a step's buffers on every call, so that
each step touched new pages, thousands of page faults a step (these, and the step times with and without these
settings: measurements page). The trained parameters are the same, bit for bit. glibc reads them at a process's
start, so they apply to the processes the pipeline starts; elsewhere (macOS, musl) they are ignored."""
ONE_ARENA = ("glibc.malloc.arena_max=1",)
"""Added for a training process pinned to cores of its own (``lanes.lane_cpus``): one heap for all its threads, whose
own arenas otherwise gave freed memory back as well, so that its steps still faulted pages in. Not for the
processes that run on every core (notebook kernels, F9's measuring processes): there it makes XLA's multi-threaded
compilation slower, while on one core it makes no difference to compilation (both: measurements page)."""


SHARED_DEVICE = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
"""JAX's settings for every process the pipeline starts: on a GPU, JAX takes 75% of the device's memory when a
process starts, so a second training lane or a notebook's kernel beside a training would find none left; with
these, each process allocates what it uses. The user's own settings win (``share_device``). A CPU ignores them."""

PRUNE_CHECKPOINTS = "DIFFEQFORMER_PRUNE_CHECKPOINTS"
"""Environment variable: ``1`` deletes a run's Levanter checkpoints once the run is complete (its ``model.eqx`` and
``complete.json`` are what the notebooks read), so that a preset's runs fit a small disk (the gpu preset's runs keep
about 80 GB of checkpoints otherwise). An interrupted run keeps its checkpoints and resumes from them; a complete one
is not trained again."""


def share_device(env) -> None:
    """Add ``SHARED_DEVICE`` to ``env`` (a mapping, e.g. ``os.environ``), keeping any value already set."""
    for name, value in SHARED_DEVICE.items():
        env.setdefault(name, value)


def keep_heap(tunables: str | None, settings: tuple[str, ...] = KEPT_HEAP) -> str:
    """``GLIBC_TUNABLES`` with ``settings`` added, keeping any setting of the same names already in ``tunables``."""
    items = [t for t in (tunables or "").split(":") if t]
    names = {t.split("=", 1)[0] for t in items}
    return ":".join(items + [t for t in settings if t.split("=", 1)[0] not in names])


PARENT_PID = "DIFFEQFORMER_PIPELINE_PID"
"""Environment variable through which the pipeline gives a child process (a training worker, a Papermill child) its
own pid (``child_env``): a child that reaches ``exit_with_parent`` after the pipeline died has been handed to another
parent already, and must not take that one for the pipeline."""


def child_env(env) -> dict[str, str]:
    """``env`` for a child process of this one that calls ``exit_with_parent``: with ``PARENT_PID``."""
    return {**env, PARENT_PID: str(os.getpid())}


def exit_with_parent(poll_s: float = 0.2) -> None:
    """End this worker, and every process it started, as soon as the pipeline that started it is gone. A killed
    pipeline closes the worker's standard input, but the worker reads it only between runs: without this it would go
    on training its run while the rerun pipeline's worker trains the same run (``runs.lock`` makes the second
    wait for the first). A Papermill child's notebook kernel is its own process, which would outlive it: ipykernel
    ends a kernel whose parent is gone only when the kernel is handed to process 1, and in a container another
    process (a subreaper) takes it; so the worker kills its descendants before it ends.

    The pipeline is the parent named by ``PARENT_PID`` (removed from the environment here, so that this process's
    own children do not inherit it), else this process's parent now; a pipeline that died before this call (while
    this process was still importing) ends it at once."""
    parent = int(os.environ.pop(PARENT_PID, "") or os.getppid())

    def watch():
        while os.getppid() == parent:
            time.sleep(poll_s)
        kill_descendants()
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="exit-with-parent").start()


def kill_descendants() -> None:
    """SIGKILL every process this one started, and theirs (psutil, which Jupyter's kernel needs anyway)."""
    import psutil

    for child in psutil.Process().children(recursive=True):
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass


def kernel_over_unix_sockets(folder: str):
    """Jupyter configuration under which the kernel and its client talk over Unix sockets in ``folder`` (ZeroMQ's
    ``ipc`` transport) instead of TCP ports on localhost. Over TCP the client picks five ports the kernel then binds:
    a port found free in one process can be taken by a kernel another process starts in between, and that kernel
    dies at start ("ZMQError: Address already in use", then "Kernel died before replying to kernel_info"). Seen in
    CI, where the unit tests' pipelines and the two lanes of each start kernels side by side. Sockets in a folder of
    the child's own cannot collide."""
    from traitlets.config import Config

    config = Config()
    config.KernelManager.transport = "ipc"
    config.KernelManager.ip = os.path.join(folder, "kernel")  # the sockets are kernel-1, kernel-2, ...
    return config


IOPUB_TIMEOUT_S = 300
"""How long a cell's output may lag behind its end before Papermill gives up on it: nbclient's default, 4 s, which
Papermill turns into an error, failed F3's notebook in a `make book` on a machine busy with other work ("Timeout
waiting for IOPub output ... after 4 seconds"), a cell that had finished."""


def execute_notebook_child(spec: Mapping[str, Any]) -> None:
    """The child process of ``notebooks.execute_notebook`` (``python -m diffeqformer.pipeline.processes SPEC``):
    Papermill on ``spec['input']`` with its ``parameters`` into ``spec['output']``; a failing cell's exception is written to ``spec['error']`` (JSON) and
    the process exits with 3."""
    import papermill
    from papermill.exceptions import PapermillExecutionError

    from ..forks import forked_kernel_manager

    exit_with_parent()
    try:
        with tempfile.TemporaryDirectory(prefix="diffeqformer-kernel-") as sockets:
            papermill.execute_notebook(spec["input"], spec["output"], parameters=spec["parameters"],
                                       kernel_name="python3", progress_bar=False, log_output=False,
                                       cwd=str(paths.HOME), config=kernel_over_unix_sockets(sockets),
                                       iopub_timeout=IOPUB_TIMEOUT_S, kernel_manager_class=forked_kernel_manager())
    except PapermillExecutionError as err:
        Path(spec["error"]).write_text(json.dumps({"exec_count": err.exec_count, "ename": err.ename,
                                                   "evalue": err.evalue, "traceback": list(err.traceback)}))
        sys.exit(3)


if __name__ == "__main__":
    execute_notebook_child(json.loads(sys.argv[1]))
