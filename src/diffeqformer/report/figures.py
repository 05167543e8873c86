"""Figures of the book: saved as PNG and SVG with a provenance record beside them, captioned with their scale. A
notebook calls ``start`` once, then ``save_figure``, ``save_table`` and ``glue`` (a number the prose quotes)::

    figures.start("f2_spectra", dict(preset=preset, run=run), runs=[run])
    figures.save_figure(fig, "f2_qk_vs_t", caption="QK eigenvalues against t.", paper="radius grows with t")
    figures.glue("f2_spearman_qk", rho, "{:.2f}")

Each ``<name>.json`` records the notebook, its parameters, the git commit, the configuration hash of every run it
uses, the date and the scale; the caption states the scale and, where the paper gives one, its claim.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import struct
import subprocess
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .. import paths
from ..runs import config as run_config
from ..runs import model_config, model_label, model_type, run_path
from ..runs import summary as finished_summary

FORMATS = ("png", "svg")
PNG_DPI, SCREEN_DPI = 150, 100
"""Pixels per inch of a figure in its PNG file, and as the book shows it (the PNG scaled down to that width)."""
_NAME = re.compile(r"^[a-z0-9][a-z0-9_\-]*$")


def figures_dir() -> Path:
    """Where figures are written: ``$DIFFEQFORMER_FIGURES`` (a notebook job's temporary folder, moved into place
    when every notebook has succeeded) if set, else ``paths.FIGURES``."""
    return Path(os.environ.get("DIFFEQFORMER_FIGURES", paths.FIGURES))


def git_commit() -> str:
    """The repository's commit, with ``+dirty`` when tracked files differ from it ("unknown" outside a checkout)."""
    try:
        def git(*args):
            return subprocess.run(["git", "-C", str(paths.REPO), *args], capture_output=True, text=True,
                                  check=True, timeout=10).stdout.strip()

        commit = git("rev-parse", "HEAD")
        return commit + ("+dirty" if git("status", "--porcelain", "--untracked-files=no") else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def scale_of(run_dir) -> str:
    """The scale of a finished run, e.g. ``DiffEqFormer, 6 steps, 128-d, seq 128; shakespeare (all), 300 training
    steps`` (a fine-tuning's model is its pretraining's)."""
    finished_summary(run_dir)  # refuses a run that did not finish
    m, config = model_config(run_dir), run_config(run_dir)
    depth = f"{m.num_layers} {'steps' if model_type(m) == 'diffeqformer' else 'layers'}"
    return (f"{model_label(m)}, {depth}, {m.hidden_dim}-d, seq {m.max_seq_len}; "
            f"{config.data.dataset} ({config.data.domain}), {config.trainer.num_train_steps} training steps")


def _common_scale(runs) -> str:
    """The scale of several runs: once when they share it (but for the model type), else each run's."""
    scales = [scale_of(r) for r in runs]
    # "6 steps" (the ODE) and "6 layers" (a baseline) are the same depth
    rest = {re.sub(r"^(\d+) (steps|layers), ", r"\1 layers or steps, ", sc.split(", ", 1)[1]) for sc in scales}
    if len(rest) == 1:
        return f"{_models_and_seeds(runs, scales)}, each {rest.pop()}"
    groups = Counter((_model_name(r), sc) for r, sc in zip(runs, scales))  # (model, scale) -> number of seeds
    return "; ".join(f"{name}{f' ({n} seeds)' if n > 1 else ''}: {sc}" for (name, sc), n in groups.items())


def _model_name(run_dir) -> str:
    """A run's name without the ``-seed<k>`` of its seed copies: the model it trains."""
    return re.sub(r"-seed\d+$", "", run_path(run_dir).name)


def _models_and_seeds(runs, scales) -> str:
    """``5 runs of 3 models (GPT-2, 2 seeds; weight-shared; DiffEqFormer, 2 seeds)``: a run's seed copies are one
    model; two models of one kind are told apart by their run names."""
    models: dict[str, list] = {}
    for r, sc in zip(runs, scales):
        models.setdefault(_model_name(r), [sc.split(", ", 1)[0], 0])[1] += 1
    shared = Counter(kind for kind, _ in models.values())
    named = {name: kind if shared[kind] == 1 else f"{kind} {name}" for name, (kind, _) in models.items()}
    kinds = "; ".join(named[name] if n == 1 else f"{named[name]}, {n} seeds" for name, (_, n) in models.items())
    if len(models) == len(runs):
        return f"{len(runs)} models ({kinds.replace('; ', ', ')})"
    return f"{len(runs)} runs of {len(models)} model{'s' if len(models) > 1 else ''} ({kinds})"


@dataclass
class Provenance:
    """What every figure of one notebook execution shares."""

    notebook: str
    parameters: dict
    scale: str
    runs: dict = field(default_factory=dict)  # run dir (relative to DIFFEQFORMER_HOME) -> config hash
    commit: str = field(default_factory=git_commit)
    date: str = field(
        default_factory=lambda: datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))


_current: Provenance | None = None


def start(notebook: str, parameters: dict, *, runs=(), scale: str | None = None) -> Provenance:
    """Begin a notebook's figures: record its name, parameter values and the runs it reads; ``scale`` defaults to
    ``preset`` and the runs' scale."""
    global _current
    if not _NAME.match(notebook):
        raise ValueError(f"notebook must be a lowercase name like 'f2_spectra', got {notebook!r}")
    hashes = {paths.home_relative(run_path(r)): finished_summary(r).get("config_hash") for r in runs}
    if scale is None:
        preset = parameters.get("preset")
        parts = ([f"{preset} preset"] if preset else []) + (
            [scale_of(runs[0])] if len(runs) == 1 else [_common_scale(runs)] if runs else [])
        scale = "; ".join(parts) or "unspecified scale"
    _current = Provenance(notebook, dict(parameters), scale, hashes)
    return _current


def current() -> Provenance:
    if _current is None:
        raise RuntimeError("call diffeqformer.report.figures.start(notebook, parameters, ...) before saving figures")
    return _current


class Record(dict):
    """A figure's or table's provenance record, which displays nothing as a cell's last value (the page shows the
    figure or table and its caption already)."""

    def _ipython_display_(self):
        pass


def _record(name: str, files: list[str], caption: str, paper: str | None) -> Record:
    prov = current()
    full_caption = f"{caption} Scale: {prov.scale}." + (f" Paper: {paper}" if paper else "")
    out = figures_dir()
    for f in files:
        if not (out / f).exists() or (out / f).stat().st_size == 0:
            raise RuntimeError(f"{out / f} was not written (or is empty)")
    record = Record(figure=name, files=files, caption=full_caption, notebook=prov.notebook,
                    parameters=prov.parameters, commit=prov.commit, runs=prov.runs, date=prov.date,
                    scale=prov.scale, paper=paper)
    (out / f"{name}.json").write_text(json.dumps(record, indent=1, default=str) + "\n")
    return record


def _check_name(name: str) -> Path:
    if not _NAME.match(name):
        raise ValueError(f"figure name must be lowercase letters, digits, '_' or '-', got {name!r}")
    current()
    out = figures_dir()
    out.mkdir(parents=True, exist_ok=True)
    return out


def save_figure(fig, name: str, *, caption: str, paper: str | None = None, show: bool = True) -> Record:
    """Save ``fig`` as ``<name>.png`` and ``<name>.svg`` with ``<name>.json`` (provenance) in ``figures_dir()``;
    return the record. ``caption`` says what it shows; the notebook's scale and ``paper`` (the paper's claim) are
    appended. With ``show`` the saved PNG and the caption are displayed, the image glued under ``name`` for other
    pages. The PNG is shown, not ``fig``: a ``matplotlib.figure.Figure`` in a notebook that never drew through pyplot
    has no PNG formatter registered and would be shown as its text."""
    import matplotlib

    out = _check_name(name)
    # the SVG's element ids from the figure's name, not a random salt: the same figure makes the same file
    with matplotlib.rc_context({"svg.hashsalt": name}):
        for fmt in FORMATS:
            fig.savefig(out / f"{name}.{fmt}", dpi=PNG_DPI if fmt == "png" else None, bbox_inches="tight")
    record = _record(name, [f"{name}.{fmt}" for fmt in FORMATS], caption, paper)
    if show:
        import matplotlib.pyplot as plt
        from IPython.display import Markdown, display

        image = saved_image(out / f"{name}.png")
        display(image)
        display(Markdown(f"**{name}.** {record['caption']}"))
        _glue_object(name, image)
        plt.close(fig)  # a pyplot figure left open would be shown again by the inline backend at the cell's end
    return record


def saved_image(png: Path):
    """A saved PNG as an IPython ``Image`` displayed at ``SCREEN_DPI`` (sharp on screens with more pixels)."""
    from IPython.display import Image

    data = Path(png).read_bytes()
    width = struct.unpack(">I", data[16:20])[0]  # the PNG header (IHDR) starts with the width in pixels
    return Image(data=data, format="png", width=round(width * SCREEN_DPI / PNG_DPI))


SHOWN_COLUMNS = 7
"""Columns a table shows at most on its page, its index's among them; the whole table follows, collapsed."""


def save_table(frame, name: str, *, caption: str, paper: str | None = None, show: bool = True,
               floatfmt: str = "{:.1f}", formats: Mapping[str, str] | None = None,
               main: Sequence[str] | None = None) -> Record:
    """Save a DataFrame as ``<name>.csv`` with ``<name>.json`` (provenance) beside the figures, and show it with its
    caption: numbers with ``floatfmt`` or ``formats[column]``, missing values as a dash; beyond ``SHOWN_COLUMNS``
    columns, ``main`` (default: the first that fit) with the whole table collapsed below."""
    unknown = (set(formats or ()) | set(main or ())) - set(frame.columns)
    if unknown:
        raise ValueError(f"save_table({name!r}): formats or main name columns the table does not have: "
                         f"{sorted(unknown)}")
    fit = max(1, SHOWN_COLUMNS - frame.index.nlevels)
    if main is not None and len(main) > fit:
        raise ValueError(f"save_table({name!r}): main names {len(main)} columns, more than fit beside its index "
                         f"({fit})")
    out = _check_name(name)
    frame.to_csv(out / f"{name}.csv")
    record = _record(name, [f"{name}.csv"], caption, paper)
    if show:
        import pandas as pd
        from IPython.display import HTML, Markdown, display

        def fmt(x, spec):
            if x is None or x is pd.NA or (isinstance(x, float) and x != x):  # missing: None, pandas' NA or NaN
                return "–"
            return spec.format(x) if isinstance(x, float) else str(x)

        specs = {**dict.fromkeys(frame.columns, floatfmt), **(formats or {})}
        shown = frame.apply(lambda column: column.map(lambda x: fmt(x, specs[column.name])))
        if len(frame.columns) <= fit:
            display(HTML(shown.to_html(escape=True)))
        else:
            columns = list(main or frame.columns[:fit])
            display(HTML(shown[columns].to_html(escape=True) + f"<details><summary>All {len(frame.columns)} "
                         f"columns</summary>{shown.to_html(escape=True)}</details>"))
        display(Markdown(f"**{name}.** {record['caption']}"))
    return record


def log_perplexity_axis(ax, label: str = "validation perplexity") -> None:
    """A logarithmic perplexity axis with plain numbers as tick labels (400, not 4 x 10^2)."""
    from matplotlib.ticker import FuncFormatter

    ax.set_yscale("log")
    ax.set_ylabel(label)
    plain = FuncFormatter(lambda v, _: f"{v:g}")
    ax.yaxis.set_major_formatter(plain)
    ax.yaxis.set_minor_formatter(plain)


def _glue_object(name: str, value) -> None:
    from myst_nb import glue as nb_glue  # Jupyter Book's, a dependency of the project

    nb_glue(name, value, display=False)


def glue(name: str, value, fmt: str | None = None) -> None:
    """Publish a number for the book's prose (MyST-NB ``{glue:text}``), formatted with ``fmt``. It returns nothing, so
    that a cell ending with it shows no output of its own on the page."""
    _glue_object(name, fmt.format(value) if fmt else value)
