"""XLA's own CPU kernels against oneDNN's, for the cpu preset's training steps: the step's speed, and whether the
compiled step can be kept in JAX's persistent compilation cache (``train.use_compilation_cache``).

    python benchmarks/cpu_kernels.py [--configs diffeqformer gpt2 synthetic_diffeqformer] [--steps 16] [--cpu 1]
                                     [--kernels xla onednn-custom-calls onednn]

For each config of ``config/cpu/`` and each kernel choice (``KERNELS``: the ``XLA_FLAGS`` it sets), a fresh process
(pinned to one core, as a training job of the workflow is) builds the model, compiles a training step for the
batch of a 3-seed population (48 sequences) into an empty persistent compilation cache and times ``--steps`` steps;
printed: the median seconds per step of each (wall and CPU: on a busy machine the CPU seconds of the pinned process
are the steadier measure), its ratio to XLA's own, whether the cache could store the step, and
the loss after the steps (the same up to float32 rounding: the kernels sum in another order, so the bits differ).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

STEP = """\
import json, statistics, sys, time, warnings
import jax, haliax as hax
jax.config.update("jax_compilation_cache_dir", sys.argv[4])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
from diffeqformer import config as configs, train
from diffeqformer.analysis.memory import compiled_train_step
config = configs.load_config(sys.argv[1], [])
vocab = hax.Axis("vocab", int(sys.argv[2]))
model = config.model.build(vocab, key=jax.random.PRNGKey(0))
tokens = hax.random.randint(jax.random.PRNGKey(1), (hax.Axis("batch", 48), config.model.max_Pos), 0, vocab.size)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    step, params, opt_state, _ = compiled_train_step(model, tokens, mp=config.trainer.mp)
cached = not any("persistent compilation cache" in str(w.message) for w in caught)
seconds, cpu = [], []
for _ in range(int(sys.argv[3])):
    start, start_cpu = time.perf_counter(), time.process_time()
    params, opt_state, loss = step(params, opt_state, tokens)
    jax.block_until_ready(loss)
    seconds.append(time.perf_counter() - start)
    cpu.append(time.process_time() - start_cpu)
print(json.dumps({"step_s": statistics.median(seconds[2:]), "step_cpu_s": statistics.median(cpu[2:]),
                  "loss": float(loss), "cached": cached}))
"""

KERNELS = {
    "xla": "",
    "onednn-custom-calls": "--xla_cpu_experimental_onednn_custom_call=true",
    "onednn": "--xla_cpu_use_onednn=true",
}
"""Kernel choices and their XLA flags: XLA's own; oneDNN through XLA's custom calls (matrix products, layer norms,
softmax); oneDNN as XLA's CPU backend library."""

VOCAB = {"synthetic_diffeqformer": 73}
"""The synthetic language's vocabulary (its word-level tokenizer); the corpus models' is the config's 4096."""


def measure(config: str, flags: str, steps: int, cpu: int) -> dict:
    """One fresh, pinned process's median step time, final loss and whether its step could be cached, for
    ``config/cpu/<config>.yaml`` with ``flags`` as its only oneDNN setting."""
    env = {**os.environ, "DIFFEQFORMER_ONEDNN": "0"}
    env["XLA_FLAGS"] = " ".join([f for f in env.get("XLA_FLAGS", "").split() if "onednn" not in f] + [flags]).strip()
    with tempfile.TemporaryDirectory(prefix="cpu-kernels-cache-") as cache:
        cmd = ["taskset", "-c", str(cpu), sys.executable, "-c", STEP, f"config/cpu/{config}.yaml",
               str(VOCAB.get(config, 4096)), str(steps), cache]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", nargs="+", default=["diffeqformer", "gpt2", "synthetic_diffeqformer"])
    parser.add_argument("--kernels", nargs="+", default=list(KERNELS), choices=list(KERNELS))
    parser.add_argument("--steps", type=int, default=16, help="timed steps (the first two are not counted)")
    parser.add_argument("--cpu", type=int, default=0, help="the core the measuring processes run on")
    args = parser.parse_args(argv)
    if args.steps < 3:
        parser.error(f"--steps must be at least 3, got {args.steps}")
    print(f"{'config':24s} {'kernels':20s} {'s/step':>8s} {'/ xla':>6s} {'CPU s':>8s} {'/ xla':>6s} {'cached':>6s}  loss")
    for config in args.configs:
        base = None
        for kernels in args.kernels:
            m = measure(config, KERNELS[kernels], args.steps, args.cpu)
            base = base or (m if kernels == "xla" else None)
            ratios = [f"{m[k] / base[k]:6.3f}" if base else f"{'':6s}" for k in ("step_s", "step_cpu_s")]
            print(f"{config:24s} {kernels:20s} {m['step_s']:8.4f} {ratios[0]} {m['step_cpu_s']:8.4f} {ratios[1]} "
                  f"{'yes' if m['cached'] else 'no':>6s}  {m['loss']:.6f}", flush=True)


if __name__ == "__main__":
    main()
