"""Checks and the plan: the registry entry of a preset (with command-line overrides) validated against the notebooks,
``_toc.yml`` and the training configs, and resolved into the trainings and notebook executions to do."""

from __future__ import annotations

import ast
import dataclasses
import json
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from .. import config as configs
from .. import paths
from ..report import book
from ..runs import has_checkpoints, is_complete, saved_hash
from .registry import Run, presets
from .sources import notebook_key, notebook_sources_hash

TOC = paths.REPO / "_toc.yml"


def html_dir() -> Path:
    """Where the book is built: ``_build/html`` below DIFFEQFORMER_HOME."""
    return paths.HOME / "_build" / "html"


def work_dir() -> Path:
    """The pipeline's own files: ``cache/``, ``logs/``, ``failed/``, ``state.json``, staging folders."""
    return paths.HOME / "_build" / "pipeline"


def cache_dir() -> Path:
    return work_dir() / "cache"


class PipelineError(Exception):
    """A problem the user must fix; the message names it."""


# ---------------------------------------------------------------------------------------------------- validation


def toc_notebooks(toc: Path = TOC) -> list[str]:
    """The notebooks (stems) that ``_toc.yml`` puts in the book."""
    import yaml

    found = []

    def walk(node):
        if isinstance(node, dict):
            f = node.get("file")
            if isinstance(f, str) and f.startswith("notebooks/"):
                found.append(Path(f).stem)
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(yaml.safe_load(toc.read_text()))
    return found


def declared_parameters(notebook: Path) -> dict[str, dict]:
    """The parameters a notebook declares in its cell tagged ``parameters`` (Papermill's ``inspect_notebook``):
    name -> {inferred_type_name, default, help}."""
    import papermill

    cells = json.loads(Path(notebook).read_text())["cells"]
    if not any("parameters" in c.get("metadata", {}).get("tags", []) for c in cells):
        raise PipelineError(f"{notebook.name} has no cell tagged 'parameters'")

    return papermill.inspect_notebook(str(notebook))


_TYPES = {"str": str, "int": int, "float": float, "bool": bool, "list": list, "dict": dict, "tuple": tuple,
          "List": list, "Dict": dict, "Any": typing.Any, "Optional": typing.Optional, "None": None}


def _annotation(text: str):
    try:
        return eval(text, {"__builtins__": {}}, dict(_TYPES))  # names above only: 'str', 'list[str]', ...
    except Exception:
        raise PipelineError(f"unsupported parameter annotation {text!r}") from None


def type_matches(value, annotation) -> bool:
    """Whether ``value`` (plain JSON-like data) fits ``annotation`` (``int``, ``list[str]``, ``dict[str, str]``,
    ``Optional[int]``, ...). An int fits ``float``; a bool fits only ``bool``."""
    if annotation is typing.Any:
        return True
    if annotation is None or annotation is type(None):
        return value is None
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Union:
        return any(type_matches(value, a) for a in args)
    if origin in (list, tuple):
        return isinstance(value, (list, tuple)) and all(type_matches(v, args[0]) for v in value) if args else \
            isinstance(value, (list, tuple))
    if origin is dict:
        return isinstance(value, dict) and all(type_matches(k, args[0]) and type_matches(v, args[1])
                                               for k, v in value.items())
    if annotation is bool:
        return isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if annotation in (list, tuple):
        return isinstance(value, (list, tuple))
    return isinstance(value, annotation)


def _expected_type(declared: dict):
    """The type a parameter must have: its annotation, else the type of its literal default, else anything."""
    name = declared["inferred_type_name"]
    if name and name != "None":
        return _annotation(name)
    try:
        default = ast.literal_eval(declared["default"])
    except (ValueError, SyntaxError):
        return typing.Any
    return typing.Any if default is None else type(default)


def _plain(value):
    """Registry values with ``Run`` markers replaced by placeholder strings, tuples by lists (for type checks)."""
    return _map_runs(value, lambda run: str(run.path), as_list=True)


def check_parameters(notebook: str, values: Mapping[str, Any], declared: Mapping[str, dict]) -> None:
    """Reject parameter names the notebook does not declare and values of the wrong type, naming them."""
    for name, value in values.items():
        if name not in declared:
            raise PipelineError(f"{notebook}: parameter {name!r} is not declared in the notebook's parameters "
                                f"cell (it declares: {', '.join(declared) or 'nothing'})")
        expected = _expected_type(declared[name])
        if not type_matches(_plain(value), expected):
            shown = getattr(expected, "__name__", None) or str(expected).replace("typing.", "")
            raise PipelineError(f"{notebook}: parameter {name!r} must be {shown}, got {value!r} "
                                f"({type(value).__name__})")


def parse_overrides(items: list[str]) -> dict[str, dict[str, Any]]:
    """``["f1_model.seed=3", "f6_perplexity.runs={gpt: runs/x}"]`` -> {notebook: {parameter: value}}; values are
    YAML (so 3 is an int, [1, 2] a list, and a bare word a string)."""
    import yaml

    out: dict[str, dict[str, Any]] = {}
    for item in items:
        m = re.fullmatch(r"(\w+)\.(\w+)=(.*)", item, flags=re.S)
        if not m:
            raise PipelineError(f"--set expects NOTEBOOK.PARAMETER=VALUE, got {item!r}")
        out.setdefault(m[1], {})[m[2]] = yaml.safe_load(m[3]) if m[3].strip() else ""
    return out


# -------------------------------------------------------------------------------------------------------- plan


@dataclass
class Training:
    """A run the preset needs."""

    config: str
    """``Run.key``: the config below ``config/`` and its overrides."""
    path: Path
    name: str
    run_dir: Path
    config_hash: str
    done: bool
    stale: str | None = None
    """The config hash of another configuration's run found in ``run_dir`` (moved aside by ``retrain_stale``)."""
    run: Run | None = None
    """The registry's value it came from (config file, overrides, module)."""
    after: tuple[str, ...] = ()
    """Keys (``config``) of the trainings that must finish first: a fine-tuning's pretraining."""
    data: str = ""
    """The resolved data config (repr): runs with equal ones share a token cache, prepared once before training."""
    steps: int = 0
    """Training steps: the lanes start the longest runs first, so that no long run is left alone at the end."""
    flops: float = 0.0
    """Model FLOPs of one training step (``step_flops``): what the time left weighs a run never timed here by."""

    @property
    def population_key(self) -> tuple | None:
        """The population it is trained in (``Run.population_key``), None for a run trained alone."""
        return self.run.population_key if self.run is not None and self.run.population else None


@dataclass
class NotebookJob:
    """A notebook execution with its resolved parameters and cache key."""

    name: str
    path: Path
    parameters: dict
    runs: list[str]
    key: str = ""

    @property
    def cache_dir(self) -> Path:
        return cache_dir() / f"{self.name}-{self.key}"

    @property
    def cached(self) -> bool:
        return (self.cache_dir / "record.json").exists()


@dataclass
class Plan:
    """Everything one invocation will do, resolved and validated before anything runs."""

    preset: str
    trainings: list[Training] = field(default_factory=list)
    notebooks: list[NotebookJob] = field(default_factory=list)


def _map_runs(value, fn, *, as_list: bool = False):
    """``value`` (registry values: plain data in dicts, lists and tuples) with every ``Run`` in it replaced by
    ``fn(run)``, visited in order; a tuple stays a tuple unless ``as_list``. The one walker over registry values:
    ``collect_runs``, ``_plain``, ``join_populations`` and ``_resolve`` use it."""
    if isinstance(value, Run):
        return fn(value)
    if isinstance(value, dict):
        return {k: _map_runs(v, fn, as_list=as_list) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        items = [_map_runs(v, fn, as_list=as_list) for v in value]
        return items if as_list else type(value)(items)
    return value


def collect_runs(value, found: list[Run]) -> None:
    """Append every ``Run`` in ``value`` (registry values) to ``found``, in order."""
    _map_runs(value, found.append, as_list=True)


def join_populations(entries: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """The registry's entries with every ``Run`` that is also a member of a population (``seeded(...,
    population=True)`` elsewhere in the preset) replaced by that member: F1 reading ``Run("cpu/diffeqformer")``
    reads the first seed of F6's population, trained once."""
    found: list[Run] = []
    collect_runs(list(entries.values()), found)
    members: dict[tuple, Run] = {}
    for run in found:
        if run.population:
            members.setdefault((run.config, run.overrides, run.module), run)
    return {nb: _map_runs(values, lambda r: members.get((r.config, r.overrides, r.module), r))
            for nb, values in entries.items()}


def _resolve(value, run_dirs: Mapping[str, Path]):
    """``value`` (a notebook's parameters) with every ``Run`` in it replaced by its run directory (``run_dirs``:
    ``Run.key`` -> directory), tuples by lists. Relative to DIFFEQFORMER_HOME (the notebooks' working directory)
    where possible: the book then shows 'runs/cpu-gpt2', and the cache keys do not depend on where the home is."""
    return _map_runs(value, lambda run: paths.home_relative(run_dirs[run.key]), as_list=True)


def plan(preset: str, overrides: Mapping[str, Mapping[str, Any]] | None = None, *,
         registry: Mapping[str, Mapping[str, Mapping[str, Any]]] | None = None,
         notebooks_dir: Path | None = None, toc: Path | None = None, retrain_stale: bool = False) -> Plan:
    """Validate the preset's registry entry (with ``overrides``) and resolve it into a ``Plan``. Nothing is run;
    every problem raises ``PipelineError`` naming the preset, notebook, parameter or config.

    A run directory holding another configuration's run is an error, unless ``retrain_stale`` (then ``run`` moves
    it to ``runs/.stale/`` and trains again)."""
    entries = _entries(preset, overrides, presets() if registry is None else registry)
    in_toc = toc_notebooks(TOC if toc is None else toc)
    for nb in in_toc:
        if nb not in entries:
            raise PipelineError(f"notebook {nb!r} is in _toc.yml but preset {preset!r} does not run it: add it to "
                                f"diffeqformer.pipeline.PRESETS[{preset!r}]")
    notebooks_dir = paths.NOTEBOOKS if notebooks_dir is None else notebooks_dir
    result = Plan(preset, notebooks=[_notebook_job(preset, nb, values, notebooks_dir / f"{nb}.ipynb", in_toc)
                                     for nb, values in entries.items()])
    needed: list[Run] = []
    collect_runs([job.parameters for job in result.notebooks], needed)
    pretrainings: dict[str, Path] = {}
    pretraining_configs: dict[str, Any] = {}  # read once for the fine-tunings that share one
    for r in {r.key: r for r in needed}.values():
        training, pretraining_dir = _training(r, retrain_stale, pretraining_configs)
        result.trainings.append(training)
        if pretraining_dir is not None:
            pretrainings[r.key] = pretraining_dir
    _wait_for_pretrainings(preset, result.trainings, pretrainings)
    _resolve_notebooks(result)
    return result


def _entries(preset: str, overrides: Mapping[str, Mapping[str, Any]] | None,
             registry: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> dict[str, dict[str, Any]]:
    """The preset's registry entry (notebook -> parameter values) with the command line's ``overrides`` and the
    populations' members joined (``join_populations``)."""
    if preset not in registry:
        raise PipelineError(f"unknown preset {preset!r}; choose one of: {', '.join(registry)}")
    entries = {nb: dict(values) for nb, values in registry[preset].items()}
    for nb, values in (overrides or {}).items():
        if nb not in entries:
            raise PipelineError(f"--set names notebook {nb!r}, which preset {preset!r} does not run "
                                f"(it runs: {', '.join(entries)})")
        entries[nb].update(values)
    return join_populations(entries)


def _notebook_job(preset: str, nb: str, values: Mapping[str, Any], path: Path, in_toc: list[str]) -> NotebookJob:
    """The execution of notebook ``nb`` (at ``path``) with ``values`` and ``preset``, after checking that it exists,
    is in ``_toc.yml``, has a valid Colab cell and declares every parameter with a fitting type. Its parameters
    still hold the ``Run`` values (``_resolve_notebooks`` replaces them), its ``runs`` their keys."""
    if not path.exists():
        raise PipelineError(f"preset {preset!r} runs notebook {nb!r}, but {path} does not exist")
    if nb not in in_toc:
        raise PipelineError(f"notebook {nb!r} is run by preset {preset!r} but is not in _toc.yml")
    declared = declared_parameters(path)
    try:
        book.check_colab_cell(path)
    except ValueError as err:
        raise PipelineError(str(err)) from None
    if "preset" not in declared:
        raise PipelineError(f"{nb}: its parameters cell must declare 'preset'")
    values = {"preset": preset, **values}
    check_parameters(nb, values, declared)
    runs: list[Run] = []
    collect_runs(values, runs)
    return NotebookJob(nb, path, values, [r.key for r in runs])


def _training(run: Run, retrain_stale: bool, pretraining_configs: dict[str, Any]) -> tuple[Training, Path | None]:
    """The training of ``run``, and the run directory of its pretraining (None: ``run`` is no fine-tuning);
    ``pretraining_configs`` keeps the pretraining configurations read (file -> configuration)."""
    try:
        cfg, digest, run_dir, pretraining_dir = run.resolve()
    except (ValueError, FileNotFoundError) as err:
        raise PipelineError(f"training config {run.key!r}: {err}") from None
    done = is_complete(run_dir, digest)
    stale = None if done else _stale_hash(run, run_dir, digest, retrain_stale)
    pretraining = None
    if run.module == "finetune":
        if cfg.pretrain.config not in pretraining_configs:
            pretraining_configs[cfg.pretrain.config] = configs.pretraining_of(cfg)[0]
        pretraining = pretraining_configs[cfg.pretrain.config]
    training = Training(run.key, run.path, cfg.name, run_dir, digest, done, stale, run=run, data=repr(cfg.data),
                        steps=cfg.trainer.num_train_steps, flops=step_flops(cfg, pretraining))
    return training, pretraining_dir


def step_flops(cfg, pretraining=None) -> float:
    """Model FLOPs of one training step of ``cfg``: three times the model's forward FLOPs per token (Levanter's
    ``flops_per_token``: forward and backward) times the tokens of a batch. A fine-tuning's model is its
    ``pretraining``'s, discretised to its Euler steps where it has them; 0.0 where the model does not count its
    FLOPs."""
    model = cfg.model if pretraining is None else pretraining.model
    if pretraining is not None and cfg.steps is not None:
        model = dataclasses.replace(model, num_layers=cfg.steps)
    per_token = model.flops_per_token(cfg.data.vocab_size, model.max_seq_len)
    return 3.0 * per_token * cfg.trainer.train_batch_size * model.max_seq_len if per_token else 0.0


def _stale_hash(run: Run, run_dir: Path, digest: str, retrain_stale: bool) -> str | None:
    """The config hash of a run of another configuration than ``digest`` that ``run_dir`` holds (with checkpoints),
    None if it holds none; ``PipelineError`` unless ``retrain_stale``."""
    saved = saved_hash(run_dir)
    if saved is None or saved == digest or not has_checkpoints(run_dir):
        return None
    if not retrain_stale:
        raise PipelineError(
            f"{run_dir} holds a run of another configuration of {run.key} (hash {saved}; the config "
            f"now resolves to {digest}: the file, or the code that fills in its defaults, changed). "
            f"Move that directory away (or pass --retrain-stale, which moves it to runs/.stale/) to "
            f"train it again, or point the notebook at it with --set.")
    return saved


def _wait_for_pretrainings(preset: str, trainings: list[Training], pretrainings: Mapping[str, Path]) -> None:
    """Set ``Training.after`` of each fine-tuning whose pretraining (``pretrainings``: key -> run directory) the
    plan trains; ``PipelineError`` for two trainings into one run directory, a pretraining trained in a population,
    or one that is neither finished nor trained."""
    by_dir: dict[Path, Training] = {}
    for t in trainings:
        other = by_dir.setdefault(t.run_dir.resolve(), t)
        if other is not t:
            raise PipelineError(f"{t.config!r} and {other.config!r} would both train into {t.run_dir}: name one of "
                                f"them otherwise (a run trained in a population and alone are two runs)")
    for t in trainings:
        if t.config not in pretrainings:
            continue
        first = by_dir.get(pretrainings[t.config].resolve())
        if first is not None and first.config_hash != configs.pretraining_hash(t.run.load()):
            raise PipelineError(f"fine-tuning {t.config!r} would read {first.config!r} as its pretraining, a run "
                                f"trained {'in a population' if first.population_key else 'alone'}, but names "
                                f"another configuration of it: set its pretrain.population (and pretrain.member) as "
                                f"the pretraining was trained")
        if first is not None:
            t.after = (first.config,)
        elif not is_complete(pretrainings[t.config]):
            raise PipelineError(f"fine-tuning {t.config!r} needs the pretrained run {pretrainings[t.config]}, which "
                                f"is not finished and which preset {preset!r} does not train: add its config to "
                                f"the registry")


def _resolve_notebooks(result: Plan) -> None:
    """Replace the ``Run`` values in the parameters of ``result``'s notebooks by their run directories, and key each
    execution (``sources.notebook_key``) by its notebook, parameters, runs' config hashes and imported sources."""
    run_dirs = {t.config: t.run_dir for t in result.trainings}
    hashes = {t.config: t.config_hash for t in result.trainings}
    for job in result.notebooks:
        job.parameters = _resolve(job.parameters, run_dirs)
        job.key = notebook_key(job.path, job.parameters, {c: hashes[c] for c in job.runs},
                               notebook_sources_hash(job.path))
