"""The workflow on a real SLURM cluster: a one-node cluster started by the tests (``slurm_cluster``; skipped, saying
why, where SLURM is not installed) and Snakemake's SLURM executor with a profile made from
``workflow/profiles/slurm`` for it. A training and the token cache before it are SLURM jobs, and the run trains to the
numbers of the local smoke workflow's; a profile asking for more CPUs than the node has, or for a partition the
cluster lacks, is refused by SLURM before anything runs, and reported in one line naming the profile field (these
marked ``pipeline``: they run in the smoke workflow's process of ``make test``, beside its smoke home). Marked
``slow``: a training of two tasks started by ``srun`` is one run; a cancelled training job resumes from its checkpoint
to an uninterrupted run's numbers; one task of two killed ends the job in bounded time with one line."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

import pytest
import yaml
from slurm_cluster import PARTITION, cluster, missing
from smoke_pipeline import SNAKEMAKE, command, losses, new_home, smoke_book  # noqa: F401 (session fixture)

from diffeqformer import paths

pytestmark = pytest.mark.skipif(missing() is not None, reason=missing() or "")
PROFILE = paths.REPO / "workflow" / "profiles" / "slurm"


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    with cluster(tmp_path_factory.mktemp("slurm")) as made:
        yield made


def _profile(dest: Path, slurm, *, cpus: int = 1, partition: str = PARTITION, tasks: int = 1,
             launcher: str = "") -> Path:
    """``workflow/profiles/slurm`` as a user of the test cluster edits it: its partition, no account, memory and
    cores the node has, each training one task of one core on the CPU; status from ``squeue`` (no accounting
    database) checked every two seconds."""
    dest.mkdir(parents=True)
    config = yaml.safe_load((PROFILE / "config.yaml").read_text())
    training = yaml.safe_load((PROFILE / "cluster.yaml").read_text())
    config["default-resources"].update(slurm_partition=partition, mem_mb=min(4000, slurm.memory_mb),
                                       cpus_per_task=cpus)
    config["default-resources"].pop("slurm_account")
    config.update({"configfile": str(dest / "cluster.yaml"), "latency-wait": 5, "slurm-status-command": "squeue",
                   "slurm-init-seconds-before-status-checks": 2, "seconds-between-status-checks": 2})
    training["training"].update(nodes=1, tasks=tasks, gpus=0, threads=cpus, runtime=30, launcher=launcher)
    (dest / "config.yaml").write_text(yaml.safe_dump(config))
    (dest / "cluster.yaml").write_text(yaml.safe_dump(training))
    return dest


def _home(tmp_path: Path) -> Path:
    return new_home(tmp_path / "home")


def _submit(home: Path, profile: Path, slurm, *targets: str, timeout: float = 900,
            preset: str = "smoke") -> subprocess.CompletedProcess:
    return subprocess.run([*SNAKEMAKE, "--directory", str(home), "--profile", str(profile), *targets, "--config",
                           f"preset={preset}"], env={**os.environ, **slurm.env, "DIFFEQFORMER_HOME": str(home)},
                          capture_output=True, text=True, cwd=paths.REPO, timeout=timeout)


@pytest.mark.pipeline
def test_a_training_and_its_token_cache_are_slurm_jobs_that_train_as_the_local_run(smoke_book, slurm, tmp_path):
    home = _home(tmp_path)
    before = {j["id"] for j in slurm.jobs()}
    out = _submit(home, _profile(tmp_path / "profile", slurm), slurm, "train_smoke_shared")
    assert out.returncode == 0, out.stderr[-4000:]
    jobs = [j for j in slurm.jobs() if j["id"] not in before]
    assert len(jobs) == 2 and all(j["state"] == "COMPLETED" for j in jobs), jobs
    assert len({j["name"] for j in jobs}) == 1  # one workflow run: the executor names its jobs by its run id
    assert "submitted with SLURM jobid" in out.stderr
    run = home / "runs" / "smoke-shared"
    assert losses(run) == losses(smoke_book.home / "runs" / "smoke-shared") and any(losses(run))


@pytest.mark.pipeline
@pytest.mark.parametrize("ask", ["cpus", "partition"])
def test_a_profile_asking_for_what_the_cluster_lacks_is_refused_in_one_line(slurm, tmp_path, ask):
    home = _home(tmp_path)
    profile = _profile(tmp_path / "profile", slurm, **({"cpus": slurm.cpus + 1} if ask == "cpus" else
                                                       {"partition": "no-such-partition"}))
    before = {j["id"] for j in slurm.jobs()}
    out = _submit(home, profile, slurm, "train_smoke_shared", timeout=300)
    text = out.stdout + out.stderr
    assert out.returncode != 0
    field = "cpus_per_task" if ask == "cpus" else "slurm_partition"
    said = [line for line in text.splitlines() if line.startswith("error: the cluster refused a job")]
    assert len(said) == 1 and f"edit {field} (default-resources" in said[0], text[-3000:]
    assert {j["id"] for j in slurm.jobs()} == before  # nothing was queued
    assert not (home / "runs").exists() and not (home / "_build" / "workflow" / "smoke" / "tokens").exists()


@pytest.mark.slow
def test_a_training_of_two_tasks_started_by_srun_is_one_run(slurm, tmp_path):
    """The profile's launcher, ``srun``, starts a training job's two tasks, one CPU device each, which Levanter's SLURM
    start-up joins into one run: one metrics line a step, the run's files written once, and the losses of one process
    on two CPU devices, to a relative 1e-5 (float32 sums taken in another order)."""
    from diffeqformer import runs

    if slurm.cpus < 2:
        pytest.skip("a node of one core cannot run two tasks")
    home = _home(tmp_path)
    before = {j["id"] for j in slurm.jobs()}
    out = _submit(home, _profile(tmp_path / "profile", slurm, tasks=2, launcher="srun"), slurm, "train_smoke_shared")
    assert out.returncode == 0, out.stderr[-4000:]
    jobs = [j for j in slurm.jobs() if j["id"] not in before]
    assert sorted(j["cpus"] for j in jobs) == ["1", "2"], jobs  # the token cache's one task, the training's two
    reference = tmp_path / "one-process"
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "DIFFEQFORMER_HOME": str(home),
           "XLA_FLAGS": (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2").strip()}
    done = subprocess.run([sys.executable, "-m", "diffeqformer.train", "--config",
                           str(paths.CONFIG / "smoke" / "shared.yaml"), "--run_dir", str(reference)], env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    run = home / "runs" / "smoke-shared"
    mine, its = runs.read_metrics(run), runs.read_metrics(reference)
    for column in ("train/loss", "eval/loss"):
        a, b = mine[column].dropna(), its[column].dropna()
        assert list(a.index) == list(b.index) and len(a) >= 2, column
        np.testing.assert_allclose(a.to_numpy(), b.to_numpy(), rtol=1e-5, err_msg=column)
    def logged(run_dir: Path) -> int:  # lines with a training loss: process 0 alone writes them
        return sum("train/loss" in json.loads(line) for line in (run_dir / runs.METRICS).read_text().splitlines())

    assert logged(run) == logged(reference)
    assert runs.summary(run)["steps"] == runs.summary(reference)["steps"]
    assert (runs.read_complete(run)["processes"], runs.read_complete(run)["devices"]) == (2, 2)
    assert (runs.read_complete(reference)["processes"], runs.read_complete(reference)["devices"]) == (1, 2)


HEARTBEAT = 15
"""Seconds of missed heartbeats after which JAX's runtime ends a process of a run whose peer died (the test's)."""


@pytest.fixture
def background():
    """Start ``_popen``'s workflows through this; those still running when the test ends (a failed one) are ended."""
    started = []
    yield lambda *args, **kw: started.append(_popen(*args, **kw)) or started[-1]
    for proc in started:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


def _popen(home: Path, profile: Path, slurm, log: Path, *targets: str, env: dict | None = None,
           preset: str = "smoke") -> subprocess.Popen:
    """``_submit`` in the background, its output in ``log``."""
    return subprocess.Popen([*SNAKEMAKE, "--directory", str(home), "--profile", str(profile), *targets, "--config",
                             f"preset={preset}"], env={**os.environ, **slurm.env, "DIFFEQFORMER_HOME": str(home),
                                                   **(env or {})},
                            stdout=log.open("w"), stderr=subprocess.STDOUT, text=True, cwd=paths.REPO)


def _until(ready, proc: subprocess.Popen, log: Path, what: str, seconds: float = 600) -> None:
    deadline = time.monotonic() + seconds
    while not ready():
        assert proc.poll() is None, f"the workflow ended before {what}:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"not at {what} within {seconds:.0f} s"
        time.sleep(0.05)


def _job_processes(job_id: str) -> list:
    """The Python processes of SLURM job ``job_id`` that run a workflow job (``diffeqformer.workflow.jobs``)."""
    import psutil

    found = []
    for p in psutil.process_iter(["name", "cmdline", "environ"]):
        if ("python" in (p.info["name"] or "") and (p.info["environ"] or {}).get("SLURM_JOB_ID") == job_id
                and "diffeqformer.workflow.jobs" in " ".join(p.info["cmdline"] or [])):
            found.append(p)
    return found


def _gone(job_id: str, seconds: float = 30) -> bool:
    """Whether every process of the job has ended within ``seconds``."""
    deadline = time.monotonic() + seconds
    while _job_processes(job_id):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)
    return True


def _running_training(slurm, before: set) -> dict:
    """The one job of this workflow that is running (the token cache's has finished by then)."""
    running = [j for j in slurm.jobs() if j["id"] not in before and j["state"] == "RUNNING"]
    assert len(running) == 1, running
    return running[0]


NAME = "cpu-diffeqformer-random-steps"
"""The cancelled run: one seed of 250 steps, a checkpoint every 100."""
RULE, LOG = f"train_{NAME.replace('-', '_')}", f"train-{NAME.replace('-', '_')}.log"
"""Its workflow rule and the rule's log."""


@pytest.mark.slow
def test_a_cancelled_training_job_resumes_from_its_checkpoint_and_ends_as_an_uninterrupted_run(slurm, tmp_path,
                                                                                           background):
    """``scancel`` of a training job once its first checkpoint is written: the workflow reports the job failed,
    nothing is marked complete, and the workflow run again resumes the run from that checkpoint to the losses of a
    local, uninterrupted run, bit for bit. A run of the cpu preset (250 steps, a checkpoint every 100, one seed): a
    smoke run's last ten steps after its checkpoint pass faster than a cancellation reaches them."""
    from diffeqformer import runs

    home = _home(tmp_path)
    profile = _profile(tmp_path / "profile", slurm)
    run = home / "runs" / NAME
    before = {j["id"] for j in slurm.jobs()}
    log = tmp_path / "cancelled.log"
    proc = background(home, profile, slurm, log, RULE, preset="cpu")
    _until((run / runs.CHECKPOINTS / "step-100" / "metadata.json").exists, proc, log, "the checkpoint of step 100")
    job = _running_training(slurm, before)
    slurm.run("scancel", job["id"])
    assert proc.wait(timeout=300) != 0
    assert [j["state"] for j in slurm.jobs() if j["id"] == job["id"]] == ["CANCELLED"]
    assert _gone(job["id"]), "the cancelled job's training lives on"
    assert not runs.is_complete(run), "the training ended before it was cancelled"
    assert f"SLURM-job '{job['id']}' failed, SLURM status is: 'CANCELLED'" in log.read_text(), log.read_text()[-3000:]

    out = _submit(home, profile, slurm, RULE, preset="cpu")
    assert out.returncode == 0, out.stderr[-4000:]
    training_log = (home / "_build" / "workflow" / "cpu" / "logs" / LOG).read_text()
    resumed = re.findall(rf"{NAME}: resuming from step (\d+)", training_log)
    assert resumed and int(resumed[-1]) >= 100, training_log[-3000:]

    reference = _home(tmp_path / "reference")
    local = subprocess.run(command(reference, RULE, cores=1, preset="cpu"), capture_output=True, text=True,
                           env={**os.environ, "DIFFEQFORMER_HOME": str(reference)}, timeout=900)
    assert local.returncode == 0, local.stderr[-3000:]
    mine, its = runs.read_metrics(run), runs.read_metrics(reference / "runs" / NAME)
    for column in ("train/loss", "eval/loss"):  # each step's, once: the steps after the checkpoint were logged twice
        a, b = mine[column].dropna(), its[column].dropna()
        assert list(a.index) == list(b.index) and len(a) >= 2, column
        np.testing.assert_array_equal(a.to_numpy(), b.to_numpy(), err_msg=column)


@pytest.mark.slow
def test_one_task_of_a_two_task_training_killed_ends_the_job_in_bounded_time_with_one_line(slurm, tmp_path,
                                                                                          background):
    """SIGKILL of one task's training process (the child that ``devices.watched`` forks) once the run trains: the
    other task cannot go on alone, and JAX's runtime ends it once its peer missed the heartbeats of
    ``HEARTBEAT`` seconds. The job then fails within a minute more, the training's log saying in one line per task
    that a process of the run stopped, and nothing is marked complete."""
    from diffeqformer import devices, runs

    if slurm.cpus < 2:
        pytest.skip("a node of one core cannot run two tasks")
    home = _home(tmp_path)
    profile = _profile(tmp_path / "profile", slurm, tasks=2, launcher="srun")
    run = home / "runs" / "smoke-shared"
    before = {j["id"] for j in slurm.jobs()}
    log = tmp_path / "killed.log"
    proc = background(home, profile, slurm, log, "train_smoke_shared", env={devices.HEARTBEAT_TIMEOUT: str(HEARTBEAT)})
    _until(lambda: (run / runs.METRICS).exists(), proc, log, "the first metrics line")
    job = _running_training(slurm, before)
    tasks = _job_processes(job["id"])
    children = [p for p in tasks if p.ppid() in {q.pid for q in tasks}]
    assert len(children) == 2, tasks  # one forked training process per task
    killed = time.monotonic()
    children[1].kill()
    while (state := next(j["state"] for j in slurm.jobs() if j["id"] == job["id"])) in ("RUNNING", "COMPLETING"):
        assert time.monotonic() - killed < HEARTBEAT + 60, "the job runs on after one of its tasks was killed"
        time.sleep(0.5)
    assert state == "FAILED" and _gone(job["id"])
    assert proc.wait(timeout=300) != 0
    training_log = (home / "_build" / "workflow" / "smoke" / "logs" / "train-smoke_shared.log").read_text()
    said = [line for line in training_log.splitlines() if line.startswith("error: smoke-shared:")]
    assert 1 <= len(said) <= 2 and all("process of the run" in line for line in said), \
        training_log[-3000:]
    assert not runs.is_complete(run)
