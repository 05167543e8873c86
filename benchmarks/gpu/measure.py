"""Training-step throughput, model FLOP utilisation and peak memory of DiffEqFormer against GPT-2, on this machine's
accelerator (issue 13: the paper reports "a slight decrease" in throughput and memory that grows far less than the
parameter count with d_t).

    python benchmarks/gpu/measure.py [--pairs small medium] [--dt 48 96 144] [--batch 16] [--steps 10]
                                    [--vocab 50257] [--out benchmarks/results/gpu-<device>-<date>.json]

Each measurement runs in a fresh process (so that the accelerator's peak-memory counter is its own): the model of a
paper config (``PAIRS``; ``--pairs cpu`` takes the cpu preset's configs, to try the script on a CPU) is built with
random weights, its training step (forward, backward, AdamW, under the config's mixed-precision policy: f32
parameters, bfloat16 compute in the paper configs) compiled, then ``--steps`` steps on random tokens timed one by one
(median). Printed and written to ``--out`` (JSON, rewritten after every measurement, so that a run cut short keeps
what it measured):

* tokens/s and the ratio DiffEqFormer / GPT-2 per pair;
* model FLOP utilisation: 3 x the forward FLOPs per token (Levanter's ``flops_per_token``: matrix products and
  attention, as for GPT-2; DiffEqFormer's weight generation and the recomputation of checkpointed steps not counted)
  x tokens/s, over the peak this device measured for a large bfloat16 matrix product (``--peak-size``);
* peak memory: the accelerator allocator's ``peak_bytes_in_use`` (GPU, TPU), else None;
* the same for DiffEqFormer of the first pair at each ``--dt`` (time-embedding size).

``--ladder`` measures the speed levers of issue 39 instead, one at a time on top of the ones before (``LADDER``),
each pair's two models in one row: Levanter's default attention, then cuDNN's fused attention, no activation
recomputation, the vocabulary padded to a multiple of 128, Levanter's fast cross-entropy backward, a larger batch.
``--ladder-rows`` picks rows (by name) for the later pairs; ``--profile`` profiles the last row of the first pair.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PAIRS = {
    "small": ("config/paper/wikitext103_small_diffeqformer.yaml", "config/paper/wikitext103_small_gpt2.yaml"),
    "medium": ("config/paper/wikitext103_medium_diffeqformer.yaml", "config/paper/wikitext103_medium_gpt2.yaml"),
    "cpu": ("config/cpu/diffeqformer.yaml", "config/cpu/gpt2.yaml"),
}
"""(DiffEqFormer, GPT-2) configs of the same size: GPT-small (12 x 768, 12 heads, seq 1024), GPT-medium (24 x 1024,
16 heads), and the cpu preset's 64-d models."""


LADDER = (
    ("levanter-default", {}, {"DIFFEQFORMER_CUDNN_ATTENTION": "0"}, {}),
    ("+cudnn-attention", {}, {"DIFFEQFORMER_CUDNN_ATTENTION": "1"}, {}),
    ("+no-remat", {"gradient_checkpointing": "false"}, {}, {}),
    ("+vocab-pad-128", {}, {}, {"vocab": 50304}),
    ("+ce-fast-backward", {}, {"LEVANTER_CE_XLA_FAST_BWD": "1"}, {}),
    ("+batch-32", {}, {}, {"batch": 32}),
)
"""The levers, cumulative: (row name, model fields, environment, measurement settings). The first row is the
measurement of 2026-11-25 (Levanter's default backend, which without Transformer Engine is its reference flash
attention in JAX; every step's activations recomputed in the backward pass)."""
LADDER_EXTRA = (("levanter-vanilla", {"attn_backend": "vanilla"}, {"DIFFEQFORMER_CUDNN_ATTENTION": "0"}, {}),)
"""Rows measured alone on the first pair, not cumulative: Levanter's plain (unfused-by-hand) attention."""


def add_lever(kept: tuple[dict, dict, dict], lever: tuple) -> tuple[dict, dict, dict]:
    """The fields, environment and settings of the levers ``kept`` so far with ``lever`` on top."""
    fields, env, settings = kept
    _, f, e, m = lever
    return fields | f, env | e, settings | m


def peak_tflops(n: int, repeats: int = 20) -> float:
    """Measured bfloat16 matrix-product throughput of the default device: an n x n by n x n product, in TFLOP/s."""
    import jax
    import jax.numpy as jnp

    a = jax.random.normal(jax.random.PRNGKey(0), (n, n), dtype=jnp.bfloat16)
    b = jax.random.normal(jax.random.PRNGKey(1), (n, n), dtype=jnp.bfloat16)
    mm = jax.jit(lambda a, b: a @ b)
    mm(a, b).block_until_ready()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        mm(a, b).block_until_ready()
        times.append(time.perf_counter() - start)
    return 2 * n**3 / statistics.median(times) / 1e12


def profile_ops(trace_dir: Path, steps: int, top: int = 15) -> dict:
    """The ops of a ``jax.profiler`` trace (its Perfetto JSON) that took the most device time, summed by name:
    the accelerator's "XLA Ops" line where there is one (GPU), else every complete event of the processes named
    after a device, and on a CPU the events of XLA's threads; milliseconds per step over ``steps`` traced steps, and
    the share of all of them, by op and by kind of op."""
    import gzip

    trace = next(trace_dir.rglob("perfetto_trace.json.gz"))
    events = json.loads(gzip.decompress(trace.read_bytes()))
    events = events["traceEvents"] if isinstance(events, dict) else events
    processes = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
               if e.get("ph") == "M" and e.get("name") == "thread_name"}
    devices = {pid for pid, name in processes.items() if "/device:" in name}
    lines = {key for key, name in threads.items() if key[0] in devices and name == "XLA Ops"}
    if not devices:  # the CPU: XLA's own threads of the host process
        lines = {key for key, name in threads.items() if name.startswith("tf_XLA")}
    totals: dict[str, float] = {}
    for e in events:
        key = (e.get("pid"), e.get("tid"))
        if e.get("ph") == "X" and (key in lines if lines else e.get("pid") in devices):
            totals[e["name"]] = totals.get(e["name"], 0.0) + e.get("dur", 0.0)
    kinds: dict[str, float] = {}  # the same kind of op: its name without the instance number (fusion.12 -> fusion)
    for name, us in totals.items():
        kind = re.sub(r"[.\d]+$", "", name)
        kinds[kind] = kinds.get(kind, 0.0) + us
    whole = sum(totals.values()) or 1.0

    def ranked(table):
        best = sorted(table.items(), key=lambda kv: -kv[1])[:top]
        return [{"op": name, "ms_per_step": us / 1e3 / steps, "share": us / whole} for name, us in best]

    return {"ms_per_step": whole / 1e3 / steps, "by_kind": ranked(kinds), "by_op": ranked(totals)}


def measure(config_path: str, overrides: list[str], batch: int, steps: int, vocab: int, profile: int = 0) -> dict:
    """One model's training step, in this process: see the module's docstring. The config's ``model`` section is
    decoded as Levanter decodes it (its ``type`` picks the class), ``overrides`` (``field=value``) replacing fields;
    nothing of the training module is imported (its data stack is not needed here, nor installed on the offline GPU
    machine)."""
    import equinox as eqx
    import haliax as hax
    import jax
    import jax.random as jrandom
    import jmp
    import levanter.models.gpt2  # noqa: F401  (registers the gpt2 model type)
    import optax
    import yaml
    from draccus.parsers import decoding
    from levanter.models.lm_model import LmConfig, LmExample

    import diffeqformer.model  # noqa: F401  (registers the diffeqformer model type)

    raw = yaml.safe_load((REPO / config_path).read_text())
    fields = dict(raw["model"])
    for item in overrides:  # a field the model has not is refused by the decoder, by name
        key, _, value = item.partition("=")
        fields[key] = yaml.safe_load(value)
    mc = decoding.decode(LmConfig, fields)
    mp = raw.get("trainer", {}).get("mp", "f32")
    policy = jmp.get_policy(mp)
    Vocab, Batch, Pos = hax.Axis("vocab", vocab), hax.Axis("batch", batch), mc.max_Pos
    model = mc.build(Vocab, key=jrandom.PRNGKey(0))
    params = sum(x.size for x in jax.tree_util.tree_leaves(eqx.filter(model, eqx.is_inexact_array)))
    opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-4, weight_decay=0.1))
    opt_state = opt.init(eqx.filter(model, eqx.is_inexact_array))
    tokens = hax.named(jrandom.randint(jrandom.PRNGKey(1), (Batch.size, Pos.size), 0, vocab), (Batch, Pos))

    def loss(model, example, key):
        value = policy.cast_to_compute(model).compute_next_token_loss(example, key=key)
        return value.scalar() if hasattr(value, "scalar") else value

    @eqx.filter_jit(donate="all-except-first")
    def step(tokens, model, opt_state, key):
        example = hax.vmap(LmExample.causal, Batch)(tokens)
        value, grads = eqx.filter_value_and_grad(loss)(model, example, key)
        updates, opt_state = opt.update(grads, opt_state, eqx.filter(model, eqx.is_inexact_array))
        return value, eqx.apply_updates(model, updates), opt_state

    start = time.perf_counter()
    value, model, opt_state = step(tokens, model, opt_state, jrandom.PRNGKey(2))
    jax.block_until_ready(value)
    compile_s = time.perf_counter() - start
    times = []
    for i in range(steps):
        start = time.perf_counter()
        value, model, opt_state = step(tokens, model, opt_state, jrandom.PRNGKey(3 + i))
        jax.block_until_ready(value)
        times.append(time.perf_counter() - start)
    step_s = statistics.median(times)
    stats = jax.devices()[0].memory_stats() or {}  # before profiling, which could add its own buffers
    ops = None
    if profile:
        import tempfile

        with tempfile.TemporaryDirectory(prefix="diffeqformer-profile-") as folder:
            with jax.profiler.trace(folder, create_perfetto_trace=True):
                for i in range(profile):
                    value, model, opt_state = step(tokens, model, opt_state, jrandom.PRNGKey(1000 + i))
                    jax.block_until_ready(value)
            ops = profile_ops(Path(folder), profile)
    flops = mc.flops_per_token(vocab, Pos.size)
    return {
        "config": config_path, "overrides": overrides, "model": type(mc).__name__, "layers": mc.num_layers,
        "hidden": mc.hidden_dim, "heads": mc.num_heads, "seq": Pos.size, "vocab": vocab,
        "time_embed_dim": getattr(mc, "time_embed_dim", None), "batch": batch, "policy": mp,
        "params": int(params), "compile_s": compile_s, "step_s": step_s, "tokens_per_second": batch * Pos.size / step_s,
        "train_flops_per_token": 3 * flops if flops else None, "final_loss": float(value),
        "peak_memory_gib": stats["peak_bytes_in_use"] / 2**30 if "peak_bytes_in_use" in stats else None,
        "profile": ops,
    }


def print_profiles(*measured: dict) -> None:
    """The costliest kinds of op of each measurement that was profiled (``--profile``)."""
    for m in measured:
        if m["profile"]:
            print(f"    {m['model']}: {m['profile']['ms_per_step']:.2f} ms of ops a step, by kind:")
            for op in m["profile"]["by_kind"][:12]:
                print(f"      {op['ms_per_step']:8.2f} ms {op['share']:6.1%}  {op['op'][:90]}")


def run_child(args: list[str], env: dict | None = None) -> dict:
    """Run this script with ``args`` in a fresh process (``env`` added to its environment); its last printed line is
    its JSON result."""
    import os

    proc = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, **(env or {})})
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pairs", nargs="+", default=["small", "medium"], choices=sorted(PAIRS))
    p.add_argument("--dt", type=int, nargs="*", default=[48, 96, 144],
                   help="time-embedding sizes measured beyond the first pair's own (20 in the paper's GPT-small)")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--vocab", type=int, default=50257, help="the GPT-2 tokenizer's, as in the paper")
    p.add_argument("--peak-size", type=int, default=8192)
    p.add_argument("--profile", type=int, default=0, metavar="STEPS",
                   help="also trace this many steps of each pair's models with JAX's profiler and print their costliest ops")
    p.add_argument("--ladder", action="store_true", help="measure the speed levers (LADDER) instead")
    p.add_argument("--ladder-rows", nargs="+", metavar="ROW",
                   help="--ladder: the rows measured for every pair after the first (default: all)")
    p.add_argument("--out", type=Path)
    p.add_argument("--one", nargs="+", help=argparse.SUPPRESS)  # child: config path, then overrides
    p.add_argument("--peak", action="store_true", help=argparse.SUPPRESS)  # child: the matrix-product peak
    args = p.parse_args()
    if args.batch < 1 or args.steps < 1 or args.vocab < 2 or args.peak_size < 1 or any(d < 1 for d in args.dt) \
            or args.profile < 0:
        p.error("--batch, --steps, --peak-size and --dt must be positive, --vocab at least 2, --profile not negative")
    if args.peak:
        import jax

        print(json.dumps({"peak_tflops": peak_tflops(args.peak_size), "device": jax.devices()[0].device_kind,
                          "platform": jax.devices()[0].platform, "jax": jax.__version__}))
        return
    if args.one:
        print(json.dumps(measure(args.one[0], args.one[1:], args.batch, args.steps, args.vocab, args.profile)))
        return

    common = ["--batch", str(args.batch), "--steps", str(args.steps), "--vocab", str(args.vocab)]
    result = {"date": datetime.date.today().isoformat(), **run_child(["--peak", "--peak-size", str(args.peak_size)]),
              "pairs": [], "time_embed_dim": []}
    out = args.out or REPO / "benchmarks" / "results" / (
        f"{result['platform']}-{result['device'].replace(' ', '_')}-{result['date']}.json")
    out.parent.mkdir(parents=True, exist_ok=True)

    def save():
        out.write_text(json.dumps(result, indent=1) + "\n")

    def mfu(m: dict) -> float | None:
        return m["train_flops_per_token"] * m["tokens_per_second"] / (result["peak_tflops"] * 1e12) \
            if m["train_flops_per_token"] else None

    print(f"{result['device']} ({result['platform']}, JAX {result['jax']}): bfloat16 {args.peak_size}^3 product "
          f"{result['peak_tflops']:.0f} TFLOP/s", flush=True)
    if args.ladder:
        ladder(args, result, save, mfu)
        print(f"written to {out}")
        return
    for name in args.pairs:
        ours, gpt = (run_child(["--one", c, *common, "--profile", str(args.profile)]) for c in PAIRS[name])
        for m in (ours, gpt):
            m["mfu"] = mfu(m)
        entry = {"pair": name, "diffeqformer": ours, "gpt2": gpt,
                 "ratio": ours["tokens_per_second"] / gpt["tokens_per_second"]}
        result["pairs"].append(entry)
        save()
        for m in (ours, gpt):
            print(f"{name:6s} {m['model']:20s} {m['params'] / 1e6:7.1f}M params  {m['tokens_per_second']:9.0f} tokens/s"
                  f"  MFU {m['mfu'] or 0:5.1%}  peak {m['peak_memory_gib'] or 0:6.2f} GiB  compile {m['compile_s']:.0f} s",
                  flush=True)
        print(f"{name:6s} DiffEqFormer / GPT-2 tokens/s: {entry['ratio']:.3f}", flush=True)
        print_profiles(ours, gpt)
    for dt in args.dt:
        m = run_child(["--one", PAIRS[args.pairs[0]][0], f"time_embed_dim={dt}", *common])
        m["mfu"] = mfu(m)
        result["time_embed_dim"].append(m)
        save()
        print(f"d_t {dt:4d}: {m['params'] / 1e6:7.1f}M params  {m['tokens_per_second']:9.0f} tokens/s  "
              f"peak {m['peak_memory_gib'] or 0:6.2f} GiB", flush=True)
    print(f"written to {out}")


def ladder(args, result: dict, save, mfu) -> None:
    """``--ladder``: on the first pair every row of ``LADDER``, each on top of the rows before it that were
    measured (a row that fails is recorded with its error and left out of the rows after it), then on the later
    pairs the rows ``--ladder-rows`` names (each with the levers kept on the first pair up to it), then
    ``LADDER_EXTRA`` on the first pair."""
    names = [row[0] for row in LADDER + LADDER_EXTRA]
    unknown = sorted(set(args.ladder_rows or ()) - set(names))
    if unknown:
        sys.exit(f"error: --ladder-rows {' '.join(unknown)}: no such row; the rows are {', '.join(names)}")
    result["ladder"] = []
    kept_at: dict[str, tuple[dict, dict, dict]] = {}  # row -> the levers kept on the first pair up to it

    def measure_row(pair: str, row: str, levers: tuple[dict, dict, dict], profile: int) -> bool:
        fields, env, settings = levers
        common = ["--batch", str(settings.get("batch", args.batch)), "--steps", str(args.steps),
                  "--vocab", str(settings.get("vocab", args.vocab))]
        entry = {"pair": pair, "row": row, "fields": fields, "env": env, **settings}
        try:
            ours, gpt = (run_child(["--one", config, *[f"{k}={v}" for k, v in fields.items()], *common,
                                    "--profile", str(profile)], env) for config in PAIRS[pair])
        except RuntimeError as error:
            entry["error"] = str(error)[-2000:]
            result["ladder"].append(entry)
            save()
            print(f"{pair:6s} {row:20s} failed: {str(error)[-600:]}", flush=True)
            return False
        for m in (ours, gpt):
            m["mfu"] = mfu(m)
        entry |= {"diffeqformer": ours, "gpt2": gpt, "ratio": ours["tokens_per_second"] / gpt["tokens_per_second"]}
        result["ladder"].append(entry)
        save()
        print(f"{pair:6s} {row:20s} DiffEqFormer {ours['tokens_per_second']:9.0f} tok/s MFU {ours['mfu'] or 0:5.1%} "
              f"peak {ours['peak_memory_gib'] or 0:5.1f} GiB | GPT-2 {gpt['tokens_per_second']:9.0f} tok/s "
              f"MFU {gpt['mfu'] or 0:5.1%} peak {gpt['peak_memory_gib'] or 0:5.1f} GiB | ratio {entry['ratio']:.3f}",
              flush=True)
        print_profiles(ours, gpt)
        return True

    kept: tuple[dict, dict, dict] = ({}, {}, {})
    for i, lever in enumerate(LADDER):
        levers = add_lever(kept, lever)
        if measure_row(args.pairs[0], lever[0], levers, args.profile if i == len(LADDER) - 1 else 0):
            kept = levers
        kept_at[lever[0]] = kept
    for pair in args.pairs[1:]:
        for row, _, _, _ in LADDER:
            if not args.ladder_rows or row in args.ladder_rows:
                measure_row(pair, row, kept_at[row], 0)
    for lever in LADDER_EXTRA:
        if not args.ladder_rows or lever[0] in args.ladder_rows:
            measure_row(args.pairs[0], lever[0], add_lever(({}, {}, {}), lever), 0)


if __name__ == "__main__":
    main()
