"""F11: downstream zero- and few-shot evaluation with EleutherAI's lm-evaluation-harness, run through Levanter.

The paper (Tables 4-5, Figs. 9-12) evaluates its OpenWebText models zero- and five-shot on ARC, HellaSwag, LAMBADA,
LogiQA, MMLU, PIQA, SciQ, Winogrande and WSC273 (``PAPER_TASKS``), whose data live on the Hugging Face hub, and
reports its largest gain on LAMBADA. Offline, F11 evaluates on tasks built in their manner from the corpus's
held-out documents (``diffeqformer.data.tasks``: a LAMBADA-style last-word task and a HellaSwag-style next-line
task); online, the paper's tasks run by name as well (``require_hub``).

Every model is evaluated by Levanter's ``run_lm_eval_harness``, which hands lm-eval a ``LevanterHarnessLM`` that
packs many requests into each sequence of the model's length. Two adaptations, both for correctness:

* ``SegmentPositions``: Levanter's packed batch separates the requests by segment ids in the attention mask, but
  calls the model without position ids, so a request packed behind another would read the positions after it; a
  model with learned positions (GPT-2's, DiffEqFormer's) would then see each request at another offset than a
  sequence of its own. The wrapper counts positions from each request's first token: every request is scored as if
  it were alone (``tests/test_downstream.py`` checks this against the model run on each request alone).
* ``HarnessConfig``: Levanter's config loads tasks with lm-eval's default task index (all of lm-eval's ~14,000
  task files, seconds a call: measurements page); this one indexes the held-out task files alone unless a paper task
  is asked for.

``evaluate`` runs one model on all tasks and shot counts in one harness call, cached by the model's weights and the
task files' hashes; ``evaluate_runs`` runs every seed of every model; ``summary`` and ``comparisons`` turn the
accuracies into means over seeds and verdicts by ``seeds.RULE``.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import equinox as eqx
import haliax as hax
import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
from haliax import Axis, NamedArray
from levanter.eval_harness import LmEvalHarnessConfig, TaskConfig
from levanter.layers.attention import AttentionMask

from ..data import tasks as held_out
from ..numerics import check_positive_int, fingerprint
from . import seeds

PAPER_TASKS = ("arc_easy", "arc_challenge", "hellaswag", "lambada_openai", "logiqa", "mmlu", "piqa", "sciq",
               "winogrande", "wsc273")
"""The paper's tasks (lm-evaluation-harness names); they need the Hugging Face hub."""
HELD_OUT_TASKS = held_out.TASKS
"""The tasks built from the corpus's held-out documents (offline)."""
HEADLINE = {held_out.LASTWORD: "acc", held_out.NEXTLINE: "acc_norm", "hellaswag": "acc_norm", "arc_easy": "acc_norm",
            "arc_challenge": "acc_norm", "piqa": "acc_norm", "sciq": "acc_norm", "lambada_openai": "acc"}
"""The metric each task is judged by (the one the paper's tables and lm-eval's leaderboards report); ``acc`` for
the rest. ``acc_norm`` is the accuracy when each choice's log-likelihood is divided by its length in bytes."""
CHANCE = {held_out.NEXTLINE: 1 / held_out.NUM_CHOICES, "hellaswag": 0.25, "arc_easy": 0.25, "arc_challenge": 0.25,
          "piqa": 0.5, "sciq": 0.25, "winogrande": 0.5, "wsc273": 0.5, "logiqa": 0.25, "mmlu": 0.25}
"""Accuracy of guessing, for the multiple-choice tasks."""
LABELS = {"gpt": "GPT-2", "shared": "weight-shared", "ours": "DiffEqFormer", "llama": "Llama",
          "ours_llama": "DiffEqFormer (Llama)"}
"""How the book names F6's models (the keys of its ``runs`` parameter)."""
PAIRS = (("ours", "gpt"), ("ours_llama", "llama"), ("shared", "gpt"))
"""The comparisons judged, where both models are evaluated: each model against its baseline."""
BATCH_SIZE = 64
"""Packed sequences per harness batch."""


# ------------------------------------------------------------------------------------------------------ the model


def positions_in_segments(segment_ids: NamedArray, Pos: Axis) -> NamedArray:
    """Each token's position counted from the first token of its segment (a packed request): for segment ids
    ``[3, 3, 3, 4, 4, -1]`` along ``Pos``, ``[0, 1, 2, 0, 1, 0]``. Other axes (the batch) are kept."""
    ids = segment_ids.rearrange((..., Pos))
    seg = ids.array
    index = jnp.broadcast_to(jnp.arange(Pos.size, dtype=jnp.int32), seg.shape)
    starts = jnp.concatenate([jnp.ones_like(seg[..., :1], dtype=bool), seg[..., 1:] != seg[..., :-1]], axis=-1)
    first = jax.lax.cummax(jnp.where(starts, index, 0), axis=seg.ndim - 1)
    return hax.named(index - first, ids.axes)


class SegmentPositions(eqx.Module):
    """A language model as Levanter's harness calls it, with each packed request's positions counted from its own
    first token (``positions_in_segments``), so that a request is scored as it would be alone. The harness reads
    ``activations``, ``get_lm_head``, ``Embed``, ``Vocab`` and ``Pos``; the rest is the model's."""

    model: eqx.Module

    @property
    def config(self):
        return self.model.config

    @property
    def Vocab(self) -> Axis:
        return self.model.Vocab

    @property
    def Embed(self) -> Axis:
        return self.model.Embed

    @property
    def Pos(self) -> Axis:
        return self.model.Pos

    def get_lm_head(self) -> NamedArray:
        return self.model.get_lm_head()

    def activations(self, input_ids: NamedArray, attn_mask: AttentionMask | NamedArray | None = None, *, key=None,
                    pos_ids: NamedArray | None = None) -> NamedArray:
        """The model's final hidden states [..., Pos, Embed], positions restarting at each segment of ``attn_mask``
        (unless ``pos_ids`` are given)."""
        if pos_ids is None and isinstance(attn_mask, AttentionMask) and attn_mask.segment_ids is not None:
            pos_ids = positions_in_segments(attn_mask.segment_ids[0], input_ids.resolve_axis("position"))
        return self.model.activations(input_ids, attn_mask, key=key, pos_ids=pos_ids)


# -------------------------------------------------------------------------------------------------------- tasks


def require_hub(tasks: Sequence[str]) -> None:
    """Raise ``RuntimeError`` at once, naming the tasks that need the network, unless the Hugging Face hub (where
    they live) answers."""
    from ..data.corpora import HUB_TIMEOUT_S, hub_reachable

    online = [t for t in tasks if t not in HELD_OUT_TASKS]
    if online and not hub_reachable():
        raise RuntimeError(
            f"the tasks {', '.join(online)} need the Hugging Face hub, which this machine cannot reach (HF_HUB_OFFLINE "
            f"set, or no answer within {HUB_TIMEOUT_S:.0f} s). Offline, evaluate on the held-out tasks alone "
            f"({', '.join(HELD_OUT_TASKS)}): paper_tasks=False.")


def tasks_for(paper_tasks: bool) -> list[str]:
    """The tasks F11 evaluates: the held-out ones, and with ``paper_tasks`` the paper's (``PAPER_TASKS``), which
    stop here at once, naming them, where the hub cannot be reached (``require_hub``)."""
    tasks = list(HELD_OUT_TASKS) + (list(PAPER_TASKS) if paper_tasks else [])
    require_hub(tasks)
    return tasks


def check_tasks(tasks: Sequence[str]) -> list[str]:
    """``tasks`` as a list, or ``ValueError`` naming an unknown task and listing the available ones."""
    tasks = list(tasks)
    unknown = [t for t in tasks if t not in HELD_OUT_TASKS + PAPER_TASKS]
    if unknown or not tasks:
        raise ValueError(f"unknown task{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown)) or '(none)'}; "
                         f"the held-out tasks are {', '.join(HELD_OUT_TASKS)} (offline), the paper's are "
                         f"{', '.join(PAPER_TASKS)} (they need the Hugging Face hub)")
    return tasks


def task_name(task: str, shots: int) -> str:
    """How a task at ``shots`` shots is named in the harness's results (``shakespeare_lastword_1shot``)."""
    return f"{task}_{shots}shot"


@dataclass(frozen=True)
class HarnessConfig(LmEvalHarnessConfig):
    """Levanter's harness config with the held-out task files in lm-eval's task index (``include_path``).

    Two changes to Levanter's ``to_task_dict``: it indexed all of lm-eval's task files (seconds a call: measurements
    page), this indexes the held-out tasks' folder alone unless a task outside it is asked for; and it passed each
    task to lm-eval as a dict of overrides (the shots), which lm-eval 0.4.13 reads as a whole task definition (without
    the registered task's data), so this loads each task by name and sets its shots on the loaded task. Each (task,
    shots) gets its own name with Levanter's renaming, which lets one harness call run a task at several shots."""

    include_path: str | None = None
    """The folder of the held-out tasks' YAML files (``tasks.TaskFiles.directory``)."""

    def to_task_dict(self) -> dict:
        import lm_eval.tasks

        specs = [s if isinstance(s, TaskConfig) else TaskConfig(task=s) for s in self.task_spec]
        manager = lm_eval.tasks.TaskManager(include_path=self.include_path,
                                            include_defaults=bool({s.task for s in specs} - set(HELD_OUT_TASKS)))
        out: dict = {}
        for spec in specs:
            loaded = manager.load_task_or_group([spec.task])
            if spec.num_fewshot is not None:
                _set_shots(loaded, spec.num_fewshot)
            renamed = self._rename_tasks_for_eval_harness(loaded, spec.task, spec.task_alias or spec.task)
            for key, task in renamed.items():
                if key in out:
                    raise ValueError(f"task {key} asked for twice")
                out[key] = task
        return out


def _set_shots(loaded, shots: int) -> None:
    """Set ``num_fewshot`` on every task of lm-eval's nested task dict (a group's subtasks too)."""
    for value in loaded.values():
        if isinstance(value, dict):
            _set_shots(value, shots)
        else:
            value.set_config(key="num_fewshot", value=shots)


# --------------------------------------------------------------------------------------------------- evaluation


def load(run):
    """A finished run's model (in inference mode: no dropout) and its tokenizer, or ``FileNotFoundError`` naming a
    run that is missing or has not finished."""
    from levanter.utils.tree_utils import inference_mode

    from ..data.corpora import load_tokenizer
    from ..runs import config as run_config
    from ..runs import require_complete
    from ..runs import load_model

    path = require_complete(run)
    config = run_config(path)
    return inference_mode(load_model(path), True), load_tokenizer(config.data.levanter_config().tokenizer)


@contextlib.contextmanager
def one_process_broadcast():
    """Levanter's harness hands each message and batch from process 0 to the others with ``broadcast_shard``, which
    makes an array of one row per device of ``jax.devices()`` and lays it over the mesh: with several devices and a
    one-device mesh the two disagree ("Expected shard shape (4,) doesn't match ..."), and a mesh of every device puts
    the harness's packed examples on devices its loader does not use. In one process there is nobody to hand
    anything to: the broadcast is the identity while this context lasts. Several processes keep Levanter's own."""
    import levanter.eval_harness as harness

    if jax.process_count() > 1:
        yield
        return
    original = harness.broadcast_shard
    harness.broadcast_shard = lambda x, out_axis_specs, source=0: x
    try:
        yield
    finally:
        harness.broadcast_shard = original


def evaluate(model, tokenizer, tasks: Sequence[str], shots: Sequence[int], *, include_path: str | Path | None = None,
             max_examples: int | None = None, batch_size: int = BATCH_SIZE) -> pd.DataFrame:
    """Every metric lm-eval reports for ``model`` on ``tasks`` at each number of ``shots``, from one call of
    Levanter's ``run_lm_eval_harness``: a DataFrame with columns ``task``, ``shots``, ``metric``, ``value`` and
    ``n`` (examples scored). ``include_path`` is the held-out tasks' folder."""
    from levanter.eval_harness import run_lm_eval_harness

    tasks = check_tasks(tasks)
    spec = [TaskConfig(task=t, num_fewshot=k, task_alias=task_name(t, k)) for t in tasks for k in shots]
    config = HarnessConfig(task_spec=spec, max_examples=max_examples, max_length=model.Pos.size,
                           include_path=None if include_path is None else str(include_path))
    # one device of this process evaluates (an evaluation is small); the harness needs a mesh for it
    mesh = jax.sharding.Mesh(np.asarray(jax.devices()[:1]), ("data",))
    with hax.partitioning.set_mesh(mesh), one_process_broadcast():
        outputs = run_lm_eval_harness(config, SegmentPositions(model), tokenizer, batch_size, {}, None)
    rows = []
    for t in tasks:
        for k in shots:
            name = task_name(t, k)
            metrics = outputs["results"].get(name)
            if metrics is None:
                raise RuntimeError(f"the harness returned no results for {name}; it returned "
                                   f"{', '.join(outputs['results'])}")
            n = outputs["n-samples"][name]["effective"]
            for key, value in metrics.items():
                metric = key.partition(",")[0]
                if isinstance(value, (int, float)) and metric not in ("alias", "sample_len") and "_stderr" not in metric:
                    rows.append({"task": t, "shots": k, "metric": metric, "value": float(value), "n": int(n)})
    return pd.DataFrame(rows)


def _lm_eval_version() -> str:
    return importlib.metadata.version("lm-eval")


def cached_evaluate(run, tasks: Sequence[str], shots: Sequence[int], *, task_files: held_out.TaskFiles | None,
                    cache_dir: str | Path | None, max_examples: int | None = None,
                    batch_size: int = BATCH_SIZE) -> pd.DataFrame:
    """``evaluate`` of a finished run, read from ``cache_dir/downstream-<hash>.csv`` when computed before: the hash
    covers the model's weights (``numerics.fingerprint``), the task files' SHA-256, the tasks, shots, example limit
    and lm-eval's version. ``cache_dir`` None: computed, not cached."""
    from ..numerics import cached

    model, tokenizer = load(run)
    tasks = check_tasks(tasks)
    key = {"model": fingerprint(model), "tasks": tasks, "shots": list(shots), "max_examples": max_examples,
           "task_files": None if task_files is None else task_files.hashes, "lm_eval": _lm_eval_version()}
    include = None if task_files is None else task_files.directory
    return cached(cache_dir, "downstream", key, lambda: evaluate(model, tokenizer, tasks, shots, include_path=include,
                                                                 max_examples=max_examples, batch_size=batch_size),
                  save=lambda frame, p: frame.to_csv(p, index=False), load=pd.read_csv, suffix=".csv")


def evaluate_runs(runs: dict, tasks: Sequence[str], shots: Sequence[int], *,
                  task_files: held_out.TaskFiles | None, cache_dir: str | Path | None,
                  max_examples: int | None = None, batch_size: int = BATCH_SIZE, progress: bool = True) -> pd.DataFrame:
    """``cached_evaluate`` of every run of ``runs`` (model key -> a run or a list of its seed runs): ``evaluate``'s
    columns plus ``model`` (the key) and ``seed`` (the index in the list). Every run is checked to have finished
    before any is evaluated."""
    from ..runs import require_complete

    from ..train import use_compilation_cache

    check_tasks(tasks)
    if any(t in HELD_OUT_TASKS for t in tasks) and task_files is None:
        raise ValueError("the held-out tasks need their task files (tasks.build_tasks)")
    require_hub(tasks)
    for key, value in runs.items():
        for i, run in enumerate(seeds.as_list(value)):
            require_complete(run, f"runs[{key!r}][{i}] =")
    use_compilation_cache()  # the seeds of a model share its programs: the harness compiles them once per call
    frames = []
    for key, value in runs.items():
        for i, run in enumerate(seeds.as_list(value)):
            start = time.perf_counter()
            frame = cached_evaluate(run, tasks, shots, task_files=task_files, cache_dir=cache_dir,
                                    max_examples=max_examples, batch_size=batch_size)
            if progress:
                print(f"{key} seed {i} ({run}): {time.perf_counter() - start:.1f} s", flush=True)
            frames.append(frame.assign(model=key, seed=i))
    return pd.concat(frames, ignore_index=True)


# ------------------------------------------------------------------------------------------------------ results


def headline(results: pd.DataFrame) -> pd.DataFrame:
    """The rows of ``results`` with each task's judged metric (``HEADLINE``), plus the last-word task's target-word
    perplexity."""
    judged = results.metric == results.task.map(lambda t: HEADLINE.get(t, "acc"))
    perplexity = (results.task == held_out.LASTWORD) & (results.metric == "perplexity")
    return results[judged | perplexity]


def summary(results: pd.DataFrame) -> pd.DataFrame:
    """Mean, standard deviation and number of seeds of every headline metric (``headline``) per task, shots and
    model: columns ``task``, ``shots``, ``metric``, ``model``, ``mean``, ``sd``, ``seeds``, ``examples``."""
    rows = []
    for (task, shots, metric, model), group in headline(results).groupby(["task", "shots", "metric", "model"],
                                                                         sort=False):
        spread = seeds.spread(group.sort_values("seed").value)
        rows.append({"task": task, "shots": int(shots), "metric": metric, "model": model, "mean": spread.mean,
                     "sd": spread.sd, "seeds": spread.n, "examples": int(group.n.iloc[0])})
    return pd.DataFrame(rows)


def comparisons(results: pd.DataFrame, pairs=PAIRS) -> pd.DataFrame:
    """Each model of ``pairs`` against its baseline on every headline metric, task and shots, judged by
    ``seeds.RULE`` over the seeds (paired: seed k of both models shares its data order): columns ``task``,
    ``shots``, ``metric``, ``model``, ``baseline``, ``difference`` (mean model - mean baseline), ``low``, ``high``
    (its 95% CI), ``p``, ``test``, ``verdict``, ``text``, ``comparison`` (the ``seeds.Comparison``)."""
    rows = []
    judged = headline(results)
    for (task, shots, metric), group in judged.groupby(["task", "shots", "metric"], sort=False):
        for model, baseline in pairs:
            a = group[group.model == model].sort_values("seed").value.tolist()
            b = group[group.model == baseline].sort_values("seed").value.tolist()
            if not a or not b:
                continue
            n = min(len(a), len(b))  # seed k of both models shares its data order: the seeds both have
            c = seeds.compare(a[:n], b[:n], paired=True)
            digits = 1 if metric == "perplexity" else 3
            rows.append({"task": task, "shots": int(shots), "metric": metric, "model": model, "baseline": baseline,
                         "difference": c.difference, "low": c.low, "high": c.high, "p": c.p, "test": c.test,
                         "verdict": c.verdict, "text": c.text(digits), "comparison": c})
    return pd.DataFrame(rows)


def table(results: pd.DataFrame, pairs=PAIRS) -> pd.DataFrame:
    """The F11 table: one row per task, shots and metric; per model its mean ± sd over seeds; per comparison of
    ``pairs`` the difference, p and verdict."""
    means = summary(results)
    index = ["task", "shots", "metric"]

    def cell(row) -> str:
        digits = 1 if row.metric == "perplexity" else 3
        return f"{row['mean']:.{digits}f}" + ("" if row.seeds < 2 else f" ± {row.sd:.{digits}f}")

    wide = means.assign(cell=means.apply(cell, axis=1)).pivot(index=index, columns="model", values="cell")
    wide = wide[[m for m in LABELS if m in wide.columns] + [m for m in wide.columns if m not in LABELS]]
    wide.columns = [LABELS.get(m, m) for m in wide.columns]
    examples = means.groupby(index).examples.first()
    wide.insert(0, "examples", examples.reindex(wide.index))
    for _, c in comparisons(results, pairs).groupby(["model", "baseline"], sort=False):
        label = f"{LABELS.get(c.model.iloc[0], c.model.iloc[0])} vs {LABELS.get(c.baseline.iloc[0], c.baseline.iloc[0])}"
        c = c.set_index(index)
        wide[label] = c.apply(lambda r: f"{r.difference:+.{1 if r.name[2] == 'perplexity' else 3}f}, "
                                        + (f"p = {r.p:.2g}: " if not math.isnan(r.p) else "") + r.verdict, axis=1)
    return wide.reset_index().set_index(["task", "shots", "metric"])


def plot_accuracies(results: pd.DataFrame, axes=None):
    """One panel per task's headline metric, then the last-word task's target perplexity (log scale): a bar per
    model and shots at its mean over seeds (for the perplexity a diamond), a dot per seed, the level of guessing
    dashed."""
    import matplotlib.pyplot as plt

    from ..report.figures import log_perplexity_axis

    means = summary(results)
    panels = sorted(set(zip(means.task, means.metric)), key=lambda p: (p[1] == "perplexity", p[0]))
    if axes is None:
        fig, axes = plt.subplots(1, len(panels), figsize=(3.4 * len(panels), 3.2), squeeze=False)
        axes = axes[0]
    models = [m for m in LABELS if m in set(means.model)] + sorted(set(means.model) - set(LABELS))
    colours = dict(zip(models, plt.get_cmap("tab10").colors))
    judged = headline(results)
    width = 0.8 / len(models)
    for ax, (task, metric) in zip(axes, panels):
        shots = sorted(means[means.task == task].shots.unique())
        for j, model in enumerate(models):
            for i, k in enumerate(shots):
                row = means[(means.task == task) & (means.metric == metric) & (means.model == model)
                            & (means.shots == k)]
                if row.empty:
                    continue
                x = i + (j - (len(models) - 1) / 2) * width
                label = LABELS.get(model, model) if i == 0 else None
                if metric == "perplexity":  # a bar's length on a log axis means nothing: its mean as a mark
                    ax.plot([x], [row["mean"].iloc[0]], "D", color=colours[model], markersize=7, label=label)
                else:
                    ax.bar(x, row["mean"].iloc[0], width, color=colours[model], alpha=0.8, label=label)
                values = judged[(judged.task == task) & (judged.metric == metric) & (judged.model == model)
                                & (judged.shots == k)].value
                ax.plot(np.full(len(values), x), values, "o", color="black", markersize=2.5)
        if metric == "perplexity":
            log_perplexity_axis(ax, "perplexity of the last word")
        else:
            top = float(judged[(judged.task == task) & (judged.metric == metric)].value.max())
            ax.set_ylim(0, max(0.05, 1.15 * top, 1.15 * CHANCE.get(task, 0)))
            ax.set_ylabel(metric)
            if task in CHANCE:
                ax.axhline(CHANCE[task], color="grey", linestyle="--", linewidth=1)
        ax.set_xticks(range(len(shots)), [f"{k}-shot" for k in shots])
        ax.set_title(task, fontsize=9)
    handles, labels = axes[0].get_legend_handles_labels()
    axes[0].figure.legend(handles, labels, loc="lower center", ncol=len(models), fontsize=8, frameon=False,
                          bbox_to_anchor=(0.5, -0.06))
    axes[0].figure.tight_layout()
    return axes


def describe(task_files: held_out.TaskFiles) -> str:
    """One sentence per held-out task: its examples and how they were built (for the book's page)."""
    m = task_files.manifest
    c = m["counts"]
    docs = ", ".join(m["documents"])
    return (f"From the held-out documents ({docs}), passages of at most {m['max_tokens']} tokens: "
            f"{held_out.LASTWORD} has {c[held_out.LASTWORD]['test']} test examples (and "
            f"{c[held_out.LASTWORD]['fewshot']} for few-shot prompts) drawn from "
            f"{c[held_out.LASTWORD]['candidates']} passages whose last word, of {held_out.MIN_WORD_LETTERS} letters or "
            f"more and none of the {held_out.COMMON_WORDS} commonest, occurs in an earlier line of the passage and not "
            f"before it in its own line; {held_out.NEXTLINE} has {c[held_out.NEXTLINE]['test']} test examples (and "
            f"{c[held_out.NEXTLINE]['fewshot']} for few-shot prompts) drawn from {c[held_out.NEXTLINE]['candidates']} "
            f"passages, each with the true next line and {held_out.NUM_CHOICES - 1} lines that follow other held-out "
            f"passages, of a length within {held_out.DISTRACTOR_LENGTH:.0%} of it.")


def check_shots(shots: Sequence[int], max_seq_len: int) -> list[int]:
    """``shots`` as a list of distinct non-negative integers whose largest leaves room for an example of
    ``tasks.example_budget`` tokens in ``max_seq_len``."""
    shots = list(shots)
    if not shots or any(not isinstance(k, int) or isinstance(k, bool) or k < 0 for k in shots) or len(set(shots)) < len(
            shots):
        raise ValueError(f"shots must be distinct non-negative integers, got {shots!r}")
    held_out.example_budget(max_seq_len, max(shots))
    return shots


def max_seq_len(runs: dict) -> int:
    """The shortest context of the models of ``runs`` (every seed), which the held-out examples must fit."""
    from ..runs import model_config

    return min(model_config(run).max_seq_len for value in runs.values() for run in seeds.as_list(value))


def build_tasks(runs: dict, *, num_examples: int, shots: Sequence[int], num_fewshot: int | None = None,
                seed: int = 0) -> held_out.TaskFiles:
    """The held-out task files for ``runs``: examples short enough for a ``max(shots)``-shot prompt of the models'
    shortest context (``tasks.example_budget``), tokenised with the first run's tokenizer; ``num_fewshot`` few-shot
    examples per task (default: ``max(10, 5 * max(shots))``)."""
    from ..runs import config as run_config

    check_positive_int(num_examples, "num_examples")
    length = max_seq_len(runs)
    shots = check_shots(shots, length)
    first = seeds.all_runs(runs)[0]
    data = run_config(first).data
    tokenizer = None if data.dataset == "shakespeare" else data.levanter_config().tokenizer
    return held_out.build_tasks(num_examples=num_examples, max_tokens=held_out.example_budget(length, max(shots)),
                                num_fewshot=max(10, 5 * max(shots)) if num_fewshot is None else num_fewshot,
                                seed=seed, vocab_size=data.vocab_size, tokenizer=tokenizer)


def sentences(results: pd.DataFrame, pairs=PAIRS) -> dict[str, str]:
    """Glue texts for the book: per held-out task and shots, ``<task>_<k>`` the comparison of DiffEqFormer with
    GPT-2 (``seeds.Comparison.text``) with both means; ``seeds`` (how many per model); ``verdicts``, a sentence
    counting the significant ones among the exploratory comparisons of ``pairs`` (all but the primary test,
    ``verdicts``), beside the count expected by chance."""
    means = summary(results).set_index(["task", "shots", "metric", "model"])
    found = comparisons(results, pairs)
    out = {"seeds": ", ".join(f"{LABELS.get(m, m)} {n}" for m, n in
                              summary(results).groupby("model", sort=False).seeds.max().items())}
    for row in found[(found.model == "ours") & (found.baseline == "gpt")].itertuples():
        if row.task not in HELD_OUT_TASKS:
            continue
        digits = 1 if row.metric == "perplexity" else 3
        ours, gpt = (means.loc[(row.task, row.shots, row.metric, m)] for m in ("ours", "gpt"))
        out[f"{row.task.removeprefix('shakespeare_')}_{row.metric}_{row.shots}"] = (
            f"{ours['mean']:.{digits}f} against {gpt['mean']:.{digits}f} ({row.text})")
    primary = PRIMARY_TASKS[0] if (found.task == PRIMARY_TASKS[0]).any() else PRIMARY_TASKS[1]
    secondary = found[~((found.task == primary) & (found.shots == 0) & (found.metric == "acc")
                        & (found.model == "ours") & (found.baseline == "gpt"))]
    judged = secondary[~secondary.verdict.str.startswith(seeds.UNTESTED)]
    hits = judged[judged.verdict == seeds.SIGNIFICANT]
    listed = "; ".join(
        f"{LABELS.get(r.model, r.model)} {'below' if r.difference < 0 else 'above'} {LABELS.get(r.baseline, r.baseline)} "
        f"on {r.task} {r.metric} {r.shots}-shot (p = {r.p:.2g})" for r in hits.itertuples())
    untested = len(secondary) - len(judged)
    out["verdicts"] = (f"Besides the primary test, {len(judged)} comparisons have seeds to judge them by; they are "
                       f"exploratory: with no true difference anywhere, {seeds.chance_count(len(judged)):.1f} of them "
                       f"would come out significant at 5% by chance, and {len(hits)} "
                       f"{'does' if len(hits) == 1 else 'do'}" + (f" ({listed})" if listed else "") + "."
                       + (f" {untested} more {'is' if untested == 1 else 'are'} untested (one seed)." if untested
                          else ""))
    return out


PRIMARY_TASKS = ("lambada_openai", held_out.LASTWORD)
"""The task of F11's primary test (``claims.CLAIMS["f11_lastword"]``): LAMBADA where the preset evaluates the
paper's tasks, else the LAMBADA-style last-word task built from the corpus."""


def verdicts(results: pd.DataFrame) -> dict:
    """The verdict on F11's claim (``claims.CLAIMS["f11_lastword"]``) from its primary test: DiffEqFormer's
    zero-shot accuracy on ``PRIMARY_TASKS``' task less GPT-2's, by the paired t-test over the seeds."""
    from . import claims

    found = comparisons(headline(results).query("metric == 'acc' and shots == 0"), (("ours", "gpt"),))
    for task in PRIMARY_TASKS:
        row = found[found.task == task] if len(found) else found
        if len(row):
            return {"f11_lastword": claims.judge("f11_lastword", row.comparison.iloc[0], if_untested=(
                "the perplexity of the last word, which moves at every scale, is exploratory (below): the paper's "
                "claim is about answering it right"))}
    return {"f11_lastword": claims.untested("f11_lastword", "the preset evaluated no zero-shot last-word task of "
                                                            "DiffEqFormer and GPT-2")}
