"""A coordinator answers from the moment it binds its port (issue 20, item 9), on a REAL process.

Before, a restarting coordinator bound its port, then loaded its tokenizer and connected its
links before serving: requests sent meanwhile waited unanswered in its listen backlog (2–4 s,
10 s under load), although the README promised 503 with Retry-After. Here the coordinator is
held between binding and starting its pipeline (the test-only fault `coordinator:start-hold`,
30 s): every request is answered at once, 503 with Retry-After, and /health is a typed
`starting` report that the control plane's client reads as a verdict (not ready).
"""

from __future__ import annotations

import requests

from orchestrator.control.coordinator_client import CoordinatorClient
from orchestrator.engine.local_pipeline import LocalPipeline


def test_a_starting_coordinator_answers_503_with_retry_after_at_once(model_factory, tmp_path):
    model = model_factory(layers=2, hidden=64, heads=2, kv_heads=2, vocab=320)
    p = LocalPipeline(tmp_path, model, [(0, 1)], coordinator=False, threads=1,
                      env={"PIPESERVE_FAULTS": "coordinator:start-hold"}).start()
    try:
        p._spawn("coordinator", ["coordinator", "--config", str(p.config_path), "--node-id", "coordinator",
                                 "--model", str(model), "--port", str(p.http_port)])
        p._wait_port("coordinator", p.http_port)
        # Held for 30 s: a 10 s timeout fails unless the answer comes before the pipeline starts.
        r = requests.post(p.base_url + "/v1/chat/completions", timeout=10,
                          json={"model": model.name, "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 503 and r.headers.get("Retry-After") == "1", (r.status_code, r.text)
        assert r.json()["error"]["code"] == "starting"
        assert requests.get(p.base_url + "/v1/models", timeout=10).status_code == 503
        look = CoordinatorClient(p.base_url, p.secret).health(timeout=10)
        assert look.report is not None and look.report.status == "starting" and not look.report.ready, look
    finally:
        p.stop()
