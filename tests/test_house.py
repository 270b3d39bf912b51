"""The test house stays in order (issue 42 item 4), read from the source alone (AST, no import):

- the builders of nodes, reports and sessions are written once, in tests/support/builders.py;
- every test helper module lives in tests/support/ (beside the tests only test_*.py, conftest.py
  and __init__.py);
- no test asserts that an elapsed time stays below a constant: a ceiling on a measured duration
  fails on a loaded machine and passes on a broken one; tests assert what happened instead.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUILDERS = {"node", "report", "session"}
HOME = Path("tests/support/builders.py")
# Readings of the real clocks: time.monotonic(), time.perf_counter(), ... (a FakeClock's are not measured)
CLOCK_READINGS = {"monotonic", "monotonic_ns", "time", "time_ns", "perf_counter", "perf_counter_ns", "process_time",
                  "process_time_ns"}
BELOW = (ast.Lt, ast.LtE)
ABOVE = (ast.Gt, ast.GtE)


def python_files(root: Path, *folders: str) -> Iterator[Path]:
    """Every Python file under these folders of `root`, as a path relative to it."""
    for folder in folders:
        for path in sorted((root / folder).rglob("*.py")):
            if ".venv" not in path.parts and "__pycache__" not in path.parts:
                yield path.relative_to(root)


def is_test_module(path: Path) -> bool:
    """A module pytest collects or configures from (not a helper)."""
    return path.name.startswith("test_") or path.name in ("conftest.py", "__init__.py")


@cache
def parsed(path: Path) -> ast.Module:
    """The syntax tree of one file (each file is read once per run)."""
    return ast.parse(path.read_text(), str(path))


def code_modules(root: Path) -> Iterator[Path]:
    """The modules whose code is test code: everything under tests/, and e2e's tests and conftests
    (e2e's benchmarks and stacks are programs, not tests)."""
    for path in python_files(root, "tests", "e2e"):
        if path.parts[0] == "tests" or is_test_module(path):
            yield path


def builders_defined(root: Path) -> list[str]:
    """`file:line name` of each function (not a method) named like a builder outside builders.py."""
    found = []
    for path in code_modules(root):
        if path == HOME:
            continue
        tree = parsed(root / path)
        methods = {id(f) for c in ast.walk(tree) if isinstance(c, ast.ClassDef) for f in c.body}
        found += [f"{path}:{f.lineno} {f.name}" for f in ast.walk(tree)
                  if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef) and f.name in BUILDERS
                  and id(f) not in methods]
    return sorted(found)


def helpers_outside_support(root: Path) -> list[str]:
    """Modules under tests/ that are neither tests nor conftests and live outside tests/support/."""
    return [str(p) for p in python_files(root, "tests")
            if not is_test_module(p) and p.parent != Path("tests/support")]


def _named(node: ast.AST) -> str | None:
    """`x` for `x`, `sent_at` for `server.sent_at`: what a reading is kept in."""
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None


def _reads_clock(node: ast.AST, timed: set[str]) -> bool:
    """Whether the expression reads the real clock, or something that holds such a reading
    (a count of readings, `len(...)`, is not one)."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "len":
        return False
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in CLOCK_READINGS \
            and isinstance(node.func.value, ast.Name) and node.func.value.id == "time":
        return True
    if _named(node) in timed:
        return True
    return any(_reads_clock(child, timed) for child in ast.iter_child_nodes(node))


def _timed_names(scope: ast.AST) -> set[str]:
    """Names that hold clock readings or their differences in this scope (to a fixed point):
    `t0 = time.monotonic()`, `seen = time.monotonic() - t0`, `self.sent_at.append(time.monotonic())`."""
    timed: set[str] = set()
    while True:
        before = len(timed)
        for n in ast.walk(scope):
            if isinstance(n, ast.Assign | ast.AnnAssign | ast.AugAssign) and n.value is not None \
                    and _reads_clock(n.value, timed):
                targets = n.targets if isinstance(n, ast.Assign) else [n.target]
                timed |= {name for target in targets for t in ast.walk(target) if (name := _named(t))}
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in ("append", "add") \
                    and (name := _named(n.func.value)) and any(_reads_clock(a, timed) for a in n.args):
                timed.add(name)
        if len(timed) == before:
            return timed


def elapsed_ceilings(root: Path) -> list[str]:
    """`file:line` of each assert that a clock-derived value is below (or a constant above) one
    that reads no clock."""
    found = []
    for path in code_modules(root):
        tree = parsed(root / path)
        timed = _timed_names(tree)  # the module as one scope: names are rarely reused for other things
        for a in ast.walk(tree):
            if not isinstance(a, ast.Assert):
                continue
            for cmp in ast.walk(a.test):
                if not isinstance(cmp, ast.Compare):
                    continue
                sides = [cmp.left, *cmp.comparators]
                for op, left, right in zip(cmp.ops, sides, sides[1:]):
                    small, large = (left, right) if isinstance(op, BELOW) else (right, left) \
                        if isinstance(op, ABOVE) else (None, None)
                    if small is not None and _reads_clock(small, timed) and not _reads_clock(large, timed):
                        found.append(f"{path}:{a.lineno}")
    return sorted(set(found))


def test_node_report_and_session_builders_live_in_builders_py_only() -> None:
    assert builders_defined(ROOT) == [], "use (or extend) tests/support/builders.py"


def test_every_helper_module_lives_in_tests_support() -> None:
    assert helpers_outside_support(ROOT) == [], "move it to tests/support/"


def test_no_test_asserts_an_elapsed_time_below_a_constant() -> None:
    assert elapsed_ceilings(ROOT) == [], "assert what happened (a FakeClock, a count, an event), not how long it took"


def test_the_scans_find_what_they_look_for(tmp_path: Path) -> None:
    """Each scan catches its kind of offence in a tree made for it (and not a method, a fixture
    method or a floor on an elapsed time)."""
    (tmp_path / "tests" / "engine").mkdir(parents=True)
    (tmp_path / "e2e").mkdir()
    (tmp_path / "tests" / "engine" / "harness.py").write_text("def helper():\n    pass\n")
    (tmp_path / "tests" / "engine" / "test_x.py").write_text(
        "import time\n\n\n"
        "def node(i):\n    return i\n\n\n"
        "class Env:\n    def session(self):\n        return 1\n\n\n"
        "def test_a(clock):\n"
        "    t0 = time.monotonic()\n"
        "    seen = time.monotonic() - t0\n"
        "    assert seen < 10.0\n"
        "    assert 2.0 > clock.monotonic() - t0\n"
        "    assert seen >= 0.5  # a floor is behaviour (a stream that was not buffered)\n"
        "    assert t0 < time.monotonic()  # an order of two readings, not a ceiling\n"
        "    assert 30 <= clock.monotonic() <= 31  # a fake clock's reading is not measured\n")
    (tmp_path / "e2e" / "test_y.py").write_text("def report():\n    def session():\n        pass\n")
    (tmp_path / "e2e" / "bench.py").write_text("def report():\n    pass\n")  # a program's report, not a builder
    assert builders_defined(tmp_path) == ["e2e/test_y.py:1 report", "e2e/test_y.py:2 session",
                                          "tests/engine/test_x.py:4 node"]
    assert helpers_outside_support(tmp_path) == ["tests/engine/harness.py"]
    assert elapsed_ceilings(tmp_path) == ["tests/engine/test_x.py:16", "tests/engine/test_x.py:17"]
