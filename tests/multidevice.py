"""Trains several runs in one process on however many CPU devices ``XLA_FLAGS`` gives it, and prints what the tests
of ``test_devices.py`` check, as one JSON line (``@result {...}``): per run, its losses and how its trained
parameters were laid over the devices, or the one-line error it stopped with.

``python tests/multidevice.py '<json list of jobs>'``; a job is ``{"label": ..., "module": "train" | "finetune" |
"population", "config": file, "overrides": [...], "seeds": n}``, and, to resume another run, ``"resume": [its run
directory, the step of the checkpoint to resume from]`` (a copy of it cut back to that checkpoint, in the job's
``--run_dir``). One process for several runs: a process that imports Levanter costs seconds, and the device count is
fixed when JAX starts."""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

import jax

from diffeqformer import config as configs
from diffeqformer import devices, finetune, population, runs, train


def layout(tree) -> dict:
    """How the arrays of ``tree`` lie on the devices: each array's partition spec (by its path), the bytes of the
    whole tree and the most any one device holds, and the devices holding some."""
    specs, held = {}, devices.bytes_per_device(tree)
    for path, x in jax.tree_util.tree_leaves_with_path(tree):
        if isinstance(x, jax.Array):
            specs[jax.tree_util.keystr(path)] = str(getattr(x.sharding, "spec", x.sharding))
    total = sum(x.nbytes for x in jax.tree.leaves(tree) if isinstance(x, jax.Array))
    return {"specs": specs, "total_bytes": total, "max_device_bytes": max(held.values()),
            "devices_used": sum(1 for b in held.values() if b)}


def cut_back(source: str, run_dir: Path, step: int) -> None:
    """A copy of the run ``source`` in ``run_dir`` as it was when it wrote the checkpoint of ``step``: no model, no
    summary, no later checkpoint (its later metrics stay: a resumed run's own win, ``runs.read_metrics``)."""
    shutil.copytree(source, run_dir)
    for name in (runs.COMPLETE, runs.MODEL):
        (run_dir / name).unlink()
    for checkpoint in runs.checkpoints(run_dir).iterdir():
        if int(checkpoint.name.removeprefix("step-")) > step:
            shutil.rmtree(checkpoint)


def run(job: dict) -> dict:
    """Train ``job``; its losses (per run: ``train/loss`` and ``eval/loss`` by step) and the layout of each model
    saved, or its error."""
    seen: list[dict] = []
    whole: list[dict] = []  # a population's: its model before a member is taken out of it
    copy, take = devices.host_copy, population.member
    devices.host_copy = lambda tree: (seen.append(layout(tree)), copy(tree))[1]
    population.member = lambda tree, k: (whole.append(layout(tree)) if k == 0 else None, take(tree, k))[1]
    try:
        cls = configs.FinetuneConfig if job["module"] == "finetune" else configs.config_class(job["config"])
        config = configs.load_config(job["config"], job.get("overrides", []), cls=cls)
        if "resume" in job:
            cut_back(job["resume"][0], configs.run_dir_of(config), job["resume"][1])
        if job["module"] == "population":
            members = population.members_of(config, job["seeds"])
            population.main(members)
            dirs = [configs.run_dir_of(c) for c in members]
        else:
            (finetune.main if job["module"] == "finetune" else train.main)(config)
            dirs = [configs.run_dir_of(config)]
    except (ValueError, SystemExit) as err:
        return {"error": configs.one_line(err)}
    finally:
        devices.host_copy, population.member = copy, take
    losses = []
    for run_dir in dirs:
        metrics = runs.read_metrics(run_dir)
        losses.append({c: {int(k): float(v) for k, v in metrics[c].dropna().items()}
                       for c in ("train/loss", "eval/loss") if c in metrics})
    return {"losses": losses, "layouts": seen, "population_layout": whole[-1] if whole else None,
            "devices": jax.device_count()}


def main() -> None:
    train.use_compilation_cache()
    results = {}
    for job in json.loads(sys.argv[1]):
        start = time.perf_counter()
        results[job["label"]] = {**run(job), "seconds": time.perf_counter() - start}
    print("@result " + json.dumps(results), flush=True)


if __name__ == "__main__":
    main()
