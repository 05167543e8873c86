"""``run``: plan, train, execute, stage and build the book, and move the results into place; ``main``, the command."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Mapping

from .. import paths
from ..forks import ForkServer
from ..report import book
from . import cluster, edition
from .lanes import TRAIN_LANES, load_state, runs_alone, save_state, train_runs, train_worker, training_units
from .notebooks import check_figures, execute_notebook, fork_server
from .pages import generated_pages
from .planning import PipelineError, Plan, cache_dir, html_dir, parse_overrides, plan, work_dir
from .processes import keep_heap, share_device
from .progress import Costs, Progress
from .registry import presets
from .sources import package_hash, sha

BOOK_FILES = ("_config.yml", "_toc.yml")


def _copy_book_sources(src: Path, toc: Path | None = None) -> None:
    for name in BOOK_FILES:
        shutil.copy(paths.REPO / name, src / name)
    if toc is not None:
        shutil.copy(toc, src / "_toc.yml")
    # the GPU edition's folder is not a chapter: edition.stage writes its notebooks, rendered, elsewhere
    def ignore(folder, names):
        at_top = Path(folder) == paths.BOOK
        return [n for n in names if n in ("_generated", "_build") or (at_top and (
            n == edition.EDITION.name or n.startswith(f".{edition.EDITION.name}.")))]

    shutil.copytree(paths.BOOK, src / "book", ignore=ignore)


def _tree_hash(root: Path) -> str:
    parts = []
    for f in sorted(p for p in root.rglob("*") if p.is_file()):
        parts += [str(f.relative_to(root)), f.read_bytes()]
    return sha(*parts)


JUPYTER_BOOK = "--jupyter-book"
"""``python -m diffeqformer.pipeline --jupyter-book ARGS``: Jupyter Book's command line (``jupyter-book ARGS``), as a
module that the fork server can run (``build_book``)."""


def build_book(src: Path, out: Path, forks: ForkServer | None = None) -> None:
    """``jupyter-book build`` with warnings as errors, nitpicky, into ``out``; the notebooks are not executed. With
    ``forks``, forked from it (Sphinx's API pages import the package's modules, which it has imported), else started
    afresh."""
    args = ["build", str(src), "--path-output", str(out), "--warningiserror", "--nitpick", "--keep-going", "--quiet"]
    proc = forks and _forked_book_build(forks, args, src)
    if proc is None:
        exe = Path(sys.executable).with_name("jupyter-book")
        proc = subprocess.run([str(exe) if exe.exists() else "jupyter-book", *args], capture_output=True, text=True,
                              cwd=src)
    if proc.returncode != 0:
        text = (proc.stdout + proc.stderr).strip().splitlines()
        # each warning with the lines that explain it (an autodoc import error's exception and traceback follow it)
        starts = [i for i, line in enumerate(text) if "WARNING" in line or "ERROR" in line]
        shown = []
        for i in starts:
            end = next((j for j in starts if j > i), len(text))
            block = text[i:end]
            # a long traceback: its head and its last lines, which name the exception
            shown += block if len(block) <= 25 else block[:20] + ["    ..."] + block[-5:]
        raise PipelineError("the book build failed:\n" + "\n".join((shown or text)[-80:]))


def _forked_book_build(forks: ForkServer, args: list[str], src: Path) -> subprocess.CompletedProcess | None:
    """``build_book``'s command forked from ``forks`` (None where it declines): its output gathered in a file."""
    with tempfile.TemporaryFile("w+") as output, open(os.devnull) as devnull:
        proc = forks.start(["-m", "diffeqformer.pipeline", JUPYTER_BOOK, *args], forks.env, src,
                           (devnull.fileno(), output.fileno(), output.fileno()))
        if proc is None:
            return None
        code = proc.wait()
        output.seek(0)
        return subprocess.CompletedProcess(args, code, output.read(), "")


def _swap_in(new: Path, dest: Path) -> None:
    """Replace ``dest`` by ``new`` (same file system): the old one is removed only once the new one is in place."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    for stale in dest.parent.glob(f".{dest.name}.old-*"):  # left by a pipeline killed between the two renames
        shutil.rmtree(stale, ignore_errors=True)
    old = dest.with_name(f".{dest.name}.old-{os.getpid()}")
    if dest.exists():
        os.replace(dest, old)
    os.replace(new, dest)
    shutil.rmtree(old, ignore_errors=True)


def _prune_cache(state: dict) -> None:
    keep = {f"{nb}-{key}" for entry in state.get("presets", {}).values()
            for nb, key in entry.get("notebooks", {}).items()}
    for entry in cache_dir().glob("*") if cache_dir().exists() else []:
        if entry.name not in keep:
            shutil.rmtree(entry, ignore_errors=True)


def _remove_stale_staging() -> None:
    """Staging folders of pipelines that were killed (their process is gone)."""
    for folder in work_dir().glob("staging-*"):
        try:
            os.kill(int(folder.name.split("-", 1)[1]), 0)
        except ProcessLookupError:
            shutil.rmtree(folder, ignore_errors=True)
        except (ValueError, PermissionError):
            pass


def _estimate(result: Plan, costs: Costs, preset: str, lanes: int, build: bool,
              force: bool) -> list[tuple[str, float | None | Callable[[], float]]]:
    """The pipeline's steps with the seconds each is expected to take (``costs``; None where nothing measured here
    prices it yet): the trainings and the notebooks, each for its share of the lanes' wall-clock time (a population's
    members share its time too), then the book. While the lanes work, their schedule played forward replaces the
    shares (``lanes.train_runs``)."""
    share: dict[int, float | None] = {}
    for unit in training_units(result.trainings):  # runs trained side by side: each counts for its share of the time
        seconds = costs.unit_seconds(unit)
        share.update({id(t): None if seconds is None else seconds / len(unit) / lanes for t in unit})
    steps = [(f"train {t.config}", share.get(id(t), 0.0)) for t in result.trainings]
    alone = runs_alone(preset)
    for job in result.notebooks:  # and so do notebooks, but those that run alone
        cached = job.cached and not force
        steps.append((f"execute {job.name}",
                      0.0 if cached else costs.notebook_seconds(job) / (1 if job.name in alone else lanes)))
    steps.append(("build the book", costs.book_seconds if build else 0.0))  # asked again as notebooks are measured
    return steps


def _set_aside_stale_runs(result: Plan, stream) -> None:
    """Move each run directory that holds another configuration's run (``--retrain-stale``) to ``runs/.stale/``."""
    for t in result.trainings:
        if t.stale:
            aside = t.run_dir.parent / ".stale" / f"{t.run_dir.name}-{t.stale}"
            aside.parent.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(aside, ignore_errors=True)
            os.replace(t.run_dir, aside)
            print(f"moved {t.run_dir} (a run of another configuration) to {aside}", file=stream, flush=True)


def _train_and_execute(result: Plan, preset: str, progress: Progress, state: dict, staging: Path,
                       to_execute: list, lanes: int, force: bool, costs: Costs, forks: ForkServer | None) -> None:
    """Step 1: the trainings, and each notebook as soon as the runs it reads are complete; what was measured enters
    ``state`` even if a run or a notebook failed."""
    work = work_dir()
    for i, t in enumerate(result.trainings):
        if t.done:
            progress.end(i, progress.begin(i, f"train {t.config}"), "(complete, not retrained)")
    for i, job in enumerate(result.notebooks):
        if job.cached and not force:
            progress.end(len(result.trainings) + i, progress.begin(len(result.trainings) + i,
                                                                   f"execute {job.name}"), "(cached)")
    seconds: dict[str, float] = {}
    notebook_log = work / "logs" / f"notebooks-{preset}.log"
    try:
        train_runs(result.trainings, progress, 0, work / "logs" / f"train-{preset}.log", lanes,
                   notebooks=to_execute, execute=lambda job: execute_notebook(job, staging, notebook_log, forks),
                   seconds=seconds, alone=runs_alone(preset), costs=costs)
    finally:  # what was measured, even if a run or a notebook failed
        state["seconds"].update({k if k.startswith("notebook:") else f"train:{k}": v for k, v in seconds.items()})
        save_state(state)
    for t in result.trainings:
        t.done = True  # train_runs checked each complete.json


def _check_figures_unique(result: Plan) -> None:
    """Step 2: no figure saved by two notebooks."""
    seen_figures: dict[str, str] = {}
    for job in result.notebooks:
        for name in check_figures(job.cache_dir / "figures", job.name):
            if name in seen_figures:
                raise PipelineError(f"figure {name!r} is saved by both {seen_figures[name]} and {job.name}")
            seen_figures[name] = job.name


def _stage(result: Plan, state: dict, staging: Path, toc: Path | None) -> tuple[Path, Path]:
    """Step 3: the book's sources staged in ``staging/src`` (chapters, the executed notebooks as the reader sees them,
    the GPU edition, the generated pages) and the figures gathered in ``staging/figures``."""
    src, figures_new = staging / "src", staging / "figures"
    (src / "notebooks").mkdir(parents=True)
    figures_new.mkdir()
    _copy_book_sources(src, toc)
    for job in result.notebooks:  # as the reader sees them: code behind toggles (book.reader_view)
        book.write_reader_view(job.cache_dir / "notebook.ipynb", src / "notebooks" / f"{job.name}.ipynb")
        for f in (job.cache_dir / "figures").iterdir():
            shutil.copy(f, figures_new / f.name)
    edition.stage(src)
    generated = src / "book" / "_generated"
    generated.mkdir(parents=True, exist_ok=True)
    for name, text in generated_pages(result, state).items():
        (generated / name).write_text(text)
    return src, figures_new


def _build_step(src: Path, staging: Path, state: dict, progress: Progress, step: int, build: bool,
                force: bool, costs: Costs | None = None, forks: ForkServer | None = None) -> str | None:
    """Step 4: the book, unless ``--no-book`` or nothing it shows has changed; returns its key if it was rebuilt."""
    started = progress.begin(step, "build the book (jupyter-book, warnings as errors)")
    book_key = sha(_tree_hash(src), package_hash())
    if not build:
        progress.end(step, started, "(skipped: --no-book)")
    elif not force and state.get("html_key") == book_key and (html_dir() / "index.html").exists():
        progress.end(step, started, "(cached: nothing it shows has changed)")
    else:
        build_book(src, staging / "out", forks)
        state["seconds"]["book"] = progress.end(step, started)
        if costs is not None:
            costs.book_done(state["seconds"]["book"])
        return book_key
    return None


def _move_into_place(result: Plan, state: dict, preset: str, staging: Path, figures_new: Path,
                     book_key: str | None, t0: float) -> None:
    """Step 5: the figures and, if rebuilt, the book into place, all or nothing; the preset's record into the
    state; cache entries no preset records any more removed."""
    _swap_in(figures_new, paths.FIGURES)
    if book_key is not None:
        _swap_in(staging / "out" / "_build" / "html", html_dir())
        state["html_key"] = book_key
    state.setdefault("presets", {})[preset] = {
        "trainings": {t.config: str(t.run_dir) for t in result.trainings},
        "notebooks": {j.name: j.key for j in result.notebooks},
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "wall_s": time.time() - t0}
    state["current"] = preset
    save_state(state)
    _prune_cache(state)


def run(preset: str, overrides: Mapping[str, Mapping[str, Any]] | None = None, *, force: bool = False,
        build: bool = True, stream=None, **plan_options) -> Plan:
    """Validate, train, execute, build and move the results into place (see the module docstring).

    ``plan_options``: ``retrain_stale`` (see ``plan``); ``registry``, ``notebooks_dir``, ``toc`` replace the
    project's own, for tests."""
    stream = stream or sys.stdout
    t0 = time.time()
    # for every process started from here on: training workers, notebook kernels and theirs, the book's build
    os.environ["GLIBC_TUNABLES"] = keep_heap(os.environ.get("GLIBC_TUNABLES"))
    share_device(os.environ)
    result = plan(preset, overrides, **plan_options)
    _remove_stale_staging()
    state = load_state()
    state.setdefault("seconds", {})  # step -> seconds, last measured here (timings page)
    # what each piece of work took here (the time left), on disk as soon as measured
    costs = Costs(preset, state.setdefault("timings", {}), save=lambda: save_state(state))
    to_execute = [(len(result.trainings) + i, job) for i, job in enumerate(result.notebooks)
                  if force or not job.cached]
    lanes = max(1, min(TRAIN_LANES, sum(not t.done for t in result.trainings) + len(to_execute)))
    steps = _estimate(result, costs, preset, lanes, build, force)
    progress = Progress(steps, stream)
    print(f"pipeline --preset {preset}: {len(result.trainings)} runs "
          f"({sum(not t.done for t in result.trainings)} to train), {len(result.notebooks)} notebooks "
          f"({len(to_execute)} to execute), then the book; output below {paths.HOME}", file=stream, flush=True)

    staging = work_dir() / f"staging-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    # the notebooks' processes (and the book's build) are forked from one process that imports their libraries
    # while the runs train (diffeqformer.forks)
    forks = fork_server(work_dir() / "logs" / f"notebooks-{preset}.log") if to_execute else None
    try:
        _set_aside_stale_runs(result, stream)
        _train_and_execute(result, preset, progress, state, staging, to_execute, lanes, force, costs, forks)
        _check_figures_unique(result)
        src, figures_new = _stage(result, state, staging, plan_options.get("toc"))
        book_key = _build_step(src, staging, state, progress, len(steps) - 1, build, force, costs, forks)
        _move_into_place(result, state, preset, staging, figures_new, book_key, t0)
    finally:
        if forks is not None:
            forks.close()
        shutil.rmtree(staging, ignore_errors=True)
    print(f"pipeline --preset {preset}: finished in {Progress.fmt(time.time() - t0)}; figures in {paths.FIGURES}"
          + (f", book in {html_dir() / 'index.html'}" if build else ""), file=stream, flush=True)
    return result


def _cluster_arguments(group) -> None:
    defaults = cluster.Slurm()
    group.add_argument("--slurm", action="store_true", help="submit the trainings to SLURM (one sbatch job each, in "
                       "dependency order), then a job that runs this pipeline again for the notebooks and the book")
    group.add_argument("--nodes", type=int, default=defaults.nodes, help="nodes per training (default %(default)s)")
    group.add_argument("--gpus-per-node", type=int, default=defaults.gpus_per_node,
                       help="GPUs per node, one process each (default %(default)s)")
    group.add_argument("--time", default=defaults.time, help="each job's time limit (default %(default)s)")
    group.add_argument("--partition", help="the SLURM partition")
    group.add_argument("--sbatch-option", dest="sbatch_options", action="append", default=[], metavar="OPTION",
                       help="another sbatch option for every job, e.g. --sbatch-option=--account=abc; repeatable")


def _submit_to_slurm(args, overrides) -> None:
    """``--slurm``: plan, move stale runs aside (``--retrain-stale``), submit (``cluster.submit``); the last job runs
    this command again without ``--slurm``."""
    result = plan(args.preset, overrides, retrain_stale=args.retrain_stale)
    _set_aside_stale_runs(result, sys.stdout)
    then = ["-m", "diffeqformer.pipeline", "--preset", args.preset, *(f"--set={item}" for item in args.overrides),
            *(["--force"] if args.force else []), *(["--no-book"] if args.no_book else [])]
    slurm = cluster.Slurm(args.nodes, args.gpus_per_node, args.time, args.partition, tuple(args.sbatch_options))
    cluster.submit(result, slurm, then)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--train-worker"]:
        train_worker()
        return
    if argv[:1] == [JUPYTER_BOOK]:
        from jupyter_book.cli.main import main as jupyter_book

        jupyter_book(argv[1:], prog_name="jupyter-book")
        return
    description = sys.modules[__package__].__doc__.split("\n\n")[1]
    parser = argparse.ArgumentParser(prog="python -m diffeqformer.pipeline", description=description,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", required=True, help=f"one of: {', '.join(presets())}")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="NOTEBOOK.PARAM=VALUE",
                        help="override one parameter of one notebook (YAML value); repeatable")
    parser.add_argument("--force", action="store_true", help="execute every notebook and build the book again")
    parser.add_argument("--no-book", action="store_true", help="train and execute, but do not build the book")
    parser.add_argument("--plan", action="store_true", help="validate and print what would run; run nothing")
    parser.add_argument("--retrain-stale", action="store_true",
                        help="move a run directory that holds another configuration's run to runs/.stale/ and "
                             "train it again (without it, such a directory stops the pipeline before it starts)")
    _cluster_arguments(parser.add_argument_group("on a SLURM cluster (pipeline.cluster)"))
    args = parser.parse_args(argv)
    try:
        overrides = parse_overrides(args.overrides)
        if args.slurm:
            _submit_to_slurm(args, overrides)
            return
        if args.plan:
            p = plan(args.preset, overrides, retrain_stale=args.retrain_stale)
            for t in p.trainings:
                state = "complete" if t.done else "to train" + (" (its stale run to be moved aside)" if t.stale else "")
                print(f"train    {t.config:40s} {state}  {t.run_dir}")
            for j in p.notebooks:
                print(f"notebook {j.name:40s} {'cached' if j.cached else 'to execute'}  {json.dumps(j.parameters)}")
            return
        run(args.preset, overrides, force=args.force, build=not args.no_book, retrain_stale=args.retrain_stale)
    except PipelineError as err:
        raise SystemExit(f"error: {err}") from None
