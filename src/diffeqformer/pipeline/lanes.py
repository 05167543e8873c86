"""The training lanes: child processes that train the runs (and execute the notebooks) side by side, with progress."""

from __future__ import annotations

import heapq
import itertools
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import typing
from pathlib import Path
from typing import Any, Mapping

from .. import config as configs
from .. import finetune, paths, population, runs, train, use_onednn
from ..data import corpora
from ..runs import is_complete
from .notebooks import stop_notebooks
from .planning import NotebookJob, PipelineError, Training, work_dir
from .processes import ONE_ARENA, PRUNE_CHECKPOINTS, child_env, exit_with_parent, keep_heap
from .progress import Costs, Progress


# -------------------------------------------------------------------------------------------------- the steps


def load_state() -> dict:
    path = work_dir() / "state.json"
    return json.loads(path.read_text()) if path.exists() else {}


def save_state(state: dict) -> None:
    paths.write_atomic(work_dir() / "state.json", json.dumps(state, indent=1, sort_keys=True) + "\n")


RUNS_PER_WORKER = 8
"""Runs one training process trains before the next takes over. One process for everything crashed on the cpu
preset after 32 runs (LLVM: "Cannot allocate memory" while compiling, then a segmentation fault): compiled
programs pile up in a long-lived JAX process. Starting one costs about 10 s (JAX, Levanter)."""
TRAIN_LANES = int(os.environ.get("DIFFEQFORMER_TRAIN_LANES", "2"))
"""Training processes that run side by side (``DIFFEQFORMER_TRAIN_LANES``; 1 trains one run at a time): a run's
start-up, compilation and evaluation keep mostly one core busy, so two lanes finish sooner; the training steps
themselves gain nothing from it (measurements page), so each lane's processes run on cores of their own
(``lane_cpus``)."""
WORKER_CPUS = "DIFFEQFORMER_WORKER_CPUS"
"""Environment variable through which a lane tells its training process the cores it runs on (``lane_cpus``)."""


def lane_cpus(k: int, lanes: int) -> list[int] | None:
    """The cores on which lane ``k`` of ``lanes`` trains: this process's cores split into ``lanes`` equal parts
    (a remainder unused), or None (no pinning) with one lane, with fewer cores than lanes, or where the system cannot
    pin processes. XLA starts one compute thread per core a process may run on; unpinned, each of two lanes started
    as many threads as the machine has cores, and their threads competed. ``lanes`` is the number of lanes asked
    for, not of those that had work: a run trains on the same number of cores (and so, with XLA's thread-dependent
    rounding, to the same bits) whether it is the pipeline's last run or one of many, and when it resumes."""
    if lanes < 2 or not hasattr(os, "sched_getaffinity"):
        return None
    cpus = sorted(os.sched_getaffinity(0))
    per = len(cpus) // lanes
    if per < 1:
        return None
    return cpus[k * per:(k + 1) * per]


def pin_to_worker_cpus() -> None:
    """In a training process: run on the cores its lane was given (``WORKER_CPUS``), before JAX starts its CPU
    backend (which sizes its thread pool by the cores the process may run on)."""
    cpus = os.environ.get(WORKER_CPUS)
    if cpus:
        os.sched_setaffinity(0, {int(c) for c in cpus.split(",")})


def worker_env(env: Mapping[str, str], cpus: list[int] | None) -> dict[str, str]:
    """The environment of a training process on ``cpus`` (None: every core): ``env`` with its cores
    (``WORKER_CPUS``), a training process's CPU kernels (``diffeqformer.use_onednn``) and, pinned, one heap for all
    its threads (``processes.ONE_ARENA``)."""
    env = {k: v for k, v in env.items() if k != WORKER_CPUS}
    use_onednn(env)
    if cpus is not None:
        env[WORKER_CPUS] = ",".join(map(str, cpus))
        env["GLIBC_TUNABLES"] = keep_heap(env.get("GLIBC_TUNABLES"), ONE_ARENA)
    return env


class _Worker:
    """A ``--train-worker`` child process: it reads one run spec (JSON) per line on its standard input, trains it
    and answers ``@pipeline done`` on its standard output; everything else it prints goes to ``log``. Given
    ``cpus``, it runs on those cores and allocates from one heap (``processes.ONE_ARENA``)."""

    def __init__(self, log: Path, env: Mapping[str, str], cpus: list[int] | None = None):
        self.log = log
        self.out = log.open("a")
        self.proc = subprocess.Popen([sys.executable, "-m", "diffeqformer.pipeline", "--train-worker"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.out, text=True,
                                     env=child_env(worker_env(env, cpus)), cwd=paths.REPO)
        self.runs = 0

    def do(self, spec: Mapping[str, Any]) -> None:
        """Send one spec and wait for it to finish; ``PipelineError`` with the end of the log if the process dies."""
        self.proc.stdin.write(json.dumps(spec) + "\n")
        self.proc.stdin.flush()
        for line in self.proc.stdout:
            if line.startswith("@pipeline done"):
                self.runs += 1
                return
            self.out.write(line)
            self.out.flush()
        rc = self.proc.wait()
        self.out.flush()
        tail = "\n".join(self.log.read_text().splitlines()[-25:])
        raise PipelineError(f"training failed (exit code {rc}); the end of its log {self.log}:\n{tail}")

    def close(self, kill: bool = False) -> None:
        if kill and self.proc.poll() is None:
            self.proc.terminate()
        try:
            self.proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass
        self.proc.wait()
        self.out.close()


def _spec(t: Training | list[Training], prepare: bool = False) -> dict[str, Any]:
    """What a worker is sent: one run, or a population's members (``module: "population"``)."""
    if isinstance(t, list):
        return {**_spec(t[0], prepare), "module": "population", "members": [_spec(m) for m in t]}
    return {"config": str(t.path), "overrides": list(t.run.overrides) if t.run else [],
            "module": t.run.module if t.run else "train", "prepare": prepare}


def training_units(trainings: list[Training]) -> list[list[Training]]:
    """The trainings still to do, as what one lane trains at once: a run alone, or every member of a population
    (all of them, the complete ones too, if any is not complete: the population trains as a whole)."""
    groups: dict[Any, list[Training]] = {}
    for t in trainings:
        groups.setdefault(t.population_key or ("alone", t.config), []).append(t)
    return [group for group in groups.values() if not all(t.done for t in group)]


RUNS_ALONE = frozenset({"f9_time_embedding"})
"""Notebooks that measure the machine (F9 times and sizes training steps in fresh processes): ``train_runs`` runs
them after everything else, with the other lane idle, so that no other work shares the two cores while they
measure."""


def runs_alone(preset: str) -> frozenset:
    """The notebooks of ``RUNS_ALONE`` that ``preset`` runs alone: none in the smoke preset, a test of the pipeline
    whose timings no result rests on (F9 alone kept the other lane idle for about two of the smoke pipeline's nine
    minutes)."""
    return frozenset() if preset == "smoke" else RUNS_ALONE


def train_runs(trainings: list[Training], progress: Progress, first_step: int, log: Path,
               lanes: int | None = None, *, notebooks: list[tuple[int, NotebookJob]] = (),
               execute: typing.Callable[[NotebookJob], float] | None = None,
               seconds: dict[str, float] | None = None, alone: frozenset | None = None,
               costs: Costs | None = None) -> dict[str, float]:
    """Train the runs that are not complete in ``lanes`` (default ``TRAIN_LANES``) child processes side by side,
    each taking the next run whose pretraining (``Training.after``) has finished, ``RUNS_PER_WORKER`` runs per
    process (``train.main`` or ``finetune.main`` called in turn: one JAX/Levanter start-up per process instead of one
    per run; the pipeline's own process never starts JAX). First one process builds the token caches of every
    dataset the runs read, so that no two processes build one at once. Output goes to ``log`` (lane k > 0:
    ``<log>-k``). A failed run stops the others (they resume from their checkpoints next time).

    ``notebooks`` (pairs of progress index and job) are executed by the same lanes with ``execute(job)``: a lane
    takes a notebook as soon as every run it reads (``NotebookJob.runs``) is complete, before any run still to
    train, so that notebooks fill the time in which a lane would otherwise wait for the last long run, and two
    notebooks execute side by side after the last run; one in ``alone`` (default ``RUNS_ALONE``) waits until
    nothing else is left or running, and the other lanes wait while it runs (``_Schedule``). A failed notebook stops
    the lanes like a failed run. Returns the measured seconds per config, and per notebook under
    ``notebook:<name>`` (also filled into ``seconds`` as they are measured, so that a caller keeps them when a later
    run or notebook fails). Every run a lane trains must have its ``complete.json`` for its configuration before a
    notebook reads it. One process trains several runs (``RUNS_PER_WORKER``): less CPU time than a process per run,
    the same parameters (measurements page).

    While the lanes work, ``progress`` gives as the time left of their steps the schedule played forward with
    ``costs`` (``_Schedule.time_left``), which records what each unit and notebook took."""
    units = training_units(trainings)  # a run, or a population's members
    notebooks = list(notebooks)
    seconds = {} if seconds is None else seconds
    if not units and not notebooks:
        return seconds
    if notebooks and execute is None:
        raise ValueError("train_runs: notebooks need an execute function")
    asked = TRAIN_LANES if lanes is None else lanes
    index = {id(t): first_step + i for i, t in enumerate(trainings)}
    costs = Costs("") if costs is None else costs
    pool = _Lanes(max(1, min(asked, len(units) + len(notebooks))), asked, log, progress, index, seconds, execute,
                  costs)
    pool.prepare_data([t for unit in units for t in unit])
    finished = {t.config for t in trainings if t.done}
    schedule = _Schedule(units, notebooks, finished, RUNS_ALONE if alone is None else alone)
    steps = [index[id(t)] for unit in units for t in unit] + [i for i, _ in notebooks]
    with progress.estimating(steps, lambda: schedule.time_left(costs, len(pool.workers), time.time())):
        pool.run(schedule)
    return seconds


class _Schedule:
    """What the lanes of ``train_runs`` do next, shared by their threads, which change it holding ``cond``: the units
    still to train (longest first; of equal length, in the registry's order) and the notebooks still to execute
    (pairs of progress index and job), what has finished, and the lanes' errors."""

    def __init__(self, units: list[list[Training]], notebooks: list[tuple[int, NotebookJob]], finished: set[str],
                 alone: frozenset):
        self.units = sorted(units, key=lambda u: -u[0].steps)
        self.notebooks = list(notebooks)
        self.finished = finished
        """Keys (``Training.config``) of the runs that are complete."""
        self.alone = alone
        self.errors: list[PipelineError] = []
        self.running = 0
        """Items that lanes are working on."""
        self.running_alone = False
        """Whether one of them is a notebook that runs alone (the other lanes wait)."""
        self.begun: dict[int, tuple[list[Training] | tuple[int, NotebookJob], float]] = {}
        """``id`` of an item that lanes are working on -> the item and when it was taken."""
        self.cond = threading.Condition()

    def take(self) -> list[Training] | tuple[int, NotebookJob] | None:
        """The next item for a lane, a unit or a notebook, once one is ready (waiting until then); None when nothing
        is left or a lane has failed."""
        with self.cond:
            while not self.errors and (self.units or self.notebooks):
                item = None if self.running_alone else self._ready()
                if item is not None:
                    (self.notebooks if isinstance(item, tuple) else self.units).remove(item)
                    self.running += 1
                    self.begun[id(item)] = item, time.time()
                    return item
                self.cond.wait()
            return None

    def _ready(self) -> list[Training] | tuple[int, NotebookJob] | None:
        """The first notebook whose runs are all complete (one that runs alone excepted), else the first unit whose
        pretrainings are, else, with no unit left and nothing running, a notebook that runs alone (then marked
        ``running_alone``); None if nothing is ready."""
        item = next(((i, j) for i, j in self.notebooks if j.name not in self.alone and self._readable(j)), None)
        if item is None:
            item = next((u for u in self.units if all(a in self.finished for t in u for a in t.after)), None)
        if item is None and not self.units and self.running == 0:
            item = next(((i, j) for i, j in self.notebooks if self._readable(j)), None)
            self.running_alone = item is not None
        return item

    def _readable(self, job: NotebookJob) -> bool:
        """Whether every run ``job`` reads is complete."""
        return all(r in self.finished for r in job.runs)

    def finish(self, item: list[Training] | tuple[int, NotebookJob]) -> None:
        """Record that a lane finished ``item`` (a unit's runs are then complete) and wake the waiting lanes."""
        with self.cond:
            if not isinstance(item, tuple):
                self.finished.update(t.config for t in item)
            self.begun.pop(id(item), None)
            self.running -= 1
            self.running_alone = False
            self.cond.notify_all()

    def fail(self, err: PipelineError) -> None:
        """Record a lane's error: no lane takes another item."""
        with self.cond:
            self.errors.append(err)
            self.cond.notify_all()

    def time_left(self, costs: Costs, lanes: int, now: float) -> float | None:
        """Seconds until ``lanes`` lanes have done everything left, by playing this schedule forward: the items being
        worked on end when ``costs.left`` says, and each lane that is free takes what ``take`` would give it then
        (the same ``_ready``), for ``costs.seconds``; None while ``costs`` cannot price an item yet."""
        with self.cond:
            costs.refresh()
            ends = []
            for k, (item, begun) in enumerate(self.begun.values()):
                left = costs.left(item, begun, now)
                if left is None:
                    return None
                ends.append((left, k, item))
            play = _Schedule([], list(self.notebooks), set(self.finished), self.alone)
            play.units = list(self.units)  # already in the order take() gives them
            play.running, play.running_alone = self.running, self.running_alone
        heapq.heapify(ends)
        order = itertools.count(len(ends))
        clock, free = 0.0, max(0, lanes - len(ends))
        while True:
            while free and not play.running_alone and (item := play._ready()) is not None:
                (play.notebooks if isinstance(item, tuple) else play.units).remove(item)
                took = costs.seconds(item)
                if took is None:
                    return None
                play.running += 1
                free -= 1
                heapq.heappush(ends, (clock + took, next(order), item))
            if not ends:
                return clock
            clock, _, item = heapq.heappop(ends)
            play.finish(item)
            free += 1


class _Lanes:
    """The lanes of ``train_runs``: one thread each, taking items from a ``_Schedule``, training a unit in the lane's
    training process (``_Worker``: started when first needed, replaced after ``RUNS_PER_WORKER`` runs, on the lane's
    cores, ``lane_cpus``) or executing a notebook, with progress; measured seconds go into ``seconds``."""

    def __init__(self, count: int, asked: int, log: Path, progress: Progress, index: dict[int, int],
                 seconds: dict[str, float], execute: typing.Callable[[NotebookJob], float] | None, costs: Costs):
        self.cpus = [lane_cpus(k, asked) for k in range(count)]
        log.parent.mkdir(parents=True, exist_ok=True)
        self.env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}
        self.logs = [log] + [log.with_name(f"{log.stem}-{k}{log.suffix}") for k in range(1, count)]
        self.workers: list[_Worker | None] = [None] * count
        self.progress = progress
        self.index = index
        """``id`` of a ``Training`` -> its progress index."""
        self.seconds = seconds
        self.execute = execute
        self.costs = costs

    def prepare_data(self, todo: list[Training]) -> None:
        """Build the token caches of every dataset that ``todo`` reads, in lane 0's process (the first run of each
        dataset prepares it), before any lane trains."""
        first_of: dict[str, Training] = {}  # the first run of each distinct dataset
        for t in todo:
            first_of.setdefault(t.data, t)
        if not first_of:
            return
        self.workers[0] = _Worker(self.logs[0], self.env, self.cpus[0])
        try:
            for t in first_of.values():
                self.workers[0].do(_spec(t, prepare=True))
        except PipelineError:
            self.workers[0].close(kill=True)
            raise

    def run(self, schedule: _Schedule) -> None:
        """Work through ``schedule`` in every lane side by side; raise the first lane's error, if any."""
        threads = [threading.Thread(target=self.lane, args=(k, schedule), daemon=True)
                   for k in range(len(self.workers))]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        if schedule.errors:
            raise schedule.errors[0]

    def lane(self, k: int, schedule: _Schedule) -> None:
        """Lane ``k``'s thread: take items until none is left; on an error, stop every lane."""
        try:
            while (item := schedule.take()) is not None:
                if isinstance(item, tuple):
                    self.execute_notebook(*item)
                else:
                    self.train(k, item)
                schedule.finish(item)
        except PipelineError as err:
            schedule.fail(err)
            self.stop()
        finally:
            if self.workers[k] is not None:
                self.workers[k].close()

    def worker(self, k: int) -> _Worker:
        """Lane ``k``'s training process, a fresh one after ``RUNS_PER_WORKER`` runs."""
        if self.workers[k] is not None and self.workers[k].runs >= RUNS_PER_WORKER:
            self.workers[k].close()
            self.workers[k] = None
        if self.workers[k] is None:
            self.workers[k] = _Worker(self.logs[k], self.env, self.cpus[k])
        return self.workers[k]

    def train(self, k: int, unit: list[Training]) -> None:
        """Train ``unit`` (a run, or a population's members as one spec) in lane ``k``; ``PipelineError`` unless each
        run is then complete for its configuration."""
        worker = self.worker(k)
        together = f" (one of a population of {len(unit)}, trained together)" if len(unit) > 1 else ""
        self.costs.began(unit, time.time())
        started = [self.progress.begin(self.index[id(t)], f"train {t.config} -> {t.run_dir}{together}") for t in unit]
        worker.do(_spec(unit if len(unit) > 1 else unit[0]))
        ended = time.time()
        took = ended - started[0]
        for t in unit:
            if not is_complete(t.run_dir, t.config_hash):
                raise PipelineError(f"run {t.run_dir} did not finish for config {t.config}")
        self.costs.ended(unit, ended)
        for t, begun in zip(unit, started):
            self.progress.end(self.index[id(t)], begun)
            # a population's time is shared by its members, as two lanes' time is by the runs side by side
            self.seconds[t.config] = took / len(unit)
        if os.environ.get(PRUNE_CHECKPOINTS) == "1":
            for t in unit:
                shutil.rmtree(runs.checkpoints(t.run_dir), ignore_errors=True)

    def execute_notebook(self, i: int, job: NotebookJob) -> None:
        """Execute ``job`` (progress step ``i``) with ``execute``."""
        started = self.progress.begin(i, f"execute {job.name}")
        self.execute(job)
        self.seconds[f"notebook:{job.name}"] = took = self.progress.end(i, started)
        self.costs.notebook_done(job, took)

    def stop(self) -> None:
        """Stop the runs training in every lane and the notebooks executing (a lane failed)."""
        for w in self.workers:
            if w is not None and w.proc.poll() is None:
                w.proc.terminate()
        stop_notebooks()


def _load(spec: dict):
    """The configuration a worker's spec names: its file, overrides and module (``finetune``: a fine-tuning's)."""
    cls = configs.FinetuneConfig if spec["module"] == "finetune" else configs.TrainConfig
    return configs.load_config(spec["config"], spec["overrides"], cls=cls)


def build_token_caches(config) -> None:
    """Build (or load) the token caches of a run's training and validation data (``corpora.build_token_caches``)."""
    corpora.build_token_caches(config.data.levanter_config())


def train_worker() -> None:
    """Child process of ``train_runs``: for each spec (JSON, one per line on standard input) ``train.main``,
    ``finetune.main``, ``population.main`` (or, with ``"prepare": true``, ``build_token_caches``), then
    ``@pipeline done`` on standard output. A spec is ``{"config": path, "overrides": [...], "module": "train" |
    "finetune" | "population", "prepare": bool}``, a population's with ``"members"``: a spec of each member."""
    import gc

    pin_to_worker_cpus()
    import jax

    train.use_compilation_cache()
    exit_with_parent()
    for line in sys.stdin:
        spec = json.loads(line)
        if spec["module"] == "population" and not spec.get("prepare"):
            config = [_load(member) for member in spec["members"]]
            main = population.main
        else:
            config = _load(spec)
            main = finetune.main if spec["module"] == "finetune" else train.main
        (build_token_caches if spec.get("prepare") else main)(config)
        jax.clear_caches()  # this run's compiled programs: the next run compiles its own
        gc.collect()
        print("@pipeline done", flush=True)
