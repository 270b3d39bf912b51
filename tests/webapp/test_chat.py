"""The chat relay of the real dashboard process (gunicorn's gevent worker, real sockets) in front
of a stand-in router: the router is faked here on purpose, as the test needs one that stays silent
(a long prefill) or refuses on cue; the real chain is driven in e2e/test_one_selection.py."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import pytest

from orchestrator.proc import wait_until
from tests.support.dashboard_server import Dashboard, start_dashboard
from tests.support.stub_http import StubHandler, StubServer

HOLD_S = 60  # how long the silent router waits for its client to go (longer than any test waits)


class _Router(StubHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.received.append(body)
        if body["model"] == "missing":
            self.reply(404, b'{"error": {"message": "no backend serves missing", "type": "not_found"}}')
            return
        self.connection.settimeout(HOLD_S)  # silent, as while the cluster prefills a long prompt
        try:
            if self.connection.recv(1) == b"":
                self.server.client_left = True
        except OSError:
            self.server.client_left = True
        self.close_connection = True


@pytest.fixture(scope="module")
def router() -> Iterator[StubServer]:
    server = StubServer(_Router)
    server.received, server.client_left = [], False
    with server:
        yield server


@pytest.fixture(scope="module")
def dashboard(router: StubServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dashboard]:
    d = start_dashboard(tmp_path_factory.mktemp("chat-dashboard"), "--router", router.url)
    yield d
    d.stop()


def test_stop_before_the_first_token_reaches_the_router_at_once(dashboard: Dashboard, router: StubServer):
    """The browser closing its connection (Stop) while nothing has come back yet closes the dashboard's
    connection to the router too: the router, and behind it the coordinator, cancel the reply instead
    of prefilling for nobody. Without the watch the relay would wait for the router's first byte."""
    admin = dashboard.login()
    csrf = dashboard.csrf(admin)
    cookies = "; ".join(f"{c.name}={c.value}" for c in admin.cookies)
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "a long story"}]}).encode()
    with socket.create_connection(("127.0.0.1", dashboard.port), timeout=10) as sock:
        sock.sendall(b"POST /chat/send HTTP/1.1\r\nHost: d\r\nContent-Type: application/json\r\n"
                     b"Cookie: %s\r\nX-CSRF-Token: %s\r\nContent-Length: %d\r\n\r\n%s"
                     % (cookies.encode(), csrf.encode(), len(body), body))
        wait_until(lambda: len(router.received) == 1, 20, message="the router to receive the turn")
    wait_until(lambda: router.client_left, 20, message="the router to see the dashboard's connection close")
    assert router.received[0]["stream"] is True and router.received[0]["messages"][0]["content"] == "a long story"


def test_the_routers_refusal_reaches_the_page_with_its_status_and_words(dashboard: Dashboard):
    admin = dashboard.login()
    r = admin.post(dashboard.url + "/chat/send", headers={"X-CSRF-Token": dashboard.csrf(admin)}, timeout=30,
                   json={"model": "missing", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 404 and r.json()["error"]["message"] == "no backend serves missing"
