"""The workflow on a real SLURM cluster: a one-node cluster started by the tests (``slurm_cluster``; skipped, saying
why, where SLURM is not installed) and Snakemake's SLURM executor with a profile made from
``workflow/profiles/slurm`` for it. A training and the token cache before it are SLURM jobs, and the run trains to the
numbers of the local smoke workflow's; a profile asking for more CPUs than the node has, or for a partition the
cluster lacks, is refused by SLURM before anything runs, and reported in one line. Marked ``pipeline``: it runs in the
smoke workflow's process of ``make test``, beside its smoke home."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from slurm_cluster import PARTITION, cluster, missing
from smoke_pipeline import SNAKEMAKE, smoke_book  # noqa: F401 (session fixture)

from diffeqformer import paths

pytestmark = [pytest.mark.pipeline, pytest.mark.skipif(missing() is not None, reason=missing() or "")]
PROFILE = paths.REPO / "workflow" / "profiles" / "slurm"


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    with cluster(tmp_path_factory.mktemp("slurm")) as made:
        yield made


def _profile(dest: Path, slurm, *, cpus: int = 1, partition: str = PARTITION) -> Path:
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
    training["training"].update(nodes=1, tasks=1, gpus=0, threads=cpus, runtime=30, launcher="")
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


def _losses(run_dir: Path) -> list:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if "loss" in k} for line in lines if line.strip()]


def test_a_training_and_its_token_cache_are_slurm_jobs_that_train_as_the_local_run(smoke_book, slurm, tmp_path):
    home = _home(tmp_path)
    before = {j["id"] for j in slurm.jobs()}
    out = _submit(home, _profile(tmp_path / "profile", slurm), slurm, "train_smoke_shared")
    assert out.returncode == 0, out.stderr[-4000:]
    jobs = [j for j in slurm.jobs() if j["id"] not in before]
    assert len(jobs) == 2 and all(j["state"] == "COMPLETED" for j in jobs), jobs
    assert len({j["name"] for j in jobs}) == 1  # one workflow run: the executor names its jobs by its run id
    assert "Job 0 has been submitted with SLURM jobid" in out.stderr or "submitted with SLURM jobid" in out.stderr
    run = home / "runs" / "smoke-shared"
    assert _losses(run) == _losses(smoke_book.home / "runs" / "smoke-shared") and any(_losses(run))


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
    shutil.rmtree(home)
