"""Training laid over several devices and processes (``diffeqformer.devices``), on CPU devices: XLA gives one process
4 of them (``--xla_force_host_platform_device_count``), and processes on one machine join over 127.0.0.1.

Fast: on 4 devices bad layouts are refused in one line, before anything is written. Slow: on 4 devices FSDP and
tensor parallelism really shard the parameters, and a DiffEqFormer (FSDP and tensor parallel), GPT-2, a discretised
fine-tuning and a population over the devices equal their one-device runs; runs resume on another number of devices; two processes started as SLURM starts them make one run;
a killed process ends the other within a bounded time, and the run resumes.

Each group of checks trains in one child process (``multidevice.py``): the device count is fixed when JAX starts,
and a process that imports Levanter costs seconds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from diffeqformer import paths

SMOKE = paths.CONFIG / "smoke"
RTOL = 1e-5
"""How far (relative) a loss on several devices may lie from one device's: float32 sums in another order."""
HELPER = Path(__file__).with_name("multidevice.py")
HEARTBEAT = 10
"""Seconds after which JAX's distributed runtime takes a silent process for dead, in the test that kills one."""


def env(count: int, root: Path, **extra) -> dict:
    """A child's environment: ``count`` CPU devices, ``root``'s compilation cache (the token caches are the
    repository's: every run names its ``--run_dir``)."""
    flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={count}".strip()
    return {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": flags, "TOKENIZERS_PARALLELISM": "false",
            "JAX_COMPILATION_CACHE_DIR": str(root / "jax-cache"), **extra}


def trained(jobs: list[dict], count: int, root: Path, timeout: int = 900, **extra) -> dict:
    """``multidevice.py``'s results of ``jobs`` trained in one child process on ``count`` devices (``extra``: more
    environment)."""
    out = subprocess.run([sys.executable, str(HELPER), json.dumps(jobs)], env=env(count, root, **extra),
                         capture_output=True, text=True, timeout=timeout)
    lines = [line for line in out.stdout.splitlines() if line.startswith("@result ")]
    assert out.returncode == 0 and lines, out.stderr[-4000:]
    return json.loads(lines[-1].removeprefix("@result "))


def job(label: str, config: str, root: Path, *overrides: str, module: str = "train", **more) -> dict:
    """A job of ``multidevice.py``: the smoke preset's ``config`` with ``overrides``, into ``root / label``."""
    return {"label": label, "module": module, "config": str(SMOKE / config),
            "overrides": ["--run_dir", str(root / label), *overrides], **more}


def assert_same_losses(a: dict, b: dict, rtol: float = RTOL) -> None:
    """Two runs' train and eval losses agree to ``rtol`` at the same steps (each run of a population too)."""
    assert len(a["losses"]) == len(b["losses"])
    for mine, theirs in zip(a["losses"], b["losses"]):
        for column in ("train/loss", "eval/loss"):  # steps as ints: a result read back from JSON has them as text
            ours, others = ({int(k): v for k, v in run[column].items()} for run in (mine, theirs))
            assert ours.keys() == others.keys() and len(ours) >= 1, column
            np.testing.assert_allclose(list(ours.values()), list(others.values()), rtol=rtol, err_msg=column)


def spread(layout: dict, ways: int, devices: int = 4) -> bool:
    """Whether the parameters are spread over the ``devices``, ``ways`` ways: none holds more than its share and half
    as much again (the arrays without a sharded axis, norms and biases, are whole on every device)."""
    return layout["devices_used"] == devices and layout["max_device_bytes"] <= 1.5 * layout["total_bytes"] / ways


# ------------------------------------------------------------------------------------ every config, this process


@pytest.mark.parametrize("path", sorted(paths.CONFIG.glob("*/*.yaml")), ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_config_of_every_preset_passes_the_layout_check(path, tmp_path):
    """``devices.check`` reads the axes a mesh may split from each model kind (a Llama's heads live in its attention's
    config: the cpu book stopped at its Llama population with an AttributeError), on this process's devices."""
    from diffeqformer import config as configs
    from diffeqformer import devices, train

    config = configs.load_config(path, ["--run_dir", str(tmp_path / "run")], cls=configs.config_class(path))
    model = configs.pretraining_of(config)[0].model if isinstance(config, configs.FinetuneConfig) else config.model
    axes = dict(devices.model_axes(model))
    assert axes["model.num_heads"].size == model.num_heads and axes["model.hidden_dim"].size == model.hidden_dim
    if hasattr(model, "num_kv_heads"):
        assert axes["model.num_kv_heads"].size == model.num_kv_heads
    devices.check(train.trainer_config_of(config, tmp_path / "run"), model)


# ------------------------------------------------------------------------------------ one process, four devices


def test_bad_layouts_and_a_silent_coordinator_are_refused_in_one_line(tmp_path):
    """On 4 devices: a coordinator that does not answer, and a width, heads or a batch the mesh does not divide, stop
    the run in one line naming the field, before anything is written. (The default suite's one test on several
    devices: one child process that trains nothing; the slow tests train on several devices.)"""
    jobs = [job("coordinator", "diffeqformer.yaml", tmp_path, "--trainer.distributed.coordinator_address",
                "127.0.0.1:1", "--trainer.distributed.num_processes", "2", "--trainer.distributed.process_id", "1"),
            job("width", "diffeqformer.yaml", tmp_path, "--model.hidden_dim", "30"),
            job("heads", "diffeqformer.yaml", tmp_path, "--model.hidden_dim", "48", "--model.num_heads", "3",
                "--trainer.mesh.axes", "{model: 2}"),
            job("batch", "diffeqformer.yaml", tmp_path, "--trainer.train_batch_size", "6"),
            job("population", "diffeqformer.yaml", tmp_path, "--trainer.train_batch_size", "3",
                module="population", seeds=2)]
    out = trained(jobs, 4, tmp_path, DIFFEQFORMER_INIT_TIMEOUT="3")
    assert out["coordinator"]["error"].startswith("trainer.distributed.coordinator_address: nothing answered at "
                                                  "127.0.0.1:1 within 3 s")
    assert out["width"]["error"].startswith("model.hidden_dim (30) must be divisible by the mesh's data axis (4 ")
    assert out["heads"]["error"].startswith("model.num_heads (3) must be divisible by the mesh's model axis (2 ")
    assert out["batch"]["error"].startswith("trainer.train_batch_size (6) must be divisible by the mesh's batch axes")
    assert out["population"]["error"].startswith("trainer.train_batch_size (3, each member's) must be divisible by "
                                                 "the mesh's data axes (2 devices)"), out["population"]
    for label in ("coordinator", "width", "heads", "batch", "population"):
        assert not (tmp_path / label).exists(), f"{label}: nothing is written on bad input"


# --------------------------------------------------------------------------------- against one device (slow)


def _cut_back(label: str, source: Path, root: Path) -> dict:
    """A job that resumes a copy of the run ``source`` from its checkpoint of step 10, in ``root / label``."""
    return {**job(label, "diffeqformer.yaml", root), "resume": [str(source), 10]}


@pytest.fixture(scope="module")
def layouts(tmp_path_factory):
    """The smoke DiffEqFormer and GPT-2, a discretised fine-tuning of the first and a population of 4 seeds, trained on
    one device and on four; then each device count resumes the other's DiffEqFormer from its checkpoint of step 10.
    One compilation cache for all (the programs of one device count are compiled once)."""
    root = tmp_path_factory.mktemp("layouts")
    one, four = root / "one", root / "four"

    def runs(folder):
        return [job("ode", "diffeqformer.yaml", folder), job("gpt2", "gpt2.yaml", folder),
                job("finetune", "finetune_diffeqformer_full.yaml", folder, "--pretrain.run_dir", str(one / "ode"),
                    module="finetune"),
                job("population", "diffeqformer.yaml", folder, module="population", seeds=4)]

    results = {"one": trained(runs(one), 1, root)}
    results["four"] = trained([*runs(four), _cut_back("resumed", one / "ode", four),
                               job("tensor", "diffeqformer.yaml", four, "--trainer.mesh.axes", "{model: 2}")], 4, root)
    results["one"].update(trained([_cut_back("resumed", four / "ode", one)], 1, root))
    return {**results, "root": root}


@pytest.mark.slow
def test_every_kind_of_run_trains_on_four_devices_as_on_one(layouts):
    """DiffEqFormer, GPT-2 and a discretised fine-tuning (FSDP), the DiffEqFormer with tensor parallelism, and a
    population whose 4 members lie each on a device of its own, lose what they lose on one device, to ``RTOL``, at
    every step."""
    one, four = layouts["one"], layouts["four"]
    for label in ("ode", "gpt2", "finetune", "population"):
        assert_same_losses(four[label], one[label])
    assert_same_losses(four["tensor"], one["ode"])
    for label in ("ode", "gpt2", "finetune"):
        assert spread(four[label]["layouts"][0], 4), label
    tensor = four["tensor"]["layouts"][0]  # data: 2 x model: 2: the width over data, the heads and MLP units over model
    assert spread(tensor, 2), tensor
    specs = tensor["specs"]
    assert all("data" in spec for path, spec in specs.items() if "token_embeddings" in path), specs
    for unit in ("o_proj.proj", "mlp_in.proj"):
        assert any("model" in spec for path, spec in specs.items() if unit in path), (unit, specs)
    whole = four["population"]["population_layout"]  # the population's model: every array has the seed axis first
    assert all(spec.startswith("P('replica'") for spec in whole["specs"].values()), whole["specs"]
    assert whole["max_device_bytes"] == whole["total_bytes"] // 4 and whole["devices_used"] == 4


@pytest.mark.slow
def test_a_run_resumes_on_another_number_of_devices(layouts):
    """A run's identity leaves its devices out: the run of 4 devices resumes on 1 and the reverse, and each ends where
    the uninterrupted run ends, to ``RTOL``."""
    one, four = layouts["one"], layouts["four"]
    assert_same_losses(one["resumed"], four["ode"])
    assert_same_losses(four["resumed"], one["ode"])


# ------------------------------------------------------------------------------------------ two processes (slow)


def slurm_job_id() -> int:
    """A SLURM job id whose coordinator port is free on 127.0.0.1: Levanter takes the port from the job id
    (61440 + id % 4096), above the ports the system hands out itself (32768-60999 on Linux)."""
    import random
    import socket

    for _ in range(200):
        port = random.randrange(61440, 65536)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return 4096 + port - 61440
    raise RuntimeError("no free port in 61440-65535")


def slurm_pair(run_dir: Path, root: Path, **extra) -> list[subprocess.Popen]:
    """The two tasks of a SLURM job on this machine, as ``srun`` starts them: each ``python -m diffeqformer.train`` of
    the smoke DiffEqFormer into ``run_dir`` on 2 CPU devices, SLURM's variables naming 127.0.0.1 (Levanter takes the
    coordinator's port from the job id). Output in ``run_dir``'s ``task<k>.log`` beside it."""
    job_id = slurm_job_id()
    procs = []
    for k in range(2):
        slurm = {"SLURM_JOB_ID": str(job_id), "SLURM_NTASKS": "2", "SLURM_PROCID": str(k),
                 "SLURM_LOCALID": str(k), "SLURM_STEP_NODELIST": "127.0.0.1", "SLURMD_NODENAME": "127.0.0.1",
                 "SLURM_STEP_NUM_NODES": "1", "SLURM_STEP_TASKS_PER_NODE": "2"}
        with (run_dir.parent / f"{run_dir.name}-task{k}.log").open("w") as log:
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "diffeqformer.train", "--config", str(SMOKE / "diffeqformer.yaml"),
                 "--run_dir", str(run_dir)], env=env(2, root, **slurm, **extra), stdout=log, stderr=subprocess.STDOUT))
    return procs


def finished(procs: list[subprocess.Popen], run_dir: Path, timeout: int = 900) -> list[str]:
    """Each process's exit code checked (0) and its output."""
    outputs = []
    for k, p in enumerate(procs):
        p.wait(timeout=timeout)
        outputs.append((run_dir.parent / f"{run_dir.name}-task{k}.log").read_text())
        assert p.returncode == 0, outputs[-1][-3000:]
    return outputs


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """The smoke DiffEqFormer trained by two processes of 2 devices each (its run directory), and by one process of
    4 devices (``multidevice.py``'s result, its run directory ``four/ode`` beside it)."""
    root = tmp_path_factory.mktemp("pair")
    run_dir = root / "pair"
    finished(slurm_pair(run_dir, root), run_dir)
    return run_dir, trained([job("ode", "diffeqformer.yaml", root / "four")], 4, root)["ode"]


def _parameters(run_dir: Path) -> list[np.ndarray]:
    import equinox as eqx
    import jax

    from diffeqformer.runs import load_model

    return [np.asarray(x) for x in jax.tree_util.tree_leaves(eqx.filter(load_model(run_dir), eqx.is_array))]


@pytest.mark.slow
def test_two_processes_started_as_slurm_starts_them_are_one_run(pair):
    """Two processes of 2 devices each, joined by Levanter's SLURM start-up: one metrics line a step (process 0 logs),
    the run's files written once, a model.eqx that loads on one device, and the losses of one process of 4 devices,
    to ``RTOL``."""
    from diffeqformer import runs

    pair, four = pair
    metrics = runs.read_metrics(pair)
    losses = {"losses": [{c: {int(k): float(v) for k, v in metrics[c].dropna().items()}
                          for c in ("train/loss", "eval/loss")}]}
    assert_same_losses(losses, four)
    lines = [json.loads(line) for line in (pair / runs.METRICS).read_text().splitlines()]
    single = [json.loads(line) for line in (pair.parent / "four" / "ode" / runs.METRICS).read_text().splitlines()]
    # as many lines of training loss as one process writes: process 0 logs alone
    assert sorted(r["step"] for r in lines if "train/loss" in r) == sorted(r["step"] for r in single
                                                                            if "train/loss" in r)
    assert runs.summary(pair)["steps"] == 20 and len(_parameters(pair)) > 10


@pytest.mark.slow
def test_a_killed_process_ends_the_other_and_the_run_resumes(pair, tmp_path):
    """One of the two processes killed after the checkpoint of step 10: the other ends within ``HEARTBEAT`` seconds
    with one line, nothing marked complete; the same two commands again resume the run from step 10 and end where the
    uninterrupted run ends, bit for bit (the same devices)."""
    import signal
    import time

    from diffeqformer import runs

    pair = pair[0]
    root, run_dir = pair.parent, tmp_path / "killed"
    procs = slurm_pair(run_dir, root, DIFFEQFORMER_HEARTBEAT_TIMEOUT=str(HEARTBEAT))
    while procs[0].poll() is None:
        steps = runs.read_metrics(run_dir).index if (run_dir / runs.METRICS).exists() else []
        if len(steps) and max(steps) >= 12:
            break
        time.sleep(0.2)
    assert procs[0].poll() is None, "the run ended before it was killed"
    procs[1].send_signal(signal.SIGKILL)
    killed = time.monotonic()
    procs[0].wait(timeout=HEARTBEAT + 60)
    took = time.monotonic() - killed
    print(f"the other process ended {took:.1f} s after the kill")
    output = (tmp_path / "killed-task0.log").read_text().strip().splitlines()
    assert procs[0].returncode == 1 and took < HEARTBEAT + 20, (procs[0].returncode, took)
    assert output[-1].startswith("error: smoke-diffeqformer: ") and output[-1].endswith(
        "nothing is marked complete: start every process again to resume from the last checkpoint"), output[-20:]
    assert not (run_dir / runs.COMPLETE).exists() and not (run_dir / runs.MODEL).exists()
    outputs = finished(slurm_pair(run_dir, root), run_dir)
    assert "smoke-diffeqformer: resuming from step 11" in outputs[0]  # the state saved after step 10
    for a, b in zip(_parameters(run_dir), _parameters(pair), strict=True):
        np.testing.assert_array_equal(a, b)
    assert runs.read_metrics(run_dir)["train/loss"].equals(runs.read_metrics(pair)["train/loss"])


WATCHED = ("import sys, time\nfrom diffeqformer import devices\ndevices.watched('run')\nprint('child', flush=True)\n"
           "time.sleep(60)\n")
"""A process that goes on in a child under ``devices.watched``, as a process of a run of several does."""


@pytest.mark.parametrize("who", ["the job", "another process"])
def test_a_watched_process_says_in_one_line_what_stopped_it(who):
    """SIGTERM sent to the job (to the watching parent, as SLURM's scancel or a pre-emption does) stops the child and
    says so; the child killed by something else (a collective's abort, the out-of-memory killer) says that; either
    way exit code 1 and one line."""
    import signal
    import time

    import psutil

    proc = subprocess.Popen([sys.executable, "-c", WATCHED], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline() == "child\n"
    time.sleep(0.2)  # the parent sets its handlers just after the fork, by when the child may have printed
    if who == "the job":
        proc.send_signal(signal.SIGTERM)
    else:
        psutil.Process(proc.pid).children()[0].kill()
    _, err = proc.communicate(timeout=30)
    lines = err.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1 and lines[0].startswith("error: run: "), err
    expected = "was stopped by SIGTERM, sent to the job" if who == "the job" else "ended on SIGKILL"
    assert expected in lines[0], err
