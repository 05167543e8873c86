"""The devices a run trains on: JAX's distributed runtime started with bounded waits, the mesh checked against the
model and the batch before anything is built, the process that writes a run's files, host copies of sharded arrays.

Levanter lays a run over a mesh (``trainer.mesh``): by default the batch and each parameter's ``embed`` axis are split
over every device (FSDP); ``--trainer.mesh.axes '{model: 2}'`` also splits the heads and MLP units over pairs of devices
(tensor parallelism). The mesh changes how a step is computed, not what: the losses agree with one device's up to
float32 rounding (``tests/test_devices.py``), and the configuration hash leaves it out, so a run resumes on another
number of devices.

A run of several processes (SLURM's tasks, or ``trainer.distributed``) starts with bounded waits (``start``), each
process training in a child whose end its parent reports in one line (``watched``). Process 0 alone writes the run's
own files (``is_primary``), from host copies of the whole arrays (``host_copy``); each writes its part of checkpoints.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
from typing import Any, NoReturn

INIT_TIMEOUT = "DIFFEQFORMER_INIT_TIMEOUT"
"""Environment variable: seconds the processes of a run wait for each other and the coordinator at the start."""
HEARTBEAT_TIMEOUT = "DIFFEQFORMER_HEARTBEAT_TIMEOUT"
"""Environment variable: seconds after which JAX's runtime takes a silent process for dead and ends the others."""
DEFAULT_INIT_TIMEOUT = 300
DEFAULT_HEARTBEAT_TIMEOUT = 60


def wait_seconds(variable: str, default: int) -> int:
    """The whole positive number of seconds the environment variable ``variable`` sets, else ``default``."""
    text = os.environ.get(variable, "").strip()
    if not text:
        return default
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"{variable} must be a whole positive number of seconds, got {text!r}")
    return int(text)


def several_processes(trainer) -> bool:
    """Whether ``trainer`` (Levanter's ``TrainerConfig``) makes a run of several processes that ``start`` joins, as
    Levanter decides it (without starting JAX's backend)."""
    import levanter.distributed as dist

    config = trainer.distributed
    return config.initialize_jax_distributed and dist.get_job_info() is None and config._is_distributed()


def watched(name: str) -> None:
    """Go on in a child process, which trains, while this one waits and exits as it does; a child ended by a signal
    is reported in one line (``stopped``). A dead peer makes the collectives end a process from native code, which
    Python cannot catch; its parent still can. The child dies with its parent, and the parent passes on the signals
    a scheduler sends. Call it before JAX starts its backend (a fork is safe then)."""
    import ctypes
    import signal
    import sys

    parent = os.getpid()
    child = os.fork()
    if child == 0:  # die with the parent (Linux's PR_SET_PDEATHSIG; elsewhere the child outlives a killed parent)
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)
            if os.getppid() != parent:  # the parent died before the call
                os._exit(1)
        return
    passed_on = []

    def pass_on(received, frame):
        passed_on.append(received)
        os.kill(child, received)

    for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(number, pass_on)
    _, status = os.waitpid(child, 0)
    sys.stdout.flush()
    if os.WIFSIGNALED(status):
        ended = signal.Signals(os.WTERMSIG(status)).name
        stopped(name, f"this process of the run was stopped by {ended}, sent to the job (cancelled or pre-empted)"
                if os.WTERMSIG(status) in passed_on else f"this process of the run ended on {ended} (another process "
                f"of the run stopped, or did not start within {INIT_TIMEOUT} seconds; see above)")
    os._exit(os.waitstatus_to_exitcode(status))


def stopped(name: str, why: str) -> NoReturn:
    """End this process of the run ``name`` at once with one line (exit code 1, no clean-up: JAX's would wait)."""
    import sys

    print(f"error: {name}: {why}; nothing is marked complete: start every process again to resume from the last "
          "checkpoint", file=sys.stderr, flush=True)
    os._exit(1)


def _wait_for_coordinator(coordinator: str, wait: int) -> None:
    """Wait up to ``wait`` seconds for something to listen at ``coordinator`` (``host:port``), where Python can still
    raise (JAX's own wait ends the process from native code)."""
    import socket
    import time

    host, _, port = coordinator.rpartition(":")
    deadline = time.monotonic() + wait
    while True:
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=2):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise ValueError(f"trainer.distributed.coordinator_address: nothing answered at {coordinator} within "
                                 f"{wait} s ({INIT_TIMEOUT}): check that process 0 of the job started and that the "
                                 "address is right") from None
            time.sleep(0.5)


def start(trainer):
    """Start JAX's distributed runtime where Levanter's ``trainer.initialize`` would, but with the waits of
    ``INIT_TIMEOUT`` and ``HEARTBEAT_TIMEOUT`` (Levanter's: 30 minutes), so that a silent coordinator or a dead peer
    ends the others in bounded time; return ``trainer`` with Levanter's own start turned off (one process: as it
    is). Call it before anything starts JAX's backend."""
    import jax
    import levanter.distributed as dist

    config = trainer.distributed
    started = dataclasses.replace(trainer, distributed=dataclasses.replace(config, initialize_jax_distributed=False))
    if jax.distributed.is_initialized():
        return started
    if not several_processes(trainer):
        return trainer  # nothing to start, or a job that Levanter starts its own way
    coordinator, processes, rank = config.coordinator_address, config.num_processes, config.process_id
    device_ids = config.local_device_ids
    slurm = dist.LevanterSlurmCluster
    if slurm.is_env_present():  # as Levanter reads a SLURM job
        device_ids = slurm.get_local_device_ids_for_process() if device_ids is None else device_ids
        coordinator = coordinator or slurm.get_coordinator_address()
        processes = slurm.get_process_count() if processes is None else processes
        rank = slurm.get_process_id() if rank is None else rank
    wait = wait_seconds(INIT_TIMEOUT, DEFAULT_INIT_TIMEOUT)
    if coordinator and rank:  # process 0 starts the coordinator; the others wait for it
        _wait_for_coordinator(coordinator, wait)
    # JAX's preemption service takes SIGTERM for a sync point that Levanter's loop never polls, so that a cancelled job
    # would train on unseen: without it SIGTERM ends the process, and the next start resumes from the last checkpoint
    jax.config.update("jax_enable_preemption_service", False)
    jax.distributed.initialize(coordinator, processes, rank, device_ids, initialization_timeout=wait,
                               heartbeat_timeout_seconds=wait_seconds(HEARTBEAT_TIMEOUT, DEFAULT_HEARTBEAT_TIMEOUT))
    return started


def is_primary() -> bool:
    """Whether this is process 0, the one that writes a run's own files."""
    import jax

    return jax.process_index() == 0


def barrier(name: str) -> None:
    """Wait until every process of the run has reached the barrier ``name``."""
    import jax

    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def host_copy(tree):
    """``tree`` with each JAX array as a NumPy copy of the whole array, those sharded over processes gathered in one
    program (a collective: every process calls it with the same tree)."""
    import jax
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec

    leaves, treedef = jax.tree.flatten(tree)
    spread = [i for i, x in enumerate(leaves) if isinstance(x, jax.Array) and not x.is_fully_addressable]
    if spread:
        replicated = [NamedSharding(leaves[i].sharding.mesh, PartitionSpec()) for i in spread]
        gathered = jax.jit(lambda xs: xs, out_shardings=replicated)([leaves[i] for i in spread])
        for i, x in zip(spread, gathered):
            leaves[i] = np.asarray(x.addressable_data(0))
    return jax.tree.unflatten(treedef, [np.asarray(x) if isinstance(x, jax.Array) else x for x in leaves])


def bytes_per_device(tree) -> dict[Any, int]:
    """Bytes of ``tree``'s arrays that each of this process's devices holds (a replicated array counts on each)."""
    import jax

    held: dict[Any, int] = {d: 0 for d in jax.local_devices()}
    for x in jax.tree.leaves(tree):
        if isinstance(x, jax.Array):
            for shard in x.addressable_shards:
                held[shard.device] = held.get(shard.device, 0) + shard.data.nbytes
    return held


# ------------------------------------------------------------------------------------------------ the mesh


def mesh_sizes(trainer) -> dict[str, int]:
    """The size of each axis of ``trainer``'s mesh over this run's devices (within and across slices)."""
    import jax

    slices = max(getattr(d, "slice_index", 0) for d in jax.devices()) + 1
    try:
        ici, dcn = trainer.mesh.axis_shapes(jax.device_count(), slices)
    except ValueError as err:
        raise ValueError(f"trainer.mesh: {err} ({jax.device_count()} devices)") from None
    return {name: ici.get(name, 1) * dcn.get(name, 1) for name in {*ici, *dcn}}


def mesh_axes(physical) -> tuple[str, ...]:
    """The mesh axes of a value of a resolved axis mapping (one name, several, or None)."""
    return () if physical is None else (physical,) if isinstance(physical, str) else tuple(physical)


def physical_size(mapping, logical: str, sizes: dict[str, int]) -> tuple[str, int]:
    """The mesh axes ``mapping`` (logical to physical) lays ``logical`` over, joined by ' x ', and their devices."""
    names = mesh_axes(mapping.get(logical))
    return " x ".join(names), math.prod(sizes.get(n, 1) for n in names)


def model_axes(model) -> list[tuple[str, Any]]:
    """(config field, axis) of each axis of a model that a mesh may split: width, heads, MLP units, key/value heads."""
    mlp = "model.intermediate_dim" if hasattr(model, "intermediate_dim") else "model.hidden_dim x model.mlp_scale"
    # a Llama's config names its head axes only through its attention's config
    heads = model if hasattr(model, "Heads") else model.attention_config()
    axes = [("model.hidden_dim", model.Embed), ("model.num_heads", heads.Heads), (mlp, model.Mlp)]
    if hasattr(heads, "KVHeads"):
        axes.append(("model.num_kv_heads", heads.KVHeads))
    return axes


def check(trainer, model) -> None:
    """Reject, naming the field, a mesh that does not fit the devices, or a model axis or the largest
    ``trainer.train_batch_size`` that its mesh axes do not divide. Needs the device count: after ``start``."""
    from levanter.schedule import distinct_values

    sizes = mesh_sizes(trainer)
    for field, axis in model_axes(model):
        for mapping in (trainer.parameter_axis_mapping, trainer.compute_axis_mapping):
            names, devices = physical_size(mapping, axis.name, sizes)
            if axis.size % devices:
                raise ValueError(f"{field} ({axis.size}) must be divisible by the mesh's {names} axis ({devices} "
                                 f"devices), which it is split over: change it or trainer.mesh")
    if trainer.batch_axis_name is None:
        return
    names, devices = physical_size(trainer.compute_axis_mapping, trainer.batch_axis_name, sizes)
    largest = max(distinct_values(trainer.train_batch_size))
    if largest % devices and not trainer.allow_nondivisible_batch_size:
        raise ValueError(f"trainer.train_batch_size ({largest}) must be divisible by the mesh's batch axes {names} "
                         f"({devices} devices), which split it: change it or trainer.mesh")
