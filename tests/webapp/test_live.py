"""The websockets, against the app served in-process on a real socket: `WS /ws/events` (the first
message is the state, then one message per event; no credential, no feed), and a socket the
event bus drops for falling behind resynchronises instead of going quiet."""

from __future__ import annotations

import json
import threading
from typing import Iterator

import pytest
import requests
from werkzeug.serving import make_server

from orchestrator.control.rules.state import Settings
from orchestrator.proc import wait_until
from tests.support import websocket
from tests.support.html import parse
from tests.webapp.conftest import Web

WAIT = 30.0  # seconds: generous for a loaded 2-core machine; each wait ends as soon as its condition holds


@pytest.fixture
def served(web: Web) -> Iterator[tuple[Web, str]]:
    """The app on a free loopback port (werkzeug, a thread per connection): (web, "host:port")."""
    server = make_server("127.0.0.1", 0, web.app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield web, f"127.0.0.1:{server.server_port}"
    server.shutdown()
    thread.join(5)


def _message(ws: websocket.Client, timeout: float = WAIT) -> str:
    got = ws.receive(timeout)
    assert got is not None, f"no message within {timeout} s"
    return got


def _messages_until(ws: websocket.Client, done, timeout: float = WAIT) -> list[str]:
    """Messages received until `done(message)` holds for one (that one included)."""
    seen: list[str] = []

    def next_one() -> bool:
        got = ws.receive(0.2)
        if got is not None:
            seen.append(got)
        return bool(seen) and done(seen[-1])
    wait_until(next_one, timeout, interval=0, message="the expected websocket message")
    return seen


def _refusal(url: str, **kwargs) -> tuple[int, str]:
    ws = websocket.connect(url, **kwargs)
    try:
        with pytest.raises(websocket.ConnectionClosed) as closed:
            ws.receive(WAIT)
        return closed.value.reason, closed.value.message or ""
    finally:
        if ws.connected:
            ws.close()


def _drop_everyone(web: Web) -> None:
    """What the bus does to a subscriber that fell too far behind, done to every socket now."""
    subscribers = wait_until(web.orch.bus.subscribers, WAIT, message="a subscribed socket")
    for q in subscribers:
        web.orch.bus.drop(q)


def test_the_event_feed_sends_the_state_then_one_message_per_event(served):
    web, host = served
    ws = websocket.connect(f"ws://{host}/ws/events?token={web.viewer_token}")
    try:
        first = json.loads(_message(ws))
        assert first["type"] == "state" and first["state"]["settings"]["distributed_enabled"] is False
        assert {"nodes", "sessions", "settings", "links"} <= set(first["state"])
        web.orch.update_settings(Settings(distributed_enabled=True))
        events = [json.loads(m) for m in _messages_until(ws, lambda m: "settings_changed" in m)]
        assert all(e["type"] == "event" for e in events)
        assert events[-1]["event"]["kind"] == "settings_changed"
        assert events[-1]["event"]["settings"]["distributed_enabled"] is True
    finally:
        ws.close()


@pytest.mark.parametrize("query", ["", "?token=not-a-token"])
def test_the_event_feed_refuses_without_a_valid_credential(served, query: str):
    _, host = served
    code, reason = _refusal(f"ws://{host}/ws/events{query}")
    assert code == 4401 and "viewer token" in reason


def test_a_dropped_event_feed_gets_a_fresh_state_and_goes_on(served):
    web, host = served
    ws = websocket.connect(f"ws://{host}/ws/events?token={web.admin_token}")
    try:
        assert json.loads(_message(ws))["type"] == "state"
        web.orch.update_settings(Settings(distributed_enabled=True))  # missed: the socket is dropped before it reads
        _drop_everyone(web)
        fresh = [json.loads(m) for m in _messages_until(ws, lambda m: json.loads(m)["type"] == "state")]
        assert fresh[-1]["state"]["settings"]["distributed_enabled"] is True
        assert web.orch.bus.subscribers(), "the socket subscribed again"
        web.orch.update_settings(Settings(distributed_enabled=False))
        later = _messages_until(ws, lambda m: "settings_changed" in m)
        assert json.loads(later[-1])["event"]["settings"]["distributed_enabled"] is False
    finally:
        ws.close()


def test_a_dropped_browser_socket_gets_every_component_again(served):
    web, host = served
    browser = requests.Session()
    assert browser.post(f"http://{host}/login", data={"token": web.admin_token}, allow_redirects=False,
                        timeout=WAIT).status_code == 302
    cookie = f"session={browser.cookies['session']}"
    url = f"ws://{host}/ws?components=settings-status,nodes,settings-form"  # a form is never pushed
    ws = websocket.connect(url, headers={"Cookie": cookie})
    try:
        first = parse(_message(ws))
        assert [e.attrs["id"] for e in first.children] == ["settings-status", "nodes"]
        web.orch.update_settings(Settings(distributed_enabled=True))
        _drop_everyone(web)
        again = _messages_until(ws, lambda m: 'id="nodes"' in m)
        latest = parse(again[-1])
        assert [e.attrs["id"] for e in latest.children] == ["settings-status", "nodes"]
        assert "On" in latest.by_id("settings-status").text.split()
    finally:
        ws.close()
    code, _ = _refusal(url)  # no session cookie: no feed
    assert code == 4401


def test_a_node_report_refreshes_the_plan_cards_link_figures(rich):
    """The plan card shows the nodes' latest link measurements (views/perf.py): a node's report
    with a new measurement is pushed to every page showing the card, so two pages never keep the
    figures of whenever each last rendered it (e2e guard rails test_8 found viewer and admin apart)."""
    from orchestrator.agent.perf_schemas import LinkSample
    from orchestrator.control.rules import events as ev
    from webapp.components import affected

    assert {"plan-preview"} <= set(affected("node_reported", ["plan-preview", "nodes"]))
    assert "plan-preview" in affected("node_unreachable", ["plan-preview"])
    server = make_server("127.0.0.1", 0, rich.app, threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    browser = requests.Session()
    host = f"127.0.0.1:{server.server_port}"
    try:
        assert browser.post(f"http://{host}/login", data={"token": rich.admin_token}, allow_redirects=False,
                            timeout=WAIT).status_code == 302
        ws = websocket.connect(f"ws://{host}/ws?components=plan-preview",
                               headers={"Cookie": f"session={browser.cookies['session']}"})
        try:
            assert 'id="plan-preview"' in _message(ws)
            a = rich.orch.state.node("n0")
            sample = LinkSample(node_id="n1", url="http://10.0.0.2:39500", rtt_ms=0.25, http_rtt_ms=0.5,
                                bandwidth_Bps=123.45e9 / 8, at=1.0)
            report = a.report.model_copy(update={"links": (sample,)})
            rich.orch.post(ev.NodeReported(node_id="n0", report=report, at=2.0))
            pushed = _messages_until(ws, lambda m: "123.45 Gbit/s" in m)
            assert 'id="plan-preview"' in pushed[-1]
        finally:
            ws.close()
    finally:
        server.shutdown()
