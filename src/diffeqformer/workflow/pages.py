"""The pages the book job writes into the book (below ``book/_generated/``): measured timings, the presets'
contents, the accelerator measurements, the GPU edition's first page and the API reference's module list
(``build.run`` writes them, then builds the book)."""

from __future__ import annotations

import dataclasses
import json
import os
import platform
from pathlib import Path
from typing import Any, Mapping

from .. import paths
from ..config import FinetuneConfig
from ..runs import is_complete, summary
from . import cost, edition, presets as registry
from .edition import clock
from .plan import benchmark_seconds, collect_runs, folder, join_populations, module_files
from .presets import Run

LAYERS = [
    ["paths", "numerics", "_autodoc", "dispatch", "devices"],
    # diffeqformer.model: the model core, bottom up
    ["model.time_embedding", "model.temporal", "model.attention"],
    ["model.vector_field"],
    ["model.transformer"],
    ["model.baselines", "model.solve", "model"],
    # diffeqformer.data: the synthetic language (its data, no analysis), then the corpora, which serve it to Levanter
    ["data", "data.synthetic"],
    ["data.corpora"],
    ["data.tasks"],  # F11's downstream tasks from the corpus's held-out documents
    ["data.__main__"],
    ["config"],  # the typed configurations: load, parse overrides, validate, hash, dump
    ["runs"],  # the run directory: its files, lock and lifecycle; a finished run's summary, config, metrics, model
    ["train"],
    ["finetune"],
    ["population"],  # trains populations of training runs and of fine-tunings
    # diffeqformer.report: saving figures and tables with their provenance, captions, glue; the book's extension
    ["report", "report.figures", "report.book"],
    # diffeqformer.analysis: the verdict rule over seeds, the analyses, F5's benchmark over lyapunov's scores
    ["analysis", "analysis.seeds"],
    ["analysis.claims"],  # the headline claims, each with its one primary test, and their verdicts
    ["analysis.schematic", "analysis.spectra", "analysis.trajectories", "analysis.lyapunov", "analysis.inference",
     "analysis.perplexity", "analysis.ablations", "analysis.downstream"],
    ["analysis.attribution"],
    # diffeqformer.workflow: the presets as data, the plan Snakemake schedules, the jobs, the pages, the GPU edition
    ["workflow", "workflow.presets"], ["workflow.plan"], ["workflow.jobs", "workflow.edition", "workflow.cost"],
    ["workflow.pages"], ["workflow.build"],
]
"""The package's modules (below ``diffeqformer.``) in the order data flows through them, from the bottom up: a
module imports only modules of lower layers (``tests/test_layers.py`` checks it, and that every module is placed
here); the book's API page lists the modules in this order."""


def generated_pages(plan: Mapping[str, Any]) -> dict[str, str]:
    """Pages the book job writes into the book (below ``book/_generated/``): measured timings, the presets'
    contents, the accelerator measurements, the GPU edition's first page, the API reference's module list, the
    paper preset's cost on a cluster (``cost.cost_markdown``). Only numbers that stay the same when nothing is
    re-run enter them, so that a book with nothing new to show is not rebuilt."""
    return {"timings.md": timings_markdown(plan), "presets.md": presets_markdown(),
            "api.md": api_markdown(), "gpu.md": gpu_markdown(), "gpu_edition.md": gpu_edition_markdown(),
            "verdicts.md": verdicts_markdown(plan), "claims.md": claims_markdown(),
            "cluster.md": cost.cost_markdown()}


NO_GPU_VERDICT = "no GPU edition yet"


def verdicts_markdown(plan: Mapping[str, Any], gpu_folder: Path | None = None) -> str:
    """The book's headline verdicts as one table: per claim (``claims.CLAIMS``, its page linked), the paper's number
    where the paper gives one, the verdict of this build's preset (the notebooks just executed) and the GPU
    edition's (``edition.EDITION``, or ``NO_GPU_VERDICT``), each with its effect and 95% interval in the claim's
    units and its p adjusted by Holm's method across the claims tested in that build (``holm_verdicts``); under
    it, the primary test and the combining rule of each claim, a sentence each."""
    from ..analysis import claims, seeds
    from ..report.book import glued

    gpu_folder = Path(gpu_folder or edition.EDITION)
    executed = folder(plan["preset"]) / "notebooks"
    here = {job["name"]: glued(json.loads((executed / f"{job['name']}.ipynb").read_text()))
            for job in plan["notebooks"]}
    gpu = None
    if edition.load(gpu_folder) is not None:
        gpu = {nb: glued(json.loads((gpu_folder / "notebooks" / f"{nb}.ipynb").read_text()))
               for nb in edition.edition_notebooks(gpu_folder)}
    ours = holm_verdicts(here)
    theirs = holm_verdicts(gpu) if gpu is not None else {}
    tested = sum(v is not None and v[1] is not None for v in ours.values())
    out = [f"Each headline claim of the paper, judged by one primary test named before the numbers (listed under the "
           f"table), at the `{plan["preset"]}` preset this book was built with and in the GPU edition (`gpu` preset). "
           f"The verdicts: *reproduced* (significant in the paper's direction), *contradicted* (significant against "
           f"it), *inconclusive* (not significant: the interval and the smallest effect the design detects 80% of the "
           f"time say how much it could have missed), *untested*. The {tested} claims tested here are adjusted "
           f"together by Holm's method: a verdict is significant only when its adjusted p is below 0.05 (the "
           f"figure's page gives the unadjusted p). The rule: {seeds.RULE}.", "",
           f"| claim | the paper | `{plan["preset"]}` preset | GPU edition |", "|---|---|---|---|"]
    for claim in claims.CLAIMS.values():
        gpu_page = (f", {{doc}}`GPU </{edition.STAGED}/{claim.notebook}>`"
                    if gpu and claim.notebook in gpu else "")
        page = f"{claim.figure} ({{doc}}`page </notebooks/{claim.notebook}>`{gpu_page})"
        mine = _verdict_cell(ours.get(claim.name), "not computed by this preset")
        other = NO_GPU_VERDICT if gpu is None else _verdict_cell(theirs.get(claim.name), "not in the GPU edition")
        out.append(f"| {page}: {claim.paper} | {claim.paper_value or 'no number in the paper text'} | {mine} "
                   f"| {other} |")
    return "\n".join(out + ["", "How each claim is decided:", "", claims_markdown()])


def claims_markdown() -> str:
    """Every headline claim (``claims.CLAIMS``) with its one primary test and how the verdict follows from it, one
    item each: on the method page and under the verdicts page's table."""
    from ..analysis import claims

    return "\n".join(f"- **{c.figure}**, {c.paper}: {c.test}; {c.rule}." for c in claims.CLAIMS.values()) + "\n"


def holm_verdicts(notebooks: Mapping[str, Mapping[str, str]] | None) -> dict[str, tuple | None]:
    """Claim name -> (its ``claims.Verdict`` as glued by its notebook in ``notebooks`` (notebook -> glued values),
    its p adjusted by Holm's method across every claim tested there, or None for one without p), or None where the
    notebook glued none."""
    from ..analysis import claims, seeds

    found = {}
    for claim in claims.CLAIMS.values():
        text = (notebooks or {}).get(claim.notebook, {}).get(claim.glue_name)
        found[claim.name] = claims.Verdict.from_json(text) if text else None
    names = [n for n, v in found.items() if v is not None and v.word != seeds.UNTESTED and not v.of.measured]
    adjusted = dict(zip(names, seeds.holm([found[n].p for n in names])))
    return {n: (v, adjusted.get(n)) if v is not None else None for n, v in found.items()}


def _verdict_cell(found: tuple | None, missing: str) -> str:
    """One verdict in a table cell: the word after Holm's adjustment in bold, the effect with its interval, the
    unadjusted and adjusted p, and the smallest effect detected 80% of the time; a word that Holm's adjustment
    changed says what it was before."""
    from ..analysis import seeds

    if found is None:
        return missing
    verdict, adjusted = found
    if adjusted is None:
        return f"**{verdict.word}**" + (f": {verdict.effect_text()}" if verdict.word != seeds.UNTESTED else
                                        f" ({verdict.note})" if verdict.note else "")
    word = verdict.word
    # an equivalence claim is contradicted by its two-sided interval, not by its p (the TOST's): Holm leaves it
    holds = verdict.of.margin is not None and word == seeds.CONTRADICTED
    if word in (seeds.REPRODUCED, seeds.CONTRADICTED) and not holds and not adjusted < seeds.LEVEL:
        word = f"{seeds.INCONCLUSIVE} after Holm ({verdict.word} before)"
    negligible = ", negligible" if verdict.negligible else ""
    return (f"**{word}**{negligible}: {verdict.effect_text()}; p = {verdict.p:.2g}, Holm {adjusted:.2g}; "
            f"detectable: {verdict.detectable_text()}")


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
