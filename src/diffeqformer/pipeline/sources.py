"""Cache keys: the source a notebook can depend on (the package modules it imports, and theirs, found by reading the
imports), the notebook's own cells, the main libraries' versions."""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.metadata
import json
import platform
from pathlib import Path
from typing import Container, Mapping

PACKAGE = Path(__file__).resolve().parent.parent
"""The ``diffeqformer`` package's folder."""

LIBRARIES = ("jax", "jaxlib", "marin-levanter", "marin-haliax", "equinox", "diffrax", "numpy", "pandas", "matplotlib",
             "papermill", "myst-nb", "jupyter-book")
"""Library versions that enter every cache key."""


LAYERS = [
    ["paths", "numerics", "_autodoc", "dispatch", "devices", "forks"],
    # diffeqformer.model: the model core, bottom up
    ["model.time_embedding", "model.temporal", "model.attention"],
    ["model.vector_field"],
    ["model.transformer"],
    ["model.baselines", "model.solve", "model"],
    # diffeqformer.data: the synthetic language (its data, no analysis), then the corpora, which serve it to Levanter
    ["data", "data.synthetic"],
    ["data.corpora"],
    ["data.tasks"],  # F11's downstream tasks from the corpus's held-out documents
    ["data.__main__"],
    ["config"],  # the typed configurations: load, parse overrides, validate, hash, dump
    ["runs"],  # the run directory: its files, lock and lifecycle; a finished run's summary, config, metrics, model
    ["train"],
    ["finetune"],
    ["population"],  # trains populations of training runs and of fine-tunings
    # diffeqformer.report: saving figures and tables with their provenance, captions, glue; the book's extension
    ["report", "report.figures", "report.book"],
    # diffeqformer.analysis: the verdict rule over seeds, the analyses, F5's benchmark over lyapunov's scores
    ["analysis", "analysis.seeds"],
    ["analysis.claims"],  # the headline claims, each with its one primary test, and their verdicts
    ["analysis.schematic", "analysis.spectra", "analysis.trajectories", "analysis.lyapunov", "analysis.inference",
     "analysis.perplexity", "analysis.ablations", "analysis.downstream"],
    ["analysis.attribution"],
    ["pipeline.processes"], ["pipeline.registry"], ["pipeline.sources"], ["pipeline.planning"],
    ["pipeline.notebooks"], ["pipeline.progress"], ["pipeline.lanes"], ["pipeline.cluster", "pipeline.cost"],
    ["pipeline.edition"], ["pipeline.pages"],
    ["pipeline.build"], ["pipeline", "pipeline.__main__"],
]
"""The package's modules (below ``diffeqformer.``) in the order data flows through them, from the bottom up: a
module imports only modules of lower layers (``tests/test_layers.py`` checks it, and that every module is placed
here); the book's API page lists the modules in this order."""


def sha(*parts: bytes | str) -> str:
    """SHA-256 of the parts, each ended by a zero byte (so that ``("ab", "c")`` and ``("a", "bc")`` differ)."""
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode() if isinstance(p, str) else p)
        h.update(b"\0")
    return h.hexdigest()


@functools.cache
def _versions() -> tuple[str, ...]:
    """The main libraries' versions and Python's: read once a process (``importlib.metadata`` scans every installed
    distribution's metadata for each name, about a second a notebook key)."""
    out = []
    for lib in LIBRARIES:
        try:
            out.append(f"{lib}=={importlib.metadata.version(lib)}")
        except importlib.metadata.PackageNotFoundError:
            out.append(f"{lib} missing")
    return (*out, platform.python_version())


def package_hash() -> str:
    """Hash of every source file of the ``diffeqformer`` package and of the main libraries' versions (the book's
    key: its API reference documents every module)."""
    parts = []
    for f in sorted(PACKAGE.rglob("*.py")):
        parts += [str(f.relative_to(PACKAGE)), f.read_bytes()]
    return sha(*parts, *_versions())


def module_files() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its ``__init__.py``): ``diffeqformer.train``,
    ``diffeqformer.pipeline.plan``, ``diffeqformer``..."""
    out = {}
    for f in sorted(PACKAGE.rglob("*.py")):
        parts = (PACKAGE.name, *f.relative_to(PACKAGE).with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return out


def _with_parents(name: str, modules: Container[str]) -> set[str]:
    """``name`` and the packages above it (importing ``a.b.c`` runs ``a`` and ``a.b`` first), those of the package."""
    parts = name.split(".")
    return {m for m in (".".join(parts[:i]) for i in range(1, len(parts) + 1)) if m in modules}


def imported_modules(tree: ast.AST, modules: Container[str], here: str | None = None,
                     is_package: bool = False) -> set[str]:
    """The package's modules that the code ``tree`` imports anywhere (in functions too), ``here`` being the dotted
    name of the module it is (for relative imports), with the packages above each."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                if here is None:
                    continue
                base = here.split(".") if is_package else here.split(".")[:-1]
                base = base[:len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            names = [module] + [f"{module}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            found |= _with_parents(name, modules)
    return found


def notebook_modules(notebook: Path) -> set[str] | None:
    """The package's modules a notebook can run: those its code cells import, and everything they import in turn
    (lazy imports included). ``None`` when a cell is not Python that ``ast`` reads (then every module counts)."""
    modules = module_files()
    names = frozenset(modules)  # the key of _imports' cache
    cells = json.loads(Path(notebook).read_text())["cells"]
    todo: set[str] = set()
    for cell in cells:
        if cell["cell_type"] != "code":
            continue
        source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        # IPython's shell and magic lines are not Python; none of them imports a module of ours
        source = "\n".join("" if line.lstrip().startswith(("!", "%")) else line for line in source.splitlines())
        try:
            todo |= _imports(source, names)
        except SyntaxError:
            return None
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        f = modules[name]
        todo |= _imports(f.read_text(), names, name, f.name == "__init__.py") - seen
    return seen


@functools.lru_cache(maxsize=1024)
def _imports(source: str, modules: frozenset[str], here: str | None = None, is_package: bool = False) -> frozenset[str]:
    """``imported_modules`` of a source text, parsed once a process for each text (every notebook's key walks the
    same modules again)."""
    return frozenset(imported_modules(ast.parse(source), modules, here, is_package))


def notebook_sources_hash(notebook: Path) -> str:
    """Hash of the package source a notebook can depend on (``notebook_modules``: not the pipeline's own code, so
    that editing one registry entry re-executes only the notebooks whose parameters changed) and of the main
    libraries' versions."""
    names = notebook_modules(notebook)
    if names is None:
        return package_hash()
    modules = module_files()
    parts = []
    for name in sorted(names):
        parts += [name, modules[name].read_bytes()]
    return sha(*parts, *_versions())


def notebook_source_hash(path: Path) -> str:
    """Hash of a notebook's cells (type, source, tags): outputs and execution counts do not count."""
    nb = json.loads(Path(path).read_text())
    cells = [(c["cell_type"], "".join(c["source"]) if isinstance(c["source"], list) else c["source"],
              sorted(c.get("metadata", {}).get("tags", []))) for c in nb["cells"]]
    return sha(json.dumps(cells))


def notebook_key(path: Path, parameters: Mapping, run_hashes: Mapping[str, str], sources: str) -> str:
    """The cache key of one notebook execution: its cells, its parameter values, the config hash of each run it reads,
    ``sources`` (``notebook_sources_hash``)."""
    return sha(notebook_source_hash(path), json.dumps(parameters, sort_keys=True),
                json.dumps(dict(sorted(run_hashes.items()))), sources)[:16]
