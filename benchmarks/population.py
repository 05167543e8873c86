"""Seeds trained as one population against the same seeds trained as separate runs, on this machine.

    python benchmarks/population.py [--config config/cpu/synthetic_diffeqformer.yaml] [--seeds 3] [--steps 400]
                                    [--lanes 1|2]

Trains ``--seeds`` seeds of ``--config`` for ``--steps`` steps twice, in a scratch DIFFEQFORMER_HOME: as separate
runs (``python -m diffeqformer.train``, ``--lanes`` of them side by side, as the workflow runs training jobs side by
side) and as one population (``python -m diffeqformer.population``; with ``--lanes 2``, two populations side by side,
so that both compete for the cores the way the workflow's training jobs do). Prints the wall-clock seconds of each,
the seconds per training step after the first 50 (from the runs' metrics: compilation and start-up left out) per
seed, and the ratios (separate / population): above 1, the population is faster.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def seconds_per_step(run_dir: Path, skip: int = 50) -> float:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    times = sorted((r["step"], r["time"]) for r in records if r.get("step") is not None and "train/loss" in r)
    later = [t for step, t in times if step >= skip]
    if len(later) < 2:
        raise SystemExit(f"error: {run_dir} logged fewer than two steps after step {skip}: raise --steps")
    return (later[-1] - later[0]) / (len(later) - 1)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="config/cpu/synthetic_diffeqformer.yaml")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--lanes", type=int, choices=(1, 2), default=2)
    args = parser.parse_args(argv)
    if args.seeds < 2:
        raise SystemExit("error: --seeds must be at least 2")
    if args.steps < 100:
        raise SystemExit("error: --steps must be at least 100 (the first 50 are left out)")

    home = Path(tempfile.mkdtemp(prefix="population-benchmark-"))
    data = REPO / "data"
    (home / "data").symlink_to(data, target_is_directory=True)
    env = {**os.environ, "DIFFEQFORMER_HOME": str(home), "TOKENIZERS_PARALLELISM": "false",
           "JAX_COMPILATION_CACHE_DIR": str(home / "jax-cache")}
    common = ["--config", args.config, "--trainer.num_train_steps", str(args.steps)]

    def side_by_side(commands: list[list[str]]) -> float:
        start = time.perf_counter()
        pending = list(commands)
        running: list[subprocess.Popen] = []
        while pending or running:
            while pending and len(running) < args.lanes:
                running.append(subprocess.Popen([sys.executable, "-m", *pending.pop(0)], env=env, cwd=REPO,
                                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            for proc in list(running):
                if proc.poll() is not None:
                    if proc.returncode != 0:
                        raise SystemExit(f"error: {proc.args} exited with {proc.returncode}")
                    running.remove(proc)
            time.sleep(0.2)
        return time.perf_counter() - start

    # warm the compilation cache and the token caches once, so that neither side pays for them
    side_by_side([["diffeqformer.train", *common, "--name", "warm", "--trainer.num_train_steps", "2"]])
    separate_runs = [["diffeqformer.train", *common, "--name", f"solo-{k}", "--trainer.seed", str(k)]
                     for k in range(args.seeds * args.lanes)]
    populations = [["diffeqformer.population", *common, "--seeds", str(args.seeds), "--name", f"pop-{lane}",
                    "--trainer.seed", str(lane * args.seeds)] for lane in range(args.lanes)]
    separate_s = side_by_side(separate_runs)
    population_s = side_by_side(populations)
    solo_step = sum(seconds_per_step(home / "runs" / f"solo-{k}") for k in range(len(separate_runs))) \
        / len(separate_runs)
    population_step = sum(seconds_per_step(home / "runs" / f"pop-{lane}") for lane in range(args.lanes)) / args.lanes
    print(f"{args.config}: {args.lanes * args.seeds} seeds of {args.steps} steps, {args.lanes} lane(s) side by side")
    print(f"separate runs:  {separate_s:7.1f} s wall, {solo_step:.4f} s per step of one seed")
    print(f"populations of {args.seeds}: {population_s:6.1f} s wall, {population_step / args.seeds:.4f} s per step "
          f"per seed ({population_step:.4f} s per step of all {args.seeds})")
    print(f"speed-up, wall: {separate_s / population_s:.2f}x; per step: {args.seeds * solo_step / population_step:.2f}x")


if __name__ == "__main__":
    main()
