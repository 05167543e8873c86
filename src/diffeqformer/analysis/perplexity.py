"""F6: validation perplexity of trained runs, as curves over training and as the paper's Tables 1-2.

Runs are named by a *row key* (``ROWS``): which model of the paper's tables the run stands for at our scale, e.g.
``gpt`` (GPT-small), ``shared`` (the weight-shared model), ``ours`` (DiffEqFormer-small), ``llama`` /
``ours_llama`` (Llama-1B and DiffEqFormer's Llama variant). ``curves`` and ``final_table`` read each run's
``metrics.jsonl`` and ``complete.json``; ``plot_curves`` draws Fig. 4-style validation curves.

Overfitting is measured on each run's own curves, two ways (``overfitting``): how far the validation perplexity has
risen above its best by the end of training (``rise``: 0 when the last evaluation is the best), and the gap between
the final validation loss and the mean training loss over the last evaluation interval (``gap``, in nats: the log
of the ratio of the two perplexities). The training loss is the one the trainer logs, with dropout on, so the gap
of a model trained with dropout understates how much better it fits its training data than new data.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from ..report.figures import log_perplexity_axis
from ..runs import require_complete, summary
from .seeds import NOISE, RESULT, RULE, Comparison, as_list, compare, spread


@dataclass(frozen=True)
class Row:
    """One model of the paper's perplexity tables."""

    label: str
    """How the book names our run."""
    table: str
    """The paper's table (and corpus) the row belongs to."""
    paper_row: str
    """The row's name in the paper."""
    paper_value: float | None = None
    """The paper's perplexity. None: the cell is empty in the paper text this project has (seeds/paper-text.txt
    lost the tables' numbers in extraction); put the number here when it is known and the table shows it."""


T1, T2 = "Table 1 (WikiText-103)", "Table 2 (OpenWebText)"
ROWS: dict[str, Row] = {
    "gpt": Row("GPT-2", T1, "GPT-small"),
    "shared": Row("weight-shared", T1, "Shared parameter (small)"),
    "ours": Row("DiffEqFormer", T1, "Our model-small"),
    "gpt_medium": Row("GPT-2 medium", T1, "GPT-medium"),
    "shared_medium": Row("weight-shared medium", T1, "Shared parameter (medium)"),
    "ours_medium": Row("DiffEqFormer medium", T1, "Our model-medium"),
    "owt_gpt_small": Row("GPT-2 small (OWT)", T2, "GPT-small"),
    "owt_ours_small": Row("DiffEqFormer small (OWT)", T2, "Our model-small"),
    "owt_gpt_medium": Row("GPT-2 medium (OWT)", T2, "GPT-medium"),
    "owt_ours_medium": Row("DiffEqFormer medium (OWT)", T2, "Our model-medium"),
    "owt_gpt_large": Row("GPT-2 large (OWT)", T2, "GPT-large"),
    "owt_ours_large": Row("DiffEqFormer large (OWT)", T2, "Our model-large"),
    "llama": Row("Llama", T2, "Llama-1B"),
    "ours_llama": Row("DiffEqFormer (Llama)", T2, "Our Llama-1B"),
}
"""Every row key a run may be given under, in the order the tables list them."""

BASELINE_OF = {"ours": "gpt", "shared": "gpt", "ours_medium": "gpt_medium", "shared_medium": "gpt_medium",
               "owt_ours_small": "owt_gpt_small", "owt_ours_medium": "owt_gpt_medium",
               "owt_ours_large": "owt_gpt_large", "ours_llama": "llama"}
"""Which baseline each row is compared with (the 'vs baseline' column)."""

WORST_OF = {"shared": ("gpt", "ours"), "shared_medium": ("gpt_medium", "ours_medium")}
"""The rows the paper calls worst (weight sharing, Table 1) and the rows it must be worse than, as results, to be
the worst."""

OVERFIT_MEASURES = {"rise": "final rise of the validation perplexity above its best",
                    "gap": "final gap of validation over training loss"}
"""The measures of overfitting (``overfitting``), as the sentences name them."""


def check_runs(runs: Mapping[str, str | Sequence[str]]) -> dict[str, list[Path]]:
    """``runs`` (row key -> a run directory, or a list of them: the seeds of that row; absolute or relative to
    DIFFEQFORMER_HOME) validated: known keys, directories of finished runs."""
    out = {}
    for key, value in runs.items():
        if key not in ROWS:
            raise ValueError(f"unknown row key {key!r}; known: {', '.join(ROWS)}")
        seeds = as_list(value)
        if not seeds:
            raise ValueError(f"runs[{key!r}] names no run")
        out[key] = []
        for run in seeds:
            out[key].append(require_complete(run, label=f"runs[{key!r}] ="))
    return out


def curves(runs: Mapping[str, str | Sequence[str]]):
    """Validation perplexity over training: a DataFrame with columns ``row``, ``label``, ``seed`` (the run's place
    in its row's list), ``step``, ``eval_loss``, ``perplexity`` (exp of the mean validation loss per token),
    ``train_perplexity`` (of the training loss logged at the same step) and ``train_loss_interval`` (the mean
    training loss over the steps since the previous evaluation, this one's included; NaN where none was logged)."""
    import numpy as np
    import pandas as pd

    from ..runs import read_metrics

    frames = []
    for key, seed_runs in check_runs(runs).items():
        for seed, run in enumerate(seed_runs):
            m = read_metrics(run)
            if "eval/loss" not in m:
                raise ValueError(f"{run}: the metrics hold no validation loss (eval/loss)")
            ev = m["eval/loss"].dropna()
            logged = m["train/loss"].dropna() if "train/loss" in m else pd.Series(dtype=float)
            train = logged.reindex(ev.index)
            since = np.concatenate([[-np.inf], ev.index[:-1]])
            interval = [logged[(logged.index > a) & (logged.index <= b)].mean() for a, b in zip(since, ev.index)]
            frames.append(pd.DataFrame({"row": key, "label": ROWS[key].label, "seed": seed,
                                        "step": ev.index.astype(int), "eval_loss": ev.values,
                                        "perplexity": ev.map(math.exp).values,
                                        "train_perplexity": train.map(math.exp).values,
                                        "train_loss_interval": np.asarray(interval, dtype=float)}))
    return pd.concat(frames, ignore_index=True)


def final_perplexities(frame) -> dict[str, list[float]]:
    """Row key -> the final validation perplexity of each of its seeds, from ``curves``."""
    out: dict[str, list[float]] = {}
    for (key, _), c in frame.sort_values("step").groupby(["row", "seed"], sort=False):
        out.setdefault(key, []).append(float(c.perplexity.iloc[-1]))
    return out


def overfitting(frame) -> dict[str, dict[str, list[float]]]:
    r"""Row key -> measure -> its value for each seed, from ``curves``; the measures (``OVERFIT_MEASURES``):

    - ``rise``: final minus best validation perplexity over the run, :math:`\mathrm{ppl}_T - \min_s
      \mathrm{ppl}_s` (0 when the last evaluation is the best);
    - ``gap``: final validation loss minus the mean training loss over the last evaluation interval (the steps
      after the evaluation before it, up to it), in nats; :math:`e^{\mathrm{gap}}` is the ratio of the validation
      perplexity to the training perplexity of that interval. NaN where the run logged no training loss."""
    out: dict[str, dict[str, list[float]]] = {}
    for (key, _), c in frame.sort_values("step").groupby(["row", "seed"], sort=False):
        last = c.iloc[-1]
        values = out.setdefault(key, {m: [] for m in OVERFIT_MEASURES})
        values["rise"].append(float(last.perplexity - c.perplexity.min()))
        values["gap"].append(float(last.eval_loss - last.train_loss_interval))
    return out


def _pair(values: Mapping[str, Sequence[float]], a: str, b: str) -> Comparison:
    """Row ``a``'s seed values against row ``b``'s (``seeds.RULE``). Seeds are matched by their place in the rows'
    lists: the pipeline trains every row as seeds 0..n-1 (``pipeline.seeded``), and seed k of two rows reads the
    training sequences in the same order, so rows with as many seeds are compared by the paired t-test, others by
    Welch's."""
    return compare(values[a], values[b], paired=len(values[a]) == len(values[b]))


def comparisons(frame) -> dict[str, Comparison]:
    """Row key -> its final perplexities compared with its baseline's (``BASELINE_OF``) over seeds, for the rows
    whose baseline is there (``seeds.RULE``, seeds matched as in ``_pair``)."""
    finals = final_perplexities(frame)
    return {key: _pair(finals, key, base) for key, base in BASELINE_OF.items() if key in finals and base in finals}


def worst_comparisons(finals: Mapping[str, Sequence[float]]) -> dict[str, dict[str, Comparison]]:
    """Row key of ``WORST_OF`` -> each row it must be worse than -> their final perplexities compared (``_pair``),
    for the rows that are there; ``finals``: ``final_perplexities``."""
    return {key: {other: _pair(finals, key, other) for other in others if other in finals}
            for key, others in WORST_OF.items() if key in finals}


def overfit_comparisons(measures: Mapping[str, Mapping[str, Sequence[float]]]) -> dict[str, dict[str, Comparison]]:
    """Row key -> measure -> the row's overfitting (``overfitting``) compared with its baseline's (``BASELINE_OF``;
    negative: the row overfits less), for the rows whose baseline is there and the measures both logged."""
    out: dict[str, dict[str, Comparison]] = {}
    for key, base in BASELINE_OF.items():
        if key in measures and base in measures:
            out[key] = {m: _pair({key: measures[key][m], base: measures[base][m]}, key, base)
                        for m in OVERFIT_MEASURES
                        if all(math.isfinite(v) for v in (*measures[key][m], *measures[base][m]))}
    return out


def final_table(runs: Mapping[str, str | Sequence[str]]):
    """One row per row key (the index), in the tables' order: seeds, mean final validation perplexity and its
    spread over seeds, mean best perplexity, the change of the mean final one against the row's baseline in percent
    (negative: better), whether that change is a result or within noise (``seeds.RULE``), the two measures of
    overfitting (``overfitting``: mean rise of the validation perplexity above its best, mean final
    validation-training gap in nats, each with its standard deviation over seeds), training throughput, and the
    paper's row (T1/T2: Table 1/2) and number beside it."""
    import pandas as pd

    frame = curves(runs)
    finals, versus, overfit = final_perplexities(frame), comparisons(frame), overfitting(frame)
    records = []
    for key in [k for k in ROWS if k in runs]:
        c = frame[frame.row == key]
        done = [summary(r) for r in as_list(runs[key])]
        final = spread(finals[key])
        vs = versus.get(key)
        records.append({
            "key": key, "model": ROWS[key].label, "steps": done[0].get("steps"), "seeds": final.n,
            "final ppl": final.mean, "sd": final.sd,
            "best ppl": float(c.groupby("seed").perplexity.min().mean()),
            "vs baseline %": 100.0 * vs.relative if vs else float("nan"),
            "verdict": vs.verdict if vs else "",
            "rise ppl": statistics.fmean(overfit[key]["rise"]), "rise sd": _sd(overfit[key]["rise"]),
            "gap nats": statistics.fmean(overfit[key]["gap"]), "gap sd": _sd(overfit[key]["gap"]),
            "tokens/s": statistics.fmean(d.get("tokens_per_second") or math.nan for d in done),
            "paper row": f"{ROWS[key].table.split(' (')[0].replace('Table ', 'T')} {ROWS[key].paper_row}",
            "paper ppl": ROWS[key].paper_value,
        })
    return pd.DataFrame.from_records(records).set_index("key")


def _sd(values: Sequence[float]) -> float:
    """Standard deviation over seeds (NaN with one seed, or where a value is NaN)."""
    return statistics.stdev(values) if len(values) > 1 else math.nan


def _versus(comparison: Comparison, name: str, base: str) -> str:
    """``DiffEqFormer ends below GPT-2 by 9.2% (-48.2, 95% CI [-60.1, -36.3], p = 0.003, paired t-test over 3
    seeds): a result.`` and its variants."""
    change = f"{100 * comparison.relative:+.1f}%"
    if comparison.untested:
        return (f"{name[:1].upper()}{name[1:]} against {base}: {change} ({comparison.n} seed: no spread to judge it "
                "by).")
    side = "below" if comparison.difference < 0 else "above"
    word = {RESULT: "a result", NOISE: "within noise"}[comparison.verdict]
    return (f"{name[:1].upper()}{name[1:]} ends {side} {base} by {abs(100 * comparison.relative):.1f}% "
            f"({comparison.difference:+.1f}, {comparison.interval()} over {comparison.n} seeds): {word}.")


def _worst(versus: Mapping[str, Comparison], key: str) -> str:
    """The weight-shared row ``key`` against each row of ``WORST_OF[key]`` and the verdict on "it is the worst"."""
    others = WORST_OF[key]
    parts = [_versus(versus[o], ROWS[key].label, ROWS[o].label) for o in others if o in versus]
    names = " and ".join(ROWS[o].label for o in others)
    worse = [ROWS[o].label for o in others if o in versus and versus[o].is_result and versus[o].difference > 0]
    if len(worse) == len(others):
        claim = f"So weight sharing is the worst of the three, worse than {names} as results, as the paper reports."
    else:
        claim = (f"So weight sharing is not shown to be the worst: that needs it worse than {names} as results, and "
                 f"it is worse as a result than {' and '.join(worse) if worse else 'neither'}.")
    return " ".join(parts + [claim])


def _overfits_less(versus: Mapping[str, Comparison], key: str) -> str:
    """Each measure of overfitting of row ``key`` against its baseline's (mean ± sd over seeds, the difference with
    its interval and verdict) and the verdict on "``key`` overfits less than its baseline": on each measure, a
    result only where the measure is lower as a result (``overfit_comparisons``)."""
    name, base = ROWS[key].label, ROWS[BASELINE_OF[key]].label
    if not versus:
        return f"Overfitting of {name} against {base}: the runs logged no training loss to measure it by."

    def mean_sd(s, digits):
        return f"{s.mean:.{digits}f}" + (f" ± {s.sd:.{digits}f}" if s.n > 1 else "")

    parts = []
    for m, c in versus.items():
        digits, unit = (3, " nats") if m == "gap" else (1, "")
        interval = "" if c.untested else f", {c.interval(digits)} over {c.n} seeds"
        parts.append(f"the {OVERFIT_MEASURES[m]} is {mean_sd(c.a, digits)} against {mean_sd(c.b, digits)}{unit} "
                     f"({c.difference:+.{digits}f}{interval}: {c.verdict})")
    less = [OVERFIT_MEASURES[m] for m, c in versus.items() if c.is_result and c.difference < 0]
    more = [OVERFIT_MEASURES[m] for m, c in versus.items() if c.is_result and c.difference > 0]
    if not less:
        claim = f"{name} does not overfit less than {base} as a result on either measure"
    elif len(less) == len(versus) == len(OVERFIT_MEASURES):
        claim = f"{name} overfits less than {base} as a result on both measures, as the paper reports"
    else:
        claim = f"{name} overfits less than {base} as a result on the {' and the '.join(less)} only"
    claim += f"; it overfits more on the {' and the '.join(more)}." if more else "."
    return f"Overfitting, {name} against {base}: " + "; ".join(parts) + f". {claim}"


def sentences(table, frame=None) -> dict[str, str]:
    """Short sentences for the book's prose, one per comparison, that say plainly when a run is absent and whether
    a difference is a result or within noise (``seeds.RULE``; ``frame``: ``curves``, else the table's numbers are
    taken as single seeds).

    Keys: ``ours`` (DiffEqFormer against GPT-2), ``shared`` (the weight-shared model against GPT-2 and DiffEqFormer,
    and whether it is the worst: ``WORST_OF``), ``overfit`` (DiffEqFormer's overfitting against GPT-2's on both
    measures of ``overfitting``, and whether it overfits less), ``llama`` (DiffEqFormer's Llama variant against
    Llama)."""
    if frame is not None:
        finals, measures = final_perplexities(frame), overfitting(frame)
    else:
        finals = {k: [table.loc[k, "final ppl"]] for k in table.index}
        measures = {k: {"rise": [table.loc[k, "rise ppl"]], "gap": [table.loc[k, "gap nats"]]} for k in table.index}
    versus = {key: _pair(finals, key, base) for key, base in BASELINE_OF.items() if key in finals and base in finals}
    out = {}
    for key, absent in (("ours", "No DiffEqFormer/GPT-2 pair is trained at this preset."),
                        ("llama", "No Llama pair is trained at this preset.")):
        row = "ours_llama" if key == "llama" else key
        out[key] = (_versus(versus[row], ROWS[row].label, ROWS[BASELINE_OF[row]].label) if row in versus
                    else absent)
    worst = worst_comparisons(finals)
    out["shared"] = _worst(worst["shared"], "shared") if "shared" in worst else (
        "No weight-shared run is trained at this preset.")
    overfit = overfit_comparisons(measures)
    out["overfit"] = _overfits_less(overfit["ours"], "ours") if "ours" in overfit else (
        "No DiffEqFormer/GPT-2 pair is trained at this preset.")
    return {k: out[k] for k in ("ours", "shared", "overfit", "llama")}


def headline(table, frame=None) -> dict[str, str]:
    """The numbers the book's prose quotes, formatted: GPT-2's and DiffEqFormer's final validation perplexity (mean
    ± sd over seeds), the change between them, the number of seeds, the rule, and the sentences of ``sentences``.
    Needs the rows ``gpt`` and ``ours``."""
    missing = [k for k in ("gpt", "ours") if k not in table.index]
    if missing:
        raise ValueError(f"F6 needs runs for the rows {missing} (runs={{'gpt': ..., 'ours': ...}})")

    def ppl(key):
        t = table.loc[key]
        return f"{t['final ppl']:.1f}" + (f" ± {t['sd']:.1f}" if t["seeds"] > 1 else "")

    seeds = sorted(set(int(n) for n in table["seeds"]))
    return {"ppl_gpt": ppl("gpt"), "ppl_ours": ppl("ours"),
            "change_ours": f"{table.loc['ours', 'vs baseline %']:+.1f}%",
            "steps": str(table.loc["ours", "steps"]),
            "seeds": " or ".join(map(str, seeds)) + (" seed" if seeds == [1] else " seeds"), "rule": RULE,
            **{f"{k}_sentence": v for k, v in sentences(table, frame).items()}}


def plot_curves(frame, ax=None, *, log: bool = True):
    """Validation perplexity against training step, one line per row: the mean over its seeds, with the band from
    the lowest to the highest seed where there are several (dashed: the mean training perplexity)."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4))
    for key in [k for k in ROWS if k in set(frame.row)]:
        by_step = frame[frame.row == key].groupby("step")
        val, seeds = by_step.perplexity, by_step.seed.nunique().max()
        label = ROWS[key].label + (f" ({seeds} seeds)" if seeds > 1 else "")
        (line,) = ax.plot(val.mean().index, val.mean().values, marker="o", ms=3, lw=1.4, label=label)
        if seeds > 1:
            ax.fill_between(val.min().index, val.min().values, val.max().values, color=line.get_color(), alpha=0.2,
                            lw=0)
        train = by_step.train_perplexity.mean()
        ax.plot(train.index, train.values, ls="--", lw=0.8, color=line.get_color(), alpha=0.6)
    ax.set_ylabel("perplexity (solid: validation, dashed: training)")
    if log:
        log_perplexity_axis(ax, "perplexity (solid: validation, dashed: training)")
    ax.set_xlabel("training step")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    return ax
