"""The pipeline's trainings handed to a SLURM cluster: ``python -m diffeqformer.pipeline --preset paper --slurm``.

Instead of training in local processes, the pipeline writes one batch script per training still to do (a run, or a
population's members together) and submits it with ``sbatch``, in the order the trainings depend on each other:

1. one job per corpus the trainings read, which builds its token caches (no two trainings build one at once);
2. each training, after the caches it reads and after its pretraining (``--dependency=afterok:...``): ``--nodes``
   nodes, ``--gpus-per-node`` GPUs and as many tasks on each, and ``srun`` starting one process per task, which
   Levanter's SLURM start-up (``devices.start``) joins into one run: the coordinator on the first node, a GPU each;
3. one job after every training has succeeded, which runs the pipeline again on one node: it finds every run
   complete (a complete run is not trained again), executes the notebooks and builds the book.

A complete run is not submitted. The scripts and the jobs' logs are kept in ``_build/pipeline/slurm/``.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from .. import config as configs
from .. import paths
from .lanes import build_token_caches, training_units
from .planning import PipelineError, Plan, Training, work_dir


@dataclass(frozen=True)
class Slurm:
    """What each training's job asks SLURM for."""

    nodes: int = 1
    """Nodes per training."""
    gpus_per_node: int = 8
    """GPUs per node, one process (SLURM task) each."""
    time: str = "24:00:00"
    """Each job's time limit, as ``sbatch --time`` takes it (``HH:MM:SS``, ``D-HH:MM:SS``, minutes)."""
    partition: str | None = None
    """``sbatch --partition``, if the cluster wants one."""
    extra: tuple[str, ...] = ()
    """Further ``sbatch`` options, one ``#SBATCH`` line each (``--account=...``, ``--qos=...``)."""
    sbatch: str = "sbatch"
    """The command that submits a script."""

    def check(self) -> None:
        """``PipelineError`` naming the option that SLURM would refuse."""
        for name, value in (("--nodes", self.nodes), ("--gpus-per-node", self.gpus_per_node)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise PipelineError(f"{name} must be a positive whole number, got {value!r}")
        if not re.fullmatch(r"(\d+-)?\d+(:\d\d){0,2}", self.time):
            raise PipelineError(f"--time must be a SLURM time limit such as 24:00:00 or 2-00:00:00, got {self.time!r}")


def command(unit: list[Training]) -> list[str]:
    """The arguments after ``python`` that train ``unit``: ``diffeqformer.train`` or ``diffeqformer.finetune`` with
    the run's config file and overrides, or ``diffeqformer.population ... --seeds n`` with its first member's (the
    lowest seed: ``population.members_of`` names and seeds the others as the pipeline does)."""
    if len(unit) == 1:
        t = unit[0]
        module = t.run.module if t.run else "train"
        return ["-m", f"diffeqformer.{module}", "--config", str(t.path), *(t.run.overrides if t.run else ())]
    first = min(unit, key=lambda t: t.run.load().trainer.seed)
    return ["-m", "diffeqformer.population", "--config", str(first.path), *first.run.overrides,
            "--seeds", str(len(unit))]


def script(name: str, argv: list[str], slurm: Slurm, *, nodes: int, tasks_per_node: int, gpus_per_node: int,
           run: str = "srun ") -> str:
    """A batch script that runs ``python argv`` (through ``run``: ``srun`` starts one process per task) in this
    repository, with this ``DIFFEQFORMER_HOME``, its output in ``slurm/logs/<name>-<job id>.log``."""
    lines = ["#!/bin/bash", f"#SBATCH --job-name={name}", f"#SBATCH --nodes={nodes}",
             f"#SBATCH --ntasks-per-node={tasks_per_node}", f"#SBATCH --time={slurm.time}",
             f"#SBATCH --output={logs_dir() / name}-%j.log"]
    if gpus_per_node:
        lines.append(f"#SBATCH --gpus-per-node={gpus_per_node}")
    if slurm.partition:
        lines.append(f"#SBATCH --partition={slurm.partition}")
    lines += [f"#SBATCH {option}" for option in slurm.extra]
    lines += ["set -euo pipefail", f"cd {shlex.quote(str(paths.REPO))}",
              f"export DIFFEQFORMER_HOME={shlex.quote(str(paths.HOME))} TOKENIZERS_PARALLELISM=false",
              run + shlex.join([sys.executable, *argv])]
    return "\n".join(lines) + "\n"


def slurm_dir() -> Path:
    """Where the batch scripts are written: ``_build/pipeline/slurm`` below DIFFEQFORMER_HOME."""
    return work_dir() / "slurm"


def logs_dir() -> Path:
    """Where the jobs write their output."""
    return slurm_dir() / "logs"


def _submit(slurm: Slurm, name: str, text: str, after: list[str]) -> str:
    """Write ``text`` as ``<name>.sbatch``, submit it after the jobs ``after`` have succeeded; its job id."""
    path = slurm_dir() / f"{name}.sbatch"
    path.write_text(text)
    dependency = [f"--dependency=afterok:{':'.join(after)}"] if after else []
    try:
        out = subprocess.run([slurm.sbatch, "--parsable", *dependency, str(path)], capture_output=True, text=True)
    except FileNotFoundError:
        raise PipelineError(f"--slurm: no {slurm.sbatch} command here; submit from a machine of the cluster") from None
    if out.returncode != 0:
        raise PipelineError(f"sbatch refused {path}: {(out.stderr or out.stdout).strip()[:500]}")
    return out.stdout.strip().split(";")[0]


def _in_order(units: list[list[Training]], done: set[str]) -> list[list[Training]]:
    """``units`` in an order in which each comes after the units that train its pretrainings."""
    ordered, placed = [], set(done)
    while units:
        ready = [u for u in units if all(a in placed for t in u for a in t.after)]
        if not ready:
            waiting = ", ".join(u[0].config for u in units)
            raise PipelineError(f"the trainings wait for each other in a circle: {waiting}")
        for u in ready:
            ordered.append(u)
            placed.update(t.config for t in u)
        units = [u for u in units if u not in ready]
    return ordered


def submit(result: Plan, slurm: Slurm, then: list[str], stream=None) -> dict[str, str]:
    """Submit the trainings of ``result`` that are not complete, as the module's docstring says, then the job that
    runs ``python then`` (the pipeline again) once they have all succeeded; return job name -> job id."""
    stream = stream or sys.stdout
    slurm.check()
    logs_dir().mkdir(parents=True, exist_ok=True)
    units = _in_order(training_units(result.trainings), {t.config for t in result.trainings if t.done})
    jobs: dict[str, str] = {}
    by_config: dict[str, str] = {}
    caches: dict[str, str] = {}
    one = dict(nodes=1, tasks_per_node=1, run="")
    for unit in units:
        data = unit[0].data
        if data not in caches:
            name = f"caches-{len(caches)}"
            argv = ["-m", "diffeqformer.pipeline.cluster", "prepare", *command([unit[0]])[2:]]
            caches[data] = jobs[name] = _submit(slurm, name, script(name, argv, slurm, gpus_per_node=0, **one), [])
            print(f"submitted {name} (the token caches of {unit[0].config}): job {jobs[name]}", file=stream,
                  flush=True)
        after = [caches[data], *dict.fromkeys(by_config[a] for t in unit for a in t.after if a in by_config)]
        name = unit[0].name + (f"-population{len(unit)}" if len(unit) > 1 else "")
        text = script(name, command(unit), slurm, nodes=slurm.nodes, tasks_per_node=slurm.gpus_per_node,
                      gpus_per_node=slurm.gpus_per_node)
        jobs[name] = _submit(slurm, name, text, after)
        by_config.update({t.config: jobs[name] for t in unit})
        print(f"submitted {name}: job {jobs[name]}" + (f" (after {', '.join(after)})" if after else ""),
              file=stream, flush=True)
    trainings = [jobs[n] for n in jobs if not n.startswith("caches-")]
    jobs["pipeline"] = _submit(slurm, "pipeline", script("pipeline", then, slurm, gpus_per_node=1, **one), trainings)
    print(f"submitted the notebooks and the book: job {jobs['pipeline']}" +
          (f" (after every training: {', '.join(trainings)})" if trainings else ""), file=stream, flush=True)
    return jobs


def main(argv: list[str] | None = None) -> None:
    """``python -m diffeqformer.pipeline.cluster prepare --config <file> [overrides]``: build the token caches of
    the run that file (with those overrides) configures; a cache job's command."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:2] != ["prepare", "--config"] or len(argv) < 3:
        raise SystemExit("usage: python -m diffeqformer.pipeline.cluster prepare --config <file> [overrides]")
    try:
        build_token_caches(configs.load_config(argv[2], argv[3:], cls=configs.config_class(argv[2])))
    except (ValueError, FileNotFoundError) as err:
        raise SystemExit(f"error: {configs.one_line(err)}") from None


if __name__ == "__main__":
    main()
