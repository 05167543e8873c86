"""The package's import structure: imports point down one order of layers (the data path), no module imports another
in a cycle (imports inside functions included), and no module uses another module's private names."""

from __future__ import annotations

import ast

from diffeqformer._autodoc import LAYERS
from diffeqformer.workflow.plan import imported_modules, module_files

WITHIN_LAYER: set[tuple[str, str]] = set()
"""Imports allowed between modules of one layer (importer, imported)."""

PACKAGE_INIT = 5
"""``diffeqformer/__init__.py`` re-exports the model's public names (``diffeqformer.model``): it may import layers up
to this one."""


def _short(name: str) -> str:
    return name.removeprefix("diffeqformer").removeprefix(".") or "diffeqformer"


class _RuntimeOnly(ast.NodeTransformer):
    """Drops ``if TYPE_CHECKING:`` blocks: imports for annotations only, which never run."""

    def visit_If(self, node):
        test = node.test
        if (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
                isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"):
            return node.orelse or None
        return self.generic_visit(node)


def _graph() -> dict[str, set[str]]:
    """Module -> the modules it imports when it runs (inside functions too), all by their names below the package."""
    modules = module_files()
    graph = {}
    for name, f in modules.items():
        tree = _RuntimeOnly().visit(ast.parse(f.read_text()))
        found = imported_modules(tree, modules, name, f.name == "__init__.py")
        # every import runs the packages above it: that edge is Python's, not the module's choice
        graph[_short(name)] = {_short(m) for m in found if m != name and not name.startswith(m + ".")}
    return graph


def test_every_module_is_placed_in_one_layer():
    placed = [m for layer in LAYERS for m in layer]
    assert len(placed) == len(set(placed))
    modules = set(_graph()) - {"diffeqformer"}
    assert sorted(modules - set(placed)) == [], "place the new module in LAYERS"


def test_imports_point_down_the_layers():
    layer = {m: i for i, names in enumerate(LAYERS) for m in names}
    wrong = []
    for module, imports in _graph().items():
        for imported in imports:
            if imported == "diffeqformer":
                continue
            if module == "diffeqformer":
                if layer[imported] > PACKAGE_INIT:
                    wrong.append(f"diffeqformer/__init__.py imports {imported}")
            elif layer[imported] > layer[module] or (
                    layer[imported] == layer[module] and (module, imported) not in WITHIN_LAYER):
                wrong.append(f"{module} (layer {layer[module]}) imports {imported} (layer {layer[imported]})")
    assert wrong == []


def test_configs_and_runs_sit_below_the_trainers():
    """Issue 40's layering: ``config`` (the typed configurations) below ``runs`` (the run directory and its
    lifecycle), both below every trainer; no trainer is imported by them, and whatever reads a finished run (analyses,
    notebooks' report layer, the workflow's pages) does so through ``runs`` without importing a trainer for it."""
    layer = {m: i for i, names in enumerate(LAYERS) for m in names}
    assert layer["config"] < layer["runs"] < min(layer["train"], layer["finetune"], layer["population"])
    graph = _graph()
    assert graph["config"].isdisjoint({"runs", "train", "finetune", "population"})
    assert graph["runs"].isdisjoint({"train", "finetune", "population"})
    readers = [m for m in graph if m.startswith(("report", "analysis.spectra", "analysis.perplexity",
                                                  "analysis.downstream", "workflow.pages", "workflow.edition"))]
    assert readers and all(graph[m].isdisjoint({"finetune", "population"}) for m in readers)


def test_no_import_cycle():
    graph = _graph()
    state: dict[str, int] = {}
    cycles = []

    def visit(m, path):
        state[m] = 1
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                cycles.append(path[path.index(n):] + [n])
            elif n not in state:
                visit(n, path + [n])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert cycles == []


def test_no_private_name_of_another_module():
    modules = module_files()
    used = []
    for name, f in modules.items():
        tree = ast.parse(f.read_text())
        aliases = {}  # local name -> one of our modules
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                found = imported_modules(ast.Module([node], []), modules, name, f.name == "__init__.py")
                if not found:
                    continue  # not one of ours
                source = None
                for a in node.names:
                    module = next((m for m in found if m.endswith("." + a.name)), None)
                    if module is not None:
                        aliases[a.asname or a.name] = module
                    elif a.name.startswith("_") and not a.name.startswith("__"):
                        source = source or max(found - set(aliases.values()), key=len)
                        used.append(f"{_short(name)}: from {_short(source)} import {a.name}")
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                    and node.attr.startswith("_") and not node.attr.startswith("__")):
                used.append(f"{_short(name)}: {node.value.id}.{node.attr}")
    assert sorted(set(used)) == []


def test_the_api_page_follows_the_data_path():
    from diffeqformer.workflow.pages import api_markdown

    sections = [line.removeprefix("## `diffeqformer.").removesuffix("`") for line in api_markdown().splitlines()
                if line.startswith("## ")]
    packages = {_short(name) for name, f in module_files().items() if f.name == "__init__.py"}
    layer = {m: i for i, names in enumerate(LAYERS) for m in names}
    modules = [s for s in sections if s not in packages]
    assert [layer[m] for m in modules] == sorted(layer[m] for m in modules)
    for package in packages - {"diffeqformer"}:  # a subpackage's own section comes before its modules'
        assert sections.index(package) < min(sections.index(m) for m in modules if m.startswith(package + "."))
