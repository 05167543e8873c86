"""Validation perplexity against vector-field evaluations (NFE) for Diffrax solvers on a trained DiffEqFormer.

    python benchmarks/solvers.py [--run runs/cpu-diffeqformer] [--sequences 64] [--tolerances 1e-1 1e-2 ...]
    python benchmarks/solvers.py --euler-only --run runs/cpu-diffeqformer --run runs/cpu-diffeqformer-random-steps

The first form sweeps fixed-step Euler (training grid), Heun and midpoint over --steps and Tsit5 with a PID controller
over --tolerances (``diffeqformer.analysis.inference.solver_sweep``); the second sweeps Euler alone over 1..24 steps
for each run and prints the runs side by side. Validation sequences are the first --sequences of each run's own validation
set. Tables are cached (CSV + JSON sidecar, keyed by a hash of model, data and settings) in <run>/inference/, with a
figure beside them; a run that does not exist is replaced by a random model of the cpu preset's size on random
tokens (NFE and timings only). Wall times exclude compilation.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import jax
import numpy as np
import pandas as pd

from diffeqformer import DiffEqFormerConfig
from diffeqformer.analysis.inference import (
    SweepConfig,
    TokenData,
    cached_sweep,
    validation_data,
)
from diffeqformer.report.plots.language import perplexity_vs_nfe, perplexity_vs_steps

SHOWN = ["solver", "steps", "tolerance", "nfe", "nfe_min", "nfe_max", "rejected_steps", "loss", "perplexity", "wall_s",
         "max_steps_hit"]


def load(run: str, sequences: int):
    """(model, data, label) of a finished run, or of a random cpu-size model on random tokens."""
    if (Path(run) / "complete.json").exists():
        from diffeqformer.runs import load_model

        return load_model(run), validation_data(run, sequences), run
    import haliax as hax

    config = DiffEqFormerConfig(max_seq_len=128, hidden_dim=128, num_layers=6, num_heads=4, time_embed_dim=8,
                                sinusoidal_dim=32)
    model = config.build(hax.Axis("vocab", 4096), key=jax.random.PRNGKey(0))
    tokens = np.asarray(jax.random.randint(jax.random.PRNGKey(1), (sequences, config.max_seq_len), 0, 4096))
    print(f"# {run} not found: a random model of the cpu preset's size on random tokens")
    return model, TokenData.from_tokens(tokens, "random"), f"random model ({run} missing)"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", action="append", help="run directory (repeat with --euler-only to compare runs)")
    p.add_argument("--sequences", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--steps", type=int, nargs="+", default=[1, 2, 3, 4, 6, 8, 12, 16, 24])
    p.add_argument("--fixed", nargs="+", default=["euler", "heun", "midpoint"])
    p.add_argument("--adaptive", nargs="*", default=["tsit5"])
    p.add_argument("--tolerances", type=float, nargs="+", default=[1e-1, 1e-2, 1e-3, 1e-4])
    p.add_argument("--max-steps", type=int, default=4096)
    p.add_argument("--euler-only", action="store_true", help="Euler on the training grid at 1..24 steps")
    args = p.parse_args()
    runs = args.run or ["runs/cpu-diffeqformer"]

    if args.euler_only:
        config = SweepConfig(fixed_solvers=("euler",), steps=tuple(range(1, 25)), adaptive_solvers=(), tolerances=(),
                             batch_size=args.batch_size)
    else:
        config = SweepConfig(fixed_solvers=tuple(args.fixed), steps=tuple(args.steps),
                             adaptive_solvers=tuple(args.adaptive), tolerances=tuple(args.tolerances),
                             max_steps=args.max_steps, batch_size=args.batch_size)

    frames = {}
    for run in runs:
        model, data, label = load(run, args.sequences)
        out = Path(run) / "inference" if Path(run).exists() else Path("runs") / "inference-random"
        frame = cached_sweep(model, data, config, out)
        frames[label] = frame
        L = model.config.num_layers
        print(f"\n# {label}: {data.num_sequences} validation sequences x {data.tokens.shape[1]} tokens, "
              f"trained with L = {L} Euler steps; device {jax.devices()[0].device_kind}")
        print(f"# NFE per sequence (mean, min, max): {frame.attrs['nfe_convention']}")
        print("# compile + first chunk per solver (s): "
              + ", ".join(f"{k} {v:.1f}" for k, v in frame.attrs.get("compile_s", {}).items()))
        if not args.euler_only:
            with pd.option_context("display.width", 200, "display.max_columns", 20, "display.float_format",
                                   "{:.4g}".format):
                print(frame[SHOWN].to_string(index=False))
            fig = perplexity_vs_nfe(frame, title=f"{Path(run).name}: perplexity vs NFE")
            fig.savefig(out / "perplexity_vs_nfe.png", dpi=120)
            print(f"# figure: {out / 'perplexity_vs_nfe.png'}")

    if args.euler_only:
        table = pd.DataFrame({label: f.set_index("steps")["perplexity"] for label, f in frames.items()})
        table.index.name = "euler steps N"
        with pd.option_context("display.width", 200, "display.float_format", "{:.2f}".format):
            print("\n# validation perplexity, Euler on the training grid t_k = (k+1)/N")
            print(table.to_string())
        fig = perplexity_vs_steps(frames)
        path = Path(runs[0]) / "inference" / "perplexity_vs_euler_steps.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=120)
        print(f"# figure: {path}")


if __name__ == "__main__":
    main()
