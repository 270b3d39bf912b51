"""Chat: the model picker from the router's /v1/models, and replies streamed from the router."""

from __future__ import annotations

import requests
from flask import Blueprint, Response, abort, jsonify, request, stream_with_context

from .auth import check_csrf, login_required
from .services import current_services

bp = Blueprint("chat", __name__)
MAX_MESSAGE = 32_000


@bp.get("/chat/models")
@login_required
def models():
    """The router's models (what the Model picker offers)."""
    try:
        r = requests.get(current_services().router_url + "/v1/models", timeout=5)
        data = r.json().get("data", []) if r.status_code == 200 else []
    except (requests.RequestException, ValueError):
        data = []
    return jsonify(models=[m["id"] for m in data if isinstance(m, dict) and "id" in m])


@bp.post("/chat/send")
@login_required
def send():
    """Forward one chat turn to the router and stream its server-sent events back."""
    check_csrf()
    body = request.get_json(silent=True) or {}
    model, messages = body.get("model"), body.get("messages")
    if not isinstance(model, str) or not model:
        abort(400, description="choose a model")
    if not isinstance(messages, list) or not messages or len(str(messages)) > MAX_MESSAGE:
        abort(400, description="write a message (at most 32,000 characters of conversation)")
    upstream = requests.post(current_services().router_url + "/v1/chat/completions", stream=True, timeout=300,
                             json={"model": model, "messages": messages, "stream": True,
                                   "max_tokens": int(body.get("max_tokens") or 256),
                                   "temperature": float(body.get("temperature") or 0)})
    if upstream.status_code != 200:
        try:
            message = upstream.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = upstream.text[:300]
        abort(upstream.status_code, description=message)

    def relay():
        with upstream:
            for chunk in upstream.iter_content(chunk_size=None):
                yield chunk

    return Response(stream_with_context(relay()), mimetype="text/event-stream",
                    headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
