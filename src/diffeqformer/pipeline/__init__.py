"""The figure pipeline: ``python -m diffeqformer.pipeline --preset smoke|cpu|gpu|paper``.

One command regenerates the book: it trains every run the preset's notebooks read (``diffeqformer.train`` skips a
run that is complete for the same configuration and resumes an interrupted one), executes each notebook with
Papermill and the preset's parameter values, and builds the Jupyter Book with warnings as errors.

**The registry** (``PRESETS`` in ``diffeqformer.pipeline.registry``) is the one place that says, per preset, which
notebooks run with which parameter values. A value ``Run("cpu/gpt2")`` stands for the run of
``config/cpu/gpt2.yaml``: the pipeline trains it and the notebook receives its run directory. Every notebook also
receives ``preset``. Adding a notebook is one entry per preset plus its line in ``_toc.yml``::

    "f4_polynomial": dict(seed=0, num_tokens=40),
    "f5_lyapunov": dict(run=Run("cpu/synthetic_diffeqformer"), ref_run=Run("cpu/diffeqformer")),
    "f10_hypernetwork": dict(runs=[Run("cpu/diffeqformer"), variant(
        "cpu/diffeqformer", "cpu-diffeqformer-shared-mlp", {"model.hypernet": "shared_mlp"})]),
    "f7_finetuning": dict(runs=finetune_runs("cpu")),  # fine-tunings: Run(..., module="finetune")

Runs are trained ``TRAIN_LANES`` (2) at a time in child processes of at most ``RUNS_PER_WORKER`` runs each, those with
the most training steps first (else in the order the registry first names them); a fine-tuning waits for its
pretraining. The same lanes execute the notebooks, each in a child process as soon as every run it reads is
finished (before any training that is still waiting), so the notebooks of the early runs are executed while later
runs train and no lane idles at the end; a notebook that measures the machine (``RUNS_ALONE``) runs last, alone
(except in the smoke preset: ``runs_alone``).

**Checks before anything runs.** An unknown preset, a notebook that is missing, has no cell tagged ``parameters``
or is not in ``_toc.yml`` (or the reverse), a Colab cell that clones another repository than ``_config.yml``'s
or is not tagged ``remove-cell`` (``diffeqformer.report.book``), a parameter the notebook does not declare (Papermill's
``inspect_notebook``), a value of the wrong type (against the parameter's annotation, ``name: int = 3``, else the
type of its default) and a training config that does not parse are all rejected with the offending name.

**Caching.** A notebook is executed again only when its key changes. The key hashes: the notebook's source (cell
types, sources and tags; not outputs), its resolved parameter values, the configuration hash of every run it reads,
the source of every module of the package the notebook imports, directly or through other modules, lazy imports
included (``sources.notebook_modules``: not the pipeline's own code, so that editing one registry entry re-executes
only the notebooks whose parameters changed) and the versions of the main libraries. Each execution is kept under
``_build/pipeline/cache/<notebook>-<key>/`` (executed notebook, its figures, its time), so switching presets back
and forth costs nothing twice. The book is rebuilt only when its staged sources (chapters, executed notebooks,
generated pages) or the package change.

**Atomic results.** Everything is produced in ``_build/pipeline/staging-<pid>/`` first. A failing notebook stops
the pipeline with the notebook's own error (its executed copy, with the error, is kept in
``_build/pipeline/failed/``); ``figures/`` and ``_build/html/`` are replaced only when every notebook and the book
build have succeeded. All of these live below ``DIFFEQFORMER_HOME`` (default: the repository).

**Modules**, each using only those before it: ``processes`` (what the child processes share; the Papermill child),
``registry`` (the presets), ``sources`` (cache keys), ``planning`` (checks and the plan), ``notebooks`` (executing one
notebook), ``progress`` (the progress line and its time left), ``lanes`` (the training processes), ``cluster`` (the
trainings handed to SLURM instead, ``--slurm``), ``cost`` (a preset's GPU hours and memory, for the cluster page),
``edition`` (the GPU edition: pack a gpu run's results on the GPU machine, import them here, render them), ``pages``
(the pages it writes into the book), ``build`` (``run``, the book, the command line). This ``__init__`` imports none
of them until one of its names is used.
"""

_NAMES = {
    "CPU_SEEDS": "registry", "INFERENCE_SWEEP": "registry", "NotebookJob": "planning", "PRESETS": "registry",
    "PipelineError": "planning", "Plan": "planning", "Progress": "progress", "RUNS_ALONE": "lanes",
    "RUNS_PER_WORKER": "lanes", "Run": "registry", "TRAIN_LANES": "lanes", "Training": "planning",
    "build_book": "build", "cache_dir": "planning", "check_figures": "notebooks", "check_outputs": "notebooks",
    "check_parameters": "planning", "execute_notebook": "notebooks", "finetune_runs": "registry",
    "html_dir": "planning", "main": "build", "parse_overrides": "planning", "plan": "planning", "run": "build",
    "seeded": "registry", "toc_notebooks": "planning", "train_runs": "lanes", "type_matches": "planning",
    "variant": "registry", "work_dir": "planning",
}
"""Public name -> the module of this package that defines it (imported on first use: ``__getattr__``)."""

__all__ = sorted(_NAMES)


def __getattr__(name: str):
    """A public name, or a module of this package, imported on first use (PEP 562): the Papermill child
    (``pipeline.processes``) starts without importing the registry, Levanter and JAX, which every other module of
    the pipeline needs (12 s here)."""
    import importlib
    import importlib.util

    if name in _NAMES:
        return getattr(importlib.import_module(f".{_NAMES[name]}", __name__), name)
    if not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
