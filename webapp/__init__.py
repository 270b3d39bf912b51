"""The pipeserve dashboard: a Flask app served beside the router (docs/dashboard.md).

`create_app` only wires things together — no thread starts here or at import; the
orchestrator is created and started by `pipeserve dashboard` (webapp.main).

Importing this package imports nothing heavy: `pipeserve dashboard` must apply gevent's
monkey-patching before ssl, socket users and threads are imported (webapp.main).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from flask import Flask

    from orchestrator.control.core import Orchestrator
    from webapp.authstore import AuthStore

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Services:
    """What the blueprints use; reached through `current_services()`."""

    orchestrator: Orchestrator
    auth: AuthStore
    router_url: str


def create_app(orchestrator: Orchestrator, auth: AuthStore, router_url: str) -> Flask:
    """Build the Flask app around a (started or not) orchestrator."""
    from flask import Flask, jsonify, render_template, request
    from werkzeug.exceptions import HTTPException

    app = Flask(__name__, template_folder=str(ROOT / "templates"), static_folder=str(ROOT / "static"))
    app.secret_key = auth.secret_key()
    app.config.update(SESSION_COOKIE_HTTPONLY=True, SESSION_COOKIE_SAMESITE="Lax",
                      PERMANENT_SESSION_LIFETIME=timedelta(days=7), MAX_CONTENT_LENGTH=1 << 20)
    app.extensions["pipeserve"] = Services(orchestrator, auth, router_url.rstrip("/"))

    from webapp import actions, api, chat, guard, live, models_tab, pages

    guard.install(app)
    for bp in (pages.bp, actions.bp, api.bp, chat.bp, models_tab.bp):
        app.register_blueprint(bp)
    live.register(app)

    @app.context_processor
    def viewer() -> dict:
        from webapp.services import view_context

        return {"ctx": view_context()}

    @app.errorhandler(HTTPException)
    def http_error(exc: HTTPException):  # clear errors that change nothing
        # programs, and the chat page's fetch (which sends JSON), read the message from JSON
        if request.path.startswith("/api/") or request.is_json or request.accept_mimetypes.best == "application/json":
            return jsonify(error={"message": exc.description, "status": exc.code}), exc.code
        if request.headers.get("HX-Request"):  # a notice in the page's message area; the component stays
            html = render_template("components/error.html", message=exc.description, status=exc.code)
            return html, exc.code, {"HX-Retarget": "#notices", "HX-Reswap": "innerHTML"}
        return render_template("pages/error.html", message=exc.description, status=exc.code), exc.code

    return app
