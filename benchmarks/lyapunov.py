"""token_lyapunov at one output position: our reverse-mode rows vs the direct method (full Jacobian per step).

    python benchmarks/lyapunov.py [--run runs/cpu-diffeqformer] [--tokens 128] [--repeats 3]

Uses a trained run's model if it exists (else a random model of the cpu preset's size). Both methods are compiled
first; the printed times are medians over repeats, after compilation.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import haliax as hax
import jax
import numpy as np

from diffeqformer import DiffEqFormerConfig
from diffeqformer.lyapunov import token_lyapunov


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", default="runs/cpu-diffeqformer")
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()

    if (Path(args.run) / "complete.json").exists():
        from diffeqformer.train import load_model

        model, source = load_model(args.run), args.run
    else:
        config = DiffEqFormerConfig(max_seq_len=128, hidden_dim=128, num_layers=6, num_heads=4, time_embed_dim=8,
                                    sinusoidal_dim=32)
        model, source = config.build(hax.Axis("vocab", 4096), key=jax.random.PRNGKey(0)), "random cpu-size model"
    ids = np.asarray(jax.random.randint(jax.random.PRNGKey(1), (args.tokens,), 0, model.Vocab.size), dtype=np.int32)

    times = {}
    results = {}
    for name, direct in (("fast (D reverse-mode rows)", False), ("direct (full Jacobian)", True)):
        results[name] = token_lyapunov(model, ids, direct=direct)  # compiles
        runs = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            token_lyapunov(model, ids, direct=direct).exponents.values
            runs.append(time.perf_counter() - t0)
        times[name] = statistics.median(runs)
    a, b = (results[k].exponents.values for k in times)
    cfg = model.config
    print(f"# {source}: {args.tokens} tokens, D={cfg.hidden_dim}, {cfg.num_layers} steps, device "
          f"{jax.devices()[0].device_kind}; median of {args.repeats} after compilation")
    for name, s in times.items():
        print(f"{name:<28} {s:8.2f} s")
    fast, direct = times.values()
    print(f"speed-up: {direct / fast:.1f}x; max |difference| of exponents: {np.nanmax(np.abs(a - b)):.2e}")


if __name__ == "__main__":
    main()
