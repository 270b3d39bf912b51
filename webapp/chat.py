"""Chat: the model picker from the router's /v1/models, and replies streamed from the router."""

from __future__ import annotations

import http.client
import json
import math
import socket
from collections.abc import Iterator
from contextlib import ExitStack, closing
from typing import Any
from urllib.parse import urlsplit

import requests
from flask import Blueprint, Response, abort, jsonify, request, stream_with_context

from orchestrator.httpkit.upstream import ClientWatch, connect
from webapp.auth import check_csrf, login_required
from webapp.services import current_services

bp = Blueprint("chat", __name__)
MAX_MESSAGE = 32_000
MAX_TOKENS = 32_768
CONNECT_TIMEOUT = 5.0  # the router is on this host or the LAN: not accepting in 5 s is down
READ_TIMEOUT = 300.0  # between two bytes of the answer (a long prefill sends none)
PIECE = 64 * 1024


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
    """The router's models (what the Model picker offers), and the models of sessions that are
    recovering: the router does not list them meanwhile, but they serve again in seconds, so the
    page says "recovering" (and offers Retry) instead of "no model is being served"."""
    try:
        r = requests.get(current_services().router_url + "/v1/models", timeout=5)
        data = r.json().get("data", []) if r.status_code == 200 else []
    except (requests.RequestException, ValueError):
        data = []
    sessions = current_services().orchestrator.state.sessions
    recovering = sorted({s.model_name for s in sessions if s.phase == "recovering"})
    # when each model's cluster last faulted (a recovery can take under a second: a reply cut off
    # by it is explained even when the page looks only after it)
    faulted = {s.model_name: s.faults[-1].at for s in sessions if s.faults}
    return jsonify(models=[m["id"] for m in data if isinstance(m, dict) and "id" in m], recovering=recovering,
                   faulted=faulted)


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
    payload = json.dumps({"model": model, "messages": messages, "stream": True,
                          "max_tokens": max_tokens, "temperature": temperature}).encode()
    return _relay(current_services().router_url, payload, request.environ.get("gunicorn.socket"))


def _relay(router_url: str, payload: bytes, browser: socket.socket | None) -> Response:
    """POST the turn to the router and stream its answer back while watching the browser.

    Stop in the page closes the browser's connection; the watch (`browser`: its socket under
    gunicorn, None under a test client) then shuts the router's connection down at once, even
    before the first token, so the coordinator cancels the reply instead of prefilling for nobody.
    """
    try:
        conn = connect(router_url, CONNECT_TIMEOUT)
    except OSError as exc:
        abort(502, description=f"the router did not answer: {type(exc).__name__}")
    held = ExitStack()  # the connection and its watch, closed when the answer ends or fails
    held.enter_context(closing(conn))
    if browser is not None:
        held.enter_context(ClientWatch(browser, conn.sock))
    try:
        conn.sock.settimeout(READ_TIMEOUT)
        conn.request("POST", urlsplit(router_url).path.rstrip("/") + "/v1/chat/completions", body=payload,
                     headers={"Content-Type": "application/json"})
        upstream = conn.getresponse()
        error = upstream.read() if upstream.status != 200 else None
    except (OSError, http.client.HTTPException) as exc:
        held.close()
        abort(502, description=f"the router did not answer: {type(exc).__name__}")
    if error is not None:
        held.close()
        try:
            message = json.loads(error)["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = error[:300].decode(errors="replace")
        abort(upstream.status, description=message)

    def relay() -> Iterator[bytes]:
        with held:
            try:
                while piece := upstream.read1(PIECE):
                    yield piece
            except (OSError, http.client.HTTPException):
                return  # the router broke off (or the watch shut it down): the page sees the stream end

    answer = Response(stream_with_context(relay()), mimetype="text/event-stream",
                      headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    answer.call_on_close(held.close)  # also when the server closes the answer before reading it
    return answer
