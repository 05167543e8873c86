"""A preset's jobs as data for ``workflow/Snakefile``: the registry entry (``presets``) checked against the notebooks,
``_toc.yml`` and the training configs, and resolved into token caches, trainings and notebook executions. Kept in
``_build/workflow/<preset>/plan.json`` with the hash of what it was made from, so that a workflow with nothing to do
does not load Levanter's configs again."""

from __future__ import annotations

import ast
import hashlib
import json
import re
from pathlib import Path
from typing import Any, Mapping

from .. import paths

TOC = paths.REPO / "_toc.yml"
PACKAGE = paths.REPO / "src" / "diffeqformer"
RUNS_ALONE = frozenset({"f9_time_embedding"})
"""Notebooks that measure the machine (F9 times training steps): their jobs take every core (but in smoke)."""


class WorkflowError(Exception):
    """A problem the user must fix before anything runs; the message, one line, names it."""


def folder(preset: str) -> Path:
    """The workflow's files of ``preset``: ``_build/workflow/<preset>`` below DIFFEQFORMER_HOME."""
    return paths.HOME / "_build" / "workflow" / preset


def toc_notebooks(toc: Path = TOC) -> list[str]:
    """The notebooks (stems) that ``_toc.yml`` puts in the book, in its order."""
    import yaml

    text = json.dumps(yaml.safe_load(Path(toc).read_text()))
    return [Path(f).stem for f in re.findall(r'"file": "(notebooks/[^"]+)"', text)]


def declared_parameters(notebook: Path) -> dict[str, dict]:
    """The parameters a notebook declares in its cell tagged ``parameters`` (Papermill's ``inspect_notebook``)."""
    import papermill

    return papermill.inspect_notebook(str(notebook))  # none tagged: {}, refused below for lacking 'preset'


TYPES = {"str": str, "int": int, "float": (int, float), "bool": bool, "list": list, "dict": dict}
"""The annotations a parameters cell may give -> the values that fit (an int fits ``float``, a bool only ``bool``)."""


def check_parameters(notebook: str, values: Mapping[str, Any], declared: Mapping[str, dict]) -> None:
    """Reject parameter names the notebook does not declare and values of another type than the parameter's
    annotation, else its literal default, naming them."""
    for name, value in values.items():
        if name not in declared:
            raise WorkflowError(f"{notebook}: parameter {name!r} is not declared in the notebook's parameters "
                                f"cell (it declares: {', '.join(declared) or 'nothing'})")
        typed = declared[name]["inferred_type_name"]
        try:
            default = ast.literal_eval(declared[name]["default"])
        except (ValueError, SyntaxError):
            default = None
        expected = TYPES.get(typed) or (type(default) if default is not None else object)
        if not isinstance(value, expected) or (isinstance(value, bool) and bool not in (expected, object)):
            shown = typed if typed in TYPES else expected.__name__
            raise WorkflowError(f"{notebook}: parameter {name!r} must be {shown}, got {value!r} "
                                f"({type(value).__name__})")


def parse_overrides(items: list[str]) -> dict[str, dict[str, Any]]:
    """``["f1_model.seed=3"]`` -> {notebook: {parameter: value}}; values are YAML."""
    import yaml

    out: dict[str, dict[str, Any]] = {}
    for item in items:
        m = re.fullmatch(r"(\w+)\.(\w+)=(.*)", item, flags=re.S)
        if not m:
            raise WorkflowError(f"set expects NOTEBOOK.PARAMETER=VALUE, got {item!r}")
        out.setdefault(m[1], {})[m[2]] = yaml.safe_load(m[3]) if m[3].strip() else ""
    return out


def _map_runs(value, fn):
    """``value`` (registry values) with every ``Run`` replaced by ``fn(run)``, visited in order, tuples as lists."""
    from .presets import Run

    if isinstance(value, Run):
        return fn(value)
    if isinstance(value, dict):
        return {k: _map_runs(v, fn) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_map_runs(v, fn) for v in value]
    return value


def collect_runs(value) -> list:
    """Every ``Run`` in ``value`` (registry values), in order."""
    found: list = []
    _map_runs(value, found.append)
    return found


def join_populations(entries: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every ``Run`` that is also a population's member elsewhere in the preset replaced by that member: F1's
    ``Run("cpu/diffeqformer")`` is the first seed of F6's population, trained once."""
    members: dict[tuple, Any] = {}
    for run in collect_runs(list(entries.values())):
        if run.population:
            members.setdefault((run.config, run.overrides, run.module), run)
    return {nb: _map_runs(values, lambda r: members.get((r.config, r.overrides, r.module), r))
            for nb, values in entries.items()}


def entries(preset: str, overrides: Mapping[str, Mapping[str, Any]] | None = None,
            registry: Mapping[str, Mapping[str, Mapping[str, Any]]] | None = None) -> dict[str, dict[str, Any]]:
    """The preset's registry entry (notebook -> parameter values) with ``overrides`` and the populations joined."""
    from . import presets

    names = presets.BUILDERS if registry is None else registry
    if preset not in names:
        raise WorkflowError(f"unknown preset {preset!r}; choose one of: {', '.join(names)}")
    found = {nb: dict(v) for nb, v in (presets.preset(preset) if registry is None else registry[preset]).items()}
    for nb, values in (overrides or {}).items():
        if nb not in found:
            raise WorkflowError(f"set names notebook {nb!r}, which preset {preset!r} does not run "
                                f"(it runs: {', '.join(found)})")
        found[nb].update(values)
    return join_populations(found)


def benchmark_seconds(path: Path) -> float:
    """The wall-clock seconds of a job, from the benchmark file Snakemake wrote for it."""
    return float(path.read_text().splitlines()[1].split("\t")[0])


def _marker(run_dir: Path, digest: str) -> str:
    """A training job's output: a file per config hash, so that a changed config is a missing output, and the run
    directory, with its checkpoints, is never an output that Snakemake could delete."""
    return paths.home_relative(run_dir / f"trained-{digest[:16]}.json")


def _resolved(members: list) -> list[tuple]:
    """``(run, *run.resolve())`` of each member, a config that does not load named."""
    out = []
    for r in members:
        try:
            out.append((r, *r.resolve()))
        except Exception as err:  # a missing file, YAML, a field draccus cannot decode, a value refused
            raise WorkflowError(f"training config {r.key!r}: {err}") from None
    return out


def _trainings(runs: list) -> tuple[list[dict], dict[str, dict], dict[str, str]]:
    """The training jobs of ``runs`` (a run alone, or a population's members as one job), longest first; the token
    caches they read (data id -> the arguments of a run that reads it); each run's directory by ``Run.key``."""
    from .. import config as configs
    from ..runs import is_complete

    units: dict[Any, list] = {}
    for r in {r.key: r for r in runs}.values():
        units.setdefault(r.population_key if r.population else r.key, []).append(r)
    jobs, tokens, marker_of, dir_of, key_of, hash_of, wants = [], {}, {}, {}, {}, {}, {}
    for members in units.values():
        resolved = _resolved(members)
        for r, cfg, digest, run_dir, pretraining in resolved:
            where = paths.home_relative(run_dir)
            if key_of.setdefault(where, r.key) != r.key:
                raise WorkflowError(f"{r.key!r} and {key_of[where]!r} would both train into {where}: name one of "
                                    f"them otherwise (a run trained in a population and alone are two runs)")
            marker_of[where], dir_of[r.key], hash_of[where] = _marker(run_dir, digest), where, digest
            if pretraining is not None:
                wants[r.key] = (paths.home_relative(pretraining), configs.pretraining_hash(cfg))
        r0, cfg0 = min(resolved, key=lambda x: x[1].trainer.seed)[:2]
        data = hashlib.sha256(repr(cfg0.data).encode()).hexdigest()[:12]
        tokens.setdefault(data, {"argv": ["--config", str(r0.path), *r0.overrides], "module": r0.module})
        argv = ["-m", f"diffeqformer.{r0.module}", "--config", str(r0.path), *r0.overrides] if len(members) == 1 \
            else ["-m", "diffeqformer.population", "--config", str(r0.path), *r0.overrides, "--seeds",
                  str(len(members))]
        jobs.append({"name": re.sub(r"\W", "_", cfg0.name), "argv": argv, "tokens": data,
                     "configs": sorted({str(r.path) for r in members}), "steps": cfg0.trainer.num_train_steps,
                     "runs": [paths.home_relative(d) for *_, d, _ in resolved],
                     "hashes": [h for *_, h, _, _ in resolved], "outputs": [_marker(d, h) for *_, h, d, _ in resolved],
                     "after": sorted({paths.home_relative(p) for *_, p in resolved if p is not None})})
    for key, (where, digest) in wants.items():
        if where in hash_of and hash_of[where] != digest:
            raise WorkflowError(f"fine-tuning {key!r} would read {key_of[where]!r} as its pretraining, but names "
                                f"another configuration of it: set its pretrain.population (and pretrain.member) as "
                                f"the pretraining is trained")
    for job in jobs:  # a fine-tuning waits for its pretraining's job, where this preset trains it
        for p in job["after"]:
            if p not in marker_of and not is_complete(p):
                raise WorkflowError(f"fine-tuning {job['name']} needs the pretrained run {p}, which is not finished "
                                    f"and which this preset does not train: add its config to the registry")
        job["after"] = [marker_of[p] for p in job["after"] if p in marker_of]
    return sorted(jobs, key=lambda j: -j["steps"]), tokens, dir_of


def _notebook(preset: str, nb: str, values: Mapping[str, Any], path: Path, in_toc: list[str],
              graph: Mapping[str, set[str]]) -> dict:
    """The execution of notebook ``nb``, once it is checked: it exists, is in ``_toc.yml``, has a valid Colab cell and
    declares ``preset`` and every parameter, with a fitting type."""
    from ..report import book

    if not path.exists():
        raise WorkflowError(f"preset {preset!r} runs notebook {nb!r}, but {path} does not exist")
    if nb not in in_toc:
        raise WorkflowError(f"notebook {nb!r} is run by preset {preset!r} but is not in _toc.yml")
    declared = declared_parameters(path)
    try:
        book.check_colab_cell(path)
    except ValueError as err:
        raise WorkflowError(str(err)) from None
    if "preset" not in declared:
        raise WorkflowError(f"{nb}: its parameters cell must declare 'preset'")
    values = {"preset": preset, **values}
    check_parameters(nb, _map_runs(values, lambda run: str(run.path)), declared)
    return {"name": nb, "path": str(path), "parameters": values, "sources": notebook_sources(path, graph)}


def make(preset: str, overrides: Mapping[str, Mapping[str, Any]] | None = None, *,
         registry: Mapping | None = None, notebooks_dir: Path | None = None, toc: Path | None = None) -> dict:
    """The preset checked and resolved: ``{"preset", "tokens", "trainings", "notebooks"}``, plain data; a problem
    raises ``WorkflowError`` naming the preset, notebook, parameter or config."""
    found = entries(preset, overrides, registry)
    in_toc = toc_notebooks(TOC if toc is None else toc)
    for nb in in_toc:
        if nb not in found:
            raise WorkflowError(f"notebook {nb!r} is in _toc.yml but preset {preset!r} does not run it: add it to "
                                f"diffeqformer.workflow.presets")
    notebooks_dir = paths.NOTEBOOKS if notebooks_dir is None else Path(notebooks_dir)
    graph = import_graph()
    notebooks = [_notebook(preset, nb, values, notebooks_dir / f"{nb}.ipynb", in_toc, graph)
                 for nb, values in found.items()]
    trainings, tokens, dir_of = _trainings(collect_runs([job["parameters"] for job in notebooks]))
    marker = {d: m for job in trainings for d, m in zip(job["runs"], job["outputs"])}
    for job in notebooks:
        job["inputs"] = sorted({marker[dir_of[r.key]] for r in collect_runs(job["parameters"])})
        job["parameters"] = _map_runs(job["parameters"], lambda r: dir_of[r.key])
    return {"preset": preset, "tokens": tokens, "trainings": trainings, "notebooks": notebooks}


def module_files() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its ``__init__.py``)."""
    out = {}
    for f in sorted(PACKAGE.rglob("*.py")):
        parts = ("diffeqformer", *f.relative_to(PACKAGE).with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return out


def imported_modules(tree: ast.AST, modules, here: str = "", is_package: bool = False) -> set[str]:
    """The package's ``modules`` that the code ``tree`` (module ``here``) imports anywhere, functions included, with
    the packages above each (importing ``a.b.c`` runs ``a`` and ``a.b`` first)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = here.split(".") if is_package else here.split(".")[:-1]
            module = ".".join(base[:len(base) - node.level + 1] + [node.module or ""]).strip(".") if node.level \
                else node.module or ""
            names = [module] + [f"{module}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            found |= {m for m in (".".join(parts[:i]) for i in range(1, len(parts) + 1)) if m in modules}
    return found


def import_graph() -> dict[str, set[str]]:
    """Module of the package -> the modules of the package it imports (inside functions too), from its source."""
    modules = module_files()
    return {name: imported_modules(ast.parse(f.read_text()), modules, name, f.name == "__init__.py")
            for name, f in modules.items()}


def notebook_sources(notebook: Path, graph: Mapping[str, set[str]] | None = None) -> list[str]:
    """The package's files a notebook's code imports, directly or through others, lazily too (``import_graph``): its
    job reruns when one changes. Not the workflow's modules: editing a preset reruns only what it changed."""
    graph = import_graph() if graph is None else graph
    cells = [c for c in json.loads(Path(notebook).read_text())["cells"] if c["cell_type"] == "code"]
    lines = "\n".join("".join(c["source"]) for c in cells).splitlines()
    source = "\n".join("" if line.lstrip().startswith(("!", "%")) else line for line in lines)  # shell, magics
    found, todo = set(), list(imported_modules(ast.parse(source), graph))
    while todo:
        if (name := todo.pop()) not in found:
            found.add(name)
            todo += graph[name]
    files = module_files()
    return sorted(str(files[name]) for name in found if not name.startswith("diffeqformer.workflow"))


def book_sources() -> list[Path]:
    """What the book job reads besides the executed notebooks: ``book/``, the book's configuration and table of
    contents, and the package's sources (the API pages)."""
    chapters = [p for p in paths.BOOK.rglob("*") if p.is_file() and not {"_generated", "_build"} & set(p.parts)]
    return sorted(chapters) + [paths.REPO / "_config.yml", TOC, *sorted(PACKAGE.rglob("*.py"))]


def load(preset: str, overrides: Mapping[str, Mapping[str, Any]] | None = None) -> dict:
    """The plan of ``preset`` (``make``), read from ``plan.json`` while nothing it was made from has changed: the
    configs, sources, notebooks, ``_toc.yml`` and the overrides."""
    h = hashlib.sha256(json.dumps([preset, overrides or {}]).encode())
    for f in [*sorted(paths.CONFIG.rglob("*.yaml")), *sorted(PACKAGE.rglob("*.py")),
              *sorted(paths.NOTEBOOKS.glob("*.ipynb")), TOC]:
        h.update(str(f).encode() + b"\0" + f.read_bytes() + b"\0")
    cached = folder(preset) / "plan.json"
    if cached.exists() and (saved := json.loads(cached.read_text())).get("key") == h.hexdigest():
        return saved["plan"]
    made = make(preset, overrides)
    paths.write_atomic(cached, json.dumps({"key": h.hexdigest(), "plan": made}, indent=1) + "\n")
    return made
