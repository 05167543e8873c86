"""XLA's own CPU kernels against oneDNN's (``diffeqformer.ONEDNN_FLAG``) for the cpu preset's training steps.

    python benchmarks/cpu_kernels.py [--configs diffeqformer gpt2 synthetic_diffeqformer] [--steps 16] [--cpu 1]

For each config of ``config/cpu/`` and each kernel choice, a fresh process (pinned to one core, as a pipeline lane's
training process is) builds the model, compiles a training step for the batch of a 3-seed population (48 sequences)
and times ``--steps`` steps; printed: the median seconds per step of each, their ratio, and the loss after the steps
(the same up to float32 rounding: the kernels sum in another order, so the bits differ).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

STEP = """\
import json, statistics, sys, time
import jax, haliax as hax
from diffeqformer import config as configs, train
from diffeqformer.analysis.ablations import compiled_train_step
config = configs.load_config(sys.argv[1], [])
vocab = hax.Axis("vocab", int(sys.argv[2]))
model = config.model.build(vocab, key=jax.random.PRNGKey(0))
tokens = hax.random.randint(jax.random.PRNGKey(1), (hax.Axis("batch", 48), config.model.max_Pos), 0, vocab.size)
step, params, opt_state, _ = compiled_train_step(model, tokens, mp=config.trainer.mp)
seconds = []
for _ in range(int(sys.argv[3])):
    start = time.perf_counter()
    params, opt_state, loss = step(params, opt_state, tokens)
    jax.block_until_ready(loss)
    seconds.append(time.perf_counter() - start)
print(json.dumps({"step_s": statistics.median(seconds[2:]), "loss": float(loss)}))
"""

VOCAB = {"synthetic_diffeqformer": 73}
"""The synthetic language's vocabulary (its word-level tokenizer); the corpus models' is the config's 4096."""


def measure(config: str, onednn: bool, steps: int, cpu: int) -> dict:
    """One fresh, pinned process's median step time and final loss for ``config/cpu/<config>.yaml``."""
    env = {**os.environ, "DIFFEQFORMER_ONEDNN": "1" if onednn else "0"}
    if not onednn:  # a flag inherited from this process's environment would override the switch
        env["XLA_FLAGS"] = " ".join(f for f in env.get("XLA_FLAGS", "").split() if "onednn" not in f)
    cmd = ["taskset", "-c", str(cpu), sys.executable, "-c", STEP, f"config/cpu/{config}.yaml",
           str(VOCAB.get(config, 4096)), str(steps)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", nargs="+", default=["diffeqformer", "gpt2", "synthetic_diffeqformer"])
    parser.add_argument("--steps", type=int, default=16, help="timed steps (the first two are not counted)")
    parser.add_argument("--cpu", type=int, default=0, help="the core the measuring processes run on")
    args = parser.parse_args(argv)
    if args.steps < 3:
        parser.error(f"--steps must be at least 3, got {args.steps}")
    print(f"{'config':24s} {'XLA s/step':>11s} {'oneDNN s/step':>14s} {'ratio':>6s}  losses")
    for config in args.configs:
        xla, onednn = (measure(config, flag, args.steps, args.cpu) for flag in (False, True))
        print(f"{config:24s} {xla['step_s']:11.4f} {onednn['step_s']:14.4f} {onednn['step_s'] / xla['step_s']:6.3f}"
              f"  {xla['loss']:.6f} / {onednn['loss']:.6f}")


if __name__ == "__main__":
    main()
