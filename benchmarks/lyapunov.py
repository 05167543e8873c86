"""token_lyapunov at one output position: our reverse-mode rows vs the direct method (full Jacobian per step).

    python benchmarks/lyapunov.py [--run runs/cpu-diffeqformer] [--tokens N] [--repeats 3] [--atol 1e-4]

Uses a trained run's model if it exists (else a random model of the cpu preset's size). --tokens defaults to the
model's max_seq_len and may not exceed it: a longer sequence's positions lie outside the learned position table,
whose lookup clamps them (every position from max_seq_len on got the last position's embedding). Both methods are
compiled first; the printed times are medians over repeats, after compilation.

It also checks that the two methods agree (lyapunov.compare_exponents): it counts each method's finite, -inf, +inf
and NaN exponents, and compares the values only where both are finite (|-inf - -inf| is NaN). It exits non-zero if
the methods disagree on which exponents are finite, if none is finite in both, or if the finite ones differ by more
than --atol (default 1e-4, the tolerance of the fast-vs-direct test in tests/test_lyapunov.py).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import haliax as hax
import jax
import numpy as np

from diffeqformer import DiffEqFormerConfig
from diffeqformer.analysis.lyapunov import VALUE_KINDS, compare_exponents, token_lyapunov


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", default="runs/cpu-diffeqformer")
    p.add_argument("--tokens", type=int, default=None, help="sequence length (default: the model's max_seq_len)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--atol", type=float, default=1e-4,
                   help="largest |difference| allowed between the two methods' finite exponents")
    args = p.parse_args()

    if (Path(args.run) / "complete.json").exists():
        from diffeqformer.runs import load_model

        model, source = load_model(args.run), args.run
    else:
        config = DiffEqFormerConfig(max_seq_len=128, hidden_dim=128, num_layers=6, num_heads=4, time_embed_dim=8,
                                    sinusoidal_dim=32)
        model, source = config.build(hax.Axis("vocab", 4096), key=jax.random.PRNGKey(0)), "random cpu-size model"
    tokens = model.config.max_seq_len if args.tokens is None else args.tokens
    if not 1 <= tokens <= model.config.max_seq_len:
        sys.exit(f"--tokens must be between 1 and the model's max_seq_len ({model.config.max_seq_len}), got {tokens}")
    ids = np.asarray(jax.random.randint(jax.random.PRNGKey(1), (tokens,), 0, model.Vocab.size), dtype=np.int32)

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
    print(f"# {source}: {tokens} tokens, D={cfg.hidden_dim}, {cfg.num_layers} steps, device "
          f"{jax.devices()[0].device_kind}; median of {args.repeats} after compilation")
    for name, s in times.items():
        print(f"{name:<28} {s:8.2f} s")
    fast, direct = times.values()
    print(f"speed-up: {direct / fast:.1f}x")

    check = compare_exponents(a, b, names=tuple(times))
    for name, counts in check.counts.items():
        print(f"{name:<28} " + ", ".join(f"{counts[k]} {k}" for k in VALUE_KINDS) + f" of {a.size} exponents")
    problems = []
    if check.mismatched:
        problems.append(f"the methods disagree on which exponents are finite at {check.mismatched} of {a.size}")
    if check.compared == 0:
        print("max |difference| of exponents: none finite in both methods")
        problems.append("no exponent is finite in both methods: nothing was compared")
    else:
        print(f"max |difference| over the {check.compared} exponents finite in both: {check.max_abs_difference:.2e} "
              f"(tolerance {args.atol:.0e})")
        if not check.max_abs_difference <= args.atol:
            problems.append(f"the finite exponents differ by {check.max_abs_difference:.2e} > {args.atol:.0e}")
    if problems:
        sys.exit("FAILED: " + "; ".join(problems))


if __name__ == "__main__":
    main()
