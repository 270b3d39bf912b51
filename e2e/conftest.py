"""Browser-test fixtures: the `make demo` stack (three node agents, the router, the dashboard;
the agents start stages and coordinators) on free ports of 127.0.0.1, and Debian's Chromium
driven by Playwright.

One stack and one browser serve a whole module: its tests are the ordered steps of one
walk through the `make demo` flow (README "Two commands"), and a failed step skips the steps after it (`incremental`).
Screenshots go to artifacts/e2e/ (a failed step leaves FAILED-<test>.png there too).
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
from playwright.sync_api import Browser, BrowserContext, Page, expect

from e2e.pages import ACTION_MS
from orchestrator import settings
from orchestrator.agent.client import AgentClient
from orchestrator.agent.local_agent import LocalAgent
from orchestrator.demo_stack import Demo, DemoError
from orchestrator.proc import free_port, free_port_block, marked_processes

# One layer timing each on this busy machine, as in tests/conftest.py (PIPESERVE_TIMING_TRIES).
os.environ.setdefault("PIPESERVE_TIMING_TRIES", "1")

CHROMIUM = settings.CHROMIUM.read()
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
VIEWPORT = {"width": 1280, "height": 800}  # laptop width
ARTIFACTS = Path(__file__).resolve().parent.parent / "artifacts" / "e2e"


# --- ordered steps -------------------------------------------------------------------------

def pytest_configure(config: pytest.Config) -> None:
    # The screenshots of an earlier run go once, in the main process (not in each xdist worker,
    # which would delete another worker's shots).
    if not hasattr(config, "workerinput") and ARTIFACTS.exists():
        shutil.rmtree(ARTIFACTS)
    # An expectation without its own timeout waits as long as an action does: Playwright's 5 s
    # default was short for an answer on a loaded machine (another suite beside this one).
    expect.set_options(timeout=ACTION_MS)
    config.addinivalue_line("markers", "incremental(package=False): ordered steps; after a failed step the rest "
                                       "of the module (with package=True: of the package's walk) is skipped")


def _walk(item: pytest.Item) -> tuple[pytest.Session | pytest.Collector, str]:
    """Where a failed step is remembered, and under which key: the module, or the session
    keyed by the package when one walk is split over the package's files."""
    marker = item.get_closest_marker("incremental")
    if marker is not None and marker.kwargs.get("package"):
        return item.session, str(item.path.parent)
    return item.parent, ""


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" and report.failed and "incremental" in item.keywords:
        holder, key = _walk(item)
        holder.__dict__.setdefault("_failed_steps", {})[key] = item.name
        for name in ("admin", "viewer"):
            browser_user = item.funcargs.get(name) if hasattr(item, "funcargs") else None
            if browser_user is not None:
                for i, page in enumerate(browser_user.context.pages):
                    try:
                        page.screenshot(path=ARTIFACTS / f"FAILED-{item.name}-{name}{i}.png", full_page=True)
                    except Exception:  # noqa: BLE001 (a screenshot must not hide the failure)
                        pass


def pytest_runtest_setup(item: pytest.Item) -> None:
    if "incremental" in item.keywords:
        holder, key = _walk(item)
        failed = holder.__dict__.get("_failed_steps", {}).get(key)
        if failed:
            pytest.skip(f"an earlier step failed: {failed}")


# --- processes -----------------------------------------------------------------------------

@pytest.fixture(scope="session")
def demo_model() -> Path:
    """SmolLM2-135M-Instruct (float32), imported once into the pipeserve cache."""
    from orchestrator.models.demo import cached_demo_model

    return cached_demo_model("float32")


@dataclass
class Stack:
    """The running demo plus what tests need to look behind the dashboard's back."""

    demo: Demo
    clients: dict[str, AgentClient]  # node name -> a client paired with that agent

    @property
    def url(self) -> str:
        return self.demo.dashboard_url

    @property
    def transport(self) -> tuple[int, int]:
        return self.demo.nodes[0].transport[0], self.demo.nodes[-1].transport[1]

    def node(self, name: str) -> LocalAgent:
        """The demo's node agent called `name`."""
        return next(n for n in self.demo.nodes if n.name == name)

    def nodes(self, *names: str) -> list[LocalAgent]:
        """The demo's node agents called `names`, in that order."""
        return [self.node(name) for name in names]

    def api_state(self) -> dict:
        """GET /api/state with the admin token."""
        r = requests.get(self.url + "/api/state", headers={"Authorization": f"Bearer {self.demo.admin_token}"},
                         timeout=5)
        r.raise_for_status()
        return r.json()

    def router_models(self) -> list[str]:
        r = requests.get(self.demo.router_url + "/v1/models", timeout=5)
        return [m["id"] for m in r.json().get("data", [])] if r.status_code == 200 else []

    def router_backends(self) -> list[str]:
        import yaml

        doc = yaml.safe_load(self.demo.router_yaml.read_text()) or {}
        return [b["name"] for b in doc.get("backends") or []]

    def engine_processes(self) -> list[str]:
        """Live stage/coordinator processes: as the agents report them, and as /proc shows them."""
        reported = [f"{name}:{p.cluster_id}/{p.node_id} pid {p.pid}" for name, c in self.clients.items()
                    for p in c.processes() if p.alive]
        seen = []
        for pid in marked_processes(self.demo.marker):
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"stage" in argv or b"coordinator" in argv:
                seen.append(f"pid {pid}: {b' '.join(argv[2:5]).decode(errors='replace')}")
        return reported + seen

    def logs(self, tail: int = 30) -> str:
        parts = []
        for log in sorted((self.demo.root / "logs").glob("*.log")):
            lines = log.read_text(errors="replace").splitlines()[-tail:]
            parts.append(f"----- {log.name} -----\n" + "\n".join(lines))
        return "\n".join(parts)


@contextmanager
def running_stack(demo_model: Path, root: Path, **demo_kw) -> Iterator[Stack]:
    """Three agents (the model on node-a only; 1100M of memory each), the router and the
    dashboard, on free ports; their transport ranges share one block of 30 ports. Fails the
    test when it does not start; on the way out, fails it when a process outlived its agent.
    `demo_kw`: more fields of the `Demo` (e.g. `dashboard_args`)."""
    transport = free_port_block(30)
    taken = set(range(transport[0], transport[1] + 1))

    def port() -> int:
        while (p := free_port()) in taken:
            pass
        taken.add(p)
        return p

    demo = Demo.on_ports(root, dashboard_port=port(), router_port=port(), agent_ports=[port(), port(), port()],
                         transport=transport, upload_limit="150M", discovery=True, preset_settings=False, **demo_kw)
    try:
        demo.start(demo_model)
    except DemoError as exc:
        pytest.fail(f"the e2e stack did not start: {exc}", pytrace=False)
    clients = {}
    for n in demo.nodes:
        clients[n.name] = AgentClient(n.url, timeout=10)
        clients[n.name].pair(n.token, "e2e tests")
    s = Stack(demo, clients)
    try:
        yield s
    finally:
        for c in clients.values():
            c.close()
        leftovers = demo.stop()
        print(s.logs())  # pytest shows it when something failed
    assert not leftovers, f"processes outlived their agents: {leftovers}"


# --- browser -------------------------------------------------------------------------------

@contextmanager
def chromium() -> Iterator[Browser]:
    """Debian's Chromium under Playwright (`playwright install` is not needed); skips the test
    where it is not installed."""
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM}: install Debian's chromium (`make system` as root)")
    from playwright.sync_api import sync_playwright

    pw = sync_playwright().start()
    try:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
    except Exception:
        pw.stop()
        raise
    try:
        yield b
    finally:
        b.close()
        pw.stop()


@dataclass
class BrowserUser:
    """A browser context (its own cookies: one person) and its first page."""

    context: BrowserContext
    page: Page


@contextmanager
def browser_user(browser: Browser) -> Iterator[BrowserUser]:
    """One person at a laptop-sized window, until the block ends."""
    context = browser.new_context(viewport=VIEWPORT)
    context.set_default_timeout(ACTION_MS)
    # a person who confirms what they asked for: Stop, Cancel and Delete ask first (hx-confirm)
    context.on("page", lambda page: page.on("dialog", lambda dialog: dialog.accept()))
    try:
        yield BrowserUser(context, context.new_page())
    finally:
        context.close()


# --- one walk's fixtures ---------------------------------------------------------------------

def walk_fixtures(scope: str) -> tuple[Callable[..., Iterator[object]], ...]:
    """The fixtures one walk uses — `stack`, `browser`, `admin` and `viewer` (two people) —
    living for `scope`: "module" (each module walks on its own), or "package" (one walk split
    over a package's files, e2e/dashboard/). Assign them to those names in a conftest."""

    @pytest.fixture(scope=scope, name="stack")
    def stack(demo_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
        with running_stack(demo_model, tmp_path_factory.mktemp("e2e-stack")) as s:
            yield s

    @pytest.fixture(scope=scope, name="browser")
    def browser() -> Iterator[Browser]:
        with chromium() as b:
            yield b

    @pytest.fixture(scope=scope, name="admin")
    def admin(browser: Browser) -> Iterator[BrowserUser]:
        with browser_user(browser) as u:
            yield u

    @pytest.fixture(scope=scope, name="viewer")
    def viewer(browser: Browser) -> Iterator[BrowserUser]:
        with browser_user(browser) as u:
            yield u

    return stack, browser, admin, viewer


stack, browser, admin, viewer = walk_fixtures("module")


@pytest.fixture(scope="session")
def shots() -> "Shots":
    """Screenshots of each step, under artifacts/e2e/ (emptied at the start of a run)."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)  # emptied once per run, by pytest_configure
    return Shots(ARTIFACTS)


class Shots:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.taken: list[Path] = []

    def __call__(self, page, name: str) -> Path:
        path = self.root / f"{re.sub(r'[^A-Za-z0-9_.-]', '-', name)}.png"
        page.evaluate("window.scrollTo(0, 0)")  # else a sticky header lands mid-page in a full-page shot
        page.screenshot(path=path, full_page=True)
        self.taken.append(path)
        return path
