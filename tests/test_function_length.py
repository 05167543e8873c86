"""Functions read in one screen: every function of the package is under ``LIMIT`` lines, without exception."""

from __future__ import annotations

import ast

from diffeqformer.workflow import plan as sources

LIMIT = 60
"""A function has fewer lines than this, from its ``def`` line to its last line (decorators not counted)."""


def _lengths(module: str, tree: ast.AST) -> dict[str, int]:
    """Qualified name (``module.Class.method``, ``module.function.inner``) -> lines, of every function in ``tree``."""
    out = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}.{child.name}"
                if not isinstance(child, ast.ClassDef):
                    out[name] = child.end_lineno - child.lineno + 1
                visit(child, name)
            else:
                visit(child, prefix)

    visit(tree, module)
    return out


def _package_lengths() -> dict[str, int]:
    return {name: n for module, f in sources.module_files().items()
            for name, n in _lengths(module, ast.parse(f.read_text())).items()}


def test_no_function_is_longer_than_the_limit():
    long = {name: n for name, n in _package_lengths().items() if n >= LIMIT}
    assert long == {}, f"split these functions into ones under {LIMIT} lines"


def test_lengths_count_methods_and_nested_functions():
    tree = ast.parse("class A:\n    def f(self):\n        def g():\n            pass\n\n        return g\n")
    assert _lengths("m", tree) == {"m.A.f": 5, "m.A.f.g": 2}
