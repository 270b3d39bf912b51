"""How the router relays bytes, against scripted backends at the backend's HTTP seam.

These backends are fakes on purpose: the properties under test (bytes relayed unchanged
and as soon as they arrive, a backend breaking off mid-stream, an arbitrary status with
its headers) need a backend whose timing and failures the test controls, which a real
coordinator does not offer. What a real coordinator does through the router is covered
in test_router.py. The router itself is the real `pipeserve router` process.
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Iterator

import pytest
import requests

from orchestrator.proc import wait_until
from tests.support.router import write_yaml
from tests.support.stub_http import StubHandler, StubServer

EVENTS = [b'data: {"n": 1, "text": "caf\xc3\xa9"}\n\n', b'data: {"n": 2}\n\n', b"data: [DONE]\n\n"]
GAP = 0.4  # seconds between two events of the scripted stream
HOLD_S = 60  # how long a silent backend waits for its client to go (longer than any test waits)


class _Scripted(StubHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self.reply(200, json.dumps({"object": "list", "data": [{"id": "scripted", "object": "model"}]}).encode())

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.received.append((self.path, {k.lower(): v for k, v in self.headers.items()}, body))
        mode = body.get("mode")
        if mode in ("silent", "stall"):  # a long prefill / a stalled stream: nothing, until the client goes
            if mode == "stall":
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(EVENTS[0]), EVENTS[0]))
                self.wfile.flush()
            self.connection.settimeout(HOLD_S)
            try:
                if self.connection.recv(1) == b"":
                    self.server.client_left.append(mode)
            except OSError:
                self.server.client_left.append(mode)
            self.close_connection = True
            return
        if mode == "limited":
            data = b'{"error": {"message": "slow down", "type": "rate_limit", "param": null, "code": "x"}}'
            self.reply(429, data, headers={"Retry-After": "7", "X-Backend": "scripted"}, reason="Too Many")
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for i, event in enumerate(EVENTS):
            if mode == "break" and i == 1:
                self.connection.shutdown(socket.SHUT_RDWR)  # the backend dies mid-stream
                self.close_connection = True
                return
            self.server.sent_at.append(time.monotonic())
            self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
            self.wfile.flush()
            time.sleep(GAP)
        self.wfile.write(b"0\r\n\r\n")


@pytest.fixture
def scripted() -> Iterator[StubServer]:
    server = StubServer(_Scripted)
    server.received, server.sent_at, server.client_left = [], [], []
    with server:
        yield server


@pytest.fixture
def router(scripted, start_router, tmp_path: Path):
    url = scripted.url
    cfg = write_yaml(tmp_path / "router.yaml", {"backends": [{"name": "s", "url": url, "models": ["scripted"]}],
                                                "health_checks": {"interval": "0.2s", "healthy_threshold": 1}})
    r = start_router(cfg)
    wait_until(lambda: r.models() == ["scripted"], 5, message="the scripted backend to be healthy")
    return r


def test_a_stream_is_relayed_byte_for_byte_as_it_arrives(router, scripted):
    start = time.monotonic()
    resp = requests.post(router.url + "/v1/chat/completions", json={"model": "scripted", "stream": True,
                                                                    "messages": []}, stream=True, timeout=10)
    assert resp.status_code == 200 and resp.headers["Content-Type"] == "text/event-stream"
    got, arrived = b"", []
    for piece in resp.raw.stream(1 << 16, decode_content=False):
        got += piece
        arrived.append(time.monotonic())
    assert got == b"".join(EVENTS)
    # The first event reached the client before the backend had even sent the second one:
    # nothing is buffered until the end.
    assert arrived[0] < scripted.sent_at[1], (arrived[0] - start, scripted.sent_at[1] - start)
    assert time.monotonic() - start >= GAP * (len(EVENTS) - 1)
    path, headers, body = scripted.received[0]
    assert path == "/v1/chat/completions" and body["model"] == "scripted"
    assert headers["x-forwarded-for"] == "127.0.0.1"


def test_status_reason_headers_and_error_body_pass_through(router):
    r = requests.post(router.url + "/v1/completions", json={"model": "scripted", "mode": "limited"}, timeout=10)
    assert (r.status_code, r.reason) == (429, "Too Many")
    assert r.content == b'{"error": {"message": "slow down", "type": "rate_limit", "param": null, "code": "x"}}'
    assert r.headers["Retry-After"] == "7" and r.headers["X-Backend"] == "scripted"


def test_a_backend_breaking_off_mid_stream_ends_with_an_error_event(router):
    resp = requests.post(router.url + "/v1/chat/completions", json={"model": "scripted", "stream": True,
                                                                    "mode": "break"}, stream=True, timeout=10)
    lines = [line for line in resp.iter_lines() if line]
    assert lines[0] == EVENTS[0].strip()
    error = json.loads(lines[-1].removeprefix(b"data: "))["error"]
    assert "broke off" in error["message"] and error["type"] == "server_error"
    assert len(lines) == 2
    assert requests.get(router.url + "/health", timeout=5).status_code == 200  # the router is fine


def test_a_broken_off_anthropic_stream_ends_with_anthropics_error_event(router):
    resp = requests.post(router.url + "/v1/messages", json={"model": "scripted", "stream": True, "mode": "break"},
                         stream=True, timeout=10)
    lines = [line for line in resp.iter_lines() if line]
    assert lines[0] == EVENTS[0].strip() and lines[1] == b"event: error"  # the anthropic client reads named events
    body = json.loads(lines[2].removeprefix(b"data: "))
    assert body["type"] == "error" and body["error"]["type"] == "api_error" and "broke off" in body["error"]["message"]


def test_a_broken_off_responses_stream_ends_with_an_error_event(router):
    resp = requests.post(router.url + "/v1/responses", json={"model": "scripted", "stream": True, "mode": "break"},
                         stream=True, timeout=10)
    lines = [line for line in resp.iter_lines() if line]
    assert lines[1] == b"event: error"
    body = json.loads(lines[2].removeprefix(b"data: "))
    # The Responses error event's fields, and OpenAI's "error" member the openai client raises on.
    assert body["type"] == "error" and body["code"] == "bad_gateway" and "broke off" in body["message"]
    assert body["error"]["type"] == "server_error"


def test_the_routers_own_errors_on_the_messages_api_are_in_anthropics_shape(router):
    r = requests.post(router.url + "/v1/messages", json={"model": "unknown", "max_tokens": 1, "messages": []},
                      timeout=10)
    assert r.status_code == 404
    assert r.json()["type"] == "error" and r.json()["error"]["type"] == "not_found_error"
    r = requests.post(router.url + "/v1/messages/count_tokens", json={"messages": []}, timeout=10)
    assert r.status_code == 400 and r.json()["error"] == {"type": "invalid_request_error",
                                                          "message": 'model: the request needs a "model" (see GET '
                                                                     '/v1/models)'}


def _leave_early(router_url: str, scripted: StubServer, mode: str) -> None:
    """Send a streaming request through the router and close the connection once the backend has
    it (and, for a stalled stream, once its first event arrived)."""
    body = json.dumps({"model": "scripted", "stream": True, "mode": mode}).encode()
    host, port = router_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        wait_until(lambda: len(scripted.received) == 1, 10, message="the backend to receive the request")
        got = b""
        while mode == "stall" and EVENTS[0] not in got:
            got += sock.recv(4096)


@pytest.mark.parametrize("mode", ["silent", "stall"])
def test_a_client_that_leaves_while_the_backend_is_silent_closes_the_backends_connection_at_once(
        router, scripted, mode):
    """Stop during a prefill (no byte yet) or a stalled stream reaches the backend without waiting for
    its next byte: the coordinator sees its client go and cancels. Without the router's watch the
    backend would hold its connection for HOLD_S."""
    _leave_early(router.url, scripted, mode)
    wait_until(lambda: scripted.client_left == [mode], 20, message="the backend to see its client go")
    assert router.backend("s")["state"] == "healthy"  # a client leaving is not the backend failing
    wait_until(lambda: "proxy.client_gone" in router.output(), 10, message="the router to log the client leaving")
