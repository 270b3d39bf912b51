"""The documentation says what the code does (in the spirit of Datasette's documentation tests).

The README is the front door: short, every command in it, every link resolving. The
reference pages are checked against the registries they describe: the family table against
`families/support.py`, the environment variables against `orchestrator/settings.py`, the
cluster TOML example against the engine's own parser, the Python samples against the code.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import re
from pathlib import Path

import pytest

from orchestrator import settings
from orchestrator.cli import COMMANDS
from orchestrator.engine.config import load_config
from orchestrator.families.support import ALIASES, FAMILIES

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
README_MAX_LINES = 250
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text())
    return {_slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, re.M)}


def _links(path: Path) -> list[str]:
    return [m.group(1) for m in LINK.finditer(FENCE.sub("", path.read_text()))]


def test_the_readme_is_a_front_door() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; measurements belong in docs/"
    front = ("## Two commands", "## A first cluster in the dashboard", "## The API", "## Where to look for what")
    assert all(heading in lines for heading in front)


MONTH = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)[a-z]*\.?"
DATE = re.compile(rf"\b(?:19|20)\d\d-\d\d(?:-\d\d)?\b|\b\d{{1,2}} {MONTH} (?:19|20)\d\d\b"
                  rf"|\b{MONTH} \d{{1,2}}, (?:19|20)\d\d\b")
DIARY = re.compile(r"\b(?:last run|earlier runs?|latest run|final code|that day|yesterday|today|this morning|"
                   r"tonight|best rounds?|two runs of|four runs)\b", re.I)


def test_the_readme_holds_no_dates_nor_run_diaries() -> None:
    """The front door shows current facts: dated runs and their story live in docs/benchmark-history.md."""
    text = FENCE.sub("", README.read_text())
    assert not DATE.findall(text), f"README.md has dates: {DATE.findall(text)}"
    assert not DIARY.findall(text), f"README.md tells runs' history: {DIARY.findall(text)}"


def test_the_readme_performance_section_is_one_short_table() -> None:
    section = README.read_text().split("\n## Performance\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    assert 6 <= len(rows) - 2 <= 10, f"{len(rows) - 2} rows: the targets and the latest ratios, 6-10 of them"
    assert "### " not in section, "one table: the method and the runs belong in docs/benchmark.md"
    assert "docs/benchmark.md" in section and "benchmark-history" not in section


def test_every_cli_sub_command_is_in_the_readme() -> None:
    text = README.read_text()
    missing = [name for name in COMMANDS if f"`pipeserve {name}" not in text]
    assert not missing, f"README.md's command table lacks {missing}"


@pytest.mark.parametrize("page", [README, *DOCS], ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in _links(page):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        path = (page.parent / file_part).resolve() if file_part else page
        if not path.exists():
            broken.append(target)
        elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
            broken.append(target)
    assert not broken, f"{page.name}: links that lead nowhere: {broken}"


def _family_table() -> set[str]:
    """The `model_type`s named in the first column of docs/families.md's family table."""
    names: set[str] = set()
    text = (ROOT / "docs" / "families.md").read_text()
    table = text.split("| family (`model_type`)", 1)[1].split("\n\n", 1)[0]
    for row in table.splitlines()[2:]:
        names |= set(re.findall(r"`([A-Za-z0-9_.]+)`", row.split("|")[1]))
    return names


def test_the_family_table_equals_the_support_registry() -> None:
    documented, registered = _family_table(), set(FAMILIES) | set(ALIASES)
    assert documented == registered, (f"in docs/families.md only: {sorted(documented - registered)}; "
                                      f"in families/support.py only: {sorted(registered - documented)}")


def test_the_readme_counts_the_families() -> None:
    assert f"({len(FAMILIES)}, plus {len(ALIASES)} aliases)" in README.read_text()


def test_every_setting_is_documented_and_nothing_else() -> None:
    text = (ROOT / "docs" / "configuration.md").read_text()
    rows = set(re.findall(r"^\| `([A-Z_]+)` \|", text, re.M))
    assert rows == {s.name for s in settings.ALL}


def test_the_cluster_toml_example_is_valid(tmp_path: Path) -> None:
    text = (ROOT / "docs" / "configuration.md").read_text()
    examples = [body for lang, body in FENCE.findall(text) if lang == "toml"]
    assert examples
    for body in examples:
        path = tmp_path / "cluster.toml"
        path.write_text(body)
        config = load_config(path)
        assert config.num_layers > 0


def _python_samples() -> list:
    samples = [(page.name, body) for page in [README, *DOCS] for lang, body in FENCE.findall(page.read_text())
               if lang == "python"]
    return [pytest.param(where, body, id=f"{where}-{k}") for k, (where, body) in enumerate(samples)]


@pytest.mark.parametrize("where, sample", _python_samples())
def test_every_python_sample_imports_what_it_uses(where: str, sample: str) -> None:
    """Each name a sample uses is imported or assigned in it (placeholders excepted), and each import works."""
    tree = ast.parse(sample)
    defined = set(dir(builtins)) | {"state_dir"}  # state_dir: the reader's own directory
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            module = importlib.import_module(node.module if isinstance(node, ast.ImportFrom) else node.names[0].name)
            for alias in node.names:
                if isinstance(node, ast.ImportFrom):
                    assert hasattr(module, alias.name), f"{where}: {node.module} has no {alias.name}"
                defined.add((alias.asname or alias.name).split(".")[0])
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            defined.add(node.id)
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    assert not used - defined, f"{where}: a sample uses {sorted(used - defined)} without importing it"
