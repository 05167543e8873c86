"""What a population's training step costs per seed: the compiled step of 1, 3, 6, ... vmapped seeds, on this machine.

    python benchmarks/seed_scaling.py [--config config/cpu/synthetic_diffeqformer.yaml] [--seeds 1 3 6 9]
                                      [--rounds 5] [--steps 8]

For each seed count the training step of that many vmapped copies of ``--config``'s model (forward, backward and an
AdamW update, with ``diffeqformer.population``'s loss and optimiser; batch and sequence length from the config, random tokens)
is compiled once; then the seed counts take turns, ``--steps`` timed steps each per round, so that drifts of the
machine hit all of them alike. Printed per seed count: the median milliseconds a step, per seed, and the ratio to
that many one-seed steps (below 1, vmapping the seeds saves arithmetic time; about 1, a population saves only
start-up and compilation). XLA options can be compared by running it under another ``XLA_FLAGS``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import equinox as eqx
import haliax as hax
import jax
import jax.random as jrandom
import optax
from levanter.models.lm_model import LmExample

from diffeqformer import config as configs
from diffeqformer import population
from diffeqformer.data.synthetic import VOCABULARY


def make_step(config_path: str, seeds: int):
    """The jitted population step of ``seeds`` seeds and its initial (tokens, model, optimiser state)."""
    config = configs.load_config(config_path)
    mc = config.model
    # the synthetic language's word-level vocabulary, or the corpus's BPE
    vocab = len(VOCABULARY) if config.data.dataset == "synthetic" else config.data.vocab_size
    Vocab, Seed = hax.Axis("vocab", vocab), hax.Axis("seed", seeds)
    model = hax.vmap(lambda k: mc.build(Vocab, key=k), Seed)(jrandom.split(jrandom.PRNGKey(0), seeds))
    # the population's own loss (the members' losses summed) and optimiser (each member's own AdamW and clipping)
    opt = population.population_optimizer(optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3)), Seed)
    opt_state = opt.init(eqx.filter(model, eqx.is_inexact_array))
    population_loss = population.population_loss(Seed)

    def loss(model, example, key):  # the summed loss as a scalar for jax.grad (Levanter's trainer unwraps it)
        total, metrics = population_loss(model, example, member_keys=jrandom.split(key, Seed.size))
        return total.scalar(), metrics

    Batch = hax.Axis("batch", seeds * config.trainer.train_batch_size)  # the members' batches, one after the other
    Pos = mc.max_Pos  # the sequence length of any Levanter LmConfig (DiffEqFormer's, GPT-2's, Llama's)
    tokens = hax.named(jrandom.randint(jrandom.PRNGKey(1), (Batch.size, Pos.size), 0, Vocab.size), (Batch, Pos))

    @eqx.filter_jit(donate="all-except-first")
    def step(tokens, model, opt_state, key):
        example = hax.vmap(LmExample.causal, Batch)(tokens)
        (total, _), grads = eqx.filter_value_and_grad(loss, has_aux=True)(model, example, key)
        updates, opt_state = opt.update(grads, opt_state, eqx.filter(model, eqx.is_inexact_array))
        return total, eqx.apply_updates(model, updates), opt_state

    return step, [tokens, model, opt_state]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="config/cpu/synthetic_diffeqformer.yaml")
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 3, 6, 9])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=8)
    args = p.parse_args()
    if any(s < 1 for s in args.seeds) or args.rounds < 1 or args.steps < 1:
        p.error("--seeds, --rounds and --steps must be positive")

    steps, states, times = {}, {}, {s: [] for s in args.seeds}
    for s in args.seeds:
        step, state = make_step(args.config, s)
        start = time.perf_counter()
        losses, *rest = step(*state, jrandom.PRNGKey(0))
        jax.block_until_ready(losses)
        steps[s], states[s] = step, [state[0], *rest]
        print(f"{s} seeds: compiled in {time.perf_counter() - start:.1f} s", flush=True)
    for r in range(args.rounds):
        for s in args.seeds:
            for i in range(args.steps):
                start = time.perf_counter()
                losses, *rest = steps[s](*states[s], jrandom.PRNGKey(1000 * r + i))
                jax.block_until_ready(losses)
                times[s].append(time.perf_counter() - start)
                states[s] = [states[s][0], *rest]
    one = statistics.median(times[min(args.seeds)]) / min(args.seeds)
    print(f"{args.config}, {jax.devices()[0].platform}: median of {args.rounds * args.steps} steps")
    print("seeds  ms/step  ms/seed  ratio to one-seed steps")
    for s in args.seeds:
        ms = statistics.median(times[s]) * 1e3
        print(f"{s:5d}  {ms:7.1f}  {ms / s:7.1f}  {ms / 1e3 / (s * one):.2f}")


if __name__ == "__main__":
    main()
