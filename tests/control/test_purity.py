"""The control plane's pure core stays pure, and its package has no import cycle.

`decide` (the rules), `transitions` (how events change the state) and the builders they use
(`timelines`, `measured`, `model_rules`) are pure functions over pydantic models: importing
them must not load the I/O shell (HTTP clients, the agent client, the registrar, the
workers). And no module of `orchestrator/control/` may import, directly or through others,
a module that imports it back — counting imports inside functions and those made only for
type checking, which hide a cycle without removing it.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONTROL = ROOT / "orchestrator" / "control"
PURE = ["orchestrator.control.decide", "orchestrator.control.transitions", "orchestrator.control.timelines",
        "orchestrator.control.measured", "orchestrator.control.model_rules", "orchestrator.control.state",
        "orchestrator.control.events", "orchestrator.control.commands", "orchestrator.control.lease",
        "orchestrator.control.process_ends", "orchestrator.control.audit", "orchestrator.control.timing_events"]
IO = ["requests", "urllib3", "orchestrator.agent.client", "orchestrator.registrar", "orchestrator.control.launcher",
      "orchestrator.control.recovery", "orchestrator.control.effects", "orchestrator.control.core",
      "orchestrator.control.stage_copy", "orchestrator.control.perf", "orchestrator.control.watcher"]


def test_importing_the_pure_core_loads_no_io_module() -> None:
    code = f"import sys\nfor m in {PURE!r}:\n    __import__(m)\nprint('\\n'.join(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    loaded = set(done.stdout.split())
    assert not [m for m in IO if m in loaded], "the pure core loaded I/O modules"


def _imports(path: Path) -> set[str]:
    """Sibling modules `path` imports anywhere: top level, inside functions, under TYPE_CHECKING."""
    siblings = {p.stem for p in CONTROL.glob("*.py")}
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            names = [node.module.split(".")[0]] if node.module else [a.name for a in node.names]
            found |= {n for n in names if n in siblings}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("orchestrator.control."):
            found.add(node.module.split(".")[2])
    return found - {path.stem, "__init__"}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of `graph`, as a path that ends where it starts, or None."""
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


def test_the_control_package_has_no_import_cycle() -> None:
    graph = {p.stem: _imports(p) for p in CONTROL.glob("*.py") if p.stem != "__init__"}
    assert _cycle(graph) is None, f"import cycle in orchestrator/control: {' -> '.join(_cycle(graph) or [])}"


@pytest.mark.parametrize("graph, cyclic", [({"a": {"b"}, "b": {"a"}}, True), ({"a": {"b"}, "b": set()}, False),
                                           ({"a": {"b"}, "b": {"c"}, "c": {"a"}}, True)])
def test_the_cycle_finder_finds_cycles(graph: dict[str, set[str]], cyclic: bool) -> None:
    assert (_cycle(graph) is not None) == cyclic
