"""The accelerator measurements as the book shows them (``gpu_markdown``: ``benchmarks/gpu/measure.py``'s
``benchmarks/results/gpu-*.json``), and what a preset's trainings cost at their rates (``cost_markdown``).

A training's FLOPs are three times (forward and backward) Levanter's ``flops_per_token`` of its model (a fine-tuning's:
its pretraining's, discretised) times the tokens it trains on; its GPU hours are those FLOPs at the FLOP rate measured
for the same model kind and shape, else for the largest shape measured of that kind. Nothing here is typed by hand.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from .. import config as configs
from .. import paths

RESULTS = paths.REPO / "benchmarks" / "results"
ONLINE_VOCABULARY = 50257
"""The GPT-2 tokenizer's vocabulary, which the online corpora (WikiText-103, OpenWebText) are read with."""
STATE_BYTES = 16
"""Bytes a float32 parameter holds while it trains with Adam: itself, its gradient and Adam's two moments."""


@dataclass(frozen=True)
class Rate:
    """A measured training throughput: FLOP/s of one GPU on one model."""

    flops_per_s: float
    model: str  # what was measured, e.g. "DiffEqFormer 24 x 1024, batch 16"
    device: str
    date: str


def measured_rates(folder: Path = RESULTS, device: str = "H100") -> dict[tuple[str, int, int], Rate]:
    """(kind, layers, width) -> the best ``Rate`` measured on ``device`` (a name part) in ``folder``'s files; kind is
    ``diffeqformer`` or ``baseline``."""
    rates: dict[tuple[str, int, int], Rate] = {}
    for path in sorted(folder.glob("gpu-*.json")):
        result = json.loads(path.read_text())
        if device not in result.get("device", ""):
            continue
        for pair in result.get("pairs", []):
            for name, kind, label in (("diffeqformer", "diffeqformer", "DiffEqFormer"), ("gpt2", "baseline", "GPT-2")):
                m = pair.get(name)
                if not m or not m.get("train_flops_per_token"):
                    continue
                rate = Rate(m["train_flops_per_token"] * m["tokens_per_second"], f"{label} {m['layers']} x "
                            f"{m['hidden']}, batch {m['batch']}", result["device"], result["date"])
                key = (kind, m["layers"], m["hidden"])
                if key not in rates or rate.flops_per_s > rates[key].flops_per_s:
                    rates[key] = rate
    return rates


def parameters(model, vocab: int) -> int:
    """Trainable parameters of ``model``: its closed form (DiffEqFormer, Levanter's Llama), or GPT-2's."""
    count = model.total_trainable_params(vocab)
    if count is not None:
        return int(count)
    D, M, L = model.hidden_dim, model.Mlp.size, model.num_layers  # Levanter's GPT-2: biases, tied embeddings
    return vocab * D + model.max_seq_len * D + L * (4 * D * D + 2 * D * M + 9 * D + M) + 2 * D


@dataclass(frozen=True)
class Training:
    """One training's cost."""

    name: str
    kind: str
    shape: tuple[int, int]  # (layers, width)
    params: int
    tokens: int
    flops: float
    rate: Rate
    finetuning: bool  # its model is its pretraining's, whose memory the first table gives

    @property
    def gpu_hours(self) -> float:
        return self.flops / self.rate.flops_per_s / 3600


def _rate(rates: dict, kind: str, shape: tuple[int, int]) -> Rate:
    """The rate measured for ``kind`` at ``shape``, else that of the largest shape measured of that kind."""
    if (kind, *shape) in rates:
        return rates[(kind, *shape)]
    mine = [k for k in rates if k[0] == kind] or list(rates)
    if not mine:
        raise FileNotFoundError(f"no H100 measurement in {RESULTS} (benchmarks/gpu/measure.py writes them)")
    return rates[max(mine, key=lambda k: k[1] * k[2] ** 2)]


def trainings(runs, rates: dict | None = None) -> list[Training]:
    """The cost of each of ``runs`` (the workflow's ``Run`` values: ``key``, ``load()``), the first of each key."""
    rates = measured_rates() if rates is None else rates
    out = []
    for run in {r.key: r for r in runs}.values():
        config = run.load()
        if isinstance(config, configs.FinetuneConfig):  # its pretraining's model, discretised to its steps
            model = configs.load_config(configs.repository_path(config.pretrain.config)).model
            model = model if config.steps is None else dataclasses.replace(model, num_layers=config.steps)
        else:
            model = config.model
        online = config.data.dataset in ("wikitext103", "openwebtext")  # read with the GPT-2 tokenizer
        vocab = ONLINE_VOCABULARY if online else config.data.vocab_size
        kind = "diffeqformer" if getattr(model, "time_dependent", False) else "baseline"
        shape = (model.num_layers, model.hidden_dim)
        tokens = config.trainer.batch_schedule.global_data_offset_by_step(config.trainer.num_train_steps) \
            * model.max_seq_len
        flops = 3 * model.flops_per_token(vocab, model.max_seq_len) * tokens
        out.append(Training(config.name, kind, shape, parameters(model, vocab), tokens, flops,
                            _rate(rates, kind, shape), isinstance(config, configs.FinetuneConfig)))
    return out


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f}"


def cost_markdown(runs, preset: str = "paper", gpus: int = 8) -> str:
    """The cluster page's tables for the ``runs`` of ``preset``: per model shape, its parameters and training state
    whole and sharded over ``gpus`` GPUs; per training, tokens, FLOPs and GPU hours; the total."""
    rows = trainings(runs)
    shapes = {}
    for t in rows:
        if not t.finetuning:
            shapes.setdefault((t.kind, *t.shape), t)
    lines = [f"| model | parameters | training state, one GPU (GiB) | sharded over {gpus} GPUs (GiB) |",
             "|---|---|---|---|"]
    for (kind, layers, width), t in sorted(shapes.items(), key=lambda kv: kv[1].params):
        lines.append(f"| {kind} {layers} x {width} | {t.params / 1e6:.0f}M | {_gib(STATE_BYTES * t.params)} | "
                     f"{_gib(STATE_BYTES * t.params / gpus)} |")
    lines += ["", "| training | model | tokens | PFLOPs | at the rate of | GPU hours |", "|---|---|---|---|---|---|"]
    for t in rows:
        lines.append(f"| {t.name} | {t.kind} {t.shape[0]} x {t.shape[1]} | {t.tokens / 1e9:.2f}B | "
                     f"{t.flops / 1e15:,.0f} | {t.rate.model} | {t.gpu_hours:,.1f} |")
    rates = sorted({(t.rate.device, t.rate.date) for t in rows})
    total = sum(t.gpu_hours for t in rows)
    lines += ["", f"**{total:,.0f} GPU hours** in all ({len(rows)} trainings of the {preset} preset), at the "
              f"throughput measured on {', '.join(f'{d} ({day})' for d, day in rates)} with one GPU per model, "
              f"which assumes that the steps scale linearly with the GPUs."]
    return "\n".join(lines) + "\n"


def gpu_markdown(folder: Path = RESULTS) -> str:
    """The accelerator measurements of ``folder`` as tables: per file, each DiffEqFormer / GPT-2 pair's parameters,
    tokens/s, ratio, model FLOP utilisation and peak memory, then DiffEqFormer at each time-embedding size measured."""
    files = sorted(folder.glob("gpu-*.json"))
    if not files:
        return "No accelerator measurements are committed yet (`benchmarks/gpu/measure.py` makes them).\n"

    def row(size, name, m, ratio=""):
        mfu = f"{m['mfu']:.1%}" if m.get("mfu") is not None else "n/a"
        peak = f"{m['peak_memory_gib']:.2f}" if m.get("peak_memory_gib") is not None else "n/a"
        return (f"| {size} | {name} | {m['time_embed_dim'] or ''} | {m['params'] / 1e6:.0f}M "
                f"| {m['tokens_per_second']:,.0f} | {ratio} | {mfu} | {peak} |")

    out = []
    for file in files:
        r = json.loads(file.read_text())
        if r.get("ladder"):
            out += ladder_markdown(r, file)
            continue
        batch = {m["batch"] for p in r["pairs"] for m in (p["diffeqformer"], p["gpt2"])}
        sizes = {p["pair"]: p["diffeqformer"] for p in r["pairs"]}
        shapes = "; ".join(f"{name}: {m['layers']} x {m['hidden']}, seq {m['seq']}" for name, m in sizes.items())
        out += [f"**{r['device']}**, {r['date']}, JAX {r['jax']}, batches of {', '.join(map(str, sorted(batch)))} "
                f"sequences ({shapes}), bfloat16 matrix-product peak measured at {r['peak_tflops']:.0f} TFLOP/s "
                f"(`{_shown(file)}`):", "",
                "| size | model | d_t | parameters | tokens/s | ratio to GPT-2 | MFU | peak GiB |",
                "|---|---|---|---|---|---|---|---|"]
        for p in r["pairs"]:
            out.append(row(p["pair"], "DiffEqFormer", p["diffeqformer"], f"{p['ratio']:.3f}"))
            out.append(row(p["pair"], "GPT-2", p["gpt2"]))
        for m in r.get("time_embed_dim", []):
            out.append(row(r["pairs"][0]["pair"], "DiffEqFormer", m))
        out += ["", gpu_summary(r), ""]
    return "\n".join(out) + "\n"


def _shown(file: Path):
    """A measurement file's path as a page names it: relative to the repository where it is in it."""
    return file.relative_to(paths.REPO) if file.is_relative_to(paths.REPO) else file


def ladder_markdown(r: Mapping[str, Any], file: Path) -> list[str]:
    """A ``measure.py --ladder`` result as a table: per pair, each row's (cumulative) levers with both models'
    tokens/s, MFU and peak memory, the ratio and the change from the pair's first row (or the error's last line)."""
    out = [f"**{r['device']}**, {r['date']}, JAX {r['jax']}, the speed levers one on top of another "
           f"(`benchmarks/gpu/measure.py --ladder`), bfloat16 matrix-product peak measured at "
           f"{r['peak_tflops']:.0f} TFLOP/s (`{_shown(file)}`):", "",
           "| size | levers | batch | vocabulary | DiffEqFormer tokens/s | MFU | peak GiB | GPT-2 tokens/s | MFU "
           "| peak GiB | ratio | change from the first row |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    first: dict[str, Mapping[str, Any]] = {}
    for e in r["ladder"]:
        if "error" in e:
            out.append(f"| {e['pair']} | {e['row']} | | | failed: {e['error'].strip().splitlines()[-1][:120]} "
                       "| | | | | | | |")
            continue
        ours, gpt = e["diffeqformer"], e["gpt2"]
        base = first.setdefault(e["pair"], e)
        change = (f"{ours['tokens_per_second'] / base['diffeqformer']['tokens_per_second'] - 1:+.0%} / "
                  f"{gpt['tokens_per_second'] / base['gpt2']['tokens_per_second'] - 1:+.0%}") if base is not e else ""
        cells = [f"{m['tokens_per_second']:,.0f} | {m['mfu']:.1%} | {m['peak_memory_gib']:.1f}" for m in (ours, gpt)]
        out.append(f"| {e['pair']} | {e['row']} | {ours['batch']} | {ours['vocab']:,} | {cells[0]} | {cells[1]} "
                   f"| {e['ratio']:.3f} | {change} |")
    return out + [""]


def gpu_summary(r: Mapping[str, Any]) -> str:
    """One sentence on a ``measure.py`` result: the throughput ratios and MFU measured, and how parameters, peak
    memory and throughput grow from the smallest d_t measured to the largest (the paper's Figs. 15-16)."""
    ratios = [p["ratio"] for p in r["pairs"]]
    mfus = [m["mfu"] for p in r["pairs"] for m in (p["diffeqformer"], p["gpt2"]) if m.get("mfu") is not None]

    def span(values, fmt):
        low, high = format(min(values), fmt), format(max(values), fmt)
        return low if low == high else f"{low}-{high}"

    text = f"DiffEqFormer trains at {span(ratios, '.2f')} times GPT-2's tokens/s"
    if mfus:
        text += f", the models at {span(mfus, '.0%')} model FLOP utilisation"
    sweep = sorted([r["pairs"][0]["diffeqformer"], *r.get("time_embed_dim", [])], key=lambda m: m["time_embed_dim"])
    if len(sweep) > 1 and all(m.get("peak_memory_gib") for m in sweep):
        a, b = sweep[0], sweep[-1]
        text += (f". From d_t = {a['time_embed_dim']} to {b['time_embed_dim']} the parameters grow "
                 f"{b['params'] / a['params']:.1f} times, the peak memory "
                 f"{b['peak_memory_gib'] / a['peak_memory_gib']:.1f} times, and tokens/s change by "
                 f"{b['tokens_per_second'] / a['tokens_per_second'] - 1:+.0%}")
    return text + "."
