"""F6: validation perplexity of trained runs, as curves over training and as the paper's Tables 1-2.

Runs are named by a *row key* (``ROWS``): the model of the paper's tables the run stands for at our scale (``gpt``,
``shared``, ``ours``, ``llama``, ``ours_llama``, ...). Overfitting is measured on each run's own curves two ways
(``overfitting``); the training loss is the one the trainer logs, with dropout on, so the gap of a model trained with
dropout understates how much better it fits its training data than new data.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from ..runs import require_complete, summary
from . import claims
from .statistics import Comparison, as_list, compare_seeds, percent, spread


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
    """``runs`` (row key -> a run directory, or a list of them: the row's seeds) as finished runs' directories."""
    out = {}
    for key, value in runs.items():
        if key not in ROWS:
            raise ValueError(f"unknown row key {key!r}; known: {', '.join(ROWS)}")
        if not as_list(value):
            raise ValueError(f"runs[{key!r}] names no run")
        out[key] = [require_complete(run, label=f"runs[{key!r}] =") for run in as_list(value)]
    return out


def curves(runs: Mapping[str, str | Sequence[str]]):
    """Validation perplexity over training, per ``row``, ``label``, ``seed``, ``step``: ``eval_loss``, ``perplexity``,
    ``train_perplexity`` and ``train_loss_interval`` (mean training loss since the previous evaluation; NaN if none)."""
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


def final_losses(frame) -> dict[str, list[float]]:
    """Row key -> the final validation loss (the log of the perplexity) of each of its seeds, from ``curves``."""
    out: dict[str, list[float]] = {}
    for (key, _), c in frame.sort_values("step").groupby(["row", "seed"], sort=False):
        out.setdefault(key, []).append(float(c.eval_loss.iloc[-1]))
    return out


def overfitting(frame) -> dict[str, dict[str, list[float]]]:
    """Row key -> measure -> its value per seed, in nats, from ``curves``: ``rise`` (final less best validation loss)
    and ``gap`` (final validation loss less the mean training loss of the last interval; NaN without one)."""
    out: dict[str, dict[str, list[float]]] = {}
    for (key, _), c in frame.sort_values("step").groupby(["row", "seed"], sort=False):
        last = c.iloc[-1]
        values = out.setdefault(key, {m: [] for m in OVERFIT_MEASURES})
        values["rise"].append(float(last.eval_loss - c.eval_loss.min()))
        values["gap"].append(float(last.eval_loss - last.train_loss_interval))
    return out


def comparisons(frame) -> dict[str, Comparison]:
    """Row key -> its final log-perplexities compared with its baseline's (``BASELINE_OF``) over their shared seeds
    (``statistics.compare_seeds``: the log of the perplexities' ratio), for the rows whose baseline is there."""
    losses = final_losses(frame)
    return {key: compare_seeds(losses[key], losses[base]) for key, base in BASELINE_OF.items()
            if key in losses and base in losses}


def worst_comparisons(losses: Mapping[str, Sequence[float]]) -> dict[str, dict[str, Comparison]]:
    """Row key of ``WORST_OF`` -> each row it must be worse than -> their final log-perplexities compared
    (``statistics.compare_seeds``), for the rows that are there; ``losses``: ``final_losses``."""
    return {key: {other: compare_seeds(losses[key], losses[other]) for other in others if other in losses}
            for key, others in WORST_OF.items() if key in losses}


def overfit_comparisons(measures: Mapping[str, Mapping[str, Sequence[float]]]) -> dict[str, dict[str, Comparison]]:
    """Row key -> measure -> the row's overfitting (``overfitting``) compared with its baseline's (``BASELINE_OF``;
    negative: the row overfits less), for the rows whose baseline is there and the measures both logged."""
    out: dict[str, dict[str, Comparison]] = {}
    for key, base in BASELINE_OF.items():
        if key in measures and base in measures:
            out[key] = {m: compare_seeds(measures[key][m], measures[base][m])
                        for m in OVERFIT_MEASURES
                        if all(math.isfinite(v) for v in (*measures[key][m], *measures[base][m]))}
    return out


def verdicts(frame) -> dict[str, claims.Verdict]:
    """The verdicts on F6's claims (``claims.CLAIMS``), each from its primary test: ``f6_ours``, ``f6_llama`` and
    ``f6_overfit`` paired t-tests, ``f6_shared`` the intersection-union test of both (untested without its runs)."""
    versus = comparisons(frame)
    out = {}
    for name, key in (("f6_ours", "ours"), ("f6_llama", "ours_llama")):
        pair = f"{ROWS[key].label} and {ROWS[BASELINE_OF[key]].label}"
        out[name] = (claims.judge(name, versus[key]) if key in versus
                     else claims.untested(name, f"this preset trains no {pair}"))
    worst = worst_comparisons(final_losses(frame)).get("shared", {})
    if len(worst) == len(WORST_OF["shared"]):
        out["f6_shared"] = claims.intersection(
            "f6_shared", {f"the comparison with {ROWS[k].label}": c for k, c in worst.items()})
    else:
        out["f6_shared"] = claims.untested("f6_shared", "this preset does not train the weight-shared model, GPT-2 "
                                                        "and DiffEqFormer together")
    overfit = overfit_comparisons(overfitting(frame)).get("ours", {})
    out["f6_overfit"] = (claims.judge("f6_overfit", overfit["rise"]) if "rise" in overfit
                         else claims.untested("f6_overfit", "this preset trains no DiffEqFormer and GPT-2"))
    return {name: out[name] for name in ("f6_ours", "f6_shared", "f6_overfit", "f6_llama")}


def _params(run) -> float:
    """A run's parameter count: its summary's, else counted on a shape-only build of its config (NaN where the run
    keeps no config)."""
    from ..runs import CONFIG, parameter_count, run_path

    done = summary(run)
    if done.get("total_params"):
        return float(done["total_params"])
    return float(parameter_count(run)) if (run_path(run) / CONFIG).exists() else math.nan


MAIN_COLUMNS = ("model", "paper row", "paper ppl", "final ppl", "vs baseline %", "95% CI %")
"""The columns of ``final_table`` that its page shows first: the paper's, then ours beside them."""


def final_table(runs: Mapping[str, str | Sequence[str]]):
    """One row per row key in the tables' order: sizes, seeds, final perplexity (mean, sd), best, the change against
    its baseline (``comparisons``: interval, p, verdict), ``overfitting``, throughput, the paper's number."""
    import pandas as pd

    frame = curves(runs)
    losses, versus, overfit = final_losses(frame), comparisons(frame), overfitting(frame)
    records = []
    for key in [k for k in ROWS if k in runs]:
        c = frame[frame.row == key]
        done = [summary(r) for r in as_list(runs[key])]
        final = spread(math.exp(v) for v in losses[key])
        vs = versus.get(key)
        records.append({
            "key": key, "model": ROWS[key].label, "params": _params(as_list(runs[key])[0]),
            "steps": done[0].get("steps"), "seeds": final.n, "final ppl": final.mean, "sd": final.sd,
            "best ppl": float(c.groupby("seed").perplexity.min().mean()),
            "vs baseline %": percent(vs.difference) if vs else math.nan,
            "95% CI %": _interval_percent(vs) if vs else "",
            "p": vs.p if vs else math.nan, "verdict": vs.verdict if vs else "",
            "rise %": percent(statistics.fmean(overfit[key]["rise"])),
            "rise sd": _sd([percent(v) for v in overfit[key]["rise"]]),
            "gap nats": statistics.fmean(overfit[key]["gap"]), "gap sd": _sd(overfit[key]["gap"]),
            "tokens/s": statistics.fmean(d.get("tokens_per_second") or math.nan for d in done),
            "paper row": f"{ROWS[key].table.split(' (')[0].replace('Table ', 'T')} {ROWS[key].paper_row}",
            "paper ppl": ROWS[key].paper_value,
        })
    return pd.DataFrame.from_records(records).set_index("key")


def _interval_percent(c: Comparison) -> str:
    """The 95% interval of a log-ratio comparison in percent: ``[-15.1, -3.0]`` (empty without one)."""
    if c.untested or math.isnan(c.low):
        return ""
    return f"[{percent(c.low):+.1f}, {percent(c.high):+.1f}]"


def _sd(values: Sequence[float]) -> float:
    """Standard deviation over seeds (NaN with one seed, or where a value is NaN)."""
    return statistics.stdev(values) if len(values) > 1 else math.nan


TABLE_FORMATS = {"params": "{:,.0f}", "p": "{:.2g}", "gap nats": "{:.3f}", "gap sd": "{:.3f}", "paper ppl": "{:.2f}"}
"""How the F6 table's columns are written (``report.figures.save_table``'s ``formats``)."""
