"""The control plane's seam is its folders: `control/rules/` is the pure core, `control/` the shell.

Every module under `orchestrator/control/rules/` — the state, event values, commands, `decide`,
`transitions`, the builders they use — is pure: it imports no module that does I/O (sockets, HTTP,
processes, threads) nor anything of the shell, and importing all of them in a fresh interpreter
loads no HTTP client, agent client, registrar or shell module. The rule is the folder, not a list:
a new module is under it by where it lives. No module of `orchestrator/control/` imports a module
inside a function (a hidden dependency, usually dodging a cycle), and none imports, directly or
through others, a module that imports it back — counting those made only for type checking.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.import_graph import cycle, function_level_imports

ROOT = Path(__file__).resolve().parents[2]
CONTROL = ROOT / "orchestrator" / "control"
RULES = CONTROL / "rules"
# What a rules module may not import itself (top-level names): the standard library's I/O and
# concurrency, HTTP clients, the web framework, discovery.
IO_IMPORTS = {"socket", "ssl", "selectors", "asyncio", "subprocess", "threading", "queue", "concurrent", "http",
              "urllib3", "requests", "shutil", "tempfile", "zeroconf", "flask", "webapp"}
IO_DOTTED = {"urllib.request", "orchestrator.agent.client", "orchestrator.agent.discovery", "orchestrator.registrar",
             "orchestrator.proc"}
# What importing every rules module may not load, even through others.
IO_LOADED = ["requests", "urllib3", "http.client", "urllib.request", "subprocess", "zeroconf", "flask",
             "orchestrator.agent.client", "orchestrator.registrar", "orchestrator.proc"]
# Function-level imports allowed in control/, each with its reason (none now).
ALLOWED_FUNCTION_IMPORTS: dict[str, str] = {}


def _module(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def _rules_modules() -> list[Path]:
    return sorted(RULES.glob("*.py"))


def _imported(path: Path, module: str | None = None) -> set[str]:
    """Every module `path` (module `module`, by default its own) names in an import, anywhere in it
    (absolute names)."""
    package = (module or _module(path)).rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's package, one level up per dot past the first
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            found.add(base)
            found |= {f"{base}.{a.name}" for a in node.names}  # `from pkg import module`
    return found


def _shell(name: str) -> bool:
    return name.startswith("orchestrator.control.") and not name.startswith("orchestrator.control.rules")


def io_of(path: Path, module: str | None = None) -> list[str]:
    """What a rules module imports that does I/O or belongs to the shell."""
    bad = []
    for name in sorted(_imported(path, module)):
        top = name.split(".")[0]
        if top in IO_IMPORTS or any(name == d or name.startswith(d + ".") for d in IO_DOTTED) or _shell(name):
            bad.append(name)
    return bad


def test_the_rules_folder_holds_the_pure_core() -> None:
    names = {p.stem for p in _rules_modules()}
    assert {"state", "events", "commands", "decide", "transitions", "timelines"} <= names
    assert not {"core", "effects", "watcher", "recovery", "launcher", "bus", "store"} & names


@pytest.mark.parametrize("path", _rules_modules(), ids=lambda p: p.stem)
def test_a_rules_module_imports_nothing_that_does_io_nor_the_shell(path: Path) -> None:
    assert io_of(path) == [], f"{path.name} imports I/O or the shell"


def test_importing_every_rules_module_loads_no_io_module() -> None:
    modules = [_module(p) for p in _rules_modules()]
    code = f"import sys\nfor m in {modules!r}:\n    __import__(m)\nprint('\\n'.join(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    loaded = set(done.stdout.split())
    assert not [m for m in IO_LOADED if m in loaded], "the rules loaded I/O modules"
    assert not [m for m in loaded if _shell(m)], "the rules loaded modules of the shell"


@pytest.mark.parametrize("added", ["import socket", "import requests", "from orchestrator.control import store",
                                   "from orchestrator.control.coordinator_client import CoordinatorClient",
                                   "from .. import effects", "from orchestrator.agent.client import AgentClient",
                                   "    import threading"])
def test_the_rule_bites_when_a_rules_module_gains_an_io_import(tmp_path: Path, added: str) -> None:
    """A rules module with one I/O or shell import more, at its head or inside a function, fails."""
    assert io_of(RULES / "timelines.py") == []
    body = f"def late():\n{added}\n" if added.startswith(" ") else added + "\n"
    probe = tmp_path / "timelines.py"
    probe.write_text((RULES / "timelines.py").read_text() + "\n" + body)
    assert io_of(probe, "orchestrator.control.rules.timelines") != []


def test_no_module_of_control_imports_inside_a_function() -> None:
    found = [i for p in sorted(CONTROL.rglob("*.py")) for i in function_level_imports(p)
             if i.split(":", 1)[0] not in ALLOWED_FUNCTION_IMPORTS]
    assert found == [], "function-level imports in orchestrator/control (move them to the module's head)"


def test_the_function_level_import_finder_finds_them(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("import os\n\ndef f():\n    from json import dumps\n    return dumps\n\n"
                     "class C:\n    def m(self):\n        import re\n")
    assert [i.split(": ", 1)[1] for i in function_level_imports(probe)] == ["from json import dumps", "import re"]


def _control_imports(path: Path) -> set[str]:
    """Modules of orchestrator/control/ that `path` imports anywhere: top level, inside functions,
    under TYPE_CHECKING."""
    own = {_module(p) for p in CONTROL.rglob("*.py")}
    return {name for name in _imported(path) if name in own} - {_module(path), "orchestrator.control",
                                                                "orchestrator.control.rules"}


def test_the_control_package_has_no_import_cycle() -> None:
    graph = {_module(p): _control_imports(p) for p in CONTROL.rglob("*.py") if p.stem != "__init__"}
    assert cycle(graph) is None, f"import cycle in orchestrator/control: {' -> '.join(cycle(graph) or [])}"


@pytest.mark.parametrize("graph, cyclic", [({"a": {"b"}, "b": {"a"}}, True), ({"a": {"b"}, "b": set()}, False),
                                           ({"a": {"b"}, "b": {"c"}, "c": {"a"}}, True)])
def test_the_cycle_finder_finds_cycles(graph: dict[str, set[str]], cyclic: bool) -> None:
    assert (cycle(graph) is not None) == cyclic
