"""F7-F10 as tables, curves and verdicts, read from finished runs (``runs.run_path``): adaptive fine-tuning (Fig. 5)
and the ablations (beta2, Fig. 7; d_t, Figs. 14-16 and Table 6, with ``analysis.memory``'s measured training step;
the hypernetwork design, Fig. 18)."""

from __future__ import annotations

import math
import statistics
from typing import Mapping, Sequence

from ..config import config_field
from ..runs import config as run_config
from ..runs import (
    is_finetuning,
    median_throughput,
    model_type,
    parameter_count,
    pretrain_config,
    read_metrics,
    require_complete,
    run_path,
    summary,
)
from . import claims
from .memory import PARAMETER_BYTES, MemoryGrowth, memory_growth
from .statistics import Comparison, Trend, as_list, compare_seeds, one_sample, percent, spread, trend

# --------------------------------------------------------------------------------------------------- one run


def describe(run) -> dict:
    """What the tables and captions need of one finished run (a fine-tuning's model is its pretraining's)."""
    path = require_complete(run)
    done = summary(path)
    config = run_config(path)
    finetune = is_finetuning(path)
    pretraining = pretrain_config(path) if finetune else None
    model = (pretraining or config).model
    metrics = read_metrics(path)
    curve = _eval_curve(metrics, run)
    out = {
        "run": str(run), "kind": "fine-tuning" if finetune else "pretraining", "model": model_type(model),
        "layers": model.num_layers, "hidden_dim": model.hidden_dim, "domain": config.data.domain,
        "method": config.method if finetune else "from scratch", "steps": done.get("euler_steps") if finetune else None,
        "source": pretraining.data.domain if finetune else None, "pretrain_seed": (pretraining or config).trainer.seed,
        "final_ppl": done.get("final_eval_perplexity"), "best_ppl": float(curve.perplexity.min()),
        "final_loss": float(curve.eval_loss.iloc[-1]), "best_loss": float(curve.eval_loss.min()),
        "initial_ppl": float(curve.perplexity.iloc[0]) if finetune else None,
        "trainable_params": done.get("trainable_params"), "total_params": done.get("total_params"),
        # a population's member (diffeqformer.population) records its share of the population's throughput
        "tokens_per_second": done["tokens_per_second"] if "tokens_per_second" in done else median_throughput(metrics),
        "config": config, "config_hash": done.get("config_hash"),
        "pretrain_config_hash": done.get("pretrain_config_hash"),
    }
    if out["trainable_params"] is None:
        out["trainable_params"] = out["total_params"] = parameter_count(path)
    return out


def eval_curve(run):
    """Validation loss and perplexity per training step (a fine-tuning's step -1, the model before it, as 0)."""
    return _eval_curve(read_metrics(run_path(run)), run)


def mean_curve(runs):
    """``eval_curve`` of a setting's seeds: the mean validation loss at each step all of them evaluated, and its
    perplexity."""
    curves = [eval_curve(r).set_index("step").eval_loss for r in as_list(runs)]
    loss = curves[0].to_frame().join([c.rename(i) for i, c in enumerate(curves[1:], 1)], how="inner").mean(axis=1)
    return loss.rename("eval_loss").reset_index().assign(perplexity=lambda f: f.eval_loss.map(math.exp))


def _eval_curve(metrics, run):
    import pandas as pd

    if "eval/loss" not in metrics:
        raise ValueError(f"{run}: the metrics hold no validation loss (eval/loss)")
    loss = metrics["eval/loss"].dropna()
    steps = [max(int(s), 0) for s in loss.index]
    frame = pd.DataFrame({"step": steps, "eval_loss": loss.values, "perplexity": [math.exp(v) for v in loss]})
    return frame.drop_duplicates("step", keep="last").reset_index(drop=True)


def seed_band(runs):
    """Validation perplexity of a setting's seeds per training step (the index): their ``mean``, ``min``, ``max``."""
    import pandas as pd

    return pd.concat([eval_curve(r) for r in as_list(runs)]).groupby("step").perplexity.agg(["mean", "min", "max"])


# ---------------------------------------------------------------------------------------------- F7: Fig. 5


def _label(d: dict) -> str:
    if d["kind"] == "pretraining":
        return f"{_model_name(d)} from scratch"
    return f"DiffEqFormer N={d['steps']}" if d["steps"] else _model_name(d)


def _model_name(d: dict) -> str:
    kind = {"diffeqformer": "DiffEqFormer", "gpt2": "GPT-2", "llama": "Llama"}.get(d["model"], d["model"])
    unit = "steps" if d["model"] == "diffeqformer" else "layers"
    return f"{kind} ({d['layers']} {unit})"


def finetune_table(runs: Mapping[str, str] | Sequence[str]):
    """One row per setting of Fig. 5 (a fine-tuning over its seeds, or a model trained from scratch on a target domain):
    parameters, perplexity before, final and best (seed means), ``sd``, seeds, and per seed in the order of the
    ``pretrain seeds`` (which match seed k of two settings): ``finals``, ``losses`` (their logs), ``rises``, ``run``."""
    import pandas as pd

    described = [describe(r) for r in (runs.values() if isinstance(runs, Mapping) else runs)]
    tunes = [d for d in described if d["kind"] == "fine-tuning"]
    if not tunes:
        raise ValueError("runs holds no fine-tuning run (a run directory with pretrain_config.yaml)")
    pretrained = {d["pretrain_config_hash"] for d in tunes}
    targets = {d["domain"] for d in tunes}
    records = []
    for d in described:
        if d["kind"] == "pretraining":
            if d["config_hash"] in pretrained or d["domain"] not in targets:
                continue  # a pretraining a fine-tuning starts from, or unrelated: not a from-scratch baseline
            for method in sorted({t["method"] for t in tunes if t["domain"] == d["domain"]}):
                source = next(t["source"] for t in tunes if t["domain"] == d["domain"])
                records.append(_finetune_record(d, method, source))
        else:
            records.append(_finetune_record(d, d["method"], d["source"]))
    settings = []
    for _, rows in pd.DataFrame.from_records(records).groupby(["direction", "method", "model"], sort=False):
        rows = rows.sort_values("pretrain seed", kind="stable")
        final = spread(rows["final ppl"])
        first = rows.iloc[0]
        settings.append({
            "direction": first.direction, "method": first.method, "model": first.model,
            "model_order": first.model_order, "trainable params": first["trainable params"],
            "ppl before": rows["ppl before"].mean() if first["ppl before"] is not None else None,
            "final ppl": final.mean, "sd": final.sd, "best ppl": rows["best ppl"].mean(),
            "final - best": rows["final - best"].mean(), "seeds": final.n, "finals": final.values,
            "losses": tuple(rows["final loss"]), "rises": tuple(rows["final loss"] - rows["best loss"]),
            "pretrain seeds": tuple(int(k) for k in rows["pretrain seed"]), "run": first.run, "runs": tuple(rows.run),
        })
    table = pd.DataFrame.from_records(settings).assign(_m=lambda t: t.method.map({"lora": 0, "full": 1}))
    return table.sort_values(["direction", "_m", "model_order"]).drop(columns=["_m", "model_order"]).reset_index(
        drop=True)


def _finetune_record(d: dict, method: str, source: str) -> dict:
    scratch = d["kind"] == "pretraining"
    return {
        "direction": f"{source} -> {d['domain']}", "method": method, "model": _label(d),
        "model_order": (2, 0) if scratch else ((0, d["steps"]) if d["steps"] else (1, 0)),
        "trainable params": d["trainable_params"], "ppl before": None if scratch else d["initial_ppl"],
        "final ppl": d["final_ppl"], "best ppl": d["best_ppl"], "final - best": d["final_ppl"] - d["best_ppl"],
        "final loss": d["final_loss"], "best loss": d["best_loss"], "pretrain seed": d["pretrain_seed"],
        "run": d["run"],
    }


def method_name(method: str) -> str:
    """A fine-tuning method as the tables and panels name it."""
    return "LoRA" if method == "lora" else f"{method} fine-tuning"


def baseline_row(rows):
    """The GPT-2 baseline among the rows of a ``finetune_table`` of one direction and method (None: none)."""
    gpt = rows[~rows.model.str.startswith("DiffEqFormer") & ~rows.model.str.contains("from scratch")]
    return gpt.iloc[0] if len(gpt) else None


def gpt_differences(rows) -> dict:
    """For each DiffEqFormer N among a ``finetune_table``'s rows of one direction and method: model -> (steps,
    [step, pair]), its log-perplexity less the same-seed GPT-2 baseline's in fine-tuning, in percent (empty without)."""
    import numpy as np

    gpt = baseline_row(rows)
    if gpt is None:
        return {}
    base = dict(zip(gpt["pretrain seeds"], gpt.runs))
    out = {}
    for _, row in rows[rows.model.str.startswith("DiffEqFormer N=")].iterrows():
        pairs = [eval_curve(run).set_index("step").eval_loss - eval_curve(base[k]).set_index("step").eval_loss
                 for k, run in zip(row["pretrain seeds"], row.runs) if k in base]
        if pairs:
            out[row.model] = (pairs[0].dropna().index,
                              100 * np.expm1(np.column_stack([p.dropna().values for p in pairs])))
    return out


PRETRAINING = "pretraining seed"
"""The unit of F7's tests."""

OVERFIT_TARGETS = ("plays", "wikitext103")
"""Where F7 tests "fewer steps overfit less": the paper's WikiText-103, for which the plays stand offline."""


def finetune_differences(table, method: str) -> dict[tuple[str, int], dict[int, float]]:
    """Per direction and N, under ``method``: pretraining seed -> DiffEqFormer's final validation log-perplexity
    less the GPT-2 baseline's (same direction, same pretraining seed)."""
    out = {}
    for direction, rows in table[table.method == method].groupby("direction", sort=False):
        gpt = baseline_row(rows)
        if gpt is None:
            continue
        base = dict(zip(gpt["pretrain seeds"], gpt.losses))
        for _, row in rows[rows.model.str.startswith("DiffEqFormer N=")].iterrows():
            n = int(row.model.split("=")[1])
            out[direction, n] = {k: v - base[k] for k, v in zip(row["pretrain seeds"], row.losses) if k in base}
    return out


def finetune_per_seed(table, method: str) -> list[float]:
    """F7's primary number under ``method`` per pretraining seed (that every setting has): the mean over
    directions and N of ``finetune_differences``."""
    differences = finetune_differences(table, method)
    if not differences:
        return []
    common = set.intersection(*(set(d) for d in differences.values()))
    return [statistics.fmean(d[k] for d in differences.values()) for k in sorted(common)]


def finetune_verdicts(table) -> dict[str, claims.Verdict]:
    """F7's verdicts over the pretraining seeds: ``f7_lora``, ``f7_full`` (``finetune_per_seed``, one-sample t-test;
    full: equivalence) and ``f7_overfit`` (slope against N of the full fine-tunings' rise on ``OVERFIT_TARGETS``)."""
    out = {}
    for name, method in (("f7_lora", "lora"), ("f7_full", "full")):
        per_seed = finetune_per_seed(table, method)
        out[name] = (claims.judge(name, one_sample(per_seed), unit=PRETRAINING) if per_seed
                     else claims.untested(name, f"this preset fine-tunes no DiffEqFormer and GPT-2 with "
                                                f"{method_name(method)}"))
    full = table[(table.method == "full") & table.model.str.startswith("DiffEqFormer N=")
                 & table.direction.map(lambda d: d.split(" -> ")[1] in OVERFIT_TARGETS)]
    x = [int(m.split("=")[1]) for m, rises in zip(full.model, full.rises) for _ in rises]
    y = [r for rises in full.rises for r in rises]
    groups = [k for ks in full["pretrain seeds"] for k in ks]
    if len(set(x)) >= 2:
        out["f7_overfit"] = claims.judge("f7_overfit", trend(x, y, groups), unit=PRETRAINING, if_untested=(
            "the rises of the other direction's fine-tunings, which do move, are exploratory (the table below): the "
            "paper's claim is about the target that stands for WikiText-103"))
    else:
        out["f7_overfit"] = claims.untested("f7_overfit", "this preset fine-tunes fewer than two N fully on the "
                                                          "target standing for WikiText-103")
    return out


def finetune_secondary(table):
    """F7's exploratory comparisons: per ``method``, ``direction`` and ``N``, ``finetune_differences`` judged as its
    method's claim (``verdict``, a ``claims.Verdict``; ``report.words.ablations.finetune_secondary`` tabulates them)."""
    import pandas as pd

    return pd.DataFrame([{"method": method_name(method), "direction": direction, "N": n,
                          "verdict": claims.judge(name, one_sample(list(per_seed.values())), unit=PRETRAINING)}
                         for method, name in (("lora", "f7_lora"), ("full", "f7_full"))
                         for (direction, n), per_seed in finetune_differences(table, method).items()])


# ------------------------------------------------------------------------------------------ F8-F10: ablations


def ablation_table(runs: Sequence[str | Sequence[str]], fields: Mapping[str, str]):
    """One row per entry of ``runs`` (a run or a setting's seed runs): config values of ``fields`` (column -> dotted
    field), model, seeds, final perplexity (mean, ``sd``), best, parameters, tokens/s, ``run``, ``runs``, ``finals``."""
    import pandas as pd

    records = []
    for entry in runs:
        described = [describe(run) for run in as_list(entry)]
        d = described[0]
        final = spread(s["final_ppl"] for s in described)
        record = {column: config_field(d["config"], dotted) for column, dotted in fields.items()}
        record.update({"model": _model_name(d), "seeds": final.n, "final ppl": final.mean, "sd": final.sd,
                       "best ppl": sum(s["best_ppl"] for s in described) / final.n, "params": d["total_params"],
                       "tokens/s": sum(s["tokens_per_second"] or math.nan for s in described) / final.n,
                       "run": str(as_list(entry)[0]), "runs": tuple(str(r) for r in as_list(entry)),
                       "finals": final.values, "losses": tuple(s["final_loss"] for s in described)})
        records.append(record)
    return pd.DataFrame.from_records(records)


HIDDEN_COLUMNS = ("run", "runs", "finals", "losses", "change", "rises", "pretrain seeds")
"""Columns of the tables here that are for the code, not for the reader."""


def shown(table):
    """The table as the book shows it: without ``HIDDEN_COLUMNS``."""
    return table.drop(columns=[c for c in HIDDEN_COLUMNS if c in table])


def beta2_table(runs: Mapping[str, Sequence[str | Sequence[str]]]):
    """F8 (Fig. 7): an ``ablation_table`` row per beta2 setting of each model key, with ``change``
    (``compare_seeds`` of its final log-perplexities with the same model's at 0.999), ``vs 0.999 %``, ``verdict``."""
    import pandas as pd

    parts = []
    for key, group in runs.items():
        t = ablation_table(group, {"beta2": "optimizer.beta2"})
        t.insert(0, "key", key)
        base = t[t.beta2 == 0.999]
        ref = base.losses.iloc[0] if len(base) else None
        changes = [None if (ref is None or b == 0.999) else compare_seeds(f, ref) for f, b in zip(t.losses, t.beta2)]
        t["vs 0.999 %"] = [percent(c.difference) if c else math.nan for c in changes]
        t["verdict"] = [c.verdict if c else "" for c in changes]
        t["change"] = changes
        parts.append(t.sort_values("beta2"))
    return pd.concat(parts, ignore_index=True)


def beta2_interaction(table) -> Comparison | None:
    """F8's primary test: per seed, DiffEqFormer's change of final log-perplexity from beta2 = 0.999 to the lower beta2
    less GPT-2's, by the one-sample t-test over the seeds all four settings share (None where a setting is missing)."""
    changes = {}
    for key, rows in table.groupby("key", sort=False):
        base, low = rows[rows.beta2 == 0.999], rows[rows.beta2 < 0.999]
        if len(base) and len(low):
            changes[key] = (low.losses.iloc[0], base.losses.iloc[0])
    if not {"ours", "gpt"} <= set(changes):
        return None
    n = min(len(v) for pair in changes.values() for v in pair)
    per_seed = [(changes["ours"][0][k] - changes["ours"][1][k]) - (changes["gpt"][0][k] - changes["gpt"][1][k])
                for k in range(n)]
    return one_sample(per_seed)


def beta2_verdicts(table) -> dict[str, claims.Verdict]:
    """The verdict on F8's claim (``claims.CLAIMS["f8_beta2"]``) from its primary test, ``beta2_interaction``."""
    interaction = beta2_interaction(table)
    return {"f8_beta2": claims.judge("f8_beta2", interaction) if interaction is not None else
            claims.untested("f8_beta2", "the preset did not train both models at both values of beta2")}


def time_embedding_table(runs: Sequence[str], measured: Sequence[Mapping] | None = None):
    """F9 (Table 6, Figs. 14-16): an ``ablation_table`` per d_t, sorted, and, given ``memory.measure_training_steps``
    of the same runs, the tokens/s and memory measured back to back."""
    table = ablation_table(runs, {"d_t": "model.time_embed_dim"}).sort_values("d_t").reset_index(drop=True)
    if measured is not None:
        by_run = {str(run_path(m["run"])): m for m in measured}
        for column, key in [("step tokens/s", "tokens_per_second"), ("training MiB", "training_mib"),
                            ("device peak MiB", "device_peak_mib"), ("XLA planned MiB", "xla_planned_mib"),
                            ("XLA arguments MiB", "xla_arguments_mib"), ("XLA temporaries MiB", "xla_temporaries_mib")]:
            table[column] = [by_run[str(run_path(r))].get(key) for r in table.run]
        if table["device peak MiB"].isna().all():
            table = table.drop(columns="device peak MiB")
        table[f"{PARAMETER_BYTES} B x params MiB"] = table.params * PARAMETER_BYTES / 2**20
    return table


MEMORY_SOURCES = {"device peak MiB": "the accelerator allocator's peak", "XLA planned MiB": "XLA's plan of the step",
                  "training MiB": "resident memory above the runtime's"}
"""The memory columns of a ``time_embedding_table``, in the order ``time_embedding_memory`` prefers them."""


def memory_column(table) -> str | None:
    """The memory column F9 judges: the first of ``MEMORY_SOURCES`` measured for every d_t (None: none)."""
    return next((c for c in MEMORY_SOURCES if c in table and table[c].notna().all()), None)


def time_embedding_memory(table, column: str | None = None, *, batch: int | None = None) -> MemoryGrowth:
    """``MemoryGrowth`` of F9's measured step against the parameters of each d_t, of ``column`` (by default
    ``memory_column``: the allocator's peak where there is one, else XLA's plan); ``batch``: for the source."""
    column = column or memory_column(table)
    if column is None:
        raise ValueError("the table holds no measured memory (time_embedding_table with measure_training_steps)")
    model = run_config(table.run.iloc[0]).model
    at = f" at batch {batch}" if batch is not None else ""
    # the measured step runs on one device, unsharded: a run sharded over n devices holds its parameters' share there
    return memory_growth(table.params, table[column] * 2**20, f"{MEMORY_SOURCES[column]}{at} on one device, "
                                                              f"{model.num_layers} x {model.hidden_dim}, seq "
                                                              f"{model.max_seq_len}")


def time_embedding_trend(table) -> Trend:
    """F9's perplexity trend (``statistics.trend``) of the seeds' final log-perplexities against log2 d_t, with an
    intercept per seed where every d_t has as many (seed k reads the same sequences), else one."""
    matched = len({len(f) for f in table.losses}) == 1
    return trend([math.log2(d) for d, losses in zip(table.d_t, table.losses) for _ in losses],
                 [v for losses in table.losses for v in losses],
                 [k for losses in table.losses for k in range(len(losses))] if matched else None)


def time_embedding_verdicts(table, memory: MemoryGrowth | None = None,
                            memory_note: str = "") -> dict[str, claims.Verdict]:
    """The verdicts on F9's claims: ``f9_dt`` from ``time_embedding_trend``; ``f9_memory`` the measurement ``memory``
    (None: not measured) by ``MemoryGrowth.grows_far_less``, noted with ``memory_note``."""
    return {"f9_dt": claims.judge("f9_dt", time_embedding_trend(table)),
            "f9_memory": (claims.measured("f9_memory", memory.grows_far_less, memory.growth_ratio, note=memory_note)
                          if memory is not None else claims.untested("f9_memory", "the preset measured no memory"))}


def hypernetwork_verdicts(table) -> dict[str, claims.Verdict]:
    """The verdict on F10's claim: per-weight MLPs against one shared MLP (``statistics.compare_seeds`` of the final
    log-perplexities)."""
    rows = table.set_index("hypernet")
    if not {"per_weight", "shared_mlp"} <= set(rows.index):
        return {"f10_hypernet": claims.untested("f10_hypernet", "the preset did not train both designs")}
    return {"f10_hypernet": claims.judge("f10_hypernet",
                                         compare_seeds(rows.loc["per_weight"].losses, rows.loc["shared_mlp"].losses))}
