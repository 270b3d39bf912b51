"""A stage's outbound links over real sockets: frames reach the next stage, an unreachable one
names the requests it failed, a ROUTE moves the link."""

from __future__ import annotations

import socket
import threading

import pytest

from orchestrator.engine import transport
from orchestrator.engine.config import NodeSpec
from orchestrator.engine.stage import links as links_module
from orchestrator.engine.stage.links import Links
from orchestrator.engine.tensors import tokens_frame
from orchestrator.engine.wire import Kind, json_frame
from orchestrator.logs import EventLogger
from orchestrator.proc import free_port

SECRET = b"links-test-secret"
MAX_FRAME = 1 << 20


def _node(port: int) -> NodeSpec:
    return NodeSpec.model_validate({"id": "next", "address": f"127.0.0.1:{port}", "role": "pipeline_stage",
                                    "stage": 1, "layers": "2-3"})


class _NextStage:
    """A real listener that accepts one authenticated connection and collects its groups."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.groups: list[list] = []
        self.got = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        sock, addr = self.listener.accept()
        conn = transport.accept(sock, f"{addr[0]}:{addr[1]}", SECRET, MAX_FRAME)
        self.groups.append(conn.recv_group())
        self.got.set()
        conn.close()

    def close(self) -> None:
        self.listener.close()


def test_frames_reach_the_next_stage_on_a_connection_it_opens():
    nxt = _NextStage()
    try:
        links = Links(0, _node(nxt.port), SECRET, MAX_FRAME, EventLogger("test"))
        frames = [json_frame(Kind.OPEN, {"max_tokens": 3}, request_id=7), tokens_frame(7, 0, [1, 2, 3])]
        assert links.send_down(frames) == []
        assert nxt.got.wait(10)
        assert [(f.kind, f.request_id) for f in nxt.groups[0]] == [(Kind.OPEN, 7), (Kind.FORWARD, 7)]
        assert links.downstream is not None and links.downstream.role == "stage-0"
    finally:
        nxt.close()


def test_an_unreachable_next_stage_fails_the_requests_it_would_have_carried(monkeypatch):
    monkeypatch.setattr(links_module, "DOWNSTREAM_CONNECT_TIMEOUT", 0.3)
    links = Links(0, _node(free_port()), SECRET, MAX_FRAME, EventLogger("test"))
    frames = [json_frame(Kind.OPEN, {}, request_id=4), tokens_frame(4, 0, [1]),
              json_frame(Kind.CLOSE, {}, request_id=5)]
    assert links.send_down(frames) == [4, 4]  # the OPEN and the FORWARD; a CLOSE fails nothing
    assert links.downstream is None


def test_a_route_moves_the_link_and_drops_the_old_connection():
    links = Links(0, _node(1111), SECRET, MAX_FRAME, EventLogger("test"))
    old = socket.socketpair()
    links.downstream = transport.Connection(old[0], "old", "stage-0", MAX_FRAME)
    links.reroute(("127.0.0.1", 2222))
    assert links.next_node.address == "127.0.0.1:2222" and links.downstream is None
    assert old[1].recv(1) == b""  # the old connection was closed
    old[1].close()
    links.reroute(("127.0.0.1", 2222))  # the same address again: nothing to do
    assert links.next_node.address == "127.0.0.1:2222"


def test_no_coordinator_drops_frames_without_raising():
    links = Links(1, None, SECRET, MAX_FRAME, EventLogger("test"))
    links.error(9, "boom")  # logged and dropped: the coordinator is gone, so is the request
    assert links.coordinator is None
    with pytest.raises(AssertionError):
        links.send_down([tokens_frame(1, 0, [1])])  # the last stage has no next stage to send to
