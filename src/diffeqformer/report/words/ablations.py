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


def time_embedding_headline(table, verdicts, *, batch: int | None = None) -> dict[str, str]:
    """F9: how perplexity (mean over seeds), parameters, throughput and measured memory change from the smallest to
    the largest d_t of a ``time_embedding_table``, the trend over every d_t (``verdicts["f9_dt"]``), what an added
    parameter costs (``memory_growth``: of ``time_embedding_memory``; ``memory_rss``: of the resident memory, where
    measured). ``batch``: the sequences of the measured step."""
    lo, hi = table.iloc[0], table.iloc[-1]
    memory = ablations.memory_column(table)
    speed = "step tokens/s" if "step tokens/s" in table else "tokens/s"
    out = {
        "range": f"d_t = {int(lo.d_t)} to {int(hi.d_t)}",
        "ppl": " to ".join(wording.spread(r.finals) for r in (lo, hi)),
        "best_dt": f"{int(table.loc[table['final ppl'].idxmin(), 'd_t'])}",
        "params": f"{lo.params / 1e6:.2f}M to {hi.params / 1e6:.2f}M (x{hi.params / lo.params:.2f})",
        "throughput": f"x{hi[speed] / lo[speed]:.2f}",
        "memory": (f"x{hi[memory] / lo[memory]:.2f} ({lo[memory]:.0f} to {hi[memory]:.0f} MiB, "
                   f"{ablations.MEMORY_SOURCES[memory]})" if memory else "not measured"),
        "trend": wording.verdict(verdicts["f9_dt"]),
        "memory_growth": "not measured", "memory_rss": "not measured",
    }
    if memory is not None:
        out["memory_growth"] = memory_growth_text(ablations.time_embedding_memory(table, memory, batch=batch))
        if memory != "training MiB" and "training MiB" in table:
            out["memory_rss"] = memory_growth_text(ablations.time_embedding_memory(table, "training MiB", batch=batch))
    return out


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


def memory_growth_text(growth) -> str:
    """A ``MemoryGrowth``: ``14.0 B per added parameter (16 expected), 2.80 GiB that does not grow with them; memory
    x3.18 for parameters x5.67 (H100 ...)``."""
    return (f"{growth.per_parameter:.1f} B per added parameter ({PARAMETER_BYTES} expected), "
            f"{size(growth.fixed)} that does not grow with them; memory x{growth.memory_ratio:.2f} for parameters "
            f"x{growth.params_ratio:.2f} ({growth.source})")


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


def memory_verdict(growth) -> str:
    """Whether Fig. 16's claim, as the paper words it (``MemoryGrowth.grows_far_less``), holds in a sweep that is
    not the book's headline measurement (the GPU benchmark's), then ``memory_explanation``."""
    word = "holds" if growth.grows_far_less else "does not hold"
    return f"Fig. 16's claim, as the paper words it, {word} in this sweep ({growth.source}): " \
           f"{memory_explanation(growth)}"
