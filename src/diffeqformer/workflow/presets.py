"""The registry: per preset, which notebooks the workflow runs with which parameter values (``PRESETS``, built on
first use: importing this module reads no file), and the ``Run`` values that stand for training runs in it."""

from __future__ import annotations

import dataclasses
import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from .. import config as configs
from .. import paths
from ..finetune import finetune_grid


@dataclass(frozen=True)
class Run:
    """The training run of ``config/<config>.yaml`` as a notebook parameter: the workflow trains it (if needed) and
    passes the notebook its run directory.

    ``overrides`` are command-line overrides of the file (a variant of it: ``variant`` builds one, with its own run
    name); ``module`` is ``"train"`` or ``"finetune"`` (``diffeqformer.finetune``; the workflow trains a fine-tuning's
    pretraining first when the registry lists it before the fine-tuning, as ``finetune_runs`` does)."""

    config: str
    """Path below ``config/`` without ``.yaml``, e.g. ``"cpu/gpt2"``."""
    overrides: tuple[str, ...] = ()
    """draccus-style overrides, e.g. ``("--name", "cpu-x-dt4", "--model.time_embed_dim", "4")``."""
    module: str = "train"
    population: tuple[int, ...] = ()
    """The trainer seeds of the population this run is a member of (``seeded(..., population=True)``): the
    workflow trains the members together, as one vmapped model (``diffeqformer.population``)."""

    @property
    def path(self) -> Path:
        return paths.CONFIG / f"{self.config}.yaml"

    @property
    def key(self) -> str:
        """How the plan's messages name the run: the config, then its overrides (and the population
        it is trained in)."""
        key = " ".join((self.config, *self.overrides))
        return key + f" [population of seeds {', '.join(map(str, self.population))}]" if self.population else key

    @property
    def population_key(self) -> tuple:
        """What the members of one population share: the config, the overrides but name, seed and the pretraining
        seed a fine-tuning starts from (``pretrain.member``), the seeds."""
        return (self.config, configs.without_overrides(self.overrides, "name", "trainer.seed", "pretrain.member"),
                self.population)

    def load(self):
        """The resolved configuration (``TrainConfig``, or ``FinetuneConfig`` for a fine-tuning)."""
        cls = configs.FinetuneConfig if self.module == "finetune" else configs.TrainConfig
        return configs.load_config(self.path, list(self.overrides), cls=cls)

    def identity(self) -> tuple[Any, str, Path]:
        """(configuration, config hash, run directory); a fine-tuning's hash covers its pretraining's config hash,
        computed from the pretraining's config file, so it is known before the pretraining has run."""
        return self.resolve()[:3]

    def resolve(self) -> tuple[Any, str, Path, Path | None]:
        """``identity()`` and the run directory of a fine-tuning's pretraining (``None`` for other runs), from one
        reading of the config files."""
        cfg = self.load()
        if self.population and cfg.trainer.seed not in self.population:
            raise ValueError(f"its trainer.seed {cfg.trainer.seed} is not one of its population's {self.population}")
        population = list(self.population) or None
        if self.module == "finetune":
            pretraining_dir = configs.pretraining_of(cfg)[1]
            digest = configs.config_hash(cfg, population=population,
                                         pretrain_config_hash=configs.pretraining_hash(cfg))
            return cfg, digest, configs.run_dir_of(cfg), pretraining_dir
        return cfg, configs.config_hash(cfg, population=population), configs.run_dir_of(cfg), None


def variant(config: str, name: str, values: Mapping[str, Any]) -> Run:
    """The run of ``config/<config>.yaml`` with some fields changed (``{"model.time_embed_dim": 4}``), named
    ``name`` (its run directory is ``runs/<name>``)."""
    return Run(config, ("--name", name, *configs.override_args(values)))


def seeded(run: Run, n: int, *, population: bool = False) -> list[Run]:
    """``run`` and ``n - 1`` copies of it trained with the next ``trainer.seed`` values (another initialisation, data
    order and dropout), named ``<name>-seed<k>``: the seeds a comparison is judged over (``seeds.RULE``).
    ``run`` itself stays the first seed, so a preset that adds seeds keeps its finished runs. ``population``: the
    copies are trained together, as one vmapped model (``diffeqformer.population``; each member reads its own seed's
    data and starts from its own seed's initialisation), which is faster on a small model than one after the
    other."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"a comparison needs a positive number of seeds, got {n!r}")
    resolved = run.load()  # the run's name and seed, its overrides applied, defaults filled in
    name, base_seed = resolved.name, resolved.trainer.seed
    overrides = configs.without_overrides(run.overrides, "name", "trainer.seed")
    seeds = tuple(base_seed + k for k in range(n)) if population and n > 1 else ()
    first = dataclasses.replace(run, population=seeds)
    return [first] + [Run(run.config, (*overrides, "--name", f"{name}-seed{k}", "--trainer.seed", str(base_seed + k)),
                          run.module, seeds) for k in range(1, n)]


def finetune_runs(preset: str) -> dict[str, Run]:
    """Every run of the Fig. 5 experiment (``finetune.finetune_grid``) as ``Run`` values, pretrainings first,
    keyed by run name; the seeds of a pretraining, and of a fine-tuning setting, are one population
    (``finetune.PRETRAIN_SEEDS``)."""
    out = {}
    for g in finetune_grid(preset):
        config = str(g.config.relative_to(paths.CONFIG).with_suffix(""))
        module = "finetune" if g.module.endswith("finetune") else "train"
        out[g.name] = Run(config, tuple(g.overrides), module, tuple(g.population))
    return out


INFERENCE_SWEEP = dict(euler_steps=list(range(1, 25)), fixed_steps=[1, 2, 3, 4, 6, 8, 12, 16, 24],
                       tolerances=[1e-1, 3e-2, 1e-2, 3e-3, 1e-3])
"""Step counts and tolerances of the adaptive-inference notebook, the same in the cpu, gpu and paper presets."""


def ablation_entries(preset: str, base_dt: int, dts: tuple[int, ...], *, measure_batch: int,
                     num_sequences: int, prefix: str = "ablation_", seeds: int = 1,
                     population: bool = False, base_seeds: int | None = None) -> dict[str, dict[str, Any]]:
    """The registry entries of F8-F10 and of the adaptive-inference notebook for a preset whose base models are
    ``config/<preset>/<prefix>{diffeqformer,gpt2}.yaml`` (base d_t = ``base_dt``; the d_t sweep is ``dts``;
    ``measure_batch`` sequences per measured training step; ``num_sequences`` evaluated at inference). The variants
    are named after the base: ``gpu-ablation-diffeqformer-dt4`` (prefix ``ablation_``), ``cpu-diffeqformer-dt2``
    (prefix ``""``: the ablations vary the F1-F6 models themselves). Every setting F8-F10 compare is trained with
    ``seeds`` seeds (``seeded``; with ``population``, each setting's seeds as one population); the base models are
    trained with ``base_seeds`` (default ``seeds``) in one population, of which the ablations read the first
    ``seeds``, matched with the variants' seeds."""
    ours, gpt = f"{preset}/{prefix}diffeqformer", f"{preset}/{prefix}gpt2"
    stem = f"{preset}-{prefix.replace('_', '-')}"

    def dt(d: int) -> Run:
        return Run(ours) if d == base_dt else variant(ours, f"{stem}diffeqformer-dt{d}", {"model.time_embed_dim": d})

    def s(run: Run) -> list[Run]:
        return seeded(run, seeds, population=population)

    def base(config: str) -> list[Run]:
        return seeded(Run(config), base_seeds or seeds, population=population)[:seeds]

    return {
        "f8_beta2": dict(runs={
            "ours": [base(ours), s(variant(ours, f"{stem}diffeqformer-beta2-0.95", {"optimizer.beta2": 0.95}))],
            "gpt": [base(gpt), s(variant(gpt, f"{stem}gpt2-beta2-0.95", {"optimizer.beta2": 0.95}))]}),
        "f9_time_embedding": dict(runs=[base(ours) if d == base_dt else s(dt(d)) for d in dts],
                                  measure_batch=measure_batch, measure_steps=10),
        "f10_hypernetwork": dict(runs=[base(ours), s(variant(ours, f"{stem}diffeqformer-shared-mlp",
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

PRIMARY_SEEDS = 6
"""Seeds of F6's primary comparison, DiffEqFormer against GPT-2, in the cpu and gpu presets: with six rather than
three, the paired t-test of their final log-perplexities detects a difference less than half as large 80% of the
time (``seeds.detectable_difference``; the seed spread: measurements page). The other notebooks read the first
``CPU_SEEDS`` of the same populations, so that their seeds stay matched with the other settings'."""

SIMULATION_SEEDS = 8
"""Simulations of each F3 system in the cpu and gpu presets: F3's test takes the simulation as its unit, and
where every simulation gives the same slope the exact sign-flip test needs six or more to reach p < 0.05."""

GPU_SEEDS = CPU_SEEDS
"""Seeds of every setting that F5-F10 compare in the gpu preset: the cpu preset's, each setting's seeds one
population."""

GPU_CORPUS_VARIABLE = "DIFFEQFORMER_GPU_CORPUS"
GPU_CORPUS = os.environ.get(GPU_CORPUS_VARIABLE, "shakespeare")
"""The corpus of the gpu preset's language models (``gpu_corpus``): the offline Shakespeare corpus unless the
environment variable ``DIFFEQFORMER_GPU_CORPUS`` names an online one (``wikitext103``, where the internet is, as on
Colab)."""
GPU_LANGUAGE_MODELS = ("gpu/diffeqformer", "gpu/diffeqformer_llama", "gpu/gpt2", "gpu/llama", "gpu/shared")
"""The configs of the gpu preset's language models of F1-F6 and F8-F11: the ones ``gpu_corpus`` moves."""


def single_gpu_or_cpu(preset: str, seeds: int, *, base_dt: int, dts: tuple[int, ...], measure_batch: int,
                      shots: list[int]) -> dict[str, dict[str, Any]]:
    """The entries of the cpu preset, and of the gpu preset that mirrors it at a larger scale: the same runs of
    ``config/<preset>/``, notebooks and seeds (every compared setting's ``seeds`` one population; F6's primary pair,
    GPT-2 and DiffEqFormer, ``PRIMARY_SEEDS``, of which the other notebooks read the first ``seeds``). F2, F3, F6
    and F11 read F6's models (nothing more is trained for them); F3 drives its simulations with their seeds and
    runs ``SIMULATION_SEEDS`` simulations of each system; the ablations vary the F6 models themselves (d_t ``dts``
    around ``base_dt``; ``measure_batch`` sequences per measured step); F11 evaluates every F6 model and seed on 100
    examples per held-out task with ``shots`` examples in context."""
    primary = {"gpt2", "diffeqformer"}

    def s(config: str, *, all_seeds: bool = False) -> list[Run]:
        n = PRIMARY_SEEDS if config in primary else seeds
        runs = seeded(Run(f"{preset}/{config}"), n, population=True)
        return runs if all_seeds else runs[:seeds]

    models = (("gpt", "gpt2"), ("shared", "shared"), ("ours", "diffeqformer"), ("llama", "llama"),
              ("ours_llama", "diffeqformer_llama"))
    return {
        "f1_model": dict(run=Run(f"{preset}/diffeqformer")),
        "f2_spectra": dict(runs=s("diffeqformer"), baselines={key: s(config) for key, config in models
                                                               if key != "ours"}),
        "f3_trajectories": dict(runs={key: s(config) for key, config in (("ours", "diffeqformer"),
                                                                          ("shared", "shared"))},
                                num_seeds=SIMULATION_SEEDS, num_tokens=40, horizon=10.0, num_saves=200,
                                euler_sweep=[200, 1000, 5000, 25000, 100000], model_tokens=40, model_saves=200),
        "f5_lyapunov": dict(run=Run(f"{preset}/diffeqformer"), synthetic_runs=s("synthetic_diffeqformer"),
                            max_tokens=48, map_tokens=24, timing_repeats=3, num_prompts=300),
        "f6_perplexity": dict(runs={key: s(config, all_seeds=True) for key, config in models}),
        "f7_finetuning": dict(runs=finetune_runs(preset)),
        **ablation_entries(preset, base_dt, dts, measure_batch=measure_batch, num_sequences=64, prefix="",
                           seeds=seeds, population=True, base_seeds=PRIMARY_SEEDS),
        "f11_downstream": dict(runs={key: s(config) for key, config in models}, num_examples=100, shots=shots),
    }


def gpu_corpus(entries: dict[str, dict[str, Any]], corpus: str) -> dict[str, dict[str, Any]]:
    """The gpu preset's ``entries`` with every run of ``GPU_LANGUAGE_MODELS`` trained on ``corpus`` and named
    ``gpu-<corpus>-...`` (so that its runs and the offline ones live side by side), and F11 evaluating the paper's
    tasks as well (from the Hugging Face hub); unchanged for ``shakespeare``. F5's synthetic model and F7's grid
    (plays <-> prose, two domains of the Shakespeare corpus) stay offline. The runs of one population stay one: every
    member gets the same ``--data.dataset`` override."""
    from ..data.corpora import DATASETS

    online = tuple(d for d in DATASETS if d not in ("shakespeare", "synthetic"))
    if corpus == "shakespeare":
        return entries
    if corpus not in online:
        raise ValueError(f"{GPU_CORPUS_VARIABLE} must be shakespeare (the default) or one of {', '.join(online)}, "
                         f"got {corpus!r}")

    def move(value):
        if isinstance(value, dict):
            return {k: move(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(move(v) for v in value)
        if not isinstance(value, Run) or value.module != "train" or value.config not in GPU_LANGUAGE_MODELS:
            return value
        name = f"gpu-{corpus}-{value.load().name.removeprefix('gpu-')}"
        overrides = configs.with_override(value.overrides, "name", name)
        return dataclasses.replace(value, overrides=(*overrides, "--data.dataset", corpus))

    moved = move(entries)
    moved["f11_downstream"] = {**moved["f11_downstream"], "paper_tasks": True}
    return moved


def __getattr__(name: str):
    """``PRESETS``, built on first use (PEP 562)."""
    if name == "PRESETS":
        return presets()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


BUILDERS = {
    # CI: a few training steps per run; checks that every notebook executes and the book builds.
    "smoke": lambda: _smoke(),
    # `make book`: 64-d models on the offline Shakespeare corpus, small enough to train on a CPU. The ablations
    # vary the F6 models (cpu/diffeqformer, cpu/gpt2); d_t takes three values, not five. F11: one example of 30 tokens
    # and the query fill the models' 64.
    "cpu": lambda: single_gpu_or_cpu("cpu", CPU_SEEDS, base_dt=8, dts=(2, 8, 32), measure_batch=16, shots=[0, 1]),
    # One GPU (an H100 or H200, or Colab's): the cpu preset's runs, notebooks and seeds at 8 times its width (512-d, 6
    # steps or layers, seq 256, 32 sequences a step) and 10 times its tokens per model (F1-F6, F8-F11: 320 steps, 2.6M
    # tokens, 1.3 epochs; F7: pretrainings 200 steps, 1.6M tokens, fine-tunings 40 steps, 0.33M tokens), in bfloat16
    # (trainer.mp of config/gpu/), on the offline corpus; DIFFEQFORMER_GPU_CORPUS=wikitext103 trains the language
    # models of F1-F6 and F8-F11 on WikiText-103 instead (gpu_corpus). F5's synthetic model is the cpu preset's. F7
    # fine-tunes with N = 9, 12, 18 and 24 (finetune.discretisations). d_t: the paper's GPT-small value 20, and a
    # factor of 4 either side of it. F11: zero- and five-shot as in the paper; online, the paper's tasks too.
    "gpu": lambda: gpu_corpus(single_gpu_or_cpu("gpu", GPU_SEEDS, base_dt=20, dts=(5, 20, 80), measure_batch=32,
                                                shots=[0, 5]), GPU_CORPUS),
    # The paper's configurations (Tables 1-2): multi-GPU/TPU.
    "paper": lambda: _paper(),
}
"""preset -> what builds its entries (``preset``)."""


@functools.cache
def preset(name: str) -> dict[str, dict[str, Any]]:
    """The entries of preset ``name``: notebook (file stem in ``notebooks/``, in execution order) -> parameter values.
    Built once, on first use: ``seeded`` and ``finetune_runs`` read the preset's config files."""
    return BUILDERS[name]()


def presets() -> dict[str, dict[str, dict[str, Any]]]:
    """Every preset's entries (``preset``): ``PRESETS``."""
    return {name: preset(name) for name in BUILDERS}


def _smoke() -> dict[str, dict[str, Any]]:
    """The smoke preset's entries: a few training steps per run. Its two seeds of GPT-2 and DiffEqFormer are each one
    population, as the cpu preset's seeds are, and its fine-tunings start from the first member of DiffEqFormer's or
    GPT-2's (``--pretrain.population 2``)."""
    def two(config: str) -> list[Run]:
        return seeded(Run(config), 2, population=True)

    def finetune(config: str) -> Run:
        return Run(config, ("--pretrain.population", "2"), module="finetune")

    return {
        "f1_model": dict(run=Run("smoke/diffeqformer"), num_times=401),
        "f2_spectra": dict(runs=two("smoke/diffeqformer"), baselines={"gpt": two("smoke/gpt2")}),  # F6's seeds
        "f3_trajectories": dict(runs={"ours": Run("smoke/diffeqformer"), "shared": Run("smoke/shared")}),
        "f5_lyapunov": dict(run=Run("smoke/diffeqformer"), synthetic_runs=[Run("smoke/synthetic_diffeqformer")]),
        # Two seeds of GPT-2 and DiffEqFormer: CI goes through the verdicts over seeds (seeds.RULE) once.
        "f6_perplexity": dict(runs={"gpt": two("smoke/gpt2"), "shared": Run("smoke/shared"),
                                    "ours": two("smoke/diffeqformer")}),
        "f7_finetuning": dict(runs={
            "smoke-diffeqformer": Run("smoke/diffeqformer"), "smoke-gpt2": Run("smoke/gpt2"),
            "smoke-finetune-diffeqformer-lora": finetune("smoke/finetune_diffeqformer_lora"),
            "smoke-finetune-diffeqformer-full": finetune("smoke/finetune_diffeqformer_full"),
            "smoke-finetune-gpt2-lora": finetune("smoke/finetune_gpt2_lora")}),
        # One variant of the smoke model changes every field an ablation varies (beta2, d_t, hypernetwork, step
        # placement): each notebook still compares two runs that differ in its field, and CI trains one run, not
        # four.
        "f8_beta2": dict(runs={"ours": [Run("smoke/diffeqformer"), SMOKE_VARIANT],
                               "gpt": [Run("smoke/gpt2"), variant("smoke/gpt2", "smoke-gpt2-beta2-0.95",
                                                                  {"optimizer.beta2": 0.95})]}),
        "f9_time_embedding": dict(runs=[SMOKE_VARIANT, Run("smoke/diffeqformer")], measure_batch=4,
                                  measure_steps=3),
        "f10_hypernetwork": dict(runs=[Run("smoke/diffeqformer"), SMOKE_VARIANT]),
        "x1_adaptive_steps": dict(run=Run("smoke/diffeqformer"), random_run=SMOKE_VARIANT, num_sequences=4,
                                  euler_steps=[1, 3, 6], fixed_steps=[2, 4], tolerances=[1e-2]),
        # F6's runs, a few examples per held-out task: CI goes through the harness, the tables and the verdicts
        "f11_downstream": dict(runs={"gpt": two("smoke/gpt2"), "shared": Run("smoke/shared"),
                                     "ours": two("smoke/diffeqformer")}, num_examples=8, shots=[0, 1]),
    }


def _paper() -> dict[str, dict[str, Any]]:
    """The paper's configurations (Tables 1-2), for many GPUs or a TPU pod."""
    return {
        "f1_model": dict(run=Run("paper/wikitext103_small_diffeqformer")),
        "f2_spectra": dict(runs=[Run("paper/wikitext103_small_diffeqformer")],
                           baselines={"gpt": [Run("paper/wikitext103_small_gpt2")]}),
        "f3_trajectories": dict(runs={"ours": Run("paper/wikitext103_small_diffeqformer")}, num_seeds=3,
                                num_tokens=40, horizon=10.0, num_saves=200,
                                euler_sweep=[200, 1000, 5000, 25000, 100000], model_tokens=40, model_saves=200),
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
        "f11_downstream": dict(runs={"gpt": Run("paper/owt_small_gpt2"),
                                     "ours": Run("paper/owt_small_diffeqformer")},
                               num_examples=1000, shots=[0, 5], paper_tasks=True),
    }
