"""The family facts stay at the bottom of the import graph, and no two packages import each other (issue 42 item 3).

Model-family facts once lived in five modules under two packages that imported each other
(engine/support.py read models/decoder_config.py while models/describe.py read engine/support.py),
and the agent and the planner had a smaller loop through the busy-machine rule. Now:

- `orchestrator/families/` imports no other module of the project: every package may read a
  family's rules there, so the family facts can never close a loop between two of them;
- no top-level package of `orchestrator/` (nor `webapp/`) imports, directly or through others, one
  that imports it back; nor does a module of families/, models/ or planner/ inside its package
  (engine/ and control/ have their own such tests).

Read from the source alone (AST, no import), counting imports inside functions and those made only
for type checking, which hide a loop without removing it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.import_graph import cycle

ROOT = Path(__file__).resolve().parents[2]
TOPS = ("orchestrator", "webapp")  # the project's own top-level packages
FAMILIES = "orchestrator.families"


def _modules(root: Path) -> Iterator[tuple[str, Path]]:
    """(dotted name, path) of every module of the project's packages under `root`."""
    for top in TOPS:
        for path in sorted((root / top).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            yield ".".join(parts[:-1] if parts[-1] == "__init__" else parts), path


def _imports(module: str, path: Path) -> Iterator[tuple[int, str]]:
    """(line, dotted name) of every project module or name `path` imports, relative imports resolved
    (`from a.b import c` gives a.b.c: the module c, or the name c in a.b)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            names = [f"{base}.{a.name}" if base else a.name for a in node.names]  # a module, or a name in one
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        yield from ((node.lineno, n) for n in names if n.split(".")[0] in TOPS)


def package_of(name: str) -> str:
    """The top-level package (or module) a dotted name belongs to: `engine` for
    orchestrator.engine.stage.shard, `settings` for orchestrator.settings, `webapp` for webapp.*."""
    parts = name.split(".")
    return parts[1] if parts[0] == "orchestrator" and len(parts) > 1 else parts[0]


def foreign_imports(root: Path) -> list[str]:
    """`file:line name` of each import by the families package of a module outside it."""
    return [f"{path.relative_to(root)}:{line} {name}" for module, path in _modules(root)
            if module == FAMILIES or module.startswith(FAMILIES + ".")
            for line, name in _imports(module, path)
            if name != FAMILIES and not name.startswith(FAMILIES + ".")]


def package_graph(root: Path) -> tuple[dict[str, set[str]], dict[tuple[str, str], str]]:
    """Which top-level package imports which, and one `file:line name` import for each such edge."""
    graph: dict[str, set[str]] = {}
    witness: dict[tuple[str, str], str] = {}
    for module, path in _modules(root):
        source = package_of(module)
        graph.setdefault(source, set())
        for line, name in _imports(module, path):
            target = package_of(name)
            if target not in (source, "orchestrator"):  # orchestrator/__init__ holds nothing to import
                graph[source].add(target)
                witness.setdefault((source, target), f"{path.relative_to(root)}:{line} {name}")
    return graph, witness


def package_cycle(root: Path) -> str | None:
    """One loop between top-level packages, each step with an import that makes it; None when none."""
    graph, witness = package_graph(root)
    found = cycle(graph)
    if found is None:
        return None
    return "; ".join(f"{a} -> {b} ({witness[a, b]})" for a, b in zip(found, found[1:], strict=False))


def module_graph(root: Path, package: str) -> dict[str, set[str]]:
    """Which module of one top-level package imports which other module of it (a package's own
    `__init__` is not an import of its own modules)."""
    modules = {m: p for m, p in _modules(root) if package_of(m) == package}

    def target(name: str) -> str | None:  # the module an import of `name` loads: the longest known prefix
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    return {m: {t for _, n in _imports(m, p) if (t := target(n)) and t != m and not m.startswith(t + ".")}
            for m, p in modules.items()}


def test_the_families_package_imports_no_other_package_of_the_project() -> None:
    assert foreign_imports(ROOT) == []


def test_no_two_top_level_packages_import_each_other() -> None:
    assert package_cycle(ROOT) is None


@pytest.mark.parametrize("package", ["families", "models", "planner"])  # engine's and control's: their own tests
def test_no_module_of_a_package_imports_one_that_imports_it_back(package: str) -> None:
    assert cycle(module_graph(ROOT, package)) is None


def test_engine_models_planner_and_agent_read_the_family_facts() -> None:
    # the scan must see real imports, or the two tests above could not fail
    graph, _ = package_graph(ROOT)
    assert {"engine", "models", "planner", "agent"} <= {p for p, targets in graph.items() if "families" in targets}
    assert "families" in graph and graph["families"] == set()


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


@pytest.mark.parametrize("source", [
    "from orchestrator.engine.wire import named_directory_bytes\n",
    "def late():\n    from orchestrator.models import kv\n",  # inside a function
    "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import orchestrator.agent.schemas\n",
    "from .. import settings\n",  # relative, to a top-level module
    "from webapp import views\n",
])
def test_a_families_import_of_another_package_is_found(tmp_path: Path, source: str) -> None:
    root = _write(tmp_path, {"orchestrator/__init__.py": "", "orchestrator/families/__init__.py": "",
                             "orchestrator/families/support.py": "from .names import FAMILIES\n" + source,
                             "orchestrator/families/names.py": "FAMILIES = {}\n"})
    assert [hit.split(" ", 1)[0] for hit in foreign_imports(root)] == ["orchestrator/families/support.py:" +
                                                                      str(source.count("\n") + 1)]


@pytest.mark.parametrize("back, loop", [
    ("", None),
    ("def late():\n    from orchestrator.engine import wire\n", "models -> engine"),  # inside a function
    ("from ..planner import memory\n", "models -> planner"),  # through a third package
])
def test_a_loop_between_packages_is_found(tmp_path: Path, back: str, loop: str | None) -> None:
    root = _write(tmp_path, {"orchestrator/__init__.py": "", "orchestrator/engine/__init__.py": "",
                             "orchestrator/engine/wire.py": "from orchestrator.models.describe import x\n",
                             "orchestrator/planner/__init__.py": "from orchestrator.engine import wire\n",
                             "orchestrator/models/__init__.py": "",
                             "orchestrator/models/describe.py": "x = 1\n" + back})
    found = package_cycle(root)
    assert (found is None) if loop is None else (found is not None and loop in found), found


def test_a_loop_between_modules_of_a_package_is_found(tmp_path: Path) -> None:
    root = _write(tmp_path, {"orchestrator/__init__.py": "", "orchestrator/families/__init__.py": "",
                             "orchestrator/families/support.py": "from orchestrator.families.names import FAMILIES\n",
                             "orchestrator/families/names.py": "def late():\n    from . import support\n"})
    assert cycle(module_graph(root, "families")) is not None
    (root / "orchestrator/families/names.py").write_text("FAMILIES = {}\n")
    assert cycle(module_graph(root, "families")) is None
