"""The tests marked ``slow``, which neither CI nor ``make test`` runs (``make slow`` does): collecting them checks
their module-level imports only; this checks the imports inside them, which a renamed module or helper breaks
unnoticed (``test_model``'s slow test imports ``_train`` from another test file)."""

from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path

TESTS = Path(__file__).parent


def _is_slow(mark: ast.expr) -> bool:
    return isinstance(mark, ast.Attribute) and mark.attr == "slow"


def _slow_tests(tree: ast.Module) -> list[ast.FunctionDef]:
    """The test functions of a module marked slow, by decorator or by the module's ``pytestmark``."""
    whole = any(isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "pytestmark" for t in node.targets)
                and any(_is_slow(m) for m in ast.walk(node.value)) for node in tree.body)
    return [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")
            and (whole or any(_is_slow(d) for d in node.decorator_list))]


def _top_level_names(path: Path) -> set[str]:
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def test_the_imports_inside_slow_tests_resolve():
    checked = 0
    for path in sorted(TESTS.glob("test_*.py")):
        for test in _slow_tests(ast.parse(path.read_text())):
            for node in ast.walk(test):
                where = f"{path.name}::{test.name}"
                if isinstance(node, ast.Import):
                    for alias in node.names:
                        importlib.import_module(alias.name)
                        checked += 1
                elif isinstance(node, ast.ImportFrom) and node.level == 0:
                    names = {a.name for a in node.names}
                    local = TESTS / f"{node.module}.py"
                    if local.exists():  # another test file or helper: read, not imported
                        missing = names - _top_level_names(local)
                    else:
                        module = importlib.import_module(node.module)
                        missing = {n for n in names if not hasattr(module, n)
                                   and importlib.util.find_spec(f"{node.module}.{n}") is None}
                    assert not missing, f"{where} imports {sorted(missing)} from {node.module}, which has none"
                    checked += 1
                elif isinstance(node, ast.ImportFrom):
                    raise AssertionError(f"{where}: a relative import in a test")
    assert checked, "no slow test imports anything inside it: the check above would prove nothing"
