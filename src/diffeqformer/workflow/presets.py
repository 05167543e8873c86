"""The registry: per preset, which notebooks run with which parameter values (built on first use), and
the ``Run`` values that stand for training runs in it."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from .. import config as configs
from .. import paths
from ..finetune import finetune_grid


@dataclass(frozen=True)
class Run:
    """The training run of ``config/<config>.yaml`` as a notebook parameter: the workflow trains it and passes the
    notebook its run directory."""

    config: str
    """Path below ``config/`` without ``.yaml``, e.g. ``"cpu/gpt2"``."""
    overrides: tuple[str, ...] = ()
    """draccus-style overrides, e.g. ``("--name", "cpu-x-dt4", "--model.time_embed_dim", "4")``."""
    module: str = "train"
    """``"train"`` or ``"finetune"`` (trained after its pretraining)."""
    population: tuple[int, ...] = ()
    """The trainer seeds of the population this run is a member of, trained together as one vmapped model."""

    @property
    def path(self) -> Path:
        return paths.CONFIG / f"{self.config}.yaml"

    @property
    def key(self) -> str:
        """How the plan's messages name the run."""
        key = " ".join((self.config, *self.overrides))
        return key + f" [population of seeds {', '.join(map(str, self.population))}]" if self.population else key

    @property
    def population_key(self) -> tuple:
        """What the members of one population share (all but name, seed and ``pretrain.member``)."""
        return (self.config, configs.without_overrides(self.overrides, "name", "trainer.seed", "pretrain.member"),
                self.population)

    def load(self):
        """The resolved configuration (``TrainConfig``, or ``FinetuneConfig`` for a fine-tuning)."""
        cls = configs.FinetuneConfig if self.module == "finetune" else configs.TrainConfig
        return configs.load_config(self.path, list(self.overrides), cls=cls)

    def resolve(self) -> tuple[Any, str, Path, Path | None]:
        """(configuration, config hash, run directory, a fine-tuning's pretraining directory or None); a fine-tuning's
        hash covers its pretraining's, computed from the config files, before the pretraining has run."""
        cfg = self.load()
        if self.population and cfg.trainer.seed not in self.population:
            raise ValueError(f"its trainer.seed {cfg.trainer.seed} is not one of its population's {self.population}")
        population = list(self.population) or None
        if self.module == "finetune":
            digest = configs.config_hash(cfg, population=population,
                                         pretrain_config_hash=configs.pretraining_hash(cfg))
            return cfg, digest, configs.run_dir_of(cfg), configs.pretraining_of(cfg)[1]
        return cfg, configs.config_hash(cfg, population=population), configs.run_dir_of(cfg), None


def variant(config: str, name: str, values: Mapping[str, Any]) -> Run:
    """The run of ``config`` with some fields changed (``{"model.time_embed_dim": 4}``), named ``name``."""
    return Run(config, ("--name", name, *configs.override_args(values)))


def seeded(run: Run, n: int, *, population: bool = False) -> list[Run]:
    """``run`` (kept as the first seed, so a preset that adds seeds keeps its finished runs) and ``n - 1`` copies with
    the next ``trainer.seed`` values, named ``<name>-seed<k>``; with ``population``, trained as one vmapped model."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"a comparison needs a positive number of seeds, got {n!r}")
    resolved = run.load()
    name, base_seed = resolved.name, resolved.trainer.seed
    overrides = configs.without_overrides(run.overrides, "name", "trainer.seed")
    seeds = tuple(base_seed + k for k in range(n)) if population and n > 1 else ()
    return [dataclasses.replace(run, population=seeds)] + [
        Run(run.config, (*overrides, "--name", f"{name}-seed{k}", "--trainer.seed", str(base_seed + k)), run.module,
            seeds) for k in range(1, n)]


def finetune_runs(preset: str) -> dict[str, Run]:
    """Every run of the Fig. 5 experiment (``finetune.finetune_grid``), pretrainings first, keyed by run name."""
    return {g.name: Run(str(g.config.relative_to(paths.CONFIG).with_suffix("")), tuple(g.overrides),
                        "finetune" if g.module.endswith("finetune") else "train", tuple(g.population))
            for g in finetune_grid(preset)}


INFERENCE_SWEEP = dict(euler_steps=list(range(1, 25)), fixed_steps=[1, 2, 3, 4, 6, 8, 12, 16, 24],
                       tolerances=[1e-1, 3e-2, 1e-2, 3e-3, 1e-3])
"""Step counts and tolerances of the adaptive-inference notebook in the cpu, gpu and paper presets."""


def ablation_entries(preset: str, base_dt: int, dts: tuple[int, ...], *, measure_batch: int,
                     num_sequences: int, prefix: str = "", seeds: int = 1,
                     population: bool = False, base_seeds: int | None = None) -> dict[str, dict[str, Any]]:
    """The entries of F8-F10 and x1 over the base models ``config/<preset>/<prefix>{diffeqformer,gpt2}.yaml``: d_t
    ``dts`` around ``base_dt``, each setting with ``seeds`` seeds; the bases trained with ``base_seeds`` in one
    population, of which the ablations read the first ``seeds``."""
    ours, gpt = f"{preset}/{prefix}diffeqformer", f"{preset}/{prefix}gpt2"
    stem = f"{preset}-{prefix.replace('_', '-')}"

    def s(run: Run) -> list[Run]:
        return seeded(run, seeds, population=population)

    def base(config: str) -> list[Run]:
        return seeded(Run(config), base_seeds or seeds, population=population)[:seeds]

    def var(config: str, name: str, field: str, value) -> Run:
        return variant(config, f"{stem}{name}", {field: value})

    return {
        "f8_beta2": dict(runs={
            "ours": [base(ours), s(var(ours, "diffeqformer-beta2-0.95", "optimizer.beta2", 0.95))],
            "gpt": [base(gpt), s(var(gpt, "gpt2-beta2-0.95", "optimizer.beta2", 0.95))]}),
        "f9_time_embedding": dict(runs=[base(ours) if d == base_dt else s(var(
            ours, f"diffeqformer-dt{d}", "model.time_embed_dim", d)) for d in dts], measure_batch=measure_batch,
            measure_steps=10),
        "f10_hypernetwork": dict(runs=[base(ours), s(var(ours, "diffeqformer-shared-mlp", "model.hypernet",
                                                         "shared_mlp"))]),
        "x1_adaptive_steps": dict(run=Run(ours), random_run=var(ours, "diffeqformer-random-steps",
                                                                "model.random_step_offset", True),
                                  num_sequences=num_sequences, **INFERENCE_SWEEP),
    }


CPU_SEEDS = 3
"""Seeds of every setting F5, F6 and F8-F10 compare in the cpu and gpu presets (the book's rule needs two), one
population each."""
PRIMARY_SEEDS = 6
"""Seeds of F6's primary comparison, DiffEqFormer against GPT-2 (``statistics.detectable_difference``); the other
notebooks read the first ``CPU_SEEDS`` of the same populations."""
SIMULATION_SEEDS = 12
"""Simulations of each F3 system: ``analysis.clustering.simulations_needed()``, the fewest whose one-sample t-test
detects the slope the paper implies (-0.2 per unit p) 80% of the time at p < 0.05 whatever their spread (the
workflow's plan does not import the analysis; a test holds the two equal)."""
def single_gpu_or_cpu(preset: str, seeds: int, *, base_dt: int, dts: tuple[int, ...], measure_batch: int,
                      shots: list[int]) -> dict[str, dict[str, Any]]:
    """The entries of the cpu preset, and of the gpu preset at a larger scale: F2, F3, F6 and F11 read F6's models
    (GPT-2 and DiffEqFormer with ``PRIMARY_SEEDS``, the rest with ``seeds``); the ablations vary them."""
    models = (("gpt", "gpt2"), ("shared", "shared"), ("ours", "diffeqformer"), ("llama", "llama"),
              ("ours_llama", "diffeqformer_llama"))

    def s(config: str, *, all_seeds: bool = False) -> list[Run]:
        runs = seeded(Run(f"{preset}/{config}"), PRIMARY_SEEDS if config in ("gpt2", "diffeqformer") else seeds,
                      population=True)
        return runs if all_seeds else runs[:seeds]

    return {
        "f1_model": dict(run=Run(f"{preset}/diffeqformer")),
        "f2_spectra": dict(runs=s("diffeqformer"), baselines={k: s(c) for k, c in models if k != "ours"}),
        "f3_trajectories": dict(runs={k: s(c) for k, c in (("ours", "diffeqformer"), ("shared", "shared"))},
                                num_seeds=SIMULATION_SEEDS, num_tokens=40, horizon=10.0, num_saves=200,
                                euler_sweep=[200, 1000, 5000, 25000, 100000], sweep_seeds=8, model_tokens=40,
                                model_saves=200),
        "f5_lyapunov": dict(run=Run(f"{preset}/diffeqformer"), synthetic_runs=s("synthetic_diffeqformer"),
                            max_tokens=48, map_tokens=24, timing_repeats=3, num_prompts=300),
        "f6_perplexity": dict(runs={k: s(c, all_seeds=True) for k, c in models}),
        "f7_finetuning": dict(runs=finetune_runs(preset)),
        **ablation_entries(preset, base_dt, dts, measure_batch=measure_batch, num_sequences=64,
                           seeds=seeds, population=True, base_seeds=PRIMARY_SEEDS),
        "f11_downstream": dict(runs={k: s(c) for k, c in models}, num_examples=100, shots=shots),
    }


def _smoke() -> dict[str, dict[str, Any]]:
    """A few training steps per run; two seeds of GPT-2 and DiffEqFormer (one population each), so that CI goes
    through the verdicts over seeds; one variant changes every field an ablation varies."""
    def two(config: str) -> list[Run]:
        return seeded(Run(config), 2, population=True)

    def finetune(config: str) -> Run:
        return Run(config, ("--pretrain.population", "2"), module="finetune")

    ours, gpt, variant_ = Run("smoke/diffeqformer"), Run("smoke/gpt2"), variant(
        "smoke/diffeqformer", "smoke-diffeqformer-variant", {"optimizer.beta2": 0.95, "model.time_embed_dim": 2,
                                                             "model.hypernet": "shared_mlp",
                                                             "model.random_step_offset": True})
    f6 = {"gpt": two("smoke/gpt2"), "shared": Run("smoke/shared"), "ours": two("smoke/diffeqformer")}
    return {
        "f1_model": dict(run=ours, num_times=401),
        "f2_spectra": dict(runs=two("smoke/diffeqformer"), baselines={"gpt": two("smoke/gpt2")}),
        "f3_trajectories": dict(runs={"ours": ours, "shared": Run("smoke/shared")}),
        "f5_lyapunov": dict(run=ours, synthetic_runs=[Run("smoke/synthetic_diffeqformer")]),
        "f6_perplexity": dict(runs=f6),
        "f7_finetuning": dict(runs={
            "smoke-diffeqformer": ours, "smoke-gpt2": gpt,
            **{f"smoke-finetune-{n}": finetune(f"smoke/finetune_{n.replace('-', '_')}")
               for n in ("diffeqformer-lora", "diffeqformer-full", "gpt2-lora")}}),
        "f8_beta2": dict(runs={"ours": [ours, variant_], "gpt": [gpt, variant("smoke/gpt2", "smoke-gpt2-beta2-0.95",
                                                                              {"optimizer.beta2": 0.95})]}),
        "f9_time_embedding": dict(runs=[variant_, ours], measure_batch=4, measure_steps=3),
        "f10_hypernetwork": dict(runs=[ours, variant_]),
        "x1_adaptive_steps": dict(run=ours, random_run=variant_, num_sequences=4, euler_steps=[1, 3, 6],
                                  fixed_steps=[2, 4], tolerances=[1e-2]),
        "f11_downstream": dict(runs=f6, num_examples=8, shots=[0, 1]),
    }


def _paper() -> dict[str, dict[str, Any]]:
    """The paper's configurations (Tables 1-2), for many GPUs or a TPU pod."""
    def p(name: str) -> Run:
        return Run(f"paper/{name}")

    ours = p("wikitext103_small_diffeqformer")
    return {
        "f1_model": dict(run=ours),
        "f2_spectra": dict(runs=[ours], baselines={"gpt": [p("wikitext103_small_gpt2")]}),
        "f3_trajectories": dict(runs={"ours": ours}, num_seeds=3, num_tokens=40, horizon=10.0, num_saves=200,
                                euler_sweep=[200, 1000, 5000, 25000, 100000], sweep_seeds=3, model_tokens=40,
                                model_saves=200),
        "f5_lyapunov": dict(run=ours, synthetic_runs=[p("synthetic_diffeqformer")], max_tokens=128, map_tokens=48,
                            timing_repeats=3, num_prompts=1000),
        "f6_perplexity": dict(runs={k: p(c) for k, c in (
            ("gpt", "wikitext103_small_gpt2"), ("shared", "wikitext103_small_shared"),
            ("ours", "wikitext103_small_diffeqformer"), ("gpt_medium", "wikitext103_medium_gpt2"),
            ("ours_medium", "wikitext103_medium_diffeqformer"), ("owt_gpt_small", "owt_small_gpt2"),
            ("owt_ours_small", "owt_small_diffeqformer"), ("owt_gpt_large", "owt_large_gpt2"),
            ("owt_ours_large", "owt_large_diffeqformer"), ("llama", "owt_llama_1b_llama"),
            ("ours_llama", "owt_llama_1b_diffeqformer"))}),
        "f7_finetuning": dict(runs=finetune_runs("paper")),
        **ablation_entries("paper", 20, (20, 48, 72, 96, 120, 144), measure_batch=8, num_sequences=256,
                           prefix="ablation_"),
        "f11_downstream": dict(runs={"gpt": p("owt_small_gpt2"), "ours": p("owt_small_diffeqformer")},
                               num_examples=1000, shots=[0, 5], paper_tasks=True),
    }


BUILDERS = {
    "smoke": lambda: _smoke(),  # CI: every notebook executes and the book builds
    "cpu": lambda: single_gpu_or_cpu("cpu", CPU_SEEDS, base_dt=8, dts=(2, 8, 32), measure_batch=16, shots=[0, 1]),
    # one GPU: the cpu preset at 8 times its width and 10 times its tokens, in bfloat16 (config/gpu/)
    "gpu": lambda: single_gpu_or_cpu("gpu", CPU_SEEDS, base_dt=20, dts=(5, 20, 80), measure_batch=32, shots=[0, 5]),
    "paper": lambda: _paper(),  # the paper's configurations: multi-GPU/TPU
}
"""preset -> what builds its entries."""


@functools.cache
def preset(name: str) -> dict[str, dict[str, Any]]:
    """The entries of preset ``name``: notebook (in execution order) -> parameter values, built once."""
    return BUILDERS[name]()


def presets() -> dict[str, dict[str, dict[str, Any]]]:
    """Every preset's entries."""
    return {name: preset(name) for name in BUILDERS}

