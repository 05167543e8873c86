"""F11: downstream zero- and few-shot evaluation with EleutherAI's lm-evaluation-harness, run through Levanter.

The paper's Tables 4-5 and Figs. 9-12 evaluate its OpenWebText models on ARC, HellaSwag, Lambada, LogiQA, MMLU,
PIQA, SciQ, Winogrande and WSC273. The harness downloads every task's data from the Hugging Face hub and is only
worth running on models trained on an English web corpus with a GPU, so ``availability`` says first whether this
machine can: the F11 notebook states the reason in the book instead of failing when it cannot.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

PAPER_TASKS = ("arc_easy", "arc_challenge", "hellaswag", "lambada_openai", "logiqa", "mmlu", "piqa", "sciq",
               "winogrande", "wsc273")
"""The paper's tasks (lm-evaluation-harness names)."""


@dataclass(frozen=True)
class Availability:
    """Whether the harness can run here, and if not, why (one sentence for the book)."""

    ok: bool
    reason: str


def availability(require_gpu: bool = True) -> Availability:
    """Check, in this order and cheaply, what the evaluation needs: the ``lm_eval`` package, the Hugging Face hub
    (the tasks' data), and a GPU (CPU evaluation of the paper's tasks takes days)."""
    from ..data.corpora import hub_reachable

    missing = []
    if importlib.util.find_spec("lm_eval") is None:
        missing.append("the lm-evaluation-harness package (pip install lm-eval) is not installed")
    if not hub_reachable():
        missing.append("the Hugging Face hub, where the tasks' data live, cannot be reached (no internet)")
    if require_gpu:
        import jax

        if jax.default_backend() != "gpu":
            missing.append(f"there is no GPU (JAX backend: {jax.default_backend()})")
    if missing:
        reason = "; ".join(missing) + "."
        return Availability(False, reason[0].upper() + reason[1:])
    return Availability(True, "lm-evaluation-harness, the hub and a GPU are available.")


def evaluate(run_dir: str | Path, tasks=PAPER_TASKS, *, num_fewshot: int = 0, max_examples: int | None = None,
             batch_size: int = 32):
    """Accuracy of a finished run on ``tasks`` with ``num_fewshot`` examples in context, as a DataFrame with
    columns ``task``, ``shots``, ``metric``, ``value``.

    The model is loaded with ``train.load_model`` and evaluated with Levanter's ``run_lm_eval_harness`` (the
    tokenizer is the run's own). Needs what ``availability`` checks. Not exercised by the test suite, which runs
    offline: it was written against Levanter 1.2.dev1644's API."""
    import haliax as hax
    import pandas as pd
    from levanter.eval_harness import LmEvalHarnessConfig, TaskConfig, run_lm_eval_harness

    from ..runs import config as run_config
    from ..runs import require_complete
    from ..train import load_model

    status = availability()
    if not status.ok:
        raise RuntimeError(f"cannot run the downstream evaluation here: {status.reason}")
    run_dir = require_complete(run_dir)
    config = run_config(run_dir)
    model = load_model(run_dir)
    tokenizer = config.data.levanter_config().the_tokenizer
    spec = [TaskConfig(task=t, num_fewshot=num_fewshot, task_alias=f"{t}_{num_fewshot}shot") for t in tasks]
    harness = LmEvalHarnessConfig(task_spec=spec, max_examples=max_examples, max_length=config.model.max_seq_len)
    outputs = run_lm_eval_harness(harness, model, tokenizer, hax.Axis("batch", batch_size), {}, None)
    rows = []
    for task, metrics in (outputs or {}).get("results", {}).items():
        for metric, value in metrics.items():
            if isinstance(value, (int, float)) and not metric.endswith("_stderr,none"):
                rows.append({"task": task.removesuffix(f"_{num_fewshot}shot"), "shots": num_fewshot,
                             "metric": metric.split(",")[0], "value": float(value)})
    return pd.DataFrame(rows)


def plot_accuracies(frame, ax=None):
    """Bar chart of ``evaluate``'s accuracies (metric ``acc``), one group per task, one bar per few-shot setting."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(9, 3.6))
    acc = frame[frame.metric == "acc"].pivot_table(index="task", columns="shots", values="value")
    acc.plot.bar(ax=ax, rot=30)
    ax.set_ylabel("accuracy")
    ax.legend(title="shots")
    return ax
