"""The pages the book job writes into the book (below ``book/_generated/``): measured timings, the presets'
contents, the verdicts, the accelerator measurements and their cost, the GPU edition's first page and the API
reference's module list (``build.book`` writes them, then builds the book)."""

from __future__ import annotations

import dataclasses
import json
import os
import platform
from pathlib import Path
from typing import Any, Mapping

from .. import paths
from .._autodoc import LAYERS
from ..config import FinetuneConfig
from ..report import accelerators, verdicts
from ..runs import is_complete, summary
from . import edition, presets as registry
from .edition import clock
from .plan import benchmark_seconds, collect_runs, folder, join_populations, module_files
from .presets import Run


def generated_pages(plan: Mapping[str, Any], here: Mapping[str, Mapping[str, str]]) -> dict[str, str]:
    """Pages the book job writes into the book (below ``book/_generated/``) for ``plan``'s preset, whose notebooks
    glued ``here`` (notebook -> its glued values). Only numbers that stay the same when nothing is re-run enter them,
    so that a book with nothing new to show is not rebuilt."""
    paper = collect_runs(list(registry.preset("paper").values()))
    return {"timings.md": timings_markdown(plan), "presets.md": presets_markdown(), "api.md": api_markdown(),
            "gpu.md": accelerators.gpu_markdown(), "gpu_edition.md": gpu_edition_markdown(),
            "verdicts.md": verdicts.verdicts_markdown(plan["preset"], here, edition.glued_notebooks(), edition.STAGED),
            "claims.md": verdicts.claims_markdown(), "cluster.md": accelerators.cost_markdown(paper, "paper"),
            "bottom_line.md": verdicts.bottom_line_markdown(plan["preset"], here)}


NO_EDITION = """No GPU edition exists yet: no model of this book has been trained on a GPU, and this part shows no
result until one has been. The pages of the other parts are the cpu preset's (CI builds the smoke preset's).

A GPU machine makes one: it trains every run of the `gpu` preset, executes every notebook and packs what these pages
need into an output folder (at most eight files of at most 16 MiB, no model weights). On a GPU machine with network:

```bash
pip install -e ".[gpu]" -c requirements.lock
snakemake -s workflow/Snakefile --cores all notebooks --config preset=gpu
python -m diffeqformer.workflow.edition pack --out <output folder>
```

On a GPU machine without network that has Python 3.12 and JAX 0.11.2, the wheels it lacks travel with the working
tree ({doc}`reproducing`, "On one GPU without network"):

```bash
bash benchmarks/gpu/prepare.sh --for pipeline       # on a machine with network: .gpu/part-1 and data/raw
DIFFEQFORMER_COMMIT=<sha> DIFFEQFORMER_EDITION=<output folder> bash benchmarks/gpu/run.sh stage install pipeline
```

Back here, with the output folder:

```bash
python -m diffeqformer.workflow.edition import <output folder>   # checks it, installs it in book/gpu/
make book
```

The import refuses a pack of another preset, or a corrupt one, in one line naming the problem, and leaves what is
committed as it was.
"""
"""The GPU edition's first page while none is committed: how to make one (``benchmarks/gpu/run.sh``)."""


def gpu_edition_markdown(folder: Path | None = None) -> str:
    """The GPU edition's first page: ``NO_EDITION`` where none is committed in ``folder`` (``edition.EDITION``),
    else its banner (``edition.banner``), its pages with the time each notebook's execution took, and its runs
    (steps, final validation perplexity, tokens/s and the trainer's wall time, from their ``complete.json``)."""
    folder = Path(folder or edition.EDITION)
    manifest = edition.load(folder)
    if manifest is None:
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
        ppl = done.get("final_eval_perplexity")
        speed = done.get("tokens_per_second")
        out.append(f"| `{complete.parent.name}` | {done.get('steps')} | {f'{ppl:.2f}' if ppl else 'n/a'} "
                   f"| {f'{speed:,.0f}' if speed else 'n/a'} | {clock(done.get('wall_time_s') or 0)} "
                   f"| {done.get('jax_backend', '?')} |")
    return "\n".join(out) + "\n"


def timings_markdown(plan: Mapping[str, Any]) -> str:
    """A table of the times measured in this DIFFEQFORMER_HOME for ``plan``'s preset: each training job (Snakemake's
    benchmark of it, with the process start-up it paid) beside the trainer's own time (``complete.json``:
    compilation and training), and each notebook's execution (its record)."""
    lines = ["| step | job | of which in the trainer | measured on |", "|---|---|---|---|"]
    machine = f"{platform.machine()}, {os.cpu_count()} cores"
    work = folder(plan["preset"])
    for unit in plan["trainings"]:
        bench = work / "benchmarks" / f"train-{unit['name']}.tsv"
        first = paths.HOME / unit["runs"][0]
        if not bench.exists() or not is_complete(first):
            continue
        took = benchmark_seconds(bench)
        done = summary(first)
        together = f", {len(unit['runs'])} seeds together" if len(unit["runs"]) > 1 else ""
        lines.append(f"| train `{unit['name']}` ({done.get('steps')} steps{together}) | {clock(took)} | "
                     f"{clock(done['wall_time_s'])} | {machine}, JAX on {done.get('jax_backend', '?')} |")
    for job in plan["notebooks"]:
        record = work / "records" / f"{job['name']}.json"
        if record.exists():
            lines.append(f"| execute `{job['name']}` | {clock(json.loads(record.read_text())['seconds'])} | | "
                         f"{machine} |")
    return "\n".join(lines) + "\n"


def presets_markdown() -> str:
    """What each preset trains (with the scale, read from the configs), then which notebooks the presets execute: one
    sentence for the presets that share a list (all of them, since the table of contents and every preset must name
    the same notebooks), not a column that repeats it per preset (it made the table wider than the page, which cut
    the column off)."""
    lines = ["| preset | training configs | scale |", "|---|---|---|"]
    executing: dict[tuple[str, ...], list[str]] = {}  # notebook list -> the presets that execute it
    for preset, entries in registry.presets().items():
        trained = collect_runs(list(join_populations(entries).values()))  # a population's member counts once
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
    data flows through them (``_autodoc.LAYERS``; a module not placed there comes last); a subpackage's own section
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
