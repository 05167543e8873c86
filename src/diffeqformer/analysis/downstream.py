"""F11: downstream zero- and few-shot evaluation with EleutherAI's lm-evaluation-harness, run through Levanter.

The paper (Tables 4-5, Figs. 9-12) evaluates on ARC, HellaSwag, LAMBADA, ... (``PAPER_TASKS``, on the Hugging Face
hub); offline, F11 evaluates on tasks built in their manner from the corpus's held-out documents
(``diffeqformer.data.tasks``). Levanter's ``run_lm_eval_harness`` packs many requests into each sequence:
``SegmentPositions`` counts each request's positions from its own first token (Levanter passes no position ids).
``evaluate`` runs one model, ``evaluate_runs`` every seed of every model (cached); ``summary``, ``comparisons`` and
``verdicts`` turn the accuracies into means over seeds and verdicts.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence
from unittest import mock

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
from ..cache import fingerprint
from ..numerics import check_positive_int
from . import statistics

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
    first token (``positions_in_segments``), so that a request is scored as it would be alone."""

    model: eqx.Module

    def __getattr__(self, name: str):
        if name == "model":  # not set yet (during construction): no model to delegate to
            raise AttributeError(name)
        return getattr(self.model, name)

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
    """The tasks F11 evaluates: the held-out ones, and with ``paper_tasks`` the paper's (``require_hub``)."""
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
    """Levanter's harness config, with two changes to its ``to_task_dict``: it indexes the held-out tasks' folder alone
    unless another task is asked for (indexing all of lm-eval's costs seconds a call), and it loads each task by name
    and sets its shots on it (lm-eval 0.4.13 reads Levanter's dict of overrides as a whole task definition)."""

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
    """A finished run's model (in inference mode: no dropout) and its tokenizer."""
    from levanter.utils.tree_utils import inference_mode

    from ..data.corpora import load_tokenizer
    from ..runs import config as run_config
    from ..runs import load_model, require_complete

    path = require_complete(run)
    config = run_config(path)
    return inference_mode(load_model(path), True), load_tokenizer(config.data.levanter_config().tokenizer)


def one_process_broadcast():
    """Levanter's ``broadcast_shard`` as the identity while this context lasts, in one process: its per-device batch
    disagrees with the harness's one-device mesh ("Expected shard shape (4,) doesn't match ..."), and none is needed."""
    import levanter.eval_harness as harness

    if jax.process_count() > 1:
        return contextlib.nullcontext()
    return mock.patch.object(harness, "broadcast_shard", lambda x, out_axis_specs, source=0: x)


def evaluate(model, tokenizer, tasks: Sequence[str], shots: Sequence[int], *, include_path: str | Path | None = None,
             max_examples: int | None = None, batch_size: int = BATCH_SIZE) -> pd.DataFrame:
    """Every metric lm-eval reports for ``model`` on ``tasks`` at each number of ``shots``, from one call of Levanter's
    ``run_lm_eval_harness``: columns ``task``, ``shots``, ``metric``, ``value``, ``n`` (examples scored)."""
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


def cached_evaluate(run, tasks: Sequence[str], shots: Sequence[int], *, task_files: held_out.TaskFiles | None,
                    cache_dir: str | Path | None, max_examples: int | None = None,
                    batch_size: int = BATCH_SIZE) -> pd.DataFrame:
    """``evaluate`` of a finished run, cached in ``cache_dir`` (None: not cached) by the model's weights, the task
    files' SHA-256, the tasks, shots, example limit and lm-eval's version."""
    from ..cache import cached

    model, tokenizer = load(run)
    tasks = check_tasks(tasks)
    key = {"model": fingerprint(model), "tasks": tasks, "shots": list(shots), "max_examples": max_examples,
           "task_files": None if task_files is None else task_files.hashes, "lm_eval": importlib.metadata.version("lm-eval")}
    include = None if task_files is None else task_files.directory
    return cached(cache_dir, "downstream", key, lambda: evaluate(model, tokenizer, tasks, shots, include_path=include,
                                                                 max_examples=max_examples, batch_size=batch_size),
                  save=lambda frame, p: frame.to_csv(p, index=False), load=pd.read_csv, suffix=".csv")


def evaluate_runs(runs: dict, tasks: Sequence[str], shots: Sequence[int], *,
                  task_files: held_out.TaskFiles | None, cache_dir: str | Path | None,
                  max_examples: int | None = None, batch_size: int = BATCH_SIZE, progress: bool = True) -> pd.DataFrame:
    """``cached_evaluate`` of every run of ``runs`` (model key -> a run or its seed runs), with ``model`` and ``seed``
    columns; every run is checked to have finished before any is evaluated."""
    from ..runs import require_complete
    from ..train import use_compilation_cache

    check_tasks(tasks)
    if any(t in HELD_OUT_TASKS for t in tasks) and task_files is None:
        raise ValueError("the held-out tasks need their task files (tasks.build_tasks)")
    require_hub(tasks)
    for key, value in runs.items():
        for i, run in enumerate(statistics.as_list(value)):
            require_complete(run, f"runs[{key!r}][{i}] =")
    use_compilation_cache()  # the seeds of a model share its programs: the harness compiles them once per call
    frames = []
    for key, value in runs.items():
        for i, run in enumerate(statistics.as_list(value)):
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
        spread = statistics.spread(group.sort_values("seed").value)
        rows.append({"task": task, "shots": int(shots), "metric": metric, "model": model, "mean": spread.mean,
                     "sd": spread.sd, "seeds": spread.n, "examples": int(group.n.iloc[0])})
    return pd.DataFrame(rows)


def comparisons(results: pd.DataFrame, pairs=PAIRS) -> pd.DataFrame:
    """Each model of ``pairs`` against its baseline on every headline metric, task and shots, by the book's rule over
    the (paired) seeds: ``difference`` (mean model - mean baseline), ``low``, ``high``, ``p``, ``test``, ``verdict``."""
    rows = []
    judged = headline(results)
    for (task, shots, metric), group in judged.groupby(["task", "shots", "metric"], sort=False):
        for model, baseline in pairs:
            a = group[group.model == model].sort_values("seed").value.tolist()
            b = group[group.model == baseline].sort_values("seed").value.tolist()
            if not a or not b:
                continue
            c = statistics.compare_seeds(a, b)
            rows.append({"task": task, "shots": int(shots), "metric": metric, "model": model, "baseline": baseline,
                         "difference": c.difference, "low": c.low, "high": c.high, "p": c.p, "test": c.test,
                         "verdict": c.verdict, "comparison": c})
    return pd.DataFrame(rows)


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

    return min(model_config(run).max_seq_len for value in runs.values() for run in statistics.as_list(value))


def build_tasks(runs: dict, *, num_examples: int, shots: Sequence[int], num_fewshot: int | None = None,
                seed: int = 0) -> held_out.TaskFiles:
    """The held-out task files for ``runs``: examples that fit a ``max(shots)``-shot prompt of the shortest context,
    tokenised with the first run's tokenizer; ``num_fewshot`` few-shot ones (default ``max(10, 5 * max(shots))``)."""
    from ..runs import config as run_config

    check_positive_int(num_examples, "num_examples")
    length = max_seq_len(runs)
    shots = check_shots(shots, length)
    first = statistics.all_runs(runs)[0]
    data = run_config(first).data
    tokenizer = None if data.dataset == "shakespeare" else data.levanter_config().tokenizer
    return held_out.build_tasks(num_examples=num_examples, max_tokens=held_out.example_budget(length, max(shots)),
                                num_fewshot=max(10, 5 * max(shots)) if num_fewshot is None else num_fewshot,
                                seed=seed, vocab_size=data.vocab_size, tokenizer=tokenizer)


PRIMARY_TASKS = ("lambada_openai", held_out.LASTWORD)
"""The task of F11's primary test (``claims.CLAIMS["f11_lastword"]``): LAMBADA where the preset evaluates the
paper's tasks, else the LAMBADA-style last-word task built from the corpus."""


def exploratory(found: pd.DataFrame) -> pd.DataFrame:
    """The rows of ``comparisons`` but the primary test's (``verdicts``): those the page calls exploratory."""
    primary = PRIMARY_TASKS[0] if (found.task == PRIMARY_TASKS[0]).any() else PRIMARY_TASKS[1]
    return found[~((found.task == primary) & (found.shots == 0) & (found.metric == "acc")
                   & (found.model == "ours") & (found.baseline == "gpt"))]


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
