"""Web-layer fixtures: a real Orchestrator on a temporary state dir (no agents), the Flask app
around it, and clients logged in as admin, as viewer, or not at all."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest
from flask import Flask
from flask.testing import FlaskClient

from orchestrator.control.core import Orchestrator
from orchestrator.registrar import ConfigFileRegistrar
from tests.support.dashboard_server import Dashboard, start_dashboard
from tests.support.html import parse
from tests.support.view_states import rich_state
from webapp import create_app
from webapp.auth import AuthStore


@dataclass
class Web:
    """The app, its orchestrator and credentials."""

    app: Flask
    orch: Orchestrator
    auth: AuthStore
    admin_token: str
    viewer_token: str

    def client(self, role: str | None = None) -> FlaskClient:
        """A test client: "admin", "viewer" (each logged in) or None (anonymous)."""
        c = self.app.test_client()
        if role == "admin":
            assert c.post("/login", data={"token": self.admin_token}).status_code == 302
        elif role == "viewer":
            assert c.get(f"/viewer/{self.viewer_token}").status_code == 302
        return c


def csrf_of(client: FlaskClient) -> str:
    """The CSRF token of a logged-in client's session."""
    with client.session_transaction() as s:
        return s["csrf"]


def make_web(tmp_path: Path, orch: Orchestrator) -> Web:
    auth = AuthStore(tmp_path / "state")
    admin = auth.ensure_admin_token()
    _, viewer = auth.mint_viewer("test screen")
    app = create_app(orch, auth, "http://127.0.0.1:9")
    app.testing = True
    return Web(app, orch, auth, admin, viewer)


@pytest.fixture
def web(tmp_path: Path) -> Iterator[Web]:
    """A started orchestrator (its thread and watcher run; no nodes yet)."""
    (tmp_path / "router.yaml").write_text("backends: []\n")
    orch = Orchestrator(tmp_path / "state", ConfigFileRegistrar(tmp_path / "router.yaml")).start()
    yield make_web(tmp_path, orch)
    orch.stop()


@pytest.fixture
def still(tmp_path: Path) -> Iterator[Web]:
    """A started orchestrator that never reaches out (no watcher): for a test that puts made-up
    nodes in its state, which a watcher would probe, find unreachable and mark so meanwhile."""
    (tmp_path / "router.yaml").write_text("backends: []\n")
    orch = Orchestrator(tmp_path / "state", ConfigFileRegistrar(tmp_path / "router.yaml")).start(look=False)
    yield make_web(tmp_path, orch)
    orch.stop()


@pytest.fixture
def rich(tmp_path: Path) -> Iterator[Web]:
    """An orchestrator holding a hand-made state with everything in it (nodes, a discovered
    node, a plan, a preparation, a running cluster with samples, an ended one): for rendering
    every component. Its thread decides commands; it never looks at the (made-up) nodes."""
    (tmp_path / "router.yaml").write_text("backends: []\n")
    orch = Orchestrator(tmp_path / "state", ConfigFileRegistrar(tmp_path / "router.yaml")).start(look=False)
    orch._state = rich_state()
    yield make_web(tmp_path, orch)
    orch.stop()


def buttons(html: str) -> list[tuple[str, bool]]:
    """Every <button>'s text and whether it is disabled (itself or by a disabled fieldset)."""
    return [(b.text, b.disabled) for b in parse(html).find_all("button")]


@pytest.fixture(scope="module")
def dashboard(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dashboard]:
    """A real `pipeserve dashboard` process (gunicorn, its worker, real sockets) for this module."""
    d = start_dashboard(tmp_path_factory.mktemp("dashboard"))
    yield d
    d.stop()
