"""F7-F10's words: fine-tuning's scale, the ablations' headlines and changes, and the memory measurement's wording."""

from __future__ import annotations

import math

import pandas as pd

from ...analysis import ablations, statistics
from ...analysis.memory import PARAMETER_BYTES
from . import statistics as wording


def finetune_secondary(found) -> pd.DataFrame:
    """F7's exploratory comparisons (``ablations.finetune_secondary``) as the page's table: the ratio in percent with
    its 95% interval, p, which way it points against its method's claim (``wording.exploratory``: no headline verdict's
    word), whether it is negligible and the smallest ratio the design detects 80% of the time."""
    return pd.DataFrame([{"method": r.method, "direction": r.direction, "N": r.N, "effect (95% CI)": wording.effect(v),
                          "p": v.p, "exploratory result": wording.exploratory(v),
                          "negligible": "yes" if v.negligible else "", "detectable at 80%": wording.detectable(v),
                          "pretraining seeds": v.n}
                         for r in found.itertuples() for v in [r.verdict]])


def finetune_scale(table) -> str:
    """F7's captions: the pretrainings' and fine-tunings' scale, read from a ``finetune_table``'s first fine-tuning."""
    d = ablations.describe(table[~table.model.str.contains("from scratch")].run.iloc[0])
    pre = d["config"].pretrain.config
    trainer = d["config"].trainer
    return (f"pretrained as in {pre} ({d['hidden_dim']}-d), fine-tuned {trainer.num_train_steps} steps of "
            f"{trainer.train_batch_size} sequences")


def finetune_steps(table, paper) -> str:
    """F7's sentence on the fine-tuned step counts N of a ``finetune_table`` against the paper's, ``paper``
    (``finetune.DISCRETISATIONS``), naming any N left out and why."""
    run = sorted({int(m.removeprefix("DiffEqFormer N=")) for m in table.model if m.startswith("DiffEqFormer N=")})
    named = ", ".join(map(str, run[:-1])) + (" and " if len(run) > 1 else "") + str(run[-1])
    left_out = [n for n in paper if n not in run]
    if not left_out:
        return f"These runs fine-tune with every N of the paper's Fig. 5: {named}."
    return (f"These runs fine-tune with N = {named}, leaving out the paper's N = {', '.join(map(str, left_out))}: "
            "every N is one fine-tuning per direction, method and pretraining seed, and a preset built on a CPU in "
            "minutes keeps fewer of them (the cpu preset runs fewer steps, the pretraining's and more; the gpu and "
            "paper presets run the paper's four).")


def change_words(comparison) -> str:
    """A ``statistics.Comparison`` of log-perplexities: ``-9.5% (95% CI -12.0% to -7.0%), p = 0.01, paired t-test over
    3 seeds: significant``; ``+0.4%: untested: 1 seed``."""
    change = f"{statistics.percent(comparison.difference):+.1f}%"
    if comparison.untested:
        return f"{change}: {comparison.verdict}"
    interval = ("" if math.isnan(comparison.low) else
                f" (95% CI {statistics.percent(comparison.low):+.1f}% to {statistics.percent(comparison.high):+.1f}%)")
    return (f"{change}{interval}, {wording.p_text(comparison.p)}, {comparison.test} over {comparison.n} seeds: "
            f"{comparison.verdict}")


def beta2_headline(table) -> dict[str, str]:
    """F8, per model key of a ``beta2_table``: the perplexity at each beta2 (mean ± sd over seeds) and the change at
    the lower beta2 with its verdict (exploratory: ``beta2_verdicts`` judges the claim by the interaction)."""
    out = {}
    for key, rows in table.groupby("key", sort=False):
        values = ", ".join(f"{wording.spread(r.finals)} at beta2 = {r.beta2:g}" for r in rows.itertuples())
        low = rows[rows.beta2 < 0.999].change
        change = low.iloc[0] if len(low) else None
        text = f" (the lower beta2: {change_words(change)})" if isinstance(change, statistics.Comparison) else ""
        out[key] = f"{rows.model.iloc[0]}: {values}{text}"
    return out


def time_embedding_headline(table, verdicts) -> dict[str, str]:
    """F9: how perplexity (mean over seeds), parameters, throughput and measured memory change from the smallest to
    the largest d_t of a ``time_embedding_table`` and the trend over every d_t (``verdicts["f9_dt"]``); how the
    memory grows against the parameters is ``memory_table``'s."""
    lo, hi = table.iloc[0], table.iloc[-1]
    memory = ablations.memory_column(table)
    speed = "step tokens/s" if "step tokens/s" in table else "tokens/s"
    return {
        "range": f"d_t = {int(lo.d_t)} to {int(hi.d_t)}",
        "ppl": " to ".join(wording.spread(r.finals) for r in (lo, hi)),
        "best_dt": f"{int(table.loc[table['final ppl'].idxmin(), 'd_t'])}",
        "params": f"{lo.params / 1e6:.2f}M to {hi.params / 1e6:.2f}M (x{hi.params / lo.params:.2f})",
        "throughput": f"x{hi[speed] / lo[speed]:.2f}",
        "memory": (f"x{hi[memory] / lo[memory]:.2f} ({lo[memory]:.0f} to {hi[memory]:.0f} MiB, "
                   f"{ablations.MEMORY_SOURCES[memory]})" if memory else "not measured"),
        "trend": wording.verdict(verdicts["f9_dt"]),
    }


def memory_table(table, gpu, *, batch: int | None = None) -> pd.DataFrame:
    """F9's memory against the parameters over the d_t sweep, a row per measurement: this preset's (the verdict's,
    ``ablations.memory_column``; then its resident memory where that is another) and the GPU sweep's (``gpu``, a
    ``MemoryGrowth``). How much the memory and the parameters grew from the fewest parameters to the most, the
    memory's share of the parameters' growth and whether Fig. 16's claim as the paper words it holds there (a share
    below one half); then the fitted line, exploratory: bytes per added parameter (``PARAMETER_BYTES`` is what its
    own training state takes) and the memory that does not grow with them. ``batch``: the measured step's."""
    found = {}
    column = ablations.memory_column(table)
    for name in dict.fromkeys((column, "training MiB")) if column is not None else ():
        if name in table:
            found[f"this preset: {ablations.MEMORY_SOURCES[name]}"] = ablations.time_embedding_memory(table, name,
                                                                                                     batch=batch)
    found["GPU sweep"] = gpu
    return pd.DataFrame([{"memory": name, "memory x": g.memory_ratio, "parameters x": g.params_ratio,
                          "share of their growth": g.growth_ratio,
                          "Fig. 16's claim": "holds" if g.grows_far_less else "does not hold",
                          "B per added parameter": g.per_parameter, "not growing": size(g.fixed),
                          "measured as": g.source} for name, g in found.items()]).set_index("memory")


def hypernetwork_headline(table) -> dict[str, str]:
    """F10: per-weight MLPs against one shared MLP (final validation perplexity over seeds, parameters)."""
    rows = table.set_index("hypernet")
    if not {"per_weight", "shared_mlp"} <= set(rows.index):
        return {"comparison": "The preset did not train both hypernetwork designs."}
    a, b = rows.loc["per_weight"], rows.loc["shared_mlp"]
    return {"comparison": (f"per-weight MLPs {wording.spread(a.finals)} ({a.params / 1e6:.2f}M parameters) "
                           f"against one shared MLP {wording.spread(b.finals)} ({b.params / 1e6:.2f}M)")}


def size(n: float) -> str:
    """Bytes in GiB or MiB: ``2.80 GiB``, ``40.0 MiB``."""
    return f"{n / 2**30:.2f} GiB" if abs(n) >= 2**30 else f"{n / 2**20:.1f} MiB"


def memory_explanation(growth) -> str:
    """How much the memory grew for what the parameters grew, then, exploratory, what an added parameter costs
    against its training state and why the memory grows less than the parameters all the same."""
    half = "less" if growth.far_less else "more"
    return (f"memory x{growth.memory_ratio:.2f} where the parameters grow x{growth.params_ratio:.2f}: "
            f"{growth.growth_ratio:.2f} of their growth. Exploratory, stricter: an added parameter costs "
            f"{growth.per_parameter:.1f} B against the {PARAMETER_BYTES} B of its own training state (f32 parameter, "
            f"gradient, Adam's two moments), {half} than half, and {size(growth.fixed)} of the memory does not grow "
            "with d_t (activations, the weights generated for a forward pass, workspace): that part is what the "
            "paper's explanation, weights computed once per forward pass, is about.")


def memory_note(growth) -> str:
    """The note of F9's memory verdict (``ablations.time_embedding_verdicts``)."""
    return f"{memory_explanation(growth)} ({growth.source})"
