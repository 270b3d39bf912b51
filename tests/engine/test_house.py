"""The engine's house rules: parts are objects a class holds, not base classes it inherits; no import cycle.

The coordinator's scheduler was once one class spread over five files by inheritance (each mixin
borrowing its siblings' state through `TYPE_CHECKING` declarations, a stub once winning the method
resolution order) and a stage's control frames a mixin of the stage. Now a class under
`orchestrator/engine/` inherits from no class of the project, except where inheritance is the
library's own idiom: pydantic request schemas sharing fields, and the layer stand-ins that must pass
mlx's `nn.Module` checks. No `TYPE_CHECKING` block declares anything but imports. And no module of
`orchestrator/engine/` imports, directly or through others, one that imports it back — counting
imports inside functions and those made only for type checking.
"""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import mlx.nn as nn
import pydantic
import pytest

from tests.support.import_graph import cycle

ROOT = Path(__file__).resolve().parents[2]
ENGINE = ROOT / "orchestrator" / "engine"


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module(p): p for p in sorted(ENGINE.rglob("*.py"))}


def _target(name: str) -> str | None:
    """The engine module an import of `name` loads (the longest known prefix), or None outside engine."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def _imports(module: str, path: Path) -> set[str]:
    found: set[str] = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            names = [f"{base}.{a.name}" for a in node.names] + [base]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        found |= {t for n in names if (t := _target(n)) is not None}
    ancestors = {module.rsplit(".", k)[0] for k in range(1, module.count("."))}
    return found - {module} - ancestors  # a package's own __init__ is not an import of its own


def test_the_engine_has_no_import_cycle() -> None:
    graph = {m: _imports(m, p) for m, p in MODULES.items()}
    assert cycle(graph) is None, f"import cycle in orchestrator/engine: {' -> '.join(cycle(graph) or [])}"


def test_the_import_graph_sees_the_imports_it_is_meant_to_forbid() -> None:
    # the scan must see what it is meant to forbid, or the cycle test above could not fail
    graph = {m: _imports(m, p) for m, p in MODULES.items()}
    assert "orchestrator.engine.coordinator.liveness" in graph["orchestrator.engine.coordinator.pipeline"]
    assert graph["orchestrator.engine.coordinator.liveness"].isdisjoint({"orchestrator.engine.coordinator.pipeline"})


ALLOWED_BASES = (pydantic.BaseModel, nn.Module)  # the libraries' own idioms (see the module docstring)


def _classes():
    for name in MODULES:
        module = importlib.import_module(name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == name:
                yield cls


def test_no_engine_class_inherits_from_a_project_class() -> None:
    offenders = [f"{cls.__module__}.{cls.__qualname__}({base.__qualname__})"
                 for cls in _classes() for base in cls.__bases__
                 if base.__module__.startswith("orchestrator.") and not issubclass(base, ALLOWED_BASES)]
    assert offenders == []


def test_type_checking_blocks_only_import() -> None:
    declared = []
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                declared += [f"{name}:{n.lineno}" for n in node.body if not isinstance(n, ast.Import | ast.ImportFrom)]
    assert declared == []


@pytest.mark.parametrize("graph, cyclic", [({"a": {"b"}, "b": {"a"}}, True), ({"a": {"b"}, "b": set()}, False)])
def test_the_cycle_finder_bites(graph: dict[str, set[str]], cyclic: bool) -> None:
    assert (cycle(graph) is not None) == cyclic
