"""The LoRA learning rate of each pretrained model, chosen by the same small sweep (F7), on a tuning split.

    python benchmarks/lora_sweep.py [--preset cpu] [--rates 2.5e-4 5e-4 1e-3 2e-3] [--direction plays prose]
                                    [--seeds 1]

Fine-tunes the preset's 18-step DiffEqFormer (discretised to its own 18 steps) and its 24-layer GPT-2 with the
preset's LoRA template (``config/<preset>/finetune_lora.yaml``) at each learning rate, on one direction of the Fig. 5
grid, exactly as ``finetune.finetune_grid`` names them but for ``--optimizer.learning_rate`` and ``--data.tuning``
(seed k from pretraining seed k). Pretrains what is missing first (a population, where the grid pretrains one). Runs
go to ``$DIFFEQFORMER_HOME/runs`` (default: a scratch folder that is kept and printed).

The rate is chosen on the target domain's tuning split (``corpora.tuning_split``), never on the validation split that
F7's verdicts are computed on: each fine-tuning trains on the domain's training documents less its tuning documents
(the first in ``split_key`` order, as much text as the validation split) and is evaluated on those, with dropout on
for every rate alike. Prints each model's tuning-split perplexity before and after fine-tuning at each rate, and per
model the rate with the lowest perplexity after. (Two earlier criteria and why neither is kept: book, Measurements,
"LoRA and its learning rate".)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="cpu")
    parser.add_argument("--rates", type=float, nargs="+", default=[2.5e-4, 5e-4, 1e-3, 2e-3])
    parser.add_argument("--direction", nargs=2, default=["plays", "prose"], metavar=("SOURCE", "TARGET"))
    parser.add_argument("--seeds", type=int, default=1, help="fine-tuning seeds at each rate")
    args = parser.parse_args(argv)
    if any(not (math.isfinite(r) and r > 0) for r in args.rates):
        raise SystemExit(f"error: --rates must be positive, got {args.rates}")
    if args.seeds < 1:
        raise SystemExit(f"error: --seeds must be at least 1, got {args.seeds}")
    home = Path(os.environ.get("DIFFEQFORMER_HOME") or tempfile.mkdtemp(prefix="lora-sweep-"))
    env = {**os.environ, "DIFFEQFORMER_HOME": str(home)}
    os.environ["DIFFEQFORMER_HOME"] = str(home)
    from diffeqformer.finetune import finetune_grid

    source, target = args.direction
    grid = finetune_grid(args.preset)
    lora = [r for r in grid if r.module == "diffeqformer.finetune" and r.name.endswith("-lora")
            and f"-{source}-to-{target}" in r.name and ("-n" not in r.name or r.name.endswith("-n18-lora"))]
    if len(lora) != 2:
        raise SystemExit(f"error: the {args.preset} grid has no direction {source} -> {target} with N = 18")
    pretrain = {r.name: r for r in grid if r.module == "diffeqformer.train"}

    def pretraining_argv(r) -> list[str]:
        """A pretraining of the grid: alone, or its whole population (it is trained as one)."""
        if not r.population:
            return r.argv()
        return ["-m", "diffeqformer.population", "--config", str(r.config), "--seeds", str(len(r.population))]

    def run(argv: list[str]) -> None:
        subprocess.run([sys.executable, *argv], cwd=REPO, env=env, check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)

    rows = []
    for base in lora:
        for name in base.after:
            if not (home / "runs" / name / "complete.json").exists():
                print(f"pretraining {name}", flush=True)
                run(pretraining_argv(pretrain[name]))
        population = "--pretrain.population" in base.overrides
        for rate in args.rates:
            for seed in range(args.seeds):
                name = f"{base.name}-tuning-lr{rate:g}" + (f"-seed{seed}" if seed else "")
                overrides = [*base.argv(), "--name", name, "--optimizer.learning_rate", str(rate), "--data.tuning",
                             "true", "--trainer.seed", str(seed),
                             *(["--pretrain.member", str(seed)] if population else [])]
                print(f"fine-tuning {name}", flush=True)
                run(overrides)
                done = json.loads((home / "runs" / name / "complete.json").read_text())
                rows.append((base.name, rate, seed, math.exp(done["pretrained_eval_loss"]),
                             math.exp(done["final_eval_loss"])))

    print(f"\nruns in {home / 'runs'}\n")
    print(f"{'model':<55} {'rate':>8} {'seed':>4} {'tuning before':>13} {'tuning after':>12}")
    for model, rate, seed, before, after in rows:
        print(f"{model:<55} {rate:>8g} {seed:>4} {before:>13.1f} {after:>12.1f}")
    for model in dict.fromkeys(r[0] for r in rows):
        means = {rate: sum(r[4] for r in rows if r[0] == model and r[1] == rate) / args.seeds for rate in args.rates}
        best = min(means, key=means.get)
        print(f"best rate for {model}: {best:g} (tuning-split perplexity {means[best]:.1f})")


if __name__ == "__main__":
    main()
