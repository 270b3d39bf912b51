"""A replacement coordinator refuses moves signed before it started (issue 39, item 3), on REAL
processes: a coordinator `kill -9`ed and started again on the same port beside the same stages.

Before, the last accepted move's sequence lived only in the coordinator process and started at
-1, so a replacement took any signed move under two minutes old: replayed, it re-pointed a
healthy stage at the move's old address (here a dead one) and the cluster stopped serving.
"""

from __future__ import annotations

import signal
import time

import requests

from orchestrator.engine.local_pipeline import LocalPipeline
from orchestrator.engine.stage_address import ROUTE_PATH, SIGNATURE_HEADER, request_body, sign


def _stage_address(p: LocalPipeline) -> str:
    return requests.get(p.base_url + "/health", timeout=10).json()["stages"][0]["address"]


def test_a_move_signed_before_the_coordinator_started_is_a_409_and_changes_nothing(model_factory, tmp_path):
    model = model_factory(layers=2, hidden=64, heads=2, kv_heads=2, vocab=320)
    p = LocalPipeline(tmp_path, model, [(0, 1)], threads=1).start()
    try:
        def post(body: bytes) -> requests.Response:
            return requests.post(p.base_url + ROUTE_PATH, data=body, timeout=10,
                                 headers={SIGNATURE_HEADER: sign(p.secret.encode(), body)})

        stage_0 = _stage_address(p)
        captured = request_body(0, "127.0.0.1:9", time.time())  # signed, never sent: a dead address
        taken = request_body(0, stage_0, time.time() + 0.001)  # sent and taken by the first coordinator
        assert post(taken).status_code == 200
        p.kill("coordinator", signal.SIGKILL)
        assert p.procs["coordinator"].wait_exit(30)
        p._spawn("coordinator", ["coordinator", "--config", str(p.config_path), "--node-id", "coordinator",
                                 "--model", str(model), "--port", str(p.http_port)])
        p.wait_ready()
        for replay in (captured, taken):  # both well inside the 120 s window
            r = post(replay)
            assert r.status_code == 409, r.text
            assert r.json()["error"]["code"] == "route_refused"
            assert "before this coordinator started" in r.json()["error"]["message"]
        health = requests.get(p.base_url + "/health", timeout=10).json()
        assert health["status"] == "ready" and health["stages"][0]["address"] == stage_0
        # A move the control plane signs now is still taken.
        assert post(request_body(0, stage_0, time.time())).status_code == 200
        assert p.wait_ready()["stages"][0]["address"] == stage_0
    finally:
        p.stop()
