"""F6: validation perplexity of trained runs, as curves over training and as the paper's Tables 1-2.

Runs are named by a *row key* (``ROWS``): which model of the paper's tables the run stands for at our scale, e.g.
``gpt`` (GPT-small), ``shared`` (the weight-shared model), ``ours`` (DiffEqFormer-small), ``llama`` /
``ours_llama`` (Llama-1B and DiffEqFormer's Llama variant). ``curves`` and ``final_table`` read each run's
``metrics.jsonl`` and ``complete.json``; ``plot_curves`` draws Fig. 4-style validation curves.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from .figures import log_perplexity_axis, run_path


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


def check_runs(runs: Mapping[str, str]) -> dict[str, Path]:
    """``runs`` (row key -> run directory, absolute or relative to DIFFEQFORMER_HOME) validated: known keys,
    directories of finished runs."""
    out = {}
    for key, run in runs.items():
        if key not in ROWS:
            raise ValueError(f"unknown row key {key!r}; known: {', '.join(ROWS)}")
        path = run_path(run)
        if not (path / "complete.json").exists():
            raise FileNotFoundError(f"runs[{key!r}] = {run}: no finished run there (no complete.json)")
        out[key] = path
    return out


def curves(runs: Mapping[str, str]):
    """Validation perplexity over training: a DataFrame with columns ``row``, ``label``, ``step``, ``eval_loss``,
    ``perplexity`` (exp of the mean validation loss per token) and ``train_perplexity`` (of the training loss
    logged at the same step)."""
    import pandas as pd

    from .train import read_metrics

    frames = []
    for key, run in check_runs(runs).items():
        m = read_metrics(run)
        if "eval/loss" not in m:
            raise ValueError(f"{run}: the metrics hold no validation loss (eval/loss)")
        ev = m["eval/loss"].dropna()
        train = m["train/loss"].reindex(ev.index) if "train/loss" in m else float("nan")
        frames.append(pd.DataFrame({"row": key, "label": ROWS[key].label, "step": ev.index.astype(int),
                                    "eval_loss": ev.values, "perplexity": ev.map(math.exp).values,
                                    "train_perplexity": pd.Series(train).map(math.exp).values}))
    return pd.concat(frames, ignore_index=True)


def final_table(runs: Mapping[str, str]):
    """One row per run (index: its row key), in the tables' order: final and best validation perplexity, the change
    of the final one against its baseline in percent (negative: better), training throughput, and the paper's row
    (T1/T2: Table 1/2) and number beside it."""
    import pandas as pd

    frame = curves(runs)
    records = []
    for key in [k for k in ROWS if k in runs]:
        c = frame[frame.row == key]
        done = json.loads((run_path(runs[key]) / "complete.json").read_text())
        records.append({
            "key": key, "model": ROWS[key].label, "steps": done.get("steps"),
            "final ppl": float(c.perplexity.iloc[-1]), "best ppl": float(c.perplexity.min()),
            "tokens/s": done.get("tokens_per_second"),
            "paper row": f"{ROWS[key].table.split(' (')[0].replace('Table ', 'T')} {ROWS[key].paper_row}",
            "paper ppl": ROWS[key].paper_value,
        })
    table = pd.DataFrame.from_records(records).set_index("key")
    table.insert(4, "vs baseline %", [
        _relative(table, key, BASELINE_OF.get(key)) for key in table.index
    ])
    return table


def _relative(table, key, base):
    if base is None or base not in table.index:
        return float("nan")
    return 100.0 * (table.loc[key, "final ppl"] / table.loc[base, "final ppl"] - 1.0)


def sentences(table) -> dict[str, str]:
    """Short sentences for the book's prose, one per comparison, that say plainly when a run is absent.

    Keys: ``shared`` (the weight-shared model against GPT-2), ``llama`` (DiffEqFormer's Llama variant against
    Llama)."""
    def ppl(key):
        return f"{table.loc[key, 'final ppl']:.1f}"

    out = {}
    if {"shared", "gpt"} <= set(table.index):
        out["shared"] = (f"The weight-shared model ends at {ppl('shared')} "
                         f"({table.loc['shared', 'vs baseline %']:+.1f}% against GPT-2).")
    else:
        out["shared"] = "No weight-shared run is trained at this preset."
    if {"llama", "ours_llama"} <= set(table.index):
        out["llama"] = (f"With Llama's components, DiffEqFormer ends at {ppl('ours_llama')} against Llama's "
                        f"{ppl('llama')} ({table.loc['ours_llama', 'vs baseline %']:+.1f}%).")
    else:
        out["llama"] = "No Llama pair is trained at this preset."
    return out


def headline(table) -> dict[str, str]:
    """The numbers the book's prose quotes, formatted: GPT-2's and DiffEqFormer's final validation perplexity, the
    change between them, and the sentences of ``sentences``. Needs the rows ``gpt`` and ``ours``."""
    missing = [k for k in ("gpt", "ours") if k not in table.index]
    if missing:
        raise ValueError(f"F6 needs runs for the rows {missing} (runs={{'gpt': ..., 'ours': ...}})")
    return {"ppl_gpt": f"{table.loc['gpt', 'final ppl']:.1f}", "ppl_ours": f"{table.loc['ours', 'final ppl']:.1f}",
            "change_ours": f"{table.loc['ours', 'vs baseline %']:+.1f}%",
            "steps": str(table.loc["ours", "steps"]), **{f"{k}_sentence": v for k, v in sentences(table).items()}}


def plot_curves(frame, ax=None, *, log: bool = True):
    """Validation perplexity against training step, one line per run (dashed: the training perplexity)."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4))
    for key in [k for k in ROWS if k in set(frame.row)]:
        c = frame[frame.row == key]
        (line,) = ax.plot(c.step, c.perplexity, marker="o", ms=3, lw=1.4, label=ROWS[key].label)
        ax.plot(c.step, c.train_perplexity, ls="--", lw=0.8, color=line.get_color(), alpha=0.6)
    ax.set_ylabel("perplexity (solid: validation, dashed: training)")
    if log:
        log_perplexity_axis(ax, "perplexity (solid: validation, dashed: training)")
    ax.set_xlabel("training step")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    return ax
