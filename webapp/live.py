"""Websockets: live HTML fragments for browsers, a JSON feed for programs.

Each socket is re-checked every POLL: when its session ends (log out, a revoked viewer link, a
reset admin token) it is closed with code 4401, and the page goes to the login page. A
session holds at most `guard.WS_PER_SESSION` sockets and a viewer link `guard.WS_PER_USER`;
one more is closed with 4429 and says why.

Each socket has exactly one writer — the greenlet (gevent worker) flask-sock runs the
handler on — which waits on its own subscription to the orchestrator's events and pushes
what changed.
A (re)connecting browser first gets every component it shows, so it is never stale; so does a
socket the event bus dropped for falling behind (it subscribes again and resends everything:
a browser gets every component again, a program a new `{"type": "state"}` message).
"""

from __future__ import annotations

import json
import queue
from typing import Any, Callable

from flask import Flask, current_app, request
from flask_sock import ConnectionClosed, Sock

from webapp import auth
from webapp.api import bearer_token, state_json
from webapp.components import BY_NAME, affected, render
from webapp.guard import live_slots
from webapp.services import current_services, view_context

POLL = 0.5  # seconds between checks that the peer and its session are still there
ENDED = 4401  # close code: no (more) session; the page goes to the login page
TOO_MANY = 4429  # close code: the session holds too many sockets
CLOSE_GRACE_S = 0.5  # the longest a refusal waits for the peer to answer (or read) its close frame


def _drain(q: queue.Queue, first: Any) -> list[Any]:
    """The event just received plus any already queued (one push for a burst)."""
    events = [first]
    while True:
        try:
            events.append(q.get_nowait())
        except queue.Empty:
            return events


def _scrub(obj: Any) -> Any:
    """Remove credentials from an event's JSON."""
    if isinstance(obj, dict):
        return {k: _scrub(v) for k, v in obj.items() if k != "credential"}
    if isinstance(obj, list):
        return [_scrub(v) for v in obj]
    return obj


def _credential(allow_token: bool) -> tuple[str, str, Callable[[], bool]] | None:
    """(session key, user key, still-valid check) for this socket's session or token; None
    without one.

    The check reads the auth store (a stat, a re-read when it changed), so a session ended
    by another request or by `--reset-admin-token` is noticed within one POLL.
    """
    store = current_services().auth
    sid = auth.session_key()
    user = store.session_owner(sid)
    if sid and user:
        return sid, user, lambda: store.session_role(sid) is not None
    token = bearer_token() if allow_token else ""
    who = store.identify(token) if token else None
    if who:
        user = "admin" if who[0] == "admin" else f"viewer:{who[1]}"
        return "token:" + auth.digest(token), user, lambda: store.role_for(token) is not None
    return None


def _serve(ws, allow_token: bool, refusal: str, first: Callable[[], str],
           push: Callable[[list[Any]], str | None]) -> None:
    """Authenticate, hold a slot, send `first()`, then `push(events)` until the peer or the
    session goes away."""
    cred = _credential(allow_token)
    if cred is None:
        _close(ws, ENDED, refusal)
        return
    session, user, valid = cred
    orch = current_services().orchestrator
    with live_slots(current_app).hold(session, user) as too_many:
        if too_many:
            _close(ws, TOO_MANY, too_many)
            return
        q = orch.subscribe()
        try:
            ws.send(first())
            while True:
                try:
                    events = _drain(q, q.get(timeout=POLL))
                except queue.Empty:
                    events = []
                if not valid():
                    _close(ws, ENDED, "your session ended: log in again")
                    return
                if q.dropped.is_set():
                    # The bus gave up on this socket (it fell too far behind): what is queued
                    # is incomplete, so start over from a fresh snapshot instead of going quiet.
                    q = orch.subscribe()
                    ws.send(first())
                    continue
                if not events:
                    if not ws.connected:
                        return
                    continue
                message = push(events)
                if message:
                    ws.send(message)
        except ConnectionClosed:
            return
        finally:
            orch.bus.unsubscribe(q)


def _close(ws, code: int, reason: str) -> None:
    """Close with `code` and `reason`, then wait (briefly) for the peer's reply to be read: the
    server closes the TCP connection when the handler returns, and a reply arriving after that is
    answered with a reset, which can discard the close frame before a busy client has read it
    (it then saw 1005, no status, instead of the reason)."""
    ws.close(code, reason)
    reader = getattr(ws, "thread", None)  # simple_websocket's reader: it ends once the reply is read
    if reader is not None:
        reader.join(CLOSE_GRACE_S)


def register(app: Flask) -> None:
    """Add the /ws (HTML) and /ws/events (JSON) routes."""
    sock = Sock(app)

    @sock.route("/ws")
    def html_feed(ws) -> None:
        # display components only: a form is never pushed (see components.py)
        names = [n for n in request.args.get("components", "").split(",") if n in BY_NAME and BY_NAME[n].live]
        orch = current_services().orchestrator
        ctx = view_context()
        # What this socket last sent per component: a component is pushed again only when its
        # HTML changed, so routine reports (a node's heartbeat) do not re-render forms under
        # the user's hands.
        sent: dict[str, str] = {}

        def first() -> str:
            sent.update({n: render(n, orch.state, ctx, oob=True) for n in names})
            return "".join(sent.values())

        def push(events: list[Any]) -> str | None:
            changed = [n for n in names if any(n in affected(e.kind, names) for e in events)]
            fresh = {n: render(n, orch.state, ctx, oob=True) for n in changed}
            fresh = {n: html for n, html in fresh.items() if html != sent[n]}
            sent.update(fresh)
            return "".join(fresh.values()) or None

        _serve(ws, False, "log in first", first, push)

    @sock.route("/ws/events")
    def json_feed(ws) -> None:
        orch = current_services().orchestrator

        def first() -> str:
            return json.dumps({"type": "state", "state": state_json(orch.state)})

        def push(events: list[Any]) -> str | None:
            # one text message per event, as documented: send all but the last here
            for e in events[:-1]:
                ws.send(_event_json(e))
            return _event_json(events[-1])

        _serve(ws, True, "send a session cookie or ?token=<viewer token>", first, push)


def _event_json(event: Any) -> str:
    return json.dumps({"type": "event", "event": _scrub(event.model_dump(mode="json"))})
