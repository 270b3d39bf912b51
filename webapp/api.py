"""`GET /api/state`: the dashboard's state as JSON, for programs (credentials never included)."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, abort, jsonify, request

from orchestrator.control.rules.state import State
from webapp import auth
from webapp.services import current_services

bp = Blueprint("api", __name__)


def state_json(state: State) -> dict[str, Any]:
    """The public JSON of a state snapshot (pure)."""
    from webapp.views.perf import link_matrix

    data = state.model_dump(mode="json", exclude={"nodes": {"__all__": {"credential"}}})
    data["links"] = link_matrix(state)  # measured links between every pair of registered nodes
    return data


def bearer_token() -> str:
    """The token of an `Authorization: Bearer <token>` header or a `?token=` (websockets); "" if none."""
    header = request.headers.get("Authorization", "")
    return header[7:] if header.startswith("Bearer ") else request.args.get("token", "")


def bearer_role() -> str | None:
    """The role of the session, or of an `Authorization: Bearer <admin or viewer token>`."""
    if auth.role():
        return auth.role()
    token = bearer_token()
    return current_services().auth.role_for(token) if token else None


@bp.get("/api/state")
def get_state():
    """The whole state (viewer credential or session)."""
    if bearer_role() is None:
        abort(401, description="send a session cookie or Authorization: Bearer <viewer token>")
    return jsonify(state_json(current_services().orchestrator.state))
