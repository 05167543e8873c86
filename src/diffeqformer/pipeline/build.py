"""``run``: plan, train, execute, stage and build the book, and move the results into place; ``main``, the command."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Mapping

from .. import paths
from ..finetune import FinetuneConfig
from ..report import book
from ..runs import is_complete, summary
from .lanes import DEFAULT_SECONDS, TRAIN_LANES, Progress, load_state, runs_alone, save_state, train_runs, train_worker
from .notebooks import check_figures, execute_notebook
from .planning import (PipelineError, Plan, cache_dir, collect_runs, html_dir, join_populations, parse_overrides, plan,
                       work_dir)
from .processes import keep_heap
from .registry import PRESETS, Run
from .sources import LAYERS, module_files, package_hash, sha

BOOK_FILES = ("_config.yml", "_toc.yml")


def _copy_book_sources(src: Path, toc: Path | None = None) -> None:
    for name in BOOK_FILES:
        shutil.copy(paths.REPO / name, src / name)
    if toc is not None:
        shutil.copy(toc, src / "_toc.yml")
    shutil.copytree(paths.BOOK, src / "book", ignore=shutil.ignore_patterns("_generated", "_build"))


def generated_pages(result: Plan, state: dict) -> dict[str, str]:
    """Pages the pipeline writes into the book (below ``book/_generated/``): measured timings, the presets'
    contents, the API reference's module list. Only numbers that stay the same when nothing is re-run enter them,
    so a cached run rebuilds nothing."""
    return {"timings.md": timings_markdown(result, state), "presets.md": presets_markdown(),
            "api.md": api_markdown(), "gpu.md": gpu_markdown()}


GPU_RESULTS = paths.REPO / "benchmarks" / "results"
"""``benchmarks/gpu/measure.py``'s JSON files (``gpu-*.json``), committed from the machines they were measured on."""


def gpu_markdown(folder: Path = GPU_RESULTS) -> str:
    """The accelerator measurements of ``folder`` as tables, read from their JSON (no number typed by hand): per
    file, each DiffEqFormer / GPT-2 pair's parameters, tokens/s, their ratio, model FLOP utilisation and peak
    memory; then DiffEqFormer at each time-embedding size measured (the first pair's model, whose own d_t is in the
    pair's row)."""
    files = sorted(folder.glob("gpu-*.json"))
    if not files:
        return "No accelerator measurements are committed yet (`benchmarks/gpu/measure.py` makes them).\n"

    def row(size, name, m, ratio=""):
        mfu = f"{m['mfu']:.1%}" if m.get("mfu") is not None else "n/a"
        peak = f"{m['peak_memory_gib']:.2f}" if m.get("peak_memory_gib") is not None else "n/a"
        return (f"| {size} | {name} | {m['time_embed_dim'] or ''} | {m['params'] / 1e6:.0f}M "
                f"| {m['tokens_per_second']:,.0f} | {ratio} | {mfu} | {peak} |")

    out = []
    for file in files:
        r = json.loads(file.read_text())
        if r.get("ladder"):
            out += ladder_markdown(r, file)
            continue
        batch = {m["batch"] for p in r["pairs"] for m in (p["diffeqformer"], p["gpt2"])}
        sizes = {p["pair"]: p["diffeqformer"] for p in r["pairs"]}
        shapes = "; ".join(f"{name}: {m['layers']} x {m['hidden']}, seq {m['seq']}" for name, m in sizes.items())
        out += [f"**{r['device']}**, {r['date']}, JAX {r['jax']}, batches of {', '.join(map(str, sorted(batch)))} "
                f"sequences ({shapes}), bfloat16 matrix-product peak measured at {r['peak_tflops']:.0f} TFLOP/s "
                f"(`{file.relative_to(paths.REPO) if file.is_relative_to(paths.REPO) else file}`):", "",
                "| size | model | d_t | parameters | tokens/s | ratio to GPT-2 | MFU | peak GiB |",
                "|---|---|---|---|---|---|---|---|"]
        for p in r["pairs"]:
            out.append(row(p["pair"], "DiffEqFormer", p["diffeqformer"], f"{p['ratio']:.3f}"))
            out.append(row(p["pair"], "GPT-2", p["gpt2"]))
        for m in r.get("time_embed_dim", []):
            out.append(row(r["pairs"][0]["pair"], "DiffEqFormer", m))
        out += ["", gpu_summary(r), ""]
    return "\n".join(out) + "\n"


def ladder_markdown(r: Mapping[str, Any], file: Path) -> list[str]:
    """A ``measure.py --ladder`` result as a table: per pair, each row's levers (cumulative) with both models'
    tokens/s, model FLOP utilisation and peak memory, the ratio, and each model's change from the pair's first row;
    a row that failed shows its error's last line."""
    name = file.relative_to(paths.REPO) if file.is_relative_to(paths.REPO) else file
    out = [f"**{r['device']}**, {r['date']}, JAX {r['jax']}, the speed levers one on top of another "
           f"(`benchmarks/gpu/measure.py --ladder`), bfloat16 matrix-product peak measured at "
           f"{r['peak_tflops']:.0f} TFLOP/s (`{name}`):", "",
           "| size | levers | batch | vocabulary | DiffEqFormer tokens/s | MFU | peak GiB | GPT-2 tokens/s | MFU "
           "| peak GiB | ratio | change from the first row |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    first: dict[str, Mapping[str, Any]] = {}
    for e in r["ladder"]:
        if "error" in e:
            out.append(f"| {e['pair']} | {e['row']} | | | failed: {e['error'].strip().splitlines()[-1][:120]} "
                       "| | | | | | | |")
            continue
        ours, gpt = e["diffeqformer"], e["gpt2"]
        base = first.setdefault(e["pair"], e)
        change = (f"{ours['tokens_per_second'] / base['diffeqformer']['tokens_per_second'] - 1:+.0%} / "
                  f"{gpt['tokens_per_second'] / base['gpt2']['tokens_per_second'] - 1:+.0%}") if base is not e else ""
        cells = [f"{m['tokens_per_second']:,.0f} | {m['mfu']:.1%} | {m['peak_memory_gib']:.1f}" for m in (ours, gpt)]
        out.append(f"| {e['pair']} | {e['row']} | {ours['batch']} | {ours['vocab']:,} | {cells[0]} | {cells[1]} "
                   f"| {e['ratio']:.3f} | {change} |")
    return out + [""]


def gpu_summary(r: Mapping[str, Any]) -> str:
    """One sentence on a ``measure.py`` result: the DiffEqFormer / GPT-2 throughput ratios and the model FLOP
    utilisation measured, and, where several time-embedding sizes were measured, how parameters, peak memory and
    throughput grow from the smallest d_t to the largest (the paper's Figs. 15-16)."""
    ratios = [p["ratio"] for p in r["pairs"]]
    mfus = [m["mfu"] for p in r["pairs"] for m in (p["diffeqformer"], p["gpt2"]) if m.get("mfu") is not None]

    def span(values, fmt):
        low, high = format(min(values), fmt), format(max(values), fmt)
        return low if low == high else f"{low}-{high}"

    text = f"DiffEqFormer trains at {span(ratios, '.2f')} times GPT-2's tokens/s"
    if mfus:
        text += f", the models at {span(mfus, '.0%')} model FLOP utilisation"
    sweep = sorted([r["pairs"][0]["diffeqformer"], *r.get("time_embed_dim", [])], key=lambda m: m["time_embed_dim"])
    if len(sweep) > 1 and all(m.get("peak_memory_gib") for m in sweep):
        a, b = sweep[0], sweep[-1]
        text += (f". From d_t = {a['time_embed_dim']} to {b['time_embed_dim']} the parameters grow "
                 f"{b['params'] / a['params']:.1f} times, the peak memory {b['peak_memory_gib'] / a['peak_memory_gib']:.1f} "
                 f"times, and tokens/s change by {b['tokens_per_second'] / a['tokens_per_second'] - 1:+.0%}")
    return text + "."


def timings_markdown(result: Plan, state: dict) -> str:
    """A table of the times measured in this DIFFEQFORMER_HOME, for every preset built here: each training step of
    the pipeline (with the process start-up it paid) beside the trainer's own time (``complete.json``: compilation
    and training), and each notebook's execution. Only times that change when work is redone enter it, so a cached
    run produces the same page."""
    lines = ["| preset | step | pipeline step | of which in the trainer | measured on |", "|---|---|---|---|---|"]
    machine = f"{platform.machine()}, {os.cpu_count()} cores"
    seconds = state.get("seconds", {})
    presets = dict(state.get("presets", {}))
    presets[result.preset] = {"trainings": {t.config: str(t.run_dir) for t in result.trainings},
                              "notebooks": {j.name: j.key for j in result.notebooks}}
    for preset in [p for p in PRESETS if p in presets]:
        entry = presets[preset]
        for config, run_dir in entry.get("trainings", {}).items():
            if is_complete(run_dir):
                done = summary(run_dir)
                step = seconds.get(f"train:{config}")
                lines.append(f"| {preset} | train `{config}` ({done.get('steps')} steps) | "
                             f"{Progress.fmt(step) if step else '(trained outside the pipeline)'} | "
                             f"{Progress.fmt(done['wall_time_s'])} | "
                             f"{machine}, JAX on {done.get('jax_backend', '?')} |")
        for nb, key in entry.get("notebooks", {}).items():
            record = cache_dir() / f"{nb}-{key}" / "record.json"
            if record.exists():
                took = json.loads(record.read_text())["seconds"]
                lines.append(f"| {preset} | execute `{nb}` | {Progress.fmt(took)} | | {machine} |")
    return "\n".join(lines) + "\n"


def presets_markdown() -> str:
    """What each preset trains (with the scale, read from the configs), then which notebooks the presets execute: one
    sentence for the presets that share a list (all of them, since the table of contents and every preset must name
    the same notebooks), not a column that repeats it per preset (it made the table wider than the page, which cut
    the column off)."""
    lines = ["| preset | training configs | scale |", "|---|---|---|"]
    executing: dict[tuple[str, ...], list[str]] = {}  # notebook list -> the presets that execute it
    for preset, entries in PRESETS.items():
        trained: list[Run] = []  # as the pipeline trains them: a run that is a population's member counts once
        collect_runs(list(join_populations(entries).values()), trained)
        configs: dict[str, str] = {}  # config file -> the module that trains it
        for r in trained:
            configs.setdefault(r.config, r.module)
        scale = "; ".join(dict.fromkeys(config_scale(Run(c, module=module)) for c, module in configs.items()))
        count = len({r.key for r in trained})
        lines.append(f"| `{preset}` | {count} runs of {', '.join(f'`{c}`' for c in configs)} | {scale} |")
        executing.setdefault(tuple(entries), []).append(preset)
    lines.append("")
    for notebooks, presets in executing.items():
        names = [f"`{p}`" for p in presets]
        who = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
        count = f"{len(notebooks)} notebook{'' if len(notebooks) == 1 else 's'}"
        lines.append(f"{who} {'executes' if len(names) == 1 else 'execute'} {count}, in this order: "
                     f"{', '.join(f'`{nb}`' for nb in notebooks)}.")
        lines.append("")
    return "\n".join(lines)


def config_scale(run: Run) -> str:
    """The scale of a config file as the presets page states it, read from its typed configuration (defaults filled
    in, overrides left out): ``64-d, 6 layers or steps, seq 64, 250 steps of 16 on shakespeare``; a fine-tuning
    template's model is its pretraining's, so it states its training alone."""
    c = dataclasses.replace(run, overrides=()).load()
    t = c.trainer
    if isinstance(c, FinetuneConfig):
        return f"fine-tuning for {t.num_train_steps} steps of {t.train_batch_size}"
    m = c.model
    return (f"{m.hidden_dim}-d, {m.num_layers} layers or steps, seq {m.max_seq_len}, {t.num_train_steps} steps of "
            f"{t.train_batch_size} on {c.data.dataset}")


def api_markdown() -> str:
    """One autodoc section per module of the package (found on disk, so a new module appears by itself), in the order
    data flows through them (``sources.LAYERS``; a module not placed there comes last); a subpackage's own section
    shows its docstring, its modules their members."""
    order = {f"diffeqformer.{m}": i for i, m in enumerate(m for layer in LAYERS for m in layer)}

    def place(item):  # a subpackage's section opens it: before its first module
        name, f = item
        if f.name == "__init__.py":
            return min([i for m, i in order.items() if m.startswith(name + ".")] or [len(order)]), 0, name
        return order.get(name, len(order)), 1, name

    out = []
    for name, f in sorted(module_files().items(), key=place):
        if name == "diffeqformer" or any(part.startswith("_") for part in name.split(".")):
            continue
        members = [] if f.name == "__init__.py" else ["   :members:"]
        out += [f"## `{name}`", "", "```{eval-rst}", f".. automodule:: {name}", *members, "```", ""]
    return "\n".join(out)


def _tree_hash(root: Path) -> str:
    parts = []
    for f in sorted(p for p in root.rglob("*") if p.is_file()):
        parts += [str(f.relative_to(root)), f.read_bytes()]
    return sha(*parts)


def build_book(src: Path, out: Path) -> None:
    """``jupyter-book build`` with warnings as errors, nitpicky, into ``out``; the notebooks are not executed."""
    exe = Path(sys.executable).with_name("jupyter-book")
    cmd = [str(exe) if exe.exists() else "jupyter-book", "build", str(src), "--path-output", str(out),
           "--warningiserror", "--nitpick", "--keep-going", "--quiet"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=src)
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


def run(preset: str, overrides: Mapping[str, Mapping[str, Any]] | None = None, *, force: bool = False,
        build: bool = True, stream=None, **plan_options) -> Plan:
    """Validate, train, execute, build and move the results into place (see the module docstring).

    ``plan_options``: ``retrain_stale`` (see ``plan``); ``registry``, ``notebooks_dir``, ``toc`` replace the
    project's own, for tests."""
    stream = stream or sys.stdout
    t0 = time.time()
    # for every process started from here on: training workers, notebook kernels and theirs, the book's build
    os.environ["GLIBC_TUNABLES"] = keep_heap(os.environ.get("GLIBC_TUNABLES"))
    result = plan(preset, overrides, **plan_options)
    WORK, HTML = work_dir(), html_dir()
    _remove_stale_staging()
    state = load_state()
    measured = state.setdefault("seconds", {})  # step -> seconds, last measured here (estimates, timings page)
    guess = DEFAULT_SECONDS.get(preset, DEFAULT_SECONDS["cpu"])
    steps: list[tuple[str, float]] = []
    to_execute = [(len(result.trainings) + i, job) for i, job in enumerate(result.notebooks)
                  if force or not job.cached]
    lanes = max(1, min(TRAIN_LANES, sum(not t.done for t in result.trainings) + len(to_execute)))
    for t in result.trainings:  # runs trained side by side: each counts for its share of the wall-clock time
        steps.append((f"train {t.config}",
                       0.0 if t.done else measured.get(f"train:{t.config}", guess["train"]) / lanes))
    alone = runs_alone(preset)
    for job in result.notebooks:  # and so do notebooks, but those that run alone
        cached = job.cached and not force
        share = 1 if job.name in alone else lanes
        steps.append((f"execute {job.name}", 0.0 if cached else measured.get(f"notebook:{job.name}",
                                                                              guess["notebook"]) / share))
    steps.append(("build the book", measured.get("book", guess["book"]) if build else 0.0))
    progress = Progress(steps, stream)
    print(f"pipeline --preset {preset}: {len(result.trainings)} runs "
          f"({sum(not t.done for t in result.trainings)} to train), {len(result.notebooks)} notebooks "
          f"({len(to_execute)} to execute), then the book; output below {paths.HOME}", file=stream, flush=True)

    staging = WORK / f"staging-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        # 1. trainings, and each notebook as soon as the runs it reads are complete
        for t in result.trainings:
            if t.stale:
                aside = t.run_dir.parent / ".stale" / f"{t.run_dir.name}-{t.stale}"
                aside.parent.mkdir(parents=True, exist_ok=True)
                shutil.rmtree(aside, ignore_errors=True)
                os.replace(t.run_dir, aside)
                print(f"moved {t.run_dir} (a run of another configuration) to {aside}", file=stream, flush=True)
        for i, t in enumerate(result.trainings):
            if t.done:
                progress.end(i, progress.begin(i, f"train {t.config}"), "(complete, not retrained)")
        for i, job in enumerate(result.notebooks):
            if job.cached and not force:
                progress.end(len(result.trainings) + i, progress.begin(len(result.trainings) + i,
                                                                       f"execute {job.name}"), "(cached)")
        seconds: dict[str, float] = {}
        notebook_log = WORK / "logs" / f"notebooks-{preset}.log"
        try:
            train_runs(result.trainings, progress, 0, WORK / "logs" / f"train-{preset}.log", lanes,
                       notebooks=to_execute, execute=lambda job: execute_notebook(job, staging, notebook_log),
                       seconds=seconds, alone=alone)
        finally:  # what was measured, even if a run or a notebook failed
            measured.update({k if k.startswith("notebook:") else f"train:{k}": v for k, v in seconds.items()})
            save_state(state)
        for t in result.trainings:
            t.done = True  # train_runs checked each complete.json

        # 2. no figure saved twice
        seen_figures: dict[str, str] = {}
        for job in result.notebooks:
            for name in check_figures(job.cache_dir / "figures", job.name):
                if name in seen_figures:
                    raise PipelineError(f"figure {name!r} is saved by both {seen_figures[name]} and {job.name}")
                seen_figures[name] = job.name

        # 3. the book's sources, staged; the figures, gathered
        src, figures_new = staging / "src", staging / "figures"
        (src / "notebooks").mkdir(parents=True)
        figures_new.mkdir()
        _copy_book_sources(src, plan_options.get("toc"))
        for job in result.notebooks:  # as the reader sees them: code behind toggles (book.reader_view)
            book.write_reader_view(job.cache_dir / "notebook.ipynb", src / "notebooks" / f"{job.name}.ipynb")
            for f in (job.cache_dir / "figures").iterdir():
                shutil.copy(f, figures_new / f.name)
        generated = src / "book" / "_generated"
        generated.mkdir(parents=True, exist_ok=True)
        for name, text in generated_pages(result, state).items():
            (generated / name).write_text(text)

        # 4. the book
        i = len(steps) - 1
        started = progress.begin(i, "build the book (jupyter-book, warnings as errors)")
        book_key = sha(_tree_hash(src), package_hash())
        rebuilt = False
        if not build:
            progress.end(i, started, "(skipped: --no-book)")
        elif not force and state.get("html_key") == book_key and (HTML / "index.html").exists():
            progress.end(i, started, "(cached: nothing it shows has changed)")
        else:
            build_book(src, staging / "out")
            measured["book"] = progress.end(i, started)
            rebuilt = True

        # 5. into place, all or nothing
        _swap_in(figures_new, paths.FIGURES)
        if rebuilt:
            _swap_in(staging / "out" / "_build" / "html", HTML)
            state["html_key"] = book_key
        state.setdefault("presets", {})[preset] = {
            "trainings": {t.config: str(t.run_dir) for t in result.trainings},
            "notebooks": {j.name: j.key for j in result.notebooks},
            "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "wall_s": time.time() - t0}
        state["seconds"] = measured
        state["current"] = preset
        save_state(state)
        _prune_cache(state)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    print(f"pipeline --preset {preset}: finished in {Progress.fmt(time.time() - t0)}; figures in {paths.FIGURES}"
          + (f", book in {HTML / 'index.html'}" if build else ""), file=stream, flush=True)
    return result


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--train-worker"]:
        train_worker()
        return
    description = sys.modules[__package__].__doc__.split("\n\n")[1]
    parser = argparse.ArgumentParser(prog="python -m diffeqformer.pipeline", description=description,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", required=True, help=f"one of: {', '.join(PRESETS)}")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="NOTEBOOK.PARAM=VALUE",
                        help="override one parameter of one notebook (YAML value); repeatable")
    parser.add_argument("--force", action="store_true", help="execute every notebook and build the book again")
    parser.add_argument("--no-book", action="store_true", help="train and execute, but do not build the book")
    parser.add_argument("--plan", action="store_true", help="validate and print what would run; run nothing")
    parser.add_argument("--retrain-stale", action="store_true",
                        help="move a run directory that holds another configuration's run to runs/.stale/ and "
                             "train it again (without it, such a directory stops the pipeline before it starts)")
    args = parser.parse_args(argv)
    try:
        overrides = parse_overrides(args.overrides)
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
