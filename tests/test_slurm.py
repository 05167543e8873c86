"""The workflow on a real SLURM cluster: a one-node cluster started by the tests (``slurm_cluster``; skipped, saying
why, where SLURM is not installed) and Snakemake's SLURM executor with a profile made from
``workflow/profiles/slurm`` for it. A training and the token cache before it are SLURM jobs, and the run trains to the
numbers of the local smoke workflow's; a profile asking for more CPUs than the node has, or for a partition the
cluster lacks, is refused by SLURM before anything runs, and reported in one line (these marked ``pipeline``: they
run in the smoke workflow's process of ``make test``, beside its smoke home); a training of two tasks started by
``srun`` is one run (``slow``)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

import pytest
import yaml
from slurm_cluster import PARTITION, cluster, missing
from smoke_pipeline import SNAKEMAKE, losses, smoke_book  # noqa: F401 (session fixture)

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
    home = tmp_path / "home"
    home.mkdir()
    (home / "data").symlink_to(paths.DATA, target_is_directory=True)
    return home


def _submit(home: Path, profile: Path, slurm, *targets: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([*SNAKEMAKE, "--directory", str(home), "--profile", str(profile), *targets, "--config",
                           "preset=smoke"], env={**os.environ, **slurm.env, "DIFFEQFORMER_HOME": str(home)},
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
    refused = [line for line in text.splitlines() if "sbatch" in line.lower() and "error" in line.lower()]
    expected = "More processors requested than permitted" if ask == "cpus" else "Invalid partition name specified"
    assert any(re.search(expected, line, flags=re.I) for line in refused), text[-3000:]
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
