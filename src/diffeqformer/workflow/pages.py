"""The book job, ``python -m diffeqformer.workflow.pages --preset P --output RECORD``: the book's sources staged (the
chapters, the executed notebooks as the reader sees them, the GPU edition, the pages written here below
``book/_generated/``), built by Jupyter Book with warnings as errors, the notebooks' figures gathered; then both
renamed into the preset's folder."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Mapping

from .. import paths
from .._autodoc import LAYERS
from ..config import FinetuneConfig
from ..report import accelerators, book as report, verdicts
from ..runs import is_complete, summary
from . import edition, presets as registry
from .edition import clock
from .jobs import check_figures, swap_in
from .plan import benchmark_seconds, collect_runs, folder, join_populations, load, module_files
from .presets import Run


def generated_pages(plan: Mapping[str, Any], judged: Mapping[str, tuple | None]) -> dict[str, str]:
    """The pages for ``plan``'s preset, whose verdicts are ``judged`` (``verdicts.holm_verdicts``); only numbers that
    stay the same when nothing is re-run enter them, so that a book with nothing new to show is not rebuilt."""
    paper, preset = collect_runs(list(registry.preset("paper").values())), plan["preset"]
    return {"timings.md": timings_markdown(plan), "presets.md": presets_markdown(), "api.md": api_markdown(),
            "gpu.md": accelerators.gpu_markdown(), "gpu_edition.md": gpu_edition_markdown(),
            "verdicts.md": verdicts.verdicts_markdown(preset, judged, edition.glued_notebooks(), edition.STAGED),
            "claims.md": verdicts.claims_markdown(), "cluster.md": accelerators.cost_markdown(paper, "paper"),
            "bottom_line.md": verdicts.bottom_line_markdown(preset, judged)}


NO_EDITION = """No GPU edition exists yet: no model of this book has been trained on a GPU, and this part shows no
result until one has been (how one is made: below). The pages of the other parts are the cpu preset's (CI builds the
smoke preset's).
"""


def gpu_edition_markdown(folder: Path | None = None) -> str:
    """The GPU edition's first page: ``NO_EDITION`` where none is committed, else its banner, its pages with each
    notebook's execution time, and its runs (from their ``complete.json``)."""
    folder = Path(folder or edition.EDITION)
    if (manifest := edition.load(folder)) is None:
        return NO_EDITION
    out = [edition.banner(manifest), f"{len(manifest['files'])} files, installed by `python -m "
           "diffeqformer.workflow.edition import` from what the GPU machine packed (`manifest.json` of "
           f"`{folder.relative_to(paths.REPO) if folder.is_relative_to(paths.REPO) else folder}` lists them with "
           "their SHA-256).", "", "| page | executed in |", "|---|---|"]
    for nb in edition.edition_notebooks(folder):
        record = folder / "records" / f"{nb}.json"
        took = clock(json.loads(record.read_text())["seconds"]) if record.exists() else "not recorded"
        out.append(f"| {{doc}}`/{edition.STAGED}/{nb}` | {took} |")
    out += ["", "| run | steps | validation perplexity | tokens/s | in the trainer | JAX on |",
            "|---|---|---|---|---|---|"]
    for complete in sorted(folder.glob("runs/*/complete.json")):
        done = json.loads(complete.read_text())
        ppl, speed = done.get("final_eval_perplexity"), done.get("tokens_per_second")
        out.append(f"| `{complete.parent.name}` | {done.get('steps')} | {f'{ppl:.2f}' if ppl else 'n/a'} "
                   f"| {f'{speed:,.0f}' if speed else 'n/a'} | {clock(done.get('wall_time_s') or 0)} "
                   f"| {done.get('jax_backend', '?')} |")
    return "\n".join(out) + "\n"


def timings_markdown(plan: Mapping[str, Any]) -> str:
    """The times measured here for ``plan``'s preset: each training job (Snakemake's benchmark) beside the trainer's
    own time (``complete.json``), and each notebook's execution (its record)."""
    lines = ["| step | job | of which in the trainer | measured on |", "|---|---|---|---|"]
    machine, work = f"{platform.machine()}, {os.cpu_count()} cores", folder(plan["preset"])
    for unit in plan["trainings"]:
        bench, first = work / "benchmarks" / f"train-{unit['name']}.tsv", paths.HOME / unit["runs"][0]
        if bench.exists() and is_complete(first):
            done = summary(first)
            together = f", {len(unit['runs'])} seeds together" if len(unit["runs"]) > 1 else ""
            lines.append(f"| train `{unit['name']}` ({done.get('steps')} steps{together}) | "
                         f"{clock(benchmark_seconds(bench))} | {clock(done['wall_time_s'])} | {machine}, JAX on "
                         f"{done.get('jax_backend', '?')} |")
    for job in plan["notebooks"]:
        if (record := work / "records" / f"{job['name']}.json").exists():
            lines.append(f"| execute `{job['name']}` | {clock(json.loads(record.read_text())['seconds'])} | | "
                         f"{machine} |")
    return "\n".join(lines) + "\n"


def presets_markdown() -> str:
    """What each preset trains, with the scale read from the configs; then, once for the presets that share the list,
    which notebooks they execute (a column repeating it made the table wider than the page)."""
    lines = ["| preset | training configs | scale |", "|---|---|---|"]
    executing: dict[tuple[str, ...], list[str]] = {}
    for preset, entries in registry.presets().items():
        trained = collect_runs(list(join_populations(entries).values()))  # a population's member counts once
        configs: dict[str, str] = {}  # config file -> the module that trains it
        for r in trained:
            configs.setdefault(r.config, r.module)
        scale = "; ".join(dict.fromkeys(config_scale(Run(c, module=module)) for c, module in configs.items()))
        lines.append(f"| `{preset}` | {len({r.key for r in trained})} runs of {', '.join(f'`{c}`' for c in configs)} "
                     f"| {scale} |")
        executing.setdefault(tuple(entries), []).append(preset)
    lines.append("")
    for notebooks, presets in executing.items():
        names = [f"`{p}`" for p in presets]
        who = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
        count = f"{len(notebooks)} notebook{'' if len(notebooks) == 1 else 's'}"
        lines += [f"{who} {'executes' if len(names) == 1 else 'execute'} {count}, in this order: "
                  f"{', '.join(f'`{nb}`' for nb in notebooks)}.", ""]
    return "\n".join(lines)


def config_scale(run: Run) -> str:
    """A config file's scale, from its typed configuration without overrides: ``64-d, 6 layers or steps, seq 64, 250
    steps of 16 on shakespeare``; a fine-tuning's model is its pretraining's, so its training alone."""
    c = dataclasses.replace(run, overrides=()).load()
    t = c.trainer
    if isinstance(c, FinetuneConfig):
        return f"fine-tuning for {t.num_train_steps} steps of {t.train_batch_size}"
    return (f"{c.model.hidden_dim}-d, {c.model.num_layers} layers or steps, seq {c.model.max_seq_len}, "
            f"{t.num_train_steps} steps of {t.train_batch_size} on {c.data.dataset}")


def api_markdown() -> str:
    """One autodoc section per module of the package, in the order data flows through them (``_autodoc.LAYERS``; a
    module not placed there last); a subpackage's section, its docstring, opens before its first module."""
    order = {f"diffeqformer.{m}": i for i, m in enumerate(m for layer in LAYERS for m in layer)}

    def place(item):
        name, f = item
        if f.name == "__init__.py":
            return min([i for m, i in order.items() if m.startswith(name + ".")] or [len(order)]), 0, name
        return order.get(name, len(order)), 1, name

    out = []
    for name, f in sorted(module_files().items(), key=place):
        if name != "diffeqformer" and not any(part.startswith("_") for part in name.split(".")):
            members = [] if f.name == "__init__.py" else ["   :members:"]
            out += [f"## `{name}`", "", "```{eval-rst}", f".. automodule:: {name}", *members, "```", ""]
    return "\n".join(out)


def stage(preset: str, src: Path, figures: Path) -> None:
    """The book's sources in ``src`` and every notebook's figures in ``figures`` (no figure saved by two notebooks)."""
    work, made = folder(preset), load(preset)
    for name in ("_config.yml", "_toc.yml"):
        shutil.copy(paths.REPO / name, src / name)
    shutil.copytree(paths.BOOK, src / "book", ignore=lambda where, names: [
        n for n in names if n in ("_generated", "_build") or (Path(where) == paths.BOOK and (
            n == edition.EDITION.name or n.startswith(f".{edition.EDITION.name}.")))])
    (src / "notebooks").mkdir()
    figures.mkdir()
    saved_by: dict[str, str] = {}
    executed = {job["name"]: json.loads((work / "notebooks" / f"{job['name']}.ipynb").read_text())
                for job in made["notebooks"]}
    here = {nb: report.glued(notebook) for nb, notebook in executed.items()}
    judged = verdicts.holm_verdicts(here)
    for nb, notebook in executed.items():
        view = report.reader_view(notebook, verdicts.opening_markdown(nb, judged, preset))
        (src / "notebooks" / f"{nb}.ipynb").write_text(json.dumps(view, indent=1, ensure_ascii=False) + "\n")
        for name in check_figures(work / "notebook-figures" / nb, nb):
            if name in saved_by:
                raise SystemExit(f"error: figure {name!r} is saved by both {saved_by[name]} and {nb}")
            saved_by[name] = nb
        for f in (work / "notebook-figures" / nb).iterdir():
            shutil.copy(f, figures / f.name)
    edition.stage(src)
    (src / "book" / "_generated").mkdir(parents=True, exist_ok=True)
    for name, text in generated_pages(made, judged).items():
        (src / "book" / "_generated" / name).write_text(text)


def jupyter_book(src: Path, out: Path) -> None:
    """``jupyter-book build`` with warnings as errors, nitpicky, into ``out``; a failed build stops the job with each
    warning and the lines after it (an autodoc import error's traceback)."""
    exe = Path(sys.executable).with_name("jupyter-book")
    args = ["build", str(src), "--path-output", str(out), "--warningiserror", "--nitpick", "--keep-going", "--quiet"]
    proc = subprocess.run([str(exe) if exe.exists() else "jupyter-book", *args], capture_output=True, text=True,
                          cwd=src)
    if proc.returncode != 0:
        text = (proc.stdout + proc.stderr).strip().splitlines()
        starts = [i for i, line in enumerate(text) if "WARNING" in line or "ERROR" in line]
        shown = []
        for i, end in zip(starts, [*starts[1:], len(text)]):
            block = text[i:end]
            shown += block if len(block) <= 25 else block[:20] + ["    ..."] + block[-5:]
        raise SystemExit("error: the book build failed:\n" + "\n".join((shown or text)[-80:]))


def build(preset: str, output: Path) -> None:
    """Stage and build the book, rename it and the figures into the preset's folder (``html/``, ``figures/``), and
    write the job's record, ``output``."""
    work, start = folder(preset), time.time()
    with tempfile.TemporaryDirectory(prefix=".book-", dir=work) as staging:
        staging = Path(staging)
        (staging / "src").mkdir()
        stage(preset, staging / "src", staging / "figures")
        jupyter_book(staging / "src", staging / "out")
        swap_in(staging / "out" / "_build" / "html", work / "html")
        swap_in(staging / "figures", work / "figures")
    paths.write_atomic(output, json.dumps({"preset": preset, "seconds": time.time() - start}) + "\n")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m diffeqformer.workflow.pages", description=__doc__.split("\n")[0])
    parser.add_argument("--preset", required=True)
    parser.add_argument("--output", required=True, type=Path)
    args = parser.parse_args()
    build(args.preset, args.output)
