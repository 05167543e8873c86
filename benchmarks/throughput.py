"""Training throughput of DiffEqFormer against GPT-2 at the same dimensions, in one process.

    python benchmarks/throughput.py [--preset tiny|cpu|gpu|small] [--time-embed-dims 4 8 20] [--rounds 5]

Each model's train step (forward, backward, AdamW update; Levanter's loss) is compiled once, then the models take
turns, ``--steps`` timed steps each per round, so that drifts of the machine hit all of them alike. Printed per
model: tokens/s (median over rounds), the ratio to GPT-2, parameter count, and peak memory of the compiled step as
XLA accounts it (arguments + outputs + temporaries; on a GPU also the device allocator's peak).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import haliax as hax
import jax
from diffeqformer.model.baselines import baseline_config

from diffeqformer import DiffEqFormerConfig, count_params
from diffeqformer.analysis.memory import compiled_train_step

PRESETS = {
    # name: (dimensions, batch size)
    "tiny": (dict(max_seq_len=64, hidden_dim=32, num_layers=3, num_heads=2, mlp_scale=2), 4),
    "cpu": (dict(max_seq_len=128, hidden_dim=128, num_layers=6, num_heads=4), 16),
    "gpu": (dict(max_seq_len=512, hidden_dim=384, num_layers=6, num_heads=6), 32),
    "small": (dict(max_seq_len=1024, hidden_dim=768, num_layers=12, num_heads=12), 8),
}
VOCAB = hax.Axis("vocab", 4096)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    p.add_argument("--time-embed-dims", type=int, nargs="+", default=[4, 20])
    p.add_argument("--sinusoidal-dim", type=int, default=32)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=5, help="timed steps per model per round")
    args = p.parse_args()

    dims, batch_size = PRESETS[args.preset]
    base = DiffEqFormerConfig(**dims, sinusoidal_dim=args.sinusoidal_dim)
    configs = {"gpt2": baseline_config(base, "gpt2")}
    for d_t in args.time_embed_dims:
        configs[f"diffeqformer d_t={d_t}"] = dataclasses.replace(base, time_embed_dim=d_t)
    Batch = hax.Axis("batch", batch_size)
    tokens = hax.random.randint(jax.random.PRNGKey(0), (Batch, base.Pos), 0, VOCAB.size)

    runs = {}
    for name, config in configs.items():
        model = config.build(VOCAB, key=jax.random.PRNGKey(1))
        t0 = time.perf_counter()
        step, params, opt_state, peak = compiled_train_step(model, tokens)
        params, opt_state, loss = step(params, opt_state, tokens)
        jax.block_until_ready(loss)
        runs[name] = dict(step=step, params=params, opt=opt_state, peak=peak, count=count_params(model),
                          compile_s=time.perf_counter() - t0, times=[])

    for _ in range(args.rounds):
        for run in runs.values():
            t0 = time.perf_counter()
            for _ in range(args.steps):
                run["params"], run["opt"], loss = run["step"](run["params"], run["opt"], tokens)
            jax.block_until_ready(loss)
            run["times"].append((time.perf_counter() - t0) / args.steps)

    tokens_per_step = batch_size * base.max_seq_len
    gpt_tps = tokens_per_step / statistics.median(runs["gpt2"]["times"])
    device = jax.devices()[0]
    print(f"# {args.preset}: {dims}, batch {batch_size}, S={args.sinusoidal_dim}, device {device.device_kind}"
          f" ({jax.default_backend()}), {args.rounds} rounds x {args.steps} steps")
    print(f"{'model':<22} {'params':>12} {'s/step':>9} {'tokens/s':>10} {'vs gpt2':>8} {'XLA peak MiB':>13}"
          f" {'compile s':>10}")
    for name, run in runs.items():
        s = statistics.median(run["times"])
        tps = tokens_per_step / s
        peak = f"{run['peak'] / 2**20:.1f}" if run["peak"] is not None else "n/a"
        print(f"{name:<22} {run['count']:>12,} {s:>9.4f} {tps:>10.0f} {tps / gpt_tps:>8.3f} {peak:>13}"
              f" {run['compile_s']:>10.1f}")
    if jax.default_backend() == "gpu":
        stats = device.memory_stats() or {}
        print(f"# device allocator peak: {stats.get('peak_bytes_in_use', 0) / 2**30:.2f} GiB (all models together)")


if __name__ == "__main__":
    main()
