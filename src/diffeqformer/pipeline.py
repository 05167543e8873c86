"""The figure pipeline: ``python -m diffeqformer.pipeline --preset smoke|cpu|gpu|paper``.

One command regenerates the book: it trains every run the preset's notebooks read (``diffeqformer.train`` skips a
run that is complete for the same configuration and resumes an interrupted one), executes each notebook with
Papermill and the preset's parameter values, and builds the Jupyter Book with warnings as errors.

**The registry** (``PRESETS``, below) is the one place that says, per preset, which notebooks run with which
parameter values. A value ``Run("cpu/gpt2")`` stands for the run of ``config/cpu/gpt2.yaml``: the pipeline trains it
and the notebook receives its run directory. Every notebook also receives ``preset``. Adding a notebook is one
entry per preset plus its line in ``_toc.yml``::

    "f4_polynomial": dict(seed=0, num_tokens=40),
    "f5_lyapunov": dict(run=Run("cpu/synthetic_diffeqformer"), ref_run=Run("cpu/diffeqformer")),
    "f10_hypernetwork": dict(runs=[Run("cpu/diffeqformer"), variant(
        "cpu/diffeqformer", "cpu-diffeqformer-shared-mlp", {"model.hypernet": "shared_mlp"})]),
    "f7_finetuning": dict(runs=finetune_runs("cpu")),  # fine-tunings: Run(..., module="finetune")

Runs are trained ``TRAIN_LANES`` (2) at a time in child processes of at most ``RUNS_PER_WORKER`` runs each, those with
the most training steps first (else in the order the registry first names them); a fine-tuning waits for its
pretraining. The same lanes execute the notebooks, each in a child process as soon as every run it reads is
finished (before any training that is still waiting), so the notebooks of the early runs are executed while later
runs train and no lane idles at the end; a notebook that measures the machine (``RUNS_ALONE``) runs last, alone.

**Checks before anything runs.** An unknown preset, a notebook that is missing, has no cell tagged ``parameters``
or is not in ``_toc.yml`` (or the reverse), a Colab cell that clones another repository than ``_config.yml``'s
or is not tagged ``remove-cell`` (``diffeqformer.book``), a parameter the notebook does not declare (Papermill's
``inspect_notebook``), a value of the wrong type (against the parameter's annotation, ``name: int = 3``, else the
type of its default) and a training config that does not parse are all rejected with the offending name.

**Caching.** A notebook is executed again only when its key changes. The key hashes: the notebook's source (cell
types, sources and tags; not outputs), its resolved parameter values, the configuration hash of every run it reads,
the source of the whole ``diffeqformer`` package (any change to it may change any figure: safe rather than clever)
and the versions of the main libraries. Each execution is kept under ``_build/pipeline/cache/<notebook>-<key>/``
(executed notebook, its figures, its time), so switching presets back and forth costs nothing twice. The book is
rebuilt only when its staged sources (chapters, executed notebooks, generated pages) or the package change.

**Atomic results.** Everything is produced in ``_build/pipeline/staging-<pid>/`` first. A failing notebook stops
the pipeline with the notebook's own error (its executed copy, with the error, is kept in
``_build/pipeline/failed/``); ``figures/`` and ``_build/html/`` are replaced only when every notebook and the book
build have succeeded. All of these live below ``DIFFEQFORMER_HOME`` (default: the repository).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import hashlib
import importlib.metadata
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from . import book, paths


@dataclass(frozen=True)
class Run:
    """The training run of ``config/<config>.yaml`` as a notebook parameter: the pipeline trains it (if needed) and
    passes the notebook its run directory.

    ``overrides`` are command-line overrides of the file (a variant of it: ``variant`` builds one, with its own run
    name); ``module`` is ``"train"`` or ``"finetune"`` (``diffeqformer.finetune``; the pipeline trains a fine-tuning's
    pretraining first when the registry lists it before the fine-tuning, as ``finetune_runs`` does)."""

    config: str
    """Path below ``config/`` without ``.yaml``, e.g. ``"cpu/gpt2"``."""
    overrides: tuple[str, ...] = ()
    """draccus-style overrides, e.g. ``("--name", "cpu-x-dt4", "--model.time_embed_dim", "4")``."""
    module: str = "train"
    population: tuple[int, ...] = ()
    """The trainer seeds of the population this run is a member of (``seeded(..., population=True)``): the
    pipeline trains the members together, as one vmapped model (``diffeqformer.population``)."""

    @property
    def path(self) -> Path:
        return paths.CONFIG / f"{self.config}.yaml"

    @property
    def key(self) -> str:
        """How the pipeline's records and messages name the run: the config, then its overrides (and the population
        it is trained in)."""
        key = " ".join((self.config, *self.overrides))
        return key + f" [population of seeds {', '.join(map(str, self.population))}]" if self.population else key

    @property
    def population_key(self) -> tuple:
        """What the members of one population share: the config, the overrides but name and seed, the seeds."""
        rest, i = [], 0
        while i < len(self.overrides):
            if self.overrides[i] in ("--name", "--trainer.seed"):
                i += 2
                continue
            rest.append(self.overrides[i])
            i += 1
        return self.config, tuple(rest), self.population

    def load(self):
        """The resolved configuration (``TrainConfig``, or ``FinetuneConfig`` for a fine-tuning)."""
        from .train import load_config

        if self.module == "finetune":
            from .finetune import FinetuneConfig

            return load_config(self.path, list(self.overrides), cls=FinetuneConfig)
        return load_config(self.path, list(self.overrides))

    def identity(self) -> tuple[Any, str, Path]:
        """(configuration, config hash, run directory); a fine-tuning's hash covers its pretraining's config hash,
        computed from the pretraining's config file, so it is known before the pretraining has run."""
        return self.resolve()[:3]

    def resolve(self) -> tuple[Any, str, Path, Path | None]:
        """``identity()`` and the run directory of a fine-tuning's pretraining (``None`` for other runs), from one
        reading of the config files."""
        from . import train

        cfg = self.load()
        if self.module == "finetune":
            from .finetune import config_hash, pretraining_of

            if self.population:
                raise ValueError("fine-tunings are not trained in populations")
            pretraining, pretraining_dir = pretraining_of(cfg)
            return cfg, config_hash(cfg, train.config_hash(pretraining)), train.run_dir_of(cfg), pretraining_dir
        if self.population and cfg.trainer.seed not in self.population:
            raise ValueError(f"its trainer.seed {cfg.trainer.seed} is not one of its population's {self.population}")
        return cfg, train.config_hash(cfg, population=list(self.population) or None), train.run_dir_of(cfg), None


def variant(config: str, name: str, values: Mapping[str, Any]) -> Run:
    """The run of ``config/<config>.yaml`` with some fields changed (``{"model.time_embed_dim": 4}``), named
    ``name`` (its run directory is ``runs/<name>``)."""
    overrides = ["--name", name]
    for field_name, value in values.items():
        overrides += [f"--{field_name}", json.dumps(value) if not isinstance(value, str) else value]
    return Run(config, tuple(overrides))


def seeded(run: Run, n: int, *, population: bool = False) -> list[Run]:
    """``run`` and ``n - 1`` copies of it trained with the next ``trainer.seed`` values (another initialisation, data
    order and dropout), named ``<name>-seed<k>``: the seeds a comparison is judged over (``seeds.RULE``).
    ``run`` itself stays the first seed, so a preset that adds seeds keeps its finished runs. ``population``: the
    copies are trained together, as one vmapped model (``diffeqformer.population``; each member reads its own seed's
    data and starts from its own seed's initialisation), which is faster on a small model than one after the
    other."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"a comparison needs a positive number of seeds, got {n!r}")
    import yaml

    overrides = list(run.overrides)
    if "--name" in overrides:
        i = overrides.index("--name")
        name = overrides[i + 1]
        del overrides[i : i + 2]
    else:
        name = yaml.safe_load(run.path.read_text())["name"]
    base_seed = (yaml.safe_load(run.path.read_text()).get("trainer") or {}).get("seed", 0)
    if "--trainer.seed" in overrides:
        i = overrides.index("--trainer.seed")
        base_seed = int(overrides[i + 1])
        del overrides[i : i + 2]
    seeds = tuple(base_seed + k for k in range(n)) if population and n > 1 else ()
    first = dataclasses.replace(run, population=seeds)
    return [first] + [Run(run.config, (*overrides, "--name", f"{name}-seed{k}", "--trainer.seed", str(base_seed + k)),
                          run.module, seeds) for k in range(1, n)]


def finetune_runs(preset: str) -> dict[str, Run]:
    """Every run of the Fig. 5 experiment (``finetune.finetune_grid``) as ``Run`` values, pretrainings first,
    keyed by run name."""
    from .finetune import finetune_grid

    out = {}
    for g in finetune_grid(preset):
        config = str(g.config.relative_to(paths.CONFIG).with_suffix(""))
        module = "finetune" if g.module.endswith("finetune") else "train"
        out[g.name] = Run(config, tuple(g.overrides), module) if g.overrides else Run(config, module=module)
    return out


INFERENCE_SWEEP = dict(euler_steps=list(range(1, 25)), fixed_steps=[1, 2, 3, 4, 6, 8, 12, 16, 24],
                       tolerances=[1e-1, 3e-2, 1e-2, 3e-3, 1e-3])
"""Step counts and tolerances of the adaptive-inference notebook, the same in the cpu, gpu and paper presets."""


def ablation_entries(preset: str, base_dt: int, dts: tuple[int, ...], *, measure_batch: int,
                     num_sequences: int, prefix: str = "ablation_", seeds: int = 1,
                     population: bool = False) -> dict[str, dict[str, Any]]:
    """The registry entries of F8-F10 and of the adaptive-inference notebook for a preset whose base models are
    ``config/<preset>/<prefix>{diffeqformer,gpt2}.yaml`` (base d_t = ``base_dt``; the d_t sweep is ``dts``;
    ``measure_batch`` sequences per measured training step; ``num_sequences`` evaluated at inference). The variants
    are named after the base: ``gpu-ablation-diffeqformer-dt4`` (prefix ``ablation_``), ``cpu-diffeqformer-dt2``
    (prefix ``""``: the ablations vary the F1-F6 models themselves). Every setting F8-F10 compare is trained with
    ``seeds`` seeds (``seeded``; with ``population``, each setting's seeds as one population)."""
    ours, gpt = f"{preset}/{prefix}diffeqformer", f"{preset}/{prefix}gpt2"
    stem = f"{preset}-{prefix.replace('_', '-')}"

    def dt(d: int) -> Run:
        return Run(ours) if d == base_dt else variant(ours, f"{stem}diffeqformer-dt{d}", {"model.time_embed_dim": d})

    def s(run: Run) -> list[Run]:
        return seeded(run, seeds, population=population)

    return {
        "f8_beta2": dict(runs={
            "ours": [s(Run(ours)), s(variant(ours, f"{stem}diffeqformer-beta2-0.95", {"optimizer.beta2": 0.95}))],
            "gpt": [s(Run(gpt)), s(variant(gpt, f"{stem}gpt2-beta2-0.95", {"optimizer.beta2": 0.95}))]}),
        "f9_time_embedding": dict(runs=[s(dt(d)) for d in dts], measure_batch=measure_batch, measure_steps=10),
        "f10_hypernetwork": dict(runs=[s(Run(ours)), s(variant(ours, f"{stem}diffeqformer-shared-mlp",
                                                               {"model.hypernet": "shared_mlp"}))]),
        "x1_adaptive_steps": dict(run=Run(ours), random_run=variant(
            ours, f"{stem}diffeqformer-random-steps", {"model.random_step_offset": True}),
            num_sequences=num_sequences, **INFERENCE_SWEEP),
    }


# ------------------------------------------------------------------------------------------------------ registry

SMOKE_VARIANT = variant("smoke/diffeqformer", "smoke-diffeqformer-variant", {
    "optimizer.beta2": 0.95, "model.time_embed_dim": 2, "model.hypernet": "shared_mlp",
    "model.random_step_offset": True})
"""The smoke preset's one ablation run (see its registry entries)."""

CPU_SEEDS = 3
"""Seeds of every setting that F5, F6 and F8-F10 compare in the cpu preset (``seeds.RULE`` needs at least two),
each setting's seeds trained together as one population (``seeded(..., population=True)``)."""

PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    # CI: seconds of training per run; checks that every notebook executes and the book builds.
    "smoke": {
        "f1_model": dict(run=Run("smoke/diffeqformer"), num_times=401),
        "f2_spectra": dict(run=Run("smoke/diffeqformer"), baselines={"gpt": Run("smoke/gpt2")}),
        "f3_trajectories": dict(runs={"ours": Run("smoke/diffeqformer"), "shared": Run("smoke/shared")}),
        "f5_lyapunov": dict(run=Run("smoke/diffeqformer"), synthetic_runs=[Run("smoke/synthetic_diffeqformer")]),
        # Two seeds of GPT-2 and DiffEqFormer: CI goes through the verdicts over seeds (seeds.RULE) once. (Trained
        # alone, not as populations: the smoke fine-tunings read smoke/diffeqformer as their pretraining, and a
        # fine-tuning checks its pretraining's hash as a run trained alone.)
        "f6_perplexity": dict(runs={"gpt": seeded(Run("smoke/gpt2"), 2), "shared": Run("smoke/shared"),
                                    "ours": seeded(Run("smoke/diffeqformer"), 2)}),
        "f7_finetuning": dict(runs={
            "smoke-diffeqformer": Run("smoke/diffeqformer"), "smoke-gpt2": Run("smoke/gpt2"),
            "smoke-finetune-diffeqformer-lora": Run("smoke/finetune_diffeqformer_lora", module="finetune"),
            "smoke-finetune-diffeqformer-full": Run("smoke/finetune_diffeqformer_full", module="finetune"),
            "smoke-finetune-gpt2-lora": Run("smoke/finetune_gpt2_lora", module="finetune")}),
        # One variant of the smoke model changes every field an ablation varies (beta2, d_t, hypernetwork, step
        # placement): each notebook still compares two runs that differ in its field, and CI trains one run, not
        # four (measured: 52-87 s per smoke run).
        "f8_beta2": dict(runs={"ours": [Run("smoke/diffeqformer"), SMOKE_VARIANT],
                               "gpt": [Run("smoke/gpt2"), variant("smoke/gpt2", "smoke-gpt2-beta2-0.95",
                                                                  {"optimizer.beta2": 0.95})]}),
        "f9_time_embedding": dict(runs=[SMOKE_VARIANT, Run("smoke/diffeqformer")], measure_batch=4,
                                  measure_steps=3),
        "f10_hypernetwork": dict(runs=[Run("smoke/diffeqformer"), SMOKE_VARIANT]),
        "x1_adaptive_steps": dict(run=Run("smoke/diffeqformer"), random_run=SMOKE_VARIANT, num_sequences=4,
                                  euler_steps=[1, 3, 6], fixed_steps=[2, 4], tolerances=[1e-2]),
        "f11_downstream": dict(run=Run("smoke/diffeqformer")),
    },
    # `make book`: 64-d models on the offline Shakespeare corpus, about a minute per run on two CPU cores. The
    # ablations vary the F6 models (cpu/diffeqformer, cpu/gpt2); d_t takes three values, not five, to keep the
    # whole build within 40 minutes.
    "cpu": {
        "f1_model": dict(run=Run("cpu/diffeqformer")),
        "f2_spectra": dict(run=Run("cpu/diffeqformer"), num_times=101, baselines={
            "gpt": Run("cpu/gpt2"), "shared": Run("cpu/shared"), "llama": Run("cpu/llama"),
            "ours_llama": Run("cpu/diffeqformer_llama")}),
        "f3_trajectories": dict(runs={"ours": Run("cpu/diffeqformer"), "shared": Run("cpu/shared")}, num_seeds=3,
                                num_tokens=40, horizon=10.0, num_saves=200, model_tokens=40, model_horizon=10.0,
                                model_saves=200),
        "f5_lyapunov": dict(run=Run("cpu/diffeqformer"), synthetic_runs=seeded(Run("cpu/synthetic_diffeqformer"),
                                                                                CPU_SEEDS, population=True),
                            max_tokens=48, map_tokens=24, timing_repeats=3, num_prompts=300),
        "f6_perplexity": dict(runs={key: seeded(Run(f"cpu/{config}"), CPU_SEEDS, population=True) for key, config in (
            ("gpt", "gpt2"), ("shared", "shared"), ("ours", "diffeqformer"), ("llama", "llama"),
            ("ours_llama", "diffeqformer_llama"))}),
        "f7_finetuning": dict(runs=finetune_runs("cpu")),
        **ablation_entries("cpu", 8, (2, 8, 32), measure_batch=16, num_sequences=64, prefix="", seeds=CPU_SEEDS,
                           population=True),
        "f11_downstream": dict(run=Run("cpu/diffeqformer")),
    },
    # One Colab-class GPU, WikiText-103 (needs the internet).
    "gpu": {
        "f1_model": dict(run=Run("gpu/diffeqformer")),
        "f2_spectra": dict(run=Run("gpu/diffeqformer"), num_times=101, baselines={"gpt": Run("gpu/gpt2")}),
        "f3_trajectories": dict(runs={"ours": Run("gpu/diffeqformer")}, num_seeds=3, num_tokens=40, horizon=10.0,
                                num_saves=200, model_tokens=40, model_horizon=10.0, model_saves=200),
        "f5_lyapunov": dict(run=Run("gpu/diffeqformer"), synthetic_runs=[Run("gpu/synthetic_diffeqformer")],
                            max_tokens=128, map_tokens=48, timing_repeats=3, num_prompts=1000),
        "f6_perplexity": dict(runs={"gpt": Run("gpu/gpt2"), "ours": Run("gpu/diffeqformer")}),
        "f7_finetuning": dict(runs=finetune_runs("gpu")),
        **ablation_entries("gpu", 20, (4, 8, 20, 48, 96), measure_batch=32, num_sequences=64),
        "f11_downstream": dict(run=Run("gpu/diffeqformer")),
    },
    # The paper's configurations (Tables 1-2): multi-GPU/TPU.
    "paper": {
        "f1_model": dict(run=Run("paper/wikitext103_small_diffeqformer")),
        "f2_spectra": dict(run=Run("paper/wikitext103_small_diffeqformer"), num_times=101,
                           baselines={"gpt": Run("paper/wikitext103_small_gpt2")}),
        "f3_trajectories": dict(runs={"ours": Run("paper/wikitext103_small_diffeqformer")}, num_seeds=3,
                                num_tokens=40, horizon=10.0, num_saves=200, model_tokens=40, model_horizon=10.0,
                                model_saves=200),
        "f5_lyapunov": dict(run=Run("paper/wikitext103_small_diffeqformer"),
                            synthetic_runs=[Run("paper/synthetic_diffeqformer")], max_tokens=128, map_tokens=48,
                            timing_repeats=3, num_prompts=1000),
        "f6_perplexity": dict(runs={
            "gpt": Run("paper/wikitext103_small_gpt2"), "shared": Run("paper/wikitext103_small_shared"),
            "ours": Run("paper/wikitext103_small_diffeqformer"), "gpt_medium": Run("paper/wikitext103_medium_gpt2"),
            "ours_medium": Run("paper/wikitext103_medium_diffeqformer"),
            "owt_gpt_small": Run("paper/owt_small_gpt2"), "owt_ours_small": Run("paper/owt_small_diffeqformer"),
            "owt_gpt_large": Run("paper/owt_large_gpt2"), "owt_ours_large": Run("paper/owt_large_diffeqformer"),
            "llama": Run("paper/owt_llama_1b_llama"), "ours_llama": Run("paper/owt_llama_1b_diffeqformer"),
        }),
        "f7_finetuning": dict(runs=finetune_runs("paper")),
        **ablation_entries("paper", 20, (20, 48, 72, 96, 120, 144), measure_batch=8, num_sequences=256),
        "f11_downstream": dict(run=Run("paper/owt_small_diffeqformer")),
    },
}
"""preset -> notebook (file stem in ``notebooks/``, in execution order) -> parameter values."""

DEFAULT_SECONDS = {"smoke": {"train": 45, "notebook": 30, "book": 90},
                   "cpu": {"train": 90, "notebook": 60, "book": 90},
                   "gpu": {"train": 3600, "notebook": 120, "book": 90},
                   "paper": {"train": 86400, "notebook": 600, "book": 90}}
"""Guesses for the time left, used until a step has been measured in this DIFFEQFORMER_HOME."""

LIBRARIES = ("jax", "jaxlib", "marin-levanter", "marin-haliax", "equinox", "diffrax", "numpy", "pandas", "matplotlib",
             "papermill", "myst-nb", "jupyter-book")
"""Library versions that enter every cache key."""

TOC = paths.REPO / "_toc.yml"
BOOK_FILES = ("_config.yml", "_toc.yml")


def html_dir() -> Path:
    """Where the book is built: ``_build/html`` below DIFFEQFORMER_HOME."""
    return paths.HOME / "_build" / "html"


def work_dir() -> Path:
    """The pipeline's own files: ``cache/``, ``logs/``, ``failed/``, ``state.json``, staging folders."""
    return paths.HOME / "_build" / "pipeline"


def cache_dir() -> Path:
    return work_dir() / "cache"


class PipelineError(Exception):
    """A problem the user must fix; the message names it."""


# ---------------------------------------------------------------------------------------------------- validation


def toc_notebooks(toc: Path = TOC) -> list[str]:
    """The notebooks (stems) that ``_toc.yml`` puts in the book."""
    import yaml

    found = []

    def walk(node):
        if isinstance(node, dict):
            f = node.get("file")
            if isinstance(f, str) and f.startswith("notebooks/"):
                found.append(Path(f).stem)
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(yaml.safe_load(toc.read_text()))
    return found


def declared_parameters(notebook: Path) -> dict[str, dict]:
    """The parameters a notebook declares in its cell tagged ``parameters`` (Papermill's ``inspect_notebook``):
    name -> {inferred_type_name, default, help}."""
    import papermill

    cells = json.loads(Path(notebook).read_text())["cells"]
    if not any("parameters" in c.get("metadata", {}).get("tags", []) for c in cells):
        raise PipelineError(f"{notebook.name} has no cell tagged 'parameters'")

    return papermill.inspect_notebook(str(notebook))


_TYPES = {"str": str, "int": int, "float": float, "bool": bool, "list": list, "dict": dict, "tuple": tuple,
          "List": list, "Dict": dict, "Any": typing.Any, "Optional": typing.Optional, "None": None}


def _annotation(text: str):
    try:
        return eval(text, {"__builtins__": {}}, dict(_TYPES))  # names above only: 'str', 'list[str]', ...
    except Exception:
        raise PipelineError(f"unsupported parameter annotation {text!r}") from None


def type_matches(value, annotation) -> bool:
    """Whether ``value`` (plain JSON-like data) fits ``annotation`` (``int``, ``list[str]``, ``dict[str, str]``,
    ``Optional[int]``, ...). An int fits ``float``; a bool fits only ``bool``."""
    if annotation is typing.Any:
        return True
    if annotation is None or annotation is type(None):
        return value is None
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Union:
        return any(type_matches(value, a) for a in args)
    if origin in (list, tuple):
        return isinstance(value, (list, tuple)) and all(type_matches(v, args[0]) for v in value) if args else \
            isinstance(value, (list, tuple))
    if origin is dict:
        return isinstance(value, dict) and all(type_matches(k, args[0]) and type_matches(v, args[1])
                                               for k, v in value.items())
    if annotation is bool:
        return isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if annotation in (list, tuple):
        return isinstance(value, (list, tuple))
    return isinstance(value, annotation)


def _expected_type(declared: dict):
    """The type a parameter must have: its annotation, else the type of its literal default, else anything."""
    name = declared["inferred_type_name"]
    if name and name != "None":
        return _annotation(name)
    try:
        default = ast.literal_eval(declared["default"])
    except (ValueError, SyntaxError):
        return typing.Any
    return typing.Any if default is None else type(default)


def _plain(value):
    """Registry values with ``Run`` markers replaced by placeholder strings (for type checks)."""
    if isinstance(value, Run):
        return str(value.path)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def check_parameters(notebook: str, values: Mapping[str, Any], declared: Mapping[str, dict]) -> None:
    """Reject parameter names the notebook does not declare and values of the wrong type, naming them."""
    for name, value in values.items():
        if name not in declared:
            raise PipelineError(f"{notebook}: parameter {name!r} is not declared in the notebook's parameters "
                                f"cell (it declares: {', '.join(declared) or 'nothing'})")
        expected = _expected_type(declared[name])
        if not type_matches(_plain(value), expected):
            shown = getattr(expected, "__name__", None) or str(expected).replace("typing.", "")
            raise PipelineError(f"{notebook}: parameter {name!r} must be {shown}, got {value!r} "
                                f"({type(value).__name__})")


def parse_overrides(items: list[str]) -> dict[str, dict[str, Any]]:
    """``["f1_model.seed=3", "f6_perplexity.runs={gpt: runs/x}"]`` -> {notebook: {parameter: value}}; values are
    YAML (so 3 is an int, [1, 2] a list, and a bare word a string)."""
    import yaml

    out: dict[str, dict[str, Any]] = {}
    for item in items:
        m = re.fullmatch(r"(\w+)\.(\w+)=(.*)", item, flags=re.S)
        if not m:
            raise PipelineError(f"--set expects NOTEBOOK.PARAMETER=VALUE, got {item!r}")
        out.setdefault(m[1], {})[m[2]] = yaml.safe_load(m[3]) if m[3].strip() else ""
    return out


# -------------------------------------------------------------------------------------------------------- plan


@dataclass
class Training:
    """A run the preset needs."""

    config: str
    """``Run.key``: the config below ``config/`` and its overrides."""
    path: Path
    name: str
    run_dir: Path
    config_hash: str
    done: bool
    stale: str | None = None
    """The config hash of another configuration's run found in ``run_dir`` (moved aside by ``retrain_stale``)."""
    run: Run | None = None
    """The registry's value it came from (config file, overrides, module)."""
    after: tuple[str, ...] = ()
    """Keys (``config``) of the trainings that must finish first: a fine-tuning's pretraining."""
    data: str = ""
    """The resolved data config (repr): runs with equal ones share a token cache, prepared once before training."""
    steps: int = 0
    """Training steps: the lanes start the longest runs first, so that no long run is left alone at the end."""

    @property
    def population_key(self) -> tuple | None:
        """The population it is trained in (``Run.population_key``), None for a run trained alone."""
        return self.run.population_key if self.run is not None and self.run.population else None


@dataclass
class NotebookJob:
    """A notebook execution with its resolved parameters and cache key."""

    name: str
    path: Path
    parameters: dict
    runs: list[str]
    key: str = ""

    @property
    def cache_dir(self) -> Path:
        return cache_dir() / f"{self.name}-{self.key}"

    @property
    def cached(self) -> bool:
        return (self.cache_dir / "record.json").exists()


@dataclass
class Plan:
    """Everything one invocation will do, resolved and validated before anything runs."""

    preset: str
    trainings: list[Training] = field(default_factory=list)
    notebooks: list[NotebookJob] = field(default_factory=list)


def _collect_runs(value, found: list[Run]):
    if isinstance(value, Run):
        found.append(value)
    elif isinstance(value, dict):
        for v in value.values():
            _collect_runs(v, found)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _collect_runs(v, found)


def _map_runs(value, fn):
    """``value`` (a notebook's parameters) with every ``Run`` in it replaced by ``fn(run)``."""
    if isinstance(value, Run):
        return fn(value)
    if isinstance(value, dict):
        return {k: _map_runs(v, fn) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_map_runs(v, fn) for v in value)
    return value


def _join_populations(entries: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """The registry's entries with every ``Run`` that is also a member of a population (``seeded(...,
    population=True)`` elsewhere in the preset) replaced by that member: F1 reading ``Run("cpu/diffeqformer")``
    reads the first seed of F6's population, trained once."""
    members: dict[tuple, Run] = {}

    def collect(run: Run) -> Run:
        if run.population:
            members.setdefault((run.config, run.overrides, run.module), run)
        return run

    for values in entries.values():
        _map_runs(values, collect)
    return {nb: _map_runs(values, lambda r: members.get((r.config, r.overrides, r.module), r))
            for nb, values in entries.items()}


def _resolve(value, run_dirs: Mapping[str, Path]):
    if isinstance(value, Run):
        # Relative to DIFFEQFORMER_HOME (the notebooks' working directory) where possible: the book then shows
        # 'runs/cpu-gpt2', and the cache keys do not depend on where the home is.
        return paths.home_relative(run_dirs[value.key])
    if isinstance(value, dict):
        return {k: _resolve(v, run_dirs) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_resolve(v, run_dirs) for v in value]
    return value


def plan(preset: str, overrides: Mapping[str, Mapping[str, Any]] | None = None, *,
         registry: Mapping[str, Mapping[str, Mapping[str, Any]]] | None = None,
         notebooks_dir: Path | None = None, toc: Path | None = None, retrain_stale: bool = False) -> Plan:
    """Validate the preset's registry entry (with ``overrides``) and resolve it into a ``Plan``. Nothing is run;
    every problem raises ``PipelineError`` naming the preset, notebook, parameter or config.

    A run directory holding another configuration's run is an error, unless ``retrain_stale`` (then ``run`` moves
    it to ``runs/.stale/`` and trains again)."""
    registry = PRESETS if registry is None else registry
    notebooks_dir = paths.NOTEBOOKS if notebooks_dir is None else notebooks_dir
    if preset not in registry:
        raise PipelineError(f"unknown preset {preset!r}; choose one of: {', '.join(registry)}")
    entries = {nb: dict(values) for nb, values in registry[preset].items()}
    for nb, values in (overrides or {}).items():
        if nb not in entries:
            raise PipelineError(f"--set names notebook {nb!r}, which preset {preset!r} does not run "
                                f"(it runs: {', '.join(entries)})")
        entries[nb].update(values)
    entries = _join_populations(entries)
    in_toc = toc_notebooks(TOC if toc is None else toc)
    for nb in in_toc:
        if nb not in entries:
            raise PipelineError(f"notebook {nb!r} is in _toc.yml but preset {preset!r} does not run it: add it to "
                                f"diffeqformer.pipeline.PRESETS[{preset!r}]")

    result = Plan(preset)
    needed: list[Run] = []
    for nb, values in entries.items():
        path = notebooks_dir / f"{nb}.ipynb"
        if not path.exists():
            raise PipelineError(f"preset {preset!r} runs notebook {nb!r}, but {path} does not exist")
        if nb not in in_toc:
            raise PipelineError(f"notebook {nb!r} is run by preset {preset!r} but is not in _toc.yml")
        declared = declared_parameters(path)
        try:
            book.check_colab_cell(path)
        except ValueError as err:
            raise PipelineError(str(err)) from None
        if "preset" not in declared:
            raise PipelineError(f"{nb}: its parameters cell must declare 'preset'")
        values = {"preset": preset, **values}
        check_parameters(nb, values, declared)
        runs: list[Run] = []
        _collect_runs(values, runs)
        needed += runs
        result.notebooks.append(NotebookJob(nb, path, values, [r.key for r in runs]))

    unique = list({r.key: r for r in needed}.values())
    pretrainings: dict[str, Path] = {}
    for r in unique:
        try:
            cfg, digest, run_dir, pretraining_dir = r.resolve()
        except (ValueError, FileNotFoundError) as err:
            raise PipelineError(f"training config {r.key!r}: {err}") from None
        complete = run_dir / "complete.json"
        done = complete.exists() and json.loads(complete.read_text()).get("config_hash") == digest
        saved = run_dir / "config.yaml"
        if not done and saved.exists() and (run_dir / "checkpoints").exists():
            first = saved.read_text().split("\n", 1)[0].removeprefix("# config_hash: ")
            if first != digest and not retrain_stale:
                raise PipelineError(
                    f"{run_dir} holds a run of another configuration of {r.key} (hash {first}; the config "
                    f"now resolves to {digest}: the file, or the code that fills in its defaults, changed). "
                    f"Move that directory away (or pass --retrain-stale, which moves it to runs/.stale/) to "
                    f"train it again, or point the notebook at it with --set.")
            stale = first if first != digest else None
        else:
            stale = None
        result.trainings.append(Training(r.key, r.path, cfg.name, run_dir, digest, done, stale, run=r,
                                         data=repr(cfg.data), steps=cfg.trainer.num_train_steps))
        if pretraining_dir is not None:
            pretrainings[r.key] = pretraining_dir
    by_dir: dict[Path, Training] = {}
    for t in result.trainings:
        other = by_dir.setdefault(t.run_dir.resolve(), t)
        if other is not t:
            raise PipelineError(f"{t.config!r} and {other.config!r} would both train into {t.run_dir}: name one of "
                                f"them otherwise (a run trained in a population and alone are two runs)")
    for t in result.trainings:
        if t.config not in pretrainings:
            continue
        first = by_dir.get(pretrainings[t.config].resolve())
        if first is not None and first.population_key is not None:
            raise PipelineError(f"fine-tuning {t.config!r} would read {first.config!r} as its pretraining, a run "
                                f"trained in a population, which a fine-tuning cannot check against its config: "
                                f"pretrain a run trained alone")
        if first is not None:
            t.after = (first.config,)
        elif not (pretrainings[t.config] / "complete.json").exists():
            raise PipelineError(f"fine-tuning {t.config!r} needs the pretrained run {pretrainings[t.config]}, which "
                                f"is not finished and which preset {preset!r} does not train: add its config to "
                                f"the registry")
    run_dirs = {t.config: t.run_dir for t in result.trainings}
    hashes = {t.config: t.config_hash for t in result.trainings}
    package = package_hash()
    for job in result.notebooks:
        job.parameters = _resolve(job.parameters, run_dirs)
        job.key = notebook_key(job.path, job.parameters, {c: hashes[c] for c in job.runs}, package)
    return result


# ------------------------------------------------------------------------------------------------------ hashing


def _sha(*parts: bytes | str) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode() if isinstance(p, str) else p)
        h.update(b"\0")
    return h.hexdigest()


def package_hash() -> str:
    """Hash of every source file of the ``diffeqformer`` package and of the main libraries' versions."""
    root = Path(__file__).resolve().parent
    parts = []
    for f in sorted(root.rglob("*.py")):
        parts += [str(f.relative_to(root)), f.read_bytes()]
    for lib in LIBRARIES:
        try:
            parts.append(f"{lib}=={importlib.metadata.version(lib)}")
        except importlib.metadata.PackageNotFoundError:
            parts.append(f"{lib} missing")
    parts.append(platform.python_version())
    return _sha(*parts)


def notebook_source_hash(path: Path) -> str:
    """Hash of a notebook's cells (type, source, tags): outputs and execution counts do not count."""
    nb = json.loads(Path(path).read_text())
    cells = [(c["cell_type"], "".join(c["source"]) if isinstance(c["source"], list) else c["source"],
              sorted(c.get("metadata", {}).get("tags", []))) for c in nb["cells"]]
    return _sha(json.dumps(cells))


def notebook_key(path: Path, parameters: Mapping, run_hashes: Mapping[str, str], package: str) -> str:
    """The cache key of one notebook execution (see the module docstring)."""
    return _sha(notebook_source_hash(path), json.dumps(parameters, sort_keys=True),
                json.dumps(dict(sorted(run_hashes.items()))), package)[:16]


# ----------------------------------------------------------------------------------------------------- progress


class Progress:
    """Prints 'step i of n', the elapsed time and an estimate of the time left (from earlier measurements in this
    DIFFEQFORMER_HOME, else from guesses per preset)."""

    def __init__(self, steps: list[tuple[str, float]], stream=None):
        self.steps = steps  # (label, estimated seconds; a step done side by side with others: its share)
        self.start = time.time()
        self.finished: set[int] = set()
        self.stream = stream or sys.stdout

    @staticmethod
    def fmt(seconds: float) -> str:
        seconds = int(round(seconds))
        return f"{seconds // 60}:{seconds % 60:02d}" if seconds < 3600 else \
            f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"

    def begin(self, index: int, what: str) -> float:
        left = sum(est for i, (_, est) in enumerate(self.steps) if i not in self.finished)
        print(f"[{index + 1}/{len(self.steps)}] {what}   ({self.fmt(time.time() - self.start)} elapsed, "
              f"about {self.fmt(left)} left)", file=self.stream, flush=True)
        return time.time()

    def end(self, index: int, started: float, note: str = "") -> float:
        took = time.time() - started
        self.finished.add(index)
        print(f"[{index + 1}/{len(self.steps)}] done in {self.fmt(took)}{' ' + note if note else ''}",
              file=self.stream, flush=True)
        return took


# -------------------------------------------------------------------------------------------------- the steps


def _load_state() -> dict:
    path = work_dir() / "state.json"
    return json.loads(path.read_text()) if path.exists() else {}


def _save_state(state: dict) -> None:
    paths.write_atomic(work_dir() / "state.json", json.dumps(state, indent=1, sort_keys=True) + "\n")


RUNS_PER_WORKER = 8
"""Runs one training process trains before the next takes over. One process for everything crashed on the cpu
preset after 32 runs (LLVM: "Cannot allocate memory" while compiling, then a segmentation fault): compiled
programs pile up in a long-lived JAX process. Starting one costs about 10 s (JAX, Levanter)."""
TRAIN_LANES = int(os.environ.get("DIFFEQFORMER_TRAIN_LANES", "2"))
"""Training processes that run side by side (``DIFFEQFORMER_TRAIN_LANES``; 1 trains one run at a time). On the
two-core machine two 64-d runs of 150 steps took 82 s side by side against 140 s one after the other: a small
model's XLA program keeps about 1.3 cores busy, and start-up, compilation and evaluation mostly one."""


class _Worker:
    """A ``--train-worker`` child process: it reads one run spec (JSON) per line on its standard input, trains it
    and answers ``@pipeline done`` on its standard output; everything else it prints goes to ``log``."""

    def __init__(self, log: Path, env: Mapping[str, str]):
        self.log = log
        self.out = log.open("a")
        self.proc = subprocess.Popen([sys.executable, "-m", "diffeqformer.pipeline", "--train-worker"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.out, text=True,
                                     env=dict(env), cwd=paths.REPO)
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


def _units(trainings: list[Training]) -> list[list[Training]]:
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


def train_runs(trainings: list[Training], progress: Progress, first_step: int, log: Path,
               lanes: int | None = None, *, notebooks: list[tuple[int, NotebookJob]] = (),
               execute: typing.Callable[[NotebookJob], float] | None = None,
               seconds: dict[str, float] | None = None) -> dict[str, float]:
    """Train the runs that are not complete in ``lanes`` (default ``TRAIN_LANES``) child processes side by side,
    each taking the next run whose pretraining (``Training.after``) has finished, ``RUNS_PER_WORKER`` runs per
    process (``train.main`` or ``finetune.main`` called in turn: one JAX/Levanter start-up per process instead of one
    per run; the pipeline's own process never starts JAX). First one process builds the token caches of every
    dataset the runs read, so that no two processes build one at once. Output goes to ``log`` (lane k > 0:
    ``<log>-k``). A failed run stops the others (they resume from their checkpoints next time).

    ``notebooks`` (pairs of progress index and job) are executed by the same lanes with ``execute(job)``: a lane
    takes a notebook as soon as every run it reads (``NotebookJob.runs``) is complete, before any run still to
    train, so that notebooks fill the time in which a lane would otherwise wait for the last long run, and two
    notebooks execute side by side after the last run; one in ``RUNS_ALONE`` waits until nothing else is left or
    running, and the other lanes wait while it runs. A failed notebook stops the lanes like a failed run.
    Returns the measured seconds per config, and per notebook under ``notebook:<name>`` (also filled into
    ``seconds`` as they are measured, so that a caller keeps them when a later run or notebook fails). Every run a
    lane trains must have its ``complete.json`` for its configuration before a notebook reads it.

    Measured on the three smoke runs on a shared two-core machine: about 10% less CPU time with one process for
    several runs than with one process per run (110 s against 126 s). The saved parameters (``model.eqx``) were
    bit-identical either way."""
    import threading

    units = _units(trainings)  # a run, or a population's members
    todo = [t for unit in units for t in unit]
    notebooks = list(notebooks)
    seconds = {} if seconds is None else seconds
    if not units and not notebooks:
        return seconds
    if notebooks and execute is None:
        raise ValueError("train_runs: notebooks need an execute function")
    lanes = max(1, min(TRAIN_LANES if lanes is None else lanes, len(units) + len(notebooks)))
    index = {id(t): first_step + i for i, t in enumerate(trainings)}
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}
    logs = [log] + [log.with_name(f"{log.stem}-{k}{log.suffix}") for k in range(1, lanes)]

    workers: list[_Worker | None] = [None] * lanes
    first_of: dict[str, Training] = {}  # the first run of each distinct dataset
    for t in todo:
        first_of.setdefault(t.data, t)
    if first_of:
        workers[0] = _Worker(logs[0], env)
        try:
            for t in first_of.values():
                workers[0].do(_spec(t, prepare=True))
        except PipelineError:
            workers[0].close(kill=True)
            raise

    pending: list = sorted(units, key=lambda u: -u[0].steps)  # longest first (stable: else the registry's order)
    pending_notebooks = list(notebooks)
    finished = {t.config for t in trainings if t.done}
    errors: list[PipelineError] = []
    running = [0, False]  # items being worked on; whether one of them runs alone
    cond = threading.Condition()

    def take():
        with cond:
            while not errors and (pending or pending_notebooks):
                if not running[1]:
                    ready = next(((i, j) for i, j in pending_notebooks
                                  if j.name not in RUNS_ALONE and all(r in finished for r in j.runs)), None)
                    if ready is None:
                        ready = next((u for u in pending if all(a in finished for t in u for a in t.after)), None)
                    if ready is None and not pending and running[0] == 0:
                        ready = next(((i, j) for i, j in pending_notebooks if all(r in finished for r in j.runs)),
                                     None)
                        running[1] = ready is not None
                    if ready is not None:
                        (pending_notebooks if isinstance(ready, tuple) else pending).remove(ready)
                        running[0] += 1
                        return ready
                cond.wait()
            return None

    def train(k: int, unit: list[Training]) -> None:
        if workers[k] is not None and workers[k].runs >= RUNS_PER_WORKER:
            workers[k].close()
            workers[k] = None
        if workers[k] is None:
            workers[k] = _Worker(logs[k], env)
        together = f" (one of a population of {len(unit)}, trained together)" if len(unit) > 1 else ""
        started = [progress.begin(index[id(t)], f"train {t.config} -> {t.run_dir}{together}") for t in unit]
        workers[k].do(_spec(unit if len(unit) > 1 else unit[0]))
        took = time.time() - started[0]
        for t, begun in zip(unit, started):
            complete = t.run_dir / "complete.json"
            if not (complete.exists() and json.loads(complete.read_text()).get("config_hash") == t.config_hash):
                raise PipelineError(f"run {t.run_dir} did not finish for config {t.config}")
            progress.end(index[id(t)], begun)
            # a population's time is shared by its members, as two lanes' time is by the runs side by side
            seconds[t.config] = took / len(unit)

    def lane(k: int) -> None:
        try:
            while (item := take()) is not None:
                if isinstance(item, tuple):
                    i, job = item
                    started = progress.begin(i, f"execute {job.name}")
                    execute(job)
                    seconds[f"notebook:{job.name}"] = progress.end(i, started)
                else:
                    train(k, item)
                with cond:
                    if not isinstance(item, tuple):
                        finished.update(t.config for t in item)
                    running[0] -= 1
                    running[1] = False
                    cond.notify_all()
        except PipelineError as err:
            with cond:
                errors.append(err)
                cond.notify_all()
            for w in workers:  # stop the other lanes' runs too
                if w is not None and w.proc.poll() is None:
                    w.proc.terminate()
            _stop_notebooks()
        finally:
            if workers[k] is not None:
                workers[k].close()

    threads = [threading.Thread(target=lane, args=(k,), daemon=True) for k in range(lanes)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if errors:
        raise errors[0]
    return seconds


def _prepare_data(config) -> None:
    """Build (or load) the token caches of a run's training and validation data (Levanter builds them in this
    process and returns once they are finished)."""
    levanter_data = config.data.levanter_config()
    for split in ("train", "validation"):
        levanter_data.build_caches(split)


def _train_worker() -> None:
    """Child process of ``train_runs``: for each spec (JSON, one per line on standard input) ``train.main``,
    ``finetune.main``, ``population.main`` (or, with ``"prepare": true``, ``_prepare_data``), then ``@pipeline done``
    on standard output. A spec is ``{"config": path, "overrides": [...], "module": "train" | "finetune" |
    "population", "prepare": bool}``, a population's with ``"members"``: a spec of each member."""
    import gc

    import jax

    from . import train

    train.use_compilation_cache()
    _exit_with_parent()
    for line in sys.stdin:
        spec = json.loads(line)
        if spec["module"] == "finetune":
            from . import finetune

            config = train.load_config(spec["config"], spec["overrides"], cls=finetune.FinetuneConfig)
            main = finetune.main
        elif spec["module"] == "population" and not spec.get("prepare"):
            from . import population

            config = [train.load_config(m["config"], m["overrides"]) for m in spec["members"]]
            main = population.main
        else:
            config = train.load_config(spec["config"], spec["overrides"])
            main = train.main
        (_prepare_data if spec.get("prepare") else main)(config)
        jax.clear_caches()  # this run's compiled programs: the next run compiles its own
        gc.collect()
        print("@pipeline done", flush=True)


def _exit_with_parent(poll_s: float = 0.2) -> None:
    """End this worker as soon as the pipeline that started it is gone. A killed pipeline closes the worker's
    standard input, but the worker reads it only between runs: without this it would go on training its run while the
    rerun pipeline's worker trains the same run (``train.run_lock`` makes the second wait for the first)."""
    import threading

    parent = os.getppid()

    def watch():
        while os.getppid() == parent:
            time.sleep(poll_s)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="exit-with-parent").start()


def _strip_ansi(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


_NOTEBOOK_CHILDREN: set[subprocess.Popen] = set()
"""The notebook executions running now (``execute_notebook``), for ``_stop_notebooks``."""


def _stop_notebooks() -> None:
    """End every notebook execution still running (another lane failed)."""
    for proc in list(_NOTEBOOK_CHILDREN):
        if proc.poll() is None:
            proc.terminate()


def execute_notebook(job: NotebookJob, staging: Path, log: Path) -> float:
    """Run one notebook with Papermill into ``staging``, then move the result into its cache entry. Returns the
    seconds it took. Papermill runs in a child process (``--execute-notebook``) with the notebook's own environment
    (its figures folder), so that two lanes can execute notebooks at once; its standard error, and the kernel's,
    goes to ``log``. On error, keeps the executed copy in ``_build/pipeline/failed/`` and raises ``PipelineError``
    with the notebook's own exception and the end of its traceback."""
    work = staging / "execute" / job.name
    shutil.rmtree(work, ignore_errors=True)
    (work / "figures").mkdir(parents=True)
    output = work / "notebook.ipynb"
    env = {**os.environ, "DIFFEQFORMER_FIGURES": str(work / "figures"), "PYDEVD_DISABLE_FILE_VALIDATION": "1",
           "PYTHONUNBUFFERED": "1"}
    spec = {"input": str(job.path), "output": str(output), "parameters": job.parameters,
            "error": str(work / "error.json")}
    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.time()
    with log.open("a") as err_log:
        proc = subprocess.Popen([sys.executable, "-m", "diffeqformer.pipeline", "--execute-notebook", json.dumps(spec)],
                                stdin=subprocess.DEVNULL, stdout=err_log, stderr=err_log, env=env, cwd=paths.REPO)
        _NOTEBOOK_CHILDREN.add(proc)
        try:
            rc = proc.wait()
        finally:
            _NOTEBOOK_CHILDREN.discard(proc)
    if rc != 0:
        failed = work_dir() / "failed" / f"{job.name}.ipynb"
        failed.parent.mkdir(parents=True, exist_ok=True)
        if output.exists():
            shutil.copy(output, failed)
        if (work / "error.json").exists():
            error = json.loads((work / "error.json").read_text())
            trace = "\n".join(_strip_ansi(line) for line in error["traceback"][-12:])
            raise PipelineError(f"notebook {job.name} failed in cell {error['exec_count']}: {error['ename']}: "
                                f"{error['evalue']}\n{trace}\n(the executed notebook, with the error, is in {failed})")
        tail = "\n".join(log.read_text().splitlines()[-25:])
        raise PipelineError(f"notebook {job.name}: its execution ended with exit code {rc}; the end of {log}:\n{tail}")
    seconds = time.time() - start
    check_outputs(output, job.name)
    check_figures(work / "figures", job.name)
    record = {"notebook": job.name, "key": job.key, "seconds": seconds, "parameters": job.parameters,
              "date": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    (work / "record.json").write_text(json.dumps(record, indent=1) + "\n")
    cache_dir().mkdir(parents=True, exist_ok=True)
    shutil.rmtree(job.cache_dir, ignore_errors=True)
    os.replace(work, job.cache_dir)
    return seconds


def _execute_notebook_child(spec: Mapping[str, Any]) -> None:
    """The ``--execute-notebook`` child of ``execute_notebook``: Papermill on ``spec['input']`` with its
    ``parameters`` into ``spec['output']``; a failing cell's exception is written to ``spec['error']`` (JSON) and
    the process exits with 3."""
    import papermill
    from papermill.exceptions import PapermillExecutionError

    _exit_with_parent()
    try:
        papermill.execute_notebook(spec["input"], spec["output"], parameters=spec["parameters"],
                                   kernel_name="python3", progress_bar=False, log_output=False, cwd=str(paths.HOME))
    except PapermillExecutionError as err:
        Path(spec["error"]).write_text(json.dumps({"exec_count": err.exec_count, "ename": err.ename,
                                                   "evalue": err.evalue, "traceback": list(err.traceback)}))
        sys.exit(3)


def check_outputs(path: Path, notebook: str) -> None:
    """No output of the executed notebook holds a Python traceback (a logged exception does not stop Papermill, and
    the book leaves standard error out), and none shows a figure as its text (``<Figure size 1300x340 with 5
    Axes>``, with no image: what a kernel displays for a figure when no PNG formatter is registered)."""
    nb = json.loads(Path(path).read_text())
    for i, cell in enumerate(nb["cells"]):
        for out in cell.get("outputs", []):
            text = out.get("text", "")
            text = "".join(text) if isinstance(text, list) else text
            if out.get("output_type") == "error" or "Traceback (most recent call last)" in text:
                raise PipelineError(f"notebook {notebook}: cell {i} printed a traceback:\n{text[-2000:]}")
            data = out.get("data", {})
            plain = data.get("text/plain", "")
            plain = "".join(plain) if isinstance(plain, list) else plain
            if plain.startswith("<Figure size") and not any(k.startswith("image/") for k in data):
                raise PipelineError(f"notebook {notebook}: cell {i} shows a figure as text, {plain.strip()!r}, not "
                                    f"as an image: show figures with diffeqformer.figures.save_figure (which "
                                    f"displays the PNG it saved)")


def check_figures(folder: Path, notebook: str) -> list[str]:
    """Every figure a notebook saved (``<name>.json`` provenance) has all its files, none empty."""
    names = []
    for record_path in sorted(folder.glob("*.json")):
        record = json.loads(record_path.read_text())
        for f in record["files"]:
            if not (folder / f).exists() or (folder / f).stat().st_size == 0:
                raise PipelineError(f"notebook {notebook}: figure file {f} is missing or empty")
        names.append(record["figure"])
    return names


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
            "api.md": api_markdown()}


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
            complete = Path(run_dir) / "complete.json"
            if complete.exists():
                done = json.loads(complete.read_text())
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
    """What each preset trains (with the scale, read from the configs) and which notebooks it runs."""
    import yaml

    lines = ["| preset | training configs | scale | notebooks |", "|---|---|---|---|"]
    for preset, entries in PRESETS.items():
        runs: list[Run] = []
        _collect_runs(list(entries.values()), runs)
        configs = list(dict.fromkeys(r.config for r in runs))
        scales = []
        for config in configs:
            c = yaml.safe_load(Run(config).path.read_text())
            m, d, t = c.get("model", {}), c.get("data", {}), c.get("trainer", {})
            if not m:  # a fine-tuning template: its scale is its pretraining's
                scales.append(f"fine-tuning for {t.get('num_train_steps')} steps of {t.get('train_batch_size')}")
                continue
            scales.append(f"{m.get('hidden_dim')}-d, {m.get('num_layers')} layers or steps, "
                          f"seq {m.get('max_seq_len')}, {t.get('num_train_steps')} steps of "
                          f"{t.get('train_batch_size')} on {d.get('dataset')}")
        scale = "; ".join(dict.fromkeys(scales))
        count = len({r.key for r in runs})
        lines.append(f"| `{preset}` | {count} runs of {', '.join(f'`{c}`' for c in configs)} | {scale} | "
                     f"{', '.join(entries)} |")
    return "\n".join(lines) + "\n"


def api_markdown() -> str:
    """One autodoc section per module of the package (found on disk, so a new module appears by itself)."""
    root = Path(__file__).resolve().parent
    modules = sorted(p.stem for p in root.glob("*.py") if not p.stem.startswith("_"))
    out = []
    for m in modules:
        out += [f"## `diffeqformer.{m}`", "", "```{eval-rst}", f".. automodule:: diffeqformer.{m}",
                "   :members:", "```", ""]
    return "\n".join(out)


def _tree_hash(root: Path) -> str:
    parts = []
    for f in sorted(p for p in root.rglob("*") if p.is_file()):
        parts += [str(f.relative_to(root)), f.read_bytes()]
    return _sha(*parts)


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
            shown += text[i:min(end, i + 25)]
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
    result = plan(preset, overrides, **plan_options)
    WORK, HTML = work_dir(), html_dir()
    _remove_stale_staging()
    state = _load_state()
    measured = state.setdefault("seconds", {})  # step -> seconds, last measured here (estimates, timings page)
    guess = DEFAULT_SECONDS.get(preset, DEFAULT_SECONDS["cpu"])
    steps: list[tuple[str, float]] = []
    to_execute = [(len(result.trainings) + i, job) for i, job in enumerate(result.notebooks)
                  if force or not job.cached]
    lanes = max(1, min(TRAIN_LANES, sum(not t.done for t in result.trainings) + len(to_execute)))
    for t in result.trainings:  # runs trained side by side: each counts for its share of the wall-clock time
        steps.append((f"train {t.config}",
                       0.0 if t.done else measured.get(f"train:{t.config}", guess["train"]) / lanes))
    for job in result.notebooks:  # and so do notebooks, but those that run alone
        cached = job.cached and not force
        share = 1 if job.name in RUNS_ALONE else lanes
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
                       seconds=seconds)
        finally:  # what was measured, even if a run or a notebook failed
            measured.update({k if k.startswith("notebook:") else f"train:{k}": v for k, v in seconds.items()})
            _save_state(state)
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
        book_key = _sha(_tree_hash(src), package_hash())
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
        _save_state(state)
        _prune_cache(state)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    print(f"pipeline --preset {preset}: finished in {Progress.fmt(time.time() - t0)}; figures in {paths.FIGURES}"
          + (f", book in {HTML / 'index.html'}" if build else ""), file=stream, flush=True)
    return result


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--train-worker"]:
        _train_worker()
        return
    if argv[:1] == ["--execute-notebook"]:
        _execute_notebook_child(json.loads(argv[1]))
        return
    parser = argparse.ArgumentParser(prog="python -m diffeqformer.pipeline", description=__doc__.split("\n\n")[1],
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


if __name__ == "__main__":
    main()
