"""Import graphs of the project's packages, for the house-rule tests (tests/control/test_purity.py,
tests/engine/test_house.py): one import cycle of a graph, and the imports made inside functions."""

from __future__ import annotations

import ast
from pathlib import Path


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of `graph` (module -> the modules it imports), as a path that ends where it
    starts, or None."""
    visiting: list[str] = []
    done: set[str] = set()

    def visit(module: str) -> list[str] | None:
        if module in visiting:
            return visiting[visiting.index(module):] + [module]
        if module in done:
            return None
        visiting.append(module)
        for other in sorted(graph.get(module, ())):
            if (found := visit(other)) is not None:
                return found
        visiting.pop()
        done.add(module)
        return None

    return next((c for m in sorted(graph) if (c := visit(m)) is not None), None)


def function_level_imports(path: Path) -> list[str]:
    """The imports of a module made inside a function body ("file:line: import …"): each one hides
    a dependency from the module's head, usually to dodge an import cycle."""
    found = []
    for fn in ast.walk(ast.parse(path.read_text())):
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            found += [f"{path.name}:{node.lineno}: {ast.unparse(node)}" for node in ast.walk(fn)
                      if isinstance(node, ast.Import | ast.ImportFrom)]
    return found


__all__ = ["cycle", "function_level_imports"]
