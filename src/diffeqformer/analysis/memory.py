"""The time and peak memory of a training step (F9, Figs. 15-16) and the fit of peak memory against the parameters.

A step is measured in fresh processes of its own (a process's high-water mark cannot be reset everywhere, and XLA's
compiler needs several times the step's memory):

    python -m diffeqformer.analysis.memory runs/cpu-diffeqformer --batch 16 --steps 10
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import resource
import sys
import tempfile
import warnings
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from .. import use_onednn
from ..model import attention
from ..runs import config as run_config
from ..runs import require_complete, summary
from ..train import next_token_loss


def compiled_train_step(model, tokens, *, learning_rate: float = 1e-4, donate: bool = True, mp=None):
    """A jitted AdamW train step (Levanter's next-token loss) over the model's float arrays, compiled for ``tokens``
    (batch x position). ``donate``: the outputs take the buffers of the parameters and optimiser state, as in the
    trainer's step (``diffeqformer.trainer``). ``mp``: a ``jmp.Policy`` (a run's ``trainer.mp``) whose compute dtype the loss runs
    in. Returns (step, params, opt_state, ``memory_parts``' ``peak`` or None)."""
    import equinox as eqx
    import haliax as hax
    import jax
    import optax
    from levanter.models.lm_model import LmExample

    params, static = eqx.partition(model, eqx.is_inexact_array)
    optimizer = optax.adamw(learning_rate)
    opt_state = optimizer.init(params)

    def step(params, opt_state, tokens):
        batch = hax.vmap(LmExample.causal, tokens.axes[0])(tokens)

        def loss_fn(p):
            # a fixed dropout key: a model with dropout pays for its masks as in training (the same mask each step)
            m = eqx.combine(p, static)
            return next_token_loss(mp.cast_to_compute(m) if mp is not None else m, batch,
                                   key=jax.random.PRNGKey(0)).scalar()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    compiled = jax.jit(step, donate_argnums=(0, 1) if donate else ()).lower(params, opt_state, tokens).compile()
    parts = memory_parts(compiled)
    return compiled, params, opt_state, parts["peak"] if parts else None


def memory_parts(compiled) -> dict[str, int] | None:
    """XLA's plan for a compiled step in bytes (None where the backend gives none): ``arguments``, ``outputs``,
    ``aliased`` (into donated arguments), ``temporaries`` and ``peak`` = arguments + outputs - aliased + temporaries."""
    mem = compiled.memory_analysis()
    if mem is None:
        return None
    parts = {"arguments": mem.argument_size_in_bytes, "outputs": mem.output_size_in_bytes,
             "aliased": mem.alias_size_in_bytes, "temporaries": mem.temp_size_in_bytes}
    parts["peak"] = parts["arguments"] + parts["outputs"] - parts["aliased"] + parts["temporaries"]
    return parts


PARAMETER_BYTES = 16
"""Bytes a float32 parameter holds while it trains with Adam: itself, its gradient and Adam's two moments, 4 each."""


@dataclass(frozen=True)
class MemoryGrowth:
    """The least-squares line memory = ``fixed`` + ``per_parameter`` x parameters of a training step's peak memory over
    a sweep (F9: d_t); ``per_parameter`` is ``PARAMETER_BYTES`` if a parameter costs only its training state."""

    params: tuple[float, ...]
    memory: tuple[float, ...]
    """Bytes, one per setting."""
    source: str
    per_parameter: float
    fixed: float

    @property
    def memory_ratio(self) -> float:
        """Memory at the most parameters over memory at the fewest."""
        return self.memory[-1] / self.memory[0]

    @property
    def params_ratio(self) -> float:
        return self.params[-1] / self.params[0]

    @property
    def growth_ratio(self) -> float:
        """(memory ratio - 1) / (parameter ratio - 1): 1 when the memory grows as fast as the parameters."""
        return (self.memory_ratio - 1) / (self.params_ratio - 1)

    @property
    def grows_far_less(self) -> bool:
        """Fig. 16's claim as the paper words it: ``growth_ratio`` below 1/2."""
        return self.growth_ratio < 0.5

    @property
    def far_less(self) -> bool:
        """The stricter, exploratory reading: an added parameter costs less than half of ``PARAMETER_BYTES`` (any
        memory that does not grow with the parameters makes ``grows_far_less`` easier to meet)."""
        return self.per_parameter < PARAMETER_BYTES / 2


def memory_growth(params: Sequence[float], memory: Sequence[float], source: str) -> MemoryGrowth:
    """``MemoryGrowth`` of peak memories ``memory`` (bytes) at parameter counts ``params`` (two or more different
    counts), sorted by parameters. A step's memory does not depend on the seed: one measurement per setting."""
    import numpy as np

    pairs = sorted(zip((float(p) for p in params), (float(m) for m in memory)))
    x, y = np.array([p for p, _ in pairs]), np.array([m for _, m in pairs])
    if len(set(x)) < 2 or not np.all(np.isfinite(y)):
        raise ValueError("a memory growth needs finite memories at two or more parameter counts")
    slope, intercept = np.polyfit(x, y, 1)
    return MemoryGrowth(tuple(x), tuple(y), source, float(slope), float(intercept))


def gpu_memory_growth(path: str | Path) -> tuple:
    """The d_t sweep of a GPU measurement file (``benchmarks/gpu/measure.py``'s JSON) as a ``MemoryGrowth`` and a table
    (d_t, parameters, peak GiB, ``PARAMETER_BYTES`` x parameters in GiB)."""
    import pandas as pd

    result = json.loads(Path(path).read_text())
    sweep = [result["pairs"][0]["diffeqformer"], *result.get("time_embed_dim", [])]
    sweep = sorted((m for m in sweep if m.get("peak_memory_gib") is not None), key=lambda m: m["params"])
    if len(sweep) < 2:
        raise ValueError(f"{path}: fewer than two d_t with a measured peak memory")
    first = sweep[0]
    source = (f"{result['device']}, allocator peak at batch {first['batch']}, {first['layers']} x {first['hidden']}, "
              f"seq {first['seq']}, {first['policy']}, one device")
    growth = memory_growth([m["params"] for m in sweep], [m["peak_memory_gib"] * 2**30 for m in sweep], source)
    table = pd.DataFrame({"d_t": [m["time_embed_dim"] for m in sweep], "params": [m["params"] for m in sweep],
                          "peak GiB": [m["peak_memory_gib"] for m in sweep]})
    table[f"{PARAMETER_BYTES} B x params GiB"] = table.params * PARAMETER_BYTES / 2**30
    return growth, table


def _status_mib(field: str) -> float | None:
    """A memory figure of this process from Linux's /proc/self/status (``VmRSS``, ``VmHWM``) in MiB; None elsewhere."""
    try:
        text = Path("/proc/self/status").read_text()
    except OSError:
        return None
    return next((int(line.split()[1]) / 1024 for line in text.splitlines() if line.startswith(field + ":")), None)


def _reset_peak_rss() -> bool:
    """Reset this process's resident-memory high-water mark (Linux: ``clear_refs`` 5); False where impossible."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _peak_rss_mib() -> float:
    """The high-water mark of resident memory: ``VmHWM`` (resettable), else ``ru_maxrss`` (since the start)."""
    hwm = _status_mib("VmHWM")
    if hwm is not None:
        return hwm
    scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, KiB on Linux
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / 2**20


CACHE_EVENTS = ("/jax/compilation_cache/compile_requests_use_cache", "/jax/compilation_cache/cache_hits")
"""The events JAX records when a program is asked of the persistent compilation cache, and when it is found there."""


def _measure(run, batch: int, steps: int, cache: str | None = None) -> dict:
    """In a process whose JAX runtime has not started: ``steps`` AdamW steps of the run's model on random tokens, their
    memory and time; ``cache``: JAX's compilation cache, with oneDNN in a form it keeps (``ONEDNN_CACHEABLE_FLAG``)."""
    import statistics
    import time

    import haliax as hax
    import jax

    if cache is not None:
        use_onednn(cacheable=True)
        jax.config.update("jax_compilation_cache_dir", cache)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    jax.numpy.zeros(1).block_until_ready()  # the runtime itself, before anything of the model
    reset = _reset_peak_rss()
    baseline = _status_mib("VmRSS") if reset else _peak_rss_mib()
    config = run_config(run)
    vocab = hax.Axis("vocab", summary(run)["vocab_size"])
    attention.install()  # as a training would: cuDNN's attention on a GPU
    model = config.model.build(vocab, key=jax.random.PRNGKey(0))
    tokens = hax.random.randint(jax.random.PRNGKey(1), (hax.Axis("batch", batch), config.model.max_Pos), 0, vocab.size)
    events = []  # the persistent compilation cache's requests and hits, in order
    jax.monitoring.register_event_listener(lambda event, **_: events.append(event) if event in CACHE_EVENTS else None)
    start = time.perf_counter()
    step, params, opt_state, planned = compiled_train_step(model, tokens, mp=config.trainer.mp)
    compile_s = time.perf_counter() - start
    # the step is the last program compiled_train_step compiles (before it: the optimiser state's small programs)
    from_cache = events[-1:] == [CACHE_EVENTS[1]]
    parts = memory_parts(step) or {}
    num_params = sum(x.size for x in jax.tree_util.tree_leaves(params))
    del model
    seconds = []
    timed_from = time.time()
    for _ in range(steps):
        start = time.perf_counter()
        params, opt_state, loss = step(params, opt_state, tokens)
        jax.block_until_ready(loss)
        seconds.append(time.perf_counter() - start)
    timed_to = time.time()
    peak = _peak_rss_mib()
    stats = jax.devices()[0].memory_stats() or {}
    step_s = statistics.median(seconds[1:] if len(seconds) > 1 else seconds)
    return {"run": str(run), "batch": batch, "steps": steps, "backend": jax.default_backend(),
            "step_s": step_s, "tokens_per_second": batch * config.model.max_Pos.size / step_s, "compile_s": compile_s,
            "step_from_cache": from_cache, "timed_from": timed_from, "timed_to": timed_to,
            "rss_baseline_mib": baseline, "rss_peak_mib": peak, "training_mib": peak - baseline,
            "peak_since": "runtime start" if reset else "process start",
            "params": num_params, "xla_planned_mib": planned / 2**20 if planned is not None else None,
            **{f"xla_{name}_mib": value / 2**20 for name, value in parts.items() if name != "peak"},
            "device_peak_mib": stats["peak_bytes_in_use"] / 2**20 if "peak_bytes_in_use" in stats else None}


def measure_training_step(run, *, batch: int = 16, steps: int = 10) -> dict:
    """``measure_training_steps`` of one run."""
    return measure_training_steps([run], batch=batch, steps=steps)[0]


def measure_training_steps(runs: Sequence, *, batch: int = 16, steps: int = 10, progress: bool = False) -> list[dict]:
    """The cost of a training step of each run's model (fresh from its config, random tokens, AdamW): ``step_s``
    (median, after the first), ``tokens_per_second``, ``training_mib`` (peak resident memory above that of the started
    runtime), ``device_peak_mib`` (GPU/TPU), ``xla_planned_mib`` and its parts, ``params``. The step is compiled in a
    first process (``compile_mib``, ``first_compile_s``) into a private compilation cache, all side by side, and timed
    in a second one that loads it, one after the other (``timed_from``, ``timed_to``) so that no two timed steps share
    the machine."""
    from tqdm.auto import tqdm

    if batch < 1 or steps < 1:
        raise ValueError(f"batch and steps must be positive, got batch={batch!r}, steps={steps!r}")
    paths = [str(require_complete(run)) for run in runs]
    spawn = multiprocessing.get_context("spawn")  # a fresh interpreter per measurement (max_tasks_per_child)
    with (tempfile.TemporaryDirectory(prefix="diffeqformer-measure-") as tmp,
          ProcessPoolExecutor(max(len(runs), 1), mp_context=spawn, max_tasks_per_child=1) as pool):
        caches = [str(Path(tmp) / f"cache-{i}") for i in range(len(runs))]  # one private cache per run
        compiled = list(pool.map(_measure, paths, [batch] * len(runs), [1] * len(runs), caches))
        out = []
        for run, path, cache, first in tqdm(list(zip(runs, paths, caches, compiled)),
                                            desc="time and memory of a training step", disable=not progress):
            measured = pool.submit(_measure, path, batch, steps, cache).result()
            if not measured["step_from_cache"]:
                warnings.warn(f"{run}: the measuring process compiled the step again (the compilation cache did "
                              "not keep it): its training MiB includes the compiler's memory")
            measured.update(run=str(run), compile_mib=first["training_mib"], first_compile_s=first["compile_s"])
            out.append(measured)
    return out


def _main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m diffeqformer.analysis.memory",
                                     description="time and peak memory of a run's training step (one JSON line)")
    parser.add_argument("run", metavar="RUN_DIR")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args(argv)
    print(json.dumps(measure_training_step(args.run, batch=args.batch, steps=args.steps)))


if __name__ == "__main__":
    _main()
