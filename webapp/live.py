"""Websockets: live HTML fragments for browsers, a JSON feed for programs.

Each socket has exactly one writer — the thread flask-sock runs the handler on — which
waits on its own subscription to the orchestrator's events and pushes what changed.
A (re)connecting browser first gets every component it shows, so it is never stale.
"""

from __future__ import annotations

import json
import queue
from typing import Any

from flask import Flask, request
from flask_sock import ConnectionClosed, Sock

from . import auth
from .api import bearer_role, state_json
from .components import BY_NAME, affected, render
from .services import current_services, view_context

POLL = 1.0  # seconds between checks that the peer is still there


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


def register(app: Flask) -> None:
    """Add the /ws (HTML) and /ws/events (JSON) routes."""
    sock = Sock(app)

    @sock.route("/ws")
    def html_feed(ws) -> None:
        if auth.role() is None:
            ws.close(1008, "log in first")
            return
        names = [n for n in request.args.get("components", "").split(",") if n in BY_NAME]
        orch = current_services().orchestrator
        ctx = view_context()
        q = orch.subscribe()
        # What this socket last sent per component: a component is pushed again only when its
        # HTML changed, so routine reports (a node's heartbeat) do not re-render forms under
        # the user's hands.
        sent = {n: render(n, orch.state, ctx, oob=True) for n in names}
        try:
            ws.send("".join(sent.values()))
            while True:
                try:
                    events = _drain(q, q.get(timeout=POLL))
                except queue.Empty:
                    if not ws.connected:
                        return
                    continue
                changed = [n for n in names if any(n in affected(e.kind, names) for e in events)]
                fresh = {n: render(n, orch.state, ctx, oob=True) for n in changed}
                fresh = {n: html for n, html in fresh.items() if html != sent[n]}
                if fresh:
                    sent.update(fresh)
                    ws.send("".join(fresh.values()))
        except ConnectionClosed:
            return
        finally:
            orch.bus.unsubscribe(q)

    @sock.route("/ws/events")
    def json_feed(ws) -> None:
        if bearer_role() is None:
            ws.close(1008, "send a session cookie or ?token=<viewer token>")
            return
        orch = current_services().orchestrator
        q = orch.subscribe()
        try:
            ws.send(json.dumps({"type": "state", "state": state_json(orch.state)}))
            while True:
                try:
                    event = q.get(timeout=POLL)
                except queue.Empty:
                    if not ws.connected:
                        return
                    continue
                ws.send(json.dumps({"type": "event", "event": _scrub(event.model_dump(mode="json"))}))
        except ConnectionClosed:
            return
        finally:
            orch.bus.unsubscribe(q)
