"""Chat: the model picker from the router's /v1/models, and replies streamed from the router."""

from __future__ import annotations

import math
from typing import Any

import requests
from flask import Blueprint, Response, abort, jsonify, request, stream_with_context

from webapp.auth import check_csrf, login_required
from webapp.services import current_services

bp = Blueprint("chat", __name__)
MAX_MESSAGE = 32_000
MAX_TOKENS = 32_768


def _number(body: dict, name: str, default: float, low: float, high: float, whole: bool) -> Any:
    """A JSON field that must be a finite number within [low, high]; abort 400 in words otherwise.

    Only real JSON numbers (or their digits as a string, as forms send them) pass: "abc",
    "nan", "inf", booleans and fractions where a whole number is due are refused.
    """
    raw = body.get(name)
    if raw is None or raw == "":
        return default
    try:
        if isinstance(raw, bool) or not isinstance(raw, (int, float, str)):
            raise ValueError
        value = float(raw)
        if not math.isfinite(value) or (whole and value != int(value)):
            raise ValueError
    except (ValueError, OverflowError):
        kind = "a whole number" if whole else "a number"
        abort(400, description=f"{name} must be {kind} between {low:g} and {high:g}, not {str(raw)[:40]!r}")
    if not low <= value <= high:
        abort(400, description=f"{name} must be between {low:g} and {high:g}, not {value:g}")
    return int(value) if whole else value


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
    try:
        body = request.get_json(silent=True)
    except RecursionError:  # `[` x 50,000 once answered 500: nested deeper than the parser follows
        body = None
    if not isinstance(body, dict):
        abort(400, description="send the chat turn as a JSON object")
    model, messages = body.get("model"), body.get("messages")
    if not isinstance(model, str) or not model:
        abort(400, description="choose a model")
    if not isinstance(messages, list) or not messages or len(str(messages)) > MAX_MESSAGE:
        abort(400, description="write a message (at most 32,000 characters of conversation)")
    max_tokens = _number(body, "max_tokens", 256, 1, MAX_TOKENS, whole=True)
    temperature = _number(body, "temperature", 0.0, 0.0, 2.0, whole=False)
    try:
        upstream = requests.post(current_services().router_url + "/v1/chat/completions", stream=True, timeout=300,
                                 json={"model": model, "messages": messages, "stream": True,
                                       "max_tokens": max_tokens, "temperature": temperature})
    except requests.RequestException as exc:
        abort(502, description=f"the router did not answer: {type(exc).__name__}")
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
