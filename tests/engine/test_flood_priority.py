"""Floods at a REAL coordinator never blind the control plane (issue 20, item 1).

Before: 2,100 idle TCP sockets (nothing sent) filled the coordinator's connection slots; the
watcher's next look got the full server's 429 — JSON, read as the coordinator's verdict
"coordinator None: None" — and the healthy cluster was torn down in 5.8 s. Now an idle
connection gives its slot to a newcomer that sends a request, a control-plane request (the
cluster's control token) is served in reserved slots even when every slot is busy, and a
429 is "busy", never a verdict. Loopback only; floods are bounded (a few hundred sockets).
"""

from __future__ import annotations

import socket
import threading
import time

import pytest
import requests

from orchestrator.control.coordinator_client import CoordinatorClient
from orchestrator.engine.local_pipeline import LocalPipeline

MAX_CONNECTIONS = 32
FLOOD = 300  # idle sockets: ~9x the slots


@pytest.fixture(scope="module")
def served(model_factory, tmp_path_factory):
    model = model_factory(layers=2, hidden=64, heads=2, kv_heads=2, vocab=320)
    env = {"PIPESERVE_HTTP_MAX_CONNECTIONS": str(MAX_CONNECTIONS)}
    cluster = LocalPipeline(tmp_path_factory.mktemp("flood"), model, [(0, 1)], threads=1, env=env).start()
    yield cluster
    cluster.stop()


def _idle_flood(port: int, count: int) -> list[socket.socket]:
    socks = []
    for _ in range(count):
        try:
            socks.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        except OSError:
            break  # the backlog is full: enough
    return socks


def test_an_idle_flood_never_blinds_the_control_plane_nor_a_client_that_asks(served):
    """300 idle sockets against 32 slots: the control plane's look is a verdict (ready), and an
    anonymous request that is sent at once is answered too (it takes an idle socket's slot)."""
    control = CoordinatorClient(served.base_url, served.secret)
    socks = _idle_flood(served.http_port, FLOOD)
    try:
        assert len(socks) >= 2 * MAX_CONNECTIONS, len(socks)
        for _ in range(5):
            look = control.health(timeout=10)
            assert look.report is not None and look.report.status == "ready", look
            r = requests.get(served.base_url + "/v1/models", timeout=10)
            assert r.status_code == 200, r.text
            socks += _idle_flood(served.http_port, 50)  # the flood goes on
    finally:
        for s in socks:
            s.close()
    assert "http.idle_evicted" in (served.workdir / "coordinator.log").read_text(errors="replace")


def test_when_every_slot_is_busy_the_control_plane_still_gets_its_verdict(served):
    """Every slot holds a real request (anonymous long polls of /health): an anonymous look is
    refused with 429 — which the client reads as busy, never as a verdict — while the control
    plane's look is answered from the reserved slots."""
    stop = threading.Event()
    url = served.base_url + "/health"

    def hold() -> None:
        while not stop.is_set():
            try:
                requests.get(url, params={"wait": 10, "unless": "ready"}, timeout=20)
            except requests.RequestException:
                time.sleep(0.1)

    holders = [threading.Thread(target=hold, daemon=True) for _ in range(MAX_CONNECTIONS + 4)]
    for t in holders:
        t.start()
    try:
        time.sleep(3.0)  # the long polls are in (a loaded machine starts 36 threads slowly)
        anonymous = CoordinatorClient(served.base_url).health(timeout=10)
        print(f"anonymous look while full: busy={anonymous.busy} status={anonymous.status} {anonymous.error}")
        assert anonymous.status != 429 or (anonymous.busy and anonymous.report is None)  # 429: busy, no verdict
        for _ in range(3):
            look = CoordinatorClient(served.base_url, served.secret).health(timeout=10)
            assert look.report is not None and look.report.ready, look
    finally:
        stop.set()
        for t in holders:
            t.join(timeout=30)
