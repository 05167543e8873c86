"""What training without buffer donation costs: tokens/s of one configuration trained by Levanter's own trainer (the
train state donated to each step) and by ``diffeqformer.train.Trainer`` (not donated, which makes a resumed run
bit-identical; see its docstring), each in a fresh process, taking turns.

    python benchmarks/donation.py [--config config/cpu/diffeqformer.yaml] [--steps 100] [--rounds 2]

Prints each run's median tokens/s (``train.median_throughput``) and the ratio undonated/donated.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from diffeqformer import paths


def _train(config: str, steps: int, donated: bool, run_dir: Path) -> float:
    """Train in this process; ``donated`` swaps in Levanter's own trainer."""
    from levanter.trainer import Trainer as LevanterTrainer

    from diffeqformer import train

    if donated:
        train.Trainer = LevanterTrainer
    overrides = ["--trainer.num_train_steps", str(steps), "--trainer.steps_per_eval", str(steps),
                 "--run_dir", str(run_dir)]
    train.use_compilation_cache()
    return train.main(train.load_config(config, overrides))["tokens_per_second"]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=str(paths.CONFIG / "cpu" / "diffeqformer.yaml"))
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--worker", choices=["donated", "undonated"], help=argparse.SUPPRESS)
    p.add_argument("--run-dir", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        print(json.dumps(_train(args.config, args.steps, args.worker == "donated", Path(args.run_dir))))
        return
    results: dict[str, list[float]] = {"donated": [], "undonated": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for variant in results:
                run_dir = Path(tmp) / f"{variant}-{r}"
                out = subprocess.run([sys.executable, __file__, "--config", args.config, "--steps", str(args.steps),
                                      "--worker", variant, "--run-dir", str(run_dir)],
                                     capture_output=True, text=True, check=True)
                results[variant].append(json.loads(out.stdout.strip().splitlines()[-1]))
                print(f"round {r + 1}: {variant:9s} {results[variant][-1]:9.0f} tokens/s", flush=True)
    donated, undonated = (statistics.median(results[v]) for v in ("donated", "undonated"))
    print(f"{Path(args.config).relative_to(paths.REPO)}, {args.steps} steps: donated {donated:.0f} tokens/s, "
          f"undonated {undonated:.0f} tokens/s, ratio undonated/donated {undonated / donated:.3f}")


if __name__ == "__main__":
    main()
